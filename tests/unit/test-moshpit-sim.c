/* Moshpit All-Reduce: grid rules against brute force, exactness on a full
 * grid, failure semantics, determinism, config checks, and the averaging
 * experiment against the figures the paper published. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "collective/moshpit-sim.h"
#include "util/rng.h"

static long double exact_mean(const double *v, size_t n) {
        long double s = 0;
        for (size_t i = 0; i < n; i++)
                s += v[i];
        return s / (long double)n;
}

static double max_deviation(const double *v, size_t n, long double mean) {
        long double worst = 0;
        for (size_t i = 0; i < n; i++)
                worst = fmaxl(worst, fabsl(v[i] - mean));
        return (double)worst;
}

Test(moshpit_sim, grid_cell_coords_roundtrip) {
        MoshpitGrid g = { 3, 5 };
        uint64_t cells;
        cr_assert_eq(moshpit_grid_cells(&g, &cells), 0);
        cr_assert_eq(cells, 125);
        for (uint64_t c = 0; c < cells; c++) {
                unsigned x[3];
                uint64_t back;
                cr_assert_eq(moshpit_grid_coords(&g, c, x), 0);
                /* coordinate 0 varies fastest */
                cr_assert_eq(x[0], c % 5);
                cr_assert_eq(x[1], c / 5 % 5);
                cr_assert_eq(x[2], c / 25);
                cr_assert_eq(moshpit_grid_cell(&g, x, &back), 0);
                cr_assert_eq(back, c);
                for (uint64_t round = 0; round < 6; round++) {
                        unsigned dim = moshpit_grid_round_dim(&g, round), y[3];
                        cr_assert_eq(dim, round % 3);
                        uint64_t key = moshpit_grid_group_key(&g, c, round);
                        cr_assert_eq(moshpit_grid_coords(&g, key, y), 0);
                        for (unsigned k = 0; k < 3; k++)
                                cr_assert_eq(y[k], k == dim ? 0u : x[k]);
                        uint64_t moved = moshpit_grid_cell_with(&g, c, dim, 4);
                        cr_assert_eq(moshpit_grid_coords(&g, moved, y), 0);
                        for (unsigned k = 0; k < 3; k++)
                                cr_assert_eq(y[k], k == dim ? 4u : x[k]);
                }
        }
        unsigned bad[3] = { 0, 5, 0 }, out[3];
        uint64_t cell;
        cr_assert_eq(moshpit_grid_cell(&g, bad, &cell), -EINVAL);
        cr_assert_eq(moshpit_grid_coords(&g, 125, out), -EINVAL);
}

Test(moshpit_sim, grid_rejects_bad_geometry) {
        uint64_t cells;
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ 0, 4 }, &cells), -EINVAL);
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ 2, 1 }, &cells), -EINVAL);
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ MOSHPIT_DIMS_MAX + 1, 2 }, &cells), -EINVAL);
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ 2, MOSHPIT_SIDE_MAX + 1 }, &cells), -EINVAL);
        /* (2^20)^4 = 2^80 */
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ 4, 1u << 20 }, &cells), -EINVAL);
        /* (2^16)^4 = 2^64 overflows by one; 2^16 cubed does not */
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ 4, 1u << 16 }, &cells), -EINVAL);
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ 3, 1u << 16 }, &cells), 0);
        cr_assert_eq(cells, UINT64_C(1) << 48);
        cr_assert_eq(moshpit_grid_cells(&(MoshpitGrid){ MOSHPIT_DIMS_MAX, 2 }, &cells), 0);
        cr_assert_eq(cells, UINT64_C(1) << MOSHPIT_DIMS_MAX);
}

/* Brute force: two peers meet iff their coordinates agree everywhere but in
 * the averaged dimension. */
static bool same_group(const MoshpitGrid *g, uint64_t a, uint64_t b, uint64_t round) {
        unsigned x[MOSHPIT_DIMS_MAX], y[MOSHPIT_DIMS_MAX];
        moshpit_grid_coords(g, a, x);
        moshpit_grid_coords(g, b, y);
        for (unsigned k = 0; k < g->dims; k++)
                if (k != moshpit_grid_round_dim(g, round) && x[k] != y[k])
                        return false;
        return true;
}

Test(moshpit_sim, groups_cover_every_peer_once) {
        enum { N = 150 };
        MoshpitGrid g = { 3, 6 }; /* 216 cells, partly filled */
        uint64_t pool[216], cells[N];
        bool active[N];
        Rng r;
        rng_seed(&r, 42, RNG_STREAM_TEST);
        for (unsigned i = 0; i < 216; i++)
                pool[i] = i;
        for (unsigned i = 0; i < N; i++) {
                unsigned j = i + rng_below(&r, 216 - i);
                uint64_t t = pool[i];
                pool[i] = pool[j];
                pool[j] = t;
                cells[i] = pool[i];
                active[i] = rng_below(&r, 10) != 0; /* about one in ten fails */
        }

        for (uint64_t round = 0; round < 6; round++) {
                uint32_t order[N];
                size_t starts[N + 1];
                unsigned seen[N] = { 0 };
                int groups = moshpit_grid_groups(&g, round, N, cells, active, order, starts);
                cr_assert_gt(groups, 0);
                cr_assert_eq(starts[0], 0);
                size_t taking_part = 0;
                for (unsigned i = 0; i < N; i++)
                        taking_part += active[i];
                cr_assert_eq(starts[groups], taking_part);

                for (int k = 0; k < groups; k++) {
                        cr_assert_lt(starts[k], starts[k + 1], "group %d is empty", k);
                        for (size_t j = starts[k]; j < starts[k + 1]; j++) {
                                uint32_t p = order[j];
                                cr_assert_lt(p, N);
                                cr_assert(active[p], "failed peer %u was put in a group", p);
                                seen[p]++;
                                cr_assert(same_group(&g, cells[p], cells[order[starts[k]]], round));
                        }
                        /* a group is every active peer that belongs with it */
                        size_t members = 0;
                        for (unsigned p = 0; p < N; p++)
                                members += active[p] && same_group(&g, cells[p], cells[order[starts[k]]], round);
                        cr_assert_eq(members, starts[k + 1] - starts[k], "round %llu group %d is split",
                                     (unsigned long long)round, k);
                }
                for (unsigned p = 0; p < N; p++)
                        cr_assert_eq(seen[p], active[p] ? 1u : 0u, "round %llu: peer %u seen %u times",
                                     (unsigned long long)round, p, seen[p]);
        }

        cells[7] = 216; /* out of the grid */
        uint32_t order[N];
        size_t starts[N + 1];
        cr_assert_eq(moshpit_grid_groups(&g, 0, N, cells, NULL, order, starts), -EINVAL);
}

Test(moshpit_sim, next_coords_are_a_seeded_injection) {
        unsigned a[80], b[80]; /* 2 * the largest side below */
        for (unsigned side = 2; side <= 40; side += 19)
                for (size_t size = 1; size <= 2u * side; size++)
                        for (uint64_t seed = 0; seed < 20; seed++) {
                                cr_assert_eq(moshpit_grid_next_coords(side, seed, size, a), 0);
                                cr_assert_eq(moshpit_grid_next_coords(side, seed, size, b), 0);
                                cr_assert_arr_eq(a, b, size * sizeof a[0]);
                                for (size_t j = 0; j < size; j++) {
                                        cr_assert_lt(a[j], side);
                                        for (size_t i = 0; i < j && i < side && j < side; i++)
                                                cr_assert_neq(a[i], a[j], "side %u size %zu: two members at %u",
                                                              side, size, a[j]);
                                        if (j >= side)
                                                cr_assert_eq(a[j], a[j % side]);
                                }
                        }

        /* The long-side path (size^2 <= side) too. */
        unsigned big[5];
        cr_assert_eq(moshpit_grid_next_coords(100000, 9, 5, big), 0);
        for (size_t j = 0; j < 5; j++) {
                cr_assert_lt(big[j], 100000);
                for (size_t i = 0; i < j; i++)
                        cr_assert_neq(big[i], big[j]);
        }

        /* Different groups get different permutations, and a lone member
         * lands anywhere on the side, evenly. */
        cr_assert_eq(moshpit_grid_next_coords(32, 1, 32, a), 0);
        cr_assert_eq(moshpit_grid_next_coords(32, 2, 32, b), 0);
        cr_assert(memcmp(a, b, 32 * sizeof a[0]) != 0);
        unsigned count[8] = { 0 };
        for (uint64_t seed = 0; seed < 8000; seed++) {
                unsigned c;
                moshpit_grid_next_coords(8, seed, 1, &c);
                count[c]++;
        }
        for (unsigned v = 0; v < 8; v++)
                cr_assert(count[v] > 850 && count[v] < 1150, "value %u drawn %u times of 8000", v, count[v]);

        cr_assert_eq(moshpit_grid_next_coords(1, 0, 1, a), -EINVAL);
}

/* On a full grid the exact average is reached after exactly dims rounds, for
 * both placement rules: after round k every peer holds the mean of its
 * (k+1)-dimensional slab, which is not the global mean until k = dims - 1. */
Test(moshpit_sim, full_grid_exact_after_dims_rounds) {
        MoshpitGrid g = { 3, 4 };
        enum { N = 64 };
        for (int pl = 0; pl < _MOSHPIT_PLACEMENT_MAX; pl++) {
                uint64_t cells[N];
                double values[N];
                Rng r;
                rng_seed(&r, 7, RNG_STREAM_TEST);
                for (unsigned i = 0; i < N; i++) {
                        cells[i] = (i * 37u) % N; /* a permutation: every cell once */
                        values[i] = rng_normal(&r) * 3.0 + 1.0;
                }
                long double mean = exact_mean(values, N);
                MoshpitPeers peers = { .n = N, .cells = cells, .values = values };

                for (uint64_t round = 0; round < 3; round++) {
                        int groups = moshpit_round(&g, (MoshpitPlacement)pl, round, 99, &peers);
                        cr_assert_eq(groups, 16, "round %llu formed %d groups", (unsigned long long)round, groups);
                        double dev = max_deviation(values, N, mean);
                        if (round < 2)
                                cr_assert_gt(dev, 1e-3, "%s: exact already after round %llu",
                                             moshpit_placement_to_string(pl), (unsigned long long)round);
                        else
                                cr_assert_lt(dev, 1e-13, "%s: off the exact mean by %g after dims rounds",
                                             moshpit_placement_to_string(pl), dev);
                        /* the grid stays full: every cell held once */
                        bool held[N] = { false };
                        for (unsigned i = 0; i < N; i++) {
                                cr_assert_lt(cells[i], N);
                                cr_assert_not(held[cells[i]], "two peers in cell %llu",
                                              (unsigned long long)cells[i]);
                                held[cells[i]] = true;
                        }
                }
        }

        /* The simulation agrees: 3 rounds to converge, 2 are not enough. */
        MoshpitSimConfig c;
        moshpit_sim_config_defaults(&c);
        c.peers = 64;
        c.grid = g;
        MoshpitSimResult res;
        for (int pl = 0; pl < _MOSHPIT_PLACEMENT_MAX; pl++) {
                c.placement = (MoshpitPlacement)pl;
                c.max_rounds = 50;
                cr_assert_eq(moshpit_simulate(&c, &res), 0);
                cr_assert(res.converged);
                cr_assert_eq(res.rounds, 3);
                cr_assert_lt(res.final_variance, 1e-25);
                cr_assert_gt(res.initial_variance, 0.5);
                c.max_rounds = 2;
                cr_assert_eq(moshpit_simulate(&c, &res), 0);
                cr_assert_not(res.converged);
                cr_assert_eq(res.rounds, 2);
                cr_assert_gt(res.final_variance, 1e-3);
        }
}

Test(moshpit_sim, failed_peers_keep_their_values) {
        MoshpitGrid g = { 2, 3 };
        /* a full 3x3 grid; round 0 averages along dimension 0, i.e. in rows
         * {0,1,2}, {3,4,5}, {6,7,8} */
        uint64_t cells[9];
        double values[9], before[9];
        bool active[9] = { true, false, true, true, true, true, false, false, true };
        for (unsigned i = 0; i < 9; i++) {
                cells[i] = i;
                values[i] = before[i] = (double)(i * i);
        }
        MoshpitPeers peers = { .n = 9, .cells = cells, .values = values, .active = active };
        cr_assert_eq(moshpit_round(&g, MOSHPIT_PLACEMENT_FIXED, 0, 0, &peers), 3);
        cr_assert_float_eq(values[0], (0.0 + 4.0) / 2, 1e-15);
        cr_assert_eq(values[1], before[1]);
        cr_assert_float_eq(values[2], (0.0 + 4.0) / 2, 1e-15);
        for (unsigned i = 3; i < 6; i++)
                cr_assert_float_eq(values[i], (9.0 + 16.0 + 25.0) / 3, 1e-14);
        cr_assert_eq(values[6], before[6]);
        cr_assert_eq(values[7], before[7]);
        cr_assert_eq(values[8], before[8]); /* alone: its own mean */
        for (unsigned i = 0; i < 9; i++)
                cr_assert_eq(cells[i], i, "fixed placement moved peer %u", i);
        /* the sum over all peers is kept */
        long double sum_before = 0, sum_after = 0;
        for (unsigned i = 0; i < 9; i++) {
                sum_before += before[i];
                sum_after += values[i];
        }
        cr_assert_float_eq((double)sum_after, (double)sum_before, 1e-12);
}

static MoshpitSimConfig paper_config(size_t peers, double p, uint64_t seed, MoshpitPlacement pl) {
        MoshpitSimConfig c;
        moshpit_sim_config_defaults(&c);
        c.peers = peers;
        c.failure_p = p;
        c.seed = seed;
        c.placement = pl;
        return c;
}

Test(moshpit_sim, same_seed_same_run) {
        for (int pl = 0; pl < _MOSHPIT_PLACEMENT_MAX; pl++) {
                MoshpitSimConfig c = paper_config(512, 0.01, 1234, (MoshpitPlacement)pl);
                MoshpitSimResult a, b, other;
                cr_assert_eq(moshpit_simulate(&c, &a), 0);
                cr_assert_eq(moshpit_simulate(&c, &b), 0);
                cr_assert_eq(a.rounds, b.rounds);
                cr_assert_eq(a.failures, b.failures);
                cr_assert(memcmp(&a.final_variance, &b.final_variance, sizeof(double)) == 0);
                cr_assert(memcmp(&a.initial_variance, &b.initial_variance, sizeof(double)) == 0);
                c.seed = 1235;
                cr_assert_eq(moshpit_simulate(&c, &other), 0);
                cr_assert(a.initial_variance != other.initial_variance);
                cr_assert(a.final_variance != other.final_variance || a.failures != other.failures);
        }
}

Test(moshpit_sim, bad_configs_are_rejected) {
        MoshpitSimResult res = { .rounds = 777 };
        MoshpitSimConfig good = paper_config(512, 0.01, 1, MOSHPIT_PLACEMENT_FIXED);
        cr_assert_eq(moshpit_sim_config_check(&good), 0);
        cr_assert_eq(moshpit_simulate(&good, &res), 0);
        cr_assert_eq(moshpit_simulate_allreduce(&good, &res), 0);

        MoshpitSimConfig bad[16];
        size_t nb = 0;
        bad[nb] = good, bad[nb++].peers = 0;
        bad[nb] = good, bad[nb++].peers = 1025; /* more than 32x32 cells */
        bad[nb] = good, bad[nb++].grid.side = 1;
        bad[nb] = good, bad[nb++].grid.dims = 0;
        bad[nb] = good, bad[nb++].grid = (MoshpitGrid){ 5, 1u << 16 }; /* 2^80 */
        bad[nb] = good, bad[nb++].failure_p = -0.01;
        bad[nb] = good, bad[nb++].failure_p = 1.0;
        bad[nb] = good, bad[nb++].failure_p = NAN;
        bad[nb] = good, bad[nb++].target_variance = 0;
        bad[nb] = good, bad[nb++].target_variance = NAN;
        bad[nb] = good, bad[nb++].target_variance = INFINITY;
        bad[nb] = good, bad[nb++].max_rounds = 0;
        bad[nb] = good, bad[nb++].values = _MOSHPIT_VALUES_MAX;
        bad[nb] = good, bad[nb++].placement = _MOSHPIT_PLACEMENT_MAX;
        bad[nb] = good, bad[nb++].peers = MOSHPIT_PEERS_MAX + 1;
        for (size_t i = 0; i < nb; i++) {
                res.rounds = 777;
                cr_assert_eq(moshpit_sim_config_check(&bad[i]), -EINVAL, "config %zu accepted", i);
                cr_assert_eq(moshpit_simulate(&bad[i], &res), -EINVAL, "config %zu simulated", i);
                cr_assert_eq(res.rounds, 777, "config %zu: result touched on failure", i);
        }
        cr_assert_eq(moshpit_simulate(NULL, &res), -EINVAL);
        cr_assert_eq(moshpit_simulate(&good, NULL), -EINVAL);

        /* the baseline checks what it uses, and ignores the grid */
        MoshpitSimConfig c = good;
        c.peers = 0;
        cr_assert_eq(moshpit_simulate_allreduce(&c, &res), -EINVAL);
        c = good;
        c.failure_p = 1.0;
        cr_assert_eq(moshpit_simulate_allreduce(&c, &res), -EINVAL);
        c = good;
        c.grid.side = 1;
        cr_assert_eq(moshpit_simulate_allreduce(&c, &res), 0);
}

Test(moshpit_sim, converges_despite_failures) {
        for (int pl = 0; pl < _MOSHPIT_PLACEMENT_MAX; pl++)
                for (uint64_t seed = 1; seed <= 5; seed++) {
                        /* ten times the paper's worst failure rate */
                        MoshpitSimConfig c = paper_config(900, 0.05, seed, (MoshpitPlacement)pl);
                        MoshpitSimResult res;
                        cr_assert_eq(moshpit_simulate(&c, &res), 0);
                        cr_assert(res.converged, "%s seed %llu: variance %g after %u rounds",
                                  moshpit_placement_to_string(pl), (unsigned long long)seed, res.final_variance,
                                  res.rounds);
                        cr_assert_lt(res.final_variance, 1e-9);
                        cr_assert_gt(res.failures, 0);
                        cr_assert_gt(res.rounds, 2); /* 2 would be a full grid without failures */
                        cr_assert_lt(res.mean_drift, 1e-12, "averaging moved the mean by %g", res.mean_drift);
                }
}

/* 10,000 peers on a 100 x 100 grid, failing at 1 %: the exact mean, kept. */
Test(moshpit_sim, ten_thousand_peers_converge) {
        for (int pl = 0; pl < _MOSHPIT_PLACEMENT_MAX; pl++) {
                MoshpitSimConfig c = paper_config(10000, 0.01, 5, (MoshpitPlacement)pl);
                c.grid = (MoshpitGrid){ 2, 100 };
                MoshpitSimResult res;
                cr_assert_eq(moshpit_simulate(&c, &res), 0);
                cr_assert(res.converged, "%s: variance %g after %u rounds", moshpit_placement_to_string(pl),
                          res.final_variance, res.rounds);
                cr_assert_lt(res.final_variance, 1e-9);
                cr_assert_gt(res.failures, 0);
                cr_assert_lt(res.mean_drift, 1e-12, "averaging moved the mean by %g", res.mean_drift);
        }
}

Test(moshpit_sim, allreduce_takes_one_round_or_stalls) {
        MoshpitSimConfig c = paper_config(900, 0, 3, MOSHPIT_PLACEMENT_FIXED);
        MoshpitSimResult res;
        cr_assert_eq(moshpit_simulate_allreduce(&c, &res), 0);
        cr_assert(res.converged);
        cr_assert_eq(res.rounds, 1);
        cr_assert_lt(res.final_variance, 1e-25);

        /* 0.95^900 ~ 1e-20: some peer fails in every round */
        c.failure_p = 0.05;
        cr_assert_eq(moshpit_simulate_allreduce(&c, &res), 0);
        cr_assert_not(res.converged);
        cr_assert_eq(res.rounds, c.max_rounds);
        cr_assert_eq(res.final_variance, res.initial_variance, "a stalled all-reduce changed values");
        cr_assert_geq(res.failures, c.max_rounds);

        /* while Moshpit gets there under the same failures */
        cr_assert_eq(moshpit_simulate(&c, &res), 0);
        cr_assert(res.converged);
}

/* The paper's figures (means of 10 restarts on 32x32): N=512 p=0: 8.2,
 * N=512 p=0.01: 8.8, N=900 p=0: 5.0, N=900 p=0.005: 5.9. Our means over 40
 * restarts must land within about one round; a broken group rule (e.g.
 * averaging along the wrong dimension, or excluding too many peers) moves
 * them by far more. */
Test(moshpit_sim, fixed_placement_matches_published_means) {
        static const struct {
                size_t peers;
                double p, published;
        } cases[] = { { 512, 0, 8.2 }, { 512, 0.01, 8.8 }, { 900, 0, 5.0 }, { 900, 0.005, 5.9 } };
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                double sum = 0;
                for (uint64_t seed = 0; seed < 40; seed++) {
                        MoshpitSimConfig c = paper_config(cases[k].peers, cases[k].p, seed, MOSHPIT_PLACEMENT_FIXED);
                        MoshpitSimResult res;
                        cr_assert_eq(moshpit_simulate(&c, &res), 0);
                        cr_assert(res.converged);
                        sum += res.rounds;
                }
                double mean = sum / 40;
                cr_assert(fabs(mean - cases[k].published) < 1.0, "N=%zu p=%g: mean %.2f rounds, published %.1f",
                          cases[k].peers, cases[k].p, mean, cases[k].published);
        }
}
