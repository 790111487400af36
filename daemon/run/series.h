/* run/series.h — a training node's series: one CSV row every 2 s (and one
 * at the end) appended to "<state_directory>/<job>.series.csv", next to its
 * checkpoints, for `ravnestctl plot` and anyone with a spreadsheet.
 *
 * The columns (the header line names them; an empty field: not known here):
 *
 *     time              unix time, seconds, 3 decimals
 *     elapsed           seconds since the series began (a restarted node
 *                       goes on with the clock of the rows already there)
 *     epoch             1-based; empty where the stage does not read the data
 *     step              updates since the start, checkpoints included
 *     train_loss        over the last 2 s; empty where the stage has none
 *     valid_loss        of the last evaluation on the test set
 *     samples_per_sec
 *     busy              fraction of the last 2 s not spent waiting, 0 to 1
 *     pipeline_bytes    sent and received over the pipeline links, in all
 *     averaging_bytes   sent and received to average, in all
 *     averaging_rounds  done
 *     rss_bytes         resident memory of the process
 *
 * Every row is one write() of a line of bounded length (no buffer grows);
 * a write that fails is returned once, then the series stops and training
 * goes on.
 *
 *     Series s;
 *     r = series_open(&s, dir, job->name);      // -errno: no series (s is closed)
 *     if (series_due(&s, now_ns()))
 *             r = series_append(&s, &row);      // -errno once; then nothing more
 *     series_close(&s);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SERIES_INTERVAL_NS (2 * 1000000000ULL)
#define SERIES_HEADER "time,elapsed,epoch,step,train_loss,valid_loss,samples_per_sec,busy,pipeline_bytes," \
                      "averaging_bytes,averaging_rounds,rss_bytes"
#define SERIES_SUFFIX ".series.csv"

typedef struct SeriesRow {
        int32_t epoch;            /* <= 0: not known here */
        uint64_t step;
        double train_loss;        /* < 0 or not finite: none */
        double valid_loss;        /* < 0 or not finite: none */
        double samples_per_sec;   /* < 0: not known */
        double busy;              /* 0 to 1; < 0: not known */
        uint64_t pipeline_bytes, averaging_bytes, averaging_rounds;
        uint64_t rss_bytes;       /* 0: not known */
} SeriesRow;

typedef struct Series {
        int fd;                   /* -1: closed, or stopped after an error */
        double origin;            /* unix time of elapsed 0 */
        uint64_t next_ns;         /* CLOCK_MONOTONIC: when the next row is due */
} Series;

#define SERIES_CLOSED ((Series){ .fd = -1 })

/* The samples/s a node publishes and writes in its rows: samples per
 * second of the wall clock (rests and pauses included) since a mark, each
 * call marking now. The window slides: the oldest mark kept is the last
 * one at least window_ns before now (the first mark while none is). With
 * window_ns SERIES_INTERVAL_NS and a call at every report, the last 2 s,
 * and since the start in the first 2 s (a stage's); with window_ns 0, since
 * the last call: with a call at every row, the row's window (a standalone
 * node's). At most SERIES_RATE_MARKS marks: past them, the oldest go.
 *
 *     SeriesRate rate;
 *     series_rate_start(&rate, SERIES_INTERVAL_NS, samples, now_ns());
 *     t.samples_per_sec = series_rate(&rate, samples, now_ns());   // again and again
 */
#define SERIES_RATE_MARKS 16

typedef struct SeriesRate {
        uint64_t window_ns;
        struct {
                uint64_t ns, samples;
        } marks[SERIES_RATE_MARKS];
        unsigned n_marks;
} SeriesRate;

void series_rate_start(SeriesRate *r, uint64_t window_ns, uint64_t samples, uint64_t now_ns);
/* 0 over no time. */
double series_rate(SeriesRate *r, uint64_t samples, uint64_t now_ns);

/* Opens (creates) the file for appending; a file that holds another kind of
 * series is started again. */
int series_open(Series *s, const char *dir, const char *job);
/* Whether a row is due (never on a closed series). */
bool series_due(const Series *s, uint64_t now_ns);
/* Appends a row now, stamped with the time, whether due or not. */
int series_append(Series *s, const SeriesRow *row);
void series_close(Series *s);
/* "<dir>/<job>.series.csv" into buf; -ENAMETOOLONG when it does not fit. */
int series_path(const char *dir, const char *job, char *buf, size_t len);
