/* conf/job.h — a training job: model, optimizer, data and schedule, read
 * from a libconfig file (see ravnest-job(5)).
 *
 *     Job job;
 *     Diag d = {};
 *     r = job_load("/usr/share/ravnest/jobs/fashion-mnist-mlp.job", &job, &d);
 *     if (r < 0)
 *             log_error_errno(r, "%s", d.text);   // names file, line, setting
 *     r = job_check_data(&job, NULL, &d);        // the model against its data's headers
 *     Dataset *train;
 *     r = job_load_split(&job, NULL, false, &train, &d);
 */
#pragma once

#include <limits.h>
#include <stdbool.h>

#include "nn/optim.h"
#include "nn/stage.h"
#include "pipeline/trainer.h"

typedef enum JobDataKind {
        JOB_DATA_IDX,         /* labelled images: the four IDX files of a directory */
        JOB_DATA_TEXT,        /* byte-level text: a file, or a directory's text files */
} JobDataKind;

typedef struct JobData {
        char name[64];        /* "fashion-mnist", "idx" or "text" */
        JobDataKind kind;
        char path[PATH_MAX];  /* the IDX files' directory; the text's file or directory */
        int classes;          /* text: the model's vocabulary */
        double mean, std;     /* images: normalization of pixel values in [0, 1] */
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
 * the data set is not on this machine (none of its files), -ENODATA when
 * some of its files are and another is not; d names the file and what
 * does not fit. */
int job_check_data(const Job *job, const char *dir, Diag *d);
/* One split of the job's data from dir (NULL: the job's dataset.path),
 * ready to train on (images normalized): the training split, or with test
 * the test set (images) or the validation split (text). d says why not. */
int job_load_split(const Job *job, const char *dir, bool test, Dataset **ret, Diag *d);
