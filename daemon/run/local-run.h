/* run/local-run.h — run a job on this node alone (a cluster of one node
 * holding the whole model), logging progress the way an operator reads it.
 *
 *     LocalRunOptions o = { .threads = 2, .progress_interval_ms = 1000 };
 *     r = local_run(&job, &o, &stop_flag);     // logs; returns 0, -ECANCELED, or -errno
 */
#pragma once

#include <signal.h>
#include <stdbool.h>

#include "conf/job.h"

/* What a run measured of its links on their real traffic (TCP_INFO), for
 * membership: the smallest delivery rate a sender was not holding back
 * (bytes/s) and the largest one-way latency (seconds); 0 until measured. */
typedef struct LinkFigures {
        double bandwidth, latency;
} LinkFigures;

/* pipeline_run() under membership: the layers the stage trained last and
 * its optimizer's state, and the outer optimizer's, kept in memory from one
 * plan to the next, so a node whose layers stay the same goes on with them
 * (stage_carry_clear() frees it). */
typedef struct StageCarry {
        int lo, hi;           /* the layers trained last; lo == hi: none */
        size_t n;             /* their parameters */
        uint64_t t;           /* the optimizer's steps; STAGE_CARRY_T_SWARM: the swarm's updates */
        float *optim;         /* optim_state_floats() values; NULL: not kept */
        float *outer;         /* the outer optimizer's anchor, then its momentum (2n); NULL: none */
} StageCarry;

#define STAGE_CARRY_T_SWARM UINT64_MAX /* state handed over: as many steps as the swarm's updates */

void stage_carry_clear(StageCarry *c);

typedef struct LocalRunOptions {
        int threads;              /* OpenBLAS threads; <= 0 leaves the default */
        int epochs;               /* > 0 overrides the job */
        unsigned progress_interval_ms;
        const char *data_dir;     /* overrides the job's dataset path */
        void (*poll)(void *userdata); /* called between steps (the network, say) */
        void *poll_userdata;
        /* called after every step with the parameter slab (averaging) */
        void (*step)(void *userdata, float *params, uint64_t samples);
        /* called once before the first step, after the checkpoint (averaging_begin) */
        void (*begin)(void *userdata, float *params, struct Optim *optim);
        /* called once after the job's last step, before its evaluation: the
         * last averaging round, so the members leave as one model (averaging_final) */
        void (*last_round)(void *userdata, float *params);
        void *step_userdata;
        int shard, n_shards;      /* this node's part of the training set; n_shards 0: all */
        /* The daemon's: pause, stop and checkpoint requests between steps,
         * status reports (NULL: none). */
        struct Control *control;
        const char *checkpoint_dir; /* checkpoints on request and on stop; NULL: none */
        bool load_checkpoint;       /* resume from the last one at start */
        bool retire_checkpoints;    /* membership: a checkpoint written retires those of other layer ranges */
        const char *series_dir;     /* the series (run/series.h) appended there; NULL: none */
        /* pipeline_run() under membership: the whole model's parameters
         * (layer i at model_spec_params(m, 0, i)); the stage writes its
         * slice back when it stops, and starts from it with
         * load_model_params (else from the job's initialization). */
        float *model_params;
        bool load_model_params;
        StageCarry *carry;          /* written when the stage stops; read at start when its layers match */
        uint64_t resume_samples;    /* samples every cluster trained before: where to go on from */
        uint64_t *ret_samples;      /* pipeline_run(): samples this first stage trained */
        /* pipeline_run(): when set, stop at a safe point: the micro-batches
         * on the way finish first, passed down the stages ("RVPQ"), then
         * -ECANCELED. *stop stops at once. */
        const volatile sig_atomic_t *quiesce;
        LinkFigures *links;         /* pipeline_run(): its pipeline links, updated every second */
        /* pipeline_run() under membership: whether the coordinator dialed
         * this node back (reach_error 0) or could not (a positive errno),
         * for the Reachability it reports; reach_checked false: not known. */
        bool reach_checked;
        int reach_error;
} LocalRunOptions;

typedef struct LocalRunResult {
        double test_acc, test_loss;
        double samples_per_sec;   /* median over epochs */
        int epochs_done;
} LocalRunResult;

/* The job's training split from dir (NULL: the job's path) and, if ret_test
 * is given, its test split; logs what went wrong, and which files of a text
 * corpus were left out. */
int local_run_load_data(const Job *job, const char *dir, Dataset **ret_train, Dataset **ret_test);
int local_run(const Job *job, const LocalRunOptions *o, const volatile sig_atomic_t *stop,
              LocalRunResult *ret);
