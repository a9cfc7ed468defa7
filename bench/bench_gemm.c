/* bench_gemm.c: the GEMM rate of this machine through the BLAS snug opens (the kernels chosen from cpuid), the
 * denominator of the training step's achieved fraction of peak (bench/bench_train.py --mfu); and through oneDNN's
 * matmul with bf16 or f32 operands (src/backend/cpu/dnnl_cpu.c, the copies into its operand buffers included), to
 * see whether a CPU's bf16 units pay.
 *
 *     bench_gemm [threads] [n] [openblas|bf16|f32]   # C (n,n) = A (n,n) @ B (n,n)^T, best of 5 after a warm-up;
 *                                                    # prints one JSON line */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/blas_cpu.h"
#include "backend/cpu/dnnl_cpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, n = argc > 2 ? atoi(argv[2]) : 2048;
    const char *path = argc > 3 ? argv[3] : "openblas";
    int onednn = !strcmp(path, "bf16") || !strcmp(path, "f32");
    if (!onednn && strcmp(path, "openblas")) {
        fprintf(stderr, "bench_gemm: the path is openblas, bf16 or f32, not %s\n", path);
        return 2;
    }
    if (snug_cpu_blas_load()) {
        fprintf(stderr, "bench_gemm: %s\n", snug_cpu_blas_error());
        return 1;
    }
    snug_cpu_blas_set_threads(threads);
    snug_dnnl *d = NULL;
    const char *kernels = snug_cpu_blas_kernel();
    if (onednn) {
        d = snug_dnnl_create(!strcmp(path, "bf16") ? SNUG_DT_BF16 : SNUG_DT_F32, threads);
        kernels = d ? snug_dnnl_impl(d, 0, 1, n, n, n) : NULL;
        if (!kernels) {
            fprintf(stderr, "bench_gemm: %s\n", snug_dnnl_error());
            return 1;
        }
    }
    size_t nn = (size_t)n * n;
    float *A = malloc(nn * sizeof(float)), *B = malloc(nn * sizeof(float)), *C = malloc(nn * sizeof(float));
    if (!A || !B || !C)
        return 1;
    for (size_t i = 0; i < nn; i++)
        A[i] = (float)(i % 17) * 0.01f, B[i] = (float)(i % 13) * 0.02f;
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double t0 = now();
        if (d)
            snug_dnnl_gemm(d, 0, 1, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        else
            snug_cpu_sgemm(0, 1, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        double t = now() - t0;
        best = r && t < best ? t : best;
    }
    printf("{\"n\": %d, \"threads\": %d, \"path\": \"%s\", \"gflops\": %.1f, \"kernels\": \"%s\"}\n", n, threads,
           path, 2.0 * n * (double)nn / best / 1e9, kernels);
    snug_dnnl_destroy(d);
    free(A), free(B), free(C);
    return 0;
}
