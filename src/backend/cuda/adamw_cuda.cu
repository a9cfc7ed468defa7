/* adamw_cuda.cu: the optimizer ops on the GPU: sumsq (the gradient norm and the loss scaler's overflow check), fp32
 * AdamW, and bitsandbytes' 8-bit blockwise state (quantize, dequantize, 8-bit AdamW). Semantics in
 * backend/backend.h; the CPU ops in backend/cpu/ops_cpu.c and adamw8bit_cpu.c are the reference.
 *
 * AdamW and the 8-bit ops spell every fp32 operation with a round-to-nearest intrinsic (__fmul_rn, __fadd_rn, ...):
 * these are never fused into multiply-adds, so each operation rounds exactly where the CPU's does and the results
 * match the CPU bit for bit (the CPU builds without floating-point contraction). The 8-bit step runs one block of 256
 * threads per 256-element block, as bitsandbytes' kernel does; the CPU runs the same search lane by lane. */
#include <math.h>

#include "backend/cuda/cuda_internal.h"

/* Fixed number of blocks of a sumsq, independent of the device, so the sum has the same bits everywhere. */
#define SUMSQ_BLOCKS SNUG_CUDA_SUMSQ_BLOCKS /* backend_cuda.h: the scratch is sized by it */
#define QBLK 256

/* ------------------------------------------------------------------------------------------------ sumsq */

__global__ void sumsq_kernel(double *part, const void *x, snug_dtype dt, size_t n) {
    // part (SUMSQ_BLOCKS): block b sums the squares of its contiguous share of x (n, stored as dt), in double
    __shared__ double sh[32];
    size_t b = blockIdx.x, nb = SUMSQ_BLOCKS;
    size_t i0 = n / nb * b + (b < n % nb ? b : n % nb);
    size_t i1 = i0 + n / nb + (b < n % nb);
    double s = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        double v = snug_d_load(x, i, dt);
        s += v * v;
    }
    s = snug_block_sum(s, sh);
    if (threadIdx.x == 0)
        part[b] = s;
}

/* Queues the sum of squares of x: the device address of the total (in the scratch, valid until the next op that
 * takes scratch), or NULL with the failure recorded. */
static const double *sumsq_queue(snug_backend *be, const void *x, snug_dtype dt, size_t n) {
    double *part = (double *)snug_cuda_scratch(be, (SUMSQ_BLOCKS + 1) * sizeof(double));
    if (!part)
        return NULL;
    sumsq_kernel<<<SUMSQ_BLOCKS, 256, 0, snug_cuda_stream(be)>>>(part, x, dt, n);
    SNUG_CUDA_LAUNCHED();
    snug_cuda_sum_doubles(be, part + SUMSQ_BLOCKS, part, SUMSQ_BLOCKS);
    return part + SUMSQ_BLOCKS;
}

/* The host's copy of a device double, after the queued work; NaN after any failure, so that a norm shows it even
 * unchecked (and the loss scaler reads it as an overflow). */
static double sumsq_read(snug_backend *be, const double *d) {
    cudaStream_t st = snug_cuda_stream(be);
    double total = 0.0;
    if (d)
        SNUG_CUDA_CHECK(cudaMemcpyAsync(&total, d, sizeof total, cudaMemcpyDeviceToHost, st));
    SNUG_CUDA_CHECK(cudaStreamSynchronize(st));
    return snug_cuda(be)->err.code || !d ? NAN : total;
}

extern "C" double snug_cuda_sumsq(snug_backend *be, const void *x, snug_dtype dt, size_t n) {
    if (!n)
        return 0.0;
    return sumsq_read(be, sumsq_queue(be, x, dt, n));
}

__global__ void add_double_kernel(double *acc, const double *x) { *acc += *x; } // one thread

extern "C" void snug_cuda_sumsq_acc(snug_backend *be, const void *x, snug_dtype dt, size_t n) {
    if (!n) /* the host would add 0.0: a no-op on any finite or non-finite accumulator */
        return;
    const double *total = sumsq_queue(be, x, dt, n);
    if (!total)
        return;
    add_double_kernel<<<1, 1, 0, snug_cuda_stream(be)>>>(snug_cuda(be)->acc, total);
    SNUG_CUDA_LAUNCHED();
}

extern "C" double snug_cuda_sumsq_take(snug_backend *be) {
    double *acc = snug_cuda(be)->acc;
    double total = sumsq_read(be, acc);
    SNUG_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof *acc, snug_cuda_stream(be))); /* ordered before later adds */
    return total;
}

/* ------------------------------------------------------------------------------------------------ AdamW */

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float decay, float w1,
                             float w1m1, int lerp_small, float w2, float beta2_f, float bc2_sqrt, float eps,
                             float neg_step_size, float grad_scale) {
    // torch.optim.AdamW, the CPU's operations in its order:
    //   p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = v*b2 + (1-b2)*g*g; p += -lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(g[i], grad_scale);
        float pi = __fmul_rn(p[i], decay);
        float mi = m[i];
        float d = __fsub_rn(gi, mi);
        mi = lerp_small ? __fmaf_rn(w1, d, mi) : __fmaf_rn(w1m1, d, gi);
        float vi = __fmaf_rn(__fmul_rn(w2, gi), gi, __fmul_rn(v[i], beta2_f));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(neg_step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" void snug_cuda_adamw(snug_backend *be, float *p, const float *g, float *m, float *v, size_t n, double lr,
                                double beta1, double beta2, double eps_d, double weight_decay, int step,
                                float grad_scale) {
    if (!n)
        return;
    // the scalars exactly as the CPU derives them (doubles from the caller, then fp32)
    double b1 = beta1, b2 = beta2;
    double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    float decay = (float)(1.0 - lr * weight_decay);
    float w1 = (float)(1.0 - b1), w2 = (float)(1.0 - b2);
    float w1m1 = w1 - 1.0f;
    float neg_step_size = (float)-(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    int lerp_small = fabsf(w1) < 0.5f; /* torch's lerp picks its formula by the weight */
    adamw_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(
        p, g, m, v, n, decay, w1, w1m1, lerp_small, w2, (float)beta2, bc2_sqrt, (float)eps_d, neg_step_size,
        grad_scale);
    SNUG_CUDA_LAUNCHED();
}

/* ------------------------------------------------------------------------------------------------ 8-bit state */

/* bitsandbytes' quantize_2D for one value s of a block of absmax amax, code (256) sorted: x = s/amax, a 7-step
 * binary search from pivot 127, then the nearer of the last value and its neighbour on x's side by their midpoint;
 * with is_signed, a code of the wrong sign moves one step toward s's sign (codes are never -0; s may be). The same
 * steps as quantize_block in backend/cpu/adamw8bit_cpu.c, one value per thread. */
static __device__ uint8_t quantize_one(float s, float amax, const float *code, int is_signed) {
    float x = amax > 0.0f ? __fdiv_rn(s, amax) : 0.0f;
    int pivot = 127, lower_pivot = 0, upper_pivot = 255;
    float lower = is_signed ? -1.0f : 0.0f, upper = 1.0f, val = code[127];
    for (int i = 64; i > 0; i >>= 1) {
        int gt = x > val;
        lower_pivot = gt ? pivot : lower_pivot;
        lower = gt ? val : lower;
        upper_pivot = gt ? upper_pivot : pivot;
        upper = gt ? upper : val;
        pivot += gt ? i : -i;
        val = code[pivot];
    }
    int gt = x > val;
    float mid = __fmul_rn(__fadd_rn(gt ? upper : lower, val), 0.5f);
    int up = x > mid ? upper_pivot : pivot, down = x < mid ? lower_pivot : pivot;
    pivot = gt ? up : down;
    if (is_signed) {
        int s_neg = (__float_as_uint(s) >> 31) != 0, c_neg = code[pivot] < 0.0f;
        pivot += s_neg == c_neg ? 0 : s_neg ? -1 : 1;
    }
    return (uint8_t)pivot;
}

__global__ void quantize_kernel(uint8_t *q, float *absmax, const float *x, const float *code, int is_signed,
                                size_t n) {
    // one block of QBLK threads per block of QBLK elements: absmax[b] = max |x|, then one code per element
    __shared__ float scode[256];
    __shared__ float sh[32];
    size_t i = (size_t)blockIdx.x * QBLK + threadIdx.x;
    scode[threadIdx.x] = code[threadIdx.x];
    float s = i < n ? x[i] : 0.0f;
    float a = fmaxf(0.0f, fabsf(s)); /* fmaxf drops a NaN, as the CPU's fmaxf chain does */
    float amax = snug_block_max(a, sh); /* its barriers also publish scode */
    if (threadIdx.x == 0)
        absmax[blockIdx.x] = amax;
    if (i < n)
        q[i] = quantize_one(s, amax, scode, is_signed);
}

extern "C" void snug_cuda_quantize_blockwise(snug_backend *be, uint8_t *q, float *absmax, const float *x,
                                             const float *code, int is_signed, size_t n) {
    if (!n)
        return;
    size_t nblk = (n + QBLK - 1) / QBLK;
    quantize_kernel<<<(unsigned int)nblk, QBLK, 0, snug_cuda_stream(be)>>>(q, absmax, x, code, is_signed, n);
    SNUG_CUDA_LAUNCHED();
}

__global__ void dequantize_kernel(float *x, const uint8_t *q, const float *absmax, const float *code, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(code[q[i]], absmax[i / QBLK]);
}

extern "C" void snug_cuda_dequantize_blockwise(snug_backend *be, float *x, const uint8_t *q, const float *absmax,
                                               const float *code, size_t n) {
    if (!n)
        return;
    dequantize_kernel<<<snug_cuda_grid(n), SNUG_CUDA_THREADS, 0, snug_cuda_stream(be)>>>(x, q, absmax, code, n);
    SNUG_CUDA_LAUNCHED();
}

__global__ void adamw8bit_kernel(float *p, const float *g, uint8_t *qm, uint8_t *qv, float *absmax_m,
                                 float *absmax_v, const float *map_signed, const float *map_unsigned, size_t n,
                                 float b1, float b2, float omb1, float omb2, float step_size, float decay,
                                 float eps_c2, float grad_scale) {
    // one block of QBLK threads per block of QBLK elements, one element per thread; the CPU's steps in its order
    __shared__ float ms[256], mu[256];
    __shared__ float sh[32];
    size_t b = blockIdx.x, i = b * QBLK + threadIdx.x;
    int in = i < n;
    ms[threadIdx.x] = map_signed[threadIdx.x];
    mu[threadIdx.x] = map_unsigned[threadIdx.x];
    __syncthreads();
    float am_old = absmax_m[b], av_old = absmax_v[b];
    // 1-2. dequantize with the old absmax, update in fp32; a non-finite g zeroes m and v
    float g0 = in ? g[i] : 0.0f;
    int ok = isfinite(g0);
    float gj = ok ? __fmul_rn(g0, grad_scale) : 0.0f;
    float vj = 0.0f, mj = 0.0f;
    if (in && ok) {
        vj = __fadd_rn(__fmul_rn(__fmul_rn(mu[qv[i]], av_old), b2), __fmul_rn(__fmul_rn(omb2, gj), gj));
        mj = __fadd_rn(__fmul_rn(__fmul_rn(ms[qm[i]], am_old), b1), __fmul_rn(omb1, gj));
    }
    // 3. the new scales: max |m|, max |v| (a NaN never wins, as in the CPU's `x > max ? x : max` from 0)
    float am_t = fabsf(mj) > 0.0f ? fabsf(mj) : 0.0f, av_t = fabsf(vj) > 0.0f ? fabsf(vj) : 0.0f;
    float am = snug_block_max(am_t, sh);
    float av = snug_block_max(av_t, sh); /* every thread read the old absmax before these barriers */
    if (threadIdx.x == 0) {
        absmax_m[b] = am;
        absmax_v[b] = av;
    }
    if (!in)
        return;
    // 4. the parameter, from the unquantized m and v; decoupled weight decay after the update
    if (ok) {
        float upd = __fmul_rn(step_size, __fdiv_rn(mj, __fadd_rn(__fsqrt_rn(vj), eps_c2)));
        p[i] = __fmul_rn(__fadd_rn(p[i], upd), decay);
    }
    // 5. requantize with the new absmax
    qm[i] = quantize_one(mj, am, ms, 1);
    qv[i] = quantize_one(vj, av, mu, 0);
}

extern "C" void snug_cuda_adamw8bit(snug_backend *be, float *p, const float *g, uint8_t *qm, uint8_t *qv,
                                    float *absmax_m, float *absmax_v, const float *map_signed,
                                    const float *map_unsigned, size_t n, double lr, double beta1, double beta2,
                                    double eps, double weight_decay, int step, float grad_scale) {
    if (!n)
        return;
    // the scalars exactly as the CPU (and bitsandbytes) derive them, in fp32
    const float b1 = (float)beta1, b2 = (float)beta2, epsf = (float)eps, lrf = (float)lr, wd = (float)weight_decay;
    const float correction1 = 1.0f - powf(b1, (float)step);
    const float correction2 = sqrtf(1.0f - powf(b2, (float)step));
    const float step_size = -lrf * correction2 / correction1;
    const float decay = wd > 0.0f ? 1.0f - lrf * wd : 1.0f;
    const float eps_c2 = correction2 * epsf;
    size_t nblk = (n + QBLK - 1) / QBLK;
    adamw8bit_kernel<<<(unsigned int)nblk, QBLK, 0, snug_cuda_stream(be)>>>(
        p, g, qm, qv, absmax_m, absmax_v, map_signed, map_unsigned, n, b1, b2, 1.0f - b1, 1.0f - b2, step_size,
        decay, eps_c2, grad_scale);
    SNUG_CUDA_LAUNCHED();
}
