/* conf/conf.h — typed, bounded reads from libconfig files, with errors
 * that name the file, the line and the setting.
 *
 * Shared by the job files and ravnestd.conf. Every read checks type and
 * range; conf_check_keys() makes unknown settings an error, so a typo never
 * silently falls back to a default.
 *
 *     const char *const keys[] = { "lr", "momentum", NULL };
 *     r = conf_check_keys(group, keys, &d);
 *     r = conf_get_double(group, "lr", false, 0.0, 10.0, 0.01, &lr, &d);
 *     // d.text: "job.conf:12: optimizer.lr: must be a number in [0, 10], got 12.5"
 */
#pragma once

#include <libconfig.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/diag.h"

/* Read path into c. On a syntax error d says "file:line: message in "the
 * line's text"" (control bytes written as \xNN), for a duplicate
 * "file:line: group.name: set twice in the same group". A group of more
 * than 4096 settings (libconfig's time grows with their square), or more
 * than 8192 settings past the 64th of their group in the file, is -E2BIG
 * before libconfig reads it. An integer too wide for how it is written (see below) is
 * -ERANGE, naming the file, the line and the setting's full path, with c
 * read. */
int conf_read_file(config_t *c, const char *path, Diag *d);

/* Error about setting s (or about `name` missing from group s). */
int conf_error(const config_setting_t *s, const char *name, int r, Diag *d, const char *fmt, ...)
        _printf_(5, 6);

/* Every member of group must have its name in allowed (NULL-terminated). */
int conf_check_keys(const config_setting_t *group, const char *const *allowed, Diag *d);

/* v in the fewest digits that read back as v, so that a number just past a
 * bound does not print as the bound (86400.0001, not 86400). */
#define CONF_NUMBER_MAX 32
const char *conf_number(double v, char buf[CONF_NUMBER_MAX]);

/* Each getter: if the setting is absent, *ret = def and 0 is returned (or,
 * with required, an error). Values of the wrong type or out of range are
 * errors. An integer libconfig 1.5 cut to 32 bits (written past that
 * without the L suffix) is read back from its line and reported as out of
 * range. */
int conf_get_int(const config_setting_t *group, const char *name, bool required, long long lo,
                 long long hi, long long def, long long *ret, Diag *d);
/* Setting s itself (an array's element, say), as conf_get_int() reads one. */
int conf_int(const config_setting_t *s, long long lo, long long hi, long long *ret, Diag *d);
int conf_get_double(const config_setting_t *group, const char *name, bool required, double lo,
                    double hi, double def, double *ret, Diag *d);
int conf_get_bool(const config_setting_t *group, const char *name, bool def, bool *ret, Diag *d);
/* Copies into buf (len bytes); too long is an error. */
int conf_get_string(const config_setting_t *group, const char *name, bool required,
                    const char *def, char *buf, size_t len, Diag *d);
/* A group member that must be a group (or list, with want_list). */
int conf_get_group(const config_setting_t *group, const char *name, bool required, bool want_list,
                   config_setting_t **ret, Diag *d);
