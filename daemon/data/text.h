/* data/text.h — a text corpus read as bytes, for training a language model
 * on it (vocabulary 256: a token is a byte), with a train/validation split
 * and seeded, sharded sampling of windows.
 *
 * The corpus is one or more files, concatenated in the order given; a
 * directory stands for its files, sorted by name, not recursing, skipping
 * hidden files and fortune(6)'s strfile indexes (names ending in ".dat",
 * binary, and ".u8", links to the text files they are named after), so
 * /usr/share/games/fortunes reads as its 40-odd text files. Every file must
 * be text: loading refuses, naming the file and the offset, an empty file,
 * a NUL byte, or bytes that are not valid UTF-8 (RFC 3629: no overlong forms,
 * no surrogates, nothing past U+10FFFF); a binary file fed by mistake would
 * otherwise train quietly on garbage.
 *
 * The last 5 % of the bytes are the validation split, the rest the training
 * split. A window is T input ids and its targets, the same T bytes shifted
 * by one. Shard i of n of a split is the i-th of n contiguous, equal runs of
 * its bytes, so shards share no byte (the clusters of a swarm train on
 * disjoint text); every window lies inside its shard. Training batches are
 * drawn at random from a generator seeded by (seed, step), so a batch
 * depends on nothing but its step: a run resumed at step k draws what it
 * would have drawn. Evaluation reads the shard's non-overlapping windows in
 * order.
 *
 *     TextCorpus *c;
 *     r = text_load((const char *[]){ "/usr/share/games/fortunes" }, 1, &c, &d);
 *     TextSampler train;
 *     r = text_sampler_init(&train, c, TEXT_TRAIN, 128, 0, 1, seed, &d);  // shard 0 of 1
 *     text_sampler_batch(&train, step, x, y, B);   // x (B,128) ids as floats, y (B,128)
 *     text_free(c);
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "util/diag.h"
#include "util/macro.h"

#define TEXT_VOCAB 256
/* Total bytes a corpus may hold (window starts stay far from overflow). */
#define TEXT_MAX_BYTES ((size_t)1 << 31)
#define TEXT_MAX_FILES 4096

typedef struct TextCorpus {
        uint8_t *bytes; /* (n) every file, in order */
        size_t n;
        size_t n_train; /* bytes [0, n_train) train, [n_train, n) validate */
        int n_files;
} TextCorpus;

typedef enum TextSplit {
        TEXT_TRAIN,
        TEXT_VALIDATION,
} TextSplit;

/* Read the files and directories of paths (see above). On error d names the
 * file and why: -ENOENT, -EISDIR (a directory with no text files),
 * -EMEDIUMTYPE (not text), -ENODATA (empty), -EFBIG (too large). */
int text_load(const char *const *paths, size_t n_paths, TextCorpus **ret, Diag *d);
TextCorpus *text_free(TextCorpus *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(TextCorpus *, text_free);

/* Windows of T bytes from one shard of one split. */
typedef struct TextSampler {
        const uint8_t *bytes; /* (n) the shard's bytes, inside the corpus */
        size_t n;
        int T;
        uint64_t seed;
} TextSampler;

/* Shard `shard` of n_shards of split. -EINVAL with d saying so when the
 * shard holds fewer than T + 1 bytes: not one window. */
int text_sampler_init(TextSampler *s, const TextCorpus *c, TextSplit split, int T, int shard,
                      int n_shards, uint64_t seed, Diag *d);

/* B windows drawn at random for training step `step`: x is (B,T) ids as
 * floats (exact integers below 256), y is (B,T) the next byte of each. */
void text_sampler_batch(const TextSampler *s, uint64_t step, float *x, int32_t *y, int B);

/* Non-overlapping windows of the shard, for evaluation: how many, and
 * window i (below that) into x (T) and y (T). */
size_t text_sampler_windows(const TextSampler *s);
void text_sampler_window(const TextSampler *s, size_t i, float *x, int32_t *y);
