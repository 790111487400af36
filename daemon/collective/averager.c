/* collective/averager.c — the averaging thread and its hand-offs with the
 * compute thread.
 *
 * The two threads share a state word and two buffers; whoever moves the
 * state owns the buffer it names:
 *   IDLE    -> WANT     averager: a round is due
 *   WANT    -> SNAPPED  compute: copied params into snapshot
 *   SNAPPED -> RUNNING  averager: rounds started on snapshot
 *   RUNNING -> DELTA    averager: delta = avg - snapshot where averaged, else 0
 *   DELTA   -> IDLE     compute: params += delta
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "averager.h"
#include "util/time-util.h"

enum { AV_IDLE, AV_WANT, AV_SNAPPED, AV_RUNNING, AV_DELTA };

struct Averager {
        AveragerConfig cfg;
        AveragerRing *rings;
        Coll *coll;
        uint16_t port;
        pthread_t thread;
        bool started;
        atomic_bool stop;
        atomic_int state;
        atomic_uint_fast64_t steps;
        atomic_uint_fast64_t requested; /* tickets handed out by averager_request() */
        atomic_uint_fast64_t done;      /* the last ticket whose round's delta was applied */
        uint64_t round_ticket, delta_ticket;
        atomic_uint patience_ms; /* of the requested round */

        float *snapshot, *delta;
        double weight;
        uint64_t samples; /* compute thread only */

        /* averaging thread only */
        CollRound *rd[COLL_MAX_MEMBERS];
        unsigned n_rd;
        uint64_t next_due_ns, steps_at_last, moshpit_round, round_start_ns, started_ns;
        bool settled;

        pthread_mutex_t lock; /* stats */
        AveragerStats stats;
};

void averager_config_defaults(AveragerConfig *c) {
        *c = (AveragerConfig){ .method = AVERAGER_RING, .interval_ms = 5000 };
        coll_config_defaults(&c->coll);
}

int averager_new(const AveragerConfig *cfg, Averager **ret) {
        if (cfg->len == 0 || (cfg->method == AVERAGER_RING && cfg->n_rings == 0) ||
            cfg->n_rings > COLL_MAX_MEMBERS || (cfg->interval_ms == 0 && cfg->interval_steps == 0))
                return -EINVAL;
        for (unsigned i = 0; i < cfg->n_rings; i++)
                if (cfg->rings[i].off > cfg->len || cfg->rings[i].len > cfg->len - cfg->rings[i].off)
                        return -EINVAL;
        if (cfg->method == AVERAGER_MOSHPIT) {
                uint64_t cells;
                if (moshpit_grid_cells(&cfg->grid, &cells) < 0 || cells < cfg->coll.n_members || cells > 65536)
                        return -EINVAL;
        }

        Averager *a = calloc(1, sizeof *a);
        if (!a)
                return -ENOMEM;
        a->cfg = *cfg;
        pthread_mutex_init(&a->lock, NULL);
        a->rings = calloc(MAX(cfg->n_rings, 1u), sizeof *a->rings);
        a->snapshot = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
        a->delta = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
        int r = -ENOMEM;
        if (!a->rings || !a->snapshot || !a->delta)
                goto fail;
        if (cfg->n_rings)
                memcpy(a->rings, cfg->rings, cfg->n_rings * sizeof *a->rings);
        a->cfg.rings = a->rings;
        r = coll_new(&cfg->coll, &a->coll);
        if (r < 0)
                goto fail;
        r = coll_listen(a->coll, cfg->listen_port, &a->port);
        if (r < 0)
                goto fail;
        *ret = a;
        return 0;
fail:
        averager_free(a);
        return r;
}

Averager *averager_free(Averager *a) {
        if (!a)
                return NULL;
        if (a->started) {
                atomic_store(&a->stop, true);
                pthread_join(a->thread, NULL);
        }
        for (unsigned i = 0; i < a->n_rd; i++)
                coll_round_free(a->rd[i]);
        coll_free(a->coll);
        free(a->snapshot);
        free(a->delta);
        free(a->rings);
        pthread_mutex_destroy(&a->lock);
        free(a);
        return NULL;
}

uint16_t averager_port(const Averager *a) {
        return a->port;
}

int averager_set_address(Averager *a, unsigned member, const char *host, uint16_t port) {
        return coll_set_address(a->coll, member, host, port);
}

/* Moshpit: the members that share our cell's group key in this round. */
static unsigned moshpit_members(const Averager *a, uint64_t round, unsigned *out) {
        const MoshpitGrid *g = &a->cfg.grid;
        uint64_t key = moshpit_grid_group_key(g, a->cfg.coll.self, round);
        unsigned n = 0;
        for (unsigned m = 0; m < a->cfg.coll.n_members && n < COLL_MAX_MEMBERS; m++)
                if (moshpit_grid_group_key(g, m, round) == key)
                        out[n++] = m;
        return n;
}

static int start_rounds(Averager *a) {
        int r = 0;
        a->n_rd = 0;
        memset(a->delta, 0, a->cfg.len * sizeof *a->delta); /* what no ring covers stays 0 */
        if (a->cfg.method == AVERAGER_MOSHPIT) {
                unsigned members[COLL_MAX_MEMBERS], n = moshpit_members(a, a->moshpit_round, members);
                uint64_t key = moshpit_grid_group_key(&a->cfg.grid, a->cfg.coll.self, a->moshpit_round);
                /* group ids of Moshpit rounds: top bit, round, group key */
                uint32_t group = 0x80000000u | (uint32_t)(a->moshpit_round & 0x7fff) << 16 | (uint32_t)(key & 0xffff);
                a->moshpit_round++;
                r = coll_round_start(a->coll, group, members, n, a->snapshot, a->cfg.len, a->weight, &a->rd[0]);
                if (r == 0) {
                        a->n_rd = 1;
                        r = coll_round_set_output(a->rd[0], a->delta);
                }
                return r;
        }
        for (unsigned i = 0; i < a->cfg.n_rings; i++) {
                const AveragerRing *g = &a->rings[i];
                r = coll_round_start(a->coll, g->group, g->members, g->n, a->snapshot + g->off, g->len, a->weight,
                                     &a->rd[a->n_rd]);
                if (r < 0)
                        break;
                /* the averages land in delta as they complete; finish_rounds() subtracts */
                r = coll_round_set_output(a->rd[a->n_rd++], a->delta + g->off);
                if (r < 0)
                        break;
        }
        return r;
}

static bool rounds_joining(const Averager *a) {
        for (unsigned i = 0; i < a->n_rd; i++) {
                CollRoundInfo info;
                coll_round_info(a->rd[i], &info);
                if (info.state == COLL_ROUND_JOINING)
                        return true;
        }
        return false;
}

static bool rounds_finished(const Averager *a) {
        for (unsigned i = 0; i < a->n_rd; i++)
                if (!coll_round_finished(a->rd[i]))
                        return false;
        return true;
}

_simd_clones_ static void sub_f32(float *restrict d, const float *restrict x, size_t n) {
        for (size_t i = 0; i < n; i++)
                d[i] -= x[i];
}

/* delta = avg - snapshot where a piece was averaged, 0 elsewhere (the
 * rounds wrote the averages into delta). */
static size_t round_delta(const CollRound *rd, float *delta, const float *snapshot) {
        size_t off, len, values = 0;
        bool done;
        for (size_t k = 0; coll_round_piece(rd, k, &off, &len, &done) == 0; k++) {
                if (done) {
                        sub_f32(delta + off, snapshot + off, len);
                        values += len;
                } else
                        memset(delta + off, 0, len * sizeof *delta);
        }
        return values;
}

static void finish_rounds(Averager *a, uint64_t now) {
        AveragerStats s;
        size_t values = 0;
        int error = 0;
        unsigned smallest = UINT32_MAX;

        pthread_mutex_lock(&a->lock);
        s = a->stats;
        for (unsigned i = 0; i < a->n_rd; i++) {
                CollRoundInfo info;
                size_t off = a->cfg.method == AVERAGER_MOSHPIT ? 0 : a->rings[i].off;
                coll_round_info(a->rd[i], &info);
                values += round_delta(a->rd[i], a->delta + off, a->snapshot + off);
                if (info.state != COLL_ROUND_DONE)
                        error = info.error;
                smallest = MIN(smallest, info.participants);
                s.bytes_sent += info.bytes_sent;
                s.bytes_received += info.bytes_received;
                coll_round_free(a->rd[i]);
        }
        a->n_rd = 0;
        if (error)
                s.rounds_failed++;
        else
                s.rounds_done++;
        s.values_averaged += values;
        s.last_error = error;
        s.last_participants = smallest == UINT32_MAX ? 0 : smallest;
        s.last_round_ns = now - a->round_start_ns;
        s.last_done_realtime_us = now_realtime_usec();
        a->stats = s;
        pthread_mutex_unlock(&a->lock);
}

/* Before the first round, give the links time to come up: until every
 * member we average with is connected, or for one join timeout. After that
 * a missing member is one that is down, and rounds go on without it. */
static bool links_settled(Averager *a, uint64_t now) {
        if (a->settled)
                return true;
        bool all = true;
        for (unsigned i = 0; i < a->cfg.n_rings && all; i++)
                for (unsigned k = 0; k < a->rings[i].n && all; k++)
                        all = coll_connected(a->coll, a->rings[i].members[k]);
        if (a->cfg.method == AVERAGER_MOSHPIT)
                all = coll_n_connected(a->coll) + 1 >= a->cfg.coll.n_members;
        a->settled = all || now - a->started_ns >= (uint64_t)a->cfg.coll.join_timeout_ms * 1000000ull;
        return a->settled;
}

static bool due(Averager *a, uint64_t now) {
        if (atomic_load(&a->requested) > a->round_ticket)
                return true; /* asked for: now, settled links or not */
        if (!links_settled(a, now))
                return false;
        if (a->cfg.interval_steps)
                return atomic_load(&a->steps) - a->steps_at_last >= a->cfg.interval_steps;
        return now >= a->next_due_ns;
}

static void *averager_main(void *arg) {
        Averager *a = arg;
        a->started_ns = now_ns();
        a->next_due_ns = a->started_ns + (uint64_t)a->cfg.interval_ms * 1000000ull;
        while (!atomic_load(&a->stop)) {
                coll_run(a->coll, 5);
                uint64_t now = now_ns();
                unsigned connected = coll_n_connected(a->coll);
                if (connected != a->stats.connected) { /* only this thread writes it */
                        pthread_mutex_lock(&a->lock);
                        a->stats.connected = connected;
                        pthread_mutex_unlock(&a->lock);
                }
                switch (atomic_load(&a->state)) {
                case AV_IDLE:
                        if (due(a, now)) {
                                a->round_start_ns = now;
                                a->round_ticket = atomic_load(&a->requested);
                                atomic_store(&a->state, AV_WANT);
                        }
                        break;
                case AV_SNAPPED: {
                        bool asked = a->round_ticket > a->delta_ticket; /* a ticket not served yet */
                        /* a requested round is a last one (see averager_request) */
                        coll_set_patience(a->coll, asked ? atomic_load(&a->patience_ms) : 0, asked);
                        int r = start_rounds(a);
                        coll_set_patience(a->coll, 0, false);
                        if (r < 0) { /* nothing to hand back: the next round tries again */
                                for (unsigned i = 0; i < a->n_rd; i++)
                                        coll_round_free(a->rd[i]);
                                a->n_rd = 0;
                                pthread_mutex_lock(&a->lock);
                                a->stats.rounds_failed++;
                                a->stats.last_error = r;
                                pthread_mutex_unlock(&a->lock);
                                a->next_due_ns = now + (uint64_t)a->cfg.interval_ms * 1000000ull;
                                a->steps_at_last = atomic_load(&a->steps);
                                a->delta_ticket = a->round_ticket;
                                atomic_store(&a->done, a->round_ticket); /* nothing to hand back */
                                atomic_store(&a->state, AV_IDLE);
                        } else
                                atomic_store(&a->state, AV_RUNNING);
                        break;
                }
                case AV_RUNNING:
                        if (!rounds_finished(a) && atomic_load(&a->requested) > a->round_ticket &&
                            rounds_joining(a)) {
                                /* A last round is asked for while this one still waits for
                                 * members: those that finished training first are in their
                                 * last round already and join no other, so it would only
                                 * time out. Give it up (nothing to hand back) and start
                                 * the last one at once. */
                                for (unsigned i = 0; i < a->n_rd; i++)
                                        coll_round_free(a->rd[i]);
                                a->n_rd = 0;
                                a->delta_ticket = a->round_ticket;
                                atomic_store(&a->done, a->round_ticket);
                                atomic_store(&a->state, AV_IDLE);
                        } else if (rounds_finished(a)) {
                                finish_rounds(a, now);
                                a->next_due_ns = now + (uint64_t)a->cfg.interval_ms * 1000000ull;
                                a->steps_at_last = atomic_load(&a->steps);
                                a->delta_ticket = a->round_ticket;
                                atomic_store(&a->state, AV_DELTA);
                        }
                        break;
                default: /* WANT, DELTA: the compute thread's move */
                        break;
                }
        }
        return NULL;
}

int averager_start(Averager *a) {
        if (a->started)
                return -EALREADY;
        int r = pthread_create(&a->thread, NULL, averager_main, a);
        if (r != 0)
                return -r;
        a->started = true;
        return 0;
}

_simd_clones_ static void add_f32(float *restrict w, const float *restrict d, size_t n) {
        for (size_t i = 0; i < n; i++)
                w[i] += d[i];
}

int averager_sync(Averager *a, float *params, uint64_t samples) {
        int done = 0;
        atomic_fetch_add(&a->steps, 1);
        a->samples += samples;
        switch (atomic_load(&a->state)) {
        case AV_DELTA:
                add_f32(params, a->delta, a->cfg.len);
                atomic_store(&a->done, a->delta_ticket);
                atomic_store(&a->state, AV_IDLE);
                done = AVERAGER_APPLIED;
                break;
        case AV_WANT:
                memcpy(a->snapshot, params, a->cfg.len * sizeof *params);
                /* weighted by samples trained since the last snapshot */
                a->weight = a->samples ? (double)a->samples : 1.0;
                a->samples = 0;
                atomic_store(&a->state, AV_SNAPPED);
                done = AVERAGER_SNAPSHOT;
                break;
        }
        return done;
}

void averager_get_stats(Averager *a, AveragerStats *ret) {
        pthread_mutex_lock(&a->lock);
        *ret = a->stats;
        pthread_mutex_unlock(&a->lock);
}

uint64_t averager_request(Averager *a, unsigned join_ms) {
        atomic_store(&a->patience_ms, join_ms);
        return atomic_fetch_add(&a->requested, 1) + 1;
}

uint64_t averager_done_ticket(Averager *a) {
        return atomic_load(&a->done);
}
