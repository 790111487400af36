/* ctl/ctl-plan.h — `ravnestctl plan NODES_FILE [--job FILE] [--json]
 * [--seed N] [--micro-batch N] [--staleness N] [--similarity W]`: form
 * clusters from a list of nodes (nodes-file.h) with the genetic algorithm of
 * cluster/formation.h, cut the job's model in each, and print the plan as a
 * table or as JSON (a failure too: {"Error": ...}). Exit 0, 64 (usage), 65
 * (no plan: the nodes cannot hold the model), 78 (a bad file, the message
 * names its line) or 1 (no plan for another reason).
 *
 *     return ctl_plan(argc - 1, argv + 1);   // argv[0] is "plan"
 */
#pragma once

int ctl_plan(int argc, char *argv[]);
