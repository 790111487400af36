/* run/coordinator.c — members, heartbeats, epochs and formation, on the
 * coordinator's own thread (see coordinator.h). */
#include "coordinator.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/formation.h"
#include "cluster/plan.h"
#include "node.h"
#include "util/log.h"
#include "util/time-util.h"

#define MAX_LINKS 256 /* members and links still in the handshake; the transport's default */

typedef struct Member {
        bool used, joined, done;
        bool probing;     /* its pipeline port is being dialed back */
        uint32_t peer;
        uint8_t key[IDENTITY_PK_SIZE];
        PlanJoin join;
        uint64_t samples; /* what it trained as a first stage, from its DONE */
} Member;

/* A dial-back, asked of the prober thread and answered by it. */
typedef struct Probe {
        uint8_t key[IDENTITY_PK_SIZE];
        char host[PLAN_HOST_MAX];
        uint16_t port;
        int error; /* the answer: 0 or a negative errno */
} Probe;

/* Dial-backs run on a thread of their own: a member that does not answer
 * would hold the coordinator's loop for a handshake timeout. One at a
 * time, in the order members joined. */
typedef struct Prober {
        pthread_mutex_t lock;
        pthread_cond_t wake;
        NetConfig net;            /* the coordinator's own transport settings */
        Probe asked[MAX_LINKS], answered[MAX_LINKS];
        unsigned n_asked, n_answered;
        bool stop, running;
        pthread_t thread;
} Prober;

typedef enum Phase {
        PHASE_WAITING,    /* for enough members, or for membership to settle */
        PHASE_COLLECTING, /* STOP sent: layers and DONEs coming in */
} Phase;

struct CoordinatorState {
        const Config *c;
        const Job *job;
        Identity id;
        Net *net;
        FormationModel fm;
        size_t n_params;
        size_t layer_off[PLAN_MAX_LAYERS + 1];
        Member members[MAX_LINKS];
        Plan *plan;           /* the last one sent; NULL before the first */
        uint64_t epoch;       /* the last one used (sent, or asked to stop for) */
        uint64_t samples;     /* trained by every cluster before the current plan */
        bool dirty;           /* membership changed since the last plan */
        uint64_t changed_ns;
        Phase phase;
        bool pending;         /* layers collected for epoch `epoch` wait for a plan */
        uint64_t deadline_ns;
        float *sum;           /* collecting: the layers handed in, summed */
        unsigned count[PLAN_MAX_LAYERS];
        uint64_t sends;       /* tensors out of sum not yet sent */
        Prober prober;
        volatile bool stop;
};

static Member *member_of(CoordinatorState *s, uint32_t peer) {
        for (unsigned i = 0; i < MAX_LINKS; i++)
                if (s->members[i].used && s->members[i].peer == peer)
                        return &s->members[i];
        return NULL;
}

static unsigned n_joined(const CoordinatorState *s) {
        unsigned n = 0;
        for (unsigned i = 0; i < MAX_LINKS; i++)
                n += s->members[i].used && s->members[i].joined;
        return n;
}

static void changed(CoordinatorState *s) {
        s->dirty = true;
        s->changed_ns = now_ns();
}

static void *prober_main(void *ud) {
        Prober *p = ud;
        pthread_mutex_lock(&p->lock);
        for (;;) {
                while (!p->stop && p->n_asked == 0)
                        pthread_cond_wait(&p->wake, &p->lock);
                if (p->stop)
                        break;
                Probe q = p->asked[0];
                memmove(p->asked, p->asked + 1, --p->n_asked * sizeof *p->asked);
                pthread_mutex_unlock(&p->lock);
                q.error = net_probe(&p->net, q.host, q.port, q.key);
                pthread_mutex_lock(&p->lock);
                p->answered[p->n_answered++] = q; /* as many as were asked, at most */
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

/* Dial back a member that says it accepts connections: until the answer,
 * no plan is formed. A full queue (members joining and leaving in a loop)
 * takes the member at its word. */
static void probe_ask(CoordinatorState *s, Member *m) {
        Prober *p = &s->prober;
        Probe q = { .port = m->join.pipeline_port };
        memcpy(q.key, m->key, sizeof q.key);
        snprintf(q.host, sizeof q.host, "%s", m->join.host);
        pthread_mutex_lock(&p->lock);
        if (p->n_asked + p->n_answered < MAX_LINKS) {
                p->asked[p->n_asked++] = q;
                m->probing = true;
                pthread_cond_signal(&p->wake);
        }
        pthread_mutex_unlock(&p->lock);
}

static Member *member_by_key(CoordinatorState *s, const uint8_t key[IDENTITY_PK_SIZE]) {
        for (unsigned i = 0; i < MAX_LINKS; i++)
                if (s->members[i].used && s->members[i].joined && !memcmp(s->members[i].key, key, IDENTITY_PK_SIZE))
                        return &s->members[i];
        return NULL;
}

/* The prober's answers, to the members they concern: one that did not
 * answer is in every plan as one that accepts no connections. */
static void probe_answers(CoordinatorState *s) {
        Prober *p = &s->prober;
        Probe got[MAX_LINKS];
        pthread_mutex_lock(&p->lock);
        unsigned n = p->n_answered;
        memcpy(got, p->answered, n * sizeof *got);
        p->n_answered = 0;
        pthread_mutex_unlock(&p->lock);
        for (unsigned i = 0; i < n; i++) {
                Member *m = member_by_key(s, got[i].key);
                if (!m || !m->probing)
                        continue; /* it left meanwhile */
                m->probing = false;
                uint8_t msg[PLAN_REACH_SIZE];
                plan_reach_encode(-got[i].error, msg);
                net_send_control(s->net, m->peer, FRAME_CONTROL, msg, sizeof msg);
                char hex[IDENTITY_HEX_SIZE];
                identity_to_hex(m->key, hex);
                if (got[i].error == 0) {
                        log_info("Coordinator: %.16s… accepts connections at %s:%u (dialed back)", hex, got[i].host,
                                 got[i].port);
                        continue;
                }
                log_warning("Coordinator: %.16s… does not accept connections at %s:%u (%s): it dials every link "
                            "itself, as behind NAT", hex, got[i].host, got[i].port, strerror(-got[i].error));
                m->join.pipeline_port = m->join.averaging_port = 0;
                changed(s);
        }
}

static bool probing(const CoordinatorState *s) {
        for (unsigned i = 0; i < MAX_LINKS; i++)
                if (s->members[i].used && s->members[i].joined && s->members[i].probing)
                        return true;
        return false;
}

static void on_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        CoordinatorState *s = ud;
        for (unsigned i = 0; i < MAX_LINKS; i++)
                if (!s->members[i].used) {
                        s->members[i] = (Member){ .used = true, .peer = peer };
                        memcpy(s->members[i].key, id, IDENTITY_PK_SIZE);
                        return;
                }
        net_close_peer(s->net, peer);
}

static void on_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        CoordinatorState *s = ud;
        Member *m = member_of(s, peer);
        if (!m)
                return;
        if (m->joined) {
                char hex[IDENTITY_HEX_SIZE], why[128];
                NetPeerInfo info = {};
                (void)net_peer_describe(s->net, peer, &info);
                identity_to_hex(m->key, hex);
                if (reason == -ETIMEDOUT && info.timeout == NET_TIMEOUT_IDLE)
                        snprintf(why, sizeof why, "missed its heartbeats");
                else
                        node_close_reason(reason, &info, why, sizeof why);
                log_info("Coordinator: member %.16s… left (%s); %u members", hex, why, n_joined(s) - 1);
                changed(s);
        }
        *m = (Member){};
}

static void drop(CoordinatorState *s, Member *m, const char *why) {
        char hex[IDENTITY_HEX_SIZE];
        identity_to_hex(m->key, hex);
        log_warning("Coordinator: dropped the link of %.16s…: %s", hex, why);
        net_close_peer(s->net, m->peer);
}

static void on_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        CoordinatorState *s = ud;
        Member *m = member_of(s, peer);
        PlanJoin j;
        uint64_t epoch, samples;

        if (!m)
                return;
        if (type == FRAME_CONTROL && len >= 4 && memcmp(p, "RVMJ", 4) == 0) {
                if (m->joined)
                        return drop(s, m, "joined twice");
                if (plan_join_decode(p, len, &j) < 0)
                        return drop(s, m, "a malformed JOIN");
                if (j.n_layers != (unsigned)s->job->model.n_layers || j.n_params != s->n_params)
                        return drop(s, m, "it runs another model");
                if (n_joined(s) >= PLAN_MAX_NODES)
                        return drop(s, m, "the plan is full (64 nodes)");
                if (s->phase == PHASE_COLLECTING && j.epoch >= s->epoch) /* it dials again after this one */
                        return drop(s, m, "it holds a newer epoch than the one being formed");
                m->join = j;
                m->joined = true;
                /* one that holds a plan was dialed back when it first joined
                 * (this coordinator restarted); one found unreachable then
                 * joins without ports since */
                if (j.pipeline_port && j.epoch == 0)
                        probe_ask(s, m);
                /* a node that joins while layers are collected has nothing to hand in */
                m->done = s->phase == PHASE_COLLECTING;
                if (j.epoch > s->epoch) /* a restarted coordinator goes on above what nodes hold */
                        s->epoch = j.epoch;
                char hex[IDENTITY_HEX_SIZE];
                identity_to_hex(m->key, hex);
                log_info("Coordinator: %.16s… joined from %s (%.1f GFLOP/s, %.0f MiB, link %.0f Mbit/s and "
                         "%.3f ms measured, at epoch %llu); %u members",
                         hex, j.host, j.gflops, (double)j.memory / (1 << 20), j.bandwidth * 8e-6, j.latency * 1e3,
                         (unsigned long long)j.epoch, n_joined(s));
                changed(s);
                return;
        }
        if (type == FRAME_CONTROL && len >= 4 && memcmp(p, "RVML", 4) == 0) {
                double bw, lat;
                if (!m->joined || plan_link_decode(p, len, &bw, &lat) < 0)
                        return drop(s, m, "malformed link figures");
                m->join.bandwidth = bw; /* the next plan is formed with them */
                m->join.latency = lat;
                char hex[IDENTITY_HEX_SIZE];
                identity_to_hex(m->key, hex);
                log_info("Coordinator: %.16s… measures its links at %.0f Mbit/s and %.3f ms now", hex, bw * 8e-6,
                         lat * 1e3);
                return;
        }
        if (type == FRAME_CONTROL && len >= 4 && memcmp(p, "RVMD", 4) == 0) {
                if (!m->joined || plan_done_decode(p, len, &epoch, &samples) < 0)
                        return drop(s, m, "a malformed DONE");
                if (s->phase == PHASE_COLLECTING && epoch == s->epoch && !m->done) {
                        m->done = true;
                        m->samples = samples;
                }
                return;
        }
        drop(s, m, "a message the coordinator does not take");
}

/* Layers handed in: stream = layer index, one float32 vector of exactly
 * that layer's parameters, only while collecting. */
static void on_tensor(void *ud, NetTensor *t) {
        CoordinatorState *s = ud;
        Member *m = member_of(s, t->peer);
        uint32_t layer = t->stream;
        unsigned cluster, stage;
        int index;
        if (m && m->joined && (s->phase != PHASE_COLLECTING || m->done)) { /* late: too late, not hostile */
                net_tensor_release(s->net, t);
                return;
        }
        bool ok = m && m->joined && layer < (uint32_t)s->job->model.n_layers && t->desc.dtype == DTYPE_F32 &&
                  t->desc.ndim == 1 &&
                  t->desc.dims[0] == s->layer_off[layer + 1] - s->layer_off[layer] && t->desc.dims[0] > 0;
        /* a member hands in the layers of its stage in the plan it held, no others */
        if (ok && s->plan->epoch > 0)
                ok = plan_find(s->plan, m->key, &index, &cluster, &stage) == 0 &&
                     (int)layer >= s->plan->clusters[cluster].bounds[stage] &&
                     (int)layer < s->plan->clusters[cluster].bounds[stage + 1];
        if (ok) {
                const float *v = (const float *)t->data;
                float *dst = s->sum + s->layer_off[layer];
                bool finite = true;
                for (uint32_t i = 0; i < t->desc.dims[0]; i++)
                        finite &= isfinite(v[i]) != 0; /* no NaN or infinity into everyone's model */
                if (finite) {
                        for (uint32_t i = 0; i < t->desc.dims[0]; i++)
                                dst[i] += v[i];
                        s->count[layer]++;
                }
                ok = finite;
        }
        net_tensor_release(s->net, t);
        if (!ok && m)
                drop(s, m, "a tensor that is not a layer of the model");
}

static void on_sent(void *ud, uint32_t peer, uint64_t cookie) {
        CoordinatorState *s = ud;
        if (s->sends)
                s->sends--;
}

static const NetCallbacks callbacks = {
        .connected = on_connected,
        .closed = on_closed,
        .control = on_control,
        .tensor = on_tensor,
        .sent = on_sent,
};

static bool has_params(const CoordinatorState *s, int lo, int hi) {
        return s->layer_off[hi] > s->layer_off[lo];
}

/* Every stage must hold parameters (the averaging rings are cut at stage
 * boundaries): move cuts off layers without any, like a ReLU. */
static bool fix_cut(const CoordinatorState *s, int *b, unsigned n) {
        for (unsigned k = 0; k + 1 < n; k++)
                while (!has_params(s, b[k], b[k + 1]) && b[k + 1] + 1 < b[k + 2])
                        b[k + 1]++;
        for (unsigned k = n - 1; k > 0 && !has_params(s, b[k], b[n]); k--)
                while (!has_params(s, b[k], b[k + 1]) && b[k] - 1 > b[k - 1])
                        b[k]--;
        for (unsigned k = 0; k < n; k++)
                if (!has_params(s, b[k], b[k + 1]))
                        return false;
        return true;
}

static int cmp_member(const void *a, const void *b) {
        return memcmp((*(Member *const *)a)->key, (*(Member *const *)b)->key, IDENTITY_PK_SIZE);
}

/* A plan for the members joined now. */
static int form(CoordinatorState *s, uint64_t epoch, Plan *ret) {
        const Config *c = s->c;
        Member *m[PLAN_MAX_NODES];
        Capability caps[PLAN_MAX_NODES];
        unsigned n = 0;
        Diag d = {};
        int r;

        for (unsigned i = 0; i < MAX_LINKS && n < PLAN_MAX_NODES; i++)
                if (s->members[i].used && s->members[i].joined)
                        m[n++] = &s->members[i];
        if (n == 0)
                return -ENODATA;
        qsort(m, n, sizeof *m, cmp_member); /* the same members give the same plan */
        for (unsigned i = 0; i < n; i++)
                caps[i] = (Capability){ .gflops = m[i]->join.gflops, .memory = m[i]->join.memory,
                                        .bandwidth = m[i]->join.bandwidth, .latency = m[i]->join.latency };
        _cleanup_(formation_freep) Formation *f = NULL;
        r = formation_run(&s->fm, caps, (int)n, &(FormationParams){ .seed = epoch }, &f, &d);
        if (r < 0) {
                log_warning_errno(r, "Coordinator: no plan for %u members: %s", n, d.text);
                return r;
        }
        memset(ret, 0, sizeof *ret);
        ret->epoch = epoch;
        memcpy(ret->signer, s->id.pk, PLAN_KEY_SIZE);
        ret->samples = s->samples;
        ret->n_layers = (unsigned)s->job->model.n_layers;
        ret->micro_batch = (unsigned)c->pipeline.micro_batch;
        ret->staleness = (unsigned)c->pipeline.staleness;
        ret->update_frequency = (unsigned)c->pipeline.update_frequency;
        ret->synchronous = c->pipeline.synchronous;
        ret->n_nodes = n;
        for (unsigned i = 0; i < n; i++) {
                PlanNode *pn = &ret->nodes[i];
                memcpy(pn->key, m[i]->key, PLAN_KEY_SIZE);
                snprintf(pn->host, sizeof pn->host, "%s", m[i]->join.host);
                pn->pipeline_port = m[i]->join.pipeline_port;
                pn->averaging_port = m[i]->join.averaging_port;
        }
        for (int k = 0; k < f->n_clusters && ret->n_clusters < PLAN_MAX_CLUSTERS; k++) {
                const FormationCluster *fc = &f->clusters[k];
                PlanCluster *pc = &ret->clusters[ret->n_clusters];
                pc->n_stages = (unsigned)fc->n_nodes;
                memcpy(pc->bounds, fc->bounds, sizeof(int) * (size_t)(fc->n_nodes + 1));
                for (int st = 0; st < fc->n_nodes; st++)
                        pc->nodes[st] = (uint16_t)fc->nodes[st];
                if (!fix_cut(s, pc->bounds, pc->n_stages)) {
                        log_warning("Coordinator: cluster %d of the formation has a stage without parameters; "
                                    "its nodes stay spares", k + 1);
                        continue;
                }
                ret->n_clusters++;
        }
        return plan_check(ret) < 0 ? -EINVAL : 0;
}

/* Each node of the plan: its layers (after a hand-over), then the plan. */
static void publish(CoordinatorState *s, Plan *p, bool with_layers) {
        _cleanup_(freep) uint8_t *buf = malloc(PLAN_MAX_BYTES);
        uint64_t t0 = now_ns();
        unsigned sent = 0, layers = 0;
        int len;

        if (!buf)
                return;
        len = plan_encode(p, s->id.sk, buf, PLAN_MAX_BYTES);
        if (len < 0) {
                log_error_errno(len, "Coordinator: cannot encode plan epoch %llu: %m", (unsigned long long)p->epoch);
                return;
        }
        if (with_layers) /* the average of the copies handed in */
                for (unsigned l = 0; l < p->n_layers; l++)
                        if (s->count[l] > 1)
                                for (size_t i = s->layer_off[l]; i < s->layer_off[l + 1]; i++)
                                        s->sum[i] /= (float)s->count[l];
        for (unsigned i = 0; i < MAX_LINKS; i++) {
                Member *m = &s->members[i];
                unsigned cluster, stage;
                int index;
                if (!m->used || !m->joined)
                        continue;
                if (with_layers && plan_find(p, m->key, &index, &cluster, &stage) == 0) {
                        const PlanCluster *pc = &p->clusters[cluster];
                        for (int l = pc->bounds[stage]; l < pc->bounds[stage + 1]; l++) {
                                size_t len_l = s->layer_off[l + 1] - s->layer_off[l];
                                TensorDesc desc;
                                if (!len_l || !s->count[l] ||
                                    tensor_desc_init(&desc, DTYPE_F32, 1, (uint32_t[]){ (uint32_t)len_l }) < 0)
                                        continue;
                                if (net_send_tensor(s->net, m->peer, (uint32_t)l, &desc, s->sum + s->layer_off[l],
                                                    0) == 0) {
                                        s->sends++;
                                        layers++;
                                }
                        }
                }
                if (net_send_control(s->net, m->peer, FRAME_PLAN, buf, (size_t)len) == 0)
                        sent++;
        }
        unsigned stages = 0;
        for (unsigned k = 0; k < p->n_clusters; k++)
                stages += p->clusters[k].n_stages;
        char sig[9];
        for (int i = 0; i < 4; i++)
                snprintf(sig + 2 * i, 3, "%02x", buf[len - PLAN_SIG_SIZE + i]);
        log_info("Coordinator: plan epoch %llu (signature %s…) to %u members: %u clusters, %u stages, %u spares, %u "
                 "layers handed over, %llu samples trained before (%.1f ms, %d bytes signed)",
                 (unsigned long long)p->epoch, sig, sent, p->n_clusters, stages, p->n_nodes - stages, layers,
                 (unsigned long long)p->samples, ns_to_sec(now_ns() - t0) * 1e3, len);
        for (unsigned k = 0; k < p->n_clusters; k++) {
                char line[512];
                size_t at = 0;
                for (unsigned st = 0; st < p->clusters[k].n_stages && at < sizeof line - 64; st++) {
                        char hex[IDENTITY_HEX_SIZE];
                        identity_to_hex(p->nodes[p->clusters[k].nodes[st]].key, hex);
                        at += (size_t)snprintf(line + at, sizeof line - at, " %.8s…:%d-%d", hex,
                                               p->clusters[k].bounds[st], p->clusters[k].bounds[st + 1] - 1);
                }
                log_info("Coordinator: epoch %llu cluster %u:%s", (unsigned long long)p->epoch, k + 1, line);
        }
        memcpy(s->plan, p, sizeof *p);
}

/* Membership changed and settled: a new epoch. The first plan goes out at
 * once; later ones after the members handed in their layers. */
static void tick(CoordinatorState *s) {
        const ConfigMembership *cm = &s->c->membership;
        uint64_t now = now_ns();
        bool trained = s->plan->epoch > 0;

        for (unsigned i = 0; !trained && i < MAX_LINKS; i++)
                trained = s->members[i].used && s->members[i].joined && s->members[i].join.epoch > 0;

        probe_answers(s);
        if (s->phase == PHASE_WAITING) {
                if (!s->dirty || probing(s) || now - s->changed_ns < (uint64_t)cm->settle_ms * 1000000ULL ||
                    n_joined(s) < (s->plan->epoch ? 1 : cm->min_nodes))
                        return;
                if (s->sends) /* the last hand-over still leaves from sum */
                        return;
                _cleanup_(plan_freep) Plan *p = plan_new();
                if (!p)
                        return;
                s->dirty = false;
                if (s->pending) { /* the members stopped and handed in already */
                        if (form(s, s->epoch, p) == 0) {
                                s->pending = false;
                                publish(s, p, true);
                        }
                        return;
                }
                if (!trained) {
                        if (form(s, s->epoch + 1, p) == 0) {
                                s->epoch++;
                                publish(s, p, false);
                        }
                        return;
                }
                /* stop, hand in, re-form */
                s->epoch++;
                memset(s->sum, 0, s->n_params * sizeof(float));
                memset(s->count, 0, sizeof s->count);
                uint8_t msg[PLAN_STOP_SIZE];
                plan_stop_encode(s->epoch, msg);
                for (unsigned i = 0; i < MAX_LINKS; i++) {
                        Member *m = &s->members[i];
                        if (m->used && m->joined) {
                                m->done = false;
                                m->samples = 0;
                                net_send_control(s->net, m->peer, FRAME_CONTROL, msg, sizeof msg);
                        }
                }
                s->phase = PHASE_COLLECTING;
                s->deadline_ns = now + (uint64_t)cm->handover_timeout_ms * 1000000ULL;
                log_info("Coordinator: epoch %llu: members stop at a safe point and hand in their layers",
                         (unsigned long long)s->epoch);
                return;
        }

        bool all = true;
        for (unsigned i = 0; i < MAX_LINKS; i++)
                if (s->members[i].used && s->members[i].joined && !s->members[i].done)
                        all = false;
        if (!all && now < s->deadline_ns)
                return;
        if (!all)
                log_warning("Coordinator: epoch %llu: not every member handed in its layers in time; going on "
                            "with what came", (unsigned long long)s->epoch);
        uint64_t samples = 0;
        for (unsigned i = 0; i < MAX_LINKS; i++)
                if (s->members[i].used && s->members[i].joined)
                        samples += s->members[i].samples;
        s->samples += samples;
        s->phase = PHASE_WAITING;
        s->dirty = false;
        _cleanup_(plan_freep) Plan *p = plan_new();
        if (p && form(s, s->epoch, p) == 0)
                publish(s, p, true);
        else { /* the layers wait here, the members for the next change */
                s->pending = true;
                log_warning("Coordinator: epoch %llu: no plan; training waits for more members",
                            (unsigned long long)s->epoch);
        }
}

static void *coordinator_main(void *ud) {
        CoordinatorState *s = ud;
        uint64_t last_hb = now_ns();
        uint64_t every = (uint64_t)s->c->membership.heartbeat_ms * 1000000ULL;
        while (!s->stop) {
                net_run(s->net, 50);
                tick(s);
                if (now_ns() - last_hb >= every) { /* members see their coordinator alive */
                        last_hb = now_ns();
                        net_broadcast_control(s->net, FRAME_HEARTBEAT, NULL, 0);
                }
        }
        return NULL;
}

static CoordinatorState *state_free(CoordinatorState *s) {
        if (!s)
                return NULL;
        if (s->prober.running) {
                pthread_mutex_lock(&s->prober.lock);
                s->prober.stop = true;
                pthread_cond_signal(&s->prober.wake);
                pthread_mutex_unlock(&s->prober.lock);
                pthread_join(s->prober.thread, NULL);
        }
        pthread_mutex_destroy(&s->prober.lock);
        pthread_cond_destroy(&s->prober.wake);
        s->net = net_free(s->net);
        s->plan = plan_free(s->plan);
        free(s->sum);
        identity_clear(&s->id);
        free(s);
        return NULL;
}

int coordinator_start(Coordinator *co, const Config *c, const Job *job, const Identity *id) {
        const ConfigMembership *cm = &c->membership;
        CoordinatorState *s;
        NetConfig nc;
        Diag d = {};
        uint16_t port;
        int r;

        memset(co, 0, sizeof *co);
        if (memcmp(cm->coordinator.id, id->pk, IDENTITY_PK_SIZE) != 0) {
                char hex[IDENTITY_HEX_SIZE];
                identity_to_hex(id->pk, hex);
                log_error("%s: membership.coordinate: this node's key %s is not the coordinator's in "
                          "membership.coordinator", c->path, hex);
                return -EINVAL;
        }
        s = calloc(1, sizeof *s);
        if (!s)
                return log_error_errno(-ENOMEM, "Out of memory");
        pthread_mutex_init(&s->prober.lock, NULL);
        pthread_cond_init(&s->prober.wake, NULL);
        if (!(s->plan = plan_new()))
                return log_error_errno(-ENOMEM, "Out of memory"), state_free(s), -ENOMEM;
        s->c = c;
        s->job = job;
        s->id = *id;
        for (int l = 0; l < job->model.n_layers; l++)
                s->layer_off[l + 1] = s->layer_off[l] + model_spec_params(&job->model, l, l + 1);
        s->n_params = s->layer_off[job->model.n_layers];
        PartitionParams pp = { .micro_batch = c->pipeline.micro_batch, .in_flight = c->pipeline.staleness,
                               .optim_floats = (int)optim_state_floats(job->optim.kind, 1),
                               .stashed = c->pipeline.staleness };
        if ((r = formation_model_init(&job->model, &pp, &s->fm, &d)) < 0) {
                state_free(s);
                return log_error_errno(r, "Coordinator: %s: %s", job->name, d.text);
        }
        s->sum = calloc(s->n_params, sizeof(float));
        if (!s->sum)
                return state_free(s), log_error_errno(-ENOMEM, "Out of memory");
        if ((r = config_net(c, &s->id, &nc, &d)) < 0) {
                state_free(s);
                return log_error_errno(r, "Invalid configuration: %s", d.text);
        }
        s->prober.net = nc; /* dials back as any node of the swarm would */
        if ((r = -pthread_create(&s->prober.thread, NULL, prober_main, &s->prober)) < 0) {
                state_free(s);
                return log_error_errno(r, "Coordinator: failed to start its thread: %m");
        }
        s->prober.running = true;
        nc.idle_timeout_ms = cm->deadline_ms; /* a member silent this long has left */
        /* the layers handed in: one copy at a time per link, the rest malloc()ed */
        nc.pool_bytes = MIN(s->n_params * sizeof(float) + (1u << 20), (size_t)1 << 30);
        nc.max_receive_bytes = MAX(nc.max_receive_bytes, (uint64_t)nc.pool_bytes);
        if ((r = net_new(&nc, &callbacks, s, &s->net)) < 0) {
                state_free(s);
                return log_error_errno(r, "Coordinator: failed to start its transport: %m");
        }
        if ((r = net_listen(s->net, cm->coordinator.address.host, cm->coordinator.address.port, &port)) < 0) {
                state_free(s);
                return log_error_errno(r, "Coordinator: failed to listen on %s:%u: %m", cm->coordinator.address.host,
                                       cm->coordinator.address.port);
        }
        r = -pthread_create(&co->thread, NULL, coordinator_main, s);
        if (r < 0) {
                state_free(s);
                return log_error_errno(r, "Coordinator: failed to start its thread: %m");
        }
        co->state = s;
        co->running = true;
        log_info("Coordinator listening on %s:%u: first plan at %u members, %g s after the last change; members "
                 "silent for %g s leave",
                 cm->coordinator.address.host, port, cm->min_nodes, cm->settle_ms / 1000.0,
                 cm->deadline_ms / 1000.0);
        return 0;
}

void coordinator_stop(Coordinator *co) {
        if (!co->running)
                return;
        co->state->stop = true;
        pthread_join(co->thread, NULL);
        co->state = state_free(co->state);
        co->running = false;
}
