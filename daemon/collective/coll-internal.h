/* collective/coll-internal.h — what coll.c (members, links, dispatch) and
 * coll-round.c (the round state machine) share. */
#pragma once

#include "coll.h"

typedef struct Member {
        CollMember m;
        bool up;
        uint32_t peer;      /* Net peer of the authenticated link while up */
        bool dialing;
        uint32_t dial_peer; /* our outgoing link, until it is authenticated or gone */
        uint64_t next_dial_ns;
        uint64_t banned_until_ns; /* sent a bad piece: refused until then */
        bool unwanted;            /* coll_want(): not dialed */
        /* Gave a round up with ABORT -ERANGE (its values are not finite): not
         * waited for, taken for a leader or admitted, until its next READY or
         * until its link goes. */
        bool diverged;
        /* Trains another model (coll_foreign()): left out like a diverged
         * one, and not told our values, until its link goes. */
        bool foreign;
        bool model_known; /* its MODEL came on this link (the first message, once) */
} Member;

/* Not waited for, taken for a leader or admitted: it sits rounds out, or
 * trains another model. */
static inline bool member_out(const Member *m) {
        return m->diverged || m->foreign;
}

/* The last READY each member sent for a group; the leader reads them. */
typedef struct ReadyEntry {
        uint32_t group;
        unsigned member;
        CollReady msg;
        uint64_t at_ns;
} ReadyEntry;

/* A piece that came before its round's START. */
typedef struct Early {
        struct Early *next;
        unsigned member;
        CollPiece hdr;
        NetTensor *t;
        uint64_t at_ns;
} Early;

typedef struct GroupRound {
        uint32_t group;
        uint64_t last_round;
} GroupRound;

enum {
        PIECE_GOT_RS = 1 << 0, /* the running sum arrived from the left */
        PIECE_GOT_AG = 1 << 1, /* the average arrived from the left */
        PIECE_DONE = 1 << 2,   /* the average is here */
};

typedef struct Piece {
        size_t off;       /* first value in x */
        size_t wire_off;  /* header, then values, in the round's wire buffer */
        uint32_t count;
        uint32_t chunk;   /* the participant (rank) that completes its sum */
        uint8_t flags;
        uint8_t sends;        /* copies queued in the Net (at most 2: sum, average) */
        /* Received buffers are worked on in place and passed on as they are
         * (header included): neither phase copies. sum: the running sum,
         * until it is sent on; held: the average, kept until the round ends. */
        NetTensor *sum;
        NetTensor *held;
} Piece;

/* A send that waits for room in the link's queue. */
typedef struct Backlog {
        uint32_t piece;
        uint8_t phase;
} Backlog;

struct CollRound {
        Coll *coll;
        CollRound *next;
        uint32_t uid; /* in send cookies */
        uint32_t group;
        unsigned members[COLL_MAX_MEMBERS], n_members, self_pos;
        const float *x;
        float *out; /* coll_round_set_output(): where averages go as they complete */
        bool out_around_cache; /* out is too large to stay cached: written with non-temporal stores */
        float *feedback; /* coll_round_set_feedback(): int8 errors carried between rounds */
        size_t len;
        double weight;
        bool freed;

        CollRoundState state;
        int error;
        uint64_t round;
        uint64_t start_ns, join_deadline_ns, running_ns, deadline_ns, end_ns;
        unsigned leader_sent_to; /* member index our READY went to, or UINT_MAX */
        uint64_t ready_sent_ns;
        uint64_t view_sent;      /* the view our last READY carried */
        unsigned join_ms;        /* this round's join timeout */
        bool final;              /* a last round: only with others in theirs */
        CollPayload payload;     /* how its values travel (a last round's in float32) */

        /* from START */
        unsigned part[COLL_MAX_MEMBERS], n_part, rank, left, right;
        bool right_gone; /* the right neighbour said BYE: what it would get from us is dropped */
        uint64_t part_map;
        double total_weight;
        float coef;
        bool identity; /* alone: the average is x itself */

        Piece *pieces;
        unsigned n_pieces, done, sending;
        uint8_t *wire;
        size_t wire_bytes;
        uint32_t inject, inject_next; /* the chunk our values start, its next piece to send */
        unsigned inject_out;          /* pieces of it queued and not yet sent */
        Backlog *backlog; /* sends waiting for room, in order */
        unsigned backlog_n;
        unsigned sent_in_phase[3];
        uint64_t bytes_sent, bytes_received;
};

/* An optimizer's state on its way to a joiner (coll-state.c). */
#define COLL_MAX_DONATIONS 4
typedef struct Donation {
        uint32_t id;          /* the cookie of its pieces (rounds' cookies start at 1 << 32) */
        unsigned member;
        uint32_t peer;        /* the link it goes on: once gone, nothing more */
        uint32_t group;
        uint8_t *buf;         /* the pieces, header and values, PIECE_STRIDE apart; freed once sent */
        size_t total, n_pieces, next, sending;
} Donation;

/* An optimizer's state asked for, one member of the group at a time. */
typedef struct Fetch {
        uint32_t group;
        unsigned members[COLL_MAX_MEMBERS], n;
        uint64_t tried;       /* bit i: members[i] was asked */
        int donor;            /* the member asked now; -1: none */
        float *dst[COLL_STATE_MAX_ARRAYS];
        unsigned arrays;
        size_t values, n_pieces, n_got;
        uint8_t *got;         /* one byte per piece */
        uint64_t steps, deadline_ns; /* steps: those of the pieces in so far */
        int last_error;       /* the last refusal, or why the last member failed */
        int result;           /* -EINPROGRESS, 0, or last_error once nobody is left to ask */
} Fetch;

struct Coll {
        Net *net;
        CollConfig cfg;
        Member *members;
        unsigned n_members, self;
        CollRound *rounds;
        uint32_t next_uid;
        ReadyEntry *readies;
        size_t n_readies;
        GroupRound *groups;
        size_t n_groups;
        Early *early;
        unsigned n_early;
        uint64_t early_bytes;     /* of the early pieces' tensors */
        uint64_t largest_round;   /* bytes of the largest vector a round here averaged */
        CollPieceHook hook;
        void *hook_ud;
        uint64_t next_heartbeat_ns;
        unsigned patience_ms; /* join timeout of the rounds started next; 0: the configured one */
        bool final_next;      /* the rounds started next are last rounds */
        uint8_t *spare; /* the largest wire buffer of a past round, kept for the next */
        size_t spare_bytes;
        CollLoss loss; /* links to members lost so far, and the last one */
        CollLoss refusals; /* connections closed before they were a member's link */
        CollLoss diverged; /* members that sat a round out, their values not finite (coll_diverged()) */
        CollLoss unready;  /* connected members a round we led started without (coll_unready()) */
        bool relay;        /* NetConfig.relay_host was set: members that both accept none link through it */
        CollForeign foreign; /* members refused for another model (coll_foreign()) */
        Donation donations[COLL_MAX_DONATIONS];
        unsigned n_donations;
        uint32_t next_donation;
        Fetch *fetches;
        unsigned n_fetches;
        CollStateHook state_hook;
        void *state_ud;
        uint64_t state_sent, state_received; /* bytes of the states' pieces, given and taken */
};

int coll_member_of_peer(const Coll *c, uint32_t peer);
/* The last round of group here, its entry made if there is none (for the
 * groups this node runs rounds in); coll_seen_round() only looks, 0 for a
 * group never seen, so a peer naming groups makes no entries. */
uint64_t *coll_last_round(Coll *c, uint32_t group);
uint64_t coll_seen_round(const Coll *c, uint32_t group);
uint64_t coll_view(const Coll *c, const unsigned *members, unsigned n);
uint64_t coll_blame(const Coll *c, const unsigned *members, unsigned n);
/* A member broke the protocol: drop its link and refuse it for ban_ms. */
void coll_ban(Coll *c, unsigned member);

int coll_early_add(Coll *c, unsigned member, const CollPiece *h, NetTensor *t);
void coll_early_clear(Coll *c);
/* Drop the early pieces no START has taken within a round's time. */
void coll_early_expire(Coll *c, uint64_t now);
/* Hand the pieces of (group, round) to fn in arrival order; drop the rest of
 * the group's early pieces that are no newer than round. */
void coll_early_take(Coll *c, uint32_t group, uint64_t round, void (*fn)(Coll *, Early *, void *), void *ud);

/* A wire buffer of at least *bytes (updated to its size), reused across
 * rounds so a large vector does not fault its pages in every time. */
uint8_t *coll_buffer_get(Coll *c, size_t *bytes);
void coll_buffer_put(Coll *c, uint8_t *buf, size_t bytes);

/* coll-round.c */
void round_on_ready(Coll *c, unsigned member, const CollReady *m);
int round_on_start(Coll *c, unsigned member, const CollStart *m);
/* Consumes t (releases it) in every case; -EBADMSG if the sender broke a rule. */
int round_on_piece(Coll *c, unsigned member, const CollPiece *h, NetTensor *t);
void round_on_sent(Coll *c, uint64_t cookie);
void round_on_member_lost(Coll *c, unsigned member, int reason);
/* A member of another model (its MODEL): its READYs go. */
void round_on_foreign(Coll *c, unsigned member);
/* A participant gave the round up: so do we (-ECONNABORTED). */
void round_on_abort(Coll *c, unsigned member, const CollAbort *m);
void round_tick(Coll *c, uint64_t now);
void round_destroy(CollRound *r);
void round_release_held(CollRound *r);

/* out = a, n values, in one pass that also checks them: false if one is
 * not finite (coll-round.c). */
bool copy_finite_f32(float *restrict out, const float *restrict a, size_t n);
bool copy_finite_f32_around(float *restrict out, const float *restrict a, size_t n);

/* coll-state.c */
void state_on_ask(Coll *c, unsigned member, const CollStateAsk *m);
void state_on_no(Coll *c, unsigned member, const CollStateNo *m);
void state_on_piece(Coll *c, unsigned member, const CollPiece *h, NetTensor *t);
void state_on_sent(Coll *c, uint32_t id);
/* The member asked for a state is gone, or trains another model (why):
 * the next one is asked. */
void state_on_member_lost(Coll *c, unsigned member, int why);
void state_tick(Coll *c, uint64_t now);
void state_stop_giving(Coll *c);
void coll_state_free(Coll *c);
