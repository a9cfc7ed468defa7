/* model.c: layout, initialisation, forward and backward of the transformer (see model.h).
 *
 * One layer implementation serves Llama-family and GPT-2 models: the differences (RMSNorm or LayerNorm, RoPE or
 * learned positions, SwiGLU or GELU, biases) are read from the config, not copied into separate code paths. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

#define NO_GRAD ((size_t)-1) /* grad_off of a frozen tensor without gradient storage (lv.pack_grads) */

/* The slot of v (a global tensor) or of L (a layer tensor) that the tensor called `name` fills; NULL for none. */
static float **slot_of(const char *n, snug_tensors *v, snug_layer_tensors *L) {
    if (!L) {
        if (ends_with(n, "embed_tokens.weight") || ends_with(n, "wte.weight")) return &v->wte;
        if (ends_with(n, "wpe.weight")) return &v->wpe;
        if (ends_with(n, "model.norm.weight") || ends_with(n, "ln_f.weight")) return &v->lnf_w;
        if (ends_with(n, "ln_f.bias")) return &v->lnf_b;
        if (ends_with(n, "lm_head.weight")) return &v->lm_head;
        return NULL;
    }
    if (ends_with(n, "input_layernorm.weight") || ends_with(n, "ln_1.weight")) return &L->ln1_w;
    if (ends_with(n, "ln_1.bias")) return &L->ln1_b;
    if (ends_with(n, "q_proj.weight") || ends_with(n, "c_attn.weight")) return &L->qkv_w;
    if (ends_with(n, "q_proj.bias") || ends_with(n, "c_attn.bias")) return &L->qkv_b;
    if (ends_with(n, "o_proj.weight") || ends_with(n, "attn.c_proj.weight")) return &L->o_w;
    if (ends_with(n, "o_proj.bias") || ends_with(n, "attn.c_proj.bias")) return &L->o_b;
    if (ends_with(n, "post_attention_layernorm.weight") || ends_with(n, "ln_2.weight")) return &L->ln2_w;
    if (ends_with(n, "ln_2.bias")) return &L->ln2_b;
    if (ends_with(n, "gate_proj.weight") || ends_with(n, "c_fc.weight")) return &L->fc_w;
    if (ends_with(n, "gate_proj.bias") || ends_with(n, "c_fc.bias")) return &L->fc_b;
    if (ends_with(n, "down_proj.weight") || ends_with(n, "mlp.c_proj.weight")) return &L->proj_w;
    if (ends_with(n, "down_proj.bias") || ends_with(n, "mlp.c_proj.bias")) return &L->proj_b;
    return NULL;
}

/* Points the named slots of v at their ranges of the flat fp32 buffer `base` (tensor i at off[i], or at its table
 * offset when off is NULL). globals_only leaves the layer views NULL (their gradients are 16-bit). */
static void make_views(const snug_model *m, float *base, const size_t *off, int globals_only, snug_tensors *v) {
    snug_layer_tensors *layers = v->layers;
    memset(v, 0, sizeof *v);
    v->layers = layers;
    memset(layers, 0, (size_t)m->cfg.n_layer * sizeof *layers);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        if (p->layer >= 0 && globals_only)
            continue;
        float **s = slot_of(p->name, v, p->layer < 0 ? NULL : &layers[p->layer]);
        if (s && !(off && off[i] == NO_GRAD))
            *s = base + (off ? off[i] : p->offset);
    }
    if (m->cfg.tie_embeddings)
        v->lm_head = v->wte;
}

/* Whether table entry j has a gradient view of its own (not one of the tensors after q_proj or gate_proj, which
 * share the fused view of the first). */
static int has_view(const snug_model *m, int j) {
    snug_tensors v;
    snug_layer_tensors L;
    return slot_of(m->table.e[j].name, &v, m->table.e[j].layer < 0 ? NULL : &L) != NULL;
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
static void drop_frozen(const snug_model *m, int l, snug_layer_tensors *g, snug_tensors *v) {
    snug_tensors unused;
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = (l >= 0 ? p->layer == l : p->layer < 0) ? slot_of(p->name, l >= 0 ? &unused : v, l >= 0 ? g : NULL)
                                                             : NULL;
        if (s && !grad_kept(m, i))
            *s = NULL;
    }
    if (l < 0 && m->cfg.tie_embeddings)
        v->lm_head = v->wte;
}

/* unfrozen_parameters: the gradient of each frozen tensor of announcement `group` (snug_model_ready_group) zeroed,
 * and of a tensor trained in ranges the rows outside them, before the gradients are announced or read. */
static void mask_frozen(snug_model *m, int group) {
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

/* Views of one layer's tensors in a buffer holding just that layer (every layer has layer 0's layout). */
static void layer_views(const snug_model *m, float *base, snug_layer_tensors *L) {
    snug_tensors unused;
    memset(L, 0, sizeof *L);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = p->layer == 0 ? slot_of(p->name, &unused, L) : NULL;
        if (s)
            *s = base + (p->offset - m->table.layer_offset[0]);
    }
}

/* Where the global tensors start in the table (floats; (size_t)-1 when the arch has none). */
static void global_offsets(snug_model *m) {
    snug_tensors v;
    memset(&v, 0, sizeof v);
    m->gwte = m->gwpe = m->glnf_w = m->glnf_b = m->ghead = (size_t)-1;
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = p->layer < 0 ? slot_of(p->name, &v, NULL) : NULL;
        size_t *o = s == &v.wte ? &m->gwte : s == &v.wpe ? &m->gwpe : s == &v.lnf_w ? &m->glnf_w
                  : s == &v.lnf_b ? &m->glnf_b : s == &v.lm_head ? &m->ghead : NULL;
        if (o)
            *o = m->soff ? m->soff[i] : p->offset;
    }
    if (m->cfg.tie_embeddings)
        m->ghead = m->gwte;
}

/* The table entry of the tied embedding (the first tensor), or -1. */
static int wte_entry(const snug_model *m) {
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer < 0 && m->table.e[i].offset == m->gwte)
            return i;
    return -1;
}

static int is16(const snug_model *m) { return m->lv.dt == SNUG_DT_BF16 || m->lv.dt == SNUG_DT_F16; }

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
    if (m->vtied && m->table.e[i].offset == m->gwte) /* reduced by rows (rows_fn), never announced */
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

/* on_grads_ready for the global tensors of `group` (-1, or SNUG_READY_POST), when a callback is set; their gradients
 * final (frozen ones zeroed) either way. */
static void announce_globals(snug_model *m, int group) {
    mask_frozen(m, group);
    if (!m->on_grads_ready)
        return;
    size_t off, n;
    globals_span(m, group, &off, &n);
    m->on_grads_ready(m->on_grads_ready_ud, group, off, n);
}

float *snug_model_host_params(const snug_model *m) {
    return m->be->host_resident && !is16(m) && !m->param_sharded ? m->params : NULL;
}

/* ZeRO-3: where global parameter `offset` is in gglob: the pre-layer globals first, then the post-layer ones, or
 * (gsplit) each set from the region's start, gathered one at a time. */
static size_t gglob_at(const snug_model *m, size_t offset) {
    return offset < m->gpre_n ? offset - m->gpre_lo
                              : (m->gsplit ? 0 : m->gpre_n - m->gpre_lo) + (offset - (m->table.total - m->gpost_n));
}

/* ZeRO-3 with vtied: where the loss's block of head rows (and, before the layers, the looked-up rows) go in the
 * region, after the globals (32-aligned). */
static size_t head_block_at(const snug_model *m) { return (m->gglob_n + 31) / 32 * 32; }

const void *snug_model_stored(const snug_model *m, size_t offset) {
    if (m->param_sharded) /* the global tensors, as last gathered */
        return (const char *)m->gglob + gglob_at(m, offset) * snug_dtype_size(m->lv.dt);
    return is16(m) ? (const void *)(m->params16 + offset) : (const void *)(m->params + offset);
}

/* ZeRO-3: the prefetched gather complete before the region is read or written again (a wait for it; with
 * offload_params and nothing to gather, a wait for the side stream's copy). */
static void gather_settle(snug_model *m) {
    if (m->gbuf_prefetched && m->gather_params)
        m->gather_params(m->gather_params_ud, NULL, 0, 0, 0);
    else if (m->gbuf_prefetched && m->lv.offload_params)
        m->be->copy_wait(m->be);
    m->gbuf_prefetched = 0;
}

/* ZeRO-3: table elements [offset, offset+numel) of every rank's shard into dst (stored dtype): this rank's piece
 * copied from its shard, the others' by the gather callback. A prefetch may still be running on return; any other
 * gather first waits for one still running, since its own piece's copy would race it in the region. */
static void gather_range(snug_model *m, void *dst, size_t offset, size_t numel, int prefetch) {
    if (!prefetch)
        gather_settle(m);
    size_t es = snug_dtype_size(m->lv.dt), lo = m->pshard_lo, hi = lo + m->pshard_n;
    size_t a = offset > lo ? offset : lo, b = offset + numel < hi ? offset + numel : hi;
    const char *src = is16(m) ? (const char *)m->params16 : (const char *)m->params;
    /* offload_params with nothing to gather: a prefetch's copy from host memory on the side stream, beside the
     * compute (waited for in gather_settle); a gather's own piece goes on the compute stream, which it precedes */
    void (*cp)(snug_backend *, void *, const void *, size_t) =
        prefetch && m->lv.offload_params && !m->gather_params ? m->be->copy_in_async : m->be->copy;
    if (b > a)
        cp(m->be, (char *)dst + (a - offset) * es, src + (a - lo) * es, (b - a) * es);
    if (m->gather_params)
        m->gather_params(m->gather_params_ud, dst, offset, numel, prefetch);
}

/* ZeRO-3: the global tensors into gglob (it aliases the layer buffers, which are then empty): `want` of them
 * (GLOB_PRE, GLOB_POST), or both where the region holds both (a tied head is the embedding: the loss reads both). */
enum { GLOB_PRE = 1, GLOB_POST = 2 };
static void gather_globals(snug_model *m, int want) {
    if (!m->gsplit)
        want = GLOB_PRE | GLOB_POST;
    if (!m->param_sharded || (m->gglob_ok & want) == want)
        return;
    size_t es = snug_dtype_size(m->lv.dt);
    if ((want & GLOB_PRE) && m->gpre_n > m->gpre_lo)
        gather_range(m, m->gglob, m->gpre_lo, m->gpre_n - m->gpre_lo, 0);
    if ((want & GLOB_POST) && m->gpost_n)
        gather_range(m, (char *)m->gglob + gglob_at(m, m->table.total - m->gpost_n) * es,
                     m->table.total - m->gpost_n, m->gpost_n, 0);
    m->gbuf_layer[0] = m->gbuf_layer[1] = -1;
    m->wl_layer = -1;
    m->gglob_ok = want;
}

/* ZeRO-3: layer l's parameters (stored dtype) in its gather buffer, gathered unless it is still there (prefetched:
 * waited for). Then the layer the pass reads next (l + gdir) is gathered into the other buffer, whose layer the pass
 * has finished with: a prefetch, which NCCL runs on its own stream while layer l computes (the CPU's MPI gathers
 * block, so there it is the same gathers in another order). The ranks issue them in the same order, since every
 * one calls this in the same sequence (snug_model_step, snug_model_skip_step). */
static const void *gathered_layer(snug_model *m, int l) {
    int k = l % 2, nx = l + m->gdir;
    if (m->gbuf_layer[k] != l) {
        m->gglob_ok = 0;
        gather_range(m, m->gbuf[k], m->table.layer_offset[l], m->table.layer_numel[l], 0);
        m->gbuf_layer[k] = l;
    } else if (m->gbuf_prefetched & (1 << k)) {
        gather_settle(m);
    }
    if (m->gdir && nx >= 0 && nx < m->cfg.n_layer && m->gbuf_layer[1 - k] != nx) {
        gather_range(m, m->gbuf[1 - k], m->table.layer_offset[nx], m->table.layer_numel[nx], 1);
        m->gbuf_layer[1 - k] = nx;
        m->gbuf_prefetched |= 1 << (1 - k);
        m->gglob_ok = 0;
    }
    return m->gbuf[k];
}

/* q4_sharded: the prefetched span complete before its buffer is read or another gather is issued (the gather
 * waited for, or the side stream's copy from host memory). */
static void q4_settle(snug_model *m) {
    if (m->q4_prefetched && m->gather_q4)
        m->gather_q4(m->gather_q4_ud, NULL, 0, 0);
    else if (m->q4_prefetched && m->lv.offload_params)
        m->be->copy_wait(m->be);
    m->q4_prefetched = 0;
}

/* Layer l's 4-bit span into buffer k (this rank's piece copied from its shard, the others' by the callback), and
 * the layer's matrices carved there. With offload_params on one process a prefetch's copy from host memory runs on
 * the backend's side stream, beside the compute queued before the next wait (q4_settle); at ZeRO-3 the rank's
 * piece is copied on the compute stream, since the all-gather that follows reads it there. */
static void q4_gather(snug_model *m, int l, int k, int prefetch) {
    if (!prefetch)
        q4_settle(m);
    size_t P = m->q4_piece[l];
    char *dst = m->q4_gbuf[k];
    if (prefetch && m->lv.offload_params && !m->gather_q4)
        m->be->copy_in_async(m->be, dst, m->q4_shard + m->q4_soff[l], P);
    else
        m->be->copy(m->be, dst + (size_t)m->q4_part * P, m->q4_shard + m->q4_soff[l], P);
    m->q4_gbuf_layer[k] = l; /* set before the callback, which may look which layer it moves */
    if (m->gather_q4)
        m->gather_q4(m->gather_q4_ud, dst, P, prefetch);
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer == l && m->q4[i].n)
            snug_q4_carve(&m->q4[i], dst + m->q4_rel[i]);
    m->q4_prefetched |= prefetch ? 1 << k : 0;
}

/* QLoRA at ZeRO-3: layer l's 4-bit matrices readable (gathered unless still there, a prefetch waited for), and the
 * pass's next layer prefetched into the other buffer, in the same order on every rank (see gathered_layer). */
static void q4_layer(snug_model *m, int l) {
    int k = l % 2, nx = l + m->gdir;
    if (m->q4_gbuf_layer[k] != l)
        q4_gather(m, l, k, 0);
    else if (m->q4_prefetched & (1 << k))
        q4_settle(m);
    if (m->gdir && nx >= 0 && nx < m->cfg.n_layer && m->q4_gbuf_layer[1 - k] != nx)
        q4_gather(m, nx, 1 - k, 1);
}

/* A reader outside the passes (snug_model_entry_f32, snug_model_get_params) of layer l's 4-bit matrices: with the
 * whole spans on this rank (offload_params without stage 3) the span copied in, as a pass would; at stage 3 the
 * others' pieces would take a collective, so nothing (those readers are not used there). */
static void q4_local(const snug_model *m, int l) {
    if (m->q4_sharded && m->q4_parts == 1)
        q4_layer((snug_model *)m, l);
}

float *snug_model_host_scratch(snug_model *m, size_t n) {
    if (!m->param_sharded || !m->be->host_resident || m->gregion_n * snug_dtype_size(m->lv.dt) < n * sizeof(float))
        return NULL;
    gather_settle(m);
    m->gbuf_layer[0] = m->gbuf_layer[1] = -1;
    m->gglob_ok = 0;
    m->wl_layer = -1;
    return m->gglob;
}

/* ---- loss_vocab_block (see snug_model's vb, vtied). The backend with xent_block is the CPU's, whose memory is
 * host memory: the ids, the rows and the statistics below are read and written in place. ---- */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* vtied: every rank's ids of the micro-batch (rank r's n at r * B*T, -1 past its tokens), the rows they look up
 * (urow, increasing) and this rank's ids as indices into urow. n = 0: a rank without a micro-batch. */
static void lookup_rows(snug_model *m, int n) {
    size_t NM = (size_t)m->B * m->T, R = (size_t)(m->nranks > 1 ? m->nranks : 1);
    int V = m->cfg.vocab_size;
    int32_t *mine = m->uids + (size_t)m->rank * NM;
    for (size_t k = 0; k < NM; k++)
        mine[k] = k < (size_t)n ? m->ids[k] : -1;
    if (m->rows_fn)
        m->rows_fn(m->rows_ud, SNUG_ROWS_IDS, m->uids, 0, NULL, 0, (int)NM, 0);
    /* the union, sorted (in place: uids is filled afresh each micro-batch); at most umax = min(V, ranks x B x T) */
    qsort(m->uids, R * NM, sizeof *m->uids, cmp_i32);
    int nu = 0;
    for (size_t k = 0; k < R * NM; k++) {
        int32_t v = m->uids[k];
        if (v >= 0 && v < V && (nu == 0 || m->urow[nu - 1] != v))
            m->urow[nu++] = v;
    }
    m->nU = nu;
    for (int k = 0; k < n; k++) {
        const int32_t *at = bsearch(&m->ids[k], m->urow, (size_t)nu, sizeof *m->urow, cmp_i32);
        m->ids_u[k] = at ? (int32_t)(at - m->urow) : 0;
    }
}

/* ZeRO-3 with vtied: the urow rows of the embedding into urows (stored dtype): this rank's pieces copied from its
 * shard, the others' by the rows callback. */
static void gather_lookup_rows(snug_model *m) {
    gather_settle(m);
    size_t es = snug_dtype_size(m->lv.dt), C = (size_t)m->cfg.hidden_size, lo = m->pshard_lo, hi = lo + m->pshard_n;
    const char *src = is16(m) ? (const char *)m->params16 : (const char *)m->params;
    for (int k = 0; k < m->nU; k++) {
        size_t o = m->gwte + (size_t)m->urow[k] * C, a = o > lo ? o : lo, b = o + C < hi ? o + C : hi;
        if (b > a)
            m->be->copy(m->be, (char *)m->urows + ((size_t)k * C + (a - o)) * es, src + (a - lo) * es, (b - a) * es);
    }
    if (m->rows_fn)
        m->rows_fn(m->rows_ud, SNUG_ROWS_GATHER, m->urows, m->gwte, m->urow, 0, m->nU, (int)C);
}

/* The head's rows [v0, v0+n) as stored: in place, or under ZeRO-3 (vtied) gathered into the region after the
 * globals unless they are still there (*held: the block the region holds, -1 none). */
static const void *head_rows(snug_model *m, const void *head, snug_dtype hdt, int v0, int n, int *held) {
    size_t C = (size_t)m->cfg.hidden_size;
    if (!(m->param_sharded && m->vtied))
        return head ? (const char *)head + (size_t)v0 * C * snug_dtype_size(hdt) : NULL;
    char *dst = (char *)m->gglob + head_block_at(m) * snug_dtype_size(m->lv.dt);
    if (*held != v0) {
        gather_range(m, dst, m->gwte + (size_t)v0 * C, (size_t)n * C, 0);
        *held = v0;
    }
    return dst;
}

/* vtied: block [v0, v0+n) of the head's gradient (dw, in the layers' buffer) is complete: the rows some rank looks
 * up move to ubuf to wait for the embedding's backward, and the rest is reduced now (the callback zeroes dw). The
 * blocks come in order, so *k (the first urow not yet moved) only advances. */
static void hand_block(snug_model *m, float *dw, int v0, int n, int *k) {
    snug_backend *be = m->be;
    size_t C = (size_t)m->cfg.hidden_size;
    for (; *k < m->nU && m->urow[*k] < v0 + n; (*k)++) {
        float *row = dw + (size_t)(m->urow[*k] - v0) * C;
        be->copy(be, m->ubuf + (size_t)*k * C, row, C * sizeof(float));
        be->zero(be, row, C * sizeof(float));
    }
    if (m->rows_fn)
        m->rows_fn(m->rows_ud, SNUG_ROWS_REDUCE, dw, m->gwte, NULL, v0, n, (int)C);
}

/* Tensor parallelism over the vocabulary: each token's statistics over the rank's rows gathered from every rank
 * and combined in rank order (the largest maximum M, the sums of exponentials rescaled to it, the label's logit
 * from the rank whose rows hold it), the same bits on every rank. */
static void tp_combine_stats(snug_model *m, int N) {
    double *mine = m->tp_st + (size_t)m->tp_rank * 3 * N;
    for (int n = 0; n < N; n++) {
        mine[n] = m->st_max[n];
        mine[N + n] = m->st_sum[n];
        mine[2 * N + n] = m->st_zy[n];
    }
    if (m->tp_gather)
        m->tp_gather(m->tp_gather_ud, m->tp_st, (size_t)3 * N);
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, sum = 0.0, zy = 0.0;
        for (int r = 0; r < m->tp; r++)
            mx = m->tp_st[(size_t)r * 3 * N + n] > mx ? m->tp_st[(size_t)r * 3 * N + n] : mx;
        for (int r = 0; r < m->tp && mx > -INFINITY; r++) {
            const double *st = m->tp_st + (size_t)r * 3 * N;
            sum += st[N + n] * exp(st[n] - mx);
            zy += st[2 * N + n];
        }
        m->st_max[n] = (float)mx;
        m->st_sum[n] = sum;
        m->st_zy[n] = (float)zy;
    }
}

/* The loss and (train) its gradients one block of the head's rows at a time: a pass over the blocks for each
 * token's statistics, then (train) one for the gradients: dh into d_ln, the head's into dhead (or under vtied
 * each block in turn through the layers' buffer). skip: a rank without a micro-batch issues the same collectives. */
static double loss_blocks(snug_model *m, const void *head, snug_dtype hdt, float *dhead, int N, float grad_scale,
                          int train, int skip) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int C = c->hidden_size, V = c->vocab_size, vb = m->vb, held = -1, moved = 0;
    /* tensor parallelism over the vocabulary: the rank's rows are those from voff of the whole vocabulary Vw */
    int voff = m->tp_vocab ? m->tp_rank * V : 0, Vw = m->tp_vocab ? m->tp_cfg.vocab_size : V;
    for (int n = 0; n < N; n++) {
        m->st_max[n] = -INFINITY;
        m->st_sum[n] = 0.0;
        m->st_zy[n] = 0.0f;
    }
    for (int v0 = 0; v0 < V; v0 += vb) {
        int n = V - v0 < vb ? V - v0 : vb;
        const void *w = head_rows(m, head, hdt, v0, n, &held);
        if (!skip)
            be->xent_block(be, 0, NULL, NULL, m->lnf, w, hdt, m->labels, N, C, Vw, voff + v0, n, 0.0f, m->st_max,
                           m->st_sum, m->st_zy, m->logits, m->xent_chunk, m->w_ws, m->wblock);
    }
    if (m->tp_vocab)
        tp_combine_stats(m, N);
    for (int v0 = 0; train && v0 < V; v0 += vb) {
        int n = V - v0 < vb ? V - v0 : vb;
        const void *w = head_rows(m, head, hdt, v0, n, &held);
        float *dw = m->vtied ? m->g.wte : dhead ? dhead + (size_t)v0 * C : NULL;
        if (!skip)
            be->xent_block(be, 1, m->d_ln, dw, m->lnf, w, hdt, m->labels, N, C, Vw, voff + v0, n, grad_scale,
                           m->st_max, m->st_sum, m->st_zy, m->logits, m->xent_chunk, m->w_ws, m->wblock);
        if (m->vtied)
            hand_block(m, dw, v0, n, &moved);
    }
    return skip ? 0.0 : be->xent_block(be, 2, NULL, NULL, NULL, NULL, hdt, m->labels, N, C, Vw, 0, 1, 0.0f, m->st_max,
                                       m->st_sum, m->st_zy, NULL, 0, NULL, 0);
}

/* vtied: the looked-up rows' gradient (ubuf: the head's part, plus the embedding's backward unless skip) reduced. */
static void reduce_lookup_rows(snug_model *m, int N, int skip) {
    if (!skip)
        m->be->embed_bwd(m->be, m->ubuf, m->d_res, m->ids_u, N, m->cfg.hidden_size);
    if (m->rows_fn)
        m->rows_fn(m->rows_ud, SNUG_ROWS_REDUCE, m->ubuf, m->gwte, m->urow, 0, m->nU, m->cfg.hidden_size);
}

void snug_model_skip_step(snug_model *m, int train) {
    int L = m->cfg.n_layer;
    if (m->vtied && (train || m->param_sharded))
        lookup_rows(m, 0);
    if (m->param_sharded) {
        m->gglob_ok = 0;
        m->gbuf_layer[0] = m->gbuf_layer[1] = -1;
        gather_globals(m, GLOB_PRE);
        if (m->vtied)
            gather_lookup_rows(m);
        m->gdir = 1;
        for (int l = 0; l < L; l++)
            (void)gathered_layer(m, l);
        m->gdir = 0;
        gather_globals(m, GLOB_POST);
    } else if (m->q4_sharded) {
        m->gdir = 1;
        for (int l = 0; l < L; l++)
            q4_layer(m, l);
        m->gdir = 0;
    }
    if (m->vtied && (train || m->param_sharded)) /* the head's blocks: gathered, and reduced */
        (void)loss_blocks(m, NULL, m->lv.dt, NULL, 0, 0.0f, train, 1);
    if (!train)
        return;
    if (m->lv.zero_grads) /* the post-layer globals apart, as snug_model_step announces them */
        announce_globals(m, SNUG_READY_POST);
    m->gdir = -1;
    for (int l = L - 1; l >= 0; l--) {
        if (m->param_sharded)
            (void)gathered_layer(m, l);
        if (m->q4_sharded)
            q4_layer(m, l);
        if (m->on_grads_ready)
            m->on_grads_ready(m->on_grads_ready_ud, l, m->table.layer_offset[l], m->table.layer_numel[l]);
    }
    m->gdir = 0;
    if (m->vtied)
        reduce_lookup_rows(m, 0, 1);
    announce_globals(m, -1);
}

int snug_model_layer_full_ckpt(const snug_model *m, int l) {
    int every = m->lv.ckpt_every > 0 ? m->lv.ckpt_every : 1;
    return m->lv.ckpt == SNUG_CKPT_FULL && l % every == 0;
}

#define CARVE(ptr, cat, count)                                                               \
    do {                                                                                      \
        (ptr) = snug_arena_alloc(&A->a[cat], (size_t)(count) * sizeof *(ptr), e);             \
        if (!(ptr))                                                                           \
            return e ? e->code : SNUG_ENOMEM;                                                 \
    } while (0)

/* The per-row statistics one layer saves, always fp32: the norms' mean (LayerNorm) and rstd, and the attention's
 * log-sum-exp (or, on the naive path, its probabilities). */
static int carve_layer_stats(snug_model *m, snug_arenas *A, snug_category cat, snug_layer_acts *a, size_t N,
                             snug_error *e) {
    int gpt2 = m->cfg.arch == SNUG_ARCH_GPT2, NH = m->cfg.n_head;
    if (gpt2)
        CARVE(a->ln1_mean, cat, N);
    CARVE(a->ln1_rstd, cat, N);
    if (m->lv.naive_attention)
        CARVE(a->probs, cat, (size_t)m->B * NH * m->T * m->T);
    else
        CARVE(a->lse, cat, N * NH);
    if (gpt2)
        CARVE(a->ln2_mean, cat, N);
    CARVE(a->ln2_rstd, cat, N);
    return 0;
}

/* One layer's large activations from arena `cat`, into `a`: a snug_layer_acts (fp32) or a snug_layer_acts16 (saved
 * 16-bit), which have the same fields; CARVE sizes each by its element type. with_cheap = 0 leaves out what selective
 * checkpointing recomputes (the two norm outputs and the MLP activation); a tiled MLP leaves out the MLP's two. */
#define CARVE_LAYER_BIG(a, cat, N, with_cheap)                                                                   \
    do {                                                                                                         \
        size_t C_ = (size_t)m->cfg.hidden_size, ATT_ = (size_t)m->cfg.n_head * m->cfg.head_dim;                  \
        if (with_cheap)                                                                                          \
            CARVE((a)->ln1, cat, (N) * C_);                                                                      \
        CARVE((a)->qkv, cat, (N) * m->QKV);                                                                      \
        CARVE((a)->att, cat, (N) * ATT_);                                                                        \
        CARVE((a)->res_mid, cat, (N) * C_);                                                                      \
        if (with_cheap)                                                                                          \
            CARVE((a)->ln2, cat, (N) * C_);                                                                      \
        if (!m->mlp_rows) /* a tiled MLP saves neither: its shards run in m's own buffers */                    \
            CARVE((a)->fc, cat, (N) * m->FC);                                                                    \
        if (with_cheap && !m->mlp_rows)                                                                          \
            CARVE((a)->act, cat, (N) * (size_t)m->cfg.intermediate_size);                                        \
    } while (0)

static int carve_layer_big(snug_model *m, snug_arenas *A, snug_category cat, snug_layer_acts *a, size_t N,
                           int with_cheap, snug_error *e) {
    CARVE_LAYER_BIG(a, cat, N, with_cheap);
    return 0;
}

static int carve_layer_big16(snug_model *m, snug_arenas *A, snug_layer_acts16 *s, size_t N, int with_cheap,
                             snug_error *e) {
    CARVE_LAYER_BIG(s, SNUG_MEM_ACTS, N, with_cheap);
    return 0;
}

/* What every saved set shares: the workspace's recompute sets (checkpointing, 16-bit's fp32 set, the tiled MLP's
 * shard) and the switches that decide what a set holds. */
typedef struct act_parts {
    snug_layer_acts shared, cmp;
    float *mlp_fc, *mlp_act;
    int selective, offload, with_grads;
} act_parts;

/* Saved set k: the residual stream (fp32 in SNUG_MEM_ACTS, 16-bit copies, or offloaded to host memory) and each
 * layer's saved activations (those checkpointing keeps), the rest pointing into the shared workspace sets. */
static int carve_act_set(snug_model *m, snug_arenas *A, const act_parts *p, int k, size_t N, snug_error *e) {
    int L = m->cfg.n_layer, half = is16(m);
    size_t C = (size_t)m->cfg.hidden_size;
    snug_act_set *set = &m->act_sets[k];
    if (!set->acts) { /* set 0's views are the model's own arrays */
        set->acts = k ? calloc((size_t)(L ? L : 1), sizeof *set->acts) : m->acts;
        set->acts16 = k ? calloc((size_t)(L ? L : 1), sizeof *set->acts16) : m->acts16;
        if (!set->acts || !set->acts16)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory for the model's activation views");
    }
    set->res = NULL;
    set->res16 = NULL;
    set->res_off = NULL;
    if (p->offload) {
        size_t bytes = (size_t)(L + 1) * N * C * snug_dtype_size(m->lv.dt);
        if (!(set->res_off = snug_arena_alloc(&A->a[SNUG_MEM_OFFLOAD], bytes, e)))
            return e ? e->code : SNUG_ENOMEM;
    } else if (half) {
        CARVE(set->res16, SNUG_MEM_ACTS, (size_t)(L + 1) * N * C);
    } else {
        CARVE(set->res, SNUG_MEM_ACTS, (size_t)(L + 1) * N * C);
    }
    for (int l = 0; l < L; l++) {
        snug_layer_acts *a = &set->acts[l];
        memset(a, 0, sizeof *a);
        memset(&set->acts16[l], 0, sizeof set->acts16[l]);
        if (p->with_grads && snug_model_layer_full_ckpt(m, l)) {
            *a = p->shared;
        } else {
            SNUG_TRY(carve_layer_stats(m, A, SNUG_MEM_ACTS, a, N, e));
            if (half) {
                SNUG_TRY(carve_layer_big16(m, A, &set->acts16[l], N, !p->selective, e));
            } else {
                SNUG_TRY(carve_layer_big(m, A, SNUG_MEM_ACTS, a, N, !p->selective, e));
                if (p->selective) {
                    a->ln1 = p->shared.ln1;
                    a->ln2 = p->shared.ln2;
                    a->act = p->shared.act;
                }
            }
        }
        if (half) {
            a->ln1 = p->cmp.ln1, a->qkv = p->cmp.qkv, a->att = p->cmp.att, a->res_mid = p->cmp.res_mid;
            a->ln2 = p->cmp.ln2, a->fc = p->cmp.fc, a->act = p->cmp.act;
        }
        if (m->mlp_rows)
            a->fc = p->mlp_fc, a->act = p->mlp_act;
    }
    return 0;
}

void snug_model_use_set(snug_model *m, int k) {
    const snug_act_set *set = &m->act_sets[k];
    m->act_set = k;
    m->acts = set->acts;
    m->acts16 = set->acts16;
    m->res16 = set->res16;
    m->res_off = set->res_off;
    if (set->res) /* fp32 without offloading: the stream itself (else the workspace's pair of slots) */
        m->res = set->res;
}

static size_t largest_layer(const snug_model *m) {
    size_t mx = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        mx = m->table.layer_numel[l] > mx ? m->table.layer_numel[l] : mx;
    return mx;
}

/* The dense tensors of layer l (under QLoRA its norms and biases), contiguous in params16 (the 4-bit matrices
 * between them take no place there): where they start and how many elements they are. */
static size_t dense_layer(const snug_model *m, int l, size_t *start) {
    size_t n = 0;
    *start = 0;
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer == l && !(m->q4 && m->q4[i].n)) {
            if (!n)
                *start = m->soff[i];
            n += m->table.e[i].numel;
        }
    return n;
}

static size_t largest_dense_layer(const snug_model *m) {
    size_t mx = 0, start;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        size_t n = dense_layer(m, l, &start);
        mx = n > mx ? n : mx;
    }
    return mx;
}

static int layer_has_bias(const snug_model *m) {
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer >= 0 && m->table.e[i].ndim == 1 && ends_with(m->table.e[i].name, "bias"))
            return 1;
    return 0;
}

/* QLoRA's layer views: the dense tensors at their place in wl; the 4-bit matrices have none (NULL). */
static void dense_layer_views(const snug_model *m, float *base, snug_layer_tensors *L) {
    snug_tensors unused;
    size_t start;
    dense_layer(m, 0, &start);
    memset(L, 0, sizeof *L);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = p->layer == 0 && !(m->q4 && m->q4[i].n) ? slot_of(p->name, &unused, L) : NULL;
        if (s)
            *s = base + (m->soff[i] - start);
    }
}

/* Where each tensor's gradient lives (snug_model.grad_off). Normally the flat layout of the parameters. With 16-bit
 * layer gradients, the global tensors are packed into grads and the layers into grads16. With
 * optimizer_in_backward (and ZeRO-2's zero_grads), one buffer the size of the largest layer takes every layer's
 * gradients in turn: no full-model gradient buffer exists. ZeRO-2's zero_overlap has two, the even layers' and the
 * odd layers'. */
static int grad_offsets(snug_model *m, snug_error *e) {
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
    int apart = m->lv.zero_grads, tied = m->cfg.tie_embeddings, wte = m->vtied ? wte_entry(m) : -1;
    size_t pre = 0, post = 0, layers = 0, lmax = largest_layer(m);
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
    size_t second = two ? largest_layer(m) : 0;
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

/* The elements of one chunk of a 4-bit matrix at most, unless lv.lora.q4_chunk says otherwise (64 MiB in fp32): a
 * matrix larger than this runs in row chunks, so QLoRA's dequantized weights take this much workspace instead of a
 * whole layer's. */
#define Q4_CHUNK ((size_t)1 << 24)

static size_t gcd_size(size_t a, size_t b) {
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Which module of its block 4-bit matrix i is (its site and rows there), and its rows per chunk: the whole matrix,
 * or a multiple of the rows that make a chunk start on a quantization block (and, double-quantized, on a block of
 * 256 scales), so that a chunk is dequantized from its own slice of the packed codes and scales. */
static int q4_place(snug_model *m, int i, snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    const snug_q4_tensor *q = &m->q4[i];
    int n = snug_lora_module_count(m->cfg.arch);
    for (int k = 0; k < n; k++) {
        char suffix[128];
        snprintf(suffix, sizeof suffix, ".%s.weight", snug_lora_module_name(m->cfg.arch, k));
        if (!ends_with(p->name, suffix))
            continue;
        int row0, rows, in;
        snug_lora_module_shape(&m->cfg, k, &row0, &rows, &in);
        size_t R = (size_t)q->shape[0], cols = (size_t)q->shape[1];
        size_t unit = (size_t)q->blocksize * (q->nested ? (size_t)q->nested_blocksize : 1);
        size_t most = m->lv.lora.q4_chunk ? m->lv.lora.q4_chunk : Q4_CHUNK;
        size_t quantum = unit / gcd_size(cols, unit), cr = most / cols / quantum * quantum;
        cr = q->n <= most ? R : cr < quantum ? quantum : cr;
        m->q4_site[i].site = (int)snug_lora_module_site(m->cfg.arch, k);
        m->q4_site[i].row0 = row0;
        m->q4_site[i].chunk_rows = (int)(cr < R ? cr : R);
        return 0;
    }
    return snug_fail(e, SNUG_EINPUT, "%s: a matrix of the block that is no linear layer snug knows; it cannot be "
                                      "stored in 4 bits", p->name);
}

/* QLoRA at ZeRO-3: where each 4-bit matrix is in its layer's span (q4_rel), each layer's piece per rank (q4_piece:
 * the span rounded up to q4_parts x 64 bytes, over q4_parts) and where the rank keeps it (q4_soff), and the sizes of the
 * shard and of a gather buffer (see snug_model.q4_sharded). */
static int q4_spans(snug_model *m, snug_error *e) {
    const snug_param_table *t = &m->table;
    int L = m->cfg.n_layer;
    size_t R = (size_t)(m->q4_parts > 1 ? m->q4_parts : 1);
    m->q4_rel = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4_rel);
    m->q4_piece = calloc((size_t)(L ? L : 1), sizeof *m->q4_piece);
    m->q4_soff = calloc((size_t)(L ? L : 1), sizeof *m->q4_soff);
    if (!m->q4_rel || !m->q4_piece || !m->q4_soff)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the parameter layout");
    m->q4_shard_n = m->q4_gbuf_n = 0;
    for (int l = 0; l < L; l++) {
        size_t span = 0;
        for (int i = 0; i < t->n; i++)
            if (t->e[i].layer == l && m->q4[i].n) {
                m->q4_rel[i] = span;
                span += (snug_q4_bytes(m->q4[i].type, m->q4[i].n, m->q4[i].blocksize, m->q4[i].nested) + 63) / 64 * 64;
            }
        m->q4_piece[l] = (span + 64 * R - 1) / (64 * R) * 64;
        m->q4_soff[l] = m->q4_shard_n;
        m->q4_shard_n += m->q4_piece[l];
        m->q4_gbuf_n = R * m->q4_piece[l] > m->q4_gbuf_n ? R * m->q4_piece[l] : m->q4_gbuf_n;
    }
    return 0;
}

static void q4_spans_free(snug_model *m) {
    free(m->q4_rel);
    free(m->q4_piece);
    free(m->q4_soff);
    m->q4_rel = m->q4_piece = m->q4_soff = NULL;
}

/* Where each tensor is stored (snug_model.soff, q4): at its table offset, or under QLoRA the block matrices in 4 bits
 * (bitsandbytes' layout, one quantized tensor per Hugging Face weight) and the rest packed densely. */
static int storage_layout(snug_model *m, snug_error *e) {
    const snug_param_table *t = &m->table;
    free(m->soff);
    free(m->q4);
    free(m->q4_block);
    free(m->q4_site);
    q4_spans_free(m);
    m->q4 = NULL;
    m->q4_block = NULL;
    m->q4_site = NULL;
    m->soff = malloc((size_t)(t->n ? t->n : 1) * sizeof *m->soff);
    int q = m->lv.lora.kind == SNUG_ADAPTER_QLORA;
    if (q && !is16(m))
        return snug_fail(e, SNUG_EINPUT, "QLoRA keeps the base's other tensors in 16 bits: set bf16: true (or fp16)");
    if (q) {
        m->q4 = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4);
        m->q4_block = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4_block);
        m->q4_site = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4_site);
    }
    if (!m->soff || (q && (!m->q4 || !m->q4_block || !m->q4_site)))
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the parameter layout");
    m->emb_entry = -1;
    if (m->lv.offload_embedding) {
        if (m->lv.lora.kind == SNUG_ADAPTER_NONE || !is16(m))
            return snug_fail(e, SNUG_EINPUT, "offload_embedding keeps a frozen 16-bit embedding in host memory: it "
                                             "needs an adapter (lora or qlora) and bf16 or fp16");
        if (m->cfg.tie_embeddings)
            return snug_fail(e, SNUG_EINPUT, "offload_embedding: this model ties its embedding to the output head, "
                                             "which reads the whole table every step; set offload_embedding: false");
        for (int i = 0; i < t->n; i++) {
            snug_tensors v;
            if (t->e[i].layer < 0 && slot_of(t->e[i].name, &v, NULL) == &v.wte)
                m->emb_entry = i;
        }
    }
    m->packed = q || m->emb_entry >= 0;
    size_t dense = 0;
    for (int i = 0; i < t->n; i++) {
        const snug_param_entry *p = &t->e[i];
        if (i == m->emb_entry) { /* in emb16, host memory */
            m->soff[i] = (size_t)-1;
            continue;
        }
        if (q && p->layer >= 0 && p->ndim == 2) {
            int64_t rows = p->transposed ? p->shape[1] : p->shape[0], cols = p->transposed ? p->shape[0] : p->shape[1];
            SNUG_TRY(snug_q4_init(&m->q4[i], (snug_q4_type)m->lv.lora.q4_type,
                                  m->lv.lora.q4_blocksize ? m->lv.lora.q4_blocksize : 64, m->lv.lora.q4_nested, rows,
                                  cols, m->lv.dt == SNUG_DT_F16 ? SNUG_DT_F16 : SNUG_DT_BF16, e));
            SNUG_TRY(q4_place(m, i, e));
            m->soff[i] = (size_t)-1;
            continue;
        }
        m->soff[i] = m->packed ? dense : p->offset;
        dense += p->numel;
    }
    m->dense_total = m->packed ? dense : t->total;
    return q && m->q4_sharded ? q4_spans(m, e) : 0;
}

/* Where dense tensor i is stored in 16 bits: its place in params16, or the host-resident embedding. */
static uint16_t *stored16(const snug_model *m, int i) {
    return i == m->emb_entry ? m->emb16 : m->params16 + m->soff[i];
}

/* The activation sets' views (set 0's are the model's own acts arrays, which stay) */
static void free_act_sets(snug_model *m) {
    if (m->act_sets) {
        m->acts = m->act_sets[0].acts;
        m->acts16 = m->act_sets[0].acts16;
    }
    for (int k = 1; m->act_sets && k < m->act_sets_n; k++) {
        free(m->act_sets[k].acts);
        free(m->act_sets[k].acts16);
    }
    free(m->act_sets);
    m->act_sets = NULL;
    m->act_sets_n = 0;
}

void snug_model_free_host(snug_model *m) {
    snug_param_table_free(&m->table);
    snug_lora_free(&m->lora);
    free(m->w.layers);
    free(m->g.layers);
    free_act_sets(m);
    free(m->acts);
    free(m->acts16);
    free(m->grad_off);
    free(m->soff);
    free(m->q4);
    free(m->q4_block);
    free(m->q4_site);
    q4_spans_free(m);
    m->q4_site = NULL;
    m->w.layers = m->g.layers = NULL;
    m->acts = NULL;
    m->acts16 = NULL;
    m->grad_off = m->soff = NULL;
    m->q4 = NULL;
    m->q4_block = NULL;
}

/* loss_vocab_block: the head's rows per block of the loss (vb, 0 off) and whether a tied embedding is split by rows
 * (vtied: ZeRO-2/3 training without adapters, the embedding the table's first tensor). */
static void vocab_blocks(snug_model *m, int B, int T, int with_grads) {
    const snug_model_config *c = &m->cfg;
    int V = c->vocab_size, C = c->hidden_size;
    size_t rows = m->lv.vocab_block > 0 ? (size_t)m->lv.vocab_block : largest_layer(m) / (size_t)(C > 0 ? C : 1);
    m->vb = m->lv.vocab_block && !m->lv.lora.kind && V > 0 ? (int)(rows < 1 ? 1 : rows < (size_t)V ? rows : (size_t)V) : 0;
    if (m->tp_vocab) /* the rank's rows of the head: one block, or blocks of loss_vocab_block's rows */
        m->vb = m->lv.vocab_block > 0 && m->lv.vocab_block < V ? m->lv.vocab_block : V;
    m->vtied = m->vb && with_grads && c->tie_embeddings && m->lv.zero_grads && !m->lv.optimizer_in_backward &&
               m->tp <= 1 && m->pp <= 1 && !m->packed && m->gwte == 0 && wte_entry(m) >= 0 &&
               !m->table.e[wte_entry(m)].frozen && !m->table.e[wte_entry(m)].nkeep; /* (its rows all reduced) */
    size_t n = (size_t)(m->nranks > 1 ? m->nranks : 1) * (size_t)B * (size_t)T;
    m->umax = m->vtied ? (int)(n < (size_t)V ? n : (size_t)V) : 0;
    m->nU = 0;
}

int snug_model_layout(snug_model *m, snug_arenas *A, int B, int T, int with_grads, snug_error *e) {
    int xent_chunk = m->lv.xent_chunk;
    const snug_model_config *c = &m->cfg;
    int L = c->n_layer, C = c->hidden_size, NH = c->n_head, HD = c->head_dim, V = c->vocab_size;
    int I = c->intermediate_size, gpt2 = c->arch == SNUG_ARCH_GPT2, half = is16(m);
    size_t N = (size_t)B * T;
    m->B = B;
    m->T = T;
    m->cur_B = B;
    m->cur_T = T;
    m->QKV = (NH + 2 * c->n_kv_head) * HD;
    m->FC = gpt2 ? I : 2 * I;
    m->xent_chunk = xent_chunk > 0 && (size_t)xent_chunk < N ? xent_chunk : (int)N;
    m->mlp_rows = 0;
    if (m->lv.mlp_shards) { /* tiled_mlp: shards of ceil(N / k) tokens */
        size_t k = m->lv.mlp_shards > 0 ? (size_t)m->lv.mlp_shards : (N + (size_t)C - 1) / (size_t)C;
        k = k < 1 ? 1 : k > N ? N : k;
        m->mlp_rows = (int)((N + k - 1) / k);
    }
    size_t NM = m->mlp_rows ? (size_t)m->mlp_rows : N; /* rows of the MLP's fc, act and their gradients */
    m->wl_layer = -1;
    SNUG_TRY(storage_layout(m, e));
    global_offsets(m);
    vocab_blocks(m, B, T, with_grads);

    if (!m->w.layers) {
        m->w.layers = calloc((size_t)L, sizeof *m->w.layers);
        m->g.layers = calloc((size_t)L, sizeof *m->g.layers);
        m->acts = calloc((size_t)L, sizeof *m->acts);
        m->acts16 = calloc((size_t)L, sizeof *m->acts16);
        if (!m->w.layers || !m->g.layers || !m->acts || !m->acts16)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory for the model's tensor views");
    }

    /* parameters: fp32, or 16-bit with an optional fp32 master copy */
    m->params = NULL;
    m->params16 = NULL;
    m->emb16 = NULL;
    m->gbuf[0] = m->gbuf[1] = m->gglob = NULL;
    m->gbuf_layer[0] = m->gbuf_layer[1] = -1;
    m->gglob_ok = 0;
    m->gpre_n = m->gpost_n = m->gbuf_n = m->gregion_n = 0;
    m->gsplit = 0;
    m->gglob_n = 0;
    m->gpre_lo = 0;
    m->urows = NULL;
    /* the stored base: the device's, or with offload_params (a sharded frozen base) host memory */
    snug_category base_at = m->param_sharded && m->lv.offload_params ? SNUG_MEM_OFFLOAD : SNUG_MEM_PARAMS;
    if (m->param_sharded) { /* ZeRO-3: the rank's shard, and one gather region for a layer pair or the globals */
        size_t es = snug_dtype_size(m->lv.dt), lay = (largest_layer(m) + 31) / 32 * 32; /* buffer 1 aligned */
        m->gpre_n = L > 0 ? m->table.layer_offset[0] : m->table.total;
        m->gpost_n = L > 0 ? m->table.total - (m->table.layer_offset[L - 1] + m->table.layer_numel[L - 1]) : 0;
        /* an untied model reads the pre-layer globals at the embedding and the post-layer ones at the loss: one set
         * at a time, each from the region's start (gsplit); a tied head is the embedding, so the loss reads both */
        m->gsplit = !m->cfg.tie_embeddings;
        /* split by rows (vtied), the embedding is no gathered global: the loss gathers one block of its rows at a
         * time after the others (the final norm, GPT-2's positions), and the lookup only the rows it reads */
        m->gpre_lo = m->vtied ? m->table.e[wte_entry(m)].numel : 0;
        size_t pre = m->gpre_n - m->gpre_lo;
        m->gglob_n = m->gsplit ? (pre > m->gpost_n ? pre : m->gpost_n) : pre + m->gpost_n;
        size_t rows = (size_t)(m->vb > m->umax ? m->vb : m->umax); /* a block of the head, or the looked-up rows */
        size_t need = m->vtied ? head_block_at(m) + rows * C : m->gglob_n;
        size_t region = need > 2 * lay ? need : 2 * lay;
        m->gbuf_n = lay;
        m->gregion_n = region;
        char *g = snug_arena_alloc(&A->a[SNUG_MEM_PARAMS], (region ? region : 1) * es, e);
        if (!g)
            return e ? e->code : SNUG_ENOMEM;
        m->gglob = m->gbuf[0] = g;
        m->gbuf[1] = g + lay * es;
        /* vtied: the lookup's rows where the loss's block goes later (the layers come between) */
        m->urows = m->vtied ? g + head_block_at(m) * es : NULL;
    }
    if (half) {
        CARVE(m->params16, base_at, m->param_sharded ? (m->pshard_n ? m->pshard_n : 1) : m->dense_total);
        if (m->emb_entry >= 0) /* offload_embedding: the frozen table in host memory */
            CARVE(m->emb16, SNUG_MEM_OFFLOAD, m->table.e[m->emb_entry].numel);
        if (m->lv.master_weights)
            CARVE(m->params, SNUG_MEM_MASTER, m->master_sharded ? m->master_n : m->table.total);
        m->q4_shard = m->q4_gbuf[0] = m->q4_gbuf[1] = NULL;
        m->q4_gbuf_layer[0] = m->q4_gbuf_layer[1] = -1;
        m->q4_prefetched = 0;
        if (m->q4 && m->q4_sharded) { /* the rank's pieces (ZeRO-3; in host memory with offload_params), and two
                                       * buffers a layer's span is gathered into */
            snug_category at = m->lv.offload_params ? SNUG_MEM_OFFLOAD : SNUG_MEM_PARAMS;
            if (!(m->q4_shard = snug_arena_alloc(&A->a[at], m->q4_shard_n ? m->q4_shard_n : 1, e)) ||
                !(m->q4_gbuf[0] = snug_arena_alloc(&A->a[SNUG_MEM_PARAMS], 2 * (m->q4_gbuf_n ? m->q4_gbuf_n : 1), e)))
                return e ? e->code : SNUG_ENOMEM;
            m->q4_gbuf[1] = m->q4_gbuf[0] + m->q4_gbuf_n;
            for (int i = 0; i < m->table.n; i++) /* valid until the layer is first gathered */
                if (m->q4[i].n)
                    snug_q4_carve(&m->q4[i], m->q4_gbuf[0] + m->q4_rel[i]);
        }
        for (int i = 0; m->q4 && !m->q4_sharded && i < m->table.n; i++)
            if (m->q4[i].n) { /* QLoRA: each block matrix in bitsandbytes' parts */
                const snug_q4_tensor *q = &m->q4[i];
                void *blk = snug_arena_alloc(&A->a[SNUG_MEM_PARAMS],
                                             snug_q4_bytes(q->type, q->n, q->blocksize, q->nested), e);
                if (!blk)
                    return e ? e->code : SNUG_ENOMEM;
                snug_q4_carve(&m->q4[i], blk);
                m->q4_block[i] = blk;
            }
    } else {
        CARVE(m->params, base_at, m->param_sharded ? (m->pshard_n ? m->pshard_n : 1) : m->table.total);
    }
    m->grads = NULL;
    m->grads16 = NULL;
    /* LoRA: the adapters (fp32) and their gradients; the base then has none */
    SNUG_TRY(snug_lora_build(m, e));
    if (m->lora.on) {
        snug_lora *lo = &m->lora;
        CARVE(lo->params, SNUG_MEM_ADAPTER, lo->table.total);
        CARVE(lo->u, SNUG_MEM_WORKSPACE, N * lo->r * lo->max_group);
        if (with_grads) {
            CARVE(lo->grads, SNUG_MEM_GRADS, lo->table.total);
            CARVE(lo->du, SNUG_MEM_WORKSPACE, N * lo->r * lo->max_group);
        }
        if (lo->dropout > 0.0f && with_grads)
            CARVE(lo->xd, SNUG_MEM_WORKSPACE, N * lo->max_in);
        if (lo->dora) { /* the norms, and a chunk of rows of W + s B A and of dy^T x (4 MiB each at most) */
            size_t wid = (size_t)(lo->max_in > lo->r ? lo->max_in : lo->r), rows = 0;
            int res = 0; /* a module of o_proj or down_proj: its scaled gradient needs a buffer of its own */
            for (int i = 0; i < lo->nmod; i++) {
                rows = (size_t)lo->mod[i].rows > rows ? (size_t)lo->mod[i].rows : rows;
                res |= lo->mod[i].site == SNUG_SITE_O || lo->mod[i].site == SNUG_SITE_PROJ;
            }
            /* QLoRA: a whole number of the rows that start a chunk on a block of codes and scales (as q4_place's) */
            size_t quantum = 1;
            for (int i = 0; m->q4 && i < m->table.n; i++) {
                const snug_q4_tensor *q = &m->q4[i];
                size_t unit = (size_t)q->blocksize * (q->nested ? (size_t)q->nested_blocksize : 1);
                size_t qi = q->n ? unit / gcd_size((size_t)q->shape[1], unit) : 1;
                quantum = qi > quantum ? qi : quantum;
            }
            size_t ch = (m->lv.lora.q4_chunk ? m->lv.lora.q4_chunk : (size_t)1 << 20) / wid / quantum * quantum;
            lo->dchunk = (int)(ch < quantum ? quantum : ch > rows ? rows : ch);
            CARVE(lo->dn, SNUG_MEM_ADAPTER, lo->dn_per_layer * (size_t)m->cfg.n_layer);
            CARVE(lo->dw, SNUG_MEM_WORKSPACE, (size_t)lo->dchunk * wid);
            if (with_grads) {
                CARVE(lo->dp, SNUG_MEM_WORKSPACE, (size_t)lo->dchunk * wid);
                CARVE(lo->dmt, SNUG_MEM_WORKSPACE, (size_t)lo->dchunk);
            }
            if (with_grads && lo->dropout > 0.0f) {
                CARVE(lo->dt, SNUG_MEM_WORKSPACE, N * (size_t)lo->dchunk);
                CARVE(lo->vx, SNUG_MEM_WORKSPACE, N * (size_t)lo->max_in);
            }
            if (with_grads && res)
                CARVE(lo->dy, SNUG_MEM_WORKSPACE, N * (size_t)m->cfg.hidden_size);
        }
    }
    if (with_grads && !m->lora.on) {
        SNUG_TRY(grad_offsets(m, e));
        if (m->grads_numel)
            CARVE(m->grads, SNUG_MEM_GRADS, m->grads_numel);
        if (m->grads16_numel)
            CARVE(m->grads16, SNUG_MEM_GRADS, m->grads16_numel);
    }
    /* 16-bit: the current layer's weights (and gradients) widened to fp32, the final norm, the head's rows */
    m->wl = m->gl = m->lnf_ws = m->w_ws = NULL;
    m->wblock = 0;
    m->wq = m->ones = NULL;
    m->wq_n = m->wl_n = 0;
    if (half) {
        m->wl_n = m->q4 ? largest_dense_layer(m) : largest_layer(m);
        CARVE(m->wl, SNUG_MEM_WORKSPACE, m->wl_n ? m->wl_n : 1);
        for (int i = 0; m->q4 && i < m->table.n; i++)
            if (m->q4[i].n) {
                size_t k = (size_t)m->q4_site[i].chunk_rows * (size_t)m->q4[i].shape[1];
                m->wq_n = k > m->wq_n ? k : m->wq_n;
            }
        if (m->wq_n)
            CARVE(m->wq, SNUG_MEM_WORKSPACE, m->wq_n);
        if (m->q4 && layer_has_bias(m))
            CARVE(m->ones, SNUG_MEM_WORKSPACE, N);
        if (m->grads16)
            CARVE(m->gl, SNUG_MEM_WORKSPACE, largest_layer(m));
        CARVE(m->lnf_ws, SNUG_MEM_WORKSPACE, 2 * (size_t)C);
        m->wblock = V < 1024 ? V : 1024;
        CARVE(m->w_ws, SNUG_MEM_WORKSPACE, (size_t)m->wblock * C);
    }

    /* saved activations: the residual stream (every layer's input) always; each layer's internals unless
     * checkpointing drops them, in which case they live in one shared recompute set in the workspace */
    int any_full = 0, selective = with_grads && m->lv.ckpt == SNUG_CKPT_SELECTIVE;
    for (int l = 0; l < L; l++)
        any_full |= with_grads && snug_model_layer_full_ckpt(m, l);
    snug_layer_acts shared, cmp;
    memset(&shared, 0, sizeof shared);
    memset(&cmp, 0, sizeof cmp);
    m->res16 = m->res_stage = NULL;
    m->res_off = NULL;
    int offload = with_grads && any_full && m->lv.ckpt_offload;
    if (offload) { /* the layer inputs in host memory; two fp32 slots run the layers (as under 16-bit) */
        if (half)
            CARVE(m->res_stage, SNUG_MEM_WORKSPACE, N * C);
        if (!half)
            CARVE(m->res, SNUG_MEM_WORKSPACE, 2 * N * C);
    }
    if (half) {
        /* 16-bit: layers run in one fp32 set (cmp) and save 16-bit copies; only the statistics stay fp32 */
        CARVE(m->res, SNUG_MEM_WORKSPACE, 2 * N * C);
        SNUG_TRY(carve_layer_big(m, A, SNUG_MEM_WORKSPACE, &cmp, N, 1, e));
        if (any_full)
            SNUG_TRY(carve_layer_stats(m, A, SNUG_MEM_WORKSPACE, &shared, N, e));
    } else {
        if (any_full) {
            SNUG_TRY(carve_layer_big(m, A, SNUG_MEM_WORKSPACE, &shared, N, 1, e));
            SNUG_TRY(carve_layer_stats(m, A, SNUG_MEM_WORKSPACE, &shared, N, e));
        } else if (selective) {
            CARVE(shared.ln1, SNUG_MEM_WORKSPACE, N * C);
            shared.ln2 = shared.ln1; /* recomputed one after the other in backward */
            if (!m->mlp_rows)
                CARVE(shared.act, SNUG_MEM_WORKSPACE, N * I);
        }
    }
    float *mlp_fc = NULL, *mlp_act = NULL;
    if (m->mlp_rows) { /* tiled_mlp: one shard's fc and act, for every layer */
        CARVE(mlp_fc, SNUG_MEM_WORKSPACE, NM * m->FC);
        CARVE(mlp_act, SNUG_MEM_WORKSPACE, NM * I);
    }
    /* the saved set: one, or under pipeline parallelism without recomputation one per micro-batch in flight */
    act_parts parts = {.shared = shared, .cmp = cmp, .mlp_fc = mlp_fc, .mlp_act = mlp_act, .selective = selective,
                       .offload = offload, .with_grads = with_grads};
    int nsets = with_grads && m->pp_keep > 1 ? m->pp_keep : 1;
    if (m->act_sets && m->act_sets_n != nsets) /* laid out again for another count: the views afresh */
        free_act_sets(m);
    if (!m->act_sets && (m->act_sets = calloc((size_t)nsets, sizeof *m->act_sets)))
        m->act_sets_n = nsets;
    if (!m->act_sets)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the model's activation views");
    for (int k = 0; k < nsets; k++)
        SNUG_TRY(carve_act_set(m, A, &parts, k, N, e));
    snug_model_use_set(m, 0);
    m->lnf = m->lnf_mean = m->lnf_rstd = m->logits = NULL;
    m->st_max = m->st_zy = NULL;
    m->st_sum = NULL;
    if (snug_pp_last(m)) { /* the final norm and the loss: the last pipeline stage's */
        CARVE(m->lnf, SNUG_MEM_ACTS, N * C);
        if (gpt2)
            CARVE(m->lnf_mean, SNUG_MEM_ACTS, N);
        CARVE(m->lnf_rstd, SNUG_MEM_ACTS, N);
        /* workspace: the logits chunk always; activation gradients only for training */
        CARVE(m->logits, SNUG_MEM_WORKSPACE,
              (size_t)m->xent_chunk * (m->vb ? (size_t)m->vb : (size_t)snug_logits_ld(V)));
    }
    if (m->vb && snug_pp_last(m)) { /* loss_vocab_block: each token's running statistics over the blocks */
        CARVE(m->st_max, SNUG_MEM_WORKSPACE, N);
        CARVE(m->st_zy, SNUG_MEM_WORKSPACE, N);
        CARVE(m->st_sum, SNUG_MEM_WORKSPACE, N);
    }
    m->d_res = m->d_ln = m->d_qkv = m->d_att = m->d_fc = m->d_act = NULL;
    if (with_grads) {
        CARVE(m->d_res, SNUG_MEM_WORKSPACE, N * C);
        CARVE(m->d_ln, SNUG_MEM_WORKSPACE, N * C);
        CARVE(m->d_qkv, SNUG_MEM_WORKSPACE, N * m->QKV);
        CARVE(m->d_att, SNUG_MEM_WORKSPACE, N * NH * HD);
        CARVE(m->d_fc, SNUG_MEM_WORKSPACE, NM * m->FC);
        CARVE(m->d_act, SNUG_MEM_WORKSPACE, NM * I);
    }
    m->pp_in = m->pp_out = m->pp_dout = m->pp_din = NULL;
    if (m->pp > 1) { /* what crosses to the neighbouring stages (see model.h) */
        if (!snug_pp_first(m))
            CARVE(m->pp_in, SNUG_MEM_ACTS, (size_t)snug_pp_in_slots(m) * N * C);
        if (!snug_pp_last(m)) {
            CARVE(m->pp_out, SNUG_MEM_WORKSPACE, N * C);
            if (with_grads)
                CARVE(m->pp_dout, SNUG_MEM_WORKSPACE, N * C);
        }
        if (!snug_pp_first(m) && with_grads)
            CARVE(m->pp_din, SNUG_MEM_WORKSPACE, N * C);
    }

    /* data */
    CARVE(m->ids, SNUG_MEM_DATA, N);
    CARVE(m->labels, SNUG_MEM_DATA, N);
    CARVE(m->pos, SNUG_MEM_DATA, N);
    CARVE(m->seg, SNUG_MEM_DATA, N);
    m->ids_tp = NULL;
    m->tp_st = NULL;
    if (m->tp_vocab) { /* the ids as the rank's rows, and every rank's statistics of each token */
        if (m->be && (!m->be->host_resident || !m->be->xent_block)) /* (the plan lays out without a backend) */
            return snug_fail(e, SNUG_EINTERNAL, "tensor parallelism over the vocabulary needs a backend in host memory "
                             "with the blocked loss");
        CARVE(m->ids_tp, SNUG_MEM_DATA, N);
        CARVE(m->tp_st, SNUG_MEM_WORKSPACE, (size_t)m->tp * 3 * N);
    }
    m->uids = m->urow = m->ids_u = NULL;
    m->ubuf = NULL;
    if (m->vtied) { /* every rank's ids, the rows they look up, and those rows' gradient */
        CARVE(m->uids, SNUG_MEM_WORKSPACE, (size_t)(m->nranks > 1 ? m->nranks : 1) * N);
        CARVE(m->urow, SNUG_MEM_WORKSPACE, m->umax);
        CARVE(m->ids_u, SNUG_MEM_WORKSPACE, N);
        CARVE(m->ubuf, SNUG_MEM_GRADS, (size_t)m->umax * C);
    }
    m->rope_cos = m->rope_sin = NULL;
    if (!gpt2) {
        CARVE(m->rope_cos, SNUG_MEM_DATA, (size_t)T * HD / 2);
        CARVE(m->rope_sin, SNUG_MEM_DATA, (size_t)T * HD / 2);
    }

    if (!snug_arena_counting(&A->a[SNUG_MEM_PARAMS])) {
        if (m->params && !m->master_sharded && !m->param_sharded)
            make_views(m, m->params, NULL, 0, &m->w);
        if (m->param_sharded && !half) { /* fp32 ZeRO-3: the globals' views into gglob, the layers' per buffer */
            size_t *off = malloc((size_t)m->table.n * sizeof *off);
            if (!off)
                return snug_fail(e, SNUG_ENOMEM, "out of host memory");
            for (int i = 0; i < m->table.n; i++)
                off[i] = m->table.e[i].layer < 0 && m->table.e[i].offset >= m->gpre_lo ? gglob_at(m, m->table.e[i].offset)
                                                                                       : 0; /* vtied: no view of the embedding */
            make_views(m, m->gglob, off, 1, &m->w);
            free(off);
            layer_views(m, m->gbuf[0], &m->gbuf_t[0]);
            layer_views(m, m->gbuf[1], &m->gbuf_t[1]);
        }
        if (m->grads)
            make_views(m, m->grads, m->grad_off, m->grads16 != NULL, &m->g);
        m->frozen_any = 0;
        for (int i = 0; i < m->table.n; i++)
            m->frozen_any |= m->table.e[i].frozen || m->table.e[i].nkeep;
        if (m->grads && m->frozen_any)
            drop_frozen(m, -1, NULL, &m->g);
        if (m->wl && m->q4)
            dense_layer_views(m, m->wl, &m->wl_t);
        else if (m->wl)
            layer_views(m, m->wl, &m->wl_t);
        m->wd_t = m->wl_t;
        m->wd_t.qkv_w = m->wd_t.o_w = m->wd_t.fc_w = m->wd_t.proj_w = NULL;
        if (m->ones) {
            float *one = malloc(N * sizeof *one);
            if (!one)
                return snug_fail(e, SNUG_ENOMEM, "out of host memory");
            for (size_t k = 0; k < N; k++)
                one[k] = 1.0f;
            m->be->to_device(m->be, m->ones, one, N * sizeof *one);
            free(one);
        }
        if (m->gl)
            layer_views(m, m->gl, &m->gl_t);
    }
    return 0;
}

/* Inverse frequencies with the rope_scaling of the config (default, linear, llama3), in double. */
static void rope_inv_freq(const snug_model_config *c, double *inv, int half) {
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(c->rope_theta, (2.0 * i) / (2.0 * half));
        if (c->rope_type == SNUG_ROPE_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_type == SNUG_ROPE_LLAMA3) {
            double lo_wl = c->rope_original_max_position / c->rope_low_freq_factor;
            double hi_wl = c->rope_original_max_position / c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > lo_wl) {
                f /= c->rope_factor;
            } else if (wl >= hi_wl) {
                double smooth = (c->rope_original_max_position / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv[i] = f;
    }
}

int snug_model_init_rope(snug_model *m) {
    if (!m->rope_cos)
        return 0;
    int half = m->cfg.head_dim / 2, T = m->T;
    double *inv = malloc((size_t)half * sizeof *inv);
    float *cs = malloc((size_t)T * half * sizeof *cs), *sn = malloc((size_t)T * half * sizeof *sn);
    if (!inv || !cs || !sn) {
        free(inv);
        free(cs);
        free(sn);
        return SNUG_ENOMEM;
    }
    rope_inv_freq(&m->cfg, inv, half);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            /* transformers computes the angle in fp32: position (fp32) times inv_freq (fp32) */
            float ang = (float)t * (float)inv[i];
            cs[(size_t)t * half + i] = (float)cos((double)ang);
            sn[(size_t)t * half + i] = (float)sin((double)ang);
        }
    m->be->to_device(m->be, m->rope_cos, cs, (size_t)T * half * sizeof *cs);
    m->be->to_device(m->be, m->rope_sin, sn, (size_t)T * half * sizeof *sn);
    free(inv);
    free(cs);
    free(sn);
    return 0;
}


/* Rows [r0, r0 + nr) of quantized matrix i into dst (nr x cols) as forward reads them: by the backend's op (where the
 * tensor lives) from the rows' slice of codes and scales (r0 is a multiple of its chunk_rows), then rounded to the
 * run's 16-bit type, as bitsandbytes' dequantize_4bit gives the weight's dtype (and, 8-bit, as its MatMul8bitFp
 * does: its codes cast to the dtype and multiplied by the fp32 factor). */
static void dequant_rows(const snug_model *m, int i, size_t r0, size_t nr, float *dst) {
    snug_backend *be = m->be;
    const snug_q4_tensor *q = &m->q4[i];
    size_t cols = (size_t)q->shape[1], off = r0 * cols, n = nr * cols, bs = (size_t)q->blocksize;
    size_t b0 = off / bs, nb = q->nested ? (size_t)q->nested_blocksize : 1;
    if (q->type == SNUG_Q4_INT8)
        be->dequantize_int8(be, dst, (const int8_t *)q->packed + off, q->absmax + r0, nr, cols);
    else
        be->dequantize_4bit(be, dst, q->packed + off / 2, q->nested ? NULL : q->absmax + b0,
                            q->nested ? q->absmax_q + b0 : NULL, q->nested ? q->nested_absmax + b0 / nb : NULL,
                            q->nested_quant_map, q->nested_offset, snug_q4_code((snug_q4_type)q->type), n,
                            q->blocksize);
    be->to16(be, NULL, dst, n, m->lv.dt, 1);
}

void snug_model_entry_f32(const snug_model *m, int i, float *dst) {
    snug_backend *be = m->be;
    const snug_param_entry *p = &m->table.e[i];
    if (m->params && !m->master_sharded) { /* fp32 (or the master copy): dst = 0 + the parameters, exactly */
        be->zero(be, dst, p->numel * sizeof *dst);
        be->accumulate(be, dst, m->params + p->offset, p->numel);
    } else if (snug_model_entry_q4(m, i)) {
        q4_local(m, p->layer);
        size_t R = (size_t)m->q4[i].shape[0], cols = (size_t)m->q4[i].shape[1], cr = (size_t)m->q4_site[i].chunk_rows;
        for (size_t r = 0; r < R; r += cr)
            dequant_rows(m, i, r, R - r < cr ? R - r : cr, dst + r * cols);
    } else {
        be->from16(be, dst, stored16(m, i), p->numel, m->lv.dt);
    }
}

/* The larger of the fp32 workspaces that tensors pass through on their way in and out of 16-bit storage (wl,
 * and under QLoRA wq), and its size in floats. */
static float *staging(const snug_model *m, size_t *n) {
    *n = m->wq_n > m->wl_n ? m->wq_n : m->wl_n;
    return m->wq_n > m->wl_n ? m->wq : m->wl;
}

static double uniform01(uint64_t *s) { return ((snug_splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

void snug_model_put_range(snug_model *m, size_t offset, const float *host, size_t n) {
    snug_backend *be = m->be;
    if (m->param_sharded) { /* ZeRO-3: only the shard's part of the range is kept (and, 16-bit, its master) */
        size_t a = offset > m->pshard_lo ? offset : m->pshard_lo;
        size_t b = offset + n < m->pshard_lo + m->pshard_n ? offset + n : m->pshard_lo + m->pshard_n;
        if (b <= a)
            return;
        host += a - offset;
        n = b - a;
        offset = a;
        if (!is16(m) && m->lv.offload_params) { /* host memory */
            memcpy(m->params + (a - m->pshard_lo), host, n * sizeof *host);
            return;
        }
        if (!is16(m)) {
            be->to_device(be, m->params + (a - m->pshard_lo), host, n * sizeof *host);
            return;
        }
        if (m->lv.offload_params) { /* host memory, rounded there as the backend's to16 rounds (to nearest even) */
            uint16_t *d = m->params16 + (a - m->pshard_lo);
            for (size_t k = 0; k < n; k++)
                d[k] = m->lv.dt == SNUG_DT_BF16 ? snug_f32_to_bf16(host[k]) : snug_f32_to_f16(host[k]);
            m->wl_layer = -1;
            return;
        }
    }
    if (m->params && m->master_sharded) { /* the shard's part of the range */
        size_t a = offset > m->master_lo ? offset : m->master_lo;
        size_t b = offset + n < m->master_lo + m->master_n ? offset + n : m->master_lo + m->master_n;
        if (b > a)
            be->to_device(be, m->params + (a - m->master_lo), host + (a - offset), (b - a) * sizeof *host);
    } else if (m->params) {
        be->to_device(be, m->params + offset, host, n * sizeof *host);
    }
    if (!is16(m))
        return;
    /* 16-bit: round through the layer workspace, a layer's worth at a time */
    size_t piece;
    float *buf = staging(m, &piece);
    for (size_t o = 0; o < n; o += piece) {
        size_t k = n - o < piece ? n - o : piece;
        be->to_device(be, buf, host + o, k * sizeof *host);
        be->to16(be, m->params16 + (offset - (m->param_sharded ? m->pshard_lo : 0)) + o, buf, k, m->lv.dt, 0);
    }
    m->wl_layer = -1;
}

void snug_model_put_params(snug_model *m, const float *host) {
    if (!m->packed) {
        snug_model_put_range(m, 0, host, m->table.total);
        return;
    }
    for (int i = 0; i < m->table.n; i++)
        snug_model_put_entry(m, i, host + m->table.e[i].offset, NULL);
}

int snug_model_put_entry(snug_model *m, int i, const float *host, snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    if (!snug_model_entry_q4(m, i)) {
        if (!m->packed) {
            snug_model_put_range(m, p->offset, host, p->numel);
            return 0;
        }
        /* packed dense tensors: rounded to 16 bits at their place */
        snug_backend *be = m->be;
        size_t piece;
        float *buf = staging(m, &piece);
        for (size_t o = 0; o < p->numel; o += piece) {
            size_t k = p->numel - o < piece ? p->numel - o : piece;
            be->to_device(be, buf, host + o, k * sizeof *host);
            be->to16(be, stored16(m, i) + o, buf, k, m->lv.dt, 0);
        }
        m->wl_layer = -1;
        return 0;
    }
    /* quantized on the host (bitsandbytes' arithmetic), then copied to where the model keeps it */
    snug_q4_tensor q = m->q4[i];
    size_t bytes = snug_q4_bytes(q.type, q.n, q.blocksize, q.nested);
    void *buf = m->be->host_resident && !m->q4_sharded ? m->q4_block[i] : malloc(bytes);
    if (!buf)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory quantizing %s", p->name);
    snug_q4_carve(&q, buf);
    int rc = snug_q4_quantize(&q, host, SNUG_DT_F32, e);
    if (!rc)
        snug_model_put_q4(m, i, buf, q.nested_offset);
    if (buf != m->q4_block[i])
        free(buf);
    return rc;
}

void snug_model_put_q4(snug_model *m, int i, const void *buf, float nested_offset) {
    const snug_q4_tensor *q = &m->q4[i];
    size_t bytes = snug_q4_bytes(q->type, q->n, q->blocksize, q->nested);
    if (!m->q4_sharded) {
        if (buf != m->q4_block[i])
            m->be->to_device(m->be, m->q4_block[i], buf, bytes);
    } else { /* the part of its layer's span that is this rank's piece */
        int l = m->table.e[i].layer;
        size_t P = m->q4_piece[l], lo = (size_t)m->q4_part * P, at = m->q4_rel[i];
        size_t a = at > lo ? at : lo, b = at + bytes < lo + P ? at + bytes : lo + P;
        char *dst = m->q4_shard + m->q4_soff[l] + (a - lo);
        if (b > a && m->lv.offload_params) /* host memory */
            memcpy(dst, (const char *)buf + (a - at), b - a);
        else if (b > a)
            m->be->to_device(m->be, dst, (const char *)buf + (a - at), b - a);
        for (int k = 0; k < 2; k++) /* gathered again before it is read */
            m->q4_gbuf_layer[k] = m->q4_gbuf_layer[k] == l ? -1 : m->q4_gbuf_layer[k];
    }
    m->q4[i].nested_offset = nested_offset;
    m->wl_layer = -1;
}

void snug_model_get_params(const snug_model *m, float *host) {
    snug_backend *be = m->be;
    size_t P = m->table.total;
    if (m->params && !m->master_sharded) { /* fp32 parameters, or the master copy (a shard: the 16-bit copy) */
        be->to_host(be, host, m->params, P * sizeof *host);
        return;
    }
    size_t piece;
    float *buf = staging(m, &piece);
    if (m->packed) { /* each tensor as forward sees it, QLoRA's 4-bit ones dequantized chunk by chunk */
        for (int i = 0; i < m->table.n; i++) {
            const snug_param_entry *p = &m->table.e[i];
            if (snug_model_entry_q4(m, i)) {
                q4_local(m, p->layer);
                size_t R = (size_t)m->q4[i].shape[0], cols = (size_t)m->q4[i].shape[1];
                size_t cr = (size_t)m->q4_site[i].chunk_rows;
                for (size_t r = 0; r < R; r += cr) {
                    size_t nr = R - r < cr ? R - r : cr;
                    dequant_rows(m, i, r, nr, m->wq);
                    be->to_host(be, host + p->offset + r * cols, m->wq, nr * cols * sizeof *host);
                }
                continue;
            }
            for (size_t o = 0; o < p->numel; o += piece) {
                size_t k = p->numel - o < piece ? p->numel - o : piece;
                be->from16(be, buf, stored16(m, i) + o, k, m->lv.dt);
                be->to_host(be, host + p->offset + o, buf, k * sizeof *host);
            }
        }
        ((snug_model *)m)->wl_layer = -1;
        return;
    }
    for (size_t o = 0; o < P; o += piece) {
        size_t k = P - o < piece ? P - o : piece;
        be->from16(be, buf, m->params16 + o, k, m->lv.dt);
        be->to_host(be, host + o, buf, k * sizeof *host);
    }
    ((snug_model *)m)->wl_layer = -1;
}

/* The random init's next len values of table entry p (a model of n_layer layers) into x, from the entry's stream *s
 * where the previous piece left it (len even but for the last piece, so the Box-Muller pairs stay whole). */
static void init_values(const snug_param_entry *p, double std, int n_layer, uint64_t *s, float *x, size_t len) {
    int is_norm_w = p->ndim == 1 && (strstr(p->name, "norm") || strstr(p->name, "ln_")) && ends_with(p->name, "weight");
    int residual_out = ends_with(p->name, "o_proj.weight") || ends_with(p->name, "down_proj.weight") ||
                       ends_with(p->name, "c_proj.weight");
    double sd = residual_out ? std / sqrt(2.0 * n_layer) : std;
    if (p->ndim == 1) {
        for (size_t k = 0; k < len; k++)
            x[k] = is_norm_w ? 1.0f : 0.0f;
        return;
    }
    for (size_t k = 0; k < len; k += 2) {
        double u1 = uniform01(s), u2 = uniform01(s), r = sqrt(-2.0 * log(u1));
        x[k] = (float)(sd * r * cos(2 * M_PI * u2));
        if (k + 1 < len)
            x[k + 1] = (float)(sd * r * sin(2 * M_PI * u2));
    }
}

/* each tensor gets its own stream, so adding a tensor does not change the others */
static uint64_t init_stream(uint64_t seed, int i) {
    return seed * 0x100000001B3ull + (uint64_t)i * 0x9E3779B97F4A7C15ull;
}

/* Tensor parallelism: the whole model's tensors drawn as one process draws them, each rank keeping its slice, so the
 * ranks start from the weights one process would */
static int init_random_tp(snug_model *m, uint64_t seed, double std) {
    snug_param_table g;
    if (snug_param_table_build(&g, &m->tp_cfg, NULL))
        return SNUG_ENOMEM;
    size_t largest = 0;
    for (int i = 0; i < g.n; i++)
        largest = g.e[i].numel > largest ? g.e[i].numel : largest;
    float *whole = malloc(largest * sizeof *whole), *part = malloc(largest * sizeof *part);
    int rc = whole && part && g.n == m->table.n ? 0 : SNUG_ENOMEM;
    for (int i = 0; i < g.n && !rc; i++) {
        uint64_t s = init_stream(seed, i);
        init_values(&g.e[i], std, m->tp_cfg.n_layer, &s, whole, g.e[i].numel);
        snug_tp_slice(&g.e[i], &m->table.e[i], m->tp_rank, whole, part, 0);
        rc = snug_model_put_entry(m, i, part, NULL) ? SNUG_ENOMEM : 0;
    }
    free(whole);
    free(part);
    snug_param_table_free(&g);
    return rc;
}

int snug_model_init_random(snug_model *m, uint64_t seed) {
    const snug_model_config *c = &m->cfg;
    float std = c->initializer_range > 0 ? c->initializer_range : 0.02f;
    if (m->tp > 1)
        return init_random_tp(m, seed, std);
    /* write straight into the parameters when they are fp32 host memory; else through a host buffer of PIECE
     * values (even, so the Box-Muller pairs never straddle two pieces) */
    size_t PIECE = (size_t)1 << 20, largest = 0;
    for (int i = 0; m->q4 && i < m->table.n; i++) /* QLoRA quantizes whole tensors: pieces as large as the largest */
        largest = m->table.e[i].numel > largest ? m->table.e[i].numel : largest;
    PIECE = largest > PIECE ? (largest + 1) / 2 * 2 : PIECE;
    float *direct = snug_model_host_params(m);
    float *buf = direct ? NULL : malloc(PIECE * sizeof *buf);
    /* a pipeline stage: each tensor's stream is its index in the whole model's table, as one process draws it */
    int *whole_i = malloc((size_t)(m->table.n ? m->table.n : 1) * sizeof *whole_i);
    snug_model_config wc = *c;
    wc.n_layer = m->pp > 1 ? m->pp_L : c->n_layer;
    snug_param_table g = {0};
    if ((!direct && !buf) || !whole_i || (m->pp > 1 && snug_param_table_build(&g, &wc, NULL))) {
        free(buf);
        free(whole_i);
        return SNUG_ENOMEM;
    }
    for (int i = 0; i < m->table.n; i++)
        whole_i[i] = m->pp > 1 ? snug_param_table_find(&g, m->table.e[i].name) : i;
    snug_param_table_free(&g);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        uint64_t s = init_stream(seed, whole_i[i]);
        for (size_t k0 = 0; k0 < p->numel; k0 += PIECE) {
            size_t len = p->numel - k0 < PIECE ? p->numel - k0 : PIECE;
            float *x = direct ? direct + p->offset + k0 : buf;
            init_values(p, std, wc.n_layer, &s, x, len);
            if (!direct && m->q4 && snug_model_put_entry(m, i, buf, NULL)) {
                free(buf);
                free(whole_i);
                return SNUG_ENOMEM;
            } else if (!direct && !m->q4) {
                snug_model_put_range(m, p->offset + k0, buf, len);
            }
        }
    }
    free(buf);
    free(whole_i);
    return 0;
}

void snug_model_set_batch(snug_model *m, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                          const int32_t *seg, int b_used, int t_used) {
    size_t n = (size_t)b_used * t_used * sizeof(int32_t);
    m->cur_B = b_used;
    m->cur_T = t_used;
    m->be->to_device(m->be, m->ids, ids, n);
    if (m->tp_vocab && m->ids_tp) { /* host memory (layout checks): the rank's rows, -1 (a zero row) elsewhere */
        int32_t V = m->cfg.vocab_size, lo = m->tp_rank * V;
        for (size_t k = 0; k < (size_t)b_used * t_used; k++)
            m->ids_tp[k] = ids[k] >= lo && ids[k] - lo < V ? ids[k] - lo : -1;
    }
    m->be->to_device(m->be, m->labels, labels, n);
    m->be->to_device(m->be, m->pos, pos, n);
    if (seg)
        m->be->to_device(m->be, m->seg, seg, n);
    m->seg_used = seg != NULL;
}

static void norm_fwd(const snug_model *m, float *out, float *mean, float *rstd, const float *inp, const float *w,
                     const float *b, int N) {
    snug_backend *be = m->be;
    if (m->cfg.arch == SNUG_ARCH_GPT2)
        be->layernorm_fwd(be, out, mean, rstd, inp, w, b, N, m->cfg.hidden_size, m->cfg.norm_eps);
    else
        be->rmsnorm_fwd(be, out, rstd, inp, w, N, m->cfg.hidden_size, m->cfg.norm_eps);
}

static void norm_bwd(const snug_model *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, const float *mean, const float *rstd, int N) {
    snug_backend *be = m->be;
    if (m->cfg.arch == SNUG_ARCH_GPT2)
        be->layernorm_bwd(be, dinp, dw, db, dout, inp, w, mean, rstd, N, m->cfg.hidden_size);
    else
        be->rmsnorm_bwd(be, dinp, dw, dout, inp, w, rstd, N, m->cfg.hidden_size);
}

/* 16-bit storage around fp32 compute. keep: round the fp32 result in place to dt and save it (dst may be NULL:
 * a value that is recomputed, not saved); fetch: widen a saved value back. Both do nothing in fp32. */
static void keep(const snug_model *m, uint16_t *dst, float *src, size_t n) {
    if (is16(m))
        m->be->to16(m->be, dst, src, n, m->lv.dt, 1);
}

static void fetch(const snug_model *m, float *dst, const uint16_t *src, size_t n) {
    if (is16(m) && src)
        m->be->from16(m->be, dst, src, n, m->lv.dt);
}

/* Layer l's input (and, for l = L, the final output) in fp32: a row of res, or a slot of the two under 16-bit or
 * offloading */
static float *res_at(const snug_model *m, int l) {
    size_t NC = (size_t)m->B * m->T * m->cfg.hidden_size;
    return m->res + (size_t)(is16(m) || m->res_off ? l % 2 : l) * NC;
}

/* Saves res[l] (just computed in its fp32 slot x, N = cur tokens): rounded to 16 bits into res16, or copied out to
 * host memory when offloading (through the 16-bit staging slot under 16-bit). fp32 without offloading: x is res[l].
 * Offloading never blocks the host: the copy of res[l] runs beside layer l's compute, and the ops queued from here
 * on wait only for the copy of res[l-1] (copy_wait), whose slot layer l overwrites (and, under 16-bit, whose staging
 * slot to16 overwrites next). */
static void save_res(snug_model *m, int l, float *x, size_t n) {
    snug_backend *be = m->be;
    size_t NC = (size_t)m->B * m->T * m->cfg.hidden_size;
    if (!m->res_off) {
        keep(m, m->res16 ? m->res16 + (size_t)l * NC : NULL, x, n);
        return;
    }
    size_t esz = snug_dtype_size(m->lv.dt);
    unsigned char *host = (unsigned char *)m->res_off + (size_t)l * NC * esz;
    be->copy_wait(be);
    if (is16(m)) {
        be->to16(be, m->res_stage, x, n, m->lv.dt, 1);
        be->copy_out_async(be, host, m->res_stage, n * esz);
    } else {
        be->copy_out_async(be, host, x, n * esz);
    }
}

/* Brings res[l] back into its fp32 slot x for layer l's backward (nothing to do for fp32 without offloading). The
 * copy starts after the ops queued so far (which may still read the slot) and the ops after it wait for it, without
 * blocking the host. */
static void load_res(snug_model *m, int l, float *x, size_t n) {
    snug_backend *be = m->be;
    size_t NC = (size_t)m->B * m->T * m->cfg.hidden_size;
    if (!m->res_off) {
        fetch(m, x, m->res16 ? m->res16 + (size_t)l * NC : NULL, n);
        return;
    }
    size_t esz = snug_dtype_size(m->lv.dt);
    const unsigned char *host = (const unsigned char *)m->res_off + (size_t)l * NC * esz;
    be->copy_in_async(be, is16(m) ? (void *)m->res_stage : (void *)x, host, n * esz);
    be->copy_wait(be);
    if (is16(m))
        be->from16(be, x, m->res_stage, n, m->lv.dt);
}

/* The site whose weight a layer tensor is (the first of its rows: q_proj of q/k/v, gate_proj of gate/up), or -1 */
static int weight_site(const char *name) {
    snug_tensors unused;
    snug_layer_tensors L;
    float **s = slot_of(name, &unused, &L);
    return s == &L.qkv_w ? SNUG_SITE_QKV : s == &L.o_w ? SNUG_SITE_O : s == &L.fc_w ? SNUG_SITE_FC
         : s == &L.proj_w ? SNUG_SITE_PROJ : -1;
}

/* Layer l's weights as fp32 views: the parameters themselves, or under 16-bit the layer widened into wl. Where the
 * backend's GEMMs read 16-bit weights as stored (matmul_w16), only the norms and biases are widened and lin_fwd and
 * lin_bwd take the matrices from params16 (wl16): the views of the four are NULL. */
static const snug_layer_tensors *layer_weights(snug_model *m, int l) {
    if (m->q4_sharded)
        q4_layer(m, l);
    if (m->param_sharded && !is16(m)) {
        (void)gathered_layer(m, l);
        return &m->gbuf_t[l % 2];
    }
    if (!is16(m))
        return &m->w.layers[l];
    /* a sharded layer is widened from its gathered buffer: the 16-bit matrices as stored are only the shard */
    int direct = !m->q4 && !m->param_sharded && m->be->matmul_w16_fwd && m->be->matmul_w16_bwd;
    if (m->wl_layer == l && m->wl_direct == direct && !m->param_sharded) /* sharded: the gather decides below */
        return direct ? &m->wd_t : &m->wl_t;
    if (direct) {
        for (int i = 0; i < m->table.n; i++) {
            const snug_param_entry *p = &m->table.e[i];
            if (p->layer != l)
                continue;
            int site = p->ndim == 2 ? weight_site(p->name) : -1;
            if (site >= 0)
                m->wl16[site] = stored16(m, i);
            else if (p->ndim != 2)
                m->be->from16(m->be, m->wl + (p->offset - m->table.layer_offset[l]), stored16(m, i), p->numel,
                              m->lv.dt);
        }
    } else if (m->param_sharded) {
        if (m->gbuf_layer[l % 2] != l || m->wl_layer != l)
            m->be->from16(m->be, m->wl, gathered_layer(m, l), m->table.layer_numel[l], m->lv.dt);
    } else if (!m->q4) {
        size_t start = m->table.layer_offset[l];
        if (m->packed)
            dense_layer(m, l, &start);
        m->be->from16(m->be, m->wl, m->params16 + start, m->table.layer_numel[l], m->lv.dt);
    } else { /* QLoRA: only the dense tensors; the 4-bit matrices stream through wq */
        size_t start, n = dense_layer(m, l, &start);
        if (n)
            m->be->from16(m->be, m->wl, m->params16 + start, n, m->lv.dt);
    }
    m->wl_layer = l, m->wl_direct = direct;
    return direct ? &m->wd_t : &m->wl_t;
}

void snug_model_site_rows(snug_model *m, int l, snug_site site, int row, int nr, int in, float *dst) {
    snug_backend *be = m->be;
    const snug_layer_tensors *w = layer_weights(m, l);
    if (m->q4) { /* the 4-bit matrices of the site that hold some of the rows */
        for (int i = 0; i < m->table.n; i++) {
            if (m->table.e[i].layer != l || !m->q4[i].n || m->q4_site[i].site != (int)site)
                continue;
            int r0 = m->q4_site[i].row0, R = (int)m->q4[i].shape[0];
            int a = row > r0 ? row : r0, b = row + nr < r0 + R ? row + nr : r0 + R;
            if (a < b)
                dequant_rows(m, i, (size_t)(a - r0), (size_t)(b - a), dst + (size_t)(a - row) * in);
        }
        return;
    }
    const float *f = snug_site_weight(w, site);
    if (f)
        be->copy(be, dst, f + (size_t)row * in, (size_t)nr * in * sizeof *dst);
    else /* the 16-bit weight as stored */
        be->from16(be, dst, m->wl16[site] + (size_t)row * in, (size_t)nr * in, m->lv.dt);
}

/* out (N, OC) = inp (N, Cin) @ W^T + b, W the site's weight (OC, Cin): w, or with w NULL its 16-bit copy as stored
 * (wl16). Under QLoRA W is the site's 4-bit matrices, each dequantized a chunk of rows at a time into wq, and each
 * chunk's GEMM writes its columns of out. */
static void lin_fwd(snug_model *m, int l, snug_site site, float *out, const float *inp, const float *w,
                    const float *b, int N, int Cin, int OC) {
    snug_backend *be = m->be;
    if (!m->q4 && !w) { /* the 16-bit weight as stored (layer_weights) */
        be->matmul_w16_fwd(be, out, inp, m->wl16[site], m->lv.dt, b, N, Cin, OC);
        return;
    }
    if (!m->q4) {
        be->matmul_fwd(be, out, inp, w, b, N, Cin, OC);
        return;
    }
    for (int i = 0; i < m->table.n; i++) {
        if (m->table.e[i].layer != l || !m->q4[i].n || m->q4_site[i].site != (int)site)
            continue;
        int R = (int)m->q4[i].shape[0], cr = m->q4_site[i].chunk_rows, row0 = m->q4_site[i].row0;
        for (int r = 0; r < R; r += cr) {
            int nr = R - r < cr ? R - r : cr;
            dequant_rows(m, i, r, nr, m->wq);
            be->gemm_strided(be, 0, 1, N, nr, Cin, 1.0f, inp, Cin, m->wq, Cin, 0.0f, out + row0 + r, OC);
        }
    }
    if (b) /* out += ones (N, 1) @ b (1, OC) */
        be->gemm_strided(be, 0, 0, N, OC, 1, 1.0f, m->ones, 1, b, OC, 1.0f, out, OC);
}

/* The backward of lin_fwd: dinp += dout @ W, dw += dout^T @ inp, db += column sums of dout (each skipped when NULL).
 * Under QLoRA the base is frozen (no dw, no db) and dinp takes the chunks' products in turn. */
static void lin_bwd(snug_model *m, int l, snug_site site, float *dinp, float *dw, float *db, const float *dout,
                    const float *inp, const float *w, int N, int Cin, int OC) {
    snug_backend *be = m->be;
    if (!m->q4 && !w) {
        be->matmul_w16_bwd(be, dinp, dw, db, dout, inp, m->wl16[site], m->lv.dt, N, Cin, OC);
        return;
    }
    if (!m->q4) {
        be->matmul_bwd(be, dinp, dw, db, dout, inp, w, N, Cin, OC);
        return;
    }
    for (int i = 0; dinp && i < m->table.n; i++) {
        if (m->table.e[i].layer != l || !m->q4[i].n || m->q4_site[i].site != (int)site)
            continue;
        int R = (int)m->q4[i].shape[0], cr = m->q4_site[i].chunk_rows, row0 = m->q4_site[i].row0;
        for (int r = 0; r < R; r += cr) {
            int nr = R - r < cr ? R - r : cr;
            dequant_rows(m, i, r, nr, m->wq);
            be->gemm_strided(be, 0, 0, N, Cin, nr, 1.0f, dout + row0 + r, OC, m->wq, Cin, 1.0f, dinp, Cin);
        }
    }
}

/* Tensor parallelism: a row-parallel site's bias, added by rank 0 alone (the ranks' partial outputs are summed) */
static const float *tp_bias(const snug_model *m, const float *b) { return m->tp > 1 && m->tp_rank ? NULL : b; }

/* Tensor parallelism: n floats summed over the ranks in place (nothing on one rank) */
static void tp_sum(snug_model *m, float *x, size_t n) {
    if (m->tp > 1 && m->tp_reduce)
        m->tp_reduce(m->tp_reduce_ud, x, n);
}

/* The MLP's input half for rows [n0, n0 + ns) of the micro-batch: fc = fc(ln2) (+ adapters) and act = act(fc), into
 * a->fc, a->act (a tiled MLP's shard buffers, or every row); under 16-bit each rounded, and saved where s has a
 * place for it (never for a tiled MLP). */
static void mlp_in(snug_model *m, int l, const snug_layer_tensors *w, const snug_layer_acts *a,
                   const snug_layer_acts16 *s, int n0, int ns) {
    snug_backend *be = m->be;
    int C = m->cfg.hidden_size, I = m->cfg.intermediate_size;
    const float *x = a->ln2 + (size_t)n0 * C;
    lin_fwd(m, l, SNUG_SITE_FC, a->fc, x, w->fc_w, w->fc_b, ns, C, m->FC);
    snug_lora_fwd(m, l, SNUG_SITE_FC, a->fc, m->FC, x, ns, n0, w->fc_b);
    keep(m, s ? s->fc : NULL, a->fc, (size_t)ns * m->FC);
    if (m->cfg.arch == SNUG_ARCH_GPT2)
        be->gelu_fwd(be, a->act, a->fc, (size_t)ns * I);
    else
        be->swiglu_fwd(be, a->act, a->fc, ns, I);
    keep(m, s ? s->act : NULL, a->act, (size_t)ns * I);
}

/* One transformer block forward: res[l] -> res[l+1], saving what backward needs in acts[l] (acts16[l]). As the
 * recomputation of a fully checkpointed layer (recompute = 1) with a tiled MLP it stops at the MLP's input: the
 * MLP's backward recomputes its shards itself, and nothing reads res[l+1] again. */
static void layer_fwd(snug_model *m, int l, int recompute) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int Bc = m->cur_B, Tc = m->cur_T, N = Bc * Tc, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
    int HD = c->head_dim, I = c->intermediate_size;
    size_t Nn = (size_t)N;
    const snug_layer_tensors *w = layer_weights(m, l);
    snug_layer_acts *a = &m->acts[l];
    const snug_layer_acts16 *s = &m->acts16[l];
    const float *x = res_at(m, l);
    float *out = res_at(m, l + 1);

    norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, N);
    keep(m, s->ln1, a->ln1, Nn * C);
    lin_fwd(m, l, SNUG_SITE_QKV, a->qkv, a->ln1, w->qkv_w, w->qkv_b, N, C, m->QKV);
    snug_lora_fwd(m, l, SNUG_SITE_QKV, a->qkv, m->QKV, a->ln1, N, 0, w->qkv_b);
    if (c->arch != SNUG_ARCH_GPT2)
        be->rope_fwd(be, a->qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    keep(m, s->qkv, a->qkv, Nn * m->QKV);
    if (m->lv.naive_attention)
        be->attention_naive_fwd(be, a->att, a->probs, a->qkv, m->seg_used ? m->seg : NULL, Bc, Tc, NH, NKV, HD,
                                1.0f / sqrtf((float)HD));
    else
        be->attention_fwd(be, a->att, a->lse, a->qkv, m->seg_used ? m->seg : NULL, Bc, Tc, NH, NKV, HD,
                          1.0f / sqrtf((float)HD));
    keep(m, s->att, a->att, Nn * NH * HD);
    lin_fwd(m, l, SNUG_SITE_O, a->res_mid, a->att, w->o_w, tp_bias(m, w->o_b), N, NH * HD, C);
    snug_lora_fwd(m, l, SNUG_SITE_O, a->res_mid, C, a->att, N, 0, tp_bias(m, w->o_b));
    tp_sum(m, a->res_mid, Nn * C);
    be->accumulate(be, a->res_mid, x, Nn * C);
    keep(m, s->res_mid, a->res_mid, Nn * C);
    norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2_w, w->ln2_b, N);
    keep(m, s->ln2, a->ln2, Nn * C);
    /* MLP: a tiled one shard by shard, nothing of it saved (its backward recomputes each shard) */
    if (m->mlp_rows && recompute)
        return;
    int rows = m->mlp_rows ? m->mlp_rows : N;
    for (int n0 = 0; n0 < N; n0 += rows) {
        int ns = N - n0 < rows ? N - n0 : rows;
        mlp_in(m, l, w, a, s, n0, ns);
        lin_fwd(m, l, SNUG_SITE_PROJ, out + (size_t)n0 * C, a->act, w->proj_w, tp_bias(m, w->proj_b), ns, I, C);
        snug_lora_fwd(m, l, SNUG_SITE_PROJ, out + (size_t)n0 * C, C, a->act, ns, n0, tp_bias(m, w->proj_b));
    }
    tp_sum(m, out, Nn * C);
    be->accumulate(be, out, a->res_mid, Nn * C);
    save_res(m, l + 1, out, Nn * C);
}

/* One transformer block backward. On entry m->d_res holds dL/d res[l+1]; on exit dL/d res[l]. */
static void layer_bwd(snug_model *m, int l) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int Bc = m->cur_B, Tc = m->cur_T, N = Bc * Tc, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
    int HD = c->head_dim, I = c->intermediate_size;
    size_t Nn = (size_t)N;
    const snug_layer_acts *a = &m->acts[l];
    const snug_layer_acts16 *s = &m->acts16[l];
    float *x = res_at(m, l);
    int full = snug_model_layer_full_ckpt(m, l);
    int selective = m->lv.ckpt == SNUG_CKPT_SELECTIVE && !full;

    /* 16-bit: the layer's input and saved activations come back into the fp32 set (a full checkpoint's
     * recomputation refills it instead) */
    load_res(m, l, x, Nn * C);
    if (!full) {
        fetch(m, a->ln1, s->ln1, Nn * C);
        fetch(m, a->qkv, s->qkv, Nn * m->QKV);
        fetch(m, a->att, s->att, Nn * NH * HD);
        fetch(m, a->res_mid, s->res_mid, Nn * C);
        fetch(m, a->ln2, s->ln2, Nn * C);
        fetch(m, a->fc, s->fc, Nn * m->FC);
        fetch(m, a->act, s->act, Nn * I);
    }
    /* checkpointing: full recomputes the whole layer from its saved input into the shared set; selective
     * recomputes the MLP activation and each norm output just before its use (same code, same bits) */
    if (full)
        layer_fwd(m, l, 1);
    const snug_layer_tensors *w = layer_weights(m, l);
    snug_layer_tensors *g = &m->g.layers[l];
    if (m->grads16) { /* 16-bit gradients: this layer's are summed in fp32 in gl, then rounded once */
        be->zero(be, m->gl, m->table.layer_numel[l] * sizeof(float));
        g = &m->gl_t;
    }
    snug_layer_tensors live; /* unfrozen_parameters: no gradient computed for a frozen tensor */
    if (m->frozen_any) {
        live = *g;
        drop_frozen(m, l, &live, NULL);
        g = &live;
    }
    if (selective && !m->mlp_rows) {
        if (c->arch == SNUG_ARCH_GPT2)
            be->gelu_fwd(be, a->act, a->fc, Nn * I);
        else
            be->swiglu_fwd(be, a->act, a->fc, N, I);
        keep(m, NULL, a->act, Nn * I);
    }
    if (selective) {
        norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2_w, w->ln2_b, N);
        keep(m, NULL, a->ln2, Nn * C);
    }

    /* MLP: res[l+1] = res_mid + proj(act(fc(norm2(res_mid)))); a tiled MLP shard by shard, each shard's input half
     * recomputed first (one shard of every row otherwise, from what forward saved) */
    be->zero(be, m->d_ln, Nn * C * sizeof(float));
    int rows = m->mlp_rows ? m->mlp_rows : N;
    for (int n0 = 0; n0 < N; n0 += rows) {
        int ns = N - n0 < rows ? N - n0 : rows;
        size_t nsI = (size_t)ns * I, o = (size_t)n0 * C;
        if (m->mlp_rows)
            mlp_in(m, l, w, a, NULL, n0, ns);
        be->zero(be, m->d_act, nsI * sizeof(float));
        const float *dp = snug_lora_dora_bwd(m, l, SNUG_SITE_PROJ, m->d_res + o, C, a->act, ns, NULL, NULL, 0);
        lin_bwd(m, l, SNUG_SITE_PROJ, m->d_act, g->proj_w, g->proj_b, dp, a->act, w->proj_w, ns, I, C);
        snug_lora_bwd(m, l, SNUG_SITE_PROJ, m->d_act, dp, C, a->act, ns, n0);
        be->zero(be, m->d_fc, (size_t)ns * m->FC * sizeof(float));
        if (c->arch == SNUG_ARCH_GPT2)
            be->gelu_bwd(be, m->d_fc, m->d_act, a->fc, nsI);
        else
            be->swiglu_bwd(be, m->d_fc, m->d_act, a->fc, ns, I);
        snug_lora_dora_bwd(m, l, SNUG_SITE_FC, m->d_fc, m->FC, a->ln2 + o, ns, a->fc, w->fc_b, 1);
        lin_bwd(m, l, SNUG_SITE_FC, m->d_ln + o, g->fc_w, g->fc_b, m->d_fc, a->ln2 + o, w->fc_w, ns, C, m->FC);
        snug_lora_bwd(m, l, SNUG_SITE_FC, m->d_ln + o, m->d_fc, m->FC, a->ln2 + o, ns, n0);
    }
    tp_sum(m, m->d_ln, Nn * C);
    norm_bwd(m, m->d_res, g->ln2_w, g->ln2_b, m->d_ln, a->res_mid, w->ln2_w, a->ln2_mean, a->ln2_rstd, N);

    /* attention: res_mid = res[l] + o(attn(rope(qkv(norm1(res[l]))))) */
    be->zero(be, m->d_att, Nn * NH * HD * sizeof(float));
    const float *d_o = snug_lora_dora_bwd(m, l, SNUG_SITE_O, m->d_res, C, a->att, N, NULL, NULL, 0);
    lin_bwd(m, l, SNUG_SITE_O, m->d_att, g->o_w, g->o_b, d_o, a->att, w->o_w, N, NH * HD, C);
    snug_lora_bwd(m, l, SNUG_SITE_O, m->d_att, d_o, C, a->att, N, 0);
    be->zero(be, m->d_qkv, Nn * m->QKV * sizeof(float));
    if (m->lv.naive_attention)
        be->attention_naive_bwd(be, m->d_qkv, m->d_att, a->qkv, a->probs, Bc, Tc, NH, NKV, HD,
                                1.0f / sqrtf((float)HD));
    else
        be->attention_bwd(be, m->d_qkv, m->d_att, a->qkv, a->att, a->lse, m->seg_used ? m->seg : NULL, Bc, Tc, NH,
                          NKV, HD, 1.0f / sqrtf((float)HD));
    if (c->arch != SNUG_ARCH_GPT2)
        be->rope_bwd(be, m->d_qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    if (selective) {
        norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, N);
        keep(m, NULL, a->ln1, Nn * C);
    }
    /* a frozen embedding (LoRA) takes no gradient, so the first layer's input gradient is never read */
    int need_dx = l > 0 || !snug_pp_first(m) || m->g.wte || m->g.wpe || g->ln1_w ||
                  (m->lora.on && m->lora.emb_off != (size_t)-1); /* (a later pipeline stage sends it back) */
    if (need_dx)
        be->zero(be, m->d_ln, Nn * C * sizeof(float));
    /* DoRA reads q/k/v's output as its GEMM left it: the rotation undone in place (attention's backward, the last
     * reader of the rotated values, is done) */
    if (m->lora.dora && m->lora.table.layer_numel[l] && c->arch != SNUG_ARCH_GPT2)
        be->rope_bwd(be, a->qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    snug_lora_dora_bwd(m, l, SNUG_SITE_QKV, m->d_qkv, m->QKV, a->ln1, N, a->qkv, w->qkv_b, 1);
    lin_bwd(m, l, SNUG_SITE_QKV, need_dx ? m->d_ln : NULL, g->qkv_w, g->qkv_b, m->d_qkv, a->ln1, w->qkv_w, N, C,
            m->QKV);
    snug_lora_bwd(m, l, SNUG_SITE_QKV, need_dx ? m->d_ln : NULL, m->d_qkv, m->QKV, a->ln1, N, 0);
    if (need_dx) {
        tp_sum(m, m->d_ln, Nn * C);
        norm_bwd(m, m->d_res, g->ln1_w, g->ln1_b, m->d_ln, x, w->ln1_w, a->ln1_mean, a->ln1_rstd, N);
    }
    if (m->grads16 && m->frozen_any) { /* tensor by tensor where grad_offsets put them (none for a frozen one) */
        for (int i = 0; i < m->table.n; i++)
            if (m->table.e[i].layer == l && m->grad_off[i] != NO_GRAD)
                be->to16(be, m->grads16 + m->grad_off[i], m->gl + (m->table.e[i].offset - m->table.layer_offset[l]),
                         m->table.e[i].numel, m->lv.dt, 0);
    } else if (m->grads16) { /* where grad_offsets put layer l: its place among the layers, or the one shared buffer */
        size_t o16 = m->lv.optimizer_in_backward || m->lv.zero_grads ? 0
                                                                      : m->table.layer_offset[l] - m->table.layer_offset[0];
        be->to16(be, m->grads16 + o16, m->gl, m->table.layer_numel[l], m->lv.dt, 0);
    }
}

static double stage_bwd(snug_model *m, const int32_t *ids, double loss);

double snug_model_step(snug_model *m, float grad_scale) { return snug_model_stage(m, grad_scale, NULL, NULL); }

double snug_model_stage(snug_model *m, float grad_scale, const float *in, const float *dout) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int N = m->cur_B * m->cur_T, C = c->hidden_size, L = c->n_layer;
    int train = grad_scale != 0.0f && (m->grads || m->grads16 || m->lora.grads);
    m->lora.training = train;
    snug_dtype dt = m->lv.dt;
    if (m->vtied && (train || m->param_sharded))
        lookup_rows(m, N);
    if (m->param_sharded) { /* the parameters may have changed since the last step: gather afresh */
        m->gglob_ok = 0;
        m->gbuf_layer[0] = m->gbuf_layer[1] = -1;
        gather_globals(m, GLOB_PRE);
        if (m->vtied)
            gather_lookup_rows(m);
    }
    /* (a pipeline stage may hold neither the embedding nor the head) */
    const void *wte = m->emb16                       ? (const void *)m->emb16
                      : m->param_sharded && m->vtied ? m->urows
                      : m->gwte != (size_t)-1        ? snug_model_stored(m, m->gwte)
                                                     : NULL;
    const int32_t *ids = m->param_sharded && m->vtied ? m->ids_u : m->tp_vocab ? m->ids_tp : m->ids;
    const void *head = (m->param_sharded && m->vtied) || m->ghead == (size_t)-1 ? NULL : snug_model_stored(m, m->ghead);
    snug_dtype wdt = dt, hdt = dt;
    float *dhead = m->g.lm_head;
    const snug_lora *lo = &m->lora;
    if (lo->on && lo->emb_off != (size_t)-1) /* lora_modules_to_save: the trained fp32 copies */
        wte = lo->params + lo->emb_off, wdt = SNUG_DT_F32;
    if (lo->on && lo->head_off != (size_t)-1)
        head = lo->params + lo->head_off, hdt = SNUG_DT_F32, dhead = lo->grads ? lo->grads + lo->head_off : NULL;
    const float *lnf_w = m->w.lnf_w, *lnf_b = m->w.lnf_b;

    if (!snug_pp_last(m) && dout && m->act_sets_n > 1) { /* its forward kept this micro-batch's set */
        m->wl_layer = -1;
        be->copy(be, m->d_res, dout, (size_t)N * C * sizeof(float));
        return stage_bwd(m, ids, 0);
    }
    m->wl_layer = -1; /* the parameters may have changed since the last step */
    float *x0 = res_at(m, 0);
    if (!snug_pp_first(m)) { /* a later pipeline stage: the previous stage's output */
        be->copy(be, x0, in, (size_t)N * C * sizeof(float));
    } else {
        be->embed_fwd(be, x0, ids, wte, wdt, N, C, 0);
        if (m->tp_vocab) /* each rank looked up the ids in its rows */
            tp_sum(m, x0, (size_t)N * C);
        if (c->arch == SNUG_ARCH_GPT2)
            be->embed_fwd(be, x0, m->pos, snug_model_stored(m, m->gwpe), dt, N, C, 1);
        if (train && m->neftune_alpha > 0) /* NEFTune (transformers' neftune_post_forward_hook): the sequence length
                                            * times the width, of the micro-batch as it is padded or packed */
            be->add_noise(be, x0, (size_t)N * C, m->neftune_alpha / sqrtf((float)m->cur_T * (float)C),
                          m->lora.seed ^ 0x6e656674756e65ull);
    }
    save_res(m, 0, x0, (size_t)N * C);
    m->gdir = 1; /* ZeRO-3 prefetches the next layer */
    for (int l = 0; l < L; l++)
        layer_fwd(m, l, 0);
    m->gdir = 0;
    if (!snug_pp_last(m)) { /* an earlier pipeline stage: its output, or backward from its gradient */
        if (!dout) {
            be->copy(be, m->pp_out, res_at(m, L), (size_t)N * C * sizeof(float));
            return 0;
        }
        be->copy(be, m->d_res, dout, (size_t)N * C * sizeof(float));
        return stage_bwd(m, ids, 0);
    }
    gather_globals(m, GLOB_POST); /* ZeRO-3: the final norm and the head again (the layers took their buffer) */
    if (is16(m)) { /* the final norm's parameters widened (lnf_b exists for LayerNorm only) */
        be->from16(be, m->lnf_ws, snug_model_stored(m, m->glnf_w), (size_t)C, dt);
        lnf_w = m->lnf_ws;
        lnf_b = NULL;
        if (m->glnf_b != (size_t)-1) {
            be->from16(be, m->lnf_ws + C, snug_model_stored(m, m->glnf_b), (size_t)C, dt);
            lnf_b = m->lnf_ws + C;
        }
    }
    float *final = res_at(m, L);
    norm_fwd(m, m->lnf, m->lnf_mean, m->lnf_rstd, final, lnf_w, lnf_b, N);

    if (!train)
        return m->vb ? loss_blocks(m, head, hdt, NULL, N, 0.0f, 0, 0)
                     : be->xent_fwd_bwd(be, NULL, NULL, m->lnf, head, hdt, m->labels, N, C, c->vocab_size, 0.0f,
                                        m->logits, m->xent_chunk, m->w_ws, m->wblock);

    /* the loss and the gradient of the final hidden states come out of one chunked pass (or two over the head's
     * blocks of rows) */
    be->zero(be, m->d_ln, (size_t)N * C * sizeof(float));
    double loss = m->vb ? loss_blocks(m, head, hdt, dhead, N, grad_scale, 1, 0)
                        : be->xent_fwd_bwd(be, m->d_ln, dhead, m->lnf, head, hdt, m->labels, N, C, c->vocab_size,
                                           grad_scale, m->logits, m->xent_chunk, m->w_ws, m->wblock);
    if (m->tp_vocab) /* each rank's rows of the head gave their part */
        tp_sum(m, m->d_ln, (size_t)N * C);
    be->zero(be, m->d_res, (size_t)N * C * sizeof(float));
    norm_bwd(m, m->d_res, m->g.lnf_w, m->g.lnf_b, m->d_ln, final, lnf_w, m->lnf_mean, m->lnf_rstd, N);
    if (m->lv.zero_grads) /* the final norm and an untied head are complete: their buffer is the layers' next */
        announce_globals(m, SNUG_READY_POST);
    return stage_bwd(m, ids, loss);
}

/* Backward through the layers from dL/d res[L] in d_res, then into the embedding (the first pipeline stage) or
 * pp_din (a later one). Returns loss. */
static double stage_bwd(snug_model *m, const int32_t *ids, double loss) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int N = m->cur_B * m->cur_T, C = c->hidden_size, L = c->n_layer;
    const snug_lora *lo = &m->lora;
    m->gdir = -1;
    for (int l = L - 1; l >= 0; l--) {
        layer_bwd(m, l);
        mask_frozen(m, l);
        if (m->on_grads_ready)
            m->on_grads_ready(m->on_grads_ready_ud, l, m->table.layer_offset[l], m->table.layer_numel[l]);
    }
    m->gdir = 0;
    if (!snug_pp_first(m)) /* the input's gradient, for the previous stage */
        be->copy(be, m->pp_din, m->d_res, (size_t)N * C * sizeof(float));
    else if (m->vtied) /* the looked-up rows, with the head's part of their gradient */
        reduce_lookup_rows(m, N, 0);
    else if (m->g.wte) /* a frozen base (LoRA) has no embedding gradient */
        be->embed_bwd(be, m->g.wte, m->d_res, ids, N, C);
    else if (lo->on && lo->emb_off != (size_t)-1 && lo->grads) /* unless lora_modules_to_save trains its copy */
        be->embed_bwd(be, lo->grads + lo->emb_off, m->d_res, m->ids, N, C);
    if (c->arch == SNUG_ARCH_GPT2 && m->g.wpe && snug_pp_first(m))
        be->embed_bwd(be, m->g.wpe, m->d_res, m->pos, N, C);
    announce_globals(m, -1);
    return loss;
}
