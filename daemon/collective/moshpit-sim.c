/* collective/moshpit-sim.c — Moshpit All-Reduce grid rules and the averaging
 * experiment of Ryabinin et al., "Moshpit SGD", NeurIPS 2021 (see the header
 * for the protocol and where it comes from). */
#include "moshpit-sim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/macro.h"
#include "util/rng.h"

/* Independent streams of one seed, so that drawing failures never changes the
 * initial values or the placement. */
#define STREAM_VALUES UINT64_C(0x4d50000000000001)
#define STREAM_PLACEMENT UINT64_C(0x4d50000000000002)
#define STREAM_FAILURES UINT64_C(0x4d50000000000003)
#define STREAM_GROUPS UINT64_C(0x4d50000000000004)
#define STREAM_NEXT_COORDS UINT64_C(0x4d50000000000005)

static const char *const placement_names[_MOSHPIT_PLACEMENT_MAX] = {
        [MOSHPIT_PLACEMENT_FIXED] = "fixed",
        [MOSHPIT_PLACEMENT_REMIX] = "remix",
};

DEFINE_STRING_TABLE_LOOKUP(moshpit_placement, MoshpitPlacement, placement_names, _MOSHPIT_PLACEMENT_MAX,
                           _MOSHPIT_PLACEMENT_INVALID)

/* splitmix64's finalizer: spreads a key over all 64 bits before it seeds a
 * generator or indexes a hash table. */
static uint64_t mix64(uint64_t z) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

/* Uniform in [0, n), n > 0, without modulo bias: reject the lowest
 * 2^64 mod n outputs. */
static uint64_t below64(Rng *r, uint64_t n) {
        uint64_t threshold = -n % n;
        for (;;) {
                uint64_t x = rng_next(r);
                if (x >= threshold)
                        return x % n;
        }
}

/* Uniform in [0, 1) with 53 bits, so that p = 0.001 is resolved exactly
 * enough (rng_uniform() has 24). */
static double uniform53(Rng *r) {
        return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- grid geometry ------------------------------------------------------ */

int moshpit_grid_cells(const MoshpitGrid *g, uint64_t *ret) {
        if (!g || g->dims < 1 || g->dims > MOSHPIT_DIMS_MAX || g->side < 2 || g->side > MOSHPIT_SIDE_MAX)
                return -EINVAL;
        uint64_t cells = 1;
        for (unsigned k = 0; k < g->dims; k++)
                if (__builtin_mul_overflow(cells, (uint64_t)g->side, &cells))
                        return -EINVAL;
        if (ret)
                *ret = cells;
        return 0;
}

unsigned moshpit_grid_round_dim(const MoshpitGrid *g, uint64_t round) {
        return (unsigned)(round % g->dims);
}

/* side^dim; never overflows for a grid that moshpit_grid_cells() accepted. */
static uint64_t grid_stride(const MoshpitGrid *g, unsigned dim) {
        uint64_t s = 1;
        for (unsigned k = 0; k < dim; k++)
                s *= g->side;
        return s;
}

int moshpit_grid_coords(const MoshpitGrid *g, uint64_t cell, unsigned *ret_coords) {
        uint64_t cells;
        int r = moshpit_grid_cells(g, &cells);
        if (r < 0)
                return r;
        if (cell >= cells || !ret_coords)
                return -EINVAL;
        for (unsigned k = 0; k < g->dims; k++) {
                ret_coords[k] = (unsigned)(cell % g->side);
                cell /= g->side;
        }
        return 0;
}

int moshpit_grid_cell(const MoshpitGrid *g, const unsigned *coords, uint64_t *ret) {
        int r = moshpit_grid_cells(g, NULL);
        if (r < 0)
                return r;
        if (!coords || !ret)
                return -EINVAL;
        uint64_t cell = 0;
        for (unsigned k = g->dims; k-- > 0;) {
                if (coords[k] >= g->side)
                        return -EINVAL;
                cell = cell * g->side + coords[k];
        }
        *ret = cell;
        return 0;
}

static uint64_t key_in(uint64_t cell, uint64_t stride, unsigned side) {
        return cell - (cell / stride % side) * stride;
}

uint64_t moshpit_grid_group_key(const MoshpitGrid *g, uint64_t cell, uint64_t round) {
        return key_in(cell, grid_stride(g, moshpit_grid_round_dim(g, round)), g->side);
}

uint64_t moshpit_grid_cell_with(const MoshpitGrid *g, uint64_t cell, unsigned dim, unsigned coord) {
        uint64_t stride = grid_stride(g, dim);
        return key_in(cell, stride, g->side) + (uint64_t)coord * stride;
}

int moshpit_grid_next_coords(unsigned side, uint64_t group_seed, size_t size, unsigned *ret_coords) {
        if (side < 2 || side > MOSHPIT_SIDE_MAX)
                return -EINVAL;
        if (size == 0)
                return 0;
        if (!ret_coords)
                return -EINVAL;

        Rng r;
        rng_seed(&r, group_seed, STREAM_NEXT_COORDS);
        size_t m = MIN(size, (size_t)side);

        if (m * m <= side) {
                /* A small group on a long side: draw one by one, redrawing a
                 * value already taken; O(m^2), which is at most O(side). The
                 * j-th draw is uniform over the values left, so the result is
                 * a uniform injection of the members into 0..side-1. */
                for (size_t j = 0; j < m; j++) {
                        unsigned v;
                        bool taken;
                        do {
                                v = rng_below(&r, side);
                                taken = false;
                                for (size_t i = 0; i < j && !taken; i++)
                                        taken = ret_coords[i] == v;
                        } while (taken);
                        ret_coords[j] = v;
                }
        } else {
                /* Selection sampling (Knuth, TAOCP vol. 2, 3.4.2, Algorithm S):
                 * value t is taken with probability (m - chosen) / (side - t),
                 * giving a uniform m-subset in ascending order in O(side); a
                 * Fisher-Yates shuffle then deals it to the members. */
                size_t chosen = 0;
                for (unsigned t = 0; chosen < m; t++)
                        if (rng_below(&r, side - t) < m - chosen)
                                ret_coords[chosen++] = t;
                for (size_t i = m - 1; i > 0; i--) {
                        size_t j = rng_below(&r, (uint32_t)(i + 1));
                        unsigned tmp = ret_coords[i];
                        ret_coords[i] = ret_coords[j];
                        ret_coords[j] = tmp;
                }
        }
        for (size_t j = m; j < size; j++)
                ret_coords[j] = ret_coords[j % side];
        return 0;
}

typedef struct KeyPeer {
        uint64_t key;
        uint32_t peer;
} KeyPeer;

static int key_peer_compare(const void *a, const void *b) {
        const KeyPeer *x = a, *y = b;
        if (x->key != y->key)
                return x->key < y->key ? -1 : 1;
        return x->peer < y->peer ? -1 : x->peer > y->peer;
}

int moshpit_grid_groups(const MoshpitGrid *g, uint64_t round, size_t n, const uint64_t *cells, const bool *active,
                        uint32_t *ret_order, size_t *ret_starts) {
        uint64_t n_cells;
        int r = moshpit_grid_cells(g, &n_cells);
        if (r < 0)
                return r;
        if (n > MOSHPIT_PEERS_MAX || (n > 0 && (!cells || !ret_order)) || !ret_starts)
                return -EINVAL;

        _cleanup_(freep) KeyPeer *kp = malloc(MAX(n, (size_t)1) * sizeof *kp);
        if (!kp)
                return -ENOMEM;

        uint64_t stride = grid_stride(g, moshpit_grid_round_dim(g, round));
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
                if (active && !active[i])
                        continue;
                if (cells[i] >= n_cells)
                        return -EINVAL;
                kp[m++] = (KeyPeer){ key_in(cells[i], stride, g->side), (uint32_t)i };
        }
        qsort(kp, m, sizeof *kp, key_peer_compare);

        size_t groups = 0;
        for (size_t j = 0; j < m; j++) {
                if (j == 0 || kp[j].key != kp[j - 1].key)
                        ret_starts[groups++] = j;
                ret_order[j] = kp[j].peer;
        }
        ret_starts[groups] = m;
        return (int)groups;
}

/* ---- one round of averaging ----------------------------------------------- */

int moshpit_round(const MoshpitGrid *g, MoshpitPlacement placement, uint64_t round, uint64_t seed, MoshpitPeers *p) {
        if (!p || placement < 0 || placement >= _MOSHPIT_PLACEMENT_MAX)
                return -EINVAL;
        int r = moshpit_grid_cells(g, NULL);
        if (r < 0)
                return r;
        size_t n = p->n;
        if (n > MOSHPIT_PEERS_MAX || (n > 0 && (!p->cells || !p->values)))
                return -EINVAL;

        _cleanup_(freep) uint32_t *order = malloc(MAX(n, (size_t)1) * sizeof *order);
        _cleanup_(freep) size_t *starts = malloc((n + 1) * sizeof *starts);
        _cleanup_(freep) unsigned *coords = NULL;
        if (!order || !starts)
                return -ENOMEM;
        if (placement == MOSHPIT_PLACEMENT_REMIX) {
                coords = malloc(MAX(n, (size_t)1) * sizeof *coords);
                if (!coords)
                        return -ENOMEM;
        }

        int groups = moshpit_grid_groups(g, round, n, p->cells, p->active, order, starts);
        if (groups < 0)
                return groups;

        uint64_t stride = grid_stride(g, moshpit_grid_round_dim(g, round));
        for (int i = 0; i < groups; i++) {
                size_t lo = starts[i], hi = starts[i + 1];

                /* All-reduce inside the group: every member ends with the
                 * group's mean (Algorithm 1, the AllReduce step). */
                long double sum = 0;
                for (size_t j = lo; j < hi; j++)
                        sum += p->values[order[j]];
                double mean = (double)(sum / (long double)(hi - lo));
                for (size_t j = lo; j < hi; j++)
                        p->values[order[j]] = mean;

                if (placement != MOSHPIT_PLACEMENT_REMIX)
                        continue;
                /* Algorithm 1: after the all-reduce a peer's index takes its
                 * chunk index in the group as the coordinate of the averaged
                 * dimension. As in hivemind, the slot is spread over the whole
                 * side by a permutation the group shares; the bare index
                 * 0..size-1 would pack a partly filled grid into its low
                 * coordinates (N = 512 on 32x32: 8.6 rounds at p = 0 and 11.6
                 * at p = 0.01, against 6.8 and 7.3 spread). */
                uint64_t key = key_in(p->cells[order[lo]], stride, g->side);
                uint64_t group_seed = mix64(seed ^ STREAM_GROUPS) ^ mix64(round + 0x9e3779b97f4a7c15ULL) ^
                                      mix64(key ^ 0xd1b54a32d192ed03ULL);
                r = moshpit_grid_next_coords(g->side, group_seed, hi - lo, coords);
                if (r < 0)
                        return r;
                for (size_t j = lo; j < hi; j++)
                        p->cells[order[j]] = key + (uint64_t)coords[j - lo] * stride;
        }
        return groups;
}

double moshpit_variance(const double *values, size_t n, double *ret_mean) {
        if (n == 0) {
                if (ret_mean)
                        *ret_mean = 0;
                return 0;
        }
        long double sum = 0;
        for (size_t i = 0; i < n; i++)
                sum += values[i];
        long double mean = sum / (long double)n, sq = 0;
        for (size_t i = 0; i < n; i++) {
                long double d = values[i] - mean;
                sq += d * d;
        }
        if (ret_mean)
                *ret_mean = (double)mean;
        return (double)(sq / (long double)n);
}

/* ---- the averaging experiment ------------------------------------------- */

void moshpit_sim_config_defaults(MoshpitSimConfig *c) {
        *c = (MoshpitSimConfig){
                .peers = 900,
                .grid = { .dims = 2, .side = 32 },
                .failure_p = 0,
                .target_variance = MOSHPIT_TARGET_VARIANCE_DEFAULT,
                .max_rounds = MOSHPIT_MAX_ROUNDS_DEFAULT,
                .seed = 0,
                .values = MOSHPIT_VALUES_NORMAL,
                .placement = MOSHPIT_PLACEMENT_FIXED,
        };
}

/* What both simulations need; the grid is checked by the caller that uses it. */
static int config_check_common(const MoshpitSimConfig *c) {
        if (!c || c->peers < 1 || c->peers > MOSHPIT_PEERS_MAX)
                return -EINVAL;
        if (!(c->failure_p >= 0 && c->failure_p < 1)) /* also rejects NaN */
                return -EINVAL;
        if (!(c->target_variance > 0) || !isfinite(c->target_variance))
                return -EINVAL;
        if (c->max_rounds < 1)
                return -EINVAL;
        if (c->values < 0 || c->values >= _MOSHPIT_VALUES_MAX)
                return -EINVAL;
        return 0;
}

int moshpit_sim_config_check(const MoshpitSimConfig *c) {
        int r = config_check_common(c);
        if (r < 0)
                return r;
        uint64_t cells;
        r = moshpit_grid_cells(&c->grid, &cells);
        if (r < 0)
                return r;
        if (cells < c->peers)
                return -EINVAL;
        if (c->placement < 0 || c->placement >= _MOSHPIT_PLACEMENT_MAX)
                return -EINVAL;
        return 0;
}

static void values_init(const MoshpitSimConfig *c, double *values) {
        Rng r;
        rng_seed(&r, c->seed, STREAM_VALUES);
        for (size_t i = 0; i < c->peers; i++)
                values[i] = c->values == MOSHPIT_VALUES_NORMAL ? rng_normal(&r) : uniform53(&r);
}

/* n distinct cells out of `cells`, uniformly, in random order: the paper's
 * np.random.choice(cells, n, replace=False). */
static int placement_init(uint64_t seed, uint64_t cells, size_t n, uint64_t *ret) {
        Rng r;
        rng_seed(&r, seed, STREAM_PLACEMENT);

        if (cells / 4 <= n) {
                /* Dense: selection sampling over all cells (Algorithm S),
                 * O(cells) = O(n), then a Fisher-Yates shuffle. */
                size_t chosen = 0;
                for (uint64_t t = 0; chosen < n; t++)
                        if (below64(&r, cells - t) < n - chosen)
                                ret[chosen++] = t;
                for (size_t i = n - 1; i > 0; i--) {
                        size_t j = (size_t)below64(&r, i + 1);
                        uint64_t tmp = ret[i];
                        ret[i] = ret[j];
                        ret[j] = tmp;
                }
                return 0;
        }

        /* Sparse (under a quarter full): redraw taken cells, remembered in an
         * open-addressing set of at least 2n slots; fewer than 4/3 draws per
         * peer on average. */
        size_t slots = 2;
        while (slots < 2 * n)
                slots *= 2;
        _cleanup_(freep) uint64_t *set = malloc(slots * sizeof *set);
        if (!set)
                return -ENOMEM;
        memset(set, 0xff, slots * sizeof *set); /* UINT64_MAX: empty; never a cell */
        for (size_t i = 0; i < n;) {
                uint64_t v = below64(&r, cells);
                size_t h = (size_t)mix64(v) & (slots - 1);
                while (set[h] != UINT64_MAX && set[h] != v)
                        h = (h + 1) & (slots - 1);
                if (set[h] == v)
                        continue;
                set[h] = v;
                ret[i++] = v;
        }
        return 0;
}

/* Draws this round's failures; returns how many peers failed. */
static size_t failures_draw(Rng *r, double p, size_t n, bool *active) {
        size_t failed = 0;
        for (size_t i = 0; i < n; i++) {
                active[i] = p == 0 || uniform53(r) >= p;
                failed += !active[i];
        }
        return failed;
}

int moshpit_simulate(const MoshpitSimConfig *c, MoshpitSimResult *ret) {
        int r = moshpit_sim_config_check(c);
        if (r < 0)
                return r;
        if (!ret)
                return -EINVAL;
        uint64_t cells;
        r = moshpit_grid_cells(&c->grid, &cells);
        if (r < 0)
                return r;

        size_t n = c->peers;
        _cleanup_(freep) double *values = malloc(n * sizeof *values);
        _cleanup_(freep) uint64_t *cell = malloc(n * sizeof *cell);
        _cleanup_(freep) bool *active = malloc(n * sizeof *active);
        if (!values || !cell || !active)
                return -ENOMEM;

        values_init(c, values);
        r = placement_init(c->seed, cells, n, cell);
        if (r < 0)
                return r;

        Rng fr;
        rng_seed(&fr, c->seed, STREAM_FAILURES);
        MoshpitPeers peers = { .n = n, .cells = cell, .values = values, .active = active };
        MoshpitSimResult res = { 0 };
        double mean0, mean;
        res.initial_variance = res.final_variance = moshpit_variance(values, n, &mean0);
        mean = mean0;

        /* utils.py, run_iterative_averaging: loop while the variance is at or
         * above the target. The paper numbers rounds from 1 and averages along
         * axis (round mod dims); we start at dimension 0, the same up to a
         * relabelling of the axes, which random placement does not see. */
        while (res.rounds < c->max_rounds && !(res.final_variance < c->target_variance)) {
                res.failures += failures_draw(&fr, c->failure_p, n, active);
                r = moshpit_round(&c->grid, c->placement, res.rounds, c->seed, &peers);
                if (r < 0)
                        return r;
                res.rounds++;
                res.final_variance = moshpit_variance(values, n, &mean);
        }
        res.converged = res.final_variance < c->target_variance;
        res.mean_drift = fabs(mean - mean0);
        *ret = res;
        return 0;
}

int moshpit_simulate_allreduce(const MoshpitSimConfig *c, MoshpitSimResult *ret) {
        int r = config_check_common(c);
        if (r < 0)
                return r;
        if (!ret)
                return -EINVAL;

        size_t n = c->peers;
        _cleanup_(freep) double *values = malloc(n * sizeof *values);
        _cleanup_(freep) bool *active = malloc(n * sizeof *active);
        if (!values || !active)
                return -ENOMEM;
        values_init(c, values);

        Rng fr;
        rng_seed(&fr, c->seed, STREAM_FAILURES);
        MoshpitSimResult res = { 0 };
        double mean0, mean;
        res.initial_variance = res.final_variance = moshpit_variance(values, n, &mean0);
        mean = mean0;

        while (res.rounds < c->max_rounds && !(res.final_variance < c->target_variance)) {
                size_t failed = failures_draw(&fr, c->failure_p, n, active);
                res.failures += failed;
                res.rounds++;
                if (failed > 0)
                        continue; /* a member is missing: the collective stalls */
                for (size_t i = 0; i < n; i++)
                        values[i] = mean;
                res.final_variance = moshpit_variance(values, n, &mean);
        }
        res.converged = res.final_variance < c->target_variance;
        res.mean_drift = fabs(mean - mean0);
        *ret = res;
        return 0;
}
