/* util/diag.c */
#include "diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int diag_set(Diag *d, int r, const char *fmt, ...) {
        if (d) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(d->text, sizeof d->text, fmt, ap);
                va_end(ap);
        }
        return r;
}

void diag_append(Diag *d, const char *fmt, ...) {
        if (!d)
                return;
        size_t n = strlen(d->text);
        if (n && n + 1 < sizeof d->text)
                d->text[n++] = '\n';
        if (n + 1 >= sizeof d->text)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->text + n, sizeof d->text - n, fmt, ap);
        va_end(ap);
}

void diag_join(Diag *d) {
        char out[sizeof d->text];
        size_t n = 0;
        for (const char *p = d->text; *p && n + 2 < sizeof out; p++)
                if (*p == '\n') {
                        out[n++] = ';';
                        out[n++] = ' ';
                } else
                        out[n++] = *p;
        out[n] = '\0';
        memcpy(d->text, out, n + 1);
}

const char *diag_reason(Diag *d, int r) {
        if (!d->text[0])
                snprintf(d->text, sizeof d->text, "%s", strerror(r < 0 ? -r : r));
        return d->text;
}
