/* run/membership.h — a node's side of membership (membership in
 * ravnestd.conf): measure what this node can give, join the coordinator,
 * take the plans it signs, and run this node's stage of the newest one with
 * pipeline_run().
 *
 * A plan is taken only from the configured coordinator's key, only with a
 * valid signature and only with an epoch above the one held. When the
 * coordinator asks for a new epoch ("RVMS"), the stage stops at a safe
 * point (the first stage sends no new micro-batch, the ones on the way
 * finish, and each stage tells the next; see pipe_quiesce()), hands its
 * layers in, and waits for the new plan and the averaged layers of its new
 * stage, which it starts from.
 * Without the coordinator the node trains on with the plan it holds and
 * dials the coordinator again every second.
 *
 *     r = membership_run(&config, &job, &node.identity, &options, &stop_flag);   // logs
 */
#pragma once

#include <signal.h>

#include "conf/config.h"
#include "conf/job.h"
#include "local-run.h"

/* Until *stop: 0 after a stop, or -errno (logged) when this node cannot
 * take part (no capability, no transport). */
int membership_run(const Config *c, const Job *job, const Identity *id, const LocalRunOptions *o,
                   const volatile sig_atomic_t *stop);
