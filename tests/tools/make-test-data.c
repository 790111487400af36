/* make-test-data — the generated 8x8 IDX data set of tests/lib/data.h and an
 * MLP job for it, for the shell tests (test-faults.sh): a small model that
 * learns in seconds and moves little over its links.
 *
 *     make-test-data DIR EPOCHS      # DIR/8x8 (the IDX files), DIR/mlp-8x8.job
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../lib/data.h"

int main(int argc, char *argv[]) {
        char data[4096], job[4096];
        int epochs = argc == 3 ? atoi(argv[2]) : 0;
        if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
                printf("Usage: make-test-data DIR EPOCHS\n");
                return 0;
        }
        if (argc != 3 || epochs < 1 || epochs > 100000 || strlen(argv[1]) > 4000) {
                fprintf(stderr, "Usage: make-test-data DIR EPOCHS\n");
                return 64;
        }
        (void)mkdir(argv[1], 0755);
        snprintf(data, sizeof data, "%s/8x8", argv[1]);
        snprintf(job, sizeof job, "%s/mlp-8x8.job", argv[1]);
        test_write_idx_data(data, &(TestData){ .h = 8, .w = 8, .classes = 10, .n_train = 6000, .n_test = 1000 });
        test_write_mlp_job(job, data, 8, 8, 10, epochs);
        printf("%s\n", job);
        return 0;
}
