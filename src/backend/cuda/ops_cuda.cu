/* ops_cuda.cu: the CUDA backend's row-wise and elementwise ops: embeddings, rmsnorm, layernorm, the deterministic
 * column sums behind their parameter gradients, rotary embeddings, activations, 16-bit storage and elementwise
 * arithmetic. Semantics are those of backend/backend.h; the CPU ops in backend/cpu/ops_cpu.c are the reference.
 *
 * Row ops run one block per row, the row's reductions in double in a fixed tree order. Parameter gradients summed
 * over rows (dw, db, dbias) are column sums over a fixed number of row slices, each slice in row order, the slices
 * then added in order; dtable adds each id's tokens in token order, as the CPU does (its tokens sorted by id first). So
 * every op gives the same bits on every run. Linear layers are in matmul_cuda.cu, the loss in xent_cuda.cu, the
 * optimizer in adamw_cuda.cu, attention in attention*_cuda.cu. */
#include <math.h>

#include "backend/cuda/cuda_internal.h"

/* Threads of the one-block-per-row kernels. */
#define ROW_THREADS 256
/* Row slices of a column sum, and the block shape of its first pass: 32 columns by 8 rows. */
#define CS_SLICES SNUG_CUDA_COLSUM_SLICES /* backend_cuda.h: the scratch is sized by it */
#define CS_ROWS 8

/* ------------------------------------------------------------------------------------------------ embeddings */

__global__ void embed_fwd_kernel(float *out, const int32_t *ids, const void *table, snug_dtype tdt, int C,
                                 int accumulate) {
    // out (N,C), one block per row n; table (rows,C) stored as tdt
    int n = blockIdx.x;
    float *o = out + (size_t)n * C;
    if (ids[n] < 0) { /* a zero row */
        for (int c = threadIdx.x; !accumulate && c < C; c += blockDim.x)
            o[c] = 0.0f;
        return;
    }
    size_t row = (size_t)ids[n] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = snug_d_load(table, row + c, tdt);
        o[c] = accumulate ? o[c] + v : v;
    }
}

extern "C" void snug_cuda_embed_fwd(snug_backend *be, float *out, const int32_t *ids, const void *table,
                                    snug_dtype tdt, int N, int C, int accumulate) {
    if (N <= 0 || C <= 0)
        return;
    embed_fwd_kernel<<<N, ROW_THREADS, 0, snug_cuda_stream(be)>>>(out, ids, table, tdt, C, accumulate);
    SNUG_CUDA_LAUNCHED();
}

/* embed_bwd: the CPU adds each token's row of dout into its id's row of dtable in token order. Here the batch's
 * (id, token) pairs are sorted first, so that each id's tokens lie together in token order, and then each run of one
 * id adds its tokens into the id's row in that order, a column per thread: the CPU's additions in the CPU's order,
 * hence its bits, with (distinct ids) x (columns) of parallelism instead of columns alone. The keys are
 * id << 32 | token, all distinct, so any correct sort gives the one order; a bitonic sort of P = the power of two
 * >= max(N, 2) keys (the padding keys, all ones, sort last) in the backend's scratch, P * 8 bytes
 * (snug_cuda_scratch_bytes counts them). Its steps with partners less than EB_SEG apart run in shared memory, a
 * segment of EB_SEG keys per block; the wider ones one launch per step. */
#define EB_SEG 2048 /* keys per block of the shared-memory steps (EB_SEG/2 threads, 16 KiB) */

__global__ void eb_keys_kernel(uint64_t *key, const int32_t *ids, int N, size_t P) {
    // key (P): id << 32 | n for n < N, all ones after
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < P; i += (size_t)gridDim.x * blockDim.x)
        key[i] = i < (size_t)N ? (uint64_t)(uint32_t)ids[i] << 32 | i : ~(uint64_t)0;
}

/* Compare-exchange of keys i and i + j (bit j of i clear) in step (k, j) of the bitonic sort: ascending where bit k
 * of the global index gi is clear. */
static __device__ __forceinline__ void eb_cmpx(uint64_t *a, uint64_t *b, size_t gi, size_t k) {
    uint64_t x = *a, y = *b;
    if ((gi & k) == 0 ? x > y : x < y) {
        *a = y;
        *b = x;
    }
}

__global__ void eb_step_kernel(uint64_t *key, size_t P, size_t k, size_t j) {
    // one step (k, j >= EB_SEG) over all P keys: pair t of P/2 is (i, i + j), i the t-th index with bit j clear
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < P / 2; t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t / j * 2 * j + t % j;
        eb_cmpx(&key[i], &key[i + j], i, k);
    }
}

__global__ void __launch_bounds__(EB_SEG / 2) eb_shared_kernel(uint64_t *key, size_t P, size_t k0, size_t k1,
                                                               size_t j0) {
    // the steps k = k0 .. k1 (doubling), j = j0 (for k0; k/2 for the others) .. 1, on segment blockIdx.x of
    // min(P, EB_SEG) keys held in shared memory
    __shared__ uint64_t s[EB_SEG];
    size_t seg = P < EB_SEG ? P : EB_SEG, base = blockIdx.x * seg;
    for (size_t i = threadIdx.x; i < seg; i += blockDim.x)
        s[i] = key[base + i];
    __syncthreads();
    for (size_t k = k0; k <= k1; k <<= 1)
        for (size_t j = k == k0 ? j0 : k >> 1; j > 0; j >>= 1) {
            for (size_t t = threadIdx.x; t < seg / 2; t += blockDim.x) {
                size_t i = t / j * 2 * j + t % j;
                eb_cmpx(&s[i], &s[i + j], base + i, k);
            }
            __syncthreads();
        }
    for (size_t i = threadIdx.x; i < seg; i += blockDim.x)
        key[base + i] = s[i];
}

__global__ void eb_sum_kernel(float *__restrict__ dtable, const float *__restrict__ dout,
                              const uint64_t *__restrict__ key, int N, int C) {
    // block r: when sorted key r starts a run of one id, dtable[id] (C) += the run's rows of dout (N,C) in token
    // order, one column per thread and step
    int r = blockIdx.x;
    uint32_t id = (uint32_t)(key[r] >> 32);
    if ((int32_t)id < 0 || (r > 0 && (uint32_t)(key[r - 1] >> 32) == id)) /* -1: adds nothing (sorted last) */
        return;
    int end = r + 1;
    while (end < N && (uint32_t)(key[end] >> 32) == id)
        end++;
    float *d = dtable + (size_t)id * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = d[c];
        for (int q = r; q < end; q++)
            acc += dout[(size_t)(uint32_t)key[q] * C + c];
        d[c] = acc;
    }
}

extern "C" void snug_cuda_embed_bwd(snug_backend *be, float *dtable, const float *dout, const int32_t *ids, int N,
                                    int C) {
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t st = snug_cuda_stream(be);
    size_t P = snug_cuda_pow2ceil((size_t)N);
    uint64_t *key = (uint64_t *)snug_cuda_scratch(be, P * sizeof(uint64_t)); /* (P) */
    if (!key)
        return;
    eb_keys_kernel<<<snug_cuda_grid(P), SNUG_CUDA_THREADS, 0, st>>>(key, ids, N, P);
    SNUG_CUDA_LAUNCHED();
    size_t seg = P < EB_SEG ? P : EB_SEG;
    unsigned int nseg = (unsigned int)(P / seg), threads = (unsigned int)(seg / 2);
    eb_shared_kernel<<<nseg, threads, 0, st>>>(key, P, 2, seg, 1); /* each segment sorted, directions alternating */
    SNUG_CUDA_LAUNCHED();
    for (size_t k = 2 * seg; k <= P; k <<= 1) { /* merges of 2 segments, 4, ... */
        for (size_t j = k / 2; j >= seg; j >>= 1) {
            eb_step_kernel<<<snug_cuda_grid(P / 2), SNUG_CUDA_THREADS, 0, st>>>(key, P, k, j);
            SNUG_CUDA_LAUNCHED();
        }
        eb_shared_kernel<<<nseg, threads, 0, st>>>(key, P, k, k, seg / 2);
        SNUG_CUDA_LAUNCHED();
    }
    eb_sum_kernel<<<N, ROW_THREADS, 0, st>>>(dtable, dout, key, N, C);
    SNUG_CUDA_LAUNCHED();
}

/* ------------------------------------------------------------------------------------------------ reductions */

__global__ void colsum_slices_kernel(double *pa, double *pb, const float *g, const float *x, const float *mean,
                                     const float *rstd, int N, int C, int mode) {
    // pa, pb (CS_SLICES, C): partial sums of slice blockIdx.y for columns blockIdx.x*32 + [0,32); block (32, CS_ROWS)
    __shared__ double sa[CS_ROWS][32], sb[CS_ROWS][32];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx, s = blockIdx.y;
    int r0 = (int)((int64_t)N * s / CS_SLICES), r1 = (int)((int64_t)N * (s + 1) / CS_SLICES);
    double a = 0.0, b = 0.0;
    if (c < C) {
        for (int r = r0 + ty; r < r1; r += CS_ROWS) {
            size_t i = (size_t)r * C + c;
            float gv = g[i];
            if (mode == SNUG_COLSUM_G) {
                a += gv;
            } else if (mode == SNUG_COLSUM_RMS) {
                a += (double)gv * x[i] * (double)rstd[r];
            } else {
                a += (double)gv * ((x[i] - mean[r]) * rstd[r]);
                b += gv;
            }
        }
    }
    sa[ty][tx] = a;
    sb[ty][tx] = b;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int j = 1; j < CS_ROWS; j++) {
            a += sa[j][tx];
            b += sb[j][tx];
        }
        pa[(size_t)s * C + c] = a;
        if (pb)
            pb[(size_t)s * C + c] = b;
    }
}

__global__ void colsum_finish_kernel(float *dst_a, float *dst_b, const double *pa, const double *pb, int C) {
    // dst (C) += the CS_SLICES partial sums of each column, added in slice order
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double a = 0.0, b = 0.0;
    for (int s = 0; s < CS_SLICES; s++) {
        a += pa[(size_t)s * C + c];
        if (pb)
            b += pb[(size_t)s * C + c];
    }
    if (dst_a)
        dst_a[c] += (float)a;
    if (dst_b)
        dst_b[c] += (float)b;
}

extern "C" void snug_cuda_colsum(snug_backend *be, float *dst_a, float *dst_b, const float *g, const float *x,
                                 const float *mean, const float *rstd, int N, int C, int mode) {
    if (N <= 0 || C <= 0 || (!dst_a && !dst_b))
        return;
    int two = mode == SNUG_COLSUM_LN;
    double *pa = (double *)snug_cuda_scratch(be, (size_t)(two ? 2 : 1) * CS_SLICES * C * sizeof(double));
    if (!pa)
        return;
    double *pb = two ? pa + (size_t)CS_SLICES * C : NULL;
    cudaStream_t st = snug_cuda_stream(be);
    dim3 grid((C + 31) / 32, CS_SLICES), block(32, CS_ROWS);
    colsum_slices_kernel<<<grid, block, 0, st>>>(pa, pb, g, x, mean, rstd, N, C, mode);
    SNUG_CUDA_LAUNCHED();
    colsum_finish_kernel<<<(C + 255) / 256, 256, 0, st>>>(dst_a, dst_b, pa, pb, C);
    SNUG_CUDA_LAUNCHED();
}

__global__ void sum_doubles_kernel(double *out, const double *x, int n) {
    // out (1) = sum of x (n): one block, each thread a strided run in order, then the block's fixed tree
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += x[i];
    s = snug_block_sum(s, sh);
    if (threadIdx.x == 0)
        *out = s;
}

extern "C" void snug_cuda_sum_doubles(snug_backend *be, double *out, const double *x, int n) {
    sum_doubles_kernel<<<1, 1024, 0, snug_cuda_stream(be)>>>(out, x, n);
    SNUG_CUDA_LAUNCHED();
}

/* ------------------------------------------------------------------------------------------------ normalisation */

__global__ void rmsnorm_fwd_kernel(float *out, float *rstd, const float *inp, const float *w, int C, float eps) {
    // out (N,C) = inp * rstd * w ; rstd (N) = 1/sqrt(mean(inp^2) + eps); one block per row
    __shared__ double sh[32];
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    double ss = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        ss += (double)x[c] * x[c];
    ss = snug_block_sum(ss, sh);
    float r = (float)(1.0 / sqrt(ss / C + eps));
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = x[c] * r * w[c];
    if (rstd && threadIdx.x == 0)
        rstd[n] = r;
}

extern "C" void snug_cuda_rmsnorm_fwd(snug_backend *be, float *out, float *rstd, const float *inp, const float *w,
                                      int N, int C, float eps) {
    if (N <= 0 || C <= 0)
        return;
    rmsnorm_fwd_kernel<<<N, ROW_THREADS, 0, snug_cuda_stream(be)>>>(out, rstd, inp, w, C, eps);
    SNUG_CUDA_LAUNCHED();
}

__global__ void rmsnorm_bwd_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                   const float *rstd, int C) {
    // dx += r w g - x r^3/C * sum(g w x); one block per row
    __shared__ double sh[32];
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    double r = rstd[n], dot = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += (double)g[c] * w[c] * x[c];
    dot = snug_block_sum(dot, sh);
    float rf = (float)r, k = (float)(dot * r * r * r / C);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[c] += rf * w[c] * g[c] - k * x[c];
}

extern "C" void snug_cuda_rmsnorm_bwd(snug_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                                      const float *w, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0)
        return;
    if (dinp) {
        rmsnorm_bwd_kernel<<<N, ROW_THREADS, 0, snug_cuda_stream(be)>>>(dinp, dout, inp, w, rstd, C);
        SNUG_CUDA_LAUNCHED();
    }
    if (dw) // dw (C) += sum_n g x r
        snug_cuda_colsum(be, dw, NULL, dout, inp, NULL, rstd, N, C, SNUG_COLSUM_RMS);
}

__global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                     const float *b, int C, float eps) {
    // out (N,C) = (inp - mean) * rstd * w + b ; biased variance, two passes in double; one block per row
    __shared__ double sh[32];
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    double s = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += x[c];
    double mu = snug_block_sum(s, sh) / C;
    double ss = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        ss += (x[c] - mu) * (x[c] - mu);
    ss = snug_block_sum(ss, sh);
    float m = (float)mu, r = (float)(1.0 / sqrt(ss / C + eps));
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = (x[c] - m) * r * w[c] + b[c];
    if (threadIdx.x == 0) {
        if (mean)
            mean[n] = m;
        if (rstd)
            rstd[n] = r;
    }
}

extern "C" void snug_cuda_layernorm_fwd(snug_backend *be, float *out, float *mean, float *rstd, const float *inp,
                                        const float *w, const float *b, int N, int C, float eps) {
    if (N <= 0 || C <= 0)
        return;
    layernorm_fwd_kernel<<<N, ROW_THREADS, 0, snug_cuda_stream(be)>>>(out, mean, rstd, inp, w, b, C, eps);
    SNUG_CUDA_LAUNCHED();
}

__global__ void layernorm_bwd_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                     const float *mean, const float *rstd, int C) {
    // xhat = (x - mean) r, dn = g w:  dx += r (dn - mean(dn) - xhat mean(dn xhat)); one block per row
    __shared__ double sh[32];
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float m = mean[n], r = rstd[n];
    double sdn = 0.0, sdnx = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        double dn = (double)g[c] * w[c];
        sdn += dn;
        sdnx += dn * ((x[c] - m) * r);
    }
    sdn = snug_block_sum(sdn, sh);
    sdnx = snug_block_sum(sdnx, sh);
    float mdn = (float)(sdn / C), mdnx = (float)(sdnx / C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xhat = (x[c] - m) * r;
        dx[c] += r * (g[c] * w[c] - mdn - xhat * mdnx);
    }
}

extern "C" void snug_cuda_layernorm_bwd(snug_backend *be, float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, const float *mean, const float *rstd, int N,
                                        int C) {
    if (N <= 0 || C <= 0)
        return;
    if (dinp) {
        layernorm_bwd_kernel<<<N, ROW_THREADS, 0, snug_cuda_stream(be)>>>(dinp, dout, inp, w, mean, rstd, C);
        SNUG_CUDA_LAUNCHED();
    }
    if (dw || db) // dw (C) += sum_n g xhat ; db (C) += sum_n g
        snug_cuda_colsum(be, dw, db, dout, inp, mean, rstd, N, C, SNUG_COLSUM_LN);
}

/* ------------------------------------------------------------------------------------------------ rotary embeddings */

__global__ void rope_kernel(float *x, const int32_t *pos, const float *cos, const float *sin, int N, int H, int HD,
                            int stride, float sgn) {
    // one thread per pair (i, i + HD/2) of head h of row n: rotation by +angle (sgn 1) or -angle (sgn -1)
    int half = HD / 2;
    size_t total = (size_t)N * H * half;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(t % half);
        size_t nh = t / half;
        int h = (int)(nh % H), n = (int)(nh / H);
        size_t ci = (size_t)pos[n] * half + i;
        float c = cos[ci], s = sgn * sin[ci];
        float *xh = x + (size_t)n * stride + (size_t)h * HD;
        float x0 = xh[i], x1 = xh[i + half];
        xh[i] = x0 * c - x1 * s;
        xh[i + half] = x1 * c + x0 * s;
    }
}

static void rope_launch(snug_backend *be, float *x, const int32_t *pos, const float *cos, const float *sin, int N,
                        int H, int HD, int stride, float sgn) {
    size_t total = (size_t)N * H * (HD / 2);
    if (total == 0)
        return;
    rope_kernel<<<snug_cuda_grid(total), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(x, pos, cos, sin, N, H, HD,
                                                                                        stride, sgn);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_rope_fwd(snug_backend *be, float *x, const int32_t *pos, const float *cos,
                                   const float *sin, int N, int H, int HD, int stride) {
    rope_launch(be, x, pos, cos, sin, N, H, HD, stride, 1.0f);
}

extern "C" void snug_cuda_rope_bwd(snug_backend *be, float *dx, const int32_t *pos, const float *cos,
                                   const float *sin, int N, int H, int HD, int stride) {
    rope_launch(be, dx, pos, cos, sin, N, H, HD, stride, -1.0f);
}

/* ------------------------------------------------------------------------------------------------ activations */

/* A grid-stride loop over i in [0, n). */
#define FOR_EACH(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ void swiglu_fwd_kernel(float *out, const float *gu, int I, size_t total) {
    // gu (N,2I) = [gate | up] ; out (N,I) = silu(gate) * up
    FOR_EACH(t, total) {
        size_t n = t / I, i = t % I;
        float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
        out[t] = g / (1.0f + expf(-g)) * u;
    }
}

__global__ void swiglu_bwd_kernel(float *dgu, const float *dout, const float *gu, int I, size_t total) {
    // d silu(x)/dx = sig(x) (1 + x (1 - sig(x)))
    FOR_EACH(t, total) {
        size_t n = t / I, i = t % I;
        float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i], d = dout[t];
        float sig = 1.0f / (1.0f + expf(-g));
        dgu[n * 2 * I + i] += d * u * (sig * (1.0f + g * (1.0f - sig)));
        dgu[n * 2 * I + I + i] += d * (g * sig);
    }
}

extern "C" void snug_cuda_swiglu_fwd(snug_backend *be, float *out, const float *gu, int N, int I) {
    size_t total = (size_t)N * I;
    if (N <= 0 || I <= 0)
        return;
    swiglu_fwd_kernel<<<snug_cuda_grid(total), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(out, gu, I, total);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_swiglu_bwd(snug_backend *be, float *dgu, const float *dout, const float *gu, int N, int I) {
    size_t total = (size_t)N * I;
    if (N <= 0 || I <= 0)
        return;
    swiglu_bwd_kernel<<<snug_cuda_grid(total), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(dgu, dout, gu, I,
                                                                                              total);
    SNUG_CUDA_LAUNCHED();
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

__global__ void gelu_fwd_kernel(float *out, const float *inp, size_t n) {
    FOR_EACH(i, n) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

__global__ void gelu_bwd_kernel(float *dinp, const float *dout, const float *inp, size_t n) {
    FOR_EACH(i, n) {
        float x = inp[i];
        float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float d = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += dout[i] * d;
    }
}

extern "C" void snug_cuda_gelu_fwd(snug_backend *be, float *out, const float *inp, size_t n) {
    if (!n)
        return;
    gelu_fwd_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(out, inp, n);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_gelu_bwd(snug_backend *be, float *dinp, const float *dout, const float *inp, size_t n) {
    if (!n)
        return;
    gelu_bwd_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(dinp, dout, inp, n);
    SNUG_CUDA_LAUNCHED();
}

/* ------------------------------------------------------------------------------------------------ 16-bit storage */

__global__ void to16_kernel(uint16_t *dst, float *src, size_t n, snug_dtype dt, int round_src) {
    // dst (n, may be NULL with round_src) = src (n) rounded to dt (nearest even); with round_src, src too
    FOR_EACH(i, n) {
        uint16_t h;
        float r;
        if (dt == SNUG_DT_BF16) {
            h = snug_d_f32_to_bf16(src[i]);
            r = snug_d_bf16_to_f32(h);
        } else {
            h = snug_d_f32_to_f16(src[i]);
            r = snug_d_f16_to_f32(h);
        }
        if (round_src)
            src[i] = r;
        if (dst)
            dst[i] = h;
    }
}

__global__ void from16_kernel(float *dst, const void *src, size_t n, snug_dtype dt) {
    FOR_EACH(i, n) dst[i] = snug_d_load(src, i, dt);
}

__global__ void bf16_sr_kernel(uint16_t *dst, const float *src, size_t n, uint64_t seed) {
    // add the low 16 random bits of element i to the fp32 pattern and truncate; non-finite values round to nearest
    FOR_EACH(i, n) {
        float f = src[i];
        uint32_t x = __float_as_uint(f);
        if ((x & 0x7f800000u) == 0x7f800000u)
            dst[i] = snug_d_f32_to_bf16(f);
        else
            dst[i] = (uint16_t)((x + (snug_sr_bits(seed, i) & 0xffffu)) >> 16);
    }
}

extern "C" void snug_cuda_to16(snug_backend *be, void *dst, float *src, size_t n, snug_dtype dt, int round_src) {
    if (!n || (!dst && !round_src))
        return;
    if (dt != SNUG_DT_BF16 && dt != SNUG_DT_F16) {
        snug_cuda_fail(be, __FILE__, __LINE__, "to16 needs BF16 or F16, not dtype %d", (int)dt);
        return;
    }
    to16_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>((uint16_t *)dst, src, n, dt,
                                                                                 round_src);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_from16(snug_backend *be, float *dst, const void *src, size_t n, snug_dtype dt) {
    if (!n)
        return;
    from16_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(dst, src, n, dt);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_bf16_sr(snug_backend *be, uint16_t *dst, const float *src, size_t n, uint64_t seed) {
    if (!n)
        return;
    bf16_sr_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(dst, src, n, seed);
    SNUG_CUDA_LAUNCHED();
}

/* ------------------------------------------------------------------------------------------------ elementwise */

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) { FOR_EACH(i, n) out[i] = a[i] + b[i]; }
__global__ void accumulate_kernel(float *dst, const float *src, size_t n) { FOR_EACH(i, n) dst[i] += src[i]; }
__global__ void scale_kernel(float *x, float s, size_t n) { FOR_EACH(i, n) x[i] *= s; }

extern "C" void snug_cuda_add(snug_backend *be, float *out, const float *a, const float *b, size_t n) {
    if (!n)
        return;
    add_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(out, a, b, n);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_accumulate(snug_backend *be, float *dst, const float *src, size_t n) {
    if (!n)
        return;
    accumulate_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(dst, src, n);
    SNUG_CUDA_LAUNCHED();
}

/* the code book travels by value: 16 floats in the kernel's parameters */
typedef struct code16 {
    float v[16];
} code16;

__global__ void dequantize_4bit_kernel(float *dst, const uint8_t *packed, const float *absmax, const uint8_t *absmax_q,
                                       const float *nested_absmax, const float *nested_map, float nested_offset,
                                       code16 code, size_t n, int blocksize) {
    FOR_EACH(i, n) {
        size_t b = i / (size_t)blocksize;
        float a = absmax ? absmax[b] : nested_map[absmax_q[b]] * nested_absmax[b / 256] + nested_offset;
        uint8_t byte = packed[i >> 1];
        dst[i] = code.v[i & 1 ? byte & 15 : byte >> 4] * a;
    }
}

extern "C" void snug_cuda_dequantize_4bit(snug_backend *be, float *dst, const uint8_t *packed, const float *absmax,
                                          const uint8_t *absmax_q, const float *nested_absmax,
                                          const float *nested_map, float nested_offset, const float *code, size_t n,
                                          int blocksize) {
    if (!n)
        return;
    code16 c;
    memcpy(c.v, code, sizeof c.v); /* code is host memory (the code book of quant4.c) */
    dequantize_4bit_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(
        dst, packed, absmax, absmax_q, nested_absmax, nested_map, nested_offset, c, n, blocksize);
    SNUG_CUDA_LAUNCHED();
}

__global__ void dequantize_int8_kernel(float *dst, const int8_t *codes, const float *scb, size_t n, size_t cols) {
    FOR_EACH(i, n) dst[i] = __fmul_rn((float)codes[i], snug_q8_row_scale(scb[i / cols]));
}

extern "C" void snug_cuda_dequantize_int8(snug_backend *be, float *dst, const int8_t *codes, const float *scb,
                                          size_t rows, size_t cols) {
    if (!rows || !cols)
        return;
    dequantize_int8_kernel<<<snug_cuda_grid(rows * cols), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(
        dst, codes, scb, rows * cols, cols);
    SNUG_CUDA_LAUNCHED();
}

__global__ void dropout_kernel(float *out, const float *in, size_t n, float p, uint64_t seed) {
    float keep = 1.0f / (1.0f - p);
    FOR_EACH(i, n) out[i] = snug_dropout_keep(seed, i, p) ? in[i] * keep : 0.0f;
}

extern "C" void snug_cuda_dropout(snug_backend *be, float *out, const float *in, size_t n, float p, uint64_t seed) {
    if (!n)
        return;
    dropout_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(out, in, n, p, seed);
    SNUG_CUDA_LAUNCHED();
}

__global__ void add_noise_kernel(float *x, size_t n, float mag, uint64_t seed) {
    /* no contraction: the CPU's bits */
    FOR_EACH(i, n) x[i] = __fadd_rn(x[i], __fmul_rn(mag, snug_uniform_pm1(seed, i)));
}

extern "C" void snug_cuda_add_noise(snug_backend *be, float *x, size_t n, float mag, uint64_t seed) {
    if (!n)
        return;
    add_noise_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(x, n, mag, seed);
    SNUG_CUDA_LAUNCHED();
}

/* one warp per row: lane k sums elements k, k + 32, ... in double, the lanes then folded by a fixed tree. (The CPU sums
 * the row in index order, so the two agree to double rounding, not bit for bit.) */
__device__ static double warp_row_sum(const float *a, const float *b, int cols) {
    int lane = threadIdx.x & 31;
    double s = 0;
    for (int i = lane; i < cols; i += 32)
        s += (double)a[i] * (double)b[i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, o);
    return s;
}

__global__ void row_norms_kernel(float *out, const float *a, size_t lda, int rows, int cols) {
    int j = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    if (j >= rows)
        return;
    const float *r = a + (size_t)j * lda;
    double s = warp_row_sum(r, r, cols);
    if ((threadIdx.x & 31) == 0)
        out[j] = (float)sqrt(s);
}

__global__ void row_dots_kernel(float *out, const float *a, size_t lda, const float *b, size_t ldb, int rows, int cols,
                                const float *div) {
    int j = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    if (j >= rows)
        return;
    double s = warp_row_sum(a + (size_t)j * lda, b + (size_t)j * ldb, cols);
    if ((threadIdx.x & 31) == 0)
        out[j] = __fadd_rn(out[j], (float)(s / div[j]));
}

__global__ void scale_cols_kernel(float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                                  const float *mag, const float *nrm, const float *bias) {
    size_t n = (size_t)N * (size_t)cols;
    FOR_EACH(k, n) {
        size_t t = k / (size_t)cols;
        int j = (int)(k % (size_t)cols);
        float g = __fdiv_rn(mag[j], nrm[j]), x = in[t * ldi + j];
        out[t * ldo + j] = bias ? __fadd_rn(bias[j], __fmul_rn(g, __fsub_rn(x, bias[j]))) : __fmul_rn(g, x);
    }
}

__global__ void add_scaled_cols_kernel(float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                                       const float *mag, const float *nrm, float minus) {
    size_t n = (size_t)N * (size_t)cols;
    FOR_EACH(k, n) {
        size_t t = k / (size_t)cols;
        int j = (int)(k % (size_t)cols);
        float f = __fsub_rn(__fdiv_rn(mag[j], nrm[j]), minus);
        out[t * ldo + j] = __fadd_rn(out[t * ldo + j], __fmul_rn(f, in[t * ldi + j]));
    }
}

extern "C" void snug_cuda_add_scaled_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N,
                                          int cols, const float *mag, const float *nrm, float minus) {
    size_t n = (size_t)N * (size_t)cols;
    if (!n)
        return;
    add_scaled_cols_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(out, ldo, in, ldi, N,
                                                                                             cols, mag, nrm, minus);
    SNUG_CUDA_LAUNCHED();
}

/* one thread per column, walking the tokens in order (neighbouring threads read neighbouring floats) */
__global__ void col_dots_kernel(float *out, const float *a, size_t lda, const float *y, size_t ldy, int N, int cols,
                                const float *bias, const float *div) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols)
        return;
    double s = 0;
    for (int t = 0; t < N; t++) {
        float v = y[(size_t)t * ldy + j], d = bias ? __fsub_rn(v, bias[j]) : v;
        s += (double)a[(size_t)t * lda + j] * (double)d;
    }
    out[j] = __fadd_rn(out[j], (float)(s / div[j]));
}

extern "C" void snug_cuda_col_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *y,
                                   size_t ldy, int N, int cols, const float *bias, const float *div) {
    if (cols <= 0)
        return;
    col_dots_kernel<<<(cols + 127) / 128, 128, 0, snug_cuda_stream(be)>>>(out, a, lda, y, ldy, N, cols, bias, div);
    SNUG_CUDA_LAUNCHED();
}

static unsigned row_blocks(int rows) { return (unsigned)(((size_t)rows * 32 + 255) / 256); }

extern "C" void snug_cuda_row_norms(snug_backend *be, float *out, const float *a, size_t lda, int rows, int cols) {
    if (rows <= 0)
        return;
    row_norms_kernel<<<row_blocks(rows), 256, 0, snug_cuda_stream(be)>>>(out, a, lda, rows, cols);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_row_dots(snug_backend *be, float *out, const float *a, size_t lda, const float *b,
                                   size_t ldb, int rows, int cols, const float *div) {
    if (rows <= 0)
        return;
    row_dots_kernel<<<row_blocks(rows), 256, 0, snug_cuda_stream(be)>>>(out, a, lda, b, ldb, rows, cols, div);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_scale_cols(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N,
                                     int cols, const float *mag, const float *nrm, const float *bias) {
    size_t n = (size_t)N * (size_t)cols;
    if (!n)
        return;
    scale_cols_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(out, ldo, in, ldi, N, cols,
                                                                                        mag, nrm, bias);
    SNUG_CUDA_LAUNCHED();
}

extern "C" void snug_cuda_scale(snug_backend *be, float *x, float s, size_t n) {
    if (!n)
        return;
    scale_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(x, s, n);
    SNUG_CUDA_LAUNCHED();
}
