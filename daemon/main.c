/* ravnestd — donate idle compute to training one neural network together.
 *
 * main() reads the options and the configuration; service/daemon.c runs the
 * control loop and the compute thread. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sysexits.h>
#include <unistd.h>

#include "conf/config.h"
#include "conf/job.h"
#include "conf/option.h"
#include "run/node.h"
#include "service/daemon.h"
#include "tensor/ops.h"
#include "util/log.h"

static void help(void) {
        printf("Usage: ravnestd [OPTIONS]\n"
               "\n"
               "Train a neural network with the compute this machine donates.\n"
               "\n"
               "  -c, --config=FILE     configuration (default %s)\n"
               "      --check-config    check the configuration and the job, then exit\n"
               "  -j, --job=FILE        job to train (default: the configuration's job)\n"
               "  -t, --threads=N       compute threads, 1..256 (default: the configuration's, else online CPUs)\n"
               "  -e, --epochs=N        override the job's number of epochs, 1..1000000\n"
               "  -d, --data-dir=DIR    override the job's dataset directory\n"
               "      --check-job       check the job file, print it and exit\n"
               "      --progress=MS     progress line interval in ms, 0..1000000 (0: epochs only; default 1000)\n"
               "      --no-idle         train whatever the machine's load (no idle detection)\n"
               "      --control-socket=PATH\n"
               "                        serve status and control on PATH (\"none\": not at all; default: the\n"
               "                        configuration's, %s)\n"
               "  -v, --verbose         log debug messages\n"
               "  -h, --help            show this help\n"
               "      --version         show the version\n",
               CONFIG_PATH, CONFIG_CONTROL_SOCKET);
}

/* What the command line asks for. */
typedef struct Args {
        const char *job_path, *config_path, *control_socket;
        LocalRunOptions run;
        bool check_job, check_config, no_idle;
} Args;

/* The options into a: -1 to go on, else the exit status. */
static int parse_args(int argc, char *argv[], Args *a) {
        enum { ARG_VERSION = 0x100, ARG_CHECK_JOB, ARG_CHECK_CONFIG, ARG_PROGRESS, ARG_NO_IDLE, ARG_CONTROL_SOCKET };
        static const struct option options[] = {
                { "config", required_argument, NULL, 'c' },
                { "check-config", no_argument, NULL, ARG_CHECK_CONFIG },
                { "job", required_argument, NULL, 'j' },
                { "threads", required_argument, NULL, 't' },
                { "epochs", required_argument, NULL, 'e' },
                { "data-dir", required_argument, NULL, 'd' },
                { "check-job", no_argument, NULL, ARG_CHECK_JOB },
                { "progress", required_argument, NULL, ARG_PROGRESS },
                { "no-idle", no_argument, NULL, ARG_NO_IDLE },
                { "control-socket", required_argument, NULL, ARG_CONTROL_SOCKET },
                { "verbose", no_argument, NULL, 'v' },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                {},
        };
        long long v = 0;
        int c;

        while ((c = getopt_long(argc, argv, "c:j:t:e:d:vh", options, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case 'c': a->config_path = optarg; break;
                case ARG_CHECK_CONFIG: a->check_config = true; break;
                case 'j': a->job_path = optarg; break;
                case 't': r = option_int("threads", optarg, 1, 256, &v); a->run.threads = (int)v; break;
                case 'e': r = option_int("epochs", optarg, 1, 1000000, &v); a->run.epochs = (int)v; break;
                case ARG_PROGRESS:
                        r = option_int("progress", optarg, 0, 1000000, &v);
                        a->run.progress_interval_ms = (unsigned)v;
                        break;
                case 'd': a->run.data_dir = optarg; break;
                case ARG_CHECK_JOB: a->check_job = true; break;
                case ARG_NO_IDLE: a->no_idle = true; break;
                case ARG_CONTROL_SOCKET:
                        if (strcmp(optarg, "none") && (optarg[0] != '/' || strlen(optarg) >= 108)) {
                                log_error("Invalid value for --control-socket: %s (an absolute path%s, or \"none\")",
                                          optarg, optarg[0] == '/' ? " of at most 107 bytes, a socket's limit" : "");
                                return EX_USAGE;
                        }
                        a->control_socket = optarg;
                        break;
                case 'v': log_set_max_level(LOG_DEBUG); break;
                case 'h': help(); return 0;
                case ARG_VERSION: printf("ravnestd %s\n", RAVNEST_VERSION); return 0;
                default: return EX_USAGE;
                }
                if (r < 0)
                        return EX_USAGE;
        }
        if (optind < argc) {
                log_error("Unexpected argument: %s", argv[optind]);
                return EX_USAGE;
        }
        return -1;
}

/* The configuration file, or the defaults when the default file is absent
 * (a file named on the command line must exist). */
static int load_config(const Args *a, Config *config) {
        Diag d = {};
        int r = config_load(a->config_path ?: CONFIG_PATH, config, &d);
        if (r == -ENOENT && !a->config_path) {
                config_defaults(config);
                r = 0;
        }
        if (r < 0) { /* every error, one per line */
                for (char *save = NULL, *line = strtok_r(d.text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
                        log_error_errno(r, "Invalid configuration: %s", line);
                return r;
        }
        if (a->control_socket)
                snprintf(config->control_socket, sizeof config->control_socket, "%s",
                         strcmp(a->control_socket, "none") ? a->control_socket : "");
        return 0;
}

/* --check-config, --check-job: the job, and its data as the daemon checks
 * it before training. A configuration without a network leaves the node
 * unconfigured, and such a node loads no job: the default job missing is
 * no error there, as it is none for the daemon (unless --check-job asks
 * for it). The exit status. */
static int check(const Args *a, const Config *config) {
        const char *job_path = a->job_path ?: config->job;
        bool loads_job = !a->check_config || a->check_job || a->job_path || node_configured(config);
        Job job;
        Diag d = {};
        int r;

        int loaded = job_load(job_path, &job, &d);
        if (loaded < 0 && (loads_job || loaded != -ENOENT)) {
                log_error_errno(loaded, "Invalid job: %s", d.text);
                return EX_CONFIG;
        }
        if (a->check_config && ((loaded >= 0 && (r = config_check_job(config, &job, &d)) < 0) ||
                                (config->path[0] && (r = config_check_state_directory(config, &d)) < 0))) {
                log_error_errno(r, "Invalid configuration: %s", d.text);
                return EX_CONFIG;
        }
        if (loaded < 0) { /* not there, and not loaded by an unconfigured node */
                printf("configuration OK (%s): no network, so the node is unconfigured and loads no job (%s is not "
                       "there)\n", config->path[0] ? config->path : "defaults", job_path);
                return 0;
        }
        r = job_check_data(&job, a->run.data_dir, &d);
        if (r == -ENOENT)
                log_notice("The job's data is not there to check: %s", d.text);
        else if (r < 0)
                return daemon_log_data_error(r, &d) == -EINVAL ? EX_CONFIG : EXIT_FAILURE;
        if (a->check_config)
                printf("configuration OK (%s), job \"%s\" OK (%s)\n", config->path[0] ? config->path : "defaults",
                       job.name, job_path);
        else
                printf("%s: job \"%s\" OK: %d layers, %zu parameters\n", job_path, job.name, job.model.n_layers,
                       model_spec_params(&job.model, 0, job.model.n_layers));
        return 0;
}

/* A coordinator holds a link to every member, a thousand and more, and
 * each is a descriptor: the soft limit on open files (often 1024) goes up
 * to the hard one. Nothing here uses select(). Under systemd the unit's
 * LimitNOFILE= sets both (its seccomp filter refuses setrlimit()). */
static void raise_open_files(void) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
                return;
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                log_full_errno(LOG_DEBUG, -errno, "Failed to raise the limit on open files from %llu: %m",
                               (unsigned long long)was);
}

int main(int argc, char *argv[]) {
        Args a = { .run = { .progress_interval_ms = 1000 } };
        static Config config;
        static Daemon daemon;
        int r;

        if ((r = ops_blas_exec_without_threads(argv)) < 0)
                log_full_errno(LOG_DEBUG, r, "Failed to start again without OpenBLAS's threads: %m");
        if ((r = parse_args(argc, argv, &a)) >= 0)
                return r;
        if (load_config(&a, &config) < 0)
                return EX_CONFIG;
        if (a.check_config || a.check_job) {
                r = check(&a, &config);
                config_free(&config);
                return r;
        }
        raise_open_files();
        DaemonOptions opts = { .job_path = a.job_path, .standalone = a.job_path != NULL, .no_idle = a.no_idle,
                               .run = a.run };
        daemon_init(&daemon, &config, &opts);
        return daemon_run(&daemon);
}
