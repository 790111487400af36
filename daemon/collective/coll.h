/* collective/coll.h — averaging a float vector over a group of members, with
 * a pipelined ring all-reduce on authenticated links.
 *
 * A Coll is one thread's averaging endpoint: its Net, and the table of members
 * it may average with (identity and address), the same table in the same
 * order on every member. Links come up by themselves: the member with the
 * lower index dials (or the one that accepts no connections: net_dials()),
 * and redials a lost link every second.
 *
 * A round averages x over a group, given as member indices in increasing
 * order (the same list on every member of the group):
 *   1. every member sends READY (its weight and the members it is connected
 *      to) to the group's leader, the first member it sees connected;
 *   2. the leader waits for the connected members, then sends START with the
 *      participants (a fully connected set) and their weights;
 *   3. the participants run reduce-scatter then all-gather around the ring
 *      in index order. The vector is cut into one chunk per participant and
 *      every chunk into pieces, which travel independently, so every link
 *      stays busy. Each piece is summed by the ring in one fixed order and
 *      then copied, so every participant ends with bit-identical values.
 *      Contributions are scaled by weight / total weight before summing.
 * A round that misses its deadline, loses a participant or receives a bad
 * piece stops; every piece is then either the average over the participants
 * or untouched (coll_round_apply() applies only complete pieces). A member
 * that sent a bad piece is refused for ban_ms, and the leaders it is
 * reported to leave it out. A member whose own values are not finite sits
 * the round out: the round fails at once there (-ERANGE), without READY,
 * and its ABORT -ERANGE tells the others to go on without it.
 *
 *     Coll *c;
 *     r = coll_new(&(CollConfig){ .net = &nc, .members = m, .n_members = 4, .self = 1 }, &c);
 *     CollRound *rd;
 *     r = coll_round_start(c, group_id, (unsigned[]){ 0, 1, 2, 3 }, 4, x, len, weight, &rd);
 *     while (!coll_round_finished(rd))
 *             coll_run(c, 50);
 *     coll_round_apply(rd, w);   // w += avg - x on every complete piece
 *     coll_round_free(rd);
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll-wire.h"
#include "net/net.h"

typedef struct CollMember {
        uint8_t id[IDENTITY_PK_SIZE];
        char host[256];
        uint16_t port;
        bool no_accept; /* behind NAT: it dials every member that accepts, none dials it */
} CollMember;

typedef struct CollConfig {
        const NetConfig *net;
        const CollMember *members;
        unsigned n_members;
        unsigned self;              /* our index in members */
        const char *listen_host;    /* NULL: members[self].host */
        unsigned listen_wait_ms;    /* coll_listen(): how long a port in use is tried again (net_listen_wait()) */
        CollPayload payload;        /* how values travel: float32, binary16, 8-bit */
        size_t piece_bytes;         /* values per piece, in bytes (default COLL_PIECE_BYTES) */
        unsigned join_timeout_ms;   /* READY to START */
        unsigned round_timeout_ms;  /* START to the last piece */
        unsigned redial_ms;
        unsigned ban_ms;            /* a member that broke the protocol is refused this long (COLL_BAN_MS) */
        CollModel model;            /* what this member averages; zero: not named (see coll_foreign()) */
} CollConfig;

#define COLL_BAN_MS 60000
/* A member's link that coll_ban() drops closes with this reason. */
#define COLL_DROP_REASON (-EBADRQC)

void coll_config_defaults(CollConfig *c);

typedef enum CollRoundState {
        COLL_ROUND_JOINING,
        COLL_ROUND_RUNNING,
        COLL_ROUND_DONE,   /* every piece averaged */
        COLL_ROUND_FAILED, /* some or no piece averaged; see error */
} CollRoundState;

typedef struct CollRoundInfo {
        CollRoundState state;
        int error;              /* why a round failed: -ETIMEDOUT, -ECONNRESET, -EBADMSG, ... */
        uint64_t round;
        unsigned participants;  /* 0 before START */
        uint64_t participants_map; /* bit i: position i of the group took part */
        unsigned rank;
        size_t pieces, pieces_done;
        double total_weight;
        uint64_t start_ns, running_ns, end_ns;
        uint64_t bytes_sent, bytes_received;
} CollRoundInfo;

/* Lets a test act at a precise moment of a round (kill the process, stop
 * reading): called after each piece is queued for sending. */
typedef void (*CollPieceHook)(void *ud, uint8_t phase, unsigned pieces_sent_in_phase);

typedef struct Coll Coll;
typedef struct CollRound CollRound;

int coll_new(const CollConfig *c, Coll **ret);
Coll *coll_free(Coll *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(Coll *, coll_free);
/* Bind the listener (port 0: any; the port is written back with ret_port);
 * a member that accepts no connections binds none (port 0). A port in use:
 * -EADDRINUSE, after cfg.listen_wait_ms. */
int coll_listen(Coll *c, uint16_t port, uint16_t *ret_port);
/* Point member i at another address (after coll_listen of a peer found it). */
int coll_set_address(Coll *c, unsigned member, const char *host, uint16_t port);
/* Wait up to timeout_ms for I/O and run whatever is due. */
int coll_run(Coll *c, int timeout_ms);
/* Whether to dial a member (all are, at first): a node that meets only
 * some of the members in its rounds (a wide ring's grid groups) keeps
 * links with those alone. A member not wanted may still dial in. */
void coll_want(Coll *c, unsigned member, bool want);
bool coll_connected(const Coll *c, unsigned member);
unsigned coll_n_connected(const Coll *c);
/* Links to members that closed, and the last of them: which member, why
 * (NetCallbacks.closed's reason) and what the transport knew of the link. */
typedef struct CollLoss {
        uint64_t count;
        unsigned member;
        int reason;
        NetPeerInfo info;
} CollLoss;
CollLoss coll_loss(const Coll *c);
/* Connections that closed before they were a member's link (a failed or
 * refused handshake, a peer that is no member, another lane refused before
 * it joined its link): how many, and the last (member is then n_members). */
CollLoss coll_refusals(const Coll *c);
/* Members that sat rounds out because their own values are not finite (a
 * diverged optimizer: ABORT -ERANGE): how many times one began to, and the
 * last of them (reason -ERANGE). The rounds of the others go on without it
 * until it says READY again or its link goes. */
CollLoss coll_diverged(const Coll *c);
/* Members whose link is up but that had not said READY when a round this
 * node leads gave up waiting for them (half the join timeout) and started
 * without them: how many times, and the last (its address in info). A
 * member that connects and never says READY holds every such round up so:
 * this names it. */
CollLoss coll_unready(const Coll *c);
/* Members that train another model: their model (in a READY, a STATE_ASK,
 * or a REFUSE they sent) fails coll_model_check() against ours. Each is
 * refused at once and told so (REFUSE, with our model), and until its link
 * goes it is neither waited for, nor taken for a leader, nor admitted to a
 * round, nor asked for or given a state. A round that could take nobody
 * but us while a member of its group is such a one fails at once, -EBADE:
 * we are not averaging, and the owner should say why. How many were
 * refused, and the last of them with its model. */
typedef struct CollForeign {
        uint64_t count;
        unsigned member;
        CollModel theirs;
} CollForeign;
CollForeign coll_foreign(const Coll *c);
/* What member's link up now says it averages: 1 our model, -EBADE another
 * (refused as above), 0 not known (no link, or its MODEL has not come). */
int coll_member_model(const Coll *c, unsigned member);
Net *coll_net(Coll *c);
/* The Net peer of member's link, or -ENOTCONN. */
int64_t coll_peer(const Coll *c, unsigned member);
void coll_set_piece_hook(Coll *c, CollPieceHook hook, void *ud);

/* ---- an optimizer's state for a joiner (coll-state.c) ----
 * A member that joins a swarm that trains already asks the members of a
 * group, one at a time, for their optimizer's state of the group's values
 * (coll_state_fetch). Asked, a member's owner hears it through the hook
 * and hands the state over (coll_state_give) or refuses (coll_state_refuse:
 * busy, no state) or says that its state is zero (coll_state_give_zero:
 * no step taken, nothing to send). The joiner checks every piece (from the member it asked,
 * in its place, once, one step count, every value finite) and asks the next
 * member on a refusal, a bad piece (its sender is refused for ban_ms), a
 * lost link, or round_timeout_ms without a piece. */
typedef void (*CollStateHook)(void *ud, unsigned member, const CollStateAsk *ask);
void coll_set_state_hook(Coll *c, CollStateHook hook, void *ud);
/* The buffer coll_state_fill() writes: arrays of values each, as pieces. */
size_t coll_state_bytes(size_t values, unsigned arrays);
void coll_state_fill(uint8_t *buf, uint32_t group, const float *const *arrays, unsigned n_arrays, size_t values,
                     uint64_t steps);
/* Send a filled buffer to member; coll frees it once sent (or at once on an
 * error: -ENOTCONN, -EBUSY past COLL_MAX_DONATIONS under way). */
int coll_state_give(Coll *c, unsigned member, uint8_t *buf, uint32_t group, size_t values, unsigned arrays);
int coll_state_refuse(Coll *c, unsigned member, uint32_t group, int error);
/* Every value of the state is zero (no optimizer step taken): STATE_NO
 * with error 0; the joiner takes zeros and 0 steps, no piece travels. */
int coll_state_give_zero(Coll *c, unsigned member, uint32_t group);
/* Bytes of the states' pieces sent and received so far (the rounds count
 * theirs in CollRoundInfo). */
void coll_state_traffic(const Coll *c, uint64_t *ret_sent, uint64_t *ret_received);
/* States being sent. */
unsigned coll_state_giving(const Coll *c);
/* Ask the connected members of group (not itself) in turn; dst[k] takes
 * array k (values each), and must stay until coll_state_forget(). */
int coll_state_fetch(Coll *c, uint32_t group, const unsigned *members, unsigned n, float *const *dst,
                     unsigned arrays, size_t values);
/* -EINPROGRESS; 0 with the giver's steps and index; or why no member gave
 * it (the last refusal, -EBADMSG, -ETIMEDOUT, -ECONNRESET, -ENOTCONN). */
int coll_state_fetched(const Coll *c, uint32_t group, uint64_t *ret_steps, unsigned *ret_member);
void coll_state_forget(Coll *c);

/* Start a round; x (len values) must stay unchanged until the round is
 * freed. -EBUSY if this group already has a round in progress. */
int coll_round_start(Coll *c, uint32_t group, const unsigned *members, unsigned n, const float *x, size_t len,
                     double weight, CollRound **ret);
/* Right after coll_round_start(): write each piece's average to out (len
 * values; out may be x itself, an in-place all-reduce) the moment it is
 * complete, while the received piece is still in the cache (an out of 16
 * MiB or more is written around the cache: it would leave it before it is
 * read), and let go of its receive buffer once it is passed on. The pieces
 * not complete when a round fails keep what out held. coll_round_read() and coll_round_apply() read from out
 * then; apply needs out != x. -EBUSY if the round has an output already. */
int coll_round_set_output(CollRound *r, float *out);
/* Error feedback for int8 payloads, right after coll_round_start(): err (len
 * values, zeros at first) holds what this member's quantizing lost in
 * earlier rounds. Where it quantizes a piece (its own share, or the running
 * sum it passes on, or the finished average), it adds err there first and
 * keeps what this quantizing loses in its place, so an error made in one
 * round is paid back in the next instead of adding up over rounds. The
 * errors are in the units of the sum (the average): carry err from round to
 * round over the same values. Other payloads ignore it. */
int coll_round_set_feedback(CollRound *r, float *err);
bool coll_round_finished(const CollRound *r);
/* The rounds started from now on are last rounds (final) or not, and wait
 * join_ms for the others (0: the configured join timeout). A last round
 * averages only with members in their last round too: whoever finishes
 * training first waits for the others, so all leave with the same values. */
void coll_set_patience(Coll *c, unsigned join_ms, bool final);
void coll_round_info(const CollRound *r, CollRoundInfo *ret);
/* The average of values [off, off+n) if their pieces are complete, written
 * to out; -EAGAIN if some piece among them is not. */
int coll_round_read(const CollRound *r, size_t off, size_t n, float *out);
/* Piece i of the round (i < CollRoundInfo.pieces): its values, and whether
 * they hold the average. -ERANGE past the last piece. */
int coll_round_piece(const CollRound *r, size_t i, size_t *ret_off, size_t *ret_len, bool *ret_done);
/* w[i] += avg[i] - x[i] for every value of a complete piece (the delta rule
 * that keeps updates made during the round); returns how many values. */
size_t coll_round_apply(const CollRound *r, float *w);
/* Ends the round; pieces still being sent are given up and freed when the
 * Net lets go of them. */
void coll_round_free(CollRound *r);
