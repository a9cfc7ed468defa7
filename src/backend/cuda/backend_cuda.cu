/* backend_cuda.cu: the CUDA backend object: device memory blocks for the arenas, pinned host memory for paged state,
 * the two streams and the table of op slots.
 *
 * Ops run in order on one compute stream. Copies of paged optimizer state run on a side stream, each first waiting
 * (by an event) for the ops already queued on the compute stream, so a chunk copied out right after its update is
 * copied updated; the caller's sync waits for both streams. The ops live in ops_cuda.cu, matmul_cuda.cu,
 * xent_cuda.cu, adamw_cuda.cu and attention*_cuda.cu. */
#include <dlfcn.h>
#include <stdarg.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/backend_cuda_stream.h"

/* cuBLASLt workspace: 32 MiB is what NVIDIA recommends for Hopper (and ample for Ampere). */
#define LT_WS_BYTES ((size_t)32 << 20)
/* The scratch when the creator gives no size (snug_backend_cuda_create): enough for the column sums of a width up to
 * 16384, the per-token losses of 1M tokens and the attention row sums of 4M (token, head) pairs. */
#define SCRATCH_BYTES ((size_t)16 << 20)

snug_lt_api snug_lt;

/* Loads cuBLASLt and fills snug_lt, once per process: the library of the toolkit snug was built with, by its soname
 * (found through the loader's path), else from the toolkit's directory as configured. 0 on success, else -1 with
 * the reason in why. */
static int load_cublaslt(char *why, size_t nwhy) {
    static int loaded = 0;
    if (loaded)
        return 0;
    char name[64];
    snprintf(name, sizeof name, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
#ifdef SNUG_CUDA_LIBDIR
    if (!lib) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", SNUG_CUDA_LIBDIR, name);
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
#endif
    if (!lib) {
        const char *err = dlerror();
        snprintf(why, nwhy, "cannot load %s (%s); install the CUDA toolkit's cuBLAS %d or add its directory to "
                 "LD_LIBRARY_PATH", name, err ? err : "not found", CUBLAS_VER_MAJOR);
        return -1;
    }
    struct {
        void **fn;
        const char *sym;
    } syms[] = {
        {(void **)&snug_lt.Create, "cublasLtCreate"},
        {(void **)&snug_lt.Destroy, "cublasLtDestroy"},
        {(void **)&snug_lt.MatmulDescCreate, "cublasLtMatmulDescCreate"},
        {(void **)&snug_lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute"},
        {(void **)&snug_lt.MatmulDescDestroy, "cublasLtMatmulDescDestroy"},
        {(void **)&snug_lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate"},
        {(void **)&snug_lt.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy"},
        {(void **)&snug_lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate"},
        {(void **)&snug_lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute"},
        {(void **)&snug_lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy"},
        {(void **)&snug_lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"},
        {(void **)&snug_lt.Matmul, "cublasLtMatmul"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].fn = dlsym(lib, syms[i].sym))) {
            snprintf(why, nwhy, "%s has no %s: a cuBLAS older than the toolkit snug was built with (%d)", name,
                     syms[i].sym, CUBLAS_VER_MAJOR);
            memset(&snug_lt, 0, sizeof snug_lt);
            dlclose(lib);
            return -1;
        }
    loaded = 1;
    return 0;
}

extern "C" int snug_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it: a machine without a driver is not an error here */
        return 0;
    }
    return n;
}

static void cuda_destroy(snug_backend *be) {
    if (!be)
        return;
    snug_cuda_ctx *cx = snug_cuda(be);
    if (cx) {
        if (cx->stream)
            cudaStreamSynchronize(cx->stream);
        if (cx->side)
            cudaStreamSynchronize(cx->side);
        snug_cuda_gemm_cache_free(be);
        if (cx->lt)
            snug_lt.Destroy(cx->lt);
        cudaFree(cx->lt_ws);
        cudaFree(cx->scratch);
        cudaFree(cx->acc);
        if (cx->side_done)
            cudaEventDestroy(cx->side_done);
        if (cx->side_wait)
            cudaEventDestroy(cx->side_wait);
        if (cx->stream)
            cudaStreamDestroy(cx->stream);
        if (cx->side)
            cudaStreamDestroy(cx->side);
        free(cx);
    }
    free(be);
}

extern "C" void snug_cuda_fail(snug_backend *be, const char *file, int line, const char *fmt, ...) {
    snug_cuda_ctx *cx = snug_cuda(be);
    if (cx->err.code)
        return;
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const char *f = strstr(file, "src/");
    snug_fail(&cx->err, SNUG_EINTERNAL, "CUDA device %d (%s): %s at %s:%d; the GPU's results from here on are invalid: "
              "check the device (nvidia-smi), or run with device: cpu", cx->device, cx->device_name, why,
              f ? f : file, line);
}

/* be->set_math: under 16-bit math the linear layers read 16-bit weights as stored (matmul_w16, matmul_cuda.cu);
 * under fp32 math the slots are NULL and the model widens the weights for matmul_fwd/bwd. */
static int cuda_set_math(snug_backend *be, snug_dtype math, int M, int N, int K, snug_error *e) {
    (void)M, (void)N, (void)K, (void)e;
    be->math = math;
    int w16 = math == SNUG_DT_BF16 || math == SNUG_DT_F16;
    be->matmul_w16_fwd = w16 ? snug_cuda_matmul_w16_fwd : NULL;
    be->matmul_w16_bwd = w16 ? snug_cuda_matmul_w16_bwd : NULL;
    be->gemm = w16 ? "cuBLASLt, 16-bit weights as stored, fp32 accumulation" : "cuBLASLt";
    return 0;
}

/* be->check */
static int cuda_check(snug_backend *be, snug_error *e) {
    snug_cuda_ctx *cx = snug_cuda(be);
    if (!cx->err.code)
        return 0;
    if (e)
        *e = cx->err;
    return cx->err.code;
}

extern "C" void *snug_cuda_scratch(snug_backend *be, size_t bytes) {
    snug_cuda_ctx *cx = snug_cuda(be);
    if (bytes <= cx->scratch_bytes)
        return cx->scratch;
    snug_cuda_fail(be, __FILE__, __LINE__, "an op needs %zu bytes of scratch but the backend was created with %zu "
                   "(snug_cuda_scratch_bytes gives the size a model shape needs; a bug in snug)", bytes,
                   cx->scratch_bytes);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ memory */

static void *cuda_alloc(snug_backend *be, size_t bytes) {
    size_t n = (bytes + 255) / 256 * 256;
    if (n == 0)
        n = 256;
    if (n < bytes) /* overflow */
        return NULL;
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is reported by returning NULL; keep later checks clean */
        return NULL;
    }
    if (!SNUG_CUDA_CHECK(cudaMemsetAsync(p, 0, n, snug_cuda_stream(be))) ||
        !SNUG_CUDA_CHECK(cudaStreamSynchronize(snug_cuda_stream(be)))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(snug_backend *be, void *p) {
    if (!p)
        return;
    SNUG_CUDA_CHECK(cudaStreamSynchronize(snug_cuda(be)->stream)); /* queued ops may still use it */
    SNUG_CUDA_CHECK(cudaStreamSynchronize(snug_cuda(be)->side));
    SNUG_CUDA_CHECK(cudaFree(p));
}

/* to_device / to_host: after the ops already queued, and finished when they return (the host buffer may be reused
 * at once). cudaMemcpyDefault lets the pointers be device, pinned or pageable memory. */
static void cuda_copy_sync(snug_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes)
        return;
    cudaStream_t s = snug_cuda_stream(be);
    SNUG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    SNUG_CUDA_CHECK(cudaStreamSynchronize(s));
}

/* copy: device to device, queued on the compute stream */
static void cuda_copy_queued(snug_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes)
        SNUG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, snug_cuda_stream(be)));
}

static void cuda_zero(snug_backend *be, void *dst, size_t bytes) {
    if (bytes)
        SNUG_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, snug_cuda_stream(be)));
}

static void *cuda_host_alloc(snug_backend *be, size_t bytes) {
    size_t n = bytes ? bytes : 64;
    void *p = NULL;
    if (cudaHostAlloc(&p, n, cudaHostAllocDefault) != cudaSuccess) { /* page-aligned */
        (void)cudaGetLastError();
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

static void cuda_host_free(snug_backend *be, void *p) {
    if (!p)
        return;
    SNUG_CUDA_CHECK(cudaStreamSynchronize(snug_cuda(be)->side)); /* a queued copy may still use it */
    SNUG_CUDA_CHECK(cudaStreamSynchronize(snug_cuda(be)->stream));
    SNUG_CUDA_CHECK(cudaFreeHost(p));
}

/* A side-stream copy starts only after everything queued on the compute stream so far. */
static void cuda_side_copy(snug_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes)
        return;
    snug_cuda_ctx *cx = snug_cuda(be);
    SNUG_CUDA_CHECK(cudaEventRecord(cx->side_wait, cx->stream));
    SNUG_CUDA_CHECK(cudaStreamWaitEvent(cx->side, cx->side_wait, 0));
    SNUG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cx->side));
}

/* be->copy_wait: the compute stream waits for the side copies queued so far; the host goes on. */
static void cuda_copy_wait(snug_backend *be) {
    snug_cuda_ctx *cx = snug_cuda(be);
    SNUG_CUDA_CHECK(cudaEventRecord(cx->side_done, cx->side));
    SNUG_CUDA_CHECK(cudaStreamWaitEvent(cx->stream, cx->side_done, 0));
}

static void cuda_sync(snug_backend *be) {
    SNUG_CUDA_CHECK(cudaStreamSynchronize(snug_cuda(be)->stream));
    SNUG_CUDA_CHECK(cudaStreamSynchronize(snug_cuda(be)->side));
}

/* ------------------------------------------------------------------------------------------------ the object */

extern "C" int snug_cuda_mem_info(snug_backend *be, size_t *free_bytes, size_t *total_bytes) {
    size_t f = 0, t = 0;
    if (!be || cudaSetDevice(snug_cuda(be)->device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    if (free_bytes)
        *free_bytes = f;
    if (total_bytes)
        *total_bytes = t;
    return 0;
}

extern "C" size_t snug_cuda_device_free(int device) {
    size_t f = 0, t = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return f;
}

extern "C" const char *snug_cuda_device_name(snug_backend *be) { return be ? snug_cuda(be)->device_name : ""; }

extern "C" void *snug_cuda_compute_stream(snug_backend *be) { return (void *)snug_cuda(be)->stream; }

extern "C" int snug_cuda_device(snug_backend *be) { return snug_cuda(be)->device; }

/* Fails creation: clears CUDA's last error, frees what was made, fills e. */
static snug_backend *create_fail(snug_backend *be, snug_error *e, cudaError_t err, const char *what, int device) {
    (void)cudaGetLastError();
    cuda_destroy(be);
    snug_fail(e, SNUG_EINTERNAL, "CUDA device %d: %s failed: %s; check that the NVIDIA driver works (nvidia-smi) "
              "and that the device is not in exclusive use, or use device: cpu", device, what,
              cudaGetErrorString(err));
    return NULL;
}

extern "C" snug_backend *snug_backend_cuda_create(int device, snug_error *e) {
    return snug_backend_cuda_create_sized(device, 0, e);
}

extern "C" snug_backend *snug_backend_cuda_create_sized(int device, size_t scratch_bytes, snug_error *e) {
    int count = 0;
    cudaError_t cerr = cudaGetDeviceCount(&count);
    if (cerr != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        if (cerr == cudaSuccess || cerr == cudaErrorNoDevice)
            snug_fail(e, SNUG_EINPUT, "device: cuda but no CUDA GPU is visible (nvidia-smi shows none, or "
                      "CUDA_VISIBLE_DEVICES hides them); use device: cpu or auto");
        else
            snug_fail(e, SNUG_EINPUT, "device: cuda but no CUDA GPU is usable: %s (no NVIDIA driver, or one older "
                      "than CUDA %d.%d needs; nvidia-smi shows it); use device: cpu or auto", cudaGetErrorString(cerr),
                      CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        return NULL;
    }
    if (device < 0 || device >= count) {
        snug_fail(e, SNUG_EINPUT, "CUDA device %d does not exist: %d device%s visible (0 to %d)", device, count,
                  count == 1 ? " is" : "s are", count - 1);
        return NULL;
    }
    snug_backend *be = (snug_backend *)calloc(1, sizeof(*be));
    snug_cuda_ctx *cx = (snug_cuda_ctx *)calloc(1, sizeof(*cx));
    if (!be || !cx) {
        free(be);
        free(cx);
        snug_fail(e, SNUG_ENOMEM, "cannot allocate the CUDA backend object");
        return NULL;
    }
    be->ctx = cx;
    cx->device = device;

    cudaError_t err;
    if ((err = cudaSetDevice(device)) != cudaSuccess)
        return create_fail(be, e, err, "cudaSetDevice", device);
    cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
        return create_fail(be, e, err, "cudaGetDeviceProperties", device);
    snprintf(cx->device_name, sizeof cx->device_name, "%s", prop.name);
    cx->smem_optin = (int)prop.sharedMemPerBlockOptin;
    if (prop.major < 8) { /* the kernels are built for compute capability 8.0 and 9.0 (newer GPUs JIT the 9.0 PTX) */
        cuda_destroy(be);
        snug_fail(e, SNUG_EINPUT, "CUDA device %d (%s) has compute capability %d.%d; snug's CUDA backend needs 8.0 "
                  "or newer (A100, H100 and later); use device: cpu", device, prop.name, prop.major, prop.minor);
        return NULL;
    }
    /* non-blocking: the legacy default stream (used by libraries we do not control) never serialises with ours */
    if ((err = cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return create_fail(be, e, err, "creating the compute stream", device);
    if ((err = cudaStreamCreateWithFlags(&cx->side, cudaStreamNonBlocking)) != cudaSuccess)
        return create_fail(be, e, err, "creating the copy stream", device);
    if ((err = cudaEventCreateWithFlags(&cx->side_wait, cudaEventDisableTiming)) != cudaSuccess)
        return create_fail(be, e, err, "creating an event", device);
    if ((err = cudaEventCreateWithFlags(&cx->side_done, cudaEventDisableTiming)) != cudaSuccess)
        return create_fail(be, e, err, "creating an event", device);
    if ((err = cudaMalloc(&cx->lt_ws, LT_WS_BYTES)) != cudaSuccess)
        return create_fail(be, e, err, "allocating the cuBLASLt workspace", device);
    cx->lt_ws_bytes = LT_WS_BYTES;
    size_t sb = scratch_bytes ? scratch_bytes : SCRATCH_BYTES, least = snug_cuda_scratch_bytes(0, 0, 0, 0);
    sb = sb < least ? least : sb;
    if ((err = cudaMalloc(&cx->scratch, sb)) != cudaSuccess)
        return create_fail(be, e, err, "allocating the reduction scratch", device);
    cx->scratch_bytes = sb;
    if ((err = cudaMalloc(&cx->acc, sizeof *cx->acc)) != cudaSuccess ||
        (err = cudaMemsetAsync(cx->acc, 0, sizeof *cx->acc, cx->stream)) != cudaSuccess)
        return create_fail(be, e, err, "allocating the sum-of-squares accumulator", device);
    char why[1024];
    if (load_cublaslt(why, sizeof why)) {
        cuda_destroy(be);
        snug_fail(e, SNUG_EINTERNAL, "CUDA device %d: %s; or use device: cpu", device, why);
        return NULL;
    }
    if (snug_lt.Create(&cx->lt) != CUBLAS_STATUS_SUCCESS) {
        cx->lt = NULL;
        return create_fail(be, e, cudaErrorUnknown, "cublasLtCreate", device);
    }

    be->name = "cuda";
    be->caps = SNUG_CAP_CUDA_MEMORY;
    be->gemm = "cuBLASLt";
    be->nthreads = 1; /* host threads used by the ops: none beyond the caller's */
    be->host_resident = 0;
    be->destroy = cuda_destroy;
    be->mem_info = snug_cuda_mem_info;

    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->to_device = cuda_copy_sync;
    be->copy = cuda_copy_queued;
    be->to_host = cuda_copy_sync;
    be->zero = cuda_zero;

    be->embed_fwd = snug_cuda_embed_fwd;
    be->embed_bwd = snug_cuda_embed_bwd;
    be->rmsnorm_fwd = snug_cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = snug_cuda_rmsnorm_bwd;
    be->layernorm_fwd = snug_cuda_layernorm_fwd;
    be->layernorm_bwd = snug_cuda_layernorm_bwd;
    be->matmul_fwd = snug_cuda_matmul_fwd;
    be->matmul_bwd = snug_cuda_matmul_bwd;
    be->set_math = cuda_set_math;
    be->rope_fwd = snug_cuda_rope_fwd;
    be->rope_bwd = snug_cuda_rope_bwd;
    be->attention_fwd = snug_cuda_attention_fwd;
    be->attention_bwd = snug_cuda_attention_bwd;
    be->attention_naive_fwd = snug_cuda_attention_naive_fwd;
    be->attention_naive_bwd = snug_cuda_attention_naive_bwd;
    be->attention_decode = snug_cuda_attention_decode;
    be->swiglu_fwd = snug_cuda_swiglu_fwd;
    be->swiglu_bwd = snug_cuda_swiglu_bwd;
    be->gelu_fwd = snug_cuda_gelu_fwd;
    be->gelu_bwd = snug_cuda_gelu_bwd;
    be->to16 = snug_cuda_to16;
    be->from16 = snug_cuda_from16;
    be->bf16_sr = snug_cuda_bf16_sr;
    be->add = snug_cuda_add;
    be->accumulate = snug_cuda_accumulate;
    be->scale = snug_cuda_scale;
    be->gemm_strided = snug_cuda_gemm_rm;
    be->dropout = snug_cuda_dropout;
    be->add_noise = snug_cuda_add_noise;
    be->row_norms = snug_cuda_row_norms;
    be->row_dots = snug_cuda_row_dots;
    be->scale_cols = snug_cuda_scale_cols;
    be->add_scaled_cols = snug_cuda_add_scaled_cols;
    be->col_dots = snug_cuda_col_dots;
    be->dequantize_4bit = snug_cuda_dequantize_4bit;
    be->dequantize_int8 = snug_cuda_dequantize_int8;
    be->xent_fwd_bwd = snug_cuda_xent_fwd_bwd;
    be->sumsq = snug_cuda_sumsq;
    be->sumsq_acc = snug_cuda_sumsq_acc;
    be->sumsq_take = snug_cuda_sumsq_take;
    be->adamw = snug_cuda_adamw;
    be->quantize_blockwise = snug_cuda_quantize_blockwise;
    be->dequantize_blockwise = snug_cuda_dequantize_blockwise;
    be->adamw8bit = snug_cuda_adamw8bit;
    be->host_alloc = cuda_host_alloc;
    be->host_free = cuda_host_free;
    be->copy_in_async = cuda_side_copy;
    be->copy_out_async = cuda_side_copy;
    be->copy_wait = cuda_copy_wait;
    be->sync = cuda_sync;
    be->check = cuda_check;
    return be;
}
