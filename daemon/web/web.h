/* web/web.h — what the HTTP endpoint shows, and the buffer it is written
 * into.
 *
 * The control thread takes a WebSnapshot of the node (control_snapshot() and
 * what only it knows: the identity, the idle monitor) and publishes it to the
 * server (web/server.h); the renderers (web/metrics.h, web/page.h) turn one
 * snapshot into text, with no I/O of their own:
 *
 *     WebSnapshot s = { .state = state, .status = status };
 *     web_process_read(&s.process);          // RSS and CPU from /proc/self
 *     WebBuf b = { .max = WEB_BUF_MAX };
 *     r = web_metrics_render(&s, &b);        // b.data, b.len: the exposition
 *     web_buf_free(&b);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/identity.h"
#include "run/control.h"
#include "util/macro.h"

/* ---- an output buffer with a ceiling ------------------------------------ */

#define WEB_BUF_MAX (1u << 20)

typedef struct WebBuf {
        char *data;  /* NUL-terminated; NULL until the first write */
        size_t len, cap;
        size_t max;  /* -ENOBUFS past it; 0: WEB_BUF_MAX */
} WebBuf;

int web_buf_printf(WebBuf *b, const char *fmt, ...) _printf_(2, 3);
int web_buf_put(WebBuf *b, const char *s);
/* s with &, <, >, " and ' as entities. */
int web_buf_put_html(WebBuf *b, const char *s);
void web_buf_free(WebBuf *b);

/* ---- the process, from /proc/self --------------------------------------- */

typedef struct WebProcess {
        uint64_t resident_bytes;
        double cpu_seconds;        /* user and system, every thread */
        double start_time_seconds; /* since the epoch */
} WebProcess;

int web_process_read(WebProcess *ret);

/* ---- the loss and throughput over the run ------------------------------- */

#define WEB_HISTORY_MAX 240

/* The last WEB_HISTORY_MAX samples, oldest first from first. */
typedef struct WebHistory {
        float loss[WEB_HISTORY_MAX];
        float samples_per_sec[WEB_HISTORY_MAX];
        uint64_t step[WEB_HISTORY_MAX];
        unsigned first, n;
} WebHistory;

/* A sample when training has moved on since the last one (the step
 * changed); its loss NaN where the node does not know it (every pipeline
 * stage but the last). Returns 1 if it took one. */
int web_history_push(WebHistory *h, const NodeTraining *t);
/* The i-th oldest sample's index, i < h->n. */
static inline unsigned web_history_at(const WebHistory *h, unsigned i) {
        return (h->first + i) % WEB_HISTORY_MAX;
}

/* ---- a node's status, as published ------------------------------------- */

typedef struct WebSnapshot {
        NodeState state;
        NodeStatus status;
        char reason[128];                 /* of the pause in force */
        bool idle;                        /* the idle monitor holds training */
        char identity[IDENTITY_HEX_SIZE]; /* "" without a network */
        uint64_t now_usec;                /* CLOCK_REALTIME when it was rendered */
        WebProcess process;
        uint64_t http_requests;           /* the server's, this one included */
} WebSnapshot;
