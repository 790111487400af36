/* cluster/plan: the signed plan and the membership messages on the wire —
 * a round trip, a forged or re-signed plan refused, and every truncated,
 * oversized or hostile input refused before it is read. */
#include <criterion/criterion.h>
#include <math.h>
#include <sodium.h>
#include <string.h>

#include "cluster/plan.h"

static uint8_t pk[PLAN_KEY_SIZE], sk[PLAN_SK_SIZE];

static void keys(void) {
        cr_assert_geq(sodium_init(), 0);
        crypto_sign_keypair(pk, sk);
}

TestSuite(plan, .init = keys);

/* Six nodes: clusters (2, 0) and (4, 1, 3) of a 6-layer model; node 5 a spare. */
static Plan *sample(void) {
        Plan *p = plan_new();
        cr_assert_not_null(p);
        p->epoch = 7;
        memcpy(p->signer, pk, PLAN_KEY_SIZE);
        p->samples = 123456;
        p->n_layers = 6;
        p->micro_batch = 32;
        p->staleness = 4;
        p->update_frequency = 4;
        p->synchronous = true;
        p->n_nodes = 6;
        for (unsigned i = 0; i < 6; i++) {
                memset(p->nodes[i].key, 0x10 + (int)i, PLAN_KEY_SIZE);
                snprintf(p->nodes[i].host, sizeof p->nodes[i].host, i == 3 ? "::1" : "127.0.0.%u", i + 1);
                p->nodes[i].pipeline_port = (uint16_t)(7000 + i);
                p->nodes[i].averaging_port = (uint16_t)(8000 + i);
        }
        p->n_clusters = 2;
        p->clusters[0] = (PlanCluster){ .n_stages = 2, .nodes = { 2, 0 }, .bounds = { 0, 3, 6 } };
        p->clusters[1] = (PlanCluster){ .n_stages = 3, .nodes = { 4, 1, 3 }, .bounds = { 0, 2, 4, 6 } };
        return p;
}

static int encode(const Plan *p, uint8_t *buf) {
        return plan_encode(p, sk, buf, PLAN_MAX_BYTES);
}

Test(plan, round_trip) {
        _cleanup_(plan_freep) Plan *p = sample(), *q = plan_new();
        static uint8_t buf[PLAN_MAX_BYTES], again[PLAN_MAX_BYTES];
        int n = encode(p, buf);
        cr_assert_gt(n, 0);
        cr_assert_eq(plan_decode(buf, (size_t)n, pk, q), 0);
        cr_assert_eq(q->epoch, 7);
        cr_assert_eq(q->samples, 123456);
        cr_assert(q->synchronous);
        cr_assert_eq(q->n_nodes, 6);
        cr_assert_eq(q->n_clusters, 2);
        cr_assert_str_eq(q->nodes[3].host, "::1");
        cr_assert_eq(q->nodes[5].averaging_port, 8005);
        cr_assert_eq(q->clusters[1].nodes[2], 3);
        cr_assert_eq(q->clusters[1].bounds[2], 4);
        /* the same plan again: the same bytes (Ed25519 is deterministic) */
        cr_assert_eq(encode(q, again), n);
        cr_assert_eq(memcmp(buf, again, (size_t)n), 0);

        unsigned cluster, stage;
        int index;
        cr_assert_eq(plan_find(q, p->nodes[1].key, &index, &cluster, &stage), 0);
        cr_assert_eq(index, 1);
        cr_assert_eq(cluster, 1);
        cr_assert_eq(stage, 1);
        cr_assert_eq(plan_find(q, p->nodes[5].key, &index, NULL, NULL), -ENOENT); /* a spare */
        cr_assert_eq(index, 5);
        uint8_t stranger[PLAN_KEY_SIZE] = { 1 };
        cr_assert_eq(plan_find(q, stranger, &index, NULL, NULL), -ENOENT);
        cr_assert_eq(index, -1);

        /* a node behind NAT: no ports, on the wire and back */
        p->nodes[2].pipeline_port = p->nodes[2].averaging_port = 0;
        n = encode(p, buf);
        cr_assert_gt(n, 0);
        cr_assert_eq(plan_decode(buf, (size_t)n, pk, q), 0);
        cr_assert(q->nodes[2].pipeline_port == 0 && q->nodes[2].averaging_port == 0);
}


/* PLAN_MAX_NODES nodes with the longest IPv4 addresses fit one PLAN frame,
 * in 1024 one-stage clusters or 256 of four stages; longer host names do
 * not, and plan_encode says so. */
static void wide_plan(unsigned stages, const char *host_format, int want) {
        _cleanup_(plan_freep) Plan *p = plan_new(), *q = plan_new();
        static uint8_t buf[PLAN_MAX_BYTES];
        cr_assert(p && q);
        p->epoch = 2;
        memcpy(p->signer, pk, PLAN_KEY_SIZE);
        p->n_layers = 4;
        p->micro_batch = p->staleness = p->update_frequency = 1;
        p->n_nodes = PLAN_MAX_NODES;
        for (unsigned i = 0; i < PLAN_MAX_NODES; i++) {
                memset(p->nodes[i].key, 0, PLAN_KEY_SIZE);
                memcpy(p->nodes[i].key, &i, sizeof i);
                snprintf(p->nodes[i].host, sizeof p->nodes[i].host, host_format, 100 + i / 256, 100 + i % 256 % 156);
                p->nodes[i].pipeline_port = p->nodes[i].averaging_port = (uint16_t)(10000 + i);
        }
        p->n_clusters = PLAN_MAX_NODES / stages;
        for (unsigned k = 0; k < p->n_clusters; k++) {
                PlanCluster *c = &p->clusters[k];
                c->n_stages = stages;
                for (unsigned st = 0; st <= stages; st++)
                        c->bounds[st] = (int)(st * 4 / stages);
                for (unsigned st = 0; st < stages; st++)
                        c->nodes[st] = (uint16_t)(k * stages + st);
        }
        int n = encode(p, buf);
        if (want < 0) {
                cr_assert_eq(n, want);
                return;
        }
        cr_assert_gt(n, 0, "%u-stage clusters: %s", stages, strerror(-n));
        cr_assert_eq(plan_decode(buf, (size_t)n, pk, q), 0);
        cr_assert_eq(q->n_nodes, PLAN_MAX_NODES);
        cr_assert_eq(q->n_clusters, PLAN_MAX_NODES / stages);
        unsigned cluster, stage;
        int index;
        cr_assert_eq(plan_find(q, p->nodes[1023].key, &index, &cluster, &stage), 0);
        cr_assert(index == 1023 && cluster == 1023 / stages && stage == 1023 % stages);
}

Test(plan, a_thousand_nodes) {
        wide_plan(1, "100.100.%u.%u", 0);
        wide_plan(4, "100.100.%u.%u", 0);
        wide_plan(1, "node-%u-%u.swarm.example.org", -EMSGSIZE);
}

Test(plan, forgery_refused) {
        _cleanup_(plan_freep) Plan *p = sample(), *q = plan_new();
        static uint8_t buf[PLAN_MAX_BYTES], copy[PLAN_MAX_BYTES];
        int n = encode(p, buf);
        cr_assert_gt(n, 0);

        /* any flipped bit: the signature no longer verifies */
        for (int i = 0; i < n; i++) {
                memcpy(copy, buf, (size_t)n);
                copy[i] ^= 0x01;
                cr_assert_lt(plan_decode(copy, (size_t)n, pk, q), 0, "byte %d flipped, still taken", i);
        }
        /* a plan signed by another key, or claiming the coordinator's */
        uint8_t pk2[PLAN_KEY_SIZE], sk2[PLAN_SK_SIZE];
        crypto_sign_keypair(pk2, sk2);
        memcpy(p->signer, pk2, PLAN_KEY_SIZE);
        n = plan_encode(p, sk2, buf, sizeof buf);
        cr_assert_gt(n, 0);
        cr_assert_eq(plan_decode(buf, (size_t)n, pk, q), -EPERM);
        cr_assert_eq(plan_decode(buf, (size_t)n, pk2, q), 0); /* its own key takes it */
        memcpy(p->signer, pk, PLAN_KEY_SIZE);
        n = plan_encode(p, sk2, buf, sizeof buf); /* says pk, signed by sk2 */
        cr_assert_eq(plan_decode(buf, (size_t)n, pk, q), -EPERM);
        cr_assert_eq(q->epoch, 7); /* untouched by the failures since */
}

Test(plan, truncated_and_oversized_refused) {
        _cleanup_(plan_freep) Plan *p = sample(), *q = plan_new();
        static uint8_t buf[PLAN_MAX_BYTES + 16];
        int n = encode(p, buf);
        for (int len = 0; len < n; len++)
                cr_assert_lt(plan_decode(buf, (size_t)len, pk, q), 0, "%d of %d bytes taken", len, n);
        cr_assert_lt(plan_decode(buf, (size_t)n + 1, pk, q), 0);
        cr_assert_eq(plan_decode(buf, PLAN_MAX_BYTES + 1, pk, q), -EMSGSIZE);
        /* a buffer too small to encode into */
        cr_assert_eq(plan_encode(p, sk, buf, (size_t)n - 1), -EMSGSIZE);
}

/* Signed by the right key but breaking a rule: a coordinator's bug (or a
 * stolen key) must not reach past the plan's bounds either. */
static void expect_refused(void (*spoil)(Plan *), const char *what) {
        _cleanup_(plan_freep) Plan *p = sample();
        spoil(p);
        static uint8_t buf[PLAN_MAX_BYTES];
        cr_expect_lt(plan_check(p), 0, "%s passed plan_check", what);
        cr_expect_eq(plan_encode(p, sk, buf, sizeof buf), -EINVAL, "%s encoded", what);
}

static void node_out_of_range(Plan *p) { p->clusters[1].nodes[0] = 6; }
static void node_twice(Plan *p) { p->clusters[1].nodes[0] = 2; }
static void bounds_not_increasing(Plan *p) { p->clusters[0].bounds[1] = 0; }
static void bounds_short(Plan *p) { p->clusters[0].bounds[2] = 5; }
static void bounds_not_from_zero(Plan *p) { p->clusters[0].bounds[0] = 1; }
static void stages_over_layers(Plan *p) { p->n_layers = 2; }
static void no_stages(Plan *p) { p->clusters[0].n_stages = 0; }
static void too_many_stages(Plan *p) { p->clusters[0].n_stages = PLAN_MAX_STAGES + 1; }
static void too_many_nodes(Plan *p) { p->n_nodes = PLAN_MAX_NODES + 1; }
static void too_many_clusters(Plan *p) { p->n_clusters = PLAN_MAX_CLUSTERS + 1; }
static void epoch_zero(Plan *p) { p->epoch = 0; }
static void same_key_twice(Plan *p) { memcpy(p->nodes[4].key, p->nodes[0].key, PLAN_KEY_SIZE); }
static void bad_host(Plan *p) { snprintf(p->nodes[1].host, sizeof p->nodes[1].host, "a b"); }
static void empty_host(Plan *p) { p->nodes[1].host[0] = '\0'; }
static void dash_host(Plan *p) { snprintf(p->nodes[1].host, sizeof p->nodes[1].host, "-rf"); }
static void port_zero(Plan *p) { p->nodes[0].pipeline_port = 0; }
static void no_micro_batch(Plan *p) { p->micro_batch = 0; }
static void staleness_over(Plan *p) { p->staleness = 1025; }
static void epoch_over(Plan *p) { p->epoch = PLAN_EPOCH_MAX + 1; }

Test(plan, hostile_plans_refused) {
        expect_refused(node_out_of_range, "a node index past the table");
        expect_refused(node_twice, "a node in two stages");
        expect_refused(bounds_not_increasing, "an empty stage");
        expect_refused(bounds_short, "a cut short of the model");
        expect_refused(bounds_not_from_zero, "a cut from layer 1");
        expect_refused(stages_over_layers, "more stages than layers");
        expect_refused(no_stages, "a cluster without stages");
        expect_refused(too_many_stages, "65 stages");
        expect_refused(too_many_nodes, "1025 nodes");
        expect_refused(too_many_clusters, "1025 clusters");
        expect_refused(epoch_zero, "epoch 0");
        expect_refused(epoch_over, "epoch 2^48 + 1");
        expect_refused(same_key_twice, "one key twice");
        expect_refused(bad_host, "a host with a space");
        expect_refused(empty_host, "an empty host");
        expect_refused(dash_host, "a host like an option");
        expect_refused(port_zero, "one port 0 (both 0: a node behind NAT)");
        expect_refused(no_micro_batch, "micro-batch 0");
        expect_refused(staleness_over, "staleness 1025");
}

/* The same rules on the wire: bytes a signer wrote by hand. */
Test(plan, hostile_bytes_refused_after_signature) {
        _cleanup_(plan_freep) Plan *p = sample(), *q = plan_new();
        static uint8_t buf[PLAN_MAX_BYTES];
        int n = encode(p, buf);
        size_t body = (size_t)n - PLAN_SIG_SIZE;
        struct { size_t at; uint8_t v; int want; } cases[] = {
                { 4, 2, -EBADMSG },                  /* version */
                { 5, 0x80, -EBADMSG },               /* unknown flag */
                { 6, 0, -EBADMSG },                  /* no nodes */
                { 7, 4, -EMSGSIZE },                 /* 1030 nodes: PLAN_MAX_NODES + 6 */
                { 7, 0xff, -EMSGSIZE },              /* 65285 nodes */
                { 59, 4, -EMSGSIZE },                /* 1026 clusters: PLAN_MAX_CLUSTERS + 2 */
                { 58, 3, -EBADMSG },                 /* a cluster more than the bytes hold */
                { 68, 1, -EBADMSG },                 /* reserved */
                { PLAN_HEADER_SIZE + 36, 200, -EBADMSG }, /* a host longer than the plan */
        };
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
                static uint8_t copy[PLAN_MAX_BYTES];
                memcpy(copy, buf, body);
                copy[cases[i].at] = cases[i].v;
                crypto_sign_detached(copy + body, NULL, copy, body, sk);
                cr_expect_eq(plan_decode(copy, (size_t)n, pk, q), cases[i].want, "case %zu: byte %zu = %u", i,
                             cases[i].at, cases[i].v);
        }
}

/* The plan's micro-batch is the one most members asked for; of those asked
 * as often, the smallest. */
Test(plan, micro_batch_of_the_members) {
        cr_assert_eq(plan_micro_batch(NULL, 0), 0);
        cr_assert_eq(plan_micro_batch((unsigned[]){ 8 }, 1), 8);
        cr_assert_eq(plan_micro_batch((unsigned[]){ 32, 8, 8 }, 3), 8);
        cr_assert_eq(plan_micro_batch((unsigned[]){ 16, 32, 32, 16, 4 }, 5), 16);
        cr_assert_eq(plan_micro_batch((unsigned[]){ 64, 32 }, 2), 32);
}

Test(plan, membership_messages) {
        PlanJoin j = { .gflops = 80.5, .bandwidth = 125e6, .latency = 5e-4, .memory = 1ull << 30, .epoch = 3,
                       .n_params = 1863690, .n_layers = 6, .micro_batch = 8, .host = "node-1.example",
                       .pipeline_port = 7000, .averaging_port = 7001 }, k;
        for (int i = 0; i < PLAN_MODEL_SIZE; i++)
                j.model[i] = (uint8_t)(7 * i + 1);
        uint8_t buf[PLAN_JOIN_MAX_SIZE + 8];
        int n = plan_join_encode(&j, buf, sizeof buf);
        cr_assert_eq(n, 96 + (int)strlen("node-1.example"));
        cr_assert_eq(plan_join_decode(buf, (size_t)n, &k), 0);
        cr_assert_eq(k.micro_batch, 8, "the member's micro-batch");
        cr_assert(memcmp(k.model, j.model, PLAN_MODEL_SIZE) == 0, "the model's digest");
        cr_assert_eq(k.gflops, 80.5);
        cr_assert_eq(k.memory, 1ull << 30);
        cr_assert_eq(k.epoch, 3);
        cr_assert_str_eq(k.host, "node-1.example");
        for (int len = 0; len < n; len++)
                cr_assert_lt(plan_join_decode(buf, (size_t)len, &k), 0);
        cr_assert_lt(plan_join_decode(buf, (size_t)n + 1, &k), 0);

        /* NaN, infinity, negative and zero figures */
        double bad[] = { 0.0 / 0.0, 1.0 / 0.0, -1, 0, 2e6 };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
                uint8_t copy[sizeof buf];
                memcpy(copy, buf, (size_t)n);
                uint64_t u;
                memcpy(&u, &bad[i], sizeof u);
                for (int b = 0; b < 8; b++)
                        copy[36 + b] = (uint8_t)(u >> (8 * b));
                cr_assert_eq(plan_join_decode(copy, (size_t)n, &k), -EBADMSG, "gflops %g taken", bad[i]);
        }
        buf[96] = ' '; /* the host */
        cr_assert_eq(plan_join_decode(buf, (size_t)n, &k), -EBADMSG);
        buf[96] = 'n';
        buf[4] = 1; /* a JOIN of version 1, without the digest */
        cr_assert_eq(plan_join_decode(buf, (size_t)n, &k), -EBADMSG);
        buf[4] = 2;
        unsigned bad_mb[] = { 0, 65537 };
        for (unsigned i = 0; i < 2; i++) {
                j.micro_batch = bad_mb[i];
                cr_assert_eq(plan_join_encode(&j, buf, sizeof buf), -EINVAL, "micro-batch %u", bad_mb[i]);
                buf[60] = (uint8_t)bad_mb[i], buf[61] = (uint8_t)(bad_mb[i] >> 8), buf[62] = (uint8_t)(bad_mb[i] >> 16);
                cr_assert_eq(plan_join_decode(buf, (size_t)n, &k), -EBADMSG, "micro-batch %u", bad_mb[i]);
        }
        j.micro_batch = 8;
        j.latency = -1;
        cr_assert_eq(plan_join_encode(&j, buf, sizeof buf), -EINVAL);

        /* an epoch a coordinator's counting up from could wrap */
        j.latency = 5e-4;
        j.epoch = PLAN_EPOCH_MAX; /* what a member holding the last plan a coordinator can sign says */
        n = plan_join_encode(&j, buf, sizeof buf);
        cr_assert_gt(n, 0);
        cr_assert_eq(plan_join_decode(buf, (size_t)n, &k), 0);
        for (int b = 0; b < 8; b++)
                buf[12 + b] = 0xff;
        cr_assert_eq(plan_join_decode(buf, (size_t)n, &k), -EBADMSG);
        j.epoch = PLAN_EPOCH_MAX + 1;
        cr_assert_eq(plan_join_encode(&j, buf, sizeof buf), -EINVAL);
        j.epoch = 3;

        /* a node behind NAT joins with both ports 0; one port 0 alone is an error */
        j.latency = 5e-4;
        j.pipeline_port = j.averaging_port = 0;
        n = plan_join_encode(&j, buf, sizeof buf);
        cr_assert_gt(n, 0);
        cr_assert_eq(plan_join_decode(buf, (size_t)n, &k), 0);
        cr_assert(k.pipeline_port == 0 && k.averaging_port == 0);
        j.averaging_port = 7001;
        cr_assert_eq(plan_join_encode(&j, buf, sizeof buf), -EINVAL);

        uint8_t stop[PLAN_STOP_SIZE], done[PLAN_DONE_SIZE];
        uint64_t epoch, samples;
        bool hand_in;
        plan_stop_encode(9, true, stop);
        cr_assert_eq(plan_stop_decode(stop, sizeof stop, &epoch, &hand_in), 0);
        cr_assert(epoch == 9 && hand_in);
        plan_stop_encode(9, false, stop);
        cr_assert_eq(plan_stop_decode(stop, sizeof stop, &epoch, &hand_in), 0);
        cr_assert(epoch == 9 && !hand_in);
        cr_assert_lt(plan_stop_decode(stop, sizeof stop - 1, &epoch, &hand_in), 0);
        stop[12] = 2; /* no flag but hand-in */
        cr_assert_lt(plan_stop_decode(stop, sizeof stop, &epoch, &hand_in), 0);
        plan_stop_encode(0, true, stop);
        cr_assert_lt(plan_stop_decode(stop, sizeof stop, &epoch, &hand_in), 0);
        plan_stop_encode(PLAN_EPOCH_MAX + 1, true, stop);
        cr_assert_lt(plan_stop_decode(stop, sizeof stop, &epoch, &hand_in), 0);
        plan_done_encode(UINT64_MAX, 0, done);
        cr_assert_lt(plan_done_decode(done, sizeof done, &epoch, &samples), 0);
        plan_done_encode(9, 4096, done);
        cr_assert_eq(plan_done_decode(done, sizeof done, &epoch, &samples), 0);
        cr_assert_eq(samples, 4096);
        cr_assert_lt(plan_done_decode(done, sizeof done + 1, &epoch, &samples), 0);
        cr_assert_lt(plan_done_decode(stop, sizeof stop, &epoch, &samples), 0);

        /* a dial-back's outcome: 0 or an errno, nothing else */
        uint8_t reach[PLAN_REACH_SIZE];
        int err;
        plan_reach_encode(ETIMEDOUT, reach);
        cr_assert_eq(plan_reach_decode(reach, sizeof reach, &err), 0);
        cr_assert_eq(err, ETIMEDOUT);
        plan_reach_encode(0, reach);
        cr_assert_eq(plan_reach_decode(reach, sizeof reach, &err), 0);
        cr_assert_eq(err, 0);
        cr_assert_lt(plan_reach_decode(reach, sizeof reach - 1, &err), 0);
        cr_assert_lt(plan_reach_decode(stop, sizeof stop, &err), 0);
        plan_reach_encode(4096, reach);
        cr_assert_lt(plan_reach_decode(reach, sizeof reach, &err), 0);
        plan_reach_encode(0, reach);
        reach[5] = 1;
        cr_assert_lt(plan_reach_decode(reach, sizeof reach, &err), 0);

        /* link figures: a round trip, then everything out of bounds refused */
        uint8_t link[PLAN_LINK_SIZE];
        double bw, lat;
        plan_link_encode(2.5e9, 3e-5, link);
        cr_assert_eq(plan_link_decode(link, sizeof link, &bw, &lat), 0);
        cr_assert(bw == 2.5e9 && lat == 3e-5);
        cr_assert_lt(plan_link_decode(link, sizeof link - 1, &bw, &lat), 0);
        cr_assert_lt(plan_link_decode(done, sizeof link, &bw, &lat), 0);
        const double bad_link[][2] = { { 0, 1e-3 }, { -1, 1e-3 }, { 2e13, 1e-3 }, { NAN, 1e-3 }, { INFINITY, 1e-3 },
                                  { 1e9, -1e-3 }, { 1e9, 61 }, { 1e9, NAN }, { 1e9, INFINITY } };
        for (size_t i = 0; i < sizeof bad_link / sizeof bad_link[0]; i++) {
                plan_link_encode(bad_link[i][0], bad_link[i][1], link);
                cr_assert_lt(plan_link_decode(link, sizeof link, &bw, &lat), 0, "bandwidth %g latency %g", bad_link[i][0],
                             bad_link[i][1]);
        }
}
