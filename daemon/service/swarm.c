/* service/swarm.c */
#include "swarm.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster/partition.h"
#include "job.h"
#include "net/handshake.h"
#include "net/identity.h"
#include "util/log.h"
#include "util/macro.h"
#include "util/time-util.h"

#include <sodium.h>

#define MAX_NODES 64

typedef struct SwarmNode {
        char name[16];
        char hex[IDENTITY_HEX_SIZE];
        uint16_t pipe_port, avg_port;
        pid_t pid;
        int out;        /* read end of its stderr */
        char line[4096];
        size_t len;
        bool last_stage;
        unsigned cluster;
        bool done;
        double busy;     /* from its last line, percent; < 0 unknown */
        double rate;     /* last stage: samples/s */
        long rss_kib;    /* peak, from wait4() */
        unsigned rounds; /* averaging rounds, from the last round line */
} SwarmNode;

/* Bind a loopback socket to port (0: any) and close it: the port bound,
 * or 0 if it was taken. */
static uint16_t probe_port(uint16_t port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;
        bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
                  getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
        if (fd >= 0)
                close(fd);
        return ok ? ntohs(sa.sin_port) : 0;
}

/* A port for a node to listen on, below the kernel's range of ephemeral
 * ports: the nodes' own outgoing connections take their source ports from
 * that range, and one could take a listening port picked there before its
 * node binds it. Not one of the ports given to nodes[0..n) already. */
static uint16_t free_port(const SwarmNode *nodes, unsigned n) {
        unsigned low = 32768, high = 60999;
        FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
        if (f) {
                if (fscanf(f, "%u %u", &low, &high) != 2)
                        low = 32768;
                fclose(f);
        }
        if (low > 20000 + 100)
                for (int i = 0; i < 200; i++) {
                        uint16_t port = (uint16_t)(20000 + randombytes_uniform(low - 20000));
                        bool taken = false;
                        for (unsigned k = 0; k < n && !taken; k++)
                                taken = nodes[k].pipe_port == port || nodes[k].avg_port == port;
                        if (!taken && probe_port(port))
                                return port;
                }
        return probe_port(0); /* no room below the range: let the kernel pick */
}

static int write_file(const char *path, const char *text, mode_t mode) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        if (fd < 0)
                return -errno;
        size_t n = strlen(text);
        ssize_t k = write(fd, text, n);
        close(fd);
        return k == (ssize_t)n ? 0 : -EIO;
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
                return r;
        for (unsigned i = 0; i < stages; i++)
                nodes[i] = (PartitionNode){ .gflops = 10, .memory = UINT64_MAX / 2 };
        r = partition_plan(&costs, nodes, (int)stages, bounds, &d);
        if (r < 0)
                return log_error_errno(r, "Cannot cut %s into %u stages: %s", job->name, stages, d.text);
        /* a stage without parameters has nothing to average: move the cut */
        for (unsigned i = 1; i < stages; i++)
                while (model_spec_params(&job->model, bounds[i - 1], bounds[i]) == 0 && bounds[i] < bounds[i + 1] - 1)
                        bounds[i]++;
        return 0;
}

static void print_line(SwarmNode *n, const char *line, SwarmResult *res) {
        const char *text = line;
        if (text[0] == '<' && text[1] && text[2] == '>')
                text += 3; /* the sd-daemon priority */
        const char *acc = strstr(text, "test accuracy ");
        if (acc && strstr(text, "Finished"))
                res->accuracy[n->cluster] = strtod(acc + 14, NULL);
        const char *busy = strstr(text, "busy ");
        if (busy && strstr(text, "Finished"))
                n->busy = strtod(busy + 5, NULL);
        const char *rate = acc ? strstr(acc, "), ") : NULL;
        if (rate && strstr(text, "Finished"))
                n->rate = strtod(rate + 3, NULL);
        const char *round = strstr(text, "Averaging round ");
        if (round && strstr(text, "done")) /* rounds are numbered: not every one has a line */
                n->rounds = MAX(n->rounds, (unsigned)strtoul(round + 16, NULL, 10));
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

int swarm_run(const SwarmOptions *o, const volatile sig_atomic_t *stop, SwarmResult *ret) {
        unsigned n = o->clusters * o->stages;
        SwarmNode nodes[MAX_NODES] = {};
        char dir[256], path[512];
        int bounds[MAX_NODES + 1], r;
        Job job;
        Diag d = {};

        if (o->clusters < 1 || o->stages < 1 || n > MAX_NODES)
                return log_error_errno(-EINVAL, "A swarm has 1 to %d nodes (clusters x stages)", MAX_NODES);
        r = job_load(o->job, &job, &d);
        if (r < 0)
                return log_error_errno(r, "Invalid job: %s", d.text);
        if ((int)o->stages > job.model.n_layers)
                return log_error_errno(-EINVAL, "%s has %d layers: at most that many stages", job.name,
                                       job.model.n_layers);
        if ((r = plan_cut(&job, o->stages, bounds)) < 0)
                return r;

        if (o->dir) {
                snprintf(dir, sizeof dir, "%s", o->dir);
                if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                        return log_error_errno(-errno, "Failed to create %s: %m", dir);
        } else {
                snprintf(dir, sizeof dir, "/tmp/ravnest-swarm-XXXXXX");
                if (!mkdtemp(dir))
                        return log_error_errno(-errno, "Failed to create a directory in /tmp: %m");
        }

        /* the network secret, then each node's key and ports */
        uint8_t secret[HANDSHAKE_SECRET_SIZE];
        char hex[2 * HANDSHAKE_SECRET_SIZE + 2];
        randombytes_buf(secret, sizeof secret);
        for (size_t i = 0; i < sizeof secret; i++)
                snprintf(hex + 2 * i, 3, "%02x", secret[i]);
        strcat(hex, "\n");
        snprintf(path, sizeof path, "%s/secret", dir);
        if ((r = write_file(path, hex, 0600)) < 0)
                return log_error_errno(r, "Failed to write %s: %m", path);
        for (unsigned i = 0; i < n; i++) {
                SwarmNode *nd = &nodes[i];
                Identity id;
                nd->busy = -1;
                bool created;
                nd->cluster = i / o->stages;
                nd->last_stage = i % o->stages == o->stages - 1;
                snprintf(nd->name, sizeof nd->name, "c%us%u", nd->cluster + 1, i % o->stages + 1);
                snprintf(path, sizeof path, "%s/%.15s", dir, nd->name);
                mkdir(path, 0700);
                snprintf(path, sizeof path, "%s/%.15s/identity", dir, nd->name);
                if ((r = identity_load_or_create(path, &id, &created, &d)) < 0)
                        return log_error_errno(r, "Failed to create a key: %s", d.text);
                identity_to_hex(id.pk, nd->hex);
                identity_clear(&id);
                nd->pipe_port = free_port(nodes, i);
                nd->avg_port = free_port(nodes, i + 1);
                nd->out = -1;
                if (!nd->pipe_port || !nd->avg_port)
                        return log_error_errno(-EADDRNOTAVAIL, "No free port on loopback");
        }

        /* as many samples per update as the job's batch, by default */
        int uf = o->update_frequency > 0 ? o->update_frequency : MAX(job.train.batch_size / o->micro_batch, 1);

        /* one configuration per node: the same plan everywhere */
        size_t cap = 4096 + (size_t)n * 512;
        char *conf = malloc(cap), *plan = malloc(cap), *members = malloc(cap);
        if (!conf || !plan || !members) {
                free(conf);
                free(plan);
                free(members);
                return log_error_errno(-ENOMEM, "Out of memory");
        }
        size_t k = 0;
        for (unsigned c = 0; c < o->clusters; c++) {
                k += (size_t)snprintf(plan + k, cap - k, "    { nodes = [");
                for (unsigned s = 0; s < o->stages; s++) {
                        SwarmNode *nd = &nodes[c * o->stages + s];
                        k += (size_t)snprintf(plan + k, cap - k, "%s\"%s@127.0.0.1:%u\"", s ? ", " : " ", nd->hex,
                                              nd->pipe_port);
                }
                k += (size_t)snprintf(plan + k, cap - k, " ];\n      stages = [");
                for (unsigned s = 0; s <= o->stages; s++)
                        k += (size_t)snprintf(plan + k, cap - k, "%s%d", s ? ", " : " ", bounds[s]);
                k += (size_t)snprintf(plan + k, cap - k, " ]; }%s\n", c + 1 < o->clusters ? "," : "");
        }
        k = 0;
        for (unsigned i = 0; i < n; i++)
                k += (size_t)snprintf(members + k, cap - k, "%s\"%s@127.0.0.1:%u\"", i ? ",\n    " : "    ",
                                      nodes[i].hex, nodes[i].avg_port);
        for (unsigned i = 0; i < n; i++) {
                SwarmNode *nd = &nodes[i];
                snprintf(conf, cap,
                         "# generated by ravnestctl swarm: node %.15s\n"
                         "state_directory = \"%s/%.15s\";\n"
                         "threads = 1;\n"
                         "control_socket = \"%s/%.15s.sock\";\n"
                         "idle = { enabled = false; };  # the swarm's nodes keep each other busy\n"
                         "checkpoint = { interval = 0; load = false; };  # every swarm starts afresh\n"
                         "network = { secret_file = \"%s/secret\"; };\n"
                         "pipeline = {\n"
                         "  micro_batch = %d;\n  staleness = %d;\n  update_frequency = %d;\n  schedule = \"%s\";\n"
                         "  listen = \"127.0.0.1:%u\";\n"
                         "  clusters = (\n%s  );\n"
                         "};\n",
                         nd->name, dir, nd->name, dir, nd->name, dir, o->micro_batch, o->staleness, uf,
                         o->synchronous ? "sync" : "async", nd->pipe_port, plan);
                if (o->clusters > 1) { /* one cluster has nothing to average with */
                        size_t used = strlen(conf);
                        snprintf(conf + used, cap - used,
                                 "averaging = {\n"
                                 "  interval = %.3f;\n"
                                 "  listen = \"127.0.0.1:%u\";\n"
                                 "  members = [\n%s\n  ];\n"
                                 "};\n",
                                 o->interval, nd->avg_port, members);
                }
                snprintf(path, sizeof path, "%s/%.15s.conf", dir, nd->name);
                if ((r = write_file(path, conf, 0644)) < 0)
                        break;
        }
        free(conf);
        free(plan);
        free(members);
        if (r < 0)
                return log_error_errno(r, "Failed to write %s: %m", path);

        printf("swarm: %u clusters x %u stages of %s in %s; micro-batch %d, %s, %d micro-batches per update; "
               "layers per stage:", o->clusters, o->stages, job.name, dir, o->micro_batch,
               o->synchronous ? "synchronous" : "asynchronous", o->synchronous ? o->staleness : uf);
        for (unsigned s = 0; s < o->stages; s++)
                printf(" %d-%d", bounds[s], bounds[s + 1] - 1);
        printf("\n");
        fflush(stdout);

        /* start the nodes, last stages first so the links find them listening */
        for (unsigned j = 0; j < n; j++) {
                unsigned i = n - 1 - j;
                SwarmNode *nd = &nodes[i];
                int fds[2];
                char conf_path[512], epochs[16], progress[16];
                if (pipe2(fds, O_CLOEXEC) < 0)
                        return log_error_errno(-errno, "pipe: %m");
                snprintf(conf_path, sizeof conf_path, "%s/%.15s.conf", dir, nd->name);
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
                nd->out = fds[0];
                printf("swarm: started %s (pid %d)\n", nd->name, (int)nd->pid);
        }
        fflush(stdout);

        SwarmResult res = { .clusters = o->clusters };
        for (unsigned c = 0; c < o->clusters; c++)
                res.accuracy[c] = -1;
        bool stopping = false;
        unsigned running = n;
        while (running) {
                if (*stop && !stopping) {
                        stopping = true;
                        printf("swarm: stopping every node\n");
                        for (unsigned i = 0; i < n; i++)
                                if (!nodes[i].done)
                                        kill(nodes[i].pid, SIGTERM);
                }
                struct pollfd pfd[MAX_NODES];
                unsigned map[MAX_NODES], np = 0;
                for (unsigned i = 0; i < n; i++)
                        if (nodes[i].out >= 0) {
                                pfd[np] = (struct pollfd){ .fd = nodes[i].out, .events = POLLIN };
                                map[np++] = i;
                        }
                if (np && poll(pfd, np, 200) > 0)
                        for (unsigned i = 0; i < np; i++)
                                if (pfd[i].revents)
                                        drain(&nodes[map[i]], &res);
                for (unsigned i = 0; i < n; i++) {
                        int status;
                        struct rusage ru;
                        if (!nodes[i].done && nodes[i].out < 0 &&
                            wait4(nodes[i].pid, &status, WNOHANG, &ru) == nodes[i].pid) {
                                nodes[i].rss_kib = ru.ru_maxrss;
                                nodes[i].done = true;
                                running--;
                                bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                                if (!clean && (stopping || o->keep_going))
                                        printf("swarm: %s ended with %s %d\n", nodes[i].name,
                                               WIFEXITED(status) ? "status" : "signal",
                                               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                                if (!clean && !stopping && o->keep_going)
                                        r = -ECHILD;
                                else if (!clean && !stopping) {
                                        printf("swarm: %s ended with %s %d; stopping the others\n", nodes[i].name,
                                               WIFEXITED(status) ? "status" : "signal",
                                               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                                        stopping = true;
                                        for (unsigned j = 0; j < n; j++)
                                                if (!nodes[j].done)
                                                        kill(nodes[j].pid, SIGTERM);
                                        r = -ECHILD;
                                }
                        }
                }
        }

        printf("swarm: node   busy  peak RSS\n");
        for (unsigned i = 0; i < n; i++) {
                res.busy[i] = nodes[i].busy;
                res.rss_mib[i] = (double)nodes[i].rss_kib / 1024;
                res.rounds += nodes[i].rounds;
                if (nodes[i].last_stage)
                        res.samples_per_sec += nodes[i].rate;
                char busy[16] = "-"; /* a node stopped before its last line has no figure */
                if (nodes[i].busy >= 0)
                        snprintf(busy, sizeof busy, "%.0f%%", MIN(MAX(nodes[i].busy, 0.0), 100.0));
                printf("swarm: %-5s %5s %5.0f MiB\n", nodes[i].name, busy, res.rss_mib[i]);
        }
        bool same = o->clusters > 1;
        for (unsigned c = 0; c < o->clusters; c++) {
                if (res.accuracy[c] >= 0)
                        printf("swarm: cluster %u: test accuracy %.2f%%\n", c + 1, res.accuracy[c]);
                same &= res.accuracy[c] >= 0 && res.accuracy[c] == res.accuracy[0];
        }
        if (same)
                printf("swarm: the averaged model (every cluster's replica after the last round): test accuracy "
                       "%.2f%%\n", res.accuracy[0]);
        printf("swarm: %.0f samples/s, all clusters together\n", res.samples_per_sec);
        printf("swarm: %u averaging rounds done across the nodes\n", res.rounds);
        if (!o->keep && !o->dir) {
                char cmd[300];
                snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
                if (system(cmd) != 0)
                        log_warning("Failed to remove %s", dir);
        }
        if (ret)
                *ret = res;
        if (*stop)
                return -ECANCELED;
        return r < 0 ? r : 0;
}
