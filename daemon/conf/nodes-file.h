/* conf/nodes-file.h — a list of nodes and their capabilities, read from a
 * libconfig file, for planning clusters offline (`ravnestctl plan`, see
 * ravnestctl(1)):
 *
 *     nodes = (
 *       { name = "a"; gflops = 80.0; memory = "2G"; bandwidth = 1000.0; latency = 0.5; },
 *       ...
 *     );
 *
 * gflops: sustained GFLOP/s of one compute thread; memory: bytes it may use,
 * an integer or a string with a K, M, G or T suffix (powers of 1024), from
 * 1K to 1024T;
 * bandwidth: Mbit/s of its link; latency: milliseconds, one way. Every value
 * is bounded; errors name the file, the line and the setting.
 *
 *     NodesFile nf = {};
 *     r = nodes_file_load("nodes.conf", &nf, &d);
 *     ...formation_run(&fm, nf.caps, nf.n, ...)...
 *     nodes_file_free(&nf);
 */
#pragma once

#include <libconfig.h>

#include "cluster/capability.h"
#include "util/diag.h"

#define NODES_FILE_MAX 100000
#define NODES_FILE_NAME_MAX 64

typedef struct NodesFile {
        int n;
        char (*names)[NODES_FILE_NAME_MAX];
        Capability *caps; /* bandwidth in bytes/s, latency in s */
} NodesFile;

int nodes_file_load(const char *path, NodesFile *ret, Diag *d);
void nodes_file_free(NodesFile *f);
/* A node's memory, from 1K to 1024T (a small model's replica fits in less than 1M): the same bounds in a nodes file and
 * in ravnestd.conf's membership.memory. */
#define NODES_FILE_MEMORY_MIN (1ll << 10)
#define NODES_FILE_MEMORY_MAX (1ll << 50)
/* "2G", "512M", "1.5T", "1048576": bytes. Digits, an optional fraction and
 * one K, M, G or T (powers of 1024), nothing else: -EINVAL if malformed,
 * -ERANGE outside the bounds. */
int nodes_file_parse_size(const char *text, uint64_t *ret);
/* Setting s, an integer or such a string, into *ret; -errno with the file,
 * the line and the setting in d. */
int nodes_file_get_memory(const config_setting_t *s, uint64_t *ret, Diag *d);
