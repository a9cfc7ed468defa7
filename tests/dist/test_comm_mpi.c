/* test_comm_mpi.c: the MPI communicator under mpirun, driven by tests/cli/test_ddp.sh (not a ctest of its own).
 *
 *   test_comm_mpi sum       the deterministic all-reduce is the rank-order sum bit for bit (float, double, int64,
 *                           a count over one gathered piece), broadcast and barrier; the reduce-scatter over uneven
 *                           segments (one over a gathered piece, one empty) is the rank-order sum in each owner's
 *                           segment in the deterministic mode and within fp32 rounding of it otherwise, and the
 *                           all-gather puts every owner's segment on every rank (fp32 and 16-bit values); then
 *                           point to point (p2p_test): a ring exchange both ways of flagged sends, which deadlocks
 *                           unless they return at once, every value exact; unflagged sends between ranks 0 and 1
 *                           (float64 and 16-bit bit for bit, with the signature check on); a bad peer and a count
 *                           that does not pair are errors
 *   test_comm_mpi paths     the collectives over awkward counts (odd, not divisible by the ranks, over several of
 *                           the shared-memory path's rounds, empty segments) in float, double, int64 and 16-bit:
 *                           the sums are the rank-order sum bit for bit in the deterministic mode (and on the
 *                           shared-memory path in both modes, within fp32 rounding of it on MPI's own), the
 *                           all-gathers exact; prints the communicator's name and a digest of every result, which
 *                           test_ddp.sh compares between the shared-memory path and SNUG_MPI_SHM=0 (MPI's own)
 *   test_comm_mpi split     groups by rank parity, ranked from the last rank down: each group's sum test and its
 *                           point-to-point messages (by the group's ranks), the world's sums still whole after
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

/* ---- paths: every collective on awkward counts, checked against a local reference, digested ---- */

static uint64_t digest = 1469598103934665603ull; /* FNV-1a over every result of the paths test */

static void digest_add(const void *p, size_t bytes) {
    const unsigned char *b = p;
    for (size_t i = 0; i < bytes; i++)
        digest = (digest ^ b[i]) * 1099511628211ull;
}

/* rank r's element i of type dt, written at p */
static void value(void *p, snug_comm_dtype dt, int r, size_t i) {
    if (dt == SNUG_COMM_F32)
        *(float *)p = contrib(r, i);
    else if (dt == SNUG_COMM_F64)
        *(double *)p = (double)contrib(r, i) / 3.0 + 1e-9 * (double)i;
    else if (dt == SNUG_COMM_I64)
        *(int64_t *)p = ((int64_t)1 << 40) * (r + 1) + (int64_t)(i * 7919 % 100003) - 50000;
    else
        *(uint16_t *)p = (uint16_t)(i * 97 + (size_t)r * 13);
}

/* segment counts of n elements: pattern 0 equal shards (the last one the remainder), pattern 1 uneven with rank 1's
 * empty and the last rank's longest */
static void make_counts(size_t *counts, int size, size_t n, int pattern) {
    size_t left = n;
    for (int r = 0; r < size - 1; r++) {
        size_t k = pattern == 0 ? n / (size_t)size : r == 1 ? 0 : n / (size_t)(3 * size) + 1 + (size_t)r;
        counts[r] = k < left ? k : left;
        left -= counts[r];
    }
    counts[size - 1] = left;
}

/* The all-reduce and the reduce-scatter of n elements of dt, and the all-gather; deterministic or not. */
/* flags: 0, or SNUG_COMM_ASYNC (each collective then followed by the wait, as the trainer's buckets and prefetches
 * are): the same results either way */
static int paths_case(snug_comm *c, snug_comm_dtype dt, size_t n, int pattern, int flags, snug_error *e) {
    size_t es = snug_comm_dtype_size(dt), counts[64];
    char *x = malloc(n * es + 1), *want = malloc(n * es + 1), *all = malloc((size_t)c->size * n * es + 1);
    if (!x || !want || !all)
        return snug_fail(e, SNUG_ENOMEM, "out of memory");
    for (int r = 0; r < c->size; r++)
        for (size_t i = 0; i < n; i++)
            value(all + ((size_t)r * n + i) * es, dt, r, i);
    make_counts(counts, c->size, n, pattern);
    size_t d = snug_comm_displ(counts, c->rank), cnt = counts[c->rank];
    int rc = 0;
    if (dt != SNUG_COMM_U16) {
        snug_comm_sum_in_order(want, all, c->size, n, dt);
        for (int det = 1; !rc && det >= 0; det--) {
            c->deterministic = det;
            /* bit for bit: the deterministic mode, the shared-memory path, and integers */
            int exact = det || strcmp(c->name, "mpi") || dt == SNUG_COMM_I64;
            for (int op = 0; !rc && op < 2; op++) {
                memcpy(x, all + (size_t)c->rank * n * es, n * es);
                rc = op == 0 ? c->allreduce_sum(c, x, n, dt | flags, e)
                             : c->reduce_scatter_sum(c, x, counts, dt | flags, e);
                if (!rc && flags)
                    rc = c->wait(c, e);
                for (size_t i = 0; !rc && i < n; i++) {
                    int summed = op == 0 || (i >= d && i < d + cnt); /* the others' segments stay as they were */
                    const char *w = summed ? want + i * es : all + ((size_t)c->rank * n + i) * es, *got = x + i * es;
                    double gv = dt == SNUG_COMM_F32 ? *(const float *)got : *(const double *)got;
                    double wv = dt == SNUG_COMM_F32 ? *(const float *)w : *(const double *)w;
                    int same = !memcmp(got, w, es);
                    if (!same && (exact || !summed || fabs(gv - wv) > 1e-6 * fabs(wv) + 1e-30))
                        rc = snug_fail(e, SNUG_EINTERNAL, "%s %s of %zu %s (pattern %d): element %zu is not the "
                                       "rank-order sum", det ? "the deterministic" : "the", op ? "reduce-scatter" :
                                       "all-reduce", n, dt == SNUG_COMM_F32 ? "float" : dt == SNUG_COMM_F64 ?
                                       "double" : "int64", pattern, i);
                }
                if (!rc && det)
                    digest_add(x, n * es);
            }
        }
    } else {
        memcpy(want, all, n * es); /* the all-gather's reference: segment r from rank r */
        for (int r = 1; r < c->size; r++) {
            size_t dr = snug_comm_displ(counts, r);
            memcpy(want + dr * es, all + ((size_t)r * n + dr) * es, counts[r] * es);
        }
    }
    if (!rc && dt != SNUG_COMM_I64) { /* the all-gather of the reference, garbage outside the own segment */
        memset(x, 0xa5, n * es);
        memcpy(x + d * es, want + d * es, cnt * es);
        rc = c->allgather(c, x, counts, dt | flags, e);
        if (!rc && flags)
            rc = c->wait(c, e);
        if (!rc && memcmp(x, want, n * es))
            rc = snug_fail(e, SNUG_EINTERNAL, "the all-gather of %zu %s (pattern %d) did not give every rank every "
                           "segment", n, dt == SNUG_COMM_U16 ? "16-bit" : "values", pattern);
        if (!rc)
            digest_add(x, n * es);
    }
    free(x), free(want), free(all);
    return rc;
}

static int paths_test(snug_comm *c, snug_error *e) {
    if (c->size > 64)
        return 0;
    /* counts in elements: single ones, odd ones, and over several rounds of the shared-memory path (its buffers
     * are 1 MiB: 256K floats, 128K doubles, 512K 16-bit values) */
    static const size_t ns[] = {1, 2, 3, 7, 1001, 1000003};
    static const snug_comm_dtype dts[] = {SNUG_COMM_F32, SNUG_COMM_F64, SNUG_COMM_I64, SNUG_COMM_U16};
    for (int t = 0; t < 4; t++)
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
            for (int pattern = 0; pattern < 2; pattern++)
                SNUG_TRY(paths_case(c, dts[t], ns[k], pattern, 0, e));
    for (int t = 0; t < 4; t++) /* flagged to overlap with compute */
        SNUG_TRY(paths_case(c, dts[t], 1001, 1, SNUG_COMM_ASYNC, e));
    /* a host-flagged value, as the trainer sums its losses */
    double v = 0.25 * (c->rank + 1), w = 0;
    for (int r = 0; r < c->size; r++)
        w += 0.25 * (r + 1);
    SNUG_TRY(c->allreduce_sum(c, &v, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e));
    if (v != w)
        return snug_fail(e, SNUG_EINTERNAL, "the host-flagged double sum is %.17g, not %.17g", v, w);
    printf("rank %d: %s digest %016llx\n", c->rank, c->name, (unsigned long long)digest);
    return 0;
}

/* ---- point to point ---- */

/* Whether call failed with an error naming want (then cleared), not succeeded or failed otherwise. */
static int fails_naming(int rc, snug_error *e, const char *want) {
    int ok = rc != 0 && strstr(e->msg, want) != NULL;
    if (ok)
        *e = (snug_error){0};
    return ok;
}

/* The messages of c: a ring exchange both ways, pairs of ranks 0 and 1, bad peers. world is this rank's rank in the
 * world, which every value sent carries, so the receiver knows that c's ranks (not the world's) chose the peer. */
static int p2p_test(snug_comm *c, int world, snug_error *e) {
    if (!c->send || !c->recv || c->size > 64)
        return snug_fail(e, SNUG_EINTERNAL, "the %s communicator has no point-to-point messages", c->name);
    double timeout = c->timeout_s;
    int64_t worlds[64] = {0}; /* c's rank r is the world's rank worlds[r] */
    worlds[c->rank] = world;
    SNUG_TRY(c->allreduce_sum(c, worlds, (size_t)c->size, SNUG_COMM_I64, e));
    uint64_t seq = c->seq;
    float v = 1;
    /* bad peers: errors, on every rank, with nothing sent */
    if (!fails_naming(c->send(c, &v, 1, SNUG_COMM_F32, c->size, e), e, "the peer must be another rank") ||
        !fails_naming(c->recv(c, &v, 1, SNUG_COMM_F32, -1, e), e, "the peer must be another rank") ||
        !fails_naming(c->send(c, &v, 1, SNUG_COMM_F32 | SNUG_COMM_ASYNC, c->rank, e), e, "the peer must be another"))
        return snug_fail(e, SNUG_EINTERNAL, "a send or receive to a peer outside the communicator (or to itself) "
                         "did not fail naming it%s%s", e->msg[0] ? ": " : "", e->msg);
    if (c->size < 2)
        return c->seq == seq ? 0 : snug_fail(e, SNUG_EINTERNAL, "the failed messages counted as collectives");
    c->timeout_s = 60; /* a deadlock fails instead of hanging */
    /* the ring, both ways at once: over MPI's eager limit, so a send that waited for its receiver would deadlock */
    size_t n = ((size_t)3 << 20) + 5;
    float *out[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    float *in[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    if (!out[0] || !out[1] || !in[0] || !in[1])
        return snug_fail(e, SNUG_ENOMEM, "out of memory");
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    for (int w = 0; w < 2; w++) /* way 0 to the next rank, way 1 to the previous one */
        for (size_t i = 0; i < n; i++)
            value(&out[w][i], SNUG_COMM_F32, world + 64 * w, i);
    SNUG_TRY(c->send(c, out[0], n, SNUG_COMM_F32 | SNUG_COMM_ASYNC, next, e));
    SNUG_TRY(c->send(c, out[1], n, SNUG_COMM_F32 | SNUG_COMM_ASYNC, prev, e));
    SNUG_TRY(c->recv(c, in[0], n, SNUG_COMM_F32, prev, e));
    SNUG_TRY(c->recv(c, in[1], n, SNUG_COMM_F32, next, e));
    SNUG_TRY(c->wait(c, e));
    for (int w = 0; w < 2; w++)
        for (size_t i = 0; i < n; i++) {
            float want;
            value(&want, SNUG_COMM_F32, (int)worlds[w ? next : prev] + 64 * w, i);
            if (memcmp(&in[w][i], &want, sizeof want))
                return snug_fail(e, SNUG_EINTERNAL, "the ring exchange to the %s rank: element %zu of %zu from rank "
                                 "%d is %.9g, not %.9g", w ? "previous" : "next", i, n, w ? next : prev, in[w][i],
                                 want);
        }
    free(out[0]), free(out[1]), free(in[0]), free(in[1]);
    /* unflagged, between ranks 0 and 1 only (the others must not be needed: the signature check on must not make
     * them collective): float64 over the eager limit from 0 to 1, 16-bit values back, every bit */
    int check = c->check;
    c->check = 1;
    size_t nd = 1000003, nh = 65536 + 3;
    double *d = malloc(nd * sizeof *d);
    uint16_t *h = malloc(nh * sizeof *h);
    if (!d || !h)
        return snug_fail(e, SNUG_ENOMEM, "out of memory");
    static const double odd[] = {-0.0, 5e-324, INFINITY, -INFINITY, 0x1.fffffffffffffp+1023, NAN};
    const size_t nodd = sizeof odd / sizeof *odd;
    for (size_t i = 0; c->rank < 2 && i < nd; i++) {
        value(&d[i], SNUG_COMM_F64, world, i);
        if (i < nodd)
            d[i] = odd[i];
        if (c->rank == 1)
            d[i] = 42; /* garbage, to be overwritten */
    }
    for (size_t i = 0; c->rank < 2 && i < nh; i++)
        h[i] = c->rank == 1 ? (uint16_t)(i * 40503u + (size_t)world) : 7;
    if (c->rank == 0) {
        SNUG_TRY(c->send(c, d, nd, SNUG_COMM_F64, 1, e));
        SNUG_TRY(c->recv(c, h, nh, SNUG_COMM_U16 | SNUG_COMM_HOST, 1, e));
    } else if (c->rank == 1) {
        SNUG_TRY(c->recv(c, d, nd, SNUG_COMM_F64, 0, e));
        SNUG_TRY(c->send(c, h, nh, SNUG_COMM_U16 | SNUG_COMM_HOST, 0, e));
    }
    for (size_t i = 0; c->rank < 2 && i < nd; i++) {
        double want;
        value(&want, SNUG_COMM_F64, (int)worlds[0], i);
        want = i < nodd ? odd[i] : want;
        if (memcmp(&d[i], &want, sizeof want))
            return snug_fail(e, SNUG_EINTERNAL, "the float64 message from rank 0: element %zu is %.17g, not %.17g", i,
                             d[i], want);
    }
    for (size_t i = 0; c->rank < 2 && i < nh; i++)
        if (h[i] != (uint16_t)(i * 40503u + (size_t)worlds[1]))
            return snug_fail(e, SNUG_EINTERNAL, "the 16-bit message from rank 1: element %zu is %u", i, h[i]);
    free(d), free(h);
    c->check = check;
    if (c->seq != seq)
        return snug_fail(e, SNUG_EINTERNAL, "point-to-point messages counted as collectives (seq %llu, not %llu)",
                         (unsigned long long)c->seq, (unsigned long long)seq);
    /* a count that does not pair: 5 elements sent, 7 expected */
    int64_t k[7] = {0};
    if (c->rank == 0)
        SNUG_TRY(c->send(c, k, 5, SNUG_COMM_I64, 1, e));
    else if (c->rank == 1 && !fails_naming(c->recv(c, k, 7, SNUG_COMM_I64, 0, e), e, "of 5 elements where 7 were"))
        return snug_fail(e, SNUG_EINTERNAL, "a receive of 7 elements where 5 were sent did not fail naming it%s%s",
                         e->msg[0] ? ": " : "", e->msg);
    /* a receive that no send pairs: rank 1 fails after 1 s naming it (last: the peer sends nothing more) */
    c->timeout_s = 1;
    if (c->rank == 1 && !fails_naming(c->recv(c, k, 7, SNUG_COMM_I64, 0, e), e,
                                      "recv from rank 0 (7 int64) not complete after 1 s: rank 0 has died"))
        return snug_fail(e, SNUG_EINTERNAL, "a receive that no send pairs did not time out naming it%s%s",
                         e->msg[0] ? ": " : "", e->msg);
    c->timeout_s = timeout;
    printf("rank %d: point to point over %d ranks (%s)\n", world, c->size, c->name);
    return c->barrier(c, e);
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
        if (!rc)
            rc = p2p_test(&c, c.rank, &e);
    } else if (!strcmp(mode, "paths")) {
        rc = paths_test(&c, &e);
    } else if (!strcmp(mode, "split")) {
        /* groups by rank parity, ranked from the last rank down: each group's own sums (the rank-order sum of its
         * ranks, on its own shared window), the world's still whole after */
        snug_comm g;
        int want = (c.size + 1 - c.rank % 2) / 2;
        rc = c.split(&c, c.rank % 2, c.size - c.rank, &g, &e);
        if (!rc && (g.size != want || g.rank != (want - 1 - c.rank / 2)))
            rc = snug_fail(&e, SNUG_EINTERNAL, "split: rank %d of %d in a group of %d, not %d of %d", g.rank, g.size,
                           g.size, want - 1 - c.rank / 2, want);
        if (!rc)
            rc = sum_test(&g, &e);
        if (!rc) /* at 3 ranks, group 0 is world ranks 2 and 0, in that order: its messages go by its own ranks */
            rc = p2p_test(&g, c.rank, &e);
        if (!rc)
            printf("rank %d: group %d of %d ranks (%s)\n", c.rank, c.rank % 2, g.size, g.name);
        int64_t one = 1;
        if (!rc && !(rc = c.allreduce_sum(&c, &one, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, &e)) && one != c.size)
            rc = snug_fail(&e, SNUG_EINTERNAL, "the world's sum after the split is %lld", (long long)one);
        if (!rc)
            snug_comm_close(&g);
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
        if (!strcmp(mode, "mismatch") || !strcmp(mode, "shards")) {
            /* every rank saw every signature, so they still agree: meet once more, so that no rank's exit makes
             * mpirun end another before it has printed its own message */
            snug_error e2 = {0};
            c.check = 0;
            if (!c.barrier(&c, &e2))
                snug_comm_close(&c);
        }
        return 1; /* otherwise without MPI_Finalize: the other ranks no longer agree; mpirun ends them */
    }
    printf("rank %d: ok\n", c.rank);
    snug_comm_close(&c);
    return 0;
}
