/* quant_map.c: the dynamic (tree) quantization maps of bitsandbytes, built on the host: 8-bit optimizer state
 * (optim/) and the nested quantization of a 4-bit weight's absmax (model/quant4.c) both use them.
 *
 * bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8) (Dettmers et al., "8-bit Optimizers
 * via Block-wise Quantization", after Dettmers 2015, "8-Bit Approximations for Parallelism in Deep Learning"): for
 * each decade 1e-6 .. 1e0, the midpoints of a linear grid over [0.1, 1] scaled by the decade (1, 2, 4 .. 64 values
 * per decade and sign for the signed map; 2, 4 .. 128 for the unsigned map, whose sign bit is an extra fraction bit),
 * their negatives when signed, then 0 and 1, sorted: 256 codes in [-1, 1] or [0, 1].
 *
 * The arithmetic is the reference's, value for value: torch.linspace in float32 (start + step*i by a fused
 * multiply-add for the first half, end - step*(steps-1-i) for the second), midpoints in float32, and the product by
 * the decade (10**k as a Python float, cast to float32) in float32. The result equals bitsandbytes' map element by
 * element (tests/parity/test_quant_maps.py). */
#include <math.h>
#include <stdlib.h>

#include "core/quant_map.h"

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void snug_dynamic_map(float code[256], int is_signed) {
    const int max_exp_bits = 7, non_sign_bits = 7;
    int n = 0;
    for (int i = 0; i < max_exp_bits; i++) {
        int steps = is_signed ? (1 << (i + non_sign_bits - max_exp_bits)) + 1
                              : (1 << (i + non_sign_bits - max_exp_bits + 1)) + 1;
        // torch.linspace(0.1, 1, steps, dtype=float32)
        float start = 0.1f, end = 1.0f, step = (end - start) / (float)(steps - 1), prev = 0.0f;
        float decade = (float)pow(10.0, (double)(i - (max_exp_bits - 1)));
        for (int k = 0; k < steps; k++) {
            float b = k < steps / 2 ? fmaf(step, (float)k, start) : fmaf(-step, (float)(steps - 1 - k), end);
            if (k > 0) {
                float mean = (prev + b) / 2.0f;
                code[n++] = decade * mean;
                if (is_signed)
                    code[n++] = -decade * mean;
            }
            prev = b;
        }
    }
    code[n++] = 0.0f;
    code[n++] = 1.0f;
    while (n < 256) /* never: 254 + 2 codes for 8 bits */
        code[n++] = 0.0f;
    qsort(code, 256, sizeof *code, cmp_float);
}
