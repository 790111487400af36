/* ravnestctl — inspect and control ravnest.
 *
 * For now: describe a job (layers, shapes, parameters, memory). Later parts
 * add status, pause, resume, checkpoint, plan, predict and swarm. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "net/identity.h"
#include "nn/stage.h"
#include "service/config.h"
#include "service/job.h"

static int describe_job(const char *path) {
        Layer layers[MODEL_MAX_LAYERS];
        Job job;
        Diag d = {};
        int r;

        r = job_load(path, &job, &d);
        if (r < 0) {
                fprintf(stderr, "%s\n", d.text);
                return EX_CONFIG;
        }
        r = model_spec_check(&job.model, layers, &d);
        if (r < 0) {
                fprintf(stderr, "%s\n", d.text);
                return EX_CONFIG;
        }

        printf("job %s (%s)\n", job.name, path);
        printf("dataset %s, %d classes, from %s\n", job.data.name, job.data.classes, job.data.path);
        printf("\n%-3s %-10s %-16s %-16s %12s\n", "#", "layer", "input", "output", "parameters");
        size_t total = 0, acts = shape_numel(job.model.input);
        for (int i = 0; i < job.model.n_layers; i++) {
                const Layer *l = &layers[i];
                char in[32], out[32];
                snprintf(in, sizeof in, "%dx%dx%d", l->in.c, l->in.h, l->in.w);
                snprintf(out, sizeof out, "%dx%dx%d", l->out.c, l->out.h, l->out.w);
                printf("%-3d %-10s %-16s %-16s %12zu\n", i + 1, layer_kind_to_string(l->kind), in,
                       out, l->n_params);
                total += l->n_params;
                acts += shape_numel(l->out);
        }
        size_t state = optim_state_floats(job.optim.kind, total);
        printf("\nparameters %zu (%.2f MiB), gradients the same, %s state %.2f MiB\n", total,
               total * 4.0 / (1 << 20), optim_kind_to_string(job.optim.kind), state * 4.0 / (1 << 20));
        printf("activations per batch of %d: %.2f MiB\n", job.train.batch_size,
               (double)acts * job.train.batch_size * 4.0 / (1 << 20));
        printf("optimizer %s lr %g, batch %d, %d epochs, seed %llu\n",
               optim_kind_to_string(job.optim.kind), (double)job.optim.lr, job.train.batch_size,
               job.train.epochs, (unsigned long long)job.train.seed);
        return 0;
}

/* The node's public key, for other nodes' allowlists (created if absent,
 * as ravnestd would on its first start). */
static int show_identity(const char *state_dir) {
        char path[PATH_MAX + 16], hex[IDENTITY_HEX_SIZE];
        Identity id;
        bool created;
        Diag d = {};
        Config c;

        if (!state_dir) {
                int r = config_load(CONFIG_PATH, &c, &d);
                if (r == -ENOENT)
                        config_defaults(&c);
                else if (r < 0) {
                        fprintf(stderr, "%s\n", d.text);
                        return EX_CONFIG;
                }
                snprintf(path, sizeof path, "%s/identity", c.state_directory);
                config_free(&c);
        } else
                snprintf(path, sizeof path, "%s/identity", state_dir);

        if (identity_load_or_create(path, &id, &created, &d) < 0) {
                fprintf(stderr, "%s\n", d.text);
                return 1;
        }
        identity_to_hex(id.pk, hex);
        identity_clear(&id);
        printf("%s\n", hex);
        if (created)
                fprintf(stderr, "created %s\n", path);
        return 0;
}

static void help(void) {
        printf("Usage: ravnestctl COMMAND [ARGS]\n"
               "\n"
               "Commands:\n"
               "  job FILE     describe a job: layers, shapes, parameters, memory\n"
               "  identity [STATE_DIR]\n"
               "               print this node's public key (for other nodes' allowed_peers),\n"
               "               creating the key pair if there is none yet\n"
               "  version      show the version\n"
               "  help         show this help\n");
}

int main(int argc, char *argv[]) {
        if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
            strcmp(argv[1], "-h") == 0) {
                help();
                return argc < 2 ? EX_USAGE : 0;
        }
        if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
                printf("ravnestctl %s\n", RAVNEST_VERSION);
                return 0;
        }
        if (strcmp(argv[1], "job") == 0) {
                if (argc != 3) {
                        fprintf(stderr, "Usage: ravnestctl job FILE\n");
                        return EX_USAGE;
                }
                return describe_job(argv[2]);
        }
        if (strcmp(argv[1], "identity") == 0) {
                if (argc > 3) {
                        fprintf(stderr, "Usage: ravnestctl identity [STATE_DIR]\n");
                        return EX_USAGE;
                }
                return show_identity(argc == 3 ? argv[2] : NULL);
        }
        fprintf(stderr, "Unknown command \"%s\"; see ravnestctl help\n", argv[1]);
        return EX_USAGE;
}
