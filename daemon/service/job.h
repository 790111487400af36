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
/* Whether the job's model fits its data in dir (NULL: the job's dataset.path):
 * both splits' files, from their headers and labels, through the same
 * check every training mode makes (model_check_data_shape()). -ENOENT when
 * a file is not there; d names the file and what does not fit. */
int job_check_data(const Job *job, const char *dir, Diag *d);
