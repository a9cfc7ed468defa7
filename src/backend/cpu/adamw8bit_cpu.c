/* adamw8bit_cpu.c: the CPU backend's 8-bit optimizer ops: blockwise quantize/dequantize and the 8-bit AdamW step
 * (semantics in backend/backend.h).
 *
 * A port of bitsandbytes' CUDA kernels (csrc kernels: quantize_2D, kOptimizerStatic8bit2StateBlockwise) with one CUDA
 * block of 256 threads becoming one loop iteration over a 256-element block. Blocks are independent and each is
 * handled whole by one thread, so the result does not depend on the thread count. Differences from the CUDA kernel,
 * none of which changes a code except at exact ties: plain division and powf instead of __fdividef/__powf, no fused
 * multiply-adds, and the new absmax of a short last block is the maximum over its real elements (the kernel also
 * sees its padding, 128/0 codes of zero gradients, which can only matter for an all-zero block). */
#include <math.h>

#include "backend/cpu/ops_cpu.h"

#define QBLK 256
#define NT(be) ((be)->nthreads)

/* bitsandbytes' quantize_2D for the len (<= 256) values s of one block of absmax amax: x = s/amax, then a 7-step
 * binary search over the sorted code (first pivot 127), then the nearer of the last value and its neighbour on x's
 * side, by their midpoint (lower starts at -1 for the signed map, 0 for the unsigned one; upper at 1). With
 * is_signed, a code whose sign differs from s moves one step toward s's sign, as the optimizer kernel does for the
 * momentum, so a small momentum never flips direction. The search runs lane by lane over the block (arrays, no
 * branches), which compilers vectorize with gathers: about ten times faster than one value at a time. */
static void quantize_block(uint8_t *q, const float *s, size_t len, float amax, const float *code, int is_signed) {
    float x[QBLK], val[QBLK], lower[QBLK], upper[QBLK];
    int pivot[QBLK], lower_pivot[QBLK], upper_pivot[QBLK];
    for (size_t j = 0; j < len; j++) {
        x[j] = amax > 0.0f ? s[j] / amax : 0.0f;
        pivot[j] = 127, lower_pivot[j] = 0, upper_pivot[j] = 255;
        lower[j] = is_signed ? -1.0f : 0.0f, upper[j] = 1.0f, val[j] = code[127];
    }
    for (int i = 64; i > 0; i >>= 1)
        for (size_t j = 0; j < len; j++) {
            int gt = x[j] > val[j];
            lower_pivot[j] = gt ? pivot[j] : lower_pivot[j];
            lower[j] = gt ? val[j] : lower[j];
            upper_pivot[j] = gt ? upper_pivot[j] : pivot[j];
            upper[j] = gt ? upper[j] : val[j];
            pivot[j] += gt ? i : -i;
            val[j] = code[pivot[j]];
        }
    for (size_t j = 0; j < len; j++) {
        int gt = x[j] > val[j];
        float mid = ((gt ? upper[j] : lower[j]) + val[j]) * 0.5f;
        int up = x[j] > mid ? upper_pivot[j] : pivot[j], down = x[j] < mid ? lower_pivot[j] : pivot[j];
        pivot[j] = gt ? up : down;
    }
    if (is_signed) /* codes are never -0, so a code's sign bit is code < 0; s may be -0 (sign bit set) */
        for (size_t j = 0; j < len; j++) {
            int s_neg = signbit(s[j]) != 0, c_neg = code[pivot[j]] < 0.0f;
            pivot[j] += s_neg == c_neg ? 0 : s_neg ? -1 : 1;
        }
    for (size_t j = 0; j < len; j++)
        q[j] = (uint8_t)pivot[j];
}

void snug_cpu_quantize_blockwise(snug_backend *be, uint8_t *q, float *absmax, const float *x, const float *code,
                                 int is_signed, size_t n) {
    size_t nblk = (n + QBLK - 1) / QBLK;
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t b = 0; b < nblk; b++) {
        size_t i0 = b * QBLK, i1 = i0 + QBLK < n ? i0 + QBLK : n;
        float amax = 0.0f;
        for (size_t i = i0; i < i1; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        absmax[b] = amax;
        quantize_block(q + i0, x + i0, i1 - i0, amax, code, is_signed);
    }
}

void snug_cpu_dequantize_blockwise(snug_backend *be, float *x, const uint8_t *q, const float *absmax,
                                   const float *code, size_t n) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        x[i] = code[q[i]] * absmax[i / QBLK];
}

void snug_cpu_adamw8bit(snug_backend *be, float *p, const float *g, uint8_t *qm, uint8_t *qv, float *absmax_m,
                        float *absmax_v, const float *map_signed, const float *map_unsigned, size_t n, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int step, float grad_scale) {
    // bitsandbytes passes every hyperparameter to its kernel as a C float and computes in float; so does this.
    const float b1 = (float)beta1, b2 = (float)beta2, epsf = (float)eps, lrf = (float)lr, wd = (float)weight_decay;
    const float correction1 = 1.0f - powf(b1, (float)step);
    const float correction2 = sqrtf(1.0f - powf(b2, (float)step));
    const float step_size = -lrf * correction2 / correction1;
    const float decay = wd > 0.0f ? 1.0f - lrf * wd : 1.0f; /* p * 1 is exact: the kernel's `if (wd > 0)` */
    const float eps_c2 = correction2 * epsf;
    size_t nblk = (n + QBLK - 1) / QBLK;
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t b = 0; b < nblk; b++) {
        size_t i0 = b * QBLK, len = i0 + QBLK < n ? QBLK : n - i0;
        float m[QBLK], v[QBLK]; // (len) the block's moments in fp32
        float am_old = absmax_m[b], av_old = absmax_v[b], am = 0.0f, av = 0.0f;
        // 1-2. dequantize with the old absmax, update in fp32 (selects, not branches, so the loops vectorize)
        for (size_t j = 0; j < len; j++) {
            float g0 = g[i0 + j];
            int ok = isfinite(g0);
            float gj = ok ? g0 * grad_scale : 0.0f;
            float vj = map_unsigned[qv[i0 + j]] * av_old * b2 + (1.0f - b2) * gj * gj;
            float mj = map_signed[qm[i0 + j]] * am_old * b1 + (1.0f - b1) * gj;
            v[j] = ok ? vj : 0.0f;
            m[j] = ok ? mj : 0.0f;
        }
        for (size_t j = 0; j < len; j++) {
            am = fabsf(m[j]) > am ? fabsf(m[j]) : am;
            av = fabsf(v[j]) > av ? fabsf(v[j]) : av;
        }
        // 3. the new scales
        absmax_m[b] = am;
        absmax_v[b] = av;
        // 4. the parameter, from the unquantized m and v; decoupled weight decay after the update
        for (size_t j = 0; j < len; j++) {
            float pj = (p[i0 + j] + step_size * (m[j] / (sqrtf(v[j]) + eps_c2))) * decay;
            p[i0 + j] = isfinite(g[i0 + j]) ? pj : p[i0 + j];
        }
        // 5. requantize with the new absmax
        quantize_block(qm + i0, m, len, am, map_signed, 1);
        quantize_block(qv + i0, v, len, av, map_unsigned, 0);
    }
}
