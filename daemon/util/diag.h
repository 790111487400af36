/* util/diag.h — say *why* something failed without logging.
 *
 * Library code returns -errno; when the caller needs the reason in words (a
 * corrupt file, a bad setting), the function also fills an optional Diag:
 *
 *     Diag d = {};
 *     r = idx_load(path, &a, &d);
 *     if (r < 0)
 *             log_error_errno(r, "%s", d.text);  // "train-images…: bad magic 0x…"
 */
#pragma once

#include "macro.h"

typedef struct Diag {
        char text[2048];
} Diag;

/* Format into d (when d is not NULL) and return r, so that
 * `return diag_set(d, -EBADMSG, "%s: bad magic", path);` reads as one step. */
int diag_set(Diag *d, int r, const char *fmt, ...) _printf_(3, 4);
/* Add a line to d (a check that reports every error, not just the first). */
void diag_append(Diag *d, const char *fmt, ...) _printf_(2, 3);
/* d's text, or, when the failure r left it empty (an allocation that
 * failed), strerror(-r) put there: a message never ends in nothing. */
const char *diag_reason(Diag *d, int r);
/* d's lines joined into one with "; " (for a log field or a property that
 * holds one line), cut to the buffer's size. */
void diag_join(Diag *d);
