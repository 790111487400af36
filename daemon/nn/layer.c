/* nn/layer.c — shape inference, initialization and dispatch. */
#include "layer.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[_LAYER_KIND_MAX] = {
        [LAYER_LINEAR] = "linear",     [LAYER_RELU] = "relu",
        [LAYER_GELU] = "gelu",         [LAYER_CONV2D] = "conv2d",
        [LAYER_MAXPOOL2D] = "maxpool2d", [LAYER_FLATTEN] = "flatten",
};

DEFINE_STRING_TABLE_LOOKUP(layer_kind, LayerKind, kind_names, _LAYER_KIND_MAX, _LAYER_KIND_INVALID)

/* Limits that keep every size product far from overflow. */
#define LAYER_MAX_DIM (1 << 16)
#define LAYER_MAX_NUMEL ((size_t)1 << 28)

int layer_init(Layer *l, const LayerSpec *spec, Shape in, Diag *d) {
        Layer n = { .kind = spec->kind, .spec = *spec, .in = in };

        if (in.c <= 0 || in.h <= 0 || in.w <= 0 || shape_numel(in) > LAYER_MAX_NUMEL)
                return diag_set(d, -EINVAL, "input shape (%d,%d,%d) is out of range", in.c, in.h,
                                in.w);

        switch (spec->kind) {
        case LAYER_LINEAR: {
                size_t fan_in = shape_numel(in);
                if (in.h != 1 || in.w != 1)
                        return diag_set(d, -EINVAL,
                                        "linear needs a flat input, got (%d,%d,%d): add a flatten layer",
                                        in.c, in.h, in.w);
                if (spec->out <= 0 || spec->out > LAYER_MAX_DIM)
                        return diag_set(d, -EINVAL, "linear: out must be in 1..%d, got %d",
                                        LAYER_MAX_DIM, spec->out);
                n.out = (Shape){ spec->out, 1, 1 };
                n.n_params = fan_in * (size_t)spec->out + (size_t)spec->out;
                n.fan_in = fan_in;
                break;
        }
        case LAYER_RELU:
        case LAYER_GELU:
                n.out = in;
                break;
        case LAYER_FLATTEN:
                n.out = (Shape){ (int)shape_numel(in), 1, 1 };
                break;
        case LAYER_CONV2D: {
                int k = spec->kernel, s = spec->stride ? spec->stride : 1, p = spec->padding;
                if (spec->out <= 0 || spec->out > LAYER_MAX_DIM)
                        return diag_set(d, -EINVAL, "conv2d: out must be in 1..%d, got %d",
                                        LAYER_MAX_DIM, spec->out);
                if (k <= 0 || k > 15 || s <= 0 || s > 15 || p < 0 || p >= k)
                        return diag_set(d, -EINVAL,
                                        "conv2d: need 1 <= kernel <= 15, 1 <= stride <= 15, 0 <= padding < kernel (got %d, %d, %d)",
                                        k, s, p);
                if (in.h + 2 * p < k || in.w + 2 * p < k)
                        return diag_set(d, -EINVAL, "conv2d: kernel %d is larger than the input %dx%d",
                                        k, in.h, in.w);
                n.spec.stride = s;
                n.out = (Shape){ spec->out, (in.h + 2 * p - k) / s + 1, (in.w + 2 * p - k) / s + 1 };
                n.fan_in = (size_t)in.c * (size_t)k * (size_t)k;
                n.n_params = (size_t)spec->out * n.fan_in + (size_t)spec->out;
                /* im2col columns and their gradient: (C*K*K, OH*OW) each */
                n.scratch_floats = 2 * n.fan_in * (size_t)n.out.h * (size_t)n.out.w;
                break;
        }
        case LAYER_MAXPOOL2D: {
                int k = spec->kernel, s = spec->stride ? spec->stride : spec->kernel;
                if (k <= 0 || k > 15 || s <= 0 || s > 15)
                        return diag_set(d, -EINVAL,
                                        "maxpool2d: need 1 <= kernel <= 15 and 1 <= stride <= 15 (got %d, %d)",
                                        k, s);
                if (in.h < k || in.w < k)
                        return diag_set(d, -EINVAL, "maxpool2d: kernel %d is larger than the input %dx%d",
                                        k, in.h, in.w);
                n.spec.stride = s;
                n.out = (Shape){ in.c, (in.h - k) / s + 1, (in.w - k) / s + 1 };
                n.saved_bytes = shape_numel(n.out) * sizeof(int32_t);
                break;
        }
        default:
                return diag_set(d, -EINVAL, "unknown layer kind %d", spec->kind);
        }

        if (shape_numel(n.out) > LAYER_MAX_NUMEL || n.n_params > LAYER_MAX_NUMEL)
                return diag_set(d, -E2BIG, "%s: layer is too large", layer_kind_to_string(spec->kind));
        *l = n;
        return 0;
}

void layer_init_params(const Layer *l, float *w, Rng *r) {
        if (l->n_params == 0)
                return;
        /* kaiming_uniform(a=sqrt(5)) as PyTorch does by default reduces to
         * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights, and biases use the
         * same bound. sqrtf is correctly rounded, so this is bit-identical on
         * every IEEE machine. */
        float bound = 1.0f / sqrtf((float)l->fan_in);
        for (size_t i = 0; i < l->n_params; i++)
                w[i] = (2.0f * rng_uniform(r) - 1.0f) * bound;
}

void layer_forward(const Layer *l, const Ops *ops, float *out, const float *inp, const float *w,
                   void *saved, float *scratch, int B) {
        size_t n = (size_t)B * shape_numel(l->out);

        switch (l->kind) {
        case LAYER_LINEAR:
                linear_forward(l, ops, out, inp, w, B);
                break;
        case LAYER_RELU:
                relu_forward(ops, out, inp, n);
                break;
        case LAYER_GELU:
                gelu_forward(ops, out, inp, n);
                break;
        case LAYER_FLATTEN:
                if (out != inp) /* a trace shares the buffer */
                        memcpy(out, inp, n * sizeof(float));
                break;
        case LAYER_CONV2D:
                conv2d_forward(l, ops, out, inp, w, scratch, B);
                break;
        case LAYER_MAXPOOL2D:
                maxpool2d_forward(l, out, inp, saved, B);
                break;
        default:
                break;
        }
}

void layer_backward(const Layer *l, const Ops *ops, float *dinp, float *dw, const float *dout,
                    const float *inp, const float *out, const float *w, const void *saved,
                    float *scratch, int B, float beta) {
        size_t n = (size_t)B * shape_numel(l->in);

        switch (l->kind) {
        case LAYER_LINEAR:
                linear_backward(l, ops, dinp, dw, dout, inp, w, B, beta);
                break;
        case LAYER_RELU:
                if (dinp)
                        relu_backward(ops, dinp, dout, out, n);
                break;
        case LAYER_GELU:
                if (dinp)
                        gelu_backward(ops, dinp, dout, inp, n);
                break;
        case LAYER_FLATTEN:
                if (dinp && dinp != dout)
                        memcpy(dinp, dout, n * sizeof(float));
                break;
        case LAYER_CONV2D:
                conv2d_backward(l, ops, dinp, dw, dout, inp, w, scratch, B, beta);
                break;
        case LAYER_MAXPOOL2D:
                if (dinp)
                        maxpool2d_backward(l, dinp, dout, saved, B);
                break;
        default:
                break;
        }
}
