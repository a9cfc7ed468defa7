/* test_comm_mpi.c: the MPI communicator under mpirun, driven by tests/cli/test_ddp.sh (not a ctest of its own).
 *
 *   test_comm_mpi sum       the deterministic all-reduce is the rank-order sum bit for bit (float, double, int64,
 *                           a count over one gathered piece), broadcast and barrier; the reduce-scatter over uneven
 *                           segments (one over a gathered piece, one empty) is the rank-order sum in each owner's
 *                           segment in the deterministic mode and within fp32 rounding of it otherwise, and the
 *                           all-gather puts every owner's segment on every rank (fp32 and 16-bit values)
 *   test_comm_mpi mismatch  with the signature check, rank 1 all-reduces one element more: every rank fails naming
 *                           the mismatch
 *   test_comm_mpi shards    with the signature check, rank 1 reduce-scatters with other counts (the same total):
 *                           every rank fails naming the mismatch
 *   test_comm_mpi timeout   rank 1 never joins the all-reduce: the others fail after 2 s instead of hanging
 *   test_comm_mpi die       rank 1 exits before the all-reduce: the job ends (mpirun ends the waiting ranks)
 * Prints "rank R: ok" or "rank R: error: MESSAGE"; exits 0 on success, 1 on an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/comm.h"

/* rank r's contribution: values whose sum depends on the order of additions */
static float contrib(int r, size_t i) { return (float)((double)((i * 2654435761u + (size_t)r * 40503u) % 1000003) * 1e-3 / (1 + r)); }

/* Uneven segments over the n elements of x (rank 1's empty, the last one over a gathered piece): reduce-scatter then
 * all-gather, deterministic and not. want holds the rank-order sum of every rank's contribution. */
static int shard_test(snug_comm *c, float *x, const float *want, const float *all, size_t n, snug_error *e) {
    size_t counts[64] = {0};
    if (c->size > 64)
        return 0;
    size_t left = n;
    for (int r = 0; r < c->size - 1; r++)
        left -= (counts[r] = r == 1 ? 0 : 1000 + 37 * (size_t)r);
    counts[c->size - 1] = left;
    size_t d = snug_comm_displ(counts, c->rank), cnt = counts[c->rank];
    for (int det = 1; det >= 0; det--) {
        c->deterministic = det;
        for (size_t i = 0; i < n; i++)
            x[i] = contrib(c->rank, i);
        SNUG_TRY(c->reduce_scatter_sum(c, x, counts, SNUG_COMM_F32, e));
        for (size_t i = 0; i < n; i++) {
            int mine = i >= d && i < d + cnt;
            float w = mine ? want[i] : all[(size_t)c->rank * n + i]; /* the others' segments are left as they were */
            double err = fabs((double)x[i] - (double)w), tol = det || !mine ? 0 : 1e-6 * fabs((double)w) + 1e-30;
            if (err > tol)
                return snug_fail(e, SNUG_EINTERNAL, "%s reduce-scatter: element %zu is %.9g, not %.9g",
                                 det ? "the deterministic" : "the", i, x[i], w);
        }
        for (size_t i = 0; i < n; i++) /* garbage outside the own segment: the all-gather must overwrite it */
            if (i < d || i >= d + cnt)
                x[i] = -1;
            else
                x[i] = want[i];
        SNUG_TRY(c->allgather(c, x, counts, SNUG_COMM_F32, e));
        if (memcmp(x, want, n * sizeof *x))
            return snug_fail(e, SNUG_EINTERNAL, "the all-gather did not give every rank every segment");
    }
    uint16_t h[300]; /* 16-bit values (bf16 parameters): segments of 100 */
    size_t c16[64];
    for (int r = 0; r < c->size; r++)
        c16[r] = 300 / (size_t)c->size + (r == c->size - 1 ? 300 % (size_t)c->size : 0);
    for (size_t i = 0; i < 300; i++)
        h[i] = i >= snug_comm_displ(c16, c->rank) && i < snug_comm_displ(c16, c->rank + 1) ? (uint16_t)(i * 97) : 0;
    SNUG_TRY(c->allgather(c, h, c16, SNUG_COMM_U16, e));
    for (size_t i = 0; i < 300; i++)
        if (h[i] != (uint16_t)(i * 97))
            return snug_fail(e, SNUG_EINTERNAL, "the 16-bit all-gather: element %zu is %u", i, h[i]);
    return 0;
}

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
    SNUG_TRY(shard_test(c, x, want, all, n, e));
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
    } else if (!strcmp(mode, "shards")) {
        c.check = 1;
        float x[8] = {0};
        size_t counts[2][2] = {{4, 4}, {5, 3}};
        if (c.size == 2)
            rc = c.reduce_scatter_sum(&c, x, counts[c.rank == 1], SNUG_COMM_F32, &e);
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
