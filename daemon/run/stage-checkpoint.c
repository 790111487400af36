/* run/stage-checkpoint.c */
#include "stage-checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "events.h"
#include "util/log.h"
#include "util/time-util.h"

void stage_checkpoint_name(const char *job, int lo, int hi, char *buf, size_t len) {
        snprintf(buf, len, "%s.layers-%d-%d.ckpt", job, lo, hi);
        for (char *c = buf; *c; c++) /* a job's name is not a path */
                if (*c == '/')
                        *c = '_';
}

static void file_name(const char *job, const Stage *s, char *buf, size_t len) {
        stage_checkpoint_name(job, s->first_layer, s->first_layer + s->n_layers, buf, len);
}

int stage_checkpoint_save(const char *dir, const char *job, const Stage *s, const Optim *o, const CheckpointInfo *at) {
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
        file_name(job, s, name, sizeof name);
        uint64_t t0 = now_ns();
        r = checkpoint_write(dir, name, &info, s->params, o->state, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to write the checkpoint (the previous one stays as it was; "
                                          "training goes on): %s", d.text);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        snprintf(fields, sizeof fields, "PATH=%s\nSTEP=%llu", path, (unsigned long long)info.step);
        log_event(LOG_INFO, EVENT_CHECKPOINT, fields, "Checkpoint written: %s (step %llu, %llu epochs done; %.1f MiB in %.0f ms)",
                  path, (unsigned long long)info.step, (unsigned long long)info.epoch,
                  (double)(info.n_params + info.n_state) * 4 / (1 << 20), ns_to_sec(now_ns() - t0) * 1e3);
        return 0;
}

int stage_checkpoint_load_layers(const char *dir, const char *job, int lo, int hi, float *params, size_t n_params,
                                 uint32_t optim_kind, float *optim, size_t n_state, CheckpointInfo *ret) {
        char name[160], path[PATH_MAX + 200];
        CheckpointInfo info;
        Diag d = {};
        int r;

        stage_checkpoint_name(job, lo, hi, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        r = checkpoint_read(path, &info, params, n_params, optim, n_state, &d);
        if (r == -ENOENT)
                return r;
        if (r >= 0 && info.optim_kind != optim_kind)
                r = diag_set(&d, -EINVAL, "%s: written by another optimizer", path);
        if (r < 0) {
                log_warning_errno(r, "Not resuming from the checkpoint, training starts afresh: %s", d.text);
                return r;
        }
        log_info("Resuming from %s: step %llu, %llu epochs done", path, (unsigned long long)info.step,
                 (unsigned long long)info.epoch);
        *ret = info;
        return 0;
}

int stage_checkpoint_load(const char *dir, const char *job, Stage *s, Optim *o, CheckpointInfo *ret) {
        int r = stage_checkpoint_load_layers(dir, job, s->first_layer, s->first_layer + s->n_layers, s->params,
                                             s->n_params, (uint32_t)o->spec.kind, o->state,
                                             optim_state_floats(o->spec.kind, s->n_params), ret);
        if (r >= 0)
                o->t = ret->optim_t;
        return r;
}

int stage_checkpoint_newest(const char *dir, const char *job, int *ret_lo, int *ret_hi) {
        char prefix[160];
        struct timespec newest = {};
        int r = -ENOENT;

        stage_checkpoint_name(job, 0, 0, prefix, sizeof prefix);
        *strstr(prefix, ".layers-") = 0; /* the job's part of every name */
        size_t n = strlen(prefix);
        DIR *d = opendir(dir);
        if (!d)
                return -errno;
        for (struct dirent *e; (e = readdir(d));) {
                int lo, hi, end = 0;
                struct stat st;
                if (strncmp(e->d_name, prefix, n) != 0 ||
                    sscanf(e->d_name + n, ".layers-%d-%d.ckpt%n", &lo, &hi, &end) != 2 ||
                    e->d_name[n + (size_t)end] != 0 || fstatat(dirfd(d), e->d_name, &st, 0) < 0 ||
                    !S_ISREG(st.st_mode))
                        continue;
                if (r == -ENOENT || st.st_mtim.tv_sec > newest.tv_sec ||
                    (st.st_mtim.tv_sec == newest.tv_sec && st.st_mtim.tv_nsec > newest.tv_nsec)) {
                        newest = st.st_mtim;
                        *ret_lo = lo;
                        *ret_hi = hi;
                        r = 0;
                }
        }
        closedir(d);
        return r;
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
        outer_name(job, s, name, sizeof name);
        int r = checkpoint_write(dir, name, &info, anchor, momentum, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to write the outer optimizer's state: %s", d.text);
        return 0;
}

int stage_checkpoint_load_outer(const char *dir, const char *job, const Stage *s, float *anchor, float *momentum,
                                uint64_t want_step) {
        char name[170], path[PATH_MAX + 200];
        CheckpointInfo info;
        Diag d = {};

        outer_name(job, s, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        int r = checkpoint_read(path, &info, anchor, s->n_params, momentum, s->n_params, &d);
        if (r == -ENOENT)
                return r;
        if (r < 0)
                return log_warning_errno(r, "Not resuming the outer optimizer's state: %s", d.text);
        if (info.step != want_step)
                log_warning("%s is from step %llu, the stage's checkpoint from step %llu: the next outer step "
                            "starts from an older anchor", path, (unsigned long long)info.step,
                            (unsigned long long)want_step);
        log_info("Resuming the outer optimizer from %s: %llu outer rounds done", path,
                 (unsigned long long)info.optim_t);
        return 0;
}
