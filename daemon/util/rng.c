/* util/rng.c — xoshiro256** seeded by splitmix64 (Blackman and Vigna, 2018). */
#include "rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
        uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) {
        return (x << k) | (x >> (64 - k));
}

void rng_seed(Rng *r, uint64_t seed, uint64_t stream) {
        uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ULL);
        for (int i = 0; i < 4; i++)
                r->s[i] = splitmix64(&x);
}

uint64_t rng_next(Rng *r) {
        uint64_t *s = r->s;
        uint64_t result = rotl(s[1] * 5, 7) * 9;
        uint64_t t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = rotl(s[3], 45);
        return result;
}

float rng_uniform(Rng *r) {
        return (float)(rng_next(r) >> 40) * 0x1.0p-24f;
}

uint32_t rng_below(Rng *r, uint32_t n) {
        /* Lemire's multiply-shift with rejection. */
        uint64_t m = (uint64_t)(uint32_t)(rng_next(r) >> 32) * n;
        uint32_t low = (uint32_t)m;
        if (low < n) {
                uint32_t threshold = (uint32_t)-n % n;
                while (low < threshold) {
                        m = (uint64_t)(uint32_t)(rng_next(r) >> 32) * n;
                        low = (uint32_t)m;
                }
        }
        return (uint32_t)(m >> 32);
}

double rng_normal(Rng *r) {
        double u1 = ((double)(rng_next(r) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (double)(rng_next(r) >> 11) * 0x1.0p-53;
        return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
