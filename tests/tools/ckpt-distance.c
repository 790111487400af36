/* ckpt-distance — how far apart two checkpoints of the same stage are, for
 * the shell tests (test-faults.sh measures how a partitioned cluster's
 * parameters part from the others' and come back):
 *
 *     ckpt-distance A B     # "0.00123 4.5e-05": |a - b| / |a| and max |a - b|
 *
 * Both files are read and checked the way the daemon reads a checkpoint
 * (run/checkpoint.h); exit 1 when either is refused or the two hold
 * different layers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/checkpoint.h"

static float *load(const char *path, CheckpointInfo *info) {
        Diag d = {};
        if (checkpoint_read_info(path, info, &d) < 0) {
                fprintf(stderr, "ckpt-distance: %s\n", d.text);
                return NULL;
        }
        float *params = malloc((info->n_params + info->n_state + 1) * sizeof(float));
        if (!params || checkpoint_read(path, info, params, info->n_params, params + info->n_params,
                                       info->n_state, &d) < 0) {
                fprintf(stderr, "ckpt-distance: %s\n", params ? d.text : "out of memory");
                free(params);
                return NULL;
        }
        return params;
}

int main(int argc, char *argv[]) {
        CheckpointInfo ia, ib;
        if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
                printf("Usage: ckpt-distance A B\n");
                return 0;
        }
        if (argc != 3) {
                fprintf(stderr, "Usage: ckpt-distance A B\n");
                return 64;
        }
        float *a = load(argv[1], &ia), *b = a ? load(argv[2], &ib) : NULL;
        if (!a || !b)
                return 1;
        if (ia.lo != ib.lo || ia.hi != ib.hi || ia.n_params != ib.n_params) {
                fprintf(stderr, "ckpt-distance: layers [%d, %d) against [%d, %d)\n", ia.lo, ia.hi, ib.lo, ib.hi);
                return 1;
        }
        double diff = 0, norm = 0, worst = 0;
        for (uint64_t i = 0; i < ia.n_params; i++) {
                double e = (double)a[i] - b[i];
                diff += e * e;
                norm += (double)a[i] * a[i];
                worst = fmax(worst, fabs(e));
        }
        printf("%.3g %.3g\n", norm > 0 ? sqrt(diff / norm) : sqrt(diff), worst);
        free(a);
        free(b);
        return 0;
}
