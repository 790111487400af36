/* collective/topology.h — gossip topologies: who mixes with whom at each
 * iteration, the mixing matrices they make, and how fast they reach
 * consensus (Wang, Zhang, Wu, Johansson, "From promise to practice:
 * realizing high-performance decentralized training", ICLR 2025).
 *
 * Every topology here cuts the n members into disjoint groups at every
 * iteration t (each member is in exactly one group, possibly alone), and a
 * member mixes its vector with the others of its group:
 *
 *     x_i <- w x_i + (1 - w) / (|G| - 1) * sum_{j in G, j != i} x_j
 *
 * (w = 1/|G| is the group average). Every such step is doubly stochastic,
 * so the mean over all members never changes.
 *
 *   complete              one group of everyone: all-reduce.
 *   ring                  one-peer ring: pairs (0,1)(2,3)... on even t,
 *                         (1,2)(3,4)...(n-1,0) on odd t.
 *   exp                   one-peer exponential graph: i with i XOR 2^(t mod
 *                         ceil(log2 n)); exact average after log2 n steps
 *                         when n is a power of two.
 *   alt-exp-ring          alternating exponential-ring: exp steps on even t,
 *                         and on odd t the ring's odd pairs (1,2)(3,4)...
 *                         (n-1,0), the ring links that exp's distance-1
 *                         step does not use. The paper's code alternates an
 *                         exponential hop between machines with an
 *                         all-reduce inside each machine; ravnest runs one
 *                         process per machine, so the cheap step is the
 *                         hop between index neighbours (nearby machines).
 *                         Taking the ring's other pairing too would repeat
 *                         exp's pairs on consecutive steps; this way the
 *                         spectral gap per step is larger for most n.
 *
 * A member alone (odd n, or no partner at that distance) keeps its vector.
 *
 *     unsigned g[GOSSIP_MAX_GROUP];
 *     int k = gossip_group(GOSSIP_ALT_EXP_RING, 8, 3, t, g);  // 2: { 2, 3 } or ...
 *     bool out[8] = { [5] = true };                           // member 5 left out
 *     k = gossip_group_among(GOSSIP_ALT_EXP_RING, 8, out, 3, t, g);
 *     double W[64];
 *     gossip_mixing_matrix(GOSSIP_RING, 8, t, 0, W);          // 8 x 8, row-major
 *     double rho, sigma;
 *     gossip_contraction(GOSSIP_RING, 8, 0, &rho, &sigma);    // per period
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GOSSIP_MAX_MEMBERS 1024
#define GOSSIP_MAX_GROUP GOSSIP_MAX_MEMBERS

typedef enum GossipTopology {
        GOSSIP_COMPLETE,
        GOSSIP_RING,
        GOSSIP_EXP,
        GOSSIP_ALT_EXP_RING,
        _GOSSIP_TOPOLOGY_MAX,
        _GOSSIP_TOPOLOGY_INVALID = -1,
} GossipTopology;

const char *gossip_topology_to_string(GossipTopology t);
GossipTopology gossip_topology_from_string(const char *s);

/* Member i's group at iteration t, in increasing order, into ret (room for
 * n). Returns its size (1: alone), or -EINVAL. A pure function: every
 * member computes the same groups. */
int gossip_group(GossipTopology topo, unsigned n, unsigned i, uint64_t t, unsigned *ret);

/* The same among the members not marked in out (n flags; NULL: none):
 * the topology over those alone, in their order, so every member that
 * marks the same ones gets the same groups, and none of them is in a
 * group. A member marked itself is alone. Gossip leaves out so the members
 * that train another model (gossip.h). */
int gossip_group_among(GossipTopology topo, unsigned n, const bool *out, unsigned i, uint64_t t, unsigned *ret);

/* The number of iterations after which the groups repeat. */
unsigned gossip_period(GossipTopology topo, unsigned n);

/* The self weight w of a member in a group of size g (weight 0: uniform,
 * 1/g; a member alone keeps 1). */
double gossip_self_weight(double weight, unsigned g);

/* W (n x n, row-major) of iteration t: x(t+1) = W x(t). */
int gossip_mixing_matrix(GossipTopology topo, unsigned n, uint64_t t, double weight, double *W);

/* One gossip iteration simulated in memory: x[i] points at member i's len
 * values; every group is mixed from the values before the step (float
 * arithmetic in double, rounded once). */
int gossip_simulate_step(GossipTopology topo, unsigned n, uint64_t t, double weight, float *const *x, size_t len);

/* How fast the consensus error x - mean falls, per period P = W(p-1)...W(0):
 *   rho:   the spectral radius of P - 11'/n, the asymptotic factor per
 *          period (the rate random vectors see); the spectral gap per
 *          iteration is 1 - rho^(1/p);
 *   sigma: ||P - 11'/n||_2, a bound that holds from the first period.
 * n <= 256 (dense matrices). */
int gossip_contraction(GossipTopology topo, unsigned n, double weight, double *ret_rho, double *ret_sigma);
