/* views.c: which slot of the model's tensor views (snug_tensors, snug_layer_tensors) each named tensor fills, and
 * the views themselves: over the parameters, the gradients, and the one-layer buffers (a ZeRO-3 gather buffer, the
 * 16-bit widening buffer wl, QLoRA's dense tensors). */
#include "model/model_impl.h"

#include "model/family.h"

/* The bias slot paired with weight slot w (a norm's or a linear layer's), or NULL where the weight has none. */
static float **bias_of(float **w, snug_tensors *v, snug_layer_tensors *L) {
    if (!w)
        return NULL;
    if (!L)
        return w == &v->lnf_w ? &v->lnf_b : NULL;
    float **const pairs[][2] = {{&L->ln1_w, &L->ln1_b}, {&L->qkv_w, &L->qkv_b}, {&L->o_w, &L->o_b},
                                {&L->ln2_w, &L->ln2_b}, {&L->fc_w, &L->fc_b},   {&L->proj_w, &L->proj_b}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (w == pairs[i][0])
            return pairs[i][1];
    return NULL;
}

/* Whether n names the weight of module path p: ends in p + ".weight", after a '.' or as the whole name. */
static int names_weight(const char *n, const char *p) {
    size_t ln = strlen(n), lp = p ? strlen(p) : 0, lw = sizeof ".weight" - 1;
    return p && ln >= lp + lw && !strcmp(n + ln - lw, ".weight") && !strncmp(n + ln - lw - lp, p, lp) &&
           (ln == lp + lw || n[ln - lw - lp - 1] == '.');
}

/* The weight of site s's first module in scheme sc (q_proj of q/k/v, gate_proj of gate/up): the slot's view. */
static const char *site_weight(const snug_scheme *sc, snug_site s) {
    for (int k = 0; k < sc->n_modules; k++)
        if (sc->modules[k].site == s)
            return sc->modules[k].name;
    return NULL;
}

/* The slot a weight named as scheme sc names its tensors fills (family.c), or NULL. */
static float **scheme_slot(const snug_scheme *sc, const char *n, snug_tensors *v, snug_layer_tensors *L) {
    if (!L) {
        if (names_weight(n, sc->embed)) return &v->wte;
        if (names_weight(n, sc->pos_embed)) return &v->wpe;
        if (names_weight(n, sc->final_norm)) return &v->lnf_w;
        if (names_weight(n, sc->head)) return &v->lm_head;
        return NULL;
    }
    if (names_weight(n, sc->norm1)) return &L->ln1_w;
    if (names_weight(n, site_weight(sc, SNUG_SITE_QKV))) return &L->qkv_w;
    if (names_weight(n, site_weight(sc, SNUG_SITE_O))) return &L->o_w;
    if (names_weight(n, sc->norm2)) return &L->ln2_w;
    if (names_weight(n, site_weight(sc, SNUG_SITE_FC))) return &L->fc_w;
    if (names_weight(n, site_weight(sc, SNUG_SITE_PROJ))) return &L->proj_w;
    return NULL;
}

/* The slot of v (a global tensor) or of L (a layer tensor) that the tensor called `name` fills; NULL for none. A
 * fused matrix's view is its first part's (q_proj of q/k/v, gate_proj of gate/up), and a bias fills the slot paired
 * with its weight's (the same name ending in .weight); the names are those of the schemes of the family table. */
float **model_slot_of(const char *n, snug_tensors *v, snug_layer_tensors *L) {
    if (ends_with(n, ".bias")) {
        char w[256];
        size_t len = strlen(n) - strlen(".bias");
        if (len + sizeof ".weight" > sizeof w)
            return NULL;
        memcpy(w, n, len);
        memcpy(w + len, ".weight", sizeof ".weight");
        return bias_of(model_slot_of(w, v, L), v, L);
    }
    for (int a = 0; a < SNUG_NARCH; a++) {
        float **slot = scheme_slot(snug_scheme_of((snug_arch)a), n, v, L);
        if (slot)
            return slot;
    }
    return NULL;
}

/* Points the named slots of v at their ranges of the flat fp32 buffer `base` (tensor i at off[i], or at its table
 * offset when off is NULL). globals_only leaves the layer views NULL (their gradients are 16-bit). */
void model_make_views(const snug_model *m, float *base, const size_t *off, int globals_only, snug_tensors *v) {
    snug_layer_tensors *layers = v->layers;
    memset(v, 0, sizeof *v);
    v->layers = layers;
    memset(layers, 0, (size_t)m->cfg.n_layer * sizeof *layers);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        if (p->layer >= 0 && globals_only)
            continue;
        float **s = model_slot_of(p->name, v, p->layer < 0 ? NULL : &layers[p->layer]);
        if (s && !(off && off[i] == NO_GRAD))
            *s = base + (off ? off[i] : p->offset);
    }
    if (m->cfg.tie_embeddings)
        v->lm_head = v->wte;
}

/* Views of one layer's tensors in a buffer holding just that layer (every layer has layer 0's layout). */
void model_layer_views(const snug_model *m, float *base, snug_layer_tensors *L) {
    snug_tensors unused;
    memset(L, 0, sizeof *L);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = p->layer == 0 ? model_slot_of(p->name, &unused, L) : NULL;
        if (s)
            *s = base + (p->offset - m->table.layer_offset[0]);
    }
}

/* Where the global tensors start in the table (floats; (size_t)-1 when the arch has none). */
void model_global_offsets(snug_model *m) {
    snug_tensors v;
    memset(&v, 0, sizeof v);
    m->gwte = m->gwpe = m->glnf_w = m->glnf_b = m->ghead = (size_t)-1;
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = p->layer < 0 ? model_slot_of(p->name, &v, NULL) : NULL;
        size_t *o = s == &v.wte ? &m->gwte : s == &v.wpe ? &m->gwpe : s == &v.lnf_w ? &m->glnf_w
                  : s == &v.lnf_b ? &m->glnf_b : s == &v.lm_head ? &m->ghead : NULL;
        if (o)
            *o = m->soff ? m->soff[i] : p->offset;
    }
    if (m->cfg.tie_embeddings)
        m->ghead = m->gwte;
}

/* The table entry of the tied embedding (the first tensor), or -1. */
int model_wte_entry(const snug_model *m) {
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer < 0 && m->table.e[i].offset == m->gwte)
            return i;
    return -1;
}

/* The site whose weight a layer tensor is (the first of its rows: q_proj of q/k/v, gate_proj of gate/up), or -1 */
int model_weight_site(const char *name) {
    snug_tensors unused;
    snug_layer_tensors L;
    float **s = model_slot_of(name, &unused, &L);
    return s == &L.qkv_w ? SNUG_SITE_QKV : s == &L.o_w ? SNUG_SITE_O : s == &L.fc_w ? SNUG_SITE_FC
         : s == &L.proj_w ? SNUG_SITE_PROJ : -1;
}
