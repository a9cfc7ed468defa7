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
#include "backend/device.h"
#include "core/error.h"

/* Number of visible CUDA devices; 0 when there is no driver, no device or any other failure. Never aborts. */
int snug_cuda_device_count(void);

/* The CUDA backend on device `device` (0-based): two streams, a cuBLASLt handle and its workspace, and a reduction
 * scratch of scratch_bytes (0: 16 MiB), fixed for the backend's life: no op allocates device memory outside the
 * plan. NULL with e filled when the device does not exist or CUDA cannot be initialised. */
snug_backend *snug_backend_cuda_create_sized(int device, size_t scratch_bytes, snug_error *e);
/* The same with the default 16 MiB scratch. */
snug_backend *snug_backend_cuda_create(int device, snug_error *e);

/* Free and total memory of the backend's device in bytes (cudaMemGetInfo); 0 on success, -1 on failure. */
int snug_cuda_mem_info(snug_backend *be, size_t *free_bytes, size_t *total_bytes);
/* Free memory on GPU `device` before any backend exists there (cudaSetDevice, cudaMemGetInfo); 0 when it cannot
 * tell. */
size_t snug_cuda_device_free(int device);

/* The device's name, e.g. "NVIDIA H200". */
const char *snug_cuda_device_name(snug_backend *be);

/* The GEMM behind the CUDA backend's linear layers and loss (matmul_cuda.cu), public for its tests: column-major
 * C (m,n) = alpha * op(A) @ op(B) + beta * C on the compute stream, ta/tb transposing, A stored (m,k) or transposed
 * (k,m) with leading dimension lda, B likewise (k,n) or (n,k). A and B both stored as ab (F32, BF16 or F16), C as
 * cdt (F32, or a 16-bit type), accumulation in fp32: 16-bit operands reach the tensor cores as stored, fp32 ones
 * multiply in exact fp32, or under be->math BF16/F16 rounded to it by cuBLASLt. With bias (m floats; beta 0 and an
 * fp32 C) C = op(A) @ op(B) + bias broadcast along C's columns, by cuBLASLt's bias epilogue where it has one for the
 * problem, else written first with the product added onto it. Failures are recorded (be->check). */
void snug_cuda_gemm_ex(snug_backend *be, int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda,
                       const void *B, int ldb, snug_dtype ab, float beta, void *C, int ldc, snug_dtype cdt,
                       const float *bias);

/* The GEMM plan cache: plans held now, and (when not NULL) the GEMMs that found theirs there since the backend was
 * created. */
int snug_cuda_gemm_plans(snug_backend *be, long long *hits);

#ifdef __cplusplus
}
#endif

#endif
