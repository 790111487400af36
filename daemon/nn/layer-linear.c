/* nn/layer-linear.c — fully connected layer, y = x W^T + b.
 * Parameters: weight (OC, C) then bias (OC), as in PyTorch. */
#include <string.h>

#include "layer.h"

void linear_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                    int B) {
        /* out is (B,OC), inp is (B,C), w is (OC,C) then (OC) */
        int C = l->in.c, OC = l->out.c;
        const float *bias = w + (size_t)OC * C;

        /* Start from the bias and let the gemm add x W^T (beta = 1): one pass
         * over `out` instead of two. */
        for (int b = 0; b < B; b++)
                memcpy(out + (size_t)b * OC, bias, sizeof(float) * (size_t)OC);
        ops->gemm(false, true, B, OC, C, 1.0f, inp, C, w, C, 1.0f, out, OC);
}

void linear_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                     const float *inp, const float *w, int B, bool accumulate) {
        /* dinp is (B,C) or NULL, dw is (OC,C) then (OC), dout is (B,OC), inp is (B,C) */
        int C = l->in.c, OC = l->out.c;
        float *dbias = dw + (size_t)OC * C;

        /* dW = dout^T inp */
        ops->gemm(true, false, OC, C, B, 1.0f, dout, OC, inp, C, accumulate ? 1.0f : 0.0f, dw, C);
        /* db = sum over the batch of dout */
        if (!accumulate)
                memset(dbias, 0, sizeof(float) * (size_t)OC);
        for (int b = 0; b < B; b++) {
                const float *row = dout + (size_t)b * OC;
                for (int o = 0; o < OC; o++)
                        dbias[o] += row[o];
        }
        /* dinp = dout W */
        if (dinp)
                ops->gemm(false, false, B, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
}
