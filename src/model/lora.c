/* lora.c: LoRA adapters on the block's linear layers (see model.h, snug_lora).
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

#include "core/rng.h"
#include "model/model.h"

/* The adaptable modules of a block, in the order of the architecture's modules. */
typedef struct module_def {
    const char *name; /* Hugging Face module path inside a block */
    snug_site site;
} module_def;

static const module_def llama_modules[] = {
    {"self_attn.q_proj", SNUG_SITE_QKV}, {"self_attn.k_proj", SNUG_SITE_QKV}, {"self_attn.v_proj", SNUG_SITE_QKV},
    {"self_attn.o_proj", SNUG_SITE_O},   {"mlp.gate_proj", SNUG_SITE_FC},     {"mlp.up_proj", SNUG_SITE_FC},
    {"mlp.down_proj", SNUG_SITE_PROJ},
};
static const module_def gpt2_modules[] = {
    {"attn.c_attn", SNUG_SITE_QKV},
    {"attn.c_proj", SNUG_SITE_O},
    {"mlp.c_fc", SNUG_SITE_FC},
    {"mlp.c_proj", SNUG_SITE_PROJ},
};

static const module_def *modules(snug_arch arch, int *n) {
    if (arch == SNUG_ARCH_GPT2) {
        *n = (int)(sizeof gpt2_modules / sizeof *gpt2_modules);
        return gpt2_modules;
    }
    *n = (int)(sizeof llama_modules / sizeof *llama_modules);
    return llama_modules;
}

const char *snug_lora_module_name(snug_arch arch, int k) {
    int n;
    const module_def *d = modules(arch, &n);
    return k >= 0 && k < n ? d[k].name : NULL;
}

int snug_lora_module_count(snug_arch arch) {
    int n;
    modules(arch, &n);
    return n;
}

unsigned snug_lora_all_linear(snug_arch arch) { return (1u << snug_lora_module_count(arch)) - 1u; }

unsigned snug_lora_default_targets(snug_arch arch) { return arch == SNUG_ARCH_GPT2 ? 1u : (1u << 0) | (1u << 2); }

snug_site snug_lora_module_site(snug_arch arch, int k) {
    int n;
    const module_def *d = modules(arch, &n);
    return k >= 0 && k < n ? d[k].site : SNUG_NSITES;
}

void snug_lora_module_shape(const snug_model_config *c, int k, int *row0, int *rows, int *in) {
    int C = c->hidden_size, I = c->intermediate_size, q = c->n_head * c->head_dim, kv = c->n_kv_head * c->head_dim;
    if (c->arch == SNUG_ARCH_GPT2) {
        const int r0[] = {0, 0, 0, 0}, rs[] = {3 * C, C, I, C}, ins[] = {C, C, C, I};
        *row0 = r0[k], *rows = rs[k], *in = ins[k];
        return;
    }
    const int r0[] = {0, q, q + kv, 0, 0, I, 0}, rs[] = {q, kv, kv, C, I, I, C}, ins[] = {C, C, C, q, C, C, I};
    *row0 = r0[k], *rows = rs[k], *in = ins[k];
}

/* The base's table entry of a module lora_modules_to_save can train (SNUG_SAVE_EMBED or SNUG_SAVE_HEAD), -1 none. */
int snug_lora_saved_entry(const snug_model *m, unsigned bit) {
    for (int i = 0; i < m->table.n; i++) {
        const char *n = m->table.e[i].name;
        size_t len = strlen(n);
        const char *want = bit == SNUG_SAVE_HEAD ? "lm_head.weight" : "embed_tokens.weight";
        size_t k = strlen(want);
        if (m->table.e[i].layer < 0 && len >= k && !strcmp(n + len - k, want))
            return i;
    }
    return -1;
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

int snug_lora_build(snug_model *m, snug_error *e) {
    snug_lora *lo = &m->lora;
    snug_lora_free(lo);
    const snug_lora_cfg *lc = &m->lv.lora;
    if (lc->kind == SNUG_ADAPTER_NONE)
        return 0;
    const snug_model_config *c = &m->cfg;
    int nmod;
    const module_def *defs = modules(c->arch, &nmod);
    if (lc->r <= 0 || !(lc->targets & snug_lora_all_linear(c->arch)))
        return snug_fail(e, SNUG_EINPUT, "LoRA needs lora_r >= 1 and at least one target module of the model");
    int whole = m->pp > 1 ? m->pp_L : c->n_layer; /* (a pipeline stage's config holds its own layers) */
    for (int l = whole; snug_lora_layers_named(lc) && l < 256; l++)
        if (snug_lora_layer_on(lc, l))
            return snug_fail(e, SNUG_EINPUT, "lora_layers_to_transform names layer %d; the model's layers are 0 to %d",
                             l, whole - 1);
    lo->on = 1;
    lo->r = lc->r;
    lo->scale = lc->rslora ? lc->alpha / sqrtf((float)lc->r) : lc->alpha / (float)lc->r;
    lo->dropout = lc->dropout;
    lo->dora = lc->dora;
    for (int k = 0; k < nmod; k++) {
        if (!(lc->targets & (1u << k)))
            continue;
        snug_lora_module *md = &lo->mod[lo->nmod++];
        md->index = k;
        md->site = defs[k].site;
        snug_lora_module_shape(c, k, &md->row0, &md->rows, &md->in);
        lo->max_in = md->in > lo->max_in ? md->in : lo->max_in;
    }
    /* a layer's adapters, site by site: the A's of the site's modules (adjacent in mod[], one input width), then
     * their B's */
    size_t off = 0;
    for (int i = 0, n; i < lo->nmod; i += n) {
        snug_lora_module *md = &lo->mod[i];
        for (n = 1; i + n < lo->nmod && md[n].site == md->site;)
            n++;
        md->group = n;
        lo->max_group = n > lo->max_group ? n : lo->max_group;
        for (int j = 0; j < n; j++) {
            md[j].a_off = off;
            off += (size_t)lo->r * md[j].in;
        }
        for (int j = 0; j < n; j++) {
            md[j].b_off = off;
            off += (size_t)md[j].rows * lo->r;
        }
        for (int j = 0; j < n && lo->dora; j++) { /* DoRA: then their magnitudes */
            md[j].m_off = off;
            off += (size_t)md[j].rows;
            md[j].n_off = lo->dn_per_layer;
            lo->dn_per_layer += (size_t)md[j].rows;
        }
    }
    lo->per_layer = off;
    lo->l0 = m->pp > 1 ? m->pp_l0 : 0;
    /* the table, named as PEFT saves the adapters: base_model.model.<module>.lora_A.weight */
    int L = c->n_layer, cap = 0;
    snug_param_table *t = &lo->table;
    t->layer_offset = calloc((size_t)L + 1, sizeof *t->layer_offset);
    t->layer_numel = calloc((size_t)L + 1, sizeof *t->layer_numel);
    int rc = !t->layer_offset || !t->layer_numel;
    size_t at = 0;
    for (int l = 0; l < L && !rc; at += t->layer_numel[l], l++) {
        t->layer_offset[l] = at; /* a layer lora_layers_to_transform leaves out: no adapters, nothing in the table */
        t->layer_numel[l] = snug_lora_layer_on(lc, lo->l0 + l) ? lo->per_layer : 0;
        /* in PEFT's order (A then B, module by module), at the layout's offsets */
        for (int i = 0; i < lo->nmod && !rc && t->layer_numel[l]; i++) {
            const snug_lora_module *md = &lo->mod[i];
            char name[96];
            const char *pre = c->arch == SNUG_ARCH_GPT2 ? "transformer.h" : "model.layers";
            size_t a = at + md->a_off, b = at + md->b_off;
            snprintf(name, sizeof name, "base_model.model.%s.%d.%s.lora_A.weight", pre, lo->l0 + l,
                     defs[md->index].name);
            rc |= snug_param_table_add(t, &cap, &a, name, 2, lo->r, md->in, l, 0);
            snprintf(name, sizeof name, "base_model.model.%s.%d.%s.lora_B.weight", pre, lo->l0 + l,
                     defs[md->index].name);
            rc |= snug_param_table_add(t, &cap, &b, name, 2, md->rows, lo->r, l, 0);
            if (!rc && lc->loraplus > 0) /* LoRA+: B faster than A */
                t->e[t->n - 1].lr_scale = lc->loraplus;
            if (!lo->dora)
                continue;
            size_t mo = at + md->m_off;
            snprintf(name, sizeof name, "base_model.model.%s.%d.%s.lora_magnitude_vector", pre, lo->l0 + l,
                     defs[md->index].name);
            rc |= snug_param_table_add(t, &cap, &mo, name, 1, md->rows, 0, l, 0);
            if (!rc) /* decayed as Trainer decays it: a module's "weight", neither a bias nor a norm */
                t->e[t->n - 1].decay = 1;
            if (!rc && lc->loraplus > 0) /* (PEFT's LoRA+ puts 1-D tensors with the B's) */
                t->e[t->n - 1].lr_scale = lc->loraplus;
        }
    }
    /* lora_modules_to_save: each a full copy of the base's tensor, named as PEFT saves it */
    lo->emb_off = lo->head_off = (size_t)-1;
    for (int k = 0; k < 2 && !rc; k++) {
        unsigned bit = k ? SNUG_SAVE_HEAD : SNUG_SAVE_EMBED;
        if (!(lc->save_modules & bit) || (k ? !snug_pp_last(m) : !snug_pp_first(m))) /* (a pipeline stage's) */
            continue;
        if (c->tie_embeddings) {
            snug_lora_free(lo);
            return snug_fail(e, SNUG_EINPUT, "lora_modules_to_save: this model ties embed_tokens to lm_head (one "
                             "table for both), which snug does not train beside adapters; remove lora_modules_to_save");
        }
        int base = snug_lora_saved_entry(m, bit);
        if (base < 0) {
            snug_lora_free(lo);
            return snug_fail(e, SNUG_EINPUT, "lora_modules_to_save: the model has no %s",
                             k ? "lm_head" : "embed_tokens");
        }
        const snug_param_entry *p = &m->table.e[base];
        char name[128];
        snprintf(name, sizeof name, "base_model.model.%s", p->name);
        *(k ? &lo->head_off : &lo->emb_off) = at;
        rc |= snug_param_table_add(t, &cap, &at, name, 2, p->shape[0], p->shape[1], -1, 0);
    }
    t->total = at;
    if (rc) {
        snug_lora_free(lo);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory building the adapter table");
    }
    return 0;
}

void snug_lora_copy(snug_model *dst, const snug_model *src) {
    size_t n = src->lora.table.total * sizeof(float);
    float *host = src->be->host_resident ? src->lora.params : malloc(n ? n : 1);
    if (!host || !dst->lora.on)
        return;
    if (host != src->lora.params)
        src->be->to_host(src->be, host, src->lora.params, n);
    dst->be->to_device(dst->be, dst->lora.params, host, n);
    if (host != src->lora.params)
        free(host);
}

void snug_lora_free(snug_lora *lo) {
    snug_param_table_free(&lo->table);
    memset(lo, 0, sizeof *lo);
}

static int dropping(const snug_lora *lo);

/* DoRA: nrm (rows) = the row norms of module md's W + s B A in layer l, dchunk rows at a time in dw */
static void dora_norms(snug_model *m, int l, const snug_lora_module *md, float *nrm) {
    snug_lora *lo = &m->lora;
    snug_backend *be = m->be;
    const float *P = lo->params + lo->table.layer_offset[l];
    for (int r0 = 0; r0 < md->rows; r0 += lo->dchunk) {
        int nr = md->rows - r0 < lo->dchunk ? md->rows - r0 : lo->dchunk;
        snug_model_site_rows(m, l, md->site, md->row0 + r0, nr, md->in, lo->dw);
        be->gemm_strided(be, 0, 0, nr, md->in, lo->r, lo->scale, P + md->b_off + (size_t)r0 * lo->r, lo->r,
                         P + md->a_off, md->in, 1.0f, lo->dw, md->in); /* += s B A */
        be->row_norms(be, nrm + r0, lo->dw, (size_t)md->in, nr, md->in);
    }
}

/* Layer l has adapters (lora_layers_to_transform may leave it out). */
static int adapted(const snug_lora *lo, int l) { return lo->on && lo->table.layer_numel[l]; }

void snug_lora_dora_norms(snug_model *m, int l, snug_site site) {
    snug_lora *lo = &m->lora;
    for (int i = 0; adapted(lo, l) && lo->dora && !lo->dora_fixed && i < lo->nmod; i++)
        if (lo->mod[i].site == site)
            dora_norms(m, l, &lo->mod[i], lo->dn + (size_t)l * lo->dn_per_layer + lo->mod[i].n_off);
}

/* DoRA's scale of module md's output columns: out = bias + (mag / nrm) (out - bias) */
static void dora_scale(snug_model *m, int l, const snug_lora_module *md, float *out, int width, int N,
                       const float *bias) {
    snug_lora *lo = &m->lora;
    const float *mag = lo->params + lo->table.layer_offset[l] + md->m_off;
    const float *nrm = lo->dn + (size_t)l * lo->dn_per_layer + md->n_off;
    m->be->scale_cols(m->be, out + md->row0, (size_t)width, out + md->row0, (size_t)width, N, md->rows, mag, nrm,
                      bias ? bias + md->row0 : NULL);
}

/* DoRA: rows [r0, r0 + nr) of module md's magnitude gradient, added once: (sum over tokens of dy (x W^T + s u B^T))
 * / nrm, the products taken as row dots of W with dy^T x and of B with s dy^T u. g: dy's first column of the chunk
 * (row stride width); u = x A^T (row stride ldu). Leaves the chunk's rows of W in dw. */
static void dmag_rows(snug_model *m, int l, const snug_lora_module *md, int r0, int nr, const float *g, int width,
                      const float *x, const float *u, int ldu, int N) {
    snug_lora *lo = &m->lora;
    snug_backend *be = m->be;
    int r = lo->r, in = md->in;
    size_t base = lo->table.layer_offset[l];
    const float *nrm = lo->dn + (size_t)l * lo->dn_per_layer + md->n_off + r0;
    be->zero(be, lo->dmt, (size_t)nr * sizeof *lo->dmt);
    be->gemm_strided(be, 1, 0, nr, r, N, lo->scale, g, width, u, ldu, 0.0f, lo->dp, r);
    be->row_dots(be, lo->dmt, lo->params + base + md->b_off + (size_t)r0 * r, (size_t)r, lo->dp, (size_t)r, nr, r, nrm);
    snug_model_site_rows(m, l, md->site, md->row0 + r0, nr, in, lo->dw);
    be->gemm_strided(be, 1, 0, nr, in, N, 1.0f, g, width, x, in, 0.0f, lo->dp, in);
    be->row_dots(be, lo->dmt, lo->dw, (size_t)in, lo->dp, (size_t)in, nr, in, nrm);
    /* once per micro-batch, as the GEMMs add dA and dB: data parallel's sum over ranks then has the bits of one
     * process accumulating */
    be->accumulate(be, lo->grads + base + md->m_off + r0, lo->dmt, (size_t)nr);
}

const float *snug_lora_dora_bwd(snug_model *m, int l, snug_site site, float *dout, int width, const float *x, int N,
                                const float *y, const float *bias, int in_place) {
    snug_lora *lo = &m->lora;
    snug_backend *be = m->be;
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
                    dmag_rows(m, l, mj, r0, nr, dout + c0, width, x, lo->u + j * r, R, N);
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

void snug_lora_dora_start(snug_model *m) {
    snug_lora *lo = &m->lora;
    for (int l = 0; lo->dora_pending && l < m->cfg.n_layer; l++)
        for (int i = 0; adapted(lo, l) && i < lo->nmod; i++)
            dora_norms(m, l, &lo->mod[i], lo->params + lo->table.layer_offset[l] + lo->mod[i].m_off);
    lo->dora_pending = 0;
}

int snug_lora_init(snug_model *m, uint64_t seed) {
    snug_lora *lo = &m->lora;
    if (!lo->on)
        return 0;
    float *host = calloc(lo->table.total ? lo->table.total : 1, sizeof *host);
    if (!host)
        return SNUG_ENOMEM;
    for (int i = 0; i < lo->table.n; i++) {
        const snug_param_entry *p = &lo->table.e[i];
        if (!strstr(p->name, ".lora_A."))
            continue; /* B stays zero: the adapted model starts as the base */
        /* torch's kaiming_uniform_(a = sqrt(5)) on (r, in): U(-1/sqrt(in), 1/sqrt(in)) */
        float bound = 1.0f / sqrtf((float)p->shape[1]);
        /* (a pipeline stage's entries: their index in the whole model's table, 2 per module and layer before, 3
         * with DoRA) */
        uint64_t s = seed * 0x100000001B3ull +
                     (uint64_t)(i + (2 + lo->dora) * lo->nmod * lo->l0) * 0x9E3779B97F4A7C15ull;
        for (size_t k = 0; k < p->numel; k++) {
            double u = ((snug_splitmix64(&s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
            host[p->offset + k] = (float)((2.0 * u - 1.0) * bound);
        }
    }
    m->be->to_device(m->be, lo->params, host, lo->table.total * sizeof *host);
    free(host);
    /* DoRA's magnitudes start as the base's row norms (B = 0: |W + s B A| = |W|), so the model starts as the base; a
     * base sharded over ranks is read through its gathers, which exist once the ranks are joined: later */
    lo->dora_pending = lo->dora;
    if (!(m->nranks > 1 && (m->param_sharded || m->q4_sharded)))
        snug_lora_dora_start(m);
    /* a module trained in full starts as the base's tensor (PEFT copies the original module); a sharded base (ZeRO-3)
     * is not whole on any rank: the copies are then read from the base's file (snug_lora_saved_from_file) */
    if (m->param_sharded)
        return 0;
    if (lo->emb_off != (size_t)-1)
        snug_model_entry_f32(m, snug_lora_saved_entry(m, SNUG_SAVE_EMBED), lo->params + lo->emb_off);
    if (lo->head_off != (size_t)-1)
        snug_model_entry_f32(m, snug_lora_saved_entry(m, SNUG_SAVE_HEAD), lo->params + lo->head_off);
    return 0;
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
static void dora_drop_fwd(snug_model *m, int l, const snug_lora_module *md, float *out, int width, const float *xd,
                          int N) {
    snug_lora *lo = &m->lora;
    snug_backend *be = m->be;
    int r = lo->r, in = md->in;
    const float *P = lo->params + lo->table.layer_offset[l];
    const float *mag = P + md->m_off, *nrm = lo->dn + (size_t)l * lo->dn_per_layer + md->n_off;
    be->gemm_strided(be, 0, 1, N, r, in, 1.0f, xd, in, P + md->a_off, in, 0.0f, lo->u, r); /* u = xd A^T */
    for (int r0 = 0; r0 < md->rows; r0 += lo->dchunk) {
        int nr = md->rows - r0 < lo->dchunk ? md->rows - r0 : lo->dchunk;
        float *o = out + md->row0 + r0;
        snug_model_site_rows(m, l, md->site, md->row0 + r0, nr, in, lo->dw);
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
static void dora_drop_bwd(snug_model *m, int l, const snug_lora_module *md, float *dx, const float *dout, int width,
                          const float *xd, int N, int n0) {
    snug_lora *lo = &m->lora;
    snug_backend *be = m->be;
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
        dmag_rows(m, l, md, r0, nr, g, width, xd, lo->u, r, N); /* (W's rows then in dw) */
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
static const float *adapter_input(snug_model *m, int l, const snug_lora_module *md, const float *x, int N, int n0) {
    snug_lora *lo = &m->lora;
    if (!dropping(lo))
        return x;
    m->be->dropout(m->be, lo->xd, x, (size_t)N * md->in, lo->dropout, mask_seed(lo, l, md, n0));
    return lo->xd;
}

/* The n modules md[0 .. n-1] (of one site, their A's side by side) on their common input xin (N, in):
 * out[:, row0_j:row0_j+rows_j] += s u_j B_j^T, u (N, n r) = xin [A_0; ...; A_{n-1}]^T. */
static void group_fwd(snug_model *m, int l, const snug_lora_module *md, int n, float *out, int width,
                      const float *xin, int N) {
    snug_lora *lo = &m->lora;
    snug_backend *be = m->be;
    int r = lo->r, R = n * r, in = md->in;
    const float *P = lo->params + lo->table.layer_offset[l];
    be->gemm_strided(be, 0, 1, N, R, in, 1.0f, xin, in, P + md->a_off, in, 0.0f, lo->u, R); /* u = xin A^T */
    for (int j = 0; j < n; j++) /* out[:, row0:row0+rows] (N, rows) += s * u_j B_j^T */
        be->gemm_strided(be, 0, 1, N, md[j].rows, r, lo->scale, lo->u + j * r, R, P + md[j].b_off, r, 1.0f,
                         out + md[j].row0, width);
}

void snug_lora_fwd(snug_model *m, int l, snug_site site, float *out, int width, const float *x, int N, int n0,
                   const float *bias) {
    snug_lora *lo = &m->lora;
    if (!adapted(lo, l))
        return;
    if (lo->dora && n0 == 0) /* (a tiled MLP's later shards reuse the first's) */
        snug_lora_dora_norms(m, l, site);
    for (int i = 0; i < lo->nmod; i += lo->mod[i].group) {
        const snug_lora_module *md = &lo->mod[i];
        if (md->site != site)
            continue;
        if (!dropping(lo)) {
            group_fwd(m, l, md, md->group, out, width, x, N);
            for (int j = 0; lo->dora && j < md->group; j++)
                dora_scale(m, l, md + j, out, width, N, bias);
            continue;
        }
        for (int j = 0; j < md->group; j++) { /* each module through its own mask */
            const float *xd = adapter_input(m, l, md + j, x, N, n0);
            if (lo->dora)
                dora_drop_fwd(m, l, md + j, out, width, xd, N);
            else
                group_fwd(m, l, md + j, 1, out, width, xd, N);
        }
    }
}

/* The backward of group_fwd: u recomputed, du (N, n r) = [g_0 B_0, ..., g_{n-1} B_{n-1}], dB_j += s g_j^T u_j,
 * dA (n r, in) += s du^T xin, and dx += s du A, through module md's mask when xin is its dropped-out input. */
static void group_bwd(snug_model *m, int l, const snug_lora_module *md, int n, float *dx, const float *dout,
                      int width, const float *xin, const float *x, int N, int n0) {
    snug_lora *lo = &m->lora;
    snug_backend *be = m->be;
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

void snug_lora_bwd(snug_model *m, int l, snug_site site, float *dx, const float *dout, int width, const float *x,
                   int N, int n0) {
    snug_lora *lo = &m->lora;
    for (int i = 0; adapted(lo, l) && lo->grads && i < lo->nmod; i += lo->mod[i].group) {
        const snug_lora_module *md = &lo->mod[i];
        if (md->site != site)
            continue;
        if (!dropping(lo)) {
            group_bwd(m, l, md, md->group, dx, dout, width, x, x, N, n0);
            continue;
        }
        for (int j = 0; j < md->group; j++) {
            const float *xd = adapter_input(m, l, md + j, x, N, n0);
            if (lo->dora)
                dora_drop_bwd(m, l, md + j, dx, dout, width, xd, N, n0);
            else
                group_bwd(m, l, md + j, 1, dx, dout, width, xd, x, N, n0);
        }
    }
}
