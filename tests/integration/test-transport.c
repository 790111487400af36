/* The transport between real processes on loopback, in both backends:
 * round trips of tensors from 0 bytes to 64 MiB, and every kind of bad peer
 * (wrong secret, unknown identity, tampered header or payload, replayed and
 * reordered frames, truncated streams, oversized lengths, a peer that stops
 * mid-frame, garbage, silence) is dropped while a well-behaved link on the
 * same listener keeps working. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/handshake.h"
#include "net/net.h"

static const uint8_t secret[32] = "ravnest test network secret....";

/* ---- the server: a child process that echoes tensors back ---------------- */

typedef struct Server {
        Net *n;
        NetTensor *pending[64];
        int quit;
} Server;

static void srv_tensor(void *ud, NetTensor *t) {
        Server *s = ud;
        for (int i = 0; i < 64; i++)
                if (!s->pending[i]) {
                        s->pending[i] = t;
                        if (net_send_tensor(s->n, t->peer, t->stream, &t->desc, t->data, (uint64_t)i) < 0) {
                                s->pending[i] = NULL;
                                net_tensor_release(s->n, t);
                        }
                        return;
                }
        net_tensor_release(s->n, t);
}

static void srv_sent(void *ud, uint32_t peer, uint64_t cookie) {
        Server *s = ud;
        if (cookie < 64 && s->pending[cookie]) {
                net_tensor_release(s->n, s->pending[cookie]);
                s->pending[cookie] = NULL;
        }
}

static void srv_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Server *s = ud;
        if (len == 5 && memcmp(p, "stats", 5) == 0) {
                NetStats st;
                net_get_stats(s->n, &st);
                net_send_control(s->n, peer, FRAME_CONTROL, &st, sizeof st);
        } else if (len == 4 && memcmp(p, "quit", 4) == 0)
                s->quit = 1;
}

static uint32_t test_chunk; /* the DATA payload per frame of both ends; 0: the default */

/* Both ends: the defaults, these admission rules, tensors up to 65 MiB. */
static void test_config(NetConfig *c, NetBackendKind kind, const Identity *id, const uint8_t (*allowed)[32],
                        size_t n_allowed, const uint8_t *sec) {
        net_config_defaults(c);
        c->identity = id;
        c->secret = sec;
        c->allowed = allowed;
        c->n_allowed = n_allowed;
        c->backend = kind;
        c->limits.max_tensor_bytes = 65ull << 20;
        if (test_chunk)
                c->chunk = test_chunk;
}

static bool server_plaintext;
static uint64_t server_max_receive;

static pid_t server_start(NetBackendKind kind, const Identity *id, const uint8_t (*allowed)[32], size_t n_allowed,
                          const uint8_t *sec, uint16_t *ret_port) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
                /* never outlive the test, whatever happens to it */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                close(fds[0]);
                NetConfig c;
                test_config(&c, kind, id, allowed, n_allowed, sec);
                c.plaintext = server_plaintext;
                if (server_max_receive)
                        c.max_receive_bytes = server_max_receive;
                c.stall_timeout_ms = 700;
                c.handshake_timeout_ms = 700;
                static Server s;
                NetCallbacks cb = { .tensor = srv_tensor, .sent = srv_sent, .control = srv_control };
                if (net_new(&c, &cb, &s, &s.n) < 0)
                        _exit(2);
                uint16_t port;
                if (net_listen(s.n, "127.0.0.1", 0, &port) < 0)
                        _exit(3);
                if (write(fds[1], &port, sizeof port) != sizeof port)
                        _exit(4);
                close(fds[1]);
                for (int i = 0; i < 200000 && !s.quit; i++)
                        net_run(s.n, 10);
                net_free(s.n);
                _exit(0);
        }
        close(fds[1]);
        cr_assert_eq(read(fds[0], ret_port, sizeof *ret_port), (ssize_t)sizeof *ret_port, "server did not start");
        close(fds[0]);
        return pid;
}

static pid_t server_start_plaintext(const Identity *id, uint16_t *ret_port) {
        server_plaintext = true;
        pid_t pid = server_start(NET_BACKEND_AUTO, id, NULL, 0, secret, ret_port);
        server_plaintext = false;
        return pid;
}

/* ---- a well-behaved client ------------------------------------------------ */

typedef struct Client {
        Net *n;
        uint32_t peer;
        int connected, closed, got_control;
        NetTensor *t;
        NetStats remote;
        NetTensor *burst[32]; /* burst(): the echoes, in the order they came */
        unsigned n_burst;
        bool collect;
} Client;

static void cl_connected(void *ud, uint32_t peer, const uint8_t id[32]) {
        ((Client *)ud)->connected = 1;
}
static void cl_tensor(void *ud, NetTensor *t) {
        Client *c = ud;
        if (c->collect && c->n_burst < 32) {
                c->burst[c->n_burst++] = t;
                return;
        }
        if (c->t)
                net_tensor_release(c->n, c->t);
        c->t = t;
}
static void cl_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Client *c = ud;
        if (len == sizeof c->remote)
                memcpy(&c->remote, p, len);
        c->got_control++;
}
static void cl_closed(void *ud, uint32_t peer, int reason, const uint8_t id[32]) {
        ((Client *)ud)->closed = reason ? reason : 1;
}

static uint32_t client_ciphers; /* client_start(): the ciphers it offers; 0: every one */
static bool client_plaintext;   /* client_start(): plaintext allowed */

static void client_start(Client *c, NetBackendKind kind, const Identity *id, const uint8_t (*allowed)[32],
                         size_t n_allowed, const uint8_t *sec, uint16_t port) {
        NetConfig cfg;
        test_config(&cfg, kind, id, allowed, n_allowed, sec);
        cfg.ciphers = client_ciphers;
        cfg.plaintext = client_plaintext;
        NetCallbacks cb = { .connected = cl_connected, .tensor = cl_tensor, .control = cl_control, .closed = cl_closed };
        memset(c, 0, sizeof *c);
        cr_assert_eq(net_new(&cfg, &cb, c, &c->n), 0);
        cr_assert_eq(net_connect(c->n, "127.0.0.1", port, &c->peer), 0);
        for (int i = 0; i < 500 && !c->connected && !c->closed; i++)
                net_run(c->n, 10);
        cr_assert(c->connected, "the good client did not connect (closed %d)", c->closed);
}

/* n bytes to send, a pattern that differs with the stream */
static uint8_t *pattern(size_t n, uint32_t stream) {
        uint8_t *buf = malloc(n + 1);
        for (size_t i = 0; i < n; i++)
                buf[i] = (uint8_t)(i * 131 + (i >> 13) + stream);
        return buf;
}

/* Send a tensor of n bytes and check the echo, bit for bit. */
static void round_trip(Client *c, size_t n, uint32_t stream) {
        uint8_t *buf = pattern(n, stream);
        uint32_t dims[2] = { (uint32_t)(n / 4), 4 };
        TensorDesc d;
        if (n % 4 == 0)
                tensor_desc_init(&d, DTYPE_U8, 2, dims);
        else
                tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ (uint32_t)n });
        if (c->t) {
                net_tensor_release(c->n, c->t);
                c->t = NULL;
        }
        cr_assert_eq(net_send_tensor(c->n, c->peer, stream, &d, buf, 1), 0);
        for (int i = 0; i < 30000 && !c->t && !c->closed; i++)
                net_run(c->n, 1);
        cr_assert_not_null(c->t, "no echo of %zu bytes (closed %d)", n, c->closed);
        cr_assert_eq(c->t->desc.bytes, n);
        cr_assert_eq(c->t->stream, stream);
        cr_assert_eq(c->t->desc.ndim, d.ndim);
        cr_assert(n == 0 || memcmp(c->t->data, buf, n) == 0, "echo of %zu bytes differs", n);
        free(buf);
}

/* Tensors of these sizes queued at once, a control message among them,
 * and every echo back in order, bit for bit: frames go several to a send
 * and come in several to a receive, and each lands where it belongs. */
static void burst(Client *c, const size_t *sizes, unsigned n) {
        uint8_t *bufs[32];
        int controls = c->got_control;
        cr_assert(n <= 32);
        c->collect = true;
        c->n_burst = 0;
        for (unsigned k = 0; k < n; k++) {
                TensorDesc d;
                tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ (uint32_t)sizes[k] });
                bufs[k] = pattern(sizes[k], k);
                cr_assert_eq(net_send_tensor(c->n, c->peer, k, &d, bufs[k], k), 0);
                if (k == n / 2)
                        cr_assert_eq(net_send_control(c->n, c->peer, FRAME_CONTROL, "stats", 5), 0);
        }
        for (int i = 0; i < 30000 && (c->n_burst < n || c->got_control == controls) && !c->closed; i++)
                net_run(c->n, 1);
        cr_assert_eq(c->n_burst, n, "%u of %u echoes (closed %d)", c->n_burst, n, c->closed);
        cr_assert_gt(c->got_control, controls, "the control message among the tensors was not answered");
        for (unsigned k = 0; k < n; k++) {
                NetTensor *t = c->burst[k];
                cr_assert_eq(t->stream, k, "echo %u is of tensor %u", k, t->stream);
                cr_assert_eq(t->desc.bytes, sizes[k]);
                cr_assert(sizes[k] == 0 || memcmp(t->data, bufs[k], sizes[k]) == 0, "echo of %zu bytes differs",
                          sizes[k]);
                net_tensor_release(c->n, t);
                free(bufs[k]);
        }
        c->collect = false;
}

static void remote_stats(Client *c) {
        int before = c->got_control;
        cr_assert_eq(net_send_control(c->n, c->peer, FRAME_CONTROL, "stats", 5), 0);
        for (int i = 0; i < 2000 && c->got_control == before; i++)
                net_run(c->n, 1);
        cr_assert_gt(c->got_control, before, "no stats from the server");
}

static void server_stop(Client *c, pid_t pid) {
        net_send_control(c->n, c->peer, FRAME_CONTROL, "quit", 4);
        for (int i = 0; i < 100; i++)
                net_run(c->n, 5);
        if (c->t)
                net_tensor_release(c->n, c->t);
        net_free(c->n);
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "server exit status %d", status);
}

/* ---- round trips ------------------------------------------------------------ */

static void round_trips(NetBackendKind kind) {
        Identity a, b;
        identity_generate(&a);
        identity_generate(&b);
        uint16_t port;
        pid_t pid = server_start(kind, &a, NULL, 0, secret, &port);
        Client c;
        client_start(&c, kind, &b, NULL, 0, secret, port);
        /* two nodes of this version on this CPU: the fastest cipher it runs */
        uint32_t have = cipher_available();
        Cipher best = have & CIPHER_BIT(CIPHER_AEGIS256X4)   ? CIPHER_AEGIS256X4
                      : have & CIPHER_BIT(CIPHER_AEGIS256X2) ? CIPHER_AEGIS256X2
                      : have & CIPHER_BIT(CIPHER_AEGIS256) ? CIPHER_AEGIS256
                      : have & CIPHER_BIT(CIPHER_AES256GCM) ? CIPHER_AES256GCM : CIPHER_CHACHA20POLY1305;
        cr_assert_eq(net_peer_cipher(c.n, c.peer), (int)best, "%s", cipher_to_string(net_peer_cipher(c.n, c.peer)));
        static const size_t sizes[] = { 0, 1, 3, 4, 31, 4096, 65535, 1 << 20, (1 << 20) + 1, 3 << 20, 16 << 20, 64 << 20 };
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
                round_trip(&c, sizes[k], (uint32_t)k);
        server_stop(&c, pid);
}

/* A server, and a client that offers cipher c only (CIPHER_NONE:
 * plaintext, which both ends then allow on loopback); 0 when this CPU does
 * not run c. */
static pid_t pair_with_cipher(Client *cl, NetBackendKind kind, Cipher c) {
        if (c != CIPHER_NONE && !(cipher_available() & CIPHER_BIT(c))) {
                cr_log_warn("SKIP: %s: this CPU does not run it\n", cipher_to_string(c));
                return 0;
        }
        Identity a, b;
        identity_generate(&a);
        identity_generate(&b);
        uint16_t port;
        server_plaintext = client_plaintext = c == CIPHER_NONE;
        pid_t pid = server_start(kind, &a, NULL, 0, secret, &port);
        client_ciphers = c == CIPHER_NONE ? 0 : CIPHER_BIT(c);
        client_start(cl, kind, &b, NULL, 0, secret, port);
        server_plaintext = client_plaintext = false;
        client_ciphers = 0;
        cr_assert_eq(net_peer_cipher(cl->n, cl->peer), (int)c, "%s", cipher_to_string(c));
        return pid;
}

/* A peer that offers one cipher only (an older version, another CPU)
 * gets it, and tensors go both ways bit for bit, whatever their sizes
 * against the cipher's blocks and the frames. */
Test(transport, every_cipher_round_trips, .timeout = 120) {
        static const Cipher ciphers[] = { CIPHER_AES256GCM, CIPHER_CHACHA20POLY1305, CIPHER_AEGIS256,
                                          CIPHER_AEGIS256X2, CIPHER_AEGIS256X4 };
        static const size_t sizes[] = { 0, 1, 31, 33, 65535, (1 << 20) + 1, 16 << 20 };
        for (size_t k = 0; k < sizeof ciphers / sizeof *ciphers; k++) {
                Client c;
                pid_t pid = pair_with_cipher(&c, NET_BACKEND_AUTO, ciphers[k]);
                if (!pid)
                        continue;
                for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
                        round_trip(&c, sizes[i], (uint32_t)i);
                server_stop(&c, pid);
        }
}

/* Small frames (max_frame 4 KiB), each cipher and plaintext, each
 * backend: sent many to a send, read many to a receive. */
static void small_frames(NetBackendKind kind) {
        static const Cipher ciphers[] = { CIPHER_NONE, CIPHER_AES256GCM, CIPHER_CHACHA20POLY1305, CIPHER_AEGIS256,
                                          CIPHER_AEGIS256X2, CIPHER_AEGIS256X4 };
        static const size_t sizes[] = { 4096, 0, 1, 4095, 4097, 31, 100000, 8192, 3, 65536, 1 << 20, 7,
                                        4096 * 3 + 5, 0, 250000, 1, (1 << 20) + 3, 12, 64, 4096 };
        test_chunk = 4096;
        for (size_t k = 0; k < sizeof ciphers / sizeof *ciphers; k++) {
                Client c;
                pid_t pid = pair_with_cipher(&c, kind, ciphers[k]);
                if (!pid)
                        continue;
                for (int round = 0; round < 3; round++)
                        burst(&c, sizes, sizeof sizes / sizeof *sizes);
                round_trip(&c, 3 << 20, 40); /* one at a time as well */
                server_stop(&c, pid);
        }
        test_chunk = 0;
}

Test(transport, small_frames_epoll, .timeout = 120) {
        small_frames(NET_BACKEND_EPOLL);
}
Test(transport, small_frames_uring, .timeout = 120) {
        small_frames(NET_BACKEND_URING);
}

Test(transport, round_trips_epoll, .timeout = 120) {
        round_trips(NET_BACKEND_EPOLL);
}
Test(transport, round_trips_uring, .timeout = 120) {
        round_trips(NET_BACKEND_URING);
}

/* ---- bad peers ----------------------------------------------------------------- */

typedef struct Raw {
        int fd;
        Handshake hs;
        Seal seal;
} Raw;

static void raw_close(Raw *r) {
        seal_clear(&r->seal);
        close(r->fd);
}

static int raw_tcp(uint16_t port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        return fd;
}

static void raw_write(Raw *r, const void *p, size_t n) {
        ssize_t k = send(r->fd, p, n, MSG_NOSIGNAL);
        cr_assert_eq(k, (ssize_t)n, "send of %zu bytes: %zd (%s)", n, k, k < 0 ? strerror(errno) : "short");
}

/* Read exactly n bytes (false on EOF, error or after timeout_ms). */
static bool raw_read(Raw *r, void *p, size_t n, int timeout_ms) {
        size_t got = 0;
        while (got < n) {
                struct pollfd pfd = { r->fd, POLLIN, 0 };
                if (poll(&pfd, 1, timeout_ms) <= 0)
                        return false;
                ssize_t k = recv(r->fd, (uint8_t *)p + got, n - got, 0);
                if (k <= 0)
                        return false;
                got += (size_t)k;
        }
        return true;
}

/* The server closed the connection within timeout_ms? */
static bool raw_closed(Raw *r, int timeout_ms) {
        uint8_t buf[4096];
        for (;;) {
                struct pollfd pfd = { r->fd, POLLIN, 0 };
                if (poll(&pfd, 1, timeout_ms) <= 0)
                        return false;
                ssize_t k = recv(r->fd, buf, sizeof buf, 0);
                if (k <= 0)
                        return true;
        }
}

static void raw_clear_frame(Raw *r, uint8_t type, const uint8_t *p, size_t len) {
        uint8_t hdr[FRAME_HEADER_SIZE];
        FrameHeader h = { .type = type, .length = (uint32_t)len };
        frame_header_encode(&h, hdr);
        raw_write(r, hdr, sizeof hdr);
        raw_write(r, p, len);
}

/* Run the handshake by hand, calling between() (when not NULL) after the
 * HELLO_REPLY and before the AUTH, as a peer far away would take a while;
 * returns what went wrong, or 0 once WELCOME is in. */
static int raw_handshake_between(Raw *r, uint16_t port, const HandshakeConfig *hc, void (*between)(void *),
                                 void *ud) {
        uint8_t buf[512], type, hdr[FRAME_HEADER_SIZE];
        FrameLimits lim = { 1 << 20, 1 << 16, 1 << 30 };
        FrameHeader h;
        int n;

        memset(&r->seal, 0, sizeof r->seal);
        r->fd = raw_tcp(port);
        cr_assert_eq(handshake_init(&r->hs, hc, true), 0);
        n = handshake_next(&r->hs, &type, buf, sizeof buf);
        raw_clear_frame(r, type, buf, (size_t)n);
        if (!raw_read(r, hdr, sizeof hdr, 2000))
                return -ECONNRESET;
        cr_assert_eq(frame_header_decode(hdr, &lim, &h), 0);
        cr_assert(raw_read(r, buf, h.length, 2000));
        int e = handshake_recv(&r->hs, h.type, buf, h.length);
        if (e < 0)
                return e;
        if (between)
                between(ud);
        n = handshake_next(&r->hs, &type, buf, sizeof buf);
        raw_clear_frame(r, type, buf, (size_t)n);
        Cipher c;
        uint8_t tx[32], rx[32], peer[32];
        handshake_result(&r->hs, &c, tx, rx, peer);
        cr_assert_eq(seal_init(&r->seal, c, tx, rx), 0);
        /* WELCOME: header and tag */
        if (!raw_read(r, hdr, sizeof hdr, 2000))
                return -EACCES;
        cr_assert_eq(frame_header_decode(hdr, &lim, &h), 0);
        cr_assert_eq(h.type, FRAME_WELCOME);
        uint8_t tag[16];
        cr_assert(raw_read(r, tag, 16, 2000));
        cr_assert_eq(seal_open(&r->seal, hdr, &h, NULL, 0, tag), 0);
        return 0;
}

static int raw_handshake(Raw *r, uint16_t port, const HandshakeConfig *hc) {
        return raw_handshake_between(r, port, hc, NULL, NULL);
}

/* A sealed frame: header, payload, tag, contiguous in out. */
static size_t raw_sealed_at(Raw *r, uint8_t type, uint64_t offset, const void *payload, size_t len,
                            uint8_t *out) {
        FrameHeader h = { .type = type, .stream = 9, .offset = offset, .length = (uint32_t)len };
        seal_frame_to(&r->seal, &h, out, out + FRAME_HEADER_SIZE, payload, len, out + FRAME_HEADER_SIZE + len);
        return FRAME_HEADER_SIZE + len + FRAME_TAG_SIZE;
}

static size_t raw_sealed(Raw *r, uint8_t type, const void *payload, size_t len, uint8_t *out) {
        return raw_sealed_at(r, type, 0, payload, len, out);
}

typedef struct Fixture {
        NetBackendKind kind;
        Identity server, good, stranger;
        uint8_t allowed[2][32];
        uint16_t port;
        pid_t pid;
        Client c;
        HandshakeConfig raw_cfg; /* a raw client that knows the secret */
} Fixture;

static void fixture_up(Fixture *f, NetBackendKind kind, bool allowlist) {
        memset(f, 0, sizeof *f);
        f->kind = kind;
        identity_generate(&f->server);
        identity_generate(&f->good);
        identity_generate(&f->stranger);
        memcpy(f->allowed[0], f->good.pk, 32);
        memcpy(f->allowed[1], f->server.pk, 32);
        if (allowlist)
                f->pid = server_start(kind, &f->server, (const uint8_t(*)[32])f->allowed, 1, NULL, &f->port);
        else
                f->pid = server_start(kind, &f->server, NULL, 0, secret, &f->port);
        client_start(&f->c, kind, &f->good, allowlist ? (const uint8_t(*)[32])&f->allowed[1] : NULL,
                     allowlist ? 1 : 0, allowlist ? NULL : secret, f->port);
        round_trip(&f->c, 1000, 1);
        f->raw_cfg = (HandshakeConfig){ .identity = &f->good, .secret = secret, .ciphers = cipher_available() };
}

/* The good link still works; the server's counters. */
static NetStats fixture_stats(Fixture *f) {
        round_trip(&f->c, 300000, 2);
        remote_stats(&f->c);
        return f->c.remote;
}

static void fixture_down(Fixture *f) {
        server_stop(&f->c, f->pid);
}

static void attacks(NetBackendKind kind) {
        Fixture f;
        Raw r = {};
        uint8_t frame[1024], pay[64] = "a perfectly ordinary control message";
        size_t n;
        NetStats st;

        fixture_up(&f, kind, false);

        /* A raw client that does everything right is admitted and heard. */
        cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
        n = raw_sealed(&r, FRAME_HEARTBEAT, NULL, 0, frame);
        raw_write(&r, frame, n);
        cr_assert(!raw_closed(&r, 200), "a good frame closed the link");
        raw_close(&r);

        /* Wrong network secret: the server refuses the AUTH. A client that
         * does not know the secret cannot check the server's MAC either, so
         * it admits the server by identity and sends a zero MAC. */
        uint8_t server_pk[1][32];
        memcpy(server_pk[0], f.server.pk, 32);
        HandshakeConfig wrong = { .identity = &f.good, .allowed = (const uint8_t(*)[32])server_pk, .n_allowed = 1,
                                  .ciphers = cipher_available() };
        cr_assert_neq(raw_handshake(&r, f.port, &wrong), 0, "admitted without the secret");
        raw_close(&r);
        st = fixture_stats(&f);
        cr_assert_eq(st.auth_failures, 1, "auth failures %llu", (unsigned long long)st.auth_failures);

        /* A client with a different secret rejects the server's reply itself. */
        uint8_t other[32] = "some other network's secret....";
        HandshakeConfig wrong2 = { .identity = &f.good, .secret = other, .ciphers = cipher_available() };
        cr_assert_eq(raw_handshake(&r, f.port, &wrong2), -EACCES);
        raw_close(&r);

        /* Tampered header (the stream id) and tampered payload. */
        for (int where = 0; where < 3; where++) {
                cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
                n = raw_sealed(&r, FRAME_CONTROL, pay, sizeof pay, frame);
                size_t at = where == 0 ? 8 : where == 1 ? FRAME_HEADER_SIZE + 10 : n - 1; /* stream, payload, tag */
                frame[at] ^= 0x01;
                raw_write(&r, frame, n);
                cr_assert(raw_closed(&r, 2000), "tampered byte %zu accepted", at);
                raw_close(&r);
        }

        /* Replayed frame. */
        cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
        n = raw_sealed(&r, FRAME_HEARTBEAT, NULL, 0, frame);
        memcpy(frame + n, frame, n); /* one write: the server may close before a second */
        raw_write(&r, frame, 2 * n);
        cr_assert(raw_closed(&r, 2000), "replayed frame accepted");
        raw_close(&r);

        /* Reordered frames. */
        uint8_t second[256];
        cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
        n = raw_sealed(&r, FRAME_HEARTBEAT, NULL, 0, frame);
        size_t n2 = raw_sealed(&r, FRAME_HEARTBEAT, NULL, 0, second);
        memcpy(second + n2, frame, n); /* the second frame first, in one write */
        raw_write(&r, second, n2 + n);
        cr_assert(raw_closed(&r, 2000), "reordered frames accepted");
        raw_close(&r);

        st = fixture_stats(&f);
        cr_assert_eq(st.bad_frames, 5, "bad frames %llu", (unsigned long long)st.bad_frames);

        /* Oversized length: refused from the header, before any allocation. */
        cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
        FrameHeader big = { .type = FRAME_CONTROL, .length = 1u << 30, .seq = 0 };
        frame_header_encode(&big, frame);
        raw_write(&r, frame, FRAME_HEADER_SIZE);
        cr_assert(raw_closed(&r, 2000), "oversized frame accepted");
        raw_close(&r);
        /* A tensor descriptor above the tensor limit. */
        cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
        TensorDesc d;
        tensor_desc_init(&d, DTYPE_F32, 2, (uint32_t[]){ 1u << 20, 1u << 10 }); /* 4 GiB */
        uint8_t desc[TENSOR_DESC_MAX_SIZE];
        size_t dl = tensor_desc_encode(&d, desc);
        n = raw_sealed(&r, FRAME_TENSOR, desc, dl, frame);
        raw_write(&r, frame, n);
        cr_assert(raw_closed(&r, 2000), "4 GiB tensor accepted");
        raw_close(&r);
        st = fixture_stats(&f);
        cr_assert_eq(st.limit_violations, 2, "limit violations %llu", (unsigned long long)st.limit_violations);

        /* Truncated stream: half a frame, then the connection ends. */
        cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
        n = raw_sealed(&r, FRAME_CONTROL, pay, sizeof pay, frame);
        raw_write(&r, frame, n / 2);
        raw_close(&r);

        /* A peer that stops mid-frame and stays connected: dropped after the
         * stall timeout (700 ms in this server). */
        cr_assert_eq(raw_handshake(&r, f.port, &f.raw_cfg), 0);
        n = raw_sealed(&r, FRAME_CONTROL, pay, sizeof pay, frame);
        raw_write(&r, frame, n - 5);
        cr_assert(raw_closed(&r, 5000), "a stalled sender was not dropped");
        raw_close(&r);

        /* Silence: never even says hello. */
        r.fd = raw_tcp(f.port);
        cr_assert(raw_closed(&r, 5000), "a silent connection was not dropped");
        raw_close(&r);

        /* Garbage instead of a handshake (longer than a header, so it is
         * judged at once, not left to the handshake deadline). */
        static const char http[] = "GET / HTTP/1.1\r\nHost: ravnest.invalid\r\nAccept: */*\r\n\r\n";
        r.fd = raw_tcp(f.port);
        raw_write(&r, http, sizeof http - 1);
        cr_assert(raw_closed(&r, 2000), "garbage accepted");
        raw_close(&r);

        st = fixture_stats(&f);
        cr_assert_eq(st.timeouts, 2, "timeouts %llu", (unsigned long long)st.timeouts);
        cr_assert_eq(st.links, 1, "only the good link is left, not %u", st.links);
        fixture_down(&f);
}

Test(transport, bad_peers_epoll, .timeout = 120) {
        attacks(NET_BACKEND_EPOLL);
}
Test(transport, bad_peers_uring, .timeout = 120) {
        attacks(NET_BACKEND_URING);
}

static void allowlist(NetBackendKind kind) {
        Fixture f;
        Raw r = {};
        fixture_up(&f, kind, true);
        uint8_t server_pk[1][32];
        memcpy(server_pk[0], f.server.pk, 32);
        /* A stranger with a valid key pair, not on the list. */
        HandshakeConfig stranger = { .identity = &f.stranger, .allowed = (const uint8_t(*)[32])server_pk,
                                     .n_allowed = 1, .ciphers = cipher_available() };
        cr_assert_neq(raw_handshake(&r, f.port, &stranger), 0, "an unknown identity was admitted");
        raw_close(&r);
        /* The known identity is admitted. */
        HandshakeConfig known = stranger;
        known.identity = &f.good;
        cr_assert_eq(raw_handshake(&r, f.port, &known), 0);
        raw_close(&r);
        NetStats st = fixture_stats(&f);
        cr_assert_eq(st.auth_failures, 1);
        fixture_down(&f);
}

Test(transport, allowlist_epoll, .timeout = 60) {
        allowlist(NET_BACKEND_EPOLL);
}
Test(transport, allowlist_uring, .timeout = 60) {
        allowlist(NET_BACKEND_URING);
}

Test(transport, plaintext_needs_both_ends_and_loopback, .timeout = 60) {
        /* Plaintext enabled on the client only: the link is encrypted anyway. */
        Identity a, b;
        identity_generate(&a);
        identity_generate(&b);
        uint16_t port;
        pid_t pid = server_start(NET_BACKEND_AUTO, &a, NULL, 0, secret, &port);
        Raw r = {};
        HandshakeConfig hc = { .identity = &b, .secret = secret, .ciphers = CIPHER_BIT(CIPHER_NONE) };
        /* offering only plaintext to a server that does not allow it */
        cr_assert_neq(raw_handshake(&r, port, &hc), 0);
        raw_close(&r);
        Client c;
        client_start(&c, NET_BACKEND_AUTO, &b, NULL, 0, secret, port);
        cr_assert_neq(net_peer_cipher(c.n, c.peer), CIPHER_NONE);
        round_trip(&c, 12345, 3);
        server_stop(&c, pid);
}

Test(transport, plaintext_on_loopback_when_both_allow_it, .timeout = 60) {
        Identity a, b;
        identity_generate(&a);
        identity_generate(&b);
        uint16_t port;
        pid_t pid = server_start_plaintext(&a, &port);
        Client c;
        NetConfig cfg;
        net_config_defaults(&cfg);
        cfg.identity = &b;
        cfg.secret = secret;
        cfg.plaintext = true;
        NetCallbacks cb = { .connected = cl_connected, .tensor = cl_tensor, .control = cl_control, .closed = cl_closed };
        memset(&c, 0, sizeof c);
        cr_assert_eq(net_new(&cfg, &cb, &c, &c.n), 0);
        cr_assert_eq(net_connect(c.n, "127.0.0.1", port, &c.peer), 0);
        for (int i = 0; i < 500 && !c.connected && !c.closed; i++)
                net_run(c.n, 10);
        cr_assert(c.connected);
        cr_assert_eq(net_peer_cipher(c.n, c.peer), CIPHER_NONE);
        round_trip(&c, (3 << 20) + 5, 4);
        server_stop(&c, pid);
}

/* Strangers that never finish a handshake get few slots; an admitted peer
 * cannot hold more receive memory than max_receive, over all its links. */
static void crowd_and_hoard(NetBackendKind kind) {
        Fixture f;
        Raw r = {}, hoard[2] = {};
        server_max_receive = 3u << 20;
        fixture_up(&f, kind, false);
        server_max_receive = 0;

        /* 8 silent connections from one address are held (until the
         * handshake deadline); the 9th is turned away at once. */
        Raw silent[9];
        for (int i = 0; i < 8; i++)
                silent[i].fd = raw_tcp(f.port);
        usleep(100000);
        silent[8].fd = raw_tcp(f.port);
        cr_assert(raw_closed(&silent[8], 300), "a 9th unauthenticated link from one address was kept");
        cr_assert(!raw_closed(&silent[0], 100), "the first unauthenticated links were dropped too early");
        for (int i = 0; i < 9; i++)
                close(silent[i].fd);

        /* Two admitted links each begin a 2 MiB tensor and send nothing more:
         * the second would take the node past 3 MiB of receive memory. */
        TensorDesc d;
        tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ 2u << 20 });
        uint8_t desc[TENSOR_DESC_MAX_SIZE], frame[256];
        size_t dl = tensor_desc_encode(&d, desc), n;
        for (int i = 0; i < 2; i++) {
                cr_assert_eq(raw_handshake(&hoard[i], f.port, &f.raw_cfg), 0);
                n = raw_sealed(&hoard[i], FRAME_TENSOR, desc, dl, frame);
                raw_write(&hoard[i], frame, n);
                usleep(50000);
        }
        cr_assert(!raw_closed(&hoard[0], 100), "the first tensor within the limit was refused");
        cr_assert(raw_closed(&hoard[1], 2000), "a tensor past max_receive was accepted");
        /* The first one, left without a new byte, times out (stall timeout). */
        cr_assert(raw_closed(&hoard[0], 5000), "a tensor left half sent was held forever");
        raw_close(&hoard[0]);
        raw_close(&hoard[1]);

        NetStats st = fixture_stats(&f);
        cr_assert_geq(st.links_rejected, 1);
        cr_assert_eq(st.limit_violations, 1, "limit violations %llu", (unsigned long long)st.limit_violations);
        cr_assert_geq(st.timeouts, 1);
        cr_assert_eq(st.links, 1);
        (void)r;
        fixture_down(&f);
}

/* Silent connections from many addresses, opened while a peer far away
 * is in its handshake, each past the strangers' cap displacing one: they
 * displace each other, not the peer that sent its HELLO (it was the oldest,
 * and the first to go). */
#define CROWD 100
static int crowd[CROWD];
static bool crowd_gave_way;

static void open_crowd(void *port) {
        for (int i = 0; i < CROWD; i++) {
                crowd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                struct sockaddr_in from = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f010000u + 1 + (unsigned)i) };
                struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(*(uint16_t *)port),
                                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
                cr_assert_eq(bind(crowd[i], (struct sockaddr *)&from, sizeof from), 0, "%s", strerror(errno));
                cr_assert_eq(connect(crowd[i], (struct sockaddr *)&to, sizeof to), 0, "%s", strerror(errno));
        }
        /* the peer goes on once the server has taken them in and some gave
         * way (a busy machine may take a while; its handshake lasts 5 s) */
        crowd_gave_way = false;
        for (int round = 0; round < 25 && !crowd_gave_way; round++)
                for (int i = 0; i < CROWD && !crowd_gave_way; i++) {
                        Raw c = { .fd = crowd[i] };
                        crowd_gave_way = raw_closed(&c, i ? 0 : 100);
                }
}

static void crowd_does_not_displace_a_peer(NetBackendKind kind) {
        Fixture f;
        Raw r = {};
        fixture_up(&f, kind, false);
        cr_assert_eq(raw_handshake_between(&r, f.port, &f.raw_cfg, open_crowd, &f.port), 0,
                     "a peer in its handshake was displaced by silent connections");
        raw_close(&r);
        for (int i = 0; i < CROWD; i++)
                close(crowd[i]);
        cr_assert(crowd_gave_way, "no silent connection gave way: past the cap (a quarter of 256 links), some must");
        (void)fixture_stats(&f); /* the good link still works */
        fixture_down(&f);
}

Test(transport, a_crowd_of_silent_addresses_does_not_displace_a_peer_epoll, .timeout = 60) {
        crowd_does_not_displace_a_peer(NET_BACKEND_EPOLL);
}
Test(transport, a_crowd_of_silent_addresses_does_not_displace_a_peer_uring, .timeout = 60) {
        crowd_does_not_displace_a_peer(NET_BACKEND_URING);
}

/* An admitted peer that trickles a large tensor in, a byte now and then
 * (each well within the stall timeout), holds max_receive only until
 * another tensor needs the room: then it gives way, and the other comes. */
static void trickler_gives_way(NetBackendKind kind) {
        Fixture f;
        Raw slow = {}, fast = {};
        server_max_receive = 3u << 20;
        fixture_up(&f, kind, false);
        server_max_receive = 0;

        TensorDesc d;
        tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ 2u << 20 });
        uint8_t desc[TENSOR_DESC_MAX_SIZE], frame[256], byte = 7;
        size_t dl = tensor_desc_encode(&d, desc), n;
        cr_assert_eq(raw_handshake(&slow, f.port, &f.raw_cfg), 0);
        n = raw_sealed(&slow, FRAME_TENSOR, desc, dl, frame);
        raw_write(&slow, frame, n);
        /* 1.2 s, a byte every 200 ms (the stall timeout is 700 ms) */
        for (uint64_t at = 0; at < 6; at++) {
                usleep(200000);
                n = raw_sealed_at(&slow, FRAME_DATA, at, &byte, 1, frame);
                raw_write(&slow, frame, n);
        }
        cr_assert(!raw_closed(&slow, 100), "a tensor still growing was dropped before anyone needed the room");

        cr_assert_eq(raw_handshake(&fast, f.port, &f.raw_cfg), 0);
        n = raw_sealed(&fast, FRAME_TENSOR, desc, dl, frame);
        raw_write(&fast, frame, n);
        cr_assert(raw_closed(&slow, 2000), "the trickling tensor kept the room");
        cr_assert(!raw_closed(&fast, 300), "the tensor that needed the room was refused");
        raw_close(&slow);
        raw_close(&fast);

        NetStats st = fixture_stats(&f);
        cr_assert_eq(st.limit_violations, 0, "limit violations %llu", (unsigned long long)st.limit_violations);
        cr_assert_geq(st.timeouts, 1);
        fixture_down(&f);
}

Test(transport, tricklers_give_way_epoll, .timeout = 60) {
        trickler_gives_way(NET_BACKEND_EPOLL);
}
Test(transport, tricklers_give_way_uring, .timeout = 60) {
        trickler_gives_way(NET_BACKEND_URING);
}

Test(transport, crowds_and_hoarders_epoll, .timeout = 60) {
        crowd_and_hoard(NET_BACKEND_EPOLL);
}
Test(transport, crowds_and_hoarders_uring, .timeout = 60) {
        crowd_and_hoard(NET_BACKEND_URING);
}
