#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
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
        sv.stop = 1;
        pthread_join(t, NULL);
        net_free(sv.n);
        cb2.secret = secret;
        cr_assert_eq(net_probe(&cb2, "127.0.0.1", port, a.pk), -ECONNREFUSED);
}
