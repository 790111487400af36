/* pipeline/pipe.h — one stage of a cluster's pipeline: micro-batches go
 * forward, their gradients come back, and the stage updates its parameters
 * as soon as a gradient (or update_frequency of them) is complete.
 *
 * The first stage reads micro-batches from its shard of the training set and
 * keeps up to in_flight of them on the way without waiting for their
 * backward passes (the asynchronous, bubble-free schedule); labels travel
 * ahead of the activations to the last stage, which computes the loss and
 * sends the gradient back at once. Weight stashing: a micro-batch's backward
 * pass uses the parameter version its forward pass used; a version is copied
 * only when an update (or an averaging round's delta, pipe_stash_live())
 * would change it while micro-batches still need it, so at most in_flight
 * copies exist. With predict_weights, a forward pass that k updates will
 * overtake runs on a copy of its own, w + k * (the last update), the
 * weights its gradient will meet (weight prediction). Over the first
 * sync_updates updates the first stage keeps only one update's
 * micro-batches on the way, so no gradient lands late while the loss falls
 * fastest. The synchronous schedule (in_flight micro-batches form a batch:
 * all forward, then all backward, one update) is the same code with the
 * first stage waiting for a batch to drain.
 *
 * A broken link loses the micro-batches on the way through it: the stages
 * on each side drop what they hold of them and tell the stages beyond
 * (FLUSH, answered by FLUSH-ACK; until the answer, what still comes from
 * that side belongs to the dropped micro-batches and is discarded), so a
 * neighbour that comes back finds a pipeline ready to fill again.
 *
 * Training ends with a TRAINED message passed down the stages once every
 * micro-batch is back; a stage can hold there (hold_after_training) while
 * its owner averages it one last time, so the test set is evaluated on the
 * averaged model.
 *
 * A Pipe does no I/O of its own: pipe_on_tensor() takes what the Net
 * delivered, pipe_work() does one unit of work and queues what it produces
 * on the Net.
 *
 *     Pipe *p;
 *     r = pipe_new(&cfg, &ops_blas, &p, &d);
 *     pipe_connect(p, net, prev_peer, next_peer);    // -1 at the ends
 *     // Net callbacks: pipe_on_tensor(p, t), pipe_on_sent(p, cookie), pipe_on_control(...)
 *     while ((r = pipe_work(p)) != PIPE_FINISHED)
 *             net_run(net, r > 0 ? 0 : 5);
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "data/dataset.h"
#include "net/net.h"
#include "nn/optim.h"
#include "nn/stage.h"

typedef enum PipeSchedule {
        PIPE_ASYNC, /* up to in_flight micro-batches on the way, updates as gradients come */
        PIPE_SYNC,  /* in_flight micro-batches per batch, one update per batch */
} PipeSchedule;

typedef struct PipeConfig {
        const ModelSpec *model;
        int lo, hi;                 /* this stage's layers */
        uint64_t seed;              /* initialization: the same on every stage */
        const OptimSpec *optim;
        int micro_batch;            /* samples */
        int in_flight;              /* the staleness bound tau (sync: micro-batches per batch) */
        int update_frequency;       /* gradients per update (sync: forced to in_flight) */
        PipeSchedule schedule;
        uint64_t total_updates;     /* for the learning-rate schedule */
        /* asynchronous: a forward pass runs on the parameters its gradient
         * will meet, predicted from the last update (pipe.c) */
        bool predict_weights;
        /* asynchronous: updates at the start with only one update's
         * micro-batches in flight (no gradient lands late) */
        uint64_t sync_updates;
        /* the first stage only: what it trains on and evaluates with */
        const Dataset *train, *test;
        int shard, n_shards;
        int epochs;
        uint64_t data_seed;
        /* After training, before evaluation, pipe_work() returns PIPE_HELD
         * until pipe_release(): time for a last averaging round. */
        bool hold_after_training;
} PipeConfig;

typedef struct PipeStats {
        /* Where the time went since pipe_connect(): computing (forward,
         * backward, updates), waiting with nothing to do until a neighbour
         * sends something (the pipeline's bubble), and the rest, which is
         * moving tensors (the network stack, encryption, copies). A stage
         * is busy when it is not waiting. */
        uint64_t elapsed_ns, compute_ns, wait_ns;
        /* The same from this stage's first training micro-batch to the end
         * of training here: the schedule's own figures, without the wait for
         * the neighbours at the start or the evaluation at the end. */
        uint64_t train_ns, train_compute_ns, train_wait_ns;
        unsigned in_flight;            /* first stage: micro-batches sent and not yet back */
        unsigned versions;             /* stashed parameter copies held now */
        uint64_t forwards, backwards, updates;
        uint64_t samples;              /* trained through this stage */
        uint64_t lost;                 /* micro-batches dropped because a link in the pipeline broke */
        double loss_sum, correct;      /* last stage: over the `scored` samples so far */
        uint64_t scored;
        int epoch;                     /* first stage: 1-based, at most epochs */
        int epochs_done;               /* first stage: epochs whose every micro-batch was sent */
        size_t step_in_epoch;          /* first stage: micro-batches of this epoch sent */
        double test_acc, test_loss;    /* last stage, after an evaluation; < 0 before */
} PipeStats;

typedef struct Pipe Pipe;

#define PIPE_FINISHED 2
#define PIPE_HELD 3

/* part of whole in percent (0 for an empty whole) */
double pipe_percent(uint64_t part, uint64_t whole);

int pipe_new(const PipeConfig *c, const Ops *ops, Pipe **ret, Diag *d);
Pipe *pipe_free(Pipe *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(Pipe *, pipe_free);
Stage *pipe_stage(Pipe *p);
int pipe_micro_batch(const Pipe *p);
Optim *pipe_optim(Pipe *p);
/* Before any work, after loading a checkpoint into pipe_stage() and
 * pipe_optim(): go on from that many updates (the learning-rate schedule)
 * and, on the first stage, from step `step` of 0-based epoch `epoch` (the
 * epochs done); with every epoch done, straight to the evaluation. */
void pipe_resume(Pipe *p, int epoch, size_t step, uint64_t updates);
void pipe_connect(Pipe *p, Net *net, int64_t prev_peer, int64_t next_peer);
/* Give the Net back every tensor still queued: call before net_free(), whose
 * sent() callbacks may still reach the pipe; free the pipe after it. */
void pipe_drop_queued(Pipe *p);
/* A tensor from a neighbour; consumed in every case. -EBADMSG: not what that
 * neighbour may send; -ERANGE: activations or gradients with a NaN or an
 * infinity, which would poison every later step (the caller drops the link
 * either way). */
int pipe_on_tensor(Pipe *p, NetTensor *t);
void pipe_on_sent(Pipe *p, uint64_t cookie);
/* A CONTROL payload from a neighbour (the end of training is one):
 * -EBADMSG for one malformed or out of place, or the error of the answer
 * it asks for that could not be queued (-ENOBUFS: the neighbour would wait
 * for it forever; the caller drops the link either way). */
int pipe_on_control(Pipe *p, uint32_t peer, const uint8_t *payload, size_t len);
/* One unit of work: 1 if something was done, 0 if waiting for a neighbour,
 * PIPE_FINISHED when training and the final evaluation are over, or -errno:
 * -ERANGE when training diverged (the last stage's loss of a micro-batch is
 * not finite, or an update left a parameter that is not finite; the update
 * is not counted in PipeStats.updates); -EBADMSG when a neighbour's tensor
 * broke the protocol (pipe_offender() names it: drop its link and go on).
 * A send to a neighbour whose link is closing is no error: what it carried
 * is lost with the link, and a message that ends a phase goes again when
 * the neighbour is back. */
int pipe_work(Pipe *p);
/* The neighbour whose tensor made pipe_work() return -EBADMSG, once; -1. */
int64_t pipe_offender(Pipe *p);
void pipe_get_stats(Pipe *p, PipeStats *ret);
/* Go on from PIPE_HELD to the evaluation. */
void pipe_release(Pipe *p);
/* A safe point to stop at: the first stage sends no new training
 * micro-batch while on, and the ones on the way finish (PipeStats.in_flight
 * falls to 0 once every stage has done their backward passes). */
void pipe_quiesce(Pipe *p, bool on);
/* The live parameters are about to change outside an update (an averaging
 * round's delta): the micro-batches on the way that ran their forward pass
 * on them keep a copy for their backward pass. */
int pipe_stash_live(Pipe *p);
/* After each backward pass, before any update (tests): micro-batch id, the
 * parameter version it used, the live parameters, and its gradient dw. */
typedef void (*PipeBackwardHook)(void *ud, uint32_t id, const float *w, const float *live, const float *dw, size_t n);
void pipe_set_backward_hook(Pipe *p, PipeBackwardHook hook, void *ud);
