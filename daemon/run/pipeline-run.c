/* run/pipeline-run.c — this node's stage of a cluster's pipeline, as
 * the daemon runs it: its place in the plan, its links to the previous and
 * next stages, its rings with the same layers in the other clusters, and
 * progress in the log. */
#include "pipeline-run.h"

#include <stdlib.h>
#include <string.h>

#include "averaging.h"
#include "collective/segments.h"
#include "node.h"
#include "control.h"
#include "stage-checkpoint.h"
#include "pipeline/pipe.h"
#include "result.h"
#include "series.h"
#include "tensor/ops.h"
#include "util/format.h"
#include "util/log.h"
#include "util/rss.h"
#include "util/time-util.h"

typedef struct Run {
        /* its inputs */
        const StagePlan *plan;
        const Job *job;
        const LocalRunOptions *o;    /* its poll runs during the last averaging round too */
        int epochs;
        /* its place in the plan */
        const ConfigCluster *cl;
        unsigned cluster, stage, n_stages;
        const ConfigMember *self, *prev, *next; /* prev, next: NULL at the ends */
        PipeConfig pc;
        Dataset *train, *test;
        /* the stage and its links */
        Pipe *pipe;
        Net *net;
        int64_t prev_peer, next_peer;
        uint32_t dialing[2];          /* to the previous [0] and the next [1] stage */
        bool dial_pending[2];
        uint64_t next_dial_ns[2];
        bool hinted;                  /* said once that no neighbour dialed in */
        bool finished; /* the neighbours may go now */
        Averaging av;
        bool told_paused;            /* the neighbours know this stage is paused ... */
        char told_reason[128];       /* ... and why */
        uint64_t lost_told;          /* micro-batches lost with broken links, as logged */
        bool prev_paused, next_paused;
        char prev_reason[NODE_PAUSED_MAX], next_reason[NODE_PAUSED_MAX]; /* why, as logged */
        bool prev_quiesced;           /* the stages before finished their micro-batches */
        uint64_t missing_since_ns;    /* a neighbour has been gone (or not come) since; 0: both there */
        bool quiescing, quiesced;
        int averaged;                 /* the last averaging round: 1 with every member, 0 without, -1 none */
        uint64_t quiesce_deadline_ns;
        /* progress: the log, the daemon's status, the averaging hand-off */
        uint64_t start_ns, last_log_ns, last_report_ns, last_links_ns;
        uint64_t last_samples, updates_seen, samples_synced;
        bool resumed;          /* from its own checkpoint, of step resumed_step */
        uint64_t resumed_step;
        uint64_t outer_rounds; /* outer rounds done before this run, as the .outer file said */
        uint64_t first_update;        /* the stage's updates when this process began: its traffic is per step since */
        double last_loss; /* only the last stage knows the loss */
        PipeStats prev_st;
        /* the series: a row every 2 s, over that window */
        Series series;
        uint64_t window_ns;
        PipeStats window_st;
        double busy;                  /* of the last window; < 0 before one */
        /* the published samples/s: over the last 2 s, sliding at every
         * report (the series' window closes every 2 s only, and before it
         * first did a stage training read 0 samples/s) */
        SeriesRate rate;
} Run;

/* Control payloads of the daemon's own, beside the pipe's: a stage tells its
 * neighbours it pauses, and why (node_paused_message()), and resumes. */
static const uint8_t msg_resumed[4] = { 'R', 'V', 'P', 'R' };
/* ... and that every micro-batch it sent came back: the next may stop. */
static const uint8_t msg_quiesced[4] = { 'R', 'V', 'P', 'Q' };

static void tell_neighbours(Run *r, const uint8_t *msg, size_t len) {
        if (r->prev_peer >= 0)
                (void)net_send_control(r->net, (uint32_t)r->prev_peer, FRAME_CONTROL, msg, len);
        if (r->next_peer >= 0)
                (void)net_send_control(r->net, (uint32_t)r->next_peer, FRAME_CONTROL, msg, len);
}

/* That this stage is paused, and why, to its neighbours: once, and again
 * when the cause changes. */
static void tell_paused(Run *r) {
        char reason[128] = "";
        uint8_t msg[NODE_PAUSED_MAX];
        if (r->o && r->o->control)
                control_snapshot(r->o->control, NULL, NULL, reason, NULL, NULL);
        if (r->told_paused && node_pause_reason_same(reason, r->told_reason))
                return;
        snprintf(r->told_reason, sizeof r->told_reason, "%s", reason);
        tell_neighbours(r, msg, node_paused_message(reason, msg));
        r->told_paused = true;
}

static void run_series_row(Run *run, const PipeStats *st, uint64_t now, bool paused);
static void report(Run *run, const PipeStats *st);

/* While the gate holds the stage: keep the links served, and the series'
 * rows and the status going while paused. */
static void serve_paused(void *ud, bool paused) {
        Run *r = ud;
        if (paused)
                tell_paused(r);
        net_run(r->net, 50);
        if (r->o && r->o->poll) /* a paused node is still a member */
                r->o->poll(r->o->poll_userdata);
        uint64_t now = now_ns();
        if (!paused || !r->pipe)
                return;
        PipeStats st;
        pipe_get_stats(r->pipe, &st);
        if (now - r->window_ns >= SERIES_INTERVAL_NS)
                run_series_row(r, &st, now, true);
        if (r->o && r->o->control) /* where the stage stopped: the last report may be steps behind */
                report(r, &st);
}

/* In this order: the averaging thread, the tensors the pipe still holds
 * (back to the Net they came from), the Net (its last sent() calls still
 * reach the pipe), the pipe. */
static void run_done(Run *r) {
        series_close(&r->series);
        averaging_stop(&r->av);
        if (r->pipe)
                pipe_drop_queued(r->pipe);
        r->net = net_free(r->net);
        r->pipe = pipe_free(r->pipe);
        r->train = dataset_free(r->train);
        r->test = dataset_free(r->test);
}

/* Lines a stranger or a neighbour can have this stage write at will: a
 * burst each (by address, or by neighbour), then a summary. */
static LogRatelimit stranger_lines = LOG_RATELIMIT_INIT("Links that are no neighbour's from");
static LogRatelimit pause_lines = LOG_RATELIMIT_INIT("Pause notices from the");
static LogRatelimit bad_lines = LOG_RATELIMIT_INIT("Dropped the links of");

static void run_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        Run *r = ud;
        char hex[IDENTITY_HEX_SIZE];
        identity_to_hex(id, hex);
        if (r->prev && memcmp(id, r->prev->id, IDENTITY_PK_SIZE) == 0 && r->prev_peer < 0) {
                r->prev_peer = peer;
                r->dial_pending[0] = false;
                log_info("Previous stage %.16s… joined", hex);
        } else if (r->next && memcmp(id, r->next->id, IDENTITY_PK_SIZE) == 0 && r->next_peer < 0) {
                r->next_peer = peer;
                r->dial_pending[1] = false;
                log_info("Next stage %.16s… joined", hex);
        } else {
                NetPeerInfo info = { .address = "?" };
                char host[64];
                (void)net_peer_describe(r->net, peer, &info);
                if (log_ratelimit(&stranger_lines, LOG_WARNING, node_address_host(info.address, host, sizeof host)))
                        log_warning("Dropped pipeline link from %.16s… at %s: not a neighbouring stage of this node",
                                    hex, info.address);
                net_close_peer(r->net, peer);
                return;
        }
        pipe_connect(r->pipe, r->net, r->prev_peer, r->next_peer);
        if (r->told_paused) { /* it joined while this stage is paused */
                uint8_t msg[NODE_PAUSED_MAX];
                (void)net_send_control(r->net, peer, FRAME_CONTROL, msg, node_paused_message(r->told_reason, msg));
        }
}

/* Micro-batches a broken link took with it (here, or further down or up
 * the pipeline: its FLUSH reached us). */
static void run_tell_lost(Run *r) {
        PipeStats st;
        pipe_get_stats(r->pipe, &st);
        if (st.lost > r->lost_told) {
                log_info("Dropped %llu micro-batches that were on the way through the broken link",
                         (unsigned long long)(st.lost - r->lost_told));
                r->lost_told = st.lost;
        }
}

/* A link closed: a neighbour's is waited for again (a drop of ours,
 * -EBADRQC, was said when it was made); any other is logged as the node
 * logs its links (a failed handshake, through the strangers' rate limit),
 * but a stranger's this stage dropped once it was up (said then). */
static void run_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        Run *r = ud;
        NetPeerInfo info = { .address = "?" };
        char why[128];
        (void)net_peer_describe(r->net, peer, &info);
        for (int i = 0; i < 2; i++)
                if (r->dial_pending[i] && peer == r->dialing[i])
                        r->dial_pending[i] = false;
        if ((int64_t)peer != r->prev_peer && (int64_t)peer != r->next_peer && !info.open)
                node_log_closed(peer, reason, &info, false);
        if ((int64_t)peer == r->prev_peer || (int64_t)peer == r->next_peer) {
                bool prev = (int64_t)peer == r->prev_peer;
                bool left = reason == 0 || reason == -ECONNRESET;
                if (!r->finished && reason != -EBADRQC)
                        log_warning("%s %s (%s); waiting for it to come back",
                                    prev ? "Previous stage" : "Next stage", left ? "left" : "lost its link",
                                    node_close_reason(reason, &info, why, sizeof why));
                if (prev) { /* and paused no more: it says so again when it comes back paused */
                        r->prev_peer = -1;
                        r->prev_paused = false;
                } else {
                        r->next_peer = -1;
                        r->next_paused = false;
                }
                pipe_connect(r->pipe, r->net, r->prev_peer, r->next_peer);
                run_tell_lost(r);
        }
}

/* A neighbour that sent what this stage cannot take (e: -EBADMSG, -ERANGE
 * of a tensor, -EBADRQC of a message) loses its link; the stage waits for
 * it to come back, as for any loss. */
static void drop_bad_neighbour(Run *r, uint32_t peer, int e) {
        bool prev = (int64_t)peer == r->prev_peer;
        if (log_ratelimit(&bad_lines, LOG_WARNING, prev ? "the previous stage" : "the next stage"))
                log_warning("Dropped the link of the %s stage: it sent %s", prev ? "previous" : "next",
                            e == -ERANGE    ? "values that are not finite (NaN or infinity)"
                            : e == -EBADRQC ? "a message this stage cannot take (malformed or out of place)"
                                            : "a tensor this stage does not expect");
        net_drop_peer(r->net, peer, -EBADRQC);
}

static void run_tensor(void *ud, NetTensor *t) {
        Run *r = ud;
        uint32_t peer = t->peer;
        int e = pipe_on_tensor(r->pipe, t);
        if (e == -EBADMSG || e == -ERANGE)
                drop_bad_neighbour(r, peer, e);
}

static void run_sent(void *ud, uint32_t peer, uint64_t cookie) {
        pipe_on_sent(((Run *)ud)->pipe, cookie);
}

static void run_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Run *r = ud;
        char why[NODE_PAUSED_MAX];
        bool from_prev = (int64_t)peer == r->prev_peer, from_next = (int64_t)peer == r->next_peer;
        bool paused = type == FRAME_CONTROL && node_paused_reason(p, len, why, sizeof why);
        if (type == FRAME_CONTROL && (from_prev || from_next) &&
            (paused || (len == 4 && !memcmp(p, msg_resumed, 4)))) {
                /* logged when it pauses, resumes or the cause changes, not
                 * at every notice: it may send them as fast as it likes */
                bool *was = from_prev ? &r->prev_paused : &r->next_paused;
                char *cause = from_prev ? r->prev_reason : r->next_reason;
                if (paused == *was && (!paused || node_pause_reason_same(cause, why)))
                        return;
                *was = paused;
                snprintf(cause, NODE_PAUSED_MAX, "%s", paused ? why : "");
                if (log_ratelimit(&pause_lines, LOG_INFO, from_prev ? "previous stage" : "next stage"))
                        log_info("%s stage %s%s%s", from_prev ? "Previous" : "Next", paused ? "paused" : "resumed",
                                 paused && why[0] ? ": " : "", paused ? why : "");
                return;
        }
        if (type == FRAME_CONTROL && len == 4 && from_prev && !memcmp(p, msg_quiesced, 4)) {
                r->prev_quiesced = true;
                return;
        }
        int e = type == FRAME_CONTROL ? pipe_on_control(r->pipe, peer, p, len) : 0;
        if (e == -EBADMSG)
                drop_bad_neighbour(r, peer, -EBADRQC);
        else if (e < 0) /* its answer is lost, which it would wait for: the link goes */
                (void)net_drop_peer(r->net, peer, e);
        run_tell_lost(r);
}

static void run_lane_refused(void *ud, int reason, const NetPeerInfo *info) {
        node_log_lane_refused("pipeline", reason, info);
}

static const NetCallbacks run_callbacks = {
        .connected = run_connected,
        .closed = run_closed,
        .tensor = run_tensor,
        .sent = run_sent,
        .control = run_control,
        .lane_refused = run_lane_refused,
};

/* The busy fraction of the training window, and what it was made of. */
static double busy_while_training(const PipeStats *st, char *why, size_t len) {
        double compute = pipe_percent(st->train_compute_ns, st->train_ns),
               wait = pipe_percent(st->train_wait_ns, st->train_ns);
        snprintf(why, len, "computing %.0f%%, moving tensors %.0f%%, waiting %.0f%%", compute,
                 MAX(100 - compute - wait, 0.0), wait);
        return CLAMP(100 - wait, 0.0, 100.0);
}

/* A neighbour gone, or not yet come, for longer than
 * pipeline.neighbour_timeout: the stage gives up (it could only wait). */
static bool neighbour_gone_too_long(Run *r, unsigned timeout_s) {
        bool prev_gone = r->prev && r->prev_peer < 0, next_gone = r->next && r->next_peer < 0;
        uint64_t now = now_ns();
        if ((!prev_gone && !next_gone) || timeout_s == 0) {
                r->missing_since_ns = 0;
                return false;
        }
        if (!r->missing_since_ns)
                r->missing_since_ns = now;
        if (now - r->missing_since_ns < (uint64_t)timeout_s * NSEC_PER_SEC)
                return false;
        const ConfigMember *m = prev_gone ? r->prev : r->next;
        char hex[IDENTITY_HEX_SIZE];
        identity_to_hex(m->id, hex);
        log_error("Gave up on the %s stage %.16s… (%s:%u): not connected for %u s (pipeline.neighbour_timeout)",
                  prev_gone ? "previous" : "next", hex, m->address.host, m->address.port, timeout_s);
        return true;
}

/* Whether this stage opens its link to a neighbour (0: the previous, 1:
 * the next): the earlier stage dials, unless only the later one cannot
 * accept connections (net_dials()). */
static bool run_dials(const Run *r, int which) {
        const ConfigMember *m = which ? r->next : r->prev;
        return m && net_dials(!r->self->no_accept, !m->no_accept, which == 1);
}

/* Or through the relay, when neither end accepts connections: the earlier
 * stage asks for the next there, which waits there. */
static bool run_relays(const Run *r, int which) {
        const ConfigMember *m = which ? r->next : r->prev;
        return m && r->plan->averaging.net->relay_host && net_relays(!r->self->no_accept, !m->no_accept, which == 1);
}

/* A neighbour that should dial this stage has not for a minute: say once
 * what to check (the address the plan gives, or NAT). */
static void hint_unreachable(Run *r, uint64_t now) {
        for (int i = 0; i < 2 && !r->hinted; i++) {
                const ConfigMember *m = i ? r->next : r->prev;
                if (!m || run_dials(r, i) || m->no_accept || (i ? r->next_peer : r->prev_peer) >= 0 ||
                    now - r->start_ns < 60 * NSEC_PER_SEC)
                        continue;
                log_notice("The %s stage has not dialed in for a minute: check that this node's address in the plan "
                           "(%s:%u) reaches it; a node that cannot accept connections (behind NAT) is named in the "
                           "plan by its key alone", i ? "next" : "previous", r->self->address.host,
                           r->self->address.port);
                r->hinted = true;
        }
}

/* The stage dials the neighbours it opens links to, again and again until
 * they answer. */
static void dial_neighbours(Run *r) {
        uint64_t now = now_ns();
        hint_unreachable(r, now);
        for (int i = 0; i < 2; i++) {
                const ConfigMember *m = i ? r->next : r->prev;
                bool relayed = run_relays(r, i);
                if ((!run_dials(r, i) && !relayed) || (i ? r->next_peer : r->prev_peer) >= 0 ||
                    r->dial_pending[i] || now < r->next_dial_ns[i])
                        continue;
                r->next_dial_ns[i] = now + NSEC_PER_SEC;
                if ((relayed ? net_connect_relayed(r->net, m->id, &r->dialing[i])
                             : net_connect(r->net, m->address.host, m->address.port, &r->dialing[i])) == 0)
                        r->dial_pending[i] = true;
        }
}

static void poll_run(void *ud) {
        Run *r = ud;
        net_run(r->net, 1);
        if (r->o && r->o->poll)
                r->o->poll(r->o->poll_userdata);
}

/* Its links to the neighbouring stages as the kernel measured them. */
static void measure_links(const Run *r, LinkFigures *f) {
        int64_t peers[2] = { r->prev_peer, r->next_peer };
        double bw = 0, lat = 0, rtt, rate;
        bool app_limited;
        for (int i = 0; i < 2; i++) {
                if (peers[i] < 0 || net_peer_link_info(r->net, (uint32_t)peers[i], &rtt, &rate, &app_limited) < 0)
                        continue;
                lat = MAX(lat, rtt / 2);
                if (rate > 0 && !app_limited)
                        bw = bw > 0 ? MIN(bw, rate) : rate;
        }
        if (lat > 0)
                f->latency = lat;
        if (bw > 0)
                f->bandwidth = bw;
}

/* Where the stage is, for a checkpoint. */
static CheckpointInfo position(Pipe *pipe) {
        PipeStats st;
        pipe_get_stats(pipe, &st);
        return (CheckpointInfo){
                .epoch = (uint64_t)MAX(st.epochs_done, 0),
                .step_in_epoch = st.step_in_epoch,
                .samples = st.samples,
                .updates = st.updates,
                .step = st.updates,
                .batch = (uint32_t)pipe_micro_batch(pipe),
        };
}

static int save_checkpoint(Run *run, bool last) {
        const LocalRunOptions *o = run->o;
        CheckpointInfo at = position(run->pipe);
        const float *anchor, *momentum;
        AveragerStats as = run->av.seen;
        if (averaging_outer_state(&run->av, &anchor, &momentum) >= 0)
                (void)stage_checkpoint_save_outer(o->checkpoint_dir, run->job->name, pipe_stage(run->pipe), anchor,
                                                  momentum, run->outer_rounds + as.rounds_done, &at);
        const Stage *s = pipe_stage(run->pipe);
        int r = stage_checkpoint_save(o->checkpoint_dir, run->job->name, s, pipe_optim(run->pipe), &at, last);
        if (r >= 0 && o->control)
                control_report_checkpoint(o->control, at.step);
        if (r >= 0 && o->retire_checkpoints) /* a layer range held before is someone else's now */
                (void)stage_checkpoint_retire(o->checkpoint_dir, run->job->name, s->first_layer,
                                              s->first_layer + s->n_layers);
        return r;
}

/* What the stage moved over its links and to average, and over how many
 * of its updates. */
static NodeTraffic run_traffic(const Run *run, const PipeStats *st) {
        NetStats ns;
        net_get_stats(run->net, &ns);
        return (NodeTraffic){
                .pipeline_sent = ns.bytes_sent,
                .pipeline_received = ns.bytes_received,
                .averaging_sent = run->av.seen.bytes_sent, /* kept after the averager stopped */
                .averaging_received = run->av.seen.bytes_received,
                .steps = st->updates - MIN(run->first_update, st->updates),
        };
}

/* The daemon's status: every quarter second. */
/* Whether peers can reach this node: the coordinator could not dial it
 * back (it dials every link), it says it cannot (no address in the plan:
 * it dials out), the coordinator dialed it back or a peer has dialed in,
 * or none has yet. */
static const char *run_reachability(const Run *run, const NetStats *ns) {
        const LocalRunOptions *o = run->o;
        if (o->reach_checked && o->reach_error)
                return "not reachable";
        if (run->self->no_accept)
                return "dials out";
        if (o->reach_checked || ns->links_in + (run->av.active ? run->av.seen.links_in : 0) > 0)
                return "reachable";
        return "unconfirmed";
}

/* The neighbour this stage cannot work without, for people: "stage 1: not
 * connected", "stage 3: paused"; "" while both are there, and once the
 * stage finished. */
static void waiting_for(const Run *run, char *buf, size_t len) {
        buf[0] = 0;
        if (run->finished)
                return;
        if (run->prev && (run->prev_peer < 0 || run->prev_paused))
                snprintf(buf, len, "stage %u: %s", run->stage, run->prev_peer < 0 ? "not connected" : "paused");
        else if (run->next && (run->next_peer < 0 || run->next_paused))
                snprintf(buf, len, "stage %u: %s", run->stage + 2, run->next_peer < 0 ? "not connected" : "paused");
}

static void report(Run *run, const PipeStats *st) {
        const LocalRunOptions *o = run->o;
        NodeTraining t = {
                .cluster = (int32_t)run->cluster,
                .stage = (int32_t)run->stage,
                .epoch = st->epoch ? st->epoch : -1,
                .epochs = run->epochs,
                .step = st->updates,
                .loss = run->last_loss,
                .samples_per_sec = series_rate(&run->rate, st->samples, now_ns()),
                .busy = run->busy,
                .test_accuracy = st->test_acc,
                .test_loss = st->test_acc >= 0 ? st->test_loss : -1.0,
        };
        snprintf(t.role, sizeof t.role, "stage");
        snprintf(t.job, sizeof t.job, "%s", run->job->name);
        waiting_for(run, t.waiting_for, sizeof t.waiting_for);
        control_report_training(o->control, &t);

        NetStats ns;
        NodeNetwork n = {};
        net_get_stats(run->net, &ns);
        n.peers = ns.links_open + (run->av.active ? run->av.seen.connected : 0);
        n.paused_peers = run->prev_paused + run->next_paused;
        /* counters, this run's (the daemon adds those of the runs before):
         * the averager's are kept after it stopped, for the last report */
        n.bytes_sent = ns.bytes_sent + run->av.seen.bytes_sent;
        n.bytes_received = ns.bytes_received + run->av.seen.bytes_received;
        averaging_report_network(&run->av, &n);
        n.traffic = run_traffic(run, st);
        snprintf(n.io_backend, sizeof n.io_backend, "%s", net_backend_name(run->net));
        snprintf(n.reachability, sizeof n.reachability, "%s", run_reachability(run, &ns));
        control_report_network(o->control, &n);
}

static int find_self(const ConfigPipeline *p, const Identity *id, unsigned *ret_cluster, unsigned *ret_stage) {
        for (unsigned k = 0; k < p->n_clusters; k++)
                for (unsigned s = 0; s < p->clusters[k].n_stages; s++)
                        if (memcmp(p->clusters[k].nodes[s].id, id->pk, IDENTITY_PK_SIZE) == 0) {
                                *ret_cluster = k;
                                *ret_stage = s;
                                return 0;
                        }
        return -ENOENT;
}

static int member_index(const ConfigAveraging *a, const uint8_t id[IDENTITY_PK_SIZE]) {
        for (size_t i = 0; i < a->n_members; i++)
                if (memcmp(a->members[i].id, id, IDENTITY_PK_SIZE) == 0)
                        return (int)i;
        return -ENOENT;
}

/* The members of a ring link to each other: at most one of them may accept
 * no connections (net_dials()). */
static int check_rings_reachable(const StagePlan *plan, const Segment *seg, size_t n_seg) {
        const ConfigAveraging *a = plan->averaging.settings;
        if (plan->averaging.net->relay_host)
                return 0; /* they link through the relay */
        for (size_t i = 0; i < n_seg; i++) {
                int first = -1;
                for (unsigned k = 0; k < seg[i].n_owners; k++) {
                        unsigned m = seg[i].owners[k];
                        if (!a->members[m].no_accept)
                                continue;
                        if (first >= 0) {
                                log_error("%s: averaging.members: members %d and %u hold the same layers but both "
                                          "accept no connections (no address): one of them needs one",
                                          plan->source, first + 1, m + 1);
                                return -EINVAL;
                        }
                        first = (int)m;
                }
        }
        return 0;
}

/* This stage's rings: the parameter vector cut at every stage boundary of
 * every cluster, the owners found among the averaging members. */
static int plan_rings(const StagePlan *plan, const ModelSpec *m, unsigned cluster, unsigned stage, AveragerRing *rings,
                      unsigned *n_rings) {
        const ConfigPipeline *p = plan->pipeline;
        size_t total = model_spec_params(m, 0, m->n_layers), n_seg, n_bounds = 0;
        for (unsigned k = 0; k < p->n_clusters; k++)
                n_bounds += p->clusters[k].n_stages + 1;
        _cleanup_(freep) size_t *bounds = calloc(n_bounds, sizeof *bounds);
        _cleanup_(freep) unsigned *owners = calloc(n_bounds, sizeof *owners);
        _cleanup_(freep) ClusterCut *cuts = calloc(p->n_clusters, sizeof *cuts);
        _cleanup_(freep) Segment *seg = NULL;
        int r;

        if (!bounds || !owners || !cuts)
                return log_error_errno(-ENOMEM, "Out of memory");
        for (unsigned k = 0, at = 0; k < p->n_clusters; k++) {
                const ConfigCluster *cl = &p->clusters[k];
                for (unsigned s = 0; s <= cl->n_stages; s++)
                        bounds[at + s] = model_spec_params(m, 0, cl->bounds[s]);
                for (unsigned s = 0; s < cl->n_stages; s++) {
                        int i = member_index(plan->averaging.settings, cl->nodes[s].id);
                        if (i < 0) {
                                log_error("%s: averaging.members: node %u of cluster %u is not among them", plan->source,
                                          s + 1, k + 1);
                                return -EINVAL;
                        }
                        owners[at + s] = (unsigned)i;
                }
                cuts[k] = (ClusterCut){ bounds + at, owners + at, cl->n_stages };
                at += cl->n_stages + 1;
        }
        r = segments_plan(cuts, p->n_clusters, total, &seg, &n_seg);
        if (r < 0) {
                log_error("%s: pipeline.clusters: the cuts do not make rings (a stage without parameters, or one node "
                          "in two clusters)", plan->source);
                return r;
        }
        if ((r = check_rings_reachable(plan, seg, n_seg)) < 0)
                return r;
        size_t lo = cuts[cluster].bounds[stage], hi = cuts[cluster].bounds[stage + 1];
        *n_rings = 0;
        for (size_t i = 0; i < n_seg && *n_rings < COLL_MAX_MEMBERS; i++) {
                if (seg[i].off < lo || seg[i].off >= hi)
                        continue;
                AveragerRing *g = &rings[(*n_rings)++];
                *g = (AveragerRing){ .group = seg[i].group, .n = seg[i].n_owners, .off = seg[i].off - lo,
                                     .len = seg[i].len };
                memcpy(g->members, seg[i].owners, seg[i].n_owners * sizeof *g->members);
        }
        return 0;
}

/* ---- the life of a stage, step by step ------------------------------------ */

/* Plan: this node's cluster and stage, and its neighbours. */
static int run_place(Run *run, const Identity *id) {
        const ConfigPipeline *p = run->plan->pipeline;
        const Job *job = run->job;

        if (find_self(p, id, &run->cluster, &run->stage) < 0) {
                char hex[IDENTITY_HEX_SIZE];
                identity_to_hex(id->pk, hex);
                log_error("%s: pipeline.clusters: this node's key %s is not in any cluster", run->plan->source, hex);
                return -EINVAL;
        }
        run->cl = &p->clusters[run->cluster];
        Diag d = {};
        if (config_pipeline_fits_job(p, run->plan->source, job, &d) < 0) {
                log_error("%s", d.text);
                return -EINVAL;
        }
        run->n_stages = run->cl->n_stages;
        run->self = &run->cl->nodes[run->stage];
        run->prev = run->stage > 0 ? &run->cl->nodes[run->stage - 1] : NULL;
        run->next = run->stage + 1 < run->cl->n_stages ? &run->cl->nodes[run->stage + 1] : NULL;
        run->epochs = run->o->epochs > 0 ? run->o->epochs : job->train.epochs;
        /* a coordinator's plan has not been through the configuration's check */
        for (int i = 0; i < 2; i++) {
                const ConfigMember *m = i ? run->next : run->prev;
                if (m && m->no_accept && run->self->no_accept && !run->plan->averaging.net->relay_host) {
                        log_error("%s: this stage and the %s both accept no connections (behind NAT) and no "
                                  "network.relay is set: they cannot link", run->plan->source,
                                  i ? "next" : "previous");
                        return -EINVAL;
                }
        }
        return 0;
}

/* Every stage reads the training set's size for the learning-rate
 * schedule; the first stage trains on its cluster's shard of it and
 * evaluates on the test set. */
static int run_load_data(Run *run) {
        return local_run_load_data(run->job, run->o->data_dir, &run->train, run->stage == 0 ? &run->test : NULL);
}

void stage_carry_clear(StageCarry *c) {
        c->optim = mfree(c->optim);
        c->outer = mfree(c->outer);
        c->lo = c->hi = 0;
}

static bool carry_fits(const Run *run, const StageCarry *c) {
        return c && c->optim && c->lo == run->pc.lo && c->hi == run->pc.hi &&
               c->n == pipe_stage(run->pipe)->n_params;
}

/* The layers the stage trained (model_params holds them now) and its
 * optimizer's state (and the outer optimizer's), for the node's next plan;
 * before averaging_stop(), which frees the latter. Out of memory, the
 * state is simply not kept. */
static void carry_save(Run *run) {
        StageCarry *c = run->o->carry;
        const Stage *s = pipe_stage(run->pipe);
        const Optim *op = pipe_optim(run->pipe);
        size_t k = optim_state_floats(op->spec.kind, s->n_params), n = s->n_params;
        const float *anchor, *momentum;

        if (!c)
                return;
        stage_carry_clear(c);
        *c = (StageCarry){ .lo = run->pc.lo, .hi = run->pc.hi, .n = n, .t = op->t };
        if (!(c->optim = malloc(MAX(k, (size_t)1) * sizeof(float))))
                return;
        memcpy(c->optim, op->state, k * sizeof(float));
        if (averaging_outer_state(&run->av, &anchor, &momentum) == 0 && (c->outer = malloc(2 * n * sizeof(float)))) {
                memcpy(c->outer, anchor, n * sizeof(float));
                memcpy(c->outer + n, momentum, n * sizeof(float));
        }
}

/* Where a stage goes on from: the parameters handed over from the previous
 * plan's owners (or its own, kept with its optimizer's state when its
 * layers stay the same), the clusters' progress, or its own checkpoint. */
static void run_resume(Run *run, size_t steps, int U) {
        const LocalRunOptions *o = run->o;
        const ConfigPipeline *p = run->plan->pipeline;
        Pipe *pipe = run->pipe;
        CheckpointInfo at;
        uint64_t updates = 0;

        if (o->model_params && o->load_model_params)
                memcpy(pipe_stage(pipe)->params, o->model_params + model_spec_params(&run->job->model, 0, run->pc.lo),
                       pipe_stage(pipe)->n_params * sizeof(float));
        if (o->resume_samples) { /* go on where the clusters were, in this plan's shards */
                uint64_t per = (uint64_t)p->n_clusters * (uint64_t)p->micro_batch;
                uint64_t n = (uint64_t)steps * per, done = o->resume_samples;
                updates = done / per / (uint64_t)U;
                if (n)
                        pipe_resume(pipe, (int)MIN(done / n, (uint64_t)INT32_MAX), (size_t)((done % n) / per),
                                    updates);
        }
        if (o->model_params && o->load_model_params && carry_fits(run, o->carry)) {
                Optim *op = pipe_optim(pipe);
                memcpy(op->state, o->carry->optim, optim_state_floats(op->spec.kind, o->carry->n) * sizeof(float));
                op->t = o->carry->t == STAGE_CARRY_T_SWARM ? updates : o->carry->t;
                log_info("Going on with %s optimizer state (%llu steps)",
                         o->carry->t == STAGE_CARRY_T_SWARM ? "the handed-over" : "this stage's",
                         (unsigned long long)op->t);
        }
        if (o->checkpoint_dir && o->load_checkpoint &&
            stage_checkpoint_load(o->checkpoint_dir, run->job->name, pipe_stage(pipe), pipe_optim(pipe), &at) >= 0) {
                pipe_resume(pipe, (int)MIN(at.epoch, (uint64_t)INT32_MAX),
                            stage_checkpoint_resume_step(&at, (unsigned)p->micro_batch), at.updates);
                run->resumed = true;
                run->resumed_step = at.step;
                if (o->control)
                        control_report_checkpoint(o->control, at.step);
        }
}

/* Stage: its layers, schedule and data, and where it goes on from. */
static int run_stage(Run *run) {
        const ConfigPipeline *p = run->plan->pipeline;
        const Job *job = run->job;
        int U = p->synchronous ? p->staleness : p->update_frequency;
        size_t steps = run->train->n / p->n_clusters / (size_t)p->micro_batch;
        Diag d = {};
        int r;

        run->pc = (PipeConfig){
                .model = &job->model,
                .lo = run->cl->bounds[run->stage],
                .hi = run->cl->bounds[run->stage + 1],
                .seed = job->train.seed,
                .optim = &job->optim,
                .micro_batch = p->micro_batch,
                .in_flight = p->staleness,
                .update_frequency = p->update_frequency,
                .schedule = p->synchronous ? PIPE_SYNC : PIPE_ASYNC,
                .total_updates = (uint64_t)run->epochs * steps / (uint64_t)U,
                .predict_weights = p->weight_prediction,
                .sync_updates = p->synchronous_start >= 0 ? (uint64_t)p->synchronous_start
                                                          : 2 * (uint64_t)job->optim.warmup_steps,
                .train = run->stage == 0 ? run->train : NULL,
                .test = run->test,
                .shard = (int)run->cluster,
                .n_shards = (int)p->n_clusters,
                .epochs = run->epochs,
                .data_seed = job->train.seed,
                .hold_after_training = run->plan->averaging.settings->enabled,
        };
        r = pipe_new(&run->pc, &ops_blas, &run->pipe, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to set up stage %u: %s", run->stage + 1, diag_reason(&d, r));
        if (run->stage > 0) /* only the first stage trains on it */
                run->train = dataset_free(run->train);
        run_resume(run, steps, U);
        return 0;
}

/* Links: the transport, listening when a neighbour dials this stage (it
 * dials the others from the loop). */
static int run_links(Run *run) {
        const ConfigPipeline *p = run->plan->pipeline;
        bool dialed = (run->prev && !run_dials(run, 0)) || (run->next && !run_dials(run, 1));
        NetConfig nc = *run->plan->averaging.net;
        int r;

        /* behind NAT with a relay: a neighbour behind NAT too asks for this stage there */
        nc.relay_wait = run->self->no_accept && nc.relay_host;
        nc.relay_channel = NET_RELAY_PIPELINE;
        r = net_new(&nc, &run_callbacks, run, &run->net);
        if (r < 0)
                return log_error_errno(r, "Failed to start the pipeline transport: %m");
        pipe_connect(run->pipe, run->net, -1, -1);
        if (dialed && !run->self->no_accept && (r = node_listen(run->net, p->listen.host, p->listen.port, NULL)) < 0)
                return log_error_errno(r, "Failed to listen on %s:%u for the neighbouring stages: %m",
                                       p->listen.host, p->listen.port);
        if (run->self->no_accept && run->n_stages > 1)
                log_info("This stage accepts no connections: it dials its neighbours");
        return 0;
}

/* The outer optimizer's anchor and momentum: its checkpoint's when the
 * stage resumed from one, else the parameters it starts with. */
static int run_outer_state(Run *run) {
        const LocalRunOptions *o = run->o;
        const Stage *s = pipe_stage(run->pipe);
        const float *anchor, *momentum;

        if (averaging_outer_state(&run->av, &anchor, &momentum) == -EINVAL)
                return 0; /* no outer optimizer */
        if (o->load_model_params && carry_fits(run, o->carry) && o->carry->outer)
                return averaging_set_outer_state(&run->av, o->carry->outer, o->carry->outer + s->n_params);
        _cleanup_(freep) float *buf = malloc(2 * s->n_params * sizeof(float));
        if (!buf)
                return log_error_errno(-ENOMEM, "Out of memory");
        if (run->resumed && stage_checkpoint_load_outer(o->checkpoint_dir, run->job->name, s, buf,
                                                        buf + s->n_params, run->resumed_step,
                                                        &run->outer_rounds) >= 0)
                return averaging_set_outer_state(&run->av, buf, buf + s->n_params);
        return averaging_set_outer_state(&run->av, s->params, NULL);
}

/* The averager is about to write the stage's parameters: the micro-batches
 * on the way keep the version their forward pass ran on (weight stashing). */
static void keep_versions(void *ud) {
        Run *run = ud;
        int r = pipe_stash_live(run->pipe);
        if (r < 0)
                log_warning_errno(r, "Failed to keep the parameters of the micro-batches on the way: %m");
}

/* Rings: the same layers in the other clusters. */
static int run_rings(Run *run, const Identity *id) {
        _cleanup_(freep) AveragerRing *rings = NULL;
        unsigned n_rings = 0;
        int r;

        if (!run->plan->averaging.settings->enabled)
                return 0;
        rings = calloc(COLL_MAX_MEMBERS, sizeof *rings); /* about 4 KiB each */
        if (!rings)
                return log_error_errno(-ENOMEM, "Out of memory");
        if ((r = plan_rings(run->plan, &run->job->model, run->cluster, run->stage, rings, &n_rings)) < 0)
                return r;
        r = averaging_start(&run->av, &run->plan->averaging, id, pipe_stage(run->pipe)->n_params, rings, n_rings);
        if (r < 0 || (r = run_outer_state(run)) < 0)
                return r;
        if (run->o->control)
                averaging_report_started(&run->av, &run->plan->averaging, pipe_stage(run->pipe)->n_params,
                                         run->o->control);
        averaging_on_write(&run->av, keep_versions, run);
        /* A stage new to the swarm, or back from a checkpoint, starts from
         * the others' parameters and their optimizer's moments; one the
         * coordinator handed its layers to has them already. */
        averaging_begin(&run->av, pipe_stage(run->pipe)->params, pipe_optim(run->pipe), !run->o->load_model_params,
                        poll_run, run);
        return 0;
}

/* A safe stop was asked for: the micro-batches on the way finish first,
 * then the next stage hears that nothing more comes. True when stopped. */
static bool run_quiesce(Run *run) {
        const LocalRunOptions *o = run->o;
        PipeStats st;

        if (!run->quiescing && o->quiesce && *o->quiesce) {
                log_info("Stopping at a safe point: the micro-batches on the way finish first");
                pipe_quiesce(run->pipe, true);
                run->quiescing = true;
                run->quiesce_deadline_ns = now_ns() + 5 * NSEC_PER_SEC;
        }
        if (!run->quiescing)
                return false;
        /* the first stage's micro-batches are back, or the stage before says so
         * (nothing comes from a previous stage that is gone) */
        pipe_get_stats(run->pipe, &st);
        bool late = now_ns() > run->quiesce_deadline_ns;
        if (!(run->stage == 0 ? st.in_flight == 0 : run->prev_quiesced || run->prev_peer < 0) && !late)
                return false;
        if (run->next_peer >= 0)
                (void)net_send_control(run->net, (uint32_t)run->next_peer, FRAME_CONTROL, msg_quiesced, 4);
        log_info("Stopped at a safe point%s", late ? " (gave up waiting for the micro-batches on the way)" : "");
        run->quiesced = true;
        return true;
}

/* Pause, stop and checkpoints, as the daemon asks: -ECANCELED to stop. */
static int run_gate(Run *run) {
        const LocalRunOptions *o = run->o;
        int r;

        if (!o->control)
                return 0;
        /* a checkpoint asked for while paused is written, and the pause goes on */
        while ((r = control_gate(o->control, serve_paused, run)) == CONTROL_CHECKPOINT) {
                int k = o->checkpoint_dir ? save_checkpoint(run, false) : -EOPNOTSUPP;
                PipeStats st;
                pipe_get_stats(run->pipe, &st);
                report(run, &st); /* Step where CheckpointStep is (the last report may be steps behind) */
                control_checkpoint_done(o->control, k, position(run->pipe).step);
        }
        if (run->told_paused) {
                tell_neighbours(run, msg_resumed, sizeof msg_resumed);
                run->told_paused = false;
        }
        return r == -ECANCELED ? r : 0;
}

/* The fraction of a window of span that ended now the stage was not
 * waiting, in [0, 1] whatever the clocks' rounding. Before its first unit
 * of work the pipe counts no wait (no bubble), but the stage only waited. */
static double window_busy(const PipeStats *st, uint64_t wait_before, uint64_t span) {
        uint64_t waited = st->wait_ns - wait_before + (span > st->elapsed_ns ? span - st->elapsed_ns : 0);
        return CLAMP(1 - (double)waited / (double)span, 0.0, 1.0);
}

/* A progress line: what the stage did since the last one. The last stage's
 * loss and accuracy are those of the micro-batches it scored meanwhile:
 * none, none given. */
static void run_log_progress(Run *run, const PipeStats *st, uint64_t now) {
        const PipeStats *prev = &run->prev_st;
        double dt = ns_to_sec(now - run->last_log_ns);
        double busy = window_busy(st, prev->wait_ns, now - run->last_log_ns);
        double compute = CLAMP((double)(st->compute_ns - prev->compute_ns) / (double)(now - run->last_log_ns), 0.0,
                               1.0);
        uint64_t scored = st->scored - prev->scored;
        double rate = (double)(st->samples - run->last_samples) / dt;
        char scores[64] = "", flight[64] = "", waiting[80] = "", w[64];

        if (!run->next && scored)
                snprintf(scores, sizeof scores, "loss %.4f, acc %.2f%%, ",
                         (st->loss_sum - prev->loss_sum) / (double)scored,
                         100 * (st->correct - prev->correct) / (double)scored);
        if (run->next)
                snprintf(flight, sizeof flight, ", %u in flight, %u stashed versions", st->in_flight, st->versions);
        waiting_for(run, w, sizeof w);
        if (w[0])
                snprintf(waiting, sizeof waiting, ", waiting for %s", w);
        log_info("stage %u/%u: %lu micro-batches, %s%.0f samples/s, busy %.0f%% (computing %.0f%%)%s%s",
                 run->stage + 1, run->n_stages, (unsigned long)st->forwards, scores, rate, 100 * busy, 100 * compute,
                 flight, waiting);
        run->prev_st = *st;
        run->last_log_ns = now;
        run->last_samples = st->samples;
}

/* Every 2 s, and at the end: what the stage did over the window (its busy
 * fraction, samples/s and, at the last stage, its loss: the figures the
 * daemon publishes, whatever the progress lines), a row of the series.
 * Paused, the stage is not busy. */
static void run_series_row(Run *run, const PipeStats *st, uint64_t now, bool paused) {
        const PipeStats *w = &run->window_st;
        uint64_t span = now - run->window_ns;
        if (!span)
                return;
        run->busy = paused ? 0 : window_busy(st, w->wait_ns, span);
        uint64_t scored = st->scored - w->scored;
        NodeTraffic t = run_traffic(run, st);
        SeriesRow row = {
                .epoch = st->epoch,
                .step = st->updates,
                .train_loss = scored ? (st->loss_sum - w->loss_sum) / (double)scored : -1,
                .valid_loss = st->test_loss,
                .samples_per_sec = (double)(st->samples - w->samples) / ns_to_sec(span),
                .busy = run->busy,
                .pipeline_bytes = t.pipeline_sent + t.pipeline_received,
                .averaging_bytes = t.averaging_sent + t.averaging_received,
                .averaging_rounds = run->av.seen.rounds_done,
        };
        if (scored)
                run->last_loss = row.train_loss;
        run->window_st = *st;
        run->window_ns = now;
        (void)rss_self_bytes(&row.rss_bytes);
        int r = series_append(&run->series, &row);
        if (r < 0)
                log_warning_errno(r, "Failed to write the series: %m; it stops here, training goes on");
}

/* Between two turns of the loop: the averaging hand-off after an update,
 * the link figures, the daemon's status and the progress line. */
static void run_after_step(Run *run) {
        const LocalRunOptions *o = run->o;
        Stage *s = pipe_stage(run->pipe);
        uint64_t now = now_ns();
        PipeStats st;

        pipe_get_stats(run->pipe, &st);
        if (st.updates != run->updates_seen) {
                averaging_step(&run->av, s->params, st.samples - run->samples_synced);
                run->samples_synced = st.samples;
                run->updates_seen = st.updates;
        } else
                averaging_serve(&run->av, s->params);
        if (o->links && now - run->last_links_ns >= NSEC_PER_SEC) {
                measure_links(run, o->links);
                run->last_links_ns = now;
        }
        if (now - run->window_ns >= SERIES_INTERVAL_NS)
                run_series_row(run, &st, now, false);
        if (o->control && now - run->last_report_ns >= 250 * 1000000ULL) {
                report(run, &st);
                run->last_report_ns = now;
        }
        if (o->progress_interval_ms && now - run->last_log_ns >= (uint64_t)o->progress_interval_ms * 1000000ull)
                run_log_progress(run, &st, now);
}

/* Loop: train until the pipe finishes (the last averaging round and the
 * evaluation happen inside), a stop, or an error. PIPE_FINISHED, or -errno. */
static int run_loop(Run *run, const volatile sig_atomic_t *stop) {
        const LocalRunOptions *o = run->o;
        PipeStats st;
        int r = 0;

        run->start_ns = run->last_log_ns = run->window_ns = now_ns();
        run->last_loss = -1;
        pipe_get_stats(run->pipe, &st);
        run->window_st = st;
        series_rate_start(&run->rate, SERIES_INTERVAL_NS, st.samples, run->window_ns);
        run->updates_seen = run->first_update = st.updates;
        while (!*stop && !run_quiesce(run)) {
                dial_neighbours(run);
                if (neighbour_gone_too_long(run, run->plan->pipeline->neighbour_timeout_s))
                        return -ETIMEDOUT;
                if ((r = run_gate(run)) < 0)
                        return r;
                r = pipe_work(run->pipe);
                if (r == PIPE_FINISHED)
                        return r;
                if (r == PIPE_HELD) { /* the same final model in every cluster before the evaluation */
                        log_info("Training done: a last averaging round before the evaluation");
                        run->averaged = averaging_final(&run->av, pipe_stage(run->pipe)->params, poll_run, run) < 0
                                                ? 0 : 1;
                        pipe_release(run->pipe);
                        continue;
                }
                if (r == -ERANGE) {
                        PipeStats ps;
                        pipe_get_stats(run->pipe, &ps);
                        return log_error_errno(r, "Stage %u diverged at update %llu: %s not finite; stopping (no "
                                                  "checkpoint written: a restart goes on from the last good one and "
                                                  "the others' parameters)",
                                               run->stage + 1, (unsigned long long)ps.updates + 1,
                                               run->stage + 1 == run->n_stages ? "the loss or a parameter is"
                                                                               : "a parameter is");
                }
                int64_t bad = r == -EBADMSG ? pipe_offender(run->pipe) : -1;
                if (bad >= 0)
                        drop_bad_neighbour(run, (uint32_t)bad, r);
                else if (r < 0)
                        return log_error_errno(r, "Stage %u failed: %m", run->stage + 1);
                net_run(run->net, r > 0 ? 0 : 2);
                if (o->poll)
                        o->poll(o->poll_userdata);
                run_after_step(run);
        }
        return -ECANCELED;
}

/* The stage's parameters for the next plan's owners, its samples, and a
 * checkpoint on the way out, so a restart goes on from here; then what the
 * stage queued last (DONE, say) leaves. The checkpoint's error, if any. */
static int run_hand_back(Run *run, int r, const volatile sig_atomic_t *stop) {
        const LocalRunOptions *o = run->o;
        Stage *s = pipe_stage(run->pipe);
        PipeStats st;
        int saved = 0;

        carry_save(run);
        /* the last checkpoint before the averager goes: it holds the outer
         * optimizer's anchor and momentum, written with it */
        if (o->checkpoint_dir && o->control && (r == PIPE_FINISHED || *stop))
                saved = save_checkpoint(run, true);
        averaging_stop(&run->av);
        run->finished = r == PIPE_FINISHED;
        if (o->model_params)
                memcpy(o->model_params + model_spec_params(&run->job->model, 0, run->pc.lo), s->params,
                       s->n_params * sizeof(float));
        if (o->ret_samples) {
                pipe_get_stats(run->pipe, &st);
                *o->ret_samples = run->stage == 0 ? st.samples : 0;
        }
        for (int i = 0; i < 100 && r == PIPE_FINISHED; i++)
                net_run(run->net, 5);
        for (int i = 0; i < 100 && run->quiesced && run->next_peer >= 0 &&
                        net_queued(run->net, (uint32_t)run->next_peer) > 0; i++)
                net_run(run->net, 5);
        return saved;
}

/* The last report of this run, its figures then kept by the daemon: the
 * next run (membership's next plan epoch) counts on from them. */
static void run_report_end(Run *run) {
        PipeStats st;
        if (!run->o->control)
                return;
        pipe_get_stats(run->pipe, &st);
        report(run, &st);
        control_report_run_end(run->o->control);
}

/* The result in the state directory (run/result.h). */
static void run_write_result(Run *run, const PipeStats *st) {
        RunResult res = { .test_accuracy = run->next ? -1 : st->test_acc, .test_loss = run->next ? -1 : st->test_loss,
                          .averaged = run->averaged };
        int r = run_result_write(run->o->checkpoint_dir, run->job->name, &res);
        if (r < 0)
                log_warning_errno(r, "Failed to write the result into %s: %m", run->o->checkpoint_dir);
}

/* "; pipeline 52.0 KiB/step, averaging 1.3 KiB/step", sent and received
 * together (ravnestctl swarm reads it back); "" before the first update. */
static void format_traffic(const NodeTraffic *t, char *buf, size_t len) {
        char p[FORMAT_BYTES_MAX], a[FORMAT_BYTES_MAX];
        if (!t->steps) {
                buf[0] = 0;
                return;
        }
        snprintf(buf, len, "; pipeline %s/step, averaging %s/step",
                 format_bytes(p, sizeof p, node_traffic_per_step(t->pipeline_sent, t->pipeline_received, t->steps)),
                 format_bytes(a, sizeof a, node_traffic_per_step(t->averaging_sent, t->averaging_received, t->steps)));
}

/* The last line: the test accuracy at the last stage, where the time went,
 * the bytes moved per update; and the result in the state directory. */
static void run_log_finished(Run *run) {
        PipeStats st;
        char why[96], traffic[96];

        pipe_get_stats(run->pipe, &st);
        if (run->o->checkpoint_dir)
                run_write_result(run, &st);
        NodeTraffic t = run_traffic(run, &st);
        format_traffic(&t, traffic, sizeof traffic);
        double total = ns_to_sec(now_ns() - run->start_ns);
        double busy = busy_while_training(&st, why, sizeof why);
        if (!run->next)
                log_info("Finished %s: test accuracy %.2f%%, test loss %.4f (stage %u of %u in cluster %u), "
                         "%.0f samples/s, busy %.0f%% while training (%s), %.0f%% in all%s",
                         run->job->name, 100 * st.test_acc, st.test_loss, run->stage + 1, run->n_stages, run->cluster + 1,
                         (double)st.samples / total, busy, why, 100 - pipe_percent(st.wait_ns, st.elapsed_ns), traffic);
        else
                log_info("Finished stage %u of %u in cluster %u: %lu updates, busy %.0f%% while training (%s), "
                         "%.0f%% in all%s",
                         run->stage + 1, run->n_stages, run->cluster + 1, (unsigned long)st.updates, busy, why,
                         100 - pipe_percent(st.wait_ns, st.elapsed_ns), traffic);
}

int pipeline_run(const StagePlan *plan, const Job *job, const Identity *id, const LocalRunOptions *o,
                 const volatile sig_atomic_t *stop) {
        const ConfigPipeline *p = plan->pipeline;
        _cleanup_(run_done) Run run = { .plan = plan, .job = job, .o = o, .prev_peer = -1, .next_peer = -1,
                                        .averaged = -1, .series = SERIES_CLOSED, .busy = -1 };
        int r;

        if ((r = run_place(&run, id)) < 0)
                return r;
        if ((r = ops_blas_set_threads(o->threads)) < 0)
                return log_error_errno(r, "Failed to start %d compute threads: %m", o->threads);
        if ((r = run_load_data(&run)) < 0 || (r = run_stage(&run)) < 0 || (r = run_links(&run)) < 0 ||
            (r = run_rings(&run, id)) < 0)
                return r;
        char start[80] = "";
        if (!p->synchronous && run.pc.sync_updates && run.stage == 0 && run.n_stages > 1)
                snprintf(start, sizeof start, " (no gradient late over the first %llu updates)",
                         (unsigned long long)run.pc.sync_updates);
        log_info("Stage %u of %u in cluster %u of %u: layers %d-%d, %zu parameters, micro-batch %d, %s schedule, "
                 "at most %d in flight%s",
                 run.stage + 1, run.n_stages, run.cluster + 1, p->n_clusters, run.pc.lo, run.pc.hi - 1,
                 pipe_stage(run.pipe)->n_params, p->micro_batch, p->synchronous ? "synchronous" : "asynchronous",
                 p->staleness, start);

        if (o->series_dir && (r = series_open(&run.series, o->series_dir, job->name)) < 0)
                log_full_errno(LOG_NOTICE, r, "No series of this run in %s: %m", o->series_dir);
        r = run_loop(&run, stop);
        PipeStats end;
        pipe_get_stats(run.pipe, &end);
        run_series_row(&run, &end, now_ns(), false); /* the last row: its evaluation */
        int saved = run_hand_back(&run, r, stop);
        run_report_end(&run);
        if (*stop || run.quiesced)
                return -ECANCELED;
        if (r < 0)
                return r;
        if (saved < 0) /* the stage's one product: not a success */
                return log_error_errno(saved, "Finished stage %u of %u in cluster %u, but its trained layers were "
                                              "not saved (above)", run.stage + 1, run.n_stages, run.cluster + 1);
        run_log_finished(&run);
        return 0;
}
