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
#include "ctl-node.h"
#include "run/gossip-run.h"
#include "conf/job.h"
#include "conf/option.h"

static void usage(FILE *f) {
        fprintf(f,
                "Usage: ravnestctl predict --compute-ms MS --bandwidth MBIT --nodes N (--params P | --job FILE)\n"
                "                          [--compute-sd-ms MS] [--latency-ms MS] [--update-ms MS] [--fp16]\n"
                "                          [--plaintext] [--cpu-gbs GB/S] [--json]\n"
                "       ravnestctl predict [--node] [--socket PATH] [any figure above]   (the local node's figures)\n");
}

int ctl_predict(int argc, char *argv[]) {
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
                { "plaintext", no_argument, NULL, 'P' },
                { "cpu-gbs", required_argument, NULL, 'C' },
                { "json", no_argument, NULL, 'J' },
                { "node", no_argument, NULL, 'N' },
                { "socket", required_argument, NULL, 'S' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        RuntimeModelInput in;
        const char *job_path = NULL, *socket_path = NULL;
        long long n = 0;
        bool json = false, have_params = false, ask_node = false;
        unsigned given = 0; /* bits: the option letters given, for the node's figures */
        int c;

        runtime_model_defaults(&in);
        in.nodes = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
                double *dst = NULL, lo = 0;
                if (c > 0 && c < 128 && strchr("csblnpj", c))
                        given |= 1u << (strchr("csblnpj", c) - "csblnpj");
                switch (c) {
                case 'c': dst = &in.compute_ms; lo = 1e-6; break;
                case 's': dst = &in.compute_sd_ms; break;
                case 'u': dst = &in.update_ms; break;
                case 'b': dst = &in.bandwidth_mbit; lo = 1e-6; break;
                case 'l': dst = &in.latency_ms; break;
                case 'C': dst = &in.cpu_gbyte_s; lo = 1e-6; break;
                case 'n':
                        if (option_int("nodes", optarg, 1, 65536, &n) < 0)
                                return EX_USAGE;
                        in.nodes = (unsigned)n;
                        continue;
                case 'p':
                        if (option_int("params", optarg, 1, 1000000000000LL, &n) < 0)
                                return EX_USAGE;
                        in.params = (size_t)n;
                        have_params = true;
                        continue;
                case 'j': job_path = optarg; continue;
                case 'f': in.fp16 = true; continue;
                case 'P': in.encrypted = false; continue;
                case 'J': json = true; continue;
                case 'N': ask_node = true; continue;
                case 'S': socket_path = optarg; ask_node = true; continue;
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
        if (optind < argc) {
                fprintf(stderr, "predict: unexpected argument \"%s\"\n", argv[optind]);
                usage(stderr);
                return EX_USAGE;
        }
        /* no figures: the swarm this node is in, as it measured it */
        if (ask_node || !(given & 0x75u)) { /* none of compute, bandwidth, nodes, params, job */
                NodeAveraging a;
                _cleanup_(freep) char *where = NULL;
                int r = ctl_node_averaging(socket_path, &a, &where);
                if (r < 0) {
                        fprintf(stderr, "predict: no figures given, and the local node is not reachable (%s): give "
                                "--compute-ms, --bandwidth, --nodes and --params or --job\n", strerror(-r));
                        return EX_UNAVAILABLE;
                }
                if (!a.nodes) {
                        fprintf(stderr, "predict: the node (%s) is not in an averaging group: give the figures\n", where);
                        return EX_UNAVAILABLE;
                }
                if (!(given & 1u << 0))
                        in.compute_ms = a.compute_ms;
                if (!(given & 1u << 1))
                        in.compute_sd_ms = a.compute_sd_ms;
                if (!(given & 1u << 2))
                        in.bandwidth_mbit = a.bandwidth_mbit;
                if (!(given & 1u << 3) && a.bandwidth_mbit > 0)
                        in.latency_ms = a.latency_ms;
                if (!(given & 1u << 4))
                        in.nodes = a.nodes;
                in.cores = a.cores;
                if (!(given & (1u << 5 | 1u << 6))) {
                        in.params = (size_t)a.params;
                        have_params = true;
                }
                if (!json)
                        printf("The node (%s): averaging %s; figures it measured%s\n", where,
                               a.method[0] ? a.method : "(none)", given ? ", and those given" : "");
                if (!(in.compute_ms > 0) || !(in.bandwidth_mbit > 0)) {
                        fprintf(stderr, "predict: the node has not measured its %s yet (gossip and auto members "
                                "measure after their first %d steps): give %s\n",
                                !(in.compute_ms > 0) ? "compute time" : "links", GOSSIP_RUN_PROBE_STEPS,
                                !(in.compute_ms > 0) ? "--compute-ms" : "--bandwidth and --latency-ms");
                        return EX_TEMPFAIL;
                }
        }
        if (job_path && !have_params) {
                Job job;
                Diag d = {};
                if (job_load(job_path, &job, &d) < 0) {
                        fprintf(stderr, "%s\n", d.text);
                        return EX_CONFIG;
                }
                in.params = model_spec_params(&job.model, 0, job.model.n_layers);
        }
        if (!(in.compute_ms > 0) || !(in.bandwidth_mbit > 0) || in.nodes == 0 || in.params == 0) {
                fprintf(stderr, "predict needs --compute-ms, --bandwidth, --nodes and --params or --job\n");
                usage(stderr);
                return EX_USAGE;
        }

        RuntimeModelResult res;
        if (runtime_model_predict(&in, &res) < 0) {
                fprintf(stderr, "predict: these figures cannot be modelled\n");
                return EX_USAGE;
        }
        if (json) {
                printf("{\"nodes\":%u,\"params\":%zu,\"compute_ms\":%g,\"compute_sd_ms\":%g,\"bandwidth_mbit\":%g,"
                       "\"latency_ms\":%g,\"methods\":[",
                       in.nodes, in.params, in.compute_ms, in.compute_sd_ms, in.bandwidth_mbit, in.latency_ms);
                for (int m = 0; m < _RUNTIME_METHOD_MAX; m++) {
                        const RuntimeMethodPrediction *p = &res.method[m];
                        printf("%s{\"method\":\"%s\",\"iter_ms\":%.3f,\"compute_ms\":%.3f,\"comm_ms\":%.3f,"
                               "\"exposed_ms\":%.3f,",
                               m ? "," : "", runtime_model_method_name(m), p->iter_ms, p->compute_ms, p->comm_ms,
                               p->exposed_ms);
                        if (isnan(p->spectral_gap))
                                printf("\"spectral_gap\":null}");
                        else
                                printf("\"spectral_gap\":%.4f}", p->spectral_gap);
                }
                printf("],\"recommended\":\"%s\",\"speedup\":%.3f}\n", runtime_model_method_name(res.recommended),
                       res.speedup);
                return 0;
        }
        printf("%u nodes, %zu parameters (%.1f MiB as %s), compute %.1f ms (sd %.1f), %g Mbit/s, latency %g ms\n\n",
               in.nodes, in.params, in.params * (in.fp16 ? 2.0 : 4.0) / (1 << 20), in.fp16 ? "binary16" : "float32",
               in.compute_ms, in.compute_sd_ms, in.bandwidth_mbit, in.latency_ms);
        printf("%-14s %12s %12s %12s %12s %13s\n", "method", "ms/iteration", "compute", "exchange", "not hidden",
               "spectral gap");
        for (int m = 0; m < _RUNTIME_METHOD_MAX; m++) {
                const RuntimeMethodPrediction *p = &res.method[m];
                char gap[32];
                if (isnan(p->spectral_gap))
                        snprintf(gap, sizeof gap, "-");
                else
                        snprintf(gap, sizeof gap, "%.3f", p->spectral_gap);
                printf("%-14s %12.1f %12.1f %12.1f %12.1f %13s%s\n", runtime_model_method_name(m), p->iter_ms,
                       p->compute_ms, p->comm_ms, p->exposed_ms, gap,
                       (RuntimeMethod)m == res.recommended ? "  <- recommended" : "");
        }
        printf("\nrecommended: %s (%.2fx the iteration rate of all-reduce)\n",
               runtime_model_method_name(res.recommended), res.speedup);
        return 0;
}
