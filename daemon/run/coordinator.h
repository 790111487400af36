/* run/coordinator.h — the coordinator role (membership.coordinate in
 * ravnestd.conf): nodes connect to it with their measured capabilities, it
 * forms clusters and cuts the model (formation_run), and hands every node
 * the whole plan, signed with its identity and numbered by an epoch.
 *
 * A join, a leave (an orderly BYE, a dropped link, or no frame for
 * membership.deadline) makes a new epoch once membership has been quiet for
 * membership.settle: the coordinator tells every member to stop at its next
 * safe point ("RVMS"), takes in the layers they held, averages the copies
 * of each layer (the clusters hold replicas of one model), forms the new
 * plan and sends each node the averaged layers of its new stage, then the
 * plan. Nodes that lost the coordinator keep training on their plan; only
 * changes wait for it to come back. The wire format is in
 * ravnest-protocol(7), MEMBERSHIP.
 *
 * It runs on a thread of its own with its own transport, so the node that
 * coordinates also trains (it joins itself over loopback like any other).
 * The bytes of its links to the members (JOINs, plans, heartbeats, layers,
 * frames included) go to the node's Control as they grow, beside those of
 * the stage the node trains, if any (control_add_coordinator_bytes()).
 *
 *     Coordinator co;
 *     r = coordinator_start(&co, &config, &job, &node.identity, &control);   // logs
 *     ...
 *     coordinator_stop(&co);
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>

#include "conf/config.h"
#include "conf/job.h"
#include "control.h"
#include "net/identity.h"

typedef struct CoordinatorState CoordinatorState;

typedef struct Coordinator {
        CoordinatorState *state;
        pthread_t thread;
        bool running;
} Coordinator;

/* Listen on membership.coordinator's address and serve it until
 * coordinator_stop(), telling control (may be NULL) its links' bytes.
 * -EINVAL (logged) when this node is not the coordinator the
 * configuration names. */
int coordinator_start(Coordinator *co, const Config *c, const Job *job, const Identity *id, Control *control);
void coordinator_stop(Coordinator *co);
/* The members joined now (from any thread). */
unsigned coordinator_members(const Coordinator *co);
