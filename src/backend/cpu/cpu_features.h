/* cpu_features.h: what this x86-64 processor can run, read from cpuid and the OS's enabled register state (xgetbv).
 *
 * The CPU backend chooses its GEMM kernels (blas_cpu.c) and its bf16 path (gemm_cpu.c) from these features, never
 * from a table of model numbers: a processor newer than the installed libraries still gets the kernels its
 * instructions allow. On other architectures every flag is 0. */
#ifndef SNUG_CPU_FEATURES_H
#define SNUG_CPU_FEATURES_H

typedef struct {
    char vendor[13]; /* "GenuineIntel", "AuthenticAMD", ... ("" off x86) */
    int family, model; /* display family and model (cpuid leaf 1) */
    int avx, fma, avx2;                              /* with the OS saving the ymm state */
    int avx512f, avx512bw, avx512dq, avx512vl;       /* with the OS saving the zmm and mask state */
    int avx512_bf16, avx512_fp16, avx512_vnni;
    int amx_tile, amx_bf16;                          /* with the OS saving the tile state and, on Linux, the
                                                      * process allowed to use it (arch_prctl) */
    int amx_denied; /* the processor and OS have AMX tiles but the kernel refused this process their state */
} snug_cpu_features;

/* The raw words the features are decoded from: cpuid leaf 0 (max leaf, vendor), leaf 1, leaf 7 subleaf 0 and
 * subleaf 1, each {eax, ebx, ecx, edx}, and XCR0 (zero when leaf 1 says the OS has no OSXSAVE). */
typedef struct {
    unsigned int leaf0[4], leaf1[4], leaf7[4], leaf7_1[4];
    unsigned long long xcr0;
} snug_cpuid_words;

/* The features of the processor this runs on (read once, then cached). On Linux the first call also asks the kernel
 * for the AMX tile-data state (ARCH_REQ_XCOMP_PERM) when the processor and OS have it: oneDNN asks again itself. */
const snug_cpu_features *snug_cpu_features_get(void);

/* The features w describes, the OS's permission aside (amx_* as cpuid and XCR0 say). The bits, from the Intel SDM
 * vol. 2A and AMD APM vol. 3: leaf 1 ECX 12 FMA, 27 OSXSAVE, 28 AVX; leaf 7.0 EBX 5 AVX2, 16 AVX512F, 17 DQ, 30 BW,
 * 31 VL, ECX 11 AVX512-VNNI, EDX 22 AMX-BF16, 23 AVX512-FP16, 24 AMX-TILE; leaf 7.1 EAX 5 AVX512-BF16 (read only
 * when leaf 7.0 EAX, the last subleaf, is at least 1); XCR0 bits 1-2 SSE/AVX state, 5-7 opmask and zmm, 17-18 tile
 * configuration and data. */
void snug_cpu_features_decode(const snug_cpuid_words *w, snug_cpu_features *f);

/* "AVX-512 BF16 FP16 VNNI AMX-BF16", "AVX2 FMA", "AVX", "no AVX": the widest vector level, for messages */
const char *snug_cpu_features_level(const snug_cpu_features *f, char *buf, int n);

/* 3: AVX-512 F/BW/DQ/VL, 2: AVX2 + FMA, 1: AVX, 0: none of them */
int snug_cpu_vector_tier(const snug_cpu_features *f);

#endif
