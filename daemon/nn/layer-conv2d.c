/* nn/layer-conv2d.c — 2-D convolution as im2col + sgemm, one sample at a time.
 * Parameters: weight (OC, C, K, K) then bias (OC), as in PyTorch. */
#include <string.h>

#include "layer.h"

/* col is (C*K*K, OH*OW): row (c,ki,kj), column (oy,ox) holds the input pixel
 * that kernel tap (ki,kj) of channel c sees at output (oy,ox), 0 in padding. */
static void im2col(const Layer *l, float *col, const float *img) {
        int C = l->in.c, H = l->in.h, W = l->in.w;
        int K = l->spec.kernel, S = l->spec.stride, P = l->spec.padding;
        int OH = l->out.h, OW = l->out.w;

        for (int c = 0; c < C; c++)
                for (int ki = 0; ki < K; ki++)
                        for (int kj = 0; kj < K; kj++) {
                                float *row = col + ((size_t)(c * K + ki) * K + kj) * OH * OW;
                                for (int oy = 0; oy < OH; oy++) {
                                        int y = oy * S + ki - P;
                                        float *dst = row + (size_t)oy * OW;
                                        if (y < 0 || y >= H) {
                                                memset(dst, 0, sizeof(float) * (size_t)OW);
                                                continue;
                                        }
                                        const float *src = img + ((size_t)c * H + y) * W;
                                        for (int ox = 0; ox < OW; ox++) {
                                                int x = ox * S + kj - P;
                                                dst[ox] = (x >= 0 && x < W) ? src[x] : 0.0f;
                                        }
                                }
                        }
}

/* The adjoint of im2col: scatter-add col back into img (which is zeroed first). */
static void col2im(const Layer *l, float *img, const float *col) {
        int C = l->in.c, H = l->in.h, W = l->in.w;
        int K = l->spec.kernel, S = l->spec.stride, P = l->spec.padding;
        int OH = l->out.h, OW = l->out.w;

        memset(img, 0, sizeof(float) * (size_t)C * H * W);
        for (int c = 0; c < C; c++)
                for (int ki = 0; ki < K; ki++)
                        for (int kj = 0; kj < K; kj++) {
                                const float *row = col + ((size_t)(c * K + ki) * K + kj) * OH * OW;
                                for (int oy = 0; oy < OH; oy++) {
                                        int y = oy * S + ki - P;
                                        if (y < 0 || y >= H)
                                                continue;
                                        float *dst = img + ((size_t)c * H + y) * W;
                                        const float *src = row + (size_t)oy * OW;
                                        for (int ox = 0; ox < OW; ox++) {
                                                int x = ox * S + kj - P;
                                                if (x >= 0 && x < W)
                                                        dst[x] += src[ox];
                                        }
                                }
                        }
}

void conv2d_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                    float *scratch, int B) {
        /* out is (B,OC,OH,OW), inp is (B,C,H,W), w is (OC,C*K*K) then (OC),
         * scratch holds col (C*K*K, OH*OW) */
        int OC = l->out.c, OHW = l->out.h * l->out.w, CKK = (int)l->fan_in;
        const float *bias = w + (size_t)OC * CKK;
        size_t in_n = shape_numel(l->in), out_n = shape_numel(l->out);

        for (int b = 0; b < B; b++) {
                float *o = out + (size_t)b * out_n;
                im2col(l, scratch, inp + (size_t)b * in_n);
                for (int oc = 0; oc < OC; oc++)
                        for (int i = 0; i < OHW; i++)
                                o[(size_t)oc * OHW + i] = bias[oc];
                ops->gemm(false, false, OC, OHW, CKK, 1.0f, w, CKK, scratch, OHW, 1.0f, o, OHW);
        }
}

void conv2d_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                     const float *inp, const float *w, float *scratch, int B, float beta) {
        /* dinp is (B,C,H,W) or NULL, dw is (OC,C*K*K) then (OC), dout is
         * (B,OC,OH,OW); scratch holds col and dcol, (C*K*K, OH*OW) each */
        int OC = l->out.c, OHW = l->out.h * l->out.w, CKK = (int)l->fan_in;
        float *dbias = dw + (size_t)OC * CKK;
        float *col = scratch, *dcol = scratch + (size_t)CKK * OHW;
        size_t in_n = shape_numel(l->in), out_n = shape_numel(l->out);

        if (beta == 0.0f)
                memset(dw, 0, sizeof(float) * l->n_params);
        else if (beta != 1.0f)
                for (size_t i = 0; i < l->n_params; i++)
                        dw[i] *= beta;
        for (int b = 0; b < B; b++) {
                const float *g = dout + (size_t)b * out_n;
                im2col(l, col, inp + (size_t)b * in_n);
                /* dW += dout_b col^T */
                ops->gemm(false, true, OC, CKK, OHW, 1.0f, g, OHW, col, OHW, 1.0f, dw, CKK);
                for (int oc = 0; oc < OC; oc++) {
                        float s = 0.0f;
                        for (int i = 0; i < OHW; i++)
                                s += g[(size_t)oc * OHW + i];
                        dbias[oc] += s;
                }
                if (dinp) {
                        /* dcol = W^T dout_b, then scatter back to pixels */
                        ops->gemm(true, false, CKK, OHW, OC, 1.0f, w, CKK, g, OHW, 0.0f, dcol, OHW);
                        col2im(l, dinp + (size_t)b * in_n, dcol);
                }
        }
}
