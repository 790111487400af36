/* Frame protection: AES-256-GCM through libcrypto gives exactly the bytes
 * of the standard construction (held against libsodium's implementation and
 * both ways), and every kind of tampering fails to open. */
#include <criterion/criterion.h>
#include <sodium.h>
#include <string.h>

#include "net/seal.h"

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

/* A changed payload, tag or header fails to open, for both ciphers. */
Test(seal, tampering_fails_and_counters_move) {
        uint8_t tx[32], rx[32];
        keys(tx, rx);
        Cipher ciphers[] = { CIPHER_AES256GCM, CIPHER_CHACHA20POLY1305 };
        for (int c = 0; c < 2; c++) {
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
Test(seal, records_are_the_whole_frame) {
        if (!(cipher_available() & CIPHER_BIT(CIPHER_AES256GCM)))
                cr_skip_test("SKIP: this CPU has no AES-NI: records are AES-256-GCM's");
        uint8_t tx[32], rx[32];
        keys(tx, rx);
        Seal whole, rec, open;
        cr_assert_eq(seal_init(&whole, CIPHER_AES256GCM, tx, rx), 0);
        cr_assert_eq(seal_init(&rec, CIPHER_AES256GCM, tx, rx), 0);
        cr_assert_eq(seal_init(&open, CIPHER_AES256GCM, rx, tx), 0);
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
