/* run/coordinator.c — members, heartbeats, epochs and formation, on the
 * coordinator's own thread (see coordinator.h). */
#include "coordinator.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/formation.h"
#include "cluster/plan-repair.h"
#include "averaging.h"
#include "cluster/plan.h"
#include "node.h"
#include "util/log.h"
#include "util/time-util.h"

/* Links the coordinator holds: every member a plan can have, and a
 * quarter more for nodes that connected and have not joined yet (the
 * transport keeps a quarter of its links for handshakes in progress); at
 * least the transport's default. */
#define MAX_LINKS MAX(PLAN_MAX_NODES + PLAN_MAX_NODES / 4, 256)

typedef struct Member {
        bool used, joined, done;
        bool probing;     /* its pipeline port is being dialed back */
        uint32_t peer;
        uint8_t key[IDENTITY_PK_SIZE];
        PlanJoin join;
        uint64_t samples; /* what it trained as a first stage, from its DONE */
        int node;         /* its index in the plan being formed, -1 if none */
        int cluster, stage; /* its place in the last plan sent; cluster -1: a spare, or not in it */
        bool keeps;       /* its layers are the same in the plan formed at the stop: none handed to it */
        bool hand_in;     /* it was asked for its layers at the stop */
        uint8_t handed[PLAN_PARTS][PLAN_MAX_LAYERS / 8]; /* ... and these came (one copy each) */
} Member;

/* Members sit in slots that never move; a member is found from its link
 * by a binary search of an index sorted by peer id, so a message costs
 * O(log n) and not a scan of every slot. */
typedef struct PeerSlot {
        uint32_t peer;
        uint16_t slot;
} PeerSlot;

/* A dial-back, asked of the prober thread and answered by it. */
typedef struct Probe {
        uint32_t peer; /* the member's link: an answer finds it, or finds it gone */
        uint8_t key[IDENTITY_PK_SIZE];
        char host[PLAN_HOST_MAX];
        uint16_t port;
        int error; /* the answer: 0 or a negative errno */
} Probe;

/* A first-in, first-out ring of probes. */
typedef struct ProbeQueue {
        Probe item[MAX_LINKS];
        unsigned head, n;
} ProbeQueue;

/* Dial-backs run on a thread of their own: a member that does not answer
 * would hold the coordinator's loop for a handshake timeout. One at a
 * time, in the order members joined. */
typedef struct Prober {
        pthread_mutex_t lock;
        pthread_cond_t wake;
        NetConfig net;            /* the coordinator's own transport settings */
        ProbeQueue asked, answered;
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
        CollModel model; /* the job's, which every member's JOIN must name */
        size_t layer_off[PLAN_MAX_LAYERS + 1];
        Member members[MAX_LINKS];
        PeerSlot by_peer[MAX_LINKS]; /* the used slots, by peer id */
        unsigned n_members;          /* used slots: linked, joined or not */
        uint16_t free_slots[MAX_LINKS];
        unsigned n_free;
        /* of the joined members: how many there are, are dialed back, came
         * with an epoch (trained before), handed in (collecting) */
        unsigned n_joined, n_probing, n_trained, n_done;
        unsigned shown_joined; /* n_joined for other threads (coordinator_members()), atomically */
        Control *control;     /* told its links' bytes; NULL: nobody */
        uint64_t told_sent, told_received; /* ... as far as it was told */
        Plan *plan;           /* the last one sent; NULL before the first */
        uint64_t epoch;       /* the last one used (sent, or asked to stop for) */
        uint64_t samples;     /* trained by every cluster before the current plan */
        bool dirty;           /* membership changed since the last plan */
        uint64_t changed_ns;
        Phase phase;
        bool pending;         /* layers collected for epoch `epoch` wait for a plan */
        Plan *formed;         /* collecting: the plan formed at the stop, sent when it ends */
        bool have_formed;     /* ... else every member hands in and the plan is formed then */
        uint64_t deadline_ns;
        /* collecting: the layers handed in, summed, by part (PLAN_STREAM():
         * parameters, then the optimizer's moments, allocated when the
         * first comes), and how many copies of each */
        float *sum[PLAN_PARTS];
        unsigned count[PLAN_PARTS][PLAN_MAX_LAYERS];
        uint64_t sends;       /* tensors out of sum not yet sent */
        Prober prober;
        volatile bool stop;
};

/* Where peer is in the index, or where it would go. */
static unsigned peer_rank(const CoordinatorState *s, uint32_t peer) {
        unsigned lo = 0, hi = s->n_members;
        while (lo < hi) {
                unsigned mid = (lo + hi) / 2;
                if (s->by_peer[mid].peer < peer)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

static Member *member_of(CoordinatorState *s, uint32_t peer) {
        unsigned i = peer_rank(s, peer);
        return i < s->n_members && s->by_peer[i].peer == peer ? &s->members[s->by_peer[i].slot] : NULL;
}

/* A slot for a new link; NULL when every one is taken. */
static Member *member_add(CoordinatorState *s, uint32_t peer, const uint8_t key[IDENTITY_PK_SIZE]) {
        if (s->n_free == 0)
                return NULL;
        uint16_t slot = s->free_slots[--s->n_free];
        unsigned i = peer_rank(s, peer);
        memmove(s->by_peer + i + 1, s->by_peer + i, (s->n_members - i) * sizeof *s->by_peer);
        s->by_peer[i] = (PeerSlot){ .peer = peer, .slot = slot };
        s->n_members++;
        Member *m = &s->members[slot];
        *m = (Member){ .used = true, .peer = peer, .node = -1, .cluster = -1 };
        memcpy(m->key, key, IDENTITY_PK_SIZE);
        return m;
}

/* The link is gone: out of the counts, the index and its slot. */
static void member_remove(CoordinatorState *s, Member *m) {
        if (m->joined) {
                s->n_joined--;
                s->n_trained -= m->join.epoch > 0;
                s->n_probing -= m->probing;
                s->n_done -= m->done;
        }
        unsigned i = peer_rank(s, m->peer);
        memmove(s->by_peer + i, s->by_peer + i + 1, (s->n_members - i - 1) * sizeof *s->by_peer);
        s->n_members--;
        s->free_slots[s->n_free++] = (uint16_t)(m - s->members);
        *m = (Member){};
}

/* The i-th used slot, in peer order: `for (i < s->n_members)` visits every link. */
static Member *member_at(CoordinatorState *s, unsigned i) {
        return &s->members[s->by_peer[i].slot];
}

static void set_done(CoordinatorState *s, Member *m, bool done) {
        s->n_done += (unsigned)done - (unsigned)m->done;
        m->done = done;
}

static void set_probing(CoordinatorState *s, Member *m, bool probing) {
        s->n_probing += (unsigned)probing - (unsigned)m->probing;
        m->probing = probing;
}

static void changed(CoordinatorState *s) {
        s->dirty = true;
        s->changed_ns = now_ns();
}

static void queue_push(ProbeQueue *q, const Probe *p) {
        q->item[(q->head + q->n++) % MAX_LINKS] = *p;
}

static void queue_pop(ProbeQueue *q, Probe *ret) {
        *ret = q->item[q->head];
        q->head = (q->head + 1) % MAX_LINKS;
        q->n--;
}

static void *prober_main(void *ud) {
        Prober *p = ud;
        pthread_mutex_lock(&p->lock);
        for (;;) {
                while (!p->stop && p->asked.n == 0)
                        pthread_cond_wait(&p->wake, &p->lock);
                if (p->stop)
                        break;
                Probe q;
                queue_pop(&p->asked, &q);
                pthread_mutex_unlock(&p->lock);
                q.error = net_probe(&p->net, q.host, q.port, q.key);
                pthread_mutex_lock(&p->lock);
                queue_push(&p->answered, &q); /* as many as were asked, at most */
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

/* Dial back a member that says it accepts connections: until the answer,
 * no plan is formed. A full queue (members joining and leaving in a loop)
 * takes the member at its word. */
static void probe_answer(CoordinatorState *s, const Probe *q);

/* The host part of the address a member's link comes from: "192.0.2.7"
 * of "192.0.2.7:41234", "2001:db8::7" of "[2001:db8::7]:7000". */
static int link_host(const CoordinatorState *s, uint32_t peer, char *buf, size_t len) {
        NetPeerInfo info;
        int r = net_peer_describe(s->net, peer, &info);
        if (r < 0)
                return r;
        const char *a = info.address, *colon = strrchr(a, ':');
        if (!colon)
                return -EINVAL;
        bool v6 = a[0] == '[';
        size_t n = (size_t)(colon - a) - (v6 ? 2 : 0);
        if (n == 0 || n >= len)
                return -EINVAL;
        memcpy(buf, a + v6, n);
        buf[n] = '\0';
        return 0;
}

/* Dial the member back where its link comes from, at the port it gives:
 * not at the host its JOIN names, which nothing proves is its own (the
 * coordinator would otherwise dial, and report on, any address a member
 * names). Behind NAT, its link comes from the router, which does not
 * answer: the member is told so, rightly. */
static void probe_ask(CoordinatorState *s, Member *m) {
        Prober *p = &s->prober;
        Probe q = { .peer = m->peer, .port = m->join.pipeline_port };
        memcpy(q.key, m->key, sizeof q.key);
        if (link_host(s, m->peer, q.host, sizeof q.host) < 0) { /* the link is going: as unreachable */
                snprintf(q.host, sizeof q.host, "%s", m->join.host);
                q.error = -EADDRNOTAVAIL;
                set_probing(s, m, true);
                probe_answer(s, &q);
                return;
        }
        pthread_mutex_lock(&p->lock);
        if (p->asked.n + p->answered.n < MAX_LINKS) {
                queue_push(&p->asked, &q);
                set_probing(s, m, true);
                pthread_cond_signal(&p->wake);
        }
        pthread_mutex_unlock(&p->lock);
}

/* One of the prober's answers to the member it concerns: one that did not
 * answer is in every plan as one that accepts no connections. */
static void probe_answer(CoordinatorState *s, const Probe *q) {
        Member *m = member_of(s, q->peer);
        if (!m || !m->joined || !m->probing)
                return; /* it left meanwhile */
        set_probing(s, m, false);
        uint8_t msg[PLAN_REACH_SIZE];
        plan_reach_encode(-q->error, msg);
        net_send_control(s->net, m->peer, FRAME_CONTROL, msg, sizeof msg);
        char hex[IDENTITY_HEX_SIZE];
        identity_to_hex(m->key, hex);
        if (q->error == 0) {
                log_info("Coordinator: %.16s… accepts connections at %s:%u (dialed back)", hex, q->host, q->port);
                return;
        }
        log_warning("Coordinator: %.16s… does not accept connections at %s:%u (%s): it dials every link "
                    "itself, as behind NAT", hex, q->host, q->port, strerror(-q->error));
        m->join.pipeline_port = m->join.averaging_port = 0;
        changed(s);
}

static void probe_answers(CoordinatorState *s) {
        Prober *p = &s->prober;
        for (;;) {
                Probe q;
                pthread_mutex_lock(&p->lock);
                bool any = p->answered.n > 0;
                if (any)
                        queue_pop(&p->answered, &q);
                pthread_mutex_unlock(&p->lock);
                if (!any)
                        return;
                probe_answer(s, &q);
        }
}

static void on_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        CoordinatorState *s = ud;
        if (!member_add(s, peer, id))
                net_close_peer(s->net, peer);
}

static void on_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        CoordinatorState *s = ud;
        Member *m = member_of(s, peer);
        if (!m)
                return;
        bool joined = m->joined;
        char hex[IDENTITY_HEX_SIZE];
        identity_to_hex(m->key, hex);
        member_remove(s, m);
        if (joined) {
                char why[128];
                NetPeerInfo info = {};
                (void)net_peer_describe(s->net, peer, &info);
                if (reason == -ETIMEDOUT && info.timeout == NET_TIMEOUT_IDLE)
                        snprintf(why, sizeof why, "missed its heartbeats");
                else
                        node_close_reason(reason, &info, why, sizeof why);
                log_info("Coordinator: member %.16s… left (%s); %u members", hex, why, s->n_joined);
                changed(s);
        }
}

/* Lines a member can have the coordinator write at will (a drop per
 * connection, link figures per message): a burst each per member, then a
 * summary; a member with a new key each time shares a burst with the
 * others past the limit's table. A member sends its figures every 10 s at
 * most. */
static LogRatelimit drop_lines = LOG_RATELIMIT_INIT("Coordinator: links dropped of");
static LogRatelimit figure_lines = LOG_RATELIMIT_INIT("Coordinator: link figures from");

static void drop(CoordinatorState *s, Member *m, const char *why) {
        char hex[IDENTITY_HEX_SIZE];
        identity_to_hex(m->key, hex);
        hex[16] = 0;
        if (log_ratelimit(&drop_lines, LOG_WARNING, hex))
                log_warning("Coordinator: dropped the link of %s…: %s", hex, why);
        net_close_peer(s->net, m->peer);
}

/* A JOIN ("RVMJ"): the member's capabilities, for the next plan. */
static void on_join(CoordinatorState *s, Member *m, const uint8_t *p, size_t len) {
        PlanJoin j;
        if (m->joined)
                return drop(s, m, "joined twice");
        if (plan_join_decode(p, len, &j) < 0)
                return drop(s, m, "a malformed JOIN");
        CollModel theirs = { .values = j.n_params };
        static_assert(sizeof theirs.digest == sizeof j.model, "a JOIN's digest is averaging's");
        memcpy(theirs.digest, j.model, sizeof theirs.digest);
        if (j.n_layers != (unsigned)s->job->model.n_layers || coll_model_check(&s->model, &theirs) < 0) {
                char why[256], how[160];
                averaging_model_why(&s->model, &theirs, how, sizeof how);
                snprintf(why, sizeof why, "it runs another model (%u layers against %d; %s)", j.n_layers,
                         s->job->model.n_layers, how);
                return drop(s, m, why);
        }
        if (s->n_joined >= PLAN_MAX_NODES) {
                char why[64];
                snprintf(why, sizeof why, "the plan is full (%d nodes)", PLAN_MAX_NODES);
                return drop(s, m, why);
        }
        if (s->phase == PHASE_COLLECTING && j.epoch >= s->epoch) /* it dials again after this one */
                return drop(s, m, "it holds a newer epoch than the one being formed");
        m->join = j;
        m->joined = true;
        s->n_joined++;
        /* one that rejoins has its place in the plan sent still */
        unsigned cluster, stage;
        int index;
        if (plan_find(s->plan, m->key, &index, &cluster, &stage) == 0) {
                m->cluster = (int)cluster;
                m->stage = (int)stage;
        }
        s->n_trained += j.epoch > 0;
        /* one that holds a plan was dialed back when it first joined
         * (this coordinator restarted); one found unreachable then
         * joins without ports since */
        if (j.pipeline_port && j.epoch == 0)
                probe_ask(s, m);
        /* a node that joins while layers are collected has nothing to hand in */
        set_done(s, m, s->phase == PHASE_COLLECTING);
        if (j.epoch > s->epoch) /* a restarted coordinator goes on above what nodes hold (plan.h) */
                s->epoch = MIN(j.epoch, PLAN_EPOCH_MAX / 2);
        char hex[IDENTITY_HEX_SIZE];
        identity_to_hex(m->key, hex);
        NetPeerInfo from = { .address = "?" };
        (void)net_peer_describe(s->net, m->peer, &from);
        log_info("Coordinator: %.16s… joined from %s, giving host %s (%.1f GFLOP/s, %.0f MiB, link %.0f Mbit/s "
                 "and %.3f ms measured, at epoch %llu); %u members",
                 hex, from.address, j.host, j.gflops, (double)j.memory / (1 << 20), j.bandwidth * 8e-6, j.latency * 1e3,
                 (unsigned long long)j.epoch, s->n_joined);
        changed(s);
}

static void on_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        CoordinatorState *s = ud;
        Member *m = member_of(s, peer);
        uint64_t epoch, samples;

        if (!m)
                return;
        if (type == FRAME_CONTROL && len >= 4 && memcmp(p, "RVMJ", 4) == 0)
                return on_join(s, m, p, len);
        if (type == FRAME_CONTROL && len >= 4 && memcmp(p, "RVML", 4) == 0) {
                double bw, lat;
                if (!m->joined || plan_link_decode(p, len, &bw, &lat) < 0)
                        return drop(s, m, "malformed link figures");
                m->join.bandwidth = bw; /* the next plan is formed with them */
                m->join.latency = lat;
                char hex[IDENTITY_HEX_SIZE];
                identity_to_hex(m->key, hex);
                hex[16] = 0;
                if (log_ratelimit(&figure_lines, LOG_INFO, hex))
                        log_info("Coordinator: %s… measures its links at %.0f Mbit/s and %.3f ms now", hex, bw * 8e-6,
                                 lat * 1e3);
                return;
        }
        if (type == FRAME_CONTROL && len >= 4 && memcmp(p, "RVMD", 4) == 0) {
                if (!m->joined || plan_done_decode(p, len, &epoch, &samples) < 0)
                        return drop(s, m, "a malformed DONE");
                if (s->phase == PHASE_COLLECTING && epoch == s->epoch && !m->done) {
                        set_done(s, m, true);
                        m->samples = samples;
                }
                return;
        }
        drop(s, m, "a message the coordinator does not take");
}

/* sum += v, only if every v is at most LAYER_VALUE_MAX in magnitude (no
 * NaN or infinity into everyone's model): false leaves sum as it was. The
 * bound is each copy's own, so that the sum of the copies of 1024 members
 * cannot overflow float32 and only the member that sent a value too large
 * is to blame. */
#define LAYER_VALUE_MAX 1e30f

static bool add_layer(float *sum, const float *v, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (!(fabsf(v[i]) <= LAYER_VALUE_MAX))
                        return false;
        for (size_t i = 0; i < n; i++)
                sum[i] += v[i];
        return true;
}

/* Layers handed in: stream PLAN_STREAM(part, layer), one float32 vector of
 * exactly that layer's parameters, only while collecting, only from a
 * member asked for them, of the stage it held. */
static void on_tensor(void *ud, NetTensor *t) {
        CoordinatorState *s = ud;
        Member *m = member_of(s, t->peer);
        uint32_t layer = t->stream % PLAN_MAX_LAYERS, part = t->stream / PLAN_MAX_LAYERS;
        if (m && m->joined && (s->phase != PHASE_COLLECTING || m->done)) { /* late: too late, not hostile */
                net_tensor_release(s->net, t);
                return;
        }
        bool ok = m && m->joined && part < PLAN_PARTS && layer < (uint32_t)s->job->model.n_layers &&
                  t->desc.dtype == DTYPE_F32 && t->desc.ndim == 1 &&
                  t->desc.dims[0] == s->layer_off[layer + 1] - s->layer_off[layer] && t->desc.dims[0] > 0;
        /* a member hands in the layers of its stage in the plan it held, no others */
        if (ok && s->plan->epoch > 0)
                ok = (!s->have_formed || m->hand_in) && m->cluster >= 0 &&
                     (int)layer >= s->plan->clusters[m->cluster].bounds[m->stage] &&
                     (int)layer < s->plan->clusters[m->cluster].bounds[m->stage + 1];
        const char *why = ok ? NULL : "a tensor that is not a layer of the model";
        if (ok && (m->handed[part][layer / 8] & (1u << (layer % 8))))
                why = "a layer it handed in already";
        if (!why && !s->sum[part] && !(s->sum[part] = calloc(s->n_params, sizeof(float)))) {
                log_warning("Coordinator: no memory to sum the layers handed in");
                net_tensor_release(s->net, t);
                return;
        }
        if (!why && !add_layer(s->sum[part] + s->layer_off[layer], (const float *)t->data, t->desc.dims[0]))
                why = "a layer with a value that is not finite, or past 1e30";
        if (!why) {
                m->handed[part][layer / 8] |= (uint8_t)(1u << (layer % 8));
                s->count[part][layer]++;
        }
        net_tensor_release(s->net, t);
        if (why && m)
                drop(s, m, why);
}

static void on_sent(void *ud, uint32_t peer, uint64_t cookie) {
        CoordinatorState *s = ud;
        if (s->sends)
                s->sends--;
}

static void on_lane_refused(void *ud, int reason, const NetPeerInfo *info) {
        node_log_lane_refused("coordinator", reason, info);
}

static const NetCallbacks callbacks = {
        .connected = on_connected,
        .closed = on_closed,
        .control = on_control,
        .tensor = on_tensor,
        .sent = on_sent,
        .lane_refused = on_lane_refused,
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

/* The joined members, by key (the same members give the same plan): each
 * one's node is its index there. */
static unsigned plan_members(CoordinatorState *s, Member **ret) {
        unsigned n = 0;
        for (unsigned i = 0; i < s->n_members; i++) {
                Member *m = member_at(s, i);
                m->node = -1;
                if (m->joined && n < PLAN_MAX_NODES)
                        ret[n++] = m;
        }
        qsort(ret, n, sizeof *ret, cmp_member);
        for (unsigned i = 0; i < n; i++)
                ret[i]->node = (int)i;
        return n;
}

/* A plan's settings and nodes, without clusters: every node a spare. The
 * micro-batch is the members' (most of them), one for the swarm: every
 * cluster counts its shard of the data in micro-batches of the plan. */
static void plan_start(CoordinatorState *s, uint64_t epoch, Member *const *m, unsigned n, Plan *ret) {
        const Config *c = s->c;
        unsigned asked[PLAN_MAX_NODES];
        for (unsigned i = 0; i < n; i++)
                asked[i] = m[i]->join.micro_batch;
        unsigned micro_batch = plan_micro_batch(asked, n);
        memset(ret, 0, sizeof *ret);
        ret->epoch = epoch;
        memcpy(ret->signer, s->id.pk, PLAN_KEY_SIZE);
        ret->samples = s->samples;
        ret->n_layers = (unsigned)s->job->model.n_layers;
        ret->micro_batch = micro_batch ? micro_batch : (unsigned)c->pipeline.micro_batch;
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
}

/* Every stage of ret holds parameters (fix_cut()); a cluster where that
 * cannot be is dropped, its nodes spares, and the last cluster takes its
 * number (one cluster renumbered, not every one after it). */
static void fix_cuts(const CoordinatorState *s, Plan *ret, int *assign) {
        for (unsigned k = 0; k < ret->n_clusters;) {
                PlanCluster *pc = &ret->clusters[k];
                if (fix_cut(s, pc->bounds, pc->n_stages)) {
                        k++;
                        continue;
                }
                log_warning("Coordinator: a cluster of the formation has a stage without parameters; its %u nodes "
                            "stay spares", pc->n_stages);
                for (unsigned st = 0; assign && st < pc->n_stages; st++)
                        assign[pc->nodes[st]] = -1;
                *pc = ret->clusters[--ret->n_clusters];
                for (unsigned st = 0; assign && k < ret->n_clusters && st < pc->n_stages; st++)
                        assign[pc->nodes[st]] = (int)k;
        }
}

#define REPAIR_MARGIN 0.05 /* a repaired plan may predict this much less than a new one */

/* The plan sent, repaired for the members joined now (plan-repair.h): 0
 * with ret, or -ESTALE when a plan formed from scratch (predicting
 * `fresh`) is better by more than REPAIR_MARGIN. */
static int repair(CoordinatorState *s, Member *const *m, const Capability *caps, unsigned n, uint64_t epoch,
                  double fresh, Plan *ret) {
        double sim = formation_similarity(&(FormationParams){});
        _cleanup_(freep) int *assign = malloc(n * sizeof *assign);
        PlanRepairStats st;
        if (!assign)
                return -ENOMEM;
        plan_start(s, epoch, m, n, ret);
        int r = plan_repair(&s->fm, s->plan, ret, caps, sim, assign, &st);
        if (r < 0)
                return r;
        fix_cuts(s, ret, assign);
        double fitness = formation_fitness(&s->fm, caps, (int)n, assign, sim, NULL);
        if (fitness < (1 - REPAIR_MARGIN) * fresh) {
                log_info("Coordinator: epoch %llu: formed anew: the plan repaired would train at %.1f (fitness), "
                         "one formed anew at %.1f, more than %.0f%% faster", (unsigned long long)epoch, fitness, fresh,
                         REPAIR_MARGIN * 100);
                return -ESTALE;
        }
        log_info("Coordinator: epoch %llu: plan repaired: %u clusters kept, %u cut again, %u filled with spares, %u "
                 "dissolved, %u formed of spares; fitness %.1f, %.1f formed anew", (unsigned long long)epoch, st.kept,
                 st.recut, st.filled, st.dissolved, st.formed, fitness, fresh);
        return plan_check(ret) < 0 ? -EINVAL : 0;
}

/* A plan for the members joined now: the one sent, repaired, when that is
 * nearly as good as one formed anew (fewer nodes move), else the new one. */
static int form(CoordinatorState *s, uint64_t epoch, Plan *ret) {
        Member *m[PLAN_MAX_NODES];
        Capability caps[PLAN_MAX_NODES];
        unsigned n = plan_members(s, m);
        Diag d = {};
        int r;

        if (n == 0)
                return -ENODATA;
        for (unsigned i = 0; i < n; i++)
                caps[i] = (Capability){ .gflops = m[i]->join.gflops, .memory = m[i]->join.memory,
                                        .bandwidth = m[i]->join.bandwidth, .latency = m[i]->join.latency };
        _cleanup_(formation_freep) Formation *f = NULL;
        r = formation_run(&s->fm, caps, (int)n, &(FormationParams){ .seed = epoch }, &f, &d);
        if (r < 0) {
                log_warning_errno(r, "Coordinator: no plan for %u members: %s", n, d.text);
                return r;
        }
        if (s->plan->epoch > 0 && repair(s, m, caps, n, epoch, f->fitness, ret) == 0)
                return 0;
        plan_start(s, epoch, m, n, ret);
        for (int k = 0; k < f->n_clusters && ret->n_clusters < PLAN_MAX_CLUSTERS; k++) {
                const FormationCluster *fc = &f->clusters[k];
                PlanCluster *pc = &ret->clusters[ret->n_clusters++];
                pc->n_stages = (unsigned)fc->n_nodes;
                memcpy(pc->bounds, fc->bounds, sizeof(int) * (size_t)(fc->n_nodes + 1));
                for (int st = 0; st < fc->n_nodes; st++)
                        pc->nodes[st] = (uint16_t)fc->nodes[st];
        }
        fix_cuts(s, ret, NULL);
        return plan_check(ret) < 0 ? -EINVAL : 0;
}

/* The cluster (-1: a spare) and stage of each node of p. */
static void plan_places(const Plan *p, int16_t cluster_of[PLAN_MAX_NODES], uint8_t stage_of[PLAN_MAX_NODES]) {
        for (unsigned i = 0; i < p->n_nodes; i++) {
                cluster_of[i] = -1;
                stage_of[i] = 0;
        }
        for (unsigned k = 0; k < p->n_clusters; k++)
                for (unsigned st = 0; st < p->clusters[k].n_stages; st++) {
                        cluster_of[p->clusters[k].nodes[st]] = (int16_t)k;
                        stage_of[p->clusters[k].nodes[st]] = (uint8_t)st;
                }
}

/* The layers [lo, hi) of a place in p; lo == hi for a spare. */
static void place_layers(const Plan *p, int cluster, int stage, int *lo, int *hi) {
        *lo = *hi = 0;
        if (cluster >= 0 && (unsigned)cluster < p->n_clusters) {
                *lo = p->clusters[cluster].bounds[stage];
                *hi = p->clusters[cluster].bounds[stage + 1];
        }
}

/* Each member's place in p, the plan about to be sent: its node index
 * was set when p was made of the members joined (plan_members()). */
static void place_members(CoordinatorState *s, const Plan *p) {
        int16_t cluster_of[PLAN_MAX_NODES];
        uint8_t stage_of[PLAN_MAX_NODES];
        plan_places(p, cluster_of, stage_of);
        for (unsigned i = 0; i < s->n_members; i++) {
                Member *m = member_at(s, i);
                bool in = m->joined && m->node >= 0 && (unsigned)m->node < p->n_nodes;
                m->cluster = in ? cluster_of[m->node] : -1;
                m->stage = in && m->cluster >= 0 ? stage_of[m->node] : 0;
        }
}

#define HANDOVER_COPIES 2 /* copies of a layer collected for the nodes that take it anew */

/* p, formed at the stop, against the plan sent: a member whose layers stay
 * the same keeps them; for each layer some node takes anew, the first
 * HANDOVER_COPIES members that held it hand theirs in. The rest of the
 * swarm sends nothing. False when the coordinator does not know who holds
 * what (it restarted since the plan was sent): then all hand in. */
static bool choose_donors(CoordinatorState *s, const Plan *p, unsigned *ret_donors, unsigned *ret_keep) {
        int16_t cluster_of[PLAN_MAX_NODES];
        uint8_t stage_of[PLAN_MAX_NODES], want[PLAN_MAX_LAYERS] = {};
        int lo, hi;

        if (s->plan->epoch == 0)
                return false;
        plan_places(p, cluster_of, stage_of);
        *ret_donors = *ret_keep = 0;
        for (unsigned i = 0; i < s->n_members; i++) {
                Member *m = member_at(s, i);
                int nlo = 0, nhi = 0;
                m->keeps = m->hand_in = false;
                if (!m->joined || m->node < 0 || (unsigned)m->node >= p->n_nodes)
                        continue;
                place_layers(p, cluster_of[m->node], stage_of[m->node], &nlo, &nhi);
                place_layers(s->plan, m->cluster, m->stage, &lo, &hi);
                m->keeps = nhi > nlo && lo == nlo && hi == nhi;
                *ret_keep += m->keeps;
                for (int l = nlo; l < nhi && !m->keeps; l++)
                        want[l] = HANDOVER_COPIES;
        }
        for (unsigned i = 0; i < s->n_members; i++) {
                Member *m = member_at(s, i);
                if (!m->joined)
                        continue;
                place_layers(s->plan, m->cluster, m->stage, &lo, &hi);
                for (int l = lo; l < hi; l++)
                        m->hand_in |= want[l] > 0 && has_params(s, l, l + 1);
                for (int l = lo; l < hi && m->hand_in; l++)
                        want[l] -= want[l] > 0;
                *ret_donors += m->hand_in;
        }
        return true;
}

/* The averaged layers of m's new stage, with their optimizer's moments
 * where they came: how many tensors went out. */
static unsigned hand_over(CoordinatorState *s, const Member *m, const Plan *p) {
        unsigned n = 0;
        if (m->cluster < 0 || (s->have_formed && m->keeps))
                return 0;
        const PlanCluster *pc = &p->clusters[m->cluster];
        for (unsigned part = 0; part < PLAN_PARTS; part++)
                for (int l = pc->bounds[m->stage]; l < pc->bounds[m->stage + 1]; l++) {
                        size_t len = s->layer_off[l + 1] - s->layer_off[l];
                        TensorDesc desc;
                        if (!len || !s->count[part][l] ||
                            tensor_desc_init(&desc, DTYPE_F32, 1, (uint32_t[]){ (uint32_t)len }) < 0)
                                continue;
                        if (net_send_tensor(s->net, m->peer, PLAN_STREAM(part, l), &desc,
                                            s->sum[part] + s->layer_off[l], 0) == 0) {
                                s->sends++;
                                n++;
                        }
                }
        return n;
}

#define LOG_CLUSTERS 32 /* clusters of a plan logged one per line; the rest counted */

static void log_plan(const Plan *p, const uint8_t *buf, int len, unsigned sent, unsigned layers, uint64_t t0) {
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
        for (unsigned k = 0; k < p->n_clusters && k < LOG_CLUSTERS; k++) {
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
        if (p->n_clusters > LOG_CLUSTERS)
                log_info("Coordinator: epoch %llu: and %u clusters more", (unsigned long long)p->epoch,
                         p->n_clusters - LOG_CLUSTERS);
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
        for (unsigned part = 0; with_layers && part < PLAN_PARTS; part++) /* the average of the copies */
                for (unsigned l = 0; l < p->n_layers; l++)
                        if (s->count[part][l] > 1)
                                for (size_t i = s->layer_off[l]; i < s->layer_off[l + 1]; i++)
                                        s->sum[part][i] /= (float)s->count[part][l];
        place_members(s, p);
        for (unsigned i = 0; i < s->n_members; i++) {
                Member *m = member_at(s, i);
                if (!m->joined)
                        continue;
                if (with_layers)
                        layers += hand_over(s, m, p);
                if (net_send_control(s->net, m->peer, FRAME_PLAN, buf, (size_t)len) == 0)
                        sent++;
        }
        log_plan(p, buf, len, sent, layers, t0);
        memcpy(s->plan, p, sizeof *p);
}

/* Every member stops at its next safe point for a new epoch. The plan is
 * formed now, so only members whose layers some node takes anew hand
 * theirs in; without one (too few members), all do. */
static void stop_members(CoordinatorState *s, uint64_t now) {
        const ConfigMembership *cm = &s->c->membership;
        unsigned donors = 0, keep = 0;
        s->epoch++;
        for (unsigned part = 0; part < PLAN_PARTS; part++)
                if (s->sum[part])
                        memset(s->sum[part], 0, s->n_params * sizeof(float));
        memset(s->count, 0, sizeof s->count);
        s->have_formed = form(s, s->epoch, s->formed) == 0 && choose_donors(s, s->formed, &donors, &keep);
        for (unsigned i = 0; i < s->n_members; i++) {
                Member *m = member_at(s, i);
                if (m->joined) {
                        uint8_t msg[PLAN_STOP_SIZE];
                        plan_stop_encode(s->epoch, !s->have_formed || m->hand_in, msg);
                        set_done(s, m, false);
                        m->samples = 0;
                        memset(m->handed, 0, sizeof m->handed);
                        net_send_control(s->net, m->peer, FRAME_CONTROL, msg, sizeof msg);
                }
        }
        s->phase = PHASE_COLLECTING;
        s->deadline_ns = now + (uint64_t)cm->handover_timeout_ms * 1000000ULL;
        if (s->have_formed)
                log_info("Coordinator: epoch %llu: members stop at a safe point; %u of %u hand in their layers (at "
                         "most %d copies of each layer a node takes anew), %u keep theirs",
                         (unsigned long long)s->epoch, donors, s->n_joined, HANDOVER_COPIES, keep);
        else
                log_info("Coordinator: epoch %llu: members stop at a safe point and hand in their layers",
                         (unsigned long long)s->epoch);
}

/* Membership changed and settled: a new epoch. The first plan goes out at
 * once; later ones after the members handed in their layers. */
static void tick_waiting(CoordinatorState *s, uint64_t now) {
        const ConfigMembership *cm = &s->c->membership;
        /* a plan sent, or members that trained on one (this coordinator restarted) */
        bool trained = s->plan->epoch > 0 || s->n_trained > 0;

        if (!s->dirty || s->n_probing || now - s->changed_ns < (uint64_t)cm->settle_ms * 1000000ULL ||
            s->n_joined < (s->plan->epoch ? 1 : cm->min_nodes))
                return;
        if (s->sends) /* the last hand-over still leaves from sum */
                return;
        if (trained && !s->pending) {
                s->dirty = false;
                return stop_members(s, now);
        }
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
        if (form(s, s->epoch + 1, p) == 0) {
                s->epoch++;
                publish(s, p, false);
        }
}

/* Layers coming in: once every member handed in (or the time is up), the
 * new plan, with the averaged layers. */
static void tick_collecting(CoordinatorState *s, uint64_t now) {
        bool all = s->n_done == s->n_joined;
        if (!all && now < s->deadline_ns)
                return;
        if (!all)
                log_warning("Coordinator: epoch %llu: not every member handed in its layers in time; going on "
                            "with what came", (unsigned long long)s->epoch);
        for (unsigned i = 0; i < s->n_members; i++) {
                const Member *m = member_at(s, i);
                if (m->joined)
                        s->samples += m->samples;
        }
        s->phase = PHASE_WAITING;
        if (s->have_formed) { /* members that came or went meanwhile make the next epoch */
                s->formed->samples = s->samples;
                publish(s, s->formed, true);
                s->have_formed = false;
                return;
        }
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

static void tick(CoordinatorState *s) {
        uint64_t now = now_ns();
        probe_answers(s);
        if (s->phase == PHASE_WAITING)
                tick_waiting(s, now);
        else
                tick_collecting(s, now);
}

/* The bytes its links moved since it last told the node's Control: its
 * own, which no run of the node counts (it trains on links of its own). */
static void tell_traffic(CoordinatorState *s) {
        NetStats ns;
        if (!s->control)
                return;
        net_get_stats(s->net, &ns);
        if (ns.bytes_sent == s->told_sent && ns.bytes_received == s->told_received)
                return;
        control_add_coordinator_bytes(s->control, ns.bytes_sent - s->told_sent, ns.bytes_received - s->told_received);
        s->told_sent = ns.bytes_sent;
        s->told_received = ns.bytes_received;
}

static void *coordinator_main(void *ud) {
        CoordinatorState *s = ud;
        uint64_t last_hb = now_ns();
        uint64_t every = (uint64_t)s->c->membership.heartbeat_ms * 1000000ULL;
        while (!s->stop) {
                net_run(s->net, 50);
                tick(s);
                __atomic_store_n(&s->shown_joined, s->n_joined, __ATOMIC_RELAXED);
                tell_traffic(s);
                if (now_ns() - last_hb >= every) { /* members see their coordinator alive */
                        last_hb = now_ns();
                        net_broadcast_control(s->net, FRAME_HEARTBEAT, NULL, 0);
                }
        }
        tell_traffic(s);
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
        s->formed = plan_free(s->formed);
        for (unsigned part = 0; part < PLAN_PARTS; part++)
                free(s->sum[part]);
        identity_clear(&s->id);
        free(s);
        return NULL;
}

int coordinator_start(Coordinator *co, const Config *c, const Job *job, const Identity *id, Control *control) {
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
        if (!(s->plan = plan_new()) || !(s->formed = plan_new()))
                return log_error_errno(-ENOMEM, "Out of memory"), state_free(s), -ENOMEM;
        s->c = c;
        s->job = job;
        s->id = *id;
        s->control = control;
        for (unsigned i = 0; i < MAX_LINKS; i++) /* slot 0 taken first */
                s->free_slots[s->n_free++] = (uint16_t)(MAX_LINKS - 1 - i);
        for (int l = 0; l < job->model.n_layers; l++)
                s->layer_off[l + 1] = s->layer_off[l] + model_spec_params(&job->model, l, l + 1);
        s->n_params = s->layer_off[job->model.n_layers];
        if ((r = averaging_model(&job->model, &s->model)) < 0)
                return log_error_errno(r, "The job's model does not check"), state_free(s), r;
        PartitionParams pp = { .micro_batch = c->pipeline.micro_batch, .in_flight = c->pipeline.staleness,
                               .optim_floats = (int)optim_state_floats(job->optim.kind, 1),
                               .stashed = c->pipeline.staleness };
        if ((r = formation_model_init(&job->model, &pp, &s->fm, &d)) < 0) {
                state_free(s);
                return log_error_errno(r, "Coordinator: %s: %s", job->name, d.text);
        }
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
        nc.max_links = MAX_LINKS; /* whatever net.max_links says for the node's other links */
        /* the layers handed in: one copy at a time per link, the rest malloc()ed */
        nc.pool_bytes = MIN(s->n_params * sizeof(float) + (1u << 20), (size_t)1 << 30);
        nc.max_receive_bytes = MAX(nc.max_receive_bytes, (uint64_t)nc.pool_bytes);
        if ((r = net_new(&nc, &callbacks, s, &s->net)) < 0) {
                state_free(s);
                return log_error_errno(r, "Coordinator: failed to start its transport: %m");
        }
        if ((r = node_listen(s->net, cm->coordinator.address.host, cm->coordinator.address.port, &port)) < 0) {
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

unsigned coordinator_members(const Coordinator *co) {
        return co->running ? __atomic_load_n(&co->state->shown_joined, __ATOMIC_RELAXED) : 0;
}

void coordinator_stop(Coordinator *co) {
        if (!co->running)
                return;
        co->state->stop = true;
        pthread_join(co->thread, NULL);
        co->state = state_free(co->state);
        co->running = false;
}
