/* ctl/swarm.c */
#include "swarm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <unistd.h>

#include "cluster/partition.h"
#include "ctl-common.h"
#include "ctl-model.h"
#include "conf/job.h"
#include "run/result.h"
#include "run/series.h"
#include "run/stage-checkpoint.h"
#include "net/handshake.h"
#include "net/identity.h"
#include "net/net.h"
#include "net/relay.h"
#include "util/file.h"
#include "util/format.h"
#include "util/log.h"
#include "util/macro.h"
#include "util/time-util.h"

#include <sodium.h>

#define MAX_NODES 64

typedef struct SwarmNode {
        char name[16];
        bool no_accept;          /* named in --behind-nat: it dials every link itself */
        char hex[IDENTITY_HEX_SIZE];
        uint16_t pipe_port, avg_port;
        int pipe_fd, avg_fd;     /* listening there, for the node (LISTEN_FDS); -1 none */
        pid_t pid;
        int out;        /* read end of its stderr */
        char line[4096];
        size_t len;
        bool last_stage;
        unsigned cluster;
        bool done;               /* exited for good */
        int status;              /* its last exit, as wait4() gave it */
        uint64_t ended_usec;     /* CLOCK_REALTIME of that exit */
        unsigned restarts;
        uint64_t restart_ns;     /* when to start it again; 0: not waiting to */
        double busy;             /* from its last line, percent; < 0 unknown */
        double rate;             /* last stage: samples/s */
        long rss_kib;            /* peak, from wait4() */
        double pipeline_per_step, averaging_per_step; /* bytes, from its last line; < 0 unknown */
        unsigned rounds;         /* averaging rounds, from the last round line */
        int last_round;          /* its last averaging round: 1 with every member, 0 without, -1 no line */
} SwarmNode;

typedef struct Swarm {
        const SwarmOptions *o;
        Job job;
        int bounds[MAX_NODES + 1];
        char dir[256];
        SwarmNode nodes[MAX_NODES];
        unsigned n;
        SwarmResult res;
        bool stopping;
        unsigned failed;  /* 1 + the node whose end made the swarm stop the others; 0 none */
        Relay *relay;   /* --relay: in this process, for the nodes behind NAT */
        char relay_setting[48];
        uint8_t secret[HANDSHAKE_SECRET_SIZE]; /* the nodes' network secret, which the relay checks */
} Swarm;

/* A socket listening where a node will, handed to it when it starts
 * (LISTEN_FDS), so that no other process can take the port between its
 * choice and the node's start. The swarm keeps no copy after that: a node
 * that ends frees its port, for the node started again (--restart, or by
 * hand). The port is below the kernel's range of ephemeral ports, so that
 * in the meantime no outgoing connection takes it as its source port.
 * -errno if none could be had. */
static int listen_socket(uint16_t *ret_port) {
        unsigned low = 32768, high = 60999;
        FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
        if (f) {
                if (fscanf(f, "%u %u", &low, &high) != 2)
                        low = 32768;
                fclose(f);
        }
        for (int i = 0; low > 20000 + 100 && i < 200; i++) {
                int fd = net_listen_socket("127.0.0.1", (uint16_t)(20000 + randombytes_uniform(low - 20000)), ret_port);
                if (fd >= 0)
                        return fd;
        }
        return net_listen_socket("127.0.0.1", 0, ret_port); /* no room below the range: the kernel picks */
}

/* In a node's child before exec: its listening sockets as descriptors 3
 * and 4 and the variables of sd_listen_fds(3). */
static void pass_listeners(const SwarmNode *nd) {
        int src[2] = { nd->pipe_fd, nd->avg_fd }, high[2], n = 0;
        for (int k = 0; k < 2; k++) /* out of the way of 3 and 4 first */
                if (src[k] >= 0)
                        high[n++] = fcntl(src[k], F_DUPFD, 64);
        for (int k = 0; k < n; k++) {
                dup2(high[k], 3 + k); /* SD_LISTEN_FDS_START; a dup2() is without FD_CLOEXEC */
                close(high[k]);
        }
        if (n == 0) /* started again: it binds its ports itself */
                return;
        char pid[16], count[4];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        snprintf(count, sizeof count, "%d", n);
        setenv("LISTEN_PID", pid, 1);
        setenv("LISTEN_FDS", count, 1);
}

static void close_node_listeners(SwarmNode *nd) {
        if (nd->pipe_fd >= 0)
                close(nd->pipe_fd);
        if (nd->avg_fd >= 0)
                close(nd->avg_fd);
        nd->pipe_fd = nd->avg_fd = -1;
}

static void close_listeners(Swarm *s) {
        for (unsigned i = 0; i < s->n; i++)
                close_node_listeners(&s->nodes[i]);
}

/* Equal nodes: the partitioner's cut by compute, the same in every cluster. */
static int plan_cut(const Job *job, unsigned stages, int *bounds) {
        PartitionCosts costs;
        PartitionNode nodes[MAX_NODES];
        Diag d = {};
        int r = partition_costs(&job->model, &(PartitionParams){ .micro_batch = 32, .in_flight = 4, .optim_floats = 2,
                                                                  .stashed = 4 },
                                &costs, &d);
        if (r < 0)
                return log_error_errno(r, "Invalid job: %s", d.text);
        /* a stage without parameters has nothing to average: its nodes would refuse it */
        if ((int)stages > partition_max_stages(&costs))
                return log_error_errno(-EINVAL, "%s has %d layers with parameters (of %d): at most that many stages",
                                       job->name, partition_max_stages(&costs), job->model.n_layers);
        for (unsigned i = 0; i < stages; i++)
                nodes[i] = (PartitionNode){ .gflops = 10, .memory = UINT64_MAX / 2 };
        r = partition_plan(&costs, nodes, (int)stages, bounds, &d);
        if (r < 0)
                return log_error_errno(r, "Cannot cut %s into %u stages: %s", job->name, stages, d.text);
        return 0;
}

/* "<what> 52.0 KiB/step" in a node's last line: the bytes, or -1. */
static double parse_per_step(const char *text, const char *what) {
        const char *at = strstr(text, what), *end;
        uint64_t v;
        if (!at || parse_bytes(at + strlen(what), &end, &v) < 0 || strncmp(end, "/step", 5) != 0)
                return -1;
        return (double)v;
}

static void print_line(SwarmNode *n, const char *line, SwarmResult *res) {
        const char *text = line;
        if (text[0] == '<' && text[1] && text[2] == '>')
                text += 3; /* the sd-daemon priority */
        bool finished = strstr(text, "Finished") != NULL;
        const char *acc = strstr(text, "test accuracy ");
        if (acc && finished)
                res->accuracy[n->cluster] = strtod(acc + 14, NULL);
        const char *loss = strstr(text, "test loss ");
        if (loss && finished)
                res->loss[n->cluster] = strtod(loss + 10, NULL);
        const char *busy = strstr(text, "busy ");
        if (busy && finished)
                n->busy = strtod(busy + 5, NULL);
        if (finished) { /* "...% in all; pipeline 52.0 KiB/step, averaging 1.3 KiB/step" */
                n->pipeline_per_step = parse_per_step(text, "; pipeline ");
                n->averaging_per_step = parse_per_step(text, ", averaging ");
        }
        const char *rate = acc ? strstr(acc, "), ") : NULL;
        if (rate && finished)
                n->rate = strtod(rate + 3, NULL);
        const char *round = strstr(text, "Averaging round ");
        if (round && strstr(text, "done")) /* rounds are numbered: not every one has a line */
                n->rounds = MAX(n->rounds, (unsigned)strtoul(round + 16, NULL, 10));
        if (strstr(text, "The last averaging round included all "))
                n->last_round = 1;
        else if (strstr(text, "The last averaging round "))
                n->last_round = 0;
        printf("%-6s %s\n", n->name, text);
        fflush(stdout);
}

static void drain(SwarmNode *n, SwarmResult *res) {
        ssize_t k = read(n->out, n->line + n->len, sizeof n->line - 1 - n->len);
        if (k <= 0) {
                if (n->len) {
                        n->line[n->len] = 0;
                        print_line(n, n->line, res);
                        n->len = 0;
                }
                close(n->out);
                n->out = -1;
                return;
        }
        n->len += (size_t)k;
        n->line[n->len] = 0;
        char *start = n->line, *nl;
        while ((nl = strchr(start, '\n'))) {
                *nl = 0;
                print_line(n, start, res);
                start = nl + 1;
        }
        n->len = strlen(start);
        memmove(n->line, start, n->len + 1);
        if (n->len == sizeof n->line - 1) { /* a line too long: print what there is */
                print_line(n, n->line, res);
                n->len = 0;
        }
}

/* The job, checked against its data as every node will check it, and its
 * cut into stages. */
static int swarm_plan(Swarm *s) {
        const SwarmOptions *o = s->o;
        Diag d = {};
        int r;

        s->n = o->clusters * o->stages;
        if (o->clusters < 1 || o->stages < 1 || s->n > MAX_NODES)
                return log_error_errno(-EINVAL, "A swarm has 1 to %d nodes (clusters x stages)", MAX_NODES);
        if (job_load(o->job, &s->job, &d) < 0) /* missing or not a job: exit 78, as every command */
                return log_error_errno(-EINVAL, "Invalid job: %s (--job FILE names the job)", d.text);
        if ((r = job_check_data(&s->job, o->data_dir, &d)) < 0) /* the data missing or broken: exit 1 */
                return log_error_errno(r, "%s: %s", r == -EINVAL ? "Invalid job" : "Unusable dataset", d.text);
        return plan_cut(&s->job, o->stages, s->bounds);
}

static int make_dir(Swarm *s) {
        if (s->o->dir) {
                snprintf(s->dir, sizeof s->dir, "%s", s->o->dir);
                if (mkdir(s->dir, 0700) < 0 && errno != EEXIST)
                        return log_error_errno(-errno, "Failed to create %s: %m", s->dir);
                return 0;
        }
        snprintf(s->dir, sizeof s->dir, "/tmp/ravnest-swarm-XXXXXX");
        if (!mkdtemp(s->dir))
                return log_error_errno(-errno, "Failed to create a directory in /tmp: %m");
        return 0;
}

/* A directory kept from an earlier swarm (--dir) holds its checkpoints and
 * series: a new swarm starts afresh unless told to resume. */
static void clear_checkpoints(const char *state_dir) {
        DIR *dir = opendir(state_dir);
        struct dirent *e;
        if (!dir)
                return;
        while ((e = readdir(dir))) {
                size_t len = strlen(e->d_name);
                size_t s = strlen(SERIES_SUFFIX);
                if ((len > 5 && strcmp(e->d_name + len - 5, ".ckpt") == 0) ||
                    (len > s && strcmp(e->d_name + len - s, SERIES_SUFFIX) == 0))
                        (void)unlinkat(dirfd(dir), e->d_name, 0);
        }
        closedir(dir);
}

/* The name after p's in a comma-separated list, or NULL after the last. */
static const char *next_in_list(const char *p) {
        size_t n = strcspn(p, ",");
        return p[n] ? p + n + 1 : NULL;
}

/* Whether name is one of the comma-separated list's. */
static bool in_list(const char *list, const char *name) {
        size_t len = strlen(name);
        for (const char *p = list; p; p = next_in_list(p))
                if (strcspn(p, ",") == len && strncmp(p, name, len) == 0)
                        return true;
        return false;
}

/* Whether the len bytes at name are one of the swarm's nodes (c1s1 to
 * cCsS). */
static bool is_node(const SwarmOptions *o, const char *name, size_t len) {
        char node[32];
        for (unsigned c = 1; c <= o->clusters; c++)
                for (unsigned s = 1; s <= o->stages; s++)
                        if ((size_t)snprintf(node, sizeof node, "c%us%u", c, s) == len && !strncmp(name, node, len))
                                return true;
        return false;
}

int swarm_check_behind_nat(const SwarmOptions *o) {
        const char *list = o->behind_nat;
        for (const char *p = list; p; p = next_in_list(p)) {
                size_t len = strcspn(p, ",");
                if (is_node(o, p, len))
                        continue;
                if (len)
                        log_error("Invalid value for --behind-nat: \"%s\" (%.*s is not a node of this swarm, c1s1 to "
                                  "c%us%u)", list, (int)len, p, o->clusters, o->stages);
                else
                        log_error("Invalid value for --behind-nat: \"%s\" (an empty name; a comma-separated list "
                                  "of this swarm's nodes, c1s1 to c%us%u)", list, o->clusters, o->stages);
                return -EINVAL;
        }
        return 0;
}

/* --relay: a relay on loopback in this process, which every node may use;
 * all at one address, each waiting with two connections; it takes only
 * requests, and relays only links, that prove the nodes' network secret. */
static int start_relay(Swarm *s) {
        if (!s->o->relay)
                return 0;
        int r = relay_new(&(RelayConfig){ .host = "127.0.0.1", .max_links = 2 * MAX_NODES,
                                          .max_links_per_addr = 4 * MAX_NODES, .secret = s->secret },
                          &s->relay);
        if (r < 0)
                return log_error_errno(r, "Failed to start a relay on loopback: %m");
        snprintf(s->relay_setting, sizeof s->relay_setting, " relay = \"127.0.0.1:%u\";", relay_port(s->relay));
        printf("swarm: relaying links between nodes behind NAT on 127.0.0.1:%u\n", relay_port(s->relay));
        return 0;
}

static void stop_relay(Swarm *s) {
        RelayStats st;
        if (!s->relay)
                return;
        relay_get_stats(s->relay, &st);
        char bytes[32];
        format_bytes(bytes, sizeof bytes, st.bytes);
        printf("swarm: the relay joined %llu links (%llu proven to hold the network secret) and copied %s\n",
               (unsigned long long)st.links_total, (unsigned long long)st.proven, bytes);
        s->relay = relay_free(s->relay);
}

/* The network secret, then each node's key and ports. */
static int make_nodes(Swarm *s) {
        uint8_t *secret = s->secret;
        char hex[2 * HANDSHAKE_SECRET_SIZE + 2], path[512];
        Diag d = {};
        int r;

        randombytes_buf(secret, HANDSHAKE_SECRET_SIZE);
        for (size_t i = 0; i < HANDSHAKE_SECRET_SIZE; i++)
                snprintf(hex + 2 * i, 3, "%02x", secret[i]);
        strcat(hex, "\n");
        snprintf(path, sizeof path, "%s/secret", s->dir);
        if ((r = file_write_text(path, hex, 0600)) < 0)
                return log_error_errno(r, "Failed to write %s: %m", path);
        for (unsigned i = 0; i < s->n; i++) {
                SwarmNode *nd = &s->nodes[i];
                Identity id;
                bool created;
                *nd = (SwarmNode){ .busy = -1, .pipeline_per_step = -1, .averaging_per_step = -1, .out = -1,
                                   .pipe_fd = -1, .avg_fd = -1,
                                   .last_round = -1, .cluster = i / s->o->stages,
                                   .last_stage = i % s->o->stages == s->o->stages - 1 };
                snprintf(nd->name, sizeof nd->name, "c%us%u", nd->cluster + 1, i % s->o->stages + 1);
                snprintf(path, sizeof path, "%s/%.15s", s->dir, nd->name);
                (void)mkdir(path, 0700);
                if (!s->o->resume)
                        clear_checkpoints(path);
                snprintf(path, sizeof path, "%s/%.15s/identity", s->dir, nd->name);
                if ((r = identity_load_or_create(path, &id, &created, &d)) < 0)
                        return log_error_errno(r, "Failed to create a key: %s", d.text);
                identity_to_hex(id.pk, nd->hex);
                identity_clear(&id);
                nd->no_accept = in_list(s->o->behind_nat, nd->name);
                if ((nd->pipe_fd = listen_socket(&nd->pipe_port)) < 0)
                        return log_error_errno(nd->pipe_fd, "Failed to listen on the loopback: %m");
                if (s->o->clusters > 1 && (nd->avg_fd = listen_socket(&nd->avg_port)) < 0)
                        return log_error_errno(nd->avg_fd, "Failed to listen on the loopback: %m");
        }
        return 0;
}

/* The plan every node's configuration holds: its clusters' nodes and cuts,
 * and the averaging members. */
static void format_plan(const Swarm *s, char *plan, char *members, size_t cap) {
        const SwarmOptions *o = s->o;
        size_t k = 0;
        for (unsigned c = 0; c < o->clusters; c++) {
                k += (size_t)snprintf(plan + k, cap - k, "    { nodes = [");
                for (unsigned st = 0; st < o->stages; st++) {
                        const SwarmNode *nd = &s->nodes[c * o->stages + st];
                        k += (size_t)snprintf(plan + k, cap - k, "%s\"%s", st ? ", " : " ", nd->hex);
                        k += (size_t)(nd->no_accept ? snprintf(plan + k, cap - k, "\"")
                                                    : snprintf(plan + k, cap - k, "@127.0.0.1:%u\"", nd->pipe_port));
                }
                k += (size_t)snprintf(plan + k, cap - k, " ];\n      stages = [");
                for (unsigned st = 0; st <= o->stages; st++)
                        k += (size_t)snprintf(plan + k, cap - k, "%s%d", st ? ", " : " ", s->bounds[st]);
                k += (size_t)snprintf(plan + k, cap - k, " ]; }%s\n", c + 1 < o->clusters ? "," : "");
        }
        k = 0;
        for (unsigned i = 0; i < s->n; i++) {
                k += (size_t)snprintf(members + k, cap - k, "%s\"%s", i ? ",\n    " : "    ", s->nodes[i].hex);
                k += (size_t)(s->nodes[i].no_accept ? snprintf(members + k, cap - k, "\"")
                                                    : snprintf(members + k, cap - k, "@127.0.0.1:%u\"",
                                                               s->nodes[i].avg_port));
        }
}

/* Samples per micro-batch: the job's batch, at most 32, by default. */
static int micro_batch(const Swarm *s) {
        return s->o->micro_batch > 0 ? s->o->micro_batch : MIN(s->job.train.batch_size, 32);
}

/* Micro-batches per update: as many samples as the job's batch, by default. */
static int update_frequency(const Swarm *s) {
        const SwarmOptions *o = s->o;
        return o->update_frequency > 0 ? o->update_frequency : MAX(s->job.train.batch_size / micro_batch(s), 1);
}

/* One configuration per node, the same plan in each. Checkpoints on a
 * cadence, loaded at start: a node that is restarted goes on from its own. */
static int write_config(const Swarm *s, const SwarmNode *nd, const char *plan, const char *members, char *conf,
                        size_t cap) {
        const SwarmOptions *o = s->o;
        const char *dir = s->dir;
        char path[512];
        int r;

        snprintf(conf, cap,
                 "# generated by ravnestctl swarm: node %.15s\n"
                 "state_directory = \"%s/%.15s\";\n"
                 "threads = 1;\n"
                 "control_socket = \"%s/%.15s.sock\";\n"
                 "idle = { enabled = false; };  # the swarm's nodes keep each other busy\n"
                 "checkpoint = { interval = %u; load = true; };  # a restarted node goes on from its own\n"
                 "network = { secret_file = \"%s/secret\";%s };\n"
                 "pipeline = {\n"
                 "  micro_batch = %d;\n  staleness = %d;\n  update_frequency = %d;\n  schedule = \"%s\";\n"
                 "  neighbour_timeout = %u;\n"
                 "  listen = \"127.0.0.1:%u\";\n"
                 "  clusters = (\n%s  );\n"
                 "  %s\n"
                 "};\n",
                 nd->name, dir, nd->name, dir, nd->name, o->checkpoint_interval_s, dir, s->relay_setting,
                 micro_batch(s), o->staleness, update_frequency(s),
                 o->synchronous ? "sync" : "async", o->neighbour_timeout_s, nd->pipe_port, plan,
                 o->pipeline ? o->pipeline : "");
        if (o->clusters > 1) { /* one cluster has nothing to average with */
                size_t used = strlen(conf);
                snprintf(conf + used, cap - used,
                         "averaging = {\n"
                         "  interval = %g;\n"
                         "  listen = \"127.0.0.1:%u\";\n"
                         "  members = [\n%s\n  ];\n"
                         "  %s\n"
                         "};\n",
                         o->interval, nd->avg_port, members, o->averaging ? o->averaging : "");
        }
        snprintf(path, sizeof path, "%s/%.15s.conf", dir, nd->name);
        if ((r = file_write_text(path, conf, 0644)) < 0)
                return log_error_errno(r, "Failed to write %s: %m", path);
        return 0;
}

static int write_configs(const Swarm *s) {
        size_t cap = 4096 + (size_t)s->n * 512 + (s->o->averaging ? strlen(s->o->averaging) : 0) +
                     (s->o->pipeline ? strlen(s->o->pipeline) : 0);
        _cleanup_(freep) char *conf = malloc(cap), *plan = malloc(cap), *members = malloc(cap);
        int r;

        if (!conf || !plan || !members)
                return log_error_errno(-ENOMEM, "Out of memory");
        format_plan(s, plan, members, cap);
        for (unsigned i = 0; i < s->n; i++)
                if ((r = write_config(s, &s->nodes[i], plan, members, conf, cap)) < 0)
                        return r;
        return 0;
}

static void print_plan(const Swarm *s) {
        const SwarmOptions *o = s->o;
        printf("swarm: %u clusters x %u stages of %s in %s; micro-batch %d, %s, %d micro-batches per update; "
               "layers per stage:", o->clusters, o->stages, s->job.name, s->dir, micro_batch(s),
               o->synchronous ? "synchronous" : "asynchronous", o->synchronous ? o->staleness : update_frequency(s));
        for (unsigned st = 0; st < o->stages; st++)
                printf(" %d-%d", s->bounds[st], s->bounds[st + 1] - 1);
        printf("\n");
        fflush(stdout);
}

/* Fork and exec node i's ravnestd, its stderr into a pipe of ours. */
static int start_node(Swarm *s, unsigned i) {
        const SwarmOptions *o = s->o;
        SwarmNode *nd = &s->nodes[i];
        char conf_path[512], epochs[16], progress[16];
        int fds[2];

        if (pipe2(fds, O_CLOEXEC) < 0)
                return log_error_errno(-errno, "pipe: %m");
        snprintf(conf_path, sizeof conf_path, "%s/%.15s.conf", s->dir, nd->name);
        snprintf(epochs, sizeof epochs, "%d", o->epochs);
        snprintf(progress, sizeof progress, "%u", o->progress_ms);
        nd->pid = fork();
        if (nd->pid < 0)
                return log_error_errno(-errno, "fork: %m");
        if (nd->pid == 0) {
                if (o->pin) {
                        cpu_set_t set;
                        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
                        CPU_ZERO(&set);
                        CPU_SET((int)(i % (unsigned)MAX(ncpu, 1L)), &set);
                        sched_setaffinity(0, sizeof set, &set);
                }
                dup2(fds[1], STDERR_FILENO);
                pass_listeners(nd);
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                char *argv[16] = { (char *)o->ravnestd, "--config", conf_path, "--job", (char *)o->job,
                                   "--progress", progress };
                int a = 7;
                if (o->epochs > 0) {
                        argv[a++] = "--epochs";
                        argv[a++] = epochs;
                }
                if (o->data_dir) {
                        argv[a++] = "--data-dir";
                        argv[a++] = (char *)o->data_dir;
                }
                argv[a] = NULL;
                execv(o->ravnestd, argv);
                _exit(127);
        }
        close(fds[1]);
        close_node_listeners(nd); /* the node holds them now */
        nd->out = fds[0];
        nd->done = false;
        nd->restart_ns = 0;
        nd->last_round = -1;
        printf("swarm: started %s (pid %d)%s\n", nd->name, (int)nd->pid, nd->restarts ? ", again" : "");
        fflush(stdout);
        return 0;
}

static void stop_all(Swarm *s) {
        s->stopping = true;
        for (unsigned i = 0; i < s->n; i++) {
                SwarmNode *nd = &s->nodes[i];
                if (nd->restart_ns) { /* not started again after all */
                        nd->restart_ns = 0;
                        nd->done = true;
                } else if (!nd->done && nd->pid > 0)
                        kill(nd->pid, SIGTERM);
        }
}

static const char *describe_exit(int status, char *buf, size_t len) {
        snprintf(buf, len, "%s %d%s", WIFEXITED(status) ? "status" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                 WIFEXITED(status) && WEXITSTATUS(status) == EX_CONFIG ? ", refusing its configuration or job" : "");
        return buf;
}

#define SWARM_MAX_RESTARTS 5

/* A node exited: done, restarted in a second (--restart, as systemd's
 * Restart=on-failure would), left out (--keep-going), or the end of the
 * swarm. */
static void on_node_exit(Swarm *s, unsigned i, int status, long rss_kib) {
        SwarmNode *nd = &s->nodes[i];
        char why[64];

        nd->rss_kib = MAX(nd->rss_kib, rss_kib);
        nd->status = status;
        nd->ended_usec = now_realtime_usec();
        nd->done = true;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                return;
        describe_exit(status, why, sizeof why);
        if (s->stopping)
                printf("swarm: %s ended with %s\n", nd->name, why);
        else if (s->o->restart && nd->restarts < SWARM_MAX_RESTARTS) {
                printf("swarm: %s ended with %s; starting it again in 1 s, from its checkpoint if it wrote one\n",
                       nd->name, why);
                nd->restarts++;
                nd->done = false;
                nd->restart_ns = now_ns() + NSEC_PER_SEC;
        } else if (s->o->keep_going)
                printf("swarm: %s ended with %s\n", nd->name, why);
        else {
                printf("swarm: %s ended with %s; stopping the others\n", nd->name, why);
                s->failed = i + 1;
                stop_all(s);
        }
        fflush(stdout);
}

/* Relay every node's output until all have exited for good. */
static int supervise(Swarm *s, const volatile sig_atomic_t *stop) {
        int r;
        for (;;) {
                if (*stop && !s->stopping) {
                        printf("swarm: stopping every node\n");
                        stop_all(s);
                }
                struct pollfd pfd[MAX_NODES];
                unsigned map[MAX_NODES], np = 0, left = 0;
                for (unsigned i = 0; i < s->n; i++) {
                        if (s->nodes[i].out >= 0) {
                                pfd[np] = (struct pollfd){ .fd = s->nodes[i].out, .events = POLLIN };
                                map[np++] = i;
                        }
                        left += !s->nodes[i].done;
                }
                if (!left)
                        return 0;
                if (np == 0 || poll(pfd, np, 200) <= 0)
                        usleep(np ? 0 : 200 * 1000);
                else
                        for (unsigned i = 0; i < np; i++)
                                if (pfd[i].revents)
                                        drain(&s->nodes[map[i]], &s->res);
                for (unsigned i = 0; i < s->n; i++) {
                        SwarmNode *nd = &s->nodes[i];
                        struct rusage ru;
                        int status;
                        if (nd->restart_ns && now_ns() >= nd->restart_ns && (r = start_node(s, i)) < 0)
                                return r;
                        if (!nd->done && !nd->restart_ns && nd->out < 0 &&
                            wait4(nd->pid, &status, WNOHANG, &ru) == nd->pid)
                                on_node_exit(s, i, status, ru.ru_maxrss);
                }
        }
}

/* Someone listens on the socket: a node started again outside the swarm. */
static bool socket_answers(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof sa.sun_path)
                return false;
        strcpy(sa.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (fd >= 0)
                close(fd);
        return ok;
}

/* Nodes the swarm lost that an operator started again by hand, from their
 * configurations: the swarm waits for each to finish (its control socket
 * answers while it runs) and takes its result from its state directory
 * (run/result.h), written after it was lost. */
static void adopt_returned(Swarm *s, const volatile sig_atomic_t *stop) {
        for (unsigned i = 0; i < s->n && !*stop; i++) {
                SwarmNode *nd = &s->nodes[i];
                char sock[300], state[300];
                RunResult res;
                uint64_t mtime;
                if (nd->status == 0 || nd->restarts) /* it ended well, or the swarm started it again itself */
                        continue;
                snprintf(sock, sizeof sock, "%s/%s.sock", s->dir, nd->name);
                snprintf(state, sizeof state, "%s/%s", s->dir, nd->name);
                if (socket_answers(sock)) {
                        printf("swarm: %s runs again, started outside the swarm: waiting for it to finish\n", nd->name);
                        fflush(stdout);
                        while (!*stop && socket_answers(sock))
                                usleep(500 * 1000);
                }
                if (run_result_read(state, s->job.name, &res, &mtime) < 0 || mtime < nd->ended_usec)
                        continue;
                nd->last_round = res.averaged < 0 ? nd->last_round : res.averaged;
                if (nd->last_stage && res.test_accuracy >= 0) { /* as its log line has them */
                        s->res.accuracy[nd->cluster] = round(res.test_accuracy * 1e4) / 100;
                        s->res.loss[nd->cluster] = round(res.test_loss * 1e4) / 1e4;
                }
                printf("swarm: %s finished outside the swarm%s\n", nd->name,
                       nd->last_stage ? "; its cluster's result is the one it wrote" : "");
        }
}

/* Why the clusters did not end as one averaged model, or NULL when they did. */
static const char *why_not_averaged(const Swarm *s, char *buf, size_t len) {
        const SwarmOptions *o = s->o;
        for (unsigned c = 0; c < o->clusters; c++)
                if (s->res.accuracy[c] < 0) {
                        const SwarmNode *last = &s->nodes[c * o->stages + o->stages - 1];
                        const SwarmNode *first = s->failed ? &s->nodes[s->failed - 1] : NULL;
                        char why[64];
                        /* the node that failed, not the signal the swarm stopped this one with */
                        if (first && first != last && last->status) {
                                snprintf(buf, len, "cluster %u has no result: %s ended with %s, and the swarm "
                                         "stopped the others", c + 1, first->name,
                                         describe_exit(first->status, why, sizeof why));
                                return buf;
                        }
                        if (last->status)
                                describe_exit(last->status, why, sizeof why);
                        snprintf(buf, len, "cluster %u has no result (its last stage %s %s%s)", c + 1, last->name,
                                 last->status ? "ended with " : "said none", last->status ? why : "");
                        return buf;
                }
        if (o->clusters < 2)
                return NULL;
        for (unsigned i = 0; i < s->n; i++)
                if (s->nodes[i].last_round != 1) {
                        snprintf(buf, len, "the last averaging round of %s %s", s->nodes[i].name,
                                 s->nodes[i].last_round == 0 ? "went on without some clusters" : "did not happen");
                        return buf;
                }
        for (unsigned c = 1; c < o->clusters; c++)
                if (s->res.accuracy[c] != s->res.accuracy[0] || s->res.loss[c] != s->res.loss[0]) {
                        snprintf(buf, len, "the clusters' replicas differ after the last round");
                        return buf;
                }
        return NULL;
}

/* A figure of a node's last line, or "-" when it never said. */
static const char *per_step(double bytes, char buf[static FORMAT_BYTES_MAX]) {
        return bytes < 0 ? "-" : format_bytes(buf, FORMAT_BYTES_MAX, (uint64_t)bytes);
}

static void summarize_node(Swarm *s, unsigned i) {
        const SwarmNode *nd = &s->nodes[i];
        SwarmResult *res = &s->res;
        char busy[8] = "-", pipeline[FORMAT_BYTES_MAX], averaging[FORMAT_BYTES_MAX];

        res->busy[i] = nd->busy;
        res->rss_mib[i] = (double)nd->rss_kib / 1024;
        res->pipeline_per_step[i] = nd->pipeline_per_step;
        res->averaging_per_step[i] = nd->averaging_per_step;
        res->rounds += nd->rounds;
        if (nd->last_stage)
                res->samples_per_sec += nd->rate;
        if (nd->busy >= 0) /* else it never said: it did not finish */
                snprintf(busy, sizeof busy, "%.0f%%", CLAMP(nd->busy, 0.0, 100.0));
        printf("swarm: %-5s %5s  %13s  %14s %5.0f MiB  %u\n", nd->name, busy, per_step(nd->pipeline_per_step, pipeline),
               per_step(nd->averaging_per_step, averaging), res->rss_mib[i], nd->restarts);
}

static int summarize(Swarm *s, bool interrupted) {
        SwarmResult *res = &s->res;
        char why[160];

        printf("swarm: node   busy  pipeline/step  averaging/step  peak RSS  restarts\n");
        for (unsigned i = 0; i < s->n; i++)
                summarize_node(s, i);
        for (unsigned c = 0; c < s->o->clusters; c++)
                if (res->accuracy[c] >= 0)
                        printf("swarm: cluster %u: test accuracy %.2f%%, test loss %.4f\n", c + 1, res->accuracy[c],
                               res->loss[c]);
        printf("swarm: %.0f samples/s, all clusters together\n", res->samples_per_sec);
        printf("swarm: %u averaging rounds done across the nodes\n", res->rounds);
        const char *bad = why_not_averaged(s, why, sizeof why);
        if (!bad && s->o->clusters > 1)
                printf("swarm: the averaged model (every cluster's replica after the last round): test accuracy "
                       "%.2f%%, test loss %.4f\n", res->accuracy[0], res->loss[0]);
        else if (bad && interrupted)
                printf("swarm: stopped before the end: no %s\n", s->o->clusters > 1 ? "averaged model" : "trained model");
        else if (bad)
                printf("swarm: no %s: %s\n", s->o->clusters > 1 ? "averaged model" : "trained model", bad);
        fflush(stdout);
        return bad ? -EUCLEAN : 0;
}

/* A language model's swarm ends with a sample of its text: cluster 1's
 * stages put together from the checkpoints they wrote on the way out. */
static void print_sample(const Swarm *s) {
        char *paths[MAX_NODES], buf[MAX_NODES][PATH_MAX];
        _cleanup_(stage_freep) Stage *model = NULL;
        uint8_t text[1 + 300];
        Diag d = {};

        for (unsigned st = 0; st < s->o->stages; st++) {
                char name[160];
                stage_checkpoint_name(s->job.name, s->bounds[st], s->bounds[st + 1], name, sizeof name);
                snprintf(buf[st], sizeof buf[st], "%s/%s/%s", s->dir, s->nodes[st].name, name);
                paths[st] = buf[st];
        }
        text[0] = '\n';
        if (model_from_checkpoints(&s->job, paths, (int)s->o->stages, &model, &d) < 0 ||
            model_generate(&s->job, model, text, 1, 300, 0.8, 1) < 0) {
                printf("swarm: no sample of the model's text: %s\n", d.text);
                return;
        }
        printf("swarm: a sample of the averaged model's text (300 bytes, temperature 0.8):\n");
        ctl_print_text(text + 1, 300);
        printf("\n");
}

static void remove_dir(const Swarm *s) {
        char cmd[300];
        if (s->o->keep || s->o->dir || !s->dir[0])
                return;
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
        if (system(cmd) != 0)
                log_warning("Failed to remove %s", s->dir);
}

int swarm_run(const SwarmOptions *o, const volatile sig_atomic_t *stop, SwarmResult *ret) {
        _cleanup_(freep) Swarm *s = calloc(1, sizeof *s);
        int r;

        if (!s)
                return log_error_errno(-ENOMEM, "Out of memory");
        s->o = o;
        for (unsigned i = 0; i < MAX_NODES; i++)
                s->nodes[i].pipe_fd = s->nodes[i].avg_fd = -1;
        s->res.clusters = o->clusters;
        for (unsigned c = 0; c < MAX_NODES; c++)
                s->res.accuracy[c] = s->res.loss[c] = -1;
        if ((r = swarm_check_behind_nat(o)) < 0 || (r = swarm_plan(s)) < 0 || (r = make_dir(s)) < 0)
                return r;
        if ((r = make_nodes(s)) >= 0 && (r = start_relay(s)) >= 0 &&
            (r = write_configs(s)) >= 0) {
                print_plan(s);
                /* last stages first, so the links find them listening */
                for (unsigned j = 0; j < s->n && r >= 0; j++)
                        r = start_node(s, s->n - 1 - j);
                if (r < 0)
                        stop_all(s);
                int k = supervise(s, stop);
                adopt_returned(s, stop);
                r = r < 0 ? r : k < 0 ? k : summarize(s, *stop);
                if (r >= 0 && s->job.model.lm && !*stop)
                        print_sample(s);
                if (o->keep || o->dir) /* else the directory goes, and the series with it */
                        printf("swarm: series in %s; ravnestctl plot %s draws them\n", s->dir, s->dir);
        }
        stop_relay(s);
        close_listeners(s);
        remove_dir(s);
        if (ret)
                *ret = s->res;
        return *stop ? -ECANCELED : r;
}
