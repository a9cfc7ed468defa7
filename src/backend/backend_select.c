/* backend_select.c: choosing a backend for the configuration's `device` (see backend_select.h).
 *
 * Compiled in every build; the CUDA branch exists only when snug was configured with CUDA (SNUG_HAVE_CUDA), so a
 * CPU-only build needs no CUDA header or library. A CUDA build still runs on a machine without a GPU or driver:
 * auto then falls back to the CPU. */
#include "backend/backend_select.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/blas_cpu.h"

#ifdef SNUG_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

static snug_backend *create_cpu(int nthreads, snug_error *e) {
    snug_backend *be = snug_backend_cpu_create(nthreads);
    if (!be && snug_cpu_blas_error()[0])
        snug_fail(e, SNUG_EINPUT, "%s", snug_cpu_blas_error());
    else if (!be)
        snug_fail(e, SNUG_ENOMEM, "cannot create the CPU backend (out of memory)");
    return be;
}

static int gpu_index; /* snug_backend_use_gpu's choice */

void snug_backend_use_gpu(int index) { gpu_index = index > 0 ? index : 0; }

snug_backend *snug_backend_create(snug_backend_choice device, int nthreads, size_t device_scratch, snug_error *e) {
    int is_auto = device == SNUG_BACKEND_AUTO, is_cuda = device == SNUG_BACKEND_CUDA;
    if (is_auto || is_cuda) {
#ifdef SNUG_HAVE_CUDA
        /* cuda: the CUDA backend or its reason for failing (no GPU, driver too old...); auto: the CPU unless a GPU
         * is visible, and then the GPU's errors are reported, not hidden behind a silent fallback */
        int n = snug_cuda_device_count();
        if (n > 0 && gpu_index >= n) { /* a rank's GPU by its local rank: more ranks than GPUs here */
            snug_fail(e, SNUG_EINPUT, "this rank runs on GPU %d (its local rank) but %d %s visible; launch at most %d "
                      "rank%s per host (or make more GPUs visible: CUDA_VISIBLE_DEVICES)", gpu_index, n,
                      n == 1 ? "GPU is" : "GPUs are", n, n == 1 ? "" : "s");
            return NULL;
        }
        if (is_cuda || n > 0)
            return snug_backend_cuda_create_sized(gpu_index, device_scratch, e);
#else
        (void)device_scratch;
        if (is_cuda) {
            snug_fail(e, SNUG_EINPUT, "device: cuda but this snug was built without CUDA; rebuild with the CUDA "
                      "toolkit installed (cmake -DSNUG_CUDA=ON), or use device: cpu or auto");
            return NULL;
        }
#endif
    }
    return create_cpu(nthreads, e);
}

snug_backend_choice snug_backend_resolve(snug_backend_choice device) {
    if (device == SNUG_BACKEND_CUDA)
        return SNUG_BACKEND_CUDA;
#ifdef SNUG_HAVE_CUDA
    if (device == SNUG_BACKEND_AUTO && snug_cuda_device_count() > 0)
        return SNUG_BACKEND_CUDA;
#endif
    return SNUG_BACKEND_CPU;
}

size_t snug_backend_device_used(snug_backend *be) {
    size_t free_b = 0, total_b = 0;
    return be->mem_info && be->mem_info(be, &free_b, &total_b) == 0 ? total_b - free_b : 0;
}

size_t snug_backend_device_free(snug_backend *be) {
    size_t free_b = 0, total_b = 0;
    return be->mem_info && be->mem_info(be, &free_b, &total_b) == 0 ? free_b : 0;
}

size_t snug_backend_memory_available(snug_backend_choice device) {
#ifdef SNUG_HAVE_CUDA
    if (snug_backend_resolve(device) == SNUG_BACKEND_CUDA)
        return snug_cuda_device_free(gpu_index);
#else
    (void)device;
#endif
    size_t kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    if (kib)
        return kib * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (size_t)pages * (size_t)size : 0;
}
