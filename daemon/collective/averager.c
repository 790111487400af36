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
 *
 * With an outer optimizer the compute thread owns the anchor and momentum.
 * A round averages the parameters as without one, but leaves avg(params)
 * in delta (NaN where no piece completed, the sign of "unchanged": a
 * complete piece is always finite), and at DELTA the compute thread takes
 * the outer step on the pseudo-gradient anchor - avg(params). That is
 * avg(anchor - params) while the members' anchors agree; when they do not
 * (a member left out of a round, or back from an old checkpoint), it pulls
 * them together instead of keeping them apart for ever.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "averager.h"
#include "util/time-util.h"

enum { AV_IDLE, AV_WANT, AV_SNAPPED, AV_RUNNING, AV_DELTA };

/* Where this node sits in one of its rings, and whom it meets there. */
typedef struct RingPlace {
        RingGrid grid;
        unsigned pos;           /* its position in the ring's members */
        unsigned *near, n_near; /* the members of its groups in every dimension, itself too */
} RingPlace;

struct Averager {
        AveragerConfig cfg;
        AveragerRing *rings;
        RingPlace *places; /* one per ring */
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
        atomic_uint last_turn;   /* ... and its place among the last rounds (averager_request) */

        float *snapshot, *delta;
        float *feedback; /* error_feedback: the int8 errors carried, averaging thread only */
        double weight;
        uint64_t samples; /* compute thread only */
        float *anchor, *momentum; /* outer optimizer: compute thread only */
        bool anchored;
        atomic_bool last; /* the round asked for is a requested (last) one: whole, of parameters (set with WANT) */
        atomic_uint join_left;   /* join rounds still to take (averager_join) */
        atomic_uint_fast64_t join_since_ns; /* when averager_join() asked */
        atomic_bool join_round;  /* the round asked for is one of them (set with WANT) */
        atomic_bool peers_up;    /* every ring has another member connected (Moshpit: any member) */

        /* averaging thread only */
        CollRound *rd[COLL_MAX_MEMBERS];
        size_t rd_off[COLL_MAX_MEMBERS]; /* where each round's values sit in the slab */
        unsigned n_rd;
        bool outer_round; /* the rounds in flight average pseudo-gradients */
        bool keep_average; /* ... or are last ones: delta holds the average itself (outer, or last, rounds) */
        unsigned round_group; /* the smallest group of the rounds in flight */
        uint64_t next_due_ns, steps_at_last, fragment_round, round_start_ns, started_ns;
        unsigned moshpit_dim; /* the grid dimension of the next regular Moshpit round */
        bool settled;

        /* an optimizer's state for joiners: the compute thread's, named once */
        float *moments;
        unsigned moment_arrays;
        const uint64_t *opt_steps;
        /* averager_on_write(): compute thread only */
        void (*on_write)(void *ud);
        void *on_write_ud;
        atomic_bool has_optimizer;
        atomic_int give;  /* GIVE_NONE -> WANT (averager) -> FILLED or ZERO (compute) -> NONE (averager) */
        uint8_t *give_buf;
        unsigned give_member, give_ring;
        atomic_int fetch; /* FETCH_NONE -> WANT (compute) -> RUNNING, DONE (averager) -> NONE (compute) */
        float *incoming;
        int fetch_result;
        uint64_t fetch_steps;
        unsigned fetch_member;
        uint64_t state_sent, state_received; /* coll_state_traffic() counted in the stats */

        pthread_mutex_t lock; /* stats */
        AveragerStats stats;
};

enum { GIVE_NONE, GIVE_WANT, GIVE_FILLED, GIVE_ZERO };
enum { FETCH_NONE, FETCH_WANT, FETCH_RUNNING, FETCH_DONE };

void averager_config_defaults(AveragerConfig *c) {
        *c = (AveragerConfig){ .method = AVERAGER_RING, .interval_ms = 5000 };
        coll_config_defaults(&c->coll);
}

static bool outer_valid(const AveragerOuter *o) {
        return !o->enabled || (isfinite(o->lr) && o->lr > 0 && o->lr <= 10 && o->momentum >= 0 && o->momentum < 1);
}

/* Every ring's grid, this node's position in it and the members it meets
 * there; with ring averaging, links go to those alone. */
static int place_rings(Averager *a) {
        unsigned width = a->cfg.group_size ? a->cfg.group_size : COLL_MAX_MEMBERS, self = a->cfg.coll.self;
        for (unsigned i = 0; i < a->cfg.n_rings; i++) {
                const AveragerRing *g = &a->rings[i];
                RingPlace *p = &a->places[i];
                unsigned pos[COLL_MAX_MEMBERS];
                p->pos = UINT32_MAX;
                for (unsigned k = 0; k < g->n; k++)
                        if (g->members[k] == self)
                                p->pos = k;
                if (p->pos == UINT32_MAX || ring_grid(g->n, width, &p->grid) < 0)
                        return -EINVAL;
                p->near = calloc(g->n, sizeof *p->near);
                if (!p->near)
                        return -ENOMEM;
                for (unsigned d = 0; d < p->grid.dims; d++)
                        for (unsigned k = 0, n = ring_grid_group(&p->grid, p->pos, d, pos); k < n; k++)
                                if (d == 0 || pos[k] != p->pos) /* itself once */
                                        p->near[p->n_near++] = g->members[pos[k]];
        }
        if (a->cfg.method != AVERAGER_RING)
                return 0;
        for (unsigned m = 0; m < a->cfg.coll.n_members; m++)
                coll_want(a->coll, m, false);
        for (unsigned i = 0; i < a->cfg.n_rings; i++)
                for (unsigned k = 0; k < a->places[i].n_near; k++)
                        coll_want(a->coll, a->places[i].near[k], true);
        return 0;
}

/* ---- an optimizer's state for joiners ------------------------------------ */

static unsigned state_arrays(const Averager *a) {
        return a->moment_arrays + (a->anchor ? 1 : 0);
}

/* Averaging thread: a joiner asks for the state of one of our rings. One
 * copy is made at a time, and at most AVERAGER_MAX_GIVING are sent. */
static void on_state_ask(void *ud, unsigned member, const CollStateAsk *m) {
        Averager *a = ud;
        unsigned ring = 0;
        int error = 0;
        while (ring < a->cfg.n_rings && a->rings[ring].group != m->group)
                ring++;
        if (!atomic_load(&a->has_optimizer))
                error = -ENODATA;
        else if (ring == a->cfg.n_rings || m->values != a->rings[ring].len || m->arrays != state_arrays(a))
                error = -EINVAL;
        else if (atomic_load(&a->give) != GIVE_NONE || coll_state_giving(a->coll) >= AVERAGER_MAX_GIVING)
                error = -EBUSY;
        else if (!(a->give_buf = malloc(coll_state_bytes(m->values, m->arrays))))
                error = -ENOMEM;
        if (error) {
                (void)coll_state_refuse(a->coll, member, m->group, error);
                return;
        }
        a->give_member = member;
        a->give_ring = ring;
        atomic_store(&a->give, GIVE_WANT);
}

static bool all_zero(const float *const *arrays, unsigned n, size_t values) {
        for (unsigned k = 0; k < n; k++)
                for (size_t i = 0; i < values; i++)
                        if (arrays[k][i] != 0.0f)
                                return false;
        return true;
}

/* Compute thread: the copy asked for, between two steps; none before the
 * first step, when every moment is still zero (the joiner is told so). */
static void fill_gift(Averager *a) {
        const AveragerRing *g = &a->rings[a->give_ring];
        const float *arrays[COLL_STATE_MAX_ARRAYS];
        unsigned n = 0;
        for (; n < a->moment_arrays; n++)
                arrays[n] = a->moments + n * a->cfg.len + g->off;
        if (a->anchor)
                arrays[n++] = a->momentum + g->off;
        if (*a->opt_steps == 0 && all_zero(arrays, n, g->len)) {
                atomic_store(&a->give, GIVE_ZERO);
                return;
        }
        coll_state_fill(a->give_buf, g->group, arrays, n, g->len, *a->opt_steps);
        atomic_store(&a->give, GIVE_FILLED);
}

/* Every ring's state from one of its members, into incoming. */
static void fetch_start(Averager *a) {
        int r = 0;
        for (unsigned i = 0; r == 0 && i < a->cfg.n_rings; i++) {
                const AveragerRing *g = &a->rings[i];
                float *dst[COLL_STATE_MAX_ARRAYS];
                for (unsigned k = 0; k < state_arrays(a); k++)
                        dst[k] = a->incoming + k * a->cfg.len + g->off;
                r = coll_state_fetch(a->coll, g->group, g->members, g->n, dst, state_arrays(a), g->len);
        }
        if (r < 0) {
                coll_state_forget(a->coll);
                a->fetch_result = r;
                atomic_store(&a->fetch, FETCH_DONE);
        } else
                atomic_store(&a->fetch, FETCH_RUNNING);
}

/* Done once every ring's is: the first failure, or the most steps. */
static void fetch_check(Averager *a) {
        uint64_t most = 0;
        unsigned from = 0;
        int result = 0;
        for (unsigned i = 0; i < a->cfg.n_rings; i++) {
                uint64_t steps = 0;
                unsigned member = 0;
                int r = coll_state_fetched(a->coll, a->rings[i].group, &steps, &member);
                if (r == -EINPROGRESS)
                        return;
                if (r < 0 && result == 0)
                        result = r;
                if (r == 0 && steps >= most) {
                        most = steps;
                        from = member;
                }
        }
        coll_state_forget(a->coll);
        a->fetch_result = result;
        a->fetch_steps = most;
        a->fetch_member = from;
        atomic_store(&a->fetch, FETCH_DONE);
}

/* Averaging thread: the states' bytes, given and taken, count as the
 * rounds' do. */
static void state_traffic(Averager *a) {
        uint64_t sent, received;
        coll_state_traffic(a->coll, &sent, &received);
        if (sent == a->state_sent && received == a->state_received)
                return;
        pthread_mutex_lock(&a->lock);
        a->stats.bytes_sent += sent - a->state_sent;
        a->stats.bytes_received += received - a->state_received;
        pthread_mutex_unlock(&a->lock);
        a->state_sent = sent;
        a->state_received = received;
}

/* Averaging thread: a filled copy goes out, or word that ours is zero; a
 * fetch starts or is checked. */
static void state_step(Averager *a) {
        int give = atomic_load(&a->give);
        if (give == GIVE_FILLED || give == GIVE_ZERO) {
                const AveragerRing *g = &a->rings[a->give_ring];
                if (give == GIVE_ZERO) {
                        (void)coll_state_give_zero(a->coll, a->give_member, g->group);
                        free(a->give_buf);
                } else
                        (void)coll_state_give(a->coll, a->give_member, a->give_buf, g->group, g->len,
                                              state_arrays(a));
                a->give_buf = NULL;
                atomic_store(&a->give, GIVE_NONE);
        }
        int f = atomic_load(&a->fetch);
        if (f == FETCH_WANT)
                fetch_start(a);
        else if (f == FETCH_RUNNING)
                fetch_check(a);
        state_traffic(a);
}

void averager_set_optimizer(Averager *a, float *moments, unsigned arrays, const uint64_t *steps) {
        if (arrays == 0 || arrays + (a->anchor ? 1 : 0) > COLL_STATE_MAX_ARRAYS)
                return;
        a->moments = moments;
        a->moment_arrays = arrays;
        a->opt_steps = steps;
        atomic_store(&a->has_optimizer, true);
}

int averager_fetch_state(Averager *a) {
        if (!atomic_load(&a->has_optimizer))
                return -ENODATA;
        if (atomic_load(&a->fetch) != FETCH_NONE)
                return -EBUSY;
        a->incoming = malloc(state_arrays(a) * a->cfg.len * sizeof(float));
        if (!a->incoming)
                return -ENOMEM;
        atomic_store(&a->fetch, FETCH_WANT);
        return 0;
}

int averager_fetched_state(Averager *a, const float **ret, uint64_t *ret_steps, unsigned *ret_member) {
        if (atomic_load(&a->fetch) != FETCH_DONE)
                return -EINPROGRESS;
        if (a->fetch_result == 0) {
                *ret = a->incoming;
                *ret_steps = a->fetch_steps;
                *ret_member = a->fetch_member;
        }
        return a->fetch_result;
}

void averager_fetch_done(Averager *a) {
        if (atomic_load(&a->fetch) != FETCH_DONE)
                return;
        a->incoming = mfree(a->incoming);
        atomic_store(&a->fetch, FETCH_NONE);
}

int averager_new(const AveragerConfig *cfg, Averager **ret) {
        if (cfg->len == 0 || (cfg->method == AVERAGER_RING && cfg->n_rings == 0) ||
            cfg->n_rings > COLL_MAX_MEMBERS || (cfg->interval_ms == 0 && cfg->interval_steps == 0) ||
            !outer_valid(&cfg->outer) || cfg->fragments > AVERAGER_MAX_FRAGMENTS ||
            (cfg->fragments > 1 && cfg->method != AVERAGER_RING) || cfg->group_size == 1 ||
            cfg->group_size > COLL_MAX_MEMBERS)
                return -EINVAL;
        for (unsigned i = 0; i < cfg->n_rings; i++)
                if (cfg->rings[i].off > cfg->len || cfg->rings[i].len > cfg->len - cfg->rings[i].off ||
                    cfg->rings[i].n > AVERAGER_RING_MAX || cfg->rings[i].group >= 1u << 20)
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
        a->places = calloc(MAX(cfg->n_rings, 1u), sizeof *a->places);
        a->snapshot = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
        a->delta = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
        int r = -ENOMEM;
        if (!a->rings || !a->places || !a->snapshot || !a->delta)
                goto fail;
        if (cfg->outer.enabled) {
                a->anchor = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
                a->momentum = aligned_alloc(64, ALIGN_TO(cfg->len * sizeof(float), 64));
                if (!a->anchor || !a->momentum)
                        goto fail;
                memset(a->momentum, 0, cfg->len * sizeof(float));
        }
        if (cfg->error_feedback && cfg->coll.payload == COLL_PAYLOAD_INT8) {
                a->feedback = calloc(cfg->len, sizeof(float));
                if (!a->feedback)
                        goto fail;
        }
        if (cfg->n_rings)
                memcpy(a->rings, cfg->rings, cfg->n_rings * sizeof *a->rings);
        a->cfg.rings = a->rings;
        r = coll_new(&cfg->coll, &a->coll);
        if (r < 0)
                goto fail;
        r = place_rings(a);
        if (r < 0)
                goto fail;
        coll_set_state_hook(a->coll, on_state_ask, a);
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
        free(a->anchor);
        free(a->momentum);
        free(a->feedback);
        free(a->give_buf);
        free(a->incoming);
        for (unsigned i = 0; a->places && i < a->cfg.n_rings; i++)
                free(a->places[i].near);
        free(a->places);
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

/* Moshpit: the members whose cells differ from ours only in coordinate dim. */
static unsigned moshpit_members(const Averager *a, unsigned dim, unsigned *out) {
        const MoshpitGrid *g = &a->cfg.grid;
        uint64_t key = moshpit_grid_group_key(g, a->cfg.coll.self, dim);
        unsigned n = 0;
        for (unsigned m = 0; m < a->cfg.coll.n_members && n < COLL_MAX_MEMBERS; m++)
                if (moshpit_grid_group_key(g, m, dim) == key)
                        out[n++] = m;
        return n;
}

/* The values of ring g a round syncs: all of them, or with fragments the
 * k-th of equal parts, under a group id of its own (k + 1 in bits 24-30;
 * the top bit is Moshpit's). k < 0: the whole ring under its own id. */
static void ring_part(const Averager *a, const AveragerRing *g, int k, uint32_t *group, size_t *off, size_t *len) {
        size_t f = a->cfg.fragments;
        *group = g->group;
        *off = g->off;
        *len = g->len;
        if (k < 0 || f <= 1)
                return;
        size_t lo = g->len * (size_t)k / f, hi = g->len * (size_t)(k + 1) / f;
        *group = (uint32_t)(k + 1) << 24 | g->group;
        *off = g->off + lo;
        *len = hi - lo;
}

/* Round rd covers the slab's values from off: its averages land in delta as
 * they complete (finish_rounds() subtracts), its int8 errors stay in
 * feedback from round to round. */
static int round_outputs(Averager *a, CollRound *rd, size_t off) {
        int r = coll_round_set_output(rd, a->delta + off);
        if (r < 0 || !a->feedback)
                return r;
        return coll_round_set_feedback(rd, a->feedback + off);
}

/* Moshpit: a round along one dimension of the grid, in turn (the last
 * rounds go through every dimension once, from the first, so on a full
 * grid they leave every member with one model), over our group there,
 * under the group id top bit | dim << 16 | key (the key is our cell with
 * coordinate dim at 0, below 2^16). The id names no round of ours: the
 * group's leader numbers its rounds (one past the highest any member
 * reports), as a ring's, so a member that restarted or came late is taken
 * in as soon as the others average along its dimension. */
static int start_moshpit(Averager *a) {
        const MoshpitGrid *g = &a->cfg.grid;
        bool last = atomic_load(&a->last);
        unsigned dim = last ? atomic_load(&a->last_turn) % g->dims : a->moshpit_dim;
        unsigned members[COLL_MAX_MEMBERS], n = moshpit_members(a, dim, members);
        uint64_t key = moshpit_grid_group_key(g, a->cfg.coll.self, dim);
        uint32_t group = 0x80000000u | (uint32_t)dim << 16 | (uint32_t)key;
        if (!last)
                a->moshpit_dim = (dim + 1) % g->dims;
        a->rd_off[0] = 0;
        a->round_group = n;
        int r = coll_round_start(a->coll, group, members, n, a->snapshot, a->cfg.len, a->weight, &a->rd[0]);
        if (r < 0)
                return r;
        a->n_rd = 1;
        return round_outputs(a, a->rd[0], 0);
}

static void fill_f32(float *d, float v, size_t n) {
        for (size_t i = 0; i < n; i++)
                d[i] = v;
}

/* Ring i's round: its group in this turn's dimension, the values of
 * fragment k (k < 0: all). A member alone in its group sits it out. */
static int start_ring(Averager *a, unsigned i, int k, uint64_t turn) {
        const AveragerRing *g = &a->rings[i];
        const RingPlace *p = &a->places[i];
        unsigned pos[COLL_MAX_MEMBERS], members[COLL_MAX_MEMBERS], dim = (unsigned)(turn % p->grid.dims);
        unsigned n = ring_grid_group(&p->grid, p->pos, dim, pos);
        uint32_t group;
        size_t off, len;

        ring_part(a, g, k, &group, &off, &len);
        if (len == 0 || (p->grid.dims > 1 && n < 2))
                return 0;
        for (unsigned j = 0; j < n; j++)
                members[j] = g->members[pos[j]];
        if (p->grid.dims > 1)
                group |= (dim + 1) << 20; /* bits 20-23; the ring's own id is below */
        a->round_group = MIN(a->round_group, n);
        int r = coll_round_start(a->coll, group, members, n, a->snapshot + off, len, a->weight, &a->rd[a->n_rd]);
        if (r < 0)
                return r;
        a->rd_off[a->n_rd] = off;
        return round_outputs(a, a->rd[a->n_rd++], off);
}

static int start_rounds(Averager *a) {
        a->n_rd = 0;
        a->round_group = UINT32_MAX;
        a->outer_round = a->cfg.outer.enabled && !atomic_load(&a->last) && !atomic_load(&a->join_round);
        a->keep_average = a->outer_round || atomic_load(&a->last);
        /* what no round covers: a delta of 0, or for an outer step and a
         * last round "unchanged" */
        fill_f32(a->delta, a->keep_average ? NAN : 0.0f, a->cfg.len);
        if (a->cfg.method == AVERAGER_MOSHPIT)
                return start_moshpit(a);
        /* the fragment in turn and the grid dimension of wide rings: each
         * fragment goes through every dimension; a last round is whole */
        bool whole = atomic_load(&a->last);
        uint64_t f = MAX(a->cfg.fragments, 1u), t = whole ? atomic_load(&a->last_turn) : a->fragment_round++;
        int k = f > 1 && !whole ? (int)(t % f) : -1;
        uint64_t turn = whole ? t : t / f;
        for (unsigned i = 0; i < a->cfg.n_rings; i++) {
                int r = start_ring(a, i, k, turn);
                if (r < 0)
                        return r;
        }
        return 0;
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

/* The rounds wrote the averages into delta: delta = avg - snapshot where a
 * piece was averaged, 0 elsewhere; with keep (an outer step, a last round)
 * the average stays, NaN ("unchanged") elsewhere. */
static size_t round_delta(const CollRound *rd, float *delta, const float *snapshot, bool keep) {
        size_t off, len, values = 0;
        bool done;
        for (size_t k = 0; coll_round_piece(rd, k, &off, &len, &done) == 0; k++) {
                if (done && !keep)
                        sub_f32(delta + off, snapshot + off, len);
                else if (!done)
                        fill_f32(delta + off, keep ? NAN : 0.0f, len);
                values += done ? len : 0;
        }
        return values;
}

static void finish_rounds(Averager *a, uint64_t now) {
        AveragerStats s;
        size_t values = 0;
        int error = 0;
        unsigned smallest = UINT32_MAX, most = 0;

        pthread_mutex_lock(&a->lock);
        s = a->stats;
        for (unsigned i = 0; i < a->n_rd; i++) {
                CollRoundInfo info;
                size_t off = a->rd_off[i];
                coll_round_info(a->rd[i], &info);
                values += round_delta(a->rd[i], a->delta + off, a->snapshot + off, a->keep_average);
                if (info.state != COLL_ROUND_DONE && error != -EBADE) /* another model: the reason to tell */
                        error = info.error;
                smallest = MIN(smallest, info.participants);
                most = MAX(most, info.participants);
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
        s.last_group = a->round_group == UINT32_MAX ? 0 : a->round_group;
        s.last_round_ns = now - a->round_start_ns;
        /* no other member of its groups took part: its delta is 0, nothing was averaged */
        if (!error && most == 1 && s.last_group > 1)
                s.rounds_alone++;
        else if (!error && most > 1)
                s.averaged = (AveragerRound){ .realtime_us = now_realtime_usec(), .duration_ns = s.last_round_ns,
                                              .participants = s.last_participants, .group = s.last_group };
        a->stats = s;
        pthread_mutex_unlock(&a->lock);
}

/* Before the first round, give the links time to come up: until every
 * member we average with is connected, or for one join timeout. After that
 * a missing member is one that is down, and rounds go on without it. */
static bool all_linked(const Averager *a) {
        if (a->cfg.method == AVERAGER_MOSHPIT)
                return coll_n_connected(a->coll) + 1 >= a->cfg.coll.n_members;
        for (unsigned i = 0; i < a->cfg.n_rings; i++)
                for (unsigned k = 0; k < a->places[i].n_near; k++)
                        if (!coll_connected(a->coll, a->places[i].near[k]))
                                return false;
        return true;
}

static bool links_settled(Averager *a, uint64_t now) {
        if (!a->settled)
                a->settled = all_linked(a) || now - a->started_ns >= (uint64_t)a->cfg.coll.join_timeout_ms * 1000000ull;
        return a->settled;
}

static bool due(Averager *a, uint64_t now) {
        if (atomic_load(&a->requested) > a->round_ticket)
                return true; /* asked for: now, settled links or not */
        /* joining: the swarm's parameters before anything else, from every
         * member it meets once linked with all, or after a while from
         * whoever of each ring is up (nodes started together then start
         * together, and the round's leader is one all of them see) */
        if (atomic_load(&a->join_left) && atomic_load(&a->peers_up) &&
            (all_linked(a) || now - atomic_load(&a->join_since_ns) >= AVERAGER_JOIN_GATHER_MS * 1000000ull))
                return true;
        if (!links_settled(a, now))
                return false;
        if (a->cfg.interval_steps)
                return atomic_load(&a->steps) - a->steps_at_last >= a->cfg.interval_steps;
        return now >= a->next_due_ns;
}

/* Whether every ring of this node has another member it meets connected. */
static bool ring_peers_up(const Averager *a) {
        if (a->cfg.method == AVERAGER_MOSHPIT)
                return coll_n_connected(a->coll) > 0;
        for (unsigned i = 0; i < a->cfg.n_rings; i++) {
                bool up = false;
                const RingPlace *p = &a->places[i];
                for (unsigned k = 0; k < p->n_near && !up; k++)
                        up = p->near[k] != a->cfg.coll.self && coll_connected(a->coll, p->near[k]);
                if (!up)
                        return false;
        }
        return true;
}

/* A join round is over (applied, failed or given up): one fewer to take. */
static void join_taken(Averager *a) {
        if (!atomic_exchange(&a->join_round, false))
                return;
        unsigned left = atomic_load(&a->join_left); /* averager_join_cancel() may have set 0 */
        while (left > 0 && !atomic_compare_exchange_weak(&a->join_left, &left, left - 1))
                ;
}

static void *averager_main(void *arg) {
        Averager *a = arg;
        a->started_ns = now_ns();
        a->next_due_ns = a->started_ns + (uint64_t)a->cfg.interval_ms * 1000000ull;
        while (!atomic_load(&a->stop)) {
                coll_run(a->coll, 5);
                state_step(a);
                uint64_t now = now_ns();
                unsigned connected = coll_n_connected(a->coll);
                CollLoss lost = coll_loss(a->coll), refused = coll_refusals(a->coll), diverged = coll_diverged(a->coll);
                CollLoss unready = coll_unready(a->coll);
                CollForeign foreign = coll_foreign(a->coll);
                atomic_store(&a->peers_up, ring_peers_up(a));
                /* only this thread writes them */
                if (connected != a->stats.connected || lost.count != a->stats.lost.count ||
                    refused.count != a->stats.refused.count || diverged.count != a->stats.diverged.count ||
                    foreign.count != a->stats.foreign.count || unready.count != a->stats.unready.count) {
                        NetStats ns;
                        net_get_stats(coll_net(a->coll), &ns);
                        pthread_mutex_lock(&a->lock);
                        a->stats.connected = connected;
                        a->stats.links_in = ns.links_in;
                        a->stats.lost = lost;
                        a->stats.refused = refused;
                        a->stats.diverged = diverged;
                        a->stats.unready = unready;
                        a->stats.foreign = foreign;
                        pthread_mutex_unlock(&a->lock);
                }
                switch (atomic_load(&a->state)) {
                case AV_IDLE:
                        if (due(a, now)) {
                                a->round_start_ns = now;
                                a->round_ticket = atomic_load(&a->requested);
                                atomic_store(&a->last, a->round_ticket > a->delta_ticket);
                                atomic_store(&a->join_round, !atomic_load(&a->last) && atomic_load(&a->join_left));
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
                                join_taken(a);
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
                                join_taken(a);
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

/* The outer step where the round averaged the parameters (avg in delta,
 * NaN elsewhere): the anchor takes a step on the pseudo-gradient anchor -
 * avg, and params become the new anchor plus what training did since the
 * snapshot. */
static void outer_step(Averager *a, float *params) {
        const float lr = a->cfg.outer.lr, mu = a->cfg.outer.momentum;
        const bool nesterov = a->cfg.outer.nesterov;
        for (size_t i = 0; i < a->cfg.len; i++) {
                float avg = a->delta[i];
                if (isnan(avg))
                        continue;
                float g = a->anchor[i] - avg;
                float m = mu * a->momentum[i] + g;
                float anchor = a->anchor[i] - lr * (nesterov ? g + mu * m : m);
                a->momentum[i] = m;
                params[i] += anchor - a->snapshot[i];
                a->anchor[i] = anchor;
        }
}

/* A last round averaged the parameters (avg in delta, NaN elsewhere): they
 * become the average itself, bit for bit the same at every member (snapshot
 * + (avg - snapshot) may round off it), and so does the anchor. The caller
 * waits for a last round, so its parameters are still the snapshot; where
 * they are not, they keep what training did since. */
static void apply_average(Averager *a, float *params) {
        for (size_t i = 0; i < a->cfg.len; i++) {
                float avg = a->delta[i];
                if (isnan(avg))
                        continue;
                params[i] = params[i] == a->snapshot[i] ? avg : params[i] + (avg - a->snapshot[i]);
                if (a->anchor)
                        a->anchor[i] = avg;
        }
}

/* A join round averaged the parameters: params moved by delta, and the
 * anchor becomes the average (snapshot + delta). */
static void apply_delta(Averager *a, float *params) {
        add_f32(params, a->delta, a->cfg.len);
        if (a->anchor)
                for (size_t i = 0; i < a->cfg.len; i++)
                        a->anchor[i] = a->snapshot[i] + a->delta[i];
}

int averager_sync(Averager *a, float *params, uint64_t samples) {
        atomic_fetch_add(&a->steps, 1);
        a->samples += samples;
        return averager_serve(a, params);
}

void averager_on_write(Averager *a, void (*fn)(void *ud), void *ud) {
        a->on_write = fn;
        a->on_write_ud = ud;
}

int averager_serve(Averager *a, float *params) {
        int done = 0;
        if (atomic_load(&a->give) == GIVE_WANT)
                fill_gift(a);
        if (a->anchor && !a->anchored) { /* no state set: the parameters as they are now */
                memcpy(a->anchor, params, a->cfg.len * sizeof *params);
                a->anchored = true;
        }
        switch (atomic_load(&a->state)) {
        case AV_DELTA:
                if (a->on_write)
                        a->on_write(a->on_write_ud);
                if (atomic_load(&a->last))
                        apply_average(a, params);
                else if (a->anchor && !atomic_load(&a->join_round))
                        outer_step(a, params);
                else
                        apply_delta(a, params);
                join_taken(a);
                atomic_store(&a->done, a->delta_ticket);
                atomic_store(&a->state, AV_IDLE);
                done = AVERAGER_APPLIED;
                break;
        case AV_WANT:
                memcpy(a->snapshot, params, a->cfg.len * sizeof *params);
                /* weighted by samples trained since the last snapshot;
                 * joining, next to nothing */
                a->weight = atomic_load(&a->join_round) ? AVERAGER_JOIN_WEIGHT : a->samples ? (double)a->samples : 1.0;
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

uint64_t averager_request(Averager *a, unsigned join_ms, unsigned turn) {
        atomic_store(&a->patience_ms, join_ms);
        atomic_store(&a->last_turn, turn);
        return atomic_fetch_add(&a->requested, 1) + 1;
}

uint64_t averager_done_ticket(Averager *a) {
        return atomic_load(&a->done);
}

unsigned averager_last_rounds(const Averager *a) {
        unsigned n = 1;
        if (a->cfg.method == AVERAGER_MOSHPIT)
                return MAX(a->cfg.grid.dims, 1u);
        for (unsigned i = 0; a->cfg.method == AVERAGER_RING && i < a->cfg.n_rings; i++)
                n = MAX(n, a->places[i].grid.dims);
        return n;
}

unsigned averager_join(Averager *a) {
        unsigned n = a->cfg.method == AVERAGER_RING && a->cfg.fragments > 1 ? a->cfg.fragments : 1;
        atomic_store(&a->join_since_ns, now_ns());
        atomic_store(&a->join_left, n);
        return n;
}

bool averager_joining(const Averager *a) {
        return atomic_load(&a->join_left) > 0 || atomic_load(&a->join_round);
}

bool averager_peers_up(const Averager *a) {
        return atomic_load(&a->peers_up);
}

void averager_join_cancel(Averager *a) {
        atomic_store(&a->join_left, 0);
}

int averager_set_outer_state(Averager *a, const float *anchor, const float *momentum) {
        if (!a->anchor)
                return -EINVAL;
        if (anchor)
                memcpy(a->anchor, anchor, a->cfg.len * sizeof *anchor);
        if (momentum)
                memcpy(a->momentum, momentum, a->cfg.len * sizeof *momentum);
        else
                memset(a->momentum, 0, a->cfg.len * sizeof *a->momentum);
        a->anchored = true;
        return 0;
}

int averager_outer_state(const Averager *a, const float **ret_anchor, const float **ret_momentum) {
        if (!a->anchor)
                return -EINVAL;
        if (!a->anchored)
                return -ENODATA;
        *ret_anchor = a->anchor;
        *ret_momentum = a->momentum;
        return 0;
}
