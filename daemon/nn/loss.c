/* nn/loss.c */
#include "loss.h"

#include <math.h>
#include <stddef.h>

#include "nn-math.h"
#include "util/macro.h"

/* e[c] = exp(z[c] - max) for one row; returns their sum. Vectorized: a
 * language model's loss runs this over every position of the batch. */
_simd_clones_ static float exp_shifted(float *restrict e, const float *restrict z, float max, int C) {
        float sum = 0.0f;
        for (int c = 0; c < C; c++) {
                e[c] = nn_expf(z[c] - max);
                sum += e[c];
        }
        return sum;
}

float softmax_xent(float *dlogits, int *ret_correct, const float *logits, const int32_t *labels,
                   int B, int C) {
        double total = 0.0;
        int correct = 0;
        float e_row[256];

        for (int b = 0; b < B; b++) {
                const float *z = logits + (size_t)b * C;
                int y = labels[b], arg = 0;
                float max = z[0];
                for (int c = 1; c < C; c++)
                        if (z[c] > max) {
                                max = z[c];
                                arg = c;
                        }
                correct += arg == y;

                /* log-sum-exp with the max subtracted, so exp never overflows;
                 * the exponentials land in dlogits (or a row buffer) once */
                float *e = dlogits ? dlogits + (size_t)b * C : C <= 256 ? e_row : NULL;
                double sum;
                if (e)
                        sum = exp_shifted(e, z, max, C);
                else {
                        sum = 0.0;
                        for (int c = 0; c < C; c++)
                                sum += exp((double)(z[c] - max));
                }
                double lse = (double)max + log(sum);
                total += lse - (double)z[y];

                if (dlogits) {
                        float scale = (float)(1.0 / (sum * B));
                        for (int c = 0; c < C; c++)
                                e[c] *= scale;
                        e[y] -= 1.0f / (float)B;
                }
        }
        if (ret_correct)
                *ret_correct = correct;
        return (float)(total / B);
}
