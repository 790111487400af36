/* fuzz-relay.c — libFuzzer harness for a relay's check of a link's
 * handshake (net/relay-proof.h), which reads the bytes of strangers.
 *
 * The input is a list of chunks, each read from one end of the link as the
 * relay would read it: fuzz bytes, the next bytes of a genuine handshake's
 * stream from that end (HELLO then AUTH from the asker, HELLO_REPLY from the
 * waiter), or those with a byte changed. Then the genuine handshake alone,
 * cut where the input says.
 *
 * What must hold, or the harness abort()s so libFuzzer reports it:
 *   - no crash, no out-of-bounds access (ASan), no undefined behaviour (UBSan);
 *   - relay_proof_feed() answers 0, 1, -EBADMSG or -EACCES; an error, and a
 *     proof, are final;
 *   - a link is proven only by the genuine handshake (its T1), whatever
 *     fuzz bytes came: nothing forges a MAC;
 *   - the genuine handshake in its order is proven wherever it is cut, and
 *     refused (-EACCES) by a relay with another secret.
 *
 * Input: records of a header byte (bit 0: from the asker; bits 1-2: fuzz
 * bytes, genuine, genuine with a byte changed) and a length byte, then the
 * fuzz bytes, or the offset and the mask of the change.
 *
 *     build-fuzz/tests/fuzz/fuzz-relay -max_total_time=60 build-fuzz/corpus/relay
 */
#include <errno.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fuzz-rng.h"
#include "fuzz.h"

#include "net/frame.h"
#include "net/handshake.h"
#include "net/identity.h"
#include "net/relay-proof.h"

static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 'r', 'e', 'l', 'a', 'y' };
static const uint8_t other[HANDSHAKE_SECRET_SIZE] = { 'o', 't', 'h', 'e', 'r' };

/* The genuine handshake, as each end sends it, and its T1. */
static uint8_t from_asker[2 * FRAME_HEADER_SIZE + HANDSHAKE_HELLO_SIZE + HANDSHAKE_AUTH_SIZE];
static uint8_t from_waiter[FRAME_HEADER_SIZE + HANDSHAKE_REPLY_SIZE];
static uint8_t genuine_t1[32];

/* from's next message, framed at out, given to to. */
static size_t pass(Handshake *from, Handshake *to, uint8_t *out) {
        uint8_t type;
        int n = handshake_next(from, &type, out + FRAME_HEADER_SIZE, HANDSHAKE_MAX_SIZE);
        CHECK(n > 0);
        frame_header_encode(&(FrameHeader){ .type = type, .length = (uint32_t)n }, out);
        CHECK(handshake_recv(to, type, out + FRAME_HEADER_SIZE, (size_t)n) == 0);
        return FRAME_HEADER_SIZE + (size_t)n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        Identity a, b;
        Handshake i, r;
        uint8_t want[HANDSHAKE_MAC_SIZE];

        CHECK(randombytes_set_implementation(&fuzz_rng) == 0);
        CHECK(sodium_init() >= 0);
        CHECK(identity_generate(&a) == 0 && identity_generate(&b) == 0);
        HandshakeConfig ca = { .identity = &a, .secret = secret, .ciphers = CIPHER_BIT(CIPHER_CHACHA20POLY1305) };
        HandshakeConfig cb = ca;
        cb.identity = &b;
        CHECK(handshake_init(&i, &ca, true) == 0 && handshake_init(&r, &cb, false) == 0);
        size_t hello = pass(&i, &r, from_asker);
        CHECK(pass(&r, &i, from_waiter) == sizeof from_waiter);
        CHECK(hello + pass(&i, &r, from_asker + hello) == sizeof from_asker);
        handshake_reply_transcript(secret, from_asker + FRAME_HEADER_SIZE, from_waiter + FRAME_HEADER_SIZE,
                                   genuine_t1, want);
        return 0;
}

/* One answer of relay_proof_feed(), against the one before. */
static void check_answer(const RelayProof *p, int r, int before) {
        CHECK(r == 0 || r == 1 || r == -EBADMSG || r == -EACCES);
        CHECK(before == 0 || r == before);
        CHECK(r != 1 || memcmp(p->t1, genuine_t1, sizeof genuine_t1) == 0);
}

/* The genuine handshake in its order, each frame cut where the input says. */
static void genuine_cut(const uint8_t *data, size_t size) {
        static const size_t hello = FRAME_HEADER_SIZE + HANDSHAKE_HELLO_SIZE;
        const uint8_t *part[3] = { from_asker, from_waiter, from_asker + hello };
        const size_t len[3] = { hello, sizeof from_waiter, sizeof from_asker - hello };
        RelayProof p, q;
        int r = 0, s = 0;

        relay_proof_init(&p, secret);
        relay_proof_init(&q, other);
        for (int k = 0; k < 3; k++) {
                size_t at = size > (size_t)k ? data[k] % (len[k] + 1) : len[k];
                CHECK(relay_proof_feed(&p, k != 1, part[k], at) == (k == 2 && at == len[k]));
                r = relay_proof_feed(&p, k != 1, part[k] + at, len[k] - at);
                s = relay_proof_feed(&q, k != 1, part[k], len[k]);
        }
        CHECK(r == 1);
        CHECK(s == -EACCES);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        size_t got[2] = { 0, 0 }; /* genuine bytes given, from the waiter and from the asker */
        uint8_t buf[256];
        RelayProof p;
        int before = 0;

        relay_proof_init(&p, secret);
        genuine_cut(data, size);
        for (size_t at = 0; at + 2 <= size;) {
                bool asker = data[at] & 1;
                unsigned kind = (data[at] >> 1) & 3;
                size_t n = data[at + 1];
                const uint8_t *stream = asker ? from_asker : from_waiter;
                size_t left = (asker ? sizeof from_asker : sizeof from_waiter) - got[asker];
                at += 2;
                if (kind == 0) { /* fuzz bytes */
                        n = n < size - at ? n : size - at;
                        memcpy(buf, data + at, n);
                        at += n;
                } else { /* genuine, perhaps with one byte changed */
                        n = n < left ? n : left;
                        memcpy(buf, stream + got[asker], n);
                        got[asker] += n;
                        if (kind >= 2 && n && at + 2 <= size) {
                                buf[data[at] % n] ^= data[at + 1] | 1;
                                at += 2;
                        }
                }
                int r = relay_proof_feed(&p, asker, buf, n);
                check_answer(&p, r, before);
                before = r;
        }
        return 0;
}
