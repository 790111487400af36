/* collective/coll-wire.c — encoding and checked decoding of round messages. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "coll-wire.h"
#include "net/frame.h"
#include "quant.h"

#define CTL_MAGIC 0x32435652u   /* "RVC2": version 2 brought MODEL */
#define FLAG_FINAL 0x01
#define PIECE_MAGIC 0x31505652u /* "RVP1" */

static void put_f64(uint8_t *p, double v) {
        uint64_t u;
        memcpy(&u, &v, sizeof u);
        put_le64(p, u);
}

static double get_f64(const uint8_t *p) {
        uint64_t u = get_le64(p);
        double v;
        memcpy(&v, &u, sizeof v);
        return v;
}

static bool weight_ok(double w) {
        return isfinite(w) && w > 0 && w <= 1e15;
}

/*  0 u32 magic, 4 u8 kind, 5 u8 flags (READY, START: 1 final), 6..7 zero,
 *  8 u32 group, 12 u32 zero, 16 u64 round (STATE_ASK, STATE_NO: zero),
 * READY: 24 f64 weight, 32 u64 view, 40 u64 blame            (48 bytes)
 * START: 24 u64 participants, 32 u32 n, 36 zero, 40 n x f64 (40 + 8n bytes)
 * ABORT, STATE_NO: 24 i32 error (STATE_NO: 0, a zero state), 28 zero (32 bytes)
 * STATE_ASK: 24 u64 values, 32 u32 arrays, 36 zero           (40 bytes)
 * MODEL: 24 digest (32 bytes), 56 u64 values                 (64 bytes) */
#define MODEL_SIZE (24 + COLL_MODEL_DIGEST_SIZE + 8)

int coll_model_check(const CollModel *ours, const CollModel *theirs) {
        return ours->values == theirs->values && memcmp(ours->digest, theirs->digest, sizeof ours->digest) == 0 ?
                       0 : -EBADE;
}

static void ctl_head(uint8_t *out, uint8_t kind, uint32_t group, uint64_t round) {
        memset(out, 0, 24);
        put_le32(out, CTL_MAGIC);
        out[4] = kind; /* out[5]: flags, COLL_FLAG_FINAL */
        put_le32(out + 8, group);
        put_le64(out + 16, round);
}

size_t coll_ready_encode(const CollReady *m, uint8_t *out) {
        ctl_head(out, COLL_READY, m->group, m->last_round);
        out[5] = m->final ? FLAG_FINAL : 0;
        put_f64(out + 24, m->weight);
        put_le64(out + 32, m->view);
        put_le64(out + 40, m->blame);
        return COLL_READY_SIZE;
}

size_t coll_start_encode(const CollStart *m, uint8_t *out) {
        ctl_head(out, COLL_START, m->group, m->round);
        out[5] = m->final ? FLAG_FINAL : 0;
        put_le64(out + 24, m->participants);
        put_le32(out + 32, m->n);
        put_le32(out + 36, 0);
        for (unsigned i = 0; i < m->n; i++)
                put_f64(out + 40 + 8 * i, m->weights[i]);
        return 40 + 8 * (size_t)m->n;
}

size_t coll_abort_encode(const CollAbort *m, uint8_t *out) {
        ctl_head(out, COLL_ABORT, m->group, m->round);
        put_le32(out + 24, (uint32_t)m->error);
        put_le32(out + 28, 0);
        return 32;
}

size_t coll_state_ask_encode(const CollStateAsk *m, uint8_t *out) {
        ctl_head(out, COLL_STATE_ASK, m->group, 0);
        put_le64(out + 24, m->values);
        put_le32(out + 32, m->arrays);
        put_le32(out + 36, 0);
        return 40;
}

size_t coll_state_no_encode(const CollStateNo *m, uint8_t *out) {
        ctl_head(out, COLL_STATE_NO, m->group, 0);
        put_le32(out + 24, (uint32_t)m->error);
        put_le32(out + 28, 0);
        return 32;
}

size_t coll_model_encode(const CollModel *m, uint8_t *out) {
        ctl_head(out, COLL_MODEL, 0, 0);
        memcpy(out + 24, m->digest, COLL_MODEL_DIGEST_SIZE);
        put_le64(out + 24 + COLL_MODEL_DIGEST_SIZE, m->values);
        return MODEL_SIZE;
}

/* MODEL: no group, no round, no flag; a digest of its size, a count no
 * model has more of. */
static int decode_model(const uint8_t *in, size_t len, CollModel *m) {
        if (len != MODEL_SIZE || in[5] || get_le32(in + 8) || get_le64(in + 16))
                return -EBADMSG;
        memcpy(m->digest, in + 24, COLL_MODEL_DIGEST_SIZE);
        m->values = get_le64(in + 24 + COLL_MODEL_DIGEST_SIZE);
        return m->values <= COLL_MODEL_MAX_VALUES ? 0 : -EBADMSG;
}

static bool error_ok(int32_t e) {
        return e < 0 && e >= -4095;
}

/* STATE_ASK, STATE_NO: no round, no flag. */
static int decode_state(const uint8_t *in, size_t len, CollCtl *m) {
        if (in[5] || get_le64(in + 16))
                return -EBADMSG;
        if (m->kind == COLL_STATE_NO) {
                m->no = (CollStateNo){ .group = get_le32(in + 8), .error = (int32_t)get_le32(in + 24) };
                bool zero = m->no.error == 0; /* the giver's state is zero */
                return len == 32 && !get_le32(in + 28) && (zero || error_ok(m->no.error)) ? 0 : -EBADMSG;
        }
        if (len != 40 || get_le32(in + 36))
                return -EBADMSG;
        m->ask = (CollStateAsk){ .group = get_le32(in + 8), .values = get_le64(in + 24), .arrays = get_le32(in + 32) };
        return m->ask.values >= 1 && m->ask.values <= 1ull << 40 && m->ask.arrays >= 1 &&
                               m->ask.arrays <= COLL_STATE_MAX_ARRAYS ? 0 : -EBADMSG;
}

int coll_ctl_decode(const uint8_t *in, size_t len, CollCtl *ret) {
        if (len < 32 || get_le32(in) != CTL_MAGIC || (in[5] & ~FLAG_FINAL) || in[6] || in[7] || get_le32(in + 12))
                return -EBADMSG;
        CollCtl m = { .kind = in[4] };
        bool final = in[5] & FLAG_FINAL;
        if (final && m.kind == COLL_ABORT)
                return -EBADMSG;
        switch (m.kind) {
        case COLL_ABORT:
                m.abort = (CollAbort){
                        .group = get_le32(in + 8),
                        .round = get_le64(in + 16),
                        .error = (int32_t)get_le32(in + 24),
                };
                if (len != 32 || get_le32(in + 28) || !error_ok(m.abort.error))
                        return -EBADMSG;
                break;
        case COLL_MODEL:
                if (decode_model(in, len, &m.model.model) < 0)
                        return -EBADMSG;
                break;
        case COLL_STATE_ASK:
        case COLL_STATE_NO:
                if (decode_state(in, len, &m) < 0)
                        return -EBADMSG;
                break;
        case COLL_READY:
                if (len != COLL_READY_SIZE)
                        return -EBADMSG;
                m.ready = (CollReady){
                        .group = get_le32(in + 8),
                        .last_round = get_le64(in + 16),
                        .weight = get_f64(in + 24),
                        .view = get_le64(in + 32),
                        .blame = get_le64(in + 40),
                        .final = final,
                };
                if (!weight_ok(m.ready.weight))
                        return -EBADMSG;
                break;
        case COLL_START: {
                CollStart *s = &m.start;
                if (len < 40)
                        return -EBADMSG;
                s->group = get_le32(in + 8);
                s->round = get_le64(in + 16);
                s->participants = get_le64(in + 24);
                s->final = final;
                s->n = get_le32(in + 32);
                if (get_le32(in + 36) || s->n == 0 || s->n != (unsigned)__builtin_popcountll(s->participants) ||
                    len != 40 + 8 * (size_t)s->n || s->round == 0)
                        return -EBADMSG;
                for (unsigned i = 0; i < s->n; i++) {
                        s->weights[i] = get_f64(in + 40 + 8 * i);
                        if (!weight_ok(s->weights[i]))
                                return -EBADMSG;
                }
                break;
        }
        default:
                return -EBADMSG;
        }
        *ret = m;
        return 0;
}

const char *const coll_payload_names[_COLL_PAYLOAD_MAX + 1] = { "f32", "f16", "int8", NULL };

uint8_t coll_payload_dtype(CollPayload p) {
        return p == COLL_PAYLOAD_F16 ? DTYPE_F16 : p == COLL_PAYLOAD_INT8 ? DTYPE_Q8 : DTYPE_F32;
}

size_t coll_payload_size(uint8_t dtype, size_t count) {
        switch (dtype) {
        case DTYPE_F32: return 4 * count;
        case DTYPE_F16: return 2 * count;
        case DTYPE_Q8: return quant_size(count);
        default: return 0;
        }
}

/*  0 u32 magic, 4 u8 phase, 5 u8 dtype, 6 u16 zero, 8 u32 group, 12 u32 index,
 * 16 u64 round, 24 u32 count, 28..63 zero, then count values */
void coll_piece_encode(const CollPiece *p, uint8_t out[COLL_PIECE_HEADER]) {
        memset(out, 0, COLL_PIECE_HEADER);
        put_le32(out, PIECE_MAGIC);
        out[4] = p->phase;
        out[5] = p->dtype;
        put_le32(out + 8, p->group);
        put_le32(out + 12, p->index);
        put_le64(out + 16, p->round);
        put_le32(out + 24, p->count);
}

int coll_piece_decode(const uint8_t *in, size_t len, CollPiece *ret) {
        if (len < COLL_PIECE_HEADER || get_le32(in) != PIECE_MAGIC)
                return -EBADMSG;
        for (size_t i = 28; i < COLL_PIECE_HEADER; i++)
                if (in[i])
                        return -EBADMSG;
        CollPiece p = {
                .phase = in[4],
                .dtype = in[5],
                .group = get_le32(in + 8),
                .index = get_le32(in + 12),
                .round = get_le64(in + 16),
                .count = get_le32(in + 24),
        };
        if (p.phase < COLL_REDUCE_SCATTER || p.phase > COLL_STATE || (p.phase == COLL_STATE && p.dtype != DTYPE_F32) ||
            get_le16(in + 6) ||
            p.count == 0 || coll_payload_size(p.dtype, p.count) == 0 ||
            len - COLL_PIECE_HEADER != coll_payload_size(p.dtype, p.count))
                return -EBADMSG;
        *ret = p;
        return 0;
}
