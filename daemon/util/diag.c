/* util/diag.c */
#include "diag.h"

#include <stdarg.h>
#include <stdio.h>

int diag_set(Diag *d, int r, const char *fmt, ...) {
        if (d) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(d->text, sizeof d->text, fmt, ap);
                va_end(ap);
        }
        return r;
}
