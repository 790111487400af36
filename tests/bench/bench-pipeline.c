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
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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
        s->rate = last_number(out, "swarm: ");
        const char *r = strstr(out, " samples/s, all clusters together");
        if (r) {
                const char *b = r;
                while (b > out && b[-1] != ' ')
                        b--;
                s->rate = strtod(b, NULL);
        }
        return 0;
}

/* One cluster of two stages pinned to CPUs 0 and 1, asynchronous and
 * synchronous; with load_nice >= 0 a busy process at that nice value shares
 * CPU 0 with the first stage. */
static void bubble(char *job, char *epochs, double one_rate, int load_nice) {
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
        char *pa = run((char *[]){ BUILD_DAEMON "/ravnestctl", "swarm", "--ravnestd", BUILD_DAEMON "/ravnestd", "--job",
                                   job, "--epochs", epochs, "--progress", "0", "--clusters", "1", "--pin", NULL }, NULL);
        char *ps = run((char *[]){ BUILD_DAEMON "/ravnestctl", "swarm", "--ravnestd", BUILD_DAEMON "/ravnestd", "--job",
                                   job, "--epochs", epochs, "--progress", "0", "--clusters", "1", "--pin", "--sync",
                                   NULL }, NULL);
        if (load > 0) {
                kill(load, SIGKILL);
                waitpid(load, NULL, 0);
        }
        if (pa && ps) {
                double ba[2], bs[2];
                for (int i = 0; i < 2; i++) {
                        char key[32];
                        snprintf(key, sizeof key, "swarm: c1s%d ", i + 1);
                        ba[i] = strtod(strstr(pa, key) + strlen(key), NULL);
                        bs[i] = strtod(strstr(ps, key) + strlen(key), NULL);
                }
                double ra = last_number(pa, "swarm: cluster 1: test accuracy "), rs = last_number(ps, "swarm: cluster 1: test accuracy ");
                const char *ka = strstr(pa, " samples/s, all clusters together"), *ks = strstr(ps, " samples/s, all clusters together");
                while (ka && ka[-1] != ' ')
                        ka--;
                while (ks && ks[-1] != ' ')
                        ks--;
                double ta = ka ? strtod(ka, NULL) : -1, ts = ks ? strtod(ks, NULL) : -1;
                printf("%-34s %12s %12s\n", "", "async", "sync");
                printf("%-34s %11.0f%% %11.0f%%\n", "busy, stage 1", ba[0], bs[0]);
                printf("%-34s %11.0f%% %11.0f%%\n", "busy, stage 2", ba[1], bs[1]);
                printf("%-34s %12.0f %12.0f   (%.2fx)\n", "samples/s", ta, ts, ta / ts);
                printf("%-34s %11.2f%% %11.2f%%\n", "test accuracy", ra, rs);
                printf("%-34s %12.0f\n", "one node, 2 threads: samples/s", one_rate);
        }
        free(pa);
        free(ps);
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "epochs", required_argument, NULL, 'e' },
                { "job", required_argument, NULL, 'j' },
                { "bubble-only", no_argument, NULL, 'b' },
                {},
        };
        char epochs[16] = "5", *job = SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job";
        bool bubble_only = false;
        int o;
        while ((o = getopt_long(argc, argv, "", opts, NULL)) >= 0)
                switch (o) {
                case 'e': snprintf(epochs, sizeof epochs, "%s", optarg); break;
                case 'j': job = optarg; break;
                case 'b': bubble_only = true; break;
                default:
                        fprintf(stderr, "Usage: bench-pipeline [--epochs N] [--job FILE] [--bubble-only]\n");
                        return 2;
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
                printf("\nOne cluster of 2 stages, each pinned to its own CPU (the bubble):\n");
                bubble(job, epochs, one_rate, -1);
                printf("\nThe same, stage 1's core shared with a busy process (a node about half as fast):\n");
                bubble(job, epochs, one_rate, 0);
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

        /* The bubble, without 4 processes sharing 2 cores: one cluster of two
         * stages, each pinned to a core of its own. */
        printf("\nOne cluster of 2 stages, each pinned to its own CPU (the bubble):\n");
        bubble(job, epochs, one_rate, -1);
        /* The MLP cuts only at layer boundaries: its first stage does half
         * the second's work (the first linear layer computes no input
         * gradient). A slower first node evens it out: a competing process
         * on stage 1's core leaves it about half of that core, so compute,
         * not the cut, is what bounds both stages. */
        printf("\nThe same, stage 1's core shared with a busy process (a node about half as fast):\n");
        bubble(job, epochs, one_rate, 0);
        free(one);
        free(async);
        free(sync);
        return 0;
}
