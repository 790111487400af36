/* nn/layer-activation.c — elementwise nonlinearities, split across the
 * compute threads. */
#include <math.h>

#include "layer.h"

/* Below this many elements per thread a split costs more than it saves. */
#define ELEMENTWISE_GRAIN 16384

typedef struct Elementwise {
        float *out;
        const float *a, *b;
} Elementwise;

/* The loops are branch-free with restrict so the compiler vectorizes them:
 * signs of activations are random, and a branch per element costs more than
 * the arithmetic. */
_simd_clones_ static void relu_forward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        float *restrict out = e->out;
        const float *restrict inp = e->a;
        for (size_t i = lo; i < hi; i++) {
                float x = inp[i];
                out[i] = x > 0.0f ? x : 0.0f;
        }
}

_simd_clones_ static void relu_backward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        float *restrict dinp = e->out;
        const float *restrict dout = e->a, *restrict out = e->b;
        /* out > 0 exactly where inp > 0, so the forward output is enough. */
        for (size_t i = lo; i < hi; i++) {
                float g = dout[i]; /* loaded unconditionally: lets the select vectorize */
                dinp[i] = out[i] > 0.0f ? g : 0.0f;
        }
}

/* GELU as PyTorch's nn.GELU() defines it, with the exact erf (Hendrycks and
 * Gimpel, 2016): gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). */
#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

static void gelu_forward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        for (size_t i = lo; i < hi; i++) {
                float x = e->a[i];
                e->out[i] = 0.5f * x * (1.0f + erff(x * INV_SQRT2));
        }
}

static void gelu_backward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        /* d/dx x Phi(x) = Phi(x) + x phi(x), phi the standard normal density */
        for (size_t i = lo; i < hi; i++) {
                float x = e->b[i];
                float cdf = 0.5f * (1.0f + erff(x * INV_SQRT2));
                float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
                e->out[i] = e->a[i] * (cdf + x * pdf);
        }
}

void relu_forward(const Ops *ops, float *out, const float *inp, size_t n) {
        Elementwise e = { out, inp, NULL };
        ops->parallel(n, ELEMENTWISE_GRAIN, relu_forward_range, &e);
}

void relu_backward(const Ops *ops, float *dinp, const float *dout, const float *out, size_t n) {
        Elementwise e = { dinp, dout, out };
        ops->parallel(n, ELEMENTWISE_GRAIN, relu_backward_range, &e);
}

void gelu_forward(const Ops *ops, float *out, const float *inp, size_t n) {
        Elementwise e = { out, inp, NULL };
        ops->parallel(n, ELEMENTWISE_GRAIN / 8, gelu_forward_range, &e);
}

void gelu_backward(const Ops *ops, float *dinp, const float *dout, const float *inp, size_t n) {
        Elementwise e = { dinp, dout, inp };
        ops->parallel(n, ELEMENTWISE_GRAIN / 8, gelu_backward_range, &e);
}
