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

#define log_full_errno(level, error, ...) log_internal((level), (error), __VA_ARGS__)
#define log_debug(...) log_internal(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_internal(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_internal(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_internal(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_internal(LOG_ERR, 0, __VA_ARGS__)
#define log_error_errno(error, ...) log_internal(LOG_ERR, (error), __VA_ARGS__)
#define log_warning_errno(error, ...) log_internal(LOG_WARNING, (error), __VA_ARGS__)
