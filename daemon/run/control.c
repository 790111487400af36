/* run/control.c */
#include "control.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "host/idle.h"
#include "util/macro.h"
#include "util/time-util.h"

static const char *const state_names[_NODE_STATE_MAX] = {
        [NODE_UNCONFIGURED] = "unconfigured",
        [NODE_STARTING] = "starting",
        [NODE_TRAINING] = "training",
        [NODE_PAUSED] = "paused",
        [NODE_FINISHED] = "finished",
        [NODE_FAILED] = "failed",
        [NODE_STOPPING] = "stopping",
        [NODE_COORDINATING] = "coordinating",
};

const char *node_state_to_string(NodeState s) {
        return s >= 0 && s < _NODE_STATE_MAX ? state_names[s] : "unknown";
}

uint64_t node_traffic_per_step(uint64_t sent, uint64_t received, uint64_t steps) {
        return steps ? (sent + received) / steps : 0;
}

int control_init(Control *c) {
        *c = (Control){ .max_duty = 1.0, .state = NODE_STARTING };
        c->status.training.cluster = c->status.training.stage = -1;
        c->status.training.test_accuracy = -1.0;
        c->status.training.test_loss = -1.0;
        c->status.training.loss = -1.0; /* not known before the first report */
        c->status.training.busy = -1.0;
        c->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->event_fd < 0)
                return -errno;
        pthread_mutex_init(&c->lock, NULL);
        /* waits are timed on the monotonic clock: a wall clock set back an
         * hour (by hand, by NTP's first step) does not stretch them */
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&c->cond, &attr);
        pthread_condattr_destroy(&attr);
        return 0;
}

void control_done(Control *c) {
        if (c->event_fd >= 0)
                close(c->event_fd);
        c->event_fd = -1;
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->cond);
}

static void notify(Control *c) {
        uint64_t one = 1;
        if (c->event_fd >= 0)
                (void)!write(c->event_fd, &one, sizeof one);
}

void control_clear_event(Control *c) {
        uint64_t v;
        (void)!read(c->event_fd, &v, sizeof v);
}

void control_set_pause(Control *c, unsigned bit, bool on, const char *reason) {
        pthread_mutex_lock(&c->lock);
        if (on)
                c->pause |= bit;
        else
                c->pause &= ~bit;
        if (bit == CONTROL_PAUSE_IDLE)
                snprintf(c->idle_reason, sizeof c->idle_reason, "%s", on && reason ? reason : "");
        /* the operator's word first: Resume() is what lifts it */
        snprintf(c->pause_reason, sizeof c->pause_reason, "%s",
                 c->pause & CONTROL_PAUSE_OPERATOR ? "paused by the operator" :
                 c->pause & CONTROL_PAUSE_IDLE ? c->idle_reason : "");
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
}

void control_set_reload_error(Control *c, const char *why) {
        pthread_mutex_lock(&c->lock);
        snprintf(c->status.reload_error, sizeof c->status.reload_error, "%s", why ?: "");
        pthread_mutex_unlock(&c->lock);
}

void control_set_max_duty(Control *c, double d) {
        pthread_mutex_lock(&c->lock);
        c->max_duty = d > 0 && d <= 1 ? d : 1.0;
        pthread_mutex_unlock(&c->lock);
}

uint64_t control_request_checkpoint(Control *c) {
        pthread_mutex_lock(&c->lock);
        uint64_t ticket = ++c->checkpoints_wanted;
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
        return ticket;
}

void control_request_stop(Control *c) {
        pthread_mutex_lock(&c->lock);
        c->stop = 1;
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
}

void control_snapshot(Control *c, NodeState *ret_state, NodeStatus *ret_status, char ret_reason[128],
                      uint64_t *ret_checkpoints_done, int *ret_checkpoint_error) {
        pthread_mutex_lock(&c->lock);
        if (ret_state)
                *ret_state = c->state;
        if (ret_status)
                *ret_status = c->status;
        if (ret_reason)
                memcpy(ret_reason, c->pause_reason, sizeof c->pause_reason);
        if (ret_checkpoints_done)
                *ret_checkpoints_done = c->checkpoints_done;
        if (ret_checkpoint_error)
                *ret_checkpoint_error = c->checkpoint_error;
        pthread_mutex_unlock(&c->lock);
}

/* A node that does not train (paused, finished, stopping) does no work:
 * its throughput and busy fraction are 0, not the last ones it had (a
 * window that ended just after a pause began has a sliver of work and no
 * samples done in it); each stays unknown (< 0) if it was. */
static void idle_figures_locked(Control *c) {
        if (c->state == NODE_TRAINING || c->state == NODE_STARTING)
                return;
        NodeTraining *t = &c->status.training;
        if (t->samples_per_sec > 0)
                t->samples_per_sec = 0;
        if (t->busy > 0)
                t->busy = 0;
}

static void set_state_locked(Control *c, NodeState s) {
        if (c->state == s)
                return;
        c->state = s;
        idle_figures_locked(c);
        if (s == NODE_PAUSED)
                c->status.pauses++;
        notify(c);
}

void control_set_state(Control *c, NodeState s) {
        pthread_mutex_lock(&c->lock);
        set_state_locked(c, s);
        pthread_mutex_unlock(&c->lock);
}

/* A run's position as the published Step. Step is a counter
 * (ravnest_steps_total): it moves on as far as the position does, and not
 * back when the position does. Under membership each plan epoch's stage
 * starts from the swarm's count in that plan's steps (the samples done over
 * the samples of one step in every cluster): a plan with more clusters, or
 * one that lost a member's samples with it, counts fewer. */
static uint64_t published_step_locked(const Control *c, uint64_t position) {
        uint64_t step = c->status.training.step;
        return position > c->position ? step + (position - c->position) : step;
}

void control_report_training(Control *c, const NodeTraining *t) {
        pthread_mutex_lock(&c->lock);
        uint64_t step = published_step_locked(c, t->step);
        c->position = t->step;
        c->status.training = *t;
        c->status.training.step = step;
        idle_figures_locked(c);
        pthread_mutex_unlock(&c->lock);
}

void control_report_network(Control *c, const NodeNetwork *n) {
        pthread_mutex_lock(&c->lock);
        const NodeNetwork *b = &c->network_base;
        NodeNetwork s = *n;
        s.bytes_sent += b->bytes_sent;
        s.bytes_received += b->bytes_received;
        s.rounds_done += b->rounds_done;
        s.rounds_failed += b->rounds_failed;
        s.traffic.pipeline_sent += b->traffic.pipeline_sent;
        s.traffic.pipeline_received += b->traffic.pipeline_received;
        s.traffic.averaging_sent += b->traffic.averaging_sent;
        s.traffic.averaging_received += b->traffic.averaging_received;
        s.traffic.steps += b->traffic.steps;
        s.traffic.peers_sent += b->traffic.peers_sent;
        s.traffic.peers_received += b->traffic.peers_received;
        /* the coordinator's links, which no run counts */
        s.bytes_sent += c->coordinator_sent;
        s.bytes_received += c->coordinator_received;
        s.traffic.peers_sent += c->coordinator_sent;
        s.traffic.peers_received += c->coordinator_received;
        /* the last round is an earlier run's until this one has done one */
        if (!s.last_averaging_usec) {
                s.last_averaging_usec = b->last_averaging_usec;
                s.last_round_ns = b->last_round_ns;
                s.last_participants = b->last_participants;
                s.last_group = b->last_group;
        }
        c->status.network = s;
        pthread_mutex_unlock(&c->lock);
}

void control_report_run_end(Control *c) {
        pthread_mutex_lock(&c->lock);
        c->network_base = c->status.network;
        /* the run's, without the coordinator's: those go on beside the next run's */
        c->network_base.bytes_sent -= c->coordinator_sent;
        c->network_base.bytes_received -= c->coordinator_received;
        c->network_base.traffic.peers_sent -= c->coordinator_sent;
        c->network_base.traffic.peers_received -= c->coordinator_received;
        c->status.network.peers = c->status.network.paused_peers = 0;
        pthread_mutex_unlock(&c->lock);
}

void control_add_coordinator_bytes(Control *c, uint64_t sent, uint64_t received) {
        pthread_mutex_lock(&c->lock);
        NodeNetwork *s = &c->status.network;
        c->coordinator_sent += sent;
        c->coordinator_received += received;
        s->bytes_sent += sent;
        s->bytes_received += received;
        s->traffic.peers_sent += sent;
        s->traffic.peers_received += received;
        pthread_mutex_unlock(&c->lock);
}

void control_report_averaging(Control *c, const NodeAveraging *a) {
        pthread_mutex_lock(&c->lock);
        c->status.averaging = *a;
        pthread_mutex_unlock(&c->lock);
}

/* CheckpointStep is in Step's units, and never goes back either. */
static void checkpoint_locked(Control *c, uint64_t position) {
        c->status.checkpoint_step = MAX(c->status.checkpoint_step, published_step_locked(c, position));
        c->status.checkpoint_usec = now_realtime_usec();
}

void control_report_checkpoint(Control *c, uint64_t step) {
        pthread_mutex_lock(&c->lock);
        checkpoint_locked(c, step);
        pthread_mutex_unlock(&c->lock);
}

void control_report_plan(Control *c, uint64_t epoch) {
        pthread_mutex_lock(&c->lock);
        c->status.plan_epoch = epoch;
        pthread_mutex_unlock(&c->lock);
}

void control_checkpoint_done(Control *c, int r, uint64_t step) {
        pthread_mutex_lock(&c->lock);
        c->checkpoints_done = c->checkpoints_wanted;
        c->checkpoint_error = r < 0 ? r : 0;
        if (r >= 0)
                checkpoint_locked(c, step);
        notify(c);
        pthread_mutex_unlock(&c->lock);
}

static struct timespec deadline_in(uint64_t ns) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_sec += (time_t)(ns / NSEC_PER_SEC);
        t.tv_nsec += (long)(ns % NSEC_PER_SEC);
        if (t.tv_nsec >= (long)NSEC_PER_SEC) {
                t.tv_sec++;
                t.tv_nsec -= (long)NSEC_PER_SEC;
        }
        return t;
}

int control_gate(Control *c, void (*serve)(void *userdata, bool paused), void *userdata) {
        uint64_t now = now_ns();
        int r = 0;

        pthread_mutex_lock(&c->lock);
        /* The duty-cycle cap: after working busy ns, rest busy (1 - d) / d,
         * serving the links every 100 ms of it (a coordinator's heartbeats
         * are due more often than a rest of seconds) */
        if (c->max_duty < 1.0 && c->gate_ns && !c->pause && !c->stop) {
                uint64_t busy = now - c->gate_ns;
                uint64_t end = now + MIN(idle_duty_sleep_ns(busy, c->max_duty), 5 * NSEC_PER_SEC);
                for (uint64_t t = now; !c->stop && !c->pause && t < end; t = now_ns()) {
                        struct timespec until = deadline_in(MIN(end - t, 100 * 1000000ULL));
                        if (pthread_cond_timedwait(&c->cond, &c->lock, &until) != ETIMEDOUT || !serve)
                                continue;
                        pthread_mutex_unlock(&c->lock);
                        serve(userdata, false);
                        pthread_mutex_lock(&c->lock);
                }
        }
        while (c->pause && !c->stop && c->checkpoints_wanted == c->checkpoints_done) {
                set_state_locked(c, NODE_PAUSED);
                pthread_mutex_unlock(&c->lock);
                if (serve) /* the links stay up while paused */
                        serve(userdata, true);
                pthread_mutex_lock(&c->lock);
                struct timespec until = deadline_in(100 * 1000000ULL);
                if (c->pause && !c->stop && c->checkpoints_wanted == c->checkpoints_done)
                        pthread_cond_timedwait(&c->cond, &c->lock, &until);
        }
        if (c->stop)
                r = -ECANCELED;
        else if (c->checkpoints_wanted != c->checkpoints_done)
                r = CONTROL_CHECKPOINT; /* a paused node still writes the checkpoint it is asked for */
        else
                set_state_locked(c, NODE_TRAINING);
        pthread_mutex_unlock(&c->lock);
        c->gate_ns = now_ns();
        return r;
}
