/* net/lanes.c — a link carried by several TCP connections (lanes; see
 * Bundle in net-internal.h and NetConfig.lanes in net.h): joining them,
 * striping what is sent, putting back in order what arrives, closing
 * them together. */
#include <stdlib.h>
#include <string.h>

#include "net-internal.h"

static Link *lane_link(const Net *n, const Bundle *b, unsigned i) {
        return b->lane[i] ? net_link_find(n, b->lane[i]) : NULL;
}

Bundle *lanes_new(Link *primary, unsigned k, const uint8_t nonce[HANDSHAKE_NONCE_SIZE]) {
        Bundle *b = calloc(1, sizeof *b);
        if (!b)
                return NULL;
        b->refs = 1;
        b->k = k;
        b->lane[0] = primary->id;
        memcpy(b->nonce, nonce, HANDSHAKE_NONCE_SIZE);
        primary->bundle = b;
        return b;
}

void lanes_join(Link *l, Bundle *b, unsigned index) {
        l->bundle = b;
        l->lane = index;
        l->extra = index > 0;
        b->lane[index] = l->id;
        b->refs++;
}

static void slot_clear(Net *n, LaneSlot *s) {
        LaneSlot it = *s;
        *s = (LaneSlot){};
        free(it.chunks);
        if (it.used && it.type == FRAME_TENSOR) {
                if (!it.uncounted)
                        n->rx_bytes -= it.desc.bytes;
                if (bufpool_owns(n->pool, it.data))
                        bufpool_free(n->pool, it.data, it.desc.bytes);
                else
                        free(it.data);
        } else if (it.used)
                free(it.data);
}

void lanes_unref(Link *l) {
        Bundle *b = l->bundle;
        if (!b)
                return;
        l->bundle = NULL;
        if (b->lane[l->lane] == l->id)
                b->lane[l->lane] = 0;
        if (--b->refs > 0)
                return;
        for (unsigned i = 0; i < NET_LANE_WINDOW; i++)
                slot_clear(l->net, &b->slot[i]);
        free(b);
}

/* A link of several lanes stands or falls as one. */
void lanes_close(Link *l, int reason) {
        Bundle *b = l->bundle;
        for (unsigned i = 0; b && i < b->k; i++) {
                Link *o = lane_link(l->net, b, i);
                if (o && o != l && o->state != LINK_CLOSING)
                        net_link_close(o, reason);
        }
}

void lanes_rx_uncount(Net *n, Bundle *b) {
        for (unsigned i = 0; i < NET_LANE_WINDOW; i++) {
                LaneSlot *s = &b->slot[i];
                if (s->used && s->type == FRAME_TENSOR && !s->uncounted) {
                        n->rx_bytes -= s->desc.bytes;
                        s->uncounted = true;
                }
        }
}

void lanes_rx_held(const Bundle *b, uint64_t *ret_held, uint64_t *ret_left, uint64_t *ret_begun_ns) {
        uint64_t held = 0, left = 0, begun = UINT64_MAX;
        for (unsigned i = 0; i < NET_LANE_WINDOW; i++) {
                const LaneSlot *s = &b->slot[i];
                if (!s->used || s->type != FRAME_TENSOR || s->uncounted)
                        continue;
                held += s->desc.bytes;
                left += s->desc.bytes - s->got;
                begun = MIN(begun, s->begun_ns);
        }
        *ret_held = held;
        *ret_left = left;
        *ret_begun_ns = begun;
}

static void kick_all(Net *n, Bundle *b) {
        for (unsigned i = 0; i < b->k; i++) {
                Link *o = lane_link(n, b, i);
                if (o && o->state == LINK_OPEN)
                        n->backend->kick_send(n, o);
        }
}

/* Items whose parts are all in, in their order, to the application; an
 * ACK when a quarter of the window has gone. The primary may have said BYE
 * already: what the other lanes still bring came before it. */
void lanes_deliver(Net *n, Bundle *b) {
        Link *primary = lane_link(n, b, 0);
        while (b->announced && primary && (primary->state == LINK_OPEN || b->ending)) {
                LaneSlot *s = &b->slot[b->rx_next % NET_LANE_WINDOW];
                if (!s->used || !s->complete)
                        break;
                LaneSlot it = *s;
                *s = (LaneSlot){};
                b->rx_next++;
                free(it.chunks);
                it.chunks = NULL;
                if (it.type == FRAME_TENSOR) {
                        NetTensor *t = malloc(sizeof *t);
                        if (!t) {
                                slot_clear(n, &it);
                                net_link_close(primary, -ENOMEM);
                                return;
                        }
                        *t = (NetTensor){ .peer = primary->id, .stream = it.stream, .desc = it.desc, .data = it.data };
                        if (!it.uncounted)
                                n->rx_bytes -= it.desc.bytes;
                        if (n->cb.tensor)
                                n->cb.tensor(n->userdata, t);
                        else
                                net_tensor_release(n, t);
                } else {
                        if (n->cb.control)
                                n->cb.control(n->userdata, primary->id, it.type, it.data, it.len);
                        free(it.data);
                }
                primary = lane_link(n, b, 0); /* a callback may have closed it */
        }
        if (primary && primary->state == LINK_OPEN && b->rx_next - b->rx_acked >= NET_LANE_WINDOW / 4) {
                uint8_t p[8];
                put_le64(p, b->rx_next);
                if (link_queue_control(primary, FRAME_ACK, p, sizeof p) == 0) {
                        b->rx_acked = b->rx_next;
                        n->backend->kick_send(n, primary);
                }
        }
}

/* A lane is open (initiator: WELCOME came; responder: the handshake is
 * done and, for another lane, its LANE frame came): the link is announced
 * once all are. */
/* Initiator: another lane names its link (the first lane's HELLO nonce). */
static void send_lane(Net *n, Bundle *b, Link *l) {
        uint8_t p[HANDSHAKE_NONCE_SIZE + 1];
        memcpy(p, b->nonce, HANDSHAKE_NONCE_SIZE);
        p[HANDSHAKE_NONCE_SIZE] = (uint8_t)l->lane;
        if (link_queue_control(l, FRAME_LANE, p, sizeof p) < 0)
                net_link_close(l, -ENOMEM);
        else
                n->backend->kick_send(n, l);
}

void lanes_opened(Link *l) {
        Bundle *b = l->bundle;
        Net *n = l->net;
        /* The responder finds the link a lane names among its open ones: an
         * initiator's other lanes name it once its first is open, which
         * (the lanes' connections and handshakes run side by side) may be
         * before or after their own handshake is done. */
        Link *primary = lane_link(n, b, 0);
        if (l->initiator && l->extra && primary && primary->state == LINK_OPEN)
                send_lane(n, b, l);
        for (unsigned i = 1; l->initiator && !l->extra && i < b->k; i++) {
                Link *o = lane_link(n, b, i);
                if (o && o->state == LINK_OPEN)
                        send_lane(n, b, o);
        }
        if (++b->attached < b->k || !primary)
                return;
        b->announced = true;
        link_announce(primary);
        lanes_deliver(n, b);
}

/* Responder, at the end of a handshake: what the HELLO said the
 * connection is. */
int lanes_accept(Link *l, uint32_t offered, const uint8_t nonce[HANDSHAKE_NONCE_SIZE]) {
        unsigned k = ((offered & HANDSHAKE_LANES_MASK) >> HANDSHAKE_LANES_SHIFT) + 1;
        if (offered & HANDSHAKE_LANE_EXTRA) {
                l->lane_pending = true; /* which link: its LANE frame says */
                l->extra = true;
                return 0;
        }
        if (k > 1 && !lanes_new(l, k, nonce))
                return -ENOMEM;
        if (l->bundle)
                memcpy(l->bundle->peer_id, l->peer_id, IDENTITY_PK_SIZE);
        return 0;
}

/* Responder: an extra lane's first frame names the link it joins (the
 * primary's HELLO nonce, from the same identity) and its index. -ENOLINK:
 * no open link of that peer waits for lanes with that nonce (any more). */
int lanes_rx_lane(Link *l, const uint8_t *p, size_t len) {
        Net *n = l->net;
        if (!l->lane_pending || len != HANDSHAKE_NONCE_SIZE + 1)
                return -EBADMSG;
        unsigned index = p[HANDSHAKE_NONCE_SIZE];
        for (unsigned i = 0; i < n->cfg.max_links; i++) {
                Link *o = n->links[i];
                Bundle *b = o ? o->bundle : NULL;
                if (!b || o->lane != 0 || o->initiator || o->state != LINK_OPEN || b->announced ||
                    memcmp(b->peer_id, l->peer_id, IDENTITY_PK_SIZE) != 0 ||
                    memcmp(b->nonce, p, HANDSHAKE_NONCE_SIZE) != 0)
                        continue;
                if (index == 0 || index >= b->k || b->lane[index])
                        return -EBADMSG;
                l->lane_pending = false;
                lanes_join(l, b, index);
                lanes_opened(l);
                return 0;
        }
        return -ENOLINK; /* no such link (any more), or not one waiting for lanes */
}

int lanes_rx_ack(Link *l, const uint8_t *p, size_t len) {
        Bundle *b = l->bundle;
        if (!b || l->lane != 0 || len != 8)
                return -EBADMSG;
        uint64_t acked = get_le64(p);
        if (acked < b->tx_acked || acked > b->tx_seq)
                return -EBADMSG;
        b->tx_acked = acked;
        kick_all(l->net, b);
        return 0;
}

/* The slot of item seq, which must be inside the window. */
static LaneSlot *slot_for(Bundle *b, uint64_t seq) {
        if (seq < b->rx_next || seq - b->rx_next >= NET_LANE_WINDOW)
                return NULL;
        return &b->slot[seq % NET_LANE_WINDOW];
}

/* PLAN or CONTROL on the primary, numbered. */
int lanes_rx_item(Link *l, const FrameHeader *h, const uint8_t *payload) {
        Bundle *b = l->bundle;
        LaneSlot *s = slot_for(b, h->offset);
        if (l->lane != 0 || !s || s->used)
                return -EBADMSG;
        uint8_t *copy = malloc(h->length ? h->length : 1);
        if (!copy)
                return -ENOMEM;
        memcpy(copy, payload, h->length);
        *s = (LaneSlot){ .used = true, .complete = true, .type = h->type, .data = copy, .len = h->length };
        lanes_deliver(l->net, b);
        return 0;
}

/* Chunks of stripe bytes in a tensor of bytes bytes (one for an empty one). */
static uint64_t n_chunks(uint64_t bytes, uint32_t stripe) {
        return bytes ? (bytes + stripe - 1) / stripe : 1;
}

#define LANES_MAX_CHUNKS (UINT64_C(1) << 20) /* a slot's chunk map: at most 128 KiB */

/* A TENSOR frame on a lane: chunks of item seq follow on it (this ends the
 * lane's part of the item before, which other lanes may still complete).
 * The first lane to say so makes the slot (and the buffer); the others
 * must describe the same tensor. */
int lanes_rx_part(Link *l, const FrameHeader *h, const uint8_t *p, size_t len) {
        Net *n = l->net;
        Bundle *b = l->bundle;
        LaneSlot *s = slot_for(b, h->offset);
        TensorDesc d;
        int r;

        if (!s || len < 4 || (s->used && s->complete))
                return -EBADMSG;
        uint32_t stripe = get_le32(p + len - 4);
        if ((r = tensor_desc_decode(p, len - 4, n->cfg.limits.max_tensor_bytes, &d)) < 0)
                return r;
        if (stripe == 0 || stripe > n->cfg.limits.max_payload || n_chunks(d.bytes, stripe) > LANES_MAX_CHUNKS)
                return -EBADMSG;
        if (!s->used) {
                if ((r = net_rx_room(n, l, d.bytes)) < 0)
                        return r;
                uint8_t *chunks = calloc((size_t)(n_chunks(d.bytes, stripe) + 7) / 8, 1);
                uint8_t *data = chunks ? bufpool_alloc(n->pool, d.bytes) : NULL;
                if (chunks && !data)
                        data = malloc(MAX(d.bytes, (uint64_t)1));
                if (!data) {
                        free(chunks);
                        return -ENOMEM;
                }
                n->rx_bytes += d.bytes;
                *s = (LaneSlot){ .used = true, .type = FRAME_TENSOR, .stream = h->stream, .desc = d,
                                 .stripe = stripe, .chunks = chunks, .data = data, .begun_ns = net_now_ns() };
        } else if (s->type != FRAME_TENSOR || s->stream != h->stream || s->stripe != stripe ||
                   s->desc.bytes != d.bytes || s->desc.dtype != d.dtype || s->desc.ndim != d.ndim ||
                   memcmp(s->desc.dims, d.dims, sizeof(uint32_t) * d.ndim) != 0)
                return -EBADMSG;
        l->rx = (NetTensor){ .peer = b->lane[0], .stream = h->stream, .desc = d, .data = s->data };
        l->rx_slot = s;
        l->rx_active = true;
        l->rx_progress_ns = net_now_ns();
        if (d.bytes == 0)
                lanes_slot_done(l->net, b, s);
        return 0;
}

/* A DATA frame's header on a lane: the length of the chunk it announces,
 * or 0 if it is not a chunk of the lane's item that no frame announced
 * yet (its bit is set now, so no other frame may write there). */
size_t lanes_rx_chunk(Link *l, const FrameHeader *h) {
        LaneSlot *s = l->rx_slot;
        if (!l->rx_active || !s || h->stream != s->stream || h->offset >= s->desc.bytes || h->offset % s->stripe)
                return 0;
        uint64_t c = h->offset / s->stripe;
        size_t want = (size_t)MIN((uint64_t)s->stripe, s->desc.bytes - h->offset);
        if (h->length != want || (s->chunks[c / 8] & (1u << (c % 8))))
                return 0;
        s->chunks[c / 8] |= (uint8_t)(1u << (c % 8));
        return want;
}

/* A chunk is in (the last of the tensor must say so): every lane waiting on
 * this item has progress; the item is complete with its last byte. */
int lanes_rx_chunk_done(Link *l, const FrameHeader *h) {
        LaneSlot *s = l->rx_slot;
        Bundle *b = l->bundle;
        bool last = h->offset + h->length == s->desc.bytes;
        if (last != !!(h->flags & FRAME_FLAG_LAST))
                return -EBADMSG;
        s->got += h->length;
        for (unsigned i = 0; i < b->k; i++) {
                Link *o = lane_link(l->net, b, i);
                if (o && o->rx_slot == s)
                        o->rx_progress_ns = l->last_frame_ns;
        }
        if (s->got == s->desc.bytes)
                lanes_slot_done(l->net, b, s);
        return 0;
}

/* Every byte of a tensor is in: no lane carries more of it. */
void lanes_slot_done(Net *n, Bundle *b, LaneSlot *s) {
        for (unsigned i = 0; i < b->k; i++) {
                Link *o = lane_link(n, b, i);
                if (o && o->rx_slot == s) {
                        o->rx_active = false;
                        o->rx_slot = NULL;
                        o->rx.data = NULL;
                }
        }
        s->complete = true;
        lanes_deliver(n, b);
}

uint64_t lanes_queued(const Net *n, const Link *l) {
        const Bundle *b = l->bundle;
        uint64_t q = 0;
        for (unsigned i = 0; b && i < b->k; i++) {
                const Link *o = lane_link(n, b, i);
                q += o ? o->queued : 0;
        }
        return b ? q : l->queued;
}

/* A tensor as an item on every lane (one on the primary for an empty
 * one): each lane takes chunks from the shared cursor while it sends. The
 * lanes' queued bytes count equal shares of it. */
int lanes_send_tensor(Net *n, Link *primary, uint32_t stream, const TensorDesc *desc, const void *data,
                      uint64_t cookie) {
        Bundle *b = primary->bundle;
        unsigned used = desc->bytes ? b->k : 1;
        TxShared *sh = malloc(sizeof *sh);
        TxItem *items[NET_MAX_LANES] = {};
        if (!sh)
                return -ENOMEM;
        *sh = (TxShared){ .cookie = cookie, .left = used, .peer = primary->id };
        for (unsigned i = 0; i < used; i++)
                if (!lane_link(n, b, i) || !(items[i] = calloc(1, sizeof(TxItem)))) {
                        for (unsigned j = 0; j < used; j++)
                                free(items[j]);
                        free(sh);
                        return lane_link(n, b, i) ? -ENOMEM : -ENOTCONN;
                }
        uint64_t seq = b->tx_seq++;
        for (unsigned i = 0; i < used; i++) {
                Link *o = lane_link(n, b, i);
                TxItem *it = items[i];
                uint64_t share = desc->bytes / used + (i < desc->bytes % used);
                *it = (TxItem){ .type = FRAME_TENSOR, .stream = stream, .desc = *desc, .data = data,
                                .cookie = cookie, .numbered = true, .seq = seq, .stripe = n->cfg.chunk,
                                .shared = sh, .share = share };
                link_queue_item(o, it, share);
                n->backend->kick_send(n, o);
        }
        return 0;
}

/* A lane's item takes the next chunk no lane has taken, into i->offset:
 * false when none is left (an empty tensor's one item takes its one
 * "chunk"). */
bool lanes_claim(TxItem *i) {
        TxShared *sh = i->shared;
        if (sh->cursor >= MAX(i->desc.bytes, (uint64_t)1))
                return false;
        i->offset = sh->cursor;
        i->claimed = true;
        sh->cursor += i->stripe;
        return true;
}

/* A chunk of len bytes went out on l: its queued bytes go down by as much
 * as this item counted there. */
void lanes_chunk_sent(Link *l, TxItem *i, uint64_t len) {
        uint64_t d = MIN(len, i->share);
        i->share -= d;
        l->queued -= d;
}

/* PLAN and CONTROL are numbered among the tensors; the rest is not. */
void lanes_number(Bundle *b, TxItem *i) {
        if (i->type == FRAME_PLAN || i->type == FRAME_CONTROL) {
                i->numbered = true;
                i->seq = b->tx_seq++;
        }
}

/* Whether the item may start: inside the window of what the peer
 * delivered. */
bool lanes_may_start(const Link *l, const TxItem *i) {
        return !i->numbered || !l->bundle || i->seq < l->bundle->tx_acked + NET_LANE_WINDOW;
}

/* A lane's item is done (its chunks out, or none left to take); sent()
 * when it was the last lane's. */
void lanes_part_sent(Net *n, Link *l, TxItem *i) {
        TxShared *sh = i->shared;
        l->queued -= i->share;
        i->share = 0;
        if (--sh->left > 0)
                return;
        uint32_t peer = sh->peer;
        uint64_t cookie = sh->cookie;
        free(sh);
        if (n->cb.sent)
                n->cb.sent(n->userdata, peer, cookie);
}
