/* convert_cpu.c: the CPU backend's 16-bit storage ops (to16, from16, bf16_sr) and the row converters the other CPU
 * ops use to read 16-bit tensors (embeddings, the output projection, sumsq).
 *
 * bf16 is the top half of an fp32 bit pattern, so its conversions are integer arithmetic the compiler vectorizes.
 * fp16 uses the F16C conversion instructions 16 values at a time where the build targets them (round to nearest
 * even, overflow to inf), else core/dtype.c's portable conversions: the same bits either way, checked in test_ops. */
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "backend/cpu/ops_cpu.h"

#define NT(be) ((be)->nthreads)

static inline uint32_t f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static inline float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t bf16_rne(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN stays a (quiet) NaN */
        return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* n fp16 values to fp32 */
static void f16_row_to_f32(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#endif
    for (; i < n; i++)
        dst[i] = snug_f16_to_f32(src[i]);
}

/* n fp32 values to fp16 (dst may be NULL), rounding src in place when asked */
static void f32_row_to_f16(uint16_t *dst, float *src, size_t n, int round_src) {
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (dst)
            _mm256_storeu_si256((__m256i *)(dst + i), h);
        if (round_src)
            _mm512_storeu_ps(src + i, _mm512_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) {
        uint16_t h = snug_f32_to_f16(src[i]);
        if (dst)
            dst[i] = h;
        if (round_src)
            src[i] = snug_f16_to_f32(h);
    }
}

void snug_cpu_row_to_f32(float *dst, const void *src, snug_dtype dt, size_t n) {
    if (dt == SNUG_DT_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == SNUG_DT_BF16) {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = bits_f32((uint32_t)s[i] << 16);
    } else {
        f16_row_to_f32(dst, src, n);
    }
}

void snug_cpu_row_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_rne(src[i]);
}

void snug_cpu_to16(snug_backend *be, void *dst, float *src, size_t n, snug_dtype dt, int round_src) {
    uint16_t *d = dst;
    if (dt == SNUG_DT_BF16) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            uint16_t h = bf16_rne(src[i]);
            if (round_src)
                src[i] = bits_f32((uint32_t)h << 16);
            if (d)
                d[i] = h;
        }
    } else {
        const size_t piece = 1 << 14;
        size_t np = (n + piece - 1) / piece;
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
        for (size_t k = 0; k < np; k++) {
            size_t i0 = k * piece, len = n - i0 < piece ? n - i0 : piece;
            f32_row_to_f16(d ? d + i0 : NULL, src + i0, len, round_src);
        }
    }
}

void snug_cpu_from16(snug_backend *be, float *dst, const void *src, size_t n, snug_dtype dt) {
    const size_t piece = 1 << 16; /* pieces for the thread team; each is one row conversion */
    size_t np = (n + piece - 1) / piece;
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t k = 0; k < np; k++) {
        size_t i0 = k * piece, len = n - i0 < piece ? n - i0 : piece;
        snug_cpu_row_to_f32(dst + i0, (const uint16_t *)src + i0, dt, len);
    }
}

void snug_cpu_bf16_sr(snug_backend *be, uint16_t *dst, const float *src, size_t n, uint64_t seed) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        uint32_t x = f32_bits(src[i]);
        if ((x & 0x7f800000u) == 0x7f800000u) { /* inf and NaN: nearest */
            dst[i] = bf16_rne(src[i]);
            continue;
        }
        /* adding r < 2^16 carries into the kept half with probability (low bits)/2^16; a carry out of the largest
         * finite bf16 gives inf, as rounding up would */
        dst[i] = (uint16_t)((x + (snug_sr_bits(seed, i) & 0xffffu)) >> 16);
    }
}
