/* cluster/plan-repair.h — a plan for a membership that changed a little,
 * moving as few nodes as it can: formation_run() starts from nothing and
 * puts most nodes elsewhere on every join or leave (bench-coordinator
 * measures six in ten at 1000 nodes), each move a stage restarted from
 * layers handed over and links opened anew.
 *
 * A cluster of the previous plan whose nodes are all still there is kept
 * as it was (same order, same cut). One that lost nodes is re-cut among
 * those left (formation_cluster_eval()); if they cannot hold the model it
 * takes spares, the one that gives the fastest cluster first, up to
 * PLAN_REPAIR_MAX_FILL; if it still cannot, its nodes become spares. The
 * spares (new nodes among them) then form clusters of their own as the
 * greedy formation would. Nothing else moves.
 *
 *     // next: nodes (and settings) of the new membership, no clusters; caps[i] of next->nodes[i]
 *     PlanRepairStats st;
 *     int *assign = ...;   // next->n_nodes: cluster of each node, -1 a spare
 *     r = plan_repair(&fm, prev, next, caps, similarity, assign, &st);
 *     double fitness = formation_fitness(&fm, caps, next->n_nodes, assign, similarity, NULL);
 */
#pragma once

#include "capability.h"
#include "formation.h"
#include "plan.h"

#define PLAN_REPAIR_MAX_FILL 4 /* spares one broken cluster may take */

typedef struct PlanRepairStats {
        unsigned kept;      /* clusters as they were */
        unsigned recut;     /* clusters that lost nodes, cut again among the rest */
        unsigned filled;    /* ... that took spares to hold the model */
        unsigned dissolved; /* ... whose nodes became spares (or that has none left) */
        unsigned formed;    /* new clusters of spares */
} PlanRepairStats;

/* next->clusters from prev's, for next's nodes (keys matched; next->n_nodes
 * and next->nodes set, next->n_clusters 0). prev NULL: no plan before, every
 * node new. assign (next->n_nodes) gets each node's cluster in next, -1 for
 * a spare. kept + recut + filled + dissolved is prev->n_clusters, kept +
 * recut + filled + formed next->n_clusters. -ENOMEM, or -EINVAL for counts
 * out of bounds (a cluster of prev too: 1 to PLAN_MAX_STAGES stages, of
 * prev's nodes, none in two). A cut may hold a stage without parameters (as
 * formation_run()'s may): the caller moves it. */
int plan_repair(const FormationModel *fm, const Plan *prev, Plan *next, const Capability *caps, double similarity,
                int *assign, PlanRepairStats *ret_stats);
