/* Watching a training run: a swarm on small generated data leaves a series
 * per node that `ravnestctl plot` draws, a line per node; `ravnestctl top`
 * shows every node of a running swarm, a line per node per refresh when its
 * output is not a terminal, and a full-screen view in a terminal (tmux)
 * that q ends. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/data.h"
#include "../lib/proc.h"

static char dir[] = "/tmp/ravnest-test-watch-XXXXXX";
static char data[128], quick[160], slow[160];
static const char *const nodes[] = { "c1s1", "c1s2", "c2s1", "c2s2" };

static void setup(void) {
        cr_assert(mkdtemp(dir));
        snprintf(data, sizeof data, "%s/8x8", dir);
        test_write_idx_data(data, &(TestData){ .h = 8, .w = 8, .classes = 10, .n_train = 3000, .n_test = 500 });
        snprintf(quick, sizeof quick, "%s/quick.job", dir);
        snprintf(slow, sizeof slow, "%s/slow.job", dir);
        test_write_mlp_job(quick, data, 8, 8, 10, 3);   /* a few seconds of training */
        test_write_mlp_job(slow, data, 8, 8, 10, 1000); /* runs until stopped */
}

static void teardown(void) {
        test_remove_tree(dir);
}

TestSuite(watch, .init = setup, .fini = teardown);

static int run(Proc *p, char *const argv[]) {
        proc_start(p, argv, NULL);
        return proc_exit(p);
}

/* A slow swarm in dir/swarm, running: its progress lines have begun. */
static void start_slow_swarm(Proc *p, char *swarm_dir, size_t len) {
        snprintf(swarm_dir, len, "%s/swarm", dir);
        proc_start(p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--progress", "1000", "--job", slow,
                                  "--dir", swarm_dir, NULL }, NULL);
        cr_assert(proc_wait_for(p, "c1s2   stage 2/2:", 60000), "%s", p->out);
        usleep(500 * 1000); /* every node reports */
}

/* The rows of the series at path from byte offset on, in text. */
static int rows_since(const char *path, long offset, char *text, size_t len) {
        FILE *f = fopen(path, "re");
        cr_assert(f, "no %s", path);
        fseek(f, offset, SEEK_SET);
        text[fread(text, 1, len - 1, f)] = 0;
        fclose(f);
        return test_count(text, "\n");
}

/* Field i of a CSV row, counted from 0. */
static void field(const char *row, int i, char *out, size_t len) {
        for (; i > 0 && row; i--)
                row = strchr(row, ',') ? strchr(row, ',') + 1 : NULL;
        size_t n = row ? strcspn(row, ",\n") : 0;
        snprintf(out, len, "%.*s", (int)n, row ? row : "");
}

static long file_size(const char *path) {
        FILE *f = fopen(path, "re");
        cr_assert(f, "no %s", path);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fclose(f);
        return n;
}

/* Paused on its control socket sock, a node goes on writing a row every
 * 2 s into its series at path, with no throughput and not busy (it wrote
 * none while paused). */
static void paused_node_writes_rows(const char *sock, const char *path) {
        Proc c;
        char text[4096], rate[32], busy[32];
        cr_assert_eq(run(&c, (char *[]){ RAVNESTCTL, "pause", "--socket", (char *)sock, NULL }), 0, "%s", c.out);
        for (int k = 0; k < 100 && !strstr(c.out, "\"State\": \"paused\""); k++) {
                usleep(100 * 1000);
                run(&c, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", (char *)sock, NULL });
        }
        cr_assert(strstr(c.out, "\"State\": \"paused\""), "%s", c.out);
        long offset = file_size(path);
        for (int k = 0; k < 100 && rows_since(path, offset, text, sizeof text) < 3; k++)
                usleep(200 * 1000);
        cr_assert_geq(rows_since(path, offset, text, sizeof text), 3, "no rows while paused: %s", text);
        /* the last row's window is wholly paused: time,elapsed,epoch,step,train_loss,valid_loss,samples_per_sec,busy */
        const char *last = text + strlen(text) - 1;
        while (last > text && last[-1] != '\n')
                last--;
        field(last, 6, rate, sizeof rate);
        field(last, 7, busy, sizeof busy);
        cr_assert(!strcmp(rate, "0") && !strcmp(busy, "0"), "a paused row: %s", last);
        cr_assert_eq(run(&c, (char *[]){ RAVNESTCTL, "resume", "--socket", (char *)sock, NULL }), 0, "%s", c.out);
}

Test(watch, a_paused_node_writes_rows, .timeout = 300) {
        Proc p, node;
        char swarm_dir[128], sock[200], path[256], conf[200], text[512];
        start_slow_swarm(&p, swarm_dir, sizeof swarm_dir);
        snprintf(sock, sizeof sock, "%s/c1s2.sock", swarm_dir);
        snprintf(path, sizeof path, "%s/c1s2/test-mlp-8x8.series.csv", swarm_dir);
        paused_node_writes_rows(sock, path);
        kill(p.pid, SIGINT);
        proc_exit(&p);

        /* a node training alone (faster than a swarm: for longer) */
        char forever[160];
        snprintf(forever, sizeof forever, "%s/forever.job", dir);
        test_write_mlp_job(forever, data, 8, 8, 10, 100000);
        snprintf(conf, sizeof conf, "%s/alone.conf", dir);
        snprintf(sock, sizeof sock, "%s/alone.sock", dir);
        snprintf(text, sizeof text, "state_directory = \"%s/alone\";\ncontrol_socket = \"%s\";\n"
                 "idle = { enabled = false; };\nthreads = 1;\n", dir, sock);
        test_write_file(conf, text, 0644);
        proc_start(&node, (char *[]){ RAVNESTD, "--config", conf, "--job", forever, "--progress", "1000", NULL },
                   NULL);
        cr_assert(proc_wait_for(&node, " done: train loss ", 60000), "%s", node.out);
        snprintf(path, sizeof path, "%s/alone/test-mlp-8x8.series.csv", dir);
        for (int k = 0; k < 100 && access(path, R_OK) < 0; k++)
                usleep(100 * 1000);
        paused_node_writes_rows(sock, path);
        kill(node.pid, SIGTERM);
        cr_assert_eq(proc_exit(&node), 0, "%s", node.out);
}

Test(watch, a_kept_swarm_leaves_series_that_plot_draws, .timeout = 300) {
        Proc p, plot;
        proc_start(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", RAVNESTD, "--progress", "1000", "--job", quick,
                                   "--keep", NULL }, NULL);
        int status = proc_exit(&p);
        cr_assert_eq(status, 0, "exit %d\n%s", status, p.out);
        const char *said = strstr(p.out, "swarm: series in ");
        char swarm_dir[128] = "", svg[200], cmd[200];
        cr_assert(said && sscanf(said + 17, "%127[^;]", swarm_dir) == 1, "%s", p.out);
        cr_expect(strstr(said, "; ravnestctl plot "), "%s", said);

        for (size_t i = 0; i < 4; i++) { /* a header and rows */
                char path[256], text[4096] = "";
                snprintf(path, sizeof path, "%s/%s/test-mlp-8x8.series.csv", swarm_dir, nodes[i]);
                FILE *f = fopen(path, "re");
                cr_assert(f, "no %s", path);
                text[fread(text, 1, sizeof text - 1, f)] = 0;
                fclose(f);
                cr_expect(!strncmp(text, "time,elapsed,epoch,step,train_loss,valid_loss,", 46), "%s", text);
                cr_expect_geq(test_count(text, "\n"), 2, "%s: %s", path, text);
        }

        snprintf(svg, sizeof svg, "%s/run.svg", swarm_dir);
        status = run(&plot, (char *[]){ RAVNESTCTL, "plot", swarm_dir, "--output", svg, NULL });
        cr_assert_eq(status, 0, "exit %d: %s", status, plot.out);
        FILE *f = fopen(svg, "re");
        cr_assert(f, "no %s: %s", svg, plot.out);
        static char text[1 << 20];
        text[fread(text, 1, sizeof text - 1, f)] = 0;
        fclose(f);
        cr_expect(strstr(text, "</svg>"), "not a whole SVG");
        cr_expect_geq(test_count(text, "<polyline"), 4, "%s", plot.out);
        for (size_t i = 0; i < 4; i++) { /* every node's throughput */
                char want[64];
                snprintf(want, sizeof want, "<polyline data-series=\"%s\"", nodes[i]);
                cr_expect_geq(test_count(text, want), 1, "no line of %s", nodes[i]);
        }
        cr_expect(strstr(text, "data-series=\"c1s2\"") && strstr(text, "Loss"), "the last stages' loss");
        cr_log_info("%.*s", (int)plot.len, plot.out);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", swarm_dir);
        (void)!system(cmd);
}

Test(watch, top_prints_a_line_per_node_per_refresh_off_a_terminal, .timeout = 300) {
        Proc p, top;
        char swarm_dir[200];
        start_slow_swarm(&p, swarm_dir, sizeof swarm_dir);
        int status = run(&top, (char *[]){ RAVNESTCTL, "top", "--swarm", swarm_dir, "--iterations", "2", "--interval",
                                           "0.5", NULL });
        cr_expect_eq(status, 0, "exit %d: %s", status, top.out);
        cr_log_info("%.*s", (int)top.len, top.out);
        cr_expect(!strchr(top.out, '\033'), "escapes off a terminal: %s", top.out);
        for (size_t i = 0; i < 4; i++) {
                char want[16];
                snprintf(want, sizeof want, "%s ", nodes[i]);
                cr_expect_eq(test_count(top.out, want), 2, "%s twice: %s", nodes[i], top.out);
        }
        /* the columns named once, above the rows (they were not named) */
        static const char head[] = "NODE       STATE        CL/ST   EPOCH      STEP     LOSS  SAMPLES/S  BUSY  ROUNDS";
        cr_expect(!strncmp(top.out, head, strlen(head)), "%s", top.out);
        cr_expect_eq(test_count(top.out, "NODE "), 1, "%s", top.out);
        cr_expect_eq(test_count(top.out, "\n"), 9, "%s", top.out);
        cr_expect_geq(test_count(top.out, "training"), 4, "%s", top.out);
        cr_expect(!strstr(top.out, "unreachable"), "%s", top.out);

        /* a node that does not answer is said, the others still shown */
        char sock[256];
        snprintf(sock, sizeof sock, "%s/c1s1.sock", swarm_dir);
        status = run(&top, (char *[]){ RAVNESTCTL, "top", "--socket", sock, "--socket", "/nonexistent/x.sock",
                                       "--iterations", "1", NULL });
        cr_expect_eq(status, 0, "%s", top.out);
        cr_expect(strstr(top.out, "c1s1 ") && strstr(top.out, "x          unreachable"), "%s", top.out);
        kill(p.pid, SIGINT);
        cr_expect_eq(proc_exit(&p), 130, "%s", p.out);
}

Test(watch, top_in_a_terminal_until_q, .timeout = 300) {
        char path[256] = "", swarm_dir[200], server[64], command[512];
        FILE *which = popen("command -v tmux", "re"); /* proc_start() takes a path */
        if (!which || !fgets(path, sizeof path, which) || path[0] != '/') {
                cr_log_warn("SKIPPED: tmux is not installed (scripts/install-deps --test installs it)");
                cr_skip_test("tmux is not installed");
        }
        pclose(which);
        path[strcspn(path, "\n")] = 0;
        char *tmux_path = path;
        Proc p, tmux;
        start_slow_swarm(&p, swarm_dir, sizeof swarm_dir);
        snprintf(server, sizeof server, "ravnest-test-%d", (int)getpid()); /* a tmux server of our own */
        snprintf(command, sizeof command, "%s top --swarm %s --interval 0.5", RAVNESTCTL, swarm_dir);
        int status = run(&tmux, (char *[]){ tmux_path, "-L", server, "new-session", "-d", "-s", "top", "-x", "160", "-y",
                                            "40", command, NULL });
        cr_assert_eq(status, 0, "tmux new-session: exit %d: %s", status, tmux.out);
        /* the screen, once every node has a row (a loaded machine takes a while) */
        for (int tries = 0; tries < 60; tries++) {
                usleep(500 * 1000);
                run(&tmux, (char *[]){ tmux_path, "-L", server, "capture-pane", "-p", "-t", "top", NULL });
                bool all = true;
                for (size_t i = 0; i < 4; i++)
                        all = all && strstr(tmux.out, nodes[i]);
                if (all)
                        break;
        }
        cr_log_info("%.*s", (int)tmux.len, tmux.out);
        cr_expect(strstr(tmux.out, "NODE") && strstr(tmux.out, "SAMPLES/S"), "no header: %s", tmux.out);
        for (size_t i = 0; i < 4; i++)
                cr_expect_eq(test_count(tmux.out, nodes[i]), 1, "%s once on the screen: %s", nodes[i], tmux.out);
        cr_expect(!strstr(tmux.out, "unreachable"), "%s", tmux.out);

        run(&tmux, (char *[]){ tmux_path, "-L", server, "send-keys", "-t", "top", "q", NULL });
        bool ended = false;
        for (int i = 0; i < 50 && !ended; i++) {
                usleep(100 * 1000);
                ended = run(&tmux, (char *[]){ tmux_path, "-L", server, "has-session", "-t", "top", NULL }) != 0;
        }
        cr_expect(ended, "q did not end top");
        if (!ended)
                run(&tmux, (char *[]){ tmux_path, "-L", server, "kill-server", NULL });
        kill(p.pid, SIGINT);
        cr_expect_eq(proc_exit(&p), 130, "%s", p.out);
}
