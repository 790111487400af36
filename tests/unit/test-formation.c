/* Cluster formation: every plan holds the model, the genetic algorithm is
 * within 2% of the exhaustive optimum on small random sets, the greedy seed
 * is feasible, a seed gives the same plan, too little memory says so, and a
 * bad nodes file names the line. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>

#include "cluster/formation.h"
#include "conf/nodes-file.h"
#include "util/rng.h"

/* 784-1024x3-10 with ReLUs, Adam and 4 stashed versions: about 186 MiB a replica */
static void model(FormationModel *fm) {
        ModelSpec m = { .input = { 784, 1, 1 }, .n_classes = 10 };
        for (int i = 0; i < 3; i++) {
                m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 1024 };
                m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_RELU };
        }
        m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 10 };
        Diag d = {};
        cr_assert_eq(formation_model_init(&m, &(PartitionParams){ .micro_batch = 32, .in_flight = 4, .optim_floats = 2,
                                                                  .stashed = 4 }, fm, &d), 0, "%s", d.text);
}

static void draw(Capability *nodes, int n, uint64_t seed, double mem_lo, double mem_hi) {
        Rng r;
        rng_seed(&r, seed, RNG_STREAM_TEST);
        for (int i = 0; i < n; i++)
                nodes[i] = (Capability){
                        .gflops = 5 * pow(16, rng_uniform(&r)),
                        .memory = (uint64_t)(mem_lo * pow(mem_hi / mem_lo, rng_uniform(&r)) * (1 << 20)),
                        .bandwidth = 10e6 / 8 * pow(100, rng_uniform(&r)),
                        .latency = 1e-4 * pow(200, rng_uniform(&r)),
                };
}

/* Every cluster of assign holds the model: a cut that fits each member. */
static void assert_feasible(const FormationModel *fm, const Capability *nodes, int n, const int *assign) {
        int bad = -1;
        double f = formation_fitness(fm, nodes, n, assign, 0.1, &bad);
        cr_assert_eq(bad, 0, "%d clusters cannot hold the model", bad);
        cr_assert_gt(f, 0);
        Formation *plan = NULL;
        Diag d = {};
        cr_assert_eq(formation_build(fm, nodes, n, assign, 0.1, &plan, &d), 0, "%s", d.text);
        for (int c = 0; c < plan->n_clusters; c++) {
                const FormationCluster *k = &plan->clusters[c];
                cr_assert_eq(k->bounds[0], 0);
                cr_assert_eq(k->bounds[k->n_nodes], fm->costs.n_layers);
                for (int s = 0; s < k->n_nodes; s++) {
                        uint64_t mem = 0;
                        cr_assert_lt(k->bounds[s], k->bounds[s + 1]);
                        for (int l = k->bounds[s]; l < k->bounds[s + 1]; l++)
                                mem += fm->costs.memory[l];
                        cr_assert_leq(mem, nodes[k->nodes[s]].memory, "cluster %d stage %d does not fit", c, s);
                }
        }
        formation_free(plan);
}

Test(formation, ga_near_exhaustive_and_feasible) {
        FormationModel fm;
        model(&fm);
        int compared = 0;
        for (int n = 4; n <= 8; n++)
                for (uint64_t s = 0; s < 6; s++) {
                        Capability nodes[8];
                        int opt[8], ga[8], gr[8];
                        double best;
                        Diag d = {};
                        draw(nodes, n, 100 * (uint64_t)n + s, 24, 192);
                        if (formation_exhaustive(&fm, nodes, n, 0.1, opt, &best, &d) < 0)
                                continue;
                        cr_assert_eq(formation_ga(&fm, nodes, n, &(FormationParams){ .seed = s }, ga, &d), 0, "%s", d.text);
                        assert_feasible(&fm, nodes, n, ga);
                        assert_feasible(&fm, nodes, n, opt);
                        double f = formation_fitness(&fm, nodes, n, ga, 0.1, NULL);
                        cr_assert_geq(f, 0.98 * best, "n=%d seed %d: GA %g, optimum %g", n, (int)s, f, best);
                        cr_assert_leq(f, best * (1 + 1e-9), "nothing beats the optimum");
                        if (formation_greedy(&fm, nodes, n, 0.1, gr, &d) == 0)
                                assert_feasible(&fm, nodes, n, gr);
                        compared++;
                }
        cr_assert_gt(compared, 15, "too few feasible random sets (%d)", compared);
}

Test(formation, large_sets_feasible_and_better_than_greedy) {
        FormationModel fm;
        model(&fm);
        enum { N = 400 };
        static Capability nodes[N];
        static int gr[N];
        Diag d = {};
        draw(nodes, N, 42, 24, 192);
        cr_assert_eq(formation_greedy(&fm, nodes, N, 0.1, gr, &d), 0, "%s", d.text);
        assert_feasible(&fm, nodes, N, gr);
        Formation *f = NULL;
        cr_assert_eq(formation_run(&fm, nodes, N, &(FormationParams){ .seed = 3, .generations = 40 }, &f, &d), 0, "%s", d.text);
        assert_feasible(&fm, nodes, N, f->cluster_of);
        cr_assert_geq(f->fitness, f->greedy_fitness, "the GA starts from the greedy solution and keeps the best");
        cr_assert_eq(f->n_nodes, N);
        int placed = f->n_spares;
        for (int c = 0; c < f->n_clusters; c++)
                placed += f->clusters[c].n_nodes;
        cr_assert_eq(placed, N, "every node is in one cluster or a spare");
        formation_free(f);
}

/* The scale a swarm of donated machines reaches: every node in one cluster
 * or a spare, every cluster feasible, no worse than the greedy start. */
Test(formation, ten_thousand_nodes) {
        FormationModel fm;
        model(&fm);
        enum { N = 10000 };
        static Capability nodes[N];
        Diag d = {};
        draw(nodes, N, 10000, 24, 192);
        _cleanup_(formation_freep) Formation *f = NULL;
        cr_assert_eq(formation_run(&fm, nodes, N, &(FormationParams){ .similarity = 0.1, .seed = 1 }, &f, &d), 0,
                     "%s", d.text);
        assert_feasible(&fm, nodes, N, f->cluster_of);
        cr_assert_geq(f->fitness, f->greedy_fitness);
        int placed = f->n_spares;
        for (int c = 0; c < f->n_clusters; c++)
                placed += f->clusters[c].n_nodes;
        cr_assert_eq(placed, N, "every node is in one cluster or a spare");
        cr_assert_gt(f->n_clusters, 100);
}

Test(formation, deterministic_per_seed) {
        FormationModel fm;
        model(&fm);
        enum { N = 60 };
        Capability nodes[N];
        int a[N], b[N], c[N];
        Diag d = {};
        draw(nodes, N, 7, 24, 192);
        cr_assert_eq(formation_ga(&fm, nodes, N, &(FormationParams){ .seed = 11 }, a, &d), 0, "%s", d.text);
        cr_assert_eq(formation_ga(&fm, nodes, N, &(FormationParams){ .seed = 11 }, b, &d), 0, "%s", d.text);
        cr_assert_eq(memcmp(a, b, sizeof a), 0, "same seed, same plan");
        cr_assert_eq(formation_ga(&fm, nodes, N, &(FormationParams){ .seed = 12 }, c, &d), 0, "%s", d.text);
        assert_feasible(&fm, nodes, N, c);
}

Test(formation, too_little_memory) {
        FormationModel fm;
        model(&fm);
        Capability nodes[4];
        int assign[4];
        Diag d = {};
        for (int i = 0; i < 4; i++)
                nodes[i] = (Capability){ .gflops = 10, .memory = fm.memory / 8, .bandwidth = 1e8, .latency = 1e-3 };
        cr_assert_eq(formation_ga(&fm, nodes, 4, &(FormationParams){ .seed = 1 }, assign, &d), -ENOSPC);
        cr_assert(strstr(d.text, "MiB together") && strstr(d.text, "needs"), "%s", d.text);
        Formation *f = NULL;
        cr_assert_eq(formation_run(&fm, nodes, 4, &(FormationParams){ .seed = 1 }, &f, &d), -ENOSPC);
        cr_assert_null(f);
        /* enough in sum, but a layer is larger than any node */
        for (int i = 0; i < 4; i++)
                nodes[i].memory = fm.memory / 3;
        uint64_t largest = 0;
        for (int l = 0; l < fm.costs.n_layers; l++)
                largest = MAX(largest, fm.costs.memory[l]);
        if (largest > fm.memory / 3) {
                cr_assert_eq(formation_ga(&fm, nodes, 4, &(FormationParams){ .seed = 1 }, assign, &d), -ENOSPC);
                cr_assert(strstr(d.text, "largest layer"), "%s", d.text);
        }
}

Test(formation, cluster_model) {
        FormationModel fm;
        model(&fm);
        /* one node that holds the model: no links, the rate is its compute */
        Capability one = { .gflops = 50, .memory = 1ull << 32, .bandwidth = 1e8, .latency = 1e-3 };
        FormationCluster k;
        int m0 = 0;
        double v = formation_cluster_eval(&fm, &one, &m0, 1, 0.1, &k);
        double flops = 0;
        for (int l = 0; l < fm.costs.n_layers; l++)
                flops += fm.costs.flops[l];
        cr_assert_float_eq(k.samples_per_s, 32 / (flops / 50e9), 1e-6 * k.samples_per_s);
        cr_assert_float_eq(v, k.samples_per_s, 1e-9 * v, "one node: no spread");
        /* a slower link makes a two-node cluster slower */
        Capability two[2] = { { 50, fm.memory, 1e9, 1e-4 }, { 50, fm.memory, 1e9, 1e-4 } };
        int m[2] = { 0, 1 };
        double fast = formation_cluster_eval(&fm, two, m, 2, 0, NULL);
        two[1].bandwidth = 1e5;
        double slow = formation_cluster_eval(&fm, two, m, 2, 0, NULL);
        cr_assert_gt(fast, slow);
        /* Ravnest's penalty: a cluster short of memory costs 100 per MiB */
        int assign[2] = { 0, -1 };
        two[0].memory = fm.memory - (10u << 20);
        two[0].bandwidth = 1e12;
        double p = formation_ravnest_penalty(&fm, two, 2, assign);
        cr_assert(p >= 100 * 9.0 && p <= 100 * 11.0, "penalty %g", p);
}

static void write_file(const char *path, const char *text) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fputs(text, f);
        fclose(f);
}

Test(formation, nodes_file) {
        char path[] = "/tmp/test-formation-XXXXXX";
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        close(fd);
        NodesFile nf = {};
        Diag d = {};

        write_file(path, "nodes = (\n"
                         "  { name = \"a\"; gflops = 80.0; memory = \"2G\"; bandwidth = 1000.0; latency = 0.5; },\n"
                         "  { name = \"b\"; gflops = 20; memory = 536870912; bandwidth = 100.0; }\n"
                         ");\n");
        cr_assert_eq(nodes_file_load(path, &nf, &d), 0, "%s", d.text);
        cr_assert_eq(nf.n, 2);
        cr_assert_str_eq(nf.names[1], "b");
        cr_assert_eq(nf.caps[0].memory, 2ull << 30);
        cr_assert_float_eq(nf.caps[0].bandwidth, 125e6, 1);
        cr_assert_float_eq(nf.caps[0].latency, 5e-4, 1e-12);
        cr_assert_eq(nf.caps[1].memory, 512ull << 20);
        nodes_file_free(&nf);

        struct {
                const char *text, *want;
        } bad[] = {
                { "nodes = (\n  { name = \"a\"; gflops = 1.0; memory = \"2G\"; bandwidth = 1.0; },\n"
                  "  { name = \"b\"; gflops = -3.0; memory = \"2G\"; bandwidth = 1.0; }\n);\n",
                  ":3: nodes.[1].gflops: must be a number" },
                { "nodes = (\n  { name = \"a\"; gflops = 1.0;\n    memory = \"lots\"; bandwidth = 1.0; }\n);\n",
                  ":3: nodes.[0].memory: must be bytes" },
                { "nodes = (\n  { name = \"a\"; gflops = 1.0; memory = \"2G\"; bandwidth = 1.0; },\n"
                  "  { name = \"a\"; gflops = 1.0; memory = \"2G\"; bandwidth = 1.0; }\n);\n",
                  ":3: nodes.[1].name: \"a\" names another node too" },
                { "nodes = (\n  { name = \"a\"; gflops = 1.0; memory = \"2G\"; bandwith = 1.0; }\n);\n",
                  ":2: nodes.[0].bandwith: unknown setting" },
                { "nodes = (\n  { name = \"a\"; gflops = 1.0; memory = \"2G\"; }\n);\n",
                  ":2: nodes.[0].bandwidth: missing" },
                { "nodes = (\n  { name = \"a\"; gflops = 1.0 memory = \"2G\"; }\n);\n", ":2: " },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                write_file(path, bad[i].text);
                d = (Diag){};
                cr_assert_lt(nodes_file_load(path, &nf, &d), 0, "case %zu loaded", i);
                cr_assert(strstr(d.text, bad[i].want) && strstr(d.text, path), "case %zu: %s", i, d.text);
        }
        uint64_t v;
        cr_assert_eq(nodes_file_parse_size("1.5G", &v), 0);
        cr_assert_eq(v, 3ull << 29);
        cr_assert_eq(nodes_file_parse_size("-1G", &v), -EINVAL);
        cr_assert_eq(nodes_file_parse_size("99999999999T", &v), -ERANGE);
        unlink(path);
}
