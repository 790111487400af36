/* Capabilities: memory from a cap and MemAvailable, a plausible sgemm rate,
 * and bandwidth and latency fitted from transfers. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>

#include "cluster/capability.h"

Test(capability, meminfo) {
        uint64_t v;
        cr_assert_eq(capability_parse_meminfo("MemTotal:  16000000 kB\nMemFree: 100 kB\nMemAvailable:    8000000 kB\n", &v), 0);
        cr_assert_eq(v, 8000000ull * 1024);
        cr_assert_eq(capability_parse_meminfo("MemTotal: 1 kB\n", &v), -EBADMSG);
        cr_assert_eq(capability_parse_meminfo("MemAvailable: lots\n", &v), -EBADMSG);

        char path[] = "/tmp/test-capability-XXXXXX";
        int fd = mkstemp(path);
        dprintf(fd, "MemTotal: 4096 kB\nMemAvailable: 2048 kB\n");
        close(fd);
        cr_assert_eq(capability_memory(0, path, &v), 0);
        cr_assert_eq(v, 2048 * 1024);
        cr_assert_eq(capability_memory(1000, path, &v), 0);
        cr_assert_eq(v, 1000, "the cap wins when smaller");
        unlink(path);
        cr_assert_eq(capability_memory(0, NULL, &v), 0, "this machine's /proc/meminfo");
        cr_assert_gt(v, 1 << 20);
}

Test(capability, sgemm_probe) {
        double g;
        cr_assert_eq(capability_probe_gflops(0.2, &g), 0);
        /* one core of anything from a Raspberry Pi to a server */
        cr_assert(g > 0.1 && g < 2000, "%g GFLOP/s", g);
        cr_assert_eq(capability_probe_gflops(0, &g), -EINVAL);
}

Test(capability, link_fit) {
        LinkEstimate e;
        double bw, lat;
        link_estimate_init(&e, 0.1);
        cr_assert_eq(link_estimate_get(&e, &bw, &lat), -ENODATA);
        /* 100 MB/s, 2 ms */
        for (int i = 0; i < 20; i++) {
                uint64_t bytes = (i % 2) ? 4096 : (4u << 20);
                link_estimate_add(&e, bytes, 2e-3 + (double)bytes / 100e6);
        }
        cr_assert_eq(link_estimate_get(&e, &bw, &lat), 0);
        cr_assert_float_eq(bw, 100e6, 1e3);
        cr_assert_float_eq(lat, 2e-3, 1e-7);
        /* the link slows down to 10 MB/s: the estimate follows */
        for (int i = 0; i < 200; i++) {
                uint64_t bytes = (i % 2) ? 4096 : (4u << 20);
                link_estimate_add(&e, bytes, 2e-3 + (double)bytes / 10e6);
        }
        cr_assert_eq(link_estimate_get(&e, &bw, &lat), 0);
        cr_assert(fabs(bw - 10e6) < 0.05 * 10e6, "%g", bw);
        /* one size only: a lower bound, no latency */
        link_estimate_init(&e, 0.5);
        link_estimate_add(&e, 1000, 1e-3);
        link_estimate_add(&e, 0, 1.0); /* ignored */
        cr_assert_eq(link_estimate_get(&e, &bw, &lat), 0);
        cr_assert_float_eq(bw, 1e6, 1);
        cr_assert_eq(lat, 0);
}
