/* bench_attention_gpu.c: snug's CUDA attention (causal, fp32) forward and forward + backward at T = 1024 ... 8192,
 * in TFLOP/s, on the first CUDA device. bench/gpu/bench_attention_torch.py times PyTorch's
 * scaled_dot_product_attention on the same shapes and prints the same lines, so scripts/gpu-check.sh can put the two
 * side by side.
 *
 * FLOPs count the causal half: forward 4*B*NH*T*T*HD/2, backward 2.5 times that (forward + backward 3.5 times).
 * Heads are full multi-head (NKV = NH), as in the PyTorch run. SNUG_CUDA_ATTN=plain times the plain rung instead of
 * the tiled one (slow: keep T small with the optional maximum T argument).
 *
 *     bench_attention_gpu [max_T]
 *
 * One line per shape: attn impl=snug-fp32-tiled B=.. T=.. NH=.. HD=.. fwd_ms=.. fwd_tflops=.. fwdbwd_ms=..
 * fwdbwd_tflops=.. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/backend_cuda.h"
#include "core/error.h"
#include "core/rng.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* n floats uniform in [-1, 1) on the device */
static float *device_rand(snug_backend *be, size_t n, uint64_t seed) {
    float *h = malloc(n * sizeof(float)), *d = be->alloc(be, n * sizeof(float));
    if (!h || !d) {
        fprintf(stderr, "bench_attention_gpu: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((snug_splitmix64(&seed) >> 40) * 0x1.0p-23 - 1.0);
    be->to_device(be, d, h, n * sizeof(float));
    free(h);
    return d;
}

int main(int argc, char **argv) {
    int max_T = argc > 1 ? atoi(argv[1]) : 8192;
    if (snug_cuda_device_count() == 0) {
        fprintf(stderr, "bench_attention_gpu: no CUDA GPU visible\n");
        return 2;
    }
    snug_error e = {0};
    snug_backend *be = snug_backend_cuda_create(0, &e);
    if (!be) {
        fprintf(stderr, "bench_attention_gpu: %s\n", e.msg);
        return 1;
    }
    const char *rung = getenv("SNUG_CUDA_ATTN");
    const char *impl = rung && strcmp(rung, "plain") == 0 ? "snug-fp32-plain" : "snug-fp32-tiled";
    printf("# %s on %s; causal; TFLOP/s count the causal half (forward 2*B*NH*T*T*HD, backward 2.5x)\n", impl,
           snug_cuda_device_name(be));
    /* (NH, HD) pairs of a 2048-wide model; B so that B*T stays near 4096..16384 tokens */
    static const int heads[2][2] = {{32, 64}, {16, 128}};
    static const int Ts[4] = {1024, 2048, 4096, 8192}, Bs[4] = {4, 4, 2, 1};
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++) {
            int NH = heads[c][0], HD = heads[c][1], T = Ts[k], B = Bs[k], NKV = NH;
            if (T > max_T)
                continue;
            size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HD, no = N * NH * HD;
            float scale = 1.0f / sqrtf((float)HD);
            float *qkv = device_rand(be, N * R, 1), *dout = device_rand(be, no, 2);
            float *out = be->alloc(be, no * sizeof(float)), *lse = be->alloc(be, N * NH * sizeof(float));
            float *dqkv = be->alloc(be, N * R * sizeof(float));
            if (!out || !lse || !dqkv) {
                fprintf(stderr, "bench_attention_gpu: out of device memory at T=%d\n", T);
                return 1;
            }
            int reps = T <= 2048 ? 10 : 3;
            /* warm-up: the first launches load the kernels */
            be->attention_fwd(be, out, lse, qkv, NULL, B, T, NH, NKV, HD, scale);
            be->attention_bwd(be, dqkv, dout, qkv, out, lse, NULL, B, T, NH, NKV, HD, scale);
            be->sync(be);
            double t0 = now();
            for (int r = 0; r < reps; r++)
                be->attention_fwd(be, out, lse, qkv, NULL, B, T, NH, NKV, HD, scale);
            be->sync(be);
            double t1 = now();
            for (int r = 0; r < reps; r++) {
                be->attention_fwd(be, out, lse, qkv, NULL, B, T, NH, NKV, HD, scale);
                be->attention_bwd(be, dqkv, dout, qkv, out, lse, NULL, B, T, NH, NKV, HD, scale);
            }
            be->sync(be);
            double t2 = now();
            double f = 4.0 * B * NH * (double)T * T * HD / 2, fwd = (t1 - t0) / reps, fb = (t2 - t1) / reps;
            printf("attn impl=%s B=%d T=%d NH=%d HD=%d fwd_ms=%.3f fwd_tflops=%.2f fwdbwd_ms=%.3f fwdbwd_tflops=%.2f\n",
                   impl, B, T, NH, HD, fwd * 1e3, f / fwd * 1e-12, fb * 1e3, 3.5 * f / fb * 1e-12);
            fflush(stdout);
            be->free(be, qkv), be->free(be, dout), be->free(be, out), be->free(be, lse), be->free(be, dqkv);
        }
    be->destroy(be);
    return 0;
}
