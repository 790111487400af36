/* collective/runtime-model.c — see runtime-model.h. */
#include "runtime-model.h"

#include <errno.h>
#include <math.h>

#include "coll.h"
#include "topology.h"
#include "util/macro.h"

static const char *const method_names[_RUNTIME_METHOD_MAX] = {
        [RUNTIME_ALLREDUCE] = "allreduce",
        [RUNTIME_RING] = "ring",
        [RUNTIME_EXP] = "exp",
        [RUNTIME_ALT_EXP_RING] = "alt-exp-ring",
};

const char *runtime_model_method_name(RuntimeMethod m) {
        return m >= 0 && m < _RUNTIME_METHOD_MAX ? method_names[m] : NULL;
}

void runtime_model_defaults(RuntimeModelInput *in) {
        *in = (RuntimeModelInput){ .nodes = 2, .encrypted = true, .latency_ms = 0.1 };
}

double runtime_expected_max_normal(unsigned k) {
        /* exact values for small k (order statistics of the normal) */
        static const double e[] = { 0, 0, 0.5642, 0.8463, 1.0294, 1.1630, 1.2672, 1.3522, 1.4236,
                                    1.4850, 1.5388, 1.5864, 1.6292, 1.6680, 1.7034, 1.7359, 1.7660 };
        if (k < sizeof e / sizeof e[0])
                return e[k];
        /* Blom's approximation of the largest of k: Phi^-1((k - 0.375) / (k + 0.25)),
         * with Phi^-1 by the asymptotic expansion; within 1% above 16 */
        double p = 1.0 - (k - 0.375) / (k + 0.25), t = sqrt(-2.0 * log(p));
        return t - (2.515517 + 0.802853 * t + 0.010328 * t * t) /
                           (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
}

/* Below 2 cores per node the exchange has no core of its own: its CPU
 * work takes the node's cores, of which it has `cores` (under 1: shared
 * with other nodes, so everything runs 1/cores slower than alone). */
static bool cpu_shared(const RuntimeModelInput *in) {
        return in->cores > 0 && in->cores < 2;
}

static double cpu_slowdown(const RuntimeModelInput *in) {
        return cpu_shared(in) ? fmax(1.0, 1.0 / in->cores) : 1.0;
}

/* A ring all-reduce of S bytes among k members, in ms: its time on the
 * wire and its CPU work (sealing, opening, copying, adding: every byte
 * this node sends and receives) overlap piece by piece, so the slower of
 * the two counts. ret_cpu gets the CPU part alone. */
static double allreduce_ms(const RuntimeModelInput *in, unsigned k, double S, double *ret_cpu) {
        *ret_cpu = 0;
        if (k <= 1)
                return 0;
        double bytes_per_ms = in->bandwidth_mbit * 1e6 / 8 / 1e3;
        double cpu_per_ms = (in->cpu_gbyte_s > 0 ? in->cpu_gbyte_s : in->encrypted ? 1.5 : 4.0) * 1e9 / 1e3;
        double overhead = in->wire_overhead > 0 ? in->wire_overhead : 1.05;
        double piece = (double)(in->piece_bytes ? in->piece_bytes : COLL_PIECE_BYTES);
        double share = 2.0 * (k - 1) / k * S;
        piece = fmin(piece, S / k);
        double wire = (share + (k - 1) * piece) * overhead / bytes_per_ms;
        double lat = 2.0 * in->latency_ms /* READY and START */ + 2.0 * (k - 1) * in->latency_ms;
        double cpu = 2.0 * share / cpu_per_ms * cpu_slowdown(in);
        *ret_cpu = cpu;
        return lat + fmax(wire, cpu);
}

int runtime_model_predict(const RuntimeModelInput *in, RuntimeModelResult *ret) {
        if (in->nodes == 0 || in->params == 0 || !(in->bandwidth_mbit > 0) || !(in->compute_ms > 0) ||
            in->compute_sd_ms < 0 || in->latency_ms < 0)
                return -EINVAL;
        double S = (double)coll_payload_size(coll_payload_dtype(in->payload), in->params);
        double mem_per_ms = (in->memory_gbyte_s > 0 ? in->memory_gbyte_s : 5.0) * 1e9 / 1e3;
        /* AdamW reads w, g, m, v and writes w, m, v: 7 passes of 4 bytes */
        double update = in->update_ms > 0 ? in->update_ms : 7.0 * 4 * in->params / mem_per_ms;
        /* gossip's own passes: the copy it sends, the delta, adding it: about 5 */
        double mix = 5.0 * 4 * in->params / mem_per_ms * cpu_slowdown(in);
        bool shared = cpu_shared(in);
        double cpu;
        unsigned n = in->nodes;
        RuntimeModelResult r = {};

        RuntimeMethodPrediction *ar = &r.method[RUNTIME_ALLREDUCE];
        ar->compute_ms = in->compute_ms + in->compute_sd_ms * runtime_expected_max_normal(n);
        ar->comm_ms = allreduce_ms(in, n, S, &cpu);
        ar->exposed_ms = ar->comm_ms;
        ar->iter_ms = ar->compute_ms + ar->comm_ms + update;
        ar->spectral_gap = 1;

        static const GossipTopology topo[] = { [RUNTIME_RING] = GOSSIP_RING, [RUNTIME_EXP] = GOSSIP_EXP,
                                               [RUNTIME_ALT_EXP_RING] = GOSSIP_ALT_EXP_RING };
        unsigned g = MIN(n, 2u);
        for (int m = RUNTIME_RING; m < _RUNTIME_METHOD_MAX; m++) {
                RuntimeMethodPrediction *p = &r.method[m];
                p->compute_ms = in->compute_ms + in->compute_sd_ms * runtime_expected_max_normal(g);
                p->comm_ms = allreduce_ms(in, g, S, &cpu);
                /* without a spare core the exchange's CPU work does not
                 * overlap the step: it takes the compute's cores */
                if (shared)
                        p->compute_ms += cpu;
                double busy = fmax(p->compute_ms, p->comm_ms);
                p->exposed_ms = busy - p->compute_ms;
                p->iter_ms = busy + mix + update;
                double rho;
                if (n <= 256 && gossip_contraction(topo[m], n, 0, &rho, NULL) >= 0)
                        p->spectral_gap = 1.0 - pow(rho, 1.0 / gossip_period(topo[m], n));
                else
                        p->spectral_gap = NAN;
        }

        /* The fastest; all-reduce on a tie (within 5%: it is exact), and
         * among gossip topologies as fast as the fastest, the best mixer. */
        RuntimeMethod best = RUNTIME_ALLREDUCE;
        double best_gossip = INFINITY;
        for (int m = RUNTIME_RING; m < _RUNTIME_METHOD_MAX; m++)
                best_gossip = fmin(best_gossip, r.method[m].iter_ms);
        if (n > 1 && best_gossip * 1.05 < ar->iter_ms) {
                double gap = -1;
                /* from the last: alt-exp-ring, the paper's choice, wins ties */
                for (int m = _RUNTIME_METHOD_MAX - 1; m >= RUNTIME_RING; m--) {
                        double gm = isnan(r.method[m].spectral_gap) ? 0 : r.method[m].spectral_gap;
                        if (r.method[m].iter_ms <= best_gossip * 1.02 && gm > gap) {
                                gap = gm;
                                best = (RuntimeMethod)m;
                        }
                }
        }
        r.recommended = best;
        r.speedup = ar->iter_ms / r.method[best].iter_ms;
        *ret = r;
        return 0;
}
