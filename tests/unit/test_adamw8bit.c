/* test_adamw8bit.c: 8-bit AdamW (bitsandbytes' blockwise algorithm) and paged optimizer state.
 *
 * - the dynamic maps: 256 sorted codes in [-1, 1] / [0, 1] with 0 and 1 (equality with bitsandbytes itself is
 *   tests/parity/test_quant_maps.py);
 * - blockwise quantize/dequantize on awkward sizes (n not a multiple of 256, blocks of zeros, negative values, wide
 *   dynamic range): absmax is the block's max |x|, the error is within half the largest gap between adjacent codes
 *   times absmax, the code is the nearest one (or, for momentum, its neighbour of the right sign);
 * - the 8-bit step against a double-precision reference of the same algorithm (bitsandbytes' kernel order, its
 *   hyperparameters rounded to float as bitsandbytes passes them), step by step from the same state, with non-finite
 *   gradients, grad_scale and weight decay; bitwise the same for 1, 2 and 3 threads;
 * - the optimizer over a parameter table: tensors under 4096 elements keep fp32 state (and step bitwise like fp32
 *   AdamW; with embed_fp32 the embedding too), the plan counts exactly what the layout carves, and paged state
 *   streamed in chunks of any size (chunks that cut tensors at block boundaries) gives bitwise the result of unpaged
 *   state. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/rng.h"
#include "model/presets.h"
#include "core/quant_map.h"
#include "optim/optim.h"
#include "plan/plan.h"
#include "train/engine.h"

static snug_backend *be1, *be2, *be3; /* 1, 2 and 3 threads */
static float map_s[256], map_u[256];  /* signed (momentum) and unsigned (second moment) maps */

#define QB SNUG_Q8_BLOCK

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) { return snug_splitmix64(&rng_state); }

static double urand(void) { return (double)(rng_next() >> 11) * 0x1.0p-53; } /* [0,1) */

static size_t nblocks(size_t n) { return (n + QB - 1) / QB; }

static double max_gap(const float *code) {
    double g = 0;
    for (int i = 1; i < 256; i++)
        g = fmax(g, (double)code[i] - code[i - 1]);
    return g;
}

/* The index of the code nearest x, by brute force. */
static int nearest(const float *code, double x) {
    int best = 0;
    for (int i = 1; i < 256; i++)
        if (fabs(code[i] - x) < fabs(code[best] - x))
            best = i;
    return best;
}

/* Test data: per block a random scale 10^U(-7, 2), some blocks of one sign only, one block in seven all zero, some
 * exact zeros, values below the smallest code and rare outliers. */
static float *state_like(size_t n, int nonneg) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t b = 0; b < nblocks(n); b++) {
        double scale = pow(10.0, -7.0 + 9.0 * urand());
        int kind = (int)(rng_next() % 7);
        for (size_t i = b * QB; i < n && i < (b + 1) * QB; i++) {
            double u = 2 * urand() - 1;
            if (nonneg || kind == 1)
                u = fabs(u);
            if (kind == 2 && !nonneg)
                u = -fabs(u);
            if (urand() < 0.01)
                u *= 50; /* outlier */
            if (urand() < 0.02)
                u = 0;
            else if (urand() < 0.01)
                u *= 1e-8; /* below the smallest code: rounds to 0, or for momentum to the smallest code of its sign */
            x[i] = kind == 0 ? 0.0f : (float)(u * scale);
        }
    }
    return x;
}

static int same_bytes(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

/* The embedding tables, whose state stays fp32 under 8-bit AdamW with embed_fp32 (as in transformers' Trainer). */
static int is_embedding(const snug_param_entry *p) {
    return !strcmp(p->name, "model.embed_tokens.weight") || !strcmp(p->name, "transformer.wte.weight") ||
           !strcmp(p->name, "transformer.wpe.weight");
}

/* ------------------------------------------------------------------------------------------------ maps */

static void test_maps(void) {
    printf("dynamic maps\n");
    for (int s = 0; s < 2; s++) {
        const float *c = s ? map_u : map_s;
        int sorted = 1, zero = 0;
        for (int i = 0; i < 256; i++) {
            if (i && !(c[i] >= c[i - 1]))
                sorted = 0;
            zero += c[i] == 0.0f;
        }
        CHECKF(sorted, "%s map sorted", s ? "unsigned" : "signed");
        CHECKF(zero == 1 && c[255] == 1.0f, "%s map holds one 0 and ends at 1", s ? "unsigned" : "signed");
    }
    CHECK(map_s[127] == 0.0f && map_s[0] < -0.99f && map_s[0] > -1.0f && map_s[126] < 0 && map_s[128] > 0);
    CHECK(map_u[0] == 0.0f && map_u[1] > 0);
    printf("  signed map [%.4f, 1], largest gap %.6f; unsigned map [0, 1], largest gap %.6f\n", map_s[0],
           max_gap(map_s), max_gap(map_u));
}

/* ------------------------------------------------------------------------------------------------ quantize */

static void test_quantize(void) {
    printf("blockwise quantize / dequantize\n");
    size_t sizes[] = {1, 255, 256, 257, 1000, 4097, 70001};
    double worst_ratio = 0; /* largest error / (half the largest gap * absmax) */
    size_t not_nearest = 0, sign_moves = 0, total = 0;
    for (int s = 0; s < 2; s++) {
        const float *code = s ? map_u : map_s;
        double bound = 0.5 * max_gap(code);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k], nb = nblocks(n);
            float *x = state_like(n, s), *y = malloc(n * sizeof *y), *am = malloc(nb * sizeof *am);
            float *am1 = malloc(nb * sizeof *am1), *am3 = malloc(nb * sizeof *am3);
            uint8_t *q = malloc(n), *q1 = malloc(n), *q3 = malloc(n);
            be2->quantize_blockwise(be2, q, am, x, code, !s, n);
            be1->quantize_blockwise(be1, q1, am1, x, code, !s, n);
            be3->quantize_blockwise(be3, q3, am3, x, code, !s, n);
            be2->dequantize_blockwise(be2, y, q, am, code, n);
            CHECKF(same_bytes(q, q1, n) && same_bytes(q, q3, n) && same_bytes(am, am1, nb * 4) &&
                       same_bytes(am, am3, nb * 4),
                   "quantize identical for 1, 2, 3 threads (n=%zu)", n);
            int absmax_ok = 1, bound_ok = 1, zeros_ok = 1;
            for (size_t b = 0; b < nb; b++) {
                float m = 0;
                for (size_t i = b * QB; i < n && i < (b + 1) * QB; i++)
                    m = fmaxf(m, fabsf(x[i]));
                absmax_ok &= am[b] == m;
                for (size_t i = b * QB; i < n && i < (b + 1) * QB; i++) {
                    double err = fabs((double)y[i] - x[i]);
                    total++;
                    if (m == 0) {
                        zeros_ok &= y[i] == 0.0f;
                        continue;
                    }
                    double r = err / (bound * m);
                    worst_ratio = fmax(worst_ratio, r);
                    bound_ok &= r <= 1.0 + 1e-5;
                    double xs = (double)x[i] / m;
                    int best = nearest(code, xs);
                    /* tie slack: x/absmax is rounded to float before the search */
                    if (fabs(code[q[i]] - xs) > fabs(code[best] - xs) + 1e-7) {
                        if (!s && !signbit(code[best]) != !signbit(x[i]) && !signbit(code[q[i]]) == !signbit(x[i]) &&
                            abs((int)q[i] - best) == 1)
                            sign_moves++;
                        else
                            not_nearest++;
                    }
                }
            }
            CHECKF(absmax_ok, "absmax is the block's max |x| (n=%zu, %s)", n, s ? "unsigned" : "signed");
            CHECKF(bound_ok, "error within half the largest code gap times absmax (n=%zu, %s)", n,
                   s ? "unsigned" : "signed");
            CHECKF(zeros_ok, "an all-zero block dequantizes to zeros (n=%zu)", n);
            free(x), free(y), free(am), free(am1), free(am3), free(q), free(q1), free(q3);
        }
    }
    CHECKF(not_nearest == 0, "%zu of %zu codes are not the nearest", not_nearest, total);
    printf("  %zu values: largest error %.3f x (half the largest gap x absmax); nearest code everywhere but %zu "
           "momentum values moved one code to keep their sign\n",
           total, worst_ratio, sign_moves);
}

/* ------------------------------------------------------------------------------------------------ the step */

typedef struct hyper {
    double lr, b1, b2, eps, wd;
    float gs;
} hyper;

/* One step of the same algorithm in double from the same state; hyperparameters rounded to float first, as
 * bitsandbytes passes them. Writes the reference p, m, v, absmax into pd, md, vd, amd, avd. */
static void ref_step(const float *p, const float *g, const uint8_t *qm, const uint8_t *qv, const float *am,
                     const float *av, size_t n, const hyper *h, int step, double *pd, double *md, double *vd,
                     double *amd, double *avd) {
    double lr = (float)h->lr, b1 = (float)h->b1, b2 = (float)h->b2, eps = (float)h->eps, wd = (float)h->wd;
    double c1 = 1 - pow(b1, step), c2 = sqrt(1 - pow(b2, step)), step_size = -lr * c2 / c1;
    for (size_t b = 0; b < nblocks(n); b++) {
        size_t i0 = b * QB, i1 = i0 + QB < n ? i0 + QB : n;
        amd[b] = avd[b] = 0;
        for (size_t i = i0; i < i1; i++) {
            if (isfinite(g[i])) {
                double gi = (double)g[i] * h->gs;
                vd[i] = (double)map_u[qv[i]] * av[b] * b2 + (1 - b2) * gi * gi;
                md[i] = (double)map_s[qm[i]] * am[b] * b1 + (1 - b1) * gi;
            } else {
                md[i] = vd[i] = 0;
            }
            amd[b] = fmax(amd[b], fabs(md[i]));
            avd[b] = fmax(avd[b], fabs(vd[i]));
        }
        for (size_t i = i0; i < i1; i++) {
            pd[i] = p[i];
            if (!isfinite(g[i]))
                continue;
            pd[i] += step_size * md[i] / (sqrt(vd[i]) + c2 * eps);
            if (wd > 0)
                pd[i] *= 1 - lr * wd;
        }
    }
}

static void test_step(void) {
    printf("8-bit AdamW step\n");
    hyper hp[2] = {{1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5f}, {3e-3, 0.3, 0.999, 1e-6, 0.0, 1.0f}};
    size_t sizes[3] = {300, 4097, 70001};
    double gm = 0.5 * max_gap(map_s), gv = 0.5 * max_gap(map_u);
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k], nb = nblocks(n);
        const hyper *h = &hp[k % 2];
        float *p = malloc(n * 4), *p1 = malloc(n * 4), *p3 = malloc(n * 4), *p0 = malloc(n * 4);
        uint8_t *qm = calloc(n, 1), *qv = calloc(n, 1), *qm1 = calloc(n, 1), *qv1 = calloc(n, 1);
        uint8_t *qm3 = calloc(n, 1), *qv3 = calloc(n, 1), *qm0 = malloc(n), *qv0 = malloc(n);
        float *am = calloc(nb, 4), *av = calloc(nb, 4), *am1 = calloc(nb, 4), *av1 = calloc(nb, 4);
        float *am3 = calloc(nb, 4), *av3 = calloc(nb, 4), *am0 = malloc(nb * 4), *av0 = malloc(nb * 4);
        double *pd = malloc(n * 8), *md = malloc(n * 8), *vd = malloc(n * 8), *amd = malloc(nb * 8),
               *avd = malloc(nb * 8);
        for (size_t i = 0; i < n; i++)
            p[i] = (float)(2 * urand() - 1);
        memcpy(p1, p, n * 4);
        memcpy(p3, p, n * 4);
        double worst_p = 0, worst_a = 0, worst_m = 0, worst_v = 0;
        size_t code_diff = 0, code_total = 0;
        int nonfinite_ok = 1, near_tie = 1;
        for (int step = 1; step <= 5; step++) {
            float *g = state_like(n, 0);
            if (step == 2 && n > 10) {
                g[3] = NAN;
                g[n - 2] = INFINITY;
            }
            memcpy(p0, p, n * 4), memcpy(qm0, qm, n), memcpy(qv0, qv, n), memcpy(am0, am, nb * 4),
                memcpy(av0, av, nb * 4);
            ref_step(p0, g, qm0, qv0, am0, av0, n, h, step, pd, md, vd, amd, avd);
            be2->adamw8bit(be2, p, g, qm, qv, am, av, map_s, map_u, n, h->lr, h->b1, h->b2, h->eps, h->wd, step,
                           h->gs);
            be1->adamw8bit(be1, p1, g, qm1, qv1, am1, av1, map_s, map_u, n, h->lr, h->b1, h->b2, h->eps, h->wd, step,
                           h->gs);
            be3->adamw8bit(be3, p3, g, qm3, qv3, am3, av3, map_s, map_u, n, h->lr, h->b1, h->b2, h->eps, h->wd, step,
                           h->gs);
            CHECKF(same_bytes(p, p1, n * 4) && same_bytes(p, p3, n * 4) && same_bytes(qm, qm1, n) &&
                       same_bytes(qm, qm3, n) && same_bytes(qv, qv1, n) && same_bytes(qv, qv3, n) &&
                       same_bytes(am, am1, nb * 4) && same_bytes(am, am3, nb * 4) && same_bytes(av, av1, nb * 4) &&
                       same_bytes(av, av3, nb * 4),
                   "8-bit step identical for 1, 2, 3 threads (n=%zu, step %d)", n, step);
            /* p against the reference, relative to the largest update of the step */
            double upd = 1e-30;
            for (size_t i = 0; i < n; i++)
                upd = fmax(upd, fabs(pd[i] - p0[i]));
            for (size_t i = 0; i < n; i++) /* less the rounding of p itself to float */
                worst_p = fmax(worst_p, fmax(0, fabs(p[i] - pd[i]) - 0x1p-24 * fabs(pd[i])) / upd);
            for (size_t b = 0; b < nb; b++) {
                worst_a = fmax(worst_a, check_relerr(am[b], amd[b], 1e-30));
                worst_a = fmax(worst_a, check_relerr(av[b], avd[b], 1e-30));
            }
            /* the requantized state: the nearest code of the reference's m/absmax (or the sign-keeping neighbour),
             * within the map's bound */
            for (size_t i = 0; i < n; i++) {
                size_t b = i / QB;
                double xm = amd[b] > 0 ? md[i] / amd[b] : 0, xv = avd[b] > 0 ? vd[i] / avd[b] : 0;
                int rm = nearest(map_s, xm), rv = nearest(map_u, xv);
                if (!signbit(map_s[rm]) != !signbit(md[i]) && md[i] != 0)
                    rm += md[i] > 0 ? 1 : -1;
                code_total += 2;
                if (qm[i] != rm) {
                    code_diff++;
                    near_tie &= fabs(fabs(map_s[qm[i]] - xm) - fabs(map_s[rm] - xm)) < 1e-5;
                }
                if (qv[i] != rv) {
                    code_diff++;
                    near_tie &= fabs(fabs(map_u[qv[i]] - xv) - fabs(map_u[rv] - xv)) < 1e-5;
                }
                if (amd[b] > 0)
                    worst_m = fmax(worst_m, fabs(map_s[qm[i]] * (double)am[b] - md[i]) / (gm * amd[b]));
                if (avd[b] > 0)
                    worst_v = fmax(worst_v, fabs(map_u[qv[i]] * (double)av[b] - vd[i]) / (gv * avd[b]));
            }
            if (step == 2 && n > 10) {
                nonfinite_ok &= p[3] == p0[3] && p[n - 2] == p0[n - 2];
                nonfinite_ok &= map_s[qm[3]] * am[0] == 0.0f && map_u[qv[3]] * av[0] == 0.0f;
            }
            free(g);
        }
        CHECKF(worst_p < 2e-5, "p against the double reference (n=%zu): %.3g of the largest update", n, worst_p);
        CHECKF(worst_a < 1e-6, "new absmax against the reference (n=%zu): relative %.3g", n, worst_a);
        CHECKF(worst_m <= 1.0 + 1e-4 && worst_v <= 1.0 + 1e-4,
               "requantized m, v within half the largest gap x absmax (n=%zu): %.3f, %.3f", n, worst_m, worst_v);
        CHECKF(near_tie && code_diff * 1000 <= code_total, "codes equal the reference's but at near-ties (n=%zu): "
               "%zu of %zu differ", n, code_diff, code_total);
        CHECKF(nonfinite_ok, "a non-finite gradient leaves p and zeroes m, v (n=%zu)", n);
        printf("  n=%zu: p within %.2g of the largest update, absmax within %.2g, %zu of %zu codes differ (near "
               "ties), m/v error %.3f/%.3f of the bound; identical for 1, 2, 3 threads\n",
               n, worst_p, worst_a, code_diff, code_total, worst_m, worst_v);
        free(p), free(p1), free(p3), free(p0), free(qm), free(qv), free(qm1), free(qv1), free(qm3), free(qv3);
        free(qm0), free(qv0), free(am), free(av), free(am1), free(av1), free(am3), free(av3), free(am0), free(av0);
        free(pd), free(md), free(vd), free(amd), free(avd);
    }
}

/* ------------------------------------------------------------------------------------------------ the optimizer */

/* An optimizer's state on real arenas sized by a counting pass, as the engine does it. */
typedef struct opt_mem {
    snug_adamw o;
    snug_arenas A;
    void *blk[SNUG_MEM_NCAT];
    size_t planned[SNUG_MEM_NCAT];
} opt_mem;

static void opt_make(opt_mem *om, snug_optim_kind kind, int paged, size_t chunk, const snug_param_table *t) {
    memset(om, 0, sizeof *om);
    snug_error e = {0};
    snug_adamw plan = {.kind = kind, .paged = paged, .chunk_bytes = chunk};
    snug_arenas C;
    snug_arenas_init_counting(&C);
    CHECK(snug_adamw_layout(&plan, &C, t, NULL, &e) == 0);
    for (int c = 0; c < SNUG_MEM_NCAT; c++) {
        om->planned[c] = C.a[c].peak;
        om->blk[c] = C.a[c].peak ? (paged && c == SNUG_MEM_OPTIM ? be2->host_alloc(be2, C.a[c].peak)
                                                                 : be2->alloc(be2, C.a[c].peak))
                                 : NULL;
        snug_arena_init(&om->A.a[c], (snug_category)c, om->blk[c], C.a[c].peak);
    }
    om->o = (snug_adamw){.kind = kind, .paged = paged, .chunk_bytes = chunk, .beta1 = 0.9, .beta2 = 0.99,
                         .eps = 1e-8, .weight_decay = 0.05};
    CHECK(snug_adamw_layout(&om->o, &om->A, t, be2, &e) == 0);
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        CHECKF(om->A.a[c].peak == om->planned[c], "layout carves what the plan counted (%s)",
               snug_category_name((snug_category)c));
}

static void opt_free(opt_mem *om) {
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        if (om->blk[c])
            (om->o.paged && c == SNUG_MEM_OPTIM ? be2->host_free : be2->free)(be2, om->blk[c]);
}

/* Runs `steps` steps from params p0 with gradients g[s] (P each); params out in p. */
static void run_steps(opt_mem *om, const snug_param_table *t, const float *p0, float *const *g, int steps, float *p) {
    memcpy(p, p0, t->total * sizeof *p);
    for (int s = 0; s < steps; s++)
        snug_adamw_step(&om->o, be2, t, p, g[s], 1e-2 * (s + 1) / steps, s == 1 ? 0.5f : 1.0f);
}

static void test_optimizer(void) {
    printf("optimizer over a parameter table\n");
    snug_model_config cfg;
    snug_error e = {0};
    CHECK(snug_preset(&cfg, "tiny-llama", 300, &e) == 0);
    cfg.n_layer = 2;
    cfg.qkv_bias = 1; /* bias vectors under 4096 elements, beside large matrices */
    snug_param_table t;
    CHECK(snug_param_table_build(&t, &cfg, &e) == 0);
    size_t P = t.total, small = 0, big = 0, blocks = 0;
    for (int i = 0; i < t.n; i++) {
        if (t.e[i].numel < SNUG_Q8_MIN_NUMEL) {
            small += t.e[i].numel;
        } else {
            big += t.e[i].numel;
            blocks += nblocks(t.e[i].numel);
        }
    }
    enum { STEPS = 4 };
    float *p0 = malloc(P * 4), *g[STEPS], *ref32 = malloc(P * 4), *ref8 = malloc(P * 4), *p = malloc(P * 4);
    for (size_t i = 0; i < P; i++)
        p0[i] = (float)(0.1 * (2 * urand() - 1));
    for (int s = 0; s < STEPS; s++) {
        g[s] = malloc(P * 4);
        for (size_t i = 0; i < P; i++)
            g[s][i] = (float)(1e-3 * (2 * urand() - 1) * (1 + (i % 7)));
    }

    opt_mem a, b;
    opt_make(&a, SNUG_OPTIM_ADAMW, 0, 0, &t);
    run_steps(&a, &t, p0, g, STEPS, ref32);
    CHECK(a.o.n32 == P && a.o.n8 == 0 && a.planned[SNUG_MEM_OPTIM] == 2 * ((P * 4 + 63) / 64 * 64));
    opt_make(&b, SNUG_OPTIM_ADAMW_8BIT, 0, 0, &t);
    run_steps(&b, &t, p0, g, STEPS, ref8);
    CHECKF(b.o.n32 == small && b.o.n8 == big && b.o.nblk == blocks,
           "tensors under 4096 elements keep fp32 state (%zu fp32, %zu 8-bit, %zu blocks)", b.o.n32, b.o.n8,
           b.o.nblk);
    {   /* embed_fp32: the embedding's state stays fp32 (transformers' Trainer) */
        snug_adamw o = {.kind = SNUG_OPTIM_ADAMW_8BIT, .embed_fp32 = 1};
        snug_arenas C;
        snug_arenas_init_counting(&C);
        CHECK(snug_adamw_layout(&o, &C, &t, NULL, &e) == 0);
        size_t emb = t.e[0].numel;
        CHECKF(is_embedding(&t.e[0]) && o.n32 == small + emb && o.n8 == big - emb && o.nblk == blocks - emb / QB,
               "embed_fp32: the embedding's state is fp32 (%zu fp32, %zu 8-bit)", o.n32, o.n8);
    }
    /* small tensors: the fp32 op on fp32 state, bitwise as fp32 AdamW; large ones: close to it (quantized v can
     * misjudge the step of an element whose gradient is tiny beside its block's largest, so compare in L2) */
    int small_same = 1;
    double d2 = 0, c2 = 0;
    for (int i = 0; i < t.n; i++) {
        const snug_param_entry *pe = &t.e[i];
        if (pe->numel < SNUG_Q8_MIN_NUMEL) {
            small_same &= same_bytes(ref8 + pe->offset, ref32 + pe->offset, pe->numel * 4);
            continue;
        }
        for (size_t j = pe->offset; j < pe->offset + pe->numel; j++) {
            c2 += ((double)ref32[j] - p0[j]) * ((double)ref32[j] - p0[j]);
            d2 += ((double)ref8[j] - ref32[j]) * ((double)ref8[j] - ref32[j]);
        }
    }
    double rel = sqrt(d2 / c2);
    CHECK(small_same);
    CHECKF(rel < 0.1, "8-bit AdamW close to fp32 AdamW after %d steps: |dp8 - dp32| / |dp32| = %.3g", STEPS, rel);
    printf("  %zu parameters: %zu in tensors under 4096 elements keep fp32 state (bitwise as fp32 AdamW); the others "
           "8-bit: |dp8 - dp32| / |dp32| = %.3g after %d steps\n",
           P, small, rel, STEPS);
    double bpp32 = (double)a.planned[SNUG_MEM_OPTIM] / P, bpp8 = (double)b.planned[SNUG_MEM_OPTIM] / P;
    /* 8 bytes per fp32-state element, 2 + 8/256 per 8-bit one; six buffers aligned to 64 bytes, and the two maps */
#define A64(n) (((n) + 63) / 64 * 64)
    size_t want8 = 2 * A64(small * 4) + 2 * A64(big) + 2 * A64(blocks * 4) + 2 * 256 * 4;
    CHECKF(bpp32 == 8.0 && b.planned[SNUG_MEM_OPTIM] == want8, "8-bit state %zu bytes, %zu expected",
           b.planned[SNUG_MEM_OPTIM], want8);
    printf("  optimizer state per parameter: fp32 %.3f bytes, 8-bit %.3f bytes (%.3f in the 8-bit tensors)\n", bpp32,
           bpp8, (double)(b.o.n8 * 2 + b.o.nblk * 8) / (double)b.o.n8);

    /* paged: any chunk size (one block per chunk cuts every tensor), bitwise the unpaged result */
    size_t chunks[] = {520, 3000, 100000, 0};
    for (int kind = 0; kind < 2; kind++)
        for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
            opt_mem pg;
            opt_make(&pg, kind ? SNUG_OPTIM_ADAMW_8BIT : SNUG_OPTIM_ADAMW, 1, chunks[c], &t);
            run_steps(&pg, &t, p0, g, STEPS, p);
            const opt_mem *ref = kind ? &b : &a;
            int same = same_bytes(p, kind ? ref8 : ref32, P * 4) &&
                       same_bytes(pg.o.m, ref->o.m, pg.o.n32 * 4) && same_bytes(pg.o.v, ref->o.v, pg.o.n32 * 4) &&
                       same_bytes(pg.o.qm, ref->o.qm, pg.o.n8) && same_bytes(pg.o.qv, ref->o.qv, pg.o.n8) &&
                       same_bytes(pg.o.am, ref->o.am, pg.o.nblk * 4) && same_bytes(pg.o.av, ref->o.av, pg.o.nblk * 4);
            CHECKF(same, "paged %s with %zu-byte chunks: bitwise the unpaged result", kind ? "8-bit" : "fp32",
                   chunks[c]);
            CHECKF(pg.planned[SNUG_MEM_OPTIM] == ref->planned[SNUG_MEM_OPTIM] - (kind ? 2048 : 0),
                   "paged state is the same bytes (maps on the device)");
            CHECKF(pg.o.stage_bytes <= (chunks[c] ? chunks[c] : SNUG_PAGED_CHUNK_BYTES) + 6 * 64,
                   "a staging slot holds one chunk (%zu bytes)", pg.o.stage_bytes);
            opt_free(&pg);
        }
    printf("  paged state streamed in chunks of 520 B .. 16 MiB: bitwise the unpaged result, fp32 and 8-bit\n");
    opt_free(&a);
    opt_free(&b);

    /* the plan and the engine: the paged state is host memory, outside the device total */
    snug_plan_spec spec = {.cfg = cfg, .B = 1, .T = 8, .lv = {.ckpt_every = 1}, .with_grads = 1};
    snug_plan p32, p8, pp;
    CHECK(snug_plan_run(&p32, &spec, &e) == 0);
    spec.optim = SNUG_OPTIM_ADAMW_8BIT;
    CHECK(snug_plan_run(&p8, &spec, &e) == 0);
    spec.optim_paged = 1;
    CHECK(snug_plan_run(&pp, &spec, &e) == 0);
    CHECK(p32.bytes[SNUG_MEM_OPTIM] == a.planned[SNUG_MEM_OPTIM] &&
          p8.bytes[SNUG_MEM_OPTIM] == b.planned[SNUG_MEM_OPTIM]);
    CHECK(!p8.host[SNUG_MEM_OPTIM] && pp.host[SNUG_MEM_OPTIM]);
    size_t dev = 0;
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        dev += c == SNUG_MEM_OPTIM ? 0 : pp.bytes[c];
    CHECKF(pp.host_total == pp.bytes[SNUG_MEM_OPTIM] && pp.total == dev &&
               pp.bytes[SNUG_MEM_OPTIM] == p8.bytes[SNUG_MEM_OPTIM] - 2048,
           "paged plan: the state (%zu B) in host memory, outside the device total (%zu B)", pp.host_total, pp.total);
    snug_engine eng;
    CHECK(snug_engine_create(&eng, &spec, SNUG_BACKEND_CPU, 2, &e) == 0);
    CHECK(eng.opt.paged && eng.opt.kind == SNUG_OPTIM_ADAMW_8BIT);
    CHECKF(pp.bytes[SNUG_MEM_WORKSPACE] == p8.bytes[SNUG_MEM_WORKSPACE] + 2048 + eng.opt.stage_bytes &&
               !eng.opt.stage[1],
           "the maps and one staging slot (the state is one chunk) are device workspace");
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        CHECKF(eng.arenas.a[c].peak == pp.bytes[c], "engine carves the planned %s",
               snug_category_name((snug_category)c));
    snug_model_init_random(&eng.model, 3);
    memcpy(eng.model.grads, g[0], P * 4);
    eng.opt.beta1 = 0.9, eng.opt.beta2 = 0.999, eng.opt.eps = 1e-8;
    snug_adamw_step(&eng.opt, eng.be, &eng.model.table, eng.model.params, eng.model.grads, 1e-3, 1.0f);
    int finite = 1;
    for (size_t i = 0; i < P; i++)
        finite &= isfinite(eng.model.params[i]);
    CHECK(finite);
    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    snug_plan_print(f, &pp, NULL);
    fclose(f);
    CHECKF(strstr(txt, "optimizer state (paged, host)") && strstr(txt, "total in host memory"),
           "the plan shows the paged state as host memory:\n%s", txt);
    free(txt);
    snug_engine_free(&eng);

    free(p0), free(ref32), free(ref8), free(p);
    for (int s = 0; s < STEPS; s++)
        free(g[s]);
    snug_param_table_free(&t);
}

int main(void) {
    be1 = snug_backend_cpu_create(1);
    be2 = snug_backend_cpu_create(2);
    be3 = snug_backend_cpu_create(3);
    CHECK(be1 && be2 && be3);
    if (!be1 || !be2 || !be3)
        return check_finish("test_adamw8bit");
    snug_dynamic_map(map_s, 1);
    snug_dynamic_map(map_u, 0);
    test_maps();
    test_quantize();
    test_step();
    test_optimizer();
    be1->destroy(be1);
    be2->destroy(be2);
    be3->destroy(be3);
    return check_finish("test_adamw8bit");
}
