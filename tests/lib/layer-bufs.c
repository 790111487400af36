/* tests/lib/layer-bufs.c */
#include "layer-bufs.h"

#include <stdlib.h>

void bufs_done(Bufs *b) {
        free(b->x);
        free(b->dx);
        free(b->y);
        free(b->dy);
        free(b->w);
        free(b->dw);
        free(b->scratch);
        free(b->saved);
}

double probe_loss(Bufs *b, int B) {
        layer_forward(&b->l, &ops_naive, b->y, b->x, b->w, b->saved, b->scratch, B);
        double s = 0.0;
        for (size_t i = 0; i < b->nout; i++)
                s += (double)b->y[i] * (double)b->dy[i];
        return s;
}
