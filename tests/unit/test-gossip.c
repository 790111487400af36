/* Gossip averaging: the topologies' groups, the mean they keep, the rate at
 * which they reach consensus against their spectral gap, and the real
 * exchange between members in threads over loopback links against the
 * pure simulation. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective/gossip.h"
#include "collective/topology.h"
#include "net/handshake.h"
#include "util/rng.h"

static const GossipTopology all_topos[] = { GOSSIP_COMPLETE, GOSSIP_RING, GOSSIP_EXP, GOSSIP_ALT_EXP_RING };

/* ---- groups ---------------------------------------------------------------- */

Test(topology, names_roundtrip) {
        for (int t = 0; t < _GOSSIP_TOPOLOGY_MAX; t++)
                cr_assert_eq(gossip_topology_from_string(gossip_topology_to_string(t)), t);
        cr_assert_eq(gossip_topology_from_string("star"), _GOSSIP_TOPOLOGY_INVALID);
}

Test(topology, every_member_in_exactly_one_group_per_iteration) {
        static unsigned g[GOSSIP_MAX_MEMBERS], h[GOSSIP_MAX_MEMBERS];
        const unsigned sizes[] = { 1, 2, 3, 4, 5, 6, 8, 12, 16, 33, 64 };
        for (size_t k = 0; k < ELEMENTSOF(all_topos); k++)
                for (size_t s = 0; s < ELEMENTSOF(sizes); s++) {
                        unsigned n = sizes[s];
                        for (uint64_t t = 0; t < 3 * gossip_period(all_topos[k], n) + 1; t++) {
                                unsigned seen[64] = {};
                                for (unsigned i = 0; i < n; i++) {
                                        int m = gossip_group(all_topos[k], n, i, t, g);
                                        cr_assert(m >= 1 && (unsigned)m <= n);
                                        bool self = false;
                                        for (int j = 0; j < m; j++) {
                                                cr_assert(j == 0 || g[j] > g[j - 1], "increasing");
                                                self |= g[j] == i;
                                                /* every member of i's group has that same group */
                                                int m2 = gossip_group(all_topos[k], n, g[j], t, h);
                                                cr_assert_eq(m2, m);
                                                cr_assert_eq(memcmp(g, h, (size_t)m * sizeof *g), 0,
                                                             "%s n=%u t=%llu: %u and %u disagree",
                                                             gossip_topology_to_string(all_topos[k]), n,
                                                             (unsigned long long)t, i, g[j]);
                                        }
                                        cr_assert(self);
                                        seen[i]++;
                                }
                                for (unsigned i = 0; i < n; i++)
                                        cr_assert_eq(seen[i], 1);
                        }
                }
}

/* Members left out (another model's) are in no group of the others, and
 * those left in still make groups they all agree on: the topology over
 * them alone, pairs where it pairs. */
Test(topology, groups_among_the_members_left_in_agree) {
        static unsigned g[GOSSIP_MAX_MEMBERS], h[GOSSIP_MAX_MEMBERS], want[GOSSIP_MAX_MEMBERS];
        const unsigned sizes[] = { 2, 3, 4, 5, 8, 13, 64 };
        Rng rng;
        rng_seed(&rng, 11, RNG_STREAM_TEST);
        for (size_t k = 0; k < ELEMENTSOF(all_topos); k++)
                for (size_t s = 0; s < ELEMENTSOF(sizes); s++)
                        for (int trial = 0; trial < 8; trial++) {
                                unsigned n = sizes[s], left = 0, at[64];
                                bool out[64] = {};
                                for (unsigned i = 0; i < n; i++) {
                                        out[i] = trial > 0 && rng_uniform(&rng) < 0.3;
                                        if (!out[i])
                                                at[left++] = i;
                                }
                                for (uint64_t t = 0; t < 2 * gossip_period(all_topos[k], n) + 1; t++)
                                        for (unsigned i = 0; i < n; i++) {
                                                int m = gossip_group_among(all_topos[k], n, out, i, t, g);
                                                if (out[i]) {
                                                        cr_assert(m == 1 && g[0] == i, "a member left out is alone");
                                                        continue;
                                                }
                                                /* what the topology gives over those left in */
                                                unsigned rank = 0;
                                                while (at[rank] != i)
                                                        rank++;
                                                cr_assert_eq(gossip_group(all_topos[k], left, rank, t, want), m);
                                                for (int j = 0; j < m; j++) {
                                                        cr_assert_eq(g[j], at[want[j]]);
                                                        cr_assert(!out[g[j]], "%s n=%u t=%llu: %u grouped with "
                                                                  "%u, left out", gossip_topology_to_string(
                                                                  all_topos[k]), n, (unsigned long long)t, i, g[j]);
                                                        int m2 = gossip_group_among(all_topos[k], n, out, g[j], t, h);
                                                        cr_assert(m2 == m && !memcmp(g, h, (size_t)m * sizeof *g),
                                                                  "%u and %u disagree", i, g[j]);
                                                }
                                        }
                        }
        unsigned one[4];
        cr_assert_eq(gossip_group_among(GOSSIP_RING, 4, (bool[4]){}, 4, 0, one), -EINVAL);
        cr_assert_eq(gossip_group_among(GOSSIP_RING, 4, NULL, 0, 0, one), 2, "NULL: nobody out");
}

Test(topology, alt_exp_ring_alternates_exp_and_ring_pairs) {
        unsigned g[8];
        /* n = 8: even t are exp hops of distance 1, 2, 4; odd t the ring's odd pairs (1,2)...(7,0) */
        cr_assert_eq(gossip_group(GOSSIP_ALT_EXP_RING, 8, 0, 0, g), 2);
        cr_assert_eq(g[1], 1);
        cr_assert_eq(gossip_group(GOSSIP_ALT_EXP_RING, 8, 0, 2, g), 2);
        cr_assert_eq(g[1], 2);
        cr_assert_eq(gossip_group(GOSSIP_ALT_EXP_RING, 8, 0, 4, g), 2);
        cr_assert_eq(g[1], 4);
        cr_assert_eq(gossip_group(GOSSIP_ALT_EXP_RING, 8, 1, 1, g), 2);
        cr_assert(g[0] == 1 && g[1] == 2);
        cr_assert_eq(gossip_group(GOSSIP_ALT_EXP_RING, 8, 0, 1, g), 2);
        cr_assert(g[0] == 0 && g[1] == 7);
        cr_assert_eq(gossip_group(GOSSIP_ALT_EXP_RING, 8, 0, 3, g), 2);
        cr_assert(g[0] == 0 && g[1] == 7);
        cr_assert_eq(gossip_period(GOSSIP_ALT_EXP_RING, 8), 6);
        /* a member without a partner at that distance sits out */
        cr_assert_eq(gossip_group(GOSSIP_EXP, 5, 4, 0, g), 1);
        cr_assert_eq(gossip_group(GOSSIP_RING, 5, 4, 0, g), 1);
        cr_assert_eq(gossip_group(GOSSIP_RING, 5, 0, 1, g), 1);
        cr_assert_eq(gossip_group(GOSSIP_COMPLETE, 5, 3, 9, g), 5);
}

Test(topology, mixing_matrices_are_doubly_stochastic) {
        enum { N = 12 };
        double W[N * N];
        const double weights[] = { 0, 0.3, 0.8 };
        for (size_t k = 0; k < ELEMENTSOF(all_topos); k++)
                for (size_t w = 0; w < ELEMENTSOF(weights); w++)
                        for (uint64_t t = 0; t < 8; t++) {
                                cr_assert_eq(gossip_mixing_matrix(all_topos[k], N, t, weights[w], W), 0);
                                for (unsigned i = 0; i < N; i++) {
                                        double row = 0, col = 0;
                                        for (unsigned j = 0; j < N; j++) {
                                                row += W[i * N + j];
                                                col += W[j * N + i];
                                                cr_assert_eq(W[i * N + j], W[j * N + i], "symmetric");
                                        }
                                        cr_assert_float_eq(row, 1.0, 1e-12);
                                        cr_assert_float_eq(col, 1.0, 1e-12);
                                }
                        }
}

/* ---- simulation ------------------------------------------------------------ */

typedef struct Vecs {
        unsigned n;
        size_t len;
        float *x[64];
} Vecs;

static void vecs_random(Vecs *v, unsigned n, size_t len, uint64_t seed) {
        Rng r;
        rng_seed(&r, seed, RNG_STREAM_TEST);
        v->n = n;
        v->len = len;
        for (unsigned i = 0; i < n; i++) {
                v->x[i] = malloc(len * sizeof(float));
                for (size_t e = 0; e < len; e++)
                        v->x[i][e] = (float)rng_normal(&r) + (float)i; /* distinct means per member */
        }
}

static void vecs_free(Vecs *v) {
        for (unsigned i = 0; i < v->n; i++)
                free(v->x[i]);
}

static void vecs_mean(const Vecs *v, double *mean) {
        for (size_t e = 0; e < v->len; e++) {
                double s = 0;
                for (unsigned i = 0; i < v->n; i++)
                        s += v->x[i][e];
                mean[e] = s / v->n;
        }
}

/* ||x - mean||_F over all members */
static double consensus_error(const Vecs *v) {
        double *mean = malloc(v->len * sizeof *mean), s = 0;
        vecs_mean(v, mean);
        for (unsigned i = 0; i < v->n; i++)
                for (size_t e = 0; e < v->len; e++) {
                        double d = v->x[i][e] - mean[e];
                        s += d * d;
                }
        free(mean);
        return sqrt(s);
}

Test(topology, every_topology_keeps_the_global_mean) {
        const unsigned sizes[] = { 4, 13, 16 };
        const double weights[] = { 0, 0.7 };
        for (size_t k = 0; k < ELEMENTSOF(all_topos); k++)
                for (size_t s = 0; s < ELEMENTSOF(sizes); s++)
                        for (size_t w = 0; w < ELEMENTSOF(weights); w++) {
                                Vecs v;
                                vecs_random(&v, sizes[s], 1000, 11 + s);
                                double m0[1000], m1[1000];
                                vecs_mean(&v, m0);
                                for (uint64_t t = 0; t < 60; t++)
                                        cr_assert_eq(gossip_simulate_step(all_topos[k], v.n, t, weights[w], v.x, v.len), 0);
                                vecs_mean(&v, m1);
                                double worst = 0;
                                for (size_t e = 0; e < v.len; e++)
                                        worst = fmax(worst, fabs(m1[e] - m0[e]));
                                /* float rounding: 60 steps of values around 10 */
                                cr_assert(worst < 2e-5, "%s n=%u w=%g: mean moved by %g",
                                          gossip_topology_to_string(all_topos[k]), v.n, weights[w], worst);
                                vecs_free(&v);
                        }
}

Test(topology, consensus_error_falls_at_the_rate_of_the_spectral_gap) {
        struct { GossipTopology topo; unsigned n; double weight; } cases[] = {
                { GOSSIP_RING, 16, 0 },         { GOSSIP_RING, 12, 0 },  { GOSSIP_RING, 16, 0.7 },
                { GOSSIP_ALT_EXP_RING, 12, 0 }, { GOSSIP_ALT_EXP_RING, 12, 0.7 },
                { GOSSIP_EXP, 12, 0 },          { GOSSIP_EXP, 16, 0.7 },
        };
        for (size_t c = 0; c < ELEMENTSOF(cases); c++) {
                double rho, sigma;
                unsigned p = gossip_period(cases[c].topo, cases[c].n);
                cr_assert_eq(gossip_contraction(cases[c].topo, cases[c].n, cases[c].weight, &rho, &sigma), 0);
                cr_assert(rho > 0 && rho < 1 && rho <= sigma + 1e-9);

                Vecs v;
                vecs_random(&v, cases[c].n, 512, 100 + c);
                uint64_t t = 0;
                double e0 = consensus_error(&v), prev = e0, bound_ok = 1;
                /* burn-in: two periods let the slowest mode dominate */
                for (; t < 2 * p; t++)
                        gossip_simulate_step(cases[c].topo, v.n, t, cases[c].weight, v.x, v.len);
                /* sigma bounds every period; rho is the rate seen over many */
                double start = consensus_error(&v);
                unsigned periods = 0;
                prev = start;
                while (periods < 40) {
                        for (unsigned k = 0; k < p; k++, t++)
                                gossip_simulate_step(cases[c].topo, v.n, t, cases[c].weight, v.x, v.len);
                        double e = consensus_error(&v);
                        if (e > sigma * prev * (1 + 1e-6) + 1e-5)
                                bound_ok = 0;
                        prev = e;
                        periods++;
                        if (e < 1e-4 * e0) /* stay well above float rounding */
                                break;
                }
                double measured = pow(prev / start, 1.0 / periods);
                fprintf(stderr, "%-12s n=%2u w=%.1f: period %u, predicted rho %.4f per period (gap %.4f per step), "
                                "sigma %.4f, measured %.4f over %u periods\n",
                        gossip_topology_to_string(cases[c].topo), cases[c].n, cases[c].weight, p, rho,
                        1 - pow(rho, 1.0 / p), sigma, measured, periods);
                cr_assert(bound_ok, "%s: a period contracted by more than sigma allows",
                          gossip_topology_to_string(cases[c].topo));
                cr_assert(measured <= rho * 1.03 && measured >= rho * 0.85, "%s n=%u: measured %.4f, predicted %.4f",
                          gossip_topology_to_string(cases[c].topo), cases[c].n, measured, rho);
                vecs_free(&v);
        }
}

Test(topology, exact_topologies_reach_the_mean_in_one_period) {
        /* complete: one step; exp on a power of two: log2 n steps; alt-exp-ring
         * on 4: two (an exp pair, then the ring's other pair); on 16: a period */
        struct { GossipTopology topo; unsigned n, steps; } cases[] = {
                { GOSSIP_COMPLETE, 13, 1 }, { GOSSIP_EXP, 16, 4 }, { GOSSIP_ALT_EXP_RING, 4, 2 },
                { GOSSIP_ALT_EXP_RING, 16, 8 },
        };
        for (size_t c = 0; c < ELEMENTSOF(cases); c++) {
                double rho;
                cr_assert_eq(gossip_contraction(cases[c].topo, cases[c].n, 0, &rho, NULL), 0);
                cr_assert_eq(rho, 0.0, "%s: rho %g", gossip_topology_to_string(cases[c].topo), rho);
                Vecs v;
                vecs_random(&v, cases[c].n, 256, 7);
                double e0 = consensus_error(&v);
                for (uint64_t t = 0; t < cases[c].steps; t++)
                        gossip_simulate_step(cases[c].topo, v.n, t, 0, v.x, v.len);
                cr_assert(consensus_error(&v) < 1e-6 * e0, "%s", gossip_topology_to_string(cases[c].topo));
                vecs_free(&v);
        }
}

/* ---- the real exchange ----------------------------------------------------- */

enum { MEMBERS = 4, LEN = 20011, ITERS = 6 };

typedef struct Node {
        Gossip *g;
        Identity id;
        float *x;
        int results[ITERS];
        unsigned index;
        float probe[3];  /* gossip_average() of { index, 1, -index } */
        int probe_result;
        pthread_t thread;
} Node;

static atomic_uint finished;
/* From iteration SWITCH_AT on, every member mixes with this topology
 * (gossip_set_topology()); and a probe round before the first. -1: none. */
enum { SWITCH_AT = 3 };
static int switch_to = -1;

static void *node_main(void *arg) {
        Node *nd = arg;
        for (int i = 0; i < 5000 && gossip_connected(nd->g) < MEMBERS - 1; i++)
                usleep(1000);
        if (switch_to >= 0) {
                nd->probe[0] = (float)nd->index, nd->probe[1] = 1, nd->probe[2] = -(float)nd->index;
                nd->probe_result = gossip_average(nd->g, nd->probe, 3, NULL);
        }
        for (uint64_t t = 0; t < ITERS; t++) {
                if (switch_to >= 0 && t == SWITCH_AT)
                        cr_assert_eq(gossip_set_topology(nd->g, (GossipTopology)switch_to), 0);
                int r = gossip_send(nd->g, nd->x, t);
                nd->results[t] = r < 0 ? r : gossip_mix(nd->g, nd->x);
        }
        /* stay until everyone is through: others may still need our pieces */
        atomic_fetch_add(&finished, 1);
        while (atomic_load(&finished) < MEMBERS)
                usleep(1000);
        return NULL;
}

/* The members over loopback, each training model (models[i]), their
 * threads run to the end. */
static void run_members(Node *nodes, const Vecs *sim, GossipTopology topo, double weight, const CollModel *models) {
        static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 9, 9, 9 };
        static NetConfig nc[MEMBERS];
        CollMember m[MEMBERS] = {};

        for (unsigned i = 0; i < MEMBERS; i++) {
                identity_generate(&nodes[i].id);
                memcpy(m[i].id, nodes[i].id.pk, IDENTITY_PK_SIZE);
                snprintf(m[i].host, sizeof m[i].host, "127.0.0.1");
                nodes[i].index = i;
                nodes[i].x = malloc(LEN * sizeof(float));
                memcpy(nodes[i].x, sim->x[i], LEN * sizeof(float));
        }
        for (unsigned i = 0; i < MEMBERS; i++) {
                GossipConfig c;
                gossip_config_defaults(&c);
                net_config_defaults(&nc[i]);
                nc[i].identity = &nodes[i].id;
                nc[i].secret = secret;
                nc[i].pool_bytes = 8u << 20;
                c.coll.net = &nc[i];
                c.coll.members = m;
                c.coll.n_members = MEMBERS;
                c.coll.self = i;
                c.coll.piece_bytes = 16384; /* several pieces per chunk */
                c.topology = topo;
                c.weight = weight;
                c.len = LEN;
                if (models)
                        c.coll.model = models[i];
                cr_assert_eq(gossip_new(&c, &nodes[i].g), 0);
                m[i].port = gossip_port(nodes[i].g);
        }
        for (unsigned i = 0; i < MEMBERS; i++) {
                for (unsigned j = 0; j < MEMBERS; j++)
                        gossip_set_address(nodes[i].g, j, "127.0.0.1", m[j].port);
                cr_assert_eq(gossip_start(nodes[i].g), 0);
        }
        atomic_store(&finished, 0);
        for (unsigned i = 0; i < MEMBERS; i++)
                pthread_create(&nodes[i].thread, NULL, node_main, &nodes[i]);
        for (unsigned i = 0; i < MEMBERS; i++)
                pthread_join(nodes[i].thread, NULL);
}

static void members_free(Node *nodes, Vecs *sim) {
        for (unsigned i = 0; i < MEMBERS; i++) {
                nodes[i].g = gossip_free(nodes[i].g);
                free(nodes[i].x);
        }
        vecs_free(sim);
}

static void real_vs_simulated(GossipTopology topo, double weight) {
        Node nodes[MEMBERS] = {};
        Vecs sim;

        vecs_random(&sim, MEMBERS, LEN, 42);
        run_members(nodes, &sim, topo, weight, NULL);
        GossipTopology at[ITERS];
        for (uint64_t t = 0; t < ITERS; t++)
                at[t] = switch_to >= 0 && t >= SWITCH_AT ? (GossipTopology)switch_to : topo;
        for (uint64_t t = 0; t < ITERS; t++)
                gossip_simulate_step(at[t], MEMBERS, t, weight, sim.x, LEN);
        for (unsigned i = 0; i < MEMBERS && switch_to >= 0; i++) {
                cr_assert_eq(nodes[i].probe_result, MEMBERS, "member %u: probe %d", i, nodes[i].probe_result);
                cr_assert_float_eq(nodes[i].probe[0], 1.5f, 1e-6);
                cr_assert_float_eq(nodes[i].probe[1], 1.0f, 1e-6);
                cr_assert(!memcmp(nodes[i].probe, nodes[0].probe, sizeof nodes[i].probe),
                          "an all-reduce leaves the same bits everywhere");
        }
        for (unsigned i = 0; i < MEMBERS; i++) {
                unsigned g[MEMBERS];
                for (uint64_t t = 0; t < ITERS; t++)
                        cr_assert_eq(nodes[i].results[t], gossip_group(at[t], MEMBERS, i, t, g),
                                     "%s: member %u iteration %llu: %d", gossip_topology_to_string(topo), i,
                                     (unsigned long long)t, nodes[i].results[t]);
                double worst = 0;
                for (size_t e = 0; e < LEN; e++)
                        worst = fmax(worst, fabs((double)nodes[i].x[e] - sim.x[i][e]));
                cr_assert(worst < 2e-5, "%s w=%g: member %u differs from the simulation by %g",
                          gossip_topology_to_string(topo), weight, i, worst);
                GossipStats st;
                gossip_get_stats(nodes[i].g, &st);
                cr_assert_eq(st.failed, 0);
        }
        members_free(nodes, &sim);
}

/* A probe round (gossip_average) first, and a topology switched between
 * iterations, as averaging.method "auto" does. */
Test(gossip, average_then_switch_topology) {
        switch_to = GOSSIP_COMPLETE;
        real_vs_simulated(GOSSIP_EXP, 0);
        switch_to = -1;
}

Test(gossip, alt_exp_ring_over_loopback_equals_simulation) {
        real_vs_simulated(GOSSIP_ALT_EXP_RING, 0);
}

Test(gossip, ring_with_weight_over_loopback_equals_simulation) {
        real_vs_simulated(GOSSIP_RING, 0.7);
}

Test(gossip, complete_over_loopback_equals_simulation) {
        real_vs_simulated(GOSSIP_COMPLETE, 0.4);
}

/* A member of another model (the last) is refused at once by name: the
 * others mix exactly among themselves at every iteration (the average of
 * the three), its own exchanges fail (-EBADE) and leave it as it was. */
static void another_model(bool same_count) {
        Node nodes[MEMBERS] = {};
        CollModel models[MEMBERS] = {};
        Vecs sim;

        for (unsigned i = 0; i < MEMBERS; i++)
                models[i] = (CollModel){ .digest = { 0x3c, 0x4d }, .values = LEN };
        if (same_count)
                models[MEMBERS - 1].digest[0] = 0x1a;
        else
                models[MEMBERS - 1].values = LEN - 1024;
        vecs_random(&sim, MEMBERS, LEN, 43);
        run_members(nodes, &sim, GOSSIP_COMPLETE, 0, models);
        for (unsigned i = 0; i < MEMBERS; i++) {
                bool odd = i == MEMBERS - 1;
                for (uint64_t t = 0; t < ITERS; t++)
                        cr_assert_eq(nodes[i].results[t], odd ? -EBADE : MEMBERS - 1, "member %u iteration %llu: %d",
                                     i, (unsigned long long)t, nodes[i].results[t]);
                GossipStats st;
                gossip_get_stats(nodes[i].g, &st);
                cr_assert_eq(st.foreign.count, odd ? MEMBERS - 1 : 1, "member %u refused %llu", i,
                             (unsigned long long)st.foreign.count);
                cr_assert(odd || st.foreign.member == MEMBERS - 1, "member %u names member %u", i, st.foreign.member);
                cr_assert(coll_model_check(&models[odd ? 0 : MEMBERS - 1], &st.foreign.theirs) == 0);
                for (size_t e = 0; e < LEN; e++) {
                        double want = odd ? sim.x[i][e] : ((double)sim.x[0][e] + sim.x[1][e] + sim.x[2][e]) / 3;
                        cr_assert(fabs((double)nodes[i].x[e] - want) < 1e-5, "member %u value %zu: %g, not %g", i, e,
                                  nodes[i].x[e], want);
                }
        }
        members_free(nodes, &sim);
}

Test(gossip, a_member_of_another_model_is_refused) { another_model(true); }
Test(gossip, a_member_of_another_count_is_refused) { another_model(false); }

/* Pairs: the member of another model (the last) is left out of the
 * others' pairings, which the topology makes among the three of them, so
 * they exchange with each other at every iteration and never lose one for
 * being paired with it (they failed, -EBADE, whenever they were); it
 * exchanges with nobody (-EBADE at once) and keeps its values. */
static void another_model_in_pairs(GossipTopology topo) {
        Node nodes[MEMBERS] = {};
        CollModel models[MEMBERS] = {};
        Vecs sim;
        bool out[MEMBERS] = { [MEMBERS - 1] = true };

        for (unsigned i = 0; i < MEMBERS; i++)
                models[i] = (CollModel){ .digest = { 0x3c, 0x4d }, .values = LEN };
        models[MEMBERS - 1].digest[0] = 0x1a;
        vecs_random(&sim, MEMBERS, LEN, 44);
        run_members(nodes, &sim, topo, 0, models);
        for (uint64_t t = 0; t < ITERS; t++) /* the three alone, as members 0, 1, 2 of three */
                gossip_simulate_step(topo, MEMBERS - 1, t, 0, sim.x, LEN);
        for (unsigned i = 0; i < MEMBERS; i++) {
                bool odd = i == MEMBERS - 1;
                for (uint64_t t = 0; t < ITERS; t++) {
                        unsigned g[MEMBERS];
                        int want = odd ? -EBADE : gossip_group_among(topo, MEMBERS, out, i, t, g);
                        cr_assert_eq(nodes[i].results[t], want, "%s: member %u iteration %llu: %d, not %d",
                                     gossip_topology_to_string(topo), i, (unsigned long long)t, nodes[i].results[t],
                                     want);
                }
                GossipStats st;
                gossip_get_stats(nodes[i].g, &st);
                cr_assert_eq(st.failed, odd ? ITERS : 0, "member %u: %llu failed", i, (unsigned long long)st.failed);
                for (size_t e = 0; e < LEN; e++)
                        cr_assert(fabs((double)nodes[i].x[e] - sim.x[i][e]) < 2e-5, "member %u value %zu: %g, not %g",
                                  i, e, nodes[i].x[e], sim.x[i][e]);
        }
        members_free(nodes, &sim);
}

Test(gossip, pairs_leave_a_member_of_another_model_out_alt_exp_ring) { another_model_in_pairs(GOSSIP_ALT_EXP_RING); }
Test(gossip, pairs_leave_a_member_of_another_model_out_ring) { another_model_in_pairs(GOSSIP_RING); }

Test(gossip, send_twice_is_busy_and_mix_without_send_is_nomsg) {
        static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 1 };
        Identity id;
        NetConfig nc;
        CollMember m[2] = {};
        identity_generate(&id);
        memcpy(m[0].id, id.pk, IDENTITY_PK_SIZE);
        snprintf(m[0].host, sizeof m[0].host, "127.0.0.1");
        snprintf(m[1].host, sizeof m[1].host, "127.0.0.1");
        net_config_defaults(&nc);
        nc.identity = &id;
        nc.secret = secret;
        nc.pool_bytes = 1u << 20;
        GossipConfig c;
        gossip_config_defaults(&c);
        c.coll.net = &nc;
        c.coll.members = m;
        c.coll.n_members = 2;
        c.coll.join_timeout_ms = 200;
        c.topology = GOSSIP_RING;
        c.len = 16;
        Gossip *g;
        cr_assert_eq(gossip_new(&c, &g), 0);
        cr_assert_eq(gossip_start(g), 0);
        float x[16] = { 1 };
        cr_assert_eq(gossip_mix(g, x), -ENOMSG);
        cr_assert_eq(gossip_send(g, x, 0), 0);
        cr_assert_eq(gossip_send(g, x, 1), -EBUSY);
        /* the partner never comes: the round gives up and x stays */
        int r = gossip_mix(g, x);
        cr_assert(r == 1 || r < 0, "%d", r);
        cr_assert_eq(x[0], 1.0f);
        gossip_free(g);

        c.weight = 1.0; /* w = 1 would never mix */
        cr_assert_eq(gossip_new(&c, &g), -EINVAL);
}
