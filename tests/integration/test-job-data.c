/* A job whose model does not fit its data is refused the same way by every
 * mode: ravnestd --check-job, ravnestd training alone, a pipeline stage of
 * a swarm, and ravnestctl job — all through one check (exit 78, the
 * reason named). Small generated IDX data sets, no package needed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/data.h"
#include "../lib/proc.h"

static char dir[] = "/tmp/ravnest-test-job-data-XXXXXX";
static char d8[128], d16[128], d8x12[128], j8[160], j16[160], missing[160];

static void setup(void) {
        cr_assert(mkdtemp(dir));
        snprintf(d8, sizeof d8, "%s/8x8", dir);
        snprintf(d16, sizeof d16, "%s/16x16", dir);
        snprintf(d8x12, sizeof d8x12, "%s/8x8-12-classes", dir);
        test_write_idx_data(d8, &(TestData){ .h = 8, .w = 8, .classes = 10, .n_train = 600, .n_test = 100 });
        test_write_idx_data(d16, &(TestData){ .h = 16, .w = 16, .classes = 10, .n_train = 600, .n_test = 100,
                                              .gzip = true });
        test_write_idx_data(d8x12, &(TestData){ .h = 8, .w = 8, .classes = 12, .n_train = 600, .n_test = 100 });
        snprintf(j8, sizeof j8, "%s/mlp-8x8.job", dir);
        snprintf(j16, sizeof j16, "%s/mlp-16x16.job", dir);
        snprintf(missing, sizeof missing, "%s/no-such-dir", dir);
        test_write_mlp_job(j8, d8, 8, 8, 10, 1);
        test_write_mlp_job(j16, d16, 16, 16, 10, 1);
}

static void teardown(void) {
        test_remove_tree(dir);
}

TestSuite(job_data, .init = setup, .fini = teardown, .timeout = 120);

/* Every way of running the job on data_dir: exit 78 and the reason. */
static void refused_everywhere(const char *job, const char *data_dir, const char *why) {
        char *const runs[][16] = {
                { RAVNESTD, "--check-job", "--job", (char *)job, "--data-dir", (char *)data_dir, NULL },
                { RAVNESTD, "--no-idle", "--control-socket", "none", "--job", (char *)job, "--data-dir",
                  (char *)data_dir, NULL },
                { RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--job", (char *)job, "--data-dir", (char *)data_dir,
                  NULL },
        };
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
                Proc p;
                proc_start(&p, runs[i], NULL);
                int status = proc_exit(&p);
                cr_expect_eq(status, 78, "%s %s: exit %d\n%s", runs[i][0], runs[i][1], status, p.out);
                cr_expect(strstr(p.out, why), "%s %s: no \"%s\"\n%s", runs[i][0], runs[i][1], why, p.out);
                cr_expect(!strstr(p.out, "signal"), "%s", p.out);
        }
}

Test(job_data, a_model_smaller_than_the_data_is_refused) {
        refused_everywhere(j8, d16, "the model takes (1,8,8) but the dataset has (1,16,16)");
}

Test(job_data, a_model_larger_than_the_data_is_refused) {
        refused_everywhere(j16, d8, "the model takes (1,16,16) but the dataset has (1,8,8)");
}

Test(job_data, labels_beyond_the_models_classes_are_refused) {
        refused_everywhere(j8, d8x12, "the model has 10 classes but the dataset has label 11");
}

/* ravnestctl job reads the data's headers as the daemon would. */
Test(job_data, ravnestctl_job_checks_the_data) {
        char j8_on_16[160], j8_on_12[160], j8_nowhere[160];
        snprintf(j8_on_16, sizeof j8_on_16, "%s/on-16.job", dir);
        snprintf(j8_on_12, sizeof j8_on_12, "%s/on-12.job", dir);
        snprintf(j8_nowhere, sizeof j8_nowhere, "%s/nowhere.job", dir);
        test_write_mlp_job(j8_on_16, d16, 8, 8, 10, 1);
        test_write_mlp_job(j8_on_12, d8x12, 8, 8, 10, 1);
        test_write_mlp_job(j8_nowhere, missing, 8, 8, 10, 1);
        Proc p;

        proc_start(&p, (char *[]){ RAVNESTCTL, "job", j8, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "the model fits the data there"), "%s", p.out);

        proc_start(&p, (char *[]){ RAVNESTCTL, "job", j8_on_16, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 78, "%s", p.out);
        cr_assert(strstr(p.out, "the model takes (1,8,8) but the dataset has (1,16,16)"), "%s", p.out);

        proc_start(&p, (char *[]){ RAVNESTCTL, "job", j8_on_12, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 78, "%s", p.out);
        cr_assert(strstr(p.out, "the dataset has label 11"), "%s", p.out);

        /* the data is not on this machine: the job itself is fine, and it says so */
        proc_start(&p, (char *[]){ RAVNESTCTL, "job", j8_nowhere, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "data not there to check"), "%s", p.out);
        cr_assert(strstr(p.out, "no-such-dir"), "%s", p.out);
}

/* A data set with one of its four files missing is broken, not "not on
 * this machine": ravnestctl job names the file and exits 1, as the daemon
 * would refuse it. */
Test(job_data, a_data_set_missing_one_file_is_refused_by_every_check) {
        char part[160], job[160], gone[200];
        snprintf(part, sizeof part, "%s/part", dir);
        snprintf(job, sizeof job, "%s/part.job", dir);
        snprintf(gone, sizeof gone, "%s/t10k-labels-idx1-ubyte", part);
        test_write_idx_data(part, &(TestData){ .h = 8, .w = 8, .classes = 10, .n_train = 60, .n_test = 10 });
        cr_assert_eq(unlink(gone), 0);
        test_write_mlp_job(job, part, 8, 8, 10, 1);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTCTL, "job", job, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 1, "%s", p.out);
        cr_assert(strstr(p.out, "Unusable dataset") && strstr(p.out, gone), "%s", p.out);
        cr_assert(!strstr(p.out, "not there to check"), "%s", p.out);
        /* and by the daemon's check, which said the data was not there to check */
        proc_start(&p, (char *[]){ RAVNESTD, "--check-job", "--job", job, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 1, "%s", p.out);
        cr_assert(strstr(p.out, "Unusable dataset") && strstr(p.out, gone), "%s", p.out);
}

/* Bytes after a gzip file's data are refused by every check, as after a
 * plain file's. */
Test(job_data, bytes_after_the_gzip_data_are_refused) {
        char gz[160], job[160], file[200];
        snprintf(gz, sizeof gz, "%s/gz", dir);
        snprintf(job, sizeof job, "%s/gz.job", dir);
        snprintf(file, sizeof file, "%s/train-images-idx3-ubyte.gz", gz);
        test_write_idx_data(gz, &(TestData){ .h = 8, .w = 8, .classes = 10, .n_train = 60, .n_test = 10,
                                             .gzip = true });
        FILE *f = fopen(file, "ab");
        cr_assert(f);
        for (int i = 0; i < 10; i++)
                fputs("garbage!", f);
        cr_assert_eq(fclose(f), 0);
        test_write_mlp_job(job, gz, 8, 8, 10, 1);
        char *const runs[][8] = { { RAVNESTCTL, "job", job, NULL },
                                  { RAVNESTD, "--check-job", "--job", job, NULL } };
        for (size_t i = 0; i < ELEMENTSOF(runs); i++) {
                Proc p;
                proc_start(&p, runs[i], NULL);
                cr_expect_eq(proc_exit(&p), 1, "%s: %s", runs[i][1], p.out);
                cr_expect(strstr(p.out, "trailing bytes") && strstr(p.out, file), "%s: %s", runs[i][1], p.out);
        }
}

/* The activation memory ravnestctl job prints is what the daemon allocates
 * for a batch: with a conv2d whose im2col scratch (2 x 225 x 16 x 16
 * floats) is most of it, at least that scratch. */
Test(job_data, ravnestctl_job_counts_the_scratch_in_its_memory) {
        char job[160], text[1024];
        snprintf(job, sizeof job, "%s/conv.job", dir);
        snprintf(text, sizeof text,
                 "name = \"conv\";\n"
                 "dataset = { name = \"idx\"; path = \"%s\"; classes = 10; mean = 0.5; std = 0.3; };\n"
                 "model = {\n  input = [1, 16, 16];\n"
                 "  layers = ( { type = \"conv2d\"; out = 1; kernel = 15; padding = 7; }, { type = \"flatten\"; },\n"
                 "             { type = \"linear\"; out = 10; } );\n};\n"
                 "optimizer = { type = \"sgd\"; lr = 0.05; };\n"
                 "training = { batch_size = 1; epochs = 1; seed = 7; };\n", d16);
        test_write_file(job, text, 0644);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTCTL, "job", job, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        const char *line = strstr(p.out, "activation memory per batch of 1");
        cr_assert(line, "%s", p.out);
        size_t bytes = 0;
        const char *at = strstr(line, "MiB (");
        cr_assert(at && sscanf(at, "MiB (%zu bytes)", &bytes) == 1, "%s", line);
        cr_expect_geq(bytes, (size_t)2 * 225 * 16 * 16 * sizeof(float), "%s", line);
}
