/* collective/quant.c — blockwise 8-bit quantization (see quant.h). */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "net/frame.h"
#include "quant.h"
#include "util/macro.h"

#define F32_EXP 0x7f800000u
#define F32_SIGN 0x80000000u

size_t quant_size(size_t n) {
        return n + 4 * ((n + QUANT_BLOCK - 1) / QUANT_BLOCK);
}

/* The largest |in[i]| as bits (magnitudes order like their bits); at least
 * F32_EXP if a value is not finite. */
_simd_clones_ static uint32_t absmax_bits(const float *in, size_t n) {
        uint32_t top = 0;
        for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &in[i], sizeof u);
                top = MAX(top, u & ~F32_SIGN);
        }
        return top;
}

/* One block: q = in / scale, to nearest (in double: exact enough that the
 * rounding is the true nearest), then the scale in front. */
_simd_clones_ static void block_encode(uint8_t *out, const float *in, size_t n, float scale) {
        int8_t *q = (int8_t *)(out + 4);
        double inv = scale > 0 ? 1.0 / scale : 0;
        uint32_t u;
        for (size_t i = 0; i < n; i++) {
                double v = rint((double)in[i] * inv);
                q[i] = (int8_t)CLAMP(v, -127.0, 127.0);
        }
        memcpy(&u, &scale, sizeof u);
        put_le32(out, u);
}

int quant_from_float(uint8_t *out, const float *in, size_t n) {
        for (size_t i = 0; i < n; i += QUANT_BLOCK, out += QUANT_BLOCK_BYTES) {
                size_t m = MIN((size_t)QUANT_BLOCK, n - i);
                uint32_t top = absmax_bits(in + i, m);
                float absmax, scale;
                if (top >= F32_EXP)
                        return -ERANGE;
                memcpy(&absmax, &top, sizeof absmax);
                /* never subnormal: a receiver refuses those */
                scale = top ? MAX(absmax / 127, FLT_MIN) : 0;
                if (scale > QUANT_SCALE_MAX)
                        return -ERANGE;
                block_encode(out, in + i, m, scale);
        }
        return 0;
}

static bool scale_ok(uint32_t u) {
        float s;
        memcpy(&s, &u, sizeof s);
        if (u == 0)
                return true;
        return !(u & F32_SIGN) && (u & F32_EXP) != 0 && (u & F32_EXP) != F32_EXP && s <= QUANT_SCALE_MAX;
}

int quant_check(const uint8_t *in, size_t n) {
        for (size_t i = 0; i < n; i += QUANT_BLOCK, in += QUANT_BLOCK_BYTES) {
                size_t m = MIN((size_t)QUANT_BLOCK, n - i);
                const int8_t *q = (const int8_t *)(in + 4);
                bool bad = !scale_ok(get_le32(in));
                for (size_t k = 0; k < m; k++)
                        bad |= q[k] == INT8_MIN;
                if (bad)
                        return -EBADMSG;
        }
        return 0;
}

static float block_scale(const uint8_t *in) {
        uint32_t u = get_le32(in);
        float s;
        memcpy(&s, &u, sizeof s);
        return s;
}

_simd_clones_ static void block_decode(float *restrict out, const int8_t *restrict q, float s, size_t n) {
        for (size_t i = 0; i < n; i++)
                out[i] = (float)q[i] * s;
}

_simd_clones_ static void block_decode_add(float *restrict out, const int8_t *restrict q, float s, size_t n) {
        for (size_t i = 0; i < n; i++)
                out[i] += (float)q[i] * s;
}

void quant_to_float(float *out, const uint8_t *in, size_t n) {
        for (size_t i = 0; i < n; i += QUANT_BLOCK, in += QUANT_BLOCK_BYTES)
                block_decode(out + i, (const int8_t *)(in + 4), block_scale(in), MIN((size_t)QUANT_BLOCK, n - i));
}

_simd_clones_ static void block_error(float *restrict err, const float *restrict in, const int8_t *restrict q, float s,
                                      size_t n) {
        for (size_t i = 0; i < n; i++)
                err[i] = in[i] - (float)q[i] * s;
}

void quant_error(float *err, const float *in, const uint8_t *q, size_t n) {
        for (size_t i = 0; i < n; i += QUANT_BLOCK, q += QUANT_BLOCK_BYTES)
                block_error(err + i, in + i, (const int8_t *)(q + 4), block_scale(q), MIN((size_t)QUANT_BLOCK, n - i));
}

void quant_add_to_float(float *out, const uint8_t *in, size_t n) {
        for (size_t i = 0; i < n; i += QUANT_BLOCK, in += QUANT_BLOCK_BYTES)
                block_decode_add(out + i, (const int8_t *)(in + 4), block_scale(in),
                                 MIN((size_t)QUANT_BLOCK, n - i));
}
