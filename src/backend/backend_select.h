/* backend_select.h: choosing a backend for the configuration's `device`.
 *
 * The one place that knows which backends this build has: the rest of snug asks for auto, cuda or cpu and gets a
 * snug_backend, whatever was compiled in. */
#ifndef SNUG_BACKEND_SELECT_H
#define SNUG_BACKEND_SELECT_H

#include "backend/backend.h"
#include "core/error.h"

/* Where to run (the config's `device`). */
typedef enum snug_backend_choice { SNUG_BACKEND_AUTO, SNUG_BACKEND_CPU, SNUG_BACKEND_CUDA } snug_backend_choice;

/* The GPU every CUDA backend created after this call runs on (0 until then): a rank of a data-parallel run uses the
 * GPU of its local rank, set once before its engine exists. */
void snug_backend_use_gpu(int index);

/* SNUG_BACKEND_AUTO: CUDA when snug was built with it and a GPU is visible, else the CPU; SNUG_BACKEND_CUDA: the GPU
 * snug_backend_use_gpu chose (0 by default),
 * an error (SNUG_EINPUT) when the build has no CUDA or no GPU is visible; SNUG_BACKEND_CPU: the CPU backend on
 * nthreads threads (<= 0: all cores). device_scratch: the bytes of a GPU backend's fixed reduction scratch (0: its
 * default; snug_cuda_scratch_bytes sizes it from the model's shape). NULL with e filled on failure. */
snug_backend *snug_backend_create(snug_backend_choice device, int nthreads, size_t device_scratch, snug_error *e);

/* The backend `device` would give, without creating it: SNUG_BACKEND_CUDA or SNUG_BACKEND_CPU (AUTO resolves as
 * snug_backend_create does). The plan counts that backend's runtime overhead. */
snug_backend_choice snug_backend_resolve(snug_backend_choice device);

/* Device memory in use on be's device right now (total - free), for the measured peak beside the plan; 0 when the
 * backend is not a GPU or cannot tell. */
size_t snug_backend_device_used(snug_backend *be);
/* Free memory on be's device right now (cudaMemGetInfo); 0 when the backend is not a GPU or cannot tell. */
size_t snug_backend_device_free(snug_backend *be);

/* The memory a run on `device` could take right now, before its backend exists: on a GPU (the one
 * snug_backend_use_gpu chose) its free memory, on the CPU the host's available memory (MemAvailable of
 * /proc/meminfo, else the free pages). 0 when it cannot tell. */
size_t snug_backend_memory_available(snug_backend_choice device);

#endif
