/* cluster/formation.c — the cost model, the exhaustive search, plans and
 * Ravnest's own fitness. The genetic algorithm is in formation-ga.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formation.h"

int formation_model_init(const ModelSpec *spec, const PartitionParams *p, FormationModel *ret, Diag *d) {
        Layer layers[MODEL_MAX_LAYERS];
        FormationModel m = {};
        int r;

        if ((r = model_spec_check(spec, layers, d)) < 0 || (r = partition_costs(spec, p, &m.costs, d)) < 0)
                return r;
        for (int i = 0; i < m.costs.n_layers; i++) {
                m.act_bytes[i] = (double)shape_numel(layers[i].out) * 4.0 * p->micro_batch;
                m.memory += m.costs.memory[i];
        }
        m.micro_batch = p->micro_batch;
        m.in_flight = p->in_flight;
        m.max_stages = MIN(m.costs.n_layers, FORMATION_MAX_STAGES);
        *ret = m;
        return 0;
}

static const Capability *sort_nodes; /* qsort has no context argument */

static int by_speed(const void *a, const void *b) {
        int i = *(const int *)a, j = *(const int *)b;
        double x = sort_nodes[i].gflops, y = sort_nodes[j].gflops;
        return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

static int by_memory(const void *a, const void *b) {
        int i = *(const int *)a, j = *(const int *)b;
        uint64_t x = sort_nodes[i].memory, y = sort_nodes[j].memory;
        return x > y ? -1 : x < y ? 1 : by_speed(a, b);
}

/* The pipeline of nodes order[0..n) cut at b: its seconds per micro-batch
 * (see the header for the model) and the slowest stage and link. */
static double pipeline_time(const FormationModel *m, const Capability *nodes, const int *order, int n,
                            const int *b, double *ret_stage, double *ret_link) {
        double stage = 0, link = 0, cycle = 0;
        for (int k = 0; k < n; k++) {
                const Capability *c = &nodes[order[k]];
                double f = 0;
                for (int i = b[k]; i < b[k + 1]; i++)
                        f += m->costs.flops[i];
                double t = f / (c->gflops * 1e9);
                stage = MAX(stage, t);
                cycle += t;
                if (k + 1 < n) {
                        const Capability *next = &nodes[order[k + 1]];
                        double x = m->act_bytes[b[k + 1] - 1] / MIN(c->bandwidth, next->bandwidth);
                        link = MAX(link, x);
                        /* forward activations and backward gradients */
                        cycle += 2 * x + 2 * (c->latency + next->latency);
                }
        }
        *ret_stage = stage;
        *ret_link = link;
        return MAX(MAX(stage, link), cycle / m->in_flight);
}

double formation_cluster_eval(const FormationModel *m, const Capability *nodes, const int *members, int n,
                              double similarity, FormationCluster *ret) {
        int order[2][FORMATION_MAX_STAGES];
        uint64_t mem = 0;
        double sum = 0, sum2 = 0, best_t = INFINITY;
        int best = -1, bounds[2][FORMATION_MAX_STAGES + 1];
        double stage[2], link[2];

        if (n < 1 || n > m->max_stages)
                return 0;
        for (int k = 0; k < n; k++) {
                const Capability *c = &nodes[members[k]];
                mem = mem + c->memory < mem ? UINT64_MAX : mem + c->memory;
                sum += c->gflops;
                sum2 += c->gflops * c->gflops;
        }
        if (mem < m->memory)
                return 0;

        memcpy(order[0], members, sizeof(int) * (size_t)n);
        memcpy(order[1], members, sizeof(int) * (size_t)n);
        sort_nodes = nodes;
        qsort(order[0], (size_t)n, sizeof(int), by_speed);
        qsort(order[1], (size_t)n, sizeof(int), by_memory);
        for (int o = 0; o < 2; o++) {
                PartitionNode pn[FORMATION_MAX_STAGES];
                if (o == 1 && memcmp(order[0], order[1], sizeof(int) * (size_t)n) == 0)
                        break;
                for (int k = 0; k < n; k++)
                        pn[k] = (PartitionNode){ .gflops = nodes[order[o][k]].gflops,
                                                 .memory = nodes[order[o][k]].memory };
                if (partition_plan(&m->costs, pn, n, bounds[o], NULL) < 0)
                        continue;
                double t = pipeline_time(m, nodes, order[o], n, bounds[o], &stage[o], &link[o]);
                if (t < best_t) {
                        best_t = t;
                        best = o;
                }
        }
        if (best < 0 || !(best_t > 0))
                return 0;

        double mean = sum / n, var = MAX(0.0, sum2 / n - mean * mean);
        double cv = mean > 0 ? sqrt(var) / mean : 0, rate = m->micro_batch / best_t;
        double value = rate * (1 - similarity * MIN(cv, 1.0));
        if (ret) {
                *ret = (FormationCluster){
                        .n_nodes = n,
                        .samples_per_s = rate,
                        .stage_time = stage[best],
                        .link_time = link[best],
                        .spread = cv,
                        .value = value,
                };
                memcpy(ret->nodes, order[best], sizeof(int) * (size_t)n);
                memcpy(ret->bounds, bounds[best], sizeof(int) * (size_t)(n + 1));
        }
        return value;
}

/* Members of each cluster of assign, renumbered 0.. in order of first
 * appearance: idx[start[c] .. start[c + 1]) are cluster c's nodes. */
static int group(int n, const int *assign, int **ret_idx, int **ret_start) {
        _cleanup_(freep) int *map = malloc(sizeof(int) * (size_t)n), *count = calloc((size_t)n + 1, sizeof(int));
        _cleanup_(freep) int *idx = malloc(sizeof(int) * (size_t)n), *start = calloc((size_t)n + 2, sizeof(int));
        int k = 0;

        if (!map || !count || !idx || !start)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                map[i] = -1;
        for (int i = 0; i < n; i++) {
                int a = assign[i];
                if (a < -1 || a >= n)
                        return -EINVAL;
                if (a >= 0 && map[a] < 0)
                        map[a] = k++;
                if (a >= 0)
                        count[map[a]]++;
        }
        for (int c = 0; c < k; c++)
                start[c + 1] = start[c] + count[c];
        memset(count, 0, sizeof(int) * (size_t)n);
        for (int i = 0; i < n; i++)
                if (assign[i] >= 0) {
                        int c = map[assign[i]];
                        idx[start[c] + count[c]++] = i;
                }
        *ret_idx = TAKE_PTR(idx);
        *ret_start = TAKE_PTR(start);
        return k;
}

double formation_fitness(const FormationModel *m, const Capability *nodes, int n, const int *assign,
                         double similarity, int *ret_infeasible) {
        _cleanup_(freep) int *idx = NULL, *start = NULL;
        int k = group(n, assign, &idx, &start), bad = 0;
        double sum = 0;

        if (k < 0)
                return NAN;
        for (int c = 0; c < k; c++) {
                double v = formation_cluster_eval(m, nodes, idx + start[c], start[c + 1] - start[c], similarity, NULL);
                bad += v <= 0;
                sum += v;
        }
        if (ret_infeasible)
                *ret_infeasible = bad;
        return sum;
}

int formation_exhaustive(const FormationModel *m, const Capability *nodes, int n, double similarity,
                         int *ret_assign, double *ret_fitness, Diag *d) {
        if (n < 1 || n > FORMATION_EXHAUSTIVE_MAX)
                return diag_set(d, -EINVAL, "exhaustive search takes 1 to %d nodes, not %d", FORMATION_EXHAUSTIVE_MAX, n);
        size_t full = ((size_t)1 << n) - 1;
        _cleanup_(freep) double *val = calloc(full + 1, sizeof(double)), *best = calloc(full + 1, sizeof(double));
        _cleanup_(freep) uint32_t *choice = calloc(full + 1, sizeof(uint32_t));
        if (!val || !best || !choice)
                return -ENOMEM;

        /* The value of every subset as one cluster... */
        for (size_t s = 1; s <= full; s++) {
                int members[FORMATION_EXHAUSTIVE_MAX], k = 0;
                for (int i = 0; i < n; i++)
                        if (s >> i & 1)
                                members[k++] = i;
                val[s] = formation_cluster_eval(m, nodes, members, k, similarity, NULL);
        }
        /* ...then best[S], the best formation of the nodes in S: its lowest
         * node is a spare, or in some cluster T with the best of S \ T. */
        for (size_t s = 1; s <= full; s++) {
                size_t low = s & -s, rest = s ^ low;
                best[s] = best[rest];
                choice[s] = 0;
                for (size_t t = rest;; t = (t - 1) & rest) {
                        size_t c = t | low;
                        if (val[c] > 0 && val[c] + best[s ^ c] > best[s]) {
                                best[s] = val[c] + best[s ^ c];
                                choice[s] = (uint32_t)c;
                        }
                        if (t == 0)
                                break;
                }
        }
        if (!(best[full] > 0))
                return diag_set(d, -ENOSPC, "no group of these %d nodes can hold the model", n);
        int cluster = 0;
        for (size_t s = full; s;) {
                size_t c = choice[s];
                if (c == 0) {
                        size_t low = s & -s;
                        ret_assign[__builtin_ctzll(low)] = -1;
                        s ^= low;
                        continue;
                }
                for (int i = 0; i < n; i++)
                        if (c >> i & 1)
                                ret_assign[i] = cluster;
                cluster++;
                s ^= c;
        }
        *ret_fitness = best[full];
        return 0;
}

Formation *formation_free(Formation *f) {
        if (f) {
                free(f->cluster_of);
                free(f->clusters);
                free(f);
        }
        return NULL;
}

static int by_rate(const void *a, const void *b) {
        const FormationCluster *x = a, *y = b;
        if (x->samples_per_s != y->samples_per_s)
                return x->samples_per_s > y->samples_per_s ? -1 : 1;
        return (x->nodes[0] > y->nodes[0]) - (x->nodes[0] < y->nodes[0]);
}

int formation_build(const FormationModel *m, const Capability *nodes, int n, const int *assign, double similarity,
                    Formation **ret, Diag *d) {
        _cleanup_(freep) int *idx = NULL, *start = NULL;
        _cleanup_(formation_freep) Formation *f = calloc(1, sizeof *f);
        int k;

        if (!f)
                return -ENOMEM;
        k = group(n, assign, &idx, &start);
        if (k < 0)
                return diag_set(d, k, "bad assignment");
        f->n_nodes = n;
        f->n_clusters = k;
        f->cluster_of = malloc(sizeof(int) * (size_t)MAX(n, 1));
        f->clusters = calloc((size_t)MAX(k, 1), sizeof(FormationCluster));
        if (!f->cluster_of || !f->clusters)
                return -ENOMEM;
        for (int c = 0; c < k; c++) {
                int size = start[c + 1] - start[c];
                if (formation_cluster_eval(m, nodes, idx + start[c], size, similarity, &f->clusters[c]) <= 0)
                        return diag_set(d, -EINVAL, "a cluster of %d nodes (the first is node %d) cannot hold the model",
                                        size, idx[start[c]] + 1);
        }
        qsort(f->clusters, (size_t)k, sizeof *f->clusters, by_rate);
        for (int i = 0; i < n; i++)
                f->cluster_of[i] = -1;
        f->n_spares = n;
        for (int c = 0; c < k; c++) {
                f->fitness += f->clusters[c].value;
                f->samples_per_s += f->clusters[c].samples_per_s;
                for (int j = 0; j < f->clusters[c].n_nodes; j++)
                        f->cluster_of[f->clusters[c].nodes[j]] = c;
                f->n_spares -= f->clusters[c].n_nodes;
        }
        *ret = TAKE_PTR(f);
        return 0;
}

int formation_run(const FormationModel *m, const Capability *nodes, int n, const FormationParams *p,
                  Formation **ret, Diag *d) {
        _cleanup_(freep) int *assign = malloc(sizeof(int) * (size_t)MAX(n, 1));
        _cleanup_(freep) int *greedy = malloc(sizeof(int) * (size_t)MAX(n, 1));
        double sim = formation_similarity(p);
        Formation *f;
        int r;

        if (!assign || !greedy)
                return -ENOMEM;
        /* The greedy seed can miss a cluster the search then finds. */
        bool have_greedy = formation_greedy(m, nodes, n, sim, greedy, NULL) >= 0;
        if ((r = formation_ga(m, nodes, n, p, assign, d)) < 0 || (r = formation_build(m, nodes, n, assign, sim, &f, d)) < 0)
                return r;
        f->greedy_fitness = have_greedy ? formation_fitness(m, nodes, n, greedy, sim, NULL) : 0;
        *ret = f;
        return 0;
}

double formation_ravnest_penalty(const FormationModel *m, const Capability *nodes, int n, const int *assign) {
        _cleanup_(freep) int *idx = NULL, *start = NULL;
        int k = group(n, assign, &idx, &start);
        double L = (double)m->memory / (1 << 20), penalty_l = 0, lo = INFINITY, hi = -INFINITY;

        if (k <= 0)
                return NAN;
        for (int c = 0; c < k; c++) {
                double ram = 0, speed = 0;
                for (int j = start[c]; j < start[c + 1]; j++) {
                        const Capability *x = &nodes[idx[j]];
                        double mib = floor((double)x->memory / (1 << 20)), mbit = x->bandwidth * 8 / 1e6;
                        ram += mib;
                        /* ram // bandwidth: Ravnest's "speed" grows with memory and falls with bandwidth */
                        speed += floor(mib / mbit);
                }
                if (ram <= L)
                        penalty_l += L - ram;
                lo = MIN(lo, speed);
                hi = MAX(hi, speed);
        }
        return 100 * penalty_l + (hi - lo);
}
