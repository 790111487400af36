/* tests/fuzz/fuzz-rng.h — deterministic randomness for the harnesses that
 * make keys and handshakes (libsodium's randombytes replaced by a counter
 * through keyed BLAKE2b), so that a genuine handshake, and a crash, are the
 * same on every run. Header-only: each harness is its own program.
 *
 *     CHECK(randombytes_set_implementation(&fuzz_rng) == 0);  // before sodium_init()
 *     fuzz_rng_reset(0x1d);   // the same bytes again from here
 */
#pragma once

#include <sodium.h>
#include <string.h>

#include "net/frame.h" /* put_le64(), get_le32() */

static uint8_t fuzz_rng_key[crypto_generichash_KEYBYTES];
static uint64_t fuzz_rng_calls;

static void fuzz_rng_buf(void *const buf, const size_t size) {
        uint8_t seed[randombytes_SEEDBYTES], ctr[8];
        put_le64(ctr, fuzz_rng_calls++);
        crypto_generichash(seed, sizeof seed, ctr, sizeof ctr, fuzz_rng_key, sizeof fuzz_rng_key);
        randombytes_buf_deterministic(buf, size, seed);
}

static uint32_t fuzz_rng_random(void) {
        uint8_t b[4];
        fuzz_rng_buf(b, sizeof b);
        return get_le32(b);
}

static const char *fuzz_rng_name(void) {
        return "ravnest-fuzz";
}

static randombytes_implementation fuzz_rng = {
        .implementation_name = fuzz_rng_name,
        .random = fuzz_rng_random,
        .buf = fuzz_rng_buf,
};

/* Start the sequence again, under a key made of label. */
static inline void fuzz_rng_reset(uint8_t label) {
        memset(fuzz_rng_key, label, sizeof fuzz_rng_key);
        fuzz_rng_calls = 0;
}
