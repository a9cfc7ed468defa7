/* test_cuda_ops.c: every op of the CUDA backend against the CPU backend, the reference.
 *
 * For each slot of backend/backend.h: the same seeded random inputs, of awkward sizes (nothing a multiple of a tile
 * or a block), go through each backend's own alloc / to_device / op / to_host, and the results are compared: by the
 * largest error relative to the largest magnitude of the CPU's result (fp32 ops 1e-5, GEMM-heavy ops 1e-4), or bit
 * for bit where the op is exact (copies, conversions, stochastic rounding, elementwise arithmetic). Gradient outputs
 * start from random values on both sides, so accumulation (+=) is checked too. The three rungs of the CUDA attention
 * run (tiled; plain through SNUG_CUDA_ATTN=plain; the bf16 tensor-core rung through be->math = BF16, where HD allows
 * it, against the same fp32 CPU result with bf16 tolerances), and their times are printed. The GEMM helper and the
 * loss at GPT-2's vocabulary are checked element by element against double references within bounds derived from
 * the arithmetic (K, fp32's and the 16-bit types' unit roundoffs): bf16 and fp16 GEMMs at odd and misaligned shapes,
 * the plan cache's second lookup, the bias epilogue, and the fp32 and tensor-core paths of the chunked loss (with
 * the CPU backend against the same reference). A bf16 GEMM's rate at 4096^3 is printed beside the device's peak.
 *
 * `test_cuda_ops gemm` runs the GEMM and loss checks alone, `test_cuda_ops attention` the attention rungs alone
 * (sliding windows included). Without a CUDA build or a visible GPU the test prints why and exits 77, which ctest
 * reports as skipped. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "check.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "core/quant_map.h"
#include "model/model.h"
#include "optim/optim.h"
#include "plan/gpus.h"

#ifdef SNUG_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"

static snug_backend *cpu, *gpu;

/* ------------------------------------------------------------------------------------------------ helpers */

#define TOL 1e-5      /* fp32 ops: largest |gpu - cpu| over the largest |cpu| */
#define TOL_GEMM 1e-4 /* ops built on GEMMs (cuBLASLt, CUBLAS_COMPUTE_32F) */
#define TOL_BF16 2e-2 /* the tensor-core attention: inputs, probabilities and dS rounded to bf16 (8-bit mantissa) */
#define TOL_BF16_LSE 1e-2 /* its lse, absolute (lse is a log: its error is relative to the softmax sum) */

static uint64_t rng_state = 0x6A09E667F3BCC908ull;

static double urand(void) { return (double)(snug_splitmix64(&rng_state) >> 11) * 0x1.0p-53; } /* [0,1) */
static int irand(int n) { return (int)(snug_splitmix64(&rng_state) % (uint64_t)n); }

/* n floats uniform in [lo, hi) */
static float *randf(size_t n, float lo, float hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}

static void *copyof(const void *x, size_t bytes) {
    void *y = malloc(bytes ? bytes : 1);
    memcpy(y, x, bytes);
    return y;
}

/* A device buffer of `bytes` on be holding a copy of the host bytes h (zeros when h is NULL). */
static void *up(snug_backend *be, const void *h, size_t bytes) {
    void *d = be->alloc(be, bytes ? bytes : 1);
    if (!d) {
        fprintf(stderr, "test_cuda_ops: %s alloc of %zu bytes failed\n", be->name, bytes);
        exit(1);
    }
    if (h && bytes)
        be->to_device(be, d, h, bytes);
    return d;
}

/* Copies the device buffer d back into h (when h is not NULL) and frees it. */
static void down(snug_backend *be, void *h, void *d, size_t bytes) {
    if (h && bytes)
        be->to_host(be, h, d, bytes);
    be->free(be, d);
}

static void expect(const char *what, double err, double tol) {
    printf("  %-52s max rel err %9.2e  (tol %.0e)\n", what, err, tol);
    CHECKF(err <= tol, "%s: error %.3e above %.1e", what, err, tol);
}

static void expect_same(const char *what, const void *a, const void *b, size_t bytes) {
    int same = bytes == 0 || memcmp(a, b, bytes) == 0;
    printf("  %-52s %s\n", what, same ? "bitwise equal" : "DIFFERENT");
    CHECKF(same, "%s: not bitwise equal", what);
}

static double rel(const float *a, const float *ref, size_t n) { return check_max_rel_f(a, ref, n); }

static double max_abs(const float *a, const float *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        m = d > m || isnan(d) ? d : m; /* a NaN sticks */
    }
    return m;
}

static void expect_abs(const char *what, double err, double tol) {
    printf("  %-52s max abs err %9.2e  (tol %.0e)\n", what, err, tol);
    CHECKF(err <= tol, "%s: error %.3e above %.1e", what, err, tol);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------------------ memory */

static void test_memory(void) {
    printf("memory\n");
    size_t n = 1003;
    float *src = randf(n, -1, 1), *back = malloc(n * sizeof(float)), *zeros = calloc(n, sizeof(float));
    float *d = gpu->alloc(gpu, n * sizeof(float));
    CHECK(d != NULL);
    gpu->to_host(gpu, back, d, n * sizeof(float));
    expect_same("alloc is zero-filled", back, zeros, n * sizeof(float));
    gpu->to_device(gpu, d, src, n * sizeof(float));
    gpu->to_host(gpu, back, d, n * sizeof(float));
    expect_same("to_device / to_host round trip", back, src, n * sizeof(float));
    gpu->zero(gpu, d, n * sizeof(float));
    gpu->to_host(gpu, back, d, n * sizeof(float));
    expect_same("zero", back, zeros, n * sizeof(float));

    /* paged state: pinned host memory, side-stream copies, sync */
    float *h1 = gpu->host_alloc(gpu, n * sizeof(float)), *h2 = gpu->host_alloc(gpu, n * sizeof(float));
    CHECK(h1 != NULL && h2 != NULL);
    memcpy(h1, src, n * sizeof(float));
    gpu->copy_in_async(gpu, d, h1, n * sizeof(float));
    gpu->sync(gpu);
    gpu->scale(gpu, d, 2.0f, n);
    gpu->copy_out_async(gpu, h2, d, n * sizeof(float));
    gpu->sync(gpu);
    for (size_t i = 0; i < n; i++)
        back[i] = 2.0f * src[i];
    expect_same("copy_in_async, scale, copy_out_async, sync", h2, back, n * sizeof(float));
    gpu->host_free(gpu, h1);
    gpu->host_free(gpu, h2);
    gpu->free(gpu, d);
    free(src), free(back), free(zeros);
}

/* ------------------------------------------------------------------------------------------------ embeddings */

/* table (rows, C) as dt: bf16/f16 conversions of t32 */
static void *table_as(const float *t32, size_t n, snug_dtype dt) {
    if (dt == SNUG_DT_F32)
        return copyof(t32, n * sizeof(float));
    uint16_t *t = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        t[i] = dt == SNUG_DT_BF16 ? snug_f32_to_bf16(t32[i]) : snug_f32_to_f16(t32[i]);
    return t;
}

static void run_embed(snug_backend *be, float *out, float *dtable, const int32_t *ids, const void *table,
                      snug_dtype tdt, const float *dout, int N, int C, int rows) {
    size_t tb = (size_t)rows * C * snug_dtype_size(tdt), ob = (size_t)N * C * sizeof(float);
    int32_t *d_ids = up(be, ids, N * sizeof(int32_t));
    void *d_t = up(be, table, tb);
    float *d_out = up(be, out, ob), *d_dout = up(be, dout, ob);
    float *d_dt = up(be, dtable, (size_t)rows * C * sizeof(float));
    be->embed_fwd(be, d_out, d_ids, d_t, tdt, N, C, 0);
    be->embed_fwd(be, d_out, d_ids, d_t, tdt, N, C, 1); /* out = 2 * table[ids] */
    be->embed_bwd(be, d_dt, d_dout, d_ids, N, C);
    down(be, out, d_out, ob);
    down(be, dtable, d_dt, (size_t)rows * C * sizeof(float));
    down(be, NULL, d_ids, 0), down(be, NULL, d_t, 0), down(be, NULL, d_dout, 0);
}

static void test_embed(void) {
    printf("embeddings (N=77, C=96, 50 rows)\n");
    int N = 77, C = 96, rows = 50;
    int32_t ids[77];
    for (int n = 0; n < N; n++) /* repeats: the scatter must add them; -1: a zero row that adds nothing */
        ids[n] = n % 9 == 4 ? -1 : irand(rows / 2) * 2;
    float *t32 = randf((size_t)rows * C, -2, 2), *dout = randf((size_t)N * C, -1, 1);
    float *dt0 = randf((size_t)rows * C, -1, 1);
    snug_dtype dts[3] = {SNUG_DT_F32, SNUG_DT_BF16, SNUG_DT_F16};
    for (int k = 0; k < 3; k++) {
        void *table = table_as(t32, (size_t)rows * C, dts[k]);
        float *oc = calloc((size_t)N * C, 4), *og = calloc((size_t)N * C, 4);
        float *dc = copyof(dt0, (size_t)rows * C * 4), *dg = copyof(dt0, (size_t)rows * C * 4);
        run_embed(cpu, oc, dc, ids, table, dts[k], dout, N, C, rows);
        run_embed(gpu, og, dg, ids, table, dts[k], dout, N, C, rows);
        char w[96];
        snprintf(w, sizeof w, "embed_fwd, accumulate (%s table)", snug_dtype_name(dts[k]));
        expect_same(w, og, oc, (size_t)N * C * 4);
        snprintf(w, sizeof w, "embed_bwd += (%s table)", snug_dtype_name(dts[k]));
        expect(w, rel(dg, dc, (size_t)rows * C), TOL);
        free(table), free(oc), free(og), free(dc), free(dg);
    }
    free(t32), free(dout), free(dt0);
}

/* ------------------------------------------------------------------------------------------------ normalisation */

/* layer: 1 layernorm, 0 rmsnorm. res: out, mean, rstd, dinp, dw, db (dinp/dw/db start from the given values) */
static void run_norm(snug_backend *be, int layer, float *out, float *mean, float *rstd, float *dinp, float *dw,
                     float *db, const float *inp, const float *w, const float *b, const float *dout, int N, int C) {
    size_t nb = (size_t)N * C * 4, cb = (size_t)C * 4, rb = (size_t)N * 4;
    float *d_inp = up(be, inp, nb), *d_w = up(be, w, cb), *d_b = up(be, b, cb), *d_dout = up(be, dout, nb);
    float *d_out = up(be, NULL, nb), *d_mean = up(be, NULL, rb), *d_rstd = up(be, NULL, rb);
    float *d_dinp = up(be, dinp, nb), *d_dw = up(be, dw, cb), *d_db = up(be, db, cb);
    if (layer) {
        be->layernorm_fwd(be, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, 1e-5f);
        be->layernorm_bwd(be, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    } else {
        be->rmsnorm_fwd(be, d_out, d_rstd, d_inp, d_w, N, C, 1e-6f);
        be->rmsnorm_bwd(be, d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C);
    }
    down(be, out, d_out, nb), down(be, mean, d_mean, rb), down(be, rstd, d_rstd, rb);
    down(be, dinp, d_dinp, nb), down(be, dw, d_dw, cb), down(be, db, d_db, cb);
    down(be, NULL, d_inp, 0), down(be, NULL, d_w, 0), down(be, NULL, d_b, 0), down(be, NULL, d_dout, 0);
}

static void test_norm(int layer) {
    int N = 77, C = 96;
    const char *nm = layer ? "layernorm" : "rmsnorm";
    printf("%s (N=%d, C=%d)\n", nm, N, C);
    size_t nc = (size_t)N * C;
    float *inp = randf(nc, -2, 3), *w = randf(C, 0.5f, 1.5f), *b = randf(C, -0.5f, 0.5f);
    float *dout = randf(nc, -1, 1), *dinp0 = randf(nc, -1, 1), *dw0 = randf(C, -1, 1), *db0 = randf(C, -1, 1);
    float *r[2][6];
    snug_backend *bes[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        r[k][0] = calloc(nc, 4), r[k][1] = calloc(N, 4), r[k][2] = calloc(N, 4);
        r[k][3] = copyof(dinp0, nc * 4), r[k][4] = copyof(dw0, C * 4), r[k][5] = copyof(db0, C * 4);
        run_norm(bes[k], layer, r[k][0], r[k][1], r[k][2], r[k][3], r[k][4], r[k][5], inp, w, b, dout, N, C);
    }
    const char *names[6] = {"out", "mean", "rstd", "dinp +=", "dw +=", "db +="};
    size_t sizes[6] = {nc, N, N, nc, C, C};
    for (int i = 0; i < 6; i++) {
        if (!layer && (i == 1 || i == 5))
            continue;
        char what[96];
        snprintf(what, sizeof what, "%s %s", nm, names[i]);
        expect(what, rel(r[1][i], r[0][i], sizes[i]), TOL);
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++)
            free(r[k][i]);
    free(inp), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0);
}

/* ------------------------------------------------------------------------------------------------ matmul */

static void run_matmul(snug_backend *be, float *out, float *dinp, float *dw, float *dbias, const float *inp,
                       const float *w, const float *bias, const float *dout, int N, int C, int OC) {
    size_t ib = (size_t)N * C * 4, wb = (size_t)OC * C * 4, ob = (size_t)N * OC * 4;
    float *d_inp = up(be, inp, ib), *d_w = up(be, w, wb), *d_bias = bias ? up(be, bias, OC * 4) : NULL;
    float *d_out = up(be, NULL, ob), *d_dout = up(be, dout, ob);
    float *d_dinp = up(be, dinp, ib), *d_dw = up(be, dw, wb), *d_db = dbias ? up(be, dbias, OC * 4) : NULL;
    be->matmul_fwd(be, d_out, d_inp, d_w, d_bias, N, C, OC);
    be->matmul_bwd(be, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    down(be, out, d_out, ob), down(be, dinp, d_dinp, ib), down(be, dw, d_dw, wb);
    if (d_db)
        down(be, dbias, d_db, OC * 4);
    if (d_bias)
        down(be, NULL, d_bias, 0);
    down(be, NULL, d_inp, 0), down(be, NULL, d_w, 0), down(be, NULL, d_dout, 0);
}

static void test_matmul(void) {
    int N = 77, C = 96, OC = 130;
    printf("matmul (N=%d, C=%d, OC=%d)\n", N, C, OC);
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = randf(ni, -1, 1), *w = randf(nw, -1, 1), *bias = randf(OC, -1, 1), *dout = randf(no, -1, 1);
    float *dinp0 = randf(ni, -1, 1), *dw0 = randf(nw, -1, 1), *db0 = randf(OC, -1, 1);
    for (int with_bias = 1; with_bias >= 0; with_bias--) {
        float *r[2][4];
        snug_backend *bes[2] = {cpu, gpu};
        for (int k = 0; k < 2; k++) {
            r[k][0] = calloc(no, 4), r[k][1] = copyof(dinp0, ni * 4), r[k][2] = copyof(dw0, nw * 4);
            r[k][3] = copyof(db0, OC * 4);
            run_matmul(bes[k], r[k][0], r[k][1], r[k][2], with_bias ? r[k][3] : NULL, inp, w, with_bias ? bias : NULL,
                       dout, N, C, OC);
        }
        const char *names[4] = {"out", "dinp +=", "dw +=", "dbias +="};
        size_t sizes[4] = {no, ni, nw, OC};
        for (int i = 0; i < (with_bias ? 4 : 3); i++) {
            char what[96];
            snprintf(what, sizeof what, "matmul %s (%s)", names[i], with_bias ? "bias" : "no bias");
            expect(what, rel(r[1][i], r[0][i], sizes[i]), TOL_GEMM);
        }
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 4; i++)
                free(r[k][i]);
    }
    free(inp), free(w), free(bias), free(dout), free(dinp0), free(dw0), free(db0);
}

/* ------------------------------------------------------------------------------------------------ rope */

static void test_rope(void) {
    int N = 77, H = 5, HD = 24, stride = H * HD + 40, maxpos = 100;
    printf("rope (N=%d, H=%d, HD=%d, row stride %d)\n", N, H, HD, stride);
    size_t nx = (size_t)N * stride, nt = (size_t)maxpos * HD / 2;
    float *x = randf(nx, -2, 2), *cs = malloc(nt * 4), *sn = malloc(nt * 4);
    for (int p = 0; p < maxpos; p++)
        for (int i = 0; i < HD / 2; i++) {
            double a = p * pow(10000.0, -2.0 * i / HD);
            cs[(size_t)p * HD / 2 + i] = (float)cos(a);
            sn[(size_t)p * HD / 2 + i] = (float)sin(a);
        }
    int32_t pos[77];
    for (int n = 0; n < N; n++)
        pos[n] = irand(maxpos);
    float *res[2][2];
    snug_backend *bes[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        snug_backend *be = bes[k];
        float *d_x = up(be, x, nx * 4), *d_c = up(be, cs, nt * 4), *d_s = up(be, sn, nt * 4);
        int32_t *d_p = up(be, pos, N * 4);
        res[k][0] = malloc(nx * 4), res[k][1] = malloc(nx * 4);
        be->rope_fwd(be, d_x, d_p, d_c, d_s, N, H, HD, stride);
        be->to_host(be, res[k][0], d_x, nx * 4);
        be->rope_bwd(be, d_x, d_p, d_c, d_s, N, H, HD, stride); /* back to x, up to rounding */
        down(be, res[k][1], d_x, nx * 4);
        down(be, NULL, d_c, 0), down(be, NULL, d_s, 0), down(be, NULL, d_p, 0);
    }
    expect("rope_fwd (columns past the heads untouched)", rel(res[1][0], res[0][0], nx), TOL);
    expect("rope_bwd", rel(res[1][1], res[0][1], nx), TOL);
    for (int k = 0; k < 2; k++)
        free(res[k][0]), free(res[k][1]);
    free(x), free(cs), free(sn);
}

/* ------------------------------------------------------------------------------------------------ attention */

/* seg_start of B rows of T tokens cut into segments of uneven lengths 1, 9, 4, 23, ... */
static int32_t *make_seg(int B, int T) {
    int32_t *seg = malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B; b++) {
        int start = 0, len = 1 + 2 * b;
        for (int t = 0; t < T; t++) {
            if (t - start >= len) {
                start = t;
                len = (len * 7 + 3) % 41 + 1;
            }
            seg[(size_t)b * T + t] = start;
        }
    }
    return seg;
}

typedef struct {
    int B, T, NH, NKV, HD;
    const float *qkv, *dout, *dqkv0;
    const int32_t *seg;
} att_case;

/* out, lse, dqkv (+= onto dqkv0) of the flash path on be; with `twice`, dqkv2 gets a second, independent backward */
static void run_attention(snug_backend *be, const att_case *c, float *out, float *lse, float *dqkv, float *dqkv2) {
    size_t N = (size_t)c->B * c->T, R = (size_t)(c->NH + 2 * c->NKV) * c->HD, no = N * c->NH * c->HD;
    float scale = 1.0f / sqrtf((float)c->HD);
    float *d_qkv = up(be, c->qkv, N * R * 4), *d_dout = up(be, c->dout, no * 4);
    float *d_out = up(be, NULL, no * 4), *d_lse = up(be, NULL, N * c->NH * 4), *d_dq = up(be, c->dqkv0, N * R * 4);
    int32_t *d_seg = c->seg ? up(be, c->seg, N * 4) : NULL;
    be->attention_fwd(be, d_out, d_lse, d_qkv, d_seg, c->B, c->T, c->NH, c->NKV, c->HD, scale);
    be->attention_bwd(be, d_dq, d_dout, d_qkv, d_out, d_lse, d_seg, c->B, c->T, c->NH, c->NKV, c->HD, scale);
    if (dqkv2) {
        float *d_dq2 = up(be, c->dqkv0, N * R * 4);
        be->attention_bwd(be, d_dq2, d_dout, d_qkv, d_out, d_lse, d_seg, c->B, c->T, c->NH, c->NKV, c->HD, scale);
        down(be, dqkv2, d_dq2, N * R * 4);
    }
    down(be, out, d_out, no * 4), down(be, lse, d_lse, N * c->NH * 4), down(be, dqkv, d_dq, N * R * 4);
    down(be, NULL, d_qkv, 0), down(be, NULL, d_dout, 0);
    if (d_seg)
        down(be, NULL, d_seg, 0);
}

/* the naive path: out, probs (B, NH, T, T), dqkv += */
static void run_attention_naive(snug_backend *be, const att_case *c, float *out, float *probs, float *dqkv) {
    size_t N = (size_t)c->B * c->T, R = (size_t)(c->NH + 2 * c->NKV) * c->HD, no = N * c->NH * c->HD;
    size_t np = (size_t)c->B * c->NH * c->T * c->T;
    float scale = 1.0f / sqrtf((float)c->HD);
    float *d_qkv = up(be, c->qkv, N * R * 4), *d_dout = up(be, c->dout, no * 4);
    float *d_out = up(be, NULL, no * 4), *d_p = up(be, NULL, np * 4), *d_dq = up(be, c->dqkv0, N * R * 4);
    int32_t *d_seg = c->seg ? up(be, c->seg, N * 4) : NULL;
    be->attention_naive_fwd(be, d_out, d_p, d_qkv, d_seg, c->B, c->T, c->NH, c->NKV, c->HD, scale);
    be->attention_naive_bwd(be, d_dq, d_dout, d_qkv, d_p, c->B, c->T, c->NH, c->NKV, c->HD, scale);
    down(be, out, d_out, no * 4), down(be, probs, d_p, np * 4), down(be, dqkv, d_dq, N * R * 4);
    down(be, NULL, d_qkv, 0), down(be, NULL, d_dout, 0);
    if (d_seg)
        down(be, NULL, d_seg, 0);
}

/* W > 0: a sliding window of W keys, as the first keys the model computes (snug_attention_window_starts) */
static void test_attention_case(int B, int T, int NH, int NKV, int HD, int segmented, int W) {
    size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HD, nq = N * R, no = N * NH * HD, nl = N * NH;
    printf("attention B=%d T=%d NH=%d NKV=%d HD=%d %s, window %d\n", B, T, NH, NKV, HD,
           segmented ? "packed segments" : "causal", W);
    float *qkv = randf(nq, -1.5f, 1.5f), *dout = randf(no, -1, 1), *dq0 = randf(nq, -0.5f, 0.5f);
    int32_t *seg = segmented ? make_seg(B, T) : NULL;
    if (W > 0) {
        int32_t *win = malloc(N * sizeof *win);
        snug_attention_window_starts(win, seg, 0, N, T, W);
        free(seg);
        seg = win;
    }
    att_case c = {B, T, NH, NKV, HD, qkv, dout, dq0, seg};
    float *oc = malloc(no * 4), *lc = malloc(nl * 4), *dc = malloc(nq * 4);
    run_attention(cpu, &c, oc, lc, dc, NULL);
    const char *rungs[2] = {"tiled", "plain"};
    for (int r = 0; r < 2; r++) {
        if (r)
            setenv("SNUG_CUDA_ATTN", "plain", 1);
        else
            unsetenv("SNUG_CUDA_ATTN");
        float *og = malloc(no * 4), *lg = malloc(nl * 4), *dg = malloc(nq * 4), *dg2 = malloc(nq * 4);
        run_attention(gpu, &c, og, lg, dg, dg2);
        char w[96];
        snprintf(w, sizeof w, "attention_fwd out (%s)", rungs[r]);
        expect(w, rel(og, oc, no), TOL);
        snprintf(w, sizeof w, "attention_fwd lse (%s)", rungs[r]);
        expect(w, rel(lg, lc, nl), TOL);
        snprintf(w, sizeof w, "attention_bwd dqkv += (%s)", rungs[r]);
        expect(w, rel(dg, dc, nq), TOL);
        snprintf(w, sizeof w, "attention_bwd deterministic (%s)", rungs[r]);
        expect_same(w, dg, dg2, nq * 4);
        free(og), free(lg), free(dg), free(dg2);
    }
    unsetenv("SNUG_CUDA_ATTN");
    if (HD % 16 == 0 && HD <= 128) { /* the tensor-core rung: chosen by mixed-precision math */
        float *og = malloc(no * 4), *lg = malloc(nl * 4), *dg = malloc(nq * 4), *dg2 = malloc(nq * 4);
        gpu->math = SNUG_DT_BF16;
        run_attention(gpu, &c, og, lg, dg, dg2);
        double eo = rel(og, oc, no), ed = rel(dg, dc, nq);
        expect("attention_fwd out (tc, bf16)", eo, TOL_BF16);
        expect_abs("attention_fwd lse (tc, bf16)", max_abs(lg, lc, nl), TOL_BF16_LSE);
        expect("attention_bwd dqkv += (tc, bf16)", ed, TOL_BF16);
        expect_same("attention_bwd deterministic (tc)", dg, dg2, nq * 4);
        CHECKF(eo > 1e-6 && ed > 1e-6, "tc: errors %.1e, %.1e look like fp32: did the bf16 rung run?", eo, ed);
        setenv("SNUG_CUDA_ATTN", "tiled", 1); /* forced back to fp32 under the same math */
        run_attention(gpu, &c, og, lg, dg, NULL);
        expect("attention out (SNUG_CUDA_ATTN=tiled, bf16 math)", rel(og, oc, no), TOL);
        expect("attention dqkv += (SNUG_CUDA_ATTN=tiled, bf16 math)", rel(dg, dc, nq), TOL);
        unsetenv("SNUG_CUDA_ATTN");
        gpu->math = SNUG_DT_F32;
        free(og), free(lg), free(dg), free(dg2);
    }

    size_t np = (size_t)B * NH * T * T;
    float *pc = malloc(np * 4), *pg = malloc(np * 4), *og = malloc(no * 4), *dg = malloc(nq * 4);
    run_attention_naive(cpu, &c, oc, pc, dc);
    run_attention_naive(gpu, &c, og, pg, dg);
    expect("attention_naive_fwd out", rel(og, oc, no), TOL);
    expect("attention_naive_fwd probs", rel(pg, pc, np), TOL);
    expect("attention_naive_bwd dqkv +=", rel(dg, dc, nq), TOL);
    free(pc), free(pg), free(og), free(dg);

    /* decode: token p of batch row 0 against rows 0..p of the same buffer */
    int ps[3] = {0, T / 3, T - 1};
    for (int k = 0; k < 3; k++) {
        float *res[2];
        snug_backend *bes[2] = {cpu, gpu};
        for (int j = 0; j < 2; j++) {
            float *d_qkv = up(bes[j], qkv, (size_t)T * R * 4), *d_out = up(bes[j], NULL, (size_t)NH * HD * 4);
            bes[j]->attention_decode(bes[j], d_out, d_qkv, ps[k], NH, NKV, HD, 1.0f / sqrtf((float)HD));
            res[j] = malloc((size_t)NH * HD * 4);
            down(bes[j], res[j], d_out, (size_t)NH * HD * 4);
            down(bes[j], NULL, d_qkv, 0);
        }
        char w[96];
        snprintf(w, sizeof w, "attention_decode p=%d", ps[k]);
        expect(w, rel(res[1], res[0], (size_t)NH * HD), TOL);
        free(res[0]), free(res[1]);
    }
    free(qkv), free(dout), free(dq0), free(seg), free(oc), free(lc), free(dc);
}

static void test_attention(void) {
    test_attention_case(2, 77, 4, 2, 24, 0, 0);   /* GQA 2:1, T not a multiple of 64, HD 24 */
    test_attention_case(2, 130, 6, 2, 64, 1, 0);  /* GQA 3:1, packed segments */
    test_attention_case(1, 200, 4, 1, 128, 1, 0); /* all heads on one kv head, HD 128 */
    test_attention_case(3, 65, 2, 2, 40, 1, 0);   /* MHA, one row past a tile, HD 40 */
    test_attention_case(2, 93, 4, 2, 96, 0, 0);   /* causal, HD 96 (the tc rung pads it to 128) */
    test_attention_case(2, 150, 4, 2, 32, 1, 40); /* a sliding window inside packed segments: whole tiles skipped */
    test_attention_case(1, 200, 2, 1, 64, 0, 70); /* a sliding window across three 64-key tiles */
}

/* The rungs on a training-sized shape: milliseconds of forward and of forward + backward. tc runs under bf16 math. */
static void time_attention(void) {
    int B = 1, T = 2048, NH = 16, NKV = 4, HD = 64;
    size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HD, no = N * NH * HD;
    float scale = 1.0f / sqrtf((float)HD);
    float *qkv = randf(N * R, -1, 1), *dout = randf(no, -1, 1);
    float *d_qkv = up(gpu, qkv, N * R * 4), *d_dout = up(gpu, dout, no * 4), *d_out = up(gpu, NULL, no * 4);
    float *d_lse = up(gpu, NULL, N * NH * 4), *d_dq = up(gpu, NULL, N * R * 4);
    double flops = 4.0 * B * NH * (double)T * T * HD / 2; /* causal forward */
    printf("attention timing B=%d T=%d NH=%d NKV=%d HD=%d (best of 3)\n", B, T, NH, NKV, HD);
    const char *rungs[3] = {"plain", "tiled", "tc"};
    for (int r = 0; r < 3; r++) {
        if (r == 0)
            setenv("SNUG_CUDA_ATTN", "plain", 1);
        else
            unsetenv("SNUG_CUDA_ATTN");
        gpu->math = r == 2 ? SNUG_DT_BF16 : SNUG_DT_F32;
        double best_f = 1e30, best_fb = 1e30;
        for (int rep = 0; rep < 4; rep++) { /* the first is a warm-up */
            gpu->sync(gpu);
            double t0 = now();
            gpu->attention_fwd(gpu, d_out, d_lse, d_qkv, NULL, B, T, NH, NKV, HD, scale);
            gpu->sync(gpu);
            double t1 = now();
            gpu->attention_bwd(gpu, d_dq, d_dout, d_qkv, d_out, d_lse, NULL, B, T, NH, NKV, HD, scale);
            gpu->sync(gpu);
            double t2 = now();
            if (rep) {
                best_f = t1 - t0 < best_f ? t1 - t0 : best_f;
                best_fb = t2 - t0 < best_fb ? t2 - t0 : best_fb;
            }
        }
        printf("  %-6s forward %8.3f ms (%6.2f TFLOP/s)   forward+backward %8.3f ms (%6.2f TFLOP/s)\n", rungs[r],
               best_f * 1e3, flops / best_f * 1e-12, best_fb * 1e3, 3.5 * flops / best_fb * 1e-12);
    }
    unsetenv("SNUG_CUDA_ATTN");
    gpu->math = SNUG_DT_F32;
    gpu->free(gpu, d_qkv), gpu->free(gpu, d_dout), gpu->free(gpu, d_out), gpu->free(gpu, d_lse);
    gpu->free(gpu, d_dq);
    free(qkv), free(dout);
}

/* ------------------------------------------------------------------------------------------------ activations */

static void test_activations(void) {
    int N = 77, I = 100;
    printf("activations (swiglu N=%d I=%d, gelu n=%d)\n", N, I, N * I);
    size_t ngu = (size_t)N * 2 * I, ni = (size_t)N * I;
    float *gu = randf(ngu, -4, 4), *dout = randf(ni, -1, 1), *dgu0 = randf(ngu, -1, 1), *x = randf(ni, -5, 5);
    float *res[2][4];
    snug_backend *bes[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        snug_backend *be = bes[k];
        float *d_gu = up(be, gu, ngu * 4), *d_dout = up(be, dout, ni * 4), *d_out = up(be, NULL, ni * 4);
        float *d_dgu = up(be, dgu0, ngu * 4), *d_x = up(be, x, ni * 4), *d_dx = up(be, dgu0, ni * 4);
        be->swiglu_fwd(be, d_out, d_gu, N, I);
        res[k][0] = malloc(ni * 4);
        be->to_host(be, res[k][0], d_out, ni * 4);
        be->swiglu_bwd(be, d_dgu, d_dout, d_gu, N, I);
        be->gelu_fwd(be, d_out, d_x, ni);
        be->gelu_bwd(be, d_dx, d_dout, d_x, ni);
        res[k][1] = malloc(ngu * 4), res[k][2] = malloc(ni * 4), res[k][3] = malloc(ni * 4);
        down(be, res[k][1], d_dgu, ngu * 4), down(be, res[k][2], d_out, ni * 4), down(be, res[k][3], d_dx, ni * 4);
        down(be, NULL, d_gu, 0), down(be, NULL, d_dout, 0), down(be, NULL, d_x, 0);
    }
    expect("swiglu_fwd", rel(res[1][0], res[0][0], ni), TOL);
    expect("swiglu_bwd +=", rel(res[1][1], res[0][1], ngu), TOL);
    expect("gelu_fwd", rel(res[1][2], res[0][2], ni), TOL);
    expect("gelu_bwd +=", rel(res[1][3], res[0][3], ni), TOL);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            free(res[k][i]);
    free(gu), free(dout), free(dgu0), free(x);
}

/* ------------------------------------------------------------------------------------------------ elementwise */

static void test_elementwise(void) {
    size_t n = 10007;
    printf("elementwise (n=%zu)\n", n);
    float *a = randf(n, -3, 3), *b = randf(n, -3, 3);
    float *res[2][3];
    snug_backend *bes[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        snug_backend *be = bes[k];
        float *d_a = up(be, a, n * 4), *d_b = up(be, b, n * 4), *d_o = up(be, NULL, n * 4);
        be->add(be, d_o, d_a, d_b, n);
        res[k][0] = malloc(n * 4);
        be->to_host(be, res[k][0], d_o, n * 4);
        be->accumulate(be, d_o, d_a, n);
        res[k][1] = malloc(n * 4);
        be->to_host(be, res[k][1], d_o, n * 4);
        be->scale(be, d_o, -0.3f, n);
        res[k][2] = malloc(n * 4);
        down(be, res[k][2], d_o, n * 4);
        down(be, NULL, d_a, 0), down(be, NULL, d_b, 0);
    }
    expect_same("add", res[1][0], res[0][0], n * 4);
    expect_same("accumulate", res[1][1], res[0][1], n * 4);
    expect_same("scale", res[1][2], res[0][2], n * 4);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++)
            free(res[k][i]);
    free(a), free(b);
}

/* LoRA's and QLoRA's ops: the strided GEMM on a block of columns of a wider matrix (both transposes), dropout's mask,
 * the 4-bit dequantization (double-quantized scales), the 8-bit one (load_in_8bit's codes and row scales) and
 * NEFTune's noise, each against the CPU's. */
static void test_adapter_ops(void) {
    int M = 37, N = 19, K = 23, ld = 61; /* C is columns [5, 5 + N) of a (M, ld) matrix */
    printf("adapter ops (strided GEMM %dx%dx%d in ld %d, dropout, 4- and 8-bit dequantization, noise)\n", M, N, K,
           ld);
    float *A = randf((size_t)M * K, -1, 1), *B = randf((size_t)K * N, -1, 1), *C = randf((size_t)M * ld, -1, 1);
    snug_backend *bes[2] = {cpu, gpu};
    float *res[2][6];
    size_t n = 100003;
    size_t q8r = 131, q8c = 77; /* 8-bit: codes over the whole int8 range, scales with a zero row */
    int8_t *codes = malloc(q8r * q8c);
    float *scb = randf(q8r, 0.0f, 3.0f);
    for (size_t i = 0; i < q8r * q8c; i++)
        codes[i] = (int8_t)(irand(256) - 128);
    scb[5] = 0.0f;
    float *x = randf(n, -2, 2);
    size_t nq = 64 * 300 + 17, nb = (nq + 63) / 64;
    uint8_t *packed = malloc((nq + 1) / 2), *aq = malloc(nb);
    float *nabs = randf((nb + 255) / 256, 0.01f, 0.5f), *nmap = randf(256, -1, 1), code[16];
    for (size_t i = 0; i < (nq + 1) / 2; i++)
        packed[i] = (uint8_t)irand(256);
    for (size_t i = 0; i < nb; i++)
        aq[i] = (uint8_t)irand(256);
    for (int i = 0; i < 16; i++)
        code[i] = (float)(i - 7) / 8.0f;
    for (int k = 0; k < 2; k++) {
        snug_backend *be = bes[k];
        for (int t = 0; t < 2; t++) { /* t: op(A) transposed and op(B) transposed, from stored transposes */
            float *At = malloc((size_t)M * K * 4), *Bt = malloc((size_t)K * N * 4);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < K; j++)
                    At[(size_t)j * M + i] = A[(size_t)i * K + j];
            for (int i = 0; i < K; i++)
                for (int j = 0; j < N; j++)
                    Bt[(size_t)j * K + i] = B[(size_t)i * N + j];
            float *dA = up(be, t ? At : A, (size_t)M * K * 4), *dB = up(be, t ? Bt : B, (size_t)K * N * 4);
            float *dC = up(be, C, (size_t)M * ld * 4);
            be->gemm_strided(be, t, t, M, N, K, 0.7f, dA, t ? M : K, dB, t ? K : N, 1.0f, dC + 5, ld);
            res[k][t] = malloc((size_t)M * ld * 4);
            down(be, res[k][t], dC, (size_t)M * ld * 4);
            down(be, NULL, dA, 0), down(be, NULL, dB, 0);
            free(At), free(Bt);
        }
        float *dx = up(be, x, n * 4);
        be->dropout(be, dx, dx, n, 0.3f, 0x1234);
        res[k][2] = malloc(n * 4);
        down(be, res[k][2], dx, n * 4);
        float *dn = up(be, x, n * 4);
        be->add_noise(be, dn, n, 0.37f, 0x1234);
        res[k][4] = malloc(n * 4);
        down(be, res[k][4], dn, n * 4);
        uint8_t *dp = up(be, packed, (nq + 1) / 2), *daq = up(be, aq, nb);
        float *dna = up(be, nabs, ((nb + 255) / 256) * 4), *dnm = up(be, nmap, 256 * 4), *dq = up(be, NULL, nq * 4);
        be->dequantize_4bit(be, dq, dp, NULL, daq, dna, dnm, 0.05f, code, nq, 64);
        res[k][3] = malloc(nq * 4);
        down(be, res[k][3], dq, nq * 4);
        down(be, NULL, dp, 0), down(be, NULL, daq, 0), down(be, NULL, dna, 0), down(be, NULL, dnm, 0);
        int8_t *dc = up(be, codes, q8r * q8c);
        float *ds = up(be, scb, q8r * 4), *d8 = up(be, NULL, q8r * q8c * 4);
        be->dequantize_int8(be, d8, dc, ds, q8r, q8c);
        res[k][5] = malloc(q8r * q8c * 4);
        down(be, res[k][5], d8, q8r * q8c * 4);
        down(be, NULL, dc, 0), down(be, NULL, ds, 0);
    }
    expect("gemm_strided", rel(res[1][0], res[0][0], (size_t)M * ld), TOL_GEMM);
    expect("gemm_strided, both transposed", rel(res[1][1], res[0][1], (size_t)M * ld), TOL_GEMM);
    expect_same("dropout", res[1][2], res[0][2], n * 4);
    expect_same("dequantize_4bit", res[1][3], res[0][3], nq * 4);
    expect_same("add_noise", res[1][4], res[0][4], n * 4);
    expect_same("dequantize_int8", res[1][5], res[0][5], q8r * q8c * 4);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++)
            free(res[k][i]);
    free(A), free(B), free(C), free(x), free(packed), free(aq), free(nabs), free(nmap), free(codes), free(scb);
}

/* DoRA's row ops: the norms and dots summed in double in another order (one rounding of a double apart, at most a
 * float ulp), the column scale bit for bit (one rounded gain, difference, product and sum) */
static void test_rows(void) {
    const int rows = 300, cols = 1000, lda = 1003, N = 257, ld = 700, nc = 650;
    float *a = randf((size_t)rows * lda, -1, 1), *b = randf((size_t)rows * lda, -1, 1);
    float *div = randf((size_t)rows, 0.5f, 2.0f), *acc = randf((size_t)rows, -1, 1);
    float *x = randf((size_t)N * ld, -2, 2), *mag = randf((size_t)nc, -1, 2), *nrm = randf((size_t)nc, 0.5f, 3);
    float *bias = randf((size_t)nc, -1, 1), *res[2][5];
    snug_backend *bes[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        snug_backend *be = bes[k];
        float *da = up(be, a, (size_t)rows * lda * 4), *db = up(be, b, (size_t)rows * lda * 4);
        float *ddiv = up(be, div, (size_t)rows * 4), *dn = up(be, NULL, (size_t)rows * 4);
        float *dd = up(be, acc, (size_t)rows * 4), *dx = up(be, x, (size_t)N * ld * 4);
        float *dm = up(be, mag, (size_t)nc * 4), *dr = up(be, nrm, (size_t)nc * 4);
        float *dbias = up(be, bias, (size_t)nc * 4);
        be->row_norms(be, dn, da, (size_t)lda, rows, cols);
        be->row_dots(be, dd, da, (size_t)lda, db, (size_t)lda, rows, cols, ddiv);
        be->scale_cols(be, dx, (size_t)ld, dx, (size_t)ld, N, nc, dm, dr, dbias);
        float *dacc = up(be, x, (size_t)N * ld * 4), *dsrc = up(be, x, (size_t)N * ld * 4);
        be->add_scaled_cols(be, dacc + 3, (size_t)ld, dsrc, (size_t)ld, N, nc, dm, dr, 1.0f);
        res[k][3] = malloc((size_t)N * ld * 4);
        down(be, res[k][3], dacc, (size_t)N * ld * 4);
        float *dcol = up(be, mag, (size_t)nc * 4); /* (added to) */
        be->col_dots(be, dcol, dsrc + 1, (size_t)ld, dsrc, (size_t)ld, N, nc, dbias, dm);
        res[k][4] = malloc((size_t)nc * 4);
        down(be, res[k][4], dcol, (size_t)nc * 4);
        down(be, NULL, dsrc, 0);
        res[k][0] = malloc((size_t)rows * 4), res[k][1] = malloc((size_t)rows * 4);
        res[k][2] = malloc((size_t)N * ld * 4);
        down(be, res[k][0], dn, (size_t)rows * 4);
        down(be, res[k][1], dd, (size_t)rows * 4);
        down(be, res[k][2], dx, (size_t)N * ld * 4);
        down(be, NULL, da, 0), down(be, NULL, db, 0), down(be, NULL, ddiv, 0), down(be, NULL, dm, 0);
        down(be, NULL, dr, 0), down(be, NULL, dbias, 0);
    }
    expect("row_norms", rel(res[1][0], res[0][0], (size_t)rows), 2e-7);
    expect("row_dots", rel(res[1][1], res[0][1], (size_t)rows), 2e-7);
    expect_same("scale_cols", res[1][2], res[0][2], (size_t)N * ld * 4);
    expect_same("add_scaled_cols", res[1][3], res[0][3], (size_t)N * ld * 4);
    expect_same("col_dots (the same order of double sums)", res[1][4], res[0][4], (size_t)nc * 4);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++)
            free(res[k][i]);
    free(a), free(b), free(div), free(acc), free(x), free(mag), free(nrm), free(bias);
}

/* ------------------------------------------------------------------------------------------------ 16-bit storage */

/* values over the whole range: normal, subnormal (of fp16 and fp32), overflowing fp16, ties, inf, nan, -0 */
static float *awkward_floats(size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double m = 2 * urand() - 1;
        int e = irand(60) - 40; /* 2^-40 .. 2^19 */
        x[i] = (float)ldexp(m, e);
        switch (i % 97) {
        case 0: x[i] = INFINITY; break;
        case 1: x[i] = -INFINITY; break;
        case 2: x[i] = NAN; break;
        case 3: x[i] = -0.0f; break;
        case 4: x[i] = 1.0f + 0x1.0p-8f; break;  /* a bf16 tie */
        case 5: x[i] = 65520.0f; break;          /* overflows fp16 */
        case 6: x[i] = 0x1.8p-25f; break;        /* fp16 subnormal range */
        case 7: x[i] = 0x1.0p-130f; break;       /* fp32 subnormal */
        default: break;
        }
    }
    return x;
}

static void test_16bit(void) {
    size_t n = 5003;
    printf("16-bit storage (n=%zu)\n", n);
    float *x = awkward_floats(n);
    snug_dtype dts[2] = {SNUG_DT_BF16, SNUG_DT_F16};
    for (int k = 0; k < 2; k++) {
        uint16_t *h[2];
        float *rounded[2], *wide[2];
        snug_backend *bes[2] = {cpu, gpu};
        for (int j = 0; j < 2; j++) {
            snug_backend *be = bes[j];
            float *d_x = up(be, x, n * 4), *d_w = up(be, NULL, n * 4);
            uint16_t *d_h = up(be, NULL, n * 2);
            be->to16(be, d_h, d_x, n, dts[k], 0);
            be->from16(be, d_w, d_h, n, dts[k]);
            h[j] = malloc(n * 2), wide[j] = malloc(n * 4), rounded[j] = malloc(n * 4);
            be->to_host(be, wide[j], d_w, n * 4);
            be->to16(be, NULL, d_x, n, dts[k], 1); /* round src in place */
            down(be, rounded[j], d_x, n * 4), down(be, h[j], d_h, n * 2), down(be, NULL, d_w, 0);
        }
        char w[96];
        snprintf(w, sizeof w, "to16 %s", snug_dtype_name(dts[k]));
        expect_same(w, h[1], h[0], n * 2);
        snprintf(w, sizeof w, "from16 %s", snug_dtype_name(dts[k]));
        expect_same(w, wide[1], wide[0], n * 4);
        snprintf(w, sizeof w, "to16 %s rounding src in place", snug_dtype_name(dts[k]));
        expect_same(w, rounded[1], rounded[0], n * 4);
        for (int j = 0; j < 2; j++)
            free(h[j]), free(rounded[j]), free(wide[j]);
    }
    uint16_t *sr[2];
    snug_backend *bes[2] = {cpu, gpu};
    for (int j = 0; j < 2; j++) {
        float *d_x = up(bes[j], x, n * 4);
        uint16_t *d_h = up(bes[j], NULL, n * 2);
        bes[j]->bf16_sr(bes[j], d_h, d_x, n, 0x5EEDull);
        sr[j] = malloc(n * 2);
        down(bes[j], sr[j], d_h, n * 2), down(bes[j], NULL, d_x, 0);
    }
    expect_same("bf16_sr", sr[1], sr[0], n * 2);
    free(sr[0]), free(sr[1]), free(x);
}

/* ------------------------------------------------------------------------------------------------ loss */

static double run_xent(snug_backend *be, float *dh, float *dw, const float *h, const void *w, snug_dtype wdt,
                       const int32_t *labels, int N, int C, int V, int chunk, int wblock, int grad) {
    size_t hb = (size_t)N * C * 4, wb = (size_t)V * C * snug_dtype_size(wdt), dwb = (size_t)V * C * 4;
    float *d_h = up(be, h, hb), *d_dh = up(be, dh, hb), *d_dw = up(be, dw, dwb);
    void *d_w = up(be, w, wb);
    int32_t *d_l = up(be, labels, N * 4);
    float *d_ws = up(be, NULL, (size_t)chunk * snug_logits_ld(V) * 4), *d_wws = up(be, NULL, (size_t)wblock * C * 4);
    double loss = be->xent_fwd_bwd(be, grad ? d_dh : NULL, grad ? d_dw : NULL, d_h, d_w, wdt, d_l, N, C, V,
                                   1.0f / N, d_ws, chunk, wdt == SNUG_DT_F32 ? NULL : d_wws, wblock);
    down(be, dh, d_dh, hb), down(be, dw, d_dw, dwb);
    down(be, NULL, d_h, 0), down(be, NULL, d_w, 0), down(be, NULL, d_l, 0), down(be, NULL, d_ws, 0);
    down(be, NULL, d_wws, 0);
    return loss;
}

/* The loss's random inputs: h (N,C), w (V,C), starting gradients dh0, dw0; labels (N) with every `every`-th token
 * and the whole second chunk unsupervised (-1). */
static void xent_inputs(int N, int C, int V, int chunk, int every, float **h, float **w, float **dh0, float **dw0,
                        int32_t *labels) {
    *h = randf((size_t)N * C, -1, 1), *w = randf((size_t)V * C, -0.3f, 0.3f);
    *dh0 = randf((size_t)N * C, -0.1f, 0.1f), *dw0 = randf((size_t)V * C, -0.1f, 0.1f);
    for (int n = 0; n < N; n++)
        labels[n] = n % every == 2 ? -1 : irand(V);
    for (int n = chunk; n < 2 * chunk && n < N; n++) /* one whole chunk without a supervised token */
        labels[n] = -1;
}

static void test_xent(void) {
    int N = 77, C = 96, V = 1000, chunk = 32, wblock = 300;
    printf("xent_fwd_bwd (N=%d, C=%d, V=%d, chunk %d, labels with -1)\n", N, C, V, chunk);
    float *h, *w32, *dh0, *dw0;
    int32_t labels[77];
    xent_inputs(N, C, V, chunk, 5, &h, &w32, &dh0, &dw0, labels);
    snug_dtype dts[2] = {SNUG_DT_F32, SNUG_DT_BF16};
    for (int k = 0; k < 2; k++) {
        void *w = table_as(w32, (size_t)V * C, dts[k]);
        double loss[2], loss_only[2];
        float *dh[2], *dw[2];
        snug_backend *bes[2] = {cpu, gpu};
        for (int j = 0; j < 2; j++) {
            dh[j] = copyof(dh0, (size_t)N * C * 4), dw[j] = copyof(dw0, (size_t)V * C * 4);
            loss[j] = run_xent(bes[j], dh[j], dw[j], h, w, dts[k], labels, N, C, V, chunk, wblock, 1);
            loss_only[j] = run_xent(bes[j], NULL, NULL, h, w, dts[k], labels, N, C, V, chunk, wblock, 0);
        }
        char s[96];
        snprintf(s, sizeof s, "xent loss (%s w)", snug_dtype_name(dts[k]));
        expect(s, check_relerr(loss[1], loss[0], 1e-30), TOL);
        snprintf(s, sizeof s, "xent loss without gradients (%s w)", snug_dtype_name(dts[k]));
        expect(s, check_relerr(loss_only[1], loss_only[0], 1e-30), TOL);
        snprintf(s, sizeof s, "xent dh += (%s w)", snug_dtype_name(dts[k]));
        expect(s, rel(dh[1], dh[0], (size_t)N * C), TOL_GEMM);
        snprintf(s, sizeof s, "xent dw += (%s w)", snug_dtype_name(dts[k]));
        expect(s, rel(dw[1], dw[0], (size_t)V * C), TOL_GEMM);
        for (int j = 0; j < 2; j++)
            free(dh[j]), free(dw[j]);
        free(w);
    }
    free(h), free(w32), free(dh0), free(dw0);
}

/* ------------------------------------------------------------------------------------------------ 16-bit GEMMs */
/* The GEMM helper (snug_cuda_gemm_ex) against a double reference on the host, element by element within a bound
 * derived from the arithmetic, not tuned: operands exact in their 16-bit type, products exact in fp32, and a sum of
 * K terms in fp32 in any order off by at most about K * u32 * sum |a b| (u32 = 2^-24; the factor 2 leaves room for
 * an accumulator that truncates), plus u16 * |c| where the output is rounded to 16 bits (u16 = 2^-8 for bf16,
 * 2^-11 for fp16). */

#define U32 0x1.0p-24
#define U_BF16 0x1.0p-8
#define U_F16 0x1.0p-11

/* Largest |got - ref| / bound over n elements: at most 1 passes (a zero bound demands equality; NaN fails). */
static double bounded(const float *got, const double *ref, const double *bound, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        double r = bound[i] > 0 ? d / bound[i] : d > 0 ? INFINITY : 0.0;
        worst = r > worst || isnan(r) ? r : worst;
    }
    return worst;
}

static void expect_bounded(const char *what, double worst) {
    printf("  %-52s max err / bound %8.3f\n", what, worst);
    CHECKF(worst <= 1.0, "%s: error %.3f times its bound", what, worst);
}

/* n random values in [-1, 1) that dt holds exactly: the 16-bit bits in x16, their values in x */
static void rand16(size_t n, snug_dtype dt, uint16_t *x16, float *x) {
    for (size_t i = 0; i < n; i++) {
        float v = (float)(2.0 * urand() - 1.0);
        x16[i] = dt == SNUG_DT_BF16 ? snug_f32_to_bf16(v) : snug_f32_to_f16(v);
        x[i] = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(x16[i]) : snug_f16_to_f32(x16[i]);
    }
}

/* column-major ref (m,n) = alpha op(A) op(B) + beta c0 in double, and sum |alpha a b| + |beta c0| per element */
static void gemm_ref(int ta, int tb, int m, int n, int k, double alpha, const float *A, int lda, const float *B,
                     int ldb, double beta, const float *c0, int ldc, double *ref, double *mag) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0, a = 0.0;
            for (int p = 0; p < k; p++) {
                double x = ta ? A[p + (size_t)i * lda] : A[i + (size_t)p * lda];
                double y = tb ? B[j + (size_t)p * ldb] : B[p + (size_t)j * ldb];
                s += x * y, a += fabs(x * y);
            }
            double c = beta != 0.0 ? beta * c0[i + (size_t)j * ldc] : 0.0;
            ref[i + (size_t)j * m] = alpha * s + c;
            mag[i + (size_t)j * m] = fabs(alpha) * a + fabs(c);
        }
}

typedef struct gemm_case {
    int ta, tb, m, n, k, odd; /* odd: leading dimensions one longer and every pointer one element off */
} gemm_case;

/* One case at operand type dt (BF16 or F16) and output type cdt (F32, or dt with beta 0). */
static void run_gemm16_case(const gemm_case *g, snug_dtype dt, snug_dtype cdt) {
    int lda = (g->ta ? g->k : g->m) + g->odd, ldb = (g->tb ? g->n : g->k) + g->odd, ldc = g->m + g->odd;
    size_t na = (size_t)lda * (g->ta ? g->m : g->k), nb = (size_t)ldb * (g->tb ? g->k : g->n);
    size_t nc = (size_t)ldc * g->n, mn = (size_t)g->m * g->n, off = (size_t)g->odd;
    size_t csz = snug_dtype_size(cdt);
    double u_out = cdt == SNUG_DT_BF16 ? U_BF16 : cdt == SNUG_DT_F16 ? U_F16 : 0.0; /* the output's rounding */
    float alpha = g->odd ? 0.75f : 1.0f, beta = cdt == SNUG_DT_F32 && g->odd ? 1.0f : 0.0f;
    uint16_t *a16 = malloc(na * 2), *b16 = malloc(nb * 2);
    float *a = malloc(na * 4), *b = malloc(nb * 4), *c0 = randf(nc, -1, 1);
    rand16(na, dt, a16, a), rand16(nb, dt, b16, b);
    double *ref = malloc(mn * sizeof(double)), *bound = malloc(mn * sizeof(double));
    gemm_ref(g->ta, g->tb, g->m, g->n, g->k, alpha, a, lda, b, ldb, beta, c0, ldc, ref, bound);
    for (size_t i = 0; i < mn; i++)
        bound[i] = 2.0 * (g->k + 2) * U32 * bound[i] + 2 * u_out * fabs(ref[i]) + 1e-30;
    /* the operands and the output one element past an allocation's start: 2-byte (4-byte for fp32) aligned */
    uint16_t *d_a = up(gpu, NULL, (na + off) * 2), *d_b = up(gpu, NULL, (nb + off) * 2);
    unsigned char *d_c = up(gpu, NULL, (nc + off) * csz);
    gpu->to_device(gpu, d_a + off, a16, na * 2), gpu->to_device(gpu, d_b + off, b16, nb * 2);
    if (cdt == SNUG_DT_F32)
        gpu->to_device(gpu, d_c + off * csz, c0, nc * 4);
    snug_cuda_gemm_ex(gpu, g->ta, g->tb, g->m, g->n, g->k, alpha, d_a + off, lda, d_b + off, ldb, dt, beta,
                      d_c + off * csz, ldc, cdt, NULL);
    unsigned char *c = malloc(nc * csz);
    gpu->to_host(gpu, c, d_c + off * csz, nc * csz);
    snug_error e = {0};
    CHECKF(snug_backend_check(gpu, &e) == 0, "gemm16: %s", e.msg);
    float *got = malloc(mn * 4);
    for (int j = 0; j < g->n; j++)
        for (int i = 0; i < g->m; i++) {
            size_t s = i + (size_t)j * ldc;
            got[i + (size_t)j * g->m] = cdt == SNUG_DT_F32   ? ((float *)c)[s]
                                        : cdt == SNUG_DT_BF16 ? snug_bf16_to_f32(((uint16_t *)c)[s])
                                                              : snug_f16_to_f32(((uint16_t *)c)[s]);
        }
    char what[96];
    snprintf(what, sizeof what, "gemm %s->%s m=%d n=%d k=%d t%d%d%s", snug_dtype_name(dt), snug_dtype_name(cdt),
             g->m, g->n, g->k, g->ta, g->tb, g->odd ? " odd ld, +1 ptr" : "");
    expect_bounded(what, bounded(got, ref, bound, mn));
    down(gpu, NULL, d_a, 0), down(gpu, NULL, d_b, 0), down(gpu, NULL, d_c, 0);
    free(a16), free(b16), free(a), free(b), free(c0), free(c), free(ref), free(bound), free(got);
}

static void test_gemm16(void) {
    printf("16-bit GEMMs (fp32 accumulation) against a double reference\n");
    static const gemm_case cases[] = {
        {0, 0, 1, 1, 1, 0},     {1, 0, 7, 13, 1, 1},   {0, 1, 13, 7, 50257, 1}, {1, 1, 50257, 7, 13, 0},
        {0, 0, 7, 50257, 13, 1}, {1, 0, 50257, 1, 7, 1}, {0, 1, 96, 130, 77, 0},
    };
    snug_dtype dts[2] = {SNUG_DT_BF16, SNUG_DT_F16};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            run_gemm16_case(&cases[i], dts[d], SNUG_DT_F32);
            if (!cases[i].odd)
                run_gemm16_case(&cases[i], dts[d], dts[d]);
        }
}

/* The plan cache: the same problem twice finds its plan the second time and gives the same bits. */
static void test_gemm_cache(void) {
    printf("GEMM plan cache\n");
    int m = 100, n = 70, k = 300;
    uint16_t *a16 = malloc((size_t)m * k * 2), *b16 = malloc((size_t)k * n * 2);
    float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)k * n * 4);
    rand16((size_t)m * k, SNUG_DT_BF16, a16, a), rand16((size_t)k * n, SNUG_DT_BF16, b16, b);
    void *d_a = up(gpu, a16, (size_t)m * k * 2), *d_b = up(gpu, b16, (size_t)k * n * 2);
    float *d_c[2], *c[2];
    long long hits[3];
    int plans[3];
    plans[0] = snug_cuda_gemm_plans(gpu, &hits[0]);
    for (int r = 0; r < 2; r++) {
        d_c[r] = up(gpu, NULL, (size_t)m * n * 4); /* both 256-byte aligned: the same problem */
        snug_cuda_gemm_ex(gpu, 0, 0, m, n, k, 1.0f, d_a, m, d_b, k, SNUG_DT_BF16, 0.0f, d_c[r], m, SNUG_DT_F32,
                          NULL);
        plans[r + 1] = snug_cuda_gemm_plans(gpu, &hits[r + 1]);
        c[r] = malloc((size_t)m * n * 4);
        down(gpu, c[r], d_c[r], (size_t)m * n * 4);
    }
    printf("  plans %d -> %d -> %d, hits %lld -> %lld -> %lld\n", plans[0], plans[1], plans[2], hits[0], hits[1],
           hits[2]);
    CHECKF(hits[2] == hits[1] + 1 && plans[2] == plans[1], "the second GEMM found its plan in the cache");
    expect_same("the same GEMM twice", c[0], c[1], (size_t)m * n * 4);
    down(gpu, NULL, d_a, 0), down(gpu, NULL, d_b, 0);
    free(a16), free(b16), free(a), free(b), free(c[0]), free(c[1]);
}

/* matmul_fwd with a bias (cuBLASLt's bias epilogue where it has one) against the bias-less GEMM plus an add of the
 * bias rows, under fp32 and bf16 math: two sums of the same products in possibly different orders, each within
 * K * u32 * sum |x w| of the exact one, and one more rounding of the add. */
static void test_bias_epilogue(void) {
    printf("matmul_fwd bias epilogue against the GEMM + add\n");
    static const int shapes[][3] = {{77, 96, 130}, {5, 13, 50257}, {1, 7, 1}};
    snug_dtype maths[2] = {SNUG_DT_F32, SNUG_DT_BF16};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int mt = 0; mt < 2; mt++) {
            int N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
            size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
            float *inp = randf(ni, -1, 1), *w = randf(nw, -1, 1), *bias = randf(OC, -1, 1);
            float *rows = malloc(no * 4), *o[2] = {malloc(no * 4), malloc(no * 4)};
            for (size_t i = 0; i < no; i++)
                rows[i] = bias[i % OC];
            gpu->math = maths[mt];
            float *d_inp = up(gpu, inp, ni * 4), *d_w = up(gpu, w, nw * 4), *d_bias = up(gpu, bias, OC * 4);
            float *d_rows = up(gpu, rows, no * 4), *d_o[2] = {up(gpu, NULL, no * 4), up(gpu, NULL, no * 4)};
            gpu->matmul_fwd(gpu, d_o[0], d_inp, d_w, d_bias, N, C, OC);
            gpu->matmul_fwd(gpu, d_o[1], d_inp, d_w, NULL, N, C, OC);
            gpu->add(gpu, d_o[1], d_o[1], d_rows, no);
            down(gpu, o[0], d_o[0], no * 4), down(gpu, o[1], d_o[1], no * 4);
            gpu->math = SNUG_DT_F32;
            double *ref = malloc(no * sizeof(double)), *bound = malloc(no * sizeof(double));
            double worst = 0.0;
            for (int n = 0; n < N; n++)
                for (int j = 0; j < OC; j++) {
                    double mag = 0.0;
                    for (int c = 0; c < C; c++)
                        mag += fabs((double)inp[(size_t)n * C + c] * w[(size_t)j * C + c]);
                    mag *= 1.0 + 3 * U_BF16; /* under bf16 math the operands are rounded first, the same way */
                    size_t i = (size_t)n * OC + j;
                    ref[i] = o[1][i];
                    bound[i] = 2 * 2.0 * (C + 2) * U32 * mag + 2 * U32 * (fabs(o[1][i]) + fabs(bias[j])) + 1e-30;
                }
            worst = bounded(o[0], ref, bound, no);
            char what[96];
            snprintf(what, sizeof what, "bias epilogue N=%d C=%d OC=%d (%s math)", N, C, OC,
                     snug_dtype_name(maths[mt]));
            expect_bounded(what, worst);
            down(gpu, NULL, d_inp, 0), down(gpu, NULL, d_w, 0), down(gpu, NULL, d_bias, 0), down(gpu, NULL, d_rows, 0);
            free(inp), free(w), free(bias), free(rows), free(o[0]), free(o[1]), free(ref), free(bound);
        }
}

/* matmul_w16_fwd/bwd (filled by set_math under 16-bit math): the weight read as stored, the activation operand
 * (inp forward, dout for dinp) rounded to the weight's 16 bits to nearest even, fp32 sums; the weight gradient on
 * fp32 activations under the fast-16-bit mode. Against a double reference on the host of the same rounded operands:
 * each output within 2 (K + 2) u32 sum |x w| of it (fp32 sums of K products and the added bias or gradient), and
 * dw, whose operands cuBLASLt rounds on load by its own rule, within 2 u16 of the magnitude more. */
static void test_matmul_w16(void) {
    printf("matmul_w16 (16-bit weights as stored) against a double reference\n");
    static const int shapes[][3] = {{77, 96, 130}, {5, 13, 50257}, {1, 7, 1}};
    /* A backend whose scratch holds what these shapes need: the bias gradient's column sums over OC = 50257 take
     * 25.7 MB, beyond the default 16 MiB (which holds 16384 columns). */
    snug_error ce = {0};
    snug_backend *gpu = snug_backend_cuda_create_sized(0, snug_cuda_scratch_bytes(77, 1, 50257, 50257), &ce);
    CHECKF(gpu != NULL, "a CUDA backend with a sized scratch: %s", ce.msg);
    if (!gpu)
        return;
    snug_dtype dts[2] = {SNUG_DT_BF16, SNUG_DT_F16};
    for (int d = 0; d < 2; d++) {
        snug_dtype dt = dts[d];
        double u16 = dt == SNUG_DT_BF16 ? U_BF16 : U_F16;
        snug_error e = {0};
        CHECKF(snug_backend_set_math(gpu, dt, 0, 0, 0, &e) == 0, "set_math: %s", e.msg);
        CHECKF(gpu->matmul_w16_fwd && gpu->matmul_w16_bwd, "set_math(%s) fills the matmul_w16 slots",
               snug_dtype_name(dt));
        if (!gpu->matmul_w16_fwd || !gpu->matmul_w16_bwd)
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
            size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
            uint16_t *w16 = malloc(nw * 2);
            float *w = malloc(nw * 4), *inp = randf(ni, -1, 1), *dout = randf(no, -1, 1), *bias = randf(OC, -1, 1);
            float *dinp0 = randf(ni, -1, 1), *dw0 = randf(nw, -1, 1), *db0 = randf(OC, -1, 1);
            rand16(nw, dt, w16, w);
            float *x = malloc(ni * 4), *g = malloc(no * 4); /* the activations as the 16-bit GEMM sees them */
            for (size_t i = 0; i < ni; i++)
                x[i] = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(snug_f32_to_bf16(inp[i]))
                                          : snug_f16_to_f32(snug_f32_to_f16(inp[i]));
            for (size_t i = 0; i < no; i++)
                g[i] = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(snug_f32_to_bf16(dout[i]))
                                          : snug_f16_to_f32(snug_f32_to_f16(dout[i]));
            void *d_w = up(gpu, w16, nw * 2);
            float *d_inp = up(gpu, inp, ni * 4), *d_dout = up(gpu, dout, no * 4), *d_bias = up(gpu, bias, OC * 4);
            float *d_out = up(gpu, NULL, no * 4), *d_dinp = up(gpu, dinp0, ni * 4), *d_dw = up(gpu, dw0, nw * 4);
            float *d_db = up(gpu, db0, OC * 4);
            gpu->matmul_w16_fwd(gpu, d_out, d_inp, d_w, dt, d_bias, N, C, OC);
            gpu->matmul_w16_bwd(gpu, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, dt, N, C, OC);
            float *out = malloc(no * 4), *dinp = malloc(ni * 4), *dw = malloc(nw * 4), *db = malloc(OC * 4);
            down(gpu, out, d_out, no * 4), down(gpu, dinp, d_dinp, ni * 4), down(gpu, dw, d_dw, nw * 4);
            down(gpu, db, d_db, OC * 4);
            CHECKF(snug_backend_check(gpu, &e) == 0, "matmul_w16: %s", e.msg);
            double *ref = malloc((no > nw ? (no > ni ? no : ni) : (nw > ni ? nw : ni)) * sizeof(double));
            double *bnd = malloc((no > nw ? (no > ni ? no : ni) : (nw > ni ? nw : ni)) * sizeof(double));
            for (int n = 0; n < N; n++) /* out = x w^T + bias */
                for (int j = 0; j < OC; j++) {
                    double acc = bias[j], mag = fabs(bias[j]);
                    for (int c = 0; c < C; c++) {
                        double p = (double)x[(size_t)n * C + c] * w[(size_t)j * C + c];
                        acc += p, mag += fabs(p);
                    }
                    ref[(size_t)n * OC + j] = acc, bnd[(size_t)n * OC + j] = 2.0 * (C + 2) * U32 * mag + 1e-30;
                }
            char what[96];
            snprintf(what, sizeof what, "w16 out N=%d C=%d OC=%d (%s)", N, C, OC, snug_dtype_name(dt));
            expect_bounded(what, bounded(out, ref, bnd, no));
            for (int n = 0; n < N; n++) /* dinp += g w */
                for (int c = 0; c < C; c++) {
                    double acc = dinp0[(size_t)n * C + c], mag = fabs(acc);
                    for (int j = 0; j < OC; j++) {
                        double p = (double)g[(size_t)n * OC + j] * w[(size_t)j * C + c];
                        acc += p, mag += fabs(p);
                    }
                    ref[(size_t)n * C + c] = acc, bnd[(size_t)n * C + c] = 2.0 * (OC + 2) * U32 * mag + 1e-30;
                }
            snprintf(what, sizeof what, "w16 dinp += N=%d C=%d OC=%d (%s)", N, C, OC, snug_dtype_name(dt));
            expect_bounded(what, bounded(dinp, ref, bnd, ni));
            for (int j = 0; j < OC; j++) /* dw += dout^T inp, operands rounded on load */
                for (int c = 0; c < C; c++) {
                    double acc = dw0[(size_t)j * C + c], mag = 0.0;
                    for (int n = 0; n < N; n++) {
                        double p = (double)dout[(size_t)n * OC + j] * inp[(size_t)n * C + c];
                        acc += p, mag += fabs(p);
                    }
                    ref[(size_t)j * C + c] = acc;
                    bnd[(size_t)j * C + c] = (2.0 * (N + 2) * U32 + 2.0 * u16) * (mag + fabs(dw0[(size_t)j * C + c])) +
                                             1e-30;
                }
            snprintf(what, sizeof what, "w16 dw += N=%d C=%d OC=%d (%s)", N, C, OC, snug_dtype_name(dt));
            expect_bounded(what, bounded(dw, ref, bnd, nw));
            for (int j = 0; j < OC; j++) { /* dbias += column sums of dout (fp32 data, fp32 sums) */
                double acc = db0[j], mag = fabs(acc);
                for (int n = 0; n < N; n++)
                    acc += dout[(size_t)n * OC + j], mag += fabs(dout[(size_t)n * OC + j]);
                ref[j] = acc, bnd[j] = 2.0 * (N + 2) * U32 * mag + 1e-30;
            }
            snprintf(what, sizeof what, "w16 dbias += N=%d OC=%d (%s)", N, OC, snug_dtype_name(dt));
            expect_bounded(what, bounded(db, ref, bnd, (size_t)OC));
            /* d_out, d_dinp, d_dw and d_db were freed by the down() that read them */
            down(gpu, NULL, d_w, 0), down(gpu, NULL, d_inp, 0), down(gpu, NULL, d_dout, 0), down(gpu, NULL, d_bias, 0);
            free(w16), free(w), free(inp), free(dout), free(bias), free(dinp0), free(dw0), free(db0), free(x), free(g);
            free(out), free(dinp), free(dw), free(db), free(ref), free(bnd);
        }
    }
    snug_error e = {0};
    CHECKF(snug_backend_set_math(gpu, SNUG_DT_F32, 0, 0, 0, &e) == 0, "set_math: %s", e.msg);
    CHECKF(!gpu->matmul_w16_fwd && !gpu->matmul_w16_bwd, "fp32 math leaves the matmul_w16 slots empty");
    gpu->destroy(gpu);
}

/* ------------------------------------------------------------------------------------------------ loss, V = 50257 */
/* Chunked cross-entropy at GPT-2's vocabulary (odd V: the logits rows padded to snug_logits_ld), against a double
 * reference on the host with per-element bounds from the arithmetic:
 *   logits: a C-term fp32 sum, e_z = 2 (C+2) u32 max_v sum_c |h w| + 3 u32 max |z| per row (with z - max);
 *   loss:   lse and z_y each within e_z, plus fp32 exp and log (2^-20);
 *   G = g (softmax - onehot): |dG_v| <= uG |G_v| + 2.1 e_z g p_v, uG the rounding of the stored G (fp32, or bf16's
 *           2^-8 on the tensor-core path), 2^-20 for expf and the scaling;
 *   dh += G w, dw += G^T h: the propagated dG, and the fp32 sums of V (N plus the chunks' additions) terms.
 * The tensor-core path (bf16 math, bf16 w) rounds h to bf16 as well: its reference uses the rounded h. The CPU
 * backend runs the fp32 case against the same reference and bounds. */

typedef struct xent_ref {
    double loss, loss_bound;
    double *dh, *dh_bound, *dw, *dw_bound; /* (N,C), (V,C) */
} xent_ref;

static void xent_reference(xent_ref *r, const float *h, const float *w, const int32_t *labels, const float *dh0,
                           const float *dw0, int N, int C, int V, int chunk, float gs, double uG) {
    size_t nh = (size_t)N * C, nw = (size_t)V * C;
    r->dh = calloc(nh, 8), r->dh_bound = calloc(nh, 8), r->dw = calloc(nw, 8), r->dw_bound = calloc(nw, 8);
    double *z = malloc((size_t)V * 8), *G = malloc((size_t)V * 8), *dG = malloc((size_t)V * 8);
    double *acc = malloc((size_t)C * 8), *mag = malloc((size_t)C * 8), *prop = malloc((size_t)C * 8);
    r->loss = r->loss_bound = 0.0;
    int nchunks = (N + chunk - 1) / chunk;
    for (int n = 0; n < N; n++) {
        const float *hn = h + (size_t)n * C;
        int y = labels[n];
        if (y < 0)
            continue;
        double zmax = -INFINITY, smax = 0.0, zabs = 0.0;
        for (int v = 0; v < V; v++) {
            double s = 0.0, a = 0.0;
            for (int c = 0; c < C; c++)
                s += (double)hn[c] * w[(size_t)v * C + c], a += fabs((double)hn[c] * w[(size_t)v * C + c]);
            z[v] = s;
            zmax = s > zmax ? s : zmax, smax = a > smax ? a : smax, zabs = fabs(s) > zabs ? fabs(s) : zabs;
        }
        double ez = 2.0 * (C + 2) * U32 * smax + 3 * U32 * zabs, sum = 0.0; /* the sum, its rounding, z - max */
        for (int v = 0; v < V; v++)
            sum += exp(z[v] - zmax);
        r->loss += zmax + log(sum) - z[y];
        r->loss_bound += 2 * ez + 0x1.0p-20 * (1.0 + fabs(zmax + log(sum)));
        for (int v = 0; v < V; v++) {
            double p = exp(z[v] - zmax) / sum;
            G[v] = gs * (p - (v == y));
            dG[v] = (uG + 0x1.0p-20) * fabs(G[v]) + 2.1 * ez * gs * p;
        }
        for (int c = 0; c < C; c++)
            acc[c] = mag[c] = prop[c] = 0.0;
        for (int v = 0; v < V; v++) {
            const float *wv = w + (size_t)v * C;
            double *dwv = r->dw + (size_t)v * C, *dwb = r->dw_bound + (size_t)v * C;
            for (int c = 0; c < C; c++) {
                acc[c] += G[v] * wv[c], mag[c] += fabs(G[v] * wv[c]), prop[c] += dG[v] * fabs(wv[c]);
                dwv[c] += G[v] * hn[c];
                dwb[c] += dG[v] * fabs(hn[c]) + 2.0 * (N + 2 * nchunks + 2) * U32 * fabs(G[v] * hn[c]);
            }
        }
        for (int c = 0; c < C; c++) {
            r->dh[(size_t)n * C + c] = acc[c];
            r->dh_bound[(size_t)n * C + c] = prop[c] + 2.0 * (V + 2) * U32 * mag[c];
        }
    }
    for (size_t i = 0; i < nh; i++) { /* the += onto the starting values: one more rounding */
        r->dh[i] += dh0[i];
        r->dh_bound[i] += 2 * U32 * (fabs(r->dh[i]) + fabs(dh0[i])) + 1e-30;
    }
    for (size_t i = 0; i < nw; i++) {
        r->dw[i] += dw0[i];
        r->dw_bound[i] += 2 * nchunks * U32 * (fabs(r->dw[i]) + fabs(dw0[i])) + 1e-30;
    }
    free(z), free(G), free(dG), free(acc), free(mag), free(prop);
}

static void xent_ref_free(xent_ref *r) { free(r->dh), free(r->dh_bound), free(r->dw), free(r->dw_bound); }

static void expect_xent(const char *who, const xent_ref *r, double loss, const float *dh, const float *dw, int N,
                        int C, int V) {
    char s[128];
    double lerr = fabs(loss - r->loss);
    snprintf(s, sizeof s, "%s loss (%.6f vs %.6f)", who, loss, r->loss);
    expect_bounded(s, r->loss_bound > 0 ? lerr / r->loss_bound : lerr > 0 ? INFINITY : 0.0);
    snprintf(s, sizeof s, "%s dh +=", who);
    expect_bounded(s, bounded(dh, r->dh, r->dh_bound, (size_t)N * C));
    snprintf(s, sizeof s, "%s dw +=", who);
    expect_bounded(s, bounded(dw, r->dw, r->dw_bound, (size_t)V * C));
}

static void test_xent_gpt2_vocab(void) {
    int N = 40, C = 64, V = 50257, chunk = 16;
    float gs = 1.0f / N;
    printf("xent_fwd_bwd at GPT-2's vocabulary (N=%d, C=%d, V=%d, chunk %d, logits row stride %d)\n", N, C, V, chunk,
           snug_logits_ld(V));
    float *h, *w, *dh0, *dw0;
    int32_t labels[40];
    xent_inputs(N, C, V, chunk, 7, &h, &w, &dh0, &dw0, labels);
    labels[0] = V - 1; /* the last column, past which the padding starts */

    /* fp32: the CPU backend and the CUDA backend's exact fp32 path against one reference */
    xent_ref r32;
    xent_reference(&r32, h, w, labels, dh0, dw0, N, C, V, chunk, gs, U32);
    snug_backend *bes[2] = {cpu, gpu};
    for (int j = 0; j < 2; j++) {
        float *dh = copyof(dh0, (size_t)N * C * 4), *dw = copyof(dw0, (size_t)V * C * 4);
        double loss = run_xent(bes[j], dh, dw, h, w, SNUG_DT_F32, labels, N, C, V, chunk, 1024, 1);
        expect_xent(j ? "cuda fp32" : "cpu fp32", &r32, loss, dh, dw, N, C, V);
        free(dh), free(dw);
    }
    xent_ref_free(&r32);

    /* bf16 math with a bf16 head: the tensor-core path, h and G rounded to bf16 */
    uint16_t *w16 = malloc((size_t)V * C * 2);
    float *wr = malloc((size_t)V * C * 4), *hr = malloc((size_t)N * C * 4);
    for (size_t i = 0; i < (size_t)V * C; i++)
        w16[i] = snug_f32_to_bf16(w[i]), wr[i] = snug_bf16_to_f32(w16[i]);
    for (size_t i = 0; i < (size_t)N * C; i++)
        hr[i] = snug_bf16_to_f32(snug_f32_to_bf16(h[i]));
    xent_ref r16;
    xent_reference(&r16, hr, wr, labels, dh0, dw0, N, C, V, chunk, gs, U_BF16);
    gpu->math = SNUG_DT_BF16;
    float *dh = copyof(dh0, (size_t)N * C * 4), *dw = copyof(dw0, (size_t)V * C * 4);
    double loss = run_xent(gpu, dh, dw, h, w16, SNUG_DT_BF16, labels, N, C, V, chunk, 1024, 1);
    double loss_only = run_xent(gpu, NULL, NULL, h, w16, SNUG_DT_BF16, labels, N, C, V, chunk, 1024, 0);
    gpu->math = SNUG_DT_F32;
    expect_xent("cuda bf16 tensor cores", &r16, loss, dh, dw, N, C, V);
    CHECKF(loss_only == loss, "the loss without gradients is the loss with them (%.17g vs %.17g)", loss_only, loss);
    xent_ref_free(&r16);
    free(dh), free(dw), free(w16), free(wr), free(hr), free(h), free(w), free(dh0), free(dw0);
}

/* ------------------------------------------------------------------------------------------------ GEMM rate */

/* A bf16 GEMM at 4096^3 on the tensor cores, timed and printed against the device's bf16 peak where plan/gpus.c
 * knows it: a probe for the reader, not a check. */
static void time_gemm16(void) {
    int n = 4096, reps = 10;
    size_t nn = (size_t)n * n;
    uint16_t *a16 = malloc(nn * 2);
    float *a = malloc(nn * 4);
    rand16(nn, SNUG_DT_BF16, a16, a);
    void *d_a = up(gpu, a16, nn * 2), *d_b = up(gpu, a16, nn * 2), *d_c = up(gpu, NULL, nn * 2);
    for (int r = 0; r < 2; r++) /* the plan, and a warm clock */
        snug_cuda_gemm_ex(gpu, 0, 0, n, n, n, 1.0f, d_a, n, d_b, n, SNUG_DT_BF16, 0.0f, d_c, n, SNUG_DT_BF16, NULL);
    gpu->sync(gpu);
    double t0 = now();
    for (int r = 0; r < reps; r++)
        snug_cuda_gemm_ex(gpu, 0, 0, n, n, n, 1.0f, d_a, n, d_b, n, SNUG_DT_BF16, 0.0f, d_c, n, SNUG_DT_BF16, NULL);
    gpu->sync(gpu);
    double tf = 2.0 * n * nn * reps / (now() - t0) / 1e12;
    const char *name = snug_cuda_device_name(gpu);
    const snug_gpu *g = snug_gpu_find(name);
    if (!g && !strncmp(name, "NVIDIA ", 7))
        g = snug_gpu_find(name + 7);
    if (g)
        printf("bf16 GEMM %d^3: %.1f TFLOP/s, %.0f%% of the %s's %.0f TFLOP/s bf16 peak\n", n, tf,
               100.0 * tf / g->tflops_bf16, g->label, g->tflops_bf16);
    else
        printf("bf16 GEMM %d^3: %.1f TFLOP/s (%s: no peak on record in plan/gpus.c)\n", n, tf, name);
    down(gpu, NULL, d_a, 0), down(gpu, NULL, d_b, 0), down(gpu, NULL, d_c, 0);
    free(a16), free(a);
}

/* ------------------------------------------------------------------------------------------------ optimizer */

static void test_sumsq(void) {
    size_t n = 100003;
    printf("sumsq (n=%zu)\n", n);
    float *x = randf(n, -2, 2);
    snug_dtype dts[2] = {SNUG_DT_F32, SNUG_DT_BF16};
    for (int k = 0; k < 2; k++) {
        void *xs = table_as(x, n, dts[k]);
        double r[2];
        snug_backend *bes[2] = {cpu, gpu};
        for (int j = 0; j < 2; j++) {
            void *d = up(bes[j], xs, n * snug_dtype_size(dts[k]));
            r[j] = bes[j]->sumsq(bes[j], d, dts[k], n);
            down(bes[j], NULL, d, 0);
        }
        char s[64];
        snprintf(s, sizeof s, "sumsq (%s)", snug_dtype_name(dts[k]));
        expect(s, check_relerr(r[1], r[0], 1e-30), 1e-6);
        free(xs);
    }
    /* a non-finite element must show */
    x[n / 2] = INFINITY;
    float *d = up(gpu, x, n * 4);
    double s = gpu->sumsq(gpu, d, SNUG_DT_F32, n);
    CHECKF(!isfinite(s), "sumsq of a tensor holding inf is not finite (%g)", s);
    gpu->free(gpu, d);
    free(x);
}

static void test_adamw(void) {
    size_t n = 10007;
    printf("adamw (n=%zu)\n", n);
    float *p = randf(n, -1, 1), *g = randf(n, -1, 1), *m = randf(n, -0.1f, 0.1f), *v = randf(n, 0, 0.01f);
    float *res[2][3];
    snug_backend *bes[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        snug_backend *be = bes[k];
        float *d_p = up(be, p, n * 4), *d_g = up(be, g, n * 4), *d_m = up(be, m, n * 4), *d_v = up(be, v, n * 4);
        be->adamw(be, d_p, d_g, d_m, d_v, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.7f);
        be->adamw(be, d_p, d_g, d_m, d_v, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 4, 0.7f);
        for (int i = 0; i < 3; i++)
            res[k][i] = malloc(n * 4);
        down(be, res[k][0], d_p, n * 4), down(be, res[k][1], d_m, n * 4), down(be, res[k][2], d_v, n * 4);
        down(be, NULL, d_g, 0);
    }
    expect("adamw p", rel(res[1][0], res[0][0], n), TOL);
    expect("adamw m", rel(res[1][1], res[0][1], n), TOL);
    expect("adamw v", rel(res[1][2], res[0][2], n), TOL);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++)
            free(res[k][i]);
    free(p), free(g), free(m), free(v);
}

/* codes that differ (rare ties of x/absmax against a midpoint decide differently); any difference above one code
 * step counts as more than allowed */
static size_t code_mismatches(const uint8_t *a, const uint8_t *b, size_t n, int *far) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            k++;
            *far |= abs((int)a[i] - (int)b[i]) > 1;
        }
    return k;
}

static void expect_codes(const char *what, const uint8_t *a, const uint8_t *b, size_t n) {
    int far = 0;
    size_t k = code_mismatches(a, b, n, &far);
    printf("  %-52s %zu of %zu codes differ\n", what, k, n);
    CHECKF(k * 1000 <= n && !far, "%s: %zu of %zu codes differ%s", what, k, n, far ? ", some by more than 1" : "");
}

static void test_8bit(void) {
    size_t n = 70001, nb = (n + 255) / 256;
    printf("8-bit optimizer state (n=%zu, %zu blocks of 256)\n", n, nb);
    float maps[2][256];
    snug_dynamic_map(maps[0], 1);
    snug_dynamic_map(maps[1], 0);
    float *x = randf(n, -1, 1), *xu = randf(n, 0, 1);
    for (size_t i = 0; i < n; i++) { /* blocks of very different scales */
        float s = (float)pow(10.0, -6.0 + 6.0 * (double)((i / 256) % 7) / 6.0);
        x[i] *= s, xu[i] *= s * s;
    }
    /* quantize, then dequantize the CPU's codes on both */
    uint8_t *q[2][2];
    float *am[2][2], *deq[2];
    snug_backend *bes[2] = {cpu, gpu};
    for (int j = 0; j < 2; j++) {
        snug_backend *be = bes[j];
        float *d_code = up(be, maps, sizeof maps);
        for (int s = 0; s < 2; s++) {
            float *d_x = up(be, s ? xu : x, n * 4), *d_am = up(be, NULL, nb * 4);
            uint8_t *d_q = up(be, NULL, n);
            be->quantize_blockwise(be, d_q, d_am, d_x, d_code + 256 * s, !s, n);
            q[j][s] = malloc(n), am[j][s] = malloc(nb * 4);
            down(be, q[j][s], d_q, n), down(be, am[j][s], d_am, nb * 4), down(be, NULL, d_x, 0);
        }
        uint8_t *d_q = up(be, q[0][0], n);
        float *d_am = up(be, am[0][0], nb * 4), *d_x = up(be, NULL, n * 4);
        be->dequantize_blockwise(be, d_x, d_q, d_am, d_code, n);
        deq[j] = malloc(n * 4);
        down(be, deq[j], d_x, n * 4), down(be, NULL, d_q, 0), down(be, NULL, d_am, 0), down(be, NULL, d_code, 0);
    }
    expect_codes("quantize_blockwise codes (signed map)", q[1][0], q[0][0], n);
    expect_codes("quantize_blockwise codes (unsigned map)", q[1][1], q[0][1], n);
    expect_same("quantize_blockwise absmax (signed)", am[1][0], am[0][0], nb * 4);
    expect_same("quantize_blockwise absmax (unsigned)", am[1][1], am[0][1], nb * 4);
    expect_same("dequantize_blockwise", deq[1], deq[0], n * 4);

    /* two 8-bit AdamW steps from the CPU's codes; one gradient is inf */
    float *p = randf(n, -1, 1), *g = randf(n, -1, 1);
    g[300] = INFINITY;
    uint8_t *qm[2], *qv[2];
    float *pr[2], *amr[2], *avr[2];
    for (int j = 0; j < 2; j++) {
        snug_backend *be = bes[j];
        float *d_code = up(be, maps, sizeof maps), *d_p = up(be, p, n * 4), *d_g = up(be, g, n * 4);
        uint8_t *d_qm = up(be, q[0][0], n), *d_qv = up(be, q[0][1], n);
        float *d_am = up(be, am[0][0], nb * 4), *d_av = up(be, am[0][1], nb * 4);
        for (int step = 5; step <= 6; step++)
            be->adamw8bit(be, d_p, d_g, d_qm, d_qv, d_am, d_av, d_code, d_code + 256, n, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                          step, 0.5f);
        qm[j] = malloc(n), qv[j] = malloc(n), pr[j] = malloc(n * 4), amr[j] = malloc(nb * 4), avr[j] = malloc(nb * 4);
        down(be, pr[j], d_p, n * 4), down(be, qm[j], d_qm, n), down(be, qv[j], d_qv, n);
        down(be, amr[j], d_am, nb * 4), down(be, avr[j], d_av, nb * 4);
        down(be, NULL, d_code, 0), down(be, NULL, d_g, 0);
    }
    expect("adamw8bit p", rel(pr[1], pr[0], n), TOL);
    expect("adamw8bit absmax m", rel(amr[1], amr[0], nb), TOL);
    expect("adamw8bit absmax v", rel(avr[1], avr[0], nb), TOL);
    expect_codes("adamw8bit codes m", qm[1], qm[0], n);
    expect_codes("adamw8bit codes v", qv[1], qv[0], n);
    CHECKF(pr[1][300] == p[300], "adamw8bit leaves p where the gradient is inf");
    for (int j = 0; j < 2; j++) {
        for (int s = 0; s < 2; s++)
            free(q[j][s]), free(am[j][s]);
        free(deq[j]), free(qm[j]), free(qv[j]), free(pr[j]), free(amr[j]), free(avr[j]);
    }
    free(x), free(xu), free(p), free(g);
}

/* ------------------------------------------------------------------------------------------------ issue 17 cases */

/* embed_bwd sorts (id, token) keys and adds each id's tokens in token order: the CPU's additions in the CPU's order,
 * so the result is its bits. Repeated ids, one id for every token, a single token, and more tokens than one sort
 * segment (2048), so that the merges across segments run too. */
static void test_embed_bwd_bits(void) {
    printf("embed_bwd with repeated ids, bit for bit\n");
    struct { int N, C, rows, distinct; } cases[] = {{3001, 130, 61, 7}, {5000, 33, 40, 1}, {1, 77, 5, 1},
                                                    {2048, 64, 3000, 2500}, {9000, 20, 9001, 9001}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int N = cases[k].N, C = cases[k].C, rows = cases[k].rows;
        int32_t *ids = malloc((size_t)N * sizeof(int32_t));
        for (int n = 0; n < N; n++)
            ids[n] = (int32_t)((irand(cases[k].distinct) * 7 + 3) % rows);
        float *dout = randf((size_t)N * C, -1, 1), *dt0 = randf((size_t)rows * C, -1, 1);
        float *res[2];
        snug_backend *bes[2] = {cpu, gpu};
        for (int j = 0; j < 2; j++) {
            int32_t *d_ids = up(bes[j], ids, (size_t)N * 4);
            float *d_dout = up(bes[j], dout, (size_t)N * C * 4), *d_dt = up(bes[j], dt0, (size_t)rows * C * 4);
            bes[j]->embed_bwd(bes[j], d_dt, d_dout, d_ids, N, C);
            res[j] = malloc((size_t)rows * C * 4);
            down(bes[j], res[j], d_dt, (size_t)rows * C * 4);
            down(bes[j], NULL, d_ids, 0), down(bes[j], NULL, d_dout, 0);
        }
        char w[96];
        snprintf(w, sizeof w, "embed_bwd N=%d C=%d, %d distinct ids", N, C, cases[k].distinct);
        expect_same(w, res[1], res[0], (size_t)rows * C * 4);
        free(res[0]), free(res[1]), free(ids), free(dout), free(dt0);
    }
}

/* Head dims above 128 (Gemma's 256; 192 is zero-padded to 256): the tiled rung with 32-row tiles, plain, naive and
 * decode, forward and backward, against the CPU. */
static void test_attention_hd256(void) {
    test_attention_case(2, 150, 4, 2, 256, 1, 0); /* GQA 2:1, packed segments, T past a 32-row tile */
    test_attention_case(1, 97, 2, 1, 192, 0, 0);  /* causal, HD padded to 256 */
}

/* The smaller tiles a device with less shared memory per block gets (TILE 32 at HD 128, 16 at HD 256, e.g. on an
 * RTX 4090), forced here by SNUG_CUDA_ATTN, against the CPU; each backward twice, bit for bit. */
static void test_attention_small_tiles(void) {
    struct { int B, T, NH, NKV, HD; const char *force; } cases[] = {{2, 130, 4, 2, 128, "tiled32"},
                                                                  {1, 77, 2, 1, 80, "tiled32"},
                                                                  {2, 90, 4, 2, 256, "tiled16"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int B = cases[k].B, T = cases[k].T, NH = cases[k].NH, NKV = cases[k].NKV, HD = cases[k].HD;
        size_t N = (size_t)B * T, nq = N * (NH + 2 * NKV) * HD, no = N * NH * HD, nl = N * NH;
        printf("attention B=%d T=%d NH=%d NKV=%d HD=%d packed segments, SNUG_CUDA_ATTN=%s\n", B, T, NH, NKV, HD,
               cases[k].force);
        float *qkv = randf(nq, -1.5f, 1.5f), *dout = randf(no, -1, 1), *dq0 = randf(nq, -0.5f, 0.5f);
        int32_t *seg = make_seg(B, T);
        att_case c = {B, T, NH, NKV, HD, qkv, dout, dq0, seg};
        float *oc = malloc(no * 4), *lc = malloc(nl * 4), *dc = malloc(nq * 4);
        float *og = malloc(no * 4), *lg = malloc(nl * 4), *dg = malloc(nq * 4), *dg2 = malloc(nq * 4);
        run_attention(cpu, &c, oc, lc, dc, NULL);
        setenv("SNUG_CUDA_ATTN", cases[k].force, 1);
        run_attention(gpu, &c, og, lg, dg, dg2);
        unsetenv("SNUG_CUDA_ATTN");
        char w[96];
        snprintf(w, sizeof w, "attention_fwd out (%s)", cases[k].force);
        expect(w, rel(og, oc, no), TOL);
        snprintf(w, sizeof w, "attention_fwd lse (%s)", cases[k].force);
        expect(w, rel(lg, lc, nl), TOL);
        snprintf(w, sizeof w, "attention_bwd dqkv += (%s)", cases[k].force);
        expect(w, rel(dg, dc, nq), TOL);
        snprintf(w, sizeof w, "attention_bwd deterministic (%s)", cases[k].force);
        expect_same(w, dg, dg2, nq * 4);
        free(qkv), free(dout), free(dq0), free(seg), free(oc), free(lc), free(dc);
        free(og), free(lg), free(dg), free(dg2);
    }
}

/* T = 8192: the tiled rung (fp32) and the tc rung (bf16 math) against the CPU. Each output sums up to T terms in
 * fp32 in another order than the CPU's; random-sign rounding errors grow like sqrt(T) * FLT_EPSILON, so the fp32
 * tolerance is 4 sqrt(T) FLT_EPSILON (4.3e-5 here), or TOL where that is larger. On the emulated runtime, whose
 * fibers take minutes over 8192 (T = 8192 costs 64 times T = 1024's work), T = 1111: still 18 key tiles of 64 and a
 * last tile cut short. */
static void test_attention_long(void) {
#ifdef SNUG_CUDA_EMU
    int B = 1, T = 1111, NH = 2, NKV = 1, HD = 64;
#else
    int B = 1, T = 8192, NH = 2, NKV = 1, HD = 64;
#endif
    size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HD, nq = N * R, no = N * NH * HD, nl = N * NH;
    printf("attention B=%d T=%d NH=%d NKV=%d HD=%d causal (long T)\n", B, T, NH, NKV, HD);
    float *qkv = randf(nq, -1.5f, 1.5f), *dout = randf(no, -1, 1), *dq0 = randf(nq, -0.5f, 0.5f);
    att_case c = {B, T, NH, NKV, HD, qkv, dout, dq0, NULL};
    float *oc = malloc(no * 4), *lc = malloc(nl * 4), *dc = malloc(nq * 4);
    float *og = malloc(no * 4), *lg = malloc(nl * 4), *dg = malloc(nq * 4), *dg2 = malloc(nq * 4);
    run_attention(cpu, &c, oc, lc, dc, NULL);
    double tol = fmax(TOL, 4.0 * sqrt((double)T) * FLT_EPSILON);
    run_attention(gpu, &c, og, lg, dg, dg2);
    expect("attention_fwd out (tiled, long T)", rel(og, oc, no), tol);
    expect("attention_fwd lse (tiled, long T)", rel(lg, lc, nl), tol);
    expect("attention_bwd dqkv += (tiled, long T)", rel(dg, dc, nq), tol);
    expect_same("attention_bwd deterministic (tiled, long T)", dg, dg2, nq * 4);
    gpu->math = SNUG_DT_BF16;
    run_attention(gpu, &c, og, lg, dg, NULL);
    expect("attention_fwd out (tc, bf16, long T)", rel(og, oc, no), TOL_BF16);
    expect_abs("attention_fwd lse (tc, bf16, long T)", max_abs(lg, lc, nl), TOL_BF16_LSE);
    expect("attention_bwd dqkv += (tc, bf16, long T)", rel(dg, dc, nq), TOL_BF16);
    gpu->math = SNUG_DT_F32;
    CHECK(snug_backend_check(gpu, NULL) == 0);
    free(qkv), free(dout), free(dq0), free(oc), free(lc), free(dc), free(og), free(lg), free(dg), free(dg2);
}

/* The scratch is fixed when the backend is created: a backend sized for N tokens and NH heads runs the attention
 * backward (N*NH row sums) and the embedding backward (pow2(N) keys) of that shape, and records an error, without
 * allocating, for one token more. */
static void test_scratch_sized(void) {
    printf("scratch sized by the plan\n");
    int T = 1000, NH = 16, HD = 16, width = 32, C = 16;
    size_t bytes = snug_cuda_scratch_bytes((size_t)T, NH, width, 0);
    CHECKF(bytes == (size_t)T * NH * 4, "the attention row sums are the largest use here (%zu bytes)", bytes);
    snug_error e = {0};
    snug_backend *g = snug_backend_cuda_create_sized(0, bytes, &e);
    CHECKF(g != NULL, "%s", e.msg);
    if (!g)
        return;
    size_t R = (size_t)(3 * NH) * HD, Tm = (size_t)T + 1;
    float *qkv = randf(Tm * R, -1, 1), *dout = randf(Tm * NH * HD, -1, 1);
    int32_t *ids = malloc(Tm * 4);
    for (size_t n = 0; n < Tm; n++)
        ids[n] = (int32_t)(n % 5);
    float *d_qkv = up(g, qkv, Tm * R * 4), *d_dout = up(g, dout, Tm * NH * HD * 4);
    float *d_out = up(g, NULL, Tm * NH * HD * 4), *d_lse = up(g, NULL, Tm * NH * 4), *d_dq = up(g, NULL, Tm * R * 4);
    float *d_dt = up(g, NULL, (size_t)5 * C * 4);
    int32_t *d_ids = up(g, ids, Tm * 4);
    float scale = 0.25f;
    g->attention_fwd(g, d_out, d_lse, d_qkv, NULL, 1, T, NH, NH, HD, scale);
    g->attention_bwd(g, d_dq, d_dout, d_qkv, d_out, d_lse, NULL, 1, T, NH, NH, HD, scale);
    g->embed_bwd(g, d_dt, d_dout, d_ids, T, C);
    g->sync(g);
    CHECKF(snug_backend_check(g, &e) == 0, "the planned shape needs no more scratch: %s", e.msg);
    printf("  %-52s ok\n", "attention_bwd and embed_bwd at the planned N");
    g->attention_fwd(g, d_out, d_lse, d_qkv, NULL, 1, T + 1, NH, NH, HD, scale);
    g->attention_bwd(g, d_dq, d_dout, d_qkv, d_out, d_lse, NULL, 1, T + 1, NH, NH, HD, scale);
    g->sync(g);
    int rc = snug_backend_check(g, &e);
    CHECKF(rc != 0 && strstr(e.msg, "scratch"), "one token more is an error naming the scratch (rc %d: %s)", rc,
           rc ? e.msg : "none");
    printf("  %-52s %s\n", "attention_bwd at N+1", rc ? "error recorded" : "NO ERROR");
    down(g, NULL, d_qkv, 0), down(g, NULL, d_dout, 0), down(g, NULL, d_out, 0), down(g, NULL, d_lse, 0);
    down(g, NULL, d_dq, 0), down(g, NULL, d_dt, 0), down(g, NULL, d_ids, 0);
    g->destroy(g);
    free(qkv), free(dout), free(ids);
}

/* sumsq_acc / sumsq_take: the sum of the tensors' sumsq in call order, the bits of adding sumsq's results on the
 * host; take resets. copy_wait: an op queued after it sees the copy's data without a sync between. */
static void test_deferred(void) {
    printf("deferred sum of squares, copy_wait\n");
    size_t ns[3] = {1000, 77777, 3};
    snug_dtype dts[3] = {SNUG_DT_F32, SNUG_DT_BF16, SNUG_DT_F32};
    snug_backend *bes[2] = {cpu, gpu};
    double host[2] = {0, 0}, acc[2], again[2];
    for (int j = 0; j < 2; j++) { /* each backend against itself, on its own random tensors */
        void *d[3];
        for (int k = 0; k < 3; k++) {
            float *x = randf(ns[k], -2, 2);
            void *h = table_as(x, ns[k], dts[k]);
            d[k] = up(bes[j], h, ns[k] * snug_dtype_size(dts[k]));
            free(x), free(h);
        }
        for (int k = 0; k < 3; k++)
            host[j] += bes[j]->sumsq(bes[j], d[k], dts[k], ns[k]);
        for (int k = 0; k < 3; k++)
            bes[j]->sumsq_acc(bes[j], d[k], dts[k], ns[k]);
        acc[j] = bes[j]->sumsq_take(bes[j]);
        again[j] = bes[j]->sumsq_take(bes[j]);
        for (int k = 0; k < 3; k++)
            down(bes[j], NULL, d[k], 0);
    }
    expect_same("sumsq_acc + sumsq_take (cpu) = sumsq added on the host", &acc[0], &host[0], sizeof(double));
    expect_same("sumsq_acc + sumsq_take (cuda) = sumsq added on the host", &acc[1], &host[1], sizeof(double));
    CHECK(again[0] == 0.0 && again[1] == 0.0);

    size_t n = 4099;
    float *src = randf(n, -1, 1), *want = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        want[i] = 3.0f * src[i];
    float *h1 = gpu->host_alloc(gpu, n * 4), *h2 = gpu->host_alloc(gpu, n * 4), *d = up(gpu, NULL, n * 4);
    memcpy(h1, src, n * 4);
    gpu->copy_in_async(gpu, d, h1, n * 4);
    gpu->copy_wait(gpu); /* no host wait: the scale is ordered after the copy on the device */
    gpu->scale(gpu, d, 3.0f, n);
    gpu->copy_out_async(gpu, h2, d, n * 4);
    gpu->sync(gpu);
    expect_same("copy_in_async, copy_wait, scale, copy_out_async", h2, want, n * 4);
    gpu->host_free(gpu, h1), gpu->host_free(gpu, h2), gpu->free(gpu, d);
    free(src), free(want);
}

/* `test_cuda_ops gemm`: only the ops on cuBLASLt (run again on the emulated runtime with its stand-in refusing the bias
 * epilogue and the fast 16-bit compute types, so the backend's fallbacks are checked as well). */
int main(int argc, char **argv) {
    int gemm_only = argc > 1 && !strcmp(argv[1], "gemm"), attention_only = argc > 1 && !strcmp(argv[1], "attention");
    if (snug_cuda_device_count() == 0) {
        printf("test_cuda_ops: skipped: no CUDA GPU (built with CUDA: yes)\n");
        return 77;
    }
    snug_error e = {0};
    cpu = snug_backend_cpu_create(2);
    gpu = snug_backend_cuda_create(0, &e);
    if (!gpu) {
        fprintf(stderr, "test_cuda_ops: %s\n", e.msg);
        return 1;
    }
    printf("CUDA device: %s\n", snug_cuda_device_name(gpu));
    if (gemm_only) {
        test_matmul();
        test_adapter_ops();
        test_xent();
        test_gemm16();
        test_gemm_cache();
        test_bias_epilogue();
        test_matmul_w16();
        test_xent_gpt2_vocab();
        gpu->destroy(gpu);
        cpu->destroy(cpu);
        return check_finish("test_cuda_ops gemm");
    }
    if (attention_only) { /* the attention rungs alone (quick on the emulated runtime) */
        test_attention();
        test_attention_hd256();
        test_attention_small_tiles();
        test_attention_long();
        gpu->destroy(gpu);
        cpu->destroy(cpu);
        return check_finish("test_cuda_ops attention");
    }
    test_memory();
    test_embed();
    test_norm(0);
    test_norm(1);
    test_matmul();
    test_rope();
    test_attention();
    test_activations();
    test_elementwise();
    test_adapter_ops();
    test_rows();
    test_16bit();
    test_xent();
    test_gemm16();
    test_gemm_cache();
    test_bias_epilogue();
    test_matmul_w16();
    test_xent_gpt2_vocab();
    test_sumsq();
    test_adamw();
    test_8bit();
    test_embed_bwd_bits();
    test_attention_hd256();
    test_attention_small_tiles();
    test_attention_long();
    test_scratch_sized();
    test_deferred();
#ifdef SNUG_CUDA_EMU
    printf("timings: skipped on the emulated CUDA runtime (it has no GPU time)\n");
#else
    time_attention();
    time_gemm16();
#endif
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_finish("test_cuda_ops");
}

#else /* built without CUDA */

int main(void) {
    printf("test_cuda_ops: skipped: no CUDA GPU (built with CUDA: no)\n");
    return 77;
}

#endif
