/* cuda_internal.h: what the CUDA backend's files share: the context behind snug_backend.ctx, the error checks, the
 * launch helpers, the device-side dtype conversions and the prototypes of the ops each .cu file fills. Nothing here
 * is public; backend/backend.h gives the semantics, backend/cuda/backend_cuda.h the public entry points.
 *
 * Every op is queued on the context's compute stream and returns without waiting, except those that return a value
 * to the host (xent_fwd_bwd, sumsq, sumsq_take), which wait for their own result. */
#ifndef SNUG_CUDA_INTERNAL_H
#define SNUG_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* snug's headers are C: their functions keep C linkage when a .cu file calls them */
#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#include "core/error.h"
#ifdef __cplusplus
}
#endif
#include "backend/cuda/backend_cuda.h"

/* A failed CUDA call inside an op has no error path (ops return void, like the CPU's), and the library never aborts:
 * the backend records its first failure (file:line, the call and CUDA's reason) and the caller reads it at a sync
 * point through be->check (see backend.h). Both checks evaluate to 1 on success and 0 on failure, so an op whose
 * next calls depend on this one stops: `if (!SNUG_CUDA_CHECK(...)) return;`. They need `be` in scope. Once a failure
 * is recorded, the ops that return a value (xent_fwd_bwd, sumsq) return NaN, so even a caller that does not check
 * sees a NaN loss or gradient norm rather than a plausible number. */
#define SNUG_CUDA_CHECK(call) snug_cuda_ok(be, (call), #call, __FILE__, __LINE__)

/* The same for cuBLASLt calls, which return a cublasStatus_t. */
#define SNUG_CUBLAS_CHECK(call) snug_cublas_ok(be, (call), #call, __FILE__, __LINE__)

/* After every kernel launch: a bad launch configuration is reported where it happened, not at the next sync. */
#define SNUG_CUDA_LAUNCHED() SNUG_CUDA_CHECK(cudaGetLastError())

/* cuBLASLt's entry points, loaded with dlopen when a CUDA backend is created (backend_cuda.cu) rather than linked:
 * merely loading libcublasLt at program start costs about 200 MiB of resident memory, which every run of snug, CPU
 * runs included, would pay. Call them as snug_lt.Matmul(...). */
typedef struct snug_lt_api {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtDestroy) Destroy;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmul) Matmul;
} snug_lt_api;
extern snug_lt_api snug_lt; /* filled before the first CUDA backend exists; never unloaded */

typedef struct snug_cuda_gemm_cache snug_cuda_gemm_cache; /* matmul_cuda.cu: cuBLASLt plans by problem */

typedef struct snug_cuda_ctx {
    int device;
    char device_name[256];
    cudaStream_t stream;      /* every op runs on this stream, in order */
    cudaStream_t side;        /* copies of paged optimizer state and offloaded activations */
    cudaEvent_t side_wait;    /* recorded on stream before a side copy, so the copy sees the ops queued before it */
    cudaEvent_t side_done;    /* recorded on side by copy_wait, so the ops queued after it see the copies' results */
    double *acc;              /* (1) the device accumulator of sumsq_acc / sumsq_take */
    cublasLtHandle_t lt;
    void *lt_ws;              /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *scratch;            /* device scratch for reductions (partial sums, per-row losses, attention row sums) */
    size_t scratch_bytes;     /* fixed when the backend is created; never grows */
    int smem_optin;           /* the most dynamic shared memory a block may ask for (the attention rungs) */
    snug_error err;           /* the first failure (code 0: none), kept until destroy; read through be->check */
    snug_cuda_gemm_cache *gemm_cache; /* made on the first GEMM, freed by snug_cuda_gemm_cache_free at destroy */
} snug_cuda_ctx;

static inline snug_cuda_ctx *snug_cuda(snug_backend *be) { return (snug_cuda_ctx *)be->ctx; }
static inline cudaStream_t snug_cuda_stream(snug_backend *be) { return snug_cuda(be)->stream; }

/* Threads per block of the plain kernels, and the grid of a grid-stride loop over n elements. */
#define SNUG_CUDA_THREADS 256
static inline unsigned int snug_cuda_grid(size_t n) {
    size_t b = (n + SNUG_CUDA_THREADS - 1) / SNUG_CUDA_THREADS;
    return (unsigned int)(b < 65536 * 4 ? (b ? b : 1) : 65536 * 4);
}

/* --------------------------------------------------------------------------------- device dtype conversions */
/* The bit-exact twins of core/dtype.c's conversions (same NaN, infinity, subnormal and tie handling), so a tensor
 * rounded on the GPU holds the same bits as one rounded on the CPU. */

static __device__ __forceinline__ float snug_d_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

static __device__ __forceinline__ uint16_t snug_d_f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static __device__ __forceinline__ float snug_d_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);
        return __uint_as_float(__float_as_uint(v) | sign);
    }
    if (exp == 31)
        return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

static __device__ __forceinline__ uint16_t snug_d_f32_to_f16(float f) {
    uint32_t x = __float_as_uint(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);
    if (ax >= 0x477ff000u)
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) {
        uint32_t r = ax - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u);
        return sign | (uint16_t)(r >> 13);
    }
    if (ax < 0x33000000u)
        return sign;
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return sign | (uint16_t)r;
}

/* Element i of a tensor stored as dt (F32, BF16 or F16), widened to fp32. */
static __device__ __forceinline__ float snug_d_load(const void *p, size_t i, snug_dtype dt) {
    if (dt == SNUG_DT_BF16)
        return snug_d_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == SNUG_DT_F16)
        return snug_d_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* --------------------------------------------------------------------------------- block reductions */
/* Sums and maxima over the threads of a block (blockDim.x a multiple of 32, at most 1024), in a fixed order, so
 * the result depends only on the inputs. Every thread of the block must call them; all get the result. `sh` is
 * shared memory of 32 elements, free for reuse once the call returns. */

static __device__ __forceinline__ double snug_block_sum(double v, double *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* max by `a > b ? a : b`, like the CPU loops: a NaN never wins over the starting value */
static __device__ __forceinline__ float snug_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : sh[0];
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

#ifdef __cplusplus
extern "C" {
#endif

/* backend_cuda.cu: the device scratch, when it holds `bytes`: one buffer of a size fixed at creation, shared by the
 * ops in stream order (one op's use is queued before the next op asks). A request above the size is a plan that
 * missed an op: it records the error and returns NULL, and the op does nothing. */
void *snug_cuda_scratch(snug_backend *be, size_t bytes);

/* backend_cuda.cu: records the backend's first failure (later ones are dropped: they usually follow from it). */
void snug_cuda_fail(snug_backend *be, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* matmul_cuda.cu: column-major C (m,n) = alpha * op(A) @ op(B) + beta * C in fp32 (CUBLAS_COMPUTE_32F) on the
 * compute stream. ta/tb: 0 = as stored, 1 = transposed; A is stored (m,k) or, transposed, (k,m), with leading
 * dimension lda; likewise B (k,n) or (n,k). Row-major callers swap the operands (see matmul_cuda.cu). */
void snug_cuda_gemm(snug_backend *be, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);

/* snug_cuda_gemm_ex (the same with the operands' storage and a bias) is in backend_cuda.h, for its tests. */

/* matmul_cuda.cu: frees the GEMM plans (at the backend's destroy) */
void snug_cuda_gemm_cache_free(snug_backend *be);

/* ops_cuda.cu: deterministic column sums over N rows of (N,C) matrices, added into fp32 outputs (C): a fixed
 * number of row slices, each summed in double in row order, then the slices added in order. What is summed:
 *   SNUG_COLSUM_G:  dst_a += sum_n g                                  (dbias)
 *   SNUG_COLSUM_RMS: dst_a += sum_n g x rstd[n]                        (rmsnorm dw)
 *   SNUG_COLSUM_LN:  dst_a += sum_n g (x - mean[n]) rstd[n], dst_b += sum_n g   (layernorm dw, db)
 * A NULL dst is skipped. */
enum { SNUG_COLSUM_G = 0, SNUG_COLSUM_RMS = 1, SNUG_COLSUM_LN = 2 };
void snug_cuda_colsum(snug_backend *be, float *dst_a, float *dst_b, const float *g, const float *x, const float *mean,
                      const float *rstd, int N, int C, int mode);

/* ops_cuda.cu: out (1 double, device) = the sum of x (n doubles, device) by one block in a fixed order */
void snug_cuda_sum_doubles(snug_backend *be, double *out, const double *x, int n);

/* ops_cuda.cu: the ops */
void snug_cuda_embed_fwd(snug_backend *be, float *out, const int32_t *ids, const void *table, snug_dtype tdt, int N,
                         int C, int accumulate);
void snug_cuda_embed_bwd(snug_backend *be, float *dtable, const float *dout, const int32_t *ids, int N, int C);
void snug_cuda_rmsnorm_fwd(snug_backend *be, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                           float eps);
void snug_cuda_rmsnorm_bwd(snug_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                           const float *w, const float *rstd, int N, int C);
void snug_cuda_layernorm_fwd(snug_backend *be, float *out, float *mean, float *rstd, const float *inp, const float *w,
                             const float *b, int N, int C, float eps);
void snug_cuda_layernorm_bwd(snug_backend *be, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C);
void snug_cuda_matmul_fwd(snug_backend *be, float *out, const float *inp, const float *w, const float *bias, int N,
                          int C, int OC);
void snug_cuda_matmul_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                          const float *w, int N, int C, int OC);
void snug_cuda_matmul_w16_fwd(snug_backend *be, float *out, const float *inp, const void *w, snug_dtype wdt,
                              const float *bias, int N, int C, int OC);
void snug_cuda_matmul_w16_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                              const float *inp, const void *w, snug_dtype wdt, int N, int C, int OC);
void snug_cuda_rope_fwd(snug_backend *be, float *x, const int32_t *pos, const float *cos, const float *sin, int N,
                        int H, int HD, int stride);
void snug_cuda_rope_bwd(snug_backend *be, float *dx, const int32_t *pos, const float *cos, const float *sin, int N,
                        int H, int HD, int stride);
void snug_cuda_swiglu_fwd(snug_backend *be, float *out, const float *gu, int N, int I);
void snug_cuda_swiglu_bwd(snug_backend *be, float *dgu, const float *dout, const float *gu, int N, int I);
void snug_cuda_gelu_fwd(snug_backend *be, float *out, const float *inp, size_t n);
void snug_cuda_gelu_bwd(snug_backend *be, float *dinp, const float *dout, const float *inp, size_t n);
void snug_cuda_to16(snug_backend *be, void *dst, float *src, size_t n, snug_dtype dt, int round_src);
void snug_cuda_from16(snug_backend *be, float *dst, const void *src, size_t n, snug_dtype dt);
void snug_cuda_bf16_sr(snug_backend *be, uint16_t *dst, const float *src, size_t n, uint64_t seed);
void snug_cuda_add(snug_backend *be, float *out, const float *a, const float *b, size_t n);
void snug_cuda_accumulate(snug_backend *be, float *dst, const float *src, size_t n);
void snug_cuda_scale(snug_backend *be, float *x, float s, size_t n);
void snug_cuda_gemm_rm(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
void snug_cuda_dequantize_4bit(snug_backend *be, float *dst, const uint8_t *packed, const float *absmax,
                               const uint8_t *absmax_q, const float *nested_absmax, const float *nested_map,
                               float nested_offset, const float *code, size_t n, int blocksize);
void snug_cuda_dequantize_int8(snug_backend *be, float *dst, const int8_t *codes, const float *scb, size_t rows,
                               size_t cols);
void snug_cuda_dropout(snug_backend *be, float *out, const float *in, size_t n, float p, uint64_t seed);
void snug_cuda_add_noise(snug_backend *be, float *x, size_t n, float mag, uint64_t seed);
void snug_cuda_row_norms(snug_backend *be, float *out, const float *a, size_t lda, int rows, int cols);
void snug_cuda_row_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *b, size_t ldb,
                        int rows, int cols, const float *div);
void snug_cuda_scale_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                          const float *mag, const float *nrm, const float *bias);
void snug_cuda_col_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *y, size_t ldy, int N,
                        int cols, const float *bias, const float *div);
void snug_cuda_add_scaled_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                               const float *mag, const float *nrm, float minus);

/* xent_cuda.cu */
double snug_cuda_xent_fwd_bwd(snug_backend *be, float *dh, float *dw, const float *h, const void *w, snug_dtype wdt,
                              const int32_t *labels, int N, int C, int V, float grad_scale, float *logits_ws,
                              int chunk, float *w_ws, int wblock);

/* adamw_cuda.cu */
double snug_cuda_sumsq(snug_backend *be, const void *x, snug_dtype dt, size_t n);
void snug_cuda_sumsq_acc(snug_backend *be, const void *x, snug_dtype dt, size_t n);
double snug_cuda_sumsq_take(snug_backend *be);
void snug_cuda_adamw(snug_backend *be, float *p, const float *g, float *m, float *v, size_t n, double lr,
                     double beta1, double beta2, double eps, double weight_decay, int step, float grad_scale);
void snug_cuda_quantize_blockwise(snug_backend *be, uint8_t *q, float *absmax, const float *x, const float *code,
                                  int is_signed, size_t n);
void snug_cuda_dequantize_blockwise(snug_backend *be, float *x, const uint8_t *q, const float *absmax,
                                    const float *code, size_t n);
void snug_cuda_adamw8bit(snug_backend *be, float *p, const float *g, uint8_t *qm, uint8_t *qv, float *absmax_m,
                         float *absmax_v, const float *map_signed, const float *map_unsigned, size_t n, double lr,
                         double beta1, double beta2, double eps, double weight_decay, int step, float grad_scale);

/* attention_cuda.cu */
void snug_cuda_attention_fwd(snug_backend *be, float *out, float *lse, const float *qkv, const int32_t *seg_start,
                             int B, int T, int NH, int NKV, int HD, float scale);
void snug_cuda_attention_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                             float scale);
/* attention_warp_cuda.cu */
void snug_cuda_attention_naive_fwd(snug_backend *be, float *out, float *probs, const float *qkv,
                                   const int32_t *seg_start, int B, int T, int NH, int NKV, int HD, float scale);
void snug_cuda_attention_naive_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv,
                                   const float *probs, int B, int T, int NH, int NKV, int HD, float scale);
void snug_cuda_attention_decode(snug_backend *be, float *out, const float *qkv, int p, int NH, int NKV, int HD,
                                float scale);

/* attention_tc_cuda.cu: the tensor-core (bf16) rung of the flash attention, chosen by attention_cuda.cu. HD a
 * multiple of 16, at most 128; rows of qkv and dout 16-byte aligned. Backward takes D (N, NH) = rowsum(dout * out)
 * from the caller. _smem: the most dynamic shared memory per block its kernels ask for at this HD. */
size_t snug_cuda_attention_tc_smem(int HD);
void snug_cuda_attention_tc_fwd(snug_backend *be, float *out, float *lse, const float *qkv, const int32_t *seg_start,
                                int B, int T, int NH, int NKV, int HD, float scale);
void snug_cuda_attention_tc_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv, const float *lse,
                                const float *D, const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                                float scale);

#ifdef __cplusplus
}
#endif

static inline int snug_cuda_ok(snug_backend *be, cudaError_t err, const char *call, const char *file, int line) {
    if (err == cudaSuccess)
        return 1;
    snug_cuda_fail(be, file, line, "%s (%s)", cudaGetErrorString(err), call);
    return 0;
}

static inline int snug_cublas_ok(snug_backend *be, cublasStatus_t st, const char *call, const char *file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return 1;
    snug_cuda_fail(be, file, line, "cuBLASLt status %d (%s)", (int)st, call);
    return 0;
}

#endif
