/* matmul_cuda.cu: the linear layers on the GPU: one GEMM helper over cuBLASLt with a cache of its plans, and
 * matmul_fwd/bwd on top.
 *
 * cuBLASLt is column-major; snug is row-major. A row-major (R, K) matrix with leading dimension K is the same memory
 * as a column-major (K, R) matrix, its transpose, so each row-major product X = A @ B is computed as the column-major
 * X^T = B^T @ A^T: operands swap places and keep their storage.
 *
 * Operands are fp32 or 16-bit (bf16, fp16), accumulation always fp32. fp32 operands multiply in true fp32
 * (CUBLAS_COMPUTE_32F, no TF32), or under mixed precision (be->math BF16/F16) on the 16-bit tensor cores
 * (CUBLAS_COMPUTE_32F_FAST_16BF/16F: cuBLASLt rounds them as it loads them; they are 16-bit values already). 16-bit
 * operands go to the tensor cores as stored (CUBLAS_COMPUTE_32F), half the bytes of the fp32 copies. matmul_fwd/bwd
 * take fp32 pointers and are of the first kind. Under 16-bit math the linear layers use matmul_w16_fwd/bwd instead
 * (filled by set_math, backend_cuda.cu), which read the 16-bit weight as stored: the activation operand (inp for the
 * output, dout for the input gradient) is rounded to the same 16 bits in the scratch (to16: to nearest even), so
 * the products are of 16-bit operands as under matmul_fwd/bwd's fast-16-bit mode (whose rounding on load cuBLASLt
 * does not document), summed in fp32 in the library's order. The weight gradient's operands are activations, fp32:
 * it stays matmul_bwd's GEMM. The loss (xent_cuda.cu) reads its 16-bit head as stored.
 *
 * A plan (descriptors, layouts and the heuristic's algorithm) is built once per problem, keyed by everything the
 * heuristic sees (shapes, transposes, leading dimensions, types, compute, epilogue, pointer alignments), and kept in
 * a small cache until the backend is destroyed: the same problem runs the same algorithm, so gives the same bits.
 * A lookup that fails, with any status or with no result, is a miss: a fast-16-bit plan for fp32 operands falls back
 * to exact fp32, a bias epilogue falls back to writing the bias first and adding the product onto it (beta = 1, as
 * the CPU does), and only a problem with no kernel at all records an error. Misses are cached too, so a problem
 * that falls back asks the heuristic once, not at every call.
 * dbias is a column sum (snug_cuda_colsum in ops_cuda.cu). */
#include <string.h>

#include "backend/cuda/cuda_internal.h"

/* Largest power of two (at most 256) that divides the address: cuBLASLt assumes 256-byte aligned operands unless
 * told otherwise, and arena pointers are only guaranteed 64. */
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 2 && (a & (al - 1)))
        al >>= 1;
    return al;
}

static cudaDataType_t lt_type(snug_dtype dt) {
    return dt == SNUG_DT_BF16 ? CUDA_R_16BF : dt == SNUG_DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Everything cuBLASLt's heuristic is told about a problem; all fields 32-bit, compared with memcmp. */
typedef struct gemm_key {
    int32_t ta, tb, m, n, k, lda, ldb, ldc;
    int32_t ab_type, c_type, compute, bias; /* bias: 1 = CUBLASLT_EPILOGUE_BIAS */
    uint32_t al_a, al_b, al_c, al_bias;
} gemm_key;

typedef struct gemm_plan {
    gemm_key key;
    int used;
    int none; /* cuBLASLt has no algorithm for this key: remembered, so a fallback does not ask again each call */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    size_t ws; /* workspace the algorithm needs */
} gemm_plan;

/* A training run has a few dozen distinct GEMMs (each layer's, the loss's, a shorter last chunk or micro-batch);
 * when more than this appear, the oldest plan is replaced. */
#define GEMM_CACHE 64

struct snug_cuda_gemm_cache {
    gemm_plan e[GEMM_CACHE];
    int next;       /* the entry replaced next */
    long long hits; /* lookups that found their plan */
};

static void plan_release(gemm_plan *p) {
    if (p->lc)
        snug_lt.MatrixLayoutDestroy(p->lc);
    if (p->lb)
        snug_lt.MatrixLayoutDestroy(p->lb);
    if (p->la)
        snug_lt.MatrixLayoutDestroy(p->la);
    if (p->desc)
        snug_lt.MatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

extern "C" void snug_cuda_gemm_cache_free(snug_backend *be) {
    snug_cuda_ctx *cx = snug_cuda(be);
    if (!cx->gemm_cache)
        return;
    for (int i = 0; i < GEMM_CACHE; i++)
        if (cx->gemm_cache->e[i].used)
            plan_release(&cx->gemm_cache->e[i]);
    free(cx->gemm_cache);
    cx->gemm_cache = NULL;
}

extern "C" int snug_cuda_gemm_plans(snug_backend *be, long long *hits) {
    const snug_cuda_gemm_cache *c = snug_cuda(be)->gemm_cache;
    int n = 0;
    for (int i = 0; c && i < GEMM_CACHE; i++)
        n += c->e[i].used && !c->e[i].none;
    if (hits)
        *hits = c ? c->hits : 0;
    return n;
}

/* Builds the plan for key into p: 1 when cuBLASLt has an algorithm for it, else 0 with p released. No failure is
 * recorded: a failed call here means this variant of the problem is not supported, and the caller tries another. */
static int plan_build(snug_backend *be, const gemm_key *key, const float *bias, gemm_plan *p) {
    snug_cuda_ctx *cx = snug_cuda(be);
    memset(p, 0, sizeof *p);
    p->key = *key;
    cublasOperation_t opa = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t ab = (cudaDataType_t)key->ab_type, ct = (cudaDataType_t)key->c_type;
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = cx->lt_ws_bytes;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    /* each call runs only while every earlier one succeeded */
    int ok = snug_lt.MatmulDescCreate(&p->desc, (cublasComputeType_t)key->compute, CUDA_R_32F) ==
             CUBLAS_STATUS_SUCCESS;
    ok = ok && snug_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && snug_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb) ==
                   CUBLAS_STATUS_SUCCESS;
    if (key->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        ok = ok && snug_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ==
                       CUBLAS_STATUS_SUCCESS;
        ok = ok && snug_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt) ==
                       CUBLAS_STATUS_SUCCESS;
        ok = ok && snug_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                  sizeof bias) == CUBLAS_STATUS_SUCCESS;
    }
    /* layouts describe the matrices as stored: rows, columns, leading dimension (column-major) */
    ok = ok && snug_lt.MatrixLayoutCreate(&p->la, ab, key->ta ? key->k : key->m, key->ta ? key->m : key->k,
                                          key->lda) == CUBLAS_STATUS_SUCCESS;
    ok = ok && snug_lt.MatrixLayoutCreate(&p->lb, ab, key->tb ? key->n : key->k, key->tb ? key->k : key->n,
                                          key->ldb) == CUBLAS_STATUS_SUCCESS;
    ok = ok && snug_lt.MatrixLayoutCreate(&p->lc, ct, key->m, key->n, key->ldc) == CUBLAS_STATUS_SUCCESS;
    ok = ok && snug_lt.MatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *v;
        size_t n;
    } prefs[] = {{CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->al_a, sizeof key->al_a},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al_b, sizeof key->al_b},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->al_c, sizeof key->al_c},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al_c, sizeof key->al_c}};
    for (size_t i = 0; ok && i < sizeof prefs / sizeof prefs[0]; i++)
        ok = snug_lt.MatmulPreferenceSetAttribute(pref, prefs[i].attr, prefs[i].v, prefs[i].n) ==
             CUBLAS_STATUS_SUCCESS;
    /* a miss is usually CUBLAS_STATUS_NOT_SUPPORTED, sometimes success with no result: the same to us */
    ok = ok && snug_lt.MatmulAlgoGetHeuristic(cx->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &heur,
                                              &found) == CUBLAS_STATUS_SUCCESS;
    ok = ok && found > 0 && heur.workspaceSize <= ws;
    if (pref)
        snug_lt.MatmulPreferenceDestroy(pref);
    if (!ok) {
        plan_release(p);
        return 0;
    }
    p->algo = heur.algo;
    p->ws = heur.workspaceSize;
    p->used = 1;
    return 1;
}

/* The cached plan for key, built on a miss; NULL when cuBLASLt has none (nothing recorded; remembered too) or the
 * cache cannot be allocated (recorded). */
static const gemm_plan *plan_get(snug_backend *be, const gemm_key *key, const float *bias) {
    snug_cuda_ctx *cx = snug_cuda(be);
    if (!cx->gemm_cache) {
        cx->gemm_cache = (snug_cuda_gemm_cache *)calloc(1, sizeof *cx->gemm_cache);
        if (!cx->gemm_cache) {
            snug_cuda_fail(be, __FILE__, __LINE__, "out of host memory for the GEMM plan cache");
            return NULL;
        }
    }
    snug_cuda_gemm_cache *c = cx->gemm_cache;
    for (int i = 0; i < GEMM_CACHE; i++)
        if (c->e[i].used && !memcmp(&c->e[i].key, key, sizeof *key)) {
            c->hits++;
            return c->e[i].none ? NULL : &c->e[i];
        }
    gemm_plan fresh;
    if (!plan_build(be, key, bias, &fresh)) { /* released: only the key is kept */
        fresh.key = *key;
        fresh.used = fresh.none = 1;
    }
    gemm_plan *slot = &c->e[c->next];
    c->next = (c->next + 1) % GEMM_CACHE;
    if (slot->used) /* the oldest plan; the GEMMs queued with it have copied what they need */
        plan_release(slot);
    *slot = fresh;
    return slot->none ? NULL : slot;
}

/* out (N,OC) column-major (m,n) with leading dimension ldc = bias broadcast to every column: bias (m) */
__global__ void bias_fill_kernel(float *out, const float *bias, int m, int n, int ldc) {
    size_t total = (size_t)m * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[(i / m) * ldc + i % m] = bias[i % m];
}

extern "C" void snug_cuda_gemm_ex(snug_backend *be, int ta, int tb, int m, int n, int k, float alpha, const void *A,
                                  int lda, const void *B, int ldb, snug_dtype ab, float beta, void *C, int ldc,
                                  snug_dtype cdt, const float *bias) {
    snug_cuda_ctx *cx = snug_cuda(be);
    if (m <= 0 || n <= 0 || cx->err.code) /* after a failure cuBLASLt is not called again */
        return;
    cudaStream_t st = snug_cuda_stream(be);
    if (bias && (beta != 0.0f || cdt != SNUG_DT_F32)) {
        snug_cuda_fail(be, __FILE__, __LINE__, "snug_cuda_gemm_ex: a bias needs beta 0 and an fp32 output");
        return;
    }
    if (k <= 0) { /* an empty sum: C = beta * C, or the bias */
        if (bias) {
            bias_fill_kernel<<<snug_cuda_grid((size_t)m * n), SNUG_CUDA_THREADS, 0, st>>>((float *)C, bias, m, n,
                                                                                         ldc);
            SNUG_CUDA_LAUNCHED();
        } else if (beta == 0.0f) {
            SNUG_CUDA_CHECK(cudaMemset2DAsync(C, (size_t)ldc * snug_dtype_size(cdt), 0,
                                              (size_t)m * snug_dtype_size(cdt), n, st));
        } else if (beta != 1.0f) {
            snug_cuda_fail(be, __FILE__, __LINE__, "snug_cuda_gemm with k = 0 supports beta 0 or 1, not %g",
                           (double)beta);
        }
        return;
    }
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.ab_type = lt_type(ab), key.c_type = lt_type(cdt);
    key.al_a = ptr_align(A), key.al_b = ptr_align(B), key.al_c = ptr_align(C);
    int32_t fast = ab != SNUG_DT_F32          ? CUBLAS_COMPUTE_32F /* 16-bit operands: fp32 accumulation */
                   : be->math == SNUG_DT_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                   : be->math == SNUG_DT_F16  ? CUBLAS_COMPUTE_32F_FAST_16F
                                              : CUBLAS_COMPUTE_32F;
    /* in order of preference: the compute asked for before exact fp32 (the rounding is the caller's choice), and
     * for each the bias epilogue before the bias written first */
    const gemm_plan *p = NULL;
    for (int exact = fast == CUBLAS_COMPUTE_32F; exact < 2 && !p; exact++)
        for (int epi = bias != NULL; epi >= 0 && !p; epi--) {
            key.compute = exact ? CUBLAS_COMPUTE_32F : fast;
            key.bias = epi;
            key.al_bias = epi ? ptr_align(bias) : 0;
            p = plan_get(be, &key, bias);
            if (!p && cx->err.code)
                return;
        }
    if (!p) {
        snug_cuda_fail(be, __FILE__, __LINE__, "cuBLASLt has no GEMM for m=%d n=%d k=%d ta=%d tb=%d lda=%d ldb=%d "
                       "ldc=%d, operands %s, output %s (alignments %u %u %u)", m, n, k, ta, tb, lda, ldb, ldc,
                       snug_dtype_name(ab), snug_dtype_name(cdt), key.al_a, key.al_b, key.al_c);
        return;
    }
    if (bias && !p->key.bias) { /* no bias epilogue for this problem: the bias first, the product added onto it */
        bias_fill_kernel<<<snug_cuda_grid((size_t)m * n), SNUG_CUDA_THREADS, 0, st>>>((float *)C, bias, m, n, ldc);
        if (!SNUG_CUDA_LAUNCHED())
            return;
        beta = 1.0f;
    }
    if (p->key.bias && !SNUG_CUBLAS_CHECK(snug_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                                         &bias, sizeof bias)))
        return;
    SNUG_CUBLAS_CHECK(snug_lt.Matmul(cx->lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc,
                                     &p->algo, cx->lt_ws, p->ws, st));
}

extern "C" void snug_cuda_gemm(snug_backend *be, int ta, int tb, int m, int n, int k, float alpha, const float *A,
                               int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    snug_cuda_gemm_ex(be, ta, tb, m, n, k, alpha, A, lda, B, ldb, SNUG_DT_F32, beta, C, ldc, SNUG_DT_F32, NULL);
}

extern "C" void snug_cuda_gemm_rm(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    // row-major C (M,N) is column-major C^T (N,M) = op(B)^T @ op(A)^T: the operands swap, each keeping its storage
    // and its transpose flag
    snug_cuda_gemm(be, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
}

extern "C" void snug_cuda_matmul_fwd(snug_backend *be, float *out, const float *inp, const float *w,
                                     const float *bias, int N, int C, int OC) {
    // out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC). Column-major: out^T (OC,N) = w^T (OC,C) @ inp^T (C,N), where
    // w as stored is column-major (C,OC), ld C (hence ta), and inp is column-major (C,N), ld C. The bias runs down
    // the columns of out^T: cuBLASLt's bias epilogue, a vector of out^T's rows (OC).
    if (N <= 0 || OC <= 0)
        return;
    snug_cuda_gemm_ex(be, 1, 0, OC, N, C, 1.0f, w, C, inp, C, SNUG_DT_F32, 0.0f, out, OC, SNUG_DT_F32, bias);
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

/* The activations x (n floats) rounded to dt (BF16 or F16) in the scratch, for a GEMM on 16-bit operands; NULL when
 * the scratch is too small (recorded: the plan sizes it, snug_cuda_scratch_bytes). */
static const void *round16(snug_backend *be, const float *x, size_t n, snug_dtype dt) {
    void *x16 = snug_cuda_scratch(be, n * 2);
    if (x16)
        snug_cuda_to16(be, x16, (float *)x, n, dt, 0); /* round_src 0: x is only read */
    return x16;
}

/* The weight's dtype must be the math's: the products are then those matmul_fwd/bwd would multiply. */
static int w16_ok(snug_backend *be, snug_dtype wdt) {
    if ((wdt == SNUG_DT_BF16 || wdt == SNUG_DT_F16) && wdt == be->math)
        return 1;
    snug_cuda_fail(be, __FILE__, __LINE__, "matmul_w16 with a %s weight under %s math (a bug in snug: set_math fills "
                   "the slots only under 16-bit math)", snug_dtype_name(wdt), snug_dtype_name(be->math));
    return 0;
}

extern "C" void snug_cuda_matmul_w16_fwd(snug_backend *be, float *out, const float *inp, const void *w,
                                         snug_dtype wdt, const float *bias, int N, int C, int OC) {
    // as snug_cuda_matmul_fwd, both operands 16-bit: out^T (OC,N) = w^T (OC,C) @ inp16^T (C,N)
    if (N <= 0 || OC <= 0 || !w16_ok(be, wdt))
        return;
    const void *x16 = round16(be, inp, (size_t)N * C, wdt);
    if (x16)
        snug_cuda_gemm_ex(be, 1, 0, OC, N, C, 1.0f, w, C, x16, C, wdt, 0.0f, out, OC, SNUG_DT_F32, bias);
}

extern "C" void snug_cuda_matmul_w16_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                         const float *inp, const void *w, snug_dtype wdt, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0 || !w16_ok(be, wdt))
        return;
    // dinp (N,C) += dout16 (N,OC) @ w (OC,C). Column-major: dinp^T (C,N) = w (C,OC) @ dout16^T (OC,N)
    if (dinp) {
        const void *d16 = round16(be, dout, (size_t)N * OC, wdt);
        if (!d16)
            return;
        snug_cuda_gemm_ex(be, 0, 0, C, N, OC, 1.0f, w, C, d16, OC, wdt, 1.0f, dinp, C, SNUG_DT_F32, NULL);
    }
    // dw and dbias read only activations: matmul_bwd's (the scratch is free again: the GEMM above was queued first)
    snug_cuda_matmul_bwd(be, NULL, dw, dbias, dout, inp, NULL, N, C, OC);
}
