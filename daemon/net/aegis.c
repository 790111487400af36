/* net/aegis.c — AEGIS-256 (RFC 10032, section 3) with AES-NI intrinsics.
 *
 * The state is six 128-bit blocks S0..S5. Update(M) sets every Si to one
 * AES round of S(i-1) keyed by Si (S0's from S5, keyed by S0 ^ M), so the
 * six rounds of an update are independent and one update costs about the
 * latency of one round. A message block x gives the ciphertext
 * x ^ S1 ^ S4 ^ S5 ^ (S2 & S3), then is absorbed with Update(x). */
#include "aegis.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/macro.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AES __attribute__((target("aes")))

static const uint8_t C0[16] = { 0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d,
                                0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62 };
static const uint8_t C1[16] = { 0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1,
                                0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd };

bool aegis256_available(void) {
        return __builtin_cpu_supports("aes");
}

static inline __m128i load(const uint8_t *p) {
        return _mm_loadu_si128((const __m128i *)p);
}

static inline void store(uint8_t *p, __m128i v) {
        _mm_storeu_si128((__m128i *)p, v);
}

/* In the order that reads each old block before it is replaced. */
static inline AES void update(__m128i s[6], __m128i m) {
        __m128i s5 = s[5];
        s[5] = _mm_aesenc_si128(s[4], s5);
        s[4] = _mm_aesenc_si128(s[3], s[4]);
        s[3] = _mm_aesenc_si128(s[2], s[3]);
        s[2] = _mm_aesenc_si128(s[1], s[2]);
        s[1] = _mm_aesenc_si128(s[0], s[1]);
        s[0] = _mm_aesenc_si128(s5, _mm_xor_si128(s[0], m));
}

static inline __m128i keystream(const __m128i s[6]) {
        return _mm_xor_si128(_mm_xor_si128(s[1], s[4]), _mm_xor_si128(s[5], _mm_and_si128(s[2], s[3])));
}

static inline void state_load(const Aegis256 *a, __m128i s[6]) {
        for (int i = 0; i < 6; i++)
                s[i] = _mm_load_si128((const __m128i *)a->state[i]);
}

static inline void state_store(Aegis256 *a, const __m128i s[6]) {
        for (int i = 0; i < 6; i++)
                _mm_store_si128((__m128i *)a->state[i], s[i]);
}

AES void aegis256_init(Aegis256 *a, const uint8_t key[AEGIS256_KEY_SIZE], const uint8_t nonce[AEGIS256_NONCE_SIZE]) {
        __m128i k0 = load(key), k1 = load(key + 16);
        __m128i k0n0 = _mm_xor_si128(k0, load(nonce)), k1n1 = _mm_xor_si128(k1, load(nonce + 16));
        __m128i c0 = load(C0), c1 = load(C1);
        __m128i s[6] = { k0n0, k1n1, c1, c0, _mm_xor_si128(k0, c0), _mm_xor_si128(k1, c1) };

        for (int i = 0; i < 4; i++) {
                update(s, k0);
                update(s, k1);
                update(s, k0n0);
                update(s, k1n1);
        }
        memset(a, 0, sizeof *a);
        state_store(a, s);
}

AES void aegis256_absorb(Aegis256 *a, const uint8_t *ad, size_t n) {
        __m128i s[6];
        uint8_t last[16] = {};

        state_load(a, s);
        a->ad_len += n;
        for (; n >= 16; ad += 16, n -= 16)
                update(s, load(ad));
        if (n) {
                memcpy(last, ad, n);
                update(s, load(last));
        }
        state_store(a, s);
}

/* Bytes of a block already begun: each leaves with its keystream byte, and
 * the block's plaintext is absorbed once it is whole. */
static AES size_t crypt_part(Aegis256 *a, __m128i s[6], uint8_t *dst, const uint8_t *src, size_t n, bool dec) {
        size_t k = MIN(16 - a->n_part, n);
        for (size_t i = 0; i < k; i++) {
                uint8_t in = src[i], out = in ^ a->z[a->n_part + i];
                a->part[a->n_part + i] = dec ? out : in;
                dst[i] = out;
        }
        a->n_part += (unsigned)k;
        if (a->n_part == 16) {
                update(s, load(a->part));
                a->n_part = 0;
        }
        return k;
}

static AES void crypt_bytes(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n, bool dec) {
        __m128i s[6];
        size_t k;

        state_load(a, s);
        a->msg_len += n;
        if (a->n_part) {
                k = crypt_part(a, s, dst, src, n, dec);
                dst += k, src += k, n -= k;
        }
        if (dec)
                for (; n >= 16; dst += 16, src += 16, n -= 16) {
                        __m128i x = _mm_xor_si128(load(src), keystream(s));
                        update(s, x);
                        store(dst, x);
                }
        else
                for (; n >= 16; dst += 16, src += 16, n -= 16) {
                        __m128i x = load(src), z = keystream(s);
                        update(s, x);
                        store(dst, _mm_xor_si128(x, z));
                }
        if (n) { /* a block begun: its keystream kept for the rest of it */
                store(a->z, keystream(s));
                crypt_part(a, s, dst, src, n, dec);
        }
        state_store(a, s);
}

void aegis256_encrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n) {
        crypt_bytes(a, dst, src, n, false);
}

void aegis256_decrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n) {
        crypt_bytes(a, dst, src, n, true);
}

/* A last block begun is absorbed zero-padded; then seven updates with the
 * lengths in bits, and the tag is the xor of the six blocks. */
static AES void finalize(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]) {
        __m128i s[6];

        state_load(a, s);
        if (a->n_part) {
                memset(a->part + a->n_part, 0, 16 - a->n_part);
                update(s, load(a->part));
        }
        __m128i t = _mm_xor_si128(s[3], _mm_set_epi64x((long long)(a->msg_len * 8), (long long)(a->ad_len * 8)));
        for (int i = 0; i < 7; i++)
                update(s, t);
        __m128i x = _mm_xor_si128(_mm_xor_si128(s[0], s[1]), _mm_xor_si128(s[2], s[3]));
        store(tag, _mm_xor_si128(x, _mm_xor_si128(s[4], s[5])));
        explicit_bzero(a, sizeof *a);
}

#else /* no AES-NI in this build: never offered */

bool aegis256_available(void) {
        return false;
}

void aegis256_init(Aegis256 *a, const uint8_t key[AEGIS256_KEY_SIZE], const uint8_t nonce[AEGIS256_NONCE_SIZE]) {
        abort();
}

void aegis256_absorb(Aegis256 *a, const uint8_t *ad, size_t n) {
        abort();
}

void aegis256_encrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n) {
        abort();
}

void aegis256_decrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n) {
        abort();
}

static void finalize(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]) {
        abort();
}

#endif

void aegis256_tag(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]) {
        finalize(a, tag);
}

int aegis256_verify(Aegis256 *a, const uint8_t tag[AEGIS256_TAG_SIZE]) {
        uint8_t want[AEGIS256_TAG_SIZE], diff = 0;
        finalize(a, want);
        for (int i = 0; i < AEGIS256_TAG_SIZE; i++) /* constant time: no early exit */
                diff |= (uint8_t)(want[i] ^ tag[i]);
        explicit_bzero(want, sizeof want);
        return diff ? -EBADMSG : 0;
}
