/* mma.h (emulated CUDA): the WMMA API at the one shape snug uses, 16 x 16 x 16 with bf16 (or fp16 bits) inputs and
 * fp32 accumulators. Each lane holds 8 elements of a fragment, placed as the m16n8k16 tensor-core instruction places
 * them (lane = 4 g + t: rows g and g + 8, columns 2t, 2t + 1 and the same + 8; B transposed), so code that finds an
 * element's position by loading a table of positions (as attention_tc does) sees a real layout, not a trivial one.
 * load, store and mma are warp operations: every lane calls them with the same pointer and stride (checked), and the
 * last lane to arrive does the work for all. The product sums the 16 exact products of each output in fp32, k in
 * order, then adds C: a tensor core's internal order and rounding differ (see tests/cuda_emu/README.md). Pointers
 * must be 32-byte aligned and strides a multiple of 16 bytes, as the GPU requires. */
#ifndef SNUG_EMU_MMA_H
#define SNUG_EMU_MMA_H

#include "cuda_bf16.h"
#include "snug_emu_device.h"

namespace nvcuda {
namespace wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };

template <typename T> struct storage { typedef T type; };
template <> struct storage<__nv_bfloat16> { typedef __nv_bfloat16 type; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulated WMMA has the 16 x 16 x 16 shape only");
    enum { num_elements = 8 };
    typename storage<T>::type x[8];
};

} // namespace wmma
} // namespace nvcuda

namespace snug_emu {
namespace wmma_impl {

/* (row, col) of element i of `lane`'s fragment: A and C/D row-wise, B (k, n) the transpose */
static inline void pos(int is_b, int lane, int i, int *r, int *c) {
    int g = lane >> 2, t = lane & 3;
    int rr = g + ((i >> 1) & 1) * 8, cc = 2 * t + (i & 1) + (i >> 2) * 8;
    if (is_b) {
        *r = cc;
        *c = rr;
    } else {
        *r = rr;
        *c = cc;
    }
}

enum { KIND_BF16, KIND_F32 };
struct req {
    int op;          /* 0 load, 1 store, 2 mma */
    int kind;        /* element type of the fragment (load, store) */
    int is_b;        /* a matrix_b fragment */
    int col_major;   /* memory layout */
    const void *ptr; /* load: source; store: destination */
    unsigned ldm;
    void *frag;      /* load, store: the fragment; mma: d */
    const void *a, *b, *c;
};

static inline float elem_f(const void *frag, int kind, int i) {
    if (kind == KIND_F32)
        return ((const float *)frag)[i];
    return __bfloat162float(((const __nv_bfloat16 *)frag)[i]);
}

void complete(void *reqs[32], unsigned mask);
void check_ptr(const char *what, const void *p, unsigned ldm, size_t esize, const char *file, int line);

} // namespace wmma_impl
} // namespace snug_emu

namespace nvcuda {
namespace wmma {

template <typename Use, typename T, typename L> static inline int is_b_(const fragment<Use, 16, 16, 16, T, L> &) {
    return std::is_same<Use, matrix_b>::value;
}

template <typename Use, typename T, typename L, typename P>
static inline void load_at(const char *file, int line, fragment<Use, 16, 16, 16, T, L> &f, const P *p, unsigned ldm,
                           int col_major) {
    snug_emu::wmma_impl::check_ptr("wmma::load_matrix_sync", p, ldm, sizeof(P), file, line);
    snug_emu::wmma_impl::req r = {};
    r.op = 0;
    r.kind = sizeof(typename storage<T>::type) == 4 ? snug_emu::wmma_impl::KIND_F32 : snug_emu::wmma_impl::KIND_BF16;
    r.is_b = std::is_same<Use, matrix_b>::value;
    r.col_major = col_major;
    r.ptr = p;
    r.ldm = ldm;
    r.frag = f.x;
    snug_emu::warp_collective(0xffffffffu, "wmma::load_matrix_sync", file, line, &r, snug_emu::wmma_impl::complete);
}
template <typename Use, typename T, typename L, typename P>
static inline void load_matrix_sync_at(const char *file, int line, fragment<Use, 16, 16, 16, T, L> &f, const P *p,
                                       unsigned ldm) {
    load_at(file, line, f, p, ldm, std::is_same<L, col_major>::value);
}
template <typename T, typename P>
static inline void load_matrix_sync_at(const char *file, int line, fragment<accumulator, 16, 16, 16, T, void> &f,
                                       const P *p, unsigned ldm, layout_t layout) {
    load_at(file, line, f, p, ldm, layout == mem_col_major);
}
template <typename T>
static inline void store_matrix_sync_at(const char *file, int line, T *p,
                                        const fragment<accumulator, 16, 16, 16, T, void> &f, unsigned ldm,
                                        layout_t layout) {
    snug_emu::wmma_impl::check_ptr("wmma::store_matrix_sync", p, ldm, sizeof(T), file, line);
    snug_emu::wmma_impl::req r = {};
    r.op = 1;
    r.kind = snug_emu::wmma_impl::KIND_F32;
    r.col_major = layout == mem_col_major;
    r.ptr = p;
    r.ldm = ldm;
    r.frag = (void *)f.x;
    snug_emu::warp_collective(0xffffffffu, "wmma::store_matrix_sync", file, line, &r, snug_emu::wmma_impl::complete);
}
template <typename TA, typename LA, typename TB, typename LB>
static inline void mma_sync_at(const char *file, int line, fragment<accumulator, 16, 16, 16, float, void> &d,
                               const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
                               const fragment<matrix_b, 16, 16, 16, TB, LB> &b,
                               const fragment<accumulator, 16, 16, 16, float, void> &c) {
    static_assert(sizeof(typename storage<TA>::type) == 2 && sizeof(typename storage<TB>::type) == 2,
                  "the emulated WMMA multiplies 16-bit inputs");
    snug_emu::wmma_impl::req r = {};
    r.op = 2;
    r.frag = d.x;
    r.a = a.x;
    r.b = b.x;
    r.c = c.x;
    snug_emu::warp_collective(0xffffffffu, "wmma::mma_sync", file, line, &r, snug_emu::wmma_impl::complete);
}
template <typename Use, typename T, typename L, typename V>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, V v) {
    for (int i = 0; i < 8; i++)
        f.x[i] = (typename storage<T>::type)v;
}

} // namespace wmma
} // namespace nvcuda

#define load_matrix_sync(...) load_matrix_sync_at(__FILE__, __LINE__, __VA_ARGS__)
#define store_matrix_sync(...) store_matrix_sync_at(__FILE__, __LINE__, __VA_ARGS__)
#define mma_sync(...) mma_sync_at(__FILE__, __LINE__, __VA_ARGS__)

#endif
