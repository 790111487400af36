/* The relay (net/relay.h) between two Nets in this process: a link through
 * it carries tensors both ways bit for bit, with the ends' own handshake
 * and AEAD; everything a client of the relay may get wrong is refused
 * without harm to the links it relays: a bad signature, a target nobody
 * waits for, a full relay, bytes before a link is joined, a silent
 * preamble, junk; and strangers (who need no secret to WAIT and CONNECT
 * at a relay without one) cannot keep real nodes out, by waiting, by
 * links joined to themselves or that carry nothing, or from one address.
 * A relay with the network secret refuses at once every request not
 * proven with it (strangers, another network's nodes), proves the links
 * of its network's nodes from their handshake's MACs (net/relay-proof.h),
 * and closes every other: junk, silence past the deadline, a recorded
 * handshake sent again; a proven link never gives way. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/handshake.h"
#include "net/net.h"
#include "net/relay-proof.h"
#include "net/relay.h"

static const uint8_t secret[32] = "relay unit test secret.........";
static const uint8_t other_secret[32] = "another network's secret.......";

typedef struct Side {
        Net *n;
        Identity id;
        uint32_t peer;
        int connected, closed, got;
        int reason; /* the last closed()'s */
        NetTensor *t;
} Side;

static void on_conn(void *ud, uint32_t peer, const uint8_t id[32]) {
        Side *s = ud;
        s->connected++;
        s->peer = peer;
}
static void on_tensor(void *ud, NetTensor *t) {
        Side *s = ud;
        s->got++;
        if (s->t)
                net_tensor_release(s->n, s->t);
        s->t = t;
}
static void on_closed(void *ud, uint32_t peer, int r, const uint8_t id[32]) {
        ((Side *)ud)->closed++;
        ((Side *)ud)->reason = r;
}
static const NetCallbacks cbs = { .connected = on_conn, .tensor = on_tensor, .closed = on_closed };

static Relay *relay;
static uint16_t port;

#define PREAMBLE_MS 500
/* A relay with the network secret: the deadline for a link to be proven
 * too, ample for two Nets' handshake on a busy machine. */
#define PROOF_MS 1000

/* The network secret raw clients prove they hold (relay_member_proof()):
 * the relay's, or none with a relay that has none. */
static const uint8_t *raw_secret;

static void relay_up_with(unsigned max_links, unsigned per_addr, const uint8_t *sec, unsigned preamble_ms) {
        raw_secret = sec;
        cr_assert_eq(relay_new(&(RelayConfig){ .host = "127.0.0.1", .max_links = max_links,
                                               .max_links_per_addr = per_addr, .preamble_timeout_ms = preamble_ms,
                                               .secret = sec },
                               &relay),
                     0);
        port = relay_port(relay);
}

static void relay_up_per_addr(unsigned max_links, unsigned per_addr) {
        relay_up_with(max_links, per_addr, NULL, PREAMBLE_MS);
}

/* A relay that holds the network secret of the sides. */
static void relay_up_secret(unsigned max_links) {
        relay_up_with(max_links, 0, secret, PROOF_MS);
}

static void relay_up(unsigned max_links) {
        relay_up_per_addr(max_links, 0);
}

static void side_new_of(Side *s, bool wait, const uint8_t *sec) {
        NetConfig c;
        memset(s, 0, sizeof *s);
        identity_generate(&s->id);
        net_config_defaults(&c);
        c.identity = &s->id;
        c.secret = sec;
        c.relay_host = "127.0.0.1";
        c.relay_port = port;
        c.relay_wait = wait;
        c.relay_channel = NET_RELAY_PIPELINE;
        cr_assert_eq(net_new(&c, &cbs, s, &s->n), 0);
}

static void side_new(Side *s, bool wait) {
        side_new_of(s, wait, secret);
}

static void pump(Side *a, Side *b, int ms) {
        net_run(a->n, ms);
        net_run(b->n, ms);
}

/* The sockets of this process on either end of a connection to the relay,
 * and how many of them probe with TCP keepalive. */
static void relay_sockets(unsigned *ret_all, unsigned *ret_keepalive) {
        *ret_all = *ret_keepalive = 0;
        for (int fd = 3; fd < 1024; fd++) {
                struct sockaddr_in me, peer;
                socklen_t a = sizeof me, b = sizeof peer;
                int on = 0;
                socklen_t l = sizeof on;
                if (getsockname(fd, (struct sockaddr *)&me, &a) < 0 || getpeername(fd, (struct sockaddr *)&peer, &b) < 0 ||
                    me.sin_family != AF_INET || (ntohs(me.sin_port) != port && ntohs(peer.sin_port) != port))
                        continue;
                (*ret_all)++;
                *ret_keepalive += getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &l) == 0 && on;
        }
}

/* b waits at the relay, a asks for it there. */
static void link_up(Side *a, Side *b) {
        side_new(b, true);
        side_new(a, false);
        RelayStats st = {};
        for (int i = 0; i < 200 && st.waiting == 0; i++) {
                pump(a, b, 5);
                relay_get_stats(relay, &st);
        }
        cr_assert_eq(st.waiting, 1, "b is not waiting at the relay");
        uint32_t p;
        cr_assert_eq(net_connect_relayed(a->n, b->id.pk, &p), 0);
        for (int i = 0; i < 400 && !(a->connected && b->connected); i++)
                pump(a, b, 5);
        cr_assert(a->connected && b->connected, "no link through the relay (closed %d/%d)", a->closed, b->closed);
}

/* link_up(), and this process has no connection to the relay but theirs. */
static void link_through_relay(Side *a, Side *b) {
        link_up(a, b);
        /* b's next waiting connection and every connection the relay holds
         * probe with keepalive: one whose other end vanished without a word
         * (the relay restarted, a NAT mapping changed) ends, and b waits
         * again (it waited for ever on a dead connection) */
        unsigned all = 0, alive = 0;
        for (int i = 0; i < 200 && all < 5; i++) {
                pump(a, b, 5);
                relay_sockets(&all, &alive);
        }
        cr_assert(all >= 4 && alive == all - 1, "%u of %u relay connections probe with keepalive", alive, all);
}

static void send_and_check(Side *from, Side *to, size_t n, uint8_t salt) {
        uint8_t *buf = malloc(n);
        for (size_t i = 0; i < n; i++)
                buf[i] = (uint8_t)(i * 31 + salt);
        TensorDesc d;
        tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ (uint32_t)n });
        int before = to->got;
        cr_assert_eq(net_send_tensor(from->n, from->peer, 3, &d, buf, 1), 0);
        for (int i = 0; i < 4000 && to->got == before; i++)
                pump(from, to, 1);
        cr_assert_eq(to->got, before + 1, "%zu bytes did not come through", n);
        cr_assert(memcmp(to->t->data, buf, n) == 0, "%zu bytes differ", n);
        free(buf);
}

static void sides_free(Side *a, Side *b) {
        if (a->t)
                net_tensor_release(a->n, a->t);
        if (b->t)
                net_tensor_release(b->n, b->t);
        net_free(a->n);
        net_free(b->n);
}

Test(relay, a_link_through_it_carries_tensors_both_ways) {
        Side a, b;
        relay_up(4);
        link_through_relay(&a, &b);
        cr_assert_eq(net_peer_cipher(a.n, a.peer), net_peer_cipher(b.n, b.peer));
        cr_assert_neq(net_peer_cipher(a.n, a.peer), CIPHER_NONE, "a relayed link must be encrypted");
        send_and_check(&a, &b, 5u << 20, 1);
        send_and_check(&b, &a, (3u << 20) + 7, 2);
        send_and_check(&a, &b, 1, 3);
        RelayStats st;
        relay_get_stats(relay, &st);
        cr_assert_eq(st.links, 1);
        cr_assert_geq(st.bytes, (8u << 20), "the relay copied %llu bytes", (unsigned long long)st.bytes);
        /* b waits again for the next link, on its own */
        for (int i = 0; i < 400 && st.waiting == 0; i++) {
                pump(&a, &b, 5);
                relay_get_stats(relay, &st);
        }
        cr_assert_eq(st.waiting, 1, "b did not wait again");
        sides_free(&a, &b);
        for (int i = 0; i < 100 && st.links; i++) {
                usleep(10000);
                relay_get_stats(relay, &st);
        }
        cr_assert_eq(st.links, 0, "the link outlived its ends");
        relay = relay_free(relay);
}

/* A raw client of the relay from 127.0.0.<host>: connect, read the hello. */
static int raw_from(uint8_t host, uint8_t challenge[RELAY_CHALLENGE_SIZE]) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in from = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | host) };
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        cr_assert_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
        cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        struct timeval tv = { .tv_sec = 3 };
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        uint8_t hello[RELAY_HELLO_SIZE];
        cr_assert_eq(read(fd, hello, sizeof hello), (ssize_t)sizeof hello);
        cr_assert(memcmp(hello, RELAY_MAGIC, RELAY_MAGIC_SIZE) == 0);
        if (challenge)
                memcpy(challenge, hello + RELAY_MAGIC_SIZE, RELAY_CHALLENGE_SIZE);
        return fd;
}

static int raw(uint8_t challenge[RELAY_CHALLENGE_SIZE]) {
        return raw_from(1, challenge);
}

/* The status byte, or -1 if the relay closed without one. */
static int answer(int fd) {
        uint8_t s;
        return read(fd, &s, 1) == 1 ? s : -1;
}

/* A byte goes each way through a raw link (waiter, asker): it is in use. */
static void raw_carries(const int fds[2]) {
        uint8_t b;
        cr_assert_eq(write(fds[1], "i", 1), 1);
        cr_assert_eq(read(fds[0], &b, 1), 1, "the link carries nothing to its waiter");
        cr_assert_eq(b, 'i');
        cr_assert_eq(write(fds[0], "r", 1), 1);
        cr_assert_eq(read(fds[1], &b, 1), 1, "the link carries nothing to its asker");
        cr_assert_eq(b, 'r');
}

/* A request's proof, made with raw_secret; zeros without one. */
static void raw_prove(const uint8_t ch[RELAY_CHALLENGE_SIZE], uint8_t req[RELAY_REQUEST_SIZE]) {
        if (raw_secret)
                relay_member_proof(raw_secret, ch, req, req + RELAY_SIGNED_SIZE);
}

/* From 127.0.0.<host>, a WAIT for id on the pipeline's channel; the
 * connection, its answer in *ret_status. */
static int raw_wait(uint8_t host, const Identity *id, int *ret_status) {
        uint8_t ch[RELAY_CHALLENGE_SIZE], req[RELAY_REQUEST_SIZE] = { RELAY_OP_WAIT, NET_RELAY_PIPELINE },
                msg[RELAY_WAIT_MESSAGE_SIZE];
        int fd = raw_from(host, ch);
        memcpy(req + 2, id->pk, 32);
        relay_wait_message(ch, NET_RELAY_PIPELINE, msg);
        crypto_sign_detached(req + 34, NULL, msg, sizeof msg, id->sk);
        raw_prove(ch, req);
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        *ret_status = answer(fd);
        return fd;
}

/* From 127.0.0.<host>, a CONNECT to key on the pipeline's channel. */
static int raw_connect(uint8_t host, const uint8_t key[32], int *ret_status) {
        uint8_t ch[RELAY_CHALLENGE_SIZE], req[RELAY_REQUEST_SIZE] = { RELAY_OP_CONNECT, NET_RELAY_PIPELINE };
        int fd = raw_from(host, ch);
        memcpy(req + 2, key, 32);
        raw_prove(ch, req);
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        *ret_status = answer(fd);
        return fd;
}

/* A link joined by raw clients, waiting from 127.0.0.<wait_host> and
 * asking from 127.0.0.<ask_host>; with use, a byte has gone each way. */
static void raw_link(uint8_t wait_host, uint8_t ask_host, bool use, int ret_fds[2]) {
        Identity id;
        int st;
        identity_generate(&id);
        ret_fds[0] = raw_wait(wait_host, &id, &st);
        cr_assert_eq(st, RELAY_OK, "the WAIT from 127.0.0.%u was answered %d", wait_host, st);
        ret_fds[1] = raw_connect(ask_host, id.pk, &st);
        cr_assert_eq(st, RELAY_OK, "the CONNECT from 127.0.0.%u was answered %d", ask_host, st);
        if (use)
                raw_carries(ret_fds);
}

/* The relay closed the connection (an end of file, or a reset when bytes
 * it did not read were left behind); not a timeout. */
static bool closed_by_relay(int fd) {
        uint8_t b;
        ssize_t k = read(fd, &b, 1);
        return k == 0 || (k < 0 && errno == ECONNRESET);
}

Test(relay, bad_clients_are_refused) {
        Identity id, other;
        uint8_t ch[RELAY_CHALLENGE_SIZE], req[RELAY_REQUEST_SIZE], msg[RELAY_WAIT_MESSAGE_SIZE];
        identity_generate(&id);
        identity_generate(&other);
        signal(SIGPIPE, SIG_IGN); /* the relay closes on a bad client: its writes then fail, as they should */
        relay_up(1);

        /* a WAIT signed by another key */
        int fd = raw(ch);
        memset(req, 0, sizeof req);
        req[0] = RELAY_OP_WAIT;
        req[1] = NET_RELAY_PIPELINE;
        memcpy(req + 2, id.pk, 32);
        relay_wait_message(ch, NET_RELAY_PIPELINE, msg);
        crypto_sign_detached(req + 34, NULL, msg, sizeof msg, other.sk);
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        cr_assert_eq(answer(fd), RELAY_BAD_REQUEST);
        close(fd);

        /* the right signature, but for another channel than the one asked */
        fd = raw(ch);
        relay_wait_message(ch, NET_RELAY_AVERAGING, msg);
        crypto_sign_detached(req + 34, NULL, msg, sizeof msg, id.sk);
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        cr_assert_eq(answer(fd), RELAY_BAD_REQUEST);
        close(fd);

        /* an unknown operation; junk */
        fd = raw(NULL);
        req[0] = 9;
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        cr_assert_eq(answer(fd), RELAY_BAD_REQUEST);
        close(fd);

        /* CONNECT to a key nobody waits with */
        fd = raw(NULL);
        req[0] = RELAY_OP_CONNECT;
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        cr_assert_eq(answer(fd), RELAY_NO_TARGET);
        close(fd);

        /* a preamble that never finishes is closed after its deadline */
        fd = raw(NULL);
        cr_assert_eq(write(fd, req, 10), 10);
        cr_assert(closed_by_relay(fd), "a silent client kept its place");
        close(fd);

        /* a waiter that talks before it is joined is closed */
        fd = raw(ch);
        req[0] = RELAY_OP_WAIT;
        relay_wait_message(ch, NET_RELAY_PIPELINE, msg);
        crypto_sign_detached(req + 34, NULL, msg, sizeof msg, id.sk);
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        cr_assert_eq(answer(fd), RELAY_OK);
        cr_assert_eq(write(fd, "x", 1), 1);
        cr_assert(closed_by_relay(fd), "a waiter sent bytes before it was joined and stayed");
        close(fd);

        /* full: one relayed link at most, in use between two addresses; a
         * second CONNECT is refused */
        int in_use[2];
        raw_link(4, 5, true, in_use);
        Side b, c;
        side_new(&b, true);
        side_new(&c, false);
        RelayStats st = {};
        for (int i = 0; i < 400 && !st.waiting; i++) {
                net_run(b.n, 5);
                relay_get_stats(relay, &st);
        }
        cr_assert_eq(st.waiting, 1, "b is not waiting at the relay");
        uint32_t p;
        cr_assert_eq(net_connect_relayed(c.n, b.id.pk, &p), 0, "the request waited for the relay's answer");
        for (int i = 0; i < 400 && !c.closed; i++)
                net_run(c.n, 5);
        cr_assert_eq(c.reason, -EBUSY, "%d", c.reason);
        /* the relayed link was not disturbed by any of it */
        raw_carries(in_use);
        relay_get_stats(relay, &st);
        cr_assert_eq(st.refused, 5, "refused %llu requests", (unsigned long long)st.refused);
        cr_assert_eq(st.refused_full, 1);
        cr_assert_eq(st.displaced, 0);
        net_free(b.n);
        net_free(c.n);
        close(in_use[0]);
        close(in_use[1]);
        relay = relay_free(relay);
}

/* Strangers need no secret to WAIT (a throwaway key signs it): from two
 * addresses they hold every place a relay of 2 links has for waiters and
 * askers (8), and a real node still waits and is linked to, displacing the
 * oldest stranger of the address with the most. (The relay refused every
 * connection for as long as the strangers stayed.) */
Test(relay, strangers_holding_every_place_do_not_shut_it) {
        uint8_t ch[RELAY_CHALLENGE_SIZE], req[RELAY_REQUEST_SIZE] = {}, msg[RELAY_WAIT_MESSAGE_SIZE];
        int strangers[8];
        signal(SIGPIPE, SIG_IGN);
        relay_up(2);
        for (int i = 0; i < 8; i++) {
                Identity throwaway;
                identity_generate(&throwaway);
                strangers[i] = raw_from((uint8_t)(2 + i % 2), ch);
                req[0] = RELAY_OP_WAIT;
                req[1] = NET_RELAY_PIPELINE;
                memcpy(req + 2, throwaway.pk, 32);
                relay_wait_message(ch, NET_RELAY_PIPELINE, msg);
                crypto_sign_detached(req + 34, NULL, msg, sizeof msg, throwaway.sk);
                cr_assert_eq(write(strangers[i], req, sizeof req), (ssize_t)sizeof req);
                cr_assert_eq(answer(strangers[i]), RELAY_OK, "stranger %d", i);
        }
        RelayStats st = {};
        for (int i = 0; i < 200 && st.waiting < 8; i++) { /* counted as each is answered */
                usleep(5000);
                relay_get_stats(relay, &st);
        }
        cr_assert_eq(st.waiting, 8);
        Side a, b;
        side_new(&b, true);
        side_new(&a, false);
        for (int i = 0; i < 200; i++) /* b waits, in a stranger's place */
                pump(&a, &b, 5);
        uint32_t p;
        cr_assert_eq(net_connect_relayed(a.n, b.id.pk, &p), 0, "b could not wait, or a could not ask");
        for (int i = 0; i < 400 && !(a.connected && b.connected); i++)
                pump(&a, &b, 5);
        cr_assert(a.connected && b.connected, "no link through the relay (closed %d/%d)", a.closed, b.closed);
        send_and_check(&a, &b, 1u << 16, 4);
        int gone = 0;
        for (int i = 0; i < 8; i++) {
                struct pollfd pfd = { strangers[i], POLLIN, 0 };
                gone += poll(&pfd, 1, 0) == 1;
                close(strangers[i]);
        }
        cr_assert_geq(gone, 1, "no stranger made way");
        /* an address at its half of the places: its newest connection
         * displaces its oldest, and is served */
        for (int i = 0; i < 5; i++) {
                Identity throwaway;
                identity_generate(&throwaway);
                int fd = raw_from(2, ch);
                req[0] = RELAY_OP_WAIT;
                memcpy(req + 2, throwaway.pk, 32);
                relay_wait_message(ch, NET_RELAY_PIPELINE, msg);
                crypto_sign_detached(req + 34, NULL, msg, sizeof msg, throwaway.sk);
                cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
                cr_assert_eq(answer(fd), RELAY_OK, "connection %d from an address at its half", i);
                strangers[i] = fd;
        }
        for (int i = 0; i < 5; i++)
                close(strangers[i]);
        send_and_check(&a, &b, 1u << 16, 5); /* the relayed link was not touched */
        sides_free(&a, &b);
        relay = relay_free(relay);
}

/* A listening socket where the sides look for their relay, which says
 * nothing unless the test writes it, and side a asking it for a node: the
 * request returns at once, whatever the relay does. */
static int fake_relay_asked(Side *a) {
        Identity b;
        uint32_t p;
        int lst = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;
        cr_assert(bind(lst, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lst, 4) == 0);
        cr_assert_eq(getsockname(lst, (struct sockaddr *)&sa, &len), 0);
        port = ntohs(sa.sin_port);
        identity_generate(&b);
        side_new(a, false);
        cr_assert_eq(net_connect_relayed(a->n, b.pk, &p), 0, "the request waited for the relay");
        return lst;
}

/* A relay that takes the connection and says nothing (its process
 * stopped, say) holds nobody: the request returns at once, and its link
 * closes after the handshake timeout. (The request read the relay's hello
 * on the caller's thread, a stage's training, for up to that timeout, and
 * returned -ETIMEDOUT.) */
Test(relay, a_relay_that_does_not_answer_does_not_hold_the_caller) {
        Side a;
        int lst = fake_relay_asked(&a);
        for (int i = 0; i < 4000 && !a.closed; i++)
                net_run(a.n, 5);
        cr_assert_eq(a.closed, 1);
        cr_assert_eq(a.reason, -ETIMEDOUT, "%d", a.reason);
        net_free(a.n);
        close(lst);
}

/* A relay of the first preamble version (98-byte requests, no proof) says
 * "RVRELAY1": the node closes the connection at its hello, naming why,
 * and sends it nothing. */
Test(relay, a_relay_of_another_version_is_named) {
        Side a;
        int lst = fake_relay_asked(&a);
        int fd = -1;
        for (int i = 0; i < 400 && fd < 0; i++) {
                net_run(a.n, 5);
                fd = accept4(lst, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        }
        cr_assert_geq(fd, 0, "the node did not dial its relay");
        uint8_t hello[RELAY_HELLO_SIZE] = "RVRELAY1", got;
        cr_assert_eq(write(fd, hello, sizeof hello), (ssize_t)sizeof hello);
        for (int i = 0; i < 400 && !a.closed; i++)
                net_run(a.n, 5);
        cr_assert_eq(a.closed, 1);
        cr_assert_eq(a.reason, -ENOPROTOOPT, "%d", a.reason);
        cr_assert_leq(recv(fd, &got, 1, 0), 0, "the node sent a request to a relay of another version");
        close(fd);
        net_free(a.n);
        close(lst);
}

/* A link between a real waiter and a real asker is made, whatever
 * strangers hold; then it carries a tensor. */
static void real_link_gets_through(Side *a, Side *b) {
        link_up(a, b);
        send_and_check(a, b, 1u << 16, 6);
}

/* How many of fds the relay has closed. */
static int closed_of(const int *fds, int n) {
        int gone = 0;
        for (int i = 0; i < n; i++) {
                struct pollfd pfd = { fds[i], POLLIN, 0 };
                uint8_t byte;
                gone += poll(&pfd, 1, 0) == 1 && recv(fds[i], &byte, 1, MSG_DONTWAIT) <= 0;
        }
        return gone;
}

/* Strangers with no secret WAIT with throwaway keys and CONNECT to
 * themselves, each from an address of its own (a botnet): every link of the
 * relay is theirs, and a real node asking for a real waiter displaces one
 * of them. (Joined links were never displaced: the relay answered "full"
 * to every real node for as long as the strangers stayed.) */
Test(relay, strangers_joined_to_themselves_do_not_shut_it) {
        int strangers[2][2];
        signal(SIGPIPE, SIG_IGN);
        relay_up(2);
        for (int i = 0; i < 2; i++)
                raw_link((uint8_t)(2 + i), (uint8_t)(2 + i), false, strangers[i]);
        RelayStats st = {};
        for (int i = 0; i < 200 && st.links < 2; i++) { /* counted just after the answer is sent */
                usleep(5000);
                relay_get_stats(relay, &st);
        }
        cr_assert_eq(st.links, 2);
        Side a, b;
        real_link_gets_through(&a, &b);
        cr_assert_geq(closed_of(&strangers[0][0], 4), 2, "no stranger's link made way");
        relay_get_stats(relay, &st);
        cr_assert_geq(st.displaced, 1);
        sides_free(&a, &b);
        for (int i = 0; i < 2; i++) {
                close(strangers[i][0]);
                close(strangers[i][1]);
        }
        relay = relay_free(relay);
}

/* Links between two addresses that carried nothing within the preamble
 * deadline of joining (a real asker's HELLO comes at once) give way too. */
Test(relay, strangers_links_that_carry_nothing_give_way) {
        int strangers[2][2];
        signal(SIGPIPE, SIG_IGN);
        relay_up(2);
        raw_link(2, 3, false, strangers[0]);
        raw_link(4, 5, false, strangers[1]);
        cr_assert_eq(write(strangers[1][1], "x", 1), 1); /* one way only */
        usleep(2 * PREAMBLE_MS * 1000);
        Side a, b;
        real_link_gets_through(&a, &b);
        cr_assert_geq(closed_of(&strangers[0][0], 4), 2, "no stranger's link made way");
        sides_free(&a, &b);
        for (int i = 0; i < 2; i++) {
                close(strangers[i][0]);
                close(strangers[i][1]);
        }
        relay = relay_free(relay);
}

/* One address holds at most max_links_per_addr waiting connections and
 * links: its newest waiter displaces its oldest, and once every place is
 * a link in use, it is refused; other addresses are served as before. */
Test(relay, one_address_holds_at_most_its_share) {
        int waiters[5], links[4][2], st, fd;
        Identity id;
        signal(SIGPIPE, SIG_IGN);
        relay_up_per_addr(8, 4);
        for (int i = 0; i < 5; i++) {
                identity_generate(&id);
                waiters[i] = raw_wait(9, &id, &st);
                cr_assert_eq(st, RELAY_OK, "WAIT %d from one address answered %d", i, st);
        }
        cr_assert(closed_by_relay(waiters[0]), "the address's oldest waiter kept its place");
        for (int i = 0; i < 5; i++)
                close(waiters[i]);
        RelayStats s = { .waiting = 1 };
        for (int i = 0; i < 400 && s.waiting; i++) { /* the relay sees them go */
                usleep(5000);
                relay_get_stats(relay, &s);
        }
        cr_assert_eq(s.waiting, 0);
        /* its four places are links in use, with their other ends at .10 */
        for (int i = 0; i < 4; i++)
                raw_link(9, 10, true, links[i]);
        identity_generate(&id);
        fd = raw_wait(9, &id, &st);
        cr_assert_eq(st, RELAY_FULL, "a fifth WAIT from the address answered %d", st);
        close(fd);
        int other = raw_wait(11, &id, &st);
        cr_assert_eq(st, RELAY_OK, "a WAIT from another address answered %d", st);
        fd = raw_connect(10, id.pk, &st);
        cr_assert_eq(st, RELAY_FULL, "a fifth link from .10 answered %d", st);
        close(fd);
        fd = raw_connect(12, id.pk, &st);
        cr_assert_eq(st, RELAY_OK, "a CONNECT from another address answered %d", st);
        relay_get_stats(relay, &s);
        cr_assert_eq(s.over_addr, 3, "%llu", (unsigned long long)s.over_addr);
        cr_assert_eq(s.displaced, 0);
        uint8_t dot10[16] = { [10] = 0xff, [11] = 0xff, 127, 0, 0, 10 };
        cr_assert(memcmp(s.last_over_addr, dot10, 16) == 0);
        for (int i = 0; i < 4; i++) {
                raw_carries(links[i]);
                close(links[i][0]);
                close(links[i][1]);
        }
        close(other);
        close(fd);
        relay = relay_free(relay);
}

/* ---- a relay with the network secret: links proven or closed ------------- */

static uint64_t ms_now(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static RelayStats stats_when(bool (*done)(const RelayStats *), int ms) {
        RelayStats st;
        relay_get_stats(relay, &st);
        for (int i = 0; i < ms / 5 && !done(&st); i++) {
                usleep(5000);
                relay_get_stats(relay, &st);
        }
        return st;
}

static bool one_proven(const RelayStats *st) {
        return st->proven >= 1;
}

static bool one_unproven(const RelayStats *st) {
        return st->unproven >= 1 && st->links == 0;
}

/* Two nodes of the relay's network: their link opens, carries tensors both
 * ways, and is proven; past the deadline it stays. (A relay had no way to
 * tell their link from strangers'.) */
Test(relay, a_relay_with_the_secret_proves_a_real_link) {
        Side a, b;
        relay_up_secret(4);
        link_up(&a, &b);
        send_and_check(&a, &b, 1u << 20, 7);
        send_and_check(&b, &a, (1u << 16) + 3, 8);
        RelayStats st = stats_when(one_proven, 1000);
        cr_assert_eq(st.proven, 1);
        cr_assert_eq(st.unproven, 0);
        for (uint64_t until = ms_now() + PROOF_MS + 300; ms_now() < until;)
                pump(&a, &b, 5);
        send_and_check(&a, &b, 1u << 16, 9);
        relay_get_stats(relay, &st);
        cr_assert_eq(st.links, 1);
        cr_assert_eq(st.unproven, 0);
        cr_assert_eq(a.closed + b.closed, 0);
        sides_free(&a, &b);
        relay = relay_free(relay);
}

/* Two nodes of another network (they agree with each other, not with the
 * relay): the relay refuses their requests at once and counts them, and
 * so a raw stranger's WAIT and CONNECT, whether without a proof, with one
 * made with another secret, or with a proof that was good for another
 * challenge (recorded from a real request). (Such a stranger took a place
 * and held a link for up to the deadline; one with recorded handshakes,
 * one link for each.) */
Test(relay, strangers_and_other_networks_get_no_place) {
        Side a, b;
        Identity id;
        int st_w, st_c;
        signal(SIGPIPE, SIG_IGN);
        relay_up_secret(4);
        side_new_of(&b, true, other_secret);
        side_new_of(&a, false, other_secret);
        RelayStats st = {};
        for (int i = 0; i < 400 && st.not_member == 0; i++) {
                pump(&a, &b, 5);
                relay_get_stats(relay, &st);
        }
        cr_assert_geq(st.not_member, 1, "b's WAIT was not refused");
        cr_assert_eq(st.waiting, 0, "b of another network waits at the relay");
        uint32_t p;
        cr_assert_eq(net_connect_relayed(a.n, b.id.pk, &p), 0);
        for (int i = 0; i < PROOF_MS / 20 && !a.closed && !a.connected; i++)
                pump(&a, &b, 5);
        cr_assert(!a.connected && !b.connected, "a link of another network opened through the relay");
        cr_assert_eq(a.closed, 1, "a's CONNECT was not refused");
        sides_free(&a, &b);
        usleep(300 * 1000); /* a request b sent again as it went is counted by now */
        relay_get_stats(relay, &st);
        uint64_t before = st.not_member;

        identity_generate(&id);
        raw_secret = NULL; /* zeros */
        close(raw_wait(2, &id, &st_w));
        cr_assert_eq(st_w, RELAY_NOT_MEMBER);
        raw_secret = other_secret;
        close(raw_connect(3, id.pk, &st_c));
        cr_assert_eq(st_c, RELAY_NOT_MEMBER);
        /* a real request's bytes, proof included, sent to a new challenge */
        uint8_t ch[RELAY_CHALLENGE_SIZE], req[RELAY_REQUEST_SIZE] = { RELAY_OP_WAIT, NET_RELAY_PIPELINE },
                msg[RELAY_WAIT_MESSAGE_SIZE];
        int fd = raw_from(4, ch);
        memcpy(req + 2, id.pk, 32);
        relay_wait_message(ch, NET_RELAY_PIPELINE, msg);
        crypto_sign_detached(req + 34, NULL, msg, sizeof msg, id.sk);
        relay_member_proof(secret, ch, req, req + RELAY_SIGNED_SIZE);
        int later = raw_from(4, NULL);
        cr_assert_eq(write(later, req, sizeof req), (ssize_t)sizeof req);
        cr_assert_eq(answer(later), RELAY_NOT_MEMBER, "a recorded request was taken again");
        cr_assert_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
        cr_assert_eq(answer(fd), RELAY_OK, "the request was not good for its own challenge");
        relay_get_stats(relay, &st);
        cr_assert_eq(st.not_member, before + 3);
        cr_assert_eq(st.waiting, 1);
        cr_assert_eq(st.links + st.proven + st.unproven, 0);
        close(fd);
        close(later);
        relay = relay_free(relay);
}

/* A node of the network (it proves the secret in its requests) joins a
 * link to itself and says nothing: the relay closes it at the deadline,
 * and its place serves a real pair. (A link joined to itself stayed until
 * a newcomer needed its place.) */
Test(relay, a_link_that_proves_nothing_goes_at_the_deadline) {
        int self[2];
        signal(SIGPIPE, SIG_IGN);
        relay_up_secret(1);
        raw_link(2, 2, false, self);
        uint64_t joined = ms_now();
        cr_assert(closed_by_relay(self[0]) && closed_by_relay(self[1]), "a link that proved nothing stayed");
        uint64_t took = ms_now() - joined;
        cr_assert(took + 50 >= PROOF_MS && took < 3 * PROOF_MS, "closed after %llu ms", (unsigned long long)took);
        RelayStats st = stats_when(one_unproven, 1000);
        cr_assert_eq(st.unproven, 1);
        cr_assert_eq(st.links, 0);
        Side a, b;
        real_link_gets_through(&a, &b);
        relay_get_stats(relay, &st);
        cr_assert_eq(st.proven, 1);
        cr_assert_eq(st.displaced, 0);
        sides_free(&a, &b);
        close(self[0]);
        close(self[1]);
        relay = relay_free(relay);
}

/* Clients that prove the secret, at two addresses, keep bytes flowing
 * both ways through the one link of the relay: not a handshake, so it is
 * closed at once, and a real pair takes the place. (Without the secret
 * such a link is in use between two addresses, never displaced: the pair
 * was refused "full".) */
Test(relay, links_that_carry_no_handshake_hold_no_place) {
        int fds[2];
        uint8_t junk[64];
        signal(SIGPIPE, SIG_IGN);
        memset(junk, 'x', sizeof junk);
        relay_up_secret(1);
        raw_link(2, 3, false, fds);
        cr_assert_eq(write(fds[1], junk, sizeof junk), (ssize_t)sizeof junk);
        (void)!write(fds[0], junk, sizeof junk);
        cr_assert(closed_by_relay(fds[0]) && closed_by_relay(fds[1]), "the strangers' link carried junk");
        RelayStats st = stats_when(one_unproven, 1000);
        cr_assert_eq(st.unproven, 1);
        Side a, b;
        real_link_gets_through(&a, &b);
        sides_free(&a, &b);
        close(fds[0]);
        close(fds[1]);
        relay = relay_free(relay);
}

/* A proven link is never displaced, even with both ends at one address
 * (two nodes behind one router): a newcomer finds the relay full. (Such a
 * link gave way to the first newcomer.) */
Test(relay, a_proven_link_is_not_displaced) {
        Side a, b;
        Identity id;
        int st_w, st_c;
        signal(SIGPIPE, SIG_IGN);
        relay_up_secret(1);
        link_up(&a, &b);
        RelayStats st = stats_when(one_proven, 1000);
        cr_assert_eq(st.proven, 1);
        identity_generate(&id);
        int w = raw_wait(2, &id, &st_w);
        cr_assert_eq(st_w, RELAY_OK);
        int c = raw_connect(3, id.pk, &st_c);
        cr_assert_eq(st_c, RELAY_FULL, "a newcomer was answered %d", st_c);
        /* the link carries on (b's next waiting connection may have made
         * way for the newcomers: 4 connections of a relay of 1 link) */
        send_and_check(&a, &b, 1u << 16, 10);
        send_and_check(&b, &a, 1u << 16, 11);
        relay_get_stats(relay, &st);
        cr_assert_eq(st.links, 1);
        cr_assert_eq(st.displaced, 0);
        cr_assert_eq(st.refused_full, 1);
        close(w);
        close(c);
        sides_free(&a, &b);
        relay = relay_free(relay);
}

/* A real handshake between two sides of network secret sec, as the relay
 * sees it: frames in the clear, HELLO and AUTH from the initiator (the
 * asker), HELLO_REPLY from the responder. */
typedef struct Recording {
        uint8_t hello[FRAME_HEADER_SIZE + HANDSHAKE_HELLO_SIZE];
        uint8_t reply[FRAME_HEADER_SIZE + HANDSHAKE_REPLY_SIZE];
        uint8_t auth[FRAME_HEADER_SIZE + HANDSHAKE_AUTH_SIZE];
} Recording;

/* The next message of from, in a frame at out, to. */
static void pass(Handshake *from, Handshake *to, uint8_t *out) {
        uint8_t type;
        int n = handshake_next(from, &type, out + FRAME_HEADER_SIZE, HANDSHAKE_MAX_SIZE);
        cr_assert_gt(n, 0);
        frame_header_encode(&(FrameHeader){ .type = type, .length = (uint32_t)n }, out);
        cr_assert_eq(handshake_recv(to, type, out + FRAME_HEADER_SIZE, (size_t)n), 0);
}

static void record(Recording *rec, const uint8_t *sec) {
        Identity ia, ib;
        Handshake i, r;
        identity_generate(&ia);
        identity_generate(&ib);
        HandshakeConfig ci = { .identity = &ia, .secret = sec, .ciphers = CIPHER_BIT(CIPHER_CHACHA20POLY1305) };
        HandshakeConfig cr = ci;
        cr.identity = &ib;
        cr_assert_eq(handshake_init(&i, &ci, true), 0);
        cr_assert_eq(handshake_init(&r, &cr, false), 0);
        pass(&i, &r, rec->hello);
        pass(&r, &i, rec->reply);
        pass(&i, &r, rec->auth);
        handshake_clear(&i);
        handshake_clear(&r);
}

/* Feeds the recording's frames (each cut at cut[k], past its end: whole),
 * then trailing, from the asker after AUTH; the last answer. */
static int feed_cut(RelayProof *p, const Recording *rec, const size_t cut[3], const uint8_t *trailing, size_t n) {
        const uint8_t *f[3] = { rec->hello, rec->reply, rec->auth };
        const size_t len[3] = { sizeof rec->hello, sizeof rec->reply, sizeof rec->auth };
        relay_proof_init(p, secret);
        for (int k = 0; k < 3; k++) {
                size_t at = cut[k] < len[k] ? cut[k] : len[k];
                int r = relay_proof_feed(p, k != 1, f[k], at);
                if (r < 0)
                        return r;
                cr_assert(r == 0 || (k == 2 && at == len[k]), "proven with %zu bytes of frame %d", at, k);
                if ((r = relay_proof_feed(p, k != 1, f[k] + at, len[k] - at)) < 0)
                        return r;
        }
        return relay_proof_feed(p, true, trailing, n);
}

/* The relay's check on its own (relay-proof.h): a real handshake is proven
 * wherever its frames are cut between reads, and nothing past it is read;
 * another network's, a MAC changed, a frame of another type, length or
 * seq, or bytes out of turn are refused, for good. */
Test(relay, the_proof_takes_frames_cut_anywhere) {
        Recording rec, other;
        RelayProof p;
        uint8_t junk[300];
        memset(junk, 0xa5, sizeof junk);
        record(&rec, secret);
        for (int k = 0; k < 3; k++)
                for (size_t at = 0; at <= sizeof rec.reply; at++) {
                        size_t cut[3] = { SIZE_MAX, SIZE_MAX, SIZE_MAX };
                        cut[k] = at;
                        cr_assert_eq(feed_cut(&p, &rec, cut, junk, sizeof junk), 1, "frame %d cut at %zu", k, at);
                }
        relay_proof_init(&p, secret); /* a byte at a time */
        for (size_t i = 0; i < sizeof rec.hello; i++)
                cr_assert_eq(relay_proof_feed(&p, true, rec.hello + i, 1), 0);
        for (size_t i = 0; i < sizeof rec.reply; i++)
                cr_assert_eq(relay_proof_feed(&p, false, rec.reply + i, 1), 0);
        for (size_t i = 0; i < sizeof rec.auth; i++)
                cr_assert_eq(relay_proof_feed(&p, true, rec.auth + i, 1), i + 1 == sizeof rec.auth);
        cr_assert_eq(relay_proof_feed(&p, false, junk, sizeof junk), 1);

        const size_t whole[3] = { SIZE_MAX, SIZE_MAX, SIZE_MAX };
        record(&other, other_secret);
        cr_assert_eq(feed_cut(&p, &other, whole, NULL, 0), -EACCES, "another network's handshake");
        cr_assert_eq(relay_proof_feed(&p, true, rec.hello, sizeof rec.hello), -EACCES);
        Recording bad = rec;
        bad.auth[sizeof bad.auth - 1] ^= 1;
        cr_assert_eq(feed_cut(&p, &bad, whole, NULL, 0), -EACCES, "a MAC changed");
        bad = rec;
        bad.hello[5] = FRAME_AUTH;
        cr_assert_eq(feed_cut(&p, &bad, whole, NULL, 0), -EBADMSG, "another type");
        bad = rec;
        bad.reply[12]--;
        cr_assert_eq(feed_cut(&p, &bad, whole, NULL, 0), -EBADMSG, "another length");
        bad = rec;
        bad.auth[16] = 1;
        cr_assert_eq(feed_cut(&p, &bad, whole, NULL, 0), -EBADMSG, "seq 1");
        bad = rec;
        bad.hello[0] ^= 0xff;
        cr_assert_eq(feed_cut(&p, &bad, whole, NULL, 0), -EBADMSG, "not a frame");
        relay_proof_init(&p, secret);
        cr_assert_eq(relay_proof_feed(&p, true, rec.hello, 10), 0);
        cr_assert_eq(relay_proof_feed(&p, false, junk, 1), -EBADMSG, "the responder before HELLO");
        relay_proof_init(&p, secret);
        cr_assert_eq(relay_proof_feed(&p, true, rec.hello, sizeof rec.hello + 1), -EBADMSG, "the asker after HELLO");
}

/* Writes n bytes in pieces of a few with a pause between: the relay reads
 * frames cut anywhere. */
static void write_in_pieces(int fd, const uint8_t *b, size_t n) {
        for (size_t at = 0, k; at < n; at += k) {
                k = n - at < 29 ? n - at : 29;
                cr_assert_eq(write(fd, b + at, k), (ssize_t)k);
                usleep(3000);
        }
}

/* The recording passes a raw link (waiter, asker) as two real ends would
 * send it, each end reading what the other sent; true if it all came. */
static bool replay(const Recording *rec, const int fds[2]) {
        uint8_t in[sizeof rec->reply];
        write_in_pieces(fds[1], rec->hello, sizeof rec->hello);
        if (recv(fds[0], in, sizeof rec->hello, MSG_WAITALL) != (ssize_t)sizeof rec->hello)
                return false;
        write_in_pieces(fds[0], rec->reply, sizeof rec->reply);
        if (recv(fds[1], in, sizeof rec->reply, MSG_WAITALL) != (ssize_t)sizeof rec->reply)
                return false;
        write_in_pieces(fds[1], rec->auth, sizeof rec->auth);
        return recv(fds[0], in, sizeof rec->auth, MSG_WAITALL) == (ssize_t)sizeof rec->auth;
}

/* A handshake whose frames come to the relay in pieces is proven, and its
 * link then carries anything; the same handshake sent again (its frames go
 * in the clear: anyone on the path may record them, though only clients
 * that prove the secret get a link to send them through) proves no second
 * link while the first is relayed. */
Test(relay, a_handshake_in_pieces_is_proven_once) {
        Recording rec;
        int first[2], again[2];
        signal(SIGPIPE, SIG_IGN);
        relay_up_secret(4);
        record(&rec, secret);
        raw_link(2, 3, false, first);
        cr_assert(replay(&rec, first), "the handshake did not pass");
        RelayStats st = stats_when(one_proven, 1000);
        cr_assert_eq(st.proven, 1);
        raw_carries(first);
        raw_link(4, 5, false, again);
        cr_assert(!replay(&rec, again), "a recorded handshake passed again");
        cr_assert(closed_by_relay(again[0]) && closed_by_relay(again[1]));
        st = stats_when(one_unproven, 1000);
        cr_assert_eq(st.replayed, 1);
        cr_assert_eq(st.unproven, 1);
        cr_assert_eq(st.proven, 1);
        raw_carries(first);
        for (int i = 0; i < 2; i++) {
                close(first[i]);
                close(again[i]);
        }
        relay = relay_free(relay);
}
