/* run/membership.c — join the coordinator, hold the newest signed plan,
 * run this node's part of it (see membership.h). */
#include "membership.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/capability.h"
#include "averaging.h"
#include "cluster/plan.h"
#include "control.h"
#include "node.h"
#include "pipeline-run.h"
#include "stage-checkpoint.h"
#include "tensor/tensor.h"
#include "util/log.h"
#include "util/time-util.h"

/* Until links measure them: what the formation assumes of a node's link. */
#define DEFAULT_BANDWIDTH 125e6 /* bytes/s: 1 Gbit/s */
#define DEFAULT_LATENCY 5e-4    /* s */

typedef struct Membership {
        const Config *c;
        const Job *job;
        const Identity *id;
        const LocalRunOptions *o;
        const volatile sig_atomic_t *stop;
        Net *net;
        NetConfig links_net;      /* the transport of a stage's links and rings, from the file */
        int64_t coord;            /* the link to the coordinator, -1 without */
        bool dial_pending;
        uint32_t dialing;
        uint64_t next_dial_ns, last_heartbeat_ns;
        PlanJoin join;            /* what this node measured; bandwidth and latency refreshed */
        double sent_bandwidth, sent_latency; /* as the coordinator last heard them */
        uint64_t sent_link_ns;    /* ... when, in a refresh (0: none since the JOIN) */
        LinkFigures links;        /* the stage's pipeline links, as pipeline_run() measured them */
        uint64_t stage_ns;        /* ... since the stage started (its links came up after) */
        LinkLatency latency;      /* join.latency, kept across reconnections (link_latency_update()) */
        Plan *plan;               /* held; epoch 0 before the first */
        Plan *next;               /* received, newer, not yet taken */
        Plan *scratch;            /* a plan being checked */
        char next_sig[9];         /* its signature's first bytes, to tell plans apart in the log */
        bool have_next;
        uint64_t stop_epoch;      /* the coordinator asked to stop for this epoch */
        bool stop_hand_in;        /* ... and for this stage's layers (else it keeps them) */
        bool training;            /* inside pipeline_run() */
        volatile sig_atomic_t restart; /* pipeline_run()'s stop flag */
        bool finished;
        size_t layer_off[PLAN_MAX_LAYERS + 1];
        float *model;             /* the whole model, by layer offsets: what the stage trains from and hands in */
        StageCarry carry;         /* the layers of model this node trained last, and their optimizer's state */
        bool carry_checkpointed;  /* ... read from its checkpoint at start: older than any handed over */
        /* layers handed over for stop_epoch, by part (PLAN_STREAM()): the
         * parameters, then the optimizer's moments (allocated when the
         * first comes); the epoch each part of each layer came for */
        float *incoming[PLAN_PARTS];
        uint64_t got[PLAN_PARTS][PLAN_MAX_LAYERS];
        uint64_t sends;           /* layers handed in, not yet sent */
        uint64_t joined_ns;
        Net *reach;               /* answers the coordinator's dial-back until a stage listens */
        int reach_error;          /* what the dial-back found: 0 or a positive errno */
        bool reach_known;
} Membership;

/* A link's round trips count in the latency once it has been up this
 * long: its handshake, and the first heartbeats smoothed in with it. */
#define LINK_SETTLE_NS (5 * NSEC_PER_SEC)

/* This node's links as the kernel measured them on their real traffic
 * (TCP_INFO): the link to the coordinator, and those of the stage it runs
 * (m->links). The one-way latency is half the smoothed round trip, the
 * largest over the links up for LINK_SETTLE_NS; a link that came back
 * since does not replace what settled links measured before it
 * (link_latency_update()). The bandwidth is the smallest delivery rate of
 * the latest transfers where the sender was not holding back. While only
 * app-limited rates are known (the sender had too little to send for the
 * rate to show the path), they can only raise it. Until anything is
 * measured the JOIN carries the defaults. True when a figure moved by more
 * than a tenth since it was last sent. */
static bool measure_link(Membership *m) {
        double rtt, rate, bw = 0, floor = 0;
        bool app_limited;
        uint64_t now = now_ns();
        if (m->coord < 0 || net_peer_link_info(m->net, (uint32_t)m->coord, &rtt, &rate, &app_limited) < 0)
                return false;
        if (rate > 0 && !app_limited)
                bw = rate;
        else
                floor = rate;
        if (m->links.bandwidth > 0)
                bw = bw > 0 ? MIN(bw, m->links.bandwidth) : m->links.bandwidth;
        LinkLatencySample lat[2] = { { .latency = rtt / 2, .up_ns = now - m->joined_ns } };
        if (m->training) /* the stage's links, up since it started at most */
                lat[1] = (LinkLatencySample){ .latency = m->links.latency, .up_ns = now - m->stage_ns };
        link_latency_update(&m->latency, lat, 2, LINK_SETTLE_NS);
        if (m->latency.latency > 0)
                m->join.latency = MIN(m->latency.latency, 60.0);
        m->join.bandwidth = MIN(bw > 0 ? bw : MAX(m->join.bandwidth, floor), 1e13);
        return fabs(m->join.bandwidth - m->sent_bandwidth) > 0.1 * m->sent_bandwidth ||
               fabs(m->join.latency - m->sent_latency) > 0.1 * m->sent_latency;
}

#define LINK_REFRESH_NS (10 * NSEC_PER_SEC)

static void figures_sent(Membership *m) {
        m->sent_bandwidth = m->join.bandwidth;
        m->sent_latency = m->join.latency;
}

/* The first refresh after the JOIN goes as soon as the figures move (a
 * first JOIN had only the handshake's round trips); later ones at most
 * every LINK_REFRESH_NS. */
static void send_link(Membership *m) {
        uint8_t buf[PLAN_LINK_SIZE];
        plan_link_encode(m->join.bandwidth, m->join.latency, buf);
        if (net_send_control(m->net, (uint32_t)m->coord, FRAME_CONTROL, buf, sizeof buf) == 0) {
                figures_sent(m);
                m->sent_link_ns = now_ns();
        }
}

static void send_join(Membership *m) {
        uint8_t buf[PLAN_JOIN_MAX_SIZE];
        /* layers from a checkpoint and no plan yet: as one that trained on
         * a plan, so that a coordinator that restarted too asks for them */
        m->join.epoch = m->plan->epoch ? m->plan->epoch : m->carry_checkpointed;
        measure_link(m); /* the handshake's round trips, at least */
        int n = plan_join_encode(&m->join, buf, sizeof buf);
        if (n < 0)
                log_error_errno(n, "Cannot tell the coordinator this node's figures (epoch %llu): %m",
                                (unsigned long long)m->join.epoch);
        if (n > 0 && net_send_control(m->net, (uint32_t)m->coord, FRAME_CONTROL, buf, (size_t)n) == 0) {
                figures_sent(m);
                m->sent_link_ns = 0;
        }
}

static void on_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        Membership *m = ud;
        if (memcmp(id, m->c->membership.coordinator.id, IDENTITY_PK_SIZE) != 0 || m->coord >= 0) {
                net_close_peer(m->net, peer);
                return;
        }
        m->coord = peer;
        m->dial_pending = false;
        m->joined_ns = now_ns();
        send_join(m);
        log_info("Joined the coordinator at %s:%u%s", m->c->membership.coordinator.address.host,
                 m->c->membership.coordinator.address.port, m->plan->epoch ? " again" : "");
}

static void on_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        Membership *m = ud;
        if (m->dial_pending && peer == m->dialing)
                m->dial_pending = false;
        if ((int64_t)peer != m->coord)
                return;
        m->coord = -1;
        char why[128];
        NetPeerInfo info = {};
        (void)net_peer_describe(m->net, peer, &info);
        if (reason == 0)
                snprintf(why, sizeof why, "it said goodbye");
        else
                node_close_reason(reason, &info, why, sizeof why);
        if (!*m->stop)
                log_warning("Lost the coordinator (%s): %s", why,
                            m->plan->epoch ? "training goes on with the plan held; changes wait for it" :
                                             "dialling again");
}

static void hand_in(Membership *m, int lo, int hi, uint64_t samples);

static void send_done(Membership *m, uint64_t samples) {
        uint8_t msg[PLAN_DONE_SIZE];
        plan_done_encode(m->stop_epoch, samples, msg);
        if (m->coord >= 0)
                net_send_control(m->net, (uint32_t)m->coord, FRAME_CONTROL, msg, sizeof msg);
}

static void on_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Membership *m = ud;
        uint64_t epoch;
        bool asks_layers;
        int r;

        if ((int64_t)peer != m->coord)
                return;
        if (type == FRAME_PLAN) {
                r = plan_decode(p, len, m->c->membership.coordinator.id, m->scratch);
                if (r < 0) {
                        log_warning_errno(r, "Dropped the coordinator's link: a plan that does not check (%m)");
                        net_close_peer(m->net, peer);
                        return;
                }
                uint64_t held = m->have_next ? m->next->epoch : m->plan->epoch;
                if (m->scratch->epoch <= held) { /* never back to an older plan */
                        log_warning("Ignored plan epoch %llu: this node holds epoch %llu already",
                                    (unsigned long long)m->scratch->epoch, (unsigned long long)held);
                        return;
                }
                if (m->scratch->n_layers != (unsigned)m->job->model.n_layers) {
                        log_warning("Ignored plan epoch %llu: %u layers, job %s has %d",
                                    (unsigned long long)m->scratch->epoch, m->scratch->n_layers, m->job->name,
                                    m->job->model.n_layers);
                        return;
                }
                Plan *t = m->next;
                m->next = m->scratch;
                m->scratch = t;
                for (int i = 0; i < 4; i++)
                        snprintf(m->next_sig + 2 * i, 3, "%02x", p[len - PLAN_SIG_SIZE + (size_t)i]);
                m->have_next = true;
                m->restart = 1; /* a stage of an older plan stops */
                return;
        }
        if (type == FRAME_CONTROL && plan_stop_decode(p, len, &epoch, &asks_layers) == 0) {
                if (epoch <= m->plan->epoch || epoch <= m->stop_epoch)
                        return;
                m->stop_epoch = epoch;
                m->stop_hand_in = asks_layers;
                if (m->training) {
                        log_info("The coordinator asks for epoch %llu: stopping at the next safe point",
                                 (unsigned long long)epoch);
                        m->restart = 1;
                } else if (m->carry.hi > m->carry.lo) /* not training, but holding layers: a checkpoint's */
                        hand_in(m, m->carry.lo, m->carry.hi, 0);
                else
                        send_done(m, 0);
                return;
        }
        if (type == FRAME_CONTROL && plan_reach_decode(p, len, &r) == 0) {
                m->reach_known = true;
                m->reach_error = r;
                m->reach = net_free(m->reach);
                if (r == 0)
                        log_info("The coordinator dialed this node back at %s:%u: it accepts connections",
                                 m->join.host, m->join.pipeline_port);
                else {
                        log_warning("The coordinator could not dial this node back at %s:%u (%s): it accepts no "
                                    "connections and dials every link itself, as behind NAT",
                                    m->join.host, m->join.pipeline_port, strerror(r));
                        m->join.pipeline_port = m->join.averaging_port = 0; /* and joins so from now on */
                }
                return;
        }
        if (type == FRAME_CONTROL) {
                log_warning("Dropped the coordinator's link: a message this node does not take");
                net_close_peer(m->net, peer);
        }
}

/* The optimizer's moments a layer hands over with it: SGD's momentum,
 * AdamW's m and v (AccumAdam's gradients summed so far stay behind). */
static unsigned job_moments(const Job *job) {
        return MIN(optim_moments(job->optim.kind), (unsigned)PLAN_MAX_MOMENTS);
}

/* Layers of the new stage: only from the coordinator, only after it asked
 * for a new epoch, one float32 vector of exactly that layer's size. */
static void on_tensor(void *ud, NetTensor *t) {
        Membership *m = ud;
        uint32_t l = t->stream % PLAN_MAX_LAYERS, part = t->stream / PLAN_MAX_LAYERS, peer = t->peer;
        bool ok = (int64_t)peer == m->coord && m->stop_epoch > m->plan->epoch && !m->training &&
                  part <= job_moments(m->job) && l < (uint32_t)m->job->model.n_layers &&
                  t->desc.dtype == DTYPE_F32 && t->desc.ndim == 1 && t->desc.dims[0] > 0 &&
                  t->desc.dims[0] == m->layer_off[l + 1] - m->layer_off[l];
        const float *v = (const float *)t->data;
        if (ok && part == 0) /* the layer's parameters */
                ok = tensor_finite(v, t->desc.dims[0]);
        else if (ok) /* one of its moments */
                ok = optim_moment_valid(m->job->optim.kind, part - 1, v, t->desc.dims[0]);
        if (ok && !m->incoming[part])
                m->incoming[part] = calloc(m->layer_off[m->job->model.n_layers], sizeof(float));
        if (ok && m->incoming[part]) {
                memcpy(m->incoming[part] + m->layer_off[l], t->data, t->desc.bytes);
                m->got[part][l] = m->stop_epoch;
        }
        net_tensor_release(m->net, t);
        if (!ok) {
                log_warning("Dropped a link: it sent a tensor that is not a layer handed over by the coordinator");
                net_close_peer(m->net, peer);
        }
}

static void on_sent(void *ud, uint32_t peer, uint64_t cookie) {
        Membership *m = ud;
        if (m->sends)
                m->sends--;
}

static const NetCallbacks callbacks = {
        .connected = on_connected,
        .closed = on_closed,
        .control = on_control,
        .tensor = on_tensor,
        .sent = on_sent,
};

/* Dial, heartbeat, serve the link for up to timeout_ms. */
static void serve(Membership *m, int timeout_ms) {
        const ConfigMembership *cm = &m->c->membership;
        uint64_t now = now_ns();
        if (m->coord < 0 && !m->dial_pending && now >= m->next_dial_ns) {
                m->next_dial_ns = now + NSEC_PER_SEC;
                if (net_connect(m->net, cm->coordinator.address.host, cm->coordinator.address.port, &m->dialing) == 0)
                        m->dial_pending = true;
        }
        if (m->coord >= 0 && now - m->last_heartbeat_ns >= (uint64_t)cm->heartbeat_ms * 1000000ULL) {
                m->last_heartbeat_ns = now;
                net_send_control(m->net, (uint32_t)m->coord, FRAME_HEARTBEAT, NULL, 0);
                /* refreshed while running (the next plan uses them), then
                 * at most every LINK_REFRESH_NS: a round trip under load
                 * moves by a tenth from one heartbeat to the next */
                if ((!m->sent_link_ns || now - m->sent_link_ns >= LINK_REFRESH_NS) && measure_link(m))
                        send_link(m);
        }
        if (m->reach)
                net_run(m->reach, 0);
        net_run(m->net, timeout_ms);
}

/* pipeline_run()'s poll: the daemon's own, then the coordinator's link. */
static void poll_member(void *ud) {
        Membership *m = ud;
        if (m->o->poll)
                m->o->poll(m->o->poll_userdata);
        serve(m, 0);
}

/* The coordinator's plan as a stage's inputs: its clusters, their nodes
 * and cuts, and the averaging members, with this node's own settings from
 * ravnestd.conf (neighbour timeout, averaging cadence and timeouts). */
typedef struct PlanInputs {
        ConfigPipeline pipeline;
        ConfigAveraging averaging;
} PlanInputs;

static void plan_inputs_done(PlanInputs *in) {
        in->pipeline.clusters = config_clusters_free(in->pipeline.clusters, in->pipeline.n_clusters);
        in->averaging.members = mfree(in->averaging.members);
}

static int plan_inputs(const Membership *m, const Plan *p, PlanInputs *ret) {
        PlanInputs in = { .pipeline = m->c->pipeline, .averaging = m->c->averaging };
        unsigned n = 0;

        in.pipeline.clusters = calloc(p->n_clusters, sizeof *in.pipeline.clusters);
        in.pipeline.n_clusters = in.pipeline.clusters ? p->n_clusters : 0;
        in.averaging.members = calloc(p->n_nodes, sizeof *in.averaging.members);
        if (!in.pipeline.clusters || !in.averaging.members) {
                plan_inputs_done(&in);
                return -ENOMEM;
        }
        for (unsigned k = 0; k < p->n_clusters; k++) {
                ConfigCluster *cl = &in.pipeline.clusters[k];
                cl->nodes = calloc(p->clusters[k].n_stages, sizeof *cl->nodes);
                if (!cl->nodes) {
                        plan_inputs_done(&in);
                        return -ENOMEM;
                }
                cl->n_stages = p->clusters[k].n_stages;
                for (unsigned s = 0; s < cl->n_stages; s++) {
                        const PlanNode *pn = &p->nodes[p->clusters[k].nodes[s]];
                        memcpy(cl->nodes[s].id, pn->key, IDENTITY_PK_SIZE);
                        snprintf(cl->nodes[s].address.host, sizeof cl->nodes[s].address.host, "%s", pn->host);
                        cl->nodes[s].address.port = pn->pipeline_port;
                        cl->nodes[s].no_accept = pn->pipeline_port == 0; /* behind NAT: it dials */
                        cl->bounds[s] = p->clusters[k].bounds[s];
                        ConfigMember *am = &in.averaging.members[n++];
                        memcpy(am->id, pn->key, IDENTITY_PK_SIZE);
                        snprintf(am->address.host, sizeof am->address.host, "%s", pn->host);
                        am->address.port = pn->averaging_port;
                        am->no_accept = pn->averaging_port == 0;
                }
                cl->bounds[cl->n_stages] = p->clusters[k].bounds[cl->n_stages];
        }
        in.pipeline.enabled = true;
        in.pipeline.micro_batch = (int)p->micro_batch;
        in.pipeline.staleness = (int)p->staleness;
        in.pipeline.update_frequency = (int)p->update_frequency;
        in.pipeline.synchronous = p->synchronous;
        in.averaging.n_members = n;
        in.averaging.enabled = p->n_clusters > 1; /* one cluster has nothing to average with */
        *ret = in;
        return 0;
}

/* Part `part` of layer l (PLAN_STREAM()) of the stage [lo, hi) this node
 * trained last: its parameters, or a moment of its optimizer's state when
 * that state is kept; NULL when not. */
static const float *own_part(const Membership *m, unsigned part, int lo, int hi, int l) {
        const StageCarry *c = &m->carry;
        if (part == 0)
                return m->model + m->layer_off[l];
        if (!c->optim || c->lo != lo || c->hi != hi)
                return NULL;
        return c->optim + (part - 1) * c->n + (m->layer_off[l] - m->layer_off[lo]);
}

/* Hand in the layers this stage held, when asked, with the optimizer's
 * moments, then say so. */
static void hand_in(Membership *m, int lo, int hi, uint64_t samples) {
        unsigned n = 0;
        if (!m->stop_hand_in) {
                send_done(m, samples);
                log_info("Stopped for epoch %llu, keeping layers %d-%d (the coordinator does not need them)",
                         (unsigned long long)m->stop_epoch, lo, hi - 1);
                return;
        }
        for (unsigned part = 0; part <= job_moments(m->job); part++)
                for (int l = lo; l < hi && m->coord >= 0; l++) {
                        size_t len = m->layer_off[l + 1] - m->layer_off[l];
                        const float *v = own_part(m, part, lo, hi, l);
                        TensorDesc desc;
                        if (!len || !v || tensor_desc_init(&desc, DTYPE_F32, 1, (uint32_t[]){ (uint32_t)len }) < 0)
                                continue;
                        if (net_send_tensor(m->net, (uint32_t)m->coord, PLAN_STREAM(part, l), &desc, v, 0) == 0) {
                                m->sends++;
                                n++;
                        }
                }
        send_done(m, samples);
        log_info("Handed in layers %d-%d (%u tensors, %s the optimizer's state) for epoch %llu", lo, hi - 1, n,
                 job_moments(m->job) && own_part(m, 1, lo, hi, lo) ? "with" : "without",
                 (unsigned long long)m->stop_epoch);
}

/* The dial-back's link: the coordinator's key alone, which only looks. */
static void on_reach_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        Membership *m = ud;
        if (memcmp(id, m->c->membership.coordinator.id, IDENTITY_PK_SIZE) != 0)
                net_close_peer(m->reach, peer);
}

/* Until the coordinator has dialed this node back, something must answer
 * on its pipeline port: a transport of its own that admits the coordinator
 * alone. Its socket closes at once when freed (epoll), so a stage can
 * listen there next. */
static void reach_listen(Membership *m) {
        static const NetCallbacks cb = { .connected = on_reach_connected };
        const ConfigAddress *a = &m->c->pipeline.listen;
        NetConfig nc = m->links_net;
        nc.backend = NET_BACKEND_EPOLL;
        nc.pool_bytes = 64u << 10;
        nc.max_links = 4;
        nc.relay_host = NULL;
        nc.relay_wait = false;
        int r = net_new(&nc, &cb, m, &m->reach);
        if (r >= 0)
                r = node_listen(m->reach, a->host, a->port, NULL);
        if (r < 0) {
                log_warning_errno(r, "Failed to listen on %s:%u for the coordinator's dial-back (%m): it will take "
                                  "this node for one behind NAT", a->host, a->port);
                m->reach = net_free(m->reach);
        }
}

/* Run this node's stage of m->plan until training ends or a new epoch. */
static int run_stage(Membership *m, unsigned cluster, unsigned stage, bool handed_over) {
        const PlanCluster *pc = &m->plan->clusters[cluster];
        int lo = pc->bounds[stage], hi = pc->bounds[stage + 1];
        LocalRunOptions o = *m->o;
        o.links = &m->links;
        uint64_t samples = 0;
        PlanInputs in;
        int r;

        if ((r = plan_inputs(m, m->plan, &in)) < 0)
                return log_error_errno(r, "Out of memory");
        StagePlan plan = { .source = "the coordinator's plan", .pipeline = &in.pipeline,
                           .averaging = { .settings = &in.averaging, .net = &m->links_net,
                                          .source = "the coordinator's plan", .model = &m->job->model } };
        o.poll = poll_member;
        o.poll_userdata = m;
        /* written as anywhere, by layer range; read at start (carry_checkpoint()) */
        o.load_checkpoint = false;
        o.retire_checkpoints = true;
        o.model_params = m->model;
        o.load_model_params = handed_over;
        o.carry = &m->carry;
        o.resume_samples = m->plan->samples;
        o.ret_samples = &samples;
        o.quiesce = &m->restart;
        o.reach_checked = m->reach_known;
        o.reach_error = m->reach_error;
        m->reach = net_free(m->reach); /* the stage listens on the port now */
        m->links.latency = 0; /* its links are new: their round trips are measured anew */
        m->stage_ns = now_ns();
        m->restart = m->stop_epoch > m->plan->epoch || m->have_next; /* asked already: start, hand in */
        m->carry_checkpointed = false; /* the stage saves its own carry */
        m->training = true;
        r = pipeline_run(&plan, m->job, m->id, &o, m->stop);
        m->training = false;
        plan_inputs_done(&in);
        if (r == 0) {
                m->finished = true;
                if (o.control) /* as a finished node shows it: no samples/s, not busy */
                        control_set_state(o.control, NODE_FINISHED);
                log_info("Training is over (plan epoch %llu); serving the coordinator until stopped",
                         (unsigned long long)m->plan->epoch);
                return 0;
        }
        if (*m->stop)
                return 0;
        if (r != -ECANCELED)
                log_warning_errno(r, "Stage %u of cluster %u ended (%m); waiting for the next plan", stage + 1,
                                  cluster + 1);
        if (m->stop_epoch > m->plan->epoch)
                hand_in(m, lo, hi, samples);
        return 0;
}

/* The optimizer's moments handed over with the layers [lo, hi), as the
 * state the stage goes on with; false when any is missing. */
static bool take_moments(Membership *m, int lo, int hi) {
        unsigned moments = job_moments(m->job);
        size_t n = m->layer_off[hi] - m->layer_off[lo];
        if (!moments)
                return false;
        for (unsigned part = 1; part <= moments; part++)
                for (int l = lo; l < hi; l++)
                        if (m->layer_off[l + 1] > m->layer_off[l] && m->got[part][l] != m->plan->epoch)
                                return false;
        stage_carry_clear(&m->carry);
        m->carry.optim = calloc(MAX(optim_state_floats(m->job->optim.kind, n), (size_t)1), sizeof(float));
        if (!m->carry.optim)
                return false;
        for (unsigned part = 1; part <= moments; part++)
                memcpy(m->carry.optim + (part - 1) * n, m->incoming[part] + m->layer_off[lo], n * sizeof(float));
        m->carry.lo = lo;
        m->carry.hi = hi;
        m->carry.n = n;
        m->carry.t = STAGE_CARRY_T_SWARM;
        return true;
}

/* The layers of this node's newest checkpoint, with their optimizer's
 * state, as the layers it trained last: what it hands in when asked (a
 * coordinator that restarted asks everyone), and what it goes on from when
 * a plan gives it the same range and nobody hands it newer ones. */
static void carry_checkpoint(Membership *m) {
        const char *dir = m->o->checkpoint_dir;
        StageCarry *c = &m->carry;
        Layer layers[MODEL_MAX_LAYERS];
        CheckpointInfo at;
        int lo, hi;

        if (!dir || !m->o->load_checkpoint || stage_checkpoint_newest(dir, m->job->name, &lo, &hi) < 0 ||
            lo < 0 || lo >= hi || hi > m->job->model.n_layers || model_spec_check(&m->job->model, layers, NULL) < 0)
                return;
        size_t n = m->layer_off[hi] - m->layer_off[lo], n_state = optim_state_floats(m->job->optim.kind, n);
        float *optim = calloc(MAX(n_state, (size_t)1), sizeof(float));
        /* the file is checked whole before anything is written: on failure the model is as it was */
        if (!optim || stage_checkpoint_load_layers(dir, m->job->name, layers + lo, lo, hi,
                                                   m->model + m->layer_off[lo], n,
                                                   (uint32_t)m->job->optim.kind, optim, n_state, &at) < 0) {
                free(optim);
                return;
        }
        *c = (StageCarry){ .lo = lo, .hi = hi, .n = n, .t = at.optim_t, .optim = optim };
        m->carry_checkpointed = true;
        log_info("Holds layers %d-%d from its checkpoint, with their optimizer's state (%llu steps)", lo, hi - 1,
                 (unsigned long long)at.optim_t);
}

/* Take the newest plan received: the handed-over layers of this node's
 * stage, then the stage. */
static int take_plan(Membership *m) {
        Plan *t = m->plan;
        unsigned cluster, stage;
        int index;

        m->plan = m->next;
        m->next = t;
        m->have_next = false;
        if (m->o->control)
                control_report_plan(m->o->control, m->plan->epoch);
        bool handed_over = false;
        if (plan_find(m->plan, m->id->pk, &index, &cluster, &stage) < 0) {
                stage_carry_clear(&m->carry); /* what it trained grows old */
                if (m->o->checkpoint_dir) /* and so do its checkpoints: others hold their layers now */
                        (void)stage_checkpoint_retire(m->o->checkpoint_dir, m->job->name, -1, -1);
                log_info("Holds plan epoch %llu (signature %s…): a spare (%u nodes, %u clusters)",
                         (unsigned long long)m->plan->epoch, m->next_sig, m->plan->n_nodes, m->plan->n_clusters);
                return 0;
        }
        const PlanCluster *pc = &m->plan->clusters[cluster];
        int lo = pc->bounds[stage], hi = pc->bounds[stage + 1], missing = 0, got = 0;
        for (int l = lo; l < hi; l++) {
                if (m->layer_off[l + 1] == m->layer_off[l])
                        continue;
                if (m->got[0][l] == m->plan->epoch) {
                        memcpy(m->model + m->layer_off[l], m->incoming[0] + m->layer_off[l],
                               (m->layer_off[l + 1] - m->layer_off[l]) * sizeof(float));
                        got++;
                } else
                        missing++;
        }
        /* all or nothing: a stage of layers from one model (a swarm that
         * restarted whole hands over from checkpoints, with no samples
         * counted yet); else its own when it trained these layers last
         * (the coordinator kept them) */
        handed_over = missing == 0 && (got > 0 || m->plan->samples > 0);
        bool same = m->carry.hi > m->carry.lo && lo == m->carry.lo && hi == m->carry.hi &&
                    !(handed_over && m->carry_checkpointed); /* layers handed over are newer */
        bool own = !handed_over && same;
        /* the optimizer's state: theirs with the layers handed over (even
         * to a node that held the same: it was away, and its moments are
         * stale against their parameters), else its own when its layers stay */
        bool moments = handed_over && take_moments(m, lo, hi);
        log_info("Holds plan epoch %llu (signature %s…): cluster %u of %u, stage %u of %u, layers %d-%d, %s%s",
                 (unsigned long long)m->plan->epoch, m->next_sig, cluster + 1, m->plan->n_clusters, stage + 1,
                 pc->n_stages, lo, hi - 1,
                 handed_over ? "starting from the layers handed over" :
                 own         ? "going on from its own layers" :
                 m->plan->samples ? "layers missing from the hand-over: starting from the job's initialization" :
                                    "starting from the job's initialization",
                 moments ? ", with their optimizer's state" : "");
        if (m->plan->micro_batch != (unsigned)m->c->pipeline.micro_batch)
                log_notice("The swarm trains in micro-batches of %u, the size most members asked for, not this "
                           "node's pipeline.micro_batch of %d", m->plan->micro_batch, m->c->pipeline.micro_batch);
        if (m->finished) {
                log_info("Training is over here: plan epoch %llu not run", (unsigned long long)m->plan->epoch);
                return 0;
        }
        return run_stage(m, cluster, stage, handed_over || own);
}

static void member_done(Membership *m) {
        m->net = net_free(m->net);
        m->plan = plan_free(m->plan);
        m->next = plan_free(m->next);
        m->scratch = plan_free(m->scratch);
        m->model = mfree(m->model);
        m->reach = net_free(m->reach);
        for (unsigned part = 0; part < PLAN_PARTS; part++)
                m->incoming[part] = mfree(m->incoming[part]);
        stage_carry_clear(&m->carry);
}

int membership_run(const Config *c, const Job *job, const Identity *id, const LocalRunOptions *o,
                   const volatile sig_atomic_t *stop) {
        const ConfigMembership *cm = &c->membership;
        _cleanup_(member_done) Membership m = { .c = c, .job = job, .id = id, .o = o, .stop = stop, .coord = -1 };
        NetConfig nc;
        Diag d = {};
        int r;

        /* (a wildcard listen address, which the others could not dial, is
         * refused by config_load()) */
        for (int l = 0; l < job->model.n_layers; l++)
                m.layer_off[l + 1] = m.layer_off[l] + model_spec_params(&job->model, l, l + 1);
        size_t n_params = m.layer_off[job->model.n_layers];
        m.plan = plan_new();
        m.next = plan_new();
        m.scratch = plan_new();
        m.model = calloc(n_params, sizeof(float));
        m.incoming[0] = calloc(n_params, sizeof(float));
        if (!m.plan || !m.next || !m.scratch || !m.model || !m.incoming[0])
                return log_error_errno(-ENOMEM, "Out of memory");

        /* what this node can give, measured */
        m.join = (PlanJoin){ .bandwidth = DEFAULT_BANDWIDTH, .latency = DEFAULT_LATENCY,
                             .n_layers = (unsigned)job->model.n_layers, .n_params = n_params,
                             .micro_batch = (unsigned)c->pipeline.micro_batch,
                             .pipeline_port = cm->behind_nat ? 0 : c->pipeline.listen.port,
                             .averaging_port = cm->behind_nat ? 0 : c->averaging.listen.port };
        snprintf(m.join.host, sizeof m.join.host, "%s", c->pipeline.listen.host);
        CollModel ours;
        if ((r = averaging_model(&job->model, &ours)) < 0)
                return log_error_errno(r, "The job's model does not check");
        memcpy(m.join.model, ours.digest, sizeof m.join.model);
        if ((r = capability_memory(cm->memory, NULL, &m.join.memory)) < 0)
                return log_error_errno(r, "Failed to read the memory available: %m");
        if ((r = capability_probe_gflops(cm->probe_ms / 1000.0, &m.join.gflops)) < 0)
                return log_error_errno(r, "Failed to measure the compute speed: %m");
        log_info("Capabilities: %.1f GFLOP/s (sgemm, one thread), %.0f MiB to give%s", m.join.gflops,
                 (double)m.join.memory / (1 << 20), cm->memory ? " (membership.memory)" : "");

        if ((r = config_net(c, id, &nc, &d)) < 0)
                return log_error_errno(r, "Invalid configuration: %s", d.text);
        m.links_net = nc; /* a stage's links, as the file says */
        nc.idle_timeout_ms = cm->deadline_ms; /* the coordinator heartbeats */
        nc.pool_bytes = MIN(n_params * sizeof(float) + (1u << 20), (size_t)1 << 30); /* a stage's layers */
        nc.max_receive_bytes = MAX(nc.max_receive_bytes, (uint64_t)nc.pool_bytes);
        if ((r = net_new(&nc, &callbacks, &m, &m.net)) < 0)
                return log_error_errno(r, "Failed to start the membership transport: %m");
        if (m.join.pipeline_port)
                reach_listen(&m);
        carry_checkpoint(&m);

        while (!*stop) {
                serve(&m, 100);
                if (o->poll)
                        o->poll(o->poll_userdata);
                if (m.have_next && (r = take_plan(&m)) < 0)
                        return r;
        }
        /* a last word to the coordinator: this node leaves */
        if (m.coord >= 0) {
                net_send_control(m.net, (uint32_t)m.coord, FRAME_BYE, NULL, 0);
                for (int i = 0; i < 20; i++)
                        net_run(m.net, 5);
        }
        return 0;
}
