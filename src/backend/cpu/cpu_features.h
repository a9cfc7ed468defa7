/* cpu_features.h: what this x86-64 processor can run, read from cpuid and the OS's enabled register state (xgetbv).
 *
 * The CPU backend chooses its GEMM kernels (blas_cpu.c) and its bf16 path from these features, never from a table of
 * model numbers: a processor newer than the installed libraries still gets the kernels its instructions allow. On
 * other architectures every flag is 0. */
#ifndef SNUG_CPU_FEATURES_H
#define SNUG_CPU_FEATURES_H

typedef struct {
    char vendor[13]; /* "GenuineIntel", "AuthenticAMD", ... ("" off x86) */
    int family, model; /* display family and model (cpuid leaf 1) */
    int avx, fma, avx2;                              /* with the OS saving the ymm state */
    int avx512f, avx512bw, avx512dq, avx512vl;       /* with the OS saving the zmm and mask state */
    int avx512_bf16, avx512_fp16, avx512_vnni;
    int amx_tile, amx_bf16;                          /* with the OS saving the tile state */
} snug_cpu_features;

/* The features of the processor this runs on (read once, then cached). */
const snug_cpu_features *snug_cpu_features_get(void);

/* "AVX-512 BF16 FP16 VNNI", "AVX2 FMA", "AVX", "no AVX": the widest vector level, for messages */
const char *snug_cpu_features_level(const snug_cpu_features *f, char *buf, int n);

/* 3: AVX-512 F/BW/DQ/VL, 2: AVX2 + FMA, 1: AVX, 0: none of them */
int snug_cpu_vector_tier(const snug_cpu_features *f);

#endif
