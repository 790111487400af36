/* net/seal.h — per-frame protection of an established link.
 *
 * Each direction has its own key and its own frame counter. A frame's
 * 32-byte header is the AEAD's associated data, its seq (the counter) the
 * nonce, and the payload is encrypted in place; the receiver accepts only
 * the seq it expects next, so a frame modified, replayed, reordered or
 * dropped fails. Where both ends have VAES, AEGIS-256X2, and where they have
 * AES-NI, AEGIS-256 (aegis.h): they seal several times faster than
 * AES-256-GCM on one core with the same key size; AES-256-GCM for peers
 * that offer neither (AES-NI and PCLMUL, as libsodium judges them);
 * ChaCha20-Poly1305 otherwise;
 * CIPHER_NONE (the benchmark-only plaintext mode) keeps the counter check
 * and nothing else. AES-256-GCM runs on OpenSSL's libcrypto, whose stitched
 * AES-NI/VAES and GHASH code is 2.4x libsodium's here (3.2 against 1.3 GB/s
 * on one core); the bytes on the wire are the same either way.
 *
 *     Seal s;
 *     seal_init(&s, CIPHER_AES256GCM, tx_key, rx_key);
 *     seal_frame(&s, &h, hdr, payload, len, tag);     // sender, in place
 *     r = seal_open(&s, hdr, &h, payload, len, tag);  // receiver: -EBADMSG if forged
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <stdint.h>

#include "aegis.h"
#include "frame.h"

typedef enum Cipher {
        CIPHER_NONE = 0,
        CIPHER_AES256GCM = 1,
        CIPHER_CHACHA20POLY1305 = 2,
        CIPHER_AEGIS256 = 3,
        CIPHER_AEGIS256X2 = 4,
        CIPHER_AEGIS256X4 = 5,
        _CIPHER_MAX,
} Cipher;

#define CIPHER_BIT(c) (1u << (c))
#define SEAL_KEY_SIZE 32

typedef struct Seal {
        EVP_CIPHER_CTX *tx_aes, *rx_aes; /* AES-256-GCM: the keys expanded once */
        Aegis256 tx_aegis, rx_aegis;     /* AEGIS-256(X2, X4): the frame being sealed / opened */
        uint8_t tx_key[SEAL_KEY_SIZE], rx_key[SEAL_KEY_SIZE];
        uint64_t tx_seq, rx_seq;
        size_t tx_left, rx_left; /* bytes of the frame being sealed / opened in records */
        Cipher cipher;
} Seal;

const char *cipher_to_string(Cipher c);
/* The ciphers this machine can run, as CIPHER_BIT()s (CIPHER_NONE not included). */
uint32_t cipher_available(void);
/* Bytes a protected frame adds after the payload. */
static inline size_t seal_tag_size(const Seal *s) {
        return s->cipher == CIPHER_NONE ? 0 : FRAME_TAG_SIZE;
}

/* -EOPNOTSUPP: a cipher this machine does not run; -ENOMEM. Every Seal that
 * was initialized is cleared with seal_clear(). */
int seal_init(Seal *s, Cipher c, const uint8_t tx[SEAL_KEY_SIZE], const uint8_t rx[SEAL_KEY_SIZE]);
void seal_clear(Seal *s);

/* Give h the next seq, write the header to hdr, encrypt payload (len bytes)
 * in place and put the tag in tag (unused with CIPHER_NONE). */
void seal_frame(Seal *s, FrameHeader *h, uint8_t hdr[FRAME_HEADER_SIZE], uint8_t *payload,
                size_t len, uint8_t tag[FRAME_TAG_SIZE]);
/* The same, reading plaintext from src and writing ciphertext to dst. */
void seal_frame_to(Seal *s, FrameHeader *h, uint8_t hdr[FRAME_HEADER_SIZE], uint8_t *dst,
                   const uint8_t *src, size_t len, uint8_t tag[FRAME_TAG_SIZE]);

/* The lanes of the link's AEGIS variant, or 0 for another cipher. */
static inline unsigned seal_aegis_lanes(const Seal *s) {
        switch (s->cipher) {
        case CIPHER_AEGIS256: return 1;
        case CIPHER_AEGIS256X2: return 2;
        case CIPHER_AEGIS256X4: return 4;
        default: return 0;
        }
}

/* A frame sealed or opened a record at a time, so that each record is
 * encrypted just before the kernel copies it out, or decrypted just after it
 * copied it in, while it is still in the cache. The bytes on the wire are
 * those of seal_frame_to() and seal_open(): one AEAD over the whole frame,
 * checked by its one tag, so a receiver may hand no byte of it on before
 * seal_open_end() succeeds. AEGIS-256 (X2, X4) and AES-256-GCM (seal_streams()).
 *
 *     seal_begin(&s, &h, hdr, len);           // h.seq, h.length, hdr
 *     seal_update(&s, dst, src, n);           // any n, len in all
 *     seal_end(&s, tag);
 *
 *     r = seal_open_begin(&s, hdr, &h);       // -EBADMSG: not the next seq
 *     seal_open_update(&s, payload, n);       // in place, len in all
 *     r = seal_open_end(&s, tag);             // -EBADMSG: forged or short */
static inline bool seal_streams(const Seal *s) {
        return s->cipher == CIPHER_AES256GCM || seal_aegis_lanes(s) > 0;
}
void seal_begin(Seal *s, FrameHeader *h, uint8_t hdr[FRAME_HEADER_SIZE], size_t len);
void seal_update(Seal *s, uint8_t *dst, const uint8_t *src, size_t n);
void seal_end(Seal *s, uint8_t tag[FRAME_TAG_SIZE]);
int seal_open_begin(Seal *s, const uint8_t hdr[FRAME_HEADER_SIZE], const FrameHeader *h);
int seal_open_update(Seal *s, uint8_t *payload, size_t n);
int seal_open_end(Seal *s, const uint8_t tag[FRAME_TAG_SIZE]);

/* Check a received frame: h (decoded from hdr) must carry the expected seq;
 * the payload is authenticated with hdr and decrypted in place.
 * -EBADMSG if it fails; the link must then be dropped. */
int seal_open(Seal *s, const uint8_t hdr[FRAME_HEADER_SIZE], const FrameHeader *h, uint8_t *payload,
              size_t len, const uint8_t tag[FRAME_TAG_SIZE]);
/* Only the seq check: the header of a frame whose payload is still coming. */
static inline int seal_check_seq(const Seal *s, const FrameHeader *h) {
        return h->seq == s->rx_seq ? 0 : -EBADMSG;
}
