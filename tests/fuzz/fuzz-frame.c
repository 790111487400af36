/* fuzz-frame.c — libFuzzer harness for the parsers a peer reaches first:
 * the 32-byte frame header and the tensor descriptor.
 *
 * The input is a frame as it arrives on the wire: the first 32 bytes are
 * given to frame_header_decode(), the rest to tensor_desc_decode() (it is
 * what a FRAME_TENSOR carries) and, when the header is valid and the rest is
 * exactly its payload and a tag, to seal_open() of a protected link (with
 * each cipher this CPU runs). Every
 * accepted value must re-encode to the same bytes, and must respect the
 * limits it was checked against; anything else abort()s so libFuzzer
 * reports it.
 *
 *     build-fuzz/tests/fuzz/fuzz-frame -max_total_time=60 build-fuzz/corpus/frame
 */
#include <stdint.h>

#include "fuzz.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"
#include "net/seal.h"



/* Small enough that the fuzzer hits every limit, and different per type so
 * that a check against the wrong one shows. */
static const FrameLimits limits = {
        .max_payload = 4096,
        .max_control = 256,
        .max_tensor_bytes = 1u << 20,
};

static void fuzz_header(const uint8_t in[FRAME_HEADER_SIZE], const uint8_t *rest, size_t rest_len) {
        uint8_t out[FRAME_HEADER_SIZE];
        FrameHeader h;

        if (frame_header_decode(in, &limits, &h) < 0)
                return;

        CHECK(frame_type_to_string(h.type));
        CHECK(!(h.flags & ~_FRAME_FLAGS_KNOWN));
        CHECK(h.type == FRAME_DATA || h.flags == 0);
        /* an item's number, on a link of several connections: these types only */
        CHECK(h.offset == 0 || h.type == FRAME_DATA || h.type == FRAME_TENSOR || h.type == FRAME_PLAN ||
              h.type == FRAME_CONTROL);
        CHECK(h.length <= (h.type == FRAME_DATA ? limits.max_payload : limits.max_control));

        frame_header_encode(&h, out);
        CHECK(memcmp(in, out, FRAME_HEADER_SIZE) == 0);

        /* A receiver that expects this seq must still refuse the frame: the
         * fuzzer cannot know the key, so a tag it wrote is never valid. The
         * payload is copied to a buffer of exactly its size so that ASan sees
         * any read or write past it. */
        if (rest_len != (size_t)h.length + FRAME_TAG_SIZE)
                return;
        static const uint8_t key[SEAL_KEY_SIZE] = { 0x52, 0x56, 0x4e, 0x31 };
        static const Cipher ciphers[] = { CIPHER_CHACHA20POLY1305, CIPHER_AES256GCM, CIPHER_AEGIS256,
                                          CIPHER_AEGIS256X2, CIPHER_AEGIS256X4 };
        for (size_t c = 0; c < sizeof ciphers / sizeof *ciphers; c++) {
                Seal s;
                if (!(cipher_available() & CIPHER_BIT(ciphers[c])))
                        continue;
                uint8_t *payload = malloc(h.length ? h.length : 1);
                CHECK(payload);
                memcpy(payload, rest, h.length);
                CHECK(seal_init(&s, ciphers[c], key, key) == 0);
                s.rx_seq = h.seq;
                CHECK(seal_open(&s, in, &h, payload, h.length, rest + h.length) == -EBADMSG);
                CHECK(s.rx_seq == h.seq);
                seal_clear(&s);
                free(payload);
        }
}

static void fuzz_tensor_desc(const uint8_t *in, size_t len) {
        uint8_t out[TENSOR_DESC_MAX_SIZE];
        TensorDesc d, d2;
        uint64_t bytes;

        if (tensor_desc_decode(in, len, limits.max_tensor_bytes, &d) < 0)
                return;

        CHECK(dtype_size(d.dtype) != 0);
        CHECK(d.ndim <= TENSOR_MAX_NDIM);
        CHECK(d.bytes <= limits.max_tensor_bytes);
        bytes = dtype_size(d.dtype);
        for (int i = 0; i < d.ndim; i++)
                bytes *= d.dims[i]; /* cannot overflow: the product is at most max_tensor_bytes */
        CHECK(bytes == d.bytes);

        CHECK(tensor_desc_size(&d) == len);
        CHECK(tensor_desc_encode(&d, out) == len);
        CHECK(memcmp(in, out, len) == 0);

        /* What the sender builds from the same values is the same descriptor
         * (field by field: struct copies need not keep padding). */
        CHECK(tensor_desc_init(&d2, d.dtype, d.ndim, d.dims) == 0);
        CHECK(d2.dtype == d.dtype && d2.ndim == d.ndim && d2.bytes == d.bytes);
        CHECK(memcmp(d2.dims, d.dims, sizeof d.dims) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        /* Copies of exactly the right size, so ASan catches a parser that
         * reads past what it was given. */
        if (size >= FRAME_HEADER_SIZE) {
                uint8_t *hdr = malloc(FRAME_HEADER_SIZE);
                CHECK(hdr);
                memcpy(hdr, data, FRAME_HEADER_SIZE);
                fuzz_header(hdr, data + FRAME_HEADER_SIZE, size - FRAME_HEADER_SIZE);
                free(hdr);
        }

        const uint8_t *desc = size >= FRAME_HEADER_SIZE ? data + FRAME_HEADER_SIZE : data;
        size_t desc_len = size >= FRAME_HEADER_SIZE ? size - FRAME_HEADER_SIZE : size;
        uint8_t *copy = malloc(desc_len ? desc_len : 1);
        CHECK(copy);
        memcpy(copy, desc, desc_len);
        fuzz_tensor_desc(copy, desc_len);
        free(copy);
        return 0;
}
