/* collective/gossip.c — the exchange thread and its hand-offs with the
 * compute thread.
 *
 * One state word; whoever moves it owns the buffers it names:
 *   IDLE    -> SENT     compute: copied x into snap, chose the group
 *   SENT    -> DONE     exchange thread: ran the round, wrote the mixing
 *                       step's delta into delta (or failed)
 *   DONE    -> IDLE     compute: x += delta
 * A group of one goes IDLE -> DONE at once with a zero delta. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gossip.h"
#include "util/time-util.h"

enum { G_IDLE, G_SENT, G_DONE };

/* Pairs are 2 + a n + b < 2^21, other groups have the top bit set. */
#define GOSSIP_PROBE_GROUP 0x7ffffffeu

struct Gossip {
        GossipConfig cfg;
        Coll *coll;
        uint16_t port;
        pthread_t thread;
        bool started;
        atomic_bool stop;
        atomic_uint connected; /* written by the exchange thread after each run */
        bool *out;           /* members left out of the groups: they train another model; under lock */
        unsigned n_out;

        pthread_mutex_t lock;
        pthread_cond_t cond;
        int state;           /* under lock */
        GossipTopology topology;
        bool probe;          /* gossip_average(): every member, the plain average, probe_len values */
        size_t probe_len;
        uint64_t probe_running_ns;
        unsigned group[GOSSIP_MAX_GROUP], n_group;
        uint64_t t;
        int result;          /* participants, or -errno */
        bool zero_delta;     /* nothing to add */
        uint64_t sent_ns;

        float *snap, *delta;
        GossipStats stats;   /* under lock */
};

void gossip_config_defaults(GossipConfig *c) {
        *c = (GossipConfig){ .topology = GOSSIP_ALT_EXP_RING };
        coll_config_defaults(&c->coll);
}

int gossip_new(const GossipConfig *cfg, Gossip **ret) {
        if (cfg->len == 0 || cfg->topology < 0 || cfg->topology >= _GOSSIP_TOPOLOGY_MAX || cfg->weight < 0 ||
            cfg->weight >= 1 || cfg->coll.n_members > COLL_MAX_MEMBERS)
                return -EINVAL;
        Gossip *g = calloc(1, sizeof *g);
        if (!g)
                return -ENOMEM;
        g->cfg = *cfg;
        g->topology = cfg->topology;
        pthread_mutex_init(&g->lock, NULL);
        pthread_cond_init(&g->cond, NULL);
        g->snap = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
        g->delta = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
        g->out = calloc(MAX(cfg->coll.n_members, 1u), sizeof *g->out);
        int r = -ENOMEM;
        if (!g->snap || !g->delta || !g->out)
                goto fail;
        r = coll_new(&cfg->coll, &g->coll);
        if (r < 0)
                goto fail;
        r = coll_listen(g->coll, cfg->listen_port, &g->port);
        if (r < 0)
                goto fail;
        *ret = g;
        return 0;
fail:
        gossip_free(g);
        return r;
}

Gossip *gossip_free(Gossip *g) {
        if (!g)
                return NULL;
        if (g->started) {
                atomic_store(&g->stop, true);
                pthread_join(g->thread, NULL);
        }
        coll_free(g->coll);
        free(g->snap);
        free(g->delta);
        free(g->out);
        pthread_cond_destroy(&g->cond);
        pthread_mutex_destroy(&g->lock);
        free(g);
        return NULL;
}

uint16_t gossip_port(const Gossip *g) {
        return g->port;
}

int gossip_set_address(Gossip *g, unsigned member, const char *host, uint16_t port) {
        if (g->started)
                return -EBUSY;
        return coll_set_address(g->coll, member, host, port);
}

unsigned gossip_connected(Gossip *g) {
        return atomic_load(&g->connected);
}

/* A group's round needs one id on all its members, and distinct groups
 * distinct ids: everyone is group 1, a pair (a, b) is 2 + a n + b. */
static uint32_t group_id(const unsigned *m, unsigned k, unsigned n) {
        if (k == n)
                return 1;
        if (k == 2)
                return 2 + m[0] * n + m[1];
        uint32_t h = 2166136261u; /* FNV-1a over the members; no topology here makes other sizes */
        for (unsigned i = 0; i < k; i++)
                h = (h ^ m[i]) * 16777619u;
        return h | 0x80000000u;
}

/* delta = (w s + (1-w)/(p-1) (p avg - s)) - s, from the round's average;
 * a probe round leaves the plain average in delta. */
static int finish_round(Gossip *g, CollRound *rd, CollRoundInfo *info) {
        const float *s = g->snap;
        float *d = g->delta;
        size_t len = g->probe ? g->probe_len : g->cfg.len;
        int r;

        coll_round_info(rd, info);
        if (info->state != COLL_ROUND_DONE)
                return info->error < 0 ? info->error : -EIO;
        unsigned p = info->participants;
        if (g->probe)
                g->probe_running_ns = info->end_ns > info->running_ns ? info->end_ns - info->running_ns : 0;
        if (p <= 1)
                return 1;
        if (g->probe)
                return (r = coll_round_read(rd, 0, len, d)) < 0 ? r : (int)p;
        r = coll_round_read(rd, 0, len, d);
        if (r < 0)
                return r;
        double w = gossip_self_weight(g->cfg.weight, p);
        float a = (float)(w - (1.0 - w) / (p - 1) - 1.0), b = (float)((1.0 - w) * p / (p - 1));
        for (size_t i = 0; i < len; i++)
                d[i] = a * s[i] + b * d[i];
        return (int)p;
}

/* The members as their links' MODEL says (coll_member_model()): one of
 * another model is left out of the groups from now on, until a link of it
 * names ours; it does the same with us. Connected: the members whose MODEL
 * came, so that a member that waits for them all before its first
 * iteration leaves out the same ones as the others. */
static void update_members(Gossip *g) {
        unsigned n = g->cfg.coll.n_members, connected = 0;
        for (unsigned m = 0; m < n; m++) {
                int model = m == g->cfg.coll.self ? 0 : coll_member_model(g->coll, m);
                bool out = model < 0 || (model == 0 && g->out[m]); /* only this thread writes out */
                connected += model != 0;
                if (out == g->out[m])
                        continue;
                pthread_mutex_lock(&g->lock);
                g->out[m] = out;
                g->n_out = out ? g->n_out + 1 : g->n_out - 1;
                pthread_mutex_unlock(&g->lock);
        }
        atomic_store(&g->connected, connected);
}

static void *gossip_main(void *arg) {
        Gossip *g = arg;
        CollRound *rd = NULL;

        while (!atomic_load(&g->stop)) {
                pthread_mutex_lock(&g->lock);
                if (!rd && g->state == G_SENT) {
                        /* probe rounds have a group of their own, apart from the iterations' */
                        uint32_t id = g->probe ? GOSSIP_PROBE_GROUP : group_id(g->group, g->n_group, g->cfg.coll.n_members);
                        int r = coll_round_start(g->coll, id, g->group, g->n_group, g->snap,
                                                 g->probe ? g->probe_len : g->cfg.len, 1.0, &rd);
                        if (r < 0) {
                                rd = NULL;
                                g->result = r;
                                g->state = G_DONE;
                                g->stats.failed++;
                                g->stats.last_error = r;
                                pthread_cond_broadcast(&g->cond);
                        }
                }
                pthread_mutex_unlock(&g->lock);

                coll_run(g->coll, rd ? 1 : 2);
                update_members(g);
                CollForeign foreign = coll_foreign(g->coll);
                CollLoss lost = coll_loss(g->coll), refused = coll_refusals(g->coll);
                if (foreign.count != g->stats.foreign.count || lost.count != g->stats.lost.count ||
                    refused.count != g->stats.refused.count) {
                        pthread_mutex_lock(&g->lock);
                        g->stats.foreign = foreign;
                        g->stats.lost = lost;
                        g->stats.refused = refused;
                        pthread_mutex_unlock(&g->lock);
                }

                if (rd && coll_round_finished(rd)) {
                        CollRoundInfo info;
                        int r = finish_round(g, rd, &info);
                        coll_round_free(rd);
                        rd = NULL;
                        pthread_mutex_lock(&g->lock);
                        g->result = r;
                        g->zero_delta = r <= 1;
                        g->state = G_DONE;
                        g->stats.bytes_sent += info.bytes_sent;
                        g->stats.bytes_received += info.bytes_received;
                        g->stats.exchange_ns += now_ns() - g->sent_ns;
                        if (r < 0) {
                                g->stats.failed++;
                                g->stats.last_error = r;
                        } else {
                                g->stats.exchanges++;
                                g->stats.last_participants = (unsigned)r;
                        }
                        pthread_cond_broadcast(&g->cond);
                        pthread_mutex_unlock(&g->lock);
                }
        }
        if (rd)
                coll_round_free(rd);
        return NULL;
}

int gossip_start(Gossip *g) {
        if (g->started)
                return -EALREADY;
        int r = pthread_create(&g->thread, NULL, gossip_main, g);
        if (r != 0)
                return -r;
        g->started = true;
        return 0;
}

int gossip_send(Gossip *g, const float *x, uint64_t t) {
        unsigned n = g->cfg.coll.n_members, grp[GOSSIP_MAX_GROUP];

        pthread_mutex_lock(&g->lock);
        if (g->state != G_IDLE) {
                pthread_mutex_unlock(&g->lock);
                return -EBUSY;
        }
        /* complete keeps everyone: one group (one id) however they see each
         * other, and its round leaves the one of another model out */
        int k = gossip_group_among(g->topology, n, g->topology == GOSSIP_COMPLETE ? NULL : g->out,
                                   g->cfg.coll.self, t, grp);
        if (k < 0) {
                pthread_mutex_unlock(&g->lock);
                return k;
        }
        g->probe = false;
        g->t = t;
        g->sent_ns = now_ns();
        if (n > 1 && g->n_out == n - 1) { /* nobody trains our model: not averaging */
                g->result = -EBADE;
                g->state = G_DONE;
                g->stats.failed++;
                g->stats.last_error = -EBADE;
        } else if (k == 1) {
                g->result = 1;
                g->zero_delta = true;
                g->state = G_DONE;
                g->stats.alone++;
        } else {
                memcpy(g->snap, x, g->cfg.len * sizeof *x);
                memcpy(g->group, grp, (size_t)k * sizeof *grp);
                g->n_group = (unsigned)k;
                g->state = G_SENT;
        }
        pthread_mutex_unlock(&g->lock);
        return 0;
}

int gossip_mix(Gossip *g, float *x) {
        uint64_t t0 = now_ns();
        pthread_mutex_lock(&g->lock);
        if (g->state == G_IDLE) {
                pthread_mutex_unlock(&g->lock);
                return -ENOMSG;
        }
        while (g->state != G_DONE)
                pthread_cond_wait(&g->cond, &g->lock);
        int r = g->result;
        bool zero = g->zero_delta;
        g->stats.wait_ns += now_ns() - t0;
        pthread_mutex_unlock(&g->lock);

        if (r > 1 && !zero) {
                const float *d = g->delta;
                for (size_t i = 0; i < g->cfg.len; i++)
                        x[i] += d[i];
        }
        pthread_mutex_lock(&g->lock);
        g->state = G_IDLE;
        pthread_mutex_unlock(&g->lock);
        return r;
}

int gossip_set_topology(Gossip *g, GossipTopology topo) {
        if (topo < 0 || topo >= _GOSSIP_TOPOLOGY_MAX)
                return -EINVAL;
        pthread_mutex_lock(&g->lock);
        int r = g->state == G_IDLE ? 0 : -EBUSY;
        if (r == 0)
                g->topology = topo;
        pthread_mutex_unlock(&g->lock);
        return r;
}

GossipTopology gossip_get_topology(Gossip *g) {
        pthread_mutex_lock(&g->lock);
        GossipTopology t = g->topology;
        pthread_mutex_unlock(&g->lock);
        return t;
}

int gossip_average(Gossip *g, float *x, size_t len, uint64_t *ret_running_ns) {
        unsigned n = g->cfg.coll.n_members;
        if (len == 0 || len > g->cfg.len)
                return -EINVAL;
        pthread_mutex_lock(&g->lock);
        if (g->state != G_IDLE || !g->started) {
                int r = g->started ? -EBUSY : -ENOTCONN;
                pthread_mutex_unlock(&g->lock);
                return r;
        }
        memcpy(g->snap, x, len * sizeof *x);
        for (unsigned i = 0; i < n; i++)
                g->group[i] = i;
        g->n_group = n;
        g->probe = true;
        g->probe_len = len;
        g->probe_running_ns = 0;
        g->sent_ns = now_ns();
        g->state = G_SENT;
        while (g->state != G_DONE)
                pthread_cond_wait(&g->cond, &g->lock);
        int r = g->result;
        uint64_t ns = g->probe_running_ns;
        pthread_mutex_unlock(&g->lock);

        if (r > 1)
                memcpy(x, g->delta, len * sizeof *x);
        pthread_mutex_lock(&g->lock);
        g->probe = false;
        g->state = G_IDLE;
        pthread_mutex_unlock(&g->lock);
        if (ret_running_ns)
                *ret_running_ns = ns;
        return r;
}

void gossip_get_stats(Gossip *g, GossipStats *ret) {
        pthread_mutex_lock(&g->lock);
        *ret = g->stats;
        pthread_mutex_unlock(&g->lock);
}
