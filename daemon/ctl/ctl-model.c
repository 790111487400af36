/* ctl/ctl-model.c — see ctl-model.h. */
#include "ctl-model.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "conf/option.h"
#include "ctl-common.h"
#include "nn/optim.h"
#include "run/checkpoint.h"
#include "tensor/ops.h"
#include "util/rng.h"

#define MAX_CHECKPOINTS 64

/* One checkpoint's layers into the whole model's slab at their place. */
static int read_part(const Job *job, const char *path, Stage *s, bool *have, Diag *d) {
        CheckpointInfo info;
        int r;

        if ((r = checkpoint_read_info(path, &info, d)) < 0)
                return r;
        if (strcmp(info.job, job->name) != 0)
                return diag_set(d, -EINVAL, "%s: a checkpoint of job \"%s\", not \"%s\"", path, info.job, job->name);
        if (info.lo < 0 || info.hi > job->model.n_layers || info.lo >= info.hi ||
            info.n_params != model_spec_params(&job->model, info.lo, info.hi))
                return diag_set(d, -EINVAL, "%s: layers %d-%d with %llu parameters do not fit %s", path, info.lo,
                                info.hi - 1, (unsigned long long)info.n_params, job->path);
        if ((r = checkpoint_model_check(&info, s->layers + info.lo, info.hi - info.lo, path, d)) < 0)
                return r;
        for (int l = info.lo; l < info.hi; l++)
                if (have[l])
                        return diag_set(d, -EINVAL, "%s: layer %d is in another checkpoint too", path, l);
        _cleanup_(freep) float *state = malloc(MAX(info.n_state, (uint64_t)1) * sizeof(float));
        if (!state)
                return -ENOMEM;
        r = checkpoint_read(path, &info, s->params + model_spec_params(&job->model, 0, info.lo), info.n_params, state,
                            info.n_state, d);
        if (r < 0)
                return r;
        for (int l = info.lo; l < info.hi; l++)
                have[l] = true;
        return 0;
}

int model_from_checkpoints(const Job *job, char *const *paths, int n, Stage **ret, Diag *d) {
        _cleanup_(stage_freep) Stage *s = NULL;
        bool have[MODEL_MAX_LAYERS] = {};
        int r;

        if ((r = stage_new(&job->model, 0, job->model.n_layers, job->train.seed, &s, d)) < 0)
                return r;
        for (int i = 0; i < n; i++)
                if ((r = read_part(job, paths[i], s, have, d)) < 0)
                        return r;
        for (int l = 0; l < job->model.n_layers; l++)
                if (!have[l] && model_spec_params(&job->model, l, l + 1) > 0)
                        return diag_set(d, -EINVAL, "no checkpoint holds layer %d (%s) of %s", l,
                                        layer_kind_to_string(job->model.layers[l].kind), job->path);
        *ret = TAKE_PTR(s);
        return 0;
}

/* --job and --checkpoint (repeated), which both commands take. */
typedef struct ModelArgs {
        const char *job_path;
        char *ckpt[MAX_CHECKPOINTS];
        int n_ckpt;
} ModelArgs;

/* Option c with its argument, if it is one of ModelArgs': 1 taken, 0 not
 * one of them, -1 too many checkpoints (said). */
static int model_option(int c, char *arg, ModelArgs *m) {
        if (c == 'j')
                m->job_path = arg;
        else if (c != 'c')
                return 0;
        else if (m->n_ckpt == MAX_CHECKPOINTS) {
                fprintf(stderr, "at most %d checkpoints\n", MAX_CHECKPOINTS);
                return -1;
        } else
                m->ckpt[m->n_ckpt++] = arg;
        return 1;
}

/* The job and its model from the checkpoints: -1 to go on, else the exit
 * status. */
static int load_model(const ModelArgs *m, Job *job, Stage **ret) {
        Diag d = {};
        if (!m->job_path || m->n_ckpt == 0) {
                fprintf(stderr, "needs --job FILE and at least one --checkpoint FILE\n");
                return EX_USAGE;
        }
        if (job_load(m->job_path, job, &d) < 0) {
                fprintf(stderr, "%s\n", d.text);
                return EX_CONFIG;
        }
        if (model_from_checkpoints(job, m->ckpt, m->n_ckpt, ret, &d) < 0) {
                fprintf(stderr, "%s\n", d.text);
                return EX_DATAERR;
        }
        return -1;
}

/* ---- generate ------------------------------------------------------------ */

/* The next token from the logits (V) at temperature t (0: the likeliest). */
static int sample(const float *logits, int V, double t, Rng *rng) {
        int best = 0;
        for (int i = 1; i < V; i++)
                if (logits[i] > logits[best])
                        best = i;
        if (t <= 0)
                return best;
        double sum = 0, p[256];
        for (int i = 0; i < V; i++)
                sum += p[i] = exp((logits[i] - logits[best]) / t);
        double u = rng_uniform(rng) * sum;
        for (int i = 0; i < V; i++)
                if ((u -= p[i]) < 0)
                        return i;
        return V - 1;
}

/* The window of the last T bytes of text (len of them) as ids, the rest 0:
 * the position of the last byte. */
static size_t fill_window(float *x, int T, const uint8_t *text, size_t len) {
        size_t from = len > (size_t)T ? len - (size_t)T : 0, m = len - from;
        for (int i = 0; i < T; i++) /* causal: what follows position m - 1 does not matter */
                x[i] = i < (int)m ? (float)text[from + (size_t)i] : 0.0f;
        return m - 1;
}

static int print_logits(const Job *job, Stage *s, const uint8_t *text, size_t len) {
        int V = job->model.n_classes, r;
        Trace *tr;
        if ((r = trace_new(s, 1, &tr)) < 0)
                return r;
        size_t at = fill_window(trace_input(tr), job->model.input.c, text, len);
        stage_forward(s, &ops_blas, s->params, tr, 1);
        for (int i = 0; i < V; i++)
                printf("%.9g\n", (double)trace_output(tr)[at * (size_t)V + (size_t)i]);
        return 0;
}

/* Append n tokens to text (len bytes so far), each from a forward pass over
 * the last T (the window slides once the text is longer than the context). */
int model_generate(const Job *job, Stage *s, uint8_t *text, size_t len, int n, double t, uint64_t seed) {
        int T = job->model.input.c, V = job->model.n_classes, r;
        Trace *tr;
        Rng rng;

        if ((r = trace_new(s, 1, &tr)) < 0)
                return r;
        rng_seed(&rng, seed, RNG_STREAM_TEST);
        for (int k = 0; k < n; k++, len++) {
                size_t at = fill_window(trace_input(tr), T, text, len);
                stage_forward(s, &ops_blas, s->params, tr, 1);
                text[len] = (uint8_t)sample(trace_output(tr) + at * (size_t)V, V, t, &rng);
        }
        return 0;
}

static void generate_usage(FILE *f) {
        fprintf(f, "Usage: ravnestctl generate --job FILE --checkpoint FILE [--checkpoint FILE ...] [--prompt TEXT]\n"
                   "                           [--tokens N] [--temperature X] [--seed S]\n"
                   "\n"
                   "Sample text from a trained language model: a whole-model checkpoint, or the stage\n"
                   "checkpoints of one cluster.\n"
                   "\n"
                   "  --tokens N          bytes to generate, 1 to 100000 (default 200)\n"
                   "  --temperature X     0 (always the likeliest) to 10 (default 0.8)\n"
                   "  --seed S            of the sampling (default 1)\n"
                   "  --logits            print the logits of the byte after the prompt instead (one per\n"
                   "                      line, for checking the model against another implementation)\n");
}

int ctl_generate(int argc, char *argv[]) {
        static const struct option options[] = {
                { "job", required_argument, NULL, 'j' },
                { "checkpoint", required_argument, NULL, 'c' },
                { "prompt", required_argument, NULL, 'p' },
                { "tokens", required_argument, NULL, 'n' },
                { "temperature", required_argument, NULL, 't' },
                { "seed", required_argument, NULL, 's' },
                { "logits", no_argument, NULL, 'L' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        ModelArgs m = {};
        const char *prompt = "";
        bool logits = false;
        long long tokens = 200, seed = 1;
        double temperature = 0.8;
        int c, r = 0;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                if ((r = model_option(c, optarg, &m)) != 0) {
                        if (r < 0)
                                return EX_USAGE;
                        continue;
                }
                switch (c) {
                case 'p': prompt = optarg; break;
                case 'n': r = option_int("tokens", optarg, 1, 100000, &tokens); break;
                case 't': r = option_double("temperature", optarg, 0, 10, &temperature); break;
                case 's': r = option_int("seed", optarg, 0, INT64_MAX, &seed); break;
                case 'L': logits = true; break;
                case 'h': generate_usage(stdout); return 0;
                default: generate_usage(stderr); return EX_USAGE;
                }
                if (r < 0)
                        return EX_USAGE;
        }
        if ((r = ctl_operands("generate", argc, argv, 0, 0, NULL)) >= 0)
                return r;
        Job job;
        _cleanup_(stage_freep) Stage *s = NULL;
        if ((r = load_model(&m, &job, &s)) >= 0)
                return r;
        if (!job.model.lm) {
                fprintf(stderr, "%s: not a language model: nothing to generate\n", job.path);
                return EX_USAGE;
        }
        size_t len = strlen(prompt);
        if (len == 0) /* a text starts somewhere: a newline, as a corpus's lines do */
                prompt = "\n", len = 1;
        for (size_t i = 0; i < len; i++) /* the model knows no byte past its vocabulary */
                if ((uint8_t)prompt[i] >= job.model.n_classes) {
                        fprintf(stderr, "generate: --prompt: byte %zu is 0x%02x, past the vocabulary of %s (%d "
                                "bytes: 0x00-0x%02x)\n", i, (uint8_t)prompt[i], job.path, job.model.n_classes,
                                job.model.n_classes - 1);
                        return EX_DATAERR;
                }
        _cleanup_(freep) uint8_t *text = malloc(len + (size_t)tokens + 1);
        if (!text)
                return EX_OSERR;
        memcpy(text, prompt, len);
        if (logits)
                return print_logits(&job, s, text, len) < 0 ? EX_OSERR : 0;
        if (model_generate(&job, s, text, len, (int)tokens, temperature, (uint64_t)seed) < 0)
                return EX_OSERR;
        fwrite(text, 1, len + (size_t)tokens, stdout);
        putchar('\n');
        return 0;
}

/* ---- export ------------------------------------------------------------- */

typedef struct Tensor {
        char name[64];
        int dims[2], ndim;
        size_t off; /* floats into the slab */
} Tensor;

static void add(Tensor *t, int *n, size_t *off, int rows, int cols, const char *fmt, int i, const char *what) {
        Tensor *x = &t[(*n)++];
        snprintf(x->name, sizeof x->name, fmt, i, what);
        x->dims[0] = rows;
        x->dims[1] = cols;
        x->ndim = cols ? 2 : 1;
        x->off = *off;
        *off += (size_t)rows * (size_t)(cols ? cols : 1);
}

/* The model's tensors, named as GPT-2's are (h.N.attn.c_attn...), weights
 * stored (out, in) as PyTorch's nn.Linear holds them; other layers by
 * index (layers.N.weight, layers.N.bias). Returns how many. */
static int name_tensors(const ModelSpec *m, Tensor *t) {
        Layer layers[MODEL_MAX_LAYERS];
        size_t off = 0;
        int n = 0, block = 0;

        if (model_spec_check(m, layers, NULL) < 0)
                return -EINVAL;
        for (int i = 0; i < m->n_layers; i++) {
                const Layer *l = &layers[i];
                int C = l->in.h, V = l->spec.out, T = m->input.c;
                switch (l->kind) {
                case LAYER_EMBED:
                        C = l->out.h;
                        add(t, &n, &off, l->spec.vocab, C, "wte%.0d%s", 0, ".weight");
                        add(t, &n, &off, T, C, "wpe%.0d%s", 0, ".weight");
                        break;
                case LAYER_BLOCK:
                        add(t, &n, &off, C, 0, "h.%d.%s", block, "ln_1.weight");
                        add(t, &n, &off, C, 0, "h.%d.%s", block, "ln_1.bias");
                        add(t, &n, &off, 3 * C, C, "h.%d.%s", block, "attn.c_attn.weight");
                        add(t, &n, &off, 3 * C, 0, "h.%d.%s", block, "attn.c_attn.bias");
                        add(t, &n, &off, C, C, "h.%d.%s", block, "attn.c_proj.weight");
                        add(t, &n, &off, C, 0, "h.%d.%s", block, "attn.c_proj.bias");
                        add(t, &n, &off, C, 0, "h.%d.%s", block, "ln_2.weight");
                        add(t, &n, &off, C, 0, "h.%d.%s", block, "ln_2.bias");
                        add(t, &n, &off, 4 * C, C, "h.%d.%s", block, "mlp.c_fc.weight");
                        add(t, &n, &off, 4 * C, 0, "h.%d.%s", block, "mlp.c_fc.bias");
                        add(t, &n, &off, C, 4 * C, "h.%d.%s", block, "mlp.c_proj.weight");
                        add(t, &n, &off, C, 0, "h.%d.%s", block, "mlp.c_proj.bias");
                        block++;
                        break;
                case LAYER_LM_HEAD:
                        add(t, &n, &off, C, 0, "ln_f%.0d%s", 0, ".weight");
                        add(t, &n, &off, C, 0, "ln_f%.0d%s", 0, ".bias");
                        add(t, &n, &off, V, C, "lm_head%.0d%s", 0, ".weight");
                        break;
                default:
                        if (!l->n_params)
                                break;
                        add(t, &n, &off, l->spec.out, (int)l->fan_in, "layers.%d.%s", i, "weight");
                        add(t, &n, &off, l->spec.out, 0, "layers.%d.%s", i, "bias");
                }
        }
        return off == model_spec_params(m, 0, m->n_layers) ? n : -EINVAL;
}

/* safetensors: an 8-byte little-endian header length, the JSON header
 * (padded with spaces to a multiple of 8), then the tensors' bytes. */
static int write_safetensors(const char *path, const Job *job, const Stage *s, const Tensor *t, int n) {
        size_t cap = 256 + (size_t)n * 160, k = 0;
        _cleanup_(freep) char *json = malloc(cap);
        if (!json)
                return -ENOMEM;
        k += (size_t)snprintf(json + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\",\"job\":\"%s\","
                              "\"layout\":\"weights (out, in) as torch.nn.Linear\"}", job->name);
        for (int i = 0; i < n; i++) {
                size_t b = t[i].off * 4, e = b + (size_t)t[i].dims[0] * (size_t)(t[i].ndim == 2 ? t[i].dims[1] : 1) * 4;
                k += (size_t)snprintf(json + k, cap - k, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d", t[i].name,
                                      t[i].dims[0]);
                if (t[i].ndim == 2)
                        k += (size_t)snprintf(json + k, cap - k, ",%d", t[i].dims[1]);
                k += (size_t)snprintf(json + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", b, e);
        }
        k += (size_t)snprintf(json + k, cap - k, "}");
        while (k % 8)
                json[k++] = ' ';
        uint64_t hlen = k;
        /* beside it, then renamed over it: a write that fails leaves what
         * was there */
        char tmp[PATH_MAX];
        if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof tmp)
                return -ENAMETOOLONG;
        int fd = mkostemp(tmp, O_CLOEXEC);
        FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (!f) {
                int r = -errno;
                if (fd >= 0) {
                        close(fd);
                        unlink(tmp);
                }
                return r;
        }
        bool ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(json, 1, k, f) == k &&
                  fwrite(s->params, sizeof(float), s->n_params, f) == s->n_params;
        ok = fchmod(fileno(f), 0644) == 0 && ok;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path) < 0) {
                int r = ok ? -errno : -EIO;
                unlink(tmp);
                return r;
        }
        return 0;
}

/* Whether output names one of the checkpoints read (the same file by
 * another name too): writing it would destroy the model being exported. */
static bool is_a_checkpoint(const ModelArgs *m, const char *output) {
        struct stat o, c;
        if (stat(output, &o) < 0)
                return false;
        for (int i = 0; i < m->n_ckpt; i++)
                if (stat(m->ckpt[i], &c) == 0 && c.st_dev == o.st_dev && c.st_ino == o.st_ino)
                        return true;
        return false;
}

static void export_usage(FILE *f) {
        fprintf(f, "Usage: ravnestctl export --job FILE --checkpoint FILE [--checkpoint FILE ...] --output FILE\n"
                   "\n"
                   "Write a trained model's weights as safetensors (float32, little-endian; a GPT's tensors\n"
                   "named as GPT-2's, weights (out, in) as torch.nn.Linear holds them).\n");
}

int ctl_export(int argc, char *argv[]) {
        static const struct option options[] = {
                { "job", required_argument, NULL, 'j' },
                { "checkpoint", required_argument, NULL, 'c' },
                { "output", required_argument, NULL, 'o' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        ModelArgs m = {};
        const char *output = NULL;
        int c, r;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                if ((r = model_option(c, optarg, &m)) != 0) {
                        if (r < 0)
                                return EX_USAGE;
                        continue;
                }
                switch (c) {
                case 'o': output = optarg; break;
                case 'h': export_usage(stdout); return 0;
                default: export_usage(stderr); return EX_USAGE;
                }
        }
        if ((r = ctl_operands("export", argc, argv, 0, 0, NULL)) >= 0)
                return r;
        if (!output) {
                fprintf(stderr, "ravnestctl export: needs --output FILE\n");
                return EX_USAGE;
        }
        if (is_a_checkpoint(&m, output)) {
                fprintf(stderr, "export: --output %s is one of the checkpoints: refusing to overwrite it\n", output);
                return EX_USAGE;
        }
        char target[PATH_MAX];
        if ((r = ctl_output_target("export", output, target)) != 0)
                return r;
        output = target;
        Job job;
        _cleanup_(stage_freep) Stage *s = NULL;
        if ((r = load_model(&m, &job, &s)) >= 0)
                return r;
        _cleanup_(freep) Tensor *t = calloc(MODEL_MAX_LAYERS * 12 + 4, sizeof *t);
        int n = t ? name_tensors(&job.model, t) : -ENOMEM;
        if (n < 0 || (r = write_safetensors(output, &job, s, t, n)) < 0) {
                fprintf(stderr, "export: cannot write %s: %s\n", output, strerror(n < 0 ? -n : -r));
                return EX_CANTCREAT;
        }
        printf("%s: %d tensors, %zu parameters\n", output, n, s->n_params);
        return 0;
}
