/* tensor/half.h — IEEE 754 binary16 conversion for compact averaging payloads.
 *
 * Rounds to nearest, ties to even, like the F16C instructions, which are used
 * where the CPU has them; the portable path gives bit-identical results, so
 * members with and without F16C agree on every value.
 *
 *     uint16_t h[n];
 *     half_from_float(h, x, n);
 *     half_to_float(y, h, n);       // y[i] is x[i] rounded to 11 significant bits
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

void half_from_float(uint16_t *out, const float *in, size_t n);
void half_to_float(float *out, const uint16_t *in, size_t n);
/* The portable paths, exposed so tests can hold the fast ones against them. */
uint16_t half_from_float1(float f);
float half_to_float1(uint16_t h);
