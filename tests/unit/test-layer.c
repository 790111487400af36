/* Layers: backward against central finite differences, and the BLAS path
 * against the naive path, on random shapes with odd sizes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/layer-bufs.h"
#include "nn/layer.h"
#include "nn/loss.h"
#include "tensor/ops.h"
#include "util/rng.h"

typedef struct Case {
        const char *name;
        LayerSpec spec;
        Shape in;
        int B;
} Case;

static const Case cases[] = {
        { "linear", { .kind = LAYER_LINEAR, .out = 5 }, { 7, 1, 1 }, 3 },
        { "linear-wide", { .kind = LAYER_LINEAR, .out = 33 }, { 65, 1, 1 }, 9 },
        { "relu", { .kind = LAYER_RELU }, { 11, 1, 1 }, 3 },
        { "gelu", { .kind = LAYER_GELU }, { 3, 5, 2 }, 2 },
        { "flatten", { .kind = LAYER_FLATTEN }, { 2, 3, 5 }, 2 },
        { "conv2d", { .kind = LAYER_CONV2D, .out = 4, .kernel = 3, .padding = 1 }, { 3, 7, 5 }, 2 },
        { "conv2d-stride", { .kind = LAYER_CONV2D, .out = 3, .kernel = 3, .stride = 2 }, { 2, 9, 8 }, 3 },
        { "conv2d-1x1", { .kind = LAYER_CONV2D, .out = 5, .kernel = 1 }, { 3, 4, 3 }, 2 },
        { "maxpool2d", { .kind = LAYER_MAXPOOL2D, .kernel = 2 }, { 3, 6, 5 }, 2 },
        { "maxpool2d-overlap", { .kind = LAYER_MAXPOOL2D, .kernel = 3, .stride = 2 }, { 2, 7, 7 }, 2 },
};

static void bufs_init(Bufs *b, const Case *c, uint64_t seed) {
        Rng r;
        cr_assert_eq(layer_init(&b->l, &c->spec, c->in, NULL), 0, "%s: layer_init", c->name);
        b->nin = (size_t)c->B * shape_numel(b->l.in);
        b->nout = (size_t)c->B * shape_numel(b->l.out);
        b->x = calloc(b->nin, sizeof(float));
        b->dx = calloc(b->nin, sizeof(float));
        b->y = calloc(b->nout, sizeof(float));
        b->dy = calloc(b->nout, sizeof(float));
        b->w = calloc(b->l.n_params + 1, sizeof(float));
        b->dw = calloc(b->l.n_params + 1, sizeof(float));
        b->scratch = calloc(b->l.scratch_floats + 1, sizeof(float));
        b->saved = calloc((size_t)c->B * b->l.saved_bytes + 1, 1);

        rng_seed(&r, seed, RNG_STREAM_TEST);
        /* Inputs are a random permutation of a grid with step 0.025 that
         * avoids 0 by half a step: no two inputs of a max-pool window and no
         * input and the ReLU kink are within a finite-difference step (0.01)
         * of each other. */
        uint32_t *perm = malloc(sizeof(uint32_t) * b->nin);
        for (size_t i = 0; i < b->nin; i++)
                perm[i] = (uint32_t)i;
        for (size_t i = b->nin - 1; i > 0; i--) {
                uint32_t j = rng_below(&r, (uint32_t)(i + 1)), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
        }
        for (size_t i = 0; i < b->nin; i++)
                b->x[i] = 0.025f * ((float)perm[i] - (float)(b->nin / 2)) + 0.0125f;
        free(perm);
        for (size_t i = 0; i < b->l.n_params; i++)
                b->w[i] = 2.0f * rng_uniform(&r) - 1.0f;
        for (size_t i = 0; i < b->nout; i++)
                b->dy[i] = 2.0f * rng_uniform(&r) - 1.0f;
}

static void check_fd(Bufs *b, const Case *c, float *v, const float *grad, size_t n, const char *what) {
        /* Linear pieces are exact under central differences up to rounding;
         * eps is large enough that float rounding of the forward pass stays
         * far below the tolerance. */
        const float eps = 1e-2f;
        size_t stride = n > 64 ? n / 64 : 1;
        for (size_t i = 0; i < n; i += stride) {
                float keep = v[i];
                v[i] = keep + eps;
                double lp = probe_loss(b, c->B);
                v[i] = keep - eps;
                double lm = probe_loss(b, c->B);
                v[i] = keep;
                double num = (lp - lm) / (2.0 * eps);
                double tol = 5e-3 * fmax(1.0, fabs(num));
                cr_expect(fabs(num - grad[i]) <= tol, "%s: d%s[%zu]: finite difference %.6f, backward %.6f",
                          c->name, what, i, num, (double)grad[i]);
        }
}

Test(layer, backward_matches_finite_differences) {
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                const Case *c = &cases[k];
                Bufs b;
                bufs_init(&b, c, 100 + k);
                probe_loss(&b, c->B);
                layer_backward(&b.l, &ops_naive, b.dx, b.dw, b.dy, b.x, b.y, b.w, b.saved, b.scratch, c->B,
                               false);
                check_fd(&b, c, b.x, b.dx, b.nin, "x");
                if (b.l.n_params)
                        check_fd(&b, c, b.w, b.dw, b.l.n_params, "w");
                bufs_done(&b);
        }
}

static void expect_close(const float *a, const float *b, size_t n, float rtol, const char *name, const char *what) {
        for (size_t i = 0; i < n; i++) {
                float tol = rtol * fmaxf(1.0f, fabsf(b[i]));
                if (fabsf(a[i] - b[i]) > tol) {
                        cr_expect_fail("%s: %s[%zu]: blas %.7f, naive %.7f", name, what, i, (double)a[i], (double)b[i]);
                        return;
                }
        }
}

Test(layer, blas_matches_naive) {
        ops_blas_set_threads(2); /* also exercises the split of each gemm */
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                const Case *c = &cases[k];
                Bufs n, f;
                bufs_init(&n, c, 7 + k);
                bufs_init(&f, c, 7 + k);
                /* Accumulation: start from a non-zero gradient in both. */
                for (size_t i = 0; i < n.l.n_params; i++)
                        n.dw[i] = f.dw[i] = 0.25f;
                layer_forward(&n.l, &ops_naive, n.y, n.x, n.w, n.saved, n.scratch, c->B);
                layer_forward(&f.l, &ops_blas, f.y, f.x, f.w, f.saved, f.scratch, c->B);
                expect_close(f.y, n.y, n.nout, 1e-5f, c->name, "y");
                /* beta 0.9: dw = 0.9 dw + gradient, as when SGD's momentum
                 * buffer takes the gradient directly */
                layer_backward(&n.l, &ops_naive, n.dx, n.dw, n.dy, n.x, n.y, n.w, n.saved, n.scratch, c->B, 0.9f);
                layer_backward(&f.l, &ops_blas, f.dx, f.dw, f.dy, f.x, f.y, f.w, f.saved, f.scratch, c->B, 0.9f);
                expect_close(f.dx, n.dx, n.nin, 1e-5f, c->name, "dx");
                expect_close(f.dw, n.dw, n.l.n_params, 1e-5f, c->name, "dw");
                bufs_done(&n);
                bufs_done(&f);
        }
        ops_blas_set_threads(1);
}

Test(layer, accumulate_adds_to_the_gradient) {
        const Case *c = &cases[5]; /* conv2d: weights and bias */
        Bufs b;
        bufs_init(&b, c, 3);
        layer_forward(&b.l, &ops_blas, b.y, b.x, b.w, b.saved, b.scratch, c->B);
        layer_backward(&b.l, &ops_blas, NULL, b.dw, b.dy, b.x, b.y, b.w, b.saved, b.scratch, c->B, 0.0f);
        float *once = malloc(sizeof(float) * b.l.n_params);
        memcpy(once, b.dw, sizeof(float) * b.l.n_params);
        layer_backward(&b.l, &ops_blas, NULL, b.dw, b.dy, b.x, b.y, b.w, b.saved, b.scratch, c->B, 1.0f);
        for (size_t i = 0; i < b.l.n_params; i++)
                cr_assert_float_eq(b.dw[i], 2 * once[i], 1e-5f * fmaxf(1.0f, fabsf(once[i])));
        layer_backward(&b.l, &ops_blas, NULL, b.dw, b.dy, b.x, b.y, b.w, b.saved, b.scratch, c->B, 0.5f);
        for (size_t i = 0; i < b.l.n_params; i++)
                cr_assert_float_eq(b.dw[i], 2 * once[i], 1e-5f * fmaxf(1.0f, fabsf(once[i]))); /* 0.5 * 2 + 1 */
        free(once);
        bufs_done(&b);
}

Test(gemm, blas_matches_naive_all_transposes) {
        /* Sizes large enough that the pool splits the rows or the columns. */
        static const int dims[][3] = { { 300, 70, 1000 }, { 67, 301, 513 }, { 5, 3, 7 }, { 129, 1, 33 } };
        Rng r;
        rng_seed(&r, 42, RNG_STREAM_TEST);
        ops_blas_set_threads(2);
        for (size_t k = 0; k < 4; k++)
                for (int ta = 0; ta < 2; ta++)
                        for (int tb = 0; tb < 2; tb++) {
                                int M = dims[k][0], N = dims[k][1], K = dims[k][2];
                                float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N);
                                float *C1 = malloc(sizeof(float) * (size_t)M * N), *C2 = malloc(sizeof(float) * (size_t)M * N);
                                for (size_t i = 0; i < (size_t)M * K; i++)
                                        A[i] = rng_uniform(&r) - 0.5f;
                                for (size_t i = 0; i < (size_t)K * N; i++)
                                        B[i] = rng_uniform(&r) - 0.5f;
                                for (size_t i = 0; i < (size_t)M * N; i++)
                                        C1[i] = C2[i] = rng_uniform(&r);
                                int lda = ta ? M : K, ldb = tb ? K : N;
                                ops_blas.gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.75f, C1, N);
                                ops_naive.gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.75f, C2, N);
                                char name[64];
                                snprintf(name, sizeof name, "gemm %dx%dx%d ta=%d tb=%d", M, N, K, ta, tb);
                                expect_close(C1, C2, (size_t)M * N, 1e-4f, name, "C");
                                free(A);
                                free(B);
                                free(C1);
                                free(C2);
                        }
        ops_blas_set_threads(1);
}

Test(loss, softmax_xent_value_and_gradient) {
        /* Equal logits: loss is ln C, the gradient (1/C - onehot) / B. */
        float z[2 * 4] = { 0 }, dz[8];
        int32_t y[2] = { 1, 3 };
        int correct;
        float loss = softmax_xent(dz, &correct, z, y, 2, 4);
        cr_assert_float_eq(loss, logf(4.0f), 1e-6f);
        cr_assert_float_eq(dz[0], 0.25f / 2, 1e-7f);
        cr_assert_float_eq(dz[1], (0.25f - 1.0f) / 2, 1e-7f);

        /* Against finite differences on random logits. */
        Rng r;
        rng_seed(&r, 5, RNG_STREAM_TEST);
        float l[3 * 7], dl[3 * 7];
        int32_t lab[3] = { 0, 6, 2 };
        for (int i = 0; i < 21; i++)
                l[i] = 4.0f * rng_uniform(&r) - 2.0f;
        softmax_xent(dl, NULL, l, lab, 3, 7);
        for (int i = 0; i < 21; i++) {
                float keep = l[i], eps = 1e-3f;
                l[i] = keep + eps;
                double p = softmax_xent(NULL, NULL, l, lab, 3, 7);
                l[i] = keep - eps;
                double m = softmax_xent(NULL, NULL, l, lab, 3, 7);
                l[i] = keep;
                cr_expect(fabs((p - m) / (2 * eps) - dl[i]) < 1e-3, "dlogit %d: fd %.6f, analytic %.6f", i,
                          (p - m) / (2 * eps), (double)dl[i]);
        }

        /* Huge logits must not overflow. */
        float big[2] = { 1e30f, -1e30f };
        int32_t yb[1] = { 0 };
        cr_assert(isfinite(softmax_xent(NULL, &correct, big, yb, 1, 2)));
        cr_assert_eq(correct, 1);
}

Test(layer, rejects_bad_shapes) {
        Layer l;
        Diag d = {};
        cr_assert_eq(layer_init(&l, &(LayerSpec){ .kind = LAYER_LINEAR, .out = 4 }, (Shape){ 1, 28, 28 }, &d), -EINVAL);
        cr_assert(strstr(d.text, "flatten"), "%s", d.text);
        cr_assert_eq(layer_init(&l, &(LayerSpec){ .kind = LAYER_CONV2D, .out = 4, .kernel = 9 }, (Shape){ 1, 5, 5 }, &d), -EINVAL);
        cr_assert_eq(layer_init(&l, &(LayerSpec){ .kind = LAYER_MAXPOOL2D, .kernel = 0 }, (Shape){ 1, 5, 5 }, &d), -EINVAL);
        cr_assert_eq(layer_init(&l, &(LayerSpec){ .kind = LAYER_LINEAR, .out = 0 }, (Shape){ 4, 1, 1 }, &d), -EINVAL);
}
