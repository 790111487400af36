/* Job files: the shipped jobs parse; every kind of mistake names the file,
 * the line and the setting. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/job.h"

Test(job, shipped_jobs_parse) {
        Job j;
        Diag d = {};
        cr_assert_eq(job_load(SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", &j, &d), 0, "%s", d.text);
        cr_assert_str_eq(j.name, "fashion-mnist-mlp");
        cr_assert_eq(j.model.n_layers, 6);
        cr_assert_eq(model_spec_params(&j.model, 0, 6), 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
        cr_assert_eq(j.optim.kind, OPTIM_SGD);
        cr_assert_eq(j.train.batch_size, 128);
        cr_assert_eq(j.train.epochs, 5);

        cr_assert_eq(job_load(SOURCE_ROOT "/config/jobs/fashion-mnist-mlp-deep.job", &j, &d), 0, "%s", d.text);
        cr_assert_eq(j.model.n_layers, 10);
        cr_assert_eq(model_spec_params(&j.model, 0, 10), 784 * 512 + 512 + 3 * (512 * 512 + 512) + 512 * 10 + 10);

        cr_assert_eq(job_load(SOURCE_ROOT "/config/jobs/fashion-mnist-cnn.job", &j, &d), 0, "%s", d.text);
        cr_assert_eq(j.model.layers[0].kind, LAYER_CONV2D);
        cr_assert_eq(j.optim.kind, OPTIM_ADAMW);
}

static const char *base =
        "name = \"t\";\n"                                              /* 1 */
        "dataset = { name = \"fashion-mnist\"; classes = 10; };\n"     /* 2 */
        "model = {\n"                                                  /* 3 */
        "  input = [1, 28, 28];\n"                                     /* 4 */
        "  layers = (\n"                                               /* 5 */
        "    { type = \"flatten\"; },\n"                               /* 6 */
        "    { type = \"linear\"; out = 10; }\n"                       /* 7 */
        "  );\n"                                                       /* 8 */
        "};\n"                                                         /* 9 */
        "optimizer = { type = \"sgd\"; lr = 0.1; };\n"                 /* 10 */
        "training = { batch_size = 32; epochs = 1; };\n";              /* 11 */

/* Write base with one substitution and load it (into j, if not NULL). */
static int load_job_variant(const char *from, const char *to, Diag *d, char *path, Job *j) {
        static char text[200000];
        const char *at = strstr(base, from);
        cr_assert_not_null(at, "variant anchor \"%s\" not in base", from);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
        strcpy(path, "/tmp/ravnest-test-job-XXXXXX");
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        Job local;
        int r = job_load(path, j ? j : &local, d);
        unlink(path);
        return r;
}

static int load_variant(const char *from, const char *to, Diag *d, char *path) {
        return load_job_variant(from, to, d, path, NULL);
}

static void expect_error(const char *from, const char *to, const char *where) {
        char path[64], want[256];
        Diag d = {};
        int r = load_variant(from, to, &d, path);
        cr_expect_lt(r, 0, "variant \"%s\" loaded", to);
        snprintf(want, sizeof want, "%s:%s", path, where);
        cr_expect(strstr(d.text, want), "variant \"%s\": message \"%s\" lacks \"%s\"", to, d.text, want);
}

Test(job, base_is_valid) {
        char path[64];
        Diag d = {};
        cr_assert_eq(load_variant("name", "name", &d, path), 0, "%s", d.text);
}

Test(job, errors_name_file_line_and_setting) {
        expect_error("lr = 0.1", "lr = \"fast\"", "10: optimizer.lr: must be a number");
        expect_error("lr = 0.1", "lr = -1.0", "10: optimizer.lr: must be a number in [0, 100], got -1");
        expect_error("lr = 0.1", "lr = 0.1; momemtum = 0.9", "10: optimizer.momemtum: unknown setting");
        expect_error("type = \"sgd\"", "type = \"rmsprop\"", "10: optimizer.type: unknown optimizer \"rmsprop\"");
        expect_error("out = 10;", "out = 0;", "7: model.layers.[1].out: must be an integer in [1, 65536], got 0");
        expect_error("type = \"linear\"", "type = \"dense\"", "7: model.layers.[1].type: unknown layer \"dense\"");
        expect_error("out = 10;", "out = 12;", "5: model.layers: the last layer gives (12,1,1) but the dataset has 10 classes");
        expect_error("{ type = \"flatten\"; },", "", "5: model.layers: layer 1 (linear): linear needs a flat input");
        expect_error("batch_size = 32;", "", "11: training.batch_size: missing (required)");
        expect_error("epochs = 1;", "epochs = 1; speed = 3;", "11: training.speed: unknown setting");
        /* the command lines' range (ravnestd --epochs, swarm --epochs) */
        expect_error("epochs = 1;", "epochs = 1000001;", "11: training.epochs: must be an integer in [1, 1000000]");
        expect_error("input = [1, 28, 28];", "input = [1, 28];", "4: model.input: must be an array of three integers");
        expect_error("name = \"fashion-mnist\";", "name = \"cifar\";", "2: dataset.name: unknown dataset \"cifar\"");
        expect_error("{ type = \"flatten\"; }", "{ type = \"flatten\"; kernel = 2; }", "6: model.layers.[0]: flatten takes no kernel");
        expect_error("training = {", "trainning = {", "11: trainning: unknown setting");
        /* a name goes into file names, metric labels, JSON and D-Bus strings */
        expect_error("name = \"t\";", "name = \"my job\";", "1: name: must be 1 to 63 letters");
        expect_error("name = \"t\";", "name = \"a\\\"b\";", "1: name: must be 1 to 63 letters");
        expect_error("name = \"t\";", "name = \"t\xff\xfe\";", "1: name: must be 1 to 63 letters");
        expect_error("name = \"t\";", "name = \"x.layers-1\";", "1: name: must be 1 to 63 letters");
        expect_error("name = \"t\";", "name = \"../t\";", "1: name: must be 1 to 63 letters");
        expect_error("name = \"t\";", "name = \"\";", "1: name: must be 1 to 63 letters");
        /* A syntax error: file and line from the parser. */
        expect_error("lr = 0.1;", "lr = = 0.1;", "10: syntax error");
}

Test(job, missing_file) {
        Job j;
        Diag d = {};
        cr_assert_eq(job_load("/nonexistent/x.job", &j, &d), -ENOENT);
        cr_assert(strstr(d.text, "/nonexistent/x.job: cannot read"), "%s", d.text);
}

Test(job, errors_point_at_the_setting_not_its_group) {
        char path[64], want[128];
        Diag d = {};
        /* the optimizer group opens on line 10 and "type" sits on line 11 */
        int r = load_variant("optimizer = { type = \"sgd\"; lr = 0.1; };",
                             "optimizer = {\n  type = \"lion\";\n  lr = 0.1;\n};", &d, path);
        cr_assert_lt(r, 0);
        snprintf(want, sizeof want, "%s:11: optimizer.type: unknown optimizer", path);
        cr_assert(strstr(d.text, want), "%s", d.text);
}

Test(job, accumadam_and_its_accum_steps) {
        char path[64];
        Diag d = {};
        cr_assert_eq(load_variant("type = \"sgd\"; lr = 0.1;", "type = \"accumadam\"; lr = 0.001; accum_steps = 8; beta2 = 0.99;",
                                  &d, path),
                     0, "%s", d.text);
        expect_error("lr = 0.1;", "lr = 0.1; accum_steps = 4;", "10: optimizer.accum_steps: accum_steps is a setting of accumadam");
        expect_error("type = \"sgd\"; lr = 0.1;", "type = \"accumadam\"; accum_steps = 0;",
                     "10: optimizer.accum_steps: must be an integer in [1, 1024], got 0");
        expect_error("type = \"sgd\"; lr = 0.1;", "type = \"sgd\"; beta1 = 0.8;", "10: optimizer: beta1, beta2 and eps are settings of adamw and accumadam");
}

Test(job, warmup_steps) {
        char path[64];
        Diag d = {};
        Job j;
        cr_assert_eq(load_job_variant("lr = 0.1;", "lr = 0.1; warmup_steps = 50;", &d, path, &j), 0, "%s", d.text);
        cr_assert_eq(j.optim.warmup_steps, 50);
        cr_assert_eq(load_job_variant("lr = 0.1;", "lr = 0.1;", &d, path, &j), 0, "%s", d.text);
        cr_assert_eq(j.optim.warmup_steps, 0, "no warm-up unless the job asks");
        expect_error("lr = 0.1;", "lr = 0.1; warmup_steps = -1;", "10: optimizer.warmup_steps: must be an integer in [0, 1073741824], got -1");
        expect_error("lr = 0.1;", "lr = 0.1; warmup_steps = 0.5;", "10: optimizer.warmup_steps: must be an integer");
}

/* A GPT on text: its short form expands into embed, blocks and the head;
 * every bad combination names the file, the line and the setting. */
static const char *gpt_base =
        "name = \"g\";\n"                                                                 /* 1 */
        "dataset = { name = \"text\"; path = \"/usr/share/games/fortunes\"; };\n"        /* 2 */
        "model = { type = \"gpt\"; vocab = 256; context = 64; layers = 3; heads = 4; dim = 64; };\n" /* 3 */
        "optimizer = { type = \"adamw\"; lr = 0.001; };\n"                               /* 4 */
        "training = { batch_size = 8; epochs = 1; };\n";                                 /* 5 */

static void gpt_expect(const char *from, const char *to, const char *where) {
        char text[2048], path[64] = "/tmp/ravnest-test-job-XXXXXX", want[256];
        const char *at = strstr(gpt_base, from);
        cr_assert_not_null(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - gpt_base), gpt_base, to, at + strlen(from));
        int fd = mkstemp(path);
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        Job j;
        Diag d = {};
        int r = job_load(path, &j, &d);
        unlink(path);
        if (!where) {
                cr_assert_eq(r, 0, "%s", d.text);
                cr_assert(j.model.lm);
                cr_assert_eq(j.model.n_layers, 5);
                cr_assert_eq(j.model.layers[0].kind, LAYER_EMBED);
                cr_assert_eq(j.model.layers[1].kind, LAYER_BLOCK);
                cr_assert_eq(j.model.layers[4].kind, LAYER_LM_HEAD);
                cr_assert_eq(j.model.input.c, 64);
                cr_assert_eq(j.data.kind, JOB_DATA_TEXT);
                cr_assert_eq(j.data.classes, 256);
                return;
        }
        cr_expect_lt(r, 0, "variant \"%s\" loaded", to);
        snprintf(want, sizeof want, "%s:%s", path, where);
        cr_expect(strstr(d.text, want), "variant \"%s\": message \"%s\" lacks \"%s\"", to, d.text, want);
}

Test(job, gpt_on_text) {
        gpt_expect("name", "name", NULL);
        gpt_expect("dim = 64", "dim = 66", "3: model.dim: 66 is not divisible by heads (4)");
        gpt_expect("heads = 4; dim = 64", "heads = 1; dim = 1", "3: model.dim: must be an integer in [2, 16384]");
        gpt_expect("heads = 4; dim = 64", "heads = 2; dim = 4730",
                   "3: model: layer 2 (block): block: layer is too large: 268536290 parameters"); /* 12 C^2 + 13 C */
        gpt_expect("vocab = 256", "vocab = 300", "3: model.vocab: must be an integer in [2, 256]");
        gpt_expect("context = 64", "context = 0", "3: model.context: must be an integer in [1, 4096]");
        gpt_expect("type = \"gpt\"", "type = \"bert\"", "3: model.type: unknown model type \"bert\"");
        gpt_expect("layers = 3; ", "", "3: model.layers: missing");
        gpt_expect("dim = 64;", "dim = 64; width = 3;", "3: model.width: unknown setting");
        gpt_expect("name = \"text\"; path = \"/usr/share/games/fortunes\";", "name = \"fashion-mnist\";",
                   "3: model.type: a gpt trains on a text dataset");
        gpt_expect("path = \"/usr/share/games/fortunes\"; ", "", "2: dataset.path: missing");
        gpt_expect("name = \"text\";", "name = \"text\"; classes = 10;", "2: dataset: classes, mean and std");
}

/* libconfig's time grows with the square of a group's settings: a group
 * past the bound is refused before it parses, naming its line and group. */
Test(job, a_group_of_too_many_settings) {
        static char text[200000];
        int k = snprintf(text, sizeof text, "name = \"t\";\nmodel = {\n");
        for (int i = 0; i < 4097; i++)
                k += snprintf(text + k, sizeof text - (size_t)k, "x%d = %d;\n", i, i);
        snprintf(text + k, sizeof text - (size_t)k, "};\n");
        expect_error("name = \"t\";", text, "4099: model: more than 4096 settings in one group");
        /* many groups of fewer each, past what their squares may cost in all */
        k = snprintf(text, sizeof text, "name = \"t\";\n");
        for (int g = 0; g < 3; g++) {
                k += snprintf(text + k, sizeof text - (size_t)k, "g%d = {\n", g);
                for (int i = 0; i < 4000; i++)
                        k += snprintf(text + k, sizeof text - (size_t)k, "x%d=0;", i);
                k += snprintf(text + k, sizeof text - (size_t)k, "\n};\n");
        }
        expect_error("name = \"t\";", text, "9: g2: more than 8192 settings in the file past the 64th");
}

/* A line or a string quoted from the file cannot drive the terminal. */
Test(job, control_bytes_are_escaped) {
        char path[64];
        Diag d = {};
        cr_assert_lt(load_variant("lr = 0.1;", "lr = 0.1;\x1b]0;pwned\x07\x1b[31mRED = ;", &d, path), 0);
        cr_expect(!strchr(d.text, '\x1b') && !strchr(d.text, '\x07'), "%s", d.text);
        cr_expect(strstr(d.text, "\\x1b]0;pwned\\x07\\x1b[31mRED"), "%s", d.text);
        expect_error("type = \"linear\"", "type = \"x\\x1b[2J\"", "7: model.layers.[1].type: unknown layer \"x\\x1b[2J\"");
}

/* The input's dimensions are integers as every other: with or without L. */
Test(job, input_takes_wide_integers) {
        char path[64];
        Job j;
        Diag d = {};
        cr_assert_eq(load_job_variant("input = [1, 28, 28];", "input = [1L, 28L, 28L];", &d, path, &j), 0, "%s",
                     d.text);
        cr_assert_eq(j.model.input.h, 28);
        expect_error("input = [1, 28, 28];", "input = [1L, 28L, 4097L];",
                     "4: model.input.[2]: must be an integer in [1, 4096], got 4097");
}

/* embed, block and lm_head are a gpt's own, not layers a list may name. */
Test(job, a_gpts_layers_are_unknown_in_a_list) {
        expect_error("{ type = \"linear\"; out = 10; }", "{ type = \"embed\"; out = 10; }",
                     "7: model.layers.[1].type: unknown layer \"embed\" (known: linear,");
        expect_error("{ type = \"linear\"; out = 10; }", "{ type = \"lm_head\"; }",
                     "7: model.layers.[1].type: unknown layer \"lm_head\"");
        expect_error("{ type = \"flatten\"; },", "{ type = \"block\"; },", "6: model.layers.[0].type: unknown layer \"block\"");
}

/* A relative dataset.path is the job file's directory's (it was the
 * working directory's: / under systemd); an absolute one is as written. */
Test(job, a_relative_data_path_is_read_beside_the_job) {
        char path[64];
        Diag d = {};
        Job j;
        cr_assert_eq(load_job_variant("name = \"fashion-mnist\";", "name = \"idx\"; path = \"data/mine\";", &d, path,
                                      &j), 0, "%s", d.text);
        cr_assert_str_eq(j.data.path, "/tmp/data/mine");
        cr_assert_eq(load_job_variant("name = \"fashion-mnist\";", "name = \"idx\"; path = \"/srv/mine\";", &d, path,
                                      &j), 0, "%s", d.text);
        cr_assert_str_eq(j.data.path, "/srv/mine");
}
