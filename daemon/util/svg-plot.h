/* util/svg-plot.h — line charts as SVG, small and dependency-free: panels
 * stacked one above the other, each with its axes, "nice" ticks (1, 2 or 5
 * times a power of ten), grid lines, one polyline per series and a legend.
 * Text is escaped for XML; points that are not finite are left out. What
 * `ravnestctl plot` draws, and what a status page can draw too (write into
 * open_memstream() for a string).
 *
 *     double x[] = { 0, 2, 4 }, y[] = { 2.3, 1.1, NAN };
 *     SvgSeries s = { .label = "c1s2", .x = x, .y = y, .n = 3 };
 *     SvgPanel p = { .title = "Training loss", .x_label = "elapsed (s)", .series = &s, .n_series = 1 };
 *     r = svg_plot_write(stdout, "A run", &p, 1, 800, 300);
 */
#pragma once

#include <stddef.h>
#include <stdio.h>

typedef struct SvgSeries {
        const char *label;
        const double *x, *y;      /* n points; a point with a coordinate that is not finite is skipped */
        size_t n;
} SvgSeries;

typedef struct SvgPanel {
        const char *title, *x_label, *y_label;
        const SvgSeries *series;
        size_t n_series;
} SvgPanel;

#define SVG_MAX_TICKS 16

/* The whole document: a title (may be NULL), then the panels, each width x
 * panel_height pixels (at least 200 x 120). -EINVAL for sizes out of range,
 * -EIO when f fails. Series beyond the palette's colours reuse them. */
int svg_plot_write(FILE *f, const char *title, const SvgPanel *panels, size_t n_panels, unsigned width,
                   unsigned panel_height);
/* text with & < > " ' as entities; control characters other than tab and
 * newline dropped (XML 1.0 has no place for them). */
void svg_escape(FILE *f, const char *text);
/* Ticks covering [*lo, *hi], which are widened to whole ticks: their count
 * (2 to max), at most max into ticks. An empty or reversed range is widened
 * first. */
int svg_ticks(double *lo, double *hi, double *ticks, int max);
