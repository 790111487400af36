/* run/checkpoint.c — see checkpoint.h for the format and the guarantees. */
#include "checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "nn/optim.h"
#include "tensor/tensor.h"
#include "util/file.h"
#include "util/macro.h"
#include "util/time-util.h"

#define BYTE_ORDER_MARK 0x01020304u
#define TMP_INFIX ".tmp-"
#define TMP_TEMPLATE TMP_INFIX "XXXXXX"
/* The writer writes, and calls the test hook, in chunks of this size; the
 * reader reads in chunks of READ_CHUNK. */
#define WRITE_CHUNK ((size_t)64 << 10)
#define READ_CHUNK ((size_t)1 << 20)

typedef struct CheckpointHeader {
        char magic[8];
        uint32_t version;
        uint32_t byte_order;
        uint32_t header_size;
        uint32_t optim_kind;
        char job[64];
        int32_t lo, hi;
        uint64_t n_params, n_state, optim_t, epoch, step_in_epoch, samples, updates, step, written_usec;
        uint8_t model[CHECKPOINT_MODEL_SIZE];
        uint32_t batch;
        uint8_t reserved[20];
        uint8_t header_hash[CHECKPOINT_HASH_SIZE]; /* of the bytes before it */
} CheckpointHeader;

_Static_assert(sizeof(CheckpointHeader) == CHECKPOINT_HEADER_SIZE, "header is 256 bytes");
_Static_assert(offsetof(CheckpointHeader, lo) == 88, "layout as in checkpoint.h");
_Static_assert(offsetof(CheckpointHeader, n_params) == 96, "layout as in checkpoint.h");
_Static_assert(offsetof(CheckpointHeader, model) == 168, "layout as in checkpoint.h");
_Static_assert(offsetof(CheckpointHeader, batch) == 200, "layout as in checkpoint.h");
_Static_assert(offsetof(CheckpointHeader, reserved) == 204, "layout as in checkpoint.h");
_Static_assert(offsetof(CheckpointHeader, header_hash) == CHECKPOINT_HEADER_SIZE - CHECKPOINT_HASH_SIZE,
               "the header hash ends the header");

void (*checkpoint_test_hook)(CheckpointPoint point) = NULL;

static void hook(CheckpointPoint point) {
        if (checkpoint_test_hook)
                checkpoint_test_hook(point);
}

/* A plain file name short enough to carry the temporary's suffix. */
static int name_valid(const char *name) {
        size_t len = name ? strlen(name) : 0;
        return len > 0 && len + strlen(TMP_TEMPLATE) <= NAME_MAX && !strchr(name, '/') &&
               strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* 0 when info is sound; -EINVAL with the reason in why otherwise. */
static int info_check(const CheckpointInfo *info, char *why, size_t size) {
        if (!memchr(info->job, 0, sizeof info->job))
                snprintf(why, size, "job name not NUL-terminated within %zu bytes", sizeof info->job);
        else if (info->lo < 0 || info->lo > info->hi)
                snprintf(why, size, "bad layer range [%d, %d)", info->lo, info->hi);
        else if (info->optim_kind >= _OPTIM_KIND_MAX)
                snprintf(why, size, "unknown optimizer kind %u", info->optim_kind);
        else if (info->n_params > CHECKPOINT_MAX_FLOATS || info->n_state > CHECKPOINT_MAX_FLOATS ||
                 info->n_params + info->n_state > CHECKPOINT_MAX_FLOATS)
                snprintf(why, size, "%ju parameters and %ju floats of optimizer state: more than %ju floats",
                         (uintmax_t)info->n_params, (uintmax_t)info->n_state, (uintmax_t)CHECKPOINT_MAX_FLOATS);
        else
                return 0;
        return -EINVAL;
}

/* Bytes of params and state; info_check() bounds it, so no overflow. */
static uint64_t payload_bytes(const CheckpointInfo *info) {
        return (info->n_params + info->n_state) * sizeof(float);
}

static void header_hash(const CheckpointHeader *h, uint8_t out[CHECKPOINT_HASH_SIZE]) {
        crypto_generichash(out, CHECKPOINT_HASH_SIZE, (const uint8_t *)h, offsetof(CheckpointHeader, header_hash),
                           NULL, 0);
}

static void header_from_info(CheckpointHeader *h, const CheckpointInfo *info, uint64_t written_usec) {
        *h = (CheckpointHeader){
                .version = CHECKPOINT_VERSION,
                .byte_order = BYTE_ORDER_MARK,
                .header_size = CHECKPOINT_HEADER_SIZE,
                .optim_kind = info->optim_kind,
                .lo = info->lo,
                .hi = info->hi,
                .n_params = info->n_params,
                .n_state = info->n_state,
                .optim_t = info->optim_t,
                .epoch = info->epoch,
                .step_in_epoch = info->step_in_epoch,
                .samples = info->samples,
                .updates = info->updates,
                .step = info->step,
                .written_usec = written_usec,
                .batch = info->batch,
        };
        memcpy(h->magic, CHECKPOINT_MAGIC, sizeof h->magic);
        memcpy(h->model, info->model, sizeof h->model);
        /* NUL-padded, so no stray bytes of the caller's buffer reach the file */
        memcpy(h->job, info->job, strnlen(info->job, sizeof h->job));
        header_hash(h, h->header_hash);
}

static void header_to_info(const CheckpointHeader *h, CheckpointInfo *info) {
        *info = (CheckpointInfo){
                .lo = h->lo,
                .hi = h->hi,
                .n_params = h->n_params,
                .n_state = h->n_state,
                .optim_kind = h->optim_kind,
                .optim_t = h->optim_t,
                .epoch = h->epoch,
                .step_in_epoch = h->step_in_epoch,
                .samples = h->samples,
                .updates = h->updates,
                .step = h->step,
                .written_usec = h->written_usec,
                .batch = h->batch,
        };
        memcpy(info->job, h->job, sizeof info->job);
        memcpy(info->model, h->model, sizeof info->model);
}

void checkpoint_model_digest(const Layer *layers, int n, uint8_t out[CHECKPOINT_MODEL_SIZE]) {
        crypto_generichash_state st;
        char line[256];

        /* BLAKE2b works before sodium_init(), which only picks a faster implementation */
        crypto_generichash_init(&st, NULL, 0, CHECKPOINT_MODEL_SIZE);
        crypto_generichash_update(&st, (const uint8_t *)"ravnest layers 1\n", 17);
        for (int i = 0; i < n; i++) {
                const Layer *l = &layers[i];
                const LayerSpec *s = &l->spec;
                int k = snprintf(line, sizeof line, "%s out %d kernel %d stride %d padding %d vocab %d heads %d "
                                 "in %dx%dx%d out %dx%dx%d\n", layer_kind_to_string(l->kind), s->out, s->kernel,
                                 s->stride, s->padding, s->vocab, s->heads, l->in.c, l->in.h, l->in.w, l->out.c,
                                 l->out.h, l->out.w);
                crypto_generichash_update(&st, (const uint8_t *)line, (size_t)k);
        }
        crypto_generichash_final(&st, out, CHECKPOINT_MODEL_SIZE);
}

int checkpoint_model_check(const CheckpointInfo *info, const Layer *layers, int n, const char *path, Diag *d) {
        static const uint8_t unrecorded[CHECKPOINT_MODEL_SIZE];
        uint8_t want[CHECKPOINT_MODEL_SIZE];

        if (memcmp(info->model, unrecorded, sizeof unrecorded) == 0)
                return 0;
        checkpoint_model_digest(layers, n, want);
        if (memcmp(info->model, want, sizeof want) != 0)
                return diag_set(d, -EINVAL, "%s: written for another model: layers %d-%d differ from the job's "
                                "(a kind, a setting or a shape)", path, info->lo, info->hi - 1);
        return 0;
}

/* ---- writing -------------------------------------------------------------- */

static int write_full(int fd, const void *buf, size_t n) {
        const uint8_t *p = buf;
        while (n > 0) {
                ssize_t k = write(fd, p, n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        return -EIO;
                p += k;
                n -= (size_t)k;
        }
        return 0;
}

/* Write and hash buf in chunks, calling the hook after each. */
static int write_hashed(int fd, crypto_generichash_state *st, const void *buf, uint64_t n) {
        const uint8_t *p = buf;
        for (uint64_t off = 0; off < n; off += WRITE_CHUNK) {
                size_t k = (size_t)MIN(n - off, (uint64_t)WRITE_CHUNK);
                int r = write_full(fd, p + off, k);
                if (r < 0)
                        return r;
                crypto_generichash_update(st, p + off, k);
                hook(CHECKPOINT_POINT_CHUNK);
        }
        return 0;
}

static int write_file(int fd, const CheckpointHeader *h, const float *params, const float *state) {
        crypto_generichash_state st;
        uint8_t trailer[CHECKPOINT_HASH_SIZE];
        int r;

        crypto_generichash_init(&st, NULL, 0, CHECKPOINT_HASH_SIZE);
        r = write_hashed(fd, &st, h, sizeof *h);
        if (r >= 0)
                r = write_hashed(fd, &st, params, h->n_params * sizeof(float));
        if (r >= 0)
                r = write_hashed(fd, &st, state, h->n_state * sizeof(float));
        if (r < 0)
                return r;
        crypto_generichash_final(&st, trailer, sizeof trailer);
        r = write_full(fd, trailer, sizeof trailer);
        if (r < 0)
                return r;
        hook(CHECKPOINT_POINT_CHUNK);
        return 0;
}

/* Unlink <name>.tmp-XXXXXX in dfd; the count removed, or -errno. */
static int clean_stale_at(int dfd, const char *name) {
        size_t len = strlen(name), infix = strlen(TMP_INFIX), tail = strlen(TMP_TEMPLATE) - infix;
        int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 3), n = 0;
        if (fd < 0)
                return -errno;
        DIR *dir = fdopendir(fd);
        if (!dir) {
                int r = -errno;
                close(fd);
                return r;
        }
        rewinddir(dir);
        for (struct dirent *de; (de = readdir(dir));) {
                const char *s = de->d_name;
                if (strlen(s) != len + infix + tail || strncmp(s, name, len) != 0 ||
                    strncmp(s + len, TMP_INFIX, infix) != 0)
                        continue;
                /* mkostemp's letters, whatever the locale */
                bool ok = true;
                for (size_t i = len + infix; s[i]; i++)
                        ok = ok && ((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
                                    (s[i] >= 'A' && s[i] <= 'Z'));
                if (ok && unlinkat(dfd, s, 0) == 0)
                        n++;
        }
        closedir(dir);
        return n;
}

int checkpoint_clean_stale(const char *dir, const char *name) {
        if (!name_valid(name))
                return -EINVAL;
        _cleanup_(closep) int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        return clean_stale_at(dfd, name);
}

/* n values of part 0 (the parameters) or 1 (the optimizer's state, whose
 * first value is value `first` of it): every one finite, and the
 * optimizer's moments as optim_moment_valid() takes them (a second moment
 * never negative). What a peer may not send, a file may not hold. */
static bool values_valid(const CheckpointHeader *h, int part, uint64_t first, const float *v, size_t n) {
        if (part == 0 || h->n_params == 0)
                return tensor_finite(v, n);
        while (n > 0) {
                uint64_t k = first / h->n_params;
                size_t m = (size_t)MIN((uint64_t)n, h->n_params - first % h->n_params);
                if (k < optim_moments((OptimKind)h->optim_kind) ? !optim_moment_valid((OptimKind)h->optim_kind,
                                                                                       (unsigned)k, v, m)
                                                                 : !tensor_finite(v, m))
                        return false;
                first += m;
                v += m;
                n -= m;
        }
        return true;
}

/* What the reader refuses, the writer does not write: a stage whose
 * training diverged would replace its last good checkpoint with one no
 * restart can use. -ERANGE, d naming the first bad parameter. */
static int payload_check(const CheckpointHeader *h, const float *params, const float *state, const char *dir,
                         const char *name, Diag *d) {
        if (h->n_params > 0 && !values_valid(h, 0, 0, params, h->n_params)) {
                size_t i = 0;
                while (i < h->n_params && isfinite(params[i]))
                        i++;
                return diag_set(d, -ERANGE, "%s/%s: not written: parameter %zu of %llu is not finite (%g)", dir,
                                name, i, (unsigned long long)h->n_params, i < h->n_params ? params[i] : 0.0f);
        }
        if (h->n_state > 0 && !values_valid(h, 1, 0, state, h->n_state))
                return diag_set(d, -ERANGE, "%s/%s: not written: the optimizer state is not finite, or holds a "
                                "negative second moment", dir, name);
        return 0;
}

int checkpoint_write(const char *dir, const char *name, const CheckpointInfo *info, const float *params,
                     const float *state, Diag *d) {
        char path[PATH_MAX], tmp[PATH_MAX], why[160];
        _cleanup_(closep) int dfd = -1, fd = -1;
        CheckpointHeader h;
        int r;

        if (!name_valid(name))
                return diag_set(d, -EINVAL, "checkpoint name \"%s\" is not a plain file name of at most %zu bytes",
                                name ? name : "(null)", NAME_MAX - strlen(TMP_TEMPLATE));
        if (info_check(info, why, sizeof why) < 0)
                return diag_set(d, -EINVAL, "%s/%s: cannot write: %s", dir, name, why);
        if ((info->n_params > 0 && !params) || (info->n_state > 0 && !state))
                return diag_set(d, -EINVAL, "%s/%s: cannot write: no buffer for the parameters or state", dir,
                                name);
        if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
            snprintf(tmp, sizeof tmp, "%s/%s" TMP_TEMPLATE, dir, name) >= (int)sizeof tmp)
                return diag_set(d, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
        if (sodium_init() < 0)
                return diag_set(d, -EIO, "libsodium failed to initialize");
        header_from_info(&h, info, now_realtime_usec());
        r = payload_check(&h, params, state, dir, name, d);
        if (r < 0)
                return r;

        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return diag_set(d, -errno, "%s: cannot open the checkpoint directory: %m", dir);
        (void)clean_stale_at(dfd, name); /* best effort: a leftover only costs space */

        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0)
                return diag_set(d, -errno, "%s: cannot create: %m", tmp);
        hook(CHECKPOINT_POINT_CREATED);

        r = write_file(fd, &h, params, state);
        if (r < 0)
                diag_set(d, r, "%s: cannot write: %s", tmp, strerror(-r));
        if (r >= 0) {
                hook(CHECKPOINT_POINT_WRITTEN);
                if (fsync(fd) < 0)
                        r = diag_set(d, -errno, "%s: cannot fsync: %m", tmp);
        }
        /* close() may report a deferred write error (NFS) */
        if (r >= 0 && close(TAKE_FD(fd)) < 0)
                r = diag_set(d, -errno, "%s: cannot close: %m", tmp);
        if (r >= 0) {
                hook(CHECKPOINT_POINT_SYNCED);
                if (rename(tmp, path) < 0)
                        r = diag_set(d, -errno, "%s: cannot rename to %s: %m", tmp, path);
        }
        if (r < 0) {
                (void)unlink(tmp);
                return r;
        }
        hook(CHECKPOINT_POINT_RENAMED);

        /* The rename is durable only once the directory is. */
        if (fsync(dfd) < 0)
                return diag_set(d, -errno, "%s: written, but cannot fsync its directory: %m", path);
        hook(CHECKPOINT_POINT_DIR_SYNCED);
        return 0;
}

/* ---- reading -------------------------------------------------------------- */

/* Read n bytes at off: 1 when all were there, 0 at a premature end of file,
 * -errno on error. */
static int read_full_at(int fd, void *buf, size_t n, uint64_t off) {
        uint8_t *p = buf;
        while (n > 0) {
                ssize_t k = pread(fd, p, n, (off_t)off);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        return 0;
                p += k;
                n -= (size_t)k;
                off += (uint64_t)k;
        }
        return 1;
}

/* Open path and check its header against itself and the file's size. */
static int header_load(const char *path, int *ret_fd, CheckpointHeader *ret_h, CheckpointInfo *ret_info,
                       Diag *d) {
        _cleanup_(closep) int fd = -1;
        CheckpointHeader h;
        CheckpointInfo info;
        uint8_t hash[CHECKPOINT_HASH_SIZE];
        char why[160];
        struct stat st;
        int r;

        if (sodium_init() < 0)
                return diag_set(d, -EIO, "libsodium failed to initialize");
        fd = file_open_regular(path, 0, &st, d);
        if (fd < 0)
                return fd == -EINVAL ? -EBADMSG : fd; /* not a regular file: as a corrupt one */

        r = read_full_at(fd, &h, sizeof h, 0);
        if (r < 0)
                return diag_set(d, r, "%s: cannot read: %s", path, strerror(-r));
        if (r == 0)
                return diag_set(d, -EBADMSG, "%s: truncated: %jd bytes, shorter than the %u-byte header", path,
                                (intmax_t)st.st_size, CHECKPOINT_HEADER_SIZE);
        if (memcmp(h.magic, CHECKPOINT_MAGIC, sizeof h.magic) != 0)
                return diag_set(d, -EBADMSG, "%s: bad magic: not a ravnest checkpoint", path);
        if (h.version != CHECKPOINT_VERSION)
                return diag_set(d, -EBADMSG, "%s: format version %u, this build reads version %u", path,
                                h.version, CHECKPOINT_VERSION);
        if (h.byte_order != BYTE_ORDER_MARK)
                return diag_set(d, -EBADMSG, "%s: %s", path,
                                h.byte_order == __builtin_bswap32(BYTE_ORDER_MARK)
                                        ? "written on a machine of the other byte order"
                                        : "bad byte-order mark");
        if (h.header_size != CHECKPOINT_HEADER_SIZE)
                return diag_set(d, -EBADMSG, "%s: header size %u, expected %u", path, h.header_size,
                                CHECKPOINT_HEADER_SIZE);
        header_hash(&h, hash);
        if (sodium_memcmp(hash, h.header_hash, sizeof hash) != 0)
                return diag_set(d, -EBADMSG, "%s: header checksum mismatch: the header is corrupt", path);
        for (size_t i = 0; i < sizeof h.reserved; i++)
                if (h.reserved[i] != 0)
                        return diag_set(d, -EBADMSG, "%s: reserved header byte %zu is not zero", path,
                                        offsetof(CheckpointHeader, reserved) + i);

        header_to_info(&h, &info);
        if (info_check(&info, why, sizeof why) < 0)
                return diag_set(d, -EBADMSG, "%s: %s", path, why);
        uint64_t want = CHECKPOINT_HEADER_SIZE + payload_bytes(&info) + CHECKPOINT_HASH_SIZE;
        if ((uint64_t)st.st_size != want)
                return diag_set(d, -EBADMSG, "%s: %s: the header promises %ju bytes, the file has %jd", path,
                                (uint64_t)st.st_size < want ? "truncated" : "trailing bytes", (uintmax_t)want,
                                (intmax_t)st.st_size);

        *ret_fd = TAKE_FD(fd);
        *ret_h = h;
        *ret_info = info;
        return 0;
}

int checkpoint_read_info(const char *path, CheckpointInfo *ret, Diag *d) {
        _cleanup_(closep) int fd = -1;
        CheckpointHeader h;
        CheckpointInfo info;
        int r = header_load(path, &fd, &h, &info, d);
        if (r < 0)
                return r;
        *ret = info;
        return 0;
}

/* Hash the header and the payload of fd and compare with the trailer. The
 * payload goes into dst[0] (params) and dst[1] (state) when they are not
 * NULL, through the READ_CHUNK bytes of buf otherwise, where the values
 * are checked too (values_valid()). */
static int payload_verify(int fd, const char *path, const CheckpointHeader *h, uint8_t *buf, float *const dst[2],
                          Diag *d) {
        const uint64_t len[2] = { h->n_params * sizeof(float), h->n_state * sizeof(float) };
        uint8_t hash[CHECKPOINT_HASH_SIZE], trailer[CHECKPOINT_HASH_SIZE];
        crypto_generichash_state st;
        uint64_t off = CHECKPOINT_HEADER_SIZE;
        int r;

        crypto_generichash_init(&st, NULL, 0, CHECKPOINT_HASH_SIZE);
        crypto_generichash_update(&st, (const uint8_t *)h, sizeof *h);
        for (int s = 0; s < 2; s++)
                for (uint64_t done = 0; done < len[s]; done += READ_CHUNK) {
                        size_t k = (size_t)MIN(len[s] - done, (uint64_t)READ_CHUNK);
                        uint8_t *p = dst ? (uint8_t *)dst[s] + done : buf;
                        r = read_full_at(fd, p, k, off);
                        if (r < 0)
                                return diag_set(d, r, "%s: cannot read: %s", path, strerror(-r));
                        if (r == 0)
                                return diag_set(d, -EBADMSG, "%s: truncated while being read", path);
                        crypto_generichash_update(&st, p, k);
                        if (!dst && !values_valid(h, s, done / sizeof(float), (const float *)p, k / sizeof(float)))
                                return diag_set(d, -EBADMSG, "%s: holds %s that %s", path,
                                                s == 0 ? "parameters" : "optimizer state",
                                                s == 0 ? "are not finite" : "is not finite, or a negative second moment");
                        off += k;
                }
        crypto_generichash_final(&st, hash, sizeof hash);

        r = read_full_at(fd, trailer, sizeof trailer, off);
        if (r < 0)
                return diag_set(d, r, "%s: cannot read: %s", path, strerror(-r));
        if (r == 0)
                return diag_set(d, -EBADMSG, "%s: truncated while being read", path);
        if (sodium_memcmp(hash, trailer, sizeof hash) != 0)
                return diag_set(d, -EBADMSG, "%s: checksum mismatch: the parameters or state are corrupt%s", path,
                                dst ? " (the file changed while being read)" : "");
        return 0;
}

int checkpoint_read(const char *path, CheckpointInfo *ret_info, float *params, size_t n_params, float *state,
                    size_t n_state, Diag *d) {
        _cleanup_(closep) int fd = -1;
        _cleanup_(freep) uint8_t *buf = NULL;
        CheckpointHeader h;
        CheckpointInfo info;
        int r;

        if ((n_params > 0 && !params) || (n_state > 0 && !state))
                return diag_set(d, -EINVAL, "%s: no buffer for the parameters or state", path);
        r = header_load(path, &fd, &h, &info, d);
        if (r < 0)
                return r;
        if (info.n_params != n_params)
                return diag_set(d, -EINVAL, "%s: holds %ju parameters, expected %zu", path,
                                (uintmax_t)info.n_params, n_params);
        if (info.n_state != n_state)
                return diag_set(d, -EINVAL, "%s: holds %ju floats of optimizer state, expected %zu", path,
                                (uintmax_t)info.n_state, n_state);

        /* Verify everything before the outputs are touched; then read into
         * them, checking again that it is the same bytes. */
        buf = malloc(READ_CHUNK);
        if (!buf)
                return diag_set(d, -ENOMEM, "%s: out of memory", path);
        r = payload_verify(fd, path, &h, buf, NULL, d);
        if (r < 0)
                return r;
        r = payload_verify(fd, path, &h, NULL, (float *const[2]){ params, state }, d);
        if (r < 0)
                return r;
        if (ret_info)
                *ret_info = info;
        return 0;
}
