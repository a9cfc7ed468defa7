/* bench_attention.c: the tiled attention (flash_attention: true) against the naive path that stores the (T, T)
 * probabilities, forward + backward, at T = 512 ... 4096 on this machine's threads. Prints milliseconds and the
 * ratio naive / tiled (above 1: the tiled path is faster), and the bytes each path saves for backward.
 *
 *     build/bench_attention [threads] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/backend.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    snug_backend *be = snug_backend_cpu_create(threads);
    const int B = 1, NH = 8, NKV = 4, HD = 64, QKV = (NH + 2 * NKV) * HD;
    printf("attention forward+backward, B=%d NH=%d NKV=%d HD=%d, %d threads\n", B, NH, NKV, HD, be->nthreads);
    printf("%6s %12s %12s %8s %14s %14s\n", "T", "tiled ms", "naive ms", "ratio", "tiled saves", "naive saves");
    for (int T = 512; T <= 4096; T *= 2) {
        size_t N = (size_t)B * T;
        float *qkv = malloc(N * QKV * 4), *dout = malloc(N * NH * HD * 4), *out = malloc(N * NH * HD * 4);
        float *lse = malloc(N * NH * 4), *dqkv = malloc(N * QKV * 4);
        float *probs = malloc((size_t)B * NH * T * T * 4);
        for (size_t i = 0; i < N * QKV; i++)
            qkv[i] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t i = 0; i < N * NH * HD; i++)
            dout[i] = (float)rand() / RAND_MAX - 0.5f;
        float scale = 0.125f;
        double best[2] = {1e30, 1e30};
        int reps = T <= 1024 ? 3 : 2;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            be->attention_fwd(be, out, lse, qkv, NULL, B, T, NH, NKV, HD, scale);
            be->attention_bwd(be, dqkv, dout, qkv, out, lse, NULL, B, T, NH, NKV, HD, scale);
            double t1 = now();
            be->attention_naive_fwd(be, out, probs, qkv, NULL, B, T, NH, NKV, HD, scale);
            be->attention_naive_bwd(be, dqkv, dout, qkv, probs, B, T, NH, NKV, HD, scale);
            double t2 = now();
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
        }
        printf("%6d %12.1f %12.1f %7.2fx %11.1f MiB %11.1f MiB\n", T, best[0] * 1e3, best[1] * 1e3, best[1] / best[0],
               (N * NH * HD + N * NH) * 4 / 1048576.0, (N * NH * HD + (size_t)B * NH * T * T) * 4 / 1048576.0);
        free(qkv), free(dout), free(out), free(lse), free(dqkv), free(probs);
    }
    be->destroy(be);
    return 0;
}
