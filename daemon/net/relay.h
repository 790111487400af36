/* net/relay.h — a relay for links between nodes that accept no connections.
 *
 * Two nodes behind NAT cannot dial each other. Both can dial a node that
 * accepts connections and offers to relay: one of them waits there (WAIT,
 * proving with a signature that it holds its key), the other asks for it
 * (CONNECT with its key), and the relay then copies bytes both ways between
 * the two connections. The two ends run their own handshake and AEAD
 * through it (net.h's links, unchanged), so the relay sees their public
 * keys and ciphertext only, and cannot forge, replay or reorder a frame
 * without the ends noticing. Everything it holds is bounded: max_links
 * relayed links, as many waiting, a buffer of RELAY_BUFFER bytes per
 * direction, and a preamble deadline. The wire format is in
 * ravnest-protocol(7), RELAY.
 *
 * Without the network secret, anyone may WAIT with a key of their own and
 * CONNECT to it (with no allowlist the relay serves any key), so nothing a
 * client says is proof that two real nodes talk through a link. A relay
 * given the secret takes a request only with a MAC keyed by it over the
 * relay's fresh challenge (relay_member_proof(): a stranger gets no
 * waiting place and no link, and a recorded request is worth nothing),
 * and then checks the
 * MACs of the handshake that opens each link as its frames pass
 * (relay-proof.h): a link whose handshake proves both ends of this
 * network is proven, and one that does not within the preamble deadline
 * of joining (a frame malformed, a MAC wrong, too slow, or the handshake
 * of a link it relays sent again) is closed. Without the secret, what the
 * relay sees is how the ends use a link.
 *
 * One address (a router's, an IPv6 /64) holds at most max_links_per_addr
 * waiting connections and links, and when there is no room a newcomer
 * displaces a link not proven that shows no sign of use by two nodes: its
 * two ends at one address, nothing carried both ways within the preamble
 * deadline of joining, or nothing at all for RELAY_QUIET_MS. A proven link,
 * or one that carries bytes both ways between two addresses, is never
 * displaced: without the secret, strangers with many addresses that keep
 * their links busy can still take every place; with it, they get no
 * waiting place and no link.
 * RelayStats counts what they cause.
 *
 *     Relay *r;
 *     r = relay_new(&(RelayConfig){ .host = "0.0.0.0", .port = 7400, .max_links = 64 }, &r);
 *     relay_get_stats(r, &st);
 *     relay_free(r);      // stops its thread, closes every connection
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "identity.h"
#include "util/macro.h"

#define RELAY_MAGIC "RVRELAY2"
#define RELAY_MAGIC_SIZE 8
#define RELAY_CHALLENGE_SIZE 32
#define RELAY_HELLO_SIZE (RELAY_MAGIC_SIZE + RELAY_CHALLENGE_SIZE) /* relay to client */
#define RELAY_SIG_SIZE 64
#define RELAY_PROOF_SIZE 32
#define RELAY_SIGNED_SIZE (2 + IDENTITY_PK_SIZE + RELAY_SIG_SIZE)   /* op, channel, key, signature */
#define RELAY_REQUEST_SIZE (RELAY_SIGNED_SIZE + RELAY_PROOF_SIZE)  /* client to relay */
#define RELAY_BUFFER (64u << 10)
/* A link that has carried nothing either way for this long may give way to
 * a newcomer: its ends, with net.h's default idle_timeout, would have
 * dropped it by now (they heartbeat every 40 s). */
#define RELAY_QUIET_MS 120000u
#define RELAY_MAX_LINKS_PER_ADDR 32u

enum {
        RELAY_OP_WAIT = 1,
        RELAY_OP_CONNECT = 2,
};

/* The relay's one-byte answer to a request. */
enum {
        RELAY_OK = 0,          /* WAIT: registered; CONNECT: joined, the target's stream from the next byte */
        RELAY_BAD_REQUEST = 1, /* malformed, a bad signature, or a key not admitted */
        RELAY_NO_TARGET = 2,   /* CONNECT: nobody waits with that key */
        RELAY_FULL = 3,        /* max_links relayed links, or max_links_per_addr from the asker's
                                  address, none of which may give way */
        RELAY_NOT_MEMBER = 4,  /* a relay with the network secret: the request's proof is not
                                  relay_member_proof() with it */
};

typedef struct RelayConfig {
        const char *host;
        uint16_t port;                        /* 0: any (relay_port()) */
        unsigned max_links;                   /* relayed at once; as many more may wait */
        unsigned max_links_per_addr;          /* waiting and relayed with an end at one address;
                                                 0: RELAY_MAX_LINKS_PER_ADDR */
        const uint8_t (*allowed)[IDENTITY_PK_SIZE]; /* NULL: any key may wait and be asked for */
        size_t n_allowed;
        unsigned preamble_timeout_ms;         /* 0: 10 s; also for a link to be proven */
        const uint8_t *secret;                /* the network secret (HANDSHAKE_SECRET_SIZE bytes, copied);
                                                 NULL: links are not checked */
} RelayConfig;

typedef struct RelayStats {
        uint64_t links, waiting;              /* now */
        uint64_t links_total, refused;        /* since the start */
        uint64_t bytes;                       /* copied, both directions */
        /* Since the start, what strangers holding places would cause: */
        uint64_t displaced;                   /* links closed for a newcomer: shown no use by two nodes */
        uint64_t refused_full;                /* CONNECTs refused: max_links, every one in use */
        uint64_t over_addr;                   /* WAITs and CONNECTs from an address at max_links_per_addr:
                                                 refused, or one of its own made way */
        uint8_t last_over_addr[16];           /* the latest such address (net_addr_key()) */
        /* Since the start, with a secret: */
        uint64_t not_member;                  /* requests refused: their proof not made with it */
        uint64_t proven;                      /* links whose two ends proved they hold it */
        uint64_t unproven;                    /* links closed for not proving it within the preamble
                                                 deadline of joining: a handshake frame malformed or
                                                 out of turn, a MAC wrong, none in time, or replayed */
        uint64_t replayed;                    /* of those, links whose handshake a relayed link had
                                                 proven already: a recording sent again */
} RelayStats;

typedef struct Relay Relay;

/* Binds and starts the relay's thread. -EINVAL for a bad config. */
int relay_new(const RelayConfig *c, Relay **ret);
Relay *relay_free(Relay *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(Relay *, relay_free);
uint16_t relay_port(const Relay *r);
void relay_get_stats(Relay *r, RelayStats *ret);

/* The bytes a waiting node signs: a context string, the challenge, the
 * channel. */
#define RELAY_WAIT_CONTEXT "ravnest-relay-wait-v1"
#define RELAY_WAIT_MESSAGE_SIZE (sizeof RELAY_WAIT_CONTEXT - 1 + RELAY_CHALLENGE_SIZE + 1)
void relay_wait_message(const uint8_t challenge[RELAY_CHALLENGE_SIZE], uint8_t channel,
                        uint8_t out[RELAY_WAIT_MESSAGE_SIZE]);

/* The proof a request ends with: BLAKE2b-256 keyed with the network secret
 * over a context string, the relay's challenge and the request's first
 * RELAY_SIGNED_SIZE bytes. Without a secret, a node sends zeros. */
#define RELAY_MEMBER_CONTEXT "ravnest-relay-member-v1"
void relay_member_proof(const uint8_t *secret, const uint8_t challenge[RELAY_CHALLENGE_SIZE],
                        const uint8_t signed_part[RELAY_SIGNED_SIZE], uint8_t out[RELAY_PROOF_SIZE]);
