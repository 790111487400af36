/* nn/layer-linear.c — fully connected layer, y = x W^T + b.
 * Parameters: weight (OC, C) then bias (OC), as in PyTorch. */
#include <string.h>

#include "layer.h"

typedef struct Bias {
        float *out;       /* forward: out (B,OC); backward: dbias (OC) */
        const float *src; /* forward: bias (OC); backward: dout (B,OC) */
        int B, OC;
        float beta;
} Bias;

/* Rows lo..hi of out start as the bias. */
static void bias_fill(void *ctx, size_t lo, size_t hi) {
        const Bias *a = ctx;
        for (size_t b = lo; b < hi; b++)
                memcpy(a->out + b * (size_t)a->OC, a->src, sizeof(float) * (size_t)a->OC);
}

/* Columns lo..hi of dbias: the sum over the batch of dout. */
_simd_clones_ static void bias_grad(void *ctx, size_t lo, size_t hi) {
        const Bias *a = ctx;
        float *restrict db = a->out;
        if (a->beta == 0.0f)
                memset(db + lo, 0, sizeof(float) * (hi - lo));
        else if (a->beta != 1.0f)
                for (size_t o = lo; o < hi; o++)
                        db[o] *= a->beta;
        for (int b = 0; b < a->B; b++) {
                const float *restrict row = a->src + (size_t)b * a->OC;
                for (size_t o = lo; o < hi; o++)
                        db[o] += row[o];
        }
}

void linear_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                    int B) {
        /* out is (B,OC), inp is (B,C), w is (OC,C) then (OC) */
        int C = l->in.c, OC = l->out.c;
        Bias a = { .out = out, .src = w + (size_t)OC * C, .B = B, .OC = OC };

        /* Start from the bias and let the gemm add x W^T (beta = 1): one pass
         * over `out` instead of two. */
        ops->parallel((size_t)B, 16, bias_fill, &a);
        ops->gemm(false, true, B, OC, C, 1.0f, inp, C, w, C, 1.0f, out, OC);
}

void linear_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                     const float *inp, const float *w, int B, float beta) {
        /* dinp is (B,C) or NULL, dw is (OC,C) then (OC), dout is (B,OC), inp is (B,C) */
        int C = l->in.c, OC = l->out.c;
        Bias a = { .out = dw + (size_t)OC * C, .src = dout, .B = B, .OC = OC, .beta = beta };

        /* dW = beta dW + dout^T inp */
        ops->gemm(true, false, OC, C, B, 1.0f, dout, OC, inp, C, beta, dw, C);
        /* db = sum over the batch of dout */
        ops->parallel((size_t)OC, 256, bias_grad, &a);
        /* dinp = dout W */
        if (dinp)
                ops->gemm(false, false, B, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
}
