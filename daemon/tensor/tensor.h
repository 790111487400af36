/* tensor/tensor.h — an n-dimensional float array whose memory an arena owns.
 *
 * Layers work on raw pointers with the shape written beside them (llm.c
 * style); Tensor is what crosses module boundaries: a batch, an activation
 * handed to the next stage, a parameter slab.
 *
 *     Tensor *x;
 *     r = tensor_new(arena, (int[]){B, 1, 28, 28}, 4, &x);
 *     x->data[0] = 1.0f;
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "arena.h"

#define TENSOR_MAX_DIMS 4

typedef struct Tensor {
        float *data;
        size_t numel;
        int ndim;
        int shape[TENSOR_MAX_DIMS];
} Tensor;

/* Whether every one of n floats is finite (no NaN, no infinity): what
 * every value from a peer or a file must be before it reaches a model.
 * Vectorized (a bit test, not isfinite()). */
bool tensor_finite(const float *x, size_t n);

/* A zeroed tensor of the given shape in the arena. -EINVAL on a bad shape,
 * -ENOMEM when the arena is out of memory. */
int tensor_new(Arena *a, const int *shape, int ndim, Tensor **ret);
/* Product of the dims; 0 when a dim is <= 0 or the product overflows. */
size_t tensor_shape_numel(const int *shape, int ndim);
