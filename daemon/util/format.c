/* util/format.c — see format.h. */
#include "format.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
#define N_UNITS (sizeof units / sizeof units[0])

const char *format_bytes(char *buf, size_t len, uint64_t bytes) {
        double v = (double)bytes;
        size_t u = 0;
        if (bytes < 1024) {
                snprintf(buf, len, "%llu B", (unsigned long long)bytes);
                return buf;
        }
        while (v >= 1024 && u + 1 < N_UNITS) {
                v /= 1024;
                u++;
        }
        if (v >= 1023.95 && u + 1 < N_UNITS) { /* would print "1024.0 KiB" */
                v /= 1024;
                u++;
        }
        snprintf(buf, len, "%.1f %s", v, units[u]);
        return buf;
}

int parse_bytes(const char *text, const char **ret_end, uint64_t *ret) {
        char *end;
        if (!(text[0] >= '0' && text[0] <= '9'))
                return -EINVAL; /* no sign, no space, no "inf" */
        errno = 0;
        double v = strtod(text, &end);
        if (errno || end == text || !isfinite(v) || *end != ' ')
                return -EINVAL;
        end++;
        for (size_t u = 0; u < N_UNITS; u++) {
                size_t l = strlen(units[u]);
                if (strncmp(end, units[u], l) != 0)
                        continue;
                v = ldexp(v, 10 * (int)u);
                if (v + 0.5 >= 18446744073709551615.0)
                        return -ERANGE;
                if (ret_end)
                        *ret_end = end + l;
                *ret = (uint64_t)(v + 0.5);
                return 0;
        }
        return -EINVAL;
}
