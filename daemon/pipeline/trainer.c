/* pipeline/trainer.c */
#include "trainer.h"

#include <math.h>
#include <stdlib.h>

#include "nn/loss.h"
#include "tensor/tensor.h"
#include "util/time-util.h"

int model_check_data_shape(const ModelSpec *model, const DatasetShape *s, Diag *d) {
        return dataset_check_fit(s, model->input.c, model->input.h, model->input.w, model->n_classes, d);
}

int model_check_data(const ModelSpec *model, const Dataset *ds, Diag *d) {
        DatasetShape s = dataset_shape(ds);
        return model_check_data_shape(model, &s, d);
}

int trainer_new(const ModelSpec *model, const OptimSpec *optim, const TrainSpec *spec,
                const Dataset *train, const Dataset *test, const Ops *ops, Trainer **ret, Diag *d) {
        _cleanup_(trainer_freep) Trainer *t = NULL;
        int r;

        if (spec->batch_size <= 0 || spec->epochs < 0)
                return diag_set(d, -EINVAL, "batch size and epochs must be positive");
        if ((r = model_check_data(model, train, d)) < 0 || (test && (r = model_check_data(model, test, d)) < 0))
                return r;

        t = calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->spec = *spec;
        t->ops = ops;
        t->train = train;
        t->test = test;

        r = stage_new(model, 0, model->n_layers, spec->seed, &t->stage, d);
        if (r < 0)
                return r;
        Stage *s = t->stage;
        float *state = arena_alloc_floats(s->arena, optim_state_floats(optim->kind, s->n_params));
        if (!state)
                return -ENOMEM;
        r = optim_init(&t->optim, optim, s->n_params, state);
        if (r < 0)
                return diag_set(d, r, "unknown optimizer");
        if (ops == &ops_blas)
                optim_set_pool(&t->optim, ops_blas_pool());
        r = sampler_init(&t->sampler, train->n, spec->shard, MAX(spec->n_shards, 1), spec->seed);
        if (r < 0)
                return diag_set(d, r, "cannot make shard %d of %d from %zu samples", spec->shard,
                                spec->n_shards, train->n);
        t->max_batch = trainer_max_batch(spec, train->n, test ? test->n : 0);
        r = trace_new(s, t->max_batch, &t->trace);
        if (r < 0)
                return r;
        t->rows = model_spec_labels_per_sample(model);
        t->classes = model->n_classes;
        size_t rows = (size_t)t->max_batch * (size_t)t->rows;
        t->labels = arena_alloc(s->arena, sizeof(int32_t) * rows);
        t->dlogits = arena_alloc_floats(s->arena, rows * (size_t)model->n_classes);
        if (!t->labels || !t->dlogits)
                return -ENOMEM;

        *ret = TAKE_PTR(t);
        return 0;
}

int trainer_max_batch(const TrainSpec *spec, size_t n_train, size_t n_test) {
        size_t shards = (size_t)MAX(spec->n_shards, 1);
        size_t shard = n_train / shards + ((size_t)MAX(spec->shard, 0) < n_train % shards); /* as sampler_init() */
        return (int)MIN((size_t)spec->batch_size, MAX(MAX(shard, n_test), (size_t)1));
}

Trainer *trainer_free(Trainer *t) {
        if (!t)
                return NULL;
        sampler_done(&t->sampler);
        stage_free(t->stage);
        free(t);
        return NULL;
}

static void update_layer(void *userdata, size_t offset, size_t n) {
        Trainer *t = userdata;
        optim_update(&t->optim, t->stage->params, t->stage->grads, offset, n);
}

static void update_layer_fused(void *userdata, size_t offset, size_t n) {
        Trainer *t = userdata;
        optim_update_fused(&t->optim, t->stage->params, offset, n);
}

float trainer_step(Trainer *t, int B, int *ret_correct) {
        Stage *s = t->stage;
        float loss;

        stage_forward(s, t->ops, s->params, t->trace, B);
        loss = softmax_xent(t->dlogits, ret_correct, trace_output(t->trace), t->labels, B * t->rows, t->classes);
        /* The first layer's input gradient is nobody's business: skip it.
         * Each layer is updated as soon as its gradient is complete. */
        optim_begin_step(&t->optim);
        float beta;
        float *fused = optim_fused_gradient(&t->optim, &beta);
        if (fused)
                stage_backward(s, t->ops, s->params, t->trace, t->dlogits, NULL, fused, B, beta,
                               update_layer_fused, t);
        else
                stage_backward(s, t->ops, s->params, t->trace, t->dlogits, NULL, s->grads, B, 0.0f,
                               update_layer, t);
        return loss;
}

void trainer_evaluate(Trainer *t, const Dataset *ds, double *ret_acc, double *ret_loss) {
        Stage *s = t->stage;
        int B = t->max_batch;
        size_t correct = 0;
        double loss = 0.0;
        uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)B);

        if (!idx) {
                *ret_acc = *ret_loss = -1.0;
                return;
        }
        for (size_t start = 0; start < ds->n; start += (size_t)B) {
                int n = (int)MIN((size_t)B, ds->n - start), c;
                for (int i = 0; i < n; i++)
                        idx[i] = (uint32_t)(start + (size_t)i);
                dataset_gather(ds, trace_input(t->trace), t->labels, idx, n);
                stage_forward(s, t->ops, s->params, t->trace, n);
                loss += (double)softmax_xent(NULL, &c, trace_output(t->trace), t->labels, n * t->rows, t->classes) *
                        n;
                correct += (size_t)c;
        }
        free(idx);
        *ret_acc = (double)correct / ((double)ds->n * t->rows);
        *ret_loss = loss / (double)ds->n;
}

size_t trainer_steps_per_epoch(const Trainer *t) {
        size_t B = (size_t)t->spec.batch_size;
        return (t->sampler.n + B - 1) / B;
}

int trainer_run(Trainer *t, TrainProgressFn cb, void *userdata, const volatile sig_atomic_t *stop) {
        size_t B = (size_t)t->spec.batch_size, n = t->sampler.n, steps = trainer_steps_per_epoch(t);
        int r;

        for (int epoch = t->start_epoch; epoch < t->spec.epochs; epoch++) {
                TrainProgress p = {
                        .epoch = epoch + 1,
                        .epochs = t->spec.epochs,
                        .steps_per_epoch = steps,
                        .test_acc = -1.0,
                        .test_loss = -1.0,
                };
                double loss_sum = 0.0;
                size_t correct = 0;
                uint64_t busy = 0;

                sampler_shuffle(&t->sampler, epoch);
                size_t first = epoch == t->start_epoch ? MIN(t->start_step, steps) : 0;
                for (size_t step = first; step < steps; step++) {
                        if (stop && *stop)
                                return -ECANCELED;
                        optim_set_lr(&t->optim, lr_schedule_at(&t->optim.spec, (uint64_t)epoch * steps + step,
                                                               (uint64_t)t->spec.epochs * steps));

                        uint64_t t0 = now_ns();
                        int b = (int)MIN(B, n - step * B), c;
                        dataset_gather(t->train, trace_input(t->trace), t->labels,
                                       t->sampler.order + step * B, b);
                        float loss = trainer_step(t, b, &c);
                        busy += now_ns() - t0;
                        /* diverged: stop before the model goes anywhere. A
                         * parameter behind a ReLU can be NaN while the loss
                         * is not (the ReLU passes 0 for it), so both count. */
                        if (!isfinite(loss) || optim_diverged(&t->optim)) {
                                t->diverged_epoch = epoch + 1;
                                t->diverged_step = step + 1;
                                return -ERANGE;
                        }

                        loss_sum += (double)loss * b;
                        correct += (size_t)c;
                        p.step = step + 1;
                        p.samples += (uint64_t)b;
                        p.loss = loss_sum / (double)p.samples;
                        p.train_acc = (double)correct / ((double)p.samples * t->rows);
                        p.samples_per_sec = (double)p.samples / ns_to_sec(busy);
                        if (cb && (r = cb(&p, userdata)) < 0)
                                return r;
                }

                if (t->test)
                        trainer_evaluate(t, t->test, &p.test_acc, &p.test_loss);
                p.epoch_done = true;
                if (cb && (r = cb(&p, userdata)) < 0)
                        return r;
        }
        return 0;
}
