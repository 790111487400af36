/* net/probe.c — whether a node accepts connections where it says it does:
 * dial it, finish the handshake, look at the key it proves (net.h). */
#include <string.h>

#include "net.h"
#include "util/time-util.h"

typedef struct Probe {
        Net *net;
        bool connected, closed;
        int reason;
        uint8_t key[IDENTITY_PK_SIZE];
} Probe;

static void probe_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        Probe *p = ud;
        p->connected = true;
        memcpy(p->key, id, IDENTITY_PK_SIZE);
}

/* A node that proved its identity in its HELLO_REPLY answered, even if
 * it then closed the link before its WELCOME went out (as a stage does to
 * a peer that is not its neighbour). */
static void probe_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        Probe *p = ud;
        NetPeerInfo info;
        p->closed = true;
        p->reason = reason ? reason : -ECONNRESET;
        if (net_peer_describe(p->net, peer, &info) == 0 && info.key_known && reason != -EACCES) {
                p->connected = true;
                memcpy(p->key, info.key, IDENTITY_PK_SIZE);
        }
}

int net_probe(const NetConfig *c, const char *host, uint16_t port, const uint8_t key[IDENTITY_PK_SIZE]) {
        static const NetCallbacks cb = { .connected = probe_connected, .closed = probe_closed };
        NetConfig pc = *c;
        Probe p = {};
        uint32_t peer;
        int r;

        /* one link, nothing received but the handshake: no ring, no pool to speak of */
        pc.backend = NET_BACKEND_EPOLL;
        pc.pool_bytes = 64u << 10;
        pc.max_links = 1;
        pc.lanes = 1;
        pc.relay_host = NULL;
        pc.relay_wait = false;
        _cleanup_(net_freep) Net *n = NULL;
        if ((r = net_new(&pc, &cb, &p, &n)) < 0)
                return r;
        p.net = n;
        uint64_t deadline = now_ns() + (uint64_t)pc.handshake_timeout_ms * 1000000ull;
        if ((r = net_connect(n, host, port, &peer)) < 0)
                return r;
        while (!p.connected && !p.closed && now_ns() < deadline)
                net_run(n, 20);
        if (p.connected)
                return memcmp(p.key, key, IDENTITY_PK_SIZE) == 0 ? 0 : -EKEYREJECTED;
        return p.closed ? p.reason : -ETIMEDOUT;
}
