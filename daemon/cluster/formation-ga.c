/* cluster/formation-ga.c — the greedy seed and the genetic algorithm.
 *
 * Ravnest's reference code (cluster_formation.py and
 * cluster_node_operations/genetic.py of github.com/ravenprotocol/ravnest)
 * encodes a solution as one cluster number per node, draws the first
 * population at random, and breeds it with tournaments of 5, one-point
 * crossover and per-gene mutation for 500 generations of 200. With that
 * encoding a child's clusters are random mixtures of its parents' (cluster 3
 * of one parent has nothing to do with cluster 3 of the other), and a
 * penalty keeps memory feasible only approximately.
 *
 * We learn from it and do otherwise. A solution is a set of clusters, each
 * feasible at all times, and operators work on whole clusters (a grouping
 * genetic algorithm, Falkenauer 1992): crossover copies some clusters of one
 * parent into the other, dissolves the clusters that lost nodes and cannot
 * hold the model any more, and puts their nodes back; mutation dissolves a
 * cluster and its neighbour in speed and puts their nodes back (ruin and
 * recreate); each child is improved by local search (moves and swaps of
 * nodes between clusters of similar speed, and with spares). The fitness is
 * a sum over clusters, so each step re-evaluates only the clusters it
 * touched: that is what makes 10,000 nodes take seconds. The population
 * starts from the greedy solution and noisy variants of it, and evolves in
 * steady state (the child replaces the worst when it is better and not
 * already there). Only util/rng draws random numbers, so a seed gives the
 * same plan on every machine. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formation.h"
#include "util/rng.h"

/* One solution. Slots hold clusters; a slot's members form a doubly linked
 * list through next/prev. Every non-empty slot holds the model. */
typedef struct Ind {
        int *of;           /* n: slot of each node, -1 for a spare */
        int *next, *prev;  /* n */
        int *head, *size;  /* n slots */
        double *val;       /* n slots */
        int *free_slots;   /* stack of unused slots */
        int n_free;
        double fitness;
} Ind;

typedef struct Ctx {
        const FormationModel *m;
        const Capability *nodes;
        int n;
        double sim;
        Rng rng;
        int *by_speed; /* node indices, fastest first */
        int *rank;     /* position of each node in by_speed */
        int *pool;     /* nodes waiting to be placed */
        int n_pool;
        uint8_t *mark; /* n: scratch */
        double *key;   /* n: scratch sort keys */
} Ctx;

static void ind_free(Ind *x) {
        free(x->of); /* one block */
        *x = (Ind){};
}

static int ind_new(int n, Ind *ret) {
        int *block = malloc(sizeof(int) * (size_t)n * 6 + sizeof(double) * (size_t)n);
        if (!block)
                return -ENOMEM;
        Ind x = { .of = block, .next = block + n, .prev = block + 2 * n, .head = block + 3 * n,
                  .size = block + 4 * n, .free_slots = block + 5 * n, .val = (double *)(block + 6 * n) };
        for (int i = 0; i < n; i++) {
                x.of[i] = -1;
                x.size[i] = 0;
                x.head[i] = -1;
                x.val[i] = 0;
                x.free_slots[i] = n - 1 - i;
        }
        x.n_free = n;
        *ret = x;
        return 0;
}

static void ind_copy(int n, Ind *dst, const Ind *src) {
        memcpy(dst->of, src->of, sizeof(int) * (size_t)n * 6 + sizeof(double) * (size_t)n);
        dst->n_free = src->n_free;
        dst->fitness = src->fitness;
}

static int slot_new(Ind *x) {
        return x->free_slots[--x->n_free];
}

static void node_add(Ind *x, int i, int s) {
        x->of[i] = s;
        x->prev[i] = -1;
        x->next[i] = x->head[s];
        if (x->head[s] >= 0)
                x->prev[x->head[s]] = i;
        x->head[s] = i;
        x->size[s]++;
}

/* Unlink i from its slot; an emptied slot goes back on the free stack (its
 * value stays counted until slot_refresh). */
static void node_remove(Ind *x, int i) {
        int s = x->of[i];
        if (s < 0)
                return;
        if (x->prev[i] >= 0)
                x->next[x->prev[i]] = x->next[i];
        else
                x->head[s] = x->next[i];
        if (x->next[i] >= 0)
                x->prev[x->next[i]] = x->prev[i];
        x->of[i] = -1;
        if (--x->size[s] == 0)
                x->free_slots[x->n_free++] = s;
}

/* Members of slot s without `without`, with `with` (each -1 for none). */
static int members(const Ind *x, int s, int without, int with, int *out) {
        int k = 0;
        if (s >= 0)
                for (int i = x->head[s]; i >= 0; i = x->next[i])
                        if (i != without)
                                out[k++] = i;
        if (with >= 0)
                out[k++] = with;
        return k;
}

static double eval_with(const Ctx *c, const Ind *x, int s, int without, int with) {
        int mem[FORMATION_MAX_STAGES + 1];
        if (s >= 0 && x->size[s] + (with >= 0) > c->m->max_stages)
                return 0;
        int k = members(x, s, without, with, mem);
        return formation_cluster_eval(c->m, c->nodes, mem, k, c->sim, NULL);
}

static void slot_refresh(const Ctx *c, Ind *x, int s) {
        x->fitness -= x->val[s];
        x->val[s] = x->size[s] ? eval_with(c, x, s, -1, -1) : 0;
        x->fitness += x->val[s];
}

/* Dissolve slot s: its nodes join the pool. */
static void slot_dissolve(Ctx *c, Ind *x, int s) {
        while (x->head[s] >= 0) {
                int i = x->head[s];
                node_remove(x, i);
                c->pool[c->n_pool++] = i;
        }
        slot_refresh(c, x, s);
}

static bool improves(const Ind *x, double delta) {
        return delta > 1e-12 * MAX(1.0, fabs(x->fitness));
}

/* A node near i in speed: within 16 ranks, or anywhere one time in four. */
static int partner(Ctx *c, int i) {
        if (rng_below(&c->rng, 4) == 0)
                return (int)rng_below(&c->rng, (uint32_t)c->n);
        int r = c->rank[i] + (int)rng_below(&c->rng, 33) - 16;
        r = MAX(0, MIN(c->n - 1, r));
        return c->by_speed[r];
}

/* Move i to slot t (-1: spare, -2: a new cluster of its own) if that raises the fitness. */
static bool try_move(Ctx *c, Ind *x, int i, int t) {
        int s = x->of[i];
        if (s == t || (s < 0 && t == -1))
                return false;
        double vs = s >= 0 ? (x->size[s] == 1 ? 0 : eval_with(c, x, s, i, -1)) : 0;
        if (s >= 0 && x->size[s] > 1 && vs <= 0)
                return false;
        double vt = t >= 0 ? eval_with(c, x, t, -1, i) : t == -2 ? eval_with(c, x, -1, -1, i) : 0;
        if (t != -1 && vt <= 0)
                return false;
        double delta = (s >= 0 ? vs - x->val[s] : 0) + (t >= 0 ? vt - x->val[t] : vt);
        if (!improves(x, delta))
                return false;
        node_remove(x, i);
        if (t == -2)
                t = slot_new(x);
        if (t >= 0) {
                node_add(x, i, t);
                slot_refresh(c, x, t);
        }
        if (s >= 0)
                slot_refresh(c, x, s);
        return true;
}

/* Exchange i and j (one of them may be a spare) if that raises the fitness. */
static bool try_swap(Ctx *c, Ind *x, int i, int j) {
        int s = x->of[i], t = x->of[j];
        if (s == t)
                return false;
        double vs = s >= 0 ? eval_with(c, x, s, i, j) : 0, vt = t >= 0 ? eval_with(c, x, t, j, i) : 0;
        if ((s >= 0 && vs <= 0) || (t >= 0 && vt <= 0))
                return false;
        double delta = (s >= 0 ? vs - x->val[s] : 0) + (t >= 0 ? vt - x->val[t] : 0);
        if (!improves(x, delta))
                return false;
        /* j leaves t first (a slot it empties goes back on the free stack:
         * take it back), joins s, and then i leaves s, which j keeps
         * non-empty, for t */
        node_remove(x, j);
        if (t >= 0 && x->size[t] == 0)
                x->n_free--;
        if (s >= 0)
                node_add(x, j, s);
        node_remove(x, i);
        if (t >= 0)
                node_add(x, i, t);
        if (s >= 0)
                slot_refresh(c, x, s);
        if (t >= 0)
                slot_refresh(c, x, t);
        return true;
}

static void local_search(Ctx *c, Ind *x, long tries) {
        for (long k = 0; k < tries; k++) {
                int i = (int)rng_below(&c->rng, (uint32_t)c->n), j = partner(c, i);
                switch (rng_below(&c->rng, 8)) {
                case 0:
                        try_move(c, x, i, c->nodes[i].memory >= c->m->memory ? -2 : -1);
                        break;
                case 1: case 2: case 3:
                        if (x->of[j] >= 0)
                                try_move(c, x, i, x->of[j]);
                        else
                                try_swap(c, x, i, j);
                        break;
                default:
                        try_swap(c, x, i, j);
                }
        }
}

static int by_key(const void *a, const void *b, void *ctx) {
        const double *key = ctx;
        int i = *(const int *)a, j = *(const int *)b;
        return key[i] > key[j] ? -1 : key[i] < key[j] ? 1 : (i > j) - (i < j);
}

/* Form clusters from the pool in speed order (each closed as soon as it
 * holds the model); nodes that close no cluster stay in the pool. */
static void pool_form(Ctx *c, Ind *x, double noise) {
        int n_left = 0, cur[FORMATION_MAX_STAGES], k = 0;
        uint64_t mem = 0;
        for (int p = 0; p < c->n_pool; p++) {
                int i = c->pool[p];
                c->key[i] = c->nodes[i].gflops * (1 + noise * (rng_uniform(&c->rng) - 0.5));
        }
        qsort_r(c->pool, (size_t)c->n_pool, sizeof(int), by_key, c->key);
        for (int p = 0; p < c->n_pool; p++) {
                cur[k++] = c->pool[p];
                mem += c->nodes[c->pool[p]].memory;
                if (mem < c->m->memory && k < c->m->max_stages)
                        continue;
                /* Enough memory in sum. If no cut fits, one node may be in the
                 * way (too small for the layers its place leaves it): try
                 * without each; else take one more node. */
                int skip = -1;
                if (formation_cluster_eval(c->m, c->nodes, cur, k, c->sim, NULL) <= 0) {
                        double best = 0;
                        for (int q = 0; q < k && k > 1; q++) {
                                int t = cur[q];
                                cur[q] = cur[k - 1];
                                double v = formation_cluster_eval(c->m, c->nodes, cur, k - 1, c->sim, NULL);
                                cur[q] = t;
                                if (v > best) {
                                        best = v;
                                        skip = q;
                                }
                        }
                        if (skip < 0) {
                                if (k == c->m->max_stages) {
                                        /* no stage left: the node with least memory waits */
                                        int w = 0;
                                        for (int q = 1; q < k; q++)
                                                if (c->nodes[cur[q]].memory < c->nodes[cur[w]].memory)
                                                        w = q;
                                        c->pool[n_left++] = cur[w];
                                        mem -= c->nodes[cur[w]].memory;
                                        cur[w] = cur[--k];
                                }
                                continue;
                        }
                        c->pool[n_left++] = cur[skip];
                        cur[skip] = cur[--k];
                }
                int s = slot_new(x);
                for (int q = 0; q < k; q++)
                        node_add(x, cur[q], s);
                slot_refresh(c, x, s);
                k = 0;
                mem = 0;
        }
        for (int q = 0; q < k; q++)
                c->pool[n_left++] = cur[q];
        c->n_pool = n_left;
}

/* Each pool node joins the cluster it raises the fitness most, among those of
 * nodes near it in speed and a few others (all of them for few clusters), or
 * stays a spare. */
static void pool_insert(Ctx *c, Ind *x) {
        for (int p = 0; p < c->n_pool; p++) {
                int i = c->pool[p], best = -1, cand[24], n_cand = 0;
                double best_delta = 0;
                if (c->n <= 24) {
                        for (int j = 0; j < c->n; j++)
                                cand[n_cand++] = x->of[j];
                } else {
                        for (int d = -8; d <= 8; d++) {
                                int r = c->rank[i] + d;
                                if (r >= 0 && r < c->n)
                                        cand[n_cand++] = x->of[c->by_speed[r]];
                        }
                        while (n_cand < 24)
                                cand[n_cand++] = x->of[rng_below(&c->rng, (uint32_t)c->n)];
                }
                for (int q = 0; q < n_cand; q++) {
                        int t = cand[q];
                        if (t < 0 || t == best)
                                continue;
                        double delta = eval_with(c, x, t, -1, i) - x->val[t];
                        if (delta > best_delta) {
                                best_delta = delta;
                                best = t;
                        }
                }
                if (best >= 0 && improves(x, best_delta)) {
                        node_add(x, i, best);
                        slot_refresh(c, x, best);
                }
        }
        c->n_pool = 0;
}

/* Put the pool back, with the spares: form new clusters first, or join
 * existing ones first; form mostly in speed order, sometimes in any order,
 * to reach clusters the speed order never forms. */
static void pool_place(Ctx *c, Ind *x) {
        double noise = rng_below(&c->rng, 4) ? 0 : 4;
        bool form_first = rng_below(&c->rng, 2);
        if (form_first) {
                for (int i = 0; i < c->n; i++)
                        if (x->of[i] < 0)
                                c->mark[i] = 1;
                for (int p = 0; p < c->n_pool; p++)
                        c->mark[c->pool[p]] = 0;
                for (int i = 0; i < c->n; i++)
                        if (c->mark[i]) {
                                c->pool[c->n_pool++] = i;
                                c->mark[i] = 0;
                        }
                pool_form(c, x, noise);
                pool_insert(c, x);
        } else {
                pool_insert(c, x);
                for (int i = 0; i < c->n; i++)
                        if (x->of[i] < 0)
                                c->pool[c->n_pool++] = i;
                pool_form(c, x, noise);
                c->n_pool = 0;
        }
}

/* The greedy solution, with noise 0; with noise > 0, a variant of it. */
static void greedy(Ctx *c, Ind *x, double noise) {
        c->n_pool = 0;
        for (int i = 0; i < c->n; i++)
                c->pool[c->n_pool++] = i;
        pool_form(c, x, noise);
        pool_insert(c, x);
}

static void crossover(Ctx *c, Ind *child, const Ind *a, const Ind *b) {
        ind_copy(c->n, child, a);
        int n_clusters = c->n - b->n_free;
        if (n_clusters == 0)
                return;
        int want = 1 + (int)rng_below(&c->rng, (uint32_t)MIN(16, MAX(1, n_clusters / 2)));
        int taken[16], n_taken = 0;
        for (int tries = 0; tries < 4 * want && n_taken < want; tries++) {
                int s = b->of[rng_below(&c->rng, (uint32_t)c->n)];
                bool dup = s < 0;
                for (int q = 0; q < n_taken && !dup; q++)
                        dup = taken[q] == s;
                if (!dup)
                        taken[n_taken++] = s;
        }
        /* take the nodes of b's clusters out of theirs in the child */
        int damaged[16 * FORMATION_MAX_STAGES], n_damaged = 0;
        for (int q = 0; q < n_taken; q++)
                for (int i = b->head[taken[q]]; i >= 0; i = b->next[i])
                        if (child->of[i] >= 0) {
                                damaged[n_damaged++] = child->of[i];
                                node_remove(child, i);
                        }
        for (int q = 0; q < n_damaged; q++) {
                int s = damaged[q];
                slot_refresh(c, child, s);
                if (child->size[s] && child->val[s] <= 0)
                        slot_dissolve(c, child, s);
        }
        for (int q = 0; q < n_taken; q++) {
                int s = slot_new(child);
                for (int i = b->head[taken[q]]; i >= 0; i = b->next[i]) {
                        /* a pooled node of the child may be one of b's: take it back */
                        node_add(child, i, s);
                }
                slot_refresh(c, child, s);
        }
        /* drop from the pool the nodes that went into b's clusters */
        int k = 0;
        for (int p = 0; p < c->n_pool; p++)
                if (child->of[c->pool[p]] < 0)
                        c->pool[k++] = c->pool[p];
        c->n_pool = k;
}

/* Ruin and recreate: dissolve one to three clusters of similar speed. */
static void mutate(Ctx *c, Ind *x) {
        int i = (int)rng_below(&c->rng, (uint32_t)c->n), k = 1 + (int)rng_below(&c->rng, 3);
        for (int q = 0; q < 4 * k && k > 0; q++, i = partner(c, i))
                if (x->of[i] >= 0) {
                        slot_dissolve(c, x, x->of[i]);
                        k--;
                }
}

static void ctx_free(Ctx *c) {
        free(c->by_speed);
        free(c->rank);
        free(c->pool);
        free(c->mark);
        free(c->key);
}

static int ctx_init(Ctx *c, const FormationModel *m, const Capability *nodes, int n, double sim, uint64_t seed) {
        *c = (Ctx){ .m = m, .nodes = nodes, .n = n, .sim = sim };
        rng_seed(&c->rng, seed, 0x666f726dull /* "form" */);
        c->by_speed = malloc(sizeof(int) * (size_t)n);
        c->rank = malloc(sizeof(int) * (size_t)n);
        c->pool = malloc(sizeof(int) * (size_t)n);
        c->key = malloc(sizeof(double) * (size_t)n);
        c->mark = calloc((size_t)n, 1);
        if (!c->by_speed || !c->rank || !c->pool || !c->key || !c->mark)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                c->by_speed[i] = i;
                c->key[i] = nodes[i].gflops;
        }
        qsort_r(c->by_speed, (size_t)n, sizeof(int), by_key, c->key);
        for (int r = 0; r < n; r++)
                c->rank[c->by_speed[r]] = r;
        return 0;
}

static int check_input(const FormationModel *m, const Capability *nodes, int n, Diag *d) {
        uint64_t total = 0, most = 0, layer = 0;
        if (n < 1 || n > FORMATION_MAX_NODES)
                return diag_set(d, -EINVAL, "a formation takes 1 to %d nodes, not %d", FORMATION_MAX_NODES, n);
        for (int i = 0; i < n; i++) {
                if (!(nodes[i].gflops > 0 && isfinite(nodes[i].gflops)) || !(nodes[i].bandwidth > 0) ||
                    !(nodes[i].latency >= 0))
                        return diag_set(d, -EINVAL, "node %d: speed and bandwidth must be positive, latency not negative",
                                        i + 1);
                total = total + nodes[i].memory < total ? UINT64_MAX : total + nodes[i].memory;
                most = MAX(most, nodes[i].memory);
        }
        for (int l = 0; l < m->costs.n_layers; l++)
                layer = MAX(layer, m->costs.memory[l]);
        if (total < m->memory)
                return diag_set(d, -ENOSPC,
                                "the %d nodes may use %.1f MiB together, and one replica of the model needs %.1f MiB "
                                "(parameters, gradients, optimizer state, stashed versions, activations)",
                                n, (double)total / (1 << 20), (double)m->memory / (1 << 20));
        if (most < layer)
                return diag_set(d, -ENOSPC, "the largest layer needs %.1f MiB and no node has that much (the most is %.1f MiB)",
                                (double)layer / (1 << 20), (double)most / (1 << 20));
        return 0;
}

static void to_assign(const Ind *x, int n, int *ret) {
        memcpy(ret, x->of, sizeof(int) * (size_t)n);
}

int formation_greedy(const FormationModel *m, const Capability *nodes, int n, double similarity, int *ret_assign,
                     Diag *d) {
        Ctx c;
        Ind x = {};
        int r = check_input(m, nodes, n, d);
        if (r < 0)
                return r;
        if ((r = ctx_init(&c, m, nodes, n, similarity, 0)) < 0 || (r = ind_new(n, &x)) < 0)
                goto out;
        greedy(&c, &x, 0);
        if (x.n_free == n)
                r = diag_set(d, -ENOSPC, "no group of the %d nodes can hold the model: at most %d stages, and no "
                                         "cut fits their memory", n, m->max_stages);
        else
                to_assign(&x, n, ret_assign);
out:
        ind_free(&x);
        ctx_free(&c);
        return r;
}

int formation_ga(const FormationModel *m, const Capability *nodes, int n, const FormationParams *p,
                 int *ret_assign, Diag *d) {
        int P = p->population > 0 ? MIN(p->population, 256) : n <= 100 ? 24 : n <= 2000 ? 12 : 8;
        int G = p->generations > 0 ? p->generations : n <= 16 ? 300 : n <= 2000 ? 200 : 80;
        long tries = n <= 16 ? 8L * n : MIN(4L * n, 2000L);
        Ctx c;
        Ind *pop = NULL, child = {};
        int r = check_input(m, nodes, n, d);
        if (r < 0)
                return r;
        if ((r = ctx_init(&c, m, nodes, n, formation_similarity(p), p->seed)) < 0)
                goto out;
        pop = calloc((size_t)P, sizeof(Ind));
        if (!pop || (r = ind_new(n, &child)) < 0) {
                r = -ENOMEM;
                goto out;
        }
        for (int k = 0; k < P; k++) {
                if ((r = ind_new(n, &pop[k])) < 0)
                        goto out;
                /* the greedy solution itself, then variants with more and more noise on the speeds */
                greedy(&c, &pop[k], k == 0 ? 0 : 0.5 * k / P);
                if (k > 0)
                        local_search(&c, &pop[k], tries);
        }
        for (int g = 0; g < G; g++) {
                int a = (int)rng_below(&c.rng, (uint32_t)P), b = (int)rng_below(&c.rng, (uint32_t)P);
                int a2 = (int)rng_below(&c.rng, (uint32_t)P), b2 = (int)rng_below(&c.rng, (uint32_t)P);
                a = pop[a].fitness >= pop[a2].fitness ? a : a2;
                b = pop[b].fitness >= pop[b2].fitness ? b : b2;
                c.n_pool = 0;
                crossover(&c, &child, &pop[a], &pop[b]);
                if (rng_below(&c.rng, 2))
                        mutate(&c, &child);
                pool_place(&c, &child);
                local_search(&c, &child, tries);

                int worst = 0;
                bool dup = false;
                for (int k = 0; k < P; k++) {
                        if (pop[k].fitness < pop[worst].fitness)
                                worst = k;
                        dup |= fabs(pop[k].fitness - child.fitness) <= 1e-12 * MAX(1.0, fabs(child.fitness));
                }
                if (!dup && child.fitness > pop[worst].fitness) {
                        Ind t = pop[worst];
                        pop[worst] = child;
                        child = t;
                }
        }
        int best = 0;
        for (int k = 1; k < P; k++)
                if (pop[k].fitness > pop[best].fitness)
                        best = k;
        if (pop[best].n_free == n) {
                r = diag_set(d, -ENOSPC, "no group of the %d nodes can hold the model: at most %d stages, and no "
                                         "cut fits their memory", n, m->max_stages);
                goto out;
        }
        local_search(&c, &pop[best], 4 * tries);
        to_assign(&pop[best], n, ret_assign);
        r = 0;
out:
        if (pop)
                for (int k = 0; k < P; k++)
                        ind_free(&pop[k]);
        free(pop);
        ind_free(&child);
        ctx_free(&c);
        return r;
}
