/* backend_cuda_stream.h: a CUDA backend's compute stream and device, for the code outside the backend that queues
 * device work in the compute stream's order (src/dist/comm_nccl.c). Plain C, no CUDA header: the stream comes back as
 * the cudaStream_t it is, behind a void pointer. Only built with the CUDA backend (SNUG_HAVE_CUDA). */
#ifndef SNUG_BACKEND_CUDA_STREAM_H
#define SNUG_BACKEND_CUDA_STREAM_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

/* be's compute stream (cudaStream_t): every op of be runs on it, in order. be must be a CUDA backend. */
void *snug_cuda_compute_stream(snug_backend *be);

/* The CUDA device be runs on. */
int snug_cuda_device(snug_backend *be);

#ifdef __cplusplus
}
#endif

#endif
