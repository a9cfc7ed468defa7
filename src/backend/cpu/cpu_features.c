/* cpu_features.c: cpuid and xgetbv, read once and decoded (see cpu_features.h).
 *
 * An instruction set counts only when the OS also saves its registers on a context switch (XCR0): a hypervisor may
 * report AVX-512 and still leave the zmm state off, and AMX tiles must be enabled by the kernel and, on Linux 5.16
 * and later, granted to the process (the tile data is 8 KiB of extra state per thread, given only on request).
 * Reading the words and decoding them are separate so that tests can decode the words of processors this is not. */
#include "backend/cpu/cpu_features.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long xcr0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void read_words(snug_cpuid_words *w) {
    unsigned int *r;
    memset(w, 0, sizeof *w);
    r = w->leaf0;
    if (!__get_cpuid(0, &r[0], &r[1], &r[2], &r[3]))
        return;
    r = w->leaf1;
    __get_cpuid(1, &r[0], &r[1], &r[2], &r[3]);
    w->xcr0 = (w->leaf1[2] >> 27) & 1 ? xcr0() : 0;
    if (w->leaf0[0] < 7)
        return;
    r = w->leaf7;
    __cpuid_count(7, 0, r[0], r[1], r[2], r[3]);
    r = w->leaf7_1;
    if (w->leaf7[0] >= 1)
        __cpuid_count(7, 1, r[0], r[1], r[2], r[3]);
}
#else
static void read_words(snug_cpuid_words *w) { memset(w, 0, sizeof *w); }
#endif

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Whether this process may use the AMX tile data: asked for once (idempotent; what oneDNN does as well). */
static int amx_permitted(void) {
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) == 0 && (mask >> XFEATURE_XTILEDATA) & 1)
        return 1;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) == 0 && (mask >> XFEATURE_XTILEDATA) & 1;
}
#else
static int amx_permitted(void) { return 1; }
#endif

void snug_cpu_features_decode(const snug_cpuid_words *w, snug_cpu_features *f) {
    memset(f, 0, sizeof *f);
    if (!w->leaf0[0] && !w->leaf0[1])
        return;
    memcpy(f->vendor, &w->leaf0[1], 4), memcpy(f->vendor + 4, &w->leaf0[3], 4), memcpy(f->vendor + 8, &w->leaf0[2], 4);
    f->vendor[12] = 0;
    unsigned int a = w->leaf1[0], c = w->leaf1[2];
    int fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
    if (fam == 0xf)
        fam += (a >> 20) & 0xff;
    if (fam == 0x6 || fam >= 0xf)
        mod |= ((a >> 16) & 0xf) << 4;
    f->family = fam, f->model = mod;
    unsigned long long x = (c >> 27) & 1 ? w->xcr0 : 0;
    int ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xe0) == 0xe0, tiles = (x & 0x60000) == 0x60000;
    f->avx = ymm && ((c >> 28) & 1);
    f->fma = f->avx && ((c >> 12) & 1);
    if (w->leaf0[0] < 7)
        return;
    unsigned int b7 = w->leaf7[1], c7 = w->leaf7[2], d7 = w->leaf7[3];
    unsigned int a71 = w->leaf7[0] >= 1 ? w->leaf7_1[0] : 0;
    f->avx2 = f->avx && ((b7 >> 5) & 1);
    f->avx512f = zmm && ((b7 >> 16) & 1);
    f->avx512dq = f->avx512f && ((b7 >> 17) & 1);
    f->avx512bw = f->avx512f && ((b7 >> 30) & 1);
    f->avx512vl = f->avx512f && ((b7 >> 31) & 1);
    f->avx512_vnni = f->avx512f && ((c7 >> 11) & 1);
    f->avx512_fp16 = f->avx512f && ((d7 >> 23) & 1);
    f->avx512_bf16 = f->avx512f && ((a71 >> 5) & 1);
    f->amx_tile = tiles && ((d7 >> 24) & 1);
    f->amx_bf16 = f->amx_tile && ((d7 >> 22) & 1);
}

const snug_cpu_features *snug_cpu_features_get(void) {
    static snug_cpu_features f;
    static int done;
    if (!done) {
        snug_cpuid_words w;
        read_words(&w);
        snug_cpu_features_decode(&w, &f);
        if (f.amx_tile && !amx_permitted())
            f.amx_tile = f.amx_bf16 = 0, f.amx_denied = 1;
        done = 1;
    }
    return &f;
}

int snug_cpu_vector_tier(const snug_cpu_features *f) {
    if (f->avx512f && f->avx512bw && f->avx512dq && f->avx512vl)
        return 3;
    if (f->avx2 && f->fma)
        return 2;
    return f->avx ? 1 : 0;
}

const char *snug_cpu_features_level(const snug_cpu_features *f, char *buf, int n) {
    switch (snug_cpu_vector_tier(f)) {
    case 3:
        snprintf(buf, n, "AVX-512%s%s%s%s", f->avx512_bf16 ? " BF16" : "", f->avx512_fp16 ? " FP16" : "",
                 f->avx512_vnni ? " VNNI" : "", f->amx_bf16 ? " AMX-BF16" : "");
        break;
    case 2:
        snprintf(buf, n, "AVX2 FMA");
        break;
    case 1:
        snprintf(buf, n, "AVX");
        break;
    default:
        snprintf(buf, n, "no AVX");
    }
    return buf;
}
