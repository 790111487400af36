/* Swarms on small generated data (8x8 images, 10 classes), short enough to
 * run many times: the last averaging round gathers every cluster even when
 * training lasts about a second, a swarm that cannot average says so and
 * exits non-zero, a node killed with SIGKILL comes back from its own
 * checkpoint (--restart), a stage whose neighbour is gone for good
 * gives up after pipeline.neighbour_timeout, what a stage moves over
 * its links and to average shows in its status and the swarm's table,
 * nodes that accept no connections (as behind NAT) dial every link,
 * rings wider than one round average on a grid, --pipeline's
 * settings reach every node (a bad one named), and a stage's samples/s is
 * above 0 from its first steps on. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/data.h"
#include "../lib/proc.h"

static char dir[] = "/tmp/ravnest-test-swarm-short-XXXXXX";
static char data[128], quick[160], slow[160];

static void setup(void) {
        cr_assert(mkdtemp(dir));
        snprintf(data, sizeof data, "%s/8x8", dir);
        test_write_idx_data(data, &(TestData){ .h = 8, .w = 8, .classes = 10, .n_train = 3000, .n_test = 500 });
        snprintf(quick, sizeof quick, "%s/quick.job", dir);
        snprintf(slow, sizeof slow, "%s/slow.job", dir);
        test_write_mlp_job(quick, data, 8, 8, 10, 1);   /* about a second of training */
        test_write_mlp_job(slow, data, 8, 8, 10, 1000); /* long enough to kill a node in it */
}

static void teardown(void) {
        test_remove_tree(dir);
}

TestSuite(swarm_short, .init = setup, .fini = teardown);

static int swarm(Proc *p, char *const extra[]) {
        char *argv[32] = { RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--progress", "1000" };
        int a = 6;
        for (int i = 0; extra[i]; i++)
                argv[a++] = extra[i];
        argv[a] = NULL;
        proc_start(p, argv, NULL);
        return 0;
}

/* The pipeline's listen port in a node's configuration file. */
static uint16_t pipeline_port(const char *conf) {
        char text[8192] = "";
        FILE *f = fopen(conf, "r");
        cr_assert(f, "%s", conf);
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        const char *at = strstr(text, "listen = \"127.0.0.1:");
        cr_assert(at, "%s", text);
        return (uint16_t)atoi(at + strlen("listen = \"127.0.0.1:"));
}

static pid_t node_pid(Proc *p, const char *name) {
        char want[64];
        snprintf(want, sizeof want, "swarm: started %s (pid ", name);
        cr_assert(proc_wait_for(p, want, 30000), "%s", p->out);
        return (pid_t)atoi(strstr(p->out, want) + strlen(want));
}

/* The swarm's table has, for each of its nodes, the bytes per step it
 * moved over the pipeline and to average, both above zero. */
static void expect_traffic_columns(const char *out, int nodes, size_t run) {
        const char *row = strstr(out, "swarm: node   busy  pipeline/step  averaging/step  peak RSS");
        cr_assert(row, "run %zu: no traffic columns\n%s", run, out);
        if (run == 0)
                cr_log_info("%.*s", (int)(strstr(row, "swarm: cluster") ? strstr(row, "swarm: cluster") - row : 0), row);
        for (int i = 0; i < nodes; i++) {
                char name[16], busy[8], pu[8], au[8];
                double pv, av;
                cr_assert((row = strchr(row, '\n')), "run %zu\n%s", run, out);
                row++;
                cr_assert_eq(sscanf(row, "swarm: %15s %7s %lf %7s %lf %7s", name, busy, &pv, pu, &av, au), 6,
                             "run %zu: a node without traffic figures: %.80s\n%s", run, row, out);
                cr_expect(pv > 0 && strstr(pu, "B") && av > 0 && strstr(au, "B"), "run %zu: %.80s", run, row);
        }
}

/* Training of about a second, many times: every node's last round has
 * every cluster, and the swarm ends as one averaged model. */
Test(swarm_short, the_last_round_gathers_every_cluster, .timeout = 600) {
        char *const runs[][16] = {
                { "--job", quick, NULL },
                { "--job", quick, NULL },
                { "--job", quick, NULL },
                { "--job", quick, NULL },
                { "--job", quick, "--clusters", "3", NULL },
                { "--job", quick, "--clusters", "3", "--stages", "3", "--sync", NULL },
                { "--job", quick, "--clusters", "3", "--stages", "3", "--sync", NULL },
        };
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
                Proc p;
                swarm(&p, runs[i]);
                int status = proc_exit(&p);
                int nodes = (i < 4 ? 2 : 3) * (i < 5 ? 2 : 3);
                cr_assert_eq(status, 0, "run %zu: exit %d\n%s", i, status, p.out);
                cr_assert(strstr(p.out, "swarm: the averaged model"), "run %zu\n%s", i, p.out);
                cr_assert_eq(test_count(p.out, "The last averaging round included all "), nodes, "run %zu\n%s", i, p.out);
                expect_traffic_columns(p.out, nodes, i);
                cr_log_info("run %zu: %s", i, strstr(p.out, "swarm: the averaged model"));
        }
}

/* More clusters than a round takes (group_size 2, 4 clusters): every ring
 * averages on a 2 x 2 grid, a node links with none but the two members of
 * its rings it meets, and the last two rounds (one per dimension) leave one
 * averaged model all the same. */
Test(swarm_short, wide_rings_average_on_a_grid, .timeout = 300) {
        Proc p;
        swarm(&p, (char *[]){ "--job", quick, "--clusters", "4", "--averaging", "group_size = 2;", NULL });
        int status = proc_exit(&p);
        cr_assert_eq(status, 0, "exit %d\n%s", status, p.out);
        cr_assert(strstr(p.out, "swarm: the averaged model"), "%s", p.out);
        cr_assert_eq(test_count(p.out, "The last averaging round included all 2 members of its group (the last of 2 "
                                       "rounds"), 8, "%s", p.out);
        /* each round needs one dimension's partner only, so a node may log
         * its links before both are up and after one has gone: some reach
         * two, none more */
        cr_assert_geq(test_count(p.out, "Averaging: 2 of 7 other members connected"), 1, "%s", p.out);
        for (int n = 3; n <= 7; n++) {
                char line[64];
                snprintf(line, sizeof line, "Averaging: %d of 7 other members connected", n);
                cr_assert_null(strstr(p.out, line), "a link to a member no round meets\n%s", p.out);
        }
        expect_traffic_columns(p.out, 8, 0);
        cr_log_info("%s", strstr(p.out, "swarm: the averaged model"));
}

/* A restarted node's cluster finishes later than the others by the time
 * the restart cost; on a loaded machine that can be more than the 15 s a
 * last round waits by default, so these swarms' rounds may take 120 s. */
#define LAGGING "round_timeout = 120000;"

/* A node killed with SIGKILL is started again and goes on from its own
 * checkpoint; the swarm still ends as one averaged model. */
Test(swarm_short, a_killed_node_comes_back_from_its_checkpoint, .timeout = 300) {
        Proc p;
        swarm(&p, (char *[]){ "--job", slow, "--restart", "--checkpoint-interval", "1", "--averaging", LAGGING, NULL });
        pid_t pid = node_pid(&p, "c2s2");
        cr_assert(proc_wait_for(&p, "c2s2   Checkpoint written", 60000), "%s", p.out);
        cr_assert_eq(kill(pid, SIGKILL), 0);
        cr_assert(proc_wait_for(&p, "swarm: c2s2 ended with signal 9; starting it again", 30000), "%s", p.out);
        cr_assert(proc_wait_for(&p, "c2s2   Resuming from ", 30000), "the node started afresh\n%s", p.out);
        int status = proc_exit(&p);
        cr_assert_eq(status, 0, "exit %d\n%s", status, p.out);
        cr_assert(strstr(p.out, "swarm: cluster 2: test accuracy "), "%s", p.out);
        cr_assert(strstr(p.out, "swarm: the averaged model"), "%s", p.out);
        cr_assert(strstr(p.out, "swarm: c2s2 ") && strstr(strstr(p.out, "swarm: c2s2 "), "MiB  1\n"),
                  "restarts not counted\n%s", p.out);
}

/* The step and the epochs done that node's last checkpoint of a run says,
 * "c1s1   Checkpoint written: <path> (step N, E epochs done; ...)". */
static void last_checkpoint(const char *out, const char *node, unsigned *step, unsigned *epochs) {
        char want[64];
        snprintf(want, sizeof want, "%s   Checkpoint written: ", node);
        const char *at = NULL;
        for (const char *q = out; (q = strstr(q, want)); q++)
                at = q;
        cr_assert(at, "no checkpoint of %s\n%s", node, out);
        const char *fig = strstr(at, " (step ");
        cr_assert(fig && sscanf(fig, " (step %u, %u epochs done", step, epochs) == 2, "%s", at);
}

/* A swarm resumed from its --dir trains the epochs it lacks, no more: the
 * first stage's checkpoint counts the epochs done (it said one too few at
 * the end of training, and a swarm resumed with one more epoch trained two
 * more); resumed with every epoch done, it is evaluated and not trained. */
Test(swarm_short, a_resumed_swarm_trains_the_epochs_it_lacks, .timeout = 300) {
        char d[200];
        unsigned step1, ep1, step2, ep2, step3, ep3;
        snprintf(d, sizeof d, "%s/resumed", dir);
        Proc p;
        swarm(&p, (char *[]){ "--job", quick, "--dir", d, "--epochs", "1", NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        last_checkpoint(p.out, "c1s1", &step1, &ep1);
        cr_assert(ep1 == 1 && step1 > 0, "step %u, %u epochs done\n%s", step1, ep1, p.out);

        swarm(&p, (char *[]){ "--job", quick, "--dir", d, "--epochs", "2", "--resume", NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "c1s1   Resuming from "), "%s", p.out);
        last_checkpoint(p.out, "c1s1", &step2, &ep2);
        cr_assert(ep2 == 2 && step2 == 2 * step1, "after epoch 2: step %u, %u epochs done (one: step %u)\n%s",
                  step2, ep2, step1, p.out);

        swarm(&p, (char *[]){ "--job", quick, "--dir", d, "--epochs", "2", "--resume", NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        last_checkpoint(p.out, "c1s1", &step3, &ep3);
        cr_assert(ep3 == 2 && step3 == step2, "trained again: step %u, %u epochs done\n%s", step3, ep3, p.out);
        cr_assert(strstr(p.out, "swarm: cluster 1: test accuracy "), "%s", p.out);
}

/* A relative --dir is taken from the working directory (every node
 * refused its configuration: a state directory must be absolute). */
Test(swarm_short, a_relative_dir_is_taken_from_here, .timeout = 300) {
        char d[200];
        Proc p;
        cr_assert_eq(chdir(dir), 0);
        swarm(&p, (char *[]){ "--job", quick, "--dir", "relative", "--epochs", "1", NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        snprintf(d, sizeof d, "%s/relative/c1s1", dir);
        cr_assert_eq(access(d, F_OK), 0, "%s\n%s", d, p.out);
}

/* The same with the outer optimizer on: the node comes back with the
 * anchor and momentum of its checkpoint, and the swarm still ends as one
 * averaged model. */
Test(swarm_short, a_killed_node_comes_back_with_its_outer_state, .timeout = 300) {
        Proc p;
        swarm(&p, (char *[]){ "--job", slow, "--restart", "--checkpoint-interval", "1", "--averaging",
                              "interval_steps = 20; payload = \"int8\"; outer = { momentum = 0.5; }; " LAGGING, NULL });
        /* early: the output kept is its tail, and a slow run writes much */
        cr_assert(proc_wait_for(&p, "outer Nesterov lr 0.7 momentum 0.5", 60000), "%s", p.out);
        pid_t pid = node_pid(&p, "c2s2");
        cr_assert(proc_wait_for(&p, "c2s2   Checkpoint written", 60000), "%s", p.out);
        cr_assert_eq(kill(pid, SIGKILL), 0);
        cr_assert(proc_wait_for(&p, "c2s2   Resuming the outer optimizer from ", 30000), "%s", p.out);
        int status = proc_exit(&p);
        cr_assert_eq(status, 0, "exit %d\n%s", status, p.out);
        cr_assert(strstr(p.out, "swarm: the averaged model"), "%s", p.out);
}

/* A swarm with the outer optimizer that ends, resumed for another epoch:
 * every stage's last checkpoint holds the outer state written with it (the
 * last one went without it, written after the averager had stopped, so a
 * resumed stage took an older anchor and momentum). */
Test(swarm_short, a_resumed_swarm_takes_the_outer_state_of_its_last_checkpoint, .timeout = 300) {
        char d[200];
        snprintf(d, sizeof d, "%s/outer", dir);
        const char *avg = "interval_steps = 5; payload = \"int8\"; outer = { momentum = 0.5; };";
        Proc p;
        swarm(&p, (char *[]){ "--job", quick, "--dir", d, "--epochs", "1", "--averaging", (char *)avg, NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        swarm(&p, (char *[]){ "--job", quick, "--dir", d, "--epochs", "2", "--resume", "--averaging", (char *)avg,
                              NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        for (const char *node = "c1s1\0c1s2\0c2s1\0c2s2\0"; *node; node += 5) {
                char want[80];
                snprintf(want, sizeof want, "%s   Resuming the outer optimizer from ", node);
                cr_assert(strstr(p.out, want), "%s took no outer state\n%s", node, p.out);
        }
        cr_assert(!strstr(p.out, "starts from an older anchor"), "%s", p.out);
}

/* A first stage killed for good: its neighbour gives up after the
 * configured time, and the swarm says there is no averaged model. */
Test(swarm_short, a_stage_gives_up_on_a_neighbour_gone_for_good, .timeout = 300) {
        Proc p;
        swarm(&p, (char *[]){ "--job", slow, "--keep-going", "--neighbour-timeout", "2", NULL });
        pid_t pid = node_pid(&p, "c1s1");
        cr_assert(proc_wait_for(&p, "c1s2   stage 2/2:", 60000), "%s", p.out);
        /* on a loaded machine (this binary's tests run side by side, under
         * ASan too) c1s1 may have given up on c1s2 first, after the same
         * 2 s: gone for good as well */
        if (kill(pid, SIGKILL) != 0)
                cr_assert(errno == ESRCH && proc_wait_for(&p, "swarm: c1s1 ended with status", 10000),
                          "c1s1 (pid %d) neither killed nor ended\n%s", (int)pid, p.out);
        cr_assert(proc_wait_for(&p, "c1s2   Gave up on the previous stage ", 30000), "%s", p.out);
        cr_assert(strstr(p.out, "(pipeline.neighbour_timeout)"), "%s", p.out);
        cr_assert(proc_wait_for(&p, "swarm: c1s2 ended with status 1", 10000), "%s", p.out);
        int status = proc_exit(&p);
        cr_assert_eq(status, 1, "exit %d\n%s", status, p.out);
        cr_assert(strstr(p.out, "swarm: no averaged model: cluster 1 has no result"), "%s", p.out);
        cr_assert(!strstr(p.out, "swarm: the averaged model"), "%s", p.out);
}

/* The same node killed, but started again by hand from its configuration,
 * as an operator would: it goes on from its checkpoint, the swarm waits for
 * it and takes its cluster's result from its state directory, and ends as
 * one averaged model. */
Test(swarm_short, a_node_started_again_by_hand_counts, .timeout = 300) {
        Proc p, back;
        swarm(&p, (char *[]){ "--job", slow, "--keep-going", "--checkpoint-interval", "1", "--averaging", LAGGING,
                              NULL });
        pid_t pid = node_pid(&p, "c2s2");
        cr_assert(proc_wait_for(&p, "c2s2   Checkpoint written", 60000), "%s", p.out);
        const char *in = strstr(p.out, " in /");
        char swarm_dir[128] = "", conf[200];
        cr_assert(in && sscanf(in + 4, "%127[^;]", swarm_dir) == 1, "%s", p.out);
        snprintf(conf, sizeof conf, "%s/c2s2.conf", swarm_dir);
        cr_assert_eq(kill(pid, SIGKILL), 0);
        cr_assert(proc_wait_for(&p, "swarm: c2s2 ended with signal 9", 30000), "%s", p.out);
        proc_start(&back, (char *[]){ RAVNESTD, "--config", conf, "--job", slow, "--progress", "1000", NULL }, NULL);
        cr_assert(proc_wait_for(&back, "Resuming from ", 30000), "the node started afresh\n%s", back.out);
        int status = proc_exit_within(&p, 150000);
        cr_assert_eq(proc_exit(&back), 0, "%s", back.out);
        cr_assert(strstr(p.out, "swarm: c2s2 finished outside the swarm"), "%s\n---- c2s2:\n%s", p.out, back.out);
        cr_assert(strstr(p.out, "swarm: cluster 2: test accuracy "), "%s", p.out);
        cr_assert_eq(status, 0, "exit %d\n%s\n---- c2s2:\n%s", status, p.out, back.out);
        cr_assert(strstr(p.out, "swarm: the averaged model"), "%s", p.out);
}

/* A numeric property in ravnestctl status --json's output; 0 without it. */
static unsigned long long property(const char *json, const char *name) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\": ", name);
        const char *at = strstr(json, key);
        return at ? strtoull(at + strlen(key), NULL, 10) : 0;
}

/* ravnestctl status --json on node's control socket in the swarm of out:
 * its exit status. */
static int node_status_try(const char *out, const char *node, Proc *st) {
        const char *in = strstr(out, " in /");
        char swarm_dir[128] = "", sock[200];
        cr_assert(in && sscanf(in + 4, "%127[^;]", swarm_dir) == 1, "%s", out);
        snprintf(sock, sizeof sock, "%s/%s.sock", swarm_dir, node);
        proc_start(st, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL }, NULL);
        return proc_exit(st);
}

/* The same, of a node that must be answering. */
static void node_status(const char *out, const char *node, Proc *st) {
        cr_assert_eq(node_status_try(out, node, st), 0, "%s", st->out);
}

/* A stage's first status with a step done shows the samples it trained
 * (over the last 2 s, since its start before 2 s passed), the first stage's
 * as the last's: it read 0 samples/s until the series' first window closed,
 * 2 s into training. */
Test(swarm_short, a_stage_training_reports_its_samples_from_the_start, .timeout = 300) {
        Proc p, st;
        swarm(&p, (char *[]){ "--job", slow, "--clusters", "1", NULL });
        cr_assert(proc_wait_for(&p, "swarm: started c1s2 (pid", 30000), "%s", p.out);
        static const char *const nodes[] = { "c1s1", "c1s2" };
        for (size_t i = 0; i < 2; i++) {
                unsigned long long step = 0;
                for (int k = 0; k < 1200 && !step; k++) {
                        if (node_status_try(p.out, nodes[i], &st) == 0)
                                step = property(st.out, "Step");
                        if (!step)
                                usleep(50 * 1000);
                }
                cr_assert_gt(step, 0, "%s\n%s", st.out, p.out);
                cr_expect_gt(property(st.out, "SamplesPerSecond"), 0, "%s: training, 0 samples/s\n%s", nodes[i],
                             st.out);
        }
        kill(p.pid, SIGINT);
        cr_assert_eq(proc_exit(&p), 130, "%s", p.out);
}

/* The other member of its ring killed: a node's rounds have nobody else,
 * average nothing and count as failed; AveragingRounds and the last round
 * (its time and members) stay as they were, and the status says so. */
Test(swarm_short, rounds_without_another_member_fail, .timeout = 300) {
        Proc p, st;
        unsigned long long done = 0, failed, last;
        swarm(&p, (char *[]){ "--job", slow, "--clusters", "2", "--stages", "1", "--keep-going", NULL });
        pid_t pid = node_pid(&p, "c2s1");
        for (int k = 0; k < 240 && !done; k++) { /* its socket comes once it has started */
                usleep(250 * 1000);
                if (node_status_try(p.out, "c1s1", &st) == 0)
                        done = property(st.out, "AveragingRounds");
        }
        cr_assert_gt(done, 0, "%s\n%s", st.out, p.out);
        cr_assert_eq(kill(pid, SIGKILL), 0);
        cr_assert(proc_wait_for(&p, "c1s1   Averaging round ", 60000), "%s", p.out);
        cr_assert(proc_wait_for(&p, " failed: no other of the 2 members of its group took part, nothing was averaged",
                                60000), "%s", p.out);
        node_status(p.out, "c1s1", &st);
        for (int k = 0; k < 40 && property(st.out, "AveragingRoundsFailed") == 0; k++) { /* reported 4 times a second */
                usleep(250 * 1000);
                node_status(p.out, "c1s1", &st);
        }
        done = property(st.out, "AveragingRounds");
        failed = property(st.out, "AveragingRoundsFailed");
        last = property(st.out, "LastAveragingUSec");
        cr_assert_gt(failed, 0, "%s", st.out);
        cr_assert_gt(last, 0, "%s", st.out);
        for (int k = 0; k < 240 && property(st.out, "AveragingRoundsFailed") == failed; k++) {
                usleep(250 * 1000);
                node_status(p.out, "c1s1", &st);
        }
        cr_assert_gt(property(st.out, "AveragingRoundsFailed"), failed, "%s", st.out);
        cr_assert_eq(property(st.out, "AveragingRounds"), done, "a round alone counted as done\n%s", st.out);
        cr_assert_eq(property(st.out, "LastAveragingUSec"), last, "a round alone is the last round\n%s", st.out);
        cr_assert_eq(property(st.out, "LastAveragingParticipants"), 2, "%s", st.out);
        kill(p.pid, SIGINT);
        proc_exit(&p);
}

/* A last stage started alone (its previous stage never comes) only waits:
 * Busy 0, the stage it waits for in WaitingFor and the status, and progress
 * lines without a loss or an accuracy of micro-batches it never scored. */
Test(swarm_short, a_stage_waiting_for_its_neighbour_is_not_busy, .timeout = 300) {
        char d[200], conf[220], sock[220];
        Proc p, alone, st;
        snprintf(d, sizeof d, "%s/waiting", dir);
        swarm(&p, (char *[]){ "--job", quick, "--dir", d, "--clusters", "1", "--epochs", "1", NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        snprintf(conf, sizeof conf, "%s/c1s2.conf", d);
        snprintf(sock, sizeof sock, "%s/c1s2.sock", d);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -f %s/c1s2/*.ckpt", d); /* from step 0 */
        cr_assert_eq(system(cmd), 0);
        proc_start(&alone, (char *[]){ RAVNESTD, "--config", conf, "--job", quick, "--epochs", "2", "--progress",
                                       "1000", NULL }, NULL);
        cr_assert(proc_wait_for(&alone, "stage 2/2: ", 60000), "%s", alone.out);
        cr_assert(proc_wait_for(&alone, "waiting for stage 1: not connected", 10000), "%s", alone.out);
        cr_assert_null(strstr(alone.out, "loss 0.0000, acc 0.00%"), "%s", alone.out);
        /* connections in their handshake are no peers (they counted), and
         * a failed handshake on the pipeline's port is logged (it was not) */
        int silent[6], junk = test_connect_port(pipeline_port(conf));
        for (int i = 0; i < 6; i++)
                silent[i] = test_connect_port(pipeline_port(conf));
        uint8_t other_version[32] = { 'R', 'V', 'N', '1', 9 }; /* a frame header of version 9 */
        cr_assert_eq(write(junk, other_version, sizeof other_version), (ssize_t)sizeof other_version);
        cr_assert(proc_wait_for(&alone, "peer speaks protocol version 9", 10000), "%s", alone.out);
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        cr_assert_eq(property(st.out, "Peers"), 0, "handshakes counted as peers: %s", st.out);
        for (int i = 0; i < 6; i++)
                close(silent[i]);
        close(junk);
        bool reported = false;
        for (int k = 0; k < 120 && !reported; k++) {
                proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL }, NULL);
                cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
                reported = strstr(st.out, "\"WaitingFor\": \"stage 1: not connected\"") && !strstr(st.out, "\"Busy\": -1");
                if (!reported)
                        usleep(250 * 1000);
        }
        cr_assert(reported, "%s", st.out);
        cr_assert(strstr(st.out, "\"Busy\": 0,"), "a stage that only waits is busy\n%s", st.out);
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        cr_assert(strstr(st.out, "State: training (waiting for stage 1: not connected)"), "%s", st.out);
        cr_assert(strstr(st.out, " Checkpoint: none yet"), "%s", st.out);
        /* a checkpoint of step 0 is one (it said "none yet") */
        proc_start(&st, (char *[]){ RAVNESTCTL, "checkpoint", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        cr_assert(strstr(st.out, "Checkpoint written at step 0"), "%s", st.out);
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        cr_assert(strstr(st.out, " Checkpoint: step 0, "), "%s", st.out);
        kill(alone.pid, SIGTERM);
        cr_assert_eq(proc_exit(&alone), 0, "%s", alone.out);
}

/* The status a stage reports on its control socket, mid-run: the bytes it
 * moved over its pipeline links and to average, in total and per step, as
 * properties and in ravnestctl's lines. */
Test(swarm_short, a_stage_reports_its_traffic_on_its_control_socket, .timeout = 300) {
        Proc p, st;
        swarm(&p, (char *[]){ "--job", slow, NULL });
        cr_assert(proc_wait_for(&p, "c1s2   stage 2/2:", 60000), "%s", p.out);
        cr_assert(proc_wait_for(&p, "c1s1   Averaging round ", 60000), "%s", p.out);
        const char *in = strstr(p.out, " in /");
        char swarm_dir[128] = "", sock[200];
        cr_assert(in && sscanf(in + 4, "%127[^;]", swarm_dir) == 1, "%s", p.out);
        snprintf(sock, sizeof sock, "%s/c1s1.sock", swarm_dir);
        usleep(500 * 1000); /* the stage reports every quarter second */

        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        static const char *const fields[] = { "PipelineBytesSent", "PipelineBytesReceived", "PipelineBytesPerStep",
                                              "AveragingBytesSent", "AveragingBytesReceived", "AveragingBytesPerStep" };
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
                char key[64];
                snprintf(key, sizeof key, "\"%s\": ", fields[i]);
                const char *at = strstr(st.out, key);
                cr_assert(at, "no %s: %s", fields[i], st.out);
                cr_expect_gt(strtoull(at + strlen(key), NULL, 10), 0, "%s: %s", fields[i], st.out);
        }
        /* and what it averages with: the method, the group (the 2 stages
         * holding its layers, of the swarm's 4), the values */
        cr_expect(strstr(st.out, "\"AveragingMethod\": \"ring\""), "%s", st.out);
        cr_expect_eq(property(st.out, "AveragingNodes"), 2, "%s", st.out);
        /* its last round, with the other cluster's stage 1 */
        for (int k = 0; k < 120 && property(st.out, "LastAveragingParticipants") == 0; k++) {
                usleep(250 * 1000);
                proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL }, NULL);
                cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        }
        cr_expect_eq(property(st.out, "LastAveragingParticipants"), 2, "%s", st.out);
        cr_expect_eq(property(st.out, "LastAveragingGroup"), 2, "%s", st.out);
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        cr_log_info("%.*s", (int)st.len, st.out);
        const char *t = strstr(st.out, "    Traffic: pipeline: ");
        cr_assert(t, "%s", st.out);
        cr_expect(strstr(t, " received (") && strstr(t, "/step); averaging: "), "%s", st.out);
        cr_expect(strstr(st.out, "  Averaging: last round 2 of 2 members, "), "%s", st.out);
        cr_expect(strstr(p.out, " done: 2 of 2 members, ") && !strstr(p.out, " of 4 members"), "%s", p.out);

        kill(p.pid, SIGINT);
        cr_assert_eq(proc_exit(&p), 130, "%s", p.out);
}

/* Half the nodes accept no connections (--behind-nat: no address in the
 * plan, no listener): they dial their neighbour and their ring's other
 * member, nobody dials them, and the swarm ends as one averaged model. Two
 * such nodes holding the same layers cannot link: every node refuses that
 * plan with its file, line and setting, and the swarm exits non-zero,
 * unless a relay joins them. */
Test(swarm_short, nodes_behind_nat_dial_every_link, .timeout = 300) {
        Proc p, st_text;
        swarm(&p, (char *[]){ "--job", quick, "--behind-nat", "c1s2,c2s1", NULL });
        int status = proc_exit_within(&p, 240000);
        cr_assert_eq(status, 0, "%s", p.out);
        cr_assert(strstr(p.out, "c1s2   This stage accepts no connections: it dials its neighbours"), "%s", p.out);
        cr_assert(strstr(p.out, "c2s1   Averaging with 4 members (ring), member 3, every 0.25 s, dialing every member"),
                  "%s", p.out);
        cr_assert(strstr(p.out, "c1s1   Averaging with 4 members (ring), member 1, every 0.25 s, listening on"), "%s",
                  p.out);
        cr_assert(strstr(p.out, "swarm: the averaged model"), "%s", p.out);

        /* the status says which nodes peers reach and which dial out */
        swarm(&p, (char *[]){ "--job", slow, "--behind-nat", "c1s2,c2s1", NULL });
        cr_assert(proc_wait_for(&p, "c1s2   Averaging round ", 60000), "%s", p.out);
        const char *in = strstr(p.out, " in /");
        char swarm_dir[128] = "", sock[200];
        cr_assert(in && sscanf(in + 4, "%127[^;]", swarm_dir) == 1, "%s", p.out);
        usleep(500 * 1000); /* the stage reports every quarter second */
        static const char *const want[][2] = { { "c1s1", "reachable" }, { "c1s2", "dials out" },
                                               { "c2s1", "dials out" }, { "c2s2", "reachable" } };
        for (size_t i = 0; i < 4; i++) {
                Proc st;
                char expect[64];
                bool seen = false;
                snprintf(sock, sizeof sock, "%s/%s.sock", swarm_dir, want[i][0]);
                snprintf(expect, sizeof expect, "\"Reachability\": \"%s\"", want[i][1]);
                /* a stage reports once it trains: after its first round */
                for (int k = 0; k < 120 && !seen; k++) {
                        seen = node_status_try(p.out, want[i][0], &st) == 0 && strstr(st.out, expect);
                        if (!seen)
                                usleep(250 * 1000);
                }
                cr_expect(seen, "%s: no %s in %s", want[i][0], expect, st.out);
        }
        proc_start(&st_text, (char *[]){ RAVNESTCTL, "status", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st_text), 0, "%s", st_text.out);
        cr_expect(strstr(st_text.out, "  Reachable: yes: a peer or the coordinator has dialed in"), "%s", st_text.out);
        kill(p.pid, SIGINT);
        cr_assert_eq(proc_exit(&p), 130, "%s", p.out);

        /* with a relay, even two nodes behind NAT link: through it */
        swarm(&p, (char *[]){ "--job", quick, "--behind-nat", "c1s1,c1s2,c2s1", "--relay", NULL });
        status = proc_exit_within(&p, 240000);
        cr_assert_eq(status, 0, "%s", p.out);
        cr_assert(strstr(p.out, "c1s2   Previous stage "), "%s", p.out);
        cr_assert(strstr(p.out, "swarm: the averaged model"), "%s", p.out);
        const char *joined = strstr(p.out, "swarm: the relay joined ");
        cr_assert(joined && atoi(joined + strlen("swarm: the relay joined ")) >= 2, "%s", p.out);
        /* the relay holds the nodes' secret: every link it relayed proved it */
        const char *proven = joined ? strstr(joined, " links (") : NULL;
        cr_assert(proven && atoi(proven + strlen(" links (")) >= 2, "%s", p.out);

        swarm(&p, (char *[]){ "--job", quick, "--behind-nat", "c1s1,c2s1", NULL });
        status = proc_exit_within(&p, 240000);
        cr_assert_neq(status, 0, "%s", p.out);
        cr_assert(strstr(p.out, "averaging.members: members 1 and 3 hold the same layers but both accept no "
                                "connections"), "%s", p.out);
        swarm(&p, (char *[]){ "--job", quick, "--behind-nat", "c2s1,c2s2", NULL });
        status = proc_exit_within(&p, 240000);
        cr_assert_neq(status, 0, "%s", p.out);
        cr_assert(strstr(p.out, ".conf:18: pipeline.clusters.[1].nodes.[1]: stages 1 and 2 both accept no connections"),
                  "%s", p.out);
}

/* The line of out that begins with head ends with tail. */
static bool line_ends_with(const char *out, const char *head, const char *tail) {
        const char *line = strstr(out, head), *end = line ? strchr(line, '\n') : NULL;
        size_t n = strlen(tail);
        return end && (size_t)(end - line) >= n && !memcmp(end - n, tail, n);
}

/* --pipeline adds to every node's pipeline section: each first stage says
 * it starts without late gradients for as long as asked; a bad setting
 * there stops the swarm with the nodes' own message, naming file, line
 * and setting. */
Test(swarm_short, pipeline_settings_reach_every_node, .timeout = 300) {
        Proc p;
        swarm(&p, (char *[]){ "--job", quick, "--pipeline", "synchronous_start = 5;", NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        static const char tail[] = "at most 4 in flight (no gradient late over the first 5 updates)";
        for (int c = 1; c <= 2; c++) {
                char want[128];
                snprintf(want, sizeof want, "c%ds1   Stage 1 of 2 in cluster %d of 2: ", c, c);
                cr_assert(line_ends_with(p.out, want, tail), "no \"%s\" at the end of that line:\n%s", tail, p.out);
                /* the last stage injects nothing: its line says nothing of it */
                snprintf(want, sizeof want, "c%ds2   Stage 2 of 2 in cluster %d of 2: ", c, c);
                cr_assert(line_ends_with(p.out, want, "at most 4 in flight"), "%s", p.out);
        }
        swarm(&p, (char *[]){ "--job", quick, "--pipeline", "weight_prediction = 3;", NULL });
        cr_assert_neq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, ".conf:") && strstr(p.out, ": pipeline.weight_prediction: must be true or false"),
                  "%s", p.out);
}
