/* ravnestd on a private system-style D-Bus (a real dbus-daemon with a
 * default-deny policy and the project's policy file): everyone reads its
 * properties, only root pauses, resumes and checkpoints it — through busctl
 * and through ravnestctl, whose exit codes a health check reads. */
#include <criterion/criterion.h>

#include "../lib/proc.h"
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NOBODY "65534"

static char dir[64];
static Proc bus, node;
static bool bus_up, node_up;

static void write_text(const char *path, const char *text) {
        FILE *f = fopen(path, "w");
        cr_assert(f, "cannot write %s", path);
        fputs(text, f);
        fclose(f);
}

/* Run argv to the end; its output in out, its exit status returned. */
static int run(char *const argv[], char *out, size_t len) {
        Proc p;
        proc_start(&p, argv, NULL);
        int status = proc_exit(&p);
        snprintf(out, len, "%.*s", (int)p.len, p.out);
        return status;
}

static void skip_unless_possible(void) {
        if (geteuid() != 0)
                cr_skip_test("SKIP: needs root (a private system bus, and a second user to be refused)");
        if (access("/usr/bin/dbus-daemon", X_OK) < 0 || access("/usr/bin/busctl", X_OK) < 0 ||
            access("/usr/bin/setpriv", X_OK) < 0)
                cr_skip_test("SKIP: needs dbus-daemon, busctl and setpriv (apt-get install dbus systemd util-linux)");
        if (access(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist", FASHION_MNIST_DIR);
}

/* A system-style bus: default deny, as Debian's system.conf, and the
 * project's policy file in its includedir. */
static void start_bus(void) {
        char path[512], conf[2048], sysd[96], line[600];

        snprintf(dir, sizeof dir, "/tmp/ravnest-dbus-XXXXXX");
        cr_assert(mkdtemp(dir));
        chmod(dir, 0755); /* the unprivileged client reaches the socket */
        snprintf(sysd, sizeof sysd, "%s/system.d", dir);
        mkdir(sysd, 0755);
        snprintf(path, sizeof path, "cp %s/config/dbus/org.ravnest.Node1.conf %s/", SOURCE_ROOT, sysd);
        cr_assert_eq(system(path), 0);
        snprintf(conf, sizeof conf,
                 "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n"
                 " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
                 "<busconfig>\n"
                 "  <type>system</type>\n"
                 "  <auth>EXTERNAL</auth>\n"
                 "  <listen>unix:path=%s/bus</listen>\n"
                 "  <policy context=\"default\">\n"
                 "    <allow user=\"*\"/>\n"
                 "    <deny own=\"*\"/>\n"
                 "    <deny send_type=\"method_call\"/>\n"
                 "    <allow send_type=\"signal\"/>\n"
                 "    <allow send_requested_reply=\"true\" send_type=\"method_return\"/>\n"
                 "    <allow send_requested_reply=\"true\" send_type=\"error\"/>\n"
                 "    <allow receive_type=\"method_call\"/>\n"
                 "    <allow receive_type=\"method_return\"/>\n"
                 "    <allow receive_type=\"error\"/>\n"
                 "    <allow receive_type=\"signal\"/>\n"
                 "    <allow send_destination=\"org.freedesktop.DBus\" send_interface=\"org.freedesktop.DBus\"/>\n"
                 "    <allow send_destination=\"org.freedesktop.DBus\" "
                 "send_interface=\"org.freedesktop.DBus.Introspectable\"/>\n"
                 "  </policy>\n"
                 "  <includedir>%s</includedir>\n"
                 "</busconfig>\n",
                 dir, sysd);
        snprintf(path, sizeof path, "%s/system.conf", dir);
        write_text(path, conf);
        snprintf(line, sizeof line, "--config-file=%s", path);
        proc_start(&bus, (char *[]){ "/usr/bin/dbus-daemon", line, "--nofork", "--nopidfile", NULL }, NULL);
        bus_up = true;
        snprintf(path, sizeof path, "%s/bus", dir);
        for (int i = 0; i < 100 && access(path, F_OK) < 0; i++)
                usleep(50 * 1000);
        cr_assert_eq(access(path, F_OK), 0, "the private bus did not come up: %.*s", (int)bus.len, bus.out);
        snprintf(line, sizeof line, "unix:path=%s/bus", dir);
        setenv("DBUS_SYSTEM_BUS_ADDRESS", line, 1);
        unsetenv("RAVNEST_SOCKET");
}

static void start_node(void) {
        char conf[128], text[512];
        snprintf(conf, sizeof conf, "%s/ravnestd.conf", dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state\";\n"
                 "control_socket = \"\";  # the system bus only\n"
                 "idle = { enabled = false; };\n",
                 dir);
        write_text(conf, text);
        proc_start(&node, (char *[]){ RAVNESTD, "--config", conf, "--job", SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                                      "--epochs", "3", "--progress", "0", NULL },
                   NULL);
        node_up = true;
        cr_assert(proc_wait_for(&node, "on the system bus", 20000), "ravnestd did not take its name: %.*s",
                  (int)node.len, node.out);
}

static void teardown(void) {
        if (node_up) {
                kill(node.pid, SIGTERM);
                proc_exit(&node);
        }
        if (bus_up) {
                kill(bus.pid, SIGTERM);
                proc_exit(&bus);
        }
        if (dir[0]) {
                test_remove_tree(dir);
        }
}

/* busctl's value of a string property, as user (NULL: root). */
static int get_state(const char *user, char *out, size_t len) {
        char *as_nobody[] = { "/usr/bin/setpriv", "--reuid=" NOBODY, "--regid=" NOBODY, "--clear-groups",
                              "/usr/bin/busctl", "--system", "get-property", "org.ravnest.Node1", "/org/ravnest/Node1",
                              "org.ravnest.Node1", "State", NULL };
        return run(user ? as_nobody : as_nobody + 4, out, len);
}

static bool wait_state(const char *want, int timeout_ms) {
        char out[4096], expect[64];
        snprintf(expect, sizeof expect, "s \"%s\"", want);
        for (int t = 0; t < timeout_ms; t += 100) {
                if (get_state(NULL, out, sizeof out) == 0 && strstr(out, expect))
                        return true;
                usleep(100 * 1000);
        }
        return false;
}

Test(dbus, policy_reads_for_everyone_controls_for_root, .init = skip_unless_possible, .fini = teardown,
     .timeout = 120) {
        char out[8192];
        int st;

        start_bus();
        start_node();
        cr_assert(wait_state("training", 30000), "never training: %.*s", (int)node.len, node.out);

        /* reading: everyone */
        st = get_state("nobody", out, sizeof out);
        cr_assert_eq(st, 0, "an unprivileged user cannot read State: %s", out);
        cr_assert(strstr(out, "s \"training\""), "%s", out);
        st = run((char *[]){ "/usr/bin/setpriv", "--reuid=" NOBODY, "--regid=" NOBODY, "--clear-groups", RAVNESTCTL,
                             "status", "--json", NULL },
                 out, sizeof out);
        cr_assert_eq(st, 0, "ravnestctl status as nobody: exit %d: %s", st, out);
        cr_assert(strstr(out, "\"State\": \"training\"") && strstr(out, "\"Role\": \"standalone\"") &&
                          strstr(out, "\"IoBackend\""),
                  "%s", out);

        /* controlling: refused to nobody by the bus policy, through busctl and ravnestctl */
        st = run((char *[]){ "/usr/bin/setpriv", "--reuid=" NOBODY, "--regid=" NOBODY, "--clear-groups",
                             "/usr/bin/busctl", "--system", "call", "org.ravnest.Node1", "/org/ravnest/Node1",
                             "org.ravnest.Node1", "Pause", NULL },
                 out, sizeof out);
        cr_assert_neq(st, 0, "nobody paused the node: %s", out);
        cr_assert(strstr(out, "ccess denied") || strstr(out, "AccessDenied") || strstr(out, "not allowed") ||
                          strstr(out, "rejected"),
                  "%s", out);
        st = run((char *[]){ "/usr/bin/setpriv", "--reuid=" NOBODY, "--regid=" NOBODY, "--clear-groups", RAVNESTCTL,
                             "pause", NULL },
                 out, sizeof out);
        cr_assert_eq(st, 77, "ravnestctl pause as nobody: exit %d (want 77, EX_NOPERM): %s", st, out);
        /* in ravnestctl's words, not the bus's ("Rejected send message, 1 matched rules; ...") */
        cr_assert(strstr(out, "Pause failed: Only root and the daemon's own user may pause this node"), "%s", out);
        cr_assert(!strstr(out, "Rejected"), "%s", out);
        cr_assert(wait_state("training", 1000), "a refused Pause paused the node");

        /* ... and allowed to root */
        st = run((char *[]){ "/usr/bin/busctl", "--system", "call", "org.ravnest.Node1", "/org/ravnest/Node1",
                             "org.ravnest.Node1", "Pause", NULL },
                 out, sizeof out);
        cr_assert_eq(st, 0, "root cannot pause: %s", out);
        cr_assert(wait_state("paused", 5000), "Pause did not pause");
        st = run((char *[]){ "/usr/bin/busctl", "--system", "get-property", "org.ravnest.Node1", "/org/ravnest/Node1",
                             "org.ravnest.Node1", "PauseReason", NULL },
                 out, sizeof out);
        cr_assert(strstr(out, "operator"), "%s", out);
        st = run((char *[]){ RAVNESTCTL, "checkpoint", NULL }, out, sizeof out);
        cr_assert_eq(st, 0, "checkpoint as root: exit %d: %s", st, out);
        unsigned long long step = 0;
        cr_assert(sscanf(out, "Checkpoint written at step %llu", &step) == 1 && step > 0, "%s", out);
        st = run((char *[]){ RAVNESTCTL, "status", "--json", NULL }, out, sizeof out);
        cr_assert_eq(st, 0, "%s", out);
        char want[64], want_step[64];
        snprintf(want, sizeof want, "\"CheckpointStep\": %llu", step);
        cr_assert(strstr(out, "\"State\": \"paused\"") && strstr(out, want), "%s", out);
        /* Step is where the paused node stopped, the checkpoint's (it lagged the last report behind) */
        snprintf(want_step, sizeof want_step, "\"Step\": %llu,", step);
        cr_assert(strstr(out, want_step), "%s", out);
        st = run((char *[]){ RAVNESTCTL, "resume", NULL }, out, sizeof out);
        cr_assert_eq(st, 0, "%s", out);
        cr_assert(wait_state("training", 5000), "Resume did not resume");
        cr_assert(proc_wait_for(&node, "Resumed training", 2000), "%.*s", (int)node.len, node.out);
}

Test(dbus, ravnestctl_without_a_node, .init = skip_unless_possible, .fini = teardown, .timeout = 60) {
        char out[4096];
        start_bus();
        setenv("RAVNEST_SOCKET", "/nonexistent/ravnest.sock", 1);
        int st = run((char *[]){ RAVNESTCTL, "status", NULL }, out, sizeof out);
        unsetenv("RAVNEST_SOCKET");
        cr_assert_eq(st, 69, "no node: exit %d (want 69, EX_UNAVAILABLE): %s", st, out);
        cr_assert(strstr(out, "not running"), "%s", out);
        /* RAVNEST_SOCKET: that socket alone, and the message names no bus */
        cr_assert(strstr(out, "/nonexistent/ravnest.sock: No such file or directory") && !strstr(out, "system bus"),
                  "%s", out);
}
