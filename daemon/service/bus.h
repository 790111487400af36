/* service/bus.h — the node's D-Bus object, org.ravnest.Node1 at
 * /org/ravnest/Node1 (see ravnestd(8) and config/dbus/org.ravnest.Node1.xml).
 *
 * The object is served on the system bus when there is one (under the name
 * org.ravnest.Node1) and always on a direct connection over a unix socket in
 * the runtime directory, so status and control work where no system bus
 * exists (a container). Reading properties is open to everyone; Pause,
 * Resume and Checkpoint are for root and the daemon's own user, checked here
 * as well as by the bus policy. On the socket, which any local user may
 * reach, the daemon takes messages of at most BUS_MAX_MESSAGE bytes
 * (BusClient).
 *
 *     Bus bus;
 *     r = bus_start(&bus, event, &control, "/run/ravnest/bus", true);
 *     ...
 *     bus_state_changed(&bus);   // after control's event_fd fired
 *     bus_stop(&bus);
 */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "run/control.h"

#define BUS_NAME "org.ravnest.Node1"
#define BUS_PATH "/org/ravnest/Node1"
#define BUS_INTERFACE "org.ravnest.Node1"
#define BUS_MAX_DIRECT 32
/* Of those, what one user other than root and the daemon's may hold. */
#define BUS_MAX_DIRECT_PER_USER 4
/* Replies a client may leave unread before it is dropped. */
#define BUS_MAX_QUEUED 64
#define BUS_MAX_PENDING 16
/* A client gives up on a socket that does not answer within this long. */
#define BUS_CONNECT_TIMEOUT_USEC (10 * 1000000ULL)
/* The largest message a client of the control socket may send, in bytes:
 * the node's methods take no arguments, a property's name is short. */
#define BUS_MAX_MESSAGE (64 * 1024)

/* A client of the control socket. The daemon reads its socket itself and
 * passes on to sd-bus, through a pipe, only what checks: the lines of the
 * authentication, then each message once its fixed header announces at
 * most BUS_MAX_MESSAGE bytes. (sd-bus buffers a whole message, up to its
 * own 128 MiB, before a handler sees it, and waits for its end as long as
 * the client likes: any local user could pin that much memory on each of
 * its connections.) sd-bus answers on the socket itself. Reading a pipe,
 * sd-bus knows nothing of who sent a message: uid does, read from the
 * socket when the client connected. */
typedef struct BusClient {
        sd_bus *bus;
        uid_t uid;
        int fd;                    /* the client's socket, read here (sd-bus writes to its own copy) */
        int pipe;                  /* the end of the pipe sd-bus reads that is written here */
        sd_event_source *in, *out; /* the socket readable; the pipe writable again, after it was full */
        unsigned lines;            /* of the authentication, passed on */
        bool authenticated;        /* the client said BEGIN: messages follow */
        bool refused;              /* dropped after this event */
        uint64_t left;             /* bytes of the current message to pass on still */
        size_t n;                  /* bytes in buf ... */
        size_t ready;              /* ... of them, at its start, checked and to pass on */
        uint8_t buf[4096];
} BusClient;

typedef struct Bus {
        Control *control;
        sd_event *event;
        sd_bus *system;                   /* NULL: no system bus */
        bool name_acquired;
        int listen_fd;
        sd_event_source *listen_source;
        char socket_path[PATH_MAX];
        dev_t socket_dev;                 /* the socket bound there: removed at the end if still there */
        ino_t socket_ino;
        sd_event_source *post_source;     /* after each event: the clients' buffered calls */
        BusClient *direct[BUS_MAX_DIRECT]; /* one per connected client */
        sd_bus_message *pending[BUS_MAX_PENDING]; /* Checkpoint() calls waiting for the compute thread */
        uint64_t pending_ticket[BUS_MAX_PENDING];
        NodeState last_state;
        char last_reason[128];
        uid_t self_uid;
} Bus;

/* Serve the object on the socket (socket_path may be NULL: none) and, with
 * want_system, on the system bus. Logs; a missing system bus or a socket
 * that cannot be bound is a warning, not an error. */
int bus_start(Bus *b, sd_event *e, Control *c, const char *socket_path, bool want_system);
/* Emit PropertiesChanged when State or PauseReason changed, answer the
 * Checkpoint() calls whose checkpoint is done (closed clients go after
 * every event, in the bus's own post handler). */
void bus_state_changed(Bus *b);
void bus_stop(Bus *b);

/* The client side (ravnestctl): the system bus when the daemon holds its
 * name there (unless only_socket), else the direct socket. *ret_direct
 * tells which. */
int bus_connect_node(const char *socket_path, bool only_socket, sd_bus **ret, bool *ret_direct);
