/* collective/coll.c — the member table, its links, and message dispatch. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>

#include "coll-internal.h"
#include "util/time-util.h"

/* Pieces held for rounds whose START has not come yet: at most this many,
 * and at most twice the largest vector averaged here (EARLY_MIN_BYTES before
 * the first round) in bytes: a member that sends pieces of rounds that never
 * start cannot hold more. */
#define MAX_EARLY 4096
#define EARLY_MIN_BYTES ((uint64_t)64 << 20)
#define HEARTBEAT_NS (10 * NSEC_PER_SEC)

void coll_config_defaults(CollConfig *c) {
        *c = (CollConfig){
                /* a whole DATA frame: half as many pieces save more (frames,
                 * sends, completions) than the finer pipelining of half
                 * frames gains (bench-allreduce --piece) */
                .piece_bytes = COLL_PIECE_BYTES,
                .join_timeout_ms = 10000,
                .round_timeout_ms = 30000,
                .redial_ms = 1000,
                .ban_ms = COLL_BAN_MS,
        };
}

int coll_member_of_peer(const Coll *c, uint32_t peer) {
        for (unsigned i = 0; i < c->n_members; i++)
                if (c->members[i].up && c->members[i].peer == peer)
                        return (int)i;
        return -ENOENT;
}

uint64_t coll_seen_round(const Coll *c, uint32_t group) {
        for (size_t i = 0; i < c->n_groups; i++)
                if (c->groups[i].group == group)
                        return c->groups[i].last_round;
        return 0;
}

uint64_t *coll_last_round(Coll *c, uint32_t group) {
        for (size_t i = 0; i < c->n_groups; i++)
                if (c->groups[i].group == group)
                        return &c->groups[i].last_round;
        GroupRound *g = realloc(c->groups, (c->n_groups + 1) * sizeof *g);
        if (!g)
                return NULL;
        c->groups = g;
        g[c->n_groups] = (GroupRound){ .group = group };
        return &g[c->n_groups++].last_round;
}

/* Bit i: members[i] is us or connected to us. */
uint64_t coll_view(const Coll *c, const unsigned *members, unsigned n) {
        uint64_t v = 0;
        for (unsigned i = 0; i < n; i++)
                if (members[i] == c->self || c->members[members[i]].up)
                        v |= 1ull << i;
        return v;
}

uint64_t coll_blame(const Coll *c, const unsigned *members, unsigned n) {
        uint64_t b = 0, now = now_ns();
        for (unsigned i = 0; i < n; i++)
                if (members[i] != c->self && c->members[members[i]].banned_until_ns > now)
                        b |= 1ull << i;
        return b;
}

void coll_ban(Coll *c, unsigned member) {
        Member *m = &c->members[member];
        m->banned_until_ns = now_ns() + (uint64_t)c->cfg.ban_ms * 1000000ull;
        if (m->up) /* closed() reports it so: not a goodbye */
                net_drop_peer(c->net, m->peer, COLL_DROP_REASON);
}

static void drop_early(Coll *c, bool (*match)(const Early *, const void *), const void *arg) {
        for (Early **p = &c->early; *p;) {
                Early *e = *p;
                if (match && !match(e, arg)) {
                        p = &e->next;
                        continue;
                }
                *p = e->next;
                c->early_bytes -= e->t->desc.bytes;
                net_tensor_release(c->net, e->t);
                free(e);
                c->n_early--;
        }
}

void coll_early_clear(Coll *c) {
        drop_early(c, NULL, NULL);
}

static bool early_before(const Early *e, const void *t) {
        return e->at_ns < *(const uint64_t *)t;
}

void coll_early_expire(Coll *c, uint64_t now) {
        uint64_t keep = ((uint64_t)c->cfg.join_timeout_ms + c->cfg.round_timeout_ms) * 1000000ull;
        if (c->early && now > keep) {
                uint64_t before = now - keep;
                drop_early(c, early_before, &before);
        }
}

static bool early_from(const Early *e, const void *member) {
        return e->member == *(const unsigned *)member;
}

static void on_connected(void *ud, uint32_t peer, const uint8_t id[IDENTITY_PK_SIZE]) {
        Coll *c = ud;
        for (unsigned i = 0; i < c->n_members; i++) {
                Member *m = &c->members[i];
                if (i == c->self || memcmp(m->m.id, id, IDENTITY_PK_SIZE) != 0)
                        continue;
                if (m->dialing && m->dial_peer == peer)
                        m->dialing = false;
                if (m->up || m->banned_until_ns > now_ns()) /* one link per member: keep the older */
                        break;
                m->up = true;
                m->peer = peer;
                uint8_t buf[COLL_CTL_MAX]; /* what we average, first: see on_model() */
                (void)net_send_control(c->net, peer, FRAME_CONTROL, buf, coll_model_encode(&c->cfg.model, buf));
                return;
        }
        /* authenticated, but not one of ours (or a second link) */
        net_close_peer(c->net, peer);
}

static void on_closed(void *ud, uint32_t peer, int reason, const uint8_t id[IDENTITY_PK_SIZE]) {
        Coll *c = ud;
        uint64_t now = now_ns();
        bool ours = false; /* a member's link, or our dial to one (redialed, not a refusal) */
        for (unsigned i = 0; i < c->n_members; i++) {
                Member *m = &c->members[i];
                if (m->dialing && m->dial_peer == peer) {
                        ours = true;
                        m->dialing = false;
                        m->next_dial_ns = now + (uint64_t)c->cfg.redial_ms * 1000000ull;
                }
                if (m->up && m->peer == peer) {
                        ours = true;
                        c->loss = (CollLoss){ .count = c->loss.count + 1, .member = i, .reason = reason };
                        (void)net_peer_describe(c->net, peer, &c->loss.info);
                        m->up = false;
                        m->diverged = false; /* a new link, a new start (a restart from a checkpoint) */
                        m->foreign = false;  /* ... perhaps of the job we train */
                        m->model_known = false;
                        m->next_dial_ns = now + (uint64_t)c->cfg.redial_ms * 1000000ull;
                        drop_early(c, early_from, &i);
                        round_on_member_lost(c, i, reason);
                        state_on_member_lost(c, i, -ECONNRESET);
                }
        }
        NetPeerInfo info;
        if (!ours && net_peer_describe(c->net, peer, &info) >= 0 && (!info.open || reason == -EACCES))
                c->refusals = (CollLoss){ .count = c->refusals.count + 1, .member = c->n_members, .reason = reason,
                                          .info = info };
}

/* A member's MODEL, the first message of its link, once: one of another
 * model (coll_model_check()) is left out until its link goes. It does the
 * same with ours, so both ends refuse each other at once, whatever their
 * places in any group. -EBADMSG: not first, or twice. */
static int on_model(Coll *c, unsigned member, const CollCtl *m) {
        Member *mb = &c->members[member];
        if ((m->kind == COLL_MODEL) == mb->model_known)
                return -EBADMSG;
        if (m->kind != COLL_MODEL)
                return 0;
        mb->model_known = true;
        if (coll_model_check(&c->cfg.model, &m->model.model) == 0)
                return 1;
        mb->foreign = true;
        c->foreign = (CollForeign){ .count = c->foreign.count + 1, .member = member, .theirs = m->model.model };
        round_on_foreign(c, member);
        state_on_member_lost(c, member, -EBADE);
        return 1;
}

static void on_control(void *ud, uint32_t peer, uint8_t type, const uint8_t *payload, size_t len) {
        Coll *c = ud;
        int member = coll_member_of_peer(c, peer);
        CollCtl m;
        if (member < 0 || type != FRAME_CONTROL)
                return;
        int k = coll_ctl_decode(payload, len, &m) < 0 ? -EBADMSG : on_model(c, (unsigned)member, &m);
        if (k != 0) { /* a MODEL taken, or a message that breaks the protocol */
                if (k < 0)
                        coll_ban(c, (unsigned)member);
                return;
        }
        if (m.kind == COLL_READY)
                round_on_ready(c, (unsigned)member, &m.ready);
        else if (m.kind == COLL_ABORT)
                round_on_abort(c, (unsigned)member, &m.abort);
        else if (m.kind == COLL_STATE_ASK)
                state_on_ask(c, (unsigned)member, &m.ask);
        else if (m.kind == COLL_STATE_NO)
                state_on_no(c, (unsigned)member, &m.no);
        else if (round_on_start(c, (unsigned)member, &m.start) == -EBADMSG)
                coll_ban(c, (unsigned)member);
}

static void on_tensor(void *ud, NetTensor *t) {
        Coll *c = ud;
        int member = coll_member_of_peer(c, t->peer);
        CollPiece h;
        if (member < 0) {
                net_tensor_release(c->net, t);
                return;
        }
        if (coll_piece_decode(t->data, t->desc.bytes, &h) < 0 || h.group != t->stream) {
                net_tensor_release(c->net, t);
                coll_ban(c, (unsigned)member);
                return;
        }
        if (h.phase == COLL_STATE)
                state_on_piece(c, (unsigned)member, &h, t);
        else if (round_on_piece(c, (unsigned)member, &h, t) == -EBADMSG)
                coll_ban(c, (unsigned)member);
}

static void on_sent(void *ud, uint32_t peer, uint64_t cookie) {
        if (cookie >> 32 == 0) /* a state's piece: rounds count from 1 */
                state_on_sent(ud, (uint32_t)cookie);
        else
                round_on_sent(ud, cookie);
}

/* A member's other connection refused before it joined its link: a
 * refusal like one that never was a member's link. */
static void on_lane_refused(void *ud, int reason, const NetPeerInfo *info) {
        Coll *c = ud;
        c->refusals = (CollLoss){ .count = c->refusals.count + 1, .member = c->n_members, .reason = reason,
                                  .info = *info };
}

static const NetCallbacks callbacks = {
        .connected = on_connected,
        .tensor = on_tensor,
        .control = on_control,
        .sent = on_sent,
        .closed = on_closed,
        .lane_refused = on_lane_refused,
};

int coll_new(const CollConfig *cfg, Coll **ret) {
        if (!cfg->net || !cfg->members || cfg->n_members == 0 || cfg->self >= cfg->n_members ||
            (unsigned)cfg->payload >= _COLL_PAYLOAD_MAX || cfg->piece_bytes < 4096 || cfg->piece_bytes > cfg->net->limits.max_tensor_bytes - COLL_PIECE_HEADER)
                return -EINVAL;
        Coll *c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->cfg = *cfg;
        c->n_members = cfg->n_members;
        c->self = cfg->self;
        c->members = calloc(cfg->n_members, sizeof *c->members);
        if (!c->members) {
                free(c);
                return -ENOMEM;
        }
        for (unsigned i = 0; i < cfg->n_members; i++)
                c->members[i].m = cfg->members[i];
        c->relay = cfg->net->relay_host != NULL;
        int r = net_new(cfg->net, &callbacks, c, &c->net);
        c->cfg.net = NULL; /* the caller's, maybe on its stack: net_new() took what it needs */
        if (r < 0) {
                free(c->members);
                free(c);
                return r;
        }
        *ret = c;
        return 0;
}

Coll *coll_free(Coll *c) {
        if (!c)
                return NULL;
        drop_early(c, NULL, NULL);
        /* Received buffers go back while their Net exists; then the links,
         * so no send still points into a round's buffer. */
        for (CollRound *r = c->rounds; r; r = r->next) {
                round_release_held(r);
                r->freed = true; /* the sent() calls of net_free() only count down */
        }
        state_stop_giving(c);
        c->net = net_free(c->net);
        coll_state_free(c);
        while (c->rounds) {
                CollRound *r = c->rounds;
                c->rounds = r->next;
                round_destroy(r);
        }
        free(c->spare);
        free(c->readies);
        free(c->groups);
        free(c->members);
        free(c);
        return NULL;
}

int coll_listen(Coll *c, uint16_t port, uint16_t *ret_port) {
        if (c->members[c->self].m.no_accept) { /* it dials every link itself */
                if (ret_port)
                        *ret_port = 0;
                return 0;
        }
        const char *host = c->cfg.listen_host ? c->cfg.listen_host : c->members[c->self].m.host;
        return net_listen_wait(c->net, host, port, c->cfg.listen_wait_ms, ret_port);
}

int coll_set_address(Coll *c, unsigned member, const char *host, uint16_t port) {
        if (member >= c->n_members || strlen(host) >= sizeof c->members[member].m.host)
                return -EINVAL;
        snprintf(c->members[member].m.host, sizeof c->members[member].m.host, "%s", host);
        c->members[member].m.port = port;
        return 0;
}

/* The member with the lower index dials, or the one that accepts no
 * connections (net_dials()); two that accept none link through the relay,
 * the lower index asking for the other there. A failed dial waits
 * redial_ms. */
static void dial(Coll *c, uint64_t now) {
        bool accepts = !c->members[c->self].m.no_accept;
        for (unsigned i = 0; i < c->n_members; i++) {
                Member *m = &c->members[i];
                bool relayed = net_relays(accepts, !m->m.no_accept, c->self < i) && c->relay;
                if (i == c->self || (!relayed && !net_dials(accepts, !m->m.no_accept, c->self < i)))
                        continue;
                if (m->up || m->dialing || m->unwanted || now < m->next_dial_ns || now < m->banned_until_ns ||
                    (!relayed && m->m.port == 0))
                        continue;
                m->next_dial_ns = now + (uint64_t)c->cfg.redial_ms * 1000000ull;
                if ((relayed ? net_connect_relayed(c->net, m->m.id, &m->dial_peer)
                             : net_connect(c->net, m->m.host, m->m.port, &m->dial_peer)) == 0)
                        m->dialing = true;
        }
}

int coll_run(Coll *c, int timeout_ms) {
        int r = net_run(c->net, timeout_ms);
        uint64_t now = now_ns();
        dial(c, now);
        if (now >= c->next_heartbeat_ns) {
                net_broadcast_control(c->net, FRAME_HEARTBEAT, NULL, 0);
                c->next_heartbeat_ns = now + HEARTBEAT_NS;
        }
        round_tick(c, now);
        state_tick(c, now);
        return r;
}

void coll_want(Coll *c, unsigned member, bool want) {
        if (member < c->n_members)
                c->members[member].unwanted = !want;
}

bool coll_connected(const Coll *c, unsigned member) {
        return member < c->n_members && (member == c->self || c->members[member].up);
}

unsigned coll_n_connected(const Coll *c) {
        unsigned n = 0;
        for (unsigned i = 0; i < c->n_members; i++)
                n += c->members[i].up;
        return n;
}

void coll_set_state_hook(Coll *c, CollStateHook hook, void *ud) {
        c->state_hook = hook;
        c->state_ud = ud;
}

CollLoss coll_refusals(const Coll *c) {
        return c->refusals;
}

CollForeign coll_foreign(const Coll *c) {
        return c->foreign;
}

int coll_member_model(const Coll *c, unsigned member) {
        const Member *m = member < c->n_members ? &c->members[member] : NULL;
        if (!m || !m->up || !m->model_known)
                return 0;
        return m->foreign ? -EBADE : 1;
}

CollLoss coll_diverged(const Coll *c) {
        return c->diverged;
}

CollLoss coll_unready(const Coll *c) {
        return c->unready;
}

CollLoss coll_loss(const Coll *c) {
        return c->loss;
}

Net *coll_net(Coll *c) {
        return c->net;
}

int64_t coll_peer(const Coll *c, unsigned member) {
        if (member >= c->n_members || member == c->self || !c->members[member].up)
                return -ENOTCONN;
        return c->members[member].peer;
}

void coll_set_piece_hook(Coll *c, CollPieceHook hook, void *ud) {
        c->hook = hook;
        c->hook_ud = ud;
}

/* Keep a piece for a round that has not started here yet. */
int coll_early_add(Coll *c, unsigned member, const CollPiece *h, NetTensor *t) {
        uint64_t cap = MAX(EARLY_MIN_BYTES, 2 * c->largest_round);
        Early *e;
        if (c->n_early >= MAX_EARLY || c->early_bytes + t->desc.bytes > cap || !(e = malloc(sizeof *e))) {
                net_tensor_release(c->net, t);
                return -ENOBUFS;
        }
        *e = (Early){ .next = c->early, .member = member, .hdr = *h, .t = t, .at_ns = now_ns() };
        c->early = e;
        c->n_early++;
        c->early_bytes += t->desc.bytes;
        return 0;
}

void coll_early_take(Coll *c, uint32_t group, uint64_t round, void (*fn)(Coll *, Early *, void *), void *ud) {
        Early *mine = NULL;
        for (Early **p = &c->early; *p;) {
                Early *e = *p;
                if (e->hdr.group != group || e->hdr.round > round) {
                        p = &e->next;
                        continue;
                }
                *p = e->next;
                c->n_early--;
                c->early_bytes -= e->t->desc.bytes;
                if (e->hdr.round == round) { /* the list is newest first: reverse */
                        e->next = mine;
                        mine = e;
                } else {
                        net_tensor_release(c->net, e->t);
                        free(e);
                }
        }
        while (mine) {
                Early *e = mine;
                mine = e->next;
                fn(c, e, ud);
                free(e);
        }
}

uint8_t *coll_buffer_get(Coll *c, size_t *bytes) {
        if (c->spare && c->spare_bytes >= *bytes) {
                *bytes = c->spare_bytes;
                c->spare_bytes = 0;
                return TAKE_PTR(c->spare);
        }
        return aligned_alloc(64, ALIGN_TO(*bytes, 64));
}

void coll_buffer_put(Coll *c, uint8_t *buf, size_t bytes) {
        if (!buf)
                return;
        if (bytes > c->spare_bytes) {
                free(c->spare);
                c->spare = buf;
                c->spare_bytes = bytes;
        } else
                free(buf);
}
