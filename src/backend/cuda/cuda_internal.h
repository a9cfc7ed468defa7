/* cuda_internal.h: what the CUDA backend's files share: the context behind snug_backend.ctx, the error check, and
 * the prototypes of the ops each .cu file fills. Nothing here is public; backend/backend.h gives the semantics. */
#ifndef SNUG_CUDA_INTERNAL_H
#define SNUG_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"

/* A failed CUDA call inside an op has no error path (ops return void, like the CPU's): report where and abort. */
#define SNUG_CUDA_CHECK(call)                                                                              \
    do {                                                                                                   \
        cudaError_t err_ = (call);                                                                         \
        if (err_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "snug: CUDA error at %s:%d: %s (%s)\n", __FILE__, __LINE__, cudaGetErrorString(err_), \
                    #call);                                                                                \
            abort();                                                                                       \
        }                                                                                                  \
    } while (0)

typedef struct snug_cuda_ctx {
    int device;
    cudaStream_t stream;      /* every op runs on this stream, in order */
    cudaStream_t side;        /* copies of paged optimizer state and offloaded activations */
    cublasLtHandle_t lt;
    void *lt_ws;              /* cuBLASLt workspace */
    size_t lt_ws_bytes;
} snug_cuda_ctx;

static inline snug_cuda_ctx *snug_cuda(snug_backend *be) { return (snug_cuda_ctx *)be->ctx; }
static inline cudaStream_t snug_cuda_stream(snug_backend *be) { return snug_cuda(be)->stream; }

#endif
