/* net/link.c — one link's protocol: the handshake, then protected frames;
 * receiving into the right buffer piece by piece and sending the queue frame
 * by frame. No I/O here: the backends move the bytes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net-internal.h"

static void rx_expect(Link *l, RxPhase phase, uint8_t *dst, size_t want);
static void tx_finish_all(Link *l, TxItem *i, bool out);

/* Frames of at most this payload are sealed, or in plaintext copied, into
 * the stage one after another, up to TX_BATCH bytes a send: a stream of
 * small frames would otherwise cost a send, a system call or an io_uring
 * operation, per frame. Larger plaintext chunks go from where they are. */
#define TX_SMALL (128u << 10)
#define TX_BATCH (896u << 10)

/* The stage holds the largest frame after a TENSOR frame (a tensor of one
 * chunk, an all-reduce's piece, goes in one send), or a batch of small
 * frames. */
static size_t stage_size(const NetConfig *c) {
        size_t frame = MAX((size_t)c->chunk, MAX((size_t)c->limits.max_control, (size_t)HANDSHAKE_MAX_SIZE));
        size_t desc = FRAME_HEADER_SIZE + TENSOR_DESC_MAX_SIZE + FRAME_TAG_SIZE;
        return MAX(desc + FRAME_HEADER_SIZE + frame + FRAME_TAG_SIZE, TX_BATCH + FRAME_HEADER_SIZE + TX_SMALL + FRAME_TAG_SIZE);
}

/* Streams of small frames are read ahead: after two DATA frames in a row
 * of at most RX_SMALL, up to RX_AHEAD bytes a receive into a buffer of the
 * link's (its pages touched only as bytes come), from which the header,
 * payload and tag of as many frames as came are copied to where they go.
 * After a larger DATA frame the link reads piece by piece again, a payload
 * straight into its tensor (an all-reduce's last, shorter piece does not
 * turn reading ahead on). */
#define RX_SMALL (128u << 10)
#define RX_AHEAD (512u << 10)


int link_init(Link *l, Net *n, int fd, bool initiator, bool loopback, uint32_t hello_flags) {
        const NetConfig *c = &n->cfg;
        HandshakeConfig hc = {
                .identity = &n->identity,
                .secret = c->secret ? n->secret : NULL,
                .allowed = (const uint8_t(*)[IDENTITY_PK_SIZE])n->allowed,
                .n_allowed = c->n_allowed,
                .ciphers = (cipher_available() & (c->ciphers ? c->ciphers : ~0u)) | hello_flags,
        };
        int r;

        memset(l, 0, sizeof *l);
        l->net = n;
        l->fd = fd;
        l->initiator = initiator;
        l->loopback = loopback;
        l->state = LINK_HANDSHAKE;
        /* Plaintext only where both ends asked for it and the link is local. */
        if (c->plaintext && l->loopback)
                hc.ciphers |= CIPHER_BIT(CIPHER_NONE);
        r = handshake_init(&l->hs, &hc, initiator);
        if (r < 0)
                return r;
        l->ctl = malloc(MAX((size_t)c->limits.max_control, (size_t)HANDSHAKE_MAX_SIZE));
        l->stage_cap = stage_size(c);
        l->stage = malloc(l->stage_cap);
        if (!l->ctl || !l->stage)
                return -ENOMEM;
        rx_expect(l, RX_HEADER, l->hdr, FRAME_HEADER_SIZE);
        l->last_frame_ns = l->last_bytes_ns = l->last_sent_ns = net_now_ns();
        l->deadline_ns = l->last_frame_ns + (uint64_t)c->handshake_timeout_ms * 1000000ULL;
        return 0;
}

static void rx_tensor_drop(Link *l) {
        Net *n = l->net;
        if (!l->rx_active)
                return;
        if (l->rx_slot) { /* a lane's part: the link's slot owns the buffer */
                l->rx_active = false;
                l->rx_slot = NULL;
                l->rx.data = NULL;
                return;
        }
        if (!l->rx_uncounted)
                n->rx_bytes -= l->rx.desc.bytes;
        if (bufpool_owns(n->pool, l->rx.data))
                bufpool_free(n->pool, l->rx.data, l->rx.desc.bytes);
        else
                free(l->rx.data);
        l->rx_active = false;
        l->rx.data = NULL;
}

void link_rx_uncount(Link *l) {
        if (l->rx_active && !l->rx_slot && !l->rx_uncounted) {
                l->net->rx_bytes -= l->rx.desc.bytes;
                l->rx_uncounted = true;
        }
}

void link_destroy(Link *l) {
        TxItem *out = l->tx_out, *head = l->tx_head;

        rx_tensor_drop(l);
        /* Detach the queue first: a sent() callback may try to queue more. */
        l->tx_out = l->tx_out_tail = l->tx_head = l->tx_tail = NULL;
        tx_finish_all(l, out, false);
        tx_finish_all(l, head, false);
        lanes_unref(l);
        handshake_clear(&l->hs);
        seal_clear(&l->seal);
        free(l->ctl);
        free(l->stage);
        free(l->ahead);
        if (l->fd >= 0)
                close(l->fd);
        l->fd = -1;
}

static void tx_push(Link *l, TxItem *i) {
        i->next = NULL;
        if (l->tx_tail)
                l->tx_tail->next = i;
        else
                l->tx_head = i;
        l->tx_tail = i;
}

int link_queue_tensor(Link *l, uint32_t stream, const TensorDesc *desc, const void *data, uint64_t cookie) {
        TxItem *i = calloc(1, sizeof *i);
        if (!i)
                return -ENOMEM;
        i->type = FRAME_TENSOR;
        i->stream = stream;
        i->desc = *desc;
        i->data = data;
        i->cookie = cookie;
        tx_push(l, i);
        l->queued += desc->bytes;
        return 0;
}

void link_queue_item(Link *l, TxItem *i, uint64_t bytes) {
        tx_push(l, i);
        l->queued += bytes;
}

int link_queue_control(Link *l, uint8_t type, const void *payload, size_t len) {
        TxItem *i = malloc(sizeof *i + len);
        if (!i)
                return -ENOMEM;
        memset(i, 0, sizeof *i);
        i->type = type;
        i->len = len;
        if (len)
                memcpy(i->payload, payload, len);
        if (l->bundle)
                lanes_number(l->bundle, i);
        tx_push(l, i);
        l->queued += len;
        return 0;
}

/* Queue whatever the handshake has to say next. */
static int handshake_flush(Link *l) {
        uint8_t type, buf[HANDSHAKE_MAX_SIZE];
        int n = handshake_next(&l->hs, &type, buf, sizeof buf);
        if (n <= 0)
                return n;
        return link_queue_control(l, type, buf, (size_t)n);
}

int link_start(Link *l) {
        return l->initiator ? handshake_flush(l) : 0;
}

/* The handshake is done: derive the link keys. */
static int link_key(Link *l) {
        Cipher c;
        uint8_t tx[SEAL_KEY_SIZE], rx[SEAL_KEY_SIZE];
        int r;

        handshake_result(&l->hs, &c, tx, rx, l->peer_id);
        /* The plaintext mode needs loopback at this end too, whatever the
         * peer offered (link_init offers it only there). */
        if (c == CIPHER_NONE && !(l->net->cfg.plaintext && l->loopback))
                return -EACCES;
        r = seal_init(&l->seal, c, tx, rx);
        sodium_memzero(tx, sizeof tx);
        sodium_memzero(rx, sizeof rx);
        if (r < 0)
                return r;
        l->keyed = true;
        handshake_clear(&l->hs);
        return 0;
}

void link_describe(const Link *l, NetPeerInfo *ret) {
        *ret = (NetPeerInfo){ .open = l->opened, .reached = l->reached, .timeout = l->timeout,
                              .peer_version = l->peer_version };
        memcpy(ret->address, l->address, sizeof ret->address);
        if (l->opened || l->keyed) { /* keys derived: the peer proved peer_id (also once closing) */
                ret->key_known = true;
                memcpy(ret->key, l->peer_id, IDENTITY_PK_SIZE);
        } else if (l->hs.peer_key_known) { /* signed, then refused */
                ret->key_known = true;
                memcpy(ret->key, l->hs.peer_key, IDENTITY_PK_SIZE);
        }
}

void link_announce(Link *l) {
        Net *n = l->net;
        if (!l->initiator)
                n->stats.links_in++;
        if (n->cb.connected)
                n->cb.connected(n->userdata, l->id, l->peer_id);
}

/* Open; the application hears of it now, or once every lane is. */
static void connected(Link *l) {
        l->state = LINK_OPEN;
        l->opened = true;
        if (l->bundle)
                lanes_opened(l);
        else if (!l->lane_pending)
                link_announce(l);
}

static void link_stop_waiting(Link *l) {
        Net *n = l->net;
        l->relay_waiting = false;
        l->last_frame_ns = l->last_sent_ns = l->last_bytes_ns;
        l->deadline_ns = l->last_frame_ns + (uint64_t)n->cfg.handshake_timeout_ms * 1000000ULL;
        if (n->relay_waiter == l->id)
                n->relay_waiter = 0;
        n->relay_retry_ns = 0;
}

/* Where the piece being received (header, payload or tag) goes next. */
static void rx_piece_target(Link *l, uint8_t **ret_ptr, size_t *ret_len) {
        *ret_ptr = l->rx_dst + l->rx_have;
        *ret_len = l->rx_want - l->rx_have;
}

/* Whether the next receive reads ahead. Only a receive changes what it
 * depends on, so the completion sees what the request saw. */
static bool rx_reads_ahead(const Link *l) {
        return l->ahead && l->rx_small >= 2;
}

void link_rx_target(Link *l, uint8_t **ret_ptr, size_t *ret_len) {
        if (rx_reads_ahead(l)) {
                *ret_ptr = l->ahead;
                *ret_len = RX_AHEAD;
        } else
                rx_piece_target(l, ret_ptr, ret_len);
}

static void rx_expect(Link *l, RxPhase phase, uint8_t *dst, size_t want) {
        l->phase = phase;
        l->rx_dst = dst;
        l->rx_want = want;
        l->rx_have = 0;
}

/* A frame's header is in: check it and decide where its payload goes. */
static int rx_header(Link *l) {
        Net *n = l->net;
        FrameHeader *h = &l->h;
        int r;

        r = frame_header_decode(l->hdr, &n->cfg.limits, h);
        if (r == -EPROTO) { /* a ravnest frame of another version */
                l->peer_version = l->hdr[4];
                return -EPROTONOSUPPORT;
        }
        if (r == -EMSGSIZE)
                return r;
        if (r < 0)
                return -EBADMSG;

        if (l->state == LINK_HANDSHAKE) {
                if (!frame_type_is_handshake(h->type) || h->seq != 0 || h->stream != 0 ||
                    h->length > HANDSHAKE_MAX_SIZE)
                        return -EBADMSG;
                rx_expect(l, RX_PAYLOAD, l->ctl, h->length);
                return 0;
        }
        if (frame_type_is_handshake(h->type) || seal_check_seq(&l->seal, h) < 0)
                return -EBADMSG; /* replayed, reordered or dropped frames end here */
        if (l->state == LINK_WAIT_WELCOME && h->type != FRAME_WELCOME)
                return -EBADMSG;

        if (h->offset != 0 && h->type != FRAME_DATA && !l->bundle)
                return -EBADMSG; /* numbered: only on a link of several lanes */
        if (h->type == FRAME_DATA)
                l->rx_small = h->length > RX_SMALL ? 0 : MIN(l->rx_small + 1, 2);
        if (l->rx_small >= 2 && !l->ahead)
                l->ahead = malloc(RX_AHEAD); /* none: read piece by piece */
        if (l->lane_pending && h->type != FRAME_LANE)
                return -EBADMSG;
        if (h->type == FRAME_DATA && l->bundle) {
                if (!lanes_rx_chunk(l, h))
                        return -EBADMSG;
                rx_expect(l, RX_PAYLOAD, l->rx.data + h->offset, h->length);
                l->rx_records = seal_streams(&l->seal);
                if (l->rx_records && seal_open_begin(&l->seal, l->hdr, h) < 0)
                        return -EBADMSG;
        } else if (h->type == FRAME_DATA) {
                /* An empty chunk would let a peer hold a tensor open forever. */
                if (!l->rx_active || h->stream != l->rx.stream || h->offset != l->rx_got || h->length == 0 ||
                    h->length > l->rx.desc.bytes - l->rx_got)
                        return -EBADMSG;
                /* Straight into the tensor's buffer: no copy on the way;
                 * opened there as it comes in, where the cipher allows. */
                rx_expect(l, RX_PAYLOAD, l->rx.data + h->offset, h->length);
                l->rx_records = seal_streams(&l->seal);
                if (l->rx_records && seal_open_begin(&l->seal, l->hdr, h) < 0)
                        return -EBADMSG;
        } else {
                /* on a lane, a TENSOR frame ends its part of the item before */
                if (h->type == FRAME_TENSOR &&
                    ((l->rx_active && !l->bundle) || h->length > TENSOR_DESC_MAX_SIZE + (l->bundle ? 4 : 0)))
                        return -EBADMSG;
                rx_expect(l, RX_PAYLOAD, l->ctl, h->length);
        }
        return 0;
}

static int rx_tensor_begin(Link *l, const uint8_t *p, size_t len) {
        Net *n = l->net;
        TensorDesc d;
        int r = tensor_desc_decode(p, len, n->cfg.limits.max_tensor_bytes, &d);
        if (r < 0)
                return r;
        /* All links together hold at most max_receive_bytes of tensors not
         * yet delivered. */
        if ((r = net_rx_room(n, l, d.bytes)) < 0)
                return r;
        l->rx = (NetTensor){ .peer = l->id, .stream = l->h.stream, .desc = d };
        l->rx.data = bufpool_alloc(n->pool, d.bytes);
        if (!l->rx.data)
                l->rx.data = malloc(MAX(d.bytes, (uint64_t)1));
        if (!l->rx.data)
                return -ENOMEM;
        n->rx_bytes += d.bytes;
        l->rx_begun_ns = l->rx_progress_ns = net_now_ns();
        l->rx_uncounted = false;
        l->rx_active = true;
        l->rx_got = 0;
        return 0;
}

static void rx_tensor_deliver(Link *l) {
        Net *n = l->net;
        NetTensor *t = malloc(sizeof *t);
        if (!t) {
                rx_tensor_drop(l);
                return;
        }
        *t = l->rx;
        l->rx_active = false;
        l->rx.data = NULL;
        if (!l->rx_uncounted)
                n->rx_bytes -= t->desc.bytes;
        if (n->cb.tensor)
                n->cb.tensor(n->userdata, t);
        else
                net_tensor_release(n, t);
}

/* A whole frame is in (and authenticated, once keyed). */
static int rx_frame(Link *l) {
        Net *n = l->net;
        FrameHeader *h = &l->h;
        int r;

        n->stats.frames_received++;
        l->last_frame_ns = net_now_ns();

        if (l->state == LINK_HANDSHAKE) {
                r = handshake_recv(&l->hs, h->type, l->ctl, h->length);
                if (r < 0)
                        return r;
                r = handshake_flush(l);
                if (r < 0)
                        return r;
                if (!handshake_done(&l->hs))
                        return 0;
                uint32_t offered = l->hs.offered;
                uint8_t nonce[HANDSHAKE_NONCE_SIZE];
                memcpy(nonce, l->hs.hello + 4 + 32, sizeof nonce);
                r = link_key(l);
                if (r < 0)
                        return r;
                if (!l->initiator && (r = lanes_accept(l, offered, nonce)) < 0)
                        return r;
                if (l->initiator) {
                        l->state = LINK_WAIT_WELCOME;
                        return 0;
                }
                /* Responder: confirm the keys with the first protected frame. */
                r = link_queue_control(l, FRAME_WELCOME, NULL, 0);
                if (r < 0)
                        return r;
                connected(l);
                return 0;
        }

        switch (h->type) {
        case FRAME_WELCOME:
                if (l->state != LINK_WAIT_WELCOME || h->length != 0)
                        return -EBADMSG;
                connected(l);
                return 0;
        case FRAME_TENSOR:
                if (l->bundle)
                        return lanes_rx_part(l, h, l->ctl, h->length);
                r = rx_tensor_begin(l, l->ctl, h->length);
                if (r < 0)
                        return r == -EMSGSIZE || r == -ENOMEM || r == -ENOBUFS ? r : -EBADMSG;
                if (l->rx.desc.bytes == 0)
                        rx_tensor_deliver(l);
                return 0;
        case FRAME_DATA:
                l->rx_progress_ns = l->last_frame_ns;
                if (l->bundle)
                        return lanes_rx_chunk_done(l, h);
                l->rx_got += h->length;
                if (l->rx_got == l->rx.desc.bytes) {
                        if (!(h->flags & FRAME_FLAG_LAST))
                                return -EBADMSG;
                        rx_tensor_deliver(l);
                } else if (h->flags & FRAME_FLAG_LAST)
                        return -EBADMSG;
                return 0;
        case FRAME_HEARTBEAT:
                return 0;
        case FRAME_BYE:
                if (l->bundle)
                        l->bundle->ending = true;
                return -ESHUTDOWN;
        case FRAME_LANE:
                return lanes_rx_lane(l, l->ctl, h->length);
        case FRAME_ACK:
                return lanes_rx_ack(l, l->ctl, h->length);
        case FRAME_PLAN:
        case FRAME_CONTROL:
                if (l->bundle)
                        return lanes_rx_item(l, h, l->ctl);
                if (n->cb.control)
                        n->cb.control(n->userdata, l->id, h->type, l->ctl, h->length);
                return 0;
        default:
                return -EBADMSG;
        }
}

static int rx_piece_done(Link *l) {
        int r;

        switch (l->phase) {
        case RX_HEADER:
                r = rx_header(l);
                if (r < 0)
                        return r;
                if (l->rx_want > 0)
                        return 0;
                /* an empty payload: on to the tag */
                /* fall through */
        case RX_PAYLOAD:
                if (l->keyed && seal_tag_size(&l->seal)) {
                        rx_expect(l, RX_TAG, l->tag, FRAME_TAG_SIZE);
                        return 0;
                }
                /* fall through */
        case RX_TAG:
                if (l->rx_records) {
                        l->rx_records = false;
                        if (seal_open_end(&l->seal, l->tag) < 0)
                                return -EBADMSG;
                } else if (l->keyed) {
                        uint8_t *payload = l->h.type == FRAME_DATA ? l->rx.data + l->h.offset : l->ctl;
                        if (seal_open(&l->seal, l->hdr, &l->h, payload, l->h.length, l->tag) < 0)
                                return -EBADMSG;
                }
                rx_expect(l, RX_HEADER, l->hdr, FRAME_HEADER_SIZE);
                /* all but the chunks before a tensor's last may reach the application */
                l->rx_told = l->h.type != FRAME_HEARTBEAT && (l->h.type != FRAME_DATA || l->h.flags & FRAME_FLAG_LAST);
                return rx_frame(l);
        }
        return -EINVAL;
}

/* n bytes arrived at the piece's target. */
static int rx_arrived(Link *l, size_t n) {
        if (l->rx_records && l->phase == RX_PAYLOAD && seal_open_update(&l->seal, l->rx_dst + l->rx_have, n) < 0)
                return -EBADMSG;
        l->rx_have += n;
        /* Pieces of zero bytes complete at once: loop until more input is needed. */
        while (l->rx_have == l->rx_want) {
                int r = rx_piece_done(l);
                if (r < 0)
                        return r;
                if (l->state == LINK_CLOSING)
                        return 0;
                if (l->rx_want > 0)
                        break;
        }
        return 0;
}

int link_rx_done(Link *l, size_t n) {
        if (n == 0)
                return -ECONNRESET;
        l->net->stats.bytes_received += n;
        l->last_bytes_ns = net_now_ns();
        if (l->relay_waiting) /* a peer came through the relay: a link from now on, and another waits */
                link_stop_waiting(l);
        if (!rx_reads_ahead(l))
                return rx_arrived(l, n);
        l->rx_told = false;
        l->ahead_at = 0;
        l->ahead_len = n;
        return link_rx_more(l);
}

/* The bytes read ahead to the pieces they belong to, frame after frame,
 * until a frame reaches the application: what it queues in answer can go
 * out before the frames after it are handled. */
int link_rx_more(Link *l) {
        while (link_rx_pending(l)) {
                uint8_t *dst;
                size_t want, n = l->ahead_len - l->ahead_at;
                rx_piece_target(l, &dst, &want);
                want = MIN(want, n);
                memcpy(dst, l->ahead + l->ahead_at, want);
                l->ahead_at += want;
                int r = rx_arrived(l, want);
                if (r < 0)
                        return r;
                if (l->rx_told) {
                        l->rx_told = false;
                        break;
                }
        }
        return 0;
}

bool link_rx_pending(const Link *l) {
        return l->ahead_at < l->ahead_len && l->state != LINK_CLOSING;
}

/* A sent item's callbacks: sent() for a tensor (once every lane's part is
 * out, on a link of several), the node's BYE once it is on the wire. */
static void tx_finish(Link *l, TxItem *i, bool out) {
        Net *net = l->net;
        if (i->shared)
                lanes_part_sent(net, l, i);
        else if (i->type == FRAME_TENSOR && net->cb.sent)
                net->cb.sent(net->userdata, l->id, i->cookie);
        if (out && i->type == FRAME_BYE)
                net_link_bye_sent(l);
        free(i);
}

static void tx_finish_all(Link *l, TxItem *i, bool out) {
        for (TxItem *next; i; i = next) {
                next = i->next;
                tx_finish(l, i, out);
        }
}

/* The head item's last frame is built: off the queue, onto the list of
 * those whose callbacks wait for the send that carries it. */
static void tx_retire(Link *l) {
        TxItem *i = l->tx_head;
        l->tx_head = i->next;
        if (!l->tx_head)
                l->tx_tail = NULL;
        i->next = NULL;
        *(l->tx_out_tail ? &l->tx_out_tail->next : &l->tx_out) = i;
        l->tx_out_tail = i;
}

/* The send is out: the callbacks of the items it finished. */
static void tx_release(Link *l) {
        TxItem *i = l->tx_out;
        l->tx_out = l->tx_out_tail = NULL;
        tx_finish_all(l, i, true);
}

/* The head item is done without a frame (a lane's part with no chunk left
 * to take): off the queue now. */
static void tx_pop(Link *l) {
        tx_retire(l);
        tx_release(l);
}

/* A DATA frame larger than this is sealed a record at a time into the
 * stage, each record just before it is sent, so the bytes the kernel copies
 * out are still in the cache (a sealed megabyte is not, by then). */
#define SEAL_RECORD (1024u << 10)

/* The next record of the frame being sealed, into the stage at `at`; the
 * tag after the last. Returns the stage's bytes. */
static size_t tx_record(Link *l, size_t at) {
        size_t n = MIN((size_t)SEAL_RECORD, l->seal.tx_left);
        seal_update(&l->seal, l->stage + at, l->tx_src, n);
        l->tx_src += n;
        at += n;
        if (!l->seal.tx_left) {
                seal_end(&l->seal, l->stage + at);
                at += FRAME_TAG_SIZE;
        }
        return at;
}

/* The item at the head of the queue if it may send a frame now. */
static TxItem *tx_next(Link *l) {
        TxItem *i = l->tx_head;
        /* a lane's item of a tensor whose chunks other lanes took: done */
        while (i && i->shared && !i->claimed && !lanes_claim(i)) {
                tx_pop(l);
                i = l->tx_head;
        }
        /* Before the handshake is done only handshake frames may go. */
        if (!i || (!l->keyed && !frame_type_is_handshake(i->type)))
                return NULL;
        /* an item of a link of lanes starts inside the peer's window */
        if (!(i->type == FRAME_TENSOR && i->desc_sent) && !lanes_may_start(l, i))
                return NULL;
        return i;
}

/* Item i's next DATA frame at hdr: sealed after it, or a large plaintext
 * chunk left where it is (l->iov[1], *ret_ref), or the first record of a
 * chunk sealed in records (*ret_ref: the chunk is read until its last).
 * Returns the stage's bytes from hdr on, 0 if it does not fit in room. */
static size_t tx_data(Link *l, TxItem *i, FrameHeader *h, uint8_t *hdr, size_t room, bool *ret_ref) {
        uint64_t len = MIN((uint64_t)(i->numbered ? i->stripe : l->net->cfg.chunk), i->desc.bytes - i->offset);
        const uint8_t *src = i->data + i->offset;

        h->type = FRAME_DATA;
        h->offset = i->offset;
        h->flags = i->offset + len == i->desc.bytes ? FRAME_FLAG_LAST : 0;
        if (l->seal.cipher == CIPHER_NONE && len > TX_SMALL) {
                if (FRAME_HEADER_SIZE > room)
                        return 0;
                h->length = (uint32_t)len;
                h->seq = l->seal.tx_seq++;
                frame_header_encode(h, hdr);
                l->iov[1] = (struct iovec){ (void *)src, len };
                l->iovcnt = 2;
                *ret_ref = true;
                return FRAME_HEADER_SIZE;
        }
        if (seal_streams(&l->seal) && len > SEAL_RECORD) {
                if (hdr != l->stage)
                        return 0; /* it starts a send of its own */
                seal_begin(&l->seal, h, hdr, len);
                l->tx_src = src;
                *ret_ref = true;
                return tx_record(l, FRAME_HEADER_SIZE);
        }
        if (FRAME_HEADER_SIZE + len + seal_tag_size(&l->seal) > room)
                return 0;
        seal_frame_to(&l->seal, h, hdr, hdr + FRAME_HEADER_SIZE, src, len, hdr + FRAME_HEADER_SIZE + len);
        return FRAME_HEADER_SIZE + len + seal_tag_size(&l->seal);
}

/* Item i's next frame into the stage at `at`. Returns its bytes there, 0
 * if it does not fit. */
static size_t tx_build(Link *l, TxItem *i, size_t at, bool *ret_ref) {
        FrameHeader h = { .type = i->type, .stream = i->stream, .offset = i->numbered ? i->seq : 0 };
        uint8_t *hdr = l->stage + at, *body = hdr + FRAME_HEADER_SIZE;
        uint8_t desc[TENSOR_DESC_MAX_SIZE + 4];
        const uint8_t *src = i->payload;
        size_t len = i->len, room = l->stage_cap - at;

        if (i->type == FRAME_TENSOR && i->desc_sent)
                return tx_data(l, i, &h, hdr, room, ret_ref);
        if (i->type == FRAME_TENSOR) {
                len = tensor_desc_encode(&i->desc, desc);
                if (i->numbered) { /* a lane's part: the stripe size after the descriptor */
                        put_le32(desc + len, i->stripe);
                        len += 4;
                }
                src = desc;
        }
        if (FRAME_HEADER_SIZE + len + FRAME_TAG_SIZE > room)
                return 0;
        if (!frame_type_is_handshake(i->type)) {
                seal_frame_to(&l->seal, &h, hdr, body, src, len, body + len);
                return FRAME_HEADER_SIZE + len + seal_tag_size(&l->seal);
        }
        /* handshake: in the clear, seq 0 (the initiator's AUTH goes out
         * after its keys exist) */
        h.length = (uint32_t)len;
        frame_header_encode(&h, hdr);
        memcpy(body, src, len);
        return FRAME_HEADER_SIZE + len;
}

/* Item i's frame is built (or, *_ref frames, sent): on to its next, or off
 * the queue. */
static void tx_advance(Link *l, TxItem *i) {
        if (i->type != FRAME_TENSOR)
                l->queued -= i->len;
        else if (!i->desc_sent)
                i->desc_sent = true;
        else if (i->shared) { /* a lane's chunk: the next one no lane has taken */
                lanes_chunk_sent(l, i, MIN((uint64_t)i->stripe, i->desc.bytes - i->offset));
                if (lanes_claim(i))
                        return;
                i->offset = i->desc.bytes;
        } else {
                uint64_t len = MIN((uint64_t)l->net->cfg.chunk, i->desc.bytes - i->offset);
                i->offset += len;
                l->queued -= len;
        }
        if (i->type != FRAME_TENSOR || i->offset >= i->desc.bytes)
                tx_retire(l);
}

/* The frames of the queue's head into l->iov: one, or several small ones
 * back to back. A link of several lanes sends one at a time, and moves on
 * once it is out (a lane takes its next chunk when the one before is out). */
static size_t tx_batch(Link *l) {
        size_t at = 0, k;
        TxItem *i;

        while ((i = tx_next(l)) && (k = tx_build(l, i, at, &l->tx_ref)) > 0) {
                at += k;
                l->tx_frames++;
                if (l->bundle) /* a lane's chunk moves on once it is out */
                        l->tx_ref = true;
                if (l->tx_ref)
                        break;
                tx_advance(l, i);
                if (k > FRAME_HEADER_SIZE + TX_SMALL + FRAME_TAG_SIZE || at >= TX_BATCH || i->type == FRAME_BYE)
                        break;
        }
        return at;
}

/* The next send into l->iov. */
bool link_tx_prepare(Link *l) {
        size_t at;

        if (l->tx_ready)
                return true;
        if (l->tx_zc_pending || l->state == LINK_CLOSING || l->bye_sent)
                return false;
        l->iovcnt = 1;
        if (l->seal.tx_left) /* the next record of a frame: nothing goes between */
                at = tx_record(l, 0);
        else if (l->bye_pending && l->keyed) { /* the node stops: BYE before anything still queued */
                FrameHeader h = { .type = FRAME_BYE };
                uint8_t *body = l->stage + FRAME_HEADER_SIZE;
                seal_frame_to(&l->seal, &h, l->stage, body, NULL, 0, body);
                at = FRAME_HEADER_SIZE + seal_tag_size(&l->seal);
                l->tx_frames = 1;
                l->bye_pending = false;
                l->bye_sending = true;
        } else if (!(at = tx_batch(l)))
                return false;
        l->iov[0] = (struct iovec){ l->stage, at };
        l->tx_total = at + (l->iovcnt == 2 ? l->iov[1].iov_len : 0);
        l->tx_done = 0;
        l->tx_ready = true;
        return true;
}

void link_tx_done(Link *l, size_t n) {
        Net *net = l->net;

        net->stats.bytes_sent += n;
        l->tx_done += n;
        /* Move the iovecs past what went out. */
        for (int k = 0; k < l->iovcnt && n; k++) {
                size_t take = MIN(n, l->iov[k].iov_len);
                l->iov[k].iov_base = (uint8_t *)l->iov[k].iov_base + take;
                l->iov[k].iov_len -= take;
                n -= take;
        }
        if (l->tx_done < l->tx_total)
                return;
        l->tx_ready = false;
        if (l->seal.tx_left)
                return; /* a record is out, not yet the frame */

        /* The send is out. */
        net->stats.frames_sent += l->tx_frames;
        l->tx_frames = 0;
        l->last_sent_ns = net_now_ns();
        if (l->bye_sending) { /* not from the queue */
                net_link_bye_sent(l);
                return;
        }
        if (l->tx_ref) {
                l->tx_ref = false;
                tx_advance(l, l->tx_head);
        }
        tx_release(l);
}
