/* nn/layer.c — shape inference, initialization and dispatch. */
#include "layer.h"

#include <math.h>
#include <string.h>

#include "transformer.h"

static const char *const kind_names[_LAYER_KIND_MAX] = {
        [LAYER_LINEAR] = "linear",     [LAYER_RELU] = "relu",
        [LAYER_GELU] = "gelu",         [LAYER_CONV2D] = "conv2d",
        [LAYER_MAXPOOL2D] = "maxpool2d", [LAYER_FLATTEN] = "flatten",
        [LAYER_EMBED] = "embed",       [LAYER_BLOCK] = "block",
        [LAYER_LM_HEAD] = "lm_head",
};

DEFINE_STRING_TABLE_LOOKUP(layer_kind, LayerKind, kind_names, _LAYER_KIND_MAX, _LAYER_KIND_INVALID)

/* Limits that keep every size product far from overflow. */
#define LAYER_MAX_DIM (1 << 16)
#define LAYER_MAX_NUMEL ((size_t)1 << 28)

/* Each kind's shapes, sizes and checks (layer_init()). */
static int init_conv2d(Layer *n, const LayerSpec *spec, Shape in, Diag *d) {
        int k = spec->kernel, s = spec->stride ? spec->stride : 1, p = spec->padding;
        if (spec->out <= 0 || spec->out > LAYER_MAX_DIM)
                return diag_set(d, -EINVAL, "conv2d: out must be in 1..%d, got %d",
                                LAYER_MAX_DIM, spec->out);
        if (k <= 0 || k > 15 || s <= 0 || s > 15 || p < 0 || p >= k)
                return diag_set(d, -EINVAL,
                                "conv2d: need 1 <= kernel <= 15, 1 <= stride <= 15, 0 <= padding < kernel (got %d, %d, %d)",
                                k, s, p);
        if (in.h + 2 * p < k || in.w + 2 * p < k)
                return diag_set(d, -EINVAL, "conv2d: kernel %d is larger than the input %dx%d",
                                k, in.h, in.w);
        n->spec.stride = s;
        n->out = (Shape){ spec->out, (in.h + 2 * p - k) / s + 1, (in.w + 2 * p - k) / s + 1 };
        n->fan_in = (size_t)in.c * (size_t)k * (size_t)k;
        n->n_params = (size_t)spec->out * n->fan_in + (size_t)spec->out;
        /* im2col columns and their gradient: (C*K*K, OH*OW) each */
        n->scratch_floats = 2 * n->fan_in * (size_t)n->out.h * (size_t)n->out.w;
        return 0;
}

static int init_maxpool2d(Layer *n, const LayerSpec *spec, Shape in, Diag *d) {
        int k = spec->kernel, s = spec->stride ? spec->stride : spec->kernel;
        if (k <= 0 || k > 15 || s <= 0 || s > 15)
                return diag_set(d, -EINVAL,
                                "maxpool2d: need 1 <= kernel <= 15 and 1 <= stride <= 15 (got %d, %d)",
                                k, s);
        if (in.h < k || in.w < k)
                return diag_set(d, -EINVAL, "maxpool2d: kernel %d is larger than the input %dx%d",
                                k, in.h, in.w);
        n->spec.stride = s;
        n->out = (Shape){ in.c, (in.h - k) / s + 1, (in.w - k) / s + 1 };
        n->saved_bytes = shape_numel(n->out) * sizeof(int32_t);
        return 0;
}

static int init_embed(Layer *n, const LayerSpec *spec, Shape in, Diag *d) {
        int T = in.c, C = spec->out, V = spec->vocab;
        if (in.h != 1 || in.w != 1)
                return diag_set(d, -EINVAL,
                                "embed takes T token ids, shape (T,1,1), got (%d,%d,%d)", in.c,
                                in.h, in.w);
        /* ids travel as floats: every integer below 2^24 is exact */
        if (V < 2 || V > (1 << 24))
                return diag_set(d, -EINVAL, "embed: vocab must be in 2..%d, got %d", 1 << 24, V);
        if (C <= 0 || C > LAYER_MAX_DIM || T > LAYER_MAX_DIM)
                return diag_set(d, -EINVAL, "embed: out (the width) must be in 1..%d, got %d",
                                LAYER_MAX_DIM, C);
        n->out = (Shape){ T, C, 1 };
        n->n_params = ((size_t)V + (size_t)T) * (size_t)C;
        return 0;
}

static int init_block(Layer *n, const LayerSpec *spec, Shape in, Diag *d) {
        int T = in.c, C = in.h, NH = spec->heads;
        if (in.w != 1 || in.h < 2)
                return diag_set(d, -EINVAL,
                                "block takes a sequence (T,C,1) from embed or a block, got (%d,%d,%d)",
                                in.c, in.h, in.w);
        if (NH <= 0 || C % NH != 0)
                return diag_set(d, -EINVAL, "block: heads must divide the width %d, got %d", C, NH);
        if (T > LAYER_MAX_DIM / 4 || C > LAYER_MAX_DIM / 4)
                return diag_set(d, -E2BIG, "block: context %d or width %d is too large", T, C);
        n->out = in;
        n->n_params = block_params(C);
        n->saved_bytes = block_saved_floats(T, C, NH) * sizeof(float);
        n->scratch_per_sample = block_scratch_floats(T, C, NH);
        return 0;
}

static int init_lm_head(Layer *n, const LayerSpec *spec, Shape in, Diag *d) {
        int T = in.c, C = in.h, V = spec->out;
        if (in.w != 1)
                return diag_set(d, -EINVAL, "lm_head takes a sequence (T,C,1), got (%d,%d,%d)",
                                in.c, in.h, in.w);
        if (V < 2 || V > LAYER_MAX_DIM)
                return diag_set(d, -EINVAL, "lm_head: out (the vocabulary) must be in 2..%d, got %d",
                                LAYER_MAX_DIM, V);
        n->out = (Shape){ T, V, 1 };
        n->n_params = 2 * (size_t)C + (size_t)V * C;
        n->saved_bytes = (size_t)T * ((size_t)C + 2) * sizeof(float);
        n->scratch_per_sample = (size_t)T * C;
        return 0;
}

int layer_init(Layer *l, const LayerSpec *spec, Shape in, Diag *d) {
        Layer n = { .kind = spec->kind, .spec = *spec, .in = in };
        int r = 0;

        if (in.c <= 0 || in.h <= 0 || in.w <= 0 || shape_numel(in) > LAYER_MAX_NUMEL)
                return diag_set(d, -EINVAL, "input shape (%d,%d,%d) is out of range", in.c, in.h,
                                in.w);

        switch (spec->kind) {
        case LAYER_LINEAR: {
                size_t fan_in = shape_numel(in);
                if (in.h != 1 || in.w != 1)
                        return diag_set(d, -EINVAL,
                                        "linear needs a flat input, got (%d,%d,%d): add a flatten layer",
                                        in.c, in.h, in.w);
                if (spec->out <= 0 || spec->out > LAYER_MAX_DIM)
                        return diag_set(d, -EINVAL, "linear: out must be in 1..%d, got %d",
                                        LAYER_MAX_DIM, spec->out);
                n.out = (Shape){ spec->out, 1, 1 };
                n.n_params = fan_in * (size_t)spec->out + (size_t)spec->out;
                n.fan_in = fan_in;
                break;
        }
        case LAYER_RELU:
        case LAYER_GELU:
                n.out = in;
                break;
        case LAYER_FLATTEN:
                n.out = (Shape){ (int)shape_numel(in), 1, 1 };
                break;
        case LAYER_CONV2D:
                r = init_conv2d(&n, spec, in, d);
                break;
        case LAYER_MAXPOOL2D:
                r = init_maxpool2d(&n, spec, in, d);
                break;
        case LAYER_EMBED:
                r = init_embed(&n, spec, in, d);
                break;
        case LAYER_BLOCK:
                r = init_block(&n, spec, in, d);
                break;
        case LAYER_LM_HEAD:
                r = init_lm_head(&n, spec, in, d);
                break;
        default:
                return diag_set(d, -EINVAL, "unknown layer kind %d", spec->kind);
        }
        if (r < 0)
                return r;

        if (shape_numel(n.out) > LAYER_MAX_NUMEL || n.n_params > LAYER_MAX_NUMEL)
                return diag_set(d, -E2BIG, "%s: layer is too large: %zu parameters and %zu outputs a sample, "
                                "at most %zu each", layer_kind_to_string(spec->kind), n.n_params, shape_numel(n.out),
                                LAYER_MAX_NUMEL);
        *l = n;
        return 0;
}

/* ln(x) for x in (0, 1] with + * / only: x = m 2^e, m in [sqrt(1/2),
 * sqrt(2)), ln m = 2 atanh(f) with f = (m - 1) / (m + 1), |f| < 0.172, whose
 * series is within an ulp after 11 terms. libm's log may round differently
 * from one libc to the next; this may not. */
static double portable_log(double x) {
        int e;
        double m = frexp(x, &e); /* exact */
        if (m < 0.70710678118654752440) {
                m *= 2.0;
                e--;
        }
        double f = (m - 1.0) / (m + 1.0), f2 = f * f, term = f, sum = 0.0;
        for (int k = 0; k < 11; k++) {
                sum += term / (double)(2 * k + 1);
                term *= f2;
        }
        return 2.0 * sum + (double)e * 0.69314718055994530942;
}

/* Normals with mean 0 and standard deviation std: Marsaglia's polar method,
 * both of each pair used. */
static void fill_normal(float *w, size_t n, float std, Rng *r) {
        for (size_t i = 0; i < n; i += 2) {
                double u, v, s;
                do {
                        u = (double)(rng_next(r) >> 11) * 0x1.0p-52 - 1.0;
                        v = (double)(rng_next(r) >> 11) * 0x1.0p-52 - 1.0;
                        s = u * u + v * v;
                } while (s >= 1.0 || s == 0.0);
                double f = (double)std * sqrt(-2.0 * portable_log(s) / s);
                w[i] = (float)(u * f);
                if (i + 1 < n)
                        w[i + 1] = (float)(v * f);
        }
}

static void fill(float *w, size_t n, float value) {
        for (size_t i = 0; i < n; i++)
                w[i] = value;
}

/* GPT-2's initialization (see layer.h), parameter by parameter in the
 * slab's order (transformer.h). */
static void transformer_init_params(const Layer *l, float *w, Rng *r) {
        const float std = 0.02f;
        size_t C = (size_t)l->in.h;

        switch (l->kind) {
        case LAYER_EMBED:
                fill_normal(w, l->n_params, std, r);
                break;
        case LAYER_BLOCK: {
                float proj_std = std / sqrtf(2.0f * (float)MAX(l->model_blocks, 1));
                fill(w, C, 1.0f), w += C;                        /* ln1w */
                fill(w, C, 0.0f), w += C;                        /* ln1b */
                fill_normal(w, 3 * C * C, std, r), w += 3 * C * C; /* qkvw */
                fill(w, 3 * C, 0.0f), w += 3 * C;                /* qkvb */
                fill_normal(w, C * C, proj_std, r), w += C * C;  /* attprojw */
                fill(w, C, 0.0f), w += C;                        /* attprojb */
                fill(w, C, 1.0f), w += C;                        /* ln2w */
                fill(w, C, 0.0f), w += C;                        /* ln2b */
                fill_normal(w, 4 * C * C, std, r), w += 4 * C * C; /* fcw */
                fill(w, 4 * C, 0.0f), w += 4 * C;                /* fcb */
                fill_normal(w, 4 * C * C, proj_std, r), w += 4 * C * C; /* fcprojw */
                fill(w, C, 0.0f);                                /* fcprojb */
                break;
        }
        case LAYER_LM_HEAD:
                fill(w, C, 1.0f);
                fill(w + C, C, 0.0f);
                fill_normal(w + 2 * C, l->n_params - 2 * C, std, r);
                break;
        default:
                break;
        }
}

void layer_init_params(const Layer *l, float *w, Rng *r) {
        if (l->n_params == 0)
                return;
        if (l->kind == LAYER_EMBED || l->kind == LAYER_BLOCK || l->kind == LAYER_LM_HEAD) {
                transformer_init_params(l, w, r);
                return;
        }
        /* kaiming_uniform(a=sqrt(5)) as PyTorch does by default reduces to
         * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights, and biases use the
         * same bound. sqrtf is correctly rounded, so this is bit-identical on
         * every IEEE machine. */
        float bound = 1.0f / sqrtf((float)l->fan_in);
        for (size_t i = 0; i < l->n_params; i++)
                w[i] = (2.0f * rng_uniform(r) - 1.0f) * bound;
}

void layer_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   void *saved, float *scratch, int B) {
        size_t n = (size_t)B * shape_numel(l->out);

        switch (l->kind) {
        case LAYER_LINEAR:
                linear_forward(l, ops, out, inp, w, B);
                break;
        case LAYER_RELU:
                relu_forward(ops, out, inp, n);
                break;
        case LAYER_GELU:
                gelu_forward(ops, out, inp, n);
                break;
        case LAYER_FLATTEN:
                if (out != inp) /* a trace shares the buffer */
                        memcpy(out, inp, n * sizeof(float));
                break;
        case LAYER_CONV2D:
                conv2d_forward(l, ops, out, inp, w, scratch, B);
                break;
        case LAYER_MAXPOOL2D:
                maxpool2d_forward(l, out, inp, saved, B);
                break;
        case LAYER_EMBED:
                embed_forward(l, ops, out, inp, w, B);
                break;
        case LAYER_BLOCK:
                block_forward(l, ops, out, inp, w, saved, B);
                break;
        case LAYER_LM_HEAD:
                lm_head_forward(l, ops, out, inp, w, saved, B);
                break;
        default:
                break;
        }
}

void layer_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                    const float *inp, const float *out, const float *w, const void *saved,
                    float *scratch, int B, float beta) {
        size_t n = (size_t)B * shape_numel(l->in);

        switch (l->kind) {
        case LAYER_LINEAR:
                linear_backward(l, ops, dinp, dw, dout, inp, w, B, beta);
                break;
        case LAYER_RELU:
                if (dinp)
                        relu_backward(ops, dinp, dout, out, n);
                break;
        case LAYER_GELU:
                if (dinp)
                        gelu_backward(ops, dinp, dout, inp, n);
                break;
        case LAYER_FLATTEN:
                if (dinp && dinp != dout)
                        memcpy(dinp, dout, n * sizeof(float));
                break;
        case LAYER_CONV2D:
                conv2d_backward(l, ops, dinp, dw, dout, inp, w, scratch, B, beta);
                break;
        case LAYER_MAXPOOL2D:
                if (dinp)
                        maxpool2d_backward(l, dinp, dout, saved, B);
                break;
        case LAYER_EMBED: /* token ids have no gradient: dinp stays untouched */
                embed_backward(l, ops, dw, dout, inp, B, beta);
                break;
        case LAYER_BLOCK:
                block_backward(l, ops, dinp, dw, dout, inp, w, saved, scratch, B, beta);
                break;
        case LAYER_LM_HEAD:
                lm_head_backward(l, ops, dinp, dw, dout, inp, w, saved, scratch, B, beta);
                break;
        default:
                break;
        }
}

double layer_forward_flops(const Layer *l) {
        double out = (double)shape_numel(l->out), in = (double)shape_numel(l->in);
        double T = l->in.c, C = l->in.h;

        switch (l->kind) {
        case LAYER_LINEAR:
        case LAYER_CONV2D:
                /* every output value takes fan_in multiply-adds */
                return 2 * out * (double)l->fan_in;
        case LAYER_BLOCK:
                /* the four matmuls, 12 C^2 weights per position; QK^T and AV
                 * over the causal half, T^2 C / 2 multiply-adds each; the
                 * softmax and the elementwise passes */
                return 2 * T * 12 * C * C + 2 * T * T * C + T * (T * l->spec.heads + 30 * C);
        case LAYER_LM_HEAD:
                return 2 * out * C + 10 * in;
        default:
                return MAX(in, out); /* elementwise, or a lookup */
        }
}
