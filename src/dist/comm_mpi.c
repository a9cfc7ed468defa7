/* comm_mpi.c: the MPI communicator (host buffers), compiled when CMake finds MPI (see comm.h).
 *
 * Every collective is issued non-blocking and completed by polling, so that `timeout_s` can turn a hang (a rank that
 * died, or one that issued another collective) into an error; the trainer then aborts the job, which mpirun turns
 * into the end of every rank. Counts above INT_MAX elements are sent in pieces. The deterministic all-reduce
 * gathers every rank's contribution piece by piece (at most SNUG_MPI_PIECE elements of each rank at a time, so the
 * scratch, allocated at the first deterministic all-reduce, is size x 8 MiB, not size x the gradients) and sums
 * them in rank order. The sharded collectives go owner by owner: the reduce-scatter reduces segment r to rank r
 * (the deterministic one gathers it there piece by piece and sums in rank order), the all-gather broadcasts segment r
 * from rank r; so any counts work, with no displacement arrays of int and no scratch the size of a shard.
 *
 * The intra-node path. When every rank runs on one host (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) holds them all),
 * the sums and the all-gather go through one MPI-3 shared window instead (MPI_Win_allocate_shared, plain loads and
 * stores): each rank owns two buffers of SNUG_SHM_BYTES in it, and a collective runs in rounds that alternate
 * between them. In a round of a sum, each rank copies the pieces the other ranks own into its buffer (piece r in
 * slot r), waits for all, and owner r adds the ranks' pieces in rank order, ((x_0 + x_1) + x_2) + ... (its own
 * piece read from its buffer x), exactly snug_comm_sum_in_order's arithmetic: the deterministic mode's bits, so both
 * modes take it. The all-reduce cuts each chunk of size x slot elements into size equal pieces, then the owners
 * publish their sums in their own slot and every rank copies them back after a second wait; the reduce-scatter
 * takes piece r from segment r (counts[r] elements, over as many rounds as the longest needs) and keeps it. The
 * all-gather: each owner copies its piece in, a wait, every rank copies the others' out. The wait is a barrier on
 * one counter per rank in the window (each rank raises its own, then reads the others'), polled under the same
 * timeout as an MPI request. Two buffers mean a round's copies never overwrite what a rank may still be reading from
 * the round before: a rank writes buffer b again only after a wait that every rank reached after reading b. The
 * window is size x 2 x 1 MiB (a round stays in the L2 caches; 4 MiB buffers were slower). SNUG_MPI_SHM=0 in the
 * environment keeps MPI's own collectives, the path of ranks on several hosts.
 *
 * Point to point (send, recv; see comm.h). MPI_Isend / MPI_Irecv with one tag on the communicator's own MPI
 * communicator (the collectives have a context of their own, so they never match these), in pieces of at most
 * SNUG_MPI_MAXN elements: MPI keeps the messages between two ranks in order, so the receiver's pieces pair with the
 * sender's. A send or receive is completed by the same polling as a collective, so timeout_s holds and names the
 * peer; a receive checks that each message held the count it expected. A flagged send's requests wait in
 * mpi_ctx.pend for `wait` (mpi_wait), which completes them in order. */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm.h"

#define SNUG_MPI_PIECE ((size_t)1 << 20) /* elements of one rank per deterministic piece */
#define SNUG_MPI_MAXN ((size_t)1 << 30)  /* elements per MPI call (counts are int) */

#define SNUG_SHM_BYTES ((size_t)1 << 20) /* one of a rank's two buffers in the shared window */
#define SNUG_SHM_HEAD ((size_t)4096)      /* a rank's barrier counter, on its own page ahead of its buffers */
#define SNUG_MPI_TAG 77                   /* every point-to-point message */

typedef struct mpi_ctx {
    MPI_Comm comm;
    void *scratch; /* size x SNUG_MPI_PIECE x 8 bytes, for the deterministic all-reduce (NULL until then) */
    /* the intra-node path (see above); shm is 0 without it */
    int shm; /* the path is on */
    MPI_Win win;
    char **seg;       /* (size) each rank's part of the window: its counter, then its two buffers */
    uint64_t gen;     /* shared-memory barriers passed */
    unsigned round;   /* rounds done: the parity picks the buffer of the next */
    size_t *off, *len; /* (size) a round's piece of each owner: element offset in x and count */
    const void **src; /* (size) the sources of a rank-order sum */
    /* the flagged sends not yet waited for (see above): npend of cap */
    struct pend_send {
        MPI_Request req;
        int peer;
    } *pend;
    size_t npend, cap;
} mpi_ctx;

static int mpi_users; /* open MPI communicators: the last one closed finalizes */

/* the types below ignore the flags: every buffer of this communicator is host memory */
static MPI_Datatype mpi_type(snug_comm_dtype dt) {
    dt = snug_comm_type(dt);
    return dt == SNUG_COMM_F32 ? MPI_FLOAT : dt == SNUG_COMM_F64 ? MPI_DOUBLE : dt == SNUG_COMM_U16 ? MPI_UINT16_T
                                                                                                 : MPI_INT64_T;
}

static const char *dtype_name(snug_comm_dtype dt) {
    dt = snug_comm_type(dt);
    return dt == SNUG_COMM_F32 ? "float32" : dt == SNUG_COMM_F64 ? "float64" : dt == SNUG_COMM_U16 ? "16-bit" : "int64";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mpi_failed(snug_error *e, int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return snug_fail(e, SNUG_EIO, "MPI %s failed: %.*s", what, len, s);
}

/* One more poll of a collective (peer < 0) or of a message to or from rank peer, started at t0: fails once
 * c->timeout_s seconds (if > 0) have passed, naming it. */
static int poll_again(snug_comm *c, double t0, long polls, const char *what, int peer, snug_error *e) {
    int late = c->timeout_s > 0 && now_s() - t0 > c->timeout_s; /* the clock read once: a message's timeout is named
                                                                  * as the message's, never as a collective's */
    if (late && peer >= 0)
        return snug_fail(e, SNUG_EIO, "rank %d of %d: %s not complete after %.0f s: rank %d has died, is stuck, or "
                         "has not reached its side of the message (the two ranks must pair their sends and receives "
                         "in the same order); raise dist_timeout if a step really takes this long", c->rank, c->size,
                         what, c->timeout_s, peer);
    if (late)
        return snug_fail(e, SNUG_EIO, "rank %d of %d: collective #%llu (%s) not complete after %.0f s: another "
                         "rank has died, is stuck, or issued a different collective (run with "
                         "dist_debug: true to compare every collective's signature); raise dist_timeout if a "
                         "step really takes this long", c->rank, c->size, (unsigned long long)c->seq, what,
                         c->timeout_s);
    if (polls > 1000) /* let the other ranks of an oversubscribed host run, without sleeping: Open MPI's */
        sched_yield(); /* non-blocking collectives advance only inside MPI_Test, one segment per call */
    return 0;
}

/* Completes req, polling, its status in st (may be MPI_STATUS_IGNORE); fails after c->timeout_s seconds (if > 0),
 * naming the collective (peer < 0) or the message to or from rank peer. */
static int wait_for(snug_comm *c, MPI_Request *req, const char *what, int peer, MPI_Status *st, snug_error *e) {
    double t0 = now_s();
    for (long polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Test(req, &done, st);
        if (rc != MPI_SUCCESS)
            return mpi_failed(e, rc, what);
        if (done)
            return 0;
        SNUG_TRY(poll_again(c, t0, polls, what, peer, e));
    }
}

/* wait_for a collective's request */
static int wait_req(snug_comm *c, MPI_Request *req, const char *what, snug_error *e) {
    return wait_for(c, req, what, -1, MPI_STATUS_IGNORE, e);
}

/* ---- the intra-node path (see the top of the file) ---- */

static _Atomic uint64_t *shm_counter(mpi_ctx *x, int r) { return (_Atomic uint64_t *)x->seg[r]; }

/* rank r's buffer b */
static char *shm_buf(mpi_ctx *x, int r, unsigned b) { return x->seg[r] + SNUG_SHM_HEAD + b * SNUG_SHM_BYTES; }

/* Every rank's stores before its call are visible to every rank after it: each rank raises its counter (release),
 * then waits until every counter has reached it (acquire). Polled under the collective's timeout. */
static int shm_barrier(snug_comm *c, const char *what, snug_error *e) {
    mpi_ctx *x = c->ctx;
    uint64_t g = ++x->gen;
    atomic_store_explicit(shm_counter(x, c->rank), g, memory_order_release);
    double t0 = 0;
    long polls = 0;
    for (int r = 0; r < c->size; r++)
        while (atomic_load_explicit(shm_counter(x, r), memory_order_acquire) < g) {
            if (!polls)
                t0 = now_s();
            SNUG_TRY(poll_again(c, t0, ++polls, what, -1, e));
        }
    return 0;
}

/* One round of a sum: each owner r's piece (x->off[r], x->len[r] <= slot elements of p) summed over the ranks in
 * rank order into the owner's p; with back (the all-reduce), every rank then copies every sum into its p. */
static int shm_sum_round(snug_comm *c, char *p, size_t slot, snug_comm_dtype dt, int back, const char *what,
                         snug_error *e) {
    mpi_ctx *x = c->ctx;
    size_t es = snug_comm_dtype_size(dt);
    int me = c->rank;
    unsigned b = x->round++ & 1;
    char *mine = shm_buf(x, me, b);
    for (int r = 0; r < c->size; r++) /* slot r: this rank's values of r's piece (its own slot stays free) */
        if (r != me)
            memcpy(mine + r * slot * es, p + x->off[r] * es, x->len[r] * es);
    SNUG_TRY(shm_barrier(c, what, e));
    for (int r = 0; r < c->size; r++)
        x->src[r] = r == me ? p + x->off[me] * es : shm_buf(x, r, b) + me * slot * es;
    snug_comm_sum_sources(p + x->off[me] * es, x->src, c->size, x->len[me], dt);
    if (!back)
        return 0;
    memcpy(mine + me * slot * es, p + x->off[me] * es, x->len[me] * es); /* the sum, in this rank's own slot */
    SNUG_TRY(shm_barrier(c, what, e));
    for (int r = 0; r < c->size; r++)
        if (r != me)
            memcpy(p + x->off[r] * es, shm_buf(x, r, b) + r * slot * es, x->len[r] * es);
    return 0;
}

/* The all-reduce: chunks of size x slot elements, each in size pieces of (nearly) equal length. */
static int shm_allreduce(snug_comm *c, char *p, size_t n, snug_comm_dtype dt, const char *what, snug_error *e) {
    mpi_ctx *x = c->ctx;
    size_t slot = SNUG_SHM_BYTES / snug_comm_dtype_size(dt) / (size_t)c->size, chunk = slot * (size_t)c->size;
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        for (int r = 0; r < c->size; r++) {
            x->off[r] = i + m * (size_t)r / (size_t)c->size;
            x->len[r] = i + m * (size_t)(r + 1) / (size_t)c->size - x->off[r];
        }
        SNUG_TRY(shm_sum_round(c, p, slot, dt, 1, what, e));
    }
    return 0;
}

/* Round t's piece of each segment: up to slot elements from t x slot into it. Returns whether any is non-empty. */
static int shm_pieces(mpi_ctx *x, int size, const size_t *counts, size_t t, size_t slot) {
    int any = 0;
    size_t lo = t * slot, d = 0;
    for (int r = 0; r < size; d += counts[r], r++) {
        x->off[r] = d + lo;
        x->len[r] = counts[r] > lo ? (counts[r] - lo < slot ? counts[r] - lo : slot) : 0;
        any |= x->len[r] > 0;
    }
    return any;
}

static int shm_reduce_scatter(snug_comm *c, char *p, const size_t *counts, snug_comm_dtype dt, const char *what,
                              snug_error *e) {
    size_t slot = SNUG_SHM_BYTES / snug_comm_dtype_size(dt) / (size_t)c->size;
    for (size_t t = 0; shm_pieces(c->ctx, c->size, counts, t, slot); t++)
        SNUG_TRY(shm_sum_round(c, p, slot, dt, 0, what, e));
    return 0;
}

static int shm_allgather(snug_comm *c, char *p, const size_t *counts, snug_comm_dtype dt, const char *what,
                         snug_error *e) {
    mpi_ctx *x = c->ctx;
    size_t es = snug_comm_dtype_size(dt), slot = SNUG_SHM_BYTES / es;
    for (size_t t = 0; shm_pieces(x, c->size, counts, t, slot); t++) {
        unsigned b = x->round++ & 1;
        memcpy(shm_buf(x, c->rank, b), p + x->off[c->rank] * es, x->len[c->rank] * es);
        SNUG_TRY(shm_barrier(c, what, e));
        for (int r = 0; r < c->size; r++)
            if (r != c->rank)
                memcpy(p + x->off[r] * es, shm_buf(x, r, b), x->len[r] * es);
    }
    return 0;
}

/* The shared window, when every rank is on this host and SNUG_MPI_SHM is not 0. Every rank reaches the same
 * decision (the split is the same everywhere, and the window's success is agreed); on any failure the ranks keep
 * MPI's own collectives. Called from init, when every rank is there. */
static void shm_open(snug_comm *c, mpi_ctx *x) {
    const char *env = getenv("SNUG_MPI_SHM");
    MPI_Comm node;
    if (c->size < 2 || MPI_Comm_split_type(x->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return;
    int nsize = 0, ok = 0;
    MPI_Comm_size(node, &nsize);
    if (nsize == c->size && !(env && !strcmp(env, "0"))) { /* one host; the key 0 keeps the ranks' order there */
        char *base = NULL;
        ok = MPI_Win_allocate_shared((MPI_Aint)(SNUG_SHM_HEAD + 2 * SNUG_SHM_BYTES), 1, MPI_INFO_NULL, node, &base,
                                     &x->win) == MPI_SUCCESS;
        x->seg = ok ? calloc((size_t)c->size, sizeof *x->seg) : NULL;
        x->off = calloc(2 * (size_t)c->size, sizeof *x->off);
        x->src = calloc((size_t)c->size, sizeof *x->src);
        ok = ok && x->seg && x->off && x->src;
        for (int r = 0; ok && r < c->size; r++) {
            MPI_Aint sz;
            int du;
            ok = MPI_Win_shared_query(x->win, r, &sz, &du, &x->seg[r]) == MPI_SUCCESS &&
                 sz >= (MPI_Aint)(SNUG_SHM_HEAD + 2 * SNUG_SHM_BYTES);
        }
        if (ok)
            atomic_init(shm_counter(x, c->rank), 0);
    }
    /* the agreement, which is also the wait that every counter is zero before any rank's first barrier */
    int all = 0;
    if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, x->comm) != MPI_SUCCESS)
        all = 0;
    x->len = x->off ? x->off + c->size : NULL;
    x->shm = all;
    MPI_Comm_free(&node);
}

/* debug mode: every rank's (sequence, kind, count, dtype, root) against rank 0's, on every rank */
static int check_signature(snug_comm *c, int kind, size_t n, snug_comm_dtype dt, int root, snug_error *e) {
    static const char *kinds[] = {"allreduce_sum", "broadcast", "barrier", "reduce_scatter_sum", "allgather"};
    mpi_ctx *x = c->ctx;
    int64_t mine[5] = {(int64_t)c->seq + 1, kind, (int64_t)n, dt, root};
    int64_t *all = malloc((size_t)c->size * sizeof mine);
    if (!all)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the collective signatures");
    MPI_Request req;
    int rc = MPI_Iallgather(mine, 5, MPI_INT64_T, all, 5, MPI_INT64_T, x->comm, &req);
    if (rc == MPI_SUCCESS)
        rc = wait_req(c, &req, "signature check", e);
    else
        rc = mpi_failed(e, rc, "signature check");
    for (int r = 1; !rc && r < c->size; r++) {
        const int64_t *a = all, *b = all + 5 * r;
        if (memcmp(a, b, sizeof mine)) {
            rc = snug_fail(e, SNUG_EINTERNAL, "collective mismatch: rank 0 issued #%lld %s of %lld %s (root %lld) "
                           "where rank %d issued #%lld %s of %lld %s (root %lld); every rank must issue the same "
                           "collectives in the same order (for the sharded ones, 'root' is a hash of the counts)", (long long)a[0], kinds[a[1] % 5], (long long)a[2],
                           dtype_name((snug_comm_dtype)a[3]), (long long)a[4], r, (long long)b[0], kinds[b[1] % 5],
                           (long long)b[2], dtype_name((snug_comm_dtype)b[3]), (long long)b[4]);
        }
    }
    free(all);
    return rc;
}

/* 16-bit values are moved, never summed */
static int refuse_u16(snug_comm_dtype dt, const char *what, snug_error *e) {
    if (snug_comm_type(dt) != SNUG_COMM_U16)
        return 0;
    return snug_fail(e, SNUG_EINTERNAL, "%s of 16-bit values: sum them in fp32", what);
}

static int mpi_allreduce(snug_comm *c, void *buf, size_t n, snug_comm_dtype dt, snug_error *e) {
    mpi_ctx *x = c->ctx;
    SNUG_TRY(refuse_u16(dt, "an all-reduce", e));
    if (c->check)
        SNUG_TRY(check_signature(c, 0, n, dt, 0, e));
    c->seq++;
    size_t es = snug_comm_dtype_size(dt);
    char *p = buf;
    char what[96];
    snprintf(what, sizeof what, "all-reduce of %zu %s", n, dtype_name(dt));
    if (x->shm)
        return shm_allreduce(c, p, n, dt, what, e);
    if (c->deterministic) {
        if (!x->scratch && !(x->scratch = malloc((size_t)c->size * SNUG_MPI_PIECE * 8)))
            return snug_fail(e, SNUG_ENOMEM, "out of host memory for the deterministic all-reduce's scratch (%d x "
                             "8 MiB)", c->size);
        for (size_t i = 0; i < n; i += SNUG_MPI_PIECE) {
            size_t k = n - i < SNUG_MPI_PIECE ? n - i : SNUG_MPI_PIECE;
            MPI_Request req;
            int rc = MPI_Iallgather(p + i * es, (int)k, mpi_type(dt), x->scratch, (int)k, mpi_type(dt), x->comm,
                                    &req);
            if (rc != MPI_SUCCESS)
                return mpi_failed(e, rc, what);
            SNUG_TRY(wait_req(c, &req, what, e));
            snug_comm_sum_in_order(p + i * es, x->scratch, c->size, k, dt);
        }
        return 0;
    }
    for (size_t i = 0; i < n; i += SNUG_MPI_MAXN) {
        size_t k = n - i < SNUG_MPI_MAXN ? n - i : SNUG_MPI_MAXN;
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, p + i * es, (int)k, mpi_type(dt), MPI_SUM, x->comm, &req);
        if (rc != MPI_SUCCESS)
            return mpi_failed(e, rc, what);
        SNUG_TRY(wait_req(c, &req, what, e));
    }
    return 0;
}

static int mpi_broadcast(snug_comm *c, void *buf, size_t n, snug_comm_dtype dt, int root, snug_error *e) {
    mpi_ctx *x = c->ctx;
    if (c->check)
        SNUG_TRY(check_signature(c, 1, n, dt, root, e));
    c->seq++;
    size_t es = snug_comm_dtype_size(dt);
    char what[96];
    snprintf(what, sizeof what, "broadcast of %zu %s from rank %d", n, dtype_name(dt), root);
    for (size_t i = 0; i < n; i += SNUG_MPI_MAXN) {
        size_t k = n - i < SNUG_MPI_MAXN ? n - i : SNUG_MPI_MAXN;
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + i * es, (int)k, mpi_type(dt), root, x->comm, &req);
        if (rc != MPI_SUCCESS)
            return mpi_failed(e, rc, what);
        SNUG_TRY(wait_req(c, &req, what, e));
    }
    return 0;
}

static int mpi_barrier(snug_comm *c, snug_error *e) {
    mpi_ctx *x = c->ctx;
    if (c->check)
        SNUG_TRY(check_signature(c, 2, 0, SNUG_COMM_I64, 0, e));
    c->seq++;
    MPI_Request req;
    int rc = MPI_Ibarrier(x->comm, &req);
    if (rc != MPI_SUCCESS)
        return mpi_failed(e, rc, "barrier");
    return wait_req(c, &req, "barrier", e);
}

/* The sharded collectives' signature: the total count, and the counts folded into the root field (FNV-1a). */
static int check_sharded(snug_comm *c, int kind, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    uint64_t h = 1469598103934665603ull;
    size_t n = 0;
    for (int r = 0; r < c->size; r++) {
        n += counts[r];
        h = (h ^ (uint64_t)counts[r]) * 1099511628211ull;
    }
    return check_signature(c, kind, n, dt, (int)(h & 0x7fffffff), e);
}

static int mpi_reduce_scatter(snug_comm *c, void *buf, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    mpi_ctx *x = c->ctx;
    SNUG_TRY(refuse_u16(dt, "a reduce-scatter", e));
    if (c->check)
        SNUG_TRY(check_sharded(c, 3, counts, dt, e));
    c->seq++;
    size_t es = snug_comm_dtype_size(dt), d = 0;
    char *p = buf;
    char what[96];
    snprintf(what, sizeof what, "reduce-scatter of %zu %s", snug_comm_displ(counts, c->size), dtype_name(dt));
    if (x->shm)
        return shm_reduce_scatter(c, p, counts, dt, what, e);
    if (c->deterministic && !x->scratch && !(x->scratch = malloc((size_t)c->size * SNUG_MPI_PIECE * 8)))
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the deterministic reduce-scatter's scratch (%d x "
                         "8 MiB)", c->size);
    for (int r = 0; r < c->size; d += counts[r], r++) {
        size_t step = c->deterministic ? SNUG_MPI_PIECE : SNUG_MPI_MAXN;
        for (size_t i = 0; i < counts[r]; i += step) {
            size_t k = counts[r] - i < step ? counts[r] - i : step;
            char *seg = p + (d + i) * es;
            MPI_Request req;
            int rc;
            if (c->deterministic) /* every rank's piece to its owner, summed there in rank order */
                rc = MPI_Igather(seg, (int)k, mpi_type(dt), x->scratch, (int)k, mpi_type(dt), r, x->comm, &req);
            else
                rc = MPI_Ireduce(r == c->rank ? MPI_IN_PLACE : seg, seg, (int)k, mpi_type(dt), MPI_SUM, r, x->comm,
                                 &req);
            if (rc != MPI_SUCCESS)
                return mpi_failed(e, rc, what);
            SNUG_TRY(wait_req(c, &req, what, e));
            if (c->deterministic && r == c->rank)
                snug_comm_sum_in_order(seg, x->scratch, c->size, k, dt);
        }
    }
    return 0;
}

static int mpi_allgather(snug_comm *c, void *buf, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    mpi_ctx *x = c->ctx;
    if (c->check)
        SNUG_TRY(check_sharded(c, 4, counts, dt, e));
    c->seq++;
    size_t es = snug_comm_dtype_size(dt), d = 0;
    char what[96];
    snprintf(what, sizeof what, "all-gather of %zu %s", snug_comm_displ(counts, c->size), dtype_name(dt));
    if (x->shm)
        return shm_allgather(c, buf, counts, dt, what, e);
    for (int r = 0; r < c->size; d += counts[r], r++)
        for (size_t i = 0; i < counts[r]; i += SNUG_MPI_MAXN) {
            size_t k = counts[r] - i < SNUG_MPI_MAXN ? counts[r] - i : SNUG_MPI_MAXN;
            MPI_Request req;
            int rc = MPI_Ibcast((char *)buf + (d + i) * es, (int)k, mpi_type(dt), r, x->comm, &req);
            if (rc != MPI_SUCCESS)
                return mpi_failed(e, rc, what);
            SNUG_TRY(wait_req(c, &req, what, e));
        }
    return 0;
}

/* ---- point to point (see the top of the file) ---- */

/* Room in x->pend for one more flagged send, made before the send is issued so that no request is ever lost. */
static int pend_room(mpi_ctx *x, snug_error *e) {
    if (x->npend < x->cap)
        return 0;
    size_t cap = x->cap ? 2 * x->cap : 16;
    struct pend_send *p = realloc(x->pend, cap * sizeof *p);
    if (!p)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for %zu pending sends", cap);
    x->pend = p, x->cap = cap;
    return 0;
}

/* n elements of dt to rank peer (into 0) or from it (into 1), a piece of at most SNUG_MPI_MAXN elements at a time:
 * a flagged send's pieces join x->pend, every other request is complete before the next piece. */
static int mpi_p2p(snug_comm *c, void *buf, size_t n, snug_comm_dtype dt, int peer, int into, snug_error *e) {
    mpi_ctx *x = c->ctx;
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return snug_fail(e, SNUG_EINTERNAL, "%s rank %d on rank %d of a communicator of %d ranks: the peer must be "
                         "another rank of it (0..%d)", into ? "receive from" : "send to", peer, c->rank, c->size,
                         c->size - 1);
    int async = !into && (dt & SNUG_COMM_ASYNC);
    size_t es = snug_comm_dtype_size(dt);
    char what[96];
    snprintf(what, sizeof what, "%s rank %d (%zu %s)", into ? "recv from" : "send to", peer, n, dtype_name(dt));
    for (size_t i = 0; i < n; i += SNUG_MPI_MAXN) {
        size_t k = n - i < SNUG_MPI_MAXN ? n - i : SNUG_MPI_MAXN;
        char *p = (char *)buf + i * es;
        MPI_Request req;
        if (async)
            SNUG_TRY(pend_room(x, e));
        int rc = into ? MPI_Irecv(p, (int)k, mpi_type(dt), peer, SNUG_MPI_TAG, x->comm, &req)
                      : MPI_Isend(p, (int)k, mpi_type(dt), peer, SNUG_MPI_TAG, x->comm, &req);
        if (rc != MPI_SUCCESS)
            return mpi_failed(e, rc, what);
        if (async) {
            x->pend[x->npend++] = (struct pend_send){req, peer};
            continue;
        }
        MPI_Status st;
        if ((rc = wait_for(c, &req, what, peer, &st, e))) {
            if (into && req != MPI_REQUEST_NULL) { /* MPI no longer writes into buf once the caller has it back */
                MPI_Cancel(&req);
                MPI_Request_free(&req);
            }
            return rc;
        }
        int got = -1;
        if (into && (MPI_Get_count(&st, mpi_type(dt), &got) != MPI_SUCCESS || got != (int)k))
            return snug_fail(e, SNUG_EINTERNAL, "%s: a message of %d elements where %zu were expected: the two ranks' "
                             "sends and receives do not pair (the same order, the same counts and types)", what,
                             got, k);
    }
    return 0;
}

static int mpi_send(snug_comm *c, const void *buf, size_t n, snug_comm_dtype dt, int peer, snug_error *e) {
    return mpi_p2p(c, (void *)buf, n, dt, peer, 0, e); /* MPI_Isend only reads it */
}

static int mpi_recv(snug_comm *c, void *buf, size_t n, snug_comm_dtype dt, int peer, snug_error *e) {
    return mpi_p2p(c, buf, n, dt, peer, 1, e);
}

/* Every flagged send so far complete, in the order issued (the collectives are complete already). */
static int mpi_wait(snug_comm *c, snug_error *e) {
    mpi_ctx *x = c->ctx;
    for (size_t i = 0; i < x->npend; i++) {
        char what[64];
        snprintf(what, sizeof what, "send to rank %d (flagged, at the wait)", x->pend[i].peer);
        SNUG_TRY(wait_for(c, &x->pend[i].req, what, x->pend[i].peer, MPI_STATUS_IGNORE, e)); /* done: NULL */
    }
    x->npend = 0;
    return 0;
}

static void mpi_abort(snug_comm *c, int code) {
    mpi_ctx *x = c->ctx;
    MPI_Abort(x ? x->comm : MPI_COMM_WORLD, code ? code : 1);
}

static void mpi_free(snug_comm *c) {
    mpi_ctx *x = c->ctx;
    if (!x)
        return;
    for (size_t i = 0; i < x->npend; i++) { /* flagged sends never waited for: released, complete or not */
        MPI_Request *r = &x->pend[i].req;
        int done = 0;
        if (*r != MPI_REQUEST_NULL)
            MPI_Test(r, &done, MPI_STATUS_IGNORE); /* complete: r is now MPI_REQUEST_NULL */
        if (*r != MPI_REQUEST_NULL)
            MPI_Request_free(r);
    }
    free(x->pend);
    if (x->shm) /* collective: only where every rank closes (a broken run leaves MPI as it is) */
        MPI_Win_free(&x->win);
    MPI_Comm_free(&x->comm);
    free(x->scratch);
    free(x->seg), free(x->off), free(x->src);
    free(x);
    c->ctx = NULL;
    int fin = 0;
    if (--mpi_users == 0 && MPI_Finalized(&fin) == MPI_SUCCESS && !fin)
        MPI_Finalize();
}

int snug_comm_mpi_available(void) { return 1; }

static int mpi_split(snug_comm *c, int color, int key, snug_comm *out, snug_error *e);

/* c over comm (which it then owns): its rank, size, shared window and functions */
static int mpi_open(snug_comm *c, MPI_Comm comm, snug_error *e) {
    mpi_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        MPI_Comm_free(&comm);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the MPI communicator");
    }
    x->comm = comm;
    MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(x->comm, &c->rank);
    MPI_Comm_size(x->comm, &c->size);
    shm_open(c, x);
    mpi_users++;
    c->name = x->shm ? "mpi-shm" : "mpi";
    c->ctx = x;
    c->allreduce_sum = mpi_allreduce;
    c->broadcast = mpi_broadcast;
    c->barrier = mpi_barrier;
    c->reduce_scatter_sum = mpi_reduce_scatter;
    c->allgather = mpi_allgather;
    c->wait = mpi_wait; /* the collectives are complete when they return; the flagged sends are not */
    c->abort = mpi_abort;
    c->split = mpi_split;
    c->send = mpi_send;
    c->recv = mpi_recv;
    c->free = mpi_free;
    return 0;
}

static int mpi_split(snug_comm *c, int color, int key, snug_comm *out, snug_error *e) {
    mpi_ctx *x = c->ctx;
    MPI_Comm sub;
    int rc = MPI_Comm_split(x->comm, color, key, &sub);
    if (rc != MPI_SUCCESS)
        return mpi_failed(e, rc, "MPI_Comm_split");
    memset(out, 0, sizeof *out);
    SNUG_TRY(mpi_open(out, sub, e));
    out->deterministic = c->deterministic, out->check = c->check, out->timeout_s = c->timeout_s;
    out->local_rank = c->local_rank;
    return 0;
}

int snug_comm_mpi_init(snug_comm *c, snug_error *e) {
    memset(c, 0, sizeof *c);
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited && (rc = MPI_Init(NULL, NULL)) != MPI_SUCCESS)
        return mpi_failed(e, rc, "MPI_Init");
    /* errors come back as codes (reported through snug_error), never as MPI's own abort */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm comm;
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm)) != MPI_SUCCESS)
        return mpi_failed(e, rc, "MPI_Comm_dup");
    SNUG_TRY(mpi_open(c, comm, e));
    c->local_rank = c->rank;
    return 0;
}
