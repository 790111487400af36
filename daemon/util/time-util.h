/* util/time-util.h — clock helpers: the monotonic clock for durations, the
 * real-time clock for what files and peers compare. */
#pragma once

#include <stdint.h>
#include <time.h>

#define NSEC_PER_SEC 1000000000ULL
#define USEC_PER_SEC 1000000ULL

static inline uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static inline uint64_t now_realtime_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t)ts.tv_sec * USEC_PER_SEC + (uint64_t)ts.tv_nsec / 1000;
}

static inline double ns_to_sec(uint64_t ns) {
        return (double)ns / (double)NSEC_PER_SEC;
}
