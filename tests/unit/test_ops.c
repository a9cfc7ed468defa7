/* test_ops.c: every CPU backend op against a naive double-precision reference written here.
 *
 * For each op, on random data of awkward sizes (nothing a multiple of a tile): the forward against the reference;
 * the backward against the reference's analytic gradients and against central finite differences of the reference
 * forward (loss L = sum(out * random weights), so dL/dout is the weights); that gradient outputs accumulate (+=) and
 * that NULL ones are skipped; and bitwise equality across 1, 2 and 3 threads where backend.h promises determinism. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/expf_cpu.h"
#include "check.h"
#include "core/rng.h"
#include "model/model.h"

static snug_backend *be1, *be2, *be3; /* 1, 2 and 3 threads; be2 is the one under test, the others for determinism */

/* ------------------------------------------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint64_t rng_next(void) { return snug_splitmix64(&rng_state); }

static double urand(void) { return (double)(rng_next() >> 11) * 0x1.0p-53; } /* [0,1) */
static int irand(int n) { return (int)(rng_next() % (uint64_t)n); }

/* n floats uniform in [lo, hi) */
static float *randf(size_t n, float lo, float hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}

static float *zerof(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
static double *zerod(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

static float *copyf(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double *tod(const float *x, size_t n) {
    double *y = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static double wdot(const double *a, const float *w, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * w[i];
    return s;
}

static void expect(const char *what, double err, double tol) {
    printf("  %-44s max err %9.2e  (tol %.0e)\n", what, err, tol);
    CHECKF(err <= tol, "%s: error %.3e above %.1e", what, err, tol);
}

/* The largest |after - (init + fresh)|, relative to the largest |init + fresh|: a gradient output that was given
 * `init` and received `fresh` (what the same op wrote into zeros) must hold their sum. */
static double accum_err(const float *after, const float *init, const float *fresh, size_t n) {
    double *want = zerod(n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)init[i] + fresh[i];
    double e = check_max_relerr(after, want, n);
    free(want);
    return e;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

typedef double (*loss_fn)(void *ctx);

/* Central differences of the loss f(ctx) with respect to each x[i], in double; x is an input f reads via ctx. */
static void fd_grad(loss_fn f, void *ctx, double *x, size_t n, double *g) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-5 * fmax(1.0, fabs(x0));
        x[i] = x0 + h;
        double lp = f(ctx);
        x[i] = x0 - h;
        double lm = f(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2 * h);
    }
}

/* Finite differences of f w.r.t. x (n) compared with the op's fp32 gradient. */
static void expect_fd(const char *what, loss_fn f, void *ctx, double *x, size_t n, const float *grad, double tol) {
    double *g = zerod(n);
    fd_grad(f, ctx, x, n, g);
    expect(what, check_max_relerr(grad, g, n), tol);
    free(g);
}

#define TOL_REF 1e-5 /* fp32 op vs double reference */
#define TOL_FD 1e-4  /* fp32 gradient vs finite differences of the double reference */
#define TOL_ACC 1e-6 /* accumulation: init + fresh, one rounding */

/* ------------------------------------------------------------------------------------------------ memory */

static void test_memory(void) {
    printf("memory\n");
    float *p = be2->alloc(be2, 100);
    CHECK(p != NULL && (uintptr_t)p % 64 == 0);
    int zero = 1;
    for (int i = 0; i < 32; i++) /* 100 bytes rounded up to 128 */
        zero &= p[i] == 0.0f;
    CHECK(zero);
    float src[25], back[25];
    for (int i = 0; i < 25; i++)
        src[i] = (float)i - 3.5f;
    be2->to_device(be2, p, src, sizeof src);
    be2->to_host(be2, back, p, sizeof back);
    CHECK(same_bits(src, back, 25));
    be2->zero(be2, p, sizeof src);
    CHECK(p[0] == 0.0f && p[24] == 0.0f);
    be2->free(be2, p);
    void *q = be2->alloc(be2, 0);
    CHECK(q != NULL);
    be2->free(be2, q);
    CHECK(be2->nthreads == 2 && be1->nthreads == 1 && strcmp(be2->name, "cpu") == 0);
    snug_backend *all = snug_backend_cpu_create(0);
    CHECK(all != NULL && all->nthreads >= 1);
    all->destroy(all);
}

/* ------------------------------------------------------------------------------------------------ embeddings */

typedef struct {
    int N, C;
    const int32_t *ids;
    double *table;
    const float *wt;
} embed_ctx;

static double embed_loss(void *p) {
    embed_ctx *c = p;
    double L = 0;
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->C; j++)
            L += c->table[(size_t)c->ids[n] * c->C + j] * c->wt[(size_t)n * c->C + j];
    return L;
}

static void test_embed(void) {
    printf("embed\n");
    int N = 7, C = 13, rows = 5;
    int32_t ids[7] = {3, 0, 3, 4, 1, 3, 0}; /* repeats: the scatter must add them */
    float *table = randf((size_t)rows * C, -1, 1), *dout = randf((size_t)N * C, -1, 1);
    float *out = zerof((size_t)N * C);
    be2->embed_fwd(be2, out, ids, table, SNUG_DT_F32, N, C, 0);
    int ok = 1;
    for (int n = 0; n < N; n++)
        ok &= same_bits(out + (size_t)n * C, table + (size_t)ids[n] * C, C);
    CHECKF(ok, "embed_fwd copies rows");
    float *init = copyf(out, (size_t)N * C);
    be2->embed_fwd(be2, out, ids, table, SNUG_DT_F32, N, C, 1);
    double e = 0;
    for (size_t i = 0; i < (size_t)N * C; i++)
        e = fmax(e, fabs(out[i] - 2 * init[i]));
    expect("embed_fwd accumulate", e, 0);

    float *dt = zerof((size_t)rows * C);
    be2->embed_bwd(be2, dt, dout, ids, N, C);
    double *ref = zerod((size_t)rows * C);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++)
            ref[(size_t)ids[n] * C + j] += dout[(size_t)n * C + j];
    expect("embed_bwd vs reference", check_max_relerr(dt, ref, (size_t)rows * C), TOL_REF);
    /* an id of -1 (tensor parallelism: another rank's row) looks up zeros and adds nothing */
    int32_t ids1[7] = {3, -1, 3, 4, -1, 3, 0};
    float *o1 = randf((size_t)N * C, -1, 1), *d1 = copyf(dt, (size_t)rows * C);
    be2->embed_fwd(be2, o1, ids1, table, SNUG_DT_F32, N, C, 0);
    int zero_ok = 1;
    for (int j = 0; j < C; j++)
        zero_ok &= o1[C + j] == 0.0f && o1[4 * C + j] == 0.0f;
    CHECKF(zero_ok && same_bits(o1, table + 3 * C, C), "embed_fwd: -1 looks up a zero row");
    be2->embed_bwd(be2, d1, dout, ids1, N, C);
    double e1 = 0;
    for (int j = 0; j < C; j++) /* row 1 took no token here (ids 1 were -1): it stays as it was */
        e1 = fmax(e1, fabs(d1[C + j] - dt[C + j]));
    expect("embed_bwd: -1 adds nothing", e1, 0);
    free(o1), free(d1);
    embed_ctx ctx = {N, C, ids, tod(table, (size_t)rows * C), dout};
    expect_fd("embed_bwd vs finite differences", embed_loss, &ctx, ctx.table, (size_t)rows * C, dt, TOL_FD);
    float *dt2 = randf((size_t)rows * C, -1, 1), *dt2i = copyf(dt2, (size_t)rows * C);
    be2->embed_bwd(be2, dt2, dout, ids, N, C);
    expect("embed_bwd accumulates", accum_err(dt2, dt2i, dt, (size_t)rows * C), TOL_ACC);

    /* determinism: big enough to run threaded, many tokens on few rows */
    int BN = 300, BC = 333, brows = 7;
    int32_t *bids = malloc(BN * sizeof(int32_t));
    for (int n = 0; n < BN; n++)
        bids[n] = irand(brows);
    float *bd = randf((size_t)BN * BC, -1, 1);
    float *t1 = zerof((size_t)brows * BC), *t2 = zerof((size_t)brows * BC), *t3 = zerof((size_t)brows * BC);
    be1->embed_bwd(be1, t1, bd, bids, BN, BC);
    be2->embed_bwd(be2, t2, bd, bids, BN, BC);
    be3->embed_bwd(be3, t3, bd, bids, BN, BC);
    CHECKF(same_bits(t1, t2, (size_t)brows * BC) && same_bits(t1, t3, (size_t)brows * BC),
           "embed_bwd identical for 1, 2, 3 threads");
    free(table), free(dout), free(out), free(init), free(dt), free(ref), free(ctx.table), free(dt2), free(dt2i);
    free(bids), free(bd), free(t1), free(t2), free(t3);
}

/* ------------------------------------------------------------------------------------------------ normalisation */

/* out (N,C) = (x - mean) * rstd * w + b, mean = 0 and b = 0 for rmsnorm */
static void ref_norm(int layer, double *out, double *mean, double *rstd, const double *x, const double *w,
                     const double *b, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double mu = 0, ss = 0;
        if (layer) {
            for (int j = 0; j < C; j++)
                mu += xr[j];
            mu /= C;
        }
        for (int j = 0; j < C; j++)
            ss += (xr[j] - mu) * (xr[j] - mu);
        double r = 1 / sqrt(ss / C + eps);
        for (int j = 0; j < C; j++)
            out[(size_t)n * C + j] = (xr[j] - mu) * r * w[j] + (layer ? b[j] : 0);
        if (mean)
            mean[n] = mu;
        rstd[n] = r;
    }
}

static void ref_norm_bwd(int layer, double *dx, double *dw, double *db, const float *dout, const double *x,
                         const double *w, int N, int C, double eps) {
    double *mean = zerod(N), *rstd = zerod(N), *out = zerod((size_t)N * C);
    ref_norm(layer, out, mean, rstd, x, w, w, N, C, eps);
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        const float *g = dout + (size_t)n * C;
        double r = rstd[n], mu = mean[n], mdn = 0, mdnx = 0;
        for (int j = 0; j < C; j++) {
            double xhat = (xr[j] - mu) * r;
            mdn += g[j] * w[j] / C;
            mdnx += g[j] * w[j] * xhat / C;
            dw[j] += g[j] * xhat;
            if (db)
                db[j] += g[j];
        }
        for (int j = 0; j < C; j++) {
            double xhat = (xr[j] - mu) * r;
            dx[(size_t)n * C + j] = r * (g[j] * w[j] - (layer ? mdn : 0) - xhat * mdnx);
        }
    }
    free(mean), free(rstd), free(out);
}

typedef struct {
    int layer, N, C;
    double *x, *w, *b, eps;
    const float *wt;
} norm_ctx;

static double norm_loss(void *p) {
    norm_ctx *c = p;
    size_t n = (size_t)c->N * c->C;
    double *out = zerod(n), *mean = zerod(c->N), *rstd = zerod(c->N);
    ref_norm(c->layer, out, mean, rstd, c->x, c->w, c->b, c->N, c->C, c->eps);
    double L = wdot(out, c->wt, n);
    free(out), free(mean), free(rstd);
    return L;
}

static void test_norm(int layer) {
    const char *nm = layer ? "layernorm" : "rmsnorm";
    char what[96];
    printf("%s\n", nm);
    int N = 7, C = 13;
    size_t NC = (size_t)N * C;
    float eps = 1e-5f;
    float *x = randf(NC, -0.7f, 1.3f), *w = randf(C, 0.5f, 1.5f), *b = randf(C, -0.5f, 0.5f);
    float *dout = randf(NC, -1, 1);
    float *out = zerof(NC), *mean = zerof(N), *rstd = zerof(N);
    if (layer)
        be2->layernorm_fwd(be2, out, mean, rstd, x, w, b, N, C, eps);
    else
        be2->rmsnorm_fwd(be2, out, rstd, x, w, N, C, eps);
    double *xd = tod(x, NC), *wd = tod(w, C), *bd = tod(b, C);
    double *rout = zerod(NC), *rmean = zerod(N), *rrstd = zerod(N);
    ref_norm(layer, rout, rmean, rrstd, xd, wd, bd, N, C, eps);
    snprintf(what, sizeof what, "%s_fwd out", nm);
    expect(what, check_max_relerr(out, rout, NC), TOL_REF);
    snprintf(what, sizeof what, "%s_fwd rstd", nm);
    expect(what, check_max_relerr(rstd, rrstd, N), TOL_REF);
    if (layer)
        expect("layernorm_fwd mean", check_max_relerr(mean, rmean, N), TOL_REF);

    float *dx = zerof(NC), *dw = zerof(C), *db = zerof(C);
    if (layer)
        be2->layernorm_bwd(be2, dx, dw, db, dout, x, w, mean, rstd, N, C);
    else
        be2->rmsnorm_bwd(be2, dx, dw, dout, x, w, rstd, N, C);
    double *rdx = zerod(NC), *rdw = zerod(C), *rdb = zerod(C);
    ref_norm_bwd(layer, rdx, rdw, layer ? rdb : NULL, dout, xd, wd, N, C, eps);
    snprintf(what, sizeof what, "%s_bwd dinp vs reference", nm);
    expect(what, check_max_relerr(dx, rdx, NC), TOL_REF);
    snprintf(what, sizeof what, "%s_bwd dw vs reference", nm);
    expect(what, check_max_relerr(dw, rdw, C), TOL_REF);
    if (layer)
        expect("layernorm_bwd db vs reference", check_max_relerr(db, rdb, C), TOL_REF);

    norm_ctx ctx = {layer, N, C, xd, wd, bd, eps, dout};
    snprintf(what, sizeof what, "%s_bwd dinp vs finite differences", nm);
    expect_fd(what, norm_loss, &ctx, xd, NC, dx, TOL_FD);
    snprintf(what, sizeof what, "%s_bwd dw vs finite differences", nm);
    expect_fd(what, norm_loss, &ctx, wd, C, dw, TOL_FD);
    if (layer)
        expect_fd("layernorm_bwd db vs finite differences", norm_loss, &ctx, bd, C, db, TOL_FD);

    /* accumulation, one output at a time with the others NULL */
    float *ax = randf(NC, -1, 1), *axi = copyf(ax, NC), *aw = randf(C, -1, 1), *awi = copyf(aw, C);
    float *ab = randf(C, -1, 1), *abi = copyf(ab, C);
    if (layer) {
        be2->layernorm_bwd(be2, ax, NULL, NULL, dout, x, w, mean, rstd, N, C);
        be2->layernorm_bwd(be2, NULL, aw, NULL, dout, x, w, mean, rstd, N, C);
        be2->layernorm_bwd(be2, NULL, NULL, ab, dout, x, w, mean, rstd, N, C);
        expect("layernorm_bwd db alone accumulates", accum_err(ab, abi, db, C), TOL_ACC);
    } else {
        be2->rmsnorm_bwd(be2, ax, NULL, dout, x, w, rstd, N, C);
        be2->rmsnorm_bwd(be2, NULL, aw, dout, x, w, rstd, N, C);
    }
    snprintf(what, sizeof what, "%s_bwd dinp alone accumulates", nm);
    expect(what, accum_err(ax, axi, dx, NC), TOL_ACC);
    snprintf(what, sizeof what, "%s_bwd dw alone accumulates", nm);
    expect(what, accum_err(aw, awi, dw, C), TOL_ACC);

    /* determinism of the threaded column reductions */
    int BN = 97, BC = 301;
    float *bx = randf((size_t)BN * BC, -1, 1), *bg = randf((size_t)BN * BC, -1, 1), *bw = randf(BC, 0.5f, 1.5f);
    float *bm = zerof(BN), *br = zerof(BN), *bo = zerof((size_t)BN * BC);
    float *w1 = zerof(BC), *w2 = zerof(BC), *b1 = zerof(BC), *b2 = zerof(BC);
    if (layer) {
        be2->layernorm_fwd(be2, bo, bm, br, bx, bw, bw, BN, BC, eps);
        be1->layernorm_bwd(be1, NULL, w1, b1, bg, bx, bw, bm, br, BN, BC);
        be2->layernorm_bwd(be2, NULL, w2, b2, bg, bx, bw, bm, br, BN, BC);
    } else {
        be2->rmsnorm_fwd(be2, bo, br, bx, bw, BN, BC, eps);
        be1->rmsnorm_bwd(be1, NULL, w1, bg, bx, bw, br, BN, BC);
        be2->rmsnorm_bwd(be2, NULL, w2, bg, bx, bw, br, BN, BC);
    }
    CHECKF(same_bits(w1, w2, BC) && same_bits(b1, b2, BC), "%s_bwd identical for 1 and 2 threads", nm);

    free(x), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(xd), free(wd), free(bd);
    free(rout), free(rmean), free(rrstd), free(dx), free(dw), free(db), free(rdx), free(rdw), free(rdb);
    free(ax), free(axi), free(aw), free(awi), free(ab), free(abi);
    free(bx), free(bg), free(bw), free(bm), free(br), free(bo), free(w1), free(w2), free(b1), free(b2);
}

/* ------------------------------------------------------------------------------------------------ linear layers */

static void ref_matmul(double *out, const double *x, const double *w, const double *b, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0;
            for (int j = 0; j < C; j++)
                s += x[(size_t)n * C + j] * w[(size_t)o * C + j];
            out[(size_t)n * OC + o] = s;
        }
}

typedef struct {
    int N, C, OC;
    double *x, *w, *b;
    const float *wt;
} matmul_ctx;

static double matmul_loss(void *p) {
    matmul_ctx *c = p;
    double *out = zerod((size_t)c->N * c->OC);
    ref_matmul(out, c->x, c->w, c->b, c->N, c->C, c->OC);
    double L = wdot(out, c->wt, (size_t)c->N * c->OC);
    free(out);
    return L;
}

static void test_matmul(void) {
    printf("matmul\n");
    int N = 7, C = 13, OC = 9;
    float *x = randf((size_t)N * C, -1, 1), *w = randf((size_t)OC * C, -1, 1), *b = randf(OC, -1, 1);
    float *dout = randf((size_t)N * OC, -1, 1);
    double *xd = tod(x, (size_t)N * C), *wd = tod(w, (size_t)OC * C), *bd = tod(b, OC);
    double *ref = zerod((size_t)N * OC);
    float *out = randf((size_t)N * OC, -9, 9); /* garbage: the forward overwrites */
    be2->matmul_fwd(be2, out, x, w, b, N, C, OC);
    ref_matmul(ref, xd, wd, bd, N, C, OC);
    expect("matmul_fwd with bias", check_max_relerr(out, ref, (size_t)N * OC), TOL_REF);
    be2->matmul_fwd(be2, out, x, w, NULL, N, C, OC);
    ref_matmul(ref, xd, wd, NULL, N, C, OC);
    expect("matmul_fwd without bias", check_max_relerr(out, ref, (size_t)N * OC), TOL_REF);

    float *dx = zerof((size_t)N * C), *dw = zerof((size_t)OC * C), *db = zerof(OC);
    be2->matmul_bwd(be2, dx, dw, db, dout, x, w, N, C, OC);
    double *rdx = zerod((size_t)N * C), *rdw = zerod((size_t)OC * C), *rdb = zerod(OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double g = dout[(size_t)n * OC + o];
            rdb[o] += g;
            for (int j = 0; j < C; j++) {
                rdx[(size_t)n * C + j] += g * wd[(size_t)o * C + j];
                rdw[(size_t)o * C + j] += g * xd[(size_t)n * C + j];
            }
        }
    expect("matmul_bwd dinp vs reference", check_max_relerr(dx, rdx, (size_t)N * C), TOL_REF);
    expect("matmul_bwd dw vs reference", check_max_relerr(dw, rdw, (size_t)OC * C), TOL_REF);
    expect("matmul_bwd dbias vs reference", check_max_relerr(db, rdb, OC), TOL_REF);
    matmul_ctx ctx = {N, C, OC, xd, wd, bd, dout};
    expect_fd("matmul_bwd dinp vs finite differences", matmul_loss, &ctx, xd, (size_t)N * C, dx, TOL_FD);
    expect_fd("matmul_bwd dw vs finite differences", matmul_loss, &ctx, wd, (size_t)OC * C, dw, TOL_FD);
    expect_fd("matmul_bwd dbias vs finite differences", matmul_loss, &ctx, bd, OC, db, TOL_FD);

    float *ax = randf((size_t)N * C, -1, 1), *axi = copyf(ax, (size_t)N * C);
    float *aw = randf((size_t)OC * C, -1, 1), *awi = copyf(aw, (size_t)OC * C);
    float *ab = randf(OC, -1, 1), *abi = copyf(ab, OC);
    be2->matmul_bwd(be2, ax, NULL, NULL, dout, x, w, N, C, OC);
    be2->matmul_bwd(be2, NULL, aw, NULL, dout, x, w, N, C, OC);
    be2->matmul_bwd(be2, NULL, NULL, ab, dout, x, w, N, C, OC);
    expect("matmul_bwd dinp alone accumulates", accum_err(ax, axi, dx, (size_t)N * C), TOL_ACC);
    expect("matmul_bwd dw alone accumulates", accum_err(aw, awi, dw, (size_t)OC * C), TOL_ACC);
    expect("matmul_bwd dbias alone accumulates", accum_err(ab, abi, db, OC), TOL_ACC);

    int BN = 211, BOC = 157;
    float *bg = randf((size_t)BN * BOC, -1, 1), *b1 = zerof(BOC), *b2 = zerof(BOC);
    be1->matmul_bwd(be1, NULL, NULL, b1, bg, NULL, NULL, BN, 1, BOC);
    be2->matmul_bwd(be2, NULL, NULL, b2, bg, NULL, NULL, BN, 1, BOC);
    CHECKF(same_bits(b1, b2, BOC), "matmul_bwd dbias identical for 1 and 2 threads");

    free(x), free(w), free(b), free(dout), free(xd), free(wd), free(bd), free(ref), free(out);
    free(dx), free(dw), free(db), free(rdx), free(rdw), free(rdb);
    free(ax), free(axi), free(aw), free(awi), free(ab), free(abi), free(bg), free(b1), free(b2);
}

/* ------------------------------------------------------------------------------------------------ rope */

static void ref_rope(double *x, const int32_t *pos, const float *ct, const float *st, int N, int H, int HD,
                     int stride) {
    int half = HD / 2;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                double *xh = x + (size_t)n * stride + (size_t)h * HD;
                double c = ct[(size_t)pos[n] * half + i], s = st[(size_t)pos[n] * half + i];
                double x0 = xh[i], x1 = xh[i + half];
                xh[i] = x0 * c - x1 * s;
                xh[i + half] = x1 * c + x0 * s;
            }
}

typedef struct {
    int N, H, HD, stride;
    const int32_t *pos;
    const float *ct, *st, *wt;
    double *x;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    size_t n = (size_t)c->N * c->stride;
    double *y = malloc(n * sizeof(double));
    memcpy(y, c->x, n * sizeof(double));
    ref_rope(y, c->pos, c->ct, c->st, c->N, c->H, c->HD, c->stride);
    double L = wdot(y, c->wt, n);
    free(y);
    return L;
}

static void test_rope(void) {
    printf("rope\n");
    int N = 7, H = 3, HD = 10, stride = 3 * 10 + 7, max_pos = 19, half = HD / 2;
    size_t n = (size_t)N * stride;
    float *ct = zerof((size_t)max_pos * half), *st = zerof((size_t)max_pos * half);
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < half; i++) {
            double ang = p * pow(10000.0, -2.0 * i / HD);
            ct[p * half + i] = (float)cos(ang);
            st[p * half + i] = (float)sin(ang);
        }
    int32_t pos[7];
    for (int i = 0; i < N; i++)
        pos[i] = irand(max_pos);
    float *x = randf(n, -1, 1), *x0 = copyf(x, n), *dout = randf(n, -1, 1);
    be2->rope_fwd(be2, x, pos, ct, st, N, H, HD, stride);
    double *ref = tod(x0, n);
    ref_rope(ref, pos, ct, st, N, H, HD, stride);
    expect("rope_fwd vs reference", check_max_relerr(x, ref, n), TOL_REF);
    int pad_ok = 1; /* floats past the H heads of each row are not touched */
    for (int r = 0; r < N; r++)
        pad_ok &= same_bits(x + (size_t)r * stride + H * HD, x0 + (size_t)r * stride + H * HD, stride - H * HD);
    CHECKF(pad_ok, "rope_fwd leaves the rest of the row alone");

    float *dx = copyf(dout, n);
    be2->rope_bwd(be2, dx, pos, ct, st, N, H, HD, stride);
    rope_ctx ctx = {N, H, HD, stride, pos, ct, st, dout, tod(x0, n)};
    expect_fd("rope_bwd vs finite differences", rope_loss, &ctx, ctx.x, n, dx, TOL_FD);
    be2->rope_bwd(be2, x, pos, ct, st, N, H, HD, stride); /* the inverse: back to x0 */
    double *x0d = tod(x0, n);
    expect("rope_bwd(rope_fwd(x)) == x", check_max_relerr(x, x0d, n), TOL_REF);
    free(ct), free(st), free(x), free(x0), free(dout), free(ref), free(dx), free(ctx.x), free(x0d);
}

/* ------------------------------------------------------------------------------------------------ attention */

/* The first key query t sees: its segment's start, and under a sliding window of W keys (W > 0) none that is W or
 * more tokens back (transformers' mask keeps s when t - s < W). */
static int ref_first_key(const int32_t *seg, size_t n, int t, int W) {
    int lo = seg ? seg[n] : 0;
    while (W > 0 && t - lo >= W)
        lo++;
    return lo;
}

/* Naive attention of one batch row, head and query token: probabilities p (T) over keys [lo, t], out (HD). */
static double ref_att_row(double *p, double *o, const double *qkv, const int32_t *seg, int W, int b, int h, int t,
                          int T, int NH, int NKV, int HD, double scale) {
    int R = (NH + 2 * NKV) * HD, kh = h / (NH / NKV);
    size_t n = (size_t)b * T + t;
    int lo = ref_first_key(seg, n, t, W);
    const double *q = qkv + n * R + (size_t)h * HD;
    double mx = -INFINITY, sum = 0;
    for (int s = lo; s <= t; s++) {
        const double *k = qkv + ((size_t)b * T + s) * R + (size_t)(NH + kh) * HD;
        double d = 0;
        for (int i = 0; i < HD; i++)
            d += q[i] * k[i];
        p[s] = d * scale;
        mx = fmax(mx, p[s]);
    }
    for (int s = lo; s <= t; s++)
        sum += exp(p[s] - mx);
    for (int i = 0; i < HD; i++)
        o[i] = 0;
    for (int s = lo; s <= t; s++) {
        p[s] = exp(p[s] - mx) / sum;
        const double *v = qkv + ((size_t)b * T + s) * R + (size_t)(NH + NKV + kh) * HD;
        for (int i = 0; i < HD; i++)
            o[i] += p[s] * v[i];
    }
    return mx + log(sum); /* lse */
}

static void ref_attention(double *out, double *lse, const double *qkv, const int32_t *seg, int W, int B, int T,
                          int NH, int NKV, int HD, double scale) {
    double *p = zerod(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)b * T + t;
                double l = ref_att_row(p, out + n * NH * HD + (size_t)h * HD, qkv, seg, W, b, h, t, T, NH, NKV,
                                       HD, scale);
                if (lse)
                    lse[n * NH + h] = l;
            }
    free(p);
}

static void ref_attention_bwd(double *dqkv, const float *dout, const double *qkv, const int32_t *seg, int W, int B,
                              int T, int NH, int NKV, int HD, double scale) {
    int R = (NH + 2 * NKV) * HD, G = NH / NKV;
    double *p = zerod(T), *dp = zerod(T), *o = zerod(HD);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)b * T + t;
                int lo = ref_first_key(seg, n, t, W), kh = h / G;
                ref_att_row(p, o, qkv, seg, W, b, h, t, T, NH, NKV, HD, scale);
                const float *g = dout + n * NH * HD + (size_t)h * HD;
                double D = 0;
                for (int s = lo; s <= t; s++) {
                    const double *v = qkv + ((size_t)b * T + s) * R + (size_t)(NH + NKV + kh) * HD;
                    dp[s] = 0;
                    for (int i = 0; i < HD; i++)
                        dp[s] += g[i] * v[i];
                    D += p[s] * dp[s];
                }
                for (int s = lo; s <= t; s++) {
                    size_t ks = ((size_t)b * T + s) * R + (size_t)(NH + kh) * HD, vs = ks + (size_t)NKV * HD;
                    double ds = p[s] * (dp[s] - D) * scale;
                    for (int i = 0; i < HD; i++) {
                        dqkv[n * R + (size_t)h * HD + i] += ds * qkv[ks + i];
                        dqkv[ks + i] += ds * qkv[n * R + (size_t)h * HD + i];
                        dqkv[vs + i] += p[s] * g[i];
                    }
                }
            }
    free(p), free(dp), free(o);
}

typedef struct {
    int B, T, NH, NKV, HD, W;
    double scale, *qkv;
    const int32_t *seg;
    const float *wt;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    size_t n = (size_t)c->B * c->T * c->NH * c->HD;
    double *out = zerod(n);
    ref_attention(out, NULL, c->qkv, c->seg, c->W, c->B, c->T, c->NH, c->NKV, c->HD, c->scale);
    double L = wdot(out, c->wt, n);
    free(out);
    return L;
}

/* seg_start of each token for the given segment lengths of each batch row (lens summing to T, 0-terminated) */
static int32_t *make_seg(int B, int T, const int *lens) {
    int32_t *seg = malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0, k = 0; b < B; b++, k++) {
        int t = 0;
        for (; lens[k]; k++) {
            for (int j = 0; j < lens[k]; j++)
                seg[(size_t)b * T + t + j] = t;
            t += lens[k];
        }
    }
    return seg;
}

/* qkv uniform in [-amp, amp). With `spike`, queries and keys are made positive and the keys of the last third of
 * each row 30 times larger, so that late keys score far above early ones, further than exp() can span: the online
 * softmax must rescale its running sums. W > 0: a sliding window of W keys, which the ops take as the first keys the
 * model computes (snug_attention_window_starts) and the reference applies as transformers' mask. */
static void test_attention_case(const char *label, int B, int T, int NH, int NKV, int HD, const int *lens, int W,
                                float amp, int spike, int fd) {
    printf("attention %s: B=%d T=%d NH=%d NKV=%d HD=%d%s%s window %d\n", label, B, T, NH, NKV, HD,
           lens ? " segmented" : "", spike ? " spiked" : "", W);
    char what[96];
    int N = B * T, R = (NH + 2 * NKV) * HD;
    size_t nq = (size_t)N * R, no = (size_t)N * NH * HD;
    float scale = 1.0f / sqrtf((float)HD);
    double tol = spike ? 4 * TOL_REF : TOL_REF; /* scores near 100 carry 100 times the rounding into exp() */
    int32_t *rseg = lens ? make_seg(B, T, lens) : NULL, *seg = rseg; /* the reference's, the ops' */
    if (W > 0) {
        seg = malloc((size_t)N * sizeof *seg);
        snug_attention_window_starts(seg, rseg, 0, (size_t)N, T, W);
    }
    float *qkv = randf(nq, -amp, amp), *dout = randf(no, -1, 1);
    for (int n = 0; spike && n < N; n++)
        for (int i = 0; i < (NH + NKV) * HD; i++)
            qkv[(size_t)n * R + i] = fabsf(qkv[(size_t)n * R + i]) * (i >= NH * HD && n % T >= 2 * T / 3 ? 30 : 1);
    float *out = zerof(no), *lse = zerof((size_t)N * NH);
    be2->attention_fwd(be2, out, lse, qkv, seg, B, T, NH, NKV, HD, scale);
    double *qd = tod(qkv, nq), *rout = zerod(no), *rlse = zerod((size_t)N * NH);
    ref_attention(rout, rlse, qd, rseg, W, B, T, NH, NKV, HD, scale);
    snprintf(what, sizeof what, "attention_fwd out (%s)", label);
    expect(what, check_max_relerr(out, rout, no), tol);
    snprintf(what, sizeof what, "attention_fwd lse (%s)", label);
    expect(what, check_max_relerr(lse, rlse, (size_t)N * NH), tol);

    float *dq = zerof(nq);
    be2->attention_bwd(be2, dq, dout, qkv, out, lse, seg, B, T, NH, NKV, HD, scale);
    double *rdq = zerod(nq);
    ref_attention_bwd(rdq, dout, qd, rseg, W, B, T, NH, NKV, HD, scale);
    snprintf(what, sizeof what, "attention_bwd dqkv vs reference (%s)", label);
    expect(what, check_max_relerr(dq, rdq, nq), tol);
    if (fd) {
        att_ctx ctx = {B, T, NH, NKV, HD, W, scale, qd, rseg, dout};
        snprintf(what, sizeof what, "attention_bwd dqkv vs finite diff (%s)", label);
        expect_fd(what, att_loss, &ctx, qd, nq, dq, TOL_FD);
    }
    float *acc = randf(nq, -1, 1), *acci = copyf(acc, nq);
    be2->attention_bwd(be2, acc, dout, qkv, out, lse, seg, B, T, NH, NKV, HD, scale);
    snprintf(what, sizeof what, "attention_bwd accumulates (%s)", label);
    expect(what, accum_err(acc, acci, dq, nq), 10 * TOL_ACC); /* dk, dv sum T terms straight into the output */

    float *o1 = zerof(no), *l1 = zerof((size_t)N * NH), *o3 = zerof(no), *l3 = zerof((size_t)N * NH);
    float *d1 = zerof(nq), *d3 = zerof(nq);
    be1->attention_fwd(be1, o1, l1, qkv, seg, B, T, NH, NKV, HD, scale);
    be3->attention_fwd(be3, o3, l3, qkv, seg, B, T, NH, NKV, HD, scale);
    be1->attention_bwd(be1, d1, dout, qkv, out, lse, seg, B, T, NH, NKV, HD, scale);
    be3->attention_bwd(be3, d3, dout, qkv, out, lse, seg, B, T, NH, NKV, HD, scale);
    CHECKF(same_bits(o1, out, no) && same_bits(o3, out, no) && same_bits(l1, lse, (size_t)N * NH) &&
               same_bits(l3, lse, (size_t)N * NH),
           "attention_fwd identical for 1, 2, 3 threads (%s)", label);
    CHECKF(same_bits(d1, dq, nq) && same_bits(d3, dq, nq), "attention_bwd identical for 1, 2, 3 threads (%s)", label);

    if (seg != rseg)
        free(seg);
    free(rseg), free(qkv), free(dout), free(out), free(lse), free(qd), free(rout), free(rlse), free(dq), free(rdq);
    free(acc), free(acci), free(o1), free(l1), free(o3), free(l3), free(d1), free(d3);
}

static void test_attention(void) {
    static const int lens_a[] = {3, 1, 7, 0, 5, 6, 0};         /* B=2, T=11: uneven, a 1-token segment */
    static const int lens_b[] = {37, 64, 1, 48, 0};            /* B=1, T=150: segments across the key blocks */
    static const int lens_c[] = {2, 3, 0, 5, 0, 1, 1, 1, 2, 0}; /* B=3, T=5 */
    static const int lens_d[] = {5, 20, 12, 0};                 /* B=1, T=37: segments across query tiles */
    test_attention_case("gqa 6/2 seg", 2, 11, 6, 2, 8, lens_a, 0, 1.5f, 0, 1);
    test_attention_case("gqa 6/3", 2, 11, 6, 3, 8, NULL, 0, 1.5f, 0, 1);
    test_attention_case("mha 3/3 seg", 3, 5, 3, 3, 6, lens_c, 0, 1.5f, 0, 1);
    test_attention_case("tiles seg hd5", 1, 37, 2, 1, 5, lens_d, 0, 1.5f, 0, 1);
    test_attention_case("long seg", 1, 150, 4, 2, 10, lens_b, 0, 1.5f, 0, 0);
    test_attention_case("long", 2, 131, 2, 1, 12, NULL, 0, 1.5f, 0, 0);
    test_attention_case("long, spiked", 1, 200, 2, 2, 16, NULL, 0, 1.5f, 1, 0);
    /* sliding windows: of 1 key (itself), shorter and longer than a segment, across query tiles and key blocks */
    test_attention_case("window 4", 2, 11, 6, 2, 8, NULL, 4, 1.5f, 0, 1);
    test_attention_case("window 1 seg", 2, 11, 6, 3, 8, lens_a, 1, 1.5f, 0, 1);
    test_attention_case("window 6 seg, tiles", 1, 37, 2, 1, 5, lens_d, 6, 1.5f, 0, 1);
    test_attention_case("window 70 seg, long", 1, 150, 4, 2, 10, lens_b, 70, 1.5f, 0, 0);
    test_attention_case("window 20, long", 2, 131, 2, 1, 12, NULL, 20, 1.5f, 0, 0);
}

/* ------------------------------------------------------------------------------------------------ activations */

typedef struct {
    int N, I;
    double *x;
    const float *wt;
    int gelu; /* else swiglu */
} act_ctx;

static double ref_gelu(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double ref_silu(double x) { return x / (1 + exp(-x)); }

static double act_loss(void *p) {
    act_ctx *c = p;
    double L = 0;
    for (int n = 0; n < c->N; n++)
        for (int i = 0; i < c->I; i++) {
            double y = c->gelu ? ref_gelu(c->x[(size_t)n * c->I + i])
                               : ref_silu(c->x[(size_t)n * 2 * c->I + i]) * c->x[(size_t)n * 2 * c->I + c->I + i];
            L += y * c->wt[(size_t)n * c->I + i];
        }
    return L;
}

static void test_activations(void) {
    printf("swiglu\n");
    int N = 7, I = 9;
    size_t ni = (size_t)N * I;
    float *gu = randf(2 * ni, -4, 4), *dout = randf(ni, -1, 1), *out = zerof(ni);
    be2->swiglu_fwd(be2, out, gu, N, I);
    double *ref = zerod(ni), *rd = zerod(2 * ni);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            double g = gu[(size_t)n * 2 * I + i], u = gu[(size_t)n * 2 * I + I + i], s = 1 / (1 + exp(-g));
            double d = dout[(size_t)n * I + i];
            ref[(size_t)n * I + i] = g * s * u;
            rd[(size_t)n * 2 * I + i] = d * u * s * (1 + g * (1 - s));
            rd[(size_t)n * 2 * I + I + i] = d * g * s;
        }
    expect("swiglu_fwd vs reference", check_max_relerr(out, ref, ni), TOL_REF);
    float *dgu = zerof(2 * ni);
    be2->swiglu_bwd(be2, dgu, dout, gu, N, I);
    expect("swiglu_bwd vs reference", check_max_relerr(dgu, rd, 2 * ni), TOL_REF);
    act_ctx ctx = {N, I, tod(gu, 2 * ni), dout, 0};
    expect_fd("swiglu_bwd vs finite differences", act_loss, &ctx, ctx.x, 2 * ni, dgu, TOL_FD);
    float *acc = randf(2 * ni, -1, 1), *acci = copyf(acc, 2 * ni);
    be2->swiglu_bwd(be2, acc, dout, gu, N, I);
    expect("swiglu_bwd accumulates", accum_err(acc, acci, dgu, 2 * ni), TOL_ACC);
    free(gu), free(dout), free(out), free(ref), free(rd), free(dgu), free(ctx.x), free(acc), free(acci);

    printf("gelu\n");
    size_t n = 101;
    float *x = randf(n, -5, 5), *g = randf(n, -1, 1), *y = zerof(n);
    be2->gelu_fwd(be2, y, x, n);
    double *gref = zerod(n), *gdref = zerod(n);
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], k = sqrt(2 / M_PI), th = tanh(k * (xi + 0.044715 * xi * xi * xi));
        gref[i] = ref_gelu(xi);
        gdref[i] = g[i] * (0.5 * (1 + th) + 0.5 * xi * (1 - th * th) * k * (1 + 3 * 0.044715 * xi * xi));
    }
    expect("gelu_fwd vs reference", check_max_relerr(y, gref, n), TOL_REF);
    float *dx = zerof(n);
    be2->gelu_bwd(be2, dx, g, x, n);
    expect("gelu_bwd vs reference", check_max_relerr(dx, gdref, n), TOL_REF);
    act_ctx gctx = {1, (int)n, tod(x, n), g, 1};
    expect_fd("gelu_bwd vs finite differences", act_loss, &gctx, gctx.x, n, dx, TOL_FD);
    float *ga = randf(n, -1, 1), *gai = copyf(ga, n);
    be2->gelu_bwd(be2, ga, g, x, n);
    expect("gelu_bwd accumulates", accum_err(ga, gai, dx, n), TOL_ACC);
    free(x), free(g), free(y), free(gref), free(gdref), free(dx), free(gctx.x), free(ga), free(gai);
}

/* ------------------------------------------------------------------------------------------------ elementwise */

static void test_elementwise(void) {
    printf("elementwise\n");
    size_t sizes[2] = {1001, 70001}; /* below and above the threading threshold */
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        float *a = randf(n, -1, 1), *b = randf(n, -1, 1), *o = zerof(n), *d = copyf(a, n), *s = copyf(a, n);
        be2->add(be2, o, a, b, n);
        be2->accumulate(be2, d, b, n);
        be2->scale(be2, s, -0.37f, n);
        int ok_add = 1, ok_acc = 1, ok_scale = 1;
        for (size_t i = 0; i < n; i++) {
            ok_add &= o[i] == a[i] + b[i];
            ok_acc &= d[i] == a[i] + b[i];
            ok_scale &= s[i] == a[i] * -0.37f;
        }
        CHECKF(ok_add && ok_acc && ok_scale, "add, accumulate, scale exact (n=%zu)", n);
        free(a), free(b), free(o), free(d), free(s);
    }
    printf("  add, accumulate, scale exact\n");
    /* NEFTune's noise: the stream's definition exactly (one rounded product, one rounded sum) at any thread count,
     * inside (-mag, mag), and uniform: over n draws the mean within 5 standard errors of 0, the variance of mag^2 / 3
     * within 5 of its standard errors (the draws are fixed by the seed, so the check holds alike everywhere) */
    size_t n = 100003;
    float mag = 0.37f, *x = randf(n, -1, 1), *y1 = copyf(x, n), *y3 = copyf(x, n);
    be1->add_noise(be1, y1, n, mag, 0xfeedull);
    be3->add_noise(be3, y3, n, mag, 0xfeedull);
    int exact = 1, inside = 1;
    double m1 = 0, m2 = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = snug_sr_bits(0xfeedull, i);
        float u = (float)(((double)bits + 0.5) / 2147483648.0 - 1.0), d = mag * u;
        exact &= y1[i] == x[i] + d && y3[i] == y1[i];
        inside &= fabsf(d) < mag;
        m1 += d, m2 += (double)d * d;
    }
    m1 /= (double)n, m2 /= (double)n;
    double var = (double)mag * mag / 3, se_mean = sqrt(var / (double)n), se_var = var * sqrt(0.8 / (double)n);
    CHECKF(exact && inside, "add_noise: the stream exactly (%d) and inside (-mag, mag) (%d)", exact, inside);
    CHECKF(fabs(m1) < 5 * se_mean && fabs(m2 - m1 * m1 - var) < 5 * se_var,
           "add_noise: mean %.3g (5 standard errors: %.3g), variance %.5g (want %.5g +- %.3g)", m1, 5 * se_mean,
           m2 - m1 * m1, var, 5 * se_var);
    free(x), free(y1), free(y3);
    printf("  add_noise: the stream exactly, uniform on (-mag, mag)\n");
}

/* DoRA's row ops: each row's sum in double in index order, so exact against that definition at any thread count; the
 * column scale one rounded gain, then each rounded difference, product and sum */
static void test_rows(void) {
    const int rows = 237, cols = 301, lda = 320, ldb = 305, N = 929, ldo = 50, ldi = 41, nc = 33;
    float *a = randf((size_t)rows * lda, -1, 1), *b = randf((size_t)rows * ldb, -1, 1);
    float *div = randf((size_t)rows, 0.5f, 2.0f), *n1 = zerof((size_t)rows), *n3 = zerof((size_t)rows);
    float *d1 = randf((size_t)rows, -1, 1), *d3 = copyf(d1, (size_t)rows), *d0 = copyf(d1, (size_t)rows);
    be1->row_norms(be1, n1, a, (size_t)lda, rows, cols);
    be3->row_norms(be3, n3, a, (size_t)lda, rows, cols);
    be1->row_dots(be1, d1, a, (size_t)lda, b, (size_t)ldb, rows, cols, div);
    be3->row_dots(be3, d3, a, (size_t)lda, b, (size_t)ldb, rows, cols, div);
    int ok_n = 1, ok_d = 1;
    for (int j = 0; j < rows; j++) {
        double s = 0, t = 0;
        for (int i = 0; i < cols; i++) {
            s += (double)a[(size_t)j * lda + i] * a[(size_t)j * lda + i];
            t += (double)a[(size_t)j * lda + i] * b[(size_t)j * ldb + i];
        }
        float want = d0[j] + (float)(t / div[j]);
        ok_n &= n1[j] == (float)sqrt(s) && n3[j] == n1[j];
        ok_d &= d1[j] == want && d3[j] == d1[j];
    }
    CHECKF(ok_n && ok_d, "row_norms (%d) and row_dots (%d): each row's double sum, at 1 and 3 threads", ok_n, ok_d);
    float *x = randf((size_t)N * ldi, -2, 2), *mag = randf((size_t)nc, -1, 2), *nrm = randf((size_t)nc, 0.5f, 3);
    float *bias = randf((size_t)nc, -1, 1), *o1 = zerof((size_t)N * ldo), *o2 = zerof((size_t)N * ldo);
    float *inplace = copyf(x, (size_t)N * ldi);
    be3->scale_cols(be3, o1, (size_t)ldo, x, (size_t)ldi, N, nc, mag, nrm, bias);
    be3->scale_cols(be3, o2, (size_t)ldo, x, (size_t)ldi, N, nc, mag, nrm, NULL);
    be1->scale_cols(be1, inplace, (size_t)ldi, inplace, (size_t)ldi, N, nc, mag, nrm, NULL);
    int ok_s = 1;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < ldi; j++) {
            float g = mag[j < nc ? j : 0] / nrm[j < nc ? j : 0], v = x[(size_t)t * ldi + j];
            if (j >= nc) { /* columns past cols untouched */
                ok_s &= inplace[(size_t)t * ldi + j] == v;
                continue;
            }
            float diff = v - bias[j], prod = g * diff;
            ok_s &= o1[(size_t)t * ldo + j] == bias[j] + prod && o2[(size_t)t * ldo + j] == g * v &&
                    inplace[(size_t)t * ldi + j] == g * v;
        }
    for (int t = 0; t < N; t++) /* and past cols in out: still zero */
        for (int j = nc; j < ldo; j++)
            ok_s &= o1[(size_t)t * ldo + j] == 0.0f;
    CHECKF(ok_s, "scale_cols: bias + (mag / nrm) (x - bias), without bias, in place, only its columns");
    float *acc = randf((size_t)N * ldo, -1, 1), *acc0 = copyf(acc, (size_t)N * ldo);
    be3->add_scaled_cols(be3, acc, (size_t)ldo, x, (size_t)ldi, N, nc, mag, nrm, 1.0f);
    int ok_a = 1;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < ldo; j++) {
            size_t o = (size_t)t * ldo + j;
            if (j >= nc) {
                ok_a &= acc[o] == acc0[o];
                continue;
            }
            float g = mag[j] / nrm[j], f = g - 1.0f, p = f * x[(size_t)t * ldi + j];
            ok_a &= acc[o] == acc0[o] + p;
        }
    CHECKF(ok_a, "add_scaled_cols: out += (mag / nrm - 1) x on its columns only");
    free(acc), free(acc0);
    /* col_dots: each column's double sum over the tokens in order, with and without the bias */
    float *dy = randf((size_t)N * ldo, -1, 1), *c1 = randf((size_t)nc, -1, 1), *c3 = copyf(c1, (size_t)nc);
    float *c0 = copyf(c1, (size_t)nc), *cn = copyf(c1, (size_t)nc);
    be1->col_dots(be1, c1, dy, (size_t)ldo, x, (size_t)ldi, N, nc, bias, mag);
    be3->col_dots(be3, c3, dy, (size_t)ldo, x, (size_t)ldi, N, nc, bias, mag);
    be3->col_dots(be3, cn, dy, (size_t)ldo, x, (size_t)ldi, N, nc, NULL, nrm);
    int ok_c = 1;
    for (int j = 0; j < nc; j++) {
        double s = 0, sn = 0;
        for (int t = 0; t < N; t++) {
            float v = x[(size_t)t * ldi + j], d = v - bias[j];
            s += (double)dy[(size_t)t * ldo + j] * d;
            sn += (double)dy[(size_t)t * ldo + j] * v;
        }
        float q = (float)(s / mag[j]), qn = (float)(sn / nrm[j]);
        ok_c &= c1[j] == c0[j] + q && c3[j] == c1[j] && cn[j] == c0[j] + qn;
    }
    CHECKF(ok_c, "col_dots: each column's double sum over the tokens, at 1 and 3 threads");
    free(dy), free(c1), free(c3), free(c0), free(cn);
    free(a), free(b), free(div), free(n1), free(n3), free(d1), free(d3), free(d0);
    free(x), free(mag), free(nrm), free(bias), free(o1), free(o2), free(inplace);
    printf("  row_norms, row_dots, col_dots, scale_cols, add_scaled_cols: exact at 1 and 3 threads\n");
    /* load_in_8bit's dequantization: code * (SCB * (float)(1/127)), each element one product of the row's factor */
    int8_t *codes = malloc((size_t)rows * cols);
    float *scb = randf((size_t)rows, 0.0f, 2.0f), *q1 = zerof((size_t)rows * cols), *q3 = zerof((size_t)rows * cols);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        codes[i] = (int8_t)((i * 2654435761u >> 7) % 255 - 127);
    scb[2] = 0.0f;
    be1->dequantize_int8(be1, q1, codes, scb, (size_t)rows, (size_t)cols);
    be3->dequantize_int8(be3, q3, codes, scb, (size_t)rows, (size_t)cols);
    int ok_q = memcmp(q1, q3, (size_t)rows * cols * sizeof *q1) == 0;
    for (int j = 0; j < rows; j++) {
        float f = scb[j] * (float)(1.0 / 127.0);
        for (int i = 0; i < cols; i++)
            ok_q &= q1[(size_t)j * cols + i] == (float)codes[(size_t)j * cols + i] * f;
    }
    CHECKF(ok_q, "dequantize_int8: code * the row's factor, the same at 1 and 3 threads");
    free(codes), free(scb), free(q1), free(q3);
}

/* ------------------------------------------------------------------------------------------------ loss */

/* sum over supervised rows of lse - logit[label]; with dh, dw: gradients of that sum (scaled by gs) */
static double ref_xent(double *dh, double *dw, const double *h, const double *w, const int32_t *labels, int N, int C,
                       int V, double gs) {
    double L = 0, *z = zerod(V);
    for (int n = 0; n < N; n++) {
        if (labels[n] < 0)
            continue;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) {
            z[v] = 0;
            for (int j = 0; j < C; j++)
                z[v] += h[(size_t)n * C + j] * w[(size_t)v * C + j];
            mx = fmax(mx, z[v]);
        }
        for (int v = 0; v < V; v++)
            sum += exp(z[v] - mx);
        double lse = mx + log(sum);
        L += lse - z[labels[n]];
        if (!dh)
            continue;
        for (int v = 0; v < V; v++) {
            double g = gs * (exp(z[v] - lse) - (v == labels[n]));
            for (int j = 0; j < C; j++) {
                dh[(size_t)n * C + j] += g * w[(size_t)v * C + j];
                dw[(size_t)v * C + j] += g * h[(size_t)n * C + j];
            }
        }
    }
    free(z);
    return L;
}

typedef struct {
    int N, C, V;
    double *h, *w, gs;
    const int32_t *labels;
} xent_ctx;

static double xent_loss(void *p) {
    xent_ctx *c = p;
    return c->gs * ref_xent(NULL, NULL, c->h, c->w, c->labels, c->N, c->C, c->V, 1);
}

static void test_xent(void) {
    printf("xent\n");
    char what[96];
    int N = 12, C = 13, V = 37;
    float gs = 0.37f;
    /* row 0 unsupervised, rows 5..9 (the whole second chunk of 5) unsupervised */
    int32_t labels[12];
    for (int n = 0; n < N; n++)
        labels[n] = (n == 0 || (n >= 5 && n < 10)) ? -1 : irand(V);
    float *h = randf((size_t)N * C, -1, 1), *w = randf((size_t)V * C, -1, 1);
    double *hd = tod(h, (size_t)N * C), *wd = tod(w, (size_t)V * C);
    double *rdh = zerod((size_t)N * C), *rdw = zerod((size_t)V * C);
    double rloss = ref_xent(rdh, rdw, hd, wd, labels, N, C, V, gs);

    int chunks[3] = {5, 12, 100};
    float *dh5 = NULL, *dw5 = NULL;
    for (int k = 0; k < 3; k++) {
        int ch = chunks[k];
        float *ws = randf((size_t)ch * V, -9, 9);
        float *dh = zerof((size_t)N * C), *dw = zerof((size_t)V * C);
        double loss = be2->xent_fwd_bwd(be2, dh, dw, h, w, SNUG_DT_F32, labels, N, C, V, gs, ws, ch, NULL, 0);
        snprintf(what, sizeof what, "xent loss (chunk %d)", ch);
        expect(what, check_relerr(loss, rloss, 1e-30), TOL_REF);
        snprintf(what, sizeof what, "xent dh vs reference (chunk %d)", ch);
        expect(what, check_max_relerr(dh, rdh, (size_t)N * C), TOL_REF);
        snprintf(what, sizeof what, "xent dw vs reference (chunk %d)", ch);
        expect(what, check_max_relerr(dw, rdw, (size_t)V * C), TOL_REF);
        double l0 = be2->xent_fwd_bwd(be2, NULL, NULL, h, w, SNUG_DT_F32, labels, N, C, V, gs, ws, ch, NULL, 0);
        snprintf(what, sizeof what, "xent loss without gradients (chunk %d)", ch);
        expect(what, check_relerr(l0, rloss, 1e-30), TOL_REF);
        if (k == 0)
            dh5 = dh, dw5 = dw;
        else
            free(dh), free(dw);
        free(ws);
    }
    xent_ctx ctx = {N, C, V, hd, wd, gs, labels};
    expect_fd("xent dh vs finite differences", xent_loss, &ctx, hd, (size_t)N * C, dh5, TOL_FD);
    expect_fd("xent dw vs finite differences", xent_loss, &ctx, wd, (size_t)V * C, dw5, TOL_FD);

    float *ws = zerof((size_t)5 * V);
    float *ah = randf((size_t)N * C, -1, 1), *ahi = copyf(ah, (size_t)N * C);
    float *aw = randf((size_t)V * C, -1, 1), *awi = copyf(aw, (size_t)V * C);
    be2->xent_fwd_bwd(be2, ah, NULL, h, w, SNUG_DT_F32, labels, N, C, V, gs, ws, 5, NULL, 0);
    be2->xent_fwd_bwd(be2, NULL, aw, h, w, SNUG_DT_F32, labels, N, C, V, gs, ws, 5, NULL, 0);
    expect("xent dh alone accumulates", accum_err(ah, ahi, dh5, (size_t)N * C), TOL_ACC);
    expect("xent dw alone accumulates", accum_err(aw, awi, dw5, (size_t)V * C), TOL_ACC);

    /* large logits: the softmax must not overflow */
    float *hb = copyf(h, (size_t)N * C);
    for (int i = 0; i < N * C; i++)
        hb[i] *= 40.0f;
    double *hbd = tod(hb, (size_t)N * C);
    double rbig = ref_xent(NULL, NULL, hbd, wd, labels, N, C, V, 1);
    float *bh = zerof((size_t)N * C);
    double big = be2->xent_fwd_bwd(be2, bh, NULL, hb, w, SNUG_DT_F32, labels, N, C, V, 1.0f, ws, 5, NULL, 0);
    int finite = 1;
    for (int i = 0; i < N * C; i++)
        finite &= isfinite(bh[i]);
    CHECKF(finite, "xent gradients finite for large logits");
    expect("xent loss with large logits", check_relerr(big, rbig, 1e-30), TOL_REF);

    /* threads: a chunk big enough to run threaded gives the same loss. The logits come from OpenBLAS, whose
     * summation order depends on its kernels and thread count, so the inputs are multiples of 1/4 in [-1, 1]: every
     * product and partial sum is exact in fp32 and the logits are the same bits in any order. What is left to differ
     * is snug's own reduction of the loss, which must not depend on the thread count. */
    int BN = 300, BV = 301, BCH = 128;
    int32_t *bl = malloc(BN * sizeof(int32_t));
    for (int n = 0; n < BN; n++)
        bl[n] = n % 7 == 3 ? -1 : irand(BV);
    float *bhh = zerof((size_t)BN * C), *bw = zerof((size_t)BV * C), *bws = zerof((size_t)BCH * BV);
    for (int i = 0; i < BN * C; i++)
        bhh[i] = (float)(irand(9) - 4) / 4.0f;
    for (int i = 0; i < BV * C; i++)
        bw[i] = (float)(irand(9) - 4) / 4.0f;
    float *g1 = zerof((size_t)BN * C), *g2 = zerof((size_t)BN * C);
    double L1 = be1->xent_fwd_bwd(be1, g1, NULL, bhh, bw, SNUG_DT_F32, bl, BN, C, BV, 1.0f, bws, BCH, NULL, 0);
    double L2 = be2->xent_fwd_bwd(be2, g2, NULL, bhh, bw, SNUG_DT_F32, bl, BN, C, BV, 1.0f, bws, BCH, NULL, 0);
    CHECKF(L1 == L2, "xent loss identical for 1 and 2 threads (%.17g vs %.17g)", L1, L2);
    free(h), free(w), free(hd), free(wd), free(rdh), free(rdw), free(dh5), free(dw5), free(ws);
    free(ah), free(ahi), free(aw), free(awi), free(hb), free(hbd), free(bh);
    free(bl), free(bhh), free(bw), free(bws), free(g1), free(g2);
}

/* The loss over blocks of the head's rows (loss_vocab_block): every block's statistics pass, then each block's
 * gradient pass, then the sum, give the reference loss and gradients whatever the block (1 row, a non-divisor, the
 * whole vocabulary) and the chunk, also for logits large enough that exp would overflow without the running max. */
static void test_xent_block(void) {
    printf("xent_block\n");
    char what[112];
    int N = 12, C = 13, V = 37;
    float gs = 0.37f;
    int32_t labels[12];
    for (int n = 0; n < N; n++)
        labels[n] = (n == 0 || (n >= 5 && n < 10)) ? -1 : irand(V);
    labels[11] = V - 1; /* the last row of the last (partial) block */
    float *h = randf((size_t)N * C, -1, 1), *w = randf((size_t)V * C, -1, 1);
    for (int big = 0; big < 2; big++) {
        if (big)
            for (int i = 0; i < N * C; i++)
                h[i] *= 40.0f;
        double *hd = tod(h, (size_t)N * C), *wd = tod(w, (size_t)V * C);
        double *rdh = zerod((size_t)N * C), *rdw = zerod((size_t)V * C);
        double rloss = ref_xent(rdh, rdw, hd, wd, labels, N, C, V, gs);
        int blocks[4] = {1, 7, 36, 37}, chunks[2] = {5, 100};
        for (int b = 0; b < 4; b++)
            for (int k = 0; k < 2; k++) {
                int vb = blocks[b], ch = chunks[k];
                float *ws = randf((size_t)ch * vb, -9, 9), *mx = randf((size_t)N, -9, 9), *zy = zerof((size_t)N);
                float *dh = zerof((size_t)N * C), *dw = zerof((size_t)V * C);
                double *sum = zerod((size_t)N);
                for (int n = 0; n < N; n++)
                    mx[n] = -INFINITY;
                for (int v0 = 0; v0 < V; v0 += vb)
                    be2->xent_block(be2, 0, NULL, NULL, h, w + (size_t)v0 * C, SNUG_DT_F32, labels, N, C, V, v0,
                                    V - v0 < vb ? V - v0 : vb, 0.0f, mx, sum, zy, ws, ch, NULL, 0);
                double l0 = be2->xent_block(be2, 2, NULL, NULL, NULL, NULL, SNUG_DT_F32, labels, N, C, V, 0, 1, 0.0f,
                                            mx, sum, zy, NULL, 0, NULL, 0);
                for (int v0 = 0; v0 < V; v0 += vb)
                    be2->xent_block(be2, 1, dh, dw + (size_t)v0 * C, h, w + (size_t)v0 * C, SNUG_DT_F32, labels, N, C,
                                    V, v0, V - v0 < vb ? V - v0 : vb, gs, mx, sum, zy, ws, ch, NULL, 0);
                double l1 = be2->xent_block(be2, 2, NULL, NULL, NULL, NULL, SNUG_DT_F32, labels, N, C, V, 0, 1, 0.0f,
                                            mx, sum, zy, NULL, 0, NULL, 0);
                snprintf(what, sizeof what, "xent_block loss (block %d, chunk %d%s)", vb, ch, big ? ", large logits" : "");
                expect(what, check_relerr(l0, rloss, 1e-30), TOL_REF);
                CHECKF(l0 == l1, "xent_block: the gradient pass leaves the statistics as they were");
                snprintf(what, sizeof what, "xent_block dh (block %d, chunk %d%s)", vb, ch, big ? ", large logits" : "");
                expect(what, check_max_relerr(dh, rdh, (size_t)N * C), TOL_REF);
                snprintf(what, sizeof what, "xent_block dw (block %d, chunk %d%s)", vb, ch, big ? ", large logits" : "");
                expect(what, check_max_relerr(dw, rdw, (size_t)V * C), TOL_REF);
                free(ws), free(mx), free(zy), free(dh), free(dw), free(sum);
            }
        free(hd), free(wd), free(rdh), free(rdw);
    }
    free(h), free(w);
}

/* ------------------------------------------------------------------------------------------------ optimizer */

static void test_optimizer(void) {
    printf("sumsq\n");
    size_t sizes[4] = {0, 5, 1013, 100003};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *x = randf(n, -2, 2);
        double ref = 0;
        for (size_t i = 0; i < n; i++)
            ref += (double)x[i] * x[i];
        double s1 = be1->sumsq(be1, x, SNUG_DT_F32, n), s2 = be2->sumsq(be2, x, SNUG_DT_F32, n), s3 = be3->sumsq(be3, x, SNUG_DT_F32, n);
        CHECKF(check_relerr(s2, ref, 1e-300) <= 1e-12, "sumsq n=%zu: %.17g vs %.17g", n, s2, ref);
        CHECKF(s1 == s2 && s2 == s3, "sumsq identical for 1, 2, 3 threads (n=%zu)", n);
        free(x);
    }
    printf("  sumsq in double, identical for 1, 2, 3 threads\n");

    printf("adamw\n");
    /* hyperparameters as the user writes them (doubles), passed to the op as doubles */
    struct {
        double lr, b1, b2, eps, wd, gs;
    } hp[2] = {{1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5}, {3e-3, 0.3, 0.999, 1e-6, 0.0, 1.0}};
    for (int k = 0; k < 2; k++) {
        size_t n = k == 0 ? 1001 : 70001;
        float *p = randf(n, -1, 1), *m = zerof(n), *v = zerof(n);
        double *pd = tod(p, n), *md = zerod(n), *vd = zerod(n);
        float *p1 = copyf(p, n), *m1 = zerof(n), *v1 = zerof(n);
        for (int step = 1; step <= 3; step++) {
            float *g = randf(n, -1, 1);
            g[0] = 0.0f; /* a zero gradient: only decay moves the parameter */
            float gsf = (float)hp[k].gs;
            be2->adamw(be2, p, g, m, v, n, hp[k].lr, hp[k].b1, hp[k].b2, hp[k].eps, hp[k].wd, step, gsf);
            be1->adamw(be1, p1, g, m1, v1, n, hp[k].lr, hp[k].b1, hp[k].b2, hp[k].eps, hp[k].wd, step, gsf);
            double lr = hp[k].lr, b1 = hp[k].b1, b2 = hp[k].b2, bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            for (size_t i = 0; i < n; i++) {
                double gi = (double)g[i] * hp[k].gs;
                pd[i] -= lr * hp[k].wd * pd[i];
                md[i] = b1 * md[i] + (1 - b1) * gi;
                vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
                pd[i] -= lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + hp[k].eps);
            }
            free(g);
        }
        expect(k == 0 ? "adamw p (b1=0.9, wd, grad_scale)" : "adamw p (b1=0.3, large n)", check_max_relerr(p, pd, n),
               TOL_REF);
        expect(k == 0 ? "adamw m" : "adamw m (large n)", check_max_relerr(m, md, n), TOL_REF);
        expect(k == 0 ? "adamw v" : "adamw v (large n)", check_max_relerr(v, vd, n), TOL_REF);
        CHECKF(same_bits(p, p1, n) && same_bits(m, m1, n) && same_bits(v, v1, n),
               "adamw identical for 1 and 2 threads");
        free(p), free(m), free(v), free(pd), free(md), free(vd), free(p1), free(m1), free(v1);
    }
}

/* The SIMD expf of the softmaxes and SwiGLU (backend/cpu/expf_cpu.h) against libm's expf: every 4099th float bit
 * pattern (every exponent, both signs, subnormals, inf, NaN) and the edges of its fast range, in arrays of awkward
 * lengths, in place and not. The same bits where libm runs its FMA variant (an x86 with FMA); elsewhere within 1
 * ulp. */
static void test_expf(void) {
    enum { M = 4099 * 3 + 17 };
    float *x = malloc(M * sizeof(float)), *y = malloc(M * sizeof(float));
    static const float edge[] = {88.0f, -88.0f, 0x1.5fffffp6f, -0x1.5fffffp6f, 88.72283f, 88.72284f, -103.27893f,
                                 -103.97208f, -104.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 1.0f, -1.0f};
#if defined(__x86_64__)
    int bitwise = __builtin_cpu_supports("fma");
#else
    int bitwise = 0;
#endif
    size_t n = 0, bad = 0;
    uint64_t pat = 0;
    for (int round = 0; pat < (1ull << 32); round++) {
        int m = round % 2 ? M : M - 5 - round % 60;
        for (int i = 0; i < m; i++, pat += 4099) {
            uint32_t u = (uint32_t)pat;
            memcpy(&x[i], &u, 4);
        }
        if (round == 0)
            memcpy(x, edge, sizeof edge);
        int inplace = round % 3 == 0;
        if (inplace)
            memcpy(y, x, (size_t)m * sizeof(float));
        snug_cpu_expf_n(y, inplace ? y : x, m);
        for (int i = 0; i < m; i++, n++) {
            float want = expf(x[i]);
            int32_t a, b;
            memcpy(&a, &want, 4), memcpy(&b, &y[i], 4);
            int ok = isnan(want) ? isnan(y[i]) : bitwise ? a == b : llabs((long long)a - b) <= 1;
            if (!ok && bad++ < 3)
                fprintf(stderr, "expf(%a): libm %a, SIMD %a\n", x[i], want, y[i]);
        }
    }
    CHECKF(bad == 0, "SIMD expf: %zu of %zu values differ from libm's%s", bad, n, bitwise ? " bits" : " by > 1 ulp");
    free(x), free(y);
}

int main(void) {
    test_expf();
    be1 = snug_backend_cpu_create(1);
    be2 = snug_backend_cpu_create(2);
    be3 = snug_backend_cpu_create(3);
    CHECK(be1 && be2 && be3);
    if (!be1 || !be2 || !be3)
        return check_finish("test_ops");
    test_memory();
    test_embed();
    test_norm(0);
    test_norm(1);
    test_matmul();
    test_rope();
    test_attention();
    test_activations();
    test_elementwise();
    test_rows();
    test_xent();
    test_xent_block();
    test_optimizer();
    be1->destroy(be1), be2->destroy(be2), be3->destroy(be3);
    return check_finish("test_ops");
}
