/* run/result.c — see result.h. */
#include "result.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/file.h"

static void result_path(const char *dir, const char *job, const char *suffix, char *buf, size_t len) {
        snprintf(buf, len, "%s/%s.result%s", dir, job, suffix);
        for (char *c = buf + strlen(dir) + 1; *c; c++) /* a job's name is not a path */
                if (*c == '/')
                        *c = '_';
}

int run_result_write(const char *dir, const char *job, const RunResult *r) {
        char path[PATH_MAX], tmp[PATH_MAX];
        result_path(dir, job, "", path, sizeof path);
        result_path(dir, job, ".tmp", tmp, sizeof tmp);
        FILE *f = fopen(tmp, "we");
        if (!f)
                return -errno;
        fprintf(f, "test_accuracy %.6f\ntest_loss %.6f\naveraged %d\n", r->test_accuracy, r->test_loss, r->averaged);
        if (fflush(f) != 0 || fsync(fileno(f)) < 0) {
                int e = -errno;
                fclose(f);
                unlink(tmp);
                return e;
        }
        fclose(f);
        return rename(tmp, path) < 0 ? -errno : 0;
}

int run_result_read(const char *dir, const char *job, RunResult *ret, uint64_t *ret_mtime_usec) {
        char path[PATH_MAX], text[256];
        struct stat st;
        RunResult r;

        result_path(dir, job, "", path, sizeof path);
        int fd = file_open_regular(path, 0, &st, NULL); /* in a swarm's directory anyone may make */
        if (fd < 0)
                return fd;
        ssize_t n = read(fd, text, sizeof text - 1);
        close(fd);
        if (n <= 0)
                return -EBADMSG;
        text[n] = 0;
        if (sscanf(text, "test_accuracy %lf\ntest_loss %lf\naveraged %d\n", &r.test_accuracy, &r.test_loss,
                   &r.averaged) != 3 || r.averaged < -1 || r.averaged > 1)
                return -EBADMSG;
        *ret = r;
        if (ret_mtime_usec)
                *ret_mtime_usec = (uint64_t)st.st_mtim.tv_sec * 1000000u + (uint64_t)st.st_mtim.tv_nsec / 1000u;
        return 0;
}
