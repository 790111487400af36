/* nn/stage.c */
#include "stage.h"

#include <stdlib.h>
#include <string.h>

int model_spec_check(const ModelSpec *m, Layer *ret_layers, Diag *d) {
        Shape s = m->input;

        if (m->n_layers <= 0 || m->n_layers > MODEL_MAX_LAYERS)
                return diag_set(d, -EINVAL, "a model needs 1..%d layers, got %d", MODEL_MAX_LAYERS,
                                m->n_layers);
        if (m->n_classes <= 1)
                return diag_set(d, -EINVAL, "a model needs at least 2 classes, got %d", m->n_classes);

        int blocks = 0;
        for (int i = 0; i < m->n_layers; i++)
                blocks += m->layers[i].kind == LAYER_BLOCK;
        if (m->lm && (m->input.h != 1 || m->input.w != 1 || m->layers[0].kind != LAYER_EMBED))
                return diag_set(d, -EINVAL,
                                "a language model takes (T,1,1) token ids into an embed layer first, got (%d,%d,%d) into %s",
                                m->input.c, m->input.h, m->input.w,
                                layer_kind_to_string(m->layers[0].kind) ?: "?");

        for (int i = 0; i < m->n_layers; i++) {
                Layer l;
                Diag ld = {};
                if (i > 0 && m->layers[i].kind == LAYER_EMBED)
                        return diag_set(d, -EINVAL, "layer %d (embed): only the first layer reads token ids",
                                        i + 1);
                int r = layer_init(&l, &m->layers[i], s, &ld);
                if (r < 0)
                        return diag_set(d, r, "layer %d (%s): %s", i + 1,
                                        layer_kind_to_string(m->layers[i].kind) ?: "?", ld.text);
                l.model_blocks = blocks;
                if (ret_layers)
                        ret_layers[i] = l;
                s = l.out;
        }
        if (m->lm) {
                if (s.c != m->input.c || s.h != m->n_classes || s.w != 1)
                        return diag_set(d, -EINVAL,
                                        "the last layer gives (%d,%d,%d) but a language model of context %d over %d tokens needs (%d,%d,1)",
                                        s.c, s.h, s.w, m->input.c, m->n_classes, m->input.c,
                                        m->n_classes);
                return 0;
        }
        if (s.c != m->n_classes || s.h != 1 || s.w != 1)
                return diag_set(d, -EINVAL,
                                "the last layer gives (%d,%d,%d) but the dataset has %d classes",
                                s.c, s.h, s.w, m->n_classes);
        return 0;
}

size_t model_spec_params(const ModelSpec *m, int lo, int hi) {
        Layer layers[MODEL_MAX_LAYERS];
        size_t n = 0;

        if (model_spec_check(m, layers, NULL) < 0)
                return 0;
        for (int i = lo; i < hi && i < m->n_layers; i++)
                n += layers[i].n_params;
        return n;
}

void stage_init_layer_params(const Layer *l, int model_index, float *w, uint64_t seed) {
        Rng r;
        rng_seed(&r, seed, RNG_STREAM_INIT ^ ((uint64_t)(model_index + 1) << 32));
        layer_init_params(l, w, &r);
}

int stage_new(const ModelSpec *m, int lo, int hi, uint64_t seed, Stage **ret, Diag *d) {
        Layer all[MODEL_MAX_LAYERS];
        _cleanup_(stage_freep) Stage *s = NULL;
        int r;

        r = model_spec_check(m, all, d);
        if (r < 0)
                return r;
        if (lo < 0 || hi > m->n_layers || lo >= hi)
                return diag_set(d, -EINVAL, "stage [%d,%d) is not inside the model's %d layers", lo,
                                hi, m->n_layers);

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        r = arena_new(&s->arena);
        if (r < 0)
                return r;

        s->first_layer = lo;
        s->n_layers = hi - lo;
        s->layers = arena_alloc(s->arena, sizeof(Layer) * (size_t)s->n_layers);
        if (!s->layers)
                return -ENOMEM;
        for (int i = 0; i < s->n_layers; i++) {
                Layer *l = &s->layers[i];
                *l = all[lo + i];
                l->param_offset = s->n_params;
                s->n_params += l->n_params;
                s->scratch_floats = MAX(s->scratch_floats, l->scratch_floats);
                s->scratch_per_sample = MAX(s->scratch_per_sample, l->scratch_per_sample);
        }
        s->in = s->layers[0].in;
        s->out = s->layers[s->n_layers - 1].out;

        s->params = arena_alloc_floats(s->arena, MAX(s->n_params, (size_t)1));
        s->grads = arena_alloc_floats(s->arena, MAX(s->n_params, (size_t)1));
        if (!s->params || !s->grads)
                return -ENOMEM;
        for (int i = 0; i < s->n_layers; i++)
                stage_init_layer_params(&s->layers[i], lo + i, s->params + s->layers[i].param_offset,
                                        seed);

        *ret = TAKE_PTR(s);
        return 0;
}

Stage *stage_free(Stage *s) {
        if (!s)
                return NULL;
        arena_free(s->arena);
        free(s);
        return NULL;
}

static size_t max_act_numel(const Stage *s) {
        size_t m = shape_numel(s->in);
        for (int i = 0; i < s->n_layers; i++)
                m = MAX(m, shape_numel(s->layers[i].out));
        return m;
}

/* What trace_new() allocates for the layers from in on: their outputs,
 * what their backward passes keep, the two gradients between layers and
 * the largest scratch. */
static size_t layers_trace_bytes(const Layer *layers, int n_layers, int max_batch) {
        size_t n = shape_numel(layers[0].in), widest = n, scratch = 0, per_sample = 0;
        for (int i = 0; i < n_layers; i++) {
                n += (layers[i].kind == LAYER_FLATTEN ? 0 : shape_numel(layers[i].out)) +
                     layers[i].saved_bytes / sizeof(float);
                widest = MAX(widest, shape_numel(layers[i].out));
                scratch = MAX(scratch, layers[i].scratch_floats);
                per_sample = MAX(per_sample, layers[i].scratch_per_sample);
        }
        n += 2 * widest + per_sample;
        return (n * (size_t)max_batch + scratch) * sizeof(float);
}

size_t trace_bytes(const Stage *s, int max_batch) {
        return layers_trace_bytes(s->layers, s->n_layers, max_batch);
}

size_t model_trace_bytes(const ModelSpec *m, int max_batch) {
        Layer layers[MODEL_MAX_LAYERS];
        return model_spec_check(m, layers, NULL) < 0 ? 0 : layers_trace_bytes(layers, m->n_layers, max_batch);
}

int trace_new(Stage *s, int max_batch, Trace **ret) {
        Arena *a = s->arena;
        size_t B = (size_t)max_batch;

        if (max_batch <= 0)
                return -EINVAL;
        Trace *t = arena_alloc(a, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->max_batch = max_batch;
        t->n_layers = s->n_layers;
        t->acts = arena_alloc(a, sizeof(float *) * (size_t)(s->n_layers + 1));
        t->saved = arena_alloc(a, sizeof(void *) * (size_t)s->n_layers);
        if (!t->acts || !t->saved)
                return -ENOMEM;

        t->acts[0] = arena_alloc_floats(a, B * shape_numel(s->in));
        if (!t->acts[0])
                return -ENOMEM;
        for (int i = 0; i < s->n_layers; i++) {
                const Layer *l = &s->layers[i];
                /* flatten changes the shape, not the bytes: it shares its input */
                t->acts[i + 1] = l->kind == LAYER_FLATTEN ? t->acts[i] : arena_alloc_floats(a, B * shape_numel(l->out));
                if (!t->acts[i + 1])
                        return -ENOMEM;
                if (l->saved_bytes) {
                        t->saved[i] = arena_alloc(a, B * l->saved_bytes);
                        if (!t->saved[i])
                                return -ENOMEM;
                }
        }
        size_t m = max_act_numel(s);
        t->dbuf[0] = arena_alloc_floats(a, B * m);
        t->dbuf[1] = arena_alloc_floats(a, B * m);
        t->scratch = arena_alloc_floats(a, MAX(s->scratch_floats + B * s->scratch_per_sample, (size_t)1));
        if (!t->dbuf[0] || !t->dbuf[1] || !t->scratch)
                return -ENOMEM;
        *ret = t;
        return 0;
}

void stage_forward(const Stage *s, const Ops *ops, const float *w, Trace *t, int B) {
        for (int i = 0; i < s->n_layers; i++) {
                const Layer *l = &s->layers[i];
                layer_forward(l, ops, t->acts[i + 1], t->acts[i], w + l->param_offset, t->saved[i],
                              t->scratch, B);
        }
}

void stage_backward(const Stage *s, const Ops *ops, const float *w, Trace *t, const float *dout,
                    float *dinp, float *dw, int B, float beta, StageGradFn on_grad, void *userdata) {
        const float *g = dout;
        /* Without a dinp to fill (the model's input), nothing below the
         * lowest layer with parameters needs a gradient, and that layer
         * needs only its weight gradient: for the MLP, the first linear
         * layer's input gradient, a seventh of the training work, is skipped. */
        int lowest = 0;
        if (!dinp)
                while (lowest < s->n_layers && s->layers[lowest].n_params == 0)
                        lowest++;
        for (int i = s->n_layers - 1; i >= lowest; i--) {
                const Layer *l = &s->layers[i];
                /* flatten's gradient is its output's, bytes unchanged */
                if (l->kind == LAYER_FLATTEN && i > 0)
                        continue;
                /* The lowest layer writes straight to the caller's dinp (or
                 * skips the work when nobody needs it); the others ping-pong. */
                float *din = i == lowest ? dinp : t->dbuf[i & 1];
                if (din == g)
                        din = t->dbuf[(i + 1) & 1];
                layer_backward(l, ops, din, dw + l->param_offset, g, t->acts[i], t->acts[i + 1],
                               w + l->param_offset, t->saved[i], t->scratch, B, beta);
                if (on_grad && l->n_params)
                        on_grad(userdata, l->param_offset, l->n_params);
                g = din;
        }
}
