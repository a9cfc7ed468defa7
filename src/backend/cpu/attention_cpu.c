/* attention_cpu.c: causal, grouped-query, variable-length attention on the CPU, without any (T,T) buffer.
 *
 * Both passes work on tiles of TQ query rows of one head, held transposed (HD, TQ) on the stack, so that the inner
 * loops run across the TQ queries in SIMD lanes: the scores of one key against the whole tile are HD multiply-adds
 * of TQ-wide vectors, with no horizontal sums, and each key row is loaded once per tile instead of once per query.
 *
 * Forward: parallel over (b, h, tile). Keys are visited in blocks of ATT_BLK with an online softmax (running max and
 * sum per query, the output rescaled when the max grows); it saves lse, the log-sum-exp of the scaled scores.
 * Backward: recomputes p = exp(score - lse), dS = p (dP - D) with D = dout . out. Threads own one (b, kv head) each
 * and loop over that group's query heads and tiles in order, so dq, dk and dv are each written by one thread in a
 * fixed order: race-free, and the same bits for any thread count. The reference for all of this is the naive
 * attention in tests/unit/test_ops.c. The exponentials of a block run in SIMD lanes (expf_cpu.h: libm's bits). */
#include <math.h>
#include <string.h>

#include "backend/cpu/expf_cpu.h"
#include "backend/cpu/ops_cpu.h"

#define NT(be) ((be)->nthreads)
#define TQ 16      /* query rows per tile: the SIMD width of the inner loops */
#define ATT_BLK 64 /* keys per block of the forward's online softmax */

/* a*b + c, fused where the processor has FMA: one rounding and twice the throughput (in ISO C mode, -std=c11, GCC
 * does not contract a*b + c into an FMA by itself) */
#ifdef __FMA__
#define MADD(a, b, c) fmaf(a, b, c)
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

/* First key of query token n (row-local index t), clamped into [0, t]. */
static inline int first_key(const int32_t *seg_start, size_t n, int t) {
    int lo = seg_start ? seg_start[n] : 0;
    return lo < 0 ? 0 : lo > t ? t : lo;
}

/* xT (HD, TQ) = the nr rows of HD floats at x (rows `stride` apart), transposed; columns past nr are zero. */
static void load_tile_T(float *restrict xT, const float *restrict x, size_t stride, int nr, int HD) {
    for (int r = 0; r < TQ; r++)
        for (int i = 0; i < HD; i++)
            xT[i * TQ + r] = r < nr ? x[r * stride + i] : 0.0f;
}

/* xr (TQ, HD) = the same rows copied contiguously; rows past nr are zero. */
static void load_tile(float *restrict xr, const float *restrict x, size_t stride, int nr, int HD) {
    for (int r = 0; r < TQ; r++)
        for (int i = 0; i < HD; i++)
            xr[r * HD + i] = r < nr ? x[r * stride + i] : 0.0f;
}

/* acc (TQ) = x (HD) . each column of xT (HD, TQ). Four partial sums, so consecutive multiply-adds are independent. */
static inline void tile_dot(float *restrict acc, const float *restrict x, const float *restrict xT, int HD) {
    float a0[TQ] = {0}, a1[TQ] = {0}, a2[TQ] = {0}, a3[TQ] = {0};
    int i = 0;
    for (; i + 4 <= HD; i += 4) {
        const float *c = xT + (size_t)i * TQ;
#pragma omp simd
        for (int r = 0; r < TQ; r++) {
            a0[r] = MADD(x[i], c[r], a0[r]);
            a1[r] = MADD(x[i + 1], c[TQ + r], a1[r]);
            a2[r] = MADD(x[i + 2], c[2 * TQ + r], a2[r]);
            a3[r] = MADD(x[i + 3], c[3 * TQ + r], a3[r]);
        }
    }
    for (; i < HD; i++)
#pragma omp simd
        for (int r = 0; r < TQ; r++)
            a0[r] = MADD(x[i], xT[(size_t)i * TQ + r], a0[r]);
#pragma omp simd
    for (int r = 0; r < TQ; r++)
        acc[r] = (a0[r] + a1[r]) + (a2[r] + a3[r]);
}

void snug_cpu_attention_fwd(snug_backend *be, float *out, float *lse, const float *qkv, const int32_t *seg_start,
                            int B, int T, int NH, int NKV, int HD, float scale) {
    // qkv (N, (NH+2*NKV)*HD) ; out (N, NH*HD) ; lse (N, NH) ; seg_start (N) or NULL
    int R = (NH + 2 * NKV) * HD; /* floats per token in qkv */
    int G = NH / NKV;            /* query heads per kv head */
    int ntiles = (T + TQ - 1) / TQ;
#pragma omp parallel for collapse(3) schedule(dynamic, 1) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int tt = 0; tt < ntiles; tt++) {
                int t0 = (ntiles - 1 - tt) * TQ; /* the longest tiles first, for the dynamic schedule */
                int nr = T - t0 < TQ ? T - t0 : TQ, tlast = t0 + nr - 1;
                size_t n0 = (size_t)b * T + t0;
                const float *kbase = qkv + (size_t)b * T * R + (size_t)(NH + h / G) * HD; /* key s: kbase + s*R */
                const float *vbase = kbase + (size_t)NKV * HD;
                float qT[HD * TQ], oT[HD * TQ]; /* (HD, TQ): the queries and their unnormalised outputs */
                float S[ATT_BLK][TQ];           /* scores, then probabilities, of a block of keys */
                float mx[TQ], sum[TQ], bmx[TQ];
                int lo[TQ], hi[TQ], kmin = tlast;
                load_tile_T(qT, qkv + n0 * R + (size_t)h * HD, R, nr, HD);
                memset(oT, 0, sizeof oT);
                for (int r = 0; r < TQ; r++) {
                    lo[r] = r < nr ? first_key(seg_start, n0 + r, t0 + r) : 1; /* rows past nr see no key */
                    hi[r] = r < nr ? t0 + r : 0;
                    kmin = lo[r] < kmin ? lo[r] : kmin;
                    mx[r] = -INFINITY;
                    sum[r] = 0.0f;
                }
                for (int s0 = kmin; s0 <= tlast; s0 += ATT_BLK) {
                    int ns = tlast + 1 - s0 < ATT_BLK ? tlast + 1 - s0 : ATT_BLK;
                    for (int j = 0; j < ns; j++) {
                        int s = s0 + j;
                        tile_dot(S[j], kbase + (size_t)s * R, qT, HD);
                        for (int r = 0; r < TQ; r++)
                            S[j][r] = (s >= lo[r] && s <= hi[r]) ? S[j][r] * scale : -INFINITY;
                    }
                    memcpy(bmx, mx, sizeof bmx);
                    for (int j = 0; j < ns; j++)
                        for (int r = 0; r < TQ; r++)
                            bmx[r] = S[j][r] > bmx[r] ? S[j][r] : bmx[r];
                    for (int r = 0; r < TQ; r++)
                        if (bmx[r] > mx[r]) { /* rescale what was summed under the old max */
                            float corr = expf(mx[r] - bmx[r]);
                            sum[r] *= corr;
                            for (int i = 0; i < HD; i++)
                                oT[i * TQ + r] *= corr;
                            mx[r] = bmx[r];
                        }
                    float E[ATT_BLK][TQ];
                    for (int j = 0; j < ns; j++)
                        for (int r = 0; r < TQ; r++)
                            E[j][r] = S[j][r] - mx[r];
                    snug_cpu_expf_n(&E[0][0], &E[0][0], ns * TQ);
                    for (int j = 0; j < ns; j++)
                        for (int r = 0; r < TQ; r++) {
                            float p = S[j][r] == -INFINITY ? 0.0f : E[j][r];
                            S[j][r] = p;
                            sum[r] += p;
                        }
                    for (int j = 0; j < ns; j++) {
                        const float *v = vbase + (size_t)(s0 + j) * R;
                        for (int i = 0; i < HD; i++)
#pragma omp simd
                            for (int r = 0; r < TQ; r++)
                                oT[i * TQ + r] = MADD(v[i], S[j][r], oT[i * TQ + r]);
                    }
                }
                for (int r = 0; r < nr; r++) {
                    float *o = out + (n0 + r) * NH * HD + (size_t)h * HD;
                    float inv = 1.0f / sum[r];
                    for (int i = 0; i < HD; i++)
                        o[i] = oT[i * TQ + r] * inv;
                    if (lse)
                        lse[(n0 + r) * NH + h] = mx[r] + logf(sum[r]);
                }
            }
}

void snug_cpu_attention_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                            float scale) {
    // dqkv (N, (NH+2*NKV)*HD) += ; dout, out (N, NH*HD) ; lse (N, NH)
    // p = exp(scale q.k - lse) ; dv += p dout ; dS = p (dout.v - D), D = dout.out ; dq += scale dS k ; dk += scale dS q
    int R = (NH + 2 * NKV) * HD, G = NH / NKV;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < NKV; kh++) {
            size_t koff = (size_t)b * T * R + (size_t)(NH + kh) * HD; /* key s at koff + s*R */
            size_t voff = koff + (size_t)NKV * HD;
            const float *kbase = qkv + koff, *vbase = qkv + voff;
            float *dkbase = dqkv + koff, *dvbase = dqkv + voff;
            float qT[HD * TQ], doT[HD * TQ], dqT[HD * TQ]; /* (HD, TQ) */
            float qr[TQ * HD], dor[TQ * HD];               /* (TQ, HD) */
            for (int h = kh * G; h < (kh + 1) * G; h++)
                for (int t0 = 0; t0 < T; t0 += TQ) {
                    int nr = T - t0 < TQ ? T - t0 : TQ, tlast = t0 + nr - 1;
                    size_t n0 = (size_t)b * T + t0;
                    const float *q0 = qkv + n0 * R + (size_t)h * HD, *do0 = dout + n0 * NH * HD + (size_t)h * HD;
                    load_tile_T(qT, q0, R, nr, HD);
                    load_tile_T(doT, do0, (size_t)NH * HD, nr, HD);
                    load_tile(qr, q0, R, nr, HD);
                    load_tile(dor, do0, (size_t)NH * HD, nr, HD);
                    memset(dqT, 0, sizeof dqT);
                    float L[TQ], D[TQ];
                    int lo[TQ], hi[TQ], kmin = tlast;
                    for (int r = 0; r < TQ; r++) {
                        lo[r] = r < nr ? first_key(seg_start, n0 + r, t0 + r) : 1;
                        hi[r] = r < nr ? t0 + r : 0;
                        kmin = lo[r] < kmin ? lo[r] : kmin;
                        L[r] = r < nr ? lse[(n0 + r) * NH + h] : 0.0f;
                        D[r] = 0.0f;
                        if (r < nr) {
                            const float *o = out + (n0 + r) * NH * HD + (size_t)h * HD;
                            for (int i = 0; i < HD; i++)
                                D[r] += dor[r * HD + i] * o[i];
                        }
                    }
                    /* keys in blocks: their scores and exponentials first (the exponentials in SIMD lanes), then
                     * each key's updates in order */
                    for (int s0 = kmin; s0 <= tlast; s0 += ATT_BLK) {
                        int nb = tlast + 1 - s0 < ATT_BLK ? tlast + 1 - s0 : ATT_BLK;
                        float SC[ATT_BLK][TQ], DP[ATT_BLK][TQ];
                        for (int j = 0; j < nb; j++) {
                            tile_dot(SC[j], kbase + (size_t)(s0 + j) * R, qT, HD);
                            tile_dot(DP[j], vbase + (size_t)(s0 + j) * R, doT, HD);
                            for (int r = 0; r < TQ; r++)
                                SC[j][r] = scale * SC[j][r] - L[r];
                        }
                        snug_cpu_expf_n(&SC[0][0], &SC[0][0], nb * TQ);
                        for (int s = s0; s < s0 + nb; s++) {
                            const float *k = kbase + (size_t)s * R;
                            float *dk = dkbase + (size_t)s * R, *dv = dvbase + (size_t)s * R;
                            const float *e = SC[s - s0], *dp = DP[s - s0];
                            float p[TQ], ds[TQ];
                            for (int r = 0; r < TQ; r++) {
                                p[r] = (s >= lo[r] && s <= hi[r]) ? e[r] : 0.0f;
                                ds[r] = scale * p[r] * (dp[r] - D[r]);
                            }
                            for (int i = 0; i < HD; i++)
#pragma omp simd
                                for (int r = 0; r < TQ; r++)
                                    dqT[i * TQ + r] = MADD(k[i], ds[r], dqT[i * TQ + r]);
#pragma omp simd
                            for (int i = 0; i < HD; i++) {
                                float a = dk[i], c = dv[i];
                                for (int r = 0; r < TQ; r++) {
                                    a = MADD(ds[r], qr[r * HD + i], a);
                                    c = MADD(p[r], dor[r * HD + i], c);
                                }
                                dk[i] = a;
                                dv[i] = c;
                            }
                        }
                    }
                    for (int r = 0; r < nr; r++) {
                        float *dq = dqkv + (n0 + r) * R + (size_t)h * HD;
                        for (int i = 0; i < HD; i++)
                            dq[i] += dqT[i * TQ + r];
                    }
                }
        }
}
