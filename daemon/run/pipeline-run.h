/* run/pipeline-run.h — run this node's stage of the pipeline plan in
 * ravnestd.conf (pipeline.clusters): links to the neighbouring stages,
 * averaging rings with the same layers in the other clusters, progress in
 * the log; the last stage logs the test accuracy at the end.
 *
 *     r = pipeline_run(&config, &job, &node.identity, &options, &stop_flag);  // logs
 */
#pragma once

#include <signal.h>

#include "conf/config.h"
#include "conf/job.h"
#include "local-run.h"

/* 0 when training is over; -ECANCELED if stopped; -EINVAL for a plan that
 * does not fit this node or the job (logged with file and setting). */
int pipeline_run(const Config *c, const Job *job, const Identity *id, const LocalRunOptions *o,
                 const volatile sig_atomic_t *stop);
