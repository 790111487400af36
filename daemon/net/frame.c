/* net/frame.c */
#include "frame.h"

#include <errno.h>
#include <string.h>

const char *frame_type_to_string(uint8_t type) {
        switch (type) {
        case FRAME_HELLO: return "hello";
        case FRAME_HELLO_REPLY: return "hello-reply";
        case FRAME_AUTH: return "auth";
        case FRAME_WELCOME: return "welcome";
        case FRAME_TENSOR: return "tensor";
        case FRAME_DATA: return "data";
        case FRAME_PLAN: return "plan";
        case FRAME_HEARTBEAT: return "heartbeat";
        case FRAME_BYE: return "bye";
        case FRAME_CONTROL: return "control";
        case FRAME_LANE: return "lane";
        case FRAME_ACK: return "ack";
        default: return NULL;
        }
}

bool frame_type_is_handshake(uint8_t type) {
        return type == FRAME_HELLO || type == FRAME_HELLO_REPLY || type == FRAME_AUTH;
}

void frame_header_encode(const FrameHeader *h, uint8_t out[FRAME_HEADER_SIZE]) {
        put_le32(out + 0, FRAME_MAGIC);
        out[4] = FRAME_VERSION;
        out[5] = h->type;
        put_le16(out + 6, h->flags);
        put_le32(out + 8, h->stream);
        put_le32(out + 12, h->length);
        put_le64(out + 16, h->seq);
        put_le64(out + 24, h->offset);
}

int frame_header_decode(const uint8_t in[FRAME_HEADER_SIZE], const FrameLimits *limits,
                        FrameHeader *ret) {
        FrameHeader h;

        if (get_le32(in) != FRAME_MAGIC)
                return -EBADMSG;
        if (in[4] != FRAME_VERSION)
                return -EPROTO;
        h.type = in[5];
        h.flags = get_le16(in + 6);
        h.stream = get_le32(in + 8);
        h.length = get_le32(in + 12);
        h.seq = get_le64(in + 16);
        h.offset = get_le64(in + 24);

        if (!frame_type_to_string(h.type) || (h.flags & ~_FRAME_FLAGS_KNOWN))
                return -EBADMSG;
        /* TENSOR, PLAN and CONTROL carry a delivery number on a link of
         * several lanes: the link checks it, and that it is 0 on others */
        if ((h.type != FRAME_DATA && h.flags != 0) ||
            (h.offset != 0 && h.type != FRAME_DATA && h.type != FRAME_TENSOR && h.type != FRAME_PLAN &&
             h.type != FRAME_CONTROL))
                return -EBADMSG;
        if (h.length > (h.type == FRAME_DATA ? limits->max_payload : limits->max_control))
                return -EMSGSIZE;
        *ret = h;
        return 0;
}

size_t dtype_size(uint8_t dtype) {
        switch (dtype) {
        case DTYPE_F32: return 4;
        case DTYPE_F16: return 2;
        case DTYPE_U8: return 1;
        case DTYPE_I32: return 4;
        default: return 0;
        }
}

size_t tensor_desc_size(const TensorDesc *d) {
        return 4 + 4 * (size_t)d->ndim;
}

int tensor_desc_init(TensorDesc *d, uint8_t dtype, uint8_t ndim, const uint32_t *dims) {
        size_t es = dtype_size(dtype);
        uint64_t bytes = es;

        if (es == 0 || ndim > TENSOR_MAX_NDIM)
                return -EINVAL;
        memset(d, 0, sizeof *d);
        for (int i = 0; i < ndim; i++) {
                if (__builtin_mul_overflow(bytes, (uint64_t)dims[i], &bytes))
                        return -EINVAL;
                d->dims[i] = dims[i];
        }
        d->dtype = dtype;
        d->ndim = ndim;
        d->bytes = bytes;
        return 0;
}

size_t tensor_desc_encode(const TensorDesc *d, uint8_t *out) {
        out[0] = d->dtype;
        out[1] = d->ndim;
        out[2] = out[3] = 0;
        for (int i = 0; i < d->ndim; i++)
                put_le32(out + 4 + 4 * i, d->dims[i]);
        return tensor_desc_size(d);
}

int tensor_desc_decode(const uint8_t *in, size_t len, uint64_t max_bytes, TensorDesc *ret) {
        uint32_t dims[TENSOR_MAX_NDIM];
        TensorDesc d;

        if (len < 4 || in[2] != 0 || in[3] != 0 || in[1] > TENSOR_MAX_NDIM || len != 4 + 4 * (size_t)in[1])
                return -EBADMSG;
        for (int i = 0; i < in[1]; i++)
                dims[i] = get_le32(in + 4 + 4 * i);
        if (tensor_desc_init(&d, in[0], in[1], dims) < 0)
                return -EBADMSG;
        if (d.bytes > max_bytes)
                return -EMSGSIZE;
        *ret = d;
        return 0;
}
