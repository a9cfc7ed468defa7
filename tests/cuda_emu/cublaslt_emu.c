/* cublaslt_emu.c: the stand-in cuBLASLt of the emulated CUDA build (libcublasLt.so.0), which runs snug's GEMMs on
 * the CPU with the library's semantics and checks, so matmul_cuda.cu and its fallbacks are tested without a GPU.
 *
 * What it computes, as cuBLASLt does (column-major): D = alpha * op(A) @ op(B) + beta * C, then + bias when the
 * desc's epilogue is CUBLASLT_EPILOGUE_BIAS (one value per row of D, broadcast along the columns). op() is the
 * desc's TRANSA/TRANSB. Operands are CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F (A and B of one type; C and D of A's type
 * or fp32 for 16-bit A, fp32 for fp32 A), the bias fp32 or D's type.
 * - 16-bit values are read as stored (widening is exact). Under CUBLAS_COMPUTE_32F_FAST_16BF / _16F the fp32
 *   operands are first rounded to bf16 / fp16 (to nearest even), as the tensor cores would see them.
 * - Each element of op(A) @ op(B) is a float accumulator starting at 0 that takes its k products in order p = 0, 1,
 *   ..., k-1 with fused multiply-adds (fmaf: as a GPU's FFMA; the same bits whatever the compiler's FP contraction,
 *   and for 16-bit operands identical to a separate multiply and add, their products being exact in fp32). So a
 *   problem always gives the same bits, whichever loop order serves it.
 * - Then t = alpha * acc; t = fmaf(beta, c, t) only when beta != 0 (beta 0 never reads C: NaN garbage there does
 *   not propagate); t += bias; D = t, rounded to nearest even when D is 16-bit. With alpha 1 the bias epilogue gives
 *   the same bits as the bias written into C first and added with beta 1 (snug's fallback).
 * alpha and beta are host floats (the default pointer mode), read when cublasLtMatmul is called; the product itself
 * is queued on the stream with snug_emu_enqueue, with everything it needs copied, and runs in stream order.
 *
 * Checks, as the library makes them or as the GPU would fail:
 * - parameters: dimensions of the four layouts consistent with the transposes (m x k, k x n, m x n, m x n), every
 *   ld >= rows, in-place C == D with the same type and ld, the algorithm from a heuristic for these types, compute
 *   and epilogue, a workspace at least the algorithm's: else CUBLAS_STATUS_INVALID_VALUE. Unsupported type,
 *   compute, scale or epilogue combinations: CUBLAS_STATUS_NOT_SUPPORTED.
 * - memory: every operand must lie in device memory over its exact extent, ((cols - 1) * ld + rows) elements of its
 *   type (C only when beta != 0), the bias m elements, the workspace the bytes the caller declares
 *   (snug_emu_check_device: fatal). D overlapping what the product reads (A, B, the bias, C other than in place) or
 *   the workspace it uses is a race on a GPU: fatal too.
 * - alignment: cuBLASLt assumes 256-byte aligned operands unless the preference promises less
 *   (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES); the bias alignment is read from the desc's bias pointer,
 *   as the library does. The heuristic has no algorithm when a promise is below the element size of that operand's
 *   type. The chosen algorithm records the promises (at most 256); cublasLtMatmul with a pointer less aligned than
 *   recorded returns CUBLAS_STATUS_NOT_SUPPORTED. (The header documents NOT_SUPPORTED for an operation "the current
 *   implementation on the selected device doesn't support" and INVALID_VALUE for parameters "in conflict"; the
 *   real library has been seen to return NOT_SUPPORTED from cublasLtMatmul for under-aligned operands, PyTorch
 *   #92201, so this is the status chosen.)
 * - workspace: the algorithm asks for m * 4 bytes (one column of fp32 accumulators, which it then keeps in the
 *   workspace) when the preference's CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES allows it, else none.
 *
 * NOT_SUPPORTED on demand, so the backend's fallbacks run in tests. SNUG_CUDA_EMU_LT (snug_emu_setting("LT")) is a
 * comma-separated list of what the heuristic refuses (an unknown word is fatal, so a typo cannot silently test
 * nothing):
 *   bias      any desc with the bias epilogue: CUBLAS_STATUS_NOT_SUPPORTED
 *   fast16    CUBLAS_COMPUTE_32F_FAST_16BF / _16F: CUBLAS_STATUS_NOT_SUPPORTED
 *   16bit     any 16-bit operand (A, B, C, D or the bias): CUBLAS_STATUS_NOT_SUPPORTED
 *   noresult  everything it would answer: CUBLAS_STATUS_SUCCESS with 0 results
 *   all       everything: CUBLAS_STATUS_NOT_SUPPORTED
 * It is read at each heuristic query; cublasLtMatmul with an algorithm already chosen is not affected. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cublasLt.h"
#include "snug_emu.h"

/* Tags of live objects: a destroyed or foreign handle is reported, not used. */
#define HANDLE_MAGIC 0x4c74480au
#define DESC_MAGIC 0x4c74440au
#define LAYOUT_MAGIC 0x4c744c0au
#define PREF_MAGIC 0x4c74500au
#define ALGO_MAGIC 0x736e75674c744131ull /* "snugLtA1" */

#define DEFAULT_ALIGN 256u

struct cublasLtContext {
    uint32_t magic;
};

struct snug_emu_lt_desc {
    uint32_t magic;
    int32_t compute, scale;
    int32_t transa, transb; /* CUBLAS_OP_N or CUBLAS_OP_T */
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type; /* -1: not set, D's type */
};

struct snug_emu_lt_layout {
    uint32_t magic;
    int32_t type;
    uint64_t rows, cols;
    int64_t ld;
};

struct snug_emu_lt_pref {
    uint32_t magic;
    uint64_t max_ws;
    uint32_t align[4]; /* A, B, C, D */
};

/* One GEMM, resolved from a desc and four layouts: everything the queued work needs besides pointers and scalars. */
typedef struct problem {
    int ta, tb;
    uint64_t m, n, k;
    int32_t atype, btype, ctype, dtype, bias_type; /* bias_type resolved: D's when not set */
    int32_t compute, scale;
    uint32_t epilogue;
    int bias; /* epilogue is CUBLASLT_EPILOGUE_BIAS */
    int64_t lda, ldb, ldc, ldd;
    size_t abytes, bbytes, cbytes, dbytes; /* exact extents */
} problem;

typedef struct gemm_job {
    problem pr;
    float alpha, beta;
    const void *A, *B, *C, *bias;
    void *D;
    void *ws;        /* the workspace, used for the accumulators when ws_bytes >= m * 4 */
    size_t ws_bytes; /* what the algorithm asked for */
} gemm_job;

/* ---- conversions: bit-exact, round to nearest even, NaN kept NaN (quiet) ---- */

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bf16_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

static uint16_t f32_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncating could leave an infinity; set the quiet bit */
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); /* a carry into the exponent is correct rounding */
}

static float f16_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (e == 0x1f) /* inf, NaN with its payload */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (e)
        return bits_f32(sign | ((e + 112u) << 23) | (mant << 13));
    if (!mant)
        return bits_f32(sign);
    e = 113; /* subnormal mant * 2^-24: normalise, exact in fp32 */
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

static uint16_t f32_f16(float f) {
    uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* at or beyond 65520, halfway from 65504 (odd) up: infinity, as are infinities */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal in fp16: rebias the exponent (127 - 15), round 13 bits away */
        uint32_t r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    uint32_t e = ax >> 23;
    if (e < 102) /* below 2^-25, half the smallest subnormal: zero */
        return (uint16_t)sign;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e; /* value / 2^-24 = mant >> shift, 14..24 */
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    q += rem > half || (rem == half && (q & 1u)); /* 0x400 after a carry: the smallest normal, encoded alike */
    return (uint16_t)(sign | q);
}

static size_t type_size(int32_t t) {
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 0;
}

static int is16(int32_t t) {
    return t == CUDA_R_16BF || t == CUDA_R_16F;
}

/* Element i of an array of type t, as a float; fp32 values rounded to `round` (CUDA_R_16BF / _16F, or -1: kept). */
static float load(const void *base, size_t i, int32_t t, int32_t round) {
    if (t == CUDA_R_16BF)
        return bf16_f32(((const uint16_t *)base)[i]);
    if (t == CUDA_R_16F)
        return f16_f32(((const uint16_t *)base)[i]);
    float v = ((const float *)base)[i];
    return round == CUDA_R_16BF ? bf16_f32(f32_bf16(v)) : round == CUDA_R_16F ? f16_f32(f32_f16(v)) : v;
}

static void store(void *base, size_t i, int32_t t, float v) {
    if (t == CUDA_R_16BF)
        ((uint16_t *)base)[i] = f32_bf16(v);
    else if (t == CUDA_R_16F)
        ((uint16_t *)base)[i] = f32_f16(v);
    else
        ((float *)base)[i] = v;
}

/* ---- the product, run from the stream's queue ---- */

static void *run_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        snug_emu_fatal("cublasLtMatmul: out of host memory (%zu bytes) for the emulated GEMM", bytes);
    return p;
}

/* Built twice, picked at load by the CPU: with FMA instructions fmaf is one instruction (the same bits as the library
 * call, which rounds once too). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("fma", "default")))
#endif
static void gemm_run(void *arg) {
    gemm_job *j = (gemm_job *)arg;
    const problem *p = &j->pr;
    size_t m = p->m, n = p->n, k = p->k;
    int32_t round = p->compute == CUBLAS_COMPUTE_32F_FAST_16BF ? CUDA_R_16BF
                    : p->compute == CUBLAS_COMPUTE_32F_FAST_16F ? CUDA_R_16F
                                                                : -1;
    /* A as floats, as stored (ta: k x m, else m x k): in place when it is fp32 kept as is, else widened (and
     * rounded) once into a packed copy */
    size_t arows = p->ta ? k : m, acols = p->ta ? m : k;
    const float *Af = (const float *)j->A;
    size_t lda = (size_t)p->lda;
    float *abuf = NULL;
    if (p->atype != CUDA_R_32F || round != -1) {
        abuf = (float *)run_alloc(arows * acols * sizeof(float));
        for (size_t c = 0; c < acols; c++)
            for (size_t r = 0; r < arows; r++)
                abuf[c * arows + r] = load(j->A, c * lda + r, p->atype, round);
        Af = abuf;
        lda = arows;
    }
    float *acc = j->ws_bytes >= m * sizeof(float) ? (float *)j->ws : (float *)run_alloc(m * sizeof(float));
    float *bcol = (float *)run_alloc(k * sizeof(float));
    for (size_t col = 0; col < n; col++) {
        /* column col of op(B) (k): B stored k x n, or n x k when transposed */
        for (size_t q = 0; q < k; q++)
            bcol[q] = load(j->B, p->tb ? q * (size_t)p->ldb + col : col * (size_t)p->ldb + q, p->btype, round);
        if (!p->ta) { /* op(A) column q is contiguous: acc += A[:, q] * b[q], q in order */
            memset(acc, 0, m * sizeof(float));
            for (size_t q = 0; q < k; q++) {
                const float *a = Af + q * lda;
                float b = bcol[q];
                for (size_t i = 0; i < m; i++)
                    acc[i] = fmaf(a[i], b, acc[i]);
            }
        } else { /* op(A) row i is A's column i, contiguous: dot products, four independent ones at a time */
            size_t i = 0;
            for (; i + 4 <= m; i += 4) {
                const float *a0 = Af + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
                for (size_t q = 0; q < k; q++) {
                    float b = bcol[q];
                    s0 = fmaf(a0[q], b, s0);
                    s1 = fmaf(a1[q], b, s1);
                    s2 = fmaf(a2[q], b, s2);
                    s3 = fmaf(a3[q], b, s3);
                }
                acc[i] = s0, acc[i + 1] = s1, acc[i + 2] = s2, acc[i + 3] = s3;
            }
            for (; i < m; i++) {
                const float *a = Af + i * lda;
                float s = 0.0f;
                for (size_t q = 0; q < k; q++)
                    s = fmaf(a[q], bcol[q], s);
                acc[i] = s;
            }
        }
        for (size_t i = 0; i < m; i++) {
            float t = j->alpha * acc[i];
            if (j->beta != 0.0f)
                t = fmaf(j->beta, load(j->C, col * (size_t)p->ldc + i, p->ctype, -1), t);
            if (p->bias)
                t += load(j->bias, i, p->bias_type, -1);
            store(j->D, col * (size_t)p->ldd + i, p->dtype, t);
        }
    }
    free(bcol);
    if (acc != j->ws)
        free(acc);
    free(abuf);
    free(j);
}

/* ---- objects ---- */

static void live(const void *obj, uint32_t magic, const char *what) {
    if (*(const uint32_t *)obj != magic)
        snug_emu_fatal("cuBLASLt: %p is not a live %s (destroyed, or never created)", obj, what);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasLtContext *h = (struct cublasLtContext *)calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = HANDLE_MAGIC;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    live(lightHandle, HANDLE_MAGIC, "cublasLtHandle_t");
    lightHandle->magic = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct snug_emu_lt_desc *d = (struct snug_emu_lt_desc *)calloc(1, sizeof *d);
    if (!d)
        return CUBLAS_STATUS_ALLOC_FAILED;
    d->magic = DESC_MAGIC;
    d->compute = (int32_t)computeType; /* an unsupported one is the heuristic's NOT_SUPPORTED, as in the library */
    d->scale = (int32_t)scaleType;
    d->transa = d->transb = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = -1;
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

/* Copies an attribute's value, whose size must be exactly the attribute's (as cuBLASLt checks). */
static int attr_get(void *dst, size_t want, const void *buf, size_t got) {
    if (!buf || got != want)
        return 0;
    memcpy(dst, buf, want);
    return 1;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes) {
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    live(matmulDesc, DESC_MAGIC, "cublasLtMatmulDesc_t");
    int32_t i32;
    uint32_t u32;
    const void *ptr;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (!attr_get(&i32, sizeof i32, buf, sizeInBytes) || (i32 != CUBLAS_OP_N && i32 != CUBLAS_OP_T))
            return CUBLAS_STATUS_INVALID_VALUE;
        *(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &matmulDesc->transa : &matmulDesc->transb) = i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (!attr_get(&u32, sizeof u32, buf, sizeInBytes))
            return CUBLAS_STATUS_INVALID_VALUE;
        matmulDesc->epilogue = u32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (!attr_get(&ptr, sizeof ptr, buf, sizeInBytes))
            return CUBLAS_STATUS_INVALID_VALUE;
        matmulDesc->bias = ptr;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if (!attr_get(&i32, sizeof i32, buf, sizeInBytes))
            return CUBLAS_STATUS_INVALID_VALUE;
        matmulDesc->bias_type = i32;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE; /* an attribute the stand-in does not know */
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    if (!matmulDesc)
        return CUBLAS_STATUS_SUCCESS;
    live(matmulDesc, DESC_MAGIC, "cublasLtMatmulDesc_t");
    matmulDesc->magic = 0;
    free(matmulDesc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct snug_emu_lt_layout *l = (struct snug_emu_lt_layout *)calloc(1, sizeof *l);
    if (!l)
        return CUBLAS_STATUS_ALLOC_FAILED;
    l->magic = LAYOUT_MAGIC;
    l->type = (int32_t)type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld; /* checked against rows where it is used, as the library does */
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    if (!matLayout)
        return CUBLAS_STATUS_SUCCESS;
    live(matLayout, LAYOUT_MAGIC, "cublasLtMatrixLayout_t");
    matLayout->magic = 0;
    free(matLayout);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct snug_emu_lt_pref *p = (struct snug_emu_lt_pref *)calloc(1, sizeof *p);
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = PREF_MAGIC;
    p->max_ws = 0; /* cuBLASLt's defaults: no workspace, 256-byte alignment promised */
    for (int i = 0; i < 4; i++)
        p->align[i] = DEFAULT_ALIGN;
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes) {
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    live(pref, PREF_MAGIC, "cublasLtMatmulPreference_t");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        return attr_get(&pref->max_ws, sizeof pref->max_ws, buf, sizeInBytes) ? CUBLAS_STATUS_SUCCESS
                                                                             : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
        uint32_t *dst = &pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES];
        return attr_get(dst, sizeof *dst, buf, sizeInBytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!pref)
        return CUBLAS_STATUS_SUCCESS;
    live(pref, PREF_MAGIC, "cublasLtMatmulPreference_t");
    pref->magic = 0;
    free(pref);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- checks shared by the heuristic and the product ---- */

/* Largest power of two dividing the address, at most 256 (what an algorithm can ask for); NULL counts as 256. */
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = DEFAULT_ALIGN;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}

/* Bytes a layout spans, ((cols - 1) * ld + rows) elements (0 when empty), into *bytes; 0 when it is not a valid
 * column-major layout (ld < rows) or the extent overflows. */
static int layout_extent(const struct snug_emu_lt_layout *l, size_t *bytes) {
    size_t es = type_size(l->type);
    uint64_t rows = l->rows, cols = l->cols;
    if (l->ld < 1 || (uint64_t)l->ld < rows)
        return 0;
    if (!rows || !cols) {
        *bytes = 0;
        return 1;
    }
    uint64_t lim = (uint64_t)PTRDIFF_MAX / 8, ld = (uint64_t)l->ld;
    if (rows > lim || cols > lim || (cols - 1) > (lim - rows) / ld)
        return 0;
    *bytes = (size_t)(((cols - 1) * ld + rows) * (es ? es : 1));
    return 1;
}

/* Resolves the desc and layouts into *pr: CUBLAS_STATUS_INVALID_VALUE for inconsistent shapes or leading
 * dimensions, the library's answer to parameters "in conflict". */
static cublasStatus_t problem_make(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                   cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl, problem *pr) {
    if (!d || !a || !b || !c || !dl)
        return CUBLAS_STATUS_INVALID_VALUE;
    live(d, DESC_MAGIC, "cublasLtMatmulDesc_t");
    live(a, LAYOUT_MAGIC, "cublasLtMatrixLayout_t (A)");
    live(b, LAYOUT_MAGIC, "cublasLtMatrixLayout_t (B)");
    live(c, LAYOUT_MAGIC, "cublasLtMatrixLayout_t (C)");
    live(dl, LAYOUT_MAGIC, "cublasLtMatrixLayout_t (D)");
    memset(pr, 0, sizeof *pr);
    pr->ta = d->transa == CUBLAS_OP_T, pr->tb = d->transb == CUBLAS_OP_T;
    pr->m = dl->rows, pr->n = dl->cols;
    pr->k = pr->ta ? a->rows : a->cols;
    uint64_t am = pr->ta ? a->cols : a->rows;
    uint64_t bk = pr->tb ? b->cols : b->rows, bn = pr->tb ? b->rows : b->cols;
    if (am != pr->m || bk != pr->k || bn != pr->n || c->rows != pr->m || c->cols != pr->n)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!layout_extent(a, &pr->abytes) || !layout_extent(b, &pr->bbytes) || !layout_extent(c, &pr->cbytes) ||
        !layout_extent(dl, &pr->dbytes))
        return CUBLAS_STATUS_INVALID_VALUE;
    pr->atype = a->type, pr->btype = b->type, pr->ctype = c->type, pr->dtype = dl->type;
    pr->lda = a->ld, pr->ldb = b->ld, pr->ldc = c->ld, pr->ldd = dl->ld;
    pr->compute = d->compute, pr->scale = d->scale, pr->epilogue = d->epilogue;
    pr->bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS;
    pr->bias_type = d->bias_type < 0 ? dl->type : d->bias_type;
    return CUBLAS_STATUS_SUCCESS;
}

/* CUBLAS_STATUS_NOT_SUPPORTED for what cuBLASLt has no kernel for (of what the stand-in emulates): fp32 operands
 * under 32F or its FAST_16BF/16F kinds, with fp32 C and D; 16-bit operands under 32F, with C and D of their type or
 * fp32; the default and bias epilogues, the bias fp32 or of D's type; fp32 scalars. */
static cublasStatus_t problem_supported(const problem *pr) {
    int fast = pr->compute == CUBLAS_COMPUTE_32F_FAST_16BF || pr->compute == CUBLAS_COMPUTE_32F_FAST_16F;
    if (pr->compute != CUBLAS_COMPUTE_32F && !fast)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (pr->scale != CUDA_R_32F || !type_size(pr->atype) || pr->btype != pr->atype || pr->dtype != pr->ctype)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int c_ok = pr->atype == CUDA_R_32F ? pr->ctype == CUDA_R_32F
                                       : !fast && (pr->ctype == CUDA_R_32F || pr->ctype == pr->atype);
    if (!c_ok)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (pr->epilogue != CUBLASLT_EPILOGUE_DEFAULT && pr->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (pr->bias && pr->bias_type != CUDA_R_32F && pr->bias_type != pr->dtype)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

enum { REFUSE_BIAS = 1, REFUSE_FAST16 = 2, REFUSE_16BIT = 4, REFUSE_NORESULT = 8, REFUSE_ALL = 16 };

/* What SNUG_CUDA_EMU_LT makes the heuristic refuse (see the top of the file). */
static unsigned refusals(void) {
    static const struct {
        const char *word;
        unsigned bit;
    } words[] = {{"bias", REFUSE_BIAS},         {"fast16", REFUSE_FAST16}, {"16bit", REFUSE_16BIT},
                 {"noresult", REFUSE_NORESULT}, {"all", REFUSE_ALL}};
    const char *s = snug_emu_setting("LT");
    unsigned bits = 0;
    while (s && *s) {
        while (*s == ',' || *s == ' ')
            s++;
        size_t len = strcspn(s, ", ");
        if (!len)
            break;
        size_t w = 0;
        while (w < sizeof words / sizeof words[0] && (strlen(words[w].word) != len || memcmp(words[w].word, s, len)))
            w++;
        if (w == sizeof words / sizeof words[0])
            snug_emu_fatal("SNUG_CUDA_EMU_LT: unknown word '%.*s' (known: bias, fast16, 16bit, noresult, all)",
                           (int)len, s);
        bits |= words[w].bit;
        s += len;
    }
    return bits;
}

/* The algorithm cuBLASLt would choose for pr under the preference's maximum workspace and promised alignments
 * (A, B, C, D) and the bias pointer's: into *out with its workspace; the heuristic's status and result count. */
static cublasStatus_t choose(const problem *pr, uint64_t max_ws, const uint32_t align[4], const void *bias,
                             cublasLtMatmulHeuristicResult_t *out, int *count) {
    *count = 0;
    cublasStatus_t st = problem_supported(pr);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    unsigned no = refusals();
    int fast = pr->compute != CUBLAS_COMPUTE_32F;
    int any16 = is16(pr->atype) || is16(pr->ctype) || (pr->bias && is16(pr->bias_type));
    if ((no & REFUSE_ALL) || ((no & REFUSE_BIAS) && pr->bias) || ((no & REFUSE_FAST16) && fast) ||
        ((no & REFUSE_16BIT) && any16))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* every kernel needs its operands aligned to their elements at least */
    uint32_t al[5];
    const int32_t types[5] = {pr->atype, pr->btype, pr->ctype, pr->dtype, pr->bias ? pr->bias_type : CUDA_R_32F};
    for (int i = 0; i < 5; i++) {
        al[i] = i < 4 ? align[i] : ptr_align(bias);
        al[i] = al[i] > DEFAULT_ALIGN ? DEFAULT_ALIGN : al[i];
        if (al[i] < type_size(types[i]))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (no & REFUSE_NORESULT)
        return CUBLAS_STATUS_SUCCESS;
    memset(out, 0, sizeof *out);
    uint64_t ws = pr->m * sizeof(float) <= max_ws ? pr->m * sizeof(float) : 0;
    uint64_t *a = out->algo.data;
    a[0] = ALGO_MAGIC;
    a[1] = (uint64_t)(uint32_t)pr->compute | (uint64_t)pr->epilogue << 32;
    a[2] = (uint64_t)(uint8_t)pr->atype | (uint64_t)(uint8_t)pr->btype << 8 | (uint64_t)(uint8_t)pr->ctype << 16 |
           (uint64_t)(uint8_t)pr->dtype << 24 | (uint64_t)(uint8_t)(pr->bias ? pr->bias_type : 0) << 32;
    a[3] = (uint64_t)al[0] | (uint64_t)al[1] << 16 | (uint64_t)al[2] << 32 | (uint64_t)al[3] << 48;
    a[4] = al[4];
    a[5] = ws;
    out->workspaceSize = (size_t)ws;
    out->state = CUBLAS_STATUS_SUCCESS;
    out->wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount) {
    if (!lightHandle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    live(lightHandle, HANDLE_MAGIC, "cublasLtHandle_t");
    if (returnAlgoCount)
        *returnAlgoCount = 0;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount || !preference)
        return CUBLAS_STATUS_INVALID_VALUE;
    live(preference, PREF_MAGIC, "cublasLtMatmulPreference_t");
    problem pr;
    cublasStatus_t st = problem_make(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &pr);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    return choose(&pr, preference->max_ws, preference->align, operationDesc->bias, heuristicResultsArray,
                  returnAlgoCount);
}

/* Fatal when [w, w + wn), which the product writes, and [r, r + rn), which it reads, share a byte: a race on a GPU,
 * whose result depends on the order of the threads. */
static void no_overlap(const void *w, size_t wn, const char *wname, const void *r, size_t rn, const char *rname) {
    uintptr_t a = (uintptr_t)w, b = (uintptr_t)r;
    if (wn && rn && a < b + rn && b < a + wn)
        snug_emu_fatal("cublasLtMatmul: %s [%p, +%zu bytes) overlaps %s [%p, +%zu bytes), which the product reads "
                       "while it writes the other: a race on a GPU", wname, w, wn, rname, r, rn);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                              cudaStream_t stream) {
    if (!lightHandle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    live(lightHandle, HANDLE_MAGIC, "cublasLtHandle_t");
    if (!alpha || !beta || !A || !B || !D)
        return CUBLAS_STATUS_INVALID_VALUE;
    problem pr;
    cublasStatus_t st = problem_make(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &pr);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if ((st = problem_supported(&pr)) != CUBLAS_STATUS_SUCCESS)
        return st;
    float al = *(const float *)alpha, be = *(const float *)beta; /* host pointer mode: read now */
    int reads_c = be != 0.0f;
    if ((reads_c && !C) || (C == D && (Cdesc->type != Ddesc->type || Cdesc->ld != Ddesc->ld)))
        return CUBLAS_STATUS_INVALID_VALUE; /* in place needs one layout for C and D */
    const void *bias = pr.bias ? computeDesc->bias : NULL;
    if (pr.bias && !bias)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulHeuristicResult_t implicit;
    if (!algo) { /* as the library: a heuristic query of its own, for these pointers and this workspace */
        const uint32_t align[4] = {ptr_align(A), ptr_align(B), reads_c ? ptr_align(C) : DEFAULT_ALIGN, ptr_align(D)};
        int found = 0;
        st = choose(&pr, workspaceSizeInBytes, align, bias, &implicit, &found);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
        if (!found)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        algo = &implicit.algo;
    }
    const uint64_t *a = algo->data;
    uint64_t a1 = (uint64_t)(uint32_t)pr.compute | (uint64_t)pr.epilogue << 32;
    uint64_t a2 = (uint64_t)(uint8_t)pr.atype | (uint64_t)(uint8_t)pr.btype << 8 | (uint64_t)(uint8_t)pr.ctype << 16 |
                  (uint64_t)(uint8_t)pr.dtype << 24 | (uint64_t)(uint8_t)(pr.bias ? pr.bias_type : 0) << 32;
    if (a[0] != ALGO_MAGIC || a[1] != a1 || a[2] != a2)
        return CUBLAS_STATUS_INVALID_VALUE; /* not an algorithm for this desc and these layouts */
    size_t ws = (size_t)a[5];
    if (workspaceSizeInBytes < ws || (ws && !workspace))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!pr.m || !pr.n)
        return CUBLAS_STATUS_SUCCESS;
    size_t bias_bytes = pr.bias ? pr.m * type_size(pr.bias_type) : 0;
    if (pr.abytes)
        snug_emu_check_device(A, pr.abytes, "cublasLtMatmul: A");
    if (pr.bbytes)
        snug_emu_check_device(B, pr.bbytes, "cublasLtMatmul: B");
    if (reads_c)
        snug_emu_check_device(C, pr.cbytes, "cublasLtMatmul: C");
    snug_emu_check_device(D, pr.dbytes, "cublasLtMatmul: D");
    if (bias)
        snug_emu_check_device(bias, bias_bytes, "cublasLtMatmul: bias (CUBLASLT_MATMUL_DESC_BIAS_POINTER)");
    if (workspace && workspaceSizeInBytes)
        snug_emu_check_device(workspace, workspaceSizeInBytes, "cublasLtMatmul: workspace");
    /* less aligned than the algorithm was chosen for: it has no kernel for these pointers */
    if (ptr_align(A) < (uint32_t)(a[3] & 0xffff) || ptr_align(B) < (uint32_t)(a[3] >> 16 & 0xffff) ||
        (reads_c && ptr_align(C) < (uint32_t)(a[3] >> 32 & 0xffff)) || ptr_align(D) < (uint32_t)(a[3] >> 48) ||
        (bias && ptr_align(bias) < (uint32_t)a[4]))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    no_overlap(D, pr.dbytes, "D", A, pr.abytes, "A");
    no_overlap(D, pr.dbytes, "D", B, pr.bbytes, "B");
    if (reads_c && C != D)
        no_overlap(D, pr.dbytes, "D", C, pr.cbytes, "C");
    if (bias)
        no_overlap(D, pr.dbytes, "D", bias, bias_bytes, "the bias");
    if (ws) { /* the accumulators are written there */
        no_overlap(workspace, ws, "the workspace", D, pr.dbytes, "D");
        no_overlap(workspace, ws, "the workspace", A, pr.abytes, "A");
        no_overlap(workspace, ws, "the workspace", B, pr.bbytes, "B");
        if (reads_c)
            no_overlap(workspace, ws, "the workspace", C, pr.cbytes, "C");
        if (bias)
            no_overlap(workspace, ws, "the workspace", bias, bias_bytes, "the bias");
    }
    gemm_job *j = (gemm_job *)malloc(sizeof *j);
    if (!j)
        return CUBLAS_STATUS_ALLOC_FAILED;
    j->pr = pr;
    j->alpha = al, j->beta = be;
    j->A = A, j->B = B, j->C = reads_c ? C : NULL, j->D = D, j->bias = bias;
    /* the accumulators live in the workspace only if it is float-aligned; else the work allocates its own */
    j->ws = workspace;
    j->ws_bytes = ptr_align(workspace) >= sizeof(float) ? ws : 0;
    if (snug_emu_enqueue(stream, "cublasLtMatmul", gemm_run, j) != 0) {
        free(j);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}
