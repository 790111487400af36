/* The GPT on real text (Debian's fortunes package), as users run it:
 * - one node reaches PyTorch's validation loss for the same model,
 *   optimizer, schedule and number of tokens (within 2 %);
 * - a swarm of 2 clusters x 2 stages (asynchronous, weight stashing,
 *   averaging) reaches the validation loss of one node trained on the same
 *   tokens with the same samples per update as the swarm as a whole (within
 *   3 %);
 * - ravnestctl generate samples from the stage checkpoints of one cluster,
 *   and ravnestctl export writes weights that PyTorch loads and computes the
 *   same logits from (tests/gpt-export-check.py). */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "../lib/proc.h"

#define JOB SOURCE_ROOT "/config/jobs/fortunes-gpt.job"
#define CORPUS "/usr/share/games/fortunes/cookie" /* 245 kB: 3,638 training windows of 64 bytes */
#define EPOCHS "4"

/* PyTorch's validation loss for this job on CORPUS, EPOCHS epochs: the
 * median of seeds 1, 2 and 3 (2.4523, 2.4536, 2.5219), measured with
 *   tests/gpt-train-reference.py /usr/share/games/fortunes/cookie 64 4 4 128 8 4 0.003 0.0 cosine SEED 2
 * The bar is 2 % above it. */
#define TORCH_VALID_LOSS 2.4536

static void skip_without_corpus(void) {
        if (access(CORPUS, R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's fortunes to run this test", CORPUS);
}

static bool have_torch(void) {
        return system("/usr/bin/python3 -c 'import torch' 2>/dev/null") == 0;
}

/* The number after "what" in out, or -1. */
static double figure(const char *out, const char *what) {
        const char *p = strstr(out, what);
        return p ? strtod(p + strlen(what), NULL) : -1;
}

static double train_alone(const char *job, const char *epochs) {
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--no-idle", "--control-socket", "none", "--job", (char *)job,
                                   "--data-dir", CORPUS, "--epochs", (char *)epochs, "--threads", "2", "--progress",
                                   "0", NULL }, NULL);
        int status = proc_exit_within(&p, 840000);
        cr_assert_eq(status, 0, "%s", p.out);
        double loss = figure(p.out, "Finished fortunes-gpt: test accuracy ");
        cr_assert_gt(loss, 0, "%s", p.out);
        return figure(strstr(p.out, "Finished fortunes-gpt"), "test loss ");
}

Test(gpt, one_node_matches_pytorch, .timeout = 900) {
        skip_without_corpus();
        double loss = train_alone(JOB, EPOCHS);
        cr_log_info("validation loss %.4f, PyTorch's %.4f (%+.1f %%)\n", loss, TORCH_VALID_LOSS,
                    100 * (loss / TORCH_VALID_LOSS - 1));
        cr_assert_leq(loss, TORCH_VALID_LOSS * 1.02, "validation loss %.4f, PyTorch's %.4f", loss, TORCH_VALID_LOSS);
}

/* The swarm's two clusters each take 8 samples per update, so the swarm as
 * a whole takes 16: the node it is held against trains on the same tokens
 * with batches of 16. */
Test(gpt, a_swarm_matches_one_node, .timeout = 900) {
        skip_without_corpus();
        char dir[] = "/tmp/ravnest-test-gpt-XXXXXX", job16[128], text[4096];
        cr_assert(mkdtemp(dir));
        FILE *f = fopen(JOB, "re");
        cr_assert(f);
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        char *b = strstr(text, "batch_size = 8;");
        cr_assert(b, "the job's batch is 8");
        memcpy(b, "batch_size =16;", 15);
        snprintf(job16, sizeof job16, "%s/fortunes-gpt-16.job", dir);
        test_write_file(job16, text, 0644);
        double alone = train_alone(job16, EPOCHS);

        Proc p;
        proc_start(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--job", JOB, "--data-dir", CORPUS,
                                   "--epochs", EPOCHS, "--staleness", "2", "--progress", "0", NULL }, NULL);
        int status = proc_exit_within(&p, 840000);
        cr_assert_eq(status, 0, "%s", p.out);
        const char *avg = strstr(p.out, "swarm: the averaged model");
        cr_assert(avg, "%s", p.out);
        double swarm = figure(avg, "test loss ");
        cr_log_info("swarm: validation loss %.4f; one node with batches of 16: %.4f (%+.1f %%)\n", swarm, alone,
                    100 * (swarm / alone - 1));
        cr_assert_leq(swarm, alone * 1.03, "swarm %.4f, one node %.4f\n%s", swarm, alone, p.out);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        (void)!system(cmd);
}

/* The checkpoint a swarm's node left in its directory. */
static void find_checkpoint(const char *swarm_dir, const char *node, char *ret, size_t len) {
        char dir[200];
        snprintf(dir, sizeof dir, "%s/%s", swarm_dir, node);
        DIR *d = opendir(dir);
        struct dirent *e;
        cr_assert(d, "%s missing", dir);
        ret[0] = 0;
        while ((e = readdir(d)))
                if (strstr(e->d_name, ".ckpt") && !strstr(e->d_name, ".tmp") && strlen(dir) + strlen(e->d_name) + 2 <= len)
                        snprintf(ret, len, "%s/%.255s", dir, e->d_name);
        closedir(d);
        cr_assert(ret[0], "no checkpoint in %s", dir);
}

/* A short swarm keeps its checkpoints: one cluster's stages make the model
 * that generate samples from and export writes. */
Test(gpt, generate_and_export, .timeout = 600) {
        skip_without_corpus();
        char dir[] = "/tmp/ravnest-test-gpt-XXXXXX", swarm_dir[128], c1[512], c2[512], out[160];
        cr_assert(mkdtemp(dir));
        snprintf(swarm_dir, sizeof swarm_dir, "%s/swarm", dir);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--job", JOB, "--data-dir",
                                   "/usr/share/games/fortunes/wisdom", "--epochs", "1", "--dir", swarm_dir,
                                   "--progress", "0", NULL }, NULL);
        cr_assert_eq(proc_exit_within(&p, 540000), 0, "%s", p.out);
        find_checkpoint(swarm_dir, "c1s1", c1, sizeof c1);
        find_checkpoint(swarm_dir, "c1s2", c2, sizeof c2);

        proc_start(&p, (char *[]){ RAVNESTCTL, "generate", "--job", JOB, "--checkpoint", c2, "--checkpoint", c1,
                                   "--prompt", "The ", "--tokens", "120", "--seed", "3", NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strncmp(p.out, "The ", 4) == 0 && strlen(p.out) == 4 + 120 + 1, "%zu bytes: %s", strlen(p.out),
                  p.out);
        cr_log_info("generated: %s", p.out);
        /* one stage alone is not a model */
        proc_start(&p, (char *[]){ RAVNESTCTL, "generate", "--job", JOB, "--checkpoint", c1, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 65, "%s", p.out);
        cr_assert(strstr(p.out, "no checkpoint holds layer "), "%s", p.out);

        snprintf(out, sizeof out, "%s/model.safetensors", dir);
        proc_start(&p, (char *[]){ RAVNESTCTL, "export", "--job", JOB, "--checkpoint", c1, "--checkpoint", c2,
                                   "--output", out, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "53 tensors"), "%s", p.out); /* 2 + 4 blocks x 12 + 3 */
        if (!have_torch()) {
                char cmd[160];
                snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
                (void)!system(cmd);
                cr_skip_test("SKIP: PyTorch (python3-torch) missing: the exported weights were not loaded in it");
        }
        Proc ours, torch;
        proc_start(&ours, (char *[]){ RAVNESTCTL, "generate", "--job", JOB, "--checkpoint", c1, "--checkpoint", c2,
                                      "--prompt", "A fool and his ", "--logits", NULL }, NULL);
        cr_assert_eq(proc_exit(&ours), 0, "%s", ours.out);
        proc_start(&torch, (char *[]){ "/usr/bin/python3", SOURCE_ROOT "/tests/gpt-export-check.py", out, "64", "4",
                                       "A fool and his ", NULL }, NULL);
        cr_assert_eq(proc_exit(&torch), 0, "%s", torch.out);
        char *a = ours.out, *t = torch.out;
        int k = 0;
        double worst = 0;
        for (; k < 256; k++) {
                char *ea, *et;
                double x = strtod(a, &ea), y = strtod(t, &et);
                cr_assert(ea != a && et != t, "logit %d missing:\n%s\n---\n%s", k, ours.out, torch.out);
                worst = fmax(worst, fabs(x - y) / fmax(1.0, fabs(y)));
                a = ea, t = et;
        }
        cr_log_info("exported logits against PyTorch's: largest relative difference %.2e\n", worst);
        cr_assert_lt(worst, 1e-4, "logits differ by %.2e", worst);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        (void)!system(cmd);
}
