/* ctl/ctl-plot.c — see ctl-plot.h. */
#include "ctl-plot.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <unistd.h>

#include "ctl-common.h"
#include "ctl-series.h"
#include "run/series.h"
#include "util/file.h"
#include "util/macro.h"
#include "util/svg-plot.h"

#define PLOT_MAX_NODES 256

extern char **environ;

typedef struct Plot {
        SeriesData nodes[PLOT_MAX_NODES];
        size_t n;
} Plot;

static Plot *plot_free(Plot *p) {
        for (size_t i = 0; p && i < p->n; i++)
                series_data_done(&p->nodes[i]);
        free(p);
        return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(Plot *, plot_free);

static bool is_series(const char *file) {
        size_t len = strlen(file), s = strlen(SERIES_SUFFIX);
        return len > s && !strcmp(file + len - s, SERIES_SUFFIX);
}

/* One file, named after its directory below RUN_DIR ("c1s2"), else after
 * its job; a file that is not a series is said and left out. */
static void read_one(Plot *p, const char *path, const char *sub, const char *file) {
        char name[64];
        if (p->n == PLOT_MAX_NODES) {
                fprintf(stderr, "%s: left out: at most %d series in one plot\n", path, PLOT_MAX_NODES);
                return;
        }
        if (sub)
                snprintf(name, sizeof name, "%s", sub);
        else
                snprintf(name, sizeof name, "%.*s", (int)(strlen(file) - strlen(SERIES_SUFFIX)), file);
        struct stat st;
        Diag why = {};
        int fd = file_open_regular(path, 0, &st, &why);
        FILE *f = fd >= 0 ? fdopen(fd, "re") : NULL;
        if (!f) {
                if (fd >= 0)
                        close(fd);
                fprintf(stderr, "%s\n", fd < 0 ? why.text : strerror(errno));
                return;
        }
        int r = series_data_read(f, name, stderr, &p->nodes[p->n]);
        fclose(f);
        if (r == -EBADMSG)
                fprintf(stderr, "%s: left out: not a series (no header with an elapsed column)\n", path);
        else if (r < 0)
                fprintf(stderr, "%s: left out: %s\n", path, strerror(-r));
        else
                p->n++;
}

static int cmp_name(const void *a, const void *b) {
        return strcmp(((const SeriesData *)a)->name, ((const SeriesData *)b)->name);
}

/* dir's series, and (depth 0) its subdirectories'. */
static int scan(Plot *p, const char *dir, const char *sub, int depth) {
        DIR *d = opendir(dir);
        struct dirent *e;
        if (!d)
                return -errno;
        while ((e = readdir(d))) {
                char path[PATH_MAX];
                struct stat st;
                if (e->d_name[0] == '.' ||
                    snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path || stat(path, &st) < 0)
                        continue;
                if (S_ISDIR(st.st_mode) && depth == 0)
                        (void)scan(p, path, e->d_name, 1);
                else if (S_ISREG(st.st_mode) && is_series(e->d_name))
                        read_one(p, path, sub, e->d_name);
        }
        closedir(d);
        qsort(p->nodes, p->n, sizeof p->nodes[0], cmp_name);
        return 0;
}

/* The two panels: the training loss (and the validation loss where there
 * is one) and samples/s, each node a line. */
static int draw(const Plot *p, const char *run_dir, const char *out) {
        _cleanup_(freep) SvgSeries *loss = calloc(2 * p->n, sizeof *loss), *rate = calloc(p->n, sizeof *rate);
        _cleanup_(freep) char *labels = calloc(p->n, 80);
        size_t n_loss = 0;
        if (!loss || !rate || !labels)
                return -ENOMEM;
        for (size_t i = 0; i < p->n; i++) {
                const SeriesData *d = &p->nodes[i];
                const double *x = d->col[SERIES_ELAPSED];
                bool valid = false;
                for (size_t k = 0; k < d->n && !valid; k++)
                        valid = !isnan(d->col[SERIES_VALID_LOSS][k]);
                loss[n_loss++] = (SvgSeries){ d->name, x, d->col[SERIES_TRAIN_LOSS], d->n };
                if (valid) {
                        snprintf(labels + 80 * i, 80, "%s validation", d->name);
                        loss[n_loss++] = (SvgSeries){ labels + 80 * i, x, d->col[SERIES_VALID_LOSS], d->n };
                }
                rate[i] = (SvgSeries){ d->name, x, d->col[SERIES_SAMPLES_PER_SEC], d->n };
        }
        SvgPanel panels[] = {
                { "Loss", "elapsed (s)", "loss", loss, n_loss },
                { "Throughput", "elapsed (s)", "samples/s", rate, p->n },
        };
        char title[PATH_MAX + 16];
        snprintf(title, sizeof title, "ravnest: %s", run_dir);
        FILE *f = fopen(out, "we");
        if (!f)
                return -errno;
        int r = svg_plot_write(f, title, panels, ELEMENTSOF(panels), 960, 360);
        if (fclose(f) != 0 && r >= 0)
                r = -errno;
        return r;
}

/* rsvg-convert, when installed, for a PNG beside the SVG: 1 drawn, 0 not
 * installed, -errno when it failed. */
static int draw_png(const char *svg, const char *png) {
        char *argv[] = { "rsvg-convert", "--format", "png", "--output", (char *)png, (char *)svg, NULL };
        pid_t pid;
        int status;
        int r = posix_spawnp(&pid, "rsvg-convert", NULL, NULL, argv, environ);
        if (r == ENOENT)
                return 0;
        if (r != 0)
                return -r;
        if (waitpid(pid, &status, 0) < 0)
                return -errno;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 1 : WIFEXITED(status) && WEXITSTATUS(status) == 127 ? 0 : -EIO;
}

static void usage(FILE *f) {
        fprintf(f, "Usage: ravnestctl plot RUN_DIR [-o|--output FILE.svg]\n"
                   "\n"
                   "Draw the series of every node under RUN_DIR (its *.series.csv and those one directory down, as\n"
                   "in a swarm's directory) as an SVG: the loss and the throughput over elapsed time, a line per\n"
                   "node; a PNG beside it when rsvg-convert is installed.\n"
                   "\n"
                   "  -o, --output FILE   the SVG (default RUN_DIR/series.svg), a regular file or none yet\n"
                   "  -h, --help          show this help\n");
}

static int plot_run(const char *run_dir, const char *out) {
        _cleanup_(plot_freep) Plot *p = calloc(1, sizeof *p);
        char def[PATH_MAX], target[PATH_MAX], png[PATH_MAX];
        int r;

        if (!p)
                return EXIT_FAILURE;
        if ((r = scan(p, run_dir, NULL, 0)) < 0) {
                fprintf(stderr, "%s: %s\n", run_dir, strerror(-r));
                return EX_NOINPUT;
        }
        if (p->n == 0) {
                fprintf(stderr, "No series (*" SERIES_SUFFIX ") in %s or the directories in it\n", run_dir);
                return EX_NOINPUT;
        }
        if (!out) {
                snprintf(def, sizeof def, "%s/series.svg", run_dir);
                out = def;
        }
        if ((r = ctl_output_target("plot", out, target)) != 0)
                return r;
        if ((r = draw(p, run_dir, target)) < 0) {
                fprintf(stderr, "Failed to write %s: %s\n", out, strerror(-r));
                return EX_CANTCREAT;
        }
        printf("%s: %zu series\n", out, p->n);
        size_t len = strlen(out);
        snprintf(png, sizeof png, "%.*s.png", (int)(len > 4 && !strcmp(out + len - 4, ".svg") ? len - 4 : len), out);
        r = draw_png(out, png);
        if (r > 0)
                printf("%s\n", png);
        else if (r < 0)
                fprintf(stderr, "rsvg-convert failed on %s: %s (the SVG is there)\n", out, strerror(-r));
        return 0;
}

int ctl_plot(int argc, char *argv[]) {
        static const struct option options[] = {
                { "output", required_argument, NULL, 'o' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *out = NULL;
        int c, r;

        optind = 1;
        while ((c = getopt_long(argc, argv, "o:h", options, NULL)) >= 0)
                switch (c) {
                case 'o': out = optarg; break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return EX_USAGE;
                }
        if ((r = ctl_operands("plot", argc, argv, 1, 1, "RUN_DIR")) >= 0) {
                usage(stderr);
                return r;
        }
        return plot_run(argv[optind], out);
}
