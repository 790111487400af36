/* run/gossip-run.h — averaging.method "gossip" and "auto" for a member
 * that trains the whole model on its shard (not a pipeline stage): after
 * every step it mixes its parameters with its group of a topology
 * (collective/gossip.h), the exchange of step t running on the gossip
 * thread while step t+1 computes.
 *
 * The order in the step callback, after the update of step t:
 *
 *     x += mix(s(t-1)) - s(t-1)   wait for the exchange sent after step t-1
 *     s(t) = x; send s(t)          exchange in the background during step t+1
 *
 * The paper mixes before the update of step t+1 instead; the delta form
 * makes the two the same up to AdamW's decoupled weight decay, since the
 * update does not depend on x otherwise.
 *
 * Measuring and agreeing (both methods; auto decides by it): a member times
 * its steps (end of one callback to the start of the next: forward,
 * backward, update), and after GOSSIP_RUN_PROBE_STEPS steps every member
 * does the same blocking rounds over all members: a few probes of a small
 * and of the full vector, timed from START to the last piece, fit latency
 * and bandwidth (two points: the fastest small and the fastest full round);
 * then one exact all-reduce of the figures (compute mean and mean square,
 * bandwidth, latency, cores). An all-reduce leaves the same bits on every
 * participant, so every member feeds the runtime model
 * (collective/runtime-model.h) the same input and gets the same choice
 * without a leader. The rule when someone is missing: the choice is the
 * model's only if every member took part in that round; otherwise
 * (participants < members, or the round failed here) the member takes
 * alt-exp-ring, the topology that does best with members left out. Every
 * participant of a round sees the same participants, so they agree; only a
 * round that completes on some and fails on others could split them, and
 * then the groups still mix among whoever shows up. Until the choice, auto
 * members train alone (they start from the job's same initialization).
 *
 *     GossipRun gr;
 *     r = gossip_run_start(&gr, &group, &node.identity, n_params, &control);   // logs
 *     // LocalRunOptions.step, after every step:
 *     gossip_run_step(&gr, params, samples);
 *     gossip_run_finish(&gr, params);   // mix the last exchange, log a summary
 *     ...                                // serve: partners may still need our pieces
 *     gossip_run_stop(&gr);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "averaging.h"
#include "collective/gossip.h"
#include "conf/config.h"
#include "control.h"

#define GOSSIP_RUN_PROBE_STEPS 20

typedef struct GossipRun {
        Gossip *g;
        Control *control;
        bool active, is_auto, decided, failed_logged;
        unsigned self, n_members;
        size_t n_params;
        CollPayload payload;
        unsigned join_timeout_ms;
        uint64_t t;                  /* iterations sent */
        uint64_t last_end_ns;        /* the end of the last callback */
        double sum_ms, sumsq_ms;     /* step times before the probe */
        unsigned n_timed;
        uint64_t last_log_ns;
        uint64_t last_exchange_usec; /* CLOCK_REALTIME, as the log saw it */
        GossipStats seen;
        uint64_t refused_logged;     /* connections refused, as far as logged ... */
        uint64_t refused_logged_ns;  /* ... and when */
        const ConfigMember *members; /* for messages */
        CollModel model;             /* ours, for messages */
        NodeAveraging figures;       /* what the node reports */
} GossipRun;

/* 0 and nothing started unless the config's averaging method is gossip or
 * auto. Logs its errors. */
int gossip_run_start(GossipRun *gr, const AveragingGroup *g, const Identity *id, size_t n_params, Control *control);
void gossip_run_step(GossipRun *gr, float *params, uint64_t samples);
/* After training: wait for the exchange still out (its mix is dropped:
 * the model was evaluated) unless !wait (stopping), log a summary. */
void gossip_run_finish(GossipRun *gr, bool wait);
/* For the node's status: peers, bytes, the last exchange. */
void gossip_run_network(GossipRun *gr, NodeNetwork *n);
void gossip_run_stop(GossipRun *gr);
