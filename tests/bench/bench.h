/* tests/bench/bench.h — what the benchmarks share: seconds on the monotonic
 * clock, an ordering of doubles for qsort (medians), and the output and
 * peak memory of a reference run in a child process. */
#pragma once

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
