/* backend_select.h: choosing a backend by the config's `device` key.
 *
 * The one place that knows which backends this build has: the rest of snug asks for "auto", "cuda" or "cpu" and
 * gets a snug_backend, whatever was compiled in. */
#ifndef SNUG_BACKEND_SELECT_H
#define SNUG_BACKEND_SELECT_H

#include "backend/backend.h"
#include "core/error.h"

/* device: "auto" (or NULL): CUDA when snug was built with it and a GPU is visible, else the CPU; "cuda": GPU 0, an
 * error (SNUG_EINPUT) when the build has no CUDA or no GPU is visible; "cpu": the CPU backend on nthreads threads
 * (<= 0: all cores). Anything else is an error naming the allowed values. NULL with e filled on failure. */
snug_backend *snug_backend_create(const char *device, int nthreads, snug_error *e);

/* The backend `device` would give, without creating it: "cuda" or "cpu" ("auto" resolves as snug_backend_create
 * does: cuda when built with it and a GPU is visible). The plan counts that backend's runtime overhead. */
const char *snug_backend_resolve(const char *device);

/* Device memory in use on be's device right now (total - free), for the measured peak beside the plan; 0 when the
 * backend is not a GPU or cannot tell. */
size_t snug_backend_device_used(snug_backend *be);
/* Free memory on be's device right now (cudaMemGetInfo); 0 when the backend is not a GPU or cannot tell. */
size_t snug_backend_device_free(snug_backend *be);

#endif
