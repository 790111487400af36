/* service/conf.c */
#include "conf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int conf_read_file(config_t *c, const char *path, Diag *d) {
        /* config_read_file() records the file name, which every later error
         * message about a setting needs. */
        if (config_read_file(c, path) == CONFIG_TRUE)
                return 0;
        if (config_error_type(c) == CONFIG_ERR_FILE_IO) {
                int r = errno > 0 ? -errno : -EIO;
                return diag_set(d, r, "%s: cannot read: %s", path, strerror(-r));
        }
        return diag_set(d, -EINVAL, "%s:%d: %s", config_error_file(c) ?: path, config_error_line(c),
                        config_error_text(c));
}

/* "optimizer.lr" or "model.layers.[2].out" */
static void setting_path(const config_setting_t *s, char *buf, size_t len) {
        const config_setting_t *chain[64];
        int n = 0;
        for (; s && !config_setting_is_root(s) && n < 64; s = config_setting_parent(s))
                chain[n++] = s;
        buf[0] = 0;
        for (int i = n - 1; i >= 0; i--) {
                size_t used = strlen(buf);
                const char *name = config_setting_name(chain[i]);
                if (name)
                        snprintf(buf + used, len - used, "%s%s", used ? "." : "", name);
                else
                        snprintf(buf + used, len - used, "%s[%d]", used ? "." : "",
                                 config_setting_index(chain[i]));
        }
}

int conf_error(const config_setting_t *s, const char *name, int r, Diag *d, const char *fmt, ...) {
        char path[512], msg[384];
        const char *file = config_setting_source_file(s);
        va_list ap;

        setting_path(s, path, sizeof path);
        if (name) {
                size_t used = strlen(path);
                snprintf(path + used, sizeof path - used, "%s%s", used ? "." : "", name);
        }
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        /* The member's own line when it exists (groups span many lines). */
        const config_setting_t *m = name && config_setting_is_group(s) ? config_setting_get_member(s, name) : NULL;
        return diag_set(d, r, "%s:%u: %s: %s", file ?: "(config)", config_setting_source_line(m ?: s),
                        path[0] ? path : "(top level)", msg);
}

int conf_check_keys(const config_setting_t *group, const char *const *allowed, Diag *d) {
        int n = config_setting_length(group);
        for (int i = 0; i < n; i++) {
                const config_setting_t *m = config_setting_get_elem(group, (unsigned)i);
                const char *name = config_setting_name(m);
                bool ok = false;
                for (const char *const *a = allowed; *a; a++)
                        if (name && strcmp(name, *a) == 0)
                                ok = true;
                if (!ok)
                        return conf_error(m, NULL, -EINVAL, d, "unknown setting");
        }
        return 0;
}

static config_setting_t *member(const config_setting_t *group, const char *name) {
        return group ? config_setting_get_member(group, name) : NULL;
}

int conf_get_int(const config_setting_t *group, const char *name, bool required, long long lo,
                 long long hi, long long def, long long *ret, Diag *d) {
        config_setting_t *s = member(group, name);
        long long v;

        if (!s) {
                if (required)
                        return conf_error(group, name, -EINVAL, d, "missing (required)");
                *ret = def;
                return 0;
        }
        switch (config_setting_type(s)) {
        case CONFIG_TYPE_INT:
                v = config_setting_get_int(s);
                break;
        case CONFIG_TYPE_INT64:
                v = config_setting_get_int64(s);
                break;
        default:
                return conf_error(s, NULL, -EINVAL, d, "must be an integer in [%lld, %lld]", lo, hi);
        }
        if (v < lo || v > hi)
                return conf_error(s, NULL, -ERANGE, d, "must be an integer in [%lld, %lld], got %lld",
                                  lo, hi, v);
        *ret = v;
        return 0;
}

int conf_get_double(const config_setting_t *group, const char *name, bool required, double lo,
                    double hi, double def, double *ret, Diag *d) {
        config_setting_t *s = member(group, name);
        double v;

        if (!s) {
                if (required)
                        return conf_error(group, name, -EINVAL, d, "missing (required)");
                *ret = def;
                return 0;
        }
        switch (config_setting_type(s)) {
        case CONFIG_TYPE_INT:
                v = config_setting_get_int(s);
                break;
        case CONFIG_TYPE_INT64:
                v = (double)config_setting_get_int64(s);
                break;
        case CONFIG_TYPE_FLOAT:
                v = config_setting_get_float(s);
                break;
        default:
                return conf_error(s, NULL, -EINVAL, d, "must be a number in [%g, %g]", lo, hi);
        }
        if (!(v >= lo && v <= hi))
                return conf_error(s, NULL, -ERANGE, d, "must be a number in [%g, %g], got %g", lo, hi,
                                  v);
        *ret = v;
        return 0;
}

int conf_get_bool(const config_setting_t *group, const char *name, bool def, bool *ret, Diag *d) {
        config_setting_t *s = member(group, name);
        if (!s) {
                *ret = def;
                return 0;
        }
        if (config_setting_type(s) != CONFIG_TYPE_BOOL)
                return conf_error(s, NULL, -EINVAL, d, "must be true or false");
        *ret = config_setting_get_bool(s);
        return 0;
}

int conf_get_string(const config_setting_t *group, const char *name, bool required,
                    const char *def, char *buf, size_t len, Diag *d) {
        config_setting_t *s = member(group, name);
        const char *v;

        if (!s) {
                if (required)
                        return conf_error(group, name, -EINVAL, d, "missing (required)");
                v = def ?: "";
        } else {
                if (config_setting_type(s) != CONFIG_TYPE_STRING)
                        return conf_error(s, NULL, -EINVAL, d, "must be a string");
                v = config_setting_get_string(s);
        }
        if (strlen(v) >= len)
                return conf_error(s ?: group, s ? NULL : name, -ENAMETOOLONG, d,
                                  "longer than %zu characters", len - 1);
        strcpy(buf, v);
        return 0;
}

int conf_get_group(const config_setting_t *group, const char *name, bool required, bool want_list,
                   config_setting_t **ret, Diag *d) {
        config_setting_t *s = member(group, name);
        if (!s) {
                if (required)
                        return conf_error(group, name, -EINVAL, d, "missing (required)");
                *ret = NULL;
                return 0;
        }
        if (want_list ? !config_setting_is_list(s) : !config_setting_is_group(s))
                return conf_error(s, NULL, -EINVAL, d, want_list ? "must be a list ( ... )"
                                                                 : "must be a group { ... }");
        *ret = s;
        return 0;
}
