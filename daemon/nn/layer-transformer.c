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

_simd_clones_ static void gelu_tanh_span(float *restrict out, const float *restrict inp, size_t lo,
                                         size_t hi) {
        for (size_t i = lo; i < hi; i++) {
                float x = inp[i];
                float t = nn_tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
                out[i] = 0.5f * x * (1.0f + t);
        }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2);
 * dinp may be dout itself. */
_simd_clones_ static void gelu_tanh_backward_span(float *dinp, const float *dout,
                                                  const float *restrict inp, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; i++) {
                float x = inp[i];
                float t = nn_tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
                float local = 0.5f * (1.0f + t) +
                              0.5f * x * (1.0f - t * t) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
                dinp[i] = dout[i] * local;
        }
}

static void gelu_tanh_forward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        gelu_tanh_span(e->out, e->a, lo, hi);
}

static void gelu_tanh_backward_range(void *ctx, size_t lo, size_t hi) {
        const Elementwise *e = ctx;
        gelu_tanh_backward_span(e->out, e->a, e->b, lo, hi);
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

/* The block runs as a few jobs of coarse tasks, each split across the
 * compute threads once: every step whose rows depend only on the same rows
 * of the step before (LayerNorm, a matmul's rows, GELU, a residual) runs in
 * the same task, and a weight gradient (a sum over all rows) runs beside
 * the input gradient of another matmul. Three jobs forward, six backward,
 * instead of one per step: on shared cores each job ends by waiting for
 * its slowest thread, and the rows stay in cache from one step to the next. */
#define BLOCK_ROW_TASKS 4
#define BLOCK_COL_TASKS 4

typedef struct BlockJob {
        const Ops *ops;
        BlockParams p, d; /* d: the gradients, same layout */
        BlockActs a;
        BlockGrads g;
        const float *inp, *dout;
        float *out, *dinp;
        int C, BT;
        float beta;
        size_t rows_per; /* rows of one row task */
        int n_rows;      /* row tasks */
} BlockJob;

static BlockJob block_job(const Layer *l, const Ops *ops, int B) {
        int T = l->in.c, BT = B * T;
        BlockJob j = { .ops = ops, .C = l->in.h, .BT = BT };
        j.rows_per = (size_t)(BT + BLOCK_ROW_TASKS - 1) / BLOCK_ROW_TASKS;
        j.n_rows = (int)(((size_t)BT + j.rows_per - 1) / j.rows_per);
        return j;
}

static void task_rows(const BlockJob *j, size_t task, size_t *r0, size_t *r1) {
        *r0 = MIN((size_t)j->BT, task * j->rows_per);
        *r1 = MIN((size_t)j->BT, *r0 + j->rows_per);
}

/* Columns of task k of BLOCK_COL_TASKS over n, on 16-float boundaries. */
static void task_cols(size_t n, size_t k, size_t *c0, size_t *c1) {
        size_t per = ALIGN_TO((n + BLOCK_COL_TASKS - 1) / BLOCK_COL_TASKS, 16);
        *c0 = MIN(n, k * per);
        *c1 = MIN(n, *c0 + per);
}

/* Rows r0..r1 of out (N,OC) = bias (OC) + resid (N,OC, or NULL). */
_simd_clones_ static void fill_rows(float *out, const float *bias, const float *resid, size_t r0,
                                    size_t r1, int OC_) {
        size_t OC = (size_t)OC_;
        for (size_t r = r0; r < r1; r++) {
                float *restrict o = out + r * OC;
                const float *restrict b = bias;
                if (!resid)
                        memcpy(o, b, sizeof(float) * OC);
                else {
                        const float *restrict x = resid + r * OC;
                        for (size_t c = 0; c < OC; c++)
                                o[c] = x[c] + b[c];
                }
        }
}

/* Rows r0..r1 of out (N,OC) += inp (N,C) weight^T, weight (OC,C). */
static void gemm_rows(const Ops *ops, float *out, const float *inp, const float *weight, size_t r0,
                      size_t r1, int C, int OC) {
        if (r1 > r0)
                ops->gemm_serial(false, true, (int)(r1 - r0), OC, C, 1.0f, inp + r0 * (size_t)C, C,
                                 weight, C, 1.0f, out + r0 * (size_t)OC, OC);
}

/* Rows r0..r1 of dinp (N,C) = dout (N,OC) weight, weight (OC,C). */
static void gemm_dinp_rows(const Ops *ops, float *dinp, const float *dout, const float *weight,
                           size_t r0, size_t r1, int C, int OC) {
        if (r1 > r0)
                ops->gemm_serial(false, false, (int)(r1 - r0), C, OC, 1.0f, dout + r0 * (size_t)OC, OC,
                                 weight, C, 0.0f, dinp + r0 * (size_t)C, C);
}

/* Rows o0..o1 of dweight (OC,C) = beta dweight + dout^T inp, and of dbias
 * (OC) = beta dbias + the sum of dout's columns o0..o1; dout (N,OC), inp (N,C). */
_simd_clones_ static void dweight_rows(const Ops *ops, float *dweight, float *dbias,
                                       const float *dout, const float *inp, size_t o0, size_t o1,
                                       int N, int C, int OC, float beta) {
        if (o1 <= o0)
                return;
        ops->gemm_serial(true, false, (int)(o1 - o0), C, N, 1.0f, dout + o0, OC, inp, C, beta,
                         dweight + o0 * (size_t)C, C);
        float *restrict db = dbias;
        if (beta == 0.0f)
                memset(db + o0, 0, sizeof(float) * (o1 - o0));
        else if (beta != 1.0f)
                for (size_t o = o0; o < o1; o++)
                        db[o] *= beta;
        for (size_t r = 0; r < (size_t)N; r++) {
                const float *restrict g = dout + r * (size_t)OC;
                for (size_t o = o0; o < o1; o++)
                        db[o] += g[o];
        }
}

#define D(x) ((float *)j->d.x)

/* ln1, then qkv = ln1 Wqkv^T + bqkv, by rows. */
static void block_forward_qkv(void *ctx, size_t lo, size_t hi) {
        const BlockJob *j = ctx;
        int C = j->C;
        for (size_t task = lo; task < hi; task++) {
                size_t r0, r1;
                task_rows(j, task, &r0, &r1);
                layernorm_forward_range(j->a.ln1, j->a.ln1_mean, j->a.ln1_rstd, j->inp, j->p.ln1w,
                                        j->p.ln1b, r0, r1, C);
                fill_rows(j->a.qkv, j->p.qkvb, NULL, r0, r1, 3 * C);
                gemm_rows(j->ops, j->a.qkv, j->a.ln1, j->p.qkvw, r0, r1, C, 3 * C);
        }
}

/* Everything after attention, by rows: res2 = inp + atty Wproj^T + bproj,
 * ln2, fch = ln2 Wfc^T + bfc, GELU, out = res2 + gelu Wfcproj^T + bfcproj. */
static void block_forward_mlp(void *ctx, size_t lo, size_t hi) {
        const BlockJob *j = ctx;
        const BlockActs *a = &j->a;
        int C = j->C;
        for (size_t task = lo; task < hi; task++) {
                size_t r0, r1;
                task_rows(j, task, &r0, &r1);
                fill_rows(a->res2, j->p.attprojb, j->inp, r0, r1, C);
                gemm_rows(j->ops, a->res2, a->atty, j->p.attprojw, r0, r1, C, C);
                layernorm_forward_range(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, j->p.ln2w, j->p.ln2b,
                                        r0, r1, C);
                fill_rows(a->fch, j->p.fcb, NULL, r0, r1, 4 * C);
                gemm_rows(j->ops, a->fch, a->ln2, j->p.fcw, r0, r1, C, 4 * C);
                gelu_tanh_span(a->fch_gelu, a->fch, r0 * 4 * (size_t)C, r1 * 4 * (size_t)C);
                fill_rows(j->out, j->p.fcprojb, a->res2, r0, r1, C);
                gemm_rows(j->ops, j->out, a->fch_gelu, j->p.fcprojw, r0, r1, 4 * C, C);
        }
}

void block_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   float *saved, int B) {
        /* out is (B,T,C), inp is (B,T,C), w is the block's parameters,
         * saved is (B, block_saved_floats) */
        int T = l->in.c, C = l->in.h, NH = l->spec.heads;
        BlockJob j = block_job(l, ops, B);
        j.p = block_params_at(w, (size_t)C);
        j.a = block_acts_at(saved, (size_t)B, (size_t)T, (size_t)C, (size_t)NH);
        j.inp = inp;
        j.out = out;

        ops->parallel((size_t)j.n_rows, 1, block_forward_qkv, &j);
        attention_forward(ops, j.a.atty, j.a.att, j.a.qkv, B, T, C, NH);
        ops->parallel((size_t)j.n_rows, 1, block_forward_mlp, &j);
}

/* dWfcproj and dbfcproj beside dfch = (dout Wfcproj) * gelu'(fch) by rows. */
static void block_backward_fcproj(void *ctx, size_t lo, size_t hi) {
        const BlockJob *j = ctx;
        int C = j->C;
        for (size_t task = lo; task < hi; task++) {
                size_t r0, r1, o0, o1;
                if (task < BLOCK_COL_TASKS) {
                        task_cols((size_t)C, task, &o0, &o1);
                        dweight_rows(j->ops, D(fcprojw), D(fcprojb), j->dout, j->a.fch_gelu, o0, o1,
                                     j->BT, 4 * C, C, j->beta);
                        continue;
                }
                task_rows(j, task - BLOCK_COL_TASKS, &r0, &r1);
                gemm_dinp_rows(j->ops, j->g.dfch, j->dout, j->p.fcprojw, r0, r1, 4 * C, C);
                gelu_tanh_backward_span(j->g.dfch, j->g.dfch, j->a.fch, r0 * 4 * (size_t)C,
                                        r1 * 4 * (size_t)C);
        }
}

/* dWfc and dbfc beside dln2 = dfch Wfc and dres2 = dout + ln2's input
 * gradient, by rows. */
static void block_backward_fc(void *ctx, size_t lo, size_t hi) {
        const BlockJob *j = ctx;
        int C = j->C;
        for (size_t task = lo; task < hi; task++) {
                size_t r0, r1, o0, o1;
                if (task < BLOCK_COL_TASKS) {
                        task_cols(4 * (size_t)C, task, &o0, &o1);
                        dweight_rows(j->ops, D(fcw), D(fcb), j->g.dfch, j->a.ln2, o0, o1, j->BT, C,
                                     4 * C, j->beta);
                        continue;
                }
                task_rows(j, task - BLOCK_COL_TASKS, &r0, &r1);
                gemm_dinp_rows(j->ops, j->g.dln, j->g.dfch, j->p.fcw, r0, r1, C, 4 * C);
                layernorm_backward_range(j->g.dres2, j->g.dln, j->dout, j->a.res2, j->p.ln2w,
                                         j->a.ln2_mean, j->a.ln2_rstd, r0, r1, C);
        }
}

/* dWattproj and dbattproj, datty = dres2 Wattproj by rows, and ln2's
 * parameter gradients by columns. */
static void block_backward_attproj(void *ctx, size_t lo, size_t hi) {
        const BlockJob *j = ctx;
        int C = j->C;
        for (size_t task = lo; task < hi; task++) {
                size_t r0, r1, o0, o1;
                if (task < BLOCK_COL_TASKS) {
                        task_cols((size_t)C, task, &o0, &o1);
                        dweight_rows(j->ops, D(attprojw), D(attprojb), j->g.dres2, j->a.atty, o0, o1,
                                     j->BT, C, C, j->beta);
                } else if (task < BLOCK_COL_TASKS + (size_t)j->n_rows) {
                        task_rows(j, task - BLOCK_COL_TASKS, &r0, &r1);
                        gemm_dinp_rows(j->ops, j->g.datty, j->g.dres2, j->p.attprojw, r0, r1, C, C);
                } else {
                        task_cols((size_t)C, task - BLOCK_COL_TASKS - (size_t)j->n_rows, &o0, &o1);
                        if (o1 > o0)
                                layernorm_params_backward_range(D(ln2w), D(ln2b), j->g.dln, j->a.res2,
                                                                j->a.ln2_mean, j->a.ln2_rstd, j->BT,
                                                                o0, o1, C, j->beta);
                }
        }
}

/* dWqkv and dbqkv beside dln1 = dqkv Wqkv and dinp = dres2 + ln1's input
 * gradient, by rows. */
static void block_backward_qkv(void *ctx, size_t lo, size_t hi) {
        const BlockJob *j = ctx;
        int C = j->C;
        for (size_t task = lo; task < hi; task++) {
                size_t r0, r1, o0, o1;
                if (task < BLOCK_COL_TASKS) {
                        task_cols(3 * (size_t)C, task, &o0, &o1);
                        dweight_rows(j->ops, D(qkvw), D(qkvb), j->g.dqkv, j->a.ln1, o0, o1, j->BT, C,
                                     3 * C, j->beta);
                        continue;
                }
                task_rows(j, task - BLOCK_COL_TASKS, &r0, &r1);
                gemm_dinp_rows(j->ops, j->g.dln, j->g.dqkv, j->p.qkvw, r0, r1, C, 3 * C);
                if (j->dinp)
                        layernorm_backward_range(j->dinp, j->g.dln, j->g.dres2, j->inp, j->p.ln1w,
                                                 j->a.ln1_mean, j->a.ln1_rstd, r0, r1, C);
        }
}

/* ln1's parameter gradients, by columns. */
static void block_backward_ln1(void *ctx, size_t lo, size_t hi) {
        const BlockJob *j = ctx;
        for (size_t task = lo; task < hi; task++) {
                size_t o0, o1;
                task_cols((size_t)j->C, task, &o0, &o1);
                if (o1 > o0)
                        layernorm_params_backward_range(D(ln1w), D(ln1b), j->g.dln, j->inp, j->a.ln1_mean,
                                                        j->a.ln1_rstd, j->BT, o0, o1, j->C, j->beta);
        }
}

#undef D

void block_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                    const float *inp, const float *w, const float *saved, float *scratch, int B,
                    float beta) {
        /* dinp is (B,T,C) or NULL, dw is the block's gradients, dout is (B,T,C),
         * inp is (B,T,C), w the parameters, saved as the forward pass left it,
         * scratch is (B, block_scratch_floats) */
        int T = l->in.c, C = l->in.h, NH = l->spec.heads;
        BlockJob j = block_job(l, ops, B);
        j.p = block_params_at(w, (size_t)C);
        j.d = block_params_at(dw, (size_t)C);
        j.a = block_acts_at((float *)saved, (size_t)B, (size_t)T, (size_t)C, (size_t)NH);
        j.g = block_grads_at(scratch, (size_t)B, (size_t)T, (size_t)C);
        j.inp = inp;
        j.dout = dout;
        j.dinp = dinp;
        j.beta = beta;
        size_t matmul_tasks = BLOCK_COL_TASKS + (size_t)j.n_rows;

        /* the MLP; its residual passes dout straight to res2 */
        ops->parallel(matmul_tasks, 1, block_backward_fcproj, &j);
        ops->parallel(matmul_tasks, 1, block_backward_fc, &j);
        /* attention; its residual passes dres2 straight to inp */
        ops->parallel(matmul_tasks + BLOCK_COL_TASKS, 1, block_backward_attproj, &j);
        attention_backward(ops, j.g.dqkv, j.g.datt, j.g.datty, j.a.qkv, j.a.att, B, T, C, NH);
        ops->parallel(matmul_tasks, 1, block_backward_qkv, &j);
        ops->parallel(BLOCK_COL_TASKS, 1, block_backward_ln1, &j);
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
