/* collective/coll-round.c — one round of a group all-reduce: join, then
 * reduce-scatter and all-gather around the ring, piece by piece.
 *
 * Ring order is the participants' order in the group. Chunk k of the vector
 * is summed along ranks k+1, k+2, ..., k (each adds its own scaled values to
 * what arrives from the left and passes it on), so rank k holds the sum; the
 * sum then travels k+1, ..., k-1 unchanged (Patarasuk and Yuan, "Bandwidth
 * optimal all-reduce algorithms for clusters of workstations", 2009). Every
 * piece of a chunk travels on its own, so sending, receiving and adding
 * overlap.
 *
 * Values travel as float32, binary16 or 8-bit blocks (quant.h). In the
 * narrow types each hop widens the sum it receives to float32, adds its own
 * values and narrows the result again; the rank that completes a sum
 * narrows it once, and every member, that rank included, takes the average
 * from those bytes, so all end with the same bits. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "coll-internal.h"
#include "quant.h"
#include "tensor/half.h"
#include "tensor/tensor.h"
#include "util/time-util.h"

#define MS (1000000ull)
#define BLOCK 4096 /* values converted at a time on the binary16 path */
/* An output this large cannot stay in the cache until it is read: float32
 * averages are written around the cache, which saves reading every line in
 * before it is overwritten (64 MiB among 4 processes, plaintext: 7 %
 * faster in the median of 14 interleaved pairs; docs/figures.md). */
#define OUT_AROUND_CACHE_BYTES (16u << 20)

static uint8_t wire_dtype(const CollRound *r) {
        return coll_payload_dtype(r->payload);
}

/* Bytes of a piece of count values on the wire, header excluded. */
static size_t wire_size(const CollRound *r, size_t count) {
        return coll_payload_size(wire_dtype(r), count);
}

/* Our own contribution to a piece whose sum we start, in the wire's type. */
static uint8_t *piece_own(const CollRound *r, const Piece *p) {
        return r->wire + p->wire_off + COLL_PIECE_HEADER;
}

/* The average of a DONE piece without an output: completed here or
 * received, and held. */
static const uint8_t *piece_avg(const Piece *p) {
        return p->held->data + COLL_PIECE_HEADER;
}

/* Cookies name the round, the phase and the piece of a send. */
#define COOKIE(r, phase, idx) ((uint64_t)(r)->uid << 32 | (uint64_t)(phase) << 30 | (idx))

void round_release_held(CollRound *r) {
        for (unsigned i = 0; r->pieces && i < r->n_pieces; i++) {
                Piece *p = &r->pieces[i];
                if (p->sum && p->sum != p->held)
                        net_tensor_release(r->coll->net, p->sum);
                if (p->held)
                        net_tensor_release(r->coll->net, p->held);
                p->sum = p->held = NULL;
        }
}

static CollRound *round_of_group(Coll *c, uint32_t group) {
        for (CollRound *r = c->rounds; r; r = r->next)
                if (!r->freed && r->group == group)
                        return r;
        return NULL;
}

void round_destroy(CollRound *r) {
        round_release_held(r);
        free(r->pieces);
        coll_buffer_put(r->coll, r->wire, r->wire_bytes);
        free(r->backlog);
        free(r);
}

static void round_unlink(CollRound *r) {
        for (CollRound **p = &r->coll->rounds; *p; p = &(*p)->next)
                if (*p == r) {
                        *p = r->next;
                        break;
                }
        round_destroy(r);
}

/* This member sent the round's START: the leader is the participant of
 * the lowest position (round_on_start() takes START from no other). */
static bool round_led(const CollRound *r) {
        return r->n_part > 0 && r->part[0] == r->coll->self;
}

static void round_fail(CollRound *r, int error) {
        if (r->state == COLL_ROUND_DONE || r->state == COLL_ROUND_FAILED)
                return;
        if ((r->state == COLL_ROUND_RUNNING && (error != -ECONNABORTED || round_led(r))) ||
            r->state == COLL_ROUND_JOINING) {
                /* Tell the others, so nobody waits for the deadline. A round
                 * given up while joining may have been started by its leader
                 * already, START on the way: it is the one after the last.
                 * A participant still joining when that ABORT came dropped
                 * it and may run our START since: the leader passes every
                 * ABORT on, after its START on the same link. */
                const unsigned *who = r->state == COLL_ROUND_RUNNING ? r->part : r->members;
                unsigned n_who = r->state == COLL_ROUND_RUNNING ? r->n_part : r->n_members;
                uint64_t *last = coll_last_round(r->coll, r->group);
                uint64_t round = r->state == COLL_ROUND_RUNNING ? r->round : last ? *last + 1 : 0;
                uint8_t buf[COLL_CTL_MAX];
                size_t n = coll_abort_encode(&(CollAbort){ .group = r->group, .round = round, .error = error }, buf);
                for (unsigned i = 0; i < n_who && round; i++)
                        if (who[i] != r->coll->self && r->coll->members[who[i]].up &&
                            !r->coll->members[who[i]].foreign)
                                (void)net_send_control(r->coll->net, r->coll->members[who[i]].peer, FRAME_CONTROL,
                                                       buf, n);
        }
        /* A right neighbour that did not take our pieces in time is not
         * waited for: dropping the link hands our buffer back. */
        if (error == -ETIMEDOUT && r->state == COLL_ROUND_RUNNING && r->sending > 0 &&
            r->coll->members[r->right].up)
                net_drop_peer(r->coll->net, r->coll->members[r->right].peer, -ETIMEDOUT);
        r->state = COLL_ROUND_FAILED;
        r->error = error;
        r->end_ns = now_ns();
}

/* Done once every piece is in and every piece of ours is handed to TCP: a
 * node that stops after its last round must not take pieces a neighbour
 * still waits for out of its send queue (net_free() says BYE first). */
static void round_check_done(CollRound *r) {
        if (r->state == COLL_ROUND_RUNNING && r->done == r->n_pieces && r->sending == 0) {
                r->state = COLL_ROUND_DONE;
                r->end_ns = now_ns();
        }
}

static void inject_more(CollRound *r);

/* ---- sending ------------------------------------------------------------ */

/* A piece went to the right neighbour (or had nobody to go to): a running
 * sum is done with, one of our own is out, an average already in the
 * output needs its buffer no more. */
static void piece_sent(CollRound *r, uint32_t idx, uint8_t phase) {
        Piece *p = &r->pieces[idx];
        if (phase == COLL_REDUCE_SCATTER && p->sum) {
                net_tensor_release(r->coll->net, p->sum);
                p->sum = NULL;
        } else if (phase == COLL_REDUCE_SCATTER && p->chunk == r->inject && r->inject_out > 0)
                r->inject_out--;
        if (phase == COLL_ALL_GATHER && r->out && p->held) {
                net_tensor_release(r->coll->net, p->held);
                p->held = NULL;
        }
}

static int send_now(CollRound *r, uint32_t idx, uint8_t phase) {
        Coll *c = r->coll;
        Piece *p = &r->pieces[idx];
        uint32_t bytes = COLL_PIECE_HEADER + (uint32_t)wire_size(r, p->count);
        uint8_t *buf;
        TensorDesc d;
        int k;

        if (r->right_gone) { /* it has all it needed from us, or stopped: nobody to send to */
                piece_sent(r, idx, phase);
                return 0;
        }
        if (!c->members[r->right].up)
                return -ECONNRESET;
        if (phase == COLL_ALL_GATHER)
                buf = p->held->data;
        else
                buf = p->sum ? p->sum->data : r->wire + p->wire_off;
        /* the same header whoever wrote the buffer, with this phase */
        coll_piece_encode(&(CollPiece){ .phase = phase, .dtype = wire_dtype(r), .group = r->group, .index = idx,
                                        .count = p->count, .round = r->round },
                          buf);
        k = tensor_desc_init(&d, DTYPE_U8, 1, &bytes);
        if (k < 0)
                return k;
        k = net_send_tensor(c->net, c->members[r->right].peer, r->group, &d, buf, COOKIE(r, phase, idx));
        if (k < 0)
                return k;
        p->sends++;
        r->sending++;
        r->bytes_sent += bytes;
        r->sent_in_phase[phase]++;
        if (c->hook)
                c->hook(c->hook_ud, phase, r->sent_in_phase[phase]);
        return 0;
}

/* Queue piece idx to the right neighbour; its buffer stays unchanged until
 * sent(): a sum is written once, before it is sent, and an average never. */
static void send_piece(CollRound *r, uint32_t idx, uint8_t phase) {
        if (r->backlog_n == 0) {
                int k = send_now(r, idx, phase);
                if (k == 0)
                        return;
                if (k != -ENOBUFS) {
                        round_fail(r, k == -ENOTCONN ? -ECONNRESET : k);
                        return;
                }
        }
        r->backlog[r->backlog_n++] = (Backlog){ .piece = idx, .phase = phase };
}

static void flush_backlog(CollRound *r) {
        unsigned done = 0;
        while (done < r->backlog_n) {
                int k = send_now(r, r->backlog[done].piece, r->backlog[done].phase);
                if (k == -ENOBUFS)
                        break;
                if (k < 0) {
                        round_fail(r, -ECONNRESET);
                        break;
                }
                done++;
        }
        memmove(r->backlog, r->backlog + done, (r->backlog_n - done) * sizeof *r->backlog);
        r->backlog_n -= done;
}

/* ---- arithmetic --------------------------------------------------------- */

/* Bit tests rather than isfinite() keep these loops vectorized. */
#define F32_EXP 0x7f800000u
#define F16_EXP 0x7c00u

/* a += s * x: the running sum plus our own contribution, in one pass that
 * also checks both: -EBADMSG if a value received is not finite (a forged
 * piece: the sender's fault), -ERANGE if a sum is not (our values, or an
 * overflow), else 0. */
_simd_clones_ static int add_own_f32(float *restrict a, const float *restrict x, float s, size_t n) {
        uint32_t bad_in = 0, bad_sum = 0;
        for (size_t i = 0; i < n; i++) {
                float v = a[i] + s * x[i];
                uint32_t u, w;
                memcpy(&u, &a[i], sizeof u);
                memcpy(&w, &v, sizeof w);
                bad_in |= (u & F32_EXP) == F32_EXP;
                bad_sum |= (w & F32_EXP) == F32_EXP;
                a[i] = v;
        }
        return bad_in ? -EBADMSG : bad_sum ? -ERANGE : 0;
}

_simd_clones_ static void scale_f32(float *restrict out, const float *restrict x, float s, size_t n) {
        for (size_t i = 0; i < n; i++)
                out[i] = s * x[i];
}

_simd_clones_ static void add_f32(float *restrict a, const float *restrict x, size_t n) {
        for (size_t i = 0; i < n; i++)
                a[i] += x[i];
}

static bool finite_f32(const float *a, size_t n) {
        uint32_t bad = 0;
        for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &a[i], sizeof u);
                bad |= (u & F32_EXP) == F32_EXP;
        }
        return !bad;
}

static bool finite_f16(const uint16_t *a, size_t n) {
        uint32_t bad = 0;
        for (size_t i = 0; i < n; i++)
                bad |= (a[i] & F16_EXP) == F16_EXP;
        return !bad;
}

static int add_own_f16(uint16_t *a, const float *x, float s, size_t n) {
        float f[BLOCK];
        int r = 0;
        for (size_t i = 0; i < n; i += BLOCK) {
                size_t m = MIN((size_t)BLOCK, n - i);
                half_to_float(f, a + i, m);
                int k = add_own_f32(f, x + i, s, m);
                half_from_float(a + i, f, m);
                if (!k && !finite_f16(a + i, m)) /* a finite sum can round to infinity */
                        k = -ERANGE;
                if (k == -EBADMSG || !r)
                        r = k;
        }
        return r;
}

/* A block of the float32 sum, f, quantized into b; with error feedback, the
 * error carried from the last round (err) is added first and this
 * quantizing's error takes its place. */
static int quantize_block(uint8_t *b, float *f, float *err, size_t m) {
        if (err)
                add_f32(f, err, m);
        if (quant_from_float(b, f, m) < 0)
                return -ERANGE;
        if (err)
                quant_error(err, f, b, m);
        return 0;
}

/* The running sum, received quantized, plus our own contribution: added in
 * float32 and quantized again, block by block, in place (the next hop, or
 * the average, is quantized once from the float32 sum). */
static int add_own_int8(uint8_t *a, const float *x, float s, float *err, size_t n) {
        float f[QUANT_BLOCK];
        if (quant_check(a, n) < 0)
                return -EBADMSG;
        for (size_t i = 0; i < n; i += QUANT_BLOCK) {
                size_t m = MIN((size_t)QUANT_BLOCK, n - i);
                uint8_t *b = a + quant_size(i);
                scale_f32(f, x + i, s, m);
                quant_add_to_float(f, b, m);
                if (quantize_block(b, f, err ? err + i : NULL, m) < 0)
                        return -ERANGE;
        }
        return 0;
}

/* The error feedback of a piece's values, or NULL. */
static float *piece_feedback(const CollRound *r, const Piece *p) {
        return r->feedback ? r->feedback + p->off : NULL;
}

/* a += s * x in the wire's type; see add_own_f32() for the errors. */
static int add_own(const CollRound *r, const Piece *p, uint8_t *a) {
        const float *x = r->x + p->off;
        switch (r->payload) {
        case COLL_PAYLOAD_F16: return add_own_f16((uint16_t *)a, x, r->coef, p->count);
        case COLL_PAYLOAD_INT8: return add_own_int8(a, x, r->coef, piece_feedback(r, p), p->count);
        default: return add_own_f32((float *)a, x, r->coef, p->count);
        }
}

/* out = a, checking a as it goes: one pass over a received average. */
_simd_clones_ bool copy_finite_f32(float *restrict out, const float *restrict a, size_t n) {
        const uint32_t *u = (const uint32_t *)a;
        uint32_t bad = 0;
        for (size_t i = 0; i < n; i++) {
                bad |= (u[i] & F32_EXP) == F32_EXP;
                out[i] = a[i];
        }
        return !bad;
}

/* The same with non-temporal stores, which bypass the cache: for an output
 * that will not be read before it would have left it anyway. */
bool copy_finite_f32_around(float *restrict out, const float *restrict a, size_t n) {
#if defined(__SSE2__)
        const __m128i e = _mm_set1_epi32((int)F32_EXP);
        __m128i bad = _mm_setzero_si128();
        size_t head = (size_t)(-(uintptr_t)out & 15) / sizeof(float), i = MIN(head, n);
        bool ok = copy_finite_f32(out, a, i);
        for (; i + 4 <= n; i += 4) {
                __m128i v = _mm_loadu_si128((const __m128i *)(a + i));
                bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(v, e), e));
                _mm_stream_si128((__m128i *)(out + i), v);
        }
        _mm_sfence(); /* in place before anyone is told the piece is done */
        ok &= copy_finite_f32(out + i, a + i, n - i);
        return ok && _mm_movemask_epi8(bad) == 0;
#else
        return copy_finite_f32(out, a, n);
#endif
}

/* A float32 average into the round's output, checked as it goes. */
static bool copy_to_out(CollRound *r, const Piece *p, const float *v) {
        float *dst = r->out + p->off;
        return r->out_around_cache ? copy_finite_f32_around(dst, v, p->count) : copy_finite_f32(dst, v, p->count);
}

/* The piece's average, just completed in t, into the round's output. */
static void piece_output(CollRound *r, const Piece *p, const NetTensor *t) {
        const uint8_t *v = t->data + COLL_PIECE_HEADER;
        switch (r->payload) {
        case COLL_PAYLOAD_F16: half_to_float(r->out + p->off, (const uint16_t *)v, p->count); break;
        case COLL_PAYLOAD_INT8: quant_to_float(r->out + p->off, v, p->count); break;
        default: (void)copy_to_out(r, p, (const float *)v); break; /* a sum of ours, or checked on arrival */
        }
}

/* A received average holds finite values only (int8: sane scales). */
static bool received_ok(const CollRound *r, const uint8_t *a, size_t n) {
        switch (r->payload) {
        case COLL_PAYLOAD_F16: return finite_f16((const uint16_t *)a, n);
        case COLL_PAYLOAD_INT8: return quant_check(a, n) == 0;
        default: return tensor_finite((const float *)a, n);
        }
}

static bool fill_own_f16(uint16_t *out, const float *x, float s, size_t n) {
        float tmp[BLOCK];
        for (size_t i = 0; i < n; i += BLOCK) {
                size_t m = MIN((size_t)BLOCK, n - i);
                scale_f32(tmp, x + i, s, m);
                half_from_float(out + i, tmp, m);
        }
        return finite_f16(out, n);
}

static bool fill_own_int8(uint8_t *out, const float *x, float s, float *err, size_t n) {
        float tmp[QUANT_BLOCK];
        for (size_t i = 0; i < n; i += QUANT_BLOCK) {
                size_t m = MIN((size_t)QUANT_BLOCK, n - i);
                scale_f32(tmp, x + i, s, m);
                if (quantize_block(out + quant_size(i), tmp, err ? err + i : NULL, m) < 0)
                        return false;
        }
        return true;
}

/* The piece's own contribution alone, coef * x, in the wire's type: what
 * starts the sums we inject. False if it is not finite. */
static bool fill_own(CollRound *r, const Piece *p) {
        const float *x = r->x + p->off;
        uint8_t *out = piece_own(r, p);
        switch (r->payload) {
        case COLL_PAYLOAD_F16: return fill_own_f16((uint16_t *)out, x, r->coef, p->count);
        case COLL_PAYLOAD_INT8: return fill_own_int8(out, x, r->coef, piece_feedback(r, p), p->count);
        default:
                scale_f32((float *)out, x, r->coef, p->count);
                return tensor_finite((const float *)out, p->count);
        }
}

/* ---- receiving ---------------------------------------------------------- */

/* A received average: false if it is not sane; else into the round's
 * output, if it has one. float32 is checked as it is copied, one pass (a
 * piece not done is never read from the output). */
static bool take_average(CollRound *r, const Piece *p, const NetTensor *t) {
        const uint8_t *in = t->data + COLL_PIECE_HEADER;
        if (r->out && r->payload == COLL_PAYLOAD_F32)
                return copy_to_out(r, p, (const float *)in);
        if (!received_ok(r, in, p->count))
                return false;
        if (r->out)
                piece_output(r, p, t);
        return true;
}

static int take_piece(CollRound *r, uint32_t idx, uint8_t phase, NetTensor *t) {
        Piece *p = &r->pieces[idx];

        r->bytes_received += t->desc.bytes;
        if (phase == COLL_ALL_GATHER) {
                if (!take_average(r, p, t)) {
                        net_tensor_release(r->coll->net, t);
                        round_fail(r, -EBADMSG);
                        return -EBADMSG;
                }
                p->held = t;
                p->flags |= PIECE_GOT_AG | PIECE_DONE;
                r->done++;
                if ((r->rank + 1) % r->n_part != p->chunk)
                        send_piece(r, idx, COLL_ALL_GATHER);
                else if (r->out) { /* the last to get it: nobody to pass it to */
                        net_tensor_release(r->coll->net, t);
                        p->held = NULL;
                }
                round_check_done(r);
                return 0;
        }

        uint8_t *sum = t->data + COLL_PIECE_HEADER;
        /* -EBADMSG: the sender's fault; -ERANGE: ours (our values are not
         * finite, or the sum overflows) */
        int k = add_own(r, p, sum);
        if (k < 0) {
                net_tensor_release(r->coll->net, t);
                round_fail(r, k);
                return k;
        }
        p->flags |= PIECE_GOT_RS;
        if (p->chunk == r->rank) { /* the sum is complete here: it is the average */
                p->held = t;
                p->flags |= PIECE_DONE;
                r->done++;
                if (r->out)
                        piece_output(r, p, t);
                send_piece(r, idx, COLL_ALL_GATHER);
        } else {
                p->sum = t;
                send_piece(r, idx, COLL_REDUCE_SCATTER);
        }
        round_check_done(r);
        return 0;
}

/* A piece of this round's number from a member that is not our left
 * neighbour: while links come up, two leaders can start rounds of one
 * number whose participants overlap. Nobody's fault, so no ban: the
 * sender's round is told off (ABORT), and ours too when the sender is one
 * of its participants (the ring cannot close as it thinks). */
static void views_differ(CollRound *r, unsigned member, uint64_t round) {
        Coll *c = r->coll;
        uint8_t buf[COLL_CTL_MAX];
        size_t n = coll_abort_encode(&(CollAbort){ .group = r->group, .round = round, .error = -ESTALE }, buf);
        if (c->members[member].up)
                (void)net_send_control(c->net, c->members[member].peer, FRAME_CONTROL, buf, n);
        for (unsigned i = 0; i < r->n_part; i++)
                if (r->part[i] == member)
                        round_fail(r, -ESTALE);
}

int round_on_piece(Coll *c, unsigned member, const CollPiece *h, NetTensor *t) {
        CollRound *r = round_of_group(c, h->group);

        if (!r || r->state == COLL_ROUND_JOINING || (r->state == COLL_ROUND_RUNNING && h->round > r->round)) {
                if (h->round > coll_seen_round(c, h->group))
                        return coll_early_add(c, member, h, t);
                net_tensor_release(c->net, t);
                return 0;
        }
        if (r->state != COLL_ROUND_RUNNING || h->round != r->round) { /* late: that round is over */
                net_tensor_release(c->net, t);
                return 0;
        }

        if (member != r->left) {
                net_tensor_release(c->net, t);
                views_differ(r, member, h->round);
                return 0;
        }
        uint32_t P = r->n_part;
        Piece *p = h->index < r->n_pieces ? &r->pieces[h->index] : NULL;
        bool ok = p && h->count == p->count && h->dtype == wire_dtype(r);
        if (ok && h->phase == COLL_REDUCE_SCATTER)
                ok = p->chunk != (r->rank + P - 1) % P && !(p->flags & PIECE_GOT_RS);
        else if (ok)
                ok = p->chunk != r->rank && !(p->flags & PIECE_GOT_AG) && (p->flags & PIECE_GOT_RS ||
                                                                           p->chunk == (r->rank + P - 1) % P);
        if (!ok) {
                net_tensor_release(c->net, t);
                round_fail(r, -EBADMSG);
                return -EBADMSG;
        }
        return take_piece(r, h->index, h->phase, t);
}

void round_on_sent(Coll *c, uint64_t cookie) {
        uint32_t uid = (uint32_t)(cookie >> 32), idx = (uint32_t)cookie & 0x3fffffff;
        uint8_t phase = (uint8_t)((uint32_t)cookie >> 30);
        CollRound *r;
        for (r = c->rounds; r && r->uid != uid; r = r->next)
                ;
        if (!r || idx >= r->n_pieces || r->pieces[idx].sends == 0)
                return;
        r->pieces[idx].sends--;
        r->sending--;
        piece_sent(r, idx, phase);
        if (r->freed) {
                if (r->sending == 0)
                        round_unlink(r);
                return;
        }
        if (r->state == COLL_ROUND_RUNNING) {
                flush_backlog(r);
                inject_more(r);
                round_check_done(r);
        }
}

/* ---- joining ------------------------------------------------------------ */

static bool ready_fresh(const Coll *c, const ReadyEntry *e, uint64_t now) {
        /* A member gives up after join_timeout; leave it a margin to hear START. */
        return now - e->at_ns < (uint64_t)c->cfg.join_timeout_ms * MS * 3 / 4;
}

/* READYs kept from one member, each for another group: more than the
 * groups of any plan (a node is in at most a few rings at once). */
#define READY_MAX_PER_MEMBER 64

static size_t readies_of(const Coll *c, unsigned member) {
        size_t n = 0;
        for (size_t i = 0; i < c->n_readies; i++)
                n += c->readies[i].member == member;
        return n;
}

static ReadyEntry *ready_find(Coll *c, uint32_t group, unsigned member) {
        for (size_t i = 0; i < c->n_readies; i++)
                if (c->readies[i].group == group && c->readies[i].member == member)
                        return &c->readies[i];
        return NULL;
}

void round_on_ready(Coll *c, unsigned member, const CollReady *m) {
        if (c->members[member].foreign)
                return; /* another model's: never admitted */
        ReadyEntry *e = ready_find(c, m->group, member);
        c->members[member].diverged = false; /* its values are finite again */
        if (!e && readies_of(c, member) >= READY_MAX_PER_MEMBER)
                return; /* no group has that many at once: one naming groups at random */
        if (!e) {
                ReadyEntry *n = realloc(c->readies, (c->n_readies + 1) * sizeof *n);
                if (!n)
                        return;
                c->readies = n;
                e = &n[c->n_readies++];
        }
        *e = (ReadyEntry){ .group = m->group, .member = member, .msg = *m, .at_ns = now_ns() };
}

void round_on_foreign(Coll *c, unsigned member) {
        for (size_t i = 0; i < c->n_readies; i++)
                if (c->readies[i].member == member)
                        c->readies[i].at_ns = 0;
}

/* Whether a member of the round's group trains another model. */
static bool round_has_foreign(const CollRound *r) {
        for (unsigned i = 0; i < r->n_members; i++)
                if (r->coll->members[r->members[i]].foreign)
                        return true;
        return false;
}

/* Values per piece: piece_bytes of them on the wire; whole blocks of int8. */
static size_t piece_values(const CollRound *r) {
        size_t b = r->coll->cfg.piece_bytes;
        switch (r->payload) {
        case COLL_PAYLOAD_F16: return b / 2;
        case COLL_PAYLOAD_INT8: return MAX(b / QUANT_BLOCK_BYTES, (size_t)1) * QUANT_BLOCK;
        default: return b / 4;
        }
}

static void begin_running(CollRound *r, uint64_t round, uint64_t participants, const double *weights) {
        Coll *c = r->coll;
        uint64_t now = now_ns();
        size_t per_piece = piece_values(r);
        uint64_t *last = coll_last_round(c, r->group);

        r->round = round;
        if (last)
                *last = round;
        r->n_part = 0;
        r->part_map = participants;
        r->total_weight = 0;
        for (unsigned i = 0; i < r->n_members; i++)
                if (participants & (1ull << i)) {
                        if (i == r->self_pos)
                                r->rank = r->n_part;
                        r->total_weight += weights[r->n_part];
                        r->part[r->n_part++] = r->members[i];
                }
        r->coef = (float)(weights[r->rank] / r->total_weight);
        r->left = r->part[(r->rank + r->n_part - 1) % r->n_part];
        r->right = r->part[(r->rank + 1) % r->n_part];
        r->running_ns = now;
        r->deadline_ns = now + (uint64_t)c->cfg.round_timeout_ms * MS;
        r->state = COLL_ROUND_RUNNING;
        if (r->n_part == 1) {
                r->identity = true;
                if (r->out && r->out != r->x)
                        memcpy(r->out, r->x, r->len * sizeof *r->out);
                r->state = COLL_ROUND_DONE;
                r->end_ns = now;
                return;
        }

        /* One chunk per rank, each cut into pieces of at most piece_bytes. */
        size_t n_pieces = 0, wire = 0;
        for (unsigned k = 0; k < r->n_part; k++) {
                size_t lo = r->len * k / r->n_part, hi = r->len * (k + 1) / r->n_part;
                n_pieces += (hi - lo + per_piece - 1) / per_piece;
        }
        r->pieces = calloc(n_pieces, sizeof *r->pieces);
        r->backlog = calloc(n_pieces, sizeof *r->backlog);
        if (!r->pieces || !r->backlog)
                return round_fail(r, -ENOMEM);
        uint32_t inject = (r->rank + r->n_part - 1) % r->n_part;
        for (unsigned k = 0; k < r->n_part; k++) {
                size_t lo = r->len * k / r->n_part, hi = r->len * (k + 1) / r->n_part;
                for (size_t off = lo; off < hi; off += per_piece) {
                        Piece *p = &r->pieces[r->n_pieces++];
                        p->off = off;
                        p->count = (uint32_t)MIN(per_piece, hi - off);
                        p->chunk = k;
                        if (k == inject) { /* only the sums we start need a buffer of ours */
                                p->wire_off = wire;
                                wire += COLL_PIECE_HEADER + ALIGN_TO(wire_size(r, p->count), 64);
                        }
                }
        }
        r->wire_bytes = MAX(wire, (size_t)64);
        r->wire = coll_buffer_get(c, &r->wire_bytes);
        if (!r->wire)
                return round_fail(r, -ENOMEM);
}

/* Our own values start the sums of one chunk. A few pieces of it are queued
 * at a time, each scaled just before it goes, so the sends read it from
 * the cache, and the sums passing through from the left are not queued
 * behind a whole chunk of ours. */
#define INJECT_WINDOW 2
static void inject_more(CollRound *r) {
        while (r->state == COLL_ROUND_RUNNING && r->inject_out < INJECT_WINDOW && r->inject_next < r->n_pieces) {
                uint32_t i = r->inject_next++;
                if (r->pieces[i].chunk != r->inject)
                        continue;
                if (!fill_own(r, &r->pieces[i])) {
                        round_fail(r, -ERANGE); /* our values diverged: nothing of ours goes out */
                        return;
                }
                r->inject_out++;
                send_piece(r, i, COLL_REDUCE_SCATTER);
        }
}

static void take_early(Coll *c, Early *e, void *ud) {
        if (round_on_piece(c, e->member, &e->hdr, e->t) == -EBADMSG)
                coll_ban(c, e->member);
}

static void start_running(CollRound *r, uint64_t round, uint64_t participants, const double *weights) {
        begin_running(r, round, participants, weights);
        if (r->state != COLL_ROUND_RUNNING)
                return;
        coll_early_take(r->coll, r->group, r->round, take_early, r);
        /* Our own values start the sums of the chunk completed by our left
         * neighbour. */
        uint32_t inject = (r->rank + r->n_part - 1) % r->n_part;
        Coll *c = r->coll;
        if (c->hook) /* about to send */
                c->hook(c->hook_ud, COLL_REDUCE_SCATTER, 0);
        r->inject = inject;
        r->inject_next = 0;
        inject_more(r);
        round_check_done(r);
}

/* A bit for each member of the group (up to 64). */
static uint64_t everyone(const CollRound *r) {
        return r->n_members >= 64 ? ~0ull : (1ull << r->n_members) - 1;
}

int round_on_start(Coll *c, unsigned member, const CollStart *m) {
        CollRound *r = round_of_group(c, m->group);
        unsigned sender_pos = UINT_MAX;

        if (!r || r->state != COLL_ROUND_JOINING || c->members[member].foreign)
                return 0; /* not waiting: we gave up, or never joined; or another model's */
        for (unsigned i = 0; i < r->n_members; i++)
                if (r->members[i] == member)
                        sender_pos = i;
        if (sender_pos == UINT_MAX || sender_pos > r->self_pos || (m->participants & ~everyone(r)) != 0 ||
            !(m->participants & (1ull << sender_pos)))
                return -EBADMSG;
        if (!(m->participants & (1ull << r->self_pos)) || m->round <= coll_seen_round(c, m->group) ||
            m->final != r->final)
                return 0; /* left out of this round, a stale START, or not a last round like ours */
        start_running(r, m->round, m->participants, m->weights);
        return 0;
}

/* Members connected to us that a round we lead starts without: they had
 * not said READY (or left it stale) in half the join timeout. */
static void note_unready(Coll *c, const CollRound *r, uint64_t participants) {
        for (unsigned i = 0; i < r->n_members; i++) {
                Member *m = &c->members[r->members[i]];
                if ((participants & (1ull << i)) || i == r->self_pos || !m->up || member_out(m))
                        continue;
                c->unready = (CollLoss){ .count = c->unready.count + 1, .member = r->members[i] };
                (void)net_peer_describe(c->net, m->peer, &c->unready.info);
        }
}

/* The participants: members that said READY, reduced until every pair is
 * connected (each ring order may need any pair). */
static uint64_t choose_participants(Coll *c, CollRound *r, uint64_t now, uint64_t *ret_round, double *weights) {
        uint64_t cand = 1ull << r->self_pos, views[COLL_MAX_MEMBERS] = {}, blamed;
        uint64_t round = *coll_last_round(c, r->group);
        double w[COLL_MAX_MEMBERS] = {};

        views[r->self_pos] = coll_view(c, r->members, r->n_members);
        blamed = coll_blame(c, r->members, r->n_members);
        w[r->self_pos] = r->weight;
        for (unsigned i = 0; i < r->n_members; i++) {
                ReadyEntry *e = ready_find(c, r->group, r->members[i]);
                /* a last round only with others in theirs; none with one sitting rounds out */
                if (i == r->self_pos || !e || !ready_fresh(c, e, now) || !c->members[r->members[i]].up ||
                    member_out(&c->members[r->members[i]]) || e->msg.final != r->final)
                        continue;
                cand |= 1ull << i;
                views[i] = e->msg.view;
                blamed |= e->msg.blame;
                w[i] = e->msg.weight;
                round = MAX(round, e->msg.last_round);
        }
        /* Whoever sent someone a bad piece lately stays out (not us: we lead). */
        cand &= ~(blamed & ~(1ull << r->self_pos));
        for (;;) {
                int worst = -1, worst_missing = 0;
                for (unsigned i = 0; i < r->n_members; i++) {
                        if (!(cand & (1ull << i)))
                                continue;
                        int missing = 0;
                        for (unsigned j = 0; j < r->n_members; j++)
                                if (j != i && (cand & (1ull << j)) &&
                                    (!(views[i] & (1ull << j)) || !(views[j] & (1ull << i))))
                                        missing++;
                        if (missing > worst_missing || (missing && missing == worst_missing && i != r->self_pos)) {
                                worst = (int)i;
                                worst_missing = missing;
                        }
                }
                if (worst < 0)
                        break;
                if ((unsigned)worst == r->self_pos) /* keep ourselves: drop the others instead */
                        cand = 1ull << r->self_pos;
                else
                        cand &= ~(1ull << worst);
        }
        unsigned n = 0;
        for (unsigned i = 0; i < r->n_members; i++)
                if (cand & (1ull << i))
                        weights[n++] = w[i];
        *ret_round = round + 1;
        return cand;
}

/* Every member of the group ready, and linked to every other (as its
 * READY says): a ring in any order can run. */
static bool fully_connected(Coll *c, CollRound *r, uint64_t now) {
        uint64_t diverged = 0; /* not waited for */
        for (unsigned i = 0; i < r->n_members; i++)
                if (i != r->self_pos && member_out(&c->members[r->members[i]]))
                        diverged |= 1ull << i;
        for (unsigned i = 0; i < r->n_members; i++) {
                ReadyEntry *e = ready_find(c, r->group, r->members[i]);
                uint64_t view = i == r->self_pos ? coll_view(c, r->members, r->n_members)
                                : e && ready_fresh(c, e, now) ? e->msg.view : 0;
                if (diverged & (1ull << i))
                        continue;
                if ((view | diverged | (1ull << i)) != everyone(r))
                        return false;
        }
        return true;
}

static void joining_step(CollRound *r, uint64_t now) {
        Coll *c = r->coll;
        unsigned leader_pos = r->self_pos;
        for (unsigned i = 0; i < r->self_pos; i++) /* one that sits rounds out leads none */
                if (c->members[r->members[i]].up && !member_out(&c->members[r->members[i]])) {
                        leader_pos = i;
                        break;
                }

        if (leader_pos != r->self_pos) {
                unsigned leader = r->members[leader_pos];
                /* READY again now and then: a patient leader keeps it fresh;
                 * and at once when our links changed (a last round waits
                 * for a fully connected group) */
                uint64_t view = coll_view(c, r->members, r->n_members);
                if (r->leader_sent_to != leader || view != r->view_sent ||
                    now - r->ready_sent_ns >= (uint64_t)c->cfg.join_timeout_ms * MS / 4) {
                        uint8_t buf[COLL_CTL_MAX];
                        size_t n = coll_ready_encode(&(CollReady){ .group = r->group,
                                                                   .last_round = *coll_last_round(c, r->group),
                                                                   .weight = r->weight,
                                                                   .view = view,
                                                                   .blame = coll_blame(c, r->members, r->n_members),
                                                                   .final = r->final },
                                                     buf);
                        if (net_send_control(c->net, c->members[leader].peer, FRAME_CONTROL, buf, n) == 0) {
                                r->leader_sent_to = leader;
                                r->ready_sent_ns = now;
                                r->view_sent = view;
                        }
                }
                if (now >= r->join_deadline_ns)
                        round_fail(r, -ETIMEDOUT);
                return;
        }

        /* We lead: start once every connected member is ready, or at the
         * deadline. A last round waits for every member, connected yet or
         * not: it is what makes the replicas one model, and members that
         * trained only briefly may still be bringing their links up. */
        bool all = true;
        for (unsigned i = 0; i < r->n_members && all; i++) {
                unsigned m = r->members[i];
                ReadyEntry *e = ready_find(c, r->group, m);
                if (i != r->self_pos && (c->members[m].up || r->final) && !member_out(&c->members[m]) &&
                    (!e || !ready_fresh(c, e, now) || e->msg.final != r->final))
                        all = false;
        }
        if (all && r->final)
                all = fully_connected(c, r, now);
        /* A leader gives up on missing members at half the join timeout, so
         * the members that did say READY still hear START in time. */
        if (!all && now < r->start_ns + (uint64_t)r->join_ms * MS / 2)
                return;

        CollStart s = { .group = r->group, .final = r->final };
        s.participants = choose_participants(c, r, now, &s.round, s.weights);
        if (!all)
                note_unready(c, r, s.participants);
        s.n = (unsigned)__builtin_popcountll(s.participants);
        if (s.n == 1 && round_has_foreign(r))
                return round_fail(r, -EBADE); /* alone for want of a model like ours: no average */
        uint8_t buf[COLL_CTL_MAX];
        size_t n = coll_start_encode(&s, buf);
        for (unsigned i = 0; i < r->n_members; i++)
                if (i != r->self_pos && (s.participants & (1ull << i)))
                        (void)net_send_control(c->net, c->members[r->members[i]].peer, FRAME_CONTROL, buf, n);
        for (unsigned i = 0; i < r->n_members; i++) /* used: the next round needs new ones */
                if (s.participants & (1ull << i)) {
                        ReadyEntry *e = ready_find(c, r->group, r->members[i]);
                        if (e)
                                e->at_ns = 0;
                }
        start_running(r, s.round, s.participants, s.weights);
}

void round_on_abort(Coll *c, unsigned member, const CollAbort *m) {
        CollRound *r = round_of_group(c, m->group);
        ReadyEntry *e = ready_find(c, m->group, member);
        if (e) /* it gave up: its READY no longer holds (a leader must not START with it) */
                e->at_ns = 0;
        if (m->error == -ERANGE && !c->members[member].diverged) {
                /* its values are not finite: the rounds go on without it */
                c->members[member].diverged = true;
                c->diverged = (CollLoss){ .count = c->diverged.count + 1, .member = member, .reason = -ERANGE };
                if (c->members[member].up)
                        (void)net_peer_describe(c->net, c->members[member].peer, &c->diverged.info);
        }
        /* A participant that gave up a round of this group sends no piece of
         * ours: fail ours now rather than at the deadline (every piece is
         * then in whole or not applied, as with any failed round). Under
         * another number (a member that restarted counts from its own last
         * round, or the ABORT is of an older round) the others may not have
         * heard: tell them too (-ECANCELED sends ABORT; -ECONNABORTED not,
         * but from the leader, see round_fail()). */
        if (!r || r->state != COLL_ROUND_RUNNING)
                return;
        for (unsigned i = 0; i < r->n_part; i++)
                if (r->part[i] == member) {
                        round_fail(r, m->round == r->round ? -ECONNABORTED : -ECANCELED);
                        return;
                }
}

/* A neighbour lost is the round lost, but for a right neighbour that said
 * BYE: it stops once its round is done, with every piece it needed from
 * us, and what we still get from the left completes ours. If it stopped
 * mid-round instead, ours fails soon (RIGHT_GONE_GRACE_MS), not at the
 * deadline. */
#define RIGHT_GONE_GRACE_MS 2000
void round_on_member_lost(Coll *c, unsigned member, int reason) {
        for (CollRound *r = c->rounds; r; r = r->next) {
                if (r->freed || r->state != COLL_ROUND_RUNNING || (member != r->left && member != r->right))
                        continue;
                if (member == r->left || reason != 0) {
                        round_fail(r, -ECONNRESET);
                        continue;
                }
                r->right_gone = true;
                r->deadline_ns = MIN(r->deadline_ns, now_ns() + RIGHT_GONE_GRACE_MS * MS);
                flush_backlog(r); /* what waited for it goes nowhere */
                round_check_done(r);
        }
}

void round_tick(Coll *c, uint64_t now) {
        for (CollRound *r = c->rounds, *next; r; r = next) {
                next = r->next;
                if (r->freed) {
                        if (r->sending == 0)
                                round_unlink(r);
                        continue;
                }
                if (r->state == COLL_ROUND_JOINING)
                        joining_step(r, now);
                else if (r->state == COLL_ROUND_RUNNING) {
                        if (now >= r->deadline_ns)
                                round_fail(r, -ETIMEDOUT);
                        else if (r->backlog_n)
                                flush_backlog(r);
                }
        }
        coll_early_expire(c, now);
        /* READYs nobody can use any more */
        for (size_t i = 0; i < c->n_readies;)
                if (!ready_fresh(c, &c->readies[i], now))
                        c->readies[i] = c->readies[--c->n_readies];
                else
                        i++;
}

/* ---- the API ------------------------------------------------------------ */

int coll_round_start(Coll *c, uint32_t group, const unsigned *members, unsigned n, const float *x, size_t len,
                     double weight, CollRound **ret) {
        unsigned self_pos = UINT_MAX;
        if (n == 0 || n > COLL_MAX_MEMBERS || !x || len == 0 || !(weight > 0) || !isfinite(weight))
                return -EINVAL;
        for (unsigned i = 0; i < n; i++) {
                if (members[i] >= c->n_members || (i && members[i] <= members[i - 1]))
                        return -EINVAL;
                if (members[i] == c->self)
                        self_pos = i;
        }
        if (self_pos == UINT_MAX)
                return -EINVAL;
        if (round_of_group(c, group))
                return -EBUSY;
        if (!coll_last_round(c, group))
                return -ENOMEM;
        c->largest_round = MAX(c->largest_round, (uint64_t)len * sizeof(float));

        CollRound *r = calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        uint64_t now = now_ns();
        *r = (CollRound){
                .coll = c,
                .next = c->rounds,
                .uid = ++c->next_uid,
                .group = group,
                .n_members = n,
                .self_pos = self_pos,
                .x = x,
                .len = len,
                .weight = weight,
                .state = COLL_ROUND_JOINING,
                .start_ns = now,
                .join_ms = c->patience_ms ? c->patience_ms : c->cfg.join_timeout_ms,
                .final = c->final_next,
                /* a last round travels in float32: the replicas leave as one model at full precision */
                .payload = c->final_next ? COLL_PAYLOAD_F32 : c->cfg.payload,
                .leader_sent_to = UINT_MAX,
        };
        memcpy(r->members, members, n * sizeof *members);
        r->join_deadline_ns = now + (uint64_t)r->join_ms * MS;
        c->rounds = r;
        /* Our values are not finite (a diverged optimizer): nothing of ours
         * may go out, so we sit this round out. Its ABORT (-ERANGE) tells
         * the group at once: they neither wait for us nor take us for their
         * leader, and their round goes on without us. */
        if (!finite_f32(x, len))
                round_fail(r, -ERANGE);
        /* its first step is in the next coll_run(): the caller sets its
         * output and error feedback before any piece is touched */
        *ret = r;
        return 0;
}

void coll_set_patience(Coll *c, unsigned join_ms, bool final) {
        c->patience_ms = join_ms;
        c->final_next = final;
}

int coll_round_set_feedback(CollRound *r, float *err) {
        if (r->feedback)
                return -EBUSY;
        r->feedback = err;
        return 0;
}

bool coll_round_finished(const CollRound *r) {
        return r->state == COLL_ROUND_DONE || r->state == COLL_ROUND_FAILED;
}

int coll_round_set_output(CollRound *r, float *out) {
        if (r->out)
                return -EBUSY;
        if (r->identity && out != r->x) /* alone, and done already */
                memcpy(out, r->x, r->len * sizeof *out);
        r->out = out;
        r->out_around_cache = r->len * sizeof *out >= OUT_AROUND_CACHE_BYTES;
        /* pieces that came early, before START, may be complete already */
        for (unsigned i = 0; r->pieces && i < r->n_pieces; i++)
                if (r->pieces[i].flags & PIECE_DONE)
                        piece_output(r, &r->pieces[i], r->pieces[i].held);
        return 0;
}

void coll_round_info(const CollRound *r, CollRoundInfo *ret) {
        *ret = (CollRoundInfo){
                .state = r->state,
                .error = r->error,
                .round = r->round,
                .participants = r->n_part,
                .participants_map = r->part_map,
                .rank = r->rank,
                .pieces = r->identity ? 1 : r->n_pieces,
                .pieces_done = r->identity ? 1 : r->done,
                .total_weight = r->total_weight,
                .start_ns = r->start_ns,
                .running_ns = r->running_ns,
                .end_ns = r->end_ns,
                .bytes_sent = r->bytes_sent,
                .bytes_received = r->bytes_received,
        };
}

/* Values [first, first + n) of a quantized piece, decoded block by block. */
static void int8_read(const uint8_t *v, size_t first, size_t n, float *out) {
        float f[QUANT_BLOCK];
        while (n > 0) {
                size_t lo = first / QUANT_BLOCK * QUANT_BLOCK, k = first - lo, m = MIN(QUANT_BLOCK - k, n);
                quant_to_float(f, v + quant_size(lo), k + m);
                memcpy(out, f + k, m * sizeof *out);
                first += m;
                out += m;
                n -= m;
        }
}

/* Values [off, off + n) of piece p, as floats. */
static void piece_read(const CollRound *r, const Piece *p, size_t off, size_t n, float *out) {
        if (r->out) {
                if (out != r->out + off)
                        memmove(out, r->out + off, n * sizeof *out);
                return;
        }
        const uint8_t *v = piece_avg(p);
        switch (r->payload) {
        case COLL_PAYLOAD_F16: half_to_float(out, (const uint16_t *)v + (off - p->off), n); break;
        case COLL_PAYLOAD_INT8: int8_read(v, off - p->off, n, out); break;
        default: memcpy(out, (const float *)v + (off - p->off), n * sizeof *out); break;
        }
}

int coll_round_read(const CollRound *r, size_t off, size_t n, float *out) {
        if (off > r->len || n > r->len - off)
                return -EINVAL;
        if (r->identity) {
                memcpy(out, r->x + off, n * sizeof *out);
                return 0;
        }
        for (unsigned i = 0; i < r->n_pieces; i++) {
                const Piece *p = &r->pieces[i];
                size_t lo = MAX(off, p->off), hi = MIN(off + n, p->off + p->count);
                if (lo >= hi)
                        continue;
                if (!(p->flags & PIECE_DONE))
                        return -EAGAIN;
                piece_read(r, p, lo, hi - lo, out + (lo - off));
        }
        return 0;
}

int coll_round_piece(const CollRound *r, size_t i, size_t *ret_off, size_t *ret_len, bool *ret_done) {
        if (r->identity) {
                if (i > 0)
                        return -ERANGE;
                *ret_off = 0;
                *ret_len = r->len;
                *ret_done = true;
                return 0;
        }
        if (i >= r->n_pieces)
                return -ERANGE;
        *ret_off = r->pieces[i].off;
        *ret_len = r->pieces[i].count;
        *ret_done = r->pieces[i].flags & PIECE_DONE;
        return 0;
}

_simd_clones_ static void add_delta(float *restrict w, const float *restrict avg, const float *restrict x, size_t n) {
        for (size_t i = 0; i < n; i++)
                w[i] += avg[i] - x[i];
}

size_t coll_round_apply(const CollRound *r, float *w) {
        size_t changed = 0;
        if (r->identity)
                return 0;
        for (unsigned i = 0; i < r->n_pieces; i++) {
                const Piece *p = &r->pieces[i];
                if (!(p->flags & PIECE_DONE))
                        continue;
                if (r->out)
                        add_delta(w + p->off, r->out + p->off, r->x + p->off, p->count);
                else if (r->payload == COLL_PAYLOAD_F32)
                        add_delta(w + p->off, (const float *)piece_avg(p), r->x + p->off, p->count);
                else {
                        float tmp[BLOCK];
                        for (size_t k = 0; k < p->count; k += BLOCK) {
                                size_t m = MIN((size_t)BLOCK, p->count - k);
                                piece_read(r, p, p->off + k, m, tmp);
                                add_delta(w + p->off + k, tmp, r->x + p->off + k, m);
                        }
                }
                changed += p->count;
        }
        return changed;
}

void coll_round_free(CollRound *r) {
        if (!r)
                return;
        if (r->state == COLL_ROUND_RUNNING || r->state == COLL_ROUND_JOINING)
                round_fail(r, -ECANCELED);
        r->freed = true;
        if (r->sending == 0)
                round_unlink(r);
}
