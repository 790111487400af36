/* service/job.h — a training job: model, optimizer, data and schedule, read
 * from a libconfig file (see ravnest-job(5)).
 *
 *     Job job;
 *     Diag d = {};
 *     r = job_load("/usr/share/ravnest/jobs/fashion-mnist-mlp.job", &job, &d);
 *     if (r < 0)
 *             log_error_errno(r, "%s", d.text);   // names file, line, setting
 */
#pragma once

#include <limits.h>

#include "nn/optim.h"
#include "nn/stage.h"
#include "pipeline/trainer.h"

typedef struct JobData {
        char name[64];        /* "fashion-mnist" */
        char path[PATH_MAX];  /* directory with the IDX files */
        int classes;
        double mean, std;     /* normalization of pixel values in [0, 1] */
} JobData;

typedef struct Job {
        char path[PATH_MAX];
        char name[64];
        JobData data;
        ModelSpec model;
        OptimSpec optim;
        TrainSpec train;
} Job;

int job_load(const char *path, Job *ret, Diag *d);
