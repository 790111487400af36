/* ctl/ctl-series.h — a node's series file (run/series.h) read back for
 * `ravnestctl plot`: its columns as arrays of numbers, by the names in its
 * header, so a file with the columns in another order, or with fewer, still
 * reads. A file is what anyone could have written: a line that is too long,
 * has too few fields, or a field that is not a finite number is skipped with
 * a note (the first few said on `notes`, the rest counted), never trusted.
 *
 *     SeriesData d = {};
 *     r = series_data_read(f, "c1s2", stderr, &d);   // -EBADMSG: no header with elapsed
 *     for (size_t i = 0; i < d.n; i++) use(d.col[SERIES_ELAPSED][i], d.col[SERIES_TRAIN_LOSS][i]);
 *     series_data_done(&d);
 */
#pragma once

#include <stddef.h>
#include <stdio.h>

typedef enum SeriesColumn {
        SERIES_TIME,
        SERIES_ELAPSED,
        SERIES_EPOCH,
        SERIES_STEP,
        SERIES_TRAIN_LOSS,
        SERIES_VALID_LOSS,
        SERIES_SAMPLES_PER_SEC,
        SERIES_BUSY,
        SERIES_PIPELINE_BYTES,
        SERIES_AVERAGING_BYTES,
        SERIES_AVERAGING_ROUNDS,
        SERIES_RSS_BYTES,
        _SERIES_COLUMN_MAX,
} SeriesColumn;

#define SERIES_DATA_MAX_ROWS 1000000 /* a year of rows every 30 s, or 23 days of rows every 2 s */
#define SERIES_DATA_MAX_LINE 4096

typedef struct SeriesData {
        char name[64];
        size_t n, cap;
        double *col[_SERIES_COLUMN_MAX];    /* n values each; NaN: empty, or no such column */
        unsigned skipped;                   /* lines refused */
} SeriesData;

const char *series_column_to_string(SeriesColumn c);
/* Reads f to its end (or SERIES_DATA_MAX_ROWS rows). 0, -EBADMSG when the
 * header has no elapsed column, -ENOMEM. notes may be NULL. */
int series_data_read(FILE *f, const char *name, FILE *notes, SeriesData *ret);
void series_data_done(SeriesData *d);
