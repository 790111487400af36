/* The compute pool: every index exactly once, whatever the split. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "tensor/pool.h"

static void mark(void *ctx, size_t lo, size_t hi) {
        _Atomic unsigned *hits = ctx;
        for (size_t i = lo; i < hi; i++)
                atomic_fetch_add(&hits[i], 1);
}

Test(pool, covers_every_index_once) {
        static const size_t sizes[] = { 0, 1, 31, 32, 33, 1000, 65537, 1 << 20 };
        for (int threads = 1; threads <= 4; threads++) {
                Pool *p;
                cr_assert_eq(pool_new(threads, &p), 0);
                cr_assert_eq(pool_threads(p), threads);
                for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
                        for (int rep = 0; rep < 10; rep++) {
                                size_t n = sizes[k];
                                _Atomic unsigned *hits = calloc(n + 1, sizeof *hits);
                                pool_for(p, n, 1, mark, (void *)hits);
                                for (size_t i = 0; i < n; i++)
                                        cr_assert_eq(hits[i], 1, "threads %d, n %zu: index %zu hit %u times",
                                                     threads, n, i, hits[i]);
                                free(hits);
                        }
                pool_free(p);
        }
}

Test(pool, null_pool_runs_on_caller) {
        _Atomic unsigned hits[100] = {};
        pool_for(NULL, 100, 1, mark, (void *)hits);
        for (int i = 0; i < 100; i++)
                cr_assert_eq(hits[i], 1);
        cr_assert_eq(pool_threads(NULL), 1);
        cr_assert_eq(pool_new(0, &(Pool *){ NULL }), -EINVAL);
}

/* Back-to-back jobs whose part counts alternate, as a training step's are:
 * a worker that finished the last part of one job must never run a part of
 * the next under the old job's claim (it would read that job's fields while
 * the caller writes them, and be counted in the wrong job). Each job's
 * context lives on the caller's stack, as a transformer block's does. */
typedef struct StressJob {
        uint64_t id;
        _Atomic unsigned hits[8];
} StressJob;

static _Atomic uint64_t stress_current;
static _Atomic unsigned stress_strays;

static void stress_mark(void *ctx, size_t lo, size_t hi) {
        StressJob *j = ctx;
        if (j->id != atomic_load(&stress_current))
                atomic_fetch_add(&stress_strays, 1);
        for (size_t i = lo; i < hi && i < 8; i++)
                atomic_fetch_add(&j->hits[i], 1);
}

Test(pool, a_part_never_runs_in_the_wrong_job, .timeout = 120) {
        for (int threads = 2; threads <= 3; threads++) {
                Pool *p;
                cr_assert_eq(pool_new(threads, &p), 0);
                for (uint64_t it = 1; it <= 2000000; it++) {
                        StressJob j = { .id = it };
                        size_t n = it & 1 ? 2 : 8; /* tasks, one per part */
                        atomic_store(&stress_current, it);
                        pool_for(p, n, 1, stress_mark, &j);
                        atomic_store(&stress_current, 0);
                        for (size_t i = 0; i < n; i++)
                                cr_assert_eq(atomic_load(&j.hits[i]), 1, "threads %d, job %llu: part %zu ran %u times",
                                             threads, (unsigned long long)it, i, atomic_load(&j.hits[i]));
                }
                pool_free(p);
                cr_assert_eq(atomic_load(&stress_strays), 0, "threads %d: %u parts ran with another job's context",
                             threads, atomic_load(&stress_strays));
        }
}
