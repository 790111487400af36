/* nn/layer.h — layers as forward/backward pairs over a batch.
 *
 * A Layer knows its shapes and where its parameters sit in its stage's slab;
 * it holds no buffers of its own, so the same layer can run many micro-batches
 * at once (each with its own activations) and against any stashed version of
 * the weights. Conventions follow llm.c: outputs first, inputs next, sizes
 * last, and the shape of every tensor argument in a comment.
 *
 * Per-sample shapes are (C,H,W); a vector of D features is (D,1,1).
 *
 *     Layer l;
 *     r = layer_init(&l, &(LayerSpec){ .kind = LAYER_LINEAR, .out = 10 },
 *                    (Shape){ 784, 1, 1 }, &diag);
 *     layer_forward(&l, &ops_blas, out, inp, w, saved, scratch, B);
 *     layer_backward(&l, &ops_blas, dinp, dw, dout, inp, out, w, saved, scratch, B, false);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor/ops.h"
#include "util/diag.h"
#include "util/rng.h"

typedef enum LayerKind {
        LAYER_LINEAR,
        LAYER_RELU,
        LAYER_GELU,
        LAYER_CONV2D,
        LAYER_MAXPOOL2D,
        LAYER_FLATTEN,
        _LAYER_KIND_MAX,
        _LAYER_KIND_INVALID = -1,
} LayerKind;

typedef struct Shape {
        int c, h, w;
} Shape;

static inline size_t shape_numel(Shape s) {
        return (size_t)s.c * (size_t)s.h * (size_t)s.w;
}

/* What a job file says about one layer. Fields a kind does not use are 0. */
typedef struct LayerSpec {
        LayerKind kind;
        int out;     /* linear: output features; conv2d: output channels */
        int kernel;  /* conv2d, maxpool2d */
        int stride;  /* conv2d (default 1), maxpool2d (default = kernel) */
        int padding; /* conv2d */
} LayerSpec;

typedef struct Layer {
        LayerKind kind;
        LayerSpec spec;
        Shape in, out;          /* per sample */
        size_t n_params;        /* floats of this layer in the slab */
        size_t param_offset;    /* where they start in the stage slab */
        size_t saved_bytes;     /* per sample, kept from forward to backward */
        size_t scratch_floats;  /* per call, for im2col and the like */
        size_t fan_in;          /* for initialization */
} Layer;

const char *layer_kind_to_string(LayerKind k);
LayerKind layer_kind_from_string(const char *s);

/* Check a spec against its input shape and fill in the layer. -EINVAL with
 * the reason in d when the layer cannot take that input. */
int layer_init(Layer *l, const LayerSpec *spec, Shape in, Diag *d);

/* Deterministic initialization (PyTorch's default policy: weights and biases
 * uniform in ±1/sqrt(fan_in)) from a generator seeded for this layer.
 * w is (n_params). */
void layer_init_params(const Layer *l, float *w, Rng *r);

/* out is (B, out), inp is (B, in), w is (n_params), saved is (B, saved_bytes),
 * scratch is (scratch_floats). */
void layer_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   void *saved, float *scratch, int B);

/* dinp is (B, in) and may be NULL (first layer of a model: nobody needs it);
 * dw is (n_params) and becomes beta * dw + the gradient: beta 0 overwrites,
 * 1 accumulates, and SGD's momentum mu makes dw the momentum buffer;
 * dout is (B, out); inp, out, w, saved as in the forward pass. */
void layer_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                    const float *inp, const float *out, const float *w, const void *saved,
                    float *scratch, int B, float beta);

/* Per-kind implementations, one file each. */
void linear_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                    int B);
void linear_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                     const float *inp, const float *w, int B, float beta);
void relu_forward(const Ops *ops, float *out, const float *inp, size_t n);
void relu_backward(const Ops *ops, float *dinp, const float *dout, const float *out, size_t n);
void gelu_forward(const Ops *ops, float *out, const float *inp, size_t n);
void gelu_backward(const Ops *ops, float *dinp, const float *dout, const float *inp, size_t n);
void conv2d_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                    float *scratch, int B);
void conv2d_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                     const float *inp, const float *w, float *scratch, int B, float beta);
void maxpool2d_forward(const Layer *l, float *out, const float *inp, int32_t *argmax, int B);
void maxpool2d_backward(const Layer *l, float *dinp, const float *dout, const int32_t *argmax,
                        int B);
