/* collective/topology.c — see topology.h. */
#include "topology.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/macro.h"

static const char *const topology_names[_GOSSIP_TOPOLOGY_MAX] = {
        [GOSSIP_COMPLETE] = "complete",
        [GOSSIP_RING] = "ring",
        [GOSSIP_EXP] = "exp",
        [GOSSIP_ALT_EXP_RING] = "alt-exp-ring",
};

DEFINE_STRING_TABLE_LOOKUP(gossip_topology, GossipTopology, topology_names, _GOSSIP_TOPOLOGY_MAX,
                           _GOSSIP_TOPOLOGY_INVALID)

/* Bits needed to name a member: the exponential graph's distances are
 * 2^0 .. 2^(bits-1). */
static unsigned exp_bits(unsigned n) {
        unsigned b = 0;
        while ((1u << b) < n)
                b++;
        return b;
}

/* The partner of i at ring step t, or i when i sits out. */
static unsigned ring_partner(unsigned n, unsigned i, uint64_t t) {
        unsigned o = (unsigned)(t & 1);
        if (n < 2)
                return i;
        if (n % 2 == 0)
                return ((((i + n - o) % n) ^ 1u) + o) % n;
        /* odd n: the last member sits out on even steps, the first on odd ones */
        if (o == 0)
                return i == n - 1 ? i : i ^ 1u;
        return i == 0 ? i : (((i - 1) ^ 1u) + 1);
}

static unsigned exp_partner(unsigned n, unsigned i, uint64_t t) {
        unsigned b = exp_bits(n);
        if (b == 0)
                return i;
        unsigned p = i ^ (1u << (t % b));
        return p < n ? p : i;
}

int gossip_group(GossipTopology topo, unsigned n, unsigned i, uint64_t t, unsigned *ret) {
        unsigned p;

        if (n == 0 || n > GOSSIP_MAX_MEMBERS || i >= n)
                return -EINVAL;
        switch (topo) {
        case GOSSIP_COMPLETE:
                for (unsigned k = 0; k < n; k++)
                        ret[k] = k;
                return (int)n;
        case GOSSIP_RING:
                p = ring_partner(n, i, t);
                break;
        case GOSSIP_EXP:
                p = exp_partner(n, i, t);
                break;
        case GOSSIP_ALT_EXP_RING:
                p = t % 2 == 0 ? exp_partner(n, i, t / 2) : ring_partner(n, i, 1);
                break;
        default:
                return -EINVAL;
        }
        if (p == i) {
                ret[0] = i;
                return 1;
        }
        ret[0] = MIN(i, p);
        ret[1] = MAX(i, p);
        return 2;
}

int gossip_group_among(GossipTopology topo, unsigned n, const bool *out, unsigned i, uint64_t t, unsigned *ret) {
        unsigned left = 0, rank = 0;

        if (!out)
                return gossip_group(topo, n, i, t, ret);
        if (n == 0 || n > GOSSIP_MAX_MEMBERS || i >= n)
                return -EINVAL;
        if (out[i]) {
                ret[0] = i;
                return 1;
        }
        for (unsigned j = 0; j < n; j++)
                if (!out[j]) {
                        rank += j < i;
                        left++;
                }
        int k = gossip_group(topo, left, rank, t, ret);
        if (k < 0)
                return k;
        /* ranks among those left back to members: both in increasing order */
        for (unsigned j = 0, r = 0, g = 0; j < n && g < (unsigned)k; j++)
                if (!out[j] && r++ == ret[g])
                        ret[g++] = j;
        return k;
}

unsigned gossip_period(GossipTopology topo, unsigned n) {
        unsigned b = MAX(exp_bits(n), 1u);
        switch (topo) {
        case GOSSIP_RING:
                return n > 2 ? 2 : 1;
        case GOSSIP_EXP:
                return b;
        case GOSSIP_ALT_EXP_RING:
                return 2 * b; /* the exp index t/2 repeats every 2b steps; the ring step is always the same */
        default:
                return 1;
        }
}

double gossip_self_weight(double weight, unsigned g) {
        if (g <= 1)
                return 1.0;
        return weight > 0 ? weight : 1.0 / g;
}

/* Checks the arguments both users share and allocates room for a group. */
static int group_buffer(unsigned n, double weight, unsigned **ret) {
        if (n == 0 || n > GOSSIP_MAX_MEMBERS || weight < 0 || weight > 1)
                return -EINVAL;
        *ret = malloc(n * sizeof **ret);
        return *ret ? 0 : -ENOMEM;
}

int gossip_mixing_matrix(GossipTopology topo, unsigned n, uint64_t t, double weight, double *W) {
        _cleanup_(freep) unsigned *g = NULL;
        int r = group_buffer(n, weight, &g);
        if (r < 0)
                return r;
        memset(W, 0, (size_t)n * n * sizeof *W);
        for (unsigned i = 0; i < n; i++) {
                int k = gossip_group(topo, n, i, t, g);
                if (k < 0)
                        return k;
                double w = gossip_self_weight(weight, (unsigned)k);
                for (int j = 0; j < k; j++)
                        W[(size_t)i * n + g[j]] = g[j] == i ? w : (1.0 - w) / (k - 1);
        }
        return 0;
}

int gossip_simulate_step(GossipTopology topo, unsigned n, uint64_t t, double weight, float *const *x, size_t len) {
        _cleanup_(freep) unsigned *g = NULL;
        int r = group_buffer(n, weight, &g);
        if (r < 0)
                return r;
        for (unsigned i = 0; i < n; i++) {
                int k = gossip_group(topo, n, i, t, g);
                if (k < 0)
                        return k;
                if (k == 1 || g[0] != i) /* alone, or mixed with its group's first member */
                        continue;
                double w = gossip_self_weight(weight, (unsigned)k), c = (1.0 - w) / (k - 1);
                for (size_t e = 0; e < len; e++) {
                        double s = 0;
                        for (int j = 0; j < k; j++)
                                s += x[g[j]][e];
                        for (int j = 0; j < k; j++) {
                                double v = x[g[j]][e];
                                x[g[j]][e] = (float)(w * v + c * (s - v));
                        }
                }
        }
        return 0;
}

/* C = A B, all n x n. */
static void matmul(double *C, const double *A, const double *B, unsigned n) {
        memset(C, 0, (size_t)n * n * sizeof *C);
        for (unsigned i = 0; i < n; i++)
                for (unsigned k = 0; k < n; k++) {
                        double a = A[(size_t)i * n + k];
                        if (a == 0)
                                continue;
                        for (unsigned j = 0; j < n; j++)
                                C[(size_t)i * n + j] += a * B[(size_t)k * n + j];
                }
}

static void matvec(double *y, const double *M, const double *x, unsigned n) {
        for (unsigned i = 0; i < n; i++) {
                double s = 0;
                for (unsigned j = 0; j < n; j++)
                        s += M[(size_t)i * n + j] * x[j];
                y[i] = s;
        }
}

static double vnorm(const double *x, unsigned n) {
        double s = 0;
        for (unsigned i = 0; i < n; i++)
                s += x[i] * x[i];
        return sqrt(s);
}

/* ||M||_2 by power iteration on M'M (symmetric, so it converges to the
 * largest singular value squared). */
static double norm2(const double *M, unsigned n, double *v, double *u) {
        double lambda = 0;
        for (unsigned i = 0; i < n; i++) /* not the all-ones direction, which M may annihilate */
                v[i] = 1.0 + 0.37 * sin(1.0 + 7.0 * i) + (i % 3);
        for (int it = 0; it < 2000; it++) {
                for (unsigned i = 0; i < n; i++) {
                        double s = 0;
                        for (unsigned j = 0; j < n; j++)
                                s += M[(size_t)i * n + j] * v[j];
                        u[i] = s;
                }
                double nv = 0;
                for (unsigned j = 0; j < n; j++) {
                        double s = 0;
                        for (unsigned i = 0; i < n; i++)
                                s += M[(size_t)i * n + j] * u[i];
                        v[j] = s;
                        nv += s * s;
                }
                nv = sqrt(nv);
                if (nv == 0)
                        return 0;
                for (unsigned j = 0; j < n; j++)
                        v[j] /= nv;
                if (fabs(nv - lambda) <= 1e-13 * nv)
                        return sqrt(nv);
                lambda = nv;
        }
        return sqrt(lambda);
}

int gossip_contraction(GossipTopology topo, unsigned n, double weight, double *ret_rho, double *ret_sigma) {
        size_t nn = (size_t)n * n;
        unsigned p = gossip_period(topo, n);
        double *P, *W, *T, *A, *v, *u;
        int r;

        if (n == 0 || n > 256)
                return -EINVAL;
        _cleanup_(freep) double *buf = malloc((4 * nn + 2 * n) * sizeof *buf);
        if (!buf)
                return -ENOMEM;
        P = buf;
        W = P + nn;
        T = W + nn;
        A = T + nn;
        v = A + nn;
        u = v + n;

        /* P = W(p-1) ... W(0) */
        for (size_t i = 0; i < nn; i++)
                P[i] = i % (n + 1) == 0;
        for (unsigned t = 0; t < p; t++) {
                if ((r = gossip_mixing_matrix(topo, n, t, weight, W)) < 0)
                        return r;
                matmul(T, W, P, n);
                memcpy(P, T, nn * sizeof *P);
        }
        for (size_t i = 0; i < nn; i++) /* P - 11'/n: the error's own map, since P 1 = 1 and 1'P = 1' */
                P[i] -= 1.0 / n;
        double sigma = norm2(P, n, v, u);

        /* rho: M^K u for K = 2^SQUARINGS lies in M's slowest modes (squaring,
         * rescaled so nothing under- or overflows); M's growth factor on
         * that vector, as a geometric mean over many steps (a complex pair
         * of eigenvalues turns it around), is |lambda_max|. */
        enum { SQUARINGS = 8, STEPS = 256 };
        double rho = 0;
        memcpy(A, P, nn * sizeof *P);
        for (unsigned s = 0; s < SQUARINGS; s++) {
                double f = 0;
                for (size_t i = 0; i < nn; i++)
                        f += A[i] * A[i];
                if (f == 0)
                        break;
                for (size_t i = 0; i < nn; i++)
                        A[i] /= sqrt(f);
                matmul(T, A, A, n);
                memcpy(A, T, nn * sizeof *A);
        }
        for (unsigned i = 0; i < n; i++)
                u[i] = 1.0 + 0.37 * sin(3.0 + 5.0 * i) + (i % 5);
        matvec(v, A, u, n);
        double logsum = 0, nv = vnorm(v, n);
        if (nv > 1e-200 * vnorm(u, n)) {
                for (unsigned k = 0; k < STEPS; k++) {
                        for (unsigned i = 0; i < n; i++)
                                v[i] /= nv;
                        matvec(u, P, v, n);
                        memcpy(v, u, n * sizeof *v);
                        nv = vnorm(v, n);
                        if (nv < 1e-14) { /* annihilated: exact consensus within a period, up to rounding */
                                logsum = -INFINITY;
                                break;
                        }
                        logsum += log(nv);
                }
                rho = exp(logsum / STEPS);
        }
        if (ret_rho)
                *ret_rho = rho;
        if (ret_sigma)
                *ret_sigma = sigma;
        return 0;
}
