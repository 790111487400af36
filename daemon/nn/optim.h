/* nn/optim.h — optimizers that update a parameter slab in place.
 *
 * The state (momentum buffer, or Adam's two moments, plus AccumAdam's
 * gradient accumulator) is itself one contiguous slab of
 * optim_state_floats() floats, so checkpoints and transfers handle it as a
 * block like the parameters.
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

#include "tensor/pool.h"

typedef enum OptimKind {
        OPTIM_SGD,
        OPTIM_ADAMW,
        /* AdamW whose moments are updated only every accum_steps steps, from
         * the mean of the gradients of those steps (Wang et al., ICLR 2025):
         * with small local batches, as in decentralized training, one
         * batch's gradient is too noisy for the second moment. */
        OPTIM_ACCUM_ADAM,
        _OPTIM_KIND_MAX,
        _OPTIM_KIND_INVALID = -1,
} OptimKind;

typedef enum LrSchedule {
        LR_CONSTANT,
        LR_COSINE, /* lr * (1 + cos(pi t / T)) / 2 over the T steps after the warm-up */
        _LR_SCHEDULE_MAX,
        _LR_SCHEDULE_INVALID = -1,
} LrSchedule;

typedef struct OptimSpec {
        OptimKind kind;
        LrSchedule schedule;
        float lr; /* the base learning rate */
        /* the first steps' rate rises linearly to lr: lr (t + 1) / warmup_steps */
        unsigned warmup_steps;
        float weight_decay;
        /* SGD */
        float momentum;
        bool nesterov;
        /* AdamW, AccumAdam */
        float beta1, beta2, eps;
        /* AccumAdam: steps whose gradients make one moment update */
        unsigned accum_steps;
} OptimSpec;

typedef struct Optim {
        OptimSpec spec;
        size_t n;
        float *state; /* SGD: momentum (n); AdamW: m (n) then v (n); AccumAdam: m, v, then the
                       * gradients accumulated since the last moment update (n each) */
        uint64_t t;   /* steps taken */
        float lr;     /* the learning rate of the next step */
        float c1, c2; /* AdamW's bias corrections 1 - beta^t for this step (AccumAdam:
                       * beta^j, j the moment update this step leads to) */
        Pool *pool;   /* splits each step across threads; NULL: caller only */
        bool no_fuse; /* never fuse the momentum into the backward pass */
        bool diverged; /* an update left a parameter that is not finite (optim_diverged()) */
} Optim;

const char *optim_kind_to_string(OptimKind k);
OptimKind optim_kind_from_string(const char *s);
const char *lr_schedule_to_string(LrSchedule s);
LrSchedule lr_schedule_from_string(const char *s);

/* The learning rate the schedule gives for step t (0-based) of total: the
 * warm-up's, then the schedule's over the steps after it. */
float lr_schedule_at(const OptimSpec *s, uint64_t t, uint64_t total);

/* PyTorch's defaults: SGD lr 0.01, momentum 0; AdamW lr 1e-3, betas
 * (0.9, 0.999), eps 1e-8, weight decay 0.01. AccumAdam: AdamW's, and the
 * moments updated every 4 steps (the paper's reference code). */
void optim_spec_defaults(OptimSpec *s, OptimKind kind);
size_t optim_state_floats(OptimKind kind, size_t n);

/* The arrays of n floats at the start of the state that are its moments,
 * what a node that takes over layers or joins a swarm is handed: SGD's
 * momentum, AdamW's and AccumAdam's m and v (AccumAdam's gradients summed
 * since its last moment update stay behind). */
unsigned optim_moments(OptimKind kind);
/* Whether values (n of them) can be moment k of an optimizer's state: all
 * finite, and a second moment never negative. Moments that come from
 * another node (layers handed over, a joiner's donor) are checked with it. */
bool optim_moment_valid(OptimKind kind, unsigned k, const float *values, size_t n);

/* state must hold optim_state_floats() zeroed floats and outlive o. */
int optim_init(Optim *o, const OptimSpec *spec, size_t n, float *state);

static inline void optim_set_lr(Optim *o, float lr) {
        o->lr = lr;
}

/* Run steps on the threads of pool (borrowed; may be NULL). */
void optim_set_pool(Optim *o, Pool *pool);

/* w is (n), g is (n): one update of w from the gradient g. */
void optim_step(Optim *o, float *w, const float *g);

/* The same step in slices, for updating each layer as soon as its gradient
 * is ready: optim_begin_step() once, then optim_update() over slices that
 * together cover [0, n) exactly once. w and g are the whole slabs. */
void optim_begin_step(Optim *o);
void optim_update(Optim *o, float *w, const float *g, size_t offset, size_t n);

/* SGD with momentum mu and neither weight decay nor Nesterov is
 *   b <- mu b + g,  w <- w - lr b,
 * so the backward pass can write its gradient straight into the momentum
 * buffer (beta = mu in its gemms) and the step is then w <- w - lr b: one
 * pass over the parameters less, and no gradient slab traffic. Returns the
 * slab to backpropagate into and sets *ret_beta, or NULL when this
 * optimizer cannot be fused (or fusing is turned off). */
float *optim_fused_gradient(Optim *o, float *ret_beta);
/* The fused step over one slice, after optim_begin_step(). */
void optim_update_fused(Optim *o, float *w, size_t offset, size_t n);

/* Whether an update since optim_init() left a parameter that is not
 * finite (NaN or infinite). Every step checks the values it writes as it
 * writes them, so this costs no pass over the parameters. */
static inline bool optim_diverged(const Optim *o) {
        return o->diverged;
}
