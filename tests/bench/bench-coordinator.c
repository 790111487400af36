/* bench-coordinator — the membership coordinator with a thousand members.
 *
 * A real coordinator (ravnestd with membership.coordinate = true and
 * train = false, a child process) and N simulated members in this process,
 * a thread each. Every member has its own Ed25519 identity and its own
 * transport (daemon/net, epoll), dials the coordinator over loopback, runs
 * the real handshake, sends a real JOIN (plan_join_encode: capabilities
 * drawn from a seed, ports 0, i.e. behind NAT, so the coordinator dials
 * nobody back), heartbeats as membership.c does, answers a STOP with its
 * DONE (it trained nothing: no layers are handed in, so what is measured is
 * the control plane) and takes every PLAN it is sent through plan_decode()
 * (signature verified, every bound checked).
 *
 * Printed, per run and as medians over --runs:
 *   - the first plan: time from the last JOIN sent to every member holding
 *     it (the settle time of the configuration included, and stated), the
 *     signed plan's size against PLAN_MAX_BYTES, whether all hold one plan;
 *   - the coordinator's CPU time (from /proc/PID/stat) to that point, and
 *     per second while its members only heartbeat; its peak RSS at the end
 *     (wait4);
 *   - heartbeat bytes per member per second, measured on the members' links
 *     while nothing else flows, beside the figure the frame sizes give;
 *   - --leave (10%) of the members leave at once (their transport says BYE
 *     and closes): time until every remaining member holds the plan without
 *     them, and how many remaining members moved;
 *   - --join new members join at once: the same;
 *   - for each, how many members the coordinator's STOP asked to hand in
 *     their layers (the others keep theirs and send none).
 *
 * "Moved" is counted two ways between the plan before and the plan after:
 * a member whose (cluster index, stage index) changed, as the plan numbers
 * them; and a member whose work changed: other layers, or other
 * cluster-mates than before (besides those that left), or from spare to a
 * stage or back.
 *
 * The coordinator admits at most 8 handshakes at a time from one address
 * (net.c): all members here come from 127.0.0.1, so they dial at most 6 at
 * a time, and the configuration raises network.max_links_per_address.
 * Nothing asserts on time.
 *
 *     bench-coordinator [--nodes N] [--runs N] [--leave PERCENT] [--join N] [--settle S] [--heartbeat S]
 *                       [--idle S] [--job FILE] [--seed N] [--keep]
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include <sodium.h>

#include "cluster/plan.h"
#include "conf/job.h"
#include "conf/option.h"
#include "net/net.h"
#include "run/averaging.h"
#include "util/file.h"
#include "util/rng.h"
#include "bench.h"

#define MAX_EPOCHS 64
#define PLAN_SLOTS 4      /* plans being decoded at once, all members together */
#define DIAL_SLOTS 6      /* handshakes at once: the coordinator takes 8 from one address */
#define STACK_BYTES (256u << 10)

typedef struct Bench Bench;

typedef struct Member {
        Bench *b;
        Identity id;
        PlanJoin join;
        pthread_t thread;
        bool started;
        Net *net;
        int64_t coord;       /* the link to the coordinator, -1 without */
        bool dialing, holds_slot;
        uint32_t dial_peer;
        uint64_t next_dial_ns, last_heartbeat_ns;
        atomic_bool leave;
        /* what the main thread reads */
        _Atomic uint64_t epoch;   /* the newest plan taken */
        _Atomic uint64_t join_ns; /* when its last JOIN went out */
        _Atomic uint64_t plan_ns; /* when it took the newest plan */
        _Atomic unsigned n_nodes; /* of the newest plan */
        _Atomic uint64_t sig;     /* the newest plan's signature, first 8 bytes */
        _Atomic uint64_t bytes_sent, bytes_received;
        _Atomic unsigned dials;
} Member;

struct Bench {
        /* options */
        int nodes, runs, join;
        double leave, settle, heartbeat, idle;
        uint64_t seed;
        const char *job_path;
        bool keep;
        /* the job */
        unsigned n_layers;
        uint64_t n_params;
        uint8_t model[PLAN_MODEL_SIZE]; /* the digest of its layers */
        /* one run */
        char dir[64];
        pid_t pid;
        uint16_t port;
        uint8_t coord_pk[IDENTITY_PK_SIZE];
        uint8_t secret[32];
        Member *m;
        int n_members;
        atomic_bool stop;
        sem_t dial_slots, plan_slots;
        pthread_mutex_t lock;
        Plan *decode[PLAN_SLOTS];
        bool decode_busy[PLAN_SLOTS];
        uint8_t *raw[MAX_EPOCHS]; /* the signed plan of each epoch, as the first member got it */
        size_t raw_len[MAX_EPOCHS];
};


static double log_uniform(Rng *r, double lo, double hi) {
        return lo * pow(hi / lo, rng_uniform(r));
}

/* ---- a member ---------------------------------------------------------- */

static Plan *decode_slot_take(Bench *b, int *ret_slot) {
        sem_wait(&b->plan_slots);
        pthread_mutex_lock(&b->lock);
        int i = 0;
        while (b->decode_busy[i])
                i++;
        b->decode_busy[i] = true;
        pthread_mutex_unlock(&b->lock);
        *ret_slot = i;
        return b->decode[i];
}

static void decode_slot_give(Bench *b, int slot) {
        pthread_mutex_lock(&b->lock);
        b->decode_busy[slot] = false;
        pthread_mutex_unlock(&b->lock);
        sem_post(&b->plan_slots);
}

static void dial_slot_give(Member *m) {
        if (m->holds_slot) {
                m->holds_slot = false;
                sem_post(&m->b->dial_slots);
        }
}

static void send_join(Member *m) {
        uint8_t buf[PLAN_JOIN_MAX_SIZE];
        m->join.epoch = atomic_load(&m->epoch);
        int n = plan_join_encode(&m->join, buf, sizeof buf);
        if (n > 0 && net_send_control(m->net, (uint32_t)m->coord, FRAME_CONTROL, buf, (size_t)n) == 0)
                atomic_store(&m->join_ns, now_ns());
}

static void on_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        Member *m = ud;
        if (memcmp(id, m->b->coord_pk, IDENTITY_PK_SIZE) != 0 || m->coord >= 0) {
                net_close_peer(m->net, peer);
                return;
        }
        m->coord = peer;
        m->dialing = false;
        dial_slot_give(m);
        send_join(m);
}

static void on_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        Member *m = ud;
        if (m->dialing && peer == m->dial_peer) {
                m->dialing = false;
                dial_slot_give(m);
        }
        if ((int64_t)peer == m->coord)
                m->coord = -1;
        m->next_dial_ns = now_ns() + NSEC_PER_SEC; /* as membership.c: again in a second */
}

/* The first member to take epoch e keeps its bytes for the main thread. */
static void keep_raw(Bench *b, uint64_t e, const uint8_t *p, size_t len) {
        if (e >= MAX_EPOCHS)
                return;
        pthread_mutex_lock(&b->lock);
        if (!b->raw[e] && (b->raw[e] = malloc(len))) {
                memcpy(b->raw[e], p, len);
                b->raw_len[e] = len;
        }
        pthread_mutex_unlock(&b->lock);
}

static void take_plan(Member *m, const uint8_t *p, size_t len) {
        int slot;
        Plan *q = decode_slot_take(m->b, &slot);
        int r = plan_decode(p, len, m->b->coord_pk, q);
        uint64_t e = r == 0 ? q->epoch : 0;
        unsigned n = r == 0 ? q->n_nodes : 0;
        decode_slot_give(m->b, slot);
        if (r < 0) {
                fprintf(stderr, "bench-coordinator: a member refused a plan: %s\n", strerror(-r));
                net_close_peer(m->net, (uint32_t)m->coord);
                return;
        }
        if (e <= atomic_load(&m->epoch))
                return;
        uint64_t sig = 0;
        memcpy(&sig, p + len - PLAN_SIG_SIZE, sizeof sig);
        keep_raw(m->b, e, p, len);
        atomic_store(&m->sig, sig);
        atomic_store(&m->n_nodes, n);
        atomic_store(&m->plan_ns, now_ns());
        atomic_store(&m->epoch, e); /* last: the others are read once it moves */
}

static atomic_uint stops_hand_in; /* STOPs that asked a member for its layers since the last reset */

static void on_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Member *m = ud;
        uint64_t epoch;
        bool hand_in;
        if ((int64_t)peer != m->coord)
                return;
        if (type == FRAME_PLAN)
                return take_plan(m, p, len);
        if (type == FRAME_CONTROL && plan_stop_decode(p, len, &epoch, &hand_in) == 0) {
                atomic_fetch_add(&stops_hand_in, hand_in);
                uint8_t msg[PLAN_DONE_SIZE]; /* nothing trained, nothing to hand in */
                plan_done_encode(epoch, 0, msg);
                net_send_control(m->net, peer, FRAME_CONTROL, msg, sizeof msg);
        }
}

static void on_tensor(void *ud, NetTensor *t) {
        Member *m = ud;
        net_tensor_release(m->net, t);
}

static const NetCallbacks member_callbacks = {
        .connected = on_connected,
        .closed = on_closed,
        .control = on_control,
        .tensor = on_tensor,
};

/* Dial (taking a dial slot), heartbeat, serve the link: membership.c's serve(). */
static void member_serve(Member *m) {
        Bench *b = m->b;
        uint64_t now = now_ns(), every = (uint64_t)(b->heartbeat * 1e9);
        if (m->coord < 0 && !m->dialing && now >= m->next_dial_ns) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 100 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                if (sem_timedwait(&b->dial_slots, &ts) < 0)
                        return;
                m->holds_slot = true;
                atomic_fetch_add(&m->dials, 1);
                m->next_dial_ns = now + NSEC_PER_SEC;
                if (net_connect(m->net, "127.0.0.1", b->port, &m->dial_peer) == 0)
                        m->dialing = true;
                else
                        dial_slot_give(m);
        }
        if (m->coord >= 0 && now - m->last_heartbeat_ns >= every) {
                m->last_heartbeat_ns = now;
                net_send_control(m->net, (uint32_t)m->coord, FRAME_HEARTBEAT, NULL, 0);
        }
        net_run(m->net, 200);
        NetStats st;
        net_get_stats(m->net, &st);
        atomic_store(&m->bytes_sent, st.bytes_sent);
        atomic_store(&m->bytes_received, st.bytes_received);
}

static void *member_main(void *ud) {
        Member *m = ud;
        Bench *b = m->b;
        NetConfig nc;
        net_config_defaults(&nc);
        nc.identity = &m->id;
        nc.secret = b->secret;
        nc.backend = NET_BACKEND_EPOLL;
        nc.pool_bytes = 64u << 10; /* no tensors come: the coordinator hands over nothing here */
        nc.max_links = 2;
        nc.idle_timeout_ms = 10000; /* membership.deadline */
        int r = net_new(&nc, &member_callbacks, m, &m->net);
        if (r < 0) {
                fprintf(stderr, "bench-coordinator: a member's transport: %s\n", strerror(-r));
                return NULL;
        }
        while (!atomic_load(&m->leave) && !atomic_load(&b->stop))
                member_serve(m);
        m->net = net_free(m->net); /* BYE on the link, then closed */
        dial_slot_give(m);
        return NULL;
}

static void member_init(Bench *b, Member *m, Rng *rng) {
        *m = (Member){ .b = b, .coord = -1 };
        identity_generate(&m->id);
        m->join = (PlanJoin){
                .micro_batch = 32,
                .gflops = log_uniform(rng, 5, 80),
                .memory = (uint64_t)(log_uniform(rng, 16, 128) * (1 << 20)),
                .bandwidth = log_uniform(rng, 10, 1000) * 1e6 / 8,
                .latency = log_uniform(rng, 1e-4, 2e-2),
                .n_params = b->n_params,
                .n_layers = b->n_layers,
        };
        memcpy(m->join.model, b->model, sizeof m->join.model);
        snprintf(m->join.host, sizeof m->join.host, "127.0.0.1");
}

static int member_start(Member *m) {
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setstacksize(&a, STACK_BYTES);
        int r = -pthread_create(&m->thread, &a, member_main, m);
        pthread_attr_destroy(&a);
        m->started = r == 0;
        return r;
}

static void member_stop(Member *m) {
        if (!m->started)
                return;
        atomic_store(&m->leave, true);
        pthread_join(m->thread, NULL);
        m->started = false;
        identity_clear(&m->id);
}

/* ---- the coordinator --------------------------------------------------- */

static uint16_t free_port(void) {
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof a;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
                if (fd >= 0)
                        close(fd);
                return 0;
        }
        close(fd);
        return ntohs(a.sin_port);
}

/* The coordinator's configuration: it coordinates, trains nothing, and
 * forms the first plan at min_nodes members. */
static int write_config(Bench *b, int min_nodes, char *path, size_t size) {
        char text[2048], hex[IDENTITY_HEX_SIZE], secret_hex[65], file[128];
        Identity id;
        bool created;
        Diag d = {};
        int r;

        snprintf(file, sizeof file, "%s/identity", b->dir);
        if ((r = identity_load_or_create(file, &id, &created, &d)) < 0) {
                fprintf(stderr, "bench-coordinator: %s\n", d.text);
                return r;
        }
        memcpy(b->coord_pk, id.pk, IDENTITY_PK_SIZE);
        identity_to_hex(id.pk, hex);
        identity_clear(&id);
        randombytes_buf(b->secret, sizeof b->secret);
        sodium_bin2hex(secret_hex, sizeof secret_hex, b->secret, sizeof b->secret);
        snprintf(file, sizeof file, "%s/secret", b->dir);
        snprintf(text, sizeof text, "%s\n", secret_hex);
        if ((r = file_write_text(file, text, 0600)) < 0)
                return r;
        b->port = free_port();
        snprintf(text, sizeof text,
                 "state_directory = \"%s\";\n"
                 "threads = 1;\n"
                 "control_socket = \"\";\n"
                 "idle = { enabled = false; };\n"
                 "checkpoint = { interval = 0; load = false; };\n"
                 "network = { secret_file = \"%s/secret\"; max_links_per_address = 4096; };\n"
                 "pipeline = { micro_batch = 32; staleness = 4; update_frequency = 4;\n"
                 "             listen = \"127.0.0.1:%u\"; };\n"
                 "averaging = { interval = 1.0; listen = \"127.0.0.1:%u\"; };\n"
                 "membership = {\n"
                 "  coordinator = \"%s@127.0.0.1:%u\";\n"
                 "  coordinate = true;\n"
                 "  train = false;\n"
                 "  min_nodes = %d;\n"
                 "  settle = %g;\n"
                 "  heartbeat = %g;\n"
                 "  deadline = 10;\n"
                 "};\n",
                 b->dir, b->dir, free_port(), free_port(), hex, b->port, min_nodes, b->settle, b->heartbeat);
        snprintf(path, size, "%s/coordinator.conf", b->dir);
        return file_write_text(path, text, 0644);
}

static pid_t spawn(char *const argv[], const char *log_path) {
        pid_t pid = fork();
        if (pid != 0)
                return pid;
        int fd = open(log_path ?: "/dev/null", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
                dup2(fd, STDOUT_FILENO);
                dup2(fd, STDERR_FILENO);
        }
        execv(argv[0], argv);
        _exit(127);
}

static bool log_has(const Bench *b, const char *what) {
        char path[128], buf[1 << 16];
        snprintf(path, sizeof path, "%s/coordinator.log", b->dir);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = 0;
        return strstr(buf, what) != NULL;
}

static bool coordinator_alive(const Bench *b) {
        return waitpid(b->pid, NULL, WNOHANG) == 0;
}

static int coordinator_start(Bench *b, int min_nodes) {
        char conf[256], log_path[128];
        int r = write_config(b, min_nodes, conf, sizeof conf);
        if (r < 0)
                return r;
        snprintf(log_path, sizeof log_path, "%s/coordinator.log", b->dir);
        b->pid = spawn((char *[]){ RAVNESTD, "--config", conf, "--job", (char *)b->job_path, "--no-idle", NULL },
                       log_path);
        if (b->pid < 0)
                return -errno;
        for (int i = 0; i < 3000 && coordinator_alive(b); i++) {
                if (log_has(b, "Coordinator listening on"))
                        return 0;
                usleep(10 * 1000);
        }
        return -ETIMEDOUT;
}

/* utime + stime of the coordinator so far, seconds. */
static double coordinator_cpu(const Bench *b) {
        char path[64], buf[1024];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)b->pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return NAN;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
                return NAN;
        buf[n] = 0;
        const char *p = strrchr(buf, ')'); /* after the command's name */
        unsigned long long ut = 0, st = 0;
        if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
                return NAN;
        return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* SIGTERM, then its CPU seconds and peak RSS (MiB) from wait4(). */
static void coordinator_stop(Bench *b, double *ret_cpu, double *ret_rss) {
        struct rusage ru = {};
        int status;
        kill(b->pid, SIGTERM);
        wait4(b->pid, &status, 0, &ru);
        *ret_cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
                   ru.ru_stime.tv_usec * 1e-6;
        *ret_rss = (double)ru.ru_maxrss / 1024.0;
}

/* ---- measuring --------------------------------------------------------- */

static bool present(const Member *m) {
        return m->started && !atomic_load(&m->leave);
}

/* Until every member still there holds one plan of `want` nodes: when the
 * last took it, and its epoch. -ETIMEDOUT, or -ESRCH when the coordinator
 * died. */
static int wait_plans(Bench *b, unsigned want, uint64_t *ret_last_ns, uint64_t *ret_epoch) {
        for (uint64_t until = now_ns() + 600 * NSEC_PER_SEC; now_ns() < until; usleep(2000)) {
                uint64_t last = 0, epoch = 0, sig = 0;
                bool all = true;
                for (int i = 0; i < b->n_members && all; i++) {
                        Member *m = &b->m[i];
                        if (!present(m))
                                continue;
                        uint64_t e = atomic_load(&m->epoch);
                        all = e > 0 && atomic_load(&m->n_nodes) == want && (!epoch || (e == epoch &&
                                                                                       atomic_load(&m->sig) == sig));
                        epoch = e;
                        sig = atomic_load(&m->sig);
                        last = MAX(last, atomic_load(&m->plan_ns));
                }
                if (all) {
                        *ret_last_ns = last;
                        *ret_epoch = epoch;
                        return 0;
                }
                if (!coordinator_alive(b))
                        return -ESRCH;
        }
        return -ETIMEDOUT;
}

/* The newest JOIN among members [from, to). */
static uint64_t last_join(const Bench *b, int from, int to) {
        uint64_t t = 0;
        for (int i = from; i < to; i++)
                t = MAX(t, atomic_load(&b->m[i].join_ns));
        return t;
}

typedef struct Place {
        int node, cluster, stage; /* cluster -1: a spare; node -1: not in the plan */
} Place;

/* Every node's place in p, by node index. */
static void places(const Plan *p, Place *ret) {
        for (unsigned i = 0; i < p->n_nodes; i++)
                ret[i] = (Place){ .node = (int)i, .cluster = -1 };
        for (unsigned k = 0; k < p->n_clusters; k++)
                for (unsigned s = 0; s < p->clusters[k].n_stages; s++) {
                        ret[p->clusters[k].nodes[s]].cluster = (int)k;
                        ret[p->clusters[k].nodes[s]].stage = (int)s;
                }
}

static int node_of(const Plan *p, const uint8_t key[PLAN_KEY_SIZE]) {
        int index;
        (void)plan_find(p, key, &index, NULL, NULL);
        return index;
}

/* Whether node i of a (in b as j) has the same cluster-mates in b, less
 * those that left. */
static bool same_mates(const Plan *a, const Place *pa, const Plan *b, const Place *pb, const int *b_to_a,
                       const int *a_to_b, int i, int j) {
        const PlanCluster *ca = &a->clusters[pa[i].cluster], *cb = &b->clusters[pb[j].cluster];
        unsigned stay = 0;
        for (unsigned s = 0; s < ca->n_stages; s++)
                stay += a_to_b[ca->nodes[s]] >= 0;
        if (stay != cb->n_stages)
                return false;
        for (unsigned s = 0; s < cb->n_stages; s++) {
                int o = b_to_a[cb->nodes[s]];
                if (o < 0 || pa[o].cluster != pa[i].cluster)
                        return false;
        }
        return true;
}

/* Of the nodes in both plans: how many changed (cluster, stage) as the
 * plans number them, and how many changed their work (layers, mates, or
 * spare or not). */
static void moved(const Plan *a, const Plan *b, unsigned *ret_both, unsigned *ret_index, unsigned *ret_work) {
        static Place pa[PLAN_MAX_NODES], pb[PLAN_MAX_NODES];
        static int a_to_b[PLAN_MAX_NODES], b_to_a[PLAN_MAX_NODES];
        unsigned both = 0, index = 0, work = 0;
        places(a, pa);
        places(b, pb);
        for (unsigned i = 0; i < a->n_nodes; i++)
                a_to_b[i] = node_of(b, a->nodes[i].key);
        for (unsigned j = 0; j < b->n_nodes; j++)
                b_to_a[j] = node_of(a, b->nodes[j].key);
        for (unsigned i = 0; i < a->n_nodes; i++) {
                int j = a_to_b[i];
                if (j < 0)
                        continue;
                both++;
                int ca = pa[i].cluster, cb = pb[j].cluster;
                index += ca != cb || (ca >= 0 && pa[i].stage != pb[j].stage);
                if ((ca < 0) != (cb < 0))
                        work++;
                else if (ca >= 0)
                        work += a->clusters[ca].bounds[pa[i].stage] != b->clusters[cb].bounds[pb[j].stage] ||
                                a->clusters[ca].bounds[pa[i].stage + 1] != b->clusters[cb].bounds[pb[j].stage + 1] ||
                                !same_mates(a, pa, b, pb, b_to_a, a_to_b, (int)i, j);
        }
        *ret_both = both;
        *ret_index = index;
        *ret_work = work;
}

typedef struct Change {
        double seconds;          /* from the change to every member holding the new plan */
        double moved_index, moved_work; /* fractions of the members in both plans */
        unsigned n_nodes, clusters_before, clusters_after;
        double hand_in;          /* STOPs that asked for the member's layers, per member of the plan after */
} Change;

static int compare_epochs(Bench *b, uint64_t e1, uint64_t e2, Change *c) {
        _cleanup_(plan_freep) Plan *p1 = plan_new();
        _cleanup_(plan_freep) Plan *p2 = plan_new();
        if (!p1 || !p2)
                return -ENOMEM;
        if (e1 >= MAX_EPOCHS || e2 >= MAX_EPOCHS || !b->raw[e1] || !b->raw[e2] ||
            plan_decode(b->raw[e1], b->raw_len[e1], b->coord_pk, p1) < 0 ||
            plan_decode(b->raw[e2], b->raw_len[e2], b->coord_pk, p2) < 0)
                return -EBADMSG;
        unsigned both, index, work;
        moved(p1, p2, &both, &index, &work);
        c->moved_index = both ? (double)index / both : 0;
        c->moved_work = both ? (double)work / both : 0;
        c->n_nodes = p2->n_nodes;
        c->clusters_before = p1->n_clusters;
        c->clusters_after = p2->n_clusters;
        return 0;
}

/* The bytes all present members sent and received so far. */
static void member_bytes(const Bench *b, uint64_t *ret_sent, uint64_t *ret_received, unsigned *ret_n) {
        uint64_t s = 0, r = 0;
        unsigned n = 0;
        for (int i = 0; i < b->n_members; i++)
                if (present(&b->m[i])) {
                        s += atomic_load(&b->m[i].bytes_sent);
                        r += atomic_load(&b->m[i].bytes_received);
                        n++;
                }
        *ret_sent = s;
        *ret_received = r;
        *ret_n = n;
}

/* ---- one run ----------------------------------------------------------- */

typedef struct Figures {
        double first_s, first_from_start_s; /* to every member holding the first plan */
        size_t plan_bytes;
        unsigned clusters;
        double cpu_first_s;                  /* the coordinator's, up to then */
        double cpu_idle;                     /* its CPU seconds per second while members heartbeat */
        double hb_up, hb_down;               /* bytes per member per second, measured */
        Change leave, join;
        double cpu_s, rss_mib;               /* the coordinator's whole run */
        unsigned dials;                      /* dials the members made (a refused one is dialed again) */
} Figures;

static int start_members(Bench *b, int from, int to) {
        for (int i = from; i < to; i++) {
                int r = member_start(&b->m[i]);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The members that leave: a tenth (--leave) of them, drawn from the seed. */
static int leave(Bench *b, Rng *rng, int n, uint64_t e1, Figures *f, uint64_t *ret_epoch) {
        int count = (int)lround(n * b->leave / 100.0), left = 0;
        uint64_t t0 = now_ns(), last;
        atomic_store(&stops_hand_in, 0);
        while (left < count) {
                Member *m = &b->m[rng_below(rng, (uint32_t)n)];
                if (!present(m))
                        continue;
                atomic_store(&m->leave, true);
                left++;
        }
        for (int i = 0; i < n; i++)
                if (b->m[i].started && atomic_load(&b->m[i].leave))
                        member_stop(&b->m[i]);
        int r = wait_plans(b, (unsigned)(n - count), &last, ret_epoch);
        if (r < 0)
                return r;
        f->leave.seconds = ns_to_sec(last - t0);
        f->leave.hand_in = (double)atomic_load(&stops_hand_in) / (n - count);
        return compare_epochs(b, e1, *ret_epoch, &f->leave);
}

static int join(Bench *b, Rng *rng, int n, unsigned want, uint64_t e2, Figures *f) {
        uint64_t last, e3;
        for (int i = n; i < n + b->join; i++)
                member_init(b, &b->m[i], rng);
        b->n_members = n + b->join;
        atomic_store(&stops_hand_in, 0);
        int r = start_members(b, n, n + b->join);
        if (r < 0)
                return r;
        r = wait_plans(b, want, &last, &e3);
        if (r < 0)
                return r;
        f->join.seconds = ns_to_sec(last - last_join(b, n, n + b->join));
        f->join.hand_in = (double)atomic_load(&stops_hand_in) / want;
        return compare_epochs(b, e2, e3, &f->join);
}

/* The coordinator's CPU and the members' bytes over --idle seconds of
 * heartbeats only. */
static void idle(Bench *b, Figures *f) {
        uint64_t s0, r0, s1, r1;
        unsigned n;
        member_bytes(b, &s0, &r0, &n);
        double c0 = coordinator_cpu(b), t0 = bench_now_s();
        usleep((useconds_t)(b->idle * 1e6));
        member_bytes(b, &s1, &r1, &n);
        double dt = bench_now_s() - t0;
        f->cpu_idle = (coordinator_cpu(b) - c0) / dt;
        f->hb_up = (double)(s1 - s0) / n / dt;
        f->hb_down = (double)(r1 - r0) / n / dt;
}

static int run_phases(Bench *b, Rng *rng, Figures *f) {
        int n = b->nodes;
        uint64_t t0 = now_ns(), last, e1, e2;
        int r = start_members(b, 0, n);
        if (r < 0)
                return r;
        if ((r = wait_plans(b, (unsigned)n, &last, &e1)) < 0)
                return r;
        f->first_s = ns_to_sec(last - last_join(b, 0, n));
        f->first_from_start_s = ns_to_sec(last - t0);
        f->cpu_first_s = coordinator_cpu(b);
        f->plan_bytes = e1 < MAX_EPOCHS ? b->raw_len[e1] : 0;
        idle(b, f);
        for (int i = 0; i < n; i++)
                f->dials += atomic_load(&b->m[i].dials);
        if ((r = leave(b, rng, n, e1, f, &e2)) < 0)
                return r;
        if (b->join > 0 && (r = join(b, rng, n, f->leave.n_nodes + (unsigned)b->join, e2, f)) < 0)
                return r;
        return 0;
}

static int rm_file(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int run_once(Bench *b, int run, int min_nodes, Figures *f) {
        Rng rng;
        int r;

        *f = (Figures){};
        rng_seed(&rng, b->seed + (uint64_t)run, RNG_STREAM_TEST);
        snprintf(b->dir, sizeof b->dir, "/tmp/ravnest-bench-coordinator-XXXXXX");
        if (!mkdtemp(b->dir))
                return -errno;
        if ((r = coordinator_start(b, min_nodes)) < 0) {
                fprintf(stderr, "bench-coordinator: the coordinator did not start (%s); see %s/coordinator.log\n",
                        strerror(-r), b->dir);
                return r;
        }
        b->m = calloc((size_t)(b->nodes + b->join), sizeof *b->m);
        if (!b->m)
                return -ENOMEM;
        atomic_store(&b->stop, false);
        b->n_members = b->nodes;
        for (int i = 0; i < b->nodes; i++)
                member_init(b, &b->m[i], &rng);
        r = run_phases(b, &rng, f);
        if (r == -ESRCH)
                fprintf(stderr, "bench-coordinator: the coordinator died; see %s/coordinator.log\n", b->dir);
        else if (r < 0)
                fprintf(stderr, "bench-coordinator: run %d: %s; see %s/coordinator.log\n", run + 1, strerror(-r),
                        b->dir);
        atomic_store(&b->stop, true);
        for (int i = 0; i < b->n_members; i++)
                member_stop(&b->m[i]);
        b->m = mfree(b->m);
        coordinator_stop(b, &f->cpu_s, &f->rss_mib);
        for (int e = 0; e < MAX_EPOCHS; e++)
                b->raw[e] = mfree(b->raw[e]);
        if (r == 0 && !b->keep)
                nftw(b->dir, rm_file, 16, FTW_DEPTH | FTW_PHYS);
        return r;
}

/* ---- main -------------------------------------------------------------- */

static void print_run(const Bench *b, int run, const Figures *f) {
        printf("run %d: first plan %.3f s after the last join (%.3f s from the first dial, %u dials), %zu bytes, "
               "%u clusters; coordinator CPU %.2f s to then, %.1f ms/s idle, peak RSS %.1f MiB\n",
               run + 1, f->first_s, f->first_from_start_s, f->dials, f->plan_bytes, f->leave.clusters_before,
               f->cpu_first_s, f->cpu_idle * 1e3, f->rss_mib);
        printf("       leave: %.3f s, %.1f%% moved (index), %.1f%% moved (work), %.1f%% asked for layers, %u -> %u "
               "clusters", f->leave.seconds, 100 * f->leave.moved_index, 100 * f->leave.moved_work,
               100 * f->leave.hand_in, f->leave.clusters_before, f->leave.clusters_after);
        if (b->join > 0)
                printf("; join: %.3f s, %.1f%% moved (index), %.1f%% moved (work), %.1f%% asked for layers",
                       f->join.seconds, 100 * f->join.moved_index, 100 * f->join.moved_work, 100 * f->join.hand_in);
        printf("\n");
}

#define MEDIAN_OF(field)                                                                                       \
        ({                                                                                                     \
                double v_[64];                                                                                 \
                for (int i_ = 0; i_ < n; i_++)                                                                 \
                        v_[i_] = (double)f[i_].field;                                                          \
                bench_median(v_, n);                                                                           \
        })

static void print_medians(const Bench *b, const Figures *f, int n, int min_nodes) {
        double frame = FRAME_HEADER_SIZE + FRAME_TAG_SIZE;
        printf("\nmedians over %d runs, %d members (a thread and a transport each, one process), ravnestd "
               "coordinating only:\n", n, b->nodes);
        printf("  first plan held by every member:   %.3f s after the last JOIN (membership.settle %.3g s of it; "
               "min_nodes %d)\n", MEDIAN_OF(first_s), b->settle, min_nodes);
        printf("  signed plan:                        %.0f bytes of PLAN_MAX_BYTES %d (%.0f%%), %.0f clusters\n",
               MEDIAN_OF(plan_bytes), PLAN_MAX_BYTES, 100 * MEDIAN_OF(plan_bytes) / PLAN_MAX_BYTES,
               MEDIAN_OF(leave.clusters_before));
        printf("  coordinator CPU:                    %.2f s to the first plan, %.1f ms per second while members "
               "heartbeat, %.2f s the whole run\n", MEDIAN_OF(cpu_first_s), 1e3 * MEDIAN_OF(cpu_idle),
               MEDIAN_OF(cpu_s));
        printf("  coordinator peak RSS:               %.1f MiB\n", MEDIAN_OF(rss_mib));
        printf("  heartbeat bytes per member:         %.1f B/s up, %.1f B/s down measured over %.3g s; frames give "
               "%.0f B (%d header + %d tag) per %.3g s each way = %.1f B/s (TCP/IP adds 52 B a segment)\n",
               MEDIAN_OF(hb_up), MEDIAN_OF(hb_down), b->idle, frame, FRAME_HEADER_SIZE, FRAME_TAG_SIZE,
               b->heartbeat, frame / b->heartbeat);
        printf("  %.3g%% leave at once:               every remaining member holds the new plan %.3f s later; "
               "moved: %.1f%% (cluster, stage) index, %.1f%% work; %.1f%% asked for their layers\n",
               b->leave, MEDIAN_OF(leave.seconds), 100 * MEDIAN_OF(leave.moved_index),
               100 * MEDIAN_OF(leave.moved_work), 100 * MEDIAN_OF(leave.hand_in));
        if (b->join > 0)
                printf("  %d join%s at once:                    every member holds the new plan %.3f s after the "
                       "last JOIN; moved: %.1f%% index, %.1f%% work; %.1f%% asked for their layers\n",
                       b->join, b->join > 1 ? "s" : "", MEDIAN_OF(join.seconds), 100 * MEDIAN_OF(join.moved_index),
                       100 * MEDIAN_OF(join.moved_work), 100 * MEDIAN_OF(join.hand_in));
}

/* 1 for --help, -EINVAL for a bad option or value. */
static int parse_options(int argc, char *argv[], Bench *b) {
        static const struct option options[] = {
                { "nodes", required_argument, NULL, 'n' },    { "runs", required_argument, NULL, 'r' },
                { "leave", required_argument, NULL, 'l' },    { "join", required_argument, NULL, 'J' },
                { "settle", required_argument, NULL, 's' },   { "heartbeat", required_argument, NULL, 'H' },
                { "idle", required_argument, NULL, 'i' },     { "job", required_argument, NULL, 'j' },
                { "seed", required_argument, NULL, 'S' },     { "keep", no_argument, NULL, 'k' },
                { "help", no_argument, NULL, 'h' },           {},
        };
        long long v;
        int c, r = 0;
        while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0 && r >= 0) {
                switch (c) {
                case 'n': r = option_int("nodes", optarg, 1, PLAN_MAX_NODES, &v); b->nodes = (int)v; break;
                case 'r': r = option_int("runs", optarg, 1, 64, &v); b->runs = (int)v; break;
                case 'l': b->leave = strtod(optarg, NULL); break;
                case 'J': r = option_int("join", optarg, 0, PLAN_MAX_NODES, &v); b->join = (int)v; break;
                case 's': b->settle = strtod(optarg, NULL); break;
                case 'H': b->heartbeat = strtod(optarg, NULL); break;
                case 'i': b->idle = strtod(optarg, NULL); break;
                case 'j': b->job_path = optarg; break;
                case 'S': r = option_int("seed", optarg, 0, INT32_MAX, &v); b->seed = (uint64_t)v; break;
                case 'k': b->keep = true; break;
                case 'h': return 1;
                default: return -EINVAL;
                }
        }
        if (r < 0 || !(b->leave >= 0 && b->leave < 100) || !(b->settle >= 0) || !(b->heartbeat >= 0.05) ||
            !(b->idle > 0) || b->nodes + b->join > PLAN_MAX_NODES)
                return -EINVAL;
        return 0;
}

/* Two descriptors a member (its epoll and its socket) in this process. */
static void raise_open_files(void) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void)setrlimit(RLIMIT_NOFILE, &rl);
        }
}

int main(int argc, char *argv[]) {
        static Bench b = { .nodes = 1000, .runs = 3, .leave = 10, .join = 1, .settle = 1.0, .heartbeat = 1.0,
                           .idle = 10.0, .seed = 1, .job_path = SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job" };
        Figures f[64];
        Job job;
        Diag d = {};
        int ok = 0, r;

        if ((r = parse_options(argc, argv, &b)) != 0) {
                fprintf(r > 0 ? stdout : stderr,
                        "Usage: bench-coordinator [--nodes N] [--runs N] [--leave PERCENT] [--join N] "
                        "[--settle S] [--heartbeat S] [--idle S] [--job FILE] [--seed N] [--keep]\n"
                        "The membership coordinator (a ravnestd) with N simulated members (default 1000): "
                        "time to the first plan,\nits CPU and memory, heartbeat bytes, and the plans after "
                        "--leave percent leave and --join join.\n");
                return r > 0 ? 0 : EX_USAGE;
        }
        if (sodium_init() < 0 || job_load(b.job_path, &job, &d) < 0) {
                fprintf(stderr, "bench-coordinator: %s\n", d.text);
                return EX_CONFIG;
        }
        CollModel model;
        if (averaging_model(&job.model, &model) < 0) {
                fprintf(stderr, "bench-coordinator: %s: the model does not check\n", b.job_path);
                return EX_CONFIG;
        }
        b.n_layers = (unsigned)job.model.n_layers;
        b.n_params = model.values;
        memcpy(b.model, model.digest, sizeof b.model);
        raise_open_files();
        signal(SIGPIPE, SIG_IGN);
        pthread_mutex_init(&b.lock, NULL);
        sem_init(&b.dial_slots, 0, DIAL_SLOTS);
        sem_init(&b.plan_slots, 0, PLAN_SLOTS);
        for (int i = 0; i < PLAN_SLOTS; i++)
                if (!(b.decode[i] = plan_new()))
                        return EX_OSERR;

        int min_nodes = b.nodes; /* the first plan at every member (membership.min_nodes goes to PLAN_MAX_NODES) */
        printf("bench-coordinator: %d members, job %s (%u layers, %llu parameters), settle %g s, heartbeat %g s, "
               "min_nodes %d, %d run%s\n", b.nodes, job.name, b.n_layers, (unsigned long long)b.n_params, b.settle,
               b.heartbeat, min_nodes, b.runs, b.runs > 1 ? "s" : "");
        fflush(stdout);
        for (int run = 0; run < b.runs; run++) {
                if (run_once(&b, run, min_nodes, &f[ok]) < 0)
                        continue;
                print_run(&b, run, &f[ok]);
                fflush(stdout);
                ok++;
        }
        if (ok > 0)
                print_medians(&b, f, ok, min_nodes);
        for (int i = 0; i < PLAN_SLOTS; i++)
                plan_free(b.decode[i]);
        return ok == b.runs ? 0 : 1;
}
