/* cluster/capability.c */
#include "capability.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/macro.h"

int capability_parse_meminfo(const char *text, uint64_t *ret) {
        const char *p = text;
        while (p && *p) {
                if (strncmp(p, "MemAvailable:", 13) == 0) {
                        char *end;
                        errno = 0;
                        unsigned long long kib = strtoull(p + 13, &end, 10);
                        if (errno || end == p + 13 || kib > UINT64_MAX / 1024)
                                return -EBADMSG;
                        while (*end == ' ' || *end == '\t')
                                end++;
                        if (strncmp(end, "kB", 2) != 0)
                                return -EBADMSG;
                        *ret = (uint64_t)kib * 1024;
                        return 0;
                }
                p = strchr(p, '\n');
                if (p)
                        p++;
        }
        return -EBADMSG;
}

int capability_memory(uint64_t cap, const char *meminfo_path, uint64_t *ret) {
        char buf[8192];
        size_t len = 0;
        uint64_t avail;

        _cleanup_(closep) int fd = open(meminfo_path ?: "/proc/meminfo", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        while (len < sizeof buf - 1) {
                ssize_t k = read(fd, buf + len, sizeof buf - 1 - len);
                if (k < 0)
                        return -errno;
                if (k == 0)
                        break;
                len += (size_t)k;
        }
        buf[len] = 0;
        int r = capability_parse_meminfo(buf, &avail);
        if (r < 0)
                return r;
        *ret = cap ? MIN(cap, avail) : avail;
        return 0;
}

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int capability_probe_gflops(double seconds, double *ret) {
        enum { N = 256 };
        if (!(seconds > 0 && seconds <= 10))
                return -EINVAL;
        _cleanup_(freep) float *a = malloc(3 * sizeof(float) * N * N);
        if (!a)
                return -ENOMEM;
        float *b = a + N * N, *c = b + N * N;
        for (size_t i = 0; i < (size_t)N * N; i++) {
                a[i] = (float)(i % 17) * 0.01f;
                b[i] = (float)(i % 13) * 0.01f;
                c[i] = 0;
        }
        /* The compute thread calls OpenBLAS single-threaded (ops-blas.c sets
         * the same); the probe measures that thread, not the whole machine. */
        openblas_set_num_threads(1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);

        /* Rounds of a few calls each, so one round is a few milliseconds
         * whatever the speed; the best round is the sustained rate. */
        double best = 0, start = now_s(), flops = 2.0 * N * N * N;
        int calls = 4;
        do {
                double t0 = now_s();
                for (int k = 0; k < calls; k++)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N,
                                    k ? 1.0f : 0.0f, c, N);
                double dt = now_s() - t0;
                if (dt > 0)
                        best = MAX(best, flops * calls / dt);
                if (dt < 0.002 && calls < (1 << 16))
                        calls *= 2;
        } while (now_s() - start < seconds);
        if (!(best > 0) || !isfinite(c[0]))
                return -EIO;
        *ret = best * 1e-9;
        return 0;
}

void link_estimate_init(LinkEstimate *e, double alpha) {
        *e = (LinkEstimate){ .alpha = alpha > 0 && alpha <= 1 ? alpha : 0.1 };
}

void link_estimate_add(LinkEstimate *e, uint64_t bytes, double seconds) {
        if (bytes == 0 || !(seconds > 0) || !isfinite(seconds))
                return;
        double a = e->alpha, k = 1 - a, x = (double)bytes, y = seconds;
        e->w = k * e->w + a;
        e->x = k * e->x + a * x;
        e->y = k * e->y + a * y;
        e->xx = k * e->xx + a * x * x;
        e->xy = k * e->xy + a * x * y;
        e->n++;
}

int link_estimate_get(const LinkEstimate *e, double *ret_bandwidth, double *ret_latency) {
        if (e->n == 0 || !(e->w > 0))
                return -ENODATA;
        double mx = e->x / e->w, my = e->y / e->w;
        double var = e->xx / e->w - mx * mx, cov = e->xy / e->w - mx * my;
        if (e->n >= 2 && var > 1e-6 * mx * mx && cov > 0) {
                double slope = cov / var, lat = my - slope * mx;
                if (lat >= 0) {
                        *ret_bandwidth = 1 / slope;
                        *ret_latency = lat;
                        return 0;
                }
        }
        /* One size, or a fit that makes no physical sense: a line through
         * the origin, time = bytes / bandwidth. */
        *ret_bandwidth = e->xx / e->xy;
        *ret_latency = 0;
        return 0;
}

void link_latency_update(LinkLatency *l, const LinkLatencySample *s, size_t n, uint64_t settle_ns) {
        double settled = 0, young = 0;
        for (size_t i = 0; i < n; i++) {
                if (!(s[i].latency > 0))
                        continue;
                if (s[i].up_ns >= settle_ns)
                        settled = MAX(settled, s[i].latency);
                else
                        young = MAX(young, s[i].latency);
        }
        if (settled > 0) {
                l->latency = settled;
                l->settled = true;
        } else if (young > 0 && !l->settled)
                l->latency = young;
}
