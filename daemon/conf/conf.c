/* conf/conf.c */
#include "conf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/file.h"
#include "util/macro.h"

/* Line n (from 1) of path, without its newline and leading blanks; "" if
 * there is none. */
static void source_line(const char *path, int n, char *buf, size_t len) {
        FILE *f = path ? fopen(path, "re") : NULL;
        _cleanup_(freep) char *line = NULL;
        size_t cap = 0;
        ssize_t k = -1;

        buf[0] = '\0';
        if (!f)
                return;
        for (int i = 0; i < n && (k = getline(&line, &cap, f)) >= 0; i++)
                ;
        fclose(f);
        if (k < 0)
                return;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r'))
                line[--k] = '\0';
        snprintf(buf, len, "%s", line + strspn(line, " \t"));
}

static bool name_start(char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '*';
}

static bool name_char(char ch) {
        return name_start(ch) || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
}

/* The settings a line names ("name =" or "name :"), outside strings and
 * comments: calls found(name, length, the text after the = or :) for each
 * until it returns true; that one's name is the result, else NULL. */
static const char *find_name(const char *line, bool (*found)(const char *name, size_t n, const char *value,
                                                              void *userdata),
                             void *userdata, size_t *ret_n) {
        for (const char *p = line; *p; p++) {
                if (*p == '"') { /* a string: to its closing quote */
                        for (p++; *p && *p != '"'; p++)
                                if (*p == '\\' && p[1])
                                        p++;
                        if (!*p)
                                break;
                        continue;
                }
                if (*p == '#' || (p[0] == '/' && (p[1] == '/' || p[1] == '*')))
                        break;
                if (!name_start(*p) || (p > line && name_char(p[-1])))
                        continue;
                const char *start = p;
                while (name_char(*p))
                        p++;
                size_t n = (size_t)(p - start);
                const char *after = p + strspn(p, " \t");
                if ((*after == '=' || *after == ':') && found(start, n, after + 1, userdata)) {
                        *ret_n = n;
                        return start;
                }
                p--;
        }
        return NULL;
}

/* The name a duplicate is about: one named twice on the line, else the
 * first the line names. */
typedef struct Names {
        const char *first;
        size_t first_n;
        const char *line;
} Names;

static bool named_twice(const char *name, size_t n, const char *value, void *userdata) {
        Names *names = userdata;
        if (!names->first) {
                names->first = name;
                names->first_n = n;
        }
        for (const char *p = names->line; p < name; p++)
                if (strncmp(p, name, n) == 0 && !name_char(p[n]) && (p == names->line || !name_char(p[-1])))
                        return true;
        return false;
}

#define CONF_FILE_MAX (16 << 20)

/* The end of the string that opens at p (its closing quote), counting the
 * lines it spans into *n. */
static const char *skip_string(const char *p, const char **line, int *n) {
        for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1])
                        p++;
                else if (*p == '\n') {
                        *line = p + 1;
                        (*n)++;
                }
        return *p ? p : p - 1;
}

/* The name of the setting a number at p belongs to: the last "name =" or
 * "name :" before it on its line, outside strings (an array's, for its
 * elements), or "". */
static void name_before(const char *line, const char *p, char *buf, size_t len) {
        const char *eq = NULL;
        int ignored = 0;
        for (const char *q = line; q < p; q++)
                if (*q == '"')
                        q = skip_string(q, &line, &ignored);
                else if (*q == '=' || *q == ':')
                        eq = q;
        buf[0] = '\0';
        if (!eq)
                return;
        const char *end = eq;
        while (end > line && (end[-1] == ' ' || end[-1] == '\t'))
                end--;
        const char *start = end;
        while (start > line && name_char(start[-1]))
                start--;
        snprintf(buf, len, "%.*s: ", (int)(end - start), start);
}

/* Whether a digit at p starts a number: not inside a name ("layer2"), a
 * float's fraction ("1.25") or a name with a dash ("a-1"). */
static bool number_starts(const char *text, const char *p) {
        if (p == text)
                return true;
        char b = p[-1], bb = p - 1 > text ? p[-2] : ' ';
        if (b == '-' || b == '+')
                return !name_char(bb) && bb != '.';
        return !name_char(b) && b != '.';
}

/* The number whose first digit is at p (line n, which starts at line): its
 * last character. One that does not fit what libconfig 1.5 reads it into
 * is appended to d, and *bad set: without the L suffix an integer is read
 * into 32 bits, its other bits dropped (99999999999 reads as 1215752191,
 * 4294967296 as 0; a hex one from 0x80000000 up as negative), and with it
 * one past 64 bits as the largest. */
static const char *check_number(const char *path, const char *text, const char *line, int n, const char *p,
                                bool *bad, Diag *d) {
        const char *start = p > text && (p[-1] == '-' || p[-1] == '+') ? p - 1 : p;
        bool hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
        const char *end = p + (hex ? 2 + strspn(p + 2, "0123456789abcdefABCDEF") : strspn(p, "0123456789"));
        if (!hex && (*end == '.' || *end == 'e' || *end == 'E')) /* a float */
                return end + strspn(end, "0123456789.eE+-") - 1;
        bool wide = *end == 'L';
        char num[80], name[80];
        snprintf(num, sizeof num, "%.*s", (int)(end - start), start);
        errno = 0;
        long long v = hex ? (long long)strtoull(num, NULL, 16) : strtoll(num, NULL, 10);
        bool past64 = errno == ERANGE || (hex && strlen(num) > 18);
        if (!past64 && (wide || (hex ? (unsigned long long)v <= 0x7fffffffull : v >= INT32_MIN && v <= INT32_MAX)))
                return end + wide - 1;
        name_before(line, start, name, sizeof name);
        if (past64)
                diag_append(d, "%s:%d: %s%s%s does not fit 64 bits", path, n, name, num, wide ? "L" : "");
        else
                diag_append(d, "%s:%d: %s%s is read as a 32-bit integer: write %sL", path, n, name, num, num);
        *bad = true;
        return end + wide - 1;
}

/* Every integer the file writes, wherever it stands (a setting, an array,
 * a line of any length), must fit what it is read into (check_number());
 * -ERANGE naming the file, the line, the setting and the number of each
 * that does not. Strings and comments are skipped as libconfig skips
 * them. An @include, which libconfig would open relative to the working
 * directory and read unchecked, is -EINVAL. */
static int check_integers(const char *path, const char *text, Diag *d) {
        const char *line = text;
        int n = 1;
        bool bad = false;
        if (d)
                d->text[0] = '\0';
        for (const char *p = text; *p; p++) {
                if (*p == '\n') {
                        line = p + 1;
                        n++;
                } else if (*p == '"') {
                        p = skip_string(p, &line, &n);
                } else if (*p == '#' || (p[0] == '/' && p[1] == '/')) {
                        p += strcspn(p, "\n") - 1;
                } else if (p[0] == '/' && p[1] == '*') {
                        for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++)
                                if (*p == '\n') {
                                        line = p + 1;
                                        n++;
                                }
                        if (!*p)
                                break;
                        p++;
                } else if (*p >= '0' && *p <= '9' && number_starts(text, p)) {
                        p = check_number(path, text, line, n, p, &bad, d);
                } else if (strncmp(p, "@include", 8) == 0) {
                        return diag_set(d, -EINVAL, "%s:%d: @include is not supported: write every setting in this "
                                        "file", path, n);
                }
        }
        return bad ? -ERANGE : 0;
}

/* The file's text, NUL-terminated, for check_integers(); opened through
 * file_open_regular(), as a FIFO would hang libconfig's fopen(). */
static int read_text(const char *path, char **ret, Diag *d) {
        struct stat st;
        _cleanup_(closep) int fd = file_open_regular(path, 0, &st, d);
        if (fd < 0)
                return fd;
        if (st.st_size > CONF_FILE_MAX)
                return diag_set(d, -EFBIG, "%s: larger than %d MiB", path, CONF_FILE_MAX >> 20);
        char *text = malloc((size_t)st.st_size + 1);
        if (!text)
                return diag_set(d, -ENOMEM, "%s: out of memory", path);
        ssize_t k = read(fd, text, (size_t)st.st_size);
        if (k < 0) {
                free(text);
                return diag_set(d, -errno, "%s: cannot read: %m", path);
        }
        text[k] = '\0';
        *ret = text;
        return 0;
}

int conf_read_file(config_t *c, const char *path, Diag *d) {
        _cleanup_(freep) char *source = NULL;
        int r = read_text(path, &source, d);
        if (r < 0)
                return r;
        /* before libconfig opens what an @include names; a syntax error
         * below replaces what it said of the integers */
        int integers = check_integers(path, source, d);
        if (integers == -EINVAL)
                return integers;
        /* config_read_file() records the file name, which every later error
         * message about a setting needs. */
        if (config_read_file(c, path) == CONFIG_TRUE)
                return integers;
        if (config_error_type(c) == CONFIG_ERR_FILE_IO) {
                r = errno > 0 ? -errno : -EIO;
                return diag_set(d, r, "%s: cannot read: %s", path, strerror(-r));
        }
        /* libconfig names the line only: name the setting of a duplicate,
         * and quote the line of a syntax error. */
        const char *file = config_error_file(c) ?: path, *text = config_error_text(c) ?: "syntax error";
        int line = config_error_line(c);
        char quote[160];
        source_line(file, line, quote, sizeof quote);
        if (strstr(text, "duplicate setting")) {
                Names names = { .line = quote };
                size_t n = 0;
                const char *name = find_name(quote, named_twice, &names, &n);
                if (!name) {
                        name = names.first;
                        n = names.first_n;
                }
                if (name)
                        return diag_set(d, -EINVAL, "%s:%d: %.*s: set twice in the same group", file, line, (int)n,
                                        name);
        }
        if (quote[0])
                return diag_set(d, -EINVAL, "%s:%d: %s in \"%s\"", file, line, text, quote);
        return diag_set(d, -EINVAL, "%s:%d: %s", file, line, text);
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
        unsigned line = config_setting_source_line(m ?: s);
        if (!line) /* a setting missing from the top level: no line to name */
                return diag_set(d, r, "%s: %s: %s", file ?: "(config)", path[0] ? path : "(top level)", msg);
        return diag_set(d, r, "%s:%u: %s: %s", file ?: "(config)", line, path[0] ? path : "(top level)", msg);
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
