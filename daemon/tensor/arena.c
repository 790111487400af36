/* tensor/arena.c — a list of blocks; large requests get a block of their own. */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ARENA_BLOCK (1u << 20)
#define HUGE_PAGE (2u << 20)

typedef struct Block {
        struct Block *next;
        size_t size, used;
        unsigned char *data;
} Block;

struct Arena {
        Block *head;
        size_t used;
};

int arena_new(Arena **ret) {
        Arena *a = calloc(1, sizeof *a);
        if (!a)
                return -ENOMEM;
        *ret = a;
        return 0;
}

Arena *arena_free(Arena *a) {
        if (!a)
                return NULL;
        for (Block *b = a->head, *n; b; b = n) {
                n = b->next;
                free(b->data);
                free(b);
        }
        free(a);
        return NULL;
}

static Block *block_new(size_t size) {
        Block *b = calloc(1, sizeof *b);
        size_t align = ARENA_ALIGN;

        if (!b)
                return NULL;
        /* Slabs of megabytes are streamed by every step: back them with
         * transparent huge pages where the kernel offers them (madvise mode),
         * which saves TLB misses in the gemms and the optimizer. */
        if (size >= HUGE_PAGE) {
                align = HUGE_PAGE;
                size = ALIGN_TO(size, HUGE_PAGE);
        }
        if (posix_memalign((void **)&b->data, align, size) != 0) {
                free(b);
                return NULL;
        }
        if (align == HUGE_PAGE)
                (void)madvise(b->data, size, MADV_HUGEPAGE); /* a hint: failure changes nothing */
        b->size = size;
        return b;
}

void *arena_alloc(Arena *a, size_t bytes) {
        size_t need;

        if (!size_add(bytes, ARENA_ALIGN - 1, &need))
                return NULL;
        need = ALIGN_TO(bytes, ARENA_ALIGN);
        if (need == 0)
                need = ARENA_ALIGN;

        Block *b = a->head;
        if (!b || b->size - b->used < need) {
                if (need >= ARENA_BLOCK / 4) {
                        /* Big buffers get their own block, behind the current one,
                         * so the small-allocation block keeps being filled. */
                        Block *big = block_new(need);
                        if (!big)
                                return NULL;
                        big->used = need;
                        if (b) {
                                big->next = b->next;
                                b->next = big;
                        } else
                                a->head = big;
                        a->used += need;
                        memset(big->data, 0, need);
                        return big->data;
                }
                b = block_new(ARENA_BLOCK);
                if (!b)
                        return NULL;
                b->next = a->head;
                a->head = b;
        }
        void *p = b->data + b->used;
        b->used += need;
        a->used += need;
        memset(p, 0, need);
        return p;
}

float *arena_alloc_floats(Arena *a, size_t n) {
        size_t bytes;
        if (!size_mul(n, sizeof(float), &bytes))
                return NULL;
        return arena_alloc(a, bytes);
}

size_t arena_used(const Arena *a) {
        return a->used;
}
