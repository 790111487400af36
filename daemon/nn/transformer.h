/* nn/transformer.h — the layers of a GPT-2 style language model, and the
 * pieces they are made of, as forward/backward pairs in llm.c's order
 * (train_gpt2.c is the reference for the math; the code is our own).
 *
 * A model is one embed layer, any number of blocks, and one lm_head layer;
 * each is one entry of a ModelSpec, so a pipeline cuts between blocks:
 *
 *     embed    (T,1,1) token ids      -> (T,C,1)  wte[id] + wpe[t]
 *     block    (T,C,1)                -> (T,C,1)  x + attn(ln1(x)), then + mlp(ln2(.))
 *     lm_head  (T,C,1)                -> (T,V,1)  lnf(x) W^T, W (V,C), no bias, not
 *                                                 tied to the embedding
 *
 * Ids travel as floats holding exact integers (see layer.h); embed clamps a
 * value outside [0, vocab) into it rather than read out of bounds, so a bad
 * id costs a wrong prediction, never memory safety. The block's MLP uses
 * GELU with the tanh approximation, PyTorch's nn.GELU(approximate='tanh'),
 * as GPT-2 did (the model-spec kind "gelu" stays the exact erf form).
 * LayerNorm's epsilon is 1e-5, PyTorch's default.
 *
 *     ModelSpec m = { .input = { 128, 1, 1 }, .n_classes = 256, .lm = true, .n_layers = 6 };
 *     m.layers[0] = (LayerSpec){ .kind = LAYER_EMBED, .vocab = 256, .out = 128 };
 *     for (int i = 1; i <= 4; i++)
 *             m.layers[i] = (LayerSpec){ .kind = LAYER_BLOCK, .heads = 4 };
 *     m.layers[5] = (LayerSpec){ .kind = LAYER_LM_HEAD, .out = 256 };
 *     Stage *s;
 *     r = stage_new(&m, 0, m.n_layers, seed, &s, &diag);
 *     // trace_input(): (B,T) ids as floats; trace_output(): (B,T,V) logits;
 *     // the loss is softmax_xent() over B*T rows with (B*T) int32 targets.
 *
 * Parameters of one block, in this order in the slab (llm.c's, per layer):
 * ln1w (C), ln1b (C), qkvw (3C,C), qkvb (3C), attprojw (C,C), attprojb (C),
 * ln2w (C), ln2b (C), fcw (4C,C), fcb (4C), fcprojw (C,4C), fcprojb (C).
 * qkv's rows are all heads' queries, then keys, then values, as PyTorch's
 * c_attn splits them. embed: wte (V,C) then wpe (T,C). lm_head: lnfw (C),
 * lnfb (C), then W (V,C).
 */
#pragma once

#include <stddef.h>

#include "layer.h"

#define LAYERNORM_EPS 1e-5f

/* Sizes of the transformer's kinds, for layer_init(). */
size_t block_params(int C);
size_t block_saved_floats(int T, int C, int NH);
size_t block_scratch_floats(int T, int C, int NH);

/* out, inp are (N,C); weight, bias are (C); mean, rstd are (N) and keep the
 * statistics for the backward pass. */
void layernorm_forward(const Ops *ops, float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C);
/* dinp (N,C) becomes resid + the input gradient (resid (N,C) may be NULL for
 * 0, and may be dinp itself); dinp NULL computes only the parameter
 * gradients. dweight, dbias (C) become beta * themselves + the gradient.
 * dout, inp are (N,C); mean, rstd (N) as the forward pass left them. */
void layernorm_backward(const Ops *ops, float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *resid, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C,
                        float beta);

/* The same on rows r0..r1 (columns c0..c1 for the parameters) on the
 * calling thread, for the block's fused jobs. */
void layernorm_forward_range(float *out, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, size_t r0, size_t r1, int C);
void layernorm_backward_range(float *dinp, const float *dout, const float *resid, const float *inp,
                              const float *weight, const float *mean, const float *rstd, size_t r0,
                              size_t r1, int C);
void layernorm_params_backward_range(float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *mean, const float *rstd, int N,
                                     size_t c0, size_t c1, int C, float beta);

/* out = inp weight^T + bias (+ resid): out is (N,OC), inp is (N,C), weight
 * is (OC,C), bias is (OC) or NULL, resid is (N,OC) or NULL. */
void matmul_forward(const Ops *ops, float *out, const float *inp, const float *weight,
                    const float *bias, const float *resid, int N, int C, int OC);
/* dinp (N,C) = dout weight, or skipped when NULL; dweight (OC,C) and dbias
 * (OC, may be NULL) become beta * themselves + the gradient. dout is (N,OC),
 * inp is (N,C). */
void matmul_backward(const Ops *ops, float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int N, int C, int OC, float beta);

/* GELU, tanh approximation (Hendrycks and Gimpel, 2016, section 2; GPT-2):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out, inp are (n); the
 * backward pass reads the forward's input. */
void gelu_tanh_forward(const Ops *ops, float *out, const float *inp, size_t n);
void gelu_tanh_backward(const Ops *ops, float *dinp, const float *dout, const float *inp, size_t n);

/* Causal multi-head self-attention after the QKV projection (Vaswani et
 * al., 2017): per head, softmax(Q K^T / sqrt(hs) + causal mask) V.
 * out is (B,T,C), att is (B,NH,T,T) (the softmax, kept for backward; zero
 * above the diagonal), qkv is (B,T,3C). One task per (sample, head). */
void attention_forward(const Ops *ops, float *out, float *att, const float *qkv, int B, int T,
                       int C, int NH);
/* dqkv is (B,T,3C) (overwritten), dout is (B,T,C), qkv and att as the
 * forward pass left them, scratch is (B,NH,T,T). */
void attention_backward(const Ops *ops, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att, int B, int T, int C, int NH);

/* The layers. out is (B, l->out), inp is (B, l->in), w is (l->n_params),
 * saved is (B, l->saved_bytes), scratch is (l->scratch_floats +
 * B * l->scratch_per_sample), as layer_forward() and layer_backward() pass
 * them. */
void embed_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   int B);
void embed_backward(const Layer *l, const Ops *ops, float *dw, const float *dout, const float *inp,
                    int B, float beta);
void block_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   float *saved, int B);
void block_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                    const float *inp, const float *w, const float *saved, float *scratch, int B,
                    float beta);
void lm_head_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                     float *saved, int B);
void lm_head_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                      const float *inp, const float *w, const float *saved, float *scratch, int B,
                      float beta);
