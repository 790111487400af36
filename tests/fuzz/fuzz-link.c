/* libFuzzer harness for a link's receive path (net/link.c): the state
 * machine every byte from a peer goes through.
 *
 * Input byte 0 picks the mode:
 *   even: the bytes go to a fresh responder link as they are (a stranger
 *         before the handshake);
 *   odd:  a genuine initiator completes the handshake first, then the rest
 *         of the input is a list of frames it seals with the real keys
 *         (type, flags, stream, offset, length chosen by the fuzzer, and an
 *         optional flipped byte), so tensor reassembly, limits and
 *         control frames are reached with valid tags.
 * Checks: nothing crashes; a tensor being received never holds more bytes
 * than its descriptor; the node's receive accounting never goes over its
 * bound and returns to zero when the link is gone. */
#include <stdint.h>

#include "fuzz.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/handshake.h"
#include "net/net-internal.h"


static Identity node_id, peer_id;
static const uint8_t secret[32] = "fuzzing network secret.........";
static Net *net;

static void on_tensor(void *ud, NetTensor *t) {
        CHECK(t->desc.bytes <= net->cfg.limits.max_tensor_bytes);
        net_tensor_release(net, t);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        NetConfig c;
        CHECK(identity_generate(&node_id) == 0);
        CHECK(identity_generate(&peer_id) == 0);
        net_config_defaults(&c);
        c.identity = &node_id;
        c.secret = secret;
        c.backend = NET_BACKEND_EPOLL;
        c.limits.max_payload = 4096;
        c.limits.max_control = 1024;
        c.limits.max_tensor_bytes = 64 << 10;
        c.chunk = 4096;
        c.max_receive_bytes = 96 << 10;
        c.pool_bytes = 128 << 10;
        c.max_links = 4;
        NetCallbacks cb = { .tensor = on_tensor };
        CHECK(net_new(&c, &cb, NULL, &net) == 0);
        return 0;
}

/* Feed bytes the way a backend would; false once the link refuses them. */
static bool feed(Link *l, const uint8_t *p, size_t len) {
        while (len) {
                uint8_t *dst;
                size_t want;
                link_rx_target(l, &dst, &want);
                CHECK(want > 0);
                size_t n = want < len ? want : len;
                memcpy(dst, p, n);
                int r = link_rx_done(l, n);
                while (r >= 0 && link_rx_pending(l))
                        r = link_rx_more(l);
                if (r < 0)
                        return false;
                if (l->rx_active)
                        CHECK(l->rx_got <= l->rx.desc.bytes);
                CHECK(net->rx_bytes <= net->cfg.max_receive_bytes);
                p += n;
                len -= n;
        }
        return true;
}

static bool feed_clear(Link *l, uint8_t type, const uint8_t *p, size_t len) {
        uint8_t hdr[FRAME_HEADER_SIZE];
        FrameHeader h = { .type = type, .length = (uint32_t)len };
        frame_header_encode(&h, hdr);
        return feed(l, hdr, sizeof hdr) && feed(l, p, len);
}

/* The next frame the link wants to send, as the peer would read it. */
static bool take_frame(Link *l, FrameHeader *h, const uint8_t **payload) {
        if (!link_tx_prepare(l))
                return false;
        const uint8_t *bytes = l->iov[0].iov_base;
        CHECK(frame_header_decode(bytes, &(FrameLimits){ 1 << 20, 1 << 20, 1 << 30 }, h) == 0);
        *payload = bytes + FRAME_HEADER_SIZE;
        return true;
}

static void sent(Link *l) {
        link_tx_done(l, l->tx_total - l->tx_done);
}

static bool handshake(Link *l, Seal *s) {
        HandshakeConfig hc = { .identity = &peer_id, .secret = secret, .ciphers = cipher_available() };
        Handshake hs;
        uint8_t buf[HANDSHAKE_MAX_SIZE], type;
        FrameHeader h;
        const uint8_t *p;

        CHECK(handshake_init(&hs, &hc, true) == 0);
        int n = handshake_next(&hs, &type, buf, sizeof buf);
        CHECK(feed_clear(l, type, buf, (size_t)n));
        CHECK(take_frame(l, &h, &p) && h.type == FRAME_HELLO_REPLY);
        CHECK(handshake_recv(&hs, h.type, p, h.length) == 0);
        sent(l);
        n = handshake_next(&hs, &type, buf, sizeof buf);
        CHECK(feed_clear(l, type, buf, (size_t)n));
        CHECK(l->state == LINK_OPEN);
        CHECK(take_frame(l, &h, &p) && h.type == FRAME_WELCOME);
        sent(l);

        Cipher c;
        uint8_t tx[SEAL_KEY_SIZE], rx[SEAL_KEY_SIZE], peer[IDENTITY_PK_SIZE];
        handshake_result(&hs, &c, tx, rx, peer);
        CHECK(memcmp(peer, node_id.pk, IDENTITY_PK_SIZE) == 0);
        CHECK(seal_init(s, c, tx, rx) == 0);
        s->rx_seq = 1; /* WELCOME was the node's frame 0 */
        handshake_clear(&hs);
        return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        Link *l = calloc(1, sizeof *l);
        CHECK(link_init(l, net, -1, false, false, 0) == 0);
        l->id = 1;

        if (!(data[0] & 1))
                feed(l, data + 1, size - 1);
        else {
                Seal s = {};
                static uint8_t frame[FRAME_HEADER_SIZE + 8192 + FRAME_TAG_SIZE], body[8192];
                handshake(l, &s);
                const uint8_t *p = data + 1, *end = data + size;
                /* record: type, flags, stream, length (2), offset (4), flip (2), then the payload */
                while (end - p >= 11) {
                        FrameHeader h = { .type = p[0], .flags = p[1], .stream = p[2],
                                          .offset = (uint64_t)get_le32(p + 5) };
                        size_t len = get_le16(p + 3) % 8192;
                        uint16_t flip = get_le16(p + 9);
                        p += 11;
                        size_t have = (size_t)(end - p) < len ? (size_t)(end - p) : len;
                        memset(body, 0, len);
                        memcpy(body, p, have);
                        p += have;
                        if (h.type == FRAME_TENSOR && len >= 4) {
                                /* often a well-formed descriptor, to reach DATA */
                                body[2] = body[3] = 0;
                                if (body[1] <= TENSOR_MAX_NDIM)
                                        len = 4 + 4 * (size_t)body[1];
                        }
                        seal_frame_to(&s, &h, frame, frame + FRAME_HEADER_SIZE, body, len,
                                      frame + FRAME_HEADER_SIZE + len);
                        size_t total = FRAME_HEADER_SIZE + len + FRAME_TAG_SIZE;
                        if (flip & 0x8000)
                                frame[(flip & 0x7fff) % total] ^= 0x5a;
                        if (!feed(l, frame, total))
                                break;
                }
                seal_clear(&s);
        }
        link_destroy(l);
        free(l);
        CHECK(net->rx_bytes == 0);
        return 0;
}
