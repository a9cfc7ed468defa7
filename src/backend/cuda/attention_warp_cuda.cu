/* attention_warp_cuda.cu: the CUDA backend's warp-per-row attention kernels, semantics those of backend/backend.h
 * (backend/cpu/attention_naive_cpu.c is the reference): the naive path (flash_attention: false), which stores probs
 * (B, NH, T, T) whole and reads it back in backward, and the decode op, which attends one query against rows 0..p
 * of the cache. Both use a warp per row with the head's columns spread over the lanes (HD <= 32 * ATT_WARP_MAXJ =
 * 256). The naive backward takes B*NH*T floats of the backend's scratch for its row sums. */
#include <math.h>

#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/cuda_internal.h"

/* ------------------------------------------------------------------------------------------------ naive path */

/* One warp per (b, h, t) row r = (b*NH + h)*T + t: probs row r (T) = softmax of the visible scores, zeros
 * elsewhere; then out (HD) = probs row @ V with the lanes over columns. */
static __global__ void att_naive_fwd_k(float *out, float *probs, const float *qkv, const int32_t *seg, int B, int T,
                                       int NH, int NKV, int HD, float scale) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (size_t)B * NH * T) /* the same for the whole warp */
        return;
    int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH)), kh = h / (NH / NKV);
    size_t R = (size_t)(NH + 2 * NKV) * HD, n = (size_t)b * T + t;
    int lo = att_first_key(seg, n, t);
    const float *q = qkv + n * R + (size_t)h * HD;
    const float *kb = qkv + (size_t)b * T * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;
    float *p = probs + row * T;
    float mx = -INFINITY;
    for (int s = lane; s < T; s += 32) {
        float sc = 0.0f;
        if (s >= lo && s <= t) {
            const float *k = kb + (size_t)s * R;
            for (int i = 0; i < HD; i++)
                sc += q[i] * k[i];
            sc *= scale;
            mx = fmaxf(mx, sc);
        }
        p[s] = sc;
    }
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f; /* each lane keeps to its own entries s = lane mod 32 until the __syncwarp */
    for (int s = lane; s <= t; s += 32)
        if (s >= lo)
            sum += (p[s] = expf(p[s] - mx));
    sum = att_sum32(sum);
    for (int s = lane; s <= t; s += 32)
        if (s >= lo)
            p[s] /= sum;
    __syncwarp(); /* the lanes read each other's probabilities next */
    float *o = out + n * NH * HD + (size_t)h * HD;
    for (int i = lane; i < HD; i += 32) {
        float acc = 0.0f;
        for (int s = lo; s <= t; s++)
            acc += p[s] * vb[(size_t)s * R + i];
        o[i] = acc;
    }
}

/* Naive backward, pass 1: one warp per (b, h, t) row; lanes over columns. dot = sum_s p_s (dout . v_s), saved in
 * dots (B*NH*T) for pass 2; dq += sum_s scale p_s (dout . v_s - dot) k_s. Zero probabilities (masked) are skipped,
 * as on the CPU. */
static __global__ void att_naive_bwd_dq(float *dqkv, float *dots, const float *dout, const float *qkv,
                                        const float *probs, int B, int T, int NH, int NKV, int HD, float scale) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (size_t)B * NH * T)
        return;
    int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH)), kh = h / (NH / NKV);
    size_t R = (size_t)(NH + 2 * NKV) * HD, n = (size_t)b * T + t;
    const float *p = probs + row * T, *g = dout + n * NH * HD + (size_t)h * HD;
    const float *kb = qkv + (size_t)b * T * R + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;
    float gj[ATT_WARP_MAXJ], dq[ATT_WARP_MAXJ];
#pragma unroll
    for (int j = 0; j < ATT_WARP_MAXJ; j++) {
        int col = lane + 32 * j;
        gj[j] = col < HD ? g[col] : 0.0f;
        dq[j] = 0.0f;
    }
    float dot = 0.0f;
    for (int s = 0; s <= t; s++) {
        float ps = p[s];
        if (ps == 0.0f)
            continue;
        const float *v = vb + (size_t)s * R;
        float dp = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_WARP_MAXJ; j++)
            if (lane + 32 * j < HD)
                dp += gj[j] * v[lane + 32 * j];
        dot += ps * att_sum32(dp);
    }
    for (int s = 0; s <= t; s++) {
        float ps = p[s];
        if (ps == 0.0f)
            continue;
        const float *v = vb + (size_t)s * R, *k = kb + (size_t)s * R;
        float dp = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_WARP_MAXJ; j++)
            if (lane + 32 * j < HD)
                dp += gj[j] * v[lane + 32 * j];
        float ds = ps * (att_sum32(dp) - dot) * scale;
#pragma unroll
        for (int j = 0; j < ATT_WARP_MAXJ; j++)
            if (lane + 32 * j < HD)
                dq[j] += ds * k[lane + 32 * j];
    }
    if (lane == 0)
        dots[row] = dot;
    float *dqrow = dqkv + n * R + (size_t)h * HD;
#pragma unroll
    for (int j = 0; j < ATT_WARP_MAXJ; j++)
        if (lane + 32 * j < HD)
            dqrow[lane + 32 * j] += dq[j];
}

/* Naive backward, pass 2: one warp per (b, kv head, key s): dv += sum over the group's heads and queries t >= s of
 * p dout_t; dk += sum of scale p (dout_t . v - dot_t) q_t. */
static __global__ void att_naive_bwd_dkv(float *dqkv, const float *dots, const float *dout, const float *qkv,
                                         const float *probs, int B, int T, int NH, int NKV, int HD, float scale) {
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (size_t)B * NKV * T)
        return;
    int s = (int)(w % T), kh = (int)(w / T % NKV), b = (int)(w / ((size_t)T * NKV)), G = NH / NKV;
    size_t R = (size_t)(NH + 2 * NKV) * HD, row0 = (size_t)b * T;
    size_t koff = (row0 + s) * R + (size_t)(NH + kh) * HD, voff = koff + (size_t)NKV * HD;
    float vj[ATT_WARP_MAXJ], dk[ATT_WARP_MAXJ], dv[ATT_WARP_MAXJ];
#pragma unroll
    for (int j = 0; j < ATT_WARP_MAXJ; j++) {
        int col = lane + 32 * j;
        vj[j] = col < HD ? qkv[voff + col] : 0.0f;
        dk[j] = dv[j] = 0.0f;
    }
    for (int h = kh * G; h < (kh + 1) * G; h++)
        for (int t = s; t < T; t++) {
            size_t prow = ((size_t)(b * NH + h)) * T + t;
            float ps = probs[prow * T + s];
            if (ps == 0.0f)
                continue;
            const float *g = dout + (row0 + t) * NH * HD + (size_t)h * HD, *q = qkv + (row0 + t) * R + (size_t)h * HD;
            float dp = 0.0f;
#pragma unroll
            for (int j = 0; j < ATT_WARP_MAXJ; j++)
                if (lane + 32 * j < HD)
                    dp += g[lane + 32 * j] * vj[j];
            float ds = ps * (att_sum32(dp) - dots[prow]) * scale;
#pragma unroll
            for (int j = 0; j < ATT_WARP_MAXJ; j++)
                if (lane + 32 * j < HD) {
                    dv[j] += ps * g[lane + 32 * j];
                    dk[j] += ds * q[lane + 32 * j];
                }
        }
#pragma unroll
    for (int j = 0; j < ATT_WARP_MAXJ; j++)
        if (lane + 32 * j < HD) {
            dqkv[koff + lane + 32 * j] += dk[j];
            dqkv[voff + lane + 32 * j] += dv[j];
        }
}

/* ------------------------------------------------------------------------------------------------ decode */

#define DEC_WARPS 4

/* One block per query head: warp w takes keys w, w + DEC_WARPS, ... with its own online softmax (lanes over
 * columns), then the warps' partial results are merged in warp order. out (NH*HD). */
static __global__ void __launch_bounds__(DEC_WARPS * 32)
    att_decode_k(float *out, const float *qkv, int p, int NH, int NKV, int HD, float scale) {
    __shared__ float m_s[DEC_WARPS], l_s[DEC_WARPS], o_s[DEC_WARPS][32 * ATT_WARP_MAXJ];
    int h = blockIdx.x, kh = h / (NH / NKV), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t R = (size_t)(NH + 2 * NKV) * HD;
    const float *kb = qkv + (size_t)(NH + kh) * HD, *vb = kb + (size_t)NKV * HD;
    float qj[ATT_WARP_MAXJ], o[ATT_WARP_MAXJ];
#pragma unroll
    for (int j = 0; j < ATT_WARP_MAXJ; j++) {
        int col = lane + 32 * j;
        qj[j] = col < HD ? qkv[(size_t)p * R + (size_t)h * HD + col] : 0.0f;
        o[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int s = warp; s <= p; s += DEC_WARPS) {
        const float *k = kb + (size_t)s * R, *v = vb + (size_t)s * R;
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_WARP_MAXJ; j++)
            if (lane + 32 * j < HD)
                d += qj[j] * k[lane + 32 * j];
        float sc = att_sum32(d) * scale, mnew = fmaxf(m, sc);
        float corr = expf(m - mnew), e = expf(sc - mnew);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < ATT_WARP_MAXJ; j++)
            if (lane + 32 * j < HD)
                o[j] = o[j] * corr + e * v[lane + 32 * j];
        m = mnew;
    }
    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATT_WARP_MAXJ; j++)
        o_s[warp][lane + 32 * j] = o[j];
    __syncthreads();
    float M = m_s[0]; /* warp 0 always has key 0 */
    for (int w = 1; w < DEC_WARPS; w++)
        M = fmaxf(M, m_s[w]);
    float L = 0.0f;
    for (int w = 0; w < DEC_WARPS; w++)
        L += l_s[w] * expf(m_s[w] - M); /* an idle warp has m = -inf: weight 0 */
    for (int col = threadIdx.x; col < HD; col += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++)
            acc += o_s[w][col] * expf(m_s[w] - M);
        out[(size_t)h * HD + col] = acc / L;
    }
}

/* ------------------------------------------------------------------------------------------------ host side */

extern "C" void snug_cuda_attention_naive_fwd(snug_backend *be, float *out, float *probs, const float *qkv,
                                              const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                                              float scale) {
    // out (N, NH*HD) ; probs (B, NH, T, T)
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    if (HD > 32 * ATT_WARP_MAXJ) {
        att_fail(be, __LINE__, "naive attention", HD, 32 * ATT_WARP_MAXJ);
        return;
    }
    size_t rows = (size_t)B * NH * T;
    att_naive_fwd_k<<<att_blocks(rows * 32, 256), 256, 0, snug_cuda_stream(be)>>>(out, probs, qkv, seg_start, B, T,
                                                                                  NH, NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_attention_naive_bwd(snug_backend *be, float *dqkv, const float *dout, const float *qkv,
                                              const float *probs, int B, int T, int NH, int NKV, int HD,
                                              float scale) {
    // dqkv (N, (NH+2*NKV)*HD) += ; probs (B, NH, T, T)
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    if (HD > 32 * ATT_WARP_MAXJ) {
        att_fail(be, __LINE__, "naive attention backward", HD, 32 * ATT_WARP_MAXJ);
        return;
    }
    cudaStream_t st = snug_cuda_stream(be);
    size_t rows = (size_t)B * NH * T;
    float *dots = (float *)snug_cuda_scratch(be, rows * sizeof(float)); /* (B, NH, T) sum_s p (dout . v_s) */
    if (!dots)
        return;
    att_naive_bwd_dq<<<att_blocks(rows * 32, 256), 256, 0, st>>>(dqkv, dots, dout, qkv, probs, B, T, NH, NKV, HD,
                                                                 scale);
    SNUG_CUDA_LAUNCHED();
    att_naive_bwd_dkv<<<att_blocks((size_t)B * NKV * T * 32, 256), 256, 0, st>>>(dqkv, dots, dout, qkv, probs, B, T,
                                                                                 NH, NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_attention_decode(snug_backend *be, float *out, const float *qkv, int p, int NH, int NKV,
                                           int HD, float scale) {
    // qkv (T, (NH+2*NKV)*HD) cache rows 0..p ; out (NH*HD)
    if (NH <= 0 || p < 0)
        return;
    if (HD > 32 * ATT_WARP_MAXJ) {
        att_fail(be, __LINE__, "attention decode", HD, 32 * ATT_WARP_MAXJ);
        return;
    }
    att_decode_k<<<NH, DEC_WARPS * 32, 0, snug_cuda_stream(be)>>>(out, qkv, p, NH, NKV, HD, scale);
    SNUG_CUDA_LAUNCHED();
}
