/* run/node.c: this node on the network, driven in this process against
 * a Net that plays the peer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/proc.h"
#include "run/node.h"
#include "util/macro.h"

typedef struct Peer {
        Net *n;
        Identity id;
        uint8_t key[32];
        int connected, paused;
        char reason[NODE_PAUSED_MAX];
} Peer;

static void peer_connected(void *ud, uint32_t peer, const uint8_t id[32]) {
        ((Peer *)ud)->connected++;
}
static void peer_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        Peer *to = ud;
        if (type == FRAME_CONTROL && node_paused_reason(p, len, to->reason, sizeof to->reason))
                to->paused++;
}

/* The network secret both ends hold, in hex (the node's secret_file). */
static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/* A node started in a new directory (dir, a mkdtemp() template) from a
 * configuration whose network section holds setting besides the secret. */
static void node_up(char *dir, const char *setting, Config *c, Node *node) {
        char path[256], secret[256], text[1024];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(secret, sizeof secret, "%s/secret", dir);
        snprintf(text, sizeof text, "%s\n", hex);
        test_write_file(secret, text, 0600);
        snprintf(path, sizeof path, "%s/node.conf", dir);
        snprintf(text, sizeof text, "state_directory = \"%s/state\";\nnetwork = {\n  secret_file = \"%s\";\n  %s\n};\n",
                 dir, secret, setting);
        test_write_file(path, text, 0644);
        Diag d = {};
        cr_assert_eq(config_load(path, c, &d), 0, "%s", d.text);
        cr_assert_eq(node_start(node, c), 0);
}

static void node_down(const char *dir, Config *c, Node *node) {
        char cmd[300];
        node_stop(node);
        config_free(c);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

/* A peer's transport configuration: a new identity, the node's secret. */
static void peer_config(NetConfig *nc, Identity *id, uint8_t key[32]) {
        identity_generate(id);
        for (int i = 0; i < 32; i++)
                sscanf(hex + 2 * i, "%2hhx", &key[i]);
        net_config_defaults(nc);
        nc->identity = id;
        nc->secret = key;
}

/* p, a new identity with the node's secret, dials the node on port, and
 * both serve their links until the link is up. */
static void peer_dial(Peer *p, const NetCallbacks *cb, Node *node, uint16_t port, uint32_t *ret_link) {
        NetConfig nc;
        peer_config(&nc, &p->id, p->key);
        cr_assert_eq(net_new(&nc, cb, p, &p->n), 0);
        cr_assert_eq(net_connect(p->n, "127.0.0.1", port, ret_link), 0);
        for (int i = 0; i < 2000 && !p->connected; i++) {
                node_poll(node, 1);
                net_run(p->n, 1);
        }
        cr_assert(p->connected, "the peer did not connect");
}

/* A node that paused before a peer connected tells that peer too, not only
 * the peers it had when it paused; and why, again when that changes (a
 * peer heard "its owner needs the machine" whatever paused it). */
Test(node, a_peer_that_connects_while_paused_learns_it) {
        char dir[] = "/tmp/ravnest-test-node-XXXXXX", listen[64];
        uint16_t port = test_free_port();
        snprintf(listen, sizeof listen, "listen = \"127.0.0.1:%u\";", port);
        Config c;
        Node node;
        node_up(dir, listen, &c, &node);
        node_tell_paused(&node, true, "paused by the operator");

        NetCallbacks cb = { .connected = peer_connected, .control = peer_control };
        Peer p = {};
        uint32_t link;
        peer_dial(&p, &cb, &node, port, &link);
        for (int i = 0; i < 2000 && !p.paused; i++) {
                node_poll(&node, 1);
                net_run(p.n, 1);
        }
        cr_assert_eq(p.paused, 1, "the peer was not told the node is paused");
        cr_assert_str_eq(p.reason, "paused by the operator");
        node_tell_paused(&node, true, "paused by the operator");
        node_tell_paused(&node, true, "other processes use 1.2 CPU");
        for (int i = 0; i < 2000 && p.paused < 2; i++) {
                node_poll(&node, 1);
                net_run(p.n, 1);
        }
        cr_assert_eq(p.paused, 2, "told once per reason");
        cr_assert_str_eq(p.reason, "other processes use 1.2 CPU");

        net_free(p.n);
        for (int i = 0; i < 100; i++)
                node_poll(&node, 1);
        node_down(dir, &c, &node);
}

/* A peer's pause notices, as often as it sends them, are logged when it
 * pauses, resumes or gives another cause (every notice was a line: a peer
 * could write the node's log as fast as it sent them). */
Test(node, a_peer_repeating_its_pause_is_logged_once_per_cause) {
        char dir[] = "/tmp/ravnest-test-node-XXXXXX", listen[64], log[] = "/tmp/ravnest-test-node-log-XXXXXX";
        uint16_t port = test_free_port();
        snprintf(listen, sizeof listen, "listen = \"127.0.0.1:%u\";", port);
        Config c;
        Node node;
        node_up(dir, listen, &c, &node);

        NetCallbacks cb = { .connected = peer_connected };
        Peer p = {};
        uint8_t msg[NODE_PAUSED_MAX];
        uint32_t link;
        peer_dial(&p, &cb, &node, port, &link);

        /* the node's log into a file while the notices come */
        int fd = mkstemp(log), saved = dup(STDERR_FILENO);
        fflush(stderr);
        cr_assert(dup2(fd, STDERR_FILENO) >= 0);
        char reason[64];
        for (int i = 0; i < 50; i++) { /* its figures move: one cause */
                snprintf(reason, sizeof reason, "other processes use 1.%02d CPU", i);
                cr_assert_eq(net_send_control(p.n, link, FRAME_CONTROL, msg, node_paused_message(reason, msg)), 0);
        }
        cr_assert_eq(net_send_control(p.n, link, FRAME_CONTROL, msg,
                                      node_paused_message("paused by the operator", msg)), 0);
        for (int i = 0; i < 20; i++)
                cr_assert_eq(net_send_control(p.n, link, FRAME_CONTROL, "RVPR", 4), 0);
        cr_assert_eq(net_send_control(p.n, link, FRAME_CONTROL, msg, node_paused_message("on battery", msg)), 0);
        for (int i = 0; i < 4000 && !(node.paused_peers == 1 && !strcmp(node.paused_reason[0], "on battery")); i++) {
                node_poll(&node, 1);
                net_run(p.n, 1);
        }
        fflush(stderr);
        dup2(saved, STDERR_FILENO);
        close(saved);
        cr_assert_str_eq(node.paused_reason[0], "on battery");

        char text[4096];
        ssize_t n = pread(fd, text, sizeof text - 1, 0);
        close(fd);
        unlink(log);
        text[MAX(n, 0)] = 0;
        cr_assert_eq(test_count(text, "paused: other processes use 1.00 CPU"), 1, "%s", text);
        cr_assert_eq(test_count(text, "paused: paused by the operator"), 1, "%s", text);
        cr_assert_eq(test_count(text, "resumed"), 1, "%s", text);
        cr_assert_eq(test_count(text, "paused: on battery"), 1, "%s", text);
        cr_assert_eq(test_count(text, "Peer on link"), 4, "%s", text);

        net_free(p.n);
        for (int i = 0; i < 100; i++)
                node_poll(&node, 1);
        node_down(dir, &c, &node);
}

/* A peer of network.peers that is not up when the node starts is dialed
 * again until it is, and again after its link is lost (it was dialed once,
 * at start, and never again). */
Test(node, a_configured_peer_is_dialed_until_it_is_up) {
        char dir[] = "/tmp/ravnest-test-node-XXXXXX", peers[64];
        uint16_t port = test_free_port();
        snprintf(peers, sizeof peers, "peers = [\"127.0.0.1:%u\"];", port);
        Config c;
        Node node;
        node_up(dir, peers, &c, &node); /* nobody listens there yet */
        for (int i = 0; i < 300; i++)
                node_poll(&node, 1);

        Identity id;
        uint8_t key[32];
        NetConfig nc;
        peer_config(&nc, &id, key);
        NetCallbacks cb = { .connected = peer_connected };
        for (int round = 1; round <= 2; round++) {
                Peer p = {};
                cr_assert_eq(net_new(&nc, &cb, &p, &p.n), 0);
                uint16_t got;
                /* as a node started again: the last round's socket may linger */
                cr_assert_eq(net_listen_wait(p.n, "127.0.0.1", port, NET_LISTEN_WAIT_MS, &got), 0);
                for (int i = 0; i < 6000 && !p.connected; i++) {
                        node_poll(&node, 1);
                        net_run(p.n, 1);
                }
                cr_assert_eq(p.connected, 1, "round %d: the node did not dial its peer again", round);
                net_free(p.n); /* the link is lost: the node dials again */
                for (int i = 0; i < 100; i++)
                        node_poll(&node, 1);
        }
        node_down(dir, &c, &node);
}

/* A dropped link's reason says which deadline it missed, and the protocol
 * versions when they differ, not just "timed out" or "malformed". */
Test(node, close_reasons_say_which) {
        char buf[128];
        NetPeerInfo info = { .timeout = NET_TIMEOUT_HANDSHAKE };
        cr_assert_str_eq(node_close_reason(-ETIMEDOUT, &info, buf, sizeof buf), "timed out (handshake deadline)");
        info.timeout = NET_TIMEOUT_STALL;
        cr_assert_str_eq(node_close_reason(-ETIMEDOUT, &info, buf, sizeof buf), "timed out (stalled frame deadline)");
        info.timeout = NET_TIMEOUT_IDLE;
        cr_assert_str_eq(node_close_reason(-ETIMEDOUT, &info, buf, sizeof buf), "timed out (idle link deadline)");
        info.timeout = NET_TIMEOUT_NONE; /* TCP gave up on data it sent */
        cr_assert_str_eq(node_close_reason(-ETIMEDOUT, &info, buf, sizeof buf),
                         "timed out (data sent and not acknowledged)");
        info.peer_version = 2;
        cr_assert_str_eq(node_close_reason(-EPROTONOSUPPORT, &info, buf, sizeof buf),
                         "peer speaks protocol version 2, this node speaks 1");
        cr_assert_str_eq(node_close_reason(-EKEYREJECTED, &info, buf, sizeof buf), "sent an ephemeral key of small order");
        cr_assert_str_eq(node_close_reason(0, &info, buf, sizeof buf), "said goodbye");
}

/* Neighbours hear of a pause's new cause, not of every figure of it. */
Test(node, a_pause_reason_moving_its_figures_keeps_its_cause) {
        cr_assert(node_pause_reason_same("other processes use 1.80 CPU, resuming at 0.50 or less",
                                         "other processes use 1.20 CPU, resuming at 0.50 or less"));
        cr_assert(node_pause_reason_same("idle for 1 s, resuming after 60 s", "idle for 12 s, resuming after 60 s"));
        cr_assert(node_pause_reason_same("paused by the operator", "paused by the operator"));
        cr_assert_not(node_pause_reason_same("idle for 1 s, resuming after 60 s",
                                             "other processes use 1.80 CPU, resuming at 0.50 or less"));
        cr_assert_not(node_pause_reason_same("paused by the operator", "on battery"));
        cr_assert_not(node_pause_reason_same("", "on battery"));
}
