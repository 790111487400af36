/* run/stage-checkpoint.c */
#include "stage-checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "events.h"
#include "util/log.h"
#include "util/time-util.h"

void stage_checkpoint_name(const char *job, int lo, int hi, char *buf, size_t len) {
        snprintf(buf, len, "%s.layers-%d-%d.ckpt", job, lo, hi); /* a job's name holds no '/' (job_load()) */
}

static void file_name(const char *job, const Stage *s, char *buf, size_t len) {
        stage_checkpoint_name(job, s->first_layer, s->first_layer + s->n_layers, buf, len);
}

int stage_checkpoint_save(const char *dir, const char *job, const Stage *s, const Optim *o, const CheckpointInfo *at,
                          bool last) {
        CheckpointInfo info = *at;
        char name[160], path[PATH_MAX + 200], fields[PATH_MAX + 300];
        Diag d = {};
        int r;

        snprintf(info.job, sizeof info.job, "%s", job);
        info.lo = s->first_layer;
        info.hi = s->first_layer + s->n_layers;
        info.n_params = s->n_params;
        info.n_state = optim_state_floats(o->spec.kind, s->n_params);
        info.optim_kind = (uint32_t)o->spec.kind;
        info.optim_t = o->t;
        checkpoint_model_digest(s->layers, s->n_layers, info.model);
        file_name(job, s, name, sizeof name);
        uint64_t t0 = now_ns();
        r = checkpoint_write(dir, name, &info, s->params, o->state, &d);
        if (r == -ERANGE)
                return log_error_errno(r, "Not writing the checkpoint of step %llu: training diverged, %s; the last "
                                          "good checkpoint stays as it was", (unsigned long long)info.step, d.text);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (r < 0) {
                struct stat st;
                const char *kept = stat(path, &st) >= 0 && S_ISREG(st.st_mode) ? "the previous one stays as it was"
                                                                               : "there is no earlier one";
                if (last)
                        return log_error_errno(r, "Failed to write the checkpoint of step %llu as training ends (%s): "
                                                  "%s", (unsigned long long)info.step, kept, d.text);
                return log_error_errno(r, "Failed to write the checkpoint of step %llu (%s; training goes on): %s",
                                       (unsigned long long)info.step, kept, d.text);
        }
        snprintf(fields, sizeof fields, "PATH=%s\nSTEP=%llu", path, (unsigned long long)info.step);
        /* the position training goes on from, as the plan counts it (under
         * membership the swarm's: it may go back at a new plan); not the
         * published Step, a counter */
        log_event(LOG_INFO, EVENT_CHECKPOINT, fields,
                  "Checkpoint written: %s (step %llu, %llu epochs done, the training position it goes on from; "
                  "%.1f MiB in %.0f ms)", path, (unsigned long long)info.step, (unsigned long long)info.epoch,
                  (double)(info.n_params + info.n_state) * 4 / (1 << 20), ns_to_sec(now_ns() - t0) * 1e3);
        return 0;
}

/* A checkpoint the loader refused, renamed "<path>.refused" (or
 * ".refused.1", ".refused.2", ...: an earlier one is never replaced), so
 * the next checkpoint does not write over what may be days of training
 * that an edit of the job or a flipped bit made unreadable. */
static int keep_refused(const char *path, char *ret, size_t len) {
        for (unsigned i = 0; i < 1000; i++) {
                int n = i ? snprintf(ret, len, "%s.refused.%u", path, i) : snprintf(ret, len, "%s.refused", path);
                if (n < 0 || (size_t)n >= len)
                        return -ENAMETOOLONG;
                if (renameat2(AT_FDCWD, path, AT_FDCWD, ret, RENAME_NOREPLACE) >= 0)
                        return 0;
                if (errno == EINVAL && access(ret, F_OK) < 0 && errno == ENOENT) /* no RENAME_NOREPLACE here */
                        return rename(path, ret) < 0 ? -errno : 0;
                if (errno != EEXIST && errno != EINVAL)
                        return -errno;
        }
        return -EEXIST;
}

int stage_checkpoint_load_layers(const char *dir, const char *job, const Layer *layers, int lo, int hi,
                                 float *params, size_t n_params, uint32_t optim_kind, float *optim, size_t n_state,
                                 CheckpointInfo *ret) {
        char name[160], path[PATH_MAX + 200];
        CheckpointInfo info;
        Diag d = {};
        int r;

        stage_checkpoint_name(job, lo, hi, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        /* nothing is written into params or optim unless all of it is taken */
        r = checkpoint_read_info(path, &info, &d);
        if (r == -ENOENT)
                return r;
        if (r >= 0 && info.optim_kind != optim_kind)
                r = diag_set(&d, -EINVAL, "%s: written by another optimizer", path);
        if (r >= 0)
                r = checkpoint_model_check(&info, layers, hi - lo, path, &d);
        if (r >= 0)
                r = checkpoint_read(path, &info, params, n_params, optim, n_state, &d);
        if (r < 0) {
                char aside[PATH_MAX + 230];
                int k = keep_refused(path, aside, sizeof aside);
                if (k < 0)
                        log_warning_errno(r, "Not resuming from the checkpoint, training starts afresh: %s (it could "
                                             "not be kept aside, %s: the next checkpoint replaces it)", d.text,
                                          strerror(-k));
                else
                        log_warning_errno(r, "Not resuming from the checkpoint, training starts afresh: %s; the file "
                                             "is kept as %s, never loaded", d.text, aside);
                return r;
        }
        log_info("Resuming from %s: step %llu, %llu epochs done", path, (unsigned long long)info.step,
                 (unsigned long long)info.epoch);
        *ret = info;
        return 0;
}

int stage_checkpoint_load(const char *dir, const char *job, Stage *s, Optim *o, CheckpointInfo *ret) {
        int r = stage_checkpoint_load_layers(dir, job, s->layers, s->first_layer, s->first_layer + s->n_layers,
                                             s->params, s->n_params, (uint32_t)o->spec.kind, o->state,
                                             optim_state_floats(o->spec.kind, s->n_params), ret);
        if (r >= 0)
                o->t = ret->optim_t;
        return r;
}

size_t stage_checkpoint_resume_step(const CheckpointInfo *at, unsigned batch) {
        if (!at->batch || !batch || at->batch == batch)
                return (size_t)at->step_in_epoch;
        size_t step = (size_t)(at->step_in_epoch * at->batch / batch);
        log_info("The checkpoint took %u samples a step, the job now %u: going on from step %zu of the epoch "
                 "(%llu samples done)", at->batch, batch, step, (unsigned long long)(at->step_in_epoch * at->batch));
        return step;
}

/* fn for each of job's stage checkpoints in dir ("<job>.layers-lo-hi.ckpt",
 * a regular file), until it returns non-zero: that, 0, or -errno when dir
 * cannot be read. */
static int each_checkpoint(const char *dir, const char *job,
                           int (*fn)(DIR *d, const char *name, int lo, int hi, const struct stat *st, void *ud),
                           void *ud) {
        char prefix[160];
        int r = 0;

        stage_checkpoint_name(job, 0, 0, prefix, sizeof prefix);
        *strstr(prefix, ".layers-") = 0; /* the job's part of every name */
        size_t n = strlen(prefix);
        DIR *d = opendir(dir);
        if (!d)
                return -errno;
        for (struct dirent *e; r == 0 && (e = readdir(d));) {
                int lo, hi, end = 0;
                struct stat st;
                if (strncmp(e->d_name, prefix, n) != 0 ||
                    sscanf(e->d_name + n, ".layers-%d-%d.ckpt%n", &lo, &hi, &end) != 2 ||
                    e->d_name[n + (size_t)end] != 0 || fstatat(dirfd(d), e->d_name, &st, 0) < 0 ||
                    !S_ISREG(st.st_mode))
                        continue;
                r = fn(d, e->d_name, lo, hi, &st, ud);
        }
        closedir(d);
        return r;
}

typedef struct Newest {
        struct timespec at;
        int lo, hi;
        bool found;
} Newest;

static int take_newer(DIR *d, const char *name, int lo, int hi, const struct stat *st, void *ud) {
        Newest *w = ud;
        if (!w->found || st->st_mtim.tv_sec > w->at.tv_sec ||
            (st->st_mtim.tv_sec == w->at.tv_sec && st->st_mtim.tv_nsec > w->at.tv_nsec))
                *w = (Newest){ .at = st->st_mtim, .lo = lo, .hi = hi, .found = true };
        return 0;
}

int stage_checkpoint_newest(const char *dir, const char *job, int *ret_lo, int *ret_hi) {
        Newest w = {};
        int r = each_checkpoint(dir, job, take_newer, &w);
        if (r < 0)
                return r;
        if (!w.found)
                return -ENOENT;
        *ret_lo = w.lo;
        *ret_hi = w.hi;
        return 0;
}

typedef struct Retire {
        int keep_lo, keep_hi;
        unsigned retired;
        int error;
} Retire;

/* name, and its outer optimizer's file if there is one, to "<...>.retired" */
static int retire_one(DIR *d, const char *name, int lo, int hi, const struct stat *st, void *ud) {
        Retire *t = ud;
        char from[200], to[220];
        if (lo == t->keep_lo && hi == t->keep_hi)
                return 0;
        for (int outer = 0; outer < 2; outer++) {
                snprintf(from, sizeof from, "%s%s", name, outer ? ".outer" : "");
                snprintf(to, sizeof to, "%s.retired", from);
                if (renameat(dirfd(d), from, dirfd(d), to) < 0 && !(outer && errno == ENOENT)) {
                        t->error = -errno;
                        return 0;
                }
        }
        log_info("Retired the checkpoint of layers %d-%d (another node holds them now): kept as %s.retired, "
                 "never loaded", lo, hi - 1, name);
        t->retired++;
        return 0;
}

int stage_checkpoint_retire(const char *dir, const char *job, int keep_lo, int keep_hi) {
        Retire t = { .keep_lo = keep_lo, .keep_hi = keep_hi };
        int r = each_checkpoint(dir, job, retire_one, &t);
        if (r >= 0)
                r = t.error;
        if (r < 0)
                return log_warning_errno(r, "Could not retire an older checkpoint in %s (it may be handed in after "
                                            "a restart of the whole swarm): %m", dir);
        return (int)t.retired;
}

static void outer_name(const char *job, const Stage *s, char *buf, size_t len) {
        file_name(job, s, buf, len);
        size_t n = strlen(buf);
        snprintf(buf + n, len - n, ".outer");
}

int stage_checkpoint_save_outer(const char *dir, const char *job, const Stage *s, const float *anchor,
                                const float *momentum, uint64_t outer_rounds, const CheckpointInfo *at) {
        CheckpointInfo info = *at;
        char name[170];
        Diag d = {};

        snprintf(info.job, sizeof info.job, "%s", job);
        info.lo = s->first_layer;
        info.hi = s->first_layer + s->n_layers;
        info.n_params = info.n_state = s->n_params;
        info.optim_kind = OPTIM_SGD; /* the outer step: SGD with momentum */
        info.optim_t = outer_rounds;
        checkpoint_model_digest(s->layers, s->n_layers, info.model);
        outer_name(job, s, name, sizeof name);
        int r = checkpoint_write(dir, name, &info, anchor, momentum, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to write the outer optimizer's state%s: %s",
                                       r == -ERANGE ? " (training diverged; the last good one stays)" : "", d.text);
        return 0;
}

int stage_checkpoint_load_outer(const char *dir, const char *job, const Stage *s, float *anchor, float *momentum,
                                uint64_t want_step, uint64_t *ret_rounds) {
        char name[170], path[PATH_MAX + 200];
        CheckpointInfo info;
        Diag d = {};

        outer_name(job, s, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        int r = checkpoint_read_info(path, &info, &d);
        if (r == -ENOENT)
                return r;
        if (r >= 0)
                r = checkpoint_model_check(&info, s->layers, s->n_layers, path, &d);
        if (r >= 0)
                r = checkpoint_read(path, &info, anchor, s->n_params, momentum, s->n_params, &d);
        if (r < 0)
                return log_warning_errno(r, "Not resuming the outer optimizer's state: %s", d.text);
        if (info.step != want_step)
                log_warning("%s is from step %llu, the stage's checkpoint from step %llu: the next outer step "
                            "starts from an older anchor", path, (unsigned long long)info.step,
                            (unsigned long long)want_step);
        log_info("Resuming the outer optimizer from %s: %llu outer rounds done", path,
                 (unsigned long long)info.optim_t);
        *ret_rounds = info.optim_t;
        return 0;
}
