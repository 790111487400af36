/* tensor/ops-blas.c — the fast path: OpenBLAS, one single-threaded call per
 * thread of the compute pool (see pool.h for why not OpenBLAS's threads). */
#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops.h"
#include "pool.h"

static Pool *compute_pool;

typedef struct GemmArgs {
        bool ta, tb, split_rows;
        int M, N, K, lda, ldb, ldc;
        float alpha, beta;
        const float *A, *B;
        float *C;
} GemmArgs;

static void gemm_block(void *ctx, size_t lo, size_t hi) {
        const GemmArgs *g = ctx;
        const float *A = g->A, *B = g->B;
        float *C = g->C;
        int M = g->M, N = g->N;

        if (g->split_rows) {
                /* rows lo..hi of C: rows of op(A) */
                A += g->ta ? lo : lo * (size_t)g->lda;
                C += lo * (size_t)g->ldc;
                M = (int)(hi - lo);
        } else {
                /* columns lo..hi of C: columns of op(B) */
                B += g->tb ? lo * (size_t)g->ldb : lo;
                C += lo;
                N = (int)(hi - lo);
        }
        cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                    M, N, g->K, g->alpha, A, g->lda, B, g->ldb, g->beta, C, g->ldc);
}

static void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
        GemmArgs g = {
                .ta = ta, .tb = tb, .split_rows = M > N,
                .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C,
        };
        /* Each block must keep enough work to amortize a wake-up: about a
         * million multiply-adds. */
        size_t other = (size_t)(g.split_rows ? N : M) * (size_t)K;
        size_t grain = MAX((size_t)16, ((size_t)1 << 20) / MAX(other, (size_t)1));
        pool_for(compute_pool, (size_t)(g.split_rows ? M : N), grain, gemm_block, &g);
}

static void blas_gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                             int lda, const float *B, int ldb, float beta, float *C, int ldc) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                    N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void blas_axpy(size_t n, float alpha, const float *x, float *y) {
        cblas_saxpy((int)n, alpha, x, 1, y, 1);
}

static void blas_parallel(size_t n, size_t grain, PoolRangeFn fn, void *ctx) {
        pool_for(compute_pool, n, grain, fn, ctx);
}

const Ops ops_blas = {
        .name = "openblas",
        .gemm = blas_gemm,
        .gemm_serial = blas_gemm_serial,
        .axpy = blas_axpy,
        .parallel = blas_parallel,
};

int ops_blas_set_threads(int n) {
        Pool *p = NULL;

        if (n <= 0)
                n = 1;
        openblas_set_num_threads(1);
        if (n == pool_threads(compute_pool))
                return 0;
        if (n > 1) {
                int r = pool_new(n, &p);
                if (r < 0)
                        return r;
        }
        pool_free(compute_pool);
        compute_pool = p;
        return 0;
}

int ops_blas_get_threads(void) {
        return pool_threads(compute_pool);
}

Pool *ops_blas_pool(void) {
        return compute_pool;
}

/* OpenBLAS starts a thread per CPU but one in its constructor, before
 * main(), and each allocates a buffer of 128 MiB. We never let it compute on
 * them (ops_blas_set_threads), so they only cost; and under an address-space
 * limit too small for the buffer (ulimit -v, a container's), such a thread
 * retries its allocation for ever, spinning, and exit() joins it
 * (gotoblas_quit): the process never ended, SIGTERM or not. Only the
 * environment OpenBLAS's constructor reads stops them from starting, and
 * nothing of ours runs before it but a .preinit_array, whose setenv() libc's
 * own start then undoes. Hence one exec more. */
int ops_blas_exec_without_threads(char *argv[]) {
        const char *v = getenv("OPENBLAS_NUM_THREADS");
        char path[PATH_MAX];

        if (v && strcmp(v, "1") == 0)
                return 0;
        /* the file itself, not /proc/self/exe, whose name the process
         * would take (comm "exe" in ps and the journal) */
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        if (n < 0)
                return -errno;
        path[n] = '\0';
        if (setenv("OPENBLAS_NUM_THREADS", "1", 1) < 0)
                return -errno;
        execv(path, argv);
        return -errno;
}
