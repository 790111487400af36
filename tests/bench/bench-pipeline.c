/* bench-pipeline — a swarm of 2 clusters x 2 pipeline stages (4 ravnestd
 * processes on loopback, started by `ravnestctl swarm`) against ravnestd
 * training alone, the same job and the same number of samples, in the same
 * run: test accuracy, throughput, the busy fraction of every stage under
 * the asynchronous schedule and under the synchronous one (the bubble), and
 * each node's peak RSS.
 *
 *     bench-pipeline [--epochs N] [--job FILE] [--bubble-only]
 */
#include <getopt.h>
#include <sched.h>
#include <stdbool.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf/option.h"

#define BUILD_DAEMON BUILD_ROOT "/daemon"

/* Run argv, collect its output and peak RSS (KiB). */
static char *run(char *const argv[], long *ret_rss) {
        int fds[2];
        if (pipe(fds) < 0)
                return NULL;
        pid_t pid = fork();
        if (pid == 0) {
                dup2(fds[1], STDOUT_FILENO);
                dup2(fds[1], STDERR_FILENO);
                close(fds[0]);
                execv(argv[0], argv);
                _exit(127);
        }
        close(fds[1]);
        size_t cap = 1 << 20, len = 0;
        char *out = malloc(cap);
        ssize_t k;
        while ((k = read(fds[0], out + len, cap - 1 - len)) > 0) {
                len += (size_t)k;
                if (len == cap - 1)
                        out = realloc(out, cap *= 2);
        }
        out[len] = 0;
        close(fds[0]);
        int status;
        struct rusage ru;
        wait4(pid, &status, 0, &ru);
        if (ret_rss)
                *ret_rss = ru.ru_maxrss;
        if (!WIFEXITED(status) || WEXITSTATUS(status)) {
                fprintf(stderr, "bench-pipeline: %s failed:\n%s\n", argv[0], out);
                free(out);
                return NULL;
        }
        return out;
}

/* The number after the last occurrence of key. */
static double last_number(const char *out, const char *key) {
        const char *p = NULL, *q = out;
        while ((q = strstr(q, key)))
                p = q++;
        return p ? strtod(p + strlen(key), NULL) : -1;
}

static double median_rate(const char *out) {
        double v[64];
        int n = 0;
        const char *p = out;
        while ((p = strstr(p, " done: ")) && n < 64) {
                const char *s = strstr(p, "samples/s");
                const char *b = s;
                while (b > p && b[-1] != ',')
                        b--;
                v[n++] = strtod(b, NULL);
                p = s;
        }
        for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                        double t = v[j];
                        v[j] = v[j - 1];
                        v[j - 1] = t;
                }
        return n ? v[n / 2] : -1;
}

/* The swarm's training rate, all clusters together. */
static double rate_of(const char *out) {
        const char *r = strstr(out, " samples/s, all clusters together"), *b = r;
        while (b && b > out && b[-1] != ' ')
                b--;
        return b ? strtod(b, NULL) : -1;
}

typedef struct Swarm {
        double acc[2], busy[4], rss[4], rate;
} Swarm;

static int parse_swarm(const char *out, Swarm *s) {
        static const char *names[4] = { "c1s1", "c1s2", "c2s1", "c2s2" };
        for (int c = 0; c < 2; c++) {
                char key[64];
                snprintf(key, sizeof key, "swarm: cluster %d: test accuracy ", c + 1);
                s->acc[c] = last_number(out, key);
        }
        for (int i = 0; i < 4; i++) {
                char key[64];
                snprintf(key, sizeof key, "swarm: %s ", names[i]);
                const char *p = strstr(out, key);
                if (!p)
                        return -1;
                char *end;
                s->busy[i] = strtod(p + strlen(key), &end);
                s->rss[i] = strtod(end + 1, NULL);
        }
        s->rate = rate_of(out);
        return 0;
}

/* The number after key on the line of node `node` that says "Finished". */
static double finished(const char *out, const char *node, const char *key) {
        for (const char *p = out; (p = strstr(p, node)); p++) {
                const char *eol = strchr(p, '\n'), *f = strstr(p, "Finished"), *k = strstr(p, key);
                if ((p == out || p[-1] == '\n') && f && k && (!eol || (f < eol && k < eol)))
                        return strtod(k + strlen(key), NULL);
        }
        return -1;
}

/* One cluster of two stages pinned to CPUs 0 and 1, asynchronous and
 * synchronous; with load_nice >= 0 a busy process at that nice value shares
 * CPU 0 with the first stage. Each stage's figures are over its training
 * (from its first micro-batch to the end of training, without the
 * evaluation). */
static void bubble(char *job, char *epochs, char *micro_batch, double one_rate, int load_nice) {
        pid_t load = -1;
        fflush(stdout);
        if (load_nice >= 0 && (load = fork()) == 0) {
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(0, &set);
                sched_setaffinity(0, sizeof set, &set);
                setpriority(PRIO_PROCESS, 0, load_nice);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                for (volatile unsigned long i = 0;; i++)
                        ;
        }
        char *out[2];
        for (int sync = 0; sync < 2; sync++)
                out[sync] = run((char *[]){ BUILD_DAEMON "/ravnestctl", "swarm", "--ravnestd", BUILD_DAEMON "/ravnestd",
                                            "--job", job, "--epochs", epochs, "--progress", "0", "--clusters", "1",
                                            "--micro-batch", micro_batch, "--pin", sync ? "--sync" : NULL, NULL },
                                NULL);
        if (load > 0) {
                kill(load, SIGKILL);
                waitpid(load, NULL, 0);
        }
        if (out[0] && out[1]) {
                static const char *what[][2] = {
                        { "busy while training", "busy " },
                        { "  computing", "computing " },
                        { "  moving tensors", "moving tensors " },
                        { "  waiting (the bubble)", "waiting " },
                };
                printf("%-34s %12s %12s\n", "", "async", "sync");
                for (int st = 0; st < 2; st++)
                        for (size_t w = 0; w < sizeof what / sizeof *what; w++) {
                                char label[64], node[8];
                                snprintf(label, sizeof label, "%s%s", w ? "" : st ? "stage 2, " : "stage 1, ",
                                         what[w][0]);
                                snprintf(node, sizeof node, "c1s%d ", st + 1);
                                printf("%-34s %11.0f%% %11.0f%%\n", label, finished(out[0], node, what[w][1]),
                                       finished(out[1], node, what[w][1]));
                        }
                double ra = last_number(out[0], "swarm: cluster 1: test accuracy "),
                       rs = last_number(out[1], "swarm: cluster 1: test accuracy ");
                double ta = rate_of(out[0]), ts = rate_of(out[1]);
                printf("%-34s %12.0f %12.0f   (%.2fx)\n", "samples/s", ta, ts, ta / ts);
                printf("%-34s %11.2f%% %11.2f%%\n", "test accuracy", ra, rs);
                if (one_rate > 0)
                        printf("%-34s %12.0f\n", "one node, 2 threads: samples/s", one_rate);
        }
        free(out[0]);
        free(out[1]);
}

/* The bubble, without 4 processes sharing 2 cores: one cluster of two
 * stages, each pinned to a core of its own, so compute bounds both. */
static void bubbles(char *job, char *epochs, double one_rate) {
        /* Equal nodes and equal work: the deeper MLP cuts into two halves
         * that cost the same. */
        printf("\nOne cluster of 2 stages doing equal work (fashion-mnist-mlp-deep, micro-batches of 64), each "
               "pinned to its own CPU:\n");
        bubble(SOURCE_ROOT "/config/jobs/fashion-mnist-mlp-deep.job", epochs, "64", -1, -1);
        /* The MLP cuts only at layer boundaries: its first stage does half
         * the second's work (the first linear layer computes no input
         * gradient), so on equal nodes the first stage waits for the second
         * whatever the schedule. */
        printf("\nThe job's own cut (stage 1 does half of stage 2's work), each stage pinned to its own CPU:\n");
        bubble(job, epochs, "32", one_rate, -1);
        /* A slower first node evens it out: a competing process on stage 1's
         * core leaves it about half of that core. */
        printf("\nThe same, stage 1's core shared with a busy process (a node about half as fast):\n");
        bubble(job, epochs, "32", one_rate, 0);
}

static void usage(FILE *f) {
        fprintf(f, "Usage: bench-pipeline [--epochs N] [--job FILE] [--bubble-only]\n"
                   "One node against swarms of 2 clusters x 2 stages (async and sync), and the pipeline's bubble.\n");
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "epochs", required_argument, NULL, 'e' },
                { "job", required_argument, NULL, 'j' },
                { "bubble-only", no_argument, NULL, 'b' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        char epochs[16] = "5", *job = SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job";
        bool bubble_only = false;
        int o;
        long long v = 0;
        while ((o = getopt_long(argc, argv, "h", opts, NULL)) >= 0)
                switch (o) {
                case 'e':
                        if (option_int("epochs", optarg, 1, 1000000, &v) < 0)
                                return EX_USAGE;
                        snprintf(epochs, sizeof epochs, "%lld", v);
                        break;
                case 'j': job = optarg; break;
                case 'b': bubble_only = true; break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return EX_USAGE;
                }
        if (optind < argc) {
                fprintf(stderr, "%s: unexpected argument \"%s\"\n", argv[0], argv[optind]);
                return EX_USAGE;
        }

        long rss;
        printf("%s epochs of %s: one node, then 2 clusters x 2 stages (async, then sync)\n", epochs, job);
        fflush(stdout);
        char *one = run((char *[]){ BUILD_DAEMON "/ravnestd", "--no-idle", "--control-socket", "none", "--job", job, "--epochs", epochs, "--progress", "0",
                                    NULL }, &rss);
        if (!one)
                return 1;
        double one_acc = last_number(one, "test accuracy "), one_rate = median_rate(one);
        double one_rss = (double)rss / 1024;
        if (bubble_only) {
                bubbles(job, epochs, one_rate);
                free(one);
                return 0;
        }
        Swarm a = {}, s = {};
        char *async = run((char *[]){ BUILD_DAEMON "/ravnestctl", "swarm", "--ravnestd", BUILD_DAEMON "/ravnestd",
                                      "--job", job, "--epochs", epochs, "--progress", "0", NULL }, NULL);
        char *sync = run((char *[]){ BUILD_DAEMON "/ravnestctl", "swarm", "--ravnestd", BUILD_DAEMON "/ravnestd",
                                     "--job", job, "--epochs", epochs, "--progress", "0", "--sync", NULL }, NULL);
        if (!async || !sync || parse_swarm(async, &a) < 0 || parse_swarm(sync, &s) < 0) {
                fprintf(stderr, "bench-pipeline: a swarm did not finish\n");
                return 1;
        }
        printf("\n%-34s %12s %12s %12s\n", "", "one node", "swarm async", "swarm sync");
        printf("%-34s %11.2f%% %11.2f%% %11.2f%%\n", "test accuracy (cluster 1)", one_acc, a.acc[0], s.acc[0]);
        printf("%-34s %12s %11.2f%% %11.2f%%\n", "test accuracy (cluster 2)", "", a.acc[1], s.acc[1]);
        printf("%-34s %12.0f %12.0f %12.0f\n", "samples/s (training)", one_rate, a.rate, s.rate);
        printf("%-34s %12s %11.2fx %11.2fx\n", "  against one node", "", a.rate / one_rate, s.rate / one_rate);
        static const char *names[4] = { "c1s1", "c1s2", "c2s1", "c2s2" };
        for (int i = 0; i < 4; i++) {
                char label[64];
                snprintf(label, sizeof label, "busy, %s", names[i]);
                printf("%-34s %12s %11.0f%% %11.0f%%\n", label, "", a.busy[i], s.busy[i]);
        }
        for (int i = 0; i < 4; i++) {
                char label[64];
                snprintf(label, sizeof label, "peak RSS, %s (MiB)", names[i]);
                printf("%-34s %12.0f %12.0f %12.0f\n", label, i ? 0.0 : one_rss, a.rss[i], s.rss[i]);
        }
        printf("\naccuracy, swarm async against one node: %+.2f points\n", (a.acc[0] + a.acc[1]) / 2 - one_acc);

        bubbles(job, epochs, one_rate);
        free(one);
        free(async);
        free(sync);
        return 0;
}
