/* ctl/ctl-predict.c — see ctl-predict.h. */
#include "ctl-predict.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "collective/runtime-model.h"
#include "ctl-common.h"
#include "ctl-node.h"
#include "run/gossip-run.h"
#include "conf/job.h"
#include "conf/option.h"

static void usage(FILE *f) {
        fprintf(f,
                "Usage: ravnestctl predict --compute-ms MS --bandwidth MBIT --nodes N (--params P | --job FILE)\n"
                "                          [--compute-sd-ms MS] [--latency-ms MS] [--update-ms MS]\n"
                "                          [--payload f32|f16|int8] [--fp16] [--plaintext] [--cpu-gbs GB/S] [--json]\n"
                "       ravnestctl predict [--node] [--socket PATH] [any figure above]   (the local node's figures)\n");
}

/* What the command line said: the figures, and where the others come from. */
typedef struct PredictArgs {
        RuntimeModelInput in;
        const char *job_path, *socket_path;
        bool json, have_params, ask_node;
        unsigned given; /* bits, in the order of GIVEN_LETTERS: the figures given */
} PredictArgs;

#define GIVEN_LETTERS "csblnpj"
#define GIVEN(a, letter) ((a)->given & 1u << (strchr(GIVEN_LETTERS, letter) - GIVEN_LETTERS))

static int parse_payload(const char *s, CollPayload *ret) {
        for (int i = 0; coll_payload_names[i]; i++)
                if (strcmp(s, coll_payload_names[i]) == 0) {
                        *ret = (CollPayload)i;
                        return 0;
                }
        fprintf(stderr, "--payload: unknown value \"%s\" (known: f32, f16, int8)\n", s);
        return -EINVAL;
}

/* The options into a: -1 to go on, else the exit status. */
static int parse_args(int argc, char *argv[], PredictArgs *a) {
        static const struct option opts[] = {
                { "compute-ms", required_argument, NULL, 'c' },
                { "compute-sd-ms", required_argument, NULL, 's' },
                { "update-ms", required_argument, NULL, 'u' },
                { "bandwidth", required_argument, NULL, 'b' },
                { "latency-ms", required_argument, NULL, 'l' },
                { "nodes", required_argument, NULL, 'n' },
                { "params", required_argument, NULL, 'p' },
                { "job", required_argument, NULL, 'j' },
                { "fp16", no_argument, NULL, 'f' },
                { "payload", required_argument, NULL, 'w' },
                { "plaintext", no_argument, NULL, 'P' },
                { "cpu-gbs", required_argument, NULL, 'C' },
                { "json", no_argument, NULL, 'J' },
                { "node", no_argument, NULL, 'N' },
                { "socket", required_argument, NULL, 'S' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        RuntimeModelInput *in = &a->in;
        long long n = 0;
        int c, r;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
                double *dst = NULL, lo = 0;
                if (c > 0 && c < 128 && strchr(GIVEN_LETTERS, c))
                        a->given |= 1u << (strchr(GIVEN_LETTERS, c) - GIVEN_LETTERS);
                switch (c) {
                case 'c': dst = &in->compute_ms; lo = 1e-6; break;
                case 's': dst = &in->compute_sd_ms; break;
                case 'u': dst = &in->update_ms; break;
                case 'b': dst = &in->bandwidth_mbit; lo = 1e-6; break;
                case 'l': dst = &in->latency_ms; break;
                case 'C': dst = &in->cpu_gbyte_s; lo = 1e-6; break;
                case 'n':
                        if (option_int("nodes", optarg, 1, 65536, &n) < 0)
                                return EX_USAGE;
                        in->nodes = (unsigned)n;
                        continue;
                case 'p':
                        if (option_int("params", optarg, 1, 1000000000000LL, &n) < 0)
                                return EX_USAGE;
                        in->params = (size_t)n;
                        a->have_params = true;
                        continue;
                case 'j': a->job_path = optarg; continue;
                case 'f': in->payload = COLL_PAYLOAD_F16; continue;
                case 'w':
                        if (parse_payload(optarg, &in->payload) < 0)
                                return EX_USAGE;
                        continue;
                case 'P': in->encrypted = false; continue;
                case 'J': a->json = true; continue;
                case 'N': a->ask_node = true; continue;
                case 'S': a->socket_path = optarg; a->ask_node = true; continue;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return EX_USAGE;
                }
                const char *name = "?";
                for (const struct option *o = opts; o->name; o++)
                        if (o->val == c)
                                name = o->name;
                if (option_double(name, optarg, lo, 1e12, dst) < 0)
                        return EX_USAGE;
        }
        if ((r = ctl_operands("predict", argc, argv, 0, 0, NULL)) >= 0) {
                usage(stderr);
                return r;
        }
        if (GIVEN(a, 'p') && GIVEN(a, 'j')) {
                fprintf(stderr, "predict: --params and --job both give the model's size: give one\n");
                return EX_USAGE;
        }
        return -1;
}

/* The figures still missing, as options: "--bandwidth and --nodes"; ""
 * when none is. */
static const char *missing_figures(const PredictArgs *a, char *buf, size_t len) {
        const char *need[4];
        size_t n = 0, k = 0;
        if (!(a->in.compute_ms > 0))
                need[n++] = "--compute-ms";
        if (!(a->in.bandwidth_mbit > 0))
                need[n++] = "--bandwidth";
        if (a->in.nodes == 0)
                need[n++] = "--nodes";
        if (a->in.params == 0 && !a->job_path)
                need[n++] = "--params or --job";
        buf[0] = '\0';
        for (size_t i = 0; i < n && k < len; i++)
                k += (size_t)snprintf(buf + k, len - k, "%s%s", i == 0 ? "" : i + 1 < n ? ", " : " and ", need[i]);
        return buf;
}

/* The node could not be reached: which figures are still to give. */
static int node_unreachable(const PredictArgs *a, const NodeAddress *addr, int r) {
        char why[PATH_MAX + 128], missing[128];
        ctl_node_unreachable(addr, r, why, sizeof why);
        if (missing_figures(a, missing, sizeof missing)[0])
                return ctl_failure(a->json, "unreachable", EX_UNAVAILABLE, "predict: the local node is not "
                                   "reachable (%s): give the figures still missing, %s", why, missing);
        return ctl_failure(a->json, "unreachable", EX_UNAVAILABLE, "predict: the local node is not reachable "
                           "(%s); every figure is given: leave out --node and --socket", why);
}

/* The figures not given, from the swarm this node is in, as it measured
 * them: -1 to go on, else the exit status. */
static int figures_from_node(PredictArgs *a) {
        RuntimeModelInput *in = &a->in;
        _cleanup_(freep) char *where = NULL;
        NodeAddress addr;
        NodeAveraging av;
        int r;

        if ((r = ctl_node_locate("predict", a->socket_path, &addr)) >= 0)
                return r;
        if ((r = ctl_node_averaging(&addr, &av, &where)) < 0)
                return node_unreachable(a, &addr, r);
        if (!av.nodes)
                return ctl_failure(a->json, NULL, EX_UNAVAILABLE, "predict: the node (%s) is not in an averaging "
                                   "group: give the figures", where);
        if (!GIVEN(a, 'c'))
                in->compute_ms = av.compute_ms;
        if (!GIVEN(a, 's'))
                in->compute_sd_ms = av.compute_sd_ms;
        if (!GIVEN(a, 'b'))
                in->bandwidth_mbit = av.bandwidth_mbit;
        if (!GIVEN(a, 'l') && av.bandwidth_mbit > 0)
                in->latency_ms = av.latency_ms;
        if (!GIVEN(a, 'n'))
                in->nodes = av.nodes;
        in->cores = av.cores;
        if (!GIVEN(a, 'p') && !GIVEN(a, 'j')) {
                in->params = (size_t)av.params;
                a->have_params = true;
        }
        if (!a->json)
                printf("The node (%s): averaging %s; figures it measured%s\n", where,
                       av.method[0] ? av.method : "(none)", a->given ? ", and those given" : "");
        if (!(in->compute_ms > 0) || !(in->bandwidth_mbit > 0))
                return ctl_failure(a->json, NULL, EX_TEMPFAIL, "predict: the node has not measured its %s yet "
                                   "(gossip and auto members measure after their first %d steps): give %s",
                                   !(in->compute_ms > 0) ? "compute time" : "links", GOSSIP_RUN_PROBE_STEPS,
                                   !(in->compute_ms > 0) ? "--compute-ms" : "--bandwidth and --latency-ms");
        return -1;
}

static void print_json(const RuntimeModelInput *in, const RuntimeModelResult *res) {
        printf("{\"nodes\":%u,\"params\":%zu,\"compute_ms\":%g,\"compute_sd_ms\":%g,\"bandwidth_mbit\":%g,"
               "\"latency_ms\":%g,\"methods\":[",
               in->nodes, in->params, in->compute_ms, in->compute_sd_ms, in->bandwidth_mbit, in->latency_ms);
        for (int m = 0; m < _RUNTIME_METHOD_MAX; m++) {
                const RuntimeMethodPrediction *p = &res->method[m];
                printf("%s{\"method\":\"%s\",\"iter_ms\":%.3f,\"compute_ms\":%.3f,\"comm_ms\":%.3f,"
                       "\"exposed_ms\":%.3f,",
                       m ? "," : "", runtime_model_method_name(m), p->iter_ms, p->compute_ms, p->comm_ms,
                       p->exposed_ms);
                if (isnan(p->spectral_gap))
                        printf("\"spectral_gap\":null}");
                else
                        printf("\"spectral_gap\":%.4f}", p->spectral_gap);
        }
        printf("],\"recommended\":\"%s\",\"speedup\":%.3f}\n", runtime_model_method_name(res->recommended),
               res->speedup);
}

static void print_table(const RuntimeModelInput *in, const RuntimeModelResult *res) {
        printf("%u nodes, %zu parameters (%.1f MiB as %s), compute %.1f ms (sd %.1f), %g Mbit/s, latency %g ms\n\n",
               in->nodes, in->params, (double)coll_payload_size(coll_payload_dtype(in->payload), in->params) / (1 << 20),
               coll_payload_names[in->payload],
               in->compute_ms, in->compute_sd_ms, in->bandwidth_mbit, in->latency_ms);
        printf("%-14s %12s %12s %12s %12s %13s\n", "method", "ms/iteration", "compute", "exchange", "not hidden",
               "spectral gap");
        for (int m = 0; m < _RUNTIME_METHOD_MAX; m++) {
                const RuntimeMethodPrediction *p = &res->method[m];
                char gap[32];
                if (isnan(p->spectral_gap))
                        snprintf(gap, sizeof gap, "-");
                else
                        snprintf(gap, sizeof gap, "%.3f", p->spectral_gap);
                printf("%-14s %12.1f %12.1f %12.1f %12.1f %13s%s\n", runtime_model_method_name(m), p->iter_ms,
                       p->compute_ms, p->comm_ms, p->exposed_ms, gap,
                       (RuntimeMethod)m == res->recommended ? "  <- recommended" : "");
        }
        printf("\nrecommended: %s (%.2fx the iteration rate of all-reduce)\n",
               runtime_model_method_name(res->recommended), res->speedup);
}

int ctl_predict(int argc, char *argv[]) {
        PredictArgs a = {};
        RuntimeModelResult res;
        int r;

        runtime_model_defaults(&a.in);
        a.in.nodes = 0;
        if ((r = parse_args(argc, argv, &a)) >= 0)
                return r;
        /* no figures: the swarm this node is in, as it measured it */
        if ((a.ask_node || !(GIVEN(&a, 'c') || GIVEN(&a, 'b') || GIVEN(&a, 'n') || GIVEN(&a, 'p') || GIVEN(&a, 'j'))) &&
            (r = figures_from_node(&a)) >= 0)
                return r;
        if (a.job_path && !a.have_params) {
                Job job;
                Diag d = {};
                if (job_load(a.job_path, &job, &d) < 0)
                        return ctl_failure(a.json, NULL, EX_CONFIG, "%s", d.text);
                a.in.params = model_spec_params(&job.model, 0, job.model.n_layers);
        }
        char missing[128];
        if (missing_figures(&a, missing, sizeof missing)[0]) {
                fprintf(stderr, "ravnestctl predict: missing figures: give %s\n", missing);
                usage(stderr);
                return EX_USAGE;
        }
        if (runtime_model_predict(&a.in, &res) < 0) {
                fprintf(stderr, "ravnestctl predict: these figures cannot be modelled\n");
                return EX_USAGE;
        }
        if (a.json)
                print_json(&a.in, &res);
        else
                print_table(&a.in, &res);
        return 0;
}
