/* run/pipeline-run.h — run this node's stage of a pipeline plan (from
 * ravnestd.conf's pipeline.clusters, or a coordinator's): links to the
 * neighbouring stages, averaging rings with the same layers in the other
 * clusters, progress in the log; the last stage logs the test accuracy and
 * loss at the end.
 *
 *     StagePlan plan = { config.path, &config.pipeline, { &config.averaging, &net, config.path } };
 *     r = pipeline_run(&plan, &job, &node.identity, &options, &stop_flag);  // logs
 */
#pragma once

#include <signal.h>

#include "averaging.h"
#include "conf/config.h"
#include "conf/job.h"
#include "local-run.h"

/* A stage's inputs, built by whoever knows the plan: ravnestd.conf's
 * pipeline and averaging sections, or the coordinator's plan (membership).
 * The node finds its own place in it. */
typedef struct StagePlan {
        const char *source;              /* for messages: the file, or "the coordinator's plan" */
        const ConfigPipeline *pipeline;  /* the clusters, their nodes and cuts, the schedule */
        AveragingGroup averaging;        /* the rings' members and cadence; not enabled: none */
} StagePlan;

/* 0 when training is over; -ECANCELED if stopped; -EINVAL for a plan that
 * does not fit this node or the job (logged with where it came from). */
int pipeline_run(const StagePlan *plan, const Job *job, const Identity *id, const LocalRunOptions *o,
                 const volatile sig_atomic_t *stop);
