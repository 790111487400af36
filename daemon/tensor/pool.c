/* tensor/pool.c
 *
 * A job is cut into parts that threads claim with a compare-and-swap on one
 * 64-bit ticket, (job number << 32) | next part, so a thread that wakes late
 * can never claim a part of a later job with a stale view of the current
 * one; the caller closes the ticket before it writes the next job. The job
 * is done when all its parts are, whoever ran them: the caller
 * never waits for a worker that another process keeps off its core unless
 * that worker holds a part. Waiting spins briefly, then sleeps on a futex. */
#include "pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define POOL_MAX_THREADS 256
/* Pause loops (about 0.1 ms) before a waiting thread sleeps: jobs follow
 * each other closely during a training step, but a spinning thread on a
 * core shared with another process takes that process's time or ours. */
#define POOL_SPIN 2000
#define POOL_PARTS 2

struct Pool {
        int n_threads;
        pthread_t threads[POOL_MAX_THREADS];
        _Atomic uint32_t generation; /* the current job's number; workers wait on it */
        _Atomic uint64_t ticket;     /* generation << 32 | the next part to claim */
        _Atomic uint32_t done;       /* parts of the current job finished */
        _Atomic uint32_t sleepers;   /* workers asleep on generation */
        _Atomic uint32_t caller_asleep;
        _Atomic int quit;
        PoolRangeFn fn;
        void *ctx;
        size_t n;
        size_t per; /* elements of one part (the last may be short) */
        _Atomic uint32_t n_parts; /* read before a claim, racing with the next job: atomic */
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

/* Claim parts of job gen until none is left. The job's fields are read only
 * after a claim succeeds: the job cannot end (and the caller cannot post the
 * next) while a claimed part is unfinished. */
static void run_parts(Pool *p, uint32_t gen) {
        uint64_t t = atomic_load(&p->ticket);
        for (;;) {
                /* acquire: a count of the next job comes with its closed ticket */
                uint32_t parts = atomic_load_explicit(&p->n_parts, memory_order_acquire);
                if ((uint32_t)(t >> 32) != gen || (uint32_t)t >= parts)
                        return;
                if (!atomic_compare_exchange_weak(&p->ticket, &t, t + 1))
                        continue; /* t now holds the current ticket */
                size_t lo = (size_t)(uint32_t)t * p->per;
                p->fn(p->ctx, lo, MIN(p->n, lo + p->per));
                if (atomic_fetch_add(&p->done, 1) + 1 == parts && atomic_load(&p->caller_asleep))
                        futex_wake_all(&p->done);
                t = atomic_load(&p->ticket);
        }
}

static void *worker_main(void *arg) {
        Pool *p = arg;
        uint32_t seen = 0; /* the generation at creation: a job posted before this thread ran is not missed */

        for (;;) {
                uint32_t g;
                int spins = 0;
                while ((g = atomic_load(&p->generation)) == seen) {
                        if (atomic_load(&p->quit))
                                return NULL;
                        if (++spins < POOL_SPIN) {
                                cpu_relax();
                                continue;
                        }
                        atomic_fetch_add(&p->sleepers, 1);
                        futex_wait(&p->generation, seen);
                        atomic_fetch_sub(&p->sleepers, 1);
                }
                seen = g;
                if (atomic_load(&p->quit))
                        return NULL;
                run_parts(p, g);
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
                int r = pthread_create(&p->threads[i], NULL, worker_main, p);
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
        /* coarse tasks (attention's heads, a block's fused steps) are
         * claimed one at a time: they are few and each is worth a claim */
        size_t per = align == 1 ? MAX(grain, (size_t)1) : ALIGN_TO(MAX((n + parts - 1) / parts, grain), align);
        uint32_t gen = atomic_load(&p->generation) + 1;
        /* Close the ticket before anything of this job is written. A worker
         * that saw the last job's ticket (every part claimed), then this
         * job's larger n_parts, would otherwise claim a part of this job
         * under the old number while its fields are being written, and run
         * it twice or with the wrong context. Its claim now fails, and none
         * succeeds until the ticket is opened below. */
        atomic_store(&p->ticket, (uint64_t)gen << 32 | UINT32_MAX);
        p->fn = fn;
        p->ctx = ctx;
        p->n = n;
        p->per = per;
        uint32_t parts_n = (uint32_t)((n + per - 1) / per);
        atomic_store_explicit(&p->n_parts, parts_n, memory_order_release);
        atomic_store(&p->done, 0);
        atomic_store(&p->ticket, (uint64_t)gen << 32);
        atomic_store(&p->generation, gen);
        if (atomic_load(&p->sleepers))
                futex_wake_all(&p->generation);

        run_parts(p, gen);
        uint32_t d;
        for (int spins = 0; (d = atomic_load(&p->done)) < parts_n; spins++) {
                if (spins < POOL_SPIN) {
                        cpu_relax();
                        continue;
                }
                atomic_store(&p->caller_asleep, 1);
                if ((d = atomic_load(&p->done)) < parts_n)
                        futex_wait(&p->done, d);
                atomic_store(&p->caller_asleep, 0);
        }
}
