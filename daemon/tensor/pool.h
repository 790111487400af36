/* tensor/pool.h — the fork-join pool that all compute of a stage runs on.
 *
 * One set of threads does everything: each sgemm is split into a few blocks
 * per thread (each a single-threaded OpenBLAS call), and so are the
 * elementwise passes such as optimizer steps. Letting OpenBLAS thread its own
 * calls instead leaves the work between calls on one core, and two thread
 * pools spinning against each other on few cores cost more than they give.
 * The caller's thread takes parts too, so a pool of n threads starts n - 1
 * workers; they spin briefly, then sleep on a futex between jobs.
 *
 *     Pool *p;
 *     pool_new(2, &p);
 *     pool_for(p, n, 4096, scale_range, &ctx);   // scale_range(&ctx, lo, hi) on each part
 *     pool_free(p);
 *
 * A NULL pool runs everything on the caller's thread.
 */
#pragma once

#include <stddef.h>

#include "util/macro.h"

typedef struct Pool Pool;

/* fn handles the half-open index range [lo, hi). */
typedef void (*PoolRangeFn)(void *ctx, size_t lo, size_t hi);

int pool_new(int n_threads, Pool **ret);
Pool *pool_free(Pool *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(Pool *, pool_free);
int pool_threads(const Pool *p);

/* Split [0, n) into a few contiguous ranges per thread (boundaries rounded
 * to 16 elements, one cache line of floats, and at least grain long) and run
 * fn on each, the threads claiming ranges as they come free; returns when
 * all are done. When n is less than two grains the whole range runs on the
 * caller: not worth a wake-up. A grain below 16 means coarse tasks
 * (attention's (sample, head) pairs): ranges are grain tasks long, claimed
 * one at a time, not rounded. */
void pool_for(Pool *p, size_t n, size_t grain, PoolRangeFn fn, void *ctx);
