/* util/file.c */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

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
