/* net/backend-epoll.c — the fallback: non-blocking sockets and epoll, for
 * where io_uring is unavailable (container seccomp profiles,
 * kernel.io_uring_disabled) or turned off. Same links, same protocol. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "net-internal.h"

#define LISTENER_TAG UINT64_MAX

typedef struct EpollData {
        int epfd;
} EpollData;

static int ep_init(Net *n) {
        EpollData *e = calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        e->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (e->epfd < 0) {
                int r = -errno;
                free(e);
                return r;
        }
        n->backend_data = e;
        return 0;
}

static void ep_fini(Net *n) {
        EpollData *e = n->backend_data;
        if (!e)
                return;
        close(e->epfd);
        free(e);
        n->backend_data = NULL;
}

static int set_nonblock(int fd) {
        int fl = fcntl(fd, F_GETFL);
        return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

static int ep_add_listener(Net *n, int fd) {
        EpollData *e = n->backend_data;
        struct epoll_event ev = { .events = EPOLLIN, .data.u64 = LISTENER_TAG };
        int r = set_nonblock(fd);
        if (r < 0)
                return r;
        return epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static void update_events(Net *n, Link *l) {
        EpollData *e = n->backend_data;
        struct epoll_event ev = { .events = EPOLLIN, .data.u64 = l->slot };
        if (link_tx_prepare(l))
                ev.events |= EPOLLOUT;
        epoll_ctl(e->epfd, EPOLL_CTL_MOD, l->fd, &ev);
}

static int ep_add_link(Net *n, Link *l) {
        EpollData *e = n->backend_data;
        struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.u64 = l->slot };
        int r = set_nonblock(l->fd);
        if (r < 0)
                return r;
        return epoll_ctl(e->epfd, EPOLL_CTL_ADD, l->fd, &ev) < 0 ? -errno : 0;
}

static void ep_kick_send(Net *n, Link *l) {
        if (l->state != LINK_CLOSING && !l->tx_ready && !l->dialing) /* dialing: not added yet */
                update_events(n, l);
}

static void ep_close_link(Net *n, Link *l) {
        EpollData *e = n->backend_data;
        epoll_ctl(e->epfd, EPOLL_CTL_DEL, l->fd, NULL);
        /* Nothing is ever in flight here: the link can go at once, but not
         * from inside its own event handler, which still holds it. */
}

static void accept_all(Net *n) {
        EpollData *e = n->backend_data;
        for (;;) {
                struct sockaddr_storage sa;
                socklen_t len = sizeof sa;
                int fd = accept4(n->listen_fd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC);
                if (fd < 0) {
                        /* Out of descriptors: the listener stays readable, so
                         * stop watching it for a while instead of spinning. */
                        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                                epoll_ctl(e->epfd, EPOLL_CTL_DEL, n->listen_fd, NULL);
                                net_accept_pause(n);
                        }
                        return;
                }
                net_accept_fd(n, fd, &sa);
        }
}

static int ep_resume_accept(Net *n) {
        return ep_add_listener(n, n->listen_fd);
}

static void on_readable(Net *n, Link *l) {
        /* Read until the socket is drained, straight into the link's target. */
        for (int rounds = 0; rounds < 64 && l->state != LINK_CLOSING; rounds++) {
                uint8_t *p;
                size_t want;
                link_rx_target(l, &p, &want);
                ssize_t k = recv(l->fd, p, want, 0);
                if (k < 0) {
                        if (errno != EAGAIN && errno != EINTR)
                                net_link_close(l, -errno);
                        return;
                }
                int r = link_rx_done(l, (size_t)k);
                while (r >= 0 && link_rx_pending(l))
                        r = link_rx_more(l);
                if (r < 0) {
                        net_link_close(l, r);
                        return;
                }
        }
}

static void on_writable(Net *n, Link *l) {
        while (l->state != LINK_CLOSING && link_tx_prepare(l)) {
                struct msghdr m = { .msg_iov = l->iov, .msg_iovlen = (size_t)l->iovcnt };
                ssize_t k = sendmsg(l->fd, &m, MSG_NOSIGNAL);
                if (k < 0) {
                        if (errno != EAGAIN && errno != EINTR)
                                net_link_close(l, -errno);
                        return;
                }
                link_tx_done(l, (size_t)k);
        }
}

static int ep_wait(Net *n, int timeout_ms) {
        EpollData *e = n->backend_data;
        struct epoll_event evs[64];
        int k = epoll_wait(e->epfd, evs, 64, timeout_ms);
        if (k < 0)
                return errno == EINTR ? 0 : -errno;

        for (int i = 0; i < k; i++) {
                if (evs[i].data.u64 == LISTENER_TAG) {
                        accept_all(n);
                        continue;
                }
                Link *l = n->links[evs[i].data.u64];
                if (!l)
                        continue;
                if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                        on_readable(n, l);
                if (l->state != LINK_CLOSING && (evs[i].events & EPOLLOUT))
                        on_writable(n, l);
                if (l->state == LINK_CLOSING)
                        net_link_released(l);
                else
                        update_events(n, l);
        }
        return k;
}

const NetBackend net_backend_epoll = {
        .name = "epoll",
        .init = ep_init,
        .fini = ep_fini,
        .add_listener = ep_add_listener,
        .add_link = ep_add_link,
        .kick_send = ep_kick_send,
        .close_link = ep_close_link,
        .resume_accept = ep_resume_accept,
        .wait = ep_wait,
};
