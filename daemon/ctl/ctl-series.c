/* ctl/ctl-series.c — see ctl-series.h. */
#include "ctl-series.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/macro.h"

static const char *const column_names[_SERIES_COLUMN_MAX] = {
        [SERIES_TIME] = "time",
        [SERIES_ELAPSED] = "elapsed",
        [SERIES_EPOCH] = "epoch",
        [SERIES_STEP] = "step",
        [SERIES_TRAIN_LOSS] = "train_loss",
        [SERIES_VALID_LOSS] = "valid_loss",
        [SERIES_SAMPLES_PER_SEC] = "samples_per_sec",
        [SERIES_BUSY] = "busy",
        [SERIES_PIPELINE_BYTES] = "pipeline_bytes",
        [SERIES_AVERAGING_BYTES] = "averaging_bytes",
        [SERIES_AVERAGING_ROUNDS] = "averaging_rounds",
        [SERIES_RSS_BYTES] = "rss_bytes",
};

#define MAX_FIELDS 64
#define MAX_NOTES 5

const char *series_column_to_string(SeriesColumn c) {
        return c >= 0 && c < _SERIES_COLUMN_MAX ? column_names[c] : NULL;
}

void series_data_done(SeriesData *d) {
        for (int c = 0; c < _SERIES_COLUMN_MAX; c++)
                d->col[c] = mfree(d->col[c]);
        d->n = d->cap = 0;
}

/* One line from f into buf, without its newline: its length, -E2BIG when
 * longer than the buffer (the rest of it read and dropped), -ENODATA at the
 * end. */
static int read_line(FILE *f, char *buf, size_t len) {
        if (!fgets(buf, (int)len, f))
                return -ENODATA;
        size_t n = strlen(buf);
        if (n && buf[n - 1] == '\n') {
                buf[--n] = 0;
                if (n && buf[n - 1] == '\r')
                        buf[--n] = 0;
                return (int)n;
        }
        if (feof(f))
                return (int)n;
        int c;
        while ((c = fgetc(f)) != EOF && c != '\n')
                ;
        return -E2BIG;
}

/* The fields of line, cut in place at the commas: their count, at most max
 * (-E2BIG past it). */
static int split(char *line, char **fields, int max) {
        int n = 0;
        for (char *p = line;; p++) {
                if (n == max)
                        return -E2BIG;
                fields[n++] = p;
                p = strchr(p, ',');
                if (!p)
                        return n;
                *p = 0;
        }
}

/* Which field holds each column; -1 for none. */
static int map_header(char *line, int *where) {
        char *fields[MAX_FIELDS];
        int n = split(line, fields, MAX_FIELDS);
        for (int c = 0; c < _SERIES_COLUMN_MAX; c++) {
                where[c] = -1;
                for (int i = 0; i < n; i++)
                        if (!strcmp(fields[i], column_names[c]))
                                where[c] = i;
        }
        return where[SERIES_ELAPSED] >= 0 ? n : -EBADMSG;
}

static int grow(SeriesData *d) {
        size_t cap = d->cap ? d->cap * 2 : 256, bytes;
        if (!size_mul(cap, sizeof(double), &bytes))
                return -ENOMEM;
        for (int c = 0; c < _SERIES_COLUMN_MAX; c++) {
                double *p = realloc(d->col[c], bytes);
                if (!p)
                        return -ENOMEM;
                d->col[c] = p;
        }
        d->cap = cap;
        return 0;
}

/* A row's values: an empty field is NaN (not known); anything but a finite
 * number refuses the row (a message into why). */
static bool parse_row(char *line, int n_fields, const int *where, double *values, char *why, size_t len) {
        char *fields[MAX_FIELDS];
        int n = split(line, fields, MAX_FIELDS);
        if (n != n_fields) {
                snprintf(why, len, "%d fields, the header has %d", MAX(n, 0), n_fields);
                return false;
        }
        for (int c = 0; c < _SERIES_COLUMN_MAX; c++) {
                const char *s = where[c] >= 0 ? fields[where[c]] : "";
                char *end;
                values[c] = NAN;
                if (!*s)
                        continue;
                double v = strtod(s, &end);
                if (*end || !isfinite(v) || end == s) {
                        snprintf(why, len, "%s is \"%.24s\"%s, not a finite number", column_names[c], s,
                                 strlen(s) > 24 ? "…" : "");
                        return false;
                }
                values[c] = v;
        }
        if (isnan(values[SERIES_ELAPSED])) {
                snprintf(why, len, "no elapsed time");
                return false;
        }
        return true;
}

static void note(SeriesData *d, FILE *notes, unsigned line, const char *why) {
        if (notes && d->skipped < MAX_NOTES)
                fprintf(notes, "%s: line %u skipped: %s\n", d->name, line, why);
        d->skipped++;
}

int series_data_read(FILE *f, const char *name, FILE *notes, SeriesData *ret) {
        char line[SERIES_DATA_MAX_LINE], why[128];
        int where[_SERIES_COLUMN_MAX], n_fields, k, r;
        unsigned number = 1;

        *ret = (SeriesData){};
        snprintf(ret->name, sizeof ret->name, "%s", name);
        if ((k = read_line(f, line, sizeof line)) < 0 || (n_fields = map_header(line, where)) < 0)
                return -EBADMSG;
        while (ret->n < SERIES_DATA_MAX_ROWS && (k = read_line(f, line, sizeof line)) != -ENODATA) {
                double values[_SERIES_COLUMN_MAX];
                number++;
                if (k == -E2BIG) {
                        snprintf(why, sizeof why, "longer than %d bytes", SERIES_DATA_MAX_LINE);
                        note(ret, notes, number, why);
                        continue;
                }
                if (k == 0) /* an empty line says nothing */
                        continue;
                if (!parse_row(line, n_fields, where, values, why, sizeof why)) {
                        note(ret, notes, number, why);
                        continue;
                }
                if (ret->n == ret->cap && (r = grow(ret)) < 0) {
                        series_data_done(ret);
                        return r;
                }
                for (int c = 0; c < _SERIES_COLUMN_MAX; c++)
                        ret->col[c][ret->n] = values[c];
                ret->n++;
        }
        if (notes && ret->skipped > MAX_NOTES)
                fprintf(notes, "%s: %u more lines skipped\n", name, ret->skipped - MAX_NOTES);
        return 0;
}
