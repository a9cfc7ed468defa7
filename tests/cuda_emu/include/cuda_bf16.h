/* cuda_bf16.h (emulated CUDA): the bf16 types and the conversions snug's kernels use, rounding as the GPU rounds
 * (to nearest, ties to even; a NaN stays a NaN). */
#ifndef SNUG_EMU_CUDA_BF16_H
#define SNUG_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t __x;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        h.__x = 0x7fffu; /* the GPU's canonical NaN */
    else
        h.__x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    __nv_bfloat162 r;
    r.x = __float2bfloat16_rn(a);
    r.y = __float2bfloat16_rn(b);
    return r;
}

#endif
