/* nn/nn-math.h — exp and tanh that the compiler can vectorize.
 *
 * libm's expf and tanhf are calls the vectorizer cannot inline, and softmax
 * and GELU run them on every element. These are branch-free: Cody and
 * Waite's range reduction x = n ln 2 + r and Cephes' degree-6 polynomial
 * for e^r (within 2 ulp of the true value on [-87, 88]), 2^n put in the
 * exponent bits. Internal to nn/.
 */
#pragma once

#include <stdint.h>
#include <string.h>

static inline float nn_expf(float x) {
        /* two selects, each on a comparison made on every lane: a nested
         * one would compare conditionally, which the vectorizer may not
         * do with trapping math */
        x = x < -87.0f ? -87.0f : x;
        x = x > 88.0f ? 88.0f : x;
        /* round to nearest by the 1.5 * 2^23 trick: no rounding instruction
         * needed, and the compiler cannot fold it without -ffast-math */
        float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
        float r = x - n * 0.693359375f;
        r = r - n * -2.12194440e-4f;
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        /* a NaN passes the clamps and stays NaN in p; converting it to an
         * integer would be undefined */
        int32_t e = ((int32_t)(n == n ? n : 0.0f) + 127) << 23;
        float scale;
        memcpy(&scale, &e, sizeof scale);
        return p * scale;
}

/* tanh(u) = (1 - e^-2|u|) / (1 + e^-2|u|) with u's sign: the absolute error
 * stays near 1e-7, which is what GELU's 1 + tanh needs. */
static inline float nn_tanhf(float u) {
        float e = nn_expf(-2.0f * __builtin_fabsf(u));
        return __builtin_copysignf((1.0f - e) / (1.0f + e), u);
}
