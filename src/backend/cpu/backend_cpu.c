/* backend_cpu.c: the CPU backend object: host memory blocks for the arenas and the table of op slots.
 *
 * Memory is plain host memory, page-aligned and zeroed; to_device/to_host are copies. The ops live in ops_cpu.c,
 * attention_cpu.c, xent_cpu.c and adamw8bit_cpu.c; they run on be->nthreads OpenMP threads and use OpenBLAS for the
 * GEMMs (blas_cpu.c opens it when the first backend is created; NULL when it cannot: snug_cpu_blas_load says why),
 * or oneDNN's bf16 matmul where set_math chose it (gemm_cpu.c). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/dnnl_cpu.h"
#include "backend/cpu/gemm_cpu.h"
#include "backend/cpu/ops_cpu.h"

static void cpu_destroy(snug_backend *be) {
    snug_cpu_ctx *cx = be->ctx;
    snug_dnnl_destroy(cx->dnnl);
    free(cx->wide[0]), free(cx->wide[1]);
    free(cx);
    free(be);
}

static int cpu_check(snug_backend *be, snug_error *e) {
    snug_cpu_ctx *cx = be->ctx;
    if (cx->err.code && e)
        *e = cx->err;
    return cx->err.code;
}

/* Page-aligned, so that a block (the checkpoint snapshot) can go to the disk with O_DIRECT. */
static void *cpu_alloc(snug_backend *be, size_t bytes) {
    size_t n = (bytes + 4095) / 4096 * 4096; /* aligned_alloc wants a multiple of the alignment */
    if (n == 0)
        n = 4096;
    if (n < bytes) /* overflow */
        return NULL;
    void *p = aligned_alloc(4096, n);
    if (p)
        memset(p, 0, n);
    return p;
}

static void cpu_free(snug_backend *be, void *p) { free(p); }

static void cpu_copy(snug_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes)
        memcpy(dst, src, bytes);
}

static void cpu_zero(snug_backend *be, void *dst, size_t bytes) {
    if (bytes)
        memset(dst, 0, bytes);
}

/* Paged optimizer state: on the CPU, "host" memory is the same memory and the side stream is the caller. */
static void cpu_sync(snug_backend *be) {}
static void cpu_copy_wait(snug_backend *be) {}

static void cpu_sumsq_acc(snug_backend *be, const void *x, snug_dtype dt, size_t n) {
    ((snug_cpu_ctx *)be->ctx)->sumsq_acc += snug_cpu_sumsq(be, x, dt, n);
}

static double cpu_sumsq_take(snug_backend *be) {
    snug_cpu_ctx *cx = be->ctx;
    double s = cx->sumsq_acc;
    cx->sumsq_acc = 0;
    return s;
}

snug_backend *snug_backend_cpu_create(int nthreads) {
    if (snug_cpu_blas_load())
        return NULL;
    snug_backend *be = calloc(1, sizeof(*be));
    snug_cpu_ctx *cx = calloc(1, sizeof(*cx));
    if (!be || !cx) {
        free(be), free(cx);
        return NULL;
    }
    if (nthreads <= 0)
        nthreads = omp_get_num_procs();
    if (nthreads <= 0)
        nthreads = 1;
    be->name = "cpu";
    be->caps = SNUG_CAP_HOST_THREADS;
    snprintf(cx->gemm, sizeof cx->gemm, "%s", snug_cpu_blas_describe());
    be->gemm = cx->gemm;
    be->ctx = cx;
    be->nthreads = nthreads;
    be->destroy = cpu_destroy;
    be->set_math = snug_cpu_set_math;
    be->check = cpu_check;

    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->to_device = cpu_copy;
    be->copy = cpu_copy;
    be->to_host = cpu_copy;
    be->zero = cpu_zero;

    be->embed_fwd = snug_cpu_embed_fwd;
    be->embed_bwd = snug_cpu_embed_bwd;
    be->rmsnorm_fwd = snug_cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = snug_cpu_rmsnorm_bwd;
    be->layernorm_fwd = snug_cpu_layernorm_fwd;
    be->layernorm_bwd = snug_cpu_layernorm_bwd;
    be->matmul_fwd = snug_cpu_matmul_fwd;
    be->matmul_bwd = snug_cpu_matmul_bwd;
    be->rope_fwd = snug_cpu_rope_fwd;
    be->rope_bwd = snug_cpu_rope_bwd;
    be->attention_fwd = snug_cpu_attention_fwd;
    be->attention_bwd = snug_cpu_attention_bwd;
    be->host_resident = 1;
    be->attention_naive_fwd = snug_cpu_attention_naive_fwd;
    be->attention_decode = snug_cpu_attention_decode;
    be->attention_naive_bwd = snug_cpu_attention_naive_bwd;
    be->swiglu_fwd = snug_cpu_swiglu_fwd;
    be->swiglu_bwd = snug_cpu_swiglu_bwd;
    be->gelu_fwd = snug_cpu_gelu_fwd;
    be->gelu_bwd = snug_cpu_gelu_bwd;
    be->add = snug_cpu_add;
    be->accumulate = snug_cpu_accumulate;
    be->scale = snug_cpu_scale;
    be->gemm_strided = snug_cpu_gemm;
    be->dropout = snug_cpu_dropout;
    be->add_noise = snug_cpu_add_noise;
    be->row_norms = snug_cpu_row_norms;
    be->row_dots = snug_cpu_row_dots;
    be->scale_cols = snug_cpu_scale_cols;
    be->add_scaled_cols = snug_cpu_add_scaled_cols;
    be->col_dots = snug_cpu_col_dots;
    be->dequantize_4bit = snug_cpu_dequantize_4bit;
    be->dequantize_int8 = snug_cpu_dequantize_int8;
    be->xent_fwd_bwd = snug_cpu_xent_fwd_bwd;
    be->xent_block = snug_cpu_xent_block;
    be->sumsq = snug_cpu_sumsq;
    be->sumsq_acc = cpu_sumsq_acc;
    be->sumsq_take = cpu_sumsq_take;
    be->to16 = snug_cpu_to16;
    be->from16 = snug_cpu_from16;
    be->bf16_sr = snug_cpu_bf16_sr;
    be->adamw = snug_cpu_adamw;
    be->quantize_blockwise = snug_cpu_quantize_blockwise;
    be->dequantize_blockwise = snug_cpu_dequantize_blockwise;
    be->adamw8bit = snug_cpu_adamw8bit;
    be->host_alloc = cpu_alloc;
    be->host_free = cpu_free;
    be->copy_in_async = cpu_copy;
    be->copy_out_async = cpu_copy;
    be->copy_wait = cpu_copy_wait;
    be->sync = cpu_sync;

    snug_cpu_blas_threads(be);
    return be;
}
