/* device.h: what the plan may ask of a device before any backend exists there.
 *
 * The plan prices a run on a GPU in any build, on any machine (`snug plan --gpu H100`), so the device's needs beyond
 * the arenas are plain C here, without CUDA headers: the reduction scratch the CUDA ops use (backend/cuda sizes its
 * scratch with the same function, so the plan and the allocation cannot disagree). The memory a device could give a
 * run right now is backend_select.h's snug_backend_memory_available. */
#ifndef SNUG_BACKEND_DEVICE_H
#define SNUG_BACKEND_DEVICE_H

#include <stddef.h>
#include <stdint.h>

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
 * more records an error. */
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

#endif
