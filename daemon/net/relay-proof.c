/* net/relay-proof.c */
#include "relay-proof.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

/* What each step waits for: the frame's type and payload length. */
static const struct {
        uint8_t type;
        uint32_t length;
} expected[] = {
        [PROOF_HELLO] = { FRAME_HELLO, HANDSHAKE_HELLO_SIZE },
        [PROOF_REPLY] = { FRAME_HELLO_REPLY, HANDSHAKE_REPLY_SIZE },
        [PROOF_AUTH] = { FRAME_AUTH, HANDSHAKE_AUTH_SIZE },
};

void relay_proof_init(RelayProof *p, const uint8_t *secret) {
        memset(p, 0, sizeof *p);
        p->secret = secret;
        p->step = PROOF_HELLO;
}

static int fail(RelayProof *p, int r) {
        p->step = PROOF_FAILED;
        p->error = r;
        return r;
}

/* A header as the ends check it (HANDSHAKE): a frame of the protocol, the
 * type this step waits for, its length, seq 0, stream 0. */
static int check_header(const RelayProof *p) {
        const FrameLimits limits = { .max_control = FRAME_MAX_CONTROL };
        FrameHeader h;

        if (frame_header_decode(p->frame, &limits, &h) < 0 || h.type != expected[p->step].type ||
            h.length != expected[p->step].length || h.seq != 0 || h.stream != 0)
                return -EBADMSG;
        return 0;
}

/* The step's whole frame is in: keep what the next needs, or check a MAC. */
static int check_frame(RelayProof *p) {
        const uint8_t *m = p->frame + FRAME_HEADER_SIZE;
        uint8_t t2[32], want[HANDSHAKE_MAC_SIZE];

        switch (p->step) {
        case PROOF_HELLO:
                memcpy(p->hello, m, HANDSHAKE_HELLO_SIZE);
                return 0;
        case PROOF_REPLY:
                handshake_reply_transcript(p->secret, p->hello, m, p->t1, want);
                break;
        case PROOF_AUTH:
                handshake_auth_transcript(p->secret, p->t1, m, t2, want);
                break;
        default:
                return -EPROTO;
        }
        /* the MAC ends the message */
        const uint8_t *mac = m + expected[p->step].length - HANDSHAKE_MAC_SIZE;
        return sodium_memcmp(want, mac, sizeof want) == 0 ? 0 : -EACCES;
}

int relay_proof_feed(RelayProof *p, bool from_asker, const uint8_t *buf, size_t len) {
        while (len > 0 && p->step < PROOF_DONE) {
                if (from_asker != (p->step != PROOF_REPLY)) /* a real end waits for its turn */
                        return fail(p, -EBADMSG);
                size_t want = FRAME_HEADER_SIZE + (p->have < FRAME_HEADER_SIZE ? 0 : expected[p->step].length);
                size_t k = want - p->have < len ? want - p->have : len;
                memcpy(p->frame + p->have, buf, k);
                p->have += k;
                buf += k;
                len -= k;
                if (p->have < want)
                        break;
                int r = p->have == FRAME_HEADER_SIZE ? check_header(p) : check_frame(p);
                if (r < 0)
                        return fail(p, r);
                if (p->have > FRAME_HEADER_SIZE) { /* on to the next frame */
                        p->have = 0;
                        p->step++;
                }
        }
        return p->step == PROOF_DONE ? 1 : p->step == PROOF_FAILED ? p->error : 0;
}
