/* tests/lib/data.c */
#include "data.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include "proc.h"

static void write_bytes(const char *path, const uint8_t *b, size_t n, bool gz) {
        if (gz) {
                gzFile f = gzopen(path, "wb");
                cr_assert(f, "cannot write %s", path);
                cr_assert_eq(gzwrite(f, b, (unsigned)n), (int)n);
                gzclose(f);
                return;
        }
        FILE *f = fopen(path, "wb");
        cr_assert(f, "cannot write %s", path);
        cr_assert_eq(fwrite(b, 1, n, f), n);
        fclose(f);
}

static void be32(uint8_t *p, uint32_t v) {
        p[0] = (uint8_t)(v >> 24);
        p[1] = (uint8_t)(v >> 16);
        p[2] = (uint8_t)(v >> 8);
        p[3] = (uint8_t)v;
}

static void write_split(const char *dir, const char *split, const TestData *t, const uint8_t *proto, int n,
                        unsigned *seed) {
        size_t per = (size_t)t->h * (size_t)t->w;
        uint8_t *img = malloc(16 + (size_t)n * per), *lab = malloc(8 + (size_t)n);
        char path[512];
        cr_assert(img && lab);
        img[0] = img[1] = 0, img[2] = 8, img[3] = 3;
        be32(img + 4, (uint32_t)n), be32(img + 8, (uint32_t)t->h), be32(img + 12, (uint32_t)t->w);
        lab[0] = lab[1] = 0, lab[2] = 8, lab[3] = 1;
        be32(lab + 4, (uint32_t)n);
        for (int i = 0; i < n; i++) {
                int k = (int)(rand_r(seed) % (unsigned)t->classes);
                lab[8 + i] = (uint8_t)k;
                for (size_t j = 0; j < per; j++) {
                        int v = proto[(size_t)k * per + j] + (int)(rand_r(seed) % 241) - 120;
                        img[16 + (size_t)i * per + j] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
        }
        snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte%s", dir, split, t->gzip ? ".gz" : "");
        write_bytes(path, img, 16 + (size_t)n * per, t->gzip);
        snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte%s", dir, split, t->gzip ? ".gz" : "");
        write_bytes(path, lab, 8 + (size_t)n, t->gzip);
        free(img);
        free(lab);
}

void test_write_idx_data(const char *dir, const TestData *t) {
        size_t per = (size_t)t->h * (size_t)t->w;
        uint8_t *proto = malloc((size_t)t->classes * per);
        unsigned seed = 12345;
        cr_assert(proto);
        (void)mkdir(dir, 0755);
        for (size_t i = 0; i < (size_t)t->classes * per; i++)
                proto[i] = (uint8_t)(rand_r(&seed) % 2 ? 150 : 100);
        write_split(dir, "train", t, proto, t->n_train, &seed);
        write_split(dir, "t10k", t, proto, t->n_test, &seed);
        free(proto);
}

void test_write_mlp_job(const char *path, const char *data_dir, int h, int w, int classes, int epochs) {
        char text[1024];
        snprintf(text, sizeof text,
                 "name = \"test-mlp-%dx%d\";\n"
                 "dataset = { name = \"idx\"; path = \"%s\"; classes = %d; mean = 0.5; std = 0.3; };\n"
                 "model = {\n  input = [1, %d, %d];\n"
                 "  layers = ( { type = \"flatten\"; }, { type = \"linear\"; out = 64; }, { type = \"relu\"; },\n"
                 "             { type = \"linear\"; out = 64; }, { type = \"relu\"; },\n"
                 "             { type = \"linear\"; out = %d; } );\n};\n"
                 "optimizer = { type = \"sgd\"; lr = 0.05; momentum = 0.9; };\n"
                 "training = { batch_size = 32; epochs = %d; seed = 7; };\n",
                 h, w, data_dir, classes, h, w, classes, epochs);
        test_write_file(path, text, 0644);
}
