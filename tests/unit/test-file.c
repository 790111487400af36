/* Opening a file a user names: anything but a regular file is refused at
 * once, in file_open_regular() and in every loader that opens through it;
 * a FIFO in a file's place used to hang the reader for ever (an alarm
 * fails the test instead of hanging it). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../lib/proc.h"
#include "conf/job.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "run/checkpoint.h"
#include "util/file.h"

static char dir[] = "/tmp/ravnest-test-file-XXXXXX";
static char fifo[300], plain[300], link_[300];

static void setup(void) {
        cr_assert(mkdtemp(dir));
        snprintf(fifo, sizeof fifo, "%s/fifo", dir);
        snprintf(plain, sizeof plain, "%s/plain", dir);
        snprintf(link_, sizeof link_, "%s/link", dir);
        cr_assert_eq(mkfifo(fifo, 0600), 0);
        test_write_file(plain, "some text, long enough for a context\n", 0600);
        cr_assert_eq(symlink(plain, link_), 0);
        alarm(20); /* a reader that blocks fails the test */
}

static void teardown(void) {
        alarm(0);
        test_remove_tree(dir);
}

TestSuite(file, .init = setup, .fini = teardown);

Test(file, only_a_regular_file_opens) {
        struct stat st;
        Diag d = {};
        int fd = file_open_regular(plain, 0, &st, &d);
        cr_assert_geq(fd, 0, "%s", d.text);
        cr_assert_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "left non-blocking");
        close(fd);
        const char *const not_files[] = { fifo, dir, "/dev/null", "/dev/zero" };
        for (size_t i = 0; i < sizeof not_files / sizeof *not_files; i++) {
                cr_assert_eq(file_open_regular(not_files[i], 0, &st, &d), -EINVAL, "%s", not_files[i]);
                cr_assert(strstr(d.text, "not a regular file"), "%s", d.text);
        }
        cr_assert_eq(file_open_regular(link_, O_NOFOLLOW, &st, &d), -ELOOP);
        cr_assert_eq(file_open_regular("/nonexistent/x", 0, &st, &d), -ENOENT);
        cr_assert(strstr(d.text, "/nonexistent/x: cannot read: "), "%s", d.text);
}

Test(file, a_fifo_is_refused_by_every_loader) {
        Diag d = {};
        Dataset *ds = NULL;
        IdxArray *a = NULL;
        CheckpointInfo info;
        Job j;
        cr_assert_lt(dataset_load_text(fifo, false, 8, 256, &ds, &d), 0);
        cr_assert(strstr(d.text, "not a regular file"), "text: %s", d.text);
        cr_assert_lt(idx_load(fifo, 3, &a, &d), 0);
        cr_assert(strstr(d.text, "not a regular file"), "idx: %s", d.text);
        cr_assert_eq(checkpoint_read_info(fifo, &info, &d), -EBADMSG);
        cr_assert(strstr(d.text, "not a regular file"), "checkpoint: %s", d.text);
        cr_assert_lt(job_load(fifo, &j, &d), 0);
        cr_assert(strstr(d.text, "not a regular file"), "job: %s", d.text);
}
