/* Optimizers: steps against values worked out by hand. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "nn/optim.h"

Test(optim, sgd_plain) {
        /* w - lr * (g + wd * w) = 1 - 0.1 * (0.5 + 0.1 * 1) = 0.94 */
        OptimSpec s;
        optim_spec_defaults(&s, OPTIM_SGD);
        s.lr = 0.1f;
        s.weight_decay = 0.1f;
        float w[1] = { 1.0f }, g[1] = { 0.5f }, st[1] = { 0 };
        Optim o;
        cr_assert_eq(optim_init(&o, &s, 1, st), 0);
        optim_step(&o, w, g);
        cr_assert_float_eq(w[0], 0.94f, 1e-7f);
}

Test(optim, sgd_momentum_two_steps) {
        /* mu 0.9, lr 0.1, g = 1 then 2, w0 = 0:
         * b1 = 1,          w1 = -0.1
         * b2 = 0.9 + 2,    w2 = -0.1 - 0.29 = -0.39 */
        OptimSpec s;
        optim_spec_defaults(&s, OPTIM_SGD);
        s.lr = 0.1f;
        s.momentum = 0.9f;
        float w[2] = { 0, 0 }, g[2] = { 1, -1 }, st[2] = { 0 };
        Optim o;
        optim_init(&o, &s, 2, st);
        optim_step(&o, w, g);
        cr_assert_float_eq(w[0], -0.1f, 1e-7f);
        cr_assert_float_eq(w[1], 0.1f, 1e-7f);
        g[0] = 2;
        g[1] = -2;
        optim_step(&o, w, g);
        cr_assert_float_eq(w[0], -0.39f, 1e-6f);
        cr_assert_float_eq(w[1], 0.39f, 1e-6f);
        cr_assert_float_eq(st[0], 2.9f, 1e-6f);
}

Test(optim, sgd_nesterov) {
        /* b1 = g = 1; update g + mu b1 = 1.9; w = -0.19 */
        OptimSpec s;
        optim_spec_defaults(&s, OPTIM_SGD);
        s.lr = 0.1f;
        s.momentum = 0.9f;
        s.nesterov = true;
        float w[1] = { 0 }, g[1] = { 1 }, st[1] = { 0 };
        Optim o;
        optim_init(&o, &s, 1, st);
        optim_step(&o, w, g);
        cr_assert_float_eq(w[0], -0.19f, 1e-7f);
}

Test(optim, adamw_first_steps) {
        /* Step 1: m = 0.1 g, v = 0.001 g^2; bias-corrected m/(sqrt v) = sign(g),
         * so w = w (1 - lr wd) - lr g / (|g| + eps') ~ w(1 - lr wd) - lr sign(g).
         * w0 = 1, g = 0.5, lr = 0.01, wd = 0.1:
         *   w1 = 0.999 - 0.01 * 0.5 / (0.5 + 1e-8) = 0.98900000002 */
        OptimSpec s;
        optim_spec_defaults(&s, OPTIM_ADAMW);
        s.lr = 0.01f;
        s.weight_decay = 0.1f;
        float w[1] = { 1.0f }, g[1] = { 0.5f }, st[2] = { 0 };
        Optim o;
        optim_init(&o, &s, 1, st);
        optim_step(&o, w, g);
        cr_assert_float_eq(w[0], 0.989f, 1e-6f);
        cr_assert_float_eq(st[0], 0.05f, 1e-7f);   /* m */
        cr_assert_float_eq(st[1], 0.00025f, 1e-7f); /* v = 0.001 * 0.25 */

        /* Step 2 with g = -0.5: m = 0.9*0.05 - 0.05 = -0.005, v = 0.999*0.00025 + 0.00025
         * mhat = -0.005 / 0.19 = -0.0263158, vhat = 0.00049975 / 0.001999 = 0.2500000
         * w2 = 0.989 * 0.999 - 0.01 * (-0.0263158) / (0.5 + 1e-8) = 0.988537316 */
        g[0] = -0.5f;
        optim_step(&o, w, g);
        double m = 0.9 * 0.05 - 0.1 * 0.5, v = 0.999 * 0.00025 + 0.001 * 0.25;
        double mhat = m / (1 - 0.9 * 0.9), vhat = v / (1 - 0.999 * 0.999);
        double want = 0.989 * (1 - 0.01 * 0.1) - 0.01 * mhat / (sqrt(vhat) + 1e-8);
        cr_assert_float_eq(w[0], (float)want, 1e-6f, "w2 = %.9f, want %.9f", (double)w[0], want);
}

Test(optim, state_sizes_and_names) {
        cr_assert_eq(optim_state_floats(OPTIM_SGD, 10), 10);
        cr_assert_eq(optim_state_floats(OPTIM_ADAMW, 10), 20);
        cr_assert_eq(optim_kind_from_string("adamw"), OPTIM_ADAMW);
        cr_assert_eq(optim_kind_from_string("adam"), _OPTIM_KIND_INVALID);
        cr_assert_str_eq(optim_kind_to_string(OPTIM_SGD), "sgd");
        cr_assert_eq(optim_state_floats(OPTIM_ACCUM_ADAM, 10), 30);
        cr_assert_eq(optim_kind_from_string("accumadam"), OPTIM_ACCUM_ADAM);
}

Test(optim, accum_adam_with_one_step_per_block_is_adamw) {
        OptimSpec a, b;
        optim_spec_defaults(&a, OPTIM_ADAMW);
        optim_spec_defaults(&b, OPTIM_ACCUM_ADAM);
        cr_assert_eq(b.accum_steps, 4);
        b.accum_steps = 1;
        a.lr = b.lr = 0.01f;
        float wa[3] = { 1, -2, 0.5f }, wb[3] = { 1, -2, 0.5f }, sa[6] = {}, sb[9] = {};
        Optim oa, ob;
        optim_init(&oa, &a, 3, sa);
        optim_init(&ob, &b, 3, sb);
        for (int step = 0; step < 5; step++) {
                float g[3] = { 0.3f * step - 0.5f, 1.0f / (step + 1), -0.25f };
                optim_step(&oa, wa, g);
                optim_step(&ob, wb, g);
                for (int i = 0; i < 3; i++)
                        cr_assert_eq(wa[i], wb[i], "step %d w[%d]: %.9g vs %.9g", step, i, (double)wa[i], (double)wb[i]);
        }
}

Test(optim, accum_adam_two_steps_per_block) {
        /* k = 2, lr 0.01, no weight decay, w0 = 1; gradients 0.5, -0.1, 0.3.
         * Step 1 (block 1 open): m = 0.1 * 0.5 = 0.05, v = 0.001 * 0.25; bias
         *   corrections 0.1 and 0.001 give mhat 0.5, vhat 0.25:
         *   w1 = 1 - 0.01 * 0.5 / 0.5 = 0.99; moments unchanged, a = 0.25.
         * Step 2 (closes block 1): mhat = -0.1, sqrt(vhat) = 0.1:
         *   w2 = 0.99 + 0.01 = 1.0; a = 0.25 - 0.05 = 0.2, so
         *   M = 0.1 * 0.2 = 0.02, V = 0.001 * 0.04 = 4e-5, a = 0.
         * Step 3 (block 2): m = 0.9 * 0.02 + 0.1 * 0.3 = 0.048,
         *   v = 0.999 * 4e-5 + 0.001 * 0.09 = 1.2996e-4, corrections 0.19 and
         *   0.001999: w3 = 1 - 0.01 * 0.2526316 / 0.2549764 = 0.9900920 */
        OptimSpec s;
        optim_spec_defaults(&s, OPTIM_ACCUM_ADAM);
        s.lr = 0.01f;
        s.weight_decay = 0;
        s.accum_steps = 2;
        float w[1] = { 1 }, st[3] = {};
        Optim o;
        cr_assert_eq(optim_init(&o, &s, 1, st), 0);
        optim_step(&o, w, (float[]){ 0.5f });
        cr_assert_float_eq(w[0], 0.99f, 1e-6f);
        cr_assert(st[0] == 0 && st[1] == 0, "moments wait for the block");
        cr_assert_float_eq(st[2], 0.25f, 1e-7f);
        optim_step(&o, w, (float[]){ -0.1f });
        cr_assert_float_eq(w[0], 1.0f, 1e-6f);
        cr_assert_float_eq(st[0], 0.02f, 1e-7f);
        cr_assert_float_eq(st[1], 4e-5f, 1e-9f);
        cr_assert_eq(st[2], 0.0f);
        optim_step(&o, w, (float[]){ 0.3f });
        double m = 0.048 / 0.19, v = 1.2996e-4 / (1 - 0.999 * 0.999);
        cr_assert_float_eq(w[0], (float)(1.0 - 0.01 * m / (sqrt(v) + 1e-8)), 1e-6f);
        cr_assert_float_eq(w[0], 0.990092f, 1e-6f);

        s.accum_steps = 0;
        cr_assert_eq(optim_init(&o, &s, 1, st), -EINVAL);
}

Test(optim, pooled_step_equals_serial_step) {
        /* A slab big enough to be split across threads gives the same bits. */
        enum { N = 200003 };
        static float w1[N], w2[N], g[N], s1[3 * N], s2[3 * N];
        Pool *p;
        cr_assert_eq(pool_new(2, &p), 0);
        for (int kind = 0; kind < _OPTIM_KIND_MAX; kind++) {
                OptimSpec s;
                optim_spec_defaults(&s, (OptimKind)kind);
                s.momentum = kind == OPTIM_SGD ? 0.9f : 0.0f;
                for (int i = 0; i < N; i++) {
                        w1[i] = w2[i] = sinf((float)i);
                        g[i] = cosf((float)i * 0.7f);
                }
                for (int i = 0; i < 3 * N; i++)
                        s1[i] = s2[i] = 0;
                Optim a, b;
                optim_init(&a, &s, N, s1);
                optim_init(&b, &s, N, s2);
                optim_set_pool(&b, p);
                for (int step = 0; step < 3; step++) {
                        optim_step(&a, w1, g);
                        optim_step(&b, w2, g);
                }
                for (int i = 0; i < N; i++)
                        cr_assert_eq(w1[i], w2[i], "%s: w[%d] %.9g vs %.9g", optim_kind_to_string(kind), i,
                                     (double)w1[i], (double)w2[i]);
        }
        pool_free(p);
}

Test(optim, schedules_with_and_without_warmup) {
        OptimSpec s;
        optim_spec_defaults(&s, OPTIM_ADAMW);
        s.lr = 0.004f;
        /* constant: lr at every step, before and after the end */
        cr_assert_eq(lr_schedule_at(&s, 0, 100), 0.004f);
        cr_assert_eq(lr_schedule_at(&s, 500, 100), 0.004f);
        /* cosine from lr at step 0, half of it half-way, 0 at the end */
        s.schedule = LR_COSINE;
        cr_assert_float_eq(lr_schedule_at(&s, 0, 100), 0.004f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 50, 100), 0.002f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 100, 100), 0.0f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 200, 100), 0.0f, 1e-9f);
        /* a warm-up of 10 steps: 0.0004, 0.0008, ... 0.004 at step 9; then
         * the cosine over the 90 steps left: lr at 10, half at 55, 0 at 100 */
        s.warmup_steps = 10;
        cr_assert_float_eq(lr_schedule_at(&s, 0, 100), 0.0004f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 4, 100), 0.002f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 9, 100), 0.004f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 10, 100), 0.004f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 55, 100), 0.002f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 100, 100), 0.0f, 1e-9f);
        /* a run no longer than its warm-up: the rate stays at lr after it */
        cr_assert_float_eq(lr_schedule_at(&s, 5, 8), 0.0024f, 1e-9f);
        cr_assert_float_eq(lr_schedule_at(&s, 20, 8), 0.004f, 1e-9f);
        /* constant after the warm-up */
        s.schedule = LR_CONSTANT;
        cr_assert_float_eq(lr_schedule_at(&s, 4, 100), 0.002f, 1e-9f);
        cr_assert_eq(lr_schedule_at(&s, 10, 100), 0.004f);
}

/* One step of o over w from g, through the fused path when fused. */
static void step_once(Optim *o, float *w, const float *g, bool fused) {
        if (!fused) {
                optim_step(o, w, g);
                return;
        }
        optim_begin_step(o);
        memcpy(o->state, g, o->n * sizeof *g); /* the backward pass writes b = mu b + g; b was 0 */
        optim_update_fused(o, w, 0, o->n);
}

/* Every kind of step marks the optimizer diverged when a value it writes
 * is not finite, wherever that value is (here in the second thread's
 * slice, or the one value a huge step overflows), and never otherwise. */
Test(optim, a_step_that_leaves_a_value_not_finite_is_marked) {
        enum { N = 200003 };
        static float w[N], g[N], st[3 * N];
        Pool *p;
        cr_assert_eq(pool_new(2, &p), 0);
        for (int variant = 0; variant < _OPTIM_KIND_MAX + 3; variant++) {
                OptimKind kind = variant < _OPTIM_KIND_MAX ? (OptimKind)variant : OPTIM_SGD;
                bool fused = variant == _OPTIM_KIND_MAX + 2;
                OptimSpec s;
                optim_spec_defaults(&s, kind);
                s.momentum = variant >= _OPTIM_KIND_MAX ? 0.9f : 0.0f;
                s.nesterov = variant == _OPTIM_KIND_MAX + 1;
                for (int bad = 0; bad < 3; bad++) {
                        for (int i = 0; i < N; i++)
                                w[i] = g[i] = sinf((float)i);
                        memset(st, 0, sizeof st);
                        Optim o;
                        cr_assert_eq(optim_init(&o, &s, N, st), 0);
                        optim_set_pool(&o, p);
                        step_once(&o, w, g, fused);
                        cr_assert_not(optim_diverged(&o), "variant %d: a clean step", variant);
                        if (bad == 1)
                                g[N - 7] = NAN;
                        if (bad == 2) /* SGD: finite in, infinite out; Adam's step is at most
                                       * about its rate, so it gets an infinite parameter */
                                w[N - 7] = kind == OPTIM_SGD ? -FLT_MAX : INFINITY, g[N - 7] = FLT_MAX;
                        step_once(&o, w, g, fused);
                        cr_assert_eq(optim_diverged(&o), bad != 0, "variant %d, bad %d", variant, bad);
                }
        }
        pool_free(p);
}
