/* gemm_cpu.c: choosing where the CPU backend's GEMMs run, and running them there (see gemm_cpu.h).
 *
 * The choice is made once per backend, when the engine sets its math (snug_cpu_set_math, the set_math slot), and
 * written into be->gemm for the training header. Every GEMM of the CPU ops then goes through snug_cpu_gemm: to
 * oneDNN when it was chosen, else to OpenBLAS, which also takes any problem oneDNN refuses (no fast kernel for that
 * shape, or the operand copies could not be allocated).
 *
 * Memory outside the arenas while oneDNN is in use (snug_dnnl_bytes): the bf16 operand copies, at most
 * SNUG_DNNL_OPERAND_BYTES (32 MiB; larger products are blocked), and oneDNN's scratchpad, the largest any of the
 * run's primitives asks for; both grow to the run's largest GEMM and are held until the backend is destroyed. The
 * timing of AVX512-BF16 against fp32 allocates its three matrices (at most 1024x2048, 4096x2048 and 1024x4096
 * floats, 56 MiB) before any arena exists and frees them at once. */
#include "backend/cpu/gemm_cpu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/dnnl_cpu.h"
#include "backend/cpu/ops_cpu.h"
#include "core/fileio.h"
#include "core/hash.h"

void snug_cpu_blas_threads(snug_backend *be) { snug_cpu_blas_set_threads(be->nthreads); }

int snug_cpu_gemm_plan(snug_dtype math, const snug_cpu_features *f, const char *force, snug_cpu_gemm_kind *kind,
                       int *forced, char *why, size_t n, snug_error *e) {
    *kind = SNUG_CPU_GEMM_OPENBLAS, *forced = 0;
    why[0] = 0;
    int bf16 = math == SNUG_DT_BF16;
    if (force && *force && strcasecmp(force, "auto")) {
        *forced = 1;
        if (!strcasecmp(force, "openblas")) {
            snprintf(why, n, "SNUG_CPU_GEMM=openblas");
        } else if (!strcasecmp(force, "f32")) {
            *kind = SNUG_CPU_GEMM_DNNL_F32;
            snprintf(why, n, "SNUG_CPU_GEMM=f32");
        } else if (!strcasecmp(force, "bf16")) {
            *kind = bf16 ? SNUG_CPU_GEMM_BF16 : SNUG_CPU_GEMM_OPENBLAS;
            snprintf(why, n, bf16 ? "SNUG_CPU_GEMM=bf16" : "SNUG_CPU_GEMM=bf16 applies to bf16 runs only");
        } else {
            return snug_fail(e, SNUG_EINPUT, "SNUG_CPU_GEMM=%s is not a GEMM choice: use auto, openblas, bf16 or "
                             "f32 (or unset it)", force);
        }
        return 0;
    }
    if (!bf16)
        return 0; /* fp32 and fp16 runs multiply exactly in fp32 */
    char level[96];
    snug_cpu_features_level(f, level, sizeof level);
    if (f->amx_bf16 && snug_cpu_vector_tier(f) == 3) {
        *kind = SNUG_CPU_GEMM_BF16;
        snprintf(why, n, "AMX");
    } else if (f->avx512_bf16 && snug_cpu_vector_tier(f) == 3) {
        *kind = SNUG_CPU_GEMM_MEASURE;
        snprintf(why, n, "AVX512-BF16%s", f->amx_denied ? " (AMX refused to this process by the kernel)" : "");
    } else if (f->amx_denied) {
        snprintf(why, n, "the kernel refused this process the AMX tile state (arch_prctl)");
    } else {
        snprintf(why, n, "this CPU has no bf16 units (%s)", level);
    }
    return 0;
}

int snug_cpu_bf16_measured_faster(double bf16_gflops, double fp32_gflops) { return bf16_gflops > fp32_gflops; }

/* OpenBLAS on operands of any dtype: a 16-bit one (A first) is widened a block of its stored rows at a time into
 * the context's fp32 block for it, and each block's product computed on its own: rows of C (A's rows), columns of C
 * (B's rows, transposed) or, for a block of the K sum, added onto C after the first. -1 when memory is short. */
static int gemm_widened(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                        snug_dtype adt, int lda, const void *B, snug_dtype bdt, int ldb, float beta, float *C,
                        int ldc) {
    if (K <= 0 || (adt == SNUG_DT_F32 && bdt == SNUG_DT_F32)) { /* K = 0 reads neither operand */
        snug_cpu_blas_threads(be);
        snug_cpu_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return 0;
    }
    snug_cpu_ctx *cx = be->ctx;
    int isa = adt != SNUG_DT_F32, ld = isa ? lda : ldb;
    snug_dtype xdt = isa ? adt : bdt;
    const char *X = isa ? A : B;
    /* the operand's stored rows: A is (M,K) or, transposed, (K,M); B is (K,N) or (N,K) */
    int rows = isa ? (ta ? K : M) : (tb ? N : K), cols = isa ? (ta ? M : K) : (tb ? K : N);
    int along_k = isa ? ta : !tb;
    size_t per = SNUG_CPU_WIDE / (size_t)cols;
    per = per < 1 ? 1 : per > (size_t)rows ? (size_t)rows : per;
    size_t need = per * (size_t)cols;
    if (need > cx->wide_n[isa ? 0 : 1]) {
        float *p = malloc(need * sizeof(float));
        if (!p)
            return -1;
        free(cx->wide[isa ? 0 : 1]);
        cx->wide[isa ? 0 : 1] = p, cx->wide_n[isa ? 0 : 1] = need;
    }
    float *w = cx->wide[isa ? 0 : 1];
    size_t xes = snug_dtype_size(xdt), aes = snug_dtype_size(adt), bes = snug_dtype_size(bdt);
    for (int r0 = 0; r0 < rows; r0 += (int)per) {
        int rc = rows - r0 < (int)per ? rows - r0 : (int)per;
#pragma omp parallel for num_threads(be->nthreads) if ((size_t)rc * cols >= SNUG_CPU_PAR_MIN)
        for (int r = 0; r < rc; r++)
            snug_cpu_row_to_f32(w + (size_t)r * cols, X + ((size_t)(r0 + r) * ld) * xes, xdt, (size_t)cols);
        int rc_ = 0;
        if (!along_k && isa) /* rows r0.. of op(A): rows of C */
            rc_ = gemm_widened(be, ta, tb, rc, N, K, alpha, w, SNUG_DT_F32, cols, B, bdt, ldb, beta,
                               C + (size_t)r0 * ldc, ldc);
        else if (!along_k) /* rows r0.. of B stored (N,K): columns of C */
            rc_ = gemm_widened(be, ta, tb, M, rc, K, alpha, A, adt, lda, w, SNUG_DT_F32, cols, beta, C + r0, ldc);
        else if (isa) /* op(A)'s columns k = r0..: B's rows k (its columns when transposed) */
            rc_ = gemm_widened(be, ta, tb, M, N, rc, alpha, w, SNUG_DT_F32, cols,
                               (const char *)B + (tb ? (size_t)r0 : (size_t)r0 * ldb) * bes, bdt, ldb,
                               r0 ? 1.0f : beta, C, ldc);
        else /* op(B)'s rows k = r0..: A's columns k (its rows when transposed) */
            rc_ = gemm_widened(be, ta, tb, M, N, rc, alpha,
                               (const char *)A + (ta ? (size_t)r0 * lda : (size_t)r0) * aes, adt, lda, w,
                               SNUG_DT_F32, cols, r0 ? 1.0f : beta, C, ldc);
        if (rc_)
            return rc_;
    }
    return 0;
}

void snug_cpu_gemm_ex(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                      snug_dtype adt, int lda, const void *B, snug_dtype bdt, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0)
        return;
    snug_cpu_ctx *cx = be->ctx;
    if (cx && cx->dnnl && K > 0) {
        if (cx->err.code) /* after a failure nothing more is computed; the caller stops at its next check */
            return;
        int rc = snug_dnnl_gemm_ex(cx->dnnl, ta, tb, M, N, K, alpha, A, adt, lda, B, bdt, ldb, beta, C, ldc);
        if (rc == 0)
            return;
        if (rc == -2) {
            snug_fail(&cx->err, SNUG_EINTERNAL, "%s; set SNUG_CPU_GEMM=openblas to train without oneDNN",
                      snug_dnnl_error());
            return;
        }
    }
    if (gemm_widened(be, ta, tb, M, N, K, alpha, A, adt, lda, B, bdt, ldb, beta, C, ldc) && !cx->err.code)
        snug_fail(&cx->err, SNUG_ENOMEM, "out of memory for the fp32 copy of a 16-bit GEMM operand (%zu MiB)",
                  SNUG_CPU_WIDE * sizeof(float) >> 20);
}

void snug_cpu_gemm(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    snug_cpu_gemm_ex(be, ta, tb, M, N, K, alpha, A, SNUG_DT_F32, lda, B, SNUG_DT_F32, ldb, beta, C, ldc);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GFLOP/s of C (M,N) = A (M,K) @ B (N,K)^T, the linear layer's forward, best of three after a warm-up: through d, or
 * OpenBLAS when d is NULL. -1 when d refuses it. */
static double rate(snug_backend *be, snug_dnnl *d, int M, int N, int K, const float *A, const float *B, float *C) {
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = now();
        if (d) {
            if (snug_dnnl_gemm(d, 0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N))
                return -1;
        } else {
            snug_cpu_blas_threads(be);
            snug_cpu_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        }
        double t = now() - t0;
        if (r && t < best)
            best = t;
    }
    return 2.0 * M * N * (double)K / best / 1e9;
}

/* Both rates on the run's shape (bf16-exact data, as the weights are); 0, or -1 when memory is short */
static int measure(snug_backend *be, snug_dnnl *d, int M, int N, int K, double *bf16, double *fp32) {
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K), *C = malloc(sizeof(float) * M * N);
    int rc = -1;
    if (A && B && C) {
        uint32_t s = 12345;
        for (size_t i = 0; i < (size_t)M * K + (size_t)N * K; i++) {
            s = s * 1664525u + 1013904223u;
            float v = snug_bf16_to_f32(snug_f32_to_bf16((float)(s >> 8) / 16777216.0f - 0.5f));
            if (i < (size_t)M * K)
                A[i] = v;
            else
                B[i - (size_t)M * K] = v;
        }
        *fp32 = rate(be, NULL, M, N, K, A, B, C);
        *bf16 = rate(be, d, M, N, K, A, B, C);
        rc = 0;
    }
    free(A), free(B), free(C);
    return rc;
}

/* The measured choice is kept, so that every run of the same shape on the same machine, software and thread count
 * makes the same choice and computes the same bits: a resumed run as the run it continues, every rank of a data
 * parallel run on one host as the others, a repeated run as the first. Timing under load flips close calls, and the
 * two paths add in different orders. One file per key under $XDG_CACHE_HOME/snug/gemm (or ~/.cache/snug/gemm):
 * "<bf16 GFLOP/s> <fp32 GFLOP/s>". The first run to publish one wins (link(2) fails on an existing name), and a run
 * that lost reads the winner's, so runs started together agree too. */
static int choice_path(const char *key, char *path, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    path[0] = 0;
    char dir[4096];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/snug/gemm", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/snug/gemm", home);
    else
        return -1;
    snug_error e = {0};
    if (snug_mkdirs(dir, &e))
        return -1;
    snprintf(path, n, "%s/%016llx", dir, (unsigned long long)snug_hash64(key, strlen(key), 0x67656d6dULL));
    return 0;
}

static int choice_read(const char *path, double *gb, double *gf) {
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    int ok = fscanf(fp, "%lf %lf", gb, gf) == 2 && *gb >= 0 && *gf >= 0;
    fclose(fp);
    return ok ? 0 : -1;
}

/* Publishes the rates at path unless a file is there already. */
static int choice_publish(const char *path, double gb, double gf) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    char text[64];
    int len = snprintf(text, sizeof text, "%.1f %.1f\n", gb, gf);
    snug_error e = {0};
    if (snug_write_file_atomic(tmp, text, (size_t)len, &e))
        return -1;
    int rc = link(tmp, path) == 0 || errno == EEXIST ? 0 : -1;
    unlink(tmp);
    return rc;
}

int snug_cpu_set_math(snug_backend *be, snug_dtype math, int M, int N, int K, snug_error *e) {
    snug_cpu_ctx *cx = be->ctx;
    const snug_cpu_features *f = snug_cpu_features_get();
    const char *force = getenv("SNUG_CPU_GEMM");
    snug_cpu_gemm_kind kind;
    int forced;
    char why[256];
    SNUG_TRY(snug_cpu_gemm_plan(math, f, force, &kind, &forced, why, sizeof why, e));
    be->math = math;
    snug_dnnl_destroy(cx->dnnl);
    cx->dnnl = NULL;
    be->matmul_w16_fwd = NULL, be->matmul_w16_bwd = NULL;
    const char *blas = snug_cpu_blas_describe(), *under = math == SNUG_DT_BF16 ? " under bf16" : "";
    if (kind == SNUG_CPU_GEMM_OPENBLAS) {
        if (why[0])
            snprintf(cx->gemm, sizeof cx->gemm, "%s; fp32 GEMMs%s: %s", blas, under, why);
        else
            snprintf(cx->gemm, sizeof cx->gemm, "%s", blas);
        return 0;
    }
    /* the run's typical GEMM, capped so that timing it takes well under a second */
    M = M > 0 ? (M < 1024 ? M : 1024) : 512;
    N = N > 0 ? (N < 4096 ? N : 4096) : 2048;
    K = K > 0 ? (K < 2048 ? K : 2048) : 512;
    snug_dtype dt = kind == SNUG_CPU_GEMM_DNNL_F32 ? SNUG_DT_F32 : SNUG_DT_BF16;
    const char *dtn = dt == SNUG_DT_BF16 ? "bf16" : "f32";
    snug_dnnl *d = snug_dnnl_create(dt, be->nthreads);
    const char *impl = d ? snug_dnnl_impl(d, 0, 1, M, N, K) : NULL;
    if (!impl) {
        char reason[600];
        snprintf(reason, sizeof reason, "%s", snug_dnnl_error());
        snug_dnnl_destroy(d);
        if (forced)
            return snug_fail(e, SNUG_EINPUT, "SNUG_CPU_GEMM=%s: %s; unset it to let snug choose", force, reason);
        snprintf(cx->gemm, sizeof cx->gemm, "%s; fp32 GEMMs%s: %s", blas, under, reason);
        return 0;
    }
    char note[320] = "";
    if (kind == SNUG_CPU_GEMM_MEASURE) {
        double gb = -1, gf = -1;
        char key[768], path[4200], level[96];
        const char *held = "";
        snprintf(key, sizeof key, "%s %d %d %s | %s | %s %s | %d threads | %dx%dx%d", f->vendor, f->family,
                 f->model, snug_cpu_features_level(f, level, sizeof level), blas, snug_dnnl_version(), impl,
                 be->nthreads, M, N, K);
        if (choice_path(key, path, sizeof path) == 0 && choice_read(path, &gb, &gf) == 0) {
            held = "read from";
        } else if (measure(be, d, M, N, K, &gb, &gf)) {
            gb = -1;
        } else if (path[0] && choice_publish(path, gb, gf) == 0 && choice_read(path, &gb, &gf) == 0) {
            held = "kept in"; /* this run's rates, or those of a run that published first */
        }
        char where[4300] = "";
        if (held[0])
            snprintf(where, sizeof where, "; %s %s", held, path);
        if (gb < 0 || !snug_cpu_bf16_measured_faster(gb, gf)) {
            snprintf(cx->gemm, sizeof cx->gemm, "%s; fp32 GEMMs%s: the bf16 units measured slower (%s %s: %.0f "
                     "against %.0f GFLOP/s fp32 on %dx%dx%d%s)", blas, under, snug_dnnl_version(), impl, gb, gf, M,
                     N, K, where);
            snug_dnnl_destroy(d);
            return 0;
        }
        snprintf(note, sizeof note, "; measured faster: %.0f against %.0f GFLOP/s fp32 on %dx%dx%d%s", gb, gf, M, N,
                 K, where);
    }
    cx->dnnl = d;
    be->matmul_w16_fwd = snug_cpu_matmul_w16_fwd, be->matmul_w16_bwd = snug_cpu_matmul_w16_bwd;
    /* "oneDNN 2.6.3 bf16 on AMX, fp32 accumulation (brg:avx512_core_amx; ...); else OpenBLAS ..." */
    snprintf(cx->gemm, sizeof cx->gemm, "%s %s %s%s%s, fp32 accumulation (%s%s; operand copies within %zu MiB); "
             "else %s", snug_dnnl_version(), dtn, forced ? "(" : "on ", why, forced ? ")" : "", impl, note,
             SNUG_DNNL_OPERAND_BYTES >> 20, blas);
    return 0;
}
