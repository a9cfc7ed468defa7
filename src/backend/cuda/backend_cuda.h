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

/* The CUDA backend on device `device` (0-based): two streams, a cuBLASLt handle and its workspace, and a reduction
 * scratch of scratch_bytes (0: 16 MiB), fixed for the backend's life: no op allocates device memory outside the
 * plan. NULL with e filled when the device does not exist or CUDA cannot be initialised. */
snug_backend *snug_backend_cuda_create_sized(int device, size_t scratch_bytes, snug_error *e);
/* The same with the default 16 MiB scratch. */
snug_backend *snug_backend_cuda_create(int device, snug_error *e);

/* The ops' reduction shapes, which size the scratch (ops_cuda.cu's column sums, adamw_cuda.cu's sum of squares). */
#define SNUG_CUDA_COLSUM_SLICES 64
#define SNUG_CUDA_SUMSQ_BLOCKS 1024

/* The power of two >= n, at least 2: the length of embed_bwd's sort. */
static inline size_t snug_cuda_pow2ceil(size_t n) {
    size_t p = 2;
    while (p < n)
        p <<= 1;
    return p;
}

/* Bytes of scratch the CUDA ops need for micro-batches of up to N tokens (B*T), NH query heads and column sums
 * (bias and norm-weight gradients) up to `width` columns (the largest of C, QKV and FC): the largest single use,
 *   sumsq             (SNUG_CUDA_SUMSQ_BLOCKS + 1) doubles
 *   column sums       2 * SNUG_CUDA_COLSUM_SLICES * width doubles (LayerNorm's weight and bias together)
 *   attention bwd     N * NH floats of row sums (the naive backward's B*NH*T is the same)
 *   loss              N + 1 doubles, to 256 bytes (a 16-bit head passed without w_ws widens rows into the rest)
 *   embedding bwd     snug_cuda_pow2ceil(N) 8-byte sort keys
 *   16-bit operands   N * op16 16-bit values (matmul_w16 rounds a GEMM's activation operand; op16: the widest
 *                     activation of a linear layer, the same as width, when the run's GEMMs read 16-bit weights as
 *                     stored, else 0)
 * It is the allocation: the plan counts it (plan/gpus.c) and the backend is created with it; an op that asks for
 * more records an error. Plain C without CUDA headers, so the plan can price it in any build. */
static inline size_t snug_cuda_scratch_bytes(size_t N, int NH, int width, int op16) {
    size_t need = ((size_t)SNUG_CUDA_SUMSQ_BLOCKS + 1) * sizeof(double);
    size_t colsum = 2 * (size_t)SNUG_CUDA_COLSUM_SLICES * (size_t)(width > 0 ? width : 0) * sizeof(double);
    size_t att = N * (size_t)(NH > 0 ? NH : 0) * sizeof(float);
    size_t loss = ((N + 1) * sizeof(double) + 255) / 256 * 256;
    size_t sort = snug_cuda_pow2ceil(N) * sizeof(uint64_t);
    size_t w16 = N * (size_t)(op16 > 0 ? op16 : 0) * 2;
    need = w16 > need ? w16 : need;
    need = colsum > need ? colsum : need;
    need = att > need ? att : need;
    need = sort > need ? sort : need;
    return loss > need ? loss : need;
}

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
