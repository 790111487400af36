/* ctl/ctl-predict.h — `ravnestctl predict`: the runtime model
 * (collective/runtime-model.h) for given figures. Prints the predicted time
 * per iteration of all-reduce and of each gossip topology, and the method
 * to use; --json for machines. Exit 0, or 64 (usage).
 *
 *     ravnestctl predict --compute-ms 40 --bandwidth 100 --latency-ms 5 --nodes 8 --job mlp.job
 *     return ctl_predict(argc - 1, argv + 1);   // argv[0] is "predict"
 */
#pragma once

int ctl_predict(int argc, char *argv[]);
