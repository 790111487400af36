/* ravnestd — donate idle compute to training one neural network together.
 *
 * For now the daemon runs the degenerate case of the system: one cluster of
 * one node that holds the whole model and trains the job alone. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <unistd.h>

#include "service/averaging.h"
#include "service/config.h"
#include "service/job.h"
#include "service/local-run.h"
#include "service/pipeline-run.h"
#include "service/node.h"
#include "util/log.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
        stop_requested = sig;
}

static void poll_node(void *userdata) {
        node_poll(userdata, 0);
}

static void step_averaging(void *userdata, float *params, uint64_t samples) {
        averaging_step(userdata, params, samples);
}

static void help(void) {
        printf("Usage: ravnestd [OPTIONS]\n"
               "\n"
               "Train a neural network with the compute this machine donates.\n"
               "\n"
               "  -c, --config=FILE     configuration (default %s)\n"
               "      --check-config    check the configuration and the job, then exit\n"
               "  -j, --job=FILE        job to train (default: the configuration's job)\n"
               "  -t, --threads=N       compute threads (default: the configuration's, else online CPUs)\n"
               "  -e, --epochs=N        override the job's number of epochs\n"
               "  -d, --data-dir=DIR    override the job's dataset directory\n"
               "      --check-job       check the job file, print it and exit\n"
               "      --progress=MS     progress line interval in ms (0: epochs only; default 1000)\n"
               "  -v, --verbose         log debug messages\n"
               "  -h, --help            show this help\n"
               "      --version         show the version\n",
               CONFIG_PATH);
}

int main(int argc, char *argv[]) {
        enum { ARG_VERSION = 0x100, ARG_CHECK_JOB, ARG_CHECK_CONFIG, ARG_PROGRESS };
        static const struct option options[] = {
                { "config", required_argument, NULL, 'c' },
                { "check-config", no_argument, NULL, ARG_CHECK_CONFIG },
                { "job", required_argument, NULL, 'j' },
                { "threads", required_argument, NULL, 't' },
                { "epochs", required_argument, NULL, 'e' },
                { "data-dir", required_argument, NULL, 'd' },
                { "check-job", no_argument, NULL, ARG_CHECK_JOB },
                { "progress", required_argument, NULL, ARG_PROGRESS },
                { "verbose", no_argument, NULL, 'v' },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                {},
        };
        const char *job_path = NULL, *config_path = NULL;
        LocalRunOptions o = { .progress_interval_ms = 1000 };
        bool check_only = false, check_config = false;
        static Config config;
        static Node node;
        static Averaging averaging;
        Job job;
        Diag d = {};
        int c, r;

        while ((c = getopt_long(argc, argv, "c:j:t:e:d:vh", options, NULL)) >= 0) {
                char *end;
                long v;
                switch (c) {
                case 'c':
                        config_path = optarg;
                        break;
                case ARG_CHECK_CONFIG:
                        check_config = true;
                        break;
                case 'j':
                        job_path = optarg;
                        break;
                case 't':
                case 'e':
                case ARG_PROGRESS:
                        errno = 0;
                        v = strtol(optarg, &end, 10);
                        if (errno || *end || v < (c == ARG_PROGRESS ? 0 : 1) || v > (c == 't' ? 256 : 1000000)) {
                                log_error("Invalid value for --%s: %s",
                                          c == 't' ? "threads" : c == 'e' ? "epochs" : "progress", optarg);
                                return EX_USAGE;
                        }
                        if (c == 't')
                                o.threads = (int)v;
                        else if (c == 'e')
                                o.epochs = (int)v;
                        else
                                o.progress_interval_ms = (unsigned)v;
                        break;
                case 'd':
                        o.data_dir = optarg;
                        break;
                case ARG_CHECK_JOB:
                        check_only = true;
                        break;
                case 'v':
                        log_set_max_level(LOG_DEBUG);
                        break;
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("ravnestd %s\n", RAVNEST_VERSION);
                        return 0;
                default:
                        return EX_USAGE;
                }
        }
        if (optind < argc) {
                log_error("Unexpected argument: %s", argv[optind]);
                return EX_USAGE;
        }

        /* The default configuration file may be absent: defaults then. A
         * file named on the command line must exist. */
        r = config_load(config_path ?: CONFIG_PATH, &config, &d);
        if (r == -ENOENT && !config_path) {
                config_defaults(&config);
                r = 0;
        }
        if (r < 0) {
                log_error_errno(r, "Invalid configuration: %s", d.text);
                return EX_CONFIG;
        }
        if (!job_path)
                job_path = config.job;
        if (o.threads == 0)
                o.threads = config.threads ? (int)config.threads : (int)MIN(sysconf(_SC_NPROCESSORS_ONLN), 256L);

        r = job_load(job_path, &job, &d);
        if (r < 0) {
                log_error_errno(r, "Invalid job: %s", d.text);
                return EX_CONFIG;
        }
        if (check_config) {
                printf("configuration OK (%s), job \"%s\" OK (%s)\n", config.path[0] ? config.path : "defaults",
                       job.name, job_path);
                return 0;
        }
        if (check_only) {
                printf("%s: job \"%s\" OK: %d layers, %zu parameters\n", job_path, job.name,
                       job.model.n_layers, model_spec_params(&job.model, 0, job.model.n_layers));
                return 0;
        }

        struct sigaction sa = { .sa_handler = on_stop_signal };
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        /* whoever started us may have blocked them */
        sigset_t stop_signals;
        sigemptyset(&stop_signals);
        sigaddset(&stop_signals, SIGINT);
        sigaddset(&stop_signals, SIGTERM);
        sigprocmask(SIG_UNBLOCK, &stop_signals, NULL);

        r = node_start(&node, &config);
        if (r < 0)
                return EXIT_FAILURE;
        o.poll = poll_node;
        o.poll_userdata = &node;
        if (config.pipeline.enabled) { /* a stage of a cluster: averaging is the pipeline's */
                r = pipeline_run(&config, &job, &node.identity, &o, &stop_requested);
                node_stop(&node);
                config_free(&config);
                if (r == -ECANCELED) {
                        log_notice("Received %s, stopped cleanly", strsignal(stop_requested));
                        return 0;
                }
                return r == -EINVAL ? EX_CONFIG : r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        }
        r = averaging_start(&averaging, &config, &node.identity,
                            model_spec_params(&job.model, 0, job.model.n_layers), NULL, 0);
        if (r < 0) {
                node_stop(&node);
                return r == -EINVAL ? EX_CONFIG : EXIT_FAILURE;
        }
        if (averaging.active) { /* every member trains its own shard of the data */
                o.step = step_averaging;
                o.step_userdata = &averaging;
                o.shard = (int)averaging.self;
                o.n_shards = (int)averaging.n_members;
        }

        r = local_run(&job, &o, &stop_requested, NULL);
        averaging_stop(&averaging);
        /* With a network, the node stays and serves its peers. */
        if (r >= 0 && node.active) {
                log_info("Training done; serving peers until stopped");
                while (!stop_requested)
                        node_poll(&node, 200);
                r = -ECANCELED;
        }
        node_stop(&node);
        config_free(&config);
        if (r == -ECANCELED) {
                log_notice("Received %s, stopped cleanly", strsignal(stop_requested));
                return 0;
        }
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
