/* cublasLt.h (emulated CUDA): the part of cuBLASLt's API that snug's CUDA backend calls, implemented on the CPU by
 * tests/cuda_emu/cublaslt_emu.c, built as libcublasLt.so.0.
 *
 * The names, enum values and the two structs the caller sees inside (cublasLtMatmulAlgo_t,
 * cublasLtMatmulHeuristicResult_t) are cuBLASLt's, so matmul_cuda.cu compiles against this header unchanged; the
 * descriptors are opaque handles to the stand-in's own structs. Only what snug uses is declared: a new attribute,
 * compute type or entry point in the backend fails to compile here until the stand-in learns it.
 *
 * CUBLAS_VER_MAJOR is 0: the backend dlopens "libcublasLt.so.<major>", and no real cuBLAS is named .so.0, so an
 * emulated build cannot pick up a real library by accident. Plain C, usable from C++. */
#ifndef SNUG_EMU_CUBLASLT_H
#define SNUG_EMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime_api.h"
#include "library_types.h"

#define CUBLAS_VER_MAJOR 0

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
} cublasOperation_t;

/* fp32 accumulation; the FAST kinds let the library round fp32 operands to 16 bits first (the stand-in always does) */
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
} cublasComputeType_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4, /* D += bias broadcast along the columns: one value per row of D */
} cublasLtEpilogue_t;

/* value types as cuBLASLt's: TRANSA/TRANSB int32_t (cublasOperation_t), EPILOGUE uint32_t, BIAS_POINTER a pointer,
 * BIAS_DATA_TYPE int32_t (cudaDataType_t; default: D's type) */
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
} cublasLtMatmulDescAttributes_t;

/* MAX_WORKSPACE_BYTES uint64_t (default 0), MIN_ALIGNMENT_* uint32_t (default 256) */
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct snug_emu_lt_desc *cublasLtMatmulDesc_t;
typedef struct snug_emu_lt_layout *cublasLtMatrixLayout_t;
typedef struct snug_emu_lt_pref *cublasLtMatmulPreference_t;

/* An algorithm, returned by value: the stand-in records in it what it was chosen for (types, epilogue, the
 * alignments promised, the workspace it may use), and cublasLtMatmul holds the call to that. */
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize; /* bytes of workspace the algorithm needs, at most the preference's maximum */
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);

/* a column-major matrix as stored: rows x cols, column j at element j * ld */
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount);

/* D = alpha * op(A) @ op(B) + beta * C (+ bias), queued on stream; alpha and beta are host floats, read now */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
