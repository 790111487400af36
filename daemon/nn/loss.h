/* nn/loss.h — softmax cross-entropy, the loss every classification job uses.
 *
 *     float loss = softmax_xent(dlogits, &correct, logits, labels, B, C);
 */
#pragma once

#include <stdint.h>

/* logits is (B,C), labels is (B) with values in [0,C).
 * Returns the mean loss over the batch. When dlogits (B,C) is not NULL it
 * receives d(mean loss)/d(logits) = (softmax - onehot) / B. When ret_correct
 * is not NULL it receives how many rows have their label as the argmax. */
float softmax_xent(float *dlogits, int *ret_correct, const float *logits, const int32_t *labels,
                   int B, int C);
