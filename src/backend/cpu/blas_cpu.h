/* blas_cpu.h: the CPU backend's GEMM library (OpenBLAS), opened at run time with its kernels chosen from cpuid.
 *
 * OpenBLAS picks its kernels once, when the library is loaded, from a table of processor models; a model newer than
 * the table (a distribution's OpenBLAS on a new Xeon) silently gets its SSE3 "Prescott" kernels, about 3x slower.
 * So snug does not link OpenBLAS: the first CPU backend sets OPENBLAS_CORETYPE from the processor's features
 * (unless the user set it) and then opens the library. */
#ifndef SNUG_BLAS_CPU_H
#define SNUG_BLAS_CPU_H

#include <stddef.h>

#include "backend/cpu/cpu_features.h"

/* Opens the BLAS once: $SNUG_BLAS if set, else the library found at configure time, else libopenblas.so.0 from the
 * loader's path. 0, or -1 with snug_cpu_blas_error() saying why and what to do. Not thread-safe: call before any
 * GEMM runs (snug_backend_cpu_create does). */
int snug_cpu_blas_load(void);
const char *snug_cpu_blas_error(void);

/* Row-major C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, op = transpose where ta/tb is 1. */
void snug_cpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    int ldb, float beta, float *C, int ldc);
void snug_cpu_blas_set_threads(int n);
/* A symbol of the opened library (its LAPACK routines: "sgesdd_", "sgeqrf_", "sorgqr_"), loading it first; NULL when
 * it cannot be opened or lacks the symbol. */
void *snug_cpu_blas_symbol(const char *name);

/* After a successful load: the kernel set in use as the library names it ("Zen", "SkylakeX"; "" if it cannot say),
 * the file opened, and one line for the training header:
 * "OpenBLAS 0.3.21, Cooperlake kernels (chosen from cpuid: AVX-512 BF16 FP16 VNNI)". */
const char *snug_cpu_blas_kernel(void);
const char *snug_cpu_blas_path(void);
const char *snug_cpu_blas_describe(void);

/* What OPENBLAS_CORETYPE is set to for a processor with features f (NULL: nothing better than the library's own
 * detection), using names every OpenBLAS since 0.3.10 knows. */
const char *snug_blas_coretype_for(const snug_cpu_features *f);
/* The vector tier (as snug_cpu_vector_tier) an OpenBLAS kernel set needs: 3 SkylakeX/Cooperlake/SapphireRapids,
 * 2 Haswell/Zen, 1 Sandybridge and AMD's AVX cores, 0 everything older (the generic SSE kernels). */
int snug_blas_core_tier(const char *corename);

#endif
