/* tensor/arena.h — bump allocator that owns the memory of a model or a batch.
 *
 * Every buffer of a training stage (parameter slab, gradient slab, optimizer
 * state, activations) comes from one arena, 64-byte aligned for AVX-512, and
 * one arena_free() releases it all.
 *
 *     _cleanup_(arena_freep) Arena *a = NULL;
 *     r = arena_new(&a);
 *     float *w = arena_alloc_floats(a, n);   // zeroed; NULL on -ENOMEM
 */
#pragma once

#include <stddef.h>

#include "util/macro.h"

#define ARENA_ALIGN 64

typedef struct Arena Arena;

int arena_new(Arena **ret);
Arena *arena_free(Arena *a);
DEFINE_TRIVIAL_CLEANUP_FUNC(Arena *, arena_free);

/* Zeroed, ARENA_ALIGN-aligned memory that lives as long as the arena.
 * Returns NULL on overflow or out of memory. */
void *arena_alloc(Arena *a, size_t bytes);
float *arena_alloc_floats(Arena *a, size_t n);

/* Bytes handed out so far (for memory reports). */
size_t arena_used(const Arena *a);
