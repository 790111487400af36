/* util/rss.h — this process's resident memory, as /proc/self/statm counts
 * it (resident pages times the page size), for the series and the status.
 *
 *     uint64_t rss;
 *     if (rss_self_bytes(&rss) >= 0) ...
 */
#pragma once

#include <stdint.h>

int rss_self_bytes(uint64_t *ret);
