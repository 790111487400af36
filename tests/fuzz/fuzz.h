/* tests/fuzz/fuzz.h — what every harness shares: the libFuzzer entry points
 * and CHECK(), which turns a broken invariant into a crash the fuzzer
 * reports (and keeps the input of). */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                                   \
        do {                                                                                       \
                if (!(x)) {                                                                        \
                        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);      \
                        abort();                                                                   \
                }                                                                                  \
        } while (0)
