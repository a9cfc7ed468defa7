/* quant4.c: bitsandbytes' NF4/FP4 weight quantization, byte for byte (see quant4.h).
 *
 * What bitsandbytes 0.50 runs on a CPU, rule by rule (tests/parity/test_quant4_parity.py checks each against it):
 *
 * 4-bit codes (quantize_4bit -> the torch op of backends/default/ops.py; the CPU backend registers none):
 *   - the input is widened to fp32 first (a bf16/fp16 weight quantizes exactly like its fp32 widening);
 *   - a full block: absmax = max |x| (stored as it is, 0 for a block of zeros); y = clamp(x * (1 / max(absmax,
 *     1e-38f)), -1, 1): the reciprocal once, then a product;
 *   - the short last block (n % blocksize != 0): absmax = max(max |x|, 1e-38f) is what is stored (so a short block
 *     of zeros stores 1e-38, not 0) and y = clamp(x / absmax, -1, 1): a true division, not the reciprocal;
 *   - the code: torch.bucketize(y, bounds) = how many bounds are < y (a value on a bound goes to the lower code),
 *     bounds = the fp32 midpoints (a + b) / 2 of the code book sorted by value. NF4 is sorted, so the bucket is the
 *     code. FP4 has two codes for zero (0 and 8, both +0 in get_4bit_type) and maps the bucket back through
 *     torch.argsort of its table, which ranks code 0 first: y in [-1/384, 0] gets code 0 and y in (0, 1/384] code 8,
 *     which the native dequantizer's own table reads as -0 (see snug_q4_dequantize);
 *   - an odd n pads with y = 0: NF4 code 7, FP4 code 0.
 * bitsandbytes' CUDA kernel differs (kernels.cu: the reciprocal for the short block too, NaN codes for zero blocks):
 * bytes differ there, values do not.
 *
 * Double quantization (quantize_4bit with compress_statistics=True):
 *   - nested_offset = absmax.mean(): torch's CPU mean, a cascade sum in fp32 whose order depends on the vector width
 *     and, from 32768 blocks on, on torch's thread count (snug_q4_torch_mean);
 *   - d = absmax - offset (fp32), then quantize_blockwise(d, blocksize=256) with the signed dynamic map, which on a
 *     CPU is the native kernel of libbitsandbytes_cpu (read from its machine code; there is no source for it in the
 *     wheel): per 256 values m = max |d|, stored as nested_absmax; m == 0 gives code 0 for the whole block; else
 *     y = clamp(d * (1 / m), -1, 1) and code = lut[(int)fma(65535, (y + 1) * 0.5, 0.5)] from a 65536-entry table:
 *     lut[i] = how many map midpoints (c[k] + c[k+1]) * 0.5 are < 2i / 65535 - 1. This is not the nearest code:
 *     the table's step (3.05e-5) is coarser than the map near 0, so |y| < 3e-5 collapses onto few codes.
 *
 * Dequantization (CPU kernels dequantizeBlockwise8bitCpu, dequantizeBlockwise4bitCpu, or the torch fallback for an
 * odd last dimension, which computes the same): absmax = map[q] * nested_absmax then + offset (two fp32 roundings,
 * never fused); w = code * absmax in fp32. The two roundings are written as separate statements: ISO C (-std=c11)
 * makes GCC contract none, and clang contracts only within one expression.
 *
 * 8 bits (SNUG_Q4_INT8; Int8Params._quantize -> int8_vectorwise_quant with threshold 0, the default op):
 *   - the weight is cast to fp16 first (to nearest even; a value past fp16's range would be infinite there and is
 *     refused);
 *   - SCB = max |w16| over the row, widened to fp32;
 *   - y = w16 * ((1 / SCB) * 127) in fp32: torch computes 127.0 / SCB as SCB.reciprocal() * 127, two roundings;
 *   - code = torch.round(y) (half to even) as int8. A row of zeros stores SCB 0 and codes 0 (bitsandbytes' 0 * inf
 *     is NaN there, whose int8 cast torch leaves undefined; any code times SCB 0 dequantizes to 0 all the same).
 * Dequantizing follows MatMul8bitFp, what bitsandbytes trains with on a CPU: CB.to(dtype) * (SCB * (1 / 127)), the
 * factor a fp32 product with (float)(1/127); int8_vectorwise_dequant's (CB * SCB) * (1 / 127) rounds differently
 * and is not what training reads. */
#include "model/quant4.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/json_util.h"
#include "core/quant_map.h"

/* ---------------------------------------------------------------------------------------------------------------- */
/* Code books */

/* get_4bit_type("nf4"): the decimals are the float32 values themselves */
static const float nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f,
};

/* get_4bit_type("fp4"): the raw table divided by its largest magnitude in float32. Code 8 is +0: the Python list
 * spells it -0, which is the integer 0. */
static const float fp4_code[16] = {
    0.0f / 12, 0.0625f / 12,  8.0f / 12, 12.0f / 12,  4.0f / 12,  6.0f / 12,  2.0f / 12,  3.0f / 12,
    0.0f / 12, -0.0625f / 12, -8.0f / 12, -12.0f / 12, -4.0f / 12, -6.0f / 12, -2.0f / 12, -3.0f / 12,
};

/* libbitsandbytes_cpu's own FP4 table (fp4_lut), which its dequantizer uses: the same but -0 for code 8 */
static const float fp4_native[16] = {
    0.0f / 12,  0.0625f / 12,  8.0f / 12,  12.0f / 12,  4.0f / 12,  6.0f / 12,  2.0f / 12,  3.0f / 12,
    -0.0f / 12, -0.0625f / 12, -8.0f / 12, -12.0f / 12, -4.0f / 12, -6.0f / 12, -2.0f / 12, -3.0f / 12,
};

/* torch.argsort(fp4 table): the codes in increasing value (+0 before -0) */
static const uint8_t fp4_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};

const float *snug_q4_code(snug_q4_type type) {
    return type == SNUG_Q4_INT8 ? NULL : type == SNUG_Q4_FP4 ? fp4_code : nf4_code;
}

const char *snug_q4_type_name(snug_q4_type type) {
    return type == SNUG_Q4_INT8 ? "int8" : type == SNUG_Q4_FP4 ? "fp4" : "nf4";
}

const char *snug_q4_dtype_name(snug_dtype dtype) {
    switch (dtype) {
    case SNUG_DT_BF16: return "bfloat16";
    case SNUG_DT_F16: return "float16";
    case SNUG_DT_F32: return "float32";
    default: return NULL;
    }
}

/* The 15 bucket bounds of a code book sorted by value, and the code of each bucket. */
static void q4_bounds(snug_q4_type type, float bounds[15], uint8_t code_of[16]) {
    const float *c = snug_q4_code(type);
    for (int k = 0; k < 16; k++)
        code_of[k] = type == SNUG_Q4_FP4 ? fp4_order[k] : (uint8_t)k;
    for (int k = 0; k < 15; k++)
        bounds[k] = (c[code_of[k]] + c[code_of[k + 1]]) / 2;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Sizes and buffers */

static int valid_blocksize(long bs) { return bs >= 32 && bs <= 4096 && (bs & (bs - 1)) == 0; }

size_t snug_q4_nblocks(size_t n, int blocksize) { return blocksize > 0 ? (n + (size_t)blocksize - 1) / blocksize : 0; }

snug_q4_sizes snug_q4_sizes_of(snug_q4_type type, size_t n, int blocksize, int nested) {
    snug_q4_sizes z = {0};
    size_t nb = snug_q4_nblocks(n, blocksize);
    nested = type == SNUG_Q4_INT8 ? 0 : nested;
    z.packed = type == SNUG_Q4_INT8 ? n : (n + 1) / 2;
    z.absmax = nested ? nb : 4 * nb;
    if (nested) {
        z.nested_absmax = 4 * ((nb + SNUG_Q4_NESTED_BLOCKSIZE - 1) / SNUG_Q4_NESTED_BLOCKSIZE);
        z.nested_quant_map = 4 * 256;
    }
    z.total = z.packed + z.absmax + z.nested_absmax + z.nested_quant_map;
    return z;
}

size_t snug_q4_bytes(snug_q4_type type, size_t n, int blocksize, int nested) {
    return snug_q4_sizes_of(type, n, blocksize, nested).total;
}

int snug_q4_init(snug_q4_tensor *t, snug_q4_type type, int blocksize, int nested, int64_t rows, int64_t cols,
                 snug_dtype dtype, snug_error *e) {
    if (type != SNUG_Q4_NF4 && type != SNUG_Q4_FP4 && type != SNUG_Q4_INT8)
        return snug_fail(e, SNUG_EINPUT, "quant type %d is none of nf4, fp4 and int8", (int)type);
    if (type == SNUG_Q4_INT8 && (cols <= 0 || cols > INT32_MAX))
        return snug_fail(e, SNUG_EINPUT, "8-bit weight shape [%lld, %lld]: rows of 1 to 2^31 - 1 elements",
                         (long long)rows, (long long)cols);
    if (type == SNUG_Q4_INT8)
        blocksize = (int)cols, nested = 0;
    else if (!valid_blocksize(blocksize))
        return snug_fail(e, SNUG_EINPUT, "4-bit blocksize %d: bitsandbytes takes 32, 64, 128, 256, 512, 1024, 2048 or "
                         "4096 (64 is its default)", blocksize);
    if (rows <= 0 || cols <= 0 || rows > INT64_MAX / cols)
        return snug_fail(e, SNUG_EINPUT, "4-bit weight shape [%lld, %lld]: both sizes must be positive",
                         (long long)rows, (long long)cols);
    if (!snug_q4_dtype_name(dtype))
        return snug_fail(e, SNUG_EINPUT, "4-bit weight dtype %s: must be F32, BF16 or F16", snug_dtype_name(dtype));
    memset(t, 0, sizeof *t);
    t->type = type;
    t->blocksize = blocksize;
    t->nested = nested != 0;
    t->nested_blocksize = t->nested ? SNUG_Q4_NESTED_BLOCKSIZE : 0;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->n = (size_t)rows * (size_t)cols;
    t->dtype = dtype;
    return 0;
}

void snug_q4_carve(snug_q4_tensor *t, void *buf) {
    snug_q4_sizes z = snug_q4_sizes_of(t->type, t->n, t->blocksize, t->nested);
    unsigned char *p = buf;
    t->absmax = NULL;
    t->absmax_q = NULL;
    t->nested_absmax = NULL;
    t->nested_quant_map = NULL;
    if (t->nested) {
        t->nested_quant_map = (float *)p;
        p += z.nested_quant_map;
        t->nested_absmax = (float *)p;
        p += z.nested_absmax;
        t->absmax_q = p;
    } else {
        t->absmax = (float *)p;
    }
    p += z.absmax;
    t->packed = p;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* torch's CPU mean */

#define MEAN_MAXW 16

typedef struct mvec {
    float v[MEAN_MAXW];
} mvec;

/* Element i of x seen as vectors of w lanes. */
static mvec mload(const float *x, size_t i, int w) {
    mvec r;
    memcpy(r.v, x + i * (size_t)w, (size_t)w * sizeof(float));
    return r;
}

static void madd(mvec *a, const mvec *b, int w) {
    for (int k = 0; k < w; k++)
        a->v[k] += b->v[k];
}

static int ceil_log2(int64_t x) {
    if (x <= 2)
        return 1;
    int b = 0;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1)
        b++;
    return b;
}

/* torch's multi_row_sum with 4 rows: element (i, k) is vector 4i + k; sums of 16 or more elements are summed again in
 * up to 4 levels, so that only similar magnitudes are added. */
static void multi_row_sum(const float *x, int64_t size, int w, mvec out[4]) {
    const int levels = 4;
    int power = ceil_log2(size) / levels;
    if (power < 4)
        power = 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    mvec acc[4][4];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < 4; k++) {
                mvec v = mload(x, (size_t)(i * 4 + k), w);
                madd(&acc[0][k], &v, w);
            }
        for (int j = 1; j < levels; j++) {
            for (int k = 0; k < 4; k++) {
                madd(&acc[j][k], &acc[j - 1][k], w);
                memset(&acc[j - 1][k], 0, sizeof(mvec));
            }
            if ((i & (mask << (j * power))) != 0)
                break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < 4; k++) {
            mvec v = mload(x, (size_t)(i * 4 + k), w);
            madd(&acc[0][k], &v, w);
        }
    for (int j = 1; j < levels; j++)
        for (int k = 0; k < 4; k++)
            madd(&acc[0][k], &acc[j][k], w);
    for (int k = 0; k < 4; k++)
        out[k] = acc[0][k];
}

/* torch's row_sum: size elements (vectors of w lanes) as [-1, 4] rows plus a tail. */
static mvec row_sum(const float *x, int64_t size, int w) {
    int64_t ilp = size / 4;
    mvec p[4];
    multi_row_sum(x, ilp, w, p);
    for (int64_t i = ilp * 4; i < size; i++) {
        mvec v = mload(x, (size_t)i, w);
        madd(&p[0], &v, w);
    }
    for (int k = 1; k < 4; k++)
        madd(&p[0], &p[k], w);
    return p[0];
}

/* torch's cascade_sum of one contiguous range: vectors, then the scalar tail, then the lanes in order. */
static float cascade_sum(const float *x, size_t n, int lanes) {
    if (lanes > 1 && n >= (size_t)lanes) {
        int64_t vs = (int64_t)(n / (size_t)lanes);
        mvec v = row_sum(x, vs, lanes);
        float acc = 0;
        for (size_t k = (size_t)vs * (size_t)lanes; k < n; k++)
            acc += x[k];
        for (int k = 0; k < lanes; k++)
            acc += v.v[k];
        return acc;
    }
    return row_sum(x, (int64_t)n, 1).v[0];
}

float snug_q4_torch_mean(const float *x, size_t n, int lanes, int threads) {
    const size_t grain = 32768; /* at::internal::GRAIN_SIZE */
    if (lanes < 1 || lanes > MEAN_MAXW)
        lanes = 8;
    if (threads < 1)
        threads = 1;
    if (n == 0)
        return NAN;
    float sum;
    if (n < grain || threads == 1) {
        sum = cascade_sum(x, n, lanes);
    } else {
        /* two_pass_reduction: at::parallel_for's chunks, one partial per thread slot, then the slots summed */
        size_t nt = (n + grain - 1) / grain;
        if (nt > (size_t)threads)
            nt = (size_t)threads;
        size_t chunk = (n + nt - 1) / nt;
        float *part = calloc((size_t)threads, sizeof *part);
        if (!part)
            return NAN;
        for (size_t t = 0; t < nt; t++) {
            size_t lo = t * chunk, hi = lo + chunk < n ? lo + chunk : n;
            if (lo < n)
                part[t] = cascade_sum(x + lo, hi - lo, lanes);
        }
        sum = cascade_sum(part, (size_t)threads, lanes);
        free(part);
    }
    return sum / (float)n;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Quantizing */

static float load_f32(const void *src, snug_dtype dt, size_t i) {
    switch (dt) {
    case SNUG_DT_BF16: return snug_bf16_to_f32(((const uint16_t *)src)[i]);
    case SNUG_DT_F16: return snug_f16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

/* The 65536-entry table of libbitsandbytes_cpu's 8-bit blockwise quantizer for the 256-code map c. */
static void q8_lut(const float c[256], uint8_t lut[65536]) {
    float mid[255];
    for (int k = 0; k < 255; k++)
        mid[k] = (c[k] + c[k + 1]) * 0.5f;
    int j = 0;
    for (int i = 0; i < 65536; i++) {
        float x = ((float)i + (float)i) / 65535.0f - 1.0f;
        while (j < 255 && x > mid[j])
            j++;
        lut[i] = (uint8_t)j;
    }
}

/* bitsandbytes' CPU quantize_blockwise of d [n] with blocks of bs: codes q [n], absmax am [ceil(n / bs)]. */
static void q8_blockwise(const float *d, size_t n, int bs, const uint8_t lut[65536], uint8_t *q, float *am) {
    size_t nb = snug_q4_nblocks(n, bs);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * (size_t)bs, hi = lo + (size_t)bs < n ? lo + (size_t)bs : n;
        float m = -INFINITY;
        for (size_t i = lo; i < hi; i++) {
            float a = fabsf(d[i]);
            if (m < a)
                m = a;
        }
        m = 0.0f > m ? 0.0f : m;
        am[b] = m;
        if (m == 0.0f) {
            memset(q + lo, 0, hi - lo);
            continue;
        }
        float inv = 1.0f / m;
        for (size_t i = lo; i < hi; i++) {
            float y = d[i] * inv;
            y = y < -1.0f ? -1.0f : y > 1.0f ? 1.0f : y;
            float u = (y + 1.0f) * 0.5f;
            q[i] = lut[(uint16_t)(int32_t)fmaf(65535.0f, u, 0.5f)];
        }
    }
}

/* SNUG_Q4_INT8: bitsandbytes' int8_vectorwise_quant of the weight cast to fp16 (quant4.c's first comment) */
static int q8_rows(snug_q4_tensor *t, const void *src, snug_dtype src_dtype, snug_error *e) {
    const size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
    int8_t *codes = (int8_t *)t->packed;
    size_t bad = SIZE_MAX;
#pragma omp parallel for schedule(static) reduction(min : bad)
    for (size_t r = 0; r < rows; r++) {
        float m = 0.0f;
        for (size_t j = 0; j < cols; j++) {
            float x = snug_f16_to_f32(snug_f32_to_f16(load_f32(src, src_dtype, r * cols + j)));
            if (!isfinite(x) && r * cols + j < bad)
                bad = r * cols + j;
            m = fabsf(x) > m ? fabsf(x) : m;
        }
        t->absmax[r] = m;
        float inv = 1.0f / m, scale = inv * 127.0f; /* torch's 127.0 / SCB: the reciprocal, then the product */
        for (size_t j = 0; j < cols; j++) {
            float x = snug_f16_to_f32(snug_f32_to_f16(load_f32(src, src_dtype, r * cols + j)));
            codes[r * cols + j] = m > 0.0f && isfinite(x) ? (int8_t)nearbyintf(x * scale) : 0;
        }
    }
    if (bad == SIZE_MAX)
        return 0;
    float v = load_f32(src, src_dtype, bad);
    return snug_fail(e, SNUG_EINPUT, "8-bit quantizing a [%lld, %lld] weight: element %zu (row %zu, column %zu) is %s; "
                     "bitsandbytes' 8 bits go through fp16 (largest 65504): the weights are corrupt or training "
                     "diverged: quantize a finite checkpoint", (long long)t->shape[0], (long long)t->shape[1], bad,
                     bad / cols, bad % cols, isnan(v) ? "NaN" : isinf(v) ? "infinite" : "past fp16's range");
}

int snug_q4_quantize(snug_q4_tensor *t, const void *src, snug_dtype src_dtype, snug_error *e) {
    if (src_dtype != SNUG_DT_F32 && src_dtype != SNUG_DT_BF16 && src_dtype != SNUG_DT_F16)
        return snug_fail(e, SNUG_EINTERNAL, "4-bit quantizing: source dtype %s is not F32, BF16 or F16",
                         snug_dtype_name(src_dtype));
    if (t->type == SNUG_Q4_INT8)
        return q8_rows(t, src, src_dtype, e);
    const size_t n = t->n, bs = (size_t)t->blocksize, nb = snug_q4_nblocks(n, t->blocksize);
    const size_t full = n / bs; /* blocks of bs elements; block `full` (if any) is the short last one */
    float bounds[15];
    uint8_t code_of[16];
    q4_bounds(t->type, bounds, code_of);
    float *am = t->nested ? malloc(nb * sizeof *am) : t->absmax;
    if (!am)
        return snug_fail(e, SNUG_ENOMEM, "out of memory quantizing a [%lld, %lld] weight to 4 bits",
                         (long long)t->shape[0], (long long)t->shape[1]);
    size_t bad = SIZE_MAX;
#pragma omp parallel for schedule(static) reduction(min : bad)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * bs, len = n - lo < bs ? n - lo : bs;
        float x[4096];
        float m = 0.0f;
        for (size_t i = 0; i < len; i++) {
            x[i] = load_f32(src, src_dtype, lo + i);
            if (!isfinite(x[i]) && lo + i < bad)
                bad = lo + i;
            float a = fabsf(x[i]);
            m = a > m ? a : m;
        }
        float scale = m > 1e-38f ? m : 1e-38f;
        am[b] = b < full ? m : scale;
        float inv = 1.0f / scale;
        for (size_t i = 0; i < len; i += 2) {
            uint8_t q2[2] = {0, 0};
            for (size_t k = 0; k < 2; k++) {
                /* the pad of an odd n is y = 0 */
                float y = i + k >= len ? 0.0f : b < full ? x[i + k] * inv : x[i + k] / scale;
                y = y < -1.0f ? -1.0f : y > 1.0f ? 1.0f : y;
                int c = 0;
                for (int j = 0; j < 15; j++)
                    c += y > bounds[j];
                q2[k] = code_of[c];
            }
            t->packed[(lo + i) / 2] = (uint8_t)(q2[0] << 4 | q2[1]);
        }
    }
    if (bad != SIZE_MAX) {
        if (t->nested)
            free(am);
        float v = load_f32(src, src_dtype, bad);
        return snug_fail(e, SNUG_EINPUT, "4-bit quantizing a [%lld, %lld] weight: element %zu (row %zu, column %zu) "
                         "is %s; the weights are corrupt or training diverged: quantize a finite checkpoint",
                         (long long)t->shape[0], (long long)t->shape[1], bad, bad / (size_t)t->shape[1],
                         bad % (size_t)t->shape[1], isnan(v) ? "NaN" : "infinite");
    }
    if (!t->nested)
        return 0;
    uint8_t *lut = malloc(65536);
    if (!lut) {
        free(am);
        return snug_fail(e, SNUG_ENOMEM, "out of memory quantizing the absmax of a 4-bit weight");
    }
    snug_dynamic_map(t->nested_quant_map, 1);
    q8_lut(t->nested_quant_map, lut);
    t->nested_blocksize = SNUG_Q4_NESTED_BLOCKSIZE;
    t->nested_offset = snug_q4_torch_mean(am, nb, 8, 1);
    for (size_t b = 0; b < nb; b++)
        am[b] = am[b] - t->nested_offset;
    q8_blockwise(am, nb, SNUG_Q4_NESTED_BLOCKSIZE, lut, t->absmax_q, t->nested_absmax);
    free(lut);
    free(am);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Dequantizing */

float snug_q4_block_absmax(const snug_q4_tensor *t, size_t b) {
    if (!t->nested)
        return t->absmax[b];
    float a = t->nested_quant_map[t->absmax_q[b]] * t->nested_absmax[b / (size_t)t->nested_blocksize];
    a = a + t->nested_offset; /* a second rounding: never fused with the product */
    return a;
}

/* SNUG_Q4_INT8's elements [i0, i1): code * the row's factor */
static void q8_dequantize(const snug_q4_tensor *t, size_t i0, size_t i1, void *dst, snug_dtype dst_dtype) {
    const size_t cols = (size_t)t->shape[1];
    const int8_t *codes = (const int8_t *)t->packed;
#pragma omp parallel for schedule(static) if (i1 - i0 >= 65536)
    for (size_t i = i0; i < i1; i++) {
        float w = (float)codes[i] * snug_q8_row_scale(t->absmax[i / cols]);
        if (dst_dtype == SNUG_DT_F32)
            ((float *)dst)[i - i0] = w;
        else
            ((uint16_t *)dst)[i - i0] = dst_dtype == SNUG_DT_BF16 ? snug_f32_to_bf16(w) : snug_f32_to_f16(w);
    }
}

void snug_q4_dequantize(const snug_q4_tensor *t, size_t i0, size_t i1, void *dst, snug_dtype dst_dtype) {
    if (i1 <= i0)
        return;
    if (t->type == SNUG_Q4_INT8) {
        q8_dequantize(t, i0, i1, dst, dst_dtype);
        return;
    }
    /* bitsandbytes' CPU dequantize_4bit runs its native kernel (FP4 code 8 is -0) unless the last dimension is odd,
     * where it falls back to torch with get_4bit_type's table (+0); every other value is the same either way */
    const float *code = t->type == SNUG_Q4_FP4 && t->shape[1] % 2 == 0 ? fp4_native : snug_q4_code(t->type);
    const size_t bs = (size_t)t->blocksize, b0 = i0 / bs, b1 = (i1 - 1) / bs + 1;
    const uint8_t *packed = t->packed;
#pragma omp parallel for schedule(static) if (i1 - i0 >= 65536)
    for (size_t b = b0; b < b1; b++) {
        float s = snug_q4_block_absmax(t, b), v[16];
        for (int k = 0; k < 16; k++)
            v[k] = code[k] * s; /* the product bitsandbytes forms for each element */
        size_t lo = b * bs > i0 ? b * bs : i0, hi = (b + 1) * bs < i1 ? (b + 1) * bs : i1;
        if (dst_dtype == SNUG_DT_F32) {
            float *o = (float *)dst + (lo - i0);
            for (size_t i = lo; i < hi; i++)
                *o++ = v[(packed[i >> 1] >> (i & 1 ? 0 : 4)) & 15];
        } else {
            uint16_t h[16], *o = (uint16_t *)dst + (lo - i0);
            for (int k = 0; k < 16; k++)
                h[k] = dst_dtype == SNUG_DT_BF16 ? snug_f32_to_bf16(v[k]) : snug_f32_to_f16(v[k]);
            for (size_t i = lo; i < hi; i++)
                *o++ = h[(packed[i >> 1] >> (i & 1 ? 0 : 4)) & 15];
        }
    }
}
