/* ctl/ctl-model.h — ravnestctl generate and export: a trained model put
 * together from its checkpoints (one whole-model checkpoint, or the stage
 * checkpoints of one cluster), then sampled from, or written out as
 * safetensors for other tools.
 *
 *     ravnestctl generate --job fortunes-gpt.job --checkpoint c1s1/x.ckpt --checkpoint c1s2/y.ckpt \
 *             --prompt "Q: " --tokens 200
 *     ravnestctl export --job fortunes-gpt.job --checkpoint x.ckpt --output model.safetensors
 */
#pragma once

#include "conf/job.h"

/* The stage holding all of job's layers, its parameters read from paths
 * (n of them, in any order), which must together hold layers [0, n_layers)
 * of this job, each once. d says what does not fit. */
int model_from_checkpoints(const Job *job, char *const *paths, int n, Stage **ret, Diag *d);

/* Append n bytes to text (len bytes so far, room for len + n), each drawn
 * from the model's prediction over the last context bytes at temperature t
 * (0: the likeliest) with a generator seeded by seed. */
int model_generate(const Job *job, Stage *s, uint8_t *text, size_t len, int n, double t, uint64_t seed);

int ctl_generate(int argc, char *argv[]);
int ctl_export(int argc, char *argv[]);
