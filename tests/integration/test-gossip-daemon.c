/* Gossip and auto averaging between real ravnestd processes on loopback:
 * four members each train a quarter of Fashion-MNIST and mix with their
 * alt-exp-ring group every step; members on "auto" measure, agree on one
 * method and log it, and `ravnestctl predict` asks one of them. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../lib/proc.h"
#include "net/identity.h"

#define N 4

static void skip_without_dataset(void) {
        if (access(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist to run this test", FASHION_MNIST_DIR);
}

typedef struct Swarm {
        char dir[64], secret[256], conf[N][256], hex[N][IDENTITY_HEX_SIZE], socket[256];
        uint16_t port[N];
        Proc p[N];
} Swarm;

static const char *const names[N] = { "a", "b", "c", "d" };

/* method: the averaging group's settings besides listen and members;
 * member 0 has a control socket. */
static void swarm_configure(Swarm *s, const char *method) {
        snprintf(s->dir, sizeof s->dir, "/tmp/ravnest-test-gossip-XXXXXX");
        cr_assert_not_null(mkdtemp(s->dir));
        snprintf(s->secret, sizeof s->secret, "%s/secret", s->dir);
        test_write_file(s->secret, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
        snprintf(s->socket, sizeof s->socket, "%s/control", s->dir);
        for (int i = 0; i < N; i++) {
                test_make_identity(s->dir, names[i], s->hex[i]);
                s->port[i] = test_free_port();
        }
        char members[2048] = "";
        for (int i = 0; i < N; i++)
                snprintf(members + strlen(members), sizeof members - strlen(members), "%s\"%s@127.0.0.1:%u\"",
                         i ? ", " : "", s->hex[i], s->port[i]);
        for (int i = 0; i < N; i++) {
                char text[4096];
                snprintf(s->conf[i], sizeof s->conf[i], "%s/%s.conf", s->dir, names[i]);
                snprintf(text, sizeof text,
                         "state_directory = \"%s/state-%s\";\n"
                         "control_socket = \"%s\";\n"
                         "idle = { enabled = false; };\n"
                         "threads = 1;\n"
                         "network = { secret_file = \"%s\"; };\n"
                         "averaging = {\n"
                         "%s"
                         "  listen = \"127.0.0.1:%u\";\n"
                         "  members = [ %s ];\n"
                         "};\n",
                         s->dir, names[i], i == 0 ? s->socket : "", s->secret, method, s->port[i], members);
                test_write_file(s->conf[i], text, 0644);
        }
}

static void swarm_start(Swarm *s, const char *job) {
        for (int i = 0; i < N; i++)
                proc_start(&s->p[i], (char *[]){ RAVNESTD, "--config", s->conf[i], "--job", (char *)job, "--epochs", "1",
                                                 "--progress", "0", NULL }, NULL);
}

static void swarm_stop(Swarm *s) {
        for (int i = 0; i < N; i++)
                kill(s->p[i].pid, SIGTERM);
        for (int i = 0; i < N; i++)
                cr_assert_eq(proc_exit(&s->p[i]), 0, "%s: %s", names[i], s->p[i].out);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", s->dir);
        cr_assert_eq(system(cmd), 0);
}

/* The MLP job with AccumAdam, the optimizer the paper pairs with gossip. */
static void write_accumadam_job(const char *dir, char *path, size_t len) {
        snprintf(path, len, "%s/mlp-accumadam.job", dir);
        test_write_file(path,
                   "name = \"fashion-mnist-mlp-accumadam\";\n"
                   "dataset = { name = \"fashion-mnist\"; classes = 10; mean = 0.2860; std = 0.3530; };\n"
                   "model = { input = [1, 28, 28];\n"
                   "  layers = ( { type = \"flatten\"; }, { type = \"linear\"; out = 1024; }, { type = \"relu\"; },\n"
                   "    { type = \"linear\"; out = 1024; }, { type = \"relu\"; }, { type = \"linear\"; out = 10; } ); };\n"
                   "optimizer = { type = \"accumadam\"; lr = 0.001; schedule = \"cosine\"; accum_steps = 4; };\n"
                   "training = { batch_size = 128; epochs = 1; seed = 1; };\n",
                   0644);
}

/* Bars for one epoch on a quarter of the data each: one member alone on
 * its quarter reaches about 80%; mixing brings the four to what the whole
 * set gives (about 84%), and to one another. */
#define ACCURACY_BAR 81.0
#define SPREAD_BAR 1.0

Test(gossip, four_members_alt_exp_ring, .timeout = 300) {
        skip_without_dataset();
        Swarm s;
        char job[256];
        swarm_configure(&s, "  method = \"gossip\";\n  topology = \"alt-exp-ring\";\n");
        write_accumadam_job(s.dir, job, sizeof job);
        swarm_start(&s, job);
        double acc[N], lo = 100, hi = 0, rss = 0;
        for (int i = 0; i < N; i++) {
                cr_assert(proc_wait_for(&s.p[i], "Finished", 240000), "%s: %s", names[i], s.p[i].out);
                cr_assert(strstr(s.p[i].out, "gossip, topology alt-exp-ring"), "%s", s.p[i].out);
                cr_assert(strstr(s.p[i].out, "Gossip: first exchange done with 2 members"), "%s: %s", names[i],
                          s.p[i].out);
                acc[i] = test_final_accuracy(s.p[i].out);
                lo = acc[i] < lo ? acc[i] : lo;
                hi = acc[i] > hi ? acc[i] : hi;
        }
        for (int i = 0; i < N; i++) {
                cr_assert(proc_wait_for(&s.p[i], "serving peers", 60000), "%s: %s", names[i], s.p[i].out);
                double m = (proc_peak_rss_kib(s.p[i].pid) / 1024.0);
                rss = m > rss ? m : rss;
        }
        cr_log_info("gossip alt-exp-ring, AccumAdam, 1 epoch on a quarter each: test accuracy %.2f %.2f %.2f %.2f "
                    "(spread %.2f points); peak RSS of a member %.0f MiB\n",
                    acc[0], acc[1], acc[2], acc[3], hi - lo, rss);
        for (int i = 0; i < N; i++)
                cr_assert(acc[i] >= ACCURACY_BAR, "%s: accuracy %.2f%% under %.1f: %s", names[i], acc[i], ACCURACY_BAR,
                          s.p[i].out);
        cr_assert(hi - lo <= SPREAD_BAR, "the members did not come together: accuracies %.2f..%.2f", lo, hi);
        swarm_stop(&s);
}

/* What auto runs when the model picks all-reduce: every member every step. */
Test(gossip, complete_topology_averages_everyone, .timeout = 300) {
        skip_without_dataset();
        Swarm s;
        swarm_configure(&s, "  method = \"gossip\";\n  topology = \"complete\";\n");
        swarm_start(&s, SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job");
        /* a stranger on a member's port is logged, as the ring's are (gossip
         * said nothing of it) */
        cr_assert(proc_wait_for(&s.p[0], "Gossip: first exchange done", 120000), "%s", s.p[0].out);
        int junk = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(s.port[0]),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        cr_assert(junk >= 0 && connect(junk, (struct sockaddr *)&to, sizeof to) == 0);
        cr_assert_eq(write(junk, "GET / HTTP/1.0\r\n\r\n", 18), 18);
        close(junk);
        cr_assert(proc_wait_for(&s.p[0], "Averaging: a connection from 127.0.0.1:", 60000), "%s", s.p[0].out);
        double acc[N], lo = 100, hi = 0;
        for (int i = 0; i < N; i++) {
                cr_assert(proc_wait_for(&s.p[i], "Finished", 240000), "%s: %s", names[i], s.p[i].out);
                cr_assert(strstr(s.p[i].out, "Gossip: first exchange done with 4 members"), "%s: %s", names[i],
                          s.p[i].out);
                acc[i] = test_final_accuracy(s.p[i].out);
                lo = acc[i] < lo ? acc[i] : lo;
                hi = acc[i] > hi ? acc[i] : hi;
        }
        cr_log_info("gossip complete, SGD, 1 epoch on a quarter each: test accuracy %.2f %.2f %.2f %.2f\n", acc[0],
                    acc[1], acc[2], acc[3]);
        for (int i = 0; i < N; i++)
                cr_assert(acc[i] >= ACCURACY_BAR, "%s: accuracy %.2f%%: %s", names[i], acc[i], s.p[i].out);
        cr_assert(hi - lo <= SPREAD_BAR, "accuracies %.2f..%.2f", lo, hi);
        swarm_stop(&s);
}

/* The chosen method from "Averaging auto: <method> from step". */
static void auto_choice(const char *out, char *ret, size_t len) {
        const char *p = strstr(out, "Averaging auto: "), *e;
        ret[0] = '\0';
        if (!p || !(e = strstr(p, " from step")))
                return;
        p += strlen("Averaging auto: ");
        snprintf(ret, len, "%.*s", (int)(e - p), p);
}

Test(gossip, auto_members_agree_and_predict_asks_the_node, .timeout = 300) {
        skip_without_dataset();
        Swarm s;
        char choice[N][64];
        swarm_configure(&s, "  method = \"auto\";\n");
        swarm_start(&s, SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job");
        for (int i = 0; i < N; i++) {
                cr_assert(proc_wait_for(&s.p[i], " from step", 120000), "%s: %s", names[i], s.p[i].out);
                auto_choice(s.p[i].out, choice[i], sizeof choice[i]);
                cr_assert(strstr(s.p[i].out, "every member chose"), "%s: no agreement: %s", names[i], s.p[i].out);
                cr_assert_str_eq(choice[i], choice[0], "%s chose %s, %s chose %s", names[i], choice[i], names[0],
                                 choice[0]);
        }
        const char *m = strstr(s.p[0].out, "Runtime model");
        const char *e = m ? strchr(m, '\n') : NULL;
        cr_log_info("auto: every member chose %s; %.*s\n", choice[0], e ? (int)(e - m) : 0, m ? m : "");

        /* ravnestctl predict with no figures: the node's own */
        Proc c;
        proc_start(&c, (char *[]){ RAVNESTCTL, "predict", "--socket", s.socket, NULL }, NULL);
        int code = proc_exit(&c);
        cr_assert_eq(code, 0, "exit %d: %s", code, c.out);
        cr_assert(strstr(c.out, "averaging auto: "), "%s", c.out);
        cr_assert(strstr(c.out, "4 nodes, 1863690 parameters"), "%s", c.out);
        cr_assert(strstr(c.out, "recommended: "), "%s", c.out);
        char want[96];
        snprintf(want, sizeof want, "recommended: %s ", choice[0]);
        cr_assert(strstr(c.out, want), "the node's figures must give its choice (%s): %s", choice[0], c.out);
        cr_log_info("%s", c.out);
        /* the member's averaging traffic, in total and per step, in its status
         * (reported every quarter second: it may take a report or two to show) */
        bool counted = false;
        for (int tries = 0; tries < 40 && !counted; tries++) {
                proc_start(&c, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", s.socket, NULL }, NULL);
                cr_assert_eq(proc_exit(&c), 0, "%s", c.out);
                const char *sent = strstr(c.out, "\"AveragingBytesSent\": "),
                           *per = strstr(c.out, "\"AveragingBytesPerStep\": ");
                cr_assert(sent && per, "%s", c.out);
                counted = strtoull(sent + 22, NULL, 10) > 0 && strtoull(per + 25, NULL, 10) > 0;
                if (!counted)
                        usleep(250 * 1000);
        }
        cr_expect(counted, "no averaging bytes in the status after 10 s: %s", c.out);
        /* no node there: 69, and it says so */
        char nowhere[300];
        snprintf(nowhere, sizeof nowhere, "%s/nowhere", s.dir);
        proc_start(&c, (char *[]){ RAVNESTCTL, "predict", "--socket", nowhere, NULL }, NULL);
        code = proc_exit(&c);
        cr_assert_eq(code, 69, "exit %d: %s", code, c.out);
        cr_assert(strstr(c.out, "not reachable"), "%s", c.out);
        swarm_stop(&s);
}
