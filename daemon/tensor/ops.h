/* tensor/ops.h — the math the engine runs on, behind one small interface.
 *
 * Two implementations: `ops_blas` (OpenBLAS cblas_sgemm and friends, what
 * training uses) and `ops_naive` (plain loops in double precision accumulators,
 * what tests hold the fast path against). Layers take a `const Ops *` and never
 * call BLAS directly.
 *
 * All matrices are row-major. gemm computes
 *     C(M,N) = alpha * op(A) * op(B) + beta * C
 * with op(A) of shape (M,K) and op(B) of shape (K,N); ta/tb select transposes,
 * lda/ldb/ldc are the row strides of A, B, C as stored.
 *
 *     ops->gemm(false, true, B, OC, IC, 1.0f, inp, IC, w, IC, 0.0f, out, OC);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct Ops {
        const char *name;
        void (*gemm)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc);
        /* The same gemm on the calling thread only: for work that is already
         * split across the compute threads (attention runs one (sample,
         * head) per task and calls this inside its ranges). */
        void (*gemm_serial)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                            int lda, const float *B, int ldb, float beta, float *C, int ldc);
        /* y += alpha * x */
        void (*axpy)(size_t n, float alpha, const float *x, float *y);
        /* Run fn over [0, n) in ranges, on the compute threads when the
         * work is worth it (at least grain per thread); see pool.h. A grain
         * below 16 splits coarse tasks (one per index) exactly. Never call
         * parallel or gemm from inside fn: use gemm_serial there. */
        void (*parallel)(size_t n, size_t grain, void (*fn)(void *ctx, size_t lo, size_t hi),
                         void *ctx);
} Ops;

extern const Ops ops_blas;
extern const Ops ops_naive;

typedef struct Pool Pool;

/* Threads the BLAS path computes on (the process-wide compute pool; see
 * pool.h). Call before training starts, not while ops_blas is in use. */
int ops_blas_set_threads(int n);
int ops_blas_get_threads(void);
/* At the top of main(): unless OPENBLAS_NUM_THREADS is 1, set it and
 * execute the program again (argv as main() got it), so that OpenBLAS
 * starts no threads of its own. Returns only when there is nothing to do
 * (0) or the exec failed (-errno; the program goes on with them). */
int ops_blas_exec_without_threads(char *argv[]);
/* The pool, for the elementwise work that goes with the gemms (NULL when
 * running on one thread). */
Pool *ops_blas_pool(void);
