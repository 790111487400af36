/* A swarm on loopback, as `ravnestctl swarm` starts it: 2 clusters x 2
 * pipeline stages of the MLP, real ravnestd processes with generated keys
 * and configurations, training on the real Fashion-MNIST with the
 * asynchronous schedule and weight stashing, averaging each stage with the
 * other cluster's on a fixed cadence. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/proc.h"

static void skip_without_dataset(void) {
        if (access(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist to run this test", FASHION_MNIST_DIR);
}

static double accuracy(const char *out, int cluster) {
        char want[64];
        snprintf(want, sizeof want, "swarm: cluster %d: test accuracy ", cluster);
        const char *p = strstr(out, want);
        return p ? strtod(p + strlen(want), NULL) : -1;
}

/* One epoch's worth of samples (half the training set per cluster); the
 * bar for one epoch: 82% (the single-node MLP reaches about 85% after one
 * epoch, 89.4% after five). */
Test(swarm, two_clusters_of_two_stages_train_together, .timeout = 600) {
        skip_without_dataset();
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--job",
                                   SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--epochs", "1", "--interval", "1",
                                   "--progress", "2000", NULL }, NULL);
        int status = proc_exit(&p);
        cr_assert_eq(status, 0, "%s", p.out);
        for (int c = 1; c <= 2; c++) {
                double acc = accuracy(p.out, c);
                cr_log_info("cluster %d: test accuracy %.2f%% after one epoch of samples\n", c, acc);
                cr_assert_geq(acc, 82.0, "cluster %d: %.2f%%\n%s", c, acc, p.out);
        }
        /* each stage averaged with its counterpart in the other cluster */
        cr_assert(strstr(p.out, "Averaging round 2 done: 2 of 4 members"), "%s", p.out);
        cr_assert(strstr(p.out, "asynchronous schedule, at most 4 in flight"), "%s", p.out);
        cr_assert(strstr(p.out, "stashed versions"), "%s", p.out);
        cr_assert(!strstr(p.out, "failed"), "%s", p.out);
}

/* Ctrl-C: every node stops cleanly and the command says so. */
Test(swarm, interrupt_stops_every_node, .timeout = 120) {
        skip_without_dataset();
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--job",
                                   SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--progress", "500", NULL }, NULL);
        cr_assert(proc_wait_for(&p, "micro-batches", 60000), "%s", p.out);
        kill(p.pid, SIGINT);
        int status = proc_exit(&p);
        cr_assert_eq(status, 130, "%s", p.out);
        cr_assert(strstr(p.out, "swarm: stopping every node"), "%s", p.out);
        /* four nodes, each stopped by the signal, none killed */
        const char *s = p.out;
        int clean = 0;
        while ((s = strstr(s, "stopped cleanly"))) {
                clean++;
                s++;
        }
        cr_assert_eq(clean, 4, "%d nodes stopped cleanly\n%s", clean, p.out);
}
