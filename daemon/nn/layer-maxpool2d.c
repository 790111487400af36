/* nn/layer-maxpool2d.c — max pooling; the forward pass remembers which input
 * won each window so the backward pass can route the gradient there. */
#include <string.h>

#include "layer.h"

void maxpool2d_forward(const Layer *l, float *out, const float *inp, int32_t *argmax, int B) {
        /* out is (B,C,OH,OW), inp is (B,C,H,W), argmax is (B,C,OH,OW) indices
         * into the sample's (C,H,W) input */
        int C = l->in.c, H = l->in.h, W = l->in.w;
        int K = l->spec.kernel, S = l->spec.stride, OH = l->out.h, OW = l->out.w;
        size_t in_n = shape_numel(l->in), out_n = shape_numel(l->out);

        for (int b = 0; b < B; b++) {
                const float *x = inp + (size_t)b * in_n;
                float *o = out + (size_t)b * out_n;
                int32_t *am = argmax + (size_t)b * out_n;
                for (int c = 0; c < C; c++)
                        for (int oy = 0; oy < OH; oy++)
                                for (int ox = 0; ox < OW; ox++) {
                                        int best = (c * H + oy * S) * W + ox * S;
                                        for (int ki = 0; ki < K; ki++)
                                                for (int kj = 0; kj < K; kj++) {
                                                        int i = (c * H + oy * S + ki) * W + ox * S + kj;
                                                        if (x[i] > x[best])
                                                                best = i;
                                                }
                                        size_t j = ((size_t)c * OH + oy) * OW + ox;
                                        o[j] = x[best];
                                        am[j] = best;
                                }
        }
}

void maxpool2d_backward(const Layer *l, float *dinp, const float *dout, const int32_t *argmax,
                        int B) {
        size_t in_n = shape_numel(l->in), out_n = shape_numel(l->out);

        memset(dinp, 0, sizeof(float) * in_n * (size_t)B);
        for (int b = 0; b < B; b++)
                for (size_t j = 0; j < out_n; j++)
                        dinp[(size_t)b * in_n + (size_t)argmax[(size_t)b * out_n + j]] +=
                                dout[(size_t)b * out_n + j];
}
