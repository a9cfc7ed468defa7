/* attention_tc_cuda.cu: the third rung of the CUDA attention ladder: FlashAttention-2 forward and backward on the
 * tensor cores, in bf16 with fp32 accumulation. attention_cuda.cu holds the two fp32 rungs and chooses between the
 * three; the semantics are those of backend/backend.h (causal, grouped-query, variable length through seg_start,
 * fp32 qkv, out, lse and dqkv in memory, dqkv accumulated +=).
 *
 * What is rounded: each tile of q, k, v (and of dout in backward) is rounded to bf16 as it is copied into shared
 * memory, and so are the probabilities P and the score gradients dS before they are multiplied again. Products run
 * on the tensor cores through the WMMA API (16 x 16 x 16 bf16 fragments, fp32 accumulators); the softmax statistics
 * (running max, sum, lse), the output and every gradient accumulate in fp32. Under fp16 mixed precision the same
 * bf16 kernels run: bf16 has fp32's exponent range, so nothing can overflow, at 3 bits less precision than fp16.
 *
 * Layout: a block of 4 warps (128 threads) owns a tile of 64 rows, each warp 16 of them, and loops over tiles of 64
 * columns (keys in forward and in the dQ pass, queries in the dK/dV pass) loaded into shared memory. HD is padded
 * with zeros to HDP = 64 or 128 (the two template instances of each kernel). Shared tiles (64, HDP + 8) bf16: the 8
 * extra columns keep the rows of a fragment load in different banks.
 *
 *   forward  warp: S (16, 64) = Q_w K^T on the tensor cores, stored to shared fp32; two lanes per row run the online
 *            softmax (max, rescale factor, sum) and write P as bf16; the output fragments O (16, HDP) are rescaled
 *            and O += P V. out = O / l and lse = m + log l at the end.
 *   dQ       warp: S = Q_w K^T and dP = dO_w V^T, then elementwise in the fragments p = exp(scale s - lse),
 *            dS = scale p (dP - D) written as bf16; dQ (16, HDP) += dS K, added to dqkv at the end.
 *   dK/dV    block (key tile, kv head, b) loops over the group's query heads and the query tiles that see its keys;
 *            warp: S^T = K_w Q^T, dP^T = V_w dO^T, P^T and dS^T as above; dV += P^T dO, dK += dS^T Q.
 * Masked tiles are skipped as in the tiled rung (key tiles start at the earliest seg_start of the query tile and stop
 * at the diagonal; dK/dV skips query tiles that see none of its keys); masking inside a tile is per element. No
 * (T, T) buffer, no atomics: every output element is written by one lane of one block, so backward is
 * deterministic.
 *
 * WMMA does not say which lane holds which element of a fragment, only that it is fixed for a fragment type. The
 * kernels never assume one: a fragment loaded from the table r*16 + c (tc_pos) tells each lane the row and column of
 * each of its accumulator elements, which is all the elementwise steps (masking, rescaling by row, the final writes)
 * need.
 *
 * Shared memory per block (dynamic, + 1.75 KiB static): at HDP 128 forward 77 KiB, dQ 77 KiB, dK/dV 86 KiB, so two
 * blocks (8 warps) per H100/H200 SM, which is also what the backward's ~254 registers per thread allow; at HDP 64
 * 45 to 54 KiB and at most 168 registers: three or four blocks. q, k, v and dout rows must be 16-byte aligned
 * (float4 loads); the dispatcher checks. */
#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

using namespace nvcuda;

#define TC_TILE 64                  /* rows of a block's tile; columns of the tiles it loops over */
#define TC_WARPS 4                  /* each warp owns 16 rows of the block's tile */
#define TC_THREADS (32 * TC_WARPS)
#define TC_PS (TC_TILE + 8)         /* row stride of a warp's (16, 64) bf16 tile of P or dS */
#define TC_SS (TC_TILE + 4)         /* row stride of a warp's (16, 64) fp32 tile of scores (forward) */

typedef __nv_bfloat16 bf16;
/* A (16 rows, 16 k) stored by rows; B (16 k, 16 n) stored by rows, or stored as n rows of k (a B^T in memory: the
 * key rows of S = Q K^T); C (16, 16) fp32 */
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;
#define TC_NE frag_c::num_elements

/* ------------------------------------------------------------------------------------------------ helpers */

/* First key of query token n (row-local index t), clamped into [0, t], as on the CPU. */
static __device__ __forceinline__ int tc_first_key(const int32_t *seg, size_t n, int t) {
    int lo = seg ? seg[n] : 0;
    return lo < 0 ? 0 : lo > t ? t : lo;
}

/* pos: element i of every frag_c of this lane sits at row (int)pos.x[i] / 16, column (int)pos.x[i] % 16 of its
 * 16 x 16 tile. table: shared (16, 16) floats, 32-byte aligned. Every thread of the block calls this. */
static __device__ void tc_pos(frag_c &pos, float *table) {
    for (int i = threadIdx.x; i < 256; i += TC_THREADS)
        table[i] = (float)i;
    __syncthreads();
    wmma::load_matrix_sync(pos, table, 16, wmma::mem_row_major);
}
static __device__ __forceinline__ int tc_row(const frag_c &pos, int i) { return (int)pos.x[i] >> 4; }
static __device__ __forceinline__ int tc_col(const frag_c &pos, int i) { return (int)pos.x[i] & 15; }

/* dst (TILE, HDP + 8) bf16 = rows r0 .. r0+nrows-1 of src (rows R floats apart, HD used) rounded to bf16, zero-padded
 * to TILE rows and HDP columns. Rows of src are 16-byte aligned and HD is a multiple of 16. */
template <int HDP>
static __device__ void tc_load_rows(bf16 *dst, const float *src, size_t R, int r0, int nrows, int HD) {
    for (int i = threadIdx.x; i < TC_TILE * HDP / 4; i += TC_THREADS) {
        int r = i / (HDP / 4), c = i % (HDP / 4) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < nrows && c < HD)
            v = *(const float4 *)(src + (size_t)(r0 + r) * R + c);
        __nv_bfloat162 *d = (__nv_bfloat162 *)(dst + r * (HDP + 8) + c);
        d[0] = __floats2bfloat162_rn(v.x, v.y);
        d[1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

/* ------------------------------------------------------------------------------------------------ forward */

/* Block (query tile from the end, h, b). out (N, NH*HD), lse (N, NH) or NULL. */
template <int HDP>
static __global__ void __launch_bounds__(TC_THREADS)
    att_tc_fwd(float *out, float *lse, const float *qkv, const int32_t *seg, int T, int NH, int NKV, int HD,
               float scale) {
    constexpr int HS = HDP + 8, NF = HDP / 16; /* NF: 16-column slices of a head */
    extern __shared__ __align__(128) unsigned char tc_sm[];
    bf16 *Qs = (bf16 *)tc_sm, *Ks = Qs + TC_TILE * HS, *Vs = Ks + TC_TILE * HS; /* (TILE, HS) each */
    bf16 *Ps = Vs + TC_TILE * HS;                                             /* (WARPS, 16, TC_PS) */
    float *Ss = (float *)(Ps + TC_WARPS * 16 * TC_PS);                        /* (WARPS, 16, TC_SS) */
    __shared__ __align__(32) float pos_s[256];
    __shared__ int lo_s[TC_TILE];
    __shared__ float corr_s[TC_TILE], l_s[TC_TILE];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int t0 = (gridDim.x - 1 - blockIdx.x) * TC_TILE; /* the longest tiles start first */
    const int nr = min(TC_TILE, T - t0), tlast = t0 + nr - 1;
    const size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T;
    const float *kb = qkv + row0 * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;

    tc_load_rows<HDP>(Qs, qkv + row0 * R + (size_t)h * HD, R, t0, nr, HD);
    if (threadIdx.x < TC_TILE) /* rows past the end see no key */
        lo_s[threadIdx.x] = threadIdx.x < nr ? tc_first_key(seg, row0 + t0 + threadIdx.x, t0 + threadIdx.x) : INT_MAX;
    frag_c pos;
    tc_pos(pos, pos_s); /* its __syncthreads also publishes Qs and lo_s */
    int kmin = tlast;
    for (int r = 0; r < nr; r++)
        kmin = min(kmin, lo_s[r]);

    frag_a qf[NF]; /* this warp's 16 query rows, (16, HDP) */
    frag_c o[NF];  /* its output rows, unnormalised */
    for (int f = 0; f < NF; f++) {
        wmma::load_matrix_sync(qf[f], Qs + w * 16 * HS + f * 16, HS);
        wmma::fill_fragment(o[f], 0.0f);
    }
    float *S = Ss + w * 16 * TC_SS; /* this warp's scores (16, 64), then its probabilities in P */
    bf16 *P = Ps + w * 16 * TC_PS;
    /* the softmax of row r = lane / 2 of the warp's 16 is shared by two lanes, columns 2j + half */
    const int r = lane >> 1, half = lane & 1, tr = w * 16 + r, t = t0 + tr, rlo = lo_s[tr];
    float m = -INFINITY, l = 0.0f;

    for (int s0 = kmin; s0 <= tlast; s0 += TC_TILE) {
        int ns = min(TC_TILE, tlast + 1 - s0);
        tc_load_rows<HDP>(Ks, kb, R, s0, ns, HD);
        tc_load_rows<HDP>(Vs, vb, R, s0, ns, HD);
        __syncthreads();
        for (int n = 0; n < TC_TILE / 16; n++) { /* S (16, 64) = Q_w K^T, 16 keys at a time */
            frag_c s;
            wmma::fill_fragment(s, 0.0f);
            for (int f = 0; f < NF; f++) {
                frag_bt kf;
                wmma::load_matrix_sync(kf, Ks + n * 16 * HS + f * 16, HS);
                wmma::mma_sync(s, qf[f], kf, s);
            }
            wmma::store_matrix_sync(S + n * 16, s, TC_SS, wmma::mem_row_major);
        }
        __syncwarp();
        /* online softmax: masked scaled scores and their max, then p under the new max */
        float tmax = -INFINITY;
        for (int j = 0; j < TC_TILE / 2; j++) {
            int c = 2 * j + half, key = s0 + c;
            float v = (key >= rlo && key <= t) ? S[r * TC_SS + c] * scale : -INFINITY;
            S[r * TC_SS + c] = v;
            tmax = fmaxf(tmax, v);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        float mnew = fmaxf(m, tmax), ms = mnew == -INFINITY ? 0.0f : mnew; /* ms: no -inf - -inf */
        float corr = expf(m - ms), psum = 0.0f;
        for (int j = 0; j < TC_TILE / 2; j++) {
            int c = 2 * j + half;
            float v = S[r * TC_SS + c], p = v == -INFINITY ? 0.0f : expf(v - ms);
            P[r * TC_PS + c] = __float2bfloat16_rn(p);
            psum += p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * corr + psum;
        m = mnew;
        if (half == 0)
            corr_s[tr] = corr;
        __syncwarp();
        /* O = O * corr (by row) + P V */
        for (int f = 0; f < NF; f++)
            for (int i = 0; i < TC_NE; i++)
                o[f].x[i] *= corr_s[w * 16 + tc_row(pos, i)];
        for (int k = 0; k < TC_TILE / 16; k++) {
            frag_a pf;
            wmma::load_matrix_sync(pf, P + k * 16, TC_PS);
            for (int f = 0; f < NF; f++) {
                frag_b vf;
                wmma::load_matrix_sync(vf, Vs + k * 16 * HS + f * 16, HS);
                wmma::mma_sync(o[f], pf, vf, o[f]);
            }
        }
        __syncthreads(); /* Ks, Vs are overwritten next */
    }

    if (half == 0)
        l_s[tr] = l;
    __syncwarp();
    for (int f = 0; f < NF; f++)
        for (int i = 0; i < TC_NE; i++) {
            int row = w * 16 + tc_row(pos, i), col = f * 16 + tc_col(pos, i);
            if (row < nr && col < HD)
                out[(row0 + t0 + row) * NH * HD + (size_t)h * HD + col] = o[f].x[i] / l_s[row];
        }
    if (lse && half == 0 && tr < nr)
        lse[(row0 + t) * NH + h] = m + logf(l);
}

/* ------------------------------------------------------------------------------------------------ backward */

/* dQ pass: block (query tile from the end, h, b) loops over its key tiles like the forward; dq (16, HDP) per warp
 * accumulates in fragments and is added to dqkv at the end. D (N, NH) = rowsum(dout * out). */
template <int HDP>
static __global__ void __launch_bounds__(TC_THREADS)
    att_tc_bwd_dq(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D,
                  const int32_t *seg, int T, int NH, int NKV, int HD, float scale) {
    constexpr int HS = HDP + 8, NF = HDP / 16;
    extern __shared__ __align__(128) unsigned char tc_sm[];
    bf16 *Qs = (bf16 *)tc_sm, *Gs = Qs + TC_TILE * HS, *Ks = Gs + TC_TILE * HS, *Vs = Ks + TC_TILE * HS;
    bf16 *dSs = Vs + TC_TILE * HS; /* (WARPS, 16, TC_PS) */
    __shared__ __align__(32) float pos_s[256];
    __shared__ int lo_s[TC_TILE];
    __shared__ float L_s[TC_TILE], D_s[TC_TILE];
    const int w = threadIdx.x >> 5;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int t0 = (gridDim.x - 1 - blockIdx.x) * TC_TILE;
    const int nr = min(TC_TILE, T - t0), tlast = t0 + nr - 1;
    const size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T, OR = (size_t)NH * HD;
    const float *kb = qkv + row0 * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;

    tc_load_rows<HDP>(Qs, qkv + row0 * R + (size_t)h * HD, R, t0, nr, HD);
    tc_load_rows<HDP>(Gs, dout + row0 * OR + (size_t)h * HD, OR, t0, nr, HD);
    if (threadIdx.x < TC_TILE) {
        int r = threadIdx.x, valid = r < nr;
        size_t n = row0 + t0 + r;
        lo_s[r] = valid ? tc_first_key(seg, n, t0 + r) : INT_MAX;
        L_s[r] = valid ? lse[n * NH + h] : 0.0f;
        D_s[r] = valid ? D[n * NH + h] : 0.0f;
    }
    frag_c pos;
    tc_pos(pos, pos_s);
    int kmin = tlast;
    for (int r = 0; r < nr; r++)
        kmin = min(kmin, lo_s[r]);

    frag_a qf[NF], gf[NF]; /* this warp's rows of q and dout, (16, HDP) each */
    frag_c dq[NF];
    for (int f = 0; f < NF; f++) {
        wmma::load_matrix_sync(qf[f], Qs + w * 16 * HS + f * 16, HS);
        wmma::load_matrix_sync(gf[f], Gs + w * 16 * HS + f * 16, HS);
        wmma::fill_fragment(dq[f], 0.0f);
    }
    bf16 *dS = dSs + w * 16 * TC_PS;

    for (int s0 = kmin; s0 <= tlast; s0 += TC_TILE) {
        int ns = min(TC_TILE, tlast + 1 - s0);
        tc_load_rows<HDP>(Ks, kb, R, s0, ns, HD);
        tc_load_rows<HDP>(Vs, vb, R, s0, ns, HD);
        __syncthreads();
        for (int n = 0; n < TC_TILE / 16; n++) { /* 16 keys at a time: S = Q_w K^T, dP = dO_w V^T */
            frag_c s, dp;
            wmma::fill_fragment(s, 0.0f);
            wmma::fill_fragment(dp, 0.0f);
            for (int f = 0; f < NF; f++) {
                frag_bt kf, vf;
                wmma::load_matrix_sync(kf, Ks + n * 16 * HS + f * 16, HS);
                wmma::load_matrix_sync(vf, Vs + n * 16 * HS + f * 16, HS);
                wmma::mma_sync(s, qf[f], kf, s);
                wmma::mma_sync(dp, gf[f], vf, dp);
            }
            for (int i = 0; i < TC_NE; i++) {
                int row = tc_row(pos, i), c = n * 16 + tc_col(pos, i), tr = w * 16 + row, key = s0 + c;
                float p = (key >= lo_s[tr] && key <= t0 + tr) ? expf(scale * s.x[i] - L_s[tr]) : 0.0f;
                dS[row * TC_PS + c] = __float2bfloat16_rn(scale * p * (dp.x[i] - D_s[tr]));
            }
        }
        __syncwarp();
        for (int k = 0; k < TC_TILE / 16; k++) { /* dQ_w += dS K */
            frag_a df;
            wmma::load_matrix_sync(df, dS + k * 16, TC_PS);
            for (int f = 0; f < NF; f++) {
                frag_b kf;
                wmma::load_matrix_sync(kf, Ks + k * 16 * HS + f * 16, HS);
                wmma::mma_sync(dq[f], df, kf, dq[f]);
            }
        }
        __syncthreads(); /* Ks, Vs and dS are overwritten next */
    }

    for (int f = 0; f < NF; f++)
        for (int i = 0; i < TC_NE; i++) {
            int row = w * 16 + tc_row(pos, i), col = f * 16 + tc_col(pos, i);
            if (row < nr && col < HD)
                dqkv[(row0 + t0 + row) * R + (size_t)h * HD + col] += dq[f].x[i];
        }
}

/* dK/dV pass: block (key tile, kv head, b) keeps its keys and values in shared memory and loops over the group's
 * query heads and, for each, over the query tiles from its own position to the end, skipping tiles whose rows all
 * start after the key tile (seg_start). Warp rows are keys here, columns queries. */
template <int HDP>
static __global__ void __launch_bounds__(TC_THREADS)
    att_tc_bwd_dkv(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D,
                   const int32_t *seg, int T, int NH, int NKV, int HD, float scale) {
    constexpr int HS = HDP + 8, NF = HDP / 16;
    extern __shared__ __align__(128) unsigned char tc_sm[];
    bf16 *Ks = (bf16 *)tc_sm, *Vs = Ks + TC_TILE * HS, *Qs = Vs + TC_TILE * HS, *Gs = Qs + TC_TILE * HS;
    bf16 *Pts = Gs + TC_TILE * HS, *dSts = Pts + TC_WARPS * 16 * TC_PS; /* (WARPS, 16 keys, TC_PS) P^T and dS^T */
    __shared__ __align__(32) float pos_s[256];
    __shared__ int lo_s[TC_TILE];
    __shared__ float L_s[TC_TILE], D_s[TC_TILE];
    const int w = threadIdx.x >> 5;
    const int kh = blockIdx.y, b = blockIdx.z, G = NH / NKV;
    const int s0 = blockIdx.x * TC_TILE, ns = min(TC_TILE, T - s0), s1 = s0 + ns - 1;
    const size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T, OR = (size_t)NH * HD;
    const size_t koff = row0 * R + (size_t)(NH + kh) * HD, voff = koff + (size_t)NKV * HD;

    tc_load_rows<HDP>(Ks, qkv + koff, R, s0, ns, HD);
    tc_load_rows<HDP>(Vs, qkv + voff, R, s0, ns, HD);
    frag_c pos;
    tc_pos(pos, pos_s); /* its __syncthreads also publishes Ks and Vs */
    frag_c dk[NF], dv[NF]; /* this warp's 16 key rows, (16, HDP) each */
    for (int f = 0; f < NF; f++) {
        wmma::fill_fragment(dk[f], 0.0f);
        wmma::fill_fragment(dv[f], 0.0f);
    }
    const bf16 *Kw = Ks + w * 16 * HS, *Vw = Vs + w * 16 * HS;
    bf16 *Pt = Pts + w * 16 * TC_PS, *dSt = dSts + w * 16 * TC_PS;

    for (int h = kh * G; h < (kh + 1) * G; h++) {
        const float *qb = qkv + row0 * R + (size_t)h * HD, *gb = dout + row0 * OR + (size_t)h * HD;
        for (int t0 = s0; t0 < T; t0 += TC_TILE) {
            int nq = min(TC_TILE, T - t0), need = 0;
            if (threadIdx.x < TC_TILE) {
                int c = threadIdx.x, valid = c < nq;
                size_t n = row0 + t0 + c;
                int lo = valid ? tc_first_key(seg, n, t0 + c) : INT_MAX;
                lo_s[c] = lo;
                L_s[c] = valid ? lse[n * NH + h] : 0.0f;
                D_s[c] = valid ? D[n * NH + h] : 0.0f;
                need = lo <= s1;
            }
            if (!__syncthreads_or(need)) /* no query of this tile sees any key of ours */
                continue;
            tc_load_rows<HDP>(Qs, qb, R, t0, nq, HD);
            tc_load_rows<HDP>(Gs, gb, OR, t0, nq, HD);
            __syncthreads();
            for (int n = 0; n < TC_TILE / 16; n++) { /* 16 queries at a time: S^T = K_w Q^T, dP^T = V_w dO^T */
                frag_c s, dp;
                wmma::fill_fragment(s, 0.0f);
                wmma::fill_fragment(dp, 0.0f);
                for (int f = 0; f < NF; f++) {
                    frag_a kf, vf;
                    frag_bt qf, gf;
                    wmma::load_matrix_sync(kf, Kw + f * 16, HS);
                    wmma::load_matrix_sync(qf, Qs + n * 16 * HS + f * 16, HS);
                    wmma::mma_sync(s, kf, qf, s);
                    wmma::load_matrix_sync(vf, Vw + f * 16, HS);
                    wmma::load_matrix_sync(gf, Gs + n * 16 * HS + f * 16, HS);
                    wmma::mma_sync(dp, vf, gf, dp);
                }
                for (int i = 0; i < TC_NE; i++) {
                    int row = tc_row(pos, i), c = n * 16 + tc_col(pos, i), key = s0 + w * 16 + row;
                    float p = (key <= s1 && key >= lo_s[c] && key <= t0 + c) ? expf(scale * s.x[i] - L_s[c]) : 0.0f;
                    Pt[row * TC_PS + c] = __float2bfloat16_rn(p);
                    dSt[row * TC_PS + c] = __float2bfloat16_rn(scale * p * (dp.x[i] - D_s[c]));
                }
            }
            __syncwarp();
            for (int k = 0; k < TC_TILE / 16; k++) { /* dV_w += P^T dO, dK_w += dS^T Q */
                frag_a pf, df;
                wmma::load_matrix_sync(pf, Pt + k * 16, TC_PS);
                wmma::load_matrix_sync(df, dSt + k * 16, TC_PS);
                for (int f = 0; f < NF; f++) {
                    frag_b gf, qf;
                    wmma::load_matrix_sync(gf, Gs + k * 16 * HS + f * 16, HS);
                    wmma::mma_sync(dv[f], pf, gf, dv[f]);
                    wmma::load_matrix_sync(qf, Qs + k * 16 * HS + f * 16, HS);
                    wmma::mma_sync(dk[f], df, qf, dk[f]);
                }
            }
            __syncthreads(); /* lo_s, Qs, Gs, Pt, dSt are overwritten next */
        }
    }

    for (int f = 0; f < NF; f++)
        for (int i = 0; i < TC_NE; i++) {
            int row = w * 16 + tc_row(pos, i), col = f * 16 + tc_col(pos, i);
            if (row < ns && col < HD) {
                dqkv[koff + (size_t)(s0 + row) * R + col] += dk[f].x[i];
                dqkv[voff + (size_t)(s0 + row) * R + col] += dv[f].x[i];
            }
        }
}

/* ------------------------------------------------------------------------------------------------ host side */

static int tc_hdp(int HD) { return HD <= 64 ? 64 : 128; }

/* dynamic shared memory of a kernel with `tiles` (TILE, HDP + 8) bf16 tiles, `ptiles` sets of per-warp (16, TC_PS)
 * bf16 tiles and `stiles` sets of per-warp (16, TC_SS) fp32 tiles */
static size_t tc_smem(int HD, int tiles, int ptiles, int stiles) {
    size_t hs = (size_t)tc_hdp(HD) + 8;
    return (size_t)tiles * TC_TILE * hs * sizeof(bf16) + (size_t)ptiles * TC_WARPS * 16 * TC_PS * sizeof(bf16) +
           (size_t)stiles * TC_WARPS * 16 * TC_SS * sizeof(float);
}
#define TC_SMEM_FWD(HD) tc_smem(HD, 3, 1, 1)
#define TC_SMEM_DQ(HD) tc_smem(HD, 4, 1, 0)
#define TC_SMEM_DKV(HD) tc_smem(HD, 4, 2, 0)

extern "C" size_t snug_cuda_attention_tc_smem(int HD) {
    size_t a = TC_SMEM_FWD(HD), b = TC_SMEM_DQ(HD), c = TC_SMEM_DKV(HD);
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

template <int HDP>
static void tc_fwd_run(snug_backend *be, cudaStream_t st, float *out, float *lse, const float *qkv,
                       const int32_t *seg, int B, int T, int NH, int NKV, int HD, float scale) {
    size_t smem = TC_SMEM_FWD(HD);
    SNUG_CUDA_CHECK(cudaFuncSetAttribute(att_tc_fwd<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + TC_TILE - 1) / TC_TILE, NH, B);
    att_tc_fwd<HDP><<<grid, TC_THREADS, smem, st>>>(out, lse, qkv, seg, T, NH, NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
}

template <int HDP>
static void tc_bwd_run(snug_backend *be, cudaStream_t st, float *dqkv, const float *dout, const float *qkv,
                       const float *lse, const float *D, const int32_t *seg, int B, int T, int NH, int NKV, int HD,
                       float scale) {
    size_t smem_dq = TC_SMEM_DQ(HD), smem_dkv = TC_SMEM_DKV(HD);
    int ntiles = (T + TC_TILE - 1) / TC_TILE;
    SNUG_CUDA_CHECK(
        cudaFuncSetAttribute(att_tc_bwd_dq<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq));
    SNUG_CUDA_CHECK(
        cudaFuncSetAttribute(att_tc_bwd_dkv<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dkv));
    att_tc_bwd_dq<HDP><<<dim3(ntiles, NH, B), TC_THREADS, smem_dq, st>>>(dqkv, dout, qkv, lse, D, seg, T, NH, NKV,
                                                                         HD, scale);
    SNUG_CUDA_LAUNCHED();
    att_tc_bwd_dkv<HDP><<<dim3(ntiles, NKV, B), TC_THREADS, smem_dkv, st>>>(dqkv, dout, qkv, lse, D, seg, T, NH,
                                                                            NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_attention_tc_fwd(snug_backend *be, float *out, float *lse, const float *qkv,
                                           const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                                           float scale) {
    // qkv (N, (NH+2*NKV)*HD) ; out (N, NH*HD) ; lse (N, NH) or NULL ; seg_start (N) or NULL
    cudaStream_t st = snug_cuda_stream(be);
    if (tc_hdp(HD) == 64)
        tc_fwd_run<64>(be, st, out, lse, qkv, seg_start, B, T, NH, NKV, HD, scale);
    else
        tc_fwd_run<128>(be, st, out, lse, qkv, seg_start, B, T, NH, NKV, HD, scale);
}

extern "C" void snug_cuda_attention_tc_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv,
                                           const float *lse, const float *D, const int32_t *seg_start, int B, int T,
                                           int NH, int NKV, int HD, float scale) {
    // dqkv (N, (NH+2*NKV)*HD) += ; dout (N, NH*HD) ; lse, D (N, NH)
    cudaStream_t st = snug_cuda_stream(be);
    if (tc_hdp(HD) == 64)
        tc_bwd_run<64>(be, st, dqkv, dout, qkv, lse, D, seg_start, B, T, NH, NKV, HD, scale);
    else
        tc_bwd_run<128>(be, st, dqkv, dout, qkv, lse, D, seg_start, B, T, NH, NKV, HD, scale);
}
