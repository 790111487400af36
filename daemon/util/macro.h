/* util/macro.h — ownership and small helpers used everywhere.
 *
 * Ownership is visible in the code: a pointer declared
 *
 *     _cleanup_(arena_freep) Arena *a = NULL;
 *
 * is released when it leaves scope, and TAKE_PTR(a) hands it on to the caller.
 * Destructors accept NULL and return NULL, so `x = foo_free(x);` is safe.
 */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)
#define _warn_unused_result_ __attribute__((warn_unused_result))

/* Hot elementwise loops are compiled for AVX-512, AVX2 and the baseline,
 * and the loader picks the best the CPU has (GCC function multiversioning),
 * so packages built for generic x86-64 still run wide vectors. Not under
 * ThreadSanitizer: the loader runs the resolvers before its runtime is up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define _simd_clones_ __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define _simd_clones_
#endif

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define CLAMP(x, lo, hi) MIN(MAX(x, lo), hi)
#define ALIGN_TO(x, a) (((x) + (a) - 1) & ~((size_t)(a) - 1))

/* Take ownership out of a variable, leaving NULL behind. */
#define TAKE_PTR(p)                                                                                \
        ({                                                                                         \
                __typeof__(p) _p_ = (p);                                                           \
                (p) = NULL;                                                                        \
                _p_;                                                                               \
        })

#define TAKE_FD(fd) ({ int _fd_ = (fd); (fd) = -1; _fd_; })

/* Define a `name##p` helper for _cleanup_ from a destructor taking T *. */
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)                                                    \
        static inline void func##p(type *p) {                                                      \
                if (*p)                                                                            \
                        *p = func(*p);                                                             \
        }

/* name##_to_string() and name##_from_string() for an enum whose values
 * 0..max-1 index table; from_string returns invalid for an unknown name. */
#define DEFINE_STRING_TABLE_LOOKUP(name, type, table, max, invalid)                               \
        const char *name##_to_string(type v) {                                                     \
                return (int)v >= 0 && (int)v < (max) ? table[v] : NULL;                             \
        }                                                                                          \
        type name##_from_string(const char *s) {                                                   \
                for (int _i = 0; s && _i < (max); _i++)                                            \
                        if (table[_i] && strcmp(s, table[_i]) == 0)                                \
                                return (type)_i;                                                   \
                return (invalid);                                                                  \
        }

static inline void *mfree(void *p) {
        free(p);
        return NULL;
}
static inline void freep(void *p) {
        free(*(void **)p);
}
static inline void closep(int *fd) {
        if (*fd >= 0) {
                int saved = errno;
                close(*fd);
                errno = saved;
        }
}

/* Checked size arithmetic: every length that comes from a file or a peer goes
 * through these before it reaches an allocator. Return false on overflow. */
static inline _warn_unused_result_ int size_mul(size_t a, size_t b, size_t *ret) {
        return !__builtin_mul_overflow(a, b, ret);
}
static inline _warn_unused_result_ int size_add(size_t a, size_t b, size_t *ret) {
        return !__builtin_add_overflow(a, b, ret);
}
