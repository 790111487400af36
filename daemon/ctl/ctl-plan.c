/* ctl/ctl-plan.c — ravnestctl plan: clusters for a list of nodes, offline. */
#include "ctl-plan.h"

#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include "cluster/formation.h"
#include "conf/job.h"
#include "conf/nodes-file.h"
#include "conf/option.h"
#include "ctl-common.h"
#include "util/json.h"

static void print_json(const Job *job, const NodesFile *nf, const Formation *f, const FormationModel *fm,
                       double ravnest, double seconds) {
        printf("{\"job\": ");
        json_print_string(stdout, job->name);
        printf(", \"model_memory\": %" PRIu64 ", \"nodes\": %d, \"fitness\": %.6g, \"greedy_fitness\": %.6g, "
               "\"samples_per_s\": %.6g, \"ravnest_penalty\": %.6g, \"seconds\": %.3f, \"clusters\": [",
               fm->memory, f->n_nodes, f->fitness, f->greedy_fitness, f->samples_per_s, ravnest, seconds);
        for (int c = 0; c < f->n_clusters; c++) {
                const FormationCluster *k = &f->clusters[c];
                printf("%s\n  {\"cluster\": %d, \"samples_per_s\": %.6g, \"stage_time\": %.6g, \"link_time\": %.6g, "
                       "\"spread\": %.4f, \"stages\": [",
                       c ? "," : "", c + 1, k->samples_per_s, k->stage_time, k->link_time, k->spread);
                for (int s = 0; s < k->n_nodes; s++) {
                        printf("%s{\"node\": ", s ? ", " : "");
                        json_print_string(stdout, nf->names[k->nodes[s]]);
                        printf(", \"layers\": [%d, %d]}", k->bounds[s], k->bounds[s + 1]);
                }
                printf("]}");
        }
        printf("],\n \"spares\": [");
        for (int i = 0, first = 1; i < f->n_nodes; i++)
                if (f->cluster_of[i] < 0) {
                        printf("%s", first ? "" : ", ");
                        json_print_string(stdout, nf->names[i]);
                        first = 0;
                }
        printf("]}\n");
}

static void print_table(const Job *job, const NodesFile *nf, const Formation *f, const FormationModel *fm,
                        double ravnest, double seconds) {
        printf("job %s: %d layers, %.1f MiB a replica; %d nodes -> %d clusters, %d spares (%.2f s)\n\n", job->name,
               fm->costs.n_layers, (double)fm->memory / (1 << 20), f->n_nodes, f->n_clusters, f->n_spares, seconds);
        printf("%-8s %-6s %-20s %-10s %10s %10s %12s\n", "cluster", "stage", "node", "layers", "GFLOP/s", "MiB",
               "samples/s");
        for (int c = 0; c < f->n_clusters; c++) {
                const FormationCluster *k = &f->clusters[c];
                for (int s = 0; s < k->n_nodes; s++) {
                        const Capability *cap = &nf->caps[k->nodes[s]];
                        char layers[32], rate[32] = "", cluster[16] = "";
                        /* as the logs say them: from 0, both included */
                        snprintf(layers, sizeof layers, "%d-%d", k->bounds[s], k->bounds[s + 1] - 1);
                        if (s == 0) {
                                snprintf(rate, sizeof rate, "%.1f", k->samples_per_s);
                                snprintf(cluster, sizeof cluster, "%d", c + 1);
                        }
                        printf("%-8s %-6d %-20s %-10s %10.1f %10.0f %12s\n", cluster, s + 1,
                               nf->names[k->nodes[s]], layers, cap->gflops, (double)cap->memory / (1 << 20), rate);
                }
        }
        if (f->n_spares) {
                printf("\nspares:");
                for (int i = 0; i < f->n_nodes; i++)
                        if (f->cluster_of[i] < 0)
                                printf(" %s", nf->names[i]);
                printf("\n");
        }
        printf("\npredicted %.1f samples/s in all; fitness %.1f (greedy start %.1f); Ravnest's penalty %.0f\n",
               f->samples_per_s, f->fitness, f->greedy_fitness, ravnest);
}

static void usage(FILE *f) {
        fprintf(f, "Usage: ravnestctl plan NODES_FILE [OPTIONS]\n"
                   "\n"
                   "Form clusters from the nodes listed in NODES_FILE and cut the job's model in each.\n"
                   "\n"
                   "  --job FILE         the job (default %s)\n"
                   "  --json             print the plan as JSON\n"
                   "  --seed N           the genetic algorithm's seed, 0 to %lld (default 1)\n"
                   "  --micro-batch N    samples per micro-batch, 1 to 65536 (default 32)\n"
                   "  --staleness N      micro-batches in flight, 1 to 1024 (default 4)\n"
                   "  --similarity W     weight of the spread of a cluster's speeds, 0 to 1 (default 0.1)\n"
                   "  -h, --help         show this help\n",
                JOBS_DIR "/fashion-mnist-mlp.job", LLONG_MAX);
}

int ctl_plan(int argc, char *argv[]) {
        static const struct option options[] = {
                { "job", required_argument, NULL, 'j' },
                { "json", no_argument, NULL, 'J' },
                { "seed", required_argument, NULL, 's' },
                { "micro-batch", required_argument, NULL, 'm' },
                { "staleness", required_argument, NULL, 't' },
                { "similarity", required_argument, NULL, 'w' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *job_path = JOBS_DIR "/fashion-mnist-mlp.job";
        unsigned long long seed = 1;
        int micro_batch = 32, staleness = 4, c;
        double similarity = 0.1;
        bool json = false;
        long long v = 0;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case 'j': job_path = optarg; break;
                case 'J': json = true; break;
                case 's': r = option_int("seed", optarg, 0, LLONG_MAX, &v); seed = (unsigned long long)v; break;
                case 'm': r = option_int("micro-batch", optarg, 1, 65536, &v); micro_batch = (int)v; break;
                case 't': r = option_int("staleness", optarg, 1, 1024, &v); staleness = (int)v; break;
                case 'w': r = option_double("similarity", optarg, 0, 1, &similarity); break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return EX_USAGE;
                }
                if (r < 0)
                        return EX_USAGE;
        }
        int r = ctl_operands("plan", argc, argv, 1, 1, "NODES_FILE");
        if (r >= 0) {
                usage(stderr);
                return r;
        }

        Job job;
        NodesFile nf = {};
        FormationModel fm;
        Diag d = {};

        if (job_load(job_path, &job, &d) < 0 || nodes_file_load(argv[optind], &nf, &d) < 0)
                return ctl_failure(json, NULL, EX_CONFIG, "%s", d.text);
        PartitionParams pp = { .micro_batch = micro_batch, .in_flight = staleness,
                               .optim_floats = (int)optim_state_floats(job.optim.kind, 1), .stashed = staleness };
        if (formation_model_init(&job.model, &pp, &fm, &d) < 0) {
                nodes_file_free(&nf);
                return ctl_failure(json, NULL, EX_CONFIG, "%s: %s", job_path, d.text);
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        _cleanup_(formation_freep) Formation *f = NULL;
        /* similarity 0 must mean 0 here, not the library's default */
        r = formation_run(&fm, nf.caps, nf.n,
                          &(FormationParams){ .similarity = similarity > 0 ? similarity : -1, .seed = seed }, &f, &d);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (r < 0) {
                nodes_file_free(&nf);
                return ctl_failure(json, NULL, r == -ENOSPC ? EX_DATAERR : EXIT_FAILURE, "%s: no plan: %s",
                                   argv[optind], d.text);
        }
        double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        double ravnest = formation_ravnest_penalty(&fm, nf.caps, nf.n, f->cluster_of);
        if (json)
                print_json(&job, &nf, f, &fm, ravnest, seconds);
        else
                print_table(&job, &nf, f, &fm, ravnest, seconds);
        nodes_file_free(&nf);
        return 0;
}
