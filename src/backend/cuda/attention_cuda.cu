/* attention_cuda.cu: the CUDA backend's attention: causal, grouped-query, variable length (seg_start), in fp32 or,
 * under mixed precision, in bf16 on the tensor cores.
 * Semantics are those of backend/backend.h; backend/cpu/attention_cpu.c and attention_naive_cpu.c are the references.
 *
 * Three rungs, as in llm.c's dev/cuda ladders, all kept and all tested (tests/unit/test_cuda_ops.c); the two fp32
 * ones are here, the third in attention_tc_cuda.cu:
 *
 *   plain  one thread per query row (or per key row in backward), straight fp32 loops with an online softmax.
 *          Any HD up to ATT_PLAIN_MAXHD. Slow; it is the readable one, and runs only when forced or on a device
 *          whose shared memory is too small for the tiled kernels.
 *   tiled  FlashAttention-2 style. One block of 256 threads per (query tile of TILE rows, head, batch row) loops
 *          over tiles of TILE keys held in shared memory; a 16 x 16 thread grid gives each thread TILE/16 query rows
 *          x TILE/16 keys of the score tile and TILE/16 rows x HD/16 columns of the output. Online softmax per row,
 *          lse saved; key tiles past the causal diagonal or before the earliest seg_start of the tile are never
 *          visited, and no (T, T) buffer exists. HD is zero-padded to 32, 64 or 128 with TILE 64, or to 256 with
 *          TILE 32, so any HD <= 256 works (Gemma's 256 included); where the device's shared memory per block is
 *          short of the dK/dV kernel's tiles (99 KiB on an RTX 4090), TILE 32 at HD 128 and 16 at HD 256.
 *   tc     the same FlashAttention-2 scheme on the tensor cores: tiles rounded to bf16 in shared memory, products
 *          by WMMA with fp32 accumulation, softmax statistics, lse and gradients in fp32 (attention_tc_cuda.cu).
 *          HD a multiple of 16, at most 128. Errors of a few 1e-3 of the largest value, against fp32's 1e-7.
 *
 * The rung is a function of the shape and precision alone (att_choose), so a layer's forward and backward always
 * run the same one: under mixed precision (be->math BF16 or F16, where the GEMMs already round to 16 bits) tc when
 * HD allows it; otherwise tiled, with the largest tile the device's shared memory per block holds (plain when none
 * does). fp32 runs (be->math F32) never leave fp32. SNUG_CUDA_ATTN=plain, tiled, tiled32, tiled16 or tc in the
 * environment forces a rung or caps the tile (tc only where HD allows it, else the rule above picks).
 *
 * Backward (every rung) is deterministic, with no atomics: D = rowsum(dout * out) first, then a dQ pass (each
 * query row or tile loops over its keys) and a dK/dV pass (each key row or tile loops over the query heads of its
 * group and, inside, over the query rows that see it), both recomputing p = exp(scale q.k - lse). Every output
 * element is written by one thread, in a fixed order, so repeated runs give the same bits. Gradients accumulate
 * (+=) into dqkv.
 *
 * The naive path (flash_attention: false) and the decode op: attention_warp_cuda.cu.
 *
 * Memory beyond the arguments: backward takes N*NH floats of the backend's scratch for D (the naive backward
 * B*NH*T floats for its row sums). The tiled kernels' shared memory per block at HD 128 is 113 KiB forward (two
 * blocks fit an H100/H200 SM), 145 KiB dQ and 162 KiB dK/dV; at HD 256 (TILE 32) 100, 133 and 137 KiB, which fit
 * an A100's 163 KiB; at HD 64 about half (the tc kernels take 77 to 86
 * KiB at HD 128, see attention_tc_cuda.cu). The plain kernels keep per-thread arrays of ATT_PLAIN_MAXHD floats in
 * local memory, which the CUDA runtime reserves for every resident thread of the device the first time one of them
 * runs (about 0.5 GiB on an H200 for the dK/dV kernel): one more reason they run only when forced. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/cuda_internal.h"

#define ATT_THREADS 256      /* threads per block of the tiled kernels: 16 x 16 */
#define ATT_TILED_MAXHD 256  /* the tiled kernels' largest head dim */
#define ATT_PLAIN_MAXHD 256  /* the plain kernels' largest head dim (per-thread arrays of this many floats) */

/* ------------------------------------------------------------------------------------------------ helpers */

/* dst (TILE, stride) = rows r0 .. r0+nrows-1 of src (rows R floats apart, HD used), zero-padded to TILE rows and
 * HDP columns, so that the dot products may run over HDP with no bounds checks. */
template <int HDP, int TILE>
static __device__ __forceinline__ void att_load_rows(float *dst, int stride, const float *src, size_t R, int r0,
                                                     int nrows, int HD) {
    for (int i = threadIdx.x; i < TILE * HDP; i += ATT_THREADS) {
        int r = i / HDP, d = i % HDP;
        dst[r * stride + d] = (r < nrows && d < HD) ? src[(size_t)(r0 + r) * R + d] : 0.0f;
    }
}

/* ------------------------------------------------------------------------------------------------ plain rung */

/* One thread per (b, h, t): online softmax over keys [lo, t]. out (N, NH*HD), lse (N, NH) or NULL. */
static __global__ void att_fwd_plain(float *out, float *lse, const float *qkv, const int32_t *seg, int B, int T,
                                     int NH, int NKV, int HD, float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T)
        return;
    int t = (int)(idx % T), h = (int)(idx / T % NH), b = (int)(idx / ((size_t)T * NH)), kh = h / (NH / NKV);
    size_t R = (size_t)(NH + 2 * NKV) * HD, n = (size_t)b * T + t;
    const float *q = qkv + n * R + (size_t)h * HD;
    const float *kb = qkv + (size_t)b * T * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;
    float acc[ATT_PLAIN_MAXHD];
    for (int i = 0; i < HD; i++)
        acc[i] = 0.0f;
    float mx = -INFINITY, sum = 0.0f;
    for (int s = att_first_key(seg, n, t); s <= t; s++) {
        const float *k = kb + (size_t)s * R, *v = vb + (size_t)s * R;
        float d = 0.0f;
        for (int i = 0; i < HD; i++)
            d += q[i] * k[i];
        float sc = d * scale;
        if (sc > mx) { /* rescale what was summed under the old max */
            float corr = expf(mx - sc);
            sum *= corr;
            for (int i = 0; i < HD; i++)
                acc[i] *= corr;
            mx = sc;
        }
        float p = expf(sc - mx);
        sum += p;
        for (int i = 0; i < HD; i++)
            acc[i] += p * v[i];
    }
    float *o = out + n * NH * HD + (size_t)h * HD;
    float inv = 1.0f / sum;
    for (int i = 0; i < HD; i++)
        o[i] = acc[i] * inv;
    if (lse)
        lse[n * NH + h] = mx + logf(sum);
}

/* D (rows) = the dot product of each HD-float row of dout and out: rowsum(dout * out) per (token, head). */
static __global__ void att_rowdot(float *D, const float *dout, const float *out, size_t rows, int HD) {
    size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    const float *g = dout + r * HD, *o = out + r * HD;
    float d = 0.0f;
    for (int i = 0; i < HD; i++)
        d += g[i] * o[i];
    D[r] = d;
}

/* dq of one (b, h, t) per thread: dq += sum over keys s of scale * p (dout.v_s - D) k_s. */
static __global__ void att_bwd_dq_plain(float *dqkv, const float *dout, const float *qkv, const float *lse,
                                        const float *D, const int32_t *seg, int B, int T, int NH, int NKV, int HD,
                                        float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T)
        return;
    int t = (int)(idx % T), h = (int)(idx / T % NH), b = (int)(idx / ((size_t)T * NH)), kh = h / (NH / NKV);
    size_t R = (size_t)(NH + 2 * NKV) * HD, n = (size_t)b * T + t;
    const float *q = qkv + n * R + (size_t)h * HD, *g = dout + n * NH * HD + (size_t)h * HD;
    const float *kb = qkv + (size_t)b * T * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;
    float L = lse[n * NH + h], Dn = D[n * NH + h];
    float dq[ATT_PLAIN_MAXHD];
    for (int i = 0; i < HD; i++)
        dq[i] = 0.0f;
    for (int s = att_first_key(seg, n, t); s <= t; s++) {
        const float *k = kb + (size_t)s * R, *v = vb + (size_t)s * R;
        float sc = 0.0f, dp = 0.0f;
        for (int i = 0; i < HD; i++) {
            sc += q[i] * k[i];
            dp += g[i] * v[i];
        }
        float p = expf(scale * sc - L), ds = scale * p * (dp - Dn);
        for (int i = 0; i < HD; i++)
            dq[i] += ds * k[i];
    }
    float *out = dqkv + n * R + (size_t)h * HD;
    for (int i = 0; i < HD; i++)
        out[i] += dq[i];
}

/* dk, dv of one (b, kv head, key s) per thread: the sum over the group's query heads and the queries t >= s that
 * see s (seg_start[t] <= s). */
static __global__ void att_bwd_dkv_plain(float *dqkv, const float *dout, const float *qkv, const float *lse,
                                         const float *D, const int32_t *seg, int B, int T, int NH, int NKV, int HD,
                                         float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NKV * T)
        return;
    int s = (int)(idx % T), kh = (int)(idx / T % NKV), b = (int)(idx / ((size_t)T * NKV)), G = NH / NKV;
    size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T;
    size_t koff = (row0 + s) * R + (size_t)(NH + kh) * HD, voff = koff + (size_t)NKV * HD;
    const float *k = qkv + koff, *v = qkv + voff;
    float dk[ATT_PLAIN_MAXHD], dv[ATT_PLAIN_MAXHD];
    for (int i = 0; i < HD; i++)
        dk[i] = dv[i] = 0.0f;
    for (int h = kh * G; h < (kh + 1) * G; h++)
        for (int t = s; t < T; t++) {
            size_t n = row0 + t;
            if (att_first_key(seg, n, t) > s)
                continue;
            const float *q = qkv + n * R + (size_t)h * HD, *g = dout + n * NH * HD + (size_t)h * HD;
            float sc = 0.0f, dp = 0.0f;
            for (int i = 0; i < HD; i++) {
                sc += q[i] * k[i];
                dp += g[i] * v[i];
            }
            float p = expf(scale * sc - lse[n * NH + h]), ds = scale * p * (dp - D[n * NH + h]);
            for (int i = 0; i < HD; i++) {
                dv[i] += p * g[i];
                dk[i] += ds * q[i];
            }
        }
    for (int i = 0; i < HD; i++) {
        dqkv[koff + i] += dk[i];
        dqkv[voff + i] += dv[i];
    }
}

/* ------------------------------------------------------------------------------------------------ tiled rung */
/* TILE query rows and TILE keys per tile (64; 32 above HD 128, so that the tiles of HD 256 fit in an A100's shared
 * memory; smaller where the device's shared memory is, see att_choose); RI = TILE/16. Thread (ty, tx) =
 * (threadIdx.x / 16, threadIdx.x % 16) owns tile rows ty + 16*i (i < RI) and, of a score tile, columns tx + 16*j
 * (j < RI); of an output tile, columns tx + 16*jj (jj < NJ). HDP = 16*NJ >= HD. Shared tiles of HD floats per row
 * use the odd stride HDP + 1, so the 16 rows a half warp reads in a dot product fall in 16 banks. */

/* Forward: block (query tile from the end, h, b). out (N, NH*HD), lse (N, NH) or NULL. */
template <int NJ, int TILE>
static __global__ void __launch_bounds__(ATT_THREADS)
    att_fwd_tiled(float *out, float *lse, const float *qkv, const int32_t *seg, int T, int NH, int NKV, int HD,
                  float scale) {
    constexpr int HDP = 16 * NJ, QS = HDP + 1, RI = TILE / 16, PS = TILE + 1;
    extern __shared__ float sm[];
    /* V is only read along rows, so it needs no padding: at HD 128 that lets two blocks share an SM's 228 KiB */
    float *Qs = sm, *Ks = Qs + TILE * QS, *Vs = Ks + TILE * QS, *Ps = Vs + TILE * HDP;
    __shared__ int lo_s[TILE];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int t0 = (gridDim.x - 1 - blockIdx.x) * TILE; /* the longest tiles start first */
    const int nr = min(TILE, T - t0), tlast = t0 + nr - 1;
    const size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T;
    const float *kb = qkv + row0 * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;

    att_load_rows<HDP, TILE>(Qs, QS, qkv + row0 * R + (size_t)h * HD, R, t0, nr, HD);
    if (tid < TILE) /* rows past the end see no key */
        lo_s[tid] = tid < nr ? att_first_key(seg, row0 + t0 + tid, t0 + tid) : INT_MAX;
    __syncthreads();
    int kmin = tlast;
    for (int r = 0; r < nr; r++)
        kmin = min(kmin, lo_s[r]);
    int rlo[RI];
    float m[RI], l[RI], o[RI][NJ];
#pragma unroll
    for (int i = 0; i < RI; i++) {
        rlo[i] = lo_s[ty + 16 * i];
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
            o[i][jj] = 0.0f;
    }

    for (int s0 = kmin; s0 <= tlast; s0 += TILE) {
        int ns = min(TILE, tlast + 1 - s0);
        att_load_rows<HDP, TILE>(Ks, QS, kb, R, s0, ns, HD);
        att_load_rows<HDP, TILE>(Vs, HDP, vb, R, s0, ns, HD);
        __syncthreads();
        float sc[RI][RI];
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int j = 0; j < RI; j++)
                sc[i][j] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < HDP; d++) {
            float q[RI], k[RI];
#pragma unroll
            for (int i = 0; i < RI; i++)
                q[i] = Qs[(ty + 16 * i) * QS + d];
#pragma unroll
            for (int j = 0; j < RI; j++)
                k[j] = Ks[(tx + 16 * j) * QS + d];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < RI; j++)
                    sc[i][j] = fmaf(q[i], k[j], sc[i][j]);
        }
        /* online softmax: each row's TILE scores lie on the 16 lanes of one half warp */
#pragma unroll
        for (int i = 0; i < RI; i++) {
            int t = t0 + ty + 16 * i;
            float tmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < RI; j++) {
                int s = s0 + tx + 16 * j;
                sc[i][j] = (s >= rlo[i] && s <= t) ? sc[i][j] * scale : -INFINITY;
                tmax = fmaxf(tmax, sc[i][j]);
            }
            tmax = att_max16(tmax);
            float mnew = fmaxf(m[i], tmax), ms = mnew == -INFINITY ? 0.0f : mnew; /* ms: no -inf - -inf */
            float corr = expf(m[i] - ms), psum = 0.0f;
#pragma unroll
            for (int j = 0; j < RI; j++) {
                float p = sc[i][j] == -INFINITY ? 0.0f : expf(sc[i][j] - ms);
                Ps[(ty + 16 * i) * PS + tx + 16 * j] = p;
                psum += p;
            }
            l[i] = l[i] * corr + att_sum16(psum);
            m[i] = mnew;
#pragma unroll
            for (int jj = 0; jj < NJ; jj++)
                o[i][jj] *= corr;
        }
        __syncthreads();
#pragma unroll 4
        for (int c = 0; c < TILE; c++) {
            float p[RI], v[NJ];
#pragma unroll
            for (int i = 0; i < RI; i++)
                p[i] = Ps[(ty + 16 * i) * PS + c];
#pragma unroll
            for (int jj = 0; jj < NJ; jj++)
                v[jj] = Vs[c * HDP + tx + 16 * jj];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int jj = 0; jj < NJ; jj++)
                    o[i][jj] = fmaf(p[i], v[jj], o[i][jj]);
        }
        __syncthreads(); /* Ks, Vs, Ps are overwritten next */
    }

#pragma unroll
    for (int i = 0; i < RI; i++) {
        int r = ty + 16 * i;
        if (r >= nr)
            continue;
        size_t n = row0 + t0 + r;
        float inv = 1.0f / l[i];
        float *orow = out + n * NH * HD + (size_t)h * HD;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            int col = tx + 16 * jj;
            if (col < HD)
                orow[col] = o[i][jj] * inv;
        }
        if (lse && tx == 0)
            lse[n * NH + h] = m[i] + logf(l[i]);
    }
}

/* Backward, dQ pass: block (query tile from the end, h, b) loops over its key tiles like the forward and
 * accumulates dq (RI rows x NJ columns per thread) in registers. */
template <int NJ, int TILE>
static __global__ void __launch_bounds__(ATT_THREADS)
    att_bwd_dq_tiled(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D,
                     const int32_t *seg, int T, int NH, int NKV, int HD, float scale) {
    constexpr int HDP = 16 * NJ, QS = HDP + 1, RI = TILE / 16, PS = TILE + 1;
    extern __shared__ float sm[];
    float *Qs = sm, *Gs = Qs + TILE * QS, *Ks = Gs + TILE * QS, *Vs = Ks + TILE * QS;
    float *Ss = Vs + TILE * QS; /* (TILE, PS) dS of the current key tile */
    __shared__ int lo_s[TILE];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int t0 = (gridDim.x - 1 - blockIdx.x) * TILE;
    const int nr = min(TILE, T - t0), tlast = t0 + nr - 1;
    const size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T, OR = (size_t)NH * HD;
    const float *kb = qkv + row0 * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;

    att_load_rows<HDP, TILE>(Qs, QS, qkv + row0 * R + (size_t)h * HD, R, t0, nr, HD);
    att_load_rows<HDP, TILE>(Gs, QS, dout + row0 * OR + (size_t)h * HD, OR, t0, nr, HD);
    if (tid < TILE)
        lo_s[tid] = tid < nr ? att_first_key(seg, row0 + t0 + tid, t0 + tid) : INT_MAX;
    __syncthreads();
    int kmin = tlast;
    for (int r = 0; r < nr; r++)
        kmin = min(kmin, lo_s[r]);
    int rlo[RI];
    float rL[RI], rD[RI], dq[RI][NJ];
#pragma unroll
    for (int i = 0; i < RI; i++) {
        int r = ty + 16 * i;
        rlo[i] = lo_s[r];
        rL[i] = r < nr ? lse[(row0 + t0 + r) * NH + h] : 0.0f;
        rD[i] = r < nr ? D[(row0 + t0 + r) * NH + h] : 0.0f;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
            dq[i][jj] = 0.0f;
    }

    for (int s0 = kmin; s0 <= tlast; s0 += TILE) {
        int ns = min(TILE, tlast + 1 - s0);
        att_load_rows<HDP, TILE>(Ks, QS, kb, R, s0, ns, HD);
        att_load_rows<HDP, TILE>(Vs, QS, vb, R, s0, ns, HD);
        __syncthreads();
        float sc[RI][RI], dp[RI][RI];
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int j = 0; j < RI; j++)
                sc[i][j] = dp[i][j] = 0.0f;
#pragma unroll 2
        for (int d = 0; d < HDP; d++) {
            float q[RI], g[RI], k[RI], v[RI];
#pragma unroll
            for (int i = 0; i < RI; i++) {
                q[i] = Qs[(ty + 16 * i) * QS + d];
                g[i] = Gs[(ty + 16 * i) * QS + d];
            }
#pragma unroll
            for (int j = 0; j < RI; j++) {
                k[j] = Ks[(tx + 16 * j) * QS + d];
                v[j] = Vs[(tx + 16 * j) * QS + d];
            }
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < RI; j++) {
                    sc[i][j] = fmaf(q[i], k[j], sc[i][j]);
                    dp[i][j] = fmaf(g[i], v[j], dp[i][j]);
                }
        }
#pragma unroll
        for (int i = 0; i < RI; i++) {
            int t = t0 + ty + 16 * i;
#pragma unroll
            for (int j = 0; j < RI; j++) {
                int s = s0 + tx + 16 * j;
                float p = (s >= rlo[i] && s <= t) ? expf(scale * sc[i][j] - rL[i]) : 0.0f;
                Ss[(ty + 16 * i) * PS + tx + 16 * j] = scale * p * (dp[i][j] - rD[i]);
            }
        }
        __syncthreads();
#pragma unroll 4
        for (int c = 0; c < TILE; c++) {
            float ds[RI], k[NJ];
#pragma unroll
            for (int i = 0; i < RI; i++)
                ds[i] = Ss[(ty + 16 * i) * PS + c];
#pragma unroll
            for (int jj = 0; jj < NJ; jj++)
                k[jj] = Ks[c * QS + tx + 16 * jj];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int jj = 0; jj < NJ; jj++)
                    dq[i][jj] = fmaf(ds[i], k[jj], dq[i][jj]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < RI; i++) {
        int r = ty + 16 * i;
        if (r >= nr)
            continue;
        float *drow = dqkv + (row0 + t0 + r) * R + (size_t)h * HD;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            int col = tx + 16 * jj;
            if (col < HD)
                drow[col] += dq[i][jj];
        }
    }
}

/* Backward, dK/dV pass: block (key tile, kv head, b) keeps its keys and values in shared memory and loops over the
 * group's query heads and, for each, over the query tiles from its own position to the end, skipping tiles whose
 * rows all start after the key tile (seg_start). Thread rows are keys here, score columns are queries. */
template <int NJ, int TILE>
static __global__ void __launch_bounds__(ATT_THREADS)
    att_bwd_dkv_tiled(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D,
                      const int32_t *seg, int T, int NH, int NKV, int HD, float scale) {
    constexpr int HDP = 16 * NJ, QS = HDP + 1, RI = TILE / 16, PS = TILE + 1;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + TILE * QS, *Qs = Vs + TILE * QS, *Gs = Qs + TILE * QS;
    float *Ps = Gs + TILE * QS, *Ss = Ps + TILE * PS; /* (TILE keys, PS) p and dS, transposed */
    __shared__ int lo_s[TILE];
    __shared__ float L_s[TILE], D_s[TILE];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int kh = blockIdx.y, b = blockIdx.z, G = NH / NKV;
    const int s0 = blockIdx.x * TILE, ns = min(TILE, T - s0), s1 = s0 + ns - 1;
    const size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T, OR = (size_t)NH * HD;
    const size_t koff = row0 * R + (size_t)(NH + kh) * HD, voff = koff + (size_t)NKV * HD;

    att_load_rows<HDP, TILE>(Ks, QS, qkv + koff, R, s0, ns, HD);
    att_load_rows<HDP, TILE>(Vs, QS, qkv + voff, R, s0, ns, HD);
    float dk[RI][NJ], dv[RI][NJ];
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
            dk[i][jj] = dv[i][jj] = 0.0f;

    for (int h = kh * G; h < (kh + 1) * G; h++) {
        const float *qb = qkv + row0 * R + (size_t)h * HD, *gb = dout + row0 * OR + (size_t)h * HD;
        for (int t0 = s0; t0 < T; t0 += TILE) {
            int nq = min(TILE, T - t0), need = 0;
            if (tid < TILE) {
                int valid = tid < nq;
                size_t n = row0 + t0 + tid;
                int lo = valid ? att_first_key(seg, n, t0 + tid) : INT_MAX;
                lo_s[tid] = lo;
                L_s[tid] = valid ? lse[n * NH + h] : 0.0f;
                D_s[tid] = valid ? D[n * NH + h] : 0.0f;
                need = lo <= s1;
            }
            if (!__syncthreads_or(need)) /* no query of this tile sees any key of ours */
                continue;
            att_load_rows<HDP, TILE>(Qs, QS, qb, R, t0, nq, HD);
            att_load_rows<HDP, TILE>(Gs, QS, gb, OR, t0, nq, HD);
            __syncthreads();
            float sc[RI][RI], dp[RI][RI];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < RI; j++)
                    sc[i][j] = dp[i][j] = 0.0f;
#pragma unroll 2
            for (int d = 0; d < HDP; d++) {
                float k[RI], v[RI], q[RI], g[RI];
#pragma unroll
                for (int i = 0; i < RI; i++) {
                    k[i] = Ks[(ty + 16 * i) * QS + d];
                    v[i] = Vs[(ty + 16 * i) * QS + d];
                }
#pragma unroll
                for (int j = 0; j < RI; j++) {
                    q[j] = Qs[(tx + 16 * j) * QS + d];
                    g[j] = Gs[(tx + 16 * j) * QS + d];
                }
#pragma unroll
                for (int i = 0; i < RI; i++)
#pragma unroll
                    for (int j = 0; j < RI; j++) {
                        sc[i][j] = fmaf(k[i], q[j], sc[i][j]);
                        dp[i][j] = fmaf(v[i], g[j], dp[i][j]);
                    }
            }
#pragma unroll
            for (int i = 0; i < RI; i++) {
                int s = s0 + ty + 16 * i;
#pragma unroll
                for (int j = 0; j < RI; j++) {
                    int c = tx + 16 * j, t = t0 + c;
                    float p = (s <= s1 && s >= lo_s[c] && s <= t) ? expf(scale * sc[i][j] - L_s[c]) : 0.0f;
                    Ps[(ty + 16 * i) * PS + c] = p;
                    Ss[(ty + 16 * i) * PS + c] = scale * p * (dp[i][j] - D_s[c]);
                }
            }
            __syncthreads();
#pragma unroll 2
            for (int c = 0; c < TILE; c++) {
                float p[RI], ds[RI], g[NJ], q[NJ];
#pragma unroll
                for (int i = 0; i < RI; i++) {
                    p[i] = Ps[(ty + 16 * i) * PS + c];
                    ds[i] = Ss[(ty + 16 * i) * PS + c];
                }
#pragma unroll
                for (int jj = 0; jj < NJ; jj++) {
                    g[jj] = Gs[c * QS + tx + 16 * jj];
                    q[jj] = Qs[c * QS + tx + 16 * jj];
                }
#pragma unroll
                for (int i = 0; i < RI; i++)
#pragma unroll
                    for (int jj = 0; jj < NJ; jj++) {
                        dv[i][jj] = fmaf(p[i], g[jj], dv[i][jj]);
                        dk[i][jj] = fmaf(ds[i], q[jj], dk[i][jj]);
                    }
            }
            __syncthreads(); /* lo_s, Qs, Gs, Ps, Ss are overwritten next */
        }
    }

#pragma unroll
    for (int i = 0; i < RI; i++) {
        int r = ty + 16 * i;
        if (r >= ns)
            continue;
        float *dkrow = dqkv + koff + (size_t)(s0 + r) * R, *dvrow = dqkv + voff + (size_t)(s0 + r) * R;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            int col = tx + 16 * jj;
            if (col < HD) {
                dkrow[col] += dk[i][jj];
                dvrow[col] += dv[i][jj];
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ host side */

enum { ATT_PLAIN, ATT_TILED, ATT_TC };

/* NJ of the tiled instance for HD: columns per thread, HD zero-padded to 16*NJ */
static int att_nj(int HD) { return HD <= 32 ? 2 : HD <= 64 ? 4 : HD <= 128 ? 8 : 16; }

/* dynamic shared memory of a tiled kernel with nq (TILE, HDP+1) tiles, nv (TILE, HDP) tiles and np (TILE, TILE+1)
 * tiles, HDP = 16*NJ */
static size_t att_smem(int HD, int tile, int nq, int nv, int np) {
    size_t hdp = 16 * (size_t)att_nj(HD), t = (size_t)tile;
    return ((size_t)nq * t * (hdp + 1) + (size_t)nv * t * hdp + (size_t)np * t * (t + 1)) * sizeof(float);
}
#define ATT_SMEM_FWD(HD, TILE) att_smem(HD, TILE, 2, 1, 1)
#define ATT_SMEM_DQ(HD, TILE) att_smem(HD, TILE, 4, 0, 1)
#define ATT_SMEM_DKV(HD, TILE) att_smem(HD, TILE, 4, 0, 2) /* the largest of the three */

/* The tiled instances (NJ, TILE), and F<NJ, TILE>(...) run for the one chosen: TILE 64 up to HD 128; 32 at HD 128
 * and 256 (above 128, 64 would not fit even an H100); 16 at HD 256, for devices with 99 KiB per block (RTX 4090). */
static int att_have(int nj, int tile) {
    return tile == 64 ? nj <= 8 : tile == 32 ? nj >= 8 : tile == 16 && nj == 16;
}
#define ATT_DISPATCH(ch, F, ...)                                                                                  \
    switch ((ch).nj * 100 + (ch).tile) {                                                                          \
    case 264: F<2, 64>(__VA_ARGS__); break;                                                                       \
    case 464: F<4, 64>(__VA_ARGS__); break;                                                                       \
    case 864: F<8, 64>(__VA_ARGS__); break;                                                                       \
    case 832: F<8, 32>(__VA_ARGS__); break;                                                                       \
    case 1632: F<16, 32>(__VA_ARGS__); break;                                                                     \
    default: F<16, 16>(__VA_ARGS__); break;                                                                       \
    }

/* The rung for a shape and precision (the rule is in the comment at the top) and, for the tiled one, its instance:
 * the largest tile whose dK/dV kernel fits the device's shared memory per block. It depends on HD, be->math,
 * SNUG_CUDA_ATTN and the device only, never on the pointers or on the pass, so a layer's forward and its backward
 * in the same step always run the same kernels: a bf16 forward's lse paired with an fp32 backward would recompute
 * probabilities that are not the ones the forward used. SNUG_CUDA_ATTN=tiled32 or tiled16 caps the tile (the tests
 * run the small tiles on a large GPU that way). */
typedef struct {
    int rung, nj, tile;
} att_choice;

static att_choice att_choose(snug_backend *be, int HD) {
    att_choice c = {ATT_PLAIN, att_nj(HD), 0};
    const char *e = getenv("SNUG_CUDA_ATTN");
    if (e && strcmp(e, "plain") == 0)
        return c;
    size_t optin = (size_t)snug_cuda(be)->smem_optin;
    int want_tc = be->math == SNUG_DT_BF16 || be->math == SNUG_DT_F16;
    if (e && strcmp(e, "tc") == 0)
        want_tc = 1;
    if (e && strncmp(e, "tiled", 5) == 0)
        want_tc = 0;
    if (want_tc && HD % 16 == 0 && HD <= 128 && snug_cuda_attention_tc_smem(HD) + 2048 <= optin) { /* + static */
        c.rung = ATT_TC;
        return c;
    }
    int most = e && strcmp(e, "tiled32") == 0 ? 32 : e && strcmp(e, "tiled16") == 0 ? 16 : 64;
    for (int t = most; t >= 16 && HD <= ATT_TILED_MAXHD; t /= 2)
        if (att_have(c.nj, t) && ATT_SMEM_DKV(HD, t) + 1024 <= optin) { /* + the kernels' static shared arrays */
            c.rung = ATT_TILED;
            c.tile = t;
            break;
        }
    return c;
}

/* The tc kernels read rows with float4 loads: their tensors' rows are 16-byte aligned when the pointers are (HD is a
 * multiple of 16), always so for arena tensors. A misaligned caller is a bug, recorded rather than served by another
 * rung (which would break the pairing above). 1 when aligned. */
static int att_tc_aligned(snug_backend *be, int line, const void *a, const void *b) {
    if ((((uintptr_t)a | (uintptr_t)b) & 15) == 0)
        return 1;
    snug_cuda_fail(be, __FILE__, line, "attention (tensor-core rung): qkv and dout must be 16-byte aligned");
    return 0;
}

template <int NJ, int TILE>
static void att_fwd_tiled_run(snug_backend *be, cudaStream_t st, float *out, float *lse, const float *qkv,
                              const int32_t *seg, int B, int T, int NH, int NKV, int HD, float scale) {
    size_t smem = ATT_SMEM_FWD(HD, TILE);
    SNUG_CUDA_CHECK(
        cudaFuncSetAttribute(att_fwd_tiled<NJ, TILE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + TILE - 1) / TILE, NH, B);
    att_fwd_tiled<NJ, TILE><<<grid, ATT_THREADS, smem, st>>>(out, lse, qkv, seg, T, NH, NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
}

template <int NJ, int TILE>
static void att_bwd_tiled_run(snug_backend *be, cudaStream_t st, float *dqkv, const float *dout, const float *qkv,
                              const float *lse, const float *D, const int32_t *seg, int B, int T, int NH, int NKV,
                              int HD, float scale) {
    int ntiles = (T + TILE - 1) / TILE;
    size_t smem_dq = ATT_SMEM_DQ(HD, TILE), smem_dkv = ATT_SMEM_DKV(HD, TILE);
    SNUG_CUDA_CHECK(
        cudaFuncSetAttribute(att_bwd_dq_tiled<NJ, TILE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq));
    SNUG_CUDA_CHECK(cudaFuncSetAttribute(att_bwd_dkv_tiled<NJ, TILE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem_dkv));
    att_bwd_dq_tiled<NJ, TILE><<<dim3(ntiles, NH, B), ATT_THREADS, smem_dq, st>>>(dqkv, dout, qkv, lse, D, seg, T,
                                                                                  NH, NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
    att_bwd_dkv_tiled<NJ, TILE><<<dim3(ntiles, NKV, B), ATT_THREADS, smem_dkv, st>>>(dqkv, dout, qkv, lse, D, seg, T,
                                                                                     NH, NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_attention_fwd(snug_backend *be, float *out, float *lse, const float *qkv,
                                        const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                                        float scale) {
    // qkv (N, (NH+2*NKV)*HD) ; out (N, NH*HD) ; lse (N, NH) or NULL ; seg_start (N) or NULL
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    cudaStream_t st = snug_cuda_stream(be);
    att_choice ch = att_choose(be, HD);
    if (ch.rung == ATT_TC) {
        if (att_tc_aligned(be, __LINE__, qkv, qkv))
            snug_cuda_attention_tc_fwd(be, out, lse, qkv, seg_start, B, T, NH, NKV, HD, scale);
        return;
    }
    if (HD > ATT_PLAIN_MAXHD) {
        att_fail(be, __LINE__, "attention", HD, ATT_PLAIN_MAXHD);
        return;
    }
    if (ch.rung == ATT_PLAIN) {
        size_t rows = (size_t)B * NH * T;
        att_fwd_plain<<<att_blocks(rows, 128), 128, 0, st>>>(out, lse, qkv, seg_start, B, T, NH, NKV, HD, scale);
        SNUG_CUDA_LAUNCHED();
        return;
    }
    ATT_DISPATCH(ch, att_fwd_tiled_run, be, st, out, lse, qkv, seg_start, B, T, NH, NKV, HD, scale)
}

extern "C" void snug_cuda_attention_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv,
                                        const float *out, const float *lse, const int32_t *seg_start, int B, int T,
                                        int NH, int NKV, int HD, float scale) {
    // dqkv (N, (NH+2*NKV)*HD) += ; dout, out (N, NH*HD) ; lse (N, NH)
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    if (HD > ATT_PLAIN_MAXHD) {
        att_fail(be, __LINE__, "attention backward", HD, ATT_PLAIN_MAXHD);
        return;
    }
    cudaStream_t st = snug_cuda_stream(be);
    att_choice ch = att_choose(be, HD); /* the forward's: the same arguments give the same choice */
    if (ch.rung == ATT_TC && !att_tc_aligned(be, __LINE__, qkv, dout))
        return;
    size_t rows = (size_t)B * T * NH;
    float *D = (float *)snug_cuda_scratch(be, rows * sizeof(float)); /* (N, NH) rowsum(dout * out) */
    if (!D)
        return;
    att_rowdot<<<att_blocks(rows, 256), 256, 0, st>>>(D, dout, out, rows, HD);
    SNUG_CUDA_LAUNCHED();
    if (ch.rung == ATT_TC) {
        snug_cuda_attention_tc_bwd(be, dqkv, dout, qkv, lse, D, seg_start, B, T, NH, NKV, HD, scale);
        return;
    }
    if (ch.rung == ATT_PLAIN) {
        att_bwd_dq_plain<<<att_blocks(rows, 128), 128, 0, st>>>(dqkv, dout, qkv, lse, D, seg_start, B, T, NH, NKV, HD,
                                                                 scale);
        SNUG_CUDA_LAUNCHED();
        att_bwd_dkv_plain<<<att_blocks((size_t)B * NKV * T, 128), 128, 0, st>>>(dqkv, dout, qkv, lse, D, seg_start, B,
                                                                                 T, NH, NKV, HD, scale);
        SNUG_CUDA_LAUNCHED();
        return;
    }
    ATT_DISPATCH(ch, att_bwd_tiled_run, be, st, dqkv, dout, qkv, lse, D, seg_start, B, T, NH, NKV, HD, scale)
}
