/* tensor/half.c — binary16 conversion: F16C when present, else bit tricks
 * (after F. Giesen, "half <-> float conversions", round-to-nearest-even). */
#include <string.h>

#include "half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C_PATH 1
#endif

static inline uint32_t bits(float f) {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        return u;
}

static inline float from_bits(uint32_t u) {
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
}

uint16_t half_from_float1(float f) {
        const uint32_t f32_inf = 255u << 23, f16_max = (127u + 16) << 23;
        const uint32_t denorm_magic = ((127u - 15) + (23 - 10) + 1) << 23;
        uint32_t u = bits(f), sign = u & 0x80000000u, o;

        u ^= sign;
        if (u >= f16_max) /* too big for a half: infinity, or a quiet NaN */
                o = u > f32_inf ? 0x7e00 : 0x7c00;
        else if (u < (113u << 23)) /* a half subnormal: let the FPU round */
                o = bits(from_bits(u) + from_bits(denorm_magic)) - denorm_magic;
        else {
                uint32_t odd = (u >> 13) & 1;
                u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
                o = u >> 13;
        }
        return (uint16_t)(o | sign >> 16);
}

float half_to_float1(uint16_t h) {
        const uint32_t exp_mask = 0x7c00u << 13;
        uint32_t o = (uint32_t)(h & 0x7fff) << 13, exp = o & exp_mask;

        o += (uint32_t)(127 - 15) << 23;
        if (exp == exp_mask) /* infinity or NaN */
                o += (uint32_t)(128 - 16) << 23;
        else if (exp == 0) /* zero or subnormal: renormalize */
                o = bits(from_bits(o + (1u << 23)) - from_bits(113u << 23));
        return from_bits(o | (uint32_t)(h & 0x8000) << 16);
}

#ifdef HAVE_F16C_PATH
__attribute__((target("avx,f16c"))) static void from_float_f16c(uint16_t *out, const float *in, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
                _mm_storeu_si128((__m128i *)(out + i),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
        for (; i < n; i++)
                out[i] = half_from_float1(in[i]);
}

__attribute__((target("avx,f16c"))) static void to_float_f16c(float *out, const uint16_t *in, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
        for (; i < n; i++)
                out[i] = half_to_float1(in[i]);
}

/* CPUID rather than __builtin_cpu_supports(), which not every compiler
 * knows "f16c" for; AVX also needs the OS to save the YMM registers. */
static int have_f16c(void) {
        static int have = -1;
        if (have < 0) {
                unsigned a, b, c, d, lo, hi;
                have = 0;
                if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_AVX) && (c & bit_OSXSAVE)) {
                        __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
                        have = (lo & 6) == 6;
                }
        }
        return have;
}
#endif

void half_from_float(uint16_t *out, const float *in, size_t n) {
#ifdef HAVE_F16C_PATH
        if (have_f16c())
                return from_float_f16c(out, in, n);
#endif
        for (size_t i = 0; i < n; i++)
                out[i] = half_from_float1(in[i]);
}

void half_to_float(float *out, const uint16_t *in, size_t n) {
#ifdef HAVE_F16C_PATH
        if (have_f16c())
                return to_float_f16c(out, in, n);
#endif
        for (size_t i = 0; i < n; i++)
                out[i] = half_to_float1(in[i]);
}
