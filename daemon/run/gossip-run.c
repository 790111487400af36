/* run/gossip-run.c — see gossip-run.h. */
#include "gossip-run.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "averaging.h"
#include "collective/runtime-model.h"
#include "node.h"
#include "util/log.h"
#include "util/time-util.h"

#define PROBE_SMALL 256      /* values: a round that is all latency */
#define PROBE_ROUNDS 3       /* of each size; the fastest counts */
#define LOG_EVERY_NS (30 * 1000000000ULL)

static const GossipTopology topology_of[_RUNTIME_METHOD_MAX] = {
        [RUNTIME_ALLREDUCE] = GOSSIP_COMPLETE,
        [RUNTIME_RING] = GOSSIP_RING,
        [RUNTIME_EXP] = GOSSIP_EXP,
        [RUNTIME_ALT_EXP_RING] = GOSSIP_ALT_EXP_RING,
};

static void report(GossipRun *gr) {
        if (gr->control)
                control_report_averaging(gr->control, &gr->figures);
}

static void set_method(GossipRun *gr, const char *choice) {
        snprintf(gr->figures.method, sizeof gr->figures.method, "%s%s", gr->is_auto ? "auto: " : "gossip ", choice);
}

typedef struct GossipNew {
        GossipConfig *config;
        Gossip **ret;
} GossipNew;

/* gossip_new(), which listens, as node_listen_patiently() tries it. */
static int gossip_new_waiting(void *userdata, unsigned wait_ms) {
        GossipNew *gn = userdata;
        gn->config->coll.listen_wait_ms = wait_ms;
        return gossip_new(gn->config, gn->ret);
}

int gossip_run_start(GossipRun *gr, const AveragingGroup *g, const Identity *id, size_t n_params, Control *control) {
        const ConfigAveraging *ca = g->settings;
        _cleanup_(freep) CollMember *members = NULL;
        GossipConfig gc;
        NetConfig nc;
        int r;

        memset(gr, 0, sizeof *gr);
        if (!ca->enabled || (ca->method != CONFIG_AVERAGING_GOSSIP && ca->method != CONFIG_AVERAGING_AUTO))
                return 0;
        gossip_config_defaults(&gc);
        r = averaging_coll_config(g, id, n_params, &gc.coll, &nc, &members);
        if (r < 0)
                return r;
        gr->self = gc.coll.self;
        gc.topology = ca->method == CONFIG_AVERAGING_GOSSIP ? (GossipTopology)ca->topology : GOSSIP_ALT_EXP_RING;
        gc.weight = ca->weight;
        gc.len = n_params;
        gc.listen_port = ca->listen.port;
        r = node_listen_patiently(ca->listen.host, ca->listen.port, gossip_new_waiting,
                                  &(GossipNew){ .config = &gc, .ret = &gr->g });
        if (r < 0)
                return log_error_errno(r, "Failed to start gossip averaging on %s:%u: %m", ca->listen.host,
                                       ca->listen.port);
        r = gossip_start(gr->g);
        if (r < 0) {
                gr->g = gossip_free(gr->g);
                return log_error_errno(r, "Failed to start the gossip thread: %m");
        }
        gr->control = control;
        gr->is_auto = ca->method == CONFIG_AVERAGING_AUTO;
        gr->n_members = (unsigned)ca->n_members;
        gr->n_params = n_params;
        gr->payload = (CollPayload)ca->payload;
        gr->join_timeout_ms = ca->join_timeout_ms;
        gr->members = ca->members;
        gr->model = gc.coll.model;
        gr->active = true;
        gr->last_log_ns = now_ns();
        gr->figures.nodes = gr->n_members;
        gr->figures.params = n_params;
        set_method(gr, gr->is_auto ? "measuring" : gossip_topology_to_string(gc.topology));
        report(gr);
        char w[32];
        if (ca->weight > 0)
                snprintf(w, sizeof w, "%g", ca->weight);
        else
                snprintf(w, sizeof w, "1/|G|");
        if (gr->is_auto)
                log_info("Averaging with %u members (auto%s%s), member %u, listening on %s:%u: measuring %u steps "
                         "and the links, then all-reduce or gossip as the runtime model says (self weight %s)",
                         gr->n_members, ca->payload ? ", " : "", ca->payload ? coll_payload_names[ca->payload] : "", gr->self + 1, ca->listen.host, ca->listen.port,
                         GOSSIP_RUN_PROBE_STEPS, w);
        else
                log_info("Averaging with %u members (gossip, topology %s%s%s), member %u, every step, self weight %s, "
                         "listening on %s:%u",
                         gr->n_members, gossip_topology_to_string(gc.topology), ca->payload ? ", " : "",
                         ca->payload ? coll_payload_names[ca->payload] : "",
                         gr->self + 1, w, ca->listen.host, ca->listen.port);
        return 0;
}

/* Bytes one member sends in a ring all-reduce of len values among p. */
static double ring_bytes(const GossipRun *gr, size_t len, unsigned p) {
        return 2.0 * (p - 1) / p * (double)coll_payload_size(coll_payload_dtype(gr->payload), len);
}

/* The probe rounds: the fastest small and the fastest full round give two
 * points of time = latency part + bytes / bandwidth. Returns the
 * participants of the last round, or -errno. */
/* The members dial each other as they come up: wait for them (at most the
 * join timeout), so the first rounds find their groups. */
static void wait_for_members(GossipRun *gr) {
        for (unsigned i = 0; i < gr->join_timeout_ms / 10 && gossip_connected(gr->g) + 1 < gr->n_members; i++)
                usleep(10 * 1000);
}

static int probe_links(GossipRun *gr, float *params, double *ret_mbit, double *ret_latency_ms) {
        _cleanup_(freep) float *buf = malloc(gr->n_params * sizeof(float));
        double best[2] = { INFINITY, INFINITY };
        size_t len[2] = { MIN((size_t)PROBE_SMALL, gr->n_params), gr->n_params };
        unsigned p = 0;
        int r = 0;

        if (!buf)
                return -ENOMEM;
        wait_for_members(gr);
        for (int size = 0; size < 2; size++)
                for (int k = 0; k < PROBE_ROUNDS; k++) {
                        uint64_t ns;
                        memcpy(buf, params, len[size] * sizeof(float)); /* real values: same work as a round */
                        r = gossip_average(gr->g, buf, len[size], &ns);
                        if (r < 0)
                                return r;
                        if (r <= 1)
                                return r; /* alone: nothing to measure */
                        p = (unsigned)r;
                        best[size] = fmin(best[size], (double)ns / 1e6);
                }
        double b0 = ring_bytes(gr, len[0], p), b1 = ring_bytes(gr, len[1], p);
        double slope = b1 > b0 && best[1] > best[0] ? (best[1] - best[0]) / (b1 - b0) : best[1] / b1; /* ms/byte */
        double fixed = fmax(0, best[0] - b0 * slope);
        *ret_mbit = 8.0 * 1e3 / slope / 1e6; /* ms/byte to Mbit/s */
        /* a ring round from START: 2(p-1) steps, each a one-way latency */
        *ret_latency_ms = fixed / (2.0 * (p - 1));
        return (int)p;
}

static void log_prediction(GossipRun *gr, const RuntimeModelInput *in, const RuntimeModelResult *res,
                           const char *what) {
        log_info("Runtime model for %u members, %zu parameters: compute %.1f ms/step (sd %.1f), %.0f Mbit/s, "
                 "latency %.3f ms, %.1f cores: predicted ms/iteration allreduce %.1f, ring %.1f, exp %.1f, "
                 "alt-exp-ring %.1f; %s %s (%.2fx the rate of all-reduce)",
                 in->nodes, in->params, in->compute_ms, in->compute_sd_ms, in->bandwidth_mbit, in->latency_ms,
                 in->cores, res->method[RUNTIME_ALLREDUCE].iter_ms, res->method[RUNTIME_RING].iter_ms,
                 res->method[RUNTIME_EXP].iter_ms, res->method[RUNTIME_ALT_EXP_RING].iter_ms, what,
                 runtime_model_method_name(res->recommended), res->speedup);
}

/* Measure the links, agree on the figures, and (auto) choose. Between a
 * mix and a send. */
static void measure_and_decide(GossipRun *gr, float *params) {
        double mbit = 0, lat = 0, mean = gr->n_timed ? gr->sum_ms / gr->n_timed : 0,
               meansq = gr->n_timed ? gr->sumsq_ms / gr->n_timed : 0;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        const char *why = NULL;
        int r;

        r = probe_links(gr, params, &mbit, &lat);
        if (r < 0)
                why = strerror(-r);
        else if ((unsigned)r < gr->n_members)
                why = "not every member took part";
        float v[5] = { (float)mean, (float)meansq, (float)mbit, (float)lat, (float)(cpus > 0 ? cpus : 1) };
        if (!why) {
                /* the same bits on every participant: the same input, the same choice */
                r = gossip_average(gr->g, v, ELEMENTSOF(v), NULL);
                if (r < 0)
                        why = strerror(-r);
                else if ((unsigned)r < gr->n_members)
                        why = "not every member took part";
        }
        RuntimeModelInput in;
        RuntimeModelResult res;
        runtime_model_defaults(&in);
        in.compute_ms = v[0];
        in.compute_sd_ms = sqrt(fmax(0, (double)v[1] - (double)v[0] * v[0]));
        in.bandwidth_mbit = v[2];
        in.latency_ms = v[3];
        in.cores = v[4];
        in.nodes = gr->n_members;
        in.params = gr->n_params;
        in.payload = gr->payload;
        bool modelled = runtime_model_predict(&in, &res) >= 0;

        gr->figures.compute_ms = in.compute_ms;
        gr->figures.compute_sd_ms = in.compute_sd_ms;
        gr->figures.bandwidth_mbit = in.bandwidth_mbit;
        gr->figures.latency_ms = in.latency_ms;
        gr->figures.cores = in.cores;
        if (!gr->is_auto) {
                if (modelled)
                        log_prediction(gr, &in, &res, "it would choose");
                report(gr);
                return;
        }
        GossipTopology topo = GOSSIP_ALT_EXP_RING;
        if (!why && modelled) {
                topo = topology_of[res.recommended];
                log_prediction(gr, &in, &res, "every member chose");
        } else {
                if (!why)
                        why = "the figures cannot be modelled";
                log_warning("Averaging auto: %s (%s): chose alt-exp-ring, which copes best with members missing",
                            "no agreement on the figures", why);
        }
        r = gossip_set_topology(gr->g, topo);
        if (r < 0)
                log_warning_errno(r, "Failed to set the gossip topology: %m");
        set_method(gr, topo == GOSSIP_COMPLETE ? "allreduce" : gossip_topology_to_string(topo));
        gr->decided = true;
        log_info("Averaging auto: %s from step %llu on", gr->figures.method + 6, (unsigned long long)gr->t);
        report(gr);
}

/* An exchange failed: said once (they fail alike, step after step). */
static void log_failed(GossipRun *gr, int error) {
        if (gr->failed_logged)
                return;
        if (error == -EBADE)
                log_error("Gossip exchange failed: the members it could exchange with train another model; "
                          "the parameters kept their values (said once)");
        else
                log_warning("Gossip exchange failed: %s; the parameters kept their values (said once)",
                            strerror(-error));
        gr->failed_logged = true;
}

static void log_stats(GossipRun *gr, bool force) {
        GossipStats s;
        gossip_get_stats(gr->g, &s);
        uint64_t now = now_ns();
        if (s.foreign.count != gr->seen.foreign.count)
                averaging_log_foreign(gr->members, gr->n_members, &gr->model, &s.foreign,
                                      s.foreign.count - gr->seen.foreign.count);
        if (s.lost.count != gr->seen.lost.count)
                averaging_log_link_lost(gr->members, gr->n_members, &s.lost, s.lost.count - gr->seen.lost.count);
        if (s.refused.count != gr->refused_logged && now - gr->refused_logged_ns >= 2 * NSEC_PER_SEC) {
                averaging_log_refused(&s.refused, s.refused.count - gr->refused_logged); /* a line per 2 s */
                gr->refused_logged = s.refused.count;
                gr->refused_logged_ns = now;
        }
        if (s.failed != gr->seen.failed)
                log_failed(gr, s.last_error);
        if (gr->seen.exchanges == 0 && s.exchanges > 0)
                log_info("Gossip: first exchange done with %u members", s.last_participants);
        if (s.exchanges != gr->seen.exchanges)
                gr->last_exchange_usec = now_realtime_usec();
        if (force || now - gr->last_log_ns >= LOG_EVERY_NS) {
                log_info("Gossip: %llu exchanges (%llu failed, %llu alone), %.1f MiB sent, %.1f s waited, "
                         "%.1f ms per exchange",
                         (unsigned long long)s.exchanges, (unsigned long long)s.failed, (unsigned long long)s.alone,
                         (double)s.bytes_sent / (1 << 20), (double)s.wait_ns / 1e9,
                         s.exchanges ? (double)s.exchange_ns / 1e6 / (double)(s.exchanges + s.failed) : 0.0);
                gr->last_log_ns = now;
        }
        gr->seen = s;
}

void gossip_run_step(GossipRun *gr, float *params, uint64_t samples) {
        uint64_t start = now_ns();
        int r;
        (void)samples;

        if (!gr->active)
                return;
        /* the step just done, from the end of the last callback; the first
         * one warms up */
        if (gr->last_end_ns && gr->t >= 2 && gr->t <= GOSSIP_RUN_PROBE_STEPS) {
                double ms = (double)(start - gr->last_end_ns) / 1e6;
                gr->sum_ms += ms;
                gr->sumsq_ms += ms * ms;
                gr->n_timed++;
                gr->figures.compute_ms = gr->sum_ms / gr->n_timed;
                gr->figures.compute_sd_ms = sqrt(fmax(0, gr->sumsq_ms / gr->n_timed -
                                                             gr->figures.compute_ms * gr->figures.compute_ms));
                report(gr);
        }
        bool mixing = !gr->is_auto || gr->decided;
        if (mixing) {
                r = gossip_mix(gr->g, params);
                if (r < 0 && r != -ENOMSG)
                        log_failed(gr, r);
        }
        if (gr->t == GOSSIP_RUN_PROBE_STEPS)
                measure_and_decide(gr, params);
        if (!gr->is_auto || gr->decided) {
                if (gr->t == 0)
                        wait_for_members(gr);
                r = gossip_send(gr->g, params, gr->t);
                if (r < 0 && !gr->failed_logged) {
                        log_warning_errno(r, "Gossip send failed: %m (said once)");
                        gr->failed_logged = true;
                }
        }
        gr->t++;
        log_stats(gr, false);
        gr->last_end_ns = now_ns();
}

void gossip_run_finish(GossipRun *gr, bool wait) {
        if (!gr->active)
                return;
        if (!wait) { /* stopping: the others are going too */
                log_stats(gr, true);
                return;
        }
        /* the trained model is evaluated and gone: wait for the exchange
         * still out (a partner may need our pieces) and drop its mix */
        _cleanup_(freep) float *scratch = calloc(gr->n_params, sizeof(float));
        int r = scratch ? gossip_mix(gr->g, scratch) : -ENOMEM;
        if (r < 0 && r != -ENOMSG)
                log_warning_errno(r, "The last gossip exchange failed: %m");
        log_stats(gr, true);
}

void gossip_run_network(GossipRun *gr, NodeNetwork *n) {
        if (!gr->active)
                return;
        GossipStats s;
        gossip_get_stats(gr->g, &s);
        n->peers += gossip_connected(gr->g);
        n->bytes_sent += s.bytes_sent;
        n->bytes_received += s.bytes_received;
        n->traffic.averaging_sent += s.bytes_sent;
        n->traffic.averaging_received += s.bytes_received;
        n->last_averaging_usec = gr->last_exchange_usec;
        n->rounds_done += s.exchanges;
}

void gossip_run_stop(GossipRun *gr) {
        gr->g = gossip_free(gr->g);
        gr->active = false;
}
