/* tests/lib/coll-swarm.h — n Coll members on loopback, one thread each, for
 * tests and benchmarks of the collective layer. Real TCP, real io_uring. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>

#include "collective/coll.h"

typedef struct SwarmNode {
        Coll *coll;
        Identity id;
        float *x, *w;   /* x: the values averaged; w: receives w += avg - x */
        size_t len;
        double weight;
        CollRoundInfo info;
        float *avg;     /* read back with coll_round_read; NULL where incomplete */
        float *out;     /* if set: the round's output (coll_round_set_output) */
        float *feedback; /* if set: int8 error feedback (coll_round_set_feedback) */
        float *history;  /* if set: every round's avg, one after another (Swarm.rounds) */
        pthread_t thread;
        struct Swarm *swarm;
        unsigned index;
} SwarmNode;

typedef struct Swarm {
        unsigned n;
        SwarmNode node[16];
        atomic_uint finished;
        atomic_uint leaving;
        uint32_t group;
        unsigned rounds; /* of one swarm_round(), each in a group of its own; 0: 1 */
} Swarm;

/* Create n members (encrypted links unless plaintext), listening on
 * ephemeral loopback ports and pointing at each other. */
int swarm_init(Swarm *s, unsigned n, const CollConfig *tmpl, bool plaintext);
/* A round (or s->rounds in a row) over every member, each in a thread of
 * its own. info and avg hold the last round's. */
int swarm_round(Swarm *s);
void swarm_free(Swarm *s);
