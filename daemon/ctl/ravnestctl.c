/* ravnestctl — inspect and control ravnest.
 *
 * Describe a job (layers, shapes, parameters, memory), print a node's key,
 * start a whole swarm on this machine, and show and steer the local node
 * (status, pause, resume, checkpoint). */
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "net/identity.h"
#include "nn/stage.h"
#include "conf/config.h"
#include "ctl-common.h"
#include "ctl-model.h"
#include "ctl-node.h"
#include "ctl-plan.h"
#include "ctl-plot.h"
#include "ctl-predict.h"
#include "ctl-top.h"
#include "conf/job.h"
#include "conf/option.h"
#include "swarm.h"
#include "tensor/ops.h"
#include "util/log.h"

/* The job's model against its data, as the daemon checks it before it
 * trains: 0, with *ret_note saying why not when none of the data set's
 * files is on this machine, or the exit status of a refusal. A data set
 * of which some files are there and one is missing is broken, as the
 * daemon would find it. */
static int check_job_data(const Job *job, Diag *d, const char **ret_note) {
        int r = job_check_data(job, NULL, d);
        *ret_note = NULL;
        if (r == -ENOENT) { /* none of it on this machine (job_check_data()) */
                *ret_note = d->text;
                return 0;
        }
        if (r < 0) { /* the model does not fit the data (78), or the files are broken (1) */
                fprintf(stderr, "%s: %s\n", r == -EINVAL ? "Invalid job" : "Unusable dataset", d->text);
                return r == -EINVAL ? EX_CONFIG : EXIT_FAILURE;
        }
        return 0;
}

/* Parameters, gradients, optimizer state, and the activation memory of one
 * batch as the daemon sizes it for the whole model trained alone
 * (model_trace_bytes(): outputs, what the backward pass keeps, the
 * gradients between layers and the layers' scratch; a batch larger than
 * the data takes what the data's samples need). */
static void print_memory(const Job *job) {
        size_t n_params = model_spec_params(&job->model, 0, job->model.n_layers);
        size_t state = optim_state_floats(job->optim.kind, n_params);
        size_t acts = model_trace_bytes(&job->model, job->train.batch_size);
        printf("\nparameters %zu (%.2f MiB), gradients the same, %s state %.2f MiB\n", n_params,
               n_params * 4.0 / (1 << 20), optim_kind_to_string(job->optim.kind), state * 4.0 / (1 << 20));
        printf("activation memory per batch of %d (outputs, what the backward pass keeps, gradients "
               "between layers, scratch): %.2f MiB (%zu bytes)\n",
               job->train.batch_size, (double)acts / (1 << 20), acts);
}

static int describe_job(const char *path) {
        Layer layers[MODEL_MAX_LAYERS];
        const char *data_note;
        Job job;
        Diag d = {};
        int r;

        r = job_load(path, &job, &d);
        if (r < 0 || (r = model_spec_check(&job.model, layers, &d)) < 0) {
                fprintf(stderr, "%s\n", d.text);
                return EX_CONFIG;
        }
        if ((r = check_job_data(&job, &d, &data_note)) != 0)
                return r;

        printf("job %s (%s)\n", job.name, path);
        printf("dataset %s, %d classes, from %s\n", job.data.name, job.data.classes, job.data.path);
        if (data_note)
                printf("data not there to check: %s\n", data_note);
        else
                printf("the model fits the data there (shapes and labels of both splits)\n");
        printf("\n%-3s %-10s %-16s %-16s %12s\n", "#", "layer", "input", "output", "parameters");
        for (int i = 0; i < job.model.n_layers; i++) {
                const Layer *l = &layers[i];
                char in[32], out[32];
                snprintf(in, sizeof in, "%dx%dx%d", l->in.c, l->in.h, l->in.w);
                snprintf(out, sizeof out, "%dx%dx%d", l->out.c, l->out.h, l->out.w);
                printf("%-3d %-10s %-16s %-16s %12zu\n", i + 1, layer_kind_to_string(l->kind), in,
                       out, l->n_params);
        }
        print_memory(&job);
        printf("optimizer %s lr %g, batch %d, %d epochs, seed %llu\n",
               optim_kind_to_string(job.optim.kind), (double)job.optim.lr, job.train.batch_size,
               job.train.epochs, (unsigned long long)job.train.seed);
        return 0;
}

/* The node's public key, for other nodes' allowlists (created if absent,
 * as ravnestd would on its first start). */
static int show_identity(const char *state_dir) {
        char dir[PATH_MAX], path[PATH_MAX + 16], hex[IDENTITY_HEX_SIZE];
        Identity id;
        bool created;
        Diag d = {};
        Config c;

        if (!state_dir) {
                int r = config_load(CONFIG_PATH, &c, &d);
                if (r == -ENOENT)
                        config_defaults(&c);
                else if (r < 0) {
                        fprintf(stderr, "%s\n", d.text);
                        return EX_CONFIG;
                }
                snprintf(dir, sizeof dir, "%s", c.state_directory);
                config_free(&c);
        } else
                snprintf(dir, sizeof dir, "%s", state_dir);
        snprintf(path, sizeof path, "%s/identity", dir);
        /* the state directory, as the daemon makes it (its parent must be there) */
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
                fprintf(stderr, "%s: cannot create: %m\n", dir);
                return 1;
        }

        if (identity_load_or_create(path, &id, &created, &d) < 0) {
                fprintf(stderr, "%s\n", d.text);
                return 1;
        }
        identity_to_hex(id.pk, hex);
        identity_clear(&id);
        if (created && geteuid() == 0) {
                /* root asked before the daemon's first start: the key
                 * belongs to whoever owns the state directory (the user
                 * ravnest, from StateDirectory=), or the daemon could not
                 * read it. */
                struct stat st;
                if (stat(dir[0] ? dir : "/", &st) == 0 && st.st_uid != 0 &&
                    chown(path, st.st_uid, st.st_gid) < 0) {
                        fprintf(stderr, "cannot give %s to uid %u: %m\n", path, (unsigned)st.st_uid);
                        return 1;
                }
        }
        printf("%s\n", hex);
        if (created)
                fprintf(stderr, "created %s\n", path);
        return 0;
}

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig) {
        stop_requested = sig;
}

/* ravnestd beside this binary (a build tree), else the installed one. */
static void find_ravnestd(char *out, size_t n) {
        char self[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        if (k > 0) {
                self[k] = 0;
                char *slash = strrchr(self, '/');
                if (slash) {
                        *slash = 0;
                        snprintf(out, n, "%s/ravnestd", self);
                        if (access(out, X_OK) == 0)
                                return;
                }
        }
        snprintf(out, n, "%s/ravnestd", SBIN_DIR);
}

static void swarm_usage(FILE *f) {
        fprintf(f, "Usage: ravnestctl swarm [OPTIONS]\n"
                   "\n"
                   "Start CLUSTERS x STAGES ravnestd processes on loopback and train a job; Ctrl-C stops them.\n"
                   "\n"
                   "  --clusters N          clusters, 1 to 64 (default 2)\n"
                   "  --stages N            pipeline stages per cluster, 1 to 64 (default 2; at most 64 nodes)\n"
                   "  --job FILE            the job (default %s)\n"
                   "  --epochs N            epochs of each cluster's shard, 1 to 1000000 (default: the job's)\n"
                   "  --data-dir DIR        the dataset (default: the job's)\n"
                   "  --micro-batch N       samples per micro-batch, 1 to 65536 (default: the job's batch, at most 32)\n"
                   "  --staleness N         micro-batches in flight, 1 to 1024 (default 4)\n"
                   "  --update-frequency N  micro-batches per update, 1 to 1024 (default: the job's batch over the\n"
                   "                        micro-batch)\n"
                   "  --sync                the synchronous schedule\n"
                   "  --interval S          seconds between averaging rounds, 0.05 to 86400 (default 0.25)\n"
                   "  --averaging SETTINGS  more settings of each node's averaging group (ravnestd.conf(5)), e.g.\n"
                   "                        'interval_steps = 100; outer = { lr = 0.7; momentum = 0.9; };'\n"
                   "  --pipeline SETTINGS   more settings of each node's pipeline (ravnestd.conf(5)), e.g.\n"
                   "                        'weight_prediction = false;'\n"
                   "  --progress MS         progress lines every MS ms, 0 to 1000000 (default 2000; 0: none)\n"
                   "  --dir DIR             keys and configurations there, kept\n"
                   "  --keep                keep the generated directory\n"
                   "  --keep-going          a node that fails does not stop the others\n"
                   "  --restart             a node that fails is started again (at most 5 times), from its checkpoint\n"
                   "  --resume              with --dir: go on from the checkpoints an earlier swarm left there\n"
                   "  --checkpoint-interval S\n"
                   "                        seconds between each node's checkpoints, 0 to 604800 (default 10)\n"
                   "  --neighbour-timeout S a stage gives up on a neighbour gone this long, 0 to 604800 (default 600;\n"
                   "                        0: never)\n"
                   "  --pin                 node i on CPU i modulo the CPUs\n"
                   "  --behind-nat NODES    these nodes (e.g. c1s2,c2s1) accept no connections, as behind NAT: they\n"
                   "                        dial every link themselves\n"
                   "  --relay               relay links between two such nodes (in this process, on loopback)\n"
                   "  --ravnestd PATH       the daemon to start (default: beside ravnestctl, else %s/ravnestd)\n"
                   "  -h, --help            show this help\n",
                JOBS_DIR "/fashion-mnist-mlp.job", SBIN_DIR);
}

/* The swarm's options into o: -1 to go on, else the exit status. */
static int parse_swarm_args(int argc, char *argv[], SwarmOptions *o) {
        static const struct option options[] = {
                { "clusters", required_argument, NULL, 'c' },
                { "stages", required_argument, NULL, 's' },
                { "job", required_argument, NULL, 'j' },
                { "epochs", required_argument, NULL, 'e' },
                { "data-dir", required_argument, NULL, 'd' },
                { "micro-batch", required_argument, NULL, 'm' },
                { "staleness", required_argument, NULL, 't' },
                { "update-frequency", required_argument, NULL, 'u' },
                { "sync", no_argument, NULL, 'S' },
                { "interval", required_argument, NULL, 'i' },
                { "averaging", required_argument, NULL, 'A' },
                { "pipeline", required_argument, NULL, 'L' },
                { "progress", required_argument, NULL, 'p' },
                { "dir", required_argument, NULL, 'D' },
                { "keep", no_argument, NULL, 'k' },
                { "keep-going", no_argument, NULL, 'K' },
                { "restart", no_argument, NULL, 'R' },
                { "resume", no_argument, NULL, 'E' },
                { "neighbour-timeout", required_argument, NULL, 'N' },
                { "checkpoint-interval", required_argument, NULL, 'C' },
                { "pin", no_argument, NULL, 'P' },
                { "behind-nat", required_argument, NULL, 'B' },
                { "relay", no_argument, NULL, 'Y' },
                { "ravnestd", required_argument, NULL, 'r' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        long long v = 0;
        int c;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case 'c': r = option_int("clusters", optarg, 1, 64, &v); o->clusters = (unsigned)v; break;
                case 's': r = option_int("stages", optarg, 1, 64, &v); o->stages = (unsigned)v; break;
                case 'j': o->job = optarg; break;
                case 'e': r = option_int("epochs", optarg, 1, 1000000, &v); o->epochs = (int)v; break;
                case 'd': o->data_dir = optarg; break;
                case 'm': r = option_int("micro-batch", optarg, 1, 65536, &v); o->micro_batch = (int)v; break;
                case 't': r = option_int("staleness", optarg, 1, 1024, &v); o->staleness = (int)v; break;
                case 'u': r = option_int("update-frequency", optarg, 1, 1024, &v); o->update_frequency = (int)v; break;
                case 'S': o->synchronous = true; break;
                case 'i': r = option_double("interval", optarg, 0.05, 86400, &o->interval); break;
                case 'A': o->averaging = optarg; break;
                case 'L': o->pipeline = optarg; break;
                case 'p': r = option_int("progress", optarg, 0, 1000000, &v); o->progress_ms = (unsigned)v; break;
                case 'D': o->dir = optarg; break;
                case 'k': o->keep = true; break;
                case 'K': o->keep_going = true; break;
                case 'R': o->restart = true; break;
                case 'E': o->resume = true; break;
                case 'N':
                        r = option_int("neighbour-timeout", optarg, 0, 7 * 86400, &v);
                        o->neighbour_timeout_s = (unsigned)v;
                        break;
                case 'C':
                        r = option_int("checkpoint-interval", optarg, 0, 7 * 86400, &v);
                        o->checkpoint_interval_s = (unsigned)v;
                        break;
                case 'P': o->pin = true; break;
                case 'B': o->behind_nat = optarg; break;
                case 'Y': o->relay = true; break;
                case 'r': o->ravnestd = optarg; break;
                case 'h': swarm_usage(stdout); return 0;
                default: swarm_usage(stderr); return EX_USAGE;
                }
                if (r < 0)
                        return EX_USAGE;
        }
        int r = ctl_operands("swarm", argc, argv, 0, 0, NULL);
        if (r >= 0)
                return r;
        if (o->resume && !o->dir) {
                fprintf(stderr, "ravnestctl swarm: --resume goes on from an earlier swarm's --dir: give it\n");
                return EX_USAGE;
        }
        /* the nodes' configurations name it, and a state directory must be
         * absolute: a relative --dir is taken from here */
        static char dir[PATH_MAX];
        char cwd[PATH_MAX];
        if (o->dir && o->dir[0] != '/') {
                if (!getcwd(cwd, sizeof cwd) || snprintf(dir, sizeof dir, "%s/%s", cwd, o->dir) >= (int)sizeof dir) {
                        fprintf(stderr, "ravnestctl swarm: --dir %s: cannot make it absolute\n", o->dir);
                        return EX_USAGE;
                }
                o->dir = dir;
        }
        if (o->averaging && o->clusters == 1) {
                fprintf(stderr, "ravnestctl swarm: --averaging: one cluster has nothing to average with (give "
                        "--clusters 2 or more)\n");
                return EX_USAGE;
        }
        if (o->clusters * o->stages > 64) {
                fprintf(stderr, "Invalid values for --clusters and --stages: %u x %u nodes (a swarm has at most 64)\n",
                        o->clusters, o->stages);
                return EX_USAGE;
        }
        if (swarm_check_behind_nat(o) < 0)
                return EX_USAGE;
        return -1;
}

/* The daemon the swarm starts is an executable file, before anything is
 * made or started: 0, or 66 (said). given: --ravnestd named it. */
static int check_ravnestd(const char *path, bool given) {
        struct stat st;
        if (stat(path, &st) < 0)
                fprintf(stderr, given ? "ravnestctl swarm: --ravnestd %s: %m\n" :
                                        "ravnestctl swarm: no ravnestd beside ravnestctl or at %s: give --ravnestd PATH\n",
                        path);
        else if (!S_ISREG(st.st_mode) || access(path, X_OK) < 0)
                fprintf(stderr, "ravnestctl swarm: %s%s is not an executable file\n", given ? "--ravnestd " : "", path);
        else
                return 0;
        return EX_NOINPUT;
}

/* Ctrl-C and SIGTERM stop the swarm, whatever the caller had blocked. */
static void catch_stop_signals(void) {
        struct sigaction sa = { .sa_handler = on_stop };
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigset_t stop_signals; /* whoever started us may have blocked them; the nodes inherit this */
        sigemptyset(&stop_signals);
        sigaddset(&stop_signals, SIGINT);
        sigaddset(&stop_signals, SIGTERM);
        sigprocmask(SIG_UNBLOCK, &stop_signals, NULL);
}

static int swarm(int argc, char *argv[]) {
        char ravnestd[PATH_MAX + 16];
        SwarmOptions o = { .clusters = 2, .stages = 2, .job = JOBS_DIR "/fashion-mnist-mlp.job",
                           .staleness = 4, .interval = 0.25, .progress_ms = 2000, .neighbour_timeout_s = 600,
                           .checkpoint_interval_s = 10, .ravnestd = ravnestd };
        int r;

        find_ravnestd(ravnestd, sizeof ravnestd);
        if ((r = parse_swarm_args(argc, argv, &o)) >= 0 || (r = check_ravnestd(o.ravnestd, o.ravnestd != ravnestd)))
                return r;
        catch_stop_signals();
        r = swarm_run(&o, &stop_requested, NULL);
        return r == -ECANCELED ? 130 : r == -EINVAL ? EX_CONFIG : r < 0 ? EXIT_FAILURE : 0;
}

/* The commands without options: -h and --help print usage, any other option
 * or a wrong number of arguments (min_args to max_args; the first is called
 * operand in the usage) is a usage error; then the command. */
static int simple_command(int argc, char *argv[], const char *usage, int min_args, int max_args,
                          const char *operand) {
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                if (c == 'h') {
                        printf("Usage: %s\n", usage);
                        return 0;
                } else {
                        fprintf(stderr, "Usage: %s\n", usage);
                        return EX_USAGE;
                }
        int n = argc - optind, r = ctl_operands(argv[0], argc, argv, min_args, max_args, operand);
        if (r >= 0) {
                fprintf(stderr, "Usage: %s\n", usage);
                return r;
        }
        if (!strcmp(argv[0], "job"))
                return describe_job(argv[optind]);
        if (!strcmp(argv[0], "identity") && n && !argv[optind][0]) {
                fprintf(stderr, "ravnestctl identity: STATE_DIR is empty\n");
                return EX_USAGE;
        }
        if (!strcmp(argv[0], "identity"))
                return show_identity(n ? argv[optind] : NULL);
        printf("ravnestctl %s\n", RAVNEST_VERSION);
        return 0;
}

/* The commands, each with every option it takes (but swarm's and
 * predict's, which ravnestctl swarm --help and predict --help list). */
static void help(FILE *f) {
        fprintf(f, "Usage: ravnestctl COMMAND [ARGS]\n"
                   "\n"
                   "Commands:\n"
                   "  job FILE     describe a job: layers, shapes, parameters, memory\n"
                   "  plan NODES_FILE [--job FILE] [--json] [--seed N] [--micro-batch N] [--staleness N]\n"
                   "               [--similarity W]\n"
                   "               form clusters from a list of nodes (genetic algorithm) and\n"
                   "               cut the job's model in each; print the plan\n"
                   "  predict --compute-ms MS --bandwidth MBIT --nodes N (--params P | --job FILE) ...\n"
                   "  predict [--node] [--socket PATH] ...\n"
                   "               predict the time per iteration of all-reduce and of each gossip\n"
                   "               topology, and recommend one; without figures, from the local node's\n"
                   "  generate --job FILE --checkpoint FILE [--checkpoint FILE ...] [--prompt TEXT]\n"
                   "           [--tokens N] [--temperature X] [--seed S] [--logits]\n"
                   "               sample text from a trained language model\n"
                   "  export --job FILE --checkpoint FILE [--checkpoint FILE ...] --output FILE\n"
                   "               write a trained model's weights as safetensors\n"
                   "  identity [STATE_DIR]\n"
                   "               print this node's public key (for other nodes' allowed_peers),\n"
                   "               creating the key pair if there is none yet\n"
                   "  swarm [--clusters N] [--stages N] [--job FILE] [--epochs N] ...\n"
                   "               start a swarm of ravnestd processes on loopback (N clusters of N\n"
                   "               stages, keys and configs generated) and train the job; Ctrl-C stops it\n"
                   "  top [--socket PATH]... [--swarm DIR] [--interval S] [--iterations N]\n"
                   "               a live view of the local node, or of every node of a running swarm:\n"
                   "               state, step, loss, samples/s, busy, rounds, bytes/s, memory\n"
                   "  plot RUN_DIR [-o|--output FILE.svg]\n"
                   "               draw the series of every node under RUN_DIR (a swarm's directory, a\n"
                   "               state directory): loss and throughput over time, as SVG (and PNG)\n"
                   "  status [--json] [--socket PATH]\n"
                   "               the local node's state and progress (exit 0 while it is healthy)\n"
                   "  pause [--json] [--socket PATH], resume [--json] [--socket PATH]\n"
                   "               stop training for now, and go on (root)\n"
                   "  checkpoint [--json] [--socket PATH]\n"
                   "               write a checkpoint now and print its step (root)\n"
                   "               these four ask the system bus, then " CONFIG_CONTROL_SOCKET ";\n"
                   "               --socket PATH (or RAVNEST_SOCKET) names the node's socket instead\n"
                   "  version      show the version\n"
                   "  help         show this help\n"
                   "\n"
                   "Every command answers -h and --help with its usage.\n");
}

int main(int argc, char *argv[]) {
        struct rlimit as;
        /* OpenBLAS's own pool, started before main(), spins for ever under an
         * address-space limit too small for its buffers (ravnestd(8),
         * OPENBLAS_NUM_THREADS); without one, it only sleeps, and starting
         * again would double what every call of the tool costs */
        if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
                (void)ops_blas_exec_without_threads(argv); /* (on failure, with them) */
        /* a command's messages are read by people and scripts, never by
         * journald: no "<3>" before them, terminal or not */
        log_set_prefix(false);
        if (argc < 2) {
                fprintf(stderr, "ravnestctl: missing command\n");
                help(stderr);
                return EX_USAGE;
        }
        if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
                if (argc > 3 || (argc == 3 && strcmp(argv[2], "--help") && strcmp(argv[2], "-h"))) {
                        fprintf(stderr, "ravnestctl %s: unexpected argument \"%s\" (try ravnestctl COMMAND --help)\n",
                                argv[1], argv[2]);
                        return EX_USAGE;
                }
                help(stdout);
                return 0;
        }
        if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0)
                return simple_command(argc - 1, argv + 1, "ravnestctl version", 0, 0, NULL);
        if (strcmp(argv[1], "job") == 0)
                return simple_command(argc - 1, argv + 1, "ravnestctl job FILE", 1, 1, "FILE");
        if (strcmp(argv[1], "identity") == 0)
                return simple_command(argc - 1, argv + 1, "ravnestctl identity [STATE_DIR]", 0, 1, NULL);
        if (strcmp(argv[1], "swarm") == 0)
                return swarm(argc - 1, argv + 1);
        if (strcmp(argv[1], "plan") == 0)
                return ctl_plan(argc - 1, argv + 1);
        if (strcmp(argv[1], "top") == 0)
                return ctl_top(argc - 1, argv + 1);
        if (strcmp(argv[1], "plot") == 0)
                return ctl_plot(argc - 1, argv + 1);
        if (strcmp(argv[1], "predict") == 0)
                return ctl_predict(argc - 1, argv + 1);
        if (strcmp(argv[1], "generate") == 0)
                return ctl_generate(argc - 1, argv + 1);
        if (strcmp(argv[1], "export") == 0)
                return ctl_export(argc - 1, argv + 1);
        if (!strcmp(argv[1], "status") || !strcmp(argv[1], "pause") || !strcmp(argv[1], "resume") ||
            !strcmp(argv[1], "checkpoint"))
                return ctl_node(argc - 1, argv + 1);
        fprintf(stderr, "Unknown command \"%s\"; see ravnestctl help\n", argv[1]);
        return EX_USAGE;
}
