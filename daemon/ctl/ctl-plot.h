/* ctl/ctl-plot.h — `ravnestctl plot RUN_DIR [-o|--output FILE.svg]`: every
 * node's series (run/series.h) under RUN_DIR — its own *.series.csv and
 * those one directory down, as a swarm's directory has one per node — drawn
 * as an SVG of two panels over elapsed time, loss and throughput, one line
 * per node (util/svg-plot.h); and a PNG beside it when rsvg-convert is
 * installed.
 *
 * Exit codes: 0 drawn; 64 usage; 66 (EX_NOINPUT) no series there; 73
 * (EX_CANTCREAT) the SVG could not be written, or is not a regular file (a
 * device, a FIFO, a directory: refused before anything is written). */
#pragma once

/* argv[0] is "plot". */
int ctl_plot(int argc, char *argv[]);
