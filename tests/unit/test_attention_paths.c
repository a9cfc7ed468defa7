/* test_attention_paths.c: the tiled attention (flash_attention: true) against the naive path that stores the
 * probabilities, forward and backward, on random shapes with T not a multiple of any tile, grouped-query heads and
 * uneven variable-length segments. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "model/model.h"

static float frand(void) { return (float)rand() / RAND_MAX * 2.0f - 1.0f; }


/* W > 0: a sliding window of W keys (the first keys as the model computes them) */
static void one(snug_backend *be, int B, int T, int NH, int NKV, int HD, int segmented, int W) {
    int QKV = (NH + 2 * NKV) * HD, N = B * T;
    float *qkv = malloc(sizeof(float) * N * QKV), *dout = malloc(sizeof(float) * N * NH * HD);
    float *o1 = calloc((size_t)N * NH * HD, 4), *o2 = calloc((size_t)N * NH * HD, 4), *lse = calloc((size_t)N * NH, 4);
    float *probs = calloc((size_t)B * NH * T * T, 4);
    float *d1 = calloc((size_t)N * QKV, 4), *d2 = calloc((size_t)N * QKV, 4);
    int32_t *seg = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N * QKV; i++)
        qkv[i] = 2.0f * frand();
    for (int i = 0; i < N * NH * HD; i++)
        dout[i] = frand();
    for (int b = 0; b < B; b++) { /* segments of uneven lengths: 1, 5, 13, 2, ... */
        int start = 0, len = 1 + b;
        for (int t = 0; t < T; t++) {
            if (t - start >= len) {
                start = t;
                len = (len * 7 + 3) % 17 + 1;
            }
            seg[b * T + t] = start;
        }
    }
    int32_t *win = malloc(sizeof(int32_t) * N);
    snug_attention_window_starts(win, segmented ? seg : NULL, 0, (size_t)N, T, W);
    const int32_t *sg = W > 0 ? win : segmented ? seg : NULL;
    float scale = 1.0f / sqrtf((float)HD);
    be->attention_fwd(be, o1, lse, qkv, sg, B, T, NH, NKV, HD, scale);
    be->attention_naive_fwd(be, o2, probs, qkv, sg, B, T, NH, NKV, HD, scale);
    be->attention_bwd(be, d1, dout, qkv, o1, lse, sg, B, T, NH, NKV, HD, scale);
    be->attention_naive_bwd(be, d2, dout, qkv, probs, B, T, NH, NKV, HD, scale);
    double eo = check_max_rel_f(o1, o2, (size_t)N * NH * HD), ed = check_max_rel_f(d1, d2, (size_t)N * QKV);
    CHECKF(eo < 1e-5, "forward B%d T%d NH%d NKV%d HD%d seg%d W%d: rel %.2e", B, T, NH, NKV, HD, segmented, W, eo);
    CHECKF(ed < 1e-5, "backward B%d T%d NH%d NKV%d HD%d seg%d W%d: rel %.2e", B, T, NH, NKV, HD, segmented, W, ed);
    printf("  B %d T %3d NH %d NKV %d HD %2d %s window %2d: out rel %.1e, dqkv rel %.1e\n", B, T, NH, NKV, HD,
           segmented ? "varlen " : "causal ", W, eo, ed);
    free(qkv), free(dout), free(o1), free(o2), free(lse), free(probs), free(d1), free(d2), free(seg), free(win);
}

int main(void) {
    srand(11);
    snug_backend *be = snug_backend_cpu_create(2);
    one(be, 2, 37, 6, 2, 8, 0, 0);
    one(be, 2, 37, 6, 2, 8, 1, 0);
    one(be, 1, 131, 4, 4, 16, 1, 0);
    one(be, 3, 70, 8, 1, 12, 1, 0);
    one(be, 1, 200, 2, 1, 6, 0, 0);
    one(be, 2, 37, 6, 2, 8, 0, 5);
    one(be, 3, 70, 8, 1, 12, 1, 9);
    one(be, 1, 200, 2, 1, 6, 0, 70);
    be->destroy(be);
    return check_finish("test_attention_paths");
}
