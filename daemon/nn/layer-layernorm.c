/* nn/layer-layernorm.c — layer normalization (Ba, Kiros and Hinton, 2016)
 * over the last dimension, as PyTorch's nn.LayerNorm(C):
 *     y = (x - mean) / sqrt(var + eps) * w + b,  var the biased variance.
 * Rows are split across the compute threads; the parameter gradients,
 * sums over rows, are split by columns so that no two threads add into the
 * same float. The _range functions do one range on the calling thread, for
 * the block's fused jobs. */
#include <math.h>
#include <string.h>

#include "transformer.h"

_simd_clones_ void layernorm_forward_range(float *out, float *mean, float *rstd, const float *inp,
                                           const float *weight, const float *bias, size_t r0,
                                           size_t r1, int C_) {
        /* out is (N,C), mean and rstd are (N), inp is (N,C): rows r0..r1 */
        size_t C = (size_t)C_;
        for (size_t i = r0; i < r1; i++) {
                const float *restrict x = inp + i * C;
                float *restrict y = out + i * C;
                const float *restrict w = weight, *restrict b = bias;
                /* two passes: the variance of values far from 0 keeps its digits */
                float m = 0.0f;
                for (size_t c = 0; c < C; c++)
                        m += x[c];
                m /= (float)C;
                float v = 0.0f;
                for (size_t c = 0; c < C; c++) {
                        float d = x[c] - m;
                        v += d * d;
                }
                v /= (float)C;
                float s = 1.0f / sqrtf(v + LAYERNORM_EPS);
                for (size_t c = 0; c < C; c++)
                        y[c] = (x[c] - m) * s * w[c] + b[c];
                mean[i] = m;
                rstd[i] = s;
        }
}

/* The input gradient of rows r0..r1 (llm.c's layernorm_backward):
 *   dnorm = dout * w,  norm = (x - mean) * rstd
 *   dx = resid + rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) */
_simd_clones_ void layernorm_backward_range(float *dinp, const float *dout, const float *resid,
                                            const float *inp, const float *weight,
                                            const float *mean, const float *rstd, size_t r0,
                                            size_t r1, int C_) {
        size_t C = (size_t)C_;
        for (size_t i = r0; i < r1; i++) {
                const float *restrict x = inp + i * C, *restrict g = dout + i * C;
                const float *restrict w = weight;
                const float m = mean[i], s = rstd[i];
                float dm = 0.0f, dnm = 0.0f;
                for (size_t c = 0; c < C; c++) {
                        float dn = g[c] * w[c];
                        dm += dn;
                        dnm += dn * (x[c] - m) * s;
                }
                dm /= (float)C;
                dnm /= (float)C;
                float *dx = dinp + i * C; /* may alias resid, element by element */
                const float *r = resid ? resid + i * C : NULL;
                for (size_t c = 0; c < C; c++) {
                        float v = (g[c] * w[c] - dm - (x[c] - m) * s * dnm) * s;
                        dx[c] = r ? r[c] + v : v;
                }
        }
}

/* Columns c0..c1 of dweight and dbias: sums over all N rows. */
_simd_clones_ void layernorm_params_backward_range(float *dweight, float *dbias, const float *dout,
                                                   const float *inp, const float *mean,
                                                   const float *rstd, int N, size_t c0, size_t c1,
                                                   int C_, float beta) {
        size_t C = (size_t)C_;
        float *restrict dw = dweight, *restrict db = dbias;
        if (beta == 0.0f) {
                memset(dw + c0, 0, sizeof(float) * (c1 - c0));
                memset(db + c0, 0, sizeof(float) * (c1 - c0));
        } else if (beta != 1.0f)
                for (size_t c = c0; c < c1; c++) {
                        dw[c] *= beta;
                        db[c] *= beta;
                }
        for (size_t i = 0; i < (size_t)N; i++) {
                const float *restrict x = inp + i * C, *restrict g = dout + i * C;
                const float m = mean[i], s = rstd[i];
                for (size_t c = c0; c < c1; c++) {
                        dw[c] += g[c] * (x[c] - m) * s;
                        db[c] += g[c];
                }
        }
}

typedef struct LnArgs {
        float *out, *mean, *rstd;      /* forward */
        float *dinp, *dweight, *dbias; /* backward */
        const float *inp, *weight, *bias, *dout, *resid;
        const float *cmean, *crstd;
        int rows, C;
        float beta;
} LnArgs;

/* Rows this many floats long or more are worth a thread each. */
#define LN_GRAIN_FLOATS 8192

static void ln_forward_rows(void *ctx, size_t lo, size_t hi) {
        const LnArgs *a = ctx;
        layernorm_forward_range(a->out, a->mean, a->rstd, a->inp, a->weight, a->bias, lo, hi, a->C);
}

static void ln_backward_rows(void *ctx, size_t lo, size_t hi) {
        const LnArgs *a = ctx;
        layernorm_backward_range(a->dinp, a->dout, a->resid, a->inp, a->weight, a->cmean, a->crstd,
                                 lo, hi, a->C);
}

static void ln_backward_params(void *ctx, size_t lo, size_t hi) {
        const LnArgs *a = ctx;
        layernorm_params_backward_range(a->dweight, a->dbias, a->dout, a->inp, a->cmean, a->crstd,
                                        a->rows, lo, hi, a->C, a->beta);
}

void layernorm_forward(const Ops *ops, float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C) {
        /* out is (N,C), mean and rstd are (N), inp is (N,C), weight and bias are (C) */
        LnArgs a = { .out = out, .mean = mean, .rstd = rstd, .inp = inp, .weight = weight,
                     .bias = bias, .C = C };
        ops->parallel((size_t)N, MAX(1, LN_GRAIN_FLOATS / C), ln_forward_rows, &a);
}

void layernorm_backward(const Ops *ops, float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *resid, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C,
                        float beta) {
        /* dinp is (N,C) or NULL, dweight and dbias are (C), dout is (N,C),
         * resid is (N,C) or NULL, inp is (N,C), weight is (C), mean and rstd are (N) */
        LnArgs a = { .dinp = dinp, .dweight = dweight, .dbias = dbias, .inp = inp,
                     .weight = weight, .dout = dout, .resid = resid, .cmean = mean,
                     .crstd = rstd, .rows = N, .C = C, .beta = beta };
        ops->parallel((size_t)C, 16, ln_backward_params, &a);
        if (dinp)
                ops->parallel((size_t)N, MAX(1, LN_GRAIN_FLOATS / C), ln_backward_rows, &a);
}
