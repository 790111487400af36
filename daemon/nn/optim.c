/* nn/optim.c — SGD with momentum, AdamW and AccumAdam, written as their
 * papers and PyTorch's documentation state them. */
#include "optim.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "tensor/tensor.h"
#include "util/macro.h"

static const char *const kind_names[_OPTIM_KIND_MAX] = {
        [OPTIM_SGD] = "sgd",
        [OPTIM_ADAMW] = "adamw",
        [OPTIM_ACCUM_ADAM] = "accumadam",
};

DEFINE_STRING_TABLE_LOOKUP(optim_kind, OptimKind, kind_names, _OPTIM_KIND_MAX, _OPTIM_KIND_INVALID)

static const char *const schedule_names[_LR_SCHEDULE_MAX] = {
        [LR_CONSTANT] = "constant",
        [LR_COSINE] = "cosine",
};

DEFINE_STRING_TABLE_LOOKUP(lr_schedule, LrSchedule, schedule_names, _LR_SCHEDULE_MAX, _LR_SCHEDULE_INVALID)

/* A linear warm-up over the first warmup_steps steps (a large rate on
 * random parameters sends a transformer to the plateau of byte frequencies,
 * and how long it stays there is chance), then the schedule over the steps
 * left: constant, or cosine annealing without restarts (Loshchilov and
 * Hutter, 2017) to 0 at the end of the run, as PyTorch's
 * CosineAnnealingLR(T_max = total - warmup) stepped once per batch. */
float lr_schedule_at(const OptimSpec *s, uint64_t t, uint64_t total) {
        uint64_t w = s->warmup_steps;
        if (t < w)
                return (float)((double)s->lr * (double)(t + 1) / (double)w);
        if (s->schedule != LR_COSINE || total <= w)
                return s->lr;
        double x = (double)(MIN(t, total) - w) / (double)(total - w);
        return (float)(0.5 * s->lr * (1.0 + cos(M_PI * x)));
}

void optim_spec_defaults(OptimSpec *s, OptimKind kind) {
        *s = (OptimSpec){ .kind = kind };
        switch (kind) {
        case OPTIM_SGD:
                s->lr = 0.01f;
                break;
        case OPTIM_ADAMW:
        case OPTIM_ACCUM_ADAM:
                s->lr = 1e-3f;
                s->beta1 = 0.9f;
                s->beta2 = 0.999f;
                s->eps = 1e-8f;
                s->weight_decay = 0.01f;
                s->accum_steps = kind == OPTIM_ACCUM_ADAM ? 4 : 0;
                break;
        default:
                break;
        }
}

size_t optim_state_floats(OptimKind kind, size_t n) {
        return kind == OPTIM_ACCUM_ADAM ? 3 * n : kind == OPTIM_ADAMW ? 2 * n : n;
}

unsigned optim_moments(OptimKind kind) {
        return kind == OPTIM_SGD ? 1 : 2;
}

bool optim_moment_valid(OptimKind kind, unsigned k, const float *values, size_t n) {
        bool second = kind != OPTIM_SGD && k == 1;
        if (k >= optim_moments(kind) || !tensor_finite(values, n))
                return false;
        for (size_t i = 0; second && i < n; i++)
                if (values[i] < 0)
                        return false;
        return true;
}

int optim_init(Optim *o, const OptimSpec *spec, size_t n, float *state) {
        if (spec->kind < 0 || spec->kind >= _OPTIM_KIND_MAX ||
            (spec->kind == OPTIM_ACCUM_ADAM && spec->accum_steps == 0))
                return -EINVAL;
        *o = (Optim){ .spec = *spec, .n = n, .state = state, .lr = spec->lr };
        return 0;
}

/* SGD with momentum mu and weight decay lambda (PyTorch's formulation):
 *   g <- g + lambda w
 *   b <- mu b + g              (b starts at 0, so the first b is g)
 *   g <- g + mu b  (Nesterov)  or  g <- b
 *   w <- w - lr g                                                          */
/* Below this many parameters per thread a step is not worth splitting. */
#define OPTIM_GRAIN 32768

/* Whether a value is not finite: its exponent all ones. Or-ed over a
 * slice as the step writes it, so the check costs no pass of its own. */
static inline uint32_t nonfinite_bit(float x) {
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        return (u & 0x7f800000u) == 0x7f800000u;
}

/* A slice whose new values held one that is not finite marks the step. */
static void mark_nonfinite(Optim *o, uint32_t bad) {
        if (bad)
                __atomic_store_n(&o->diverged, true, __ATOMIC_RELAXED);
}

typedef struct StepArgs {
        Optim *o;
        float *w;       /* at offset */
        const float *g; /* at offset */
        size_t offset;  /* of the slice in the slab */
} StepArgs;

_simd_clones_ static void sgd_step(void *ctx, size_t lo, size_t hi) {
        const StepArgs *a = ctx;
        Optim *o = a->o;
        const float lr = o->lr, mu = o->spec.momentum, wd = o->spec.weight_decay;
        float *restrict w = a->w + lo, *restrict buf = o->state + a->offset + lo;
        const float *restrict g = a->g + lo;
        size_t n = hi - lo;
        uint32_t bad = 0;

        if (mu == 0.0f)
                for (size_t i = 0; i < n; i++) {
                        w[i] -= lr * (g[i] + wd * w[i]);
                        bad |= nonfinite_bit(w[i]);
                }
        else if (o->spec.nesterov)
                for (size_t i = 0; i < n; i++) {
                        float gi = g[i] + wd * w[i];
                        buf[i] = mu * buf[i] + gi;
                        w[i] -= lr * (gi + mu * buf[i]);
                        bad |= nonfinite_bit(w[i]);
                }
        else
                for (size_t i = 0; i < n; i++) {
                        float gi = g[i] + wd * w[i];
                        buf[i] = mu * buf[i] + gi;
                        w[i] -= lr * buf[i];
                        bad |= nonfinite_bit(w[i]);
                }
        mark_nonfinite(o, bad);
}

/* AdamW (Loshchilov and Hutter, 2019, Algorithm 2), decoupled decay:
 *   w <- w - lr lambda w
 *   m <- b1 m + (1 - b1) g
 *   v <- b2 v + (1 - b2) g^2
 *   w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)          */
_simd_clones_ static void adamw_step(void *ctx, size_t lo, size_t hi) {
        const StepArgs *a = ctx;
        Optim *o = a->o;
        const float lr = o->lr, wd = o->spec.weight_decay;
        const float b1 = o->spec.beta1, b2 = o->spec.beta2, eps = o->spec.eps;
        float *restrict w = a->w + lo, *restrict m = o->state + a->offset + lo;
        float *restrict v = o->state + o->n + a->offset + lo;
        const float *restrict g = a->g + lo;
        size_t n = hi - lo;
        float step = lr / o->c1, inv_sqrt_c2 = 1.0f / sqrtf(o->c2), decay = 1.0f - lr * wd;

        uint32_t bad = 0;

        for (size_t i = 0; i < n; i++) {
                float gi = g[i];
                m[i] = b1 * m[i] + (1.0f - b1) * gi;
                v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
                w[i] = w[i] * decay - step * m[i] / (sqrtf(v[i]) * inv_sqrt_c2 + eps);
                bad |= nonfinite_bit(w[i]);
        }
        mark_nonfinite(o, bad);
}

/* AccumAdam (Wang, Zhang, Wu, Johansson, ICLR 2025, Section 4): the moments
 * M, V move only at the end of every block of k steps, from the block's mean
 * gradient a; every step still moves w, with the moments as they would be if
 * this step's gradient closed the block:
 *   a <- a + g / k
 *   m <- b1 M + (1 - b1) g,   v <- b2 V + (1 - b2) g^2
 *   w <- w (1 - lr lambda) - lr * (m / (1 - b1^j)) / (sqrt(v / (1 - b2^j)) + eps)
 *   at the end of a block: M <- b1 M + (1 - b1) a,  V <- b2 V + (1 - b2) a^2,  a <- 0
 * with j = ceil(t / k) the number of the block. k = 1 is AdamW. */
_simd_clones_ static void accum_adam_step(void *ctx, size_t lo, size_t hi) {
        const StepArgs *a = ctx;
        Optim *o = a->o;
        const float lr = o->lr, wd = o->spec.weight_decay;
        const float b1 = o->spec.beta1, b2 = o->spec.beta2, eps = o->spec.eps;
        const float inv_k = 1.0f / (float)o->spec.accum_steps;
        const bool closes = o->t % o->spec.accum_steps == 0;
        float *restrict w = a->w + lo, *restrict M = o->state + a->offset + lo;
        float *restrict V = o->state + o->n + a->offset + lo;
        float *restrict acc = o->state + 2 * o->n + a->offset + lo;
        const float *restrict g = a->g + lo;
        size_t n = hi - lo;
        float step = lr / o->c1, inv_sqrt_c2 = 1.0f / sqrtf(o->c2), decay = 1.0f - lr * wd;
        uint32_t bad = 0;

        for (size_t i = 0; i < n; i++) {
                float gi = g[i];
                float m = b1 * M[i] + (1.0f - b1) * gi;
                float v = b2 * V[i] + (1.0f - b2) * gi * gi;
                w[i] = w[i] * decay - step * m / (sqrtf(v) * inv_sqrt_c2 + eps);
                bad |= nonfinite_bit(w[i]);
                if (o->spec.accum_steps == 1) {
                        M[i] = m;
                        V[i] = v;
                        continue;
                }
                float ai = acc[i] + gi * inv_k;
                if (closes) {
                        M[i] = b1 * M[i] + (1.0f - b1) * ai;
                        V[i] = b2 * V[i] + (1.0f - b2) * ai * ai;
                        ai = 0.0f;
                }
                acc[i] = ai;
        }
        mark_nonfinite(o, bad);
}

void optim_set_pool(Optim *o, Pool *pool) {
        o->pool = pool;
}

void optim_begin_step(Optim *o) {
        o->t++;
        uint64_t j = o->t;
        if (o->spec.kind == OPTIM_ACCUM_ADAM) /* the block this step belongs to */
                j = (o->t + o->spec.accum_steps - 1) / o->spec.accum_steps;
        o->c1 = (float)(1.0 - pow(o->spec.beta1, (double)j));
        o->c2 = (float)(1.0 - pow(o->spec.beta2, (double)j));
}

void optim_update(Optim *o, float *w, const float *g, size_t offset, size_t n) {
        /* The step functions index from the slab's start; shift all three
         * slabs (and Adam's second moment with them) by offset. */
        StepArgs a = { .o = o, .w = w + offset, .g = g + offset, .offset = offset };

        switch (o->spec.kind) {
        case OPTIM_SGD:
                pool_for(o->pool, n, OPTIM_GRAIN, sgd_step, &a);
                break;
        case OPTIM_ADAMW:
                pool_for(o->pool, n, OPTIM_GRAIN, adamw_step, &a);
                break;
        case OPTIM_ACCUM_ADAM:
                pool_for(o->pool, n, OPTIM_GRAIN, accum_adam_step, &a);
                break;
        default:
                break;
        }
}

float *optim_fused_gradient(Optim *o, float *ret_beta) {
        const OptimSpec *s = &o->spec;
        if (o->no_fuse || s->kind != OPTIM_SGD || s->momentum == 0.0f || s->nesterov || s->weight_decay != 0.0f)
                return NULL;
        *ret_beta = s->momentum;
        return o->state;
}

_simd_clones_ static void fused_step(void *ctx, size_t lo, size_t hi) {
        const StepArgs *a = ctx;
        const float lr = a->o->lr;
        float *restrict w = a->w + lo;
        const float *restrict buf = a->o->state + a->offset + lo;
        uint32_t bad = 0;
        for (size_t i = 0; i < hi - lo; i++) {
                w[i] -= lr * buf[i];
                bad |= nonfinite_bit(w[i]);
        }
        mark_nonfinite(a->o, bad);
}

void optim_update_fused(Optim *o, float *w, size_t offset, size_t n) {
        StepArgs a = { .o = o, .w = w + offset, .offset = offset };
        pool_for(o->pool, n, OPTIM_GRAIN, fused_step, &a);
}

void optim_step(Optim *o, float *w, const float *g) {
        optim_begin_step(o);
        optim_update(o, w, g, 0, o->n);
}
