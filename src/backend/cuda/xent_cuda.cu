/* xent_cuda.cu: the fused output projection + softmax + cross-entropy on the GPU, chunked over tokens, the same
 * algorithm as backend/cpu/xent_cpu.c.
 *
 * For each chunk of `chunk` tokens: logits (chunk,V) = h_chunk @ w^T (cuBLASLt), then xent_row_kernel, one block per
 * row, writes the row's loss lse - logit[label] (double) and, when gradients are wanted, overwrites the row in place
 * with G = grad_scale * (softmax - onehot); two more GEMMs give dh_chunk += G @ w and dw += G^T @ h_chunk. A 16-bit w
 * is widened `wblock` rows at a time into w_ws for the GEMMs that read it (cuBLASLt has no fp32 x bf16 product).
 * The per-token losses are summed at the end by one block in a fixed order, so the returned loss has the same bits
 * on every run. Chunks without a supervised token are skipped, as on the CPU (the labels are copied to the host). */
#include <math.h>

#include "backend/cuda/cuda_internal.h"

#define XENT_THREADS 512

__global__ void xent_row_kernel(float *logits, double *loss, const int32_t *labels, int V, float grad_scale,
                                int grad) {
    // logits (nc,V), one block per row r; loss (nc) the row's loss (0 for an unsupervised row); labels (nc)
    __shared__ float shf[32];
    __shared__ double shd[32];
    int r = blockIdx.x;
    float *row = logits + (size_t)r * V;
    int y = labels[r];
    if (y < 0 || y >= V) { /* >= V is a caller's bug; never index past the row for it */
        if (grad)
            for (int v = threadIdx.x; v < V; v += blockDim.x)
                row[v] = 0.0f;
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
    if (grad) { // row <- grad_scale * (softmax - onehot); each thread rescales the entries it wrote
        float k = (float)(grad_scale / sum);
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            float gv = row[v] * k;
            row[v] = v == y ? gv - grad_scale : gv;
        }
    }
}

/* rows [v0, v0+vb) of w (V,C) stored as wdt, widened into ws (vb,C) */
static void widen_rows(snug_backend *be, float *ws, const void *w, snug_dtype wdt, int v0, int vb, int C) {
    snug_cuda_from16(be, ws, (const uint16_t *)w + (size_t)v0 * C, (size_t)vb * C, wdt);
}

/* Row-major products with w (V,C), as column-major GEMMs (see matmul_cuda.cu):
 *   fwd: logits (nc,V) at ldc V = hc (nc,C) @ w^T   ->  logits^T (V,nc) = w (stored (C,V), transposed) @ hc^T (C,nc)
 *   bwd: dh (nc,C) += G (nc,V) @ w                   ->  dh^T (C,nc) = w (stored (C,V)) @ G^T (V,nc), G at ld V
 * A 16-bit w goes through ws one block of wb rows at a time. */
static void gemm_w(snug_backend *be, int back, float *out, const float *in, const void *w, snug_dtype wdt, int nc,
                   int C, int V, float *ws, int wb) {
    if (wdt == SNUG_DT_F32) {
        if (back)
            snug_cuda_gemm(be, 0, 0, C, nc, V, 1.0f, (const float *)w, C, in, V, 1.0f, out, C);
        else
            snug_cuda_gemm(be, 1, 0, V, nc, C, 1.0f, (const float *)w, C, in, C, 0.0f, out, V);
        return;
    }
    for (int v0 = 0; v0 < V; v0 += wb) {
        int vb = V - v0 < wb ? V - v0 : wb;
        const float *wblk = ws;
        if (wb < V)
            widen_rows(be, ws, w, wdt, v0, vb, C); /* else ws already holds all of w */
        if (back) // dh (nc,C) += G[:, v0:v0+vb] @ w_block (vb,C)
            snug_cuda_gemm(be, 0, 0, C, nc, vb, 1.0f, wblk, C, in + v0, V, 1.0f, out, C);
        else // logits[:, v0:v0+vb] = hc (nc,C) @ w_block^T
            snug_cuda_gemm(be, 1, 0, vb, nc, C, 1.0f, wblk, C, in, C, 0.0f, out + v0, V);
    }
}

extern "C" double snug_cuda_xent_fwd_bwd(snug_backend *be, float *dh, float *dw, const float *h, const void *w,
                                         snug_dtype wdt, const int32_t *labels, int N, int C, int V,
                                         float grad_scale, float *logits_ws, int chunk, float *w_ws, int wblock) {
    // h (N,C), w (V,C) as wdt, labels (N), dh (N,C) +=, dw (V,C) +=, logits_ws (chunk,V), w_ws (wblock,C)
    int grad = dh || dw;
    if (N <= 0 || C <= 0 || V <= 0)
        return 0.0;
    if (chunk <= 0)
        chunk = N;
    cudaStream_t st = snug_cuda_stream(be);

    // scratch: loss (N) per token, then the total (1), then (when w_ws is not given) a block of widened rows in
    // what the fixed scratch has left (64 MiB at most)
    size_t loss_bytes = ((size_t)N + 1) * sizeof(double);
    loss_bytes = (loss_bytes + 255) / 256 * 256;
    if (wdt != SNUG_DT_F32 && (!w_ws || wblock <= 0)) {
        size_t have = snug_cuda(be)->scratch_bytes, left = have > loss_bytes ? have - loss_bytes : 0;
        size_t rows = (left < ((size_t)64 << 20) ? left : ((size_t)64 << 20)) / ((size_t)C * sizeof(float));
        wblock = (int)(rows < 1 ? 1 : rows > (size_t)V ? (size_t)V : rows);
        w_ws = NULL;
    }
    size_t ws_bytes = wdt != SNUG_DT_F32 && !w_ws ? (size_t)wblock * C * sizeof(float) : 0;
    char *scratch = (char *)snug_cuda_scratch(be, loss_bytes + ws_bytes);
    if (!scratch)
        return NAN; /* the failure is recorded; NaN also reads as an overflow to the loss scaler */
    double *loss = (double *)scratch, *total_d = loss + N;
    if (ws_bytes)
        w_ws = (float *)(scratch + loss_bytes);
    if (wdt != SNUG_DT_F32 && wblock > V)
        wblock = V;
    if (wdt != SNUG_DT_F32 && wblock == V) /* the whole head fits: widen it once for every chunk */
        widen_rows(be, w_ws, w, wdt, 0, V, C);

    // labels to the host, to skip unsupervised chunks as the CPU does (their rows would only add zeros)
    int32_t *lab_h = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    if (!lab_h) {
        snug_cuda_fail(be, __FILE__, __LINE__, "out of host memory for the %d labels of the loss", N);
        return NAN;
    }
    if (!SNUG_CUDA_CHECK(cudaMemcpyAsync(lab_h, labels, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost, st)) ||
        !SNUG_CUDA_CHECK(cudaStreamSynchronize(st))) {
        free(lab_h);
        return NAN;
    }
    SNUG_CUDA_CHECK(cudaMemsetAsync(loss, 0, (size_t)N * sizeof(double), st));

    for (int n0 = 0; n0 < N; n0 += chunk) {
        int nc = N - n0 < chunk ? N - n0 : chunk;
        const float *hc = h + (size_t)n0 * C;
        int any = 0;
        for (int r = 0; r < nc && !any; r++)
            any = lab_h[n0 + r] >= 0 && lab_h[n0 + r] < V;
        if (!any)
            continue;

        // logits (nc,V) = h_chunk (nc,C) @ w (V,C)^T
        gemm_w(be, 0, logits_ws, hc, w, wdt, nc, C, V, w_ws, wblock);
        xent_row_kernel<<<nc, XENT_THREADS, 0, st>>>(logits_ws, loss + n0, labels + n0, V, grad_scale, grad);
        SNUG_CUDA_LAUNCHED();
        if (dh) // dh_chunk (nc,C) += G (nc,V) @ w (V,C)
            gemm_w(be, 1, dh + (size_t)n0 * C, logits_ws, w, wdt, nc, C, V, w_ws, wblock);
        if (dw) // dw (V,C) += G^T (V,nc) @ h_chunk (nc,C). Column-major: dw^T (C,V) = hc^T (C,nc) @ G (nc,V), G
                // stored column-major as (V,nc), hence tb
            snug_cuda_gemm(be, 0, 1, C, V, nc, 1.0f, hc, C, logits_ws, V, 1.0f, dw, C);
    }
    free(lab_h);

    snug_cuda_sum_doubles(be, total_d, loss, N);
    double total = 0.0;
    SNUG_CUDA_CHECK(cudaMemcpyAsync(&total, total_d, sizeof total, cudaMemcpyDeviceToHost, st));
    SNUG_CUDA_CHECK(cudaStreamSynchronize(st));
    return snug_cuda(be)->err.code ? NAN : total; /* after any failure the loss shows it, even unchecked */
}
