/* util/log.h — the one log API: lines on stderr with sd-daemon priority
 * prefixes ("<6>..."), which journald turns into priorities when the daemon
 * runs under systemd and which read fine on a terminal.
 *
 * Only the roles above the layers (conf/, run/, service/, ctl/) and the
 * programs' main() log above debug; library code returns
 * -errno and lets its caller log once:
 *
 *     r = idx_load(path, &images);
 *     if (r < 0)
 *             return log_error_errno(r, "Failed to load %s: %m", path);
 *
 * "%m" prints the error of the _errno variants (errno is set from -r).
 */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <syslog.h>

#include "macro.h"

void log_set_max_level(int level);
int log_get_max_level(void);
/* Prefix lines with "<N>" (default when stderr is not a terminal). */
void log_set_prefix(int enable);

int log_internal(int level, int error, const char *fmt, ...) _printf_(3, 4);

/* An event operators filter on: under journald a structured entry with
 * MESSAGE_ID and the extra fields (newline-separated "KEY=value" lines, or
 * NULL), elsewhere the same line on stderr. The IDs are in
 * run/events.h, their explanations in units/ravnest.catalog. */
int log_event(int level, const char *message_id, const char *fields, const char *fmt, ...) _printf_(4, 5);
/* Whether stderr is connected to the journal (JOURNAL_STREAM). */
int log_to_journal(void);

/* A limit on a line that a sender this node does not control can repeat
 * at will (a failed handshake, a refused call, a peer's notice): at most
 * LOG_RATELIMIT_BURST lines per key (the sender's address, its uid) in
 * LOG_RATELIMIT_INTERVAL_NS, then silence, and one line for what was left
 * out when the interval ends or the key's next line is let through, as
 * systemd's log_ratelimit_*() do:
 *
 *     static LogRatelimit refusals = LOG_RATELIMIT_INIT("Refused calls from");
 *     if (log_ratelimit(&refusals, LOG_NOTICE, "uid 65534"))
 *             log_notice("Refused pause from uid 65534: ...");
 *     // past the burst, later: "Refused calls from uid 65534 ... and 4995 more in the last 10 s"
 *
 * what, then the key, names the lines in that summary. A limit keeps
 * LOG_RATELIMIT_KEYS keys; senders past them share one more entry ("other
 * senders"), so that changing addresses does not escape it.
 * log_ratelimit_flush(), which the service calls every few seconds, writes
 * the summaries of the intervals that ended. Thread-safe. */
#define LOG_RATELIMIT_INTERVAL_NS (10 * 1000000000ULL)
#define LOG_RATELIMIT_BURST 5
#define LOG_RATELIMIT_KEYS 16

typedef struct LogRatelimitKey {
        char key[64];      /* "": unused */
        uint64_t begin_ns; /* the interval's start */
        unsigned shown;    /* lines let through in it ... */
        unsigned hidden;   /* ... and left out */
        int level;         /* the most severe level left out */
} LogRatelimitKey;

typedef struct LogRatelimit {
        const char *what;
        LogRatelimitKey keys[LOG_RATELIMIT_KEYS + 1]; /* the last: every other sender */
        struct LogRatelimit *next;                    /* in log_ratelimit_flush()'s list */
        bool listed;
} LogRatelimit;

#define LOG_RATELIMIT_INIT(w) { .what = (w) }

/* Whether a line of level about key may be written now; false counts it
 * for the summary. A line the log level leaves out anyway is let through
 * and not counted. */
bool log_ratelimit(LogRatelimit *rl, int level, const char *key);
bool log_ratelimit_at(LogRatelimit *rl, int level, const char *key, uint64_t now_ns);
/* The summaries of the intervals that ended. */
void log_ratelimit_flush(void);
void log_ratelimit_flush_at(uint64_t now_ns);

#define log_full_errno(level, error, ...) log_internal((level), (error), __VA_ARGS__)
#define log_debug(...) log_internal(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_internal(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_internal(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_internal(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_internal(LOG_ERR, 0, __VA_ARGS__)
#define log_error_errno(error, ...) log_internal(LOG_ERR, (error), __VA_ARGS__)
#define log_warning_errno(error, ...) log_internal(LOG_WARNING, (error), __VA_ARGS__)
