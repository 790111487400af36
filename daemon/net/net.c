/* net/net.c — the endpoint: configuration, listener, admission of new
 * connections, timers, and the application's calls. */
#include <fcntl.h>
#include <arpa/inet.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "net-internal.h"
#include "relay.h"

uint64_t net_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void net_config_defaults(NetConfig *c) {
        *c = (NetConfig){
                .backend = NET_BACKEND_AUTO,
                .zc_threshold = NET_ZC_AUTO,
                .limits = {
                        .max_payload = 1u << 20,
                        .max_control = FRAME_MAX_CONTROL,
                        .max_tensor_bytes = 256ull << 20,
                },
                .chunk = 1u << 20,
                .max_queued = 256ull << 20,
                .max_receive_bytes = 1ull << 30,
                .max_links = 256,
                .max_links_per_addr = 64,
                .handshake_timeout_ms = 5000,
                .idle_timeout_ms = 120000,
                .stall_timeout_ms = 10000,
                .pool_bytes = 64u << 20,
        };
}

static bool addr_is_loopback(const struct sockaddr_storage *sa) {
        if (sa->ss_family == AF_INET)
                return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
        if (sa->ss_family == AF_INET6) {
                const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
                if (IN6_IS_ADDR_LOOPBACK(a))
                        return true;
                if (IN6_IS_ADDR_V4MAPPED(a))
                        return a->s6_addr[12] == 127;
        }
        return false;
}

bool net_addr_near(const uint8_t a[16], const uint8_t b[16]) {
        static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
        bool v4 = memcmp(a, v4mapped, 12) == 0;
        return memcmp(a, b, v4 ? 16 : 8) == 0;
}

void net_addr_key(const struct sockaddr_storage *sa, uint8_t out[16]) {
        memset(out, 0, 16);
        if (sa->ss_family == AF_INET) {
                out[10] = out[11] = 0xff;
                memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        } else if (sa->ss_family == AF_INET6)
                memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
}

/* "192.0.2.7:41234", "[2001:db8::7]:7000"; an IPv4 address mapped into
 * IPv6 (a dual-stack listener) as IPv4. */
static void addr_format(const struct sockaddr_storage *sa, char out[64]) {
        char ip[INET6_ADDRSTRLEN] = "?";
        unsigned port = 0;
        if (sa->ss_family == AF_INET) {
                const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
                inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
                port = ntohs(a->sin_port);
        } else if (sa->ss_family == AF_INET6) {
                const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
                port = ntohs(a->sin6_port);
                if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
                        inet_ntop(AF_INET, a->sin6_addr.s6_addr + 12, ip, sizeof ip);
                else {
                        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
                        snprintf(out, 64, "[%s]:%u", ip, port);
                        return;
                }
        }
        snprintf(out, 64, "%s:%u", ip, port);
}

/* Both ends of fd on loopback? */
/* fd's own address and its peer's (sa: the connection may still be on
 * its way) are both loopback. */
static bool socket_is_loopback(int fd, const struct sockaddr_storage *sa) {
        struct sockaddr_storage a;
        socklen_t la = sizeof a;
        if (getsockname(fd, (struct sockaddr *)&a, &la) < 0)
                return false;
        return addr_is_loopback(&a) && addr_is_loopback(sa);
}

int net_new(const NetConfig *c, const NetCallbacks *cb, void *userdata, Net **ret) {
        _cleanup_(net_freep) Net *n = NULL;
        int r;

        if (!c->identity || (!c->secret && c->n_allowed == 0))
                return -EINVAL; /* no admission rule: refuse to run open */
        if (c->chunk == 0 || c->chunk > c->limits.max_payload || c->max_links == 0 ||
            c->limits.max_control < HANDSHAKE_MAX_SIZE)
                return -EINVAL;

        n = calloc(1, sizeof *n);
        if (!n)
                return -ENOMEM;
        n->listen_fd = -1;
        n->cfg = *c;
        n->identity = *c->identity;
        n->cfg.identity = &n->identity;
        if (c->secret) {
                memcpy(n->secret, c->secret, sizeof n->secret);
                n->cfg.secret = n->secret;
        }
        if (c->n_allowed) {
                n->allowed = malloc(c->n_allowed * IDENTITY_PK_SIZE);
                if (!n->allowed)
                        return -ENOMEM;
                memcpy(n->allowed, c->allowed, c->n_allowed * IDENTITY_PK_SIZE);
                n->cfg.allowed = (const uint8_t(*)[IDENTITY_PK_SIZE])n->allowed;
        }
        if (cb)
                n->cb = *cb;
        n->userdata = userdata;
        n->next_id = 1;
        n->links = calloc(c->max_links, sizeof *n->links);
        if (!n->links)
                return -ENOMEM;
        r = bufpool_new(c->pool_bytes, &n->pool);
        if (r < 0)
                return r;

        if (c->backend != NET_BACKEND_EPOLL) {
                n->backend = &net_backend_uring;
                r = n->backend->init(n);
                if (r < 0) {
                        n->backend = NULL;
                        if (c->backend == NET_BACKEND_URING)
                                return r;
                        /* Container seccomp profiles and kernel.io_uring_disabled
                         * end here; the caller logs stats.fallback once. */
                        n->stats.fallback = true;
                        n->stats.fallback_error = r;
                }
        }
        if (!n->backend) {
                n->backend = &net_backend_epoll;
                r = n->backend->init(n);
                if (r < 0) {
                        n->backend = NULL;
                        return r;
                }
        }
        *ret = TAKE_PTR(n);
        return 0;
}

/* A link whose BYE is still to go out, or whose bytes the peer's TCP has
 * yet to acknowledge. Closing it then, with frames of the peer's unread,
 * would answer with a reset, and a reset throws away what TCP still holds:
 * on a lossy link, the last piece of a round. */
static bool bye_unfinished(const Link *l) {
        int queued = 0;
        if (!l || l->state == LINK_CLOSING)
                return false;
        if (l->bye_pending || l->bye_sending)
                return true;
        return l->bye_sent && ioctl(l->fd, SIOCOUTQ, &queued) == 0 && queued > 0;
}

/* A stopping node says BYE on its open links, so its peers see an orderly
 * close and not a lost connection. Each BYE goes out after the frame its
 * link is sending (a tensor may be cut short: the peer drops it) and shuts
 * the link's sending side; the links are closed once the peers' TCP has
 * everything, or after NET_BYE_FLUSH_MS (a peer that does not read). The
 * application hears nothing of this: it is freeing the Net. */
static void net_say_bye(Net *n) {
        unsigned pending = 0;

        if (!n->backend)
                return;
        n->cb.connected = NULL;
        n->cb.tensor = NULL;
        n->cb.control = NULL;
        n->cb.closed = NULL;
        n->cb.lane_refused = NULL;
        for (unsigned i = 0; n->links && i < n->cfg.max_links; i++) {
                Link *l = n->links[i];
                if (!l || l->state != LINK_OPEN || l->bye_sent) /* one the application said BYE on */
                        continue;
                l->bye_pending = true;
                n->backend->kick_send(n, l);
        }
        for (unsigned i = 0; n->links && i < n->cfg.max_links; i++)
                pending += bye_unfinished(n->links[i]);
        uint64_t deadline = net_now_ns() + NET_BYE_FLUSH_MS * 1000000ULL;
        while (pending && net_now_ns() < deadline) {
                net_run(n, 5);
                pending = 0;
                for (unsigned i = 0; i < n->cfg.max_links; i++)
                        pending += bye_unfinished(n->links[i]);
        }
}

Net *net_free(Net *n) {
        if (!n)
                return NULL;
        /* The backend goes first: tearing down the ring cancels every
         * request, so the kernel can no longer write into a link's buffers or
         * read the application's data. Links are taken out of the table
         * before they are destroyed, so callbacks from link_destroy() cannot
         * reach them. */
        net_say_bye(n);
        if (n->backend)
                n->backend->fini(n);
        n->backend = NULL;
        for (unsigned i = 0; n->links && i < n->cfg.max_links; i++) {
                Link *l = n->links[i];
                if (!l)
                        continue;
                n->links[i] = NULL;
                link_destroy(l);
                free(l);
        }
        if (n->listen_fd >= 0)
                close(n->listen_fd);
        bufpool_free_all(n->pool);
        free(n->links);
        free(n->allowed);
        identity_clear(&n->identity);
        sodium_memzero(n->secret, sizeof n->secret);
        free(n);
        return NULL;
}

const char *net_backend_name(const Net *n) {
        return n->backend->name;
}

Link *net_link_find(const Net *n, uint32_t id) {
        for (unsigned i = 0; i < n->cfg.max_links; i++)
                if (n->links[i] && n->links[i]->id == id)
                        return n->links[i];
        return NULL;
}

static void socket_tune(const Net *n, int fd) {
        int one = 1;
        /* Data a peer leaves unacknowledged for this long aborts the
         * connection, which also hands back zero-copy buffers the kernel
         * would otherwise hold for a peer that stopped reading. */
        unsigned user_timeout = MAX(n->cfg.stall_timeout_ms, 10000u);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

void net_keepalive(int fd) {
        int one = 1, idle = 30, interval = 10, count = 3;
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

#define HANDSHAKES_PER_ADDR 8 /* strangers' handshakes at once from one address (/64 in IPv6) */

static bool stranger(const Link *o) {
        return o->state == LINK_HANDSHAKE && !o->initiator && !o->relay_waiting;
}

/* Whether a stranger's handshake has got as far as our HELLO_REPLY: it
 * sent a HELLO, which a peer does as soon as it is connected. */
static bool stranger_spoke(const Link *o) {
        return o->hs.state != HS_WAIT_HELLO;
}

/* Strangers' handshakes are at their cap when a new one comes: the one to
 * give up is from the address that holds the most of them (a few
 * addresses cannot keep the places), and of those one that has sent
 * nothing (the oldest), else one picked at random. Neither silent
 * connections nor many addresses that open them faster than a peer's
 * round trip can keep a peer out: a HELLO is never displaced by silence,
 * and against HELLOs a peer's handshake lasts a while with some odds, where
 * the oldest would always be the peer's. */
static Link *stranger_to_drop(const Net *n) {
        Link *drop = NULL;
        unsigned most = 0, ties = 0;
        for (unsigned i = 0; i < n->cfg.max_links; i++) {
                Link *o = n->links[i];
                if (!o || !stranger(o))
                        continue;
                unsigned k = 0;
                for (unsigned j = 0; j < n->cfg.max_links; j++)
                        k += n->links[j] && stranger(n->links[j]) && net_addr_near(n->links[j]->addr, o->addr);
                bool better = k > most;
                if (k == most && stranger_spoke(drop) != stranger_spoke(o))
                        better = stranger_spoke(drop);
                else if (k == most && !stranger_spoke(o))
                        better = o->deadline_ns < drop->deadline_ns;
                else if (k == most) /* each of the ties as likely */
                        better = randombytes_uniform(++ties) == 0;
                if (better) {
                        ties = k > most || !stranger_spoke(o) ? 1 : ties;
                        drop = o;
                        most = k;
                }
        }
        return drop;
}

/* A new link on fd (connected or accepted). waiting: a connection of ours
 * waiting at a relay (a responder, but no stranger: the limits on
 * unauthenticated links do not count it). */
/* A link for fd: accepted, dialed (dialing: its connection still on its
 * way; its handshake starts once it is up, dials_progress()), or waiting
 * at a relay. */
static int link_add(Net *n, int fd, bool initiator, bool waiting, bool dialing, const struct sockaddr_storage *sa,
                    uint32_t hello_flags, uint32_t *ret_id) {
        unsigned slot = n->cfg.max_links, same = 0, handshaking = 0, handshaking_same = 0;
        uint8_t key[16];
        int r;

        net_addr_key(sa, key);
        for (unsigned i = 0; i < n->cfg.max_links; i++) {
                const Link *o = n->links[i];
                if (!o) {
                        if (slot == n->cfg.max_links)
                                slot = i;
                        continue;
                }
                bool near = net_addr_near(o->addr, key);
                same += near;
                if (o->state == LINK_HANDSHAKE) {
                        handshaking++;
                        handshaking_same += near;
                }
        }
        /* Strangers that have not authenticated get a quarter of the slots
         * and a few per address, so they cannot crowd out real peers; when
         * those are taken, a newcomer from another address displaces one. */
        unsigned cap = MAX(n->cfg.max_links / 4, 4u);
        bool new_stranger = !initiator && !waiting;
        if (new_stranger && slot < n->cfg.max_links && handshaking >= cap && handshaking_same < HANDSHAKES_PER_ADDR &&
            same < n->cfg.max_links_per_addr) {
                Link *drop = stranger_to_drop(n);
                if (drop) {
                        net_link_close(drop, -EMFILE);
                        handshaking--;
                }
        }
        if (slot == n->cfg.max_links ||
            (new_stranger && (same >= n->cfg.max_links_per_addr || handshaking >= cap ||
                              handshaking_same >= HANDSHAKES_PER_ADDR))) {
                n->stats.links_rejected++;
                close(fd);
                return -EMFILE;
        }

        Link *l = malloc(sizeof *l);
        if (!l) {
                close(fd);
                return -ENOMEM;
        }
        r = link_init(l, n, fd, initiator, socket_is_loopback(fd, sa), hello_flags);
        if (r < 0) {
                link_destroy(l);
                free(l);
                return r;
        }
        memcpy(l->addr, key, 16);
        addr_format(sa, l->address);
        l->relay_waiting = waiting; /* its deadline: the relay's answer, then none (relay_step()) */
        if (waiting) /* nothing crosses it until a peer comes through the relay */
                net_keepalive(fd);
        l->id = n->next_id++;
        l->slot = slot;
        n->links[slot] = l;
        n->n_links++;
        socket_tune(n, fd);

        l->dialing = dialing;
        l->reached = !dialing;
        n->n_dialing += dialing;
        r = link_start(l); /* the HELLO, queued: it goes once the connection is up */
        if (r >= 0 && !dialing)
                r = n->backend->add_link(n, l);
        if (r < 0) {
                n->links[slot] = NULL;
                n->n_links--;
                link_destroy(l);
                free(l);
                return r;
        }
        if (ret_id)
                *ret_id = l->id;
        return 0;
}

void net_accept_pause(Net *n) {
        n->accept_paused_until = net_now_ns() + 200 * 1000000ULL;
        n->stats.links_rejected++;
}

void net_accept_fd(Net *n, int fd, const struct sockaddr_storage *sa) {
        if (link_add(n, fd, false, false, false, sa, 0, NULL) >= 0)
                n->stats.links_accepted++;
}

static int resolve(const char *host, uint16_t port, struct sockaddr_storage *ret, socklen_t *ret_len) {
        struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV }, *res;
        char service[8];
        snprintf(service, sizeof service, "%u", port);
        int r = getaddrinfo(host, service, &hints, &res);
        if (r != 0)
                return r == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
        memcpy(ret, res->ai_addr, res->ai_addrlen);
        *ret_len = res->ai_addrlen;
        freeaddrinfo(res);
        return 0;
}

/* A port whose last owner has just died can stay taken for a moment: the
 * kernel tears a dead process's io_uring down later, and the accept it had
 * queued holds the listening socket until then. A node restarted at once
 * (by systemd or by hand) waits for it, at most wait_ms. */
static int bind_retrying(int fd, const struct sockaddr_storage *sa, socklen_t len, unsigned wait_ms) {
        for (unsigned waited = 0;; waited += 100) {
                if (bind(fd, (const struct sockaddr *)sa, len) == 0)
                        return 0;
                if (errno != EADDRINUSE || waited >= wait_ms)
                        return -errno;
                (void)usleep(100 * 1000);
        }
}

/* Set once at start, before any thread is, and only read after. */
static int inherited[NET_INHERITED_MAX];
static size_t n_inherited;

int net_inherit_listeners(const int *fds, size_t n) {
        if (n > NET_INHERITED_MAX)
                return -E2BIG;
        for (size_t i = 0; i < n; i++) {
                int type = 0, listening = 0;
                socklen_t len = sizeof type;
                if (getsockopt(fds[i], SOL_SOCKET, SO_TYPE, &type, &len) < 0)
                        return -ENOTSOCK;
                len = sizeof listening;
                if (type != SOCK_STREAM || getsockopt(fds[i], SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0 ||
                    !listening)
                        return -ENOTSOCK;
        }
        /* as net_listen()'s own: connections it accepts leave no TIME-WAIT
         * that keeps a node started again from listening there */
        for (size_t i = 0; i < n; i++)
                setsockopt(fds[i], SOL_SOCKET, SO_REUSEADDR, &(int){ 1 }, sizeof(int));
        memcpy(inherited, fds, n * sizeof *fds);
        n_inherited = n;
        return 0;
}

/* A copy of the inherited listening socket bound to sa, or -1. */
static int inherited_listener(const struct sockaddr_storage *sa, socklen_t len) {
        for (size_t i = 0; i < n_inherited; i++) {
                struct sockaddr_storage bound;
                socklen_t blen = sizeof bound;
                if (getsockname(inherited[i], (struct sockaddr *)&bound, &blen) == 0 && blen == len &&
                    memcmp(&bound, sa, len) == 0)
                        return fcntl(inherited[i], F_DUPFD_CLOEXEC, 3);
        }
        return -1;
}

/* A socket listening on sa, SO_REUSEADDR (so that the TIME-WAIT of the
 * connections it accepted never keeps it from listening there again); a
 * port in use is tried again for up to wait_ms. */
static int listen_socket(const struct sockaddr_storage *sa, socklen_t len, unsigned wait_ms) {
        _cleanup_(closep) int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1, r;
        if (fd < 0)
                return -errno;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        r = bind_retrying(fd, sa, len, wait_ms);
        if (r < 0)
                return r;
        if (listen(fd, 128) < 0)
                return -errno;
        return TAKE_FD(fd);
}

static uint16_t bound_port(int fd) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
                return 0;
        return ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                             : ((struct sockaddr_in6 *)&sa)->sin6_port);
}

int net_listen_socket(const char *host, uint16_t port, uint16_t *ret_port) {
        struct sockaddr_storage sa;
        socklen_t len = 0;
        int r = resolve(host, port, &sa, &len);
        if (r < 0)
                return r;
        int fd = listen_socket(&sa, len, 0);
        if (fd >= 0 && ret_port)
                *ret_port = bound_port(fd);
        return fd;
}

int net_listen(Net *n, const char *host, uint16_t port, uint16_t *ret_port) {
        return net_listen_wait(n, host, port, 0, ret_port);
}

int net_listen_wait(Net *n, const char *host, uint16_t port, unsigned wait_ms, uint16_t *ret_port) {
        struct sockaddr_storage sa;
        socklen_t len = 0;
        int r;

        if (n->listen_fd >= 0)
                return -EALREADY;
        r = resolve(host, port, &sa, &len);
        if (r < 0)
                return r;
        _cleanup_(closep) int fd = port ? inherited_listener(&sa, len) : -1;
        if (fd < 0)
                fd = listen_socket(&sa, len, wait_ms);
        if (fd < 0)
                return fd;
        if (ret_port)
                *ret_port = bound_port(fd);
        r = n->backend->add_listener(n, fd);
        if (r < 0)
                return r;
        n->listen_fd = TAKE_FD(fd);
        return 0;
}

static int set_blocking(int fd) {
        int fl = fcntl(fd, F_GETFL);
        return fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ? -errno : 0;
}

/* A non-blocking socket connecting to host:port: *ret_dialing says the
 * connection is still on its way. */
static int dial(const char *host, uint16_t port, struct sockaddr_storage *sa, bool *ret_dialing) {
        socklen_t len = 0;
        int r = resolve(host, port, sa, &len);
        if (r < 0)
                return r;
        int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        *ret_dialing = connect(fd, (struct sockaddr *)sa, len) < 0;
        if (*ret_dialing && errno != EINPROGRESS) {
                r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

/* A connection to host:port, added as a link whose HELLO carries flags.
 * Nothing waits for it here: the caller's thread (a node's training, say)
 * goes on while a peer that does not answer is given the handshake
 * timeout, and a refusal comes as closed() (NetPeerInfo.reached false). */
static int connect_one(Net *n, const char *host, uint16_t port, uint32_t flags, uint32_t *ret_id) {
        struct sockaddr_storage sa;
        bool dialing;
        int r, fd = dial(host, port, &sa, &dialing);
        if (fd < 0)
                return fd;
        if (!dialing && (r = set_blocking(fd)) < 0) {
                close(fd);
                return r;
        }
        return link_add(n, fd, true, false, dialing, &sa, flags, ret_id);
}

/* Its connection is up, and through the relay's preamble if it asked one
 * (r = 0), or failed: the handshake starts, or the link is closed with the
 * reason. */
static void dial_done(Net *n, Link *l, int r) {
        l->dialing = false;
        n->n_dialing--;
        if (r >= 0)
                r = set_blocking(l->fd);
        if (r >= 0)
                r = n->backend->add_link(n, l);
        if (r < 0)
                net_link_close(l, r);
}

static int relay_step(Net *n, Link *l);

/* Links whose connection net_connect() or a relay request began: each one
 * up, through the relay's preamble, or refused. */
static void dials_progress(Net *n) {
        for (unsigned i = 0; n->n_dialing && i < n->cfg.max_links; i++) {
                Link *l = n->links[i];
                struct pollfd p = { .fd = l ? l->fd : -1, .events = l && l->reached ? POLLIN : POLLOUT };
                if (!l || !l->dialing || poll(&p, 1, 0) <= 0)
                        continue;
                int err = 0, r = 1;
                socklen_t len = sizeof err;
                if (!l->reached && getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
                        err = errno;
                l->reached = err == 0;
                if (err == 0 && l->relay_op)
                        r = relay_step(n, l);
                if (r != 0)
                        dial_done(n, l, err ? -err : MIN(r, 0));
        }
}

int net_connect(Net *n, const char *host, uint16_t port, uint32_t *ret_peer) {
        unsigned k = MIN(MAX(n->cfg.lanes, 1u), (unsigned)NET_LANES_MAX);
        uint32_t id, extra;
        int r = connect_one(n, host, port, (k - 1) << HANDSHAKE_LANES_SHIFT, &id);
        if (r < 0 || k == 1)
                goto done;
        /* the other lanes: each its own handshake, then a LANE frame naming
         * the first's HELLO nonce */
        Link *primary = net_link_find(n, id);
        Bundle *b = lanes_new(primary, k, primary->hs.hello + 4 + 32);
        if (!b)
                r = -ENOMEM;
        for (unsigned i = 1; r >= 0 && i < k; i++)
                if ((r = connect_one(n, host, port, HANDSHAKE_LANE_EXTRA, &extra)) >= 0)
                        lanes_join(net_link_find(n, extra), b, i);
        if (r < 0) {
                primary->extra = true; /* the application never had it: no closed() */
                net_link_close(primary, r);
                return r;
        }
done:
        if (r >= 0 && ret_peer)
                *ret_peer = id;
        return r;
}

/* ---- through a relay (relay.h) ------------------------------------------ */

/* Our request, once the relay's hello is in: WAIT signs its challenge, and
 * with a network secret the request proves it holds it. A new
 * connection's send buffer takes it whole. */
static int relay_send_request(Net *n, Link *l) {
        uint8_t req[RELAY_REQUEST_SIZE] = { l->relay_op, n->cfg.relay_channel }, msg[RELAY_WAIT_MESSAGE_SIZE];
        const uint8_t *challenge = l->relay_in + RELAY_MAGIC_SIZE;
        memcpy(req + 2, l->relay_key, IDENTITY_PK_SIZE);
        if (l->relay_op == RELAY_OP_WAIT) {
                relay_wait_message(challenge, n->cfg.relay_channel, msg);
                crypto_sign_detached(req + 2 + IDENTITY_PK_SIZE, NULL, msg, sizeof msg, n->identity.sk);
        }
        if (n->cfg.secret)
                relay_member_proof(n->cfg.secret, challenge, req, req + RELAY_SIGNED_SIZE);
        return send(l->fd, req, sizeof req, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof req ? 0 : -EIO;
}

/* The relay's preamble as its bytes come: its hello (then our request
 * goes), then its one-byte answer. 1: through it, the link starts (a WAIT
 * waits there); 0: more to come; < 0 why not. */
static int relay_step(Net *n, Link *l) {
        static const int errors[] = { [RELAY_BAD_REQUEST] = -EACCES, [RELAY_NO_TARGET] = -EHOSTUNREACH,
                                      [RELAY_FULL] = -EBUSY, [RELAY_NOT_MEMBER] = -EACCES };
        size_t want = l->relay_got < RELAY_HELLO_SIZE ? RELAY_HELLO_SIZE : RELAY_HELLO_SIZE + 1;
        ssize_t k = recv(l->fd, l->relay_in + l->relay_got, want - l->relay_got, MSG_DONTWAIT);
        if (k <= 0)
                return k == 0 ? -ECONNRESET : errno == EAGAIN || errno == EINTR ? 0 : -errno;
        l->relay_got += (size_t)k;
        if (l->relay_got == RELAY_HELLO_SIZE)
                return memcmp(l->relay_in, RELAY_MAGIC, RELAY_MAGIC_SIZE) != 0 ? -ENOPROTOOPT /* another version */
                                                                               : relay_send_request(n, l);
        if (l->relay_got < RELAY_HELLO_SIZE + 1)
                return 0;
        uint8_t status = l->relay_in[RELAY_HELLO_SIZE];
        if (status != RELAY_OK)
                return status < sizeof errors / sizeof *errors && errors[status] ? errors[status] : -EPROTO;
        l->relay_op = 0;
        if (l->relay_waiting) { /* waits there: no deadline until a peer comes through */
                n->relay_registered = true;
                n->relay_failures = 0;
        }
        return 1;
}

/* A connection to the relay that makes a request (WAIT for this node,
 * CONNECT to key) as a link whose preamble comes first (relay_step()):
 * nothing here waits for the relay, which is given the handshake timeout
 * for its answer and the handshake together. */
static int relay_begin(Net *n, uint8_t op, const uint8_t key[IDENTITY_PK_SIZE], uint32_t *ret_id) {
        struct sockaddr_storage sa;
        bool dialing;
        uint32_t id;
        if (!n->cfg.relay_host)
                return -ENOTCONN;
        int r, fd = dial(n->cfg.relay_host, n->cfg.relay_port, &sa, &dialing);
        if (fd < 0)
                return fd;
        if ((r = link_add(n, fd, op == RELAY_OP_CONNECT, op == RELAY_OP_WAIT, true, &sa, 0, &id)) < 0)
                return r;
        Link *l = net_link_find(n, id);
        l->reached = !dialing;
        l->relay_op = op;
        memcpy(l->relay_key, key, IDENTITY_PK_SIZE);
        *ret_id = id;
        return 0;
}

int net_connect_relayed(Net *n, const uint8_t target[IDENTITY_PK_SIZE], uint32_t *ret_peer) {
        return relay_begin(n, RELAY_OP_CONNECT, target, ret_peer);
}

/* With relay_wait, one connection always waits at the relay; once a peer
 * has come through it, it is a link like any other and another waits. A
 * try that the relay did not take (the connection ended first, or could
 * not even be opened) is a failure, counted when the next is due: that one
 * waits twice as long, 1 s up to 64 s. */
static void relay_keep_waiting(Net *n) {
        uint64_t now = net_now_ns();
        if (!n->cfg.relay_wait || (n->relay_waiter && net_link_find(n, n->relay_waiter)) || now < n->relay_retry_ns)
                return;
        if (n->relay_tried && !n->relay_registered)
                n->relay_failures = MIN(n->relay_failures + 1, 6u);
        n->relay_waiter = 0;
        n->relay_registered = false;
        n->relay_tried = true;
        n->relay_retry_ns = now + (1000ULL << n->relay_failures) * 1000000ULL;
        (void)relay_begin(n, RELAY_OP_WAIT, n->identity.pk, &n->relay_waiter);
}

/* An open link the application knows: not another lane, not a link of
 * lanes before all are open. */
static bool link_visible(const Link *l) {
        return l && l->state == LINK_OPEN && !l->extra && !l->lane_pending && (!l->bundle || l->bundle->announced);
}

static Link *visible_link(const Net *n, uint32_t peer) {
        Link *l = net_link_find(n, peer);
        return link_visible(l) ? l : NULL;
}

int net_send_tensor(Net *n, uint32_t peer, uint32_t stream, const TensorDesc *desc, const void *data,
                    uint64_t cookie) {
        Link *l = visible_link(n, peer);
        TensorDesc check;
        if (!l)
                return -ENOTCONN;
        if (tensor_desc_init(&check, desc->dtype, desc->ndim, desc->dims) < 0 || check.bytes != desc->bytes)
                return -EINVAL;
        if (desc->bytes > n->cfg.limits.max_tensor_bytes)
                return -EMSGSIZE;
        if (lanes_queued(n, l) + desc->bytes > n->cfg.max_queued)
                return -ENOBUFS;
        if (l->bundle)
                return lanes_send_tensor(n, l, stream, desc, data, cookie);
        int r = link_queue_tensor(l, stream, desc, data, cookie);
        if (r < 0)
                return r;
        n->backend->kick_send(n, l);
        return 0;
}

static int send_control(Net *n, Link *l, uint8_t type, const void *payload, size_t len) {
        if (type != FRAME_PLAN && type != FRAME_CONTROL && type != FRAME_HEARTBEAT && type != FRAME_BYE)
                return -EINVAL;
        if (len > n->cfg.limits.max_control)
                return -EMSGSIZE;
        if (lanes_queued(n, l) + len > n->cfg.max_queued)
                return -ENOBUFS;
        int r = link_queue_control(l, type, payload, len);
        if (r < 0)
                return r;
        n->backend->kick_send(n, l);
        return 0;
}

int net_send_control(Net *n, uint32_t peer, uint8_t type, const void *payload, size_t len) {
        Link *l = visible_link(n, peer);
        return l ? send_control(n, l, type, payload, len) : -ENOTCONN;
}

int net_broadcast_control(Net *n, uint8_t type, const void *payload, size_t len) {
        int sent = 0;
        for (unsigned i = 0; i < n->cfg.max_links; i++) /* each link once: no lookup by id */
                if (link_visible(n->links[i]) && send_control(n, n->links[i], type, payload, len) == 0)
                        sent++;
        return sent;
}

void net_tensor_release(Net *n, NetTensor *t) {
        if (!t)
                return;
        if (bufpool_owns(n->pool, t->data))
                bufpool_free(n->pool, t->data, t->desc.bytes);
        else
                free(t->data);
        free(t);
}

void net_link_close(Link *l, int reason) {
        Net *n = l->net;
        if (l->state == LINK_CLOSING)
                return;
        switch (reason) {
        case -EACCES:
        case -EOPNOTSUPP:
        case -EKEYREJECTED:
                n->stats.auth_failures++;
                break;
        case -EBADMSG:
        case -EPROTO:
        case -EPROTONOSUPPORT:
        case -ENOPROTOOPT: /* a relay's preamble of another version */
                if (l->state == LINK_HANDSHAKE)
                        n->stats.auth_failures++;
                else
                        n->stats.bad_frames++;
                break;
        case -EBADRQC: /* the application's: a protocol above ours broken */
                n->stats.bad_frames++;
                break;
        case -EMSGSIZE:
        case -ENOBUFS:
        case -EMFILE:
                n->stats.limit_violations++;
                break;
        case -ETIMEDOUT:
                n->stats.timeouts++;
                break;
        }
        if (reason != -ETIMEDOUT)
                l->timeout = NET_TIMEOUT_NONE;
        l->close_reason = reason == -ESHUTDOWN ? 0 : reason;
        l->state = LINK_CLOSING;
        n->closed_pending = true;
        if (l->dialing) { /* never in the backend: nothing in flight */
                l->dialing = false;
                n->n_dialing--;
        }
        link_rx_uncount(l);
        if (l->bundle && reason != -ESHUTDOWN)
                lanes_rx_uncount(n, l->bundle);
        n->backend->close_link(n, l);
        /* One lane lost is the link lost; but a lane that said BYE only
         * ends itself: the others may still hold frames striped before it. */
        if (reason != -ESHUTDOWN)
                lanes_close(l, reason);
}

/* BYE is out: our side is shut (a FIN after everything queued); the link
 * stays, reading, until the peer closes or net_say_bye() lets it go. */
void net_link_bye_sent(Link *l) {
        l->bye_sending = false;
        l->bye_sent = true;
        if (shutdown(l->fd, SHUT_WR) < 0)
                net_link_close(l, 0);
}

void net_link_released(Link *l) {
        Net *n = l->net;
        /* The first lane of a link goes last: every sent() of the link's
         * other lanes comes before its closed() (net_run() comes back). */
        if (l->bundle && l->lane == 0 && l->bundle->refs > 1)
                return;
        uint8_t id[IDENTITY_PK_SIZE];
        uint32_t peer = l->id;
        int reason = l->close_reason;

        bool hidden = l->extra; /* another lane: the application never knew it */
        bool refused = l->lane_pending; /* ... nor that it was refused before it joined */
        memcpy(id, l->peer_id, sizeof id);
        link_describe(l, &n->closing);
        n->links[l->slot] = NULL;
        n->n_links--;
        link_destroy(l);
        free(l);
        if (n->cb.closed && !hidden) {
                n->closing_id = peer; /* for net_peer_describe() in the callback */
                n->cb.closed(n->userdata, peer, reason, id);
        }
        if (n->cb.lane_refused && refused)
                n->cb.lane_refused(n->userdata, reason, &n->closing);
        n->closing_id = 0;
}

int net_peer_describe(const Net *n, uint32_t peer, NetPeerInfo *ret) {
        Link *l = net_link_find(n, peer);
        if (l)
                link_describe(l, ret);
        else if (peer != 0 && peer == n->closing_id)
                *ret = n->closing;
        else
                return -ENOTCONN;
        return 0;
}

const char *net_timeout_to_string(NetTimeout t) {
        switch (t) {
        case NET_TIMEOUT_HANDSHAKE: return "handshake";
        case NET_TIMEOUT_STALL: return "stalled frame";
        case NET_TIMEOUT_IDLE: return "idle link";
        case NET_TIMEOUT_SLOW: return "tensor too slow to come, gave way to another";
        default: return "timeout";
        }
}

int net_close_peer(Net *n, uint32_t peer) {
        return net_drop_peer(n, peer, 0);
}

int net_drop_peer(Net *n, uint32_t peer, int reason) {
        Link *l = net_link_find(n, peer);
        if (!l || reason > 0)
                return l ? -EINVAL : -ENOTCONN;
        net_link_close(l, reason);
        return 0;
}

/* What a link holds of max_receive_bytes, what of it is still to come, and
 * since when (a bundle's, on its primary). */
static uint64_t rx_held(const Link *l, uint64_t *ret_left, uint64_t *ret_begun_ns) {
        uint64_t held = 0;
        *ret_left = 0;
        *ret_begun_ns = UINT64_MAX;
        if (l->state == LINK_CLOSING)
                return 0;
        if (l->bundle) {
                if (l->lane == 0)
                        lanes_rx_held(l->bundle, &held, ret_left, ret_begun_ns);
        } else if (l->rx_active && !l->rx_uncounted) {
                held = l->rx.desc.bytes;
                *ret_left = held - l->rx_got;
                *ret_begun_ns = l->rx_begun_ns;
        }
        return held;
}

/* The link whose tensors would take longest to finish at their rate so
 * far, if that is more than six stall timeouts (a minute by default) and
 * they began at least one ago; NULL if none. */
static Link *rx_slowest(Net *n, const Link *asker) {
        uint64_t now = net_now_ns(), stall = (uint64_t)n->cfg.stall_timeout_ms * 1000000ULL;
        double worst = 6.0 * (double)(stall ? stall : 10000000000ULL);
        Link *slowest = NULL;
        for (unsigned i = 0; i < n->cfg.max_links; i++) {
                Link *l = n->links[i];
                uint64_t left, begun;
                if (!l || l == asker || (l->bundle && l->bundle == asker->bundle))
                        continue;
                uint64_t held = rx_held(l, &left, &begun);
                if (!held || !left || now < begun + stall)
                        continue;
                double to_go = (double)left * (double)(now - begun) / (double)MAX(held - left, (uint64_t)1);
                if (to_go > worst) {
                        worst = to_go;
                        slowest = l;
                }
        }
        return slowest;
}

/* All links together hold at most max_receive_bytes of tensors being
 * received. When a new one would pass it, the slowest holder gives way
 * (rx_slowest()): a peer trickling in a large tensor, a byte now and then,
 * cannot keep the others' tensors out. Its buffers count no more from
 * now (link_rx_uncount()); they are freed once the backend lets go. */
int net_rx_room(Net *n, const Link *asker, uint64_t need) {
        while (n->rx_bytes + need > n->cfg.max_receive_bytes) {
                Link *l = rx_slowest(n, asker);
                if (!l)
                        return -ENOBUFS;
                l->timeout = NET_TIMEOUT_SLOW;
                net_link_close(l, -ETIMEDOUT);
        }
        return 0;
}

/* An open link on which this node sent nothing for a third of its idle
 * timeout gets a HEARTBEAT, so a peer with the same timeout keeps it while
 * the application has nothing to say (a paused stage, a finished node). */
static void heartbeat(Net *n, Link *l, uint64_t now, uint64_t idle) {
        if (l->state != LINK_OPEN || !idle || now - l->last_sent_ns <= idle / 3 || l->tx_head || l->tx_ready ||
            l->bye_pending || l->bye_sending)
                return;
        l->last_sent_ns = now; /* once, even if it cannot be queued */
        if (link_queue_control(l, FRAME_HEARTBEAT, NULL, 0) == 0)
                n->backend->kick_send(n, l);
}

/* Handshake deadlines, idle links and senders stuck mid-frame; heartbeats. */
static void check_timers(Net *n) {
        uint64_t now = net_now_ns(), ms = 1000000ULL;
        uint64_t idle = n->cfg.idle_timeout_ms * ms, stall = n->cfg.stall_timeout_ms * ms;
        for (unsigned i = 0; i < n->cfg.max_links; i++) {
                Link *l = n->links[i];
                if (!l || l->state == LINK_CLOSING || (l->relay_waiting && !l->relay_op))
                        continue;
                heartbeat(n, l, now, idle);
                bool mid_frame = l->phase != RX_HEADER || l->rx_have > 0;
                NetTimeout t = NET_TIMEOUT_NONE;
                bool opening = l->state != LINK_OPEN || l->lane_pending || (l->bundle && !l->bundle->announced);
                if (opening && now > l->deadline_ns)
                        t = NET_TIMEOUT_HANDSHAKE;
                else if ((stall && mid_frame && now - l->last_bytes_ns > stall) ||
                         /* a tensor begun and not growing, whatever else arrives */
                         (stall && l->rx_active && now - l->rx_progress_ns > stall))
                        t = NET_TIMEOUT_STALL;
                else if (idle && now - l->last_frame_ns > idle)
                        t = NET_TIMEOUT_IDLE;
                if (t != NET_TIMEOUT_NONE) {
                        l->timeout = t;
                        net_link_close(l, -ETIMEDOUT);
                }
        }
}

/* How often the deadlines are checked: a sixteenth of the shortest one,
 * 1 to 100 ms (every slot is visited: not on every wake-up). */
static uint64_t timer_tick_ns(const NetConfig *c) {
        unsigned ms = c->handshake_timeout_ms;
        if (c->idle_timeout_ms)
                ms = MIN(ms, c->idle_timeout_ms);
        if (c->stall_timeout_ms)
                ms = MIN(ms, c->stall_timeout_ms);
        return (uint64_t)CLAMP(ms / 16, 1u, 100u) * 1000000ULL;
}

/* Links closed outside the backend's handlers (timers, the application) go
 * once nothing of theirs is in flight. */
static void release_closed(Net *n) {
        bool waiting = false;
        n->closed_pending = false;
        for (unsigned i = 0; i < n->cfg.max_links; i++) {
                Link *l = n->links[i];
                if (l && l->state == LINK_CLOSING) {
                        if (l->inflight == 0)
                                net_link_released(l);
                        waiting |= n->links[i] != NULL; /* in flight, or a link's first lane kept for last */
                }
        }
        n->closed_pending |= waiting;
}

int net_run(Net *n, int timeout_ms) {
        /* connections on their way are looked at every 5 ms */
        if (n->n_dialing && (timeout_ms < 0 || timeout_ms > 5))
                timeout_ms = 5;
        int r = n->backend->wait(n, timeout_ms);
        dials_progress(n);
        uint64_t now = net_now_ns();
        if (now - n->timers_ns >= timer_tick_ns(&n->cfg)) {
                n->timers_ns = now;
                check_timers(n);
        }
        relay_keep_waiting(n);
        if (n->accept_paused_until && net_now_ns() > n->accept_paused_until) {
                n->accept_paused_until = 0;
                n->backend->resume_accept(n);
        }
        if (n->closed_pending)
                release_closed(n);
        return r;
}

void net_get_stats(const Net *n, NetStats *ret) {
        *ret = n->stats;
        ret->links = n->n_links; /* links, not their other lanes */
        ret->links_open = 0;
        for (unsigned i = 0; i < n->cfg.max_links; i++) {
                const Link *l = n->links[i];
                ret->links -= l && l->extra;
                ret->links_open += l && !l->extra && l->state == LINK_OPEN;
        }
        ret->pool_in_use = n->pool ? n->pool->in_use : 0;
}

int64_t net_queued(const Net *n, uint32_t peer) {
        Link *l = net_link_find(n, peer);
        return l ? (int64_t)lanes_queued(n, l) : -ENOTCONN;
}

int net_peer_cipher(const Net *n, uint32_t peer) {
        Link *l = net_link_find(n, peer);
        return l && l->keyed ? (int)l->seal.cipher : -ENOTCONN;
}
