/* collective/gossip.h — decentralized averaging: every iteration a member
 * mixes its parameters with its group of the topology (topology.h), over
 * the authenticated links of a Coll, while the next step computes.
 *
 * The schedule is the paper's (Wang et al., ICLR 2025, and
 * its reference code): after the local update of step t the member sends
 * x(t) to the group of iteration t; during the forward and backward passes
 * of step t+1 (which only read x) the exchange runs on this module's own
 * thread; before the update of step t+1 the member waits for it and mixes,
 *
 *     x <- x + (w s + (1-w)/(|G|-1) sum_{j != i} s_j) - s,
 *
 * where s is the copy it sent (so x == s gives the plain mixing step), and
 * then applies the gradient of step t+1, taken at the unmixed x, to the
 * mixed one. Communication of step t thus overlaps computation of step t+1.
 *
 * A group's exchange is a coll round (coll.h) over the group, so a member
 * that does not show up in time is left out and the others mix among
 * themselves; a group of one keeps x. With topology complete the mix is
 * the all-reduce average.
 *
 * A member whose link's MODEL names another model (coll_member_model())
 * is left out of the groups from then on (until a link of it names ours):
 * the topology's groups are those among the others (gossip_group_among()),
 * so a member paired with it does not lose that exchange, step after step,
 * but meets one of ours. It leaves us out too, and every member waits for
 * every link's MODEL before its first iteration (gossip_connected()), so
 * the members of one model make the same groups, pairs with each other.
 * Complete keeps everyone in its one group; its round leaves such a member
 * out. One that every other member trains another model for averages with
 * nobody: its exchanges fail at once, -EBADE.
 *
 *     GossipConfig c;
 *     gossip_config_defaults(&c);
 *     c.coll = coll_config;  c.topology = GOSSIP_ALT_EXP_RING;  c.len = n;
 *     Gossip *g;
 *     r = gossip_new(&c, &g);
 *     r = gossip_start(g);                      // the communication thread
 *     for (t = 0;; t++) {
 *             forward_backward(x, grads);       // overlaps the exchange of t-1
 *             if (t > 0)
 *                     r = gossip_mix(g, x);     // wait, then mix
 *             optimizer_step(x, grads);
 *             r = gossip_send(g, x, t);         // copy x, exchange in the background
 *     }
 *     gossip_free(g);   // after every member is done (others may still need us)
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "topology.h"

typedef struct GossipConfig {
        CollConfig coll;
        GossipTopology topology;
        double weight;        /* w in the mixing step; 0: 1/|G| (the group's average) */
        size_t len;           /* values exchanged */
        uint16_t listen_port; /* 0: any */
} GossipConfig;

void gossip_config_defaults(GossipConfig *c);

typedef struct GossipStats {
        uint64_t exchanges, failed, alone; /* alone: groups of one (no traffic) */
        uint64_t wait_ns;                  /* time gossip_mix() spent waiting */
        uint64_t exchange_ns;              /* send to completion, summed */
        uint64_t bytes_sent, bytes_received;
        int last_error;                    /* -EBADE: no other member trains our model */
        unsigned last_participants;
        CollForeign foreign;               /* members refused, another model (coll_foreign()) */
        CollLoss lost, refused;            /* members' links closed, connections refused (coll_loss()...) */
} GossipStats;

typedef struct Gossip Gossip;

int gossip_new(const GossipConfig *c, Gossip **ret);
Gossip *gossip_free(Gossip *g);
DEFINE_TRIVIAL_CLEANUP_FUNC(Gossip *, gossip_free);
uint16_t gossip_port(const Gossip *g);
/* Before gossip_start(). */
int gossip_set_address(Gossip *g, unsigned member, const char *host, uint16_t port);
int gossip_start(Gossip *g);
/* Members connected to us whose MODEL came, of our model or not (at most
 * n - 1). */
unsigned gossip_connected(Gossip *g);

/* Copy x (len values) and exchange it with the group of iteration t in the
 * background. -EBUSY while the previous exchange has not been mixed. */
int gossip_send(Gossip *g, const float *x, uint64_t t);
/* Wait for the exchange gossip_send() started and apply its mixing step to
 * x as a delta. Returns the group members that took part (1: x unchanged),
 * or a negative errno when the exchange failed (x unchanged). -ENOMSG when
 * nothing was sent. */
int gossip_mix(Gossip *g, float *x);
void gossip_get_stats(Gossip *g, GossipStats *ret);

/* Between gossip_mix() and gossip_send() (else -EBUSY): the topology of the
 * iterations sent from now on. Every member must switch at the same t. */
int gossip_set_topology(Gossip *g, GossipTopology topo);
GossipTopology gossip_get_topology(Gossip *g);
/* Outside the iterations (between gossip_mix() and gossip_send(), after
 * gossip_start()), and blocking: the plain average of x (len values, at
 * most the configured len) over every member that joins within the join
 * timeout, in a round of its own. x gets the average (unchanged when alone
 * or on failure); ret_running_ns the round's time from START to the last
 * piece (what a link estimate wants). Returns the participants or -errno.
 * For probes and agreements (the same bits on every participant). */
int gossip_average(Gossip *g, float *x, size_t len, uint64_t *ret_running_ns);
