/* web/metrics.h — a node's status in Prometheus' text exposition format,
 * version 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/),
 * what `GET /metrics` answers.
 *
 * Every family has its HELP and TYPE lines; names carry the ravnest_ prefix
 * and the unit suffixes of Prometheus' naming conventions (_total, _seconds,
 * _bytes), and the process's own figures the names every client library
 * uses (process_resident_memory_bytes, process_cpu_seconds_total). Labels
 * take a handful of values each (purpose, method, state): never a peer's
 * key. A figure not known yet (the loss before the first progress report,
 * the age of a checkpoint never written) is NaN.
 *
 *     WebBuf b = { .max = WEB_BUF_MAX };
 *     r = web_metrics_render(&snapshot, &b);
 *     // b.data: "# HELP ravnest_training_loss ...\n# TYPE ravnest_training_loss gauge\n..."
 *     web_buf_free(&b);
 */
#pragma once

#include "web/web.h"

#define WEB_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

int web_metrics_render(const WebSnapshot *s, WebBuf *b);
