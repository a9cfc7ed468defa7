/* ops_cpu.h: the CPU backend's ops, shared by ops_cpu.c, attention_cpu.c, xent_cpu.c and backend_cpu.c (which puts
 * them into the snug_backend slots). Semantics and shapes are those of backend/backend.h; nothing here is public.
 *
 * Threads: every parallel loop runs on be->nthreads OpenMP threads, and every reduction is split into blocks that do
 * not depend on the thread count, so results are bitwise the same for any nthreads. */
#ifndef SNUG_OPS_CPU_H
#define SNUG_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#include "backend/cpu/blas_cpu.h"

/* Fixed number of blocks that a long reduction (sumsq, the loss of a chunk) is split into before the partial sums
 * are added in order: independent of the thread count, hence deterministic. */
#define SNUG_CPU_NBLK 256
/* Column block width of the parameter-gradient reductions over rows (dw, db, dbias, dtable). */
#define SNUG_CPU_CBLK 64
/* Below this many elements a loop is not worth waking the thread team for. */
#define SNUG_CPU_PAR_MIN 16384

struct snug_dnnl;
/* be->ctx of a CPU backend */
typedef struct {
    struct snug_dnnl *dnnl; /* where the GEMMs run when snug_cpu_set_math chose oneDNN, else NULL (OpenBLAS) */
    char gemm[1024];        /* be->gemm: the kernels in use and why */
    snug_error err;         /* the first failure (code 0: none); only a oneDNN GEMM can fail; read by be->check */
    double sumsq_acc;       /* be->sumsq_acc's accumulator */
    float *wide[2];         /* OpenBLAS's fp32 blocks of 16-bit operands (A, B), when oneDNN refused a problem */
    size_t wide_n[2];       /* their capacities in floats */
} snug_cpu_ctx;

void snug_cpu_embed_fwd(snug_backend *be, float *out, const int32_t *ids, const void *table, snug_dtype tdt, int N, int C,
                        int accumulate);
void snug_cpu_embed_bwd(snug_backend *be, float *dtable, const float *dout, const int32_t *ids, int N, int C);

void snug_cpu_rmsnorm_fwd(snug_backend *be, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                          float eps);
void snug_cpu_rmsnorm_bwd(snug_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int C);
void snug_cpu_layernorm_fwd(snug_backend *be, float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C, float eps);
void snug_cpu_layernorm_bwd(snug_backend *be, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C);

void snug_cpu_matmul_fwd(snug_backend *be, float *out, const float *inp, const float *w, const float *bias, int N,
                         int C, int OC);
void snug_cpu_matmul_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC);
void snug_cpu_matmul_w16_fwd(snug_backend *be, float *out, const float *inp, const void *w, snug_dtype wdt,
                             const float *bias, int N, int C, int OC);
void snug_cpu_matmul_w16_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                             const float *inp, const void *w, snug_dtype wdt, int N, int C, int OC);

void snug_cpu_rope_fwd(snug_backend *be, float *x, const int32_t *pos, const float *cos, const float *sin, int N,
                       int H, int HD, int stride);
void snug_cpu_rope_bwd(snug_backend *be, float *dx, const int32_t *pos, const float *cos, const float *sin, int N,
                       int H, int HD, int stride);

void snug_cpu_attention_decode(snug_backend *be, float *out, const float *qkv, int p, int NH, int NKV, int HD,
                               float scale);
void snug_cpu_attention_naive_fwd(snug_backend *be, float *out, float *probs, const float *qkv,
                                  const int32_t *seg_start, int B, int T, int NH, int NKV, int HD, float scale);
void snug_cpu_attention_naive_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv,
                                  const float *probs, int B, int T, int NH, int NKV, int HD, float scale);
void snug_cpu_attention_fwd(snug_backend *be, float *out, float *lse, const float *qkv, const int32_t *seg_start,
                            int B, int T, int NH, int NKV, int HD, float scale);
void snug_cpu_attention_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                            float scale);

void snug_cpu_swiglu_fwd(snug_backend *be, float *out, const float *gu, int N, int I);
void snug_cpu_swiglu_bwd(snug_backend *be, float *dgu, const float *dout, const float *gu, int N, int I);
void snug_cpu_gelu_fwd(snug_backend *be, float *out, const float *inp, size_t n);
void snug_cpu_gelu_bwd(snug_backend *be, float *dinp, const float *dout, const float *inp, size_t n);

void snug_cpu_add(snug_backend *be, float *out, const float *a, const float *b, size_t n);
void snug_cpu_accumulate(snug_backend *be, float *dst, const float *src, size_t n);
void snug_cpu_scale(snug_backend *be, float *x, float s, size_t n);
/* gemm_cpu.c: every GEMM of the CPU ops goes through snug_cpu_gemm (the gemm_strided slot), which runs it where
 * snug_cpu_set_math (the set_math slot) chose: OpenBLAS, or oneDNN with bf16 operands */
void snug_cpu_gemm(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);
/* The same with each operand stored as its dtype (F32, BF16, F16): oneDNN reads 16-bit operands as they are; a
 * problem it refuses runs on OpenBLAS, a 16-bit operand widened into fp32 blocks of at most SNUG_CPU_WIDE floats
 * (memory outside the arenas, held for the backend's life) */
#define SNUG_CPU_WIDE ((size_t)1 << 20)
void snug_cpu_gemm_ex(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                      snug_dtype adt, int lda, const void *B, snug_dtype bdt, int ldb, float beta, float *C, int ldc);
/* 1 when the GEMMs take 16-bit weights as stored (oneDNN chosen: set_math then fills the matmul_w16 slots) */
static inline int snug_cpu_takes16(const snug_backend *be) { return be->matmul_w16_fwd != NULL; }
int snug_cpu_set_math(snug_backend *be, snug_dtype math, int M, int N, int K, snug_error *e);
void snug_cpu_dequantize_4bit(snug_backend *be, float *dst, const uint8_t *packed, const float *absmax,
                              const uint8_t *absmax_q, const float *nested_absmax, const float *nested_map,
                              float nested_offset, const float *code, size_t n, int blocksize);
void snug_cpu_dequantize_int8(snug_backend *be, float *dst, const int8_t *codes, const float *scb, size_t rows,
                              size_t cols);
void snug_cpu_dropout(snug_backend *be, float *out, const float *in, size_t n, float p, uint64_t seed);
void snug_cpu_add_noise(snug_backend *be, float *x, size_t n, float mag, uint64_t seed);
void snug_cpu_row_norms(snug_backend *be, float *out, const float *a, size_t lda, int rows, int cols);
void snug_cpu_row_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *b, size_t ldb, int rows,
                       int cols, const float *div);
void snug_cpu_scale_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                         const float *mag, const float *nrm, const float *bias);
void snug_cpu_col_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *y, size_t ldy, int N,
                       int cols, const float *bias, const float *div);
void snug_cpu_add_scaled_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                              const float *mag, const float *nrm, float minus);

double snug_cpu_xent_fwd_bwd(snug_backend *be, float *dh, float *dw, const float *h, const void *w, snug_dtype wdt,
                             const int32_t *labels, int N, int C, int V, float grad_scale, float *logits_ws,
                             int chunk, float *w_ws, int wblock);
double snug_cpu_xent_block(snug_backend *be, int pass, float *dh, float *dw, const float *h, const void *w,
                           snug_dtype wdt, const int32_t *labels, int N, int C, int V, int v0, int vb,
                           float grad_scale, float *st_max, double *st_sum, float *st_zy, float *logits_ws, int chunk,
                           float *w_ws, int wblock);

double snug_cpu_sumsq(snug_backend *be, const void *x, snug_dtype dt, size_t n);

/* convert_cpu.c: 16-bit storage; snug_cpu_row_to_f32 widens n elements of src (stored as dt, F32 included) into dst */
void snug_cpu_row_to_f32(float *dst, const void *src, snug_dtype dt, size_t n);
/* n fp32 values rounded to bf16 (nearest even; NaN stays NaN): the bf16 GEMM's operand copies (dnnl_cpu.c) */
void snug_cpu_row_to_bf16(uint16_t *dst, const float *src, size_t n);
void snug_cpu_to16(snug_backend *be, void *dst, float *src, size_t n, snug_dtype dt, int round_src);
void snug_cpu_from16(snug_backend *be, float *dst, const void *src, size_t n, snug_dtype dt);
void snug_cpu_bf16_sr(snug_backend *be, uint16_t *dst, const float *src, size_t n, uint64_t seed);
void snug_cpu_adamw(snug_backend *be, float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int step, float grad_scale);

/* adamw8bit_cpu.c */
void snug_cpu_quantize_blockwise(snug_backend *be, uint8_t *q, float *absmax, const float *x, const float *code,
                                 int is_signed, size_t n);
void snug_cpu_dequantize_blockwise(snug_backend *be, float *x, const uint8_t *q, const float *absmax,
                                   const float *code, size_t n);
void snug_cpu_adamw8bit(snug_backend *be, float *p, const float *g, uint8_t *qm, uint8_t *qv, float *absmax_m,
                        float *absmax_v, const float *map_signed, const float *map_unsigned, size_t n, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int step, float grad_scale);

#endif
