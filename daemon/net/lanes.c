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
        if (s->used && s->type == FRAME_TENSOR) {
                n->rx_bytes -= s->desc.bytes;
                if (bufpool_owns(n->pool, s->data))
                        bufpool_free(n->pool, s->data, s->desc.bytes);
                else
                        free(s->data);
        } else if (s->used)
                free(s->data);
        *s = (LaneSlot){};
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

static void kick_all(Net *n, Bundle *b) {
        for (unsigned i = 0; i < b->k; i++) {
                Link *o = lane_link(n, b, i);
                if (o && o->state == LINK_OPEN)
                        n->backend->kick_send(n, o);
        }
}

/* Items whose parts are all in, in their order, to the application; an
 * ACK when a quarter of the window has gone. */
void lanes_deliver(Net *n, Bundle *b) {
        Link *primary = lane_link(n, b, 0);
        while (b->announced && primary && primary->state == LINK_OPEN) {
                LaneSlot *s = &b->slot[b->rx_next % NET_LANE_WINDOW];
                if (!s->used || !s->complete)
                        break;
                LaneSlot it = *s;
                *s = (LaneSlot){};
                b->rx_next++;
                if (it.type == FRAME_TENSOR) {
                        NetTensor *t = malloc(sizeof *t);
                        if (!t) {
                                slot_clear(n, &it);
                                net_link_close(primary, -ENOMEM);
                                return;
                        }
                        *t = (NetTensor){ .peer = primary->id, .stream = it.stream, .desc = it.desc, .data = it.data };
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
void lanes_opened(Link *l) {
        Bundle *b = l->bundle;
        Net *n = l->net;
        if (l->initiator && l->extra) {
                uint8_t p[HANDSHAKE_NONCE_SIZE + 1];
                memcpy(p, b->nonce, HANDSHAKE_NONCE_SIZE);
                p[HANDSHAKE_NONCE_SIZE] = (uint8_t)l->lane;
                if (link_queue_control(l, FRAME_LANE, p, sizeof p) < 0) {
                        net_link_close(l, -ENOMEM);
                        return;
                }
                n->backend->kick_send(n, l);
        }
        if (++b->attached < b->k)
                return;
        Link *primary = lane_link(n, b, 0);
        if (!primary)
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
 * primary's HELLO nonce, from the same identity) and its index. */
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
        return -EBADMSG; /* no such link (any more) */
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

/* Which lanes carry a part of a tensor of bytes bytes cut in stripes. */
static unsigned lanes_used(uint64_t bytes, uint32_t stripe, unsigned k) {
        uint64_t chunks = bytes ? (bytes + stripe - 1) / stripe : 1;
        return (unsigned)MIN(chunks, (uint64_t)k);
}

/* A TENSOR frame on a lane: this lane's part of item seq follows, its
 * first chunk at lane * stripe. The first lane to say so makes the slot
 * (and the buffer); the others must describe the same tensor. */
int lanes_rx_part(Link *l, const FrameHeader *h, const uint8_t *p, size_t len) {
        Net *n = l->net;
        Bundle *b = l->bundle;
        LaneSlot *s = slot_for(b, h->offset);
        TensorDesc d;
        int r;

        if (!s || len < 4)
                return -EBADMSG;
        uint32_t stripe = get_le32(p + len - 4);
        if ((r = tensor_desc_decode(p, len - 4, n->cfg.limits.max_tensor_bytes, &d)) < 0)
                return r;
        if (stripe == 0 || stripe > n->cfg.limits.max_payload ||
            l->lane >= lanes_used(d.bytes, stripe, b->k))
                return -EBADMSG;
        if (!s->used) {
                if (n->rx_bytes + d.bytes > n->cfg.max_receive_bytes)
                        return -ENOBUFS;
                uint8_t *data = bufpool_alloc(n->pool, d.bytes);
                if (!data)
                        data = malloc(MAX(d.bytes, (uint64_t)1));
                if (!data)
                        return -ENOMEM;
                n->rx_bytes += d.bytes;
                *s = (LaneSlot){ .used = true, .type = FRAME_TENSOR, .stream = h->stream, .desc = d,
                                 .stripe = stripe, .lanes_left = lanes_used(d.bytes, stripe, b->k), .data = data };
        } else if (s->type != FRAME_TENSOR || s->stream != h->stream || s->stripe != stripe ||
                   s->desc.bytes != d.bytes || s->desc.dtype != d.dtype || s->desc.ndim != d.ndim ||
                   memcmp(s->desc.dims, d.dims, sizeof(uint32_t) * d.ndim) != 0)
                return -EBADMSG;
        l->rx = (NetTensor){ .peer = b->lane[0], .stream = h->stream, .desc = d, .data = s->data };
        l->rx_slot = s;
        l->rx_active = true;
        l->rx_got = (uint64_t)l->lane * stripe;
        l->rx_progress_ns = net_now_ns();
        if (d.bytes == 0)
                lanes_part_done(l);
        return 0;
}

/* The next chunk this lane's part expects, or 0 if the frame is not it. */
size_t lanes_rx_chunk(const Link *l, const FrameHeader *h) {
        const LaneSlot *s = l->rx_slot;
        if (!l->rx_active || !s || h->stream != s->stream || h->offset != l->rx_got || l->rx_got >= s->desc.bytes)
                return 0;
        size_t want = (size_t)MIN((uint64_t)s->stripe, s->desc.bytes - l->rx_got);
        return h->length == want ? want : 0;
}

/* A chunk of this lane's part is in: on to the next one, or the part is
 * done (the chunk must then say it is its last). */
int lanes_rx_chunk_done(Link *l, const FrameHeader *h) {
        LaneSlot *s = l->rx_slot;
        l->rx_got += (uint64_t)s->stripe * l->bundle->k;
        bool last = l->rx_got >= s->desc.bytes;
        if (last != !!(h->flags & FRAME_FLAG_LAST))
                return -EBADMSG;
        if (last)
                lanes_part_done(l);
        return 0;
}

void lanes_part_done(Link *l) {
        LaneSlot *s = l->rx_slot;
        l->rx_active = false;
        l->rx_slot = NULL;
        l->rx.data = NULL;
        if (--s->lanes_left == 0) {
                s->complete = true;
                lanes_deliver(l->net, l->bundle);
        }
}

static uint64_t part_bytes(uint64_t bytes, uint32_t stripe, unsigned k, unsigned lane) {
        uint64_t sum = 0;
        for (uint64_t o = (uint64_t)lane * stripe; o < bytes; o += (uint64_t)stripe * k)
                sum += MIN((uint64_t)stripe, bytes - o);
        return sum;
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

/* A tensor as parts, one per lane that has a chunk of it. */
int lanes_send_tensor(Net *n, Link *primary, uint32_t stream, const TensorDesc *desc, const void *data,
                      uint64_t cookie) {
        Bundle *b = primary->bundle;
        uint32_t stripe = n->cfg.chunk;
        unsigned used = lanes_used(desc->bytes, stripe, b->k);
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
                *it = (TxItem){ .type = FRAME_TENSOR, .stream = stream, .desc = *desc, .data = data,
                                .offset = (uint64_t)i * stripe, .cookie = cookie, .numbered = true, .seq = seq,
                                .lanes = b->k, .stripe = stripe, .shared = sh };
                link_queue_item(o, it, part_bytes(desc->bytes, stripe, b->k, i));
                n->backend->kick_send(n, o);
        }
        return 0;
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

/* One part of a striped tensor is out; sent() when it was the last. */
void lanes_part_sent(Net *n, Link *l, TxItem *i) {
        TxShared *sh = i->shared;
        if (--sh->left > 0)
                return;
        uint32_t peer = sh->peer;
        uint64_t cookie = sh->cookie;
        free(sh);
        if (n->cb.sent)
                n->cb.sent(n->userdata, peer, cookie);
}
