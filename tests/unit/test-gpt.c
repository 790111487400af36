/* The transformer's layers (nn/transformer.h): each backward pass against
 * central finite differences and the BLAS path against the naive one; a GPT
 * cut into two stages equal to the whole; and the whole GPT against PyTorch
 * the way llm.c's test_gpt2 does it: tests/gpt-reference.py loads the
 * weights ravnest initialized and a batch, and returns logits, loss, every
 * gradient and the losses of 10 AdamW steps, which must all match. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/layer-bufs.h"
#include "cluster/partition.h"
#include "nn/loss.h"
#include "nn/optim.h"
#include "nn/stage.h"
#include "nn/transformer.h"
#include "tensor/ops.h"
#include "util/rng.h"

#define PYTHON "/usr/bin/python3"

typedef struct Case {
        const char *name;
        LayerSpec spec;
        Shape in;
        int B;
        float eps; /* finite-difference step */
} Case;

static const Case cases[] = {
        { "embed", { .kind = LAYER_EMBED, .vocab = 6, .out = 5 }, { 4, 1, 1 }, 3, 1e-2f },
        { "block", { .kind = LAYER_BLOCK, .heads = 2 }, { 5, 8, 1 }, 2, 1e-2f },
        { "block-1-head", { .kind = LAYER_BLOCK, .heads = 1 }, { 3, 6, 1 }, 2, 1e-2f },
        /* past one row block of attention (64): the second block is partial */
        { "block-long", { .kind = LAYER_BLOCK, .heads = 2 }, { 70, 4, 1 }, 1, 1e-2f },
        { "lm_head", { .kind = LAYER_LM_HEAD, .out = 7 }, { 3, 6, 1 }, 2, 1e-2f },
};

static void bufs_init(Bufs *b, const Case *c, uint64_t seed) {
        Rng r;
        Diag d = {};
        cr_assert_eq(layer_init(&b->l, &c->spec, c->in, &d), 0, "%s: layer_init: %s", c->name, d.text);
        b->nin = (size_t)c->B * shape_numel(b->l.in);
        b->nout = (size_t)c->B * shape_numel(b->l.out);
        b->x = calloc(b->nin, sizeof(float));
        b->dx = calloc(b->nin, sizeof(float));
        b->y = calloc(b->nout, sizeof(float));
        b->dy = calloc(b->nout, sizeof(float));
        b->w = calloc(b->l.n_params + 1, sizeof(float));
        b->dw = calloc(b->l.n_params + 1, sizeof(float));
        b->scratch = calloc(b->l.scratch_floats + (size_t)c->B * b->l.scratch_per_sample + 1, sizeof(float));
        b->saved = calloc((size_t)c->B * b->l.saved_bytes + 1, 1);

        rng_seed(&r, seed, RNG_STREAM_TEST);
        for (size_t i = 0; i < b->nin; i++)
                b->x[i] = c->spec.kind == LAYER_EMBED ? (float)rng_below(&r, (uint32_t)c->spec.vocab)
                                                      : 2.0f * rng_uniform(&r) - 1.0f;
        /* weights of order 1 (not GPT-2's 0.02), so attention's softmax is far
         * from uniform and every path carries gradient */
        for (size_t i = 0; i < b->l.n_params; i++)
                b->w[i] = rng_uniform(&r) - 0.5f;
        for (size_t i = 0; i < b->nout; i++)
                b->dy[i] = 2.0f * rng_uniform(&r) - 1.0f;
}

static void check_fd(Bufs *b, const Case *c, float *v, const float *grad, size_t n, const char *what) {
        size_t stride = n > 97 ? n / 97 : 1;
        for (size_t i = 0; i < n; i += stride) {
                float keep = v[i];
                v[i] = keep + c->eps;
                double lp = probe_loss(b, c->B);
                v[i] = keep - c->eps;
                double lm = probe_loss(b, c->B);
                v[i] = keep;
                double num = (lp - lm) / (2.0 * c->eps);
                double tol = 1e-2 * fmax(1.0, fabs(num));
                cr_expect(fabs(num - grad[i]) <= tol, "%s: d%s[%zu]: finite difference %.6f, backward %.6f",
                          c->name, what, i, num, (double)grad[i]);
        }
}

Test(gpt_layers, backward_matches_finite_differences) {
        for (size_t k = 0; k < ELEMENTSOF(cases); k++) {
                const Case *c = &cases[k];
                Bufs b;
                bufs_init(&b, c, 100 + k);
                probe_loss(&b, c->B);
                layer_backward(&b.l, &ops_naive, b.dx, b.dw, b.dy, b.x, b.y, b.w, b.saved, b.scratch, c->B, 0.0f);
                if (c->spec.kind != LAYER_EMBED) /* ids have no gradient */
                        check_fd(&b, c, b.x, b.dx, b.nin, "x");
                check_fd(&b, c, b.w, b.dw, b.l.n_params, "w");
                bufs_done(&b);
        }
}

/* The largest |a - b| over the largest |b|: one figure per tensor, that does
 * not blow up on entries that happen to be near 0. */
static double rel_err(const float *a, const float *b, size_t n) {
        double err = 0.0, scale = 0.0;
        for (size_t i = 0; i < n; i++) {
                err = fmax(err, fabs((double)a[i] - (double)b[i]));
                scale = fmax(scale, fabs((double)b[i]));
        }
        return scale > 0 ? err / scale : err;
}

Test(gpt_layers, blas_matches_naive) {
        ops_blas_set_threads(2); /* splits attention's tasks and the gemms */
        for (size_t k = 0; k < ELEMENTSOF(cases); k++) {
                const Case *c = &cases[k];
                Bufs n, f;
                bufs_init(&n, c, 7 + k);
                bufs_init(&f, c, 7 + k);
                for (size_t i = 0; i < n.l.n_params; i++)
                        n.dw[i] = f.dw[i] = 0.25f;
                layer_forward(&n.l, &ops_naive, n.y, n.x, n.w, n.saved, n.scratch, c->B);
                layer_forward(&f.l, &ops_blas, f.y, f.x, f.w, f.saved, f.scratch, c->B);
                cr_expect(rel_err(f.y, n.y, n.nout) < 1e-5, "%s: y differs by %g", c->name, rel_err(f.y, n.y, n.nout));
                /* beta 0.9: every parameter gradient honours the accumulation */
                layer_backward(&n.l, &ops_naive, n.dx, n.dw, n.dy, n.x, n.y, n.w, n.saved, n.scratch, c->B, 0.9f);
                layer_backward(&f.l, &ops_blas, f.dx, f.dw, f.dy, f.x, f.y, f.w, f.saved, f.scratch, c->B, 0.9f);
                if (c->spec.kind != LAYER_EMBED)
                        cr_expect(rel_err(f.dx, n.dx, n.nin) < 1e-5, "%s: dx differs by %g", c->name,
                                  rel_err(f.dx, n.dx, n.nin));
                cr_expect(rel_err(f.dw, n.dw, n.l.n_params) < 1e-5, "%s: dw differs by %g", c->name,
                          rel_err(f.dw, n.dw, n.l.n_params));
                bufs_done(&n);
                bufs_done(&f);
        }
        ops_blas_set_threads(1);
}

Test(gpt_layers, embed_clamps_bad_ids) {
        const Case *c = &cases[0];
        Bufs b, ok;
        bufs_init(&b, c, 1);
        bufs_init(&ok, c, 1);
        /* NaN, negative, too large, fractional: clamped into [0, V) */
        b.x[0] = NAN, ok.x[0] = 0.0f;
        b.x[1] = -3.0f, ok.x[1] = 0.0f;
        b.x[2] = 1e9f, ok.x[2] = (float)(c->spec.vocab - 1);
        b.x[3] = 2.5f, ok.x[3] = 2.0f;
        layer_forward(&b.l, &ops_blas, b.y, b.x, b.w, b.saved, b.scratch, c->B);
        layer_forward(&ok.l, &ops_blas, ok.y, ok.x, ok.w, ok.saved, ok.scratch, c->B);
        cr_assert_eq(memcmp(b.y, ok.y, b.nout * sizeof(float)), 0);
        bufs_done(&b);
        bufs_done(&ok);
}

/* ---- models -------------------------------------------------------------- */

static ModelSpec gpt_spec(int V, int T, int C, int L, int NH) {
        ModelSpec m = { .input = { T, 1, 1 }, .n_classes = V, .lm = true, .n_layers = L + 2 };
        m.layers[0] = (LayerSpec){ .kind = LAYER_EMBED, .vocab = V, .out = C };
        for (int i = 1; i <= L; i++)
                m.layers[i] = (LayerSpec){ .kind = LAYER_BLOCK, .heads = NH };
        m.layers[L + 1] = (LayerSpec){ .kind = LAYER_LM_HEAD, .out = V };
        return m;
}

Test(gpt_model, spec_checks) {
        ModelSpec m = gpt_spec(256, 16, 32, 3, 4);
        Diag d = {};
        Layer layers[MODEL_MAX_LAYERS];
        cr_assert_eq(model_spec_check(&m, layers, &d), 0, "%s", d.text);
        cr_assert_eq(layers[1].model_blocks, 3);
        cr_assert_eq(model_spec_labels_per_sample(&m), 16);
        cr_assert_eq(model_spec_params(&m, 0, m.n_layers),
                     (256 + 16) * 32 + 3 * (12 * 32 * 32 + 13 * 32) + 2 * 32 + 256 * 32);
        /* attention's T^2 term: twice the context, more than twice the work */
        ModelSpec m2 = gpt_spec(256, 32, 32, 3, 4);
        Layer l2[MODEL_MAX_LAYERS];
        cr_assert_eq(model_spec_check(&m2, l2, NULL), 0);
        cr_assert_gt(layer_forward_flops(&l2[1]), 2 * layer_forward_flops(&layers[1]));

        m.n_classes = 255; /* the head does not give the vocabulary */
        cr_assert_eq(model_spec_check(&m, NULL, &d), -EINVAL);
        cr_assert(strstr(d.text, "language model"), "%s", d.text);
        m = gpt_spec(256, 16, 32, 3, 4);
        m.layers[2].heads = 5; /* does not divide 32 */
        cr_assert_eq(model_spec_check(&m, NULL, &d), -EINVAL);
        cr_assert(strstr(d.text, "layer 3 (block)"), "%s", d.text);
        m = gpt_spec(256, 16, 32, 3, 4);
        m.layers[2] = m.layers[0]; /* ids in the middle */
        cr_assert_eq(model_spec_check(&m, NULL, &d), -EINVAL);
        cr_assert(strstr(d.text, "embed"), "%s", d.text);
        m = gpt_spec(256, 16, 32, 3, 4);
        m.input = (Shape){ 16, 32, 1 };
        cr_assert_eq(model_spec_check(&m, NULL, &d), -EINVAL);
}

Test(gpt_model, partition_cuts_between_equal_blocks) {
        ModelSpec m = gpt_spec(256, 128, 128, 8, 4);
        PartitionCosts c;
        Diag d = {};
        cr_assert_eq(partition_costs(&m, &(PartitionParams){ .micro_batch = 8, .in_flight = 2, .optim_floats = 2 }, &c, &d),
                     0, "%s", d.text);
        for (int i = 2; i <= 8; i++)
                cr_assert_float_eq(c.flops[i], c.flops[1], 1e-6 * c.flops[1], "block %d", i);
        /* two equal nodes: four blocks each, give or take the ends */
        PartitionNode nodes[2] = { { .gflops = 50, .memory = 1ull << 33 }, { .gflops = 50, .memory = 1ull << 33 } };
        int bounds[3];
        cr_assert_eq(partition_plan(&c, nodes, 2, bounds, &d), 0, "%s", d.text);
        cr_assert(bounds[1] >= 4 && bounds[1] <= 6, "cut after layer %d", bounds[1]);
}

Test(gpt_model, gpt2_initialization) {
        const int L = 8, C = 64;
        ModelSpec m = gpt_spec(256, 32, C, L, 4);
        Stage *s, *again;
        cr_assert_eq(stage_new(&m, 0, m.n_layers, 5, &s, NULL), 0);
        cr_assert_eq(stage_new(&m, 0, m.n_layers, 5, &again, NULL), 0);
        cr_assert_eq(memcmp(s->params, again->params, s->n_params * sizeof(float)), 0);
        const float *blk = s->params + s->layers[1].param_offset;
        const float *qkvw = blk + 2 * C, *attprojw = qkvw + 3 * C * C + 3 * C;
        double sq = 0.0, sqp = 0.0, mean = 0.0;
        for (int i = 0; i < 3 * C * C; i++) {
                sq += (double)qkvw[i] * qkvw[i];
                mean += qkvw[i];
        }
        for (int i = 0; i < C * C; i++)
                sqp += (double)attprojw[i] * attprojw[i];
        double std = sqrt(sq / (3 * C * C)), stdp = sqrt(sqp / (C * C));
        cr_expect(fabs(mean / (3 * C * C)) < 0.002, "mean %g", mean / (3 * C * C));
        cr_expect(std > 0.019 && std < 0.021, "qkv std %g", std);
        double want = 0.02 / sqrt(2.0 * L);
        cr_expect(stdp > 0.95 * want && stdp < 1.05 * want, "projection std %g, want %g", stdp, want);
        for (int i = 0; i < C; i++) {
                cr_assert_eq(blk[i], 1.0f);     /* ln1w */
                cr_assert_eq(blk[C + i], 0.0f); /* ln1b */
                cr_assert_eq(qkvw[3 * C * C + i], 0.0f); /* qkvb */
        }
        stage_free(s);
        stage_free(again);
}

Test(gpt_model, two_stages_equal_one) {
        ModelSpec m = gpt_spec(40, 9, 16, 3, 2);
        const int B = 3, T = 9, V = 40;
        Stage *whole, *a, *b;
        Trace *tw, *ta, *tb;
        cr_assert_eq(stage_new(&m, 0, 5, 7, &whole, NULL), 0);
        cr_assert_eq(stage_new(&m, 0, 2, 7, &a, NULL), 0); /* embed, block */
        cr_assert_eq(stage_new(&m, 2, 5, 7, &b, NULL), 0); /* block, block, lm_head */
        cr_assert_eq(trace_new(whole, B, &tw), 0);
        cr_assert_eq(trace_new(a, B, &ta), 0);
        cr_assert_eq(trace_new(b, B, &tb), 0);

        Rng r;
        rng_seed(&r, 1, RNG_STREAM_TEST);
        int32_t y[3 * 9];
        for (int i = 0; i < B * T; i++) {
                trace_input(tw)[i] = trace_input(ta)[i] = (float)rng_below(&r, V);
                y[i] = (int32_t)rng_below(&r, V);
        }
        float *dl = malloc(sizeof(float) * B * T * V), *dl2 = malloc(sizeof(float) * B * T * V);
        float *dmid = malloc(sizeof(float) * B * T * 16);
        stage_forward(whole, &ops_blas, whole->params, tw, B);
        softmax_xent(dl, NULL, trace_output(tw), y, B * T, V);
        stage_backward(whole, &ops_blas, whole->params, tw, dl, NULL, whole->grads, B, 0.0f, NULL, NULL);

        stage_forward(a, &ops_blas, a->params, ta, B);
        memcpy(trace_input(tb), trace_output(ta), sizeof(float) * B * shape_numel(a->out));
        stage_forward(b, &ops_blas, b->params, tb, B);
        softmax_xent(dl2, NULL, trace_output(tb), y, B * T, V);
        stage_backward(b, &ops_blas, b->params, tb, dl2, dmid, b->grads, B, 0.0f, NULL, NULL);
        stage_backward(a, &ops_blas, a->params, ta, dmid, NULL, a->grads, B, 0.0f, NULL, NULL);

        cr_assert_eq(memcmp(trace_output(tw), trace_output(tb), sizeof(float) * B * T * V), 0);
        cr_assert_eq(memcmp(whole->grads, a->grads, sizeof(float) * a->n_params), 0);
        cr_assert_eq(memcmp(whole->grads + a->n_params, b->grads, sizeof(float) * b->n_params), 0);
        free(dl);
        free(dl2);
        free(dmid);
        stage_free(whole);
        stage_free(a);
        stage_free(b);
}

/* ---- against PyTorch ----------------------------------------------------- */

static bool python_has_torch(void) {
        if (access(PYTHON, X_OK) < 0)
                return false;
        int st = system(PYTHON " -c 'import torch' >/dev/null 2>&1");
        return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void write_all(FILE *f, const void *p, size_t n) {
        cr_assert_eq(fwrite(p, 1, n, f), n);
}

static void read_all(FILE *f, void *p, size_t n) {
        cr_assert_eq(fread(p, 1, n, f), n, "short reference file");
}

Test(gpt_model, matches_pytorch, .timeout = 300) {
        if (!python_has_torch())
                cr_skip_test("%s cannot import torch (apt-get install python3-torch): the GPT is not checked against PyTorch",
                             PYTHON);
        /* T = 72 crosses attention's row block of 64 */
        enum { V = 64, T = 72, C = 32, L = 2, NH = 4, B = 3, STEPS = 10 };
        ModelSpec m = gpt_spec(V, T, C, L, NH);
        OptimSpec os;
        optim_spec_defaults(&os, OPTIM_ADAMW);
        os.lr = 1e-3f;
        os.weight_decay = 0.1f;

        Stage *s;
        Trace *t;
        Diag d = {};
        cr_assert_eq(stage_new(&m, 0, m.n_layers, 42, &s, &d), 0, "%s", d.text);
        cr_assert_eq(trace_new(s, B, &t), 0);
        size_t n = s->n_params;

        /* a batch of "text": ids and the same window shifted by one */
        Rng r;
        rng_seed(&r, 9, RNG_STREAM_TEST);
        int32_t ids[B * T], targets[B * T];
        for (int b = 0; b < B; b++) {
                int32_t seq[T + 1];
                for (int i = 0; i <= T; i++)
                        seq[i] = (int32_t)rng_below(&r, V);
                for (int i = 0; i < T; i++) {
                        ids[b * T + i] = seq[i];
                        targets[b * T + i] = seq[i + 1];
                }
        }

        char dir[] = "/tmp/test-gpt-XXXXXX", in[64], out[64], cmd[512];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(in, sizeof in, "%s/in", dir);
        snprintf(out, sizeof out, "%s/out", dir);
        FILE *f = fopen(in, "wb");
        cr_assert_not_null(f);
        int32_t hdr[8] = { 0x47505431, V, T, C, L, NH, B, STEPS };
        float hp[5] = { os.lr, os.beta1, os.beta2, os.eps, os.weight_decay };
        write_all(f, hdr, sizeof hdr);
        write_all(f, hp, sizeof hp);
        write_all(f, s->params, n * sizeof(float));
        write_all(f, ids, sizeof ids);
        write_all(f, targets, sizeof targets);
        fclose(f);
        snprintf(cmd, sizeof cmd, PYTHON " %s/tests/gpt-reference.py %s %s", SOURCE_ROOT, in, out);
        int st = system(cmd);
        cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed", cmd);

        float *ref_logits = malloc(sizeof(float) * B * T * V), *ref_grads = malloc(sizeof(float) * n);
        float ref_loss, ref_losses[STEPS];
        f = fopen(out, "rb");
        cr_assert_not_null(f);
        read_all(f, ref_logits, sizeof(float) * B * T * V);
        read_all(f, &ref_loss, sizeof ref_loss);
        read_all(f, ref_grads, sizeof(float) * n);
        read_all(f, ref_losses, sizeof ref_losses);
        fclose(f);
        unlink(in);
        unlink(out);
        rmdir(dir);

        /* the engine as training runs it: BLAS on two threads */
        ops_blas_set_threads(2);
        float *dlogits = malloc(sizeof(float) * B * T * V);
        for (int i = 0; i < B * T; i++)
                trace_input(t)[i] = (float)ids[i];
        stage_forward(s, &ops_blas, s->params, t, B);
        float loss = softmax_xent(dlogits, NULL, trace_output(t), targets, B * T, V);
        stage_backward(s, &ops_blas, s->params, t, dlogits, NULL, s->grads, B, 0.0f, NULL, NULL);

        double e_logits = rel_err(trace_output(t), ref_logits, (size_t)B * T * V);
        double e_loss = fabs((double)loss - ref_loss) / fabs(ref_loss);
        cr_log_info("GPT vs PyTorch: logits %.2g, loss %.2g (%.6f vs %.6f) relative", e_logits, e_loss,
                    (double)loss, (double)ref_loss);
        cr_expect(e_logits < 1e-5, "logits differ from PyTorch's by %g", e_logits);
        cr_expect(e_loss < 1e-5, "loss %.7f, PyTorch %.7f", (double)loss, (double)ref_loss);
        /* every parameter tensor of every layer, by its largest entry */
        double worst = 0.0;
        for (int i = 0; i < s->n_layers; i++) {
                const Layer *l = &s->layers[i];
                size_t o = l->param_offset, k = l->n_params;
                double e = rel_err(s->grads + o, ref_grads + o, k);
                worst = fmax(worst, e);
                cr_expect(e < 1e-4, "layer %d (%s): gradient differs from PyTorch's by %g", i + 1,
                          layer_kind_to_string(l->kind), e);
        }
        cr_log_info("GPT vs PyTorch: gradients %.2g relative (worst layer)", worst);

        /* 10 AdamW steps on the same batch, as torch.optim.AdamW */
        float *state = calloc(optim_state_floats(OPTIM_ADAMW, n), sizeof(float));
        Optim o;
        cr_assert_eq(optim_init(&o, &os, n, state), 0);
        double worst_step = 0.0;
        for (int step = 0; step < STEPS; step++) {
                stage_forward(s, &ops_blas, s->params, t, B);
                float l = softmax_xent(dlogits, NULL, trace_output(t), targets, B * T, V);
                stage_backward(s, &ops_blas, s->params, t, dlogits, NULL, s->grads, B, 0.0f, NULL, NULL);
                optim_step(&o, s->params, s->grads);
                double e = fabs((double)l - ref_losses[step]) / fabs(ref_losses[step]);
                worst_step = fmax(worst_step, e);
                cr_expect(e < 1e-5, "step %d: loss %.7f, PyTorch %.7f", step + 1, (double)l,
                          (double)ref_losses[step]);
        }
        cr_log_info("GPT vs PyTorch: 10 AdamW steps, loss %.5f -> %.5f, worst %.2g relative",
                    (double)ref_losses[0], (double)ref_losses[STEPS - 1], worst_step);
        cr_expect(ref_losses[STEPS - 1] < ref_losses[0] - 0.01f, "the reference did not learn");
        ops_blas_set_threads(1);
        free(state);
        free(dlogits);
        free(ref_logits);
        free(ref_grads);
        stage_free(s);
}
