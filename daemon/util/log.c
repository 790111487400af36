/* util/log.c */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int max_level = LOG_INFO;
static int use_prefix = -1; /* -1: decide from isatty(stderr) */

void log_set_max_level(int level) {
        max_level = level;
}

int log_get_max_level(void) {
        return max_level;
}

void log_set_prefix(int enable) {
        use_prefix = enable;
}

int log_internal(int level, int error, const char *fmt, ...) {
        int r = error < 0 ? error : -abs(error);

        if (level > max_level)
                return r;
        if (use_prefix < 0)
                use_prefix = !isatty(STDERR_FILENO) || getenv("JOURNAL_STREAM");

        char buf[2048];
        va_list ap;
        errno = -r; /* for %m */
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);

        if (use_prefix)
                fprintf(stderr, "<%d>%s\n", level, buf);
        else
                fprintf(stderr, "%s\n", buf);
        return r;
}
