/* net/bufpool.c — first fit over a page map, from the bottom: a buffer
 * freed a moment ago is the next one handed out, still in the cache, and
 * pages at the top are never touched unless needed. Pools are small
 * (hundreds of pages), so a scan is cheap. */
#include "bufpool.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int bufpool_new(size_t bytes, BufPool **ret) {
        BufPool *p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        p->n_pages = (bytes + BUFPOOL_PAGE - 1) / BUFPOOL_PAGE;
        p->size = p->n_pages * BUFPOOL_PAGE;
        if (p->size) {
                p->base = mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p->base == MAP_FAILED) {
                        free(p);
                        return -ENOMEM;
                }
        }
        p->used = calloc(p->n_pages + 1, 1);
        if (!p->used) {
                bufpool_free_all(p);
                return -ENOMEM;
        }
        *ret = p;
        return 0;
}

BufPool *bufpool_free_all(BufPool *p) {
        if (!p)
                return NULL;
        if (p->base && p->base != MAP_FAILED)
                munmap(p->base, p->size);
        free(p->used);
        free(p);
        return NULL;
}

static size_t pages_for(size_t n) {
        return n ? (n + BUFPOOL_PAGE - 1) / BUFPOOL_PAGE : 1;
}

void *bufpool_alloc(BufPool *p, size_t n) {
        size_t want = pages_for(n);

        if (!p || want > p->n_pages)
                return NULL;
        size_t run = 0;
        for (size_t i = 0; i < p->n_pages; i++) {
                run = p->used[i] ? 0 : run + 1;
                if (run == want) {
                        size_t first = i + 1 - want;
                        memset(p->used + first, 1, want);
                        p->in_use += want * BUFPOOL_PAGE;
                        return p->base + first * BUFPOOL_PAGE;
                }
        }
        return NULL;
}

void bufpool_free(BufPool *p, void *buf, size_t n) {
        if (!bufpool_owns(p, buf))
                return;
        size_t first = (size_t)((uint8_t *)buf - p->base) / BUFPOOL_PAGE, k = pages_for(n);
        memset(p->used + first, 0, k);
        p->in_use -= k * BUFPOOL_PAGE;
}
