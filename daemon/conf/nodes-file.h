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
 * an integer or a string with a K, M, G or T suffix (powers of 1024);
 * bandwidth: Mbit/s of its link; latency: milliseconds, one way. Every value
 * is bounded; errors name the file, the line and the setting.
 *
 *     NodesFile nf = {};
 *     r = nodes_file_load("nodes.conf", &nf, &d);
 *     ...formation_run(&fm, nf.caps, nf.n, ...)...
 *     nodes_file_free(&nf);
 */
#pragma once

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
/* "2G", "512M", "1.5T", "1048576": bytes. -EINVAL if malformed, -ERANGE on overflow. */
int nodes_file_parse_size(const char *text, uint64_t *ret);
