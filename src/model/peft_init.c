/* peft_init.c: the base under an adapter PEFT saved with init_lora_weights "pissa" or "olora" (unconverted).
 *
 * PEFT's from_pretrained builds the adapters with the saved config, so each adapted module runs its initialisation
 * again on the base it is given, which subtracts scale * B0 @ A0 from the base weight, and only then loads the saved
 * A and B: the adapter is relative to that residual base. Done here as PEFT does (tuners/lora/layer.py, pissa_init
 * and olora_init), in fp32 with LAPACK (OpenBLAS's, as torch's CPU linear algebra):
 *   PiSSA  W (out, in) = V S Uh (SVD); Sr = S[:r] / scale; A0 (r, in) = diag(sqrt Sr) Uh[:r]; B0 (out, r) =
 *          V[:, :r] diag(sqrt Sr). (scale B0 A0 is the rank-r truncation, whatever the signs of the vectors.)
 *   OLoRA  W (out, in) = Q R (reduced QR); A0 = R[:r] (r, in), B0 = Q[:, :r] (out, r).
 *   then   W_res = (W - scale * (B0 @ A0)) rounded to the weight's dtype (16-bit storage, else the checkpoint's).
 * Refused where PEFT does not do this or snug cannot: a 4-bit or 8-bit base (PEFT refuses PiSSA there and requantizes
 * for OLoRA), OLoRA on Conv1D weights (PEFT takes the QR of the (in, out) matrix, which fits the adapter's shapes
 * only when square), a base sharded over ranks (ZeRO-3, tensor parallel), r above min(out, in). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/blas_cpu.h"
#include "core/dtype.h"
#include "model/family.h"
#include "model/model.h"
#include "model/peft_io.h"

/* LAPACK's Fortran interface (LP64 integers, hidden string lengths last) */
typedef void (*sgesdd_fn)(const char *jobz, const int *m, const int *n, float *a, const int *lda, float *s, float *u,
                          const int *ldu, float *vt, const int *ldvt, float *work, const int *lwork, int *iwork,
                          int *info, size_t jobz_len);
typedef void (*sgeqrf_fn)(const int *m, const int *n, float *a, const int *lda, float *tau, float *work,
                          const int *lwork, int *info);
typedef void (*sorgqr_fn)(const int *m, const int *n, const int *k, float *a, const int *lda, const float *tau,
                          float *work, const int *lwork, int *info);

static const char *init_name(int init) { return init == SNUG_LORA_INIT_PISSA ? "pissa" : "olora"; }

/* B0 (O, r) and A0 (r, I) of PiSSA for W (O, I) row-major; 0, or a LAPACK info. */
static int pissa_pair(const float *W, int O, int I, int r, float scale, float *B0, float *A0) {
    sgesdd_fn gesdd = (sgesdd_fn)snug_cpu_blas_symbol("sgesdd_");
    if (!gesdd)
        return -1;
    /* W row-major is W^T (I, O) column-major = U S VT, so W = VT^T S U^T: PEFT's V = VT^T, Uh = U^T */
    int k = O < I ? O : I, info = 0, lwork = -1;
    float *a = malloc((size_t)O * I * sizeof *a), *s = malloc((size_t)k * sizeof *s);
    float *u = malloc((size_t)I * k * sizeof *u), *vt = malloc((size_t)k * O * sizeof *vt), q = 0;
    int *iwork = malloc((size_t)8 * k * sizeof *iwork);
    if (!a || !s || !u || !vt || !iwork) {
        info = -2;
        goto out;
    }
    memcpy(a, W, (size_t)O * I * sizeof *a);
    gesdd("S", &I, &O, a, &I, s, u, &I, vt, &k, &q, &lwork, iwork, &info, 1);
    float *work = info ? NULL : malloc(((size_t)q + 1) * sizeof *work);
    lwork = (int)q;
    if (!info && !work)
        info = -2;
    if (!info)
        gesdd("S", &I, &O, a, &I, s, u, &I, vt, &k, work, &lwork, iwork, &info, 1);
    free(work);
    for (int j = 0; !info && j < r; j++) {
        float sq = sqrtf(s[j] / scale);
        for (int i = 0; i < I; i++) /* A0[j][i] = sqrt(Sr[j]) Uh[j][i] = sqrt(Sr[j]) U(i, j) */
            A0[(size_t)j * I + i] = sq * u[i + (size_t)j * I];
        for (int o = 0; o < O; o++) /* B0[o][j] = V[o][j] sqrt(Sr[j]) = VT(j, o) sqrt(Sr[j]) */
            B0[(size_t)o * r + j] = vt[j + (size_t)o * k] * sq;
    }
out:
    free(a), free(s), free(u), free(vt), free(iwork);
    return info;
}

/* B0 (O, r) and A0 (r, I) of OLoRA for W (O, I) row-major; 0, or a LAPACK info. */
static int olora_pair(const float *W, int O, int I, int r, float *B0, float *A0) {
    sgeqrf_fn geqrf = (sgeqrf_fn)snug_cpu_blas_symbol("sgeqrf_");
    sorgqr_fn orgqr = (sorgqr_fn)snug_cpu_blas_symbol("sorgqr_");
    if (!geqrf || !orgqr)
        return -1;
    int k = O < I ? O : I, info = 0, lwork = -1;
    float *a = malloc((size_t)O * I * sizeof *a), *tau = malloc((size_t)k * sizeof *tau), q = 0, q2 = 0;
    if (!a || !tau) {
        free(a), free(tau);
        return -2;
    }
    for (int o = 0; o < O; o++) /* W (O, I) column-major */
        for (int i = 0; i < I; i++)
            a[o + (size_t)i * O] = W[(size_t)o * I + i];
    geqrf(&O, &I, a, &O, tau, &q, &lwork, &info);
    if (!info)
        orgqr(&O, &k, &k, a, &O, tau, &q2, &lwork, &info);
    lwork = (int)(q > q2 ? q : q2);
    float *work = info ? NULL : malloc(((size_t)lwork + 1) * sizeof *work);
    if (!info && !work)
        info = -2;
    if (!info)
        geqrf(&O, &I, a, &O, tau, work, &lwork, &info);
    for (int j = 0; !info && j < r; j++) /* R[:r] (r, I): the upper triangle */
        for (int i = 0; i < I; i++)
            A0[(size_t)j * I + i] = i >= j ? a[j + (size_t)i * O] : 0.0f;
    if (!info)
        orgqr(&O, &k, &k, a, &O, tau, work, &lwork, &info);
    for (int o = 0; !info && o < O; o++) /* Q[:, :r] (O, r) */
        for (int j = 0; j < r; j++)
            B0[(size_t)o * r + j] = a[o + (size_t)j * O];
    free(work), free(a), free(tau);
    return info;
}

/* W (O, I) -= scale * (B0 @ A0), then rounded to dt as PEFT's weight.to(dtype). */
static int residual(float *W, int O, int I, int r, float scale, int init, snug_dtype dt) {
    float *B0 = malloc((size_t)O * r * sizeof *B0), *A0 = malloc((size_t)r * I * sizeof *A0);
    float *P = malloc((size_t)O * I * sizeof *P);
    int rc = !B0 || !A0 || !P ? -2
             : init == SNUG_LORA_INIT_PISSA ? pissa_pair(W, O, I, r, scale, B0, A0)
                                            : olora_pair(W, O, I, r, B0, A0);
    if (!rc) {
        snug_cpu_sgemm(0, 0, O, I, r, 1.0f, B0, r, A0, I, 0.0f, P, I); /* (O, I) = B0 (O, r) @ A0 (r, I) */
        for (size_t k = 0; k < (size_t)O * I; k++) {
            float w = W[k] - scale * P[k];
            W[k] = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(snug_f32_to_bf16(w))
                   : dt == SNUG_DT_F16 ? snug_f16_to_f32(snug_f32_to_f16(w))
                                       : w;
        }
    }
    free(B0), free(A0), free(P);
    return rc;
}

int snug_peft_residual(snug_model *m, int init, const char *path, snug_error *e) {
    if (init == SNUG_LORA_INIT_PLAIN || !m->lora.on)
        return 0;
    const snug_lora *lo = &m->lora;
    const char *how = "merge it into the base with `snug merge` or save it converted (PEFT's save_pretrained with "
                      "path_initial_model_for_weight_conversion)";
    if (m->q4)
        return snug_fail(e, SNUG_EINPUT, "%s: init_lora_weights is \"%s\", which changes the base, and this base is "
                         "quantized (QLoRA); PEFT derives it from a 16-bit or fp32 base: load the base unquantized, "
                         "or %s", path, init_name(init), how);
    /* (offload_params keeps a LoRA base whole in host memory, laid out as one rank's ZeRO-3 shard: that is whole) */
    if ((m->param_sharded && (m->pshard_lo || m->pshard_n != m->table.total)) || m->tp > 1)
        return snug_fail(e, SNUG_EINPUT, "%s: init_lora_weights is \"%s\", which changes the base, and this run "
                         "shards the base over ranks (ZeRO-3 or tensor parallel), which snug does not derive it on; "
                         "%s", path, init_name(init), how);
    if (init == SNUG_LORA_INIT_OLORA && snug_scheme_of(m->cfg.arch)->conv1d)
        return snug_fail(e, SNUG_EINPUT, "%s: init_lora_weights is \"olora\" on %s's Conv1D modules, whose QR PEFT "
                         "takes of the (in, out) matrix; not supported by snug: %s", path,
                         snug_scheme_of(m->cfg.arch)->name, how);
    snug_backend *be = m->be;
    float *direct = snug_model_host_params(m);
    /* rounded as PEFT's weight.to(dtype): to the 16-bit storage, or on fp32 weights to the checkpoint's dtype (the
     * dtype from_pretrained loads a model in; merge and generate hold a 16-bit base in fp32) */
    snug_dtype dt = m->lv.dt != SNUG_DT_F32               ? m->lv.dt
                    : !strcmp(m->cfg.torch_dtype, "bfloat16") ? SNUG_DT_BF16
                    : !strcmp(m->cfg.torch_dtype, "float16")  ? SNUG_DT_F16
                                                              : SNUG_DT_F32;
    int rc = 0;
    for (int l = 0; !rc && l < m->cfg.n_layer; l++) {
        for (int i = 0; !rc && lo->table.layer_numel[l] && i < lo->nmod; i++) {
            const snug_lora_module *md = &lo->mod[i];
            char name[128];
            snprintf(name, sizeof name, "%s.%d.%s.weight", snug_scheme_of(m->cfg.arch)->layers, lo->l0 + l,
                     snug_lora_module_name(m->cfg.arch, md->index));
            int at = snug_param_table_find(&m->table, name);
            if (at < 0 || m->table.e[at].numel != (size_t)md->rows * md->in)
                return snug_fail(e, SNUG_EINTERNAL, "%s: no base tensor %s of %d x %d", path, name, md->rows, md->in);
            if (lo->r > (md->rows < md->in ? md->rows : md->in))
                return snug_fail(e, SNUG_EINPUT, "%s: init_lora_weights \"%s\" with r=%d on %s (%d x %d): r is above "
                                 "the matrix's rank, which PEFT cannot load either", path, init_name(init), lo->r,
                                 name, md->rows, md->in);
            const snug_param_entry *p = &m->table.e[at];
            float *W = direct ? direct + p->offset : malloc(p->numel * sizeof *W); /* (rows, in) as the model lays it */
            float *dev = direct ? NULL : be->alloc(be, p->numel * sizeof *dev);
            if (!W || (!direct && !dev)) {
                rc = snug_fail(e, SNUG_ENOMEM, "out of memory deriving the base of %s", name);
            } else {
                if (!direct) {
                    snug_model_entry_f32(m, at, dev);
                    be->to_host(be, W, dev, p->numel * sizeof *W);
                }
                int info = residual(W, md->rows, md->in, lo->r, lo->scale, init, dt);
                if (info)
                    rc = snug_fail(e, info == -2 ? SNUG_ENOMEM : SNUG_EINPUT, "%s: the %s of %s failed (%s %d)", path,
                                   init == SNUG_LORA_INIT_PISSA ? "SVD" : "QR", name,
                                   info == -1 ? "the BLAS library has no LAPACK routine" : "LAPACK info", info);
                else if (!direct)
                    rc = snug_model_put_entry(m, at, W, e);
            }
            if (dev)
                be->free(be, dev);
            if (!direct)
                free(W);
        }
    }
    if (!rc)
        m->lv.lora.init = init; /* the adapters now sit on the residual base; saving them says so */
    return rc;
}
