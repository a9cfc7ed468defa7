/* adamw8bit_shim.c: snug's 8-bit AdamW step as a plain C function for test_adamw8bit_parity.py (loaded with ctypes
 * from a shared library built there from this file, src/backend/cpu/adamw8bit_cpu.c and src/core/quant_map.c).
 *
 * The op takes a backend only for its thread count. Hyperparameters are doubles, as the backend slot takes them. */
#include "backend/backend.h"
#include "backend/cpu/ops_cpu.h"

void shim_adamw8bit(float *p, const float *g, uint8_t *qm, uint8_t *qv, float *absmax_m, float *absmax_v,
                    const float *map_signed, const float *map_unsigned, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int step, float grad_scale, int nthreads) {
    snug_backend be = {.name = "cpu", .nthreads = nthreads};
    snug_cpu_adamw8bit(&be, p, g, qm, qv, absmax_m, absmax_v, map_signed, map_unsigned, n, lr, beta1, beta2, eps,
                       weight_decay, step, grad_scale);
}
