/* cluster/capability.h — what a node can give: memory, compute speed and the
 * bandwidth and latency of its links, measured rather than typed in.
 *
 * Ravnest's reference code reads each node's RAM and bandwidth from a JSON
 * file its user writes. Here a node measures at start: the memory it may use
 * is the smaller of a configured cap and what the kernel says is available;
 * its speed is the sustained sgemm rate of one thread (the compute thread runs
 * single-threaded OpenBLAS calls, see tensor/ops-blas.c); bandwidth and
 * latency come from the transfers it makes anyway, fitted to
 * time = latency + bytes / bandwidth with older samples fading, so the
 * figures follow a link that changes while training runs.
 *
 *     Capability c = {};
 *     r = capability_memory(8ull << 30, "/proc/meminfo", &c.memory);  // cap 8 GiB
 *     r = capability_probe_gflops(0.3, &c.gflops);                     // ~0.3 s of sgemm
 *
 *     LinkEstimate e;
 *     link_estimate_init(&e, 0.1);            // each new transfer weighs 10%
 *     link_estimate_add(&e, 4096, 0.0011);    // bytes, seconds: from real frames
 *     link_estimate_add(&e, 1 << 20, 0.0095);
 *     r = link_estimate_get(&e, &c.bandwidth, &c.latency);
 *
 *     LinkLatency l = {};                     // what a member reports, kept from link to link
 *     LinkLatencySample s[] = { { .latency = rtt / 2, .up_ns = now - link_up_ns } };
 *     link_latency_update(&l, s, 1, 5 * NSEC_PER_SEC);   // l.latency: seconds, one way
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Capability {
        double gflops;    /* sustained sgemm GFLOP/s of one thread */
        uint64_t memory;  /* bytes the node may use for training */
        double bandwidth; /* bytes per second of its link */
        double latency;   /* seconds, one way, from the node to its peers */
} Capability;

/* MemAvailable of a /proc/meminfo text, in bytes. -EBADMSG if absent. */
int capability_parse_meminfo(const char *text, uint64_t *ret);
/* The smaller of cap (0: no cap) and MemAvailable read from meminfo_path
 * (NULL: /proc/meminfo). */
int capability_memory(uint64_t cap, const char *meminfo_path, uint64_t *ret);

/* Multiplies 256x256 matrices with single-threaded cblas_sgemm for about
 * `seconds` (at least one warm-up call and one timed call), returns the best
 * GFLOP/s of the timed rounds: the sustained rate, not one disturbed by a
 * neighbour's burst. -EINVAL for seconds outside (0, 10]. */
int capability_probe_gflops(double seconds, double *ret);

/* Weighted least squares of time = latency + bytes / bandwidth over the
 * transfers seen, with exponential forgetting: each new sample weighs alpha,
 * the older ones together 1 - alpha. */
typedef struct LinkEstimate {
        double alpha;
        double w, x, y, xx, xy; /* weighted sums of 1, bytes, seconds, bytes^2, bytes*seconds */
        unsigned n;
} LinkEstimate;

void link_estimate_init(LinkEstimate *e, double alpha);
/* Ignores samples with no bytes or a non-positive or non-finite time. */
void link_estimate_add(LinkEstimate *e, uint64_t bytes, double seconds);
/* -ENODATA before any sample. With transfers of one size only (or a fit
 * that says negative latency), the latency is taken as 0 and the bandwidth
 * as bytes / time, which is a lower bound. */
int link_estimate_get(const LinkEstimate *e, double *ret_bandwidth, double *ret_latency);

/* One link's one-way latency as its kernel measured it (half TCP_INFO's
 * smoothed round trip), and how long the link had been up then. */
typedef struct LinkLatencySample {
        double latency; /* seconds; <= 0: not measured */
        uint64_t up_ns;
} LinkLatencySample;

/* The latency a node reports for its links, kept across their
 * reconnections. */
typedef struct LinkLatency {
        double latency; /* seconds, one way; 0: nothing measured yet */
        bool settled;   /* it came from links up for settle_ns */
} LinkLatency;

/* Takes the samples of the links up now: the largest latency of those up
 * for settle_ns at least. A link that has just come up, above all one that
 * came back (its peer restarted and takes every member back at once), has
 * only its handshake's round trips, and the kernel smooths an inflated one
 * out only over many later: its samples count only while no settled link
 * has ever measured (a node's first figures, better than none), else l
 * keeps the figure settled links measured last. */
void link_latency_update(LinkLatency *l, const LinkLatencySample *s, size_t n, uint64_t settle_ns);
