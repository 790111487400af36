/* Checkpoints: a round trip is bit-identical; every flipped byte, truncation
 * and hostile header is refused with the outputs untouched; and a writer
 * killed at any moment (at every point of checkpoint_write, and at random
 * times) leaves the old or the new version, whole; retired layer ranges
 * are never found again; a checkpoint of another model's layers is refused
 * even where its sizes fit. */
#include <criterion/criterion.h>
#include <math.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nn/optim.h"
#include "run/checkpoint.h"
#include "run/stage-checkpoint.h"
#include "nn/stage.h"
#include "util/rng.h"

static char dir[] = "/tmp/ravnest-test-checkpoint-XXXXXX";
static char path[256]; /* <dir>/ckpt */

static void setup(void) {
        cr_assert_not_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/ckpt", dir);
}

static void teardown(void) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

TestSuite(checkpoint, .init = setup, .fini = teardown);

/* ---- version v: everything derived from v, so a mix of two is visible ---- */

/* Every bit pattern, NaNs included, must come back as it went. */
static void fill(float *x, size_t n, uint64_t v, uint32_t salt) {
        for (size_t i = 0; i < n; i++) {
                uint32_t b = (uint32_t)(v * 2654435761u) ^ (uint32_t)(i * 40503u) ^ salt;
                b &= 0x3fffffffu; /* every pattern of a finite value below 2, not negative (AdamW's v) */
                memcpy(&x[i], &b, sizeof b);
        }
}

static CheckpointInfo make_info(uint64_t v, size_t n_params, size_t n_state) {
        CheckpointInfo info = {
                .job = "fashion-mnist-mlp",
                .lo = 1,
                .hi = 4,
                .n_params = n_params,
                .n_state = n_state,
                .optim_kind = OPTIM_ADAMW,
                .optim_t = 7 * v,
                .epoch = v / 10,
                .step_in_epoch = v % 10,
                .samples = 64 * v,
                .updates = 3 * v,
                .step = v,
        };
        return info;
}

typedef struct Buffers {
        size_t n_params, n_state;
        float *params, *state;      /* what version `filled` holds */
        float *got_p, *got_s;       /* read into these */
        uint64_t filled;
} Buffers;

static void buffers_fill(Buffers *b, uint64_t v) {
        if (b->filled == v)
                return;
        fill(b->params, b->n_params, v, 0x5eed);
        fill(b->state, b->n_state, v, 0xada1);
        b->filled = v;
}

static Buffers buffers_new(size_t n_params, size_t n_state) {
        Buffers b = { n_params, n_state, .filled = UINT64_MAX };
        b.params = malloc(n_params * sizeof(float) + 1);
        b.state = malloc(n_state * sizeof(float) + 1);
        b.got_p = malloc(n_params * sizeof(float) + 1);
        b.got_s = malloc(n_state * sizeof(float) + 1);
        cr_assert(b.params && b.state && b.got_p && b.got_s);
        return b;
}

static void buffers_free(Buffers *b) {
        free(b->params);
        free(b->state);
        free(b->got_p);
        free(b->got_s);
}

static int write_version(Buffers *b, uint64_t v, Diag *d) {
        CheckpointInfo info = make_info(v, b->n_params, b->n_state);
        buffers_fill(b, v);
        return checkpoint_write(dir, "ckpt", &info, b->params, b->state, d);
}

/* Load the checkpoint; it must be one whole version, which *ret_v says. */
static void expect_whole_version(Buffers *b, uint64_t *ret_v) {
        CheckpointInfo info;
        Diag d = {};
        int r = checkpoint_read(path, &info, b->got_p, b->n_params, b->got_s, b->n_state, &d);
        cr_assert_eq(r, 0, "load: %d %s", r, d.text);
        uint64_t v = info.step;
        CheckpointInfo want = make_info(v, b->n_params, b->n_state);
        want.written_usec = info.written_usec;
        cr_assert(memcmp(&info, &want, sizeof info) == 0, "info of version %ju is not whole", (uintmax_t)v);
        buffers_fill(b, v);
        cr_assert(memcmp(b->got_p, b->params, b->n_params * sizeof(float)) == 0, "params of version %ju torn",
                  (uintmax_t)v);
        cr_assert(memcmp(b->got_s, b->state, b->n_state * sizeof(float)) == 0, "state of version %ju torn",
                  (uintmax_t)v);
        *ret_v = v;
}

/* Entries of dir besides the checkpoint: temporaries left behind. */
static int count_stale(void) {
        DIR *dd = opendir(dir);
        int n = 0;
        cr_assert_not_null(dd);
        for (struct dirent *de; (de = readdir(dd));)
                n += strncmp(de->d_name, "ckpt.tmp-", 9) == 0;
        closedir(dd);
        return n;
}

static uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- round trip ------------------------------------------------------------ */

Test(checkpoint, round_trip_is_bit_identical) {
        /* sizes that are no multiple of the chunks, and the empty checkpoint */
        const size_t sizes[][2] = { { 100003, 200006 }, { 1, 0 }, { 0, 0 }, { 16384, 32768 } };
        for (size_t k = 0; k < ELEMENTSOF(sizes); k++) {
                Buffers b = buffers_new(sizes[k][0], sizes[k][1]);
                CheckpointInfo info = make_info(42 + k, b.n_params, b.n_state), got, got_h;
                memset(info.job, 'j', sizeof info.job - 1); /* the longest name: 63 chars */
                Diag d = {};
                fill(b.params, b.n_params, 42 + k, 1);
                fill(b.state, b.n_state, 42 + k, 2);

                uint64_t before = now_usec();
                cr_assert_eq(checkpoint_write(dir, "ckpt", &info, b.params, b.state, &d), 0, "%s", d.text);
                uint64_t after = now_usec();

                cr_assert_eq(checkpoint_read_info(path, &got_h, &d), 0, "%s", d.text);
                cr_assert_eq(checkpoint_read(path, &got, b.got_p, b.n_params, b.got_s, b.n_state, &d), 0, "%s",
                             d.text);
                cr_assert(memcmp(&got, &got_h, sizeof got) == 0);
                cr_assert(got.written_usec >= before && got.written_usec <= after);
                info.written_usec = got.written_usec;
                cr_assert(memcmp(&got, &info, sizeof got) == 0, "info differs");
                cr_assert(memcmp(b.got_p, b.params, b.n_params * sizeof(float)) == 0);
                cr_assert(memcmp(b.got_s, b.state, b.n_state * sizeof(float)) == 0);

                struct stat st;
                cr_assert_eq(stat(path, &st), 0);
                cr_assert_eq((uint64_t)st.st_size, CHECKPOINT_HEADER_SIZE + 4 * (b.n_params + b.n_state) +
                                                           CHECKPOINT_HASH_SIZE);
                cr_assert_eq(count_stale(), 0);
                buffers_free(&b);
        }
}

/* A file whose hash is right but whose values a peer could not send: a
 * NaN or an infinity anywhere, or an AdamW second moment below zero (the
 * first moment may be negative). Refused before the outputs are touched. */
static uint8_t *slurp(const char *p, size_t *ret_len);
static void spit(const char *p, const void *buf, size_t len);

/* A value the reader refuses: the writer does not write it (a diverged
 * stage must not replace its last good checkpoint: -ERANGE, the old file
 * stays), and a file that holds one anyway (forged, its checksum made to
 * match) is refused by the reader, the outputs untouched. */
Test(checkpoint, values_that_are_not_finite_are_refused) {
        const struct { int part; size_t at; float v; bool ok; } cases[] = {
                { 0, 0, NAN, false },         { 0, 99999, INFINITY, false }, { 1, 5, -INFINITY, false },
                { 1, 100003 + 7, -1.0f, false }, /* the second moment */
                { 1, 7, -1.0f, true },        /* the first */
                { 0, 3, -1e30f, true },
        };
        cr_assert_eq(sodium_init() >= 0, 1);
        for (size_t k = 0; k < ELEMENTSOF(cases); k++) {
                Buffers b = buffers_new(100003, 200006);
                CheckpointInfo info = make_info(7, b.n_params, b.n_state), got;
                Diag d = {};
                uint64_t v;
                cr_assert_eq(write_version(&b, 7, &d), 0, "%s", d.text);
                float *bad = cases[k].part ? b.state : b.params, keep = bad[cases[k].at];
                bad[cases[k].at] = cases[k].v;
                info.step = 8;
                int r = checkpoint_write(dir, "ckpt", &info, b.params, b.state, &d);
                if (cases[k].ok) {
                        cr_assert_eq(r, 0, "case %zu: %s", k, d.text);
                        memset(b.got_p, 0x11, b.n_params * sizeof(float));
                        cr_assert_eq(checkpoint_read(path, &got, b.got_p, b.n_params, b.got_s, b.n_state, &d), 0,
                                     "case %zu: %s", k, d.text);
                        buffers_free(&b);
                        continue;
                }
                cr_assert_eq(r, -ERANGE, "case %zu written", k);
                cr_assert(strstr(d.text, cases[k].part ? "optimizer state" : "not finite"), "case %zu: %s", k,
                          d.text);
                if (!cases[k].part)
                        cr_assert(strstr(d.text, cases[k].at ? "parameter 99999 of" : "parameter 0 of"), "%s",
                                  d.text);
                cr_assert_eq(count_stale(), 0, "case %zu: a temporary left", k);
                bad[cases[k].at] = keep;
                expect_whole_version(&b, &v);
                cr_assert_eq(v, 7, "case %zu: the last good checkpoint stays", k);

                /* the reader: the same value in a file whose checksum matches */
                size_t len;
                uint8_t *file = slurp(path, &len);
                size_t off = CHECKPOINT_HEADER_SIZE + ((cases[k].part ? b.n_params : 0) + cases[k].at) * sizeof(float);
                memcpy(file + off, &cases[k].v, sizeof(float));
                crypto_generichash(file + len - CHECKPOINT_HASH_SIZE, CHECKPOINT_HASH_SIZE, file,
                                   len - CHECKPOINT_HASH_SIZE, NULL, 0);
                spit(path, file, len);
                free(file);
                memset(b.got_p, 0x11, b.n_params * sizeof(float));
                r = checkpoint_read(path, &got, b.got_p, b.n_params, b.got_s, b.n_state, &d);
                cr_assert_eq(r, -EBADMSG, "case %zu taken", k);
                cr_assert(strstr(d.text, "not finite"), "case %zu: %s", k, d.text);
                cr_assert_eq(b.got_p[0], b.got_p[b.n_params - 1], "case %zu: the outputs were touched", k);
                buffers_free(&b);
        }
}

Test(checkpoint, refuses_bad_arguments_and_keeps_the_old_file) {
        Buffers b = buffers_new(1000, 2000);
        Diag d = {};
        uint64_t v;
        cr_assert_eq(write_version(&b, 1, &d), 0, "%s", d.text);

        CheckpointInfo info = make_info(2, b.n_params, b.n_state);
        const char *bad_names[] = { "", ".", "..", "a/b" };
        for (size_t i = 0; i < ELEMENTSOF(bad_names); i++)
                cr_expect_eq(checkpoint_write(dir, bad_names[i], &info, b.params, b.state, &d), -EINVAL,
                             "name \"%s\"", bad_names[i]);
        cr_expect_eq(checkpoint_write(dir, NULL, &info, b.params, b.state, &d), -EINVAL);

        CheckpointInfo bad = info;
        memset(bad.job, 'x', sizeof bad.job);
        cr_expect_eq(checkpoint_write(dir, "ckpt", &bad, b.params, b.state, &d), -EINVAL);
        cr_expect(strstr(d.text, "NUL"), "%s", d.text);
        bad = info;
        bad.optim_kind = 77;
        cr_expect_eq(checkpoint_write(dir, "ckpt", &bad, b.params, b.state, &d), -EINVAL);
        cr_expect(strstr(d.text, "optimizer kind"), "%s", d.text);
        bad = info;
        bad.lo = 5;
        cr_expect_eq(checkpoint_write(dir, "ckpt", &bad, b.params, b.state, &d), -EINVAL);
        bad = info;
        bad.n_params = CHECKPOINT_MAX_FLOATS;
        cr_expect_eq(checkpoint_write(dir, "ckpt", &bad, b.params, b.state, &d), -EINVAL);
        cr_expect(strstr(d.text, "more than"), "%s", d.text);
        cr_expect_eq(checkpoint_write(dir, "ckpt", &info, NULL, b.state, &d), -EINVAL);

        char missing[300];
        snprintf(missing, sizeof missing, "%s/no/such/dir", dir);
        cr_expect_eq(checkpoint_write(missing, "ckpt", &info, b.params, b.state, &d), -ENOENT);
        cr_expect(strstr(d.text, missing), "%s", d.text);

        expect_whole_version(&b, &v);
        cr_expect_eq(v, 1);
        cr_expect_eq(count_stale(), 0);
        buffers_free(&b);
}

/* ---- corrupt and hostile files --------------------------------------------- */

static uint8_t *slurp(const char *p, size_t *ret_len) {
        struct stat st;
        int fd = open(p, O_RDONLY);
        cr_assert(fd >= 0);
        cr_assert_eq(fstat(fd, &st), 0);
        uint8_t *buf = malloc((size_t)st.st_size + 16);
        cr_assert_not_null(buf);
        cr_assert_eq(read(fd, buf, (size_t)st.st_size), st.st_size);
        close(fd);
        *ret_len = (size_t)st.st_size;
        return buf;
}

/* A new file each time: ext4 flushes a file truncated and rewritten in
 * place when it is closed (auto_da_alloc), which would make this slow. */
static void spit(const char *p, const void *buf, size_t len) {
        (void)unlink(p);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, buf, len), (ssize_t)len);
        close(fd);
}

/* Reading the file must fail with err, naming it, and leave every output
 * as it was. */
static void expect_refused(const char *p, Buffers *b, int err, const char *phrase, const char *what) {
        CheckpointInfo info, sentinel;
        Diag d = {};
        memset(&sentinel, 0xa5, sizeof sentinel);
        info = sentinel;
        memset(b->got_p, 0xa5, b->n_params * sizeof(float));
        memset(b->got_s, 0xa5, b->n_state * sizeof(float));

        int r = checkpoint_read(p, &info, b->got_p, b->n_params, b->got_s, b->n_state, &d);
        cr_assert_eq(r, err, "%s: got %d (%s), want %d", what, r, d.text, err);
        cr_assert(strstr(d.text, p), "%s: \"%s\" does not name the file", what, d.text);
        if (phrase)
                cr_assert(strstr(d.text, phrase), "%s: \"%s\" lacks \"%s\"", what, d.text, phrase);
        cr_assert(memcmp(&info, &sentinel, sizeof info) == 0, "%s: info touched", what);
        for (size_t i = 0; i < b->n_params * sizeof(float); i++)
                cr_assert_eq(((uint8_t *)b->got_p)[i], 0xa5, "%s: params touched", what);
        for (size_t i = 0; i < b->n_state * sizeof(float); i++)
                cr_assert_eq(((uint8_t *)b->got_s)[i], 0xa5, "%s: state touched", what);
}

Test(checkpoint, every_flipped_byte_and_truncation_is_refused) {
        Buffers b = buffers_new(300, 600);
        Diag d = {};
        char bad[300], what[64];
        size_t len;
        snprintf(bad, sizeof bad, "%s/bad", dir);
        cr_assert_eq(write_version(&b, 5, &d), 0, "%s", d.text);
        uint8_t *good = slurp(path, &len), *buf = malloc(len + 16);
        cr_assert_eq(len, 256 + 4 * 900 + 32);

        for (size_t off = 0; off < len; off++)
                for (int m = 0; m < 2; m++) {
                        memcpy(buf, good, len);
                        buf[off] ^= m ? 0xff : 0x01;
                        spit(bad, buf, len);
                        snprintf(what, sizeof what, "byte %zu ^ %#x", off, m ? 0xff : 0x01);
                        expect_refused(bad, &b, -EBADMSG, NULL, what);
                        CheckpointInfo info;
                        int r = checkpoint_read_info(bad, &info, &d);
                        /* the header has its own checksum; the payload's is checked by a full read */
                        cr_assert_eq(r, off < CHECKPOINT_HEADER_SIZE ? -EBADMSG : 0, "%s: read_info %d", what, r);
                }
        for (size_t cut = 0; cut < len; cut++) {
                spit(bad, good, cut);
                snprintf(what, sizeof what, "cut at %zu", cut);
                expect_refused(bad, &b, -EBADMSG, cut < CHECKPOINT_HEADER_SIZE ? "truncated" : NULL, what);
        }
        memcpy(buf, good, len);
        memset(buf + len, 0, 16);
        spit(bad, buf, len + 1);
        expect_refused(bad, &b, -EBADMSG, "trailing bytes", "one byte more");
        spit(bad, buf, len + 4);
        expect_refused(bad, &b, -EBADMSG, "trailing bytes", "a float more");

        /* the intact file still loads */
        uint64_t v;
        expect_whole_version(&b, &v);
        cr_assert_eq(v, 5);
        free(good);
        free(buf);
        buffers_free(&b);
}

Test(checkpoint, wrong_sizes_are_einval) {
        Buffers big = buffers_new(301, 601), b = { 300, 600, big.params, big.state, big.got_p, big.got_s, UINT64_MAX };
        Diag d = {};
        cr_assert_eq(write_version(&b, 9, &d), 0, "%s", d.text);

        b.n_params = 299;
        expect_refused(path, &b, -EINVAL, "holds 300 parameters, expected 299", "fewer params");
        b.n_params = 301;
        expect_refused(path, &b, -EINVAL, "holds 300 parameters, expected 301", "more params");
        b.n_params = 300;
        b.n_state = 601;
        expect_refused(path, &b, -EINVAL, "holds 600 floats of optimizer state, expected 601", "more state");
        b.n_state = 0;
        expect_refused(path, &b, -EINVAL, "optimizer state", "no state");
        buffers_free(&big);
}

/* A header a hostile writer made: fields changed, its checksum made to match,
 * so only the checks of the fields themselves stand in the way. */
static void hostile(const uint8_t *good, size_t len, Buffers *b, size_t off, const void *val, size_t n,
                    size_t file_len, const char *phrase) {
        char bad[300], what[64];
        uint8_t *buf = calloc(1, MAX(len, file_len));
        cr_assert_not_null(buf);
        memcpy(buf, good, MIN(len, file_len));
        memcpy(buf + off, val, n);
        crypto_generichash(buf + 224, 32, buf, 224, NULL, 0);
        snprintf(bad, sizeof bad, "%s/hostile", dir);
        spit(bad, buf, file_len);
        snprintf(what, sizeof what, "%zu bytes at %zu", n, off);
        expect_refused(bad, b, -EBADMSG, phrase, what);
        CheckpointInfo info;
        Diag d = {};
        cr_assert_eq(checkpoint_read_info(bad, &info, &d), -EBADMSG, "%s", what);
        free(buf);
}

Test(checkpoint, hostile_headers_are_refused_before_anything_is_allocated) {
        Buffers b = buffers_new(300, 600);
        Diag d = {};
        size_t len;
        cr_assert_eq(write_version(&b, 3, &d), 0, "%s", d.text);
        uint8_t *good = slurp(path, &len);
        cr_assert_eq(sodium_init() >= 0, 1);

        uint64_t huge = (uint64_t)1 << 62, half = (uint64_t)1 << 63, cap = CHECKPOINT_MAX_FLOATS;
        uint64_t both[2] = { half, half }, over[2] = { cap, 1 };
        hostile(good, len, &b, 96, &huge, 8, len, "more than");
        hostile(good, len, &b, 96, both, 16, len, "more than"); /* the sum overflows */
        hostile(good, len, &b, 96, over, 16, len, "more than");
        uint64_t more = 301;
        hostile(good, len, &b, 96, &more, 8, len, "truncated");
        hostile(good, len, &b, 104, &more, 8, len, "trailing bytes"); /* state 301 < 600 */
        uint32_t kind = 99, one = 1, nine = 9;
        hostile(good, len, &b, 20, &kind, 4, len, "optimizer kind");
        int32_t range[2] = { 5, 2 }, neg = -1;
        hostile(good, len, &b, 88, range, 8, len, "layer range");
        hostile(good, len, &b, 88, &neg, 4, len, "layer range");
        char job[64];
        memset(job, 'j', sizeof job);
        hostile(good, len, &b, 24, job, sizeof job, len, "NUL");
        hostile(good, len, &b, 204, &one, 1, len, "reserved");
        hostile(good, len, &b, 8, &nine, 4, len, "version 9");
        uint32_t swapped = 0x04030201, header = 512;
        hostile(good, len, &b, 12, &swapped, 4, len, "other byte order");
        hostile(good, len, &b, 16, &header, 4, len, "header size");
        hostile(good, len, &b, 0, "RVNCKPT2", 8, len, "bad magic");

        /* not a checkpoint at all, a directory, nothing */
        char other[300];
        snprintf(other, sizeof other, "%s/text", dir);
        spit(other, "state_directory = \"/tmp\";\n", 26);
        expect_refused(other, &b, -EBADMSG, "truncated", "a short text file");
        expect_refused(dir, &b, -EBADMSG, "not a regular file", "a directory");
        snprintf(other, sizeof other, "%s/missing", dir);
        expect_refused(other, &b, -ENOENT, NULL, "no file");
        free(good);
        buffers_free(&b);
}

/* ---- killed while writing ------------------------------------------------- */

static int kill_at, points_seen, point_pipe = -1;

/* In the child: report the point, then die there. */
static void kill_hook(CheckpointPoint point) {
        if (points_seen++ == kill_at) {
                uint8_t p = (uint8_t)point;
                if (write(point_pipe, &p, 1) != 1)
                        _exit(3);
                raise(SIGKILL);
        }
}

static pid_t fork_child(void) {
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0)
                prctl(PR_SET_PDEATHSIG, SIGKILL);
        return pid;
}

/* Version k is on disk; a child writes k + 1 and is killed at point p of the
 * write, for every p: what is left is k before the rename and k + 1 from
 * it on, and never anything else. */
Test(checkpoint, killed_at_every_point_leaves_old_or_new, .timeout = 60) {
        /* 6 MiB: 96 chunks of 64 KiB, so ~100 points */
        Buffers b = buffers_new((size_t)1 << 19, (size_t)1 << 20);
        Diag d = {};
        uint64_t v = 1, got;
        int fds[2], p, renamed_at = -1, old = 0, new = 0;
        cr_assert_eq(write_version(&b, v, &d), 0, "%s", d.text);
        cr_assert_eq(pipe(fds), 0);

        for (p = 0;; p++) {
                pid_t pid = fork_child();
                if (pid == 0) {
                        close(fds[0]);
                        point_pipe = fds[1];
                        kill_at = p;
                        checkpoint_test_hook = kill_hook;
                        _exit(write_version(&b, v + 1, NULL) < 0 ? 1 : 0);
                }
                int status;
                cr_assert_eq(waitpid(pid, &status, 0), pid);
                if (WIFEXITED(status)) { /* p is past the last point: the write completed */
                        cr_assert_eq(WEXITSTATUS(status), 0, "the writer failed");
                        break;
                }
                cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
                uint8_t point;
                cr_assert_eq(read(fds[0], &point, 1), 1);

                expect_whole_version(&b, &got);
                bool after_rename = point == CHECKPOINT_POINT_RENAMED || point == CHECKPOINT_POINT_DIR_SYNCED;
                cr_assert_eq(got, after_rename ? v + 1 : v, "killed at point %d (kind %u): version %ju, v = %ju", p,
                             point, (uintmax_t)got, (uintmax_t)v);
                if (point == CHECKPOINT_POINT_RENAMED)
                        renamed_at = p;
                if (got == v) {
                        old++;
                } else {
                        new++;
                        v = got;
                }
                /* a writer killed before its rename leaves its temporary */
                cr_assert_eq(count_stale(), after_rename ? 0 : 1, "killed at point %d", p);
        }
        close(fds[0]);
        close(fds[1]);
        expect_whole_version(&b, &got);
        cr_assert_eq(got, v + 1);
        cr_assert_eq(count_stale(), 0);
        cr_assert_geq(p, 100, "only %d points", p);
        cr_assert_eq(renamed_at, p - 2);
        cr_log_info("killed at each of %d points: %d left the old version, %d the new", p, old, new);
        buffers_free(&b);
}

/* A child writes versions back to back; it is killed after a random delay
 * and, every time, the checkpoint is one whole version, no older than
 * before. */
/* (its 2000 kills at most take over a minute under AddressSanitizer on a
 * loaded machine) */
Test(checkpoint, killed_at_random_moments_leaves_a_whole_version, .timeout = 300) {
        /* 192 KiB: written and fsynced in about the longest delay */
        Buffers b = buffers_new((size_t)1 << 14, (size_t)1 << 15);
        Diag d = {};
        Rng rng;
        uint64_t v = 1, got;
        int advanced = 0, torn = 0;
        rng_seed(&rng, 20240601, RNG_STREAM_TEST);
        cr_assert_eq(write_version(&b, v, &d), 0, "%s", d.text);

        /* 200 kills, and more while none has yet come after a new version or
         * left a temporary (a loaded machine may be slower than the delays) */
        int kills = 0;
        for (; kills < 200 || (kills < 2000 && (advanced == 0 || torn == 0)); kills++) {
                pid_t pid = fork_child();
                if (pid == 0) {
                        for (uint64_t w = v + 1;; w++)
                                if (write_version(&b, w, NULL) < 0)
                                        _exit(1);
                }
                uint32_t us = rng_below(&rng, 3001);
                nanosleep(&(struct timespec){ 0, (long)us * 1000 }, NULL);
                cr_assert_eq(kill(pid, SIGKILL), 0);
                int status;
                cr_assert_eq(waitpid(pid, &status, 0), pid);
                cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the writer failed");

                expect_whole_version(&b, &got);
                cr_assert_geq(got, v, "went back from version %ju to %ju", (uintmax_t)v, (uintmax_t)got);
                advanced += got > v;
                torn += count_stale() > 0;
                v = got;
        }
        int left = count_stale();
        cr_assert_eq(checkpoint_clean_stale(dir, "ckpt"), left);
        cr_assert_eq(count_stale(), 0);
        cr_log_info("%d kills: %d after new versions, %d left a temporary behind; at version %ju", kills, advanced,
                    torn, (uintmax_t)v);
        cr_expect_gt(advanced, 0);
        cr_expect_gt(torn, 0);
        buffers_free(&b);
}

Test(checkpoint, clean_stale_removes_only_temporaries) {
        const char *names[] = { "ckpt.tmp-a1B2c3", "ckpt.tmp-zzzzzz", "ckpt.tmp-short", "ckpt.tmp-toolong7",
                                "other.tmp-a1B2c3", "ckpt" };
        char p[300];
        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                snprintf(p, sizeof p, "%s/%s", dir, names[i]);
                spit(p, "x", 1);
        }
        cr_assert_eq(checkpoint_clean_stale(dir, "ckpt"), 2);
        cr_assert_eq(count_stale(), 2); /* the short and the long one stay */
        snprintf(p, sizeof p, "%s/other.tmp-a1B2c3", dir);
        cr_assert_eq(access(p, F_OK), 0);
        cr_assert_eq(checkpoint_clean_stale(dir, "a/b"), -EINVAL);
        cr_assert_eq(checkpoint_clean_stale("/nonexistent-ravnest", "ckpt"), -ENOENT);
}

/* Under membership a node retires the checkpoints of layers it no longer
 * holds: renamed to "<name>.retired" with their ".outer" file, never found
 * again; the range it keeps, other jobs' files and other names stay. */
static void touch_at(const char *name, time_t when) {
        char p[300];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        spit(p, "x", 1);
        struct timespec t[2] = { { .tv_sec = when }, { .tv_sec = when } };
        cr_assert_eq(utimensat(AT_FDCWD, p, t, 0), 0);
}

static bool exists(const char *name) {
        char p[300];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        return access(p, F_OK) == 0;
}

Test(checkpoint, retired_ranges_are_never_loaded) {
        int lo = -1, hi = -1;
        touch_at("job.layers-3-6.ckpt", 1000);
        touch_at("job.layers-0-3.ckpt", 2000); /* the newest: another node's layers now */
        touch_at("job.layers-0-3.ckpt.outer", 2000);
        touch_at("other.layers-0-3.ckpt", 3000);
        touch_at("job.layers-0-3.ckpt.tmp-a1B2c3", 4000);
        cr_assert_eq(stage_checkpoint_newest(dir, "job", &lo, &hi), 0);
        cr_assert(lo == 0 && hi == 3, "%d-%d", lo, hi);

        cr_assert_eq(stage_checkpoint_retire(dir, "job", 3, 6), 1);
        cr_assert(!exists("job.layers-0-3.ckpt") && !exists("job.layers-0-3.ckpt.outer"));
        cr_assert(exists("job.layers-0-3.ckpt.retired") && exists("job.layers-0-3.ckpt.outer.retired"));
        cr_assert(exists("job.layers-3-6.ckpt") && exists("other.layers-0-3.ckpt") &&
                  exists("job.layers-0-3.ckpt.tmp-a1B2c3"));
        cr_assert_eq(stage_checkpoint_newest(dir, "job", &lo, &hi), 0);
        cr_assert(lo == 3 && hi == 6, "a retired range was found: %d-%d", lo, hi);
        cr_assert_eq(stage_checkpoint_retire(dir, "job", 3, 6), 0, "retired twice");

        cr_assert_eq(stage_checkpoint_retire(dir, "job", -1, -1), 1); /* a spare: every one */
        cr_assert(exists("job.layers-3-6.ckpt.retired"));
        cr_assert_eq(stage_checkpoint_newest(dir, "job", &lo, &hi), -ENOENT);
        cr_assert_eq(stage_checkpoint_newest(dir, "other", &lo, &hi), 0);
        cr_assert_lt(stage_checkpoint_retire("/nonexistent-ravnest", "job", -1, -1), 0);
}

/* A model whose layers 1-2 are (linear 6, act, linear 6, act) on 5 inputs, and a
 * GPT whose one block has `heads` heads: changing the activation or the
 * number of heads keeps every size, and must not resume. */
static ModelSpec mlp(LayerKind act) {
        ModelSpec m = { .input = { 5, 1, 1 }, .n_classes = 3, .n_layers = 5 };
        m.layers[0] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 6 };
        m.layers[1] = (LayerSpec){ .kind = act };
        m.layers[2] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 6 };
        m.layers[3] = (LayerSpec){ .kind = act };
        m.layers[4] = (LayerSpec){ .kind = LAYER_LINEAR, .out = 3 };
        return m;
}

static ModelSpec gpt(int heads) {
        ModelSpec m = { .input = { 4, 1, 1 }, .n_classes = 7, .lm = true, .n_layers = 3 };
        m.layers[0] = (LayerSpec){ .kind = LAYER_EMBED, .vocab = 7, .out = 8 };
        m.layers[1] = (LayerSpec){ .kind = LAYER_BLOCK, .heads = heads };
        m.layers[2] = (LayerSpec){ .kind = LAYER_LM_HEAD, .out = 7 };
        return m;
}

/* Save layers [lo, hi) of `saved`, then load them into a fresh stage of
 * `loaded`: the result, and whether the loader's parameters stayed its own. */
static int save_then_load(const ModelSpec *saved, const ModelSpec *loaded, int lo, int hi, bool *untouched) {
        Stage *a = NULL, *b = NULL;
        Optim oa, ob;
        OptimSpec os;
        Diag d = {};
        optim_spec_defaults(&os, OPTIM_ADAMW);
        cr_assert_eq(stage_new(saved, lo, hi, 1, &a, &d), 0, "%s", d.text);
        cr_assert_eq(stage_new(loaded, lo, hi, 2, &b, &d), 0, "%s", d.text);
        cr_assert_eq(a->n_params, b->n_params, "the sizes agree: only the digest can tell");
        size_t n_state = optim_state_floats(OPTIM_ADAMW, a->n_params);
        float *sa = calloc(n_state, sizeof(float)), *sb = calloc(n_state, sizeof(float));
        float *before = malloc(b->n_params * sizeof(float));
        cr_assert(sa && sb && before);
        cr_assert_eq(optim_init(&oa, &os, a->n_params, sa), 0);
        cr_assert_eq(optim_init(&ob, &os, b->n_params, sb), 0);
        memcpy(before, b->params, b->n_params * sizeof(float));

        CheckpointInfo at = { .step = 5 }, got;
        cr_assert_eq(stage_checkpoint_save(dir, "job", a, &oa, &at, false), 0);
        int r = stage_checkpoint_load(dir, "job", b, &ob, &got);
        *untouched = memcmp(before, b->params, b->n_params * sizeof(float)) == 0;
        if (r == 0)
                cr_assert_eq(memcmp(a->params, b->params, a->n_params * sizeof(float)), 0);
        free(sa);
        free(sb);
        free(before);
        stage_free(a);
        stage_free(b);
        return r;
}

Test(checkpoint, another_models_layers_are_refused) {
        ModelSpec relu = mlp(LAYER_RELU), gelu = mlp(LAYER_GELU), two = gpt(2), four = gpt(4);
        bool untouched;

        cr_assert_eq(save_then_load(&relu, &relu, 1, 4, &untouched), 0, "the same model resumes");
        cr_assert_eq(save_then_load(&relu, &gelu, 1, 4, &untouched), -EINVAL, "relu saved, gelu loaded");
        cr_assert(untouched, "a refused checkpoint left the stage's parameters as they were");
        cr_assert_eq(save_then_load(&relu, &gelu, 4, 5, &untouched), 0, "the last linear is the same in both");
        cr_assert_eq(save_then_load(&two, &two, 1, 2, &untouched), 0);
        cr_assert_eq(save_then_load(&two, &four, 1, 2, &untouched), -EINVAL, "2 heads saved, 4 loaded");
        cr_assert(untouched);
}

/* A refused checkpoint is kept aside, never written over: the next
 * checkpoint would replace what may be days of training. */
Test(checkpoint, a_refused_checkpoint_is_kept_aside) {
        ModelSpec relu = mlp(LAYER_RELU), gelu = mlp(LAYER_GELU);
        char file[300];
        struct stat st;
        bool untouched;

        cr_assert_eq(save_then_load(&relu, &gelu, 1, 4, &untouched), -EINVAL);
        snprintf(file, sizeof file, "%s/job.layers-1-4.ckpt", dir);
        cr_assert_eq(stat(file, &st), -1, "moved: nothing to write over");
        snprintf(file, sizeof file, "%s/job.layers-1-4.ckpt.refused", dir);
        cr_assert_eq(stat(file, &st), 0, "kept as .refused");
        ino_t first = st.st_ino;
        cr_assert_eq(save_then_load(&relu, &gelu, 1, 4, &untouched), -EINVAL);
        cr_assert_eq(stat(file, &st), 0);
        cr_assert_eq(st.st_ino, first, "an earlier refused file is never replaced");
        snprintf(file, sizeof file, "%s/job.layers-1-4.ckpt.refused.1", dir);
        cr_assert_eq(stat(file, &st), 0, "the second kept as .refused.1");
        int lo, hi;
        cr_assert_eq(stage_checkpoint_newest(dir, "job", &lo, &hi), -ENOENT, "a refused file is no checkpoint");
}

/* A file written before checkpoints recorded their model (zero digest) still
 * resumes; one whose digest is not the layers' does not, as export sees. */
Test(checkpoint, a_digest_of_zeros_is_a_file_from_before) {
        ModelSpec relu = mlp(LAYER_RELU), gelu = mlp(LAYER_GELU);
        Layer lr[MODEL_MAX_LAYERS], lg[MODEL_MAX_LAYERS];
        cr_assert_eq(model_spec_check(&relu, lr, NULL), 0);
        cr_assert_eq(model_spec_check(&gelu, lg, NULL), 0);
        CheckpointInfo info = { .lo = 1, .hi = 4 };
        Diag d = {};
        cr_assert_eq(checkpoint_model_check(&info, lr + 1, 3, "old", &d), 0);
        checkpoint_model_digest(lr + 1, 3, info.model);
        cr_assert_eq(checkpoint_model_check(&info, lr + 1, 3, "new", &d), 0);
        cr_assert_eq(checkpoint_model_check(&info, lg + 1, 3, "new", &d), -EINVAL);
        cr_assert(strstr(d.text, "new: written for another model: layers 1-3"), "%s", d.text);
        cr_assert_eq(checkpoint_model_check(&info, lr + 1, 2, "new", &d), -EINVAL, "fewer layers");
}

/* A checkpoint records the samples a step took; a job whose batch size
 * changed goes on from the samples done, not the step number (step 419 of
 * batch 16 taken as step 419 of batch 64 was past the epoch's end). */
Test(checkpoint, the_batch_size_goes_through_and_resuming_counts_samples) {
        Buffers b = buffers_new(300, 600);
        CheckpointInfo info = make_info(1, 300, 600), got;
        Diag d = {};
        buffers_fill(&b, 1); /* values the writer takes (not whatever malloc left) */
        info.batch = 16;
        cr_assert_eq(checkpoint_write(dir, "ckpt", &info, b.params, b.state, &d), 0, "%s", d.text);
        cr_assert_eq(checkpoint_read_info(path, &got, &d), 0, "%s", d.text);
        cr_assert_eq(got.batch, 16);
        CheckpointInfo at = { .step_in_epoch = 207, .batch = 16 };
        cr_assert_eq(stage_checkpoint_resume_step(&at, 16), 207);
        cr_assert_eq(stage_checkpoint_resume_step(&at, 7), 473); /* 3312 samples: 473 steps of 7, 1 sample again */
        cr_assert_eq(stage_checkpoint_resume_step(&at, 64), 51);
        at.batch = 0; /* a file from before: its step as it is */
        cr_assert_eq(stage_checkpoint_resume_step(&at, 64), 207);
        buffers_free(&b);
}
