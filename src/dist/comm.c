/* comm.c: what every communicator shares: choosing one for a launch, closing it, and the rank-order sum of the
 * deterministic all-reduce (see comm.h). */
#include "dist/comm.h"

#include <string.h>

size_t snug_comm_dtype_size(snug_comm_dtype dt) {
    dt = snug_comm_type(dt);
    return dt == SNUG_COMM_F32 ? 4 : dt == SNUG_COMM_U16 ? 2 : 8;
}

/* out[0..n) <- src(0) + src(1) + ... + src(size-1), element by element in rank order, where src(r) is srcs[r] or,
 * without srcs, all + r x n; through a block that stays in L1, so out may be any of the sources and the loops
 * vectorise. */
#define SUM_BLOCK 1024
#define SUM_IN_ORDER(T)                                                                                  \
    static void sum_##T(T *out, const void *const *srcs, const T *all, int size, size_t n) {             \
        T t[SUM_BLOCK];                                                                                  \
        for (size_t i = 0; i < n; i += SUM_BLOCK) {                                                      \
            size_t m = n - i < SUM_BLOCK ? n - i : SUM_BLOCK;                                            \
            for (int r = 0; r < size; r++) {                                                             \
                const T *b = (srcs ? (const T *)srcs[r] : all + (size_t)r * n) + i;                      \
                if (r == 0)                                                                              \
                    memcpy(t, b, m * sizeof *t);                                                         \
                else                                                                                     \
                    for (size_t j = 0; j < m; j++)                                                       \
                        t[j] += b[j];                                                                    \
            }                                                                                            \
            memcpy(out + i, t, m * sizeof *t);                                                           \
        }                                                                                                \
    }
SUM_IN_ORDER(float)
SUM_IN_ORDER(double)
SUM_IN_ORDER(int64_t)

static void sum_any(void *out, const void *const *srcs, const void *all, int size, size_t n, snug_comm_dtype dt) {
    dt = snug_comm_type(dt);
    if (dt == SNUG_COMM_F32)
        sum_float(out, srcs, all, size, n);
    else if (dt == SNUG_COMM_F64)
        sum_double(out, srcs, all, size, n);
    else
        sum_int64_t(out, srcs, all, size, n);
}

void snug_comm_sum_in_order(void *out, const void *all, int size, size_t n, snug_comm_dtype dt) {
    sum_any(out, NULL, all, size, n, dt);
}

void snug_comm_sum_sources(void *out, const void *const *src, int size, size_t n, snug_comm_dtype dt) {
    sum_any(out, src, NULL, size, n, dt);
}

int snug_comm_wait_done(snug_comm *c, snug_error *e) {
    (void)c, (void)e;
    return 0;
}

size_t snug_comm_displ(const size_t *counts, int r) {
    size_t d = 0;
    for (int k = 0; k < r; k++)
        d += counts[k];
    return d;
}

#ifndef SNUG_HAVE_CUDA
int snug_comm_nccl_available(void) { return 0; }

int snug_comm_nccl_wrap(snug_comm *c, struct snug_backend *be, snug_error *e) {
    (void)c, (void)be;
    return snug_fail(e, SNUG_EINPUT, "this snug was built without CUDA, so it has no NCCL communicator; build with "
                     "the CUDA toolkit (cmake -DSNUG_CUDA=ON)");
}
#endif

#ifndef SNUG_HAVE_MPI
int snug_comm_mpi_available(void) { return 0; }

int snug_comm_mpi_init(snug_comm *c, snug_error *e) {
    (void)c;
    return snug_fail(e, SNUG_EINPUT, "this snug was built without MPI, so it cannot run as several ranks; install "
                     "Open MPI (scripts/setup.sh: libopenmpi-dev openmpi-bin) and build again");
}
#endif

int snug_comm_open(snug_comm *c, const snug_launch *l, snug_error *e) {
    if (l->size <= 1) {
        snug_comm_self_init(c);
        return 0;
    }
    if (!strcmp(l->launcher, "torchrun")) /* on one node `snug train` hands over to mpirun first (cli/main.c) */
        return snug_fail(e, SNUG_EINPUT, "RANK=%d WORLD_SIZE=%d (a torchrun-style launch%s): snug's ranks talk through "
                         "MPI, which torchrun's processes cannot join; launch with mpirun -np %d snug train ... (with "
                         "a hostfile over several nodes) or srun", l->rank, l->size,
                         l->local_size && l->local_size != l->size ? " over several nodes" : "", l->size);
    SNUG_TRY(snug_comm_mpi_init(c, e));
    if (c->size != l->size || c->rank != l->rank)
        return snug_fail(e, SNUG_EINTERNAL, "the %s launcher says rank %d of %d but MPI says rank %d of %d; launch "
                         "with the mpirun of the MPI snug was built with", l->launcher, l->rank, l->size, c->rank,
                         c->size);
    c->local_rank = l->local_rank;
    return 0;
}

void snug_comm_close(snug_comm *c) {
    if (c->free)
        c->free(c);
    memset(c, 0, sizeof *c);
}
