/* grads.c: the gradients: where each tensor's gradient lives (grad_off, grads or grads16), the views of frozen
 * tensors dropped and their gradients zeroed (unfrozen_parameters), and the groups and ranges the grads-ready
 * callback announces as backward completes them. */
#include "model/model_impl.h"

/* Whether table entry j has a gradient view of its own (not one of the tensors after q_proj or gate_proj, which
 * share the fused view of the first). */
static int has_view(const snug_model *m, int j) {
    snug_tensors v;
    snug_layer_tensors L;
    return model_slot_of(m->table.e[j].name, &v, m->table.e[j].layer < 0 ? NULL : &L) != NULL;
}

/* Whether tensor i needs gradient storage: it trains, or one of the tensors it shares a fused gradient view with does
 * (q/k/v, gate/up: one GEMM writes their gradients together). */
static int grad_kept(const snug_model *m, int i) {
    const snug_param_entry *e = m->table.e;
    int h = i; /* the first tensor of i's view */
    while (h > 0 && e[h - 1].layer == e[i].layer && !has_view(m, h))
        h--;
    for (int j = h; j < m->table.n && e[j].layer == e[i].layer && (j == h || !has_view(m, j)); j++)
        if (!e[j].frozen)
            return 1;
    return 0;
}

/* unfrozen_parameters: the gradient views of layer l (l >= 0, into g) or of the global tensors (l < 0, into v) whose
 * tensors are all frozen, NULL, so backward computes no gradient for them (a fused view stays while one of its
 * tensors trains). */
void model_drop_frozen(const snug_model *m, int l, snug_layer_tensors *g, snug_tensors *v) {
    snug_tensors unused;
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = (l >= 0 ? p->layer == l : p->layer < 0)
                        ? model_slot_of(p->name, l >= 0 ? &unused : v, l >= 0 ? g : NULL)
                        : NULL;
        if (s && !grad_kept(m, i))
            *s = NULL;
    }
    if (l < 0 && m->cfg.tie_embeddings)
        v->lm_head = v->wte;
}

/* unfrozen_parameters: the gradient of each frozen tensor of announcement `group` (snug_model_ready_group) zeroed,
 * and of a tensor trained in ranges the rows outside them, before the gradients are announced or read. */
void model_mask_frozen(snug_model *m, int group) {
    if (!m->frozen_any || !m->grad_off || !(m->grads || m->grads16))
        return;
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        if ((!p->frozen && !p->nkeep) || snug_model_ready_group(m, i) != group)
            continue;
        snug_dtype dt;
        unsigned char *g = snug_model_grad(m, i, &dt);
        if (!g) /* no gradient stored (lv.pack_grads) */
            continue;
        size_t es = snug_dtype_size(dt), row = p->numel / (size_t)p->shape[0] * es;
        if (p->frozen) {
            m->be->zero(m->be, g, p->numel * es);
            continue;
        }
        int64_t r = 0; /* the rows before each kept range, then those after the last */
        for (int k = 0; k <= p->nkeep; k++) {
            int64_t end = k < p->nkeep ? p->keep[k][0] : p->shape[0];
            if (end > r)
                m->be->zero(m->be, g + (size_t)r * row, (size_t)(end - r) * row);
            if (k < p->nkeep)
                r = p->keep[k][1];
        }
    }
}

int snug_model_grad16(const snug_model *m, int i) {
    return is16(m) && !m->lv.grads_fp32 && m->table.e[i].layer >= 0;
}

void *snug_model_grad(const snug_model *m, int i, snug_dtype *dt) {
    int g16 = snug_model_grad16(m, i);
    *dt = g16 ? m->lv.dt : SNUG_DT_F32;
    if (m->grad_off[i] == NO_GRAD)
        return NULL;
    return g16 ? (void *)(m->grads16 + m->grad_off[i]) : (void *)(m->grads + m->grad_off[i]);
}

/* Whether table entry i is a global tensor after the layers (the final norm, an untied head). */
static int post_global(const snug_model *m, int i) {
    const snug_param_table *t = &m->table;
    int L = m->cfg.n_layer;
    return t->e[i].layer < 0 && L > 0 && t->e[i].offset >= t->layer_offset[L - 1] + t->layer_numel[L - 1];
}

int snug_model_ready_group(const snug_model *m, int i) {
    if (m->table.e[i].layer >= 0)
        return m->table.e[i].layer;
    if (m->vtied && m->table.e[i].offset == m->gwte) /* reduced by the rows hook, never announced */
        return SNUG_READY_ROWS;
    return m->lv.zero_grads && post_global(m, i) ? SNUG_READY_POST : -1;
}

int snug_model_ready_ranges(const snug_model *m, int layer, snug_grad_range *out, int max) {
    const snug_param_table *t = &m->table;
    int n = 0, have = m->grad_off && (m->grads || m->grads16);
    snug_grad_range cur = {0};
    for (int i = 0; i <= t->n; i++) { /* i == t->n closes the last range */
        const snug_param_entry *p = i < t->n && snug_model_ready_group(m, i) == layer ? &t->e[i] : NULL;
        if (p && have && m->grad_off[i] == NO_GRAD) /* a frozen tensor without a gradient */
            p = NULL;
        snug_dtype dt = SNUG_DT_F32;
        void *g = p && have ? snug_model_grad(m, i, &dt) : NULL;
        size_t at = p ? (have ? m->grad_off[i] : p->offset) : 0;
        int extends = p && cur.numel && p->offset == cur.offset + cur.numel && dt == cur.dt && at == cur.at + cur.numel;
        if (cur.numel && !extends) { /* the current range ends here */
            if (n < max)
                out[n] = cur;
            n++;
            cur.numel = 0;
        }
        if (!p)
            continue;
        if (extends)
            cur.numel += p->numel;
        else
            cur = (snug_grad_range){.offset = p->offset, .numel = p->numel, .dt = dt, .at = at, .data = g};
    }
    return n;
}

/* The global tensors of announcement `group` (-1, or SNUG_READY_POST) as the one range of the table that the
 * grads-ready callback announces: from the first one after the layers, wrapping past the end of the table to the
 * ones before them (see model.h). */
static void globals_span(const snug_model *m, int group, size_t *offset, size_t *numel) {
    snug_grad_range r[SNUG_READY_MAX_RANGES];
    int n = snug_model_ready_ranges(m, group, r, SNUG_READY_MAX_RANGES);
    *offset = n ? r[n - 1].offset : 0;
    *numel = 0;
    for (int k = 0; k < n && k < SNUG_READY_MAX_RANGES; k++)
        *numel += r[k].numel;
}

/* grads_ready for the global tensors of `group` (-1, or SNUG_READY_POST), when the hook is set; their gradients
 * final (frozen ones zeroed) either way. */
void model_announce_globals(snug_model *m, int group) {
    model_mask_frozen(m, group);
    if (!model_hooks(m)->grads_ready)
        return;
    size_t off, n;
    globals_span(m, group, &off, &n);
    model_hooks(m)->grads_ready(m->hooks.ud, group, off, n);
}

/* Where each tensor's gradient lives (snug_model.grad_off). Normally the flat layout of the parameters. With 16-bit
 * layer gradients, the global tensors are packed into grads and the layers into grads16. With
 * optimizer_in_backward (and ZeRO-2's zero_grads), one buffer the size of the largest layer takes every layer's
 * gradients in turn: no full-model gradient buffer exists. ZeRO-2's zero_overlap has two, the even layers' and the
 * odd layers'. */
int model_grad_offsets(snug_model *m, snug_error *e) {
    const snug_param_table *t = &m->table;
    int g16 = is16(m) && !m->lv.grads_fp32, oib = m->lv.optimizer_in_backward || m->lv.zero_grads;
    free(m->grad_off);
    m->grad_off = malloc((size_t)(t->n ? t->n : 1) * sizeof *m->grad_off);
    if (!m->grad_off)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the gradient layout");
    m->grads16_numel = 0;
    int pack = 0; /* frozen tensors without storage: the kept ones packed in table order */
    for (int i = 0; i < t->n && m->lv.pack_grads && !oib; i++)
        pack |= t->e[i].frozen;
    if (!oib && !g16) {
        size_t at = 0;
        for (int i = 0; i < t->n; i++) {
            int kept = !pack || grad_kept(m, i);
            m->grad_off[i] = !kept ? NO_GRAD : pack ? at : t->e[i].offset;
            at += kept ? t->e[i].numel : 0;
        }
        m->grads_numel = pack ? at : t->total;
        return 0;
    }
    /* The global tensors first, in table order (pre = those before the layers, post = after), then one layer's
     * buffer (16-bit: every layer's, or the one, in grads16). Under ZeRO-2/3 the post-layer globals are announced
     * (and their buffer free) before the first layer's backward, and the pre-layer ones are written only by the
     * embedding's backward, after the last layer's: post and the layer buffer share their place, and unless the
     * head is tied (its gradient is the embedding's, accumulating from the loss on) pre shares it too. */
    int apart = m->lv.zero_grads, tied = m->cfg.tie_embeddings, wte = m->vtied ? model_wte_entry(m) : -1;
    size_t pre = 0, post = 0, layers = 0, lmax = model_largest_layer(m);
    for (int i = 0; i < t->n; i++)
        if (t->e[i].layer < 0 && pack && !grad_kept(m, i))
            m->grad_off[i] = NO_GRAD;
        else if (t->e[i].layer < 0 && !post_global(m, i) && i != wte)
            m->grad_off[i] = pre, pre += t->e[i].numel;
    /* where the post-layer globals start; split by rows (vtied), the embedding's gradient is one block of the head's
     * rows at a time in the layers' buffer during the loss (and its looked-up rows in ubuf) */
    size_t base = apart && (!tied || wte >= 0) ? 0 : pre;
    if (wte >= 0) {
        m->grad_off[wte] = base;
        lmax = lmax > (size_t)m->vb * m->cfg.hidden_size ? lmax : (size_t)m->vb * m->cfg.hidden_size;
    }
    for (int i = 0; i < t->n; i++)
        if (t->e[i].layer < 0 && post_global(m, i) && (!pack || grad_kept(m, i)))
            m->grad_off[i] = base + post, post += t->e[i].numel;
    size_t lbase = apart ? base : pre + post; /* where the fp32 layer buffer starts */
    /* zero_overlap: the odd layers in a second buffer after the first, which the head's blocks may have widened.
     * The pre-layer globals still share the first: layer 0's reduce-scatter is finished before the embeddings'
     * backward writes them (rank_hooks.c) */
    int two = m->lv.zero_overlap && apart && !g16;
    size_t second = two ? model_largest_layer(m) : 0;
    for (int l = 0; l < m->cfg.n_layer && !pack; l++)
        layers += t->layer_numel[l];
    for (int i = 0; i < t->n; i++) {
        const snug_param_entry *p = &t->e[i];
        if (p->layer < 0)
            continue;
        if (pack && !grad_kept(m, i)) {
            m->grad_off[i] = NO_GRAD;
            continue;
        }
        size_t in_layers = pack ? layers : oib ? p->offset - t->layer_offset[p->layer] : p->offset - t->layer_offset[0];
        layers += pack ? p->numel : 0;
        m->grad_off[i] = g16 ? in_layers : lbase + in_layers + (two && p->layer % 2 ? lmax : 0);
    }
    size_t end = base + post;
    if (!g16)
        end = lbase + lmax + second > end ? lbase + lmax + second : end;
    m->grads_numel = end > pre ? end : pre;
    m->grads16_numel = g16 ? (oib ? lmax : layers) : 0;
    return 0;
}
