/* nccl_emu.c: the stand-in NCCL of the emulated CUDA build (libsnug_nccl_emu.so, which src/dist/comm_nccl.c opens
 * through SNUG_NCCL_PATH or SNUG_NCCL), so the NCCL communicator runs without a GPU at 1 rank and at 2 or 3 ranks that
 * are processes of one machine (mpirun -np 3), with exact, deterministic results and the emulator's checks.
 *
 * The entry points are the ones comm_nccl.c looks up, with NCCL's types and values: ncclGetVersion (2.20.0),
 * ncclGetUniqueId, ncclCommInitRank, ncclCommDestroy, ncclCommAbort, ncclCommGetAsyncError, ncclGetErrorString,
 * ncclGetLastError, ncclAllReduce, ncclBroadcast, ncclReduce, ncclAllGather, ncclSend, ncclRecv, ncclGroupStart,
 * ncclGroupEnd. Types: int8, uint8, int32, uint32, int64, uint64, float32, float64 (summed), float16 and bfloat16
 * (moved, not summed). The one reduction is ncclSum.
 *
 * Rendezvous. The unique id names a POSIX shared-memory segment ("/snug-nccl-emu-<pid>-<n>-<time>"). Every rank
 * opens it (O_CREAT: whichever comes first creates it), sizes it and maps it. A new segment is all zeros, and all
 * zeros is the header's valid initial state, so no rank has to set it up first: a rank claims the size with a
 * compare-and-swap of nranks (a rank that says another size fails) and its place with one of pid[rank] (a rank number
 * used twice fails), then waits at the barrier. When the barrier opens every rank has the segment mapped, so each
 * unlinks its name (the first succeeds): nothing is left in /dev/shm whatever happens later, crashes included. At one
 * rank the segment is an anonymous mapping and the id is not used.
 * Layout: [header: nranks, the barrier, broken, pid, pidns and gone per rank][nranks x nranks mailbox counters]
 * [nranks staging slots of SLOT_BYTES][nranks x nranks mailboxes of BOX_BYTES], each part page-aligned; pages are
 * taken only as they are written.
 *
 * The barrier is a generation-counted one on C11 atomics in the segment (lock-free, so it works across processes):
 * a rank reads the generation, adds itself to the count; the last one resets the count and advances the generation,
 * the others wait for the generation to move. Waiting yields, then sleeps 20 us doubling to 1 ms, and gives up (so a
 * rank fails with an error instead of hanging) when another rank gave up on the communicator (`broken`), destroyed
 * it (`gone`), exited (its pid vanished or is a zombie, looked at every 50 ms where the ranks share a pid namespace),
 * or SNUG_CUDA_EMU_NCCL_TIMEOUT seconds (default 300; 0 waits for ever) passed; before failing it looks once more,
 * for a peer that finished its part just before it left. A rank that gives up marks the communicator broken, so the
 * others stop waiting too; the failure is recorded as the communicator's asynchronous error (ncclCommGetAsyncError),
 * the call that ran it returns it, every later call on the communicator returns it, ncclGetLastError says why, and a
 * line on stderr says it too.
 *
 * Collectives, in rounds of at most SLOT_BYTES per rank (the ranks agree on the rounds: they pass the same counts):
 * each rank copies its part of the round into its own slot, waits at the barrier, computes its output from the slots,
 * and waits again, so the slots can be reused. A sum adds the slots in rank order, ((r0 + r1) + r2) element by
 * element in the element's own type, as snug_comm_sum_in_order and comm_nccl_sum.cu do: the result is the same bits
 * on every rank and in every run (integers wrap, as on the GPU), and the plain all-reduce gives the deterministic
 * mode's bits. In place works (sendbuff == recvbuff; for ncclAllGather sendbuff ==
 * recvbuff + rank x count): a rank's input is in its slot before any output is written. AllReduce: every rank gets
 * the sum. Reduce: the root. Broadcast: the root's slot to all. AllGather: the slots concatenated in rank order.
 * Point to point: a mailbox per (source, destination) holds one chunk of at most BOX_BYTES, with two counters, chunks
 * posted by the sender and taken by the receiver; the sender fills it when it is empty (taken == posted), the
 * receiver empties it when it is full. A group's sends and receives run together in one loop that moves every chunk
 * it can and waits only when none can move, so any set of sends and receives that match completes (ring exchanges,
 * many-to-one, to oneself), whatever order the group lists them in; operations on one peer and direction go in the
 * order issued, as NCCL matches them. A chunk whose size is not the one the receiver expects fails, naming both.
 *
 * Streams. A call checks its arguments and, as the GPU would fault, its buffers over their exact extents
 * (snug_emu_check_device) and buffers that overlap other than in place (a race on a GPU; both fatal), then queues the
 * work on the stream with snug_emu_enqueue, to run in stream order; a group (ncclGroupStart .. ncclGroupEnd, one
 * communicator and stream) is one queued item: its collectives in the order issued, then its sends and receives.
 * When it runs:
 * - At one rank, when something synchronizes, as every other queued item: nothing waits for a peer, and the
 *   emulator's ordering checks stay whole (a collective that runs before the compute work it should follow, or
 *   compute work that runs before the collective it should follow, gives wrong results: test_comm_nccl's ordering
 *   checks).
 * - At several ranks, at once: after queueing, the call runs everything queued (snug_emu_drain), so it returns when
 *   the collective is done on this rank. The emulator runs queued work only on a thread that synchronizes, and
 *   comm_nccl.c's host never waits for a collective (its completion events are polled only by the dist_timeout
 *   watch thread and at nccl_barrier); between issuing a device collective and synchronizing, a rank may block in
 *   the host communicator (MPI: the debug signature check, a host-buffer sum, `agree`). Left queued, a rank that
 *   synchronized first would wait inside the collective for a peer that waits in MPI for it: a deadlock a GPU, which
 *   runs the collective without the host, never has. Run at the call, a device collective blocks like an MPI one,
 *   and every rank issues both kinds in one order (the communicator's sequence), so the ranks always meet. The cost:
 *   at several ranks a missing wait on the completion event cannot show (the collective ran before what follows was
 *   queued); the one-rank runs keep that check. comm_nccl.c holds its own lock over the call, so its watch thread
 *   waits meanwhile; this library's timeout and peer checks stand in for dist_timeout's abort.
 * ncclCommDestroy runs what is still queued first; after ncclCommAbort queued items do nothing (the communicator's
 * memory lives until the last one ran).
 *
 * Everything shared between processes is either an atomic (sequentially consistent) or data handed over by the
 * barrier or a mailbox counter, so within a process ThreadSanitizer sees only atomics and a mutex; device memory is
 * touched only inside queued items, where the emulator has it unpoisoned. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "snug_emu.h"

/* ------------------------------------------------------------------------------------------------ NCCL's ABI */

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10,
} ncclDataType_t;

typedef enum { ncclSum = 0 } ncclRedOp_t;

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;

#define NCCL_EMU_VERSION 22000 /* 2.20.0, as NCCL_VERSION(2, 20, 0) encodes it */

/* ------------------------------------------------------------------------------------------------ the segment */

#define MAX_RANKS 64                    /* a bit per rank in a uint64_t */
#define SLOT_BYTES ((size_t)4 << 20)    /* a rank's staging slot: a collective moves this much per rank per round */
#define BOX_BYTES ((size_t)1 << 20)     /* a mailbox: point to point moves this much per hand-over */
#define PAGE ((size_t)4096)

_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "the shared segment's atomics must be lock-free to work across processes");

/* The segment's header; all zeros is its state before the first rank arrives. */
typedef struct shared_hdr {
    _Atomic uint32_t nranks;            /* 0 until the first rank claims it */
    _Atomic uint32_t count;             /* the barrier: ranks arrived in this round */
    _Atomic uint32_t gen;               /* the barrier: rounds completed */
    _Atomic int32_t broken;             /* 0, or 1 + the first rank that gave up on the communicator */
    _Atomic int32_t pid[MAX_RANKS];     /* each rank's process, 0 until it arrived */
    _Atomic uint64_t pidns[MAX_RANKS];  /* the inode of each rank's pid namespace (stored before pid) */
    _Atomic uint32_t gone[MAX_RANKS];   /* 1 once the rank destroyed its communicator */
} shared_hdr;

/* A mailbox's counters (the data lies in the segment's last part). */
typedef struct box_ctl {
    _Atomic uint64_t posted; /* chunks the sender put in, ever */
    _Atomic uint64_t taken;  /* chunks the receiver took out, ever */
    _Atomic uint64_t bytes;  /* the size of the chunk posted last */
    char pad[40];            /* one cache line each */
} box_ctl;

static size_t round_page(size_t n) { return (n + PAGE - 1) / PAGE * PAGE; }

/* ------------------------------------------------------------------------------------------------ the communicator */

#define COMM_MAGIC 0x6e63636cu
#define ID_MAGIC "snug-nccl-emu-1" /* 16 bytes with its NUL, then the segment's name */

struct ncclComm {
    uint32_t magic;
    int rank, nranks;
    char name[112];        /* the segment's name */
    unsigned char *base;   /* the mapping, bytes long */
    size_t bytes;
    shared_hdr *hdr;
    box_ctl *ctl;          /* (nranks, nranks): [src * nranks + dst] */
    unsigned char *slots;  /* (nranks, SLOT_BYTES) */
    unsigned char *boxes;  /* (nranks * nranks, BOX_BYTES) */
    uint64_t pidns;        /* this process's pid namespace */
    double timeout_s;      /* SNUG_CUDA_EMU_NCCL_TIMEOUT; <= 0: none */
    _Atomic int refs;      /* the owner's, and one per queued item */
    _Atomic int pending;   /* items queued and not run yet */
    _Atomic int released;  /* destroyed or aborted: queued items do nothing */
    _Atomic int err;       /* the asynchronous error: ncclSuccess until a queued item failed */
    pthread_mutex_t mu;    /* why */
    char why[512];
};

static unsigned char *slot_of(const struct ncclComm *c, int r) { return c->slots + (size_t)r * SLOT_BYTES; }
static box_ctl *box_ctl_of(const struct ncclComm *c, int src, int dst) { return &c->ctl[src * c->nranks + dst]; }
static unsigned char *box_of(const struct ncclComm *c, int src, int dst) {
    return c->boxes + (size_t)(src * c->nranks + dst) * BOX_BYTES;
}

/* ------------------------------------------------------------------------------------------------ errors */

static pthread_mutex_t last_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_why[512]; /* the last failure of any call, for ncclGetLastError */

static void set_last(const char *msg) {
    pthread_mutex_lock(&last_mu);
    snprintf(last_why, sizeof last_why, "%s", msg);
    pthread_mutex_unlock(&last_mu);
}

/* A call refused: rc, with the reason kept for ncclGetLastError. */
static ncclResult_t refuse(ncclResult_t rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t refuse(ncclResult_t rc, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    set_last(msg);
    return rc;
}

/* The communicator failed (the first reason is kept): its asynchronous error is set, it is marked broken for the
 * other ranks, so they stop waiting for this one, and stderr says why, since a queued item has no caller to tell. */
static void comm_fail(struct ncclComm *c, ncclResult_t rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void comm_fail(struct ncclComm *c, ncclResult_t rc, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int first = 0;
    pthread_mutex_lock(&c->mu);
    if (!c->why[0]) {
        snprintf(c->why, sizeof c->why, "%s", msg);
        first = 1;
    }
    pthread_mutex_unlock(&c->mu);
    int ok = ncclSuccess;
    atomic_compare_exchange_strong(&c->err, &ok, (int)rc);
    if (c->hdr) {
        int32_t none = 0;
        atomic_compare_exchange_strong(&c->hdr->broken, &none, c->rank + 1);
    }
    set_last(msg);
    if (first)
        fprintf(stderr, "snug cuda-emu: NCCL rank %d of %d: %s\n", c->rank, c->nranks, msg);
}

/* ------------------------------------------------------------------------------------------------ waiting */

/* Whether process pid has exited: gone, or a zombie its parent has not reaped yet (a launcher that forks the ranks
 * and waits for them in turn leaves one so). */
static int exited(int32_t pid) {
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) state ...": comm may hold spaces and parentheses */
    return p && p[1] == ' ' && p[2] == 'Z';
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One wait for peers: why it cannot end, once it cannot. */
typedef struct waiter {
    struct ncclComm *c;
    double t0, look;   /* when the wait began (or last moved on); when the peers' processes are looked at next */
    unsigned rounds;
    long nap_ns;
    ncclResult_t rc;   /* set when waiting cannot end */
    char why[256];
} waiter;

static void waiter_start(waiter *w, struct ncclComm *c) {
    memset(w, 0, sizeof *w);
    w->c = c;
    w->t0 = now_s();
    w->look = w->t0 + 0.05;
    w->nap_ns = 20000;
}

/* Progress was made: the timeout counts from now. */
static void waiter_moved(waiter *w) {
    w->t0 = now_s();
    w->rounds = 0;
    w->nap_ns = 20000;
}

/* Between two looks at what the ranks in `peers` must do: pauses and returns 1, or returns 0 with w->rc and w->why
 * when waiting cannot end (the communicator broken or released, a peer gone or exited, the timeout passed). */
static int wait_more(waiter *w, uint64_t peers) {
    struct ncclComm *c = w->c;
    shared_hdr *h = c->hdr;
    int32_t b = atomic_load(&h->broken);
    if (b || atomic_load(&c->released)) {
        w->rc = ncclRemoteError;
        if (!b || b - 1 == c->rank)
            snprintf(w->why, sizeof w->why, "the communicator was aborted");
        else
            snprintf(w->why, sizeof w->why, "rank %d gave up on the communicator (it aborted, timed out or found a "
                     "rank gone)", b - 1);
        return 0;
    }
    for (int r = 0; r < c->nranks; r++)
        if ((peers >> r & 1) && atomic_load(&h->gone[r])) {
            w->rc = ncclRemoteError;
            snprintf(w->why, sizeof w->why, "rank %d destroyed its communicator without taking part", r);
            return 0;
        }
    double t = now_s();
    if (t >= w->look) {
        w->look = t + 0.05;
        for (int r = 0; r < c->nranks; r++) {
            int32_t pid = (peers >> r & 1) ? atomic_load(&h->pid[r]) : 0;
            if (pid > 0 && atomic_load(&h->pidns[r]) == c->pidns && exited(pid)) {
                w->rc = ncclRemoteError;
                snprintf(w->why, sizeof w->why, "rank %d (process %d) exited", r, (int)pid);
                return 0;
            }
        }
        if (c->timeout_s > 0 && t - w->t0 > c->timeout_s) {
            w->rc = ncclSystemError;
            snprintf(w->why, sizeof w->why, "waited %.0f s for the other ranks (SNUG_CUDA_EMU_NCCL_TIMEOUT): a rank "
                     "hangs, or issued other operations", c->timeout_s);
            return 0;
        }
    }
    if (w->rounds++ < 32) {
        sched_yield();
    } else {
        struct timespec ts = {0, w->nap_ns};
        nanosleep(&ts, NULL);
        w->nap_ns = w->nap_ns * 2 > 1000000 ? 1000000 : w->nap_ns * 2;
    }
    return 1;
}

/* The wait failed: the communicator fails with why. */
static ncclResult_t give_up(waiter *w, const char *what) {
    comm_fail(w->c, w->rc, "%s: %s", what, w->why);
    return w->rc;
}

static uint64_t all_peers(const struct ncclComm *c) {
    uint64_t m = c->nranks == 64 ? ~(uint64_t)0 : ((uint64_t)1 << c->nranks) - 1;
    return m & ~((uint64_t)1 << c->rank);
}

/* Every rank arrives before any leaves. */
static ncclResult_t barrier(struct ncclComm *c, const char *what) {
    if (c->nranks == 1)
        return ncclSuccess;
    shared_hdr *h = c->hdr;
    uint32_t g = atomic_load(&h->gen);
    if (atomic_fetch_add(&h->count, 1) == (uint32_t)c->nranks - 1) {
        atomic_store(&h->count, 0);
        atomic_store(&h->gen, g + 1);
        return ncclSuccess;
    }
    waiter w;
    waiter_start(&w, c);
    int stuck = 0;
    while (atomic_load(&h->gen) == g) {
        if (stuck)
            return give_up(&w, what);
        stuck = !wait_more(&w, all_peers(c));
    }
    return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------------ types */

static size_t type_size(int dt) {
    switch (dt) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static const char *type_name(int dt) {
    static const char *names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                  "float64", "bfloat16"};
    return dt >= 0 && dt < ncclNumTypes ? names[dt] : "an unknown type";
}

/* out[0..n) <- slot[0][j] + slot[1][j] + ... in rank order, in T (unsigned for the integers: they wrap); out need
 * not be aligned. */
#define SUM_IN_RANK_ORDER(name, T)                                                                      \
    static void name(unsigned char *out, unsigned char *const *slot, int nranks, size_t n) {            \
        for (size_t j = 0; j < n; j++) {                                                                \
            T s, v;                                                                                     \
            memcpy(&s, slot[0] + j * sizeof s, sizeof s);                                               \
            for (int r = 1; r < nranks; r++) {                                                          \
                memcpy(&v, slot[r] + j * sizeof v, sizeof v);                                           \
                s = (T)(s + v);                                                                         \
            }                                                                                           \
            memcpy(out + j * sizeof s, &s, sizeof s);                                                   \
        }                                                                                               \
    }
SUM_IN_RANK_ORDER(sum_u8, uint8_t)
SUM_IN_RANK_ORDER(sum_u32, uint32_t)
SUM_IN_RANK_ORDER(sum_u64, uint64_t)
SUM_IN_RANK_ORDER(sum_f32, float)
SUM_IN_RANK_ORDER(sum_f64, double)

static void sum_slots(unsigned char *out, const struct ncclComm *c, size_t n, int dt) {
    unsigned char *slot[MAX_RANKS];
    for (int r = 0; r < c->nranks; r++)
        slot[r] = slot_of(c, r);
    switch (dt) {
    case ncclInt8: case ncclUint8: sum_u8(out, slot, c->nranks, n); break;
    case ncclInt32: case ncclUint32: sum_u32(out, slot, c->nranks, n); break;
    case ncclInt64: case ncclUint64: sum_u64(out, slot, c->nranks, n); break;
    case ncclFloat32: sum_f32(out, slot, c->nranks, n); break;
    default: sum_f64(out, slot, c->nranks, n); break;
    }
}

/* ------------------------------------------------------------------------------------------------ operations */

enum { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_SEND, OP_RECV };
static const char *const op_names[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclSend",
                                       "ncclRecv"};

typedef struct op_t {
    int kind, dt;
    int root;                   /* the root; for send and receive, the peer */
    const unsigned char *send;
    unsigned char *recv;
    size_t bytes;               /* per rank */
    size_t done;                /* send and receive: bytes handed over so far */
} op_t;

/* The work one queued item does: a call's, or a group's. */
typedef struct batch {
    struct ncclComm *c;
    cudaStream_t stream;
    int n, cap;
    op_t *ops;
} batch;

/* One collective, in rounds of SLOT_BYTES per rank (see the top of the file). */
static ncclResult_t run_collective(struct ncclComm *c, const op_t *o) {
    const char *what = op_names[o->kind];
    unsigned char *mine = slot_of(c, c->rank);
    ncclResult_t rc = ncclSuccess;
    for (size_t off = 0; off < o->bytes && rc == ncclSuccess; off += SLOT_BYTES) {
        size_t k = o->bytes - off < SLOT_BYTES ? o->bytes - off : SLOT_BYTES;
        if (o->kind != OP_BROADCAST || c->rank == o->root)
            memcpy(mine, o->send + off, k);
        if ((rc = barrier(c, what)) != ncclSuccess)
            break;
        switch (o->kind) {
        case OP_ALLREDUCE:
            sum_slots(o->recv + off, c, k / type_size(o->dt), o->dt);
            break;
        case OP_REDUCE:
            if (c->rank == o->root)
                sum_slots(o->recv + off, c, k / type_size(o->dt), o->dt);
            break;
        case OP_BROADCAST:
            if (c->rank != o->root)
                memcpy(o->recv + off, slot_of(c, o->root), k);
            else if (o->recv != o->send)
                memcpy(o->recv + off, mine, k);
            break;
        default: /* OP_ALLGATHER */
            for (int r = 0; r < c->nranks; r++)
                memcpy(o->recv + (size_t)r * o->bytes + off, slot_of(c, r), k);
            break;
        }
        rc = barrier(c, what);
    }
    return rc;
}

/* A batch's sends and receives, all at once: every pass moves each chunk that can move (the first unfinished
 * operation per peer and direction), and waits only when nothing moved. */
static ncclResult_t run_p2p(struct ncclComm *c, batch *b) {
    waiter w;
    waiter_start(&w, c);
    int stuck = 0;
    for (;;) {
        int left = 0, moved = 0;
        uint64_t sending = 0, receiving = 0, awaited = 0; /* peers whose first operation this pass has seen */
        for (int i = 0; i < b->n; i++) {
            op_t *o = &b->ops[i];
            if (o->kind < OP_SEND || o->done == o->bytes)
                continue;
            left = 1;
            uint64_t bit = (uint64_t)1 << o->root;
            size_t want = o->bytes - o->done < BOX_BYTES ? o->bytes - o->done : BOX_BYTES;
            if (o->kind == OP_SEND) {
                if (sending & bit)
                    continue;
                sending |= bit;
                box_ctl *x = box_ctl_of(c, c->rank, o->root);
                uint64_t posted = atomic_load(&x->posted);
                if (atomic_load(&x->taken) != posted) { /* the receiver has not emptied it yet */
                    awaited |= bit;
                    continue;
                }
                memcpy(box_of(c, c->rank, o->root), o->send + o->done, want);
                atomic_store(&x->bytes, want);
                atomic_store(&x->posted, posted + 1);
            } else {
                if (receiving & bit)
                    continue;
                receiving |= bit;
                box_ctl *x = box_ctl_of(c, o->root, c->rank);
                uint64_t taken = atomic_load(&x->taken);
                if (atomic_load(&x->posted) == taken) { /* nothing sent yet */
                    awaited |= bit;
                    continue;
                }
                size_t got = (size_t)atomic_load(&x->bytes);
                if (got != want) {
                    comm_fail(c, ncclInvalidUsage, "ncclRecv of %zu bytes from rank %d: the sender's chunk at byte "
                              "%zu has %zu bytes where %zu were due (the ncclSend's size differs)", o->bytes, o->root,
                              o->done, got, want);
                    return ncclInvalidUsage;
                }
                memcpy(o->recv + o->done, box_of(c, o->root, c->rank), want);
                atomic_store(&x->taken, taken + 1);
            }
            o->done += want;
            moved = 1;
        }
        if (!left)
            return ncclSuccess;
        if (moved) {
            waiter_moved(&w);
            stuck = 0;
            continue;
        }
        if (stuck)
            return give_up(&w, b->n == 1 ? op_names[b->ops[0].kind] : "the group's ncclSend/ncclRecv");
        stuck = !wait_more(&w, awaited & ~((uint64_t)1 << c->rank));
    }
}

static void comm_unref(struct ncclComm *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->base)
        munmap(c->base, c->bytes);
    pthread_mutex_destroy(&c->mu);
    c->magic = 0;
    free(c);
}

/* The queued item: the batch's collectives in order, then its sends and receives. */
static void run_batch(void *arg) {
    batch *b = arg;
    struct ncclComm *c = b->c;
    if (!atomic_load(&c->released) && atomic_load(&c->err) == ncclSuccess) {
        int32_t broken = atomic_load(&c->hdr->broken);
        ncclResult_t rc = ncclSuccess;
        if (broken) {
            comm_fail(c, ncclRemoteError, "%s: rank %d aborted or gave up on the communicator before this operation",
                      op_names[b->ops[0].kind], broken - 1);
            rc = ncclRemoteError;
        }
        for (int i = 0; i < b->n && rc == ncclSuccess; i++)
            if (b->ops[i].kind < OP_SEND)
                rc = run_collective(c, &b->ops[i]);
        if (rc == ncclSuccess)
            rc = run_p2p(c, b); /* a failure is the communicator's now: the next call returns it */
    }
    atomic_fetch_sub(&c->pending, 1);
    comm_unref(c);
    free(b->ops);
    free(b);
}

/* ------------------------------------------------------------------------------------------------ groups */

/* This thread's open group (NCCL's groups are per thread): its operations, and the first refusal among them. */
static _Thread_local struct {
    int depth;
    batch *b;
    ncclResult_t err;
} group;

static ncclResult_t refused(ncclResult_t rc);

static void drop_batch(void) {
    if (group.b) {
        free(group.b->ops);
        free(group.b);
        group.b = NULL;
    }
}

/* Queues the thread's batch as one item; at several ranks runs it now (see the top of the file). */
static ncclResult_t submit(void) {
    if (group.b && !group.b->n)
        drop_batch();
    batch *b = group.b;
    group.b = NULL;
    if (!b)
        return ncclSuccess;
    struct ncclComm *c = b->c;
    atomic_fetch_add(&c->refs, 1);
    atomic_fetch_add(&c->pending, 1);
    const char *what = b->n == 1 ? op_names[b->ops[0].kind] : "an NCCL group (ncclGroupEnd)";
    if (snug_emu_enqueue(b->stream, what, run_batch, b) != 0) {
        atomic_fetch_sub(&c->pending, 1);
        atomic_fetch_sub(&c->refs, 1);
        group.b = b;
        drop_batch();
        return refuse(ncclUnhandledCudaError, "%s: the stream is not a live CUDA stream", what);
    }
    if (c->nranks == 1)
        return ncclSuccess;
    snug_emu_drain();
    return (ncclResult_t)atomic_load(&c->err);
}

/* Adds an operation to the thread's batch; outside a group, submits it. */
static ncclResult_t add_op(struct ncclComm *c, cudaStream_t stream, const op_t *o) {
    batch *b = group.b;
    if (b && (b->c != c || b->stream != stream)) {
        return refused(refuse(ncclInvalidUsage, "%s: a group of the emulated NCCL holds operations of one "
                              "communicator on one stream", op_names[o->kind]));
    }
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b)
            return refused(refuse(ncclSystemError, "%s: out of host memory", op_names[o->kind]));
        b->c = c;
        b->stream = stream;
        group.b = b;
    }
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        op_t *ops = realloc(b->ops, (size_t)cap * sizeof *ops);
        if (!ops) {
            if (!group.depth)
                drop_batch();
            return refused(refuse(ncclSystemError, "%s: out of host memory", op_names[o->kind]));
        }
        b->ops = ops;
        b->cap = cap;
    }
    b->ops[b->n++] = *o;
    return group.depth ? ncclSuccess : submit();
}

ncclResult_t ncclGroupStart(void) {
    group.depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group.depth == 0)
        return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group.depth)
        return ncclSuccess;
    ncclResult_t err = group.err;
    group.err = ncclSuccess;
    if (err) { /* an operation was refused: the group is dropped whole, as its peers' would not match it */
        drop_batch();
        return err;
    }
    return submit();
}

/* ------------------------------------------------------------------------------------------------ argument checks */

/* A refusal inside a group also fails the group at ncclGroupEnd. */
static ncclResult_t refused(ncclResult_t rc) {
    if (group.depth && !group.err)
        group.err = rc;
    return rc;
}

static ncclResult_t check_comm(struct ncclComm *c, const char *fn) {
    if (!c || c->magic != COMM_MAGIC)
        return refused(refuse(ncclInvalidArgument, "%s: %p is not a communicator from ncclCommInitRank", fn,
                              (void *)c));
    if (atomic_load(&c->released))
        return refused(refuse(ncclInvalidUsage, "%s: the communicator was destroyed or aborted", fn));
    int err = atomic_load(&c->err);
    if (err) {
        pthread_mutex_lock(&c->mu);
        char why[512];
        snprintf(why, sizeof why, "%s", c->why);
        pthread_mutex_unlock(&c->mu);
        return refused(refuse((ncclResult_t)err, "%s: the communicator failed earlier: %s", fn, why));
    }
    return ncclSuccess;
}

/* *bytes <- count elements of dt; sum: the type must be one that is summed and op ncclSum. */
static ncclResult_t check_type(const char *fn, size_t count, int dt, int sum, int op, size_t *bytes) {
    size_t es = type_size(dt);
    if (!es)
        return refused(refuse(ncclInvalidArgument, "%s: datatype %d is not an NCCL type", fn, dt));
    if (sum && op != ncclSum)
        return refused(refuse(ncclInvalidArgument, "%s: reduction %d: the emulated NCCL has ncclSum (0) only", fn,
                              op));
    if (sum && (dt == ncclFloat16 || dt == ncclBfloat16))
        return refused(refuse(ncclInvalidArgument, "%s: the emulated NCCL does not sum %s", fn, type_name(dt)));
    if (count > SIZE_MAX / MAX_RANKS / es)
        return refused(refuse(ncclInvalidArgument, "%s: %zu elements is too many", fn, count));
    *bytes = count * es;
    return ncclSuccess;
}

static ncclResult_t check_rank(struct ncclComm *c, const char *fn, const char *role, int r) {
    if (r < 0 || r >= c->nranks)
        return refused(refuse(ncclInvalidArgument, "%s: %s %d in a communicator of %d ranks", fn, role, r,
                              c->nranks));
    return ncclSuccess;
}

/* The buffers as the GPU would see them: device memory over the exact extent (else fatal, as an illegal address);
 * send and receive buffers identical (in place) or apart (else fatal: a race on a GPU). */
static void check_buffers(const char *fn, const void *send, size_t send_bytes, const void *recv, size_t recv_bytes,
                          uintptr_t in_place) {
    char who[96];
    if (send) {
        snprintf(who, sizeof who, "%s's sendbuff", fn);
        snug_emu_check_device(send, send_bytes, who);
    }
    if (recv) {
        snprintf(who, sizeof who, "%s's recvbuff", fn);
        snug_emu_check_device(recv, recv_bytes, who);
    }
    if (send && recv && (uintptr_t)send != in_place) {
        uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
        if (s < r + recv_bytes && r < s + send_bytes)
            snug_emu_fatal("%s: sendbuff %p (%zu bytes) overlaps recvbuff %p (%zu bytes) other than in place", fn,
                           send, send_bytes, recv, recv_bytes);
    }
}

/* ------------------------------------------------------------------------------------------------ collectives */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclAllReduce";
    size_t bytes = 0;
    ncclResult_t rc = check_comm(comm, fn);
    if (rc || (rc = check_type(fn, count, datatype, 1, op, &bytes)) || !count)
        return rc;
    check_buffers(fn, sendbuff, bytes, recvbuff, bytes, (uintptr_t)recvbuff);
    op_t o = {OP_ALLREDUCE, datatype, 0, sendbuff, recvbuff, bytes, 0};
    return add_op(comm, stream, &o);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclReduce";
    size_t bytes = 0;
    ncclResult_t rc = check_comm(comm, fn);
    if (rc || (rc = check_type(fn, count, datatype, 1, op, &bytes)) || (rc = check_rank(comm, fn, "root", root)) ||
        !count)
        return rc;
    int am_root = comm->rank == root; /* recvbuff matters on the root only */
    check_buffers(fn, sendbuff, bytes, am_root ? recvbuff : NULL, bytes, (uintptr_t)recvbuff);
    op_t o = {OP_REDUCE, datatype, root, sendbuff, am_root ? recvbuff : NULL, bytes, 0};
    return add_op(comm, stream, &o);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclBroadcast";
    size_t bytes = 0;
    ncclResult_t rc = check_comm(comm, fn);
    if (rc || (rc = check_type(fn, count, datatype, 0, ncclSum, &bytes)) ||
        (rc = check_rank(comm, fn, "root", root)) || !count)
        return rc;
    int am_root = comm->rank == root; /* sendbuff matters on the root only */
    check_buffers(fn, am_root ? sendbuff : NULL, bytes, recvbuff, bytes, (uintptr_t)recvbuff);
    op_t o = {OP_BROADCAST, datatype, root, am_root ? sendbuff : NULL, recvbuff, bytes, 0};
    return add_op(comm, stream, &o);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclAllGather";
    size_t bytes = 0;
    ncclResult_t rc = check_comm(comm, fn);
    if (rc || (rc = check_type(fn, sendcount, datatype, 0, ncclSum, &bytes)) || !sendcount)
        return rc;
    check_buffers(fn, sendbuff, bytes, recvbuff, bytes * (size_t)comm->nranks,
                  (uintptr_t)recvbuff + (size_t)comm->rank * bytes);
    op_t o = {OP_ALLGATHER, datatype, 0, sendbuff, recvbuff, bytes, 0};
    return add_op(comm, stream, &o);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    const char *fn = "ncclSend";
    size_t bytes = 0;
    ncclResult_t rc = check_comm(comm, fn);
    if (rc || (rc = check_type(fn, count, datatype, 0, ncclSum, &bytes)) || (rc = check_rank(comm, fn, "peer", peer)) ||
        !count)
        return rc;
    check_buffers(fn, sendbuff, bytes, NULL, 0, 0);
    op_t o = {OP_SEND, datatype, peer, sendbuff, NULL, bytes, 0};
    return add_op(comm, stream, &o);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    const char *fn = "ncclRecv";
    size_t bytes = 0;
    ncclResult_t rc = check_comm(comm, fn);
    if (rc || (rc = check_type(fn, count, datatype, 0, ncclSum, &bytes)) || (rc = check_rank(comm, fn, "peer", peer)) ||
        !count)
        return rc;
    check_buffers(fn, NULL, 0, recvbuff, bytes, 0);
    op_t o = {OP_RECV, datatype, peer, NULL, recvbuff, bytes, 0};
    return add_op(comm, stream, &o);
}

/* ------------------------------------------------------------------------------------------------ communicators */

ncclResult_t ncclGetVersion(int *version) {
    if (!version)
        return refuse(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_EMU_VERSION;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static _Atomic unsigned made;
    if (!id)
        return refuse(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    snprintf(id->internal + sizeof ID_MAGIC, sizeof id->internal - sizeof ID_MAGIC, "/snug-nccl-emu-%ld-%u-%lx%09ld",
             (long)getpid(), atomic_fetch_add(&made, 1), (unsigned long)ts.tv_sec, (long)ts.tv_nsec);
    return ncclSuccess;
}

static uint64_t pid_namespace(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static double timeout_setting(void) {
    const char *v = snug_emu_setting("NCCL_TIMEOUT");
    if (!v)
        return 300;
    char *end;
    double t = strtod(v, &end);
    if (*end || end == v)
        snug_emu_fatal("SNUG_CUDA_EMU_NCCL_TIMEOUT=%s is not a number of seconds", v);
    return t;
}

/* Maps the communicator's segment: anonymous at one rank, else the id's, created by whichever rank comes first. */
static ncclResult_t map_segment(struct ncclComm *c) {
    size_t n = (size_t)c->nranks;
    size_t hdr = round_page(sizeof(shared_hdr)), ctl = round_page(n * n * sizeof(box_ctl));
    size_t slots = n * SLOT_BYTES;
    c->bytes = hdr + ctl + slots + n * n * BOX_BYTES;
    void *m;
    if (c->nranks == 1) {
        m = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return refuse(ncclSystemError, "ncclCommInitRank: cannot map %zu bytes: %s", c->bytes, strerror(errno));
    } else {
        int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
        if (fd < 0)
            return refuse(ncclSystemError, "ncclCommInitRank (rank %d of %d): shm_open(%s): %s", c->rank, c->nranks,
                          c->name, strerror(errno));
        struct stat st;
        int bad = fstat(fd, &st) != 0 || (st.st_size < (off_t)c->bytes && ftruncate(fd, (off_t)c->bytes) != 0);
        m = bad ? MAP_FAILED : mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int e = errno;
        close(fd);
        if (m == MAP_FAILED) {
            shm_unlink(c->name);
            return refuse(ncclSystemError, "ncclCommInitRank (rank %d of %d): cannot size or map the %zu-byte shared "
                          "segment %s: %s (is /dev/shm large enough?)", c->rank, c->nranks, c->bytes, c->name,
                          strerror(e));
        }
    }
    c->base = m;
    c->hdr = m;
    c->ctl = (box_ctl *)(c->base + hdr);
    c->slots = c->base + hdr + ctl;
    c->boxes = c->slots + slots;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    const char *fn = "ncclCommInitRank";
    if (!comm)
        return refuse(ncclInvalidArgument, "%s: comm is NULL", fn);
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return refuse(ncclInvalidArgument, "%s: rank %d of %d (the emulated NCCL has 1 to %d ranks)", fn, rank, nranks,
                      MAX_RANKS);
    if (memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) || !memchr(id.internal, 0, sizeof id.internal))
        return refuse(ncclInvalidArgument, "%s: the id is not one from the emulated NCCL's ncclGetUniqueId", fn);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return refuse(ncclSystemError, "%s: out of host memory", fn);
    c->magic = COMM_MAGIC;
    c->rank = rank;
    c->nranks = nranks;
    snprintf(c->name, sizeof c->name, "%s", id.internal + sizeof ID_MAGIC);
    c->pidns = pid_namespace();
    c->timeout_s = timeout_setting();
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    ncclResult_t rc = map_segment(c);
    if (rc) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return rc;
    }
    shared_hdr *h = c->hdr;
    uint32_t size = 0;
    int32_t pid = 0;
    if (!atomic_compare_exchange_strong(&h->nranks, &size, (uint32_t)nranks) && size != (uint32_t)nranks) {
        comm_fail(c, ncclInvalidUsage, "%s: rank %d joined a communicator of %d ranks where another rank said %u", fn,
                  rank, nranks, size);
    } else {
        atomic_store(&h->pidns[rank], c->pidns);
        if (!atomic_compare_exchange_strong(&h->pid[rank], &pid, (int32_t)getpid()))
            comm_fail(c, ncclInvalidUsage, "%s: rank %d of %d joined twice (processes %d and %d)", fn, rank, nranks,
                      (int)pid, (int)getpid());
        else if ((pid = atomic_load(&h->broken)) != 0) /* a rank gave up waiting for this one */
            comm_fail(c, ncclRemoteError, "%s: rank %d gave up on the communicator before rank %d joined", fn,
                      (int)pid - 1, rank);
        else
            barrier(c, fn);
    }
    if (nranks > 1)
        shm_unlink(c->name); /* every rank has it mapped now, or the join failed: the name is not needed again */
    rc = (ncclResult_t)atomic_load(&c->err);
    if (rc) {
        pthread_mutex_lock(&c->mu);
        set_last(c->why);
        pthread_mutex_unlock(&c->mu);
        comm_unref(c);
        return rc;
    }
    *comm = c;
    return ncclSuccess;
}

/* The owner lets go: aborting marks the communicator broken for the other ranks; destroying marks this rank gone. */
static ncclResult_t release(struct ncclComm *c, int abort) {
    if (atomic_exchange(&c->released, 1))
        return refuse(ncclInvalidUsage, "the communicator was destroyed or aborted already");
    if (abort) {
        int32_t none = 0;
        atomic_compare_exchange_strong(&c->hdr->broken, &none, c->rank + 1);
    } else {
        atomic_store(&c->hdr->gone[c->rank], 1);
    }
    comm_unref(c);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm || comm->magic != COMM_MAGIC)
        return refuse(ncclInvalidArgument, "ncclCommDestroy: %p is not a communicator", (void *)comm);
    if (atomic_load(&comm->pending))
        snug_emu_drain(); /* what is queued completes first, as NCCL's destroy waits for it */
    return release(comm, 0);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm)
        return ncclSuccess;
    if (comm->magic != COMM_MAGIC)
        return refuse(ncclInvalidArgument, "ncclCommAbort: %p is not a communicator", (void *)comm);
    return release(comm, 1);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || comm->magic != COMM_MAGIC || !asyncError)
        return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: not a communicator, or asyncError is NULL");
    *asyncError = (ncclResult_t)atomic_load(&comm->err);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* The communicator's failure, or else the last refusal of any call: copied for the calling thread, so another
 * thread's failure cannot change the text while the caller reads it. */
const char *ncclGetLastError(ncclComm_t comm) {
    static _Thread_local char text[512];
    text[0] = 0;
    if (comm && comm->magic == COMM_MAGIC) {
        pthread_mutex_lock(&comm->mu);
        snprintf(text, sizeof text, "%s", comm->why);
        pthread_mutex_unlock(&comm->mu);
    }
    if (!text[0]) {
        pthread_mutex_lock(&last_mu);
        snprintf(text, sizeof text, "%s", last_why);
        pthread_mutex_unlock(&last_mu);
    }
    return text;
}
