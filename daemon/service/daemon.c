/* service/daemon.c */
#include "daemon.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "net/net.h"
#include "run/coordinator.h"
#include "run/events.h"
#include "run/membership.h"
#include "run/pipeline-run.h"
#include "util/log.h"
#include "util/time-util.h"

#define IDLE_SAMPLE_USEC 500000ULL
#define STATUS_USEC (5 * USEC_PER_SEC)
#define WEB_PUBLISH_USEC USEC_PER_SEC
#define RELAY_WATCH_USEC (10 * USEC_PER_SEC)
#define RELAY_LOG_USEC (10 * 60 * USEC_PER_SEC)

/* ---- the compute thread ------------------------------------------------ */

static void report_network(Daemon *d) {
        NodeNetwork n = {};
        if (d->node.active) {
                NetStats st;
                net_get_stats(d->node.net, &st);
                n.peers = st.links_open;
                n.paused_peers = d->node.paused_peers;
                n.bytes_sent = n.traffic.peers_sent = st.bytes_sent;
                n.bytes_received = n.traffic.peers_received = st.bytes_received;
                snprintf(n.io_backend, sizeof n.io_backend, "%s", net_backend_name(d->node.net));
        }
        /* the averager's bytes are kept after it stopped (a member that
         * finished): BytesSent and BytesReceived count over every link since
         * the start, and never go down */
        if (d->averaging.active)
                n.peers += d->averaging.seen.connected;
        n.bytes_sent += d->averaging.seen.bytes_sent;
        n.bytes_received += d->averaging.seen.bytes_received;
        /* a member's: kept after training, while it serves its peers */
        averaging_report_network(&d->averaging, &n);
        n.traffic.averaging_sent = d->averaging.seen.bytes_sent;
        n.traffic.averaging_received = d->averaging.seen.bytes_received;
        n.traffic.steps = d->steps;
        gossip_run_network(&d->gossip, &n);
        control_report_network(&d->control, &n);
}

static void poll_node(void *userdata) {
        Daemon *d = userdata;
        NodeState state;
        char reason[128];
        control_snapshot(&d->control, &state, NULL, reason, NULL, NULL);
        node_tell_paused(&d->node, state == NODE_PAUSED, reason);
        node_poll(&d->node, 0);
        uint64_t now = now_ns();
        /* a pipeline's stage (membership's too) reports its own network:
         * one reporter, or the figures flap between two */
        if (!d->config.pipeline.enabled && !d->config.membership.enabled &&
            now - d->last_report_ns > 250 * 1000000ULL) {
                d->last_report_ns = now;
                report_network(d);
        }
}

static void step_averaging(void *userdata, float *params, uint64_t samples) {
        Daemon *d = userdata;
        d->steps++;
        averaging_step(&d->averaging, params, samples);
}

static void begin_averaging(void *userdata, float *params, Optim *optim) {
        Daemon *d = userdata;
        averaging_begin(&d->averaging, params, optim, true, NULL, NULL);
}

/* After the last step, before the evaluation: every member evaluates, and
 * keeps, the one averaged model (when all take part). */
static void last_round_averaging(void *userdata, float *params) {
        Daemon *d = userdata;
        (void)averaging_final(&d->averaging, params, poll_node, d);
}

static void step_gossip(void *userdata, float *params, uint64_t samples) {
        Daemon *d = userdata;
        d->steps++;
        gossip_run_step(&d->gossip, params, samples);
}

/* The transport's settings for this node's links (a pipeline's, an
 * averaging group's). */
static int net_config(const Config *c, const Identity *id, NetConfig *ret) {
        Diag diag = {};
        int r = config_net(c, id, ret, &diag);
        return r < 0 ? log_error_errno(r, "Invalid configuration: %s", diag.text) : 0;
}

/* Membership: the stage, the cluster and the rings come from the
 * coordinator (this node's, when it coordinates). */
static int run_membership(Daemon *d, const LocalRunOptions *o) {
        Config *c = &d->config;
        Coordinator co = {};
        int r = 0;

        if (c->membership.coordinate &&
            (r = coordinator_start(&co, c, &d->job, &d->node.identity, &d->control)) < 0)
                return r;
        if (c->membership.train)
                r = membership_run(c, &d->job, &d->node.identity, o, &d->control.stop);
        else {
                log_info("Coordinating only (membership.train = false)");
                NodeTraining t = { .cluster = -1, .stage = -1, .loss = -1.0, .busy = -1.0, .test_accuracy = -1.0,
                                   .test_loss = -1.0 };
                snprintf(t.role, sizeof t.role, "coordinator");
                snprintf(t.job, sizeof t.job, "%s", d->job.name);
                control_report_training(&d->control, &t);
                control_set_state(&d->control, NODE_COORDINATING);
                while (!d->control.stop) {
                        if (d->node.active)
                                node_poll(&d->node, 200);
                        else
                                usleep(200 * 1000);
                        /* its links are the members'; their bytes the coordinator adds */
                        control_report_network(&d->control, &(NodeNetwork){ .peers = coordinator_members(&co) });
                }
        }
        coordinator_stop(&co);
        return r < 0 ? r : d->control.stop ? -ECANCELED : 0;
}

static int run_job(Daemon *d) {
        Config *c = &d->config;
        LocalRunOptions o = d->options.run;
        int r;

        r = node_start(&d->node, c);
        if (r < 0)
                return r;
        if (node_configured(c)) { /* for the status page */
                identity_to_hex(d->node.identity.pk, d->identity_hex);
                __atomic_store_n(&d->identity_known, true, __ATOMIC_RELEASE);
        }
        o.poll = poll_node;
        o.poll_userdata = d;
        o.control = &d->control;
        /* the state directory is a configuration's: a job run by hand
         * writes nothing into the system service's (no checkpoint, no series) */
        o.checkpoint_dir = c->path[0] ? c->state_directory : NULL;
        o.load_checkpoint = c->checkpoint.load;
        o.series_dir = o.checkpoint_dir;
        if (c->membership.enabled)
                return run_membership(d, &o);
        NetConfig nc = {};
        if ((c->pipeline.enabled || c->averaging.enabled) && (r = net_config(c, &d->node.identity, &nc)) < 0)
                return r;
        AveragingGroup group = { .settings = &c->averaging, .net = &nc, .source = c->path, .model = &d->job.model };
        if (c->pipeline.enabled) { /* a stage of a cluster: averaging is the pipeline's */
                StagePlan plan = { .source = c->path, .pipeline = &c->pipeline, .averaging = group };
                return pipeline_run(&plan, &d->job, &d->node.identity, &o, &d->control.stop);
        }

        size_t n_params = model_spec_params(&d->job.model, 0, d->job.model.n_layers);
        if (c->averaging.method == CONFIG_AVERAGING_GOSSIP || c->averaging.method == CONFIG_AVERAGING_AUTO)
                r = gossip_run_start(&d->gossip, &group, &d->node.identity, n_params, &d->control);
        else
                r = averaging_start(&d->averaging, &group, &d->node.identity, n_params, NULL, 0);
        if (r < 0)
                return r;
        if (d->averaging.active) { /* every member trains its own shard of the data */
                o.step = step_averaging;
                o.begin = begin_averaging;
                o.last_round = last_round_averaging;
                o.step_userdata = d;
                o.shard = (int)d->averaging.self;
                o.n_shards = (int)d->averaging.n_members;
                averaging_report_started(&d->averaging, &group, n_params, &d->control);
        } else if (d->gossip.active) { /* the same, mixing every step */
                o.step = step_gossip;
                o.step_userdata = d;
                o.shard = (int)d->gossip.self;
                o.n_shards = (int)d->gossip.n_members;
        }
        r = local_run(&d->job, &o, &d->control.stop, NULL);
        averaging_stop(&d->averaging);
        report_network(d); /* the last round's bytes, whether the node stays or not */
        gossip_run_finish(&d->gossip, r >= 0 && !d->control.stop);
        /* With a network, the node stays and serves its peers. */
        if (r >= 0 && d->node.active && !d->control.stop) {
                log_info("Training done; serving peers until stopped");
                control_set_state(&d->control, NODE_FINISHED);
                while (!d->control.stop) {
                        node_poll(&d->node, 200);
                        report_network(d);
                }
        }
        gossip_run_stop(&d->gossip); /* after serving: the others' last exchanges may need this node */
        return r;
}

static void *worker_main(void *userdata) {
        Daemon *d = userdata;
        int r = run_job(d);

        node_stop(&d->node);
        d->worker_result = r;
        control_set_state(&d->control, r < 0 && r != -ECANCELED ? NODE_FAILED :
                                       d->control.stop ? NODE_STOPPING : NODE_FINISHED);
        __atomic_store_n(&d->worker_done, true, __ATOMIC_RELEASE);
        uint64_t one = 1;
        (void)!write(d->control.event_fd, &one, sizeof one);
        return NULL;
}

/* ---- the control thread ------------------------------------------------ */

static bool configured(const Daemon *d, const Config *c) {
        return node_configured(c) || d->options.standalone;
}

/* Signals. OpenBLAS starts its threads before main() runs, with every
 * signal unblocked, so a signal may land on any thread: the handler only
 * records it and wakes the event loop through a pipe (a signalfd would miss
 * what lands elsewhere). */
static volatile sig_atomic_t signals_pending[_NSIG];
static int signal_pipe[2] = { -1, -1 };

static void on_signal(int sig) {
        int saved = errno;
        signals_pending[sig] = 1;
        (void)!write(signal_pipe[1], "", 1);
        errno = saved;
}

static int install_signals(bool debug_hang) {
        struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESTART };
        int sigs[] = { SIGTERM, SIGINT, SIGHUP, debug_hang ? SIGUSR2 : 0 };
        sigset_t mask;

        if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
                return -errno;
        /* a stray SIGUSR2 (without the debug variable) or a peer gone
         * mid-write must not kill the node */
        signal(SIGPIPE, SIG_IGN);
        if (!debug_hang)
                signal(SIGUSR2, SIG_IGN);
        sigemptyset(&sa.sa_mask);
        sigemptyset(&mask);
        for (size_t i = 0; i < ELEMENTSOF(sigs) && sigs[i]; i++) {
                sigaction(sigs[i], &sa, NULL);
                sigaddset(&mask, sigs[i]);
        }
        /* whoever started us may have blocked them */
        pthread_sigmask(SIG_UNBLOCK, &mask, NULL);
        return 0;
}

void daemon_training_status(const NodeStatus *st, char *buf, size_t len) {
        const NodeTraining *t = &st->training;
        char epoch[48] = "", loss[32] = "", waiting[96] = "";
        if (t->epoch > 0) /* where the node reads the data */
                snprintf(epoch, sizeof epoch, "epoch %d/%d, ", t->epoch, t->epochs);
        if (t->loss >= 0)
                snprintf(loss, sizeof loss, "loss %.4f, ", t->loss);
        if (t->waiting_for[0])
                snprintf(waiting, sizeof waiting, ", waiting for %s", t->waiting_for);
        snprintf(buf, len, "Training %s: %sstep %llu, %s%.0f samples/s, %u peers%s", t->job, epoch,
                 (unsigned long long)t->step, loss, t->samples_per_sec, st->network.peers, waiting);
}

static void send_status(Daemon *d) {
        NodeState state;
        NodeStatus st;
        char reason[128], text[PATH_MAX + 512];

        control_snapshot(&d->control, &state, &st, reason, NULL, NULL);
        const NodeTraining *t = &st.training;
        switch (state) {
        case NODE_UNCONFIGURED:
                if (st.reload_error[0])
                        snprintf(text, sizeof text, "Unconfigured: reloading %s failed: %s",
                                 d->config.path[0] ? d->config.path : CONFIG_PATH, st.reload_error);
                else
                        snprintf(text, sizeof text, "Unconfigured: no network in %s, see ravnestd.conf(5)",
                                 d->config.path[0] ? d->config.path : CONFIG_PATH);
                break;
        case NODE_TRAINING:
                daemon_training_status(&st, text, sizeof text);
                break;
        case NODE_PAUSED:
                snprintf(text, sizeof text, "Paused: %s", reason);
                break;
        case NODE_COORDINATING:
                snprintf(text, sizeof text, "Coordinating %s: %u members", t->job, st.network.peers);
                break;
        case NODE_FINISHED:
                if (t->test_accuracy >= 0)
                        snprintf(text, sizeof text, "Finished %s: test accuracy %.2f%%", t->job,
                                 100 * t->test_accuracy);
                else
                        snprintf(text, sizeof text, "Finished %s", t->job);
                break;
        default:
                snprintf(text, sizeof text, "%c%s", node_state_to_string(state)[0] - 32,
                         node_state_to_string(state) + 1);
        }
        sd_notifyf(false, "STATUS=%s", text);
}

static void on_state(Daemon *d) {
        NodeState state;
        char reason[128];

        control_snapshot(&d->control, &state, NULL, reason, NULL, NULL);
        if (state != d->last_state) {
                if (state == NODE_PAUSED) {
                        char fields[200];
                        snprintf(fields, sizeof fields, "REASON=%s", reason);
                        log_event(LOG_NOTICE, EVENT_PAUSED, fields, "Paused training: %s", reason);
                } else if (d->last_state == NODE_PAUSED && state == NODE_TRAINING)
                        log_event(LOG_NOTICE, EVENT_RESUMED, NULL, "Resumed training");
                d->last_state = state;
        }
        if (!d->ready_sent && state != NODE_STARTING && state != NODE_FAILED) {
                /* config loaded, sockets bound, bus name held: ready (a node
                 * that failed to start exits, and systemctl start fails) */
                sd_notify(false, "READY=1");
                d->ready_sent = true;
        }
        if (d->has_unconfigured && state != NODE_STARTING && state != NODE_FAILED) {
                config_free(&d->unconfigured); /* it got going: no way back */
                d->has_unconfigured = false;
        }
        bus_state_changed(&d->bus);
        send_status(d);
}

static void apply_live_settings(Daemon *d, const Config *c);

/* The compute thread a reload started on an unconfigured node failed
 * before it trained: the configuration from before is taken back. */
static void back_to_unconfigured(Daemon *d, int r) {
        const char *path = d->config.path[0] ? d->config.path : CONFIG_PATH;
        char fields[PATH_MAX + 64];
        config_free(&d->config);
        d->config = d->unconfigured;
        d->has_unconfigured = false;
        apply_live_settings(d, &d->config);
        __atomic_store_n(&d->worker_done, false, __ATOMIC_RELEASE);
        char why[128];
        snprintf(why, sizeof why, "training could not start (%s), see journalctl -u ravnestd", strerror(-r));
        control_set_reload_error(&d->control, why);
        snprintf(fields, sizeof fields, "RESULT=failed\nREASON=%s", strerror(-r));
        log_event(LOG_ERR, EVENT_RELOAD, fields, "Training with the configuration reloaded from %s could not start "
                  "(above): the node is unconfigured again", path);
        control_set_state(&d->control, NODE_UNCONFIGURED);
        on_state(d);
}

static int on_control_event(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Daemon *d = userdata;
        (void)s, (void)fd, (void)revents;

        control_clear_event(&d->control);
        on_state(d);
        if (__atomic_load_n(&d->worker_done, __ATOMIC_ACQUIRE)) {
                int r = d->worker_result;
                pthread_join(d->worker, NULL);
                d->worker_started = false;
                if (r < 0 && r != -ECANCELED && d->has_unconfigured && !d->stopping) {
                        back_to_unconfigured(d, r);
                        return 0;
                }
                if (d->stopping && d->stopped_starting)
                        r = -ECANCELED;
                sd_event_exit(d->event, r == -EINVAL ? EX_CONFIG : r < 0 && r != -ECANCELED ? EXIT_FAILURE : 0);
        }
        return 0;
}

static void on_stop_signal(Daemon *d, int sig) {
        NodeState state;

        control_snapshot(&d->control, &state, NULL, NULL, NULL, NULL);
        if (!d->stopping) {
                log_debug("Received %s, stopping", strsignal(sig));
                /* what the start still waits for (a listen address that
                 * is taken) no longer matters: its failure is no failure */
                d->stopped_starting = state == NODE_STARTING;
        }
        d->stopping = true;
        d->stop_signal = sig;
        sd_notify(false, "STOPPING=1");
        control_request_stop(&d->control);
        if (!d->worker_started)
                sd_event_exit(d->event, 0);
}

static void on_hang_signal(void) {
        /* RAVNESTD_DEBUG_HANG: the watchdog test's hung control loop. */
        log_warning("SIGUSR2 with RAVNESTD_DEBUG_HANG set: the control loop hangs now");
        for (;;)
                sleep(3600);
}

static int start_worker(Daemon *d);
static int start_web(Daemon *d);
static int start_relay(Daemon *d);

static void on_reload_signal(Daemon *d) {
        Config n;
        Diag diag = {};
        char fields[sizeof diag.text + 64];
        int r;

        sd_notify(false, "RELOADING=1");
        const char *path = d->config.path[0] ? d->config.path : CONFIG_PATH;
        r = config_load(path, &n, &diag);
        if (r < 0) {
                diag_join(&diag); /* every error, on the one line of the log and of the status */
                snprintf(fields, sizeof fields, "RESULT=failed\nREASON=%s", diag.text);
                log_event(LOG_ERR, EVENT_RELOAD, fields, "Reloading failed, keeping the running configuration: %s",
                          diag.text);
                control_set_reload_error(&d->control, diag.text);
                send_status(d); /* an unconfigured node says why it still is */
                sd_notify(false, "READY=1");
                return;
        }
        NodeState state;
        control_snapshot(&d->control, &state, NULL, NULL, NULL, NULL);
        if (state == NODE_UNCONFIGURED && configured(d, &n)) {
                /* nothing runs yet: take the whole new configuration, or
                 * none of it if training cannot start with it */
                Config old = d->config;
                d->config = n;
                apply_live_settings(d, &d->config);
                control_set_state(&d->control, NODE_STARTING);
                r = start_worker(d);
                if (r < 0) {
                        config_free(&d->config);
                        d->config = old;
                        apply_live_settings(d, &d->config);
                        control_set_state(&d->control, NODE_UNCONFIGURED);
                        control_set_reload_error(&d->control, "training cannot start with it, see journalctl -u "
                                                 "ravnestd");
                        log_event(LOG_ERR, EVENT_RELOAD, "RESULT=failed",
                                  "Reloading %s failed: training cannot start with it (above); the node stays "
                                  "unconfigured", path);
                } else {
                        d->unconfigured = old; /* until it trains */
                        d->has_unconfigured = true;
                        control_set_reload_error(&d->control, NULL);
                        /* what the new file serves beside training (a failure is said, and training goes on) */
                        if (!d->web)
                                (void)start_web(d);
                        if (!d->relay)
                                (void)start_relay(d);
                        log_event(LOG_NOTICE, EVENT_RELOAD, "RESULT=ok", "Reloaded %s: the node is configured now",
                                  path);
                }
        } else {
                apply_live_settings(d, &n);
                d->config.idle = n.idle;
                d->config.checkpoint = n.checkpoint;
                config_free(&n);
                control_set_reload_error(&d->control, NULL);
                log_event(LOG_NOTICE, EVENT_RELOAD, "RESULT=ok",
                          "Reloaded %s: idle and checkpoint settings applied; network, averaging and pipeline "
                          "changes take effect at the next start", path);
        }
        sd_notify(false, "READY=1");
        send_status(d);
}

static int on_signal_pipe(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Daemon *d = userdata;
        char buf[64];
        (void)s, (void)revents;

        while (read(fd, buf, sizeof buf) > 0)
                ;
        if (signals_pending[SIGUSR2])
                on_hang_signal();
        for (int sig = 1; sig < _NSIG; sig++) {
                if (!signals_pending[sig])
                        continue;
                signals_pending[sig] = 0;
                if (sig == SIGHUP)
                        on_reload_signal(d);
                else if (sig == SIGTERM || sig == SIGINT)
                        on_stop_signal(d, sig);
        }
        return 0;
}

static int on_idle_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Daemon *d = userdata;
        IdleSample smp;
        (void)usec;

        uint64_t now = now_ns();
        if (idle_monitor_sample(&d->idle, idle_process_cpu_ns(), now, &smp) >= 0)
                (void)idle_update(&d->idle, &smp, now);
        /* every sample: the reason moves while paused ("other processes use
         * 1.80 CPU, ...", then "idle for 2 s, resuming after 3 s") */
        control_set_pause(&d->control, CONTROL_PAUSE_IDLE, d->idle.paused, d->idle.reason);
        bus_state_changed(&d->bus);
        sd_event_source_set_time_relative(s, IDLE_SAMPLE_USEC);
        return 0;
}

static int on_checkpoint_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Daemon *d = userdata;
        NodeState state;
        (void)usec;

        control_snapshot(&d->control, &state, NULL, NULL, NULL, NULL);
        if (state == NODE_TRAINING || state == NODE_PAUSED)
                control_request_checkpoint(&d->control);
        if (d->config.checkpoint.interval_s)
                sd_event_source_set_time_relative(s, d->config.checkpoint.interval_s * USEC_PER_SEC);
        return 0;
}

static int on_status_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        (void)usec;
        send_status(userdata);
        log_ratelimit_flush(); /* what rate limits left out of the intervals that ended */
        sd_event_source_set_time_relative(s, STATUS_USEC);
        return 0;
}

/* ---- the metrics endpoint ---------------------------------------------- */

/* What the HTTP thread shows: a copy, so it never takes the compute thread's lock. */
static void publish_web(Daemon *d) {
        WebSnapshot s = {};
        unsigned pause;

        control_snapshot(&d->control, &s.state, &s.status, s.reason, NULL, NULL);
        pthread_mutex_lock(&d->control.lock);
        pause = d->control.pause;
        pthread_mutex_unlock(&d->control.lock);
        s.idle = pause & CONTROL_PAUSE_IDLE;
        if (__atomic_load_n(&d->identity_known, __ATOMIC_ACQUIRE))
                memcpy(s.identity, d->identity_hex, sizeof s.identity);
        web_server_publish(d->web, &s);
}

static int on_web_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        (void)usec;
        publish_web(userdata);
        sd_event_source_set_time_relative(s, WEB_PUBLISH_USEC);
        sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        return 0;
}

static int start_web(Daemon *d) {
        const ConfigMetrics *m = &d->config.metrics;
        int r;

        if (!m->enabled)
                return 0;
        r = web_server_start(m, &d->web);
        if (r < 0)
                return log_error_errno(r, "Failed to serve metrics on %s:%u (metrics.listen in %s): %m", m->listen.host,
                                       m->listen.port, d->config.path);
        r = sd_event_add_time_relative(d->event, &d->web_timer, CLOCK_MONOTONIC, 0, 0, on_web_timer, d);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the event loop: %m");
        log_info("Serving metrics and the status page on http://%s%s%s:%u/ (at most %u connections)",
                 strchr(m->listen.host, ':') ? "[" : "", m->listen.host, strchr(m->listen.host, ':') ? "]" : "",
                 m->listen.port, m->max_connections);
        return 0;
}

/* ---- the relay ------------------------------------------------------------ */

/* "192.0.2.7", or an IPv6 address's /64 ("2001:db8:1:2::/64"): the relay
 * counts an address's places by it (net_addr_near()). */
static void relay_addr_format(const uint8_t key[16], char out[INET6_ADDRSTRLEN + 4]) {
        static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
        uint8_t prefix[16] = {};

        if (memcmp(key, v4mapped, sizeof v4mapped) == 0) {
                inet_ntop(AF_INET, key + 12, out, INET6_ADDRSTRLEN);
                return;
        }
        memcpy(prefix, key, 8);
        inet_ntop(AF_INET6, prefix, out, INET6_ADDRSTRLEN);
        strcat(out, "/64");
}

/* How many more since the cause's last line, if one is due: the first at
 * once, then at most one every RELAY_LOG_USEC (strangers can make the
 * relay refuse or displace at every connection; a line each would flood
 * the log). 0: none due. */
static uint64_t relay_log_due(RelayLog *l, unsigned cause, uint64_t counter, uint64_t now) {
        uint64_t more = counter - l->logged[cause];

        if (more == 0 || (l->at_usec[cause] && now - l->at_usec[cause] < RELAY_LOG_USEC))
                return 0;
        l->logged[cause] = counter;
        l->at_usec[cause] = now;
        return more;
}

/* Endings of the log's lines that count: "s" for counts but 1, and
 * whether a rate-limited count covers more than one report's time. */
static const char *plural(uint64_t n) {
        return n == 1 ? "" : "s";
}

static const char *since_last(uint64_t counter, uint64_t n) {
        return counter > n ? " since the last report" : "";
}

/* Says why the relay turned newcomers away or closed links to make room
 * for them: the signs of strangers holding its places, or of a relay too
 * small for its nodes. */
static void relay_log_places(Daemon *d, const RelayStats *st, uint64_t usec) {
        RelayLog *l = &d->relay_log;
        char addr[INET6_ADDRSTRLEN + 4];
        uint64_t n;

        if ((n = relay_log_due(l, RELAY_LOG_DISPLACED, st->displaced, usec)))
                log_notice("Relay: closed %llu link%s that showed no use by two nodes (both ends at one address, or "
                           "nothing carried) to make room for newcomers%s; strangers may be holding places",
                           (unsigned long long)n, plural(n), since_last(st->displaced, n));
        if ((n = relay_log_due(l, RELAY_LOG_FULL, st->refused_full, usec)))
                log_warning("Relay full: refused %llu link%s%s, none of the %u it relays free to give way (each "
                            "proven or carrying bytes between two addresses, or joined moments ago; relay.max_links "
                            "in %s)",
                            (unsigned long long)n, plural(n), since_last(st->refused_full, n), l->max_links,
                            d->config.path);
        if ((n = relay_log_due(l, RELAY_LOG_OVER_ADDR, st->over_addr, usec))) {
                relay_addr_format(st->last_over_addr, addr);
                log_warning("Relay: %llu request%s%s came from an address holding relay.max_links_per_address (%u) "
                            "waiting nodes and links, the latest from %s: refused, or one of its places made way",
                            (unsigned long long)n, plural(n), since_last(st->over_addr, n),
                            l->max_links_per_addr, addr);
        }
}

/* Says what a relay with the network secret turned away: requests not made
 * with it (strangers trying its places, nodes of another network), and
 * links whose handshake proved nothing (nodes that hold it but do not run
 * this network's handshake, or send a recorded one again). */
static void relay_log_proofs(Daemon *d, const RelayStats *st, uint64_t usec) {
        RelayLog *l = &d->relay_log;
        uint64_t n;

        if ((n = relay_log_due(l, RELAY_LOG_NOT_MEMBER, st->not_member, usec)))
                log_notice("Relay: refused %llu request%s%s not made with the network secret: strangers, or nodes "
                           "of another network",
                           (unsigned long long)n, plural(n), since_last(st->not_member, n));
        if ((n = relay_log_due(l, RELAY_LOG_UNPROVEN, st->unproven, usec)))
                log_notice("Relay: closed %llu link%s%s whose handshake did not prove both ends of this network "
                           "within 10 s of being joined (a handshake frame malformed, a MAC wrong, none, or one "
                           "replayed)",
                           (unsigned long long)n, plural(n), since_last(st->unproven, n));
        if ((n = relay_log_due(l, RELAY_LOG_REPLAYED, st->replayed, usec)))
                log_warning("Relay: closed %llu link%s%s whose handshake was that of a link it relays: a node of "
                            "this network sends recorded handshakes again",
                            (unsigned long long)n, plural(n), since_last(st->replayed, n));
}

static int on_relay_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Daemon *d = userdata;
        RelayStats st;

        relay_get_stats(d->relay, &st);
        relay_log_places(d, &st, usec);
        relay_log_proofs(d, &st, usec);
        sd_event_source_set_time_relative(s, RELAY_WATCH_USEC);
        return 0;
}

/* Set at start (a reload does not move it): relays links for nodes that
 * accept no connections, on a thread of its own; with an allowlist, only
 * for the keys on it; with a network secret, only for nodes whose requests
 * prove they hold it, and only links whose handshake proves it, as the
 * node's own links do (config_net()). */
static int start_relay(Daemon *d) {
        const Config *c = &d->config;
        const ConfigRelay *rl = &c->relay_server;
        bool list = c->admission != CONFIG_ADMISSION_SECRET && c->n_allowed;
        bool secret = c->admission != CONFIG_ADMISSION_ALLOWLIST && c->has_secret;
        int r;

        if (!rl->enabled)
                return 0;
        r = relay_new(&(RelayConfig){ .host = rl->listen.host, .port = rl->listen.port, .max_links = rl->max_links,
                                      .max_links_per_addr = rl->max_links_per_addr,
                                      .allowed = list ? (const uint8_t(*)[IDENTITY_PK_SIZE])c->allowed : NULL,
                                      .n_allowed = list ? c->n_allowed : 0,
                                      .secret = secret ? c->secret : NULL },
                      &d->relay);
        if (r < 0)
                return log_error_errno(r, "Failed to relay on %s:%u (relay.listen in %s): %m", rl->listen.host,
                                       rl->listen.port, c->path);
        log_info("Relaying links for nodes that accept no connections on %s:%u (at most %u at once, %u from one "
                 "address%s%s)",
                 rl->listen.host, relay_port(d->relay), rl->max_links, rl->max_links_per_addr,
                 list ? ", allowed peers only" : "", secret ? ", checked against the network secret" : "");
        d->relay_log = (RelayLog){ .max_links = rl->max_links, .max_links_per_addr = rl->max_links_per_addr };
        r = sd_event_add_time_relative(d->event, &d->relay_timer, CLOCK_MONOTONIC, RELAY_WATCH_USEC, 0,
                                       on_relay_timer, d);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the event loop: %m");
        sd_event_source_set_enabled(d->relay_timer, SD_EVENT_ON);
        return 0;
}

static void apply_live_settings(Daemon *d, const Config *c) {
        /* an unconfigured node computes nothing: no need to watch the machine */
        bool want_idle = c->idle.enabled && !d->options.no_idle && configured(d, &d->config);
        Diag diag = {};

        control_set_max_duty(&d->control, c->idle.max_duty);
        if (want_idle && !d->idle_on && idle_monitor_init(&d->idle, &c->idle, NULL, &diag) >= 0) {
                d->idle_on = true;
                /* training starts once the machine has been calm for resume_after */
                control_set_pause(&d->control, CONTROL_PAUSE_IDLE, d->idle.paused, d->idle.reason);
                sd_event_source_set_enabled(d->idle_timer, SD_EVENT_ON);
        } else if (want_idle && d->idle_on)
                d->idle.settings = c->idle;
        else if (!want_idle && d->idle_on) {
                idle_monitor_done(&d->idle);
                d->idle_on = false;
                sd_event_source_set_enabled(d->idle_timer, SD_EVENT_OFF);
                control_set_pause(&d->control, CONTROL_PAUSE_IDLE, false, NULL);
        }
        if (c->checkpoint.interval_s) {
                sd_event_source_set_time_relative(d->checkpoint_timer, c->checkpoint.interval_s * USEC_PER_SEC);
                sd_event_source_set_enabled(d->checkpoint_timer, SD_EVENT_ON);
        } else
                sd_event_source_set_enabled(d->checkpoint_timer, SD_EVENT_OFF);
}

/* While the node starts (its links may wait for a listen address): the
 * job it starts and its role, as the configuration gives them, until the
 * run reports its own. */
static void report_starting(Daemon *d) {
        const Config *c = &d->config;
        NodeTraining t = { .cluster = -1, .stage = -1, .loss = -1.0, .busy = -1.0, .test_accuracy = -1.0,
                           .test_loss = -1.0 };
        snprintf(t.job, sizeof t.job, "%s", d->job.name);
        snprintf(t.role, sizeof t.role, "%s",
                 c->membership.enabled && !c->membership.train ? "coordinator" :
                 c->membership.enabled || c->pipeline.enabled ? "stage" :
                 c->averaging.enabled                         ? "member" : "standalone");
        control_report_training(&d->control, &t);
}

/* The Debian package whose files the job's data are, where they are read
 * from where it installs them (no --data-dir, no dataset.path of one's own). */
static const char *packaged_data(const Job *job, const char *data_dir) {
        if (data_dir)
                return NULL;
        if (strcmp(job->data.path, FASHION_MNIST_DIR) == 0)
                return "dataset-fashion-mnist";
        if (strncmp(job->data.path, "/usr/share/games/fortunes", 25) == 0)
                return "fortunes";
        return NULL;
}

int daemon_log_data_error(int r, const Diag *diag) {
        if (r == -EINVAL)
                return log_error_errno(r, "Invalid job: %s", diag->text);
        return log_error_errno(r, "Unusable dataset: %s", diag->text);
}

static int start_worker(Daemon *d) {
        const char *job_path = d->options.job_path ?: d->config.job;
        Diag diag = {};
        int r;

        r = job_load(job_path, &d->job, &diag);
        if (r < 0)
                return log_error_errno(r == -ENOENT ? -EINVAL : r, "Invalid job: %s", diag.text);
        if ((r = config_check_job(&d->config, &d->job, &diag)) < 0)
                return log_error_errno(r, "Invalid configuration: %s", diag.text);
        /* every mode that trains checks its model against its data here,
         * before any link or thread exists (a coordinator alone trains nothing) */
        if (!d->config.membership.enabled || d->config.membership.train) {
                r = job_check_data(&d->job, d->options.run.data_dir, &diag);
                const char *package = packaged_data(&d->job, d->options.run.data_dir);
                if (r == -ENOENT && package) /* else the line below names the file missing */
                        log_error("Dataset %s not found (install Debian's %s, or set dataset.path in %s or "
                                  "--data-dir)", d->job.data.name, package, d->job.path);
                if (r < 0)
                        return daemon_log_data_error(r, &diag);
        }
        /* the identity and the checkpoints live there (a run without a
         * configuration writes none) */
        if (d->config.path[0] && (r = config_check_state_directory(&d->config, &diag)) < 0) {
                log_error_errno(r, "Invalid configuration: %s", diag.text);
                return -EINVAL;
        }
        if (d->config.path[0] && mkdir(d->config.state_directory, 0700) < 0 && errno != EEXIST)
                return log_error_errno(-errno, "Failed to create %s: %m", d->config.state_directory);
        if (d->options.run.threads <= 0)
                d->options.run.threads = d->config.threads ? (int)d->config.threads
                                                           : (int)MIN(sysconf(_SC_NPROCESSORS_ONLN), 256L);
        report_starting(d);
        r = -pthread_create(&d->worker, NULL, worker_main, d);
        if (r < 0)
                return log_error_errno(r, "Failed to start the compute thread: %m");
        d->worker_started = true;
        return 0;
}

void daemon_init(Daemon *d, Config *config, const DaemonOptions *o) {
        *d = (Daemon){ .config = *config, .options = *o, .last_state = NODE_STARTING };
        memset(config, 0, sizeof *config);
}

/* Listening sockets handed over by systemd's socket activation or by
 * ravnestctl swarm (LISTEN_FDS): the transport listens on them where the
 * configuration names their addresses. */
static int inherit_listeners(void) {
        int n = sd_listen_fds(true), fds[NET_INHERITED_MAX], r;
        if (n <= 0)
                return n < 0 ? log_error_errno(n, "Failed to read LISTEN_FDS: %m") : 0;
        if (n > NET_INHERITED_MAX)
                return log_error_errno(-E2BIG, "LISTEN_FDS passes %d sockets, at most %d are used", n,
                                       NET_INHERITED_MAX);
        for (int i = 0; i < n; i++)
                fds[i] = SD_LISTEN_FDS_START + i;
        r = net_inherit_listeners(fds, (size_t)n);
        if (r < 0)
                return log_error_errno(r, "LISTEN_FDS: a socket passed in is not a listening TCP socket: %m");
        log_info("%d listening socket%s passed in (LISTEN_FDS): used where the configuration listens on %s",
                 n, plural(n), n == 1 ? "its address" : "their addresses");
        return 0;
}

int daemon_run(Daemon *d) {
        int r, status = EXIT_FAILURE;

        if (inherit_listeners() < 0)
                return EX_CONFIG;
        r = control_init(&d->control);
        if (r < 0)
                return log_error_errno(r, "Failed to set up: %m"), EXIT_FAILURE;
        r = install_signals(getenv("RAVNESTD_DEBUG_HANG") != NULL);
        if (r < 0)
                return log_error_errno(r, "Failed to set up: %m"), EXIT_FAILURE;
        if ((r = sd_event_new(&d->event)) < 0 ||
            (r = sd_event_add_io(d->event, NULL, signal_pipe[0], EPOLLIN, on_signal_pipe, d)) < 0 ||
            (r = sd_event_set_watchdog(d->event, true)) < 0 ||
            (r = sd_event_add_io(d->event, NULL, d->control.event_fd, EPOLLIN, on_control_event, d)) < 0 ||
            (r = sd_event_add_time_relative(d->event, &d->idle_timer, CLOCK_MONOTONIC, IDLE_SAMPLE_USEC, 0,
                                            on_idle_timer, d)) < 0 ||
            (r = sd_event_add_time_relative(d->event, &d->checkpoint_timer, CLOCK_MONOTONIC, USEC_PER_SEC, 0,
                                            on_checkpoint_timer, d)) < 0 ||
            (r = sd_event_add_time_relative(d->event, &d->status_timer, CLOCK_MONOTONIC, STATUS_USEC, 0,
                                            on_status_timer, d)) < 0) {
                log_error_errno(r, "Failed to set up the event loop: %m");
                goto out;
        }
        sd_event_source_set_enabled(d->idle_timer, SD_EVENT_OFF);
        sd_event_source_set_enabled(d->checkpoint_timer, SD_EVENT_OFF);
        sd_event_source_set_enabled(d->status_timer, SD_EVENT_ON);

        const char *sock = d->config.control_socket[0] ? d->config.control_socket : NULL;
        if (sock) {
                char dir[PATH_MAX];
                snprintf(dir, sizeof dir, "%s", sock);
                char *slash = strrchr(dir, '/');
                if (slash && slash != dir) {
                        *slash = '\0';
                        (void)mkdir(dir, 0755);
                }
        }
        r = bus_start(&d->bus, d->event, &d->control, sock, true);
        if (r < 0)
                goto out;
        if ((r = start_web(d)) < 0 || (r = start_relay(d)) < 0)
                goto out;

        apply_live_settings(d, &d->config);
        if (configured(d, &d->config)) {
                if ((r = start_worker(d)) < 0) {
                        status = r == -EINVAL ? EX_CONFIG : EXIT_FAILURE;
                        goto out;
                }
        } else {
                /* A fresh install: serve status, use no CPU. */
                log_notice("No network configured in %s: nothing to train until it is (see ravnestd.conf(5)); "
                           "State \"unconfigured\"",
                           d->config.path[0] ? d->config.path : CONFIG_PATH);
                control_set_state(&d->control, NODE_UNCONFIGURED);
        }
        on_state(d);

        status = sd_event_loop(d->event);
        if (status < 0) {
                log_error_errno(status, "Event loop failed: %m");
                status = EXIT_FAILURE;
        }
out:
        sd_notify(false, "STOPPING=1");
        if (d->worker_started) { /* only after a failure of the loop itself */
                control_request_stop(&d->control);
                pthread_join(d->worker, NULL);
        }
        bus_stop(&d->bus);
        d->web = web_server_stop(d->web);
        d->relay = relay_free(d->relay);
        d->relay_timer = sd_event_source_unref(d->relay_timer);
        d->web_timer = sd_event_source_unref(d->web_timer);
        if (d->idle_on)
                idle_monitor_done(&d->idle);
        d->idle_timer = sd_event_source_unref(d->idle_timer);
        d->checkpoint_timer = sd_event_source_unref(d->checkpoint_timer);
        d->status_timer = sd_event_source_unref(d->status_timer);
        d->event = sd_event_unref(d->event);
        control_done(&d->control);
        config_free(&d->config);
        if (d->has_unconfigured)
                config_free(&d->unconfigured);
        if (d->stopping && status == 0)
                log_notice("Received %s, stopped cleanly", strsignal(d->stop_signal));
        return status;
}
