/* Byte counts for people: the figures format_bytes() writes, and
 * parse_bytes() reading them back as the swarm reads a node's log line. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "util/diag.h"
#include "util/format.h"

Test(format, bytes_in_binary_units) {
        char buf[FORMAT_BYTES_MAX];
        cr_expect_str_eq(format_bytes(buf, sizeof buf, 0), "0 B");
        cr_expect_str_eq(format_bytes(buf, sizeof buf, 1023), "1023 B");
        cr_expect_str_eq(format_bytes(buf, sizeof buf, 1024), "1.0 KiB");
        cr_expect_str_eq(format_bytes(buf, sizeof buf, 53248), "52.0 KiB");
        cr_expect_str_eq(format_bytes(buf, sizeof buf, (1u << 20) - 1), "1.0 MiB"); /* not "1024.0 KiB" */
        cr_expect_str_eq(format_bytes(buf, sizeof buf, 1288490189), "1.2 GiB");
        cr_expect_str_eq(format_bytes(buf, sizeof buf, UINT64_MAX), "16384.0 PiB");
}

Test(format, what_is_written_reads_back) {
        static const uint64_t values[] = { 0, 1, 1000, 1024, 53248, 20u << 20, 3ull << 40 };
        char buf[FORMAT_BYTES_MAX];
        for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
                uint64_t v;
                const char *end;
                format_bytes(buf, sizeof buf, values[i]);
                cr_assert_eq(parse_bytes(buf, &end, &v), 0, "%s", buf);
                cr_expect_eq(v, values[i], "%s: %llu", buf, (unsigned long long)v);
                cr_expect_eq(*end, '\0');
        }
}

Test(format, parse_stops_after_the_unit_and_refuses_the_rest) {
        uint64_t v = 7;
        const char *end;
        cr_assert_eq(parse_bytes("1.5 KiB/step, more", &end, &v), 0);
        cr_expect_eq(v, 1536);
        cr_expect_str_eq(end, "/step, more");
        static const char *const bad[] = { "", "-", "-1 B", " 1 B", "1B", "1 kB", "1 ", "inf B", "nan KiB", "KiB",
                                           "x 1 B" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                cr_expect_eq(parse_bytes(bad[i], NULL, &v), -EINVAL, "\"%s\"", bad[i]);
        cr_expect_eq(parse_bytes("99999 PiB", NULL, &v), -ERANGE);
        cr_expect_eq(v, 1536, "changed on failure");
}

/* A failure that left no words (an allocation) still says something. */
Test(diag, a_reason_is_never_empty) {
        Diag d = {};
        cr_assert_str_eq(diag_reason(&d, -ENOMEM), strerror(ENOMEM));
        diag_set(&d, -EINVAL, "x.job:3: model.dim: too wide");
        cr_assert_str_eq(diag_reason(&d, -EINVAL), "x.job:3: model.dim: too wide");
}
