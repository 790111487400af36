/* Blockwise 8-bit quantization: the size formula, the error bound quant.h
 * states over blocks of every kind, and the refusal of forged scales. */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>

#include "collective/quant.h"
#include "net/frame.h"
#include "util/macro.h"
#include "util/rng.h"

static float scale_of(const uint8_t *b, size_t block) {
        uint32_t u = get_le32(b + block * QUANT_BLOCK_BYTES);
        float s;
        memcpy(&s, &u, sizeof s);
        return s;
}

static void set_scale(uint8_t *b, size_t block, float s) {
        uint32_t u;
        memcpy(&u, &s, sizeof u);
        put_le32(b + block * QUANT_BLOCK_BYTES, u);
}

Test(quant, size) {
        cr_assert_eq(quant_size(0), 0);
        cr_assert_eq(quant_size(1), 5);
        cr_assert_eq(quant_size(QUANT_BLOCK), QUANT_BLOCK_BYTES);
        cr_assert_eq(quant_size(QUANT_BLOCK + 1), QUANT_BLOCK_BYTES + 5);
        cr_assert_eq(quant_size(10 * QUANT_BLOCK), 10 * QUANT_BLOCK_BYTES);
        cr_assert_eq(quant_size(1000), 1000 + 4 * 4);
}

enum { BLOCKS = 9, N = (BLOCKS - 1) * QUANT_BLOCK + 100 /* a short last block */ };

/* Blocks of every kind: zeros, all zero, huge, tiny (subnormal), magnitudes
 * mixed in one block, the extremes repeated, ordinary values. */
static void fill_varied(float *x, uint64_t seed) {
        Rng rng;
        rng_seed(&rng, seed, 0);
        for (size_t i = 0; i < N; i++) {
                size_t b = i / QUANT_BLOCK;
                float u = 2 * rng_uniform(&rng) - 1;
                switch (b) {
                case 0: x[i] = 0; break;
                case 1: x[i] = u * 2e21f; break;                            /* scale near 2^64 */
                case 2: x[i] = u * 1e-40f; break;                           /* subnormal values */
                case 3: x[i] = u * 1e-36f; break;                           /* absmax below 127 * FLT_MIN */
                case 4: x[i] = u * powf(10, (float)rng_below(&rng, 13) - 6); break;
                case 5: x[i] = i % 3 ? 0 : u; break;                         /* many exact zeros */
                case 6: x[i] = i % 2 ? 3.5f : -3.5f; break;                  /* every value at absmax */
                default: x[i] = u * (float)(1 + rng_below(&rng, 1000)); break;
                }
        }
}

Test(quant, roundtrip_within_the_stated_bound) {
        static float x[N], y[N], acc[N];
        static uint8_t b[N + 4 * BLOCKS];
        for (uint64_t seed = 1; seed <= 20; seed++) {
                fill_varied(x, seed);
                cr_assert_eq(quant_from_float(b, x, N), 0);
                cr_assert_eq(quant_check(b, N), 0);
                quant_to_float(y, b, N);
                for (size_t i = 0; i < N; i++)
                        acc[i] = 1000;
                quant_add_to_float(acc, b, N);
                for (size_t blk = 0; blk < BLOCKS; blk++) {
                        size_t lo = blk * QUANT_BLOCK, hi = lo + QUANT_BLOCK < N ? lo + QUANT_BLOCK : N;
                        float absmax = 0, s = scale_of(b, blk);
                        for (size_t i = lo; i < hi; i++)
                                absmax = fmaxf(absmax, fabsf(x[i]));
                        cr_assert(absmax ? s >= FLT_MIN && isnormal(s) : s == 0, "block %zu: scale %a", blk, s);
                        /* the scale is absmax / 127 rounded, or FLT_MIN: the bound in absmax terms */
                        cr_assert(s <= fmax(absmax / 127.0 * (1 + 0x1p-23), FLT_MIN), "block %zu: scale %a", blk, s);
                        long double bound = (long double)s / 2 * (1 + 0x1p-16L);
                        for (size_t i = lo; i < hi; i++) {
                                long double err = fabsl((long double)x[i] - y[i]);
                                cr_assert(err <= bound, "seed %" PRIu64 " value %zu: %a -> %a (scale %a)", seed, i,
                                          x[i], y[i], s);
                                cr_assert(fabsf(acc[i] - (1000 + y[i])) <= (1000 + fabsf(y[i])) * 0x1p-23f);
                        }
                }
                cr_assert(memcmp(y, x, QUANT_BLOCK * sizeof *x) == 0, "a block of zeros stays exact");
        }
}

Test(quant, rounds_to_nearest) {
        float x[4] = { 127, 1.5f, -1.4f, 126.6f }, y[4];
        uint8_t b[4 + 4];
        cr_assert_eq(quant_from_float(b, x, 4), 0);
        cr_assert_eq(scale_of(b, 0), 1.0f);
        cr_assert_eq((int8_t)b[4], 127);
        cr_assert_eq((int8_t)b[5], 2);
        cr_assert_eq((int8_t)b[6], -1);
        cr_assert_eq((int8_t)b[7], 127);
        quant_to_float(y, b, 4);
        cr_assert(y[0] == 127 && y[1] == 2 && y[2] == -1 && y[3] == 127);
}

Test(quant, values_that_cannot_travel) {
        float x[300] = {};
        uint8_t b[300 + 4 * 2];
        float bad[] = { NAN, INFINITY, -INFINITY, 3e21f /* scale above 2^64 */ };
        for (size_t k = 0; k < ELEMENTSOF(bad); k++) {
                x[280] = bad[k];
                cr_assert_eq(quant_from_float(b, x, 300), -ERANGE, "%g quantized", bad[k]);
        }
        x[280] = 127 * 0x1p64f; /* the largest that does */
        cr_assert_eq(quant_from_float(b, x, 300), 0);
        cr_assert_eq(scale_of(b, 1), 0x1p64f);
        cr_assert_eq(quant_check(b, 300), 0);
}

Test(quant, forged_scales_and_values_refused) {
        float x[3 * QUANT_BLOCK - 7];
        size_t n = ELEMENTSOF(x);
        uint8_t b[3 * QUANT_BLOCK - 7 + 4 * 3];
        for (size_t i = 0; i < n; i++)
                x[i] = (float)i - 300;
        cr_assert_eq(quant_from_float(b, x, n), 0);
        cr_assert_eq(quant_check(b, n), 0);
        float bad[] = { NAN, -NAN, INFINITY, -INFINITY, -1.0f, -0.0f, 0x1p65f, 0x1p64f * 1.0000001f,
                        0x1p-130f /* subnormal */, FLT_TRUE_MIN, FLT_MAX };
        for (size_t blk = 0; blk < 3; blk++)
                for (size_t k = 0; k < ELEMENTSOF(bad); k++) {
                        float good = scale_of(b, blk);
                        set_scale(b, blk, bad[k]);
                        cr_assert_eq(quant_check(b, n), -EBADMSG, "block %zu scale %a accepted", blk, bad[k]);
                        set_scale(b, blk, good);
                }
        float fine[] = { 0, FLT_MIN, 0x1p64f, 1e-20f };
        for (size_t k = 0; k < ELEMENTSOF(fine); k++) {
                set_scale(b, 2, fine[k]);
                cr_assert_eq(quant_check(b, n), 0, "scale %a refused", fine[k]);
        }
        b[2 * QUANT_BLOCK_BYTES + 4 + 10] = 0x80; /* -128: no quantizer writes it */
        cr_assert_eq(quant_check(b, n), -EBADMSG);
}
