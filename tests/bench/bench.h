/* tests/bench/bench.h — what the benchmarks share: seconds on the monotonic
 * clock and an ordering of doubles for qsort (medians). */
#pragma once

#include "util/time-util.h"

static inline double bench_now_s(void) {
        return ns_to_sec(now_ns());
}

static inline int bench_compare_double(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return (x > y) - (x < y);
}
