/* SVG line charts (util/svg-plot.h): well-formed XML (every tag closed,
 * xmllint satisfied when it is installed), text escaped, points that are
 * not finite left out, nice ticks, and sizes out of range refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/svg-plot.h"
#include "../lib/proc.h"

/* Every element closed in order; no raw '<' or bare '&' in text. */
static void expect_balanced(const char *svg) {
        char stack[64][32];
        int depth = 0;
        for (const char *c = svg; *c; c++) {
                if (*c == '&')
                        cr_assert(!strncmp(c, "&amp;", 5) || !strncmp(c, "&lt;", 4) || !strncmp(c, "&gt;", 4) ||
                                  !strncmp(c, "&quot;", 6) || !strncmp(c, "&apos;", 6), "a bare &: %.40s", c);
                if (*c != '<')
                        continue;
                const char *end = strchr(c, '>');
                cr_assert(end, "unclosed tag: %.40s", c);
                if (c[1] == '?') {
                        c = end;
                        continue;
                }
                bool closing = c[1] == '/', empty = end[-1] == '/';
                const char *name = c + 1 + closing;
                size_t len = strcspn(name, " />");
                cr_assert(len > 0 && len < 32, "%.40s", c);
                for (const char *q = c + 1; q < end; q++)
                        cr_assert(*q != '<', "a '<' inside a tag: %.40s", c);
                if (closing) {
                        cr_assert(depth > 0, "</%.*s> closes nothing", (int)len, name);
                        depth--;
                        cr_assert(strlen(stack[depth]) == len && !strncmp(stack[depth], name, len),
                                  "<%s> closed by </%.*s>", stack[depth], (int)len, name);
                } else if (!empty) {
                        cr_assert(depth < 64);
                        memcpy(stack[depth], name, len);
                        stack[depth++][len] = 0;
                }
                c = end;
        }
        cr_assert_eq(depth, 0, "%d elements left open", depth);
}

static char *draw(const SvgPanel *p, size_t n, const char *title) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        cr_assert(f);
        cr_assert_eq(svg_plot_write(f, title, p, n, 800, 300), 0);
        fclose(f);
        return buf;
}

Test(svg_plot, well_formed_with_escaped_text_and_no_bad_points) {
        double x[] = { 0, 2, 4, 6, NAN, 10 }, y1[] = { 2.3, 1.5, NAN, INFINITY, 1.0, 0.8 },
               y2[] = { 100, 120, 130, 125, 140, -INFINITY };
        SvgSeries s[] = {
                { .label = "c1s2 <&\"'> \x01", .x = x, .y = y1, .n = 6 },
                { .label = "c2s2", .x = x, .y = y2, .n = 6 },
                { .label = "empty", .x = x, .y = y1, .n = 0 },
        };
        SvgPanel p[] = {
                { .title = "Loss & <more>", .x_label = "elapsed (s)", .y_label = "loss", .series = s, .n_series = 3 },
                { .title = "Throughput", .x_label = "elapsed (s)", .y_label = "samples/s", .series = s + 1,
                  .n_series = 1 },
        };
        char *svg = draw(p, 2, "run \"x\"");
        expect_balanced(svg);
        cr_expect(strstr(svg, "c1s2 &lt;&amp;&quot;&apos;&gt; </text>"), "%s", svg);
        cr_expect(strstr(svg, "Loss &amp; &lt;more&gt;"));
        cr_expect(!strchr(svg, '\x01'));
        cr_expect(!strstr(svg, "nan") && !strstr(svg, "inf"), "%s", svg);
        cr_expect_eq(test_count(svg, "<polyline"), 3, "one a series with points, in both panels"); /* not "empty" */
        cr_expect_eq(test_count(svg, "data-series=\"c2s2\""), 2);
        const char *pts = strstr(strstr(svg, "data-series=\"c1s2"), "points=\"");
        cr_assert(pts);
        char *list = strndup(pts, strcspn(pts + 8, "\"") + 8);
        cr_expect_eq(test_count(list, ","), 3, "three finite points: %.200s", pts);
        free(list);

        char path[] = "/tmp/ravnest-test-svg-XXXXXX";
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, svg, strlen(svg)), (ssize_t)strlen(svg));
        close(fd);
        if (system("command -v xmllint >/dev/null 2>&1") == 0) {
                char cmd[128];
                snprintf(cmd, sizeof cmd, "xmllint --noout %s", path);
                cr_expect_eq(system(cmd), 0, "xmllint refused it");
        } else
                cr_log_warn("xmllint is not installed: the well-formedness check is this test's own");
        unlink(path);
        free(svg);
}

Test(svg_plot, nothing_to_draw_is_still_a_chart) {
        SvgPanel p = { .title = "Empty" };
        char *svg = draw(&p, 1, NULL);
        expect_balanced(svg);
        cr_expect_eq(test_count(svg, "<polyline"), 0);
        free(svg);
        double x[] = { 5 }, y[] = { 3 };
        SvgSeries s = { .label = "one", .x = x, .y = y, .n = 1 };
        p.series = &s, p.n_series = 1;
        svg = draw(&p, 1, NULL);
        expect_balanced(svg);
        cr_expect_eq(test_count(svg, "<polyline"), 1);
        free(svg);
}

Test(svg_plot, nice_ticks) {
        double t[SVG_MAX_TICKS], lo = 0.13, hi = 9.7;
        int n = svg_ticks(&lo, &hi, t, 6);
        cr_assert(n >= 2 && n <= 6, "%d", n);
        cr_expect(lo <= 0.13 && hi >= 9.7 && lo == t[0] && hi == t[n - 1]);
        cr_expect_float_eq(t[1] - t[0], 2.0, 1e-9);
        lo = hi = 5;
        n = svg_ticks(&lo, &hi, t, 6);
        cr_expect(n >= 2 && lo < 5 && hi > 5, "%d %g %g", n, lo, hi);
        lo = NAN, hi = 1;
        n = svg_ticks(&lo, &hi, t, 6);
        cr_expect(n >= 2 && lo == 0 && hi == 1);
        lo = 0, hi = 1e12;
        n = svg_ticks(&lo, &hi, t, 16);
        cr_expect(n >= 2 && n <= 16 && hi >= 1e12);
}

Test(svg_plot, sizes_out_of_range) {
        FILE *f = fopen("/dev/null", "we");
        cr_expect_eq(svg_plot_write(f, NULL, NULL, 0, 10, 300), -EINVAL);
        cr_expect_eq(svg_plot_write(f, NULL, NULL, 0, 800, 10), -EINVAL);
        fclose(f);
}
