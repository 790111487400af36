/* data/text.c */
#include "text.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/rng.h"

/* The offset of the first byte that breaks UTF-8 (RFC 3629, section 4), or
 * n when all is well. */
static size_t utf8_invalid_at(const uint8_t *b, size_t n) {
        size_t i = 0;
        while (i < n) {
                uint8_t c = b[i];
                if (c < 0x80) {
                        i++;
                        continue;
                }
                size_t len;
                uint8_t lo = 0x80, hi = 0xBF; /* the bounds of the second byte */
                if (c >= 0xC2 && c <= 0xDF)
                        len = 2;
                else if (c >= 0xE0 && c <= 0xEF) {
                        len = 3;
                        if (c == 0xE0)
                                lo = 0xA0; /* overlong */
                        else if (c == 0xED)
                                hi = 0x9F; /* surrogates */
                } else if (c >= 0xF0 && c <= 0xF4) {
                        len = 4;
                        if (c == 0xF0)
                                lo = 0x90; /* overlong */
                        else if (c == 0xF4)
                                hi = 0x8F; /* past U+10FFFF */
                } else
                        return i;
                if (n - i < len || b[i + 1] < lo || b[i + 1] > hi)
                        return i;
                for (size_t k = 2; k < len; k++)
                        if ((b[i + k] & 0xC0) != 0x80)
                                return i;
                i += len;
        }
        return n;
}

/* Append path's bytes to the growing buffer, refusing what is not text. */
static int append_file(const char *path, uint8_t **buf, size_t *n, size_t *cap, Diag *d) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return diag_set(d, -errno, "%s: cannot open: %m", path);
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                close(fd);
                return diag_set(d, -EINVAL, "%s: not a regular file", path);
        }
        if (st.st_size == 0) {
                close(fd);
                return diag_set(d, -ENODATA, "%s: the file is empty", path);
        }
        if ((uint64_t)st.st_size > TEXT_MAX_BYTES - *n) {
                close(fd);
                return diag_set(d, -EFBIG, "%s: the corpus would pass %zu bytes", path, TEXT_MAX_BYTES);
        }
        size_t size = (size_t)st.st_size;
        if (*n + size > *cap) {
                size_t want = MAX(*n + size, *cap * 2);
                uint8_t *p = realloc(*buf, want);
                if (!p) {
                        close(fd);
                        return -ENOMEM;
                }
                *buf = p;
                *cap = want;
        }
        uint8_t *dst = *buf + *n;
        size_t got = 0;
        while (got < size) {
                ssize_t r = read(fd, dst + got, size - got);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0) {
                        int e = r < 0 ? -errno : -EIO;
                        close(fd);
                        return diag_set(d, e, "%s: read failed after %zu of %zu bytes", path, got, size);
                }
                got += (size_t)r;
        }
        close(fd);

        const uint8_t *nul = memchr(dst, 0, size);
        if (nul)
                return diag_set(d, -EMEDIUMTYPE, "%s: a NUL byte at offset %zu: a binary file, not text",
                                path, (size_t)(nul - dst));
        size_t bad = utf8_invalid_at(dst, size);
        if (bad < size)
                return diag_set(d, -EMEDIUMTYPE,
                                "%s: byte 0x%02x at offset %zu is not UTF-8: a binary file, or text in another encoding",
                                path, dst[bad], bad);
        *n += size;
        return 1;
}

static bool has_suffix(const char *s, const char *suffix) {
        size_t a = strlen(s), b = strlen(suffix);
        return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_names(const void *a, const void *b) {
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's text files, sorted by name (see text.h for what is skipped). */
static int append_dir(const char *dir, uint8_t **buf, size_t *n, size_t *cap, int *files, Diag *d) {
        DIR *dp = opendir(dir);
        if (!dp)
                return diag_set(d, -errno, "%s: cannot open the directory: %m", dir);
        char **names = NULL;
        size_t count = 0;
        int r = 0;
        struct dirent *e;
        while ((e = readdir(dp))) {
                if (e->d_name[0] == '.' || has_suffix(e->d_name, ".dat") || has_suffix(e->d_name, ".u8"))
                        continue;
                if (count >= TEXT_MAX_FILES) {
                        r = diag_set(d, -E2BIG, "%s: more than %d files", dir, TEXT_MAX_FILES);
                        goto out;
                }
                char **p = realloc(names, sizeof(char *) * (count + 1));
                if (!p) {
                        r = -ENOMEM;
                        goto out;
                }
                names = p;
                if (asprintf(&names[count], "%s/%s", dir, e->d_name) < 0) {
                        r = -ENOMEM;
                        goto out;
                }
                count++;
        }
        qsort(names, count, sizeof(char *), cmp_names);
        int found = 0;
        for (size_t i = 0; i < count; i++) {
                struct stat st;
                if (stat(names[i], &st) < 0 || S_ISDIR(st.st_mode))
                        continue; /* not recursing */
                r = append_file(names[i], buf, n, cap, d);
                if (r < 0)
                        goto out;
                found++;
        }
        if (found == 0)
                r = diag_set(d, -EISDIR, "%s: no text files in the directory", dir);
        *files += found;
out:
        for (size_t i = 0; i < count; i++)
                free(names[i]);
        free(names);
        closedir(dp);
        return r < 0 ? r : 0;
}

int text_load(const char *const *paths, size_t n_paths, TextCorpus **ret, Diag *d) {
        _cleanup_(text_freep) TextCorpus *c = NULL;
        size_t cap = 0;
        int r;

        if (n_paths == 0)
                return diag_set(d, -EINVAL, "no text files given");
        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        for (size_t i = 0; i < n_paths; i++) {
                struct stat st;
                if (stat(paths[i], &st) < 0)
                        return diag_set(d, -errno, "%s: %m", paths[i]);
                if (S_ISDIR(st.st_mode))
                        r = append_dir(paths[i], &c->bytes, &c->n, &cap, &c->n_files, d);
                else {
                        r = append_file(paths[i], &c->bytes, &c->n, &cap, d);
                        c->n_files++;
                }
                if (r < 0)
                        return r;
        }
        /* the last 5 % validate */
        c->n_train = c->n - c->n / 20;
        *ret = TAKE_PTR(c);
        return 0;
}

TextCorpus *text_free(TextCorpus *c) {
        if (!c)
                return NULL;
        free(c->bytes);
        free(c);
        return NULL;
}

int text_sampler_init(TextSampler *s, const TextCorpus *c, TextSplit split, int T, int shard,
                      int n_shards, uint64_t seed, Diag *d) {
        if (T <= 0 || n_shards <= 0 || shard < 0 || shard >= n_shards)
                return diag_set(d, -EINVAL, "need a context above 0 and shard %d to be below %d", shard,
                                n_shards);
        const uint8_t *base = split == TEXT_TRAIN ? c->bytes : c->bytes + c->n_train;
        size_t len = split == TEXT_TRAIN ? c->n_train : c->n - c->n_train;
        /* shard i of n: bytes [len i / n, len (i + 1) / n) of the split */
        size_t lo = len / (size_t)n_shards * (size_t)shard + MIN((size_t)shard, len % (size_t)n_shards);
        size_t n = len / (size_t)n_shards + ((size_t)shard < len % (size_t)n_shards);
        if (n < (size_t)T + 1)
                return diag_set(d, -EINVAL,
                                "the %s split%s holds %zu bytes, fewer than one context + 1 (%d): the corpus (%zu bytes) is too short",
                                split == TEXT_TRAIN ? "training" : "validation",
                                n_shards > 1 ? "'s shard" : "", n, T + 1, c->n);
        *s = (TextSampler){ .bytes = base + lo, .n = n, .T = T, .seed = seed };
        return 0;
}

/* Window starting at byte p of the shard (p + T < n). */
_simd_clones_ static void window_at(const TextSampler *s, size_t p, float *x, int32_t *y) {
        const uint8_t *b = s->bytes + p;
        for (int t = 0; t < s->T; t++) {
                x[t] = (float)b[t];
                y[t] = b[t + 1];
        }
}

void text_sampler_batch(const TextSampler *s, uint64_t step, float *x, int32_t *y, int B) {
        Rng r;
        rng_seed(&r, s->seed ^ ((step + 1) * 0x9e3779b97f4a7c15ULL), RNG_STREAM_SHUFFLE);
        /* starts in [0, n - T - 1]: n - T of them, below 2^31 (TEXT_MAX_BYTES) */
        uint32_t starts = (uint32_t)(s->n - (size_t)s->T);
        for (int b = 0; b < B; b++)
                window_at(s, rng_below(&r, starts), x + (size_t)b * s->T, y + (size_t)b * s->T);
}

size_t text_sampler_windows(const TextSampler *s) {
        return (s->n - 1) / (size_t)s->T;
}

void text_sampler_window(const TextSampler *s, size_t i, float *x, int32_t *y) {
        window_at(s, i * (size_t)s->T, x, y);
}
