/* tests/lib/proc.c — see proc.h. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"
#include "util/rng.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


void proc_start(Proc *p, char *const argv[], void (*setup)(void)) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        p->len = 0;
        p->out[0] = 0;
        snprintf(p->exe, sizeof p->exe, "%s", argv[0]);
        p->pid = fork();
        cr_assert(p->pid >= 0);
        if (p->pid == 0) {
                dup2(fds[1], STDERR_FILENO);
                dup2(fds[1], STDOUT_FILENO);
                close(fds[0]);
                close(fds[1]);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                /* the test runner's blocked and ignored signals are not the child's */
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                signal(SIGINT, SIG_DFL);
                signal(SIGTERM, SIG_DFL);
                setrlimit(RLIMIT_CORE, &(struct rlimit){ RLIM_INFINITY, RLIM_INFINITY });
                if (setup)
                        setup();
                execv(argv[0], argv);
                _exit(127);
        }
        close(fds[1]);
        p->err = fds[0];
}

bool proc_wait_for(Proc *p, const char *what, int timeout_ms) {
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
                if (p->len == sizeof p->out - 1) { /* full: keep the second half */
                        memmove(p->out, p->out + sizeof p->out / 2, sizeof p->out / 2);
                        p->len -= sizeof p->out / 2;
                }
                ssize_t n = read(p->err, p->out + p->len, sizeof p->out - 1 - p->len);
                if (n <= 0)
                        return what == NULL;
                p->len += (size_t)n;
                p->out[p->len] = 0;
        }
        return true;
}

bool proc_wait_for_count(Proc *p, const char *what, int want, int timeout_ms) {
        for (int t = 0; t < timeout_ms / 100 && test_count(p->out, what) < want; t++)
                (void)proc_wait_for(p, "\x01", 100);
        return test_count(p->out, what) >= want;
}

int proc_exit(Proc *p) {
        return proc_exit_within(p, 120000);
}

/* A crash's backtrace, from the core the child left in the working
 * directory ("core" or "core.PID"), which is then removed. */
static void print_backtrace(const Proc *p) {
        char core[64], cmd[512];
        snprintf(core, sizeof core, "core.%d", (int)p->pid);
        if (access(core, R_OK) < 0)
                snprintf(core, sizeof core, "core");
        if (access(core, R_OK) < 0) {
                fprintf(stderr, "proc: no core of pid %d here (see /proc/sys/kernel/core_pattern)\n", (int)p->pid);
                return;
        }
        snprintf(cmd, sizeof cmd, "gdb -q -batch -ex 'thread apply all bt 24' '%s' '%s' >&2 2>&1", p->exe, core);
        if (system(cmd) != 0)
                fprintf(stderr, "proc: gdb could not read %s of %s\n", core, p->exe);
        unlink(core);
}

static void report_signal(Proc *p, int status) {
        int sig = WTERMSIG(status);
        size_t room = sizeof p->out - 1 - p->len;
        int n = snprintf(p->out + p->len, room + 1, "\n[proc: %s (pid %d) ended by signal %d (%s)%s]\n", p->exe,
                         (int)p->pid, sig, strsignal(sig), WCOREDUMP(status) ? ", core dumped" : "");
        p->len += MIN((size_t)MAX(n, 0), room);
        if (WCOREDUMP(status))
                print_backtrace(p);
}

/* A child still running after timeout_ms is asked to stop (SIGTERM), then
 * killed 10 s later, so the test fails with its output instead of hanging. */
int proc_exit_within(Proc *p, int timeout_ms) {
        int status;
        pid_t done = 0;
        if (!proc_wait_for(p, NULL, timeout_ms) && (done = waitpid(p->pid, &status, WNOHANG)) == 0) {
                fprintf(stderr, "proc: pid %d still running after %d ms: stopping it\n", (int)p->pid, timeout_ms);
                kill(p->pid, SIGTERM);
                if (!proc_wait_for(p, NULL, 10000))
                        kill(p->pid, SIGKILL);
        }
        if (done != p->pid)
                cr_assert_eq(waitpid(p->pid, &status, 0), p->pid);
        close(p->err);
        if (WIFSIGNALED(status))
                report_signal(p, status);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A port free now, below the kernel's ephemeral range (32768 and up here):
 * one the kernel handed out for binding to port 0 could be given next to
 * an outgoing connection of another test before the daemon binds it, and
 * stay taken as long as that connection lives. */
static bool given_before(unsigned short port) {
        static unsigned short given[256];
        static unsigned n;
        for (unsigned i = 0; i < n && i < 256; i++)
                if (given[i] == port)
                        return true;
        given[n++ % 256] = port;
        return false;
}

unsigned short test_free_port(void) {
        static Rng rng;
        static bool seeded;
        if (!seeded) /* another port sequence in every test process */
                rng_seed(&rng, (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL), RNG_STREAM_TEST);
        seeded = true;
        for (int tries = 0; tries < 1000; tries++) {
                unsigned short port = (unsigned short)(20000 + rng_below(&rng, 12000));
                if (given_before(port)) /* not yet bound by whoever asked for it */
                        continue;
                int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                          .sin_port = htons(port) };
                cr_assert(fd >= 0);
                int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
                close(fd);
                if (r == 0)
                        return port;
        }
        cr_assert_fail("no free port in 20000-31999");
        return 0;
}

void test_start_unconfigured(Proc *p, const char *path, char *dir, char sock[128]) {
        char conf[128], text[512];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(conf, sizeof conf, "%s/u.conf", dir);
        snprintf(sock, 128, "%s/ctl", dir);
        snprintf(text, sizeof text, "state_directory = \"%s/state\";\ncontrol_socket = \"%s\";\n", dir, sock);
        test_write_file(conf, text, 0644);
        proc_start(p, (char *[]){ (char *)path, "--config", conf, NULL }, NULL);
        cr_assert(proc_wait_for(p, "unconfigured", 30000), "%s", p->out);
}

int test_connect_port(unsigned short port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                  .sin_port = htons(port) };
        cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect to port %u: %s", port,
                  strerror(errno));
        return fd;
}

long proc_peak_rss_kib(pid_t pid) {
        char path[64], line[256];
        long kib = -1;
        snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
                if (strncmp(line, "VmHWM:", 6) == 0)
                        kib = strtol(line + 6, NULL, 10);
        if (f)
                fclose(f);
        return kib;
}

void test_write_file(const char *path, const char *text, mode_t mode) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f, "%s", path);
        fputs(text, f);
        fclose(f);
        chmod(path, mode);
}

void test_make_identity(const char *dir, const char *name, char hex[IDENTITY_HEX_SIZE]) {
        char path[300];
        Identity id;
        bool created;
        Diag d = {};
        snprintf(path, sizeof path, "%s/state-%s", dir, name);
        mkdir(path, 0700);
        snprintf(path, sizeof path, "%s/state-%s/identity", dir, name);
        cr_assert_eq(identity_load_or_create(path, &id, &created, &d), 0, "%s", d.text);
        identity_to_hex(id.pk, hex);
}

double test_final_accuracy(const char *out) {
        const char *p = strstr(out, "test accuracy ");
        return p ? strtod(p + 14, NULL) : -1;
}

void test_remove_tree(const char *dir) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        (void)!system(cmd);
}

int test_count(const char *s, const char *what) {
        int n = 0;
        for (; (s = strstr(s, what)); s++)
                n++;
        return n;
}
