/* conf/option.c — see option.h. */
#include "option.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* The whole argument is the number: strtoll() would skip a space before
 * it, which is as wrong as one after it. */
static bool whole_number(const char *value, const char *end) {
        return value && end != value && !*end && !isspace((unsigned char)value[0]);
}

int option_int(const char *name, const char *value, long long min, long long max, long long *ret) {
        char *end = NULL;
        long long v;

        errno = 0;
        v = value ? strtoll(value, &end, 10) : 0;
        if (!whole_number(value, end) || errno == ERANGE || v < min || v > max)
                return log_error_errno(!whole_number(value, end) ? -EINVAL : -ERANGE,
                                       "Invalid value for --%s: %s (an integer from %lld to %lld)", name,
                                       value ?: "(none)", min, max);
        *ret = v;
        return 0;
}

/* Decimal notation only: digits with an optional fraction and exponent
 * ("0.5", "2", "1e-3", "-4.5E2"); strtod() would read hex, inf and nan too. */
static bool decimal(const char *value) {
        const char *p = value + (*value == '-' || *value == '+');
        size_t whole = strspn(p, "0123456789"), fraction = 0;
        p += whole;
        if (*p == '.') {
                fraction = strspn(p + 1, "0123456789");
                p += 1 + fraction;
        }
        if (whole + fraction == 0)
                return false;
        if (*p == 'e' || *p == 'E') {
                p += 1 + (p[1] == '-' || p[1] == '+');
                size_t exponent = strspn(p, "0123456789");
                if (exponent == 0)
                        return false;
                p += exponent;
        }
        return *p == '\0';
}

int option_double(const char *name, const char *value, double min, double max, double *ret) {
        char *end = NULL;
        double v = 0;

        if (value && decimal(value))
                v = strtod(value, &end);
        if (!end || !isfinite(v) || !(v >= min && v <= max))
                return log_error_errno(!end ? -EINVAL : -ERANGE,
                                       "Invalid value for --%s: %s (a number from %g to %g)", name,
                                       value ?: "(none)", min, max);
        *ret = v;
        return 0;
}
