/* net/backend-uring.c — io_uring: one ring per Net (so per thread), at most
 * one receive (or, while frames read ahead wait, a place in the list
 * hand_over() serves) and one send in flight per link, submissions and
 * completions handled in batches. Large payloads are received straight
 * into the tensor's buffer with plain RECV (small frames are read ahead,
 * link.c): reading into a registered region (READ_FIXED) pinned the whole
 * region, so counted it all in the process's RSS, and the
 * kernel copied into it with a slower memcpy than the one of a plain
 * receive (measured: docs/figures.md, Transport). Frames at or above the
 * zero-copy threshold go out with SEND_ZC, and the frame's buffer is not
 * reused before the kernel's notification says it is done with it. */
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net-internal.h"

enum {
        OP_ACCEPT = 1,
        OP_RECV,
        OP_SEND,
        OP_SEND_ZC,
};

/* user_data: the op in the top byte, the link's slot below */
#define UD(op, slot) ((uint64_t)(op) << 56 | (uint64_t)(slot))
#define UD_OP(ud) ((int)((ud) >> 56))
#define UD_SLOT(ud) ((unsigned)((ud) & 0xffffffffu))

typedef struct UringData {
        struct io_uring ring;
        struct sockaddr_storage accept_addr;
        socklen_t accept_len;
        size_t zc_threshold;
        /* links with frames read ahead still to hand over, each counted in
         * its inflight as if a receive were out */
        uint32_t *more;
        unsigned n_more;
} UringData;

static int ur_init(Net *n) {
        UringData *u = calloc(1, sizeof *u);
        int r;

        if (!u)
                return -ENOMEM;
        /* Every link keeps a receive in flight, and a send: room for all
         * their completions, so none is ever dropped. */
        struct io_uring_params p = { .flags = IORING_SETUP_CQSIZE,
                                     .cq_entries = MAX(1024u, 4 * n->cfg.max_links) };
        /* Completions wait for our next call into the kernel instead of
         * interrupting whatever the thread computes (5.19 and later; the
         * flag tells when one is waiting). */
        struct io_uring_params coop = p;
        coop.flags |= IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
        r = io_uring_queue_init_params(512, &u->ring, &coop);
        if (r == -EINVAL)
                r = io_uring_queue_init_params(512, &u->ring, &p);
        if (r < 0) {
                free(u);
                return r;
        }
        /* An old kernel may have io_uring without the operations used here:
         * then this backend is not available and the caller falls back. */
        struct io_uring_probe *probe = io_uring_get_probe_ring(&u->ring);
        static const int needed[] = { IORING_OP_ACCEPT, IORING_OP_RECV, IORING_OP_SEND, IORING_OP_SENDMSG };
        bool ok = probe != NULL, zc = false;
        for (size_t i = 0; ok && i < ELEMENTSOF(needed); i++)
                ok = io_uring_opcode_supported(probe, needed[i]);
        if (probe) {
                zc = io_uring_opcode_supported(probe, IORING_OP_SEND_ZC);
                io_uring_free_probe(probe);
        }
        if (!ok) {
                io_uring_queue_exit(&u->ring);
                free(u);
                return -EOPNOTSUPP;
        }
        /* On loopback the kernel copies zero-copy sends anyway and plain SEND
         * is faster (measured: see README), so auto means "not on loopback". */
        u->zc_threshold = zc ? n->cfg.zc_threshold : 0;
        /* a link is in it once, but may come back while the list is served */
        u->more = calloc(2 * (size_t)n->cfg.max_links, sizeof *u->more);
        if (!u->more) {
                io_uring_queue_exit(&u->ring);
                free(u);
                return -ENOMEM;
        }
        n->backend_data = u;
        return 0;
}

static void ur_fini(Net *n) {
        UringData *u = n->backend_data;
        if (!u)
                return;
        io_uring_queue_exit(&u->ring);
        free(u->more);
        free(u);
        n->backend_data = NULL;
}

static struct io_uring_sqe *get_sqe(UringData *u) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe) {
                io_uring_submit(&u->ring);
                sqe = io_uring_get_sqe(&u->ring);
        }
        return sqe;
}

static int submit_accept(Net *n) {
        UringData *u = n->backend_data;
        struct io_uring_sqe *sqe = get_sqe(u);
        if (!sqe)
                return -EBUSY;
        u->accept_len = sizeof u->accept_addr;
        io_uring_prep_accept(sqe, n->listen_fd, (struct sockaddr *)&u->accept_addr, &u->accept_len, SOCK_CLOEXEC);
        io_uring_sqe_set_data64(sqe, UD(OP_ACCEPT, 0));
        return 0;
}

static int ur_resume_accept(Net *n) {
        return submit_accept(n);
}

static int ur_add_listener(Net *n, int fd) {
        int saved = n->listen_fd, r;
        n->listen_fd = fd; /* submit_accept reads it */
        r = submit_accept(n);
        n->listen_fd = saved;
        return r;
}

static int submit_recv(Net *n, Link *l) {
        UringData *u = n->backend_data;
        struct io_uring_sqe *sqe = get_sqe(u);
        uint8_t *p;
        size_t want;

        if (!sqe)
                return -EBUSY;
        link_rx_target(l, &p, &want);
        io_uring_prep_recv(sqe, l->fd, p, want, 0);
        io_uring_sqe_set_data64(sqe, UD(OP_RECV, l->slot));
        l->inflight++;
        return 0;
}

/* The next receive; or, while frames read ahead wait, a place in the list
 * the next ur_wait() hands them over from: one frame to the application
 * per call, as one receive would bring, and what it queued in answer
 * goes out first. */
static int submit_rx(Net *n, Link *l) {
        UringData *u = n->backend_data;

        if (!link_rx_pending(l))
                return submit_recv(n, l);
        u->more[u->n_more++] = l->slot;
        l->inflight++;
        return 0;
}

/* The link took bytes (r: what it said): its next receive, or closed. */
static void rx_continue(Net *n, Link *l, int r) {
        if (r < 0)
                net_link_close(l, r);
        else if (l->state != LINK_CLOSING && submit_rx(n, l) < 0)
                net_link_close(l, -EBUSY);
}

static void submit_send(Net *n, Link *l) {
        UringData *u = n->backend_data;
        struct io_uring_sqe *sqe;

        if (l->tx_busy || l->state == LINK_CLOSING || !link_tx_prepare(l))
                return;
        sqe = get_sqe(u);
        if (!sqe)
                return; /* retried on the next completion */

        size_t zc = u->zc_threshold == NET_ZC_AUTO ? 0 : u->zc_threshold; /* auto: never (net.h) */
        if (l->iovcnt == 1 && zc && l->iov[0].iov_len >= zc) {
                l->tx_zc_pending++; /* until its notification */
                io_uring_prep_send_zc(sqe, l->fd, l->iov[0].iov_base, l->iov[0].iov_len, MSG_NOSIGNAL, 0);
                io_uring_sqe_set_data64(sqe, UD(OP_SEND_ZC, l->slot));
        } else if (l->iovcnt == 1) {
                io_uring_prep_send(sqe, l->fd, l->iov[0].iov_base, l->iov[0].iov_len, MSG_NOSIGNAL);
                io_uring_sqe_set_data64(sqe, UD(OP_SEND, l->slot));
        } else {
                /* the link's own msghdr: it lives as long as the request */
                l->msg = (struct msghdr){ .msg_iov = l->iov, .msg_iovlen = (size_t)l->iovcnt };
                io_uring_prep_sendmsg(sqe, l->fd, &l->msg, MSG_NOSIGNAL);
                io_uring_sqe_set_data64(sqe, UD(OP_SEND, l->slot));
        }
        l->tx_busy = true;
        l->inflight++;
}

static int ur_add_link(Net *n, Link *l) {
        int r = submit_recv(n, l);
        if (r < 0)
                return r;
        submit_send(n, l);
        return 0;
}

static void ur_kick_send(Net *n, Link *l) {
        if (!l->dialing) /* its frames go once the connection is up */
                submit_send(n, l);
}

static void ur_close_link(Net *n, Link *l) {
        /* Pending receives and sends complete (with 0 or an error) once the
         * socket is shut down; the link is released when the last one is in. */
        shutdown(l->fd, SHUT_RDWR);
}

/* After a link's completion: released once closed and nothing is in
 * flight, else its next send. */
static void settle(Net *n, Link *l) {
        if (l->state == LINK_CLOSING) {
                if (l->inflight == 0)
                        net_link_released(l);
        } else
                submit_send(n, l);
}

static void handle_cqe(Net *n, struct io_uring_cqe *cqe) {
        uint64_t ud = io_uring_cqe_get_data64(cqe);
        int op = UD_OP(ud), res = cqe->res;

        if (op == OP_ACCEPT) {
                if (res >= 0) {
                        UringData *u = n->backend_data;
                        net_accept_fd(n, res, &u->accept_addr);
                }
                /* Out of descriptors: the core pauses accepting for a while
                 * instead of spinning on the error. */
                if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM)
                        net_accept_pause(n);
                else if (n->listen_fd >= 0)
                        submit_accept(n);
                return;
        }

        Link *l = UD_SLOT(ud) < n->cfg.max_links ? n->links[UD_SLOT(ud)] : NULL;
        if (!l)
                return;

        switch (op) {
        case OP_RECV:
                l->inflight--;
                if (l->state == LINK_CLOSING)
                        break;
                if (res < 0)
                        net_link_close(l, res == -EINTR ? -ECONNRESET : res);
                else {
                        rx_continue(n, l, link_rx_done(l, (size_t)res));
                }
                break;
        case OP_SEND:
        case OP_SEND_ZC:
                if (op == OP_SEND_ZC && (cqe->flags & IORING_CQE_F_NOTIF)) {
                        /* the kernel no longer needs that send's buffer */
                        l->tx_zc_pending--;
                        l->inflight--;
                        break;
                }
                if (op == OP_SEND_ZC && !(cqe->flags & IORING_CQE_F_MORE))
                        l->tx_zc_pending--; /* no notification follows */
                if (!(op == OP_SEND_ZC && (cqe->flags & IORING_CQE_F_MORE)))
                        l->inflight--;
                l->tx_busy = false;
                if (l->state == LINK_CLOSING)
                        break;
                if (res < 0)
                        net_link_close(l, res);
                else
                        link_tx_done(l, (size_t)res);
                break;
        }
        settle(n, l);
}

/* Frames read ahead: one more to the application from each link that had
 * them when the call began. */
static void hand_over(Net *n) {
        UringData *u = n->backend_data;
        unsigned k = u->n_more;

        for (unsigned i = 0; i < k; i++) {
                Link *l = n->links[u->more[i]];
                l->inflight--;
                if (l->state != LINK_CLOSING)
                        rx_continue(n, l, link_rx_more(l));
                settle(n, l);
        }
        u->n_more -= k;
        memmove(u->more, u->more + k, u->n_more * sizeof *u->more);
}

static int ur_wait(Net *n, int timeout_ms) {
        UringData *u = n->backend_data;
        struct __kernel_timespec ts = { .tv_sec = timeout_ms / 1000, .tv_nsec = (timeout_ms % 1000) * 1000000L };
        struct io_uring_cqe *cqe;
        unsigned head, count = u->n_more;
        int r;

        hand_over(n);
        if (timeout_ms == 0 || u->n_more) {
                /* A look, not a wait: submit what is queued and take what
                 * has completed, without a timer or a trip through the
                 * scheduler (a busy pipeline stage calls this between every
                 * two units of work). */
                r = io_uring_submit(&u->ring);
                if (IO_URING_READ_ONCE(*u->ring.sq.kflags) & IORING_SQ_TASKRUN)
                        io_uring_get_events(&u->ring);
        } else
                r = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1, timeout_ms > 0 ? &ts : NULL, NULL);
        if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY)
                return r;
        /* Drain in batches: handlers may queue more work and complete more. */
        for (int batch = 0; batch < 8; batch++) {
                unsigned seen = 0;
                io_uring_for_each_cqe(&u->ring, head, cqe) {
                        handle_cqe(n, cqe);
                        seen++;
                }
                io_uring_cq_advance(&u->ring, seen);
                count += seen;
                if (!seen)
                        break;
                io_uring_submit(&u->ring);
        }
        io_uring_submit(&u->ring);
        return (int)count;
}

const NetBackend net_backend_uring = {
        .name = "io_uring",
        .init = ur_init,
        .fini = ur_fini,
        .add_listener = ur_add_listener,
        .add_link = ur_add_link,
        .kick_send = ur_kick_send,
        .close_link = ur_close_link,
        .resume_accept = ur_resume_accept,
        .wait = ur_wait,
};
