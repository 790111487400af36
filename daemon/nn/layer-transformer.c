/* nn/layer-transformer.c — the embedding, the pre-LN block and the LM head
 * (see transformer.h), in llm.c's order: each forward pass calls one
 * function per step, each backward pass the same steps in reverse. */
#include <math.h>
#include <string.h>

#include "nn-math.h"
#include "transformer.h"

/* ---- GELU, tanh approximation -------------------------------------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBE 0.044715f
#define ELEMENTWISE_GRAIN 4096

typedef struct Elementwise {
        float *out;
        const float *a, *b;
} Elementwise;

_simd_clones_ static void gelu_tanh_forward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        float *restrict out = e->out;
        const float *restrict inp = e->a;
        for (size_t i = lo; i < hi; i++) {
                float x = inp[i];
                float t = nn_tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
                out[i] = 0.5f * x * (1.0f + t);
        }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2) */
_simd_clones_ static void gelu_tanh_backward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        float *restrict dinp = e->out;
        const float *restrict dout = e->a, *restrict inp = e->b;
        for (size_t i = lo; i < hi; i++) {
                float x = inp[i];
                float t = nn_tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
                float local = 0.5f * (1.0f + t) +
                              0.5f * x * (1.0f - t * t) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
                dinp[i] = dout[i] * local;
        }
}

void gelu_tanh_forward(const Ops *ops, float *out, const float *inp, size_t n) {
        Elementwise e = { out, inp, NULL };
        ops->parallel(n, ELEMENTWISE_GRAIN, gelu_tanh_forward_range, &e);
}

void gelu_tanh_backward(const Ops *ops, float *dinp, const float *dout, const float *inp, size_t n) {
        Elementwise e = { dinp, dout, inp };
        ops->parallel(n, ELEMENTWISE_GRAIN, gelu_tanh_backward_range, &e);
}

/* ---- embedding ----------------------------------------------------------- */

typedef struct EmbedArgs {
        float *out, *dw;
        const float *inp, *w, *dout;
        int B, T, C, V;
        float beta;
} EmbedArgs;

/* The id an input float stands for, clamped into [0, V): NaN and values
 * out of range (a corrupt batch) never index outside wte. */
static inline int embed_id(float x, int V) {
        if (!(x >= 0.0f))
                return 0;
        return x >= (float)V ? V - 1 : (int)x;
}

static void embed_forward_rows(void *ctx, size_t lo, size_t hi) {
        const EmbedArgs *a = ctx;
        size_t C = (size_t)a->C;
        const float *wpe = a->w + (size_t)a->V * C;
        for (size_t bt = lo; bt < hi; bt++) {
                size_t t = bt % (size_t)a->T;
                const float *restrict te = a->w + (size_t)embed_id(a->inp[bt], a->V) * C;
                const float *restrict pe = wpe + t * C;
                float *restrict o = a->out + bt * C;
                for (size_t c = 0; c < C; c++)
                        o[c] = te[c] + pe[c];
        }
}

void embed_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   int B) {
        /* out is (B,T,C), inp is (B,T) ids as floats, w is wte (V,C) then wpe (T,C) */
        EmbedArgs a = { .out = out, .inp = inp, .w = w, .B = B, .T = l->in.c, .C = l->out.h,
                        .V = l->spec.vocab };
        ops->parallel((size_t)B * a.T, MAX(1, 8192 / a.C), embed_forward_rows, &a);
}

/* Columns lo..hi of dwte and dwpe: each thread adds into its own columns. */
_simd_clones_ static void embed_backward_columns(void *ctx, size_t lo, size_t hi) {
        const EmbedArgs *a = ctx;
        size_t C = (size_t)a->C, T = (size_t)a->T, V = (size_t)a->V;
        float *dwte = a->dw, *dwpe = a->dw + V * C;
        for (size_t r = 0; r < V + T; r++) {
                float *restrict d = a->dw + r * C;
                if (a->beta == 0.0f)
                        memset(d + lo, 0, sizeof(float) * (hi - lo));
                else if (a->beta != 1.0f)
                        for (size_t c = lo; c < hi; c++)
                                d[c] *= a->beta;
        }
        for (size_t bt = 0; bt < (size_t)a->B * T; bt++) {
                const float *restrict g = a->dout + bt * C;
                float *restrict te = dwte + (size_t)embed_id(a->inp[bt], a->V) * C;
                float *restrict pe = dwpe + (bt % T) * C;
                for (size_t c = lo; c < hi; c++) {
                        te[c] += g[c];
                        pe[c] += g[c];
                }
        }
}

void embed_backward(const Layer *l, const Ops *ops, float *dw, const float *dout, const float *inp,
                    int B, float beta) {
        /* dw is dwte (V,C) then dwpe (T,C), dout is (B,T,C), inp is (B,T) ids;
         * the ids have no gradient */
        EmbedArgs a = { .dw = dw, .dout = dout, .inp = inp, .B = B, .T = l->in.c, .C = l->out.h,
                        .V = l->spec.vocab, .beta = beta };
        ops->parallel((size_t)a.C, 16, embed_backward_columns, &a);
}

/* ---- the block ----------------------------------------------------------- */

typedef struct BlockParams {
        const float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
        const float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} BlockParams;

/* Named pointers into a block's slice of the slab (w or dw). */
static BlockParams block_params_at(const float *w, size_t C) {
        BlockParams p;
        p.ln1w = w;
        p.ln1b = p.ln1w + C;
        p.qkvw = p.ln1b + C;
        p.qkvb = p.qkvw + 3 * C * C;
        p.attprojw = p.qkvb + 3 * C;
        p.attprojb = p.attprojw + C * C;
        p.ln2w = p.attprojb + C;
        p.ln2b = p.ln2w + C;
        p.fcw = p.ln2b + C;
        p.fcb = p.fcw + 4 * C * C;
        p.fcprojw = p.fcb + 4 * C;
        p.fcprojb = p.fcprojw + 4 * C * C;
        return p;
}

size_t block_params(int C) {
        return 12 * (size_t)C * C + 13 * (size_t)C;
}

/* What the forward pass keeps for the backward pass, each (B, ...) whole so
 * that a gemm runs over all B*T rows at once. */
typedef struct BlockActs {
        float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T), (B,T) */
        float *qkv;                       /* (B,T,3C) */
        float *atty;                      /* (B,T,C) attention's output, before the projection */
        float *att;                       /* (B,NH,T,T) softmax */
        float *res2;                      /* (B,T,C) inp + attention */
        float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T), (B,T) */
        float *fch, *fch_gelu;            /* (B,T,4C) each */
} BlockActs;

size_t block_saved_floats(int T, int C, int NH) {
        return (size_t)T * (15 * (size_t)C + 4) + (size_t)NH * T * T;
}

static BlockActs block_acts_at(float *s, size_t B, size_t T, size_t C, size_t NH) {
        size_t BT = B * T;
        BlockActs a;
        a.ln1 = s;
        a.ln1_mean = a.ln1 + BT * C;
        a.ln1_rstd = a.ln1_mean + BT;
        a.qkv = a.ln1_rstd + BT;
        a.atty = a.qkv + BT * 3 * C;
        a.att = a.atty + BT * C;
        a.res2 = a.att + B * NH * T * T;
        a.ln2 = a.res2 + BT * C;
        a.ln2_mean = a.ln2 + BT * C;
        a.ln2_rstd = a.ln2_mean + BT;
        a.fch = a.ln2_rstd + BT;
        a.fch_gelu = a.fch + BT * 4 * C;
        return a;
}

/* The backward pass's gradients of the activations, in the trace's scratch. */
typedef struct BlockGrads {
        float *dres2, *dln, *datty; /* (B,T,C) each; dln serves ln2, then ln1 */
        float *dqkv;                /* (B,T,3C) */
        float *dfch;                /* (B,T,4C) */
        float *datt;                /* (B,NH,T,T) */
} BlockGrads;

size_t block_scratch_floats(int T, int C, int NH) {
        return 10 * (size_t)T * C + (size_t)NH * T * T;
}

static BlockGrads block_grads_at(float *s, size_t B, size_t T, size_t C) {
        size_t BT = B * T;
        BlockGrads g;
        g.dres2 = s;
        g.dln = g.dres2 + BT * C;
        g.datty = g.dln + BT * C;
        g.dqkv = g.datty + BT * C;
        g.dfch = g.dqkv + BT * 3 * C;
        g.datt = g.dfch + BT * 4 * C;
        return g;
}

void block_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   float *saved, int B) {
        /* out is (B,T,C), inp is (B,T,C), w is the block's parameters,
         * saved is (B, block_saved_floats) */
        int T = l->in.c, C = l->in.h, NH = l->spec.heads, BT = B * T;
        BlockParams p = block_params_at(w, (size_t)C);
        BlockActs a = block_acts_at(saved, (size_t)B, (size_t)T, (size_t)C, (size_t)NH);

        layernorm_forward(ops, a.ln1, a.ln1_mean, a.ln1_rstd, inp, p.ln1w, p.ln1b, BT, C);
        matmul_forward(ops, a.qkv, a.ln1, p.qkvw, p.qkvb, NULL, BT, C, 3 * C);
        attention_forward(ops, a.atty, a.att, a.qkv, B, T, C, NH);
        matmul_forward(ops, a.res2, a.atty, p.attprojw, p.attprojb, inp, BT, C, C);
        layernorm_forward(ops, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, BT, C);
        matmul_forward(ops, a.fch, a.ln2, p.fcw, p.fcb, NULL, BT, C, 4 * C);
        gelu_tanh_forward(ops, a.fch_gelu, a.fch, (size_t)BT * 4 * C);
        matmul_forward(ops, out, a.fch_gelu, p.fcprojw, p.fcprojb, a.res2, BT, 4 * C, C);
}

void block_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                    const float *inp, const float *w, const float *saved, float *scratch, int B,
                    float beta) {
        /* dinp is (B,T,C) or NULL, dw is the block's gradients, dout is (B,T,C),
         * inp is (B,T,C), w the parameters, saved as the forward pass left it,
         * scratch is (B, block_scratch_floats) */
        int T = l->in.c, C = l->in.h, NH = l->spec.heads, BT = B * T;
        BlockParams p = block_params_at(w, (size_t)C), d = block_params_at(dw, (size_t)C);
        BlockActs a = block_acts_at((float *)saved, (size_t)B, (size_t)T, (size_t)C, (size_t)NH);
        BlockGrads g = block_grads_at(scratch, (size_t)B, (size_t)T, (size_t)C);
#define D(x) ((float *)d.x)

        /* the MLP; its residual passes dout straight to res2 */
        matmul_backward(ops, g.dfch, D(fcprojw), D(fcprojb), dout, a.fch_gelu, p.fcprojw, BT, 4 * C,
                        C, beta);
        gelu_tanh_backward(ops, g.dfch, g.dfch, a.fch, (size_t)BT * 4 * C);
        matmul_backward(ops, g.dln, D(fcw), D(fcb), g.dfch, a.ln2, p.fcw, BT, C, 4 * C, beta);
        layernorm_backward(ops, g.dres2, D(ln2w), D(ln2b), g.dln, dout, a.res2, p.ln2w, a.ln2_mean,
                           a.ln2_rstd, BT, C, beta);
        /* attention; its residual passes dres2 straight to inp */
        matmul_backward(ops, g.datty, D(attprojw), D(attprojb), g.dres2, a.atty, p.attprojw, BT, C,
                        C, beta);
        attention_backward(ops, g.dqkv, g.datt, g.datty, a.qkv, a.att, B, T, C, NH);
        matmul_backward(ops, g.dln, D(qkvw), D(qkvb), g.dqkv, a.ln1, p.qkvw, BT, C, 3 * C, beta);
        layernorm_backward(ops, dinp, D(ln1w), D(ln1b), g.dln, g.dres2, inp, p.ln1w, a.ln1_mean,
                           a.ln1_rstd, BT, C, beta);
#undef D
}

/* ---- the head ------------------------------------------------------------ */

void lm_head_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                     float *saved, int B) {
        /* out is (B,T,V), inp is (B,T,C), w is lnfw (C), lnfb (C), W (V,C),
         * saved is lnf (B,T,C), mean (B,T), rstd (B,T) */
        int T = l->in.c, C = l->in.h, V = l->out.h, BT = B * T;
        float *ln = saved, *mean = ln + (size_t)BT * C, *rstd = mean + BT;

        layernorm_forward(ops, ln, mean, rstd, inp, w, w + C, BT, C);
        matmul_forward(ops, out, ln, w + 2 * (size_t)C, NULL, NULL, BT, C, V);
}

void lm_head_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                      const float *inp, const float *w, const float *saved, float *scratch, int B,
                      float beta) {
        /* dinp is (B,T,C) or NULL, dw as w, dout is (B,T,V), inp is (B,T,C),
         * saved as the forward pass left it, scratch is dln (B,T,C) */
        int T = l->in.c, C = l->in.h, V = l->out.h, BT = B * T;
        const float *ln = saved, *mean = ln + (size_t)BT * C, *rstd = mean + BT;

        matmul_backward(ops, scratch, dw + 2 * (size_t)C, NULL, dout, ln, w + 2 * (size_t)C, BT, C, V,
                        beta);
        layernorm_backward(ops, dinp, dw, dw + C, scratch, NULL, inp, w, mean, rstd, BT, C, beta);
}
