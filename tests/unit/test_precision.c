/* test_precision.c: the 16-bit storage ops of the CPU backend against core/dtype.c's scalar conversions, bit for
 * bit; stochastic rounding's neighbours, mean and determinism; the ops that read 16-bit tensors (embedding, loss,
 * sumsq) against the same ops on the widened fp32 values; and fp16's loss-scaling rule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "train/loss_scale.h"

static float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Random fp32 values over every exponent, plus the edge cases: zeros, subnormals, the fp16 overflow boundary,
 * ties, infinities and NaN. */
static void edge_values(float *x, size_t n, uint64_t seed) {
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, -65536.0f, 6.0e-8f,
                                    2.98e-8f, 1e-40f, 3.0e38f, INFINITY, -INFINITY, NAN, 1.00390625f, 1.01171875f};
    uint64_t s = seed;
    size_t k = sizeof special / sizeof *special;
    for (size_t i = 0; i < n; i++)
        x[i] = i < k ? special[i] : bits_f32((uint32_t)snug_splitmix64(&s));
}

static int same_bits(float a, float b) { return !memcmp(&a, &b, 4) || (isnan(a) && isnan(b)); }

static void test_conversions(snug_backend *be) {
    enum { n = 100003 };
    float *x = malloc(n * sizeof *x), *r = malloc(n * sizeof *r), *w = malloc(n * sizeof *w);
    uint16_t *h = malloc(n * sizeof *h);
    snug_dtype dts[2] = {SNUG_DT_BF16, SNUG_DT_F16};
    for (int d = 0; d < 2; d++) {
        snug_dtype dt = dts[d];
        edge_values(x, n, 7 + d);
        memcpy(r, x, n * sizeof *x);
        be->to16(be, h, r, n, dt, 1);
        be->from16(be, w, h, n, dt);
        size_t bad_store = 0, bad_round = 0, bad_widen = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t want = dt == SNUG_DT_BF16 ? snug_f32_to_bf16(x[i]) : snug_f32_to_f16(x[i]);
            float wide = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(want) : snug_f16_to_f32(want);
            bad_store += h[i] != want && !(isnan(x[i]) && isnan(w[i]));
            bad_round += !same_bits(r[i], wide);
            bad_widen += !same_bits(w[i], wide);
        }
        CHECKF(bad_store == 0 && bad_round == 0 && bad_widen == 0,
               "%s: %zu stores, %zu in-place roundings, %zu widenings differ from core/dtype.c", snug_dtype_name(dt),
               bad_store, bad_round, bad_widen);
        /* without round_src the source is untouched */
        memcpy(r, x, n * sizeof *x);
        be->to16(be, h, r, n, dt, 0);
        CHECKF(!memcmp(r, x, n * sizeof *x), "%s: to16 without round_src changed its source", snug_dtype_name(dt));
    }
    free(x), free(r), free(w), free(h);
}

static void test_stochastic_rounding(snug_backend *be1, snug_backend *be2) {
    enum { n = 200000 };
    float *x = malloc(n * sizeof *x);
    uint16_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    /* one value between two bf16 neighbours, a quarter of the way up: rounds up a quarter of the time */
    float lo = 1.0f, hi = snug_bf16_to_f32(snug_f32_to_bf16(1.0f) + 1), v = lo + 0.25f * (hi - lo);
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    be1->bf16_sr(be1, a, x, n, 99);
    be2->bf16_sr(be2, b, x, n, 99);
    CHECK(!memcmp(a, b, n * sizeof *a)); /* the same bits on 1 and 2 threads */
    size_t up = 0, other = 0;
    double mean = 0;
    for (size_t i = 0; i < n; i++) {
        float f = snug_bf16_to_f32(a[i]);
        up += f == hi;
        other += f != hi && f != lo;
        mean += f;
    }
    mean /= n;
    double p = (double)up / n;
    CHECKF(other == 0, "%zu results are not a neighbour", other);
    CHECKF(fabs(p - 0.25) < 0.01, "rounded up %.4f of the time, not 0.25", p);
    CHECKF(fabs(mean - v) < 5e-3 * (hi - lo), "mean %.9g vs value %.9g: biased", mean, (double)v); /* 5 sigma */
    /* a different seed gives different bits; an exact bf16 value never moves; inf stays inf */
    be1->bf16_sr(be1, b, x, n, 100);
    CHECK(memcmp(a, b, n * sizeof *a) != 0);
    x[0] = 3.0f, x[1] = -INFINITY, x[2] = -2.5f;
    be1->bf16_sr(be1, a, x, 3, 5);
    CHECK(snug_bf16_to_f32(a[0]) == 3.0f && isinf(snug_bf16_to_f32(a[1])) && snug_bf16_to_f32(a[2]) == -2.5f);
    free(x), free(a), free(b);
}

/* The ops that read 16-bit tensors give what they give on the widened fp32 values. */
static void test_16bit_readers(snug_backend *be) {
    enum { N = 77, C = 96, V = 1003, CH = 19, WB = 100 };
    uint64_t s = 3;
    float *table = malloc((size_t)V * C * sizeof(float)), *wide = malloc((size_t)V * C * sizeof(float));
    uint16_t *t16 = malloc((size_t)V * C * sizeof(uint16_t));
    float *h = malloc((size_t)N * C * sizeof(float)), *o1 = malloc((size_t)N * C * sizeof(float));
    float *o2 = malloc((size_t)N * C * sizeof(float)), *ws = malloc((size_t)CH * V * sizeof(float));
    float *wws = malloc((size_t)WB * C * sizeof(float)), *dw1 = calloc((size_t)V * C, sizeof(float));
    float *dw2 = calloc((size_t)V * C, sizeof(float));
    int32_t ids[N], labels[N];
    for (size_t i = 0; i < (size_t)V * C; i++)
        table[i] = (float)(snug_splitmix64(&s) % 20001) * 1e-4f - 1.0f;
    for (size_t i = 0; i < (size_t)N * C; i++)
        h[i] = (float)(snug_splitmix64(&s) % 20001) * 1e-4f - 1.0f;
    for (int i = 0; i < N; i++) {
        ids[i] = (int32_t)(snug_splitmix64(&s) % V);
        labels[i] = i % 7 == 3 ? -1 : (int32_t)(snug_splitmix64(&s) % V);
    }
    snug_dtype dts[2] = {SNUG_DT_BF16, SNUG_DT_F16};
    for (int d = 0; d < 2; d++) {
        snug_dtype dt = dts[d];
        memcpy(wide, table, (size_t)V * C * sizeof(float));
        be->to16(be, t16, wide, (size_t)V * C, dt, 1);
        /* embedding: exact, plain and accumulating */
        be->embed_fwd(be, o1, ids, wide, SNUG_DT_F32, N, C, 0);
        be->embed_fwd(be, o2, ids, t16, dt, N, C, 0);
        CHECKF(!memcmp(o1, o2, (size_t)N * C * sizeof(float)), "%s embedding", snug_dtype_name(dt));
        be->embed_fwd(be, o1, ids, wide, SNUG_DT_F32, N, C, 1);
        be->embed_fwd(be, o2, ids, t16, dt, N, C, 1);
        CHECKF(!memcmp(o1, o2, (size_t)N * C * sizeof(float)), "%s embedding (accumulate)", snug_dtype_name(dt));
        /* sumsq: the same blocks over the same values, so the same double */
        CHECK(be->sumsq(be, wide, SNUG_DT_F32, (size_t)V * C) == be->sumsq(be, t16, dt, (size_t)V * C));
        /* the loss, dh and dw, with the head widened WB rows at a time (GEMMs split by rows: rounding only) */
        memset(o1, 0, (size_t)N * C * sizeof(float));
        memset(o2, 0, (size_t)N * C * sizeof(float));
        memset(dw1, 0, (size_t)V * C * sizeof(float));
        memset(dw2, 0, (size_t)V * C * sizeof(float));
        double l1 = be->xent_fwd_bwd(be, o1, dw1, h, wide, SNUG_DT_F32, labels, N, C, V, 0.5f, ws, CH, NULL, 0);
        double l2 = be->xent_fwd_bwd(be, o2, dw2, h, t16, dt, labels, N, C, V, 0.5f, ws, CH, wws, WB);
        CHECKF(fabs(l1 - l2) <= 1e-6 * fabs(l1), "%s loss %.9g vs %.9g", snug_dtype_name(dt), l1, l2);
        double rh = check_max_rel_f(o2, o1, (size_t)N * C), rw = check_max_rel_f(dw2, dw1, (size_t)V * C);
        CHECKF(rh <= 1e-5 && rw <= 1e-5, "%s head: dh %.1e, dw %.1e relative", snug_dtype_name(dt), rh, rw);
    }
    free(table), free(wide), free(t16), free(h), free(o1), free(o2), free(ws), free(wws), free(dw1), free(dw2);
}

static void test_loss_scaler(void) {
    snug_loss_scaler ls;
    snug_loss_scaler_init(&ls, 0);
    CHECK(ls.scale == 1.0f && snug_loss_scaler_update(&ls, NAN) == 1); /* off: never skips */
    snug_loss_scaler_init(&ls, 1);
    CHECK(ls.scale == 65536.0f);
    CHECK(snug_loss_scaler_update(&ls, INFINITY) == 0 && ls.scale == 32768.0f && ls.skipped == 1);
    CHECK(snug_loss_scaler_update(&ls, NAN) == 0 && ls.scale == 16384.0f && ls.skipped == 2);
    int taken = 0;
    for (int i = 0; i < SNUG_LOSS_SCALE_GROWTH - 1; i++)
        taken += snug_loss_scaler_update(&ls, 1.5);
    CHECK(taken == SNUG_LOSS_SCALE_GROWTH - 1 && ls.scale == 16384.0f); /* not yet */
    CHECK(snug_loss_scaler_update(&ls, 1.5) == 1 && ls.scale == 32768.0f); /* the 2000th clean step doubles */
    for (int i = 0; i < 1000; i++)
        snug_loss_scaler_update(&ls, 1.0);
    CHECK(snug_loss_scaler_update(&ls, INFINITY) == 0 && ls.scale == 16384.0f && ls.clean == 0);
    for (int i = 0; i < SNUG_LOSS_SCALE_GROWTH - 1; i++)
        snug_loss_scaler_update(&ls, 1.0);
    CHECK(ls.scale == 16384.0f); /* an overflow restarts the count */
}

int main(void) {
    snug_backend *be1 = snug_backend_cpu_create(1), *be2 = snug_backend_cpu_create(2);
    test_conversions(be2);
    test_stochastic_rounding(be1, be2);
    test_16bit_readers(be2);
    test_loss_scaler();
    be1->destroy(be1);
    be2->destroy(be2);
    return check_finish("test_precision");
}
