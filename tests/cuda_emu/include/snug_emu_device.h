/* snug_emu_device.h: the device side of the emulated CUDA runtime, for .cu files compiled as host C++ after cu2cpp.
 *
 * Each CUDA thread of a block runs as a fiber of the host thread that runs the block (runtime.cpp); the built-in
 * variables read the running fiber's context. A barrier (__syncthreads, __syncthreads_or) parks the fiber until every
 * thread of the block waits at the same barrier; a warp operation (__syncwarp, the shuffles, the WMMA calls in mma.h)
 * parks it until every lane of its mask waits at the same call, and the last arrival computes every lane's result
 * at once, so no lane can see another's later values. A barrier or warp operation that some of its threads never
 * reach (they wait elsewhere or have returned) stops the run with the kernel's name and the lines involved. */
#ifndef SNUG_EMU_DEVICE_H
#define SNUG_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"
#include "snug_emu.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
/* cu2cpp rewrites every __shared__ declaration of a .cu file; one left here was not translated */
#define __shared__ __shared___outside_a_file_translated_by_cu2cpp

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace snug_emu {

/* The running CUDA thread: set by the block's scheduler before it switches to a fiber. */
struct thread_ctx {
    uint3 tid, bid;
    dim3 bdim, gdim;
    int lane, warp;
};
extern thread_ctx *cur;

void syncthreads(const char *file, int line);
int syncthreads_or(int pred, const char *file, int line);
void syncwarp(unsigned mask, const char *file, int line);

/* A warp operation: every lane of mask calls it at the same (file, line) with its own request; when the last one
 * arrives, complete(reqs, mask) runs once with reqs[lane] for each lane of the mask (NULL for the others). */
typedef void (*warp_complete_fn)(void *reqs[32], unsigned mask);
void warp_collective(unsigned mask, const char *what, const char *file, int line, void *req, warp_complete_fn fn);

/* Shared memory of the running block: the static array named `name` declared at `line` (made by the first thread to
 * reach it, then the same for every thread of the block), and the launch's dynamic shared memory. */
void *shared_alloc(size_t bytes, size_t align, const char *name, int line);
void *dynamic_shared(size_t align);

template <typename T> static inline T &shared(size_t align, const char *name, int line) {
    return *static_cast<T *>(shared_alloc(sizeof(T), align > alignof(T) ? align : alignof(T), name, line));
}

/* ------------------------------------------------------------------------------------------------ shuffles */
struct shfl_req {
    uint64_t val, result;
    int src;
};
void shfl_complete(void *reqs[32], unsigned mask);

enum { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };

template <typename T>
static inline T shfl(int kind, const char *what, const char *file, int line, unsigned mask, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle moves at most 8 bytes");
    if (width <= 0 || width > 32 || (width & (width - 1)))
        snug_emu_fatal("%s:%d: %s with width %d (a power of two up to 32)", file, line, what, width);
    shfl_req r = {0, 0, 0};
    memcpy(&r.val, &v, sizeof v);
    int lane = cur->lane, base = lane & ~(width - 1), in = lane & (width - 1);
    switch (kind) {
    case SHFL_IDX: r.src = base + (arg & (width - 1)); break;
    case SHFL_UP: r.src = in - arg < 0 ? lane : lane - arg; break;
    case SHFL_DOWN: r.src = in + arg >= width ? lane : lane + arg; break;
    default: r.src = (lane ^ arg) >= base + width ? lane : lane ^ arg; break;
    }
    warp_collective(mask, what, file, line, &r, shfl_complete);
    T out;
    memcpy(&out, &r.result, sizeof out);
    return out;
}

/* ------------------------------------------------------------------------------------------------ launches */
/* What one launch runs: the kernel's arguments, converted to its parameter types as a launch copies them. */
typedef void (*kernel_body_fn)(void *args);

struct launch_desc {
    const char *kernel; /* its name with template arguments, e.g. att_fwd_tiled<2, 64> */
    const void *func;   /* its address (cudaFuncSetAttribute's key) */
    const char *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};

/* Checks the launch and queues body(args) on the stream; frees args with free_args once run. Returns the launch's
 * error (CUDA's cudaGetLastError then gives it). */
cudaError_t launch_kernel(const launch_desc *d, kernel_body_fn body, void *args, void (*free_args)(void *),
                          const void *const *ptrs, const char *const *ptr_names, int nptrs);

/* The kernel's name from the compiler's spelling of launcher<K>::run (K = name<template args>). */
const char *kernel_name(const char *pretty);

template <auto K> struct launcher {
    launch_desc d;

    template <typename... P> struct call;
    template <typename... P> struct call<void (*)(P...)> {
        typedef std::tuple<typename std::decay<P>::type...> args_t;
        static void body(void *a) { std::apply(K, *static_cast<args_t *>(a)); }
        static void del(void *a) { delete static_cast<args_t *>(a); }
    };

    template <typename T> static void collect(const T &v, const void **ptrs, int &n) {
        if constexpr (std::is_pointer<T>::value)
            ptrs[n++] = (const void *)v;
    }

    template <typename... A> void operator()(A &&...a) {
        typedef call<decltype(K)> c;
        static const char *name = kernel_name(__PRETTY_FUNCTION__);
        d.kernel = name;
        d.func = (const void *)K;
        auto *args = new typename c::args_t(std::forward<A>(a)...);
        const void *ptrs[64];
        int n = 0;
        std::apply([&](const auto &...v) { (collect(v, ptrs, n), ...); }, *args);
        launch_kernel(&d, c::body, args, c::del, ptrs, nullptr, n);
    }
};

template <auto K>
static inline launcher<K> launch(const char *file, int line, dim3 grid, dim3 block, size_t smem = 0,
                                 cudaStream_t stream = 0) {
    launcher<K> l;
    l.d = launch_desc{nullptr, nullptr, file, line, grid, block, smem, stream};
    return l;
}

} // namespace snug_emu

#define threadIdx (::snug_emu::cur->tid)
#define blockIdx (::snug_emu::cur->bid)
#define blockDim (::snug_emu::cur->bdim)
#define gridDim (::snug_emu::cur->gdim)
static constexpr int warpSize = 32;

#define __syncthreads() ::snug_emu::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(pred) ::snug_emu::syncthreads_or((pred), __FILE__, __LINE__)
#define __syncwarp(...) ::snug_emu::syncwarp_at{__FILE__, __LINE__}(__VA_ARGS__)
#define __shfl_sync(...) ::snug_emu::shfl_at(::snug_emu::SHFL_IDX, "__shfl_sync", __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::snug_emu::shfl_at(::snug_emu::SHFL_UP, "__shfl_up_sync", __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...)                                                                                         \
    ::snug_emu::shfl_at(::snug_emu::SHFL_DOWN, "__shfl_down_sync", __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...)                                                                                          \
    ::snug_emu::shfl_at(::snug_emu::SHFL_XOR, "__shfl_xor_sync", __FILE__, __LINE__, __VA_ARGS__)
namespace snug_emu {
struct syncwarp_at {
    const char *file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { syncwarp(mask, file, line); }
};
template <typename T>
static inline T shfl_at(int kind, const char *what, const char *file, int line, unsigned mask, T v, int arg,
                        int width = 32) {
    return shfl(kind, what, file, line, mask, v, arg, width);
}
} // namespace snug_emu

/* ------------------------------------------------------------------------------------------------ intrinsics */
/* The host's IEEE arithmetic in round-to-nearest; the emulated files are compiled with -ffp-contract=off, so a
 * product is never fused into a sum unless the source asks (fmaf, __fmaf_rn). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
static inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned int u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline int __float_as_int(float f) {
    int u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __int_as_float(int u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline long long __double_as_longlong(double d) {
    long long u;
    memcpy(&u, &d, sizeof u);
    return u;
}
static inline double __longlong_as_double(long long u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
/* the device library's min and max */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }

#endif
