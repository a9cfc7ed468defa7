/* bench_comm.c: the MPI communicator's collectives alone, on the gradients' size of a data-parallel step (GPT-2
 * 124M: 124,439,808 fp32 elements by default). Run under mpirun; SNUG_MPI_SHM=0 takes MPI's own collectives instead
 * of the intra-node shared-memory path (src/dist/comm_mpi.c), so the two are timed on the same machine:
 *
 *     mpirun -np 2 bench_comm [n] [reps] [det]   # det 1: the deterministic mode (rank-order sums)
 *
 * Rank 0 prints one JSON line: the communicator, and the best and median seconds of the all-reduce, the reduce-
 * scatter and the all-gather over equal shards (each rank's time to the end of the collective; a barrier first). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 124439808;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    snug_error e = {0};
    snug_launch l;
    snug_comm c;
    if (snug_launch_detect(&l, &e) || snug_comm_open(&c, &l, &e)) {
        fprintf(stderr, "bench_comm: %s\n", e.msg);
        return 1;
    }
    c.deterministic = argc > 3 && atoi(argv[3]);
    float *x = malloc(n * sizeof *x);
    size_t *counts = malloc((size_t)c.size * sizeof *counts);
    double *t = malloc((size_t)reps * 3 * sizeof *t);
    if (!x || !counts || !t)
        return 1;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 2654435761u + (size_t)c.rank) % 1000) * 1e-3f;
    for (int r = 0; r < c.size; r++)
        counts[r] = n * (size_t)(r + 1) / (size_t)c.size - n * (size_t)r / (size_t)c.size;
    for (int k = 0; k <= reps; k++) /* the first of each: a warm-up (pages, the window's first touch) */
        for (int op = 0; op < 3; op++) {
            int rc = c.barrier(&c, &e);
            double t0 = now();
            if (!rc)
                rc = op == 0   ? c.allreduce_sum(&c, x, n, SNUG_COMM_F32, &e)
                     : op == 1 ? c.reduce_scatter_sum(&c, x, counts, SNUG_COMM_F32, &e)
                               : c.allgather(&c, x, counts, SNUG_COMM_F32, &e);
            if (rc) {
                fprintf(stderr, "bench_comm: rank %d: %s\n", c.rank, e.msg);
                return 1;
            }
            if (k)
                t[op * reps + k - 1] = now() - t0;
        }
    if (c.rank == 0) {
        printf("{\"comm\": \"%s\", \"ranks\": %d, \"n\": %zu, \"deterministic\": %d", c.name, c.size, n,
               c.deterministic);
        static const char *ops[] = {"allreduce", "reduce_scatter", "allgather"};
        for (int op = 0; op < 3; op++) {
            qsort(t + op * reps, (size_t)reps, sizeof *t, cmp);
            printf(", \"%s_best_s\": %.4f, \"%s_median_s\": %.4f", ops[op], t[op * reps], ops[op],
                   t[op * reps + reps / 2]);
        }
        printf("}\n");
    }
    free(x), free(counts), free(t);
    snug_comm_close(&c);
    return 0;
}
