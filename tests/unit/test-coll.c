/* Group all-reduce: the wire format, binary16, and whole rounds between
 * members in threads over real loopback TCP, held against exact arithmetic,
 * in float32, binary16 and 8 bits; and pieces forged with a NaN. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>

#include "../lib/coll-swarm.h"
#include "collective/coll-internal.h"
#include "collective/quant.h"
#include "tensor/half.h"
#include "util/rng.h"
#include "util/time-util.h"

/* ---- wire ---------------------------------------------------------------- */

Test(coll_wire, roundtrip_and_every_corruption) {
        uint8_t buf[COLL_CTL_MAX];
        CollCtl m;
        size_t n = coll_ready_encode(&(CollReady){ .group = 9, .last_round = 4, .weight = 3.5, .view = 0xf, .blame = 2 }, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0);
        cr_assert_eq(m.kind, COLL_READY);
        cr_assert(m.ready.group == 9 && m.ready.last_round == 4 && m.ready.weight == 3.5 && m.ready.view == 0xf &&
                  m.ready.blame == 2);
        cr_assert_eq(coll_ctl_decode(buf, n - 1, &m), -EBADMSG);
        cr_assert(!m.ready.final);
        n = coll_ready_encode(&(CollReady){ .group = 9, .weight = 1, .final = true }, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0);
        cr_assert(m.ready.final, "the last-round flag survives");
        buf[5] = 2;
        cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "unknown flags are refused");
        n = coll_abort_encode(&(CollAbort){ .group = 1, .round = 2, .error = -ETIMEDOUT }, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0);
        cr_assert_eq(m.abort.error, -ETIMEDOUT);
        buf[5] = 1;
        cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "ABORT has no last-round flag");

        CollStart s = { .group = 2, .round = 7, .participants = 0x15, .n = 3, .weights = { 1, 2, 3 } };
        n = coll_start_encode(&s, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0);
        cr_assert(m.kind == COLL_START && m.start.n == 3 && m.start.weights[2] == 3 && m.start.round == 7);
        /* the participant count must match the map */
        buf[32] = 2;
        cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG);
        buf[32] = 3;
        /* non-finite and non-positive weights */
        double bad[] = { NAN, INFINITY, 0, -1 };
        for (unsigned k = 0; k < 4; k++) {
                n = coll_start_encode(&(CollStart){ .group = 1, .round = 1, .participants = 1, .n = 1,
                                                    .weights = { bad[k] } }, buf);
                cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "weight %g accepted", bad[k]);
        }

        uint8_t piece[COLL_PIECE_HEADER + 16];
        CollPiece h;
        coll_piece_encode(&(CollPiece){ .phase = COLL_ALL_GATHER, .dtype = DTYPE_F32, .group = 3, .index = 5,
                                        .count = 4, .round = 11 }, piece);
        cr_assert_eq(coll_piece_decode(piece, sizeof piece, &h), 0);
        cr_assert(h.phase == COLL_ALL_GATHER && h.index == 5 && h.count == 4 && h.round == 11 && h.group == 3);
        cr_assert_eq(coll_piece_decode(piece, sizeof piece - 4, &h), -EBADMSG, "size disagrees with count");
        /* every header byte is checked or harmless */
        for (size_t i = 0; i < COLL_PIECE_HEADER; i++) {
                uint8_t save = piece[i];
                piece[i] ^= 0x40;
                int r = coll_piece_decode(piece, sizeof piece, &h);
                bool payload_field = (i >= 8 && i < 24); /* group, index, round: checked by the round */
                cr_assert(r == -EBADMSG || payload_field, "byte %zu flipped and accepted", i);
                piece[i] = save;
        }
}

Test(coll_wire, state_messages) {
        uint8_t buf[COLL_CTL_MAX];
        CollCtl m;
        size_t n = coll_state_ask_encode(&(CollStateAsk){ .group = 7, .values = 300000, .arrays = 3 }, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0);
        cr_assert(m.kind == COLL_STATE_ASK && m.ask.group == 7 && m.ask.values == 300000 && m.ask.arrays == 3);
        cr_assert_eq(coll_ctl_decode(buf, n - 1, &m), -EBADMSG);
        uint32_t bad_arrays[] = { 0, COLL_STATE_MAX_ARRAYS + 1 };
        for (unsigned k = 0; k < 2; k++) {
                n = coll_state_ask_encode(&(CollStateAsk){ .group = 7, .values = 1, .arrays = bad_arrays[k] }, buf);
                cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "%u arrays accepted", bad_arrays[k]);
        }
        uint64_t bad_values[] = { 0, (1ull << 40) + 1 };
        for (unsigned k = 0; k < 2; k++) {
                n = coll_state_ask_encode(&(CollStateAsk){ .group = 7, .values = bad_values[k], .arrays = 1 }, buf);
                cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG);
        }
        n = coll_state_ask_encode(&(CollStateAsk){ .group = 7, .values = 1, .arrays = 1 }, buf);
        buf[16] = 1; /* no round */
        cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG);
        n = coll_state_no_encode(&(CollStateNo){ .group = 7, .error = -EBUSY }, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0);
        cr_assert(m.kind == COLL_STATE_NO && m.no.group == 7 && m.no.error == -EBUSY);
        buf[5] = 1;
        cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "no last-round flag");
        n = coll_state_no_encode(&(CollStateNo){ .group = 7, .error = 5 }, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "an error is negative");
        n = coll_state_no_encode(&(CollStateNo){ .group = 7, .error = 0 }, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0, "or 0: a state of zeros");
        cr_assert(m.kind == COLL_STATE_NO && m.no.error == 0);

        uint8_t piece[COLL_PIECE_HEADER + 8];
        CollPiece h;
        coll_piece_encode(&(CollPiece){ .phase = COLL_STATE, .dtype = DTYPE_F32, .group = 7, .count = 2, .round = 9 },
                          piece);
        cr_assert_eq(coll_piece_decode(piece, sizeof piece, &h), 0);
        cr_assert(h.phase == COLL_STATE && h.round == 9);
        coll_piece_encode(&(CollPiece){ .phase = COLL_STATE, .dtype = DTYPE_F16, .group = 7, .count = 4 }, piece);
        cr_assert_eq(coll_piece_decode(piece, sizeof piece, &h), -EBADMSG, "a state is float32");
        piece[4] = COLL_STATE + 1;
        cr_assert_eq(coll_piece_decode(piece, sizeof piece, &h), -EBADMSG);
}

/* MODEL: the digest and count come back; a digest field of another length
 * (the message's size), a count past any model's, a flag, a group or a
 * round are refused. */
Test(coll_wire, model_message) {
        uint8_t buf[COLL_CTL_MAX + 8];
        CollModel a = { .digest = { 1, 2, 3, [31] = 0xff }, .values = 134912 }, b = a;
        CollCtl m;
        size_t n = coll_model_encode(&a, buf);
        cr_assert_eq(n, 64);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), 0);
        cr_assert_eq(m.kind, COLL_MODEL);
        cr_assert_eq(coll_model_check(&a, &m.model.model), 0);
        b.digest[31] ^= 1;
        cr_assert_eq(coll_model_check(&a, &b), -EBADE, "another digest");
        b = a;
        b.values = 133888;
        cr_assert_eq(coll_model_check(&a, &b), -EBADE, "another count");
        for (size_t k = 32; k < n + 8; k++)
                if (k != n)
                        cr_assert_eq(coll_ctl_decode(buf, k, &m), -EBADMSG, "%zu bytes", k);
        size_t at[] = { 5, 8, 16 }; /* flags, group, round */
        for (unsigned k = 0; k < 3; k++) {
                buf[at[k]] ^= 1;
                cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "byte %zu", at[k]);
                buf[at[k]] ^= 1;
        }
        a.values = COLL_MODEL_MAX_VALUES + 1;
        n = coll_model_encode(&a, buf);
        cr_assert_eq(coll_ctl_decode(buf, n, &m), -EBADMSG, "a count no model has");
}

Test(coll_wire, piece_size_per_dtype) {
        uint8_t piece[COLL_PIECE_HEADER + 4 * 300];
        CollPiece h;
        coll_piece_encode(&(CollPiece){ .phase = COLL_REDUCE_SCATTER, .dtype = DTYPE_Q8, .group = 1, .index = 0,
                                        .count = 300, .round = 1 }, piece);
        cr_assert_eq(coll_piece_decode(piece, COLL_PIECE_HEADER + quant_size(300), &h), 0);
        cr_assert_eq(h.dtype, DTYPE_Q8);
        cr_assert_eq(quant_size(300), 300 + 2 * 4);
        cr_assert_eq(coll_piece_decode(piece, COLL_PIECE_HEADER + quant_size(300) - 1, &h), -EBADMSG);
        cr_assert_eq(coll_piece_decode(piece, COLL_PIECE_HEADER + 300, &h), -EBADMSG, "a scale per block");
        cr_assert_eq(coll_piece_decode(piece, COLL_PIECE_HEADER + 4 * 300, &h), -EBADMSG);
        piece[5] = DTYPE_U8; /* a dtype no piece carries */
        cr_assert_eq(coll_piece_decode(piece, COLL_PIECE_HEADER + 300, &h), -EBADMSG);
        cr_assert_eq(coll_payload_dtype(COLL_PAYLOAD_F32), DTYPE_F32);
        cr_assert_eq(coll_payload_dtype(COLL_PAYLOAD_F16), DTYPE_F16);
        cr_assert_eq(coll_payload_dtype(COLL_PAYLOAD_INT8), DTYPE_Q8);
}

/* ---- binary16 ------------------------------------------------------------ */

Test(half, every_half_roundtrips_and_fast_path_matches_portable) {
        for (uint32_t h = 0; h < 65536; h++) {
                float f = half_to_float1((uint16_t)h);
                uint16_t back = half_from_float1(f);
                if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) /* NaN: stays NaN */
                        cr_assert((back & 0x7c00) == 0x7c00 && (back & 0x3ff), "NaN %04x", h);
                else
                        cr_assert_eq(back, h, "%04x -> %g -> %04x", h, f, back);
        }
        Rng rng;
        rng_seed(&rng, 5, 0);
        enum { N = 1 << 16 };
        static float in[N], out[N];
        static uint16_t fast[N];
        for (size_t i = 0; i < N; i++) {
                uint32_t u = (uint32_t)rng_next(&rng);
                memcpy(&in[i], &u, 4);
                if (i % 2)
                        in[i] = (rng_uniform(&rng) - 0.5f) * 1e-3f; /* many subnormal halves */
        }
        half_from_float(fast, in, N);
        for (size_t i = 0; i < N; i++) {
                uint16_t slow = half_from_float1(in[i]);
                if (isnan(in[i]))
                        cr_assert((fast[i] & 0x7c00) == 0x7c00 && (fast[i] & 0x3ff));
                else
                        cr_assert_eq(fast[i], slow, "%a: %04x vs %04x", in[i], fast[i], slow);
        }
        half_to_float(out, fast, N);
        for (size_t i = 0; i < N; i++)
                if (!isnan(in[i]))
                        cr_assert(out[i] == half_to_float1(fast[i]));
        /* ties go to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 */
        cr_assert_eq(half_from_float1(1.0f + 0x1p-11f), 0x3c00);
        cr_assert_eq(half_from_float1(1.0f + 3 * 0x1p-11f), 0x3c02);
        cr_assert_eq(half_from_float1(65520.0f), 0x7c00, "rounds to infinity");
        cr_assert_eq(half_from_float1(65519.0f), 0x7bff);
}

/* ---- rounds ---------------------------------------------------------------- */

static void fill(Swarm *s, size_t len, uint64_t seed, bool weighted) {
        Rng rng;
        rng_seed(&rng, seed, 0);
        for (unsigned i = 0; i < s->n; i++) {
                SwarmNode *nd = &s->node[i];
                nd->len = len;
                nd->x = malloc(len * sizeof *nd->x);
                nd->w = malloc(len * sizeof *nd->w);
                nd->avg = malloc(len * sizeof *nd->avg);
                nd->weight = weighted ? 1 + 100 * rng_uniform(&rng) : 1;
                for (size_t k = 0; k < len; k++) {
                        nd->x[k] = 4 * rng_uniform(&rng) - 2;
                        nd->w[k] = nd->x[k] + 0.25f; /* training moved on by 0.25 meanwhile */
                }
        }
}

static void release(Swarm *s) {
        for (unsigned i = 0; i < s->n; i++) {
                free(s->node[i].x);
                free(s->node[i].w);
                free(s->node[i].avg);
        }
}

/* All members bit-identical, within tol of the exact weighted average, and
 * w moved by exactly avg - x. */
static double check_average(Swarm *s, double tol) {
        size_t len = s->node[0].len;
        double W = 0, worst = 0;
        for (unsigned i = 0; i < s->n; i++) {
                cr_assert_eq(s->node[i].info.state, COLL_ROUND_DONE, "member %u: state %d error %d", i,
                             s->node[i].info.state, s->node[i].info.error);
                cr_assert_eq(s->node[i].info.participants, s->n);
                cr_assert_not_null(s->node[i].avg);
                W += s->node[i].weight;
        }
        for (size_t k = 0; k < len; k++) {
                long double exact = 0;
                for (unsigned i = 0; i < s->n; i++)
                        exact += (long double)s->node[i].weight * s->node[i].x[k];
                exact /= W;
                double err = fabs((double)(s->node[0].avg[k] - exact));
                worst = fmax(worst, err);
                cr_assert(err <= tol, "value %zu: %.9g vs exact %.9Lg", k, s->node[0].avg[k], exact);
        }
        for (unsigned i = 1; i < s->n; i++)
                cr_assert(memcmp(s->node[i].avg, s->node[0].avg, len * sizeof(float)) == 0,
                          "member %u holds different bits", i);
        for (unsigned i = 0; i < s->n; i++)
                for (size_t k = 0; k < len; k++)
                        cr_assert(fabsf(s->node[i].w[k] - (s->node[i].avg[k] + 0.25f)) < 1e-5f,
                                  "delta rule: member %u value %zu", i, k);
        return worst;
}

static void run(unsigned n, size_t len, size_t piece_bytes, CollPayload payload, bool weighted, bool plaintext,
                double tol) {
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        c.piece_bytes = piece_bytes;
        c.payload = payload;
        cr_assert_eq(swarm_init(&s, n, &c, plaintext), 0);
        fill(&s, len, n * 1000 + len, weighted);
        cr_assert_eq(swarm_round(&s), 0);
        double worst = check_average(&s, tol);
        cr_log_info("n=%u len=%zu payload %d: max error %.3g\n", n, len, payload, worst);
        release(&s);
        swarm_free(&s);
}

Test(coll, two_members) { run(2, 1000, 4096, COLL_PAYLOAD_F32, false, false, 1e-6); }
Test(coll, three_members_weighted_many_pieces) { run(3, 100003, 4096, COLL_PAYLOAD_F32, true, false, 1e-6); }
Test(coll, four_members_encrypted) { run(4, 300000, 1 << 20, COLL_PAYLOAD_F32, true, false, 1e-6); }
Test(coll, five_members_plaintext) { run(5, 77777, 16384, COLL_PAYLOAD_F32, false, true, 1e-6); }
Test(coll, fewer_values_than_members) { run(4, 3, 4096, COLL_PAYLOAD_F32, true, false, 1e-6); }
/* binary16 keeps 11 significant bits at every hop: values in [-2, 2] land
 * within a few units of 2^-10 */
Test(coll, fp16_payloads) { run(4, 50000, 8192, COLL_PAYLOAD_F16, true, false, 4e-3); }

/* ---- 8-bit payloads ------------------------------------------------------ */

/* Weighted values whose magnitude changes every 200 values, from 1e-3 to
 * 1e3, so blocks of very different scales sit side by side (and some
 * straddle two); the output written as pieces complete, too. */
static void fill_varied(Swarm *s, size_t len, uint64_t seed) {
        fill(s, len, seed, true);
        for (unsigned i = 0; i < s->n; i++) {
                SwarmNode *nd = &s->node[i];
                nd->out = malloc(len * sizeof *nd->out);
                for (size_t k = 0; k < len; k++)
                        nd->x[k] *= powf(10, (float)((k / 200) % 7) - 3);
        }
}

/* The 8-bit ring's bound for value k. Each of the P hops quantizes its
 * partial sum once (the last hop: the average, once more for nobody), each
 * within half a step of its block, absmax / 254 (quant.h; times 1 + 2^-15
 * for the float rounding of the scale and of q * scale). The block that
 * holds k lies within k +- 255, and a partial sum of weighted values is at
 * most M, their largest magnitude there, plus the errors of the hops before:
 *     E_h = E_(h-1) + (M + E_(h-1)) / 254 * (1 + 2^-15) + M * 2^-21,
 * the last term for the float32 products and sums of a hop; the bound is E_P. */
static double int8_bound(const Swarm *s, size_t k) {
        size_t len = s->node[0].len, lo = k >= 255 ? k - 255 : 0, hi = MIN(k + 256, len);
        double M = 0, E = 0;
        for (unsigned i = 0; i < s->n; i++)
                for (size_t j = lo; j < hi; j++)
                        M = fmax(M, fabsf(s->node[i].x[j]));
        for (unsigned h = 0; h < s->n; h++)
                E += (M + E) / 254 * (1 + 0x1p-15) + M * 0x1p-21;
        return E;
}

/* The bytes all members send in a round: every piece goes P - 1 hops in
 * each phase, its header and its blocks. */
static uint64_t int8_wire_bytes(unsigned P, size_t len, size_t per_piece) {
        uint64_t total = 0;
        for (unsigned k = 0; k < P; k++) {
                size_t lo = len * k / P, hi = len * (k + 1) / P;
                for (size_t off = lo; off < hi; off += per_piece)
                        total += 2 * (P - 1) * (COLL_PIECE_HEADER + quant_size(MIN(per_piece, hi - off)));
        }
        return total;
}

/* Members whose first value of every block is +-1000, weighed so that
 * they cancel: the running sums' blocks are a thousand times the
 * average's, and the bound is the members' magnitude's (ravnestd.conf(5)). */
static void cancel_block_heads(Swarm *s, size_t len) {
        for (unsigned i = 0; i < s->n; i++) {
                s->node[i].weight = 1;
                for (size_t k = 0; k < len; k += QUANT_BLOCK)
                        s->node[i].x[k] = i % 2 ? -1000 : 1000;
        }
}

static void run_int8(unsigned n, size_t len, bool cancel) {
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        c.piece_bytes = 4096; /* 15 blocks a piece: several pieces a chunk */
        c.payload = COLL_PAYLOAD_INT8;
        cr_assert_eq(swarm_init(&s, n, &c, false), 0);
        fill_varied(&s, len, n * 77 + len);
        if (cancel)
                cancel_block_heads(&s, len);
        cr_assert_eq(swarm_round(&s), 0);

        double W = 0, worst = 0;
        uint64_t sent = 0, received = 0;
        for (unsigned i = 0; i < n; i++) {
                cr_assert_eq(s.node[i].info.state, COLL_ROUND_DONE, "member %u: error %d", i, s.node[i].info.error);
                cr_assert_eq(s.node[i].info.participants, n);
                cr_assert_not_null(s.node[i].avg);
                W += s.node[i].weight;
                sent += s.node[i].info.bytes_sent;
                received += s.node[i].info.bytes_received;
        }
        for (size_t k = 0; k < len; k++) {
                long double exact = 0;
                for (unsigned i = 0; i < n; i++)
                        exact += (long double)s.node[i].weight * s.node[i].x[k];
                exact /= W;
                double err = fabs((double)(s.node[0].avg[k] - exact)), bound = int8_bound(&s, k);
                cr_assert(err <= bound, "value %zu: %.9g vs exact %.9Lg, bound %.3g", k, s.node[0].avg[k], exact,
                          bound);
                worst = fmax(worst, err / bound);
        }
        for (unsigned i = 0; i < n; i++) {
                cr_assert(memcmp(s.node[i].avg, s.node[0].avg, len * sizeof(float)) == 0, "member %u: other bits", i);
                cr_assert(memcmp(s.node[i].out, s.node[0].avg, len * sizeof(float)) == 0, "member %u: output", i);
        }
        cr_assert_eq(sent, int8_wire_bytes(n, len, 15 * QUANT_BLOCK), "bytes sent count the wire's");
        cr_assert_eq(received, sent);
        cr_log_info("int8, n=%u len=%zu: worst error %.2f of the bound, %" PRIu64 " bytes\n", n, len, worst, sent);
        for (unsigned i = 0; i < n; i++)
                free(s.node[i].out);
        release(&s);
        swarm_free(&s);
}

/* Error feedback: every member adds the error it carries where it
 * quantizes and keeps what that quantizing loses, so over R rounds of the
 * same values the errors telescope: the sum of the R averages is R times
 * the exact average less what the members still carry, up to float32
 * rounding, and the mean of the rounds comes within (what they carry) / R.
 * Without feedback, the same values give the same error every round. */
static void run_int8_feedback(unsigned n, size_t len, unsigned R) {
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        c.piece_bytes = 4096;
        c.payload = COLL_PAYLOAD_INT8;
        cr_assert_eq(swarm_init(&s, n, &c, false), 0);
        fill_varied(&s, len, 4242 + n);
        s.rounds = R;
        double W = 0, worst_once = 0, worst_mean = 0;
        for (unsigned i = 0; i < n; i++) {
                s.node[i].feedback = calloc(len, sizeof(float));
                s.node[i].history = malloc(R * len * sizeof(float));
                cr_assert(s.node[i].feedback && s.node[i].history);
                W += s.node[i].weight;
        }
        cr_assert_eq(swarm_round(&s), 0);
        for (unsigned i = 0; i < n; i++) {
                cr_assert_eq(s.node[i].info.state, COLL_ROUND_DONE, "member %u", i);
                cr_assert_eq(s.node[i].info.participants, n, "member %u", i);
                cr_assert(memcmp(s.node[i].history, s.node[0].history, R * len * sizeof(float)) == 0,
                          "member %u: other bits", i);
        }
        for (size_t k = 0; k < len; k++) {
                long double exact = 0, sum = 0;
                double carried = 0, M = 0, bound = int8_bound(&s, k);
                for (unsigned i = 0; i < n; i++) {
                        exact += (long double)s.node[i].weight * s.node[i].x[k];
                        carried += s.node[i].feedback[k];
                        M = fmax(M, fabsf(s.node[i].x[k]));
                }
                exact /= W;
                for (unsigned r = 0; r < R; r++)
                        sum += s.node[0].history[(size_t)r * len + k];
                double off = (double)(sum - R * exact);
                cr_assert(fabs(off + carried) <= R * n * M * 0x1p-20, "value %zu: %.9g + carried %.9g", k, off,
                          carried);
                cr_assert(fabs(off / R) <= bound * 2 / R, "value %zu: mean off by %.3g", k, off / R);
                worst_once = fmax(worst_once, fabs((double)(s.node[0].history[k] - exact)) / bound);
                worst_mean = fmax(worst_mean, fabs(off / R) / bound);
        }
        cr_log_info("int8 with feedback, n=%u, %u rounds: worst error of one round %.3f of the bound, of their mean "
                    "%.3f\n", n, R, worst_once, worst_mean);
        for (unsigned i = 0; i < n; i++) {
                free(s.node[i].out);
                free(s.node[i].feedback);
                free(s.node[i].history);
        }
        release(&s);
        swarm_free(&s);
}

Test(coll, int8_error_feedback_pays_errors_back) { run_int8_feedback(4, 5003, 8); }

/* chunks and pieces of whole blocks */
Test(coll, int8_three_members) { run_int8(3, 3 * 2 * 15 * QUANT_BLOCK, false); }
/* pieces whose last block is short */
Test(coll, int8_four_members_short_blocks) { run_int8(4, 5003, false); }
/* members' values cancel: within the bound of their own magnitudes */
Test(coll, int8_cancelling_members) { run_int8(4, 5003, true); }

/* ---- bad pieces ------------------------------------------------------------ */

typedef struct Forger {
        Coll *c;
        CollPayload payload;
        uint32_t count; /* values of piece 0 */
        unsigned to;    /* whom it sends it to */
        bool sane;      /* finite values: not a forgery, a piece sent to the wrong member */
} Forger;

/* A member sends member `to` a well-formed piece 0 of the running sum
 * whose first value (int8: the first block's scale) is a NaN, unless sane,
 * ahead of the real one. */
static void forge(void *ud, uint8_t phase, unsigned sent) {
        static uint8_t buf[COLL_PIECE_HEADER + 4096];
        Forger *f = ud;
        uint8_t dtype = coll_payload_dtype(f->payload);
        uint32_t bytes = COLL_PIECE_HEADER + (uint32_t)coll_payload_size(dtype, f->count);
        float nan = NAN;
        TensorDesc d;
        if (phase != COLL_REDUCE_SCATTER || sent != 0)
                return;
        cr_assert_leq(bytes, sizeof buf);
        memset(buf, 0, bytes);
        coll_piece_encode(&(CollPiece){ .phase = COLL_REDUCE_SCATTER, .dtype = dtype, .group = 0, .index = 0,
                                        .count = f->count, .round = 1 },
                          buf);
        if (!f->sane)
                memcpy(buf + COLL_PIECE_HEADER, &nan, sizeof nan);
        tensor_desc_init(&d, DTYPE_U8, 1, &bytes);
        int64_t peer = coll_peer(f->c, f->to);
        if (peer >= 0)
                net_send_tensor(coll_net(f->c), (uint32_t)peer, 0, &d, buf, 0);
}

/* A round of three members in which member `from` also sends the piece f
 * describes (f lives until the round is over). */
static void round_with_forger(Swarm *s, unsigned from, Forger *f, uint64_t seed) {
        CollConfig c;
        coll_config_defaults(&c);
        c.payload = f->payload;
        cr_assert_eq(swarm_init(s, 3, &c, false), 0);
        fill(s, 3000, seed, false);
        f->c = s->node[from].coll;
        coll_set_piece_hook(f->c, forge, f);
        cr_assert_eq(swarm_round(s), 0);
}

/* The round fails where the piece arrives, as a bad piece, the others give
 * it up too, and the sender is refused. */
static void forged(CollPayload payload) {
        Swarm s;
        Forger f = { .payload = payload, .count = 1000 /* chunk 0, one piece */ };
        round_with_forger(&s, 2, &f, 11);
        cr_assert_eq(s.node[0].info.state, COLL_ROUND_FAILED);
        cr_assert_eq(s.node[0].info.error, -EBADMSG);
        for (unsigned i = 1; i < 3; i++)
                cr_assert_eq(s.node[i].info.state, COLL_ROUND_FAILED, "member %u", i);
        cr_assert(!coll_connected(s.node[0].coll, 2), "the sender is refused");
        cr_assert(coll_connected(s.node[0].coll, 1));
        /* the lost link is recorded: whose, and where it was */
        CollLoss l = coll_loss(s.node[0].coll);
        cr_assert_eq(l.count, 1);
        cr_assert_eq(l.member, 2);
        cr_assert_eq(l.reason, COLL_DROP_REASON, "closed as dropped for it, not as a goodbye: %d", l.reason);
        cr_assert(strncmp(l.info.address, "127.0.0.1:", 10) == 0, "%s", l.info.address);
        cr_assert_eq(coll_loss(s.node[1].coll).count, 0);
        release(&s);
        swarm_free(&s);
}

/* Member 1 sends member 0, whose left neighbour is 2, a sane piece of the
 * round: as when two leaders started rounds of one number while links came
 * up. Both rounds are given up at once, and nobody is refused. */
Test(coll, a_piece_from_another_view_aborts_without_a_ban) {
        Swarm s;
        Forger f = { .payload = COLL_PAYLOAD_F32, .count = 1000, .to = 0, .sane = true };
        round_with_forger(&s, 1, &f, 12);
        cr_assert_eq(s.node[0].info.state, COLL_ROUND_FAILED);
        cr_assert_eq(s.node[0].info.error, -ESTALE);
        cr_assert_eq(s.node[1].info.state, COLL_ROUND_FAILED);
        cr_assert(coll_connected(s.node[0].coll, 1) && coll_connected(s.node[0].coll, 2), "nobody refused");
        cr_assert_eq(coll_loss(s.node[0].coll).count, 0);
        release(&s);
        swarm_free(&s);
}

/* ---- outputs written around the cache ---------------------------------------- */

Test(coll, copies_around_the_cache_are_exact_and_find_every_bad_value) {
        float a[80], out[96];
        for (unsigned k = 0; k < 80; k++)
                a[k] = (float)k * 0.37f - 9;
        for (unsigned align = 0; align < 8; align++)
                for (size_t n = 0; n <= 80; n += n < 9 ? 1 : 7) {
                        memset(out, 0xff, sizeof out);
                        cr_assert(copy_finite_f32_around(out + align, a, n), "align %u n %zu", align, n);
                        cr_assert(memcmp(out + align, a, n * sizeof(float)) == 0, "align %u n %zu", align, n);
                        for (size_t i = align + n; i < 96; i++)
                                cr_assert_eq(((uint32_t *)out)[i], 0xffffffffu, "wrote past the end");
                        for (size_t bad = 0; bad < n; bad += 1 + n / 4) {
                                float keep = a[bad];
                                a[bad] = bad % 2 ? NAN : -INFINITY;
                                cr_assert(!copy_finite_f32_around(out + align, a, n), "missed value %zu", bad);
                                a[bad] = keep;
                        }
                }
}

/* A vector too large for the cache: averages land in the output written
 * around it, the same bits as read back. */
Test(coll, a_large_output_written_around_the_cache) {
        Swarm s;
        CollConfig c;
        size_t len = (16u << 20) / sizeof(float) + 1001; /* one past the threshold, and odd */
        coll_config_defaults(&c);
        cr_assert_eq(swarm_init(&s, 3, &c, false), 0);
        fill(&s, len, 14, true);
        for (unsigned i = 0; i < 3; i++)
                cr_assert_not_null(s.node[i].out = malloc(len * sizeof(float)));
        cr_assert_eq(swarm_round(&s), 0);
        check_average(&s, 1e-6);
        for (unsigned i = 0; i < 3; i++) {
                cr_assert(memcmp(s.node[i].out, s.node[i].avg, len * sizeof(float)) == 0, "member %u", i);
                free(s.node[i].out);
        }
        release(&s);
        swarm_free(&s);
}

/* ---- a neighbour that leaves first ---------------------------------------- */

static atomic_bool member2_gone; /* member 2 freed its Coll: its BYEs are out */
static bool held_until_gone;

/* Member 0's second all-gather piece (member 2's chunk, which it passes on
 * to member 1, the last to get it) waits in its queue until member 2 is
 * gone. On links that keep their order, its first is its own chunk. */
static void hold_until_gone(void *ud, uint8_t phase, unsigned sent) {
        if (phase != COLL_ALL_GATHER || sent != 2)
                return;
        for (int i = 0; i < 5000 && !atomic_load(&member2_gone); i++)
                usleep(1000);
        held_until_gone = atomic_load(&member2_gone);
}

/* A round of group 0 over members 0, 1 and 2, once connected to all the
 * others, run to its end; its info in nd->info. NULL if it did not start. */
static CollRound *round_of_three(SwarmNode *nd) {
        CollRound *rd;
        for (int i = 0; i < 5000 && coll_n_connected(nd->coll) < 2; i++)
                coll_run(nd->coll, 2);
        if (coll_round_start(nd->coll, 0, (unsigned[]){ 0, 1, 2 }, 3, nd->x, nd->len, 1, &rd) < 0)
                return NULL;
        while (!coll_round_finished(rd))
                coll_run(nd->coll, 5);
        coll_round_info(rd, &nd->info);
        return rd;
}

/* A member's round; member 2 leaves the moment its own is done. */
static void *leaving_member(void *arg) {
        SwarmNode *nd = arg;
        Swarm *s = nd->swarm;
        CollRound *rd = round_of_three(nd);

        if (!rd)
                return NULL;
        if (coll_round_read(rd, 0, nd->len, nd->avg) < 0)
                nd->avg = mfree(nd->avg);
        coll_round_apply(rd, nd->w);
        coll_round_free(rd);
        if (nd->index == 2) {
                nd->coll = coll_free(nd->coll);
                atomic_store(&member2_gone, true);
                return NULL;
        }
        atomic_fetch_add(&s->finished, 1);
        while (atomic_load(&s->finished) < 2)
                coll_run(nd->coll, 2);
        return NULL;
}

/* Member 2 finishes first and says BYE while member 1, whose right
 * neighbour it is, still waits for a piece from member 0: member 1's round
 * drops what would have gone to member 2 and completes. */
Test(coll, a_right_neighbour_that_said_bye_when_done_does_not_fail_a_round) {
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        cr_assert_eq(swarm_init(&s, 3, &c, false), 0);
        fill(&s, 3000, 13, false);
        coll_set_piece_hook(s.node[0].coll, hold_until_gone, NULL);
        for (unsigned i = 0; i < 3; i++)
                cr_assert_eq(pthread_create(&s.node[i].thread, NULL, leaving_member, &s.node[i]), 0);
        for (unsigned i = 0; i < 3; i++)
                pthread_join(s.node[i].thread, NULL);
        check_average(&s, 1e-6);
        cr_assert(held_until_gone, "member 0 held its last piece until member 2 was gone");
        release(&s);
        swarm_free(&s);
}

Test(coll, bad_piece_f32_nan) { forged(COLL_PAYLOAD_F32); }

/* Member 2 is connected but never says READY: the round of 0 and 1 waits
 * half the join timeout for it, starts without it, and the leader names it
 * (coll_unready()), its link's address with it; member 1 leads nothing. */
static atomic_bool mute_stop;

static void *mute_member(void *arg) {
        SwarmNode *nd = arg;
        while (!atomic_load(&mute_stop))
                coll_run(nd->coll, 5);
        return NULL;
}

static void *ready_member(void *arg) {
        coll_round_free(round_of_three(arg));
        return NULL;
}

Test(coll, a_connected_member_that_never_says_ready_is_named) {
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        c.join_timeout_ms = 1000;
        cr_assert_eq(swarm_init(&s, 3, &c, false), 0);
        fill(&s, 3000, 17, false);
        atomic_store(&mute_stop, false);
        cr_assert_eq(pthread_create(&s.node[2].thread, NULL, mute_member, &s.node[2]), 0);
        for (unsigned i = 0; i < 2; i++)
                cr_assert_eq(pthread_create(&s.node[i].thread, NULL, ready_member, &s.node[i]), 0);
        for (unsigned i = 0; i < 2; i++)
                pthread_join(s.node[i].thread, NULL);
        atomic_store(&mute_stop, true);
        pthread_join(s.node[2].thread, NULL);
        for (unsigned i = 0; i < 2; i++) {
                cr_assert_eq(s.node[i].info.state, COLL_ROUND_DONE, "member %u: error %d", i, s.node[i].info.error);
                cr_assert_eq(s.node[i].info.participants, 2, "member %u", i);
        }
        CollLoss u = coll_unready(s.node[0].coll);
        cr_assert_eq(u.count, 1, "the leader counted %" PRIu64, u.count);
        cr_assert_eq(u.member, 2);
        cr_assert(strncmp(u.info.address, "127.0.0.1:", 10) == 0, "%s", u.info.address);
        cr_assert_eq(coll_unready(s.node[1].coll).count, 0);
        release(&s);
        swarm_free(&s);
}

/* Member i's round went on without member out, at once (not at half the
 * join timeout, as for a member that is merely slow), and every one of its
 * R rounds (its history) is the exact weighted average of the others. */
static void assert_done_without(const Swarm *s, const CollConfig *c, unsigned i, unsigned out, unsigned R) {
        const CollRoundInfo *in = &s->node[i].info;
        size_t len = s->node[i].len;
        double W = 0;
        for (unsigned j = 0; j < s->n; j++)
                W += j == out ? 0 : s->node[j].weight;
        cr_assert_eq(in->state, COLL_ROUND_DONE, "member %u: state %d error %d", i, in->state, in->error);
        cr_assert_eq(in->participants, s->n - 1, "member %u", i);
        cr_assert(!(in->participants_map & (1ull << out)), "member %u", i);
        cr_assert(in->running_ns - in->start_ns < (uint64_t)c->join_timeout_ms * 1000000ull / 4,
                  "member %u waited %.0f ms for member %u", i, (double)(in->running_ns - in->start_ns) / 1e6, out);
        for (unsigned r = 0; r < R; r++)
                for (size_t k = 0; k < len; k++) {
                        long double exact = 0;
                        for (unsigned j = 0; j < s->n; j++)
                                if (j != out)
                                        exact += (long double)s->node[j].weight * s->node[j].x[k];
                        exact /= W;
                        float got = s->node[i].history[(size_t)r * len + k];
                        cr_assert(fabs((double)(got - exact)) <= 1e-6, "member %u round %u value %zu: %.9g vs exact %.9Lg",
                                  i, r, k, got, exact);
                }
}

/* A member whose own values are not finite (its optimizer diverged) sits
 * its rounds out: each fails there at once (-ERANGE), and its ABORT tells
 * the others, which average without it, round after round, at once (not at
 * half the join timeout, as for a member that is merely slow), and can name
 * it. As member 0 it is every group's leader: the others take the next. */
static void a_member_diverged(unsigned sick) {
        enum { N = 4, LEN = 30000, R = 3 };
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        c.piece_bytes = 4096;
        cr_assert_eq(swarm_init(&s, N, &c, false), 0);
        fill(&s, LEN, 99 + sick, true);
        s.node[sick].x[LEN / 2] = NAN;
        s.node[sick].x[LEN - 1] = INFINITY;
        s.rounds = R;
        for (unsigned i = 0; i < N; i++) {
                s.node[i].history = calloc((size_t)R * LEN, sizeof(float));
                cr_assert_not_null(s.node[i].history);
        }
        cr_assert_eq(swarm_round(&s), 0);

        cr_assert_eq(s.node[sick].info.state, COLL_ROUND_FAILED);
        cr_assert_eq(s.node[sick].info.error, -ERANGE);
        for (unsigned i = 0; i < N; i++) {
                if (i == sick)
                        continue;
                assert_done_without(&s, &c, i, sick, R);
                CollLoss d = coll_diverged(s.node[i].coll);
                cr_assert_eq(d.count, 1, "member %u: %" PRIu64 " times", i, d.count);
                cr_assert_eq(d.member, sick);
                cr_assert_eq(d.reason, -ERANGE);
                cr_assert(coll_connected(s.node[i].coll, sick), "nobody is banned for it");
        }
        cr_assert_eq(coll_diverged(s.node[sick].coll).count, 0);
        for (unsigned i = 0; i < N; i++)
                free(s.node[i].history);
        release(&s);
        swarm_free(&s);
}

Test(coll, a_diverged_leader_sits_rounds_out) { a_member_diverged(0); }
Test(coll, a_diverged_member_sits_rounds_out) { a_member_diverged(2); }
Test(coll, bad_piece_int8_nan_scale) { forged(COLL_PAYLOAD_INT8); }

/* A member that trains another model (another digest of its layers, or
 * another parameter count) is refused by name at once, at both ends: the
 * others average among themselves, round after round, without waiting for
 * it, and its own rounds fail at once (-EBADE) instead of running alone. */
static void a_member_of_another_model(unsigned odd, bool same_count) {
        enum { N = 4, LEN = 30000, R = 3 };
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        c.piece_bytes = 4096;
        cr_assert_eq(swarm_init(&s, N, &c, false), 0);
        fill(&s, LEN, 77 + odd, true);
        CollModel ours = { .digest = { 0x1a, 0x2b }, .values = LEN }, theirs = ours;
        if (same_count)
                theirs.digest[0] = 0x3c; /* heads = 4 where the others have 2: the same shapes and count */
        else
                theirs.values = s.node[odd].len = LEN - 1024; /* a shorter context */
        for (unsigned i = 0; i < N; i++)
                s.node[i].coll->cfg.model = i == odd ? theirs : ours;
        s.rounds = R;
        for (unsigned i = 0; i < N; i++)
                cr_assert_not_null(s.node[i].history = calloc((size_t)R * LEN, sizeof(float)));
        cr_assert_eq(swarm_round(&s), 0);

        const CollRoundInfo *o = &s.node[odd].info;
        cr_assert_eq(o->state, COLL_ROUND_FAILED, "the odd member's round: state %d", o->state);
        cr_assert_eq(o->error, -EBADE, "the odd member's round failed with %d", o->error);
        cr_assert(o->end_ns - o->start_ns < (uint64_t)c.join_timeout_ms * 1000000ull / 4, "it waited %.0f ms",
                  (double)(o->end_ns - o->start_ns) / 1e6);
        CollForeign f = coll_foreign(s.node[odd].coll);
        cr_assert_eq(f.count, N - 1, "the odd member refused %" PRIu64 " members", f.count);
        cr_assert(coll_model_check(&ours, &f.theirs) == 0, "it names the others' model");
        for (unsigned i = 0; i < N; i++) {
                if (i == odd)
                        continue;
                assert_done_without(&s, &c, i, odd, R);
                f = coll_foreign(s.node[i].coll);
                cr_assert_eq(f.count, 1, "member %u refused %" PRIu64 " members", i, f.count);
                cr_assert_eq(f.member, odd, "member %u refused member %u", i, f.member);
                cr_assert(coll_model_check(&theirs, &f.theirs) == 0, "member %u names the odd model", i);
                cr_assert(coll_connected(s.node[i].coll, odd), "nobody is banned for it");
        }
        for (unsigned i = 0; i < N; i++)
                free(s.node[i].history);
        release(&s);
        swarm_free(&s);
}

Test(coll, a_member_of_another_model_is_refused) { a_member_of_another_model(2, true); }
Test(coll, a_leader_of_another_model_is_refused) { a_member_of_another_model(0, true); }
Test(coll, a_member_of_another_count_is_refused) { a_member_of_another_model(3, false); }
Test(coll, a_leader_of_another_count_is_refused) { a_member_of_another_model(0, false); }

Test(coll, alone_is_identity) {
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        cr_assert_eq(swarm_init(&s, 1, &c, false), 0);
        fill(&s, 100, 1, false);
        cr_assert_eq(swarm_round(&s), 0);
        cr_assert_eq(s.node[0].info.state, COLL_ROUND_DONE);
        cr_assert_eq(s.node[0].info.participants, 1);
        cr_assert(memcmp(s.node[0].avg, s.node[0].x, 100 * sizeof(float)) == 0);
        release(&s);
        swarm_free(&s);
}

Test(coll, bad_arguments) {
        Swarm s;
        CollConfig c;
        CollRound *r;
        float x[4] = {};
        coll_config_defaults(&c);
        cr_assert_eq(swarm_init(&s, 2, &c, false), 0);
        Coll *k = s.node[0].coll;
        cr_assert_eq(coll_round_start(k, 0, (unsigned[]){ 1 }, 1, x, 4, 1, &r), -EINVAL, "self not a member");
        cr_assert_eq(coll_round_start(k, 0, (unsigned[]){ 1, 0 }, 2, x, 4, 1, &r), -EINVAL, "not increasing");
        cr_assert_eq(coll_round_start(k, 0, (unsigned[]){ 0, 5 }, 2, x, 4, 1, &r), -EINVAL, "no such member");
        cr_assert_eq(coll_round_start(k, 0, (unsigned[]){ 0, 1 }, 2, x, 4, NAN, &r), -EINVAL);
        cr_assert_eq(coll_round_start(k, 0, (unsigned[]){ 0, 1 }, 2, x, 0, 1, &r), -EINVAL);
        cr_assert_eq(coll_round_start(k, 0, (unsigned[]){ 0, 1 }, 2, x, 4, 1, &r), 0);
        CollRound *r2;
        cr_assert_eq(coll_round_start(k, 0, (unsigned[]){ 0, 1 }, 2, x, 4, 1, &r2), -EBUSY);
        coll_round_free(r);
        swarm_free(&s);
}

/* A START naming every member of a group of 64 (the most a group holds, and
 * the default group_size) and of 63: the round starts, the leader is not
 * taken for a liar; a START naming a 64th member of a group of 63 is a lie. */
static void start_of_everyone(unsigned n) {
        static CollMember members[64];
        static const uint8_t secret[32] = { 1 };
        static float x[4096];
        Identity id;
        NetConfig nc;
        CollConfig cc;
        Coll *c;
        CollRound *r;
        unsigned idx[64];

        identity_generate(&id);
        net_config_defaults(&nc);
        nc.identity = &id;
        nc.secret = secret;
        nc.backend = NET_BACKEND_EPOLL;
        for (unsigned i = 0; i < n; i++) {
                members[i].id[0] = (uint8_t)i;
                snprintf(members[i].host, sizeof members[i].host, "127.0.0.1");
                members[i].port = 1;
                idx[i] = i;
        }
        coll_config_defaults(&cc);
        cc.net = &nc;
        cc.members = members;
        cc.n_members = n;
        cc.self = 10;
        cr_assert_eq(coll_new(&cc, &c), 0);
        cr_assert_eq(coll_round_start(c, 7, idx, n, x, 4096, 1.0, &r), 0);
        CollStart s = { .group = 7, .round = 1, .n = n, .participants = n == 64 ? ~0ull : (1ull << n) - 1 };
        for (unsigned i = 0; i < n; i++)
                s.weights[i] = 1.0;
        if (n < 64) { /* a member the group does not have */
                CollStart more = s;
                more.participants |= 1ull << n;
                cr_assert_eq(round_on_start(c, 0, &more), -EBADMSG);
        }
        cr_assert_eq(round_on_start(c, 0, &s), 0, "n = %u: the leader's START refused", n);
        CollRoundInfo info;
        coll_round_info(r, &info);
        /* it ran (and failed at once: the members are not there to link to) */
        cr_assert_neq(info.state, COLL_ROUND_JOINING, "n = %u", n);
        cr_assert(info.round == 1 && info.participants == n, "n = %u", n);
        cr_assert_neq(info.error, -EBADMSG);
        coll_round_free(r);
        coll_free(c);
}

Test(coll, a_start_naming_all_64_members) {
        start_of_everyone(64);
        start_of_everyone(63);
}

/* A member that sends pieces of rounds that never start, each for another
 * group, holds at most 64 MiB (twice the largest vector averaged here, once
 * there is one) and makes no entry in the group table, nor do its STARTs
 * of such groups (each made one, searched at every message after: an
 * outside test's 250,000 slowed the averaging thread forty-fold); those pieces go once
 * a round's time has passed; its READYs for made-up groups are kept 64 at
 * most, another member's still. (They were held by count alone, 4096
 * pieces of up to 256 MiB: 1.7 GB in an outside test.) */
static NetTensor *piece_tensor(uint32_t bytes) {
        NetTensor *t = calloc(1, sizeof *t);
        cr_assert(t);
        tensor_desc_init(&t->desc, DTYPE_U8, 1, &bytes);
        t->data = malloc(bytes); /* not touched: no page is faulted in */
        cr_assert(t->data);
        return t;
}

Test(coll, pieces_and_readies_of_groups_that_never_start_are_bounded) {
        static CollMember members[3];
        static const uint8_t secret[32] = { 1 };
        Identity id;
        NetConfig nc;
        CollConfig cc;
        Coll *c;

        identity_generate(&id);
        net_config_defaults(&nc);
        nc.identity = &id;
        nc.secret = secret;
        nc.backend = NET_BACKEND_EPOLL;
        for (unsigned i = 0; i < 3; i++) {
                members[i].id[0] = (uint8_t)i;
                snprintf(members[i].host, sizeof members[i].host, "127.0.0.1");
                members[i].port = 1;
        }
        coll_config_defaults(&cc);
        cc.net = &nc;
        cc.members = members;
        cc.n_members = 3;
        cc.self = 0;
        cr_assert_eq(coll_new(&cc, &c), 0);

        unsigned held = 0;
        for (uint32_t g = 0; g < 200; g++) {
                CollPiece h = { .phase = COLL_REDUCE_SCATTER, .dtype = DTYPE_F32, .group = 1000 + g, .count = 1,
                                .round = 5 };
                held += round_on_piece(c, 1, &h, piece_tensor(1 << 20)) == 0;
        }
        cr_assert_eq(held, 64, "%u pieces of 1 MiB held", held);
        cr_assert_leq(c->early_bytes, (uint64_t)64 << 20);
        cr_assert_eq(c->n_groups, 0, "pieces made %zu group entries", c->n_groups);
        for (uint32_t g = 0; g < 1000; g++) /* STARTs of groups with no round here */
                cr_assert_eq(round_on_start(c, 1, &(CollStart){ .group = 9000 + g, .round = 1, .n = 1,
                                                                .participants = 1, .weights = { 1 } }), 0);
        cr_assert_eq(c->n_groups, 0, "STARTs made %zu group entries", c->n_groups);
        coll_early_expire(c, now_ns() + ((uint64_t)cc.join_timeout_ms + cc.round_timeout_ms + 1) * 1000000ull);
        cr_assert(c->n_early == 0 && c->early_bytes == 0, "%u pieces left", c->n_early);

        for (uint32_t g = 0; g < 1000; g++)
                round_on_ready(c, 1, &(CollReady){ .group = 5000 + g, .weight = 1 });
        round_on_ready(c, 2, &(CollReady){ .group = 7, .weight = 1 });
        cr_assert_eq(c->n_readies, 65, "%zu READYs kept", c->n_readies);
        coll_free(c);
}

/* ---- an optimizer's state for a joiner ------------------------------------ */

typedef struct Giver {
        Coll *c;
        const float *arrays[2];
        uint64_t steps;
        int refuse;  /* answer with this error */
        bool forge;  /* a NaN in the first piece */
        bool zero;   /* say the state is zero */
        unsigned asked;
} Giver;

static void give(void *ud, unsigned member, const CollStateAsk *m) {
        Giver *g = ud;
        g->asked++;
        if (g->refuse) {
                cr_assert_eq(coll_state_refuse(g->c, member, m->group, g->refuse), 0);
                return;
        }
        if (g->zero) {
                cr_assert_eq(coll_state_give_zero(g->c, member, m->group), 0);
                return;
        }
        cr_assert_eq(m->arrays, 2);
        uint8_t *buf = malloc(coll_state_bytes(m->values, m->arrays));
        cr_assert(buf);
        coll_state_fill(buf, m->group, g->arrays, m->arrays, m->values, g->steps);
        if (g->forge)
                memcpy(buf + COLL_PIECE_HEADER, &(float){ NAN }, sizeof(float));
        cr_assert_eq(coll_state_give(g->c, member, buf, m->group, m->values, m->arrays), 0);
}

/* Every member runs in this thread, in turn, until cond holds. */
static void run_all(Swarm *s, bool (*cond)(Swarm *s, void *arg), void *arg) {
        uint64_t deadline = now_ns() + 20 * NSEC_PER_SEC;
        while (!cond(s, arg)) {
                cr_assert_lt(now_ns(), deadline, "timed out");
                for (unsigned i = 0; i < s->n; i++)
                        coll_run(s->node[i].coll, 1);
        }
}

static bool all_linked(Swarm *s, void *arg) {
        for (unsigned i = 0; i < s->n; i++)
                if (coll_n_connected(s->node[i].coll) != s->n - 1)
                        return false;
        return true;
}

static bool fetched(Swarm *s, void *arg) {
        uint64_t steps;
        unsigned member;
        return coll_state_fetched(s->node[2].coll, 5, &steps, &member) != -EINPROGRESS;
}

static bool none_giving(Swarm *s, void *arg) {
        return coll_state_giving(s->node[0].coll) == 0 && coll_state_giving(s->node[1].coll) == 0;
}

/* Member 2 asks the group's members in turn for two arrays of 300,000
 * values (five pieces, the last one short); members 0 and 1 answer as
 * givers[0] and [1] say. The outcome, and what arrived. */
static int fetch_from(Giver *givers, uint64_t *ret_steps, unsigned *ret_member, Swarm *s, float *got) {
        enum { V = 300000 };
        static float m[2][V];
        CollConfig c;
        coll_config_defaults(&c);
        cr_assert_eq(swarm_init(s, 3, &c, false), 0);
        for (size_t i = 0; i < V; i++) {
                m[0][i] = (float)i * 0.5f;
                m[1][i] = (float)(V - i);
        }
        for (unsigned i = 0; i < 2; i++) {
                givers[i].c = s->node[i].coll;
                givers[i].arrays[0] = m[0];
                givers[i].arrays[1] = m[1];
                coll_set_state_hook(s->node[i].coll, give, &givers[i]);
        }
        run_all(s, all_linked, NULL);
        float *dst[2] = { got, got + V };
        for (size_t i = 0; i < 2 * V; i++)
                got[i] = NAN;
        cr_assert_eq(coll_state_fetch(s->node[2].coll, 5, (unsigned[]){ 0, 1, 2 }, 3, dst, 2, V), 0);
        cr_assert_eq(coll_state_fetch(s->node[2].coll, 5, (unsigned[]){ 0, 1, 2 }, 3, dst, 2, V), -EINVAL,
                     "one fetch per group");
        run_all(s, fetched, NULL);
        int r = coll_state_fetched(s->node[2].coll, 5, ret_steps, ret_member);
        bool zero = r == 0 && givers[*ret_member].zero;
        if (r == 0)
                for (size_t i = 0; i < V; i++)
                        cr_assert(got[i] == (zero ? 0 : m[0][i]) && got[V + i] == (zero ? 0 : m[1][i]), "value %zu",
                                  i);
        run_all(s, none_giving, NULL); /* the pieces sent, their buffers freed */
        return r;
}

/* The bytes of the state's pieces, sent by member and received by member 2. */
static void expect_traffic(Swarm *s, unsigned member, uint64_t bytes) {
        uint64_t sent, received;
        coll_state_traffic(s->node[member].coll, &sent, &received);
        cr_assert(sent == bytes && received == 0, "member %u sent %llu", member, (unsigned long long)sent);
        coll_state_traffic(s->node[2].coll, &sent, &received);
        cr_assert(sent == 0 && received == bytes, "member 2 received %llu", (unsigned long long)received);
}

Test(coll_state, a_busy_member_sends_the_joiner_on_to_the_next) {
        static float got[600000];
        Giver g[2] = { { .refuse = -EBUSY }, { .steps = 77 } };
        uint64_t steps = 0;
        unsigned member = 9;
        Swarm s;
        cr_assert_eq(fetch_from(g, &steps, &member, &s, got), 0);
        cr_assert(steps == 77 && member == 1 && g[0].asked == 1 && g[1].asked == 1);
        expect_traffic(&s, 1, 2 * 300000 * sizeof(float) + 5 * COLL_PIECE_HEADER); /* five pieces */
        swarm_free(&s);
}

Test(coll_state, a_state_of_zeros_travels_as_a_word) {
        static float got[600000];
        Giver g[2] = { { .zero = true }, { .steps = 6 } };
        uint64_t steps = 9;
        unsigned member = 9;
        Swarm s;
        cr_assert_eq(fetch_from(g, &steps, &member, &s, got), 0);
        cr_assert(steps == 0 && member == 0 && g[1].asked == 0);
        expect_traffic(&s, 0, 0);
        swarm_free(&s);
}

Test(coll_state, a_forged_piece_refuses_its_sender) {
        static float got[600000];
        Giver g[2] = { { .forge = true, .steps = 5 }, { .steps = 6 } };
        uint64_t steps = 0;
        unsigned member = 9;
        Swarm s;
        cr_assert_eq(fetch_from(g, &steps, &member, &s, got), 0);
        cr_assert(steps == 6 && member == 1);
        cr_assert(!coll_connected(s.node[2].coll, 0), "the forger is refused");
        swarm_free(&s);
}

Test(coll_state, nobody_gives) {
        static float got[600000];
        Giver g[2] = { { .refuse = -ENODATA }, { .refuse = -EBUSY } };
        uint64_t steps;
        unsigned member;
        Swarm s;
        cr_assert_eq(fetch_from(g, &steps, &member, &s, got), -EBUSY, "the last refusal");
        swarm_free(&s);
}

/* ---- an ABORT a joining member could not take ------------------------------- */

typedef struct AbortRace {
        CollRound *r[2];  /* members 0 (the leader) and 1 */
        uint64_t frames1; /* frames member 1 had received before member 2's ABORT */
} AbortRace;

/* Member 2 speaks by hand: one control message to one member. */
static void member2_says(Swarm *s, unsigned to, const uint8_t *buf, size_t n) {
        Coll *c = s->node[2].coll;
        cr_assert_eq(net_send_control(coll_net(c), coll_peer(c, to), FRAME_CONTROL, buf, n), 0);
}

static uint64_t frames_received(Swarm *s, unsigned i) {
        NetStats ns;
        net_get_stats(coll_net(s->node[i].coll), &ns);
        return ns.frames_received;
}

static bool leader_has_readies(Swarm *s, void *arg) {
        return s->node[0].coll->n_readies == (size_t)(uintptr_t)arg;
}

static bool member1_heard(Swarm *s, void *arg) {
        return frames_received(s, 1) > ((AbortRace *)arg)->frames1;
}

static bool state_is(Swarm *s, void *arg, CollRoundState want) {
        AbortRace *a = arg;
        for (unsigned i = 0; i < 2; i++) {
                CollRoundInfo info;
                coll_round_info(a->r[i], &info);
                if (info.state != want)
                        return false;
        }
        return true;
}

static bool both_running(Swarm *s, void *arg) { return state_is(s, arg, COLL_ROUND_RUNNING); }
static bool both_failed(Swarm *s, void *arg) { return state_is(s, arg, COLL_ROUND_FAILED); }

/* Member 2 says READY to the leader, then gives up while joining: its
 * ABORT reaches member 1 before the leader's START does (member 1 drops
 * it: it is not running yet), and the leader only after its START went
 * out. Member 1 learns from the leader, whose ABORT follows its START on
 * the same link, and fails at once, not at the round's deadline. */
Test(coll, an_abort_a_joining_member_dropped_reaches_it_from_the_leader) {
        Swarm s;
        CollConfig c;
        coll_config_defaults(&c);
        c.round_timeout_ms = 120000; /* longer than run_all() waits */
        cr_assert_eq(swarm_init(&s, 3, &c, false), 0);
        fill(&s, 3000, 17, false);
        run_all(&s, all_linked, NULL);
        const unsigned members[] = { 0, 1, 2 };
        AbortRace a = {};
        uint8_t buf[COLL_CTL_MAX];

        cr_assert_eq(coll_round_start(s.node[1].coll, 0, members, 3, s.node[1].x, 3000, 1, &a.r[1]), 0);
        run_all(&s, leader_has_readies, (void *)1);
        CollReady ready = { .group = 0, .weight = 1, .view = coll_view(s.node[2].coll, members, 3) };
        member2_says(&s, 0, buf, coll_ready_encode(&ready, buf));
        run_all(&s, leader_has_readies, (void *)2);
        a.frames1 = frames_received(&s, 1);
        member2_says(&s, 1, buf, coll_abort_encode(&(CollAbort){ .group = 0, .round = 1, .error = -ECANCELED }, buf));
        run_all(&s, member1_heard, &a);

        cr_assert_eq(coll_round_start(s.node[0].coll, 0, members, 3, s.node[0].x, 3000, 1, &a.r[0]), 0);
        run_all(&s, both_running, &a);
        CollRoundInfo info;
        coll_round_info(a.r[0], &info);
        cr_assert_eq(info.participants, 3, "the leader started with member 2");
        member2_says(&s, 0, buf, coll_abort_encode(&(CollAbort){ .group = 0, .round = 1, .error = -ECANCELED }, buf));
        run_all(&s, both_failed, &a);
        for (unsigned i = 0; i < 2; i++) {
                coll_round_info(a.r[i], &info);
                cr_assert_eq(info.error, -ECONNABORTED, "member %u: %d", i, info.error);
                coll_round_free(a.r[i]);
        }
        release(&s);
        swarm_free(&s);
}
