/* util/rss.c */
#include "rss.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int rss_self_bytes(uint64_t *ret) {
        char text[128];
        unsigned long long size, resident;
        int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t n = read(fd, text, sizeof text - 1);
        int e = errno;
        close(fd);
        if (n < 0)
                return -e;
        text[n] = 0;
        long page = sysconf(_SC_PAGESIZE);
        if (sscanf(text, "%llu %llu", &size, &resident) != 2 || page <= 0)
                return -EBADMSG;
        *ret = (uint64_t)resident * (uint64_t)page;
        return 0;
}
