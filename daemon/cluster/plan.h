/* cluster/plan.h — the plan a coordinator hands every node: which nodes
 * form which cluster, in which stage order, where each cluster cuts the
 * model, and how to reach every node (pipeline and averaging addresses, and
 * the identity key the transport admits it by). Nodes in no cluster are
 * spares. A plan carries an epoch number that only grows, and the
 * coordinator's Ed25519 signature over all of it, so a node takes a plan
 * only from the coordinator it was configured with and never goes back to
 * an older one.
 *
 * A ring of the averaging holds one stage of every cluster; with more
 * clusters than one round of the averaging takes (COLL_MAX_MEMBERS), the
 * averager splits it into groups on a grid (collective/averager.h).
 *
 * Everything here is pure: no I/O, no logging. plan_decode() bounds every
 * count and length before it reads what they describe, and refuses a plan
 * whose signature does not verify; the exact layout is in
 * ravnest-protocol(7), MEMBERSHIP.
 *
 *     Plan *p = plan_new();
 *     p->epoch = 3;  p->n_layers = 6;  p->micro_batch = 32;  p->staleness = 4;  p->update_frequency = 4;
 *     p->n_nodes = 2;  // p->nodes[i]: key, host, pipeline_port, averaging_port
 *     p->n_clusters = 1;
 *     p->clusters[0] = (PlanCluster){ .n_stages = 2, .nodes = { 1, 0 }, .bounds = { 0, 2, 6 } };
 *     uint8_t buf[PLAN_MAX_BYTES];
 *     int n = plan_encode(p, &coordinator_identity_pk, coordinator_sk, buf, sizeof buf);
 *     ...
 *     r = plan_decode(buf, n, coordinator_pk, q);    // -EBADMSG, -EMSGSIZE, -EPERM (signature)
 *     r = plan_find(q, my_pk, &cluster, &stage);     // -ENOENT: a spare
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/macro.h"

#define PLAN_KEY_SIZE 32
#define PLAN_MODEL_SIZE 32 /* a model's digest in a JOIN */
#define PLAN_SIG_SIZE 64
#define PLAN_SK_SIZE 64
#define PLAN_MAX_NODES 1024  /* with IPv4 hosts a plan of 1024 nodes fits PLAN_MAX_BYTES */
#define PLAN_MAX_CLUSTERS 1024
#define PLAN_MAX_STAGES 64
#define PLAN_MAX_LAYERS 256  /* MODEL_MAX_LAYERS */
#define PLAN_HOST_MAX 254    /* a DNS name has at most 253 characters */
#define PLAN_MAX_BYTES 65536 /* the whole signed plan: fits one PLAN frame (FRAME_MAX_CONTROL) */
#define PLAN_HEADER_SIZE 72

typedef struct PlanNode {
        uint8_t key[PLAN_KEY_SIZE];
        char host[PLAN_HOST_MAX]; /* NUL-terminated */
        uint16_t pipeline_port, averaging_port; /* both 0: it accepts no connections (behind NAT) */
} PlanNode;

typedef struct PlanCluster {
        unsigned n_stages;
        uint16_t nodes[PLAN_MAX_STAGES];   /* indices into Plan.nodes, stage order */
        int bounds[PLAN_MAX_STAGES + 1];   /* stage s runs layers [bounds[s], bounds[s+1]) */
} PlanCluster;

/* Epochs are at most PLAN_EPOCH_MAX in every message, so that counting
 * up never wraps. A coordinator goes on above a JOIN's epoch (it may have
 * restarted) but never above half of it, so that a member's claim, which
 * nothing signs, leaves it 2^47 epochs (a new one a second for four
 * million years). */
#define PLAN_EPOCH_MAX (1ull << 48)

typedef struct Plan {
        uint64_t epoch;                    /* 1..PLAN_EPOCH_MAX; a node never goes back */
        uint8_t signer[PLAN_KEY_SIZE];     /* the coordinator's identity */
        uint64_t samples;                  /* samples trained before this epoch, all clusters */
        unsigned n_layers;
        unsigned micro_batch, staleness, update_frequency;
        bool synchronous;
        unsigned n_nodes, n_clusters;
        PlanNode nodes[PLAN_MAX_NODES];
        PlanCluster clusters[PLAN_MAX_CLUSTERS];
} Plan;

/* A zeroed plan on the heap (it is about 45 KiB); NULL without memory. */
Plan *plan_new(void);
Plan *plan_free(Plan *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(Plan *, plan_free);

/* Every rule plan_decode() applies, on a Plan in memory: -EINVAL or
 * -EMSGSIZE (a count above its limit). */
int plan_check(const Plan *p);
/* Sign p with the coordinator's secret key sk (libsodium's 64-byte Ed25519
 * form; p->signer must be its public key) into buf: the length, or -EINVAL
 * for a plan plan_check() refuses, -EMSGSIZE when buf is too small. */
int plan_encode(const Plan *p, const uint8_t sk[PLAN_SK_SIZE], uint8_t *buf, size_t size);
/* Check and read a signed plan. -EMSGSIZE: longer than PLAN_MAX_BYTES or a
 * count above its limit; -EBADMSG: malformed; -EPERM: not signed by signer.
 * *ret is untouched on failure. */
int plan_decode(const uint8_t *buf, size_t len, const uint8_t signer[PLAN_KEY_SIZE], Plan *ret);

/* This node's place: 0 with its cluster and stage, -ENOENT if it is a
 * spare or not in the plan at all (ret_index < 0 then). */
int plan_find(const Plan *p, const uint8_t key[PLAN_KEY_SIZE], int *ret_index, unsigned *ret_cluster,
              unsigned *ret_stage);
/* Whether a host name or address is one a plan may carry: 1 to
 * PLAN_HOST_MAX - 1 characters of letters, digits, '.', '-' and ':'. */
bool plan_host_valid(const char *host, size_t len);

/* What a node tells the coordinator when it connects (a CONTROL frame
 * "RVMJ"): its measured capabilities, where its stages listen, the model it
 * runs (layer and parameter counts and the digest of its layers: a
 * coordinator refuses a node of another model), the micro-batch its file asks for (the plan takes the one most
 * members ask for) and the newest plan epoch it holds (a restarted
 * coordinator goes on above it). */
typedef struct PlanJoin {
        double gflops, bandwidth, latency; /* GFLOP/s, bytes/s, seconds */
        uint64_t memory;                   /* bytes */
        uint64_t epoch;
        uint64_t n_params;
        unsigned n_layers;
        uint8_t model[PLAN_MODEL_SIZE];    /* the digest of the model's layers (averaging_model()) */
        unsigned micro_batch;              /* its pipeline.micro_batch, 1..65536 */
        char host[PLAN_HOST_MAX];
        uint16_t pipeline_port, averaging_port; /* both 0: it accepts no connections (behind NAT) */
} PlanJoin;

#define PLAN_JOIN_MAX_SIZE (96 + PLAN_HOST_MAX)
/* The length, or -EINVAL for values out of bounds. */
int plan_join_encode(const PlanJoin *j, uint8_t *buf, size_t size);
/* -EBADMSG for anything out of bounds or not a JOIN. */
int plan_join_decode(const uint8_t *buf, size_t len, PlanJoin *ret);
/* The micro-batch of a plan: the one most of n members asked for, the
 * smallest of those asked as often; 0 for no member. */
unsigned plan_micro_batch(const unsigned *asked, unsigned n);

/* The coordinator to every member: stop training at the next safe point and
 * hand in the layers it holds, for epoch `epoch` ("RVMS", 12 bytes). A
 * member answers once it has: "RVMD", epoch, and the samples its stage
 * trained as a first stage in the epoch that ended (20 bytes). */
/* A member's link figures, refreshed while it runs ("RVML", 20 bytes):
 * bandwidth in bytes/s, in (0, 1e13], and one-way latency in seconds, in
 * [0, 60] (IEEE 754 binary64), as its kernel measured them on the real
 * traffic of its link to the coordinator. The coordinator forms the next
 * plan with them. */
#define PLAN_LINK_SIZE 20
void plan_link_encode(double bandwidth, double latency, uint8_t buf[PLAN_LINK_SIZE]);
int plan_link_decode(const uint8_t *buf, size_t len, double *ret_bandwidth, double *ret_latency);

/* The coordinator to a member that gave ports in its JOIN, once it has
 * dialed back its pipeline port ("RVMR", 12 bytes): 0, or the positive
 * errno of why it could not (below 4096). A member it could not reach is
 * in its plans as one that accepts no connections: it dials every link. */
#define PLAN_REACH_SIZE 12
void plan_reach_encode(int error, uint8_t buf[PLAN_REACH_SIZE]);
int plan_reach_decode(const uint8_t *buf, size_t len, int *ret_error);

/* A layer handed over (to the coordinator and from it) is a tensor whose
 * stream is PLAN_STREAM(part, layer): part 0 its parameters, part k its
 * optimizer's k-th moment (SGD's momentum; AdamW's m, then v), k at most
 * PLAN_MAX_MOMENTS. */
#define PLAN_MAX_MOMENTS 2
#define PLAN_PARTS (1 + PLAN_MAX_MOMENTS)
#define PLAN_STREAM(part, layer) ((uint32_t)(part) * PLAN_MAX_LAYERS + (uint32_t)(layer))

/* STOP ("RVMS", 13 bytes): stop at a safe point for a new epoch, and hand
 * in the stage's layers when hand_in (the new plan gives them to a node
 * that did not hold them), else keep them (flags byte: bit 0, no other). */
#define PLAN_STOP_SIZE 13
#define PLAN_DONE_SIZE 20
void plan_stop_encode(uint64_t epoch, bool hand_in, uint8_t buf[PLAN_STOP_SIZE]);
int plan_stop_decode(const uint8_t *buf, size_t len, uint64_t *ret_epoch, bool *ret_hand_in);
void plan_done_encode(uint64_t epoch, uint64_t samples, uint8_t buf[PLAN_DONE_SIZE]);
int plan_done_decode(const uint8_t *buf, size_t len, uint64_t *ret_epoch, uint64_t *ret_samples);
