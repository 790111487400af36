/* run/node.c: this node on the network, driven in this process against
 * a Net that plays the peer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/proc.h"
#include "run/node.h"

typedef struct Peer {
        Net *n;
        int connected, paused;
} Peer;

static void peer_connected(void *ud, uint32_t peer, const uint8_t id[32]) {
        ((Peer *)ud)->connected++;
}
static void peer_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *p, size_t len) {
        if (type == FRAME_CONTROL && len == 4 && !memcmp(p, "RVPZ", 4))
                ((Peer *)ud)->paused++;
}

/* A node that paused before a peer connected tells that peer too, not only
 * the peers it had when it paused. */
Test(node, a_peer_that_connects_while_paused_learns_it) {
        char dir[] = "/tmp/ravnest-test-node-XXXXXX", path[256], secret[256], text[1024];
        static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        cr_assert_not_null(mkdtemp(dir));
        snprintf(secret, sizeof secret, "%s/secret", dir);
        test_write_file(secret, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
        uint16_t port = test_free_port();
        snprintf(path, sizeof path, "%s/node.conf", dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state\";\nnetwork = {\n  secret_file = \"%s\";\n  listen = \"127.0.0.1:%u\";\n};\n",
                 dir, secret, port);
        test_write_file(path, text, 0644);
        Config c;
        Diag d = {};
        cr_assert_eq(config_load(path, &c, &d), 0, "%s", d.text);
        Node node;
        cr_assert_eq(node_start(&node, &c), 0);
        node_tell_paused(&node, true);

        Identity id;
        identity_generate(&id);
        uint8_t key[32];
        for (int i = 0; i < 32; i++)
                sscanf(hex + 2 * i, "%2hhx", &key[i]);
        NetConfig nc;
        net_config_defaults(&nc);
        nc.identity = &id;
        nc.secret = key;
        NetCallbacks cb = { .connected = peer_connected, .control = peer_control };
        Peer p = {};
        cr_assert_eq(net_new(&nc, &cb, &p, &p.n), 0);
        uint32_t link;
        cr_assert_eq(net_connect(p.n, "127.0.0.1", port, &link), 0);
        for (int i = 0; i < 2000 && !p.paused; i++) {
                node_poll(&node, 1);
                net_run(p.n, 1);
        }
        cr_assert(p.connected, "the peer did not connect");
        cr_assert_eq(p.paused, 1, "the peer was not told the node is paused");

        net_free(p.n);
        for (int i = 0; i < 100; i++)
                node_poll(&node, 1);
        node_stop(&node);
        config_free(&c);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

/* A peer of network.peers that is not up when the node starts is dialed
 * again until it is, and again after its link is lost (it was dialed once,
 * at start, and never again). */
Test(node, a_configured_peer_is_dialed_until_it_is_up) {
        char dir[] = "/tmp/ravnest-test-node-XXXXXX", path[256], secret[256], text[1024];
        static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        cr_assert_not_null(mkdtemp(dir));
        snprintf(secret, sizeof secret, "%s/secret", dir);
        test_write_file(secret, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
        uint16_t port = test_free_port();
        snprintf(path, sizeof path, "%s/node.conf", dir);
        snprintf(text, sizeof text,
                 "state_directory = \"%s/state\";\nnetwork = {\n  secret_file = \"%s\";\n  peers = [\"127.0.0.1:%u\"];\n};\n",
                 dir, secret, port);
        test_write_file(path, text, 0644);
        Config c;
        Diag d = {};
        cr_assert_eq(config_load(path, &c, &d), 0, "%s", d.text);
        Node node;
        cr_assert_eq(node_start(&node, &c), 0); /* nobody listens there yet */
        for (int i = 0; i < 300; i++)
                node_poll(&node, 1);

        Identity id;
        identity_generate(&id);
        uint8_t key[32];
        for (int i = 0; i < 32; i++)
                sscanf(hex + 2 * i, "%2hhx", &key[i]);
        NetConfig nc;
        net_config_defaults(&nc);
        nc.identity = &id;
        nc.secret = key;
        NetCallbacks cb = { .connected = peer_connected };
        for (int round = 1; round <= 2; round++) {
                Peer p = {};
                cr_assert_eq(net_new(&nc, &cb, &p, &p.n), 0);
                uint16_t got;
                cr_assert_eq(net_listen(p.n, "127.0.0.1", port, &got), 0);
                for (int i = 0; i < 6000 && !p.connected; i++) {
                        node_poll(&node, 1);
                        net_run(p.n, 1);
                }
                cr_assert_eq(p.connected, 1, "round %d: the node did not dial its peer again", round);
                net_free(p.n); /* the link is lost: the node dials again */
                for (int i = 0; i < 100; i++)
                        node_poll(&node, 1);
        }
        node_stop(&node);
        config_free(&c);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
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
