/* The runtime model: limits it must reach and the directions it must move. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>

#include "collective/runtime-model.h"

static RuntimeModelInput base(void) {
        RuntimeModelInput in;
        runtime_model_defaults(&in);
        in.compute_ms = 40;
        in.compute_sd_ms = 4;
        in.bandwidth_mbit = 1000;
        in.latency_ms = 1;
        in.nodes = 8;
        in.params = 1862410;
        return in;
}

Test(runtime_model, expected_max_of_normals) {
        cr_assert_eq(runtime_expected_max_normal(1), 0.0);
        cr_assert_float_eq(runtime_expected_max_normal(2), 1 / sqrt(M_PI), 1e-3);
        double prev = 0;
        for (unsigned k = 2; k < 5000; k += k < 40 ? 1 : 97) {
                double e = runtime_expected_max_normal(k);
                cr_assert(e > prev, "k=%u: %g after %g", k, e, prev);
                prev = e;
        }
        /* the table hands over to the approximation without a jump */
        cr_assert_float_eq(runtime_expected_max_normal(17), 1.794, 0.02);
        cr_assert_float_eq(runtime_expected_max_normal(100), 2.5076, 0.03);
}

Test(runtime_model, slower_links_and_longer_latency_never_help) {
        const double rates[] = { 100000, 10000, 1000, 300, 100, 25, 5 };
        double prev[_RUNTIME_METHOD_MAX] = {};
        for (size_t k = 0; k < sizeof rates / sizeof rates[0]; k++) {
                RuntimeModelInput in = base();
                in.bandwidth_mbit = rates[k];
                RuntimeModelResult r;
                cr_assert_eq(runtime_model_predict(&in, &r), 0);
                for (int m = 0; m < _RUNTIME_METHOD_MAX; m++) {
                        cr_assert(r.method[m].iter_ms >= prev[m], "%s at %g Mbit/s", runtime_model_method_name(m),
                                  rates[k]);
                        prev[m] = r.method[m].iter_ms;
                }
        }
        double last[_RUNTIME_METHOD_MAX] = {};
        for (double lat = 0; lat <= 100; lat += 10) {
                RuntimeModelInput in = base();
                in.latency_ms = lat;
                RuntimeModelResult r;
                runtime_model_predict(&in, &r);
                for (int m = 0; m < _RUNTIME_METHOD_MAX; m++) {
                        cr_assert(r.method[m].iter_ms >= last[m]);
                        last[m] = r.method[m].iter_ms;
                }
        }
}

Test(runtime_model, fast_network_all_reduce_is_chosen) {
        /* nothing to hide: both are compute-bound and all-reduce is exact */
        RuntimeModelInput in = base();
        in.bandwidth_mbit = 1e9;
        in.latency_ms = 0;
        in.compute_sd_ms = 0;
        in.cpu_gbyte_s = 1e9;
        RuntimeModelResult r;
        cr_assert_eq(runtime_model_predict(&in, &r), 0);
        cr_assert_eq(r.recommended, RUNTIME_ALLREDUCE);
        cr_assert_float_eq(r.method[RUNTIME_ALLREDUCE].comm_ms, 0, 0.01);
        for (int m = 0; m < _RUNTIME_METHOD_MAX; m++)
                cr_assert(r.method[m].iter_ms >= in.compute_ms);
        cr_assert_float_eq(r.speedup, 1.0, 1e-9);
}

Test(runtime_model, slow_network_gossip_wins_by_the_traffic_ratio) {
        /* bandwidth-bound: all-reduce sends 2(n-1)/n of the vector per node
         * and waits for it; a pair exchange sends it once, hidden or not */
        RuntimeModelInput in = base();
        in.bandwidth_mbit = 1;
        in.latency_ms = 0;
        in.compute_sd_ms = 0;
        in.piece_bytes = 4096; /* no pipeline fill to speak of */
        RuntimeModelResult r;
        runtime_model_predict(&in, &r);
        cr_assert_neq(r.recommended, RUNTIME_ALLREDUCE);
        double ratio = r.method[RUNTIME_ALLREDUCE].iter_ms / r.method[RUNTIME_EXP].iter_ms;
        cr_assert_float_eq(ratio, 2.0 * 7 / 8, 0.02, "ratio %g", ratio);
        /* equally fast topologies: the best mixer */
        cr_assert_eq(r.recommended, RUNTIME_ALT_EXP_RING);
        cr_assert_float_eq(r.method[RUNTIME_ALT_EXP_RING].spectral_gap, 1.0, 1e-9);
        cr_assert(r.method[RUNTIME_RING].spectral_gap < 0.5);
}

Test(runtime_model, overlap_hides_communication_shorter_than_compute) {
        RuntimeModelInput in = base();
        in.bandwidth_mbit = 100000;
        RuntimeModelResult r;
        runtime_model_predict(&in, &r);
        cr_assert(r.method[RUNTIME_EXP].comm_ms < r.method[RUNTIME_EXP].compute_ms);
        cr_assert_eq(r.method[RUNTIME_EXP].exposed_ms, 0.0);
        cr_assert_eq(r.method[RUNTIME_ALLREDUCE].exposed_ms, r.method[RUNTIME_ALLREDUCE].comm_ms);
}

Test(runtime_model, compute_spread_hurts_all_reduce_more_with_more_nodes) {
        /* all-reduce waits for the slowest of n, gossip for the slowest of 2 */
        double prev_gap = 0;
        for (unsigned n = 2; n <= 64; n *= 2) {
                RuntimeModelInput in = base();
                in.nodes = n;
                in.compute_sd_ms = 10;
                in.bandwidth_mbit = 1e9;
                in.latency_ms = 0;
                RuntimeModelResult r;
                runtime_model_predict(&in, &r);
                double gap = r.method[RUNTIME_ALLREDUCE].compute_ms - r.method[RUNTIME_ALT_EXP_RING].compute_ms;
                cr_assert(gap >= prev_gap, "n=%u", n);
                prev_gap = gap;
        }
        cr_assert_gt(prev_gap, 10.0);
}

Test(runtime_model, bad_input_and_one_node) {
        RuntimeModelInput in = base();
        RuntimeModelResult r;
        in.nodes = 0;
        cr_assert_eq(runtime_model_predict(&in, &r), -EINVAL);
        in = base();
        in.bandwidth_mbit = 0;
        cr_assert_eq(runtime_model_predict(&in, &r), -EINVAL);
        in = base();
        in.compute_ms = NAN;
        cr_assert_eq(runtime_model_predict(&in, &r), -EINVAL);
        in = base();
        in.nodes = 1;
        cr_assert_eq(runtime_model_predict(&in, &r), 0);
        cr_assert_eq(r.recommended, RUNTIME_ALLREDUCE);
        cr_assert_eq(r.method[RUNTIME_ALLREDUCE].comm_ms, 0.0);
        /* 1000 nodes: no dense spectral gap, still a prediction */
        in = base();
        in.nodes = 1000;
        cr_assert_eq(runtime_model_predict(&in, &r), 0);
        cr_assert(isnan(r.method[RUNTIME_RING].spectral_gap));
}
