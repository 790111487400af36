/* util/log.c */
#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include "time-util.h"

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

/* ---- rate limits --------------------------------------------------------- */

static pthread_mutex_t ratelimit_lock = PTHREAD_MUTEX_INITIALIZER;
static LogRatelimit *ratelimits; /* every limit used so far, for log_ratelimit_flush() */

/* What the interval of k left out, in one line; k starts afresh. */
static void ratelimit_summary(const LogRatelimit *rl, LogRatelimitKey *k, uint64_t now) {
        if (k->hidden > 0) {
                unsigned secs = (unsigned)((now - k->begin_ns + NSEC_PER_SEC / 2) / NSEC_PER_SEC);
                log_internal(k->level, 0, "%s %s ... and %u more in the last %u s", rl->what, k->key, k->hidden,
                             MAX(secs, 1u));
        }
        k->begin_ns = now;
        k->shown = k->hidden = 0;
        k->level = LOG_DEBUG;
}

static bool interval_over(const LogRatelimitKey *k, uint64_t now) {
        return now - k->begin_ns >= LOG_RATELIMIT_INTERVAL_NS;
}

/* key's entry: its own, a free one, one whose interval is over (its
 * summary written first), or the shared last one. */
static LogRatelimitKey *ratelimit_entry(LogRatelimit *rl, const char *key, uint64_t now) {
        LogRatelimitKey *free_entry = NULL;
        for (size_t i = 0; i < LOG_RATELIMIT_KEYS; i++) {
                LogRatelimitKey *k = &rl->keys[i];
                if (k->key[0] && !strncmp(k->key, key, sizeof k->key - 1))
                        return k;
                if (!free_entry && (!k->key[0] || interval_over(k, now)))
                        free_entry = k;
        }
        LogRatelimitKey *k = free_entry ?: &rl->keys[LOG_RATELIMIT_KEYS];
        if (free_entry && k->key[0]) /* another key's interval, over: said before the entry goes */
                ratelimit_summary(rl, k, now);
        if (free_entry || !k->key[0]) {
                snprintf(k->key, sizeof k->key, "%s", free_entry ? key : "other senders");
                ratelimit_summary(rl, k, now); /* (nothing left out yet: starts the interval) */
        }
        return k;
}

bool log_ratelimit_at(LogRatelimit *rl, int level, const char *key, uint64_t now) {
        if (level > max_level)
                return true;
        pthread_mutex_lock(&ratelimit_lock);
        if (!rl->listed) {
                rl->next = ratelimits;
                ratelimits = rl;
                rl->listed = true;
        }
        LogRatelimitKey *k = ratelimit_entry(rl, key ?: "", now);
        if (interval_over(k, now))
                ratelimit_summary(rl, k, now);
        bool pass = k->shown < LOG_RATELIMIT_BURST;
        if (pass)
                k->shown++;
        else {
                k->hidden++;
                k->level = MIN(k->level, level);
        }
        pthread_mutex_unlock(&ratelimit_lock);
        return pass;
}

bool log_ratelimit(LogRatelimit *rl, int level, const char *key) {
        return log_ratelimit_at(rl, level, key, now_ns());
}

void log_ratelimit_flush_at(uint64_t now) {
        pthread_mutex_lock(&ratelimit_lock);
        for (LogRatelimit *rl = ratelimits; rl; rl = rl->next)
                for (size_t i = 0; i <= LOG_RATELIMIT_KEYS; i++) {
                        LogRatelimitKey *k = &rl->keys[i];
                        if (k->key[0] && interval_over(k, now)) {
                                ratelimit_summary(rl, k, now);
                                k->key[0] = 0;
                        }
                }
        pthread_mutex_unlock(&ratelimit_lock);
}

void log_ratelimit_flush(void) {
        log_ratelimit_flush_at(now_ns());
}
