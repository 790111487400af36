/* ctl/ctl-common.c */
#include "ctl-common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "util/json.h"

int ctl_operands(const char *cmd, int argc, char *argv[], int min, int max, const char *missing) {
        int n = argc - optind;
        if (n > max)
                fprintf(stderr, "ravnestctl %s: unexpected argument \"%s\"\n", cmd, argv[optind + max]);
        else if (n < min)
                fprintf(stderr, "ravnestctl %s: missing argument %s\n", cmd, missing ?: "");
        else
                return -1;
        return EX_USAGE;
}

int ctl_failure(bool json, const char *state, int status, const char *fmt, ...) {
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

int ctl_output_target(const char *cmd, const char *output, char target[PATH_MAX]) {
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

void ctl_print_text(const uint8_t *text, size_t n) {
        for (size_t i = 0; i < n; i++)
                if ((text[i] < 0x20 && text[i] != '\n' && text[i] != '\t') || text[i] == 0x7f)
                        printf("\\x%02x", text[i]);
                else
                        putchar(text[i]);
}
