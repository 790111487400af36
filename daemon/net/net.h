/* net/net.h — authenticated, encrypted tensor streams between nodes.
 *
 * A Net is one thread's endpoint: its listener, its links to peers, and its
 * I/O backend (io_uring, or epoll where io_uring is unavailable or turned
 * off). Every link runs the handshake of handshake.h, then carries frames
 * protected by seal.h. Tensors are received straight into buffers of a
 * pool and handed to the application, which releases them.
 * Everything a peer controls is bounded (net_config_defaults() lists the
 * limits); a peer that breaks a rule loses its link and nobody else notices.
 *
 *     NetConfig c;
 *     net_config_defaults(&c);
 *     c.identity = &id;  c.secret = secret;   // or c.allowed / c.n_allowed
 *     Net *n;
 *     r = net_new(&c, &callbacks, userdata, &n);
 *     r = net_listen(n, "127.0.0.1", 0, &port);
 *     r = net_connect(n, "127.0.0.1", port, &peer);
 *     r = net_send_tensor(n, peer, stream, &desc, data, cookie);  // data lives until sent()
 *     for (;;) net_run(n, 100);                                   // dispatches callbacks
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "identity.h"
#include "seal.h"
#include "util/macro.h"

typedef enum NetBackendKind {
        NET_BACKEND_AUTO,  /* io_uring, else epoll with a warning in NetStats */
        NET_BACKEND_URING,
        NET_BACKEND_EPOLL,
} NetBackendKind;

#define NET_ZC_AUTO SIZE_MAX
#define NET_LANES_MAX 8

typedef struct NetConfig {
        const Identity *identity;
        const uint8_t *secret; /* HANDSHAKE_SECRET_SIZE bytes, or NULL */
        const uint8_t (*allowed)[IDENTITY_PK_SIZE];
        size_t n_allowed;
        bool plaintext;        /* benchmarks only: refused unless both ends are on loopback */
        uint32_t ciphers;      /* CIPHER_BIT()s to offer; 0: every one this machine has */
        NetBackendKind backend;
        /* Frames of at least this many bytes go out with SEND_ZC (io_uring
         * only). A link's sealed frame sits in its one staging buffer,
         * which a zero-copy send holds until the peer has acknowledged
         * every byte of it: one frame per round trip (8 MB/s at 100 ms,
         * against 110 MB/s with SEND; slower on loopback too, where the
         * kernel copies anyway). NET_ZC_AUTO: never, as 0. */
        size_t zc_threshold;
        FrameLimits limits;
        uint32_t chunk;            /* DATA payload per frame when sending */
        /* Connections per link this node dials (1 to NET_LANES_MAX; 0 is
         * 1): a tensor's chunks go round them, so a link over a long fat
         * path is not held to what one TCP connection's window carries.
         * The application sees one link all the same: one connected(),
         * items delivered in the order they were sent, one closed() when
         * any connection is lost. A node accepts whatever its peer dials. */
        unsigned lanes;
        uint64_t max_queued;       /* bytes queued to one peer before sends fail */
        uint64_t max_receive_bytes; /* tensors being received, all links together */
        unsigned max_links;
        unsigned max_links_per_addr;
        unsigned handshake_timeout_ms;
        unsigned idle_timeout_ms;  /* no complete frame for this long: drop (peers heartbeat) */
        unsigned stall_timeout_ms; /* stopped mid-frame for this long: drop */
        size_t pool_bytes;         /* the receive region (bufpool.h) */
        /* A relay (relay.h) for links to nodes that accept no connections:
         * net_connect_relayed() asks it for a peer; with relay_wait, the Net
         * keeps one connection waiting there for whoever asks for this node. */
        const char *relay_host;    /* NULL: no relay */
        uint16_t relay_port;
        bool relay_wait;
        uint8_t relay_channel;     /* which of a node's Nets: NET_RELAY_* below */
} NetConfig;

/* A node waits at a relay once per channel: its links of one kind (the
 * pipeline's, the averaging group's) each have their own. */
#define NET_RELAY_PIPELINE 1
#define NET_RELAY_AVERAGING 2

void net_config_defaults(NetConfig *c);

typedef struct NetTensor {
        uint32_t peer;
        uint32_t stream;
        TensorDesc desc;
        uint8_t *data; /* desc.bytes bytes, owned by the Net until net_tensor_release() */
} NetTensor;

/* Which deadline a link missed (reason -ETIMEDOUT). */
typedef enum NetTimeout {
        NET_TIMEOUT_NONE,
        NET_TIMEOUT_HANDSHAKE, /* handshake_timeout_ms: not open, WELCOME included */
        NET_TIMEOUT_STALL,     /* stall_timeout_ms: stopped mid-frame, or a tensor stopped growing */
        NET_TIMEOUT_IDLE,      /* idle_timeout_ms: no complete frame */
        NET_TIMEOUT_SLOW,      /* a tensor so slow to come (a minute or more to go, at its rate so
                                * far) that it gave way to another under max_receive_bytes */
} NetTimeout;

/* What the transport knows of a link, for the application's logs. */
typedef struct NetPeerInfo {
        char address[64];     /* the peer's "192.0.2.7:41234" or "[2001:db8::7]:7000" */
        bool open;            /* the handshake finished (WELCOME sent or received) */
        bool reached;         /* the TCP connection was made; false: dialing it failed (refused,
                               * unreachable, or not answered within the handshake timeout) */
        bool key_known;       /* key is the identity the peer proved with its */
        uint8_t key[IDENTITY_PK_SIZE]; /* signature, admitted or not */
        NetTimeout timeout;   /* closed with -ETIMEDOUT: which deadline */
        uint8_t peer_version; /* closed with -EPROTONOSUPPORT: the version the peer sent */
} NetPeerInfo;

const char *net_timeout_to_string(NetTimeout t);

typedef struct NetCallbacks {
        /* The handshake finished; id is the peer's identity. */
        void (*connected)(void *userdata, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]);
        /* A whole tensor arrived and was authenticated. */
        void (*tensor)(void *userdata, NetTensor *t);
        /* A PLAN or CONTROL frame. */
        void (*control)(void *userdata, uint32_t peer, uint8_t type, const uint8_t *payload, size_t len);
        /* The data of a net_send_tensor() is no longer needed. */
        void (*sent)(void *userdata, uint32_t peer, uint64_t cookie);
        /* The link is gone: 0 for an orderly BYE, else why (-EBADMSG bad or
         * forged frame, -EACCES not admitted, -EKEYREJECTED a small-order
         * ephemeral key, -EPROTONOSUPPORT another protocol version,
         * -EMSGSIZE over a limit, -ETIMEDOUT, -ECONNRESET, ...). id is all
         * zero before the handshake. net_peer_describe() tells more (the
         * address, which timeout, the version) during this call. */
        void (*closed)(void *userdata, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]);
        /* A peer's other connection of a link of several lanes (NetConfig.lanes)
         * finished its handshake and was refused before it joined: its LANE
         * frame named no link of that peer that waits for one (-ENOLINK), or
         * broke the rules (-EBADMSG: another frame first, an index out of
         * range or taken), or did not come within the handshake timeout
         * (-ETIMEDOUT); or the peer closed it first (0, -ECONNRESET). The
         * application had no connected() of it and hears no closed(): this,
         * once a connection, with what the transport knew of it (the key the
         * peer proved, its address). */
        void (*lane_refused)(void *userdata, int reason, const NetPeerInfo *info);
} NetCallbacks;

typedef struct NetStats {
        uint64_t bytes_sent, bytes_received;
        uint64_t frames_sent, frames_received;
        uint64_t links_accepted, links_rejected; /* rejected: over a connection limit */
        uint64_t links_in;                       /* links a peer dialed that finished the handshake */
        uint64_t auth_failures;                  /* handshake refused or failed */
        uint64_t bad_frames;                     /* malformed, forged, replayed, reordered */
        uint64_t limit_violations;               /* oversized, flooding, too slow */
        uint64_t timeouts;
        unsigned links;      /* every link, in its handshake or closing included (not its other lanes) */
        unsigned links_open; /* of them, those whose handshake finished and that are not closing: peers */
        size_t pool_in_use;
        bool fallback; /* io_uring was asked for (auto) but is unavailable */
        int fallback_error;
} NetStats;

typedef struct Net Net;

int net_new(const NetConfig *c, const NetCallbacks *cb, void *userdata, Net **ret);
/* Says BYE on every open link (after the frame each is sending, if any),
 * waits at most NET_BYE_FLUSH_MS until the peers' TCP has acknowledged all
 * of it (a lossy link retransmits for a while), then closes everything. No
 * callback runs but sent() for what was still queued. */
#define NET_BYE_FLUSH_MS 2000
Net *net_free(Net *n);
DEFINE_TRIVIAL_CLEANUP_FUNC(Net *, net_free);
const char *net_backend_name(const Net *n);

/* Listens on host:port (0: any; the port in *ret_port); -EADDRINUSE at
 * once if the port is taken. */
int net_listen(Net *n, const char *host, uint16_t port, uint16_t *ret_port);
/* The same, but a port in use is tried again for up to wait_ms before
 * -EADDRINUSE: the listening socket of a node that has just died lingers
 * until the kernel has torn down its io_uring, so a node started again at
 * once waits NET_LISTEN_WAIT_MS for it. The caller, which had -EADDRINUSE
 * from net_listen(), says that it waits: nothing here does. */
#define NET_LISTEN_WAIT_MS 10000
int net_listen_wait(Net *n, const char *host, uint16_t port, unsigned wait_ms, uint16_t *ret_port);

/* Listening sockets this process was handed (a service manager's
 * LISTEN_FDS, or ravnestctl swarm's): from now on net_listen() on the
 * address one of them is bound to listens on a copy of it instead of
 * binding, so no other process can take the port in between. At most
 * NET_INHERITED_MAX; -ENOTSOCK if one is not a listening TCP socket (none
 * is kept then). The process keeps them open until it exits. */
#define NET_INHERITED_MAX 16
int net_inherit_listeners(const int *fds, size_t n);
/* A socket listening on host:port (0: any) as net_listen()'s, for a
 * process to hand to another (ravnestctl swarm's nodes): its descriptor,
 * the port in *ret_port; -EADDRINUSE at once if the port is taken. */
int net_listen_socket(const char *host, uint16_t port, uint16_t *ret_port);
int net_connect(Net *n, const char *host, uint16_t port, uint32_t *ret_peer);

/* Open a link to the node with key target through the configured relay
 * (it must be waiting there): the handshake then runs through the relay as
 * on any link. -ENOTCONN: no relay configured. Like net_connect(), it does
 * not wait: the relay's refusal comes as closed(), -EHOSTUNREACH (nobody
 * waits with that key), -EBUSY (the relay is full), -EACCES (refused), and
 * a relay that does not answer as -ETIMEDOUT after the handshake timeout. */
int net_connect_relayed(Net *n, const uint8_t target[IDENTITY_PK_SIZE], uint32_t *ret_peer);

/* Whether the node with identity key accepts connections at host:port, as
 * a peer of c's settings would find it: dial, run the handshake, compare
 * the key it proves in its HELLO_REPLY (closing the link right after is
 * still an answer), and say goodbye. A transport of its own (epoll, one
 * link), so any thread may call it; blocks at most c->handshake_timeout_ms
 * (twice that when the TCP connection itself is slow to open). 0: it
 * answered; -EKEYREJECTED: a node of another key answered; -ETIMEDOUT,
 * -ECONNREFUSED, -EHOSTUNREACH, -EACCES (it refused this node), ... */
int net_probe(const NetConfig *c, const char *host, uint16_t port, const uint8_t key[IDENTITY_PK_SIZE]);

/* Who opens the link between this node and a peer, the one rule for every
 * kind of link (pipeline neighbours, averaging members): a node that
 * accepts no connections (behind NAT, no address in the plan) dials every
 * peer that does; of two that both accept, the one first in the plan's
 * order dials. Links are symmetric once the handshake is done. Two nodes
 * that both accept nothing need a relay (net_relays()); without one the
 * plan is refused. */
static inline bool net_dials(bool self_accepts, bool peer_accepts, bool self_first) {
        return peer_accepts && (!self_accepts || self_first);
}
/* Two that both accept nothing can still link through a relay: the first
 * asks for the other there (net_connect_relayed()), which waits there. */
static inline bool net_relays(bool self_accepts, bool peer_accepts, bool self_first) {
        return !self_accepts && !peer_accepts && self_first;
}

/* Queue a tensor; data must stay valid and unchanged until sent() reports
 * cookie. -ENOBUFS when the peer's queue is full, -ENOTCONN before the
 * handshake finished or after the link closed. */
int net_send_tensor(Net *n, uint32_t peer, uint32_t stream, const TensorDesc *desc, const void *data,
                    uint64_t cookie);
/* A PLAN, CONTROL, HEARTBEAT or BYE frame (copied). */
int net_send_control(Net *n, uint32_t peer, uint8_t type, const void *payload, size_t len);
/* The same frame to every open link; returns how many took it. */
int net_broadcast_control(Net *n, uint8_t type, const void *payload, size_t len);
void net_tensor_release(Net *n, NetTensor *t);
int net_close_peer(Net *n, uint32_t peer);
/* The same for a reason of the application's (a negative errno), which the
 * link's closed() reports instead of 0 (our goodbye): a peer dropped for
 * breaking a protocol above the transport's. */
int net_drop_peer(Net *n, uint32_t peer, int reason);

/* Wait up to timeout_ms for I/O, then run every callback that is due.
 * Returns the number of completions handled. */
int net_run(Net *n, int timeout_ms);
void net_get_stats(const Net *n, NetStats *ret);
/* Bytes queued to peer and not yet sent (-ENOTCONN if unknown). */
int64_t net_queued(const Net *n, uint32_t peer);
/* What is known of a link: an open one or one in its handshake, or the one
 * a closed() callback is reporting, during that call. -ENOTCONN otherwise. */
int net_peer_describe(const Net *n, uint32_t peer, NetPeerInfo *ret);
/* The cipher of an open link, or -ENOTCONN. */
int net_peer_cipher(const Net *n, uint32_t peer);
/* What the kernel measured on an open link's real traffic (TCP_INFO): the
 * smoothed round-trip time in seconds and the delivery rate of its latest
 * transfers in bytes/s (0 when not known yet); app_limited when the sender
 * had too little to send for the rate to show what the path can carry.
 * -ENOTCONN for an unknown peer, -errno from getsockopt. */
int net_peer_link_info(const Net *n, uint32_t peer, double *ret_rtt, double *ret_rate, bool *ret_app_limited);
