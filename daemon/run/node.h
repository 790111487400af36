/* run/node.h — this node on the network: its identity, its listener
 * and its links, with every event an operator cares about logged once
 * (peer joined or left, authentication failures, dropped links).
 *
 * Its links carry heartbeats and pause notices; the training loop polls
 * the node between steps so the links stay served.
 *
 *     Node node;
 *     r = node_start(&node, &config);     // no-op (0) when no network is configured
 *     node_poll(&node, 0);                // between training steps
 *     node_stop(&node);
 */
#pragma once

#include "conf/config.h"
#include "net/net.h"

#define NODE_MAX_PAUSED 64
/* A pause notice's length at most (node_paused_message()). */
#define NODE_PAUSED_MAX 132

/* A peer of network.peers: dialed at start, and again whenever its link is
 * lost or could not be made (after 1 s, twice as long after each failure
 * in a row, at most a minute). */
typedef struct NodePeer {
        ConfigAddress address;
        int64_t link;          /* -1: none */
        uint64_t next_dial_ns;
        unsigned failures;
} NodePeer;

typedef struct Node {
        Net *net;
        NodePeer *peers;
        size_t n_peers;
        Identity identity;
        bool active;
        bool told_paused;              /* the peers know this node is paused ... */
        char told_reason[128];         /* ... and why */
        uint32_t paused_peers;         /* peers that said they are paused ... */
        uint32_t paused[NODE_MAX_PAUSED]; /* ... their links (a status figure: past this many, not counted) */
        char paused_reason[NODE_MAX_PAUSED][NODE_PAUSED_MAX]; /* ... and why: logged once per cause */
} Node;

/* Whether the configuration asks for a network at all. */
bool node_configured(const Config *c);
/* Load or create the identity, start the transport, listen, connect to the
 * configured peers. Logs; returns -errno on failure. */
int node_start(Node *node, const Config *c);
/* Listens as try_listen(userdata, wait_ms) does (net_listen_wait(), or a
 * module that listens as it starts), first with wait_ms 0; where host:port
 * is taken, logs at once that it is and that this node waits for it, tries
 * again waiting up to NET_LISTEN_WAIT_MS (a node that has just stopped may
 * hold it a moment longer), and logs when it got it. A failure is the
 * caller's to log, with what listens there. */
typedef int (*NodeListenFn)(void *userdata, unsigned wait_ms);
int node_listen_patiently(const char *host, uint16_t port, NodeListenFn try_listen, void *userdata);
/* net_listen_wait() on n, as node_listen_patiently() says. */
int node_listen(Net *n, const char *host, uint16_t port, uint16_t *ret_port);
/* Serve the links for up to timeout_ms (the transport heartbeats quiet
 * links), and dial the configured peers that are due. */
void node_poll(Node *node, int timeout_ms);
void node_stop(Node *node);
/* Tell the peers this node paused (true, and why: PauseReason) or
 * resumed; once per change, of the reason too. */
void node_tell_paused(Node *node, bool paused, const char *reason);
/* The CONTROL payload that says this node paused: "RVPZ" and the reason,
 * its text, at most NODE_PAUSED_MAX bytes in all. Returns its length. */
size_t node_paused_message(const char *reason, uint8_t buf[NODE_PAUSED_MAX]);
/* Whether two pause reasons say the same cause: their text up to the first
 * figure ("other processes use 1.80 CPU, ..." moves every half second,
 * "idle for 2 s, ..." counts down): neighbours hear of a new cause, not of
 * every figure. */
bool node_pause_reason_same(const char *a, const char *b);
/* Whether payload says its sender paused; its reason, printable ASCII, in
 * reason ("" from a sender that gives none). */
bool node_paused_reason(const uint8_t *payload, size_t len, char *reason, size_t size);
/* The host of a peer's address ("192.0.2.7" of "192.0.2.7:41234",
 * "[2001:db8::7]" of "[2001:db8::7]:7000"): the key its log lines are
 * rate-limited by (log_ratelimit()), whatever port it comes from. */
const char *node_address_host(const char *address, char *buf, size_t size);
/* Why a link closed, for a log line: reason as closed() gives it, info from
 * net_peer_describe() in that callback ("said goodbye", "timed out (idle
 * link deadline)", "peer speaks protocol version 2, this node speaks 1", ...). */
const char *node_close_reason(int reason, const NetPeerInfo *info, char *buf, size_t size);
/* Logs why a link closed (NetCallbacks.closed; info from net_peer_describe()
 * in that callback), as the operator needs it:
 * a peer that left or was dropped, a handshake refused or failed (by the
 * sender's address through a rate limit, as strangers cause them at will),
 * and with dials, this node's own connection that could not be made. */
void node_log_closed(uint32_t peer, int reason, const NetPeerInfo *info, bool dials);
/* Logs a peer's connection refused before it joined its link as another
 * lane (NetCallbacks.lane_refused), of a link of what ("pipeline"): the
 * peer, and why. */
void node_log_lane_refused(const char *what, int reason, const NetPeerInfo *info);
