/* xent_cuda.cu: the fused output projection + softmax + cross-entropy on the GPU, chunked over tokens, the same
 * algorithm as backend/cpu/xent_cpu.c.
 *
 * For each chunk of tokens, over the whole vocabulary at once: logits (nc,V) = h_chunk @ w^T (one GEMM), then
 * xent_row_kernel, one block per row, writes the row's loss lse - logit[label] (double) and, when gradients are
 * wanted, overwrites the row with G = grad_scale * (softmax - onehot); one GEMM gives dh_chunk += G @ w and one
 * accumulating GEMM dw += G^T @ h_chunk (beta = 1). Five launches per chunk, whatever V is.
 *
 * The logits rows have stride ld = snug_logits_ld(V) (a multiple of 8 floats, see backend.h), so every row of the
 * logits and of G starts 32-byte aligned and the 16-bit GEMMs get their tensor-core kernels at GPT-2's odd V.
 *
 * Where w's 16-bit storage is also the math (mixed precision, be->math == wdt: every training run), w goes to the
 * tensor cores as stored: the chunk of h is rounded to wdt into w_ws (which the 16-bit head then does not need), the
 * row kernel writes G rounded to wdt over the first half of its own row (a 16-bit matrix with stride 2*ld), and the
 * three GEMMs multiply 16-bit operands with fp32 accumulation: the same roundings as fp32 operands under
 * CUBLAS_COMPUTE_32F_FAST_16BF, at half the operand bytes and without widening w. Chunks hold at most as many rows
 * as w_ws holds in 16 bits. An fp32 w multiplies as stored (exact fp32, or fast 16-bit under mixed precision); a
 * 16-bit w under fp32 math (the exact reference) is widened `wblock` rows at a time into w_ws, or once when it fits.
 *
 * Nothing is copied to the host but the loss: every chunk runs (an unsupervised row's G is zeros, which adds nothing
 * to dh and dw), and the per-token losses are summed at the end by one block in a fixed order, so the returned loss
 * has the same bits on every run. The GEMMs' plans are cached (matmul_cuda.cu), so each shape runs one algorithm. */
#include <math.h>

#include "backend/cuda/cuda_internal.h"

#define XENT_THREADS 512

__global__ void xent_row_kernel(float *logits, int ld, double *loss, const int32_t *labels, int V, float grad_scale,
                                int grad, snug_dtype gdt) {
    // logits (nc,ld), one block per row r, V columns used; loss (nc) the row's loss (0 for an unsupervised row);
    // labels (nc). G in place as fp32 (gdt F32), or rounded to gdt (BF16/F16) into the first 2*V bytes of the row.
    __shared__ float shf[32];
    __shared__ double shd[32];
    int r = blockIdx.x;
    float *row = logits + (size_t)r * ld;
    uint16_t *row16 = (uint16_t *)row;
    int y = labels[r];
    if (y < 0 || y >= V) { /* >= V is a caller's bug; never index past the row for it */
        if (grad && gdt == SNUG_DT_F32)
            for (int v = threadIdx.x; v < V; v += blockDim.x)
                row[v] = 0.0f;
        else if (grad)
            for (int v = threadIdx.x; v < V; v += blockDim.x)
                row16[v] = 0; /* +0 in bf16 and fp16 */
        if (threadIdx.x == 0)
            loss[r] = 0.0;
        return;
    }
    float zy = row[y];
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = row[v] > mx ? row[v] : mx;
    mx = snug_block_max(mx, shf); /* its __syncthreads also orders every read of row[y] before the writes below */
    double sum = 0.0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float e = expf(row[v] - mx);
        if (grad)
            row[v] = e;
        sum += e;
    }
    sum = snug_block_sum(sum, shd);
    if (threadIdx.x == 0)
        loss[r] = mx + log(sum) - zy;
    if (!grad)
        return;
    // row <- grad_scale * (softmax - onehot); each thread rescales the entries it wrote
    float k = (float)(grad_scale / sum);
    if (gdt == SNUG_DT_F32) {
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            float gv = row[v] * k;
            row[v] = v == y ? gv - grad_scale : gv;
        }
        return;
    }
    // 16-bit G over the same bytes, a tile of blockDim entries at a time: the 16-bit entry v overwrites fp32 entry
    // v/2 < the tile's end, and every fp32 entry below the tile's end has been read once the tile's barrier passed
    for (int v0 = 0; v0 < V; v0 += blockDim.x) {
        int v = v0 + threadIdx.x;
        float gv = 0.0f;
        if (v < V) {
            gv = row[v] * k;
            gv = v == y ? gv - grad_scale : gv;
        }
        __syncthreads();
        if (v < V)
            row16[v] = gdt == SNUG_DT_BF16 ? snug_d_f32_to_bf16(gv) : snug_d_f32_to_f16(gv);
    }
}

/* Row-major products with an fp32 w (V,C) or a 16-bit one widened `wb` rows at a time into ws (wb,C), as column-major
 * GEMMs (see matmul_cuda.cu); the logits and G have row stride ld:
 *   fwd: logits (nc,V) = hc (nc,C) @ w^T   ->  logits^T (V,nc) = w (stored (C,V), transposed) @ hc^T (C,nc)
 *   bwd: dh (nc,C) += G (nc,V) @ w          ->  dh^T (C,nc) = w (stored (C,V)) @ G^T (V,nc) */
static void gemm_w(snug_backend *be, int back, float *out, const float *in, int ld, const void *w, snug_dtype wdt,
                   int nc, int C, int V, float *ws, int wb) {
    if (wdt == SNUG_DT_F32) {
        if (back)
            snug_cuda_gemm(be, 0, 0, C, nc, V, 1.0f, (const float *)w, C, in, ld, 1.0f, out, C);
        else
            snug_cuda_gemm(be, 1, 0, V, nc, C, 1.0f, (const float *)w, C, in, C, 0.0f, out, ld);
        return;
    }
    for (int v0 = 0; v0 < V; v0 += wb) {
        int vb = V - v0 < wb ? V - v0 : wb;
        if (wb < V) /* else ws already holds all of w */
            snug_cuda_from16(be, ws, (const uint16_t *)w + (size_t)v0 * C, (size_t)vb * C, wdt);
        if (back) // dh (nc,C) += G[:, v0:v0+vb] @ w_block (vb,C)
            snug_cuda_gemm(be, 0, 0, C, nc, vb, 1.0f, ws, C, in + v0, ld, 1.0f, out, C);
        else // logits[:, v0:v0+vb] = hc (nc,C) @ w_block^T
            snug_cuda_gemm(be, 1, 0, vb, nc, C, 1.0f, ws, C, in, C, 0.0f, out + v0, ld);
    }
}

extern "C" double snug_cuda_xent_fwd_bwd(snug_backend *be, float *dh, float *dw, const float *h, const void *w,
                                         snug_dtype wdt, const int32_t *labels, int N, int C, int V,
                                         float grad_scale, float *logits_ws, int chunk, float *w_ws, int wblock) {
    // h (N,C), w (V,C) as wdt, labels (N), dh (N,C) +=, dw (V,C) +=, logits_ws (chunk,ld), w_ws (wblock,C) fp32
    int grad = dh || dw;
    if (N <= 0 || C <= 0 || V <= 0)
        return 0.0;
    if (chunk <= 0 || chunk > N)
        chunk = N;
    cudaStream_t st = snug_cuda_stream(be);
    int ld = snug_logits_ld(V);
    int direct = wdt != SNUG_DT_F32 && be->math == wdt;

    // scratch: loss (N) per token, then the total (1), then (when w_ws is not given) w_ws in what the fixed scratch
    // has left (64 MiB at most)
    size_t loss_bytes = ((size_t)N + 1) * sizeof(double);
    loss_bytes = (loss_bytes + 255) / 256 * 256;
    size_t ws_bytes = 0;
    if (wdt != SNUG_DT_F32 && (!w_ws || wblock <= 0)) {
        size_t have = snug_cuda(be)->scratch_bytes, left = have > loss_bytes ? have - loss_bytes : 0;
        size_t rows = (left < ((size_t)64 << 20) ? left : ((size_t)64 << 20)) / ((size_t)C * sizeof(float));
        wblock = (int)(rows < 1 ? 1 : rows > (size_t)V ? (size_t)V : rows);
        ws_bytes = (size_t)wblock * C * sizeof(float);
        w_ws = NULL;
    }
    char *scratch = (char *)snug_cuda_scratch(be, loss_bytes + ws_bytes);
    if (!scratch)
        return NAN; /* the failure is recorded; NaN also reads as an overflow to the loss scaler */
    double *loss = (double *)scratch, *total_d = loss + N;
    if (ws_bytes)
        w_ws = (float *)(scratch + loss_bytes);
    if (wdt != SNUG_DT_F32 && wblock > V)
        wblock = V;
    uint16_t *h16 = direct ? (uint16_t *)w_ws : NULL; /* (step, C) in 16 bits: twice the rows of w_ws */
    int step = chunk;
    if (direct && (size_t)step > 2 * (size_t)wblock)
        step = 2 * wblock;
    if (wdt != SNUG_DT_F32 && !direct && wblock == V) /* the whole head fits: widen it once for every chunk */
        snug_cuda_from16(be, w_ws, w, (size_t)V * C, wdt);

    for (int n0 = 0; n0 < N; n0 += step) {
        int nc = N - n0 < step ? N - n0 : step;
        const float *hc = h + (size_t)n0 * C;
        // logits (nc,V) = h_chunk (nc,C) @ w (V,C)^T
        if (direct) {
            snug_cuda_to16(be, h16, (float *)hc, (size_t)nc * C, wdt, 0);
            snug_cuda_gemm_ex(be, 1, 0, V, nc, C, 1.0f, w, C, h16, C, wdt, 0.0f, logits_ws, ld, SNUG_DT_F32, NULL);
        } else {
            gemm_w(be, 0, logits_ws, hc, ld, w, wdt, nc, C, V, w_ws, wblock);
        }
        xent_row_kernel<<<nc, XENT_THREADS, 0, st>>>(logits_ws, ld, loss + n0, labels + n0, V, grad_scale, grad,
                                                     direct ? wdt : SNUG_DT_F32);
        SNUG_CUDA_LAUNCHED();
        if (direct) { /* G (nc,V) in 16 bits with row stride 2*ld */
            const uint16_t *g16 = (const uint16_t *)logits_ws;
            if (dh) // dh^T (C,nc) += w (stored (C,V)) @ G^T (V,nc)
                snug_cuda_gemm_ex(be, 0, 0, C, nc, V, 1.0f, w, C, g16, 2 * ld, wdt, 1.0f, dh + (size_t)n0 * C, C,
                                  SNUG_DT_F32, NULL);
            if (dw) // dw^T (C,V) += hc^T (C,nc) @ G (nc,V), G stored column-major as (V,nc), hence tb
                snug_cuda_gemm_ex(be, 0, 1, C, V, nc, 1.0f, h16, C, g16, 2 * ld, wdt, 1.0f, dw, C, SNUG_DT_F32,
                                  NULL);
            continue;
        }
        if (dh) // dh_chunk (nc,C) += G (nc,V) @ w (V,C)
            gemm_w(be, 1, dh + (size_t)n0 * C, logits_ws, ld, w, wdt, nc, C, V, w_ws, wblock);
        if (dw) // dw (V,C) += G^T (V,nc) @ h_chunk (nc,C). Column-major: dw^T (C,V) = hc^T (C,nc) @ G (nc,V), G
                // stored column-major as (V,nc), hence tb
            snug_cuda_gemm(be, 0, 1, C, V, nc, 1.0f, hc, C, logits_ws, ld, 1.0f, dw, C);
    }

    snug_cuda_sum_doubles(be, total_d, loss, N);
    double total = 0.0; /* the one wait of the op: its value is the host's */
    SNUG_CUDA_CHECK(cudaMemcpyAsync(&total, total_d, sizeof total, cudaMemcpyDeviceToHost, st));
    SNUG_CUDA_CHECK(cudaStreamSynchronize(st));
    return snug_cuda(be)->err.code ? NAN : total; /* after any failure the loss shows it, even unchecked */
}
