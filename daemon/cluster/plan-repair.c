/* cluster/plan-repair.c — a changed membership's plan that keeps what it
 * can (see plan-repair.h). */
#include "plan-repair.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int cmp_key(const void *a, const void *b, void *userdata) {
        const Plan *p = userdata;
        return memcmp(p->nodes[*(const int *)a].key, p->nodes[*(const int *)b].key, PLAN_KEY_SIZE);
}

/* For each node of prev, its index in next or -1: a binary search of
 * next's nodes in key order. */
static void match_nodes(const Plan *prev, const Plan *next, int *order, int *ret) {
        for (unsigned i = 0; i < next->n_nodes; i++)
                order[i] = (int)i;
        qsort_r(order, next->n_nodes, sizeof *order, cmp_key, (void *)next);
        for (unsigned i = 0; i < prev->n_nodes; i++) {
                unsigned lo = 0, hi = next->n_nodes;
                ret[i] = -1;
                while (lo < hi) {
                        unsigned mid = (lo + hi) / 2;
                        int c = memcmp(next->nodes[order[mid]].key, prev->nodes[i].key, PLAN_KEY_SIZE);
                        if (c == 0) {
                                ret[i] = order[mid];
                                break;
                        }
                        if (c < 0)
                                lo = mid + 1;
                        else
                                hi = mid;
                }
        }
}

/* A cluster of next from a formation cluster: its order and cut; origin:
 * the cluster of prev it comes from, -1 for none. */
static void add_cluster(Plan *next, const FormationCluster *fc, int *assign, int *origin, int from) {
        origin[next->n_clusters] = from;
        PlanCluster *pc = &next->clusters[next->n_clusters];
        pc->n_stages = (unsigned)fc->n_nodes;
        memcpy(pc->bounds, fc->bounds, sizeof(int) * (size_t)(fc->n_nodes + 1));
        for (int s = 0; s < fc->n_nodes; s++) {
                pc->nodes[s] = (uint16_t)fc->nodes[s];
                assign[fc->nodes[s]] = (int)next->n_clusters;
        }
        next->n_clusters++;
}

/* Nodes left of a broken cluster, with spares taken one at a time (the one
 * that gives the fastest cluster, else the one with most memory) until
 * they hold the model: true with fc set. */
static bool fill(const FormationModel *fm, const Capability *caps, unsigned n, double sim, int *members, int k,
                 const int *assign, bool *taken, FormationCluster *fc) {
        for (int added = 0; added <= PLAN_REPAIR_MAX_FILL; added++) {
                if (formation_cluster_eval(fm, caps, members, k, sim, fc) > 0)
                        return true;
                if (added == PLAN_REPAIR_MAX_FILL || k >= fm->max_stages)
                        break;
                int best = -1;
                double best_v = 0;
                uint64_t best_mem = 0;
                for (unsigned i = 0; i < n; i++) {
                        if (assign[i] >= 0 || taken[i])
                                continue;
                        members[k] = (int)i;
                        double v = formation_cluster_eval(fm, caps, members, k + 1, sim, NULL);
                        if (v > best_v || (best_v == 0 && v == 0 && caps[i].memory > best_mem)) {
                                best = (int)i;
                                best_v = v;
                                best_mem = caps[i].memory;
                        }
                }
                if (best < 0)
                        break;
                members[k++] = best;
                taken[best] = true;
        }
        return false;
}

/* prev's clusters in next: kept, re-cut, or listed in broken[] (their
 * nodes left in next still unassigned). */
static unsigned keep_clusters(const FormationModel *fm, const Plan *prev, Plan *next, const Capability *caps,
                              double sim, const int *map, int *assign, int *origin, unsigned *broken,
                              PlanRepairStats *st) {
        unsigned n_broken = 0;
        for (unsigned k = 0; k < prev->n_clusters; k++) {
                const PlanCluster *pc = &prev->clusters[k];
                int members[PLAN_MAX_STAGES];
                int left = 0;
                for (unsigned s = 0; s < pc->n_stages; s++)
                        if (map[pc->nodes[s]] >= 0)
                                members[left++] = map[pc->nodes[s]];
                if (left == (int)pc->n_stages) { /* as it was */
                        PlanCluster *nc = &next->clusters[next->n_clusters];
                        origin[next->n_clusters] = (int)k;
                        *nc = *pc;
                        for (unsigned s = 0; s < pc->n_stages; s++) {
                                nc->nodes[s] = (uint16_t)members[s];
                                assign[members[s]] = (int)next->n_clusters;
                        }
                        next->n_clusters++;
                        st->kept++;
                        continue;
                }
                FormationCluster fc;
                if (left > 0 && formation_cluster_eval(fm, caps, members, left, sim, &fc) > 0) {
                        add_cluster(next, &fc, assign, origin, (int)k);
                        st->recut++;
                } else if (left > 0)
                        broken[n_broken++] = k;
                else
                        st->dissolved++; /* none of its nodes left */
        }
        return n_broken;
}

/* The spares that are left form clusters of their own, greedily. */
static int form_spares(const FormationModel *fm, Plan *next, const Capability *caps, double sim, int *assign,
                       int *origin, PlanRepairStats *st) {
        unsigned n = next->n_nodes, n_sp = 0;
        _cleanup_(freep) int *idx = malloc(n * sizeof *idx);
        _cleanup_(freep) int *sub = malloc(n * sizeof *sub);
        _cleanup_(freep) Capability *sc = malloc(n * sizeof *sc);
        Diag d = {};
        if (!idx || !sub || !sc)
                return -ENOMEM;
        for (unsigned i = 0; i < n; i++)
                if (assign[i] < 0) {
                        idx[n_sp] = (int)i;
                        sc[n_sp++] = caps[i];
                }
        if (n_sp == 0 || formation_greedy(fm, sc, (int)n_sp, sim, sub, &d) < 0)
                return 0; /* none can form a cluster: spares they stay */
        for (int c = 0;; c++) {
                int members[PLAN_MAX_STAGES], k = 0;
                for (unsigned i = 0; i < n_sp && k < PLAN_MAX_STAGES; i++)
                        if (sub[i] == c)
                                members[k++] = idx[i];
                if (k == 0)
                        break;
                FormationCluster fc;
                if (next->n_clusters < PLAN_MAX_CLUSTERS && formation_cluster_eval(fm, caps, members, k, sim, &fc) > 0) {
                        add_cluster(next, &fc, assign, origin, -1);
                        st->formed++;
                }
        }
        return 0;
}

/* Each cluster at the number it had in prev where that number is still
 * one of next's, the others in the numbers left: a cluster's number moves
 * only when one before it was dissolved and it takes that place. */
static void keep_numbers(Plan *next, const int *origin, int *assign) {
        unsigned n = next->n_clusters;
        _cleanup_(freep) PlanCluster *was = malloc(n * sizeof *was);
        _cleanup_(freep) bool *placed = calloc(n, sizeof *placed);
        _cleanup_(freep) bool *used = calloc(n, sizeof *used);
        if (!was || !placed || !used || n == 0)
                return; /* the numbers as they are: still a valid plan */
        memcpy(was, next->clusters, n * sizeof *was);
        for (unsigned c = 0; c < n; c++)
                if (origin[c] >= 0 && (unsigned)origin[c] < n && !used[origin[c]]) {
                        next->clusters[origin[c]] = was[c];
                        used[origin[c]] = placed[c] = true;
                }
        unsigned slot = 0;
        for (unsigned c = 0; c < n; c++) {
                if (placed[c])
                        continue;
                while (used[slot])
                        slot++;
                next->clusters[slot] = was[c];
                used[slot] = true;
        }
        for (unsigned k = 0; k < n; k++)
                for (unsigned s = 0; s < next->clusters[k].n_stages; s++)
                        assign[next->clusters[k].nodes[s]] = (int)k;
}

/* prev's clusters within its bounds (prev->n_nodes checked): 1 to
 * PLAN_MAX_STAGES stages each, of its nodes, none in two (keep_clusters()
 * indexes by them). */
static bool clusters_valid(const Plan *prev) {
        bool used[PLAN_MAX_NODES] = {};
        for (unsigned k = 0; k < prev->n_clusters; k++) {
                const PlanCluster *pc = &prev->clusters[k];
                if (pc->n_stages < 1 || pc->n_stages > PLAN_MAX_STAGES)
                        return false;
                for (unsigned s = 0; s < pc->n_stages; s++) {
                        if (pc->nodes[s] >= prev->n_nodes || used[pc->nodes[s]])
                                return false;
                        used[pc->nodes[s]] = true;
                }
        }
        return true;
}

int plan_repair(const FormationModel *fm, const Plan *prev, Plan *next, const Capability *caps, double similarity,
                int *assign, PlanRepairStats *ret_stats) {
        _cleanup_(plan_freep) Plan *none = NULL;
        PlanRepairStats st = {};
        unsigned n = next->n_nodes;
        if (!prev && !(prev = none = plan_new())) /* no plan before: every node new */
                return -ENOMEM;
        if (n > PLAN_MAX_NODES || prev->n_nodes > PLAN_MAX_NODES || prev->n_clusters > PLAN_MAX_CLUSTERS ||
            !clusters_valid(prev))
                return -EINVAL;
        _cleanup_(freep) int *order = malloc(MAX(n, 1u) * sizeof *order);
        _cleanup_(freep) int *map = malloc(MAX(prev->n_nodes, 1u) * sizeof *map);
        _cleanup_(freep) unsigned *broken = malloc(MAX(prev->n_clusters, 1u) * sizeof *broken);
        _cleanup_(freep) bool *taken = calloc(MAX(n, 1u), sizeof *taken);
        _cleanup_(freep) int *origin = malloc(PLAN_MAX_CLUSTERS * sizeof *origin);
        if (!order || !map || !broken || !taken || !origin)
                return -ENOMEM;
        match_nodes(prev, next, order, map);
        next->n_clusters = 0;
        for (unsigned i = 0; i < n; i++)
                assign[i] = -1;
        unsigned n_broken = keep_clusters(fm, prev, next, caps, similarity, map, assign, origin, broken, &st);
        for (unsigned b = 0; b < n_broken; b++) {
                const PlanCluster *pc = &prev->clusters[broken[b]];
                int members[PLAN_MAX_STAGES + PLAN_REPAIR_MAX_FILL];
                int left = 0;
                for (unsigned s = 0; s < pc->n_stages; s++) {
                        int i = map[pc->nodes[s]];
                        if (i >= 0 && assign[i] < 0) { /* not taken by a cluster filled before */
                                members[left++] = i;
                                taken[i] = true;
                        }
                }
                FormationCluster fc;
                if (fill(fm, caps, n, similarity, members, left, assign, taken, &fc)) {
                        add_cluster(next, &fc, assign, origin, (int)broken[b]);
                        st.filled++;
                } else
                        st.dissolved++;
                memset(taken, 0, n * sizeof *taken); /* the taken ones are assigned now, or free again */
        }
        int r = form_spares(fm, next, caps, similarity, assign, origin, &st);
        if (r < 0)
                return r;
        keep_numbers(next, origin, assign);
        if (ret_stats)
                *ret_stats = st;
        return 0;
}
