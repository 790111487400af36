/* net/handshake.c */
#include "handshake.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "frame.h"

static const char label_t1[] = "ravnest handshake v1";
static const char label_keys[] = "ravnest link keys v1";

int handshake_init(Handshake *hs, const HandshakeConfig *cfg, bool initiator) {
        if (sodium_init() < 0)
                return -EIO;
        if (!cfg->identity || (!cfg->secret && cfg->n_allowed == 0) || cfg->ciphers == 0)
                return -EINVAL;
        memset(hs, 0, sizeof *hs);
        hs->cfg = *cfg;
        hs->initiator = initiator;
        hs->state = initiator ? HS_SEND_HELLO : HS_WAIT_HELLO;
        crypto_box_keypair(hs->eph_pk, hs->eph_sk); /* X25519 */
        randombytes_buf(hs->nonce, sizeof hs->nonce);
        return 0;
}

void handshake_clear(Handshake *hs) {
        sodium_memzero(hs, sizeof *hs);
}

/* What each side signs and MACs: its role, then the transcript. */
static void role_message(uint8_t out[33], bool initiator, const uint8_t t[32]) {
        out[0] = initiator ? 'I' : 'R';
        memcpy(out + 1, t, 32);
}

/* BLAKE2b(key = secret, role || t); zero without a secret. */
static void make_mac(const uint8_t *secret, uint8_t mac[HANDSHAKE_MAC_SIZE], bool initiator, const uint8_t t[32]) {
        uint8_t m[33];
        if (!secret) {
                memset(mac, 0, HANDSHAKE_MAC_SIZE);
                return;
        }
        role_message(m, initiator, t);
        crypto_generichash(mac, HANDSHAKE_MAC_SIZE, m, sizeof m, secret, HANDSHAKE_SECRET_SIZE);
}

/* T1 = BLAKE2b(label || HELLO || cipher || eph || nonce || identity), and the
 * responder's MAC of it */
void handshake_reply_transcript(const uint8_t *secret, const uint8_t hello[HANDSHAKE_HELLO_SIZE],
                                const uint8_t fields[HANDSHAKE_REPLY_FIELDS], uint8_t t1[32],
                                uint8_t mac[HANDSHAKE_MAC_SIZE]) {
        crypto_generichash_state st;
        crypto_generichash_init(&st, NULL, 0, 32);
        crypto_generichash_update(&st, (const uint8_t *)label_t1, sizeof label_t1);
        crypto_generichash_update(&st, hello, HANDSHAKE_HELLO_SIZE);
        crypto_generichash_update(&st, fields, HANDSHAKE_REPLY_FIELDS);
        crypto_generichash_final(&st, t1, 32);
        make_mac(secret, mac, false, t1);
}

/* T2 = BLAKE2b(T1 || initiator identity), and the initiator's MAC of it */
void handshake_auth_transcript(const uint8_t *secret, const uint8_t t1[32],
                               const uint8_t initiator_id[IDENTITY_PK_SIZE], uint8_t t2[32],
                               uint8_t mac[HANDSHAKE_MAC_SIZE]) {
        crypto_generichash_state st;
        crypto_generichash_init(&st, NULL, 0, 32);
        crypto_generichash_update(&st, t1, 32);
        crypto_generichash_update(&st, initiator_id, IDENTITY_PK_SIZE);
        crypto_generichash_final(&st, t2, 32);
        make_mac(secret, mac, true, t2);
}

static void sign_transcript(const Handshake *hs, uint8_t sig[64], bool initiator, const uint8_t t[32]) {
        uint8_t m[33];
        role_message(m, initiator, t);
        crypto_sign_detached(sig, NULL, m, sizeof m, hs->cfg.identity->sk);
}

/* The peer's identity, signature and MAC over transcript t (want: the
 * MAC the network secret gives). */
static int verify_peer(Handshake *hs, const uint8_t *id, const uint8_t *sig, const uint8_t *mac,
                       const uint8_t want[HANDSHAKE_MAC_SIZE], const uint8_t t[32]) {
        uint8_t m[33];
        bool peer_initiator = !hs->initiator;

        role_message(m, peer_initiator, t);
        if (crypto_sign_verify_detached(sig, m, sizeof m, id) != 0)
                return -EBADMSG;
        /* The peer holds this key, admitted or not: worth naming in a log. */
        memcpy(hs->peer_key, id, IDENTITY_PK_SIZE);
        hs->peer_key_known = true;
        if (hs->cfg.secret && sodium_memcmp(want, mac, HANDSHAKE_MAC_SIZE) != 0)
                return -EACCES;
        if (hs->cfg.n_allowed) {
                bool ok = false;
                for (size_t i = 0; i < hs->cfg.n_allowed; i++)
                        ok |= sodium_memcmp(hs->cfg.allowed[i], id, IDENTITY_PK_SIZE) == 0;
                if (!ok)
                        return -EACCES;
        }
        memcpy(hs->peer_id, id, IDENTITY_PK_SIZE);
        return 0;
}

/* The peer's ephemeral key, as soon as it arrives: shared = X25519(eph,
 * peer eph). A key of small order gives the all-zero shared secret (which
 * libsodium refuses): such a key is not one a real peer makes, and nothing
 * after it could be secret, so the handshake ends here. */
static int take_peer_eph(Handshake *hs, const uint8_t peer_eph[32]) {
        memcpy(hs->peer_eph, peer_eph, 32);
        if (crypto_scalarmult(hs->shared, hs->eph_sk, hs->peer_eph) != 0)
                return -EKEYREJECTED;
        return 0;
}

/* keys = BLAKE2b-512(key = network secret, label || shared || T2) */
static void derive_keys(Handshake *hs) {
        crypto_generichash_state st;

        crypto_generichash_init(&st, hs->cfg.secret, hs->cfg.secret ? HANDSHAKE_SECRET_SIZE : 0,
                                sizeof hs->keys);
        crypto_generichash_update(&st, (const uint8_t *)label_keys, sizeof label_keys);
        crypto_generichash_update(&st, hs->shared, sizeof hs->shared);
        crypto_generichash_update(&st, hs->t2, sizeof hs->t2);
        crypto_generichash_final(&st, hs->keys, sizeof hs->keys);
        sodium_memzero(hs->shared, sizeof hs->shared);
        sodium_memzero(hs->eph_sk, sizeof hs->eph_sk);
}

Cipher handshake_choose_cipher(uint32_t both) {
        if (both & CIPHER_BIT(CIPHER_NONE))
                return CIPHER_NONE;
        if (both & CIPHER_BIT(CIPHER_AEGIS256X4))
                return CIPHER_AEGIS256X4;
        if (both & CIPHER_BIT(CIPHER_AEGIS256X2))
                return CIPHER_AEGIS256X2;
        if (both & CIPHER_BIT(CIPHER_AEGIS256))
                return CIPHER_AEGIS256;
        if (both & CIPHER_BIT(CIPHER_AES256GCM))
                return CIPHER_AES256GCM;
        if (both & CIPHER_BIT(CIPHER_CHACHA20POLY1305))
                return CIPHER_CHACHA20POLY1305;
        return _CIPHER_MAX;
}

static int fail(Handshake *hs, int r) {
        hs->state = HS_FAILED;
        sodium_memzero(hs->eph_sk, sizeof hs->eph_sk);
        sodium_memzero(hs->shared, sizeof hs->shared);
        return r;
}

int handshake_next(Handshake *hs, uint8_t *ret_type, uint8_t *out, size_t cap) {
        switch (hs->state) {
        case HS_SEND_HELLO:
                if (cap < HANDSHAKE_HELLO_SIZE)
                        return -ENOBUFS;
                put_le32(hs->hello, hs->cfg.ciphers);
                memcpy(hs->hello + 4, hs->eph_pk, 32);
                memcpy(hs->hello + 36, hs->nonce, HANDSHAKE_NONCE_SIZE);
                memcpy(out, hs->hello, HANDSHAKE_HELLO_SIZE);
                *ret_type = FRAME_HELLO;
                hs->state = HS_WAIT_REPLY;
                return HANDSHAKE_HELLO_SIZE;

        case HS_SEND_REPLY: {
                if (cap < HANDSHAKE_REPLY_SIZE)
                        return -ENOBUFS;
                uint8_t *p = out;
                put_le32(p, (uint32_t)hs->cipher);
                memcpy(p + 4, hs->eph_pk, 32);
                memcpy(p + 36, hs->nonce, HANDSHAKE_NONCE_SIZE);
                memcpy(p + 68, hs->cfg.identity->pk, IDENTITY_PK_SIZE);
                handshake_reply_transcript(hs->cfg.secret, hs->hello, p, hs->t1, p + 164);
                sign_transcript(hs, p + 100, false, hs->t1);
                *ret_type = FRAME_HELLO_REPLY;
                hs->state = HS_WAIT_AUTH;
                return HANDSHAKE_REPLY_SIZE;
        }

        case HS_SEND_AUTH: {
                if (cap < HANDSHAKE_AUTH_SIZE)
                        return -ENOBUFS;
                memcpy(out, hs->cfg.identity->pk, IDENTITY_PK_SIZE);
                handshake_auth_transcript(hs->cfg.secret, hs->t1, hs->cfg.identity->pk, hs->t2, out + 96);
                sign_transcript(hs, out + 32, true, hs->t2);
                derive_keys(hs);
                *ret_type = FRAME_AUTH;
                hs->state = HS_DONE;
                return HANDSHAKE_AUTH_SIZE;
        }

        default:
                return 0;
        }
}

int handshake_recv(Handshake *hs, uint8_t type, const uint8_t *in, size_t len) {
        uint8_t want[HANDSHAKE_MAC_SIZE];
        int r;

        switch (hs->state) {
        case HS_WAIT_HELLO:
                if (type != FRAME_HELLO)
                        return fail(hs, -EPROTO);
                if (len != HANDSHAKE_HELLO_SIZE)
                        return fail(hs, -EBADMSG);
                memcpy(hs->hello, in, HANDSHAKE_HELLO_SIZE);
                hs->offered = get_le32(in);
                /* lanes (handshake.h): known bits only, and another lane opens no more */
                if ((hs->offered & 0x78000000u) ||
                    ((hs->offered & HANDSHAKE_LANE_EXTRA) && (hs->offered & HANDSHAKE_LANES_MASK)))
                        return fail(hs, -EBADMSG);
                r = take_peer_eph(hs, in + 4);
                if (r < 0)
                        return fail(hs, r);
                hs->cipher = handshake_choose_cipher(hs->offered & hs->cfg.ciphers);
                if (hs->cipher == _CIPHER_MAX)
                        return fail(hs, -EOPNOTSUPP);
                hs->state = HS_SEND_REPLY;
                return 0;

        case HS_WAIT_REPLY: {
                if (type != FRAME_HELLO_REPLY)
                        return fail(hs, -EPROTO);
                if (len != HANDSHAKE_REPLY_SIZE)
                        return fail(hs, -EBADMSG);
                uint32_t c = get_le32(in);
                /* The responder must pick one of ours; its signature below
                 * covers the choice, so nobody in the middle can weaken it. */
                if (c >= _CIPHER_MAX || !(hs->cfg.ciphers & CIPHER_BIT(c)))
                        return fail(hs, -EOPNOTSUPP);
                hs->cipher = (Cipher)c;
                r = take_peer_eph(hs, in + 4);
                if (r < 0)
                        return fail(hs, r);
                handshake_reply_transcript(hs->cfg.secret, hs->hello, in, hs->t1, want);
                r = verify_peer(hs, in + 68, in + 100, in + 164, want, hs->t1);
                if (r < 0)
                        return fail(hs, r);
                hs->state = HS_SEND_AUTH;
                return 0;
        }

        case HS_WAIT_AUTH:
                if (type != FRAME_AUTH)
                        return fail(hs, -EPROTO);
                if (len != HANDSHAKE_AUTH_SIZE)
                        return fail(hs, -EBADMSG);
                handshake_auth_transcript(hs->cfg.secret, hs->t1, in, hs->t2, want);
                r = verify_peer(hs, in, in + 32, in + 96, want, hs->t2);
                if (r < 0)
                        return fail(hs, r);
                derive_keys(hs);
                hs->state = HS_DONE;
                return 0;

        default:
                return fail(hs, -EPROTO);
        }
}

void handshake_result(const Handshake *hs, Cipher *ret_cipher, uint8_t tx[SEAL_KEY_SIZE],
                      uint8_t rx[SEAL_KEY_SIZE], uint8_t peer[IDENTITY_PK_SIZE]) {
        const uint8_t *i2r = hs->keys, *r2i = hs->keys + 32;
        *ret_cipher = hs->cipher;
        memcpy(tx, hs->initiator ? i2r : r2i, SEAL_KEY_SIZE);
        memcpy(rx, hs->initiator ? r2i : i2r, SEAL_KEY_SIZE);
        memcpy(peer, hs->peer_id, IDENTITY_PK_SIZE);
}
