/* run/stage-checkpoint.h — a stage's parameters, optimizer state and
 * counters saved to and restored from <state_directory>, logged the way an
 * operator reads it (the file format is run/checkpoint.h).
 *
 * One file per job and layer range, "<job>.layers-<lo>-<hi>.ckpt", so a node
 * that moves to another stage or job never loads a checkpoint that is not
 * its own.
 *
 *     CheckpointInfo at = { .epoch = e, .step_in_epoch = s, .step = step, ... };
 *     r = stage_checkpoint_save(dir, job->name, stage, &optim, &at, false);   // logs the event
 *     r = stage_checkpoint_load(dir, job->name, stage, &optim, &at);   // 0 loaded, -ENOENT none
 */
#pragma once

#include "checkpoint.h"
#include "nn/optim.h"
#include "nn/stage.h"

/* The file of job's layers [lo, hi) in a state directory,
 * "<job>.layers-<lo>-<hi>.ckpt" (a '/' in the job's name becomes '_'). */
void stage_checkpoint_name(const char *job, int lo, int hi, char *buf, size_t len);

/* Save the stage's parameters and o's state with the counters in at (job,
 * layers, sizes and optimizer fields are filled here). Logs, a failure
 * with what is left: the previous checkpoint or none, and whether training
 * goes on (last: the one written as training ends, which is the caller's
 * to treat as an error). */
int stage_checkpoint_save(const char *dir, const char *job, const Stage *s, const Optim *o, const CheckpointInfo *at,
                          bool last);
/* Restore them into s and o (o->t too) and return the counters in *ret.
 * -ENOENT when there is none; any other error (a checkpoint of another
 * optimizer, or of layers other than s's: checkpoint_model_check()) is
 * logged and leaves s and o as they were, so training starts afresh. */
int stage_checkpoint_load(const char *dir, const char *job, Stage *s, Optim *o, CheckpointInfo *ret);
/* The same for the layers [lo, hi) of a model held elsewhere (layers
 * holds those hi - lo, as layer_init() filled them in; a checkpoint of
 * other layers is refused): their parameters into params and the state of
 * an optimizer of optim_kind into optim (n_params and n_state floats, as
 * the file must hold). */
int stage_checkpoint_load_layers(const char *dir, const char *job, const Layer *layers, int lo, int hi,
                                 float *params, size_t n_params, uint32_t optim_kind, float *optim, size_t n_state,
                                 CheckpointInfo *ret);
/* The step of the epoch to go on from with batch samples a step: at's
 * step_in_epoch when the checkpoint's batch was the same (or not
 * recorded), else as many of the new steps as the samples it had done
 * fill (none skipped; fewer than a batch done twice). */
size_t stage_checkpoint_resume_step(const CheckpointInfo *at, unsigned batch);
/* The layers of job's checkpoint written last in dir, whatever its range (a
 * node under membership moves between ranges): 0, -ENOENT when there is
 * none, or -errno when dir cannot be read. */
int stage_checkpoint_newest(const char *dir, const char *job, int *ret_lo, int *ret_hi);
/* A node under membership that no longer holds some layers (it moved, or is
 * a spare) retires their checkpoints: every file of job's other than the
 * range [keep_lo, keep_hi) (-1, -1: every one) is renamed to
 * "<name>.retired", its ".outer" file too, so no restart loads layers that
 * others trained on since. The number retired, or a logged -errno. */
int stage_checkpoint_retire(const char *dir, const char *job, int keep_lo, int keep_hi);

/* The outer optimizer's state of the stage (averaging.outer: the anchor and
 * its momentum, n values each) in a file of its own next to the stage's,
 * "<job>.layers-<lo>-<hi>.ckpt.outer", written before it with the same
 * counters: at.step tells a loader whether the two belong together. Save
 * logs failures only; load returns -ENOENT when there is none, logs and
 * returns any other error (anchor and momentum then untouched), and logs a
 * warning when the file's step is not want_step. ret_rounds: the outer
 * rounds the file says were done. */
int stage_checkpoint_save_outer(const char *dir, const char *job, const Stage *s, const float *anchor,
                                const float *momentum, uint64_t outer_rounds, const CheckpointInfo *at);
int stage_checkpoint_load_outer(const char *dir, const char *job, const Stage *s, float *anchor, float *momentum,
                                uint64_t want_step, uint64_t *ret_rounds);
