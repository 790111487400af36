/* ctl/ctl-node.h — `ravnestctl status|pause|resume|checkpoint`: talk to
 * the local node's D-Bus object (the system bus, else its control socket)
 * and print what it says, readable or as JSON (--json; a failure is JSON
 * too, {"State": "unreachable", "Error": ...} when no node answers).
 *
 * Exit codes a health check can use: 0 the node answered (and, for status,
 * is not "failed"); 1 the call failed or the node is "failed"; 64 a bad
 * command line, an empty --socket or RAVNEST_SOCKET among them; 69
 * (EX_UNAVAILABLE) no node reachable, or the path is not a socket; 75
 * (EX_TEMPFAIL) nothing to checkpoint now; 77 (EX_NOPERM) not allowed.
 *
 *     NodeAddress a;
 *     if ((r = ctl_node_locate("top", socket_path, &a)) >= 0)
 *             return r;                          // 64: an empty path (said)
 *     if ((r = ctl_node_view(&a, 1000000, &view)) < 0)
 *             fprintf(stderr, "%s\n", ctl_node_unreachable(&a, r, why, sizeof why));
 */
#pragma once

#include <stddef.h>

#include "run/control.h"

/* argv[0] is the verb. */
int ctl_node(int argc, char *argv[]);

/* Where a command finds the node: a socket, and whether to ask only there
 * (else the system bus first). */
typedef struct NodeAddress {
        const char *socket;
        bool only_socket;
} NodeAddress;

/* The node that command cmd talks to: socket_path (--socket; NULL when not
 * given), else $RAVNEST_SOCKET, that socket only; else the system bus, then
 * the default socket. -1 to go on, or EX_USAGE for an empty path (said). */
int ctl_node_locate(const char *cmd, const char *socket_path, NodeAddress *ret);
/* Why the node at a did not answer, r from a call below, into buf: "/x is
 * not a socket", "/x: No such file or directory"; with the bus asked,
 * "no org.ravnest.Node1 on the system bus and ..." before it. */
const char *ctl_node_unreachable(const NodeAddress *a, int r, char *buf, size_t n);

/* What the node measured for the runtime model (its D-Bus properties), for
 * `ravnestctl predict` without figures. ret_where (may be NULL) gets where
 * it answered, to free. */
int ctl_node_averaging(const NodeAddress *a, NodeAveraging *ret, char **ret_where);

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

/* A call that takes longer than timeout_usec fails. */
int ctl_node_view(const NodeAddress *a, uint64_t timeout_usec, NodeView *ret);
