/* nn/stage.h — a contiguous run of a model's layers with its parameter slab.
 *
 * A model is a list of layers; a cluster cuts it into stages, one per node.
 * A Stage owns three slabs, each one contiguous block of floats: parameters,
 * gradients, and (through its Optim) optimizer state. These blocks are what
 * averaging sends and checkpoints write, as they are.
 *
 * Parameters are initialized layer by layer from (seed, layer index), so the
 * same model gives bit-identical weights however it is cut into stages.
 *
 * A Trace holds one micro-batch's activations through the stage. Several
 * traces can be in flight at once; forward and backward take the parameter
 * version to use, which is how weight stashing plugs in.
 *
 *     Stage *s;  Trace *t;
 *     stage_new(&spec, 0, spec.n_layers, seed, &s, &diag);
 *     trace_new(s, 128, &t);
 *     fill trace_input(t) with (B, in)
 *     stage_forward(s, &ops_blas, s->params, t, B);     // output: trace_output(t)
 *     stage_backward(s, &ops_blas, s->params, t, dout, NULL, s->grads, B, 0.0f, NULL, NULL);
 */
#pragma once

#include "layer.h"
#include "optim.h"
#include "tensor/arena.h"

#define MODEL_MAX_LAYERS 256

typedef struct ModelSpec {
        Shape input;   /* per sample, e.g. (1,28,28); a language model's is (T,1,1) */
        int n_classes; /* the last layer's output width; a language model's vocabulary */
        /* A language model (see nn/transformer.h): a sample is T token ids,
         * (T,1,1) as floats, the output is (T,n_classes,1), one prediction
         * per position, and a sample's label is T target ids, so a batch of
         * B samples has B*T labels and the loss is softmax_xent() over B*T
         * rows of n_classes. */
        bool lm;
        int n_layers;
        LayerSpec layers[MODEL_MAX_LAYERS];
} ModelSpec;

/* Infer and check the shapes of the whole model: every layer must accept
 * its input and the last must produce (n_classes,1,1), or (T,n_classes,1)
 * for a language model, whose first layer must be embed. ret_layers, when not
 * NULL, receives n_layers initialized layers. On error d names the layer. */
int model_spec_check(const ModelSpec *m, Layer *ret_layers, Diag *d);
/* Labels per sample: T for a language model, else 1. The rows the loss
 * sees are B * this, each n_classes wide. */
static inline int model_spec_labels_per_sample(const ModelSpec *m) {
        return m->lm ? m->input.c : 1;
}
/* Total parameter count of layers [lo, hi). */
size_t model_spec_params(const ModelSpec *m, int lo, int hi);

typedef struct Stage {
        Arena *arena;
        int first_layer; /* index of layers[0] in the model */
        int n_layers;
        Layer *layers;
        Shape in, out;
        size_t n_params;
        float *params; /* slab (n_params) */
        float *grads;  /* slab (n_params) */
        size_t scratch_floats;     /* per call, the most any layer needs */
        size_t scratch_per_sample; /* and per sample, likewise */
} Stage;

/* Layers [lo, hi) of m, parameters initialized from seed. */
int stage_new(const ModelSpec *m, int lo, int hi, uint64_t seed, Stage **ret, Diag *d);
Stage *stage_free(Stage *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Stage *, stage_free);

/* Initialize layer i of the model (index in the model, not the stage). */
void stage_init_layer_params(const Layer *l, int model_index, float *w, uint64_t seed);

typedef struct Trace {
        int max_batch;
        int n_layers;
        float **acts;  /* n_layers + 1: acts[0] input, acts[i+1] output of layer i */
        void **saved;  /* n_layers: per-layer forward state (maxpool argmax, a block's
                        * activations for its backward pass) */
        float *scratch; /* scratch_floats + max_batch * scratch_per_sample, shared by the layers */
        float *dbuf[2]; /* gradient ping-pong between layers */
} Trace;

/* Buffers for micro-batches of up to max_batch samples through s, taken from
 * s's arena (they live as long as the stage). */
int trace_new(Stage *s, int max_batch, Trace **ret);
static inline float *trace_input(Trace *t) {
        return t->acts[0];
}
static inline float *trace_output(Trace *t) {
        return t->acts[t->n_layers];
}
/* Bytes of activation memory one trace of max_batch samples takes. */
size_t trace_bytes(const Stage *s, int max_batch);
/* The same for the whole model trained as one stage, from its layers'
 * shapes (nothing allocated); 0 for a model that does not check. */
size_t model_trace_bytes(const ModelSpec *m, int max_batch);

/* Forward trace_input(t) (B, in) through the stage with parameter version w
 * (n_params); the output lands in trace_output(t) (B, out). */
void stage_forward(const Stage *s, const Ops *ops, const float *w, Trace *t, int B);

/* Called as soon as the gradient of a layer's parameters, dw[offset,
 * offset + n), is complete, while the backward pass goes on to earlier
 * layers. Updating those parameters right then is safe (no earlier layer
 * reads them) and finds the gradient still in cache. */
typedef void (*StageGradFn)(void *userdata, size_t offset, size_t n);

/* Backward from dout (B, out) through the activations of t, with the same
 * parameter version w the forward pass used. dw (n_params) becomes
 * beta * dw + the gradient (beta 0: overwrite; 1: accumulate). dinp (B, in) receives the
 * gradient for the previous stage; NULL skips that work. on_grad, when not
 * NULL, hears of each layer's finished gradient. */
void stage_backward(const Stage *s, const Ops *ops, const float *w, Trace *t, const float *dout,
                    float *dinp, float *dw, int B, float beta, StageGradFn on_grad, void *userdata);
