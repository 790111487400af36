/* run/control.h — what the control thread and the compute thread share.
 *
 * ravnestd runs two threads of its own. The control thread (main(), an
 * sd-event loop) serves D-Bus, signals, the systemd watchdog, the idle
 * monitor and the checkpoint timer; it never computes, so a long training
 * step or averaging round cannot starve the watchdog. The compute thread runs
 * the job and, between two steps, passes through control_gate(): that is
 * where it stops, pauses, throttles to the duty-cycle cap and writes the
 * checkpoints the control thread asked for.
 *
 *     // compute thread, between steps
 *     r = control_gate(ctl, serve_links, run);
 *     if (r == -ECANCELED) return r;           // stop requested
 *     if (r == CONTROL_CHECKPOINT) control_checkpoint_done(ctl, write_checkpoint(...), step);
 *     control_report_training(ctl, &t);        // step, loss, samples/s, ...
 *
 *     // control thread
 *     control_set_pause(ctl, CONTROL_PAUSE_IDLE, true, "other processes use 1.0 CPU");
 *     control_request_checkpoint(ctl);
 *
 * The compute thread writes to event_fd whenever the state changes or a
 * checkpoint is done, so the control thread can emit PropertiesChanged and
 * answer pending Checkpoint() calls without polling.
 */
#pragma once

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum NodeState {
        NODE_UNCONFIGURED, /* no network in the configuration: nothing to do, no CPU used */
        NODE_STARTING,     /* loading data, binding sockets */
        NODE_TRAINING,
        NODE_PAUSED,       /* the owner needs the machine, or the operator asked */
        NODE_FINISHED,     /* the job is trained; serving peers */
        NODE_FAILED,
        NODE_STOPPING,
        NODE_COORDINATING, /* membership.train = false: forms the swarm's plans, trains nothing */
        _NODE_STATE_MAX,
} NodeState;

const char *node_state_to_string(NodeState s);

/* What the compute thread reports, for D-Bus and `ravnestctl status`: the
 * training loop fills the first part, whoever serves the links the second. */
typedef struct NodeTraining {
        char role[16];             /* "standalone", "member" (replica averaging) or "stage" */
        char job[64];
        int32_t cluster, stage;    /* 0-based; -1 when not in a pipeline */
        int32_t epoch, epochs;     /* epoch 1-based; <= 0 where the stage does not read the data */
        uint64_t step;             /* the run's position in steps (updates), checkpoints included: under
                                    * membership the swarm's, as the plan held counts them (published as
                                    * a counter: control_report_training()) */
        double loss;               /* mean training loss over the last 2 s window; < 0: not known here */
        double samples_per_sec;    /* over the wall clock of the last 2 s; 0 while paused or finished */
        double busy;               /* fraction of the last 2 s not spent waiting, 0 to 1; < 0: not known */
        double test_accuracy;      /* of the last evaluation; < 0 before one */
        double test_loss;          /* of the last evaluation; < 0 before one */
        char waiting_for[64];      /* a stage's neighbour it cannot work without: "stage 1: not connected",
                                    * "stage 3: paused"; "": none */
} NodeTraining;

/* What this node moved for the pipeline (its links to the neighbouring
 * stages: activations, gradients and the frames around them, as its Net
 * counts them) and for averaging (the averager's payload), and over how
 * many local steps: the updates this process made since it counted; and
 * over the links of network.peers (as that Net counts them). */
typedef struct NodeTraffic {
        uint64_t pipeline_sent, pipeline_received;
        uint64_t averaging_sent, averaging_received;
        uint64_t steps;
        uint64_t peers_sent, peers_received;
} NodeTraffic;

/* Bytes sent and received together, per step; 0 before the first step. */
uint64_t node_traffic_per_step(uint64_t sent, uint64_t received, uint64_t steps);

typedef struct NodeNetwork {
        uint32_t peers;            /* connected links */
        uint32_t paused_peers;     /* neighbours that said they are paused */
        uint64_t bytes_sent, bytes_received; /* over every link */
        NodeTraffic traffic;
        uint64_t last_averaging_usec; /* CLOCK_REALTIME of the last averaging round; 0: none */
        uint64_t rounds_done, rounds_failed; /* averaging rounds (of whole replicas or a pipeline's rings);
                                              * one no other member took part in failed */
        uint64_t last_round_ns;    /* duration of the last round, snapshot to delta; 0: none */
        uint32_t last_participants, last_group; /* the last round's members, and its group's */
        char io_backend[16];
        char reachability[16];     /* "dials out", "not reachable", "reachable", "unconfirmed"; "": not known */
} NodeNetwork;

/* What the runtime model needs (collective/runtime-model.h), as measured
 * here, for `ravnestctl predict` without figures. Zeros: not measured. */
typedef struct NodeAveraging {
        char method[32];           /* in use: "ring", "moshpit", "gossip alt-exp-ring", "auto: exp", ... */
        uint32_t nodes;            /* members of the averaging group, this node included */
        uint64_t params;           /* values averaged */
        double compute_ms;         /* forward, backward and update per step, mean */
        double compute_sd_ms;
        double bandwidth_mbit;     /* fitted from the probe rounds */
        double latency_ms;
        double cores;              /* per node, as the runtime model took it */
} NodeAveraging;

typedef struct NodeStatus {
        NodeTraining training;
        NodeNetwork network;
        NodeAveraging averaging;
        uint64_t checkpoint_step;  /* the published step when the last checkpoint was written or loaded */
        uint64_t checkpoint_usec;  /* CLOCK_REALTIME when it was written or loaded; 0: none */
        uint64_t pauses;           /* times training paused (the operator or the idle monitor) */
        uint64_t plan_epoch;       /* of the coordinator's plan held (membership); 0: none */
        char reload_error[256];    /* why the last reload failed; "" after one that worked, or none */
} NodeStatus;

#define CONTROL_PAUSE_OPERATOR 1u /* Pause() over D-Bus */
#define CONTROL_PAUSE_IDLE 2u     /* the idle monitor: the owner is using the machine */

#define CONTROL_CHECKPOINT 1

typedef struct Control {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        volatile sig_atomic_t stop; /* the run loops' stop flag */
        int event_fd;

        /* set by the control thread */
        unsigned pause;             /* CONTROL_PAUSE_* bits */
        char pause_reason[128];     /* of the pause in force, "" when running */
        char idle_reason[128];
        double max_duty;            /* 0 < d <= 1 */
        uint64_t checkpoints_wanted;

        /* set by the compute thread */
        NodeState state;
        NodeStatus status;
        NodeNetwork network_base;   /* the counters of the runs that ended (control_report_run_end()) */
        /* the bytes of this node's coordinator's links, since the daemon
         * started (control_add_coordinator_bytes()) */
        uint64_t coordinator_sent, coordinator_received;
        uint64_t position;          /* the run's step as last reported (NodeTraining.step) */
        uint64_t checkpoints_done;
        int checkpoint_error;       /* of the last one */
        uint64_t gate_ns;           /* when the compute thread last left the gate */
} Control;

int control_init(Control *c);
void control_done(Control *c);

/* Control thread. */
void control_set_pause(Control *c, unsigned bit, bool on, const char *reason);
void control_set_max_duty(Control *c, double d);
/* Why the last reload failed (NULL or "": it worked). */
void control_set_reload_error(Control *c, const char *why);
/* Returns the ticket the matching control_checkpoint_done() reaches. */
uint64_t control_request_checkpoint(Control *c);
void control_request_stop(Control *c);
/* A consistent copy of what the compute thread reported. */
void control_snapshot(Control *c, NodeState *ret_state, NodeStatus *ret_status, char ret_reason[128],
                      uint64_t *ret_checkpoints_done, int *ret_checkpoint_error);
/* Drain event_fd (after it polled readable). */
void control_clear_event(Control *c);

/* Compute thread. serve() keeps the links alive while paused (paused
 * true) and while resting under the duty-cycle cap (false), every 100 ms
 * or so; may be NULL. Returns 0 to go on, CONTROL_CHECKPOINT when a
 * checkpoint is wanted, or -ECANCELED when stopping. */
int control_gate(Control *c, void (*serve)(void *userdata, bool paused), void *userdata);
void control_set_state(Control *c, NodeState s);
void control_report_training(Control *c, const NodeTraining *t);
/* n's counters (bytes, rounds, traffic) are the run's own, from 0 when it
 * began: they are published added to those of the runs before it in this
 * process (membership runs one per plan epoch), so they never go back. */
void control_report_network(Control *c, const NodeNetwork *n);
/* A run ended, its links gone: what it counted (as last reported) is kept
 * for the next run's to add to; its peers are 0 until that one reports. */
void control_report_run_end(Control *c);
/* Membership, from the coordinator's thread (membership.coordinate): the
 * bytes its links to the members moved since it last said. They are its
 * own, beside any run's: published in BytesSent and BytesReceived and
 * under purpose "network" at once, whether this node trains (a stage of
 * each plan epoch, whose runs report their own) or only coordinates, and
 * kept out of what a run that ends leaves for the next to add to. */
void control_add_coordinator_bytes(Control *c, uint64_t sent, uint64_t received);
void control_report_averaging(Control *c, const NodeAveraging *a);
/* A checkpoint of the run at step (its position, as NodeTraining.step)
 * was loaded at start, or written. */
void control_report_checkpoint(Control *c, uint64_t step);
/* Membership: the epoch of the plan this node took. */
void control_report_plan(Control *c, uint64_t epoch);
void control_checkpoint_done(Control *c, int r, uint64_t step);
