/* comm_nccl_sum.cu: the NCCL communicator's rank-order sum on the device (see comm_nccl.c): out <- ((all_0 + all_1) +
 * all_2) + ..., each element in the same order and with the same roundings as snug_comm_sum_in_order on the host, so
 * the deterministic collectives give the bits of the MPI ones. The additions are __fadd_rn / __dadd_rn: round to
 * nearest, never contracted with anything. */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

__device__ static inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ static inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ static inline int64_t add_rn(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

/* out (n) <- the rank-order sum of all (size, n) */
template <typename T>
__global__ void sum_in_order_kernel(T *out, const T *all, int size, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        T s = all[i];
        for (int r = 1; r < size; r++)
            s = add_rn(s, all[(size_t)r * n + i]);
        out[i] = s;
    }
}

/* dt: 0 float32, 1 float64, 2 int64 (snug_comm_dtype's values). Returns the launch's cudaError_t. */
extern "C" int snug_nccl_sum_in_order(void *out, const void *all, int size, size_t n, int dt, void *stream) {
    if (!n)
        return 0;
    size_t blocks = (n + 255) / 256;
    unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == 0)
        sum_in_order_kernel<float><<<grid, 256, 0, s>>>((float *)out, (const float *)all, size, n);
    else if (dt == 1)
        sum_in_order_kernel<double><<<grid, 256, 0, s>>>((double *)out, (const double *)all, size, n);
    else
        sum_in_order_kernel<int64_t><<<grid, 256, 0, s>>>((int64_t *)out, (const int64_t *)all, size, n);
    return (int)cudaGetLastError();
}
