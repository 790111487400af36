/* ctl/ctl-common.h — what every ravnestctl command does the same way: its
 * operands counted, its failures said (on stderr, and under --json as one
 * JSON object on stdout too, so a script reading stdout always gets an
 * answer), and a file it writes checked before it does anything.
 *
 *     if ((r = ctl_operands("plot", argc, argv, 1, 1, "RUN_DIR")) >= 0) {
 *             usage(stderr);      // after "ravnestctl plot: missing argument RUN_DIR"
 *             return r;           // EX_USAGE
 *     }
 *     return ctl_failure(json, "unreachable", EX_UNAVAILABLE, "ravnestd is not reachable: %s", why);
 *     if ((r = ctl_output_target("plot", out, target)) != 0)
 *             return r;           // 64 empty, 73 not a regular file (said)
 */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/macro.h"

/* After the options (getopt's optind): -1 when there are min to max
 * operands; else "ravnestctl CMD: missing argument MISSING" (the first
 * operand the usage names that is not there; NULL when min is 0) or
 * "unexpected argument" with the first one too many, on stderr, and
 * EX_USAGE. */
int ctl_operands(const char *cmd, int argc, char *argv[], int min, int max, const char *missing);

/* A command that fails for another reason than its command line (a usage
 * error, 64, is said on stderr only): the message on stderr; with json, on
 * stdout too as {"State": state, "Error": message} (no State when state is
 * NULL). Returns status, the exit status. */
int ctl_failure(bool json, const char *state, int status, const char *fmt, ...) _printf_(4, 5);

/* Where a command writes a file: a new one, or one that is there; through
 * symbolic links, the file they name (made if it is not there yet: a
 * dangling link's target), into target. Anything but a regular file (a
 * device such as /dev/null, a FIFO, a directory) is refused: a write would
 * go into it, or a rename put a file in its place. 0, or the exit status
 * (said): 64 for an empty name, 73 (EX_CANTCREAT) otherwise. */
int ctl_output_target(const char *cmd, const char *output, char target[PATH_MAX]);

/* Text a model made, onto a terminal's stdout: its bytes as they are but
 * for control bytes other than newline and tab, which are written as \xNN
 * (a sampled escape sequence would act on the terminal). */
void ctl_print_text(const uint8_t *text, size_t n);
