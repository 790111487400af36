/* collective/coll-state.c — an optimizer's state handed to a member that
 * joins: the joiner asks one member of a group at a time (STATE_ASK), the
 * member's owner hands it over (coll_state_give), refuses (STATE_NO), or
 * says it is zero (STATE_NO, error 0: no step taken, nothing to send), and
 * the pieces travel as TENSOR frames of phase COLL_STATE.
 *
 * Always float32, whatever the rounds' payload: Adam's second moment spans
 * many orders of magnitude within a block, and int8's block scale would
 * round its small values to 0 (an update of lr * m / eps); a state is sent
 * at a join, not every round. Its bytes count with the rounds'. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coll-internal.h"
#include "util/macro.h"
#include "util/time-util.h"

#define PIECE_STRIDE (COLL_PIECE_HEADER + 4 * (size_t)COLL_STATE_PIECE_VALUES)

static size_t n_pieces(size_t total) {
        return (total + COLL_STATE_PIECE_VALUES - 1) / COLL_STATE_PIECE_VALUES;
}

static uint32_t piece_count(size_t total, size_t i) {
        return (uint32_t)MIN((size_t)COLL_STATE_PIECE_VALUES, total - i * COLL_STATE_PIECE_VALUES);
}

/* Values [first, first + count) of the arrays laid end to end, to or from
 * the contiguous v. */
static void gather(float *v, const float *const *arrays, size_t values, size_t first, size_t count) {
        while (count) {
                size_t k = first / values, off = first % values, m = MIN(count, values - off);
                memcpy(v, arrays[k] + off, m * sizeof *v);
                v += m, first += m, count -= m;
        }
}

/* The other way, checking every value: false if one is not finite. */
static bool scatter(float *const *arrays, size_t values, size_t first, const float *v, size_t count) {
        bool ok = true;
        while (count) {
                size_t k = first / values, off = first % values, m = MIN(count, values - off);
                ok &= copy_finite_f32(arrays[k] + off, v, m);
                v += m, first += m, count -= m;
        }
        return ok;
}

/* ---- giving ------------------------------------------------------------- */

size_t coll_state_bytes(size_t values, unsigned arrays) {
        return n_pieces(values * arrays) * PIECE_STRIDE;
}

void coll_state_fill(uint8_t *buf, uint32_t group, const float *const *arrays, unsigned n_arrays, size_t values,
                     uint64_t steps) {
        size_t total = values * n_arrays;
        for (size_t i = 0; i < n_pieces(total); i++) {
                uint8_t *p = buf + i * PIECE_STRIDE;
                uint32_t count = piece_count(total, i);
                coll_piece_encode(&(CollPiece){ .phase = COLL_STATE, .dtype = DTYPE_F32, .group = group,
                                                .index = (uint32_t)i, .count = count, .round = steps },
                                  p);
                gather((float *)(p + COLL_PIECE_HEADER), arrays, values, i * COLL_STATE_PIECE_VALUES, count);
        }
}

static void give_more(Coll *c, Donation *d) {
        while (d->next < d->n_pieces) {
                const Member *m = &c->members[d->member];
                uint32_t bytes = COLL_PIECE_HEADER + 4 * piece_count(d->total, d->next);
                TensorDesc desc;
                int k = -ECONNRESET;
                if (m->up && m->peer == d->peer && (k = tensor_desc_init(&desc, DTYPE_U8, 1, &bytes)) == 0)
                        k = net_send_tensor(c->net, d->peer, d->group, &desc, d->buf + d->next * PIECE_STRIDE,
                                            d->id);
                if (k == -ENOBUFS)
                        return;
                if (k < 0) { /* the joiner is gone: nothing more */
                        d->next = d->n_pieces;
                        return;
                }
                d->next++;
                d->sending++;
                c->state_sent += bytes;
        }
}

/* Done with once every piece is sent or given up. */
static void give_end(Coll *c, unsigned i) {
        Donation *d = &c->donations[i];
        if (d->next < d->n_pieces || d->sending > 0)
                return;
        free(d->buf);
        c->donations[i] = c->donations[--c->n_donations];
}

int coll_state_give(Coll *c, unsigned member, uint8_t *buf, uint32_t group, size_t values, unsigned arrays) {
        int r = 0;
        if (member >= c->n_members || values == 0 || arrays == 0 || arrays > COLL_STATE_MAX_ARRAYS)
                r = -EINVAL;
        else if (!c->members[member].up)
                r = -ENOTCONN;
        else if (c->n_donations == COLL_MAX_DONATIONS)
                r = -EBUSY;
        if (r < 0) {
                free(buf);
                return r;
        }
        Donation *d = &c->donations[c->n_donations++];
        *d = (Donation){ .id = c->next_donation++, .member = member,
                         .peer = c->members[member].peer, .group = group, .buf = buf, .total = values * arrays,
                         .n_pieces = n_pieces(values * arrays) };
        give_more(c, d);
        give_end(c, c->n_donations - 1);
        return 0;
}

static int send_no(Coll *c, unsigned member, uint32_t group, int error) {
        uint8_t buf[COLL_CTL_MAX];
        if (member >= c->n_members || !c->members[member].up)
                return -ENOTCONN;
        size_t n = coll_state_no_encode(&(CollStateNo){ .group = group, .error = error }, buf);
        return net_send_control(c->net, c->members[member].peer, FRAME_CONTROL, buf, n);
}

int coll_state_refuse(Coll *c, unsigned member, uint32_t group, int error) {
        return error < 0 ? send_no(c, member, group, error) : -EINVAL;
}

int coll_state_give_zero(Coll *c, unsigned member, uint32_t group) {
        return send_no(c, member, group, 0);
}

void coll_state_traffic(const Coll *c, uint64_t *ret_sent, uint64_t *ret_received) {
        *ret_sent = c->state_sent;
        *ret_received = c->state_received;
}

unsigned coll_state_giving(const Coll *c) {
        return c->n_donations;
}

void state_on_sent(Coll *c, uint32_t id) {
        for (unsigned i = 0; i < c->n_donations; i++) {
                Donation *d = &c->donations[i];
                if (d->id != id)
                        continue;
                d->sending--;
                give_more(c, d);
                give_end(c, i);
                return;
        }
}

void state_on_ask(Coll *c, unsigned member, const CollStateAsk *m) {
        if (c->members[member].foreign) /* another model's: ours are no use to it */
                (void)coll_state_refuse(c, member, m->group, -EBADE);
        else if (c->state_hook)
                c->state_hook(c->state_ud, member, m);
        else
                (void)coll_state_refuse(c, member, m->group, -ENODATA);
}

/* ---- fetching ----------------------------------------------------------- */

static Fetch *fetch_of(Coll *c, uint32_t group) {
        for (unsigned i = 0; i < c->n_fetches; i++)
                if (c->fetches[i].group == group)
                        return &c->fetches[i];
        return NULL;
}

/* Ask the next member connected, not asked yet; none left: give up with
 * the last refusal's reason. */
static void fetch_next(Coll *c, Fetch *f, int why) {
        uint8_t buf[COLL_CTL_MAX];
        size_t len = coll_state_ask_encode(
                &(CollStateAsk){ .group = f->group, .values = f->values, .arrays = f->arrays }, buf);
        f->last_error = why ?: f->last_error;
        f->donor = -1;
        for (unsigned i = 0; i < f->n; i++) {
                unsigned m = f->members[i];
                if (m != c->self && c->members[m].foreign && !f->last_error)
                        f->last_error = -EBADE; /* why nobody gives it, if nobody does */
                if (m == c->self || (f->tried >> i & 1) || !c->members[m].up || c->members[m].foreign)
                        continue;
                f->tried |= 1ull << i;
                if (net_send_control(c->net, c->members[m].peer, FRAME_CONTROL, buf, len) < 0)
                        continue;
                f->donor = (int)m;
                f->n_got = 0;
                memset(f->got, 0, f->n_pieces);
                f->deadline_ns = now_ns() + (uint64_t)c->cfg.round_timeout_ms * 1000000ull;
                return;
        }
        f->result = f->last_error ?: -ENOTCONN;
}

int coll_state_fetch(Coll *c, uint32_t group, const unsigned *members, unsigned n, float *const *dst,
                     unsigned arrays, size_t values) {
        if (n == 0 || n > COLL_MAX_MEMBERS || arrays == 0 || arrays > COLL_STATE_MAX_ARRAYS || values == 0 ||
            values > 1ull << 40 || fetch_of(c, group))
                return -EINVAL;
        for (unsigned i = 0; i < n; i++)
                if (members[i] >= c->n_members)
                        return -EINVAL;
        Fetch *fs = realloc(c->fetches, (c->n_fetches + 1) * sizeof *fs);
        if (!fs)
                return -ENOMEM;
        c->fetches = fs;
        Fetch *f = &fs[c->n_fetches];
        *f = (Fetch){ .group = group, .n = n, .arrays = arrays, .values = values,
                      .n_pieces = n_pieces(values * arrays), .result = -EINPROGRESS };
        memcpy(f->members, members, n * sizeof *members);
        memcpy(f->dst, dst, arrays * sizeof *dst);
        if (!(f->got = calloc(f->n_pieces, 1)))
                return -ENOMEM;
        c->n_fetches++;
        fetch_next(c, f, 0);
        return 0;
}

int coll_state_fetched(const Coll *c, uint32_t group, uint64_t *ret_steps, unsigned *ret_member) {
        for (unsigned i = 0; i < c->n_fetches; i++) {
                const Fetch *f = &c->fetches[i];
                if (f->group != group)
                        continue;
                if (f->result == 0) {
                        *ret_steps = f->steps;
                        *ret_member = (unsigned)f->donor;
                }
                return f->result;
        }
        return -ENOENT;
}

void coll_state_forget(Coll *c) {
        for (unsigned i = 0; i < c->n_fetches; i++)
                free(c->fetches[i].got);
        c->fetches = mfree(c->fetches);
        c->n_fetches = 0;
}

/* A refusal, or error 0: the member's state is zero (it took no step), to
 * be taken whole, before any piece of it. */
void state_on_no(Coll *c, unsigned member, const CollStateNo *m) {
        Fetch *f = fetch_of(c, m->group);
        if (!f || f->result != -EINPROGRESS || f->donor != (int)member)
                return;
        if (m->error < 0)
                fetch_next(c, f, m->error);
        else if (f->n_got > 0) {
                coll_ban(c, member);
                fetch_next(c, f, -EBADMSG);
        } else {
                for (unsigned k = 0; k < f->arrays; k++)
                        memset(f->dst[k], 0, f->values * sizeof(float));
                f->steps = 0;
                f->result = 0;
        }
}

/* A piece of the state asked for: from the member asked, in its place,
 * once, of the same steps as the others, every value finite. Else the
 * member is refused (a bad piece) and the next one asked. */
void state_on_piece(Coll *c, unsigned member, const CollPiece *h, NetTensor *t) {
        Fetch *f = fetch_of(c, h->group);
        c->state_received += t->desc.bytes;
        if (!f || f->result != -EINPROGRESS || f->donor != (int)member) { /* late, from one given up */
                net_tensor_release(c->net, t);
                return;
        }
        const float *v = (const float *)(t->data + COLL_PIECE_HEADER);
        bool ok = h->index < f->n_pieces && !f->got[h->index] &&
                  h->count == piece_count(f->values * f->arrays, h->index) &&
                  (f->n_got == 0 || h->round == f->steps) &&
                  /* a bad value leaves part of dst written: the next member's pieces cover it */
                  scatter(f->dst, f->values, (size_t)h->index * COLL_STATE_PIECE_VALUES, v, h->count);
        net_tensor_release(c->net, t);
        if (!ok) {
                coll_ban(c, member);
                fetch_next(c, f, -EBADMSG);
                return;
        }
        f->got[h->index] = 1;
        f->steps = h->round;
        f->deadline_ns = now_ns() + (uint64_t)c->cfg.round_timeout_ms * 1000000ull;
        if (++f->n_got == f->n_pieces)
                f->result = 0;
}

void state_on_member_lost(Coll *c, unsigned member, int why) {
        for (unsigned i = 0; i < c->n_fetches; i++)
                if (c->fetches[i].result == -EINPROGRESS && c->fetches[i].donor == (int)member)
                        fetch_next(c, &c->fetches[i], why);
}

void state_tick(Coll *c, uint64_t now) {
        for (unsigned i = 0; i < c->n_fetches; i++)
                if (c->fetches[i].result == -EINPROGRESS && now >= c->fetches[i].deadline_ns)
                        fetch_next(c, &c->fetches[i], -ETIMEDOUT);
        for (unsigned i = c->n_donations; i-- > 0;) {
                give_more(c, &c->donations[i]);
                give_end(c, i);
        }
}

/* Before the Net goes: its sent() calls only count down. */
void state_stop_giving(Coll *c) {
        for (unsigned i = 0; i < c->n_donations; i++)
                c->donations[i].next = c->donations[i].n_pieces;
}

void coll_state_free(Coll *c) {
        coll_state_forget(c);
        for (unsigned i = 0; i < c->n_donations; i++)
                free(c->donations[i].buf);
        c->n_donations = 0;
}
