/* cluster/partition.c */
#include <errno.h>
#include <stdbool.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "partition.h"
#include "util/macro.h"

int partition_costs(const ModelSpec *m, const PartitionParams *p, PartitionCosts *ret, Diag *d) {
        Layer layers[MODEL_MAX_LAYERS];
        int r = model_spec_check(m, layers, d);
        if (r < 0)
                return r;
        if (p->micro_batch < 1 || p->in_flight < 1 || p->optim_floats < 0 || p->stashed < 0)
                return diag_set(d, -EINVAL, "micro-batch, in-flight count and stashed versions must be positive");
        ret->n_layers = m->n_layers;
        ret->traces = p->in_flight + 1;
        bool below = true; /* no layer with parameters yet: no input gradient wanted */
        for (int i = 0; i < m->n_layers; i++) {
                const Layer *l = &layers[i];
                /* parameters, gradients, optimizer state, stashed versions */
                uint64_t params = (uint64_t)l->n_params * 4 * (uint64_t)(2 + p->optim_floats + p->stashed);
                /* each micro-batch in flight keeps this layer's output and saved state */
                uint64_t acts = ((uint64_t)shape_numel(l->out) * 4 + l->saved_bytes) * (uint64_t)p->micro_batch *
                                (uint64_t)p->in_flight;
                /* backward costs twice the forward (input and weight
                 * gradients), but stage_backward() computes no gradient below
                 * the model's lowest layer with parameters, and only the
                 * weight gradient in that layer */
                double times = below ? (l->n_params ? 2 : 1) : 3;
                if (l->n_params)
                        below = false;
                ret->params[i] = l->n_params > 0;
                ret->flops[i] = times * layer_forward_flops(l) * p->micro_batch;
                ret->memory[i] = params + acts;
                ret->scratch[i] = ((uint64_t)l->scratch_floats + (uint64_t)l->scratch_per_sample * (uint64_t)p->micro_batch) *
                                  sizeof(float);
        }
        return 0;
}

static double stage_flops(const PartitionCosts *c, int lo, int hi) {
        double f = 0;
        for (int i = lo; i < hi; i++)
                f += c->flops[i];
        return f;
}

static bool stage_has_params(const PartitionCosts *c, int lo, int hi) {
        for (int i = lo; i < hi; i++)
                if (c->params[i])
                        return true;
        return false;
}

int partition_max_stages(const PartitionCosts *c) {
        int n = 0;
        for (int i = 0; i < c->n_layers; i++)
                n += c->params[i];
        return n;
}

static uint64_t stage_memory(const PartitionCosts *c, int lo, int hi) {
        uint64_t m = 0, scratch = 0;
        for (int i = lo; i < hi; i++) {
                m += c->memory[i];
                scratch = MAX(scratch, c->scratch[i]);
        }
        return m + scratch * (uint64_t)c->traces;
}

double partition_time(const PartitionCosts *c, const PartitionNode *nodes, int n_nodes, const int *bounds) {
        double worst = 0;
        for (int k = 0; k < n_nodes; k++)
                worst = MAX(worst, stage_flops(c, bounds[k], bounds[k + 1]) / (nodes[k].gflops * 1e9));
        return worst;
}

/* best[k][j]: the least slowest-stage time of layers [0, j) on nodes [0, k);
 * with over = true, the least largest memory overflow instead. */
static int solve(const PartitionCosts *c, const PartitionNode *nodes, int n, bool over, int *bounds, double *ret) {
        static double best[65][MODEL_MAX_LAYERS + 1];
        static int from[65][MODEL_MAX_LAYERS + 1];
        int L = c->n_layers;

        for (int k = 0; k <= n; k++)
                for (int j = 0; j <= L; j++)
                        best[k][j] = INFINITY;
        best[0][0] = 0;
        for (int k = 1; k <= n; k++)
                for (int j = k; j <= L - (n - k); j++)
                        for (int i = k - 1; i < j; i++) {
                                if (!isfinite(best[k - 1][i]) || !stage_has_params(c, i, j))
                                        continue;
                                uint64_t mem = stage_memory(c, i, j);
                                double v;
                                if (over)
                                        v = mem > nodes[k - 1].memory ? (double)(mem - nodes[k - 1].memory) : 0;
                                else if (mem > nodes[k - 1].memory)
                                        continue;
                                else
                                        v = stage_flops(c, i, j) / (nodes[k - 1].gflops * 1e9);
                                v = MAX(v, best[k - 1][i]);
                                if (v < best[k][j]) {
                                        best[k][j] = v;
                                        from[k][j] = i;
                                }
                        }
        if (!isfinite(best[n][L]))
                return -ENOSPC;
        bounds[n] = L;
        for (int k = n, j = L; k > 0; k--) {
                j = from[k][j];
                bounds[k - 1] = j;
        }
        *ret = best[n][L];
        return 0;
}

int partition_plan(const PartitionCosts *c, const PartitionNode *nodes, int n_nodes, int *bounds, Diag *d) {
        double v;
        if (n_nodes < 1 || n_nodes > 64)
                return diag_set(d, -EINVAL, "a cluster has 1 to 64 nodes, not %d", n_nodes);
        if (partition_max_stages(c) < n_nodes)
                return diag_set(d, -EINVAL, "%d of the %d layers have parameters, and every stage needs one: "
                                "at most %d stages, not %d", partition_max_stages(c), c->n_layers,
                                partition_max_stages(c), n_nodes);
        for (int k = 0; k < n_nodes; k++)
                if (!(nodes[k].gflops > 0))
                        return diag_set(d, -EINVAL, "node %d has no measured speed", k + 1);
        if (solve(c, nodes, n_nodes, false, bounds, &v) == 0)
                return 0;
        /* Nothing fits: find the cut that overflows least and say where. */
        int b[65];
        if (solve(c, nodes, n_nodes, true, b, &v) < 0)
                return diag_set(d, -ENOSPC, "no cut of the model fits");
        int worst = 0;
        uint64_t need = 0;
        for (int k = 0; k < n_nodes; k++) {
                uint64_t m = stage_memory(c, b[k], b[k + 1]);
                if (m > nodes[k].memory && m - nodes[k].memory > need) {
                        need = m - nodes[k].memory;
                        worst = k;
                }
        }
        return diag_set(d, -ENOSPC,
                        "the model does not fit: even the best cut leaves node %d (layers %d-%d) short of %.1f MiB "
                        "(it needs %.1f MiB, it has %.1f MiB)",
                        worst + 1, b[worst], b[worst + 1] - 1, (double)need / (1 << 20),
                        (double)stage_memory(c, b[worst], b[worst + 1]) / (1 << 20),
                        (double)nodes[worst].memory / (1 << 20));
}
