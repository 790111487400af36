/* conf/conf.c */
#include "conf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "util/file.h"
#include "util/macro.h"

/* s into buf (len bytes, cut to fit), each control byte but tab written as
 * \xNN, so that text from a file cannot move a terminal's cursor or retitle
 * it. */
static void escape(const char *s, char *buf, size_t len) {
        size_t used = 0;
        for (; *s && used + 5 <= len; s++) {
                unsigned char ch = (unsigned char)*s;
                if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
                        used += (size_t)snprintf(buf + used, len - used, "\\x%02x", ch);
                else
                        buf[used++] = (char)ch;
        }
        buf[used] = '\0';
}

/* Line n (from 1) of path, without its newline and leading blanks, control
 * bytes escaped; "" if there is none. */
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
        escape(line + strspn(line, " \t"), buf, len);
}

static bool name_start(char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '*';
}

static bool name_char(char ch) {
        return name_start(ch) || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
}

#define CONF_FILE_MAX (16 << 20)
#define CONF_GROUP_MAX 4096
#define CONF_GROUP_SMALL 64
#define CONF_LARGE_MAX 8192
#define WALK_DEPTH 64

/* The end of the string that opens at p (its closing quote), counting the
 * lines it spans into *line. */
static const char *skip_string(const char *p, int *line) {
        for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1])
                        p++;
                else if (*p == '\n')
                        (*line)++;
        return *p ? p : p - 1;
}

/* The end of the comment that opens at p ("/" then "*"), counting its lines. */
static const char *skip_comment(const char *p, int *line) {
        for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++)
                if (*p == '\n')
                        (*line)++;
        return *p ? p + 1 : p - 1;
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

/* A walk through a file's text as libconfig reads it (strings and comments
 * skipped, lines counted) that knows the settings around where it stands,
 * so that what it finds is named by its full path, as conf_error() names
 * a setting ("network.peers.[1]"). walk_next() stops at each: */
typedef enum WalkStop {
        WALK_END,
        WALK_NAME,    /* a setting's name: at, at_n */
        WALK_NUMBER,  /* the first digit of a number: at */
        WALK_OPEN,    /* a group, list or array opened: frame[depth] */
        WALK_CLOSE,   /* and closed: frame[depth + 1] was it */
        WALK_INCLUDE, /* an @include */
        WALK_DEEP_NAME, /* a word more than WALK_DEPTH levels in */
} WalkStop;

typedef struct Walk {
        const char *text, *p; /* p: where the walk goes on */
        const char *at;
        size_t at_n;
        int line;             /* of at, from 1 */
        int depth;            /* frame[0] is the top level */
        int deeper;           /* levels open past WALK_DEPTH: in no frame, and unnamed */
        struct {
                char open;        /* '{' (a group or the top level), '(' or '[' */
                const char *name; /* a group: the last setting named in it */
                size_t name_n;
                int index;        /* a list or array: the element the walk is in */
        } frame[WALK_DEPTH];
} Walk;

static void walk_start(Walk *w, const char *text) {
        *w = (Walk){ .text = text, .p = text, .line = 1 };
        w->frame[0].open = '{';
}

/* At a word at p: in a group (or the top level) every word but true and
 * false is a setting's name, as libconfig's grammar has it, with or without
 * the "=" that should follow. The place to walk on from; *ret_stop is
 * WALK_NAME for a setting's name, WALK_DEEP_NAME for a word past WALK_DEPTH
 * (in no frame, so perhaps a name), WALK_END for none. */
static const char *walk_name(Walk *w, const char *p, WalkStop *ret_stop) {
        const char *end = p;
        while (name_char(*end))
                end++;
        size_t n = (size_t)(end - p);
        bool boolean = (n == 4 && strncasecmp(p, "true", 4) == 0) || (n == 5 && strncasecmp(p, "false", 5) == 0);
        *ret_stop = boolean ? WALK_END : w->deeper ? WALK_DEEP_NAME
                    : w->frame[w->depth].open == '{' ? WALK_NAME : WALK_END;
        if (*ret_stop == WALK_NAME) {
                w->at = w->frame[w->depth].name = p;
                w->at_n = w->frame[w->depth].name_n = n;
        }
        return end;
}

/* At a bracket c: whether it opened or closed a frame the walk keeps. */
static bool walk_nest(Walk *w, char c) {
        bool open = c == '{' || c == '(' || c == '[';
        if (w->deeper || (open && w->depth + 1 == WALK_DEPTH)) {
                w->deeper += open ? 1 : -1;
                return false;
        }
        if (!open) {
                if (w->depth == 0) /* one too many: a syntax error libconfig reports */
                        return false;
                w->depth--;
                return true;
        }
        w->depth++;
        w->frame[w->depth].open = c;
        w->frame[w->depth].name = NULL;
        w->frame[w->depth].index = 0;
        return true;
}

static WalkStop walk_next(Walk *w) {
        const char *p;
        for (p = w->p; *p; p++) {
                WalkStop stop;
                if (*p == '\n')
                        w->line++;
                else if (*p == '"')
                        p = skip_string(p, &w->line);
                else if (*p == '#' || (p[0] == '/' && p[1] == '/'))
                        p += strcspn(p, "\n") - 1;
                else if (p[0] == '/' && p[1] == '*')
                        p = skip_comment(p, &w->line);
                else if (strchr("{([})]", *p)) {
                        if (walk_nest(w, *p)) {
                                w->p = p + 1;
                                return strchr("{([", *p) ? WALK_OPEN : WALK_CLOSE;
                        }
                } else if (*p == ',' && !w->deeper && w->frame[w->depth].open != '{')
                        w->frame[w->depth].index++;
                else if (*p >= '0' && *p <= '9' && number_starts(w->text, p)) {
                        w->at = p;
                        w->p = p + 1;
                        return WALK_NUMBER;
                } else if (name_start(*p) && (p == w->text || !name_char(p[-1]))) {
                        w->p = walk_name(w, p, &stop);
                        if (stop != WALK_END)
                                return stop;
                        p = w->p - 1;
                } else if (strncmp(p, "@include", 8) == 0) {
                        w->p = p + 8;
                        return WALK_INCLUDE;
                }
        }
        w->p = p;
        return WALK_END;
}

/* The full path of where the walk stopped: "network.max_tensor" for a name
 * or the number it is set to, "network.peers.[1]" for an element. */
static void walk_path(const Walk *w, char *buf, size_t len) {
        size_t used = 0;
        buf[0] = '\0';
        for (int i = 0; i <= w->depth && used < len; i++) {
                const char *sep = used ? "." : "";
                if (w->frame[i].open != '{')
                        used += (size_t)snprintf(buf + used, len - used, "%s[%d]", sep, w->frame[i].index);
                else if (w->frame[i].name)
                        used += (size_t)snprintf(buf + used, len - used, "%s%.*s", sep, (int)w->frame[i].name_n,
                                                 w->frame[i].name);
        }
}

/* The number whose first digit the walk stopped at: one that does not fit
 * what libconfig 1.5 reads it into is appended to d, and *bad set: without
 * the L suffix an integer is read into 32 bits, its other bits dropped
 * (99999999999 reads as 1215752191, 4294967296 as 0; a hex one from
 * 0x80000000 up as negative), and with it one past 64 bits as the largest.
 * The walk goes on after it. */
static void check_number(const char *path, Walk *w, bool *bad, Diag *d) {
        const char *p = w->at, *start = p > w->text && (p[-1] == '-' || p[-1] == '+') ? p - 1 : p;
        bool hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
        const char *end = p + (hex ? 2 + strspn(p + 2, "0123456789abcdefABCDEF") : strspn(p, "0123456789"));
        if (!hex && (*end == '.' || *end == 'e' || *end == 'E')) { /* a float */
                w->p = end + strspn(end, "0123456789.eE+-");
                return;
        }
        bool wide = *end == 'L';
        w->p = end + wide;
        char num[80], name[256];
        snprintf(num, sizeof num, "%.*s", (int)(end - start), start);
        errno = 0;
        long long v = hex ? (long long)strtoull(num, NULL, 16) : strtoll(num, NULL, 10);
        bool past64 = errno == ERANGE || (hex && strlen(num) > 18);
        if (!past64 && (wide || (hex ? (unsigned long long)v <= 0x7fffffffull : v >= INT32_MIN && v <= INT32_MAX)))
                return;
        walk_path(w, name, sizeof name);
        if (past64)
                diag_append(d, "%s:%d: %s: %s%s does not fit 64 bits", path, w->line, name, num, wide ? "L" : "");
        else
                diag_append(d, "%s:%d: %s: %s is read as a 32-bit integer: write %sL", path, w->line, name, num,
                            num);
        *bad = true;
}

/* Every integer the file writes, wherever it stands (a setting, an array,
 * a line of any length), must fit what it is read into (check_number());
 * -ERANGE naming the file, the line, the setting and the number of each
 * that does not. An @include, which libconfig would open relative to the
 * working directory and read unchecked, is -EINVAL. */
static int check_integers(const char *path, const char *text, Diag *d) {
        Walk w;
        bool bad = false;
        if (d)
                d->text[0] = '\0';
        walk_start(&w, text);
        for (WalkStop s; (s = walk_next(&w)) != WALK_END;) {
                if (s == WALK_INCLUDE)
                        return diag_set(d, -EINVAL, "%s:%d: @include is not supported: write every setting in this "
                                        "file", path, w.line);
                if (s == WALK_NUMBER)
                        check_number(path, &w, &bad, d);
        }
        return bad ? -ERANGE : 0;
}

/* The setting libconfig found set twice: the first name the text sets a
 * second time in the same group (libconfig stops at it), its full path in
 * buf and its line in *ret_line. False when there is none (or no memory). */
static bool find_duplicate(const char *text, char *buf, size_t len, int *ret_line) {
        _cleanup_(freep) const char **names = NULL; /* set in the frames open, outermost first */
        size_t n = 0, cap = 0, base[WALK_DEPTH] = {};
        Walk w;

        walk_start(&w, text);
        for (WalkStop s; (s = walk_next(&w)) != WALK_END;) {
                if (s == WALK_OPEN)
                        base[w.depth] = n;
                else if (s == WALK_CLOSE)
                        n = base[w.depth + 1];
                if (s != WALK_NAME || w.frame[w.depth].open != '{')
                        continue;
                for (size_t k = base[w.depth]; k < n; k++)
                        if (strncmp(names[k], w.at, w.at_n) == 0 && !name_char(names[k][w.at_n])) {
                                walk_path(&w, buf, len);
                                *ret_line = w.line;
                                return true;
                        }
                if (n == cap) {
                        const char **more = reallocarray(names, cap = cap ? 2 * cap : 64, sizeof *names);
                        if (!more)
                                return false;
                        names = more;
                }
                names[n++] = w.at;
        }
        return false;
}

/* libconfig looks each name up among those its group already holds, one by
 * one: a group of n settings costs n * n / 2 comparisons (40000 took 8 s,
 * 500 groups of 4096 took 50). -E2BIG for a group of more than
 * CONF_GROUP_MAX, or more than CONF_LARGE_MAX settings in the file past the
 * CONF_GROUP_SMALLth of their group, naming the file, the line where the
 * bound is passed and the group. Words nested deeper than the walk follows
 * count as one group. */
static int check_group_sizes(const char *path, const char *text, Diag *d) {
        int count[WALK_DEPTH] = {}, deep = 0, large = 0;
        Walk w;

        walk_start(&w, text);
        for (WalkStop s; (s = walk_next(&w)) != WALK_END;) {
                if (s == WALK_OPEN)
                        count[w.depth] = 0;
                if (s != WALK_NAME && s != WALK_DEEP_NAME)
                        continue;
                int n = s == WALK_NAME ? ++count[w.depth] : ++deep;
                large += n > CONF_GROUP_SMALL;
                if (n <= CONF_GROUP_MAX && large <= CONF_LARGE_MAX)
                        continue;
                char group[256];
                if (s == WALK_NAME)
                        w.frame[w.depth].name = NULL; /* the group's path, not the name's */
                walk_path(&w, group, sizeof group);
                if (!group[0])
                        strcpy(group, "(top level)");
                if (n > CONF_GROUP_MAX)
                        return diag_set(d, -E2BIG, "%s:%d: %s: more than %d settings in one group", path, w.line,
                                        group, CONF_GROUP_MAX);
                return diag_set(d, -E2BIG, "%s:%d: %s: more than %d settings in the file past the %dth of their "
                                "group", path, w.line, group, CONF_LARGE_MAX, CONF_GROUP_SMALL);
        }
        return 0;
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
        if ((r = check_group_sizes(path, source, d)) < 0)
                return r;
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
        /* libconfig names the line only: name the setting of a duplicate
         * by its full path, and quote the line of a syntax error. */
        const char *file = config_error_file(c) ?: path, *text = config_error_text(c) ?: "syntax error";
        int line = config_error_line(c);
        char quote[160];
        source_line(file, line, quote, sizeof quote);
        char name[256];
        int name_line;
        if (strstr(text, "duplicate setting") && find_duplicate(source, name, sizeof name, &name_line) &&
            name_line == line)
                return diag_set(d, -EINVAL, "%s:%d: %s: set twice in the same group", file, name_line, name);
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
        char path[512], raw[384], msg[384];
        const char *file = config_setting_source_file(s);
        va_list ap;

        setting_path(s, path, sizeof path);
        if (name) {
                size_t used = strlen(path);
                snprintf(path + used, sizeof path - used, "%s%s", used ? "." : "", name);
        }
        va_start(ap, fmt);
        vsnprintf(raw, sizeof raw, fmt, ap);
        va_end(ap);
        escape(raw, msg, sizeof msg); /* a string it quotes from the file */
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

int conf_int(const config_setting_t *s, long long lo, long long hi, long long *ret, Diag *d) {
        long long v;

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

int conf_get_int(const config_setting_t *group, const char *name, bool required, long long lo,
                 long long hi, long long def, long long *ret, Diag *d) {
        config_setting_t *s = member(group, name);

        if (!s) {
                if (required)
                        return conf_error(group, name, -EINVAL, d, "missing (required)");
                *ret = def;
                return 0;
        }
        return conf_int(s, lo, hi, ret, d);
}

const char *conf_number(double v, char buf[CONF_NUMBER_MAX]) {
        for (int digits = 6; digits <= 17; digits++) { /* %g's, unless it reads back otherwise */
                snprintf(buf, CONF_NUMBER_MAX, "%.*g", digits, v);
                if (strtod(buf, NULL) == v)
                        break;
        }
        return buf;
}

int conf_get_double(const config_setting_t *group, const char *name, bool required, double lo,
                    double hi, double def, double *ret, Diag *d) {
        config_setting_t *s = member(group, name);
        char lo_text[CONF_NUMBER_MAX], hi_text[CONF_NUMBER_MAX], v_text[CONF_NUMBER_MAX];
        double v;

        if (!s) {
                if (required)
                        return conf_error(group, name, -EINVAL, d, "missing (required)");
                *ret = def;
                return 0;
        }
        conf_number(lo, lo_text);
        conf_number(hi, hi_text);
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
                return conf_error(s, NULL, -EINVAL, d, "must be a number in [%s, %s]", lo_text, hi_text);
        }
        if (!(v >= lo && v <= hi))
                return conf_error(s, NULL, -ERANGE, d, "must be a number in [%s, %s], got %s", lo_text, hi_text,
                                  conf_number(v, v_text));
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
