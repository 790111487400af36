/* nn/layer-activation.c — elementwise nonlinearities. */
#include <math.h>

#include "layer.h"

/* Written branch-free with restrict so the compiler vectorizes them: signs
 * of activations are random, and a branch per element costs more than the
 * arithmetic. */
_simd_clones_ void relu_forward(float *restrict out, const float *restrict inp, size_t n) {
        for (size_t i = 0; i < n; i++) {
                float x = inp[i];
                out[i] = x > 0.0f ? x : 0.0f;
        }
}

_simd_clones_ void relu_backward(float *restrict dinp, const float *restrict dout, const float *restrict out,
                   size_t n) {
        /* out > 0 exactly where inp > 0, so the forward output is enough. */
        for (size_t i = 0; i < n; i++) {
                float g = dout[i]; /* loaded unconditionally: lets the select vectorize */
                dinp[i] = out[i] > 0.0f ? g : 0.0f;
        }
}

/* GELU as PyTorch's nn.GELU() defines it, with the exact erf (Hendrycks and
 * Gimpel, 2016): gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). */
#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

void gelu_forward(float *restrict out, const float *restrict inp, size_t n) {
        for (size_t i = 0; i < n; i++) {
                float x = inp[i];
                out[i] = 0.5f * x * (1.0f + erff(x * INV_SQRT2));
        }
}

void gelu_backward(float *restrict dinp, const float *restrict dout, const float *restrict inp,
                   size_t n) {
        /* d/dx x Phi(x) = Phi(x) + x phi(x), phi the standard normal density */
        for (size_t i = 0; i < n; i++) {
                float x = inp[i];
                float cdf = 0.5f * (1.0f + erff(x * INV_SQRT2));
                float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
                dinp[i] = dout[i] * (cdf + x * pdf);
        }
}
