/* conf/nodes-file.c */
#include "nodes-file.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

int nodes_file_parse_size(const char *text, uint64_t *ret) {
        char *end;
        errno = 0;
        if (!text[0] || strchr(text, '-'))
                return -EINVAL;
        double v = strtod(text, &end);
        if (errno || end == text || !(v >= 0) || !isfinite(v))
                return -EINVAL;
        double unit = 1;
        switch (*end) {
        case 'K': case 'k': unit = 1024.0; end++; break;
        case 'M': case 'm': unit = 1024.0 * 1024; end++; break;
        case 'G': case 'g': unit = 1024.0 * 1024 * 1024; end++; break;
        case 'T': case 't': unit = 1024.0 * 1024 * 1024 * 1024; end++; break;
        }
        if (*end == 'i' && unit > 1) /* "2GiB" */
                end++;
        if (*end == 'B' && unit > 1)
                end++;
        if (*end)
                return -EINVAL;
        v *= unit;
        if (v >= 18446744073709551615.0)
                return -ERANGE;
        *ret = (uint64_t)v;
        return 0;
}

static int get_memory(const config_setting_t *g, uint64_t *ret, Diag *d) {
        static const uint64_t lo = 1ull << 20, hi = 1ull << 50;
        config_setting_t *s = config_setting_get_member(g, "memory");
        uint64_t v;

        if (!s)
                return conf_error(g, "memory", -EINVAL, d, "missing (required)");
        switch (config_setting_type(s)) {
        case CONFIG_TYPE_INT:
                v = config_setting_get_int(s) < 0 ? 0 : (uint64_t)config_setting_get_int(s);
                break;
        case CONFIG_TYPE_INT64:
                v = config_setting_get_int64(s) < 0 ? 0 : (uint64_t)config_setting_get_int64(s);
                break;
        case CONFIG_TYPE_STRING:
                if (nodes_file_parse_size(config_setting_get_string(s), &v) < 0)
                        return conf_error(s, NULL, -EINVAL, d, "must be bytes, or a size like \"512M\" or \"2G\", got \"%s\"",
                                          config_setting_get_string(s));
                break;
        default:
                return conf_error(s, NULL, -EINVAL, d, "must be bytes, or a size like \"512M\" or \"2G\"");
        }
        if (v < lo || v > hi)
                return conf_error(s, NULL, -ERANGE, d, "must be between 1M and 1024T");
        *ret = v;
        return 0;
}

static int parse_node(const config_setting_t *s, char *name, Capability *c, Diag *d) {
        static const char *const keys[] = { "name", "gflops", "memory", "bandwidth", "latency", NULL };
        double gflops, bw, lat;
        int r;

        if (!config_setting_is_group(s))
                return conf_error(s, NULL, -EINVAL, d, "a node must be a group { name = \"...\"; gflops = ...; ... }");
        if ((r = conf_check_keys(s, keys, d)) < 0 ||
            (r = conf_get_string(s, "name", true, NULL, name, NODES_FILE_NAME_MAX, d)) < 0 ||
            (r = conf_get_double(s, "gflops", true, 0.001, 1e6, 0, &gflops, d)) < 0 ||
            (r = get_memory(s, &c->memory, d)) < 0 ||
            (r = conf_get_double(s, "bandwidth", true, 0.001, 1e7, 0, &bw, d)) < 0 ||
            (r = conf_get_double(s, "latency", false, 0, 1e5, 0.5, &lat, d)) < 0)
                return r;
        if (!name[0])
                return conf_error(s, "name", -EINVAL, d, "must not be empty");
        c->gflops = gflops;
        c->bandwidth = bw * 1e6 / 8;
        c->latency = lat * 1e-3;
        return 0;
}

static int by_name(const void *a, const void *b, void *names) {
        char (*nm)[NODES_FILE_NAME_MAX] = names;
        return strcmp(nm[*(const int *)a], nm[*(const int *)b]);
}

int nodes_file_load(const char *path, NodesFile *ret, Diag *d) {
        config_t c;
        config_setting_t *list;
        NodesFile f = {};
        _cleanup_(freep) int *order = NULL;
        int r;

        config_init(&c);
        if ((r = conf_read_file(&c, path, d)) < 0)
                goto out;
        const config_setting_t *root = config_root_setting(&c);
        static const char *const keys[] = { "nodes", NULL };
        if ((r = conf_check_keys(root, keys, d)) < 0 || (r = conf_get_group(root, "nodes", true, true, &list, d)) < 0)
                goto out;
        f.n = config_setting_length(list);
        if (f.n < 1 || f.n > NODES_FILE_MAX) {
                r = conf_error(list, NULL, -EINVAL, d, "must list 1 to %d nodes", NODES_FILE_MAX);
                goto out;
        }
        f.names = calloc((size_t)f.n, sizeof *f.names);
        f.caps = calloc((size_t)f.n, sizeof *f.caps);
        order = malloc(sizeof(int) * (size_t)f.n);
        if (!f.names || !f.caps || !order) {
                r = diag_set(d, -ENOMEM, "%s: out of memory", path);
                goto out;
        }
        for (int i = 0; i < f.n; i++) {
                if ((r = parse_node(config_setting_get_elem(list, (unsigned)i), f.names[i], &f.caps[i], d)) < 0)
                        goto out;
                order[i] = i;
        }
        qsort_r(order, (size_t)f.n, sizeof(int), by_name, f.names);
        for (int i = 1; i < f.n; i++)
                if (strcmp(f.names[order[i - 1]], f.names[order[i]]) == 0) {
                        int later = MAX(order[i - 1], order[i]);
                        r = conf_error(config_setting_get_elem(list, (unsigned)later), "name", -EEXIST, d,
                                       "\"%s\" names another node too", f.names[later]);
                        goto out;
                }
        *ret = f;
        f = (NodesFile){};
        r = 0;
out:
        nodes_file_free(&f);
        config_destroy(&c);
        return r;
}

void nodes_file_free(NodesFile *f) {
        if (!f)
                return;
        free(f->names);
        free(f->caps);
        *f = (NodesFile){};
}
