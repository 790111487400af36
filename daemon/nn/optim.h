/* nn/optim.h — optimizers that update a parameter slab in place.
 *
 * The state (momentum buffer, or Adam's two moments) is itself one
 * contiguous slab of optim_state_floats() floats, so checkpoints and transfers
 * handle it as a block like the parameters.
 *
 *     OptimSpec s;
 *     optim_spec_defaults(&s, OPTIM_SGD);
 *     s.lr = 0.05f;
 *     Optim o;
 *     optim_init(&o, &s, n, state_slab);
 *     optim_step(&o, params, grads);      // after every (accumulated) gradient
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum OptimKind {
        OPTIM_SGD,
        OPTIM_ADAMW,
        _OPTIM_KIND_MAX,
        _OPTIM_KIND_INVALID = -1,
} OptimKind;

typedef struct OptimSpec {
        OptimKind kind;
        float lr;
        float weight_decay;
        /* SGD */
        float momentum;
        bool nesterov;
        /* AdamW */
        float beta1, beta2, eps;
} OptimSpec;

typedef struct Optim {
        OptimSpec spec;
        size_t n;
        float *state; /* SGD: momentum (n); AdamW: m (n) then v (n) */
        uint64_t t;   /* steps taken */
} Optim;

const char *optim_kind_to_string(OptimKind k);
OptimKind optim_kind_from_string(const char *s);

/* PyTorch's defaults: SGD lr 0.01, momentum 0; AdamW lr 1e-3, betas
 * (0.9, 0.999), eps 1e-8, weight decay 0.01. */
void optim_spec_defaults(OptimSpec *s, OptimKind kind);
size_t optim_state_floats(OptimKind kind, size_t n);

/* state must hold optim_state_floats() zeroed floats and outlive o. */
int optim_init(Optim *o, const OptimSpec *spec, size_t n, float *state);

/* w is (n), g is (n): one update of w from the gradient g. */
void optim_step(Optim *o, float *w, const float *g);
