/* collective/runtime-model.h — how long one training iteration takes with
 * all-reduce averaging and with each gossip topology, from the compute time
 * per step (and its spread), the link bandwidth and latency, the number of
 * nodes and the model size; and which method to use (Wang, Zhang, Wu,
 * Johansson, ICLR 2025, Section 3: the runtime model).
 *
 * All-reduce (what ravnest's gradient all-reduce and PyTorch's DDP do after
 * the backward pass) is a barrier: every iteration waits for the slowest of
 * the n nodes, then for a ring all-reduce of the whole vector:
 *     T_ar = E[max of n compute times] + C(n) + T_update
 * Gossip overlaps the exchange of step t with the computation of step t+1
 * and waits only for its group (g members, 2 for every topology here):
 *     T_g = max(E[max of g compute times], C(g)) + T_mix + T_update
 * where C(k), a ring all-reduce among k members (coll.h), is
 *     C(k) = RTT (join) + 2(k-1) latency
 *            + max((2(k-1)/k S + (k-1) piece) * wire_overhead / bandwidth,
 *                  2 * 2(k-1)/k S / cpu_rate)   (sealing, copying, adding)
 * with S the bytes of the vector (wire and CPU work overlap piece by
 * piece). Overlap needs a core for the exchange: with fewer than 2 cores
 * per node (cores), its CPU work adds to the compute of gossip instead of
 * hiding behind it, and below 1 core (nodes sharing a machine) all CPU
 * work of the exchange and the mixing runs 1/cores slower. Compute times are taken as normal with
 * the given mean and standard deviation; E[max of k] uses the expected
 * maximum of k standard normals. All the gossip topologies cost the same
 * per iteration (one pair each); they differ in how fast they mix, so among
 * equally fast ones the recommendation takes the largest spectral gap.
 *
 *     RuntimeModelInput in;
 *     runtime_model_defaults(&in);
 *     in.compute_ms = 40;  in.bandwidth_mbit = 100;  in.latency_ms = 5;
 *     in.nodes = 8;  in.params = 1862410;
 *     RuntimeModelResult res;
 *     r = runtime_model_predict(&in, &res);
 *     printf("%s\n", runtime_model_method_name(res.recommended));
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "coll-wire.h"

typedef enum RuntimeMethod {
        RUNTIME_ALLREDUCE,
        RUNTIME_RING,
        RUNTIME_EXP,
        RUNTIME_ALT_EXP_RING,
        _RUNTIME_METHOD_MAX,
} RuntimeMethod;

typedef struct RuntimeModelInput {
        double compute_ms;      /* forward + backward per step, mean */
        double compute_sd_ms;   /* its standard deviation across steps and nodes */
        double update_ms;       /* the optimizer step; 0: estimated from params */
        double bandwidth_mbit;  /* each node's link, each direction */
        double latency_ms;      /* one way */
        unsigned nodes;
        size_t params;
        CollPayload payload;    /* how values travel: float32, binary16, 8-bit */
        bool encrypted;         /* the links seal every frame (ravnest's always do) */
        double cpu_gbyte_s;     /* per-byte work (seal, open, copy, add), GB/s; 0: 1.5 sealed, 4 plain */
        double memory_gbyte_s;  /* memory bandwidth for the mixing pass, GB/s; 0: 5 */
        double wire_overhead;   /* bytes on the wire per payload byte; 0: 1.05 (TCP/IP, framing) */
        size_t piece_bytes;     /* all-reduce piece; 0: coll's default */
        double cores;           /* cores per node; 0: enough for the exchange to run beside compute */
} RuntimeModelInput;

typedef struct RuntimeMethodPrediction {
        double iter_ms;       /* predicted time per iteration */
        double compute_ms;    /* what the iteration waits for in compute (slowest of the group) */
        double comm_ms;       /* the exchange alone */
        double exposed_ms;    /* communication not hidden behind compute */
        double spectral_gap;  /* per iteration, 1 - rho^(1/period); 1: exact average; NAN: too many nodes */
} RuntimeMethodPrediction;

typedef struct RuntimeModelResult {
        RuntimeMethodPrediction method[_RUNTIME_METHOD_MAX];
        RuntimeMethod recommended;
        double speedup; /* all-reduce time / recommended time */
} RuntimeModelResult;

void runtime_model_defaults(RuntimeModelInput *in);
const char *runtime_model_method_name(RuntimeMethod m);
/* Expected maximum of k independent standard normal variables. */
double runtime_expected_max_normal(unsigned k);
/* -EINVAL: no nodes, no parameters, bandwidth or compute time not positive. */
int runtime_model_predict(const RuntimeModelInput *in, RuntimeModelResult *ret);
