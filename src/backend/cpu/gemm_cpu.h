/* gemm_cpu.h: which kernels the CPU backend's GEMMs run on.
 *
 * fp32 runs, and bf16 runs on a CPU without bf16 units, multiply in fp32 with OpenBLAS (blas_cpu.c). Under bf16
 * mixed precision (be->math BF16), on a CPU with AMX the GEMMs round their operands to bf16 and multiply on the AMX
 * tiles with fp32 accumulation through oneDNN (dnnl_cpu.c); with AVX512-BF16 alone, whose dot-product instruction
 * has only the fp32 FMA's rate, both are timed on a GEMM of the run's shape and the faster kept (the timing is kept
 * on disk, so every run of that shape on the machine chooses the same: gemm_cpu.c). The weights are
 * bf16 values already under bf16 storage, so their rounding is exact; activation gradients are rounded as a GPU's
 * bf16 tensor cores round them.
 *
 * On oneDNN the CPU ops keep their run-to-run determinism (the same primitive on the same thread count gives the
 * same bits) but not their independence of the thread count: oneDNN may split a product's K sum across threads.
 *
 * SNUG_CPU_GEMM forces the choice, for tests and benchmarks: `openblas` (fp32 always), `bf16` (oneDNN bf16 in bf16
 * runs; an error when this CPU or library cannot), `f32` (oneDNN's f32 matmul, exact fp32, in every run: the same
 * plumbing with the data type switched), `auto` or unset (chosen as above). */
#ifndef SNUG_GEMM_CPU_H
#define SNUG_GEMM_CPU_H

#include <stddef.h>

#include "backend/cpu/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"

typedef enum {
    SNUG_CPU_GEMM_OPENBLAS, /* fp32 OpenBLAS */
    SNUG_CPU_GEMM_BF16,     /* oneDNN, operands rounded to bf16, fp32 accumulation */
    SNUG_CPU_GEMM_MEASURE,  /* BF16 or OPENBLAS, whichever is faster on the run's GEMM */
    SNUG_CPU_GEMM_DNNL_F32, /* oneDNN's f32 matmul */
} snug_cpu_gemm_kind;

/* What the GEMMs of a run with math (be->math) should run on, on a processor with features f, with force the value
 * of SNUG_CPU_GEMM (NULL, "" or "auto": chosen from f). *forced: 1 when force decided it. why: the reason, for the
 * training header ("" when there is nothing to say: an fp32 run on OpenBLAS). Opens no library. -1 with e filled
 * (SNUG_EINPUT) for a force value it does not know. */
int snug_cpu_gemm_plan(snug_dtype math, const snug_cpu_features *f, const char *force, snug_cpu_gemm_kind *kind,
                       int *forced, char *why, size_t n, snug_error *e);

/* The choice between bf16 and fp32 on a CPU where the bf16 units may not pay: 1 (bf16) when its measured rate is
 * higher, else 0 (a tie keeps fp32, which is exact). */
int snug_cpu_bf16_measured_faster(double bf16_gflops, double fp32_gflops);

struct snug_backend;
/* Points OpenBLAS at be->nthreads before a GEMM: OpenBLAS keeps one global thread count (cheap to set), so each
 * GEMM-calling op sets it to its backend's. */
void snug_cpu_blas_threads(struct snug_backend *be);

#endif
