/* ravnestctl generate samples from the stage checkpoints of one cluster of a
 * GPT's swarm, and ravnestctl export writes weights that PyTorch loads and
 * computes the same logits from (tests/gpt-export-check.py). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "../lib/proc.h"

#define JOB SOURCE_ROOT "/config/jobs/fortunes-gpt.job"
#define CORPUS "/usr/share/games/fortunes/wisdom" /* 62 kB: a swarm of one epoch in seconds */

static void skip_without_corpus(void) {
        if (access(CORPUS, R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's fortunes to run this test", CORPUS);
}

static bool have_torch(void) {
        return system("/usr/bin/python3 -c 'import torch' 2>/dev/null") == 0;
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

/* A model of a smaller vocabulary knows no byte past it: a prompt with one
 * is refused, not clamped to the last byte of the vocabulary; its logits
 * are as many as its vocabulary. */
Test(gpt_model, a_prompt_past_the_vocabulary_is_refused, .timeout = 300) {
        skip_without_corpus();
        char dir[] = "/tmp/ravnest-test-vocab-XXXXXX", path[64], job[64], conf[64], text[600];
        cr_assert(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/ascii.txt", dir);
        test_write_file(path, "a fool and his money are soon parted; a stitch in time saves nine.\n"
                              "all that glitters is not gold; look before you leap.\n", 0644);
        snprintf(text, sizeof text, "cat %s %s %s %s > %s.4 && mv %s.4 %s", path, path, path, path, path, path, path);
        for (int i = 0; i < 3; i++)
                cr_assert_eq(system(text), 0);
        snprintf(job, sizeof job, "%s/v.job", dir);
        snprintf(text, sizeof text,
                 "name = \"v\";\ndataset = { name = \"text\"; path = \"%s\"; };\n"
                 "model = { type = \"gpt\"; vocab = 128; context = 8; layers = 1; heads = 1; dim = 8; };\n"
                 "optimizer = { type = \"adamw\"; lr = 0.003; };\ntraining = { batch_size = 8; epochs = 1; };\n", path);
        test_write_file(job, text, 0644);
        snprintf(conf, sizeof conf, "%s/n.conf", dir);
        snprintf(text, sizeof text, "state_directory = \"%s\";\ncontrol_socket = \"\";\nidle = { enabled = false; };\n",
                 dir);
        test_write_file(conf, text, 0644);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", job, "--progress", "0", NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        char ckpt[300];
        snprintf(ckpt, sizeof ckpt, "%s/v.layers-0-3.ckpt", dir);
        proc_start(&p, (char *[]){ RAVNESTCTL, "generate", "--job", job, "--checkpoint", ckpt, "--prompt", "caf\xc3\xa9",
                                   NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 65, "%s", p.out);
        cr_assert(strstr(p.out, "byte 3 is 0xc3, past the vocabulary"), "%s", p.out);
        proc_start(&p, (char *[]){ RAVNESTCTL, "generate", "--job", job, "--checkpoint", ckpt, "--prompt", "a fool",
                                   "--logits", NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert_eq(test_count(p.out, "\n"), 128, "%s", p.out);
        test_remove_tree(dir);
}

/* A short swarm keeps its checkpoints: one cluster's stages make the model
 * that generate samples from and export writes. */
Test(gpt_model, generate_and_export, .timeout = 600) {
        skip_without_corpus();
        char dir[] = "/tmp/ravnest-test-gpt-XXXXXX", swarm_dir[128], c1[512], c2[512], out[160];
        cr_assert(mkdtemp(dir));
        snprintf(swarm_dir, sizeof swarm_dir, "%s/swarm", dir);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--job", JOB, "--data-dir",
                                   CORPUS, "--epochs", "1", "--dir", swarm_dir,
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
        /* the same job with 8 heads, not 4: every size the same, another model */
        char heads8[160], cmd[700];
        snprintf(heads8, sizeof heads8, "%s/heads8.job", dir);
        snprintf(cmd, sizeof cmd, "sed 's/heads = 4;/heads = 8;/' %s > %s && grep -q 'heads = 8;' %s", JOB, heads8,
                 heads8);
        cr_assert_eq(system(cmd), 0);
        proc_start(&p, (char *[]){ RAVNESTCTL, "generate", "--job", heads8, "--checkpoint", c1, "--checkpoint", c2,
                                   NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 65, "%s", p.out);
        cr_assert(strstr(p.out, "written for another model"), "%s", p.out);

        snprintf(out, sizeof out, "%s/model.safetensors", dir);
        proc_start(&p, (char *[]){ RAVNESTCTL, "export", "--job", JOB, "--checkpoint", c1, "--checkpoint", c2,
                                   "--output", out, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "53 tensors"), "%s", p.out); /* 2 + 4 blocks x 12 + 3 */
        /* an output that is one of the checkpoints (by another name too) is refused, and it stays whole */
        char alias[600];
        const char *slash = strrchr(c2, '/');
        snprintf(alias, sizeof alias, "%.*s/./%s", (int)(slash - c2), c2, slash + 1);
        proc_start(&p, (char *[]){ RAVNESTCTL, "export", "--job", JOB, "--checkpoint", c1, "--checkpoint", c2,
                                   "--output", alias, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 64, "%s", p.out);
        cr_assert(strstr(p.out, "is one of the checkpoints"), "%s", p.out);
        proc_start(&p, (char *[]){ RAVNESTCTL, "generate", "--job", JOB, "--checkpoint", c1, "--checkpoint", c2,
                                   "--prompt", "A", NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "the checkpoint was damaged: %s", p.out);
        /* a device (a /dev/null of its own, as root), a FIFO and a directory
         * are refused and stay what they were; through a symbolic link the
         * file it names is written, and the link stays a link */
        char odd[3][200], link[200];
        snprintf(odd[0], sizeof odd[0], "%s/null", dir);
        snprintf(odd[1], sizeof odd[1], "%s/fifo", dir);
        snprintf(odd[2], sizeof odd[2], "%s", dir);
        bool have_device = mknod(odd[0], S_IFCHR | 0666, makedev(1, 3)) == 0;
        cr_assert_eq(mkfifo(odd[1], 0600), 0);
        for (int i = have_device ? 0 : 1; i < 3; i++) {
                struct stat st;
                proc_start(&p, (char *[]){ RAVNESTCTL, "export", "--job", JOB, "--checkpoint", c1, "--checkpoint",
                                           c2, "--output", odd[i], NULL }, NULL);
                cr_assert_eq(proc_exit(&p), 73, "%s: %s", odd[i], p.out);
                cr_assert(strstr(p.out, "is not a regular file"), "%s", p.out);
                cr_assert(stat(odd[i], &st) == 0 && !S_ISREG(st.st_mode), "%s was replaced", odd[i]);
        }
        if (!have_device)
                cr_log_warn("not root: the device case was not run (mknod refused)");
        snprintf(link, sizeof link, "%s/link.safetensors", dir);
        cr_assert_eq(symlink(out, link), 0);
        proc_start(&p, (char *[]){ RAVNESTCTL, "export", "--job", JOB, "--checkpoint", c1, "--checkpoint", c2,
                                   "--output", link, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        struct stat ls;
        cr_assert(lstat(link, &ls) == 0 && S_ISLNK(ls.st_mode), "the link was replaced by a file");
        /* a link that names a file not there yet (relative to the link's
         * folder) makes it; it failed "No such file or directory" */
        char dangling[200], made[200];
        snprintf(dangling, sizeof dangling, "%s/dangling.safetensors", dir);
        snprintf(made, sizeof made, "%s/made.safetensors", dir);
        cr_assert_eq(symlink("made.safetensors", dangling), 0);
        proc_start(&p, (char *[]){ RAVNESTCTL, "export", "--job", JOB, "--checkpoint", c1, "--checkpoint", c2,
                                   "--output", dangling, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(lstat(dangling, &ls) == 0 && S_ISLNK(ls.st_mode), "the link was replaced by a file");
        cr_assert(stat(made, &ls) == 0 && S_ISREG(ls.st_mode) && ls.st_size > 0, "%s", made);
        /* a checkpoint that is not one (a device) is bad data: 65 */
        proc_start(&p, (char *[]){ RAVNESTCTL, "export", "--job", JOB, "--checkpoint", "/dev/zero", "--output", made,
                                   NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 65, "%s", p.out);
        if (!have_torch()) {
                test_remove_tree(dir);
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
        test_remove_tree(dir);
}
