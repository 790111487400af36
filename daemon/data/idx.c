/* data/idx.c — zlib's gz* functions read the header of gzip and plain files
 * alike; a gzip file's data are inflated with inflate() itself, which says
 * where its stream ends (gzread() passes over bytes after it). */
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
#define GZ_CHUNK ((size_t)1 << 16)

static void inflate_endp(z_stream *z) {
        inflateEnd(z);
}

/* Copy what of out_chunk (len bytes at offset at of the whole stream) falls
 * in [skip, skip + n) to out. */
static void gz_sink(const uint8_t *out_chunk, size_t len, uint64_t at, uint64_t skip, uint8_t *out, size_t n) {
        uint64_t lo = MAX(at, skip), hi = MIN(at + len, skip + n);
        if (out && lo < hi)
                memcpy(out + (lo - skip), out_chunk + (lo - at), hi - lo);
}

/* Inflate the whole gzip file fd from its start, as loading does, and check
 * it holds exactly skip + n bytes: every member's deflate data and CRC-32
 * (which zlib checks at its end), and nothing after the last member (zlib's
 * gzread() passes over such bytes). Bytes [skip, skip + n) of what it
 * holds go to out (NULL: they are only checked). */
static int gz_read_through(int fd, uint64_t skip, uint8_t *out, size_t n, const char *path, Diag *d) {
        _cleanup_(inflate_endp) z_stream z = {};
        _cleanup_(freep) uint8_t *buf = malloc(2 * GZ_CHUNK);
        uint64_t got = 0, whole = skip + n;
        off_t pos = 0;
        int zr = Z_OK, members = 0;

        if (!buf || inflateInit2(&z, 15 + 16) != Z_OK) /* 16: a gzip wrapper */
                return diag_set(d, -ENOMEM, "%s: out of memory", path);
        for (;;) {
                if (z.avail_in == 0) {
                        ssize_t k = pread(fd, buf, GZ_CHUNK, pos);
                        if (k < 0)
                                return diag_set(d, -errno, "%s: cannot read: %m", path);
                        if (k == 0)
                                break;
                        pos += k;
                        z.next_in = buf;
                        z.avail_in = (uInt)k;
                }
                if (zr == Z_STREAM_END && inflateReset(&z) != Z_OK) /* another member follows */
                        return diag_set(d, -EIO, "%s: corrupt gzip stream in the data", path);
                z.next_out = buf + GZ_CHUNK;
                z.avail_out = GZ_CHUNK;
                zr = inflate(&z, Z_NO_FLUSH);
                size_t len = GZ_CHUNK - z.avail_out;
                gz_sink(buf + GZ_CHUNK, len, got, skip, out, n);
                got += len;
                if (zr == Z_STREAM_END)
                        members++;
                else if (zr != Z_OK)
                        break;
                if (got > whole)
                        break;
        }
        /* what follows a member and is not one starts no output of its own */
        if (zr != Z_STREAM_END && members > 0 && z.total_out == 0)
                return diag_set(d, -EFBIG, "%s: trailing bytes after the gzip data", path);
        if (zr != Z_OK && zr != Z_STREAM_END)
                return diag_set(d, -EIO, "%s: corrupt gzip stream in the data", path);
        if (got == whole && zr != Z_STREAM_END)
                return diag_set(d, -ENODATA, "%s: truncated: the gzip stream ends inside a member", path);
        if (got != whole)
                return diag_set(d, got < whole ? -ENODATA : -EFBIG, "%s: %s: the header promises %zu data bytes, "
                                "the file holds %s%ju", path, got < whole ? "truncated" : "trailing bytes after the data",
                                n, got > whole ? "more than " : "", (uintmax_t)(got - skip));
        return 0;
}

static uint64_t header_bytes(int ndim) {
        return 4 + 4 * (uint64_t)ndim;
}

/* Open path and read its header into a (dims and n; no data yet). ret_fd
 * gets the file's descriptor, which *ret_f owns, to read a gzip file
 * through with gz_read_through(). */
static int open_header(const char *path, int want_ndim, gzFile *ret_f, int *ret_fd, IdxArray *a, Diag *d) {
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
        uint64_t whole = header_bytes(want_ndim) + a->n;
        if (gzdirect(f) && (uint64_t)st.st_size != whole)
                return diag_set(d, (uint64_t)st.st_size < whole ? -ENODATA : -EFBIG,
                                "%s: %s: the header promises %ju bytes in all, the file has %jd", path,
                                (uint64_t)st.st_size < whole ? "truncated" : "trailing bytes after the data",
                                (uintmax_t)whole, (intmax_t)st.st_size);
        *ret_f = TAKE_PTR(f);
        *ret_fd = fd;
        return 0;
}

int idx_read_header(const char *path, int want_ndim, IdxArray *ret, Diag *d) {
        _cleanup_(gzclosep) gzFile f = NULL;
        IdxArray a = {};
        int fd;
        int r = open_header(path, want_ndim, &f, &fd, &a, d);
        if (r < 0)
                return r;
        /* as loading would: a gzip file's data are read through to its end */
        if (!gzdirect(f) && (r = gz_read_through(fd, header_bytes(a.ndim), NULL, a.n, path, d)) < 0)
                return r;
        *ret = a;
        return 0;
}

int idx_load(const char *path, int want_ndim, IdxArray **ret, Diag *d) {
        _cleanup_(gzclosep) gzFile f = NULL;
        _cleanup_(idx_freep) IdxArray *a = NULL;
        int fd, r;

        a = calloc(1, sizeof *a);
        if (!a)
                return diag_set(d, -ENOMEM, "%s: out of memory", path);
        r = open_header(path, want_ndim, &f, &fd, a, d);
        if (r < 0)
                return r;

        a->data = malloc(a->n);
        if (!a->data)
                return diag_set(d, -ENOMEM, "%s: no memory for %zu data bytes", path, a->n);
        if (!gzdirect(f)) {
                if ((r = gz_read_through(fd, header_bytes(a->ndim), a->data, a->n, path, d)) < 0)
                        return r;
                *ret = TAKE_PTR(a);
                return 0;
        }
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
