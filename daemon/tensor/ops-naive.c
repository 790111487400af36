/* tensor/ops-naive.c — the reference path: obvious loops, double accumulators. */
#include "ops.h"

static void naive_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
        for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                        double s = 0.0;
                        for (int k = 0; k < K; k++) {
                                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                                s += a * b;
                        }
                        float *c = &C[(size_t)i * ldc + j];
                        /* BLAS semantics: with beta == 0, C is not read. */
                        *c = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *c));
                }
}

static void naive_axpy(size_t n, float alpha, const float *x, float *y) {
        for (size_t i = 0; i < n; i++)
                y[i] = (float)((double)y[i] + (double)alpha * x[i]);
}

static void naive_parallel(size_t n, size_t grain, void (*fn)(void *ctx, size_t lo, size_t hi),
                           void *ctx) {
        if (n)
                fn(ctx, 0, n);
}

const Ops ops_naive = {
        .name = "naive",
        .gemm = naive_gemm,
        .gemm_serial = naive_gemm,
        .axpy = naive_axpy,
        .parallel = naive_parallel,
};
