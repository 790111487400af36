/* Frame protection: AES-256-GCM through libcrypto gives exactly the bytes
 * of the standard construction (held against libsodium's implementation and
 * both ways), AEGIS-256, AEGIS-256X2 and AEGIS-256X4 those of RFC 10032's test vectors, and every kind
 * of tampering fails to open. */
#include <criterion/criterion.h>
#include <sodium.h>
#include <string.h>

#include "net/aegis.h"
#include "net/seal.h"
#include "util/macro.h"

static void keys(uint8_t tx[32], uint8_t rx[32]) {
        for (int i = 0; i < 32; i++) {
                tx[i] = (uint8_t)(i * 3 + 1);
                rx[i] = (uint8_t)(i * 5 + 2);
        }
}

Test(seal, aes_gcm_matches_libsodium_both_ways) {
        cr_assert_eq(sodium_init() >= 0, 1);
        if (!crypto_aead_aes256gcm_is_available())
                cr_skip_test("SKIP: this CPU has no AES-NI: ravnest offers ChaCha20-Poly1305 instead");
        uint8_t tx[32], rx[32];
        keys(tx, rx);
        Seal a, b;
        cr_assert_eq(seal_init(&a, CIPHER_AES256GCM, tx, rx), 0);
        cr_assert_eq(seal_init(&b, CIPHER_AES256GCM, rx, tx), 0);
        size_t sizes[] = { 0, 1, 15, 16, 17, 4096, 1 << 20 };
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
                size_t n = sizes[k];
                uint8_t *pt = malloc(n + 1), *ct = malloc(n + 1), *ref = malloc(n + 1);
                uint8_t hdr[FRAME_HEADER_SIZE], tag[FRAME_TAG_SIZE], reftag[FRAME_TAG_SIZE], nonce[12] = {};
                for (size_t i = 0; i < n; i++)
                        pt[i] = (uint8_t)(i * 7 + k);
                FrameHeader h = { .type = FRAME_DATA, .stream = 3 };
                seal_frame_to(&a, &h, hdr, ct, pt, n, tag);
                /* libsodium, same key, nonce = 4 zero bytes + le64(seq), header as AD */
                nonce[4] = (uint8_t)h.seq;
                unsigned long long ml;
                crypto_aead_aes256gcm_encrypt_detached(ref, reftag, &ml, n ? pt : (uint8_t[1]){ 0 }, n, hdr,
                                                       FRAME_HEADER_SIZE, NULL, nonce, tx);
                cr_assert(memcmp(ct, ref, n) == 0 && memcmp(tag, reftag, 16) == 0, "size %zu: bytes differ", n);
                /* and libsodium's frame opens here */
                FrameHeader dh;
                FrameLimits lim = { 1 << 21, 1 << 16, 1 << 30 };
                cr_assert_eq(frame_header_decode(hdr, &lim, &dh), 0);
                cr_assert_eq(seal_open(&b, hdr, &dh, ref, n, reftag), 0, "size %zu", n);
                cr_assert(memcmp(ref, pt, n) == 0);
                free(pt);
                free(ct);
                free(ref);
        }
        seal_clear(&a);
        seal_clear(&b);
}

/* A changed payload, tag or header fails to open, for every cipher. */
Test(seal, tampering_fails_and_counters_move) {
        uint8_t tx[32], rx[32];
        keys(tx, rx);
        Cipher ciphers[] = { CIPHER_AES256GCM, CIPHER_CHACHA20POLY1305, CIPHER_AEGIS256, CIPHER_AEGIS256X2,
                             CIPHER_AEGIS256X4 };
        for (int c = 0; c < 5; c++) {
                if (!(cipher_available() & CIPHER_BIT(ciphers[c])))
                        continue;
                Seal a, b;
                cr_assert_eq(seal_init(&a, ciphers[c], tx, rx), 0);
                cr_assert_eq(seal_init(&b, ciphers[c], rx, tx), 0);
                uint8_t buf[100], hdr[FRAME_HEADER_SIZE], tag[16];
                for (int part = 0; part < 4; part++) {
                        memset(buf, 0x42, sizeof buf);
                        FrameHeader h = { .type = FRAME_DATA, .stream = 1 }, dh;
                        FrameLimits lim = { 1 << 21, 1 << 16, 1 << 30 };
                        seal_frame(&a, &h, hdr, buf, sizeof buf, tag);
                        if (part == 1)
                                buf[50] ^= 1;
                        if (part == 2)
                                tag[0] ^= 1;
                        if (part == 3)
                                hdr[8] ^= 1; /* the stream id: associated data */
                        cr_assert_eq(frame_header_decode(hdr, &lim, &dh), 0);
                        int r = seal_open(&b, hdr, &dh, buf, sizeof buf, tag);
                        cr_assert_eq(r, part == 0 ? 0 : -EBADMSG, "%s part %d", cipher_to_string(ciphers[c]), part);
                        if (part) { /* a failed frame does not move the counter: resync for the next */
                                b.rx_seq++;
                        } else {
                                for (size_t i = 0; i < sizeof buf; i++)
                                        cr_assert_eq(buf[i], 0x42);
                        }
                }
                seal_clear(&a);
                seal_clear(&b);
        }
}

/* A frame sealed in records of any sizes is byte for byte the frame sealed
 * whole; opened in records of other sizes it gives the plaintext back, and
 * a flipped byte anywhere, a short frame or a wrong tag fails at the end. */
static void records_are_the_whole_frame(Cipher c) {
        if (!(cipher_available() & CIPHER_BIT(c)))
                cr_skip_test("SKIP: this CPU has no AES-NI: no %s here", cipher_to_string(c));
        uint8_t tx[32], rx[32];
        keys(tx, rx);
        Seal whole, rec, open;
        cr_assert_eq(seal_init(&whole, c, tx, rx), 0);
        cr_assert_eq(seal_init(&rec, c, tx, rx), 0);
        cr_assert_eq(seal_init(&open, c, rx, tx), 0);
        size_t n = (1u << 20) + 123;
        uint8_t *pt = malloc(n), *ct = malloc(n), *ct2 = malloc(n);
        for (size_t i = 0; i < n; i++)
                pt[i] = (uint8_t)(i * 13 + 5);
        FrameLimits lim = { 1 << 21, 1 << 16, 1 << 30 };
        for (int round = 0; round < 4; round++) {
                uint8_t hdr[FRAME_HEADER_SIZE], hdr2[FRAME_HEADER_SIZE], tag[16], tag2[16];
                FrameHeader h = { .type = FRAME_DATA, .stream = 1 }, h2 = h, dh;
                seal_frame_to(&whole, &h, hdr, ct, pt, n, tag);
                seal_begin(&rec, &h2, hdr2, n);
                size_t steps[] = { 1, 15, 4096, 262144, 7 }; /* record sizes, in turn */
                for (size_t at = 0, k = 0; at < n; k++) {
                        size_t m = steps[(k + (size_t)round) % 5] < n - at ? steps[(k + (size_t)round) % 5] : n - at;
                        seal_update(&rec, ct2 + at, pt + at, m);
                        at += m;
                }
                seal_end(&rec, tag2);
                cr_assert(memcmp(hdr, hdr2, sizeof hdr) == 0 && memcmp(tag, tag2, 16) == 0 &&
                          memcmp(ct, ct2, n) == 0, "round %d: records differ from the whole frame", round);

                cr_assert_eq(frame_header_decode(hdr, &lim, &dh), 0);
                if (round == 1)
                        ct2[n / 2] ^= 1;
                if (round == 2)
                        tag2[0] ^= 0x80;
                cr_assert_eq(seal_open_begin(&open, hdr, &dh), 0);
                size_t end = round == 3 ? n - 1 : n; /* round 3: a byte short */
                for (size_t at = 0; at < end;) {
                        size_t m = 65536 + 17 < end - at ? 65536 + 17 : end - at;
                        cr_assert_eq(seal_open_update(&open, ct2 + at, m), 0);
                        at += m;
                }
                int r = seal_open_end(&open, tag2);
                if (round == 0) {
                        cr_assert_eq(r, 0);
                        cr_assert(memcmp(ct2, pt, n) == 0, "opened records differ from the plaintext");
                } else {
                        cr_assert_eq(r, -EBADMSG, "round %d: a bad frame opened", round);
                        break; /* the receiver drops the link */
                }
        }
        free(pt);
        free(ct);
        free(ct2);
        seal_clear(&whole);
        seal_clear(&rec);
        seal_clear(&open);
}

Test(seal, records_are_the_whole_frame_aes) {
        records_are_the_whole_frame(CIPHER_AES256GCM);
}

Test(seal, records_are_the_whole_frame_aegis) {
        records_are_the_whole_frame(CIPHER_AEGIS256);
}

/* ---- AEGIS-256 against the test vectors of RFC 10032 ---------------------- */

static size_t unhex(const char *s, uint8_t *out) {
        size_t n = 0;
        for (; s[0] && s[1]; s += 2)
                sscanf(s, "%2hhx", &out[n++]);
        return n;
}

typedef struct Vector {
        unsigned lanes;
        const char *key, *nonce, *ad, *msg, *ct, *tag;
        bool valid;
} Vector;

#define K1 "1001000000000000000000000000000000000000000000000000000000000000"
#define N1 "1000020000000000000000000000000000000000000000000000000000000000"
#define K2 "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define N2 "101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f"
static const Vector vectors[] = {
        { 1, K1, N1, "", "00000000000000000000000000000000", "754fc3d8c973246dcc6d741412a4b236",
          "3fe91994768b332ed7f570a19ec5896e", true },
        { 1, K1, N1, "", "", "", "e3def978a0f054afd1e761d7553afba3", true },
        { 1, K1, N1, "0001020304050607", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
          "f373079ed84b2709faee373584585d60accd191db310ef5d8b11833df9dec711", "8d86f91ee606e9ff26a01b64ccbdd91d",
          true },
        { 1, K1, N1, "0001020304050607", "000102030405060708090a0b0c0d", "f373079ed84b2709faee37358458",
          "c60b9c2d33ceb058f96e6dd03c215652", true },
        { 1, K1, N1, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223242526272829",
          "101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637",
          "57754a7d09963e7c787583a2e7b859bb24fa1e04d49fd550b2511a358e3bca252a9b1b8b30cc4a67",
          "ab8a7d53fd0e98d727accca94925e128", true },
        /* 6-9: key and nonce swapped, a ciphertext bit, an AD bit, a tag bit */
        { 1, N1, K1, "0001020304050607", NULL, "f373079ed84b2709faee37358458", "c60b9c2d33ceb058f96e6dd03c215652", false },
        { 1, K1, N1, "0001020304050607", NULL, "f373079ed84b2709faee37358459", "c60b9c2d33ceb058f96e6dd03c215652", false },
        { 1, K1, N1, "0001020304050608", NULL, "f373079ed84b2709faee37358458", "c60b9c2d33ceb058f96e6dd03c215652", false },
        { 1, K1, N1, "0001020304050607", NULL, "f373079ed84b2709faee37358458", "c60b9c2d33ceb058f96e6dd03c215653", false },
        /* AEGIS-256X2 */
        { 2, K2, N2, "", "", "", "62cdbab084c83dacdb945bb446f049c8", true },
        { 2, K2, N2, "0102030401020304",
          "040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607"
          "040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607"
          "04050607040506070405060704050607" "0405060704050607",
          "72120c2ea8236180d67859001f4729077b7064c414384fe3a7b52f1571f4f8a7d0f01e18db4f3bc0adb150702e5d147a"
          "8d36522132761b994c1bd395589e2ccf0790dfe2a3d12d61cd666b2859827739db4037dd3124c78424459376f6cac08e"
          "1a7223a2a43e398ce6385cd654a19f481cba3b8f25910b42",
          "635d391828520bf1512763f0c8f5cdbd", true },
        /* AEGIS-256X4 */
        { 4, K2, N2, "", "", "", "3b7fee6cee7bf17888ad11ed2397beb4", true },
        { 4, K2, N2, "0102030401020304",
          "040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607"
          "040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607"
          "04050607040506070405060704050607" "0405060704050607",
          "bfc2085b7e8017da99b0b6d646ae4d01f4ba8f2e7dfca1d759ae48a135139b9aaac6b4f5db810d426be1fdaff4e14541"
          "53a34b11da78ed7e418ee2ee9853042e95536aecbb694cea1b16a478eb0d4d1bf6509b1ce652a45af58e0e46ffccfa2d"
          "0426e702391d2ff5813808b81748a490dd656465fed61f09",
          "b63b611b13975e2f3dc3cb6c2397bfcd", true },
        /* a ciphertext bit, a tag bit */
        { 4, K2, N2, "0102030401020304", NULL,
          "bfc2085b7e8017da99b0b6d646ae4d01f4ba8f2e7dfca1d759ae48a135139b9aaac6b4f5db810d426be1fdaff4e14541"
          "53a34b11da78ed7e418ee2ee9853042e95536aecbb694cea1b16a478eb0d4d1bf6509b1ce652a45af58e0e46ffccfa2d"
          "0426e702391d2ff5813808b81748a490dd656465fed61f08",
          "b63b611b13975e2f3dc3cb6c2397bfcd", false },
        { 4, K2, N2, "", NULL, "", "3b7fee6cee7bf17888ad11ed2397beb5", false },
};

Test(seal, aegis256_rfc_vectors) {
        if (!aegis256_available(1))
                cr_skip_test("SKIP: this CPU has no AES-NI: ravnest does not offer AEGIS-256 here");
        if (!aegis256_available(2))
                cr_log_warn("SKIP: this CPU has no VAES: AEGIS-256X2's vectors are not checked here");
        if (!aegis256_available(4))
                cr_log_warn("SKIP: this CPU has no VAES or no AVX-512: AEGIS-256X4's vectors are not checked here");
        for (size_t v = 0; v < sizeof vectors / sizeof *vectors; v++) {
                const Vector *t = &vectors[v];
                uint8_t key[32], nonce[32], ad[64], msg[128], ct[128], tag[16], out[128], got[16];
                if (!aegis256_available(t->lanes))
                        continue;
                unhex(t->key, key);
                unhex(t->nonce, nonce);
                size_t nad = unhex(t->ad, ad), nct = unhex(t->ct, ct);
                unhex(t->tag, tag);
                Aegis256 a;
                if (t->msg) { /* encrypt: the ciphertext and the tag */
                        size_t n = unhex(t->msg, msg);
                        aegis256_init(&a, t->lanes, key, nonce);
                        aegis256_absorb(&a, ad, nad);
                        aegis256_encrypt(&a, out, msg, n);
                        aegis256_tag(&a, got);
                        cr_assert(n == nct && memcmp(out, ct, n) == 0, "vector %zu: ciphertext", v + 1);
                        cr_assert(memcmp(got, tag, 16) == 0, "vector %zu: tag", v + 1);
                }
                aegis256_init(&a, t->lanes, key, nonce);
                aegis256_absorb(&a, ad, nad);
                aegis256_decrypt(&a, out, ct, nct);
                cr_assert_eq(aegis256_verify(&a, tag), t->valid ? 0 : -EBADMSG, "vector %zu: verify", v + 1);
                if (t->msg)
                        cr_assert(memcmp(out, msg, nct) == 0, "vector %zu: plaintext", v + 1);
        }
}

/* A message in pieces of any sizes, each ending anywhere in a block, gives
 * the bytes and the tag of the whole message, both ways. */
static void pieces_are_the_whole(unsigned lanes) {
        if (!aegis256_available(lanes))
                cr_skip_test("SKIP: this CPU lacks AES-NI or VAES: ravnest does not offer this AEGIS here");
        uint8_t key[32], nonce[32] = { 7 }, ad[FRAME_HEADER_SIZE];
        size_t n = 5000;
        uint8_t *pt = malloc(n), *ct = malloc(n), *ct2 = malloc(n), tag[16], tag2[16];
        for (size_t i = 0; i < 32; i++)
                key[i] = (uint8_t)(i * 11 + 3);
        for (size_t i = 0; i < sizeof ad; i++)
                ad[i] = (uint8_t)i;
        for (size_t i = 0; i < n; i++)
                pt[i] = (uint8_t)(i * 13 + 5);
        Aegis256 a;
        aegis256_init(&a, lanes, key, nonce);
        aegis256_absorb(&a, ad, sizeof ad);
        aegis256_encrypt(&a, ct, pt, n);
        aegis256_tag(&a, tag);
        size_t steps[] = { 1, 15, 16, 17, 3, 64, 255, 4096 };
        for (int round = 0; round < 8; round++) {
                aegis256_init(&a, lanes, key, nonce);
                aegis256_absorb(&a, ad, sizeof ad);
                for (size_t at = 0, k = (size_t)round; at < n; k++) {
                        size_t m = MIN(steps[k % 8], n - at);
                        aegis256_encrypt(&a, ct2 + at, pt + at, m);
                        at += m;
                }
                aegis256_tag(&a, tag2);
                cr_assert(memcmp(ct, ct2, n) == 0 && memcmp(tag, tag2, 16) == 0, "round %d: pieces differ", round);
                aegis256_init(&a, lanes, key, nonce);
                aegis256_absorb(&a, ad, sizeof ad);
                for (size_t at = 0, k = (size_t)round + 3; at < n; k++) { /* in place, other pieces */
                        size_t m = MIN(steps[k % 8], n - at);
                        aegis256_decrypt(&a, ct2 + at, ct2 + at, m);
                        at += m;
                }
                cr_assert_eq(aegis256_verify(&a, tag2), 0, "round %d", round);
                cr_assert(memcmp(ct2, pt, n) == 0, "round %d: plaintext", round);
        }
        free(pt);
        free(ct);
        free(ct2);
}

Test(seal, aegis256_pieces_are_the_whole) {
        pieces_are_the_whole(1);
}

Test(seal, aegis256x2_pieces_are_the_whole) {
        pieces_are_the_whole(2);
}

Test(seal, records_are_the_whole_frame_aegis_x2) {
        records_are_the_whole_frame(CIPHER_AEGIS256X2);
}

Test(seal, aegis256x4_pieces_are_the_whole) {
        pieces_are_the_whole(4);
}

Test(seal, records_are_the_whole_frame_aegis_x4) {
        records_are_the_whole_frame(CIPHER_AEGIS256X4);
}
