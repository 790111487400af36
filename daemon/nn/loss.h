/* nn/loss.h — softmax cross-entropy, the loss every classification job uses.
 *
 *     float loss = softmax_xent(dlogits, &correct, logits, labels, B, C);
 *
 * A language model (ModelSpec.lm) predicts at every position: its logits
 * are (B,T,V) and its targets (B,T), so it passes B*T rows of V and gets
 * the mean over all B*T positions, PyTorch's F.cross_entropy over
 * logits.view(-1, V):
 *
 *     float loss = softmax_xent(dlogits, NULL, logits, targets, B * T, V);
 */
#pragma once

#include <stdint.h>

/* logits is (B,C), labels is (B) with values in [0,C).
 * Returns the mean loss over the batch. When dlogits (B,C) is not NULL it
 * receives d(mean loss)/d(logits) = (softmax - onehot) / B. When ret_correct
 * is not NULL it receives how many rows have their label as the argmax. */
float softmax_xent(float *dlogits, int *ret_correct, const float *logits, const int32_t *labels,
                   int B, int C);
