/* cluster/formation.h — grouping nodes into clusters, each of which holds one
 * whole replica of the model as a pipeline, so that together they train as
 * fast as they can.
 *
 * A cluster is feasible when the stage partitioner (partition.h) finds a cut
 * of the model that fits every member's memory: parameters, gradients,
 * optimizer state, stashed versions and in-flight activations, as
 * partition_costs() counts them. Its speed is predicted from that cut: a
 * pipeline runs as fast as its slowest stage or link, and no faster than its
 * staleness bound allows over one micro-batch's round trip (Little's law):
 *
 *     t = max( max_k flops_k / gflops_k,                 slowest stage
 *              max_k act_bytes_k / min(bw_k, bw_k+1),    slowest link
 *              (sum compute + 2 sum transfer + 2 sum latency) / in_flight )
 *     samples/s = micro_batch / t
 *
 * Members are put in pipeline order by speed (fastest first) and by memory
 * (largest first), and the better cut of the two is kept. A cluster's value
 * is its samples/s times (1 - similarity * cv), cv the coefficient of
 * variation of its members' GFLOP/s (capped at 1): Ravnest keeps nodes of one
 * cluster alike in speed so that none waits on a straggler. The fitness of a
 * formation is the sum of its clusters' values; nodes in no cluster are
 * spares (a node that would slow every cluster it joins).
 *
 * formation_run() seeds a genetic algorithm with a greedy solution (nodes by
 * speed, each cluster closed as soon as it holds the model), evolves it with
 * a grouping crossover, ruin-and-recreate mutation and local search (moves
 * and swaps between clusters of similar speed), and then cuts the model in
 * every cluster with partition_plan(). It is deterministic for a seed.
 * formation_exhaustive() finds the optimum over every set partition for up to
 * FORMATION_EXHAUSTIVE_MAX nodes, to measure the algorithm against.
 *
 *     FormationModel fm;
 *     r = formation_model_init(&job.model, &(PartitionParams){ .micro_batch = 32, .in_flight = 4,
 *                                                              .optim_floats = 2, .stashed = 4 }, &fm, &d);
 *     Capability nodes[3] = { { .gflops = 80, .memory = 2ull << 30, .bandwidth = 125e6, .latency = 5e-4 }, ... };
 *     _cleanup_(formation_freep) Formation *f = NULL;
 *     r = formation_run(&fm, nodes, 3, &(FormationParams){ .seed = 1 }, &f, &d);
 *     for (int c = 0; c < f->n_clusters; c++)   // f->clusters[c].nodes[k] runs layers
 *             ...                               // [bounds[k], bounds[k+1]) at samples_per_s
 */
#pragma once

#include <stdint.h>

#include "capability.h"
#include "partition.h"
#include "util/macro.h"

#define FORMATION_MAX_STAGES 64
#define FORMATION_MAX_NODES 1000000
#define FORMATION_EXHAUSTIVE_MAX 14

typedef struct FormationModel {
        PartitionCosts costs;
        double act_bytes[MODEL_MAX_LAYERS]; /* what layer i sends on per micro-batch; its gradient comes back as large */
        uint64_t memory;                    /* the whole model on one node, bytes */
        int micro_batch;
        int in_flight;
        int max_stages; /* min(layers, FORMATION_MAX_STAGES) */
} FormationModel;

int formation_model_init(const ModelSpec *m, const PartitionParams *p, FormationModel *ret, Diag *d);

typedef struct FormationParams {
        double similarity; /* weight of speed similarity in [0, 1]; < 0 means 0, 0 means the default 0.1 */
        uint64_t seed;
        int population;    /* 0: 24 */
        int generations;   /* 0: chosen from the node count */
} FormationParams;

typedef struct FormationCluster {
        int n_nodes;
        int nodes[FORMATION_MAX_STAGES];      /* pipeline order: nodes[k] runs stage k */
        int bounds[FORMATION_MAX_STAGES + 1]; /* stage k: layers [bounds[k], bounds[k+1]) */
        double samples_per_s;                 /* predicted */
        double stage_time, link_time;         /* the slowest stage's and link's seconds per micro-batch */
        double spread;                        /* coefficient of variation of the members' GFLOP/s */
        double value;                         /* samples_per_s * (1 - similarity * min(spread, 1)) */
} FormationCluster;

typedef struct Formation {
        int n_nodes, n_clusters, n_spares;
        int *cluster_of;            /* n_nodes: index into clusters, or -1 for a spare */
        FormationCluster *clusters; /* fastest first */
        double fitness;             /* sum of the clusters' values */
        double samples_per_s;       /* sum of their predicted rates */
        double greedy_fitness;      /* of the greedy seed (formation_run only) */
} Formation;

/* The similarity weight p asks for, defaults and bounds applied. */
static inline double formation_similarity(const FormationParams *p) {
        return p->similarity < 0 ? 0 : p->similarity > 0 ? MIN(p->similarity, 1.0) : 0.1;
}

Formation *formation_free(Formation *f);
DEFINE_TRIVIAL_CLEANUP_FUNC(Formation *, formation_free);

/* The value of nodes members[0..n) as one cluster, 0 when they cannot hold
 * the model (or n is 0 or above max_stages). ret, when not NULL, receives the
 * cluster's order, cut and figures (its fields are meaningful only for a
 * value above 0). */
double formation_cluster_eval(const FormationModel *m, const Capability *nodes, const int *members, int n,
                              double similarity, FormationCluster *ret);

/* Sum of the values of the clusters of an assignment (assign[i]: a cluster
 * number >= 0, or -1 for a spare). A cluster that cannot hold the model adds
 * 0; ret_infeasible, when not NULL, counts such clusters. */
double formation_fitness(const FormationModel *m, const Capability *nodes, int n, const int *assign,
                         double similarity, int *ret_infeasible);

/* The greedy solution alone. -ENOSPC (d says why) when no cluster can be
 * formed. */
int formation_greedy(const FormationModel *m, const Capability *nodes, int n, double similarity, int *ret_assign,
                     Diag *d);
/* The optimum over all set partitions (with spares), n <= FORMATION_EXHAUSTIVE_MAX. */
int formation_exhaustive(const FormationModel *m, const Capability *nodes, int n, double similarity,
                         int *ret_assign, double *ret_fitness, Diag *d);
/* The genetic algorithm; ret_assign receives the best assignment found. */
int formation_ga(const FormationModel *m, const Capability *nodes, int n, const FormationParams *p,
                 int *ret_assign, Diag *d);
/* An assignment as a plan: each cluster ordered and cut. -EINVAL if a
 * cluster cannot hold the model. */
int formation_build(const FormationModel *m, const Capability *nodes, int n, const int *assign, double similarity,
                    Formation **ret, Diag *d);
/* formation_ga, then formation_build. */
int formation_run(const FormationModel *m, const Capability *nodes, int n, const FormationParams *p,
                  Formation **ret, Diag *d);

/* Ravnest's own fitness of an assignment, a penalty (lower is better), as
 * cluster_formation.py of github.com/ravenprotocol/ravnest computes it
 * (calculate_fitness): per cluster, ram = the sum of its nodes' memory in
 * MiB and speed = the sum of floor(ram_i / bandwidth_i) (bandwidth in
 * Mbit/s); penalty = 100 * sum over clusters with ram <= L of (L - ram) +
 * (max speed - min speed), L the model's memory in MiB. Spares count in no
 * cluster. */
double formation_ravnest_penalty(const FormationModel *m, const Capability *nodes, int n, const int *assign);
