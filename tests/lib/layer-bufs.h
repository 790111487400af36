/* tests/lib/layer-bufs.h — one layer with its buffers, for the tests that
 * check its gradients against finite differences: the input, output and
 * weights, their gradients, and the layer's saved state and scratch. */
#pragma once

#include <stddef.h>

#include "nn/layer.h"

typedef struct Bufs {
        Layer l;
        size_t nin, nout;
        float *x, *y, *w, *dx, *dw, *dy, *scratch;
        void *saved;
} Bufs;

void bufs_done(Bufs *b);
/* L = sum(y * dy) in double after a forward pass of B samples on the naive
 * ops, so dL/dy = dy. */
double probe_loss(Bufs *b, int B);
