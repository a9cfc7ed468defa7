/* attention_cpu.c: causal, grouped-query, variable-length attention on the CPU, without any (T,T) buffer.
 *
 * Forward: one query row at a time (parallel over b, h, t), keys visited in blocks of ATT_BLK with an online softmax
 * (running max and sum, the output row rescaled when the max grows), so the only scratch is ATT_BLK scores on the
 * stack. It saves lse, the log-sum-exp of the scaled scores of each query row.
 * Backward: recomputes p_s = exp(score_s - lse) and needs no scratch at all. Threads own one (b, kv head) each and
 * loop over that group's query heads and rows, so dq, dk and dv are each written by one thread in a fixed order:
 * race-free and the same bits for any thread count. */
#include <math.h>

#include "backend/cpu/ops_cpu.h"

#define NT(be) ((be)->nthreads)
#define ATT_BLK 64

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y += a * x */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* First key of query token n (row-local index), clamped into [0, t]. */
static inline int first_key(const int32_t *seg_start, size_t n, int t) {
    int lo = seg_start ? seg_start[n] : 0;
    return lo < 0 ? 0 : lo > t ? t : lo;
}

void snug_cpu_attention_fwd(snug_backend *be, float *out, float *lse, const float *qkv, const int32_t *seg_start,
                            int B, int T, int NH, int NKV, int HD, float scale) {
    // qkv (N, (NH+2*NKV)*HD) ; out (N, NH*HD) ; lse (N, NH) ; seg_start (N) or NULL
    int R = (NH + 2 * NKV) * HD; /* floats per token in qkv */
    int G = NH / NKV;            /* query heads per kv head */
#pragma omp parallel for collapse(3) schedule(dynamic, 4) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)b * T + t;
                const float *q = qkv + n * R + (size_t)h * HD;
                const float *kbase = qkv + (size_t)b * T * R + (size_t)(NH + h / G) * HD; /* key s: kbase + s*R */
                const float *vbase = kbase + (size_t)NKV * HD;
                float *o = out + n * NH * HD + (size_t)h * HD; /* the running, unnormalised output */
                float sc[ATT_BLK];
                float mx = -INFINITY, sum = 0.0f;
                for (int i = 0; i < HD; i++)
                    o[i] = 0.0f;
                for (int s0 = first_key(seg_start, n, t); s0 <= t; s0 += ATT_BLK) {
                    int ns = t + 1 - s0 < ATT_BLK ? t + 1 - s0 : ATT_BLK;
                    float bmx = -INFINITY;
                    for (int j = 0; j < ns; j++) {
                        sc[j] = scale * dot(q, kbase + (size_t)(s0 + j) * R, HD);
                        bmx = sc[j] > bmx ? sc[j] : bmx;
                    }
                    if (bmx > mx) { /* rescale what was summed under the old max */
                        float corr = expf(mx - bmx);
                        sum *= corr;
                        for (int i = 0; i < HD; i++)
                            o[i] *= corr;
                        mx = bmx;
                    }
                    for (int j = 0; j < ns; j++) {
                        float p = expf(sc[j] - mx);
                        sum += p;
                        axpy(o, p, vbase + (size_t)(s0 + j) * R, HD);
                    }
                }
                float inv = 1.0f / sum;
                for (int i = 0; i < HD; i++)
                    o[i] *= inv;
                if (lse)
                    lse[n * NH + h] = mx + logf(sum);
            }
}

void snug_cpu_attention_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                            float scale) {
    // dqkv (N, (NH+2*NKV)*HD) += ; dout, out (N, NH*HD) ; lse (N, NH)
    // p = exp(scale q.k - lse) ; dv += p dout ; dS = p (dout.v - D) with D = dout.out ; dq += scale dS k ; dk += scale dS q
    int R = (NH + 2 * NKV) * HD;
    int G = NH / NKV;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < NKV; kh++) {
            size_t koff = (size_t)b * T * R + (size_t)(NH + kh) * HD; /* key s at koff + s*R */
            size_t voff = koff + (size_t)NKV * HD;
            const float *kbase = qkv + koff, *vbase = qkv + voff;
            float *dkbase = dqkv + koff, *dvbase = dqkv + voff;
            for (int h = kh * G; h < (kh + 1) * G; h++)
                for (int t = 0; t < T; t++) {
                    size_t n = (size_t)b * T + t;
                    const float *q = qkv + n * R + (size_t)h * HD;
                    float *dq = dqkv + n * R + (size_t)h * HD;
                    const float *dor = dout + n * NH * HD + (size_t)h * HD;
                    float D = dot(dor, out + n * NH * HD + (size_t)h * HD, HD);
                    float L = lse[n * NH + h];
                    for (int s = first_key(seg_start, n, t); s <= t; s++) {
                        const float *k = kbase + (size_t)s * R, *v = vbase + (size_t)s * R;
                        float p = expf(scale * dot(q, k, HD) - L);
                        float ds = scale * p * (dot(dor, v, HD) - D);
                        axpy(dq, ds, k, HD);
                        axpy(dkbase + (size_t)s * R, ds, q, HD);
                        axpy(dvbase + (size_t)s * R, p, dor, HD);
                    }
                }
        }
}
