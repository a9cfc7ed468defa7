/* comm_nccl_lib.h: NCCL as comm_nccl.c calls it: the part of its ABI snug uses, declared here so building needs no
 * NCCL header (where nccl.h is found, CMake defines SNUG_HAVE_NCCL_H and the declarations are checked against it),
 * the library opened at run time, and a rank's join within dist_timeout (comm_nccl_lib.c). */
#ifndef SNUG_DIST_COMM_NCCL_LIB_H
#define SNUG_DIST_COMM_NCCL_LIB_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "core/error.h"

typedef struct nccl_comm_s *nccl_comm_t;              /* ncclComm_t */
typedef struct nccl_id { char internal[128]; } nccl_id; /* ncclUniqueId */
typedef int nccl_result;                              /* ncclResult_t */
enum { NCCL_OK = 0, NCCL_IN_PROGRESS = 7 };
enum { NCCL_UINT8 = 1, NCCL_INT64 = 4, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8 }; /* ncclDataType_t */
enum { NCCL_SUM = 0 };                                                      /* ncclRedOp_t */

#ifdef SNUG_HAVE_NCCL_H
#include <nccl.h>
_Static_assert(sizeof(ncclUniqueId) == sizeof(nccl_id), "ncclUniqueId's size");
_Static_assert((int)ncclSuccess == NCCL_OK && (int)ncclInProgress == NCCL_IN_PROGRESS, "ncclResult_t's values");
_Static_assert((int)ncclUint8 == NCCL_UINT8 && (int)ncclInt64 == NCCL_INT64 && (int)ncclFloat32 == NCCL_FLOAT32 &&
                   (int)ncclFloat64 == NCCL_FLOAT64 && (int)ncclSum == NCCL_SUM,
               "ncclDataType_t's and ncclRedOp_t's values");
#endif

typedef struct nccl_api {
    nccl_result (*GetVersion)(int *version);
    nccl_result (*GetUniqueId)(nccl_id *id);
    nccl_result (*CommInitRank)(nccl_comm_t *comm, int nranks, nccl_id id, int rank);
    nccl_result (*CommDestroy)(nccl_comm_t comm);
    nccl_result (*CommAbort)(nccl_comm_t comm);
    nccl_result (*CommGetAsyncError)(nccl_comm_t comm, nccl_result *err);
    const char *(*GetErrorString)(nccl_result r);
    const char *(*GetLastError)(nccl_comm_t comm);
    nccl_result (*AllReduce)(const void *s, void *r, size_t n, int dt, int op, nccl_comm_t c, cudaStream_t st);
    nccl_result (*Broadcast)(const void *s, void *r, size_t n, int dt, int root, nccl_comm_t c, cudaStream_t st);
    nccl_result (*Reduce)(const void *s, void *r, size_t n, int dt, int op, int root, nccl_comm_t c, cudaStream_t st);
    nccl_result (*AllGather)(const void *s, void *r, size_t n, int dt, nccl_comm_t c, cudaStream_t st);
    nccl_result (*Send)(const void *s, size_t n, int dt, int peer, nccl_comm_t c, cudaStream_t st);
    nccl_result (*Recv)(void *r, size_t n, int dt, int peer, nccl_comm_t c, cudaStream_t st);
    nccl_result (*GroupStart)(void);
    nccl_result (*GroupEnd)(void);
} nccl_api;

/* NCCL's entry points, filled once by snug_nccl_load and never unloaded. */
extern nccl_api snug_nccl;

/* Opens NCCL: SNUG_NCCL's file, or libnccl.so.2 on the loader's path, then in the CUDA toolkit found at build time.
 * 0 once loaded (a failure is not kept: the next call tries again); else SNUG_EINPUT naming the library and the fix. */
int snug_nccl_load(snug_error *e);

/* The rank's NCCL communicator in *comm (0), or why not in why: 1 failed, 2 timed out (timeout_s <= 0: wait as long
 * as NCCL does). See comm_nccl_lib.c. */
int snug_nccl_join_timed(int device, int nranks, nccl_id id, int rank, double timeout_s, nccl_comm_t *comm, char *why,
                         size_t whylen);

#endif
