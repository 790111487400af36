/* service/bus.c */
#include "bus.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/log.h"
#include "util/time-util.h"
#include "util/rss.h"

#define ERROR_NOTHING BUS_INTERFACE ".Error.NothingToCheckpoint"
#define ERROR_BUSY BUS_INTERFACE ".Error.Busy"
#define ERROR_FAILED BUS_INTERFACE ".Error.CheckpointFailed"

/* ---- properties -------------------------------------------------------- */

/* Pipeline and averaging bytes: totals, and per step (sent and received
 * together). */
static int get_traffic(const char *property, const NodeTraffic *t, sd_bus_message *reply) {
        if (!strcmp(property, "PipelineBytesSent"))
                return sd_bus_message_append(reply, "t", t->pipeline_sent);
        if (!strcmp(property, "PipelineBytesReceived"))
                return sd_bus_message_append(reply, "t", t->pipeline_received);
        if (!strcmp(property, "PipelineBytesPerStep"))
                return sd_bus_message_append(reply, "t",
                                             node_traffic_per_step(t->pipeline_sent, t->pipeline_received, t->steps));
        if (!strcmp(property, "AveragingBytesSent"))
                return sd_bus_message_append(reply, "t", t->averaging_sent);
        if (!strcmp(property, "AveragingBytesReceived"))
                return sd_bus_message_append(reply, "t", t->averaging_received);
        if (!strcmp(property, "AveragingBytesPerStep"))
                return sd_bus_message_append(reply, "t",
                                             node_traffic_per_step(t->averaging_sent, t->averaging_received, t->steps));
        return -ENOENT;
}

static int get_property(sd_bus *bus, const char *path, const char *interface, const char *property,
                        sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Bus *b = userdata;
        NodeState state;
        NodeStatus st;
        char reason[128];
        (void)bus, (void)path, (void)interface, (void)error;

        control_snapshot(b->control, &state, &st, reason, NULL, NULL);
        if (!strcmp(property, "State"))
                return sd_bus_message_append(reply, "s", node_state_to_string(state));
        if (!strcmp(property, "PauseReason"))
                return sd_bus_message_append(reply, "s", reason);
        if (!strcmp(property, "WaitingFor"))
                return sd_bus_message_append(reply, "s", st.training.waiting_for);
        if (!strcmp(property, "ReloadError"))
                return sd_bus_message_append(reply, "s", st.reload_error);
        if (!strcmp(property, "Role"))
                return sd_bus_message_append(reply, "s", st.training.role);
        if (!strcmp(property, "Job"))
                return sd_bus_message_append(reply, "s", st.training.job);
        if (!strcmp(property, "ClusterId"))
                return sd_bus_message_append(reply, "i", st.training.cluster);
        if (!strcmp(property, "Stage"))
                return sd_bus_message_append(reply, "i", st.training.stage);
        if (!strcmp(property, "Epoch"))
                return sd_bus_message_append(reply, "i", st.training.epoch);
        if (!strcmp(property, "Epochs"))
                return sd_bus_message_append(reply, "i", st.training.epochs);
        if (!strcmp(property, "Step"))
                return sd_bus_message_append(reply, "t", st.training.step);
        if (!strcmp(property, "Loss"))
                return sd_bus_message_append(reply, "d", st.training.loss);
        if (!strcmp(property, "SamplesPerSecond"))
                return sd_bus_message_append(reply, "d", st.training.samples_per_sec);
        if (!strcmp(property, "Busy"))
                return sd_bus_message_append(reply, "d", st.training.busy);
        if (!strcmp(property, "TestAccuracy"))
                return sd_bus_message_append(reply, "d", st.training.test_accuracy);
        if (!strcmp(property, "TestLoss"))
                return sd_bus_message_append(reply, "d", st.training.test_loss);
        if (!strcmp(property, "Peers"))
                return sd_bus_message_append(reply, "u", st.network.peers);
        if (!strcmp(property, "PausedPeers"))
                return sd_bus_message_append(reply, "u", st.network.paused_peers);
        if (!strcmp(property, "BytesSent"))
                return sd_bus_message_append(reply, "t", st.network.bytes_sent);
        if (!strcmp(property, "BytesReceived"))
                return sd_bus_message_append(reply, "t", st.network.bytes_received);
        if (!strcmp(property, "LastAveragingUSec"))
                return sd_bus_message_append(reply, "t", st.network.last_averaging_usec);
        if (!strcmp(property, "AveragingRounds"))
                return sd_bus_message_append(reply, "t", st.network.rounds_done);
        if (!strcmp(property, "AveragingRoundsFailed"))
                return sd_bus_message_append(reply, "t", st.network.rounds_failed);
        if (!strcmp(property, "LastAveragingParticipants"))
                return sd_bus_message_append(reply, "u", st.network.last_participants);
        if (!strcmp(property, "LastAveragingGroup"))
                return sd_bus_message_append(reply, "u", st.network.last_group);
        if (!strcmp(property, "MemoryRSS")) {
                uint64_t rss = 0;
                (void)rss_self_bytes(&rss); /* 0: not known */
                return sd_bus_message_append(reply, "t", rss);
        }
        if (!strcmp(property, "CheckpointStep"))
                return sd_bus_message_append(reply, "t", st.checkpoint_step);
        if (!strcmp(property, "CheckpointUSec"))
                return sd_bus_message_append(reply, "t", st.checkpoint_usec);
        if (!strcmp(property, "PlanEpoch"))
                return sd_bus_message_append(reply, "t", st.plan_epoch);
        if (!strcmp(property, "IoBackend"))
                return sd_bus_message_append(reply, "s", st.network.io_backend);
        if (!strcmp(property, "Reachability"))
                return sd_bus_message_append(reply, "s", st.network.reachability);
        if (!strcmp(property, "AveragingMethod"))
                return sd_bus_message_append(reply, "s", st.averaging.method);
        if (!strcmp(property, "AveragingNodes"))
                return sd_bus_message_append(reply, "u", st.averaging.nodes);
        if (!strcmp(property, "Parameters"))
                return sd_bus_message_append(reply, "t", st.averaging.params);
        if (!strcmp(property, "ComputeMsPerStep"))
                return sd_bus_message_append(reply, "d", st.averaging.compute_ms);
        if (!strcmp(property, "ComputeSdMs"))
                return sd_bus_message_append(reply, "d", st.averaging.compute_sd_ms);
        if (!strcmp(property, "BandwidthMbit"))
                return sd_bus_message_append(reply, "d", st.averaging.bandwidth_mbit);
        if (!strcmp(property, "LatencyMs"))
                return sd_bus_message_append(reply, "d", st.averaging.latency_ms);
        if (!strcmp(property, "CoresPerNode"))
                return sd_bus_message_append(reply, "d", st.averaging.cores);
        return get_traffic(property, &st.network.traffic, reply);
}

static int get_version(sd_bus *bus, const char *path, const char *interface, const char *property,
                       sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        (void)bus, (void)path, (void)interface, (void)property, (void)userdata, (void)error;
        return sd_bus_message_append(reply, "s", RAVNEST_VERSION);
}

/* ---- methods ----------------------------------------------------------- */

/* Who sent m: the system bus says; on the control socket, the socket said
 * when the client connected (sd-bus reads the client's messages from a
 * pipe, which has no credentials: BusClient). */
static int sender_uid(Bus *b, sd_bus_message *m, uid_t *ret) {
        _cleanup_(sd_bus_creds_unrefp) sd_bus_creds *creds = NULL;
        sd_bus *bus = sd_bus_message_get_bus(m);
        int r;

        for (size_t i = 0; i < BUS_MAX_DIRECT; i++)
                if (b->direct[i] && b->direct[i]->bus == bus) {
                        *ret = b->direct[i]->uid;
                        return 0;
                }
        if (!bus || bus != b->system)
                return -ESRCH;
        r = sd_bus_query_sender_creds(m, SD_BUS_CREDS_EUID, &creds);
        if (r >= 0)
                r = sd_bus_creds_get_euid(creds, ret);
        return r;
}

/* Refusals any local user can ask for as fast as it likes: a burst per
 * uid, then a summary. */
static LogRatelimit refusal_lines = LOG_RATELIMIT_INIT("Refused calls from");

/* Whether a line about what uid asked for may be written: by its uid. */
static bool uid_line_ok(LogRatelimit *rl, int level, uid_t uid) {
        char key[32];
        snprintf(key, sizeof key, "uid %u", (unsigned)uid);
        return log_ratelimit(rl, level, key);
}

/* Root and the daemon's own user; the bus policy says the same. Logs who
 * asked, so a pause and resume between two steps leave a trace too. */
static int check_privileged(Bus *b, sd_bus_message *m, const char *what, sd_bus_error *error) {
        uid_t uid;
        int r;

        r = sender_uid(b, m, &uid);
        if (r < 0)
                return sd_bus_error_set_errnof(error, -r, "Cannot tell who is calling: %s", strerror(-r));
        if (uid != 0 && uid != b->self_uid) {
                /* under the unit's PrivateUsers=, every other user is seen as the overflow uid */
                if (uid_line_ok(&refusal_lines, LOG_NOTICE, uid))
                        log_notice("Refused %s from uid %u%s: only root and uid %u (this daemon's user) may", what,
                                   (unsigned)uid,
                                   uid == 65534 ? " (or a user the service's sandbox shows as nobody)" : "",
                                   (unsigned)b->self_uid);
                return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                                         "Only root and the daemon's own user may %s this node", what);
        }
        log_info("%c%s requested by uid %u", what[0] - 32, what + 1, (unsigned)uid);
        return 0;
}

static int method_pause(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        Bus *b = userdata;
        int r = check_privileged(b, m, "pause", error);
        if (r < 0)
                return r;
        control_set_pause(b->control, CONTROL_PAUSE_OPERATOR, true, NULL);
        bus_state_changed(b);
        return sd_bus_reply_method_return(m, NULL);
}

static int method_resume(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        Bus *b = userdata;
        int r = check_privileged(b, m, "resume", error);
        if (r < 0)
                return r;
        control_set_pause(b->control, CONTROL_PAUSE_OPERATOR, false, NULL);
        bus_state_changed(b);
        return sd_bus_reply_method_return(m, NULL);
}

static int method_checkpoint(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        Bus *b = userdata;
        NodeState state;
        int r = check_privileged(b, m, "checkpoint", error);
        if (r < 0)
                return r;
        control_snapshot(b->control, &state, NULL, NULL, NULL, NULL);
        if (state != NODE_TRAINING && state != NODE_PAUSED)
                return sd_bus_error_setf(error, ERROR_NOTHING, "Nothing to checkpoint: the node is %s",
                                         node_state_to_string(state));
        for (size_t i = 0; i < BUS_MAX_PENDING; i++)
                if (!b->pending[i]) {
                        b->pending[i] = sd_bus_message_ref(m);
                        b->pending_ticket[i] = control_request_checkpoint(b->control);
                        return 1; /* answered by bus_state_changed() */
                }
        return sd_bus_error_setf(error, ERROR_BUSY, "Too many checkpoint requests waiting");
}

static const sd_bus_vtable node_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Version", "s", get_version, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("State", "s", get_property, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("PauseReason", "s", get_property, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Role", "s", get_property, 0, 0),
        SD_BUS_PROPERTY("Job", "s", get_property, 0, 0),
        SD_BUS_PROPERTY("ClusterId", "i", get_property, 0, 0),
        SD_BUS_PROPERTY("Stage", "i", get_property, 0, 0),
        SD_BUS_PROPERTY("Epoch", "i", get_property, 0, 0),
        SD_BUS_PROPERTY("Epochs", "i", get_property, 0, 0),
        SD_BUS_PROPERTY("Step", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("Loss", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("SamplesPerSecond", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("Busy", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("WaitingFor", "s", get_property, 0, 0),
        SD_BUS_PROPERTY("ReloadError", "s", get_property, 0, 0),
        SD_BUS_PROPERTY("TestAccuracy", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("TestLoss", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("Peers", "u", get_property, 0, 0),
        SD_BUS_PROPERTY("PausedPeers", "u", get_property, 0, 0),
        SD_BUS_PROPERTY("BytesSent", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("BytesReceived", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("PipelineBytesSent", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("PipelineBytesReceived", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("PipelineBytesPerStep", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("AveragingBytesSent", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("AveragingBytesReceived", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("AveragingBytesPerStep", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("LastAveragingUSec", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("AveragingRounds", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("AveragingRoundsFailed", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("LastAveragingParticipants", "u", get_property, 0, 0),
        SD_BUS_PROPERTY("LastAveragingGroup", "u", get_property, 0, 0),
        SD_BUS_PROPERTY("MemoryRSS", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("CheckpointStep", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("CheckpointUSec", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("PlanEpoch", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("IoBackend", "s", get_property, 0, 0),
        SD_BUS_PROPERTY("Reachability", "s", get_property, 0, 0),
        SD_BUS_PROPERTY("AveragingMethod", "s", get_property, 0, 0),
        SD_BUS_PROPERTY("AveragingNodes", "u", get_property, 0, 0),
        SD_BUS_PROPERTY("Parameters", "t", get_property, 0, 0),
        SD_BUS_PROPERTY("ComputeMsPerStep", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("ComputeSdMs", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("BandwidthMbit", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("LatencyMs", "d", get_property, 0, 0),
        SD_BUS_PROPERTY("CoresPerNode", "d", get_property, 0, 0),
        /* Unprivileged at the sd-bus level: check_privileged() and the bus
         * policy decide, so the daemon's own user may call them too. */
        SD_BUS_METHOD("Pause", "", "", method_pause, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("Resume", "", "", method_resume, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_NAMES("Checkpoint", "", , "t", SD_BUS_PARAM(step), method_checkpoint,
                                 SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};

/* ---- connections ------------------------------------------------------- */

static int serve_object(Bus *b, sd_bus *bus) {
        int r = sd_bus_add_object_vtable(bus, NULL, BUS_PATH, BUS_INTERFACE, node_vtable, b);
        if (r >= 0)
                r = sd_bus_attach_event(bus, b->event, SD_EVENT_PRIORITY_NORMAL);
        return r;
}

static BusClient *client_free(BusClient *c) {
        if (!c)
                return NULL;
        sd_event_source_disable_unref(c->in);
        sd_event_source_disable_unref(c->out);
        if (c->fd >= 0)
                close(c->fd);
        if (c->pipe >= 0)
                close(c->pipe);
        sd_bus_close_unref(c->bus); /* No flush: a client that does not read would hold the loop in it. */
        free(c);
        return NULL;
}

static void drop_client(Bus *b, size_t i) {
        b->direct[i] = client_free(b->direct[i]);
}

/* After every event the loop dispatched: a client whose call came in the
 * same read as its authentication has it still in sd-bus's buffer, with
 * nothing left on the socket to wake the loop; a client gone or refused is
 * freed; and one that leaves more than BUS_MAX_QUEUED replies unread is
 * dropped, so that it cannot grow the daemon's memory. */
static int on_post(sd_event_source *s, void *userdata) {
        Bus *b = userdata;
        (void)s;
        for (size_t i = 0; i < BUS_MAX_DIRECT; i++) {
                BusClient *c = b->direct[i];
                uint64_t queued = 0;
                if (!c)
                        continue;
                for (int k = 0; k < 16 && !c->refused && sd_bus_process(c->bus, NULL) > 0; k++)
                        ;
                if (c->refused || sd_bus_is_open(c->bus) <= 0 ||
                    (sd_bus_get_n_queued_write(c->bus, &queued) >= 0 && queued > BUS_MAX_QUEUED))
                        drop_client(b, i);
        }
        return 0;
}

/* A message's size from its fixed header (the D-Bus specification,
 * "Message Format"): 16 bytes (the byte order, type, flags, version, the
 * body's length, the serial, the header fields' length), the header
 * fields padded to 8, the body. */
static int message_size(const uint8_t header[16], uint64_t *ret) {
        uint32_t body, fields;
        memcpy(&body, header + 4, sizeof body);
        memcpy(&fields, header + 12, sizeof fields);
        if (header[0] == 'l') {
                body = le32toh(body);
                fields = le32toh(fields);
        } else if (header[0] == 'B') {
                body = be32toh(body);
                fields = be32toh(fields);
        } else
                return -EBADMSG;
        *ret = 16 + ALIGN_TO((uint64_t)fields, 8) + body;
        return 0;
}

/* What of c->buf may pass on to sd-bus: an authentication line, or a
 * message's header once it announces at most BUS_MAX_MESSAGE bytes, then
 * the rest of the message. 1: c->ready set; 0: more bytes first;
 * -EMSGSIZE: a message too large (its size in *ret_size); -EBADMSG: not a
 * D-Bus message. */
static int relay_check(BusClient *c, uint64_t *ret_size) {
        if (!c->authenticated) {
                const uint8_t *end = memmem(c->buf, c->n, "\r\n", 2);
                if (!end)
                        return 0;
                size_t len = (size_t)(end - c->buf), skip = 0;
                if (c->lines++ == 0 && len > 0 && c->buf[0] == 0)
                        skip = 1; /* as sd-bus reads it: the NUL that opens the first line is not part of it */
                c->authenticated = len - skip == 5 && !memcmp(c->buf + skip, "BEGIN", 5);
                c->ready = len + 2;
                return 1;
        }
        if (c->left == 0) {
                if (c->n < 16)
                        return 0;
                int r = message_size(c->buf, &c->left);
                if (r < 0)
                        return r;
                if (c->left > BUS_MAX_MESSAGE) {
                        *ret_size = c->left;
                        return -EMSGSIZE;
                }
        }
        c->ready = (size_t)MIN((uint64_t)c->n, c->left);
        c->left -= c->ready;
        return c->ready > 0;
}

/* Pass on to sd-bus what the client sent, as far as it checks. 0: waits
 * for the client, or for sd-bus to read the pipe; -ECONNRESET: the client
 * closed; -EMSGSIZE, -EBADMSG: relay_check() refused it (*ret_size). */
static int relay(BusClient *c, uint64_t *ret_size) {
        for (;;) {
                while (c->ready > 0) {
                        ssize_t k = write(c->pipe, c->buf, c->ready);
                        if (k < 0 && errno == EAGAIN) { /* sd-bus reads on: c->out says when */
                                sd_event_source_set_enabled(c->in, SD_EVENT_OFF);
                                sd_event_source_set_enabled(c->out, SD_EVENT_ONESHOT);
                                return 0;
                        }
                        if (k < 0)
                                return -errno;
                        memmove(c->buf, c->buf + k, c->n - (size_t)k);
                        c->n -= (size_t)k;
                        c->ready -= (size_t)k;
                }
                int r = relay_check(c, ret_size);
                if (r < 0)
                        return r;
                if (r > 0)
                        continue;
                if (c->n == sizeof c->buf) /* an authentication line that long */
                        return -EBADMSG;
                ssize_t k = recv(c->fd, c->buf + c->n, sizeof c->buf - c->n, MSG_DONTWAIT);
                if (k == 0)
                        return -ECONNRESET;
                if (k < 0)
                        return errno == EAGAIN || errno == EINTR ? 0 : -errno;
                c->n += (size_t)k;
        }
}

/* Drops any local user can ask for as fast as it likes: a burst per uid,
 * then a summary. */
static LogRatelimit drop_lines = LOG_RATELIMIT_INIT("Dropped control clients of");

/* The client's socket is readable (or the pipe writable again). */
static void relay_input(BusClient *c) {
        uint64_t size = 0;
        int r = relay(c, &size);
        if (r >= 0)
                return;
        sd_event_source_set_enabled(c->in, SD_EVENT_OFF);
        if (r != -EMSGSIZE && r != -EBADMSG) { /* gone: sd-bus reads what came before, then the end */
                c->out = sd_event_source_disable_unref(c->out);
                if (c->pipe >= 0)
                        close(c->pipe);
                c->pipe = -1;
                return;
        }
        c->refused = true;
        if (!uid_line_ok(&drop_lines, r == -EBADMSG ? LOG_NOTICE : LOG_WARNING, c->uid))
                return;
        if (r == -EBADMSG)
                log_notice("Dropped a control client of uid %u: it does not speak D-Bus", (unsigned)c->uid);
        else
                log_warning("Dropped a control client of uid %u: it announced a message of %llu bytes, and the "
                            "control socket takes %u at most", (unsigned)c->uid, (unsigned long long)size,
                            BUS_MAX_MESSAGE);
}

static int on_client_input(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        (void)s, (void)fd, (void)revents;
        relay_input(userdata);
        return 0;
}

/* The pipe took what sd-bus read: back to the client's socket. */
static int on_pipe_writable(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        BusClient *c = userdata;
        (void)s, (void)fd, (void)revents;
        sd_event_source_set_enabled(c->in, SD_EVENT_ON);
        relay_input(c);
        return 0;
}

static bool privileged_uid(const Bus *b, uid_t uid) {
        return uid == 0 || uid == b->self_uid;
}

/* A slot for a client of uid: a free one; none for a user that holds
 * BUS_MAX_DIRECT_PER_USER already; when all are taken, root and the
 * daemon's user take one from another user's client. */
static int client_slot(Bus *b, uid_t uid) {
        size_t free_slot = BUS_MAX_DIRECT, theirs = 0, other = BUS_MAX_DIRECT;
        for (size_t i = 0; i < BUS_MAX_DIRECT; i++) {
                if (!b->direct[i])
                        free_slot = MIN(free_slot, i);
                else if (b->direct[i]->uid == uid)
                        theirs++;
                else if (!privileged_uid(b, b->direct[i]->uid))
                        other = i;
        }
        if (!privileged_uid(b, uid) && theirs >= BUS_MAX_DIRECT_PER_USER)
                return -EUSERS;
        if (free_slot < BUS_MAX_DIRECT)
                return (int)free_slot;
        if (!privileged_uid(b, uid) || other == BUS_MAX_DIRECT)
                return -EUSERS;
        drop_client(b, other);
        return (int)other;
}

/* A new client on its socket cfd (taken over): sd-bus reads the pipe the
 * relay writes, and writes to the socket. */
static int client_new(Bus *b, int cfd, uid_t uid, BusClient **ret) {
        _cleanup_(closep) int fd = cfd;
        sd_id128_t id;
        int p[2], r;

        BusClient *c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->uid = uid;
        c->fd = c->pipe = -1;
        if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) {
                free(c);
                return -errno;
        }
        c->pipe = p[1];
        r = sd_bus_new(&c->bus);
        if (r >= 0)
                r = sd_bus_set_fd(c->bus, p[0], fd);
        if (r < 0) {
                close(p[0]);
                client_free(c);
                return r;
        }
        TAKE_FD(fd); /* sd-bus's now, and p[0] */
        c->fd = fcntl(cfd, F_DUPFD_CLOEXEC, 3);
        if (c->fd < 0)
                r = -errno;
        /* who calls is c->uid (sender_uid()), whatever the client says it is */
        if (r < 0 || (r = sd_id128_randomize(&id)) < 0 || (r = sd_bus_set_server(c->bus, 1, id)) < 0 ||
            (r = sd_bus_set_anonymous(c->bus, 1)) < 0 || (r = sd_bus_start(c->bus)) < 0 ||
            (r = serve_object(b, c->bus)) < 0 ||
            (r = sd_event_add_io(b->event, &c->in, c->fd, EPOLLIN, on_client_input, c)) < 0 ||
            (r = sd_event_add_io(b->event, &c->out, c->pipe, EPOLLOUT, on_pipe_writable, c)) < 0 ||
            (r = sd_event_source_set_enabled(c->out, SD_EVENT_OFF)) < 0) {
                client_free(c);
                return r;
        }
        *ret = c;
        return 0;
}

static int on_client(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Bus *b = userdata;
        struct ucred cred;
        socklen_t len = sizeof cred;
        int cfd, r, slot;
        (void)s, (void)revents;

        cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (cfd < 0)
                return 0;
        if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                close(cfd);
                return 0;
        }
        if ((slot = client_slot(b, cred.uid)) < 0) {
                if (uid_line_ok(&drop_lines, LOG_NOTICE, cred.uid))
                        log_notice("Refused a control client of uid %u: no place (%u per user, %u in all)",
                                   (unsigned)cred.uid, (unsigned)BUS_MAX_DIRECT_PER_USER, (unsigned)BUS_MAX_DIRECT);
                close(cfd);
                return 0;
        }
        r = client_new(b, cfd, cred.uid, &b->direct[slot]);
        if (r < 0)
                log_debug("Control client dropped: %s", strerror(-r));
        else
                relay_input(b->direct[slot]); /* what it sent with its connection */
        return 0;
}

static int listen_socket(Bus *b, const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd, r;

        if (strlen(path) >= sizeof sa.sun_path || strlen(path) >= sizeof b->socket_path)
                return -ENAMETOOLONG;
        strcpy(sa.sun_path, path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        /* never take the socket of a node that is alive */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
                close(probe);
                close(fd);
                return -EADDRINUSE;
        }
        if (probe >= 0)
                close(probe);
        /* what is left there is removed only if it is a socket (a node's that
         * stopped): a file or directory at a mistyped path is somebody's */
        struct stat st;
        if (lstat(path, &st) == 0) {
                if (!S_ISSOCK(st.st_mode)) {
                        close(fd);
                        return -ENOTSOCK;
                }
                (void)unlink(path);
        }
        /* readable by everyone; methods check the caller themselves */
        mode_t old = umask(0111);
        r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
        umask(old);
        if (r < 0 || listen(fd, 16) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        b->listen_fd = fd;
        strcpy(b->socket_path, path);
        if (lstat(path, &st) == 0) {
                b->socket_dev = st.st_dev;
                b->socket_ino = st.st_ino;
        }
        r = sd_event_add_io(b->event, &b->listen_source, fd, EPOLLIN, on_client, b);
        if (r >= 0)
                r = sd_event_add_post(b->event, &b->post_source, on_post, b);
        return r;
}

int bus_start(Bus *b, sd_event *e, Control *c, const char *socket_path, bool want_system) {
        int r;

        *b = (Bus){ .control = c, .event = sd_event_ref(e), .listen_fd = -1, .self_uid = geteuid(),
                    .last_state = _NODE_STATE_MAX };
        if (socket_path) {
                r = listen_socket(b, socket_path);
                if (r == -EADDRINUSE)
                        log_warning("Another ravnestd serves %s: no control socket for this one (set "
                                    "control_socket)", socket_path);
                else if (r == -ENOTSOCK)
                        log_warning("No control socket: %s is there and is not a socket (ravnestd replaces only "
                                    "a socket left by a node that stopped): status and control on the system bus "
                                    "only", socket_path);
                else if (r < 0)
                        log_warning_errno(r, "No control socket %s (%m): status and control on the system bus only",
                                          socket_path);
        }
        if (!want_system)
                return 0;
        r = sd_bus_open_system_with_description(&b->system, "ravnestd");
        if (r >= 0)
                r = serve_object(b, b->system);
        if (r < 0) {
                if (b->listen_fd >= 0)
                        log_warning_errno(r, "No system bus (%m): status and control on %s only", b->socket_path);
                else
                        log_warning_errno(r, "No system bus (%m) and no control socket: no status, no control");
                b->system = sd_bus_flush_close_unref(b->system);
                return 0;
        }
        r = sd_bus_request_name(b->system, BUS_NAME, 0);
        if (r < 0) {
                /* Another node on this machine, or a policy that does not
                 * let this user own the name: the socket still answers. */
                log_warning_errno(r, "Cannot own %s on the system bus (%m): is another ravnestd running, "
                                  "and is the D-Bus policy installed? %s%s",
                                  BUS_NAME, b->listen_fd >= 0 ? "Status and control on the socket only: " : "",
                                  b->listen_fd >= 0 ? b->socket_path : "No status, no control: no control socket");
                b->system = sd_bus_flush_close_unref(b->system);
                return 0;
        }
        b->name_acquired = true;
        log_info("D-Bus: %s on the system bus", BUS_NAME);
        return 0;
}

static void emit_changed(Bus *b) {
        if (b->system)
                (void)sd_bus_emit_properties_changed(b->system, BUS_PATH, BUS_INTERFACE, "State", "PauseReason",
                                                     NULL);
        for (size_t i = 0; i < BUS_MAX_DIRECT; i++)
                if (b->direct[i])
                        (void)sd_bus_emit_properties_changed(b->direct[i]->bus, BUS_PATH, BUS_INTERFACE, "State",
                                                             "PauseReason", NULL);
}

void bus_state_changed(Bus *b) {
        NodeState state;
        char reason[128];
        uint64_t done;
        int err;

        control_snapshot(b->control, &state, NULL, reason, &done, &err);
        if (state != b->last_state || strcmp(reason, b->last_reason)) {
                b->last_state = state;
                memcpy(b->last_reason, reason, sizeof reason);
                emit_changed(b);
        }
        NodeStatus st;
        control_snapshot(b->control, NULL, &st, NULL, NULL, NULL);
        for (size_t i = 0; i < BUS_MAX_PENDING; i++) {
                sd_bus_message *m = b->pending[i];
                if (!m)
                        continue;
                bool gone = state != NODE_TRAINING && state != NODE_PAUSED && state != NODE_STARTING;
                if (b->pending_ticket[i] > done && !gone)
                        continue;
                if (b->pending_ticket[i] > done)
                        (void)sd_bus_reply_method_errorf(m, ERROR_NOTHING, "The node stopped training (%s)",
                                                         node_state_to_string(state));
                else if (err == -EOPNOTSUPP) /* what the run says when it has nowhere to write */
                        (void)sd_bus_reply_method_errorf(m, ERROR_FAILED, "Writing the checkpoint failed: a run "
                                                         "without a configuration file has no state directory to "
                                                         "write to (start it with --config)");
                else if (err < 0)
                        (void)sd_bus_reply_method_errorf(m, ERROR_FAILED, "Writing the checkpoint failed: %s",
                                                         strerror(-err));
                else
                        (void)sd_bus_reply_method_return(m, "t", st.checkpoint_step);
                b->pending[i] = sd_bus_message_unref(m);
        }
}

void bus_stop(Bus *b) {
        for (size_t i = 0; i < BUS_MAX_PENDING; i++)
                if (b->pending[i]) {
                        (void)sd_bus_reply_method_errorf(b->pending[i], ERROR_NOTHING, "The node is stopping");
                        b->pending[i] = sd_bus_message_unref(b->pending[i]);
                }
        for (size_t i = 0; i < BUS_MAX_DIRECT; i++)
                if (b->direct[i])
                        drop_client(b, i);
        if (b->system && b->name_acquired)
                (void)sd_bus_release_name(b->system, BUS_NAME);
        b->system = sd_bus_flush_close_unref(b->system);
        b->listen_source = sd_event_source_disable_unref(b->listen_source);
        b->post_source = sd_event_source_disable_unref(b->post_source);
        if (b->listen_fd >= 0) {
                close(b->listen_fd);
                struct stat st; /* ours still, not whatever took its place */
                if (lstat(b->socket_path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == b->socket_dev &&
                    st.st_ino == b->socket_ino)
                        (void)unlink(b->socket_path);
        }
        b->listen_fd = -1;
        b->event = sd_event_unref(b->event);
}

/* ---- client ------------------------------------------------------------ */

/* Until the socket's server has answered the authentication: sd-bus would
 * wait 90 s for one that accepts and never answers (a node whose loop is
 * stuck), where a client wants to say so within seconds. */
static int wait_ready(sd_bus *bus, uint64_t timeout_usec) {
        uint64_t end = now_ns() / 1000 + timeout_usec;
        int r;
        while ((r = sd_bus_is_ready(bus)) == 0) {
                if ((r = sd_bus_process(bus, NULL)) < 0)
                        return r;
                if (r > 0)
                        continue;
                uint64_t now = now_ns() / 1000;
                if (now >= end)
                        return -ETIMEDOUT;
                if ((r = sd_bus_wait(bus, end - now)) < 0)
                        return r;
        }
        return r < 0 ? r : 0;
}

int bus_connect_node(const char *socket_path, bool only_socket, sd_bus **ret, bool *ret_direct) {
        sd_bus *bus = NULL;
        int r;

        if (!only_socket && sd_bus_open_system(&bus) >= 0) {
                r = sd_bus_get_name_creds(bus, BUS_NAME, 0, NULL);
                if (r >= 0) {
                        *ret = bus;
                        *ret_direct = false;
                        return 0;
                }
                bus = sd_bus_flush_close_unref(bus);
        }
        char address[PATH_MAX + 16];
        if (strlen(socket_path) >= PATH_MAX)
                return -ENAMETOOLONG;
        snprintf(address, sizeof address, "unix:path=%s", socket_path);
        if ((r = sd_bus_new(&bus)) < 0)
                return r;
        if ((r = sd_bus_set_address(bus, address)) < 0 || (r = sd_bus_start(bus)) < 0 ||
            (r = wait_ready(bus, BUS_CONNECT_TIMEOUT_USEC)) < 0) {
                sd_bus_close_unref(bus); /* no flush: it would wait for the server again */
                return r;
        }
        *ret = bus;
        *ret_direct = true;
        return 0;
}
