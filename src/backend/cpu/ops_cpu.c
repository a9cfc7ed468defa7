/* ops_cpu.c: the CPU backend's row-wise and elementwise ops: embeddings, rmsnorm, layernorm, linear layers (OpenBLAS),
 * rotary embeddings, activations, elementwise arithmetic and the optimizer (sumsq, AdamW).
 *
 * Forward ops are parallel over rows. Parameter gradients summed over rows (dw, db, dbias, dtable) are parallel over
 * blocks of columns, each column summed over the rows in order, so no two threads write the same float and the
 * result does not depend on the thread count. Row reductions are in double. Attention and the loss have their own
 * files (attention_cpu.c, xent_cpu.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/expf_cpu.h"
#include "backend/cpu/ops_cpu.h"

#define NT(be) ((be)->nthreads)
#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ------------------------------------------------------------------------------------------------ embeddings */

void snug_cpu_embed_fwd(snug_backend *be, float *out, const int32_t *ids, const void *table, snug_dtype tdt, int N,
                        int C, int accumulate) {
    // out (N,C), ids (N), table (rows,C) stored as tdt
    size_t esz = snug_dtype_size(tdt);
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * C >= SNUG_CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        if (ids[n] < 0) { /* a zero row */
            if (!accumulate)
                memset(o, 0, (size_t)C * sizeof *o);
            continue;
        }
        const void *row = (const unsigned char *)table + (size_t)ids[n] * C * esz;
        if (accumulate && tdt == SNUG_DT_F32) {
            const float *r = row;
            for (int c = 0; c < C; c++)
                o[c] += r[c];
        } else if (accumulate) {
            float tmp[256];
            for (int c0 = 0; c0 < C; c0 += 256) {
                int len = C - c0 < 256 ? C - c0 : 256;
                snug_cpu_row_to_f32(tmp, (const unsigned char *)row + (size_t)c0 * esz, tdt, (size_t)len);
                for (int c = 0; c < len; c++)
                    o[c0 + c] += tmp[c];
            }
        } else {
            snug_cpu_row_to_f32(o, row, tdt, (size_t)C);
        }
    }
}

void snug_cpu_embed_bwd(snug_backend *be, float *dtable, const float *dout, const int32_t *ids, int N, int C) {
    // dtable (rows,C) += scatter of dout (N,C). Threads own column blocks; each column adds the tokens in order n.
    int nblk = (C + SNUG_CPU_CBLK - 1) / SNUG_CPU_CBLK;
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * C >= SNUG_CPU_PAR_MIN)
    for (int bk = 0; bk < nblk; bk++) {
        int c0 = bk * SNUG_CPU_CBLK, c1 = MIN(C, c0 + SNUG_CPU_CBLK);
        for (int n = 0; n < N; n++) {
            if (ids[n] < 0)
                continue;
            float *d = dtable + (size_t)ids[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++)
                d[c] += g[c];
        }
    }
}

/* ------------------------------------------------------------------------------------------------ normalisation */

void snug_cpu_rmsnorm_fwd(snug_backend *be, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                          float eps) {
    // out (N,C) = inp * rstd * w ; rstd (N) = 1/sqrt(mean(inp^2) + eps)
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * C >= SNUG_CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++)
            ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++)
            o[c] = x[c] * r * w[c];
        if (rstd)
            rstd[n] = r;
    }
}

void snug_cpu_rmsnorm_bwd(snug_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int C) {
    // y = x r w with r = (mean(x^2)+eps)^-1/2:  dx = r w g - x r^3/C * sum(g w x) ;  dw = sum_n g x r
    int big = (size_t)N * C >= SNUG_CPU_PAR_MIN;
    if (dinp) {
#pragma omp parallel for num_threads(NT(be)) if (big)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            double r = rstd[n], dot = 0;
            for (int c = 0; c < C; c++)
                dot += (double)g[c] * w[c] * x[c];
            float rf = (float)r, k = (float)(dot * r * r * r / C);
            for (int c = 0; c < C; c++)
                dx[c] += rf * w[c] * g[c] - k * x[c];
        }
    }
    if (dw) {
        int nblk = (C + SNUG_CPU_CBLK - 1) / SNUG_CPU_CBLK;
#pragma omp parallel for num_threads(NT(be)) if (big)
        for (int bk = 0; bk < nblk; bk++) {
            int c0 = bk * SNUG_CPU_CBLK, c1 = MIN(C, c0 + SNUG_CPU_CBLK);
            double acc[SNUG_CPU_CBLK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
                double r = rstd[n];
                for (int c = c0; c < c1; c++)
                    acc[c - c0] += (double)g[c] * x[c] * r;
            }
            for (int c = c0; c < c1; c++)
                dw[c] += (float)acc[c - c0];
        }
    }
}

void snug_cpu_layernorm_fwd(snug_backend *be, float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C, float eps) {
    // out (N,C) = (inp - mean) * rstd * w + b ; mean, rstd (N), biased variance
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * C >= SNUG_CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double s = 0, ss = 0;
        for (int c = 0; c < C; c++)
            s += x[c];
        double mu = s / C;
        for (int c = 0; c < C; c++)
            ss += (x[c] - mu) * (x[c] - mu);
        float m = (float)mu, r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * r * w[c] + b[c];
        if (mean)
            mean[n] = m;
        if (rstd)
            rstd[n] = r;
    }
}

void snug_cpu_layernorm_bwd(snug_backend *be, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C) {
    // xhat = (x - mean) r, dn = g w:  dx = r (dn - mean(dn) - xhat mean(dn xhat)) ; dw = sum_n g xhat ; db = sum_n g
    int big = (size_t)N * C >= SNUG_CPU_PAR_MIN;
    if (dinp) {
#pragma omp parallel for num_threads(NT(be)) if (big)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float m = mean[n], r = rstd[n];
            double sdn = 0, sdnx = 0;
            for (int c = 0; c < C; c++) {
                double dn = (double)g[c] * w[c];
                sdn += dn;
                sdnx += dn * ((x[c] - m) * r);
            }
            float mdn = (float)(sdn / C), mdnx = (float)(sdnx / C);
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * r;
                dx[c] += r * (g[c] * w[c] - mdn - xhat * mdnx);
            }
        }
    }
    if (dw || db) {
        int nblk = (C + SNUG_CPU_CBLK - 1) / SNUG_CPU_CBLK;
#pragma omp parallel for num_threads(NT(be)) if (big)
        for (int bk = 0; bk < nblk; bk++) {
            int c0 = bk * SNUG_CPU_CBLK, c1 = MIN(C, c0 + SNUG_CPU_CBLK);
            double aw[SNUG_CPU_CBLK] = {0}, ab[SNUG_CPU_CBLK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
                float m = mean[n], r = rstd[n];
                for (int c = c0; c < c1; c++) {
                    aw[c - c0] += (double)g[c] * ((x[c] - m) * r);
                    ab[c - c0] += g[c];
                }
            }
            for (int c = c0; c < c1; c++) {
                if (dw)
                    dw[c] += (float)aw[c - c0];
                if (db)
                    db[c] += (float)ab[c - c0];
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ linear layers */

/* The linear layer over a weight stored as wdt (fp32, or 16-bit read as stored: matmul_w16_fwd/bwd) */
static void matmul_fwd(snug_backend *be, float *out, const float *inp, const void *w, snug_dtype wdt,
                       const float *bias, int N, int C, int OC) {
    // out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC): the bias is written first and the GEMM adds onto it
    if (N <= 0 || C <= 0 || OC <= 0)
        return;
    float beta = 0.0f;
    if (bias) {
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    snug_cpu_gemm_ex(be, 0, 1, N, OC, C, 1.0f, inp, SNUG_DT_F32, C, w, wdt, C, beta, out, OC);
}

void snug_cpu_matmul_fwd(snug_backend *be, float *out, const float *inp, const float *w, const float *bias, int N,
                         int C, int OC) {
    matmul_fwd(be, out, inp, w, SNUG_DT_F32, bias, N, C, OC);
}

void snug_cpu_matmul_w16_fwd(snug_backend *be, float *out, const float *inp, const void *w, snug_dtype wdt,
                             const float *bias, int N, int C, int OC) {
    matmul_fwd(be, out, inp, w, wdt, bias, N, C, OC);
}

static void matmul_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                       const void *w, snug_dtype wdt, int N, int C, int OC);

void snug_cpu_matmul_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC) {
    matmul_bwd(be, dinp, dw, dbias, dout, inp, w, SNUG_DT_F32, N, C, OC);
}

void snug_cpu_matmul_w16_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                             const float *inp, const void *w, snug_dtype wdt, int N, int C, int OC) {
    matmul_bwd(be, dinp, dw, dbias, dout, inp, w, wdt, N, C, OC);
}

static void matmul_bwd(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                       const void *w, snug_dtype wdt, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0)
        return;
    if (dinp) // dinp (N,C) += dout (N,OC) @ w (OC,C)
        snug_cpu_gemm_ex(be, 0, 0, N, C, OC, 1.0f, dout, SNUG_DT_F32, OC, w, wdt, C, 1.0f, dinp, C);
    if (dw) // dw (OC,C) += dout^T (OC,N) @ inp (N,C)
        snug_cpu_gemm(be, 1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) { // dbias (OC) += column sums of dout
        int nblk = (OC + SNUG_CPU_CBLK - 1) / SNUG_CPU_CBLK;
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * OC >= SNUG_CPU_PAR_MIN)
        for (int bk = 0; bk < nblk; bk++) {
            int c0 = bk * SNUG_CPU_CBLK, c1 = MIN(OC, c0 + SNUG_CPU_CBLK);
            double acc[SNUG_CPU_CBLK] = {0};
            for (int n = 0; n < N; n++) {
                const float *g = dout + (size_t)n * OC;
                for (int c = c0; c < c1; c++)
                    acc[c - c0] += g[c];
            }
            for (int c = c0; c < c1; c++)
                dbias[c] += (float)acc[c - c0];
        }
    }
}

/* ------------------------------------------------------------------------------------------------ rotary embeddings */

/* Rotates the pairs (i, i+HD/2) of each head by +angle (sgn = 1, forward) or -angle (sgn = -1, the transpose). */
static void rope_rotate(snug_backend *be, float *x, const int32_t *pos, const float *cos, const float *sin, int N,
                        int H, int HD, int stride, float sgn) {
    // x: N rows of `stride` floats, heads [0,H) of HD ; cos/sin (max_pos, HD/2)
    int half = HD / 2;
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * H * HD >= SNUG_CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *cr = cos + (size_t)pos[n] * half, *sr = sin + (size_t)pos[n] * half;
        for (int h = 0; h < H; h++) {
            float *xh = x + (size_t)n * stride + (size_t)h * HD;
            for (int i = 0; i < half; i++) {
                float c = cr[i], s = sgn * sr[i];
                float x0 = xh[i], x1 = xh[i + half];
                xh[i] = x0 * c - x1 * s;
                xh[i + half] = x1 * c + x0 * s;
            }
        }
    }
}

void snug_cpu_rope_fwd(snug_backend *be, float *x, const int32_t *pos, const float *cos, const float *sin, int N,
                       int H, int HD, int stride) {
    rope_rotate(be, x, pos, cos, sin, N, H, HD, stride, 1.0f);
}

void snug_cpu_rope_bwd(snug_backend *be, float *dx, const int32_t *pos, const float *cos, const float *sin, int N,
                       int H, int HD, int stride) {
    rope_rotate(be, dx, pos, cos, sin, N, H, HD, stride, -1.0f);
}

/* ------------------------------------------------------------------------------------------------ activations */

void snug_cpu_swiglu_fwd(snug_backend *be, float *out, const float *gu, int N, int I) {
    // gu (N,2I) = [gate | up] ; out (N,I) = silu(gate) * up
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * I >= SNUG_CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * I, *u = g + I;
        float *o = out + (size_t)n * I;
        for (int i0 = 0; i0 < I; i0 += 64) { /* exp(-gate) 64 at a time in SIMD lanes (expf_cpu.h) */
            int m = I - i0 < 64 ? I - i0 : 64;
            float e[64];
            for (int i = 0; i < m; i++)
                e[i] = -g[i0 + i];
            snug_cpu_expf_n(e, e, m);
            for (int i = 0; i < m; i++)
                o[i0 + i] = g[i0 + i] / (1.0f + e[i]) * u[i0 + i];
        }
    }
}

void snug_cpu_swiglu_bwd(snug_backend *be, float *dgu, const float *dout, const float *gu, int N, int I) {
    // d silu(x)/dx = sig(x) (1 + x (1 - sig(x)))
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * I >= SNUG_CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * I, *u = g + I, *d = dout + (size_t)n * I;
        float *dg = dgu + (size_t)n * 2 * I, *du = dg + I;
        for (int i0 = 0; i0 < I; i0 += 64) {
            int m = I - i0 < 64 ? I - i0 : 64;
            float e[64];
            for (int i = 0; i < m; i++)
                e[i] = -g[i0 + i];
            snug_cpu_expf_n(e, e, m);
            for (int j = 0; j < m; j++) {
                int i = i0 + j;
                float sig = 1.0f / (1.0f + e[j]);
                dg[i] += d[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
                du[i] += d[i] * (g[i] * sig);
            }
        }
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

void snug_cpu_gelu_fwd(snug_backend *be, float *out, const float *inp, size_t n) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

void snug_cpu_gelu_bwd(snug_backend *be, float *dinp, const float *dout, const float *inp, size_t n) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float d = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += dout[i] * d;
    }
}

/* ------------------------------------------------------------------------------------------------ elementwise */

void snug_cpu_add(snug_backend *be, float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void snug_cpu_accumulate(snug_backend *be, float *dst, const float *src, size_t n) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

void snug_cpu_scale(snug_backend *be, float *x, float s, size_t n) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

void snug_cpu_dequantize_4bit(snug_backend *be, float *dst, const uint8_t *packed, const float *absmax,
                              const uint8_t *absmax_q, const float *nested_absmax, const float *nested_map,
                              float nested_offset, const float *code, size_t n, int blocksize) {
    size_t nb = (n + (size_t)blocksize - 1) / (size_t)blocksize;
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        float a = absmax ? absmax[b] : nested_map[absmax_q[b]] * nested_absmax[b / 256] + nested_offset;
        size_t i1 = (b + 1) * (size_t)blocksize < n ? (b + 1) * (size_t)blocksize : n;
        for (size_t i = b * (size_t)blocksize; i < i1; i++)
            dst[i] = code[i & 1 ? packed[i >> 1] & 15 : packed[i >> 1] >> 4] * a;
    }
}

void snug_cpu_dequantize_int8(snug_backend *be, float *dst, const int8_t *codes, const float *scb, size_t rows,
                              size_t cols) {
#pragma omp parallel for num_threads(NT(be)) if (rows * cols >= SNUG_CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++) {
        float s = snug_q8_row_scale(scb[r]);
        for (size_t j = 0; j < cols; j++)
            dst[r * cols + j] = (float)codes[r * cols + j] * s;
    }
}

void snug_cpu_dropout(snug_backend *be, float *out, const float *in, size_t n, float p, uint64_t seed) {
    float keep = 1.0f / (1.0f - p);
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = snug_dropout_keep(seed, i, p) ? in[i] * keep : 0.0f;
}

void snug_cpu_add_noise(snug_backend *be, float *x, size_t n, float mag, uint64_t seed) {
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float d = mag * snug_uniform_pm1(seed, i); /* rounded, then added: no fused multiply-add (as on CUDA) */
        x[i] += d;
    }
}

/* ------------------------------------------------------------------------------------------------ rows, columns */

void snug_cpu_row_norms(snug_backend *be, float *out, const float *a, size_t lda, int rows, int cols) {
#pragma omp parallel for num_threads(NT(be)) if ((size_t)rows * (size_t)cols >= SNUG_CPU_PAR_MIN)
    for (int j = 0; j < rows; j++) {
        const float *r = a + (size_t)j * lda;
        double s = 0;
        for (int i = 0; i < cols; i++)
            s += (double)r[i] * r[i];
        out[j] = (float)sqrt(s);
    }
}

void snug_cpu_row_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *b, size_t ldb, int rows,
                       int cols, const float *div) {
#pragma omp parallel for num_threads(NT(be)) if ((size_t)rows * (size_t)cols >= SNUG_CPU_PAR_MIN)
    for (int j = 0; j < rows; j++) {
        const float *x = a + (size_t)j * lda, *y = b + (size_t)j * ldb;
        double s = 0;
        for (int i = 0; i < cols; i++)
            s += (double)x[i] * y[i];
        float d = (float)(s / div[j]);
        out[j] += d;
    }
}

void snug_cpu_scale_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                         const float *mag, const float *nrm, const float *bias) {
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * (size_t)cols >= SNUG_CPU_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * ldo;
        const float *x = in + (size_t)t * ldi;
        for (int j = 0; j < cols; j++) {
            float g = mag[j] / nrm[j];
            if (bias) {
                float d = x[j] - bias[j], p = g * d; /* each rounded: no fused multiply-add (as on CUDA) */
                o[j] = bias[j] + p;
            } else {
                o[j] = g * x[j];
            }
        }
    }
}

void snug_cpu_col_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *y, size_t ldy, int N,
                       int cols, const float *bias, const float *div) {
    /* blocks of 64 columns, each thread walking the tokens down its block: rows read in order */
    int nb = (cols + 63) / 64;
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * (size_t)cols >= SNUG_CPU_PAR_MIN)
    for (int b = 0; b < nb; b++) {
        int j0 = b * 64, j1 = j0 + 64 < cols ? j0 + 64 : cols;
        double s[64] = {0};
        for (int t = 0; t < N; t++) {
            const float *x = a + (size_t)t * lda, *v = y + (size_t)t * ldy;
            for (int j = j0; j < j1; j++) {
                float d = bias ? v[j] - bias[j] : v[j];
                s[j - j0] += (double)x[j] * d;
            }
        }
        for (int j = j0; j < j1; j++) {
            float q = (float)(s[j - j0] / div[j]);
            out[j] += q;
        }
    }
}

void snug_cpu_add_scaled_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                              const float *mag, const float *nrm, float minus) {
#pragma omp parallel for num_threads(NT(be)) if ((size_t)N * (size_t)cols >= SNUG_CPU_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * ldo;
        const float *x = in + (size_t)t * ldi;
        for (int j = 0; j < cols; j++) {
            float g = mag[j] / nrm[j], f = g - minus, p = f * x[j];
            o[j] += p;
        }
    }
}

/* ------------------------------------------------------------------------------------------------ optimizer */

double snug_cpu_sumsq(snug_backend *be, const void *xv, snug_dtype dt, size_t n) {
    // SNUG_CPU_NBLK fixed blocks, each summed in double, then added in order: the same bits for any thread count
    double part[SNUG_CPU_NBLK];
#pragma omp parallel for num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (int b = 0; b < SNUG_CPU_NBLK; b++) {
        size_t i0 = n / SNUG_CPU_NBLK * b + MIN((size_t)b, n % SNUG_CPU_NBLK);
        size_t i1 = i0 + n / SNUG_CPU_NBLK + ((size_t)b < n % SNUG_CPU_NBLK);
        double s = 0;
        if (dt == SNUG_DT_F32) {
            const float *x = xv;
#pragma omp simd reduction(+ : s)
            for (size_t i = i0; i < i1; i++)
                s += (double)x[i] * x[i];
        } else {
            float tmp[1024];
            for (size_t j = i0; j < i1; j += 1024) {
                size_t len = i1 - j < 1024 ? i1 - j : 1024;
                snug_cpu_row_to_f32(tmp, (const uint16_t *)xv + j, dt, len);
#pragma omp simd reduction(+ : s)
                for (size_t i = 0; i < len; i++)
                    s += (double)tmp[i] * tmp[i];
            }
        }
        part[b] = s;
    }
    double total = 0;
    for (int b = 0; b < SNUG_CPU_NBLK; b++)
        total += part[b];
    return total;
}


void snug_cpu_adamw(snug_backend *be, float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                    double beta2, double eps_d, double weight_decay, int step, float grad_scale) {
    // torch.optim.AdamW (single-tensor path), operation by operation in fp32, with the roundings and fused
    // multiply-adds of torch's vectorised CPU kernels (checked bitwise against torch 2.x, except where torch's own
    // vectorised sqrt is not correctly rounded):
    //   p.mul_(1 - lr*wd); m.lerp_(g, 1-b1); v.mul_(b2).addcmul_(g, g, 1-b2);
    //   denom = (v.sqrt() / sqrt(bc2)).add_(eps); p.addcdiv_(m, denom, -lr/bc1)
    double lr_d = lr, b1 = beta1, b2 = beta2, wd = weight_decay;
    float beta2_f = (float)beta2, eps = (float)eps_d;
    double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    float decay = (float)(1.0 - lr_d * wd);
    float w1 = (float)(1.0 - b1), w2 = (float)(1.0 - b2);
    float neg_step_size = (float)-(lr_d / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    int lerp_small = fabsf(w1) < 0.5f; /* torch's lerp picks its formula by the weight */
    /* elementwise with no dependence between elements (simd): vector sqrt and division round as the scalar ones */
#pragma omp parallel for simd num_threads(NT(be)) if (n >= SNUG_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float pi = p[i] * decay;
        float mi = m[i];
        mi = lerp_small ? fmaf(w1, gi - mi, mi) : fmaf(w1 - 1.0f, gi - mi, gi);
        float vi = fmaf(w2 * gi, gi, v[i] * beta2_f);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi + neg_step_size * mi / denom;
        m[i] = mi;
        v[i] = vi;
    }
}
