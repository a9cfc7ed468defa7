/* matmul_cuda.cu: the linear layers on the GPU: one fp32 GEMM helper over cuBLASLt, and matmul_fwd/bwd on top.
 *
 * cuBLASLt is column-major; snug is row-major. A row-major (R, K) matrix with leading dimension K is the same memory
 * as a column-major (K, R) matrix, its transpose, so each row-major product X = A @ B is computed as the column-major
 * X^T = B^T @ A^T: operands swap places and keep their storage. Compute is true fp32 (CUBLAS_COMPUTE_32F, no TF32),
 * or under mixed precision (be->math BF16/F16) fp32 operands multiplied on the 16-bit tensor cores with fp32
 * accumulation (CUBLAS_COMPUTE_32F_FAST_16BF/16F): the weights and saved activations are 16-bit values already.
 * Bias: written into the output first and the GEMM adds onto it (beta = 1), as the CPU does; dbias is a column sum
 * (snug_cuda_colsum in ops_cuda.cu). */
#include "backend/cuda/cuda_internal.h"

/* Largest power of two (at most 256) that divides the address: cuBLASLt assumes 256-byte aligned operands unless
 * told otherwise, and arena pointers are only guaranteed 64. */
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 4 && (a & (al - 1)))
        al >>= 1;
    return al;
}

extern "C" void snug_cuda_gemm(snug_backend *be, int ta, int tb, int m, int n, int k, float alpha, const float *A,
                               int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    snug_cuda_ctx *cx = snug_cuda(be);
    if (m <= 0 || n <= 0 || cx->err.code) /* after a failure cuBLASLt is not called again */
        return;
    if (k <= 0) { /* an empty sum: C = beta * C */
        if (beta == 0.0f)
            SNUG_CUDA_CHECK(cudaMemset2DAsync(C, (size_t)ldc * sizeof(float), 0, (size_t)m * sizeof(float), n,
                                              snug_cuda_stream(be)));
        else if (beta != 1.0f)
            snug_cuda_fail(be, __FILE__, __LINE__, "snug_cuda_gemm with k = 0 supports beta 0 or 1, not %g",
                           (double)beta);
        return;
    }
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t compute = be->math == SNUG_DT_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                  : be->math == SNUG_DT_F16  ? CUBLAS_COMPUTE_32F_FAST_16F
                                                             : CUBLAS_COMPUTE_32F;
    /* each call runs only while every earlier one succeeded (ok); what was created is destroyed at the end */
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int ok = SNUG_CUBLAS_CHECK(snug_lt.MatmulDescCreate(&desc, compute, CUDA_R_32F));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    /* layouts describe the matrices as stored: rows, columns, leading dimension (column-major) */
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatrixLayoutCreate(&la, CUDA_R_32F, ta ? k : m, ta ? m : k, lda));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatrixLayoutCreate(&lb, CUDA_R_32F, tb ? n : k, tb ? k : n, ldb));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc));

    size_t ws = cx->lt_ws_bytes;
    uint32_t aa = ptr_align(A), ab = ptr_align(B), ac = ptr_align(C);
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulPreferenceCreate(&pref));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                      &ws, sizeof ws));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                                      &aa, sizeof aa));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                                      &ab, sizeof ab));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                                      &ac, sizeof ac));
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                                      &ac, sizeof ac));

    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    ok = ok && SNUG_CUBLAS_CHECK(snug_lt.MatmulAlgoGetHeuristic(cx->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
    if (ok && found == 0 && compute != CUBLAS_COMPUTE_32F) { /* no tensor-core kernel for this shape: exact fp32 */
        snug_lt.MatmulDescDestroy(desc);
        desc = NULL;
        ok = SNUG_CUBLAS_CHECK(snug_lt.MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        ok = ok &&
             SNUG_CUBLAS_CHECK(snug_lt.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        ok = ok &&
             SNUG_CUBLAS_CHECK(snug_lt.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        ok = ok &&
             SNUG_CUBLAS_CHECK(snug_lt.MatmulAlgoGetHeuristic(cx->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
    }
    if (ok && found == 0) {
        snug_cuda_fail(be, __FILE__, __LINE__, "cuBLASLt has no fp32 GEMM for m=%d n=%d k=%d ta=%d tb=%d lda=%d "
                       "ldb=%d ldc=%d (alignments %u %u %u)", m, n, k, ta, tb, lda, ldb, ldc, aa, ab, ac);
        ok = 0;
    }
    if (ok)
        SNUG_CUBLAS_CHECK(snug_lt.Matmul(cx->lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &heur.algo,
                                         cx->lt_ws, ws, cx->stream));
    if (pref)
        snug_lt.MatmulPreferenceDestroy(pref);
    if (lc)
        snug_lt.MatrixLayoutDestroy(lc);
    if (lb)
        snug_lt.MatrixLayoutDestroy(lb);
    if (la)
        snug_lt.MatrixLayoutDestroy(la);
    if (desc)
        snug_lt.MatmulDescDestroy(desc);
}

extern "C" void snug_cuda_gemm_rm(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    // row-major C (M,N) is column-major C^T (N,M) = op(B)^T @ op(A)^T: the operands swap, each keeping its storage
    // and its transpose flag
    snug_cuda_gemm(be, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
}

/* out (N,OC) = bias broadcast to every row */
__global__ void bias_fill_kernel(float *out, const float *bias, int N, int OC) {
    size_t total = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[i % OC];
}

extern "C" void snug_cuda_matmul_fwd(snug_backend *be, float *out, const float *inp, const float *w,
                                     const float *bias, int N, int C, int OC) {
    // out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC). Column-major: out^T (OC,N) = w^T (OC,C) @ inp^T (C,N), where
    // w as stored is column-major (C,OC), ld C (hence ta), and inp is column-major (C,N), ld C.
    if (N <= 0 || OC <= 0)
        return;
    float beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        bias_fill_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(out, bias, N, OC);
        SNUG_CUDA_LAUNCHED();
        beta = 1.0f;
    }
    snug_cuda_gemm(be, 1, 0, OC, N, C, 1.0f, w, C, inp, C, beta, out, OC);
}

extern "C" void snug_cuda_matmul_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                     const float *inp, const float *w, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0)
        return;
    // dinp (N,C) += dout (N,OC) @ w (OC,C). Column-major: dinp^T (C,N) = w (C,OC) @ dout^T (OC,N)
    if (dinp)
        snug_cuda_gemm(be, 0, 0, C, N, OC, 1.0f, w, C, dout, OC, 1.0f, dinp, C);
    // dw (OC,C) += dout^T (OC,N) @ inp (N,C). Column-major: dw^T (C,OC) = inp^T (C,N) @ dout (N,OC), dout being
    // stored column-major as (OC,N), hence tb
    if (dw)
        snug_cuda_gemm(be, 0, 1, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, C);
    if (dbias)
        snug_cuda_colsum(be, dbias, NULL, dout, NULL, NULL, NULL, N, OC, SNUG_COLSUM_G);
}
