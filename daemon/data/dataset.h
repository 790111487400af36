/* data/dataset.h — labelled image datasets in memory, normalization,
 * seeded shuffling and sharding.
 *
 * Images stay as bytes (47 MB for Fashion-MNIST's training set rather than
 * 188 MB as floats); a batch is normalized while it is gathered.
 *
 *     Dataset *train;
 *     r = dataset_load_dir("/usr/share/datasets/fashion-mnist", "train", 10, &train, &d);
 *     dataset_set_normalization(train, 0.2860f, 0.3530f);
 *     Sampler s;
 *     sampler_init(&s, train->n, 0, 1, seed);       // shard 0 of 1: everything
 *     sampler_shuffle(&s, epoch);
 *     dataset_gather(train, x, y, s.order + step * B, B);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/diag.h"
#include "util/macro.h"

typedef struct Dataset {
        size_t n;          /* samples */
        int c, h, w;       /* per-sample shape; text: (T,1,1) */
        int n_classes;     /* text: the vocabulary */
        uint8_t *images;   /* (n, c, h, w) */
        uint8_t *labels;   /* (n), each < n_classes */
        float scale, shift; /* byte -> normalized float: byte * scale + shift */
        /* Text (dataset_load_text()): a sample is the window of T = c bytes
         * at i * T, its labels the same window one byte later; images and
         * labels are NULL. */
        uint8_t *text;
        size_t text_len;
        /* of a directory: the files read, and those left out (not regular
         * files, empty, or not UTF-8 text), the first of them by name */
        unsigned text_files, text_left_out;
        char text_first_left_out[256];
} Dataset;

/* Load an images file (idx3: n, h, w) and a labels file (idx1: n). Labels
 * must be below n_classes and the counts must agree. */
int dataset_load(const char *images_path, const char *labels_path, int n_classes, Dataset **ret,
                 Diag *d);
/* Load "<split>-images-idx3-ubyte[.gz]" and "<split>-labels-idx1-ubyte[.gz]"
 * from dir; split is "train" or "t10k". */
int dataset_load_dir(const char *dir, const char *split, int n_classes, Dataset **ret, Diag *d);
Dataset *dataset_free(Dataset *ds);
DEFINE_TRIVIAL_CLEANUP_FUNC(Dataset *, dataset_free);

/* What a dataset's files hold: every mode that trains on a dataset (alone,
 * a pipeline stage, a member, a plan's stage) and every check of a job
 * (ravnestd --check-job, ravnestctl job, ravnestctl swarm) holds a model
 * against the data through dataset_check_fit(), from the loaded data or
 * from the files' headers (dataset_probe_dir()).
 *
 *     DatasetShape s;
 *     r = dataset_probe_dir(dir, "train", &s, &d);      // headers and labels only
 *     r = dataset_check_fit(&s, 1, 28, 28, 10, &d);     // model input (C,H,W), classes
 */
typedef struct DatasetShape {
        size_t n;      /* samples */
        int c, h, w;   /* per sample */
        int max_label; /* the largest label in the labels file */
} DatasetShape;

/* The shape of "<split>-images-idx3-ubyte[.gz]" from its header, and the
 * labels of "<split>-labels-idx1-ubyte[.gz]" (read whole: one byte a
 * sample), with the counts checked against each other. */
int dataset_probe_dir(const char *dir, const char *split, DatasetShape *ret, Diag *d);
/* How many of dir's four IDX files (images and labels of "train" and
 * "t10k", plain or gzip) are there: 0 when the data set is not on this
 * machine at all, 4 when it is whole. */
int dataset_dir_count_files(const char *dir);
DatasetShape dataset_shape(const Dataset *ds);
/* -EINVAL with the reason in d unless samples of shape (c,h,w) with labels
 * below classes fit: the model's input is exactly the data's sample, and
 * every label is one of the model's classes. */
int dataset_check_fit(const DatasetShape *s, int c, int h, int w, int classes, Diag *d);

/* Byte-level text: the file at path, or every regular file of the
 * directory path (by name; links are not followed, and a directory's files
 * that are not text are left out — fortune's .dat indexes, say). A named
 * file that is empty, holds a NUL byte or is not valid UTF-8 is refused, as
 * is a corpus of no text files or too short for one window of T + 1 bytes
 * in each split. The last 5 % of the bytes are the validation split
 * (test = true), the rest the training split. Ids are bytes: below 256;
 * n_classes is the vocabulary the labels must stay below (checked by
 * dataset_check_fit(), as for images). At most DATASET_TEXT_MAX bytes. */
#define DATASET_TEXT_MAX ((size_t)1 << 30)
int dataset_load_text(const char *path, bool test, int T, int vocab, Dataset **ret, Diag *d);
/* The same checks and shape without keeping the bytes (labels: the largest
 * byte of the split). */
int dataset_probe_text(const char *path, bool test, int T, DatasetShape *ret, Diag *d);

/* x = (byte / 255 - mean) / std. The default is mean 0, std 1. */
void dataset_set_normalization(Dataset *ds, float mean, float std);

/* x is (B, c, h, w), y is (B); idx holds B sample indices below ds->n.
 * Text: x is (B, T) ids as floats, y is (B, T), the next byte of each. */
void dataset_gather(const Dataset *ds, float *x, int32_t *y, const uint32_t *idx, int B);

/* The order in which one shard of a dataset is visited.
 * Shard i of n holds the samples whose index is i modulo n, so the shards are
 * disjoint and together hold everything; each epoch reshuffles the shard with
 * a generator seeded from (seed, epoch), the same on every node. */
typedef struct Sampler {
        size_t n;        /* samples in this shard */
        uint32_t *base;  /* the shard's sample indices, ascending */
        uint32_t *order; /* this epoch's permutation of base */
        uint64_t seed;
} Sampler;

int sampler_init(Sampler *s, size_t n_total, int shard, int n_shards, uint64_t seed);
void sampler_shuffle(Sampler *s, int epoch);
void sampler_done(Sampler *s);
