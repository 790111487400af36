/* ctl/ctl-node.c — ravnestctl status|pause|resume|checkpoint: the node's
 * D-Bus object, on the system bus or its direct socket. */
#include "ctl-node.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <time.h>

#include "conf/config.h"
#include "ctl-common.h"
#include "service/bus.h"
#include "util/format.h"
#include "util/json.h"

typedef struct Property {
        char name[32];
        char type; /* s, i, u, t, d */
        char s[256];
        long long i;
        unsigned long long u;
        double d;
} Property;

#define MAX_PROPERTIES 64

static int read_all(sd_bus *bus, bool direct, Property *props, size_t *ret_n, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        size_t n = 0;
        int r;

        r = sd_bus_call_method(bus, direct ? NULL : BUS_NAME, BUS_PATH, "org.freedesktop.DBus.Properties", "GetAll",
                               error, &reply, "s", BUS_INTERFACE);
        if (r < 0)
                return r;
        if ((r = sd_bus_message_enter_container(reply, 'a', "{sv}")) < 0)
                return r;
        while ((r = sd_bus_message_enter_container(reply, 'e', "sv")) > 0) {
                const char *name, *contents;
                char type;
                if ((r = sd_bus_message_read(reply, "s", &name)) < 0 ||
                    (r = sd_bus_message_peek_type(reply, &type, &contents)) < 0)
                        return r;
                Property *p = n < MAX_PROPERTIES ? &props[n] : NULL;
                if (p && strlen(name) < sizeof p->name && contents && strlen(contents) == 1 &&
                    strchr("siutd", contents[0])) {
                        const char *s;
                        int32_t i;
                        uint32_t u;
                        uint64_t t;
                        snprintf(p->name, sizeof p->name, "%s", name);
                        p->type = contents[0];
                        switch (p->type) {
                        case 's':
                                r = sd_bus_message_read(reply, "v", "s", &s);
                                if (r >= 0)
                                        snprintf(p->s, sizeof p->s, "%s", s);
                                break;
                        case 'i':
                                r = sd_bus_message_read(reply, "v", "i", &i);
                                p->i = i;
                                break;
                        case 'u':
                                r = sd_bus_message_read(reply, "v", "u", &u);
                                p->u = u;
                                break;
                        case 't':
                                r = sd_bus_message_read(reply, "v", "t", &t);
                                p->u = t;
                                break;
                        default:
                                r = sd_bus_message_read(reply, "v", "d", &p->d);
                        }
                        if (r < 0)
                                return r;
                        n++;
                } else if ((r = sd_bus_message_skip(reply, "v")) < 0)
                        return r;
                if ((r = sd_bus_message_exit_container(reply)) < 0)
                        return r;
        }
        if (r < 0)
                return r;
        *ret_n = n;
        return 0;
}

static const Property *find(const Property *props, size_t n, const char *name) {
        for (size_t i = 0; i < n; i++)
                if (!strcmp(props[i].name, name))
                        return &props[i];
        return NULL;
}

static const char *str(const Property *props, size_t n, const char *name) {
        const Property *p = find(props, n, name);
        return p && p->type == 's' ? p->s : "";
}

static double num(const Property *props, size_t n, const char *name) {
        const Property *p = find(props, n, name);
        if (!p)
                return 0;
        return p->type == 'i' ? (double)p->i : p->type == 'd' ? p->d : (double)p->u;
}

static void print_json(const Property *props, size_t n) {
        printf("{");
        for (size_t i = 0; i < n; i++) {
                const Property *p = &props[i];
                printf("%s", i ? ", " : "");
                json_print_string(stdout, p->name);
                printf(": ");
                switch (p->type) {
                case 's':
                        json_print_string(stdout, p->s);
                        break;
                case 'i':
                        printf("%lld", p->i);
                        break;
                case 'd':
                        printf("%.17g", p->d);
                        break;
                default:
                        printf("%llu", p->u);
                }
        }
        printf("}\n");
}

/* "pipeline: 1.2 GiB sent, 1.1 GiB received (52.0 KiB/step)" */
static void print_bytes(const Property *props, size_t n, const char *what, const char *prefix) {
        char name[32], sent[FORMAT_BYTES_MAX], received[FORMAT_BYTES_MAX], per_step[FORMAT_BYTES_MAX];
        snprintf(name, sizeof name, "%sBytesSent", prefix);
        format_bytes(sent, sizeof sent, (uint64_t)num(props, n, name));
        snprintf(name, sizeof name, "%sBytesReceived", prefix);
        format_bytes(received, sizeof received, (uint64_t)num(props, n, name));
        snprintf(name, sizeof name, "%sBytesPerStep", prefix);
        printf("%s: %s sent, %s received", what, sent, received);
        if (num(props, n, name) > 0)
                printf(" (%s/step)", format_bytes(per_step, sizeof per_step, (uint64_t)num(props, n, name)));
}

/* The Reachability property, for people. */
static const char *reachability_text(const char *r) {
        if (!strcmp(r, "dials out"))
                return "no: it accepts no connections (behind NAT) and dials every link itself";
        if (!strcmp(r, "not reachable"))
                return "no: the coordinator could not dial it back; it dials every link itself";
        if (!strcmp(r, "reachable"))
                return "yes: a peer or the coordinator has dialed in";
        if (!strcmp(r, "unconfirmed"))
                return "not known: it listens, but no peer has dialed in (where this node dials every link of "
                       "its plan, as a first stage may, none will)";
        return r;
}

/* What a stage moved over its pipeline links, and a stage or member to
 * average; nothing from a node that has neither. */
static void print_traffic(const Property *props, size_t n) {
        bool pipeline = !strcmp(str(props, n, "Role"), "stage"),
             averaging = num(props, n, "AveragingBytesSent") + num(props, n, "AveragingBytesReceived") > 0;
        if (!pipeline && !averaging)
                return;
        printf("    Traffic: ");
        if (pipeline)
                print_bytes(props, n, "pipeline", "Pipeline");
        if (pipeline && averaging)
                printf("; ");
        if (averaging)
                print_bytes(props, n, "averaging", "Averaging");
        printf("\n");
}

/* Seconds from usec (CLOCK_REALTIME) to now. */
static double seconds_since(double usec) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        return ((double)now.tv_sec * 1e6 + (double)now.tv_nsec / 1e3 - usec) / 1e6;
}

/* "  Averaging: last round 2 of 4 members, 3.1 s ago (88 rounds done, 30 failed)" */
static void print_averaging(const Property *props, size_t n) {
        double avg = num(props, n, "LastAveragingUSec"), failed = num(props, n, "AveragingRoundsFailed");
        double done = num(props, n, "AveragingRounds");
        double with = num(props, n, "LastAveragingParticipants"), group = num(props, n, "LastAveragingGroup");
        printf("  Averaging: ");
        if (avg > 0) {
                printf("last round ");
                if (with > 0)
                        printf("%.0f of %.0f members, ", with, group);
                printf("%.1f s ago", seconds_since(avg));
        } else
                printf("no round yet");
        if (done + failed > 0)
                printf(" (%.0f rounds done, %.0f failed)", done, failed);
        printf("\n");
}

/* "      Peers: 2 connected, 0 paused; 1.2 MiB sent, 1.1 MiB received (io_uring)"; "(no links)" only
 * without peers (a coordinator's links are its own: no backend here) */
static void print_peers(const Property *props, size_t n) {
        const char *io = str(props, n, "IoBackend");
        printf("      Peers: %.0f connected, %.0f paused; %.1f MiB sent, %.1f MiB received", num(props, n, "Peers"),
               num(props, n, "PausedPeers"), num(props, n, "BytesSent") / (1 << 20),
               num(props, n, "BytesReceived") / (1 << 20));
        if (io[0])
                printf(" (%s)", io);
        else if (num(props, n, "Peers") == 0)
                printf(" (no links)");
        printf("\n");
}

static void print_human(const Property *props, size_t n, bool direct, const char *where) {
        const char *state = str(props, n, "State");
        const char *reason = str(props, n, "PauseReason"), *waiting = str(props, n, "WaitingFor");

        printf("ravnestd %s (%s)\n", str(props, n, "Version"), direct ? where : "system bus, " BUS_NAME);
        printf("      State: %s", state);
        if (reason[0])
                printf(" (%s)", reason);
        else if (waiting[0] && !strcmp(state, "training"))
                printf(" (waiting for %s)", waiting);
        printf("\n");
        if (str(props, n, "ReloadError")[0])
                printf("     Reload: failed, %s\n", str(props, n, "ReloadError"));
        if (!strcmp(state, "unconfigured"))
                return;
        printf("        Job: %s, %s", str(props, n, "Job"), str(props, n, "Role"));
        if (num(props, n, "Stage") >= 0)
                printf(", cluster %.0f stage %.0f", num(props, n, "ClusterId") + 1, num(props, n, "Stage") + 1);
        printf("\n");
        /* a coordinator trains nothing: no progress, averaging or checkpoint */
        bool trains = strcmp(str(props, n, "Role"), "coordinator") != 0;
        if (trains) {
                printf("   Progress: ");
                if (num(props, n, "Epoch") > 0) /* the first stage reads the data */
                        printf("epoch %.0f/%.0f, ", num(props, n, "Epoch"), num(props, n, "Epochs"));
                printf("step %.0f, ", num(props, n, "Step"));
                if (num(props, n, "Loss") >= 0) /* the last stage computes it */
                        printf("loss %.4f, ", num(props, n, "Loss"));
                printf("%.0f samples/s\n", num(props, n, "SamplesPerSecond"));
        }
        if (num(props, n, "TestAccuracy") >= 0)
                printf("   Accuracy: %.2f%% on the test set\n", 100 * num(props, n, "TestAccuracy"));
        print_peers(props, n);
        if (str(props, n, "Reachability")[0])
                printf("  Reachable: %s\n", reachability_text(str(props, n, "Reachability")));
        print_traffic(props, n);
        if (trains)
                print_averaging(props, n);
        if (num(props, n, "PlanEpoch") > 0)
                printf("       Plan: epoch %.0f from the coordinator\n", num(props, n, "PlanEpoch"));
        if (!trains)
                return;
        /* a checkpoint of step 0 is one: when it was written says there is one */
        if (num(props, n, "CheckpointUSec") > 0)
                printf(" Checkpoint: step %.0f, %.1f s ago\n", num(props, n, "CheckpointStep"),
                       seconds_since(num(props, n, "CheckpointUSec")));
        else if (num(props, n, "CheckpointStep") > 0)
                printf(" Checkpoint: step %.0f\n", num(props, n, "CheckpointStep"));
        else
                printf(" Checkpoint: none yet\n");
}

int ctl_node_locate(const char *cmd, const char *socket_path, NodeAddress *ret) {
        const char *env = getenv("RAVNEST_SOCKET");
        if (socket_path && !socket_path[0]) {
                fprintf(stderr, "ravnestctl %s: --socket is empty: give the node's control socket\n", cmd);
                return EX_USAGE;
        }
        if (!socket_path && env && !env[0]) {
                fprintf(stderr, "ravnestctl %s: RAVNEST_SOCKET is empty: name the node's control socket in it, or "
                        "unset it\n", cmd);
                return EX_USAGE;
        }
        *ret = (NodeAddress){ .socket = socket_path ?: env ?: CONFIG_CONTROL_SOCKET,
                              .only_socket = socket_path || env };
        return -1;
}

/* bus_connect_node(), with a path that is there but is not a socket said
 * as such (connecting to it says "Connection refused"): -ENOTSOCK. */
static int node_connect(const NodeAddress *a, sd_bus **ret, bool *ret_direct) {
        struct stat st;
        int r = bus_connect_node(a->socket, a->only_socket, ret, ret_direct);
        if (r < 0 && stat(a->socket, &st) == 0 && !S_ISSOCK(st.st_mode))
                return -ENOTSOCK;
        return r;
}

const char *ctl_node_unreachable(const NodeAddress *a, int r, char *buf, size_t n) {
        char why[PATH_MAX + 64];
        if (r == -ENOTSOCK)
                snprintf(why, sizeof why, "%s is not a socket", a->socket);
        else
                snprintf(why, sizeof why, "%s: %s", a->socket, strerror(-r));
        if (a->only_socket) /* no bus was asked */
                snprintf(buf, n, "%s", why);
        else
                snprintf(buf, n, "no %s on the system bus and %s", BUS_NAME, why);
        return buf;
}

/* All the node's properties, in one call that gives up after timeout_usec. */
static int node_read(const NodeAddress *a, uint64_t timeout_usec, Property *props, size_t *ret_n,
                     bool *ret_direct) {
        sd_bus_error error = SD_BUS_ERROR_NULL;
        sd_bus *bus = NULL;
        int r;

        r = node_connect(a, &bus, ret_direct);
        if (r < 0)
                return r;
        (void)sd_bus_set_method_call_timeout(bus, timeout_usec);
        r = read_all(bus, *ret_direct, props, ret_n, &error);
        sd_bus_error_free(&error);
        sd_bus_flush_close_unref(bus);
        return r;
}

int ctl_node_averaging(const NodeAddress *a, NodeAveraging *ret, char **ret_where) {
        Property props[MAX_PROPERTIES];
        size_t n = 0;
        bool direct;
        int r;

        r = node_read(a, BUS_CONNECT_TIMEOUT_USEC, props, &n, &direct);
        if (r < 0)
                return r;
        NodeAveraging av = {
                .nodes = (uint32_t)num(props, n, "AveragingNodes"),
                .params = (uint64_t)num(props, n, "Parameters"),
                .compute_ms = num(props, n, "ComputeMsPerStep"),
                .compute_sd_ms = num(props, n, "ComputeSdMs"),
                .bandwidth_mbit = num(props, n, "BandwidthMbit"),
                .latency_ms = num(props, n, "LatencyMs"),
                .cores = num(props, n, "CoresPerNode"),
        };
        const char *m = str(props, n, "AveragingMethod");
        size_t l = strnlen(m, sizeof av.method - 1);
        memcpy(av.method, m, l); /* av.method was zeroed */
        *ret = av;
        if (ret_where)
                *ret_where = direct ? strdup(a->socket) : strdup("system bus, " BUS_NAME);
        return 0;
}

int ctl_node_view(const NodeAddress *a, uint64_t timeout_usec, NodeView *ret) {
        Property props[MAX_PROPERTIES];
        size_t n = 0;
        bool direct;
        int r;

        r = node_read(a, timeout_usec, props, &n, &direct);
        if (r < 0)
                return r;
        NodeView v = {
                .cluster = (int)num(props, n, "ClusterId"),
                .stage = (int)num(props, n, "Stage"),
                .epoch = (int)num(props, n, "Epoch"),
                .step = (unsigned long long)num(props, n, "Step"),
                .averaging_rounds = (unsigned long long)num(props, n, "AveragingRounds"),
                .rss_bytes = (unsigned long long)num(props, n, "MemoryRSS"),
                .pipeline_bytes = (unsigned long long)(num(props, n, "PipelineBytesSent") +
                                                       num(props, n, "PipelineBytesReceived")),
                .averaging_bytes = (unsigned long long)(num(props, n, "AveragingBytesSent") +
                                                        num(props, n, "AveragingBytesReceived")),
                .loss = find(props, n, "Loss") ? num(props, n, "Loss") : -1,
                .samples_per_sec = num(props, n, "SamplesPerSecond"),
                .busy = find(props, n, "Busy") ? num(props, n, "Busy") : -1,
        };
        snprintf(v.state, sizeof v.state, "%.15s", str(props, n, "State"));
        snprintf(v.role, sizeof v.role, "%.15s", str(props, n, "Role"));
        *ret = v;
        return 0;
}

static int exit_for(int r, const sd_bus_error *e) {
        if (sd_bus_error_has_name(e, SD_BUS_ERROR_ACCESS_DENIED) || r == -EACCES || r == -EPERM)
                return EX_NOPERM;
        if (sd_bus_error_has_name(e, BUS_INTERFACE ".Error.NothingToCheckpoint") ||
            sd_bus_error_has_name(e, BUS_INTERFACE ".Error.Busy"))
                return EX_TEMPFAIL;
        return EXIT_FAILURE;
}

/* status: the properties, readable or as JSON; a node that does not answer
 * in time is unreachable (69). */
static int node_status(sd_bus *bus, bool direct, const char *where, bool json) {
        sd_bus_error error = SD_BUS_ERROR_NULL;
        Property props[MAX_PROPERTIES];
        size_t n = 0;
        int r, ret;

        (void)sd_bus_set_method_call_timeout(bus, BUS_CONNECT_TIMEOUT_USEC); /* a stuck node: 69 soon */
        r = read_all(bus, direct, props, &n, &error);
        if (r < 0) {
                ret = error.name && r != -ETIMEDOUT ? exit_for(r, &error) : EX_UNAVAILABLE;
                ret = ctl_failure(json, ret == EX_UNAVAILABLE ? "unreachable" : NULL, ret,
                                  "Failed to read the node's status: %s", error.message ?: strerror(-r));
        } else {
                if (json)
                        print_json(props, n);
                else
                        print_human(props, n, direct, where);
                ret = !strcmp(str(props, n, "State"), "failed") ? EXIT_FAILURE : 0;
        }
        sd_bus_error_free(&error);
        return ret;
}

/* pause, resume, checkpoint: the method, and what it answered. */
static int node_call(sd_bus *bus, bool direct, const char *verb, bool json) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        sd_bus_error error = SD_BUS_ERROR_NULL;
        const char *method = !strcmp(verb, "pause") ? "Pause" : !strcmp(verb, "resume") ? "Resume" : "Checkpoint";
        uint64_t step = 0;
        int r, ret = 0;

        /* a checkpoint of a big stage takes a while to write */
        (void)sd_bus_set_method_call_timeout(bus, 300 * 1000000ULL);
        r = sd_bus_call_method(bus, direct ? NULL : BUS_NAME, BUS_PATH, BUS_INTERFACE, method, &error, &reply, "");
        if (r < 0 && sd_bus_error_has_name(&error, SD_BUS_ERROR_ACCESS_DENIED))
                /* the bus's policy refuses in its own words ("Rejected send message, ...") */
                ret = ctl_failure(json, NULL, EX_NOPERM, "%s failed: Only root and the daemon's own user may %s "
                                  "this node", method, verb);
        else if (r < 0)
                ret = ctl_failure(json, NULL, exit_for(r, &error), "%s failed: %s", method,
                                  error.message ?: strerror(-r));
        else if (!strcmp(method, "Checkpoint")) {
                (void)sd_bus_message_read(reply, "t", &step);
                if (json)
                        printf("{\"CheckpointStep\": %llu}\n", (unsigned long long)step);
                else
                        printf("Checkpoint written at step %llu\n", (unsigned long long)step);
        } else if (json)
                printf("{\"Result\": \"ok\"}\n");
        sd_bus_error_free(&error);
        return ret;
}

int ctl_node(int argc, char *argv[]) {
        static const struct option options[] = {
                { "json", no_argument, NULL, 'J' },
                { "socket", required_argument, NULL, 'S' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *verb = argv[0], *socket_path = NULL;
        bool json = false, direct;
        NodeAddress a;
        sd_bus *bus = NULL;
        char why[PATH_MAX + 128];
        int c, r;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'J': json = true; break;
                case 'S': socket_path = optarg; break;
                case 'h': printf("Usage: ravnestctl %s [--json] [--socket PATH]\n", verb); return 0;
                default: return EX_USAGE;
                }
        if ((r = ctl_operands(verb, argc, argv, 0, 0, NULL)) >= 0 || (r = ctl_node_locate(verb, socket_path, &a)) >= 0)
                return r;
        r = node_connect(&a, &bus, &direct);
        if (r < 0)
                return ctl_failure(json, "unreachable", EX_UNAVAILABLE, "ravnestd is not running, or not reachable: %s",
                                   ctl_node_unreachable(&a, r, why, sizeof why));
        r = !strcmp(verb, "status") ? node_status(bus, direct, a.socket, json) : node_call(bus, direct, verb, json);
        sd_bus_flush_close_unref(bus);
        return r;
}
