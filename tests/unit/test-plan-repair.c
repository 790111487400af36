/* Plan repair (cluster/plan-repair.h) on the plans a coordinator makes for
 * fashion-mnist-mlp.job: on a leave every cluster that lost no node is kept
 * as it was and where it was, the broken one cut again, filled or
 * dissolved as the stats say; a join moves no node already placed; a 10%
 * leave at 1000 nodes changes the work of no node outside the clusters that
 * lost one and the spares taken; and the edges: no previous plan, no
 * nodes, no key in common, counts out of bounds. Every result passes
 * plan_check() with the settings coordinator.c gives a plan. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/plan-repair.h"
#include "conf/job.h"
#include "nn/optim.h"
#include "util/rng.h"

/* ravnestd.conf's defaults, as coordinator.c passes them */
#define MICRO_BATCH 32
#define STALENESS 4

static FormationModel fm;
static double sim;

/* The model as the coordinator sees it (coordinator_start()). */
static void setup(void) {
        Job job;
        Diag d = {};
        cr_assert_eq(job_load(SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", &job, &d), 0, "%s", d.text);
        PartitionParams pp = { .micro_batch = MICRO_BATCH, .in_flight = STALENESS,
                               .optim_floats = (int)optim_state_floats(job.optim.kind, 1), .stashed = STALENESS };
        cr_assert_eq(formation_model_init(&job.model, &pp, &fm, &d), 0, "%s", d.text);
        sim = formation_similarity(&(FormationParams){});
}

TestSuite(plan_repair, .init = setup);

typedef struct Member {
        uint8_t key[PLAN_KEY_SIZE];
        Capability cap;
} Member;

static int cmp_member(const void *a, const void *b) {
        return memcmp(((const Member *)a)->key, ((const Member *)b)->key, PLAN_KEY_SIZE);
}

/* n members with random keys, in key order (as plan_members() puts them):
 * 24 to 60 MiB each, so that most clusters take two or three nodes of the
 * ~52 MiB replica (its largest layer ~29 MiB) and a few nodes hold it alone. */
static void draw(Member *m, unsigned n, uint64_t seed) {
        Rng r;
        rng_seed(&r, seed, RNG_STREAM_TEST);
        for (unsigned i = 0; i < n; i++) {
                for (unsigned b = 0; b < PLAN_KEY_SIZE; b += 8) {
                        uint64_t v = rng_next(&r);
                        memcpy(m[i].key + b, &v, 8);
                }
                m[i].cap = (Capability){
                        .gflops = 5 * pow(16, rng_uniform(&r)),
                        .memory = (uint64_t)(24 * pow(2.5, rng_uniform(&r)) * (1 << 20)),
                        .bandwidth = 10e6 / 8 * pow(100, rng_uniform(&r)),
                        .latency = 1e-4 * pow(200, rng_uniform(&r)),
                };
        }
        qsort(m, n, sizeof *m, cmp_member);
}

/* A plan's settings and nodes, no clusters (coordinator.c's plan_start()). */
static void plan_start(Plan *p, uint64_t epoch, const Member *m, unsigned n, Capability *caps) {
        memset(p, 0, sizeof *p);
        p->epoch = epoch;
        memset(p->signer, 0xc0, PLAN_KEY_SIZE);
        p->n_layers = (unsigned)fm.costs.n_layers;
        p->micro_batch = MICRO_BATCH;
        p->staleness = STALENESS;
        p->update_frequency = 1;
        p->n_nodes = n;
        for (unsigned i = 0; i < n; i++) {
                memcpy(p->nodes[i].key, m[i].key, PLAN_KEY_SIZE);
                snprintf(p->nodes[i].host, sizeof p->nodes[i].host, "10.%u.%u.%u", i >> 16 & 255, i >> 8 & 255,
                         i & 255);
                p->nodes[i].pipeline_port = 7000;
                p->nodes[i].averaging_port = 7001;
                if (caps)
                        caps[i] = m[i].cap;
        }
}

/* A plan formed anew for members m (coordinator.c's form() without a plan
 * before): the genetic algorithm, briefly. */
static void form(Plan *p, const Member *m, unsigned n, int generations) {
        Capability *caps = malloc(n * sizeof *caps);
        Formation *f = NULL;
        Diag d = {};
        cr_assert_not_null(caps);
        plan_start(p, 1, m, n, caps);
        cr_assert_eq(formation_run(&fm, caps, (int)n,
                                   &(FormationParams){ .seed = 1, .population = 8, .generations = generations }, &f,
                                   &d),
                     0, "%s", d.text);
        for (int k = 0; k < f->n_clusters; k++) {
                const FormationCluster *fc = &f->clusters[k];
                PlanCluster *pc = &p->clusters[p->n_clusters++];
                pc->n_stages = (unsigned)fc->n_nodes;
                memcpy(pc->bounds, fc->bounds, sizeof(int) * (size_t)(fc->n_nodes + 1));
                for (int s = 0; s < fc->n_nodes; s++)
                        pc->nodes[s] = (uint16_t)fc->nodes[s];
        }
        formation_free(f);
        free(caps);
        cr_assert_eq(plan_check(p), 0);
}

/* Where a node is in a plan: its cluster (-1: a spare or absent) and stage. */
static int where(const Plan *p, const uint8_t *key, unsigned *ret_stage) {
        unsigned c, s;
        if (plan_find(p, key, NULL, &c, &s) < 0)
                return -1;
        if (ret_stage)
                *ret_stage = s;
        return (int)c;
}

/* Cluster a of plan p and cluster b of plan q: the same nodes (by key) in
 * the same order, and the same cut. */
static bool same_cluster(const Plan *p, unsigned a, const Plan *q, unsigned b) {
        const PlanCluster *x = &p->clusters[a], *y = &q->clusters[b];
        if (x->n_stages != y->n_stages)
                return false;
        for (unsigned s = 0; s < x->n_stages; s++)
                if (memcmp(p->nodes[x->nodes[s]].key, q->nodes[y->nodes[s]].key, PLAN_KEY_SIZE) != 0)
                        return false;
        return memcmp(x->bounds, y->bounds, sizeof(int) * (x->n_stages + 1)) == 0;
}

/* Whether the node of key holds other work in q than in p: in a cluster in
 * one and not the other, among other nodes, or other layers. */
static bool work_changed(const Plan *p, const Plan *q, const uint8_t *key) {
        unsigned sp, sq;
        int cp = where(p, key, &sp), cq = where(q, key, &sq);
        if (cp < 0 || cq < 0)
                return (cp < 0) != (cq < 0);
        const PlanCluster *x = &p->clusters[cp], *y = &q->clusters[cq];
        if (x->bounds[sp] != y->bounds[sq] || x->bounds[sp + 1] != y->bounds[sq + 1] || x->n_stages != y->n_stages)
                return true;
        for (unsigned s = 0; s < y->n_stages; s++) /* keys are unique: the same count and all in x is the same set */
                if (where(p, q->nodes[y->nodes[s]].key, NULL) != cp)
                        return true;
        return false;
}

/* Clusters of prev all of whose nodes are in next. */
static bool intact(const Plan *prev, unsigned k, const Plan *next) {
        int idx;
        for (unsigned s = 0; s < prev->clusters[k].n_stages; s++) {
                plan_find(next, prev->nodes[prev->clusters[k].nodes[s]].key, &idx, NULL, NULL);
                if (idx < 0)
                        return false;
        }
        return true;
}

/* Everything plan_repair() promises of any result: assign matches the
 * clusters, a node in at most one, each cluster holds the model with a
 * valid cut, the stats count the clusters, plan_check() passes. */
static void check_result(const Plan *prev, const Plan *next, const Capability *caps, const int *assign,
                         const PlanRepairStats *st) {
        unsigned n = next->n_nodes, in = 0;
        int *seen = malloc((n ? n : 1) * sizeof *seen);
        cr_assert_not_null(seen);
        for (unsigned i = 0; i < n; i++)
                seen[i] = -1;
        for (unsigned k = 0; k < next->n_clusters; k++) {
                const PlanCluster *pc = &next->clusters[k];
                cr_assert(pc->n_stages >= 1 && pc->n_stages <= (unsigned)fm.max_stages, "cluster %u: %u stages", k,
                          pc->n_stages);
                cr_assert_eq(pc->bounds[0], 0);
                cr_assert_eq(pc->bounds[pc->n_stages], fm.costs.n_layers);
                for (unsigned s = 0; s < pc->n_stages; s++) {
                        unsigned i = pc->nodes[s];
                        cr_assert_lt(i, n);
                        cr_assert_lt(pc->bounds[s], pc->bounds[s + 1], "cluster %u stage %u: empty", k, s);
                        cr_assert_eq(seen[i], -1, "node %u in clusters %d and %u", i, seen[i], k);
                        seen[i] = (int)k;
                        in++;
                }
        }
        unsigned assigned = 0;
        for (unsigned i = 0; i < n; i++) {
                cr_assert_eq(assign[i], seen[i], "assign[%u] = %d, the plan says %d", i, assign[i], seen[i]);
                assigned += assign[i] >= 0;
        }
        cr_assert_eq(assigned, in);
        free(seen);

        int bad = -1;
        double fit = formation_fitness(&fm, caps, (int)n, assign, sim, &bad);
        cr_assert_eq(bad, 0, "%d clusters cannot hold the model", bad);
        cr_assert(next->n_clusters == 0 || fit > 0);

        cr_assert_eq(st->kept + st->recut + st->filled + st->formed, next->n_clusters,
                     "kept %u + recut %u + filled %u + formed %u != %u clusters", st->kept, st->recut, st->filled,
                     st->formed, next->n_clusters);
        unsigned prev_clusters = prev ? prev->n_clusters : 0, whole = 0;
        for (unsigned k = 0; k < prev_clusters; k++)
                whole += intact(prev, k, next);
        cr_assert_eq(st->kept, whole, "%u clusters kept, %u had all their nodes", st->kept, whole);
        cr_assert_eq(st->kept + st->recut + st->filled + st->dissolved, prev_clusters,
                     "kept %u + recut %u + filled %u + dissolved %u != %u clusters before", st->kept, st->recut,
                     st->filled, st->dissolved, prev_clusters);
        if (n > 0)
                cr_assert_eq(plan_check(next), 0);
}

/* Repair prev for members m: next and assign filled, the result checked. */
static PlanRepairStats repair(const Plan *prev, Plan *next, const Member *m, unsigned n, Capability *caps,
                              int *assign) {
        PlanRepairStats st;
        memset(&st, 0xa5, sizeof st);
        plan_start(next, prev ? prev->epoch + 1 : 1, m, n, caps);
        cr_assert_eq(plan_repair(&fm, prev, next, caps, sim, assign, &st), 0);
        check_result(prev, next, caps, assign, &st);
        return st;
}

/* Every cluster of prev that kept all its nodes is in next as it was, at
 * its number when next has that many; the nodes of the others either. */
static void check_kept(const Plan *prev, const Plan *next) {
        for (unsigned k = 0; k < prev->n_clusters; k++) {
                if (!intact(prev, k, next))
                        continue;
                unsigned s0;
                int c = where(next, prev->nodes[prev->clusters[k].nodes[0]].key, &s0);
                cr_assert_geq(c, 0, "cluster %u of prev lost", k);
                cr_assert(same_cluster(prev, k, next, (unsigned)c), "cluster %u of prev changed", k);
                if (k < next->n_clusters)
                        cr_assert_eq((unsigned)c, k, "cluster %u of prev is cluster %d of next", k, c);
        }
}

Test(plan_repair, same_members_keep_everything) {
        Member m[40];
        Plan *prev = plan_new(), *next = plan_new();
        Capability caps[40];
        int assign[40];
        draw(m, 40, 1);
        form(prev, m, 40, 20);
        PlanRepairStats st = repair(prev, next, m, 40, caps, assign);
        cr_assert_eq(st.kept, prev->n_clusters);
        cr_assert_eq(st.recut + st.filled + st.dissolved, 0);
        cr_assert_eq(next->n_clusters, prev->n_clusters + st.formed);
        for (unsigned k = 0; k < prev->n_clusters; k++)
                cr_assert(same_cluster(prev, k, next, k));
        for (unsigned i = 0; i < 40; i++) /* only spares may be placed: in clusters formed of them */
                if (where(prev, m[i].key, NULL) >= 0)
                        cr_assert(!work_changed(prev, next, m[i].key));
                else if (assign[i] >= 0)
                        cr_assert_geq(assign[i], prev->n_clusters);
        plan_free(prev);
        plan_free(next);
}

/* 40 nodes; for each cluster, and each of its stages, that node leaves. */
Test(plan_repair, leave_one_node) {
        enum { N = 40 };
        Member m[N], left[N - 1];
        Plan *prev = plan_new(), *next = plan_new();
        Capability caps[N];
        int assign[N];
        unsigned seen_recut = 0, seen_filled = 0, seen_dissolved = 0, cases = 0;
        for (uint64_t seed = 1; seed <= 4; seed++) {
                draw(m, N, seed);
                form(prev, m, N, 20);
                cr_assert_geq(prev->n_clusters, 4, "seed %llu: %u clusters", (unsigned long long)seed,
                              prev->n_clusters);
                for (unsigned k = 0; k < prev->n_clusters; k++)
                        for (unsigned s = 0; s < prev->clusters[k].n_stages; s++) {
                                unsigned gone = prev->clusters[k].nodes[s], n = 0;
                                for (unsigned i = 0; i < N; i++)
                                        if (i != gone)
                                                left[n++] = m[i];
                                PlanRepairStats st = repair(prev, next, left, n, caps, assign);
                                cases++;
                                cr_assert_eq(st.kept, prev->n_clusters - 1);
                                cr_assert_eq(st.recut + st.filled + st.dissolved, 1, "recut %u filled %u dissolved %u",
                                             st.recut, st.filled, st.dissolved);
                                seen_recut += st.recut;
                                seen_filled += st.filled;
                                seen_dissolved += st.dissolved;
                                check_kept(prev, next);

                                /* the rest of the broken cluster: in one cluster of next made of them (and
                                 * spares, when filled), or all spares (dissolved: spares may then form) */
                                int at = -1;
                                unsigned rest = 0;
                                for (unsigned t = 0; t < prev->clusters[k].n_stages; t++) {
                                        if (t == s)
                                                continue;
                                        int c = where(next, prev->nodes[prev->clusters[k].nodes[t]].key, NULL);
                                        rest++;
                                        if (st.dissolved)
                                                continue;
                                        cr_assert_geq(c, 0, "a node of the cluster %s is a spare",
                                                      st.recut ? "cut again" : "filled");
                                        cr_assert(at < 0 || c == at, "the broken cluster split");
                                        at = c;
                                }
                                if (rest == 0) /* its only node left: nothing to repair */
                                        cr_assert_eq(st.dissolved, 1);
                                if (at >= 0) {
                                        unsigned ns = next->clusters[at].n_stages;
                                        if (st.recut)
                                                cr_assert_eq(ns, rest, "cut again among %u nodes: %u stages", rest,
                                                             ns);
                                        else
                                                cr_assert(ns > rest && ns <= rest + PLAN_REPAIR_MAX_FILL,
                                                          "filled: %u stages from %u nodes", ns, rest);
                                        /* those added were spares of prev */
                                        for (unsigned t = 0; t < ns; t++) {
                                                const uint8_t *key = next->nodes[next->clusters[at].nodes[t]].key;
                                                int c = where(prev, key, NULL);
                                                cr_assert(c < 0 || c == (int)k, "a node of cluster %d of prev moved "
                                                                                "to the broken one", c);
                                        }
                                        if ((unsigned)k < next->n_clusters)
                                                cr_assert_eq(at, (int)k, "the repaired cluster %u is now %d", k, at);
                                }
                                /* clusters formed of spares hold no node of a cluster kept */
                                for (unsigned c = 0; c < next->n_clusters; c++) {
                                        bool from_prev = false;
                                        for (unsigned q = 0; q < prev->n_clusters; q++)
                                                from_prev |= same_cluster(prev, q, next, c);
                                        if (from_prev || (int)c == at)
                                                continue;
                                        for (unsigned t = 0; t < next->clusters[c].n_stages; t++) {
                                                int w = where(prev, next->nodes[next->clusters[c].nodes[t]].key, NULL);
                                                cr_assert(w < 0 || w == (int)k, "cluster %u of next took a node of "
                                                                                "cluster %d of prev", c, w);
                                        }
                                }
                        }
        }
        cr_log_info("leave_one_node: %u cases, %u cut again, %u filled, %u dissolved", cases, seen_recut, seen_filled,
                    seen_dissolved);
        cr_assert_gt(seen_recut, 0);
        cr_assert_gt(seen_filled + seen_dissolved, 0);
        plan_free(prev);
        plan_free(next);
}

/* Each path on hand-made nodes: a 3-node cluster that loses one is cut
 * again; a 2-node cluster of 30 MiB nodes that loses one takes the
 * spare that holds the rest, or with only small spares is dissolved. */
Test(plan_repair, recut_fill_dissolve) {
        Member m[6];
        Plan *prev = plan_new(), *next = plan_new();
        Capability caps[6];
        int assign[6];
        draw(m, 6, 7);
        for (unsigned i = 0; i < 6; i++)
                m[i].cap = (Capability){ .gflops = 20, .memory = 30ull << 20, .bandwidth = 125e6, .latency = 5e-4 };
        m[5].cap.memory = 4ull << 20; /* a spare that holds no large layer */
        plan_start(prev, 1, m, 6, NULL);
        prev->n_clusters = 2;
        prev->clusters[0] = (PlanCluster){ .n_stages = 3, .nodes = { 0, 1, 2 }, .bounds = { 0, 2, 3, 6 } };
        prev->clusters[1] = (PlanCluster){ .n_stages = 2, .nodes = { 3, 4 }, .bounds = { 0, 3, 6 } };
        cr_assert_eq(plan_check(prev), 0);

        /* node 1 leaves: cluster 0 cut again between 0 and 2, cluster 1 as it was */
        Member l[5] = { m[0], m[2], m[3], m[4], m[5] };
        PlanRepairStats st = repair(prev, next, l, 5, caps, assign);
        cr_assert_eq(st.kept, 1);
        cr_assert_eq(st.recut, 1);
        cr_assert_eq(next->n_clusters, 2);
        cr_assert_eq(next->clusters[0].n_stages, 2);
        cr_assert(same_cluster(prev, 1, next, 1));
        cr_assert_eq(where(next, m[5].key, NULL), -1);

        /* node 4 leaves, and a new 30 MiB node has joined: cluster 1 takes it */
        Member f[6] = { m[0], m[1], m[2], m[3], m[5] };
        draw(&f[5], 1, 8);
        f[5].cap = m[0].cap;
        Member joined = f[5];
        qsort(f, 6, sizeof *f, cmp_member);
        st = repair(prev, next, f, 6, caps, assign);
        cr_assert_eq(st.kept, 1);
        cr_assert_eq(st.filled, 1);
        cr_assert_eq(st.formed, 0);
        cr_assert(same_cluster(prev, 0, next, 0));
        cr_assert_eq(next->clusters[1].n_stages, 2);
        cr_assert_eq(where(next, m[3].key, NULL), 1);
        cr_assert_eq(where(next, joined.key, NULL), 1);
        cr_assert_eq(where(next, m[5].key, NULL), -1);

        /* node 4 leaves, and only the small spare is there: cluster 1 dissolved, node 3 a spare */
        Member d[5] = { m[0], m[1], m[2], m[3], m[5] };
        st = repair(prev, next, d, 5, caps, assign);
        cr_assert_eq(st.kept, 1);
        cr_assert_eq(st.dissolved, 1);
        cr_assert_eq(st.formed, 0);
        cr_assert_eq(next->n_clusters, 1);
        cr_assert(same_cluster(prev, 0, next, 0));
        cr_assert_eq(where(next, m[3].key, NULL), -1);
        cr_assert_eq(where(next, m[5].key, NULL), -1);
        plan_free(prev);
        plan_free(next);
}

/* One node joins 40: no node placed before moves; the new one is a spare
 * or in a cluster formed only of spares. */
Test(plan_repair, join_one_node) {
        enum { N = 40 };
        Member m[N], j[N + 1];
        Plan *prev = plan_new(), *next = plan_new();
        Capability caps[N + 1];
        int assign[N + 1];
        unsigned placed = 0;
        draw(m, N, 2);
        form(prev, m, N, 20);
        for (uint64_t seed = 100; seed < 116; seed++) {
                memcpy(j, m, sizeof m);
                draw(&j[N], 1, seed);
                if (seed % 2) /* half of them hold the model alone: a cluster of their own at least */
                        j[N].cap.memory = 96ull << 20;
                Member joined = j[N];
                qsort(j, N + 1, sizeof *j, cmp_member);
                PlanRepairStats st = repair(prev, next, j, N + 1, caps, assign);
                cr_assert_eq(st.kept, prev->n_clusters);
                cr_assert_eq(st.recut + st.filled + st.dissolved, 0);
                check_kept(prev, next);
                for (unsigned i = 0; i < N; i++)
                        if (where(prev, m[i].key, NULL) >= 0)
                                cr_assert(!work_changed(prev, next, m[i].key), "node %u moved", i);
                int c = where(next, joined.key, NULL);
                if (c >= 0) {
                        placed++;
                        cr_assert_geq(st.formed, 1);
                        for (unsigned t = 0; t < next->clusters[c].n_stages; t++)
                                cr_assert_eq(where(prev, next->nodes[next->clusters[c].nodes[t]].key, NULL), -1,
                                             "the new node's cluster took a node placed before");
                }
                /* any cluster formed (the new node's, or of spares a formation left) is of spares only */
                unsigned formed = 0;
                for (unsigned k = 0; k < next->n_clusters; k++) {
                        if (k < prev->n_clusters && same_cluster(prev, k, next, k))
                                continue;
                        formed++;
                        for (unsigned t = 0; t < next->clusters[k].n_stages; t++)
                                cr_assert_eq(where(prev, next->nodes[next->clusters[k].nodes[t]].key, NULL), -1);
                }
                cr_assert_eq(formed, st.formed);
                if (seed % 2)
                        cr_assert_geq(c, 0, "a node that holds the model alone stayed a spare");
        }
        cr_assert_gt(placed, 0);
        plan_free(prev);
        plan_free(next);
}

/* 1000 nodes, 100 of them leave: the nodes whose work changes are all in
 * clusters that lost a node, or spares taken into a cluster. */
Test(plan_repair, ten_percent_leave_at_1000) {
        enum { N = 1000, GONE = 100 };
        Member *m = malloc(N * sizeof *m), *left = malloc(N * sizeof *left);
        Capability *caps = malloc(N * sizeof *caps);
        int *assign = malloc(N * sizeof *assign);
        bool *gone = calloc(N, sizeof *gone), *broken = NULL;
        Plan *prev = plan_new(), *next = plan_new();
        Rng r;
        cr_assert(m && left && caps && assign && gone && prev && next);
        cr_assert_leq(N, PLAN_MAX_NODES);
        draw(m, N, 3);
        form(prev, m, N, 3);
        broken = calloc(prev->n_clusters, sizeof *broken);
        cr_assert_not_null(broken);
        rng_seed(&r, 4, RNG_STREAM_TEST);
        for (unsigned g = 0; g < GONE;) {
                unsigned i = rng_below(&r, N);
                if (!gone[i]) {
                        gone[i] = true;
                        g++;
                }
        }
        unsigned n = 0;
        for (unsigned i = 0; i < N; i++)
                if (!gone[i])
                        left[n++] = m[i];
        cr_assert_eq(n, N - GONE);

        PlanRepairStats st = repair(prev, next, left, n, caps, assign);
        check_kept(prev, next);

        /* the clusters that lost a node, and the nodes left of them */
        unsigned n_broken = 0, in_broken = 0;
        for (unsigned k = 0; k < prev->n_clusters; k++)
                for (unsigned s = 0; s < prev->clusters[k].n_stages; s++)
                        if (gone[prev->clusters[k].nodes[s]] && !broken[k]) {
                                broken[k] = true;
                                n_broken++;
                        }
        for (unsigned k = 0; k < prev->n_clusters; k++)
                for (unsigned s = 0; broken[k] && s < prev->clusters[k].n_stages; s++)
                        in_broken += !gone[prev->clusters[k].nodes[s]];
        cr_assert_eq(st.recut + st.filled + st.dissolved, n_broken);
        cr_assert_eq(st.kept, prev->n_clusters - n_broken);

        /* spares of prev now in a cluster: of clusters filled or formed */
        unsigned taken = 0, changed = 0, in_filled_or_formed = 0;
        for (unsigned i = 0; i < n; i++)
                if (where(prev, left[i].key, NULL) < 0 && where(next, left[i].key, NULL) >= 0)
                        taken++;
        for (unsigned i = 0; i < n; i++) {
                if (!work_changed(prev, next, left[i].key))
                        continue;
                changed++;
                int c = where(prev, left[i].key, NULL);
                cr_assert(c < 0 ? where(next, left[i].key, NULL) >= 0 : broken[c],
                          "a node of cluster %d of prev, which lost none, changed", c);
        }
        for (unsigned k = 0; k < next->n_clusters; k++) {
                bool kept = false;
                for (unsigned q = 0; q < prev->n_clusters && !kept; q++)
                        kept = !broken[q] && same_cluster(prev, q, next, k);
                if (!kept)
                        in_filled_or_formed += next->clusters[k].n_stages;
        }
        cr_assert_leq(changed, in_broken + taken, "%u nodes changed, %u of broken clusters and %u spares taken",
                      changed, in_broken, taken);
        /* the clusters not kept hold only nodes of broken clusters and spares taken */
        cr_assert_leq(in_filled_or_formed, in_broken + taken);
        cr_assert_lt(in_broken + taken, n, "everything moved");
        cr_log_info("10%% leave at %u: %u clusters, %u broken (%u cut again, %u filled, %u dissolved), %u formed; "
                    "%u of %u nodes changed (%.1f%%), bound %u",
                    N, prev->n_clusters, n_broken, st.recut, st.filled, st.dissolved, st.formed, changed, n,
                    100.0 * changed / n, in_broken + taken);
        free(m);
        free(left);
        free(caps);
        free(assign);
        free(gone);
        free(broken);
        plan_free(prev);
        plan_free(next);
}

/* No plan before (NULL or no clusters) and no key in common: every node
 * new, the clusters those the greedy formation forms of them all. */
Test(plan_repair, nothing_to_keep) {
        enum { N = 40 };
        Member m[N], other[N];
        Plan *prev = plan_new(), *next = plan_new(), *empty = plan_new();
        Capability caps[N];
        int assign[N], greedy[N];
        Diag d = {};
        draw(m, N, 5);
        draw(other, N, 6);
        form(prev, m, N, 20);
        plan_start(empty, 1, m, N, NULL);
        for (unsigned i = 0; i < N; i++)
                caps[i] = other[i].cap;
        cr_assert_eq(formation_greedy(&fm, caps, N, sim, greedy, &d), 0, "%s", d.text);
        unsigned greedy_clusters = 0;
        for (unsigned i = 0; i < N; i++)
                greedy_clusters = greedy[i] + 1 > (int)greedy_clusters ? (unsigned)greedy[i] + 1 : greedy_clusters;

        const Plan *prevs[] = { prev, empty, NULL };
        for (unsigned t = 0; t < 3; t++) {
                PlanRepairStats st = repair(prevs[t], next, other, N, caps, assign);
                cr_assert_eq(st.kept + st.recut + st.filled, 0);
                cr_assert_eq(st.dissolved, prevs[t] ? prevs[t]->n_clusters : 0);
                cr_assert_eq(st.formed, greedy_clusters);
                cr_assert_eq(next->n_clusters, greedy_clusters);
                for (unsigned i = 0; i < N; i++)
                        cr_assert_eq(assign[i] >= 0, greedy[i] >= 0, "node %u", i);
        }
        plan_free(prev);
        plan_free(next);
        plan_free(empty);
}

/* Every node leaves: no clusters, each one of prev dissolved. */
Test(plan_repair, no_nodes) {
        Member m[40];
        Plan *prev = plan_new(), *next = plan_new();
        int assign[1] = { 7 };
        draw(m, 40, 9);
        form(prev, m, 40, 20);
        PlanRepairStats st = repair(prev, next, m, 0, NULL, assign);
        cr_assert_eq(next->n_clusters, 0);
        cr_assert_eq(st.dissolved, prev->n_clusters);
        cr_assert_eq(assign[0], 7, "assign written past next->n_nodes");
        st = repair(NULL, next, m, 0, NULL, assign);
        cr_assert_eq(next->n_clusters, 0);
        plan_free(prev);
        plan_free(next);
}

static int try_repair(const Plan *prev, Plan *next, const Capability *caps, int *assign) {
        PlanRepairStats st;
        return plan_repair(&fm, prev, next, caps, sim, assign, &st);
}

Test(plan_repair, counts_out_of_bounds) {
        enum { N = 40 };
        Member m[N];
        Plan *prev = plan_new(), *next = plan_new();
        Capability caps[PLAN_MAX_NODES + 1];
        static int assign[PLAN_MAX_NODES + 1];
        draw(m, N, 10);
        form(prev, m, N, 20);
        plan_start(next, 2, m, N, caps);
        for (unsigned i = N; i <= PLAN_MAX_NODES; i++)
                caps[i] = caps[i % N];

        next->n_nodes = PLAN_MAX_NODES + 1;
        cr_assert_eq(try_repair(prev, next, caps, assign), -EINVAL);
        next->n_nodes = N;

        prev->n_nodes = PLAN_MAX_NODES + 1;
        cr_assert_eq(try_repair(prev, next, caps, assign), -EINVAL);
        prev->n_nodes = N;

        unsigned nc = prev->n_clusters;
        prev->n_clusters = PLAN_MAX_CLUSTERS + 1;
        cr_assert_eq(try_repair(prev, next, caps, assign), -EINVAL);
        prev->n_clusters = nc;

        /* a cluster of prev past its bounds: more stages than a plan has, none, a node not in prev */
        PlanCluster saved = prev->clusters[0];
        prev->clusters[0].n_stages = PLAN_MAX_STAGES + 1;
        cr_assert_eq(try_repair(prev, next, caps, assign), -EINVAL);
        prev->clusters[0].n_stages = 0;
        cr_assert_eq(try_repair(prev, next, caps, assign), -EINVAL);
        prev->clusters[0] = saved;
        prev->clusters[0].nodes[0] = N;
        cr_assert_eq(try_repair(prev, next, caps, assign), -EINVAL);
        prev->clusters[0] = saved;
        /* a node in two clusters */
        saved = prev->clusters[1];
        prev->clusters[1].nodes[0] = prev->clusters[0].nodes[0];
        cr_assert_eq(try_repair(prev, next, caps, assign), -EINVAL);
        prev->clusters[1] = saved;
        cr_assert_eq(try_repair(prev, next, caps, assign), 0);

        plan_free(prev);
        plan_free(next);
}
