/* data/dataset.c */
#include "dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idx.h"
#include "util/rng.h"

int dataset_load(const char *images_path, const char *labels_path, int n_classes, Dataset **ret,
                 Diag *d) {
        _cleanup_(idx_freep) IdxArray *img = NULL, *lab = NULL;
        _cleanup_(dataset_freep) Dataset *ds = NULL;
        int r;

        if (n_classes < 2 || n_classes > 256)
                return diag_set(d, -EINVAL, "number of classes must be in 2..256, got %d", n_classes);
        r = idx_load(images_path, 3, &img, d);
        if (r < 0)
                return r;
        r = idx_load(labels_path, 1, &lab, d);
        if (r < 0)
                return r;
        if (img->dims[0] != lab->dims[0])
                return diag_set(d, -EBADMSG, "%s holds %u images but %s holds %u labels", images_path,
                                img->dims[0], labels_path, lab->dims[0]);
        if (img->dims[1] > 4096 || img->dims[2] > 4096)
                return diag_set(d, -EBADMSG, "%s: images of %ux%u are too large", images_path,
                                img->dims[1], img->dims[2]);
        for (size_t i = 0; i < lab->n; i++)
                if (lab->data[i] >= n_classes)
                        return diag_set(d, -EINVAL, "%s: label %u of sample %zu is not below %d",
                                        labels_path, lab->data[i], i, n_classes);

        ds = calloc(1, sizeof *ds);
        if (!ds)
                return -ENOMEM;
        ds->n = img->dims[0];
        ds->c = 1;
        ds->h = (int)img->dims[1];
        ds->w = (int)img->dims[2];
        ds->n_classes = n_classes;
        ds->images = TAKE_PTR(img->data);
        ds->labels = TAKE_PTR(lab->data);
        dataset_set_normalization(ds, 0.0f, 1.0f);
        *ret = TAKE_PTR(ds);
        return 0;
}

/* The gzip name if it exists, else the plain one. */
static void idx_path(char *buf, size_t len, const char *dir, const char *split, const char *what) {
        snprintf(buf, len, "%s/%s-%s.gz", dir, split, what);
        if (access(buf, F_OK) < 0)
                snprintf(buf, len, "%s/%s-%s", dir, split, what);
}

int dataset_load_dir(const char *dir, const char *split, int n_classes, Dataset **ret, Diag *d) {
        char images[4096], labels[4096];
        idx_path(images, sizeof images, dir, split, "images-idx3-ubyte");
        idx_path(labels, sizeof labels, dir, split, "labels-idx1-ubyte");
        return dataset_load(images, labels, n_classes, ret, d);
}

int dataset_probe_dir(const char *dir, const char *split, DatasetShape *ret, Diag *d) {
        _cleanup_(idx_freep) IdxArray *lab = NULL;
        char images[4096], labels[4096];
        IdxArray img;
        int r;

        idx_path(images, sizeof images, dir, split, "images-idx3-ubyte");
        idx_path(labels, sizeof labels, dir, split, "labels-idx1-ubyte");
        if ((r = idx_read_header(images, 3, &img, d)) < 0 || (r = idx_load(labels, 1, &lab, d)) < 0)
                return r;
        if (img.dims[0] != lab->dims[0])
                return diag_set(d, -EBADMSG, "%s holds %u images but %s holds %u labels", images, img.dims[0],
                                labels, lab->dims[0]);
        DatasetShape s = { .n = img.dims[0], .c = 1, .h = (int)img.dims[1], .w = (int)img.dims[2] };
        for (size_t i = 0; i < lab->n; i++)
                s.max_label = MAX(s.max_label, (int)lab->data[i]);
        *ret = s;
        return 0;
}

int dataset_dir_count_files(const char *dir) {
        static const char *const splits[] = { "train", "t10k" }, *const whats[] = { "images-idx3-ubyte",
                                                                                   "labels-idx1-ubyte" };
        char path[4096];
        int n = 0;
        for (size_t i = 0; i < ELEMENTSOF(splits); i++)
                for (size_t j = 0; j < ELEMENTSOF(whats); j++) {
                        idx_path(path, sizeof path, dir, splits[i], whats[j]);
                        n += access(path, F_OK) == 0;
                }
        return n;
}

DatasetShape dataset_shape(const Dataset *ds) {
        int max_label = 0;
        for (size_t i = 0; ds->text && i < ds->text_len; i++)
                max_label = MAX(max_label, (int)ds->text[i]);
        for (size_t i = 0; ds->labels && i < ds->n; i++)
                max_label = MAX(max_label, (int)ds->labels[i]);
        return (DatasetShape){ .n = ds->n, .c = ds->c, .h = ds->h, .w = ds->w, .max_label = max_label };
}

int dataset_check_fit(const DatasetShape *s, int c, int h, int w, int classes, Diag *d) {
        if (s->c != c || s->h != h || s->w != w)
                return diag_set(d, -EINVAL, "the model takes (%d,%d,%d) but the dataset has (%d,%d,%d)", c, h, w,
                                s->c, s->h, s->w);
        if (s->max_label >= classes)
                return diag_set(d, -EINVAL, "the model has %d classes but the dataset has label %d", classes,
                                s->max_label);
        return 0;
}

Dataset *dataset_free(Dataset *ds) {
        if (!ds)
                return NULL;
        free(ds->text);
        free(ds->images);
        free(ds->labels);
        free(ds);
        return NULL;
}

void dataset_set_normalization(Dataset *ds, float mean, float std) {
        ds->scale = 1.0f / (255.0f * std);
        ds->shift = -mean / std;
}

/* Windows of T bytes at i * T, and the same shifted by one as targets. */
static void gather_text(const Dataset *ds, float *x, int32_t *y, const uint32_t *idx, int B) {
        size_t T = (size_t)ds->c;
        for (int b = 0; b < B; b++) {
                const uint8_t *src = ds->text + (size_t)idx[b] * T;
                for (size_t t = 0; t < T; t++)
                        x[(size_t)b * T + t] = (float)src[t];
                for (size_t t = 0; y && t < T; t++)
                        y[(size_t)b * T + t] = src[t + 1];
        }
}

_simd_clones_ void dataset_gather(const Dataset *ds, float *x, int32_t *y, const uint32_t *idx, int B) {
        if (ds->text) {
                gather_text(ds, x, y, idx, B);
                return;
        }
        size_t per = (size_t)ds->c * ds->h * ds->w;
        for (int b = 0; b < B; b++) {
                const uint8_t *src = ds->images + (size_t)idx[b] * per;
                float *dst = x + (size_t)b * per;
                for (size_t i = 0; i < per; i++) /* widened and scaled in vectors */
                        dst[i] = (float)src[i] * ds->scale + ds->shift;
                if (y)
                        y[b] = ds->labels[idx[b]];
        }
}

int sampler_init(Sampler *s, size_t n_total, int shard, int n_shards, uint64_t seed) {
        if (n_shards <= 0 || shard < 0 || shard >= n_shards || n_total > UINT32_MAX)
                return -EINVAL;
        *s = (Sampler){ .seed = seed };
        s->n = n_total / (size_t)n_shards + ((size_t)shard < n_total % (size_t)n_shards);
        if (s->n == 0)
                return -EINVAL;
        s->base = malloc(sizeof(uint32_t) * s->n);
        s->order = malloc(sizeof(uint32_t) * s->n);
        if (!s->base || !s->order) {
                sampler_done(s);
                return -ENOMEM;
        }
        for (size_t i = 0; i < s->n; i++)
                s->base[i] = (uint32_t)(shard + i * (size_t)n_shards);
        memcpy(s->order, s->base, sizeof(uint32_t) * s->n);
        return 0;
}

void sampler_shuffle(Sampler *s, int epoch) {
        Rng r;
        rng_seed(&r, s->seed ^ ((uint64_t)(epoch + 1) << 40), RNG_STREAM_SHUFFLE);
        memcpy(s->order, s->base, sizeof(uint32_t) * s->n);
        /* Fisher-Yates */
        for (size_t i = s->n - 1; i > 0; i--) {
                uint32_t j = rng_below(&r, (uint32_t)(i + 1));
                uint32_t t = s->order[i];
                s->order[i] = s->order[j];
                s->order[j] = t;
        }
}

void sampler_done(Sampler *s) {
        free(s->base);
        free(s->order);
        s->base = s->order = NULL;
}
