/* bench-train — training throughput, accuracy and peak memory of a job,
 * against PyTorch on the same model, data, optimizer, seed policy and
 * schedule, measured in the same run.
 *
 * Each run forks a child that trains the job with ravnest's engine, then runs
 * tests/bench/torch-train.py (Debian's python3-torch) with the same settings;
 * runs alternate so that both see the same machine. Peak RSS of each comes
 * from wait4(). Prints every run, then the medians and the ratios.
 *
 *     bench-train [--job FILE] [--runs N] [--threads N] [--epochs N]
 */
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "conf/job.h"
#include "conf/option.h"
#include "run/local-run.h"
#include "util/log.h"

#define MAX_RUNS 64

typedef struct Result {
        double samples_per_sec, test_acc, peak_mib;
        int ok;
} Result;


static double median(const Result *r, int n, size_t field) {
        double v[MAX_RUNS];
        int k = 0;
        for (int i = 0; i < n; i++)
                if (r[i].ok)
                        v[k++] = *(const double *)((const char *)&r[i] + field);
        if (k == 0)
                return 0.0;
        qsort(v, (size_t)k, sizeof(double), bench_compare_double);
        return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

/* Our engine, in a child so that its peak RSS is its own. */
static Result run_ravnest(const Job *job, int threads, int epochs) {
        Result res = {};
        int fds[2];
        if (pipe(fds) < 0)
                return res;
        pid_t pid = fork();
        if (pid == 0) {
                close(fds[0]);
                LocalRunOptions o = { .threads = threads, .epochs = epochs };
                LocalRunResult lr;
                int r = local_run(job, &o, NULL, &lr);
                if (r < 0)
                        _exit(1);
                dprintf(fds[1], "%f %f\n", lr.samples_per_sec, lr.test_acc);
                _exit(0);
        }
        close(fds[1]);
        char buf[256];
        const char *out = bench_child_output(pid, fds[0], buf, sizeof buf, &res.peak_mib);
        if (out && sscanf(out, "%lf %lf", &res.samples_per_sec, &res.test_acc) == 2)
                res.ok = 1;
        return res;
}

static void layers_arg(const ModelSpec *m, char *buf, size_t len) {
        size_t used = 0;
        for (int i = 0; i < m->n_layers; i++) {
                const LayerSpec *l = &m->layers[i];
                const char *k = layer_kind_to_string(l->kind);
                int w;
                switch (l->kind) {
                case LAYER_LINEAR:
                        w = snprintf(buf + used, len - used, "%s%s:%d", i ? "," : "", k, l->out);
                        break;
                case LAYER_CONV2D:
                        w = snprintf(buf + used, len - used, "%s%s:%d:%d:%d:%d", i ? "," : "", k, l->out,
                                     l->kernel, l->stride ? l->stride : 1, l->padding);
                        break;
                case LAYER_MAXPOOL2D:
                        w = snprintf(buf + used, len - used, "%s%s:%d:%d", i ? "," : "", k, l->kernel,
                                     l->stride ? l->stride : l->kernel);
                        break;
                default:
                        w = snprintf(buf + used, len - used, "%s%s", i ? "," : "", k);
                }
                used += (size_t)MAX(w, 0);
                if (used >= len)
                        return;
        }
}

/* The PyTorch reference, as a child process. */
static Result run_torch(const char *python, const char *script, const Job *job, const char *data_dir,
                        int threads, int epochs) {
        char layers[4096], a[12][64];
        Result res = {};
        int fds[2];

        layers_arg(&job->model, layers, sizeof layers);
        snprintf(a[0], 64, "%g", (double)job->optim.lr);
        snprintf(a[1], 64, "%g", (double)job->optim.momentum);
        snprintf(a[2], 64, "%g", (double)job->optim.weight_decay);
        snprintf(a[3], 64, "%d", job->train.batch_size);
        snprintf(a[4], 64, "%d", epochs);
        snprintf(a[5], 64, "%llu", (unsigned long long)job->train.seed);
        snprintf(a[6], 64, "%d", threads);
        snprintf(a[7], 64, "%.6f", job->data.mean);
        snprintf(a[8], 64, "%.6f", job->data.std);

        if (pipe(fds) < 0)
                return res;
        pid_t pid = fork();
        if (pid == 0) {
                dup2(fds[1], STDOUT_FILENO);
                close(fds[0]);
                close(fds[1]);
                /* PyTorch's fastest setting here: its OpenMP pool and OpenBLAS
                 * otherwise spin against each other. */
                setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
                /* its per-epoch lines would break up the table */
                int devnull = open("/dev/null", O_WRONLY);
                if (devnull >= 0)
                        dup2(devnull, STDERR_FILENO);
                execl(python, python, script, "--data-dir", data_dir, "--layers", layers,
                      "--optimizer", optim_kind_to_string(job->optim.kind), "--lr", a[0],
                      "--schedule", lr_schedule_to_string(job->optim.schedule),
                      "--momentum", a[1], "--weight-decay", a[2], "--batch", a[3], "--epochs", a[4],
                      "--seed", a[5], "--threads", a[6], "--mean", a[7], "--std", a[8], NULL);
                _exit(127);
        }
        close(fds[1]);
        char buf[4096];
        const char *out = bench_child_output(pid, fds[0], buf, sizeof buf, &res.peak_mib);
        const char *line = out ? strstr(out, "RESULT ") : NULL;
        if (line && sscanf(line, "RESULT samples_per_sec=%lf test_acc=%lf", &res.samples_per_sec,
                           &res.test_acc) == 2)
                res.ok = 1;
        return res;
}

static void usage(FILE *f) {
        fprintf(f, "Usage: bench-train [--job FILE] [--runs N] [--threads N] [--epochs N] [--python PATH] [--no-reference]\n"
                   "Train the job with ravnest and with PyTorch (the reference) and compare samples/s and accuracy.\n");
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "job", required_argument, NULL, 'j' },
                { "runs", required_argument, NULL, 'r' },
                { "threads", required_argument, NULL, 't' },
                { "epochs", required_argument, NULL, 'e' },
                { "python", required_argument, NULL, 'p' },
                { "no-reference", no_argument, NULL, 'n' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *job_path = SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job";
        const char *python = "/usr/bin/python3", *script = SOURCE_ROOT "/tests/bench/torch-train.py";
        int runs = 5, threads = 2, epochs = 0, reference = 1, c;
        Result ours[MAX_RUNS] = {}, ref[MAX_RUNS] = {};
        Job job;
        Diag d = {};

        long long v = 0;
        while ((c = getopt_long(argc, argv, "j:r:t:e:p:nh", options, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case 'j': job_path = optarg; break;
                case 'r': r = option_int("runs", optarg, 1, MAX_RUNS, &v); runs = (int)v; break;
                case 't': r = option_int("threads", optarg, 1, 256, &v); threads = (int)v; break;
                case 'e': r = option_int("epochs", optarg, 1, 1000000, &v); epochs = (int)v; break;
                case 'p': python = optarg; break;
                case 'n': reference = 0; break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return EX_USAGE;
                }
                if (r < 0)
                        return EX_USAGE;
        }
        if (optind < argc) {
                fprintf(stderr, "%s: unexpected argument \"%s\"\n", argv[0], argv[optind]);
                return EX_USAGE;
        }
        if (job_load(job_path, &job, &d) < 0) {
                fprintf(stderr, "%s\n", d.text);
                return 1;
        }
        if (epochs == 0)
                epochs = job.train.epochs;
        if (reference && access(python, X_OK) < 0) {
                fprintf(stderr, "bench-train: %s not found; install python3-torch or pass --no-reference\n", python);
                return 1;
        }
        log_set_max_level(LOG_WARNING); /* the children's epoch lines would drown the table */

        printf("job %s: batch %d, %d epochs, %s lr %g, %d threads, %d runs%s\n", job.name,
               job.train.batch_size, epochs, optim_kind_to_string(job.optim.kind),
               (double)job.optim.lr, threads, runs, getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE is set)" : "");
        printf("%-4s %-9s %12s %10s %10s\n", "run", "engine", "samples/s", "test acc", "peak MiB");
        fflush(stdout);
        for (int i = 0; i < runs; i++) {
                ours[i] = run_ravnest(&job, threads, epochs);
                printf("%-4d %-9s %12.0f %9.2f%% %10.1f%s\n", i + 1, "ravnest", ours[i].samples_per_sec,
                       100 * ours[i].test_acc, ours[i].peak_mib, ours[i].ok ? "" : "  FAILED");
                fflush(stdout);
                if (!reference)
                        continue;
                ref[i] = run_torch(python, script, &job, job.data.path, threads, epochs);
                printf("%-4d %-9s %12.0f %9.2f%% %10.1f%s\n", i + 1, "pytorch", ref[i].samples_per_sec,
                       100 * ref[i].test_acc, ref[i].peak_mib, ref[i].ok ? "" : "  FAILED");
                fflush(stdout);
        }

        double s = median(ours, runs, offsetof(Result, samples_per_sec));
        double a = median(ours, runs, offsetof(Result, test_acc));
        double m = median(ours, runs, offsetof(Result, peak_mib));
        printf("\nmedian ravnest: %.0f samples/s, test accuracy %.2f%%, peak RSS %.1f MiB\n", s, 100 * a, m);
        if (reference) {
                double rs = median(ref, runs, offsetof(Result, samples_per_sec));
                double ra = median(ref, runs, offsetof(Result, test_acc));
                double rm = median(ref, runs, offsetof(Result, peak_mib));
                printf("median pytorch: %.0f samples/s, test accuracy %.2f%%, peak RSS %.1f MiB\n", rs,
                       100 * ra, rm);
                /* The machine is shared and noisy; runs alternate, so the ratio
                 * within each pair of runs is the steadier figure. */
                Result paired[MAX_RUNS] = {};
                for (int i = 0; i < runs; i++)
                        if (ours[i].ok && ref[i].ok && ref[i].samples_per_sec > 0)
                                paired[i] = (Result){ .samples_per_sec = ours[i].samples_per_sec / ref[i].samples_per_sec, .ok = 1 };
                printf("ratio: throughput %.2fx pytorch (median of per-run ratios %.2fx), accuracy %+.2f points, memory %.2fx\n",
                       rs > 0 ? s / rs : 0.0, median(paired, runs, offsetof(Result, samples_per_sec)),
                       100 * (a - ra), rm > 0 ? m / rm : 0.0);
        }
        return 0;
}
