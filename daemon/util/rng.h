/* util/rng.h — a small, seedable, portable random generator.
 *
 * Every node derives the same parameters and the same data order from the same
 * seed, bit for bit, whatever its libc: the generator is integer-only
 * (xoshiro128+ style state seeded through splitmix64) and floats are made from
 * the top 24 bits, so no libm call is involved.
 *
 *     Rng r;
 *     rng_seed(&r, seed, RNG_STREAM_INIT);
 *     float u = rng_uniform(&r);          // [0, 1)
 */
#pragma once

#include <stdint.h>

/* Independent streams derived from one seed, so that drawing one more number
 * for data order never changes the initial weights. */
enum {
        RNG_STREAM_INIT = 1,
        RNG_STREAM_SHUFFLE = 2,
        RNG_STREAM_TEST = 3,
};

typedef struct Rng {
        uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed, uint64_t stream);
uint64_t rng_next(Rng *r);
/* Uniform in [0, 1) with 24 bits of resolution. */
float rng_uniform(Rng *r);
/* Uniform integer in [0, n), without modulo bias. n > 0. */
uint32_t rng_below(Rng *r, uint32_t n);
/* Standard normal (Box-Muller in double); for tests only, not for anything that
 * must be bit-identical across machines. */
double rng_normal(Rng *r);
