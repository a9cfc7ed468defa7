/* test_blas.c: the GEMM kernels are chosen from the CPU's features, never left at OpenBLAS's generic SSE ones.
 *
 * The choice itself on the feature sets of processors this machine is not (an AVX-512 BF16 Xeon newer than the
 * installed OpenBLAS's model table among them), then the library as snug opens it here: the kernels it reports need
 * no less than this CPU's vector tier (AVX2, AVX-512), the header line names them, and a GEMM through the loaded
 * library agrees with a double-precision product. OPENBLAS_CORETYPE is removed first, so what is tested is snug's own
 * choice even when the suite runs with a kernel forced by hand. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/blas_cpu.h"
#include "check.h"

static snug_cpu_features feat(const char *vendor, int tier, int bf16) {
    snug_cpu_features f = {0};
    snprintf(f.vendor, sizeof f.vendor, "%s", vendor);
    f.avx = tier >= 1;
    f.avx2 = f.fma = tier >= 2;
    f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = tier >= 3;
    f.avx512_bf16 = f.avx512_fp16 = f.avx512_vnni = bf16;
    return f;
}

static void test_choice(void) {
    struct {
        const char *vendor;
        int tier, bf16;
        const char *want;
    } cases[] = {
        {"GenuineIntel", 3, 1, "Cooperlake"}, /* family 6 model 207: AVX-512 BF16/FP16/VNNI, unknown to OpenBLAS 0.3.21 */
        {"GenuineIntel", 3, 0, "SkylakeX"},   {"AuthenticAMD", 3, 1, "Cooperlake"}, /* Zen 4 */
        {"GenuineIntel", 2, 0, "Haswell"},    {"AuthenticAMD", 2, 0, "Zen"},
        {"HygonGenuine", 2, 0, "Zen"},        {"GenuineIntel", 1, 0, "Sandybridge"},
        {"GenuineIntel", 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snug_cpu_features f = feat(cases[i].vendor, cases[i].tier, cases[i].bf16);
        const char *got = snug_blas_coretype_for(&f);
        CHECKF(cases[i].want ? got && !strcmp(got, cases[i].want) : got == NULL, "%s tier %d: chose %s, want %s",
               cases[i].vendor, cases[i].tier, got ? got : "(none)", cases[i].want ? cases[i].want : "(none)");
        CHECKF(snug_cpu_vector_tier(&f) == cases[i].tier, "tier of the synthetic features");
        if (got) /* the kernels chosen need exactly the tier the CPU has: never less, never an instruction it lacks */
            CHECKF(snug_blas_core_tier(got) == cases[i].tier, "%s needs tier %d, CPU has %d", got,
                   snug_blas_core_tier(got), cases[i].tier);
    }
    /* OpenBLAS's generic kernels, and its names in any case */
    CHECK(snug_blas_core_tier("Prescott") == 0 && snug_blas_core_tier("Core2") == 0 &&
          snug_blas_core_tier("Nehalem") == 0 && snug_blas_core_tier("") == 0);
    CHECK(snug_blas_core_tier("SKYLAKEX") == 3 && snug_blas_core_tier("zen") == 2);
    /* a processor without the OS's ymm state saved has no AVX, whatever cpuid's feature bit says */
    snug_cpu_features none = {0};
    CHECK(snug_cpu_vector_tier(&none) == 0);
}

static void test_loaded(void) {
    int rc = snug_cpu_blas_load();
    CHECKF(rc == 0, "BLAS loads: %s", snug_cpu_blas_error());
    if (rc)
        return;
    const snug_cpu_features *f = snug_cpu_features_get();
    char level[96];
    const char *k = snug_cpu_blas_kernel(), *line = snug_cpu_blas_describe();
    int tier = snug_cpu_vector_tier(f);
    printf("  CPU %s family %d model %d: %s\n  kernels %s from %s\n  header: %s\n", f->vendor, f->family, f->model,
           snug_cpu_features_level(f, level, sizeof level), k, snug_cpu_blas_path(), line);
    CHECKF(snug_blas_core_tier(k) >= tier, "GEMM kernels %s need tier %d but this CPU has tier %d (%s): a slower "
           "kernel than the CPU allows", k, snug_blas_core_tier(k), tier, level);
    if (tier >= 2)
        CHECKF(snug_blas_core_tier(k) >= 2, "generic GEMM kernels (%s) on a CPU with %s", k, level);
    CHECKF(strstr(line, k) != NULL, "header names the kernels: %s", line);
    if (snug_blas_coretype_for(f)) /* an x86 CPU with AVX at least: snug chose */
        CHECKF(strstr(line, "chosen from cpuid") != NULL, "header says the kernels were chosen from cpuid: %s", line);

    /* a product through the loaded library: op(A) (M,K) @ op(B) (K,N) for every transpose, awkward sizes */
    int M = 37, N = 29, K = 53;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C = malloc(sizeof(float) * M * N);
    srand(7);
    for (int i = 0; i < M * K; i++)
        A[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < K * N; i++)
        B[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            for (int i = 0; i < M * N; i++)
                C[i] = 1.0f;
            /* A is stored (M,K) or, transposed, (K,M); B (K,N) or (N,K) */
            snug_cpu_sgemm(ta, tb, M, N, K, 2.0f, A, ta ? M : K, B, tb ? K : N, 0.5f, C, N);
            double worst = 0, scale = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int p = 0; p < K; p++)
                        s += (double)(ta ? A[p * M + i] : A[i * K + p]) * (tb ? B[j * K + p] : B[p * N + j]);
                    double ref = 2.0 * s + 0.5;
                    worst = fmax(worst, fabs(C[i * N + j] - ref)), scale = fmax(scale, fabs(ref));
                }
            /* fp32 products summed over K = 53 terms: within K ulps of the largest entry */
            CHECKF(worst <= K * 1.2e-7 * scale, "sgemm ta=%d tb=%d: max error %.3g of %.3g", ta, tb, worst, scale);
        }
    free(A), free(B), free(C);
}

int main(void) {
    unsetenv("OPENBLAS_CORETYPE");
    test_choice();
    test_loaded();
    return check_finish("test_blas");
}
