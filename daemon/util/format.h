/* util/format.h — byte counts for people, and back: what the status, the
 * log and the swarm's table print ("52.0 KiB", "1.2 GiB", "512 B"), and
 * what reads such a figure back from a node's log line.
 *
 *     char buf[FORMAT_BYTES_MAX];
 *     format_bytes(buf, sizeof buf, 53248);       // "52.0 KiB"
 *     r = parse_bytes("52.0 KiB/step", &end, &v); // v 53248, end at "/step"
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define FORMAT_BYTES_MAX 16

/* Binary units, one decimal from KiB up. Returns buf. */
const char *format_bytes(char *buf, size_t len, uint64_t bytes);
/* A figure as format_bytes() writes it: a number, one space, a unit (B,
 * KiB, MiB, GiB, TiB, PiB). ret_end (may be NULL) points past the unit.
 * -EINVAL when text does not start with one, -ERANGE past 2^64. */
int parse_bytes(const char *text, const char **ret_end, uint64_t *ret);
