/* util/json.h — the one piece of JSON writing the commands share: a string,
 * quoted and escaped (quote, backslash, control characters).
 *
 *     json_print_string(stdout, name);   // "c1s1"
 */
#pragma once

#include <stdio.h>

void json_print_string(FILE *f, const char *s);
