/* tensor/tensor.c */
#include "tensor.h"

#include <stdint.h>
#include <string.h>

#include "util/macro.h"

_simd_clones_ bool tensor_finite(const float *x, size_t n) {
        uint32_t bad = 0;
        for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &x[i], sizeof u);
                bad |= (u & 0x7f800000u) == 0x7f800000u; /* the exponent all ones */
        }
        return !bad;
}

size_t tensor_shape_numel(const int *shape, int ndim) {
        size_t n = 1;
        if (ndim < 0 || ndim > TENSOR_MAX_DIMS)
                return 0;
        for (int i = 0; i < ndim; i++)
                if (shape[i] <= 0 || !size_mul(n, (size_t)shape[i], &n))
                        return 0;
        return n;
}

int tensor_new(Arena *a, const int *shape, int ndim, Tensor **ret) {
        size_t n = tensor_shape_numel(shape, ndim);
        if (n == 0)
                return -EINVAL;

        Tensor *t = arena_alloc(a, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->data = arena_alloc_floats(a, n);
        if (!t->data)
                return -ENOMEM;
        t->numel = n;
        t->ndim = ndim;
        memcpy(t->shape, shape, sizeof(int) * (size_t)ndim);
        *ret = t;
        return 0;
}
