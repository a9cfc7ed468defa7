/* test_cpu_gemm.c: where the CPU's GEMMs run under bf16, and the oneDNN path against fp32.
 *
 * 1. Detection and choice on the cpuid words of processors this machine is not: Sapphire Rapids (AMX) gets bf16,
 *    Cooper Lake and Zen 4 (AVX512-BF16 alone) get a measurement, Skylake-X and Zen 3 stay in fp32, and so do
 *    processors whose OS does not save the zmm or tile state; SNUG_CPU_GEMM's values; an unknown value refused.
 * 2. The oneDNN plumbing (dnnl_cpu.c) on every transpose, leading dimensions wider than the matrices, alpha, beta
 *    0 (C never read), 1 and 0.5, C a block of columns of a wider matrix, and products split into blocks by a small
 *    operand bound (in M, N and K with tails; in M alone, op(B) copied once); then through the backend (SNUG_CPU_GEMM): matmul_fwd with a bias, matmul_bwd accumulating,
 *    gemm_strided on a column block, the loss's three GEMMs over a 16-bit head. `test_cpu_gemm f32` runs it with
 *    oneDNN's f32 matmul, which every x86 CPU has, so the layouts are proven on any machine; `test_cpu_gemm bf16`
 *    runs the same problems with bf16 operands where this CPU and library have a fast bf16 matmul. Both also check
 *    16-bit operands read as stored (snug_dnnl_gemm_ex, matmul_w16_fwd/bwd, the loss over a 16-bit head, a bf16
 *    training step of small models) against their widened fp32 copies, bit for bit. Where either
 *    cannot run it prints SKIP and why and exits 77, which ctest reports as skipped (tests/tests.cmake). Without
 *    an argument: detection, choice, and the same backend ops on OpenBLAS.
 *
 * Tolerances are error bounds, not fitted constants: an fp32 product summed over K terms in any order is within
 * gamma_{K+4} * (|alpha| sum_p |a_ip b_pj| + |beta c_ij|) of the exact value (gamma_n = n u / (1 - n u), u = 2^-24;
 * the 4 covers alpha, beta, the final add and the K-blocked sums), and the double reference is within gamma_K of
 * 2^-53 of it. With bf16 operands the reference rounds the operands first (their products are exact in fp32); the
 * rounding itself moves each product by at most (2 v + v^2) |a b|, v = 2^-8 (bf16 keeps 8 significant bits).
 * OpenBLAS's measured error on the same problems is printed beside oneDNN's as the noise floor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/dnnl_cpu.h"
#include "backend/cpu/gemm_cpu.h"
#include "backend/cpu/ops_cpu.h"
#include "check.h"
#include "model/presets.h"
#include "train/engine.h"

/* ------------------------------------------------------------------------------------------ 1. detection, choice */

enum { SPR, SPR_NOTILES, SPR_NOSUB1, CPX, ZEN4, SKX, ZEN3, BF16_NOZMM, NOXSAVE, OLD };

/* cpuid words of real processors (or of them under an OS that withholds some state) */
static snug_cpuid_words words(int which) {
    snug_cpuid_words w = {0};
    const char *vendor = which == ZEN4 || which == ZEN3 ? "AuthenticAMD" : "GenuineIntel";
    memcpy(&w.leaf0[1], vendor, 4), memcpy(&w.leaf0[3], vendor + 4, 4), memcpy(&w.leaf0[2], vendor + 8, 4);
    w.leaf0[0] = which == OLD ? 6 : 0x20;
    unsigned fma_osxsave_avx = 1u << 12 | 1u << 27 | 1u << 28;
    unsigned avx2 = 1u << 5, avx512 = 1u << 16 | 1u << 17 | 1u << 30 | 1u << 31;
    unsigned vnni = 1u << 11, amx = 1u << 22 | 1u << 24, fp16 = 1u << 23, bf16 = 1u << 5;
    unsigned long long os512 = 0xe7, tiles = 0x60000;
    w.leaf1[2] = fma_osxsave_avx;
    w.leaf7[0] = 1; /* subleaf 1 exists */
    switch (which) {
    case SPR: case SPR_NOTILES: case SPR_NOSUB1: /* family 6 model 143 */
        w.leaf1[0] = 0x806f8;
        w.leaf7[1] = avx2 | avx512, w.leaf7[2] = vnni, w.leaf7[3] = amx | fp16, w.leaf7_1[0] = bf16;
        w.xcr0 = which == SPR_NOTILES ? os512 : os512 | tiles;
        if (which == SPR_NOSUB1)
            w.leaf7[0] = 0;
        break;
    case CPX: /* family 6 model 85 stepping 11 */
        w.leaf1[0] = 0x5065b;
        w.leaf7[1] = avx2 | avx512, w.leaf7[2] = vnni, w.leaf7_1[0] = bf16, w.xcr0 = os512;
        break;
    case ZEN4: /* family 25 model 17 */
        w.leaf1[0] = 0xa10f10;
        w.leaf7[1] = avx2 | avx512, w.leaf7[2] = vnni, w.leaf7_1[0] = bf16, w.xcr0 = os512;
        break;
    case SKX: /* family 6 model 85 stepping 4 */
        w.leaf1[0] = 0x50654;
        w.leaf7[1] = avx2 | avx512, w.leaf7[2] = vnni, w.xcr0 = os512;
        break;
    case ZEN3: /* family 25 model 1 */
        w.leaf1[0] = 0xa00f10;
        w.leaf7[1] = avx2, w.xcr0 = 0x7;
        break;
    case BF16_NOZMM: /* AVX-512 BF16 reported, zmm state not saved by the OS (a hypervisor's choice) */
        w.leaf1[0] = 0x5065b;
        w.leaf7[1] = avx2 | avx512, w.leaf7_1[0] = bf16, w.xcr0 = 0x7;
        break;
    case NOXSAVE: /* every feature bit, but no OSXSAVE: XCR0 cannot be read, no AVX at all */
        w.leaf1[0] = 0x806f8, w.leaf1[2] = 1u << 12 | 1u << 28;
        w.leaf7[1] = avx2 | avx512, w.leaf7[3] = amx, w.leaf7_1[0] = bf16, w.xcr0 = os512 | tiles;
        break;
    case OLD: /* no leaf 7 */
        w.leaf1[0] = 0x206a7, w.xcr0 = 0x7;
        break;
    }
    return w;
}

static void test_decode(void) {
    snug_cpu_features f;
    snug_cpuid_words w = words(SPR);
    snug_cpu_features_decode(&w, &f);
    CHECKF(!strcmp(f.vendor, "GenuineIntel") && f.family == 6 && f.model == 143, "SPR: %s %d %d", f.vendor, f.family,
           f.model);
    CHECK(snug_cpu_vector_tier(&f) == 3 && f.avx512_bf16 && f.avx512_fp16 && f.avx512_vnni && f.amx_tile &&
          f.amx_bf16);
    w = words(SPR_NOTILES);
    snug_cpu_features_decode(&w, &f);
    CHECKF(!f.amx_tile && !f.amx_bf16 && f.avx512_bf16, "tiles not saved by the OS: no AMX");
    w = words(SPR_NOSUB1);
    snug_cpu_features_decode(&w, &f);
    CHECKF(!f.avx512_bf16 && f.amx_bf16, "leaf 7 subleaf 1 read only when leaf 7 says it exists");
    w = words(ZEN4);
    snug_cpu_features_decode(&w, &f);
    CHECKF(!strcmp(f.vendor, "AuthenticAMD") && f.family == 25 && f.model == 17 && f.avx512_bf16 && !f.amx_bf16,
           "Zen 4: %s %d %d bf16 %d", f.vendor, f.family, f.model, f.avx512_bf16);
    w = words(ZEN3);
    snug_cpu_features_decode(&w, &f);
    CHECK(snug_cpu_vector_tier(&f) == 2 && !f.avx512f && !f.avx512_bf16 && !f.amx_tile);
    w = words(BF16_NOZMM);
    snug_cpu_features_decode(&w, &f);
    CHECKF(snug_cpu_vector_tier(&f) == 2 && !f.avx512_bf16, "no zmm state: no AVX-512 and no AVX512-BF16");
    w = words(NOXSAVE);
    snug_cpu_features_decode(&w, &f);
    CHECKF(snug_cpu_vector_tier(&f) == 0 && !f.avx512_bf16 && !f.amx_tile, "no OSXSAVE: no AVX state at all");
    w = words(OLD);
    snug_cpu_features_decode(&w, &f);
    CHECK(snug_cpu_vector_tier(&f) == 1 && !f.avx2);
    snug_cpuid_words none = {0};
    snug_cpu_features_decode(&none, &f);
    CHECK(!f.vendor[0] && snug_cpu_vector_tier(&f) == 0);
}

static void test_plan(void) {
    struct {
        int cpu, denied;
        snug_dtype math;
        const char *force;
        snug_cpu_gemm_kind want;
        int forced;
        const char *why; /* a part of the reason */
    } cases[] = {
        {SPR, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_BF16, 0, "AMX"},
        {SPR, 0, SNUG_DT_BF16, "auto", SNUG_CPU_GEMM_BF16, 0, "AMX"},
        {SPR, 0, SNUG_DT_F32, NULL, SNUG_CPU_GEMM_OPENBLAS, 0, ""}, /* fp32 runs stay exact */
        {SPR, 0, SNUG_DT_F16, NULL, SNUG_CPU_GEMM_OPENBLAS, 0, ""},
        {SPR, 1, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_MEASURE, 0, "refused"},
        {SPR_NOTILES, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_MEASURE, 0, "AVX512-BF16"},
        {SPR_NOSUB1, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_BF16, 0, "AMX"},
        {CPX, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_MEASURE, 0, "AVX512-BF16"},
        {ZEN4, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_MEASURE, 0, "AVX512-BF16"},
        {SKX, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_OPENBLAS, 0, "no bf16 units (AVX-512 VNNI)"},
        {ZEN3, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_OPENBLAS, 0, "no bf16 units (AVX2 FMA)"},
        {BF16_NOZMM, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_OPENBLAS, 0, "no bf16 units"},
        {NOXSAVE, 0, SNUG_DT_BF16, NULL, SNUG_CPU_GEMM_OPENBLAS, 0, "no bf16 units (no AVX)"},
        {ZEN3, 0, SNUG_DT_BF16, "bf16", SNUG_CPU_GEMM_BF16, 1, "SNUG_CPU_GEMM=bf16"},
        {ZEN3, 0, SNUG_DT_F32, "BF16", SNUG_CPU_GEMM_OPENBLAS, 1, "bf16 runs only"},
        {SPR, 0, SNUG_DT_BF16, "openblas", SNUG_CPU_GEMM_OPENBLAS, 1, "SNUG_CPU_GEMM=openblas"},
        {ZEN3, 0, SNUG_DT_F32, "f32", SNUG_CPU_GEMM_DNNL_F32, 1, "SNUG_CPU_GEMM=f32"},
        {SPR, 0, SNUG_DT_BF16, "f32", SNUG_CPU_GEMM_DNNL_F32, 1, "SNUG_CPU_GEMM=f32"},
        {ZEN3, 0, SNUG_DT_BF16, "", SNUG_CPU_GEMM_OPENBLAS, 0, "no bf16 units"},
    };
    static const char *kinds[] = {"openblas", "bf16", "measure", "dnnl-f32"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snug_cpuid_words w = words(cases[i].cpu);
        snug_cpu_features f;
        snug_cpu_features_decode(&w, &f);
        if (cases[i].denied) /* what snug_cpu_features_get leaves when arch_prctl refuses the tile state */
            f.amx_tile = f.amx_bf16 = 0, f.amx_denied = 1;
        snug_cpu_gemm_kind k;
        int forced;
        char why[256];
        snug_error e = {0};
        int rc = snug_cpu_gemm_plan(cases[i].math, &f, cases[i].force, &k, &forced, why, sizeof why, &e);
        CHECKF(rc == 0 && k == cases[i].want && forced == cases[i].forced &&
                   (cases[i].why[0] ? strstr(why, cases[i].why) != NULL : why[0] == 0),
               "case %zu: rc %d, %s%s (%s), want %s (%s)", i, rc, kinds[k], forced ? " forced" : "", why,
               kinds[cases[i].want], cases[i].why);
    }
    snug_cpu_features f;
    snug_cpuid_words w = words(SPR);
    snug_cpu_features_decode(&w, &f);
    snug_cpu_gemm_kind k;
    int forced;
    char why[256];
    snug_error e = {0};
    int rc = snug_cpu_gemm_plan(SNUG_DT_BF16, &f, "amx", &k, &forced, why, sizeof why, &e);
    CHECKF(rc != 0 && e.code == SNUG_EINPUT && strstr(e.msg, "SNUG_CPU_GEMM=amx") && strstr(e.msg, "openblas"),
           "an unknown SNUG_CPU_GEMM is refused with the choices: %s", e.msg);
    /* the measured choice keeps the faster, and fp32 on a tie; PyTorch's 165 against 257 GFLOP/s keeps fp32 */
    CHECK(!snug_cpu_bf16_measured_faster(165, 257) && snug_cpu_bf16_measured_faster(300, 257) &&
          !snug_cpu_bf16_measured_faster(257, 257) && !snug_cpu_bf16_measured_faster(-1, 257));
    /* the OpenBLAS kernels for the same words: the AVX512-BF16 ones */
    CHECK(!strcmp(snug_blas_coretype_for(&f), "Cooperlake"));
}

/* ----------------------------------------------------------------------------------- 2. the oneDNN plumbing */

static const double U32 = 5.9604644775390625e-08, U64 = 1.1102230246251565e-16, U16 = 3.90625e-03;
static double gam(double n, double u) { return n * u / (1.0 - n * u); }

static float r16(float x) { return snug_bf16_to_f32(snug_f32_to_bf16(x)); }

static unsigned rng = 1;
static float uni(void) { /* in [-1, 1), 24 random bits */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}
static float *rand_mat(size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = uni();
    return x;
}

typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
} prob;

static float opa(const prob *p, const float *A, int i, int k) {
    return p->ta ? A[(size_t)k * p->lda + i] : A[(size_t)i * p->lda + k];
}
static float opb(const prob *p, const float *B, int k, int j) {
    return p->tb ? B[(size_t)j * p->ldb + k] : B[(size_t)k * p->ldb + j];
}

/* The worst ratio |got - exact| / bound over C's entries (<= 1 passes; inf for a NaN). With bf16 (the operands
 * rounded to bf16 by the GEMM) the reference rounds them too, and *raw gets the worst ratio against the unrounded
 * product with the rounding's bound added. *rel: the worst |got - exact| over the largest |exact|, for the log. */
static double judge(const prob *p, const float *A, const float *B, const float *C0, const float *got, int bf16,
                    double *rel, double *raw) {
    double worst = 0, wraw = 0, err = 0, big = 1e-30, g = gam(p->K + 4, U32) + gam(p->K, U64);
    for (int i = 0; i < p->M; i++)
        for (int j = 0; j < p->N; j++) {
            double s = 0, mag = 0, s0 = 0, mag0 = 0;
            for (int k = 0; k < p->K; k++) {
                float a = opa(p, A, i, k), b = opb(p, B, k, j);
                double x = bf16 ? (double)r16(a) * r16(b) : (double)a * b;
                s += x, mag += fabs(x), s0 += (double)a * b, mag0 += fabs((double)a * b);
            }
            double c0 = p->beta != 0.0f ? C0[(size_t)i * p->ldc + j] : 0.0, y = got[(size_t)i * p->ldc + j];
            double exact = p->alpha * s + p->beta * c0, bound = g * (fabs(p->alpha) * mag + fabs(p->beta * c0));
            double r = fabs(y - exact) / (bound > 0 ? bound : 1e-300);
            worst = isnan(y) ? INFINITY : fmax(worst, r);
            double exact0 = p->alpha * s0 + p->beta * c0;
            double bound0 = bound + fabs(p->alpha) * (2 * U16 + U16 * U16) * mag0;
            wraw = isnan(y) ? INFINITY : fmax(wraw, fabs(y - exact0) / (bound0 > 0 ? bound0 : 1e-300));
            err = fmax(err, fabs(y - exact)), big = fmax(big, fabs(exact));
        }
    if (rel)
        *rel = err / big;
    if (raw)
        *raw = wraw;
    return worst;
}

/* C's columns outside [col0, col0 + N) of every row, and rows below M, hold their sentinel */
static int guards_kept(const float *Cw, int rows, int ldc, int col0, int M, int N, float sentinel) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < ldc; j++)
            if ((i >= M || j < col0 || j >= col0 + N) && Cw[(size_t)i * ldc + j] != sentinel)
                return 0;
    return 1;
}

/* every transpose and beta, leading dimensions wider than the matrices, C a column block of a wider matrix */
static void test_plumbing(snug_dnnl *d, const char *what, int bf16, int M, int N, int K) {
    const int col0 = 3, extra = 2; /* C's block starts at column 3 of rows of N + 7; 2 rows below it */
    double worst = 0, worst_raw = 0, rel_d = 0, rel_b = 0;
    int kept = 1, all = 1;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bi = 0; bi < 3; bi++) {
                prob p = {ta, tb, M, N, K, (ta ? M : K) + 3, (tb ? K : N) + 5, N + 7, 0.7f,
                          bi == 0 ? 0.0f : bi == 1 ? 1.0f : 0.5f};
                int rows = M + extra;
                float *A = rand_mat((size_t)(ta ? K : M) * p.lda), *B = rand_mat((size_t)(tb ? N : K) * p.ldb);
                float *Cw = malloc(sizeof(float) * rows * p.ldc), *Bl = malloc(sizeof(float) * rows * p.ldc);
                float *C0 = malloc(sizeof(float) * rows * p.ldc);
                for (int i = 0; i < rows * p.ldc; i++)
                    C0[i] = uni();
                const float sentinel = 12345.0f;
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < p.ldc; j++) {
                        int in = i < M && j >= col0 && j < col0 + N;
                        /* beta 0: C must not be read, so it starts as NaN */
                        float v = in ? (p.beta == 0.0f ? NAN : C0[i * p.ldc + j]) : sentinel;
                        Cw[i * p.ldc + j] = Bl[i * p.ldc + j] = v;
                    }
                int rc = snug_dnnl_gemm(d, ta, tb, M, N, K, p.alpha, A, p.lda, B, p.ldb, p.beta, Cw + col0, p.ldc);
                snug_cpu_sgemm(ta, tb, M, N, K, p.alpha, A, p.lda, B, p.ldb, p.beta, Bl + col0, p.ldc);
                if (rc) {
                    all = 0;
                    fprintf(stderr, "  %s ta=%d tb=%d beta=%g: %s\n", what, ta, tb, p.beta, snug_dnnl_error());
                } else {
                    double rd, rb, raw;
                    double w = judge(&p, A, B, C0 + col0, Cw + col0, bf16, &rd, &raw);
                    if (w > 1)
                        fprintf(stderr, "  %s ta=%d tb=%d beta=%g: error %.3g of its bound\n", what, ta, tb,
                                p.beta, w);
                    worst = fmax(worst, w), worst_raw = fmax(worst_raw, raw), rel_d = fmax(rel_d, rd);
                    judge(&p, A, B, C0 + col0, Bl + col0, 0, &rb, NULL);
                    rel_b = fmax(rel_b, rb);
                    kept = kept && guards_kept(Cw, rows, p.ldc, col0, M, N, sentinel);
                }
                free(A), free(B), free(Cw), free(Bl), free(C0);
            }
    printf("  %s %dx%dx%d, 4 transposes x beta 0/1/0.5: worst error %.2f of the bound%s; largest error %.2g "
           "(OpenBLAS fp32 %.2g)\n", what, M, N, K, worst, bf16 ? " (bf16 operands)" : "", rel_d, rel_b);
    CHECKF(all, "%s: oneDNN computed every problem", what);
    CHECKF(worst <= 1, "%s: within the fp32 error bound (%.3g)", what, worst);
    if (bf16)
        CHECKF(worst_raw <= 1, "%s: within the bound of rounding the operands to bf16 (%.3g)", what, worst_raw);
    CHECKF(kept, "%s: nothing written outside C's block", what);
}

/* ------------------------------------------------------------------------------------ through the backend */

/* a CPU backend whose set_math ran with SNUG_CPU_GEMM=force (NULL: unset); NULL with e filled when it refused */
static snug_backend *backend(const char *force, snug_dtype math, snug_error *e) {
    if (force)
        setenv("SNUG_CPU_GEMM", force, 1);
    else
        unsetenv("SNUG_CPU_GEMM");
    snug_backend *be = snug_backend_cpu_create(2);
    int rc = be ? snug_backend_set_math(be, math, 48, 160, 96, e) : -1;
    unsetenv("SNUG_CPU_GEMM");
    if (rc && be) {
        be->destroy(be);
        be = NULL;
    }
    return be;
}

/* matmul_fwd with a bias, matmul_bwd accumulating into non-zero gradients, gemm_strided on a column block, the
 * loss's GEMMs over a bf16 head in blocks: each result judged against its exact value from its own inputs */
static void test_backend(snug_backend *be, const char *what, int bf16) {
    int N = 45, C = 70, OC = 33;
    float *inp = rand_mat((size_t)N * C), *w = rand_mat((size_t)OC * C), *bias = rand_mat(OC);
    float *out = rand_mat((size_t)N * OC), *C0 = malloc(sizeof(float) * N * OC);
    double worst = 0, raw = 0, r;
    for (int n = 0; n < N; n++)
        memcpy(C0 + (size_t)n * OC, bias, sizeof(float) * OC);
    be->matmul_fwd(be, out, inp, w, bias, N, C, OC);
    prob fwd = {0, 1, N, OC, C, C, C, OC, 1.0f, 1.0f}; /* out = inp w^T + bias (the bias written first) */
    worst = fmax(worst, judge(&fwd, inp, w, C0, out, bf16, NULL, &r)), raw = fmax(raw, r);

    float *dout = rand_mat((size_t)N * OC), *dinp = rand_mat((size_t)N * C), *dw = rand_mat((size_t)OC * C);
    float *dinp0 = malloc(sizeof(float) * N * C), *dw0 = malloc(sizeof(float) * OC * C);
    float *db = rand_mat(OC), *db0 = malloc(sizeof(float) * OC);
    memcpy(dinp0, dinp, sizeof(float) * N * C), memcpy(dw0, dw, sizeof(float) * OC * C);
    memcpy(db0, db, sizeof(float) * OC);
    be->matmul_bwd(be, dinp, dw, db, dout, inp, w, N, C, OC);
    prob bx = {0, 0, N, C, OC, OC, C, C, 1.0f, 1.0f}, bw = {1, 0, OC, C, N, OC, C, C, 1.0f, 1.0f};
    worst = fmax(worst, judge(&bx, dout, w, dinp0, dinp, bf16, NULL, &r)), raw = fmax(raw, r);
    worst = fmax(worst, judge(&bw, dout, inp, dw0, dw, bf16, NULL, &r)), raw = fmax(raw, r);
    double dberr = 0; /* a column sum in double, no GEMM: rounded to fp32, then added in fp32 (two roundings) */
    for (int j = 0; j < OC; j++) {
        double s = 0;
        for (int n = 0; n < N; n++)
            s += dout[(size_t)n * OC + j];
        dberr = fmax(dberr, fabs(db[j] - (db0[j] + s)) / (gam(2, U32) * (2 * fabs(s) + fabs(db0[j])) + 1e-300));
    }
    CHECKF(dberr <= 1, "%s: dbias accumulates the column sums (%.3g of the bound)", what, dberr);

    /* LoRA's product into a block of q's columns: out[:, 5:5+r] += s * u (N, r) @ B (r, r)^T, ld 20 */
    int R = 8, ld = 20;
    float *u = rand_mat((size_t)N * R), *Bm = rand_mat((size_t)R * R), *wide = rand_mat((size_t)N * ld);
    float *wide0 = malloc(sizeof(float) * N * ld);
    memcpy(wide0, wide, sizeof(float) * N * ld);
    be->gemm_strided(be, 0, 1, N, R, R, 0.5f, u, R, Bm, R, 1.0f, wide + 5, ld);
    prob lo = {0, 1, N, R, R, R, R, ld, 0.5f, 1.0f};
    worst = fmax(worst, judge(&lo, u, Bm, wide0 + 5, wide + 5, bf16, NULL, &r)), raw = fmax(raw, r);
    int untouched = 1;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < ld; j++)
            if ((j < 5 || j >= 5 + R) && wide[(size_t)n * ld + j] != wide0[(size_t)n * ld + j])
                untouched = 0;
    CHECKF(untouched, "%s: gemm_strided wrote only its block of columns", what);

    /* the loss over a bf16 head (V, C) converted 50 rows at a time: the logits, dh = G w and dw = G^T h, judged
     * from the G the backend left in logits_ws (one chunk: all N rows) */
    int V = 173, wb = 50;
    float *h = rand_mat((size_t)N * C), *wf = rand_mat((size_t)V * C), *logits = malloc(sizeof(float) * N * V);
    float *wws = malloc(sizeof(float) * wb * C), *dh = rand_mat((size_t)N * C), *dwh = rand_mat((size_t)V * C);
    float *dh0 = malloc(sizeof(float) * N * C), *dwh0 = malloc(sizeof(float) * V * C);
    uint16_t *w16 = malloc(sizeof(uint16_t) * V * C);
    int32_t *labels = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < V * C; i++)
        w16[i] = snug_f32_to_bf16(wf[i]), wf[i] = snug_bf16_to_f32(w16[i]);
    for (int n = 0; n < N; n++)
        labels[n] = n % 7 == 3 ? -100 : (n * 37) % V;
    memcpy(dh0, dh, sizeof(float) * N * C), memcpy(dwh0, dwh, sizeof(float) * V * C);
    double loss = be->xent_fwd_bwd(be, dh, dwh, h, w16, SNUG_DT_BF16, labels, N, C, V, 0.25f, logits, N, wws, wb);
    /* the loss from exact logits; each logit within gamma * sum |h w| of exact, which moves a row's loss by at most
     * twice that, and expf/logf by a few ulps of each term (4 u per row) */
    double ref = 0, lbound = 0;
    for (int n = 0; n < N; n++) {
        if (labels[n] < 0)
            continue;
        double mx = -1e300, zy = 0, dz = 0, sum = 0, *z = malloc(sizeof(double) * V);
        for (int v = 0; v < V; v++) {
            double s = 0, mag = 0;
            for (int c = 0; c < C; c++) {
                double x = bf16 ? (double)r16(h[(size_t)n * C + c]) * wf[(size_t)v * C + c]
                                : (double)h[(size_t)n * C + c] * wf[(size_t)v * C + c];
                s += x, mag += fabs(x);
            }
            z[v] = s, mx = fmax(mx, s), dz = fmax(dz, gam(C + 4, U32) * mag);
        }
        for (int v = 0; v < V; v++)
            sum += exp(z[v] - mx);
        zy = z[labels[n]];
        double l = mx + log(sum) - zy;
        ref += l, lbound += 2 * dz + 4 * U32 * (fabs(l) + fabs(mx) + fabs(zy));
        free(z);
    }
    double lerr = fabs(loss - ref) / lbound;
    CHECKF(lerr <= 1, "%s: the loss %.9g against %.9g exact: %.3g of its bound", what, loss, ref, lerr);
    prob pdh = {0, 0, N, C, V, V, C, C, 1.0f, 1.0f}, pdw = {1, 0, V, C, N, V, C, C, 1.0f, 1.0f};
    worst = fmax(worst, judge(&pdh, logits, wf, dh0, dh, bf16, NULL, &r)), raw = fmax(raw, r);
    worst = fmax(worst, judge(&pdw, logits, h, dwh0, dwh, bf16, NULL, &r)), raw = fmax(raw, r);

    printf("  %s: matmul_fwd+bias, matmul_bwd, gemm_strided, loss GEMMs: worst error %.2f of the bound; loss %.2f "
           "of its bound\n", what, worst, lerr);
    CHECKF(worst <= 1, "%s: every backend GEMM within its bound (%.3g)", what, worst);
    if (bf16)
        CHECKF(raw <= 1, "%s: within the bound of bf16 operands against the unrounded product (%.3g)", what, raw);
    snug_error e = {0};
    CHECKF(snug_backend_check(be, &e) == 0, "%s: no failure recorded: %s", what, e.msg);
    free(inp), free(w), free(bias), free(out), free(C0), free(dout), free(dinp), free(dw), free(dinp0), free(dw0);
    free(db), free(db0), free(u), free(Bm), free(wide), free(wide0), free(h), free(wf), free(logits), free(wws);
    free(dh), free(dwh), free(dh0), free(dwh0), free(w16), free(labels);
}

/* ------------------------------------------------------------------ 16-bit operands, read as they are stored */

/* x (n) rounded to dt and stored in x16; x replaced by the widened values */
static void to_dt(float *x, uint16_t *x16, size_t n, snug_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        x16[i] = dt == SNUG_DT_BF16 ? snug_f32_to_bf16(x[i]) : snug_f32_to_f16(x[i]);
        x[i] = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(x16[i]) : snug_f16_to_f32(x16[i]);
    }
}

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

/* snug_dnnl_gemm_ex with 16-bit operands (each transpose; dense, so read in place, and with a wider leading
 * dimension, so copied; one block and blocked) against snug_dnnl_gemm on their widened fp32 copies: the same bits */
static void test_dnnl16(snug_dnnl *d, const char *what, snug_dtype dt) {
    int M = 37, N = 29, K = 53, bad = 0, n = 0;
    for (int blocked = 0; blocked < 2; blocked++) {
        snug_dnnl_set_operand_bytes(d, blocked ? 2 * 1000 : 0);
        for (int wide = 0; wide < 2; wide++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    int lda = (ta ? M : K) + 3 * wide, ldb = (tb ? K : N) + 3 * wide;
                    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
                    float *A = rand_mat(na), *B = rand_mat(nb), *C = rand_mat((size_t)M * N);
                    float *C16 = malloc(sizeof(float) * M * N), *C16a = malloc(sizeof(float) * M * N);
                    uint16_t *A16 = malloc(2 * na), *B16 = malloc(2 * nb);
                    to_dt(A, A16, na, dt), to_dt(B, B16, nb, dt);
                    memcpy(C16, C, sizeof(float) * M * N), memcpy(C16a, C, sizeof(float) * M * N);
                    int rc = snug_dnnl_gemm(d, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C, N);
                    rc |= snug_dnnl_gemm_ex(d, ta, tb, M, N, K, 0.5f, A, SNUG_DT_F32, lda, B16, dt, ldb, 1.0f, C16,
                                            N);
                    rc |= snug_dnnl_gemm_ex(d, ta, tb, M, N, K, 0.5f, A16, dt, lda, B16, dt, ldb, 1.0f, C16a, N);
                    bad += rc != 0 || !same(C, C16, (size_t)M * N) || !same(C, C16a, (size_t)M * N);
                    n++;
                    free(A), free(B), free(C), free(C16), free(C16a), free(A16), free(B16);
                }
    }
    snug_dnnl_set_operand_bytes(d, 0);
    printf("  %s, %s operands as stored: %d problems, %d differ from their fp32 copies' bits\n", what,
           snug_dtype_name(dt), n, bad);
    CHECKF(bad == 0, "%s: %s operands as stored give the bits of their fp32 copies (%d of %d problems differ)", what,
           snug_dtype_name(dt), bad, n);
}

/* matmul_w16_fwd/bwd against matmul_fwd/bwd on the widened weight, and the loss over a 16-bit head read as stored
 * against the same loss with the slots cleared (the head widened into w_ws): the same bits. slots: 1 when the
 * backend is expected to fill them. */
static void test_w16(snug_backend *be, const char *what, int slots) {
    CHECKF((be->matmul_w16_fwd != NULL) == slots && (be->matmul_w16_bwd != NULL) == slots,
           "%s: the matmul_w16 slots %s", what, slots ? "filled" : "empty");
    if (!slots)
        return;
    int N = 45, C = 70, OC = 33, V = 173, wb = 50;
    float *inp = rand_mat((size_t)N * C), *w = rand_mat((size_t)OC * C), *bias = rand_mat(OC);
    uint16_t *w16 = malloc(2 * (size_t)OC * C);
    to_dt(w, w16, (size_t)OC * C, SNUG_DT_BF16);
    float *o1 = malloc(sizeof(float) * N * OC), *o2 = malloc(sizeof(float) * N * OC);
    be->matmul_fwd(be, o1, inp, w, bias, N, C, OC);
    be->matmul_w16_fwd(be, o2, inp, w16, SNUG_DT_BF16, bias, N, C, OC);
    CHECKF(same(o1, o2, (size_t)N * OC), "%s: matmul_w16_fwd gives matmul_fwd's bits", what);
    float *dout = rand_mat((size_t)N * OC), *dx1 = rand_mat((size_t)N * C), *dw1 = rand_mat((size_t)OC * C);
    float *db1 = rand_mat(OC), *dx2 = malloc(sizeof(float) * N * C), *dw2 = malloc(sizeof(float) * OC * C);
    float *db2 = malloc(sizeof(float) * OC);
    memcpy(dx2, dx1, sizeof(float) * N * C), memcpy(dw2, dw1, sizeof(float) * OC * C), memcpy(db2, db1, 4 * OC);
    be->matmul_bwd(be, dx1, dw1, db1, dout, inp, w, N, C, OC);
    be->matmul_w16_bwd(be, dx2, dw2, db2, dout, inp, w16, SNUG_DT_BF16, N, C, OC);
    CHECKF(same(dx1, dx2, (size_t)N * C) && same(dw1, dw2, (size_t)OC * C) && same(db1, db2, OC),
           "%s: matmul_w16_bwd gives matmul_bwd's bits", what);

    float *h = rand_mat((size_t)N * C), *hw = rand_mat((size_t)V * C), *wws = malloc(sizeof(float) * wb * C);
    uint16_t *h16 = malloc(2 * (size_t)V * C);
    to_dt(hw, h16, (size_t)V * C, SNUG_DT_BF16);
    int32_t *labels = malloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++)
        labels[n] = n % 5 == 2 ? -100 : (n * 41) % V;
    float *lg = malloc(sizeof(float) * N * V), *dh[2], *dwh[2];
    double loss[2];
    void (*fwd)(snug_backend *, float *, const float *, const void *, snug_dtype, const float *, int, int, int) =
        be->matmul_w16_fwd;
    void (*bwd)(snug_backend *, float *, float *, float *, const float *, const float *, const void *, snug_dtype,
                int, int, int) = be->matmul_w16_bwd;
    for (int r = 0; r < 2; r++) { /* r 0: as stored; r 1: widened block by block, the path without the slots */
        dh[r] = calloc((size_t)N * C, sizeof(float)), dwh[r] = calloc((size_t)V * C, sizeof(float));
        if (r)
            be->matmul_w16_fwd = NULL, be->matmul_w16_bwd = NULL;
        loss[r] = be->xent_fwd_bwd(be, dh[r], dwh[r], h, h16, SNUG_DT_BF16, labels, N, C, V, 0.125f, lg, 16, wws,
                                   wb);
    }
    be->matmul_w16_fwd = fwd, be->matmul_w16_bwd = bwd;
    printf("  %s: matmul_w16_fwd/bwd and the loss over a bf16 head as stored: the bits of the widened weights\n",
           what);
    CHECKF(!memcmp(&loss[0], &loss[1], sizeof(double)) && same(dh[0], dh[1], (size_t)N * C) &&
               same(dwh[0], dwh[1], (size_t)V * C),
           "%s: the loss over a 16-bit head read as stored gives the bits of the widened head (%.17g, %.17g)", what,
           loss[0], loss[1]);
    free(inp), free(w), free(bias), free(w16), free(o1), free(o2), free(dout), free(dx1), free(dw1), free(db1);
    free(dx2), free(dw2), free(db2), free(h), free(hw), free(wws), free(h16), free(labels), free(lg);
    for (int r = 0; r < 2; r++)
        free(dh[r]), free(dwh[r]);
}

/* OpenBLAS's path for a 16-bit operand (a problem oneDNN refused): widened, then the fp32 product, the same bits as
 * the product of the widened copies; the matrices fit one block */
static void test_widened(snug_backend *be) {
    int M = 31, N = 27, K = 40, bad = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
            float *A = rand_mat(na), *B = rand_mat(nb), *C = rand_mat((size_t)M * N);
            float *C2 = malloc(sizeof(float) * M * N);
            uint16_t *A16 = malloc(2 * na), *B16 = malloc(2 * nb);
            to_dt(A, A16, na, SNUG_DT_F16), to_dt(B, B16, nb, SNUG_DT_BF16);
            memcpy(C2, C, sizeof(float) * M * N);
            snug_cpu_gemm(be, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.5f, C, N);
            snug_cpu_gemm_ex(be, ta, tb, M, N, K, 1.0f, A16, SNUG_DT_F16, lda, B16, SNUG_DT_BF16, ldb, 0.5f, C2, N);
            bad += !same(C, C2, (size_t)M * N);
            free(A), free(B), free(C), free(C2), free(A16), free(B16);
        }
    CHECKF(bad == 0, "OpenBLAS: 16-bit operands widened give the bits of their fp32 copies (%d of 4 differ)", bad);
}

/* A bf16 training step of small Llama and GPT-2 models (GQA, tied and untied heads, biases, LayerNorm) with the
 * backend's matmul_w16 slots, against the same step with them cleared (every layer widened into wl, the head into
 * w_ws): the same loss and gradients, bit for bit, once with selective checkpointing too. force: SNUG_CPU_GEMM. */
static void test_model16(const char *force) {
    for (int k = 0; k < 3; k++) {
        snug_model_config c;
        snug_error e = {0};
        snug_preset(&c, k == 2 ? "gpt2-124m" : "tiny-llama", 61, &e);
        if (k == 2)
            c.hidden_size = 32, c.intermediate_size = 128, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 4;
        else
            c.hidden_size = 48, c.intermediate_size = 72, c.n_layer = 2, c.n_head = 6, c.n_kv_head = 2;
        c.max_position = 64, c.tie_embeddings = k >= 1; /* GPT-2 always ties its head (hf_config.c) */
        c.head_dim = c.hidden_size / c.n_head;
        enum { B = 2, T = 13 };
        snug_levers lv = {.ckpt = k == 1 ? SNUG_CKPT_SELECTIVE : SNUG_CKPT_NONE, .ckpt_every = 1, .dt = SNUG_DT_BF16};
        snug_plan_spec spec = {.cfg = c, .B = B, .T = T, .lv = lv, .with_grads = 1};
        snug_engine g;
        setenv("SNUG_CPU_GEMM", force, 1);
        int rc = snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 2, &e);
        unsetenv("SNUG_CPU_GEMM");
        CHECKF(rc == 0, "engine: %s", e.msg);
        if (rc)
            return;
        snug_model *m = &g.model;
        CHECKF(g.be->matmul_w16_fwd != NULL, "SNUG_CPU_GEMM=%s fills the matmul_w16 slots", force);
        snug_model_init_random(m, 11);
        int32_t ids[B * T], labels[B * T], pos[B * T];
        for (int i = 0; i < B * T; i++)
            ids[i] = (i * 7 + 3) % c.vocab_size, labels[i] = i % 6 == 0 ? -100 : (i * 5 + 1) % c.vocab_size,
            pos[i] = i % T;
        snug_model_set_batch(m, ids, labels, pos, NULL, B, T);
        size_t ng = m->grads_numel, n16 = m->grads16_numel;
        float *g32[2];
        uint16_t *g16[2];
        double loss[2];
        void (*fwd)(snug_backend *, float *, const float *, const void *, snug_dtype, const float *, int, int, int) =
            g.be->matmul_w16_fwd;
        void (*bwd)(snug_backend *, float *, float *, float *, const float *, const float *, const void *,
                    snug_dtype, int, int, int) = g.be->matmul_w16_bwd;
        for (int r = 0; r < 2; r++) { /* r 0: the weights as stored; r 1: the slots cleared */
            if (r)
                g.be->matmul_w16_fwd = NULL, g.be->matmul_w16_bwd = NULL;
            g.be->zero(g.be, m->grads, ng * sizeof(float));
            loss[r] = snug_model_step(m, 1.0f / 20);
            g32[r] = malloc(ng * sizeof(float)), g16[r] = malloc(n16 * 2);
            memcpy(g32[r], m->grads, ng * sizeof(float)), memcpy(g16[r], m->grads16, n16 * 2);
        }
        g.be->matmul_w16_fwd = fwd, g.be->matmul_w16_bwd = bwd;
        printf("  %s%s, SNUG_CPU_GEMM=%s: bf16 step, loss %.17g as stored, %.17g widened\n",
               k == 2 ? "gpt2" : "llama", k == 1 ? " (tied, selective)" : "", force, loss[0], loss[1]);
        CHECKF(n16 > 0 && !memcmp(&loss[0], &loss[1], sizeof(double)) && same(g32[0], g32[1], ng) &&
                   !memcmp(g16[0], g16[1], n16 * 2),
               "%s%s, SNUG_CPU_GEMM=%s: a bf16 step reading the weights as stored gives the bits of the widened "
               "ones (loss %.17g, %.17g)", k == 2 ? "gpt2" : "llama", k == 1 ? " (tied, selective)" : "", force,
               loss[0], loss[1]);
        for (int r = 0; r < 2; r++)
            free(g32[r]), free(g16[r]);
        snug_engine_free(&g);
    }
}

/* The first line of a file (its rates) */
static int read_rates(const char *path, double *gb, double *gf) {
    FILE *fp = fopen(path, "r");
    int ok = fp && fscanf(fp, "%lf %lf", gb, gf) == 2;
    if (fp)
        fclose(fp);
    return ok;
}

static void write_rates(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    if (fp)
        fputs(text, fp), fclose(fp);
}

/* Where bf16 and fp32 are timed against each other (AVX512-BF16 without AMX), the timing is kept on disk and every
 * later backend of the same shape reads it instead of timing again: the kept rates decide, whichever way. */
static void test_kept_choice(void) {
    const snug_cpu_features *f = snug_cpu_features_get();
    snug_cpu_gemm_kind k;
    int forced;
    char why[256], dir[] = "/tmp/snug-gemm-XXXXXX";
    snug_error e = {0};
    snug_cpu_gemm_plan(SNUG_DT_BF16, f, NULL, &k, &forced, why, sizeof why, &e);
    if (k != SNUG_CPU_GEMM_MEASURE || !mkdtemp(dir)) {
        printf("  the kept timing: not on this CPU (bf16 %s)\n", k == SNUG_CPU_GEMM_MEASURE ? "timed" : why);
        return;
    }
    const char *old = getenv("XDG_CACHE_HOME");
    char *saved = old ? strdup(old) : NULL;
    setenv("XDG_CACHE_HOME", dir, 1);
    snug_backend *a = backend(NULL, SNUG_DT_BF16, &e);
    const char *kept = a ? strstr(a->gemm, "kept in ") : NULL;
    CHECKF(kept != NULL, "the first backend keeps its timing: %s", a ? a->gemm : e.msg);
    char path[4096] = "";
    if (kept)
        sscanf(kept + 8, "%4095[^;)]", path);
    double gb = -1, gf = -1;
    CHECKF(!strncmp(path, dir, strlen(dir)) && read_rates(path, &gb, &gf) && gb >= 0 && gf >= 0,
           "the rates are in a file under XDG_CACHE_HOME: '%s'", path);
    int first_bf16 = a && !strncmp(a->gemm, "oneDNN", 6);
    CHECKF(first_bf16 == (gb > gf), "the choice is the faster of the kept rates (%.1f against %.1f): %s", gb, gf,
           a ? a->gemm : "");
    if (a)
        a->destroy(a);
    for (int t = 0; t < 2 && path[0]; t++) { /* whatever is kept decides, either way, with no timing of its own */
        write_rates(path, t ? "5.0 900.0\n" : "900.0 5.0\n");
        snug_backend *b = backend(NULL, SNUG_DT_BF16, &e);
        CHECKF(b && strstr(b->gemm, "read from ") && strstr(b->gemm, t ? "900 GFLOP/s fp32" : "900 against 5") &&
                   !strncmp(b->gemm, t ? "OpenBLAS" : "oneDNN", t ? 8 : 6),
               "kept rates %s: %s", t ? "fp32 faster -> OpenBLAS" : "bf16 faster -> oneDNN", b ? b->gemm : e.msg);
        if (b)
            b->destroy(b);
    }
    write_rates(path, "garbage\n"); /* an unreadable file is timed again, and left as it is */
    snug_backend *c = backend(NULL, SNUG_DT_BF16, &e);
    CHECKF(c && !strstr(c->gemm, "read from ") && !strstr(c->gemm, "kept in "), "an unreadable file is not used: %s",
           c ? c->gemm : e.msg);
    if (c)
        c->destroy(c);
    printf("  the kept timing: %s decides every later backend of its shape\n", path);
    unlink(path);
    char sub[64];
    snprintf(sub, sizeof sub, "%s/snug/gemm", dir), rmdir(sub);
    snprintf(sub, sizeof sub, "%s/snug", dir), rmdir(sub);
    rmdir(dir);
    if (saved)
        setenv("XDG_CACHE_HOME", saved, 1), free(saved);
    else
        unsetenv("XDG_CACHE_HOME");
}

/* The oneDNN path with operands of one dtype: the raw GEMM, then every op of a backend forced onto it.
 * 0 when it ran; 1 when this build, library or CPU has no fast matmul of that dtype (SKIP printed, with why). */
static int test_dnnl(int bf16) {
    const char *name = bf16 ? "oneDNN bf16" : "oneDNN f32", *force = bf16 ? "bf16" : "f32";
    snug_error e = {0};
    snug_backend *be = backend(force, bf16 ? SNUG_DT_BF16 : SNUG_DT_F32, &e);
    if (!be) { /* refused, and said so, only when oneDNN cannot run it: then the raw GEMM is refused too */
        CHECKF(e.code == SNUG_EINPUT && strstr(e.msg, bf16 ? "SNUG_CPU_GEMM=bf16" : "SNUG_CPU_GEMM=f32"),
               "SNUG_CPU_GEMM=%s refused with its reason: %s", force, e.msg);
        snug_dnnl *d = snug_dnnl_create(bf16 ? SNUG_DT_BF16 : SNUG_DT_F32, 2);
        CHECKF(!d || !snug_dnnl_impl(d, 0, 1, 48, 160, 96), "%s refused by the backend but not by oneDNN", name);
        snug_dnnl_destroy(d);
        printf("test_cpu_gemm: SKIP %s: %s\n", name, e.msg);
        return 1;
    }
    printf("  %s, SNUG_CPU_GEMM=%s: gemm %s\n", snug_dnnl_version(), force, be->gemm);
    CHECKF(!strncmp(be->gemm, "oneDNN", 6) && strstr(be->gemm, bf16 ? " bf16 (SNUG_CPU_GEMM=bf16)" :
                                                                    " f32 (SNUG_CPU_GEMM=f32)"), "%s", be->gemm);
    snug_dnnl *d = snug_dnnl_create(bf16 ? SNUG_DT_BF16 : SNUG_DT_F32, 2);
    const char *impl = d ? snug_dnnl_impl(d, 0, 1, 37, 29, 53) : NULL;
    CHECKF(impl != NULL, "%s: %s", name, snug_dnnl_error());
    if (impl) {
        printf("  %s: %s\n", name, impl);
        test_plumbing(d, name, bf16, 37, 29, 53);
        /* a small operand bound: blocks of 64 in M and N with tails, K in blocks of 7, the cache evicting */
        snug_dnnl_set_operand_bytes(d, (bf16 ? 2 : 4) * 1000);
        char blocked[64];
        snprintf(blocked, sizeof blocked, "%s blocked", name);
        test_plumbing(d, blocked, bf16, 100, 90, 70);
        /* K whole and op(B) one block (copied once): op(A) in blocks of 64 rows and a tail */
        snug_dnnl_set_operand_bytes(d, (bf16 ? 2 : 4) * 6000);
        snprintf(blocked, sizeof blocked, "%s blocked in M", name);
        test_plumbing(d, blocked, bf16, 150, 20, 70);
        CHECKF(snug_dnnl_bytes(d) > 0 && snug_dnnl_bytes(d) < ((size_t)64 << 20), "%s holds %zu bytes", name,
               snug_dnnl_bytes(d));
    }
    if (impl) {
        test_dnnl16(d, name, SNUG_DT_BF16);
        if (!bf16) /* widened exactly; a bf16 context would round fp16 values */
            test_dnnl16(d, name, SNUG_DT_F16);
    }
    snug_dnnl_destroy(d);
    test_backend(be, bf16 ? "backend, oneDNN bf16" : "backend, oneDNN f32", bf16);
    test_w16(be, bf16 ? "backend, oneDNN bf16" : "backend, oneDNN f32", 1);
    test_model16(force);
    be->destroy(be);
    if (bf16)
        test_kept_choice();
    return 0;
}

/* The choice on this machine, the fp32 line, a bad SNUG_CPU_GEMM, and the backend ops on OpenBLAS */
static void test_backends(void) {
    snug_error e = {0};
    /* this machine, unforced: a bf16 run says where its GEMMs run and why */
    const snug_cpu_features *f = snug_cpu_features_get();
    snug_cpu_gemm_kind k;
    int forced;
    char why[256];
    snug_cpu_gemm_plan(SNUG_DT_BF16, f, NULL, &k, &forced, why, sizeof why, &e);
    snug_backend *be = backend(NULL, SNUG_DT_BF16, &e);
    CHECKF(be != NULL, "a bf16 CPU backend: %s", e.msg);
    if (be) {
        printf("  this CPU, bf16 run: gemm %s\n", be->gemm);
        if (k == SNUG_CPU_GEMM_OPENBLAS)
            CHECKF(!strncmp(be->gemm, "OpenBLAS", 8) && strstr(be->gemm, why) &&
                       strstr(be->gemm, "fp32 GEMMs under bf16"),
                   "OpenBLAS with the reason (%s): %s", why, be->gemm);
        else /* bf16 units: oneDNN, or OpenBLAS with the reason it is not */
            CHECKF(!strncmp(be->gemm, "oneDNN", 6) || strstr(be->gemm, "fp32 GEMMs under bf16"), "%s", be->gemm);
        be->destroy(be);
    }
    be = backend(NULL, SNUG_DT_F32, &e);
    CHECKF(be && !strcmp(be->gemm, snug_cpu_blas_describe()), "an fp32 run: OpenBLAS's line alone: %s",
           be ? be->gemm : e.msg);
    if (be)
        be->destroy(be);
    be = backend("nonsense", SNUG_DT_BF16, &e);
    CHECKF(!be && e.code == SNUG_EINPUT && strstr(e.msg, "SNUG_CPU_GEMM=nonsense"), "unknown value refused: %s",
           e.msg);
    be = backend("openblas", SNUG_DT_BF16, &e);
    CHECKF(be && strstr(be->gemm, "SNUG_CPU_GEMM=openblas"), "%s", be ? be->gemm : e.msg);
    if (be) {
        test_backend(be, "backend, OpenBLAS", 0);
        test_w16(be, "backend, OpenBLAS", 0);
        test_widened(be);
        be->destroy(be);
    }
}

/* test_cpu_gemm: detection, choice, OpenBLAS; test_cpu_gemm f32 | bf16: the oneDNN path with that dtype, exit 77
 * (ctest: skipped) where it cannot run */
int main(int argc, char **argv) {
    unsetenv("OPENBLAS_CORETYPE");
    CHECKF(snug_cpu_blas_load() == 0, "BLAS loads: %s", snug_cpu_blas_error());
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "f32") || !strcmp(mode, "bf16")) {
        char name[64];
        snprintf(name, sizeof name, "test_cpu_gemm %s", mode);
        int skipped = test_dnnl(!strcmp(mode, "bf16"));
        int rc = check_finish(name);
        return rc ? rc : skipped ? 77 : 0;
    }
    test_decode();
    test_plan();
    test_backends();
    return check_finish("test_cpu_gemm");
}
