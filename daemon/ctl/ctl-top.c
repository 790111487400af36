/* ctl/ctl-top.c — see ctl-top.h. */
#include "ctl-top.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <termios.h>
#include <unistd.h>

#include "conf/option.h"
#include "ctl-common.h"
#include "ctl-node.h"
#include "util/format.h"
#include "util/macro.h"
#include "util/time-util.h"

#define TOP_MAX_NODES 64
#define TOP_CALL_USEC (1000 * 1000ULL) /* a node slower than this to answer is unreachable for now */

typedef struct TopNode {
        char name[64];
        char socket[PATH_MAX];
        bool only_socket;              /* else the system bus first, as status asks the local node */
        bool seen;                     /* has figures from an earlier refresh */
        unsigned long long pipeline_bytes, averaging_bytes;
        uint64_t at_ns;
} TopNode;

typedef struct Top {
        const char *sockets[TOP_MAX_NODES];
        size_t n_sockets;
        const char *swarm_dir;
        double interval;
        long long iterations;          /* 0: until q */
        TopNode nodes[TOP_MAX_NODES];
        size_t n;
        bool tty;
        bool headed;         /* off a terminal: the header line is out (once, before the first rows) */
} Top;

/* ---- the terminal: restored however top ends ------------------------------ */

static struct termios saved_termios;
static bool termios_saved, screen_taken;
static volatile sig_atomic_t quit_requested;

static void terminal_restore(void) {
        static const char restore[] = "\033[0m\033[?25h\033[?1049l"; /* the cursor back, the main screen back */
        if (screen_taken) /* (its length counted by the compiler: by hand it took the NUL too) */
                (void)!write(STDOUT_FILENO, restore, sizeof restore - 1);
        screen_taken = false;
        if (termios_saved)
                (void)tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_termios);
        termios_saved = false;
}

static void on_quit(int sig) {
        quit_requested = sig;
}

static void catch_signals(void) {
        struct sigaction sa = { .sa_handler = on_quit };
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
}

/* Keys one at a time, without echo; the alternate screen, the cursor hidden. */
static void terminal_take(void) {
        if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_termios) == 0) {
                struct termios raw = saved_termios;
                termios_saved = true;
                raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO); /* ISIG stays: Ctrl-C is SIGINT, caught above */
                raw.c_cc[VMIN] = 0;
                raw.c_cc[VTIME] = 0;
                (void)tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw);
        }
        atexit(terminal_restore);
        screen_taken = true;
        fputs("\033[?1049h\033[?25l", stdout);
}

static unsigned terminal_columns(void) {
        struct winsize ws;
        return ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col ? ws.ws_col : 80;
}

/* ---- which nodes --------------------------------------------------------- */

static TopNode *node_for(Top *t, const char *name, const char *socket, bool only_socket) {
        for (size_t i = 0; i < t->n; i++)
                if (!strcmp(t->nodes[i].socket, socket))
                        return &t->nodes[i];
        if (t->n == TOP_MAX_NODES)
                return NULL;
        TopNode *n = &t->nodes[t->n++];
        *n = (TopNode){};
        snprintf(n->name, sizeof n->name, "%s", name);
        snprintf(n->socket, sizeof n->socket, "%s", socket);
        n->only_socket = only_socket;
        return n;
}

static int cmp_node(const void *a, const void *b) {
        return strcmp(((const TopNode *)a)->name, ((const TopNode *)b)->name);
}

/* The swarm's sockets as they are now: nodes come and go. */
static void find_swarm_nodes(Top *t) {
        DIR *d = opendir(t->swarm_dir);
        struct dirent *e;
        if (!d)
                return;
        while ((e = readdir(d))) {
                size_t len = strlen(e->d_name);
                char path[PATH_MAX], name[64];
                if (len <= 5 || strcmp(e->d_name + len - 5, ".sock") ||
                    snprintf(path, sizeof path, "%s/%s", t->swarm_dir, e->d_name) >= (int)sizeof path)
                        continue;
                snprintf(name, sizeof name, "%.*s", (int)MIN(len - 5, sizeof name - 1), e->d_name);
                (void)node_for(t, name, path, true);
        }
        closedir(d);
        qsort(t->nodes, t->n, sizeof t->nodes[0], cmp_node);
}

/* ---- a refresh ------------------------------------------------------------ */

#define ROW_FORMAT "%-10s %-12s %-7s %5s %9s %8s %10s %5s %7s %11s %11s %9s"

/* In a terminal, in reverse video at every refresh; into a pipe or a file,
 * plain, once. */
static void print_header(Top *t, unsigned cols) {
        char line[256];
        snprintf(line, sizeof line, ROW_FORMAT, "NODE", "STATE", "CL/ST", "EPOCH", "STEP", "LOSS", "SAMPLES/S",
                 "BUSY", "ROUNDS", "PIPELINE/S", "AVERAGE/S", "RSS");
        if (t->tty)
                printf("\033[7m%-*.*s\033[0m\n", (int)cols, (int)cols, line);
        else if (!t->headed)
                printf("%s\n", line);
        t->headed = true;
}

/* "1.2 MiB" per second since the last refresh, or "-" on the first. */
static const char *rate(char *buf, const TopNode *n, unsigned long long bytes, unsigned long long before,
                        uint64_t now) {
        if (!n->seen || now <= n->at_ns || bytes < before)
                return "-";
        return format_bytes(buf, FORMAT_BYTES_MAX, (uint64_t)((double)(bytes - before) / ns_to_sec(now - n->at_ns)));
}

static void format_row(TopNode *n, const NodeView *v, char *line, size_t len) {
        char where[32] = "-", epoch[12] = "-", step[24], loss[16] = "-", sps[24], busy[8] = "-", rounds[24];
        char pipe[FORMAT_BYTES_MAX], avg[FORMAT_BYTES_MAX], rss[FORMAT_BYTES_MAX];
        uint64_t now = now_ns();

        if (v->stage >= 0)
                snprintf(where, sizeof where, "%d/%d", v->cluster + 1, v->stage + 1);
        if (v->epoch > 0)
                snprintf(epoch, sizeof epoch, "%d", v->epoch);
        snprintf(step, sizeof step, "%llu", v->step);
        if (v->loss >= 0)
                snprintf(loss, sizeof loss, "%.4f", v->loss);
        snprintf(sps, sizeof sps, "%.0f", v->samples_per_sec);
        if (v->busy >= 0)
                snprintf(busy, sizeof busy, "%.0f%%", 100 * CLAMP(v->busy, 0.0, 1.0));
        snprintf(rounds, sizeof rounds, "%llu", v->averaging_rounds);
        snprintf(line, len, ROW_FORMAT, n->name, v->state, where, epoch, step, loss, sps, busy, rounds,
                 rate(pipe, n, v->pipeline_bytes, n->pipeline_bytes, now),
                 rate(avg, n, v->averaging_bytes, n->averaging_bytes, now),
                 v->rss_bytes ? format_bytes(rss, sizeof rss, v->rss_bytes) : "-");
        n->pipeline_bytes = v->pipeline_bytes;
        n->averaging_bytes = v->averaging_bytes;
        n->at_ns = now;
        n->seen = true;
}

static void print_row(Top *t, TopNode *n, unsigned cols) {
        char line[256];
        NodeView v;
        if (ctl_node_view(&(NodeAddress){ n->socket, n->only_socket }, TOP_CALL_USEC, &v) < 0) {
                snprintf(line, sizeof line, "%-10s %-12s", n->name, "unreachable");
                n->seen = false;
        } else
                format_row(n, &v, line, sizeof line);
        if (t->tty)
                printf("%-*.*s\n", (int)cols, (int)cols, line);
        else
                printf("%s\n", line);
}

static void refresh(Top *t) {
        unsigned cols = t->tty ? MIN(terminal_columns(), 255u) : 255;
        if (t->swarm_dir)
                find_swarm_nodes(t);
        if (t->tty)
                fputs("\033[H\033[2J", stdout);
        print_header(t, cols);
        if (t->n == 0)
                printf("%s\n", t->swarm_dir ? "no nodes (no *.sock) in the swarm's directory yet" : "no nodes");
        for (size_t i = 0; i < t->n && !quit_requested; i++)
                print_row(t, &t->nodes[i], cols);
        if (t->tty)
                printf("\n%s  every %gs  q: quit", t->swarm_dir ? t->swarm_dir : "", t->interval);
        fflush(stdout);
}

/* Until the interval is over, or q (or Ctrl-C) says to quit. */
static void wait_interval(const Top *t) {
        uint64_t end = now_ns() + (uint64_t)(t->interval * 1e9);
        for (uint64_t now; !quit_requested && (now = now_ns()) < end;) {
                struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
                int ms = (int)MIN((end - now) / 1000000 + 1, 1000u);
                if (!t->tty || !termios_saved) {
                        (void)poll(NULL, 0, ms);
                        continue;
                }
                if (poll(&p, 1, ms) <= 0)
                        continue;
                char c;
                if (read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q' || c == 3))
                        quit_requested = 1;
        }
}

/* ---- the command -------------------------------------------------------- */

static void usage(FILE *f) {
        fprintf(f, "Usage: ravnestctl top [--socket PATH]... [--swarm DIR] [--interval S] [--iterations N]\n"
                   "\n"
                   "The nodes' state and progress, refreshed every interval: the local node, the nodes at the\n"
                   "sockets named, or every node of a swarm running in DIR. On a terminal q or Ctrl-C quits;\n"
                   "elsewhere a line per node per refresh.\n"
                   "\n"
                   "  --socket PATH     a node's control socket (up to %d)\n"
                   "  --swarm DIR       every node of the swarm in DIR (its *.sock)\n"
                   "  --interval S      seconds between refreshes, 0.1 to 3600 (default 1)\n"
                   "  --iterations N    stop after N refreshes, 1 to 1000000000 (default: until quit)\n"
                   "  -h, --help        show this help\n",
                TOP_MAX_NODES);
}

static int parse_args(int argc, char *argv[], Top *t) {
        static const struct option options[] = {
                { "socket", required_argument, NULL, 'S' },
                { "swarm", required_argument, NULL, 'w' },
                { "interval", required_argument, NULL, 'i' },
                { "iterations", required_argument, NULL, 'n' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c, r;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                r = 0;
                switch (c) {
                case 'S':
                        if (t->n_sockets == TOP_MAX_NODES) {
                                fprintf(stderr, "ravnestctl top: at most %d --socket\n", TOP_MAX_NODES);
                                return EX_USAGE;
                        }
                        NodeAddress a;
                        if (ctl_node_locate("top", optarg, &a) >= 0)
                                return EX_USAGE;
                        t->sockets[t->n_sockets++] = optarg;
                        break;
                case 'w': t->swarm_dir = optarg; break;
                case 'i': r = option_double("interval", optarg, 0.1, 3600, &t->interval); break;
                case 'n': r = option_int("iterations", optarg, 1, 1000000000, &t->iterations); break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return EX_USAGE;
                }
                if (r < 0)
                        return EX_USAGE;
        }
        if ((r = ctl_operands("top", argc, argv, 0, 0, NULL)) >= 0)
                return r;
        struct stat st;
        if (t->swarm_dir && (stat(t->swarm_dir, &st) < 0 || !S_ISDIR(st.st_mode))) {
                fprintf(stderr, "ravnestctl top: --swarm %s: not a directory\n", t->swarm_dir);
                return EX_NOINPUT;
        }
        return -1;
}

int ctl_top(int argc, char *argv[]) {
        _cleanup_(freep) Top *t = calloc(1, sizeof *t);
        int r;

        if (!t)
                return EXIT_FAILURE;
        t->interval = 1;
        if ((r = parse_args(argc, argv, t)) >= 0)
                return r;
        for (size_t i = 0; i < t->n_sockets; i++) {
                const char *base = strrchr(t->sockets[i], '/');
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)strcspn(base ? base + 1 : t->sockets[i], "."),
                         base ? base + 1 : t->sockets[i]);
                (void)node_for(t, name, t->sockets[i], true);
        }
        NodeAddress local;
        if (!t->swarm_dir && !t->n_sockets) { /* the local node, where status finds it */
                if ((r = ctl_node_locate("top", NULL, &local)) >= 0)
                        return r;
                (void)node_for(t, "local", local.socket, local.only_socket);
        }

        t->tty = isatty(STDOUT_FILENO);
        catch_signals();
        if (t->tty)
                terminal_take();
        for (long long i = 0; !quit_requested && (!t->iterations || i < t->iterations); i++) {
                if (i)
                        wait_interval(t);
                if (!quit_requested)
                        refresh(t);
        }
        terminal_restore();
        return 0; /* q and Ctrl-C are how top ends */
}
