/* util/file.h — writing a small file whole.
 *
 *     r = file_write_text("/tmp/x/node.conf", text, 0644);   // -errno, or -EIO if short
 */
#pragma once

#include <sys/types.h>

/* Create or truncate path with mode and write text (NUL-terminated) to it. */
int file_write_text(const char *path, const char *text, mode_t mode);
