/* conf/option.c — see option.h. */
#include "option.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "util/log.h"

/* The whole argument is the number: strtoll() and strtod() would skip a
 * space before it, which is as wrong as one after it. */
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

int option_double(const char *name, const char *value, double min, double max, double *ret) {
        char *end = NULL;
        double v;

        errno = 0;
        v = value ? strtod(value, &end) : 0;
        if (!whole_number(value, end) || !isfinite(v) || !(v >= min && v <= max))
                return log_error_errno(!whole_number(value, end) ? -EINVAL : -ERANGE,
                                       "Invalid value for --%s: %s (a number from %g to %g)", name,
                                       value ?: "(none)", min, max);
        *ret = v;
        return 0;
}
