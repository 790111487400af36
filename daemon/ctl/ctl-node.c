/* ctl/ctl-node.c — ravnestctl status|pause|resume|checkpoint: the node's
 * D-Bus object, on the system bus or its direct socket. */
#include "ctl-node.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include "conf/config.h"
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

int ctl_node_averaging(const char *socket_path, NodeAveraging *ret, char **ret_where) {
        bool only_socket = socket_path || getenv("RAVNEST_SOCKET"), direct;
        sd_bus_error error = SD_BUS_ERROR_NULL;
        Property props[MAX_PROPERTIES];
        size_t n = 0;
        sd_bus *bus = NULL;
        int r;

        if (!socket_path)
                socket_path = getenv("RAVNEST_SOCKET") ?: CONFIG_CONTROL_SOCKET;
        r = bus_connect_node(socket_path, only_socket, &bus, &direct);
        if (r < 0)
                return r;
        r = read_all(bus, direct, props, &n, &error);
        sd_bus_error_free(&error);
        sd_bus_flush_close_unref(bus);
        if (r < 0)
                return r;
        NodeAveraging a = {
                .nodes = (uint32_t)num(props, n, "AveragingNodes"),
                .params = (uint64_t)num(props, n, "Parameters"),
                .compute_ms = num(props, n, "ComputeMsPerStep"),
                .compute_sd_ms = num(props, n, "ComputeSdMs"),
                .bandwidth_mbit = num(props, n, "BandwidthMbit"),
                .latency_ms = num(props, n, "LatencyMs"),
                .cores = num(props, n, "CoresPerNode"),
        };
        const char *m = str(props, n, "AveragingMethod");
        size_t l = strnlen(m, sizeof a.method - 1);
        memcpy(a.method, m, l); /* a.method was zeroed */
        *ret = a;
        if (ret_where)
                *ret_where = direct ? strdup(socket_path) : strdup("system bus, " BUS_NAME);
        return 0;
}

int ctl_node_view(const char *socket_path, bool only_socket, uint64_t timeout_usec, NodeView *ret) {
        sd_bus_error error = SD_BUS_ERROR_NULL;
        Property props[MAX_PROPERTIES];
        size_t n = 0;
        sd_bus *bus = NULL;
        bool direct;
        int r;

        r = bus_connect_node(socket_path, only_socket, &bus, &direct);
        if (r < 0)
                return r;
        (void)sd_bus_set_method_call_timeout(bus, timeout_usec);
        r = read_all(bus, direct, props, &n, &error);
        sd_bus_error_free(&error);
        sd_bus_flush_close_unref(bus);
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

int ctl_node(int argc, char *argv[]) {
        static const struct option options[] = {
                { "json", no_argument, NULL, 'J' },
                { "socket", required_argument, NULL, 'S' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *verb = argv[0], *socket_path = NULL;
        bool json = false, direct;
        sd_bus_error error = SD_BUS_ERROR_NULL;
        sd_bus *bus = NULL;
        int c, r, ret;

        optind = 1;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'J':
                        json = true;
                        break;
                case 'S':
                        socket_path = optarg;
                        break;
                case 'h':
                        printf("Usage: ravnestctl %s [--json] [--socket PATH]\n", verb);
                        return 0;
                default:
                        return EX_USAGE;
                }
        if (optind < argc) {
                fprintf(stderr, "Unexpected argument: %s\n", argv[optind]);
                return EX_USAGE;
        }
        /* --socket, then RAVNEST_SOCKET: that socket only; else the system
         * bus, then the default socket */
        bool only_socket = socket_path || getenv("RAVNEST_SOCKET");
        if (!socket_path)
                socket_path = getenv("RAVNEST_SOCKET") ?: CONFIG_CONTROL_SOCKET;

        r = bus_connect_node(socket_path, only_socket, &bus, &direct);
        if (r < 0) {
                if (json)
                        printf("{\"State\": \"unreachable\", \"Error\": \"%s\"}\n", strerror(-r));
                if (only_socket) /* no bus was asked */
                        fprintf(stderr, "ravnestd is not running, or not reachable: %s: %s\n", socket_path,
                                strerror(-r));
                else
                        fprintf(stderr, "ravnestd is not running, or not reachable: no %s on the system bus and "
                                "%s: %s\n", BUS_NAME, socket_path, strerror(-r));
                return EX_UNAVAILABLE;
        }

        if (!strcmp(verb, "status")) {
                Property props[MAX_PROPERTIES];
                size_t n = 0;
                (void)sd_bus_set_method_call_timeout(bus, BUS_CONNECT_TIMEOUT_USEC); /* a stuck node: 69 soon */
                r = read_all(bus, direct, props, &n, &error);
                if (r < 0) {
                        fprintf(stderr, "Failed to read the node's status: %s\n", error.message ?: strerror(-r));
                        ret = error.name && r != -ETIMEDOUT ? exit_for(r, &error) : EX_UNAVAILABLE;
                } else {
                        if (json)
                                print_json(props, n);
                        else
                                print_human(props, n, direct, socket_path);
                        ret = !strcmp(str(props, n, "State"), "failed") ? EXIT_FAILURE : 0;
                }
        } else {
                _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
                const char *method = !strcmp(verb, "pause") ? "Pause" : !strcmp(verb, "resume") ? "Resume" : "Checkpoint";
                /* a checkpoint of a big stage takes a while to write */
                (void)sd_bus_set_method_call_timeout(bus, 300 * 1000000ULL);
                r = sd_bus_call_method(bus, direct ? NULL : BUS_NAME, BUS_PATH, BUS_INTERFACE, method, &error, &reply,
                                       "");
                if (r < 0 && sd_bus_error_has_name(&error, SD_BUS_ERROR_ACCESS_DENIED)) {
                        /* the bus's policy refuses in its own words ("Rejected send message, ...") */
                        fprintf(stderr, "%s failed: Only root and the daemon's own user may %s this node\n", method,
                                verb);
                        ret = EX_NOPERM;
                } else if (r < 0) {
                        fprintf(stderr, "%s failed: %s\n", method, error.message ?: strerror(-r));
                        ret = exit_for(r, &error);
                } else if (!strcmp(method, "Checkpoint")) {
                        uint64_t step = 0;
                        (void)sd_bus_message_read(reply, "t", &step);
                        if (json)
                                printf("{\"CheckpointStep\": %llu}\n", (unsigned long long)step);
                        else
                                printf("Checkpoint written at step %llu\n", (unsigned long long)step);
                        ret = 0;
                } else {
                        if (json)
                                printf("{\"Result\": \"ok\"}\n");
                        ret = 0;
                }
        }
        sd_bus_error_free(&error);
        sd_bus_flush_close_unref(bus);
        return ret;
}
