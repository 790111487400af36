/* pipeline/trainer.h — the degenerate pipeline: one node holds every stage.
 *
 * This is what a cluster of one node runs: read a batch from the data shard,
 * forward, loss, backward, optimizer step, and report. Later pipeline code
 * splits the same loop across nodes; the pieces (Stage, Trace, Optim,
 * Sampler) are the ones it uses.
 *
 *     Trainer *t;
 *     r = trainer_new(&model, &optim, &spec, train, test, &ops_blas, &t, &d);
 *     r = trainer_run(t, on_progress, userdata, &stop_flag);   // -ECANCELED if stopped, -ERANGE if diverged
 *     trainer_free(t);
 */
#pragma once

#include <signal.h>
#include <stdbool.h>

#include "data/dataset.h"
#include "nn/stage.h"

typedef struct TrainSpec {
        int batch_size;
        int epochs;
        uint64_t seed;
        int shard, n_shards; /* which part of the training set this node reads */
} TrainSpec;

typedef struct TrainProgress {
        int epoch;  /* 1-based */
        int epochs;
        size_t step; /* within the epoch, 1-based */
        size_t steps_per_epoch;
        uint64_t samples;       /* trained this epoch */
        double loss;            /* mean training loss this epoch so far */
        double train_acc;       /* fraction correct this epoch so far */
        double samples_per_sec; /* this epoch, compute only (no evaluation) */
        double test_acc;        /* at the end of an epoch, else negative */
        double test_loss;
        bool epoch_done;
} TrainProgress;

/* Called after every step and at the end of every epoch. A negative return
 * stops training with that error. */
typedef int (*TrainProgressFn)(const TrainProgress *p, void *userdata);

typedef struct Trainer {
        TrainSpec spec;
        const Ops *ops;
        Stage *stage;
        Optim optim;
        Trace *trace;
        int max_batch;   /* the most samples a batch holds: batch_size, or fewer when the data has fewer */
        int rows;        /* loss rows per sample: 1, or T for a language model */
        int classes;     /* of each row */
        int32_t *labels; /* (batch, rows) */
        float *dlogits;  /* (batch, rows, classes) */
        const Dataset *train, *test;
        Sampler sampler;
        /* Where trainer_run() starts: 0-based epoch and step within it (a
         * resumed checkpoint); 0, 0 from the beginning. */
        int start_epoch;
        size_t start_step;
        /* trainer_run() returned -ERANGE: the epoch and step (1-based) after
         * which the loss or a parameter was not finite */
        int diverged_epoch;
        size_t diverged_step;
} Trainer;

/* Whether a model can train on a dataset (dataset_check_fit(): the input
 * shape, the classes), from the data loaded or from its files' headers.
 * Every mode goes through these before it trains. */
int model_check_data_shape(const ModelSpec *model, const DatasetShape *s, Diag *d);
int model_check_data(const ModelSpec *model, const Dataset *ds, Diag *d);

int trainer_new(const ModelSpec *model, const OptimSpec *optim, const TrainSpec *spec,
                const Dataset *train, const Dataset *test, const Ops *ops, Trainer **ret, Diag *d);
/* The most samples a batch of spec's will hold on n_train training and
 * n_test test samples: batch_size, or the larger of this node's shard and
 * the test set when both are smaller (what trainer_new() sizes for). */
int trainer_max_batch(const TrainSpec *spec, size_t n_train, size_t n_test);
Trainer *trainer_free(Trainer *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(Trainer *, trainer_free);

/* One optimizer step on the B samples already in trace_input()/labels.
 * Returns the batch's mean loss over its B * rows rows; *ret_correct gets
 * the number of rows right. */
float trainer_step(Trainer *t, int B, int *ret_correct);

/* Accuracy and mean loss over a whole dataset (per row: per token for a
 * language model), forward passes only. */
void trainer_evaluate(Trainer *t, const Dataset *ds, double *ret_acc, double *ret_loss);

/* Steps in an epoch of this node's shard (the last may be short). */
size_t trainer_steps_per_epoch(const Trainer *t);
/* Train spec.epochs epochs. Checks *stop between steps; returns 0 when all
 * epochs ran, -ECANCELED when stopped, -ERANGE when a step's loss or a
 * parameter after it is not finite (training diverged: diverged_epoch and diverged_step say where;
 * the parameters are not to be kept), or the callback's error. */
int trainer_run(Trainer *t, TrainProgressFn cb, void *userdata, const volatile sig_atomic_t *stop);
