/* net/frame.h — the wire format: a fixed 32-byte little-endian header, then
 * the payload, then (on protected links) a 16-byte authentication tag.
 *
 *   offset size field
 *        0    4 magic    "RVN1"
 *        4    1 version  1
 *        5    1 type     FrameType
 *        6    2 flags    FRAME_FLAG_*
 *        8    4 stream   tensor or stream id chosen by the sender
 *       12    4 length   payload bytes, not counting the tag
 *       16    8 seq      per-direction frame counter, from 0 after the handshake
 *       24    8 offset   DATA: byte offset of this chunk in its tensor;
 *                         TENSOR, PLAN, CONTROL on a link of several lanes:
 *                         the item's delivery number; else 0
 *
 * On a protected link the whole header is the associated data of the AEAD
 * and seq is its nonce, so a frame that is modified, replayed, reordered or
 * dropped fails authentication. The exact layout of every payload is in
 * ravnest-protocol(7).
 *
 *     FrameHeader h = { .type = FRAME_HEARTBEAT, .seq = 7 };
 *     uint8_t buf[FRAME_HEADER_SIZE];
 *     frame_header_encode(&h, buf);
 *     r = frame_header_decode(buf, &limits, &h2);   // -EBADMSG, -EMSGSIZE, ...
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FRAME_HEADER_SIZE 32
#define FRAME_TAG_SIZE 16
#define FRAME_MAGIC 0x314e5652u /* "RVN1" read as little-endian */
#define FRAME_VERSION 1

typedef enum FrameType {
        /* handshake, in the clear (see handshake.h) */
        FRAME_HELLO = 1,
        FRAME_HELLO_REPLY = 2,
        FRAME_AUTH = 3,
        FRAME_WELCOME = 4, /* first protected frame, server to client: key confirmation */
        /* tensors */
        FRAME_TENSOR = 16, /* descriptor: dtype, shape, total bytes */
        FRAME_DATA = 17,   /* a chunk of the tensor's bytes at `offset` */
        /* control */
        FRAME_PLAN = 32,
        FRAME_HEARTBEAT = 33,
        FRAME_BYE = 34,
        FRAME_CONTROL = 35, /* small application message */
        /* a link of several connections (lanes; net.h NetConfig.lanes) */
        FRAME_LANE = 36,    /* a lane's first frame: which link it joins */
        FRAME_ACK = 37,     /* items delivered so far, for the sender's window */
} FrameType;

enum {
        FRAME_FLAG_LAST = 1 << 0, /* DATA: the tensor's last chunk */
        _FRAME_FLAGS_KNOWN = FRAME_FLAG_LAST,
};

typedef struct FrameHeader {
        uint8_t type;
        uint16_t flags;
        uint32_t stream;
        uint32_t length;
        uint64_t seq;
        uint64_t offset;
} FrameHeader;

/* The payload of every frame but DATA is at most this many bytes, in both
 * directions: a constant of the protocol, not a setting, since a peer that
 * accepted less would refuse what others send (a signed PLAN fills up to
 * all of it). net_config_defaults() puts it in FrameLimits.max_control;
 * only tests and fuzzers lower it. */
#define FRAME_MAX_CONTROL 65536u

/* What a peer may send, checked before anything is allocated. */
typedef struct FrameLimits {
        uint32_t max_payload;      /* DATA chunk */
        uint32_t max_control;      /* every other type (FRAME_MAX_CONTROL) */
        uint64_t max_tensor_bytes; /* a whole tensor */
} FrameLimits;

const char *frame_type_to_string(uint8_t type);
bool frame_type_is_handshake(uint8_t type);

void frame_header_encode(const FrameHeader *h, uint8_t out[FRAME_HEADER_SIZE]);
/* Check magic, version, type, flags and length against limits.
 * -EBADMSG: not a ravnest frame or unknown type/flags; -EPROTO: wrong
 * version; -EMSGSIZE: payload above the limit for its type. */
int frame_header_decode(const uint8_t in[FRAME_HEADER_SIZE], const FrameLimits *limits,
                        FrameHeader *ret);

/* The descriptor a FRAME_TENSOR carries. */
#define TENSOR_MAX_NDIM 8
typedef enum TensorDtype {
        DTYPE_F32 = 1,
        DTYPE_F16 = 2,
        DTYPE_U8 = 3,
        DTYPE_I32 = 4,
        DTYPE_Q8 = 5, /* blockwise 8-bit (collective/quant.h): an averaging piece's values only, no tensor's */
} TensorDtype;

typedef struct TensorDesc {
        uint8_t dtype;
        uint8_t ndim;
        uint32_t dims[TENSOR_MAX_NDIM];
        uint64_t bytes; /* product of dims times the dtype's size */
} TensorDesc;

/* dtype u8, ndim u8, 2 zero bytes, ndim x u32 dims: 4 + 4 ndim bytes */
#define TENSOR_DESC_MAX_SIZE (4 + 4 * TENSOR_MAX_NDIM)
size_t tensor_desc_size(const TensorDesc *d);
size_t dtype_size(uint8_t dtype);
/* Fill d->bytes from dtype and dims; -EINVAL if they are invalid. */
int tensor_desc_init(TensorDesc *d, uint8_t dtype, uint8_t ndim, const uint32_t *dims);
size_t tensor_desc_encode(const TensorDesc *d, uint8_t *out);
/* -EBADMSG on a malformed descriptor, -EMSGSIZE above max_bytes. */
int tensor_desc_decode(const uint8_t *in, size_t len, uint64_t max_bytes, TensorDesc *ret);

/* Little-endian helpers for payload layouts. */
static inline void put_le16(uint8_t *p, uint16_t v) {
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
}
static inline void put_le32(uint8_t *p, uint32_t v) {
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_le64(uint8_t *p, uint64_t v) {
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get_le16(const uint8_t *p) {
        return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t get_le32(const uint8_t *p) {
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get_le64(const uint8_t *p) {
        return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}
