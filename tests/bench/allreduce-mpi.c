/* allreduce-mpi — OpenMPI reference for bench-allreduce: MPI_Allreduce of a
 * float32 vector over TCP on loopback, between the ranks of one mpirun.
 *
 * For each size, R timed calls of MPI_Allreduce(MPI_IN_PLACE, MPI_SUM)
 * followed by a scaling by 1/N (an average, as ravnest's ring all-reduce
 * computes), after W untimed warm-up calls. Every call is preceded by a refill
 * of the input and a barrier, both untimed. A call's time is that of the
 * slowest rank, from leaving the barrier to holding the average. Rank 0
 * prints one line per size:
 *
 *     mpi procs=N mib=M median_s=0.123456 min_s=... max_s=... runs=R
 *
 * and every rank checks the result; the exit status is non-zero if any is
 * wrong. Run it as (root needs --allow-run-as-root, or OMPI_ALLOW_RUN_AS_ROOT=1
 * and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment):
 *
 *     mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 \
 *         --mca pml ob1 --mca btl tcp,self \
 *         --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
 *         allreduce-mpi --mib 1 --mib 16 --mib 64 --runs 5
 *
 * pml ob1 keeps UCX (which would use shared memory) out; btl tcp,self keeps
 * vader (shared memory) out, so ranks talk over TCP even on one host; the TCP
 * btl excludes 127.0.0.0/8 by default, hence btl_tcp_if_include lo; and
 * oob_tcp_if_include lo keeps mpirun's own control traffic on loopback too.
 */
#include <getopt.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 16

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return (x > y) - (x < y);
}

/* Rank-dependent input: i % 1024 + rank + 1 (exact in float32). */
static void fill(float *x, size_t n, int rank) {
        for (size_t i = 0; i < n; i++)
                x[i] = (float)(i % 1024) + (float)(rank + 1);
}

/* Times one size; returns 0 if every rank got the right average. */
static int bench(double mib, int runs, int warmup, int rank, int procs) {
        size_t n = (size_t)(mib * (1 << 20)) / sizeof(float);
        float *src = malloc(n * sizeof *src), *x = malloc(n * sizeof *x);
        double *times = malloc((size_t)runs * sizeof *times), *slowest = malloc((size_t)runs * sizeof *slowest);
        if (!src || !x || !times || !slowest) {
                fprintf(stderr, "allreduce-mpi: rank %d: out of memory for %g MiB\n", rank, mib);
                MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fill(src, n, rank);
        float scale = 1.0f / (float)procs;
        int bad = 0;
        for (int r = 0; r < warmup + runs; r++) {
                memcpy(x, src, n * sizeof *x);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                for (size_t i = 0; i < n; i++)
                        x[i] *= scale;
                double t = MPI_Wtime() - t0;
                if (r >= warmup)
                        times[r - warmup] = t;
                /* Average of (i % 1024 + r + 1) over r = 0..N-1. */
                for (size_t i = 0; i < n && !bad; i++) {
                        float want = (float)(i % 1024) + (float)(procs + 1) / 2.0f;
                        float d = x[i] > want ? x[i] - want : want - x[i];
                        if (d > 1e-6f * want) {
                                fprintf(stderr, "allreduce-mpi: rank %d: wrong result for %g MiB: x[%zu]=%g, want %g\n",
                                        rank, mib, i, (double)x[i], (double)want);
                                bad = 1;
                        }
                }
        }
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
        MPI_Reduce(times, slowest, runs, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
                qsort(slowest, (size_t)runs, sizeof *slowest, cmp_double);
                double median = runs % 2 ? slowest[runs / 2] : (slowest[runs / 2 - 1] + slowest[runs / 2]) / 2;
                printf("mpi procs=%d mib=%g median_s=%.6f min_s=%.6f max_s=%.6f runs=%d\n", procs, mib, median,
                       slowest[0], slowest[runs - 1], runs);
                fflush(stdout);
        }
        free(src);
        free(x);
        free(times);
        free(slowest);
        return bad;
}

int main(int argc, char **argv) {
        MPI_Init(&argc, &argv);
        int rank, procs;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &procs);

        /* Every rank parses the same arguments, so all agree on what to do. */
        static const struct option opts[] = {
                { "mib", required_argument, NULL, 'm' },
                { "runs", required_argument, NULL, 'r' },
                { "warmup", required_argument, NULL, 'w' },
                { "help", no_argument, NULL, 'h' },
                { 0 },
        };
        double mib[MAX_SIZES];
        int n_sizes = 0, runs = 0, warmup = 2, ok = 1, c;
        while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (c == 'h') {
                        if (rank == 0)
                                printf("Usage: mpirun -np N (N >= 2) allreduce-mpi --mib M [--mib M2 ...] --runs R "
                                       "[--warmup W]\n"
                                       "OpenMPI's MPI_Allreduce, a reference of bench-allreduce.\n");
                        MPI_Finalize();
                        return 0;
                }
                if (c == 'm' && n_sizes < MAX_SIZES)
                        mib[n_sizes++] = atof(optarg);
                else if (c == 'r')
                        runs = atoi(optarg);
                else if (c == 'w')
                        warmup = atoi(optarg);
                else
                        ok = 0;
        }
        for (int i = 0; i < n_sizes; i++)
                ok &= mib[i] > 0 && mib[i] * (1 << 20) / sizeof(float) <= 0x7fffffff;
        if (!ok || optind != argc || n_sizes == 0 || runs < 1 || warmup < 0 || procs < 2) {
                if (rank == 0)
                        fprintf(stderr,
                                "Usage: mpirun -np N (N >= 2) allreduce-mpi --mib M [--mib M2 ...] --runs R "
                                "[--warmup W]\n"
                                "       (at most %d sizes, each > 0 and under 8 GiB)\n",
                                MAX_SIZES);
                MPI_Finalize();
                return 64; /* EX_USAGE */
        }

        int bad = 0;
        for (int i = 0; i < n_sizes; i++)
                bad |= bench(mib[i], runs, warmup, rank, procs);
        MPI_Finalize();
        return bad;
}
