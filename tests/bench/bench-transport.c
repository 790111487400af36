/* bench-transport — tensor throughput between two processes on loopback,
 * beside iperf3's single TCP stream measured in the same run.
 *
 * For each frame size (1 MiB and 16 MiB tensors) and each configuration
 * (plaintext / AES-256-GCM / ChaCha20-Poly1305 / AEGIS-256, -X2, -X4, io_uring / epoll, SEND /
 * SEND_ZC) a receiver process is forked, the sender keeps its queue full for
 * --bytes bytes, and the receiver says when the last byte is in.
 * Configurations are interleaved run by run; medians are printed with the
 * ratio to iperf3. Then the peak RSS of a process holding 64 links with
 * full send queues.
 *
 * The "via relay" configurations run the same link through a relay
 * (net/relay.h) in a third process: the receiver waits there, the sender
 * asks for it; the relay's peak RSS is printed after the table.
 * --chunk sets the DATA payload per frame (max_frame in ravnestd.conf;
 * default 1 MiB), --only runs the configurations whose name holds a word.
 * --ciphers prints only each cipher's speed on one core (Seal, in place),
 * then its sealing out of memory no cache holds, against memcpy.
 *
 *     bench-transport [--runs N] [--bytes MiB] [--chunk KiB] [--only WORD] [--no-iperf] [--ciphers]
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "collective/coll-wire.h"
#include "net/net.h"
#include "net/relay.h"
#include "conf/option.h"
#include "bench.h"

#define MAX_RUNS 32
static const uint8_t secret[32] = "bench network secret...........";

typedef struct Mode {
        const char *name;
        Cipher cipher;
        NetBackendKind backend;
        size_t zc; /* 0: SEND; 1: SEND_ZC for every frame */
        bool relay; /* through a relay in a process of its own */
} Mode;

static const Mode modes[] = {
        { "plaintext io_uring send", CIPHER_NONE, NET_BACKEND_URING, 0 },
        { "plaintext io_uring send_zc", CIPHER_NONE, NET_BACKEND_URING, 1 },
        { "plaintext epoll", CIPHER_NONE, NET_BACKEND_EPOLL, 0 },
        { "aes256gcm io_uring send", CIPHER_AES256GCM, NET_BACKEND_URING, 0 },
        { "aes256gcm io_uring send_zc", CIPHER_AES256GCM, NET_BACKEND_URING, 1 },
        { "aes256gcm epoll", CIPHER_AES256GCM, NET_BACKEND_EPOLL, 0 },
        { "chacha20poly1305 io_uring", CIPHER_CHACHA20POLY1305, NET_BACKEND_URING, 0 },
        { "plaintext via relay", CIPHER_NONE, NET_BACKEND_URING, 0, true },
        { "aes256gcm via relay", CIPHER_AES256GCM, NET_BACKEND_URING, 0, true },
        { "aegis256 io_uring send", CIPHER_AEGIS256, NET_BACKEND_URING, 0 },
        { "aegis256x2 io_uring send", CIPHER_AEGIS256X2, NET_BACKEND_URING, 0 },
        { "aegis256x2 epoll", CIPHER_AEGIS256X2, NET_BACKEND_EPOLL, 0 },
        { "aegis256x2 via relay", CIPHER_AEGIS256X2, NET_BACKEND_URING, 0, true },
        { "aegis256x4 io_uring send", CIPHER_AEGIS256X4, NET_BACKEND_URING, 0 },
};
#define N_MODES (sizeof modes / sizeof modes[0])

/* A cipher this CPU lacks (no AES-NI, no VAES) is left out. */
static bool runs_here(const Mode *m) {
        return m->cipher == CIPHER_NONE || (cipher_available() & CIPHER_BIT(m->cipher));
}

static uint32_t chunk = 1u << 20;
static uint16_t relay_at;      /* the relay's port, while a relayed mode runs */
static long relay_rss_kib;     /* the relay's peak RSS over every relayed run */

static void config_for(NetConfig *c, const Identity *id, const Mode *m) {
        net_config_defaults(c);
        c->chunk = chunk;
        if (c->limits.max_payload < chunk)
                c->limits.max_payload = chunk;
        c->identity = id;
        c->secret = secret;
        c->backend = m->backend;
        c->plaintext = m->cipher == CIPHER_NONE;
        c->ciphers = m->cipher == CIPHER_NONE ? 0 : CIPHER_BIT(m->cipher);
        c->zc_threshold = m->zc;
        c->limits.max_tensor_bytes = 64u << 20;
        if (m->relay) {
                c->relay_host = "127.0.0.1";
                c->relay_port = relay_at;
                c->relay_channel = NET_RELAY_PIPELINE;
        }
}

/* ---- relay ---- */
static pid_t relay_start(void) {
        int fds[2];
        if (pipe(fds) < 0)
                exit(1);
        pid_t pid = fork();
        if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                close(fds[0]);
                Relay *r;
                /* as a node's relay: it checks each link's handshake against the secret */
                if (relay_new(&(RelayConfig){ .host = "127.0.0.1", .max_links = 4, .secret = secret }, &r) < 0)
                        _exit(2);
                uint16_t port = relay_port(r);
                if (write(fds[1], &port, sizeof port) != sizeof port)
                        _exit(3);
                for (;;)
                        pause();
        }
        close(fds[1]);
        if (read(fds[0], &relay_at, sizeof relay_at) != sizeof relay_at)
                exit(1);
        close(fds[0]);
        return pid;
}

static void relay_stop(pid_t pid) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
        FILE *f = fopen(path, "r");
        long kib;
        while (f && fgets(line, sizeof line, f))
                if (sscanf(line, "VmHWM: %ld", &kib) == 1 && kib > relay_rss_kib)
                        relay_rss_kib = kib;
        if (f)
                fclose(f);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
}

/* ---- receiver ---- */
typedef struct Rx {
        Net *n;
        uint64_t want, got;
        uint32_t peer;
        int done;
} Rx;

static void rx_tensor(void *ud, NetTensor *t) {
        Rx *r = ud;
        r->got += t->desc.bytes;
        r->peer = t->peer;
        net_tensor_release(r->n, t);
        if (r->got >= r->want && !r->done) {
                net_send_control(r->n, r->peer, FRAME_CONTROL, "done", 4);
                r->done = 1;
        }
}

static void rx_closed(void *ud, uint32_t peer, int reason, const uint8_t id[32]) {
        ((Rx *)ud)->done = 2;
}

/* Where a receiver is: its port, or (through a relay) its key. */
typedef struct RxAddr {
        uint16_t port;
        uint8_t key[IDENTITY_PK_SIZE];
} RxAddr;

/* In a forked child: a receiver listening, or waiting at the relay; where
 * it is goes to fd. */
static void child_listen(const Mode *m, Rx *r, const NetCallbacks *cb, int fd) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        static Identity id;
        identity_generate(&id);
        NetConfig c;
        config_for(&c, &id, m);
        c.relay_wait = m->relay;
        RxAddr a = {};
        memcpy(a.key, id.pk, sizeof a.key);
        if (net_new(&c, cb, r, &r->n) < 0 || (!m->relay && net_listen(r->n, "127.0.0.1", 0, &a.port) < 0))
                _exit(2);
        if (m->relay) /* its connection waits at the relay before the sender asks */
                for (int i = 0; i < 5; i++)
                        net_run(r->n, 10);
        if (write(fd, &a, sizeof a) != sizeof a)
                _exit(3);
}

static pid_t receiver_start(const Mode *m, uint64_t want, RxAddr *ret) {
        int fds[2];
        if (pipe(fds) < 0)
                exit(1);
        pid_t pid = fork();
        if (pid == 0) {
                close(fds[0]);
                static Rx r;
                r.want = want;
                child_listen(m, &r, &(NetCallbacks){ .tensor = rx_tensor, .closed = rx_closed }, fds[1]);
                for (int i = 0; i < 100000 && r.done != 2; i++)
                        net_run(r.n, 10);
                net_free(r.n);
                _exit(0);
        }
        close(fds[1]);
        if (read(fds[0], ret, sizeof *ret) != sizeof *ret)
                exit(1);
        close(fds[0]);
        return pid;
}

/* ---- sender ---- */
typedef struct Tx {
        Net *n;
        uint32_t peer;
        int connected, done, closed;
} Tx;

static void tx_connected(void *ud, uint32_t peer, const uint8_t id[32]) {
        ((Tx *)ud)->connected = 1;
}
static void tx_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        ((Tx *)ud)->done = 1;
}
static void tx_closed(void *ud, uint32_t peer, int reason, const uint8_t id[32]) {
        ((Tx *)ud)->closed = reason ? reason : 1;
}

/* Bytes per second, or negative on failure. */
static double measure(const Mode *m, size_t frame, uint64_t total, const uint8_t *data, const char **ret_backend) {
        uint64_t count = total / frame;
        RxAddr to;
        pid_t relay = m->relay ? relay_start() : 0;
        pid_t pid = receiver_start(m, count * frame, &to);
        Identity id;
        identity_generate(&id);
        NetConfig c;
        config_for(&c, &id, m);
        Tx t = {};
        NetCallbacks cb = { .connected = tx_connected, .control = tx_control, .closed = tx_closed };
        double rate = -1;

        if (net_new(&c, &cb, &t, &t.n) < 0 ||
            (m->relay ? net_connect_relayed(t.n, to.key, &t.peer) : net_connect(t.n, "127.0.0.1", to.port, &t.peer)) < 0)
                goto out;
        *ret_backend = net_backend_name(t.n);
        for (int i = 0; i < 1000 && !t.connected && !t.closed; i++)
                net_run(t.n, 5);
        if (!t.connected || net_peer_cipher(t.n, t.peer) != (int)m->cipher)
                goto out;

        TensorDesc d;
        tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ (uint32_t)frame });
        uint64_t sent = 0;
        double t0 = bench_now_s();
        while (!t.done && !t.closed) {
                /* keep about 32 MiB queued: the link never waits for us */
                while (sent < count && net_queued(t.n, t.peer) < (int64_t)(32u << 20) &&
                       net_send_tensor(t.n, t.peer, 1, &d, data, sent) == 0)
                        sent++;
                net_run(t.n, sent < count ? 0 : 10);
        }
        if (t.done)
                rate = (double)(count * frame) / (bench_now_s() - t0);
out:
        net_free(t.n);
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        if (relay)
                relay_stop(relay);
        return rate;
}

/* ---- iperf3 ---- */
static double iperf3(int seconds) {
        char cmd[256];
        int port = 45000 + (int)(getpid() % 1000);
        snprintf(cmd, sizeof cmd, "iperf3 -s -1 -p %d -B 127.0.0.1 >/dev/null 2>&1 & sleep 0.3; "
                 "iperf3 -c 127.0.0.1 -p %d -t %d -J 2>/dev/null", port, port, seconds);
        FILE *f = popen(cmd, "r");
        if (!f)
                return -1;
        static char buf[1 << 17];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        pclose(f);
        /* "sum_received": { ... "bits_per_second": X */
        const char *p = strstr(buf, "\"sum_received\"");
        p = p ? strstr(p, "\"bits_per_second\":") : NULL;
        return p ? atof(p + 18) / 8.0 : -1;
}

static double median(double *v, int n) {
        double s[MAX_RUNS];
        int k = 0;
        for (int i = 0; i < n; i++)
                if (v[i] > 0)
                        s[k++] = v[i];
        return k ? bench_median(s, k) : -1;
}

/* ---- memory: 64 links with full queues ---- */
static void memory_figure(void) {
        enum { LINKS = 64 };
        const Mode *m = &modes[3]; /* aes256gcm io_uring */
        int fds[2];
        if (pipe(fds) < 0)
                return;
        pid_t pid = fork();
        if (pid == 0) {
                /* The measured process: accepts 64 links and fills each one's
                 * send queue with 16 MiB tensors (one shared buffer) while
                 * the peers send it 1 MiB tensors. */
                close(fds[0]);
                static Rx r;
                r.want = UINT64_MAX;
                child_listen(m, &r, &(NetCallbacks){ .tensor = rx_tensor }, fds[1]);
                uint8_t *big = calloc(1, 16u << 20);
                TensorDesc d;
                tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ 16u << 20 });
                double end = bench_now_s() + 4;
                while (bench_now_s() < end) {
                        for (uint32_t p = 1; p <= LINKS + 1; p++)
                                while (net_send_tensor(r.n, p, 1, &d, big, 0) == 0)
                                        ;
                        net_run(r.n, 5);
                }
                NetStats st;
                net_get_stats(r.n, &st);
                struct rusage ru;
                getrusage(RUSAGE_SELF, &ru);
                dprintf(fds[1], "%ld %u\n", ru.ru_maxrss, st.links);
                _exit(0);
        }
        close(fds[1]);
        RxAddr at;
        if (read(fds[0], &at, sizeof at) != sizeof at)
                return;
        uint16_t port = at.port;
        Identity id;
        identity_generate(&id);
        NetConfig c;
        config_for(&c, &id, m);
        Tx t = {};
        NetCallbacks cb = { .connected = tx_connected };
        net_new(&c, &cb, &t, &t.n);
        uint32_t peers[LINKS];
        for (int i = 0; i < LINKS; i++)
                net_connect(t.n, "127.0.0.1", port, &peers[i]);
        static uint8_t one[1 << 20];
        TensorDesc d;
        tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ 1u << 20 });
        double end = bench_now_s() + 4.5;
        while (bench_now_s() < end) {
                for (int i = 0; i < LINKS; i++)
                        if (net_queued(t.n, peers[i]) < (4 << 20))
                                net_send_tensor(t.n, peers[i], 1, &d, one, 0);
                net_run(t.n, 2);
        }
        char buf[64] = {};
        ssize_t k = read(fds[0], buf, sizeof buf - 1);
        long kib = 0;
        unsigned links = 0;
        if (k > 0)
                sscanf(buf, "%ld %u", &kib, &links);
        printf("\npeak RSS of a process holding %u links with full send queues (16 MiB tensors, "
               "aes256gcm, io_uring): %.1f MiB\n", links, (double)kib / 1024.0);
        net_free(t.n);
        waitpid(pid, NULL, 0);
}

/* ---- one core: each cipher sealing and opening 1 MiB frames in place ---- */

/* Seconds to seal `frames` frames of len bytes in place, one thread, and
 * to open each after it is sealed too (open true; each must open). */
static double seal_time(Cipher c, bool open, uint8_t *buf, size_t len, int frames) {
        uint8_t key[SEAL_KEY_SIZE] = { 7 }, hdr[FRAME_HEADER_SIZE], tag[FRAME_TAG_SIZE];
        Seal tx, rx;

        if (seal_init(&tx, c, key, key) < 0 || seal_init(&rx, c, key, key) < 0)
                return -1;
        double t0 = bench_now_s();
        for (int i = 0; i < frames; i++) {
                FrameHeader h = { .type = FRAME_DATA, .stream = 1 };
                seal_frame(&tx, &h, hdr, buf, len, tag);
                if (open && seal_open(&rx, hdr, &h, buf, len, tag) < 0)
                        abort();
        }
        double t = bench_now_s() - t0;
        seal_clear(&tx);
        seal_clear(&rx);
        return t;
}

/* ---- the same out of memory: what the all-reduce's sealing meets ----- */

#define COLD_PIECE (COLL_PIECE_HEADER + COLL_PIECE_BYTES) /* the all-reduce's piece, 1 MiB */
#define COLD_REGION (256u << 20) /* far larger than any cache here */

/* GB/s of sealing (or, with c CIPHER_NONE, of memcpy) 1 MiB pieces taken
 * in turn from a region no cache holds, into one stage that stays hot. */
static double cold_rate(Cipher c, const uint8_t *region, uint8_t *stage) {
        uint8_t key[SEAL_KEY_SIZE] = { 7 }, hdr[FRAME_HEADER_SIZE], tag[FRAME_TAG_SIZE];
        size_t pieces = COLD_REGION / COLD_PIECE;
        Seal tx;

        if (c != CIPHER_NONE && seal_init(&tx, c, key, key) < 0)
                return -1;
        double t0 = bench_now_s();
        for (size_t i = 0; i < pieces; i++) {
                FrameHeader h = { .type = FRAME_DATA, .stream = 1 };
                if (c == CIPHER_NONE)
                        memcpy(stage, region + i * COLD_PIECE, COLD_PIECE);
                else
                        seal_frame_to(&tx, &h, hdr, stage, region + i * COLD_PIECE, COLD_PIECE, tag);
        }
        double t = bench_now_s() - t0;
        if (c != CIPHER_NONE)
                seal_clear(&tx);
        return (double)COLD_REGION / t / 1e9;
}

static void cold_figures(int runs) {
        static const Cipher ciphers[] = { CIPHER_NONE, CIPHER_AES256GCM, CIPHER_AEGIS256X2, CIPHER_AEGIS256X4 };
        enum { N = sizeof ciphers / sizeof *ciphers };
        double rate[N][MAX_RUNS] = {};
        uint8_t *region = malloc(COLD_REGION), *stage = malloc(COLD_PIECE);
        if (!region || !stage)
                abort();
        for (size_t i = 0; i < COLD_REGION; i++)
                region[i] = (uint8_t)(i * 2654435761u >> 24);
        for (int run = 0; run < runs; run++)
                for (int k = 0; k < N; k++)
                        rate[k][run] = ciphers[k] == CIPHER_NONE || cipher_available() & CIPHER_BIT(ciphers[k])
                                               ? cold_rate(ciphers[k], region, stage)
                                               : -1;
        double ref = median(rate[0], runs);
        printf("\nOne core, 1 MiB pieces sealed out of %u MiB of memory (no cache holds it) into one stage, "
               "median of %d runs (against memcpy of the same)\n%-20s %16s\n%-20s %6.2f GB/s\n",
               COLD_REGION >> 20, runs, "cipher", "seal", "memcpy", ref);
        for (int k = 1; k < N; k++) {
                double s = median(rate[k], runs);
                if (s < 0)
                        printf("%-20s not on this CPU\n", cipher_to_string(ciphers[k]));
                else
                        printf("%-20s %6.2f GB/s %4.2fx\n", cipher_to_string(ciphers[k]), s, s / ref);
        }
        free(region);
        free(stage);
}

static void cipher_figures(int runs) {
        static const Cipher ciphers[] = { CIPHER_AES256GCM, CIPHER_CHACHA20POLY1305, CIPHER_AEGIS256,
                                          CIPHER_AEGIS256X2, CIPHER_AEGIS256X4 };
        enum { N = sizeof ciphers / sizeof *ciphers };
        double rate[N][2][MAX_RUNS] = {};
        size_t len = 1u << 20;
        int frames = 512;
        uint8_t *buf = malloc(len);
        for (size_t i = 0; i < len; i++)
                buf[i] = (uint8_t)(i * 2654435761u >> 24);
        for (int run = 0; run < runs; run++) /* interleaved, as the links are */
                for (int k = 0; k < N; k++) {
                        if (!(cipher_available() & CIPHER_BIT(ciphers[k])))
                                continue;
                        /* opening: sealing and opening, less sealing alone */
                        double seal = seal_time(ciphers[k], false, buf, len, frames);
                        double both = seal_time(ciphers[k], true, buf, len, frames);
                        rate[k][0][run] = (double)frames * (double)len / seal / 1e9;
                        rate[k][1][run] = both > seal ? (double)frames * (double)len / (both - seal) / 1e9 : -1;
                }
        double ref_seal = median(rate[0][0], runs), ref_open = median(rate[0][1], runs);
        printf("One core, 1 MiB frames sealed and opened in place, median of %d runs of 512 MiB "
               "(against AES-256-GCM in libcrypto)\n%-20s %16s %16s\n", runs, "cipher", "seal", "open");
        for (int k = 0; k < N; k++) {
                double s = median(rate[k][0], runs), o = median(rate[k][1], runs);
                if (s < 0) {
                        printf("%-20s not on this CPU\n", cipher_to_string(ciphers[k]));
                        continue;
                }
                printf("%-20s %6.2f GB/s %4.2fx %6.2f GB/s %4.2fx\n", cipher_to_string(ciphers[k]), s, s / ref_seal, o,
                       o / ref_open);
        }
        free(buf);
}

static void usage(FILE *f) {
        fprintf(f, "Usage: bench-transport [--runs N] [--bytes MiB] [--chunk KiB] [--only WORD] [--no-iperf] "
                   "[--ciphers]\n"
                   "Throughput of the transport on loopback, against iperf3 (the reference).\n"
                   "  --ciphers     only each cipher's speed on one core, against AES-256-GCM,\n"
                   "                then sealing out of memory, against memcpy\n"
                   "  --chunk KiB   DATA payload per frame (max_frame; default 1024)\n"
                   "  --only WORD   only the configurations whose name holds WORD (e.g. aes256gcm)\n");
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "runs", required_argument, NULL, 'r' },
                { "bytes", required_argument, NULL, 'b' },
                { "no-iperf", no_argument, NULL, 'n' },
                { "chunk", required_argument, NULL, 'c' },
                { "only", required_argument, NULL, 'o' },
                { "ciphers", no_argument, NULL, 'C' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int runs = 5, use_iperf = 1, ciphers_only = 0, c;
        const char *only = "";
        uint64_t total = 1024ull << 20;
        long long n = 0;
        while ((c = getopt_long(argc, argv, "r:b:c:o:nh", options, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case 'r': r = option_int("runs", optarg, 1, MAX_RUNS, &n); runs = (int)n; break;
                case 'b': r = option_int("bytes", optarg, 16, 1 << 20, &n); total = (uint64_t)n << 20; break;
                case 'n': use_iperf = 0; break;
                case 'c': r = option_int("chunk", optarg, 4, 64 << 10, &n); chunk = (uint32_t)n << 10; break;
                case 'o': only = optarg; break;
                case 'C': ciphers_only = 1; break;
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
        if (ciphers_only) {
                cipher_figures(runs);
                cold_figures(runs);
                return 0;
        }
        if (use_iperf && system("command -v iperf3 >/dev/null") != 0) {
                fprintf(stderr, "bench-transport: iperf3 not found (apt-get install iperf3), or pass --no-iperf\n");
                return 1;
        }
        signal(SIGPIPE, SIG_IGN);

        static const size_t frames[] = { 1u << 20, 16u << 20 };
        static double rate[2][N_MODES][MAX_RUNS], ip[MAX_RUNS];
        const char *backend[N_MODES] = {};
        uint8_t *data = malloc(16u << 20);
        for (size_t i = 0; i < (16u << 20); i++)
                data[i] = (uint8_t)(i * 2654435761u >> 24);

        printf("%d runs of %llu MiB per configuration, interleaved, %u KiB per frame; AES-256-GCM %s on this CPU\n",
               runs, (unsigned long long)(total >> 20), chunk >> 10, cipher_available() & CIPHER_BIT(CIPHER_AES256GCM) ? "available" : "NOT available");
        for (int run = 0; run < runs; run++) {
                if (use_iperf)
                        ip[run] = iperf3(2);
                for (size_t f = 0; f < 2; f++)
                        for (size_t m = 0; m < N_MODES; m++) {
                                if (!strstr(modes[m].name, only) || !runs_here(&modes[m]))
                                        continue;
                                rate[f][m][run] = measure(&modes[m], frames[f], total, data, &backend[m]);
                                fprintf(stderr, "%s, %zu MiB frames: %.2f GB/s\n", modes[m].name,
                                                frames[f] >> 20, rate[f][m][run] / 1e9);
                        }
        }

        double ipm = use_iperf ? median(ip, runs) : -1;
        if (use_iperf)
                printf("\niperf3, one TCP stream on loopback: %.2f GB/s (median)\n", ipm / 1e9);
        printf("\n%-30s %14s %14s\n", "configuration", "1 MiB frames", "16 MiB frames");
        for (size_t m = 0; m < N_MODES; m++) {
                if (!strstr(modes[m].name, only) || !runs_here(&modes[m]))
                        continue;
                printf("%-30s", modes[m].name);
                for (size_t f = 0; f < 2; f++) {
                        double v = median(rate[f][m], runs);
                        if (v < 0)
                                printf(" %14s", "failed");
                        else if (ipm > 0)
                                printf("   %5.2f GB/s %4.2fx", v / 1e9, v / ipm);
                        else
                                printf("   %5.2f GB/s      ", v / 1e9);
                }
                printf("%s\n", backend[m] && strcmp(backend[m], modes[m].backend == NET_BACKEND_EPOLL ? "epoll" : "io_uring") ? "  (backend differs!)" : "");
        }
        if (relay_rss_kib)
                printf("\npeak RSS of the relay process (its links' buffers and sockets): %.1f MiB\n",
                       (double)relay_rss_kib / 1024.0);
        memory_figure();
        free(data);
        return 0;
}
