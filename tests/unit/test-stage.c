/* Stages: deterministic initialization whatever the split, slabs, and a
 * two-stage forward/backward equal to the one-stage one. */
#include <criterion/criterion.h>
#include <string.h>

#include "nn/loss.h"
#include "nn/stage.h"
#include "tensor/ops.h"
#include "util/rng.h"

static ModelSpec small_cnn(void) {
        ModelSpec m = { .input = { 1, 8, 8 }, .n_classes = 3, .n_layers = 7 };
        m.layers[0] = (LayerSpec){ .kind = LAYER_CONV2D, .out = 4, .kernel = 3, .padding = 1 };
        m.layers[1] = (LayerSpec){ .kind = LAYER_GELU };
        m.layers[2] = (LayerSpec){ .kind = LAYER_MAXPOOL2D, .kernel = 2 };
        m.layers[3] = (LayerSpec){ .kind = LAYER_FLATTEN };
        m.layers[4] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 16 };
        m.layers[5] = (LayerSpec){ .kind = LAYER_RELU };
        m.layers[6] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 3 };
        return m;
}

Test(stage, same_seed_same_bits_whatever_the_split) {
        ModelSpec m = small_cnn();
        Stage *whole, *a, *b, *other;
        cr_assert_eq(stage_new(&m, 0, 7, 99, &whole, NULL), 0);
        cr_assert_eq(stage_new(&m, 0, 4, 99, &a, NULL), 0);
        cr_assert_eq(stage_new(&m, 4, 7, 99, &b, NULL), 0);
        cr_assert_eq(stage_new(&m, 0, 7, 100, &other, NULL), 0);
        cr_assert_eq(whole->n_params, a->n_params + b->n_params);
        cr_assert_eq(whole->n_params, model_spec_params(&m, 0, 7));
        cr_assert_eq(memcmp(whole->params, a->params, a->n_params * sizeof(float)), 0);
        cr_assert_eq(memcmp(whole->params + a->n_params, b->params, b->n_params * sizeof(float)), 0);
        cr_assert_neq(memcmp(whole->params, other->params, whole->n_params * sizeof(float)), 0);
        /* PyTorch's bound: |w| <= 1/sqrt(fan_in) */
        for (size_t i = 0; i < 40; i++)
                cr_assert(whole->params[i] >= -1.0f / 3 && whole->params[i] <= 1.0f / 3);
        stage_free(whole);
        stage_free(a);
        stage_free(b);
        stage_free(other);
}

Test(stage, two_stages_equal_one) {
        ModelSpec m = small_cnn();
        const int B = 5;
        Stage *whole, *a, *b;
        Trace *tw, *ta, *tb;
        stage_new(&m, 0, 7, 7, &whole, NULL);
        stage_new(&m, 0, 3, 7, &a, NULL);
        stage_new(&m, 3, 7, 7, &b, NULL);
        cr_assert_eq(trace_new(whole, B, &tw), 0);
        cr_assert_eq(trace_new(a, B, &ta), 0);
        cr_assert_eq(trace_new(b, B, &tb), 0);
        cr_assert(trace_bytes(whole, B) > 0);

        Rng r;
        rng_seed(&r, 1, RNG_STREAM_TEST);
        for (int i = 0; i < B * 64; i++)
                trace_input(tw)[i] = trace_input(ta)[i] = rng_uniform(&r);
        int32_t y[5] = { 0, 1, 2, 1, 0 };
        float dl[15], dl2[15], dmid[5 * 64];

        stage_forward(whole, &ops_naive, whole->params, tw, B);
        softmax_xent(dl, NULL, trace_output(tw), y, B, 3);
        stage_backward(whole, &ops_naive, whole->params, tw, dl, NULL, whole->grads, B, 0.0f, NULL, NULL);

        /* The pipeline: a's output is b's input; b's input gradient goes back to a. */
        stage_forward(a, &ops_naive, a->params, ta, B);
        memcpy(trace_input(tb), trace_output(ta), sizeof(float) * B * shape_numel(a->out));
        stage_forward(b, &ops_naive, b->params, tb, B);
        softmax_xent(dl2, NULL, trace_output(tb), y, B, 3);
        stage_backward(b, &ops_naive, b->params, tb, dl2, dmid, b->grads, B, 0.0f, NULL, NULL);
        stage_backward(a, &ops_naive, a->params, ta, dmid, NULL, a->grads, B, 0.0f, NULL, NULL);

        cr_assert_eq(memcmp(trace_output(tw), trace_output(tb), sizeof(float) * B * 3), 0);
        cr_assert_eq(memcmp(whole->grads, a->grads, sizeof(float) * a->n_params), 0);
        cr_assert_eq(memcmp(whole->grads + a->n_params, b->grads, sizeof(float) * b->n_params), 0);
        stage_free(whole);
        stage_free(a);
        stage_free(b);
}

Test(stage, rejects_bad_models) {
        ModelSpec m = small_cnn();
        Diag d = {};
        m.n_classes = 4;
        cr_assert_eq(model_spec_check(&m, NULL, &d), -EINVAL);
        cr_assert(strstr(d.text, "4 classes"), "%s", d.text);
        m = small_cnn();
        m.layers[3].kind = LAYER_RELU; /* linear after a 3-D tensor */
        cr_assert_eq(model_spec_check(&m, NULL, &d), -EINVAL);
        cr_assert(strstr(d.text, "layer 5 (linear)"), "%s", d.text);
        Stage *s;
        m = small_cnn();
        cr_assert_eq(stage_new(&m, 3, 3, 1, &s, &d), -EINVAL);
}
