/* A node's series file (run/series.h): the header and rows of twelve
 * fields, empty where a figure is not known; a second run goes on with the
 * clock of the rows there; a file of another kind starts again; a write
 * that fails is returned once and the series stops. And the samples/s a
 * node publishes and writes, over a sliding window or a row's. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "run/series.h"
#include "../lib/proc.h"

static char dir[] = "/tmp/ravnest-test-series-XXXXXX";

static void setup(void) {
        cr_assert(mkdtemp(dir));
}

static void teardown(void) {
        test_remove_tree(dir);
}

TestSuite(series, .init = setup, .fini = teardown);

static size_t read_file(const char *job, char *buf, size_t len) {
        char path[256];
        cr_assert_eq(series_path(dir, job, path, sizeof path), 0);
        FILE *f = fopen(path, "re");
        cr_assert(f, "%s", path);
        size_t n = fread(buf, 1, len - 1, f);
        buf[n] = 0;
        fclose(f);
        return n;
}

static int fields(const char *line) {
        int n = 1;
        for (; *line && *line != '\n'; line++)
                n += *line == ',';
        return n;
}

Test(series, a_header_then_rows_of_twelve_fields) {
        Series s;
        char text[4096];
        cr_assert_eq(series_open(&s, dir, "mlp"), 0);
        cr_expect(!series_due(&s, 0), "a row is due 2 s after the start");
        SeriesRow row = { .epoch = 2, .step = 40, .train_loss = 0.5, .valid_loss = -1, .samples_per_sec = 1200,
                          .busy = 0.75, .pipeline_bytes = 1000, .averaging_bytes = 20, .averaging_rounds = 3,
                          .rss_bytes = 4096 };
        cr_assert_eq(series_append(&s, &row), 0);
        row = (SeriesRow){ .epoch = 0, .step = 41, .train_loss = NAN, .valid_loss = INFINITY, .samples_per_sec = -1,
                           .busy = -1 };
        cr_assert_eq(series_append(&s, &row), 0);
        series_close(&s);
        series_close(&s); /* twice is fine */

        read_file("mlp", text, sizeof text);
        cr_assert(!strncmp(text, SERIES_HEADER "\n", strlen(SERIES_HEADER) + 1), "%s", text);
        cr_expect_eq(fields(SERIES_HEADER), 12);
        char *first = strchr(text, '\n') + 1, *second = strchr(first, '\n') + 1;
        cr_expect_eq(fields(first), 12, "%s", first);
        cr_expect_eq(fields(second), 12, "%s", second);
        double t, elapsed;
        cr_assert_eq(sscanf(first, "%lf,%lf,", &t, &elapsed), 2);
        cr_expect(t > 1.6e9 && elapsed >= 0 && elapsed < 1, "%s", first);
        cr_expect(strstr(first, ",2,40,0.5,,1200,0.75,1000,20,3,4096\n"), "%s", first);
        cr_expect(strstr(second, ",,41,,,,,0,0,0,\n"), "%s", second);
        cr_expect_eq(*strchr(second, '\n'), '\n');
        cr_expect_eq(strchr(second, '\n')[1], 0);
}

Test(series, a_second_run_goes_on_with_the_clock_there) {
        char path[256], text[4096];
        cr_assert_eq(series_path(dir, "mlp", path, sizeof path), 0);
        FILE *f = fopen(path, "we");
        /* a first row written 100 s ago, 10 s into the series */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        fprintf(f, SERIES_HEADER "\n%.3f,10.000,1,5,,,,,0,0,0,\n", (double)now.tv_sec - 100);
        fclose(f);
        Series s;
        cr_assert_eq(series_open(&s, dir, "mlp"), 0);
        cr_assert_eq(series_append(&s, &(SeriesRow){ .busy = -1 }), 0);
        series_close(&s);
        read_file("mlp", text, sizeof text);
        const char *last = strrchr(text, '\n');
        while (last > text && last[-1] != '\n')
                last--;
        double t, elapsed;
        cr_assert_eq(sscanf(last, "%lf,%lf,", &t, &elapsed), 2, "%s", text);
        cr_expect(elapsed >= 109.5 && elapsed < 112, "elapsed %f\n%s", elapsed, text);
}

Test(series, a_file_of_another_kind_starts_again) {
        char path[256], text[4096];
        cr_assert_eq(series_path(dir, "a/b", path, sizeof path), 0);
        cr_expect(strstr(path, "/a_b.series.csv"), "%s", path);
        FILE *f = fopen(path, "we");
        fprintf(f, "something,else\n1,2\n");
        fclose(f);
        Series s;
        cr_assert_eq(series_open(&s, dir, "a/b"), 0);
        series_close(&s);
        read_file("a/b", text, sizeof text);
        cr_expect_str_eq(text, SERIES_HEADER "\n");
}

Test(series, a_failed_write_is_said_once_then_the_series_stops) {
        Series s;
        cr_assert_eq(series_open(&s, dir, "mlp"), 0);
        int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
        if (full < 0)
                cr_skip_test("no /dev/full");
        cr_assert(dup2(full, s.fd) >= 0);
        close(full);
        SeriesRow row = { .busy = -1 };
        cr_expect_eq(series_append(&s, &row), -ENOSPC);
        cr_expect_eq(s.fd, -1);
        cr_expect(!series_due(&s, UINT64_MAX));
        cr_expect_eq(series_append(&s, &row), 0);
        series_close(&s);
}

Test(series, no_directory_no_series) {
        Series s;
        cr_expect_eq(series_open(&s, "/nonexistent/ravnest", "mlp"), -ENOENT);
        cr_expect_eq(s.fd, -1);
        cr_expect_eq(series_append(&s, &(SeriesRow){}), 0);
}

#define MS 1000000ULL

/* The published samples/s: with a 2 s window, called every 250 ms, it is
 * that of the last 2 s (since the start before), whatever came before;
 * with a window of 0, called at every row, that of the row's window alone
 * (a last row short of 2 s included). */
Test(series, a_rate_over_the_last_2_s_or_since_the_last_call) {
        SeriesRate r;
        double rate;
        series_rate_start(&r, SERIES_INTERVAL_NS, 0, 0);
        rate = series_rate(&r, 0, 0);
        cr_expect_eq(rate, 0, "a rate over no time: %g", rate);
        rate = series_rate(&r, 100, 250 * MS);
        cr_expect_float_eq(rate, 400, 1e-9, "since the start: %g", rate);
        uint64_t samples = 100;
        for (uint64_t t = 500 * MS; t <= 4000 * MS; t += 250 * MS) /* 400/s, then 1000/s from 2 s */
                series_rate(&r, samples += t <= 2000 * MS ? 100 : 250, t);
        rate = series_rate(&r, samples += 250, 4250 * MS);
        cr_expect_float_eq(rate, 1000, 1e-9, "the last 2 s: %g", rate);
        rate = series_rate(&r, samples, 6250 * MS);
        cr_expect_float_eq(rate, 0, 1e-9, "after a pause of 2 s: %g", rate);

        /* marks every millisecond: past SERIES_RATE_MARKS the oldest go */
        series_rate_start(&r, SERIES_INTERVAL_NS, 0, 0);
        for (uint64_t t = 1; t <= 100; t++)
                series_rate(&r, t * 10, t * MS);
        cr_expect_leq(r.n_marks, SERIES_RATE_MARKS);
        rate = series_rate(&r, 1010, 101 * MS);
        cr_expect_float_eq(rate, 10000, 1e-6, "%g", rate);

        series_rate_start(&r, 0, 1000, 0);
        rate = series_rate(&r, 1400, 2000 * MS);
        cr_expect_float_eq(rate, 200, 1e-9, "the first row: %g", rate);
        rate = series_rate(&r, 2400, 4000 * MS);
        cr_expect_float_eq(rate, 500, 1e-9, "the second row: %g", rate);
        rate = series_rate(&r, 2500, 4500 * MS);
        cr_expect_float_eq(rate, 200, 1e-9, "a last row of 0.5 s: %g", rate);
}
