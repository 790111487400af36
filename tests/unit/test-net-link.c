/* A link's checks and what the transport tells the application when it
 * drops one: a Net in this process, and raw sockets that break the rules
 * (the process-level attacks are in tests/integration/test-transport.c). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/plan.h"
#include "net/handshake.h"
#include "net/net.h"

static const uint8_t secret[32] = "net link unit test secret......";

typedef struct Srv {
        Net *n;
        int connected, closed, reason;
        int tensors, tensors_at_close; /* received; of those, before closed() */
        uint8_t id[IDENTITY_PK_SIZE];
        NetPeerInfo info; /* from net_peer_describe() in closed() */
        int describe;
        int lanes_refused, lane_reason; /* lane_refused(): how many, the last one's reason ... */
        NetPeerInfo lane;               /* ... and what it was */
} Srv;

static void srv_connected(void *ud, uint32_t peer, const uint8_t id[32]) {
        ((Srv *)ud)->connected++;
}
static void srv_tensor(void *ud, NetTensor *t) {
        Srv *s = ud;
        s->tensors++;
        net_tensor_release(s->n, t);
}
static void srv_closed(void *ud, uint32_t peer, int reason, const uint8_t id[32]) {
        Srv *s = ud;
        s->closed++;
        s->tensors_at_close = s->tensors;
        s->reason = reason;
        memcpy(s->id, id, 32);
        s->describe = net_peer_describe(s->n, peer, &s->info);
}
static void srv_lane_refused(void *ud, int reason, const NetPeerInfo *info) {
        Srv *s = ud;
        s->lanes_refused++;
        s->lane_reason = reason;
        s->lane = *info;
}
static const NetCallbacks srv_cb = { .connected = srv_connected, .tensor = srv_tensor, .closed = srv_closed,
                                     .lane_refused = srv_lane_refused };

static Identity server_id, client_id, stranger_id;

static uint64_t srv_max_receive; /* 0: the default */

static uint16_t srv_start(Srv *s, NetBackendKind kind, bool allowlist, unsigned idle_ms) {
        NetConfig c;
        identity_generate(&server_id);
        identity_generate(&client_id);
        identity_generate(&stranger_id);
        net_config_defaults(&c);
        c.identity = &server_id;
        c.backend = kind;
        if (allowlist) {
                c.allowed = (const uint8_t(*)[32])client_id.pk;
                c.n_allowed = 1;
        } else
                c.secret = secret;
        c.handshake_timeout_ms = 300;
        c.stall_timeout_ms = 300;
        c.idle_timeout_ms = idle_ms;
        if (srv_max_receive)
                c.max_receive_bytes = srv_max_receive;
        memset(s, 0, sizeof *s);
        cr_assert_eq(net_new(&c, &srv_cb, s, &s->n), 0);
        uint16_t port;
        cr_assert_eq(net_listen(s->n, "127.0.0.1", 0, &port), 0);
        return port;
}

/* ---- a raw client, served by pumping the server ---------------------------- */

typedef struct Raw {
        int fd;
        uint16_t local_port;
        Handshake hs;
        Seal seal;
} Raw;

static void raw_connect(Raw *r, uint16_t port) {
        memset(r, 0, sizeof *r);
        r->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        cr_assert_eq(connect(r->fd, (struct sockaddr *)&sa, sizeof sa), 0);
        socklen_t len = sizeof sa;
        getsockname(r->fd, (struct sockaddr *)&sa, &len);
        r->local_port = ntohs(sa.sin_port);
}

static void raw_write(Raw *r, const void *p, size_t n) {
        cr_assert_eq(send(r->fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Serve the server until n bytes are read (true), or the connection ends
 * or nothing comes in many rounds (false). */
static bool raw_read(Srv *s, Raw *r, void *p, size_t n) {
        size_t got = 0;
        for (int i = 0; i < 2000 && got < n; i++) {
                net_run(s->n, 2);
                struct pollfd pfd = { r->fd, POLLIN, 0 };
                if (poll(&pfd, 1, 0) <= 0)
                        continue;
                ssize_t k = recv(r->fd, (uint8_t *)p + got, n - got, 0);
                if (k <= 0)
                        return false;
                got += (size_t)k;
        }
        return got == n;
}

/* Serve the server until it has closed the link (and the socket shows it).
 * Returns the bytes the server sent before closing. */
static size_t raw_wait_closed(Srv *s, Raw *r) {
        uint8_t buf[4096];
        size_t total = 0;
        int before = s->closed;
        for (int i = 0; i < 5000; i++) {
                net_run(s->n, 2);
                struct pollfd pfd = { r->fd, POLLIN, 0 };
                if (poll(&pfd, 1, 0) <= 0)
                        continue;
                ssize_t k = recv(r->fd, buf, sizeof buf, 0);
                if (k <= 0) {
                        for (int j = 0; j < 1000 && s->closed == before; j++)
                                net_run(s->n, 2);
                        cr_assert_eq(s->closed, before + 1, "no closed() for the link");
                        return total;
                }
                total += (size_t)k;
        }
        cr_assert_fail("the server kept the link");
        return total;
}

static void raw_frame(Raw *r, const FrameHeader *h, const uint8_t *p) {
        uint8_t hdr[FRAME_HEADER_SIZE];
        frame_header_encode(h, hdr);
        raw_write(r, hdr, sizeof hdr);
        raw_write(r, p, h->length);
}

/* The handshake by hand, up to WELCOME; -errno if the server ends it. */
static int raw_handshake(Srv *s, Raw *r, const HandshakeConfig *hc) {
        uint8_t buf[512], type, hdr[FRAME_HEADER_SIZE], tag[16];
        FrameLimits lim = { 1 << 20, 1 << 16, 1 << 30 };
        FrameHeader h;
        cr_assert_eq(handshake_init(&r->hs, hc, true), 0);
        int n = handshake_next(&r->hs, &type, buf, sizeof buf);
        raw_frame(r, &(FrameHeader){ .type = type, .length = (uint32_t)n }, buf);
        if (!raw_read(s, r, hdr, sizeof hdr))
                return -ECONNRESET;
        cr_assert_eq(frame_header_decode(hdr, &lim, &h), 0);
        cr_assert(raw_read(s, r, buf, h.length));
        int e = handshake_recv(&r->hs, h.type, buf, h.length);
        if (e < 0)
                return e;
        n = handshake_next(&r->hs, &type, buf, sizeof buf);
        raw_frame(r, &(FrameHeader){ .type = type, .length = (uint32_t)n }, buf);
        Cipher c;
        uint8_t tx[32], rx[32], peer[32];
        handshake_result(&r->hs, &c, tx, rx, peer);
        cr_assert_eq(seal_init(&r->seal, c, tx, rx), 0);
        if (!raw_read(s, r, hdr, sizeof hdr))
                return -EACCES;
        cr_assert_eq(frame_header_decode(hdr, &lim, &h), 0);
        cr_assert_eq(h.type, FRAME_WELCOME);
        cr_assert(raw_read(s, r, tag, 16));
        cr_assert_eq(seal_open(&r->seal, hdr, &h, NULL, 0, tag), 0);
        return 0;
}

static void raw_close(Raw *r) {
        seal_clear(&r->seal);
        handshake_clear(&r->hs);
        close(r->fd);
}

static void assert_address(const Srv *s, const Raw *r) {
        char want[64];
        snprintf(want, sizeof want, "127.0.0.1:%u", r->local_port);
        cr_assert_eq(s->describe, 0, "net_peer_describe() in closed(): %d", s->describe);
        cr_assert_str_eq(s->info.address, want);
}

/* A valid HELLO, as the initiator makes it. */
static int hello(Raw *r, uint8_t *buf) {
        uint8_t type;
        HandshakeConfig hc = { .identity = &client_id, .secret = secret, .ciphers = cipher_available() };
        cr_assert_eq(handshake_init(&r->hs, &hc, true), 0);
        return handshake_next(&r->hs, &type, buf, HANDSHAKE_MAX_SIZE);
}

/* ---- the checks -------------------------------------------------------------- */

/* Handshake frames carry stream 0: a HELLO with another one is malformed,
 * and answered with nothing. */
static void handshake_stream(NetBackendKind kind) {
        Srv s;
        Raw r;
        uint8_t buf[HANDSHAKE_MAX_SIZE];
        uint16_t port = srv_start(&s, kind, false, 0);
        raw_connect(&r, port);
        int n = hello(&r, buf);
        raw_frame(&r, &(FrameHeader){ .type = FRAME_HELLO, .stream = 5, .length = (uint32_t)n }, buf);
        cr_assert_eq(raw_wait_closed(&s, &r), 0, "the server answered a HELLO on stream 5");
        cr_assert_eq(s.reason, -EBADMSG);
        assert_address(&s, &r);
        raw_close(&r);
        net_free(s.n);
}
Test(netlink, handshake_frames_carry_stream_0_epoll) { handshake_stream(NET_BACKEND_EPOLL); }
Test(netlink, handshake_frames_carry_stream_0_uring) { handshake_stream(NET_BACKEND_URING); }

/* A ravnest frame of another version: its own reason, and the version. */
Test(netlink, another_version_is_its_own_error) {
        Srv s;
        Raw r;
        uint8_t buf[HANDSHAKE_MAX_SIZE], hdr[FRAME_HEADER_SIZE];
        uint16_t port = srv_start(&s, NET_BACKEND_AUTO, false, 0);
        raw_connect(&r, port);
        int n = hello(&r, buf);
        frame_header_encode(&(FrameHeader){ .type = FRAME_HELLO, .length = (uint32_t)n }, hdr);
        hdr[4] = 2;
        raw_write(&r, hdr, sizeof hdr);
        raw_write(&r, buf, (size_t)n);
        cr_assert_eq(raw_wait_closed(&s, &r), 0, "the server answered a version 2 HELLO");
        cr_assert_eq(s.reason, -EPROTONOSUPPORT, "reason %d", s.reason);
        cr_assert_eq(s.info.peer_version, 2);
        assert_address(&s, &r);
        raw_close(&r);
        net_free(s.n);
}

/* A small-order ephemeral key in HELLO: refused at once, no HELLO_REPLY. */
Test(netlink, small_order_key_refused_at_hello) {
        Srv s;
        Raw r;
        uint8_t buf[HANDSHAKE_MAX_SIZE];
        uint16_t port = srv_start(&s, NET_BACKEND_AUTO, false, 0);
        raw_connect(&r, port);
        int n = hello(&r, buf);
        memset(buf + 4, 0, 32);
        raw_frame(&r, &(FrameHeader){ .type = FRAME_HELLO, .length = (uint32_t)n }, buf);
        cr_assert_eq(raw_wait_closed(&s, &r), 0, "the server answered a small-order key");
        cr_assert_eq(s.reason, -EKEYREJECTED, "reason %d", s.reason);
        NetStats st;
        net_get_stats(s.n, &st);
        cr_assert_eq(st.auth_failures, 1);
        raw_close(&r);
        net_free(s.n);
}

/* A peer refused by the allowlist: the server can name its address and the
 * key it signed with, though the closed() id stays zero. */
Test(netlink, a_refused_peer_is_named) {
        Srv s;
        Raw r;
        uint16_t port = srv_start(&s, NET_BACKEND_AUTO, true, 0);
        raw_connect(&r, port);
        HandshakeConfig hc = { .identity = &stranger_id, .allowed = (const uint8_t(*)[32])server_id.pk,
                               .n_allowed = 1, .ciphers = cipher_available() };
        cr_assert_neq(raw_handshake(&s, &r, &hc), 0, "a stranger was admitted");
        for (int i = 0; i < 1000 && !s.closed; i++)
                net_run(s.n, 2);
        cr_assert_eq(s.closed, 1);
        cr_assert_eq(s.reason, -EACCES, "reason %d", s.reason);
        static const uint8_t zero[32];
        cr_assert_arr_eq(s.id, zero, 32);
        assert_address(&s, &r);
        cr_assert(s.info.key_known && !s.info.open);
        cr_assert_arr_eq(s.info.key, stranger_id.pk, 32);
        raw_close(&r);
        net_free(s.n);
}

/* The three deadlines, each named. */
Test(netlink, timeouts_say_which) {
        Srv s;
        Raw r;
        HandshakeConfig hc = { .identity = &client_id, .secret = secret, .ciphers = cipher_available() };

        /* silent: the handshake deadline */
        uint16_t port = srv_start(&s, NET_BACKEND_AUTO, false, 600);
        raw_connect(&r, port);
        raw_wait_closed(&s, &r);
        cr_assert_eq(s.reason, -ETIMEDOUT);
        cr_assert_eq(s.info.timeout, NET_TIMEOUT_HANDSHAKE, "%s", net_timeout_to_string(s.info.timeout));
        assert_address(&s, &r);
        raw_close(&r);

        /* after the handshake, half a frame and then nothing: stalled */
        raw_connect(&r, port);
        cr_assert_eq(raw_handshake(&s, &r, &hc), 0);
        uint8_t hdr[FRAME_HEADER_SIZE];
        frame_header_encode(&(FrameHeader){ .type = FRAME_CONTROL, .length = 100 }, hdr);
        raw_write(&r, hdr, 10);
        raw_wait_closed(&s, &r);
        cr_assert_eq(s.reason, -ETIMEDOUT);
        cr_assert_eq(s.info.timeout, NET_TIMEOUT_STALL, "%s", net_timeout_to_string(s.info.timeout));
        cr_assert(s.info.open && s.info.key_known);
        cr_assert_arr_eq(s.info.key, client_id.pk, 32);
        raw_close(&r);

        /* after the handshake, nothing at all: idle */
        raw_connect(&r, port);
        cr_assert_eq(raw_handshake(&s, &r, &hc), 0);
        raw_wait_closed(&s, &r);
        cr_assert_eq(s.reason, -ETIMEDOUT);
        cr_assert_eq(s.info.timeout, NET_TIMEOUT_IDLE, "%s", net_timeout_to_string(s.info.timeout));
        raw_close(&r);
        net_free(s.n);
}

/* A node that stops says BYE on its links: its peer sees an orderly close
 * (reason 0), not a lost connection. */
static void stop_says_bye(NetBackendKind kind) {
        Srv s;
        uint16_t port = srv_start(&s, kind, false, 0);
        NetConfig c;
        net_config_defaults(&c);
        c.identity = &client_id;
        c.secret = secret;
        c.backend = kind;
        Srv cl = {};
        cr_assert_eq(net_new(&c, &srv_cb, &cl, &cl.n), 0);
        uint32_t peer;
        cr_assert_eq(net_connect(cl.n, "127.0.0.1", port, &peer), 0);
        for (int i = 0; i < 1000 && !(s.connected && cl.connected); i++) {
                net_run(s.n, 2);
                net_run(cl.n, 2);
        }
        cr_assert(s.connected && cl.connected);
        net_free(cl.n);
        for (int i = 0; i < 1000 && !s.closed; i++)
                net_run(s.n, 2);
        cr_assert_eq(s.closed, 1);
        cr_assert_eq(s.reason, 0, "the stopping peer did not say BYE: reason %d", s.reason);
        cr_assert_eq(cl.closed, 0, "closed() ran inside net_free()");
        net_free(s.n);
}
Test(netlink, a_stopping_node_says_bye_epoll) { stop_says_bye(NET_BACKEND_EPOLL); }
Test(netlink, a_stopping_node_says_bye_uring) { stop_says_bye(NET_BACKEND_URING); }

/* The control limit is the protocol's, 64 KiB inclusive: a payload of
 * exactly FRAME_MAX_CONTROL bytes goes through, one more is refused on
 * both sides, and the largest plan fits. */
static int got_control;
static size_t got_len;
static void count_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        got_control++;
        got_len = len;
}
Test(netlink, control_limit_is_64_KiB_inclusive) {
        cr_assert_eq(FRAME_MAX_CONTROL, 65536);
        cr_assert_leq(PLAN_MAX_BYTES, FRAME_MAX_CONTROL);
        NetConfig c;
        net_config_defaults(&c);
        cr_assert_eq(c.limits.max_control, FRAME_MAX_CONTROL);

        uint8_t hdr[FRAME_HEADER_SIZE];
        FrameHeader h = { .type = FRAME_CONTROL, .length = FRAME_MAX_CONTROL };
        frame_header_encode(&h, hdr);
        cr_assert_eq(frame_header_decode(hdr, &c.limits, &h), 0);
        h = (FrameHeader){ .type = FRAME_PLAN, .length = FRAME_MAX_CONTROL + 1 };
        frame_header_encode(&h, hdr);
        cr_assert_eq(frame_header_decode(hdr, &c.limits, &h), -EMSGSIZE);

        Identity a, b;
        identity_generate(&a);
        identity_generate(&b);
        c.identity = &a;
        c.secret = secret;
        NetConfig c2 = c;
        c2.identity = &b;
        NetCallbacks cb = { .connected = srv_connected, .control = count_control };
        Srv s = {}, cl = {};
        cr_assert_eq(net_new(&c, &cb, &s, &s.n), 0);
        cr_assert_eq(net_new(&c2, &srv_cb, &cl, &cl.n), 0);
        uint16_t port;
        uint32_t peer;
        cr_assert_eq(net_listen(s.n, "127.0.0.1", 0, &port), 0);
        cr_assert_eq(net_connect(cl.n, "127.0.0.1", port, &peer), 0);
        for (int i = 0; i < 1000 && !(s.connected && cl.connected); i++) {
                net_run(s.n, 2);
                net_run(cl.n, 2);
        }
        cr_assert(s.connected && cl.connected);
        static uint8_t big[FRAME_MAX_CONTROL + 1];
        cr_assert_eq(net_send_control(cl.n, peer, FRAME_CONTROL, big, sizeof big), -EMSGSIZE);
        cr_assert_eq(net_send_control(cl.n, peer, FRAME_CONTROL, big, FRAME_MAX_CONTROL), 0);
        for (int i = 0; i < 1000 && !got_control; i++) {
                net_run(cl.n, 2);
                net_run(s.n, 2);
        }
        cr_assert_eq(got_control, 1);
        cr_assert_eq(got_len, FRAME_MAX_CONTROL);
        net_free(cl.n);
        net_free(s.n);
}

/* Two nodes with nothing to say keep their link: each heartbeats before
 * the other's idle timeout (300 ms here) runs out. */
Test(netlink, a_quiet_link_is_kept_by_heartbeats) {
        Identity a, b;
        identity_generate(&a);
        identity_generate(&b);
        NetConfig c;
        net_config_defaults(&c);
        c.identity = &a;
        c.secret = secret;
        c.idle_timeout_ms = 300;
        NetConfig c2 = c;
        c2.identity = &b;
        Srv s = {}, cl = {};
        cr_assert_eq(net_new(&c, &srv_cb, &s, &s.n), 0);
        cr_assert_eq(net_new(&c2, &srv_cb, &cl, &cl.n), 0);
        uint16_t port;
        uint32_t peer;
        cr_assert_eq(net_listen(s.n, "127.0.0.1", 0, &port), 0);
        cr_assert_eq(net_connect(cl.n, "127.0.0.1", port, &peer), 0);
        for (int i = 0; i < 1000 && !(s.connected && cl.connected); i++) {
                net_run(s.n, 2);
                net_run(cl.n, 2);
        }
        cr_assert(s.connected && cl.connected);
        /* ten idle timeouts and more, both sides served */
        for (int i = 0; i < 3000; i++) {
                net_run(s.n, 1);
                net_run(cl.n, 1);
        }
        NetStats st;
        net_get_stats(s.n, &st);
        cr_assert_eq(s.closed + cl.closed, 0, "the quiet link was dropped (reason %d/%d)", s.reason, cl.reason);
        cr_assert_gt(st.frames_received, 1, "no heartbeat came");
        net_free(cl.n);
        net_free(s.n);
}

/* ---- links of several lanes, driven by hand ------------------------------------ */

/* A protected frame from the raw client. */
static void raw_sealed(Raw *r, FrameHeader h, const uint8_t *p) {
        uint8_t hdr[FRAME_HEADER_SIZE], body[256], tag[16];
        cr_assert_leq(h.length, sizeof body);
        memcpy(body, p, h.length);
        seal_frame(&r->seal, &h, hdr, body, h.length, tag);
        raw_write(r, hdr, sizeof hdr);
        raw_write(r, body, h.length);
        raw_write(r, tag, seal_tag_size(&r->seal));
}

/* The raw client's handshake with lane bits in its HELLO. */
static int raw_lane_handshake(Srv *s, Raw *r, uint16_t port, uint32_t bits) {
        HandshakeConfig hc = { .identity = &client_id, .secret = secret, .ciphers = cipher_available() | bits };
        raw_connect(r, port);
        return raw_handshake(s, r, &hc);
}

/* Serve until the raw connection is closed by the server. */
static bool raw_dropped(Srv *s, Raw *r) {
        uint8_t buf[256];
        for (int i = 0; i < 3000; i++) {
                net_run(s->n, 2);
                struct pollfd pfd = { r->fd, POLLIN, 0 };
                if (poll(&pfd, 1, 0) > 0 && recv(r->fd, buf, sizeof buf, 0) <= 0)
                        return true;
        }
        return false;
}

/* lane_refused() came once more, for e's connection, with reason. */
static void assert_lane_refused(Srv *s, const Raw *e, int refused, int reason) {
        char want[64];
        for (int i = 0; i < 100 && s->lanes_refused < refused; i++)
                net_run(s->n, 2);
        cr_assert_eq(s->lanes_refused, refused, "lane_refused() %d times, not %d", s->lanes_refused, refused);
        cr_assert_eq(s->lane_reason, reason, "%d, not %d", s->lane_reason, reason);
        snprintf(want, sizeof want, "127.0.0.1:%u", e->local_port);
        cr_assert_str_eq(s->lane.address, want);
        cr_assert(s->lane.key_known && memcmp(s->lane.key, client_id.pk, IDENTITY_PK_SIZE) == 0,
                  "not the key the lane proved");
}

/* Another lane that names no link, speaks before it says which, or says
 * nothing, is dropped without the application hearing of it as a link:
 * lane_refused() tells it once a lane, whose key, where from and why (it
 * was told nothing); a link announced with more lanes than come is never
 * announced and times out. */
Test(netlink, lanes_that_do_not_join) {
        Srv s;
        Raw r, e;
        uint16_t port = srv_start(&s, NET_BACKEND_URING, false, 0);
        uint8_t lane[HANDSHAKE_NONCE_SIZE + 1] = { 1, 2, 3 };
        lane[HANDSHAKE_NONCE_SIZE] = 1;
        cr_assert_eq(raw_lane_handshake(&s, &e, port, HANDSHAKE_LANE_EXTRA), 0);
        raw_sealed(&e, (FrameHeader){ .type = FRAME_LANE, .length = sizeof lane }, lane);
        cr_assert(raw_dropped(&s, &e), "a lane of no link was kept");
        assert_lane_refused(&s, &e, 1, -ENOLINK);
        raw_close(&e);
        cr_assert_eq(raw_lane_handshake(&s, &e, port, HANDSHAKE_LANE_EXTRA), 0);
        raw_sealed(&e, (FrameHeader){ .type = FRAME_CONTROL, .length = 4 }, (const uint8_t *)"RVPZ");
        cr_assert(raw_dropped(&s, &e), "a lane that did not say which link was kept");
        assert_lane_refused(&s, &e, 2, -EBADMSG);
        raw_close(&e);
        cr_assert_eq(raw_lane_handshake(&s, &e, port, HANDSHAKE_LANE_EXTRA), 0);
        cr_assert(raw_dropped(&s, &e), "a lane that said nothing was kept past the handshake timeout");
        assert_lane_refused(&s, &e, 3, -ETIMEDOUT);
        cr_assert_eq(s.lane.timeout, NET_TIMEOUT_HANDSHAKE);
        raw_close(&e);
        cr_assert_eq(s.connected, 0);
        cr_assert_eq(s.closed, 0, "the application heard of a lane");

        cr_assert_eq(raw_lane_handshake(&s, &r, port, 1u << HANDSHAKE_LANES_SHIFT), 0);
        cr_assert(raw_dropped(&s, &r), "a link waiting for its lane was kept past the handshake timeout");
        for (int i = 0; i < 100 && !s.closed; i++)
                net_run(s.n, 2);
        cr_assert_eq(s.connected, 0);
        cr_assert_eq(s.closed, 1);
        cr_assert_eq(s.reason, -ETIMEDOUT);
        cr_assert_eq(s.lanes_refused, 3, "a first lane was told as another");
        raw_close(&r);
        net_free(s.n);
}

/* A link of two lanes joined by hand is announced once; then an ACK for
 * more than was sent, a CONTROL numbered outside the window, a CONTROL on
 * another lane than the first, a tensor's chunk sent on both lanes, one
 * off the chunk grid and one of the wrong length each drop the link (both
 * lanes, one closed()); on a link of one lane, a numbered CONTROL does. */
static void lanes_joined(Srv *s, Raw *r, Raw *e, uint16_t port) {
        cr_assert_eq(raw_lane_handshake(s, r, port, 1u << HANDSHAKE_LANES_SHIFT), 0);
        uint8_t lane[HANDSHAKE_NONCE_SIZE + 1];
        memcpy(lane, r->hs.hello + 4 + 32, HANDSHAKE_NONCE_SIZE);
        lane[HANDSHAKE_NONCE_SIZE] = 1;
        cr_assert_eq(raw_lane_handshake(s, e, port, HANDSHAKE_LANE_EXTRA), 0);
        raw_sealed(e, (FrameHeader){ .type = FRAME_LANE, .length = sizeof lane }, lane);
        for (int i = 0; i < 500 && !s->connected; i++)
                net_run(s->n, 2);
        cr_assert_eq(s->connected, 1);
}

/* A TENSOR frame on a lane (item 0: 64 bytes of u8 in chunks of 16), then a
 * DATA frame at offset and of length len. */
static void raw_chunk(Raw *r, uint64_t offset, uint32_t len) {
        TensorDesc d = { .dtype = DTYPE_U8, .ndim = 1, .dims = { 64 }, .bytes = 64 };
        uint8_t desc[TENSOR_DESC_MAX_SIZE + 4], zeros[64] = {};
        size_t n = tensor_desc_encode(&d, desc);
        put_le32(desc + n, 16);
        raw_sealed(r, (FrameHeader){ .type = FRAME_TENSOR, .length = (uint32_t)n + 4 }, desc);
        raw_sealed(r, (FrameHeader){ .type = FRAME_DATA, .offset = offset, .length = len }, zeros);
}

/* A BYE on one lane ends that lane only: a tensor striped onto the other
 * lane before it still arrives, and the link closes (reason 0, one
 * closed()) once that lane says BYE too. On a lossy link the second lane's
 * part may well come after the first lane's BYE. */
static void lanes_bye(NetBackendKind kind) {
        Srv s;
        Raw r, e;
        uint8_t desc[TENSOR_DESC_MAX_SIZE + 4], zeros[16] = {};
        uint16_t port = srv_start(&s, kind, false, 0);
        lanes_joined(&s, &r, &e, port);
        raw_sealed(&r, (FrameHeader){ .type = FRAME_BYE }, zeros);
        for (int i = 0; i < 50; i++)
                net_run(s.n, 2);
        cr_assert_eq(s.closed, 0, "a BYE on one lane closed the link before the other lane's part came");
        TensorDesc d = { .dtype = DTYPE_U8, .ndim = 1, .dims = { 32 }, .bytes = 32 };
        size_t n = tensor_desc_encode(&d, desc);
        put_le32(desc + n, 16);
        raw_sealed(&e, (FrameHeader){ .type = FRAME_TENSOR, .length = (uint32_t)n + 4 }, desc);
        raw_sealed(&e, (FrameHeader){ .type = FRAME_DATA, .offset = 0, .length = 16 }, zeros);
        raw_sealed(&e, (FrameHeader){ .type = FRAME_DATA, .flags = FRAME_FLAG_LAST, .offset = 16, .length = 16 },
                   zeros);
        raw_sealed(&e, (FrameHeader){ .type = FRAME_BYE }, zeros);
        for (int i = 0; i < 500 && !s.closed; i++)
                net_run(s.n, 2);
        cr_assert_eq(s.tensors, 1, "the other lane's tensor was lost");
        cr_assert_eq(s.closed, 1);
        cr_assert_eq(s.tensors_at_close, 1, "closed() came before the tensor");
        cr_assert_eq(s.reason, 0, "%d", s.reason);
        raw_close(&r);
        raw_close(&e);
        net_free(s.n);
}
Test(netlink, a_lane_ends_with_its_own_bye_epoll) { lanes_bye(NET_BACKEND_EPOLL); }
Test(netlink, a_lane_ends_with_its_own_bye_uring) { lanes_bye(NET_BACKEND_URING); }

Test(netlink, lanes_broken_rules) {
        uint8_t ack[8] = { 5 };
        for (int k = 0; k < 6; k++) {
                Srv s;
                Raw r, e;
                uint16_t port = srv_start(&s, NET_BACKEND_EPOLL, false, 0);
                lanes_joined(&s, &r, &e, port);
                if (k == 0)
                        raw_sealed(&r, (FrameHeader){ .type = FRAME_ACK, .length = 8 }, ack);
                else if (k == 1)
                        raw_sealed(&r, (FrameHeader){ .type = FRAME_CONTROL, .offset = 64, .length = 4 },
                                   (const uint8_t *)"RVPZ");
                else if (k == 2)
                        raw_sealed(&e, (FrameHeader){ .type = FRAME_CONTROL, .length = 4 }, (const uint8_t *)"RVPZ");
                else if (k == 3) { /* one chunk on both lanes */
                        raw_chunk(&r, 16, 16);
                        raw_chunk(&e, 16, 16);
                } else
                        raw_chunk(&r, k == 4 ? 8 : 48, k == 4 ? 16 : 15); /* off the grid; short */
                cr_assert(raw_dropped(&s, &r), "case %d: the link was kept", k);
                cr_assert(raw_dropped(&s, &e), "case %d: the other lane was kept", k);
                for (int i = 0; i < 100 && !s.closed; i++)
                        net_run(s.n, 2);
                cr_assert_eq(s.closed, 1, "case %d", k);
                cr_assert_eq(s.reason, -EBADMSG, "case %d: %d", k, s.reason);
                cr_assert_eq(s.lanes_refused, 0, "case %d: a lane that had joined was told as refused", k);
                raw_close(&r);
                raw_close(&e);
                net_free(s.n);
        }
        Srv s;
        Raw r;
        uint16_t port = srv_start(&s, NET_BACKEND_EPOLL, false, 0);
        HandshakeConfig hc = { .identity = &client_id, .secret = secret, .ciphers = cipher_available() };
        raw_connect(&r, port);
        cr_assert_eq(raw_handshake(&s, &r, &hc), 0);
        raw_sealed(&r, (FrameHeader){ .type = FRAME_CONTROL, .offset = 1, .length = 4 }, (const uint8_t *)"RVPZ");
        cr_assert(raw_dropped(&s, &r));
        raw_close(&r);
        net_free(s.n);
}

/* Serve for ms milliseconds. */
static void srv_serve(Srv *s, int ms) {
        for (int i = 0; i < ms / 2; i++)
                net_run(s->n, 2);
}

/* A link of two lanes trickling a 2 MiB tensor in, chunks of two bytes now
 * and then (within the stall timeout of 300 ms), gives way once a plain
 * link's tensor needs the room under max_receive (3 MiB): both lanes are
 * dropped, reason -ETIMEDOUT, the slow deadline; the other tensor is taken. */
Test(netlink, a_trickling_link_of_lanes_gives_way) {
        Srv s;
        Raw r, e, fast;
        srv_max_receive = 3u << 20;
        uint16_t port = srv_start(&s, NET_BACKEND_URING, false, 0);
        srv_max_receive = 0;
        lanes_joined(&s, &r, &e, port);

        TensorDesc d = { .dtype = DTYPE_U8, .ndim = 1, .dims = { 2u << 20 }, .bytes = 2u << 20 };
        uint8_t desc[TENSOR_DESC_MAX_SIZE + 4], bytes[2] = { 1, 2 };
        size_t n = tensor_desc_encode(&d, desc);
        put_le32(desc + n, 2); /* chunks of two bytes (a chunk map of 2^20 bits, the most) */
        raw_sealed(&r, (FrameHeader){ .type = FRAME_TENSOR, .length = (uint32_t)n + 4 }, desc);
        for (uint64_t at = 0; at < 5; at++) {
                raw_sealed(&r, (FrameHeader){ .type = FRAME_DATA, .offset = 2 * at, .length = 2 }, bytes);
                srv_serve(&s, 150);
        }
        cr_assert_eq(s.closed, 0, "a tensor still growing was dropped before anyone needed the room");

        HandshakeConfig hc = { .identity = &client_id, .secret = secret, .ciphers = cipher_available() };
        raw_connect(&fast, port);
        cr_assert_eq(raw_handshake(&s, &fast, &hc), 0);
        n = tensor_desc_encode(&d, desc);
        raw_sealed(&fast, (FrameHeader){ .type = FRAME_TENSOR, .length = (uint32_t)n }, desc);
        cr_assert(raw_dropped(&s, &r), "the trickling link kept the room");
        cr_assert(raw_dropped(&s, &e), "its other lane was kept");
        cr_assert_eq(s.closed, 1);
        cr_assert_eq(s.reason, -ETIMEDOUT);
        cr_assert_eq(s.info.timeout, NET_TIMEOUT_SLOW);
        srv_serve(&s, 100);
        struct pollfd pfd = { fast.fd, POLLIN, 0 };
        cr_assert_eq(poll(&pfd, 1, 0), 0, "the tensor that needed the room was refused");
        raw_close(&r);
        raw_close(&e);
        raw_close(&fast);
        net_free(s.n);
}

/* A peer that does not answer (its SYNs dropped; here a listener whose
 * queue is full) holds the caller no time: net_connect() returns at once,
 * and the link is closed after the handshake timeout, -ETIMEDOUT, never
 * reached. (It blocked the caller, a node's training thread, that long at
 * each dial: a coordinator gone silent slowed its members to a crawl.) A
 * closed port is a refusal, at once or from the loop. */
Test(netlink, a_peer_that_does_not_answer_does_not_hold_the_caller) {
        Srv s;
        srv_start(&s, NET_BACKEND_URING, false, 0);
        int lst = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), fill[3];
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;
        cr_assert_eq(bind(lst, (struct sockaddr *)&sa, sizeof sa), 0);
        cr_assert_eq(listen(lst, 0), 0);
        cr_assert_eq(getsockname(lst, (struct sockaddr *)&sa, &len), 0);
        for (int i = 0; i < 3; i++) { /* the accept queue full: later SYNs are dropped */
                fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                (void)connect(fill[i], (struct sockaddr *)&sa, sizeof sa);
        }
        usleep(50000);
        uint32_t peer;
        cr_assert_eq(net_connect(s.n, "127.0.0.1", ntohs(sa.sin_port), &peer), 0, "the dial waited for the peer");
        for (int i = 0; i < 1000 && !s.closed; i++)
                net_run(s.n, 2);
        cr_assert_eq(s.closed, 1);
        cr_assert_eq(s.reason, -ETIMEDOUT, "%d", s.reason);
        cr_assert(!s.info.reached && !s.info.open);
        for (int i = 0; i < 3; i++)
                close(fill[i]);
        close(lst);

        /* a port nobody listens on */
        s.closed = 0;
        int r = net_connect(s.n, "127.0.0.1", ntohs(sa.sin_port), &peer);
        for (int i = 0; i < 200 && r == 0 && !s.closed; i++)
                net_run(s.n, 2);
        cr_assert(r == -ECONNREFUSED || (s.closed == 1 && s.reason == -ECONNREFUSED && !s.info.reached),
                  "%d %d %d", r, s.closed, s.reason);
        net_free(s.n);
}

/* Strangers that keep every handshake slot from other addresses (a quarter
 * of max_links: 4 here, one each from 127.0.0.2-5) cannot keep a real peer
 * out: its connection displaces the oldest of them, from the address with
 * the most, and its handshake goes through. (A real peer was refused for
 * as long as they kept the slots.) */
Test(netlink, strangers_holding_every_handshake_slot_do_not_keep_a_peer_out) {
        NetConfig c;
        Srv s;
        identity_generate(&server_id);
        identity_generate(&client_id);
        net_config_defaults(&c);
        c.identity = &server_id;
        c.secret = secret;
        c.max_links = 16;
        memset(&s, 0, sizeof s);
        cr_assert_eq(net_new(&c, &srv_cb, &s, &s.n), 0);
        uint16_t port;
        cr_assert_eq(net_listen(s.n, "127.0.0.1", 0, &port), 0);

        int strangers[4];
        for (int i = 0; i < 4; i++) {
                strangers[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                struct sockaddr_in from = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002 + (uint32_t)i) };
                struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port),
                                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
                cr_assert_eq(bind(strangers[i], (struct sockaddr *)&from, sizeof from), 0);
                cr_assert_eq(connect(strangers[i], (struct sockaddr *)&to, sizeof to), 0);
                for (int k = 0; k < 50; k++) /* accepted one by one: each has its own age */
                        net_run(s.n, 2);
        }
        NetStats st;
        net_get_stats(s.n, &st);
        cr_assert_eq(st.links_accepted, 4);

        Raw r;
        HandshakeConfig hc = { .identity = &client_id, .secret = secret, .ciphers = cipher_available() };
        raw_connect(&r, port);
        cr_assert_eq(raw_handshake(&s, &r, &hc), 0, "the peer was kept out");
        for (int i = 0; i < 1000 && !s.connected; i++)
                net_run(s.n, 2);
        cr_assert_eq(s.connected, 1);
        /* the oldest stranger is the one gone */
        char b;
        struct pollfd pfd = { strangers[0], POLLIN, 0 };
        cr_assert(poll(&pfd, 1, 1000) == 1 && recv(strangers[0], &b, 1, 0) <= 0, "the oldest stranger stayed");
        for (int i = 1; i < 4; i++) {
                pfd.fd = strangers[i];
                cr_assert_eq(poll(&pfd, 1, 0), 0, "stranger %d was dropped too", i);
        }
        for (int i = 0; i < 4; i++)
                close(strangers[i]);
        raw_close(&r);
        net_free(s.n);
}
