/* collective/moshpit-sim.h — Moshpit All-Reduce on a virtual grid, and a pure,
 * seeded simulation of the paper's averaging experiment.
 *
 * Ryabinin, Gorbunov, Plokhotnyuk, Pekhimenko, "Moshpit SGD: Communication-
 * Efficient Decentralized Training on Heterogeneous Unreliable Devices",
 * NeurIPS 2021. Peers sit in the cells of a virtual grid of `dims` dimensions
 * and side `side`; round r averages within the groups of peers that share
 * every coordinate except coordinate r mod dims (Algorithm 1). On a full grid
 * (peers = side^dims, nobody failing) every peer holds the exact average after
 * dims rounds.
 *
 * The grid functions are pure arithmetic that a networked implementation can
 * use as they are: the group key is the DHT key peers meet under, and
 * moshpit_grid_next_coords() is the rule that gives the members of a group
 * their new coordinates once the group has averaged.
 *
 *     MoshpitSimConfig c;
 *     moshpit_sim_config_defaults(&c);      // 900 peers on 32x32, p = 0, 1e-9
 *     c.failure_p = 0.005;
 *     c.seed = 7;
 *     MoshpitSimResult r;
 *     int k = moshpit_simulate(&c, &r);     // r.rounds, r.converged, r.final_variance
 *     if (k < 0)
 *             return k;                     // -EINVAL: bad config; -ENOMEM
 *
 * The experiment protocol, as the paper's own code runs it (yandex-research/
 * moshpit-sgd, averaging_experiments/{averager.py,utils.py,plot_results.ipynb}):
 *   - each peer starts with one value drawn from N(0, 1);
 *   - MoshpitAverager puts the peers on distinct cells drawn uniformly without
 *     replacement (np.random.choice(side^dims, N, replace=False)) and never
 *     moves them: MOSHPIT_PLACEMENT_FIXED;
 *   - in every round each peer independently fails with probability p; a
 *     failed peer keeps its value and its group averages without it;
 *   - "variance" is the population variance (np.var, divide by N) of all N
 *     values, failed peers included; the run stops at the first round after
 *     which it is below the target (1e-9), or after max_rounds (50);
 *   - the published figures are the MEAN of those round counts over 10
 *     restarts, on a 32x32 grid for every N (512, 768, 900, 1024).
 * MOSHPIT_PLACEMENT_REMIX is Algorithm 1 as hivemind runs it instead
 * (hivemind/averaging/key_manager.py, update_key_on_group_assembled): after
 * averaging, the members of a group take distinct new coordinates in the
 * averaged dimension, drawn from a seed the whole group shares, so groups
 * re-mix from round to round.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits that keep every cell index in a uint64_t and every peer index in a
 * uint32_t, and the sampling of new coordinates linear in the side. */
#define MOSHPIT_DIMS_MAX 16u
#define MOSHPIT_SIDE_MAX (UINT32_C(1) << 24)
#define MOSHPIT_PEERS_MAX ((size_t)1 << 24)

/* The paper's convergence threshold on the variance of the peers' values. */
#define MOSHPIT_TARGET_VARIANCE_DEFAULT 1e-9
/* MAX_ITERS of plot_results.ipynb. */
#define MOSHPIT_MAX_ROUNDS_DEFAULT 50u

/* ---- grid geometry ------------------------------------------------------ */

/* A cell is numbered sum_k coords[k] * side^k: coordinate 0 varies fastest. */
typedef struct MoshpitGrid {
        unsigned dims, side;
} MoshpitGrid;

/* side^dims into *ret. -EINVAL: dims not in 1..MOSHPIT_DIMS_MAX, side not in
 * 2..MOSHPIT_SIDE_MAX, or side^dims overflows 64 bits. */
int moshpit_grid_cells(const MoshpitGrid *g, uint64_t *ret);
/* The dimension that round `round` averages along: round mod dims. */
unsigned moshpit_grid_round_dim(const MoshpitGrid *g, uint64_t round);
/* Cell <-> coordinates (dims entries). -EINVAL: cell or a coordinate out of
 * the grid. */
int moshpit_grid_coords(const MoshpitGrid *g, uint64_t cell, unsigned *ret_coords);
int moshpit_grid_cell(const MoshpitGrid *g, const unsigned *coords, uint64_t *ret);
/* The key of a peer's group in round `round`: its cell with the coordinate
 * of the averaged dimension set to 0. Two peers meet in round `round` if and
 * only if their keys are equal. cell < side^dims. */
uint64_t moshpit_grid_group_key(const MoshpitGrid *g, uint64_t cell, uint64_t round);
/* The cell with coordinate `dim` replaced by `coord` (< side). */
uint64_t moshpit_grid_cell_with(const MoshpitGrid *g, uint64_t cell, unsigned dim, unsigned coord);
/* The new coordinates, in the averaged dimension, of the `size` members of a
 * group that has just averaged, member j getting ret_coords[j]. Members are
 * numbered in an order they all agree on (the simulation: ascending peer
 * index). The coordinates are the first `size` values of a random
 * permutation of 0..side-1 drawn from group_seed, a seed all members share
 * (hivemind: rng.sample(range(target_group_size), group_size)[index] with
 * random.Random(group_id)). A group of more than `side` members, possible
 * only after failed peers kept cells that others moved into, reuses the
 * permutation: member j gets its value at j mod side. -EINVAL: side < 2 or
 * above MOSHPIT_SIDE_MAX. */
int moshpit_grid_next_coords(unsigned side, uint64_t group_seed, size_t size, unsigned *ret_coords);
/* The groups of round `round` among n peers in cells[] (active == NULL: all
 * take part; else only those with active[i]). ret_order (n entries) receives
 * the taking-part peers sorted by group key, then by peer index; group i is
 * ret_order[ret_starts[i] .. ret_starts[i + 1]) (ret_starts: n + 1 entries).
 * Returns the number of groups, or -EINVAL (a cell out of the grid, n above
 * MOSHPIT_PEERS_MAX), -ENOMEM. */
int moshpit_grid_groups(const MoshpitGrid *g, uint64_t round, size_t n, const uint64_t *cells, const bool *active,
                        uint32_t *ret_order, size_t *ret_starts);

/* ---- one round of averaging ----------------------------------------------- */

typedef enum MoshpitPlacement {
        /* Distinct random cells, never moved: the paper's averaging experiment. */
        MOSHPIT_PLACEMENT_FIXED,
        /* Algorithm 1 as hivemind runs it: after each round the members of a
         * group take new coordinates from moshpit_grid_next_coords(). */
        MOSHPIT_PLACEMENT_REMIX,
        _MOSHPIT_PLACEMENT_MAX,
        _MOSHPIT_PLACEMENT_INVALID = -1,
} MoshpitPlacement;

/* The peers of an in-memory run, as arrays of n entries the caller owns. */
typedef struct MoshpitPeers {
        size_t n;
        uint64_t *cells;    /* each peer's cell */
        double *values;     /* the scalar each peer averages */
        const bool *active; /* NULL: all take part; else false = fails this round */
} MoshpitPeers;

/* Round `round`: every group of taking-part peers replaces its members'
 * values by the group's mean; failed peers keep theirs. Under
 * MOSHPIT_PLACEMENT_REMIX the members then move to their new coordinates,
 * the group seed mixed from `seed`, `round` and the group key. Returns the
 * number of groups formed, or -EINVAL, -ENOMEM. */
int moshpit_round(const MoshpitGrid *g, MoshpitPlacement placement, uint64_t round, uint64_t seed, MoshpitPeers *p);

/* Population variance (divide by n) and mean of n values, two-pass. */
double moshpit_variance(const double *values, size_t n, double *ret_mean);

/* ---- the averaging experiment ------------------------------------------- */

typedef enum MoshpitValues {
        MOSHPIT_VALUES_NORMAL,  /* N(0, 1), as the paper's experiment */
        MOSHPIT_VALUES_UNIFORM, /* U[0, 1) */
        _MOSHPIT_VALUES_MAX,
        _MOSHPIT_VALUES_INVALID = -1,
} MoshpitValues;

typedef struct MoshpitSimConfig {
        size_t peers;           /* 1..MOSHPIT_PEERS_MAX, at most side^dims */
        MoshpitGrid grid;       /* ignored by moshpit_simulate_allreduce() */
        double failure_p;       /* per peer and round, in [0, 1) */
        double target_variance; /* > 0; converged once the variance is below it */
        unsigned max_rounds;    /* >= 1 */
        uint64_t seed;          /* the same seed gives the same run, bit for bit */
        MoshpitValues values;
        MoshpitPlacement placement;
} MoshpitSimConfig;

typedef struct MoshpitSimResult {
        unsigned rounds;         /* rounds run: to reach the target, else max_rounds */
        bool converged;          /* the variance went below the target */
        double initial_variance; /* before the first round */
        double final_variance;   /* after the last round run */
        double mean_drift;       /* |final mean - initial mean|: rounding only */
        uint64_t failures;       /* peer-rounds lost to failures */
} MoshpitSimResult;

/* 900 peers on 32x32, p = 0, target 1e-9, 50 rounds, seed 0, N(0, 1) values,
 * fixed placement. */
void moshpit_sim_config_defaults(MoshpitSimConfig *c);
/* 0 or -EINVAL, with the checks moshpit_simulate() makes. */
int moshpit_sim_config_check(const MoshpitSimConfig *c);

/* Runs Moshpit All-Reduce rounds from a fresh seeded start until the variance
 * is below the target or max_rounds have run. Returns 0 and fills *ret (left
 * untouched on failure), or -EINVAL (bad config), -ENOMEM. */
int moshpit_simulate(const MoshpitSimConfig *c, MoshpitSimResult *ret);

/* The plain all-reduce baseline under the same failures (AllreduceAverager
 * of the paper's code): each round every peer fails with probability p, as
 * above; if nobody fails, every peer takes the global mean; if anybody fails
 * the collective cannot complete and the round stalls, nobody's value
 * changing. So it takes 1 round without failures and never converges if
 * somebody fails in every round it is tried. The grid is not used. */
int moshpit_simulate_allreduce(const MoshpitSimConfig *c, MoshpitSimResult *ret);

const char *moshpit_placement_to_string(MoshpitPlacement p);
MoshpitPlacement moshpit_placement_from_string(const char *s);
