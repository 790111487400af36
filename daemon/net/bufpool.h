/* net/bufpool.h — the region tensors are received into.
 *
 * One mmap'd region, cut into 64 KiB pages, handed out as contiguous runs:
 * a payload is received straight into the buffer the application gets,
 * and a page is touched (counted in RSS) only once a tensor needed it. A
 * request the region cannot hold returns NULL and the caller falls back to
 * plain memory.
 *
 *     BufPool *p;
 *     bufpool_new(64 << 20, &p);
 *     uint8_t *b = bufpool_alloc(p, n);    // NULL: full
 *     bufpool_free(p, b, n);
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/macro.h"

#define BUFPOOL_PAGE (64u << 10)

typedef struct BufPool {
        uint8_t *base;
        size_t size;    /* bytes */
        size_t n_pages;
        uint8_t *used;  /* one byte per page */
        size_t in_use;  /* bytes */
} BufPool;

int bufpool_new(size_t bytes, BufPool **ret);
BufPool *bufpool_free_all(BufPool *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(BufPool *, bufpool_free_all);

void *bufpool_alloc(BufPool *p, size_t n);
void bufpool_free(BufPool *p, void *buf, size_t n);
static inline bool bufpool_owns(const BufPool *p, const void *buf) {
        return p && (const uint8_t *)buf >= p->base && (const uint8_t *)buf < p->base + p->size;
}
