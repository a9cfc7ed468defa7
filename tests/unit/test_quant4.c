/* test_quant4.c: bitsandbytes' 4-bit formats (src/model/quant4.c) by their properties; equality with bitsandbytes
 * itself is tests/parity/test_quant4_parity.py.
 *
 * - the code books: NF4 sorted in [-1, 1] with 0 at code 7; FP4 sign in bit 3, +0 at code 8 as bitsandbytes has it;
 * - the size helpers equal what snug_q4_carve points at, what quantize writes (nothing past the end) and what the
 *   safetensors writer saves;
 * - round trips on awkward shapes (odd n, a short last block, a single short block, [1, 1]), NF4 and FP4, nested and
 *   not, blocksizes 32..4096: every element within half the gap between the codes around it times its block's
 *   absmax (plus the nested absmax's own error), the pad nibble of an odd n, zero blocks dequantizing to 0 (a full
 *   one storing absmax 0, a short one 1e-38), nested close to not nested, bf16/fp16 input equal to its fp32
 *   widening, the range form and bf16/fp16 output equal to the whole fp32 dequantization;
 * - torch's mean: exact on constants, close to the double mean, the same for any thread count below 32768;
 * - the quant_state JSON: known bytes, Python's float repr, write -> parse round trips, and one malformed JSON per
 *   rule (each an SNUG_EINPUT error naming the problem, never a crash);
 * - reading bnb-4bit tensors from a safetensors file snug wrote, and one broken file per check of snug_q4_st_view;
 * - bad parameters (blocksize, shape, dtype) and NaN / infinite weights are errors naming the place;
 * - the 8-bit format (SNUG_Q4_INT8, load_in_8bit): sizes and carving, each row's scale its largest |w| in fp16, the
 *   code of that element +-127, every element within half a step (SCB / 127) of its fp16 value, a zero row all
 *   zero, bf16 input equal to its fp32 widening, a weight past fp16's range refused; a transformers-style 8-bit
 *   file read in place, and one broken file per check. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/dtype.h"
#include "core/json_util.h"
#include "model/quant4.h"
#include "model/safetensors.h"

static char tmpdir[256];
static uint64_t rng = 0x243F6A8885A308D3ull;

static double urand(void) { /* [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static float nrand(void) { /* roughly normal */
    return (float)((urand() + urand() + urand() + urand() - 2.0) * 1.7);
}

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static unsigned nibble(const snug_q4_tensor *t, size_t i) { return (t->packed[i / 2] >> (i % 2 ? 0 : 4)) & 15; }

/* A quantized weight with its own buffer. */
typedef struct q4 {
    snug_q4_tensor t;
    unsigned char *buf;
} q4;

static int q4_make(q4 *q, snug_q4_type type, int bs, int nested, int64_t rows, int64_t cols, const void *src,
                   snug_dtype sdt) {
    snug_error e = {0};
    memset(q, 0, sizeof *q);
    if (snug_q4_init(&q->t, type, bs, nested, rows, cols, sdt, &e))
        return fprintf(stderr, "init: %s\n", e.msg), 1;
    size_t total = snug_q4_bytes(q->t.type, q->t.n, q->t.blocksize, q->t.nested);
    q->buf = malloc(total + 64);
    memset(q->buf, 0xAB, total + 64);
    snug_q4_carve(&q->t, q->buf);
    if (snug_q4_quantize(&q->t, src, sdt, &e))
        return fprintf(stderr, "quantize: %s\n", e.msg), 1;
    int intact = 1;
    for (size_t k = 0; k < 64; k++)
        intact &= q->buf[total + k] == 0xAB;
    CHECKF(intact, "quantize wrote past the %zu bytes snug_q4_bytes gives", total);
    return 0;
}

static void test_codes(void) {
    const float *nf4 = snug_q4_code(SNUG_Q4_NF4), *fp4 = snug_q4_code(SNUG_Q4_FP4);
    CHECK(nf4[0] == -1.0f && nf4[7] == 0.0f && nf4[15] == 1.0f);
    int sorted = 1;
    for (int k = 1; k < 16; k++)
        sorted &= nf4[k] > nf4[k - 1];
    CHECK(sorted);
    CHECK(fp4[0] == 0.0f && !signbit(fp4[0]) && fp4[8] == 0.0f && !signbit(fp4[8]));
    CHECK(fp4[3] == 1.0f && fp4[11] == -1.0f && fp4[1] == 0.0625f / 12);
    int sym = 1;
    for (int k = 1; k < 8; k++)
        sym &= fp4[k | 8] == -fp4[k] && fp4[k] > 0;
    CHECK(sym);
    CHECK(strcmp(snug_q4_type_name(SNUG_Q4_NF4), "nf4") == 0 && strcmp(snug_q4_type_name(SNUG_Q4_FP4), "fp4") == 0);
    CHECK(strcmp(snug_q4_dtype_name(SNUG_DT_BF16), "bfloat16") == 0 && !snug_q4_dtype_name(SNUG_DT_U8));
}

static void test_sizes(void) {
    /* Llama-3.1-8B q_proj: [4096, 4096], NF4 + double quantization */
    snug_q4_sizes z = snug_q4_sizes_of(SNUG_Q4_NF4, 4096u * 4096u, 64, 1);
    CHECK(z.packed == 8388608 && z.absmax == 262144 && z.nested_absmax == 4 * 1024 && z.nested_quant_map == 1024);
    CHECK(z.total == z.packed + z.absmax + z.nested_absmax + z.nested_quant_map);
    z = snug_q4_sizes_of(SNUG_Q4_NF4, 91, 64, 0);
    CHECK(z.packed == 46 && z.absmax == 8 && z.nested_absmax == 0 && z.nested_quant_map == 0 && z.total == 54);
    CHECK(snug_q4_bytes(SNUG_Q4_NF4, 91, 64, 1) == 46 + 2 + 4 + 1024);
    CHECK(snug_q4_nblocks(64, 64) == 1 && snug_q4_nblocks(65, 64) == 2 && snug_q4_nblocks(1, 4096) == 1);
    /* carve: the parts tile the buffer exactly */
    for (int nested = 0; nested < 2; nested++) {
        snug_q4_tensor t;
        snug_error e = {0};
        CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 64, nested, 33, 1001, SNUG_DT_BF16, &e) == 0);
        size_t total = snug_q4_bytes(t.type, t.n, 64, nested);
        unsigned char *buf = malloc(total);
        snug_q4_carve(&t, buf);
        z = snug_q4_sizes_of(t.type, t.n, 64, nested);
        CHECK(t.packed + z.packed == buf + total);
        if (nested) {
            CHECK((unsigned char *)t.nested_quant_map == buf && !t.absmax);
            CHECK((unsigned char *)t.nested_absmax == buf + z.nested_quant_map);
            CHECK(t.absmax_q == buf + z.nested_quant_map + z.nested_absmax && t.absmax_q + z.absmax == t.packed);
        } else {
            CHECK((unsigned char *)t.absmax == buf && buf + z.absmax == t.packed && !t.absmax_q);
        }
        /* the writer saves exactly these bytes, plus the 64-byte quant_map and the JSON */
        float *w = malloc(t.n * sizeof *w);
        for (size_t i = 0; i < t.n; i++)
            w[i] = nrand();
        CHECK(snug_q4_quantize(&t, w, SNUG_DT_F32, &e) == 0);
        snug_q4_st_outs *o = malloc(sizeof *o);
        CHECK(snug_q4_st_outs_fill(o, "w.weight", &t, &e) == 0);
        size_t saved = 0;
        for (int k = 0; k < o->n; k++) {
            size_t c = snug_dtype_size(o->out[k].dtype);
            for (int d = 0; d < o->out[k].ndim; d++)
                c *= (size_t)o->out[k].shape[d];
            if (strstr(o->out[k].name, ".quant_map") && !strstr(o->out[k].name, "nested"))
                CHECK(c == 64);
            else if (!strstr(o->out[k].name, ".quant_state."))
                saved += c;
        }
        CHECK(o->n == (nested ? 6 : 4));
        CHECKF(saved == total, "the writer saves %zu bytes of %zu", saved, total);
        free(o);
        free(w);
        free(buf);
    }
}

/* Half the gap between the sorted codes around y (y in [-1, 1]). */
static double half_gap(const float *code, double y) {
    double s[16];
    for (int k = 0; k < 16; k++)
        s[k] = code[k];
    for (int i = 1; i < 16; i++) /* insertion sort */
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double x = s[j];
            s[j] = s[j - 1];
            s[j - 1] = x;
        }
    for (int k = 0; k < 15; k++)
        if (y <= s[k + 1])
            return (s[k + 1] - s[k]) / 2;
    return 0;
}

/* Round trip of one weight: the bound per element, the pad nibble, zero blocks, the range and 16-bit forms. */
static void round_trip(snug_q4_type type, int bs, int nested, int64_t rows, int64_t cols, const float *w) {
    q4 q;
    if (q4_make(&q, type, bs, nested, rows, cols, w, SNUG_DT_F32)) {
        CHECK(0);
        return;
    }
    snug_q4_tensor *t = &q.t;
    size_t n = t->n, nb = snug_q4_nblocks(n, bs);
    float *d = malloc(n * sizeof *d);
    snug_q4_dequantize(t, 0, n, d, SNUG_DT_F32);
    const float *code = snug_q4_code(type);
    int bound_ok = 1, zero_ok = 1, absmax_ok = 1;
    size_t worst = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * (size_t)bs, hi = lo + (size_t)bs < n ? lo + (size_t)bs : n;
        double m = 0;
        for (size_t i = lo; i < hi; i++)
            m = fmax(m, fabs(w[i]));
        double a = snug_q4_block_absmax(t, b); /* what dequantizing uses */
        if (!nested)
            absmax_ok &= a == (m == 0 && hi - lo < (size_t)bs ? (double)1e-38f : m);
        /* nested: the 8-bit absmax is within the dynamic map's largest gap (0.07) of its group's range */
        double da = nested ? 0.04 * t->nested_absmax[b / 256] + 1e-6 * fabs(t->nested_offset) : 0;
        if (nested)
            absmax_ok &= fabs(a - m) <= da;
        for (size_t i = lo; i < hi; i++) {
            if (m == 0) {
                zero_ok &= d[i] == 0.0f;
                continue;
            }
            double y = w[i] / m, bound = half_gap(code, y) * m * (1 + 1e-6) + da + 1e-30;
            if (!(fabs((double)d[i] - w[i]) <= bound)) {
                if (bound_ok)
                    worst = i;
                bound_ok = 0;
            }
        }
    }
    CHECKF(bound_ok, "%s bs=%d nested=%d [%lld, %lld]: element %zu: %g dequantizes to %g", snug_q4_type_name(type),
           bs, nested, (long long)rows, (long long)cols, worst, (double)w[worst], (double)d[worst]);
    CHECKF(zero_ok, "%s bs=%d nested=%d: a block of zeros does not dequantize to 0", snug_q4_type_name(type), bs,
           nested);
    CHECKF(absmax_ok, "%s bs=%d nested=%d [%lld, %lld]: absmax", snug_q4_type_name(type), bs, nested,
           (long long)rows, (long long)cols);
    if (n % 2)
        CHECK((t->packed[n / 2] & 15) == (type == SNUG_Q4_NF4 ? 7u : 0u));
    /* ranges and 16-bit outputs */
    int range_ok = 1;
    for (int r = 0; r < 20; r++) {
        size_t i0 = (size_t)(urand() * (double)n), i1 = i0 + (size_t)(urand() * (double)(n - i0 + 1));
        if (i1 > n)
            i1 = n;
        float *p = malloc((i1 - i0 + 1) * sizeof *p);
        uint16_t *h = malloc((i1 - i0 + 1) * sizeof *h), *f16 = malloc((i1 - i0 + 1) * sizeof *f16);
        snug_q4_dequantize(t, i0, i1, p, SNUG_DT_F32);
        snug_q4_dequantize(t, i0, i1, h, SNUG_DT_BF16);
        snug_q4_dequantize(t, i0, i1, f16, SNUG_DT_F16);
        for (size_t i = i0; i < i1; i++) {
            range_ok &= memcmp(&p[i - i0], &d[i], 4) == 0 && h[i - i0] == snug_f32_to_bf16(d[i]) &&
                        f16[i - i0] == snug_f32_to_f16(d[i]);
        }
        free(p);
        free(h);
        free(f16);
    }
    CHECK(range_ok);
    free(d);
    free(q.buf);
}

static void test_round_trips(void) {
    static const int64_t shapes[][2] = {{7, 13}, {1, 1}, {5, 7}, {3, 50}, {64, 96}, {33, 1001}, {2, 4096}};
    static const int bss[] = {32, 64, 128, 256, 4096};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t n = (size_t)(shapes[s][0] * shapes[s][1]);
        float *w = malloc(n * sizeof *w);
        for (size_t i = 0; i < n; i++)
            w[i] = nrand() * (float)exp(2 * nrand());
        /* a full block and a short block of zeros (for blocksize 64 and n >= 128), a block with one non-zero */
        if (n >= 192) {
            memset(w + 64, 0, 64 * sizeof *w);
            w[140] = 0.25f;
            for (size_t i = 141; i < 192; i++)
                w[i] = 0;
        }
        if (n % 64 && n > 64)
            for (size_t i = n / 64 * 64; i < n; i++)
                w[i] = 0;
        for (int type = 0; type < 2; type++)
            for (size_t b = 0; b < sizeof bss / sizeof bss[0]; b++)
                for (int nested = 0; nested < 2; nested++)
                    round_trip((snug_q4_type)type, bss[b], nested, shapes[s][0], shapes[s][1], w);
        free(w);
    }
    /* explicit zero blocks: full -> absmax 0, short -> 1e-38 (bitsandbytes' clamp), both dequantize to 0 */
    float w[150] = {0};
    for (int i = 0; i < 64; i++)
        w[i] = nrand();
    q4 q;
    if (q4_make(&q, SNUG_Q4_NF4, 64, 0, 3, 50, w, SNUG_DT_F32) == 0) {
        CHECK(q.t.absmax[1] == 0.0f && q.t.absmax[2] == 1e-38f);
        int codes7 = 1;
        for (size_t i = 64; i < 150; i++)
            codes7 &= nibble(&q.t, i) == 7;
        CHECK(codes7);
        free(q.buf);
    }
    /* nested close to not nested */
    size_t n = 256 * 576;
    float *big = malloc(n * sizeof *big), *d0 = malloc(n * sizeof *d0), *d1 = malloc(n * sizeof *d1);
    for (size_t i = 0; i < n; i++)
        big[i] = nrand() * 0.02f;
    q4 a, b;
    if (q4_make(&a, SNUG_Q4_NF4, 64, 0, 256, 576, big, SNUG_DT_F32) == 0 &&
        q4_make(&b, SNUG_Q4_NF4, 64, 1, 256, 576, big, SNUG_DT_F32) == 0) {
        snug_q4_dequantize(&a.t, 0, n, d0, SNUG_DT_F32);
        snug_q4_dequantize(&b.t, 0, n, d1, SNUG_DT_F32);
        double e0 = 0, e1 = 0, dd = 0, m = 0;
        int same_codes = memcmp(a.t.packed, b.t.packed, (n + 1) / 2) == 0;
        for (size_t i = 0; i < n; i++) {
            e0 += ((double)d0[i] - big[i]) * ((double)d0[i] - big[i]);
            e1 += ((double)d1[i] - big[i]) * ((double)d1[i] - big[i]);
            dd = fmax(dd, fabs((double)d0[i] - d1[i]));
            m = fmax(m, fabs(big[i]));
        }
        CHECK(same_codes); /* the 4-bit codes do not depend on how absmax is stored */
        CHECKF(dd <= 0.01 * m && e1 <= 1.01 * e0, "nested vs not: max diff %g (max |w| %g), rms %g vs %g", dd, m,
               sqrt(e1 / n), sqrt(e0 / n));
        /* 16-bit input quantizes like its fp32 widening */
        uint16_t *h = malloc(n * sizeof *h);
        float *wide = malloc(n * sizeof *wide);
        for (int k = 0; k < 2; k++) {
            snug_dtype dt = k ? SNUG_DT_F16 : SNUG_DT_BF16;
            for (size_t i = 0; i < n; i++) {
                h[i] = k ? snug_f32_to_f16(big[i]) : snug_f32_to_bf16(big[i]);
                wide[i] = k ? snug_f16_to_f32(h[i]) : snug_bf16_to_f32(h[i]);
            }
            q4 x, y;
            if (q4_make(&x, SNUG_Q4_FP4, 64, 1, 256, 576, h, dt) == 0 &&
                q4_make(&y, SNUG_Q4_FP4, 64, 1, 256, 576, wide, SNUG_DT_F32) == 0) {
                CHECK(memcmp(x.buf, y.buf, snug_q4_bytes(SNUG_Q4_NF4, n, 64, 1)) == 0);
                CHECK(x.t.dtype == dt && y.t.dtype == SNUG_DT_F32);
            }
            free(x.buf);
            free(y.buf);
        }
        free(h);
        free(wide);
    }
    free(a.buf);
    free(b.buf);
    free(big);
    free(d0);
    free(d1);
}

static void test_mean(void) {
    float x[70000];
    for (size_t i = 0; i < 70000; i++)
        x[i] = 0.375f;
    CHECK(snug_q4_torch_mean(x, 70000, 8, 1) == 0.375f && snug_q4_torch_mean(x, 1, 8, 1) == 0.375f);
    double s = 0;
    for (size_t i = 0; i < 70000; i++) {
        x[i] = (float)(urand() * 3);
        s += x[i];
    }
    float m1 = snug_q4_torch_mean(x, 70000, 8, 1), m2 = snug_q4_torch_mean(x, 70000, 8, 2);
    float m16 = snug_q4_torch_mean(x, 70000, 16, 3);
    CHECK(fabs(m1 - s / 70000) < 1e-6 * s / 70000 && fabs(m2 - s / 70000) < 1e-6 * s / 70000);
    CHECK(fabs(m16 - s / 70000) < 1e-6 * s / 70000);
    CHECK(snug_q4_torch_mean(x, 30000, 8, 1) == snug_q4_torch_mean(x, 30000, 8, 4)); /* below the grain size */
}

static void test_json(void) {
    snug_error e = {0};
    snug_q4_tensor t;
    char buf[SNUG_Q4_JSON_MAX];
    size_t len = 0;
    CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 64, 1, 4096, 4096, SNUG_DT_BF16, &e) == 0);
    t.nested_offset = 0.0123f;
    CHECK(snug_q4_state_json(&t, buf, sizeof buf, &len, &e) == 0);
    const char *want = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [4096, 4096], "
                       "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": "
                       "0.012299999594688416}";
    CHECKF(strcmp(buf, want) == 0 && len == strlen(want), "%s", buf);
    CHECK(snug_q4_init(&t, SNUG_Q4_FP4, 128, 0, 7, 13, SNUG_DT_F32, &e) == 0);
    CHECK(snug_q4_state_json(&t, buf, sizeof buf, &len, &e) == 0);
    CHECKF(strcmp(buf, "{\"quant_type\": \"fp4\", \"blocksize\": 128, \"dtype\": \"float32\", "
                       "\"shape\": [7, 13]}") == 0, "%s", buf);
    CHECK(snug_q4_state_json(&t, buf, 20, &len, &e) != 0);
    /* Python's repr */
    static const struct {
        double v;
        const char *s;
    } reprs[] = {{2.5966567993164062, "2.5966567993164062"}, {1e-5, "1e-05"}, {1e16, "1e+16"}, {0.1, "0.1"},
                 {1234567890123456.0, "1234567890123456.0"}, {0.0001, "0.0001"}, {-0.0, "-0.0"}, {3.0, "3.0"},
                 {5e-324, "5e-324"}, {1.5e-7, "1.5e-07"}, {123.456, "123.456"},
                 {(double)1e-38f, "9.999999350456404e-39"}};
    for (size_t k = 0; k < sizeof reprs / sizeof reprs[0]; k++) {
        char r[32];
        snug_json_py_float(reprs[k].v, r);
        CHECKF(strcmp(r, reprs[k].s) == 0, "repr %.17g: %s, Python %s", reprs[k].v, r, reprs[k].s);
    }
    /* write -> parse round trips */
    for (int k = 0; k < 200; k++) {
        snug_q4_tensor a, b;
        int nested = k % 2;
        snug_dtype dt = k % 3 == 0 ? SNUG_DT_F32 : k % 3 == 1 ? SNUG_DT_BF16 : SNUG_DT_F16;
        CHECK(snug_q4_init(&a, (snug_q4_type)(k / 2 % 2), 32 << (k % 8), nested, 1 + (int64_t)(urand() * 9000),
                           1 + (int64_t)(urand() * 9000), dt, &e) == 0);
        a.nested_offset = (float)(urand() * pow(10, (int)(urand() * 12) - 8));
        CHECK(snug_q4_state_json(&a, buf, sizeof buf, &len, &e) == 0);
        int ok = snug_q4_state_parse(buf, len, "test", &b, &e) == 0;
        CHECKF(ok && a.type == b.type && a.blocksize == b.blocksize && a.dtype == b.dtype && a.n == b.n &&
               a.shape[0] == b.shape[0] && a.shape[1] == b.shape[1] && a.nested == b.nested &&
               (!nested || (memcmp(&a.nested_offset, &b.nested_offset, 4) == 0 && b.nested_blocksize == 256)),
               "round trip of %s", buf);
    }
    /* malformed: each an input error that names what is wrong. K(q, b, d, s): a quant_state of those four values;
     * QS: a valid one, to append to */
#define K(q, b, d, s) "{\"quant_type\": " q ", \"blocksize\": " b ", \"dtype\": " d ", \"shape\": " s
#define QS K("\"nf4\"", "64", "\"float32\"", "[2, 2]")
#define NF4 "\"nf4\""
#define F32 "\"float32\""
    static const struct {
        const char *json, *says;
    } bad[] = {
        {"", "not valid JSON"},
        {"{\"quant_type\": \"nf4\"", "not valid JSON"},
        {"[1, 2]", "JSON object"},
        {"{\"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [2, 2]}", "\"quant_type\""},
        {"{\"quant_type\": \"nf4\", \"dtype\": \"float32\", \"shape\": [2, 2]}", "\"blocksize\""},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"shape\": [2, 2]}", "\"dtype\""},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\"}", "\"shape\""},
        {K("\"int4\"", "64", F32, "[2, 2]") "}", "int4"},
        {K("4", "64", F32, "[2, 2]") "}", "must be a string"},
        {K(NF4, "100", F32, "[2, 2]") "}", "blocksize 100"},
        {K(NF4, "16", F32, "[2, 2]") "}", "blocksize 16"},
        {K(NF4, "8192", F32, "[2, 2]") "}", "blocksize 8192"},
        {K(NF4, "\"64\"", F32, "[2, 2]") "}", "integer"},
        {K(NF4, "64.0", F32, "[2, 2]") "}", "integer"},
        {K(NF4, "64", "\"float64\"", "[2, 2]") "}", "float64"},
        {K(NF4, "64", F32, "[4096]") "}", "1 dimensions"},
        {K(NF4, "64", F32, "[2, 3, 4]") "}", "3 dimensions"},
        {K(NF4, "64", F32, "[0, 5]") "}", "shape[0]"},
        {K(NF4, "64", F32, "[5, \"a\"]") "}", "shape[1]"},
        {K(NF4, "64", F32, "\"4096\"") "}", "array"},
        {K(NF4, "64", F32, "[4611686018427387904, 4]") "}", "too large"},
        {QS ", \"absmax\": 1}", "unknown key \"absmax\""},
        {QS ", \"nested_offset\": 0.5}", "1 of nested_blocksize"},
        {QS ", \"nested_blocksize\": 128, \"nested_dtype\": \"float32\", \"nested_offset\": 0.5}",
         "nested_blocksize 128"},
        {QS ", \"nested_blocksize\": 256, \"nested_dtype\": \"float16\", \"nested_offset\": 0.5}",
         "nested_dtype \"float16\""},
        {QS ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": \"x\"}", "nested_offset"},
        {QS ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": NaN}", "not valid JSON"},
        {QS ", \"quant_type\": \"fp4\"}", "not valid JSON"}, /* a duplicate key */
    };
#undef K
#undef QS
#undef NF4
#undef F32
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snug_error e2 = {0};
        snug_q4_tensor x;
        int rc = snug_q4_state_parse(bad[k].json, strlen(bad[k].json), "f.safetensors: tensor \"w\"", &x, &e2);
        CHECKF(rc == SNUG_EINPUT && strstr(e2.msg, bad[k].says) && strstr(e2.msg, "f.safetensors"),
               "%s -> rc %d: %s", bad[k].json, rc, e2.msg);
    }
}

/* Writes outs (plus `extra` when set) to path. */
static void write_set(const char *path, const snug_st_out *o, int n, const snug_st_out *extra) {
    snug_st_out all[8];
    snug_error e = {0};
    memcpy(all, o, (size_t)n * sizeof *o);
    if (extra)
        all[n++] = *extra;
    if (snug_st_write(path, all, n, NULL, &e))
        fprintf(stderr, "write %s: %s\n", path, e.msg);
}

static int view_fails(const char *path, const char *name, const char *says) {
    snug_st_set s = {0};
    snug_error e = {0};
    snug_q4_tensor t;
    if (snug_st_open_file(&s, path, &e))
        return fprintf(stderr, "open %s: %s\n", path, e.msg), 0;
    int rc = snug_q4_st_view(&s, name, &t, &e);
    snug_st_close(&s);
    if (rc != SNUG_EINPUT || !strstr(e.msg, says))
        fprintf(stderr, "view of %s: rc %d, \"%s\" (expected \"%s\")\n", path, rc, e.msg, says);
    return rc == SNUG_EINPUT && strstr(e.msg, says) != NULL;
}

static void test_safetensors(void) {
    const char *W = "model.layers.0.self_attn.q_proj.weight";
    size_t n = 96 * 77;
    float *w = malloc(n * sizeof *w), *d = malloc(n * sizeof *d), *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        w[i] = nrand() * 0.05f;
    for (int nested = 0; nested < 2; nested++) {
        q4 q;
        if (q4_make(&q, nested ? SNUG_Q4_NF4 : SNUG_Q4_FP4, 64, nested, 96, 77, w, SNUG_DT_F32)) {
            CHECK(0);
            continue;
        }
        snug_error e = {0};
        snug_q4_st_outs *o = malloc(sizeof *o);
        CHECK(snug_q4_st_outs_fill(o, W, &q.t, &e) == 0);
        float plain = 1.0f;
        snug_st_out other = {.name = "model.norm.weight", .dtype = SNUG_DT_F32, .ndim = 1, .shape = {1}, .f32 = &plain};
        const char *good = tpath("good.safetensors");
        write_set(good, o->out, o->n, &other);
        snug_st_set s = {0};
        snug_q4_tensor t;
        CHECK(snug_st_open_file(&s, good, &e) == 0);
        CHECK(snug_q4_st_detect(&s, W) == 1 && snug_q4_st_detect(&s, "model.norm.weight") == 0);
        int ok = snug_q4_st_view(&s, W, &t, &e) == 0;
        CHECKF(ok, "%s", e.msg);
        if (ok) {
            CHECK(t.type == q.t.type && t.nested == nested && t.n == n && t.shape[0] == 96 && t.dtype == SNUG_DT_F32);
            CHECK(memcmp(&t.nested_offset, &q.t.nested_offset, 4) == 0);
            snug_q4_dequantize(&q.t, 0, n, d, SNUG_DT_F32);
            snug_q4_dequantize(&t, 0, n, v, SNUG_DT_F32);
            CHECK(memcmp(d, v, n * sizeof *d) == 0);
        }
        snug_error e2 = {0};
        CHECK(snug_q4_st_view(&s, "model.norm.weight", &t, &e2) == SNUG_EINPUT && strstr(e2.msg, "not bitsandbytes"));
        snug_st_close(&s);
        unlink(good);
        /* one broken file per check */
        const char *bad = tpath("bad.safetensors");
        snug_st_out c[6];
        int k = 0;
        /* a missing absmax */
        for (int i = 0; i < o->n; i++)
            if (!strstr(o->out[i].name, ".absmax") || strstr(o->out[i].name, "nested"))
                c[k++] = o->out[i];
        write_set(bad, c, k, NULL);
        CHECK(view_fails(bad, W, ".absmax\""));
        /* absmax of the wrong dtype: the bytes of the other format */
        memcpy(c, o->out, sizeof c);
        c[1].dtype = nested ? SNUG_DT_F32 : SNUG_DT_U8;
        c[1].shape[0] = nested ? (c[1].shape[0] + 3) / 4 : c[1].shape[0] * 4;
        write_set(bad, c, o->n, NULL);
        CHECK(view_fails(bad, W, "bitsandbytes stores it as"));
        /* a packed weight one byte short */
        memcpy(c, o->out, sizeof c);
        c[0].shape[0]--;
        write_set(bad, c, o->n, NULL);
        CHECK(view_fails(bad, W, "bytes, the quant_state needs"));
        /* a changed quant_map */
        float qm[16];
        memcpy(qm, o->quant_map, sizeof qm);
        qm[5] += 0.01f;
        memcpy(c, o->out, sizeof c);
        c[2].raw = qm;
        write_set(bad, c, o->n, NULL);
        CHECK(view_fails(bad, W, "quant_map\"[5]"));
        /* an unknown part */
        snug_st_out extra = {.name = "model.layers.0.self_attn.q_proj.weight.scales", .dtype = SNUG_DT_F32,
                             .ndim = 1, .shape = {1}, .f32 = &plain};
        write_set(bad, o->out, o->n, &extra);
        CHECK(view_fails(bad, W, "weight.scales\" is not a part"));
        /* JSON whose quant_type contradicts the key's suffix */
        char js[SNUG_Q4_JSON_MAX];
        snprintf(js, sizeof js, "%s", o->json);
        char *p = strstr(js, nested ? "\"nf4\"" : "\"fp4\"");
        memcpy(p, nested ? "\"fp4\"" : "\"nf4\"", 5);
        memcpy(c, o->out, sizeof c);
        c[o->n - 1].raw = js;
        write_set(bad, c, o->n, NULL);
        CHECK(view_fails(bad, W, "contradicts"));
        /* nested JSON without the nested tensors, or nested tensors with a plain JSON */
        if (nested) {
            k = 0;
            for (int i = 0; i < o->n; i++)
                if (!strstr(o->out[i].name, ".nested_"))
                    c[k++] = o->out[i];
            c[1].dtype = SNUG_DT_U8;
            write_set(bad, c, k, NULL);
            CHECK(view_fails(bad, W, ".nested_absmax\""));
        } else {
            float nq[256] = {0}, na[1] = {1};
            snug_st_out n1 = {.name = "model.layers.0.self_attn.q_proj.weight.nested_absmax", .dtype = SNUG_DT_F32,
                              .ndim = 1, .shape = {1}, .raw = na};
            (void)nq;
            write_set(bad, o->out, o->n, &n1);
            CHECK(view_fails(bad, W, "no nested_* keys"));
        }
        /* both nf4 and fp4 quant_states */
        snug_st_out other_qs = o->out[o->n - 1];
        other_qs.name = nested ? "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__fp4"
                               : "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4";
        write_set(bad, o->out, o->n, &other_qs);
        CHECK(view_fails(bad, W, "both an nf4 and an fp4"));
        /* a quant_state that is not U8 */
        memcpy(c, o->out, sizeof c);
        c[o->n - 1].dtype = SNUG_DT_BF16;
        c[o->n - 1].shape[0] /= 2;
        write_set(bad, c, o->n, NULL);
        CHECK(view_fails(bad, W, "U8 of rank 1"));
        unlink(bad);
        free(o);
        free(q.buf);
    }
    free(w);
    free(d);
    free(v);
}

static void test_errors(void) {
    snug_error e = {0};
    snug_q4_tensor t;
    CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 48, 0, 4, 4, SNUG_DT_F32, &e) == SNUG_EINPUT && strstr(e.msg, "48"));
    CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 16, 0, 4, 4, SNUG_DT_F32, &e) == SNUG_EINPUT);
    CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 8192, 0, 4, 4, SNUG_DT_F32, &e) == SNUG_EINPUT);
    CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 64, 0, 0, 4, SNUG_DT_F32, &e) == SNUG_EINPUT);
    CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 64, 0, 4, 4, SNUG_DT_U8, &e) == SNUG_EINPUT);
    CHECK(snug_q4_init(&t, (snug_q4_type)7, 64, 0, 4, 4, SNUG_DT_F32, &e) == SNUG_EINPUT);
    float w[300];
    for (int i = 0; i < 300; i++)
        w[i] = nrand();
    w[217] = NAN;
    w[250] = INFINITY;
    CHECK(snug_q4_init(&t, SNUG_Q4_NF4, 64, 1, 3, 100, SNUG_DT_F32, &e) == 0);
    void *buf = malloc(snug_q4_bytes(t.type, t.n, 64, 1));
    snug_q4_carve(&t, buf);
    CHECK(snug_q4_quantize(&t, w, SNUG_DT_F32, &e) == SNUG_EINPUT && strstr(e.msg, "element 217 (row 2, column 17)")
          && strstr(e.msg, "NaN"));
    w[217] = 0;
    CHECK(snug_q4_quantize(&t, w, SNUG_DT_F32, &e) == SNUG_EINPUT && strstr(e.msg, "element 250") &&
          strstr(e.msg, "infinite"));
    free(buf);
}

static void test_int8(void) {
    const int64_t R = 37, C = 53;
    size_t n = (size_t)(R * C);
    float *w = malloc(n * sizeof *w), *d = malloc(n * sizeof *d);
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        w[i] = nrand() * (i / (size_t)C == 3 ? 1e-6f : 0.05f); /* row 3: fp16 subnormals */
    for (int64_t j = 0; j < C; j++)
        w[4 * C + j] = 0.0f; /* row 4: zeros */
    w[7 * C + 11] = 9.0f;    /* row 7: an outlier */
    snug_error e = {0};
    q4 q;
    CHECK(snug_q4_sizes_of(SNUG_Q4_INT8, n, (int)C, 1).total == n + 4 * (size_t)R);
    if (q4_make(&q, SNUG_Q4_INT8, 0, 1, R, C, w, SNUG_DT_F32)) {
        CHECK(0);
        goto out;
    }
    CHECK(q.t.blocksize == C && !q.t.nested && (unsigned char *)q.t.absmax == q.buf && q.t.packed == q.buf + 4 * R);
    snug_q4_dequantize(&q.t, 0, n, d, SNUG_DT_F32);
    int bad_scale = 0, bad_peak = 0, bad_step = 0;
    for (int64_t r = 0; r < R; r++) {
        float m = 0.0f;
        int64_t at = 0;
        for (int64_t j = 0; j < C; j++) {
            float x = fabsf(snug_f16_to_f32(snug_f32_to_f16(w[r * C + j])));
            at = x > m ? j : at;
            m = x > m ? x : m;
        }
        bad_scale += q.t.absmax[r] != m;
        int8_t c = ((const int8_t *)q.t.packed)[r * C + at];
        bad_peak += m > 0 ? (c != 127 && c != -127) : c != 0;
        for (int64_t j = 0; j < C; j++) {
            double x = snug_f16_to_f32(snug_f32_to_f16(w[r * C + j]));
            bad_step += fabs(d[r * C + j] - x) > 0.5 * m / 127 * (1 + 1e-5) + 1e-30;
        }
    }
    CHECKF(!bad_scale && !bad_peak && !bad_step, "8-bit: %d scales not the row's max |w16|, %d peaks not +-127, %d "
           "elements further than half a step", bad_scale, bad_peak, bad_step);
    int zero = 1;
    for (int64_t j = 0; j < C; j++)
        zero &= ((const int8_t *)q.t.packed)[4 * C + j] == 0 && d[4 * C + j] == 0.0f;
    CHECK(zero && q.t.absmax[4] == 0.0f);
    for (size_t i = 0; i < n; i++)
        h[i] = snug_f32_to_bf16(w[i]);
    float *wide = malloc(n * sizeof *wide);
    for (size_t i = 0; i < n; i++)
        wide[i] = snug_bf16_to_f32(h[i]);
    q4 x, y;
    if (q4_make(&x, SNUG_Q4_INT8, 0, 0, R, C, h, SNUG_DT_BF16) == 0 &&
        q4_make(&y, SNUG_Q4_INT8, 0, 0, R, C, wide, SNUG_DT_F32) == 0) {
        CHECK(memcmp(x.buf, y.buf, snug_q4_bytes(SNUG_Q4_INT8, n, (int)C, 0)) == 0);
        free(x.buf), free(y.buf);
    }
    free(wide);
    /* a transformers-style file: "<module>.weight" I8, "<module>.SCB", "<module>.weight_format" */
    const char *W = "model.layers.0.mlp.up_proj.weight", *S = "model.layers.0.mlp.up_proj.SCB";
    const char *F = "model.layers.0.mlp.up_proj.weight_format";
    uint8_t row = 0, col = 1;
    float neg[37];
    memcpy(neg, q.t.absmax, sizeof neg);
    neg[9] = -1.0f;
    for (int k = 0; k < 5; k++) { /* 0 good; 1 weight_format 1; 2 negative scale; 3 scales of one row less; 4 U8 */
        snug_st_out o[3] = {
            {.name = W, .dtype = k == 4 ? SNUG_DT_U8 : SNUG_DT_I8, .ndim = 2, .shape = {R, C}, .raw = q.t.packed},
            {.name = S, .dtype = SNUG_DT_F32, .ndim = 1, .shape = {k == 3 ? R - 1 : R},
             .raw = k == 2 ? neg : q.t.absmax},
            {.name = F, .dtype = SNUG_DT_U8, .ndim = 0, .raw = k == 1 ? &col : &row}};
        const char *p = tpath("q8.safetensors");
        write_set(p, o, 3, NULL);
        snug_st_set s = {0};
        snug_q4_tensor t;
        e = (snug_error){0};
        CHECK(snug_st_open_file(&s, p, &e) == 0);
        CHECK(snug_q4_st_detect(&s, W) == 1 && snug_q4_st_detect(&s, "model.layers.0.mlp.down_proj.weight") == 0);
        int rc = snug_q4_st_view(&s, W, &t, &e);
        static const char *const want[] = {NULL, "weight_format", "SCB\"[9]", "SCB", "is U8"};
        if (k == 0) {
            CHECKF(rc == 0 && t.type == SNUG_Q4_INT8 && t.shape[0] == R && t.shape[1] == C, "%s", e.msg);
            float *v = malloc(n * sizeof *v);
            if (!rc)
                snug_q4_dequantize(&t, 0, n, v, SNUG_DT_F32);
            CHECK(!rc && memcmp(v, d, n * sizeof *v) == 0);
            free(v);
        } else {
            CHECKF(rc == SNUG_EINPUT && strstr(e.msg, want[k]) && strstr(e.msg, "q8.safetensors"), "case %d: %s", k,
                   e.msg);
        }
        snug_st_close(&s);
        unlink(p);
    }
    free(q.buf);
    /* past fp16's range, and NaN */
    snug_q4_tensor t;
    CHECK(snug_q4_init(&t, SNUG_Q4_INT8, 0, 0, 2, 3, SNUG_DT_F32, &e) == 0);
    unsigned char buf[64];
    snug_q4_carve(&t, buf);
    float big[6] = {1, 2, 3, 4, 70000.0f, 6};
    CHECK(snug_q4_quantize(&t, big, SNUG_DT_F32, &e) == SNUG_EINPUT && strstr(e.msg, "row 1, column 1") &&
          strstr(e.msg, "past fp16's range"));
    big[4] = NAN;
    CHECK(snug_q4_quantize(&t, big, SNUG_DT_F32, &e) == SNUG_EINPUT && strstr(e.msg, "NaN"));
out:
    free(w), free(d), free(h);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/snug_test_q4_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_codes();
    test_sizes();
    test_round_trips();
    test_mean();
    test_json();
    test_safetensors();
    test_errors();
    test_int8();
    CHECKF(rmdir(tmpdir) == 0, "temporary folder %s not empty", tmpdir);
    return check_finish("test_quant4");
}
