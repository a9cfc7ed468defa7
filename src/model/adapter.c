/* adapter.c: the adapters fitted to a model (the model's side of lora.h): their table and modules from the model's
 * config and levers (snug_lora_build, called by the layout), their initial values (PEFT's, and DoRA's magnitudes from
 * the base), the trained copies of lora_modules_to_save, and the base weight's rows that DoRA reads, handed to the
 * adapters through a snug_lora_ctx (model_lora_ctx). */
#include "model/model_impl.h"

#include "core/rng.h"
#include "model/family.h"

void model_lora_rows(void *ud, int l, snug_site site, int row, int nr, int in, float *dst) {
    snug_model_site_rows((snug_model *)ud, l, site, row, nr, in, dst);
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

int snug_lora_build(snug_model *m, snug_error *e) {
    snug_lora *lo = &m->lora;
    snug_lora_free(lo);
    const snug_lora_cfg *lc = &m->lv.lora;
    if (lc->kind == SNUG_ADAPTER_NONE)
        return 0;
    const snug_model_config *c = &m->cfg;
    int nmod = snug_lora_module_count(c->arch);
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
        md->site = snug_lora_module_site(c->arch, k);
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
            const char *pre = snug_scheme_of(c->arch)->layers;
            size_t a = at + md->a_off, b = at + md->b_off;
            snprintf(name, sizeof name, "base_model.model.%s.%d.%s.lora_A.weight", pre, lo->l0 + l,
                     snug_lora_module_name(c->arch, md->index));
            rc |= snug_param_table_add(t, &cap, &a, name, 2, lo->r, md->in, l, 0);
            snprintf(name, sizeof name, "base_model.model.%s.%d.%s.lora_B.weight", pre, lo->l0 + l,
                     snug_lora_module_name(c->arch, md->index));
            rc |= snug_param_table_add(t, &cap, &b, name, 2, md->rows, lo->r, l, 0);
            if (!rc && lc->loraplus > 0) /* LoRA+: B faster than A */
                t->e[t->n - 1].lr_scale = lc->loraplus;
            if (!lo->dora)
                continue;
            size_t mo = at + md->m_off;
            snprintf(name, sizeof name, "base_model.model.%s.%d.%s.lora_magnitude_vector", pre, lo->l0 + l,
                     snug_lora_module_name(c->arch, md->index));
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

void snug_lora_dora_start(snug_model *m) {
    snug_lora_ctx cx = model_lora_ctx(m);
    snug_lora_dora_magnitudes(&cx, m->cfg.n_layer);
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
