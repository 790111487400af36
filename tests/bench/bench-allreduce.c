/* bench-allreduce — averaging float32 vectors between processes on loopback
 * with ravnest's ring all-reduce, beside PyTorch's Gloo backend and OpenMPI's
 * MPI_Allreduce over TCP measured in the same run.
 *
 * For 2 and 4 processes and 1, 16 and 64 MiB, each member forks, joins the
 * others over authenticated links (plaintext, AES-256-GCM, AEGIS-256, and plaintext
 * with binary16 payloads), and runs
 * warm-up rounds and then --runs timed rounds. A round's time is that of the
 * slowest member, from START (when the group is assembled, as after the
 * references' barrier) to holding the average in its own vector (in place,
 * as the references do). Medians are printed with the
 * ratio to each reference: reference time / ours, so above 1 is faster.
 * Then multi-ring: two clusters of two stages, cut at different points,
 * averaging their stages with three rings at once, against one ring of two
 * replicas over the whole vector.
 *
 *     bench-allreduce [--runs N] [--no-reference] [--python PATH] [--procs N] [--mib M] [--piece BYTES]
 *                     [--netns MBIT] [--only plain|aes|aegis|f16|i8] [--lanes 1|2|4] [--pairs N]
 *
 * --procs and --mib keep one row of the first table (and skip the rest);
 * --only runs one of its modes (to profile one alone);
 * --lanes picks the AEGIS of the aegis column (AEGIS-256, -256X2,
 * -256X4; by default the one the handshake chooses on this CPU);
 * --piece sets the bytes of values per piece. --pairs N measures one size
 * (--procs, --mib; 4 and 64 by default) N times, Gloo and ours in the
 * float32 modes (or --only's) in turn, and gives the median of the N
 * ratios with, from 6 pairs on, a 95 % confidence interval of it: each
 * compares runs seconds apart, where the table's compare runs up to a
 * minute apart. --netns MBIT runs only the
 * multi-ring comparison, between members in four network namespaces whose
 * links are limited to MBIT each way (root, iproute2).
 */
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collective/coll.h"
#include "conf/option.h"
#include "net/handshake.h"
#include "util/time-util.h"
#include "bench.h"

#define MAX_RUNS 32
#define WARMUP 2
#define MAX_PROCS 4

static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = "bench network secret...........";
static int runs = 5;
static size_t piece_bytes; /* 0: the default */
static bool any_failed;    /* a measurement of ours that failed: nan in the table, exit 1 */
static double peak_rss_mib; /* the largest member of any experiment */
static unsigned netns_mbit;  /* > 0: members in network namespaces, links of this rate */
static unsigned aegis_lanes; /* 0: the AEGIS the handshake chooses */

#define NETNS "rvnbench"

/* Member i's address: loopback, or its namespace's on the bench bridge. */
static void member_host(unsigned i, char *out, size_t n) {
        if (netns_mbit)
                snprintf(out, n, "10.77.0.%u", i + 1);
        else
                snprintf(out, n, "127.0.0.1");
}


/* A member's part of one experiment: rounds over ranges of a vector. */
typedef struct Part {
        uint32_t group;
        unsigned members[MAX_PROCS], n;
        size_t off, len;
} Part;

typedef struct Experiment {
        unsigned procs;
        Cipher cipher; /* CIPHER_NONE: plaintext */
        CollPayload payload;
        size_t len;                     /* values in the whole vector */
        Part parts[MAX_PROCS][3];       /* per member, up to three rings */
        unsigned n_parts[MAX_PROCS];
} Experiment;

/* How far a member's average may be from v: binary16 keeps 11 bits at
 * every hop; int8 adds half a step of the block (largest value 1024 + n,
 * over 127) at every hop of n. */
static float tolerance(const Experiment *e, unsigned n, float v) {
        switch (e->payload) {
        case COLL_PAYLOAD_F16: return 4e-3f * fabsf(v) + 1e-3f;
        case COLL_PAYLOAD_INT8: return (float)n * (1024.0f + (float)n) / 254 * 1.01f + 1e-3f;
        default: return 1e-3f;
        }
}

/* Run as member self; write one line per timed round: seconds from the
 * earliest START to the last piece, over this member's rings. */
static int member(const Experiment *e, unsigned self, const Identity *ids, int port_out, int ports_in,
                  int result_out) {
        NetConfig nc;
        CollConfig cc;
        CollMember m[MAX_PROCS] = {};
        Coll *c;
        uint16_t port;
        int r;

        net_config_defaults(&nc);
        nc.identity = &ids[self];
        nc.secret = secret;
        nc.plaintext = e->cipher == CIPHER_NONE;
        nc.pool_bytes = e->len * sizeof(float) + (16u << 20); /* the averages a round keeps, sums in flight */
        nc.ciphers = e->cipher == CIPHER_NONE ? 0 : CIPHER_BIT(e->cipher);
        coll_config_defaults(&cc);
        for (unsigned i = 0; i < e->procs; i++) {
                memcpy(m[i].id, ids[i].pk, IDENTITY_PK_SIZE);
                member_host(i, m[i].host, sizeof m[i].host);
        }
        cc.payload = e->payload;
        if (piece_bytes)
                cc.piece_bytes = piece_bytes;
        cc.net = &nc;
        cc.members = m;
        cc.n_members = e->procs;
        cc.self = self;
        if ((r = coll_new(&cc, &c)) < 0 || (r = coll_listen(c, 0, &port)) < 0)
                return r;
        uint16_t msg[2] = { (uint16_t)self, port }; /* one write: atomic on a pipe */
        if (write(port_out, msg, sizeof msg) != sizeof msg)
                return -EIO;
        for (unsigned i = 0; i < e->procs; i++) {
                uint16_t p;
                if (read(ports_in, &p, sizeof p) != sizeof p)
                        return -EIO;
                coll_set_address(c, i, m[i].host, p);
        }
        while (coll_n_connected(c) < e->procs - 1)
                coll_run(c, 5);

        float *x = malloc(e->len * sizeof *x);
        if (!x)
                return -ENOMEM;
        for (size_t k = 0; k < e->len; k++)
                x[k] = (float)(k % 1024) + (float)self + 1;
        for (int round = 0; round < WARMUP + runs; round++) {
                CollRound *rd[3];
                unsigned np = e->n_parts[self];
                for (unsigned i = 0; i < np; i++) {
                        const Part *p = &e->parts[self][i];
                        /* in place, as the references do: the average lands in x */
                        if ((r = coll_round_start(c, p->group, p->members, p->n, x + p->off, p->len, 1, &rd[i])) < 0 ||
                            (r = coll_round_set_output(rd[i], x + p->off)) < 0)
                                return r;
                }
                uint64_t first = UINT64_MAX, last = 0;
                bool ok = true;
                for (unsigned i = 0; i < np; i++) {
                        CollRoundInfo info;
                        while (!coll_round_finished(rd[i]))
                                coll_run(c, 1);
                        coll_round_info(rd[i], &info);
                        ok &= info.state == COLL_ROUND_DONE;
                        first = MIN(first, info.running_ns);
                        last = MAX(last, info.end_ns);
                }
                if (round == 0 && ok) { /* the average of k%1024 + rank + 1 over its ring */
                        for (unsigned i = 0; i < np; i++) {
                                const Part *p = &e->parts[self][i];
                                float want = 0, *avg = malloc(p->len * sizeof *avg);
                                for (unsigned j = 0; j < p->n; j++)
                                        want += (float)p->members[j] + 1;
                                want /= (float)p->n;
                                coll_round_read(rd[i], 0, p->len, avg);
                                for (size_t k = 0; k < p->len && ok; k++) {
                                        float v = (float)((p->off + k) % 1024) + want;
                                        ok = fabsf(avg[k] - v) <= tolerance(e, p->n, v);
                                }
                                free(avg);
                        }
                }
                for (unsigned i = 0; i < np; i++)
                        coll_round_free(rd[i]);
                if (!ok)
                        return -EBADMSG;
                if (round >= WARMUP) {
                        double t = ns_to_sec(last - first);
                        if (write(result_out, &t, sizeof t) != sizeof t)
                                return -EIO;
                }
        }
        /* serve the others' last pieces, then leave */
        for (int i = 0; i < 200; i++)
                coll_run(c, 1);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double rss = (double)ru.ru_maxrss / 1024; /* MiB */
        if (write(result_out, &rss, sizeof rss) != sizeof rss)
                return -EIO;
        free(x);
        coll_free(c);
        return 0;
}

/* Fork the members; the median over rounds of the slowest member's time. */
static double run_experiment(const Experiment *e) {
        Identity ids[MAX_PROCS];
        int port_pipe[2], table[MAX_PROCS][2], result[MAX_PROCS][2];
        pid_t pid[MAX_PROCS];
        double t[MAX_RUNS] = {}, v;
        bool failed = false;

        for (unsigned i = 0; i < e->procs; i++)
                identity_generate(&ids[i]);
        if (pipe(port_pipe) < 0)
                return NAN;
        for (unsigned i = 0; i < e->procs; i++) {
                if (pipe(table[i]) < 0 || pipe(result[i]) < 0)
                        return NAN;
                pid[i] = fork();
                if (pid[i] == 0) {
                        prctl(PR_SET_PDEATHSIG, SIGKILL);
                        if (netns_mbit) { /* into member i's namespace before any socket */
                                char path[64];
                                snprintf(path, sizeof path, "/run/netns/" NETNS "%u", i);
                                int fd = open(path, O_RDONLY | O_CLOEXEC);
                                if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
                                        fprintf(stderr, "bench-allreduce: %s: %s\n", path, strerror(errno));
                                        _exit(1);
                                }
                                close(fd);
                        }
                        int r = member(e, i, ids, port_pipe[1], table[i][0], result[i][1]);
                        if (r < 0)
                                fprintf(stderr, "bench-allreduce: member %u: %s\n", i, strerror(-r));
                        _exit(r < 0);
                }
                close(table[i][0]);
                close(result[i][1]);
        }
        /* A member that fails before it listens never sends its port: the
         * others would wait for the table, and we for its port, forever. */
        close(port_pipe[1]);
        uint16_t ports[MAX_PROCS] = {};
        for (unsigned i = 0; i < e->procs && !failed; i++) {
                uint16_t msg[2];
                struct pollfd p = { .fd = port_pipe[0], .events = POLLIN };
                if (poll(&p, 1, 60000) <= 0 || read(port_pipe[0], msg, sizeof msg) != sizeof msg || msg[0] >= e->procs)
                        failed = true;
                else
                        ports[msg[0]] = msg[1];
        }
        for (unsigned i = 0; i < e->procs; i++) {
                if (failed)
                        kill(pid[i], SIGKILL);
                else if (write(table[i][1], ports, e->procs * sizeof *ports) < 0)
                        failed = true; /* it died: EPIPE, SIGPIPE is ignored */
                close(table[i][1]);
        }
        for (unsigned i = 0; i < e->procs; i++)
                for (int k = 0; k < runs; k++) {
                        if (read(result[i][0], &v, sizeof v) != sizeof v) {
                                failed = true;
                                break;
                        }
                        t[k] = MAX(t[k], v);
                }
        for (unsigned i = 0; i < e->procs; i++)
                if (read(result[i][0], &v, sizeof v) == sizeof v)
                        peak_rss_mib = MAX(peak_rss_mib, v);
        for (unsigned i = 0; i < e->procs; i++) {
                int status;
                close(result[i][0]);
                waitpid(pid[i], &status, 0);
                failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        }
        close(port_pipe[0]);
        any_failed |= failed;
        return failed ? NAN : bench_median(t, runs);
}

/* Every member in one ring over the whole vector. */
static void single_ring(Experiment *e, unsigned procs, size_t len, Cipher cipher) {
        *e = (Experiment){ .procs = procs, .cipher = cipher, .len = len };
        for (unsigned i = 0; i < procs; i++) {
                Part *p = &e->parts[i][0];
                *p = (Part){ .group = 1, .n = procs, .len = len };
                for (unsigned j = 0; j < procs; j++)
                        p->members[j] = j;
                e->n_parts[i] = 1;
        }
}

/* Cluster A = members 0 (first half) and 1; cluster B = members 2 (first
 * 30 %) and 3. Segments [0, 30 %) {0, 2}, [30 %, 50 %) {0, 3}, [50 %, 100 %)
 * {1, 3}: three rings at once, member 0 and 3 in two each. */
static void multi_ring(Experiment *e, size_t len, Cipher cipher) {
        size_t cut[4] = { 0, len * 3 / 10, len / 2, len };
        unsigned owners[3][2] = { { 0, 2 }, { 0, 3 }, { 1, 3 } };
        *e = (Experiment){ .procs = 4, .cipher = cipher, .len = len };
        for (unsigned s = 0; s < 3; s++)
                for (unsigned k = 0; k < 2; k++) {
                        unsigned m = owners[s][k];
                        e->parts[m][e->n_parts[m]++] = (Part){ .group = s + 1, .members = { owners[s][0], owners[s][1] },
                                                               .n = 2, .off = cut[s], .len = cut[s + 1] - cut[s] };
                }
}

/* Four namespaces on a bridge (in a fifth), each link limited to rate in
 * both directions with tbf: a small network of its own, cleaned up after. */
static int run(const char *fmt, ...) _printf_(1, 2);
static int run(const char *fmt, ...) {
        char cmd[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cmd, sizeof cmd, fmt, ap);
        va_end(ap);
        return system(cmd) == 0 ? 0 : -EIO;
}

static void netns_down(void) {
        for (unsigned i = 0; i < 4; i++)
                run("ip netns del " NETNS "%u 2>/dev/null", i);
        run("ip netns del " NETNS "br 2>/dev/null");
}

static int netns_up(unsigned mbit) {
        netns_down();
        if (run("ip netns add " NETNS "br") < 0 ||
            run("ip -n " NETNS "br link add br0 type bridge && ip -n " NETNS "br link set br0 up") < 0)
                return -EIO;
        for (unsigned i = 0; i < 4; i++)
                if (run("ip netns add " NETNS "%u", i) < 0 ||
                    run("ip link add v%u netns " NETNS "%u type veth peer name b%u netns " NETNS "br", i, i, i) < 0 ||
                    run("ip -n " NETNS "%u addr add 10.77.0.%u/24 dev v%u", i, i + 1, i) < 0 ||
                    run("ip -n " NETNS "%u link set v%u up && ip -n " NETNS "%u link set lo up", i, i, i) < 0 ||
                    run("ip -n " NETNS "br link set b%u master br0 && ip -n " NETNS "br link set b%u up", i, i) < 0 ||
                    run("ip netns exec " NETNS "%u tc qdisc add dev v%u root tbf rate %umbit burst 256kb latency 50ms",
                        i, i, mbit) < 0 ||
                    run("ip netns exec " NETNS "br tc qdisc add dev b%u root tbf rate %umbit burst 256kb latency 50ms",
                        i, mbit) < 0)
                        return -EIO;
        return 0;
}

/* ours in each mode; the references are float32 plaintext */
static struct Mode {
        const char *name, *column;
        Cipher cipher;
        CollPayload payload;
} modes[] = {
        { "plain", "ours", CIPHER_NONE, COLL_PAYLOAD_F32 },
        { "aes", "ours+aes", CIPHER_AES256GCM, COLL_PAYLOAD_F32 },
        { "aegis", "ours+aegis", CIPHER_AEGIS256X2, COLL_PAYLOAD_F32 }, /* main() picks the lanes */
        { "f16", "ours-f16", CIPHER_NONE, COLL_PAYLOAD_F16 },
        { "i8", "ours-i8", CIPHER_NONE, COLL_PAYLOAD_INT8 },
};
enum { N_MODES = sizeof modes / sizeof *modes };

/* One line "<impl> procs=N mib=M median_s=S ..." per size, from a reference. */
static double reference_line(FILE *f, const char *impl, unsigned procs, unsigned mib) {
        char line[512], want[64];
        double v = NAN;
        snprintf(want, sizeof want, "%s procs=%u mib=%u ", impl, procs, mib);
        rewind(f);
        while (fgets(line, sizeof line, f))
                if (strncmp(line, want, strlen(want)) == 0) {
                        const char *m = strstr(line, "median_s=");
                        if (m)
                                v = strtod(m + 9, NULL);
                }
        return v;
}

static FILE *run_reference(const char *cmd) {
        FILE *out = tmpfile(), *p = popen(cmd, "r");
        char buf[4096];
        size_t n;
        if (!out || !p) {
                if (p)
                        pclose(p);
                return out;
        }
        while ((n = fread(buf, 1, sizeof buf, p)) > 0)
                fwrite(buf, 1, n, out);
        if (pclose(p) != 0)
                fprintf(stderr, "bench-allreduce: reference failed: %s\n", cmd);
        return out;
}

static void ratio(char *buf, size_t n, double ref, double ours) {
        if (isnan(ref) || isnan(ours))
                snprintf(buf, n, "%8s", "-");
        else
                snprintf(buf, n, "%7.2fx", ref / ours);
}

/* Mode k is measured in this run: --only, or the float32 ones by default
 * in --pairs; every mode otherwise. Not where the CPU lacks its cipher. */
static bool mode_wanted(unsigned k, const char *only, bool f32_only) {
        if (only ? strcmp(only, modes[k].name) != 0 : f32_only && modes[k].payload != COLL_PAYLOAD_F32)
                return false;
        return modes[k].cipher == CIPHER_NONE || (cipher_available() & CIPHER_BIT(modes[k].cipher));
}

/* The Gloo reference's output for procs processes and the sizes in mibs
 * ("--mib M ..."). */
static FILE *run_gloo(const char *python, unsigned procs, const char *mibs) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "%s %s/tests/bench/allreduce-gloo.py --procs %u %s --runs %d", python, SOURCE_ROOT,
                 procs, mibs, runs);
        return run_reference(cmd);
}

/* Gloo's median time for one size, from a run of its own. */
static double gloo_once(const char *python, unsigned procs, unsigned mib) {
        char mibs[32];
        snprintf(mibs, sizeof mibs, "--mib %u", mib);
        FILE *f = run_gloo(python, procs, mibs);
        double g = f ? reference_line(f, "gloo", procs, mib) : NAN;
        if (f)
                fclose(f);
        return g;
}

/* --pairs: Gloo and ours one after the other, n times, for one size, so
 * that each ratio compares runs a few seconds apart: on a shared machine
 * the speed of both drifts by tens of percent over a minute. Gloo goes
 * first in odd pairs, ours in even ones. Prints every pair, then the
 * median of the pairs' ratios, how many are at least 1, and a 95 %
 * confidence interval of that median (from 6 pairs on). */
static int run_pairs(int n, const char *python, unsigned procs, unsigned mib, const char *only) {
        double ratios[N_MODES][MAX_RUNS];
        int wins[N_MODES] = {};

        printf("%d pairs, %u processes, %u MiB: Gloo (plaintext) and ours, in turn first; "
               "median of %d rounds each, seconds\n", n, procs, mib, runs);
        printf("%4s %10s", "pair", "gloo");
        for (unsigned k = 0; k < N_MODES; k++)
                if (mode_wanted(k, only, true))
                        printf(" %10s %7s", modes[k].column, "ratio");
        printf("\n");
        for (int i = 0; i < n; i++) {
                double g = NAN, t[N_MODES];
                if (i % 2 == 0 && isnan(g = gloo_once(python, procs, mib)))
                        return -EIO;
                for (unsigned k = 0; k < N_MODES; k++) {
                        Experiment e;
                        if (!mode_wanted(k, only, true))
                                continue;
                        single_ring(&e, procs, (size_t)mib << 18, modes[k].cipher);
                        e.payload = modes[k].payload;
                        if (isnan(t[k] = run_experiment(&e)))
                                return -EIO;
                }
                if (i % 2 == 1 && isnan(g = gloo_once(python, procs, mib)))
                        return -EIO;
                printf("%4d %10.4f", i + 1, g);
                for (unsigned k = 0; k < N_MODES; k++)
                        if (mode_wanted(k, only, true)) {
                                ratios[k][i] = g / t[k];
                                wins[k] += g >= t[k];
                                printf(" %10.4f %6.2fx", t[k], g / t[k]);
                        }
                printf("\n");
                fflush(stdout);
        }
        printf("median of the %d ratios (Gloo's time over ours, above 1 is faster), pairs at least 1, "
               "95 %% confidence interval of the median:\n", n);
        for (unsigned k = 0; k < N_MODES; k++)
                if (mode_wanted(k, only, true)) {
                        double lo, hi, m = bench_median(ratios[k], n);
                        printf("  %-10s %5.2fx  %d of %d", modes[k].column, m, wins[k], n);
                        if (bench_median_ci(ratios[k], n, &lo, &hi))
                                printf("  %.2f-%.2fx", lo, hi);
                        printf("\n");
                }
        printf("peak RSS of a member: %.0f MiB\n", peak_rss_mib);
        return 0;
}

/* The exit status of a table: 1 if a measurement of ours failed. */
static int finish(void) {
        if (any_failed)
                fprintf(stderr, "bench-allreduce: a measurement failed (nan above); its members said why\n");
        return any_failed;
}

static void usage(FILE *f) {
        fprintf(f, "Usage: bench-allreduce [--runs N] [--no-reference] [--python PATH] [--procs N] [--mib N] "
                   "[--piece BYTES] [--netns MBIT] [--only plain|aes|aegis|f16|i8] [--lanes 1|2|4] [--pairs N]\n"
                   "Ring all-reduce of ravnest against Gloo (PyTorch) and OpenMPI, the references.\n"
                   "  --runs N        timed rounds per measurement (median; default 5, at most 32)\n"
                   "  --no-reference  ours only\n"
                   "  --python PATH   the Python with torch for Gloo (default /usr/bin/python3)\n"
                   "  --procs N, --mib N  one row of the table (4 and 64 with --pairs)\n"
                   "  --piece BYTES   values per piece (default 1 MiB less the piece header)\n"
                   "  --only MODE     one of the modes\n"
                   "  --lanes 1|2|4   the AEGIS of the aegis column\n"
                   "  --pairs N       Gloo and ours in turn N times: the median of the ratios, how many\n"
                   "                  at least 1, and a 95 %% confidence interval of the median\n"
                   "  --netns MBIT    the multi-ring comparison over links of MBIT (root)\n");
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "runs", required_argument, NULL, 'r' },
                { "no-reference", no_argument, NULL, 'n' },
                { "python", required_argument, NULL, 'p' },
                { "procs", required_argument, NULL, 'P' },
                { "mib", required_argument, NULL, 'm' },
                { "piece", required_argument, NULL, 'b' },
                { "netns", required_argument, NULL, 'N' },
                { "only", required_argument, NULL, 'o' },
                { "lanes", required_argument, NULL, 'l' },
                { "pairs", required_argument, NULL, 'x' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *python = "/usr/bin/python3";
        bool reference = true;
        unsigned only_procs = 0, only_mib = 0;
        const char *only = NULL;
        unsigned sizes[] = { 1, 16, 64 }, procs[] = { 2, 4 };
        int o, pairs = 0;

        long long v = 0;
        while ((o = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
                int r = 0;
                switch (o) {
                case 'r': r = option_int("runs", optarg, 1, MAX_RUNS, &v); runs = (int)v; break;
                case 'n': reference = false; break;
                case 'p': python = optarg; break;
                case 'P': r = option_int("procs", optarg, 2, 64, &v); only_procs = (unsigned)v; break;
                case 'm': r = option_int("mib", optarg, 1, 4096, &v); only_mib = (unsigned)v; break;
                case 'b': r = option_int("piece", optarg, 1, 1 << 30, &v); piece_bytes = (size_t)v; break;
                case 'N': r = option_int("netns", optarg, 1, 100000, &v); netns_mbit = (unsigned)v; break;
                case 'x': r = option_int("pairs", optarg, 1, MAX_RUNS, &v); pairs = (int)v; break;
                case 'o':
                        only = optarg;
                        if (strcmp(only, "plain") && strcmp(only, "aes") && strcmp(only, "aegis") && strcmp(only, "f16") &&
                            strcmp(only, "i8")) {
                                fprintf(stderr, "%s: --only: \"%s\" is none of plain, aes, aegis, f16, i8\n", argv[0], only);
                                return EX_USAGE;
                        }
                        break;
                case 'l':
                        r = option_int("lanes", optarg, 1, 4, &v);
                        aegis_lanes = (unsigned)v;
                        if (r == 0 && (v == 3 || !aegis256_available(aegis_lanes))) {
                                fprintf(stderr, "%s: --lanes: this CPU runs no AEGIS of %lld lanes\n", argv[0], v);
                                return EX_USAGE;
                        }
                        break;
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
        signal(SIGPIPE, SIG_IGN); /* a member that died: its table's write fails instead */

        if (netns_mbit) {
                /* Multi-ring where it pays: every node has its own link, so
                 * three rings spread the bytes over four links where one ring
                 * of two replicas puts them all on two. Encrypted: the
                 * plaintext mode is for loopback only. */
                if (netns_up(netns_mbit) < 0) {
                        fprintf(stderr, "bench-allreduce: cannot set up network namespaces (needs root and iproute2)\n");
                        netns_down();
                        return 1;
                }
                printf("Multi-ring in network namespaces, every link %u Mbit/s each way, AES-256-GCM, 64 MiB model, "
                       "seconds per round (median of %d)\n", netns_mbit, runs);
                Experiment e, one = { .procs = 2, .cipher = CIPHER_AES256GCM, .len = (size_t)64 << 18 };
                multi_ring(&e, (size_t)64 << 18, CIPHER_AES256GCM);
                double multi = run_experiment(&e);
                for (unsigned i = 0; i < 2; i++) {
                        one.parts[i][0] = (Part){ .group = 1, .members = { 0, 1 }, .n = 2, .len = one.len };
                        one.n_parts[i] = 1;
                }
                double single = run_experiment(&one);
                printf("  three rings at once %.3f   one ring of 2 replicas, whole vector %.3f   %.2fx\n", multi, single,
                       single / multi);
                printf("peak RSS of a member: %.0f MiB\n", peak_rss_mib);
                netns_down();
                return 0;
        }

        static const Cipher by_lanes[] = { [1] = CIPHER_AEGIS256, [2] = CIPHER_AEGIS256X2, [4] = CIPHER_AEGIS256X4 };
        const uint32_t aegis = CIPHER_BIT(CIPHER_AEGIS256) | CIPHER_BIT(CIPHER_AEGIS256X2) | CIPHER_BIT(CIPHER_AEGIS256X4);
        Cipher chosen = handshake_choose_cipher(cipher_available() & aegis);
        modes[2].cipher = aegis_lanes ? by_lanes[aegis_lanes] : chosen == _CIPHER_MAX ? CIPHER_AEGIS256 : chosen;
        printf("aes: AES-256-GCM; aegis: %s%s\n", cipher_to_string(modes[2].cipher),
               aegis_lanes ? " (--lanes)" : ", the cipher ravnest's handshake chooses on this CPU");
        if (pairs) {
                if (!reference || access(python, X_OK) != 0) {
                        fprintf(stderr, "%s: --pairs needs the Gloo reference (%s, scripts/install-deps --bench)\n",
                                argv[0], python);
                        return EX_USAGE;
                }
                return run_pairs(pairs, python, only_procs ? only_procs : 4, only_mib ? only_mib : 64, only) < 0;
        }

        /* the OpenMPI program is built beside this one */
        char self[4096], mpi[4200] = "";
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
                self[n] = 0;
                *strrchr(self, '/') = 0;
                snprintf(mpi, sizeof mpi, "%s/allreduce-mpi", self);
        }
        FILE *gloo[2] = {}, *ompi[2] = {};
        for (unsigned p = 0; reference && p < 2; p++) {
                char cmd[8192];
                if (only_procs && only_procs != procs[p])
                        continue;
                if (access(python, X_OK) == 0)
                        gloo[p] = run_gloo(python, procs[p], "--mib 1 --mib 16 --mib 64");
                else
                        fprintf(stderr, "bench-allreduce: %s not found: no Gloo reference (scripts/install-deps --bench)\n", python);
                if (access(mpi, X_OK) == 0) {
                        snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe --bind-to none -np %u "
                                 "--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "
                                 "--mca oob_tcp_if_include lo %s --mib 1 --mib 16 --mib 64 --runs %d",
                                 procs[p], mpi, runs);
                        ompi[p] = run_reference(cmd);
                } else
                        fprintf(stderr, "bench-allreduce: %s not built: no OpenMPI reference (libopenmpi-dev)\n", mpi);
        }

        printf("All-reduce (average) of float32 on loopback, median of %d rounds, seconds\n", runs);
        printf("%5s %5s", "procs", "MiB");
        for (unsigned k = 0; k < N_MODES; k++)
                printf(" %10s", modes[k].column);
        printf(" %10s %10s %10s", "gloo", "openmpi", "mpi/ours");
        for (unsigned k = 0; k < N_MODES; k++)
                printf(" %10s", k ? modes[k].name : "ours");
        printf("\n%*s(the last %u columns: gloo / ours in each mode, above 1 is faster)\n", 12, "", N_MODES);
        for (unsigned p = 0; p < 2; p++)
                for (unsigned s = 0; s < 3; s++) {
                        size_t len = (size_t)sizes[s] << 18;
                        double t[N_MODES];
                        if ((only_procs && only_procs != procs[p]) || (only_mib && only_mib != sizes[s]))
                                continue;
                        for (unsigned k = 0; k < N_MODES; k++) {
                                Experiment e;
                                t[k] = NAN;
                                if (!mode_wanted(k, only, false))
                                        continue;
                                single_ring(&e, procs[p], len, modes[k].cipher);
                                e.payload = modes[k].payload;
                                t[k] = run_experiment(&e);
                        }
                        double g = gloo[p] ? reference_line(gloo[p], "gloo", procs[p], sizes[s]) : NAN;
                        double m = ompi[p] ? reference_line(ompi[p], "mpi", procs[p], sizes[s]) : NAN;
                        char r[16];
                        printf("%5u %5u", procs[p], sizes[s]);
                        for (unsigned k = 0; k < N_MODES; k++)
                                printf(" %10.4f", t[k]);
                        ratio(r, sizeof r, m, t[0]);
                        printf(" %10.4f %10.4f %10s", g, m, r);
                        for (unsigned k = 0; k < N_MODES; k++) {
                                ratio(r, sizeof r, g, t[k]);
                                printf(" %10s", r);
                        }
                        printf("\n");
                        fflush(stdout);
                }

        printf("peak RSS of a member: %.0f MiB (its vector, the receive buffers in use at once, and the buffer "
               "of the sums it starts)\n", peak_rss_mib);
        if (only_procs || only_mib || only)
                return finish();
        printf("\nMulti-ring: 2 clusters x 2 stages cut at 50 %% and 30 %%, 64 MiB model, seconds per round\n");
        for (unsigned k = 0; k < 3; k++) {
                Experiment e;
                size_t len = (size_t)64 << 18;
                multi_ring(&e, len, modes[k].cipher);
                double multi = run_experiment(&e);
                Experiment one = { .procs = 2, .cipher = modes[k].cipher, .len = len };
                for (unsigned i = 0; i < 2; i++) {
                        one.parts[i][0] = (Part){ .group = 1, .members = { 0, 1 }, .n = 2, .len = len };
                        one.n_parts[i] = 1;
                }
                double single = run_experiment(&one);
                printf("  %-9s three rings at once %.4f   one ring of 2 replicas, whole vector %.4f   %.2fx\n",
                       k ? modes[k].name : "plaintext", multi, single, single / multi);
        }
        return finish();
}
