/* collective/quant.h — blockwise 8-bit quantization for compact averaging
 * payloads (about a quarter of float32's bytes).
 *
 * n values are cut into blocks of QUANT_BLOCK (the last may be short). A
 * block travels as its scale, a float32 little-endian, followed by one int8
 * per value: value = q * scale. The scale is the block's largest magnitude
 * over 127, rounded to float, and never below FLT_MIN (a block of zeros has
 * scale 0); q is value / scale rounded to nearest, in -127..127.
 *
 * Error bound, per block: every value comes back within half a step,
 *     |x - deq(q(x))| <= scale / 2 = absmax / 254
 * (FLT_MIN / 2 for a block whose absmax is below 127 * FLT_MIN), plus the
 * float rounding of q * scale, at most 2^-16 of that bound: in all,
 *     |x - deq(q(x))| <= scale / 2 * (1 + 2^-16).
 *
 *     uint8_t *b = malloc(quant_size(n));
 *     r = quant_from_float(b, x, n);    // -ERANGE: a value is not finite or too large
 *     r = quant_check(b, n);            // what a receiver does first: -EBADMSG if forged
 *     quant_to_float(y, b, n);          // y[i] = deq(q(x))[i]
 *     quant_add_to_float(acc, b, n);    // acc[i] += deq(q(x))[i]
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define QUANT_BLOCK 256
#define QUANT_BLOCK_BYTES (4 + QUANT_BLOCK)
#define QUANT_SCALE_MAX 0x1p64f /* a larger scale is refused: values beyond 127 * 2^64 do not travel */

/* Bytes that n values take: a scale per block, a byte per value. */
size_t quant_size(size_t n);
/* Quantize in (n values) into out (quant_size(n) bytes). -ERANGE if a value
 * is not finite or a block's scale would pass QUANT_SCALE_MAX; out is then
 * partly written. */
int quant_from_float(uint8_t *out, const float *in, size_t n);
/* A received buffer of n values: -EBADMSG if a scale is NaN, infinite,
 * negative, above QUANT_SCALE_MAX or subnormal, or a value is -128 (no
 * quantizer writes one). */
int quant_check(const uint8_t *in, size_t n);
/* Dequantize n values of a checked buffer into out; or add them to out. */
void quant_to_float(float *out, const uint8_t *in, size_t n);
void quant_add_to_float(float *out, const uint8_t *in, size_t n);
/* What quantizing lost: err[i] = in[i] - deq(q)[i], q = quant_from_float(in). */
void quant_error(float *err, const float *in, const uint8_t *q, size_t n);
