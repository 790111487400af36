/* tensor/ops-blas.c — the fast path: OpenBLAS. */
#include <cblas.h>

#include "ops.h"

static void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void blas_axpy(size_t n, float alpha, const float *x, float *y) {
        cblas_saxpy((int)n, alpha, x, 1, y, 1);
}

const Ops ops_blas = {
        .name = "openblas",
        .gemm = blas_gemm,
        .axpy = blas_axpy,
};

void ops_blas_set_threads(int n) {
        if (n > 0)
                openblas_set_num_threads(n);
}

int ops_blas_get_threads(void) {
        return openblas_get_num_threads();
}
