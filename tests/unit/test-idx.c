/* IDX reader and dataset loading: good files, and each kind of broken file
 * gives its own clear error naming the file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/dataset.h"
#include "data/idx.h"

static char dir[] = "/tmp/ravnest-test-idx-XXXXXX";

static void setup(void) {
        cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

static const char *write_file(const char *name, const void *buf, size_t len, bool gz) {
        static char path[4][256];
        static int slot;
        char *p = path[slot++ % 4];
        snprintf(p, 256, "%s/%s", dir, name);
        if (gz) {
                gzFile f = gzopen(p, "wb");
                cr_assert_not_null(f);
                cr_assert_eq(gzwrite(f, buf, (unsigned)len), (int)len);
                gzclose(f);
        } else {
                FILE *f = fopen(p, "wb");
                cr_assert_not_null(f);
                cr_assert_eq(fwrite(buf, 1, len, f), len);
                fclose(f);
        }
        return p;
}

/* An idx3 file of n images of h x w, pixel (i, y, x) = i + y + x. */
static size_t make_images(uint8_t *buf, uint32_t n, uint32_t h, uint32_t w) {
        uint8_t hdr[16] = { 0, 0, 8, 3 };
        uint32_t d[3] = { n, h, w };
        for (int i = 0; i < 3; i++) {
                hdr[4 + 4 * i] = (uint8_t)(d[i] >> 24);
                hdr[5 + 4 * i] = (uint8_t)(d[i] >> 16);
                hdr[6 + 4 * i] = (uint8_t)(d[i] >> 8);
                hdr[7 + 4 * i] = (uint8_t)d[i];
        }
        memcpy(buf, hdr, 16);
        for (uint32_t i = 0; i < n; i++)
                for (uint32_t y = 0; y < h; y++)
                        for (uint32_t x = 0; x < w; x++)
                                buf[16 + (i * h + y) * w + x] = (uint8_t)(i + y + x);
        return 16 + (size_t)n * h * w;
}

static size_t make_labels(uint8_t *buf, uint32_t n, int classes) {
        uint8_t hdr[8] = { 0, 0, 8, 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n };
        memcpy(buf, hdr, 8);
        for (uint32_t i = 0; i < n; i++)
                buf[8 + i] = (uint8_t)(i % (uint32_t)classes);
        return 8 + n;
}

TestSuite(idx, .init = setup, .fini = teardown);

Test(idx, reads_plain_and_gzip) {
        uint8_t buf[16 + 5 * 4 * 3];
        size_t len = make_images(buf, 5, 4, 3);
        for (int gz = 0; gz < 2; gz++) {
                IdxArray *a;
                Diag d = {};
                const char *p = write_file(gz ? "img.gz" : "img", buf, len, gz);
                cr_assert_eq(idx_load(p, 3, &a, &d), 0, "%s", d.text);
                cr_assert_eq(a->dims[0], 5);
                cr_assert_eq(a->dims[1], 4);
                cr_assert_eq(a->dims[2], 3);
                cr_assert_eq(a->n, 60);
                cr_assert_eq(a->data[(2 * 4 + 3) * 3 + 1], 2 + 3 + 1);
                idx_free(a);
        }
}

/* Each broken variant: the error code and a phrase of the message. */
static void expect_broken(const char *name, const void *buf, size_t len, bool gz, int want_ndim, int err,
                          const char *phrase) {
        IdxArray *a = NULL, h;
        Diag d = {};
        const char *p = write_file(name, buf, len, gz);
        int r = idx_load(p, want_ndim, &a, &d);
        cr_expect_eq(r, err, "%s: got %d (%s), want %d", name, r, d.text, err);
        cr_expect(strstr(d.text, phrase), "%s: message \"%s\" lacks \"%s\"", name, d.text, phrase);
        cr_expect(strstr(d.text, p), "%s: message \"%s\" does not name the file", name, d.text);
        cr_expect_null(a);
        /* the header alone, as a job's check reads it, refuses a file as
         * loading it does (it passed a plain file 1 byte short, and any
         * gzip file whose data were short) */
        cr_expect_eq(idx_read_header(p, want_ndim, &h, &d), err, "%s: the header check took it", name);
}

Test(idx, rejects_each_kind_of_broken_file) {
        uint8_t good[16 + 5 * 4 * 3], bad[sizeof good + 8];
        size_t len = make_images(good, 5, 4, 3);

        memcpy(bad, good, len);
        bad[2] = 0x0d; /* float data */
        expect_broken("bad-magic", bad, len, false, 3, -EBADMSG, "bad magic");
        memcpy(bad, good, len);
        bad[0] = 0x1f;
        expect_broken("bad-magic2", bad, len, true, 3, -EBADMSG, "bad magic");

        expect_broken("wrong-dims", good, len, false, 1, -EBADMSG, "has 3 dimensions, expected 1");
        memcpy(bad, good, len);
        bad[7] = 0; /* n = 0 */
        expect_broken("zero-dim", bad, len, false, 3, -EBADMSG, "dimension 0 is 0");
        memcpy(bad, good, len);
        bad[4] = 0xff; /* n = 4 billion: more than the limit */
        expect_broken("huge-dims", bad, len, false, 3, -EBADMSG, "more than");

        expect_broken("short-header", good, 3, false, 3, -ENODATA, "truncated");
        expect_broken("short-dims", good, 9, false, 3, -ENODATA, "truncated inside the dimension list");
        expect_broken("short-data", good, len - 1, false, 3, -ENODATA, "truncated");
        expect_broken("short-data-gz", good, len - 7, true, 3, -ENODATA, "truncated");

        memcpy(bad, good, len);
        bad[len] = 42;
        expect_broken("trailing", bad, len + 1, false, 3, -EFBIG, "trailing bytes");

        expect_broken("empty", good, 0, false, 3, -ENODATA, "truncated");

        /* 256K images of 64 x 64 (1 GiB) claimed by a file of 76 bytes,
         * plain or gzip: refused (by the file's size) before anything is
         * allocated for them */
        memcpy(bad, good, len);
        bad[5] = 0x04, bad[6] = bad[7] = 0; /* n = 262144 */
        bad[11] = bad[15] = 64;
        expect_broken("big-claim", bad, len, false, 3, -ENODATA, "cannot hold them");
        expect_broken("big-claim-gz", bad, len, true, 3, -ENODATA, "cannot hold them");
}

Test(idx, rejects_corrupt_gzip) {
        uint8_t good[16 + 5 * 4 * 3];
        size_t len = make_images(good, 5, 4, 3);
        const char *p = write_file("img.gz", good, len, true);
        /* Flip bytes inside the deflate stream. */
        FILE *f = fopen(p, "r+b");
        cr_assert_not_null(f);
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        uint8_t junk[8] = { 0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef };
        fseek(f, size / 2, SEEK_SET);
        fwrite(junk, 1, sizeof junk, f);
        fclose(f);

        IdxArray *a = NULL;
        Diag d = {};
        int r = idx_load(p, 3, &a, &d);
        cr_expect(r == -EIO || r == -ENODATA || r == -EBADMSG || r == -EINVAL, "r = %d (%s)", r, d.text);
        cr_expect(strstr(d.text, p), "%s", d.text);
        cr_expect_null(a);
}

/* A gzip file cut short (a download stopped half-way) is refused by the
 * header check as by loading; a whole one passes it, with the gzip
 * members' sizes summed when the file holds several. */
Test(idx, the_header_check_refuses_a_gzip_file_cut_short) {
        uint8_t good[16 + 50 * 4 * 3];
        size_t len = make_images(good, 50, 4, 3);
        const char *p = write_file("cut.gz", good, len, true);
        IdxArray h;
        Diag d = {};
        cr_assert_eq(idx_read_header(p, 3, &h, &d), 0, "%s", d.text);
        struct stat st;
        cr_assert_eq(stat(p, &st), 0);
        cr_assert_eq(truncate(p, st.st_size / 2), 0);
        int r = idx_read_header(p, 3, &h, &d);
        cr_expect(r == -ENODATA || r == -EIO, "r = %d (%s)", r, d.text);
        cr_expect(strstr(d.text, p), "%s", d.text);
        /* two members: the first 100 bytes, then the rest */
        const char *q = write_file("two.gz", good, 100, true);
        gzFile f = gzopen(q, "ab");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, good + 100, (unsigned)(len - 100)), (int)(len - 100));
        gzclose(f);
        cr_assert_eq(idx_read_header(q, 3, &h, &d), 0, "%s", d.text);
        cr_assert_eq(h.n, 50 * 4 * 3);
}

/* Overwrite (at, len) of path's bytes with buf, or append them (at < 0). */
static void patch_file(const char *path, long at, const void *buf, size_t len) {
        FILE *f = fopen(path, "r+b");
        cr_assert_not_null(f);
        cr_assert_eq(at < 0 ? fseek(f, 0, SEEK_END) : fseek(f, at, SEEK_SET), 0);
        cr_assert_eq(fwrite(buf, 1, len, f), len);
        cr_assert_eq(fclose(f), 0);
}

/* Both the header check and loading give err with phrase and the file's name. */
static void expect_refused(const char *p, int err, const char *phrase) {
        IdxArray *a = NULL, h;
        Diag d = {};
        cr_expect_eq(idx_read_header(p, 3, &h, &d), err, "header check of %s: %s", p, d.text);
        cr_expect(strstr(d.text, phrase) && strstr(d.text, p), "\"%s\" lacks \"%s\"", d.text, phrase);
        d = (Diag){};
        cr_expect_eq(idx_load(p, 3, &a, &d), err, "load of %s: %s", p, d.text);
        cr_expect(strstr(d.text, phrase) && strstr(d.text, p), "\"%s\" lacks \"%s\"", d.text, phrase);
        cr_expect_null(a);
}

/* Bytes flipped inside the deflate data, with the length at the gzip
 * file's end intact: the header check reads the data through, as loading
 * does, and refuses it. The file is larger than what zlib inflates ahead
 * when it reads the header (256 KiB). */
Test(idx, the_header_check_refuses_a_corrupt_gzip_stream) {
        uint8_t *good = malloc(16 + 4000 * 16 * 16), junk[50];
        cr_assert_not_null(good);
        size_t len = make_images(good, 4000, 16, 16);
        for (size_t i = 16; i < len; i++) /* less regular data: a longer deflate stream */
                good[i] ^= (uint8_t)(i * 2654435761u >> 24);
        const char *p = write_file("flipped.gz", good, len, true);
        free(good);
        struct stat st;
        cr_assert_eq(stat(p, &st), 0);
        memset(junk, 0x5a, sizeof junk);
        patch_file(p, st.st_size / 2, junk, sizeof junk);
        expect_refused(p, -EIO, "corrupt gzip stream");
}

/* What follows a gzip member and is not one is refused as bytes after a
 * plain file's data are; a file of two members is whole, its data read
 * across them. */
Test(idx, refuses_bytes_after_the_gzip_data) {
        uint8_t good[16 + 50 * 4 * 3], zeros[100] = {};
        size_t len = make_images(good, 50, 4, 3);
        char garbage[81] = "";
        for (int i = 0; i < 10; i++)
                strcat(garbage, "garbage!");
        const char *p = write_file("garbage.gz", good, len, true);
        patch_file(p, -1, garbage, 80);
        expect_refused(p, -EFBIG, "trailing bytes");
        p = write_file("zeros.gz", good, len, true);
        patch_file(p, -1, zeros, sizeof zeros);
        expect_refused(p, -EFBIG, "trailing bytes");
        p = write_file("one-zero.gz", good, len, true);
        patch_file(p, -1, zeros, 1);
        expect_refused(p, -EFBIG, "trailing bytes");

        IdxArray *a = NULL;
        Diag d = {};
        p = write_file("two.gz", good, 100, true);
        gzFile f = gzopen(p, "ab");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, good + 100, (unsigned)(len - 100)), (int)(len - 100));
        gzclose(f);
        cr_assert_eq(idx_load(p, 3, &a, &d), 0, "%s", d.text);
        cr_expect_eq(memcmp(a->data, good + 16, len - 16), 0);
        idx_free(a);
}

Test(idx, missing_file) {
        IdxArray *a = NULL;
        Diag d = {};
        char p[300];
        snprintf(p, sizeof p, "%s/nothing-here", dir);
        cr_assert_eq(idx_load(p, 1, &a, &d), -ENOENT);
        cr_assert(strstr(d.text, "nothing-here"), "%s", d.text);
}

Test(idx, dataset_checks_labels_and_counts) {
        uint8_t img[16 + 6 * 2 * 2], lab[8 + 6];
        size_t il = make_images(img, 6, 2, 2), ll = make_labels(lab, 6, 3);
        const char *ip = write_file("train-images-idx3-ubyte", img, il, false);
        write_file("train-labels-idx1-ubyte.gz", lab, ll, true);

        Dataset *ds;
        Diag d = {};
        cr_assert_eq(dataset_load_dir(dir, "train", 3, &ds, &d), 0, "%s", d.text);
        cr_assert_eq(ds->n, 6);
        dataset_set_normalization(ds, 0.5f, 0.25f);
        float x[2 * 4];
        int32_t y[2];
        uint32_t idx[2] = { 5, 1 };
        dataset_gather(ds, x, y, idx, 2);
        cr_assert_eq(y[0], 2);
        cr_assert_eq(y[1], 1);
        cr_assert_float_eq(x[0], (5.0f / 255.0f - 0.5f) / 0.25f, 1e-6f); /* pixel (5,0,0) = 5 */
        dataset_free(ds);

        /* A label out of range. */
        cr_assert_eq(dataset_load_dir(dir, "train", 2, &ds, &d), -EINVAL);
        cr_assert(strstr(d.text, "label 2"), "%s", d.text);

        /* Counts that disagree: the files are broken (exit 1), not the job. */
        ll = make_labels(lab, 5, 3);
        write_file("train-labels-idx1-ubyte.gz", lab, ll, true);
        cr_assert_eq(dataset_load(ip, "/nonexistent", 3, &ds, &d), -ENOENT);
        char lp[300];
        snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte.gz", dir);
        cr_assert_eq(dataset_load(ip, lp, 3, &ds, &d), -EBADMSG);
        cr_assert(strstr(d.text, "6 images") && strstr(d.text, "5 labels"), "%s", d.text);
}

Test(sampler, shards_partition_and_shuffles_are_seeded) {
        enum { N = 1003 };
        static unsigned seen[N];
        memset(seen, 0, sizeof seen);
        for (int shard = 0; shard < 3; shard++) {
                Sampler s;
                cr_assert_eq(sampler_init(&s, N, shard, 3, 9), 0);
                sampler_shuffle(&s, 0);
                for (size_t i = 0; i < s.n; i++) {
                        cr_assert_eq(s.order[i] % 3, (uint32_t)shard);
                        seen[s.order[i]]++;
                }
                sampler_done(&s);
        }
        for (int i = 0; i < N; i++)
                cr_assert_eq(seen[i], 1, "sample %d seen %u times", i, seen[i]);

        Sampler a, b;
        sampler_init(&a, N, 0, 1, 9);
        sampler_init(&b, N, 0, 1, 9);
        sampler_shuffle(&a, 4);
        sampler_shuffle(&b, 4);
        cr_assert_eq(memcmp(a.order, b.order, sizeof(uint32_t) * N), 0);
        sampler_shuffle(&b, 5);
        cr_assert_neq(memcmp(a.order, b.order, sizeof(uint32_t) * N), 0);
        sampler_done(&a);
        sampler_done(&b);
        cr_assert_eq(sampler_init(&a, N, 3, 3, 1), -EINVAL);
}
