/* Cutting a model into stages: the cut is the best of all cuts (held against
 * brute force), follows node speed, respects memory, and an impossible fit
 * says which node lacks how much. */
#include <criterion/criterion.h>
#include <math.h>

#include "cluster/partition.h"

/* 784-1024-1024-1024-10 with ReLUs: 8 layers */
static void mlp(ModelSpec *m) {
        memset(m, 0, sizeof *m);
        m->input = (Shape){ 784, 1, 1 };
        m->n_classes = 10;
        int outs[] = { 1024, 0, 1024, 0, 1024, 0, 10 };
        for (int i = 0; i < 7; i++)
                m->layers[m->n_layers++] = outs[i] ? (LayerSpec){ .kind = LAYER_LINEAR, .out = outs[i] }
                                                  : (LayerSpec){ .kind = LAYER_RELU };
}

static const PartitionParams params = { .micro_batch = 32, .in_flight = 4, .optim_floats = 1, .stashed = 4 };

/* Every cut of L layers into n stages, the best slowest-stage time among
 * those that fit and give every stage a layer with parameters. */
static double brute(const PartitionCosts *c, const PartitionNode *nodes, int n, int k, int lo, int *b) {
        if (k == n - 1) {
                b[k] = lo;
                b[n] = c->n_layers;
                uint64_t mem = 0;
                for (int i = lo; i < c->n_layers; i++)
                        mem += c->memory[i];
                if (lo >= c->n_layers || mem > nodes[k].memory)
                        return INFINITY;
                for (int s = 0; s < n; s++) {
                        uint64_t ms = 0;
                        bool holds = false;
                        for (int i = b[s]; i < b[s + 1]; i++) {
                                ms += c->memory[i];
                                holds |= c->params[i];
                        }
                        if (ms > nodes[s].memory || !holds)
                                return INFINITY;
                }
                return partition_time(c, nodes, n, b);
        }
        double best = INFINITY;
        for (int e = lo + 1; e < c->n_layers; e++) {
                b[k] = lo;
                b[k + 1] = e;
                best = fmin(best, brute(c, nodes, n, k + 1, e, b));
        }
        return best;
}

Test(partition, optimal_against_brute_force) {
        ModelSpec m;
        PartitionCosts c;
        Diag d = {};
        mlp(&m);
        cr_assert_eq(partition_costs(&m, &params, &c, &d), 0, "%s", d.text);
        cr_assert_eq(c.n_layers, 7);
        double speeds[][4] = { { 10, 10, 10, 10 }, { 40, 10, 10, 10 }, { 5, 50, 20, 1 }, { 1, 1, 100, 1 } };
        for (int n = 1; n <= 4; n++)
                for (int s = 0; s < 4; s++) {
                        PartitionNode nodes[4];
                        for (int k = 0; k < 4; k++)
                                nodes[k] = (PartitionNode){ .gflops = speeds[s][k], .memory = 1ull << 34 };
                        int b[5], bb[5];
                        cr_assert_eq(partition_plan(&c, nodes, n, b, &d), 0, "%s", d.text);
                        cr_assert(b[0] == 0 && b[n] == 7);
                        for (int k = 0; k < n; k++)
                                cr_assert_lt(b[k], b[k + 1]);
                        double got = partition_time(&c, nodes, n, b), want = brute(&c, nodes, n, 0, 0, bb);
                        cr_assert(fabs(got - want) <= 1e-12 * want, "n=%d speeds %d: %g vs brute force %g", n, s, got, want);
                }
}

Test(partition, faster_node_gets_more_work) {
        ModelSpec m;
        PartitionCosts c;
        Diag d = {};
        mlp(&m);
        partition_costs(&m, &params, &c, &d);
        PartitionNode equal[2] = { { 10, 1ull << 34 }, { 10, 1ull << 34 } }, skew[2] = { { 30, 1ull << 34 }, { 10, 1ull << 34 } };
        int be[3], bs[3];
        cr_assert_eq(partition_plan(&c, equal, 2, be, &d), 0);
        cr_assert_eq(partition_plan(&c, skew, 2, bs, &d), 0);
        cr_assert_gt(bs[1], be[1], "the 3x faster first node takes more layers: %d vs %d", bs[1], be[1]);
        /* the equal split of Ravnest's reference code is slower on skewed nodes */
        int half[3] = { 0, 3, 7 };
        cr_assert_lt(partition_time(&c, skew, 2, bs), partition_time(&c, skew, 2, half));
}

Test(partition, memory_bounds_the_cut) {
        ModelSpec m;
        PartitionCosts c;
        Diag d = {};
        mlp(&m);
        partition_costs(&m, &params, &c, &d);
        uint64_t total = 0;
        for (int i = 0; i < c.n_layers; i++)
                total += c.memory[i];
        /* the fast node has little memory: it must take a small stage */
        PartitionNode nodes[2] = { { 100, c.memory[0] + c.memory[1] }, { 1, 1ull << 34 } };
        int b[3];
        cr_assert_eq(partition_plan(&c, nodes, 2, b, &d), 0, "%s", d.text);
        cr_assert_eq(b[1], 2, "the first node holds what fits: layers 0-1, got %d", b[1]);
        /* nothing fits: the message names the node and the shortfall */
        PartitionNode tiny[2] = { { 10, total / 4 }, { 10, total / 4 } };
        cr_assert_eq(partition_plan(&c, tiny, 2, b, &d), -ENOSPC);
        cr_assert(strstr(d.text, "short of") && strstr(d.text, "MiB") && strstr(d.text, "node "), "%s", d.text);
        cr_assert_eq(partition_plan(&c, tiny, 8, b, &d), -EINVAL, "more stages than layers");
}

/* A stage without parameters has nothing to average, and its node refuses
 * it: every stage holds a layer with parameters, and a model has at most as
 * many stages as such layers (ravnestctl swarm --stages 4 of the shipped
 * MLP cut "0-1 2-2 3-3 4-5", and each node refused its plan). */
Test(partition, every_stage_holds_parameters) {
        /* flatten, linear, relu, linear, relu, linear: 3 with parameters */
        ModelSpec m = { .input = { 1, 28, 28 }, .n_classes = 10 };
        m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_FLATTEN };
        for (int i = 0; i < 3; i++) {
                m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_LINEAR, .out = i < 2 ? 1024 : 10 };
                if (i < 2)
                        m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_RELU };
        }
        PartitionCosts c;
        Diag d = {};
        cr_assert_eq(partition_costs(&m, &params, &c, &d), 0, "%s", d.text);
        cr_assert_eq(partition_max_stages(&c), 3);
        PartitionNode nodes[4] = { { 10, 1ull << 34 }, { 10, 1ull << 34 }, { 10, 1ull << 34 }, { 10, 1ull << 34 } };
        int b[5];
        cr_assert_eq(partition_plan(&c, nodes, 4, b, &d), -EINVAL);
        cr_assert(strstr(d.text, "at most 3 stages"), "%s", d.text);
        /* and whatever the speeds, when there are as many stages as such layers */
        PartitionNode skew[3] = { { 1, 1ull << 34 }, { 1000, 1ull << 34 }, { 1, 1ull << 34 } };
        for (int n = 1; n <= 3; n++)
                for (int k = 0; k < 2; k++) {
                        cr_assert_eq(partition_plan(&c, k ? skew : nodes, n, b, &d), 0, "%s", d.text);
                        for (int s = 0; s < n; s++)
                                cr_assert_gt(model_spec_params(&m, b[s], b[s + 1]), 0, "n=%d: stage %d is layers %d-%d",
                                             n, s + 1, b[s], b[s + 1] - 1);
                }
}

/* A GPT's blocks need work space for their backward pass, shared by the
 * layers of a stage and held by each of its traces: a node that has room
 * for the layers alone does not have room for the stage. */
Test(partition, a_stage_counts_its_traces_work_space) {
        ModelSpec m = { .input = { 64, 1, 1 }, .n_classes = 256, .lm = true };
        m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_EMBED, .vocab = 256, .out = 128 };
        for (int i = 0; i < 4; i++)
                m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_BLOCK, .heads = 4 };
        m.layers[m.n_layers++] = (LayerSpec){ .kind = LAYER_LM_HEAD, .out = 256 };
        PartitionCosts c;
        Diag d = {};
        cr_assert_eq(partition_costs(&m, &params, &c, &d), 0, "%s", d.text);
        uint64_t layers = 0, scratch = 0;
        for (int i = 0; i < c.n_layers; i++) {
                layers += c.memory[i];
                scratch = MAX(scratch, c.scratch[i]);
        }
        cr_assert_gt(scratch, 0, "a block's backward needs work space");
        cr_assert_eq(c.traces, params.in_flight + 1);
        int b[2];
        PartitionNode tight = { .gflops = 10, .memory = layers };
        cr_assert_lt(partition_plan(&c, &tight, 1, b, &d), 0, "the layers alone fit, the stage does not");
        PartitionNode room = { .gflops = 10, .memory = layers + scratch * (uint64_t)c.traces };
        cr_assert_eq(partition_plan(&c, &room, 1, b, &d), 0, "%s", d.text);
}
