/* The training step: SGD's momentum fused into the backward pass gives the
 * same parameters as the plain step. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/trainer.h"
#include "tensor/ops.h"
#include "util/rng.h"

static Dataset *fake_dataset(int n) {
        Dataset *ds = calloc(1, sizeof *ds);
        ds->n = (size_t)n;
        ds->c = 1;
        ds->h = ds->w = 8;
        ds->n_classes = 4;
        ds->images = malloc((size_t)n * 64);
        ds->labels = malloc((size_t)n);
        Rng r;
        rng_seed(&r, 3, RNG_STREAM_TEST);
        for (int i = 0; i < n * 64; i++)
                ds->images[i] = (uint8_t)(rng_next(&r) >> 56);
        for (int i = 0; i < n; i++)
                ds->labels[i] = (uint8_t)(i % 4);
        dataset_set_normalization(ds, 0.5f, 0.25f);
        return ds;
}

static ModelSpec mlp(void) {
        ModelSpec m = { .input = { 1, 8, 8 }, .n_classes = 4, .n_layers = 4 };
        m.layers[0] = (LayerSpec){ .kind = LAYER_FLATTEN };
        m.layers[1] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 300 };
        m.layers[2] = (LayerSpec){ .kind = LAYER_RELU };
        m.layers[3] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 4 };
        return m;
}

Test(trainer, fused_momentum_equals_plain_sgd) {
        Dataset *ds = fake_dataset(64);
        ModelSpec m = mlp();
        OptimSpec o;
        optim_spec_defaults(&o, OPTIM_SGD);
        o.lr = 0.1f;
        o.momentum = 0.9f;
        TrainSpec spec = { .batch_size = 16, .epochs = 1, .seed = 5, .n_shards = 1 };
        ops_blas_set_threads(2);

        Trainer *fused, *plain;
        cr_assert_eq(trainer_new(&m, &o, &spec, ds, NULL, &ops_blas, &fused, NULL), 0);
        cr_assert_eq(trainer_new(&m, &o, &spec, ds, NULL, &ops_blas, &plain, NULL), 0);
        float beta;
        cr_assert_not_null(optim_fused_gradient(&fused->optim, &beta));
        cr_assert_float_eq(beta, 0.9f, 0);
        plain->optim.no_fuse = true;
        cr_assert_null(optim_fused_gradient(&plain->optim, &beta));

        for (int step = 0; step < 4; step++) {
                Trainer *both[2] = { fused, plain };
                for (int k = 0; k < 2; k++) {
                        uint32_t idx[16];
                        for (int i = 0; i < 16; i++)
                                idx[i] = (uint32_t)(step * 16 + i);
                        dataset_gather(ds, trace_input(both[k]->trace), both[k]->labels, idx, 16);
                        trainer_step(both[k], 16, NULL);
                }
        }
        size_t n = fused->stage->n_params;
        for (size_t i = 0; i < n; i++)
                cr_assert(fabsf(fused->stage->params[i] - plain->stage->params[i]) <=
                                  1e-5f * fmaxf(1.0f, fabsf(plain->stage->params[i])),
                          "param %zu: fused %.8g, plain %.8g", i, (double)fused->stage->params[i],
                          (double)plain->stage->params[i]);
        /* and the weights did move */
        Trainer *fresh;
        trainer_new(&m, &o, &spec, ds, NULL, &ops_blas, &fresh, NULL);
        cr_assert_neq(memcmp(fresh->stage->params, fused->stage->params, n * sizeof(float)), 0);

        /* Weight decay or Nesterov: not fusable. */
        o.weight_decay = 0.01f;
        Trainer *wd;
        trainer_new(&m, &o, &spec, ds, NULL, &ops_blas, &wd, NULL);
        cr_assert_null(optim_fused_gradient(&wd->optim, &beta));
        trainer_free(wd);
        trainer_free(fresh);
        trainer_free(fused);
        trainer_free(plain);
        dataset_free(ds);
        ops_blas_set_threads(1);
}

/* A step whose loss is not finite stops training with -ERANGE, naming the
 * step, before anyone (the progress callback, a checkpoint) sees it: a
 * diverged node stops instead of training on with loss NaN. */
typedef struct Poison {
        Trainer *t;
        size_t at_step; /* after this step, a parameter becomes NaN */
        size_t param;
        unsigned calls;
        double last_loss;
} Poison;

static int poison(const TrainProgress *p, void *userdata) {
        Poison *ps = userdata;
        ps->calls++;
        ps->last_loss = p->loss;
        if (!p->epoch_done && p->epoch == 2 && p->step == ps->at_step)
                ps->t->stage->params[ps->param] = NAN;
        return 0;
}

/* param: the last bias, which makes the loss NaN, or a first-layer weight,
 * which the ReLU hides from the loss. */
static void diverge_at(size_t param) {
        Dataset *ds = fake_dataset(64);
        ModelSpec m = mlp();
        OptimSpec o;
        optim_spec_defaults(&o, OPTIM_ADAMW);
        TrainSpec spec = { .batch_size = 16, .epochs = 3, .seed = 5, .n_shards = 1 };
        Trainer *t;
        cr_assert_eq(trainer_new(&m, &o, &spec, ds, NULL, &ops_blas, &t, NULL), 0);
        Poison ps = { .t = t, .at_step = 2, .param = param == SIZE_MAX ? t->stage->n_params - 1 : param };
        cr_assert_eq(trainer_run(t, poison, &ps, NULL), -ERANGE);
        cr_assert_eq(t->diverged_epoch, 2);
        cr_assert_eq(t->diverged_step, 3);
        cr_assert_eq(ps.calls, 4 + 1 + 2, "epoch 1 and its end, then steps 1 and 2 of epoch 2: %u", ps.calls);
        cr_assert(isfinite(ps.last_loss), "no progress with a loss that is not finite");
        trainer_free(t);
        dataset_free(ds);
}

Test(trainer, a_loss_that_is_not_finite_stops_training) { diverge_at(SIZE_MAX); }
Test(trainer, a_parameter_that_is_not_finite_stops_training) { diverge_at(5); }

/* A batch larger than the data (a legal batch_size of 65536 on 64
 * samples) is sized to the data: the trainer holds what 64 samples need,
 * not what 65536 would (it took gigabytes for a CNN), and trains and
 * evaluates the same as with a batch of 64. */
Test(trainer, a_batch_larger_than_the_data_is_sized_to_it) {
        Dataset *ds = fake_dataset(64);
        ModelSpec m = mlp();
        OptimSpec o;
        optim_spec_defaults(&o, OPTIM_SGD);
        TrainSpec huge = { .batch_size = 65536, .epochs = 1, .seed = 5, .n_shards = 1 }, exact = huge;
        exact.batch_size = 64;
        ops_blas_set_threads(2);
        Trainer *a, *b;
        cr_assert_eq(trainer_new(&m, &o, &huge, ds, ds, &ops_blas, &a, NULL), 0);
        cr_assert_eq(trainer_new(&m, &o, &exact, ds, ds, &ops_blas, &b, NULL), 0);
        cr_assert_eq(a->max_batch, 64);
        cr_assert_eq(trainer_steps_per_epoch(a), 1);
        cr_assert_eq(trainer_run(a, NULL, NULL, NULL), 0);
        cr_assert_eq(trainer_run(b, NULL, NULL, NULL), 0);
        double acc[2], loss[2];
        trainer_evaluate(a, ds, &acc[0], &loss[0]);
        trainer_evaluate(b, ds, &acc[1], &loss[1]);
        cr_assert_float_eq(loss[0], loss[1], 1e-9, "%g %g", loss[0], loss[1]);
        cr_assert_float_eq(acc[0], acc[1], 1e-12);
        trainer_free(a);
        trainer_free(b);
        dataset_free(ds);
}
