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

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "util/json.h"
#include "util/macro.h"

/* After the options (getopt's optind): -1 when there are min to max
 * operands; else "ravnestctl CMD: missing argument MISSING" (the first
 * operand the usage names that is not there; NULL when min is 0) or
 * "unexpected argument" with the first one too many, on stderr, and
 * EX_USAGE. */
static inline int ctl_operands(const char *cmd, int argc, char *argv[], int min, int max, const char *missing) {
        int n = argc - optind;
        if (n > max)
                fprintf(stderr, "ravnestctl %s: unexpected argument \"%s\"\n", cmd, argv[optind + max]);
        else if (n < min)
                fprintf(stderr, "ravnestctl %s: missing argument %s\n", cmd, missing ?: "");
        else
                return -1;
        return EX_USAGE;
}

/* A command that fails for another reason than its command line (a usage
 * error, 64, is said on stderr only): the message on stderr; with json, on
 * stdout too as {"State": state, "Error": message} (no State when state is
 * NULL). Returns status, the exit status. */
static inline _printf_(4, 5) int ctl_failure(bool json, const char *state, int status, const char *fmt, ...) {
        char message[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof message, fmt, ap);
        va_end(ap);
        fprintf(stderr, "%s\n", message);
        if (!json)
                return status;
        printf("{");
        if (state) {
                printf("\"State\": ");
                json_print_string(stdout, state);
                printf(", ");
        }
        printf("\"Error\": ");
        json_print_string(stdout, message);
        printf("}\n");
        return status;
}

/* Where a command writes a file: a new one, or one that is there; through
 * symbolic links, the file they name (made if it is not there yet: a
 * dangling link's target), into target. Anything but a regular file (a
 * device such as /dev/null, a FIFO, a directory) is refused: a write would
 * go into it, or a rename put a file in its place. 0, or the exit status
 * (said): 64 for an empty name, 73 (EX_CANTCREAT) otherwise. */
static inline int ctl_output_target(const char *cmd, const char *output, char target[PATH_MAX]) {
        char link[PATH_MAX];
        struct stat st;

        if (!output[0]) {
                fprintf(stderr, "ravnestctl %s: --output is empty: give the file to write\n", cmd);
                return EX_USAGE;
        }
        snprintf(target, PATH_MAX, "%s", output);
        for (int hops = 0; hops < 40; hops++) {
                if (lstat(target, &st) < 0)
                        break;
                if (S_ISREG(st.st_mode))
                        return 0;
                if (!S_ISLNK(st.st_mode)) {
                        fprintf(stderr, "ravnestctl %s: %s is not a regular file: %s writes a file of its own "
                                "(not a device, a FIFO or a directory)\n", cmd, output, cmd);
                        return EX_CANTCREAT;
                }
                ssize_t n = readlink(target, link, sizeof link - 1);
                if (n < 0)
                        break;
                link[n] = '\0';
                const char *slash = strrchr(target, '/'); /* a relative link is read from its own folder */
                int dir = link[0] == '/' || !slash ? 0 : (int)(slash - target + 1);
                errno = ENAMETOOLONG;
                if (dir + (size_t)n >= PATH_MAX)
                        break;
                memmove(target + dir, link, (size_t)n + 1);
                errno = ELOOP;
        }
        if (errno == ENOENT)
                return 0;
        fprintf(stderr, "ravnestctl %s: %s: %s\n", cmd, output, strerror(errno));
        return EX_CANTCREAT;
}
