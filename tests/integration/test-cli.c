/* ravnestd and ravnestctl as an operator meets them: every command answers
 * --help and -h with its usage and exit 0; a bad argument exits 64
 * (EX_USAGE) with a message naming that argument. */
#include <criterion/criterion.h>

#include "../lib/proc.h"
#include <ctype.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Run argv to its end: the exit status; p->out holds what it printed. */
static int run(Proc *p, char *const argv[]) {
        proc_start(p, argv, NULL);
        return proc_exit(p);
}

/* ravnestctl(1) as in the source. */
static const char *read_man(void) {
        static char man[131072];
        FILE *f = fopen(SOURCE_ROOT "/man/ravnestctl.1", "re");
        cr_assert_not_null(f);
        man[fread(man, 1, sizeof man - 1, f)] = 0;
        fclose(f);
        return man;
}

Test(cli, every_command_answers_help) {
        static const char *const commands[] = { "job", "identity", "plan", "swarm", "predict", "status", "top", "plot", "pause",
                                                "resume", "checkpoint", "version", "help", NULL };
        static const char *const flags[] = { "--help", "-h" };
        for (const char *const *c = commands; *c; c++)
                for (int f = 0; f < 2; f++) {
                        Proc p;
                        int code = run(&p, (char *[]){ RAVNESTCTL, (char *)*c, (char *)flags[f], NULL });
                        cr_expect_eq(code, 0, "ravnestctl %s %s: exit %d: %s", *c, flags[f], code, p.out);
                        cr_expect(strstr(p.out, "Usage: ravnestctl"), "ravnestctl %s %s: %s", *c, flags[f], p.out);
                }
        for (int f = 0; f < 2; f++) {
                Proc p;
                int code = run(&p, (char *[]){ RAVNESTD, (char *)flags[f], NULL });
                cr_expect_eq(code, 0, "ravnestd %s: exit %d: %s", flags[f], code, p.out);
                cr_expect(strstr(p.out, "Usage: ravnestd"), "ravnestd %s: %s", flags[f], p.out);
        }
}

/* A missing job makes any swarm that got past its options fail at once
 * (exit 78), never train. */
#define NO_JOB "--job", "/nonexistent/ravnest-test.job"
/* 115 bytes: more than a socket's address holds */
#define TEN_DIGITS "0123456789"
#define TOO_LONG_SOCKET "/tmp/" TEN_DIGITS TEN_DIGITS TEN_DIGITS TEN_DIGITS TEN_DIGITS TEN_DIGITS TEN_DIGITS TEN_DIGITS \
        TEN_DIGITS TEN_DIGITS TEN_DIGITS

typedef struct BadArgs {
        const char *argv[12];
        const char *says; /* the message names the argument */
} BadArgs;

static const BadArgs bad_args[] = {
        { { RAVNESTCTL, "swarm", "--clusters", "abc", NO_JOB }, "Invalid value for --clusters: abc (an integer from 1 to 64)" },
        { { RAVNESTCTL, "swarm", "--epochs", "-3", NO_JOB }, "Invalid value for --epochs: -3 (an integer from 1 to" },
        { { RAVNESTCTL, "swarm", "--epochs", "0", NO_JOB }, "Invalid value for --epochs: 0 (an integer from 1 to" },
        { { RAVNESTCTL, "swarm", "--stages", "0", NO_JOB }, "Invalid value for --stages: 0" },
        { { RAVNESTCTL, "swarm", "--clusters", "9", "--stages", "8", NO_JOB }, "--clusters and --stages: 9 x 8" },
        { { RAVNESTCTL, "swarm", "--micro-batch", "x", NO_JOB }, "Invalid value for --micro-batch: x" },
        { { RAVNESTCTL, "swarm", "--clusters", " 2", NO_JOB }, "Invalid value for --clusters:  2 (an integer" },
        { { RAVNESTD, "--control-socket", TOO_LONG_SOCKET }, "(an absolute path of at most 107 bytes, a socket's limit" },
        { { RAVNESTCTL, "swarm", "--interval", " 1", NO_JOB }, "Invalid value for --interval:  1 (a number" },
        { { RAVNESTCTL, "swarm", "--staleness", "0", NO_JOB }, "Invalid value for --staleness: 0" },
        { { RAVNESTCTL, "swarm", "--update-frequency", "-1", NO_JOB }, "Invalid value for --update-frequency: -1" },
        { { RAVNESTCTL, "swarm", "--interval", "0.01", NO_JOB }, "Invalid value for --interval: 0.01 (a number from 0.05" },
        { { RAVNESTCTL, "swarm", "--progress", "2s", NO_JOB }, "Invalid value for --progress: 2s" },
        { { RAVNESTCTL, "swarm", "--bogus", NO_JOB }, "'--bogus'" },
        { { RAVNESTCTL, "swarm", "--resume", NO_JOB }, "--resume goes on from an earlier swarm's --dir" },
        { { RAVNESTCTL, "swarm", "--clusters", "1", "--averaging", "fp16 = true;", NO_JOB },
          "--averaging: one cluster has nothing to average with" },
        { { RAVNESTCTL, "swarm", NO_JOB, "extra" }, "\"extra\"" },
        { { RAVNESTCTL, "identity", "" }, "identity: STATE_DIR is empty" }, /* not /identity */
        { { RAVNESTCTL, "help", "--bogus" }, "help: unexpected argument \"--bogus\"" },
        { { RAVNESTCTL, "plan", "--micro-batch", "0", "nodes.conf" }, "Invalid value for --micro-batch: 0" },
        { { RAVNESTCTL, "plan", "--staleness", "many", "nodes.conf" }, "Invalid value for --staleness: many" },
        { { RAVNESTCTL, "plan", "--seed", "x", "nodes.conf" }, "Invalid value for --seed: x" },
        { { RAVNESTCTL, "plan", "--similarity", "2", "nodes.conf" }, "Invalid value for --similarity: 2 (a number from 0 to 1)" },
        { { RAVNESTCTL, "plan", "nodes.conf", "extra" }, "\"extra\"" },
        { { RAVNESTCTL, "plan" }, "NODES_FILE" },
        { { RAVNESTCTL, "predict", "--nodes", "0" }, "Invalid value for --nodes: 0 (an integer from 1 to 65536)" },
        { { RAVNESTCTL, "predict", "--params", "1.5" }, "Invalid value for --params: 1.5" },
        { { RAVNESTCTL, "predict", "--compute-ms", "abc" }, "Invalid value for --compute-ms: abc" },
        { { RAVNESTCTL, "predict", "--bandwidth", "0" }, "Invalid value for --bandwidth: 0" },
        { { RAVNESTCTL, "predict", "--bogus" }, "'--bogus'" },
        { { RAVNESTCTL, "predict", "--params", "100", "--job", "/nonexistent.job" }, "--params and --job both" },
        { { RAVNESTCTL, "job", "-x" }, "'x'" },
        { { RAVNESTCTL, "job" }, "ravnestctl job: missing argument FILE\nUsage: ravnestctl job FILE" },
        { { RAVNESTCTL, "job", "a.job", "b.job" }, "\"b.job\"" },
        { { RAVNESTCTL, "identity", "--bogus" }, "'--bogus'" },
        { { RAVNESTCTL, "identity", "/a", "/b" }, "\"/b\"" },
        { { RAVNESTCTL, "status", "--bogus" }, "'--bogus'" },
        /* every command says a missing or extra operand in the same words */
        { { RAVNESTCTL, "status", "extra" }, "ravnestctl status: unexpected argument \"extra\"" },
        { { RAVNESTCTL, "top", "extra" }, "ravnestctl top: unexpected argument \"extra\"" },
        { { RAVNESTCTL, "predict", "extra" }, "ravnestctl predict: unexpected argument \"extra\"" },
        { { RAVNESTCTL, "generate", "extra" }, "ravnestctl generate: unexpected argument \"extra\"" },
        { { RAVNESTCTL, "export", "extra" }, "ravnestctl export: unexpected argument \"extra\"" },
        { { RAVNESTCTL, "plot" }, "ravnestctl plot: missing argument RUN_DIR\nUsage: ravnestctl plot" },
        { { RAVNESTCTL, "plot", "a", "b" }, "ravnestctl plot: unexpected argument \"b\"\nUsage: ravnestctl plot" },
        { { RAVNESTCTL, "plan" }, "ravnestctl plan: missing argument NODES_FILE" },
        /* an empty path is no path (it was tried, "Connection refused") */
        { { RAVNESTCTL, "status", "--socket", "" }, "ravnestctl status: --socket is empty" },
        { { RAVNESTCTL, "checkpoint", "--json", "--socket", "" }, "ravnestctl checkpoint: --socket is empty" },
        { { RAVNESTCTL, "top", "--socket", "", "--iterations", "1" }, "ravnestctl top: --socket is empty" },
        { { RAVNESTCTL, "predict", "--socket", "" }, "ravnestctl predict: --socket is empty" },
        { { RAVNESTCTL, "export", "--job", "a.job", "--checkpoint", "a.ckpt", "--output", "" },
          "ravnestctl export: --output is empty" },
        /* --behind-nat is a list of the swarm's nodes, checked before anything starts */
        { { RAVNESTCTL, "swarm", "--behind-nat", "", NO_JOB }, "--behind-nat: \"\" (an empty name; a comma-separated" },
        { { RAVNESTCTL, "swarm", "--behind-nat", "c1s1,", NO_JOB }, "--behind-nat: \"c1s1,\" (an empty name" },
        { { RAVNESTCTL, "swarm", "--behind-nat", "c1s1,c3s1", NO_JOB },
          "--behind-nat: \"c1s1,c3s1\" (c3s1 is not a node of this swarm, c1s1 to c2s2)" },
        { { RAVNESTCTL, "version", "extra" }, "\"extra\"" },
        { { RAVNESTD, "--epochs", "0" }, "Invalid value for --epochs: 0 (an integer from 1 to 1000000)" },
        { { RAVNESTD, "--threads", "abc" }, "Invalid value for --threads: abc (an integer from 1 to 256)" },
        { { RAVNESTD, "--progress", "-5" }, "Invalid value for --progress: -5 (an integer from 0 to" },
        { { RAVNESTD, "--bogus" }, "'--bogus'" },
        { { RAVNESTD, "extra" }, "extra" },
        {},
};

Test(cli, bad_arguments_exit_64_naming_them) {
        for (const BadArgs *b = bad_args; b->argv[0]; b++) {
                char line[256] = "";
                for (int i = 1; b->argv[i]; i++)
                        snprintf(line + strlen(line), sizeof line - strlen(line), " %s", b->argv[i]);
                Proc p;
                int code = run(&p, (char *const *)b->argv);
                cr_expect_eq(code, 64, "%s%s: exit %d: %s", strrchr(b->argv[0], '/') + 1, line, code, p.out);
                cr_expect(strstr(p.out, b->says), "%s%s: no \"%s\" in: %s", strrchr(b->argv[0], '/') + 1, line,
                          b->says, p.out);
        }
}

/* identity makes the state directory it is given, mode 0700, as the daemon
 * does, and the key in it, mode 0600 (it said "cannot create" for a new
 * directory); the same key the second time. */
Test(cli, identity_creates_its_state_directory) {
        char dir[] = "/tmp/ravnest-test-id-XXXXXX", state[128], key[160], first[80] = "(none)";
        cr_assert_not_null(mkdtemp(dir));
        snprintf(state, sizeof state, "%s/state", dir);
        snprintf(key, sizeof key, "%s/identity", state);
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTCTL, "identity", state, NULL });
        cr_assert_eq(code, 0, "exit %d: %s", code, p.out);
        for (const char *l = p.out; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
                if (strcspn(l, "\n") == 64) /* the key's line, wherever the stderr's falls */
                        snprintf(first, sizeof first, "%.64s", l);
        struct stat sd, sk;
        cr_assert(stat(state, &sd) == 0 && stat(key, &sk) == 0, "%s", p.out);
        cr_assert_eq(sd.st_mode & 0777, 0700, "%o", sd.st_mode & 0777);
        cr_assert_eq(sk.st_mode & 0777, 0600, "%o", sk.st_mode & 0777);
        code = run(&p, (char *[]){ RAVNESTCTL, "identity", state, NULL });
        test_remove_tree(dir);
        cr_assert_eq(code, 0, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, first) && !strstr(p.out, "created"), "%s then %s", first, p.out);
}

/* A socket that takes the connection and never answers (a node whose loop
 * is stuck looks the same): status says the node is unreachable (69)
 * within seconds, not after sd-bus's 90. */
Test(cli, status_gives_up_on_a_socket_that_never_answers, .timeout = 60) {
        char dir[] = "/tmp/ravnest-test-mute-XXXXXX";
        cr_assert_not_null(mkdtemp(dir));
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s/control", dir);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 4) == 0);
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTCTL, "status", "--socket", sa.sun_path, NULL });
        cr_assert_eq(code, 69, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "not reachable"), "%s", p.out);
        /* and top, on a swarm's directory that is not there (mistyped), says so */
        code = run(&p, (char *[]){ RAVNESTCTL, "top", "--swarm", "/nonexistent/swarm", "--iterations", "1", NULL });
        cr_assert_eq(code, 66, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "--swarm /nonexistent/swarm: not a directory"), "%s", p.out);
        close(fd);
        test_remove_tree(dir);
}

/* A path at --socket or RAVNEST_SOCKET that is there but is not a socket
 * (a file, a directory) is said to be none (it was "Connection refused"),
 * exit 69 as for a node not there, and --json still answers "unreachable";
 * RAVNEST_SOCKET set but empty is a usage error (it was tried as a path). */
static void empty_ravnest_socket(void) {
        setenv("RAVNEST_SOCKET", "", 1);
}

Test(cli, a_path_that_is_not_a_socket_is_said_to_be_none) {
        char dir[] = "/tmp/ravnest-test-notsock-XXXXXX", file[128], want[200];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(file, sizeof file, "%s/control", dir);
        test_write_file(file, "", 0644);
        const char *const paths[] = { file, dir };
        Proc p;
        for (int i = 0; i < 2; i++) {
                snprintf(want, sizeof want, "ravnestd is not running, or not reachable: %s is not a socket", paths[i]);
                int code = run(&p, (char *[]){ RAVNESTCTL, "status", "--socket", (char *)paths[i], NULL });
                cr_expect_eq(code, 69, "%s: exit %d: %s", paths[i], code, p.out);
                cr_expect(strstr(p.out, want), "%s: %s", paths[i], p.out);
                code = run(&p, (char *[]){ RAVNESTCTL, "pause", "--json", "--socket", (char *)paths[i], NULL });
                cr_expect_eq(code, 69, "%s: exit %d: %s", paths[i], code, p.out);
                cr_expect(strstr(p.out, "{\"State\": \"unreachable\", \"Error\": ") && strstr(p.out, "is not a socket\"}"),
                          "%s", p.out);
        }
        test_remove_tree(dir);
        proc_start(&p, (char *[]){ RAVNESTCTL, "status", NULL }, empty_ravnest_socket);
        int code = proc_exit(&p);
        cr_expect_eq(code, 64, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "ravnestctl status: RAVNEST_SOCKET is empty"), "%s", p.out);
}

/* predict asked for the node's figures, with some given, says the node
 * could not be reached and which figures are still missing (it said "no
 * figures given"); --json answers with an object there too. */
Test(cli, predict_without_its_node_names_the_figures_still_missing) {
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTCTL, "predict", "--node", "--socket", "/nonexistent/control",
                                       "--compute-ms", "5", NULL });
        cr_expect_eq(code, 69, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "predict: the local node is not reachable (/nonexistent/control: No such file or "
                                "directory): give the figures still missing, --bandwidth, --nodes and --params or "
                                "--job"), "%s", p.out);
        cr_expect(!strstr(p.out, "no figures given"), "%s", p.out);
        code = run(&p, (char *[]){ RAVNESTCTL, "predict", "--json", "--socket", "/nonexistent/control", NULL });
        cr_expect_eq(code, 69, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "{\"State\": \"unreachable\", \"Error\": \"predict: the local node is not reachable"),
                  "%s", p.out);
        /* without a node to ask, a usage error, said on stderr alone as every one is */
        code = run(&p, (char *[]){ RAVNESTCTL, "predict", "--json", "--compute-ms", "5", "--nodes", "4", NULL });
        cr_expect_eq(code, 64, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "ravnestctl predict: missing figures: give --bandwidth and --params or --job\n"),
                  "%s", p.out);
        cr_expect(!strstr(p.out, "{\"Error\""), "%s", p.out);
}

/* Every command under --json answers with a JSON object when it fails, as
 * on success (checkpoint printed nothing on stdout): checkpoint and pause of
 * a node that cannot, plan of a nodes file not there. And status --json
 * gives every property the example in ravnestctl(1) shows, no other. */
Test(cli, json_commands_answer_json_when_they_fail, .timeout = 60) {
        char dir[] = "/tmp/ravnest-test-json-XXXXXX", sock[128];
        Proc d, p;
        test_start_unconfigured(&d, RAVNESTD, dir, sock);
        int code = run(&p, (char *[]){ RAVNESTCTL, "checkpoint", "--json", "--socket", sock, NULL });
        cr_expect_eq(code, 75, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "{\"Error\": \"Checkpoint failed: "), "%s", p.out);
        code = run(&p, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL });
        cr_expect_eq(code, 0, "exit %d: %s", code, p.out);
        const char *example = strstr(read_man(), "$ ravnestctl status \\-\\-json\n{");
        cr_assert(example, "no status --json example in ravnestctl(1)");
        int served = 0;
        for (const char *k = strchr(p.out, '{'); k && (k = strchr(k, '"')); served++) { /* "Name": value, ... */
                char name[64], want[80];
                cr_assert_eq(sscanf(k, "\"%63[^\"]\"", name), 1, "%s", k);
                snprintf(want, sizeof want, "\"%s\": ", name);
                cr_expect(strstr(example, want), "ravnestctl(1)'s status --json example lacks %s", name);
                k = strstr(k + strlen(name) + 2, ", \"");
                k = k ? k + 2 : NULL;
        }
        const char *end = strstr(example, "}\n.fi");
        cr_assert(end);
        int shown = 0;
        for (const char *k = example; (k = strstr(k, "\": ")) && k < end; k++)
                shown++;
        cr_expect_eq(shown, served, "ravnestctl(1) shows %d properties, the node serves %d: %s", shown, served, p.out);
        kill(d.pid, SIGTERM);
        cr_expect_eq(proc_exit(&d), 0, "%s", d.out);
        test_remove_tree(dir);
        code = run(&p, (char *[]){ RAVNESTCTL, "plan", "--json", "/nonexistent/nodes.conf", "--job",
                                   SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL });
        cr_expect_eq(code, 78, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "{\"Error\": \"/nonexistent/nodes.conf"), "%s", p.out);
}

/* plot refuses an output that is not a regular file, as export does (it
 * wrote into /dev/null, rsvg-convert failed on it, and it exited 0 saying
 * the SVG was there; a FIFO would have held it for ever). */
Test(cli, plot_refuses_an_output_that_is_not_a_regular_file, .timeout = 30) {
        char dir[] = "/tmp/ravnest-test-plot-XXXXXX", sub[128], series[160], fifo[128];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(sub, sizeof sub, "%s/c1s1", dir);
        cr_assert_eq(mkdir(sub, 0755), 0);
        snprintf(series, sizeof series, "%s/job.series.csv", sub);
        test_write_file(series, "time,elapsed,epoch,step,train_loss,valid_loss,samples_per_sec\n"
                                "1,1,1,1,0.5,,10\n2,2,1,2,0.4,,11\n", 0644);
        snprintf(fifo, sizeof fifo, "%s/fifo.svg", dir);
        cr_assert_eq(mkfifo(fifo, 0600), 0);
        const char *const outputs[] = { "/dev/null", fifo, sub };
        Proc p;
        for (int i = 0; i < 3; i++) {
                int code = run(&p, (char *[]){ RAVNESTCTL, "plot", dir, "-o", (char *)outputs[i], NULL });
                cr_expect_eq(code, 73, "%s: exit %d: %s", outputs[i], code, p.out);
                cr_expect(strstr(p.out, "is not a regular file"), "%s: %s", outputs[i], p.out);
        }
        int code = run(&p, (char *[]){ RAVNESTCTL, "plot", dir, NULL });
        test_remove_tree(dir);
        cr_expect_eq(code, 0, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "series.svg: 1 series"), "%s", p.out);
}

/* A --ravnestd that is not an executable file is refused before anything
 * is made or started (the swarm started, and ended "c2s2 ended with status
 * 127"). */
Test(cli, swarm_refuses_a_ravnestd_that_is_not_an_executable_file) {
        char dir[] = "/tmp/ravnest-test-cli-XXXXXX", swarm_dir[160], want[256];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(swarm_dir, sizeof swarm_dir, "%s/swarm", dir);
        const char *const daemons[] = { "/nonexistent/ravnestd", dir, "/etc/passwd" };
        const char *const says[] = { "/nonexistent/ravnestd: No such file or directory", "%s is not an executable file",
                                     "/etc/passwd is not an executable file" };
        for (int i = 0; i < 3; i++) {
                Proc p;
                int code = run(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", (char *)daemons[i], "--dir",
                                               swarm_dir, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                               NULL });
                char what[200];
                snprintf(what, sizeof what, says[i], dir);
                snprintf(want, sizeof want, "ravnestctl swarm: --ravnestd %s", what);
                cr_expect_eq(code, 66, "%s: exit %d: %s", daemons[i], code, p.out);
                cr_expect(strstr(p.out, want), "%s: %s", daemons[i], p.out);
                cr_expect(access(swarm_dir, F_OK) < 0, "%s: the swarm's directory was made", daemons[i]);
        }
        test_remove_tree(dir);
}

/* ravnestctl without a command is a usage error: its help goes to stderr,
 * nothing to stdout. */
Test(cli, no_command_is_a_usage_error_on_stderr) {
        Proc p;
        int code = run(&p, (char *[]){ "/bin/sh", "-c", RAVNESTCTL " 2>/dev/null", NULL });
        cr_expect_eq(code, 64, "exit %d: %s", code, p.out);
        cr_expect_eq(p.len, 0, "on stdout: %s", p.out);
        code = run(&p, (char *[]){ RAVNESTCTL, NULL });
        cr_expect_eq(code, 64, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "ravnestctl: missing command\nUsage: ravnestctl COMMAND"), "%s", p.out);
}

/* The benchmarks too (built with -Dbenchmarks=true, the default). */
Test(cli, benchmarks_answer_help_and_refuse_unknown_arguments) {
        static const char *const benches[] = { "bench-allreduce", "bench-formation", "bench-gossip", "bench-moshpit",
                                               "bench-pipeline", "bench-train", "bench-transport", NULL };
        for (const char *const *b = benches; *b; b++) {
                char path[512];
                snprintf(path, sizeof path, "%s/tests/bench/%s", BUILD_ROOT, *b);
                if (access(path, X_OK) < 0)
                        cr_skip_test("SKIP: %s not built (meson configure -Dbenchmarks=true)", path);
                Proc p;
                for (int f = 0; f < 2; f++) {
                        const char *flag = f ? "-h" : "--help";
                        int code = run(&p, (char *[]){ path, (char *)flag, NULL });
                        cr_assert_eq(code, 0, "%s %s: exit %d: %s", *b, flag, code, p.out);
                        cr_assert(strstr(p.out, "Usage: "), "%s %s: %s", *b, flag, p.out);
                }
                int code = run(&p, (char *[]){ path, "--bogus", NULL });
                cr_assert_eq(code, 64, "%s --bogus: exit %d: %s", *b, code, p.out);
                cr_expect(strstr(p.out, "'--bogus'"), "%s --bogus: %s", *b, p.out);
                code = run(&p, (char *[]){ path, "extra", NULL });
                cr_expect_eq(code, 64, "%s extra: exit %d: %s", *b, code, p.out);
                cr_expect(strstr(p.out, "\"extra\""), "%s extra: %s", *b, p.out);
        }
}

/* ---- ravnestctl(1), ravnestctl help and each command's --help agree ------ */

/* Whether text has word whole: not the end of a longer option ("-o" in
 * "--output") nor the start of one (roff's "\-" goes on with a dash). */
static bool has_word(const char *text, const char *word) {
        size_t len = strlen(word);
        for (const char *at = text; (at = strstr(at, word)); at++) {
                char before = at > text ? at[-1] : ' ', after = at[len];
                if (before != '-' && !isalnum((unsigned char)after) && after != '-' &&
                    !(after == '\\' && at[len + 1] == '-'))
                        return true;
        }
        return false;
}

/* The next option at or after *at in a usage text ("--socket", "-o"): a
 * dash after a space or a bracket, a second one or not, a letter, then
 * letters, digits and dashes. */
static bool next_option(const char **at, char opt[static 48]) {
        for (const char *s = *at; (s = strchr(s, '-')); s++) {
                int len = 0;
                if (strchr(" [(|", s[-1]) && sscanf(s, "%47[-a-z0-9]%n", opt, &len) == 1 &&
                    isalpha((unsigned char)opt[opt[1] == '-' ? 2 : 1])) {
                        *at = s + len;
                        return true;
                }
        }
        return false;
}

/* The entry of `ravnestctl help` for cmd: from its line to the next
 * command's (an entry's first line is indented two spaces, the rest more). */
static void help_entry(const char *help, const char *cmd, char *entry, size_t n) {
        char head[32];
        snprintf(head, sizeof head, "\n  %s ", cmd);
        const char *at = strstr(help, head);
        if (!at) { /* resume: on pause's line */
                snprintf(head, sizeof head, ", %s ", cmd);
                for (at = strstr(help, head); at && at[0] != '\n'; at--)
                        ;
        }
        cr_assert(at, "ravnestctl help has no entry for %s:\n%s", cmd, help);
        const char *end = at + 1;
        while ((end = strstr(end, "\n  ")) && end[3] == ' ')
                end++;
        snprintf(entry, n, "%.*s", end ? (int)(end - at) + 1 : (int)strlen(at), at); /* its last newline too */
}

/* Every option a command's --help gives is in ravnestctl(1), and in the
 * command's entry of ravnestctl help unless that entry ends its options with
 * "..." (swarm's and predict's, too many for it): help lacked plan's
 * --micro-batch, --staleness and --similarity and status's --socket, the
 * page plot's -o. */
Test(cli, help_and_man_page_name_every_option) {
        static const char *const commands[] = { "job", "plan", "predict", "generate", "export", "identity", "swarm",
                                                "top", "plot", "status", "pause", "resume", "checkpoint", NULL };
        const char *man = read_man();
        Proc h;
        cr_assert_eq(run(&h, (char *[]){ RAVNESTCTL, "help", NULL }), 0, "%s", h.out);
        for (const char *const *c = commands; *c; c++) {
                Proc p;
                char entry[1024], opt[48], roff[128];
                cr_assert_eq(run(&p, (char *[]){ RAVNESTCTL, (char *)*c, "--help", NULL }), 0, "%s", p.out);
                help_entry(h.out, *c, entry, sizeof entry);
                bool abridged = strstr(entry, " ...\n") != NULL;
                for (const char *at = p.out; next_option(&at, opt);) {
                        if (!strcmp(opt, "--help") || !strcmp(opt, "-h"))
                                continue;
                        roff[0] = 0;
                        for (const char *ch = opt; *ch; ch++)
                                snprintf(roff + strlen(roff), sizeof roff - strlen(roff), *ch == '-' ? "\\-" : "%c", *ch);
                        cr_expect(has_word(man, roff), "ravnestctl(1) does not name %s's %s", *c, opt);
                        cr_expect(abridged || has_word(entry, opt), "ravnestctl help does not name %s's %s:\n%s", *c,
                                  opt, entry);
                }
        }
}

/* Each exit status a command returns is one ravnestctl(1) gives for it
 * (its EXIT STATUS had no 66, and 65 not for plan). */
typedef struct ExitCase {
        int code;
        const char *command; /* as the page's EXIT STATUS item names it */
        const char *argv[10];
} ExitCase;

Test(cli, exit_statuses_are_the_man_pages) {
        char dir[] = "/tmp/ravnest-test-exit-XXXXXX", nodes[128], none[128], empty[128], series[128];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(nodes, sizeof nodes, "%s/nodes.conf", dir);
        test_write_file(nodes, "nodes = ( { name = \"a\"; gflops = 1.0; memory = \"1M\"; bandwidth = 1.0; } );\n", 0644);
        snprintf(none, sizeof none, "%s/none", dir);
        snprintf(empty, sizeof empty, "%s/empty", dir);
        cr_assert_eq(mkdir(empty, 0755), 0);
        snprintf(series, sizeof series, "%s/c1s1.series.csv", dir);
        test_write_file(series, "elapsed,train_loss\n1,0.5\n", 0644);
        const ExitCase cases[] = {
                { 65, "plan", { "plan", nodes, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job" } },
                { 66, "plot", { "plot", empty } },
                { 66, "top", { "top", "--swarm", none, "--iterations", "1" } },
                { 66, "swarm", { "swarm", "--ravnestd", none } },
                { 69, "predict", { "predict", "--socket", none } },
                { 73, "plot", { "plot", dir, "-o", "/dev/null" } },
                { 78, "plan", { "plan", none, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job" } },
                {},
        };
        const char *page = strstr(read_man(), "\n.SH EXIT STATUS\n");
        cr_assert(page);
        for (const ExitCase *e = cases; e->code; e++) {
                char *argv[12] = { RAVNESTCTL }, head[16], item[2048];
                for (int i = 0; e->argv[i]; i++)
                        argv[i + 1] = (char *)e->argv[i];
                Proc p;
                int code = run(&p, argv);
                cr_expect_eq(code, e->code, "%s: exit %d: %s", e->command, code, p.out);
                snprintf(head, sizeof head, "\n.TP\n%d\n", e->code);
                const char *at = strstr(page, head), *end = at ? strstr(at + 1, "\n.TP\n") : NULL;
                cr_assert(at && end, "ravnestctl(1) gives no exit status %d", e->code);
                snprintf(item, sizeof item, "%.*s", (int)(end - at), at);
                cr_expect(strstr(item, e->command), "ravnestctl(1)'s exit status %d does not name %s", e->code,
                          e->command);
        }
        test_remove_tree(dir);
}

/* ---- configuration messages, as ravnestd --check-config prints them ----- */

/* text into <dir>/ravnestd.conf; ravnestd --check-config on it must exit 78
 * (EX_CONFIG) and say "<file>:<says>". */
static void expect_config_error(const char *text, const char *says) {
        char dir[] = "/tmp/ravnest-test-cli-XXXXXX", path[128], want[512];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/ravnestd.conf", dir);
        test_write_file(path, text, 0644);
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTD, "--check-config", "--config", path, NULL });
        unlink(path);
        rmdir(dir);
        snprintf(want, sizeof want, "%s:%s", path, says);
        cr_expect_eq(code, 78, "exit %d for:\n%s\n%s", code, text, p.out);
        cr_expect(strstr(p.out, want), "no \"%s\" in: %s", want, p.out);
}

/* A configuration that sets nothing (as shipped) leaves the node
 * unconfigured, and such a node loads no job: --check-config passes it
 * whether the default job is installed or not (the daemon starts with it;
 * the check said "Invalid job" where the default job was not there, as in
 * a build tree). */
Test(cli, check_config_of_a_configuration_that_sets_nothing_passes) {
        char dir[] = "/tmp/ravnest-test-cli-XXXXXX", path[128];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/ravnestd.conf", dir);
        test_write_file(path, "# nothing set\n", 0644);
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTD, "--check-config", "--config", path, NULL });
        test_remove_tree(dir);
        cr_assert_eq(code, 0, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "configuration OK ("), "%s", p.out);
        if (access(JOBS_DIR "/fashion-mnist-mlp.job", F_OK) < 0)
                cr_assert(strstr(p.out, "no network, so the node is unconfigured and loads no job"), "%s", p.out);
}

Test(cli, configuration_errors_name_file_line_and_setting) {
        expect_config_error("threads = 2;\njob = \"/nonexistent/ravnest-test.job\";\n",
                            "2: job: /nonexistent/ravnest-test.job: cannot read: No such file or directory");
        expect_config_error("threads = 99999999999;\n", "1: threads: 99999999999 is read as a 32-bit integer");
        expect_config_error("checkpoint = {\n  interval = 600;\n  load = true;\n  interval = 60;\n};\n",
                            "4: checkpoint.interval: set twice");
        expect_config_error("threads = 2;\nidle = { enabled = fals; };\n",
                            "2: syntax error in \"idle = { enabled = fals; };\"");
        /* what only the job tells apart: --check-config runs the check the
         * daemon's start runs (the job here has 4 layers) */
        char secret[] = "/tmp/ravnest-test-cli-secret-XXXXXX", text[1024];
        int fd = mkstemp(secret);
        cr_assert(fd >= 0 && write(fd, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 65) == 65);
        close(fd);
        snprintf(text, sizeof text,
                 "job = \"" SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job\";\nnetwork = { secret_file = \"%s\"; };\n"
                 "pipeline = { listen = \"127.0.0.1:7003\"; clusters = ( { nodes = [\n"
                 "  \"80a4d7a4bebd9ed03987f3b2db2057cf7abd4cf24f77106ac9c5d91b14accbd3@127.0.0.1:7003\",\n"
                 "  \"d50a93859a54a4731616c02223cf0624ee207a60df1d7d478448cc000daccdc6@127.0.0.1:7004\" ];\n"
                 "  stages = [0, 2, 9]; } ); };\n", secret);
        expect_config_error(text, "6: pipeline.clusters.[0].stages: cluster 1 cuts 9 layers, job fashion-mnist-mlp has ");
        /* a first stage of the flatten alone: nothing to average, refused before it starts */
        char *cut = strstr(text, "[0, 2, 9]");
        cr_assert(cut);
        memcpy(cut, "[0, 1, 6]", 9);
        expect_config_error(text, "6: pipeline.clusters.[0].stages: stage 1 of cluster 1 (layers 0-0 of job "
                                  "fashion-mnist-mlp) holds no parameters");
        unlink(secret);
}

/* ---- figures that mislead ------------------------------------------------ */

/* In a new dir (a template mkdtemp() fills in), a script that stands in for
 * ravnestd: a shell case on its configuration's path ($2), cases its
 * branches. */
static void write_fake_ravnestd(char *dir, const char *cases, char fake[static 128]) {
        char text[2048];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(fake, 128, "%s/ravnestd", dir);
        snprintf(text, sizeof text, "#!/bin/sh\ncase \"$2\" in\n%sesac\n", cases);
        test_write_file(fake, text, 0755);
}

/* The swarm's table: a node stopped before its last line has no busy
 * figure ("-", not -1%), and a figure is shown within 0..100% (not -0%);
 * its bytes per step are what its last line says, "-" where it says none
 * or something else. The nodes here are a script: c1s2 says it finished,
 * busy "-0%", with its traffic; c2s1 with a garbled pipeline figure; the
 * others end without a word. */
Test(cli, swarm_table_shows_busy_within_0_to_100) {
        char dir[] = "/tmp/ravnest-test-cli-XXXXXX", fake[128];
        write_fake_ravnestd(dir,
                            "*/c1s2.conf) echo '<6>Finished fashion-mnist-mlp: test accuracy 10.00% (stage 2 of 2 in "
                            "cluster 1), 5 samples/s, busy -0% while training (computing 0%), -0% in all; "
                            "pipeline 52.0 KiB/step, averaging 1.3 KiB/step' >&2 ;;\n"
                            "*/c2s1.conf) echo '<6>Finished stage 1 of 2 in cluster 2: 5 updates, busy 50% while "
                            "training (computing 0%), 50% in all; pipeline lots/step, averaging 3 B/step' >&2 ;;\n",
                            fake);
        char swarm_dir[160];
        snprintf(swarm_dir, sizeof swarm_dir, "%s/swarm", dir);
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", fake, "--dir", swarm_dir, "--job",
                                       SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL });
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
        /* (one cluster said nothing: no averaged model, and the swarm says so) */
        cr_assert_eq(code, 1, "exit %d: %s", code, p.out);
        cr_expect(strstr(p.out, "swarm: no averaged model: cluster 2 has no result"), "%s", p.out);
        const char *table = strstr(p.out, "swarm: node   busy");
        cr_assert(table, "no table: %s", p.out);
        cr_expect(!strstr(table, "-1%") && !strstr(table, "-0%"), "%s", p.out);
        cr_expect(strstr(table, "swarm: c1s2     0%       52.0 KiB         1.3 KiB"), "%s", p.out);
        cr_expect(strstr(table, "swarm: c1s1      -              -               -"), "%s", p.out);
        cr_expect(strstr(table, "swarm: c2s1    50%              -             3 B"), "%s", p.out);
}

static void skip_without_dataset(void) {
        if (access(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist to run this test",
                             FASHION_MNIST_DIR);
}

/* plan's table gives each stage's layers as the logs and the swarm do, from
 * 0 with both ends included (it counted from 1): a cluster of two stages of
 * the six-layer MLP holds 0-2 and 3-5, one of a single stage 0-5; --json
 * gives the same stages as cut points, [0, 3] and [3, 6]. */
Test(cli, plan_counts_layers_as_the_logs_do) {
        Proc p, j;
        int code = run(&p, (char *[]){ RAVNESTCTL, "plan", SOURCE_ROOT "/config/nodes-example.conf", "--job",
                                       SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL });
        cr_assert_eq(code, 0, "exit %d: %s", code, p.out);
        code = run(&j, (char *[]){ RAVNESTCTL, "plan", "--json", SOURCE_ROOT "/config/nodes-example.conf", "--job",
                                   SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL });
        cr_assert_eq(code, 0, "exit %d: %s", code, j.out);
        cr_assert(strstr(p.out, " 0-5 "), "%s", p.out);
        cr_assert(!strstr(p.out, " 1-6 ") && !strstr(p.out, " 4-6 "), "%s", p.out);
        if (strstr(j.out, "\"layers\": [0, 3]")) {
                cr_assert(strstr(p.out, " 0-2 ") && strstr(p.out, " 3-5 "), "%s", p.out);
                cr_assert(strstr(j.out, "\"layers\": [3, 6]"), "%s", j.out);
        }
}

/* A job file that is not there is an invalid job (exit 78), as for every
 * command that reads one (the swarm said 1), and the message says which
 * option names it: the default's path may not exist in a build tree. */
Test(cli, swarm_of_a_missing_job_exits_78) {
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTCTL, "swarm", NO_JOB, NULL });
        cr_assert_eq(code, 78, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "Invalid job: /nonexistent/ravnest-test.job: cannot read: No such file or directory "
                                "(--job FILE names the job)"),
                  "%s", p.out);
}

/* Every stage must hold parameters (its node refuses a plan where one holds
 * none): the shipped MLP has 3 such layers of 6, so 4 stages are refused
 * before any node starts. And a node that fails ends the swarm with its own
 * exit status, not the signal the swarm stopped the others with (it blamed
 * "its last stage c1s2 ended with signal 15"). */
Test(cli, swarm_refuses_stages_without_parameters_and_names_the_node_that_failed, .timeout = 120) {
        Proc p;
        int code = run(&p, (char *[]){ RAVNESTCTL, "swarm", "--clusters", "1", "--stages", "4", "--job",
                                       SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL });
        cr_assert_eq(code, 78, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "fashion-mnist-mlp has 3 layers with parameters (of 6): at most that many stages"),
                  "%s", p.out);
        cr_assert_null(strstr(p.out, "started c1s"), "%s", p.out);

        char dir[] = "/tmp/ravnest-test-cli-XXXXXX", fake[128], swarm_dir[160];
        write_fake_ravnestd(dir,
                            "*/c1s1.conf) echo '<3>Invalid configuration: the plan is refused' >&2; exit 78 ;;\n"
                            "*) exec sleep 100 ;;\n",
                            fake);
        snprintf(swarm_dir, sizeof swarm_dir, "%s/swarm", dir);
        code = run(&p, (char *[]){ RAVNESTCTL, "swarm", "--ravnestd", fake, "--dir", swarm_dir, "--clusters", "1",
                                   "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL });
        test_remove_tree(dir);
        cr_assert_eq(code, 1, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "no trained model: cluster 1 has no result: c1s1 ended with status 78, refusing "
                                "its configuration or job, and the swarm stopped the others"),
                  "%s", p.out);
}

/* The averaging cadence as configured: 0.25 s, not "every 0.2 s". */
Test(cli, averaging_interval_is_logged_as_configured, .timeout = 120) {
        skip_without_dataset();
        char dir[] = "/tmp/ravnest-test-cli-XXXXXX", secret[128], conf[128], text[2048], hex[IDENTITY_HEX_SIZE];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(secret, sizeof secret, "%s/secret", dir);
        test_write_file(secret, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
        test_make_identity(dir, "a", hex);
        snprintf(conf, sizeof conf, "%s/a.conf", dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state-a\";\n"
                 "control_socket = \"\";\n"
                 "idle = { enabled = false; };\n"
                 "threads = 1;\n"
                 "checkpoint = { interval = 0; load = false; };\n"
                 "network = { secret_file = \"%s\"; };\n"
                 "averaging = {\n"
                 "  interval = 0.25;\n"
                 "  listen = \"127.0.0.1:%u\";\n"
                 "  members = [ \"%s@127.0.0.1:%u\", \"%s@127.0.0.1:1\" ];\n"
                 "};\n",
                 dir, secret, test_free_port(), hex, test_free_port(),
                 "22222222222222222222222222222222222222222222222222222222222222bb");
        test_write_file(conf, text, 0644);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                   "--epochs", "1", "--progress", "0", NULL }, NULL);
        bool seen = proc_wait_for(&p, "Averaging with ", 60000) && proc_wait_for(&p, " s, listening", 5000);
        kill(p.pid, SIGTERM);
        proc_exit(&p);
        snprintf(text, sizeof text, "rm -rf %s", dir);
        cr_assert_eq(system(text), 0);
        cr_assert(seen, "%s", p.out);
        cr_assert(strstr(p.out, "every 0.25 s, listening"), "%s", p.out);
}

/* ravnestd --help names the configuration it reads by default; the man
 * pages this build installs name the same file (for prefix /usr:
 * /etc/ravnest/ravnestd.conf, as the packages have it). */
Test(cli, help_and_man_pages_name_the_same_configuration) {
        Proc p;
        cr_assert_eq(run(&p, (char *[]){ RAVNESTD, "--help", NULL }), 0, "%s", p.out);
        const char *at = strstr(p.out, "configuration (default ");
        cr_assert(at, "%s", p.out);
        char path[256];
        cr_assert_eq(sscanf(at + strlen("configuration (default "), "%255[^) ]", path), 1, "%s", p.out);
        cr_assert(strstr(path, "/ravnest/ravnestd.conf"), "%s", path);
        static const char *const pages[] = { "ravnestd.8", "ravnestd.conf.5", "ravnestctl.1", NULL };
        for (const char *const *m = pages; *m; m++) {
                char file[512], text[65536];
                snprintf(file, sizeof file, "%s/%s", BUILD_ROOT, *m);
                FILE *f = fopen(file, "re");
                cr_assert_not_null(f, "%s: not built", file);
                size_t n = fread(text, 1, sizeof text - 1, f);
                fclose(f);
                text[n] = 0;
                cr_expect(strstr(text, path), "%s does not name %s", file, path);
        }
}

/* ---- scripts/install-deps installs for a purpose ------------------------ */

static bool listed(const char *out, const char *package) {
        char line[128];
        snprintf(line, sizeof line, "\n%s\n", package);
        char text[sizeof ((Proc *)0)->out + 2];
        snprintf(text, sizeof text, "\n%s", out);
        return strstr(text, line) != NULL;
}

Test(cli, install_deps_installs_for_a_purpose) {
        Proc p;
        /* training: the build and the dataset, no test or container tools */
        cr_assert_eq(run(&p, (char *[]){ "/bin/sh", SOURCE_ROOT "/scripts/install-deps", "--run", "--print", NULL }), 0,
                     "%s", p.out);
        cr_expect(listed(p.out, "meson") && listed(p.out, "libopenblas-dev") && listed(p.out, "dataset-fashion-mnist"),
                  "%s", p.out);
        static const char *const test_only[] = { "libcriterion-dev", "podman", "debhelper", "lintian", "rpm",
                                                 "debootstrap", "python3-torch", NULL };
        for (const char *const *t = test_only; *t; t++)
                cr_expect(!listed(p.out, *t), "--run lists %s:\n%s", *t, p.out);
        /* the default: everything the tests need */
        cr_assert_eq(run(&p, (char *[]){ "/bin/sh", SOURCE_ROOT "/scripts/install-deps", "--print", NULL }), 0, "%s",
                     p.out);
        for (const char *const *t = test_only; *t; t++) /* PyTorch too: the GPT's tests hold it as reference */
                cr_expect(listed(p.out, *t), "the default lacks %s:\n%s", *t, p.out);
        cr_expect(!listed(p.out, "iperf3") && listed(p.out, "fortunes"), "%s", p.out);
        cr_assert_eq(run(&p, (char *[]){ "/bin/sh", SOURCE_ROOT "/scripts/install-deps", "--bench", "--print", NULL }),
                     0, "%s", p.out);
        cr_expect(listed(p.out, "python3-torch") && listed(p.out, "podman"), "%s", p.out);
        cr_expect_eq(run(&p, (char *[]){ "/bin/sh", SOURCE_ROOT "/scripts/install-deps", "--bogus", NULL }), 64, "%s",
                     p.out);
        cr_expect_eq(run(&p, (char *[]){ "/bin/sh", SOURCE_ROOT "/scripts/install-deps", "--help", NULL }), 0, "%s",
                     p.out);
        cr_expect(strstr(p.out, "Usage: scripts/install-deps"), "%s", p.out);

        /* the demo installs what training needs only */
        FILE *f = fopen(SOURCE_ROOT "/scripts/demo", "re");
        cr_assert_not_null(f);
        char line[256];
        bool run_only = false, other = false;
        while (fgets(line, sizeof line, f))
                if (!strncmp(line, "scripts/install-deps", 20)) {
                        run_only |= !strncmp(line, "scripts/install-deps --run", 26);
                        other |= strncmp(line, "scripts/install-deps --run", 26) != 0;
                }
        fclose(f);
        cr_expect(run_only && !other, "scripts/demo does not run scripts/install-deps --run alone");
}
