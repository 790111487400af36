/* web/page.c */
#include "page.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/macro.h"
#include "util/svg-plot.h"

#define PLOT_W 600
#define PLOT_H 200

static int row(WebBuf *b, const char *name, const char *value) {
        int r = web_buf_printf(b, "<tr><th>%s</th><td>", name);
        if (r >= 0)
                r = web_buf_put_html(b, value);
        return r < 0 ? r : web_buf_put(b, "</td></tr>\n");
}

static int head(const WebSnapshot *s, WebBuf *b) {
        int r = web_buf_put(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                               "<meta http-equiv=\"refresh\" content=\"5\">\n"
                               /* no icon to fetch: a browser asks for none, and logs no 404 */
                               "<link rel=\"icon\" href=\"data:,\">\n<title>ravnest: ");
        if (r >= 0)
                r = web_buf_put_html(b, s->status.training.job[0] ? s->status.training.job : "node");
        if (r >= 0)
                r = web_buf_put(b, "</title>\n<style>body{font-family:sans-serif;margin:2em}"
                                   "th{text-align:left;padding-right:1em}td{font-family:monospace}"
                                   "svg{border:1px solid #ccc}</style>\n</head>\n<body>\n<h1>ravnest node</h1>\n");
        return r;
}

static int table(const WebSnapshot *s, WebBuf *b) {
        const NodeTraining *t = &s->status.training;
        const NodeNetwork *n = &s->status.network;
        char v[256];
        int r;

        if ((r = web_buf_put(b, "<table>\n")) < 0 ||
            (r = row(b, "Identity", s->identity[0] ? s->identity : "(no network)")) < 0 ||
            (r = row(b, "Job", t->job[0] ? t->job : "(none yet)")) < 0 ||
            (r = row(b, "Role", t->role[0] ? t->role : "-")) < 0)
                return r;
        if (!s->reason[0] && t->waiting_for[0] && s->state == NODE_TRAINING)
                snprintf(v, sizeof v, "training: waiting for %s", t->waiting_for);
        else
                snprintf(v, sizeof v, "%s%s%s", node_state_to_string(s->state), s->reason[0] ? ": " : "", s->reason);
        if ((r = row(b, "State", v)) < 0)
                return r;
        if (t->cluster >= 0) {
                snprintf(v, sizeof v, "cluster %d, stage %d", t->cluster + 1, t->stage + 1);
                if ((r = row(b, "Place", v)) < 0)
                        return r;
        }
        if (t->epoch > 0) /* where the node reads the data */
                snprintf(v, sizeof v, "%d of %d, step %llu", t->epoch, t->epochs, (unsigned long long)t->step);
        else
                snprintf(v, sizeof v, "step %llu", (unsigned long long)t->step);
        if ((r = row(b, t->epoch > 0 ? "Epoch" : "Progress", v)) < 0)
                return r;
        if (t->loss >= 0)
                snprintf(v, sizeof v, "%.4f", t->loss);
        else
                snprintf(v, sizeof v, "not known here");
        if ((r = row(b, "Loss", v)) < 0)
                return r;
        if (t->test_accuracy >= 0) {
                snprintf(v, sizeof v, "%.2f%% (test loss %.4f)", 100 * t->test_accuracy, t->test_loss);
                if ((r = row(b, "Test accuracy", v)) < 0)
                        return r;
        }
        snprintf(v, sizeof v, "%.1f samples/s", t->samples_per_sec);
        if ((r = row(b, "Throughput", v)) < 0)
                return r;
        snprintf(v, sizeof v, "%u (%u paused)", n->peers, n->paused_peers);
        if ((r = row(b, "Peers", v)) < 0)
                return r;
        return web_buf_put(b, "</table>\n");
}

int web_page_plots(const WebHistory *h, WebBuf *b) {
        double step[WEB_HISTORY_MAX], loss[WEB_HISTORY_MAX], rate[WEB_HISTORY_MAX];
        bool losses = false;
        for (unsigned i = 0; i < h->n; i++) {
                unsigned k = web_history_at(h, i);
                step[i] = (double)h->step[k];
                loss[i] = h->loss[k];
                rate[i] = h->samples_per_sec[k];
                losses = losses || isfinite(loss[i]);
        }
        SvgSeries l = { .label = "loss", .x = step, .y = loss, .n = h->n };
        SvgSeries t = { .label = "samples/s", .x = step, .y = rate, .n = h->n };
        SvgPanel panels[] = {
                { .title = "Training loss", .x_label = "step", .series = &l, .n_series = 1 },
                { .title = "Throughput", .x_label = "step", .y_label = "samples/s", .series = &t, .n_series = 1 },
        };
        /* a node that does not know the loss plots its throughput alone */
        bool rate_only = h->n && !losses;
        char *svg = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&svg, &len);
        if (!f)
                return -errno;
        int r = svg_plot_write(f, NULL, panels + rate_only, ELEMENTSOF(panels) - rate_only, PLOT_W, PLOT_H);
        if (fclose(f) != 0 && r >= 0)
                r = -EIO;
        if (r >= 0) /* inline in HTML: without the XML declaration */
                r = web_buf_put(b, strstr(svg, "<svg") ? strstr(svg, "<svg") : svg);
        free(svg);
        return r;
}

int web_page_render(const WebSnapshot *s, const WebHistory *h, WebBuf *b) {
        int r;
        if ((r = head(s, b)) < 0 || (r = table(s, b)) < 0 || (r = web_buf_put(b, "<h2>History</h2>\n<div id=\"plots\">\n")) < 0 ||
            (r = web_page_plots(h, b)) < 0 ||
            (r = web_buf_put(b, "</div>\n<p><a href=\"/metrics\">metrics</a> (Prometheus)</p>\n</body>\n</html>\n")) < 0)
                return r;
        return 0;
}
