/* lora.c: LoRA adapters on the block's linear layers (see lora.h, snug_lora): a leaf the layer code calls beside each
 * base linear, handed what it reads of the model in a snug_lora_ctx; adapter.c fits them to a model.
 *
 * Each adapted module k of layer l has A (r, in) and B (rows, r) in fp32, and adds to its site's output columns
 * [row0, row0 + rows):  out += s * (drop(x) A^T) B^T,  s = alpha / r (alpha / sqrt(r) with rsLoRA), the base weight
 * frozen. A module may be part of a fused site (q alone of q/k/v, gate alone of gate/up): the adapter writes only its
 * columns, through the GEMM's leading dimension, and never needs a copy of the fused weight. Backward, with
 * u = drop(x) A^T (N, r) recomputed rather than saved and g = dout[:, row0:row0+rows]:
 *   du = g B (N, r);  dB += s g^T u;  dA += s du^T drop(x);  dx += drop'(s du A).
 * The modules of one site read one input, so without dropout they run as one: the memory holds their A's side by
 * side, one (n r, in) matrix for n modules (q, k, v; gate, up), and u = x [A_q; A_k; A_v]^T (N, n r), dA and dx are
 * one GEMM each over it, where n skinny GEMMs (r = 16 columns) ran before; only B's products stay per module, each
 * on its own columns of the output. The table keeps PEFT's names and order; only the offsets follow this layout.
 * Dropout draws its mask from (the micro-batch's seed, layer, module, element), so the forward and backward (and a
 * checkpointed layer's recomputation) see the same mask without storing it; each module then reads its own dropped
 * input and runs alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/family.h"
#include "model/lora.h"

/* The adaptable modules of a block: its scheme's linear modules (family.c), in their order. */
const char *snug_lora_module_name(snug_arch arch, int k) {
    const snug_scheme *s = snug_scheme_of(arch);
    return s && k >= 0 && k < s->n_modules ? s->modules[k].name : NULL;
}

int snug_lora_module_count(snug_arch arch) {
    const snug_scheme *s = snug_scheme_of(arch);
    return s ? s->n_modules : 0;
}

unsigned snug_lora_all_linear(snug_arch arch) { return (1u << snug_lora_module_count(arch)) - 1u; }

unsigned snug_lora_default_targets(snug_arch arch) {
    const snug_scheme *s = snug_scheme_of(arch);
    unsigned t = 0;
    for (int k = 0; s && k < s->n_modules; k++)
        t |= s->modules[k].lora_default ? 1u << k : 0u;
    return t;
}

snug_site snug_lora_module_site(snug_arch arch, int k) {
    const snug_scheme *s = snug_scheme_of(arch);
    return s && k >= 0 && k < s->n_modules ? s->modules[k].site : SNUG_NSITES;
}

void snug_lora_module_shape(const snug_model_config *c, int k, int *row0, int *rows, int *in) {
    int64_t r0 = 0, rs = 0, n = 0;
    snug_module_shape(c, k, &r0, &rs, &n);
    *row0 = (int)r0, *rows = (int)rs, *in = (int)n;
}

int snug_lora_layers_named(const snug_lora_cfg *lc) {
    return (lc->layers[0] | lc->layers[1] | lc->layers[2] | lc->layers[3]) != 0;
}

int snug_lora_layer_on(const snug_lora_cfg *lc, int l) {
    return !snug_lora_layers_named(lc) || (l >= 0 && l < 256 && (lc->layers[l / 64] >> (l % 64) & 1));
}

void snug_lora_layers_list(const snug_lora_cfg *lc, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int l = 0; snug_lora_layers_named(lc) && l < 256 && len < n; l++)
        if (snug_lora_layer_on(lc, l))
            len += (size_t)snprintf(buf + len, n - len, "%s%d", len ? "," : "", l);
}

long long snug_lora_nparams(const snug_model_config *c, const snug_lora_cfg *lc) {
    if (lc->kind == SNUG_ADAPTER_NONE)
        return 0;
    long long per_layer = 0;
    for (int k = 0; k < snug_lora_module_count(c->arch); k++) {
        int row0, rows, in;
        if (!(lc->targets & (1u << k)))
            continue;
        snug_lora_module_shape(c, k, &row0, &rows, &in);
        per_layer += (long long)lc->r * (in + rows) + (lc->dora ? rows : 0);
    }
    int saved = !!(lc->save_modules & SNUG_SAVE_EMBED) + !!(lc->save_modules & SNUG_SAVE_HEAD), layers = 0;
    for (int l = 0; l < c->n_layer; l++)
        layers += snug_lora_layer_on(lc, l);
    return per_layer * layers + (long long)saved * c->vocab_size * c->hidden_size;
}

void snug_lora_free(snug_lora *lo) {
    snug_param_table_free(&lo->table);
    memset(lo, 0, sizeof *lo);
}

static int dropping(const snug_lora *lo);

/* DoRA: nrm (rows) = the row norms of module md's W + s B A in layer l, dchunk rows at a time in dw */
static void dora_norms(const snug_lora_ctx *cx, int l, const snug_lora_module *md, float *nrm) {
    snug_lora *lo = cx->lora;
    snug_backend *be = cx->be;
    const float *P = lo->params + lo->table.layer_offset[l];
    for (int r0 = 0; r0 < md->rows; r0 += lo->dchunk) {
        int nr = md->rows - r0 < lo->dchunk ? md->rows - r0 : lo->dchunk;
        cx->base_rows(cx->ud, l, md->site, md->row0 + r0, nr, md->in, lo->dw);
        be->gemm_strided(be, 0, 0, nr, md->in, lo->r, lo->scale, P + md->b_off + (size_t)r0 * lo->r, lo->r,
                         P + md->a_off, md->in, 1.0f, lo->dw, md->in); /* += s B A */
        be->row_norms(be, nrm + r0, lo->dw, (size_t)md->in, nr, md->in);
    }
}

/* Layer l has adapters (lora_layers_to_transform may leave it out). */
static int adapted(const snug_lora *lo, int l) { return lo->on && lo->table.layer_numel[l]; }

void snug_lora_dora_norms(const snug_lora_ctx *cx, int l, snug_site site) {
    snug_lora *lo = cx->lora;
    for (int i = 0; adapted(lo, l) && lo->dora && !lo->dora_fixed && i < lo->nmod; i++)
        if (lo->mod[i].site == site)
            dora_norms(cx, l, &lo->mod[i], lo->dn + (size_t)l * lo->dn_per_layer + lo->mod[i].n_off);
}

/* DoRA's scale of module md's output columns: out = bias + (mag / nrm) (out - bias) */
static void dora_scale(const snug_lora_ctx *cx, int l, const snug_lora_module *md, float *out, int width, int N,
                       const float *bias) {
    snug_lora *lo = cx->lora;
    const float *mag = lo->params + lo->table.layer_offset[l] + md->m_off;
    const float *nrm = lo->dn + (size_t)l * lo->dn_per_layer + md->n_off;
    cx->be->scale_cols(cx->be, out + md->row0, (size_t)width, out + md->row0, (size_t)width, N, md->rows, mag, nrm,
                       bias ? bias + md->row0 : NULL);
}

/* DoRA: rows [r0, r0 + nr) of module md's magnitude gradient, added once: (sum over tokens of dy (x W^T + s u B^T))
 * / nrm, the products taken as row dots of W with dy^T x and of B with s dy^T u. g: dy's first column of the chunk
 * (row stride width); u = x A^T (row stride ldu). Leaves the chunk's rows of W in dw. */
static void dmag_rows(const snug_lora_ctx *cx, int l, const snug_lora_module *md, int r0, int nr, const float *g,
                      int width, const float *x, const float *u, int ldu, int N) {
    snug_lora *lo = cx->lora;
    snug_backend *be = cx->be;
    int r = lo->r, in = md->in;
    size_t base = lo->table.layer_offset[l];
    const float *nrm = lo->dn + (size_t)l * lo->dn_per_layer + md->n_off + r0;
    be->zero(be, lo->dmt, (size_t)nr * sizeof *lo->dmt);
    be->gemm_strided(be, 1, 0, nr, r, N, lo->scale, g, width, u, ldu, 0.0f, lo->dp, r);
    be->row_dots(be, lo->dmt, lo->params + base + md->b_off + (size_t)r0 * r, (size_t)r, lo->dp, (size_t)r, nr, r, nrm);
    cx->base_rows(cx->ud, l, md->site, md->row0 + r0, nr, in, lo->dw);
    be->gemm_strided(be, 1, 0, nr, in, N, 1.0f, g, width, x, in, 0.0f, lo->dp, in);
    be->row_dots(be, lo->dmt, lo->dw, (size_t)in, lo->dp, (size_t)in, nr, in, nrm);
    /* once per micro-batch, as the GEMMs add dA and dB: data parallel's sum over ranks then has the bits of one
     * process accumulating */
    be->accumulate(be, lo->grads + base + md->m_off + r0, lo->dmt, (size_t)nr);
}

const float *snug_lora_dora_bwd(const snug_lora_ctx *cx, int l, snug_site site, float *dout, int width,
                                const float *x, int N, const float *y, const float *bias, int in_place) {
    snug_lora *lo = cx->lora;
    snug_backend *be = cx->be;
    if (!adapted(lo, l) || !lo->dora || dropping(lo)) /* (with dropout snug_lora_bwd takes all of DoRA's part) */
        return dout;
    float *dst = dout;
    size_t base = lo->table.layer_offset[l];
    const float *P = lo->params + base, *nrm = lo->dn + (size_t)l * lo->dn_per_layer;
    for (int i = 0; i < lo->nmod; i += lo->mod[i].group) {
        const snug_lora_module *md = &lo->mod[i];
        int n = md->group, r = lo->r, R = n * r, in = md->in;
        if (md->site != site)
            continue;
        if (lo->grads && !y) /* u = x [A_0; ...]^T, for the magnitudes' gradient */
            be->gemm_strided(be, 0, 1, N, R, in, 1.0f, x, in, P + md->a_off, in, 0.0f, lo->u, R);
        for (int j = 0; j < n; j++) {
            const snug_lora_module *mj = md + j;
            for (int r0 = 0; lo->grads && r0 < mj->rows; r0 += lo->dchunk) { /* a chunk of rows at a time */
                int nr = mj->rows - r0 < lo->dchunk ? mj->rows - r0 : lo->dchunk, c0 = mj->row0 + r0;
                if (!y) {
                    dmag_rows(cx, l, mj, r0, nr, dout + c0, width, x, lo->u + j * r, R, N);
                    continue;
                }
                /* from the output: x W^T + s u B^T = (y - bias) nrm / mag, so dmag = the sum over tokens of
                 * dy (y - bias) / mag, one pass down the columns, added once as dmag_rows adds it */
                be->zero(be, lo->dmt, (size_t)nr * sizeof *lo->dmt);
                be->col_dots(be, lo->dmt, dout + c0, (size_t)width, y + c0, (size_t)width, N, nr,
                             bias ? bias + c0 : NULL, P + mj->m_off + r0);
                be->accumulate(be, lo->grads + base + mj->m_off + r0, lo->dmt, (size_t)nr);
            }
        }
        /* then the gradient of the scaled columns: dy (mag / nrm), in place, or into dy where dout is read again (a
         * module of o_proj or down_proj spans every column) */
        if (!in_place)
            dst = lo->dy;
        for (int j = 0; j < n; j++)
            be->scale_cols(be, dst + md[j].row0, (size_t)width, dout + md[j].row0, (size_t)width, N, md[j].rows,
                           P + md[j].m_off, nrm + md[j].n_off, NULL);
    }
    return dst;
}

void snug_lora_dora_magnitudes(const snug_lora_ctx *cx, int n_layer) {
    snug_lora *lo = cx->lora;
    for (int l = 0; lo->dora_pending && l < n_layer; l++)
        for (int i = 0; adapted(lo, l) && i < lo->nmod; i++)
            dora_norms(cx, l, &lo->mod[i], lo->params + lo->table.layer_offset[l] + lo->mod[i].m_off);
    lo->dora_pending = 0;
}

/* The dropout stream of module md in layer l for this micro-batch, from row n0 on: element i of the stream is drawn
 * from seed + (i + 1) * gamma (snug_sr_bits), so starting n0 rows in is the seed moved on by n0 * in gammas. */
static uint64_t mask_seed(const snug_lora *lo, int l, const snug_lora_module *md, int n0) {
    uint64_t s = lo->seed ^ ((uint64_t)(lo->l0 + l + 1) * 0xD6E8FEB86659FD93ull) ^ ((uint64_t)(md->index + 1) << 56);
    return s + (uint64_t)n0 * (uint64_t)md->in * 0x9E3779B97F4A7C15ull;
}

/* Dropout applies: each module reads its own dropped-out input. */
static int dropping(const snug_lora *lo) { return lo->dropout > 0.0f && lo->xd && lo->training; }

/* DoRA on module md's dropped-out input xd, as PEFT computes it in training: out += (g - 1) (xd W^T) + g s (xd A^T)
 * B^T on the module's columns, g = mag / nrm; a chunk of rows at a time through dt. */
static void dora_drop_fwd(const snug_lora_ctx *cx, int l, const snug_lora_module *md, float *out, int width,
                          const float *xd, int N) {
    snug_lora *lo = cx->lora;
    snug_backend *be = cx->be;
    int r = lo->r, in = md->in;
    const float *P = lo->params + lo->table.layer_offset[l];
    const float *mag = P + md->m_off, *nrm = lo->dn + (size_t)l * lo->dn_per_layer + md->n_off;
    be->gemm_strided(be, 0, 1, N, r, in, 1.0f, xd, in, P + md->a_off, in, 0.0f, lo->u, r); /* u = xd A^T */
    for (int r0 = 0; r0 < md->rows; r0 += lo->dchunk) {
        int nr = md->rows - r0 < lo->dchunk ? md->rows - r0 : lo->dchunk;
        float *o = out + md->row0 + r0;
        cx->base_rows(cx->ud, l, md->site, md->row0 + r0, nr, in, lo->dw);
        be->gemm_strided(be, 0, 1, N, nr, in, 1.0f, xd, in, lo->dw, in, 0.0f, lo->dt, nr); /* xd W^T */
        be->add_scaled_cols(be, o, (size_t)width, lo->dt, (size_t)nr, N, nr, mag + r0, nrm + r0, 1.0f);
        be->gemm_strided(be, 0, 1, N, nr, r, lo->scale, lo->u, r, P + md->b_off + (size_t)r0 * r, r, 0.0f, lo->dt,
                         nr); /* s u B^T */
        be->add_scaled_cols(be, o, (size_t)width, lo->dt, (size_t)nr, N, nr, mag + r0, nrm + r0, 0.0f);
    }
}

/* The backward of dora_drop_fwd, with dy = dout's columns of the module: dmag += (sum over tokens of dy (xd W^T +
 * s u B^T)) / nrm; the adapter's share through gy = g dy (dB += s gy^T u, du = gy B, dA += s du^T xd); and dx +=
 * drop(((g - 1) dy) W + s du A), each chunk's rows adding to du and the masked sum vx. */
static void dora_drop_bwd(const snug_lora_ctx *cx, int l, const snug_lora_module *md, float *dx, const float *dout,
                          int width, const float *xd, int N, int n0) {
    snug_lora *lo = cx->lora;
    snug_backend *be = cx->be;
    int r = lo->r, in = md->in;
    size_t base = lo->table.layer_offset[l];
    const float *P = lo->params + base, *A = P + md->a_off;
    const float *mag = P + md->m_off, *nrm = lo->dn + (size_t)l * lo->dn_per_layer + md->n_off;
    float *G = lo->grads + base;
    be->gemm_strided(be, 0, 1, N, r, in, 1.0f, xd, in, A, in, 0.0f, lo->u, r); /* u = xd A^T */
    be->zero(be, lo->du, (size_t)N * r * sizeof(float));
    if (dx)
        be->zero(be, lo->vx, (size_t)N * in * sizeof(float));
    for (int r0 = 0; r0 < md->rows; r0 += lo->dchunk) {
        int nr = md->rows - r0 < lo->dchunk ? md->rows - r0 : lo->dchunk;
        const float *g = dout + md->row0 + r0, *B = P + md->b_off + (size_t)r0 * r;
        dmag_rows(cx, l, md, r0, nr, g, width, xd, lo->u, r, N); /* (W's rows then in dw) */
        be->scale_cols(be, lo->dt, (size_t)nr, g, (size_t)width, N, nr, mag + r0, nrm + r0, NULL); /* gy */
        be->gemm_strided(be, 0, 0, N, r, nr, 1.0f, lo->dt, nr, B, r, 1.0f, lo->du, r);  /* du += gy B */
        be->gemm_strided(be, 1, 0, nr, r, N, lo->scale, lo->dt, nr, lo->u, r, 1.0f, G + md->b_off + (size_t)r0 * r,
                         r); /* dB += s gy^T u */
        if (!dx)
            continue;
        be->zero(be, lo->dt, (size_t)N * nr * sizeof(float)); /* (g - 1) dy, then vx += it W */
        be->add_scaled_cols(be, lo->dt, (size_t)nr, g, (size_t)width, N, nr, mag + r0, nrm + r0, 1.0f);
        be->gemm_strided(be, 0, 0, N, in, nr, 1.0f, lo->dt, nr, lo->dw, in, 1.0f, lo->vx, in);
    }
    be->gemm_strided(be, 1, 0, r, in, N, lo->scale, lo->du, r, xd, in, 1.0f, G + md->a_off, in); /* dA */
    if (!dx)
        return;
    be->gemm_strided(be, 0, 0, N, in, r, lo->scale, lo->du, r, A, in, 1.0f, lo->vx, in); /* vx += s du A */
    be->dropout(be, lo->vx, lo->vx, (size_t)N * in, lo->dropout, mask_seed(lo, l, md, n0));
    be->accumulate(be, dx, lo->vx, (size_t)N * in);
}

/* The input the adapter of module md reads: x itself, or x dropped out into the workspace. */
static const float *adapter_input(const snug_lora_ctx *cx, int l, const snug_lora_module *md, const float *x, int N,
                                  int n0) {
    snug_lora *lo = cx->lora;
    if (!dropping(lo))
        return x;
    cx->be->dropout(cx->be, lo->xd, x, (size_t)N * md->in, lo->dropout, mask_seed(lo, l, md, n0));
    return lo->xd;
}

/* The n modules md[0 .. n-1] (of one site, their A's side by side) on their common input xin (N, in):
 * out[:, row0_j:row0_j+rows_j] += s u_j B_j^T, u (N, n r) = xin [A_0; ...; A_{n-1}]^T. */
static void group_fwd(const snug_lora_ctx *cx, int l, const snug_lora_module *md, int n, float *out, int width,
                      const float *xin, int N) {
    snug_lora *lo = cx->lora;
    snug_backend *be = cx->be;
    int r = lo->r, R = n * r, in = md->in;
    const float *P = lo->params + lo->table.layer_offset[l];
    be->gemm_strided(be, 0, 1, N, R, in, 1.0f, xin, in, P + md->a_off, in, 0.0f, lo->u, R); /* u = xin A^T */
    for (int j = 0; j < n; j++) /* out[:, row0:row0+rows] (N, rows) += s * u_j B_j^T */
        be->gemm_strided(be, 0, 1, N, md[j].rows, r, lo->scale, lo->u + j * r, R, P + md[j].b_off, r, 1.0f,
                         out + md[j].row0, width);
}

void snug_lora_fwd(const snug_lora_ctx *cx, int l, snug_site site, float *out, int width, const float *x, int N, int n0,
                   const float *bias) {
    snug_lora *lo = cx->lora;
    if (!adapted(lo, l))
        return;
    if (lo->dora && n0 == 0) /* (a tiled MLP's later shards reuse the first's) */
        snug_lora_dora_norms(cx, l, site);
    for (int i = 0; i < lo->nmod; i += lo->mod[i].group) {
        const snug_lora_module *md = &lo->mod[i];
        if (md->site != site)
            continue;
        if (!dropping(lo)) {
            group_fwd(cx, l, md, md->group, out, width, x, N);
            for (int j = 0; lo->dora && j < md->group; j++)
                dora_scale(cx, l, md + j, out, width, N, bias);
            continue;
        }
        for (int j = 0; j < md->group; j++) { /* each module through its own mask */
            const float *xd = adapter_input(cx, l, md + j, x, N, n0);
            if (lo->dora)
                dora_drop_fwd(cx, l, md + j, out, width, xd, N);
            else
                group_fwd(cx, l, md + j, 1, out, width, xd, N);
        }
    }
}

/* The backward of group_fwd: u recomputed, du (N, n r) = [g_0 B_0, ..., g_{n-1} B_{n-1}], dB_j += s g_j^T u_j,
 * dA (n r, in) += s du^T xin, and dx += s du A, through module md's mask when xin is its dropped-out input. */
static void group_bwd(const snug_lora_ctx *cx, int l, const snug_lora_module *md, int n, float *dx, const float *dout,
                      int width, const float *xin, const float *x, int N, int n0) {
    snug_lora *lo = cx->lora;
    snug_backend *be = cx->be;
    int r = lo->r, R = n * r, in = md->in;
    size_t base = lo->table.layer_offset[l];
    const float *P = lo->params + base, *A = P + md->a_off;
    float *G = lo->grads + base;
    be->gemm_strided(be, 0, 1, N, R, in, 1.0f, xin, in, A, in, 0.0f, lo->u, R); /* u = xin A^T */
    for (int j = 0; j < n; j++) {
        const float *g = dout + md[j].row0; /* (N, rows), row stride width */
        be->gemm_strided(be, 0, 0, N, r, md[j].rows, 1.0f, g, width, P + md[j].b_off, r, 0.0f, lo->du + j * r,
                         R); /* du_j = g_j B_j */
        be->gemm_strided(be, 1, 0, md[j].rows, r, N, lo->scale, g, width, lo->u + j * r, R, 1.0f, G + md[j].b_off,
                         r); /* dB_j += s g_j^T u_j */
    }
    be->gemm_strided(be, 1, 0, R, in, N, lo->scale, lo->du, R, xin, in, 1.0f, G + md->a_off, in); /* dA += s du^T xin */
    if (!dx) /* the input gradient is not needed (the first layer over a frozen embedding) */
        return;
    if (xin == x) { /* dx += s du A */
        be->gemm_strided(be, 0, 0, N, in, R, lo->scale, lo->du, R, A, in, 1.0f, dx, in);
    } else { /* through the same mask: dx += drop(s du A) */
        be->gemm_strided(be, 0, 0, N, in, R, lo->scale, lo->du, R, A, in, 0.0f, lo->xd, in);
        be->dropout(be, lo->xd, lo->xd, (size_t)N * in, lo->dropout, mask_seed(lo, l, md, n0));
        be->accumulate(be, dx, lo->xd, (size_t)N * in);
    }
}

void snug_lora_bwd(const snug_lora_ctx *cx, int l, snug_site site, float *dx, const float *dout, int width,
                   const float *x, int N, int n0) {
    snug_lora *lo = cx->lora;
    for (int i = 0; adapted(lo, l) && lo->grads && i < lo->nmod; i += lo->mod[i].group) {
        const snug_lora_module *md = &lo->mod[i];
        if (md->site != site)
            continue;
        if (!dropping(lo)) {
            group_bwd(cx, l, md, md->group, dx, dout, width, x, x, N, n0);
            continue;
        }
        for (int j = 0; j < md->group; j++) {
            const float *xd = adapter_input(cx, l, md + j, x, N, n0);
            if (lo->dora)
                dora_drop_bwd(cx, l, md + j, dx, dout, width, xd, N, n0);
            else
                group_bwd(cx, l, md + j, 1, dx, dout, width, xd, x, N, n0);
        }
    }
}
