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

/* The latency a member reports: its links' round trips once they have
 * been up SETTLE, not those of a link that just came back, which the
 * handshake inflates while its peer takes every member back at once. */
Test(capability, link_latency_waits_for_links_to_settle) {
        const uint64_t s = 1000000000, SETTLE = 5 * s;
        LinkLatency l = {};

        /* nothing measured: nothing taken */
        link_latency_update(&l, (LinkLatencySample[]){ { 0, 10 * s } }, 1, SETTLE);
        cr_assert_eq(l.latency, 0);
        /* the first link, just up: its handshake's figure is all there is */
        link_latency_update(&l, (LinkLatencySample[]){ { 2e-3, 0 } }, 1, SETTLE);
        cr_assert_eq(l.latency, 2e-3);
        cr_assert(!l.settled);
        link_latency_update(&l, (LinkLatencySample[]){ { 1e-3, 3 * s } }, 1, SETTLE);
        cr_assert_eq(l.latency, 1e-3, "still young, and nothing settled: it follows");
        /* settled: the largest of the settled links, a young one left out */
        link_latency_update(&l, (LinkLatencySample[]){ { 5e-4, 6 * s }, { 3e-4, 60 * s }, { 9e-3, s } }, 3,
                            SETTLE);
        cr_assert_eq(l.latency, 5e-4);
        cr_assert(l.settled);

        /* the link to the coordinator comes back (it restarted) and no
         * stage runs: its inflated round trip is not the node's latency
         * (the JOIN it sends now, and the coordinator's first plan, take
         * the one measured before) */
        link_latency_update(&l, (LinkLatencySample[]){ { 40e-3, 0 }, { 0, 0 } }, 2, SETTLE);
        cr_assert_eq(l.latency, 5e-4, "%g", l.latency);
        link_latency_update(&l, (LinkLatencySample[]){ { 30e-3, 4 * s } }, 1, SETTLE);
        cr_assert_eq(l.latency, 5e-4, "%g", l.latency);
        /* a stage that has trained a while: its links count, the new one still not */
        link_latency_update(&l, (LinkLatencySample[]){ { 30e-3, 4 * s }, { 7e-4, 20 * s } }, 2, SETTLE);
        cr_assert_eq(l.latency, 7e-4, "%g", l.latency);
        /* up long enough, the new link counts: what it measures now */
        link_latency_update(&l, (LinkLatencySample[]){ { 6e-4, SETTLE } }, 1, SETTLE);
        cr_assert_eq(l.latency, 6e-4, "%g", l.latency);
}
