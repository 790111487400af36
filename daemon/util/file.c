/* util/file.c */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

int file_open_regular(const char *path, int flags, struct stat *st, Diag *d) {
        /* a device is not even opened (opening some has effects); the
         * fstat() after the open decides, should the path change between */
        if (stat(path, st) == 0 && !S_ISREG(st->st_mode) && !(flags & O_NOFOLLOW))
                return diag_set(d, -EINVAL, "%s: not a regular file", path);
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | flags);
        if (fd < 0)
                return diag_set(d, -errno, "%s: cannot read: %s", path, strerror(errno));
        if (fstat(fd, st) < 0) {
                int r = -errno;
                close(fd);
                return diag_set(d, r, "%s: cannot stat: %s", path, strerror(-r));
        }
        if (!S_ISREG(st->st_mode)) {
                close(fd);
                return diag_set(d, -EINVAL, "%s: not a regular file", path);
        }
        /* reads of a regular file never block; the flag goes for tidiness */
        (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        return fd;
}

int file_write_text(const char *path, const char *text, mode_t mode) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        if (fd < 0)
                return -errno;
        size_t n = strlen(text);
        ssize_t k = write(fd, text, n);
        int e = k < 0 ? -errno : 0;
        close(fd);
        return e ? e : k == (ssize_t)n ? 0 : -EIO;
}
