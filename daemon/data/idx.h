/* data/idx.h — reader for IDX files (the MNIST family's format), plain or
 * gzip-compressed, with every header field checked before it is trusted.
 *
 * Layout: two zero bytes, a type byte (0x08 = unsigned byte, the only one
 * datasets here use), a byte with the number of dimensions, then each
 * dimension as a big-endian uint32, then the data in row-major order.
 *
 *     IdxArray *a;
 *     Diag d = {};
 *     r = idx_load("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", 1, &a, &d);
 *     // a->dims[0] == 10000, a->data[i] is label i
 *     idx_free(a);
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "util/diag.h"
#include "util/macro.h"

#define IDX_MAX_DIMS 4
/* Refuse files that claim more than this many elements (1 GiB of bytes). */
#define IDX_MAX_ELEMENTS ((size_t)1 << 30)

typedef struct IdxArray {
        int ndim;
        uint32_t dims[IDX_MAX_DIMS];
        size_t n; /* product of dims */
        uint8_t *data;
} IdxArray;

/* Load path, which must hold an unsigned-byte array of exactly want_ndim
 * dimensions. Errors: -ENOENT and friends from open, -EBADMSG for a bad
 * magic or type, -EINVAL for wrong or absurd dimensions, -ENODATA for a file
 * shorter than its header says, -EFBIG for trailing bytes, -EIO for a corrupt
 * gzip stream. d says which and names the file. */
int idx_load(const char *path, int want_ndim, IdxArray **ret, Diag *d);
/* The header of path, checked as idx_load() checks it: ret gets ndim,
 * dims and n, and no data. A plain file is not read past its header; a
 * gzip file is inflated to its end (and dropped), so a corrupt stream or
 * bytes after it fail here as they would in idx_load(). */
int idx_read_header(const char *path, int want_ndim, IdxArray *ret, Diag *d);
IdxArray *idx_free(IdxArray *a);
DEFINE_TRIVIAL_CLEANUP_FUNC(IdxArray *, idx_free);
