/* ctl/swarm.h — a whole swarm on this machine: clusters x stages
 * ravnestd processes on loopback, with their keys, network secret and
 * configurations generated, training one job; their progress interleaved on
 * standard output, every process stopped cleanly on Ctrl-C, and the test
 * accuracy of each cluster's replica at the end.
 *
 *     SwarmOptions o = { .clusters = 2, .stages = 2, .job = path, .ravnestd = "/usr/sbin/ravnestd" };
 *     r = swarm_run(&o, &stop_flag, &result);
 *     // 0: every cluster finished, and with several, as one averaged model
 *     // (every node's last averaging round had every member); -EUCLEAN
 *     // with the reason printed when not
 */
#pragma once

#include <signal.h>
#include <stdbool.h>

typedef struct SwarmOptions {
        unsigned clusters, stages;
        const char *job;
        const char *ravnestd;   /* the daemon to start */
        const char *dir;        /* where keys and configs go; NULL: a new directory in /tmp */
        const char *data_dir;   /* NULL: the job's */
        int epochs;             /* > 0 overrides the job */
        int micro_batch;        /* 0: the job's batch, at most 32 */
        int staleness;
        int update_frequency;   /* 0: the job's batch over the micro-batch, so updates see as many samples */
        bool synchronous;
        double interval;        /* seconds between averaging rounds */
        const char *averaging;  /* more settings for each node's averaging group, or NULL */
        const char *pipeline;   /* more settings for each node's pipeline, or NULL */
        unsigned progress_ms;
        bool keep;              /* keep dir afterwards */
        bool keep_going;        /* a node that fails does not stop the others */
        bool restart;           /* a node that fails is started again (at most 5 times), from its checkpoint */
        bool resume;            /* with dir: the nodes go on from the checkpoints a swarm left there */
        unsigned neighbour_timeout_s; /* a stage gives up on a neighbour gone this long (0: never) */
        unsigned checkpoint_interval_s; /* between each node's checkpoints (0: only when it stops) */
        bool pin;               /* node i runs on CPU i mod the CPU count */
        const char *behind_nat; /* "c1s2,c2s1": nodes that accept no connections (no address in the plan) */
        bool relay;             /* a relay in this process for links between two such nodes */
} SwarmOptions;

typedef struct SwarmResult {
        double accuracy[64];    /* per cluster, from its last stage; < 0 if none */
        double loss[64];        /* per cluster, the test (validation) loss; < 0 if none */
        unsigned clusters;
        unsigned rounds;        /* averaging rounds, all nodes together (each node numbers its rounds) */
        double busy[64];        /* per node (cluster-major), percent of its run */
        double rss_mib[64];     /* per node, peak */
        double pipeline_per_step[64];  /* per node, bytes sent and received per update; < 0: it did not say */
        double averaging_per_step[64];
        double samples_per_sec; /* last stages together */
} SwarmResult;

/* -EINVAL, said, unless o->behind_nat is NULL or a comma-separated list of
 * the swarm's nodes (c1s1 to cCsS), each named; swarm_run() checks it
 * before it makes anything, a command line may check it with the others. */
int swarm_check_behind_nat(const SwarmOptions *o);
int swarm_run(const SwarmOptions *o, const volatile sig_atomic_t *stop, SwarmResult *ret);
