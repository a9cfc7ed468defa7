/* test_comm_mpi.c: the MPI communicator under mpirun, driven by tests/cli/test_ddp.sh (not a ctest of its own).
 *
 *   test_comm_mpi sum       the deterministic all-reduce is the rank-order sum bit for bit (float, double, int64,
 *                           a count over one gathered piece), broadcast and barrier
 *   test_comm_mpi mismatch  with the signature check, rank 1 all-reduces one element more: every rank fails naming
 *                           the mismatch
 *   test_comm_mpi timeout   rank 1 never joins the all-reduce: the others fail after 2 s instead of hanging
 *   test_comm_mpi die       rank 1 exits before the all-reduce: the job ends (mpirun ends the waiting ranks)
 * Prints "rank R: ok" or "rank R: error: MESSAGE"; exits 0 on success, 1 on an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/comm.h"

/* rank r's contribution: values whose sum depends on the order of additions */
static float contrib(int r, size_t i) { return (float)((double)((i * 2654435761u + (size_t)r * 40503u) % 1000003) * 1e-3 / (1 + r)); }

static int sum_test(snug_comm *c, snug_error *e) {
    size_t n = ((size_t)1 << 20) + 37; /* one piece and a bit */
    float *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want);
    float *all = malloc((size_t)c->size * n * sizeof *all);
    if (!x || !want || !all)
        return snug_fail(e, SNUG_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        x[i] = contrib(c->rank, i);
        for (int r = 0; r < c->size; r++)
            all[(size_t)r * n + i] = contrib(r, i);
    }
    snug_comm_sum_in_order(want, all, c->size, n, SNUG_COMM_F32);
    c->deterministic = 1;
    SNUG_TRY(c->allreduce_sum(c, x, n, SNUG_COMM_F32, e));
    if (memcmp(x, want, n * sizeof *x))
        return snug_fail(e, SNUG_EINTERNAL, "the deterministic float sum is not the rank-order sum");
    double d = 0.1 * (c->rank + 1), dw = 0;
    for (int r = 0; r < c->size; r++)
        dw += 0.1 * (r + 1);
    SNUG_TRY(c->allreduce_sum(c, &d, 1, SNUG_COMM_F64, e));
    int64_t k[2] = {c->rank, (int64_t)1 << 40};
    SNUG_TRY(c->allreduce_sum(c, k, 2, SNUG_COMM_I64, e));
    if (d != dw || k[0] != (int64_t)c->size * (c->size - 1) / 2 || k[1] != ((int64_t)1 << 40) * c->size)
        return snug_fail(e, SNUG_EINTERNAL, "the double or int64 sum is wrong");
    int64_t b[3] = {c->rank, c->rank * 7, 11};
    SNUG_TRY(c->broadcast(c, b, 3, SNUG_COMM_I64, c->size - 1, e));
    if (b[0] != c->size - 1 || b[1] != 7 * (c->size - 1))
        return snug_fail(e, SNUG_EINTERNAL, "broadcast from the last rank is wrong");
    SNUG_TRY(c->barrier(c, e));
    free(x), free(want), free(all);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "sum";
    snug_error e = {0};
    snug_launch l;
    snug_comm c;
    int rc = snug_launch_detect(&l, &e);
    if (!rc)
        rc = snug_comm_open(&c, &l, &e);
    if (rc) {
        printf("rank ?: error: %s\n", e.msg);
        return 1;
    }
    if (!strcmp(mode, "sum")) {
        rc = sum_test(&c, &e);
    } else if (!strcmp(mode, "mismatch")) {
        c.check = 1;
        float x[4] = {1, 2, 3, 4};
        rc = c.allreduce_sum(&c, x, c.rank == 1 ? 4 : 3, SNUG_COMM_F32, &e);
    } else if (!strcmp(mode, "die")) {
        c.timeout_s = 60;
        float x = 1;
        if (c.rank == 1)
            _exit(9);
        rc = c.allreduce_sum(&c, &x, 1, SNUG_COMM_F32, &e);
    } else if (!strcmp(mode, "timeout")) {
        c.timeout_s = 2;
        float x = 1;
        if (c.rank == 1)
            sleep(30); /* stuck: never joins */
        else
            rc = c.allreduce_sum(&c, &x, 1, SNUG_COMM_F32, &e);
    }
    if (rc) {
        printf("rank %d: error: %s\n", c.rank, e.msg);
        fflush(stdout);
        return 1; /* without MPI_Finalize: the other ranks no longer agree; mpirun ends them */
    }
    printf("rank %d: ok\n", c.rank);
    snug_comm_close(&c);
    return 0;
}
