/* The text dataset: what it reads and refuses, the split, windows and
 * shards. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/text.h"

#define FORTUNES "/usr/share/games/fortunes"

static char dir[] = "/tmp/test-text-XXXXXX";

static void setup(void) {
        strcpy(dir, "/tmp/test-text-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_expect_eq(system(cmd), 0);
}

static char *write_file(const char *name, const void *data, size_t n) {
        static char path[8][256];
        static int k;
        char *p = path[k++ % 8];
        snprintf(p, 256, "%s/%s", dir, name);
        FILE *f = fopen(p, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(data, 1, n, f), n);
        fclose(f);
        return p;
}

static int load_one(const char *path, TextCorpus **c, Diag *d) {
        return text_load((const char *[]){ path }, 1, c, d);
}

TestSuite(text, .init = setup, .fini = teardown);

Test(text, reads_a_directory_like_fortunes) {
        write_file("b", "second file\n", 12);
        write_file("a", "first, \xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n", 21);
        write_file("a.dat", "\x00\x00\x00\x02\xff", 5); /* strfile's binary index */
        char target[300], link[300], sub[300];
        snprintf(target, sizeof target, "%s/a", dir);
        snprintf(link, sizeof link, "%s/a.u8", dir);
        cr_assert_eq(symlink(target, link), 0);
        write_file(".hidden", "\x00", 1);
        snprintf(sub, sizeof sub, "%s/sub", dir);
        cr_assert_eq(mkdir(sub, 0755), 0);

        TextCorpus *c;
        Diag d = {};
        cr_assert_eq(load_one(dir, &c, &d), 0, "%s", d.text);
        cr_assert_eq(c->n_files, 2);
        cr_assert_eq(c->n, 33);
        cr_assert_eq(memcmp(c->bytes, "first, ", 7), 0, "sorted by name: a before b");
        cr_assert_eq(memcmp(c->bytes + 21, "second file\n", 12), 0);
        cr_assert_eq(c->n_train, 33 - 33 / 20);
        text_free(c);

        /* a list of files, in the order given */
        char pa[300], pb[300];
        snprintf(pa, sizeof pa, "%s/a", dir);
        snprintf(pb, sizeof pb, "%s/b", dir);
        cr_assert_eq(text_load((const char *[]){ pb, pa }, 2, &c, &d), 0, "%s", d.text);
        cr_assert_eq(memcmp(c->bytes, "second file\n", 12), 0);
        text_free(c);
}

Test(text, refuses_what_is_not_text) {
        static const struct {
                const char *bytes;
                size_t n;
                int r;
                const char *why;
        } bad[] = {
                { "", 0, -ENODATA, "empty" },
                { "ab\0cd", 5, -EMEDIUMTYPE, "NUL byte at offset 2" },
                { "ok \xff", 4, -EMEDIUMTYPE, "0xff at offset 3" },
                { "\xc0\x80", 2, -EMEDIUMTYPE, "offset 0" },      /* overlong NUL */
                { "x\xed\xa0\x80", 4, -EMEDIUMTYPE, "offset 1" }, /* a surrogate */
                { "x\xf4\x90\x80\x80", 5, -EMEDIUMTYPE, "offset 1" }, /* past U+10FFFF */
                { "abc\xe2\x82", 5, -EMEDIUMTYPE, "offset 3" }, /* cut short */
                { "\x80", 1, -EMEDIUMTYPE, "offset 0" },        /* a lone continuation */
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char name[16];
                snprintf(name, sizeof name, "bad%zu", i);
                const char *p = write_file(name, bad[i].bytes, bad[i].n);
                TextCorpus *c = NULL;
                Diag d = {};
                cr_expect_eq(load_one(p, &c, &d), bad[i].r, "case %zu: %s", i, d.text);
                cr_expect(strstr(d.text, bad[i].why) && strstr(d.text, p), "case %zu: %s", i, d.text);
                cr_expect_null(c);
                unlink(p);
        }
        TextCorpus *c;
        Diag d = {};
        cr_assert_eq(load_one("/nonexistent/corpus", &c, &d), -ENOENT);
        cr_assert_eq(load_one(dir, &c, &d), -EISDIR, "%s", d.text); /* nothing left in it */
}

Test(text, refuses_a_corpus_shorter_than_a_window) {
        char text[200];
        memset(text, 'a', sizeof text);
        const char *p = write_file("short", text, sizeof text);
        TextCorpus *c;
        TextSampler s;
        Diag d = {};
        cr_assert_eq(load_one(p, &c, &d), 0);
        /* 190 training bytes, 10 validation bytes */
        cr_assert_eq(text_sampler_init(&s, c, TEXT_TRAIN, 189, 0, 1, 1, &d), 0, "%s", d.text);
        cr_assert_eq(text_sampler_init(&s, c, TEXT_TRAIN, 190, 0, 1, 1, &d), -EINVAL);
        cr_assert(strstr(d.text, "context + 1 (191)"), "%s", d.text);
        cr_assert_eq(text_sampler_init(&s, c, TEXT_VALIDATION, 9, 0, 1, 1, &d), 0);
        cr_assert_eq(text_sampler_init(&s, c, TEXT_VALIDATION, 10, 0, 1, 1, &d), -EINVAL);
        cr_assert(strstr(d.text, "validation"), "%s", d.text);
        text_free(c);
}

/* A corpus whose every 4-byte run tells where it sits. */
static TextCorpus *numbered_corpus(size_t n) {
        char *text = malloc(n + 8);
        for (size_t i = 0; i < n; i += 8)
                snprintf(text + i, 9, "%07zu|", i);
        const char *p = write_file("numbered", text, n);
        free(text);
        TextCorpus *c;
        Diag d = {};
        cr_assert_eq(load_one(p, &c, &d), 0, "%s", d.text);
        return c;
}

Test(text, windows_are_shifted_by_one_and_seeded) {
        enum { T = 16, B = 5 };
        TextCorpus *c = numbered_corpus(8000);
        TextSampler s;
        cr_assert_eq(text_sampler_init(&s, c, TEXT_TRAIN, T, 0, 1, 42, NULL), 0);
        float x[B * T], x2[B * T], x3[B * T];
        int32_t y[B * T], y2[B * T], y3[B * T];
        text_sampler_batch(&s, 7, x, y, B);
        text_sampler_batch(&s, 7, x2, y2, B);
        text_sampler_batch(&s, 8, x3, y3, B);
        cr_assert_eq(memcmp(x, x2, sizeof x), 0, "the same step draws the same batch");
        cr_assert_eq(memcmp(y, y2, sizeof y), 0);
        cr_assert_neq(memcmp(x, x3, sizeof x), 0, "the next step draws another");
        for (int b = 0; b < B; b++) {
                char win[T + 2];
                for (int t = 0; t < T; t++) {
                        cr_assert_eq(x[b * T + t], (float)(int)x[b * T + t]);
                        cr_assert(x[b * T + t] >= 0 && x[b * T + t] < TEXT_VOCAB);
                        if (t + 1 < T)
                                cr_assert_eq(y[b * T + t], (int32_t)x[b * T + t + 1]);
                        win[t] = (char)x[b * T + t];
                }
                win[T] = (char)y[b * T + T - 1];
                win[T + 1] = 0;
                /* the window and its last target are T + 1 bytes of the training split */
                const char *at = memmem(c->bytes, c->n_train, win, T + 1);
                cr_assert_not_null(at, "window %d is not in the training split", b);
        }
        /* evaluation windows tile the split */
        TextSampler v;
        cr_assert_eq(text_sampler_init(&v, c, TEXT_VALIDATION, T, 0, 1, 42, NULL), 0);
        cr_assert_eq(text_sampler_windows(&v), (400 - 1) / T);
        text_sampler_window(&v, 2, x, y);
        cr_assert_eq(x[0], (float)c->bytes[c->n_train + 2 * T]);
        cr_assert_eq(y[T - 1], c->bytes[c->n_train + 3 * T]);
        text_free(c);
}

Test(text, shards_are_disjoint_and_cover_the_split) {
        enum { T = 8, B = 64 };
        TextCorpus *c = numbered_corpus(8003);
        TextSampler s[3];
        size_t covered = 0;
        for (int i = 0; i < 3; i++) {
                cr_assert_eq(text_sampler_init(&s[i], c, TEXT_TRAIN, T, i, 3, 1, NULL), 0);
                cr_assert_eq(s[i].bytes, (i ? s[i - 1].bytes + s[i - 1].n : c->bytes));
                covered += s[i].n;
                float x[B * T];
                int32_t y[B * T];
                for (uint64_t step = 0; step < 20; step++) {
                        text_sampler_batch(&s[i], step, x, y, B);
                        for (int b = 0; b < B; b++) {
                                char win[T + 1];
                                for (int t = 0; t < T; t++)
                                        win[t] = (char)x[b * T + t];
                                win[T] = (char)y[b * T + T - 1];
                                cr_assert_not_null(memmem(s[i].bytes, s[i].n, win, T + 1),
                                                   "shard %d drew a window outside itself", i);
                        }
                }
        }
        cr_assert_eq(covered, c->n_train);
        cr_assert_eq(text_sampler_init(&s[0], c, TEXT_TRAIN, T, 3, 3, 1, NULL), -EINVAL);
        text_free(c);
}

Test(text, reads_the_fortunes_package) {
        if (access(FORTUNES, R_OK) < 0)
                cr_skip_test("%s is missing (apt-get install fortunes)", FORTUNES);
        TextCorpus *c;
        Diag d = {};
        cr_assert_eq(load_one(FORTUNES, &c, &d), 0, "%s", d.text);
        cr_assert_geq(c->n_files, 10);
        cr_assert_gt(c->n, 1000000);
        cr_assert_null(memchr(c->bytes, 0, c->n), "a strfile index was read as text");
        TextSampler s;
        cr_assert_eq(text_sampler_init(&s, c, TEXT_VALIDATION, 256, 0, 1, 1, &d), 0, "%s", d.text);
        text_free(c);
}
