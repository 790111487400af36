/* data/idx.c — zlib's gz* functions read gzip and plain files alike. */
#include "idx.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "util/file.h"

static void gzclosep(gzFile *f) {
        if (*f)
                gzclose(*f);
}

/* Read exactly n bytes: 1 on success, 0 on a short read, -EIO on a corrupt
 * stream. */
static int gz_read_full(gzFile f, void *buf, size_t n) {
        uint8_t *p = buf;
        while (n > 0) {
                unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
                int k = gzread(f, p, chunk);
                if (k < 0)
                        return -EIO;
                if (k == 0) {
                        int err;
                        gzerror(f, &err);
                        return err != Z_OK && err != Z_BUF_ERROR ? -EIO : 0;
                }
                p += k;
                n -= (size_t)k;
        }
        return 1;
}

#define IDX_GZIP_MAX_RATIO 1032u

/* Does a gzip stream, read up to the data, hold exactly n bytes more? Its
 * last 4 bytes say how much it holds in all (mod 2^32): a file cut short
 * ends in other bytes. Only on a mismatch (cut short, or a file of several
 * gzip members) is the stream read through. */
static int gz_check_length(gzFile f, int fd, const struct stat *st, uint64_t whole, size_t n, const char *path,
                           Diag *d) {
        uint8_t tail[4];
        if (st->st_size >= 18 && pread(fd, tail, 4, st->st_size - 4) == 4 &&
            ((uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 | (uint32_t)tail[3] << 24) ==
                    (uint32_t)whole)
                return 0;
        _cleanup_(freep) uint8_t *buf = malloc(1 << 16);
        if (!buf)
                return diag_set(d, -ENOMEM, "%s: out of memory", path);
        uint64_t got = 0;
        int k;
        while ((k = gzread(f, buf, 1 << 16)) > 0)
                got += (uint64_t)k;
        int err = Z_OK;
        gzerror(f, &err);
        if (k < 0 || (err != Z_OK && err != Z_BUF_ERROR))
                return diag_set(d, -EIO, "%s: corrupt gzip stream in the data", path);
        if (got != n)
                return diag_set(d, got < n ? -ENODATA : -EFBIG, "%s: %s: the header promises %zu data bytes, the "
                                "file holds %ju", path, got < n ? "truncated" : "trailing bytes after the data", n,
                                (uintmax_t)got);
        return 0;
}

/* Open path and read its header into a (dims and n; no data yet); with
 * check_length, make sure that the data are all there, as loading them
 * would (a check that reads only the header: idx_read_header()). */
static int open_header(const char *path, int want_ndim, bool check_length, gzFile *ret_f, IdxArray *a, Diag *d) {
        _cleanup_(gzclosep) gzFile f = NULL;
        uint8_t header[4], dimbuf[4 * IDX_MAX_DIMS];
        int r;

        struct stat st;
        int fd = file_open_regular(path, 0, &st, d);
        if (fd < 0)
                return fd;
        f = gzdopen(fd, "rb");
        if (!f) {
                close(fd);
                return diag_set(d, -ENOMEM, "%s: cannot open: out of memory", path);
        }
        gzbuffer(f, 1 << 17);

        r = gz_read_full(f, header, sizeof header);
        if (r < 0)
                return diag_set(d, r, "%s: corrupt gzip stream in the header", path);
        if (r == 0)
                return diag_set(d, -ENODATA, "%s: truncated: shorter than the 4-byte IDX header", path);
        if (header[0] != 0 || header[1] != 0 || header[2] != 0x08)
                return diag_set(d, -EBADMSG,
                                "%s: bad magic %02x%02x%02x%02x (want 000008xx: an IDX file of unsigned bytes)",
                                path, header[0], header[1], header[2], header[3]);
        if (header[3] != want_ndim || want_ndim < 1 || want_ndim > IDX_MAX_DIMS)
                return diag_set(d, -EBADMSG, "%s: has %u dimensions, expected %d", path, header[3],
                                want_ndim);
        a->ndim = want_ndim;

        r = gz_read_full(f, dimbuf, 4 * (size_t)want_ndim);
        if (r < 0)
                return diag_set(d, r, "%s: corrupt gzip stream in the header", path);
        if (r == 0)
                return diag_set(d, -ENODATA, "%s: truncated inside the dimension list", path);

        a->n = 1;
        for (int i = 0; i < want_ndim; i++) {
                const uint8_t *b = dimbuf + 4 * i;
                a->dims[i] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
                if (a->dims[i] == 0)
                        return diag_set(d, -EBADMSG, "%s: dimension %d is 0", path, i);
                if (!size_mul(a->n, a->dims[i], &a->n) || a->n > IDX_MAX_ELEMENTS)
                        return diag_set(d, -EBADMSG, "%s: dimensions claim more than %zu elements",
                                        path, IDX_MAX_ELEMENTS);
        }
        /* before anything is allocated for them: gzip's deflate packs at
         * most 1032 bytes into one, and a plain file holds what it holds */
        uint64_t room = (uint64_t)st.st_size * (gzdirect(f) ? 1 : IDX_GZIP_MAX_RATIO);
        if (a->n > room)
                return diag_set(d, -ENODATA, "%s: truncated: the header promises %zu data bytes, the file "
                                "(%jd bytes) cannot hold them", path, a->n, (intmax_t)st.st_size);
        /* a plain file's size says it all, so a check that reads only the
         * header (job_check_data()) refuses what loading it would */
        uint64_t whole = 4 + 4 * (uint64_t)want_ndim + a->n;
        if (gzdirect(f) && (uint64_t)st.st_size != whole)
                return diag_set(d, (uint64_t)st.st_size < whole ? -ENODATA : -EFBIG,
                                "%s: %s: the header promises %ju bytes in all, the file has %jd", path,
                                (uint64_t)st.st_size < whole ? "truncated" : "trailing bytes after the data",
                                (uintmax_t)whole, (intmax_t)st.st_size);
        if (check_length && !gzdirect(f) && (r = gz_check_length(f, fd, &st, whole, a->n, path, d)) < 0)
                return r;
        *ret_f = TAKE_PTR(f);
        return 0;
}

int idx_read_header(const char *path, int want_ndim, IdxArray *ret, Diag *d) {
        _cleanup_(gzclosep) gzFile f = NULL;
        IdxArray a = {};
        int r = open_header(path, want_ndim, true, &f, &a, d);
        if (r < 0)
                return r;
        *ret = a;
        return 0;
}

int idx_load(const char *path, int want_ndim, IdxArray **ret, Diag *d) {
        _cleanup_(gzclosep) gzFile f = NULL;
        _cleanup_(idx_freep) IdxArray *a = NULL;
        int r;

        a = calloc(1, sizeof *a);
        if (!a)
                return diag_set(d, -ENOMEM, "%s: out of memory", path);
        r = open_header(path, want_ndim, false, &f, a, d);
        if (r < 0)
                return r;

        a->data = malloc(a->n);
        if (!a->data)
                return diag_set(d, -ENOMEM, "%s: no memory for %zu data bytes", path, a->n);
        r = gz_read_full(f, a->data, a->n);
        if (r < 0)
                return diag_set(d, r, "%s: corrupt gzip stream in the data", path);
        if (r == 0)
                return diag_set(d, -ENODATA, "%s: truncated: the header promises %zu data bytes", path,
                                a->n);

        /* Nothing may follow the data. */
        uint8_t extra;
        r = gz_read_full(f, &extra, 1);
        if (r < 0)
                return diag_set(d, r, "%s: corrupt gzip stream after the data", path);
        if (r > 0)
                return diag_set(d, -EFBIG, "%s: trailing bytes after the %zu data bytes", path, a->n);

        *ret = TAKE_PTR(a);
        return 0;
}

IdxArray *idx_free(IdxArray *a) {
        if (!a)
                return NULL;
        free(a->data);
        free(a);
        return NULL;
}
