/* The averaging thread: multi-ring segments, the delta hand-off that keeps
 * updates made during a round, and Moshpit groups reaching the exact average
 * on a full grid. Members are threads with real links on loopback. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>

#include "collective/averager.h"
#include "collective/segments.h"
#include "run/stage-checkpoint.h"
#include "net/handshake.h"
#include "util/rng.h"
#include "util/time-util.h"
#include "../lib/proc.h"

Test(segments, cut_at_every_boundary) {
        size_t a[] = { 0, 50, 100 }, b[] = { 0, 30, 100 };
        unsigned oa[] = { 0, 1 }, ob[] = { 3, 2 };
        ClusterCut cuts[] = { { a, oa, 2 }, { b, ob, 2 } };
        Segment *s;
        size_t n;
        cr_assert_eq(segments_plan(cuts, 2, 100, &s, &n), 0);
        cr_assert_eq(n, 3);
        size_t off[] = { 0, 30, 50 }, len[] = { 30, 20, 50 };
        unsigned own[3][2] = { { 0, 3 }, { 0, 2 }, { 1, 2 } };
        for (size_t i = 0; i < 3; i++) {
                cr_assert(s[i].off == off[i] && s[i].len == len[i], "segment %zu: [%zu,+%zu)", i, s[i].off, s[i].len);
                cr_assert(s[i].n_owners == 2 && s[i].owners[0] == own[i][0] && s[i].owners[1] == own[i][1],
                          "segment %zu owners %u %u", i, s[i].owners[0], s[i].owners[1]);
                cr_assert_eq(s[i].group, i + 1);
        }
        free(s);

        /* the same cut in both clusters: one segment per stage */
        ClusterCut same[] = { { a, oa, 2 }, { a, ob, 2 } };
        cr_assert_eq(segments_plan(same, 2, 100, &s, &n), 0);
        cr_assert_eq(n, 2);
        free(s);

        size_t bad[] = { 0, 60, 50, 100 };
        unsigned ob3[] = { 4, 5, 6 };
        ClusterCut badcut[] = { { a, oa, 2 }, { bad, ob3, 3 } };
        cr_assert_eq(segments_plan(badcut, 2, 100, &s, &n), -EINVAL, "bounds not increasing");
        ClusterCut twice[] = { { a, oa, 2 }, { b, oa, 2 } };
        cr_assert_eq(segments_plan(twice, 2, 100, &s, &n), -EINVAL, "member 0 in both clusters of a segment");
        cr_assert_eq(segments_plan(cuts, 2, 99, &s, &n), -EINVAL, "bounds do not end at total");
}


/* Wide rings: the grid's shape, and every position's group in every
 * dimension is the positions that differ from it in that coordinate only. */
Test(segments, ring_grid_shapes_and_groups) {
        struct { unsigned n, width, dims, side; } shapes[] = {
                { 1024, 64, 2, 32 }, { 1000, 64, 2, 32 }, { 64, 64, 1, 64 }, { 65, 64, 2, 9 },
                { 9, 3, 2, 3 },      { 8, 2, 3, 2 },      { 6, 4, 2, 3 },    { 2, 2, 1, 2 },
        };
        for (size_t i = 0; i < ELEMENTSOF(shapes); i++) {
                RingGrid g;
                cr_assert_eq(ring_grid(shapes[i].n, shapes[i].width, &g), 0);
                cr_assert(g.dims == shapes[i].dims && g.side == shapes[i].side, "%u in groups of %u: %u x %u",
                          shapes[i].n, shapes[i].width, g.dims, g.side);
        }
        RingGrid g;
        cr_assert_eq(ring_grid(0, 64, &g), -EINVAL);
        cr_assert_eq(ring_grid(SEGMENTS_MAX_OWNERS + 1, 64, &g), -EINVAL);
        cr_assert_eq(ring_grid(10, 1, &g), -EINVAL);
        cr_assert_eq(ring_grid(10, COLL_MAX_MEMBERS + 1, &g), -EINVAL);

        cr_assert_eq(ring_grid(1000, 64, &g), 0);
        for (unsigned pos = 0; pos < 1000; pos++)
                for (unsigned d = 0; d < g.dims; d++) {
                        unsigned out[COLL_MAX_MEMBERS], n = ring_grid_group(&g, pos, d, out), seen = 0;
                        cr_assert(n >= 1 && n <= g.side);
                        for (unsigned k = 0; k < n; k++) {
                                unsigned other = out[k], stride = d ? g.side : 1;
                                cr_assert(other < 1000 && (k == 0 || other > out[k - 1]));
                                cr_assert_eq(other % stride, pos % stride, "lower coordinate kept");
                                cr_assert_eq(other / (stride * g.side), pos / (stride * g.side), "higher kept");
                                seen += other == pos;
                        }
                        cr_assert_eq(seen, 1);
                        /* a partial last row: 1000 = 31 rows of 32 and one of 8 */
                        cr_assert_eq(n, d == 0 ? (pos >= 992 ? 8u : 32u) : (pos % 32 < 8 ? 32u : 31u));
                }
}

/* ---- averagers in threads ---------------------------------------------- */
/* (the outer optimizer's tests are at the end) */

#define MAX_NODES 64
static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 9 };

typedef struct Node {
        Averager *av;
        float *w, *x0;
        size_t len;
        unsigned deltas_wanted, deltas, snapshots;
        float bump;     /* added once right after the snapshot: an update made during the round */
        const float *anchor0, *momentum0; /* the outer optimizer's state to start from, or NULL */
        int die_after_snapshot_us;        /* > 0: this member's averager is freed that long after its snapshot */
        bool join;                        /* averager_join() before it starts */
        bool idle;                        /* takes no step: averager_serve() only, as a stage waiting for work */
        int start_after_us;               /* > 0: its averager starts that late */
        const volatile unsigned *until;   /* set: sync until it is non-zero too */
        float *moments;                   /* set: its optimizer's (2 x len), given to joiners */
        uint64_t steps;
        bool fetch;                       /* once joined, take a member's moments into fetched */
        float *fetched;
        int fetch_result;
        uint64_t fetched_steps;
        volatile unsigned fetch_done;
        float drift;                      /* added to every value at every step: training that parts the members */
        unsigned met, met_wanted;         /* rounds applied that took another member too; sync until met_wanted */
        volatile unsigned *release;       /* set: made non-zero once this node has synced enough */
        bool last_rounds;                 /* then take averager_last_rounds() last rounds */
        unsigned hold_after;              /* > 0: after that many deltas, wait for *go before the next step */
        unsigned restart_after;           /* > 0: after that many deltas, a new averager on the same port (a restart) */
        AveragerConfig cfg;               /* its configuration, for the restart */
        const uint16_t *ports;            /* every member's averaging port */
        volatile unsigned *go;            /* set: a late node makes it non-zero once started */
        unsigned last_whole;              /* last rounds that took their whole group */
        unsigned writes;                  /* averager_on_write() calls */
        float w0_at_write;                /* w[0] when the last one came */
        uint64_t joined_ns;               /* join: how long until averager_joining() was over */
        pthread_t thread;
} Node;

static void saw_write(void *ud) {
        Node *nd = ud;
        nd->writes++;
        nd->w0_at_write = nd->w[0];
}

/* Once its join round is applied: ask for a member's moments, then wait
 * for them. */
static void fetch_step(Node *nd) {
        const float *in;
        unsigned member;
        if (!nd->fetch || nd->fetch_done || nd->deltas == 0 || averager_joining(nd->av))
                return;
        int r = averager_fetched_state(nd->av, &in, &nd->fetched_steps, &member);
        if (r == -EINPROGRESS && !nd->fetched) {
                nd->fetched = malloc(2 * nd->len * sizeof(float));
                cr_assert_eq(averager_fetch_state(nd->av), 0);
                return;
        }
        if (r == -EINPROGRESS)
                return;
        if (r == 0)
                memcpy(nd->fetched, in, 2 * nd->len * sizeof(float));
        nd->fetch_result = r;
        averager_fetch_done(nd->av);
        nd->fetch_done = 1;
}

static void *train(void *arg) {
        Node *nd = arg;
        uint64_t t0 = now_ns();
        if (nd->start_after_us > 0) {
                usleep((useconds_t)nd->start_after_us);
                cr_assert_eq(averager_start(nd->av), 0);
                if (nd->go)
                        *nd->go = 1;
        }
        for (int i = 0; i < 20000 && ((nd->until && !*nd->until) || nd->deltas < nd->deltas_wanted ||
                                      nd->met < nd->met_wanted || nd->restart_after || (nd->fetch && !nd->fetch_done));
             i++) {
                float w0 = nd->w[0];
                int r = nd->idle ? averager_serve(nd->av, nd->w) : averager_sync(nd->av, nd->w, 0);
                /* told once per write, before it: the values then were those before the call */
                cr_assert_eq(nd->writes, nd->deltas + !!(r & AVERAGER_APPLIED));
                if (r & AVERAGER_APPLIED)
                        cr_assert_eq(nd->w0_at_write, w0);
                fetch_step(nd);
                if (nd->join && !nd->joined_ns && !averager_joining(nd->av))
                        nd->joined_ns = now_ns() - t0;
                if ((r & AVERAGER_SNAPSHOT) && nd->die_after_snapshot_us > 0) {
                        usleep((useconds_t)nd->die_after_snapshot_us);
                        nd->av = averager_free(nd->av); /* its links close mid-round */
                        return NULL;
                }
                if (r & AVERAGER_SNAPSHOT) {
                        nd->snapshots++;
                        for (size_t k = 0; k < nd->len; k++)
                                nd->w[k] += nd->bump;
                }
                if (r & AVERAGER_APPLIED) {
                        AveragerStats st;
                        averager_get_stats(nd->av, &st); /* of the round just applied */
                        nd->met += st.last_participants >= 2;
                        nd->deltas++;
                }
                for (size_t k = 0; nd->drift != 0 && k < nd->len; k++)
                        nd->w[k] += nd->drift;
                if (nd->restart_after && nd->deltas == nd->restart_after) {
                        nd->restart_after = 0;
                        nd->cfg.listen_port = averager_port(nd->av);
                        nd->av = averager_free(nd->av);
                        usleep(200 * 1000); /* its links are gone: the others average without it */
                        cr_assert_eq(averager_new(&nd->cfg, &nd->av), 0);
                        for (unsigned j = 0; j < nd->cfg.coll.n_members; j++)
                                averager_set_address(nd->av, j, "127.0.0.1", nd->ports[j]);
                        averager_on_write(nd->av, saw_write, nd);
                        nd->writes = nd->deltas = nd->met = 0;
                        cr_assert_eq(averager_start(nd->av), 0);
                }
                while (nd->hold_after && nd->deltas == nd->hold_after && nd->start_after_us <= 0 && !*nd->go)
                        usleep(1000);
                usleep(500);
        }
        if (nd->release)
                *nd->release = 1;
        for (unsigned k = 0, n = nd->last_rounds ? averager_last_rounds(nd->av) : 0; k < n; k++) {
                uint64_t ticket = averager_request(nd->av, 5000, k);
                for (int i = 0; i < 40000 && averager_done_ticket(nd->av) < ticket; i++) {
                        averager_serve(nd->av, nd->w);
                        usleep(250);
                }
                AveragerStats st;
                averager_get_stats(nd->av, &st);
                nd->last_whole += st.last_error == 0 && st.last_participants == st.last_group;
        }
        return NULL;
}

static void start_nodes_models(Node *nodes, unsigned n, AveragerConfig *cfg, const CollModel *odd_model,
                               unsigned odd, const AveragerRing (*rings)[4], const unsigned *n_rings,
                               const size_t *lens) {
        static Identity ids[MAX_NODES];
        static NetConfig nc[MAX_NODES];
        static uint16_t ports[MAX_NODES];
        CollMember m[MAX_NODES] = {};
        for (unsigned i = 0; i < n; i++) {
                identity_generate(&ids[i]);
                memcpy(m[i].id, ids[i].pk, IDENTITY_PK_SIZE);
                strcpy(m[i].host, "127.0.0.1");
        }
        for (unsigned i = 0; i < n; i++) {
                AveragerConfig c = *cfg;
                net_config_defaults(&nc[i]);
                nc[i].pool_bytes = 4u << 20; /* the vectors here are small; 64 nodes must not pin 4 GiB */
                nc[i].identity = &ids[i];
                nc[i].secret = secret;
                c.coll.net = &nc[i];
                c.coll.members = m;
                c.coll.n_members = n;
                c.coll.self = i;
                c.len = lens[i];
                if (odd_model && i == odd)
                        c.coll.model = *odd_model;
                if (rings) {
                        c.rings = rings[i];
                        c.n_rings = n_rings[i];
                }
                cr_assert_eq(averager_new(&c, &nodes[i].av), 0);
                nodes[i].cfg = c;
                nodes[i].ports = ports;
                ports[i] = averager_port(nodes[i].av);
                if (nodes[i].anchor0)
                        cr_assert_eq(averager_set_outer_state(nodes[i].av, nodes[i].anchor0, nodes[i].momentum0), 0);
                if (nodes[i].join)
                        cr_assert_eq(averager_join(nodes[i].av), 1);
                if (nodes[i].moments)
                        averager_set_optimizer(nodes[i].av, nodes[i].moments, 2, &nodes[i].steps);
                averager_on_write(nodes[i].av, saw_write, &nodes[i]);
        }
        for (unsigned i = 0; i < n; i++)
                for (unsigned j = 0; j < n; j++)
                        averager_set_address(nodes[i].av, j, "127.0.0.1", averager_port(nodes[j].av));
        for (unsigned i = 0; i < n; i++) {
                if (nodes[i].start_after_us <= 0)
                        cr_assert_eq(averager_start(nodes[i].av), 0);
                cr_assert_eq(pthread_create(&nodes[i].thread, NULL, train, &nodes[i]), 0);
        }
        for (unsigned i = 0; i < n; i++)
                pthread_join(nodes[i].thread, NULL);
}

static void start_nodes(Node *nodes, unsigned n, AveragerConfig *cfg, const AveragerRing (*rings)[4],
                        const unsigned *n_rings, const size_t *lens) {
        start_nodes_models(nodes, n, cfg, NULL, 0, rings, n_rings, lens);
}

static void fill(Node *nd, size_t len, uint64_t seed) {
        Rng rng;
        rng_seed(&rng, seed, RNG_STREAM_TEST);
        nd->len = len;
        nd->w = malloc(len * sizeof *nd->w);
        nd->x0 = malloc(len * sizeof *nd->x0);
        for (size_t k = 0; k < len; k++)
                nd->w[k] = nd->x0[k] = 2 * rng_uniform(&rng) - 1;
}

/* Every node in one ring (group 1) over its whole slab of len values. */
static void start_one_ring(Node *nodes, unsigned n, AveragerConfig *cfg, size_t len) {
        static AveragerRing rings[MAX_NODES][4];
        static unsigned n_rings[MAX_NODES];
        static size_t lens[MAX_NODES];
        AveragerRing ring = { .group = 1, .n = n, .len = len };
        for (unsigned i = 0; i < n; i++)
                ring.members[i] = i;
        for (unsigned i = 0; i < n; i++) {
                rings[i][0] = ring;
                n_rings[i] = 1;
                lens[i] = len;
        }
        start_nodes(nodes, n, cfg, rings, n_rings, lens);
}

static void free_nodes(Node *nodes, unsigned n) {
        for (unsigned i = 0; i < n; i++) {
                free(nodes[i].w);
                free(nodes[i].x0);
                free(nodes[i].moments);
                free(nodes[i].fetched);
                averager_free(nodes[i].av);
        }
}

/* 2 clusters x 2 stages of a 1000-value model, cut at 500 and 300: three
 * rings at once. After one round each replica of a value holds the average
 * of the two clusters' values plus the update it made during the round. */
Test(averager, multi_ring_delta_keeps_updates) {
        enum { TOTAL = 100000 };
        size_t cut_a = TOTAL / 2, cut_b = TOTAL * 3 / 10;
        /* node 0: A[0,50) 1: A[50,100) 2: B[0,30) 3: B[30,100) */
        size_t start[4] = { 0, cut_a, 0, cut_b }, lens[4] = { cut_a, TOTAL - cut_a, cut_b, TOTAL - cut_b };
        size_t ab[] = { 0, cut_a, TOTAL }, bb[] = { 0, cut_b, TOTAL };
        unsigned oa[] = { 0, 1 }, ob[] = { 2, 3 };
        ClusterCut cuts[] = { { ab, oa, 2 }, { bb, ob, 2 } };
        Segment *seg;
        size_t n_seg;
        cr_assert_eq(segments_plan(cuts, 2, TOTAL, &seg, &n_seg), 0);
        AveragerRing rings[4][4] = {};
        unsigned n_rings[4] = {};
        for (size_t s = 0; s < n_seg; s++)
                for (unsigned k = 0; k < seg[s].n_owners; k++) {
                        unsigned m = seg[s].owners[k];
                        AveragerRing *g = &rings[m][n_rings[m]++];
                        g->group = seg[s].group;
                        g->n = seg[s].n_owners;
                        memcpy(g->members, seg[s].owners, sizeof seg[s].owners);
                        g->off = seg[s].off - start[m];
                        g->len = seg[s].len;
                }
        cr_assert(n_rings[0] == 2 && n_rings[3] == 2 && n_rings[1] == 1 && n_rings[2] == 1);

        /* both clusters start from the same values, then diverge */
        Node nodes[4] = {};
        float *model[2];
        for (unsigned c = 0; c < 2; c++) {
                Node tmp = {};
                fill(&tmp, TOTAL, 100 + c);
                model[c] = tmp.w;
                free(tmp.x0);
        }
        for (unsigned i = 0; i < 4; i++) {
                nodes[i].len = lens[i];
                nodes[i].w = malloc(lens[i] * sizeof(float));
                memcpy(nodes[i].w, model[i / 2] + start[i], lens[i] * sizeof(float));
                nodes[i].deltas_wanted = 1;
                nodes[i].bump = 0.125f * (float)(i + 1);
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        start_nodes(nodes, 4, &cfg, rings, n_rings, lens);

        for (unsigned i = 0; i < 4; i++) {
                AveragerStats st;
                averager_get_stats(nodes[i].av, &st);
                cr_assert_eq(nodes[i].deltas, 1, "node %u applied %u deltas", i, nodes[i].deltas);
                cr_assert_eq(st.rounds_done, 1, "node %u: %lu done %lu failed (error %d)", i, st.rounds_done,
                             st.rounds_failed, st.last_error);
                cr_assert_eq(st.values_averaged, lens[i]);
                for (size_t k = 0; k < lens[i]; k++) {
                        size_t g = start[i] + k;
                        double avg = ((double)model[0][g] + model[1][g]) / 2;
                        float got = nodes[i].w[k] - nodes[i].bump;
                        cr_assert(fabs(got - avg) < 1e-5, "node %u value %zu: %g vs %g", i, g, got, avg);
                }
        }
        for (unsigned i = 0; i < 4; i++) {
                free(nodes[i].w);
                averager_free(nodes[i].av);
        }
        free(model[0]);
        free(model[1]);
        free(seg);
}

/* A member that joins takes the others' average and gives nothing: after
 * its round (one of three), every member holds the mean of members 0 and 1
 * alone (member 2's values would move it by a third of their distance),
 * and member 2 is joined: when all three start together, and when member 2
 * starts while the other two average on without it. */
static void join(int late_us) {
        enum { LEN = 4096 };
        Node nodes[3] = {};
        for (unsigned i = 0; i < 3; i++) {
                fill(&nodes[i], LEN, 300 + i);
                nodes[i].deltas_wanted = 1;
        }
        nodes[2].start_after_us = late_us;
        if (late_us) /* the others average among themselves meanwhile, and on until it has joined */
                nodes[0].until = nodes[1].until = &nodes[2].deltas;
        for (size_t k = 0; k < LEN; k++)
                nodes[2].w[k] = nodes[2].x0[k] = 50.0f; /* far from the others */
        nodes[2].join = true;
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        cfg.coll.join_timeout_ms = 300; /* the first two go on without the third after this */
        start_one_ring(nodes, 3, &cfg, LEN);
        for (unsigned i = 0; i < 3; i++) {
                AveragerStats st;
                averager_get_stats(nodes[i].av, &st);
                if (i == 2 || !late_us) {
                        cr_assert_eq(st.rounds_done, 1, "member %u: %lu rounds (error %d)", i, st.rounds_done,
                                     st.last_error);
                        cr_assert_eq(st.last_participants, 3);
                }
                for (size_t k = 0; k < LEN; k++) {
                        double want = ((double)nodes[0].x0[k] + nodes[1].x0[k]) / 2;
                        cr_assert(fabs(nodes[i].w[k] - want) < 1e-5, "member %u value %zu: %g, not %g", i, k,
                                  nodes[i].w[k], want);
                }
        }
        cr_assert(!averager_joining(nodes[2].av));
        free_nodes(nodes, 3);
}

Test(averager, a_joining_member_takes_and_gives_nothing) { join(0); }

/* A member whose model is another (another digest of its layers with the
 * same count, or another count) is refused by name at once: the other two
 * average exactly among themselves round after round, without waiting for
 * it; its own rounds fail (-EBADE), none counts as done, and its wait to
 * take the swarm's parameters ends at once. */
static void another_model(bool same_count) {
        enum { LEN = 4096, ROUNDS = 3 };
        Node nodes[3] = {};
        volatile unsigned healthy_done = 0;
        size_t lens[3] = { LEN, LEN, same_count ? LEN : LEN - 512 };
        for (unsigned i = 0; i < 3; i++)
                fill(&nodes[i], lens[i], 500 + i);
        nodes[0].deltas_wanted = nodes[1].deltas_wanted = ROUNDS;
        nodes[0].release = &healthy_done;
        nodes[2].until = &healthy_done;
        nodes[2].join = true; /* takes the swarm's parameters first: there are none of its model */
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        CollModel ours = { .digest = { 0xaa }, .values = LEN }, theirs = ours;
        if (same_count)
                theirs.digest[1] = 1;
        else
                theirs.values = LEN - 512;
        static AveragerRing rings[3][4];
        static unsigned n_rings[3] = { 1, 1, 1 };
        for (unsigned i = 0; i < 3; i++)
                rings[i][0] = (AveragerRing){ .group = 1, .n = 3, .members = { 0, 1, 2 }, .len = lens[i] };
        Node *odd = &nodes[2];
        cfg.coll.model = ours;
        start_nodes_models(nodes, 3, &cfg, &theirs, 2, rings, n_rings, lens);
        for (unsigned i = 0; i < 2; i++) {
                AveragerStats st;
                averager_get_stats(nodes[i].av, &st);
                cr_assert_eq(st.rounds_failed, 0, "member %u: %lu rounds failed (error %d)", i, st.rounds_failed,
                             st.last_error);
                cr_assert_geq(st.rounds_done, ROUNDS);
                cr_assert_eq(st.last_participants, 2, "member %u", i);
                cr_assert_eq(st.foreign.count, 1, "member %u refused %lu", i, st.foreign.count);
                cr_assert_eq(st.foreign.member, 2);
                cr_assert(coll_model_check(&theirs, &st.foreign.theirs) == 0, "member %u names its model", i);
                for (size_t k = 0; k < LEN; k++) {
                        double want = ((double)nodes[0].x0[k] + nodes[1].x0[k]) / 2;
                        cr_assert(fabs(nodes[i].w[k] - want) < 1e-6, "member %u value %zu: %g, not %g", i, k,
                                  nodes[i].w[k], want);
                }
        }
        AveragerStats st;
        averager_get_stats(odd->av, &st);
        cr_assert_eq(st.rounds_done, 0, "the odd member counted %lu rounds done", st.rounds_done);
        cr_assert_geq(st.rounds_failed, 1);
        cr_assert_eq(st.last_error, -EBADE, "its rounds failed with %d", st.last_error);
        cr_assert_eq(st.foreign.count, 2, "it refused %lu members", st.foreign.count);
        cr_assert(odd->joined_ns > 0 && odd->joined_ns < 3000000000ull, "its join took %.0f ms",
                  (double)odd->joined_ns / 1e6);
        cr_assert(memcmp(odd->w, odd->x0, lens[2] * sizeof(float)) == 0, "it took nobody's values");
        free_nodes(nodes, 3);
}

Test(averager, a_member_of_another_model_is_refused_at_once) { another_model(true); }
Test(averager, a_member_of_another_count_is_refused_at_once) { another_model(false); }

/* A member that takes no step (a stage waiting for micro-batches) still
 * hands its snapshot over and takes the average: the others' round does
 * not wait for its next update. */
Test(averager, an_idle_member_averages_without_a_step) {
        enum { LEN = 2048 };
        Node nodes[3] = {};
        for (unsigned i = 0; i < 3; i++) {
                fill(&nodes[i], LEN, 500 + i);
                nodes[i].deltas_wanted = 1;
        }
        nodes[0].idle = true; /* member 0 leads every round */
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        start_one_ring(nodes, 3, &cfg, LEN);
        for (unsigned i = 0; i < 3; i++) {
                AveragerStats st;
                averager_get_stats(nodes[i].av, &st);
                cr_assert_geq(st.rounds_done, 1, "member %u", i);
                for (size_t k = 0; k < LEN; k++) {
                        double want = ((double)nodes[0].x0[k] + nodes[1].x0[k] + nodes[2].x0[k]) / 3;
                        cr_assert(fabs(nodes[i].w[k] - want) < 1e-5, "member %u value %zu", i, k);
                }
        }
        free_nodes(nodes, 3);
}

/* A member whose only partner never comes: its rounds have nobody else
 * (1 of 2 members), average nothing and say so: rounds_alone, and no last
 * round with another member. */
Test(averager, a_round_without_another_member_averages_nothing, .timeout = 60) {
        enum { LEN = 64 };
        Identity ids[2];
        NetConfig nc;
        CollMember m[2] = {};
        AveragerRing ring = { .group = 1, .members = { 0, 1 }, .n = 2, .len = LEN };
        AveragerConfig cfg;
        Node nd = {};
        for (unsigned i = 0; i < 2; i++) {
                identity_generate(&ids[i]);
                memcpy(m[i].id, ids[i].pk, IDENTITY_PK_SIZE);
                strcpy(m[i].host, "127.0.0.1");
        }
        fill(&nd, LEN, 7);
        net_config_defaults(&nc);
        nc.pool_bytes = 1u << 20;
        nc.identity = &ids[0];
        nc.secret = secret;
        averager_config_defaults(&cfg);
        cfg.coll.net = &nc;
        cfg.coll.members = m;
        cfg.coll.n_members = 2;
        cfg.coll.self = 0;
        cfg.coll.join_timeout_ms = 100;
        cfg.interval_ms = 20;
        cfg.len = LEN;
        cfg.rings = &ring;
        cfg.n_rings = 1;
        cr_assert_eq(averager_new(&cfg, &nd.av), 0);
        averager_set_address(nd.av, 1, "127.0.0.1", test_free_port()); /* nobody listens there */
        cr_assert_eq(averager_start(nd.av), 0);
        AveragerStats st = {};
        for (int i = 0; i < 40000 && st.rounds_done < 3; i++) {
                averager_sync(nd.av, nd.w, 1);
                averager_get_stats(nd.av, &st);
                usleep(250);
        }
        cr_assert_geq(st.rounds_done, 3, "%lu rounds failed (error %d)", (unsigned long)st.rounds_failed,
                      st.last_error);
        cr_assert_eq(st.rounds_alone, st.rounds_done, "every round had this member alone");
        cr_assert_eq(st.last_participants, 1);
        cr_assert_eq(st.last_group, 2);
        cr_assert_eq(st.averaged.realtime_us, 0, "no round averaged with another member");
        cr_assert_eq(st.averaged.participants, 0);
        for (size_t k = 0; k < LEN; k++)
                cr_assert_eq(nd.w[k], nd.x0[k], "value %zu changed", k);
        free_nodes(&nd, 1);
}

/* A joiner takes two arrays of moments for each of its two rings, which sit
 * elsewhere in its slab than in the givers': each ring's values from one
 * giver, whole (a giver prepares one copy at a time, so the second ring's
 * ask may go to the other giver), with the larger step count. */
Test(averager, a_joiner_takes_the_moments_of_each_ring) {
        enum { LEN = 1000, A = 300 };
        Node nodes[3] = {};
        size_t lens[3] = { LEN, LEN, LEN };
        for (unsigned i = 0; i < 3; i++) {
                fill(&nodes[i], LEN, 400 + i);
                nodes[i].deltas_wanted = 1;
        }
        for (unsigned i = 0; i < 2; i++) { /* giver i: m = +-k, v = 2k + i, by place in its slab */
                nodes[i].moments = malloc(2 * LEN * sizeof(float));
                for (size_t k = 0; k < LEN; k++) {
                        nodes[i].moments[k] = i ? -(float)k : (float)k;
                        nodes[i].moments[LEN + k] = 2.0f * (float)k + (float)i;
                }
                nodes[i].steps = 100 + i;
                nodes[i].until = &nodes[2].fetch_done;
        }
        nodes[2].moments = calloc(2 * LEN, sizeof(float));
        nodes[2].join = nodes[2].fetch = true;
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        /* ring 1 holds the givers' values [0, A) and the joiner's [LEN - A, LEN) */
        AveragerRing a = { .group = 1, .n = 3, .members = { 0, 1, 2 }, .len = A };
        AveragerRing b = { .group = 2, .n = 3, .members = { 0, 1, 2 }, .len = LEN - A };
        AveragerRing rings[3][4] = { { a, b }, { a, b }, { a, b } };
        rings[0][1].off = rings[1][1].off = A;
        rings[2][0].off = LEN - A;
        unsigned n_rings[3] = { 2, 2, 2 };
        start_nodes(nodes, 3, &cfg, rings, n_rings, lens);

        Node *j = &nodes[2];
        cr_assert_eq(j->fetch_result, 0, "%s", strerror(-j->fetch_result));
        cr_assert(j->fetched_steps == 100 || j->fetched_steps == 101);
        for (unsigned r = 0; r < 2; r++) { /* each ring whole from one giver */
                size_t from = r == 0 ? 0 : A, to = r == 0 ? LEN - A : 0, n = r == 0 ? A : LEN - A;
                float sign = j->fetched[to + 1] < 0 ? -1 : 1;
                for (size_t k = 0; k < n; k++) {
                        cr_assert_eq(j->fetched[to + k], sign * (float)(from + k), "ring %u value %zu", r, k);
                        cr_assert_eq(j->fetched[LEN + to + k], 2.0f * (float)(from + k) + (sign < 0), "ring %u", r);
                }
        }
        /* the moments count in the averaging bytes: the joiner received
         * them on top of its rounds (which send as much as they receive,
         * but for a few bytes of the unequal chunks), the givers sent them */
        size_t state = 2 * LEN * sizeof(float) + 2 * COLL_PIECE_HEADER; /* a piece for each ring */
        AveragerStats st[3];
        for (unsigned i = 0; i < 3; i++)
                averager_get_stats(nodes[i].av, &st[i]);
        int64_t in = (int64_t)(st[2].bytes_received - st[2].bytes_sent);
        int64_t out = (int64_t)(st[0].bytes_sent + st[1].bytes_sent) - (int64_t)(st[0].bytes_received +
                                                                             st[1].bytes_received);
        cr_assert(in >= (int64_t)state - 64 && in <= (int64_t)state + 64, "received %lld more than sent, the "
                  "state is %zu bytes", (long long)in, state);
        cr_assert(out >= (int64_t)state - 128 && out <= (int64_t)state + 128, "sent %lld more", (long long)out);
        free_nodes(nodes, 3);
}

/* A giver that has taken no step holds zero moments: it says so, and none
 * travel; the joiner takes zeros and 0 steps. */
Test(averager, a_giver_without_a_step_sends_no_moments) {
        enum { LEN = 100000 };
        Node nodes[2] = {};
        for (unsigned i = 0; i < 2; i++) {
                fill(&nodes[i], LEN, 450 + i);
                nodes[i].deltas_wanted = 1;
                nodes[i].moments = calloc(2 * LEN, sizeof(float));
        }
        nodes[0].until = &nodes[1].fetch_done;
        nodes[1].join = nodes[1].fetch = true;
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        start_one_ring(nodes, 2, &cfg, LEN);

        Node *j = &nodes[1];
        cr_assert_eq(j->fetch_result, 0, "%s", strerror(-j->fetch_result));
        cr_assert_eq(j->fetched_steps, 0);
        for (size_t k = 0; k < 2 * LEN; k++)
                cr_assert_eq(j->fetched[k], 0.0f, "value %zu", k);
        AveragerStats st;
        averager_get_stats(j->av, &st);
        int64_t in = (int64_t)(st.bytes_received - st.bytes_sent);
        cr_assert(in >= -64 && in <= 64, "received %lld more than sent: moments came", (long long)in);
        free_nodes(nodes, 2);
}
Test(averager, a_member_joining_late_takes_and_gives_nothing) { join(700 * 1000); }

/* Every member holds the exact average of the n members' first values. */
static void expect_exact_average(const Node *nodes, unsigned n, size_t len) {
        for (size_t k = 0; k < len; k++) {
                long double exact = 0;
                for (unsigned i = 0; i < n; i++)
                        exact += nodes[i].x0[k];
                exact /= n;
                for (unsigned i = 0; i < n; i++)
                        cr_assert(fabsl(nodes[i].w[k] - exact) < 1e-6L, "member %u value %zu: %g vs %Lg after %u rounds",
                                  i, k, nodes[i].w[k], exact, nodes[i].deltas);
        }
}

/* Moshpit on a full 2x2x2 grid: after 3 rounds (one per dimension) every
 * member holds the exact average of the 8 (Moshpit SGD, Section 3.1). */
static void moshpit_full_grid(unsigned dims, unsigned side, bool outer) {
        unsigned n = 1;
        for (unsigned d = 0; d < dims; d++)
                n *= side;
        cr_assert(n <= MAX_NODES);
        Node nodes[MAX_NODES] = {};
        size_t lens[MAX_NODES];
        for (unsigned i = 0; i < n; i++) {
                fill(&nodes[i], 5000, 7 * i + 1);
                nodes[i].deltas_wanted = dims;
                lens[i] = 5000;
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.method = AVERAGER_MOSHPIT;
        cfg.grid = (MoshpitGrid){ .dims = dims, .side = side };
        cfg.interval_steps = 1;
        if (outer) /* lr 1 without momentum: the outer step is the average */
                cfg.outer = (AveragerOuter){ .enabled = true, .lr = 1, .momentum = 0, .nesterov = true };
        start_nodes(nodes, n, &cfg, NULL, NULL, lens);
        expect_exact_average(nodes, n, 5000);
        for (unsigned i = 0; i < n; i++) {
                AveragerStats st;
                averager_get_stats(nodes[i].av, &st);
                cr_assert_eq(st.rounds_done, dims);
                cr_assert_eq(st.last_participants, side, "groups of one row");
                free(nodes[i].w);
                free(nodes[i].x0);
                averager_free(nodes[i].av);
        }
}

Test(averager, moshpit_exact_after_d_rounds_2x2x2) { moshpit_full_grid(3, 2, false); }
Test(averager, moshpit_with_an_outer_step_of_lr_1_2x2x2) { moshpit_full_grid(3, 2, true); }
Test(averager, moshpit_exact_after_d_rounds_3x3) { moshpit_full_grid(2, 3, false); }


/* A ring wider than group_size: n members on a full grid average in
 * groups, one dimension per round, and after as many rounds as dimensions
 * every member holds the exact average of all of them (with fragments,
 * each fragment goes through every dimension). A node links only with the
 * members it meets. */
static void wide_ring(unsigned n, unsigned group, unsigned dims, unsigned fragments) {
        enum { LEN = 3000 };
        cr_assert(n <= MAX_NODES);
        Node nodes[MAX_NODES] = {};
        size_t lens[MAX_NODES];
        static AveragerRing rings[MAX_NODES][4];
        unsigned n_rings[MAX_NODES], f = MAX(fragments, 1u);
        for (unsigned i = 0; i < n; i++) {
                fill(&nodes[i], LEN, 11 * i + 3);
                nodes[i].deltas_wanted = dims * f;
                lens[i] = LEN;
                rings[i][0] = (AveragerRing){ .group = 1, .n = n, .len = LEN };
                for (unsigned k = 0; k < n; k++)
                        rings[i][0].members[k] = k;
                n_rings[i] = 1;
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_steps = 1;
        cfg.group_size = group;
        cfg.fragments = fragments;
        /* every member takes part: on a loaded machine, 64 of them on two
         * cores may be slower to come than a group waits for them by
         * default (once a group went on without one: CI, 2026-11-28) */
        cfg.coll.join_timeout_ms = 60000;
        start_nodes(nodes, n, &cfg, (const AveragerRing (*)[4])rings, n_rings, lens);
        expect_exact_average(nodes, n, LEN);
        RingGrid g;
        cr_assert_eq(ring_grid(n, group, &g), 0);
        for (unsigned i = 0; i < n; i++) {
                AveragerStats st;
                averager_get_stats(nodes[i].av, &st);
                cr_assert_eq(st.rounds_done, dims * f);
                cr_assert_eq(st.last_participants, g.side, "member %u: groups of one row", i);
                cr_assert_eq(st.last_group, g.side);
                cr_assert_eq(st.connected, dims * (g.side - 1), "member %u: links to %u members", i, st.connected);
                cr_assert_eq(averager_last_rounds(nodes[i].av), dims);
        }
        for (unsigned i = 0; i < n; i++) {
                free(nodes[i].w);
                free(nodes[i].x0);
                averager_free(nodes[i].av);
        }
}

Test(averager, wide_ring_exact_after_d_rounds_3x3) { wide_ring(9, 3, 2, 1); }
Test(averager, wide_ring_exact_after_d_rounds_2x2x2) { wide_ring(8, 2, 3, 1); }
Test(averager, wide_ring_with_fragments_2x2) { wide_ring(4, 2, 2, 2); }
Test(averager, wide_ring_of_64_on_8x8, .timeout = 120) { wide_ring(64, 8, 2, 1); }

/* one round is not enough: after 1 of 3 rounds the members still differ */
Test(averager, moshpit_one_round_is_partial) {
        Node nodes[8] = {};
        size_t lens[8];
        for (unsigned i = 0; i < 8; i++) {
                fill(&nodes[i], 100, 7 * i + 1);
                nodes[i].deltas_wanted = 1;
                lens[i] = 100;
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.method = AVERAGER_MOSHPIT;
        cfg.grid = (MoshpitGrid){ .dims = 3, .side = 2 };
        cfg.interval_steps = 1;
        start_nodes(nodes, 8, &cfg, NULL, NULL, lens);
        /* members 0 and 1 share a group in round 0; 0 and 2 do not */
        cr_assert(memcmp(nodes[0].w, nodes[1].w, 100 * sizeof(float)) == 0);
        cr_assert(memcmp(nodes[0].w, nodes[2].w, 100 * sizeof(float)) != 0);
        for (unsigned i = 0; i < 8; i++) {
                free(nodes[i].w);
                free(nodes[i].x0);
                averager_free(nodes[i].av);
        }
}

/* Every member holds the same values, up to the rounding of w + (avg - w). */
static void expect_one_model(const Node *nodes, unsigned n) {
        for (unsigned i = 1; i < n; i++)
                for (size_t k = 0; k < nodes[0].len; k++)
                        cr_assert(fabsf(nodes[i].w[k] - nodes[0].w[k]) <= 1e-6f * (1 + fabsf(nodes[0].w[k])),
                                  "member %u value %zu: %g, member 0: %g", i, k, nodes[i].w[k], nodes[0].w[k]);
}

#define N_NONE 4u /* no member restarts */
/* Moshpit on a 2x2 grid (member i in cell i; groups {0,1} {2,3} along
 * dimension 0, {0,2} {1,3} along 1): members that train apart (each drifts
 * its own way) until the last late member (or member 0) has had 3 rounds
 * with others, then take the last rounds, which must leave them all with
 * one model. The late members start late_us after the others, at the first
 * dimension, maybe not the others'; the held ones average once (alone: the
 * late ones are not up) and wait for them, so that their next round is
 * along the second dimension. A restarted member (< N) averages 20 times,
 * then takes a new averager, which counts from 0 again, and must then meet
 * the others 3 times. */
static void moshpit_swarm(unsigned late_mask, unsigned held_mask, unsigned restarted, unsigned interval_ms,
                          unsigned join_ms) {
        enum { N = 4, LEN = 3000 };
        Node nodes[N] = {};
        size_t lens[N];
        volatile unsigned released = 0, go = 0;
        unsigned last = 0;
        for (unsigned i = 0; i < N; i++) {
                fill(&nodes[i], LEN, 13 * i + 5);
                nodes[i].drift = 1e-4f * (float)(i + 1);
                nodes[i].last_rounds = true;
                nodes[i].until = &released;
                nodes[i].go = &go;
                nodes[i].start_after_us = late_mask & (1u << i) ? 1500 * 1000 : 0;
                nodes[i].hold_after = held_mask & (1u << i) ? 1 : 0;
                lens[i] = LEN;
                if (late_mask & (1u << i))
                        last = i;
        }
        if (restarted < N) {
                last = restarted;
                nodes[last].restart_after = 20;
        }
        nodes[last].until = NULL;
        nodes[last].release = &released;
        nodes[last].met_wanted = 3;
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.method = AVERAGER_MOSHPIT;
        cfg.grid = (MoshpitGrid){ .dims = 2, .side = 2 };
        cfg.interval_ms = interval_ms;
        cfg.coll.join_timeout_ms = join_ms;
        start_nodes(nodes, N, &cfg, NULL, NULL, lens);
        cr_assert_geq(nodes[last].met, 3, "member %u took part with others in %u of %u rounds", last, nodes[last].met,
                      nodes[last].deltas);
        expect_one_model(nodes, N);
        for (unsigned i = 0; i < N; i++) {
                cr_assert_eq(averager_last_rounds(nodes[i].av), 2, "one last round per dimension");
                cr_assert_eq(nodes[i].last_whole, 2, "member %u: %u of 2 last rounds with its whole group", i,
                             nodes[i].last_whole);
        }
        free_nodes(nodes, N);
}

Test(averager, moshpit_last_rounds_leave_one_model, .timeout = 60) { moshpit_swarm(0, 0, N_NONE, 20, 1000); }
/* also with a cadence longer than the join timeout */
Test(averager, moshpit_a_member_starting_late_is_taken_in, .timeout = 60) {
        moshpit_swarm(1u << 3, 0, N_NONE, 20, 1000);
        moshpit_swarm(1u << 3, 0, N_NONE, 500, 200);
}
/* 1 and 2 start late at dimension 0 while 0 and 3 are at dimension 1:
 * each first waits for a member that is in another group */
Test(averager, moshpit_members_out_of_step_find_each_other, .timeout = 90) {
        moshpit_swarm(1u << 1 | 1u << 2, 1u << 0 | 1u << 3, N_NONE, 20, 1000);
}
/* a member that restarts counts its rounds from 0 again */
Test(averager, moshpit_a_restarted_member_is_taken_in_again, .timeout = 60) { moshpit_swarm(0, 0, 1, 20, 1000); }

Test(averager, bad_config) {
        AveragerConfig c;
        Averager *a;
        averager_config_defaults(&c);
        cr_assert_eq(averager_new(&c, &a), -EINVAL, "no length");
        c.len = 10;
        cr_assert_eq(averager_new(&c, &a), -EINVAL, "ring method without rings");
        AveragerRing g = { .group = 1, .n = 1, .off = 5, .len = 6 };
        c.rings = &g;
        c.n_rings = 1;
        cr_assert_eq(averager_new(&c, &a), -EINVAL, "ring beyond the slab");
}

/* ---- the outer optimizer ------------------------------------------------ */

/* Three members with the same anchor and momentum, each some local steps
 * away from it (params = anchor - g_i), one round of outer Nesterov SGD,
 * an update made during the round: every member's anchor, momentum and
 * parameters against the step computed naively in double. */
Test(averager, outer_nesterov_matches_a_naive_step) {
        enum { N = 3, LEN = 5000 };
        const float lr = 0.7f, mu = 0.9f;
        Node nodes[N] = {};
        size_t lens[N];
        float *anchor = malloc(LEN * sizeof *anchor), *mom = malloc(LEN * sizeof *mom), *g[N];
        Rng rng;
        rng_seed(&rng, 42, RNG_STREAM_TEST);
        for (size_t k = 0; k < LEN; k++) {
                anchor[k] = 2 * rng_uniform(&rng) - 1;
                mom[k] = 0.1f * (2 * rng_uniform(&rng) - 1);
        }
        for (unsigned i = 0; i < N; i++) {
                g[i] = malloc(LEN * sizeof(float));
                nodes[i].w = malloc(LEN * sizeof(float));
                for (size_t k = 0; k < LEN; k++) {
                        g[i][k] = 0.05f * (2 * rng_uniform(&rng) - 1);
                        nodes[i].w[k] = anchor[k] - g[i][k];
                }
                nodes[i].len = lens[i] = LEN;
                nodes[i].deltas_wanted = 1;
                nodes[i].bump = 0.01f * (float)(i + 1);
                nodes[i].anchor0 = anchor;
                nodes[i].momentum0 = mom;
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        cfg.outer = (AveragerOuter){ .enabled = true, .lr = lr, .momentum = mu, .nesterov = true };
        AveragerRing ring = { .group = 1, .n = N, .members = { 0, 1, 2 }, .len = LEN };
        AveragerRing rings[N][4];
        unsigned n_rings[N];
        for (unsigned i = 0; i < N; i++) {
                rings[i][0] = ring;
                n_rings[i] = 1;
        }
        start_nodes(nodes, N, &cfg, rings, n_rings, lens);

        double worst = 0;
        for (unsigned i = 0; i < N; i++) {
                const float *a1, *m1;
                cr_assert_eq(nodes[i].deltas, 1, "member %u applied %u rounds", i, nodes[i].deltas);
                cr_assert_eq(averager_outer_state(nodes[i].av, &a1, &m1), 0);
                for (size_t k = 0; k < LEN; k++) {
                        double avg = ((double)g[0][k] + g[1][k] + g[2][k]) / N;
                        double m = mu * (double)mom[k] + avg;
                        double want = anchor[k] - lr * (avg + mu * m);
                        worst = fmax(worst, fabs(a1[k] - want));
                        cr_assert(fabs(m1[k] - m) < 1e-6, "member %u value %zu: momentum %g, want %g", i, k, m1[k], m);
                        cr_assert(fabs(a1[k] - want) < 1e-5, "member %u value %zu: anchor %g, want %g", i, k, a1[k],
                                  want);
                        cr_assert(fabs(nodes[i].w[k] - nodes[i].bump - want) < 1e-5,
                                  "member %u value %zu: params %g, want the anchor %g plus %g", i, k, nodes[i].w[k],
                                  want, nodes[i].bump);
                }
        }
        cr_log_info("outer Nesterov step: largest error of the anchor %.2e\n", worst);
        for (unsigned i = 0; i < N; i++) {
                free(nodes[i].w);
                free(g[i]);
                averager_free(nodes[i].av);
        }
        free(anchor);
        free(mom);
}

/* lr 1 and no momentum: the outer step is plain averaging, the parameters
 * end as the average plus the update made during the round, as without an
 * outer optimizer. */
Test(averager, outer_lr_1_is_plain_averaging) {
        enum { N = 2, LEN = 1 << 20 };
        Node nodes[N] = {};
        size_t lens[N] = { LEN, LEN };
        for (unsigned i = 0; i < N; i++) {
                fill(&nodes[i], LEN, 7 + i);
                nodes[i].deltas_wanted = 1;
                nodes[i].bump = 0.5f;
                /* the anchor: any value both share; the parameters are what counts */
                nodes[i].anchor0 = nodes[0].x0;
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        cfg.outer = (AveragerOuter){ .enabled = true, .lr = 1, .momentum = 0 };
        AveragerRing rings[N][4] = { { { .group = 1, .n = 2, .members = { 0, 1 }, .len = LEN } },
                                     { { .group = 1, .n = 2, .members = { 0, 1 }, .len = LEN } } };
        unsigned n_rings[N] = { 1, 1 };
        start_nodes(nodes, N, &cfg, rings, n_rings, lens);
        for (size_t k = 0; k < LEN; k++) {
                double avg = ((double)nodes[0].x0[k] + nodes[1].x0[k]) / 2;
                for (unsigned i = 0; i < N; i++)
                        cr_assert(fabs(nodes[i].w[k] - nodes[i].bump - avg) < 1e-5, "member %u value %zu: %g vs %g",
                                  i, k, nodes[i].w[k] - nodes[i].bump, avg);
        }
        for (unsigned i = 0; i < N; i++) {
                free(nodes[i].w);
                averager_free(nodes[i].av);
        }
        free(nodes[0].x0);
        free(nodes[1].x0);
}

Test(averager, outer_bad_config) {
        AveragerConfig c;
        Averager *a;
        AveragerRing g = { .group = 1, .n = 1, .len = 10 };
        averager_config_defaults(&c);
        c.len = 10;
        c.rings = &g;
        c.n_rings = 1;
        c.outer = (AveragerOuter){ .enabled = true, .lr = 0.7f, .momentum = 1.0f };
        cr_assert_eq(averager_new(&c, &a), -EINVAL, "momentum 1");
        c.outer = (AveragerOuter){ .enabled = true, .lr = NAN, .momentum = 0.9f };
        cr_assert_eq(averager_new(&c, &a), -EINVAL, "lr NaN");
        c.outer.lr = 0.7f;
        c.fragments = AVERAGER_MAX_FRAGMENTS + 1;
        cr_assert_eq(averager_new(&c, &a), -EINVAL, "too many fragments");
}

/* The anchor and momentum through a checkpoint: bit for bit, refused when
 * damaged, and a round from the loaded state takes the same outer step as
 * from the state that was saved (the naive step of the test above). */
Test(averager, outer_state_survives_a_checkpoint) {
        enum { LEN = 4000 };
        char dir[] = "/tmp/ravnest-test-outer-XXXXXX", path[128];
        cr_assert(mkdtemp(dir));
        Layer layers[4] = {}; /* what the checkpoint's digest of the stage's layers reads */
        Stage st = { .first_layer = 2, .n_layers = 3, .n_params = LEN, .layers = layers };
        float *a = malloc(LEN * sizeof *a), *m = malloc(LEN * sizeof *m);
        float *a2 = malloc(LEN * sizeof *a2), *m2 = malloc(LEN * sizeof *m2);
        Rng rng;
        rng_seed(&rng, 5, RNG_STREAM_TEST);
        for (size_t k = 0; k < LEN; k++) {
                a[k] = 2 * rng_uniform(&rng) - 1;
                m[k] = 0.01f * (2 * rng_uniform(&rng) - 1);
        }
        CheckpointInfo at = { .step = 1234, .epoch = 1 };
        cr_assert_eq(stage_checkpoint_save_outer(dir, "job", &st, a, m, 7, &at), 0);
        uint64_t rounds = 0;
        cr_assert_eq(stage_checkpoint_load_outer(dir, "job", &st, a2, m2, 1234, &rounds), 0);
        cr_assert_eq(rounds, 7, "outer rounds done: %llu", (unsigned long long)rounds);
        cr_assert_eq(memcmp(a, a2, LEN * sizeof *a), 0, "anchor");
        cr_assert_eq(memcmp(m, m2, LEN * sizeof *m), 0, "momentum");
        Stage other = { .first_layer = 2, .n_layers = 4, .n_params = LEN, .layers = layers };
        cr_assert_eq(stage_checkpoint_load_outer(dir, "job", &other, a2, m2, 1234, &rounds), -ENOENT, "another stage's");

        /* one flipped byte: refused, the buffers untouched */
        snprintf(path, sizeof path, "%s/job.layers-2-5.ckpt.outer", dir);
        FILE *f = fopen(path, "r+b");
        cr_assert(f);
        fseek(f, 1000, SEEK_SET);
        int c = fgetc(f);
        fseek(f, 1000, SEEK_SET);
        fputc(c ^ 0x40, f);
        fclose(f);
        memset(a2, 0, LEN * sizeof *a2);
        cr_assert_eq(stage_checkpoint_load_outer(dir, "job", &st, a2, m2, 1234, &rounds), -EBADMSG);
        for (size_t k = 0; k < LEN; k++)
                cr_assert_eq(a2[k], 0.0f, "a damaged file wrote value %zu", k);

        /* two members restored from the saved state: the step is the naive one */
        Node nodes[2] = {};
        size_t lens[2] = { LEN, LEN };
        for (unsigned i = 0; i < 2; i++) {
                nodes[i].w = malloc(LEN * sizeof(float));
                for (size_t k = 0; k < LEN; k++)
                        nodes[i].w[k] = a[k] - 0.01f * (float)(i + 1);
                nodes[i].len = LEN;
                nodes[i].deltas_wanted = 1;
                nodes[i].anchor0 = a;
                nodes[i].momentum0 = m;
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 100;
        cfg.outer = (AveragerOuter){ .enabled = true, .lr = 0.7f, .momentum = 0.9f, .nesterov = true };
        AveragerRing rings[2][4] = { { { .group = 1, .n = 2, .members = { 0, 1 }, .len = LEN } },
                                     { { .group = 1, .n = 2, .members = { 0, 1 }, .len = LEN } } };
        unsigned n_rings[2] = { 1, 1 };
        start_nodes(nodes, 2, &cfg, rings, n_rings, lens);
        for (unsigned i = 0; i < 2; i++) {
                const float *a1, *m1;
                cr_assert_eq(averager_outer_state(nodes[i].av, &a1, &m1), 0);
                for (size_t k = 0; k < LEN; k++) {
                        double g = 0.015, mm = 0.9 * (double)m[k] + g, want = a[k] - 0.7 * (g + 0.9 * mm);
                        cr_assert(fabs(a1[k] - want) < 1e-5, "member %u value %zu: %g vs %g", i, k, a1[k], want);
                }
                free(nodes[i].w);
                averager_free(nodes[i].av);
        }
        free(a);
        free(m);
        free(a2);
        free(m2);
        test_remove_tree(dir);
}

/* A member gone mid-round (its averager freed, its links closed, at
 * varied moments): every value of the others' anchors is either the outer
 * step over the members that took part or what it was, never anything
 * else, and their parameters follow their anchor. */
Test(averager, outer_round_cut_short_leaves_values_stepped_or_unchanged, .timeout = 120) {
        enum { N = 3, LEN = 1 << 21 };
        const float lr = 0.7f, mu = 0.9f;
        float *anchor = malloc(LEN * sizeof *anchor), *g[N];
        Rng rng;
        rng_seed(&rng, 9, RNG_STREAM_TEST);
        for (size_t k = 0; k < LEN; k++)
                anchor[k] = 2 * rng_uniform(&rng) - 1;
        for (unsigned i = 0; i < N; i++) {
                g[i] = malloc(LEN * sizeof(float));
                for (size_t k = 0; k < LEN; k++)
                        g[i][k] = 0.05f * (2 * rng_uniform(&rng) - 1);
        }
        static const int delays_us[] = { 1, 2000, 8000, 20000 };
        for (size_t t = 0; t < sizeof delays_us / sizeof delays_us[0]; t++) {
                Node nodes[N] = {};
                size_t lens[N] = { LEN, LEN, LEN };
                for (unsigned i = 0; i < N; i++) {
                        nodes[i].w = malloc(LEN * sizeof(float));
                        for (size_t k = 0; k < LEN; k++)
                                nodes[i].w[k] = anchor[k] - g[i][k];
                        nodes[i].len = LEN;
                        nodes[i].deltas_wanted = 1;
                        nodes[i].bump = 0.25f;
                        nodes[i].anchor0 = anchor;
                }
                nodes[2].die_after_snapshot_us = delays_us[t];
                AveragerConfig cfg;
                averager_config_defaults(&cfg);
                cfg.interval_ms = 100;
                cfg.coll.join_timeout_ms = 1000;
                cfg.coll.round_timeout_ms = 3000;
                cfg.outer = (AveragerOuter){ .enabled = true, .lr = lr, .momentum = mu, .nesterov = true };
                AveragerRing rings[N][4];
                unsigned n_rings[N];
                for (unsigned i = 0; i < N; i++) {
                        rings[i][0] = (AveragerRing){ .group = 1, .n = N, .members = { 0, 1, 2 }, .len = LEN };
                        n_rings[i] = 1;
                }
                start_nodes(nodes, N, &cfg, rings, n_rings, lens);
                size_t stepped = 0, unchanged = 0;
                for (unsigned i = 0; i < 2; i++) {
                        const float *a1, *m1;
                        cr_assert_eq(averager_outer_state(nodes[i].av, &a1, &m1), 0);
                        for (size_t k = 0; k < LEN; k++) {
                                /* the parameters at the round's snapshot: a round that could not
                                 * start took one again, after a bump */
                                double s[N];
                                for (unsigned j = 0; j < N; j++)
                                        s[j] = (double)anchor[k] - g[j][k] +
                                               (j < 2 ? nodes[j].bump * (nodes[j].snapshots - 1.0) : 0);
                                /* the participants: any of the groups this member could be in */
                                static const unsigned groups[][3] = { { 0, 1, 2 }, { 0, 1 }, { 0, 2 }, { 1, 2 }, { 0 }, { 1 } };
                                static const unsigned sizes[] = { 3, 2, 2, 2, 1, 1 };
                                double got = a1[k], w = (double)nodes[i].w[k] - nodes[i].bump;
                                if (fabs(w - s[i]) < 1e-6 && got == anchor[k]) {
                                        unchanged++;
                                        continue;
                                }
                                bool match = false;
                                for (size_t q = 0; q < ELEMENTSOF(groups) && !match; q++) {
                                        double avg = 0;
                                        bool in = false;
                                        for (unsigned j = 0; j < sizes[q]; j++) {
                                                avg += s[groups[q][j]] / sizes[q];
                                                in |= groups[q][j] == i;
                                        }
                                        double gq = anchor[k] - avg, want = anchor[k] - lr * (gq + mu * gq);
                                        match = in && fabs(got - want) < 1e-5;
                                }
                                cr_assert(match, "member %u value %zu: anchor %g, not the step of any group it was in, "
                                          "nor unchanged %g", i, k, got, anchor[k]);
                                cr_assert(fabs(w - got) < 1e-5, "member %u value %zu: params %g, anchor %g", i, k, w,
                                          got);
                                stepped++;
                        }
                }
                cr_log_info("member gone %d us after its snapshot: %zu values stepped, %zu unchanged (%u, %u "
                            "snapshots)\n", delays_us[t], stepped, unchanged, nodes[0].snapshots, nodes[1].snapshots);
                for (unsigned i = 0; i < N; i++) {
                        free(nodes[i].w);
                        averager_free(nodes[i].av);
                }
        }
        for (unsigned i = 0; i < N; i++)
                free(g[i]);
        free(anchor);
}

/* Fragments: each round averages one part of the ring's values, in turn,
 * under a group id of its own: after one round only the first quarter is
 * the average, after four every value is. */
static void fragments_after(unsigned rounds) {
        enum { N = 2, LEN = 10000, F = 4 };
        Node nodes[N] = {};
        size_t lens[N] = { LEN, LEN };
        for (unsigned i = 0; i < N; i++) {
                fill(&nodes[i], LEN, 20 + i);
                nodes[i].deltas_wanted = rounds;
        }
        AveragerConfig cfg;
        averager_config_defaults(&cfg);
        cfg.interval_ms = 50;
        cfg.fragments = F;
        AveragerRing rings[N][4] = { { { .group = 1, .n = 2, .members = { 0, 1 }, .len = LEN } },
                                     { { .group = 1, .n = 2, .members = { 0, 1 }, .len = LEN } } };
        unsigned n_rings[N] = { 1, 1 };
        start_nodes(nodes, N, &cfg, rings, n_rings, lens);
        for (unsigned i = 0; i < N; i++) {
                AveragerStats st;
                averager_get_stats(nodes[i].av, &st);
                cr_assert_eq(st.rounds_done, rounds, "member %u: %lu rounds done", i, (unsigned long)st.rounds_done);
                cr_assert_eq(st.values_averaged, (uint64_t)rounds * LEN / F);
                for (size_t k = 0; k < LEN; k++) {
                        float avg = (nodes[0].x0[k] + nodes[1].x0[k]) / 2;
                        bool synced = k < (size_t)rounds * LEN / F;
                        float want = synced ? avg : nodes[i].x0[k];
                        cr_assert(fabsf(nodes[i].w[k] - want) < 1e-6f, "member %u value %zu after %u rounds: %g, want %g",
                                  i, k, rounds, nodes[i].w[k], want);
                }
        }
        for (unsigned i = 0; i < N; i++) {
                free(nodes[i].w);
                free(nodes[i].x0);
                averager_free(nodes[i].av);
        }
}

Test(averager, fragments_one_part_per_round) {
        fragments_after(1);
        fragments_after(4);
}
