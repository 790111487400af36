/* ctl/ctl-top.h — `ravnestctl top [--socket PATH]... [--swarm DIR]
 * [--interval S] [--iterations N]`: the nodes' status, refreshed every
 * interval: the local node (as status finds it), the sockets named, or every
 * node of a running swarm (the *.sock in its directory, read again at each
 * refresh). A row per node: state, cluster/stage, epoch, step, loss,
 * samples/s, busy, averaging rounds, pipeline and averaging bytes per second
 * since the last refresh, RSS; a node that does not answer is "unreachable"
 * and the view goes on.
 *
 * On a terminal: a full-screen view (ANSI escapes, the header in reverse
 * video), the terminal in non-canonical mode so q quits; Ctrl-C quits too,
 * and the terminal is restored on every way out. Elsewhere: a line per node
 * per refresh, no escapes. */
#pragma once

/* argv[0] is "top". */
int ctl_top(int argc, char *argv[]);
