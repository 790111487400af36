/* run/node.c */
#include "node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "events.h"
#include "net/relay.h"
#include "util/log.h"
#include "util/macro.h"
#include "util/time-util.h"

bool node_configured(const Config *c) {
        return c->listen.port != 0 || c->n_peers > 0 || c->averaging.enabled || c->pipeline.enabled ||
               c->membership.enabled;
}

static const char *reason_text(int reason) {
        switch (reason) {
        case 0: return "said goodbye";
        case -EACCES: return "not admitted (unknown identity or wrong network secret)";
        case -EOPNOTSUPP: return "no cipher in common";
        case -EKEYREJECTED: return "sent an ephemeral key of small order";
        case -EBADMSG: return "sent a malformed, forged, replayed or reordered frame";
        case -EPROTO: return "broke the handshake";
        case -EMSGSIZE: return "sent a frame or tensor over the size limits";
        case -EBADRQC: return "broke the protocol of its messages (one malformed or out of place)";
        case -ECONNRESET: return "closed the connection";
        case -ENOLINK: return "named no link of this peer that waits for another connection";
        case -EMFILE: return "gave way to a newcomer (strangers' handshakes at their cap)";
        case -ENOPROTOOPT: return "a relay of another version (\"" RELAY_MAGIC "\" here: a relay and its nodes are upgraded together)";
        default: return NULL;
        }
}

const char *node_close_reason(int reason, const NetPeerInfo *info, char *buf, size_t size) {
        if (reason == -ETIMEDOUT && info->timeout == NET_TIMEOUT_NONE) /* TCP's own: TCP_USER_TIMEOUT */
                snprintf(buf, size, "timed out (data sent and not acknowledged)");
        else if (reason == -ETIMEDOUT)
                snprintf(buf, size, "timed out (%s deadline)", net_timeout_to_string(info->timeout));
        else if (reason == -EPROTONOSUPPORT)
                snprintf(buf, size, "peer speaks protocol version %u, this node speaks %u", info->peer_version,
                         FRAME_VERSION);
        else
                snprintf(buf, size, "%s", reason_text(reason) ?: strerror(-reason));
        return buf;
}

const char *node_address_host(const char *address, char *buf, size_t size) {
        const char *colon = strrchr(address, ':');
        size_t n = colon && (address[0] != '[' || colon[-1] == ']') ? (size_t)(colon - address) : strlen(address);
        snprintf(buf, size, "%.*s", (int)n, address);
        return buf;
}

/* Lines a stranger can have this node write at will, one per connection
 * or per message: each sender's address has a burst, then a summary. */
static LogRatelimit handshake_lines = LOG_RATELIMIT_INIT("Failed handshakes from");
static LogRatelimit link_lines = LOG_RATELIMIT_INIT("Peers joining and leaving from");
static LogRatelimit pause_lines = LOG_RATELIMIT_INIT("Pause notices from");

/* Whether a line about a peer at address may be written: by its host. */
static bool peer_line_ok(LogRatelimit *rl, int level, const char *address) {
        char host[64];
        return log_ratelimit(rl, level, node_address_host(address, host, sizeof host));
}

static const uint8_t msg_paused[4] = { 'R', 'V', 'P', 'Z' }, msg_resumed[4] = { 'R', 'V', 'P', 'R' };

bool node_pause_reason_same(const char *a, const char *b) {
        size_t n = strcspn(a, "0123456789");
        return n == strcspn(b, "0123456789") && !strncmp(a, b, n);
}

size_t node_paused_message(const char *reason, uint8_t buf[NODE_PAUSED_MAX]) {
        size_t n = MIN(strlen(reason ?: ""), (size_t)NODE_PAUSED_MAX - 4);
        memcpy(buf, msg_paused, 4);
        memcpy(buf + 4, reason, n);
        return 4 + n;
}

bool node_paused_reason(const uint8_t *payload, size_t len, char *reason, size_t size) {
        if (len < 4 || len > NODE_PAUSED_MAX || memcmp(payload, msg_paused, 4))
                return false;
        size_t n = 0;
        for (size_t i = 4; i < len && n + 1 < size; i++)
                reason[n++] = payload[i] >= 0x20 && payload[i] < 0x7f ? (char)payload[i] : '?';
        reason[n] = 0;
        return true;
}

static void send_paused(Node *node, int64_t peer) {
        uint8_t buf[NODE_PAUSED_MAX];
        size_t n = node_paused_message(node->told_reason, buf);
        if (peer >= 0)
                (void)net_send_control(node->net, (uint32_t)peer, FRAME_CONTROL, buf, n);
        else
                net_broadcast_control(node->net, FRAME_CONTROL, buf, n);
}

static NodePeer *configured_peer(Node *node, uint32_t link) {
        for (size_t i = 0; i < node->n_peers; i++)
                if (node->peers[i].link == (int64_t)link)
                        return &node->peers[i];
        return NULL;
}

static void on_connected(void *userdata, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        Node *node = userdata;
        NodePeer *p = configured_peer(node, peer);
        if (p)
                p->failures = 0;
        char hex[IDENTITY_HEX_SIZE];
        int c = net_peer_cipher(node->net, peer);
        NetPeerInfo info = {};
        char fields[192];
        if (net_peer_describe(node->net, peer, &info) < 0)
                snprintf(info.address, sizeof info.address, "?");
        identity_to_hex(id, hex);
        snprintf(fields, sizeof fields, "PEER=%s\nPEER_ADDRESS=%s", hex, info.address);
        if (peer_line_ok(&link_lines, LOG_INFO, info.address))
                log_event(LOG_INFO, EVENT_PEER_JOINED, fields, "Peer %s at %s joined (link %u, %s)", hex, info.address,
                          peer, c >= 0 ? cipher_to_string((Cipher)c) : "?");
        if (node->told_paused) /* the others heard it when this node paused */
                send_paused(node, peer);
}

static void forget_paused(Node *node, uint32_t peer);
static void dial_peers(Node *node);

/* Who the peer is, for a log line: its key when it proved one (even if it
 * was then refused), and its address: "<key> at 192.0.2.7:41234". */
static void describe_peer(const NetPeerInfo *info, char *out, size_t size) {
        char hex[IDENTITY_HEX_SIZE];
        if (!info->key_known) {
                snprintf(out, size, "%s", info->address);
                return;
        }
        identity_to_hex(info->key, hex);
        snprintf(out, size, "%s at %s", hex, info->address);
}

void node_log_closed(uint32_t peer, int reason, const NetPeerInfo *info, bool dials) {
        char who[IDENTITY_HEX_SIZE + 80], why[128], hex[IDENTITY_HEX_SIZE], fields[384];

        describe_peer(info, who, sizeof who);
        if (info->key_known)
                identity_to_hex(info->key, hex);
        else /* the journal's PEER: the key, or the address before it proved one */
                snprintf(hex, sizeof hex, "%s", info->address);
        node_close_reason(reason, info, why, sizeof why);
        snprintf(fields, sizeof fields, "PEER=%s\nPEER_ADDRESS=%s\nREASON=%s", hex, info->address, why);

        bool refused = reason == -EACCES || reason == -EOPNOTSUPP || reason == -EKEYREJECTED;
        bool left = info->open && !refused && (reason == 0 || reason == -ECONNRESET);
        if (!info->reached && !dials)
                return;
        if (!info->reached && reason != 0) /* this node's own dial (again after a minute at most) */
                log_event(LOG_WARNING, EVENT_PEER_LEFT, fields, "Failed to connect to %s (link %u): %s", info->address,
                          peer, reason == -ETIMEDOUT ? "no answer within the handshake timeout" : strerror(-reason));
        else if (!peer_line_ok(info->open && !refused ? &link_lines : &handshake_lines, left ? LOG_INFO : LOG_WARNING,
                               info->address))
                return;
        else if (!info->open && (reason == 0 || reason == -ECONNRESET))
                /* The initiator checks the responder first: a link that ends
                 * here usually means the other side refused this node. */
                log_event(LOG_WARNING, EVENT_AUTH_FAILED, fields,
                          "Link %u with %s closed during the handshake: the peer did not admit this node "
                          "(different network secret, or not on its allowlist) or gave up", peer, who);
        else if ((!info->open && reason != -ETIMEDOUT && reason != -EMFILE) || refused)
                log_event(LOG_WARNING, EVENT_AUTH_FAILED, fields, "Authentication failed on link %u with %s: %s",
                          peer, who, why);
        else if (left)
                log_event(LOG_INFO, EVENT_PEER_LEFT, fields, "Peer %s left (link %u): %s", who, peer, why);
        else
                log_event(LOG_WARNING, EVENT_PEER_LEFT, fields, "Dropped link %u with peer %s: %s", peer, who, why);
}

static void on_closed(void *userdata, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        Node *node = userdata;
        forget_paused(node, peer);
        NodePeer *p = configured_peer(node, peer);
        if (p) { /* dialed again: at once after a link that was up, later after each failure */
                p->link = -1;
                p->next_dial_ns = now_ns() + (NSEC_PER_SEC << MIN(p->failures, 6u));
                p->failures++;
        }
        NetPeerInfo info = {};
        if (net_peer_describe(node->net, peer, &info) < 0)
                snprintf(info.address, sizeof info.address, "?");
        node_log_closed(peer, reason, &info, true);
}

void node_log_lane_refused(const char *what, int reason, const NetPeerInfo *info) {
        char who[IDENTITY_HEX_SIZE + 80], why[128];
        describe_peer(info, who, sizeof who);
        log_warning("Refused another connection of a %s link from %s: %s", what, who,
                    node_close_reason(reason, info, why, sizeof why));
}

static void on_lane_refused(void *userdata, int reason, const NetPeerInfo *info) {
        node_log_lane_refused("network", reason, info);
}

/* Where peer is in node->paused, or -1. */
static int paused_index(const Node *node, uint32_t peer) {
        for (uint32_t i = 0; i < node->paused_peers; i++)
                if (node->paused[i] == peer)
                        return (int)i;
        return -1;
}

static void forget_paused(Node *node, uint32_t peer) {
        int i = paused_index(node, peer);
        if (i < 0)
                return;
        node->paused_peers--;
        node->paused[i] = node->paused[node->paused_peers];
        memcpy(node->paused_reason[i], node->paused_reason[node->paused_peers], sizeof node->paused_reason[i]);
}

/* A peer's pause notice: logged when it pauses or resumes and when the
 * cause of its pause changes, not at every notice (any peer can send them
 * as fast as it likes), and within its address's rate limit. */
static void on_control(void *userdata, uint32_t peer, uint8_t type, const uint8_t *payload, size_t len) {
        Node *node = userdata;
        char reason[NODE_PAUSED_MAX];
        NetPeerInfo info = {};
        if (type != FRAME_CONTROL)
                return;
        bool paused = node_paused_reason(payload, len, reason, sizeof reason);
        if (!paused && (len != 4 || memcmp(payload, msg_resumed, 4)))
                return;
        int i = paused_index(node, peer);
        if (!paused && i < 0) /* resumed, and was not paused (or past NODE_MAX_PAUSED) */
                return;
        if (paused && i >= 0 && node_pause_reason_same(node->paused_reason[i], reason))
                return;
        if (!paused)
                forget_paused(node, peer);
        else if (i < 0 && node->paused_peers < NODE_MAX_PAUSED)
                i = (int)node->paused_peers++;
        if (paused && i >= 0) {
                node->paused[i] = peer;
                snprintf(node->paused_reason[i], sizeof node->paused_reason[i], "%s", reason);
        }
        if (net_peer_describe(node->net, peer, &info) < 0)
                snprintf(info.address, sizeof info.address, "?");
        if (peer_line_ok(&pause_lines, LOG_INFO, info.address))
                log_info("Peer on link %u %s%s%s", peer, paused ? "paused" : "resumed", reason[0] && paused ? ": " : "",
                         paused ? reason : "");
}

void node_tell_paused(Node *node, bool paused, const char *reason) {
        if (!node->active ||
            (node->told_paused == paused && (!paused || node_pause_reason_same(node->told_reason, reason))))
                return;
        node->told_paused = paused;
        snprintf(node->told_reason, sizeof node->told_reason, "%s", paused ? reason : "");
        if (paused)
                send_paused(node, -1);
        else
                net_broadcast_control(node->net, FRAME_CONTROL, msg_resumed, 4);
}

static void on_tensor(void *userdata, NetTensor *t) {
        Node *node = userdata;
        /* Nothing consumes tensors yet: the pipeline will. */
        log_debug("Tensor of %llu bytes from link %u, stream %u", (unsigned long long)t->desc.bytes, t->peer,
                  t->stream);
        net_tensor_release(node->net, t);
}

int node_listen_patiently(const char *host, uint16_t port, NodeListenFn try_listen, void *userdata) {
        int r = try_listen(userdata, 0);
        if (r != -EADDRINUSE)
                return r;
        log_notice("%s:%u is in use: waiting up to %u s for it (a node stopped a moment ago may still hold it)",
                   host, port, NET_LISTEN_WAIT_MS / 1000);
        uint64_t start = now_ns();
        r = try_listen(userdata, NET_LISTEN_WAIT_MS);
        if (r >= 0)
                log_info("%s:%u is free now, after %.1f s", host, port, ns_to_sec(now_ns() - start));
        return r;
}

typedef struct NetListen {
        Net *net;
        const char *host;
        uint16_t port;
        uint16_t *ret_port;
} NetListen;

static int net_listen_try(void *userdata, unsigned wait_ms) {
        NetListen *l = userdata;
        return net_listen_wait(l->net, l->host, l->port, wait_ms, l->ret_port);
}

int node_listen(Net *n, const char *host, uint16_t port, uint16_t *ret_port) {
        NetListen l = { .net = n, .host = host, .port = port, .ret_port = ret_port };
        return node_listen_patiently(host, port, net_listen_try, &l);
}

int node_start(Node *node, const Config *c) {
        char path[PATH_MAX + 16], hex[IDENTITY_HEX_SIZE];
        NetConfig nc;
        bool created;
        Diag d = {};
        int r;

        memset(node, 0, sizeof *node);
        if (!node_configured(c))
                return 0;

        if (mkdir(c->state_directory, 0700) < 0 && errno != EEXIST)
                return log_error_errno(-errno, "Failed to create %s: %m", c->state_directory);
        snprintf(path, sizeof path, "%s/identity", c->state_directory);
        r = identity_load_or_create(path, &node->identity, &created, &d);
        if (r < 0)
                return log_error_errno(r, "Failed to load the identity: %s", diag_reason(&d, r));
        identity_to_hex(node->identity.pk, hex);
        log_info("%s identity %s (%s)", created ? "Created" : "Loaded", hex, path);
        if (c->membership.enabled && !c->listen.port && !c->n_peers)
                return 0; /* membership has links of its own: no transport (and receive pool) idle here */

        r = config_net(c, &node->identity, &nc, &d);
        if (r < 0)
                return log_error_errno(r, "Invalid network configuration: %s", d.text);
        NetCallbacks cb = { .connected = on_connected, .closed = on_closed, .tensor = on_tensor, .control = on_control,
                            .lane_refused = on_lane_refused };
        r = net_new(&nc, &cb, node, &node->net);
        if (r < 0)
                return log_error_errno(r, "Failed to start the transport: %m");

        NetStats st;
        net_get_stats(node->net, &st);
        if (st.fallback)
                log_warning_errno(st.fallback_error,
                                  "io_uring is not available (%m): using the epoll backend. Containers: see "
                                  "containers/ for a seccomp profile that allows io_uring.");
        log_info("Transport: %s backend, admission by %s%s", net_backend_name(node->net),
                 c->admission == CONFIG_ADMISSION_SECRET ? "network secret" :
                 c->admission == CONFIG_ADMISSION_ALLOWLIST ? "allowlist" : "network secret and allowlist",
                 nc.plaintext ? ", plaintext allowed on loopback (benchmarks only)" : "");

        if (c->listen.port) {
                uint16_t port;
                r = node_listen(node->net, c->listen.host, c->listen.port, &port);
                if (r < 0)
                        return log_error_errno(r, "Failed to listen on %s:%u: %m", c->listen.host, c->listen.port);
                log_info("Listening on %s:%u", c->listen.host, port);
        }
        node->peers = calloc(MAX(c->n_peers, (size_t)1), sizeof *node->peers);
        if (!node->peers)
                return log_error_errno(-ENOMEM, "Out of memory");
        node->n_peers = c->n_peers;
        for (size_t i = 0; i < c->n_peers; i++)
                node->peers[i] = (NodePeer){ .address = c->peers[i], .link = -1 };
        node->active = true;
        dial_peers(node);
        return 0;
}

/* The configured peers without a link whose time has come. */
static void dial_peers(Node *node) {
        uint64_t now = now_ns();
        for (size_t i = 0; i < node->n_peers; i++) {
                NodePeer *p = &node->peers[i];
                uint32_t link;
                if (p->link >= 0 || now < p->next_dial_ns)
                        continue;
                int r = net_connect(node->net, p->address.host, p->address.port, &link);
                if (r >= 0) {
                        p->link = link;
                        continue;
                }
                if (p->failures == 0) /* once, not at every try */
                        log_warning_errno(r, "Failed to connect to %s:%u: %m; trying again", p->address.host,
                                          p->address.port);
                p->next_dial_ns = now + (NSEC_PER_SEC << MIN(p->failures, 6u));
                p->failures++;
        }
}

void node_poll(Node *node, int timeout_ms) {
        if (!node->active)
                return;
        net_run(node->net, timeout_ms); /* which heartbeats quiet links */
        dial_peers(node);
}

void node_stop(Node *node) {
        /* also after a node_start() that failed half way (its transport up, its address in use) */
        node->net = net_free(node->net);
        node->peers = mfree(node->peers);
        node->n_peers = 0;
        identity_clear(&node->identity);
        node->active = false;
}
