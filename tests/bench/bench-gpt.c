/* bench-gpt — training throughput of a GPT (nn/transformer.h) against
 * PyTorch on the same model, batch and thread count, measured in the same
 * run.
 *
 * A training step is forward, cross-entropy over every position, backward
 * and AdamW (each layer updated as soon as its gradient is ready, as the
 * trainer does). Each run forks a child that trains a few steps with
 * ravnest's engine, then runs tests/bench/torch-gpt.py (Debian's
 * python3-torch) with 1 and with 2 threads and keeps the better, with
 * OMP_WAIT_POLICY=PASSIVE: PyTorch's fastest setting here (its thread
 * count is its intra-op pool's; Debian's OpenBLAS under it runs each sgemm
 * on every core either way). Runs alternate so both see the same machine;
 * the figures are medians, and the median of the per-run ratios is the
 * steadier one when other work comes and goes on the cores. It also prints
 * llm.c's MFU (model FLOPs per token 6 N + 6 L T C, N the weights that
 * multiply, over an sgemm peak measured in the same run on the same
 * threads) and the child's peak RSS against the memory the shapes call for
 * (parameters, gradients, AdamW's two moments, one trace of activations).
 * It prints figures and never asserts on them.
 *
 *     bench-gpt [--config small|gpt2|all] [--runs N] [--steps N] [--threads N]
 *               [--python PATH] [--no-reference]
 */
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "nn/loss.h"
#include "nn/optim.h"
#include "nn/stage.h"
#include "tensor/ops.h"
#include "util/rng.h"

#define MAX_RUNS 32

typedef struct Config {
        const char *name;
        int V, T, C, L, NH, B, steps;
} Config;

static const Config configs[] = {
        { "small", 256, 128, 128, 4, 4, 8, 10 },
        /* GPT-2 small's body (12 layers, 12 heads, 768 wide) on bytes, context 256 */
        { "gpt2", 256, 256, 768, 12, 12, 4, 4 },
};

typedef struct Result {
        double tokens_per_sec, peak_mib, loss;
        int ok;
} Result;

static double median_of(double *v, int n) {
        return n ? bench_median(v, n) : 0.0;
}

static ModelSpec gpt_spec(const Config *c) {
        ModelSpec m = { .input = { c->T, 1, 1 }, .n_classes = c->V, .lm = true, .n_layers = c->L + 2 };
        m.layers[0] = (LayerSpec){ .kind = LAYER_EMBED, .vocab = c->V, .out = c->C };
        for (int i = 1; i <= c->L; i++)
                m.layers[i] = (LayerSpec){ .kind = LAYER_BLOCK, .heads = c->NH };
        m.layers[c->L + 1] = (LayerSpec){ .kind = LAYER_LM_HEAD, .out = c->V };
        return m;
}

/* llm.c's model FLOPs per token: 6 per weight that multiplies (all but the
 * embeddings) for forward and backward, and 6 L T C for causal attention. */
static double flops_per_token(const Config *c, size_t n_params) {
        double embed = ((double)c->V + c->T) * c->C;
        return 6.0 * ((double)n_params - embed) + 6.0 * c->L * c->T * c->C;
}

/* GFLOP/s of a large sgemm on the compute pool: the peak MFU is taken of. */
static double sgemm_peak(int threads) {
        const int N = 1024;
        float *a = calloc((size_t)N * N, sizeof(float)), *b = calloc((size_t)N * N, sizeof(float));
        float *c = calloc((size_t)N * N, sizeof(float));
        double best = 0.0;
        if (!a || !b || !c)
                goto out;
        for (size_t i = 0; i < (size_t)N * N; i++)
                a[i] = b[i] = (float)(i % 7) * 0.1f;
        ops_blas_set_threads(threads);
        for (int k = 0; k < 8; k++) {
                double t0 = bench_now_s();
                ops_blas.gemm(false, true, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
                double dt = bench_now_s() - t0;
                best = MAX(best, 2.0 * N * N * N / dt / 1e9);
        }
        ops_blas_set_threads(1); /* no pool across fork() */
out:
        free(a);
        free(b);
        free(c);
        return best;
}

typedef struct Trainer {
        Stage *s;
        Optim o;
} Trainer;

static void update_layer(void *userdata, size_t offset, size_t n) {
        Trainer *t = userdata;
        optim_update(&t->o, t->s->params, t->s->grads, offset, n);
}

/* Our engine, in a child so that its peak RSS is its own. */
static int train_ravnest(const Config *c, int threads, int steps, int fd) {
        ModelSpec m = gpt_spec(c);
        Trainer tr = {};
        Trace *t;
        OptimSpec os;
        Diag d = {};
        int B = c->B, T = c->T, V = c->V;

        if (ops_blas_set_threads(threads) < 0 || stage_new(&m, 0, m.n_layers, 1, &tr.s, &d) < 0 ||
            trace_new(tr.s, B, &t) < 0)
                return -1;
        Stage *s = tr.s;
        optim_spec_defaults(&os, OPTIM_ADAMW);
        os.lr = 1e-4f;
        os.weight_decay = 0.1f;
        float *state = calloc(optim_state_floats(OPTIM_ADAMW, s->n_params), sizeof(float));
        float *dlogits = malloc(sizeof(float) * (size_t)B * T * V);
        int32_t *targets = malloc(sizeof(int32_t) * (size_t)B * T);
        if (!state || !dlogits || !targets || optim_init(&tr.o, &os, s->n_params, state) < 0)
                return -1;
        optim_set_pool(&tr.o, ops_blas_pool());

        Rng r;
        rng_seed(&r, 1, RNG_STREAM_TEST);
        for (int b = 0; b < B; b++) {
                int prev = (int)rng_below(&r, (uint32_t)V);
                for (int i = 0; i < T; i++) {
                        int next = (int)rng_below(&r, (uint32_t)V);
                        trace_input(t)[b * T + i] = (float)prev;
                        targets[b * T + i] = next;
                        prev = next;
                }
        }

        const int warmup = 2;
        double rates[64];
        int n = 0;
        float loss = 0.0f;
        for (int step = 0; step < warmup + steps && n < 64; step++) {
                double t0 = bench_now_s();
                stage_forward(s, &ops_blas, s->params, t, B);
                loss = softmax_xent(dlogits, NULL, trace_output(t), targets, B * T, V);
                optim_begin_step(&tr.o);
                stage_backward(s, &ops_blas, s->params, t, dlogits, NULL, s->grads, B, 0.0f, update_layer,
                               &tr);
                double dt = bench_now_s() - t0;
                if (step >= warmup)
                        rates[n++] = (double)B * T / dt;
        }
        dprintf(fd, "%f %f\n", median_of(rates, n), (double)loss);
        return 0;
}

static Result run_ravnest(const Config *c, int threads, int steps) {
        Result res = {};
        int fds[2];
        if (pipe(fds) < 0)
                return res;
        pid_t pid = fork();
        if (pid == 0) {
                close(fds[0]);
                _exit(train_ravnest(c, threads, steps, fds[1]) < 0 ? 1 : 0);
        }
        close(fds[1]);
        char buf[256];
        const char *out = bench_child_output(pid, fds[0], buf, sizeof buf, &res.peak_mib);
        if (out && sscanf(out, "%lf %lf", &res.tokens_per_sec, &res.loss) == 2)
                res.ok = 1;
        return res;
}

static Result run_torch(const char *python, const char *script, const Config *c, int threads, int steps) {
        char a[8][32];
        Result res = {};
        int fds[2];

        snprintf(a[0], 32, "%d", c->V);
        snprintf(a[1], 32, "%d", c->T);
        snprintf(a[2], 32, "%d", c->L);
        snprintf(a[3], 32, "%d", c->NH);
        snprintf(a[4], 32, "%d", c->C);
        snprintf(a[5], 32, "%d", c->B);
        snprintf(a[6], 32, "%d", steps);
        snprintf(a[7], 32, "%d", threads);
        if (pipe(fds) < 0)
                return res;
        pid_t pid = fork();
        if (pid == 0) {
                dup2(fds[1], STDOUT_FILENO);
                close(fds[0]);
                close(fds[1]);
                /* its OpenMP pool otherwise spins against everything else */
                setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
                int devnull = open("/dev/null", O_WRONLY);
                if (devnull >= 0)
                        dup2(devnull, STDERR_FILENO);
                execl(python, python, script, "--vocab", a[0], "--context", a[1], "--layers", a[2],
                      "--heads", a[3], "--dim", a[4], "--batch", a[5], "--steps", a[6], "--threads", a[7],
                      NULL);
                _exit(127);
        }
        close(fds[1]);
        char buf[4096];
        const char *out = bench_child_output(pid, fds[0], buf, sizeof buf, &res.peak_mib);
        const char *line = out ? strstr(out, "RESULT ") : NULL;
        if (line && sscanf(line, "RESULT tokens_per_sec=%lf", &res.tokens_per_sec) == 1)
                res.ok = 1;
        return res;
}

static void bench_config(const Config *c, int runs, int steps, int threads, const char *python,
                         const char *script, bool reference) {
        ModelSpec m = gpt_spec(c);
        Stage *s;
        if (stage_new(&m, 0, m.n_layers, 1, &s, NULL) < 0) {
                fprintf(stderr, "bench-gpt: cannot build the %s model\n", c->name);
                return;
        }
        size_t P = s->n_params;
        double fpt = flops_per_token(c, P);
        /* parameters, gradients, AdamW's m and v, and one trace */
        double want_mib = ((double)P * 4 * sizeof(float) + (double)trace_bytes(s, c->B)) / (1 << 20);
        double acts_mib = (double)trace_bytes(s, c->B) / (1 << 20);
        stage_free(s);
        if (steps <= 0)
                steps = c->steps;

        /* the cores are shared: the peak is the best seen over the run */
        double peak = sgemm_peak(threads);
        printf("\n%s: vocab %d, context %d, %d layers, %d heads, width %d, batch %d; %.2fM parameters, "
               "%.2f GFLOP per step; %d threads, %d steps per run\n",
               c->name, c->V, c->T, c->L, c->NH, c->C, c->B, (double)P / 1e6,
               fpt * c->B * c->T / 1e9, threads, steps);
        printf("%-4s %-14s %12s %10s\n", "run", "engine", "tokens/s", "peak MiB");
        fflush(stdout);

        Result ours[MAX_RUNS] = {}, ref[MAX_RUNS] = {};
        for (int i = 0; i < runs; i++) {
                if (i > 0)
                        peak = MAX(peak, sgemm_peak(threads));
                ours[i] = run_ravnest(c, threads, steps);
                printf("%-4d %-14s %12.0f %10.1f%s\n", i + 1, "ravnest", ours[i].tokens_per_sec,
                       ours[i].peak_mib, ours[i].ok ? "" : "  FAILED");
                fflush(stdout);
                if (!reference)
                        continue;
                for (int t = 1; t <= MIN(threads, 2); t++) {
                        Result r = run_torch(python, script, c, t, steps);
                        char name[32];
                        snprintf(name, sizeof name, "pytorch %dt", t);
                        printf("%-4d %-14s %12.0f %10.1f%s\n", i + 1, name, r.tokens_per_sec, r.peak_mib,
                               r.ok ? "" : "  FAILED");
                        fflush(stdout);
                        if (r.ok && (!ref[i].ok || r.tokens_per_sec > ref[i].tokens_per_sec))
                                ref[i] = r;
                }
        }

        double v[MAX_RUNS], rss[MAX_RUNS], ratio[MAX_RUNS];
        int n = 0, k = 0;
        for (int i = 0; i < runs; i++)
                if (ours[i].ok) {
                        v[n] = ours[i].tokens_per_sec;
                        rss[n++] = ours[i].peak_mib;
                }
        double ours_tps = median_of(v, n), ours_rss = median_of(rss, n);
        printf("sgemm peak on %d threads (best of the run): %.1f GFLOP/s\n", threads, peak);
        printf("median ravnest: %.0f tokens/s, MFU %.1f%%, peak RSS %.1f MiB (the shapes call for %.1f MiB: "
               "%.1f of parameters, gradients and AdamW state, %.1f of activations and scratch)\n",
               ours_tps, 100 * ours_tps * fpt / (peak * 1e9), ours_rss, want_mib, want_mib - acts_mib,
               acts_mib);
        if (!reference)
                return;
        n = 0;
        for (int i = 0; i < runs; i++) {
                if (ref[i].ok) {
                        v[n] = ref[i].tokens_per_sec;
                        rss[n++] = ref[i].peak_mib;
                }
                if (ref[i].ok && ours[i].ok)
                        ratio[k++] = ours[i].tokens_per_sec / ref[i].tokens_per_sec;
        }
        double ref_tps = median_of(v, n), ref_rss = median_of(rss, n);
        printf("median pytorch (better of 1 and 2 threads per run): %.0f tokens/s, MFU %.1f%%, peak RSS %.1f MiB\n",
               ref_tps, 100 * ref_tps * fpt / (peak * 1e9), ref_rss);
        /* runs alternate, so the ratio within each run is the steadier figure */
        printf("ratio %s: %.2fx pytorch (median of per-run ratios %.2fx), memory %.2fx\n", c->name,
               ref_tps > 0 ? ours_tps / ref_tps : 0.0, median_of(ratio, k),
               ref_rss > 0 ? ours_rss / ref_rss : 0.0);
}

static void usage(FILE *f) {
        fprintf(f, "Usage: bench-gpt [--config small|gpt2|all] [--runs N] [--steps N] [--threads N]\n"
                   "                 [--python PATH] [--no-reference]\n"
                   "Training tokens/s of a GPT, ravnest against PyTorch in the same run (medians of\n"
                   "interleaved runs), MFU against a measured sgemm peak, and peak RSS.\n"
                   "  small: vocab 256, context 128, 4 layers, 4 heads, width 128, batch 8\n"
                   "  gpt2:  vocab 256, context 256, 12 layers, 12 heads, width 768, batch 4\n");
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "config", required_argument, NULL, 'c' },
                { "runs", required_argument, NULL, 'r' },
                { "steps", required_argument, NULL, 's' },
                { "threads", required_argument, NULL, 't' },
                { "python", required_argument, NULL, 'p' },
                { "no-reference", no_argument, NULL, 'n' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *python = "/usr/bin/python3", *script = SOURCE_ROOT "/tests/bench/torch-gpt.py";
        const char *which = "all";
        int runs = 5, steps = 0, threads = 2, c;
        bool reference = true;

        while ((c = getopt_long(argc, argv, "c:r:s:t:p:nh", options, NULL)) >= 0)
                switch (c) {
                case 'c': which = optarg; break;
                case 'r': runs = MAX(1, MIN(atoi(optarg), MAX_RUNS)); break;
                case 's': steps = MAX(1, MIN(atoi(optarg), 60)); break;
                case 't': threads = MAX(1, atoi(optarg)); break;
                case 'p': python = optarg; break;
                case 'n': reference = false; break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return 2;
                }
        if (strcmp(which, "all") && strcmp(which, "small") && strcmp(which, "gpt2")) {
                usage(stderr);
                return 2;
        }
        if (reference && access(python, X_OK) < 0) {
                fprintf(stderr, "bench-gpt: %s not found; install python3-torch or pass --no-reference\n", python);
                return 1;
        }
        for (size_t i = 0; i < ELEMENTSOF(configs); i++)
                if (!strcmp(which, "all") || !strcmp(which, configs[i].name))
                        bench_config(&configs[i], runs, steps, threads, python, script, reference);
        return 0;
}
