/* ravnestd as a real process: job checks, clean stop on SIGTERM and SIGINT,
 * clear errors for a broken dataset. */
#include <criterion/criterion.h>

#include "../lib/proc.h"
#include "cluster/capability.h"
#include "nn/stage.h"
#include "service/bus.h"
#include "util/log.h"
#include <endian.h>
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <errno.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <zlib.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* In the child before exec: make io_uring_setup fail with ENOSYS, as the
 * default seccomp profiles of Docker and podman do. */
static bool block_io_uring;

static void seccomp_block_io_uring(void) {
        struct sock_filter f[] = {
                BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 0, 1),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = { .len = sizeof f / sizeof f[0], .filter = f };
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
                _exit(126);
}

static void child_setup(void) {
        if (block_io_uring)
                seccomp_block_io_uring();
}

static void skip_without_dataset(void) {
        if (access(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist to run this test", FASHION_MNIST_DIR);
}

Test(daemon, check_job_ok_and_broken) {
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--check-job", "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL }, child_setup);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "OK: 6 layers, 1863690 parameters"), "%s", p.out);

        char path[] = "/tmp/ravnest-test-daemon-XXXXXX";
        int fd = mkstemp(path);
        const char *bad = "name = \"x\";\ndataset = { name = \"fashion-mnist\"; };\nmodel = { input = [1, 28, 28];\n"
                          "  layers = ( { type = \"flatten\"; }, { type = \"linear\"; out = 10; } ); };\n"
                          "optimizer = { type = \"sgd\"; lr = 0.1; warp = 9; };\ntraining = { batch_size = 8; epochs = 1; };\n";
        cr_assert_eq(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
        close(fd);
        proc_start(&p, (char *[]){ RAVNESTD, "--check-job", "--job", path, NULL }, child_setup);
        int code = proc_exit(&p);
        unlink(path);
        cr_assert_eq(code, 78, "exit %d: %s", code, p.out); /* EX_CONFIG */
        char want[128];
        snprintf(want, sizeof want, "%s:5: optimizer.warp: unknown setting", path);
        cr_assert(strstr(p.out, want), "%s", p.out);
        cr_assert(strstr(p.out, "<3>"), "errors carry the sd-daemon priority prefix: %s", p.out);
}

static void stops_cleanly_on(int sig) {
        skip_without_dataset();
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--no-idle", "--control-socket", "none", "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--progress", "200", NULL }, child_setup);
        cr_assert(proc_wait_for(&p, "step ", 60000), "no progress line: %s", p.out);
        cr_assert(strstr(p.out, "<6>Training fashion-mnist-mlp"), "%s", p.out);
        kill(p.pid, sig);
        int code = proc_exit(&p);
        cr_assert_eq(code, 0, "exit %d after signal %d: %s", code, sig, p.out);
        cr_assert(strstr(p.out, "stopped cleanly"), "%s", p.out);
}

Test(daemon, sigterm_stops_cleanly, .timeout = 180) {
        stops_cleanly_on(SIGTERM);
}

Test(daemon, sigint_stops_cleanly, .timeout = 180) {
        stops_cleanly_on(SIGINT);
}

Test(daemon, broken_dataset_is_a_clear_error) {
        char dir[] = "/tmp/ravnest-test-data-XXXXXX";
        cr_assert_not_null(mkdtemp(dir));
        char path[128];
        snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
        FILE *f = fopen(path, "w");
        fputs("this is not an IDX file", f);
        fclose(f);
        Proc p, check;
        proc_start(&p, (char *[]){ RAVNESTD, "--no-idle", "--control-socket", "none", "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--data-dir", dir, NULL }, child_setup);
        int code = proc_exit(&p);
        /* the check says what the start says, with its exit status: the
         * files are broken, not the job (it said "Invalid job", 78) */
        proc_start(&check, (char *[]){ RAVNESTD, "--check-job", "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                       "--data-dir", dir, NULL }, child_setup);
        int checked = proc_exit(&check);
        unlink(path);
        rmdir(dir);
        cr_assert_eq(code, 1, "exit %d: %s", code, p.out);
        char want[192];
        snprintf(want, sizeof want, "Unusable dataset: %s: bad magic", path);
        cr_assert(strstr(p.out, want), "%s", p.out);
        cr_assert_eq(checked, 1, "exit %d: %s", checked, check.out);
        cr_assert(strstr(check.out, want), "%s", check.out);
}

/* ---- rate-limited lines ---------------------------------------------------- */

/* Of total lines about one sender that p would write without a rate limit,
 * those it wrote (containing line) and those its summaries ("<subject> ...
 * and N more in the last S s") count; reads p's output until they add up to
 * total (the last summary comes when its interval ends), then checks that
 * each interval let at most a burst through. Returns the lines written. */
static int rate_limited_lines(Proc *p, const char *line, const char *subject, int total) {
        int shown = 0, hidden = 0, summaries = 0;
        for (int waited = 0; waited < 60; waited++) {
                shown = test_count(p->out, line);
                hidden = summaries = 0;
                for (const char *s = strstr(p->out, subject); s; s = strstr(s + 1, subject)) {
                        int n;
                        if (sscanf(s + strlen(subject), " ... and %d more in the last", &n) == 1) {
                                hidden += n;
                                summaries++;
                        }
                }
                if (shown + hidden >= total)
                        break;
                proc_wait_for(p, "(a line that never comes)", 1000);
        }
        cr_assert_eq(shown + hidden, total, "%d lines written, %d in %d summaries, of %d:\n%s", shown, hidden,
                     summaries, total, p->out);
        cr_assert_geq(summaries, 1, "%s", p->out);
        cr_assert_leq(shown, LOG_RATELIMIT_BURST * (summaries + 1), "%d lines written in %d intervals:\n%s", shown,
                      summaries + 1, p->out);
        return shown;
}

/* ---- the network: peers join, strangers are refused ---------------------- */

/* A tiny Fashion-MNIST lookalike: 32 images, so training is instant. */
static void write_tiny_dataset(const char *dir) {
        static const char *splits[] = { "train", "t10k" };
        for (int s = 0; s < 2; s++) {
                char path[256];
                uint8_t img[16 + 32 * 784], lab[8 + 32];
                uint8_t ih[16] = { 0, 0, 8, 3, 0, 0, 0, 32, 0, 0, 0, 28, 0, 0, 0, 28 }, lh[8] = { 0, 0, 8, 1, 0, 0, 0, 32 };
                memcpy(img, ih, 16);
                memcpy(lab, lh, 8);
                for (int i = 0; i < 32 * 784; i++)
                        img[16 + i] = (uint8_t)(i * 7);
                for (int i = 0; i < 32; i++)
                        lab[8 + i] = (uint8_t)(i % 10);
                snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, splits[s]);
                gzFile f = gzopen(path, "wb");
                gzwrite(f, img, sizeof img);
                gzclose(f);
                snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, splits[s]);
                f = gzopen(path, "wb");
                gzwrite(f, lab, sizeof lab);
                gzclose(f);
        }
}

/* SIGTERM to p, which must then exit 0, and dir removed. */
static void stop_cleanly_and_remove(Proc *p, const char *dir) {
        kill(p->pid, SIGTERM);
        cr_assert_eq(proc_exit(p), 0, "%s", p->out);
        test_remove_tree(dir);
}

/* dir, a mkdtemp() template, made, with the tiny data set in it. */
static void make_tiny_dir(char *dir) {
        cr_assert_not_null(mkdtemp(dir));
        write_tiny_dataset(dir);
}

/* In dir (made, the tiny data set in it): a job on those data whose model
 * is its layers after the flattening and whose training is its settings,
 * and a configuration with a state directory and nothing else. */
static void tiny_job(char *dir, const char *layers, const char *training, char job[256], char conf[256]) {
        char text[768];
        make_tiny_dir(dir);
        snprintf(job, 256, "%s/tiny.job", dir);
        snprintf(text, sizeof text,
                 "name = \"tiny\";\ndataset = { name = \"fashion-mnist\"; };\n"
                 "model = { input = [1, 28, 28]; layers = ( { type = \"flatten\"; },\n  %s ); };\n"
                 "optimizer = { type = \"sgd\"; lr = 0.01; };\ntraining = { %s };\n", layers, training);
        test_write_file(job, text, 0644);
        snprintf(conf, 256, "%s/n.conf", dir);
        snprintf(text, sizeof text, "state_directory = \"%s/state\";\ncontrol_socket = \"\";\nidle = { enabled = false; };\n",
                 dir);
        test_write_file(conf, text, 0644);
}

/* ---- an address-space limit ----------------------------------------------- */

/* In the child before exec: 120 MiB of address space, twice what an idle
 * node maps, less than the job's 200 MB of weights and less than the
 * 128 MiB buffer each thread of OpenBLAS's own pool would allocate. */
static void limit_address_space(void) {
        struct rlimit rl = { 120 << 20, 120 << 20 };
        if (setrlimit(RLIMIT_AS, &rl) < 0)
                _exit(126);
}

/* A node that cannot set its job up within the limit exits 1. It used to
 * hang in exit() for ever, SIGTERM or not: OpenBLAS's thread pool, started
 * before main(), retried its buffer's allocation, and exit() joined it. The
 * test's timeout bounds the wait. */
Test(daemon, exits_1_when_the_job_does_not_fit_an_address_space_limit, .timeout = 120) {
#if defined(__SANITIZE_ADDRESS__)
        cr_skip_test("SKIP: AddressSanitizer maps terabytes of shadow memory, which no address-space limit admits");
#endif
        char dir[] = "/tmp/ravnest-test-as-XXXXXX", job[256], conf[256];
        tiny_job(dir, "{ type = \"linear\"; out = 65536; }, { type = \"linear\"; out = 10; }",
                 "batch_size = 8; epochs = 1;", job, conf);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", job, "--data-dir", dir, "--threads", "1", NULL },
                   limit_address_space);
        int code = proc_exit(&p);
        test_remove_tree(dir);
        cr_assert_eq(code, 1, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "<3>Failed to "), "%s", p.out);
}

/* A run stopped after more epochs than the 64 whose throughputs it keeps
 * for their median counts every epoch it did (it said "64 of them in this
 * run" after 297). */
Test(daemon, a_stopped_run_counts_every_epoch_it_did, .timeout = 180) {
        char dir[] = "/tmp/ravnest-test-ep-XXXXXX", job[256], conf[256], want[96];
        tiny_job(dir, "{ type = \"linear\"; out = 10; }", "batch_size = 32; epochs = 100000;", job, conf);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", job, "--data-dir", dir, "--threads", "1",
                                   "--progress", "0", NULL }, child_setup);
        cr_assert(proc_wait_for_count(&p, " done: train loss", 70, 120000), "%s", p.out);
        kill(p.pid, SIGTERM);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        const char *line = strstr(p.out, "Stopped with ");
        unsigned long long done = 0;
        cr_assert(line && sscanf(line, "Stopped with %llu epochs done", &done) == 1, "%s", p.out);
        cr_assert_geq(done, 70, "%s", line);
        snprintf(want, sizeof want, "Stopped with %llu epochs done (%llu of them in this run)", done, done);
        cr_assert(strstr(p.out, want), "wanted \"%s\": %s", want, line);
        test_remove_tree(dir);
}

/* Data of one's own with a file missing: the error names the file, and
 * sends nobody to install Debian's data set (it did, whatever the path). */
Test(daemon, a_dataset_of_one_s_own_missing_a_file_is_named, .timeout = 60) {
        char dir[] = "/tmp/ravnest-test-dm-XXXXXX", job[256], path[256], text[512];
        make_tiny_dir(dir);
        snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", dir);
        cr_assert_eq(unlink(path), 0);
        snprintf(job, sizeof job, "%s/own.job", dir);
        snprintf(text, sizeof text,
                 "name = \"own\";\ndataset = { name = \"idx\"; path = \"%s\"; classes = 10; };\n"
                 "model = { input = [1, 28, 28]; layers = ( { type = \"flatten\"; }, { type = \"linear\"; out = 10; } ); };\n"
                 "optimizer = { type = \"sgd\"; lr = 0.01; };\ntraining = { batch_size = 8; epochs = 1; };\n", dir);
        test_write_file(job, text, 0644);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--job", job, "--control-socket", "none", "--no-idle", NULL }, child_setup);
        int code = proc_exit(&p);
        test_remove_tree(dir);
        cr_assert_neq(code, 0, "%s", p.out);
        cr_assert(strstr(p.out, "t10k-labels-idx1-ubyte"), "the missing file is not named: %s", p.out);
        cr_assert_null(strstr(p.out, "install Debian's"), "%s", p.out);
}

/* The network secret every node of a test shares, as <dir>/secret (its
 * path in path). */
static void write_secret(const char *dir, char path[256]) {
        snprintf(path, 256, "%s/secret", dir);
        test_write_file(path, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
}

static void node_config(const char *dir, const char *name, const char *secret_file, uint16_t listen, uint16_t peer,
                        char *ret_path) {
        char text[1024], state[256];
        snprintf(state, sizeof state, "%s/state-%s", dir, name);
        snprintf(ret_path, 256, "%s/%s.conf", dir, name);
        int k = snprintf(text, sizeof text,
                         "state_directory = \"%s\";\ncontrol_socket = \"%s.sock\";\nidle = { enabled = false; };\n"
                         "network = {\n  secret_file = \"%s\";\n",
                         state, state, secret_file);
        if (listen)
                k += snprintf(text + k, sizeof text - (size_t)k, "  listen = \"127.0.0.1:%u\";\n", listen);
        if (peer)
                k += snprintf(text + k, sizeof text - (size_t)k, "  peers = [ \"127.0.0.1:%u\" ];\n", peer);
        snprintf(text + k, sizeof text - (size_t)k, "};\n");
        test_write_file(ret_path, text, 0644);
}

static void start_node(Proc *p, const char *conf, const char *data) {
        proc_start(p, (char *[]){ RAVNESTD, "--config", (char *)conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                  "--data-dir", (char *)data, "--progress", "0", NULL }, child_setup);
}

Test(daemon, peers_join_and_strangers_are_refused, .timeout = 120) {
        char dir[] = "/tmp/ravnest-test-net-XXXXXX", secret[256], other[256], ca[256], cb[256], cc[256];
        make_tiny_dir(dir);
        write_secret(dir, secret);
        snprintf(other, sizeof other, "%s/other-secret", dir);
        test_write_file(other, "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n", 0600);
        uint16_t port = test_free_port();
        node_config(dir, "a", secret, port, 0, ca);
        node_config(dir, "b", secret, 0, port, cb);
        node_config(dir, "c", other, 0, port, cc);

        Proc a, b, c;
        start_node(&a, ca, dir);
        cr_assert(proc_wait_for(&a, "serving peers", 30000), "%s", a.out);
        cr_assert(strstr(a.out, "Created identity"), "%s", a.out);
        char idpath[300];
        snprintf(idpath, sizeof idpath, "%s/state-a/identity", dir);
        struct stat st;
        cr_assert_eq(stat(idpath, &st), 0);
        cr_assert_eq(st.st_mode & 0777, 0600, "identity mode %o", st.st_mode & 0777);

        start_node(&b, cb, dir);
        cr_assert(proc_wait_for(&b, "joined", 30000), "b: %s", b.out);
        cr_assert(proc_wait_for(&a, "joined", 10000), "a: %s", a.out);

        /* A stranger with another network secret: it finds that the
         * listener's proof does not match its secret and drops the link; the
         * listener sees the handshake end. */
        start_node(&c, cc, dir);
        cr_assert(proc_wait_for(&c, "not admitted", 30000), "c: %s", c.out);
        cr_assert(strstr(c.out, "<4>Authentication failed"), "c: %s", c.out);
        /* Each side names the other: c the listener's key (it signed) and
         * address, a the address c connected from (c proved nothing). */
        char a_hex[IDENTITY_HEX_SIZE + 32];
        const char *joined = strstr(b.out, "Peer ");
        cr_assert(joined, "b: %s", b.out);
        snprintf(a_hex, sizeof a_hex, "%.64s at 127.0.0.1:%u", joined + 5, port);
        cr_assert(strstr(c.out, a_hex), "c does not name \"%s\": %s", a_hex, c.out);
        cr_assert(proc_wait_for(&a, "closed during the handshake", 10000), "a: %s", a.out);
        cr_assert(strstr(a.out, "with 127.0.0.1:"), "a does not name the stranger's address: %s", a.out);
        cr_assert(!strstr(a.out, "before the handshake"), "a: %s", a.out);
        /* The good link is untouched. */
        cr_assert(!strstr(b.out, "left"), "b: %s", b.out);

        /* Everyone still runs; stop them. b says goodbye as it stops. */
        kill(c.pid, SIGTERM);
        proc_exit(&c);
        kill(b.pid, SIGTERM);
        cr_assert_eq(proc_exit(&b), 0, "%s", b.out);
        cr_assert(proc_wait_for(&a, "left", 10000), "a: %s", a.out);
        cr_assert(proc_wait_for(&a, "said goodbye", 10000), "b stopped without BYE: %s", a.out);
        kill(a.pid, SIGTERM);
        cr_assert_eq(proc_exit(&a), 0, "%s", a.out);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

/* Node a in dir, listening on port: it trained on the tiny dataset in a
 * moment, and serves its peers and its control socket
 * (<dir>/state-a.sock), quietly. */
static void start_trained_node(Proc *p, const char *dir, uint16_t port) {
        char secret[256], conf[256];
        write_tiny_dataset(dir);
        write_secret(dir, secret);
        node_config(dir, "a", secret, port, 0, conf);
        start_node(p, conf, dir);
        cr_assert(proc_wait_for(p, "serving peers", 30000), "%s", p->out);
}

/* Anyone who reaches the port can fail handshakes as fast as it connects:
 * a burst of warnings per address, then one line for the rest. */
Test(daemon, a_flood_of_failed_handshakes_logs_a_burst_and_a_summary, .timeout = 180) {
        char dir[] = "/tmp/ravnest-test-flood-XXXXXX";
        cr_assert_not_null(mkdtemp(dir));
        uint16_t port = test_free_port();
        Proc a;
        start_trained_node(&a, dir, port);

        enum { FLOOD = 200 };
        static const char junk[] = "GET / HTTP/1.0\r\n\r\n"; /* not a HELLO */
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        for (int i = 0; i < FLOOD; i++) {
                int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "connection %d", i);
                (void)send(fd, junk, sizeof junk - 1, MSG_NOSIGNAL);
                close(fd);
        }
        int shown = rate_limited_lines(&a, "with 127.0.0.1:", "Failed handshakes from 127.0.0.1", FLOOD);
        cr_log_info("%d failed handshakes: %d lines and their summaries", FLOOD, shown);
        stop_cleanly_and_remove(&a, dir);
}

Test(daemon, falls_back_to_epoll_without_io_uring, .timeout = 120) {
        char dir[] = "/tmp/ravnest-test-epoll-XXXXXX", secret[256], ca[256], cb[256];
        make_tiny_dir(dir);
        write_secret(dir, secret);
        uint16_t port = test_free_port();
        node_config(dir, "a", secret, port, 0, ca);
        node_config(dir, "b", secret, 0, port, cb);

        Proc a, b;
        block_io_uring = true; /* a runs as in a container with the default seccomp profile */
        start_node(&a, ca, dir);
        block_io_uring = false;
        cr_assert(proc_wait_for(&a, "serving peers", 30000), "%s", a.out);
        cr_assert(strstr(a.out, "<4>io_uring is not available"), "no warning about the fallback: %s", a.out);
        cr_assert(strstr(a.out, "Transport: epoll backend"), "%s", a.out);
        const char *w = strstr(a.out, "io_uring is not available");
        cr_assert(!strstr(w + 1, "io_uring is not available"), "the warning must come once: %s", a.out);

        start_node(&b, cb, dir);
        cr_assert(proc_wait_for(&b, "joined", 30000), "b: %s", b.out);
        cr_assert(strstr(b.out, "Transport: io_uring backend"), "b: %s", b.out);
        cr_assert(proc_wait_for(&a, "joined", 10000), "a: %s", a.out);
        kill(b.pid, SIGTERM);
        cr_assert_eq(proc_exit(&b), 0, "%s", b.out);
        kill(a.pid, SIGTERM);
        cr_assert_eq(proc_exit(&a), 0, "%s", a.out);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

/* ---- averaging: two members train one model on halves of the data -------- */

#include "net/identity.h"

/* state-<name>/identity created ahead, so the configs can name the keys.
 * With take_parameters, as a stage of a pipeline does, each takes the
 * other's parameters in its first round and its optimizer's moments before
 * it trains. */
static const char *const member_names[2] = { "a", "b" };

/* In dir (made), the network secret and two averaging members "a" and "b"
 * (state-a, a.sock, a.conf in conf[0]; identities made ahead, so that each
 * configuration names both keys), listening on port[i], with settings in
 * their averaging group besides the method (ring), listen and members. */
static void member_configs(char *dir, const char *settings, uint16_t port[2], char conf[2][256]) {
        char secret[256], hex[2][IDENTITY_HEX_SIZE];
        cr_assert_not_null(mkdtemp(dir));
        write_secret(dir, secret);
        for (int i = 0; i < 2; i++) {
                port[i] = test_free_port();
                test_make_identity(dir, member_names[i], hex[i]);
        }
        for (int i = 0; i < 2; i++) {
                char text[2048];
                const char *name = member_names[i];
                snprintf(conf[i], 256, "%s/%s.conf", dir, name);
                snprintf(text, sizeof text,
                         "state_directory = \"%s/state-%s\";\n"
                         "control_socket = \"%s/%s.sock\";\n"
                         "idle = { enabled = false; };\n"
                         "threads = 1;\n"
                         "network = { secret_file = \"%s\"; };\n"
                         "averaging = {\n"
                         "  method = \"ring\";\n"
                         "  %s\n"
                         "  listen = \"127.0.0.1:%u\";\n"
                         "  members = [ \"%s@127.0.0.1:%u\", \"%s@127.0.0.1:%u\" ];\n"
                         "};\n",
                         dir, name, dir, name, secret, settings, port[i], hex[0], port[0], hex[1], port[1]);
                test_write_file(conf[i], text, 0644);
        }
}

Test(daemon, two_members_average_while_training, .timeout = 300) {
        skip_without_dataset();
        char dir[] = "/tmp/ravnest-test-avg-XXXXXX", conf[2][256];
        const char *const *names = member_names;
        uint16_t port[2];
        member_configs(dir, "interval = 1.0;\n  take_parameters = true;", port, conf);
        Proc p[2];
        for (int i = 0; i < 2; i++)
                proc_start(&p[i], (char *[]){ RAVNESTD, "--config", conf[i], "--job",
                                              SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--epochs", "1",
                                              "--progress", "0", NULL }, child_setup);
        /* a stranger on the averaging port is logged as one on the node's own port is */
        cr_assert(proc_wait_for(&p[0], "Averaging round 1 done", 120000), "%s", p[0].out);
        int junk = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port[0]),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        cr_assert(junk >= 0 && connect(junk, (struct sockaddr *)&to, sizeof to) == 0);
        cr_assert_eq(write(junk, "GET / HTTP/1.0\r\n\r\n", 18), 18);
        close(junk);
        cr_assert(proc_wait_for(&p[0], "Averaging: a connection from 127.0.0.1:", 60000), "%s", p[0].out);
        for (int i = 0; i < 2; i++) {
                cr_assert(proc_wait_for(&p[i], "Finished", 240000), "%s: %s", names[i], p[i].out);
                cr_assert(strstr(p[i].out, "this node reads its shard"), "%s", p[i].out);
                cr_assert(strstr(p[i].out, "Averaging round 1 done: 2 of 2 members"), "%s: %s", names[i], p[i].out);
                cr_assert(strstr(p[i].out, "Took the other members' parameters before training: 1 round"), "%s: %s",
                          names[i], p[i].out);
                /* a member with steps hands its moments over; one that has taken none says they are zero */
                cr_assert(strstr(p[i].out, "Took the optimizer's moments from member") ||
                                  strstr(p[i].out, "has taken no optimizer step: the optimizer's moments start from zero"),
                          "%s: %s", names[i], p[i].out);
                double acc = test_final_accuracy(p[i].out);
                cr_log_info("member %s: test accuracy %.2f%% after 1 epoch on half the data each\n", names[i], acc);
                cr_assert(acc >= 80.0, "%s: accuracy %.2f%%: %s", names[i], acc, p[i].out);
                /* the members leave as one model (ravnestd.conf(5), round_timeout) */
                cr_assert(strstr(p[i].out, "The last averaging round included all 2 members"), "%s: %s", names[i],
                          p[i].out);
        }
        /* finished, its averaging links closed: the bytes of every link since
         * the start, those of averaging among them, do not go back to 0 */
        for (int i = 0; i < 2; i++) {
                cr_assert(proc_wait_for(&p[i], "serving peers until stopped", 60000), "%s: %s", names[i], p[i].out);
                char sock[300];
                snprintf(sock, sizeof sock, "%s/%s.sock", dir, names[i]);
                Proc c;
                proc_start(&c, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL }, NULL);
                cr_assert_eq(proc_exit(&c), 0, "%s", c.out);
                const char *state = strstr(c.out, "\"State\": \""), *sent = strstr(c.out, "\"BytesSent\": "),
                           *received = strstr(c.out, "\"BytesReceived\": "),
                           *avg = strstr(c.out, "\"AveragingBytesSent\": ");
                cr_assert(state && sent && received && avg, "%s", c.out);
                cr_assert(!strncmp(state + 10, "finished", 8), "%s", c.out);
                unsigned long long bs = strtoull(sent + 13, NULL, 10), br = strtoull(received + 17, NULL, 10),
                                   as = strtoull(avg + 22, NULL, 10);
                cr_assert(as > 0 && bs >= as && br > 0, "%s: BytesSent %llu, BytesReceived %llu, AveragingBytesSent "
                          "%llu: %s", names[i], bs, br, as, c.out);
        }
        for (int i = 0; i < 2; i++) {
                kill(p[i].pid, SIGTERM);
                cr_assert_eq(proc_exit(&p[i]), 0, "%s", p[i].out);
        }
        /* ... the same parameters, bit for bit */
        char out[2][300];
        for (int i = 0; i < 2; i++) {
                char ckpt[300];
                snprintf(ckpt, sizeof ckpt, "%s/state-%s/fashion-mnist-mlp.layers-0-6.ckpt", dir, names[i]);
                snprintf(out[i], sizeof out[i], "%s/%s.safetensors", dir, names[i]);
                Proc e;
                proc_start(&e, (char *[]){ RAVNESTCTL, "export", "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                           "--checkpoint", ckpt, "--output", out[i], NULL }, NULL);
                cr_assert_eq(proc_exit(&e), 0, "%s", e.out);
        }
        char cmp[700];
        snprintf(cmp, sizeof cmp, "cmp -s %s %s", out[0], out[1]);
        cr_assert_eq(system(cmp), 0, "the members' trained parameters differ (%s, %s)", out[0], out[1]);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

/* A last round waits for every member, connected yet or not, up to half
 * the round timeout: a finishes its job before b has even started, and
 * its last round takes b in once b comes up (what makes the replicas one
 * model when one member trained only briefly, or started late). */
Test(daemon, a_last_round_waits_for_a_member_not_up_yet, .timeout = 120) {
        char dir[] = "/tmp/ravnest-test-last-XXXXXX", conf[2][256], job[300];
        uint16_t port[2];
        member_configs(dir, "interval = 0.5;\n  round_timeout = 30000;", port, conf);
        write_tiny_dataset(dir);
        snprintf(job, sizeof job, "%s/tiny.job", dir);
        test_write_file(job, "name = \"tiny\";\ndataset = { name = \"fashion-mnist\"; };\n"
                             "model = { input = [1, 28, 28]; layers = ( { type = \"flatten\"; }, "
                             "{ type = \"linear\"; out = 10; } ); };\n"
                             "optimizer = { type = \"sgd\"; lr = 0.01; };\ntraining = { batch_size = 8; epochs = 2; };\n",
                        0644);
        Proc p[2];
        proc_start(&p[0], (char *[]){ RAVNESTD, "--config", conf[0], "--job", job, "--data-dir", dir, "--progress", "0",
                                      NULL }, child_setup);
        cr_assert(proc_wait_for(&p[0], "Training done: a last averaging round before the evaluation", 60000), "%s",
                  p[0].out);
        proc_start(&p[1], (char *[]){ RAVNESTD, "--config", conf[1], "--job", job, "--data-dir", dir, "--progress", "0",
                                      NULL }, child_setup);
        bool met = proc_wait_for(&p[0], "The last averaging round included all 2 members", 60000);
        for (int i = 0; i < 2; i++)
                kill(p[i].pid, SIGTERM);
        int status[2] = { proc_exit(&p[0]), proc_exit(&p[1]) };
        test_remove_tree(dir);
        cr_assert(met, "%s\n---- b:\n%s", p[0].out, p[1].out);
        cr_assert_eq(status[0], 0, "%s", p[0].out);
        cr_assert_eq(status[1], 0, "%s", p[1].out);
}

/* A member list without this node's own key is a configuration error. */
Test(daemon, averaging_without_this_node_is_a_config_error, .timeout = 60) {
        char dir[] = "/tmp/ravnest-test-avgconf-XXXXXX", secret[256], conf[256], text[2048];
        make_tiny_dir(dir);
        write_secret(dir, secret);
        snprintf(conf, sizeof conf, "%s/x.conf", dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state\";\ncontrol_socket = \"\";\nnetwork = { secret_file = \"%s\"; };\n"
                 "averaging = { listen = \"127.0.0.1:%u\";\n"
                 "  members = [ \"%s@127.0.0.1:1\", \"%s@127.0.0.1:2\" ]; };\n",
                 dir, secret, test_free_port(), "11111111111111111111111111111111111111111111111111111111111111aa",
                 "22222222222222222222222222222222222222222222222222222222222222bb");
        test_write_file(conf, text, 0644);
        Proc p;
        start_node(&p, conf, dir);
        cr_assert_eq(proc_exit(&p), 78, "%s", p.out);
        cr_assert(strstr(p.out, "averaging.members: this node's key"), "%s", p.out);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

/* A socket bound and listening on a loopback port, so that a node cannot. */
static int hold_port(uint16_t *ret_port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;
        cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 1) == 0);
        cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
        *ret_port = ntohs(sa.sin_port);
        return fd;
}

/* A node that cannot start (its address in use) under systemd's
 * Type=notify never says READY=1, so `systemctl start` fails; it says at
 * once that the address is in use and that it waits for it, before the
 * failure (it said nothing for the 10 s it waited). An unconfigured node
 * that a reload sets training, and that then cannot start, is
 * unconfigured again and stays up (it exited 1 into a restart loop), and
 * a later reload that can start trains, once the address it waits for
 * comes free. */
static void node_file(const char *dir, uint16_t listen, uint16_t metrics, char *conf) {
        char text[1024];
        int k = snprintf(text, sizeof text,
                         "state_directory = \"%s/state\";\ncontrol_socket = \"%s/ctl\";\nidle = { enabled = false; };\n"
                         "job = \"" SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job\";\n", dir, dir);
        if (listen)
                k += snprintf(text + k, sizeof text - (size_t)k,
                              "network = { secret_file = \"%s/secret\"; listen = \"127.0.0.1:%u\"; };\n", dir, listen);
        if (metrics)
                snprintf(text + k, sizeof text - (size_t)k, "metrics = { listen = \"127.0.0.1:%u\"; };\n", metrics);
        snprintf(conf, 256, "%s/node.conf", dir);
        test_write_file(conf, text, 0644);
}

Test(daemon, a_node_that_cannot_start_is_never_ready_and_a_reload_that_cannot_stays_unconfigured, .timeout = 120) {
        char dir[] = "/tmp/ravnest-test-ready-XXXXXX", path[256], conf[256];
        make_tiny_dir(dir);
        write_secret(dir, path);
        uint16_t port;
        int held = hold_port(&port);

        /* systemd's notify socket, played by the test */
        int notify = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s/notify", dir);
        cr_assert(notify >= 0 && bind(notify, (struct sockaddr *)&sa, sizeof sa) == 0);
        setenv("NOTIFY_SOCKET", sa.sun_path, 1);
        node_file(dir, port, 0, conf);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--data-dir", dir, "--progress", "0", NULL }, NULL);
        int code = proc_exit(&p);
        unsetenv("NOTIFY_SOCKET");
        cr_assert_eq(code, 1, "%s", p.out);
        char waiting[64];
        snprintf(waiting, sizeof waiting, "127.0.0.1:%u is in use: waiting up to 10 s for it", port);
        const char *wait_line = strstr(p.out, waiting), *failed = strstr(p.out, "Failed to listen on");
        cr_assert(wait_line && failed && wait_line < failed, "no \"%s\" before the failure:\n%s", waiting, p.out);
        cr_assert(strstr(failed, "Address already in use"), "%s", p.out);
        char msg[512];
        ssize_t k;
        while ((k = recv(notify, msg, sizeof msg - 1, 0)) > 0) {
                msg[k] = 0;
                cr_assert(!strstr(msg, "READY=1"), "a node that failed to start said READY=1");
        }
        close(notify);

        /* unconfigured, then a reload that cannot start, then one that can */
        node_file(dir, 0, 0, conf);
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--data-dir", dir, "--progress", "0", NULL }, NULL);
        cr_assert(proc_wait_for(&p, "unconfigured", 30000), "%s", p.out);
        uint16_t metrics = test_free_port();
        node_file(dir, port, metrics, conf);
        cr_assert_eq(kill(p.pid, SIGHUP), 0);
        cr_assert(proc_wait_for(&p, "the node is unconfigured again", 30000), "%s", p.out);
        snprintf(path, sizeof path, "%s/ctl", dir);
        Proc st;
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--socket", path, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "the node is gone: %s\n%s", st.out, p.out);
        cr_assert(strstr(st.out, "unconfigured"), "%s", st.out);
        /* and says why, as systemd's STATUS= does (it showed "unconfigured" alone) */
        cr_assert(strstr(st.out, "Reload: failed, training could not start (Address already in use)"), "%s",
                  st.out);
        cr_assert_eq(kill(p.pid, SIGHUP), 0);
        cr_assert(proc_wait_for_count(&p, waiting, 2, 30000), "%s", p.out);
        close(held);
        char free_line[64];
        snprintf(free_line, sizeof free_line, "127.0.0.1:%u is free now, after ", port);
        cr_assert(proc_wait_for(&p, free_line, 30000), "%s", p.out);
        cr_assert(proc_wait_for(&p, "epoch 1/", 60000), "%s", p.out);
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--socket", path, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        cr_assert(!strstr(st.out, "Reload:"), "a reload that worked still said the last one failed: %s", st.out);
        /* and serves what the new file says beside training (metrics were ignored until a restart) */
        int web = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(metrics),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        char answer[8192] = "";
        cr_assert(web >= 0 && connect(web, (struct sockaddr *)&to, sizeof to) == 0, "no metrics: %s", p.out);
        cr_assert_eq(write(web, "GET /metrics HTTP/1.0\r\n\r\n", 26), 26);
        size_t got = 0;
        for (ssize_t n; got < sizeof answer - 1 && (n = read(web, answer + got, sizeof answer - 1 - got)) > 0;)
                got += (size_t)n;
        close(web);
        cr_assert(strstr(answer, "ravnest_state"), "%s", answer);
        cr_assert_eq(kill(p.pid, SIGTERM), 0);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        test_remove_tree(dir);
}

/* The interface file installed for D-Bus tools names every property the
 * node serves, and no other (it lacked the six traffic properties). */
Test(daemon, the_interface_file_names_every_property, .timeout = 60) {
        char dir[] = "/tmp/ravnest-test-xml-XXXXXX", sock[128];
        Proc p, st;
        test_start_unconfigured(&p, RAVNESTD, dir, sock);
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--json", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        static char xml[65536];
        FILE *f = fopen(SOURCE_ROOT "/config/dbus/org.ravnest.Node1.xml", "re");
        cr_assert(f);
        xml[fread(xml, 1, sizeof xml - 1, f)] = 0;
        fclose(f);
        int served = 0;
        for (const char *k = st.out; (k = strstr(k, "\"")); served++) { /* "Name": value, ... */
                char name[64], want[96];
                cr_assert_eq(sscanf(k, "\"%63[^\"]\"", name), 1, "%s", k);
                snprintf(want, sizeof want, "<property name=\"%s\" ", name);
                cr_expect(strstr(xml, want), "%s is not in the interface file", name);
                k = strchr(k + strlen(name) + 2, ',');
                if (!k)
                        break;
        }
        cr_assert_eq(test_count(xml, "<property name="), served + 1, "%d served:\n%s", served + 1, st.out);
        stop_cleanly_and_remove(&p, dir);
}

/* ---- the control socket, as clients other than ravnestctl use it -------- */

/* libdbus (dbus-send) sends its first call in the same write as the end of
 * its authentication; it is answered, not left in a buffer. Another user
 * cannot take every place on the socket. */
Test(daemon, the_control_socket_answers_a_call_sent_with_the_authentication_and_keeps_places_for_root,
     .timeout = 120) {
        if (access("/usr/bin/dbus-send", X_OK) < 0)
                cr_skip_test("SKIP: needs dbus-send (apt-get install dbus-bin)");
        char dir[] = "/tmp/ravnest-test-ctl-XXXXXX", sock[128], cmd[512], out[256] = "";
        make_tiny_dir(dir);
        snprintf(sock, sizeof sock, "%s/control", dir);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--no-idle", "--control-socket", sock, "--job",
                                   SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--data-dir", dir, "--epochs", "1000",
                                   "--progress", "0", NULL }, child_setup);
        cr_assert(proc_wait_for(&p, "Training", 30000), "%s", p.out);
        for (int i = 0; i < 3; i++) {
                snprintf(cmd, sizeof cmd,
                         "timeout 10 dbus-send --peer=unix:path=%s --print-reply /org/ravnest/Node1 "
                         "org.freedesktop.DBus.Properties.Get string:org.ravnest.Node1 string:State", sock);
                FILE *f = popen(cmd, "r");
                cr_assert_not_null(f);
                size_t n = fread(out, 1, sizeof out - 1, f);
                out[n] = '\0';
                int status = pclose(f);
                cr_assert_eq(status, 0, "try %d: dbus-send failed (exit %d): %s", i, WEXITSTATUS(status), out);
                cr_assert(strstr(out, "string \"training\"") || strstr(out, "string \"starting\""), "%s", out);
        }

        /* another user holds at most 4 of the 32 places, and while it does,
         * root still gets in */
        if (geteuid() == 0) {
                cr_assert_eq(chmod(dir, 0755), 0);
                int held = 0, pipefd[2];
                cr_assert_eq(pipe(pipefd), 0);
                pid_t child = fork();
                if (child == 0) {
                        if (setgid(65534) < 0 || setuid(65534) < 0)
                                _exit(2);
                        int n = 0;
                        for (int i = 0; i < 8; i++) {
                                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                                snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", sock);
                                int fd = socket(AF_UNIX, SOCK_STREAM, 0);
                                char hello[64], c;
                                struct timeval tv = { .tv_sec = 5 };
                                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                                int k = snprintf(hello, sizeof hello, "%cAUTH EXTERNAL 3635353334\r\n", 0);
                                if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
                                    send(fd, hello, (size_t)k, MSG_NOSIGNAL) == k && recv(fd, &c, 1, 0) == 1)
                                        n++; /* answered: it holds a place (fd left open) */
                        }
                        (void)!write(pipefd[1], &n, sizeof n);
                        pause();
                        _exit(0);
                }
                cr_assert_eq(read(pipefd[0], &held, sizeof held), (ssize_t)sizeof held);
                cr_assert_eq(held, BUS_MAX_DIRECT_PER_USER, "another user holds %d places", held);
                cr_assert(proc_wait_for(&p, "Refused a control client of uid 65534: no place", 10000), "%s", p.out);
                snprintf(cmd, sizeof cmd, "timeout 10 %s status --socket %s > /dev/null", RAVNESTCTL, sock);
                cr_assert_eq(system(cmd), 0, "root's status with another user's clients connected");
                kill(child, SIGKILL);
                waitpid(child, NULL, 0);
                close(pipefd[0]);
                close(pipefd[1]);
        }
        kill(p.pid, SIGTERM);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

/* A raw client of the control socket, authenticated as the EXTERNAL
 * mechanism asks, its messages next; -1 when it is not answered OK. */
static int control_connect(const char *sock) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        struct timeval tv = { .tv_sec = 10 };
        char uid[16], hex[40] = "", line[80], reply[128];
        snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", sock);
        snprintf(uid, sizeof uid, "%u", (unsigned)geteuid());
        for (size_t i = 0; uid[i]; i++)
                snprintf(hex + 2 * i, 3, "%02x", (unsigned char)uid[i]);
        int k = snprintf(line, sizeof line, "%cAUTH EXTERNAL %s\r\n", 0, hex);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || send(fd, line, (size_t)k, MSG_NOSIGNAL) != k ||
            recv(fd, reply, sizeof reply, 0) < 3 || strncmp(reply, "OK ", 3) ||
            send(fd, "BEGIN\r\n", 7, MSG_NOSIGNAL) != 7) {
                close(fd);
                return -1;
        }
        return fd;
}

/* A node that serves its control socket, <dir>/state-a.sock. */
static void start_control_node(Proc *p, const char *dir, char sock[128]) {
        start_trained_node(p, dir, test_free_port());
        snprintf(sock, 128, "%s/state-a.sock", dir);
}

/* The node's methods take no arguments: a client that announces a message
 * far over BUS_MAX_MESSAGE is dropped once the message's header says so,
 * and none of its body is kept (sd-bus buffered it, up to 128 MiB per
 * connection, for as long as the client liked: four connections of any
 * local user pinned half a GiB). The others are served meanwhile. */
Test(daemon, the_control_socket_drops_a_client_that_announces_a_huge_message, .timeout = 180) {
        char dir[] = "/tmp/ravnest-test-ctl-XXXXXX", sock[128], cmd[512];
        cr_assert_not_null(mkdtemp(dir));
        Proc p;
        start_control_node(&p, dir, sock);
        long before = proc_peak_rss_kib(p.pid);

        int fd = control_connect(sock);
        cr_assert_geq(fd, 0, "not answered OK: %s", p.out);
        /* a method call's fixed header: 120 MiB of body to come, no fields */
        uint8_t header[16] = { 'l', 1, 0, 1 };
        uint32_t body = htole32(120u << 20), serial = htole32(1);
        memcpy(header + 4, &body, sizeof body);
        memcpy(header + 8, &serial, sizeof serial);
        cr_assert_eq(send(fd, header, sizeof header, MSG_NOSIGNAL), (ssize_t)sizeof header);
        static char chunk[1 << 20];
        size_t sent = 0;
        while (sent < 64u << 20) {
                ssize_t k = send(fd, chunk, sizeof chunk, MSG_NOSIGNAL);
                if (k <= 0)
                        break;
                sent += (size_t)k;
        }
        snprintf(cmd, sizeof cmd, "timeout 20 %s status --socket %s > /dev/null", RAVNESTCTL, sock);
        cr_assert_eq(system(cmd), 0, "status while the client holds its connection");

        char c;
        errno = 0;
        ssize_t k = recv(fd, &c, 1, 0);
        cr_assert(k == 0 || (k < 0 && errno == ECONNRESET), "the client was not dropped (%zd, %s) after %zu MiB",
                  k, strerror(errno), sent >> 20);
        close(fd);
        cr_assert(proc_wait_for(&p, "announced a message of 125829136 bytes", 10000), "%s", p.out);
        long after = proc_peak_rss_kib(p.pid);
        cr_log_info("%zu MiB sent before the drop; the node's peak RSS %ld KiB, then %ld KiB", sent >> 20, before,
                    after);
        cr_assert_lt(after - before, 16 * 1024, "the node's peak RSS grew from %ld to %ld KiB", before, after);
        cr_assert_eq(system(cmd), 0, "status after the drop");

        stop_cleanly_and_remove(&p, dir);
}

/* Another user's calls to Pause are refused (the node tells callers apart
 * by the socket, sd-bus reading their messages from a pipe), as often as it
 * makes them, and a burst of them logged, then a summary; root's is done. */
Test(daemon, the_control_socket_refuses_another_user_with_a_burst_of_lines_and_serves_root, .timeout = 180) {
        if (geteuid() != 0)
                cr_skip_test("SKIP: needs root (a second user to be refused)");
        char dir[] = "/tmp/ravnest-test-ctl-XXXXXX", sock[128], cmd[512];
        cr_assert_not_null(mkdtemp(dir));
        cr_assert_eq(chmod(dir, 0755), 0);
        Proc p;
        start_control_node(&p, dir, sock);

        enum { CALLS = 300 };
        int refused = -1, pipefd[2];
        cr_assert_eq(pipe(pipefd), 0);
        pid_t child = fork();
        if (child == 0) {
                sd_bus *bus = NULL;
                bool direct;
                int n = 0;
                if (setgid(65534) < 0 || setuid(65534) < 0 || bus_connect_node(sock, true, &bus, &direct) < 0)
                        _exit(2);
                for (int i = 0; i < CALLS; i++) {
                        sd_bus_error error = SD_BUS_ERROR_NULL;
                        if (sd_bus_call_method(bus, NULL, BUS_PATH, BUS_INTERFACE, "Pause", &error, NULL, "") < 0 &&
                            sd_bus_error_has_name(&error, SD_BUS_ERROR_ACCESS_DENIED))
                                n++;
                        sd_bus_error_free(&error);
                }
                (void)!write(pipefd[1], &n, sizeof n);
                _exit(0);
        }
        cr_assert_eq(read(pipefd[0], &refused, sizeof refused), (ssize_t)sizeof refused);
        waitpid(child, NULL, 0);
        close(pipefd[0]);
        close(pipefd[1]);
        cr_assert_eq(refused, CALLS, "%d of %d calls refused", refused, CALLS);
        rate_limited_lines(&p, "Refused pause from uid 65534", "Refused calls from uid 65534", CALLS);

        snprintf(cmd, sizeof cmd, "timeout 20 %s pause --socket %s > /dev/null", RAVNESTCTL, sock);
        cr_assert_eq(system(cmd), 0, "root's pause");
        cr_assert(proc_wait_for(&p, "Pause requested by uid 0", 10000), "%s", p.out);
        snprintf(cmd, sizeof cmd, "timeout 20 %s resume --socket %s > /dev/null", RAVNESTCTL, sock);
        cr_assert_eq(system(cmd), 0, "root's resume");
        stop_cleanly_and_remove(&p, dir);
}

/* ---- the state directory ------------------------------------------------- */

/* A state directory that is not one is refused by --check-config and at the
 * start, naming file, line and setting; a trained job whose last checkpoint
 * cannot be written (a directory stands where it goes) fails: its one
 * product is lost, and the exit status says so. */
Test(daemon, an_unusable_state_directory_is_refused_and_an_unsaved_model_fails, .timeout = 180) {
        char dir[] = "/tmp/ravnest-test-state-XXXXXX", conf[256], text[512], path[320], want[768];
        make_tiny_dir(dir);
        snprintf(path, sizeof path, "%s/not-a-dir", dir);
        test_write_file(path, "", 0644);
        snprintf(conf, sizeof conf, "%s/n.conf", dir);
        snprintf(text, sizeof text, "control_socket = \"\";\nstate_directory = \"%s\";\nidle = { enabled = false; };\n",
                 path);
        test_write_file(conf, text, 0644);
        snprintf(want, sizeof want, "%s:2: state_directory: %s is not a directory", conf, path);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--check-config", "--config", conf, "--job",
                                   SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--data-dir", dir, NULL }, child_setup);
        int code = proc_exit(&p);
        cr_assert_eq(code, 78, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, want), "%s", p.out);
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                   "--data-dir", dir, "--progress", "0", NULL }, child_setup);
        code = proc_exit(&p);
        cr_assert_eq(code, 78, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, want), "%s", p.out);

        /* not loaded, so not kept aside (.refused): the directory stays in the way */
        snprintf(text, sizeof text, "control_socket = \"\";\nstate_directory = \"%s/state\";\nidle = { enabled = false; };\n"
                 "checkpoint = { load = false; };\n", dir);
        test_write_file(conf, text, 0644);
        snprintf(path, sizeof path, "%s/state", dir);
        cr_assert_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof path, "%s/state/fashion-mnist-mlp.layers-0-6.ckpt", dir);
        cr_assert_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof path, "%s/state/fashion-mnist-mlp.layers-0-6.ckpt/in-the-way", dir);
        test_write_file(path, "", 0644);
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                   "--data-dir", dir, "--epochs", "1", "--progress", "0", NULL }, child_setup);
        code = proc_exit(&p);
        cr_assert_eq(code, 1, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "as training ends (there is no earlier one)"), "%s", p.out);
        cr_assert(strstr(p.out, "Finished fashion-mnist-mlp, but the trained model was not saved"), "%s", p.out);
        cr_assert_null(strstr(p.out, "training goes on"), "%s", p.out);
        test_remove_tree(dir);
}

/* A run without a configuration file has no state directory: ravnestctl
 * checkpoint says so (it said "Operation not supported"). */
Test(daemon, a_run_without_a_configuration_says_why_it_writes_no_checkpoint, .timeout = 120) {
        char dir[] = "/tmp/ravnest-test-noconf-XXXXXX", sock[128];
        make_tiny_dir(dir);
        snprintf(sock, sizeof sock, "%s/n.sock", dir);
        Proc p, c;
        proc_start(&p, (char *[]){ RAVNESTD, "--no-idle", "--control-socket", sock, "--job",
                                   SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--data-dir", dir, "--epochs",
                                   "100000", "--progress", "0", NULL }, child_setup);
        cr_assert(proc_wait_for(&p, "<6>Training fashion-mnist-mlp", 60000), "%s", p.out);
        proc_start(&c, (char *[]){ RAVNESTCTL, "checkpoint", "--socket", sock, NULL }, NULL);
        int code = proc_exit(&c);
        cr_assert_eq(code, 1, "exit %d: %s", code, c.out);
        cr_assert(strstr(c.out, "a run without a configuration file has no state directory to write to"), "%s", c.out);
        stop_cleanly_and_remove(&p, dir);
}

/* A reload that starts training waits for its listen address (taken); the
 * status meanwhile names the job being started (it read "Job: , "), and a
 * SIGTERM then stops the node cleanly (it exited 1). */
Test(daemon, a_stop_while_a_reload_starts_is_clean, .timeout = 120) {
        char dir[] = "/tmp/ravnest-test-starting-XXXXXX", path[256], conf[256], sock[256];
        make_tiny_dir(dir);
        write_secret(dir, path);
        snprintf(sock, sizeof sock, "%s/ctl", dir);
        uint16_t port;
        int held = hold_port(&port);
        node_file(dir, 0, 0, conf);
        Proc p, st;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--data-dir", dir, "--progress", "0", NULL }, NULL);
        cr_assert(proc_wait_for(&p, "unconfigured", 30000), "%s", p.out);
        node_file(dir, port, 0, conf);
        cr_assert_eq(kill(p.pid, SIGHUP), 0);
        bool starting = false;
        for (int i = 0; i < 100 && !starting && !strstr(p.out, "unconfigured again"); i++) {
                proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--socket", sock, NULL }, NULL);
                cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
                starting = strstr(st.out, "State: starting");
                proc_wait_for(&p, "unconfigured again", 50);
        }
        if (!starting) {
                kill(p.pid, SIGTERM);
                proc_exit(&p);
                close(held);
                test_remove_tree(dir);
                cr_skip_test("SKIP: the node left \"starting\" before the test saw it (a loaded machine)");
        }
        cr_assert(strstr(st.out, "Job: fashion-mnist-mlp, standalone"), "%s", st.out);
        cr_assert_eq(kill(p.pid, SIGTERM), 0);
        int code = proc_exit(&p);
        close(held);
        cr_assert_eq(code, 0, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "stopped cleanly"), "%s", p.out);
        test_remove_tree(dir);
}

/* What a mistyped control_socket names is somebody's: a file there is left
 * as it was (the daemon replaced it with its socket and removed that at the
 * end); a reload with several errors says them all on one line of the log
 * and of the status (the second one lost its priority prefix); and
 * --check-job with --check-config checks the job even where an
 * unconfigured node would load none. */
Test(daemon, a_file_at_the_control_socket_path_is_kept_and_a_failed_reload_is_one_line, .timeout = 120) {
        char dir[] = "/tmp/ravnest-test-ctlfile-XXXXXX", conf[256], keep[256], sock[256], text[256];
        make_tiny_dir(dir);
        node_file(dir, 0, 0, conf);
        snprintf(keep, sizeof keep, "%s/precious", dir);
        test_write_file(keep, "keep me\n", 0644);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--control-socket", keep, "--progress", "0", NULL },
                   NULL);
        cr_assert(proc_wait_for(&p, "is there and is not a socket", 30000), "%s", p.out);
        cr_assert(proc_wait_for(&p, "unconfigured", 30000), "%s", p.out);
        cr_assert_eq(kill(p.pid, SIGTERM), 0);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        FILE *f = fopen(keep, "r");
        cr_assert(f && fgets(text, sizeof text, f), "%s is gone", keep);
        fclose(f);
        cr_assert_str_eq(text, "keep me\n");

        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--progress", "0", NULL }, NULL);
        cr_assert(proc_wait_for(&p, "unconfigured", 30000), "%s", p.out);
        FILE *c = fopen(conf, "a");
        cr_assert(c);
        fputs("threads = \"x\";\nbogus = 1;\n", c);
        fclose(c);
        cr_assert_eq(kill(p.pid, SIGHUP), 0);
        cr_assert(proc_wait_for(&p, "Reloading failed", 30000), "%s", p.out);
        const char *line = strstr(p.out, "Reloading failed");
        const char *end = strchr(line, '\n');
        cr_assert(end, "%s", p.out);
        char *one = strndup(line, (size_t)(end - line));
        cr_expect(strstr(one, "threads") && strstr(one, "bogus: unknown setting"), "not one line: %s", p.out);
        free(one);
        snprintf(sock, sizeof sock, "%s/ctl", dir);
        Proc st;
        proc_start(&st, (char *[]){ RAVNESTCTL, "status", "--socket", sock, NULL }, NULL);
        cr_assert_eq(proc_exit(&st), 0, "%s", st.out);
        const char *reload = strstr(st.out, "Reload: failed");
        cr_assert(reload, "%s", st.out);
        end = strchr(reload, '\n');
        cr_expect(end && memmem(reload, (size_t)(end - reload), "bogus", 5), "not one line: %s", st.out);
        cr_assert_eq(kill(p.pid, SIGTERM), 0);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);

        /* the node is unconfigured: --check-config alone loads no job, --check-job does */
        if (access(JOBS_DIR "/fashion-mnist-mlp.job", F_OK) == 0) { /* the default job: installed here */
                cr_log_warn("SKIP: %s is installed: no missing default job to check", JOBS_DIR);
                test_remove_tree(dir);
                return;
        }
        snprintf(text, sizeof text, "state_directory = \"%s/state\";\n", dir);
        test_write_file(conf, text, 0644);
        proc_start(&p, (char *[]){ RAVNESTD, "--check-config", "--config", conf, NULL }, NULL);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "loads no job"), "%s", p.out);
        proc_start(&p, (char *[]){ RAVNESTD, "--check-config", "--check-job", "--config", conf, NULL }, NULL);
        int code = proc_exit(&p);
        cr_assert_eq(code, 78, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, JOBS_DIR "/fashion-mnist-mlp.job"), "%s", p.out);
        test_remove_tree(dir);
}

/* A job that needs more memory than the machine has available is refused
 * before its model is allocated, saying how much it needs (the parameters
 * were allocated and zeroed, page by page, until the kernel or the OOM
 * killer said no). The model: layers of 2^28 parameters, enough of them
 * for twice the memory available now. */
Test(daemon, a_job_larger_than_the_memory_available_is_refused_before_it_is_allocated, .timeout = 120) {
        uint64_t avail;
        cr_assert_eq(capability_memory(0, NULL, &avail), 0);
        int big = (int)(2 * avail / (2ull << 30)) + 2; /* at least 8 bytes a parameter: 2 GiB a layer */
        if (big > MODEL_MAX_LAYERS - 4)
                cr_skip_test("SKIP: %.0f GiB available: no model of at most %d layers needs twice that",
                             (double)avail / (1 << 30), MODEL_MAX_LAYERS);
        char dir[] = "/tmp/ravnest-test-mem-XXXXXX", job[256];
        static char layers[16384];
        size_t k = 0;
        for (int i = 0; i < big; i++)
                k += (size_t)snprintf(layers + k, sizeof layers - k, "{ type = \"linear\"; out = %d; }, ",
                                      i % 2 ? 16383 : 16384);
        snprintf(layers + k, sizeof layers - k, "{ type = \"linear\"; out = 10; }");
        make_tiny_dir(dir);
        snprintf(job, sizeof job, "%s/big.job", dir);
        static char text[20000];
        snprintf(text, sizeof text,
                 "name = \"big\";\ndataset = { name = \"fashion-mnist\"; };\n"
                 "model = { input = [1, 28, 28]; layers = ( { type = \"flatten\"; },\n  %s ); };\n"
                 "optimizer = { type = \"sgd\"; lr = 0.01; };\ntraining = { batch_size = 8; epochs = 1; };\n",
                 layers);
        test_write_file(job, text, 0644);
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--job", job, "--data-dir", dir, "--control-socket", "none", "--no-idle",
                                   "--threads", "1", NULL }, child_setup);
        int code = proc_exit(&p);
        test_remove_tree(dir);
        cr_assert_eq(code, 1, "exit %d: %s", code, p.out);
        cr_assert(strstr(p.out, "<3>Job big needs ") && strstr(p.out, " MiB available"), "%s", p.out);
}
