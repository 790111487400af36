/* The metrics endpoint of a real ravnestd training Fashion-MNIST: what
 * /metrics and / answer, what they refuse (other methods, huge headers, more
 * connections than allowed, clients that say nothing), a flood of requests,
 * and the real consumers: promtool, a Prometheus server scraping the node,
 * headless Chromium rendering the page. Each consumer's test skips, naming
 * the Debian package, when it is not installed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../lib/data.h"
#include "../lib/proc.h"

#define MAX_CONNECTIONS 4
#define TIMEOUT_S 2

typedef struct Node {
        Proc p;
        char dir[64];
        uint16_t port;
} Node;

static void skip_without_dataset(void) {
        if (access(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist to run this test", FASHION_MNIST_DIR);
}

/* Where program is on PATH, in ret; false when it is not. */
static bool which(const char *program, char *ret, size_t len) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "command -v %s 2>/dev/null", program);
        FILE *f = popen(cmd, "r");
        bool found = f && fgets(ret, (int)len, f) && ret[0] == '/';
        if (f)
                pclose(f);
        ret[strcspn(ret, "\n")] = '\0';
        return found;
}

static bool have(const char *program) {
        char path[256];
        return which(program, path, sizeof path);
}

/* A standalone node training for long enough, with metrics on loopback that
 * close a connection after timeout_s seconds without a whole request. */
static void node_start_timeout(Node *n, int timeout_s) {
        char conf[128], text[1024];
        skip_without_dataset();
        snprintf(n->dir, sizeof n->dir, "/tmp/ravnest-test-metrics-XXXXXX");
        cr_assert_not_null(mkdtemp(n->dir));
        n->port = test_free_port();
        snprintf(conf, sizeof conf, "%s/ravnestd.conf", n->dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state\";\ncontrol_socket = \"\";\nidle = { enabled = false; };\nthreads = 1;\n"
                 "metrics = {\n  listen = \"127.0.0.1:%u\";\n  max_connections = %d;\n  timeout = %d;\n};\n",
                 n->dir, n->port, MAX_CONNECTIONS, timeout_s);
        test_write_file(conf, text, 0644);
        proc_start(&n->p, (char *[]){ RAVNESTD, "--config", conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                      "--epochs", "100", "--progress", "500", NULL }, NULL);
        cr_assert(proc_wait_for(&n->p, "Serving metrics", 30000), "%s", n->p.out);
        cr_assert(proc_wait_for(&n->p, "step ", 60000), "no progress: %s", n->p.out);
        usleep(1500 * 1000); /* a publication after the first progress report */
}

static void node_start(Node *n) {
        node_start_timeout(n, TIMEOUT_S);
}

static void node_stop(Node *n) {
        char cmd[128];
        kill(n->p.pid, SIGTERM);
        cr_assert_eq(proc_exit(&n->p), 0, "%s", n->p.out);
        cr_assert(!strstr(n->p.out, "<3>"), "errors: %s", n->p.out);
        snprintf(cmd, sizeof cmd, "rm -rf %s", n->dir);
        cr_assert_eq(system(cmd), 0);
}

static int dial(uint16_t port) {
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        struct timeval tv = { .tv_sec = 10 };
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        cr_assert_geq(fd, 0);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
        return fd;
}

/* Send request as it is, read until the server closes; the status code, 0
 * when the server closed without an answer. out gets the whole answer. */
static int http_raw(uint16_t port, const char *request, size_t request_len, char *out, size_t len) {
        int fd = dial(port);
        size_t k = 0;
        (void)!send(fd, request, request_len, MSG_NOSIGNAL);
        if (!strstr(request, "Connection: close")) /* nothing more comes: no waiting for the idle timeout */
                shutdown(fd, SHUT_WR);
        for (ssize_t r; k + 1 < len && (r = recv(fd, out + k, len - 1 - k, 0)) > 0;)
                k += (size_t)r;
        out[k] = '\0';
        close(fd);
        int code = 0;
        return sscanf(out, "HTTP/1.%*d %d", &code) == 1 ? code : 0;
}

static int http(uint16_t port, const char *method, const char *path, char *out, size_t len) {
        char req[256];
        int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", method, path);
        return http_raw(port, req, (size_t)n, out, len);
}

/* The value of the sample that starts with name (and its labels) in the
 * body of an answer; NAN when absent. */
static double metric(const char *text, const char *name) {
        char want[160];
        snprintf(want, sizeof want, "\n%s ", name);
        const char *at = strstr(text, want);
        return at ? strtod(at + strlen(want), NULL) : NAN;
}

static const char *body(const char *answer) {
        const char *b = strstr(answer, "\r\n\r\n");
        return b ? b + 4 : "";
}

static char answer[1 << 20];

Test(metrics, answers_and_refuses, .timeout = 180) {
        Node n;
        node_start(&n);

        cr_assert_eq(http(n.port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        cr_assert(strstr(answer, "Content-Type: text/plain; version=0.0.4"), "%s", answer);
        const char *b = body(answer);
        cr_assert(strstr(b, "# TYPE ravnest_training_loss gauge\n"), "%s", b);
        cr_assert(strstr(b, "ravnest_state{state=\"training\"} 1\n"), "%s", b);
        /* not "job": Prometheus keeps that label for its scrape job (and
         * renamed ours exported_job) */
        cr_assert(strstr(b, "ravnest_node_info{training_job=\"fashion-mnist-mlp\""), "%s", b);
        double loss = metric(b, "ravnest_training_loss"), steps = metric(b, "ravnest_steps_total");
        cr_assert(loss > 0 && loss < 10, "loss %g: %s", loss, b);
        cr_assert_gt(steps, 0, "%s", b);
        cr_assert_gt(metric(b, "ravnest_samples_per_second"), 0, "%s", b);
        cr_assert_gt(metric(b, "process_resident_memory_bytes"), 1 << 20, "%s", b);

        cr_assert_eq(http(n.port, "HEAD", "/metrics", answer, sizeof answer), 200, "%s", answer);
        cr_assert_str_eq(body(answer), "", "HEAD has no body");
        cr_assert_eq(http(n.port, "GET", "/", answer, sizeof answer), 200, "%s", answer);
        cr_assert(strstr(answer, "Content-Type: text/html"), "%s", answer);
        cr_assert(strstr(answer, "fashion-mnist-mlp") && strstr(answer, "<svg"), "%s", answer);
        cr_assert_eq(http(n.port, "GET", "/nothing", answer, sizeof answer), 404, "%s", answer);
        /* a target's %XX decoded, but a NUL in it is not the end of the path */
        cr_assert_eq(http(n.port, "GET", "/%6detrics", answer, sizeof answer), 200, "%s", answer);
        cr_assert_eq(http(n.port, "GET", "/%00", answer, sizeof answer), 404, "%s", answer);
        cr_assert_eq(http(n.port, "GET", "/%00%ff", answer, sizeof answer), 404, "%s", answer);
        const char *no_host = "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n";
        cr_assert_eq(http_raw(n.port, no_host, strlen(no_host), answer, sizeof answer), 400, "HTTP/1.1 without Host: %s",
                     answer);
        const char *two_hosts = "GET /metrics HTTP/1.1\r\nHost: x\r\nHost: y\r\nConnection: close\r\n\r\n";
        cr_assert_eq(http_raw(n.port, two_hosts, strlen(two_hosts), answer, sizeof answer), 400, "two Hosts: %s",
                     answer);
        const char *spaced = "GET /met rics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        int code = http_raw(n.port, spaced, strlen(spaced), answer, sizeof answer);
        cr_assert(code == 0 || code == 400, "a space in the target got %d: %s", code, answer);
        /* a target in the absolute form, as through a proxy */
        cr_assert_eq(http(n.port, "GET", "http://127.0.0.1/metrics", answer, sizeof answer), 200, "%s", answer);
        cr_assert(strstr(answer, "ravnest_steps_total"), "%s", answer);
        cr_assert_eq(http(n.port, "GET", "HTTP://localhost:9/", answer, sizeof answer), 200, "%s", answer);
        cr_assert_eq(http(n.port, "GET", "http://localhost/nothing", answer, sizeof answer), 404, "%s", answer);

        cr_assert_eq(http(n.port, "POST", "/metrics", answer, sizeof answer), 405, "%s", answer);
        cr_assert(strstr(answer, "Allow: GET, HEAD"), "%s", answer);
        cr_assert_eq(http(n.port, "DELETE", "/", answer, sizeof answer), 405, "%s", answer);
        const char *post = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
        cr_assert_eq(http_raw(n.port, post, strlen(post), answer, sizeof answer), 405, "%s", answer);

        /* a header past the connection's memory: refused (431) or dropped, never served */
        static char huge[256 * 1024];
        int k = snprintf(huge, sizeof huge, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
        memset(huge + k, 'a', sizeof huge - (size_t)k - 8);
        memcpy(huge + sizeof huge - 8, "\r\n\r\n", 4);
        code = http_raw(n.port, huge, sizeof huge - 4, answer, sizeof answer);
        cr_assert(code == 431 || code == 413 || code == 0, "a huge header got %d: %.200s", code, answer);
        cr_log_info("a header of %zu KiB: %d\n", sizeof huge / 1024, code);
        /* and the node still answers */
        cr_assert_eq(http(n.port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);

        /* one connection kept open for requests one after another (what
         * Prometheus does between scrapes), pipelined too */
        const char *three = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nHEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
                            "GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        cr_assert_eq(http_raw(n.port, three, strlen(three), answer, sizeof answer), 200, "%s", answer);
        const char *second = strstr(answer + 1, "HTTP/1.1 200"), *third = second ? strstr(second, "HTTP/1.1 404") : NULL;
        cr_assert(second && third, "three requests on one connection, not three answers: %.600s", answer);
        cr_assert_null(strstr(answer, "Connection: close\r\n\r\n# HELP"), "the first answer closed it");

        /* a second node on the same port fails to start, where it used to share the port */
        char conf[160];
        snprintf(conf, sizeof conf, "%s/ravnestd.conf", n.dir);
        Proc q;
        proc_start(&q, (char *[]){ RAVNESTD, "--config", conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                   "--epochs", "1", NULL }, NULL);
        cr_assert_neq(proc_exit(&q), 0, "a second node took the same metrics port:\n%s", q.out);
        cr_assert(strstr(q.out, "in use"), "%s", q.out);
        node_stop(&n);
}

static int run_ctl(Proc *p, char *const argv[]) {
        proc_start(p, argv, NULL);
        return proc_exit(p);
}

/* A node held to a quarter of the time (idle.max_duty) publishes the
 * samples it trains per second of the wall clock, rests included (it gave
 * the rate of its computing alone, four times that); paused, it publishes
 * no throughput and no busy fraction (it kept its last ones). */
Test(metrics, throughput_is_over_the_wall_clock_and_0_while_paused, .init = skip_without_dataset,
     .timeout = 180) {
        char dir[] = "/tmp/ravnest-test-rate-XXXXXX", conf[128], sock[128], text[1024];
        cr_assert_not_null(mkdtemp(dir));
        uint16_t port = test_free_port();
        snprintf(conf, sizeof conf, "%s/ravnestd.conf", dir);
        snprintf(sock, sizeof sock, "%s/ctl", dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state\";\ncontrol_socket = \"%s\";\n"
                 "idle = { enabled = false; max_duty = 0.25; };\nthreads = 1;\n"
                 "metrics = { listen = \"127.0.0.1:%u\"; };\n",
                 dir, sock, port);
        test_write_file(conf, text, 0644);
        Proc p, c;
        proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                   "--epochs", "100", NULL }, NULL);
        cr_assert(proc_wait_for(&p, "Serving metrics", 30000), "%s", p.out);
        sleep(3); /* past the first 2 s window */
        cr_assert_eq(http(port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        double steps0 = metric(body(answer), "ravnest_steps_total");
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        sleep(6);
        cr_assert_eq(http(port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double steps1 = metric(body(answer), "ravnest_steps_total"), published = metric(body(answer),
                                                                                       "ravnest_samples_per_second");
        double wall = (steps1 - steps0) * 128 / ((double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
        cr_log_info("published %.0f samples/s, the steps counted %.0f\n", published, wall);
        cr_assert(steps1 > steps0 && published > 0, "%g %g %g\n%s", steps0, steps1, published, p.out);
        cr_assert_lt(published, 2 * wall, "published %.0f samples/s where the node trained %.0f a second", published,
                     wall);

        setenv("RAVNEST_SOCKET", sock, 1);
        cr_assert_eq(run_ctl(&c, (char *[]){ RAVNESTCTL, "pause", NULL }), 0, "%s", c.out);
        sleep(3);
        cr_assert_eq(run_ctl(&c, (char *[]){ RAVNESTCTL, "status", "--json", NULL }), 0, "%s", c.out);
        cr_assert(strstr(c.out, "\"State\": \"paused\""), "%s", c.out);
        cr_assert(strstr(c.out, "\"SamplesPerSecond\": 0,") && strstr(c.out, "\"Busy\": 0,"), "%s", c.out);
        unsetenv("RAVNEST_SOCKET");
        cr_assert_eq(http(port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        cr_assert_eq(metric(body(answer), "ravnest_samples_per_second"), 0, "%s", body(answer));

        kill(p.pid, SIGTERM);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        snprintf(text, sizeof text, "rm -rf %s", dir);
        cr_assert_eq(system(text), 0);
}

/* A node started again on the checkpoint of the job it trained (a network
 * keeps it up once finished): it evaluates the job, publishes the test
 * accuracy and loss it logs, and epoch 1 of 1 (it said 2 of 1 and no
 * accuracy), and leaves the checkpoint as it was (it wrote it again). */
Test(metrics, a_trained_job_started_again_shows_its_result, .timeout = 180) {
        char dir[] = "/tmp/ravnest-test-trained-XXXXXX", conf[128], data[128], job[128], secret[128], text[1024];
        cr_assert_not_null(mkdtemp(dir));
        uint16_t port = test_free_port();
        snprintf(data, sizeof data, "%s/8x8", dir);
        snprintf(job, sizeof job, "%s/mlp.job", dir);
        test_write_idx_data(data, &(TestData){ .h = 8, .w = 8, .classes = 10, .n_train = 2000, .n_test = 500 });
        test_write_mlp_job(job, data, 8, 8, 10, 1);
        snprintf(secret, sizeof secret, "%s/secret", dir);
        test_write_file(secret, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
        snprintf(conf, sizeof conf, "%s/ravnestd.conf", dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state\";\ncontrol_socket = \"\";\nidle = { enabled = false; };\n"
                 "threads = 1;\nnetwork = { listen = \"127.0.0.1:%u\"; secret_file = \"%s\"; };\n"
                 "metrics = { listen = \"127.0.0.1:%u\"; };\n",
                 dir, test_free_port(), secret, port);
        test_write_file(conf, text, 0644);
        Proc p;
        for (int run = 0; run < 2; run++) {
                proc_start(&p, (char *[]){ RAVNESTD, "--config", conf, "--job", job, NULL }, NULL);
                cr_assert(proc_wait_for(&p, "Finished ", 60000), "run %d: %s", run, p.out);
                if (run == 0) {
                        kill(p.pid, SIGTERM);
                        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
                }
        }
        cr_assert(strstr(p.out, "The checkpoint holds the trained job"), "%s", p.out);
        const char *acc = strstr(p.out, "test accuracy ");
        cr_assert(acc, "%s", p.out);
        double logged = strtod(acc + strlen("test accuracy "), NULL) / 100;
        usleep(1500 * 1000); /* published within a second */
        cr_assert_eq(http(port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        cr_assert_eq(metric(body(answer), "ravnest_epoch"), 1, "%s", body(answer));
        cr_assert_eq(metric(body(answer), "ravnest_epochs"), 1, "%s", body(answer));
        double published = metric(body(answer), "ravnest_test_accuracy_ratio");
        cr_assert(fabs(published - logged) < 1e-4, "published %g, logged %g\n%s", published, logged, body(answer));
        cr_assert(metric(body(answer), "ravnest_test_loss") > 0, "%s", body(answer));
        cr_assert_null(strstr(p.out, "Checkpoint written"), "the checkpoint was written again\n%s", p.out);
        kill(p.pid, SIGTERM);
        cr_assert_eq(proc_exit(&p), 0, "%s", p.out);
        snprintf(text, sizeof text, "rm -rf %s", dir);
        cr_assert_eq(system(text), 0);
}

/* max_connections + 5 clients that connect and say nothing: the endpoint
 * holds at most max_connections, closes them after the timeout, answers
 * again, and training never stopped. */
Test(metrics, slow_clients_time_out, .timeout = 180) {
        Node n;
        int fds[MAX_CONNECTIONS + 5];
        node_start(&n);
        cr_assert_eq(http(n.port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        double steps0 = metric(body(answer), "ravnest_steps_total");

        for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
                fds[i] = dial(n.port);
                (void)!send(fds[i], "GET /metr", 9, MSG_NOSIGNAL); /* and nothing more */
        }
        usleep((TIMEOUT_S * 1000 + 2000) * 1000);
        /* every one of them closed by the server: over the limit at once, the others idle */
        for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
                char c;
                ssize_t r = recv(fds[i], &c, 1, 0);
                cr_assert(r == 0 || (r < 0 && errno == ECONNRESET), "connection %zu still open (%zd, %s)", i, r,
                          strerror(errno));
                close(fds[i]);
        }
        cr_assert_eq(http(n.port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        double steps1 = metric(body(answer), "ravnest_steps_total");
        cr_assert_gt(steps1, steps0, "training went on: %g then %g steps", steps0, steps1);

        /* clients that send a byte every 200 ms and never finish a request:
         * closed once a request has not come whole within the timeout,
         * though they were never idle that long */
        for (int i = 0; i < MAX_CONNECTIONS; i++) {
                fds[i] = dial(n.port);
                (void)!send(fds[i], "GET /metrics HTTP/1.1\r\n", 24, MSG_NOSIGNAL);
        }
        int open = MAX_CONNECTIONS;
        for (int t = 0; t < 5 * (TIMEOUT_S + 4) && open > 0; t++) {
                usleep(200 * 1000);
                open = 0;
                for (int i = 0; i < MAX_CONNECTIONS; i++)
                        open += fds[i] >= 0 && send(fds[i], "X", 1, MSG_NOSIGNAL) == 1;
        }
        cr_assert_eq(open, 0, "%d dripping connections still open after %d s", open, TIMEOUT_S + 4);
        for (int i = 0; i < MAX_CONNECTIONS; i++)
                close(fds[i]);
        cr_assert_eq(http(n.port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        node_stop(&n);
}

static long rss_kib(pid_t pid) {
        char path[64], line[256];
        long v = -1;
        snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
        FILE *f = fopen(path, "re");
        cr_assert_not_null(f);
        while (fgets(line, sizeof line, f))
                if (sscanf(line, "VmRSS: %ld", &v) == 1)
                        break;
        fclose(f);
        return v;
}

/* Clients that ask on a kept-alive connection and then half-close it (as
 * "curl --no-keepalive" does not, but shutdown(SHUT_WR) does), three times
 * as many as the places: each is answered and let go at once, its place
 * free for the next, with the timeout far away (a place held until the
 * timeout left the fifth client unanswered). */
Test(metrics, clients_that_half_close_give_their_place_back, .timeout = 180) {
        const char *ask = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"; /* keep-alive */
        Node n;
        node_start_timeout(&n, 60);
        for (int i = 0; i < 3 * MAX_CONNECTIONS; i++) /* http_raw half-closes; a receive waits 10 s at most */
                cr_assert_eq(http_raw(n.port, ask, strlen(ask), answer, sizeof answer), 200, "client %d: %s", i,
                             answer);
        node_stop(&n);
}

/* A few thousand requests, one in ten malformed: memory stays put, the
 * counters only grow. */
Test(metrics, a_flood_leaves_memory_bounded, .timeout = 300) {
        static const char *const bad[] = {
                "GARBAGE\r\n\r\n",
                "GET /metrics HTTP/9.9\r\n\r\n",
                "GET /metrics HTTP/1.1\r\n\r\n",              /* no Host */
                "GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",    /* no colon */
                "G\r\n\r\n",
                "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n",
                "GET /%00%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                "PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        };
        Node n;
        node_start(&n);
        for (int i = 0; i < 200; i++) /* warm up: the allocator's arenas */
                if (http(n.port, "GET", i % 2 ? "/" : "/metrics", answer, sizeof answer) != 200)
                        cr_assert_fail("%s", answer);
        long before = rss_kib(n.p.pid);
        double last_steps = 0, last_requests = 0, last_cpu = 0;
        /* (Criterion reports every assertion to its runner, a few ms each:
         * inside the loop, only failures are asserted) */
        for (int i = 0; i < 3000; i++) {
                if (i % 10 == 9) {
                        const char *r = bad[(i / 10) % (sizeof bad / sizeof bad[0])];
                        http_raw(n.port, r, strlen(r), answer, sizeof answer);
                        continue;
                }
                if (i % 3 == 1) {
                        if (http(n.port, "GET", "/", answer, sizeof answer) != 200)
                                cr_assert_fail("request %d: %s", i, answer);
                        continue;
                }
                if (http(n.port, "GET", "/metrics", answer, sizeof answer) != 200)
                        cr_assert_fail("request %d: %s", i, answer);
                const char *b = body(answer);
                double steps = metric(b, "ravnest_steps_total"), requests = metric(b, "ravnest_http_requests_total"),
                       cpu = metric(b, "process_cpu_seconds_total");
                if (!(steps >= last_steps && requests > last_requests && cpu >= last_cpu))
                        cr_assert_fail("request %d: a counter went down: steps %g after %g, requests %g after %g, "
                                       "CPU %g after %g", i, steps, last_steps, requests, last_requests, cpu, last_cpu);
                last_steps = steps, last_requests = requests, last_cpu = cpu;
        }
        long after = rss_kib(n.p.pid);
        cr_log_info("RSS %ld KiB before %d requests, %ld KiB after\n", before, 3000, after);
        cr_assert_lt(after - before, 16 * 1024, "RSS grew from %ld to %ld KiB", before, after);
        /* every well-formed request counted, up to the last one read
         * (i = 2997): 200 + 2699; of the malformed ones, those the HTTP
         * layer refused before they were requests are not */
        cr_assert_geq(last_requests, 2899, "%g", last_requests);
        node_stop(&n);
}

Test(metrics, promtool_checks_the_exposition, .timeout = 180) {
        if (!have("promtool"))
                cr_skip_test("SKIP: promtool missing: install Debian's prometheus to run this test");
        Node n;
        char path[128], cmd[256];
        node_start(&n);
        cr_assert_eq(http(n.port, "GET", "/metrics", answer, sizeof answer), 200, "%s", answer);
        snprintf(path, sizeof path, "%s/metrics.txt", n.dir);
        test_write_file(path, body(answer), 0644);
        snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
        FILE *f = popen(cmd, "r");
        char out[4096] = "";
        size_t k = fread(out, 1, sizeof out - 1, f);
        out[k] = '\0';
        int status = pclose(f);
        cr_assert_eq(status, 0, "promtool check metrics: %s\n%s", out, body(answer));
        node_stop(&n);
}

/* A real Prometheus scraping the node every second; PromQL finds the loss. */
Test(metrics, prometheus_scrapes_the_node, .timeout = 240) {
        char prometheus[256];
        if (!which("prometheus", prometheus, sizeof prometheus))
                cr_skip_test("SKIP: prometheus missing: install Debian's prometheus to run this test");
        Node n;
        node_start(&n);
        char conf[128], text[512], data[128], flag_conf[160], flag_data[160], flag_listen[64];
        uint16_t pport = test_free_port();
        snprintf(conf, sizeof conf, "%s/prometheus.yml", n.dir);
        snprintf(text, sizeof text,
                 "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                 "scrape_configs:\n  - job_name: ravnest\n    static_configs:\n      - targets: ['127.0.0.1:%u']\n",
                 n.port);
        test_write_file(conf, text, 0644);
        snprintf(data, sizeof data, "%s/tsdb", n.dir);
        snprintf(flag_conf, sizeof flag_conf, "--config.file=%s", conf);
        snprintf(flag_data, sizeof flag_data, "--storage.tsdb.path=%s", data);
        snprintf(flag_listen, sizeof flag_listen, "--web.listen-address=127.0.0.1:%u", pport);
        Proc prom;
        proc_start(&prom, (char *[]){ prometheus, flag_conf, flag_data, flag_listen, NULL }, NULL);
        cr_assert(proc_wait_for(&prom, "Server is ready to receive web requests", 60000), "%s", prom.out);

        char path[256];
        snprintf(path, sizeof path, "/api/v1/query?query=ravnest_training_loss%%7Bjob%%3D%%22ravnest%%22%%7D");
        bool found = false;
        for (int i = 0; i < 30 && !found; i++) {
                sleep(1);
                if (http(pport, "GET", path, answer, sizeof answer) == 200)
                        found = strstr(answer, "\"status\":\"success\"") && strstr(answer, "\"__name__\":\"ravnest_training_loss\"");
        }
        cr_assert(found, "no sample of ravnest_training_loss in Prometheus: %s", answer);
        const char *v = strstr(answer, "\"value\":[");
        cr_assert_not_null(v, "%s", answer);
        cr_log_info("Prometheus: %.160s\n", v);
        /* and a counter's rate over the scrapes */
        snprintf(path, sizeof path, "/api/v1/query?query=rate%%28ravnest_steps_total%%5B10s%%5D%%29");
        sleep(3);
        cr_assert_eq(http(pport, "GET", path, answer, sizeof answer), 200, "%s", answer);
        cr_assert(strstr(answer, "\"value\":["), "no rate of steps: %s", answer);
        /* the node's labels as it wrote them (a label "job" became
         * "exported_job", the scrape job's name taking its place) */
        snprintf(path, sizeof path,
                 "/api/v1/query?query=ravnest_node_info%%7Btraining_job%%3D%%22fashion-mnist-mlp%%22%%7D");
        cr_assert_eq(http(pport, "GET", path, answer, sizeof answer), 200, "%s", answer);
        cr_assert(strstr(answer, "\"value\":[") && !strstr(answer, "exported_job"), "%s", answer);
        kill(prom.pid, SIGTERM);
        proc_exit(&prom);
        node_stop(&n);
}

/* Headless Chromium renders the page: a screenshot that is a real PNG of the
 * window's size and not blank, and a DOM with the job and the plot. */
Test(metrics, chromium_renders_the_page, .timeout = 240) {
        const char *chromium = have("chromium") ? "chromium" : have("chromium-browser") ? "chromium-browser" : NULL;
        if (!chromium)
                cr_skip_test("SKIP: chromium missing: install Debian's chromium to run this test");
        Node n;
        node_start(&n);
        char cmd[768], png[128], dom[128];
        snprintf(png, sizeof png, "%s/page.png", n.dir);
        snprintf(dom, sizeof dom, "%s/page.html", n.dir);
        const char *flags = "--headless --no-sandbox --disable-gpu --no-first-run --window-size=1200,900";
        snprintf(cmd, sizeof cmd, "timeout 120 %s %s --user-data-dir=%s/chromium --screenshot=%s http://127.0.0.1:%u/ >/dev/null 2>&1",
                 chromium, flags, n.dir, png, n.port);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        /* the browser's log on stderr: a console message (an error, a
         * resource that failed to load) shows as CONSOLE */
        snprintf(cmd, sizeof cmd, "timeout 120 %s %s --enable-logging=stderr --v=0 --user-data-dir=%s/chromium "
                 "--dump-dom http://127.0.0.1:%u/ >%s 2>%s.log", chromium, flags, n.dir, n.port, dom, dom);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        snprintf(cmd, sizeof cmd, "grep CONSOLE %s.log", dom);
        cr_assert_neq(system(cmd), 0, "the page logged console messages (above)");

        struct stat st;
        cr_assert_eq(stat(png, &st), 0, "no screenshot");
        cr_assert_gt(st.st_size, 8 * 1024, "a screenshot of %lld bytes is blank", (long long)st.st_size);
        unsigned char h[24];
        FILE *f = fopen(png, "rb");
        cr_assert_eq(fread(h, 1, sizeof h, f), sizeof h);
        fclose(f);
        cr_assert_eq(memcmp(h, "\x89PNG\r\n\x1a\n", 8), 0, "not a PNG");
        cr_assert_eq(memcmp(h + 12, "IHDR", 4), 0);
        unsigned w = (unsigned)h[16] << 24 | h[17] << 16 | h[18] << 8 | h[19];
        unsigned hh = (unsigned)h[20] << 24 | h[21] << 16 | h[22] << 8 | h[23];
        cr_assert(w == 1200 && hh == 900, "screenshot %ux%u", w, hh);
        cr_log_info("screenshot %ux%u, %lld bytes\n", w, hh, (long long)st.st_size);

        f = fopen(dom, "r");
        size_t k = fread(answer, 1, sizeof answer - 1, f);
        fclose(f);
        answer[k] = '\0';
        cr_assert(strstr(answer, "fashion-mnist-mlp"), "the DOM lacks the job: %s", answer);
        cr_assert(strstr(answer, "<svg"), "the DOM lacks the plot: %s", answer);
        node_stop(&n);
}
