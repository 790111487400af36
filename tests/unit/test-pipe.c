/* The pipeline stage runtime, two stages in threads over real loopback
 * links: the synchronous schedule trains exactly what one stage holding the
 * whole model trains; under the asynchronous schedule a stage's gradient for
 * micro-batch m is the gradient of the whole model holding the weights m's
 * forward passes used (weight stashing), and training still learns. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "net/handshake.h"
#include "nn/loss.h"
#include "pipeline/pipe.h"
#include "tensor/ops.h"
#include "util/rng.h"

#define FEATURES 16
#define CLASSES 3
#define N 768

static Dataset *make_dataset(uint64_t seed) {
        Dataset *ds = calloc(1, sizeof *ds);
        Rng r;
        rng_seed(&r, seed, RNG_STREAM_TEST);
        ds->n = N;
        ds->c = 1;
        ds->h = 4;
        ds->w = 4;
        ds->n_classes = CLASSES;
        ds->images = malloc(N * FEATURES);
        ds->labels = malloc(N);
        for (size_t i = 0; i < N; i++) {
                int sum = 0;
                for (int k = 0; k < FEATURES; k++) {
                        ds->images[i * FEATURES + k] = (uint8_t)(rng_next(&r) & 0xff);
                        sum += (k < 8 ? 1 : -1) * ds->images[i * FEATURES + k];
                }
                ds->labels[i] = sum > 200 ? 0 : sum < -200 ? 1 : 2; /* learnable from the pixels */
        }
        dataset_set_normalization(ds, 0.5f, 0.3f);
        return ds;
}

static void make_model(ModelSpec *m) {
        memset(m, 0, sizeof *m);
        m->input = (Shape){ 1, 4, 4 };
        m->n_classes = CLASSES;
        m->layers[0] = (LayerSpec){ .kind = LAYER_FLATTEN };
        m->layers[1] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 32 };
        m->layers[2] = (LayerSpec){ .kind = LAYER_RELU };
        m->layers[3] = (LayerSpec){ .kind = LAYER_LINEAR, .out = CLASSES };
        m->n_layers = 4;
}

typedef struct Node {
        Pipe *pipe;
        Net *net;
        int64_t peer;
        int bad;
        bool first;
        pthread_t thread;
} Node;

static void on_conn(void *ud, uint32_t peer, const uint8_t id[32]) { ((Node *)ud)->peer = peer; }
static void on_tensor(void *ud, NetTensor *t) { Node *n = ud; n->bad += pipe_on_tensor(n->pipe, t) < 0; }
static void on_sent(void *ud, uint32_t peer, uint64_t c) { pipe_on_sent(((Node *)ud)->pipe, c); }
static void on_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Node *n = ud;
        n->bad += pipe_on_control(n->pipe, peer, p, len) < 0;
}
static const NetCallbacks cbs = { .connected = on_conn, .tensor = on_tensor, .sent = on_sent, .control = on_control };

static atomic_int finished;
/* Called on the first stage's thread after each of its units of work, as
 * the daemon's averaging hand-off is; NULL: nothing. */
static void (*meddle_first)(Pipe *p);

static void *run_node(void *arg) {
        Node *n = arg;
        int r;
        while ((r = pipe_work(n->pipe)) != PIPE_FINISHED && r >= 0) {
                if (meddle_first && n->first)
                        meddle_first(n->pipe);
                net_run(n->net, r > 0 ? 0 : 1);
        }
        n->bad += r < 0;
        /* what we queued last (DONE, say) still has to leave */
        atomic_fetch_add(&finished, 1);
        while (atomic_load(&finished) < 2)
                net_run(n->net, 1);
        return NULL;
}

/* Stages [0, cut) and [cut, 4) in two threads, linked over loopback. */
static void run_two(const PipeConfig *base, int cut, Pipe **ret0, Pipe **ret1, PipeBackwardHook h0, PipeBackwardHook h1,
                    void *ud) {
        static Identity a, b;
        static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 4 };
        identity_generate(&a);
        identity_generate(&b);
        Node n[2] = { { .peer = -1, .first = true }, { .peer = -1 } };
        PipeConfig c0 = *base, c1 = *base;
        c0.hi = cut;
        c1.lo = cut;
        Diag d = {};
        cr_assert_eq(pipe_new(&c0, &ops_blas, &n[0].pipe, &d), 0, "%s", d.text);
        cr_assert_eq(pipe_new(&c1, &ops_blas, &n[1].pipe, &d), 0, "%s", d.text);
        pipe_set_backward_hook(n[0].pipe, h0, ud);
        pipe_set_backward_hook(n[1].pipe, h1, ud);
        NetConfig nc;
        net_config_defaults(&nc);
        nc.secret = secret;
        nc.identity = &a;
        cr_assert_eq(net_new(&nc, &cbs, &n[0], &n[0].net), 0);
        nc.identity = &b;
        cr_assert_eq(net_new(&nc, &cbs, &n[1], &n[1].net), 0);
        uint16_t port;
        uint32_t peer;
        cr_assert_eq(net_listen(n[1].net, "127.0.0.1", 0, &port), 0);
        cr_assert_eq(net_connect(n[0].net, "127.0.0.1", port, &peer), 0);
        for (int i = 0; i < 2000 && (n[0].peer < 0 || n[1].peer < 0); i++) {
                net_run(n[0].net, 1);
                net_run(n[1].net, 1);
        }
        cr_assert(n[0].peer >= 0 && n[1].peer >= 0, "the stages did not connect");
        pipe_connect(n[0].pipe, n[0].net, -1, n[0].peer);
        pipe_connect(n[1].pipe, n[1].net, n[1].peer, -1);
        atomic_store(&finished, 0);
        for (int i = 0; i < 2; i++)
                pthread_create(&n[i].thread, NULL, run_node, &n[i]);
        for (int i = 0; i < 2; i++)
                pthread_join(n[i].thread, NULL);
        cr_assert_eq(n[0].bad + n[1].bad, 0, "a stage saw a bad message or failed");
        *ret0 = n[0].pipe;
        *ret1 = n[1].pipe;
        /* the Nets go; the pipes stay for the checks (pipe_free needs no Net
         * once its queues are empty) */
        net_free(n[0].net);
        net_free(n[1].net);
}

/* The model, an SGD optimizer at lr, the data and a pipeline of them. */
typedef struct Setup {
        ModelSpec m;
        OptimSpec o;
        Dataset *train, *test;
        PipeConfig c;
} Setup;

static void setup(Setup *s, float lr, PipeSchedule sched) {
        make_model(&s->m);
        optim_spec_defaults(&s->o, OPTIM_SGD);
        s->o.lr = lr;
        s->train = make_dataset(1);
        s->test = make_dataset(2);
        s->c = (PipeConfig){ .model = &s->m, .lo = 0, .hi = s->m.n_layers, .seed = 42, .optim = &s->o,
                             .micro_batch = 16, .in_flight = 4, .update_frequency = 1, .schedule = sched,
                             .total_updates = 2 * (N / 16), .train = s->train, .test = s->test, .epochs = 2,
                             .data_seed = 7 };
}

static void setup_free(Setup *s) {
        dataset_free(s->train);
        dataset_free(s->test);
}

Test(pipe, synchronous_equals_one_stage) {
        Setup su;
        setup(&su, 0.1f, PIPE_SYNC);
        PipeConfig c = su.c;
        c.epochs = 10;
        c.total_updates = 10 * (N / 16) / 4;

        /* one stage holding everything */
        Pipe *one;
        Diag d = {};
        cr_assert_eq(pipe_new(&c, &ops_blas, &one, &d), 0, "%s", d.text);
        pipe_connect(one, NULL, -1, -1);
        int r;
        while ((r = pipe_work(one)) != PIPE_FINISHED)
                cr_assert_geq(r, 0);

        Pipe *p0, *p1;
        run_two(&c, 2, &p0, &p1, NULL, NULL, NULL);
        Stage *s = pipe_stage(one), *s0 = pipe_stage(p0), *s1 = pipe_stage(p1);
        cr_assert_eq(s0->n_params + s1->n_params, s->n_params);
        double worst = 0;
        for (size_t i = 0; i < s->n_params; i++) {
                float got = i < s0->n_params ? s0->params[i] : s1->params[i - s0->n_params];
                worst = fmax(worst, fabs(got - s->params[i]));
        }
        cr_assert(worst < 1e-5, "two stages drift from one by %g", worst);
        PipeStats a, b;
        pipe_get_stats(one, &a);
        pipe_get_stats(p1, &b);
        cr_assert_eq(a.updates, b.updates, "one update per batch: %lu vs %lu", a.updates, b.updates);
        cr_assert_eq(a.updates, 10 * (N / 16) / 4);
        cr_assert(fabs(a.test_acc - b.test_acc) < 1e-9, "test accuracy %g vs %g", a.test_acc, b.test_acc);
        cr_assert_gt(b.test_acc, 0.6, "it learned: %g", b.test_acc);
        pipe_free(one);
        pipe_free(p0);
        pipe_free(p1);
        setup_free(&su);
}

/* A stage whose training diverged stops with -ERANGE: a micro-batch whose
 * loss is not finite (the last bias NaN) is neither counted nor turned into
 * a gradient or an update; a parameter an update left not finite (a
 * first-layer weight, which the ReLU hides from the loss) stops it after
 * that update. */
static void diverge_at(size_t param) {
        Setup su;
        setup(&su, 0.1f, PIPE_ASYNC);
        Pipe *one;
        Diag d = {};
        cr_assert_eq(pipe_new(&su.c, &ops_blas, &one, &d), 0, "%s", d.text);
        pipe_connect(one, NULL, -1, -1);
        Stage *s = pipe_stage(one);
        PipeStats st;
        int r;
        do {
                r = pipe_work(one);
                cr_assert_geq(r, 0);
                pipe_get_stats(one, &st);
        } while (st.updates < 3);
        if (param == SIZE_MAX)
                param = s->n_params - 1;
        s->params[param] = NAN;
        float *before = malloc(s->n_params * sizeof(float));
        memcpy(before, s->params, s->n_params * sizeof(float));
        uint64_t scored = st.scored;
        for (int i = 0; i < 100 && (r = pipe_work(one)) >= 0 && r != PIPE_FINISHED; i++)
                ;
        cr_assert_eq(r, -ERANGE);
        pipe_get_stats(one, &st);
        if (param == s->n_params - 1) {
                cr_assert_eq(st.updates, 3, "no update after the loss went NaN");
                cr_assert_eq(st.scored, scored, "the NaN loss is not counted");
                cr_assert(memcmp(before, s->params, s->n_params * sizeof(float)) == 0, "no update");
        } else
                cr_assert_eq(st.updates, 3, "the update that diverged is not counted");
        free(before);
        pipe_free(one);
        setup_free(&su);
}

Test(pipe, a_loss_that_is_not_finite_stops_the_stage) { diverge_at(SIZE_MAX); }
Test(pipe, a_parameter_that_is_not_finite_stops_the_stage) { diverge_at(5); }

/* ---- stashing ----------------------------------------------------------- */

#define WATCH 24
typedef struct Seen {
        size_t n0, n1;
        float w0[WATCH][FEATURES * 32 + 32], dw0[WATCH][FEATURES * 32 + 32], live0[WATCH][FEATURES * 32 + 32];
        float w1[WATCH][32 * CLASSES + CLASSES];
        bool have0[WATCH], have1[WATCH];
        Pipe *p0;
} Seen;

static Seen seen;

static void hook0(void *ud, uint32_t id, const float *w, const float *live, const float *dw, size_t n) {
        if (id < WATCH) {
                memcpy(seen.w0[id], w, n * sizeof(float));
                memcpy(seen.live0[id], live, n * sizeof(float));
                memcpy(seen.dw0[id], dw, n * sizeof(float));
                seen.have0[id] = true;
                seen.n0 = n;
        }
}

static void hook1(void *ud, uint32_t id, const float *w, const float *live, const float *dw, size_t n) {
        if (id < WATCH) {
                memcpy(seen.w1[id], w, n * sizeof(float));
                seen.have1[id] = true;
                seen.n1 = n;
        }
}

/* Every backward pass of the first stage against the whole model holding
 * the weights it used: its gradient is that model's. */
static void check_stashed_gradients(bool predict, void (*meddle)(Pipe *)) {
        Setup su;
        setup(&su, 0.2f, PIPE_ASYNC);
        su.o.momentum = 0; /* the stashed weights differ from micro-batch to micro-batch */
        const Dataset *train = su.train;
        PipeConfig c = su.c;
        c.epochs = 4;
        c.total_updates = 4 * (N / 16);
        c.predict_weights = predict;
        meddle_first = meddle;
        memset(&seen, 0, sizeof seen);
        Pipe *p0, *p1;
        run_two(&c, 2, &p0, &p1, hook0, hook1, NULL);
        meddle_first = NULL;

        /* micro-batch id's samples: the first stage's epoch-0 order */
        Sampler smp;
        sampler_init(&smp, train->n, 0, 1, c.data_seed);
        sampler_shuffle(&smp, 0);
        Stage *whole;
        Diag d = {};
        cr_assert_eq(stage_new(&su.m, 0, 4, 42, &whole, &d), 0);
        Trace *tr;
        cr_assert_eq(trace_new(whole, 16, &tr), 0);
        float x[16 * FEATURES], dlogits[16 * CLASSES], *dw = calloc(whole->n_params, sizeof(float));
        int32_t y[16];
        int differed = 0;
        for (uint32_t id = 0; id < WATCH; id++) {
                cr_assert(seen.have0[id] && seen.have1[id], "micro-batch %u not seen", id);
                memcpy(whole->params, seen.w0[id], seen.n0 * sizeof(float));
                memcpy(whole->params + seen.n0, seen.w1[id], seen.n1 * sizeof(float));
                dataset_gather(train, trace_input(tr), y, smp.order + id * 16, 16);
                (void)x;
                stage_forward(whole, &ops_naive, whole->params, tr, 16);
                int correct;
                softmax_xent(dlogits, &correct, trace_output(tr), y, 16, CLASSES);
                stage_backward(whole, &ops_naive, whole->params, tr, dlogits, NULL, dw, 16, 0.0f, NULL, NULL);
                for (size_t i = 0; i < seen.n0; i++)
                        cr_assert(fabsf(dw[i] - seen.dw0[id][i]) <= 1e-4f * (1 + fabsf(dw[i])),
                                  "micro-batch %u: dw[%zu] %g, whole model %g", id, i, seen.dw0[id][i], dw[i]);
                /* the weights had moved on since m's forward pass: stashing mattered */
                if (memcmp(seen.w0[id], seen.live0[id], seen.n0 * sizeof(float)) != 0)
                        differed++;
        }
        cr_assert_gt(differed, WATCH / 2, "only %d of %d backward passes needed a stashed version", differed, WATCH);
        PipeStats s0, s1;
        pipe_get_stats(p0, &s0);
        pipe_get_stats(p1, &s1);
        cr_assert_eq(s0.updates, 4 * (N / 16), "an update per micro-batch");
        cr_assert_eq(s0.versions, 0, "every stashed version released at the end");
        cr_assert_gt(s1.test_acc, 0.6, "the asynchronous pipeline learned: %g", s1.test_acc);
        cr_assert_leq(s0.compute_ns + s0.wait_ns, s0.elapsed_ns, "the time figures add up");
        cr_assert_leq(s0.train_compute_ns + s0.train_wait_ns, s0.train_ns, "the training window's figures add up");
        cr_assert_leq(s0.train_ns, s0.elapsed_ns, "the training window lies within the run");
        cr_assert_gt(s0.train_compute_ns, 0, "stage 0 computed while training");
        cr_log_info("async: test accuracy %.3f, stage 0 computing %.0f%%, waiting %.0f%%\n", s1.test_acc,
                    pipe_percent(s0.train_compute_ns, s0.train_ns), pipe_percent(s0.train_wait_ns, s0.train_ns));
        free(dw);
        sampler_done(&smp);
        stage_free(whole);
        pipe_free(p0);
        pipe_free(p1);
        setup_free(&su);
}

Test(pipe, stashed_gradient_is_the_whole_models) {
        check_stashed_gradients(false, NULL);
}

/* An averaging round's delta lands between forward and backward passes,
 * as in the daemon: announced with pipe_stash_live(), it never reaches a
 * backward pass whose forward pass ran before it. */
static unsigned meddled;
static void add_delta(Pipe *p) {
        if (++meddled % 3)
                return;
        cr_assert_eq(pipe_stash_live(p), 0);
        Stage *s = pipe_stage(p);
        for (size_t i = 0; i < s->n_params; i++)
                s->params[i] += 1e-3f * (float)((i * 7 + meddled) % 5) - 2e-3f;
}

Test(pipe, a_delta_between_forward_and_backward_stays_out_of_it) {
        meddled = 0;
        check_stashed_gradients(false, add_delta);
        cr_assert_gt(meddled, 100);
}

/* With weight prediction, forward passes run on predicted copies: the
 * gradients are still the whole model's at the weights each one used. */
Test(pipe, predicted_weights_keep_gradients_whole) {
        meddled = 0;
        check_stashed_gradients(true, add_delta);
}

/* ---- the synchronous start -------------------------------------------------- */

static bool moved[WATCH], heard[WATCH];

static void hook_moved(void *ud, uint32_t id, const float *w, const float *live, const float *dw, size_t n) {
        if (id < WATCH) {
                moved[id] = memcmp(w, live, n * sizeof(float)) != 0;
                heard[id] = true;
        }
}

/* Over the first sync_updates updates the asynchronous schedule keeps one
 * update's micro-batches in flight: no backward pass meets parameters an
 * update has changed since its forward pass, and after every unit of work
 * the micro-batches on the way and the gradients summed so far make at
 * most one update. After the start the configured staleness applies again
 * (with an update per micro-batch, most backward passes then meet moved
 * parameters). */
static int start_U;
static uint64_t start_updates;
static unsigned overfull;

static void check_room(Pipe *p) {
        PipeStats st;
        pipe_get_stats(p, &st);
        if (st.updates < start_updates && st.in_flight + st.backwards % (uint64_t)start_U > (uint64_t)start_U)
                overfull++;
}

static void check_no_late_gradient_at_the_start(int U, int tau, uint64_t sync_updates, int min_late) {
        Setup su;
        setup(&su, 0.2f, PIPE_ASYNC);
        PipeConfig c = su.c;
        c.update_frequency = U;
        c.in_flight = tau;
        c.total_updates = 2 * (N / 16) / (uint64_t)U;
        c.predict_weights = true;
        c.sync_updates = sync_updates;
        memset(moved, 0, sizeof moved);
        memset(heard, 0, sizeof heard);
        start_U = U;
        start_updates = sync_updates;
        overfull = 0;
        meddle_first = check_room;
        Pipe *p0, *p1;
        run_two(&c, 2, &p0, &p1, hook_moved, NULL, NULL);
        meddle_first = NULL;
        cr_assert_eq(overfull, 0, "U %d, staleness %d: more than an update on the way %u times during the start", U,
                     tau, overfull);
        int late = 0;
        for (uint32_t id = 0; id < WATCH; id++) {
                cr_assert(heard[id], "micro-batch %u not seen", id);
                if (id < sync_updates * (uint64_t)U)
                        cr_assert_not(moved[id], "micro-batch %u of the synchronous start met moved parameters", id);
                else
                        late += moved[id];
        }
        cr_assert_geq(late, min_late, "U %d, staleness %d: after the start only %d were late", U, tau, late);
        PipeStats s1;
        pipe_get_stats(p1, &s1);
        cr_assert_gt(s1.test_acc, 0.6, "it learned: %g", s1.test_acc);
        pipe_free(p0);
        pipe_free(p1);
        setup_free(&su);
}

Test(pipe, no_late_gradient_at_the_start) {
        check_no_late_gradient_at_the_start(1, 4, 10, (WATCH - 10) / 2 + 1);
}

/* Several micro-batches per update, as many as may be in flight: without
 * the start's limit, an update's first micro-batch could go out while the
 * previous update's last ones were still on the way. Whether any is late
 * after the start depends on timing here (the stage may move in lockstep),
 * so only the start is checked. */
Test(pipe, no_late_gradient_at_the_start_of_accumulated_updates) {
        check_no_late_gradient_at_the_start(4, 4, 3, 0);
}

/* A neighbour that sends activations with a NaN or an infinity: refused
 * (the daemon drops its link), where the same tensor with finite values is
 * taken; one NaN taken would make every later gradient of the stage NaN. */
typedef struct Hostile {
        Pipe *pipe;
        int64_t peer;
        int results[8];
        int n_results;
} Hostile;

static void hostile_conn(void *ud, uint32_t peer, const uint8_t id[32]) { ((Hostile *)ud)->peer = peer; }
static void hostile_tensor(void *ud, NetTensor *t) {
        Hostile *h = ud;
        int r = h->pipe ? pipe_on_tensor(h->pipe, t) : 0;
        if (h->n_results < 8)
                h->results[h->n_results++] = r;
}
static const NetCallbacks hostile_cbs = { .connected = hostile_conn, .tensor = hostile_tensor };

/* A stage of c (the layers lo..hi) linked over loopback to a hand-driven
 * neighbour: the previous stage's place if it is not the first, the next's
 * otherwise. */
static void hostile_pair(const PipeConfig *c, Hostile *stage, Hostile *sender, Net **ret_ns, Net **ret_nh) {
        static Identity a, b;
        static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 5 };
        Diag d = {};
        *stage = (Hostile){ .peer = -1 };
        *sender = (Hostile){ .peer = -1 };
        cr_assert_eq(pipe_new(c, &ops_blas, &stage->pipe, &d), 0, "%s", d.text);
        identity_generate(&a);
        identity_generate(&b);
        NetConfig nc;
        net_config_defaults(&nc);
        nc.secret = secret;
        nc.identity = &a;
        Net *ns, *nh;
        cr_assert_eq(net_new(&nc, &hostile_cbs, stage, &ns), 0);
        nc.identity = &b;
        cr_assert_eq(net_new(&nc, &hostile_cbs, sender, &nh), 0);
        uint16_t port;
        uint32_t peer;
        cr_assert_eq(net_listen(ns, "127.0.0.1", 0, &port), 0);
        cr_assert_eq(net_connect(nh, "127.0.0.1", port, &peer), 0);
        for (int i = 0; i < 2000 && (stage->peer < 0 || sender->peer < 0); i++) {
                net_run(ns, 1);
                net_run(nh, 1);
        }
        cr_assert(stage->peer >= 0 && sender->peer >= 0, "no link");
        if (c->lo == 0)
                pipe_connect(stage->pipe, ns, -1, stage->peer);
        else
                pipe_connect(stage->pipe, ns, stage->peer, -1);
        *ret_ns = ns;
        *ret_nh = nh;
}

/* The stage of layers lo..hi of the test model, beside a hand-driven
 * neighbour over loopback. */
typedef struct Rig {
        Setup su;
        Hostile stage, other;
        Net *ns, *nh;
} Rig;

static void rig_start(Rig *g, int lo, int hi) {
        setup(&g->su, 0.05f, PIPE_ASYNC);
        PipeConfig c = g->su.c;
        c.lo = lo;
        c.hi = hi;
        hostile_pair(&c, &g->stage, &g->other, &g->ns, &g->nh);
}

static void rig_free(Rig *g) {
        pipe_drop_queued(g->stage.pipe);
        net_free(g->nh);
        net_free(g->ns);
        pipe_free(g->stage.pipe);
        setup_free(&g->su);
}

enum { HB = 4, HF = 32 }; /* a micro-batch to the last stage from layer 2 on */

/* Labels (unless NULL) and activations of micro-batch id from the hand-driven
 * neighbour, run through until the stage took them. */
static void hostile_send(Rig *g, uint32_t id, const int32_t *labels, const float *act) {
        TensorDesc dl = { .dtype = DTYPE_I32, .ndim = 1, .dims = { HB }, .bytes = HB * sizeof(int32_t) };
        TensorDesc da = { .dtype = DTYPE_F32, .ndim = 2, .dims = { HB, HF }, .bytes = HB * HF * sizeof(float) };
        int want = g->stage.n_results + 1 + (labels != NULL);
        uint32_t peer = (uint32_t)g->other.peer;
        if (labels) /* stream kind << 30 | id */
                cr_assert_eq(net_send_tensor(g->nh, peer, 1u << 30 | id, &dl, labels, 0), 0);
        cr_assert_eq(net_send_tensor(g->nh, peer, id, &da, act, 0), 0);
        for (int i = 0; i < 5000 && g->stage.n_results < want; i++) {
                net_run(g->nh, 0);
                net_run(g->ns, 1);
        }
        cr_assert_eq(g->stage.n_results, want);
}

Test(pipe, activations_that_are_not_finite_are_refused) {
        Rig g;
        rig_start(&g, 2, 4); /* after the first linear layer and its ReLU: 32 features */
        static int32_t labels[HB] = { 0, 1, 2, 0 };
        static float act[3][HB * HF];
        for (int k = 0; k < 3; k++)
                for (int i = 0; i < HB * HF; i++)
                        act[k][i] = 0.01f * (float)(i % 17);
        act[1][5] = NAN;
        act[2][HB * HF - 1] = -INFINITY;
        for (uint32_t k = 0; k < 3; k++)
                hostile_send(&g, k, labels, act[k]);
        int want[6] = { 0, 0, 0, -ERANGE, 0, -ERANGE };
        for (int i = 0; i < 6; i++)
                cr_expect_eq(g.stage.results[i], want[i], "tensor %d: %d", i, g.stage.results[i]);
        rig_free(&g);
}

/* A neighbour's tensor that is well formed but out of place (activations
 * whose labels never came) makes pipe_work() return -EBADMSG and name that
 * neighbour, once, so that its link alone is dropped; a last stage whose
 * loss went NaN says it diverged (-ERANGE), as a stage alone does. */
Test(pipe, a_tensor_out_of_place_names_its_sender_and_divergence_is_told) {
        Rig g;
        rig_start(&g, 2, 4);
        static int32_t labels[HB] = { 0, 1, 2, 0 };
        static float act[HB * HF];
        hostile_send(&g, 9, NULL, act);
        cr_assert_eq(g.stage.results[0], 0, "taken: its place is checked as it is worked on");
        cr_assert_eq(pipe_work(g.stage.pipe), -EBADMSG);
        cr_assert_eq(pipe_offender(g.stage.pipe), g.stage.peer);
        cr_assert_eq(pipe_offender(g.stage.pipe), -1, "named once");
        Stage *s = pipe_stage(g.stage.pipe);
        s->params[s->n_params - 1] = NAN; /* the last bias: the loss is NaN */
        hostile_send(&g, 10, labels, act);
        int r = 0;
        for (int i = 0; i < 4 && r >= 0; i++)
                r = pipe_work(g.stage.pipe);
        cr_assert_eq(r, -ERANGE, "%d", r);
        cr_assert_eq(pipe_offender(g.stage.pipe), -1, "nobody to blame");
        rig_free(&g);
}

/* A first stage whose next stage's link is closing (the Net refuses sends
 * on it; the closed() that tells the stage comes with the next net_run())
 * goes on: what it sent is lost with the link. It failed the stage with
 * -ENOTCONN, and a node killed mid-run took its neighbour down with it. */
Test(pipe, a_send_to_a_closing_link_is_lost_with_it) {
        Rig g;
        rig_start(&g, 0, 2);
        cr_assert_eq(pipe_work(g.stage.pipe), 1);
        cr_assert_eq(net_close_peer(g.ns, (uint32_t)g.stage.peer), 0);
        for (int i = 0; i < 3; i++)
                cr_assert_geq(pipe_work(g.stage.pipe), 0, "unit %d", i);
        rig_free(&g);
}
