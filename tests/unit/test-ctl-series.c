/* A series file read back for `ravnestctl plot` (ctl/ctl-series.h): the
 * columns by their header's names, whatever their order; and what anyone
 * could have written — garbage, a huge field, NaN, too few fields, no
 * header — skipped line by line with a note, never a crash; and a
 * model's text printed without the control bytes it may hold. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/ctl-common.h"
#include "ctl/ctl-series.h"
#include "run/series.h"

static int read_text(const char *text, SeriesData *d, char **notes) {
        FILE *f = fmemopen((void *)text, strlen(text), "r");
        size_t len;
        FILE *n = open_memstream(notes, &len);
        cr_assert(f && n);
        int r = series_data_read(f, "node", n, d);
        fclose(f);
        fclose(n);
        return r;
}

Test(ctl_series, what_a_node_writes_reads_back) {
        SeriesData d;
        char *notes;
        cr_assert_eq(read_text(SERIES_HEADER "\n"
                               "1700000000.000,0.000,1,10,2.5,,300,0.9,100,20,0,4096\n"
                               "1700000002.000,2.000,,11,,1.5,310,,200,40,1,4096\n", &d, &notes), 0);
        cr_assert_eq(d.n, 2);
        cr_expect_eq(d.skipped, 0, "%s", notes);
        cr_expect_float_eq(d.col[SERIES_ELAPSED][1], 2.0, 1e-9);
        cr_expect_float_eq(d.col[SERIES_TRAIN_LOSS][0], 2.5, 1e-9);
        cr_expect(isnan(d.col[SERIES_TRAIN_LOSS][1]) && isnan(d.col[SERIES_EPOCH][1]));
        cr_expect_float_eq(d.col[SERIES_VALID_LOSS][1], 1.5, 1e-9);
        cr_expect_float_eq(d.col[SERIES_AVERAGING_ROUNDS][1], 1, 1e-9);
        series_data_done(&d);
        free(notes);
}

Test(ctl_series, columns_by_name_and_missing_ones_empty) {
        SeriesData d;
        char *notes;
        cr_assert_eq(read_text("samples_per_sec,unknown,elapsed\n5,x,1\r\n7,y,3\n", &d, &notes), 0);
        cr_assert_eq(d.n, 2);
        cr_expect_float_eq(d.col[SERIES_SAMPLES_PER_SEC][1], 7, 1e-9);
        cr_expect_float_eq(d.col[SERIES_ELAPSED][1], 3, 1e-9);
        cr_expect(isnan(d.col[SERIES_TRAIN_LOSS][0]));
        series_data_done(&d);
        free(notes);
}

Test(ctl_series, hostile_lines_are_skipped_with_a_note) {
        size_t huge = 100000;
        char *text = malloc(huge + 4096);
        strcpy(text, SERIES_HEADER "\n1,0,1,1,1,,1,1,1,1,1,1\n");
        size_t n = strlen(text);
        memset(text + n, '9', huge); /* a field of 100000 digits */
        strcpy(text + n + huge, ",0,1,1,1,,1,1,1,1,1,1\n"
                                "1,nan,1,1,1,,1,1,1,1,1,1\n"        /* NaN */
                                "1,2,1,1,inf,,1,1,1,1,1,1\n"        /* Inf */
                                "1,3,1,1,abc,,1,1,1,1,1,1\n"        /* garbage */
                                "1,4,1\n"                           /* too few fields */
                                "1,5,1,1,1,,1,1,1,1,1,1,1,1\n"      /* too many */
                                "1,,1,1,1,,1,1,1,1,1,1\n"           /* no elapsed */
                                ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,\n"
                                "\x01\x02\xff\n"
                                "\n"
                                "1,1e400,1,1,1,,1,1,1,1,1,1\n"      /* out of range */
                                "1,9,1,1,0.5,,1,1,1,1,1,1");        /* the last line, without its newline */
        SeriesData d;
        char *notes;
        cr_assert_eq(read_text(text, &d, &notes), 0);
        cr_expect_eq(d.n, 2, "%zu rows", d.n);
        cr_expect_eq(d.skipped, 10, "%u skipped\n%s", d.skipped, notes);
        cr_expect_float_eq(d.col[SERIES_ELAPSED][1], 9, 1e-9);
        cr_expect(strstr(notes, "node: line 3 skipped: longer than 4096 bytes"), "%s", notes);
        cr_expect(strstr(notes, "5 more lines skipped"), "%s", notes);
        series_data_done(&d);
        free(notes);
        free(text);
}

Test(ctl_series, no_header_no_series) {
        SeriesData d;
        char *notes;
        cr_expect_eq(read_text("", &d, &notes), -EBADMSG);
        free(notes);
        cr_expect_eq(read_text("time,step\n1,2\n", &d, &notes), -EBADMSG);
        free(notes);
        cr_expect_eq(read_text("\x89PNG\r\n\x1a\n", &d, &notes), -EBADMSG);
        free(notes);
        series_data_done(&d);
}

/* A model's sampled text reaches the terminal without the control bytes
 * that would act on it (an escape sequence sampled at random). */
Test(ctl_text, control_bytes_are_written_as_escapes, .init = cr_redirect_stdout) {
        const uint8_t text[] = "ok\t\x1b[31mred\x07\x7f\n\xc3\xa9";
        ctl_print_text(text, sizeof text - 1);
        fflush(stdout);
        cr_assert_stdout_eq_str("ok\t\\x1b[31mred\\x07\\x7f\n\xc3\xa9");
}
