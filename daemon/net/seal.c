/* net/seal.c */
#include "seal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *cipher_to_string(Cipher c) {
        switch (c) {
        case CIPHER_NONE: return "plaintext";
        case CIPHER_AES256GCM: return "aes256gcm";
        case CIPHER_CHACHA20POLY1305: return "chacha20poly1305";
        case CIPHER_AEGIS256: return "aegis256";
        case CIPHER_AEGIS256X2: return "aegis256x2";
        case CIPHER_AEGIS256X4: return "aegis256x4";
        default: return "?";
        }
}

uint32_t cipher_available(void) {
        uint32_t m = CIPHER_BIT(CIPHER_CHACHA20POLY1305);
        if (sodium_init() >= 0 && crypto_aead_aes256gcm_is_available())
                m |= CIPHER_BIT(CIPHER_AES256GCM);
        if (aegis256_available(1))
                m |= CIPHER_BIT(CIPHER_AEGIS256);
        if (aegis256_available(2))
                m |= CIPHER_BIT(CIPHER_AEGIS256X2);
        if (aegis256_available(4))
                m |= CIPHER_BIT(CIPHER_AEGIS256X4);
        return m;
}

int seal_init(Seal *s, Cipher c, const uint8_t tx[SEAL_KEY_SIZE], const uint8_t rx[SEAL_KEY_SIZE]) {
        memset(s, 0, sizeof *s);
        if (c >= _CIPHER_MAX || (c != CIPHER_NONE && !(cipher_available() & CIPHER_BIT(c))))
                return -EOPNOTSUPP;
        s->cipher = c;
        memcpy(s->tx_key, tx, SEAL_KEY_SIZE);
        memcpy(s->rx_key, rx, SEAL_KEY_SIZE);
        if (c == CIPHER_AES256GCM) {
                s->tx_aes = EVP_CIPHER_CTX_new();
                s->rx_aes = EVP_CIPHER_CTX_new();
                if (!s->tx_aes || !s->rx_aes ||
                    EVP_EncryptInit_ex(s->tx_aes, EVP_aes_256_gcm(), NULL, tx, NULL) != 1 ||
                    EVP_DecryptInit_ex(s->rx_aes, EVP_aes_256_gcm(), NULL, rx, NULL) != 1) {
                        seal_clear(s);
                        return -ENOMEM;
                }
        }
        return 0;
}

void seal_clear(Seal *s) {
        EVP_CIPHER_CTX_free(s->tx_aes); /* wipes the expanded key */
        EVP_CIPHER_CTX_free(s->rx_aes);
        sodium_memzero(s, sizeof *s);
}

/* AES-256-GCM with a 12-byte nonce, the header as associated data. OpenSSL
 * works in int lengths: frames are at most 64 MiB (max_frame). Only a broken
 * libcrypto fails to seal: never send a frame unsealed. */
static void aes_begin(EVP_CIPHER_CTX *ctx, const uint8_t nonce[12], const uint8_t *ad) {
        int n;
        if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1 ||
            EVP_EncryptUpdate(ctx, NULL, &n, ad, FRAME_HEADER_SIZE) != 1)
                abort();
}

static void aes_update(EVP_CIPHER_CTX *ctx, uint8_t *dst, const uint8_t *src, size_t len) {
        int n;
        if (len && EVP_EncryptUpdate(ctx, dst, &n, src, (int)len) != 1)
                abort();
}

static void aes_end(EVP_CIPHER_CTX *ctx, uint8_t tag[FRAME_TAG_SIZE]) {
        uint8_t none[16];
        int n;
        if (EVP_EncryptFinal_ex(ctx, none, &n) != 1 ||
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, FRAME_TAG_SIZE, tag) != 1)
                abort();
}

static int aes_open_begin(EVP_CIPHER_CTX *ctx, const uint8_t nonce[12], const uint8_t *ad) {
        int n;
        if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1 ||
            EVP_DecryptUpdate(ctx, NULL, &n, ad, FRAME_HEADER_SIZE) != 1)
                return -EBADMSG;
        return 0;
}

static int aes_open_update(EVP_CIPHER_CTX *ctx, uint8_t *payload, size_t len) {
        int n;
        if (len && EVP_DecryptUpdate(ctx, payload, &n, payload, (int)len) != 1)
                return -EBADMSG;
        return 0;
}

static int aes_open_end(EVP_CIPHER_CTX *ctx, const uint8_t tag[FRAME_TAG_SIZE]) {
        uint8_t none[16];
        int n;
        if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, FRAME_TAG_SIZE, (void *)tag) != 1 ||
            EVP_DecryptFinal_ex(ctx, none, &n) != 1)
                return -EBADMSG;
        return 0;
}

/* 96-bit nonce: 4 zero bytes then the little-endian seq. Each direction has
 * its own key, so the same seq in both directions never reuses a nonce.
 * AEGIS takes 256 bits: the same 12 bytes, then zeros. */
static void make_nonce(uint8_t n[12], uint64_t seq) {
        memset(n, 0, 4);
        put_le64(n + 4, seq);
}

static bool is_aegis(const Seal *s) {
        return seal_aegis_lanes(s) > 0;
}

static void aegis_begin(const Seal *s, Aegis256 *a, const uint8_t key[SEAL_KEY_SIZE], const uint8_t nonce[12],
                        const uint8_t *ad) {
        uint8_t n[AEGIS256_NONCE_SIZE] = {};
        memcpy(n, nonce, 12);
        aegis256_init(a, seal_aegis_lanes(s), key, n);
        aegis256_absorb(a, ad, FRAME_HEADER_SIZE);
}

/* One AEAD message, begun, continued and ended, whichever streaming
 * cipher the link runs. */
static void tx_begin(Seal *s, const uint8_t nonce[12], const uint8_t *hdr) {
        if (is_aegis(s))
                aegis_begin(s, &s->tx_aegis, s->tx_key, nonce, hdr);
        else
                aes_begin(s->tx_aes, nonce, hdr);
}

static void tx_update(Seal *s, uint8_t *dst, const uint8_t *src, size_t n) {
        if (is_aegis(s))
                aegis256_encrypt(&s->tx_aegis, dst, src, n);
        else
                aes_update(s->tx_aes, dst, src, n);
}

static void tx_end(Seal *s, uint8_t tag[FRAME_TAG_SIZE]) {
        if (is_aegis(s))
                aegis256_tag(&s->tx_aegis, tag);
        else
                aes_end(s->tx_aes, tag);
}

static int rx_begin(Seal *s, const uint8_t nonce[12], const uint8_t *hdr) {
        if (!is_aegis(s))
                return aes_open_begin(s->rx_aes, nonce, hdr);
        aegis_begin(s, &s->rx_aegis, s->rx_key, nonce, hdr);
        return 0;
}

static int rx_update(Seal *s, uint8_t *payload, size_t n) {
        if (!is_aegis(s))
                return aes_open_update(s->rx_aes, payload, n);
        aegis256_decrypt(&s->rx_aegis, payload, payload, n);
        return 0;
}

static int rx_end(Seal *s, const uint8_t tag[FRAME_TAG_SIZE]) {
        if (!is_aegis(s))
                return aes_open_end(s->rx_aes, tag);
        return aegis256_verify(&s->rx_aegis, tag);
}

/* libsodium declares its buffers non-null even when empty. */
static uint8_t empty_payload[1];

void seal_frame_to(Seal *s, FrameHeader *h, uint8_t hdr[FRAME_HEADER_SIZE], uint8_t *dst,
                   const uint8_t *src, size_t len, uint8_t tag[FRAME_TAG_SIZE]) {
        uint8_t nonce[12];
        unsigned long long maclen;

        if (len == 0)
                dst = (uint8_t *)(src = empty_payload);
        if (seal_streams(s)) { /* the whole frame as one record */
                seal_begin(s, h, hdr, len);
                seal_update(s, dst, src, len);
                seal_end(s, tag);
                return;
        }
        h->seq = s->tx_seq++;
        h->length = (uint32_t)len;
        frame_header_encode(h, hdr);
        make_nonce(nonce, h->seq);
        if (s->cipher == CIPHER_CHACHA20POLY1305)
                crypto_aead_chacha20poly1305_ietf_encrypt_detached(dst, tag, &maclen, src, len, hdr,
                                                                   FRAME_HEADER_SIZE, NULL, nonce, s->tx_key);
        else if (dst != src && len)
                memcpy(dst, src, len);
}

void seal_frame(Seal *s, FrameHeader *h, uint8_t hdr[FRAME_HEADER_SIZE], uint8_t *payload,
                size_t len, uint8_t tag[FRAME_TAG_SIZE]) {
        seal_frame_to(s, h, hdr, payload, payload, len, tag);
}

int seal_open(Seal *s, const uint8_t hdr[FRAME_HEADER_SIZE], const FrameHeader *h, uint8_t *payload,
              size_t len, const uint8_t tag[FRAME_TAG_SIZE]) {
        uint8_t nonce[12];

        if (seal_check_seq(s, h) < 0 || h->length != len)
                return -EBADMSG;
        if (len == 0)
                payload = empty_payload;
        if (seal_streams(s)) { /* the whole frame as one record */
                if (seal_open_begin(s, hdr, h) < 0 || seal_open_update(s, payload, len) < 0)
                        return -EBADMSG;
                return seal_open_end(s, tag);
        }
        make_nonce(nonce, h->seq);
        if (s->cipher == CIPHER_CHACHA20POLY1305 &&
            crypto_aead_chacha20poly1305_ietf_decrypt_detached(payload, NULL, payload, len, tag, hdr,
                                                               FRAME_HEADER_SIZE, nonce, s->rx_key) != 0)
                return -EBADMSG;
        s->rx_seq++;
        return 0;
}

void seal_begin(Seal *s, FrameHeader *h, uint8_t hdr[FRAME_HEADER_SIZE], size_t len) {
        uint8_t nonce[12];

        if (!seal_streams(s))
                abort(); /* a caller's bug: this cipher does not stream */
        h->seq = s->tx_seq++;
        h->length = (uint32_t)len;
        frame_header_encode(h, hdr);
        make_nonce(nonce, h->seq);
        tx_begin(s, nonce, hdr);
        s->tx_left = len;
}

void seal_update(Seal *s, uint8_t *dst, const uint8_t *src, size_t n) {
        if (n > s->tx_left)
                abort(); /* more than the header announced: the frame would not open */
        tx_update(s, dst, src, n);
        s->tx_left -= n;
}

void seal_end(Seal *s, uint8_t tag[FRAME_TAG_SIZE]) {
        if (s->tx_left)
                abort();
        tx_end(s, tag);
}

int seal_open_begin(Seal *s, const uint8_t hdr[FRAME_HEADER_SIZE], const FrameHeader *h) {
        uint8_t nonce[12];

        if (!seal_streams(s) || seal_check_seq(s, h) < 0)
                return -EBADMSG;
        make_nonce(nonce, h->seq);
        s->rx_left = h->length;
        return rx_begin(s, nonce, hdr);
}

int seal_open_update(Seal *s, uint8_t *payload, size_t n) {
        if (n > s->rx_left)
                return -EBADMSG;
        s->rx_left -= n;
        return rx_update(s, payload, n);
}

int seal_open_end(Seal *s, const uint8_t tag[FRAME_TAG_SIZE]) {
        if (s->rx_left || rx_end(s, tag) < 0)
                return -EBADMSG;
        s->rx_seq++;
        return 0;
}
