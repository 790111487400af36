/* nn/loss.c */
#include "loss.h"

#include <math.h>
#include <stddef.h>

float softmax_xent(float *dlogits, int *ret_correct, const float *logits, const int32_t *labels,
                   int B, int C) {
        double total = 0.0;
        int correct = 0;

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

                /* log-sum-exp with the max subtracted, so exp never overflows */
                double sum = 0.0;
                for (int c = 0; c < C; c++)
                        sum += exp((double)(z[c] - max));
                double lse = (double)max + log(sum);
                total += lse - (double)z[y];

                if (dlogits) {
                        float *dz = dlogits + (size_t)b * C;
                        for (int c = 0; c < C; c++)
                                dz[c] = (float)(exp((double)z[c] - lse) / B);
                        dz[y] -= 1.0f / (float)B;
                }
        }
        if (ret_correct)
                *ret_correct = correct;
        return (float)(total / B);
}
