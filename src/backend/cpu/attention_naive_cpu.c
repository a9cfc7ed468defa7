/* attention_naive_cpu.c: attention with the (T, T) probabilities stored, the reference that
 * flash_attention: false selects, and the one-row attention of decoding with a KV cache. Straightforward loops:
 * one (batch row, head, query row) per iteration. */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops_cpu.h"

void snug_cpu_attention_naive_fwd(snug_backend *be, float *out, float *probs, const float *qkv,
                                  const int32_t *seg_start, int B, int T, int NH, int NKV, int HD, float scale) {
    int QKV = (NH + 2 * NKV) * HD, grp = NH / NKV;
#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(be->nthreads > 0 ? be->nthreads : 1)
    for (int bh = 0; bh < B * NH; bh++) {
        for (int t = 0; t < T; t++) {
            int b = bh / NH, h = bh % NH, kvh = h / grp;
            int s0 = seg_start ? seg_start[b * T + t] : 0;
            const float *q = qkv + (size_t)(b * T + t) * QKV + (size_t)h * HD;
            float *p = probs + ((size_t)bh * T + t) * T; /* (T) */
            memset(p, 0, (size_t)T * sizeof *p);
            float mx = -INFINITY;
            for (int s = s0; s <= t; s++) {
                const float *k = qkv + (size_t)(b * T + s) * QKV + (size_t)(NH + kvh) * HD;
                float d = 0;
                for (int i = 0; i < HD; i++)
                    d += q[i] * k[i];
                p[s] = d * scale;
                mx = fmaxf(mx, p[s]);
            }
            float sum = 0;
            for (int s = s0; s <= t; s++)
                sum += (p[s] = expf(p[s] - mx));
            float *o = out + (size_t)(b * T + t) * NH * HD + (size_t)h * HD;
            memset(o, 0, (size_t)HD * sizeof *o);
            for (int s = s0; s <= t; s++) {
                p[s] /= sum;
                const float *v = qkv + (size_t)(b * T + s) * QKV + (size_t)(NH + NKV + kvh) * HD;
                for (int i = 0; i < HD; i++)
                    o[i] += p[s] * v[i];
            }
        }
    }
}

/* dq from each query row; dk, dv gathered per (batch row, kv head) so no two threads write the same row. */
void snug_cpu_attention_naive_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv,
                                  const float *probs, int B, int T, int NH, int NKV, int HD, float scale) {
    int QKV = (NH + 2 * NKV) * HD, grp = NH / NKV;
#pragma omp parallel for schedule(dynamic, 1) num_threads(be->nthreads > 0 ? be->nthreads : 1)
    for (int bk = 0; bk < B * NKV; bk++) {
        int b = bk / NKV, kvh = bk % NKV;
        float ds[T > 0 ? T : 1]; /* (T) one row of score gradients */
        for (int h = kvh * grp; h < (kvh + 1) * grp; h++) {
            for (int t = 0; t < T; t++) {
                const float *p = probs + ((size_t)(b * NH + h) * T + t) * T;
                const float *go = dout + (size_t)(b * T + t) * NH * HD + (size_t)h * HD;
                float dot = 0;
                for (int s = 0; s <= t; s++) {
                    if (p[s] == 0.0f) {
                        ds[s] = 0;
                        continue;
                    }
                    const float *v = qkv + (size_t)(b * T + s) * QKV + (size_t)(NH + NKV + kvh) * HD;
                    float *dv = dqkv + (size_t)(b * T + s) * QKV + (size_t)(NH + NKV + kvh) * HD;
                    float dp = 0;
                    for (int i = 0; i < HD; i++) {
                        dp += go[i] * v[i];
                        dv[i] += p[s] * go[i];
                    }
                    ds[s] = dp;
                    dot += p[s] * dp;
                }
                const float *q = qkv + (size_t)(b * T + t) * QKV + (size_t)h * HD;
                float *dq = dqkv + (size_t)(b * T + t) * QKV + (size_t)h * HD;
                for (int s = 0; s <= t; s++) {
                    if (p[s] == 0.0f)
                        continue;
                    float g = p[s] * (ds[s] - dot) * scale;
                    const float *k = qkv + (size_t)(b * T + s) * QKV + (size_t)(NH + kvh) * HD;
                    float *dk = dqkv + (size_t)(b * T + s) * QKV + (size_t)(NH + kvh) * HD;
                    for (int i = 0; i < HD; i++) {
                        dq[i] += g * k[i];
                        dk[i] += g * q[i];
                    }
                }
            }
        }
    }
}

void snug_cpu_attention_decode(snug_backend *be, float *out, const float *qkv, int p, int NH, int NKV, int HD,
                               float scale) {
    int QKV = (NH + 2 * NKV) * HD, grp = NH / NKV;
    const float *q = qkv + (size_t)p * QKV;
#pragma omp parallel for num_threads(be->nthreads > 0 ? be->nthreads : 1) if (p >= 256)
    for (int h = 0; h < NH; h++) {
        int kvh = h / grp;
        float mx = -INFINITY, sum = 0, w[p + 1]; /* (p+1) scores, then weights */
        for (int s = 0; s <= p; s++) {
            const float *k = qkv + (size_t)s * QKV + (size_t)(NH + kvh) * HD;
            float d = 0;
            for (int i = 0; i < HD; i++)
                d += q[h * HD + i] * k[i];
            w[s] = d * scale;
            mx = fmaxf(mx, w[s]);
        }
        for (int s = 0; s <= p; s++)
            sum += (w[s] = expf(w[s] - mx));
        float *o = out + (size_t)h * HD;
        memset(o, 0, (size_t)HD * sizeof *o);
        for (int s = 0; s <= p; s++) {
            const float *v = qkv + (size_t)s * QKV + (size_t)(NH + NKV + kvh) * HD;
            for (int i = 0; i < HD; i++)
                o[i] += w[s] / sum * v[i];
        }
    }
}
