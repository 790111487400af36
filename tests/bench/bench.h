/* tests/bench/bench.h — what the benchmarks share: seconds on the monotonic
 * clock, medians and their confidence intervals, and the output and peak
 * memory of a reference run in a child process. */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/time-util.h"

static inline double bench_now_s(void) {
        return ns_to_sec(now_ns());
}

static inline int bench_compare_double(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return (x > y) - (x < y);
}

/* The median of v's n values, sorting v; NAN if n is 0. */
static inline double bench_median(double *v, int n) {
        if (n <= 0)
                return NAN;
        qsort(v, (size_t)n, sizeof *v, bench_compare_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A 95 % confidence interval for the median of the n values in sorted,
 * which assumes nothing of their distribution: the k-th smallest and the
 * k-th largest, k the largest with P(Binomial(n, 1/2) < k) <= 2.5 %. False
 * if n is too small for one (below 6). */
static inline bool bench_median_ci(const double *sorted, int n, double *ret_lo, double *ret_hi) {
        double p = ldexp(1, -n), cdf = 0; /* P(X = i), P(X <= i - 1) */
        int k = 0;
        for (int i = 0; i < n && cdf + p <= 0.025; i++) {
                cdf += p;
                p = p * (n - i) / (i + 1);
                k = i + 1;
        }
        if (k == 0)
                return false;
        *ret_lo = sorted[k - 1];
        *ret_hi = sorted[n - k];
        return true;
}

/* Read the child's output from fd (the write end closed) into buf, reap it,
 * and return buf if it exited 0 (NULL otherwise); its peak RSS in
 * *ret_peak_mib. */
static inline const char *bench_child_output(pid_t pid, int fd, char *buf, size_t len, double *ret_peak_mib) {
        size_t used = 0;
        ssize_t n;
        while (used < len - 1 && (n = read(fd, buf + used, len - 1 - used)) > 0)
                used += (size_t)n;
        buf[used] = 0;
        close(fd);
        int status;
        struct rusage ru;
        wait4(pid, &status, 0, &ru);
        *ret_peak_mib = (double)ru.ru_maxrss / 1024.0;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? buf : NULL;
}
