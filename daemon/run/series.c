/* run/series.c — see series.h. */
#include "series.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/macro.h"
#include "util/time-util.h"

static double now_unix(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int series_path(const char *dir, const char *job, char *buf, size_t len) {
        int n = snprintf(buf, len, "%s/%s" SERIES_SUFFIX, dir, job);
        if (n < 0 || (size_t)n >= len)
                return -ENAMETOOLONG;
        for (char *c = buf + strlen(dir) + 1; *c; c++) /* a job's name is not a path */
                if (*c == '/')
                        *c = '_';
        return 0;
}

/* The clock of the rows already in the file: the unix time of elapsed 0,
 * from its first row; now when it has none, or one that makes no sense (a
 * time ahead of now, or more than a year back). */
static double origin_of(const char *text, double now) {
        const char *row = strchr(text, '\n');
        double t, elapsed;
        if (!row || sscanf(row + 1, "%lf,%lf,", &t, &elapsed) != 2 || !isfinite(t) || !isfinite(elapsed))
                return now;
        double origin = t - elapsed;
        return origin <= now && origin > now - 366 * 86400.0 ? origin : now;
}

/* An existing series goes on; an empty file, or one with another header,
 * starts with the header. */
static int series_start(Series *s) {
        char text[1024];
        double now = now_unix();
        ssize_t n = pread(s->fd, text, sizeof text - 1, 0);
        if (n < 0)
                return -errno;
        text[n] = 0;
        size_t h = strlen(SERIES_HEADER);
        if ((size_t)n > h && !memcmp(text, SERIES_HEADER, h) && text[h] == '\n') {
                s->origin = origin_of(text, now);
                return 0;
        }
        if (n > 0 && ftruncate(s->fd, 0) < 0)
                return -errno;
        s->origin = now;
        ssize_t k = write(s->fd, SERIES_HEADER "\n", h + 1);
        return k < 0 ? -errno : (size_t)k != h + 1 ? -EIO : 0;
}

int series_open(Series *s, const char *dir, const char *job) {
        char path[PATH_MAX];
        int r;

        *s = SERIES_CLOSED;
        if ((r = series_path(dir, job, path, sizeof path)) < 0)
                return r;
        s->fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (s->fd < 0)
                return -errno;
        if ((r = series_start(s)) < 0) {
                series_close(s);
                return r;
        }
        s->next_ns = now_ns() + SERIES_INTERVAL_NS;
        return 0;
}

bool series_due(const Series *s, uint64_t now) {
        return s->fd >= 0 && now >= s->next_ns;
}

/* Appends one field to line (of size LINE), with its comma; what does not fit
 * is cut (it cannot happen with the formats below: every figure is bounded). */
#define LINE 512
_printf_(3, 4) static void put(char *line, size_t *n, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(line + *n, LINE - *n, fmt, ap);
        va_end(ap);
        if (k > 0)
                *n = MIN(*n + (size_t)k, (size_t)LINE - 1);
}

static void put_optional(char *line, size_t *n, double v, bool known) {
        if (known && isfinite(v))
                put(line, n, "%.6g,", v);
        else
                put(line, n, ",");
}

int series_append(Series *s, const SeriesRow *row) {
        char line[LINE];
        size_t n = 0;
        double now = now_unix();

        if (s->fd < 0)
                return 0;
        put(line, &n, "%.3f,%.3f,", now, MAX(now - s->origin, 0.0));
        if (row->epoch > 0)
                put(line, &n, "%d", row->epoch);
        put(line, &n, ",%llu,", (unsigned long long)row->step);
        put_optional(line, &n, row->train_loss, row->train_loss >= 0);
        put_optional(line, &n, row->valid_loss, row->valid_loss >= 0);
        put_optional(line, &n, row->samples_per_sec, row->samples_per_sec >= 0);
        put_optional(line, &n, CLAMP(row->busy, 0.0, 1.0), row->busy >= 0);
        put(line, &n, "%llu,%llu,%llu,", (unsigned long long)row->pipeline_bytes,
            (unsigned long long)row->averaging_bytes, (unsigned long long)row->averaging_rounds);
        if (row->rss_bytes)
                put(line, &n, "%llu", (unsigned long long)row->rss_bytes);
        put(line, &n, "\n");
        s->next_ns = now_ns() + SERIES_INTERVAL_NS;

        ssize_t k = write(s->fd, line, n);
        if (k == (ssize_t)n)
                return 0;
        int r = k < 0 ? -errno : -EIO;
        series_close(s); /* reported once: the series stops, training goes on */
        return r;
}

void series_close(Series *s) {
        if (s->fd >= 0)
                close(s->fd);
        s->fd = -1;
}

void series_rate_start(SeriesRate *r, uint64_t window_ns, uint64_t samples, uint64_t now_ns) {
        *r = (SeriesRate){ .window_ns = window_ns, .marks[0] = { .ns = now_ns, .samples = samples }, .n_marks = 1 };
}

double series_rate(SeriesRate *r, uint64_t samples, uint64_t now_ns) {
        unsigned n = r->n_marks, old = 0;
        while (n - old >= 2 && now_ns - r->marks[old + 1].ns >= r->window_ns)
                old++;
        if (n - old == ELEMENTSOF(r->marks))
                old++;
        n -= old;
        memmove(r->marks, r->marks + old, n * sizeof r->marks[0]);
        uint64_t span = n ? now_ns - r->marks[0].ns : 0;
        double rate = span ? (double)(samples - r->marks[0].samples) / ns_to_sec(span) : 0;
        r->marks[n].ns = now_ns;
        r->marks[n].samples = samples;
        r->n_marks = n + 1;
        return rate;
}
