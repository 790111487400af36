/* util/log.c */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
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

int log_to_journal(void) {
        static int cached = -1;
        const char *e = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        if (cached >= 0)
                return cached;
        cached = e && sscanf(e, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
                 (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
        return cached;
}

int log_event(int level, const char *message_id, const char *fields, const char *fmt, ...) {
        char text[2048], msg[2100], id[64], prio[16], copy[2048];
        struct iovec iov[24];
        size_t n = 0;
        va_list ap;

        if (level > max_level)
                return 0;
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
        if (!log_to_journal())
                return log_internal(level, 0, "%s", text);

        snprintf(msg, sizeof msg, "MESSAGE=%s", text);
        snprintf(id, sizeof id, "MESSAGE_ID=%s", message_id);
        snprintf(prio, sizeof prio, "PRIORITY=%d", level);
        iov[n++] = (struct iovec){ msg, strlen(msg) };
        iov[n++] = (struct iovec){ id, strlen(id) };
        iov[n++] = (struct iovec){ prio, strlen(prio) };
        iov[n++] = (struct iovec){ (char *)"SYSLOG_IDENTIFIER=ravnestd", strlen("SYSLOG_IDENTIFIER=ravnestd") };
        if (fields) {
                snprintf(copy, sizeof copy, "%s", fields);
                for (char *save = NULL, *f = strtok_r(copy, "\n", &save); f && n < ELEMENTSOF(iov);
                     f = strtok_r(NULL, "\n", &save))
                        iov[n++] = (struct iovec){ f, strlen(f) };
        }
        if (sd_journal_sendv(iov, (int)n) < 0)
                return log_internal(level, 0, "%s", text);
        return 0;
}
