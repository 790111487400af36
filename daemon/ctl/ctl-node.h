/* ctl/ctl-node.h — `ravnestctl status|pause|resume|checkpoint`: talk to
 * the local node's D-Bus object (the system bus, else its control socket)
 * and print what it says, readable or as JSON (--json).
 *
 * Exit codes a health check can use: 0 the node answered (and, for status,
 * is not "failed"); 1 the call failed or the node is "failed"; 69
 * (EX_UNAVAILABLE) no node reachable; 75 (EX_TEMPFAIL) nothing to
 * checkpoint now; 77 (EX_NOPERM) not allowed. */
#pragma once

#include "run/control.h"

/* argv[0] is the verb. */
int ctl_node(int argc, char *argv[]);
/* What the node measured for the runtime model (its D-Bus properties), for
 * `ravnestctl predict` without figures. socket_path NULL: the system bus,
 * then RAVNEST_SOCKET or the default socket, as status does. ret_where
 * (may be NULL) gets where it answered, to free. */
int ctl_node_averaging(const char *socket_path, NodeAveraging *ret, char **ret_where);

/* What `ravnestctl top` shows of a node: its status in one read. */
typedef struct NodeView {
        char state[16];
        char role[16];
        int cluster, stage;        /* 0-based; -1 when not in a pipeline */
        int epoch;                 /* <= 0: this stage does not read the data */
        unsigned long long step, averaging_rounds, rss_bytes;
        unsigned long long pipeline_bytes, averaging_bytes; /* sent and received, in all */
        double loss;               /* < 0: not known here */
        double samples_per_sec;
        double busy;               /* 0 to 1; < 0: not known */
} NodeView;

/* socket_path and only_socket as for status; a call that takes longer than
 * timeout_usec fails. */
int ctl_node_view(const char *socket_path, bool only_socket, uint64_t timeout_usec, NodeView *ret);
