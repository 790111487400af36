/* tests/lib/data.h — small generated data sets in the IDX format, so tests
 * can train on images of any size without a new package: each class has a
 * prototype image drawn from a seeded generator, and each sample is its
 * class's prototype with noise, so a small model learns them in seconds. */
#pragma once

#include <stdbool.h>

typedef struct TestData {
        int h, w;            /* image size */
        int classes;         /* labels are 0 .. classes - 1 */
        int n_train, n_test; /* samples per split */
        bool gzip;
} TestData;

/* Write train-/t10k-images-idx3-ubyte and -labels-idx1-ubyte into dir
 * (created if needed), plain or .gz. */
void test_write_idx_data(const char *dir, const TestData *t);
/* A job file for an MLP of (1,h,w) inputs and the given classes, trained
 * epochs epochs on data in data_dir. */
void test_write_mlp_job(const char *path, const char *data_dir, int h, int w, int classes, int epochs);
