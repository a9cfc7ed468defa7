/* dnnl_cpu.c: oneDNN's matmul primitive behind a row-major GEMM (see dnnl_cpu.h).
 *
 * Written against oneDNN's 2.x C API (Debian 12 ships 2.6.3), whose header gives the types; every function is looked
 * up with dlsym from the library opened at run time. One problem (transposes, M, N, K, ldc, alpha, beta) is one
 * primitive, created once and kept in a small cache: oneDNN's fast matmul kernels are generated for fixed shapes.
 *
 * C = alpha * op(A) op(B) + beta * C maps onto the primitive as: src (M,K) and weights (K,N) dense, strides {K,1} or,
 * transposed, {1,M} (and {N,1} or {1,K}); dst (M,N) with strides {ldc,1}, fp32; alpha an output scale; beta a sum
 * post-op (dst = alpha * src @ weights + beta * dst; none when beta is 0, so C is then never read). A block of the
 * K sum after the first adds onto C with beta 1. Scratchpads are the caller's (dnnl_scratchpad_mode_user): one
 * buffer per context, grown to the largest primitive's need.
 *
 * A problem oneDNN can only run with its reference code (ref:any, orders of magnitude slower than OpenBLAS) or not
 * at all (bf16 before AVX-512) is refused, and the refusal cached, so the caller falls back at no further cost. */
#include "backend/cpu/dnnl_cpu.h"

#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops_cpu.h"

static char dnnl_err[512];
const char *snug_dnnl_error(void) { return dnnl_err; }

#ifndef SNUG_HAVE_DNNL

int snug_dnnl_load(void) {
    snprintf(dnnl_err, sizeof dnnl_err, "this snug was built without oneDNN (install libdnnl-dev, scripts/setup.sh, "
             "and configure again)");
    return -1;
}
const char *snug_dnnl_version(void) { return ""; }
snug_dnnl *snug_dnnl_create(snug_dtype dt, int nthreads) {
    (void)dt, (void)nthreads;
    snug_dnnl_load();
    return NULL;
}
void snug_dnnl_destroy(snug_dnnl *d) { (void)d; }
void snug_dnnl_set_operand_bytes(snug_dnnl *d, size_t bytes) { (void)d, (void)bytes; }
int snug_dnnl_gemm(snug_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    return -1;
}
int snug_dnnl_gemm_ex(snug_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const void *A, snug_dtype adt,
                      int lda, const void *B, snug_dtype bdt, int ldb, float beta, float *C, int ldc) {
    return -1;
}
const char *snug_dnnl_impl(snug_dnnl *d, int ta, int tb, int M, int N, int K) { return NULL; }
size_t snug_dnnl_bytes(const snug_dnnl *d) { return 0; }

#else

#include <oneapi/dnnl/dnnl.h>

#ifndef SNUG_DNNL_PATH
#define SNUG_DNNL_PATH "libdnnl.so.2"
#endif

/* the functions used, each looked up by its own name */
#define DNNL_FUNCS(X)                                                                                              \
    X(dnnl_version) X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_stream_destroy) X(dnnl_stream_wait)          \
    X(dnnl_memory_desc_init_by_strides) X(dnnl_memory_desc_get_size) X(dnnl_matmul_desc_init)                      \
    X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy) X(dnnl_primitive_attr_set_scratchpad_mode)        \
    X(dnnl_primitive_attr_set_output_scales) X(dnnl_primitive_attr_set_post_ops) X(dnnl_post_ops_create)           \
    X(dnnl_post_ops_destroy) X(dnnl_post_ops_append_sum) X(dnnl_primitive_desc_create)                             \
    X(dnnl_primitive_desc_destroy) X(dnnl_primitive_desc_query) X(dnnl_primitive_desc_query_md)                    \
    X(dnnl_primitive_create) X(dnnl_primitive_destroy) X(dnnl_primitive_execute) X(dnnl_memory_create)             \
    X(dnnl_memory_destroy) X(dnnl_memory_set_data_handle)

static struct {
    int tried, ok;
    dnnl_engine_t engine;
    char version[32];
#define X(f) __typeof__(f) *f;
    DNNL_FUNCS(X)
#undef X
} dl;

int snug_dnnl_load(void) {
    if (dl.tried)
        return dl.ok ? 0 : -1;
    dl.tried = 1;
    const char *env = getenv("SNUG_DNNL");
    const char *cands[3] = {env && *env ? env : NULL, SNUG_DNNL_PATH, "libdnnl.so.2"};
    void *h = NULL;
    char why[400] = "";
    for (int i = 0; i < 3 && !h; i++) {
        if (!cands[i])
            continue;
        h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && !why[0])
            snprintf(why, sizeof why, "%s", dlerror());
        if (!h && i == 0) /* a path the user named must be the one used */
            break;
    }
    if (!h) {
        snprintf(dnnl_err, sizeof dnnl_err, "cannot open oneDNN (%s); install Debian's libdnnl2 (scripts/setup.sh) "
                 "or point SNUG_DNNL at a libdnnl.so.2", why);
        return -1;
    }
#define X(f)                                                                                                       \
    if (!(dl.f = (__typeof__(f) *)dlsym(h, #f))) {                                                                 \
        snprintf(dnnl_err, sizeof dnnl_err, "the oneDNN library opened has no %s (snug needs oneDNN 2.x)", #f);     \
        dlclose(h);                                                                                                \
        return -1;                                                                                                 \
    }
    DNNL_FUNCS(X)
#undef X
    const dnnl_version_t *v = dl.dnnl_version();
    if (v->major != 2) {
        snprintf(dnnl_err, sizeof dnnl_err, "oneDNN %d.%d.%d was opened; snug's bf16 path needs oneDNN 2.x",
                 v->major, v->minor, v->patch);
        dlclose(h);
        return -1;
    }
    if (dl.dnnl_engine_create(&dl.engine, dnnl_cpu, 0) != dnnl_success) {
        snprintf(dnnl_err, sizeof dnnl_err, "oneDNN cannot create its CPU engine");
        dlclose(h);
        return -1;
    }
    snprintf(dl.version, sizeof dl.version, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
    dl.ok = 1;
    return 0;
}

const char *snug_dnnl_version(void) { return dl.version; }

/* One problem's primitive and its memory objects (handles set at each call), or a cached refusal (prim NULL). */
typedef struct {
    int ta, tb, M, N, K, ldc;
    float alpha, beta;
    unsigned long long used; /* last use, for eviction */
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst, pad;
    size_t pad_bytes;
    char impl[64];
} entry;

/* Problems kept; a miss costs a primitive descriptor (tens of microseconds), not a new kernel: oneDNN keeps the
 * generated code of its last 1024 primitives itself. */
#define CACHE 64

struct snug_dnnl {
    snug_dtype dt;
    dnnl_data_type_t ddt;
    size_t esize, cap; /* operand element size; bound on the operand copies in bytes */
    int nthreads;
    dnnl_stream_t stream;
    entry cache[CACHE];
    int n;
    unsigned long long clock;
    void *ops, *pad; /* operand copies (ops_bytes), scratchpad (pad_bytes) */
    size_t ops_bytes, pad_bytes;
};

snug_dnnl *snug_dnnl_create(snug_dtype dt, int nthreads) {
    if (snug_dnnl_load())
        return NULL;
    snug_dnnl *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->dt = dt == SNUG_DT_BF16 ? SNUG_DT_BF16 : SNUG_DT_F32;
    d->ddt = d->dt == SNUG_DT_BF16 ? dnnl_bf16 : dnnl_f32;
    d->esize = d->dt == SNUG_DT_BF16 ? 2 : 4;
    d->cap = SNUG_DNNL_OPERAND_BYTES;
    d->nthreads = nthreads > 0 ? nthreads : 1;
    if (dl.dnnl_stream_create(&d->stream, dl.engine, dnnl_stream_default_flags) != dnnl_success) {
        snprintf(dnnl_err, sizeof dnnl_err, "oneDNN cannot create a CPU stream");
        free(d);
        return NULL;
    }
    return d;
}

/* destroys what e holds; its key stays */
static void entry_release(entry *e) {
    if (e->prim)
        dl.dnnl_primitive_destroy(e->prim);
    dnnl_memory_t *m[4] = {&e->src, &e->wei, &e->dst, &e->pad};
    for (int i = 0; i < 4; i++)
        if (*m[i])
            dl.dnnl_memory_destroy(*m[i]);
    e->prim = NULL, e->src = e->wei = e->dst = e->pad = NULL, e->pad_bytes = 0;
}

void snug_dnnl_destroy(snug_dnnl *d) {
    if (!d)
        return;
    for (int i = 0; i < d->n; i++)
        entry_release(&d->cache[i]);
    dl.dnnl_stream_destroy(d->stream);
    free(d->ops), free(d->pad);
    free(d);
}

void snug_dnnl_set_operand_bytes(snug_dnnl *d, size_t bytes) { d->cap = bytes ? bytes : SNUG_DNNL_OPERAND_BYTES; }

size_t snug_dnnl_bytes(const snug_dnnl *d) { return d ? d->ops_bytes + d->pad_bytes : 0; }

/* Builds the primitive of one problem into e (key fields set); on refusal e->prim stays NULL and e->impl says why. */
static void entry_make(snug_dnnl *d, entry *e) {
    int M = e->M, N = e->N, K = e->K;
    dnnl_memory_desc_t smd, wmd, dmd;
    dnnl_dims_t sdims = {M, K}, wdims = {K, N}, ddims = {M, N};
    dnnl_dims_t sst = {e->ta ? 1 : K, e->ta ? M : 1}, wst = {e->tb ? 1 : N, e->tb ? K : 1}, dst = {e->ldc, 1};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t mm;
    const char *impl = NULL;
    dnnl_status_t st = dl.dnnl_memory_desc_init_by_strides(&smd, 2, sdims, d->ddt, sst);
    if (st == dnnl_success)
        st = dl.dnnl_memory_desc_init_by_strides(&wmd, 2, wdims, d->ddt, wst);
    if (st == dnnl_success)
        st = dl.dnnl_memory_desc_init_by_strides(&dmd, 2, ddims, dnnl_f32, dst);
    if (st == dnnl_success)
        st = dl.dnnl_matmul_desc_init(&mm, &smd, &wmd, NULL, &dmd);
    if (st == dnnl_success)
        st = dl.dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success)
        st = dl.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success && e->alpha != 1.0f)
        st = dl.dnnl_primitive_attr_set_output_scales(attr, 1, 0, &e->alpha);
    if (st == dnnl_success && e->beta != 0.0f) {
        st = dl.dnnl_post_ops_create(&po);
        if (st == dnnl_success)
            st = dl.dnnl_post_ops_append_sum(po, e->beta);
        if (st == dnnl_success)
            st = dl.dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (st == dnnl_success)
        st = dl.dnnl_primitive_desc_create(&pd, &mm, attr, dl.engine, NULL);
    if (st == dnnl_success && dl.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
        impl)
        snprintf(e->impl, sizeof e->impl, "%s", impl);
    if (st != dnnl_success) {
        snprintf(e->impl, sizeof e->impl, st == dnnl_unimplemented ? "unimplemented" : "error %d", (int)st);
    } else if (!strncmp(e->impl, "ref", 3)) {
        st = dnnl_unimplemented; /* reference code only: refused */
    } else {
        const dnnl_memory_desc_t *pmd = dl.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->pad_bytes = pmd ? dl.dnnl_memory_desc_get_size(pmd) : 0;
        st = dl.dnnl_primitive_create(&e->prim, pd);
        if (st == dnnl_success)
            st = dl.dnnl_memory_create(&e->src, &smd, dl.engine, DNNL_MEMORY_NONE);
        if (st == dnnl_success)
            st = dl.dnnl_memory_create(&e->wei, &wmd, dl.engine, DNNL_MEMORY_NONE);
        if (st == dnnl_success)
            st = dl.dnnl_memory_create(&e->dst, &dmd, dl.engine, DNNL_MEMORY_NONE);
        if (st == dnnl_success && e->pad_bytes)
            st = dl.dnnl_memory_create(&e->pad, pmd, dl.engine, DNNL_MEMORY_NONE);
        if (st != dnnl_success) {
            entry_release(e);
            snprintf(e->impl, sizeof e->impl, "error %d creating it", (int)st);
        }
    }
    if (pd)
        dl.dnnl_primitive_desc_destroy(pd);
    if (po)
        dl.dnnl_post_ops_destroy(po);
    if (attr)
        dl.dnnl_primitive_attr_destroy(attr);
}

/* The cached entry of a problem, made on a miss (evicting the least recently used when the cache is full). */
static entry *lookup(snug_dnnl *d, int ta, int tb, int M, int N, int K, int ldc, float alpha, float beta) {
    d->clock++;
    entry *e = NULL;
    for (int i = 0; i < d->n && !e; i++) {
        entry *c = &d->cache[i];
        if (c->ta == ta && c->tb == tb && c->M == M && c->N == N && c->K == K && c->ldc == ldc &&
            c->alpha == alpha && c->beta == beta)
            e = c;
    }
    if (!e) {
        if (d->n < CACHE) {
            e = &d->cache[d->n++];
        } else {
            e = &d->cache[0];
            for (int i = 1; i < CACHE; i++)
                if (d->cache[i].used < e->used)
                    e = &d->cache[i];
            entry_release(e);
        }
        *e = (entry){.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .ldc = ldc, .alpha = alpha, .beta = beta};
        omp_set_num_threads(d->nthreads); /* oneDNN sizes its blocking by the thread count when it is created */
        entry_make(d, e);
    }
    e->used = d->clock;
    return e;
}

static const char *dt_name(const snug_dnnl *d) { return d->dt == SNUG_DT_BF16 ? "bf16" : "f32"; }

static void refused(const snug_dnnl *d, const entry *e) {
    snprintf(dnnl_err, sizeof dnnl_err, "%s has no fast %s matmul for %dx%dx%d on this CPU (%s)", dl.version,
             dt_name(d), e->M, e->N, e->K, e->impl);
}

const char *snug_dnnl_impl(snug_dnnl *d, int ta, int tb, int M, int N, int K) {
    entry *e = lookup(d, ta ? 1 : 0, tb ? 1 : 0, M, N, K, N, 1.0f, 0.0f);
    if (!e->prim) {
        refused(d, e);
        return NULL;
    }
    return e->impl;
}

/* Block sizes for the operand bound: op(A) blocks (mb, kb) and op(B) blocks (kb, nb) together within cap elements.
 * K stays whole while panels of 64 rows and columns fit; a matrix that fits in half the bound is one block and the
 * other gets the rest; a block is a multiple of 64 unless it is the whole. */
static void blocks(size_t cap, int M, int N, int K, int *mb, int *nb, int *kb) {
    size_t pm = M < 64 ? (size_t)M : 64, pn = N < 64 ? (size_t)N : 64, k = (size_t)K;
    if (k * (pm + pn) > cap) {
        k = cap / (pm + pn);
        k = k > 64 ? k / 64 * 64 : k ? k : 1;
    }
    size_t per = cap / k, m, n; /* rows of op(A) plus columns of op(B) that fit beside K = k */
    if ((size_t)M + N <= per)
        m = M, n = N;
    else if ((size_t)N <= per / 2)
        n = N, m = per - N;
    else if ((size_t)M <= per / 2)
        m = M, n = per - M;
    else
        m = n = per / 2;
    m = m < (size_t)M ? (m > 64 ? m / 64 * 64 : m ? m : 1) : (size_t)M;
    n = n < (size_t)N ? (n > 64 ? n / 64 * 64 : n ? n : 1) : (size_t)N;
    *mb = (int)m, *nb = (int)n, *kb = (int)k;
}

/* dst (rows, cols) dense, from rows of src (stored as sdt) with leading dimension ld, converted to the context's
 * dtype: fp32 rounded to bf16, bf16 copied, 16-bit widened for an f32 context (fp16 into bf16: widened, then rounded) */
static void pack(snug_dnnl *d, void *dst, const void *src, snug_dtype sdt, int rows, int cols, int ld) {
    size_t es = snug_dtype_size(sdt);
#pragma omp parallel for num_threads(d->nthreads) if ((size_t)rows * cols >= SNUG_CPU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const void *s = (const char *)src + (size_t)r * ld * es;
        if (d->dt == SNUG_DT_F32) {
            snug_cpu_row_to_f32((float *)dst + (size_t)r * cols, s, sdt, (size_t)cols);
        } else if (sdt == SNUG_DT_F32) {
            snug_cpu_row_to_bf16((uint16_t *)dst + (size_t)r * cols, s, (size_t)cols);
        } else if (sdt == SNUG_DT_BF16) {
            memcpy((uint16_t *)dst + (size_t)r * cols, s, (size_t)cols * 2);
        } else {
            float wide[256];
            for (int c0 = 0; c0 < cols; c0 += 256) {
                int n = cols - c0 < 256 ? cols - c0 : 256;
                snug_cpu_row_to_f32(wide, (const uint16_t *)s + c0, sdt, (size_t)n);
                snug_cpu_row_to_bf16((uint16_t *)dst + (size_t)r * cols + c0, wide, (size_t)n);
            }
        }
    }
}

static int grow(void **buf, size_t *have, size_t need) {
    if (need <= *have)
        return 0;
    void *p = aligned_alloc(64, (need + 63) / 64 * 64);
    if (!p)
        return -1;
    free(*buf);
    *buf = p, *have = need;
    return 0;
}

int snug_dnnl_gemm(snug_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    return snug_dnnl_gemm_ex(d, ta, tb, M, N, K, alpha, A, SNUG_DT_F32, lda, B, SNUG_DT_F32, ldb, beta, C, ldc);
}

int snug_dnnl_gemm_ex(snug_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const void *A, snug_dtype adt,
                      int lda, const void *B, snug_dtype bdt, int ldb, float beta, float *C, int ldc) {
    if (!d || M <= 0 || N <= 0 || K <= 0)
        return -1;
    ta = ta ? 1 : 0, tb = tb ? 1 : 0;
    int mb, nb, kb;
    blocks(d->cap / d->esize, M, N, K, &mb, &nb, &kb);
    /* every block's primitive first, so that a refusal leaves C untouched */
    size_t pad = 0;
    for (int m0 = 0; m0 < M; m0 += mb)
        for (int n0 = 0; n0 < N; n0 += nb)
            for (int k0 = 0; k0 < K; k0 += kb) {
                int mc = M - m0 < mb ? M - m0 : mb, nc = N - n0 < nb ? N - n0 : nb, kc = K - k0 < kb ? K - k0 : kb;
                entry *e = lookup(d, ta, tb, mc, nc, kc, ldc, alpha, k0 ? 1.0f : beta);
                if (!e->prim) {
                    refused(d, e);
                    return -1;
                }
                pad = e->pad_bytes > pad ? e->pad_bytes : pad;
            }
    /* an operand of the context's dtype that is one dense block is read in place; the others are copied */
    int whole_k = kb == K, one_n = nb == N; /* then op(A)'s block, or op(B) whole, is copied once */
    int a_here = adt == d->dt && mb == M && whole_k && lda == (ta ? M : K);
    int b_here = bdt == d->dt && one_n && whole_k && ldb == (tb ? K : N);
    size_t abytes = a_here ? 0 : (size_t)mb * kb * d->esize, bbytes = b_here ? 0 : (size_t)kb * nb * d->esize;
    if (grow(&d->ops, &d->ops_bytes, abytes + bbytes) || grow(&d->pad, &d->pad_bytes, pad)) {
        snprintf(dnnl_err, sizeof dnnl_err, "out of memory for the %s GEMM's operand copies", dt_name(d));
        return -1;
    }
    size_t aes = snug_dtype_size(adt), bes = snug_dtype_size(bdt);
    const char *Ab = A, *Bb = B;
    char *pa = a_here ? (char *)A : d->ops, *pb = b_here ? (char *)B : (char *)d->ops + abytes;
    for (int m0 = 0; m0 < M; m0 += mb) {
        int mc = M - m0 < mb ? M - m0 : mb;
        for (int n0 = 0; n0 < N; n0 += nb) {
            int nc = N - n0 < nb ? N - n0 : nb;
            for (int k0 = 0; k0 < K; k0 += kb) {
                int kc = K - k0 < kb ? K - k0 : kb;
                /* op(A)[m0:, k0:] is stored rows m0.. (columns k0..) or, transposed, rows k0.. (columns m0..) */
                if (!a_here && (!whole_k || n0 == 0)) {
                    if (ta)
                        pack(d, pa, Ab + ((size_t)k0 * lda + m0) * aes, adt, kc, mc, lda);
                    else
                        pack(d, pa, Ab + ((size_t)m0 * lda + k0) * aes, adt, mc, kc, lda);
                }
                if (!b_here && (!whole_k || !one_n || m0 == 0)) {
                    if (tb)
                        pack(d, pb, Bb + ((size_t)n0 * ldb + k0) * bes, bdt, nc, kc, ldb);
                    else
                        pack(d, pb, Bb + ((size_t)k0 * ldb + n0) * bes, bdt, kc, nc, ldb);
                }
                entry *e = lookup(d, ta, tb, mc, nc, kc, ldc, alpha, k0 ? 1.0f : beta);
                dl.dnnl_memory_set_data_handle(e->src, pa);
                dl.dnnl_memory_set_data_handle(e->wei, pb);
                dl.dnnl_memory_set_data_handle(e->dst, C + (size_t)m0 * ldc + n0);
                dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->wei},
                                           {DNNL_ARG_DST, e->dst}, {DNNL_ARG_SCRATCHPAD, e->pad}};
                if (e->pad)
                    dl.dnnl_memory_set_data_handle(e->pad, d->pad);
                omp_set_num_threads(d->nthreads);
                if (dl.dnnl_primitive_execute(e->prim, d->stream, e->pad ? 4 : 3, args) != dnnl_success ||
                    dl.dnnl_stream_wait(d->stream) != dnnl_success) {
                    /* not expected once created; C may be partly written, so this is reported, never hidden */
                    snprintf(dnnl_err, sizeof dnnl_err, "%s matmul %dx%dx%d failed to execute", dl.version, mc, nc,
                             kc);
                    return -2;
                }
            }
        }
    }
    return 0;
}

#endif
