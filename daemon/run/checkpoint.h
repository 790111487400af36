/* run/checkpoint.h — one stage's (or the whole model's) training state in
 * a file that is either the old version or the new one, never half of each.
 *
 *     CheckpointInfo info = { .job = "fashion-mnist-mlp", .lo = 0, .hi = 3,
 *                             .n_params = n, .n_state = optim_state_floats(OPTIM_ADAMW, n),
 *                             .optim_kind = OPTIM_ADAMW, .optim_t = o.t, .epoch = 2, … };
 *     Diag d = {};
 *     r = checkpoint_write("/var/lib/ravnest/mlp", "stage-0", &info, params, o.state, &d);
 *     if (r < 0)
 *             return log_error_errno(r, "%s", d.text);
 *
 *     // on restart: the header first, to check the sizes, then everything
 *     r = checkpoint_read_info("/var/lib/ravnest/mlp/stage-0", &info, &d);
 *     r = checkpoint_read("/var/lib/ravnest/mlp/stage-0", &info, params, n, o.state, n_state, &d);
 *
 * Writing goes to <dir>/<name>.tmp-XXXXXX, which is written, fsynced and
 * renamed over <dir>/<name>, and then the directory is fsynced: a process
 * killed at any moment leaves the previous checkpoint or the new one (a stray
 * temporary at worst, which the next write removes). One writer per
 * <dir>/<name> at a time.
 *
 * The file (version 1), every integer and float in the writer's byte order,
 * which is the reader's (little-endian on x86-64; a file from the other byte
 * order is refused):
 *
 *     0    8  magic "RVNCKPT1"
 *     8    4  version, 1
 *     12   4  byte-order mark 0x01020304
 *     16   4  header size, 256
 *     20   4  optim_kind (an OptimKind)
 *     24  64  job name, NUL-terminated and NUL-padded
 *     88   8  lo, hi: layers [lo, hi), int32 each
 *     96  72  n_params, n_state, optim_t, epoch, step_in_epoch, samples,
 *             updates, step, written_usec: uint64 each
 *     168 32  the model's digest: BLAKE2b-256 of the layers' description
 *             (checkpoint_model_digest()); zero in files written before
 *             checkpoints recorded it
 *     200  4  batch: samples per step of step_in_epoch (0: not recorded)
 *     204 20  zero
 *     224 32  BLAKE2b-256 of bytes 0..223, so the header alone can be trusted
 *     256     params: n_params floats
 *             optimizer state: n_state floats
 *     end-32  32  BLAKE2b-256 (libsodium crypto_generichash) of everything
 *                 before it
 *
 * Files are hostile: every field is checked, and the size the header implies
 * must be the file's size, before anything is allocated or read. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "nn/layer.h"
#include "util/diag.h"

#define CHECKPOINT_MAGIC "RVNCKPT1"
#define CHECKPOINT_VERSION 1u
#define CHECKPOINT_HEADER_SIZE 256u
#define CHECKPOINT_HASH_SIZE 32u
#define CHECKPOINT_MODEL_SIZE 32u
/* Refuse files whose params and state together exceed 2^34 bytes (16 GiB). */
#define CHECKPOINT_MAX_FLOATS ((uint64_t)1 << 32)

typedef struct CheckpointInfo {
        char job[64];         /* NUL-terminated */
        int32_t lo, hi;       /* the stage's layers [lo, hi); 0 <= lo <= hi */
        uint64_t n_params;    /* floats of parameters */
        uint64_t n_state;     /* floats of optimizer state */
        uint32_t optim_kind;  /* an OptimKind, below _OPTIM_KIND_MAX */
        uint64_t optim_t;     /* the optimizer's step counter */
        uint64_t epoch, step_in_epoch, samples, updates, step;
        uint64_t written_usec; /* CLOCK_REALTIME when written; checkpoint_write sets it */
        uint8_t model[CHECKPOINT_MODEL_SIZE]; /* checkpoint_model_digest() of the layers; zero: not recorded */
        uint32_t batch;       /* samples per step of step_in_epoch; 0: not recorded */
} CheckpointInfo;

/* The digest of a stage's n layers, as layer_init() filled them in: each
 * one's kind, settings, input and output shape. Two models whose layers
 * [lo, hi) differ in any of these (relu for gelu, another width, another
 * number of heads) give different digests, even where their parameter
 * counts agree. */
void checkpoint_model_digest(const Layer *layers, int n, uint8_t out[CHECKPOINT_MODEL_SIZE]);

/* 0 when info was written for these n layers, or before checkpoints
 * recorded their model (a digest of zeros); -EINVAL, with d naming path,
 * when it holds the layers of another model. */
int checkpoint_model_check(const CheckpointInfo *info, const Layer *layers, int n, const char *path, Diag *d);

/* Write info, params (info->n_params floats) and state (info->n_state floats)
 * to <dir>/<name> atomically, as described above; stale temporaries of name
 * are removed first. info->written_usec is ignored: the file gets the time of
 * writing. On failure the temporary is unlinked and the old checkpoint is
 * untouched, except when only the final fsync of the directory fails: then
 * the new checkpoint is in place but may not survive a power loss. The file
 * is created with mode 0600. Errors: -EINVAL for a bad name or info,
 * -ERANGE for parameters or optimizer state that checkpoint_read() would
 * refuse (a value not finite, a negative second moment: training diverged),
 * in which case nothing is written and the previous file stays; -errno of
 * the failed call otherwise; d says which. */
int checkpoint_write(const char *dir, const char *name, const CheckpointInfo *info, const float *params,
                     const float *state, Diag *d);

/* Read and check the header of path (its own hash, its fields, and that the
 * file has exactly the size it implies) without reading the payload.
 * Errors: -errno from open/read, -EBADMSG for anything wrong with the file
 * (d names the file and what is wrong). ret is untouched on failure. */
int checkpoint_read_info(const char *path, CheckpointInfo *ret, Diag *d);

/* Read path into params and state, which hold n_params and n_state floats:
 * these must be what the file holds (-EINVAL otherwise, d says which
 * differs). The whole file is verified against its hash before params or
 * state is written, so on -EBADMSG (checksum mismatch, short or long file,
 * bad magic, version, byte order or sizes) they are untouched, as is
 * ret_info (may be NULL). The verified bytes are then read a second time
 * (from the page cache, without a second buffer of the payload's size) and
 * hashed again: only a file rewritten in place meanwhile, which
 * checkpoint_write never does, fails there, with -EBADMSG and the outputs
 * overwritten. */
int checkpoint_read(const char *path, CheckpointInfo *ret_info, float *params, size_t n_params, float *state,
                    size_t n_state, Diag *d);

/* Remove <dir>/<name>.tmp-XXXXXX files that a killed writer left behind.
 * Returns how many were removed, or -errno if dir cannot be read. */
int checkpoint_clean_stale(const char *dir, const char *name);

/* Tests only: when not NULL, called at each point of checkpoint_write, so a
 * test can kill the writer there. NULL in the daemon. */
typedef enum CheckpointPoint {
        CHECKPOINT_POINT_CREATED,    /* the temporary exists, empty */
        CHECKPOINT_POINT_CHUNK,      /* after each chunk written: header, 64 KiB of payload, trailer */
        CHECKPOINT_POINT_WRITTEN,    /* all written, before the fsync */
        CHECKPOINT_POINT_SYNCED,     /* the temporary fsynced and closed */
        CHECKPOINT_POINT_RENAMED,    /* renamed over <dir>/<name> */
        CHECKPOINT_POINT_DIR_SYNCED, /* the directory fsynced: done */
} CheckpointPoint;
extern void (*checkpoint_test_hook)(CheckpointPoint point);
