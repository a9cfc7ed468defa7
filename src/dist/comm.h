/* comm.h: the one communication interface of data-parallel training.
 *
 * A communicator is a struct of function pointers and a context (as a backend is), so the trainer never branches on
 * how ranks talk: comm_self.c is the single process (size 1; every collective is a copy or nothing, so one-process
 * runs take the same code path), comm_mpi.c is MPI (host buffers; compiled when CMake finds MPI), comm_nccl.c is
 * NCCL (device buffers on CUDA ranks, wrapping one of the other two for host buffers). Every count is in
 * elements, never bytes. Every rank must issue the same collectives in the same order with the same counts: a run
 * whose ranks disagree is a bug, and `check` (debug mode) exchanges each collective's signature first and fails on
 * every rank naming the mismatch instead of hanging. Failures are reported through snug_error; nothing here prints
 * or exits. Point-to-point messages (`send`, `recv`: pipeline parallelism's activations and gradients between
 * neighbouring stages) are the one exception to "every rank": only the two ranks of a message take part.
 *
 * Deterministic mode: an all-reduce's result must not depend on the library's algorithm (ring, tree, recursive
 * halving all add in different orders). With `deterministic` set, every rank's contribution is gathered and summed
 * in rank order, ((x_0 + x_1) + x_2) + ..., so the sum is the same bits whatever the transport and the same as a
 * single process that accumulates the ranks' parts one after another.
 *
 * Sharded collectives (ZeRO). A buffer of n elements is cut into size contiguous segments, rank r's of counts[r]
 * elements starting at displ_r = counts[0] + ... + counts[r-1] (n = the sum of the counts). The counts are explicit,
 * not equal shards plus padding, because a shard's edges fall where the sharded state needs them (on 8-bit
 * quantization blocks), so segments differ in length by up to a block; every rank passes the same counts, and the
 * debug check compares them (a hash of the array) with the rest of the signature. Both collectives work in place on
 * the whole buffer, so a shard is addressed by its place in the flat layout, never copied into a compact buffer:
 *   reduce_scatter_sum: segment rank of x <- the sum over ranks of every rank's segment rank (the other segments
 *                       are left as they were: the rank's own, unsummed values); deterministic: the rank-order sum.
 *   allgather:          every segment r of x <- rank r's segment r (only the owner's segment is read). */
#ifndef SNUG_DIST_COMM_H
#define SNUG_DIST_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* U16: raw 16-bit values (bf16 or fp16 parameters), moved but never summed: broadcast and all-gather only.
 *
 * Where a buffer lives. A collective's buffer is the backend's memory (device memory on CUDA ranks, host memory on
 * CPU ranks) unless the call site ORs SNUG_COMM_HOST into the type: then it is host memory whatever the backend (the
 * loss sums, the stop flag, the validation slots, the failure flags). The host communicators (self, MPI) ignore the
 * flag; the NCCL communicator sends such a buffer through the host communicator it wraps, and any other through
 * NCCL on its own stream. The flag is part of the signature `check` compares.
 *
 * Overlap with compute. A device collective flagged SNUG_COMM_ASYNC (a gradient bucket while backward goes on, the
 * next layer's parameters while this one computes) does not make the backend's compute stream wait for it: the
 * caller promises that nothing queued after it reads or writes the buffer until it has called `wait`, which makes
 * the compute stream wait for every such collective issued so far. The ranks still issue it in the same order as
 * every other collective. The host communicators (self, MPI) complete every collective before returning, so there
 * the flag changes nothing for a collective; MPI's `wait` completes only the point-to-point sends flagged with it
 * (see `send` below). */
typedef enum snug_comm_dtype {
    SNUG_COMM_F32,
    SNUG_COMM_F64,
    SNUG_COMM_I64,
    SNUG_COMM_U16,
    SNUG_COMM_HOST = 16,  /* a flag, not a type: SNUG_COMM_F64 | SNUG_COMM_HOST */
    SNUG_COMM_ASYNC = 32, /* a flag: the caller waits (snug_comm.wait) before it reads or writes the buffer */
} snug_comm_dtype;

/* The type without the SNUG_COMM_HOST and SNUG_COMM_ASYNC flags. */
static inline snug_comm_dtype snug_comm_type(int dt) {
    return (snug_comm_dtype)(dt & ~(SNUG_COMM_HOST | SNUG_COMM_ASYNC));
}

typedef struct snug_comm snug_comm;
struct snug_comm {
    const char *name; /* "self", "mpi" ("mpi-shm": every rank on one host, see comm_mpi.c), "nccl" */
    int rank, size;
    int local_rank;    /* the rank's index among the ranks of its host (the GPU it would own) */
    int deterministic; /* all-reduce sums in rank order (see above) */
    int check;         /* debug mode: every collective's signature is compared across ranks first */
    double timeout_s;  /* > 0: a collective not complete after this long fails the run on every rank */
    uint64_t seq;      /* collectives issued so far: the first part of a signature */
    void *ctx;
    /* x (n elements of dt) <- the sum over ranks of every rank's x, in place */
    int (*allreduce_sum)(snug_comm *c, void *x, size_t n, snug_comm_dtype dt, snug_error *e);
    /* x (n elements) <- root's x on every rank */
    int (*broadcast)(snug_comm *c, void *x, size_t n, snug_comm_dtype dt, int root, snug_error *e);
    int (*barrier)(snug_comm *c, snug_error *e);
    /* the sharded collectives above: x holds the sum of counts[0..size-1] elements of dt */
    int (*reduce_scatter_sum)(snug_comm *c, void *x, const size_t *counts, snug_comm_dtype dt, snug_error *e);
    int (*allgather)(snug_comm *c, void *x, const size_t *counts, snug_comm_dtype dt, snug_error *e);
    /* the work queued after this call sees every SNUG_COMM_ASYNC collective (and send) issued before it complete */
    int (*wait)(snug_comm *c, snug_error *e);
    /* a fatal error on this rank: the other ranks must not wait for it forever (MPI_Abort under MPI) */
    void (*abort)(snug_comm *c, int code);
    /* out <- a communicator of the ranks that pass the same color, ranked by key (ties by rank), with c's settings
     * (deterministic, check, timeout_s, local_rank); collective over c. NULL where not built (NCCL). Close out with
     * snug_comm_close before c. */
    int (*split)(snug_comm *c, int color, int key, snug_comm *out, snug_error *e);
    /* point to point (pipeline parallelism): n elements of dt to / from rank peer of c (another rank of c: never
     * this one). Not collective: only the two ranks take part, they pair their sends and receives in the same order
     * with the same count and type, seq does not count them and `check` does not compare them. send flagged
     * SNUG_COMM_ASYNC returns at once: the caller leaves x alone until its next `wait`, which completes every such
     * send issued so far. Without the flag, send returns once x may be reused, which can mean once the peer has
     * received it: two ranks that both send before they receive deadlock (until timeout_s), so a ring exchange
     * sends flagged, receives, then waits. recv returns with x filled (it ignores the flag), and fails if the
     * message held another count. A peer that is not another rank of c fails at once, with nothing sent. Both honour
     * timeout_s (naming the peer); after a timeout the communicator is good only for abort and close. Closing with
     * flagged sends not yet waited for releases them without completing them. NULL where not built: self (no other
     * rank), NCCL (pipeline parallelism runs on CPU ranks only for now). */
    int (*send)(snug_comm *c, const void *x, size_t n, snug_comm_dtype dt, int peer, snug_error *e);
    int (*recv)(snug_comm *c, void *x, size_t n, snug_comm_dtype dt, int peer, snug_error *e);
    void (*free)(snug_comm *c);
};

/* The rank and world size the launcher gave this process, read from its environment without any library:
 * mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), MPICH/Intel MPI (PMI_RANK/PMI_SIZE), Slurm's srun
 * (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID) and torchrun-style launchers (RANK/WORLD_SIZE/LOCAL_RANK, with
 * MASTER_ADDR/MASTER_PORT). `launcher` names the one found ("none": a single process). */
typedef struct snug_launch {
    int rank, size, local_rank;
    int local_size;       /* torchrun's LOCAL_WORLD_SIZE: the processes on this node (0: not said) */
    const char *launcher;
    char master_addr[256];
    int master_port;
} snug_launch;

/* Fills l from the environment; fails on a malformed or inconsistent value (rank outside 0..size-1), naming it. */
int snug_launch_detect(snug_launch *l, snug_error *e);

/* The single process: rank 0 of 1. Never fails. */
void snug_comm_self_init(snug_comm *c);

/* Whether this build has the MPI communicator. */
int snug_comm_mpi_available(void);

/* MPI_Init (once) and the world communicator; fails if the build has no MPI or the library cannot start. */
int snug_comm_mpi_init(snug_comm *c, snug_error *e);

/* Whether this build has the NCCL communicator (comm_nccl.c: compiled with the CUDA backend; NCCL itself is opened
 * at run time, so this says nothing about whether the library is installed). */
int snug_comm_nccl_available(void);

/* Turns c, a host communicator (self or MPI) already open, into the NCCL communicator over the same ranks, on the
 * GPU of the CUDA backend be: NCCL is opened (dlopen "libnccl.so.2", or the file SNUG_NCCL names), rank 0 makes the
 * unique id and broadcasts it through c, and every rank joins; c's collectives then take device buffers and run on
 * the communicator's own stream, ordered after be's compute stream by events, and the compute stream waits for each
 * one's completion, with no host wait. c keeps its rank, size and settings; buffers flagged SNUG_COMM_HOST still go
 * through the wrapped host communicator, which snug_comm_close closes too. On failure c is left as it was (the host
 * communicator) and every rank fails (they agree through c first), naming the library and the fix. */
struct snug_backend;
int snug_comm_nccl_wrap(snug_comm *c, struct snug_backend *be, snug_error *e);

/* The NCCL communicator's own device memory in deterministic mode (ddp_deterministic): its rank-order sums gather
 * SNUG_NCCL_PIECE elements of every rank at a time, 8 bytes each at most, into one scratch of this size, allocated
 * when the communicator is made. The plan counts it with the runtime overhead (plan/gpus.c). */
#define SNUG_NCCL_PIECE ((size_t)1 << 20)
#define SNUG_NCCL_SCRATCH_BYTES(size) ((size_t)(size) * SNUG_NCCL_PIECE * 8)

/* The communicator a run with launch l needs: self for one process, MPI for more (refused without MPI in the build,
 * or under a launcher MPI cannot join, such as torchrun's environment alone). */
int snug_comm_open(snug_comm *c, const snug_launch *l, snug_error *e);

/* Releases c (MPI_Finalize for the last MPI communicator). */
void snug_comm_close(snug_comm *c);

size_t snug_comm_dtype_size(snug_comm_dtype dt);

/* The rank-order sum of `size` contributions laid out one after another in all (size x n elements): out <- all[0] +
 * all[1] + ... in that order. The deterministic all-reduce's arithmetic, shared by the implementations. */
void snug_comm_sum_in_order(void *out, const void *all, int size, size_t n, snug_comm_dtype dt);
/* The same sum over `size` sources anywhere in memory: out <- src[0] + src[1] + ... (out may be one of them). */
void snug_comm_sum_sources(void *out, const void *const *src, int size, size_t n, snug_comm_dtype dt);

/* `wait` with nothing to complete (self): every collective is complete when it returns. */
int snug_comm_wait_done(snug_comm *c, snug_error *e);

/* The element where rank r's segment starts: counts[0] + ... + counts[r-1]. */
size_t snug_comm_displ(const size_t *counts, int r);

#endif
