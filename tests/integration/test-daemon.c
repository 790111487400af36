/* ravnestd as a real process: job checks, clean stop on SIGTERM and SIGINT,
 * clear errors for a broken dataset. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct Proc {
        pid_t pid;
        int err; /* read end of the child's stderr */
        char out[16384];
        size_t len;
} Proc;

static void proc_start(Proc *p, char *const argv[]) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        p->len = 0;
        p->out[0] = 0;
        p->pid = fork();
        cr_assert(p->pid >= 0);
        if (p->pid == 0) {
                dup2(fds[1], STDERR_FILENO);
                dup2(fds[1], STDOUT_FILENO);
                close(fds[0]);
                close(fds[1]);
                execv(argv[0], argv);
                _exit(127);
        }
        close(fds[1]);
        p->err = fds[0];
}

/* Read output until it contains what (or EOF, or timeout). */
static bool proc_wait_for(Proc *p, const char *what, int timeout_ms) {
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        while (!what || !strstr(p->out, what)) {
                clock_gettime(CLOCK_MONOTONIC, &now);
                int left = timeout_ms - (int)((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000);
                if (left <= 0)
                        return false;
                struct pollfd pfd = { p->err, POLLIN, 0 };
                if (poll(&pfd, 1, left) <= 0)
                        return false;
                ssize_t n = read(p->err, p->out + p->len, sizeof p->out - 1 - p->len);
                if (n <= 0)
                        return what == NULL;
                p->len += (size_t)n;
                p->out[p->len] = 0;
        }
        return true;
}

static int proc_exit(Proc *p) {
        proc_wait_for(p, NULL, 120000);
        int status;
        cr_assert_eq(waitpid(p->pid, &status, 0), p->pid);
        close(p->err);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void skip_without_dataset(void) {
        if (access(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist to run this test", FASHION_MNIST_DIR);
}

Test(daemon, check_job_ok_and_broken) {
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--check-job", "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", NULL });
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        cr_assert(strstr(p.out, "OK: 6 layers, 1863690 parameters"), "%s", p.out);

        char path[] = "/tmp/ravnest-test-daemon-XXXXXX";
        int fd = mkstemp(path);
        const char *bad = "name = \"x\";\ndataset = { name = \"fashion-mnist\"; };\nmodel = { input = [1, 28, 28];\n"
                          "  layers = ( { type = \"flatten\"; }, { type = \"linear\"; out = 10; } ); };\n"
                          "optimizer = { type = \"sgd\"; lr = 0.1; warp = 9; };\ntraining = { batch_size = 8; epochs = 1; };\n";
        cr_assert_eq(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
        close(fd);
        proc_start(&p, (char *[]){ RAVNESTD, "--check-job", "--job", path, NULL });
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
        proc_start(&p, (char *[]){ RAVNESTD, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--progress", "200", NULL });
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
        Proc p;
        proc_start(&p, (char *[]){ RAVNESTD, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", "--data-dir", dir, NULL });
        int code = proc_exit(&p);
        unlink(path);
        rmdir(dir);
        cr_assert_eq(code, 1, "exit %d: %s", code, p.out);
        char want[192];
        snprintf(want, sizeof want, "%s: bad magic", path);
        cr_assert(strstr(p.out, want), "%s", p.out);
}
