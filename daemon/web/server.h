/* web/server.h — the HTTP endpoint (libmicrohttpd) on a thread of its own:
 * `GET /metrics` (web/metrics.h) and `GET /` (web/page.h).
 *
 * The control thread publishes what the node is doing; each request copies
 * the last publication out under the server's own mutex and renders it, so
 * a slow client or a flood of requests never waits on, nor holds up, the
 * compute thread. GET and HEAD only (405 otherwise); a request whose header
 * does not fit the connection's memory is refused; at most max_connections
 * at once (more wait in the kernel's queue to be accepted); a connection is
 * kept open for the next request (keep-alive, pipelining) and closed when
 * a request and its answer have not gone through within timeout_s of the
 * connection opening or of the last answer, however slowly the bytes
 * trickle in or out.
 *
 *     WebServer *w;
 *     r = web_server_start(&config->metrics, &w);   // listening when it returns
 *     web_server_publish(w, &snapshot);             // the control thread, every second
 *     w = web_server_stop(w);
 */
#pragma once

#include "conf/config.h"
#include "web/web.h"

/* Per connection: the request's header and what MHD reads it into. */
#define WEB_CONNECTION_MEMORY (16u * 1024)

typedef struct WebServer WebServer;

int web_server_start(const ConfigMetrics *m, WebServer **ret);
/* Copies s (and a sample of the loss for the page's plot). */
void web_server_publish(WebServer *w, const WebSnapshot *s);
/* Requests answered so far. */
uint64_t web_server_requests(WebServer *w);
/* Stops the thread and closes every connection; accepts NULL. */
WebServer *web_server_stop(WebServer *w);
