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
