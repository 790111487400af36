/* net/aegis.c — AEGIS-256, AEGIS-256X2 and AEGIS-256X4 (RFC 10032,
 * sections 3 and 4) with AES-NI and VAES intrinsics.
 *
 * The state is six 128-bit blocks S0..S5 per lane. Update(M) sets every Si
 * to one AES round of S(i-1) keyed by Si (S0's from S5, keyed by S0 ^ M),
 * so the six rounds of an update are independent and one update costs
 * about the latency of one round. The bulk loops keep S0 ^ Y for S0, Y
 * the xor of the blocks absorbed so far: an AES round keyed by K ^ M is the
 * round keyed by K, xored with M, so S0 ^ Y takes one AES round per update
 * with no xor in its way, and S0 itself (S1's next input) is one xor off
 * it. The longest cycle of dependencies gets shorter, decrypting most (the
 * keystream no longer feeds S0's round): 12 % faster sealing and 16 %
 * faster opening here (docs/figures.md). A message block x gives the
 * ciphertext x ^ S1 ^ S4 ^ S5 ^ (S2 & S3), then is absorbed with
 * Update(x). X2 keeps
 * lane 1 in the upper halves of 256-bit registers, X4 its four lanes in
 * the quarters of 512-bit ones; the lanes differ by a context xored into
 * S3 and S5 before each update of the initialization, and the tag is the
 * xor of the lanes' tags. */
#include "aegis.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/macro.h"

static size_t block_size(const Aegis256 *a) {
        return 16 * (size_t)a->lanes;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define ONE __attribute__((target("aes,avx")))
#define TWO __attribute__((target("aes,vaes,avx2")))
#define FOUR __attribute__((target("aes,vaes,avx2,avx512f")))

static const uint8_t C0[16] = { 0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d,
                                0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62 };
static const uint8_t C1[16] = { 0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1,
                                0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd };

/* VAES: CPUID leaf 7, ECX bit 9 (not every compiler's
 * __builtin_cpu_supports() knows it); the OS saving the YMM registers
 * comes with "avx2". */
static bool has_vaes(void) {
        unsigned a, b, c, d;
        return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 9));
}

bool aegis256_available(unsigned lanes) {
        bool aes = __builtin_cpu_supports("aes") && __builtin_cpu_supports("avx");
        if (lanes == 4)
                return aes && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && has_vaes();
        if (lanes == 2)
                return aes && __builtin_cpu_supports("avx2") && has_vaes();
        return lanes == 1 && aes;
}

/* ---- the three widths (aegis-lanes.h) --------------------------------------- */

#define LD1(p) _mm_loadu_si128((const __m128i *)(p))
#define ST1(p, v) _mm_storeu_si128((__m128i *)(p), v)

/* The lanes' contexts: the lane's index, then the highest index (zero for
 * one lane). */
static const uint8_t CTX1[16] = {};
static const uint8_t CTX2[32] = { [0] = 0, [1] = 1, [16] = 1, [17] = 1 };
static const uint8_t CTX4[64] = { [0] = 0, [1] = 3, [16] = 1, [17] = 3, [32] = 2, [33] = 3, [48] = 3, [49] = 3 };

/* one lane: AEGIS-256 in 128-bit registers */
#define LANES 1
#define TARGET ONE
#define VEC __m128i
#define XOR _mm_xor_si128
#define AND _mm_and_si128
#define AESENC _mm_aesenc_si128
#define ZERO _mm_setzero_si128
#define LOAD LD1
#define STORE ST1
#define ALL(b) (b)
#define FOLD(v) (v)
#define CTX CTX1
#include "aegis-lanes.h"

/* two lanes: AEGIS-256X2, lane 1 in the upper halves of 256-bit registers */
static inline TWO __m128i fold2(__m256i v) {
        return _mm_xor_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

#define LANES 2
#define TARGET TWO
#define VEC __m256i
#define XOR _mm256_xor_si256
#define AND _mm256_and_si256
#define AESENC _mm256_aesenc_epi128
#define ZERO _mm256_setzero_si256
#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define STORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define ALL _mm256_broadcastsi128_si256
#define FOLD fold2
#define CTX CTX2
#include "aegis-lanes.h"

/* four lanes: AEGIS-256X4, one per quarter of 512-bit registers */
static inline FOUR __m128i fold4(__m512i v) {
        __m256i h = _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
        return _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

#define LANES 4
#define TARGET FOUR
#define VEC __m512i
#define XOR _mm512_xor_si512
#define AND _mm512_and_si512
#define AESENC _mm512_aesenc_epi128
#define ZERO _mm512_setzero_si512
#define LOAD(p) _mm512_loadu_si512((const void *)(p))
#define STORE(p, v) _mm512_storeu_si512((void *)(p), v)
#define ALL _mm512_broadcast_i32x4
#define FOLD fold4
#define CTX CTX4
#include "aegis-lanes.h"

/* ---- by the number of lanes ----------------------------------------------- */

static void init_lanes(Aegis256 *a, const uint8_t *key, const uint8_t *nonce) {
        if (a->lanes == 4)
                init4(a, key, nonce);
        else if (a->lanes == 2)
                init2(a, key, nonce);
        else
                init1(a, key, nonce);
}

static size_t bulk(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n, bool dec) {
        if (a->lanes == 4)
                return bulk4(a, dst, src, n, dec);
        return a->lanes == 2 ? bulk2(a, dst, src, n, dec) : bulk1(a, dst, src, n, dec);
}

static void tag_lanes(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]) {
        if (a->lanes == 4)
                tag4(a, tag);
        else if (a->lanes == 2)
                tag2(a, tag);
        else
                tag1(a, tag);
}

#else /* no AES instructions in this build: never offered */

bool aegis256_available(unsigned lanes) {
        return false;
}

static void init_lanes(Aegis256 *a, const uint8_t *key, const uint8_t *nonce) {
        abort();
}

static size_t bulk(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n, bool dec) {
        abort();
}

static void tag_lanes(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]) {
        abort();
}

#endif

/* ---- the message, in pieces of any size ----------------------------------- */

/* Absorbing a whole block is encrypting it and dropping the ciphertext. */
static void absorb_block(Aegis256 *a, const uint8_t *m) {
        uint8_t out[16 * AEGIS256_MAX_LANES];
        bulk(a, out, m, block_size(a), false);
        explicit_bzero(out, sizeof out);
}

/* The keystream of the next block, the state left as it is: a zero block
 * encrypted on a copy (a block begun only at the end of a piece). */
static void keystream_out(const Aegis256 *a, uint8_t *z) {
        static const uint8_t zero[16 * AEGIS256_MAX_LANES];
        Aegis256 t = *a;
        bulk(&t, z, zero, block_size(a), false);
        explicit_bzero(&t, sizeof t);
}

void aegis256_init(Aegis256 *a, unsigned lanes, const uint8_t key[AEGIS256_KEY_SIZE],
                   const uint8_t nonce[AEGIS256_NONCE_SIZE]) {
        memset(a, 0, sizeof *a);
        a->lanes = lanes == 4 || lanes == 2 ? lanes : 1;
        init_lanes(a, key, nonce);
}

void aegis256_absorb(Aegis256 *a, const uint8_t *ad, size_t n) {
        size_t b = block_size(a);
        uint8_t last[16 * AEGIS256_MAX_LANES] = {};

        a->ad_len += n;
        for (; n >= b; ad += b, n -= b)
                absorb_block(a, ad);
        if (n) {
                memcpy(last, ad, n);
                absorb_block(a, last);
        }
}

/* Bytes of a block already begun: each leaves with its keystream byte, and
 * the block's plaintext is absorbed once it is whole. */
static size_t crypt_part(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n, bool dec) {
        size_t b = block_size(a), k = MIN(b - a->n_part, n);
        for (size_t i = 0; i < k; i++) {
                uint8_t in = src[i], out = in ^ a->z[a->n_part + i];
                a->part[a->n_part + i] = dec ? out : in;
                dst[i] = out;
        }
        a->n_part += (unsigned)k;
        if (a->n_part == b) {
                absorb_block(a, a->part);
                a->n_part = 0;
        }
        return k;
}

static void crypt_bytes(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n, bool dec) {
        size_t k;

        a->msg_len += n;
        if (a->n_part) {
                k = crypt_part(a, dst, src, n, dec);
                dst += k, src += k, n -= k;
        }
        k = bulk(a, dst, src, n, dec);
        dst += k, src += k, n -= k;
        if (n) { /* a block begun: its keystream kept for the rest of it */
                keystream_out(a, a->z);
                crypt_part(a, dst, src, n, dec);
        }
}

void aegis256_encrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n) {
        crypt_bytes(a, dst, src, n, false);
}

void aegis256_decrypt(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n) {
        crypt_bytes(a, dst, src, n, true);
}

/* A last block begun is absorbed zero-padded, then the tag. */
static void finalize(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]) {
        if (a->n_part) {
                memset(a->part + a->n_part, 0, block_size(a) - a->n_part);
                absorb_block(a, a->part);
        }
        tag_lanes(a, tag);
        explicit_bzero(a, sizeof *a);
}

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
