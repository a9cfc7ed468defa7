/* backend_cuda.h: the public entry points of the CUDA backend (plain C; no CUDA header needed to include it).
 *
 * Only built when snug is configured with CUDA (SNUG_HAVE_CUDA); backend/backend_select.h picks a backend by name
 * and is what the rest of snug calls. The ops behind the returned snug_backend are in the .cu files beside it. */
#ifndef SNUG_BACKEND_CUDA_H
#define SNUG_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* snug's headers are C: inside a .cu file their functions (snug_fail...) must keep C linkage */
#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"
#include "core/error.h"

/* Number of visible CUDA devices; 0 when there is no driver, no device or any other failure. Never aborts. */
int snug_cuda_device_count(void);

/* The CUDA backend on device `device` (0-based): two streams, a cuBLASLt handle and its workspace. NULL with e filled
 * when the device does not exist or CUDA cannot be initialised. */
snug_backend *snug_backend_cuda_create(int device, snug_error *e);

/* Free and total memory of the backend's device in bytes (cudaMemGetInfo); 0 on success, -1 on failure. */
int snug_cuda_mem_info(snug_backend *be, size_t *free_bytes, size_t *total_bytes);

/* The device's name, e.g. "NVIDIA H200". */
const char *snug_cuda_device_name(snug_backend *be);

#ifdef __cplusplus
}
#endif

#endif
