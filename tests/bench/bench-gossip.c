/* bench-gossip — decentralized Adam against all-reduce Adam on a real job,
 * and the runtime model against measured iteration times.
 *
 * Accuracy: N nodes (threads of one child process, one per node), each on
 * its shard of the training set, talk over real authenticated loopback
 * links. Two methods see the same samples in the same order:
 *   allreduce-adam    every step the gradients are averaged over all nodes
 *                     (a coll round over everyone), then AdamW: the
 *                     reference, synchronous data parallelism;
 *   gossip-accumadam  AccumAdam, and the parameters mixed with the group
 *                     of the topology (default alt-exp-ring), the exchange
 *                     of step t overlapping the computation of step t+1.
 * At the end the nodes' parameters are averaged (as the paper evaluates)
 * and the averaged model is tested; the mean of the nodes' own accuracies
 * is printed too. Prints both accuracies and the difference (the issue's
 * bar: within 0.5 points).
 *
 * Timing (--netns): the nodes run in network namespaces made here, joined
 * by a bridge, every node's egress limited by tbf at three bandwidths; the
 * measured time per iteration of all-reduce and of each gossip topology is
 * printed beside the runtime model's prediction (runtime-model.h), whose
 * inputs are measured just before with the same nodes: compute and update
 * time per step without communication, and the exchange's CPU cost per byte
 * (pair exchanges with no compute and no rate limit). Every point is
 * repeated (interleaved) and the medians are printed last.
 *
 *     bench-gossip [--job FILE] [--nodes N] [--epochs N] [--lr X] [--accum K]
 *                  [--topology NAME] [--also-adam] [--no-accuracy]
 *                  [--netns] [--rates MBIT,...] [--timing-steps N] [--repeats N]
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "collective/gossip.h"
#include "collective/runtime-model.h"
#include "conf/job.h"
#include "conf/option.h"
#include "net/handshake.h"
#include "nn/loss.h"
#include "pipeline/trainer.h"
#include "tensor/ops.h"
#include "util/time-util.h"
#include "bench.h"

#define MAX_NODES 16

typedef enum Method {
        M_ALLREDUCE_ADAM,
        M_GOSSIP_ACCUMADAM,
        M_GOSSIP_ADAM,
        M_TIMING, /* no learning that matters: a fixed number of steps, timed */
} Method;

static const char *method_name[] = { "allreduce-adam", "gossip-accumadam", "gossip-adam", "timing" };

typedef struct Options {
        const char *job_path;
        unsigned nodes;
        int epochs;
        double lr;
        unsigned accum;
        GossipTopology topology;
        bool also_adam;
        bool netns;
        const char *rates;
        int timing_steps;
        int repeats;
} Options;

typedef struct Result {
        int ok;
        double avg_model_acc, mean_node_acc;
        double ms_per_iter, compute_ms, compute_ms_sd, update_ms, wait_ms;
        double peak_mib;
        uint64_t failed;
} Result;

typedef struct Run Run;

typedef struct NodeCtx {
        Run *run;
        unsigned index;
        Trainer *t;
        Gossip *g;
        Identity id;
        pthread_t thread;
        double acc;
        uint64_t compute_ns, compute_sq, update_ns, steps, wait_ns;
        int error;
        int netns_fd; /* -1: stay where we are */
} NodeCtx;

struct Run {
        const Options *o;
        const Job *job;
        Method method;
        GossipTopology topology;
        const Dataset *train, *test;
        NodeCtx node[MAX_NODES];
        CollMember members[MAX_NODES];
        NetConfig nc[MAX_NODES];
        atomic_uint ready, finished;
        uint64_t t0_ns, t1_ns;
        int steps_limit; /* M_TIMING */
        bool no_compute; /* M_TIMING: exchanges only, to measure their CPU cost */
};

static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 'g', 'o', 's', 's', 'i', 'p' };

/* One step of forward and backward: grads of the batch at the current params. */
static void forward_backward(Trainer *t, int B) {
        Stage *s = t->stage;
        int correct;
        stage_forward(s, t->ops, s->params, t->trace, B);
        softmax_xent(t->dlogits, &correct, trace_output(t->trace), t->labels, B, s->out.c);
        stage_backward(s, t->ops, s->params, t->trace, t->dlogits, NULL, s->grads, B, 0.0f, NULL, NULL);
}

static void *node_main(void *arg) {
        NodeCtx *nd = arg;
        Run *run = nd->run;
        Trainer *t = nd->t;
        Stage *s = t->stage;
        size_t B = (size_t)t->spec.batch_size, n = t->sampler.n, steps = (n + B - 1) / B;
        int epochs = run->method == M_TIMING ? 1 : t->spec.epochs;
        uint64_t total = (uint64_t)epochs * steps, it = 0;
        bool nocomm = run->method == M_TIMING && run->topology == _GOSSIP_TOPOLOGY_INVALID;
        bool gossip = !nocomm && (run->method == M_GOSSIP_ACCUMADAM || run->method == M_GOSSIP_ADAM ||
                                  (run->method == M_TIMING && run->topology != GOSSIP_COMPLETE));
        int r;

        if (nd->netns_fd >= 0 && setns(nd->netns_fd, CLONE_NEWNET) < 0) {
                nd->error = -errno;
                atomic_fetch_add(&run->ready, 1);
                atomic_fetch_add(&run->finished, 1);
                return NULL;
        }
        for (int i = 0; i < 20000 && gossip_connected(nd->g) < run->o->nodes - 1; i++)
                usleep(1000);
        atomic_fetch_add(&run->ready, 1);
        while (atomic_load(&run->ready) < run->o->nodes)
                usleep(200);
        if (nd->index == 0)
                run->t0_ns = now_ns();

        for (int epoch = 0; epoch < epochs; epoch++) {
                sampler_shuffle(&t->sampler, epoch);
                for (size_t step = 0; step < steps; step++, it++) {
                        if (run->method == M_TIMING && it >= (uint64_t)run->steps_limit)
                                goto done;
                        optim_set_lr(&t->optim, lr_schedule_at(&t->optim.spec, it, total));
                        int b = (int)MIN(B, n - step * B);
                        uint64_t c0 = now_ns();
                        if (!run->no_compute) {
                                dataset_gather(t->train, trace_input(t->trace), t->labels, t->sampler.order + step * B, b);
                                forward_backward(t, b);
                        }
                        uint64_t c1 = now_ns(), c2 = c1, c3 = c1;
                        if (nocomm) {
                                c2 = now_ns();
                                optim_step(&t->optim, s->params, s->grads);
                        } else if (gossip) {
                                /* the exchange of step it-1 ran during this forward/backward */
                                if (it > 0 && (r = gossip_mix(nd->g, s->params)) < 0)
                                        nd->error = r;
                                c2 = now_ns();
                                optim_step(&t->optim, s->params, s->grads);
                                c3 = now_ns();
                                if ((r = gossip_send(nd->g, s->params, it)) < 0)
                                        nd->error = r;
                                nd->wait_ns += now_ns() - c3; /* the copy it sends: gossip's own work */
                        } else {
                                /* all-reduce the gradients, then the same update everywhere */
                                if ((r = gossip_send(nd->g, s->grads, it)) < 0 || (r = gossip_mix(nd->g, s->grads)) < 0)
                                        nd->error = r;
                                c2 = now_ns();
                                optim_step(&t->optim, s->params, s->grads);
                        }
                        if (!gossip)
                                c3 = now_ns();
                        uint64_t c = c1 - c0;
                        nd->compute_ns += c;
                        nd->compute_sq += c / 1000 * (c / 1000);
                        nd->update_ns += c3 - c2;
                        nd->wait_ns += c2 - c1;
                        nd->steps++;
                }
        }
done:
        if (gossip && (r = gossip_mix(nd->g, s->params)) < 0 && r != -ENOMSG)
                nd->error = r;
        atomic_fetch_add(&run->finished, 1);
        if (nd->index == 0) {
                while (atomic_load(&run->finished) < run->o->nodes)
                        usleep(200);
                run->t1_ns = now_ns();
        }
        /* stay until everyone is through: the others may still need our pieces */
        while (atomic_load(&run->finished) < run->o->nodes)
                usleep(1000);
        return NULL;
}

static int run_setup(Run *run, const Options *o, const Job *job, Method m, GossipTopology topo, const Dataset *train,
                     const Dataset *test, const int *netns_fds) {
        Diag d = {};
        int r;

        memset(run, 0, sizeof *run);
        run->o = o;
        run->job = job;
        run->method = m;
        run->topology = topo;
        run->train = train;
        run->test = test;
        for (unsigned i = 0; i < o->nodes; i++) {
                NodeCtx *nd = &run->node[i];
                identity_generate(&nd->id);
                memcpy(run->members[i].id, nd->id.pk, IDENTITY_PK_SIZE);
                if (netns_fds)
                        snprintf(run->members[i].host, sizeof run->members[i].host, "10.77.0.%u", i + 1);
                else
                        snprintf(run->members[i].host, sizeof run->members[i].host, "127.0.0.1");
        }
        for (unsigned i = 0; i < o->nodes; i++) {
                NodeCtx *nd = &run->node[i];
                OptimSpec os;
                TrainSpec ts = job->train;
                nd->run = run;
                nd->index = i;
                nd->netns_fd = netns_fds ? netns_fds[i] : -1;
                optim_spec_defaults(&os, m == M_GOSSIP_ACCUMADAM ? OPTIM_ACCUM_ADAM : OPTIM_ADAMW);
                os.schedule = LR_COSINE;
                os.lr = (float)o->lr;
                if (m == M_GOSSIP_ACCUMADAM)
                        os.accum_steps = o->accum;
                if (o->epochs > 0)
                        ts.epochs = o->epochs;
                ts.shard = (int)i;
                ts.n_shards = (int)o->nodes;
                r = trainer_new(&job->model, &os, &ts, train, test, &ops_blas, &nd->t, &d);
                if (r < 0) {
                        fprintf(stderr, "trainer: %s\n", d.text);
                        return r;
                }

                GossipConfig gc;
                gossip_config_defaults(&gc);
                net_config_defaults(&run->nc[i]);
                run->nc[i].identity = &nd->id;
                run->nc[i].secret = secret;
                run->nc[i].pool_bytes = MIN(nd->t->stage->n_params * sizeof(float) + (16u << 20), (size_t)1 << 30);
                gc.coll.net = &run->nc[i];
                gc.coll.members = run->members;
                gc.coll.n_members = o->nodes;
                gc.coll.self = i;
                gc.coll.round_timeout_ms = 120000;
                gc.coll.join_timeout_ms = 60000;
                gc.topology = (m == M_ALLREDUCE_ADAM || topo == _GOSSIP_TOPOLOGY_INVALID) ? GOSSIP_COMPLETE : topo;
                gc.len = nd->t->stage->n_params;
                /* sockets belong to the namespace of the thread that makes them */
                int self_ns = -1;
                if (nd->netns_fd >= 0) {
                        self_ns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
                        if (self_ns < 0 || setns(nd->netns_fd, CLONE_NEWNET) < 0)
                                return -errno;
                }
                r = gossip_new(&gc, &nd->g);
                if (self_ns >= 0) {
                        if (setns(self_ns, CLONE_NEWNET) < 0)
                                r = -errno;
                        close(self_ns);
                }
                if (r < 0)
                        return r;
                run->members[i].port = gossip_port(nd->g);
        }
        for (unsigned i = 0; i < o->nodes; i++)
                for (unsigned j = 0; j < o->nodes; j++)
                        gossip_set_address(run->node[i].g, j, run->members[j].host, run->members[j].port);
        return 0;
}

static int run_go(Run *run) {
        for (unsigned i = 0; i < run->o->nodes; i++) {
                NodeCtx *nd = &run->node[i];
                int self_ns = -1, r = 0;
                /* the exchange thread inherits the namespace of its creator */
                if (nd->netns_fd >= 0) {
                        self_ns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
                        if (self_ns < 0 || setns(nd->netns_fd, CLONE_NEWNET) < 0)
                                return -errno;
                }
                r = gossip_start(nd->g);
                if (self_ns >= 0) {
                        (void)setns(self_ns, CLONE_NEWNET);
                        close(self_ns);
                }
                if (r < 0)
                        return r;
        }
        for (unsigned i = 0; i < run->o->nodes; i++)
                if (pthread_create(&run->node[i].thread, NULL, node_main, &run->node[i]) != 0)
                        return -EAGAIN;
        for (unsigned i = 0; i < run->o->nodes; i++)
                pthread_join(run->node[i].thread, NULL);
        return 0;
}

static void run_free(Run *run) {
        for (unsigned i = 0; i < run->o->nodes; i++) {
                run->node[i].g = gossip_free(run->node[i].g);
                run->node[i].t = trainer_free(run->node[i].t);
        }
}

static void run_collect(Run *run, Result *res) {
        unsigned N = run->o->nodes;
        uint64_t steps = 0, compute = 0, sq = 0, wait = 0, update = 0;
        res->ok = 1;
        for (unsigned i = 0; i < N; i++) {
                NodeCtx *nd = &run->node[i];
                GossipStats st;
                gossip_get_stats(nd->g, &st);
                res->failed += st.failed;
                if (nd->error < 0) {
                        fprintf(stderr, "node %u: %s\n", i, strerror(-nd->error));
                        res->ok = 0;
                }
                steps += nd->steps;
                compute += nd->compute_ns;
                sq += nd->compute_sq;
                wait += nd->wait_ns;
                update += nd->update_ns;
        }
        double per = steps ? (double)compute / steps / 1e6 : 0;
        res->compute_ms = per;
        res->compute_ms_sd = steps ? sqrt(fmax(0, (double)sq / steps / 1e6 - per * per)) : 0;
        res->wait_ms = steps ? (double)wait / steps / 1e6 : 0;
        res->update_ms = steps ? (double)update / steps / 1e6 : 0;
        res->ms_per_iter = steps ? (double)(run->t1_ns - run->t0_ns) / 1e6 / ((double)steps / N) : 0;
}

/* The accuracy of each node, then of the nodes' average. */
static void run_evaluate(Run *run, Result *res) {
        unsigned N = run->o->nodes;
        size_t P = run->node[0].t->stage->n_params;
        double sum = 0, loss;
        for (unsigned i = 0; i < N; i++) {
                trainer_evaluate(run->node[i].t, run->test, &run->node[i].acc, &loss);
                sum += run->node[i].acc;
        }
        res->mean_node_acc = sum / N;
        float *avg = run->node[0].t->stage->params;
        for (size_t k = 0; k < P; k++) {
                double s = 0;
                for (unsigned i = 0; i < N; i++)
                        s += run->node[i].t->stage->params[k];
                avg[k] = (float)(s / N);
        }
        trainer_evaluate(run->node[0].t, run->test, &res->avg_model_acc, &loss);
}

static double peak_mib(void) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return ru.ru_maxrss / 1024.0;
}

/* Each run in a child, so that its peak RSS is its own. */
static Result in_child(const Options *o, const Job *job, Method m, GossipTopology topo, const int *netns_fds,
                       int steps_limit, bool no_compute) {
        Result res = {};
        int fds[2];
        if (pipe(fds) < 0)
                return res;
        pid_t pid = fork();
        if (pid == 0) {
                _cleanup_(dataset_freep) Dataset *train = NULL, *test = NULL;
                Diag d = {};
                Run *run = calloc(1, sizeof *run);
                close(fds[0]);
                ops_blas_set_threads(1);
                int r = dataset_load_dir(job->data.path, "train", job->data.classes, &train, &d);
                if (r >= 0)
                        r = dataset_load_dir(job->data.path, "t10k", job->data.classes, &test, &d);
                if (r < 0) {
                        fprintf(stderr, "dataset: %s\n", d.text);
                        _exit(2);
                }
                dataset_set_normalization(train, (float)job->data.mean, (float)job->data.std);
                dataset_set_normalization(test, (float)job->data.mean, (float)job->data.std);
                r = run_setup(run, o, job, m, topo, train, test, netns_fds);
                if (r < 0) {
                        fprintf(stderr, "setup: %s\n", strerror(-r));
                        _exit(3);
                }
                run->steps_limit = steps_limit;
                run->no_compute = no_compute;
                r = run_go(run);
                if (r < 0)
                        _exit(4);
                run_collect(run, &res);
                if (m != M_TIMING)
                        run_evaluate(run, &res);
                run_free(run);
                res.peak_mib = peak_mib();
                (void)!write(fds[1], &res, sizeof res);
                _exit(0);
        }
        close(fds[1]);
        if (read(fds[0], &res, sizeof res) != sizeof res)
                res.ok = 0;
        close(fds[0]);
        waitpid(pid, NULL, 0);
        return res;
}

/* ---- network namespaces ---------------------------------------------------- */

static double median_of(const double *v, int n) {
        double c[16];
        memcpy(c, v, (size_t)n * sizeof *c);
        return bench_median(c, n);
}

/* Ctrl-C or SIGTERM: finish the run under way, then clean up the namespaces. */
static volatile sig_atomic_t stop_requested;

static void on_stop(int sig) {
        stop_requested = 1;
}

static int sh(const char *fmt, ...) _printf_(1, 2);
static int sh(const char *fmt, ...) {
        char cmd[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cmd, sizeof cmd, fmt, ap);
        va_end(ap);
        int r = system(cmd);
        return r == 0 ? 0 : -EIO;
}

#define NS_PREFIX "rvg"

static void netns_down(unsigned n) {
        for (unsigned i = 0; i < n; i++)
                sh("ip netns del " NS_PREFIX "%u-%d 2>/dev/null", i, (int)getpid());
        sh("ip netns del " NS_PREFIX "br-%d 2>/dev/null", (int)getpid());
}

/* n namespaces, each with a veth into a bridge in one more namespace;
 * addresses 10.77.0.(i+1)/24, used only inside them. */
static int netns_up(unsigned n, int *fds) {
        int pid = (int)getpid();
        if (sh("ip netns add " NS_PREFIX "br-%d && ip -n " NS_PREFIX "br-%d link add br0 type bridge && "
               "ip -n " NS_PREFIX "br-%d link set br0 up", pid, pid, pid) < 0)
                return -EIO;
        for (unsigned i = 0; i < n; i++) {
                if (sh("ip netns add " NS_PREFIX "%u-%d", i, pid) < 0 ||
                    sh("ip link add rvg%u-%d type veth peer name rvgp%u-%d", i, pid, i, pid) < 0 ||
                    sh("ip link set rvg%u-%d netns " NS_PREFIX "%u-%d name eth0", i, pid, i, pid) < 0 ||
                    sh("ip link set rvgp%u-%d netns " NS_PREFIX "br-%d", i, pid, pid) < 0 ||
                    sh("ip -n " NS_PREFIX "br-%d link set rvgp%u-%d master br0 up", pid, i, pid) < 0 ||
                    sh("ip -n " NS_PREFIX "%u-%d addr add 10.77.0.%u/24 dev eth0 && ip -n " NS_PREFIX
                       "%u-%d link set eth0 up && ip -n " NS_PREFIX "%u-%d link set lo up",
                       i, pid, i + 1, i, pid, i, pid) < 0)
                        return -EIO;
                char path[128];
                snprintf(path, sizeof path, "/run/netns/" NS_PREFIX "%u-%d", i, pid);
                fds[i] = open(path, O_RDONLY | O_CLOEXEC);
                if (fds[i] < 0)
                        return -errno;
        }
        return 0;
}

/* Every node's egress at mbit; 0: no limit. */
static int netns_rate(unsigned n, double mbit) {
        int pid = (int)getpid();
        if (mbit <= 0) {
                for (unsigned i = 0; i < n; i++)
                        sh("ip netns exec " NS_PREFIX "%u-%d tc qdisc del dev eth0 root 2>/dev/null", i, pid);
                return 0;
        }
        for (unsigned i = 0; i < n; i++)
                if (sh("ip netns exec " NS_PREFIX "%u-%d tc qdisc replace dev eth0 root tbf rate %.0fmbit "
                       "burst %dkb latency 200ms",
                       i, pid, mbit, mbit >= 1000 ? 512 : 128) < 0)
                        return -EIO;
        return 0;
}

static void netns_timing(const Options *o, const Job *job) {
        int fds[MAX_NODES];
        double rates[8];
        unsigned n_rates = 0;
        const GossipTopology methods[] = { GOSSIP_COMPLETE, GOSSIP_RING, GOSSIP_EXP, GOSSIP_ALT_EXP_RING };
        char buf[256];

        snprintf(buf, sizeof buf, "%s", o->rates);
        for (char *tok = strtok(buf, ","); tok && n_rates < 8; tok = strtok(NULL, ","))
                rates[n_rates++] = atof(tok);
        if (netns_up(o->nodes, fds) < 0) {
                fprintf(stderr, "network namespaces: cannot set up (need root and iproute2); skipped\n");
                netns_down(o->nodes);
                return;
        }
        size_t P = model_spec_params(&job->model, 0, job->model.n_layers);

        /* The model's inputs: compute and update time per step measured
         * here with the same nodes on the same cores, but no communication. */
        printf("\nper-iteration time, %u nodes, %zu parameters (%.1f MiB), %d steps per point, %.2f cores per node\n",
               o->nodes, P, P * 4.0 / (1 << 20), o->timing_steps, (double)sysconf(_SC_NPROCESSORS_ONLN) / o->nodes);
        printf("predicted: from a calibration run without communication just before; self: from the run's own\n"
               "compute and update times\n");
        printf("%-8s %-13s %9s %10s %7s %8s %7s %8s %7s %7s\n", "Mbit/s", "method", "measured", "predicted", "error",
               "self", "error", "compute", "update", "wait");
        double cores = (double)sysconf(_SC_NPROCESSORS_ONLN) / o->nodes;
        double slow = cores < 1 ? 1 / cores : 1;
        for (unsigned k = 0; k < n_rates && !stop_requested; k++) {
                if (netns_rate(o->nodes, rates[k]) < 0) {
                        fprintf(stderr, "tc tbf failed; skipped\n");
                        break;
                }
                enum { MAX_REPEATS = 9 };
                double mrep[4][MAX_REPEATS], prep[4][MAX_REPEATS], srep[4][MAX_REPEATS];
                double measured[4], predicted[4], selfp[4];
                int R = MIN(MAX(o->repeats, 1), MAX_REPEATS);
                /* repeated and interleaved: the machine is shared and noisy */
                for (int rep = 0; rep < R && !stop_requested; rep++) {
                        /* The model's inputs, measured just before: compute and
                         * update per step without communication, and the
                         * exchange's CPU cost per byte (sealing, copies, the
                         * kernel's TCP, veth and bridge on these same cores):
                         * pair exchanges with no compute and no rate limit are
                         * CPU-bound. */
                        Result cal = in_child(o, job, M_TIMING, _GOSSIP_TOPOLOGY_INVALID, fds, o->timing_steps, false);
                        netns_rate(o->nodes, 0);
                        Result x = in_child(o, job, M_TIMING, GOSSIP_EXP, fds, o->timing_steps, true);
                        netns_rate(o->nodes, rates[k]);
                        double mix_ms = 5.0 * 4 * P / 5e6 * slow; /* the model's own mixing passes */
                        double cpu_gbs = 2.0 * 4 * P * slow / (fmax(x.ms_per_iter - mix_ms, 1e-3) * 1e6);
                        printf("%-8.0f calibration: compute %.1f ms (sd %.1f), update %.1f ms; exchange alone %.1f ms "
                               "-> %.2f GB/s of CPU work\n",
                               rates[k], cal.compute_ms, cal.compute_ms_sd, cal.update_ms, x.ms_per_iter, cpu_gbs);
                        for (size_t mth = 0; mth < ELEMENTSOF(methods) && !stop_requested; mth++) {
                                Result r = in_child(o, job, M_TIMING, methods[mth], fds, o->timing_steps, false);
                                RuntimeModelInput in;
                                RuntimeModelResult pr, ps;
                                runtime_model_defaults(&in);
                                in.compute_ms = cal.compute_ms;
                                in.compute_sd_ms = cal.compute_ms_sd;
                                in.update_ms = cal.update_ms;
                                in.bandwidth_mbit = rates[k];
                                in.latency_ms = 0.05;
                                in.nodes = o->nodes;
                                in.params = P;
                                in.cores = cores;
                                in.cpu_gbyte_s = cpu_gbs;
                                runtime_model_predict(&in, &pr);
                                in.compute_ms = r.compute_ms;
                                in.compute_sd_ms = r.compute_ms_sd;
                                in.update_ms = r.update_ms;
                                runtime_model_predict(&in, &ps);
                                mrep[mth][rep] = r.ms_per_iter;
                                prep[mth][rep] = pr.method[mth].iter_ms;
                                srep[mth][rep] = ps.method[mth].iter_ms;
                                printf("%-8.0f %-13s %9.1f %10.1f %+6.1f%% %8.1f %+6.1f%% %8.1f %7.1f %7.1f%s\n", rates[k],
                                       mth == 0 ? "allreduce" : gossip_topology_to_string(methods[mth]), r.ms_per_iter,
                                       prep[mth][rep], 100.0 * (prep[mth][rep] - r.ms_per_iter) / r.ms_per_iter,
                                       srep[mth][rep], 100.0 * (srep[mth][rep] - r.ms_per_iter) / r.ms_per_iter,
                                       r.compute_ms, r.update_ms, r.wait_ms, r.ok ? "" : "  (errors)");
                                fflush(stdout);
                        }
                }
                if (stop_requested)
                        break;
                for (size_t mth = 0; mth < ELEMENTSOF(methods); mth++) {
                        measured[mth] = median_of(mrep[mth], R);
                        predicted[mth] = median_of(prep[mth], R);
                        selfp[mth] = median_of(srep[mth], R);
                        printf("%-8.0f %-13s %9.1f %10.1f %+6.1f%% %8.1f %+6.1f%%   median of %d\n", rates[k],
                               mth == 0 ? "allreduce" : gossip_topology_to_string(methods[mth]), measured[mth],
                               predicted[mth], 100.0 * (predicted[mth] - measured[mth]) / measured[mth], selfp[mth],
                               100.0 * (selfp[mth] - measured[mth]) / measured[mth], R);
                }
                double best = measured[1];
                size_t bi = 1;
                for (size_t mth = 2; mth < ELEMENTSOF(methods); mth++)
                        if (measured[mth] < best) {
                                best = measured[mth];
                                bi = mth;
                        }
                printf("%-8.0f best gossip %s: %.2fx faster than all-reduce (predicted %.2fx)\n", rates[k],
                       gossip_topology_to_string(methods[bi]), measured[0] / best, predicted[0] / predicted[bi]);
        }
        for (unsigned i = 0; i < o->nodes; i++)
                close(fds[i]);
        netns_down(o->nodes);
}

static void usage(FILE *f) {
        fprintf(f, "Usage: bench-gossip [--job FILE] [--nodes N] [--epochs N] [--lr X] [--accum N] [--topology NAME]\n"
                   "                    [--also-adam] [--netns] [--rates MBIT,...] [--timing-steps N] [--no-accuracy]\n"
                   "                    [--repeats N]\n"
                   "Gossip topologies against all-reduce (the reference): accuracy, and time per step against the\n"
                   "runtime model's prediction.\n");
}

int main(int argc, char **argv) {
        Options o = {
                .job_path = SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job",
                .nodes = 4,
                .lr = 1e-3,
                .accum = 4,
                .topology = GOSSIP_ALT_EXP_RING,
                .rates = "100,300,1000",
                .timing_steps = 30,
                .repeats = 3,
        };
        bool accuracy = true;
        static const struct option opts[] = {
                { "job", required_argument, NULL, 'j' },      { "nodes", required_argument, NULL, 'n' },
                { "epochs", required_argument, NULL, 'e' },   { "lr", required_argument, NULL, 'l' },
                { "accum", required_argument, NULL, 'k' },    { "topology", required_argument, NULL, 't' },
                { "also-adam", no_argument, NULL, 'a' },      { "netns", no_argument, NULL, 'N' },
                { "rates", required_argument, NULL, 'r' },    { "timing-steps", required_argument, NULL, 's' },
                { "no-accuracy", no_argument, NULL, 'A' },    { "repeats", required_argument, NULL, 'R' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        long long v = 0;
        int c;
        while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case 'j': o.job_path = optarg; break;
                case 'n': r = option_int("nodes", optarg, 2, MAX_NODES, &v); o.nodes = (unsigned)v; break;
                case 'e': r = option_int("epochs", optarg, 1, 1000000, &v); o.epochs = (int)v; break;
                case 'l': r = option_double("lr", optarg, 1e-9, 10, &o.lr); break;
                case 'k': r = option_int("accum", optarg, 1, 1024, &v); o.accum = (unsigned)v; break;
                case 't':
                        o.topology = gossip_topology_from_string(optarg);
                        if (o.topology == _GOSSIP_TOPOLOGY_INVALID) {
                                fprintf(stderr, "Invalid value for --topology: %s (complete, ring, exp or "
                                        "alt-exp-ring)\n", optarg);
                                return EX_USAGE;
                        }
                        break;
                case 'a': o.also_adam = true; break;
                case 'N': o.netns = true; break;
                case 'r': o.rates = optarg; break;
                case 's': r = option_int("timing-steps", optarg, 1, 1000000, &v); o.timing_steps = (int)v; break;
                case 'A': accuracy = false; break;
                case 'R': r = option_int("repeats", optarg, 1, 1000, &v); o.repeats = (int)v; break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return EX_USAGE;
                }
                if (r < 0)
                        return EX_USAGE;
        }
        if (optind < argc) {
                fprintf(stderr, "%s: unexpected argument \"%s\"\n", argv[0], argv[optind]);
                return EX_USAGE;
        }
        struct sigaction sa = { .sa_handler = on_stop };
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        Job job;
        Diag d = {};
        if (job_load(o.job_path, &job, &d) < 0) {
                fprintf(stderr, "%s\n", d.text);
                return 1;
        }
        int epochs = o.epochs > 0 ? o.epochs : job.train.epochs;

        if (accuracy) {
                printf("%s: %u nodes, one shard each, batch %d per node, %d epochs, lr %g (cosine), AccumAdam k=%u, "
                       "topology %s\n",
                       job.name, o.nodes, job.train.batch_size, epochs, o.lr, o.accum,
                       gossip_topology_to_string(o.topology));
                printf("%-18s %12s %12s %10s %10s %9s %9s %9s\n", "method", "avg model %", "mean node %", "ms/iter",
                       "compute", "wait", "failed", "peak MiB");
                Method ms[3] = { M_ALLREDUCE_ADAM, M_GOSSIP_ACCUMADAM, M_GOSSIP_ADAM };
                Result res[3] = {};
                for (int k = 0; k < (o.also_adam ? 3 : 2); k++) {
                        res[k] = in_child(&o, &job, ms[k], o.topology, NULL, 0, false);
                        printf("%-18s %12.2f %12.2f %10.1f %10.1f %9.1f %9llu %9.0f%s\n", method_name[ms[k]],
                               100 * res[k].avg_model_acc, 100 * res[k].mean_node_acc, res[k].ms_per_iter,
                               res[k].compute_ms, res[k].wait_ms, (unsigned long long)res[k].failed, res[k].peak_mib,
                               res[k].ok ? "" : "  (errors)");
                        fflush(stdout);
                }
                double diff = 100 * (res[1].avg_model_acc - res[0].avg_model_acc);
                printf("gossip-accumadam - allreduce-adam: %+.2f points (bar: within 0.5) -> %s\n", diff,
                       fabs(diff) <= 0.5 || diff > 0 ? "within" : "outside");
                if (o.also_adam)
                        printf("gossip-adam - allreduce-adam: %+.2f points\n",
                               100 * (res[2].avg_model_acc - res[0].avg_model_acc));
                printf("iteration time gossip / all-reduce on loopback: %.2f\n", res[1].ms_per_iter / res[0].ms_per_iter);
        }
        if (o.netns)
                netns_timing(&o, &job);
        return 0;
}
