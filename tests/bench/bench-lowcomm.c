/* bench-lowcomm — training over slow links: the validation loss a swarm
 * reaches and the averaging bytes it sends per node per training step,
 * with averaging at today's tightest cadence (a round every step, float32)
 * and every 10 steps against an outer optimizer (averaging.outer, DiLoCo's Nesterov SGD on
 * pseudo-gradients) every H steps, in float32 and in int8 (without error
 * feedback, the default, and with it).
 *
 * Every run is `ravnestctl swarm` on the same job, data and epochs, so
 * every run trains on the same tokens; runs of the configurations
 * alternate so all see the same machine, and the figures are medians. The
 * bytes are each node's averaging bytes (sent and received) over its
 * training steps, from the swarm's table; the last round, which averages
 * the parameters in float32 so the replicas leave as one model, is in
 * them. With --rate MBIT the swarm runs in a network namespace of its own
 * whose loopback is shaped with tbf to MBIT times the number of nodes (the
 * nodes share one loopback: that is the sum of as many links of MBIT). It
 * prints figures and never asserts on them.
 *
 *     bench-lowcomm [--runs N] [--layout 4x1|2x2] [--epochs N] [--rate MBIT]
 *                   [--job FILE] [--data PATH] [--only NAME]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "util/format.h"

#define MAX_RUNS 16
#define OUT_MAX (4 << 20)

typedef struct Setting {
        const char *name;
        const char *averaging; /* --averaging */
} Setting;

#define OUTER "outer = { lr = 0.7; momentum = 0.9; };"
static const Setting settings[] = {
        { "every step, f32", "interval_steps = 1;" },
        { "every 10, f32", "interval_steps = 10;" },
        { "every 10, int8", "interval_steps = 10; payload = \"int8\";" },
        { "every 10, int8, feedback", "interval_steps = 10; payload = \"int8\"; error_feedback = true;" },
        { "outer H=10, int8", "interval_steps = 10; payload = \"int8\"; " OUTER },
        { "outer H=10, int8, feedback", "interval_steps = 10; payload = \"int8\"; error_feedback = true; " OUTER },
        { "outer H=50, f32", "interval_steps = 50; " OUTER },
        { "outer H=100, f32", "interval_steps = 100; " OUTER },
        { "outer H=500, f32", "interval_steps = 500; " OUTER },
        { "outer H=100, int8", "interval_steps = 100; payload = \"int8\"; " OUTER },
        { "outer H=100, int8, feedback", "interval_steps = 100; payload = \"int8\"; error_feedback = true; " OUTER },
};
#define N_SETTINGS (sizeof settings / sizeof settings[0])

typedef struct Options {
        int runs, epochs, clusters, stages;
        double rate_mbit;
        const char *job, *data, *only;
} Options;

typedef struct Run {
        double loss, bytes_per_step, peak_mib, wall_s;
        int ok;
} Run;

/* The swarm's table: "swarm: c1s1   100%   0 B   4.5 MiB   338 MiB  0":
 * the mean of the nodes' averaging bytes per step and the largest peak. */
static int parse_table(const char *out, Run *run) {
        double sum = 0;
        int nodes = 0;
        for (const char *p = out; (p = strstr(p, "swarm: c")); p++) {
                char name[16];
                int busy, used = 0;
                uint64_t pipe_b, avg_b;
                double peak;
                const char *q;
                if (sscanf(p, "swarm: %15s %d%% %n", name, &busy, &used) < 2 || used == 0)
                        continue;
                if (parse_bytes(p + used, &q, &pipe_b) < 0)
                        continue;
                while (*q == ' ')
                        q++;
                if (parse_bytes(q, &q, &avg_b) < 0 || sscanf(q, " %lf MiB", &peak) != 1)
                        continue;
                sum += (double)avg_b;
                run->peak_mib = peak > run->peak_mib ? peak : run->peak_mib;
                nodes++;
        }
        run->bytes_per_step = nodes ? sum / nodes : -1;
        return nodes;
}

/* One swarm; with a rate, inside `unshare -n` with a shaped loopback. */
static Run run_swarm(const Options *o, const Setting *s, char *out) {
        char clusters[16], stages[16], epochs[16], shape[256];
        Run run = { .loss = -1 };
        snprintf(clusters, sizeof clusters, "%d", o->clusters);
        snprintf(stages, sizeof stages, "%d", o->stages);
        snprintf(epochs, sizeof epochs, "%d", o->epochs);
        snprintf(shape, sizeof shape,
                 "ip link set lo up mtu 1500 && tc qdisc add dev lo root tbf rate %.0fmbit burst 64kb latency 50ms && "
                 "exec \"$@\"",
                 o->rate_mbit * o->clusters * o->stages);
        char *argv[40] = { "unshare", "-n", "sh", "-c", shape, "sh" };
        int a = o->rate_mbit > 0 ? 6 : 0;
        char *const swarm[] = { BUILD_ROOT "/daemon/ravnestctl", "swarm", "--ravnestd", BUILD_ROOT "/daemon/ravnestd",
                                "--job", (char *)o->job, "--data-dir", (char *)o->data, "--epochs", epochs,
                                "--clusters", clusters, "--stages", stages, "--progress", "0",
                                "--averaging", (char *)s->averaging, NULL };
        for (int i = 0; swarm[i]; i++)
                argv[a++] = swarm[i];
        argv[a] = NULL;

        int fds[2];
        if (pipe(fds) < 0)
                return run;
        double t0 = bench_now_s();
        pid_t pid = fork();
        if (pid == 0) {
                dup2(fds[1], STDOUT_FILENO);
                dup2(fds[1], STDERR_FILENO);
                close(fds[0]);
                execvp(argv[0], argv);
                _exit(127);
        }
        close(fds[1]);
        double child_peak;
        const char *text = bench_child_output(pid, fds[0], out, OUT_MAX, &child_peak);
        run.wall_s = bench_now_s() - t0;
        const char *avg = text ? strstr(text, "swarm: the averaged model") : NULL;
        const char *loss = avg ? strstr(avg, "test loss ") : NULL;
        if (!loss || parse_table(text, &run) <= 0) {
                fprintf(stderr, "bench-lowcomm: %s: the swarm failed; its last output:\n%s\n", s->name,
                        strlen(out) > 2000 ? out + strlen(out) - 2000 : out);
                return run;
        }
        run.loss = strtod(loss + strlen("test loss "), NULL);
        run.ok = 1;
        return run;
}

static double median(double *v, int n) {
        return n ? bench_median(v, n) : -1;
}

typedef struct Row {
        double loss, bytes, peak, wall;
        int ok;
} Row;

static Row summarize(Run *runs, int n) {
        double loss[MAX_RUNS], bytes[MAX_RUNS], peak[MAX_RUNS], wall[MAX_RUNS];
        int k = 0;
        for (int i = 0; i < n; i++)
                if (runs[i].ok) {
                        loss[k] = runs[i].loss;
                        bytes[k] = runs[i].bytes_per_step;
                        peak[k] = runs[i].peak_mib;
                        wall[k++] = runs[i].wall_s;
                }
        return (Row){ median(loss, k), median(bytes, k), median(peak, k), median(wall, k), k };
}

static void print_table(const Options *o, Run (*runs)[MAX_RUNS]) {
        Row ref = summarize(runs[0], o->runs);
        printf("\n%d x %d nodes, %d epochs of %s%s; medians of %d runs\n", o->clusters, o->stages, o->epochs,
               o->data, o->rate_mbit > 0 ? "" : ", loopback", o->runs);
        if (o->rate_mbit > 0)
                printf("links: %.0f Mbit/s per node (tbf on a namespace's loopback)\n", o->rate_mbit);
        printf("%-20s %10s %8s %16s %12s %8s %9s\n", "run", "val loss", "vs ref", "avg bytes/step", "fewer bytes",
               "wall s", "peak RSS");
        for (size_t i = 0; i < N_SETTINGS; i++) {
                if (o->only && !strstr(settings[i].name, o->only) && i > 0)
                        continue;
                Row r = summarize(runs[i], o->runs);
                char b[FORMAT_BYTES_MAX];
                if (!r.ok) {
                        printf("%-20s %10s\n", settings[i].name, "failed");
                        continue;
                }
                printf("%-20s %10.4f %+7.1f%% %16s %11.0fx %8.1f %5.0f MiB\n", settings[i].name, r.loss,
                       100 * (r.loss / ref.loss - 1), format_bytes(b, sizeof b, (uint64_t)r.bytes),
                       ref.bytes / r.bytes, r.wall, r.peak);
        }
}

static int parse_args(int argc, char *argv[], Options *o) {
        static const struct option options[] = {
                { "runs", required_argument, NULL, 'r' },  { "layout", required_argument, NULL, 'l' },
                { "epochs", required_argument, NULL, 'e' }, { "rate", required_argument, NULL, 'R' },
                { "job", required_argument, NULL, 'j' },    { "data", required_argument, NULL, 'd' },
                { "only", required_argument, NULL, 'o' },   { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'r': o->runs = atoi(optarg); break;
                case 'l':
                        if (sscanf(optarg, "%dx%d", &o->clusters, &o->stages) != 2)
                                return -1;
                        break;
                case 'e': o->epochs = atoi(optarg); break;
                case 'R': o->rate_mbit = atof(optarg); break;
                case 'j': o->job = optarg; break;
                case 'd': o->data = optarg; break;
                case 'o': o->only = optarg; break;
                default: return -1;
                }
        if (o->runs < 1 || o->runs > MAX_RUNS || o->clusters < 2 || o->stages < 1 ||
            o->clusters * o->stages > 64 || o->epochs < 1 || o->rate_mbit < 0)
                return -1;
        return 0;
}

int main(int argc, char *argv[]) {
        Options o = { .runs = 3, .epochs = 4, .clusters = 4, .stages = 1,
                      .job = SOURCE_ROOT "/config/jobs/fortunes-gpt.job", .data = "/usr/share/games/fortunes/cookie" };
        static Run runs[N_SETTINGS][MAX_RUNS];
        if (parse_args(argc, argv, &o) < 0) {
                fprintf(stderr, "Usage: bench-lowcomm [--runs 1..16] [--layout CxS] [--epochs N] [--rate MBIT] "
                                "[--job FILE] [--data PATH] [--only NAME]\n");
                return 2;
        }
        char *out = malloc(OUT_MAX);
        if (!out)
                return 1;
        for (int k = 0; k < o.runs; k++)
                for (size_t i = 0; i < N_SETTINGS; i++) {
                        if (o.only && i > 0 && !strstr(settings[i].name, o.only))
                                continue;
                        runs[i][k] = run_swarm(&o, &settings[i], out);
                        fprintf(stderr, "run %d, %-20s loss %.4f, %.0f B/step, %.1f s\n", k + 1, settings[i].name,
                                runs[i][k].loss, runs[i][k].bytes_per_step, runs[i][k].wall_s);
                }
        print_table(&o, runs);
        free(out);
        return 0;
}
