/* test_emu.cu: the emulated CUDA runtime's own tests: that it gives the GPU's semantics where snug's kernels rely on
 * them (shuffles, barriers, __syncthreads_or, WMMA, stream and event order) and that it stops, naming the place, on
 * what a GPU would turn into a hang, an illegal address or silently wrong results: a barrier reached by part of a
 * block, barriers at different lines, a warp operation a lane never reaches, a host or freed pointer given to a
 * kernel, a bad launch, and, under AddressSanitizer, a kernel reading past its buffer or its shared array and the
 * host reading device memory. A missing wait between two streams must give wrong data, in every run the same.
 *
 * Each case that must stop runs in a child process; the test reads its error output for the expected words.
 * Compiled like snug's .cu files: cu2cpp, then the host compiler against tests/cuda_emu/include. */
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int pass, failed;
#define CHECK(cond, ...)                                                                                              \
    do {                                                                                                              \
        if (cond) {                                                                                                   \
            pass++;                                                                                                   \
        } else {                                                                                                      \
            failed++;                                                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                     \
            fprintf(stderr, __VA_ARGS__);                                                                             \
            fprintf(stderr, "\n");                                                                                    \
        }                                                                                                             \
    } while (0)

/* ------------------------------------------------------------------------------------------------ kernels */

/* out[i] = each shuffle's result for thread i: xor 5, down 3 (width 16), up 2, idx 7 (width 8) */
__global__ void shfl_kernel(int *out) {
    int t = threadIdx.x, v = 100 + t;
    out[t * 4 + 0] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[t * 4 + 1] = __shfl_down_sync(0xffffffffu, v, 3, 16);
    out[t * 4 + 2] = __shfl_up_sync(0xffffffffu, v, 2);
    out[t * 4 + 3] = __shfl_sync(0xffffffffu, v, 7, 8);
}

/* a block sum through shared memory and barriers, and __syncthreads_or of "my index is `who`" */
__global__ void block_kernel(int *out, int who) {
    __shared__ int s[256];
    s[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h)
            s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    int any = __syncthreads_or((int)threadIdx.x == who);
    if (threadIdx.x == 0) {
        out[blockIdx.x * 2] = s[0];
        out[blockIdx.x * 2 + 1] = any;
    }
}

__global__ void partial_barrier_kernel(int *out) {
    if (threadIdx.x >= 32)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void two_barriers_kernel(int *out) {
    if (threadIdx.x & 1)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void lane_gone_kernel(int *out) {
    if (threadIdx.x == 3)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void write_kernel(float *x, float v, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = v;
}

/* reads one element past x's n */
__global__ void overflow_kernel(float *out, const float *x, int n) {
    if (threadIdx.x == 0)
        out[0] = x[n];
}

__global__ void shared_overflow_kernel(int *out, int k) {
    __shared__ int s[32];
    s[threadIdx.x] = 1;
    __syncthreads();
    const int *p = s; /* through a pointer: past the array's end, where no bounds check of the index can see */
    if (threadIdx.x == 0)
        out[0] = p[32 + k];
}

__global__ void dyn_smem_kernel(float *out, int n) {
    extern __shared__ float dyn[];
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        dyn[i] = (float)i;
    __syncthreads();
    if (threadIdx.x == 0)
        out[0] = dyn[n - 1];
}

using namespace nvcuda;
/* D (16, 16) = A (16, 16) B (16, 16) in bf16 inputs with fp32 accumulation, one warp */
__global__ void wmma_kernel(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b) {
    __shared__ __align__(32) __nv_bfloat16 as[256], bs[256];
    __shared__ __align__(32) float ds[256];
    for (int i = threadIdx.x; i < 256; i += 32)
        as[i] = a[i], bs[i] = b[i];
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 1.0f);
    wmma::load_matrix_sync(fa, as, 16);
    wmma::load_matrix_sync(fb, bs, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(ds, fc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = threadIdx.x; i < 256; i += 32)
        d[i] = ds[i];
}

/* ------------------------------------------------------------------------------------------------ helpers */

/* Runs fn in a child; returns its exit status and puts its error output in err. */
static int in_child(void (*fn)(void), char *err, size_t nerr) {
    int p[2];
    if (pipe(p))
        return -1;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        fn();
        _exit(0);
    }
    close(p[1]);
    size_t got = 0;
    ssize_t r;
    while ((r = read(p[0], err + got, nerr - 1 - got)) > 0 && got + (size_t)r < nerr - 1)
        got += (size_t)r;
    if (r > 0)
        got += (size_t)r;
    err[got] = 0;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void expect_stop(const char *what, void (*fn)(void), const char *words) {
    char err[16384];
    int st = in_child(fn, err, sizeof err);
    int stopped = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(stopped && strstr(err, words), "%s: expected a stop saying \"%s\"; got status %d and:\n%s", what, words, st,
          err);
    const char *line = strstr(err, words);
    printf("  %-44s stopped: ...%.*s\n", what, line ? (int)(strcspn(line, "\n") < 90 ? strcspn(line, "\n") : 90) : 0,
           line ? line : "");
}

static int *dev_ints(int n) {
    int *d = NULL;
    cudaMalloc(&d, (size_t)n * sizeof(int));
    cudaMemset(d, 0, (size_t)n * sizeof(int));
    return d;
}

/* ------------------------------------------------------------------------------------------------ cases */

static void test_shuffles(void) {
    int *d = dev_ints(64 * 4), h[64 * 4];
    shfl_kernel<<<1, 64>>>(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int t = 0; t < 64; t++) {
        int lane = t & 31, base = t - lane;
        int want[4] = {100 + base + (lane ^ 5), 100 + ((lane & 15) + 3 < 16 ? t + 3 : t),
                       100 + ((lane & 31) >= 2 ? t - 2 : t), 100 + base + (lane & ~7) + 7};
        for (int k = 0; k < 4; k++)
            bad += h[t * 4 + k] != want[k];
    }
    CHECK(bad == 0, "shuffles: %d of 256 results differ from the GPU's semantics", bad);
    printf("  %-44s %s\n", "shuffles (xor, down width 16, up, idx width 8)", bad ? "WRONG" : "as on a GPU");
    cudaFree(d);
}

static void test_block(void) {
    int *d = dev_ints(6), h[6];
    block_kernel<<<3, 256>>>(d, 200);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 32640 && h[2] == 32640 && h[4] == 32640, "block sums %d %d %d, want 32640", h[0], h[2], h[4]);
    CHECK(h[1] == 1 && h[3] == 1 && h[5] == 1, "__syncthreads_or gave %d", h[1]);
    block_kernel<<<1, 256>>>(d, 999);
    cudaMemcpy(h, d, 2 * sizeof(int), cudaMemcpyDeviceToHost);
    CHECK(h[1] == 0, "__syncthreads_or with no thread true gave %d", h[1]);
    printf("  %-44s %s\n", "block barriers, __syncthreads_or", failed ? "WRONG" : "as on a GPU");
    cudaFree(d);
}

static void test_wmma(void) {
    __nv_bfloat16 a[256], b[256];
    float fa[256], fb[256], ref[256], got[256];
    for (int i = 0; i < 256; i++) {
        a[i] = __float2bfloat16_rn((float)((i * 37) % 23 - 11) / 8.0f);
        b[i] = __float2bfloat16_rn((float)((i * 53) % 19 - 9) / 4.0f);
        fa[i] = __bfloat162float(a[i]), fb[i] = __bfloat162float(b[i]);
    }
    /* B loaded col_major: element (k, n) at b[n * 16 + k] */
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++)
                s += fa[m * 16 + k] * fb[n * 16 + k];
            ref[m * 16 + n] = s + 1.0f;
        }
    float *dd;
    __nv_bfloat16 *da, *db;
    cudaMalloc(&dd, sizeof got), cudaMalloc(&da, sizeof a), cudaMalloc(&db, sizeof b);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice), cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    wmma_kernel<<<1, 32>>>(dd, da, db);
    cudaMemcpy(got, dd, sizeof got, cudaMemcpyDeviceToHost);
    CHECK(!memcmp(got, ref, sizeof ref), "WMMA's product differs from the reference");
    printf("  %-44s %s\n", "WMMA 16x16x16 bf16 -> fp32",
           memcmp(got, ref, sizeof ref) ? "WRONG" : "the reference's bits");
    cudaFree(dd), cudaFree(da), cudaFree(db);
}

/* Two streams: s1 fills x with 1, s2 copies x to y. Without a wait s2's copy runs before s1's fill (the emulator
 * runs the later-queued of two unordered items first), so y keeps its old value; with an event it gets the 1s. */
static void test_streams(void) {
    int n = 1000;
    float *x, *y, h[1000];
    cudaMalloc(&x, n * 4), cudaMalloc(&y, n * 4);
    cudaMemset(x, 0, n * 4), cudaMemset(y, 0, n * 4);
    cudaStream_t s1, s2;
    cudaEvent_t ev;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    write_kernel<<<4, 256, 0, s1>>>(x, 1.0f, n);
    cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice, s2); /* missing: cudaStreamWaitEvent(s2, ev) */
    cudaDeviceSynchronize();
    cudaMemcpy(h, y, n * 4, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 0.0f && h[n - 1] == 0.0f, "a copy with no wait for the fill saw the fill (y[0] = %g)", h[0]);
    write_kernel<<<4, 256, 0, s1>>>(x, 2.0f, n);
    cudaEventRecord(ev, s1);
    cudaStreamWaitEvent(s2, ev, 0);
    cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice, s2);
    cudaStreamSynchronize(s2);
    cudaMemcpy(h, y, n * 4, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 2.0f && h[n - 1] == 2.0f, "a copy after an event wait missed the fill (y[0] = %g)", h[0]);
    /* one stream: in order */
    write_kernel<<<4, 256, 0, s1>>>(x, 3.0f, n);
    cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice, s1);
    cudaMemcpyAsync(h, y, n * 4, cudaMemcpyDeviceToHost, s1);
    CHECK(h[0] == 3.0f, "one stream's items ran out of order (y[0] = %g)", h[0]);
    printf("  %-44s %s\n", "streams: missing wait -> stale, event -> ordered", failed ? "WRONG" : "as expected");
    cudaStreamDestroy(s1), cudaStreamDestroy(s2), cudaEventDestroy(ev);
    cudaFree(x), cudaFree(y);
}

static void test_launch_checks(void) {
    int *d = dev_ints(64);
    write_kernel<<<1, 1025>>>((float *)d, 0.0f, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "a block of 1025 threads was launched");
    write_kernel<<<dim3(1, 65536), 32>>>((float *)d, 0.0f, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "a grid.y of 65536 was launched");
    dyn_smem_kernel<<<1, 64, 64 * 1024>>>((float *)d, 16);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic shared memory without the attribute");
    CHECK(cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) ==
              cudaErrorInvalidValue, "an attribute of 228 KiB was taken");
    (void)cudaGetLastError();
    CHECK(cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess,
          "an attribute of 64 KiB was refused");
    dyn_smem_kernel<<<1, 64, 64 * 1024>>>((float *)d, 16384);
    CHECK(cudaGetLastError() == cudaSuccess, "64 KiB of dynamic shared memory with the attribute was refused");
    float h = 0;
    cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost);
    CHECK(h == 16383.0f, "dynamic shared memory gave %g", h);
    int x = 0;
    CHECK(cudaMemcpy(d, &x, 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidMemcpyDirection,
          "a copy of the wrong kind was taken");
    /* the table main wrote gives write_kernel 255 registers: 8 warps of 8192 fill the 65536, 16 do not */
    (void)cudaGetLastError(); /* the copy's error, which CUDA also keeps as the last one */
    write_kernel<<<1, 256>>>((float *)d, 0.0f, 1);
    CHECK(cudaGetLastError() == cudaSuccess, "255 registers x 256 threads were refused");
    write_kernel<<<1, 512>>>((float *)d, 0.0f, 1);
    CHECK(cudaGetLastError() == cudaErrorLaunchOutOfResources, "255 registers x 512 threads were launched");
    printf("  %-44s %s\n", "launch checks (block, grid, shared memory, registers, copy kind)",
           failed ? "WRONG" : "as on a GPU");
    cudaFree(d);
}

static void stop_partial(void) {
    int *d = dev_ints(64);
    partial_barrier_kernel<<<1, 64>>>(d);
    cudaDeviceSynchronize();
}
static void stop_two_barriers(void) {
    int *d = dev_ints(64);
    two_barriers_kernel<<<1, 64>>>(d);
    cudaDeviceSynchronize();
}
static void stop_lane_gone(void) {
    int *d = dev_ints(32);
    lane_gone_kernel<<<1, 32>>>(d);
    cudaDeviceSynchronize();
}
static void stop_host_pointer(void) {
    static float host[16];
    write_kernel<<<1, 32>>>(host, 1.0f, 16);
}
static void stop_freed_pointer(void) {
    float *d;
    cudaMalloc(&d, 64);
    cudaFree(d);
    write_kernel<<<1, 32>>>(d, 1.0f, 16);
}
static void stop_overflow(void) {
    float *x, *o;
    cudaMalloc(&x, 10 * 4), cudaMalloc(&o, 4);
    overflow_kernel<<<1, 32>>>(o, x, 10);
    cudaDeviceSynchronize();
}
static void stop_unwritten(void) {
    float *x, *o;
    cudaMalloc(&x, 10 * 4), cudaMalloc(&o, 4);
    cudaMemset(o, 0, 4);
    overflow_kernel<<<1, 32>>>(o, x, 3); /* x[3]: nothing wrote it */
    cudaDeviceSynchronize();
}
static void stop_shared_overflow(void) {
    int *d = dev_ints(1);
    shared_overflow_kernel<<<1, 32>>>(d, 0);
    cudaDeviceSynchronize();
}
static void stop_host_read(void) {
    float *x;
    cudaMalloc(&x, 64);
    cudaMemset(x, 0, 64);
    cudaDeviceSynchronize();
    volatile float v = x[3]; /* the host reads device memory */
    (void)v;
}

int main(void) {
    if (!getenv("SNUG_CUDA_EMU_DEVICES"))
        setenv("SNUG_CUDA_EMU_DEVICES", "1", 1);
    /* a kernel table of this file's own (the real build's is tests/cuda_emu/kernel_resources.tsv) */
    char table[] = "/tmp/test_emu_resources.XXXXXX";
    int fd = mkstemp(table);
    const char *rows = "arch\tkernel\tregs\tstack\tlocal\tsmem\tmangled\nsm_90\twrite_kernel\t255\t0\t0\t0\t-\n";
    if (fd < 0 || write(fd, rows, strlen(rows)) != (ssize_t)strlen(rows) || close(fd)) {
        fprintf(stderr, "test_emu: cannot write %s\n", table);
        return 1;
    }
    setenv("SNUG_CUDA_EMU_RESOURCES", table, 1);
    printf("the emulated CUDA runtime\n");
    test_shuffles();
    test_block();
    test_wmma();
    test_streams();
    test_launch_checks();
    expect_stop("__syncthreads after 32 of 64 threads return", stop_partial, "reached by 32 of the block's 64");
    expect_stop("__syncthreads at two lines", stop_two_barriers, "wait at different barriers");
    expect_stop("a shuffle a returned lane never reaches", stop_lane_gone, "which has returned");
    expect_stop("a host pointer given to a kernel", stop_host_pointer, "host memory the device cannot reach");
    expect_stop("a freed pointer given to a kernel", stop_freed_pointer, "already freed");
#if defined(__x86_64__)
    expect_stop("a kernel reading memory nothing wrote", stop_unwritten, "nothing has written");
#endif
#if defined(__SANITIZE_ADDRESS__)
    expect_stop("a kernel reading past its buffer", stop_overflow, "overflow_kernel");
    expect_stop("a kernel reading past its shared array", stop_shared_overflow, "shared_overflow_kernel");
    expect_stop("the host reading device memory", stop_host_read, "use-after-poison");
#else
    printf("  (no AddressSanitizer in this build: the three out-of-bounds cases are not run)\n");
#endif
    unlink(table);
    printf("test_emu: %d passed, %d failed\n", pass, failed);
    return failed ? 1 : 0;
}
