/* bench_gemm.c: the fp32 GEMM rate of this machine through the BLAS snug opens (the kernels chosen from cpuid), the
 * denominator of the training step's achieved fraction of peak (bench/bench_train.py --mfu).
 *
 *     bench_gemm [threads] [n]      # C (n,n) = A (n,n) @ B (n,n)^T, best of 5 after a warm-up; prints one JSON line */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/blas_cpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, n = argc > 2 ? atoi(argv[2]) : 2048;
    if (snug_cpu_blas_load()) {
        fprintf(stderr, "bench_gemm: %s\n", snug_cpu_blas_error());
        return 1;
    }
    snug_cpu_blas_set_threads(threads);
    size_t nn = (size_t)n * n;
    float *A = malloc(nn * sizeof(float)), *B = malloc(nn * sizeof(float)), *C = malloc(nn * sizeof(float));
    if (!A || !B || !C)
        return 1;
    for (size_t i = 0; i < nn; i++)
        A[i] = (float)(i % 17) * 0.01f, B[i] = (float)(i % 13) * 0.02f;
    snug_cpu_sgemm(0, 1, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        snug_cpu_sgemm(0, 1, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        double t = now() - t0;
        best = t < best ? t : best;
    }
    printf("{\"n\": %d, \"threads\": %d, \"gflops\": %.1f, \"kernels\": \"%s\"}\n", n, threads,
           2.0 * n * (double)nn / best / 1e9, snug_cpu_blas_kernel());
    free(A), free(B), free(C);
    return 0;
}
