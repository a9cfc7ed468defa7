/* expf_cpu.h: expf over arrays, in SIMD lanes, with glibc's bits.
 *
 * The softmaxes (attention, the loss) and SwiGLU spend much of their time in expf, which libm computes one value per
 * call. snug_cpu_expf_n computes a whole array with the algorithm of glibc's expf (since 2.28; ARM's optimized
 * routines): x * 32/ln2 = k + r, exp(x) = 2^(k/32) * 2^(r/32) with 2^(k/32) from a 32-entry table and 2^(r/32) a
 * cubic in r, in double, rounded once to float. The operations are those of the variant glibc runs on a processor
 * with FMA (__expf_fma: the same fused multiply-adds), so on such a processor every result has libm's bits and
 * training computes what it computed with libm (tests/unit/test_ops.c checks it over a sweep of every exponent);
 * elsewhere the results are within libm's error bound of it. Arguments whose magnitude is 88 or more (overflow,
 * underflow, inf, NaN) go to libm's expf itself, except -inf, whose exp is 0. */
#ifndef SNUG_EXPF_CPU_H
#define SNUG_EXPF_CPU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^(i/32) as double bits, less i << 47 (the exponent the index adds back) */
static const uint64_t snug_expf_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

static inline double snug_expf_d(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* exp(x) for |x| < 88 (other x give garbage, never a trap) */
static inline float snug_expf_core(float x) {
    const double inv_ln2_32 = 0x1.71547652b82fep+5, shift = 0x1.8p+52;
    const double c0 = 0x1.c6af84b912394p-20, c1 = 0x1.ebfce50fac4f3p-13, c2 = 0x1.62e42ff0c52d6p-6;
    double xd = (double)x;
    double kd = fma(inv_ln2_32, xd, shift); /* k in its low bits, rounded to nearest */
    uint64_t ki;
    memcpy(&ki, &kd, 8);
    kd -= shift;
    double r = fma(inv_ln2_32, xd, -kd); /* in [-1/2, 1/2] */
    double s = snug_expf_d(snug_expf_tab[ki & 31] + (ki << 47));
    double z = fma(r, c0, c1), r2 = r * r, y = fma(r, c2, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

/* |x| >= 88, inf or NaN: libm's expf takes these */
static inline int snug_expf_big(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return ((u >> 20) & 0x7ff) >= 0x42b;
}

/* y (n) = expf(x (n)); y may be x. 64 at a time: one SIMD pass, then libm for the rare large arguments. */
static inline void snug_cpu_expf_n(float *y, const float *x, int n) {
    for (int i0 = 0; i0 < n; i0 += 64) {
        int m = n - i0 < 64 ? n - i0 : 64, special = 0;
        float a[64];
        memcpy(a, x + i0, (size_t)m * sizeof(float));
        float *o = y + i0;
#pragma omp simd reduction(| : special)
        for (int i = 0; i < m; i++) {
            special |= snug_expf_big(a[i]);
            o[i] = snug_expf_core(a[i]);
        }
        if (special)
            for (int i = 0; i < m; i++)
                if (snug_expf_big(a[i]))
                    o[i] = a[i] == -INFINITY ? 0.0f : expf(a[i]);
    }
}

#endif
