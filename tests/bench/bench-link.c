/* bench-link — one encrypted link's throughput between two hosts (network
 * namespaces, for tests/bench/bench-lanes.sh), with a given number of TCP
 * connections (NetConfig.lanes).
 *
 *     bench-link serve HOST PORT SECRET_HEX               # until killed
 *     bench-link send HOST PORT SECRET_HEX LANES SECONDS  # prints MB/s
 *
 * The sender keeps 64 MiB of 4 MiB tensors queued for SECONDS, then asks
 * the server what it received; the server counts whole tensors from the
 * first to the last and answers with their bytes and the time between
 * (the first tensor's own transfer not counted), so the figure is what
 * crossed the path while it was full. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "net/net.h"
#include "bench.h"

#define TENSOR (4u << 20)

typedef struct End {
        Net *n;
        uint32_t peer;
        bool connected, closed, answered;
        uint64_t bytes;      /* server: after the first tensor */
        double first, last;  /* server: when the first and the last tensor came */
        double rate;         /* sender: the server's answer, bytes/s */
} End;

static void on_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        End *e = ud;
        e->peer = peer;
        e->connected = true;
        e->bytes = 0;
        e->first = e->last = 0;
}

static void on_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        End *e = ud;
        e->closed = true;
        e->connected = false;
}

static void on_tensor(void *ud, NetTensor *t) {
        End *e = ud;
        double now = bench_now_s();
        if (e->first == 0)
                e->first = now;
        else
                e->bytes += t->desc.bytes;
        e->last = now;
        net_tensor_release(e->n, t);
}

static void on_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        End *e = ud;
        if (len == 4 && !memcmp(p, "RATE", 4)) { /* server: the answer */
                double rate = e->last > e->first ? (double)e->bytes / (e->last - e->first) : 0;
                net_send_control(e->n, peer, FRAME_CONTROL, &rate, sizeof rate);
        } else if (len == sizeof(double)) {
                memcpy(&e->rate, p, sizeof e->rate);
                e->answered = true;
        }
}

static const NetCallbacks callbacks = {
        .connected = on_connected, .closed = on_closed, .tensor = on_tensor, .control = on_control,
};

static int parse_secret(const char *hex, uint8_t out[32]) {
        if (strlen(hex) != 64)
                return -1;
        for (int i = 0; i < 32; i++)
                if (sscanf(hex + 2 * i, "%2hhx", &out[i]) != 1)
                        return -1;
        return 0;
}

int main(int argc, char **argv) {
        uint8_t secret[32];
        if (argc < 5 || parse_secret(argv[4], secret) < 0 || (strcmp(argv[1], "serve") && argc < 7)) {
                fprintf(stderr, "Usage: bench-link serve HOST PORT SECRET_HEX\n"
                                "       bench-link send HOST PORT SECRET_HEX LANES SECONDS\n");
                return EX_USAGE;
        }
        bool serve = !strcmp(argv[1], "serve");
        Identity id;
        identity_generate(&id);
        NetConfig c;
        net_config_defaults(&c);
        c.identity = &id;
        c.secret = secret;
        c.max_queued = 128u << 20;
        c.pool_bytes = 128u << 20;
        c.handshake_timeout_ms = 10000;
        if (getenv("BENCH_LINK_EPOLL")) /* the epoll backend instead of io_uring */
                c.backend = NET_BACKEND_EPOLL;
        End e = {};
        if (net_new(&c, &callbacks, &e, &e.n) < 0)
                return EX_OSERR;
        uint16_t port = (uint16_t)atoi(argv[3]);
        if (serve) {
                if (net_listen(e.n, argv[2], port, NULL) < 0)
                        return EX_OSERR;
                for (;;)
                        net_run(e.n, 100);
        }

        net_free(e.n);
        c.lanes = (unsigned)atoi(argv[5]);
        if (net_new(&c, &callbacks, &e, &e.n) < 0 || net_connect(e.n, argv[2], port, &e.peer) < 0)
                return EX_UNAVAILABLE;
        for (int i = 0; i < 1000 && !e.connected && !e.closed; i++)
                net_run(e.n, 10);
        if (!e.connected)
                return EX_UNAVAILABLE;
        static uint8_t data[TENSOR];
        memset(data, 0x5a, sizeof data);
        TensorDesc d;
        tensor_desc_init(&d, DTYPE_U8, 1, (uint32_t[]){ TENSOR });
        double end = bench_now_s() + atof(argv[6]);
        uint64_t cookie = 0;
        while (bench_now_s() < end && e.connected) {
                while (net_queued(e.n, e.peer) < (int64_t)(64u << 20) &&
                       net_send_tensor(e.n, e.peer, 1, &d, data, cookie) == 0)
                        cookie++;
                net_run(e.n, 5);
        }
        net_send_control(e.n, e.peer, FRAME_CONTROL, "RATE", 4);
        for (int i = 0; i < 6000 && !e.answered && e.connected; i++)
                net_run(e.n, 5);
        if (!e.answered)
                return EX_UNAVAILABLE;
        printf("%.1f\n", e.rate / 1e6);
        net_free(e.n);
        return 0;
}
