/* The handshake state machine on its own: messages passed by hand between
 * an initiator and a responder, some of them forged. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "net/frame.h"
#include "net/handshake.h"

static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = "handshake unit test secret.....";

typedef struct Pair {
        Identity a, b;
        HandshakeConfig ca, cb;
        Handshake i, r;
} Pair;

static void pair_init(Pair *p) {
        cr_assert_eq(identity_generate(&p->a), 0);
        cr_assert_eq(identity_generate(&p->b), 0);
        p->ca = (HandshakeConfig){ .identity = &p->a, .secret = secret, .ciphers = CIPHER_BIT(CIPHER_CHACHA20POLY1305) };
        p->cb = p->ca;
        p->cb.identity = &p->b;
        cr_assert_eq(handshake_init(&p->i, &p->ca, true), 0);
        cr_assert_eq(handshake_init(&p->r, &p->cb, false), 0);
}

/* X25519 public keys of small order: 0 and 1 (order 1 and 4), and a point
 * of order 8 (from the list in libsodium's has_small_order()). */
static const uint8_t small_order[3][32] = {
        { 0 },
        { 1 },
        { 0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a,
          0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00 },
};

Test(handshake, both_sides_derive_the_same_keys) {
        Pair p;
        uint8_t buf[HANDSHAKE_MAX_SIZE], type;
        pair_init(&p);
        int n = handshake_next(&p.i, &type, buf, sizeof buf);
        cr_assert_eq(n, HANDSHAKE_HELLO_SIZE);
        cr_assert_eq(handshake_recv(&p.r, type, buf, (size_t)n), 0);
        n = handshake_next(&p.r, &type, buf, sizeof buf);
        cr_assert_eq(n, HANDSHAKE_REPLY_SIZE);
        cr_assert_eq(handshake_recv(&p.i, type, buf, (size_t)n), 0);
        n = handshake_next(&p.i, &type, buf, sizeof buf);
        cr_assert_eq(n, HANDSHAKE_AUTH_SIZE);
        cr_assert_eq(handshake_recv(&p.r, type, buf, (size_t)n), 0);
        cr_assert(handshake_done(&p.i) && handshake_done(&p.r));
        Cipher ci, cr;
        uint8_t itx[32], irx[32], rtx[32], rrx[32], ipeer[32], rpeer[32];
        handshake_result(&p.i, &ci, itx, irx, ipeer);
        handshake_result(&p.r, &cr, rtx, rrx, rpeer);
        cr_assert_eq(ci, cr);
        cr_assert_arr_eq(itx, rrx, 32);
        cr_assert_arr_eq(irx, rtx, 32);
        cr_assert_arr_eq(ipeer, p.b.pk, 32);
        cr_assert_arr_eq(rpeer, p.a.pk, 32);
}

/* The responder refuses a small-order key in HELLO at once: it answers
 * nothing, and says why (not "malformed"). */
Test(handshake, small_order_key_refused_at_hello) {
        for (int k = 0; k < 3; k++) {
                Pair p;
                uint8_t buf[HANDSHAKE_MAX_SIZE], type;
                pair_init(&p);
                int n = handshake_next(&p.i, &type, buf, sizeof buf);
                memcpy(buf + 4, small_order[k], 32);
                cr_assert_eq(handshake_recv(&p.r, type, buf, (size_t)n), -EKEYREJECTED, "key %d", k);
                cr_assert_eq(handshake_next(&p.r, &type, buf, sizeof buf), 0, "a reply to key %d", k);
                cr_assert_eq(p.r.state, HS_FAILED);
        }
}

/* The initiator refuses a small-order key in HELLO_REPLY before it looks at
 * the signature (which a forged key breaks: that would read -EBADMSG). */
Test(handshake, small_order_key_refused_at_reply) {
        for (int k = 0; k < 3; k++) {
                Pair p;
                uint8_t buf[HANDSHAKE_MAX_SIZE], type;
                pair_init(&p);
                int n = handshake_next(&p.i, &type, buf, sizeof buf);
                cr_assert_eq(handshake_recv(&p.r, type, buf, (size_t)n), 0);
                n = handshake_next(&p.r, &type, buf, sizeof buf);
                memcpy(buf + 4, small_order[k], 32);
                cr_assert_eq(handshake_recv(&p.i, type, buf, (size_t)n), -EKEYREJECTED, "key %d", k);
                cr_assert_eq(handshake_next(&p.i, &type, buf, sizeof buf), 0, "an AUTH after key %d", k);
        }
}

/* A peer that signs correctly but is not admitted: its key is known (so a
 * log can name it); one whose signature fails is not. */
Test(handshake, the_key_of_a_refused_peer_is_known) {
        Pair p;
        uint8_t buf[HANDSHAKE_MAX_SIZE], type;
        pair_init(&p);
        uint8_t only[1][IDENTITY_PK_SIZE] = { { 7 } };
        p.cb.secret = NULL;
        p.cb.allowed = (const uint8_t(*)[IDENTITY_PK_SIZE])only;
        p.cb.n_allowed = 1;
        p.ca.secret = NULL;
        p.ca.allowed = (const uint8_t(*)[IDENTITY_PK_SIZE])&p.b.pk;
        p.ca.n_allowed = 1;
        cr_assert_eq(handshake_init(&p.i, &p.ca, true), 0);
        cr_assert_eq(handshake_init(&p.r, &p.cb, false), 0);
        int n = handshake_next(&p.i, &type, buf, sizeof buf);
        cr_assert_eq(handshake_recv(&p.r, type, buf, (size_t)n), 0);
        n = handshake_next(&p.r, &type, buf, sizeof buf);
        cr_assert_eq(handshake_recv(&p.i, type, buf, (size_t)n), 0);
        n = handshake_next(&p.i, &type, buf, sizeof buf);
        uint8_t forged[HANDSHAKE_MAX_SIZE];
        memcpy(forged, buf, (size_t)n);
        cr_assert_eq(handshake_recv(&p.r, type, buf, (size_t)n), -EACCES);
        cr_assert(p.r.peer_key_known);
        cr_assert_arr_eq(p.r.peer_key, p.a.pk, 32);

        /* the same AUTH with its signature broken: no key to name */
        Handshake r2;
        cr_assert_eq(handshake_init(&r2, &p.cb, false), 0);
        r2.state = HS_WAIT_AUTH;
        forged[40] ^= 1;
        cr_assert_eq(handshake_recv(&r2, FRAME_AUTH, forged, (size_t)n), -EBADMSG);
        cr_assert(!r2.peer_key_known);
}

/* ravnest-protocol(7), HANDSHAKE, computed here from the page alone: the
 * transcripts, BLAKE2b's own keyed mode for the MACs (not HMAC), and the
 * link keys, checked against what the code sends and derives. */
Test(handshake, the_page_s_formulas) {
        Pair p;
        uint8_t hello[HANDSHAKE_HELLO_SIZE], reply[HANDSHAKE_REPLY_SIZE], auth[HANDSHAKE_AUTH_SIZE], type;
        uint8_t i_eph_sk[32];
        pair_init(&p);
        memcpy(i_eph_sk, p.i.eph_sk, 32);
        cr_assert_eq(handshake_next(&p.i, &type, hello, sizeof hello), (int)sizeof hello);
        cr_assert_eq(handshake_recv(&p.r, type, hello, sizeof hello), 0);
        cr_assert_eq(handshake_next(&p.r, &type, reply, sizeof reply), (int)sizeof reply);
        cr_assert_eq(handshake_recv(&p.i, type, reply, sizeof reply), 0);
        cr_assert_eq(handshake_next(&p.i, &type, auth, sizeof auth), (int)sizeof auth);
        cr_assert_eq(handshake_recv(&p.r, type, auth, sizeof auth), 0);

        /* T1 = BLAKE2b-256("ravnest handshake v1\0" || HELLO || REPLY[0..100)) */
        uint8_t t1[32], t2[32], m[33], mac[32];
        crypto_generichash_state st;
        crypto_generichash_init(&st, NULL, 0, 32);
        crypto_generichash_update(&st, (const uint8_t *)"ravnest handshake v1", 21);
        crypto_generichash_update(&st, hello, sizeof hello);
        crypto_generichash_update(&st, reply, 100);
        crypto_generichash_final(&st, t1, 32);
        /* the responder signs and MACs "R" || T1 */
        m[0] = 'R';
        memcpy(m + 1, t1, 32);
        cr_assert_eq(crypto_sign_verify_detached(reply + 100, m, 33, reply + 68), 0);
        crypto_generichash(mac, 32, m, 33, secret, 32); /* keyed BLAKE2b-256 */
        cr_assert_arr_eq(reply + 164, mac, 32);
        /* T2 = BLAKE2b-256(T1 || initiator identity); "I" || T2 */
        crypto_generichash_init(&st, NULL, 0, 32);
        crypto_generichash_update(&st, t1, 32);
        crypto_generichash_update(&st, auth, 32);
        crypto_generichash_final(&st, t2, 32);
        m[0] = 'I';
        memcpy(m + 1, t2, 32);
        cr_assert_eq(crypto_sign_verify_detached(auth + 32, m, 33, auth), 0);
        crypto_generichash(mac, 32, m, 33, secret, 32);
        cr_assert_arr_eq(auth + 96, mac, 32);
        /* and not HMAC-BLAKE2b, nor a truncated BLAKE2b-512 */
        uint8_t wide[64];
        crypto_generichash(wide, 64, m, 33, secret, 32);
        cr_assert(memcmp(wide, mac, 32) != 0);
        /* what a relay with the secret computes from the three messages alone */
        uint8_t rt[32], rmac[HANDSHAKE_MAC_SIZE];
        handshake_reply_transcript(secret, hello, reply, rt, rmac);
        cr_assert_arr_eq(rt, t1, 32);
        cr_assert_arr_eq(rmac, reply + HANDSHAKE_REPLY_SIZE - HANDSHAKE_MAC_SIZE, 32);
        handshake_auth_transcript(secret, t1, auth, rt, rmac);
        cr_assert_arr_eq(rt, t2, 32);
        cr_assert_arr_eq(rmac, auth + HANDSHAKE_AUTH_SIZE - HANDSHAKE_MAC_SIZE, 32);

        /* keys = keyed BLAKE2b-512(secret, "ravnest link keys v1\0" || X25519 || T2) */
        uint8_t shared[32], keys[64];
        cr_assert_eq(crypto_scalarmult(shared, i_eph_sk, reply + 4), 0);
        crypto_generichash_init(&st, secret, 32, 64);
        crypto_generichash_update(&st, (const uint8_t *)"ravnest link keys v1", 21);
        crypto_generichash_update(&st, shared, 32);
        crypto_generichash_update(&st, t2, 32);
        crypto_generichash_final(&st, keys, 64);
        Cipher c;
        uint8_t tx[32], rx[32], peer[32];
        handshake_result(&p.i, &c, tx, rx, peer);
        cr_assert_arr_eq(tx, keys, 32, "initiator-to-responder key");
        cr_assert_arr_eq(rx, keys + 32, 32, "responder-to-initiator key");
}

/* The responder's answer to a HELLO whose cipher word carries bits. */
static int hello_with_bits(uint32_t bits, Pair *p) {
        uint8_t buf[HANDSHAKE_MAX_SIZE], type;
        pair_init(p);
        p->ca.ciphers |= bits;
        cr_assert_eq(handshake_init(&p->i, &p->ca, true), 0);
        int n = handshake_next(&p->i, &type, buf, sizeof buf);
        return handshake_recv(&p->r, type, buf, (size_t)n);
}

/* The HELLO's lane bits (handshake.h) reach the responder as sent, under
 * the transcript: flipped in transit, the signatures fail; unknown bits,
 * and another lane that would open lanes of its own, are refused. */
Test(handshake, lane_bits) {
        static const uint32_t good[] = { 0, 3u << HANDSHAKE_LANES_SHIFT, 7u << HANDSHAKE_LANES_SHIFT, HANDSHAKE_LANE_EXTRA };
        for (unsigned k = 0; k < sizeof good / sizeof *good; k++) {
                Pair p;
                cr_assert_eq(hello_with_bits(good[k], &p), 0, "bits %#x", good[k]);
                cr_assert_eq(p.r.offered & 0xff000000u, good[k]);
        }
        static const uint32_t bad[] = { 1u << 27, 1u << 30, HANDSHAKE_LANE_EXTRA | 1u << HANDSHAKE_LANES_SHIFT };
        for (unsigned k = 0; k < sizeof bad / sizeof *bad; k++) {
                Pair p;
                cr_assert_eq(hello_with_bits(bad[k], &p), -EBADMSG, "bits %#x", bad[k]);
        }
        /* a lane count changed on the way: the responder signs what it got,
         * the initiator checks it against what it sent */
        Pair p;
        uint8_t buf[HANDSHAKE_MAX_SIZE], type;
        pair_init(&p);
        p.ca.ciphers |= 3u << HANDSHAKE_LANES_SHIFT;
        cr_assert_eq(handshake_init(&p.i, &p.ca, true), 0);
        int n = handshake_next(&p.i, &type, buf, sizeof buf);
        buf[3] = 0; /* no lanes */
        cr_assert_eq(handshake_recv(&p.r, type, buf, (size_t)n), 0);
        n = handshake_next(&p.r, &type, buf, sizeof buf);
        cr_assert_eq(handshake_recv(&p.i, type, buf, (size_t)n), -EBADMSG);
}

/* The cipher both sides end with: AEGIS-256X2 where both offer it, then
 * AEGIS-256, else
 * AES-256-GCM (a peer of an older version offers no AEGIS-256 bit), else
 * ChaCha20-Poly1305. */
static Cipher agreed(uint32_t initiator, uint32_t responder) {
        Pair p;
        uint8_t buf[HANDSHAKE_MAX_SIZE], type, k[32], peer[32];
        pair_init(&p);
        p.ca.ciphers = initiator;
        p.cb.ciphers = responder;
        cr_assert_eq(handshake_init(&p.i, &p.ca, true), 0);
        cr_assert_eq(handshake_init(&p.r, &p.cb, false), 0);
        for (int step = 0; step < 3; step++) {
                Handshake *from = step == 1 ? &p.r : &p.i, *to = step == 1 ? &p.i : &p.r;
                int n = handshake_next(from, &type, buf, sizeof buf);
                cr_assert_gt(n, 0);
                cr_assert_eq(handshake_recv(to, type, buf, (size_t)n), 0);
        }
        Cipher ci, cr;
        handshake_result(&p.i, &ci, k, k, peer);
        handshake_result(&p.r, &cr, k, k, peer);
        cr_assert_eq(ci, cr);
        return ci;
}

Test(handshake, cipher_choice) {
        uint32_t all = CIPHER_BIT(CIPHER_AEGIS256) | CIPHER_BIT(CIPHER_AES256GCM) | CIPHER_BIT(CIPHER_CHACHA20POLY1305);
        uint32_t older = CIPHER_BIT(CIPHER_AES256GCM) | CIPHER_BIT(CIPHER_CHACHA20POLY1305);
        uint32_t x2 = all | CIPHER_BIT(CIPHER_AEGIS256X2);
        uint32_t x4 = x2 | CIPHER_BIT(CIPHER_AEGIS256X4);
        cr_assert_eq(agreed(x4, x4), CIPHER_AEGIS256X4);
        cr_assert_eq(agreed(x4, x2), CIPHER_AEGIS256X2); /* a peer without AVX-512, or of an older version */
        cr_assert_eq(agreed(x2, x4), CIPHER_AEGIS256X2);
        cr_assert_eq(agreed(x2, x2), CIPHER_AEGIS256X2);
        cr_assert_eq(agreed(x2, all), CIPHER_AEGIS256); /* a peer without VAES */
        cr_assert_eq(agreed(all, all), CIPHER_AEGIS256);
        cr_assert_eq(agreed(older, all), CIPHER_AES256GCM);
        cr_assert_eq(agreed(all, older), CIPHER_AES256GCM);
        cr_assert_eq(agreed(all, CIPHER_BIT(CIPHER_CHACHA20POLY1305)), CIPHER_CHACHA20POLY1305);
}
