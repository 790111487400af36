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
 * A language model's activations are a sequence of T vectors of C features,
 * row-major (T,C) per sample: Shape (T,C,1), c the position and h the
 * feature, so a batch is llm.c's (B,T,C). Its input is T token ids, Shape
 * (T,1,1), that travel as floats holding exact integers (every id below 2^24
 * is exact in a float; vocabularies are far smaller): the stage's input
 * buffer stays a float buffer like any other. The transformer's kinds
 * (embed, block, lm_head) are declared in nn/transformer.h.
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
        LAYER_EMBED,   /* token + learned position embedding: (T,1,1) ids -> (T,C,1) */
        LAYER_BLOCK,   /* pre-LN transformer block: (T,C,1) -> (T,C,1) */
        LAYER_LM_HEAD, /* final LayerNorm + linear to the vocabulary: (T,C,1) -> (T,V,1) */
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
        int vocab;   /* embed: token ids are below vocab (out is the width C) */
        int heads;   /* block: attention heads, dividing C */
} LayerSpec;

typedef struct Layer {
        LayerKind kind;
        LayerSpec spec;
        Shape in, out;          /* per sample */
        size_t n_params;        /* floats of this layer in the slab */
        size_t param_offset;    /* where they start in the stage slab */
        size_t saved_bytes;     /* per sample, kept from forward to backward */
        size_t scratch_floats;  /* per call, for im2col and the like */
        size_t scratch_per_sample; /* floats per sample on top of scratch_floats: a
                                    * block's backward keeps (B,T,..) gradients there */
        size_t fan_in;          /* for initialization */
        int model_blocks;       /* blocks in the whole model (model_spec_check fills it):
                                 * GPT-2 scales residual projections by 1/sqrt(2 blocks) */
} Layer;

const char *layer_kind_to_string(LayerKind k);
LayerKind layer_kind_from_string(const char *s);

/* Check a spec against its input shape and fill in the layer. -EINVAL with
 * the reason in d when the layer cannot take that input. */
int layer_init(Layer *l, const LayerSpec *spec, Shape in, Diag *d);

/* Deterministic initialization from a generator seeded for this layer.
 * w is (n_params). Linear and conv2d: PyTorch's default policy, weights and
 * biases uniform in ±1/sqrt(fan_in). The transformer's kinds: GPT-2's (as
 * llm.c and nanoGPT): every weight matrix and both embeddings normal with
 * std 0.02, the two residual projections of a block (attention's output and
 * the MLP's second linear) with std 0.02/sqrt(2 * model_blocks), biases 0,
 * LayerNorm weights 1 and biases 0. The normal draws are Marsaglia's polar
 * method on a log computed here with + * / only, so they are bit-identical
 * on every IEEE machine like the uniform ones. */
void layer_init_params(const Layer *l, float *w, Rng *r);

/* Floating-point operations of one sample through the layer's forward pass
 * (a multiply-add is 2). The backward pass costs about twice as much. A
 * block counts its causal attention, 2 T^2 C multiply-adds for QK^T and AV
 * over the lower triangle, so a partitioner sees attention grow with T^2. */
double layer_forward_flops(const Layer *l);

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
