/* util/svg-plot.c — see svg-plot.h. */
#include "svg-plot.h"

#include <errno.h>
#include <math.h>

#include "macro.h"

static const char *const palette[] = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                       "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" };

/* the plot area inside a panel */
#define MARGIN_LEFT 70
#define MARGIN_RIGHT 140 /* the legend */
#define MARGIN_TOP 30
#define MARGIN_BOTTOM 45
#define TITLE_HEIGHT 30

void svg_escape(FILE *f, const char *text) {
        for (const unsigned char *c = (const unsigned char *)text; text && *c; c++)
                switch (*c) {
                case '&': fputs("&amp;", f); break;
                case '<': fputs("&lt;", f); break;
                case '>': fputs("&gt;", f); break;
                case '"': fputs("&quot;", f); break;
                case '\'': fputs("&apos;", f); break;
                default:
                        if (*c >= 0x20 || *c == '\t' || *c == '\n')
                                fputc(*c, f);
        }
}

int svg_ticks(double *lo, double *hi, double *ticks, int max) {
        double a = *lo, b = *hi;
        if (!isfinite(a) || !isfinite(b) || a > b)
                a = 0, b = 1;
        if (b - a < 1e-12 * MAX(fabs(a), 1.0)) { /* one value: a range around it */
                double pad = a ? fabs(a) * 0.1 : 1;
                a -= pad, b += pad;
        }
        max = CLAMP(max, 2, SVG_MAX_TICKS);
        double raw = (b - a) / (max > 6 ? 5 : max - 1), mag = pow(10, floor(log10(raw)));
        double step = raw <= mag ? mag : raw <= 2 * mag ? 2 * mag : raw <= 5 * mag ? 5 * mag : 10 * mag;
        double first = floor(a / step) * step, last = ceil(b / step) * step;
        int n = (int)llround((last - first) / step) + 1;
        while (n > max) { /* rounding out added ticks: a wider step */
                step *= 2;
                first = floor(a / step) * step;
                last = ceil(b / step) * step;
                n = (int)llround((last - first) / step) + 1;
        }
        for (int i = 0; i < n; i++)
                ticks[i] = first + i * step;
        *lo = first, *hi = last;
        return n;
}

typedef struct Frame {
        double x0, y0, w, h;      /* the plot area, pixels */
        double xlo, xhi, ylo, yhi;
} Frame;

static double px(const Frame *fr, double x) {
        return fr->x0 + (x - fr->xlo) / (fr->xhi - fr->xlo) * fr->w;
}

static double py(const Frame *fr, double y) {
        return fr->y0 + fr->h - (y - fr->ylo) / (fr->yhi - fr->ylo) * fr->h;
}

static void data_range(const SvgPanel *p, double *xlo, double *xhi, double *ylo, double *yhi) {
        *xlo = *ylo = INFINITY;
        *xhi = *yhi = -INFINITY;
        for (size_t s = 0; s < p->n_series; s++)
                for (size_t i = 0; i < p->series[s].n; i++) {
                        double x = p->series[s].x[i], y = p->series[s].y[i];
                        if (!isfinite(x) || !isfinite(y))
                                continue;
                        *xlo = MIN(*xlo, x), *xhi = MAX(*xhi, x);
                        *ylo = MIN(*ylo, y), *yhi = MAX(*yhi, y);
                }
}

static void text(FILE *f, double x, double y, const char *anchor, const char *extra, const char *s) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>", x, y, anchor, extra);
        svg_escape(f, s);
        fputs("</text>\n", f);
}

/* Axes, ticks with their grid lines and labels. */
static void draw_axes(FILE *f, const Frame *fr, const double *xt, int nx, const double *yt, int ny) {
        char label[32];
        fprintf(f, "<g stroke=\"#ddd\" stroke-width=\"1\">\n");
        for (int i = 0; i < nx; i++)
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", px(fr, xt[i]), fr->y0,
                        px(fr, xt[i]), fr->y0 + fr->h);
        for (int i = 0; i < ny; i++)
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", fr->x0, py(fr, yt[i]),
                        fr->x0 + fr->w, py(fr, yt[i]));
        fprintf(f, "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
                fr->x0, fr->y0, fr->w, fr->h);
        for (int i = 0; i < nx; i++) {
                snprintf(label, sizeof label, "%.6g", fabs(xt[i]) < 1e-12 ? 0 : xt[i]);
                text(f, px(fr, xt[i]), fr->y0 + fr->h + 16, "middle", "", label);
        }
        for (int i = 0; i < ny; i++) {
                snprintf(label, sizeof label, "%.6g", fabs(yt[i]) < 1e-12 * (fabs(yt[ny - 1]) + 1) ? 0 : yt[i]);
                text(f, fr->x0 - 6, py(fr, yt[i]) + 4, "end", "", label);
        }
}

/* One polyline per series that has a point; its colour in the legend. */
static void draw_series(FILE *f, const Frame *fr, const SvgPanel *p) {
        for (size_t s = 0; s < p->n_series; s++) {
                const SvgSeries *se = &p->series[s];
                const char *colour = palette[s % ELEMENTSOF(palette)];
                size_t points = 0;
                for (size_t i = 0; i < se->n; i++)
                        points += isfinite(se->x[i]) && isfinite(se->y[i]);
                if (points) {
                        fprintf(f, "<polyline data-series=\"");
                        svg_escape(f, se->label);
                        fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", colour);
                        for (size_t i = 0; i < se->n; i++)
                                if (isfinite(se->x[i]) && isfinite(se->y[i]))
                                        fprintf(f, "%.1f,%.1f ", px(fr, se->x[i]), py(fr, se->y[i]));
                        fprintf(f, "\"/>\n");
                }
                for (size_t i = 0; i < se->n && points == 1; i++) /* one point: a dot, or nothing shows */
                        if (isfinite(se->x[i]) && isfinite(se->y[i]))
                                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(fr, se->x[i]),
                                        py(fr, se->y[i]), colour);
                double ly = fr->y0 + 12 + 16 * (double)s;
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                        fr->x0 + fr->w + 12, ly - 4, fr->x0 + fr->w + 32, ly - 4, colour);
                text(f, fr->x0 + fr->w + 38, ly, "start", points ? "" : " fill=\"#999\"", se->label ? se->label : "");
        }
}

static void draw_panel(FILE *f, const SvgPanel *p, double top, unsigned width, unsigned height) {
        double xt[SVG_MAX_TICKS], yt[SVG_MAX_TICKS];
        Frame fr = { .x0 = MARGIN_LEFT, .y0 = top + MARGIN_TOP, .w = width - MARGIN_LEFT - MARGIN_RIGHT,
                     .h = height - MARGIN_TOP - MARGIN_BOTTOM };

        data_range(p, &fr.xlo, &fr.xhi, &fr.ylo, &fr.yhi);
        int nx = svg_ticks(&fr.xlo, &fr.xhi, xt, 8), ny = svg_ticks(&fr.ylo, &fr.yhi, yt, 6);
        if (p->title)
                text(f, fr.x0 + fr.w / 2, top + 20, "middle", " font-weight=\"bold\"", p->title);
        draw_axes(f, &fr, xt, nx, yt, ny);
        if (p->x_label)
                text(f, fr.x0 + fr.w / 2, fr.y0 + fr.h + 36, "middle", "", p->x_label);
        if (p->y_label) {
                char rotate[96];
                snprintf(rotate, sizeof rotate, " transform=\"rotate(-90 %.1f %.1f)\"", 16.0, fr.y0 + fr.h / 2);
                text(f, 16, fr.y0 + fr.h / 2, "middle", rotate, p->y_label);
        }
        draw_series(f, &fr, p);
}

int svg_plot_write(FILE *f, const char *title, const SvgPanel *panels, size_t n_panels, unsigned width,
                   unsigned panel_height) {
        if (width < 200 || panel_height < 120 || width > 100000 || panel_height > 100000 || n_panels > 64)
                return -EINVAL;
        double head = title ? TITLE_HEIGHT : 0, height = head + (double)n_panels * panel_height;
        fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%u\" height=\"%.0f\" viewBox=\"0 0 %u %.0f\" "
                   "font-family=\"sans-serif\" font-size=\"12\">\n"
                   "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height, width, height);
        if (title)
                text(f, width / 2.0, 20, "middle", " font-size=\"15\" font-weight=\"bold\"", title);
        for (size_t i = 0; i < n_panels; i++)
                draw_panel(f, &panels[i], head + (double)i * panel_height, width, panel_height);
        fputs("</svg>\n", f);
        return fflush(f) == 0 && !ferror(f) ? 0 : -EIO;
}
