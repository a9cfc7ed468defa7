/* attention_cuda.h: what attention_cuda.cu (the plain and tiled rungs, and the choice among the rungs) and
 * attention_warp_cuda.cu (the warp-per-row kernels: the naive path and decode) share: device helpers of the kernels
 * and two host ones. */
#ifndef SNUG_BACKEND_CUDA_ATTENTION_H
#define SNUG_BACKEND_CUDA_ATTENTION_H

#include "backend/cuda/cuda_internal.h"

#define ATT_WARP_MAXJ 8      /* columns per lane of the warp-per-row kernels: HD <= 32 * 8 = 256 */

/* First key of query token n (row-local index t), clamped into [0, t], as on the CPU. */
static __device__ __forceinline__ int att_first_key(const int32_t *seg, size_t n, int t) {
    int lo = seg ? seg[n] : 0;
    return lo < 0 ? 0 : lo > t ? t : lo;
}

/* Sum and max over the 16 lanes of a half warp (the tiled kernels' tx). Butterfly order: every lane gets the same
 * bits. */
static __device__ __forceinline__ float att_sum16(float v) {
    for (int o = 8; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float att_max16(float v) {
    for (int o = 8; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float att_sum32(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A head dim the kernels cannot run: recorded as the backend's error (config validation keeps HD within
 * SNUG_MAX_HEAD_DIM, so this is a bug); the op does nothing. */
#define att_fail(be, line, what, HD, limit) \
    snug_cuda_fail((be), __FILE__, (line), "%s: head dim %d is above the supported %d", (what), (HD), (limit))

/* Blocks of per_block threads covering `threads` threads. */
static inline unsigned int att_blocks(size_t threads, int per_block) {
    return (unsigned int)((threads + per_block - 1) / per_block);
}

#endif
