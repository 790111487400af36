/* net/relay.c — one thread, epoll, non-blocking sockets. */
#include "relay.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net-internal.h"
#include "relay-proof.h"

typedef enum ConnState {
        CONN_PREAMBLE, /* the hello sent, the request coming */
        CONN_WAITING,  /* WAIT granted: until someone asks for its key */
        CONN_JOINED,   /* bytes copied to and from its peer */
} ConnState;

typedef struct Conn {
        int fd;
        ConnState state;
        uint8_t challenge[RELAY_CHALLENGE_SIZE];
        uint8_t req[RELAY_REQUEST_SIZE];
        size_t req_len;
        uint8_t key[IDENTITY_PK_SIZE];
        uint8_t channel;
        uint64_t deadline_ns;          /* of the preamble */
        uint64_t since_ns;             /* accepted */
        uint8_t addr[16];              /* the asker's, net_addr_key() */
        struct Conn *peer;             /* joined: the other end */
        bool asker;                    /* joined: the CONNECT's end (the pair's one that counts it) */
        uint64_t joined_ns, last_ns;   /* joined: when, and the last byte read from this end */
        uint64_t moved;                /* joined: bytes read from this end */
        RelayProof *proof;             /* joined, the asker, with a secret: until the link is proven */
        bool proven;                   /* joined, the asker: both ends proved they hold the secret */
        uint8_t t1[32];                /* proven: its handshake's transcript T1 */
        uint8_t *buf;                  /* joined: read here, not yet written to the peer */
        size_t len, off;
        uint32_t events;               /* registered with epoll */
        bool closed;                   /* on Relay.closed: its events of this batch are stale */
        struct Conn *next;             /* every connection, or every closed one */
} Conn;

struct Relay {
        RelayConfig cfg;
        uint8_t (*allowed)[IDENTITY_PK_SIZE];
        int listen_fd, epfd;
        uint16_t port;
        pthread_t thread;
        bool started;
        atomic_bool stop;
        Conn *conns;
        unsigned n_conns;
        /* Closed in this epoll batch, freed at its end: a later event of the
         * batch may still point here, and must not find a connection that
         * on_accept() allocated at the same address. */
        Conn *closed;
        pthread_mutex_t lock;          /* stats */
        RelayStats stats;
        bool has_secret;               /* links are proven (relay-proof.h) */
        uint8_t secret[HANDSHAKE_SECRET_SIZE];
};

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void relay_wait_message(const uint8_t challenge[RELAY_CHALLENGE_SIZE], uint8_t channel,
                        uint8_t out[RELAY_WAIT_MESSAGE_SIZE]) {
        memcpy(out, RELAY_WAIT_CONTEXT, sizeof RELAY_WAIT_CONTEXT - 1);
        memcpy(out + sizeof RELAY_WAIT_CONTEXT - 1, challenge, RELAY_CHALLENGE_SIZE);
        out[RELAY_WAIT_MESSAGE_SIZE - 1] = channel;
}

void relay_member_proof(const uint8_t *secret, const uint8_t challenge[RELAY_CHALLENGE_SIZE],
                        const uint8_t signed_part[RELAY_SIGNED_SIZE], uint8_t out[RELAY_PROOF_SIZE]) {
        crypto_generichash_state st;
        crypto_generichash_init(&st, secret, HANDSHAKE_SECRET_SIZE, RELAY_PROOF_SIZE);
        crypto_generichash_update(&st, (const uint8_t *)RELAY_MEMBER_CONTEXT, sizeof RELAY_MEMBER_CONTEXT - 1);
        crypto_generichash_update(&st, challenge, RELAY_CHALLENGE_SIZE);
        crypto_generichash_update(&st, signed_part, RELAY_SIGNED_SIZE);
        crypto_generichash_final(&st, out, RELAY_PROOF_SIZE);
}

/* ---- connections -------------------------------------------------------- */

static void watch(Relay *r, Conn *c, uint32_t events) {
        if (c->events == events)
                return;
        struct epoll_event ev = { .events = events, .data.ptr = c };
        epoll_ctl(r->epfd, EPOLL_CTL_MOD, c->fd, &ev);
        c->events = events;
}

/* Closes c's socket and moves it to Relay.closed, freed by conns_reap(). */
static void conn_free(Relay *r, Conn *c) {
        for (Conn **p = &r->conns; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        r->n_conns--;
        pthread_mutex_lock(&r->lock);
        if (c->state == CONN_WAITING)
                r->stats.waiting--;
        if (c->state == CONN_JOINED && c->peer) /* a pair counts once: as its first end goes */
                r->stats.links--;
        pthread_mutex_unlock(&r->lock);
        if (c->peer)
                c->peer->peer = NULL;
        epoll_ctl(r->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        c->peer = NULL;
        c->closed = true;
        c->next = r->closed;
        r->closed = c;
}

static void conns_reap(Relay *r) {
        while (r->closed) {
                Conn *c = r->closed;
                r->closed = c->next;
                free(c->proof);
                free(c->buf);
                free(c);
        }
}

/* A joined link goes as a unit: either end closing ends both. */
static void conn_close(Relay *r, Conn *c) {
        Conn *peer = c->state == CONN_JOINED ? c->peer : NULL;
        conn_free(r, c);
        if (peer)
                conn_free(r, peer);
}

static void refuse(Relay *r, Conn *c, uint8_t status) {
        (void)!send(c->fd, &status, 1, MSG_NOSIGNAL);
        pthread_mutex_lock(&r->lock);
        r->stats.refused++;
        pthread_mutex_unlock(&r->lock);
        conn_close(r, c);
}

/* Connections not joined (a preamble, or a waiter) from c's address. */
static unsigned unjoined_near(const Relay *r, const uint8_t addr[16]) {
        unsigned n = 0;
        for (const Conn *o = r->conns; o; o = o->next)
                n += o->state != CONN_JOINED && net_addr_near(o->addr, addr);
        return n;
}

/* Room for a connection from addr. Preambles and waiters take at most
 * twice as many places as links, half of them from one address (the nodes
 * behind one NAT router share an address: a few waiters each). A newcomer
 * from an address at its half displaces that address's oldest; one that
 * finds every place taken displaces the oldest from the address that
 * holds the most. So strangers that keep connections open (without the
 * network secret a WAIT needs none; with it, a preamble still holds a
 * place until its deadline) cannot shut the relay: a waiter that loses
 * its place waits again, and the newest always gets in. */
static bool make_room(Relay *r, const uint8_t addr[16]) {
        bool full_here = unjoined_near(r, addr) >= 2 * r->cfg.max_links;
        if (!full_here && r->n_conns < 4 * r->cfg.max_links)
                return true;
        Conn *drop = NULL;
        unsigned most = 0;
        for (Conn *o = r->conns; o; o = o->next) {
                if (o->state == CONN_JOINED || (full_here && !net_addr_near(o->addr, addr)))
                        continue;
                unsigned k = unjoined_near(r, o->addr);
                if (k > most || (k == most && o->since_ns < drop->since_ns)) {
                        drop = o;
                        most = k;
                }
        }
        if (!drop)
                return false;
        conn_close(r, drop);
        return true;
}

/* ---- places held by an address, and links that may give way ---------------- */

/* A WAIT or CONNECT needs a place of its address (max_links_per_addr) and a
 * CONNECT one of max_links. Without the network secret, neither a key nor
 * a signature says whether two real nodes talk through a link: a stranger
 * may WAIT with a key of its own and CONNECT to it. What the relay can
 * judge is use, so a newcomer that
 * finds no room displaces a link that shows none, and is refused only when
 * every link that could make room is in use. A link carrying bytes both
 * ways between two addresses is never displaced: at worst strangers with
 * many addresses that keep bytes flowing hold the places they took. */

/* Waiting connections from addr, and links with an end there (once each). */
static unsigned held_near(const Relay *r, const uint8_t addr[16]) {
        unsigned n = 0;
        for (const Conn *o = r->conns; o; o = o->next)
                if (o->state == CONN_WAITING)
                        n += net_addr_near(o->addr, addr);
                else if (o->state == CONN_JOINED && o->asker)
                        n += net_addr_near(o->addr, addr) || net_addr_near(o->peer->addr, addr);
        return n;
}

static uint64_t last_byte(const Conn *asker) {
        return MAX(asker->last_ns, asker->peer->last_ns);
}

/* Not proven, and no sign of two nodes using the link: both ends at one
 * address (a stranger joined to itself; also two nodes behind one router,
 * rarely short of a relay's place, and proven with a secret), nothing
 * carried both ways within the preamble deadline of joining (an asker's
 * HELLO goes at once, and its answer), or nothing at all for
 * RELAY_QUIET_MS. */
static bool link_unused(const Relay *r, const Conn *asker, uint64_t now) {
        const Conn *w = asker->peer;
        if (asker->proven)
                return false;
        return net_addr_near(asker->addr, w->addr) ||
               ((asker->moved == 0 || w->moved == 0) &&
                now - asker->joined_ns > (uint64_t)r->cfg.preamble_timeout_ms * 1000000ull) ||
               now - last_byte(asker) > RELAY_QUIET_MS * 1000000ull;
}

/* The unused link silent the longest (with addr, of those with an end
 * there), by its asking end; NULL: none. */
static Conn *unused_link(const Relay *r, const uint8_t *addr, uint64_t now) {
        Conn *best = NULL;
        for (Conn *o = r->conns; o; o = o->next) {
                if (o->state != CONN_JOINED || !o->asker || !link_unused(r, o, now) ||
                    (addr && !net_addr_near(o->addr, addr) && !net_addr_near(o->peer->addr, addr)))
                        continue;
                if (!best || last_byte(o) < last_byte(best))
                        best = o;
        }
        return best;
}

static Conn *oldest_waiter_near(const Relay *r, const uint8_t addr[16]) {
        Conn *best = NULL;
        for (Conn *o = r->conns; o; o = o->next)
                if (o->state == CONN_WAITING && net_addr_near(o->addr, addr) && (!best || o->since_ns < best->since_ns))
                        best = o;
        return best;
}

static void count(Relay *r, uint64_t *counter, const uint8_t *addr) {
        pthread_mutex_lock(&r->lock);
        (*counter)++;
        if (addr)
                memcpy(r->stats.last_over_addr, addr, sizeof r->stats.last_over_addr);
        pthread_mutex_unlock(&r->lock);
}

/* Room for c (a WAIT, or a CONNECT to w) at its address, and with a
 * CONNECT among the links: what must give way is closed. false: there is
 * none, c is to be refused (counted as such). */
static bool make_link_room(Relay *r, const Conn *c, const Conn *w) {
        uint64_t now = now_ns();
        bool over_addr = (!w || !net_addr_near(c->addr, w->addr)) && held_near(r, c->addr) >= r->cfg.max_links_per_addr;
        bool over_all = w && r->stats.links >= r->cfg.max_links;
        Conn *link = NULL, *waiter = NULL;

        if (over_addr && !(link = unused_link(r, c->addr, now)))
                waiter = oldest_waiter_near(r, c->addr);
        if (over_all && !link)
                link = unused_link(r, NULL, now);
        if (over_addr && !link && !waiter) {
                count(r, &r->stats.over_addr, c->addr);
                return false;
        }
        if (over_all && !link) {
                count(r, &r->stats.refused_full, NULL);
                return false;
        }
        if (over_addr)
                count(r, &r->stats.over_addr, c->addr);
        if (link) {
                count(r, &r->stats.displaced, NULL);
                conn_close(r, link);
        }
        if (waiter)
                conn_close(r, waiter);
        return true;
}

static void on_accept(Relay *r) {
        for (;;) {
                struct sockaddr_storage sa;
                socklen_t len = sizeof sa;
                uint8_t addr[16];
                int fd = accept4(r->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                        return;
                net_addr_key(&sa, addr);
                Conn *c = calloc(1, sizeof *c);
                if (!c || !make_room(r, addr)) {
                        free(c);
                        close(fd);
                        pthread_mutex_lock(&r->lock);
                        r->stats.refused++;
                        pthread_mutex_unlock(&r->lock);
                        continue;
                }
                uint8_t hello[RELAY_HELLO_SIZE];
                c->fd = fd;
                c->since_ns = now_ns();
                memcpy(c->addr, addr, sizeof addr);
                c->deadline_ns = now_ns() + (uint64_t)r->cfg.preamble_timeout_ms * 1000000ull;
                randombytes_buf(c->challenge, sizeof c->challenge);
                memcpy(hello, RELAY_MAGIC, RELAY_MAGIC_SIZE);
                memcpy(hello + RELAY_MAGIC_SIZE, c->challenge, RELAY_CHALLENGE_SIZE);
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                /* a waiter, or a joined pair whose ends vanish without a
                 * word, goes within a minute and gives its place back */
                net_keepalive(fd);
                struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
                /* a fresh socket takes 40 bytes at once; else it is not worth keeping */
                if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello ||
                    epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
                        close(fd);
                        free(c);
                        continue;
                }
                c->events = EPOLLIN;
                c->next = r->conns;
                r->conns = c;
                r->n_conns++;
        }
}

static bool admitted(const Relay *r, const uint8_t key[IDENTITY_PK_SIZE]) {
        if (!r->allowed)
                return true;
        for (size_t i = 0; i < r->cfg.n_allowed; i++)
                if (sodium_memcmp(r->allowed[i], key, IDENTITY_PK_SIZE) == 0)
                        return true;
        return false;
}

static Conn *waiter_of(Relay *r, const Conn *asking) {
        for (Conn *c = r->conns; c; c = c->next)
                if (c != asking && c->state == CONN_WAITING && c->channel == asking->channel &&
                    memcmp(c->key, asking->key, IDENTITY_PK_SIZE) == 0)
                        return c;
        return NULL;
}

/* WAIT: the key's owner signed the challenge; an older waiter with the same
 * key (a connection its owner lost) makes room. */
static void on_wait(Relay *r, Conn *c) {
        uint8_t msg[RELAY_WAIT_MESSAGE_SIZE];
        relay_wait_message(c->challenge, c->channel, msg);
        if (crypto_sign_verify_detached(c->req + 2 + IDENTITY_PK_SIZE, msg, sizeof msg, c->key) != 0) {
                refuse(r, c, RELAY_BAD_REQUEST);
                return;
        }
        Conn *old = waiter_of(r, c);
        if (old)
                conn_close(r, old);
        if (!make_link_room(r, c, NULL)) {
                refuse(r, c, RELAY_FULL);
                return;
        }
        /* counted before the answer: whoever has it finds it counted */
        uint8_t ok = RELAY_OK;
        c->state = CONN_WAITING;
        pthread_mutex_lock(&r->lock);
        r->stats.waiting++;
        pthread_mutex_unlock(&r->lock);
        if (send(c->fd, &ok, 1, MSG_NOSIGNAL) != 1)
                conn_close(r, c);
}

static void on_connect(Relay *r, Conn *c) {
        Conn *w = waiter_of(r, c);
        uint8_t ok = RELAY_OK;
        if (!w) {
                refuse(r, c, RELAY_NO_TARGET);
                return;
        }
        if (!make_link_room(r, c, w)) {
                refuse(r, c, RELAY_FULL);
                return;
        }
        /* the waiter's buffer too is only its own once the asker has its
         * answer: an asker that is gone by then (a stranger can reset at
         * will) leaves the waiter as it was */
        _cleanup_(freep) uint8_t *cb = malloc(RELAY_BUFFER);
        _cleanup_(freep) uint8_t *wb = malloc(RELAY_BUFFER);
        _cleanup_(freep) RelayProof *proof = r->has_secret ? malloc(sizeof *proof) : NULL;
        if (!cb || !wb || (r->has_secret && !proof) || send(c->fd, &ok, 1, MSG_NOSIGNAL) != 1) {
                conn_close(r, c);
                return;
        }
        if (proof)
                relay_proof_init(proof, r->secret);
        c->buf = TAKE_PTR(cb);
        w->buf = TAKE_PTR(wb);
        c->proof = TAKE_PTR(proof);
        c->state = w->state = CONN_JOINED;
        c->peer = w;
        w->peer = c;
        c->asker = true;
        c->joined_ns = w->joined_ns = c->last_ns = w->last_ns = now_ns();
        pthread_mutex_lock(&r->lock);
        r->stats.waiting--;
        r->stats.links++;
        r->stats.links_total++;
        pthread_mutex_unlock(&r->lock);
}

/* With the secret: whether the request's proof was made with it, over
 * this connection's challenge. */
static bool member(const Relay *r, const Conn *c) {
        uint8_t want[RELAY_PROOF_SIZE];
        if (!r->has_secret)
                return true;
        relay_member_proof(r->secret, c->challenge, c->req, want);
        return sodium_memcmp(want, c->req + RELAY_SIGNED_SIZE, sizeof want) == 0;
}

static void on_request(Relay *r, Conn *c) {
        uint8_t op = c->req[0];
        c->channel = c->req[1];
        memcpy(c->key, c->req + 2, IDENTITY_PK_SIZE);
        if (!member(r, c)) {
                count(r, &r->stats.not_member, NULL);
                refuse(r, c, RELAY_NOT_MEMBER);
                return;
        }
        if ((op != RELAY_OP_WAIT && op != RELAY_OP_CONNECT) || !admitted(r, c->key)) {
                refuse(r, c, RELAY_BAD_REQUEST);
                return;
        }
        if (op == RELAY_OP_WAIT)
                on_wait(r, c);
        else
                on_connect(r, c);
}

/* ---- copying -------------------------------------------------------------- */

/* Each end reads only while its buffer is empty, and the peer is written
 * to whenever that buffer holds bytes: RELAY_BUFFER per direction. */
static void update_events(Relay *r, Conn *c) {
        watch(r, c, (c->len == c->off ? EPOLLIN : 0) | (c->peer && c->peer->len > c->peer->off ? EPOLLOUT : 0));
}

/* Whether a relayed link was proven by the handshake of transcript t1. The
 * handshake's frames go in the clear: a client that proved the secret (a
 * stranger gets no link) and recorded a real one can send it again, both
 * ends of it, and its MACs verify. It proves no second link while the
 * first is relayed, so a recording holds one link at most. */
static bool transcript_in_use(const Relay *r, const uint8_t t1[32]) {
        for (const Conn *o = r->conns; o; o = o->next)
                if (o->state == CONN_JOINED && o->asker && o->proven && memcmp(o->t1, t1, sizeof o->t1) == 0)
                        return true;
        return false;
}

/* The handshake's frames among the bytes c has just read, on a link not
 * yet proven (its asker a): they go on once they are checked. false: they
 * prove nothing, and the link is closed. */
static bool check_proof(Relay *r, Conn *a, Conn *c) {
        int k = relay_proof_feed(a->proof, c == a, c->buf, c->len);
        if (k == 0)
                return true;
        bool again = k > 0 && transcript_in_use(r, a->proof->t1);
        if (k > 0 && !again) {
                memcpy(a->t1, a->proof->t1, sizeof a->t1);
                a->proven = true;
                count(r, &r->stats.proven, NULL);
        }
        free(a->proof);
        a->proof = NULL;
        if (a->proven)
                return true;
        if (again)
                count(r, &r->stats.replayed, NULL);
        count(r, &r->stats.unproven, NULL);
        conn_close(r, c);
        return false;
}

/* Write what c holds to its peer. false: the link is gone. */
static bool flush(Relay *r, Conn *c) {
        while (c->off < c->len) {
                ssize_t k = send(c->peer->fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
                if (k < 0)
                        return errno == EAGAIN || errno == EINTR;
                c->off += (size_t)k;
                pthread_mutex_lock(&r->lock);
                r->stats.bytes += (uint64_t)k;
                pthread_mutex_unlock(&r->lock);
        }
        c->len = c->off = 0;
        return true;
}

static void on_joined(Relay *r, Conn *c, uint32_t events) {
        Conn *p = c->peer;
        if ((events & EPOLLOUT) && !flush(r, p)) {
                conn_close(r, c);
                return;
        }
        if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && c->len == c->off) {
                ssize_t k = read(c->fd, c->buf, RELAY_BUFFER);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                        conn_close(r, c);
                        return;
                }
                if (k > 0) {
                        c->len = (size_t)k;
                        c->off = 0;
                        c->moved += (uint64_t)k;
                        c->last_ns = now_ns();
                        Conn *a = c->asker ? c : p;
                        if (a->proof && !check_proof(r, a, c))
                                return;
                        if (!flush(r, c)) {
                                conn_close(r, c);
                                return;
                        }
                }
        }
        update_events(r, c);
        update_events(r, p);
}

static void on_event(Relay *r, Conn *c, uint32_t events) {
        switch (c->state) {
        case CONN_PREAMBLE: {
                ssize_t k = read(c->fd, c->req + c->req_len, sizeof c->req - c->req_len);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                        conn_close(r, c);
                        return;
                }
                if (k > 0 && (c->req_len += (size_t)k) == sizeof c->req)
                        on_request(r, c);
                return;
        }
        case CONN_WAITING: /* nothing may come before the link is joined */
                conn_close(r, c);
                return;
        case CONN_JOINED:
                on_joined(r, c, events);
                return;
        }
}

/* Preambles, and links not proven, past the preamble deadline. */
static void expire(Relay *r) {
        uint64_t now = now_ns(), deadline = (uint64_t)r->cfg.preamble_timeout_ms * 1000000ull;
        for (Conn *c = r->conns, *next; c; c = next) {
                next = c->next;
                if (c->state == CONN_PREAMBLE && now > c->deadline_ns)
                        conn_close(r, c); /* no peer yet: only c goes */
                else if (c->state == CONN_JOINED && c->proof && now - c->joined_ns > deadline) {
                        if (next == c->peer) /* it goes too */
                                next = next->next;
                        count(r, &r->stats.unproven, NULL);
                        conn_close(r, c);
                }
        }
}

static void *relay_main(void *arg) {
        Relay *r = arg;
        struct epoll_event ev[64];
        while (!atomic_load(&r->stop)) {
                int n = epoll_wait(r->epfd, ev, 64, 200);
                for (int i = 0; i < n; i++) {
                        if (!ev[i].data.ptr) {
                                on_accept(r);
                                continue;
                        }
                        /* an earlier event of this batch may have closed it */
                        Conn *c = ev[i].data.ptr;
                        if (!c->closed)
                                on_event(r, c, ev[i].events);
                }
                expire(r);
                conns_reap(r);
        }
        return NULL;
}

/* ---- setup ---------------------------------------------------------------- */

static int bind_listener(const RelayConfig *c, int *ret_fd, uint16_t *ret_port) {
        struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *res;
        char service[8];
        snprintf(service, sizeof service, "%u", c->port);
        if (getaddrinfo(c->host && c->host[0] ? c->host : NULL, service, &hints, &res) != 0)
                return -EADDRNOTAVAIL;
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1, r = 0;
        if (fd < 0)
                r = -errno;
        else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
                 bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 128) < 0)
                r = -errno;
        freeaddrinfo(res);
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                return r;
        }
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        getsockname(fd, (struct sockaddr *)&sa, &len);
        *ret_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                   : ((struct sockaddr_in *)&sa)->sin_port);
        *ret_fd = fd;
        return 0;
}

int relay_new(const RelayConfig *c, Relay **ret) {
        if (!c || c->max_links == 0 || c->max_links > 65536 || sodium_init() < 0)
                return -EINVAL;
        Relay *r = calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        r->cfg = *c;
        r->listen_fd = r->epfd = -1;
        pthread_mutex_init(&r->lock, NULL);
        if (!r->cfg.preamble_timeout_ms)
                r->cfg.preamble_timeout_ms = 10000;
        if (!r->cfg.max_links_per_addr)
                r->cfg.max_links_per_addr = RELAY_MAX_LINKS_PER_ADDR;
        if (c->secret) {
                memcpy(r->secret, c->secret, sizeof r->secret);
                r->has_secret = true;
        }
        r->cfg.secret = NULL;
        int err = -ENOMEM;
        if (c->allowed && c->n_allowed) {
                r->allowed = malloc(c->n_allowed * IDENTITY_PK_SIZE);
                if (!r->allowed)
                        goto fail;
                memcpy(r->allowed, c->allowed, c->n_allowed * IDENTITY_PK_SIZE);
        }
        r->cfg.allowed = NULL;
        if ((err = bind_listener(c, &r->listen_fd, &r->port)) < 0)
                goto fail;
        r->epfd = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
        if (r->epfd < 0 || epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->listen_fd, &ev) < 0) {
                err = -errno;
                goto fail;
        }
        if ((err = -pthread_create(&r->thread, NULL, relay_main, r)) < 0)
                goto fail;
        r->started = true;
        *ret = r;
        return 0;
fail:
        relay_free(r);
        return err;
}

Relay *relay_free(Relay *r) {
        if (!r)
                return NULL;
        if (r->started) {
                atomic_store(&r->stop, true);
                pthread_join(r->thread, NULL);
        }
        while (r->conns)
                conn_free(r, r->conns);
        conns_reap(r);
        if (r->epfd >= 0)
                close(r->epfd);
        if (r->listen_fd >= 0)
                close(r->listen_fd);
        free(r->allowed);
        sodium_memzero(r->secret, sizeof r->secret);
        pthread_mutex_destroy(&r->lock);
        free(r);
        return NULL;
}

uint16_t relay_port(const Relay *r) {
        return r->port;
}

void relay_get_stats(Relay *r, RelayStats *ret) {
        pthread_mutex_lock(&r->lock);
        *ret = r->stats;
        pthread_mutex_unlock(&r->lock);
}
