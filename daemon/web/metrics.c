/* web/metrics.c */
#include "metrics.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the format's pieces ------------------------------------------------ */

static int family(WebBuf *b, const char *name, const char *type, const char *help) {
        return web_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newline escaped, as the format wants. */
static void label_value(char *out, size_t len, const char *v) {
        size_t k = 0;
        for (; *v && k + 3 < len; v++) {
                if (*v == '\\' || *v == '"' || *v == '\n') {
                        out[k++] = '\\';
                        out[k++] = *v == '\n' ? 'n' : *v;
                } else
                        out[k++] = *v;
        }
        out[k] = '\0';
}

static int sample(WebBuf *b, const char *name, const char *labels, double v) {
        const char *open = labels ? "{" : "", *close = labels ? "}" : "";
        if (isnan(v))
                return web_buf_printf(b, "%s%s%s%s NaN\n", name, open, labels ?: "", close);
        if (isinf(v))
                return web_buf_printf(b, "%s%s%s%s %cInf\n", name, open, labels ?: "", close, v < 0 ? '-' : '+');
        return web_buf_printf(b, "%s%s%s%s %.10g\n", name, open, labels ?: "", close, v);
}

static int counter(WebBuf *b, const char *name, const char *labels, uint64_t v) {
        const char *open = labels ? "{" : "", *close = labels ? "}" : "";
        return web_buf_printf(b, "%s%s%s%s %llu\n", name, open, labels ?: "", close, (unsigned long long)v);
}

/* A gauge without labels. */
static int gauge1(WebBuf *b, const char *name, const char *help, double v) {
        int r = family(b, name, "gauge", help);
        return r < 0 ? r : sample(b, name, NULL, v);
}

static int counter1(WebBuf *b, const char *name, const char *help, uint64_t v) {
        int r = family(b, name, "counter", help);
        return r < 0 ? r : counter(b, name, NULL, v);
}

static double known(double v) {
        return v >= 0 ? v : NAN;
}

/* ---- the families, one group per part of the status -------------------- */

static int render_node(const WebSnapshot *s, WebBuf *b) {
        const NodeTraining *t = &s->status.training;
        char job[2 * sizeof t->job], role[2 * sizeof t->role], io[2 * sizeof s->status.network.io_backend];
        char labels[512];
        int r;

        label_value(job, sizeof job, t->job);
        label_value(role, sizeof role, t->role);
        label_value(io, sizeof io, s->status.network.io_backend);
        snprintf(labels, sizeof labels, "training_job=\"%s\",role=\"%s\",cluster=\"%d\",stage=\"%d\",io_backend=\"%s\"", job,
                 role, t->cluster, t->stage, io);
        if ((r = family(b, "ravnest_node_info", "gauge",
                        "The node's job, role, cluster and stage (0-based; -1 outside a pipeline) and transport, "
                        "as labels; always 1")) < 0 ||
            (r = sample(b, "ravnest_node_info", labels, 1)) < 0)
                return r;
        if ((r = family(b, "ravnest_state", "gauge", "1 for the state the node is in, 0 for the others")) < 0)
                return r;
        for (NodeState k = 0; k < _NODE_STATE_MAX; k++) {
                snprintf(labels, sizeof labels, "state=\"%s\"", node_state_to_string(k));
                if ((r = sample(b, "ravnest_state", labels, k == s->state)) < 0)
                        return r;
        }
        if ((r = gauge1(b, "ravnest_paused", "1 while training is paused (by the operator or the idle monitor)",
                        s->state == NODE_PAUSED)) < 0 ||
            (r = gauge1(b, "ravnest_idle", "1 while the idle monitor holds training: the machine's owner needs it",
                        s->idle)) < 0 ||
            (r = counter1(b, "ravnest_pauses_total", "Times training paused since the daemon started",
                          s->status.pauses)) < 0 ||
            (r = gauge1(b, "ravnest_plan_epoch", "Epoch of the coordinator's plan this node holds; 0: none",
                        (double)s->status.plan_epoch)) < 0)
                return r;
        return 0;
}

static int render_training(const WebSnapshot *s, WebBuf *b) {
        const NodeTraining *t = &s->status.training;
        const NodeAveraging *a = &s->status.averaging;
        int r;

        if ((r = gauge1(b, "ravnest_training_loss", "Mean training loss over the last 2 s; NaN: not known here",
                        known(t->loss))) < 0 ||
            (r = gauge1(b, "ravnest_test_loss", "Loss on the test split at the last evaluation; NaN before one",
                        known(t->test_loss))) < 0 ||
            (r = gauge1(b, "ravnest_test_accuracy_ratio", "Accuracy on the test split at the last evaluation (0-1)",
                        known(t->test_accuracy))) < 0 ||
            (r = gauge1(b, "ravnest_samples_per_second", "Samples trained per second of the wall clock over the last 2 s",
                        t->samples_per_sec)) < 0 ||
            (r = gauge1(b, "ravnest_busy_ratio", "Fraction of the last 2 s not spent waiting (0-1); NaN: not known yet",
                        known(t->busy))) < 0 ||
            (r = counter1(b, "ravnest_steps_total", "Steps (parameter updates) since the run started, "
                          "those before a checkpoint it resumed from included", t->step)) < 0 ||
            (r = gauge1(b, "ravnest_epoch", "Epoch in progress (1-based); NaN where the stage reads no data",
                        t->epoch > 0 ? t->epoch : NAN)) < 0 ||
            (r = gauge1(b, "ravnest_epochs", "Epochs the job trains for", t->epochs > 0 ? t->epochs : NAN)) < 0 ||
            (r = gauge1(b, "ravnest_step_compute_seconds", "Forward, backward and update per step, mean; NaN: not measured",
                        a->compute_ms > 0 ? a->compute_ms / 1000 : NAN)) < 0)
                return r;
        return 0;
}

static int render_checkpoint(const WebSnapshot *s, WebBuf *b) {
        const NodeStatus *st = &s->status;
        double age = st->checkpoint_usec && s->now_usec >= st->checkpoint_usec
                             ? (double)(s->now_usec - st->checkpoint_usec) / 1e6 : NAN;
        int r;

        if ((r = gauge1(b, "ravnest_checkpoint_age_seconds", "Since the last checkpoint was written or loaded; NaN: none",
                        age)) < 0 ||
            (r = gauge1(b, "ravnest_checkpoint_step",
                        "ravnest_steps_total when the last checkpoint was written or loaded; never goes back",
                        (double)st->checkpoint_step)) < 0)
                return r;
        return 0;
}

static int render_averaging(const WebSnapshot *s, WebBuf *b) {
        const NodeNetwork *n = &s->status.network;
        const NodeAveraging *a = &s->status.averaging;
        char method[2 * sizeof a->method], labels[128];
        int r;

        /* the method's name alone: "gossip alt-exp-ring" and "auto: measuring" would make
         * new series of a counter as the topology or the choice shows */
        char name[sizeof a->method];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(a->method, " :"), a->method);
        label_value(method, sizeof method, name[0] ? name : "none");
        snprintf(labels, sizeof labels, "method=\"%s\"", method);
        if ((r = family(b, "ravnest_averaging_rounds_total", "counter", "Averaging rounds this node finished")) < 0 ||
            (r = counter(b, "ravnest_averaging_rounds_total", labels, n->rounds_done)) < 0 ||
            (r = family(b, "ravnest_averaging_rounds_failed_total", "counter",
                        "Averaging rounds that failed (a member gone, a timeout, no other member there)")) < 0 ||
            (r = counter(b, "ravnest_averaging_rounds_failed_total", labels, n->rounds_failed)) < 0 ||
            (r = gauge1(b, "ravnest_averaging_last_round_duration_seconds",
                        "The last averaging round, snapshot to delta; NaN: none yet",
                        n->last_round_ns ? (double)n->last_round_ns / 1e9 : NAN)) < 0 ||
            (r = gauge1(b, "ravnest_averaging_last_round_timestamp_seconds",
                        "When the last averaging round ended, since the epoch; NaN: none yet",
                        n->last_averaging_usec ? (double)n->last_averaging_usec / 1e6 : NAN)) < 0 ||
            (r = gauge1(b, "ravnest_averaging_members", "Members of the averaging group, this node included",
                        a->nodes)) < 0)
                return r;
        return 0;
}

static int render_network(const WebSnapshot *s, WebBuf *b) {
        const NodeNetwork *n = &s->status.network;
        int r;

        if ((r = family(b, "ravnest_sent_bytes_total", "counter",
                        "Bytes sent, by purpose: the pipeline's links (activations, gradients), averaging, or the "
                        "links of network.peers")) < 0 ||
            (r = counter(b, "ravnest_sent_bytes_total", "purpose=\"pipeline\"", n->traffic.pipeline_sent)) < 0 ||
            (r = counter(b, "ravnest_sent_bytes_total", "purpose=\"averaging\"", n->traffic.averaging_sent)) < 0 ||
            (r = counter(b, "ravnest_sent_bytes_total", "purpose=\"network\"", n->traffic.peers_sent)) < 0 ||
            (r = family(b, "ravnest_received_bytes_total", "counter", "Bytes received, by purpose, as sent")) < 0 ||
            (r = counter(b, "ravnest_received_bytes_total", "purpose=\"pipeline\"", n->traffic.pipeline_received)) < 0 ||
            (r = counter(b, "ravnest_received_bytes_total", "purpose=\"averaging\"", n->traffic.averaging_received)) < 0 ||
            (r = counter(b, "ravnest_received_bytes_total", "purpose=\"network\"", n->traffic.peers_received)) < 0 ||
            (r = gauge1(b, "ravnest_links", "Links up to peers (pipeline neighbours, averaging members)", n->peers)) < 0 ||
            (r = gauge1(b, "ravnest_paused_peers", "Neighbours that said they are paused", n->paused_peers)) < 0)
                return r;
        return 0;
}

static int render_process(const WebSnapshot *s, WebBuf *b) {
        int r;

        if ((r = gauge1(b, "process_resident_memory_bytes", "Resident memory of ravnestd",
                        (double)s->process.resident_bytes)) < 0 ||
            (r = family(b, "process_cpu_seconds_total", "counter", "User and system CPU time of ravnestd")) < 0 ||
            (r = sample(b, "process_cpu_seconds_total", NULL, s->process.cpu_seconds)) < 0 ||
            (r = gauge1(b, "process_start_time_seconds", "When ravnestd started, since the epoch",
                        s->process.start_time_seconds)) < 0 ||
            (r = counter1(b, "ravnest_http_requests_total", "HTTP requests this endpoint took (every method and path)",
                          s->http_requests)) < 0)
                return r;
        return 0;
}

int web_metrics_render(const WebSnapshot *s, WebBuf *b) {
        int r;
        if ((r = render_node(s, b)) < 0 || (r = render_training(s, b)) < 0 || (r = render_checkpoint(s, b)) < 0 ||
            (r = render_averaging(s, b)) < 0 || (r = render_network(s, b)) < 0 || (r = render_process(s, b)) < 0)
                return r;
        return 0;
}
