/* service/local-run.c */
#include "local-run.h"

#include <stdlib.h>

#include "tensor/ops.h"
#include "util/log.h"
#include "util/time-util.h"

typedef struct Progress {
        const LocalRunOptions *o;
        Trainer *trainer;
        uint64_t samples; /* this epoch, at the last step */
        unsigned interval_ms;
        uint64_t last_ns;
        uint64_t start_ns;
        double rates[64];
        int n_rates;
        double test_acc, test_loss;
} Progress;

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return (x > y) - (x < y);
}

static int on_progress(const TrainProgress *p, void *userdata) {
        Progress *pr = userdata;
        uint64_t now = now_ns();

        if (pr->o->poll)
                pr->o->poll(pr->o->poll_userdata);
        if (pr->o->step && !p->epoch_done) {
                uint64_t step = p->samples >= pr->samples ? p->samples - pr->samples : p->samples;
                pr->o->step(pr->o->step_userdata, pr->trainer->stage->params, step);
        }
        pr->samples = p->epoch_done ? 0 : p->samples;
        if (p->epoch_done) {
                log_info("epoch %d/%d done: train loss %.4f, train acc %.2f%%, %.0f samples/s, "
                         "test acc %.2f%%, test loss %.4f (%.1fs)",
                         p->epoch, p->epochs, p->loss, 100.0 * p->train_acc, p->samples_per_sec,
                         100.0 * p->test_acc, p->test_loss, ns_to_sec(now - pr->start_ns));
                if (pr->n_rates < (int)ELEMENTSOF(pr->rates))
                        pr->rates[pr->n_rates++] = p->samples_per_sec;
                pr->test_acc = p->test_acc;
                pr->test_loss = p->test_loss;
                pr->last_ns = now;
                return 0;
        }
        if (pr->interval_ms && now - pr->last_ns >= (uint64_t)pr->interval_ms * 1000000ULL) {
                log_info("epoch %d/%d step %zu/%zu: loss %.4f, acc %.2f%%, %.0f samples/s",
                         p->epoch, p->epochs, p->step, p->steps_per_epoch, p->loss,
                         100.0 * p->train_acc, p->samples_per_sec);
                pr->last_ns = now;
        }
        return 0;
}

int local_run(const Job *job, const LocalRunOptions *o, const volatile sig_atomic_t *stop,
              LocalRunResult *ret) {
        _cleanup_(dataset_freep) Dataset *train = NULL, *test = NULL;
        _cleanup_(trainer_freep) Trainer *t = NULL;
        const char *dir = o->data_dir ?: job->data.path;
        TrainSpec spec = job->train;
        Diag d = {};
        int r;

        r = ops_blas_set_threads(o->threads);
        if (r < 0)
                return log_error_errno(r, "Failed to start %d compute threads: %m", o->threads);
        if (o->epochs > 0)
                spec.epochs = o->epochs;
        if (o->n_shards > 0) {
                spec.shard = o->shard;
                spec.n_shards = o->n_shards;
        }

        r = dataset_load_dir(dir, "train", job->data.classes, &train, &d);
        if (r >= 0)
                r = dataset_load_dir(dir, "t10k", job->data.classes, &test, &d);
        if (r < 0) {
                if (r == -ENOENT)
                        log_error("Dataset %s not found in %s (install Debian's dataset-fashion-mnist "
                                  "or set dataset.path in %s)", job->data.name, dir, job->path);
                return log_error_errno(r, "Failed to load the dataset: %s", d.text);
        }
        dataset_set_normalization(train, (float)job->data.mean, (float)job->data.std);
        dataset_set_normalization(test, (float)job->data.mean, (float)job->data.std);

        r = trainer_new(&job->model, &job->optim, &spec, train, test, &ops_blas, &t, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to set up job %s: %s", job->name, d.text);

        log_info("Training %s: %d layers, %zu parameters (%.1f MiB), %s lr %g, batch %d, %d epochs, "
                 "%zu training and %zu test samples%s, %d BLAS threads",
                 job->name, job->model.n_layers, t->stage->n_params,
                 (double)t->stage->n_params * 4 / (1 << 20), optim_kind_to_string(job->optim.kind),
                 (double)job->optim.lr, spec.batch_size, spec.epochs, train->n, test->n,
                 spec.n_shards > 1 ? " (this node reads its shard)" : "", ops_blas_get_threads());

        Progress pr = { .o = o, .trainer = t, .interval_ms = o->progress_interval_ms, .start_ns = now_ns() };
        pr.last_ns = pr.start_ns;
        r = trainer_run(t, on_progress, &pr, stop);
        if (r == -ECANCELED)
                log_notice("Stopped after %d complete epochs", pr.n_rates);
        else if (r < 0)
                return log_error_errno(r, "Training failed: %m");
        else
                log_info("Finished %s: test accuracy %.2f%%", job->name, 100.0 * pr.test_acc);

        if (ret) {
                qsort(pr.rates, (size_t)pr.n_rates, sizeof(double), cmp_double);
                *ret = (LocalRunResult){
                        .test_acc = pr.test_acc,
                        .test_loss = pr.test_loss,
                        .samples_per_sec = pr.n_rates ? pr.rates[pr.n_rates / 2] : 0.0,
                        .epochs_done = pr.n_rates,
                };
        }
        return r;
}
