/* collective/coll-wire.h — the messages of a group all-reduce round.
 *
 * Coordination travels in CONTROL frames, averaged data in TENSOR frames
 * whose payload starts with a fixed piece header; the layouts are in
 * ravnest-protocol(7). Decoding checks every field a peer controls before
 * anything is used: a message that fails is dropped with the link.
 *
 *     uint8_t buf[COLL_CTL_MAX];
 *     size_t n = coll_ready_encode(&(CollReady){ .group = 3, .weight = 128 }, buf);
 *     CollCtl m;
 *     r = coll_ctl_decode(buf, n, &m);    // -EBADMSG on anything malformed
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COLL_MAX_MEMBERS 64 /* a group's members fit a 64-bit map */
#define COLL_PIECE_HEADER 64 /* bytes before a piece's values; keeps them 64-byte aligned */
/* A piece's values, in bytes, at most: with its header, 1 MiB, one DATA
 * frame of the transport's default size. Every member of a group cuts its
 * vector the same way, so this is part of the protocol. */
#define COLL_PIECE_BYTES ((1u << 20) - COLL_PIECE_HEADER)

/* How a piece's values travel: CollConfig.payload, and ravnestd.conf's
 * averaging.payload ("f32", "f16", "int8", in this order). */
typedef enum CollPayload {
        COLL_PAYLOAD_F32,  /* float32 */
        COLL_PAYLOAD_F16,  /* IEEE binary16 (tensor/half.h): half the bytes */
        COLL_PAYLOAD_INT8, /* blockwise 8-bit (quant.h), dtype DTYPE_Q8: about a quarter */
        _COLL_PAYLOAD_MAX,
} CollPayload;

/* Their names, as ravnestd.conf spells them; NULL after the last. */
extern const char *const coll_payload_names[_COLL_PAYLOAD_MAX + 1];
/* The dtype of a piece header for a payload. */
uint8_t coll_payload_dtype(CollPayload p);
/* Bytes that count values take in a piece of dtype; 0 for a dtype no piece
 * carries. */
size_t coll_payload_size(uint8_t dtype, size_t count);

typedef enum CollCtlKind {
        COLL_READY = 1, /* member -> leader: I am ready for the next round of this group */
        COLL_START = 2, /* leader -> participants: who takes part, with what weight */
        COLL_ABORT = 3, /* participant -> participants: I gave this round up */
        COLL_STATE_ASK = 4, /* joiner -> member: hand me your optimizer's state of this group's values */
        COLL_STATE_NO = 5,  /* member -> joiner: it will not (busy, no state, other values), or its state is zero */
        COLL_MODEL = 6,     /* either end, first on every link: the model I average */
} CollCtlKind;

/* What a member averages: a digest of its model's layers (their kinds,
 * settings and shapes, as its owner computes it: opaque here) and its
 * parameter count. All zero: not named (then it matches only members that
 * name none). */
#define COLL_MODEL_DIGEST_SIZE 32
#define COLL_MODEL_MAX_VALUES (1ull << 40)
typedef struct CollModel {
        uint8_t digest[COLL_MODEL_DIGEST_SIZE];
        uint64_t values; /* 0 .. COLL_MODEL_MAX_VALUES */
} CollModel;

/* The one check every averaging mode makes of a peer's model before it
 * averages with it or hands it values: 0 when theirs is ours, -EBADE
 * (another model) when the digest or the count differs. */
int coll_model_check(const CollModel *ours, const CollModel *theirs);

typedef enum CollPhase {
        COLL_REDUCE_SCATTER = 1,
        COLL_ALL_GATHER = 2,
        COLL_STATE = 3, /* a piece of an optimizer's state handed to a joiner (round: its steps) */
} CollPhase;

/* An optimizer's state handed over: `arrays` float32 arrays of `values`
 * each (the optimizer's moments, then the outer optimizer's momentum), one
 * after another, cut into pieces of COLL_STATE_PIECE_VALUES. */
#define COLL_STATE_MAX_ARRAYS 4
#define COLL_STATE_PIECE_VALUES (128u << 10) /* 512 KiB */

typedef struct CollStateAsk {
        uint32_t group;
        uint64_t values;  /* of each array: the group's values (1 .. 2^40) */
        uint32_t arrays;  /* 1 .. COLL_STATE_MAX_ARRAYS */
} CollStateAsk;

typedef struct CollStateNo {
        uint32_t group;
        int32_t error;    /* -EBUSY, -ENODATA (no optimizer), -EINVAL (other values), ...; 0: its state is zero */
} CollStateNo;

typedef struct CollReady {
        uint32_t group;
        uint64_t last_round; /* the last round this member took part in */
        double weight;       /* samples since its last round (> 0) */
        uint64_t view;       /* bit i: the member at position i of the group is connected */
        uint64_t blame;      /* bit i: that member sent us a bad piece lately (we refuse it) */
        bool final;          /* the member's last round: it has stopped training */
} CollReady;

typedef struct CollStart {
        uint32_t group;
        uint64_t round;
        uint64_t participants;               /* bit i: position i of the group takes part */
        double weights[COLL_MAX_MEMBERS];    /* in position order, one per participant */
        unsigned n;                          /* popcount(participants) */
        bool final;                          /* a last round, of members that all stopped training */
} CollStart;

typedef struct CollAbort {
        uint32_t group;
        uint64_t round;
        int32_t error; /* why, as a negative errno */
} CollAbort;

typedef struct CollModelMsg {
        CollModel model;
} CollModelMsg;

typedef struct CollCtl {
        uint8_t kind;
        union {
                CollReady ready;
                CollStart start;
                CollAbort abort;
                CollStateAsk ask;
                CollStateNo no;
                CollModelMsg model;
        };
} CollCtl;

#define COLL_CTL_MAX (40 + 8 * COLL_MAX_MEMBERS)
#define COLL_READY_SIZE 48

size_t coll_ready_encode(const CollReady *m, uint8_t *out);
size_t coll_start_encode(const CollStart *m, uint8_t *out);
size_t coll_abort_encode(const CollAbort *m, uint8_t *out);
size_t coll_state_ask_encode(const CollStateAsk *m, uint8_t *out);
size_t coll_state_no_encode(const CollStateNo *m, uint8_t *out);
size_t coll_model_encode(const CollModel *m, uint8_t *out);
/* -EBADMSG: wrong magic, kind, size, or a value out of range. */
int coll_ctl_decode(const uint8_t *in, size_t len, CollCtl *ret);

typedef struct CollPiece {
        uint8_t phase; /* CollPhase */
        uint8_t dtype; /* DTYPE_F32, DTYPE_F16 or DTYPE_Q8; COLL_STATE: DTYPE_F32 */
        uint32_t group;
        uint32_t index; /* piece number in the round */
        uint32_t count; /* values that follow the header */
        uint64_t round;
} CollPiece;

void coll_piece_encode(const CollPiece *p, uint8_t out[COLL_PIECE_HEADER]);
/* -EBADMSG on a malformed header or a size that disagrees with count. */
int coll_piece_decode(const uint8_t *in, size_t len, CollPiece *ret);
