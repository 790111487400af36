/* cluster/partition.h — cutting a model into one contiguous stage per node
 * of a cluster, so that every stage takes about the same time on its node.
 *
 * Each layer costs floating-point work per sample (forward and backward) and
 * memory: its parameters with their gradients, optimizer state and the
 * versions weight stashing keeps, and the activations of the micro-batches
 * in flight. A node has a measured speed and a memory budget. The cut
 * minimizes the time of the slowest stage, cost / speed, among the cuts that
 * fit every node's budget (dynamic programming over cut points, exact).
 * Ravnest's own code cuts into equal parts whatever the nodes' speeds.
 *
 *     PartitionNode nodes[2] = { { .gflops = 40, .memory = 1 << 30 }, { .gflops = 20, .memory = 1 << 30 } };
 *     PartitionCosts costs;
 *     r = partition_costs(&model, &(PartitionParams){ .micro_batch = 32, .in_flight = 4,
 *                                                     .optim_floats = 1, .stashed = 4 }, &costs, &d);
 *     int bounds[3];
 *     r = partition_plan(&costs, nodes, 2, bounds, &d);   // layers [bounds[i], bounds[i+1]) on node i
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn/stage.h"
#include "util/diag.h"

typedef struct PartitionParams {
        int micro_batch;      /* samples per micro-batch */
        int in_flight;        /* micro-batches a stage holds at once (the staleness bound) */
        int optim_floats;     /* optimizer state per parameter: 1 for momentum, 2 for Adam */
        int stashed;          /* parameter versions weight stashing may keep */
} PartitionParams;

typedef struct PartitionCosts {
        int n_layers;
        double flops[MODEL_MAX_LAYERS];   /* forward + backward, per micro-batch */
        uint64_t memory[MODEL_MAX_LAYERS]; /* bytes the layer needs on a node */
        uint64_t scratch[MODEL_MAX_LAYERS]; /* bytes of work space one micro-batch's trace needs for it; a
                                             * stage's traces share the largest of their layers' */
        int traces;                         /* a stage's traces: those in flight and the evaluation's */
        bool params[MODEL_MAX_LAYERS];      /* the layer has parameters: every stage holds one such (a stage
                                             * without has nothing to average, and nodes refuse it) */
} PartitionCosts;

typedef struct PartitionNode {
        double gflops;   /* measured sustained speed */
        uint64_t memory; /* bytes it may use */
} PartitionNode;

int partition_costs(const ModelSpec *m, const PartitionParams *p, PartitionCosts *ret, Diag *d);
/* The most stages a cut may have: the layers with parameters. */
int partition_max_stages(const PartitionCosts *c);
/* bounds: n_nodes + 1 entries, 0 = bounds[0] < ... < bounds[n_nodes] =
 * n_layers, every stage with a layer with parameters. -EINVAL: fewer layers
 * with parameters than nodes; -ENOSPC: no cut fits, and d says which node
 * lacks how much memory in the cut that comes closest. */
int partition_plan(const PartitionCosts *c, const PartitionNode *nodes, int n_nodes, int *bounds, Diag *d);
/* The slowest stage's time for a cut, in seconds per micro-batch. */
double partition_time(const PartitionCosts *c, const PartitionNode *nodes, int n_nodes, const int *bounds);
