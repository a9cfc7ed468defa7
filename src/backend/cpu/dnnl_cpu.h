/* dnnl_cpu.h: GEMMs through oneDNN's matmul primitive, with the operands rounded to bf16 and fp32 accumulation:
 * the CPU backend's path to a processor's bf16 units (AMX tiles, AVX512-BF16 dot products) under bf16 mixed
 * precision. gemm_cpu.c decides when it is used; this file only computes.
 *
 * oneDNN is optional twice. At build time: without its header (or with -DSNUG_WITH_DNNL=OFF) this file compiles to
 * stubs whose load fails and says so. At run time: the library is opened with dlopen when a backend first asks for
 * it ($SNUG_DNNL, else the file found at configure time, else libdnnl.so.2), so a snug built with it still runs
 * where it is not installed, and runs that never use it never map its 40 MB.
 *
 * Operands are copied (rounded to nearest even for bf16, as they are for fp32: a plain copy) into a dense buffer
 * of at most SNUG_DNNL_OPERAND_BYTES; larger products are computed block by block, each block of C from whole
 * blocks of op(A) and op(B). So the layouts snug passes (transposes, leading dimensions of column blocks) reach
 * oneDNN as dense row-major or transposed matrices, the same for either data type, and the f32 variant proves the
 * plumbing on any CPU. An operand stored in 16 bits (snug_dnnl_gemm_ex) is converted by the same copy, and one
 * already of the context's dtype, dense and in one block, is not copied: the 16-bit weights of a bf16 run reach the
 * kernels as stored. */
#ifndef SNUG_DNNL_CPU_H
#define SNUG_DNNL_CPU_H

#include <stddef.h>

#include "core/dtype.h"

/* The bound on the operand copies of one GEMM (one block of op(A) and one of op(B)), held for the context's life. */
#define SNUG_DNNL_OPERAND_BYTES ((size_t)32 << 20)

typedef struct snug_dnnl snug_dnnl;

/* Opens oneDNN once. 0, or -1 with snug_dnnl_error() saying why (not built in, not installed, too old). */
int snug_dnnl_load(void);
const char *snug_dnnl_error(void);
/* "oneDNN 2.6.3" after a load */
const char *snug_dnnl_version(void);

/* A GEMM context whose operands are rounded to dt (SNUG_DT_BF16, or SNUG_DT_F32: kept), run on nthreads OpenMP
 * threads. NULL when oneDNN is not loaded (snug_dnnl_error says why) or memory is short. */
snug_dnnl *snug_dnnl_create(snug_dtype dt, int nthreads);
void snug_dnnl_destroy(snug_dnnl *d);
/* Bounds the operand copies below SNUG_DNNL_OPERAND_BYTES (tests use it to force blocking); 0 restores it. */
void snug_dnnl_set_operand_bytes(snug_dnnl *d, size_t bytes);

/* Row-major C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C with leading dimensions, as backend.h's
 * gemm_strided. 0 when done; -1 when oneDNN has no fast implementation of this problem on this CPU (only its
 * reference code, or none) or failed: C is then untouched and the caller computes it another way. K must be > 0. */
int snug_dnnl_gemm(snug_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);
/* The same with each operand stored as its own dtype (F32, BF16 or F16; leading dimensions in elements): a 16-bit
 * operand is converted as it is copied (widened for an f32 context, kept or rounded for bf16), so a bf16 operand
 * gives bitwise the result of passing its widened fp32 copy. An operand already of the context's dtype, dense and
 * one block is not copied at all: oneDNN reads it where it is (the 16-bit weights of a bf16 run). */
int snug_dnnl_gemm_ex(snug_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const void *A, snug_dtype adt,
                      int lda, const void *B, snug_dtype bdt, int ldb, float beta, float *C, int ldc);

/* The implementation oneDNN picks for such a product ("brg:avx512_core_amx", "gemm:jit"), or NULL with the reason
 * in snug_dnnl_error() ("oneDNN has no bf16 matmul on this CPU"). */
const char *snug_dnnl_impl(snug_dnnl *d, int ta, int tb, int M, int N, int K);

/* Bytes the context holds now: the operand copies and oneDNN's scratchpad (the largest any of its primitives asked
 * for; oneDNN's own code and primitive cache are not counted). */
size_t snug_dnnl_bytes(const snug_dnnl *d);

#endif
