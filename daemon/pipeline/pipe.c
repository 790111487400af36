/* pipeline/pipe.c — a pipeline stage: queues, weight stashing, schedules.
 *
 * Tensors between stages carry the micro-batch id in their stream: the top
 * two bits say what they are (see KIND_*), the rest is the id. A stage
 * processes what comes from its next stage (gradients) before what comes
 * from its previous one (labels, activations), so memory stays bounded and
 * every stage alternates one forward with one backward once the pipeline is
 * full (PipeDream's 1F1B; Ravnest Section 3.2). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/loss.h"
#include "pipe.h"
#include "trainer.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "util/time-util.h"

enum {
        KIND_ACT = 0,    /* activations of a training micro-batch, (B, features) */
        KIND_LABELS = 1, /* its labels, (B), sent just before the activations */
        KIND_GRAD = 2,   /* the gradient of the activations, backwards */
        KIND_EVAL = 3,   /* activations of an evaluation micro-batch: no backward */
};
#define STREAM(kind, id) ((uint32_t)(kind) << 30 | ((id) & 0x3fffffffu))
#define MAX_QUEUE 4096 /* tensors waiting from one neighbour before it is cut off */

static const uint8_t msg_end[4] = "RVPE";  /* forward: no more micro-batches */
static const uint8_t msg_done[4] = "RVPD"; /* backward: everything after us is finished */
static const uint8_t msg_trained[4] = "RVPT"; /* forward: training is over, evaluation follows */
/* A broken link: the micro-batches on the way are lost. FLUSH goes away from
 * the break (up towards the first stage, or down towards the last), each
 * stage drops what it holds of them and answers with the ACK; until the ACK
 * arrives, the tensors that neighbour still sends are discarded. */
static const uint8_t msg_flush_up[4] = "RVPF";
static const uint8_t msg_flush_up_ack[4] = "RVPf";
static const uint8_t msg_flush_down[4] = "RVPX";
static const uint8_t msg_flush_down_ack[4] = "RVPx";

/* Cookies of our sends: what to do when the Net lets go of the data. */
enum { COOKIE_FREE = 0, COOKIE_RELEASE = 1, COOKIE_SLOT = 2 };
#define COOKIE(ptr_or_index, tag) ((uint64_t)(ptr_or_index) | (tag))

typedef struct Slot {
        bool used, sending;
        uint32_t id;
        int B, version;
        Trace *trace;
        int32_t *labels; /* the first stage's copy, for a single-stage pipe */
} Slot;

typedef struct Version {
        float *w; /* a stashed copy, or NULL: the live parameters */
        int refs; /* micro-batches whose backward pass needs it */
} Version;

typedef struct Queue {
        NetTensor **t;
        size_t head, n, cap;
} Queue;

typedef struct Labels {
        bool used;
        uint32_t id;
        int B;
        int32_t *y;
} Labels;

enum { PHASE_TRAIN, PHASE_HELD, PHASE_EVAL, PHASE_ENDING, PHASE_FINISHED };

struct Pipe {
        PipeConfig cfg;
        const Ops *ops;
        Stage *s;
        Optim optim;
        float *optim_state;
        bool first, last;
        int tau, U;
        size_t in_features, out_features;
        int rows, classes; /* loss rows per sample (1, or T for a language model), classes of each */

        Net *net;
        int64_t prev, next;
        int64_t offender; /* the neighbour whose tensor broke the protocol */
        Queue fwd, bwd;
        bool end_seen, done_seen, trained_seen, released;
        bool quiescing; /* the first stage injects nothing new */
        bool drain_prev, drain_next; /* discarding until that neighbour's FLUSH-ACK */
        int phase;

        Slot *slots;
        Version *versions;
        int cur;
        float **copies; /* stashed-version buffers not in use */
        float *last_step; /* predict_weights: the last update, after minus before */
        int n_copies;
        Trace *eval_trace;
        Labels *labels; /* the last stage: labels waiting for their activations */
        float *dlogits;
        int accumulated;

        /* the first stage's data */
        Sampler sampler;
        int epoch;
        size_t step, steps_per_epoch, eval_pos;
        uint32_t next_id;
        unsigned in_flight, batch_sent;
        uint32_t *idx;

        PipeStats st;
        double loss_sum, correct_sum, seen;
        double eval_loss, eval_correct, eval_seen;
        uint64_t start_ns, waiting_since;
        /* the training window (see PipeStats); at its end, what it held */
        uint64_t train_start_ns, train_end_ns, train_compute_ns, train_wait_ns;
        bool train_ending;
        PipeBackwardHook hook;
        void *hook_ud;
};

/* ---- queues ------------------------------------------------------------- */

static int queue_push(Queue *q, NetTensor *t) {
        if (q->n == q->cap) {
                size_t cap = q->cap ? 2 * q->cap : 64;
                if (cap > MAX_QUEUE)
                        return -ENOBUFS;
                NetTensor **n = malloc(cap * sizeof *n);
                if (!n)
                        return -ENOMEM;
                for (size_t i = 0; i < q->n; i++)
                        n[i] = q->t[(q->head + i) % q->cap];
                free(q->t);
                q->t = n;
                q->head = 0;
                q->cap = cap;
        }
        q->t[(q->head + q->n++) % q->cap] = t;
        return 0;
}

static NetTensor *queue_pop(Queue *q) {
        if (!q->n)
                return NULL;
        NetTensor *t = q->t[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
        return t;
}

static void queue_clear(Net *net, Queue *q) {
        NetTensor *t;
        while ((t = queue_pop(q)))
                net_tensor_release(net, t);
        free(q->t);
        *q = (Queue){};
}

/* ---- set-up ------------------------------------------------------------- */

int pipe_new(const PipeConfig *c, const Ops *ops, Pipe **ret, Diag *d) {
        int r;
        if (c->micro_batch < 1 || c->in_flight < 1 || c->in_flight > 1024 || c->update_frequency < 1 ||
            c->lo < 0 || c->hi > c->model->n_layers || c->lo >= c->hi)
                return diag_set(d, -EINVAL, "bad pipeline settings");
        _cleanup_(pipe_freep) Pipe *p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        p->cfg = *c;
        p->ops = ops;
        p->first = c->lo == 0;
        p->last = c->hi == c->model->n_layers;
        p->tau = c->in_flight;
        p->U = c->schedule == PIPE_SYNC ? c->in_flight : c->update_frequency;
        p->prev = p->next = p->offender = -1;
        if (p->first && (!c->train || c->epochs < 1))
                return diag_set(d, -EINVAL, "the first stage needs the training set and epochs");
        if ((c->train && (r = model_check_data(c->model, c->train, d)) < 0) ||
            (c->test && (r = model_check_data(c->model, c->test, d)) < 0))
                return r;

        r = stage_new(c->model, c->lo, c->hi, c->seed, &p->s, d);
        if (r < 0)
                return r;
        p->in_features = shape_numel(p->s->in);
        p->out_features = shape_numel(p->s->out);
        p->rows = model_spec_labels_per_sample(c->model);
        p->classes = c->model->n_classes;
        p->optim_state = calloc(MAX(optim_state_floats(c->optim->kind, p->s->n_params), (size_t)1), sizeof(float));
        if (!p->optim_state || optim_init(&p->optim, c->optim, p->s->n_params, p->optim_state) < 0)
                return diag_set(d, -EINVAL, "unknown optimizer");
        if (ops == &ops_blas)
                optim_set_pool(&p->optim, ops_blas_pool());

        p->slots = calloc((size_t)p->tau, sizeof *p->slots);
        p->versions = calloc((size_t)p->tau + 1, sizeof *p->versions);
        p->copies = calloc((size_t)p->tau, sizeof *p->copies);
        if (c->predict_weights && c->schedule == PIPE_ASYNC && !p->last && p->tau > 1 &&
            !(p->last_step = calloc(p->s->n_params, sizeof(float))))
                return -ENOMEM;
        p->labels = calloc(2 * (size_t)p->tau + 2, sizeof *p->labels);
        if (!p->slots || !p->versions || !p->copies || !p->labels)
                return -ENOMEM;
        for (int i = 0; i < p->tau; i++)
                if ((r = trace_new(p->s, c->micro_batch, &p->slots[i].trace)) < 0)
                        return r;
        if ((r = trace_new(p->s, c->micro_batch, &p->eval_trace)) < 0)
                return r;
        for (int i = 0; i < 2 * p->tau + 2; i++)
                if (!(p->labels[i].y = calloc((size_t)c->micro_batch * (size_t)p->rows, sizeof(int32_t))))
                        return -ENOMEM;
        if (p->last && !(p->dlogits = calloc((size_t)c->micro_batch * p->out_features, sizeof(float))))
                return -ENOMEM;
        if (p->first) {
                r = sampler_init(&p->sampler, c->train->n, c->shard, MAX(c->n_shards, 1), c->data_seed);
                if (r < 0)
                        return diag_set(d, r, "cannot make shard %d of %d", c->shard, c->n_shards);
                p->steps_per_epoch = p->sampler.n / (size_t)c->micro_batch;
                if (!p->steps_per_epoch)
                        return diag_set(d, -EINVAL, "the shard holds fewer samples than a micro-batch");
                sampler_shuffle(&p->sampler, 0);
                p->epoch = 1;
                if (!(p->idx = calloc((size_t)c->micro_batch, sizeof *p->idx)))
                        return -ENOMEM;
                for (int i = 0; i < p->tau; i++)
                        if (!(p->slots[i].labels = calloc((size_t)c->micro_batch * (size_t)p->rows, sizeof(int32_t))))
                                return -ENOMEM;
        }
        p->st.test_acc = p->st.test_loss = -1;
        *ret = TAKE_PTR(p);
        return 0;
}

void pipe_drop_queued(Pipe *p) {
        if (p->net) {
                queue_clear(p->net, &p->fwd);
                queue_clear(p->net, &p->bwd);
        }
}

Pipe *pipe_free(Pipe *p) {
        if (!p)
                return NULL;
        pipe_drop_queued(p); /* nothing left if the caller did it before net_free() */
        for (int i = 0; p->labels && i < 2 * p->tau + 2; i++)
                free(p->labels[i].y);
        for (int i = 0; p->slots && i < p->tau; i++)
                free(p->slots[i].labels);
        for (int i = 0; p->versions && i <= p->tau; i++)
                free(p->versions[i].w);
        for (int i = 0; p->copies && i < p->n_copies; i++)
                free(p->copies[i]);
        free(p->idx);
        free(p->last_step);
        free(p->labels);
        free(p->slots);
        free(p->versions);
        free(p->copies);
        free(p->dlogits);
        free(p->optim_state);
        if (p->first)
                sampler_done(&p->sampler);
        stage_free(p->s);
        free(p);
        return NULL;
}

Stage *pipe_stage(Pipe *p) {
        return p->s;
}

Optim *pipe_optim(Pipe *p) {
        return &p->optim;
}

int pipe_micro_batch(const Pipe *p) {
        return p->cfg.micro_batch;
}

void pipe_resume(Pipe *p, int epoch, size_t step, uint64_t updates) {
        p->st.updates = updates;
        if (!p->first)
                return;
        if (epoch >= p->cfg.epochs) { /* trained already: evaluated, not trained again */
                p->epoch = p->cfg.epochs + 1;
                p->step = 0;
                return;
        }
        epoch = MAX(epoch, 0);
        sampler_shuffle(&p->sampler, epoch);
        p->epoch = epoch + 1;
        p->step = MIN(step, p->steps_per_epoch - 1);
}

static void version_unref(Pipe *p, int v);
static void flush_up(Pipe *p);
static void flush_down(Pipe *p);

void pipe_connect(Pipe *p, Net *net, int64_t prev_peer, int64_t next_peer) {
        bool lost_prev = p->prev >= 0 && p->prev != prev_peer, lost_next = p->next >= 0 && p->next != next_peer;
        p->net = net;
        p->prev = prev_peer;
        p->next = next_peer;
        /* a new link owes us no answer to a FLUSH the old one was sent */
        if (lost_prev)
                p->drain_prev = false;
        if (lost_next)
                p->drain_next = false;
        if (p->phase != PHASE_TRAIN)
                return;
        if (lost_next)
                flush_up(p);
        if (lost_prev)
                flush_down(p);
}

void pipe_set_backward_hook(Pipe *p, PipeBackwardHook hook, void *ud) {
        p->hook = hook;
        p->hook_ud = ud;
}

/* ---- weight stashing ---------------------------------------------------- */

/* out = x + a y */
_simd_clones_ static void axpy_to(float *restrict out, const float *restrict x, float a, const float *restrict y,
                                  size_t n) {
        for (size_t i = 0; i < n; i++)
                out[i] = x[i] + a * y[i];
}

/* d = x - d: the update, where d held the parameters before it */
_simd_clones_ static void sub_from(float *restrict d, const float *restrict x, size_t n) {
        for (size_t i = 0; i < n; i++)
                d[i] = x[i] - d[i];
}

static int version_ref(Pipe *p) {
        p->versions[p->cur].refs++;
        return p->cur;
}

static const float *version_w(const Pipe *p, int v) {
        return p->versions[v].w ? p->versions[v].w : p->s->params;
}

static void version_unref(Pipe *p, int v) {
        Version *x = &p->versions[v];
        if (--x->refs == 0 && x->w) {
                p->copies[p->n_copies++] = x->w;
                x->w = NULL;
        }
}

/* A buffer for a copy of the parameters: from the free list, else new. */
static float *copy_buffer(Pipe *p) {
        return p->n_copies ? p->copies[--p->n_copies] : malloc(p->s->n_params * sizeof(float));
}

/* A version no micro-batch uses and no copy holds, other than the live one;
 * there is one, as versions outnumber the micro-batches in flight. */
static int version_free(const Pipe *p) {
        for (int i = 0; i <= p->tau; i++)
                if (i != p->cur && p->versions[i].refs == 0 && !p->versions[i].w)
                        return i;
        return -1;
}

/* Before the live parameters change: if a micro-batch in flight still needs
 * them, they become a stashed copy and a new live version begins. */
int pipe_stash_live(Pipe *p) {
        Version *cur = &p->versions[p->cur];
        if (cur->refs == 0)
                return 0;
        int next = version_free(p);
        if (next < 0)
                return -EOVERFLOW; /* more versions than micro-batches in flight: cannot happen */
        float *copy = copy_buffer(p);
        if (!copy)
                return -ENOMEM;
        memcpy(copy, p->s->params, p->s->n_params * sizeof(float));
        cur->w = copy;
        p->cur = next;
        return 0;
}

/* Weight prediction (Chen et al., SpecTrain, 2018). With k updates still to
 * come before a micro-batch's gradient lands here, its forward pass runs on
 * w + k * (the last update) instead of w, and its backward pass on the same
 * copy: a gradient taken k steps late meets weights close to the ones it
 * was taken at. Without it an asynchronous stage trains on stale
 * gradients; the GPT at lr 0.003 ends 25 % worse for a delay of one step
 * (docs/figures.md). k: the micro-batches on the way ahead of the one about
 * to take a slot, in updates. */
static int version_for_forward(Pipe *p) {
        int used = 0;
        for (int i = 0; i < p->tau; i++)
                used += p->slots[i].used;
        int k = (used + p->accumulated) / p->U, v = k > 0 && p->last_step ? version_free(p) : -1;
        float *copy = v >= 0 ? copy_buffer(p) : NULL;
        if (!copy) /* no delay, no prediction, or no memory: the live version */
                return version_ref(p);
        axpy_to(copy, p->s->params, (float)k, p->last_step, p->s->n_params);
        p->versions[v] = (Version){ .w = copy, .refs = 1 };
        return v;
}

static unsigned stashed(const Pipe *p) {
        unsigned n = 0;
        for (int i = 0; i <= p->tau; i++)
                n += p->versions[i].w != NULL;
        return n;
}

/* ---- updates ------------------------------------------------------------ */

_simd_clones_ static void scale(float *g, float s, size_t n) {
        for (size_t i = 0; i < n; i++)
                g[i] *= s;
}

/* A backward pass wrote its gradient (beta 1 after the first of U). */
static int after_backward(Pipe *p, uint32_t id, const float *w) {
        p->st.backwards++;
        if (p->hook)
                p->hook(p->hook_ud, id, w, p->s->params, p->s->grads, p->s->n_params);
        if (++p->accumulated < p->U)
                return 0;
        int r = pipe_stash_live(p);
        if (r < 0)
                return r;
        if (p->U > 1) /* each gradient is a mean over its micro-batch: average them */
                scale(p->s->grads, 1.0f / (float)p->U, p->s->n_params);
        optim_set_lr(&p->optim, lr_schedule_at(p->cfg.optim, p->st.updates, MAX(p->cfg.total_updates, 1)));
        if (p->last_step)
                memcpy(p->last_step, p->s->params, p->s->n_params * sizeof(float));
        optim_step(&p->optim, p->s->params, p->s->grads);
        if (optim_diverged(&p->optim))
                return -ERANGE; /* this update diverged: nothing of it goes out (the averaging, a checkpoint) */
        if (p->last_step)
                sub_from(p->last_step, p->s->params, p->s->n_params);
        p->st.updates++;
        p->accumulated = 0;
        return 0;
}

static float beta(const Pipe *p) {
        return p->accumulated ? 1.0f : 0.0f;
}

/* ---- sending ------------------------------------------------------------ */

static int send(Pipe *p, int64_t peer, uint8_t kind, uint32_t id, uint8_t dtype, uint32_t rows, uint32_t cols,
                const void *data, uint64_t cookie) {
        TensorDesc d;
        uint32_t dims[2] = { rows, cols };
        int r = tensor_desc_init(&d, dtype, cols ? 2 : 1, dims);
        if (r < 0)
                return r;
        if (peer < 0)
                return -ENOTCONN;
        return net_send_tensor(p->net, (uint32_t)peer, STREAM(kind, id), &d, data, cookie);
}

/* -ENOTCONN from a send to a neighbour: its link is closing, and the
 * closed() that says so comes with the next net_run(). What the send
 * carried is lost with the link, like the micro-batches closed() drops, and
 * the stage goes on: 0. Any other error stands. */
static int lost_with_link(int r) {
        return r == -ENOTCONN ? 0 : r;
}

/* A copy of data, freed once sent. */
static int send_copy(Pipe *p, int64_t peer, uint8_t kind, uint32_t id, uint8_t dtype, uint32_t rows, uint32_t cols,
                     const void *data, size_t bytes) {
        void *buf = malloc(MAX(bytes, (size_t)1));
        if (!buf)
                return -ENOMEM;
        memcpy(buf, data, bytes);
        int r = send(p, peer, kind, id, dtype, rows, cols, buf, COOKIE(buf, COOKIE_FREE));
        if (r < 0)
                free(buf);
        return lost_with_link(r);
}

void pipe_on_sent(Pipe *p, uint64_t cookie) {
        switch (cookie & 3) {
        case COOKIE_FREE:
                free((void *)(uintptr_t)cookie);
                break;
        case COOKIE_RELEASE:
                net_tensor_release(p->net, (NetTensor *)(uintptr_t)(cookie & ~(uint64_t)3));
                break;
        case COOKIE_SLOT:
                if ((cookie >> 2) < (uint64_t)p->tau)
                        p->slots[cookie >> 2].sending = false;
                break;
        }
}

/* ---- receiving ---------------------------------------------------------- */

int pipe_on_tensor(Pipe *p, NetTensor *t) {
        uint8_t kind = (uint8_t)(t->stream >> 30);
        bool from_prev = p->prev >= 0 && t->peer == (uint32_t)p->prev;
        bool from_next = p->next >= 0 && t->peer == (uint32_t)p->next;
        size_t want = kind == KIND_GRAD ? p->out_features : kind == KIND_LABELS ? 0 : p->in_features;
        const TensorDesc *d = &t->desc;
        bool ok = (kind == KIND_GRAD ? from_next : from_prev) && d->dims[0] >= 1 &&
                  d->dims[0] <= (uint32_t)p->cfg.micro_batch &&
                  (kind == KIND_LABELS ? d->dtype == DTYPE_I32 && d->ndim == (p->rows > 1 ? 2 : 1) &&
                                                 (p->rows == 1 || d->dims[1] == (uint32_t)p->rows)
                                       : d->dtype == DTYPE_F32 && d->ndim == 2 && d->dims[1] == want);
        if (!ok || (kind != KIND_LABELS && !tensor_finite((const float *)t->data, d->bytes / sizeof(float)))) {
                net_tensor_release(p->net, t);
                return ok ? -ERANGE : -EBADMSG;
        }
        if ((from_prev && p->drain_prev) || (from_next && p->drain_next)) {
                /* it belongs to micro-batches a FLUSH dropped */
                net_tensor_release(p->net, t);
                return 0;
        }
        int r = queue_push(kind == KIND_GRAD ? &p->bwd : &p->fwd, t);
        if (r < 0)
                net_tensor_release(p->net, t);
        return r == -ENOBUFS ? -EBADMSG : r;
}

int pipe_on_control(Pipe *p, uint32_t peer, const uint8_t *payload, size_t len) {
        bool from_prev = p->prev >= 0 && peer == (uint32_t)p->prev;
        bool from_next = p->next >= 0 && peer == (uint32_t)p->next;
        if (len != 4)
                return -EBADMSG;
        if (memcmp(payload, msg_flush_up, 4) == 0 && from_next) {
                if (p->phase == PHASE_TRAIN)
                        flush_up(p);
                return MIN(net_send_control(p->net, peer, FRAME_CONTROL, msg_flush_up_ack, 4), 0);
        }
        if (memcmp(payload, msg_flush_down, 4) == 0 && from_prev) {
                if (p->phase == PHASE_TRAIN)
                        flush_down(p);
                return MIN(net_send_control(p->net, peer, FRAME_CONTROL, msg_flush_down_ack, 4), 0);
        }
        if (memcmp(payload, msg_flush_up_ack, 4) == 0 && from_prev)
                p->drain_prev = false;
        else if (memcmp(payload, msg_flush_down_ack, 4) == 0 && from_next)
                p->drain_next = false;
        else if (memcmp(payload, msg_end, 4) == 0 && p->prev >= 0 && peer == (uint32_t)p->prev)
                p->end_seen = true;
        else if (memcmp(payload, msg_trained, 4) == 0 && p->prev >= 0 && peer == (uint32_t)p->prev)
                p->trained_seen = true;
        else if (memcmp(payload, msg_done, 4) == 0 && p->next >= 0 && peer == (uint32_t)p->next)
                p->done_seen = true;
        else
                return -EBADMSG;
        return 0;
}

/* ---- the work ----------------------------------------------------------- */

static Slot *slot_free(Pipe *p) {
        for (int i = 0; i < p->tau; i++)
                if (!p->slots[i].used && !p->slots[i].sending)
                        return &p->slots[i];
        return NULL;
}

static Slot *slot_of(Pipe *p, uint32_t id) {
        for (int i = 0; i < p->tau; i++)
                if (p->slots[i].used && p->slots[i].id == id)
                        return &p->slots[i];
        return NULL;
}

static Labels *labels_of(Pipe *p, uint32_t id) {
        for (int i = 0; i < 2 * p->tau + 2; i++)
                if (p->labels[i].used && p->labels[i].id == id)
                        return &p->labels[i];
        return NULL;
}

/* Backward through tr from dout with parameters w; all but the first stage
 * send the input gradient back to the previous one. */
static int backward_and_send(Pipe *p, uint32_t id, const float *w, Trace *tr, const float *dout, int B) {
        float *dinp = NULL;
        if (!p->first && !(dinp = malloc((size_t)B * p->in_features * sizeof(float))))
                return -ENOMEM;
        stage_backward(p->s, p->ops, w, tr, dout, dinp, p->s->grads, B, beta(p), NULL, NULL);
        if (!dinp)
                return 0;
        int r = send(p, p->prev, KIND_GRAD, id, DTYPE_F32, (uint32_t)B, (uint32_t)p->in_features, dinp,
                     COOKIE(dinp, COOKIE_FREE));
        if (r < 0)
                free(dinp);
        return lost_with_link(r);
}

/* The last stage: loss and its gradient, straight into a backward pass
 * with the parameters the forward pass used (nothing changed between). */
static int last_train(Pipe *p, uint32_t id, Trace *tr, int B, const int32_t *y) {
        Stage *s = p->s;
        int correct;
        float loss;
        stage_forward(s, p->ops, s->params, tr, B);
        loss = softmax_xent(p->dlogits, &correct, trace_output(tr), y, B * p->rows, p->classes);
        if (!isfinite(loss)) /* diverged: no gradient of it goes anywhere */
                return -ERANGE;
        p->loss_sum += (double)loss * B;
        p->correct_sum += correct;
        p->seen += B;
        p->st.forwards++;
        p->st.samples += (uint64_t)B;
        int r = backward_and_send(p, id, s->params, tr, p->dlogits, B);
        return r < 0 ? r : after_backward(p, id, s->params);
}

static void eval_out(Pipe *p, Trace *tr, int B, const int32_t *y) {
        int correct;
        float loss = softmax_xent(p->dlogits, &correct, trace_output(tr), y, B * p->rows, p->classes);
        p->eval_loss += (double)loss * B;
        p->eval_correct += correct;
        p->eval_seen += B;
}

/* The first stage: one more micro-batch from the shard, or the test set. */
static int first_inject(Pipe *p, bool eval) {
        const Dataset *ds = eval ? p->cfg.test : p->cfg.train;
        int B = p->cfg.micro_batch, r;
        uint32_t id = p->next_id++;
        Slot *sl = eval ? NULL : slot_free(p);
        Trace *tr = eval ? p->eval_trace : sl->trace;
        int32_t *y = eval ? p->labels[0].y : sl->labels;

        if (eval) {
                B = (int)MIN((size_t)B, ds->n - p->eval_pos);
                for (int i = 0; i < B; i++)
                        p->idx[i] = (uint32_t)(p->eval_pos + (size_t)i);
                p->eval_pos += (size_t)B;
                dataset_gather(ds, trace_input(tr), y, p->idx, B);
        } else {
                dataset_gather(ds, trace_input(tr), y, p->sampler.order + p->step * (size_t)B, B);
                if (++p->step == p->steps_per_epoch) {
                        p->step = 0;
                        if (p->epoch < p->cfg.epochs)
                                sampler_shuffle(&p->sampler, p->epoch);
                        p->epoch++;
                }
        }
        if (p->last) { /* a pipeline of one stage */
                if (eval) {
                        stage_forward(p->s, p->ops, p->s->params, tr, B);
                        eval_out(p, tr, B, y);
                        return 0;
                }
                return last_train(p, id, tr, B, y);
        }
        r = send_copy(p, p->next, KIND_LABELS, id, DTYPE_I32, (uint32_t)B, p->rows > 1 ? (uint32_t)p->rows : 0, y,
                      (size_t)B * (size_t)p->rows * sizeof(int32_t));
        if (r < 0)
                return r;
        if (eval) {
                stage_forward(p->s, p->ops, p->s->params, tr, B);
                return send_copy(p, p->next, KIND_EVAL, id, DTYPE_F32, (uint32_t)B, (uint32_t)p->out_features,
                                 trace_output(tr), (size_t)B * p->out_features * sizeof(float));
        }
        *sl = (Slot){ .used = true, .sending = true, .id = id, .B = B, .version = version_for_forward(p),
                      .trace = sl->trace, .labels = sl->labels };
        stage_forward(p->s, p->ops, version_w(p, sl->version), tr, B);
        p->st.forwards++;
        p->st.samples += (uint64_t)B;
        p->in_flight++;
        p->batch_sent++;
        /* the activations go as they are: the slot is not reused before sent() */
        r = send(p, p->next, KIND_ACT, id, DTYPE_F32, (uint32_t)B, (uint32_t)p->out_features, trace_output(tr),
                 COOKIE((uint64_t)(sl - p->slots) << 2, COOKIE_SLOT));
        if (r < 0)
                sl->sending = false;
        return lost_with_link(r);
}

static int do_backward(Pipe *p, NetTensor *t) {
        uint32_t id = t->stream & 0x3fffffffu;
        Slot *sl = slot_of(p, id);
        int B = (int)t->desc.dims[0], r;
        if (!sl || sl->B != B) {
                net_tensor_release(p->net, t);
                return -EBADMSG;
        }
        const float *w = version_w(p, sl->version);
        r = backward_and_send(p, id, w, sl->trace, (const float *)t->data, B);
        net_tensor_release(p->net, t);
        int v = sl->version;
        sl->used = false;
        if (p->first)
                p->in_flight--;
        if (r == 0)
                r = after_backward(p, id, w);
        version_unref(p, v);
        return r;
}

static int do_forward(Pipe *p, NetTensor *t) {
        uint8_t kind = (uint8_t)(t->stream >> 30);
        uint32_t id = t->stream & 0x3fffffffu;
        int B = (int)t->desc.dims[0], r;

        if (kind == KIND_LABELS) {
                if (!p->last) { /* passed on as it came, ahead of its activations */
                        r = send(p, p->next, KIND_LABELS, id, DTYPE_I32, (uint32_t)B,
                                 p->rows > 1 ? (uint32_t)p->rows : 0, t->data, COOKIE((uintptr_t)t, COOKIE_RELEASE));
                        if (r < 0)
                                net_tensor_release(p->net, t);
                        return lost_with_link(r);
                }
                Labels *l = NULL;
                for (int i = 0; i < 2 * p->tau + 2 && !l; i++)
                        if (!p->labels[i].used)
                                l = &p->labels[i];
                if (!l) {
                        net_tensor_release(p->net, t);
                        return -EBADMSG; /* labels without activations, piling up */
                }
                *l = (Labels){ .used = true, .id = id, .B = B, .y = l->y };
                memcpy(l->y, t->data, (size_t)B * (size_t)p->rows * sizeof(int32_t));
                for (int i = 0; i < B * p->rows; i++)
                        if (l->y[i] < 0 || l->y[i] >= p->classes) {
                                l->used = false;
                                net_tensor_release(p->net, t);
                                return -EBADMSG;
                        }
                net_tensor_release(p->net, t);
                return 0;
        }

        Labels *l = p->last ? labels_of(p, id) : NULL;
        if (p->last && (!l || l->B != B)) {
                net_tensor_release(p->net, t);
                return -EBADMSG;
        }
        if (kind == KIND_EVAL) {
                Trace *tr = p->eval_trace;
                memcpy(trace_input(tr), t->data, (size_t)B * p->in_features * sizeof(float));
                net_tensor_release(p->net, t);
                stage_forward(p->s, p->ops, p->s->params, tr, B);
                if (p->last) {
                        eval_out(p, tr, B, l->y);
                        l->used = false;
                        return 0;
                }
                return send_copy(p, p->next, KIND_EVAL, id, DTYPE_F32, (uint32_t)B, (uint32_t)p->out_features,
                                 trace_output(tr), (size_t)B * p->out_features * sizeof(float));
        }

        Slot *sl = slot_free(p);
        if (!sl) { /* more in flight than the bound: the previous stage broke it */
                net_tensor_release(p->net, t);
                return -EBADMSG;
        }
        memcpy(trace_input(sl->trace), t->data, (size_t)B * p->in_features * sizeof(float));
        net_tensor_release(p->net, t);
        if (p->last) {
                r = last_train(p, id, sl->trace, B, l->y);
                l->used = false;
                return r;
        }
        *sl = (Slot){ .used = true, .sending = true, .id = id, .B = B, .version = version_for_forward(p),
                      .trace = sl->trace, .labels = sl->labels };
        stage_forward(p->s, p->ops, version_w(p, sl->version), sl->trace, B);
        p->st.forwards++;
        p->st.samples += (uint64_t)B;
        r = send(p, p->next, KIND_ACT, id, DTYPE_F32, (uint32_t)B, (uint32_t)p->out_features, trace_output(sl->trace),
                 COOKIE((uint64_t)(sl - p->slots) << 2, COOKIE_SLOT));
        if (r < 0)
                sl->sending = false;
        return lost_with_link(r);
}

/* ---- broken links ------------------------------------------------------ */

/* The training micro-batches this stage holds are lost: their slots, their
 * stashed versions, and what is queued about them. */
static void drop_training(Pipe *p) {
        for (int i = 0; i < p->tau; i++) {
                Slot *sl = &p->slots[i];
                if (!sl->used)
                        continue;
                sl->used = false; /* `sending` stays: the Net may still read its activations */
                version_unref(p, sl->version);
                p->st.lost++;
        }
        if (p->first) {
                p->in_flight = 0;
                p->batch_sent = 0;
        }
        if (p->net) {
                queue_clear(p->net, &p->fwd);
                queue_clear(p->net, &p->bwd);
        }
}

/* The next stage (or one beyond it) lost what we sent it: drop our part
 * and tell the previous stage, whose gradients for them will not come. */
static void flush_up(Pipe *p) {
        drop_training(p);
        if (!p->first && p->prev >= 0 && net_send_control(p->net, (uint32_t)p->prev, FRAME_CONTROL, msg_flush_up, 4) >= 0)
                p->drain_prev = true;
}

/* The previous stage (or one before it) will take no gradients for what it
 * sent us: drop our part, labels too, and tell the next stage. */
static void flush_down(Pipe *p) {
        drop_training(p);
        if (p->last)
                for (int i = 0; i < 2 * p->tau + 2; i++)
                        p->labels[i].used = false;
        if (!p->last && p->next >= 0 &&
            net_send_control(p->net, (uint32_t)p->next, FRAME_CONTROL, msg_flush_down, 4) >= 0)
                p->drain_next = true;
}

static bool slots_idle(const Pipe *p) {
        for (int i = 0; i < p->tau; i++)
                if (p->slots[i].used)
                        return false;
        return true;
}

/* Training is over on this stage: the schedule's figures are taken up to
 * the end of this unit of work. */
static void train_over(Pipe *p) {
        if (p->train_start_ns && !p->train_end_ns)
                p->train_ending = true;
}

static int control(Pipe *p, int64_t peer, const uint8_t msg[4]) {
        return peer < 0 ? 0 : net_send_control(p->net, (uint32_t)peer, FRAME_CONTROL, msg, 4);
}

/* Micro-batches the asynchronous schedule may have in flight: over the
 * first sync_updates updates no more than one update takes, so that no
 * gradient lands late while the loss falls fastest; after them, the
 * configured staleness. Stale gradients from the start kept a GPT cluster
 * at staleness 2 on the plateau of byte frequencies twice as long, and
 * the swarm 20 % above one node (docs/figures.md). */
static unsigned async_room(const Pipe *p) {
        if (p->st.updates < p->cfg.sync_updates)
                return (unsigned)MIN(p->tau, p->U - p->accumulated);
        return (unsigned)p->tau;
}

/* What the first stage does when no gradient is waiting. */
static int first_next(Pipe *p) {
        if (p->phase == PHASE_TRAIN && p->quiescing)
                return 0;
        if (p->phase == PHASE_TRAIN) {
                if (p->epoch <= p->cfg.epochs) {
                        bool room = p->cfg.schedule == PIPE_SYNC ? p->batch_sent < (unsigned)p->tau
                                                                 : p->in_flight < async_room(p);
                        if (p->cfg.schedule == PIPE_SYNC && p->batch_sent == (unsigned)p->tau && p->in_flight == 0) {
                                p->batch_sent = 0; /* the batch has drained: the next one */
                                room = true;
                        }
                        if (!room || !slot_free(p))
                                return 0;
                        int r = first_inject(p, false);
                        return r < 0 ? r : 1;
                }
                if (p->in_flight > 0)
                        return 0;
                int r = p->last ? 0 : control(p, p->next, msg_trained);
                if (r < 0) /* said again once the next stage is back */
                        return lost_with_link(r);
                train_over(p);
                p->phase = p->cfg.hold_after_training ? PHASE_HELD : PHASE_EVAL;
                p->st.epoch = p->cfg.epochs;
                return 1;
        }
        if (p->phase == PHASE_HELD)
                return PIPE_HELD;
        if (p->phase == PHASE_EVAL) {
                if (p->cfg.test && p->eval_pos < p->cfg.test->n) {
                        int r = first_inject(p, true);
                        return r < 0 ? r : 1;
                }
                int r = p->last ? 0 : control(p, p->next, msg_end);
                if (r < 0)
                        return lost_with_link(r);
                p->phase = PHASE_ENDING;
                p->done_seen = p->last; /* one stage: nobody to wait for */
                return 1;
        }
        return 0;
}

/* A unit of work on a tensor from peer: 1, or its error; a tensor that
 * breaks the protocol (-EBADMSG) names its sender for pipe_offender(). */
static int unit_done(Pipe *p, uint32_t peer, int r) {
        if (r == -EBADMSG)
                p->offender = peer;
        return r < 0 ? r : 1;
}

int64_t pipe_offender(Pipe *p) {
        int64_t peer = p->offender;
        p->offender = -1;
        return peer;
}

static int work(Pipe *p) {
        int r = 0;
        NetTensor *t;

        if (p->phase == PHASE_FINISHED)
                return PIPE_FINISHED;
        /* Without both neighbours nothing can go on: wait for them (a lost
         * one comes back, or the operator stops us). */
        if ((!p->last && p->next < 0) || (!p->first && p->prev < 0))
                return 0;
        if (p->phase == PHASE_HELD && !p->first)
                return PIPE_HELD; /* evaluation waits, queued */
        if ((t = queue_pop(&p->bwd))) {
                uint32_t from = t->peer; /* do_backward() consumes t */
                r = unit_done(p, from, do_backward(p, t));
        } else if (!p->first && p->trained_seen && p->phase == PHASE_TRAIN && slots_idle(p)) {
                /* every training micro-batch has been through here and back */
                if (!p->last && (r = control(p, p->next, msg_trained)) < 0)
                        return lost_with_link(r); /* said again once the next stage is back */
                p->trained_seen = false;
                train_over(p);
                if (p->cfg.hold_after_training && !p->released) {
                        p->phase = PHASE_HELD;
                        return PIPE_HELD;
                }
                r = 1;
        } else if ((t = queue_pop(&p->fwd))) {
                uint32_t from = t->peer;
                r = unit_done(p, from, do_forward(p, t));
        } else if (p->first)
                r = first_next(p);
        else if (p->end_seen && p->phase == PHASE_TRAIN && slots_idle(p)) {
                if (!p->last && (r = control(p, p->next, msg_end)) < 0)
                        return lost_with_link(r);
                p->phase = PHASE_ENDING;
                if (p->last) {
                        p->done_seen = true;
                        if (p->eval_seen > 0) {
                                p->st.test_acc = p->eval_correct / (p->eval_seen * p->rows);
                                p->st.test_loss = p->eval_loss / p->eval_seen;
                        }
                }
        }
        if (r == 0 && p->phase == PHASE_ENDING && p->done_seen) {
                if (p->first && p->last && p->eval_seen > 0) {
                        p->st.test_acc = p->eval_correct / (p->eval_seen * p->rows);
                        p->st.test_loss = p->eval_loss / p->eval_seen;
                }
                if (!p->first)
                        control(p, p->prev, msg_done);
                p->phase = PHASE_FINISHED;
                r = PIPE_FINISHED;
        }
        return r;
}

int pipe_work(Pipe *p) {
        uint64_t t0 = now_ns();
        int r = work(p);
        uint64_t t1 = now_ns();
        if (r == 1) {
                /* the time figures count from the first unit of work: the
                 * wait for the neighbours to start is no bubble */
                if (!p->start_ns)
                        p->start_ns = t0;
                if (!p->train_start_ns && p->phase == PHASE_TRAIN)
                        p->train_start_ns = t0;
                if (p->waiting_since)
                        p->st.wait_ns += t0 - p->waiting_since;
                p->waiting_since = 0;
                p->st.compute_ns += t1 - t0;
        } else if ((r == 0 || r == PIPE_HELD) && p->start_ns && !p->waiting_since)
                p->waiting_since = t0;
        if (p->train_ending) {
                p->train_ending = false;
                p->train_end_ns = t1;
                p->train_compute_ns = p->st.compute_ns;
                p->train_wait_ns = p->st.wait_ns;
        }
        return r;
}

void pipe_quiesce(Pipe *p, bool on) {
        p->quiescing = on;
}

void pipe_release(Pipe *p) {
        if (p->phase != PHASE_HELD)
                return;
        p->released = true;
        p->phase = p->first ? PHASE_EVAL : PHASE_TRAIN;
}

void pipe_get_stats(Pipe *p, PipeStats *ret) {
        uint64_t now = now_ns(), waiting = p->waiting_since ? now - p->waiting_since : 0;
        PipeStats *st = &p->st;
        st->elapsed_ns = p->start_ns ? now - p->start_ns : 0;
        if (p->train_end_ns) {
                st->train_ns = p->train_end_ns - p->train_start_ns;
                st->train_compute_ns = p->train_compute_ns;
                st->train_wait_ns = p->train_wait_ns;
        } else if (p->train_start_ns) {
                st->train_ns = now - p->train_start_ns;
                st->train_compute_ns = st->compute_ns;
                st->train_wait_ns = st->wait_ns + waiting;
        }
        p->st.in_flight = p->in_flight;
        p->st.versions = stashed(p);
        if (p->first) {
                p->st.epoch = MIN(p->epoch, p->cfg.epochs);
                p->st.epochs_done = MIN(p->epoch - 1, p->cfg.epochs);
                p->st.step_in_epoch = p->epoch > p->cfg.epochs ? 0 : p->step;
        }
        p->st.loss_sum = p->loss_sum;
        p->st.correct = p->correct_sum / p->rows; /* in samples' worth of rows */
        p->st.scored = (uint64_t)p->seen;
        *ret = p->st;
        ret->wait_ns += waiting; /* the wait going on now */
}

double pipe_percent(uint64_t part, uint64_t whole) {
        return whole ? 100.0 * (double)part / (double)whole : 0.0;
}
