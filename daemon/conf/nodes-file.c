/* conf/nodes-file.c */
#include "nodes-file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

int nodes_file_parse_size(const char *text, uint64_t *ret) {
        static const char units[] = "KMGT";
        size_t whole = strspn(text, "0123456789"), n = whole;
        if (whole == 0)
                return -EINVAL;
        if (text[n] == '.') {
                size_t fraction = strspn(text + n + 1, "0123456789");
                if (fraction == 0)
                        return -EINVAL;
                n += 1 + fraction;
        }
        const char *unit = text[n] ? strchr(units, text[n]) : NULL;
        if (text[n] && (!unit || text[n + 1]))
                return -EINVAL;
        /* digits and a point only: strtod() reads no hex, sign or space here */
        double v = strtod(text, NULL) * (double)(1ull << (unit ? 10 * (unit - units + 1) : 0));
        if (!(v >= NODES_FILE_MEMORY_MIN && v <= NODES_FILE_MEMORY_MAX))
                return -ERANGE;
        *ret = (uint64_t)v;
        return 0;
}

int nodes_file_get_memory(const config_setting_t *s, uint64_t *ret, Diag *d) {
        uint64_t v = 0;
        int r = -ERANGE;

        switch (config_setting_type(s)) {
        case CONFIG_TYPE_INT:
        case CONFIG_TYPE_INT64: {
                long long ll = config_setting_get_int64(s);
                v = (uint64_t)ll;
                if (ll >= NODES_FILE_MEMORY_MIN && ll <= NODES_FILE_MEMORY_MAX)
                        r = 0;
                break;
        }
        case CONFIG_TYPE_STRING:
                if ((r = nodes_file_parse_size(config_setting_get_string(s), &v)) == -EINVAL)
                        return conf_error(s, NULL, r, d, "must be bytes, or a size like \"512M\" or \"1.5G\" "
                                          "(K, M, G or T: powers of 1024), got \"%s\"", config_setting_get_string(s));
                break;
        default:
                return conf_error(s, NULL, -EINVAL, d, "must be bytes, or a size like \"512M\" or \"1.5G\"");
        }
        if (r < 0)
                return conf_error(s, NULL, r, d, "must be between 1K and 1024T (1024 to 1125899906842624 bytes)");
        *ret = v;
        return 0;
}

static int get_memory(const config_setting_t *g, uint64_t *ret, Diag *d) {
        config_setting_t *s = config_setting_get_member(g, "memory");
        if (!s)
                return conf_error(g, "memory", -EINVAL, d, "missing (required)");
        return nodes_file_get_memory(s, ret, d);
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
