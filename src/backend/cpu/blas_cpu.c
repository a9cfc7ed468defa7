/* blas_cpu.c: opening OpenBLAS with kernels chosen from the processor's features (see blas_cpu.h).
 *
 * OpenBLAS built with DYNAMIC_ARCH (every distribution's) reads OPENBLAS_CORETYPE in its load-time constructor and
 * otherwise matches cpuid's family/model against the models it knew when it was released. The feature ladder here:
 * AVX-512 F/BW/DQ/VL -> SkylakeX (Cooperlake with AVX512-BF16; the fp32 GEMM kernels are SkylakeX's), AVX2 + FMA ->
 * Haswell (Zen on AMD: the same kernels with AMD's blocking), AVX -> Sandybridge. */
#include "backend/cpu/blas_cpu.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef SNUG_OPENBLAS_PATH
#define SNUG_OPENBLAS_PATH "libopenblas.so.0"
#endif

/* The CBLAS ABI: enums are ints (CblasRowMajor 101, CblasNoTrans 111, CblasTrans 112), blasint is int in the LP64
 * builds distributions ship as libopenblas.so.0. */
typedef void (*sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);
static struct {
    int loaded;
    sgemm_fn sgemm;
    void *handle;
    void (*set_threads)(int);
    char kernel[64], path[1024], line[512], error[1024];
} blas;

const char *snug_blas_coretype_for(const snug_cpu_features *f) {
    switch (snug_cpu_vector_tier(f)) {
    case 3:
        return f->avx512_bf16 ? "Cooperlake" : "SkylakeX";
    case 2:
        return !strcmp(f->vendor, "AuthenticAMD") || !strcmp(f->vendor, "HygonGenuine") ? "Zen" : "Haswell";
    case 1:
        return "Sandybridge";
    default:
        return NULL;
    }
}

int snug_blas_core_tier(const char *c) {
    static const struct {
        const char *name;
        int tier;
    } cores[] = {{"SkylakeX", 3},    {"Cooperlake", 3}, {"SapphireRapids", 3}, {"Haswell", 2},     {"Zen", 2},
                 {"Sandybridge", 1}, {"Bulldozer", 1},  {"Piledriver", 1},     {"Steamroller", 1}, {"Excavator", 1}};
    for (size_t i = 0; i < sizeof cores / sizeof *cores; i++)
        if (!strcasecmp(c, cores[i].name))
            return cores[i].tier;
    return 0;
}

const char *snug_cpu_blas_error(void) { return blas.error; }

int snug_cpu_blas_load(void) {
    if (blas.loaded)
        return 0;
    const snug_cpu_features *f = snug_cpu_features_get();
    const char *user = getenv("OPENBLAS_CORETYPE"), *choice = NULL;
    if (!user || !*user) {
        choice = snug_blas_coretype_for(f);
        if (choice)
            setenv("OPENBLAS_CORETYPE", choice, 1);
    }
    const char *env = getenv("SNUG_BLAS");
    const char *cands[3] = {env && *env ? env : NULL, SNUG_OPENBLAS_PATH, "libopenblas.so.0"};
    void *h = NULL;
    char why[512] = "";
    for (int i = 0; i < 3 && !h; i++) {
        if (!cands[i])
            continue;
        h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && !why[0])
            snprintf(why, sizeof why, "%s", dlerror());
        if (!h && i == 0) /* a path the user named must be the one used */
            break;
    }
    if (!h || !(blas.sgemm = (sgemm_fn)dlsym(h, "cblas_sgemm"))) {
        snprintf(blas.error, sizeof blas.error, "cannot open the BLAS library (%s); install Debian's "
                 "libopenblas0-openmp (scripts/setup.sh) or point SNUG_BLAS at a libopenblas.so.0",
                 h ? "it has no cblas_sgemm" : why);
        if (h)
            dlclose(h);
        return -1;
    }
    blas.handle = h;
    blas.set_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
    char *(*corename)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
    char *(*config)(void) = (char *(*)(void))dlsym(h, "openblas_get_config");
    snprintf(blas.kernel, sizeof blas.kernel, "%s", corename ? corename() : "");
    Dl_info di;
    snprintf(blas.path, sizeof blas.path, "%s", dladdr((void *)blas.sgemm, &di) && di.dli_fname ? di.dli_fname : "");

    char name[64] = "BLAS", lib[24], version[24], level[96];
    /* "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64": the first two words */
    if (config && sscanf(config(), "%23s %23s", lib, version) == 2)
        snprintf(name, sizeof name, "%s %s", lib, version);
    snug_cpu_features_level(f, level, sizeof level);
    const char *how = choice ? "chosen from cpuid" : user && *user ? "OPENBLAS_CORETYPE from the environment"
                                                                      : "the library's own choice";
    int slow = blas.kernel[0] && snug_blas_core_tier(blas.kernel) < snug_cpu_vector_tier(f);
    const char *fix = !slow ? "" : choice ? "; slower than this CPU allows: this OpenBLAS lacks the kernels asked for"
                                          : "; slower than this CPU allows: unset OPENBLAS_CORETYPE";
    snprintf(blas.line, sizeof blas.line, "%s, %s kernels (%s; CPU: %s)%s", name, blas.kernel[0] ? blas.kernel : "its",
             how, level, fix);
    blas.loaded = 1;
    return 0;
}

void snug_cpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    int ldb, float beta, float *C, int ldc) {
    blas.sgemm(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void snug_cpu_blas_set_threads(int n) {
    if (blas.set_threads)
        blas.set_threads(n);
}

void *snug_cpu_blas_symbol(const char *name) {
    return snug_cpu_blas_load() == 0 ? dlsym(blas.handle, name) : NULL;
}

const char *snug_cpu_blas_kernel(void) { return blas.kernel; }
const char *snug_cpu_blas_path(void) { return blas.path; }
const char *snug_cpu_blas_describe(void) { return blas.line; }
