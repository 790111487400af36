/* util/log.c: the rate limit of lines a sender outside the node can
 * repeat, on a clock the test sets (no test waits for one). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/proc.h"
#include "util/log.h"
#include "util/time-util.h"

/* What the log wrote while stderr was captured, from the start. */
static FILE *captured;
static int saved_stderr = -1;

static void capture(void) {
        captured = tmpfile();
        cr_assert_not_null(captured);
        fflush(stderr);
        saved_stderr = dup(STDERR_FILENO);
        cr_assert(dup2(fileno(captured), STDERR_FILENO) >= 0);
        log_set_prefix(1);
}

static const char *written(void) {
        static char text[65536];
        fflush(stderr);
        size_t n = (size_t)pread(fileno(captured), text, sizeof text - 1, 0);
        text[n] = 0;
        return text;
}

static void release(void) {
        fflush(stderr);
        if (saved_stderr >= 0)
                dup2(saved_stderr, STDERR_FILENO);
        if (captured)
                fclose(captured);
}

/* n lines about key at time t: how many were let through (and written). */
static int offer(LogRatelimit *rl, const char *key, int n, uint64_t t) {
        int shown = 0;
        for (int i = 0; i < n; i++)
                if (log_ratelimit_at(rl, LOG_WARNING, key, t)) {
                        log_warning("Authentication failed with %s", key);
                        shown++;
                }
        return shown;
}

#define T0 (1000 * NSEC_PER_SEC)

Test(log, a_burst_per_key_then_one_summary_when_the_next_line_goes, .init = capture, .fini = release) {
        static LogRatelimit rl = LOG_RATELIMIT_INIT("Failed handshakes from");
        cr_assert_eq(offer(&rl, "192.0.2.7", 100, T0), LOG_RATELIMIT_BURST);
        /* another sender has a burst of its own */
        cr_assert_eq(offer(&rl, "192.0.2.8", 3, T0 + NSEC_PER_SEC), 3);
        cr_assert_eq(test_count(written(), " more in the last"), 0, "%s", written());
        /* within the interval, still nothing */
        cr_assert_eq(offer(&rl, "192.0.2.7", 10, T0 + LOG_RATELIMIT_INTERVAL_NS - 1), 0);
        /* the next interval: the summary, then the line */
        cr_assert_eq(offer(&rl, "192.0.2.7", 1, T0 + LOG_RATELIMIT_INTERVAL_NS), 1);
        const char *text = written();
        const char *summary = strstr(text, "<4>Failed handshakes from 192.0.2.7 ... and 105 more in the last 10 s\n");
        cr_assert_not_null(summary, "%s", text);
        cr_assert_not_null(strstr(summary, "\n<4>Authentication failed with 192.0.2.7\n"), "%s", text);
        cr_assert_eq(test_count(text, "Authentication failed with 192.0.2.7"), LOG_RATELIMIT_BURST + 1, "%s", text);
        cr_assert_eq(test_count(text, " more in the last"), 1, "%s", text);
}

Test(log, the_summary_comes_when_the_interval_ends_without_another_line, .init = capture, .fini = release) {
        static LogRatelimit rl = LOG_RATELIMIT_INIT("Refused calls from");
        for (int i = 0; i < 40; i++)
                if (log_ratelimit_at(&rl, i % 2 ? LOG_NOTICE : LOG_WARNING, "uid 65534", T0))
                        log_notice("Refused pause from uid 65534");
        log_ratelimit_flush_at(T0 + LOG_RATELIMIT_INTERVAL_NS / 2);
        cr_assert_eq(test_count(written(), " more in the last"), 0, "%s", written());
        log_ratelimit_flush_at(T0 + LOG_RATELIMIT_INTERVAL_NS + 2 * NSEC_PER_SEC);
        /* at the most severe level left out; once */
        cr_assert_not_null(strstr(written(), "<4>Refused calls from uid 65534 ... and 35 more in the last 12 s\n"),
                           "%s", written());
        log_ratelimit_flush_at(T0 + 3 * LOG_RATELIMIT_INTERVAL_NS);
        cr_assert_eq(test_count(written(), " more in the last"), 1, "%s", written());
        /* a fresh interval: a burst again, nothing to summarise */
        cr_assert_eq(offer(&rl, "uid 65534", LOG_RATELIMIT_BURST, T0 + 4 * LOG_RATELIMIT_INTERVAL_NS),
                     LOG_RATELIMIT_BURST);
        cr_assert_eq(test_count(written(), " more in the last"), 1, "%s", written());
}

/* A sender that takes a new address for every line gets no more through
 * than the table's keys and the entry they share. */
Test(log, new_keys_past_the_table_share_one_burst, .init = capture, .fini = release) {
        static LogRatelimit rl = LOG_RATELIMIT_INIT("Failed handshakes from");
        char key[32];
        int shown = 0;
        for (int i = 0; i < 1000; i++) {
                snprintf(key, sizeof key, "10.0.%d.%d", i / 256, i % 256);
                shown += offer(&rl, key, 2, T0 + (uint64_t)i * 1000);
        }
        cr_assert_eq(shown, 2 * LOG_RATELIMIT_KEYS + LOG_RATELIMIT_BURST);
        log_ratelimit_flush_at(T0 + 2 * LOG_RATELIMIT_INTERVAL_NS);
        cr_assert_not_null(strstr(written(), "Failed handshakes from other senders ... and "), "%s", written());
        cr_assert_eq(test_count(written(), " more in the last"), 1, "%s", written());
}

Test(log, lines_the_log_level_leaves_out_are_not_counted, .init = capture, .fini = release) {
        static LogRatelimit rl = LOG_RATELIMIT_INIT("Pause notices from");
        for (int i = 0; i < 20; i++)
                cr_assert(log_ratelimit_at(&rl, LOG_DEBUG, "link 1", T0));
        cr_assert_eq(offer(&rl, "link 1", 20, T0), LOG_RATELIMIT_BURST);
}
