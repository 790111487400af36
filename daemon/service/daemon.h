/* service/daemon.h — ravnestd once its options are read: the control thread
 * (an sd-event loop: signals, the systemd watchdog and notifications, D-Bus,
 * the idle monitor, the checkpoint timer) and the compute thread that trains.
 *
 *     Daemon d;
 *     daemon_init(&d, &config, &options);  // takes the loaded Config over
 *     return daemon_run(&d);               // an exit status: 0, EX_CONFIG, 1
 */
#pragma once

#include <pthread.h>
#include <systemd/sd-event.h>

#include "run/averaging.h"
#include "run/gossip-run.h"
#include "bus.h"
#include "conf/config.h"
#include "run/control.h"
#include "host/idle.h"
#include "conf/job.h"
#include "run/local-run.h"
#include "net/relay.h"
#include "run/node.h"
#include "web/server.h"

typedef struct DaemonOptions {
        const char *job_path;      /* NULL: the configuration's job */
        bool standalone;           /* train even without a network (a job named on the command line) */
        bool no_idle;              /* train whatever the machine's load (--no-idle) */
        LocalRunOptions run;       /* threads, epochs, data directory, progress */
} DaemonOptions;

/* What the relay's lines in the log said last (on_relay_timer()): the
 * counter of RelayStats each cause was at, and when (0: never); and the
 * limits it started with (a reload does not move them). */
enum {
        RELAY_LOG_DISPLACED,
        RELAY_LOG_FULL,
        RELAY_LOG_OVER_ADDR,
        RELAY_LOG_NOT_MEMBER,
        RELAY_LOG_UNPROVEN,
        RELAY_LOG_REPLAYED,
        _RELAY_LOG_MAX
};
typedef struct RelayLog {
        uint64_t logged[_RELAY_LOG_MAX];
        uint64_t at_usec[_RELAY_LOG_MAX];
        unsigned max_links, max_links_per_addr;
} RelayLog;

typedef struct Daemon {
        Config config;             /* what the compute thread runs with */
        DaemonOptions options;
        Job job;
        Control control;
        Bus bus;
        sd_event *event;
        IdleMonitor idle;
        bool idle_on;
        sd_event_source *idle_timer, *checkpoint_timer, *status_timer, *web_timer;
        WebServer *web;            /* metrics.listen set: Prometheus' metrics and the status page */
        Relay *relay;              /* relay.listen set: links relayed for nodes behind NAT */
        sd_event_source *relay_timer;
        RelayLog relay_log;
        /* the compute thread's */
        Node node;
        Averaging averaging;
        GossipRun gossip;          /* averaging.method gossip or auto */
        uint64_t last_report_ns;
        uint64_t steps;            /* a member's steps in this process: its averaging traffic is per step */
        char identity_hex[IDENTITY_HEX_SIZE]; /* set once, before identity_known */
        bool identity_known;
        pthread_t worker;
        bool worker_started, worker_done;
        int worker_result;
        bool ready_sent, stopping;
        bool stopped_starting;     /* the stop came while the node was starting */
        int stop_signal;
        NodeState last_state;
        /* An unconfigured node that a reload set training: its configuration
         * before, taken back if the compute thread fails before it trains
         * (an identity refused, an address in use), so the node stays up
         * and unconfigured instead of exiting into a restart loop. */
        Config unconfigured;
        bool has_unconfigured;
} Daemon;

/* The STATUS= text of a node that trains: "Training mlp: epoch 1/3, step
 * 20, loss 0.4120, 5300 samples/s, 2 peers", the figures it does not know
 * (yet) left out, and the neighbour a stage waits for. */
void daemon_training_status(const NodeStatus *st, char *buf, size_t len);
void daemon_init(Daemon *d, Config *config, const DaemonOptions *o);
int daemon_run(Daemon *d);
/* Logs why a job's data (job_check_data()'s r and diag) cannot be trained
 * on: -EINVAL is the job's ("Invalid job": the model does not fit them, an
 * exit status of 78), anything else the files' ("Unusable dataset": cut
 * short, corrupt, not what their names say; 1). r. */
int daemon_log_data_error(int r, const Diag *diag);
