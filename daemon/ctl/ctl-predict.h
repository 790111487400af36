/* ctl/ctl-predict.h — `ravnestctl predict`: the runtime model
 * (collective/runtime-model.h) for given figures. Prints the predicted time
 * per iteration of all-reduce and of each gossip topology, and the method
 * to use; --json for machines (a failure too: {"Error": ...}). Without
 * figures, or with --node or --socket, those the local node measured. Exit
 * 0; 64 usage (figures missing among them); 69 no node answers, or it is
 * not in an averaging group; 75 it has not measured yet; 78 a bad job.
 *
 *     ravnestctl predict --compute-ms 40 --bandwidth 100 --latency-ms 5 --nodes 8 --job mlp.job
 *     return ctl_predict(argc - 1, argv + 1);   // argv[0] is "predict"
 */
#pragma once

int ctl_predict(int argc, char *argv[]);
