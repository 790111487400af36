/* run/local-run.c */
#include "local-run.h"

#include <stdio.h>
#include <stdlib.h>

#include "cluster/capability.h"
#include "control.h"
#include "series.h"
#include "stage-checkpoint.h"
#include "tensor/ops.h"
#include "util/log.h"
#include "util/rss.h"
#include "util/time-util.h"

typedef struct Progress {
        const LocalRunOptions *o;
        Trainer *trainer;
        uint64_t samples; /* this epoch, at the last step */
        unsigned interval_ms;
        uint64_t last_ns;
        uint64_t start_ns;
        double rates[64]; /* samples/s of the first epochs of this run, for the median */
        int n_rates;
        int epochs_run;   /* epochs this run finished, however many */
        double test_acc, test_loss;
        const Job *job;
        CheckpointInfo at;   /* where training is: what a checkpoint records */
        uint64_t last_report_ns;
        /* the busy fraction: time held at the gate (paused, throttled),
         * the hold under way since gate_since (0: none) */
        uint64_t gate_ns, gate_since, window_gate_ns, window_ns;
        double busy;
        /* the window's loss and samples, and what the last window gave:
         * the published loss and samples/s, over the wall clock (rests
         * and pauses included); < 0 before the first window */
        double window_loss_sum;
        uint64_t window_samples;
        SeriesRate window_rate; /* since the last window's end */
        double loss, rate;
        TrainProgress last;  /* for the series' last row */
        Series series;
} Progress;

static void progress_done(Progress *pr) {
        series_close(&pr->series);
}

static int save_checkpoint(Progress *pr, bool last) {
        const LocalRunOptions *o = pr->o;
        pr->at.batch = (uint32_t)pr->trainer->spec.batch_size;
        return stage_checkpoint_save(o->checkpoint_dir, pr->job->name, pr->trainer->stage, &pr->trainer->optim,
                                     &pr->at, last);
}

static void series_tick(Progress *pr, const TrainProgress *p, uint64_t now, bool last);
static void report_training(Progress *pr, const TrainProgress *p, uint64_t now);

/* The gate's serve(): the daemon's poll, paused or resting; the series'
 * rows go on while paused, and the status says where training stopped
 * (the last report may be steps behind). */
static void serve_local(void *ud, bool paused) {
        Progress *pr = ud;
        if (pr->o->poll)
                pr->o->poll(pr->o->poll_userdata);
        if (paused && pr->last.epoch > 0) {
                uint64_t now = now_ns();
                series_tick(pr, &pr->last, now, false);
                report_training(pr, &pr->last, now);
        }
}

/* The daemon's status: where training is, and its figures. */
static void report_training(Progress *pr, const TrainProgress *p, uint64_t now) {
        const LocalRunOptions *o = pr->o;
        NodeTraining t = {
                .cluster = -1,
                .stage = -1,
                .epoch = p->epoch,
                .epochs = p->epochs,
                .step = pr->at.step,
                .loss = pr->loss >= 0 ? pr->loss : p->loss,
                .samples_per_sec = pr->rate >= 0 ? pr->rate : p->samples_per_sec,
                .busy = pr->busy,
                .test_accuracy = pr->test_acc,
                .test_loss = pr->test_acc >= 0 ? pr->test_loss : -1.0,
        };
        snprintf(t.role, sizeof t.role, "%s", o->n_shards > 1 ? "member" : "standalone");
        snprintf(t.job, sizeof t.job, "%s", pr->job->name);
        control_report_training(o->control, &t);
        pr->last_report_ns = now;
}

/* Between two steps: the daemon's status, pause, stop and checkpoints. */
static int pass_gate(Progress *pr, const TrainProgress *p, uint64_t now) {
        const LocalRunOptions *o = pr->o;
        int r;

        if (now - pr->last_report_ns >= 250 * 1000000ULL || p->epoch_done)
                report_training(pr, p, now);
        pr->gate_since = now_ns();
        /* a checkpoint asked for while paused is written, and the pause goes on */
        while ((r = control_gate(o->control, serve_local, pr)) == CONTROL_CHECKPOINT) {
                int k = o->checkpoint_dir ? save_checkpoint(pr, false) : -EOPNOTSUPP;
                report_training(pr, p, now_ns()); /* Step where CheckpointStep is */
                control_checkpoint_done(o->control, k, pr->at.step);
        }
        pr->gate_ns += now_ns() - pr->gate_since;
        pr->gate_since = 0;
        return r;
}

/* Every 2 s (and at the end): the busy fraction, the loss and samples/s of
 * the last window, and a row of the series. */
static void series_tick(Progress *pr, const TrainProgress *p, uint64_t now, bool last) {
        if (!last && now - pr->window_ns < SERIES_INTERVAL_NS)
                return;
        uint64_t span = now - pr->window_ns, gated = pr->gate_ns + (pr->gate_since ? now - pr->gate_since : 0);
        bool trained = pr->window_samples > 0;
        pr->busy = span ? CLAMP(1 - (double)(gated - pr->window_gate_ns) / (double)span, 0.0, 1.0) : 1.0;
        if (span)
                pr->rate = series_rate(&pr->window_rate, pr->at.samples, now);
        if (trained)
                pr->loss = pr->window_loss_sum / (double)pr->window_samples;
        pr->window_loss_sum = 0;
        pr->window_samples = 0;
        pr->window_ns = now;
        pr->window_gate_ns = gated;
        if (pr->series.fd < 0)
                return;
        NodeStatus st = {};
        if (pr->o->control) /* what the daemon's averaging reported */
                control_snapshot(pr->o->control, NULL, &st, NULL, NULL, NULL);
        const NodeTraffic *t = &st.network.traffic;
        SeriesRow row = {
                .epoch = p->epoch,
                .step = pr->at.step,
                .train_loss = trained ? pr->loss : -1, /* a window paused throughout: none */
                .valid_loss = pr->test_loss,
                .samples_per_sec = pr->rate,
                .busy = pr->busy,
                .pipeline_bytes = t->pipeline_sent + t->pipeline_received,
                .averaging_bytes = t->averaging_sent + t->averaging_received,
                .averaging_rounds = st.network.rounds_done,
        };
        (void)rss_self_bytes(&row.rss_bytes);
        int r = series_append(&pr->series, &row);
        if (r < 0)
                log_warning_errno(r, "Failed to write the series: %m; it stops here, training goes on");
}

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
        if (pr->o->last_round && !p->epoch_done && p->epoch == p->epochs && p->step == p->steps_per_epoch) {
                log_info("Training done: a last averaging round before the evaluation");
                pr->o->last_round(pr->o->step_userdata, pr->trainer->stage->params);
        }
        if (!p->epoch_done) {
                uint64_t prev = p->samples >= pr->samples ? pr->samples : 0; /* 0: a new epoch */
                pr->window_loss_sum += p->loss * (double)p->samples - pr->last.loss * (double)prev;
                pr->window_samples += p->samples - prev;
                pr->at.samples += p->samples - pr->samples;
                pr->at.step++;
        }
        pr->samples = p->epoch_done ? 0 : p->samples;
        pr->last = *p;
        /* a resumed run starts after the last step done */
        pr->at.epoch = (uint64_t)p->epoch - (p->epoch_done ? 0 : 1);
        pr->at.step_in_epoch = p->epoch_done ? 0 : p->step;
        if (p->epoch_done) {
                log_info("epoch %d/%d done: train loss %.4f, train acc %.2f%%, %.0f samples/s, "
                         "test acc %.2f%%, test loss %.4f (%.1fs)",
                         p->epoch, p->epochs, p->loss, 100.0 * p->train_acc, p->samples_per_sec,
                         100.0 * p->test_acc, p->test_loss, ns_to_sec(now - pr->start_ns));
                pr->epochs_run++;
                if (pr->n_rates < (int)ELEMENTSOF(pr->rates))
                        pr->rates[pr->n_rates++] = p->samples_per_sec;
                pr->test_acc = p->test_acc;
                pr->test_loss = p->test_loss;
                pr->last_ns = now;
                series_tick(pr, p, now, false);
                return pr->o->control ? pass_gate(pr, p, now) : 0;
        }
        if (pr->interval_ms && now - pr->last_ns >= (uint64_t)pr->interval_ms * 1000000ULL) {
                log_info("epoch %d/%d step %zu/%zu: loss %.4f, acc %.2f%%, %.0f samples/s",
                         p->epoch, p->epochs, p->step, p->steps_per_epoch, p->loss,
                         100.0 * p->train_acc, p->samples_per_sec);
                pr->last_ns = now;
        }
        series_tick(pr, p, now, false);
        return pr->o->control ? pass_gate(pr, p, now) : 0;
}

int local_run_load_data(const Job *job, const char *dir, Dataset **ret_train, Dataset **ret_test) {
        Diag d = {};
        int r = job_load_split(job, dir, false, ret_train, &d);
        if (r >= 0 && ret_test)
                r = job_load_split(job, dir, true, ret_test, &d);
        if (r < 0) /* (the daemon said where to get missing data when it checked the job) */
                return log_error_errno(r, "Failed to load the dataset: %s", diag_reason(&d, r));
        const Dataset *t = *ret_train;
        if (t->text_left_out > 0)
                log_notice("Text corpus %s: %u files read, %u left out (not regular files, empty, or not UTF-8 "
                           "text; the first by name: %s)", dir ?: job->data.path, t->text_files, t->text_left_out,
                           t->text_first_left_out);
        else if (t->text_files > 0)
                log_info("Text corpus %s: %u files read", dir ?: job->data.path, t->text_files);
        return 0;
}

/* What the lone trainer of job will hold for batches of batch samples:
 * parameters, gradients, the optimizer's state and one trace. */
static uint64_t lone_trainer_bytes(const Job *job, int batch) {
        size_t n = model_spec_params(&job->model, 0, job->model.n_layers);
        return (uint64_t)(2 * n + optim_state_floats(job->optim.kind, n)) * sizeof(float) +
               model_trace_bytes(&job->model, batch);
}

/* A job that needs more memory than the machine has available is refused
 * before anything is allocated: the kernel would take the machine's owner
 * to the brink (or the OOM killer the daemon) long before it said no. */
static int check_memory(const Job *job, int batch) {
        uint64_t need = lone_trainer_bytes(job, batch), avail;
        if (capability_memory(0, NULL, &avail) < 0 || need <= avail)
                return 0;
        return log_error_errno(-ENOMEM, "Job %s needs %.1f MiB for batches of %d (parameters, gradients, optimizer "
                               "state, activations), and this machine has %.1f MiB available: a smaller "
                               "batch_size or model, or a machine with more memory", job->name,
                               (double)need / (1 << 20), batch, (double)avail / (1 << 20));
}

int local_run(const Job *job, const LocalRunOptions *o, const volatile sig_atomic_t *stop,
              LocalRunResult *ret) {
        _cleanup_(dataset_freep) Dataset *train = NULL, *test = NULL;
        _cleanup_(trainer_freep) Trainer *t = NULL;
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

        if ((r = local_run_load_data(job, o->data_dir, &train, &test)) < 0)
                return r;
        if ((r = check_memory(job, trainer_max_batch(&spec, train->n, test->n))) < 0)
                return r;

        r = trainer_new(&job->model, &job->optim, &spec, train, test, &ops_blas, &t, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to set up job %s: %s", job->name, diag_reason(&d, r));

        log_info("Training %s: %d layers, %zu parameters (%.1f MiB), %s lr %g, batch %d, %d epochs, "
                 "%zu training and %zu test samples%s, %d BLAS threads",
                 job->name, job->model.n_layers, t->stage->n_params,
                 (double)t->stage->n_params * 4 / (1 << 20), optim_kind_to_string(job->optim.kind),
                 (double)job->optim.lr, spec.batch_size, spec.epochs, train->n, test->n,
                 spec.n_shards > 1 ? " (this node reads its shard)" : "", ops_blas_get_threads());

        _cleanup_(progress_done) Progress pr = { .o = o, .trainer = t, .interval_ms = o->progress_interval_ms,
                        .start_ns = now_ns(), .job = job, .test_acc = -1.0, .test_loss = -1.0, .busy = -1.0,
                        .loss = -1.0, .rate = -1.0, .series = SERIES_CLOSED };
        pr.last_ns = pr.window_ns = pr.start_ns;
        if (o->series_dir && (r = series_open(&pr.series, o->series_dir, job->name)) < 0)
                log_full_errno(LOG_NOTICE, r, "No series of this run in %s: %m", o->series_dir);
        if (o->checkpoint_dir && o->load_checkpoint &&
            stage_checkpoint_load(o->checkpoint_dir, job->name, t->stage, &t->optim, &pr.at) >= 0) {
                t->start_epoch = (int)MIN(pr.at.epoch, (uint64_t)spec.epochs);
                t->start_step = stage_checkpoint_resume_step(&pr.at, (unsigned)spec.batch_size);
                if (t->start_step >= trainer_steps_per_epoch(t) && t->start_epoch < spec.epochs) {
                        /* every step of that epoch was done: the next one */
                        pr.at.epoch = (uint64_t)++t->start_epoch;
                        pr.at.step_in_epoch = t->start_step = 0;
                }
                if (o->control)
                        control_report_checkpoint(o->control, pr.at.step);
        }
        series_rate_start(&pr.window_rate, 0, pr.at.samples, pr.window_ns); /* the samples of this run alone */
        if (o->begin)
                o->begin(o->step_userdata, t->stage->params, &t->optim);
        /* the gate before the first step too: a node that starts paused
         * (its machine not idle yet) takes no step until it may; a trained
         * job's epoch is its last */
        TrainProgress first = { .epoch = MIN(t->start_epoch + 1, spec.epochs), .epochs = spec.epochs, .loss = -1.0 };
        uint64_t loaded_step = pr.at.step;
        r = o->control ? pass_gate(&pr, &first, now_ns()) : 0;
        if (r >= 0)
                r = trainer_run(t, on_progress, &pr, stop);
        if (pr.last.epoch > 0) { /* the last window: the series' last row, and the figures the node ends with */
                series_tick(&pr, &pr.last, now_ns(), true);
                if (o->control)
                        report_training(&pr, &pr.last, now_ns());
        }
        /* on the way out, so a restart goes on from here: the file as it
         * was when this run trained nothing of a trained job */
        bool trained = t->start_epoch < spec.epochs || pr.at.step != loaded_step;
        if (o->checkpoint_dir && o->control && (r >= 0 || r == -ECANCELED) && trained) {
                int k = save_checkpoint(&pr, true);
                if (k >= 0)
                        control_report_checkpoint(o->control, pr.at.step);
                else if (r >= 0) /* the job's one product: not a success */
                        return log_error_errno(k, "Finished %s, but the trained model was not saved (above)",
                                               job->name);
        }
        if (r >= 0 && t->start_epoch >= spec.epochs) {
                log_info("The checkpoint holds the trained job: evaluating it");
                trainer_evaluate(t, test, &pr.test_acc, &pr.test_loss);
                if (o->control)
                        report_training(&pr, &first, now_ns());
        }
        if (r == -ECANCELED)
                log_notice("Stopped with %llu epochs done (%d of them in this run)", (unsigned long long)pr.at.epoch,
                           pr.epochs_run);
        else if (r == -ERANGE)
                return log_error_errno(r, "Training diverged: the loss of epoch %d step %zu is not finite; stopping "
                                          "(no checkpoint written: a restart goes on from the last good one)",
                                       t->diverged_epoch, t->diverged_step);
        else if (r < 0)
                return log_error_errno(r, "Training failed: %m");
        else
                log_info("Finished %s: test accuracy %.2f%%, test loss %.4f", job->name, 100.0 * pr.test_acc,
                         pr.test_loss);

        if (ret) {
                qsort(pr.rates, (size_t)pr.n_rates, sizeof(double), cmp_double);
                *ret = (LocalRunResult){
                        .test_acc = pr.test_acc,
                        .test_loss = pr.test_loss,
                        .samples_per_sec = pr.n_rates ? pr.rates[pr.n_rates / 2] : 0.0,
                        .epochs_done = pr.epochs_run,
                };
        }
        return r;
}
