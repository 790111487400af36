/* conf/job.c */
#include "job.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "conf.h"

/* A relative dataset.path is read from the job file's directory, wherever
 * the job is started from (ravnestd under systemd runs in /). */
static int beside_job(const config_setting_t *g, const char *job_path, char *path, size_t size, Diag *d) {
        const char *slash = strrchr(job_path, '/');
        char joined[PATH_MAX];
        if (path[0] == '/' || !slash)
                return 0;
        int n = snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - job_path), job_path, path);
        if (n < 0 || (size_t)n >= size)
                return conf_error(g, "path", -ENAMETOOLONG, d, "too long once read from the job file's directory");
        memcpy(path, joined, (size_t)n + 1);
        return 0;
}

static int parse_data(const config_setting_t *root, const char *job_path, JobData *data, Diag *d) {
        static const char *const keys[] = { "name", "path", "classes", "mean", "std", NULL };
        config_setting_t *g;
        long long classes;
        int r;

        if ((r = conf_get_group(root, "dataset", true, false, &g, d)) < 0 ||
            (r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_string(g, "name", true, NULL, data->name, sizeof data->name, d)) < 0)
                return r;
        if (strcmp(data->name, "text") == 0) { /* its classes are the model's vocabulary */
                data->kind = JOB_DATA_TEXT;
                if (config_setting_get_member(g, "classes") || config_setting_get_member(g, "mean") ||
                    config_setting_get_member(g, "std"))
                        return conf_error(g, NULL, -EINVAL, d, "classes, mean and std are settings of image datasets "
                                          "(a text dataset's classes are the model's vocabulary)");
                r = conf_get_string(g, "path", true, NULL, data->path, sizeof data->path, d);
                return r < 0 ? r : beside_job(g, job_path, data->path, sizeof data->path, d);
        }
        if (strcmp(data->name, "fashion-mnist") != 0 && strcmp(data->name, "idx") != 0)
                return conf_error(g, "name", -EINVAL, d,
                                  "unknown dataset \"%s\" (known: fashion-mnist, idx, text)", data->name);
        data->kind = JOB_DATA_IDX;
        if ((r = conf_get_string(g, "path", false, FASHION_MNIST_DIR, data->path, sizeof data->path, d)) < 0 ||
            (r = conf_get_int(g, "classes", false, 2, 256, 10, &classes, d)) < 0 ||
            (r = conf_get_double(g, "mean", false, -1e3, 1e3, 0.0, &data->mean, d)) < 0 ||
            (r = conf_get_double(g, "std", false, 1e-6, 1e3, 1.0, &data->std, d)) < 0)
                return r;
        data->classes = (int)classes;
        return beside_job(g, job_path, data->path, sizeof data->path, d);
}

static int parse_layer(const config_setting_t *s, LayerSpec *l, Diag *d) {
        static const char *const keys[] = { "type", "out", "kernel", "stride", "padding", NULL };
        char type[32];
        long long out, kernel, stride, padding;
        int r;

        if (!config_setting_is_group(s))
                return conf_error(s, NULL, -EINVAL, d, "a layer must be a group { type = \"...\"; ... }");
        if ((r = conf_check_keys(s, keys, d)) < 0 ||
            (r = conf_get_string(s, "type", true, NULL, type, sizeof type, d)) < 0)
                return r;

        /* embed, block and lm_head are a gpt's, which ravnest-job(5) writes
         * model = { type = "gpt"; ... }, not layers of a list */
        l->kind = layer_kind_from_string(type);
        if (l->kind == _LAYER_KIND_INVALID || l->kind == LAYER_EMBED || l->kind == LAYER_BLOCK ||
            l->kind == LAYER_LM_HEAD)
                return conf_error(s, "type", -EINVAL, d,
                                  "unknown layer \"%s\" (known: linear, relu, gelu, conv2d, maxpool2d, flatten)",
                                  type);

        bool needs_out = l->kind == LAYER_LINEAR || l->kind == LAYER_CONV2D;
        bool needs_kernel = l->kind == LAYER_CONV2D || l->kind == LAYER_MAXPOOL2D;
        if ((r = conf_get_int(s, "out", needs_out, 1, 65536, 0, &out, d)) < 0 ||
            (r = conf_get_int(s, "kernel", needs_kernel, 1, 15, 0, &kernel, d)) < 0 ||
            (r = conf_get_int(s, "stride", false, 1, 15, 0, &stride, d)) < 0 ||
            (r = conf_get_int(s, "padding", false, 0, 14, 0, &padding, d)) < 0)
                return r;
        if (!needs_out && config_setting_get_member(s, "out"))
                return conf_error(s, "out", -EINVAL, d, "%s takes no \"out\"", type);
        if (!needs_kernel && (config_setting_get_member(s, "kernel") ||
                              config_setting_get_member(s, "stride")))
                return conf_error(s, NULL, -EINVAL, d, "%s takes no kernel or stride", type);
        if (l->kind != LAYER_CONV2D && config_setting_get_member(s, "padding"))
                return conf_error(s, "padding", -EINVAL, d, "%s takes no padding", type);

        l->out = (int)out;
        l->kernel = (int)kernel;
        l->stride = (int)stride;
        l->padding = (int)padding;
        return 0;
}

/* Shapes must chain; report against the setting that holds the layers. */
static int check_shapes(const config_setting_t *where, const ModelSpec *m, Diag *d) {
        Diag md = {};
        int r = model_spec_check(m, NULL, &md);
        return r < 0 ? conf_error(where, NULL, r, d, "%s", md.text) : 0;
}

/* model = { type = "gpt"; vocab; context; layers; heads; dim; }: an
 * embedding, `layers` pre-LN blocks and the LM head (nn/transformer.h). */
static int parse_gpt(const config_setting_t *g, ModelSpec *m, Diag *d) {
        static const char *const keys[] = { "type", "vocab", "context", "layers", "heads", "dim", NULL };
        long long vocab, context, layers, heads, dim;
        int r;

        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_int(g, "vocab", false, 2, 256, 256, &vocab, d)) < 0 ||
            (r = conf_get_int(g, "context", true, 1, 4096, 0, &context, d)) < 0 ||
            (r = conf_get_int(g, "layers", true, 1, MODEL_MAX_LAYERS - 2, 0, &layers, d)) < 0 ||
            (r = conf_get_int(g, "heads", true, 1, 256, 0, &heads, d)) < 0 ||
            (r = conf_get_int(g, "dim", true, 2, 16384, 0, &dim, d)) < 0) /* LayerNorm needs 2 */
                return r;
        if (dim % heads)
                return conf_error(g, "dim", -EINVAL, d, "%lld is not divisible by heads (%lld)", dim, heads);
        *m = (ModelSpec){ .input = { (int)context, 1, 1 }, .n_classes = (int)vocab, .lm = true,
                          .n_layers = (int)layers + 2 };
        m->layers[0] = (LayerSpec){ .kind = LAYER_EMBED, .vocab = (int)vocab, .out = (int)dim };
        for (int i = 1; i <= layers; i++)
                m->layers[i] = (LayerSpec){ .kind = LAYER_BLOCK, .heads = (int)heads };
        m->layers[layers + 1] = (LayerSpec){ .kind = LAYER_LM_HEAD, .out = (int)vocab };
        return check_shapes(g, m, d);
}

/* model = { input = [C, H, W]; layers = ( { type = ...; }, ... ); } */
static int parse_layers(config_setting_t *g, ModelSpec *m, int classes, Diag *d) {
        static const char *const keys[] = { "input", "layers", NULL };
        config_setting_t *input, *layers;
        int r;

        if ((r = conf_check_keys(g, keys, d)) < 0)
                return r;
        input = config_setting_get_member(g, "input");
        if (!input)
                return conf_error(g, "input", -EINVAL, d, "missing (required): the per-sample shape [C, H, W]");
        if (!config_setting_is_array(input) || config_setting_length(input) != 3)
                return conf_error(input, NULL, -EINVAL, d, "must be an array of three integers [C, H, W]");
        long long dims[3];
        for (int i = 0; i < 3; i++)
                if ((r = conf_int(config_setting_get_elem(input, (unsigned)i), 1, 4096, &dims[i], d)) < 0)
                        return r;
        m->input = (Shape){ (int)dims[0], (int)dims[1], (int)dims[2] };
        m->n_classes = classes;

        if ((r = conf_get_group(g, "layers", true, true, &layers, d)) < 0)
                return r;
        int n = config_setting_length(layers);
        if (n < 1 || n > MODEL_MAX_LAYERS)
                return conf_error(layers, NULL, -EINVAL, d, "must hold 1 to %d layers", MODEL_MAX_LAYERS);
        m->n_layers = n;
        for (int i = 0; i < n; i++)
                if ((r = parse_layer(config_setting_get_elem(layers, (unsigned)i), &m->layers[i], d)) < 0)
                        return r;
        return check_shapes(layers, m, d);
}

static int parse_model(const config_setting_t *root, ModelSpec *m, JobData *data, Diag *d) {
        config_setting_t *g;
        char type[16] = "";
        int r;

        if ((r = conf_get_group(root, "model", true, false, &g, d)) < 0 ||
            (r = conf_get_string(g, "type", false, "", type, sizeof type, d)) < 0)
                return r;
        if (type[0] && strcmp(type, "gpt") != 0)
                return conf_error(g, "type", -EINVAL, d, "unknown model type \"%s\" (known: gpt; or a list of layers)",
                                  type);
        bool gpt = type[0] != 0;
        if (gpt != (data->kind == JOB_DATA_TEXT))
                return conf_error(g, gpt ? "type" : NULL, -EINVAL, d, gpt ? "a gpt trains on a text dataset"
                                  : "a text dataset needs a language model: model = { type = \"gpt\"; ... }");
        r = gpt ? parse_gpt(g, m, d) : parse_layers(g, m, data->classes, d);
        if (r < 0)
                return r;
        if (gpt)
                data->classes = m->n_classes;
        return 0;
}

static int parse_optim(const config_setting_t *root, OptimSpec *o, Diag *d) {
        static const char *const keys[] = { "type", "lr", "schedule", "momentum", "nesterov",
                                            "weight_decay", "beta1", "beta2", "eps", "accum_steps",
                                            "warmup_steps", NULL };
        config_setting_t *g;
        char type[16], schedule[16];
        double lr, mom, wd, b1, b2, eps;
        long long accum, warmup;
        bool nesterov;
        int r;

        if ((r = conf_get_group(root, "optimizer", true, false, &g, d)) < 0 ||
            (r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_string(g, "type", true, NULL, type, sizeof type, d)) < 0)
                return r;
        OptimKind kind = optim_kind_from_string(type);
        if (kind == _OPTIM_KIND_INVALID)
                return conf_error(g, "type", -EINVAL, d, "unknown optimizer \"%s\" (known: sgd, adamw, accumadam)", type);
        optim_spec_defaults(o, kind);

        if (kind != OPTIM_SGD && (config_setting_get_member(g, "momentum") ||
                                  config_setting_get_member(g, "nesterov")))
                return conf_error(g, NULL, -EINVAL, d, "momentum and nesterov are settings of sgd");
        if (kind == OPTIM_SGD && (config_setting_get_member(g, "beta1") ||
                                  config_setting_get_member(g, "beta2") ||
                                  config_setting_get_member(g, "eps")))
                return conf_error(g, NULL, -EINVAL, d, "beta1, beta2 and eps are settings of adamw and accumadam");
        if (kind != OPTIM_ACCUM_ADAM && config_setting_get_member(g, "accum_steps"))
                return conf_error(g, "accum_steps", -EINVAL, d, "accum_steps is a setting of accumadam");

        if ((r = conf_get_double(g, "lr", false, 0.0, 100.0, o->lr, &lr, d)) < 0 ||
            (r = conf_get_double(g, "momentum", false, 0.0, 0.9999, o->momentum, &mom, d)) < 0 ||
            (r = conf_get_bool(g, "nesterov", false, &nesterov, d)) < 0 ||
            (r = conf_get_double(g, "weight_decay", false, 0.0, 10.0, o->weight_decay, &wd, d)) < 0 ||
            (r = conf_get_double(g, "beta1", false, 0.0, 0.9999, o->beta1, &b1, d)) < 0 ||
            (r = conf_get_double(g, "beta2", false, 0.0, 0.999999, o->beta2, &b2, d)) < 0 ||
            (r = conf_get_double(g, "eps", false, 1e-12, 1.0, o->eps ? o->eps : 1e-8, &eps, d)) < 0 ||
            (r = conf_get_int(g, "accum_steps", false, 1, 1024, o->accum_steps, &accum, d)) < 0 ||
            (r = conf_get_int(g, "warmup_steps", false, 0, 1 << 30, 0, &warmup, d)) < 0)
                return r;
        if ((r = conf_get_string(g, "schedule", false, "constant", schedule, sizeof schedule, d)) < 0)
                return r;
        o->schedule = lr_schedule_from_string(schedule);
        if (o->schedule == _LR_SCHEDULE_INVALID)
                return conf_error(g, "schedule", -EINVAL, d,
                                  "unknown schedule \"%s\" (known: constant, cosine)", schedule);
        if (nesterov && mom == 0.0)
                return conf_error(g, "nesterov", -EINVAL, d, "nesterov needs a momentum above 0");
        o->lr = (float)lr;
        o->momentum = (float)mom;
        o->nesterov = nesterov;
        o->weight_decay = (float)wd;
        o->beta1 = (float)b1;
        o->beta2 = (float)b2;
        o->eps = (float)eps;
        o->accum_steps = (unsigned)accum;
        o->warmup_steps = (unsigned)warmup;
        return 0;
}

static int parse_training(const config_setting_t *root, TrainSpec *t, Diag *d) {
        static const char *const keys[] = { "batch_size", "epochs", "seed", NULL };
        config_setting_t *g;
        long long batch, epochs, seed;
        int r;

        if ((r = conf_get_group(root, "training", true, false, &g, d)) < 0 ||
            (r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_int(g, "batch_size", true, 1, 65536, 0, &batch, d)) < 0 ||
            (r = conf_get_int(g, "epochs", true, 1, 1000000, 0, &epochs, d)) < 0 ||
            (r = conf_get_int(g, "seed", false, 0, INT64_MAX, 1, &seed, d)) < 0)
                return r;
        *t = (TrainSpec){
                .batch_size = (int)batch,
                .epochs = (int)epochs,
                .seed = (uint64_t)seed,
                .shard = 0,
                .n_shards = 1,
        };
        return 0;
}

/* The name goes into file names (its checkpoints: "<name>.layers-*"),
 * metric labels, JSON and D-Bus strings: letters, digits and ". _ + -",
 * and never ".layers-", which would let one job's name find another's
 * checkpoints. */
static int check_name(const config_setting_t *root, const char *name, Diag *d) {
        size_t n = strlen(name);
        if (n == 0 || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-") != n ||
            strstr(name, ".layers-") || name[0] == '.' || name[0] == '-')
                return conf_error(config_setting_get_member(root, "name"), NULL, -EINVAL, d,
                                  "must be 1 to 63 letters, digits and \". _ + -\", not starting with \".\" or "
                                  "\"-\", without \".layers-\"");
        return 0;
}

int job_load(const char *path, Job *ret, Diag *d) {
        static const char *const keys[] = { "name", "dataset", "model", "optimizer", "training", NULL };
        config_t c;
        Job j = {};
        int r;

        if (strlen(path) >= sizeof j.path)
                return diag_set(d, -ENAMETOOLONG, "%s: path too long", path);
        strcpy(j.path, path);

        config_init(&c);
        r = conf_read_file(&c, path, d);
        if (r >= 0) {
                const config_setting_t *root = config_root_setting(&c);
                if ((r = conf_check_keys(root, keys, d)) >= 0 &&
                    (r = conf_get_string(root, "name", true, NULL, j.name, sizeof j.name, d)) >= 0 &&
                    (r = check_name(root, j.name, d)) >= 0 &&
                    (r = parse_data(root, path, &j.data, d)) >= 0 &&
                    (r = parse_model(root, &j.model, &j.data, d)) >= 0 &&
                    (r = parse_optim(root, &j.optim, d)) >= 0)
                        r = parse_training(root, &j.train, d);
        }
        config_destroy(&c);
        if (r < 0)
                return r;
        *ret = j;
        return 0;
}

int job_check_data(const Job *job, const char *dir, Diag *d) {
        DatasetShape s;
        Diag why = {};
        int r;

        dir = dir ?: job->data.path;
        for (int test = 0; test < 2; test++) {
                const char *split = job->data.kind == JOB_DATA_TEXT ? test ? "validation" : "training"
                                    : test ? "t10k" : "train";
                r = job->data.kind == JOB_DATA_TEXT ? dataset_probe_text(dir, test, job->model.input.c, &s, d)
                                                    : dataset_probe_dir(dir, split, &s, d);
                /* not on this machine is a data set none of whose files is
                 * there; one with some of them is broken */
                if (r == -ENOENT && job->data.kind != JOB_DATA_TEXT && dataset_dir_count_files(dir) > 0)
                        return -ENODATA;
                if (r < 0)
                        return r;
                if ((r = model_check_data_shape(&job->model, &s, &why)) < 0)
                        return diag_set(d, r, "%s: %s in %s (%s split)", job->path, why.text, dir, split);
        }
        return 0;
}

int job_load_split(const Job *job, const char *dir, bool test, Dataset **ret, Diag *d) {
        const JobData *data = &job->data;
        Dataset *ds;
        int r;

        dir = dir ?: data->path;
        if (data->kind == JOB_DATA_TEXT)
                return dataset_load_text(dir, test, job->model.input.c, job->model.n_classes, ret, d);
        r = dataset_load_dir(dir, test ? "t10k" : "train", data->classes, &ds, d);
        if (r < 0)
                return r;
        dataset_set_normalization(ds, (float)data->mean, (float)data->std);
        *ret = ds;
        return 0;
}
