/* run/averaging.c */
#include "averaging.h"

#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "events.h"
#include "node.h"
#include "util/log.h"
#include "util/time-util.h"

int averaging_model(const ModelSpec *m, CollModel *ret) {
        _cleanup_(freep) Layer *layers = calloc(MODEL_MAX_LAYERS, sizeof *layers);
        if (!layers)
                return -ENOMEM;
        if (model_spec_check(m, layers, NULL) < 0)
                return -EINVAL;
        checkpoint_model_digest(layers, m->n_layers, ret->digest);
        ret->values = model_spec_params(m, 0, m->n_layers);
        return 0;
}

/* 134912 -> "134,912" */
static const char *count_str(uint64_t v, char buf[32]) {
        char d[24];
        int n = snprintf(d, sizeof d, "%llu", (unsigned long long)v), o = 0;
        for (int i = 0; i < n; i++) {
                if (i && (n - i) % 3 == 0)
                        buf[o++] = ',';
                buf[o++] = d[i];
        }
        buf[o] = 0;
        return buf;
}

void averaging_model_why(const CollModel *ours, const CollModel *theirs, char *buf, size_t size) {
        char a[32], b[32];
        int n = 0;
        if (memcmp(ours->digest, theirs->digest, sizeof ours->digest) != 0)
                n = snprintf(buf, size, "its layers' digest %02x%02x%02x%02x… differs from ours %02x%02x%02x%02x…",
                             theirs->digest[0], theirs->digest[1], theirs->digest[2], theirs->digest[3],
                             ours->digest[0], ours->digest[1], ours->digest[2], ours->digest[3]);
        else
                n = snprintf(buf, size, "its layers' digest is ours");
        snprintf(buf + n, size - (size_t)n, "; %s values against %s", count_str(theirs->values, a),
                 count_str(ours->values, b));
}

int averaging_coll_config(const AveragingGroup *g, const Identity *id, size_t n_params, CollConfig *cc, NetConfig *nc,
                          CollMember **ret_members) {
        const ConfigAveraging *ca = g->settings;
        _cleanup_(freep) CollMember *members = calloc(ca->n_members, sizeof *members);
        unsigned self = UINT32_MAX;

        if (!members)
                return log_error_errno(-ENOMEM, "Out of memory");
        if (g->model && averaging_model(g->model, &cc->model) < 0)
                return log_error_errno(-EINVAL, "The job's model does not check: no averaging");
        for (size_t i = 0; i < ca->n_members; i++) {
                memcpy(members[i].id, ca->members[i].id, IDENTITY_PK_SIZE);
                snprintf(members[i].host, sizeof members[i].host, "%s", ca->members[i].address.host);
                members[i].port = ca->members[i].address.port;
                members[i].no_accept = ca->members[i].no_accept;
                if (memcmp(ca->members[i].id, id->pk, IDENTITY_PK_SIZE) == 0)
                        self = (unsigned)i;
        }
        if (self == UINT32_MAX) {
                char hex[IDENTITY_HEX_SIZE];
                identity_to_hex(id->pk, hex);
                log_error("%s: averaging.members: this node's key %s is not among them", g->source, hex);
                return -EINVAL;
        }
        *nc = *g->net;
        nc->relay_wait = ca->members[self].no_accept && nc->relay_host; /* members behind NAT ask for it there */
        nc->relay_channel = NET_RELAY_AVERAGING;
        /* The receive pool holds the averages a round keeps and the sums in flight. */
        nc->pool_bytes = MIN(n_params * sizeof(float) + (16u << 20), (size_t)1 << 30);

        cc->net = nc;
        cc->members = members;
        cc->n_members = (unsigned)ca->n_members;
        cc->self = self;
        cc->listen_host = ca->listen.host;
        cc->payload = (CollPayload)ca->payload;
        cc->join_timeout_ms = ca->join_timeout_ms;
        cc->round_timeout_ms = ca->round_timeout_ms;
        *ret_members = TAKE_PTR(members);
        return 0;
}

/* "Averaging with 4 members (ring, int8, outer Nesterov lr 0.7 momentum
 * 0.9, 4 fragments), member 2, every 100 steps, listening on ..." */
static void log_started(const Averaging *a, const ConfigAveraging *ca) {
        char how[160], every[48], where[CONFIG_HOST_MAX + 48];
        int n = snprintf(how, sizeof how, "%s%s%s%s", ca->method == CONFIG_AVERAGING_MOSHPIT ? "moshpit" : "ring",
                         ca->payload ? ", " : "", ca->payload ? coll_payload_names[ca->payload] : "",
                         ca->payload == COLL_PAYLOAD_INT8 && ca->error_feedback ? " with error feedback" : "");
        if (ca->outer)
                n += snprintf(how + n, sizeof how - (size_t)n, ", outer %s lr %g momentum %g",
                              ca->outer_nesterov ? "Nesterov" : "SGD", ca->outer_lr, ca->outer_momentum);
        if (ca->fragments > 1)
                snprintf(how + n, sizeof how - (size_t)n, ", %u fragments in turn", ca->fragments);
        if (ca->interval_steps)
                snprintf(every, sizeof every, "%u steps", ca->interval_steps);
        else
                snprintf(every, sizeof every, "%g s", ca->interval_ms / 1000.0);
        if (ca->members[a->self].no_accept)
                snprintf(where, sizeof where, "dialing every member (this node accepts no connections)");
        else
                snprintf(where, sizeof where, "listening on %s:%u", ca->listen.host, ca->listen.port);
        log_info("Averaging with %u members (%s), member %u, every %s, %s", a->n_members, how, a->self + 1, every,
                 where);
}

void averaging_report_started(const Averaging *a, const AveragingGroup *g, size_t n_params, Control *c) {
        NodeAveraging na = { .nodes = a->group_members, .params = n_params };
        snprintf(na.method, sizeof na.method, "%s", g->settings->method == CONFIG_AVERAGING_MOSHPIT ? "moshpit" : "ring");
        control_report_averaging(c, &na);
}

typedef struct AveragerNew {
        AveragerConfig *config;
        Averager **ret;
} AveragerNew;

/* averager_new(), which listens, as node_listen_patiently() tries it. */
static int averager_new_waiting(void *userdata, unsigned wait_ms) {
        AveragerNew *an = userdata;
        an->config->coll.listen_wait_ms = wait_ms;
        return averager_new(an->config, an->ret);
}

int averaging_start(Averaging *a, const AveragingGroup *g, const Identity *id, size_t n_params,
                    const AveragerRing *rings, unsigned n_rings) {
        const ConfigAveraging *ca = g->settings;
        _cleanup_(freep) CollMember *members = NULL;
        AveragerConfig ac;
        NetConfig nc;
        AveragerRing ring = { .group = 1, .len = n_params };
        int r;

        memset(a, 0, sizeof *a);
        if (!ca->enabled)
                return 0;
        averager_config_defaults(&ac);
        r = averaging_coll_config(g, id, n_params, &ac.coll, &nc, &members);
        if (r < 0)
                return r;
        a->self = ac.coll.self;
        for (size_t i = 0; i < ca->n_members && i < AVERAGER_RING_MAX; i++)
                ring.members[ring.n++] = (unsigned)i;
        ac.method = ca->method == CONFIG_AVERAGING_MOSHPIT ? AVERAGER_MOSHPIT : AVERAGER_RING;
        ac.grid = (MoshpitGrid){ .dims = ca->grid_dims, .side = ca->grid_side };
        ac.len = n_params;
        ac.rings = rings ? rings : &ring;
        ac.n_rings = rings ? n_rings : 1;
        ac.interval_ms = ca->interval_ms;
        ac.interval_steps = ca->interval_steps;
        ac.outer = (AveragerOuter){ .enabled = ca->outer, .lr = (float)ca->outer_lr,
                                    .momentum = (float)ca->outer_momentum, .nesterov = ca->outer_nesterov };
        ac.fragments = ca->fragments;
        ac.group_size = ca->group_size;
        ac.error_feedback = ca->error_feedback;
        ac.listen_port = ca->listen.port;
        r = node_listen_patiently(ca->listen.host, ca->listen.port, averager_new_waiting,
                                  &(AveragerNew){ .config = &ac, .ret = &a->av });
        if (r < 0)
                return log_error_errno(r, "Failed to start averaging on %s:%u: %m", ca->listen.host, ca->listen.port);
        r = averager_start(a->av);
        if (r < 0) {
                a->av = averager_free(a->av);
                return log_error_errno(r, "Failed to start the averaging thread: %m");
        }
        a->members = ca->members;
        a->take_parameters = ca->take_parameters;
        a->n_members = (unsigned)ca->n_members;
        a->group_members = a->n_members;
        if (rings && ac.method == AVERAGER_RING) { /* a stage averages with those holding its layers */
                a->group_members = 0;
                for (unsigned i = 0; i < n_rings; i++)
                        a->group_members = MAX(a->group_members, rings[i].n);
        }
        a->join_timeout_ms = ca->join_timeout_ms;
        a->round_timeout_ms = ca->round_timeout_ms;
        a->model = ac.coll.model;
        a->active = true;
        log_started(a, ca);
        return 0;
}

/* Which member's link closed last, and why (the averaging thread redials
 * it): the event a node logs for a peer that left. */
void averaging_log_link_lost(const ConfigMember *members, unsigned n_members, const CollLoss *l, uint64_t since) {
        const ConfigMember *m = l->member < n_members ? &members[l->member] : NULL;
        char hex[IDENTITY_HEX_SIZE] = "?", why[128], more[64] = "", fields[384];
        if (m)
                identity_to_hex(m->id, hex);
        node_close_reason(l->reason, &l->info, why, sizeof why);
        snprintf(fields, sizeof fields, "PEER=%s\nPEER_ADDRESS=%s\nREASON=%s", hex, l->info.address, why);
        if (l->reason == COLL_DROP_REASON) /* dropped by us: coll_ban() */
                snprintf(why + strlen(why), sizeof why - strlen(why), "; refused for %u s",
                         COLL_BAN_MS / 1000);
        if (since > 1)
                snprintf(more, sizeof more, " (%llu links lost since the last line)", (unsigned long long)since);
        log_event(l->reason == 0 ? LOG_INFO : LOG_WARNING, EVENT_PEER_LEFT, fields,
                  "Averaging: the link to member %u at %s closed: %s%s", l->member + 1,
                  l->info.address[0] ? l->info.address : "?", why, more);
}

/* A member gave a round up because its own parameters are not finite (its
 * optimizer diverged): the others average without it until it says READY
 * again or its link goes (a restart from its last good checkpoint). */
static void log_diverged(const Averaging *a, const CollLoss *l) {
        const ConfigMember *m = l->member < a->n_members ? &a->members[l->member] : NULL;
        char hex[IDENTITY_HEX_SIZE] = "?";
        if (m)
                identity_to_hex(m->id, hex);
        log_warning("Averaging: member %u (%s) at %s holds parameters that are not finite (its training "
                    "diverged); the others average without it", l->member + 1, hex,
                    l->info.address[0] ? l->info.address : "?");
}

/* A round this node leads started without a member that is connected but
 * had not said READY in half the join timeout: each such round waited that
 * long for it. Said at once, then at most once a minute. */
static void log_unready(Averaging *a, const CollLoss *u, uint64_t now) {
        char hex[IDENTITY_HEX_SIZE] = "?", more[80] = "";
        if (a->unready_logged_ns && now - a->unready_logged_ns < 60 * NSEC_PER_SEC)
                return;
        if (u->member < a->n_members)
                identity_to_hex(a->members[u->member].id, hex);
        if (u->count - a->unready_logged > 1)
                snprintf(more, sizeof more, " (%llu rounds waited so since the last line)",
                         (unsigned long long)(u->count - a->unready_logged));
        log_warning("Averaging: member %u (%.16s…) at %s is connected but did not say it was ready; the round waited "
                    "%.1f s for it and started without it%s", u->member + 1, hex,
                    u->info.address[0] ? u->info.address : "?", a->join_timeout_ms / 2000.0, more);
        a->unready_logged_ns = now;
        a->unready_logged = u->count;
}

/* A member's link brought another model (its MODEL): both ends refuse
 * each other at once, and say so once per link. */
void averaging_log_foreign(const ConfigMember *members, unsigned n_members, const CollModel *ours,
                           const CollForeign *f, uint64_t since) {
        char hex[IDENTITY_HEX_SIZE] = "?", why[160], more[64] = "";
        if (f->member < n_members)
                identity_to_hex(members[f->member].id, hex);
        averaging_model_why(ours, &f->theirs, why, sizeof why);
        if (since > 1)
                snprintf(more, sizeof more, " (%llu members refused so since the last line)",
                         (unsigned long long)since);
        log_error("Averaging: member %u (%.16s…) trains another model (%s): not averaging with it%s", f->member + 1,
                  hex, why, more);
}

/* A round failed because nobody it could take trains our model: said at
 * once, then at most once a minute (a round fails so at every cadence). */
static void log_foreign_failed(Averaging *a, const AveragerStats *s, uint64_t now) {
        char why[160], more[64] = "";
        a->foreign_failed++;
        if (a->foreign_logged_ns && now - a->foreign_logged_ns < 60 * NSEC_PER_SEC)
                return;
        averaging_model_why(&a->model, &s->foreign.theirs, why, sizeof why);
        if (a->foreign_failed > 1)
                snprintf(more, sizeof more, " (%llu rounds failed so since the last line)",
                         (unsigned long long)a->foreign_failed);
        log_error("Averaging round %lu failed: the members it could average with train another model (member %u: "
                  "%s); this node trains alone, not averaged%s", (unsigned long)(s->rounds_done + s->rounds_failed),
                  s->foreign.member + 1, why, more);
        a->foreign_logged_ns = now;
        a->foreign_failed = 0;
}

/* A connection to the averaging port that closed before it was a
 * member's link, as the node logs one on its own port: who, and why. */
void averaging_log_refused(const CollLoss *l, uint64_t since) {
        char who[IDENTITY_HEX_SIZE + 80] = "", hex[IDENTITY_HEX_SIZE], why[128], more[64] = "", fields[384];
        node_close_reason(l->reason, &l->info, why, sizeof why);
        if (l->info.key_known) {
                identity_to_hex(l->info.key, hex);
                snprintf(who, sizeof who, "%s at ", hex);
        }
        snprintf(fields, sizeof fields, "PEER=%s\nPEER_ADDRESS=%s\nREASON=%s", l->info.key_known ? hex :
                 l->info.address, l->info.address, why);
        if (since > 1)
                snprintf(more, sizeof more, " (%llu since the last line)", (unsigned long long)since);
        log_event(LOG_WARNING, EVENT_AUTH_FAILED, fields, "Averaging: a connection from %s%s was refused or "
                  "failed before it was a member's link: %s%s", who, l->info.address, why, more);
}

/* Rounds that averaged with another member: the first ones, then at most
 * a line every 2 s (frequent rounds would drown the rest of the log). */
static void log_done(Averaging *a, const AveragerStats *s, uint64_t now) {
        uint64_t done = s->rounds_done - s->rounds_alone;
        if (done == a->seen.rounds_done - a->seen.rounds_alone || (done > 3 && now - a->logged_ns < 2 * NSEC_PER_SEC))
                return;
        unsigned long round = (unsigned long)(s->rounds_done + s->rounds_failed);
        uint64_t since = done - a->logged_rounds;
        char fields[128], more[64] = "";
        snprintf(fields, sizeof fields, "ROUND=%lu\nDURATION_USEC=%llu\nPARTICIPANTS=%u", round,
                 (unsigned long long)(s->averaged.duration_ns / 1000), s->averaged.participants);
        if (since > 1)
                snprintf(more, sizeof more, " (%llu rounds since the last line)", (unsigned long long)since);
        log_event(LOG_INFO, EVENT_AVERAGING_ROUND, fields,
                  "Averaging round %lu done: %u of %u members, %.1f MiB sent, %.0f ms%s", round,
                  s->averaged.participants, s->averaged.group,
                  (double)(s->bytes_sent - a->seen.bytes_sent) / (1 << 20), (double)s->averaged.duration_ns / 1e6,
                  more);
        a->logged_ns = now;
        a->logged_rounds = done;
}

/* Rounds no other member took part in: the first, then at most a line
 * every 30 s while they go on. */
static void log_alone(Averaging *a, const AveragerStats *s, uint64_t now) {
        if (s->rounds_alone == a->seen.rounds_alone ||
            (a->alone_logged_ns && now - a->alone_logged_ns < 30 * NSEC_PER_SEC))
                return;
        uint64_t since = s->rounds_alone - a->alone_logged;
        char more[64] = "";
        if (since > 1)
                snprintf(more, sizeof more, " (%llu such rounds since the last line)", (unsigned long long)since);
        log_warning("Averaging round %lu failed: no other of the %u members of its group took part, nothing was "
                    "averaged%s", (unsigned long)(s->rounds_done + s->rounds_failed), s->last_group, more);
        a->alone_logged_ns = now;
        a->alone_logged = s->rounds_alone;
}

/* What the averaging thread did since the last look, in the log. */
static void log_progress(Averaging *a) {
        AveragerStats s;
        averager_get_stats(a->av, &s);
        uint64_t now = now_ns();
        log_done(a, &s, now);
        log_alone(a, &s, now);
        if (s.rounds_done - s.rounds_alone != a->seen.rounds_done - a->seen.rounds_alone)
                a->alone_logged_ns = 0; /* averaging again: the next round alone has a line at once */
        if (s.rounds_failed != a->seen.rounds_failed && s.last_error == -EBADE)
                log_foreign_failed(a, &s, now);
        else if (s.rounds_failed != a->seen.rounds_failed && s.last_error == -ERANGE)
                log_warning("Averaging round %lu sat out: our parameters are not finite (training diverged); the "
                            "others average without us", (unsigned long)(s.rounds_done + s.rounds_failed));
        else if (s.rounds_failed != a->seen.rounds_failed)
                log_warning("Averaging round %lu failed: %s (%u of %u members took part); parameters not averaged "
                            "kept their values",
                            (unsigned long)(s.rounds_done + s.rounds_failed), strerror(-s.last_error),
                            s.last_participants, s.last_group);
        if (s.lost.count != a->seen.lost.count)
                averaging_log_link_lost(a->members, a->n_members, &s.lost, s.lost.count - a->seen.lost.count);
        if (s.diverged.count != a->seen.diverged.count)
                log_diverged(a, &s.diverged);
        if (s.unready.count != a->unready_logged)
                log_unready(a, &s.unready, now);
        if (s.foreign.count != a->seen.foreign.count)
                averaging_log_foreign(a->members, a->n_members, &a->model, &s.foreign,
                                      s.foreign.count - a->seen.foreign.count);
        if (s.refused.count != a->refused_logged && now - a->refused_logged_ns >= 2 * NSEC_PER_SEC) {
                averaging_log_refused(&s.refused, s.refused.count - a->refused_logged); /* a line per 2 s */
                a->refused_logged = s.refused.count;
                a->refused_logged_ns = now;
        }
        if (s.connected != a->seen.connected)
                log_info("Averaging: %u of %u other members connected", s.connected, a->n_members - 1);
        a->seen = s;
}

void averaging_report_network(const Averaging *a, NodeNetwork *n) {
        const AveragerStats *s = &a->seen;
        n->rounds_done = s->rounds_done - s->rounds_alone;
        n->rounds_failed = s->rounds_failed + s->rounds_alone;
        n->last_averaging_usec = s->averaged.realtime_us;
        n->last_round_ns = s->averaged.duration_ns;
        n->last_participants = s->averaged.participants;
        n->last_group = s->averaged.group;
}

void averaging_step(Averaging *a, float *params, uint64_t samples) {
        if (!a->active)
                return;
        averager_sync(a->av, params, samples);
        log_progress(a);
}

void averaging_on_write(Averaging *a, void (*fn)(void *ud), void *ud) {
        if (a->active)
                averager_on_write(a->av, fn, ud);
}

void averaging_serve(Averaging *a, float *params) {
        if (!a->active)
                return;
        averager_serve(a->av, params);
        log_progress(a);
}

void averaging_stop(Averaging *a) {
        a->av = averager_free(a->av);
        a->active = false;
}

/* Serve the averager and the caller's links for ms. */
static void serve_for(Averaging *a, float *params, void (*poll)(void *ud), void *ud, unsigned ms) {
        uint64_t until = now_ns() + (uint64_t)ms * 1000000ull;
        do {
                averaging_serve(a, params);
                if (poll)
                        poll(ud);
                else
                        usleep(1000);
        } while (now_ns() < until);
}

/* One requested round (turn of the last ones), waited for: 0, -ETIMEDOUT,
 * or -EUCLEAN when it failed or went on without some members (how many
 * took part in *ret_participants, of *ret_group). */
static int final_round(Averaging *a, float *params, void (*poll)(void *ud), void *ud, unsigned turn,
                       unsigned *ret_participants, unsigned *ret_group) {
        /* everyone comes to this round when their training ends: wait for
         * the others as long as a round may take */
        AveragerStats before, s;
        averager_get_stats(a->av, &before);
        uint64_t ticket = averager_request(a->av, a->round_timeout_ms, turn);
        uint64_t deadline = now_ns() + (uint64_t)2 * a->round_timeout_ms * 1000000ull + 1000000000ull;
        while (averager_done_ticket(a->av) < ticket && now_ns() < deadline) {
                averaging_serve(a, params);
                if (poll)
                        poll(ud);
        }
        if (averager_done_ticket(a->av) < ticket)
                return -ETIMEDOUT;
        /* The stats' last round is the one the ticket asked for (no other
         * starts before this thread takes a snapshot again); a regular
         * round given up or failed while it waited does not count. */
        averager_get_stats(a->av, &s);
        bool done = s.rounds_done > before.rounds_done && s.last_error == 0;
        *ret_participants = done ? s.last_participants : 1;
        *ret_group = s.last_group;
        return done && s.last_participants >= s.last_group ? 0 : -EUCLEAN;
}

/* The last rounds, one per turn (averager_last_rounds()). A turn that fails
 * or goes on without some members is asked for again, under the same turn,
 * until every member took part or half a round timeout has passed since
 * the first: a member that finished training a moment later, or a regular
 * round of the others' that timed out just then, is still met. */
int averaging_final(Averaging *a, float *params, void (*poll)(void *ud), void *ud) {
        if (!a->active)
                return 0;
        /* a ring wider than one group, or Moshpit: one round per grid dimension */
        unsigned rounds = averager_last_rounds(a->av), participants = 0, group = 0, tries = 0;
        uint64_t start = now_ns(), again_until = start + (uint64_t)a->round_timeout_ms * 1000000ull / 2;
        for (unsigned turn = 0; turn < rounds; turn++)
                for (;;) {
                        int r = final_round(a, params, poll, ud, turn, &participants, &group);
                        tries++;
                        if (r == -ETIMEDOUT) {
                                log_warning("The last averaging round did not finish in time: this replica is "
                                            "evaluated as it is");
                                return r;
                        }
                        if (r == 0)
                                break;
                        if (now_ns() >= again_until) {
                                log_warning("The last averaging round included %u of %u members (%u tries in %.1f "
                                            "s): this replica is evaluated without the others' last updates",
                                            participants, group, tries, (double)(now_ns() - start) / 1e9);
                                return -EUCLEAN;
                        }
                        if (tries == 1)
                                log_info("The last averaging round included %u of %u members: asking again for "
                                         "up to %.1f s", participants, group, (double)(again_until - now_ns()) / 1e9);
                        serve_for(a, params, poll, ud, 200); /* a round that failed at once: not in a loop */
                }
        char again[64] = "";
        if (tries > rounds)
                snprintf(again, sizeof again, ", %u tries in %.1f s", tries, (double)(now_ns() - start) / 1e9);
        if (rounds > 1)
                log_info("The last averaging round included all %u members of its group (the last of %u rounds, one "
                         "per dimension of the grid%s)", group, rounds, again);
        else
                log_info("The last averaging round included all %u members%s", group, again);
        return 0;
}

/* After the join rounds: the moments of the values just taken, from a
 * member of each ring, checked as any moments from another node are. */
static void take_moments(Averaging *a, float *params, void (*poll)(void *ud), void *ud) {
        Optim *o = a->optim;
        unsigned k = optim_moments(o->spec.kind), member = 0;
        uint64_t start = now_ns(), steps = 0;
        const float *in = NULL;
        int r = averager_fetch_state(a->av);
        if (r == 0) /* it ends by itself: each member asked has a round timeout per piece */
                while ((r = averager_fetched_state(a->av, &in, &steps, &member)) == -EINPROGRESS) {
                        averaging_serve(a, params);
                        if (poll)
                                poll(ud);
                }
        for (unsigned i = 0; r == 0 && i < k; i++)
                if (!optim_moment_valid(o->spec.kind, i, in + i * o->n, o->n))
                        r = -EBADMSG;
        if (r < 0) {
                log_warning("Took no optimizer state from the other members (%s): its moments start from %s",
                            r == -EBADMSG ? "moments no optimizer can hold" : strerror(-r),
                            o->t ? "this node's checkpoint" : "zero");
                averager_fetch_done(a->av);
                return;
        }
        memcpy(o->state, in, k * o->n * sizeof(float));
        o->t = steps;
        (void)averager_set_outer_state(a->av, NULL, in + k * o->n); /* -EINVAL: no outer optimizer */
        averager_fetch_done(a->av);
        if (steps == 0) /* its moments are zero: it said so, and sent none */
                log_info("Member %u has taken no optimizer step: the optimizer's moments start from zero", member + 1);
        else
                log_info("Took the optimizer's moments from member %u: %llu steps, %.0f ms", member + 1,
                         (unsigned long long)steps, (double)(now_ns() - start) / 1e6);
}

int averaging_join(Averaging *a, float *params, void (*poll)(void *ud), void *ud) {
        if (!a->active)
                return 0;
        uint64_t start = now_ns();
        uint64_t deadline = start + ((uint64_t)a->join_timeout_ms + 2ull * a->round_timeout_ms) * 1000000ull;
        uint64_t alone = start + MIN((uint64_t)a->join_timeout_ms, AVERAGING_JOIN_ALONE_MS) * 1000000ull;
        unsigned rounds = averager_join(a->av), tries = 1;
        AveragerStats s, before;
        averager_get_stats(a->av, &before);
        for (;;) {
                averager_get_stats(a->av, &s);
                bool over = now_ns() >= deadline;
                if (!averager_joining(a->av)) {
                        /* A round that timed out had nobody to take part: the
                         * others may be in their last rounds, waiting for this
                         * one to train. Only one that failed at once (links
                         * still coming up, another leader's round) is tried again. */
                        if (s.rounds_done - before.rounds_done >= rounds || over || s.last_error == -ETIMEDOUT ||
                            s.last_error == -EBADE) /* the others train another model: nothing to take */
                                break;
                        averager_join(a->av);
                        tries++;
                } else if (over) {
                        averager_join_cancel(a->av); /* a round under way finishes as one */
                        break;
                }
                if (!averager_peers_up(a->av) && s.rounds_done + s.rounds_failed == before.rounds_done +
                    before.rounds_failed && now_ns() > alone) {
                        averager_join_cancel(a->av); /* the first one up: nobody to take from */
                        log_info("No other member of its rings is up: training from this node's own parameters");
                        return 0;
                }
                averaging_serve(a, params);
                if (poll)
                        poll(ud);
        }
        if (s.rounds_done - before.rounds_done < rounds && s.last_error == -EBADE) {
                char why[160] = "";
                averaging_model_why(&a->model, &s.foreign.theirs, why, sizeof why);
                log_error("Took no parameters from the other members: they train another model (member %u: %s); "
                          "training from this node's own", s.foreign.member + 1, why);
                return -EBADE;
        }
        if (s.rounds_done - before.rounds_done < rounds) {
                log_warning("Took no parameters from the other members in %.1f s (%u tries): training from this "
                            "node's own", (double)(now_ns() - start) / 1e9, tries);
                return -ETIMEDOUT;
        }
        log_info("Took the other members' parameters before training: %u round%s, the last of %u of %u members, "
                 "%.0f ms after the start%s",
                 rounds, rounds == 1 ? "" : "s", s.last_participants, s.last_group, (double)(now_ns() - start) / 1e6,
                 tries > 1 ? " (a round failed first)" : "");
        if (a->optim)
                take_moments(a, params, poll, ud);
        return 0;
}

int averaging_outer_state(const Averaging *a, const float **ret_anchor, const float **ret_momentum) {
        return a->active ? averager_outer_state(a->av, ret_anchor, ret_momentum) : -EINVAL;
}

int averaging_set_outer_state(Averaging *a, const float *anchor, const float *momentum) {
        return a->active ? averager_set_outer_state(a->av, anchor, momentum) : -EINVAL;
}

void averaging_begin(Averaging *a, float *params, Optim *o, bool may_take, void (*poll)(void *ud), void *ud) {
        if (!a->active)
                return;
        a->optim = o;
        averager_set_optimizer(a->av, o->state, optim_moments(o->spec.kind), &o->t);
        if (may_take && a->take_parameters)
                (void)averaging_join(a, params, poll, ud);
}
