/* net/aegis.h — AEGIS-256, AEGIS-256X2 and AEGIS-256X4, the AEADs of RFC
 * 10032, on the AES round instructions of x86-64 (AES-NI; VAES for X2, and
 * AVX-512 as well for X4).
 *
 * AEGIS-256 takes a 256-bit key and a 256-bit nonce and gives a 128-bit
 * tag; a message is encrypted and authenticated in one pass of six AES
 * rounds per 16 bytes, with no key schedule and no GHASH, so on a CPU with
 * AES-NI it runs several times faster than AES-256-GCM at the same key
 * size. AEGIS-256X2 runs two AEGIS-256 states side by side in the two
 * halves of 256-bit registers, 32 bytes per update, with the same security
 * (RFC 10032, section 4); it is another cipher, with other bytes on the
 * wire. AEGIS-256X4 runs four, in 512-bit registers. One Aegis256 holds one message in progress: the associated data
 * once, then the message in pieces of any sizes (a piece may end inside a
 * block), then the tag. The bytes and the tag are those of the whole
 * message at once, whatever the pieces.
 *
 *     Aegis256 a;
 *     aegis256_init(&a, 1, key, nonce);       // 1: AEGIS-256, 2: -256X2, 4: -256X4
 *     aegis256_absorb(&a, ad, ad_len);
 *     aegis256_encrypt(&a, ct, pt, n);        // or aegis256_decrypt()
 *     aegis256_tag(&a, tag);                  // or r = aegis256_verify(&a, tag)
 *
 * Only where aegis256_available() says so: elsewhere the calls abort. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AEGIS256_KEY_SIZE 32
#define AEGIS256_NONCE_SIZE 32
#define AEGIS256_TAG_SIZE 16
#define AEGIS256_MAX_LANES 4

typedef struct Aegis256 {
        uint8_t state[6][16 * AEGIS256_MAX_LANES]; /* block j of lane i at state[j] + 16 i (read unaligned) */
        uint8_t part[16 * AEGIS256_MAX_LANES]; /* the plaintext of a block begun, not yet absorbed */
        uint8_t z[16 * AEGIS256_MAX_LANES];    /* that block's keystream */
        unsigned lanes, n_part;
        uint64_t ad_len, msg_len; /* bytes */
} Aegis256;

/* This CPU has the instructions the variant of `lanes` (1, 2 or 4) needs, and
 * this build uses them. */
bool aegis256_available(unsigned lanes);

void aegis256_init(Aegis256 *a, unsigned lanes, const uint8_t key[AEGIS256_KEY_SIZE],
                   const uint8_t nonce[AEGIS256_NONCE_SIZE]);
/* The associated data, all of it in one call, before any message byte. */
void aegis256_absorb(Aegis256 *a, const uint8_t *ad, size_t n);
/* The next n bytes of the message; dst may be src. */
void aegis256_encrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n);
void aegis256_decrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n);
/* The end of the message: its tag, or -EBADMSG if tag is not it (compared
 * in constant time). Either wipes the state. */
void aegis256_tag(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]);
int aegis256_verify(Aegis256 *a, const uint8_t tag[AEGIS256_TAG_SIZE]);
