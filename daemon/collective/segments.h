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

#define SEGMENTS_MAX_OWNERS 1024 /* clusters: PLAN_MAX_CLUSTERS */

typedef struct ClusterCut {
        const size_t *bounds;   /* n_stages + 1 values: 0 < ... < total */
        const unsigned *owners; /* the member holding each stage */
        unsigned n_stages;
} ClusterCut;

typedef struct Segment {
        size_t off, len;                      /* in the whole vector */
        unsigned owners[SEGMENTS_MAX_OWNERS]; /* one per cluster, increasing */
        unsigned n_owners;
        uint32_t group;                       /* the ring's group id: 1 + segment index */
} Segment;

/* -EINVAL: bounds not increasing from 0 to total, a member owning stages in
 * two clusters of one segment, more than SEGMENTS_MAX_OWNERS clusters. */
int segments_plan(const ClusterCut *cuts, unsigned n_clusters, size_t total, Segment **ret, size_t *ret_n);

/* A ring wider than one round takes (a coll round holds at most `width`
 * members, width <= COLL_MAX_MEMBERS) averages in groups on a grid, as
 * Moshpit does: its n positions are the cells 0..n-1 of a grid of `dims`
 * dimensions of side `side` (the fewest dimensions with width^dims >= n,
 * then the smallest side with side^dims >= n), and in a round of turn t
 * the positions that differ from a position only in coordinate t mod dims
 * average together. On a full grid (side^dims == n) dims rounds in a row,
 * one per dimension, leave every member the exact average, as one ring
 * would; on a partial one the groups are uneven and the spread shrinks
 * from round to round. A ring of at most width members is one group.
 *
 *     RingGrid g;
 *     ring_grid(1024, 64, &g);                   // 2 dimensions of side 32
 *     unsigned pos[COLL_MAX_MEMBERS];
 *     unsigned n = ring_grid_group(&g, 37, 1, pos);  // 32 positions: 5, 37, 69, ... */
typedef struct RingGrid {
        unsigned n, dims, side;
} RingGrid;

/* -EINVAL: n not in 1..SEGMENTS_MAX_OWNERS or width not in 2..COLL_MAX_MEMBERS. */
int ring_grid(unsigned n, unsigned width, RingGrid *ret);
/* The positions of pos's group in the round of dimension dim, increasing,
 * pos among them: their count (1 when pos is alone on a partial grid). */
unsigned ring_grid_group(const RingGrid *g, unsigned pos, unsigned dim, unsigned out[COLL_MAX_MEMBERS]);
