/* web/: the exposition read back line by line (every sample under its HELP
 * and TYPE, valid names, counters that only grow), the status page, the loss
 * ring and the buffer's ceiling; no HTTP here (the integration test
 * test-metrics serves them from a real ravnestd). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "web/metrics.h"
#include "web/page.h"

typedef struct Sample {
        char name[128], labels[256], type[16];
        double value;
} Sample;

static bool valid_name(const char *s) {
        if (!*s || !(strchr("_:", *s) || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
                return false;
        for (; *s; s++)
                if (!(strchr("_:", *s) || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
                        return false;
        return true;
}

/* Every line: "# HELP name text", "# TYPE name type" (after its HELP), or
 * "name{labels} value" under the family's TYPE. Returns the samples. */
static size_t parse(const char *text, Sample *out, size_t max) {
        char help[128] = "", family[128] = "", type[16] = "";
        size_t n = 0;
        char *copy = strdup(text), *save, *line;
        cr_assert(text[strlen(text) - 1] == '\n', "the exposition ends with a newline");
        for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char name[128], rest[512];
                if (sscanf(line, "# HELP %127s %511[^\n]", name, rest) == 2) {
                        cr_assert(valid_name(name), "bad name in \"%s\"", line);
                        snprintf(help, sizeof help, "%s", name);
                        continue;
                }
                if (sscanf(line, "# TYPE %127s %15s", name, type) == 2) {
                        cr_assert_str_eq(name, help, "TYPE without its HELP: \"%s\"", line);
                        cr_assert(!strcmp(type, "gauge") || !strcmp(type, "counter"), "\"%s\"", line);
                        snprintf(family, sizeof family, "%s", name);
                        continue;
                }
                cr_assert_neq(line[0], '#', "unknown comment \"%s\"", line);
                cr_assert_lt(n, max);
                Sample *s = &out[n++];
                size_t k = strcspn(line, "{ ");
                cr_assert_lt(k, sizeof s->name);
                memcpy(s->name, line, k);
                s->name[k] = '\0';
                s->labels[0] = '\0';
                const char *v = line + k;
                if (*v == '{') {
                        const char *end = strstr(v, "} ");
                        cr_assert_not_null(end, "\"%s\"", line);
                        snprintf(s->labels, sizeof s->labels, "%.*s", (int)(end - v - 1), v + 1);
                        v = end + 1;
                }
                cr_assert_eq(*v, ' ', "\"%s\"", line);
                cr_assert(valid_name(s->name), "bad name in \"%s\"", line);
                cr_assert_str_eq(s->name, family, "sample \"%s\" outside its family %s", line, family);
                char *end;
                s->value = strcmp(v + 1, "NaN") == 0 ? NAN : strtod(v + 1, &end);
                cr_assert(isnan(s->value) || *end == '\0', "bad value in \"%s\"", line);
                snprintf(s->type, sizeof s->type, "%s", type);
                if (!strcmp(type, "counter")) {
                        size_t len = strlen(s->name);
                        cr_assert(len > 6 && !strcmp(s->name + len - 6, "_total"), "counter %s without _total", s->name);
                        cr_assert(s->value >= 0, "%s", line);
                }
                cr_assert(!strncmp(s->name, "ravnest_", 8) || !strncmp(s->name, "process_", 8), "%s", s->name);
                cr_assert(!strstr(s->labels, "peer"), "no per-peer labels: %s", line);
        }
        free(copy);
        return n;
}

static WebSnapshot snapshot(uint64_t step) {
        WebSnapshot s = { .state = NODE_TRAINING, .now_usec = 1700000000000000ULL, .http_requests = step };
        NodeStatus *st = &s.status;
        snprintf(st->training.job, sizeof st->training.job, "mlp \"quoted\" \\ <job>");
        snprintf(st->training.role, sizeof st->training.role, "member");
        st->training.cluster = st->training.stage = -1;
        st->training.epoch = 2, st->training.epochs = 5;
        st->training.step = step;
        st->training.loss = 0.5;
        st->training.test_loss = -1;
        st->training.test_accuracy = -1;
        st->training.samples_per_sec = 1234.5;
        st->network.peers = 1;
        st->network.traffic = (NodeTraffic){ 10 * step, 20 * step, 30 * step, 40 * step, step, 5 * step, 6 * step };
        st->training.busy = 0.75;
        st->network.rounds_done = step / 10, st->network.rounds_failed = step / 100;
        st->network.last_round_ns = 25000000;
        snprintf(st->averaging.method, sizeof st->averaging.method, "ring");
        st->checkpoint_usec = s.now_usec - 90 * 1000000ULL;
        st->checkpoint_step = step / 2;
        st->pauses = step / 50;
        cr_assert_eq(web_process_read(&s.process), 0);
        return s;
}

static const Sample *find(const Sample *s, size_t n, const char *name, const char *labels) {
        for (size_t i = 0; i < n; i++)
                if (!strcmp(s[i].name, name) && (!labels || !strcmp(s[i].labels, labels)))
                        return &s[i];
        cr_assert_fail("no sample %s{%s}", name, labels ?: "");
        return NULL;
}

Test(web, exposition_parses_and_counters_grow) {
        Sample a[128], b[128];
        WebBuf buf = {};
        WebSnapshot s1 = snapshot(100), s2 = snapshot(250);

        cr_assert_eq(web_metrics_render(&s1, &buf), 0);
        size_t na = parse(buf.data, a, 128);
        web_buf_free(&buf);
        cr_assert_eq(web_metrics_render(&s2, &buf), 0);
        size_t nb = parse(buf.data, b, 128);
        web_buf_free(&buf);

        cr_assert_eq(na, nb, "the same samples every time");
        for (size_t i = 0; i < na; i++) {
                cr_assert_str_eq(a[i].name, b[i].name);
                cr_assert_str_eq(a[i].labels, b[i].labels);
                if (!strcmp(a[i].type, "counter"))
                        cr_assert_geq(b[i].value, a[i].value, "%s{%s} went down", a[i].name, a[i].labels);
        }
        cr_assert_float_eq(find(a, na, "ravnest_training_loss", NULL)->value, 0.5, 1e-9);
        cr_assert(isnan(find(a, na, "ravnest_test_loss", NULL)->value), "unknown is NaN");
        cr_assert_eq(find(b, nb, "ravnest_steps_total", NULL)->value, 250);
        cr_assert_eq(find(b, nb, "ravnest_sent_bytes_total", "purpose=\"pipeline\"")->value, 2500);
        cr_assert_eq(find(b, nb, "ravnest_received_bytes_total", "purpose=\"averaging\"")->value, 10000);
        /* Busy, and the traffic of network.peers (neither was exported) */
        cr_assert_eq(find(b, nb, "ravnest_sent_bytes_total", "purpose=\"network\"")->value, 1250);
        cr_assert_eq(find(b, nb, "ravnest_received_bytes_total", "purpose=\"network\"")->value, 1500);
        cr_assert_float_eq(find(b, nb, "ravnest_busy_ratio", NULL)->value, 0.75, 1e-9);
        cr_assert_eq(find(b, nb, "ravnest_averaging_rounds_total", "method=\"ring\"")->value, 25);
        cr_assert_eq(find(b, nb, "ravnest_averaging_rounds_failed_total", "method=\"ring\"")->value, 2);
        cr_assert_float_eq(find(b, nb, "ravnest_averaging_last_round_duration_seconds", NULL)->value, 0.025, 1e-9);
        cr_assert_float_eq(find(b, nb, "ravnest_checkpoint_age_seconds", NULL)->value, 90, 1e-6);
        cr_assert_eq(find(b, nb, "ravnest_state", "state=\"training\"")->value, 1);
        cr_assert_eq(find(b, nb, "ravnest_state", "state=\"paused\"")->value, 0);
        cr_assert_eq(find(b, nb, "ravnest_pauses_total", NULL)->value, 5);
        cr_assert_gt(find(b, nb, "process_resident_memory_bytes", NULL)->value, 1 << 20);
        cr_assert_geq(find(b, nb, "process_cpu_seconds_total", NULL)->value, 0);
        /* label values escaped as the format says */
        const Sample *info = find(b, nb, "ravnest_node_info", NULL);
        cr_assert(strstr(info->labels, "job=\"mlp \\\"quoted\\\" \\\\ <job>\""), "%s", info->labels);
}

Test(web, page_has_the_node_and_a_plot) {
        WebSnapshot s = snapshot(100);
        WebHistory h = {};
        WebBuf buf = {};
        snprintf(s.identity, sizeof s.identity, "%064d", 7);
        for (uint64_t step = 1; step <= 10; step++) {
                NodeTraining t = s.status.training;
                t.step = step, t.loss = 2.0 / (double)step;
                cr_assert_eq(web_history_push(&h, &t), 1);
                cr_assert_eq(web_history_push(&h, &t), 0, "the same step twice is one sample");
        }
        cr_assert_eq(web_page_render(&s, &h, &buf), 0);
        cr_assert(strstr(buf.data, "<meta http-equiv=\"refresh\" content=\"5\">"));
        cr_assert(strstr(buf.data, "mlp &quot;quoted&quot; \\ &lt;job&gt;"), "the job escaped: %s", buf.data);
        cr_assert(!strstr(buf.data, "<job>"), "nothing unescaped");
        cr_assert(strstr(buf.data, s.identity));
        cr_assert(strstr(buf.data, "<div id=\"plots\">"));
        cr_assert(strstr(buf.data, "<svg") && strstr(buf.data, "<polyline"));
        cr_assert(!strstr(buf.data, "<script"), "no script");
        cr_assert(!strstr(buf.data, "src="), "nothing fetched from elsewhere");
        web_buf_free(&buf);
}

/* The method label is the method's name alone, whatever the topology or
 * the choice auto made ("auto: measuring", then "auto: exp", made a new
 * series of each counter). */
Test(web, the_method_label_is_the_method_s_name) {
        static const char *const methods[][2] = { { "ring", "ring" }, { "moshpit", "moshpit" },
                                                  { "gossip alt-exp-ring", "gossip" }, { "auto: measuring", "auto" },
                                                  { "auto: exp", "auto" }, { "", "none" } };
        for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
                Sample a[128];
                WebBuf buf = {};
                char want[32];
                WebSnapshot s = snapshot(100);
                snprintf(s.status.averaging.method, sizeof s.status.averaging.method, "%s", methods[i][0]);
                cr_assert_eq(web_metrics_render(&s, &buf), 0);
                size_t n = parse(buf.data, a, 128);
                web_buf_free(&buf);
                snprintf(want, sizeof want, "method=\"%s\"", methods[i][1]);
                cr_assert_eq(find(a, n, "ravnest_averaging_rounds_total", want)->value, 10, "%s", methods[i][0]);
        }
}

/* A pipeline stage but the last knows no loss, and no epoch where it does
 * not read the data: its page plots its throughput (both plots were empty)
 * and gives its step without an epoch (it said "Epoch: -1 of 3"). */
Test(web, a_stage_without_the_loss_plots_its_throughput) {
        WebSnapshot s = snapshot(100);
        WebHistory h = {};
        WebBuf buf = {};
        s.status.training.epoch = -1;
        for (uint64_t step = 1; step <= 10; step++) {
                NodeTraining t = s.status.training;
                t.step = step, t.loss = -1, t.samples_per_sec = 100.0 * (double)step;
                cr_assert_eq(web_history_push(&h, &t), 1);
        }
        cr_assert_eq(web_page_render(&s, &h, &buf), 0);
        cr_assert(strstr(buf.data, "<polyline"), "no throughput plotted: %s", buf.data);
        cr_assert(strstr(buf.data, "Throughput") && !strstr(buf.data, "Training loss"), "%s", buf.data);
        cr_assert(!strstr(buf.data, "-1 of "), "%s", buf.data);
        cr_assert(strstr(buf.data, "step 100"), "%s", buf.data);
        web_buf_free(&buf);
}

Test(web, history_keeps_the_last_samples) {
        WebHistory h = {};
        NodeTraining t = { .loss = -1, .step = 0 };
        cr_assert_eq(web_history_push(&h, &t), 0, "no step yet: no sample");
        t.step = 1;
        cr_assert_eq(web_history_push(&h, &t), 1, "no loss known: a sample of the throughput");
        cr_assert(isnan(h.loss[web_history_at(&h, 0)]));
        for (uint64_t step = 1; step <= WEB_HISTORY_MAX + 5; step++) {
                t.step = step, t.loss = (double)step;
                web_history_push(&h, &t);
        }
        cr_assert_eq(h.n, WEB_HISTORY_MAX);
        cr_assert_eq(h.step[web_history_at(&h, 0)], 6);
        cr_assert_eq(h.step[web_history_at(&h, h.n - 1)], WEB_HISTORY_MAX + 5);
}

Test(web, buffer_has_a_ceiling) {
        WebBuf b = { .max = 64 };
        cr_assert_eq(web_buf_put(&b, "0123456789012345678901234567890123456789"), 40);
        cr_assert_eq(web_buf_printf(&b, "%s", "01234567890123456789012345678901"), -ENOBUFS);
        cr_assert_eq(b.len, 40, "a refused write leaves the buffer as it was");
        WebSnapshot s = snapshot(1);
        cr_assert_eq(web_metrics_render(&s, &b), -ENOBUFS);
        web_buf_free(&b);
}
