#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <sys/socket.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include "net/handshake.h"
#include "net/net.h"

typedef struct Side { Net *n; uint32_t peer; int connected, closed, got; NetTensor *t; uint64_t sent; int reason; } Side;
static void on_conn(void *ud, uint32_t peer, const uint8_t id[32]) { Side *s = ud; s->connected++; s->peer = peer; }
static void on_tensor(void *ud, NetTensor *t) { Side *s = ud; s->got++; if (s->t) net_tensor_release(s->n, s->t); s->t = t; }
static void on_sent(void *ud, uint32_t peer, uint64_t c) { Side *s = ud; s->sent = c; }
static void on_closed(void *ud, uint32_t peer, int r, const uint8_t id[32]) { Side *s = ud; s->closed++; s->reason = r; }
static const NetCallbacks cbs = { .connected = on_conn, .tensor = on_tensor, .sent = on_sent, .closed = on_closed };

static void smoke_with(NetBackendKind kind, size_t zc, uint32_t chunk) {
        Identity a, b; identity_generate(&a); identity_generate(&b);
        uint8_t secret[32] = { 1, 2, 3 };
        NetConfig ca, cb2; net_config_defaults(&ca); ca.identity = &a; ca.secret = secret; ca.backend = kind; ca.zc_threshold = zc;
        if (chunk) { ca.chunk = chunk; ca.limits.max_payload = chunk; }
        cb2 = ca; cb2.identity = &b;
        Side s = {}, c = {};
        cr_assert_eq(net_new(&ca, &cbs, &s, &s.n), 0);
        cr_assert_eq(net_new(&cb2, &cbs, &c, &c.n), 0);
        uint16_t port; cr_assert_eq(net_listen(s.n, "127.0.0.1", 0, &port), 0);
        uint32_t p; cr_assert_eq(net_connect(c.n, "127.0.0.1", port, &p), 0);
        for (int i = 0; i < 200 && !(s.connected && c.connected); i++) { net_run(s.n, 5); net_run(c.n, 5); }
        cr_assert(s.connected && c.connected, "backend %s: s %d c %d closed %d/%d reason %d/%d", net_backend_name(s.n), s.connected, c.connected, s.closed, c.closed, s.reason, c.reason);
        size_t sizes[] = { 0, 1, 3, 65536, (1 << 20) + 1, 5 << 20, (9 << 20) + 7 };
        for (size_t k = 0; k < 7; k++) {
                size_t n = sizes[k];
                uint8_t *buf = malloc(n + 1);
                for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 7 + k);
                TensorDesc d; uint32_t dims[1] = { (uint32_t)n }; tensor_desc_init(&d, DTYPE_U8, 1, dims);
                int before = s.got;
                cr_assert_eq(net_send_tensor(c.n, c.peer, 5, &d, buf, 77 + k), 0);
                for (int i = 0; i < 2000 && s.got == before; i++) { net_run(c.n, 1); net_run(s.n, 1); }
                cr_assert_eq(s.got, before + 1, "size %zu not received", n);
                cr_assert_eq(s.t->desc.bytes, n);
                cr_assert(n == 0 || memcmp(s.t->data, buf, n) == 0, "size %zu differs", n);
                for (int i = 0; i < 50 && c.sent != 77 + k; i++) net_run(c.n, 1);
                cr_assert_eq(c.sent, 77 + k);
                free(buf);
        }
        net_free(c.n);
        for (int i = 0; i < 100 && !s.closed; i++) net_run(s.n, 5);
        cr_assert_eq(s.closed, 1);
        if (s.t) net_tensor_release(s.n, s.t);
        net_free(s.n);
}
static void smoke(NetBackendKind kind) { smoke_with(kind, NET_ZC_AUTO, 0); }
Test(netsmoke, epoll) { smoke(NET_BACKEND_EPOLL); }
Test(netsmoke, uring) { smoke(NET_BACKEND_URING); }
/* every frame of 4 KiB or more through SEND_ZC and its notifications */
Test(netsmoke, uring_send_zc) { smoke_with(NET_BACKEND_URING, 4096, 0); }
/* frames of 4 MiB and a few bytes (max_frame): sealed and sent a record at a
 * time, opened as they arrive (AES-256-GCM; whole frames with the others) */
Test(netsmoke, large_frames_epoll) { smoke_with(NET_BACKEND_EPOLL, NET_ZC_AUTO, (4 << 20) + 5); }
Test(netsmoke, large_frames_uring) { smoke_with(NET_BACKEND_URING, NET_ZC_AUTO, (4 << 20) + 5); }
Test(netsmoke, large_frames_uring_send_zc) { smoke_with(NET_BACKEND_URING, 4096, (4 << 20) + 5); }

/* net_probe(): the node that listens is found at its port with its key;
 * another key, a port nobody listens on and a secret it does not share
 * are each told apart. The listener runs on a thread of its own, as a
 * member's does while its coordinator dials it back. */
typedef struct Served { Net *n; volatile int stop; } Served;
/* a stage's way with a peer that is not its neighbour: closed at once */
static void close_at_once(void *ud, uint32_t peer, const uint8_t id[32]) { net_close_peer(((Served *)ud)->n, peer); }
static void *serve_net(void *ud) {
        Served *s = ud;
        while (!s->stop)
                net_run(s->n, 5);
        return NULL;
}
Test(netsmoke, probe_dials_back) {
        Identity a, b; identity_generate(&a); identity_generate(&b);
        uint8_t secret[32] = { 4, 5, 6 }, other[32] = { 7 };
        NetConfig ca, cb2; net_config_defaults(&ca); ca.identity = &a; ca.secret = secret; ca.handshake_timeout_ms = 2000;
        ca.backend = NET_BACKEND_EPOLL; /* its listening socket closes with it */
        cb2 = ca; cb2.identity = &b;
        Side side = {};
        Served sv = {};
        cr_assert_eq(net_new(&ca, &cbs, &side, &sv.n), 0);
        side.n = sv.n;
        uint16_t port; cr_assert_eq(net_listen(sv.n, "127.0.0.1", 0, &port), 0);
        pthread_t t; cr_assert_eq(pthread_create(&t, NULL, serve_net, &sv), 0);
        cr_assert_eq(net_probe(&cb2, "127.0.0.1", port, a.pk), 0);
        cr_assert_eq(net_probe(&cb2, "127.0.0.1", port, b.pk), -EKEYREJECTED);
        cb2.secret = other;
        int r = net_probe(&cb2, "127.0.0.1", port, a.pk);
        cr_assert(r < 0 && r != -EKEYREJECTED, "a node of another swarm answered: %d", r);
        cb2.secret = secret;
        sv.stop = 1;
        pthread_join(t, NULL);
        net_free(sv.n);

        /* a node that proves its key and then closes the link answered too */
        Served closer = { .stop = 0 };
        NetCallbacks ccb = { .connected = close_at_once };
        cr_assert_eq(net_new(&ca, &ccb, &closer, &closer.n), 0);
        cr_assert_eq(net_listen(closer.n, "127.0.0.1", 0, &port), 0);
        cr_assert_eq(pthread_create(&t, NULL, serve_net, &closer), 0);
        cr_assert_eq(net_probe(&cb2, "127.0.0.1", port, a.pk), 0);
        cr_assert_eq(net_probe(&cb2, "127.0.0.1", port, b.pk), -EKEYREJECTED);
        closer.stop = 1;
        pthread_join(t, NULL);
        net_free(closer.n);
        cb2.secret = secret;
        cr_assert_eq(net_probe(&cb2, "127.0.0.1", port, a.pk), -ECONNREFUSED);
}

/* A link of several lanes: tensors of every size (none, less than a
 * chunk, a chunk and one byte more, many chunks) and CONTROL frames
 * queued in between arrive whole and in the order they were queued, both
 * ways; the application sees one link at each end, one sent() per tensor,
 * and one closed() when one lane's connection is cut. */
typedef struct Order { Net *n; uint32_t peer; int connected, closed, reason; unsigned got, sent; uint32_t order[64]; uint64_t bytes[64]; int bad; } Order;
static void o_conn(void *ud, uint32_t peer, const uint8_t id[32]) { Order *o = ud; o->connected++; o->peer = peer; }
static void o_tensor(void *ud, NetTensor *t) {
        Order *o = ud;
        for (uint64_t i = 0; i < t->desc.bytes; i++)
                if (t->data[i] != (uint8_t)(i * 13 + t->stream)) { o->bad++; break; }
        o->bytes[o->got % 64] = t->desc.bytes;
        o->order[o->got++ % 64] = t->stream;
        net_tensor_release(o->n, t);
}
static void o_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Order *o = ud;
        o->order[o->got++ % 64] = len == 4 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | 1u << 31 : 0;
}
static void o_sent(void *ud, uint32_t peer, uint64_t c) { ((Order *)ud)->sent++; }
static void o_closed(void *ud, uint32_t peer, int r, const uint8_t id[32]) { Order *o = ud; o->closed++; o->reason = r; }
static const NetCallbacks ocbs = { .connected = o_conn, .tensor = o_tensor, .control = o_control, .sent = o_sent, .closed = o_closed };

/* How many TCP connections this process dialed to port. */
static unsigned connections_to(uint16_t port) {
        unsigned n = 0;
        for (int fd = 3; fd < 1024; fd++) {
                struct sockaddr_in sa; socklen_t len = sizeof sa;
                n += getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sin_family == AF_INET && ntohs(sa.sin_port) == port;
        }
        return n;
}

static void lanes_both_ways(NetBackendKind kind, unsigned lanes) {
        Identity a, b; identity_generate(&a); identity_generate(&b);
        uint8_t secret[32] = { 9 };
        NetConfig ca, cc; net_config_defaults(&ca); ca.identity = &a; ca.secret = secret; ca.backend = kind;
        ca.chunk = 4096; ca.limits.max_payload = 4096; /* many chunks per tensor */
        cc = ca; cc.identity = &b; cc.lanes = lanes;
        Order s = {}, c = {};
        cr_assert_eq(net_new(&ca, &ocbs, &s, &s.n), 0);
        cr_assert_eq(net_new(&cc, &ocbs, &c, &c.n), 0);
        uint16_t port; cr_assert_eq(net_listen(s.n, "127.0.0.1", 0, &port), 0);
        uint32_t p; cr_assert_eq(net_connect(c.n, "127.0.0.1", port, &p), 0);
        for (int i = 0; i < 400 && !(s.connected && c.connected); i++) { net_run(s.n, 2); net_run(c.n, 2); }
        cr_assert(s.connected == 1 && c.connected == 1, "connected %d/%d", s.connected, c.connected);
        NetStats st; net_get_stats(s.n, &st);
        cr_assert_eq(st.links, 1, "the server counts %u links", st.links);
        cr_assert_eq(connections_to(port), lanes);
        static const size_t sizes[] = { 0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 100000, 1 << 20 };
        enum { N = sizeof sizes / sizeof sizes[0] };
        uint8_t *buf[N];
        for (unsigned k = 0; k < N; k++) {
                buf[k] = malloc(sizes[k] + 1);
                for (size_t i = 0; i < sizes[k]; i++) buf[k][i] = (uint8_t)(i * 13 + k);
        }
        Order *ends[2] = { &c, &s };
        uint32_t peers[2] = { p, s.peer };
        for (int dir = 0; dir < 2; dir++) {
                Order *tx = ends[dir], *rx = ends[1 - dir];
                for (unsigned k = 0; k < N; k++) {
                        TensorDesc d; uint32_t dims[1] = { (uint32_t)sizes[k] }; tensor_desc_init(&d, DTYPE_U8, 1, dims);
                        cr_assert_eq(net_send_tensor(tx->n, peers[dir], k, &d, buf[k], k), 0);
                        uint8_t msg[4] = { (uint8_t)k, 0, 0, 0 };
                        cr_assert_eq(net_send_control(tx->n, peers[dir], FRAME_CONTROL, msg, 4), 0);
                }
                for (int i = 0; i < 4000 && (rx->got < 2 * N || tx->sent < N); i++) { net_run(c.n, 1); net_run(s.n, 1); }
                cr_assert_eq(rx->got, 2 * N, "direction %d: %u items", dir, rx->got);
                cr_assert_eq(tx->sent, N);
                cr_assert_eq(rx->bad, 0);
                for (unsigned k = 0; k < N; k++) {
                        cr_assert_eq(rx->order[2 * k], k, "item %u is %u", 2 * k, rx->order[2 * k]);
                        cr_assert_eq(rx->bytes[2 * k], sizes[k]);
                        cr_assert_eq(rx->order[2 * k + 1], k | 1u << 31);
                }
                rx->got = 0;
        }
        /* more items than the window, queued at once: the sender waits for ACKs */
        for (unsigned k = 0; k < 200; k++) {
                TensorDesc d; uint32_t dims[1] = { 4097 }; tensor_desc_init(&d, DTYPE_U8, 1, dims);
                cr_assert_eq(net_send_tensor(c.n, p, 4, &d, buf[4], k), 0);
        }
        c.sent = 0;
        for (int i = 0; i < 4000 && s.got < 200; i++) { net_run(c.n, 1); net_run(s.n, 1); }
        cr_assert_eq(s.got, 200);
        /* one connection cut: the link is gone at both ends, once */
        int fd = -1;
        for (int cand = 3; cand < 1024 && fd < 0; cand++) {
                struct sockaddr_in sa; socklen_t len = sizeof sa;
                if (getpeername(cand, (struct sockaddr *)&sa, &len) == 0 && ntohs(sa.sin_port) == port) fd = cand;
        }
        cr_assert(fd >= 0);
        shutdown(fd, SHUT_RDWR);
        for (int i = 0; i < 500 && !(s.closed && c.closed); i++) { net_run(s.n, 2); net_run(c.n, 2); }
        cr_assert(s.closed == 1 && c.closed == 1, "closed %d/%d", s.closed, c.closed);
        net_get_stats(s.n, &st);
        for (int i = 0; i < 100 && (st.links || connections_to(port)); i++) { net_run(s.n, 2); net_run(c.n, 2); net_get_stats(s.n, &st); }
        cr_assert_eq(st.links, 0, "%u links left", st.links);
        cr_assert_eq(connections_to(port), 0, "connections left");
        net_free(c.n);
        net_free(s.n);
        for (unsigned k = 0; k < N; k++) free(buf[k]);
}
Test(netsmoke, lanes_epoll) { lanes_both_ways(NET_BACKEND_EPOLL, 4); }
Test(netsmoke, lanes_uring) { lanes_both_ways(NET_BACKEND_URING, 4); }
Test(netsmoke, lanes_eight_uring) { lanes_both_ways(NET_BACKEND_URING, 8); }
Test(netsmoke, lanes_one) { lanes_both_ways(NET_BACKEND_URING, 1); }

/* A listening socket handed over (LISTEN_FDS): net_listen() on its address
 * listens there without binding (it could not: the socket holds the port),
 * and a peer connects through it. Anything but a listening TCP socket is
 * refused. */
Test(netsmoke, inherited_listener) {
        int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), idle = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;
        cr_assert(held >= 0 && idle >= 0);
        cr_assert_eq(bind(held, (struct sockaddr *)&sa, sizeof sa), 0);
        cr_assert_eq(listen(held, 16), 0);
        cr_assert_eq(getsockname(held, (struct sockaddr *)&sa, &len), 0);
        uint16_t port = ntohs(sa.sin_port), got = 0;
        cr_assert_eq(net_inherit_listeners(&idle, 1), -ENOTSOCK);
        int pipe_fds[2];
        cr_assert_eq(pipe(pipe_fds), 0);
        cr_assert_eq(net_inherit_listeners(pipe_fds, 1), -ENOTSOCK);
        cr_assert_eq(net_inherit_listeners(&held, 1), 0);

        Identity a, b; identity_generate(&a); identity_generate(&b);
        uint8_t secret[32] = { 4, 5, 6 };
        NetConfig ca, cb2; net_config_defaults(&ca); ca.identity = &a; ca.secret = secret;
        cb2 = ca; cb2.identity = &b;
        Side s = {}, c = {};
        cr_assert_eq(net_new(&ca, &cbs, &s, &s.n), 0);
        cr_assert_eq(net_new(&cb2, &cbs, &c, &c.n), 0);
        cr_assert_eq(net_listen(s.n, "127.0.0.1", port, &got), 0);
        cr_assert_eq(got, port);
        uint32_t p; cr_assert_eq(net_connect(c.n, "127.0.0.1", port, &p), 0);
        for (int i = 0; i < 200 && !(s.connected && c.connected); i++) { net_run(s.n, 5); net_run(c.n, 5); }
        cr_assert(s.connected && c.connected);
        net_free(c.n);
        net_free(s.n);
        /* the Net listened on a copy: the handed-over socket still listens */
        int listening = 0; len = sizeof listening;
        cr_assert_eq(getsockopt(held, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len), 0);
        cr_assert(listening);
        close(held); close(idle); close(pipe_fds[0]); close(pipe_fds[1]);
}
