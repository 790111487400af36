/* net/handshake.h — the mutually authenticated, forward-secret key
 * exchange that opens every link. A pure state machine: bytes in, bytes
 * out, no I/O, so it is tested and fuzzed on its own.
 *
 *   initiator                                   responder
 *   HELLO        ciphers, ephemeral X25519 key, 32-byte nonce  ->
 *             <- HELLO_REPLY  chosen cipher, ephemeral key, nonce,
 *                             identity, Ed25519 signature over T1, MAC
 *   AUTH         identity, signature over T2, MAC  ->
 *             <- WELCOME (the first protected frame: key confirmation)
 *
 * T1 is BLAKE2b of a label, HELLO and the reply's fields; T2 is BLAKE2b of
 * T1 and the initiator's identity. Each side signs the transcript with its
 * long-term identity (SIGMA-style), so both are authenticated; fresh
 * ephemeral keys and nonces make every transcript new, so a recorded
 * handshake cannot be replayed; the link keys come from the ephemeral X25519
 * secret and T2 through keyed BLAKE2b, so they are forward secret. With a
 * network secret the MACs (keyed BLAKE2b over the transcript) prove both
 * sides know it and the secret is mixed into the keys; with an allowlist the
 * peer's identity must be on it. Both may be required at once.
 *
 *     Handshake hs;
 *     handshake_init(&hs, &cfg, true);
 *     n = handshake_next(&hs, &type, buf, sizeof buf);     // HELLO
 *     r = handshake_recv(&hs, FRAME_HELLO_REPLY, in, len); // -EACCES: not admitted
 *     n = handshake_next(&hs, &type, buf, sizeof buf);     // AUTH
 *     handshake_done(&hs) -> handshake_result(&hs, &cipher, tx, rx, peer);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "identity.h"
#include "seal.h"

#define HANDSHAKE_NONCE_SIZE 32
#define HANDSHAKE_SECRET_SIZE 32
#define HANDSHAKE_HELLO_SIZE (4 + 32 + HANDSHAKE_NONCE_SIZE)
#define HANDSHAKE_REPLY_SIZE (4 + 32 + HANDSHAKE_NONCE_SIZE + 32 + 64 + 32)
#define HANDSHAKE_AUTH_SIZE (32 + 64 + 32)
#define HANDSHAKE_MAX_SIZE HANDSHAKE_REPLY_SIZE
#define HANDSHAKE_REPLY_FIELDS (4 + 32 + HANDSHAKE_NONCE_SIZE + IDENTITY_PK_SIZE) /* what T1 takes of HELLO_REPLY */
#define HANDSHAKE_MAC_SIZE 32 /* the last bytes of HELLO_REPLY and AUTH */
/* The HELLO's cipher word also says what the connection is to its link
 * (net.h NetConfig.lanes), under the transcript's signatures like the
 * rest: bits 24-26, the lanes of a link this connection opens, less one;
 * bit 31, this connection is another lane of a link opened already. */
#define HANDSHAKE_LANES_SHIFT 24
#define HANDSHAKE_LANES_MASK (7u << HANDSHAKE_LANES_SHIFT)
#define HANDSHAKE_LANE_EXTRA (1u << 31)

typedef struct HandshakeConfig {
        const Identity *identity;
        /* Admission: a network secret (NULL: none) and/or an allowlist of
         * identities (n_allowed 0: none). At least one must be given. */
        const uint8_t *secret;
        const uint8_t (*allowed)[IDENTITY_PK_SIZE];
        size_t n_allowed;
        /* CIPHER_BIT()s this side accepts; CIPHER_NONE only for benchmarks on
         * loopback (the caller checks the addresses). */
        uint32_t ciphers;
} HandshakeConfig;

typedef enum HandshakeState {
        HS_SEND_HELLO,
        HS_WAIT_HELLO,
        HS_WAIT_REPLY,
        HS_SEND_REPLY,
        HS_SEND_AUTH,
        HS_WAIT_AUTH,
        HS_DONE,
        HS_FAILED,
} HandshakeState;

typedef struct Handshake {
        HandshakeConfig cfg;
        bool initiator;
        HandshakeState state;
        uint8_t eph_pk[32], eph_sk[32], nonce[HANDSHAKE_NONCE_SIZE];
        uint8_t hello[HANDSHAKE_HELLO_SIZE]; /* as sent or received */
        uint8_t peer_eph[32], peer_id[IDENTITY_PK_SIZE];
        uint8_t shared[32]; /* X25519(eph_sk, peer_eph), from when the peer's key arrives */
        uint8_t peer_key[IDENTITY_PK_SIZE]; /* the identity whose signature verified */
        bool peer_key_known;                /* (even if it was then not admitted) */
        uint8_t t1[32], t2[32];
        uint32_t offered; /* the initiator's cipher bits */
        Cipher cipher;
        uint8_t keys[64]; /* initiator-to-responder then responder-to-initiator */
} Handshake;

int handshake_init(Handshake *hs, const HandshakeConfig *cfg, bool initiator);
/* The next message to send: returns its length (writing its type and
 * payload), 0 when there is nothing to send now, -ENOBUFS if cap is short. */
int handshake_next(Handshake *hs, uint8_t *ret_type, uint8_t *out, size_t cap);
/* A received handshake message. -EBADMSG: malformed or a bad signature;
 * -EACCES: not admitted (unknown identity, wrong network secret);
 * -EPROTO: unexpected here; -EOPNOTSUPP: no common cipher;
 * -EKEYREJECTED: the peer's ephemeral key is of small order (checked as
 * soon as HELLO or HELLO_REPLY brings it, before anything is answered or
 * verified). Any error is final. */
int handshake_recv(Handshake *hs, uint8_t type, const uint8_t *in, size_t len);
static inline bool handshake_done(const Handshake *hs) {
        return hs->state == HS_DONE;
}
/* After handshake_done(): the cipher, this side's tx and rx keys and the
 * peer's identity. */
void handshake_result(const Handshake *hs, Cipher *ret_cipher, uint8_t tx[SEAL_KEY_SIZE],
                      uint8_t rx[SEAL_KEY_SIZE], uint8_t peer[IDENTITY_PK_SIZE]);
/* Wipe ephemeral secrets and keys. */
void handshake_clear(Handshake *hs);

/* The transcripts and the MACs of the messages that carry them, from the
 * bytes of HELLO, HELLO_REPLY and AUTH, which all go in the clear: T1 and
 * the responder's MAC from HELLO and the reply's first
 * HANDSHAKE_REPLY_FIELDS bytes, T2 and the initiator's MAC from T1 and
 * AUTH's identity. secret NULL: MACs of zeros, as a side without a network
 * secret sends. Both ends compute them here, and so does a relay that holds
 * the network secret (relay.h) to check a link's MACs as they pass. */
void handshake_reply_transcript(const uint8_t *secret, const uint8_t hello[HANDSHAKE_HELLO_SIZE],
                                const uint8_t fields[HANDSHAKE_REPLY_FIELDS], uint8_t t1[32],
                                uint8_t mac[HANDSHAKE_MAC_SIZE]);
void handshake_auth_transcript(const uint8_t *secret, const uint8_t t1[32],
                               const uint8_t initiator_id[IDENTITY_PK_SIZE], uint8_t t2[32],
                               uint8_t mac[HANDSHAKE_MAC_SIZE]);

/* The cipher of a link whose ends both accept the set both (CIPHER_BIT()s):
 * plaintext when both asked for it (benchmarks on loopback: see net.h),
 * else the first of AEGIS-256X4 (where both ends have VAES and AVX-512),
 * AEGIS-256X2 (VAES), AEGIS-256 (AES-NI), AES-256-GCM and
 * ChaCha20-Poly1305: all with 256-bit keys, the fastest first. _CIPHER_MAX
 * if none. */
Cipher handshake_choose_cipher(uint32_t both);
