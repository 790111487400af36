/* data/text.c — byte-level text corpora: files read whole, checked to be
 * text, split into training and validation bytes, cut into windows. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"
#include "util/file.h"

/* Valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past
 * U+10FFFF) without NUL bytes: 0, else the offset of the first bad byte + 1. */
static size_t first_bad_byte(const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n;) {
                uint8_t b = p[i];
                size_t len = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : (b & 0xf0) == 0xe0 ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
                if (b == 0 || len == 0 || i + len > n)
                        return i + 1;
                /* the second byte's range, where the lead byte narrows it */
                uint8_t lo = b == 0xe0 ? 0xa0 : b == 0xf0 ? 0x90 : 0x80, hi = b == 0xed ? 0x9f : b == 0xf4 ? 0x8f : 0xbf;
                if (len > 1 && (p[i + 1] < lo || p[i + 1] > hi))
                        return i + 1;
                for (size_t k = 2; k < len; k++)
                        if ((p[i + k] & 0xc0) != 0x80)
                                return i + 1;
                i += len;
        }
        return 0;
}

/* Append the file at path to *buf: -EMEDIUMTYPE (with the reason in d)
 * when it is not text. */
static int append_file(const char *path, uint8_t **buf, size_t *len, size_t *cap, Diag *d) {
        struct stat st;
        int fd = file_open_regular(path, 0, &st, d);
        if (fd < 0)
                return fd;
        if (st.st_size == 0 || (size_t)st.st_size > DATASET_TEXT_MAX - *len) {
                close(fd);
                return diag_set(d, st.st_size ? -EFBIG : -EMEDIUMTYPE, "%s: %s", path,
                                st.st_size ? "too large" : "empty");
        }
        if (*len + (size_t)st.st_size > *cap) {
                size_t want = MAX(*cap * 2, *len + (size_t)st.st_size);
                uint8_t *p = realloc(*buf, want);
                if (!p) {
                        close(fd);
                        return diag_set(d, -ENOMEM, "Cannot allocate memory for %zu bytes of text", want);
                }
                *buf = p;
                *cap = want;
        }
        size_t got = 0;
        while (got < (size_t)st.st_size) {
                ssize_t k = read(fd, *buf + *len + got, (size_t)st.st_size - got);
                if (k <= 0) {
                        close(fd);
                        return diag_set(d, k < 0 ? -errno : -EIO, "%s: cannot read", path);
                }
                got += (size_t)k;
        }
        close(fd);
        size_t bad = first_bad_byte(*buf + *len, got);
        if (bad)
                return diag_set(d, -EMEDIUMTYPE, "%s: not UTF-8 text (byte %zu is 0x%02x)", path, bad - 1,
                                (*buf)[*len + bad - 1]);
        *len += got;
        return 0;
}

static int cmp_names(const void *a, const void *b) {
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file of a directory left out of the corpus, counted in ds (or not). */
static void left_out(Dataset *ds, const char *name) {
        if (ds && ds->text_left_out++ == 0)
                snprintf(ds->text_first_left_out, sizeof ds->text_first_left_out, "%s", name);
}

/* Every regular text file of dir, by name; the others are left out and
 * counted in ds, if given. */
static int append_dir(const char *dir, uint8_t **buf, size_t *len, size_t *cap, Dataset *ds, Diag *d) {
        DIR *dp = opendir(dir);
        char **names = NULL, path[PATH_MAX];
        size_t n = 0, used = 0;
        struct dirent *e;
        int r = 0;

        if (!dp)
                return diag_set(d, -errno, "%s: cannot read: %m", dir);
        while ((e = readdir(dp)) && r >= 0) {
                if (e->d_name[0] == '.')
                        continue;
                char **more = realloc(names, (n + 1) * sizeof *names);
                if (!more || !(more[n] = strdup(e->d_name)))
                        r = diag_set(d, -ENOMEM, "Cannot allocate memory for the names in %s", dir);
                else
                        n++;
                names = more ?: names;
        }
        closedir(dp);
        if (r >= 0 && n > 0)
                qsort(names, n, sizeof *names, cmp_names);
        for (size_t i = 0; i < n && r >= 0; i++) {
                struct stat st;
                snprintf(path, sizeof path, "%s/%s", dir, names[i]);
                if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
                        left_out(ds, names[i]);
                        continue;
                }
                size_t before = *len;
                r = append_file(path, buf, len, cap, d);
                if (r == -EMEDIUMTYPE) { /* not text: not part of the corpus */
                        *len = before;
                        left_out(ds, names[i]);
                        r = diag_set(d, 0, "%s", ""); /* its reason must not outlive it */
                } else if (r >= 0)
                        used++;
        }
        if (ds)
                ds->text_files = (unsigned)used;
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        free(names);
        if (r >= 0 && used == 0)
                return diag_set(d, -ENODATA, "%s: no text files", dir);
        return r;
}

/* The split's bytes [ret_off, ret_off + ret_len) of the corpus at path. */
static int read_corpus(const char *path, bool test, int T, uint8_t **ret_buf, size_t *ret_off, size_t *ret_len,
                       Dataset *ds, Diag *d) {
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        struct stat st;
        int r;

        if (stat(path, &st) < 0)
                return diag_set(d, -errno, "%s: cannot read: %m", path);
        r = S_ISDIR(st.st_mode) ? append_dir(path, &buf, &len, &cap, ds, d) : append_file(path, &buf, &len, &cap, d);
        if (r < 0) {
                free(buf);
                return r;
        }
        size_t valid = len / 20, off = test ? len - valid : 0, n = test ? valid : len - valid;
        if (T < 1 || n < (size_t)T + 1) {
                free(buf);
                return diag_set(d, -EINVAL, "%s: %zu bytes: the %s split (%zu bytes) is shorter than one context "
                                "of %d bytes and its next one", path, len, test ? "validation" : "training", n, T);
        }
        *ret_buf = buf;
        *ret_off = off;
        *ret_len = n;
        return 0;
}

int dataset_load_text(const char *path, bool test, int T, int vocab, Dataset **ret, Diag *d) {
        _cleanup_(dataset_freep) Dataset *ds = NULL;
        uint8_t *buf = NULL;
        size_t off = 0, n = 0;
        int r;

        ds = calloc(1, sizeof *ds);
        if (!ds)
                return diag_set(d, -ENOMEM, "Cannot allocate memory");
        r = read_corpus(path, test, T, &buf, &off, &n, ds, d);
        if (r < 0)
                return r;
        memmove(buf, buf + off, n);
        uint8_t *kept = realloc(buf, n); /* the split only: the validation split is a twentieth */
        if (kept)
                buf = kept;
        ds->n = (n - 1) / (size_t)T; /* the rest as calloc() left it, but what read_corpus() counted */
        ds->c = T;
        ds->h = ds->w = 1;
        ds->n_classes = vocab;
        ds->text = buf;
        ds->text_len = n;
        ds->scale = 1.0f;
        *ret = TAKE_PTR(ds);
        return 0;
}

int dataset_probe_text(const char *path, bool test, int T, DatasetShape *ret, Diag *d) {
        uint8_t *buf = NULL;
        size_t off = 0, n = 0;
        int r = read_corpus(path, test, T, &buf, &off, &n, NULL, d);
        if (r < 0)
                return r;
        DatasetShape s = { .n = (n - 1) / (size_t)T, .c = T, .h = 1, .w = 1 };
        for (size_t i = 0; i < n; i++)
                s.max_label = MAX(s.max_label, (int)buf[off + i]);
        free(buf);
        *ret = s;
        return 0;
}
