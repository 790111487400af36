/* collective/averager.h — the averaging thread: on a fixed cadence it takes
 * a snapshot of this node's parameter slab, averages it with the other
 * clusters (multi-ring all-reduce, or Moshpit groups), and hands the result
 * back as a delta, w <- w + (avg(snapshot) - snapshot), so the updates the
 * compute thread made during the round are kept. Training never waits: the
 * compute thread only copies the slab when asked and adds the delta when it
 * is ready, both between two steps, inside averager_sync().
 *
 *     AveragerConfig c;
 *     averager_config_defaults(&c);
 *     c.coll = coll_config;  c.len = stage_values;
 *     c.segments = segs;  c.n_segments = n;         // this node's rings
 *     c.interval_ms = 2000;                         // or c.interval_steps
 *     Averager *a;
 *     r = averager_new(&c, &a);
 *     r = averager_start(a);                        // the thread
 *     for (;;) {
 *             train_step(params);
 *             averager_sync(a, params, samples_in_step);
 *     }
 *     averager_free(a);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "moshpit-sim.h"
#include "segments.h"

typedef enum AveragerMethod {
        AVERAGER_RING,    /* one ring per segment, all at once */
        AVERAGER_MOSHPIT, /* groups along one grid dimension per round */
} AveragerMethod;

/* One ring this node takes part in: values [off, off + len) of its slab.
 * A ring of more members than group_size averages in groups on a grid
 * (ring_grid(), collective/segments.h), one dimension per round: round t
 * of fragment k (t counts every fragment's rounds) takes the dimension
 * t / fragments mod dims, so each fragment goes through every dimension,
 * and a requested (last) round is as many whole rounds as the grid has
 * dimensions, so the replicas still end as one model on a full grid. */
#define AVERAGER_RING_MAX SEGMENTS_MAX_OWNERS
typedef struct AveragerRing {
        uint32_t group;                 /* below 1 << 20 */
        unsigned members[AVERAGER_RING_MAX], n;
        size_t off, len;
} AveragerRing;

/* An outer optimizer on pseudo-gradients (DiLoCo): every member keeps the
 * anchor, the parameters of the last synchronization. A round averages the
 * parameters over the group, then every member takes a step on its anchor
 * with the pseudo-gradient g = anchor - avg(params), which is avg(anchor -
 * params) while the anchors agree,
 *     m <- momentum * m + g
 *     anchor <- anchor - lr * (nesterov ? g + momentum * m : m)
 * and its parameters become the new anchor plus what training did while the
 * round ran. lr 1 and momentum 0 give back plain averaging. Averaging the
 * parameters rather than each member's anchor - params keeps the anchors
 * together when they part (a member left out of a round, or back from an
 * old checkpoint): a pseudo-gradient all-reduce would keep them apart for
 * ever. A piece of a round that did not complete leaves anchor, momentum
 * and parameters as they were. A requested (last) round is a plain one, so
 * the replicas end as one model. */
typedef struct AveragerOuter {
        bool enabled;
        float lr, momentum;
        bool nesterov;
} AveragerOuter;

#define AVERAGER_MAX_FRAGMENTS 64

typedef struct AveragerConfig {
        CollConfig coll;
        AveragerOuter outer;
        unsigned fragments;         /* a round syncs 1/fragments of every ring's values, in turn; 0, 1: all */
        bool error_feedback;        /* int8 payloads: carry each round's quantization error into the next */
        AveragerMethod method;
        size_t len;                 /* values in the slab */
        const AveragerRing *rings;  /* AVERAGER_RING */
        unsigned n_rings;
        unsigned group_size;        /* the most members a round takes, 2..COLL_MAX_MEMBERS; 0: COLL_MAX_MEMBERS */
        MoshpitGrid grid;           /* AVERAGER_MOSHPIT: member i sits in cell i */
        unsigned interval_ms;       /* cadence in time, or */
        unsigned interval_steps;    /* in local steps (averager_sync calls); 0: by time */
        uint16_t listen_port;
} AveragerConfig;

void averager_config_defaults(AveragerConfig *c);

/* A round that averaged with another member: when, how long, with whom. */
typedef struct AveragerRound {
        uint64_t realtime_us;                 /* CLOCK_REALTIME of its delta; 0: none yet */
        uint64_t duration_ns;                 /* snapshot to delta */
        unsigned participants;                /* fewest members that took part in one of its groups */
        unsigned group;                       /* the smallest group it asked for */
} AveragerRound;

typedef struct AveragerStats {
        uint64_t rounds_done, rounds_failed;  /* a node round: every ring of one snapshot */
        uint64_t rounds_alone;                /* of rounds_done: no other member took part, nothing averaged */
        uint64_t values_averaged;             /* over all rounds */
        uint64_t last_round_ns;               /* duration, snapshot to delta */
        int last_error;
        unsigned last_participants;           /* fewest members that took part in one group of the last round */
        unsigned last_group;                  /* the smallest group the last round asked for */
        AveragerRound averaged;               /* the last round with another member */
        unsigned connected;
        uint64_t links_in;                    /* links members dialed to this one (NetStats.links_in) */
        CollLoss lost;                        /* links to members that closed, and the last */
        CollLoss refused;                     /* connections refused or failed before a member's link */
        CollLoss diverged;                    /* members sitting rounds out, their values not finite (coll_diverged) */
        CollLoss unready;                     /* connected members our rounds started without (coll_unready) */
        CollForeign foreign;                  /* members refused, another model (coll_foreign); last_error -EBADE:
                                               * a round failed for want of a member of ours */
        uint64_t bytes_sent, bytes_received;
} AveragerStats;

typedef struct Averager Averager;

int averager_new(const AveragerConfig *c, Averager **ret);
Averager *averager_free(Averager *a);
DEFINE_TRIVIAL_CLEANUP_FUNC(Averager *, averager_free);
/* The port the averaging links listen on (after averager_new). */
uint16_t averager_port(const Averager *a);
int averager_set_address(Averager *a, unsigned member, const char *host, uint16_t port);
int averager_start(Averager *a);
enum {
        AVERAGER_APPLIED = 1,  /* a round's delta was added to params */
        AVERAGER_SNAPSHOT = 2, /* params were copied for a round */
};
/* From the compute thread, between steps: add a finished round's delta to
 * params, or copy params if a round wants a snapshot. samples: trained
 * since the last call (together, the snapshot's weight; 0 counts as 1).
 * Returns what it did: AVERAGER_APPLIED, AVERAGER_SNAPSHOT or 0. */
int averager_sync(Averager *a, float *params, uint64_t samples);
/* The same hand-offs without a step: for a compute thread that waits (for
 * work, for a round), so its rounds, and the rounds it leads for others,
 * never wait on it. */
int averager_serve(Averager *a, float *params);
/* fn(ud) runs inside averager_sync() and averager_serve(), on the caller's
 * thread, just before they write the parameters (a round's delta, an outer
 * step): for a caller that keeps copies of them (weight stashing). */
void averager_on_write(Averager *a, void (*fn)(void *ud), void *ud);
void averager_get_stats(Averager *a, AveragerStats *ret);
/* The outer optimizer's state (outer.enabled), owned by the compute thread:
 * set it before training (the initial parameters and zero momentum, or a
 * checkpoint's; momentum NULL: zeros; anchor NULL: as it is), read it for a
 * checkpoint (-ENODATA before there is an anchor). Without a set state, the
 * parameters at the first averager_sync() are the anchor.
 * -EINVAL without an outer optimizer. */
int averager_set_outer_state(Averager *a, const float *anchor, const float *momentum);
int averager_outer_state(const Averager *a, const float **ret_anchor, const float **ret_momentum);
/* Ask for a last round now (whatever the cadence): it averages only with
 * members in their last round too, waiting join_ms for them (0: the
 * configured join timeout), along grid dimension turn (mod the grid's
 * dimensions: turn k of averager_last_rounds(); a failed one is asked for
 * again under the same turn, so the members still meet in one group). Its
 * parameters become the average itself, the same at every member. Returns
 * its ticket: once averager_done_ticket() reaches it, that round (begun
 * after this call) has ended and its result has been handed over by
 * averager_sync(). */
uint64_t averager_request(Averager *a, unsigned join_ms, unsigned turn);
uint64_t averager_done_ticket(Averager *a);
/* How many requested rounds in a row end with one model: the most grid
 * dimensions of this node's rings (1 for rings no wider than group_size),
 * or of the Moshpit grid (one last round per dimension, the first first). */
unsigned averager_last_rounds(const Averager *a);
/* Join a swarm that trains already: the next rounds (one, or one per
 * fragment) start as soon as every member this node meets is connected, or
 * after AVERAGER_JOIN_GATHER_MS once each ring has another member
 * connected, and this node's snapshot weighs AVERAGER_JOIN_WEIGHT in them,
 * next to nothing against the others' samples: it takes their average and
 * gives none of its own parameters, so a node back from an old checkpoint
 * or new to the swarm does not pull the others back. Its delta is applied
 * as a plain average (the outer optimizer's anchor becomes it). Members
 * that all join at once weigh the same and average as usual. Returns the
 * rounds to take; averager_joining() is true until they are over (applied,
 * failed or given up). */
#define AVERAGER_JOIN_WEIGHT 1e-9
#define AVERAGER_JOIN_GATHER_MS 2000
unsigned averager_join(Averager *a);
bool averager_joining(const Averager *a);
/* No more join rounds (one under way finishes as one). */
void averager_join_cancel(Averager *a);
/* An optimizer's state for joiners. The compute thread names its
 * optimizer's moments once, before training (arrays of the slab's len
 * values, one after another, and its step count). Then a member that joins
 * takes them from another member after its join rounds: every ring's values
 * from one member of the ring (coll_state_fetch()), with the outer
 * optimizer's momentum after the moments. A member gives at most
 * AVERAGER_MAX_GIVING at once; the compute thread copies its state between
 * two steps or while it waits (averager_sync(), averager_serve()). */
#define AVERAGER_MAX_GIVING 2
void averager_set_optimizer(Averager *a, float *moments, unsigned arrays, const uint64_t *steps);
/* From the compute thread, after the join rounds: ask. -ENODATA without an
 * optimizer named. */
int averager_fetch_state(Averager *a);
/* -EINPROGRESS, or how the fetch ended: 0, with *ret the arrays (the
 * moments, then the outer momentum if any; len values each), the giver's
 * steps and member index, until averager_fetch_done(); else why not. */
int averager_fetched_state(Averager *a, const float **ret, uint64_t *ret_steps, unsigned *ret_member);
void averager_fetch_done(Averager *a);

/* Whether every ring of this node has another member connected (Moshpit:
 * any member), as the averaging thread last saw it. */
bool averager_peers_up(const Averager *a);
