/* collective/segments.h — the rings of a parallel multi-ring all-reduce.
 *
 * Every cluster holds the whole parameter vector, cut into contiguous stage
 * ranges, one per node, and clusters may cut it at different points. Cutting
 * the vector at every boundary of every cluster gives segments that lie inside
 * exactly one stage of each cluster; each segment is averaged by a ring of
 * those owners, one per cluster, and all rings run at once (Ravnest, Menon
 * et al., 2024, Section 3.3).
 *
 *     size_t a[] = { 0, 50, 100 }, b[] = { 0, 30, 100 };
 *     unsigned oa[] = { 0, 1 }, ob[] = { 2, 3 };
 *     ClusterCut cuts[] = { { a, oa, 2 }, { b, ob, 2 } };
 *     Segment *s; size_t n;
 *     r = segments_plan(cuts, 2, 100, &s, &n);
 *     // [0,30) {0,2}   [30,50) {0,3}   [50,100) {1,3}
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "coll-wire.h"

typedef struct ClusterCut {
        const size_t *bounds;   /* n_stages + 1 values: 0 < ... < total */
        const unsigned *owners; /* the member holding each stage */
        unsigned n_stages;
} ClusterCut;

typedef struct Segment {
        size_t off, len;                      /* in the whole vector */
        unsigned owners[COLL_MAX_MEMBERS];    /* one per cluster, increasing */
        unsigned n_owners;
        uint32_t group;                       /* the ring's group id: 1 + segment index */
} Segment;

/* -EINVAL: bounds not increasing from 0 to total, a member owning stages in
 * two clusters of one segment, more than COLL_MAX_MEMBERS clusters. */
int segments_plan(const ClusterCut *cuts, unsigned n_clusters, size_t total, Segment **ret, size_t *ret_n);
