/* xent_cpu.c: the fused output projection + softmax + cross-entropy on the CPU, chunked over tokens.
 *
 * For each chunk of `chunk` tokens: logits (chunk,V) = h_chunk @ w^T (one GEMM), then per row the loss
 * lse - logit[label], and when gradients are wanted the row is overwritten in place by
 * G = grad_scale * (softmax - onehot), from which two more GEMMs give dh_chunk += G @ w and dw += G^T @ h_chunk.
 * The full (N,V) logits never exist. Chunks without any supervised token are skipped. A 16-bit w is widened `wblock`
 * rows at a time into w_ws for the two GEMMs that read it (twice per chunk: conversion is O(V*C) against the GEMMs'
 * O(chunk*V*C)), so no fp32 copy of the whole head exists either; where the GEMMs run on oneDNN
 * (snug_cpu_takes16) each block goes to them as stored instead, the same GEMMs on the same values. */
#include <math.h>
#include <string.h>

#include "backend/cpu/expf_cpu.h"
#include "backend/cpu/ops_cpu.h"

#define NT(be) ((be)->nthreads)

/* out (nc, V) at ldc V: hc (nc,C) @ w^T, or G (nc,V) @ w into dh (nc,C) when `back`; w stored as wdt */
static void gemm_w(snug_backend *be, int back, float *out, const float *in, const void *w, snug_dtype wdt, int nc, int C, int V,
                   float *w_ws, int wblock) {
    if (wdt == SNUG_DT_F32) {
        if (back)
            snug_cpu_gemm(be, 0, 0, nc, C, V, 1.0f, in, V, w, C, 1.0f, out, C);
        else
            snug_cpu_gemm(be, 0, 1, nc, V, C, 1.0f, in, C, w, C, 0.0f, out, V);
        return;
    }
    int as_stored = snug_cpu_takes16(be);
    for (int v0 = 0; v0 < V; v0 += wblock) {
        int vb = V - v0 < wblock ? V - v0 : wblock;
        const void *wb = (const uint16_t *)w + (size_t)v0 * C;
        snug_dtype bdt = wdt;
        if (!as_stored) {
            snug_cpu_from16(be, w_ws, wb, (size_t)vb * C, wdt);
            wb = w_ws, bdt = SNUG_DT_F32;
        }
        if (back) // dh (nc,C) += G[:, v0:v0+vb] @ w_block (vb,C)
            snug_cpu_gemm_ex(be, 0, 0, nc, C, vb, 1.0f, in + v0, SNUG_DT_F32, V, wb, bdt, C, 1.0f, out, C);
        else // logits[:, v0:v0+vb] = hc (nc,C) @ w_block^T
            snug_cpu_gemm_ex(be, 0, 1, nc, vb, C, 1.0f, in, SNUG_DT_F32, C, wb, bdt, C, 0.0f, out + v0, V);
    }
}

/* Whether any of the nc labels is a supervised token (in [0, V)). */
static int any_supervised(const int32_t *lab, int nc, int V) {
    for (int r = 0; r < nc; r++)
        if (lab[r] >= 0 && lab[r] < V)
            return 1;
    return 0;
}

double snug_cpu_xent_fwd_bwd(snug_backend *be, float *dh, float *dw, const float *h, const void *w, snug_dtype wdt,
                             const int32_t *labels, int N, int C, int V, float grad_scale, float *logits_ws,
                             int chunk, float *w_ws, int wblock) {
    // h (N,C), w (V,C) as wdt, labels (N), dh (N,C) +=, dw (V,C) +=, logits_ws (chunk,V), w_ws (wblock,C)
    int grad = dh || dw;
    if (N <= 0 || C <= 0 || V <= 0)
        return 0.0;
    if (chunk <= 0)
        chunk = N;
    double total = 0.0;
    for (int n0 = 0; n0 < N; n0 += chunk) {
        int nc = N - n0 < chunk ? N - n0 : chunk;
        const float *hc = h + (size_t)n0 * C;
        const int32_t *lab = labels + n0;
        if (!any_supervised(lab, nc, V))
            continue;

        // logits (nc,V) = h_chunk (nc,C) @ w (V,C)^T
        gemm_w(be, 0, logits_ws, hc, w, wdt, nc, C, V, w_ws, wblock);

        // rows in SNUG_CPU_NBLK fixed blocks; each block's loss in double, then added in order (deterministic)
        double part[SNUG_CPU_NBLK];
#pragma omp parallel for num_threads(NT(be)) if ((size_t)nc * V >= SNUG_CPU_PAR_MIN)
        for (int bk = 0; bk < SNUG_CPU_NBLK; bk++) {
            int r0 = (int)((int64_t)nc * bk / SNUG_CPU_NBLK), r1 = (int)((int64_t)nc * (bk + 1) / SNUG_CPU_NBLK);
            double acc = 0.0;
            for (int r = r0; r < r1; r++) {
                float *row = logits_ws + (size_t)r * V;
                int y = lab[r];
                if (y < 0 || y >= V) { /* >= V is a caller's bug; never index past the row for it */
                    if (grad)
                        memset(row, 0, (size_t)V * sizeof(float));
                    continue;
                }
                float mx = row[0], zy = row[y];
                for (int v = 1; v < V; v++)
                    mx = row[v] > mx ? row[v] : mx;
                double sum = 0.0;
                for (int v = 0; v < V; v++) // the row becomes exp(logit - max)
                    row[v] -= mx;
                snug_cpu_expf_n(row, row, V);
                for (int v = 0; v < V; v++)
                    sum += row[v];
                acc += mx + log(sum) - zy;
                if (grad) { // row <- grad_scale * (softmax - onehot)
                    float k = (float)(grad_scale / sum);
                    for (int v = 0; v < V; v++)
                        row[v] *= k;
                    row[y] -= grad_scale;
                }
            }
            part[bk] = acc;
        }
        for (int bk = 0; bk < SNUG_CPU_NBLK; bk++)
            total += part[bk];

        if (dh) // dh_chunk (nc,C) += G (nc,V) @ w (V,C)
            gemm_w(be, 1, dh + (size_t)n0 * C, logits_ws, w, wdt, nc, C, V, w_ws, wblock);
        if (dw) // dw (V,C) += G^T (V,nc) @ h_chunk (nc,C)
            snug_cpu_gemm(be, 1, 0, V, C, nc, 1.0f, logits_ws, V, hc, C, 1.0f, dw, C);
    }
    return total;
}

/* The loss over the head's rows [v0, v0+vb) alone (loss_vocab_block): w is that block (vb,C) as wdt. Pass 0 folds
 * the block's logits into each supervised token's running maximum and sum of exponentials (st_max, st_sum: -inf and
 * 0 before the first block) and takes the label's logit when it is in the block (st_zy). Pass 1, once every block
 * has been folded, recomputes the block's logits and from the final statistics forms
 * G = grad_scale * (softmax - onehot) over the block: dh (N,C) += G @ w, dw (vb,C) += G^T @ h. Pass 2 returns the
 * summed loss, st_max + log(st_sum) - st_zy over the supervised tokens, in a fixed order. Chunked over tokens like
 * xent_fwd_bwd: logits_ws holds chunk rows of vb floats. */
double snug_cpu_xent_block(snug_backend *be, int pass, float *dh, float *dw, const float *h, const void *w,
                           snug_dtype wdt, const int32_t *labels, int N, int C, int V, int v0, int vb,
                           float grad_scale, float *st_max, double *st_sum, float *st_zy, float *logits_ws, int chunk,
                           float *w_ws, int wblock) {
    if (N <= 0 || C <= 0 || vb <= 0)
        return 0.0;
    if (pass == 2) {
        double part[SNUG_CPU_NBLK];
        for (int bk = 0; bk < SNUG_CPU_NBLK; bk++) {
            int r0 = (int)((int64_t)N * bk / SNUG_CPU_NBLK), r1 = (int)((int64_t)N * (bk + 1) / SNUG_CPU_NBLK);
            double acc = 0.0;
            for (int r = r0; r < r1; r++)
                if (labels[r] >= 0 && labels[r] < V)
                    acc += st_max[r] + log(st_sum[r]) - st_zy[r];
            part[bk] = acc;
        }
        double total = 0.0;
        for (int bk = 0; bk < SNUG_CPU_NBLK; bk++)
            total += part[bk];
        return total;
    }
    if (chunk <= 0)
        chunk = N;
    for (int n0 = 0; n0 < N; n0 += chunk) {
        int nc = N - n0 < chunk ? N - n0 : chunk;
        const float *hc = h + (size_t)n0 * C;
        const int32_t *lab = labels + n0;
        if (!any_supervised(lab, nc, V))
            continue;
        gemm_w(be, 0, logits_ws, hc, w, wdt, nc, C, vb, w_ws, wblock); /* (nc, vb) at ldc vb */
#pragma omp parallel for num_threads(NT(be)) if ((size_t)nc * vb >= SNUG_CPU_PAR_MIN)
        for (int r = 0; r < nc; r++) {
            float *row = logits_ws + (size_t)r * vb;
            int y = lab[r], n = n0 + r;
            if (y < 0 || y >= V) {
                if (pass == 1)
                    memset(row, 0, (size_t)vb * sizeof(float));
                continue;
            }
            if (pass == 0) {
                if (y >= v0 && y < v0 + vb)
                    st_zy[n] = row[y - v0];
                float mx = row[0];
                for (int v = 1; v < vb; v++)
                    mx = row[v] > mx ? row[v] : mx;
                float m1 = mx > st_max[n] ? mx : st_max[n];
                double sum = 0.0;
                for (int v = 0; v < vb; v++)
                    row[v] -= m1;
                snug_cpu_expf_n(row, row, vb);
                for (int v = 0; v < vb; v++)
                    sum += row[v];
                st_sum[n] = st_sum[n] * exp((double)st_max[n] - (double)m1) + sum;
                st_max[n] = m1;
            } else { /* row <- grad_scale * (softmax - onehot) */
                float mx = st_max[n], k = (float)(grad_scale / st_sum[n]);
                for (int v = 0; v < vb; v++)
                    row[v] -= mx;
                snug_cpu_expf_n(row, row, vb);
                for (int v = 0; v < vb; v++)
                    row[v] *= k;
                if (y >= v0 && y < v0 + vb)
                    row[y - v0] -= grad_scale;
            }
        }
        if (pass == 0)
            continue;
        if (dh) /* dh_chunk (nc,C) += G (nc,vb) @ w (vb,C) */
            gemm_w(be, 1, dh + (size_t)n0 * C, logits_ws, w, wdt, nc, C, vb, w_ws, wblock);
        if (dw) /* dw (vb,C) += G^T (vb,nc) @ h_chunk (nc,C) */
            snug_cpu_gemm(be, 1, 0, vb, C, nc, 1.0f, logits_ws, vb, hc, C, 1.0f, dw, C);
    }
    return 0.0;
}
