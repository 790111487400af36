/* tensor/pool.c */
#include "pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define POOL_MAX_THREADS 256
#define POOL_SPIN 20000
#define POOL_PARTS 2

typedef struct Worker {
        struct Pool *pool;
        int index;
} Worker;

struct Pool {
        int n_threads;
        Worker workers[POOL_MAX_THREADS];
        pthread_t threads[POOL_MAX_THREADS];
        _Atomic uint32_t generation; /* bumped for every job; workers wait on it */
        _Atomic uint32_t pending;    /* workers still running the current job */
        _Atomic int quit;
        PoolRangeFn fn;
        void *ctx;
        size_t n;
        size_t per;              /* elements of one part (the last may be short) */
        size_t n_parts;
        _Atomic size_t next;     /* the next part to claim */
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
        syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
        syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
}

/* Claim parts of the current job until none is left. */
static void run_parts(Pool *p) {
        size_t k;
        while ((k = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < p->n_parts) {
                size_t lo = k * p->per;
                p->fn(p->ctx, lo, MIN(p->n, lo + p->per));
        }
}


static void *worker_main(void *arg) {
        Pool *p = ((Worker *)arg)->pool;
        uint32_t seen = 0; /* the generation at creation: a job posted before this thread ran is not missed */

        for (;;) {
                uint32_t g;
                int spins = 0;
                while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
                        if (atomic_load(&p->quit))
                                return NULL;
                        if (++spins < POOL_SPIN)
                                cpu_relax();
                        else
                                futex_wait(&p->generation, seen);
                }
                seen = g;
                if (atomic_load(&p->quit))
                        return NULL;

                run_parts(p);
                atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
        }
}

int pool_new(int n_threads, Pool **ret) {
        if (n_threads < 1 || n_threads > POOL_MAX_THREADS)
                return -EINVAL;
        Pool *p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        p->n_threads = 1;
        for (int i = 1; i < n_threads; i++) {
                Worker *w = &p->workers[i];
                *w = (Worker){ p, i };
                int r = pthread_create(&p->threads[i], NULL, worker_main, w);
                if (r != 0) {
                        pool_free(p);
                        return -r;
                }
                p->n_threads++;
        }
        *ret = p;
        return 0;
}

Pool *pool_free(Pool *p) {
        if (!p)
                return NULL;
        atomic_store(&p->quit, 1);
        atomic_fetch_add(&p->generation, 1);
        futex_wake_all(&p->generation);
        for (int i = 1; i < p->n_threads; i++)
                pthread_join(p->threads[i], NULL);
        free(p);
        return NULL;
}

int pool_threads(const Pool *p) {
        return p ? p->n_threads : 1;
}

void pool_for(Pool *p, size_t n, size_t grain, PoolRangeFn fn, void *ctx) {
        size_t align = grain < 16 ? 1 : 16;
        if (!p || p->n_threads == 1 || n < MAX(grain, align) * 2) {
                if (n)
                        fn(ctx, 0, n);
                return;
        }
        /* POOL_PARTS parts per thread, claimed as threads come free: a
         * thread that another process holds off its core (the cores are
         * shared) leaves its share to the others instead of holding up the
         * whole job. */
        size_t parts = (size_t)p->n_threads * POOL_PARTS;
        size_t per = ALIGN_TO(MAX((n + parts - 1) / parts, grain), align);
        p->fn = fn;
        p->ctx = ctx;
        p->n = n;
        p->per = per;
        p->n_parts = (n + per - 1) / per;
        atomic_store_explicit(&p->next, 0, memory_order_relaxed);
        atomic_store(&p->pending, (uint32_t)(p->n_threads - 1));
        atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
        futex_wake_all(&p->generation);

        run_parts(p);
        while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
                cpu_relax();
}
