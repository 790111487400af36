/* nn/layer-attention.c — causal multi-head self-attention, the part of a
 * block between the QKV projection and the output projection.
 *
 * One task per (sample, head), split across the compute threads; each task
 * runs its own single-threaded sgemms (ops->gemm_serial) on strided views of
 * qkv, so no head is copied out. Rows go in blocks of ATT_BLOCK: a block of
 * queries only meets the keys up to its last row, which skips most of the
 * masked upper triangle (5/8 of the dense work at T = 256). */
#include <math.h>
#include <string.h>

#include "nn-math.h"
#include "transformer.h"

#define ATT_BLOCK 64

typedef struct AttArgs {
        float *out, *att;             /* forward */
        float *dqkv, *scratch;        /* backward */
        const float *qkv, *dout, *catt;
        const Ops *ops;
        int T, C, NH;
} AttArgs;

/* Rows i0..i1 of one head's scores become the causal softmax, in place:
 * row i keeps columns 0..i, the rest of the row is zeroed. */
_simd_clones_ static void softmax_causal_rows(float *A, int T, int i0, int i1) {
        for (int i = i0; i < i1; i++) {
                float *restrict row = A + (size_t)i * T;
                float max = row[0];
                for (int j = 1; j <= i; j++)
                        max = row[j] > max ? row[j] : max;
                float sum = 0.0f;
                for (int j = 0; j <= i; j++) {
                        float e = nn_expf(row[j] - max);
                        row[j] = e;
                        sum += e;
                }
                float inv = 1.0f / sum;
                for (int j = 0; j <= i; j++)
                        row[j] *= inv;
                memset(row + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
        }
}

static void attention_forward_tasks(void *ctx, size_t lo, size_t hi) {
        const AttArgs *a = ctx;
        const Ops *ops = a->ops;
        int T = a->T, C = a->C, NH = a->NH, hs = C / NH, C3 = 3 * C;
        float scale = 1.0f / sqrtf((float)hs);

        for (size_t task = lo; task < hi; task++) {
                size_t b = task / (size_t)NH, h = task % (size_t)NH;
                /* q, k, v are (T,hs) views with row stride 3C; A is (T,T); o is (T,hs) with stride C */
                const float *q = a->qkv + b * (size_t)T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
                float *A = a->att + task * (size_t)T * T;
                float *o = a->out + b * (size_t)T * C + h * hs;
                for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                        int i1 = MIN(T, i0 + ATT_BLOCK), n = i1 - i0;
                        /* A[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T */
                        ops->gemm_serial(false, true, n, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3,
                                         0.0f, A + (size_t)i0 * T, T);
                        softmax_causal_rows(A, T, i0, i1);
                        /* O[i0:i1] = A[i0:i1, 0:i1] V[0:i1] */
                        ops->gemm_serial(false, false, n, hs, i1, 1.0f, A + (size_t)i0 * T, T, v, C3,
                                         0.0f, o + (size_t)i0 * C, C);
                }
        }
}

void attention_forward(const Ops *ops, float *out, float *att, const float *qkv, int B, int T,
                       int C, int NH) {
        /* out is (B,T,C), att is (B,NH,T,T), qkv is (B,T,3C) */
        AttArgs a = { .out = out, .att = att, .qkv = qkv, .ops = ops, .T = T, .C = C, .NH = NH };
        ops->parallel((size_t)B * NH, 1, attention_forward_tasks, &a);
}

/* Softmax backward over rows i0..i1, in place on D (which holds dA):
 *   dS[i][j] = A[i][j] (dA[i][j] - sum_k A[i][k] dA[i][k]),  j <= i,
 * and 0 for i < j < i1 so that the gemms over the block see the mask. */
_simd_clones_ static void softmax_causal_backward_rows(float *D, const float *A, int T, int i0,
                                                       int i1) {
        for (int i = i0; i < i1; i++) {
                float *restrict d = D + (size_t)i * T;
                const float *restrict p = A + (size_t)i * T;
                float s = 0.0f;
                for (int j = 0; j <= i; j++)
                        s += p[j] * d[j];
                for (int j = 0; j <= i; j++)
                        d[j] = p[j] * (d[j] - s);
                for (int j = i + 1; j < i1; j++)
                        d[j] = 0.0f;
        }
}

static void attention_backward_tasks(void *ctx, size_t lo, size_t hi) {
        const AttArgs *a = ctx;
        const Ops *ops = a->ops;
        int T = a->T, C = a->C, NH = a->NH, hs = C / NH, C3 = 3 * C;
        float scale = 1.0f / sqrtf((float)hs);

        for (size_t task = lo; task < hi; task++) {
                size_t b = task / (size_t)NH, h = task % (size_t)NH;
                const float *q = a->qkv + b * (size_t)T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
                const float *A = a->catt + task * (size_t)T * T;
                const float *dO = a->dout + b * (size_t)T * C + h * hs;
                float *dq = a->dqkv + b * (size_t)T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
                float *D = a->scratch + task * (size_t)T * T;

                /* dV[j0:j1] = A[j0:T, j0:j1]^T dO[j0:T]: rows above j0 are masked */
                for (int j0 = 0; j0 < T; j0 += ATT_BLOCK) {
                        int j1 = MIN(T, j0 + ATT_BLOCK);
                        ops->gemm_serial(true, false, j1 - j0, hs, T - j0, 1.0f, A + (size_t)j0 * T + j0,
                                         T, dO + (size_t)j0 * C, C, 0.0f, dv + (size_t)j0 * C3, C3);
                }
                for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                        int i1 = MIN(T, i0 + ATT_BLOCK), n = i1 - i0;
                        /* dA[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T */
                        ops->gemm_serial(false, true, n, i1, hs, 1.0f, dO + (size_t)i0 * C, C, v, C3, 0.0f,
                                         D + (size_t)i0 * T, T);
                        softmax_causal_backward_rows(D, A, T, i0, i1);
                        /* dQ[i0:i1] = scale * dS[i0:i1, 0:i1] K[0:i1] */
                        ops->gemm_serial(false, false, n, hs, i1, scale, D + (size_t)i0 * T, T, k, C3, 0.0f,
                                         dq + (size_t)i0 * C3, C3);
                }
                /* dK[j0:j1] = scale * dS[j0:T, j0:j1]^T Q[j0:T] */
                for (int j0 = 0; j0 < T; j0 += ATT_BLOCK) {
                        int j1 = MIN(T, j0 + ATT_BLOCK);
                        ops->gemm_serial(true, false, j1 - j0, hs, T - j0, scale, D + (size_t)j0 * T + j0,
                                         T, q + (size_t)j0 * C3, C3, 0.0f, dk + (size_t)j0 * C3, C3);
                }
        }
}

void attention_backward(const Ops *ops, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att, int B, int T, int C, int NH) {
        /* dqkv is (B,T,3C), scratch is (B,NH,T,T), dout is (B,T,C), qkv is (B,T,3C),
         * att is (B,NH,T,T) */
        AttArgs a = { .dqkv = dqkv, .scratch = scratch, .dout = dout, .qkv = qkv, .catt = att,
                      .ops = ops, .T = T, .C = C, .NH = NH };
        ops->parallel((size_t)B * NH, 1, attention_backward_tasks, &a);
}
