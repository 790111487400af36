/* run/result.h — how a run ended, kept in its state directory for whoever
 * started the node and could not read its log (ravnestctl swarm, when a
 * node it lost was started again by hand):
 * "<state_directory>/<job>.result", written atomically (a temporary renamed
 * over it), three lines of text:
 *
 *     test_accuracy 0.8912   (the last stage's; -1 at other stages)
 *     test_loss 0.3011
 *     averaged 1             (1: the last averaging round had every member,
 *                             0: it went on without some, -1: no averaging)
 *
 *     r = run_result_write(dir, job->name, &(RunResult){ .test_accuracy = a, .test_loss = l, .averaged = 1 });
 *     r = run_result_read(dir, job->name, &result, &mtime_usec);
 */
#pragma once

#include <stdint.h>

typedef struct RunResult {
        double test_accuracy, test_loss; /* < 0: not known at this stage */
        int averaged;
} RunResult;

int run_result_write(const char *dir, const char *job, const RunResult *r);
/* -ENOENT when there is none, -EBADMSG when it is not one; ret_mtime_usec
 * (CLOCK_REALTIME) may be NULL. */
int run_result_read(const char *dir, const char *job, RunResult *ret, uint64_t *ret_mtime_usec);
