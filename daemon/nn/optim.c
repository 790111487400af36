/* nn/optim.c — SGD with momentum and AdamW, written as their papers and
 * PyTorch's documentation state them. */
#include "optim.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static const char *const kind_names[_OPTIM_KIND_MAX] = {
        [OPTIM_SGD] = "sgd",
        [OPTIM_ADAMW] = "adamw",
};

const char *optim_kind_to_string(OptimKind k) {
        return k >= 0 && k < _OPTIM_KIND_MAX ? kind_names[k] : NULL;
}

OptimKind optim_kind_from_string(const char *s) {
        for (int k = 0; k < _OPTIM_KIND_MAX; k++)
                if (s && strcmp(s, kind_names[k]) == 0)
                        return (OptimKind)k;
        return _OPTIM_KIND_INVALID;
}

void optim_spec_defaults(OptimSpec *s, OptimKind kind) {
        *s = (OptimSpec){ .kind = kind };
        switch (kind) {
        case OPTIM_SGD:
                s->lr = 0.01f;
                break;
        case OPTIM_ADAMW:
                s->lr = 1e-3f;
                s->beta1 = 0.9f;
                s->beta2 = 0.999f;
                s->eps = 1e-8f;
                s->weight_decay = 0.01f;
                break;
        default:
                break;
        }
}

size_t optim_state_floats(OptimKind kind, size_t n) {
        return kind == OPTIM_ADAMW ? 2 * n : n;
}

int optim_init(Optim *o, const OptimSpec *spec, size_t n, float *state) {
        if (spec->kind < 0 || spec->kind >= _OPTIM_KIND_MAX)
                return -EINVAL;
        *o = (Optim){ .spec = *spec, .n = n, .state = state };
        return 0;
}

/* SGD with momentum mu and weight decay lambda (PyTorch's formulation):
 *   g <- g + lambda w
 *   b <- mu b + g              (b starts at 0, so the first b is g)
 *   g <- g + mu b  (Nesterov)  or  g <- b
 *   w <- w - lr g                                                          */
static void sgd_step(Optim *o, float *restrict w, const float *restrict g) {
        const float lr = o->spec.lr, mu = o->spec.momentum, wd = o->spec.weight_decay;
        float *restrict buf = o->state;
        size_t n = o->n;

        if (mu == 0.0f) {
                for (size_t i = 0; i < n; i++)
                        w[i] -= lr * (g[i] + wd * w[i]);
                return;
        }
        if (o->spec.nesterov)
                for (size_t i = 0; i < n; i++) {
                        float gi = g[i] + wd * w[i];
                        buf[i] = mu * buf[i] + gi;
                        w[i] -= lr * (gi + mu * buf[i]);
                }
        else
                for (size_t i = 0; i < n; i++) {
                        float gi = g[i] + wd * w[i];
                        buf[i] = mu * buf[i] + gi;
                        w[i] -= lr * buf[i];
                }
}

/* AdamW (Loshchilov and Hutter, 2019, Algorithm 2), decoupled decay:
 *   w <- w - lr lambda w
 *   m <- b1 m + (1 - b1) g
 *   v <- b2 v + (1 - b2) g^2
 *   w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)          */
static void adamw_step(Optim *o, float *restrict w, const float *restrict g) {
        const float lr = o->spec.lr, wd = o->spec.weight_decay;
        const float b1 = o->spec.beta1, b2 = o->spec.beta2, eps = o->spec.eps;
        float *restrict m = o->state, *restrict v = o->state + o->n;
        size_t n = o->n;

        double t = (double)o->t;
        float c1 = (float)(1.0 - pow(b1, t)), c2 = (float)(1.0 - pow(b2, t));
        float step = lr / c1, inv_sqrt_c2 = 1.0f / sqrtf(c2), decay = 1.0f - lr * wd;

        for (size_t i = 0; i < n; i++) {
                float gi = g[i];
                m[i] = b1 * m[i] + (1.0f - b1) * gi;
                v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
                w[i] = w[i] * decay - step * m[i] / (sqrtf(v[i]) * inv_sqrt_c2 + eps);
        }
}

void optim_step(Optim *o, float *w, const float *g) {
        o->t++;
        switch (o->spec.kind) {
        case OPTIM_SGD:
                sgd_step(o, w, g);
                break;
        case OPTIM_ADAMW:
                adamw_step(o, w, g);
                break;
        default:
                break;
        }
}
