/* web/server.c */
#include "server.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "util/time-util.h"
#include "web/metrics.h"
#include "web/page.h"

/* A connection: since when its request has been under way (0: closed by
 * the deadline already). */
typedef struct WebConn {
        int fd;
        uint64_t since_ns;
        bool used;
} WebConn;

struct WebServer {
        struct MHD_Daemon *mhd;
        pthread_mutex_t lock; /* everything below; held only to copy or mark */
        WebSnapshot snapshot;
        WebHistory history;
        WebConn *conns;       /* max_connections */
        unsigned n_conns;
        uint64_t timeout_ns;
        uint64_t requests;    /* atomic */
};

/* ---- connections: a request must come whole within the timeout --------- */

/* MHD's timeout counts from the last byte, so a client sending (or
 * reading) a byte a second would hold its slot for ever: the server also
 * closes a connection whose request, its body and its answer have not all
 * gone through within timeout_s of the connection opening or of the last
 * answer (web_server_publish(), every second). */
static void on_connection(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_ConnectionNotificationCode toe) {
        WebServer *w = cls;
        pthread_mutex_lock(&w->lock);
        if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
                const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
                for (unsigned k = 0; i && k < w->n_conns && !*ctx; k++)
                        if (!w->conns[k].used) {
                                w->conns[k] = (WebConn){ .fd = i->connect_fd, .since_ns = now_ns(), .used = true };
                                *ctx = &w->conns[k];
                        }
        } else if (*ctx) /* closed: MHD closes the socket after this */
                ((WebConn *)*ctx)->used = false;
        pthread_mutex_unlock(&w->lock);
}

/* An answer went out: the connection is kept open for the next request,
 * whose clock starts now. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
        WebServer *w = cls;
        const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        (void)con_cls, (void)toe;
        if (!i || !i->socket_context)
                return;
        pthread_mutex_lock(&w->lock);
        ((WebConn *)i->socket_context)->since_ns = now_ns();
        pthread_mutex_unlock(&w->lock);
}

/* Called with w->lock held. */
static void close_overdue(WebServer *w) {
        uint64_t now = now_ns();
        for (unsigned k = 0; k < w->n_conns; k++) {
                WebConn *c = &w->conns[k];
                if (c->used && c->since_ns && now - c->since_ns > w->timeout_ns) {
                        shutdown(c->fd, SHUT_RDWR); /* MHD sees it and closes it */
                        c->since_ns = 0;
                }
        }
}

/* ---- requests ----------------------------------------------------------- */

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *type, WebBuf *b) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(b->len, b->data, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                web_buf_free(b);
                return MHD_NO;
        }
        *b = (WebBuf){}; /* the response's now */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
        if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
                MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
        enum MHD_Result ret = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        return ret;
}

static enum MHD_Result answer_text(struct MHD_Connection *c, unsigned status, const char *text) {
        WebBuf b = { .max = 4096 };
        if (web_buf_put(&b, text) < 0)
                return MHD_NO;
        return answer(c, status, "text/plain; charset=utf-8", &b);
}

/* The last publication, with what only this thread knows filled in. */
static void take_snapshot(WebServer *w, WebSnapshot *ret, WebHistory *ret_history) {
        pthread_mutex_lock(&w->lock);
        *ret = w->snapshot;
        if (ret_history)
                *ret_history = w->history;
        pthread_mutex_unlock(&w->lock);
        ret->now_usec = now_realtime_usec();
        ret->http_requests = __atomic_load_n(&w->requests, __ATOMIC_RELAXED);
        (void)web_process_read(&ret->process);
}

/* The path of a request's target: HTTP/1.1 servers take the absolute form
 * too ("http://host:port/metrics", what a client sends through a proxy). */
static const char *origin_path(const char *url) {
        if (strncasecmp(url, "http://", 7) != 0)
                return url;
        const char *path = strchr(url + 7, '/');
        return path ?: "/";
}

static enum MHD_Result count_host(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        (void)kind, (void)value;
        *(unsigned *)cls += strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0;
        return MHD_YES;
}

/* A request names one host (RFC 9112, 3.2): two Host lines are 400, as
 * none is (libmicrohttpd's strict mode checks that one). */
static bool one_host(struct MHD_Connection *c) {
        unsigned hosts = 0;
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_host, &hosts);
        return hosts <= 1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
        WebServer *w = cls;
        WebSnapshot s;
        WebBuf b = { .max = WEB_BUF_MAX };
        (void)version, (void)upload_data;

        /* The first call comes with the header alone: answering from the
         * second keeps the connection open for the next request (HTTP/1.1
         * keep-alive, pipelined requests), where an answer queued on the
         * first would close it. A body (no method here takes one) is
         * read and dropped. */
        if (!*con_cls) {
                *con_cls = w;
                return MHD_YES;
        }
        if (*upload_data_size) {
                *upload_data_size = 0;
                return MHD_YES;
        }
        __atomic_add_fetch(&w->requests, 1, __ATOMIC_RELAXED);

        if (!one_host(c))
                return answer_text(c, MHD_HTTP_BAD_REQUEST, "One Host header\n");
        if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
                return answer_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "Only GET and HEAD\n");
        url = origin_path(url);
        if (strcmp(url, "/metrics") == 0) {
                take_snapshot(w, &s, NULL);
                if (web_metrics_render(&s, &b) < 0) {
                        web_buf_free(&b);
                        return answer_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "Rendering failed\n");
                }
                return answer(c, MHD_HTTP_OK, WEB_METRICS_CONTENT_TYPE, &b);
        }
        if (strcmp(url, "/") == 0) {
                WebHistory *h = malloc(sizeof *h);
                if (!h)
                        return MHD_NO;
                take_snapshot(w, &s, h);
                int r = web_page_render(&s, h, &b);
                free(h);
                if (r < 0) {
                        web_buf_free(&b);
                        return answer_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "Rendering failed\n");
                }
                return answer(c, MHD_HTTP_OK, WEB_PAGE_CONTENT_TYPE, &b);
        }
        return answer_text(c, MHD_HTTP_NOT_FOUND, "Not found: try / or /metrics\n");
}

/* A request target's %XX decoded in place, but one with %00 left as it
 * came: decoded, "/%00x" would read as "/" and be served. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *target) {
        (void)cls, (void)c;
        if (strstr(target, "%00"))
                return strlen(target);
        return MHD_http_unescape(target);
}

/* The first address host:port resolves to, for listening. */
static int resolve(const ConfigAddress *a, struct sockaddr_storage *ret, int *ret_family) {
        struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *ai;
        char port[8];
        snprintf(port, sizeof port, "%u", a->port);
        int r = getaddrinfo(a->host, port, &hints, &ai);
        if (r != 0)
                return r == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
        memcpy(ret, ai->ai_addr, MIN((size_t)ai->ai_addrlen, sizeof *ret));
        *ret_family = ai->ai_family;
        freeaddrinfo(ai);
        return 0;
}

int web_server_start(const ConfigMetrics *m, WebServer **ret) {
        struct sockaddr_storage addr = {};
        int family = AF_INET, r;

        if ((r = resolve(&m->listen, &addr, &family)) < 0)
                return r;
        WebServer *w = calloc(1, sizeof *w);
        if (!w)
                return -ENOMEM;
        w->n_conns = m->max_connections;
        w->timeout_ns = (uint64_t)m->timeout_s * NSEC_PER_SEC;
        if (!(w->conns = calloc(w->n_conns, sizeof *w->conns))) {
                free(w);
                return -ENOMEM;
        }
        pthread_mutex_init(&w->lock, NULL);
        w->snapshot.state = NODE_STARTING;
        w->snapshot.status.training.cluster = w->snapshot.status.training.stage = -1;
        w->snapshot.status.training.loss = w->snapshot.status.training.test_loss = -1;
        w->snapshot.status.training.test_accuracy = -1;
        /* poll(), not epoll: libmicrohttpd 0.9.75's epoll loop can miss a
         * client's FIN that comes while it answers a keep-alive request, and
         * keeps that connection (and its place) until the timeout, so
         * clients that half-close after asking fill every place; a few
         * connections are what poll() is for. */
        unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (family == AF_INET6 ? MHD_USE_IPv6 : 0);
        errno = 0;
        w->mhd = MHD_start_daemon(flags, m->listen.port, NULL, NULL, on_request, w,
                                  MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)m->max_connections,
                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)m->timeout_s,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)WEB_CONNECTION_MEMORY,
                                  MHD_OPTION_STRICT_FOR_CLIENT, 1, /* HTTP/1.1 without Host: 400 */
                                  MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
                                  MHD_OPTION_NOTIFY_CONNECTION, on_connection, w,
                                  MHD_OPTION_NOTIFY_COMPLETED, on_completed, w,
                                  MHD_OPTION_END);
        if (!w->mhd) {
                r = errno ? -errno : -EADDRINUSE;
                pthread_mutex_destroy(&w->lock);
                free(w->conns);
                free(w);
                return r;
        }
        *ret = w;
        return 0;
}

void web_server_publish(WebServer *w, const WebSnapshot *s) {
        pthread_mutex_lock(&w->lock);
        w->snapshot = *s;
        web_history_push(&w->history, &s->status.training);
        close_overdue(w);
        pthread_mutex_unlock(&w->lock);
}

uint64_t web_server_requests(WebServer *w) {
        return __atomic_load_n(&w->requests, __ATOMIC_RELAXED);
}

WebServer *web_server_stop(WebServer *w) {
        if (!w)
                return NULL;
        MHD_stop_daemon(w->mhd);
        pthread_mutex_destroy(&w->lock);
        free(w->conns);
        free(w);
        return NULL;
}
