/* nn/layer-linear.c — fully connected layer, y = x W^T + b, and the matmul
 * it is made of, which the transformer's layers share.
 * Parameters: weight (OC, C) then bias (OC), as in PyTorch. */
#include <string.h>

#include "layer.h"
#include "transformer.h"

typedef struct Bias {
        float *out;         /* forward: out (N,OC); backward: dbias (OC) */
        const float *src;   /* forward: bias (OC) or NULL; backward: dout (N,OC) */
        const float *resid; /* forward: (N,OC) or NULL */
        int N, OC;
        float beta;
} Bias;

/* Rows lo..hi of out start as the bias, plus the residual when there is one. */
_simd_clones_ static void bias_fill(void *ctx, size_t lo, size_t hi) {
        const Bias *a = ctx;
        size_t OC = (size_t)a->OC;
        for (size_t b = lo; b < hi; b++) {
                float *restrict o = a->out + b * OC;
                if (!a->resid)
                        memcpy(o, a->src, sizeof(float) * OC);
                else if (!a->src)
                        memcpy(o, a->resid + b * OC, sizeof(float) * OC);
                else {
                        const float *restrict r = a->resid + b * OC, *restrict bias = a->src;
                        for (size_t o_ = 0; o_ < OC; o_++)
                                o[o_] = r[o_] + bias[o_];
                }
        }
}

/* Columns lo..hi of dbias: the sum over the rows of dout. */
_simd_clones_ static void bias_grad(void *ctx, size_t lo, size_t hi) {
        const Bias *a = ctx;
        float *restrict db = a->out;
        if (a->beta == 0.0f)
                memset(db + lo, 0, sizeof(float) * (hi - lo));
        else if (a->beta != 1.0f)
                for (size_t o = lo; o < hi; o++)
                        db[o] *= a->beta;
        for (int b = 0; b < a->N; b++) {
                const float *restrict row = a->src + (size_t)b * a->OC;
                for (size_t o = lo; o < hi; o++)
                        db[o] += row[o];
        }
}

void matmul_forward(const Ops *ops, float *out, const float *inp, const float *weight,
                    const float *bias, const float *resid, int N, int C, int OC) {
        /* out is (N,OC), inp is (N,C), weight is (OC,C), bias is (OC) or NULL,
         * resid is (N,OC) or NULL */
        Bias a = { .out = out, .src = bias, .resid = resid, .N = N, .OC = OC };

        /* Start from the bias (and residual) and let the gemm add x W^T
         * (beta = 1): one pass over `out` instead of two. */
        if (bias || resid)
                ops->parallel((size_t)N, MAX(1, 16384 / OC), bias_fill, &a);
        ops->gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, bias || resid ? 1.0f : 0.0f, out,
                  OC);
}

void matmul_backward(const Ops *ops, float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int N, int C, int OC, float beta) {
        /* dinp is (N,C) or NULL, dweight is (OC,C), dbias is (OC) or NULL,
         * dout is (N,OC), inp is (N,C), weight is (OC,C) */
        Bias a = { .out = dbias, .src = dout, .N = N, .OC = OC, .beta = beta };

        /* dW = beta dW + dout^T inp */
        ops->gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, beta, dweight, C);
        /* db = sum over the rows of dout */
        if (dbias)
                ops->parallel((size_t)OC, 256, bias_grad, &a);
        /* dinp = dout W */
        if (dinp)
                ops->gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
}

void linear_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                    int B) {
        /* out is (B,OC), inp is (B,C), w is (OC,C) then (OC) */
        int C = l->in.c, OC = l->out.c;
        matmul_forward(ops, out, inp, w, w + (size_t)OC * C, NULL, B, C, OC);
}

void linear_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                     const float *inp, const float *w, int B, float beta) {
        /* dinp is (B,C) or NULL, dw is (OC,C) then (OC), dout is (B,OC), inp is (B,C) */
        int C = l->in.c, OC = l->out.c;
        matmul_backward(ops, dinp, dw, dw + (size_t)OC * C, dout, inp, w, B, C, OC, beta);
}
