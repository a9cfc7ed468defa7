/* comm_nccl.c: the NCCL communicator (device buffers on CUDA ranks; see comm.h), compiled with the CUDA backend.
 *
 * NCCL is opened at run time and a rank joins within dist_timeout: comm_nccl_lib.c, which declares the part of NCCL's
 * ABI used here.
 *
 * Bootstrap: the communicator wraps a host communicator already open (self for one rank, MPI for several). Every rank
 * opens NCCL and the ranks agree that all could; rank 0 makes the unique id and broadcasts it through the host
 * communicator; each makes its stream and events, the ranks agree again, and each joins on the backend's GPU, for
 * dist_timeout at most (join_timed). One rank alone needs no MPI.
 *
 * Streams and events: collectives run on the communicator's own stream. Each records `ready` on the backend's compute
 * stream and makes its stream wait for it (so it reads what the ops queued before it wrote), issues its NCCL calls,
 * records a completion event on its stream and makes the compute stream wait for that (so the ops queued after it
 * read the result), unless it is flagged SNUG_COMM_ASYNC: then it records `async_done` instead, and the compute stream
 * waits for that only at the next `wait` (comm.h), so the ops queued in between run beside it. The host never waits
 * for a collective: it learns of one's failure at a later collective, when a completion event reports an error,
 * ncclCommGetAsyncError does, or (dist_timeout) one has not completed in time.
 * With a timeout a watch thread polls the pending completion events and the asynchronous error every millisecond; on
 * expiry it aborts the NCCL communicator (which ends its kernels, so every stream waiting on them moves on) and every
 * later call on this rank fails with the reason; the other ranks' watches expire the same way, or mpirun ends them.
 *
 * Host buffers (SNUG_COMM_HOST in the type) go to the wrapped host communicator, after the same failure check, with
 * the same sequence number and signature check, so one stream of collectives mixes both kinds. A buffer passed
 * without the flag must be device memory (cudaPointerGetAttributes checks it): a call site that forgot the flag fails
 * naming the collective instead of handing NCCL a host pointer.
 *
 * The sharded collectives over explicit, uneven counts: NCCL's own ncclReduceScatter and ncclAllGather need equal
 * counts per rank, and padding to the largest shard would need a padded copy of the buffer. Instead one NCCL group
 * issues one collective per owner segment, in place: the reduce-scatter an ncclReduce of segment r to rank r, the
 * all-gather an ncclBroadcast of segment r from rank r. Each is exact (a broadcast moves bytes; a reduce sums as
 * NCCL's algorithm does, which the deterministic mode replaces), any counts work, zero counts are skipped, and the
 * group lets NCCL run the segments concurrently.
 *
 * Deterministic mode: the rank-order sum of snug_comm_sum_in_order, bit for bit. The all-reduce all-gathers every
 * rank's contribution piece by piece (SNUG_NCCL_PIECE elements of each rank at a time) into a device scratch of
 * size x SNUG_NCCL_PIECE x 8 bytes (allocated when the communicator is made in deterministic mode, else at the first
 * deterministic collective) and a small kernel (comm_nccl_sum.cu) adds the ranks in order; the reduce-scatter sends
 * each piece of segment r to its owner (ncclSend / ncclRecv in one group) and the owner adds them in rank order. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/backend_cuda_stream.h"
#include "dist/comm.h"
#include "dist/comm_nccl_lib.h"

/* comm_nccl_sum.cu */
int snug_nccl_sum_in_order(void *out, const void *all, int size, size_t n, int dt, void *stream);

/* ------------------------------------------------------------------------------------------------ the context */

#define SNUG_NCCL_PENDING 64              /* collectives in flight before the host waits for the oldest */

typedef struct pending {
    cudaEvent_t done; /* recorded on the communicator's stream after the collective */
    int busy;
    double t0;        /* when it was issued */
    char what[96];
} pending;

typedef struct nccl_ctx {
    snug_comm host;         /* the communicator this one was bootstrapped from: host buffers and signatures */
    nccl_comm_t comm;       /* NULL once aborted */
    int device;
    cudaStream_t stream;    /* the collectives */
    cudaStream_t compute;   /* the backend's */
    cudaEvent_t ready;      /* recorded on compute before each collective */
    cudaEvent_t async_done; /* recorded on stream after each SNUG_COMM_ASYNC collective */
    int async_pending;      /* one was issued since the last wait */
    pending ring[SNUG_NCCL_PENDING];
    int next;               /* the slot the next collective takes */
    void *scratch;          /* deterministic mode: size x SNUG_NCCL_PIECE x 8 bytes */
    pthread_mutex_t mu;     /* the ring, comm and the failure, shared with the watch thread */
    pthread_t watch;
    int watching, stop;
    double timeout_s;       /* the watch's copy of c->timeout_s */
    int failed;             /* a collective failed or timed out: every later call fails with why */
    char why[512];
} nccl_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *type_name(snug_comm_dtype dt) {
    dt = snug_comm_type(dt);
    return dt == SNUG_COMM_F32 ? "float32" : dt == SNUG_COMM_F64 ? "float64" : dt == SNUG_COMM_U16 ? "16-bit" : "int64";
}

static int nccl_type(snug_comm_dtype dt) {
    dt = snug_comm_type(dt);
    return dt == SNUG_COMM_F32 ? NCCL_FLOAT32 : dt == SNUG_COMM_F64 ? NCCL_FLOAT64 : NCCL_INT64;
}

/* With x->mu held: marks the communicator failed with the reason and aborts it, once. */
static void fail_locked(nccl_ctx *x, const char *fmt, const char *what, const char *detail) {
    if (x->failed)
        return;
    x->failed = 1;
    snprintf(x->why, sizeof x->why, fmt, what, detail);
    if (x->comm) {
        snug_nccl.CommAbort(x->comm);
        x->comm = NULL;
    }
}

/* With x->mu held: retires the completed collectives; marks the communicator failed (and aborts it) when one
 * reports an error, has not completed after timeout_s (> 0), or NCCL reports an asynchronous error. */
static void poll_locked(nccl_ctx *x, double timeout_s) {
    if (x->failed)
        return;
    double t = now_s();
    for (int i = 0; i < SNUG_NCCL_PENDING && !x->failed; i++) {
        pending *p = &x->ring[i];
        if (!p->busy)
            continue;
        cudaError_t q = cudaEventQuery(p->done);
        if (q == cudaSuccess) {
            p->busy = 0;
        } else if (q != cudaErrorNotReady) {
            (void)cudaGetLastError();
            fail_locked(x, "NCCL %s failed on the GPU: %s", p->what, cudaGetErrorString(q));
        } else if (timeout_s > 0 && t - p->t0 > timeout_s) {
            char d[160];
            snprintf(d, sizeof d, "%.0f s (dist_timeout): a rank died, hangs, or issued another collective; the NCCL "
                     "communicator was aborted", timeout_s);
            fail_locked(x, "NCCL %s did not complete in %s", p->what, d);
        }
    }
    nccl_result ar = NCCL_OK;
    if (!x->failed && x->comm && snug_nccl.CommGetAsyncError(x->comm, &ar) == NCCL_OK && ar != NCCL_OK &&
        ar != NCCL_IN_PROGRESS) {
        char d[320];
        snprintf(d, sizeof d, "%s (%s)", snug_nccl.GetErrorString(ar), snug_nccl.GetLastError(x->comm));
        fail_locked(x, "NCCL reported an error %s: %s", "after a collective", d);
    }
}

/* The watch thread (dist_timeout > 0): polls every millisecond until stopped. */
static void *watch_main(void *arg) {
    nccl_ctx *x = arg;
    cudaSetDevice(x->device);
    for (;;) {
        pthread_mutex_lock(&x->mu);
        int stop = x->stop;
        if (!stop)
            poll_locked(x, x->timeout_s);
        pthread_mutex_unlock(&x->mu);
        if (stop)
            return NULL;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* With x->mu held: the failure as the caller's error. */
static int failed_locked(const nccl_ctx *x, snug_error *e) {
    return snug_fail(e, SNUG_EIO, "%s", x->why);
}

/* Before every collective: any earlier one's failure fails this one; a timeout starts the watch thread. */
static int precheck(snug_comm *c, snug_error *e) {
    nccl_ctx *x = c->ctx;
    if (c->timeout_s > 0 && !x->watching) {
        x->timeout_s = c->timeout_s;
        x->stop = 0;
        if (pthread_create(&x->watch, NULL, watch_main, x) == 0)
            x->watching = 1;
        else
            return snug_fail(e, SNUG_ENOMEM, "cannot start the NCCL communicator's watch thread (dist_timeout)");
    }
    pthread_mutex_lock(&x->mu);
    x->timeout_s = c->timeout_s;
    poll_locked(x, c->timeout_s);
    int rc = x->failed ? failed_locked(x, e) : 0;
    pthread_mutex_unlock(&x->mu);
    return rc;
}

/* The host communicator, with this one's settings. */
static snug_comm *host_of(snug_comm *c) {
    nccl_ctx *x = c->ctx;
    x->host.deterministic = c->deterministic;
    x->host.timeout_s = c->timeout_s;
    x->host.check = 0; /* the signatures are this communicator's (below) */
    return &x->host;
}

/* debug mode: every rank's (sequence, kind, count, type, root) against rank 0's, through the host communicator */
static int check_signature(snug_comm *c, int kind, size_t n, snug_comm_dtype dt, int root, snug_error *e) {
    static const char *kinds[] = {"allreduce_sum", "broadcast", "barrier", "reduce_scatter_sum", "allgather"};
    snug_comm *h = host_of(c);
    int64_t mine[5] = {(int64_t)c->seq + 1, kind, (int64_t)n, dt, root};
    int64_t *all = calloc((size_t)c->size, sizeof mine);
    size_t *counts = malloc((size_t)c->size * sizeof *counts);
    int rc = 0;
    if (!all || !counts) {
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the collective signatures");
    } else {
        for (int r = 0; r < c->size; r++)
            counts[r] = 5;
        memcpy(all + 5 * c->rank, mine, sizeof mine);
        rc = h->allgather(h, all, counts, SNUG_COMM_I64 | SNUG_COMM_HOST, e);
    }
    for (int r = 1; !rc && r < c->size; r++) {
        const int64_t *a = all, *b = all + 5 * r;
        if (memcmp(a, b, sizeof mine))
            rc = snug_fail(e, SNUG_EINTERNAL, "collective mismatch: rank 0 issued #%lld %s of %lld %s%s (root %lld) "
                           "where rank %d issued #%lld %s of %lld %s%s (root %lld); every rank must issue the same "
                           "collectives in the same order (for the sharded ones, 'root' is a hash of the counts)",
                           (long long)a[0], kinds[a[1] % 5], (long long)a[2], type_name((snug_comm_dtype)a[3]),
                           a[3] & SNUG_COMM_HOST ? " in host memory" : "", (long long)a[4], r, (long long)b[0],
                           kinds[b[1] % 5], (long long)b[2], type_name((snug_comm_dtype)b[3]),
                           b[3] & SNUG_COMM_HOST ? " in host memory" : "", (long long)b[4]);
    }
    free(all);
    free(counts);
    return rc;
}

/* The sharded collectives' signature: the total count, and the counts folded into the root field (FNV-1a), as the
 * MPI communicator's. */
static int check_sharded(snug_comm *c, int kind, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    uint64_t h = 1469598103934665603ull;
    size_t n = 0;
    for (int r = 0; r < c->size; r++) {
        n += counts[r];
        h = (h ^ (uint64_t)counts[r]) * 1099511628211ull;
    }
    return check_signature(c, kind, n, dt, (int)(h & 0x7fffffff), e);
}

/* A buffer passed without SNUG_COMM_HOST must be the device's. */
static int device_buffer(const void *p, const char *what, snug_error *e) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) == cudaSuccess &&
        (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged))
        return 0;
    (void)cudaGetLastError();
    return snug_fail(e, SNUG_EINTERNAL, "NCCL %s of a buffer that is not device memory (%p): a host buffer must be "
                     "flagged SNUG_COMM_HOST at the call site", what, p);
}

/* Starts a device collective: x->mu is taken (and held until issue_end) once the slot it will complete in is free
 * and every earlier failure is reported; the communicator's stream waits for the compute stream's work so far. */
static int issue_begin(snug_comm *c, const char *what, pending **slot, snug_error *e) {
    nccl_ctx *x = c->ctx;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        poll_locked(x, c->timeout_s);
        if (x->failed) {
            int rc = failed_locked(x, e);
            pthread_mutex_unlock(&x->mu);
            return rc;
        }
        if (!x->ring[x->next].busy)
            break;
        /* SNUG_NCCL_PENDING collectives in flight: wait for the oldest (the only host wait; dist_timeout holds) */
        pthread_mutex_unlock(&x->mu);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&x->mu);
    }
    *slot = &x->ring[x->next];
    cudaError_t err = cudaEventRecord(x->ready, x->compute);
    if (err == cudaSuccess)
        err = cudaStreamWaitEvent(x->stream, x->ready, 0);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        fail_locked(x, "NCCL %s: ordering after the compute stream failed: %s", what, cudaGetErrorString(err));
        int rc = failed_locked(x, e);
        pthread_mutex_unlock(&x->mu);
        return rc;
    }
    return 0;
}

/* Ends a device collective begun by issue_begin (which took x->mu): nrc is the NCCL calls' first failure (NCCL_OK:
 * none), cerr a CUDA launch's; on success the completion event is recorded and the compute stream waits for it, or
 * with SNUG_COMM_ASYNC in dt, async_done is recorded for the next wait instead. */
static int issue_end(snug_comm *c, pending *p, const char *what, nccl_result nrc, cudaError_t cerr, int dt,
                     snug_error *e) {
    nccl_ctx *x = c->ctx;
    if (nrc != NCCL_OK && nrc != NCCL_IN_PROGRESS) {
        char d[320];
        snprintf(d, sizeof d, "%s (%s)", snug_nccl.GetErrorString(nrc), x->comm ? snug_nccl.GetLastError(x->comm) : "");
        fail_locked(x, "NCCL %s failed: %s", what, d);
    } else if (cerr == cudaSuccess) {
        cerr = cudaEventRecord(p->done, x->stream);
        if (cerr == cudaSuccess && (dt & SNUG_COMM_ASYNC)) {
            cerr = cudaEventRecord(x->async_done, x->stream);
            x->async_pending = 1;
        } else if (cerr == cudaSuccess) {
            cerr = cudaStreamWaitEvent(x->compute, p->done, 0);
        }
    }
    if (!x->failed && cerr != cudaSuccess) {
        (void)cudaGetLastError();
        fail_locked(x, "NCCL %s: %s", what, cudaGetErrorString(cerr));
    }
    int rc = 0;
    if (x->failed) {
        rc = failed_locked(x, e);
    } else {
        p->busy = 1;
        p->t0 = now_s();
        snprintf(p->what, sizeof p->what, "%s", what);
        x->next = (x->next + 1) % SNUG_NCCL_PENDING;
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

/* The deterministic scratch: size x SNUG_NCCL_PIECE x 8 bytes of device memory, once. */
static int need_scratch(snug_comm *c, snug_error *e) {
    nccl_ctx *x = c->ctx;
    if (x->scratch)
        return 0;
    size_t bytes = SNUG_NCCL_SCRATCH_BYTES(c->size);
    if (cudaMalloc(&x->scratch, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        x->scratch = NULL;
        return snug_fail(e, SNUG_ENOMEM, "out of device memory for the deterministic collectives' scratch (%d x 8 "
                         "MiB)", c->size);
    }
    return 0;
}

/* 16-bit values are moved, never summed */
static int refuse_u16(snug_comm_dtype dt, const char *what, snug_error *e) {
    if (snug_comm_type(dt) != SNUG_COMM_U16)
        return 0;
    return snug_fail(e, SNUG_EINTERNAL, "%s of 16-bit values: sum them in fp32", what);
}

/* ------------------------------------------------------------------------------------------------ collectives */

static int nccl_allreduce(snug_comm *c, void *buf, size_t n, snug_comm_dtype dt, snug_error *e) {
    nccl_ctx *x = c->ctx;
    SNUG_TRY(refuse_u16(dt, "an all-reduce", e));
    SNUG_TRY(precheck(c, e));
    if (c->check)
        SNUG_TRY(check_signature(c, 0, n, dt, 0, e));
    c->seq++;
    if (dt & SNUG_COMM_HOST) {
        snug_comm *h = host_of(c);
        return h->allreduce_sum(h, buf, n, dt, e);
    }
    char what[96];
    snprintf(what, sizeof what, "all-reduce of %zu %s", n, type_name(dt));
    if (!n)
        return 0;
    SNUG_TRY(device_buffer(buf, what, e));
    if (c->deterministic)
        SNUG_TRY(need_scratch(c, e));
    pending *p;
    SNUG_TRY(issue_begin(c, what, &p, e));
    size_t es = snug_comm_dtype_size(dt);
    char *b = buf;
    nccl_result nrc = NCCL_OK;
    cudaError_t cerr = cudaSuccess;
    if (!c->deterministic) {
        nrc = snug_nccl.AllReduce(b, b, n, nccl_type(dt), NCCL_SUM, x->comm, x->stream);
    } else { /* every rank's piece side by side, then added in rank order */
        for (size_t i = 0; i < n && nrc == NCCL_OK && cerr == cudaSuccess; i += SNUG_NCCL_PIECE) {
            size_t k = n - i < SNUG_NCCL_PIECE ? n - i : SNUG_NCCL_PIECE;
            nrc = snug_nccl.AllGather(b + i * es, x->scratch, k, nccl_type(dt), x->comm, x->stream);
            if (nrc == NCCL_OK)
                cerr = (cudaError_t)snug_nccl_sum_in_order(b + i * es, x->scratch, c->size, k, snug_comm_type(dt),
                                                           x->stream);
        }
    }
    return issue_end(c, p, what, nrc, cerr, dt, e);
}

static int nccl_broadcast(snug_comm *c, void *buf, size_t n, snug_comm_dtype dt, int root, snug_error *e) {
    nccl_ctx *x = c->ctx;
    SNUG_TRY(precheck(c, e));
    if (c->check)
        SNUG_TRY(check_signature(c, 1, n, dt, root, e));
    c->seq++;
    if (root < 0 || root >= c->size)
        return snug_fail(e, SNUG_EINTERNAL, "broadcast from rank %d in a run of %d ranks", root, c->size);
    if (dt & SNUG_COMM_HOST) {
        snug_comm *h = host_of(c);
        return h->broadcast(h, buf, n, dt, root, e);
    }
    char what[96];
    snprintf(what, sizeof what, "broadcast of %zu %s from rank %d", n, type_name(dt), root);
    if (!n)
        return 0;
    SNUG_TRY(device_buffer(buf, what, e));
    pending *p;
    SNUG_TRY(issue_begin(c, what, &p, e));
    nccl_result nrc = snug_nccl.Broadcast(buf, buf, n * snug_comm_dtype_size(dt), NCCL_UINT8, root, x->comm, x->stream);
    return issue_end(c, p, what, nrc, cudaSuccess, dt, e);
}

/* Every rank's device collectives so far complete (polled, under dist_timeout), then the host barrier. */
static int nccl_barrier(snug_comm *c, snug_error *e) {
    nccl_ctx *x = c->ctx;
    SNUG_TRY(precheck(c, e));
    if (c->check)
        SNUG_TRY(check_signature(c, 2, 0, SNUG_COMM_I64, 0, e));
    c->seq++;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        poll_locked(x, c->timeout_s);
        int busy = 0;
        for (int i = 0; i < SNUG_NCCL_PENDING; i++)
            busy |= x->ring[i].busy;
        int rc = x->failed ? failed_locked(x, e) : 0;
        pthread_mutex_unlock(&x->mu);
        if (rc)
            return rc;
        if (!busy)
            break;
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    snug_comm *h = host_of(c);
    return h->barrier(h, e);
}

static int nccl_reduce_scatter(snug_comm *c, void *buf, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    nccl_ctx *x = c->ctx;
    SNUG_TRY(refuse_u16(dt, "a reduce-scatter", e));
    SNUG_TRY(precheck(c, e));
    if (c->check)
        SNUG_TRY(check_sharded(c, 3, counts, dt, e));
    c->seq++;
    if (dt & SNUG_COMM_HOST) {
        snug_comm *h = host_of(c);
        return h->reduce_scatter_sum(h, buf, counts, dt, e);
    }
    size_t n = snug_comm_displ(counts, c->size), es = snug_comm_dtype_size(dt), d = 0;
    char what[96];
    snprintf(what, sizeof what, "reduce-scatter of %zu %s", n, type_name(dt));
    if (!n)
        return 0;
    SNUG_TRY(device_buffer(buf, what, e));
    if (c->deterministic)
        SNUG_TRY(need_scratch(c, e));
    pending *p;
    SNUG_TRY(issue_begin(c, what, &p, e));
    char *b = buf;
    int t = nccl_type(dt);
    nccl_result nrc = NCCL_OK;
    cudaError_t cerr = cudaSuccess;
    if (!c->deterministic) { /* one reduce per owner segment, in place, in one group */
        nrc = snug_nccl.GroupStart();
        for (int r = 0; r < c->size && nrc == NCCL_OK; d += counts[r], r++)
            if (counts[r])
                nrc = snug_nccl.Reduce(b + d * es, b + d * es, counts[r], t, NCCL_SUM, r, x->comm, x->stream);
        nccl_result g = snug_nccl.GroupEnd();
        nrc = nrc != NCCL_OK ? nrc : g;
    } else { /* each piece of segment r from every rank to its owner, added there in rank order */
        for (int r = 0; r < c->size && nrc == NCCL_OK && cerr == cudaSuccess; d += counts[r], r++)
            for (size_t i = 0; i < counts[r] && nrc == NCCL_OK && cerr == cudaSuccess; i += SNUG_NCCL_PIECE) {
                size_t k = counts[r] - i < SNUG_NCCL_PIECE ? counts[r] - i : SNUG_NCCL_PIECE;
                char *seg = b + (d + i) * es, *mine = (char *)x->scratch + (size_t)c->rank * k * es;
                if (r == c->rank) /* the owner's own piece: a copy, before the group */
                    cerr = cudaMemcpyAsync(mine, seg, k * es, cudaMemcpyDeviceToDevice, x->stream);
                if (cerr != cudaSuccess)
                    break;
                nrc = snug_nccl.GroupStart();
                for (int q = 0; r == c->rank && q < c->size && nrc == NCCL_OK; q++)
                    if (q != r)
                        nrc = snug_nccl.Recv((char *)x->scratch + (size_t)q * k * es, k, t, q, x->comm, x->stream);
                if (r != c->rank && nrc == NCCL_OK)
                    nrc = snug_nccl.Send(seg, k, t, r, x->comm, x->stream);
                nccl_result g = snug_nccl.GroupEnd();
                nrc = nrc != NCCL_OK ? nrc : g;
                if (nrc == NCCL_OK && r == c->rank)
                    cerr = (cudaError_t)snug_nccl_sum_in_order(seg, x->scratch, c->size, k, snug_comm_type(dt),
                                                               x->stream);
            }
    }
    return issue_end(c, p, what, nrc, cerr, dt, e);
}

static int nccl_allgather(snug_comm *c, void *buf, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    nccl_ctx *x = c->ctx;
    SNUG_TRY(precheck(c, e));
    if (c->check)
        SNUG_TRY(check_sharded(c, 4, counts, dt, e));
    c->seq++;
    if (dt & SNUG_COMM_HOST) {
        snug_comm *h = host_of(c);
        return h->allgather(h, buf, counts, dt, e);
    }
    size_t n = snug_comm_displ(counts, c->size), es = snug_comm_dtype_size(dt), d = 0;
    char what[96];
    snprintf(what, sizeof what, "all-gather of %zu %s", n, type_name(dt));
    if (!n)
        return 0;
    SNUG_TRY(device_buffer(buf, what, e));
    pending *p;
    SNUG_TRY(issue_begin(c, what, &p, e));
    char *b = buf;
    nccl_result nrc = snug_nccl.GroupStart(); /* one broadcast per owner segment, in place, in one group */
    for (int r = 0; r < c->size && nrc == NCCL_OK; d += counts[r], r++)
        if (counts[r])
            nrc = snug_nccl.Broadcast(b + d * es, b + d * es, counts[r] * es, NCCL_UINT8, r, x->comm, x->stream);
    nccl_result g = snug_nccl.GroupEnd();
    return issue_end(c, p, what, nrc != NCCL_OK ? nrc : g, cudaSuccess, dt, e);
}

/* The compute stream waits for every SNUG_COMM_ASYNC collective so far: they run in order on the communicator's
 * stream, so the last one's event covers them all. No host wait. */
static int nccl_wait(snug_comm *c, snug_error *e) {
    nccl_ctx *x = c->ctx;
    pthread_mutex_lock(&x->mu);
    int rc = 0;
    if (x->failed) {
        rc = failed_locked(x, e);
    } else if (x->async_pending) {
        cudaError_t err = cudaStreamWaitEvent(x->compute, x->async_done, 0);
        x->async_pending = 0;
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            fail_locked(x, "NCCL %s: %s", "wait for the collectives overlapped with compute", cudaGetErrorString(err));
            rc = failed_locked(x, e);
        }
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static void nccl_abort(snug_comm *c, int code) {
    nccl_ctx *x = c->ctx;
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    if (x->comm) {
        snug_nccl.CommAbort(x->comm);
        x->comm = NULL;
    }
    pthread_mutex_unlock(&x->mu);
    if (x->host.abort)
        x->host.abort(&x->host, code);
}

/* Releases the device resources of x (the NCCL communicator destroyed, or aborted when a collective failed). */
static void release(nccl_ctx *x) {
    if (x->watching) {
        pthread_mutex_lock(&x->mu);
        x->stop = 1;
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->watch, NULL);
        x->watching = 0;
    }
    if (x->comm) { /* destroyed when all went well; aborted otherwise (no wait for ranks that may be gone) */
        if (!x->failed && cudaStreamSynchronize(x->stream) == cudaSuccess)
            snug_nccl.CommDestroy(x->comm);
        else
            snug_nccl.CommAbort(x->comm);
        x->comm = NULL;
    }
    for (int i = 0; i < SNUG_NCCL_PENDING; i++)
        if (x->ring[i].done)
            cudaEventDestroy(x->ring[i].done);
    if (x->ready)
        cudaEventDestroy(x->ready);
    if (x->async_done)
        cudaEventDestroy(x->async_done);
    if (x->stream)
        cudaStreamDestroy(x->stream);
    if (x->scratch)
        cudaFree(x->scratch);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&x->mu);
}

static void nccl_free(snug_comm *c) {
    nccl_ctx *x = c->ctx;
    if (!x)
        return;
    release(x);
    snug_comm_close(&x->host);
    free(x);
    c->ctx = NULL;
}

/* ------------------------------------------------------------------------------------------------ bootstrap */

/* Whether every rank of host communicator h succeeded (rc == 0): one rank's failure fails all, the others naming
 * it as another rank's. */
static int agree(snug_comm *h, int rc, const char *what, snug_error *e) {
    int64_t failed = rc != 0;
    snug_error ae = {0};
    if (h->allreduce_sum(h, &failed, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, &ae))
        return rc ? rc : (e ? (*e = ae, ae.code) : ae.code);
    if (!rc && failed)
        return snug_fail(e, SNUG_EINPUT, "another rank could not %s (its message says why)", what);
    return rc;
}

int snug_comm_nccl_available(void) { return 1; }

int snug_comm_nccl_wrap(snug_comm *c, snug_backend *be, snug_error *e) {
    if (!(be->caps & SNUG_CAP_CUDA_MEMORY))
        return snug_fail(e, SNUG_EINTERNAL, "the NCCL communicator needs the CUDA backend, not %s", be->name);
    snug_error le = {0};
    int rc = snug_nccl_load(&le);
    if ((rc = agree(c, rc, "open NCCL", e)) && le.code)
        *e = le;
    if (rc)
        return rc;
    /* rank 0's unique id to every rank: [0] rank 0's status, [1..16] the id */
    int64_t msg[1 + sizeof(nccl_id) / 8] = {0};
    nccl_id id;
    if (c->rank == 0) {
        msg[0] = snug_nccl.GetUniqueId(&id);
        memcpy(msg + 1, &id, sizeof id);
    }
    SNUG_TRY(c->broadcast(c, msg, sizeof msg / sizeof *msg, SNUG_COMM_I64 | SNUG_COMM_HOST, 0, e));
    if (msg[0] != NCCL_OK)
        return snug_fail(e, SNUG_EIO, "ncclGetUniqueId failed on rank 0: %s", snug_nccl.GetErrorString((int)msg[0]));
    memcpy(&id, msg + 1, sizeof id);

    nccl_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the NCCL communicator");
    x->device = snug_cuda_device(be);
    x->compute = (cudaStream_t)snug_cuda_compute_stream(be);
    pthread_mutex_init(&x->mu, NULL);
    char why[512] = "";
    cudaError_t err = cudaSetDevice(x->device);
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&x->async_done, cudaEventDisableTiming);
    for (int i = 0; i < SNUG_NCCL_PENDING && err == cudaSuccess; i++)
        err = cudaEventCreateWithFlags(&x->ring[i].done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, sizeof why, "GPU %d: creating the NCCL communicator's stream and events failed: %s", x->device,
                 cudaGetErrorString(err));
    }
    /* every rank ready before any joins: one that cannot must not leave the others waiting in ncclCommInitRank */
    rc = why[0] ? snug_fail(e, SNUG_EIO, "%s", why) : 0;
    if (!(rc = agree(c, rc, "prepare the NCCL communicator", e))) {
        int late = snug_nccl_join_timed(x->device, c->size, id, c->rank, c->timeout_s, &x->comm, why, sizeof why) == 2;
        if (!why[0] && c->deterministic && need_scratch(&(snug_comm){.size = c->size, .ctx = x}, &le))
            snprintf(why, sizeof why, "%.400s", le.msg);
        rc = why[0] ? snug_fail(e, SNUG_EIO, "%s", why) : 0;
        /* a rank whose join timed out fails alone: the others may be held in ncclCommInitRank still */
        if (!late)
            rc = agree(c, rc, "join the NCCL communicator", e);
    }
    if (rc) {
        x->failed = 1;
        release(x);
        free(x);
        return rc;
    }
    x->host = *c;
    x->host.check = 0;
    snug_comm n = {.name = "nccl", .rank = c->rank, .size = c->size, .local_rank = c->local_rank,
                   .deterministic = c->deterministic, .check = c->check, .timeout_s = c->timeout_s, .seq = c->seq,
                   .ctx = x, .allreduce_sum = nccl_allreduce, .broadcast = nccl_broadcast, .barrier = nccl_barrier,
                   .reduce_scatter_sum = nccl_reduce_scatter, .allgather = nccl_allgather, .wait = nccl_wait,
                   .abort = nccl_abort,
                   .send = NULL, .recv = NULL, /* point to point: CPU ranks only for now (comm.h) */
                   .free = nccl_free};
    *c = n;
    return 0;
}
