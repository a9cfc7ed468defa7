/* cpu_features.c: cpuid and xgetbv, read once (see cpu_features.h).
 *
 * An instruction set counts only when the OS also saves its registers on a context switch (XCR0): a hypervisor may
 * report AVX-512 and still leave the zmm state off, and AMX tiles must be enabled by the kernel. Bits from the Intel
 * SDM vol. 2A (CPUID) and AMD APM vol. 3, the same for both vendors. */
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

static void detect(snug_cpu_features *f) {
    unsigned int a = 0, b = 0, c = 0, d = 0, maxleaf = 0;
    if (!__get_cpuid(0, &maxleaf, &b, &c, &d))
        return;
    memcpy(f->vendor, &b, 4), memcpy(f->vendor + 4, &d, 4), memcpy(f->vendor + 8, &c, 4);
    f->vendor[12] = 0;
    __get_cpuid(1, &a, &b, &c, &d);
    int fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
    if (fam == 0xf)
        fam += (a >> 20) & 0xff;
    if (fam == 0x6 || fam >= 0xf)
        mod |= ((a >> 16) & 0xf) << 4;
    f->family = fam, f->model = mod;
    int osxsave = (c >> 27) & 1;
    unsigned long long x = osxsave ? xcr0() : 0;
    int ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xe0) == 0xe0, tiles = (x & 0x60000) == 0x60000;
    f->avx = ymm && ((c >> 28) & 1);
    f->fma = f->avx && ((c >> 12) & 1);
    if (maxleaf < 7)
        return;
    unsigned int nsub, b7, c7, d7, a71 = 0, b71, c71, d71;
    __cpuid_count(7, 0, nsub, b7, c7, d7);
    if (nsub >= 1) /* leaf 7 subleaf 1: AVX512-BF16 */
        __cpuid_count(7, 1, a71, b71, c71, d71);
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
#else
static void detect(snug_cpu_features *f) { (void)f; }
#endif

const snug_cpu_features *snug_cpu_features_get(void) {
    static snug_cpu_features f;
    static int done;
    if (!done) {
        detect(&f);
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
