/* run/averaging.h — averaging replicas of the whole model with the
 * members of the config's averaging group, as the daemon runs it: this
 * node's place among the members, the averaging thread, and every round
 * logged once.
 *
 *     Averaging av;
 *     AveragingGroup g = { &config.averaging, &net_config, config.path };
 *     r = averaging_start(&av, &g, &node.identity, n_params, NULL, 0);   // logs
 *     // after every training step:
 *     averaging_step(&av, params, samples);
 *     averaging_stop(&av);
 */
#pragma once

#include "collective/averager.h"
#include "conf/config.h"
#include "control.h"
#include "nn/optim.h"

/* An averaging group as a run takes part in it: its members and settings
 * (from ravnestd.conf, or from a coordinator's plan), the transport its
 * links use, and where it came from, for messages. */
typedef struct AveragingGroup {
        const ConfigAveraging *settings;
        const NetConfig *net;
        const char *source;     /* "/etc/ravnest/ravnestd.conf", "the coordinator's plan" */
        const ModelSpec *model; /* the job's: members of another model are refused (averaging_model()) */
} AveragingGroup;

/* What a member averages, as every averaging mode and the coordinator's
 * hand-over compare it (coll_model_check()): checkpoint_model_digest() of
 * all the model's layers and its parameter count. The whole model, not the
 * stage: clusters may cut it at other layers, and a ring's members then
 * hold different stages of the same model. -EINVAL: a model that does not
 * check (the job's was checked when it was read). */
int averaging_model(const ModelSpec *m, CollModel *ret);
/* "its layers' digest 1a2b3c4d… differs from ours 3c4d5e6f…; 133,888 values
 * against 134,912": why theirs is not ours, for a log line. */
void averaging_model_why(const CollModel *ours, const CollModel *theirs, char *buf, size_t size);
/* "Averaging: member 3 (…) trains another model (why): not averaging with
 * it", for the last of `since` members refused (CollForeign). */
/* Which member's link closed last, and why (the averaging thread redials
 * it), since links lost since the last line: the event a node logs for a
 * peer that left. */
void averaging_log_link_lost(const ConfigMember *members, unsigned n_members, const CollLoss *l, uint64_t since);
/* The last connection to the averaging port that closed before it was a
 * member's link (who, and why), since of them since the last line. */
void averaging_log_refused(const CollLoss *l, uint64_t since);
void averaging_log_foreign(const ConfigMember *members, unsigned n_members, const CollModel *ours,
                           const CollForeign *f, uint64_t since);

typedef struct Averaging {
        Averager *av;
        const ConfigMember *members; /* the group's, for messages */
        Optim *optim;                /* whose moments joiners take (averaging_begin) */
        bool take_parameters;
        unsigned self, n_members;
        unsigned group_members;      /* the most members a round of this node's takes in (its rings') */
        AveragerStats seen;         /* as of the last averaging_step() */
        uint64_t logged_ns, logged_rounds; /* the last round that had a log line, of those with others */
        uint64_t alone_logged_ns, alone_logged; /* rounds alone: the last line's time (0: none since one with
                                                 * others) and count */
        uint64_t refused_logged_ns, refused_logged; /* refusals: the last line's time and count */
        unsigned join_timeout_ms, round_timeout_ms;
        CollModel model;             /* ours, for messages */
        uint64_t foreign_logged_ns;  /* rounds failed for want of a member of our model: the last line */
        uint64_t foreign_failed;     /* ... and those since */
        uint64_t unready_logged_ns, unready_logged; /* rounds started without a connected member: the last line */
        bool active;
} Averaging;

/* 0 and nothing started when the config has no averaging group. rings:
 * this node's rings over its n_params values (a pipeline stage's segments);
 * NULL: one ring of every member over the whole model. */
/* The averaging group of ravnestd.conf as the collective sees it: the
 * members (a new array in *ret_members, the caller frees it), this node's
 * index in cc->self, and the transport in nc with a receive pool for one
 * vector of n_params and the pieces in flight; nc must outlive cc. Logs;
 * -EINVAL when this node's key is not a member. */
int averaging_coll_config(const AveragingGroup *g, const Identity *id, size_t n_params, CollConfig *cc, NetConfig *nc,
                          CollMember **ret_members);
/* What the started group is (method, members, values), for the status on
 * D-Bus, the page and the metrics. */
void averaging_report_started(const Averaging *a, const AveragingGroup *g, size_t n_params, Control *c);
int averaging_start(Averaging *a, const AveragingGroup *g, const Identity *id, size_t n_params,
                    const AveragerRing *rings, unsigned n_rings);
/* The rounds as NodeNetwork has them, from what the averager counted (as
 * of the last averaging_step(), kept after averaging_stop()): a round in
 * which no other member took part averaged nothing, so it counts as failed
 * and is not the last round. */
void averaging_report_network(const Averaging *a, NodeNetwork *n);
/* Between steps: hand over a snapshot or apply a finished round, and log
 * rounds as they finish. */
void averaging_step(Averaging *a, float *params, uint64_t samples);
/* The same without a step, while the stage waits for work: a round that
 * wants its parameters, or a joiner its moments, does not wait for its
 * next update. */
void averaging_serve(Averaging *a, float *params);
/* fn(ud) runs just before averaging_step() or averaging_serve() write the
 * parameters (averager_on_write()). */
void averaging_on_write(Averaging *a, void (*fn)(void *ud), void *ud);
void averaging_stop(Averaging *a);
/* One more round now, with the others doing the same, and its delta added
 * to params: the replicas leave training as one averaged model. poll runs
 * the caller's links meanwhile. The round waits for every member of the
 * rings for half the round timeout, then goes on with those there; the
 * whole call gives up after twice the round timeout. Returns 0 when every
 * member took part, -EUCLEAN when the round went on without some (logged
 * either way: "The last averaging round included all ..." or a warning). */
int averaging_final(Averaging *a, float *params, void (*poll)(void *ud), void *ud);
/* Before the first step: take the swarm's parameters (averager_join(): the
 * others' average, this node's own weighing next to nothing; a round that
 * fails at once is tried again, one that times out is not), waiting at
 * most a join timeout and two round timeouts, calling poll meanwhile; when
 * a ring of its has nobody else up after AVERAGING_JOIN_ALONE_MS, none.
 * Logs how long it took and with how many members; 0, -EBADE at once when
 * the others train another model (CollForeign), or -ETIMEDOUT (it
 * trains from its own parameters then). */
#define AVERAGING_JOIN_ALONE_MS 3000 /* no member of some ring connected this long: nobody to join */
int averaging_join(Averaging *a, float *params, void (*poll)(void *ud), void *ud);
/* Before the first step, in every mode: the optimizer whose moments this
 * node gives to joiners (averager_set_optimizer()); then, with
 * take_parameters and unless the node was handed its layers (may_take
 * false), averaging_join() and the moments (and the outer optimizer's
 * momentum) of a member of each ring, with its step count. */
void averaging_begin(Averaging *a, float *params, Optim *o, bool may_take, void (*poll)(void *ud), void *ud);
/* The outer optimizer's state (averaging.outer), for checkpoints: see
 * averager_outer_state(). -EINVAL when this run has no outer optimizer. */
int averaging_outer_state(const Averaging *a, const float **ret_anchor, const float **ret_momentum);
int averaging_set_outer_state(Averaging *a, const float *anchor, const float *momentum);
