/* util/file.h — opening a file to read that must be a regular one, and
 * writing a small file whole.
 *
 *     fd = file_open_regular(path, 0, &st, &d);              // -errno, with the reason in d
 *     r = file_write_text("/tmp/x/node.conf", text, 0644);   // -errno, or -EIO if short
 */
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include "util/diag.h"

/* Open path read-only (flags added: O_NOFOLLOW, say) and fstat it into st;
 * anything but a regular file is refused (-EINVAL) without blocking: a
 * FIFO or a device in a file's place would otherwise hang the reader.
 * Every file read from a path the user gives opens through here. */
int file_open_regular(const char *path, int flags, struct stat *st, Diag *d);

/* Create or truncate path with mode and write text (NUL-terminated) to it. */
int file_write_text(const char *path, const char *text, mode_t mode);
