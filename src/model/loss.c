/* loss.c: the vocabulary blocks of the loss (loss_vocab_block: the head's rows a block at a time), tensor
 * parallelism over the vocabulary (each token's statistics combined over the ranks), and a tied embedding split by
 * rows under ZeRO-2/3 (vtied: the looked-up rows gathered and their gradient reduced apart). */
#include "model/model_impl.h"

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* vtied: every rank's ids of the micro-batch (rank r's n at r * B*T, -1 past its tokens), the rows they look up
 * (urow, increasing) and this rank's ids as indices into urow. n = 0: a rank without a micro-batch. */
void model_lookup_rows(snug_model *m, int n) {
    size_t NM = (size_t)m->B * m->T, R = (size_t)(m->nranks > 1 ? m->nranks : 1);
    int V = m->cfg.vocab_size;
    int32_t *mine = m->uids + (size_t)m->rank * NM;
    for (size_t k = 0; k < NM; k++)
        mine[k] = k < (size_t)n ? m->ids[k] : -1;
    if (model_hooks(m)->rows)
        model_hooks(m)->rows(m->hooks.ud, SNUG_ROWS_IDS, m->uids, 0, NULL, 0, (int)NM, 0);
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
void model_gather_lookup_rows(snug_model *m) {
    model_gather_settle(m);
    size_t es = snug_dtype_size(m->lv.dt), C = (size_t)m->cfg.hidden_size, lo = m->pshard_lo, hi = lo + m->pshard_n;
    const char *src = is16(m) ? (const char *)m->params16 : (const char *)m->params;
    for (int k = 0; k < m->nU; k++) {
        size_t o = m->gwte + (size_t)m->urow[k] * C, a = o > lo ? o : lo, b = o + C < hi ? o + C : hi;
        if (b > a)
            m->be->copy(m->be, (char *)m->urows + ((size_t)k * C + (a - o)) * es, src + (a - lo) * es, (b - a) * es);
    }
    if (model_hooks(m)->rows)
        model_hooks(m)->rows(m->hooks.ud, SNUG_ROWS_GATHER, m->urows, m->gwte, m->urow, 0, m->nU, (int)C);
}

/* The head's rows [v0, v0+n) as stored: in place, or under ZeRO-3 (vtied) gathered into the region after the
 * globals unless they are still there (*held: the block the region holds, -1 none). */
static const void *head_rows(snug_model *m, const void *head, snug_dtype hdt, int v0, int n, int *held) {
    size_t C = (size_t)m->cfg.hidden_size;
    if (!(m->param_sharded && m->vtied))
        return head ? (const char *)head + (size_t)v0 * C * snug_dtype_size(hdt) : NULL;
    char *dst = (char *)m->gglob + model_head_block_at(m) * snug_dtype_size(m->lv.dt);
    if (*held != v0) {
        model_gather_range(m, dst, m->gwte + (size_t)v0 * C, (size_t)n * C, 0);
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
    if (model_hooks(m)->rows)
        model_hooks(m)->rows(m->hooks.ud, SNUG_ROWS_REDUCE, dw, m->gwte, NULL, v0, n, (int)C);
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
    if (model_hooks(m)->tp_gather)
        model_hooks(m)->tp_gather(m->hooks.ud, m->tp_st, (size_t)3 * N);
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
double model_loss_blocks(snug_model *m, const void *head, snug_dtype hdt, float *dhead, int N, float grad_scale,
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
void model_reduce_lookup_rows(snug_model *m, int N, int skip) {
    if (!skip)
        m->be->embed_bwd(m->be, m->ubuf, m->d_res, m->ids_u, N, m->cfg.hidden_size);
    if (model_hooks(m)->rows)
        model_hooks(m)->rows(m->hooks.ud, SNUG_ROWS_REDUCE, m->ubuf, m->gwte, m->urow, 0, m->nU, m->cfg.hidden_size);
}

/* loss_vocab_block: the head's rows per block of the loss (vb, 0 off) and whether a tied embedding is split by rows
 * (vtied: ZeRO-2/3 training without adapters, the embedding the table's first tensor). */
void model_vocab_blocks(snug_model *m, int B, int T, int with_grads) {
    const snug_model_config *c = &m->cfg;
    int V = c->vocab_size, C = c->hidden_size;
    size_t rows = m->lv.vocab_block > 0 ? (size_t)m->lv.vocab_block : model_largest_layer(m) / (size_t)(C > 0 ? C : 1);
    m->vb = m->lv.vocab_block && !m->lv.lora.kind && V > 0 ? (int)(rows < 1 ? 1 : rows < (size_t)V ? rows : (size_t)V) : 0;
    if (m->tp_vocab) /* the rank's rows of the head: one block, or blocks of loss_vocab_block's rows */
        m->vb = m->lv.vocab_block > 0 && m->lv.vocab_block < V ? m->lv.vocab_block : V;
    m->vtied = m->vb && with_grads && c->tie_embeddings && m->lv.zero_grads && !m->lv.optimizer_in_backward &&
               m->tp <= 1 && m->pp <= 1 && !m->packed && m->gwte == 0 && model_wte_entry(m) >= 0 &&
               !m->table.e[model_wte_entry(m)].frozen &&
               !m->table.e[model_wte_entry(m)].nkeep; /* (its rows all reduced) */
    size_t n = (size_t)(m->nranks > 1 ? m->nranks : 1) * (size_t)B * (size_t)T;
    m->umax = m->vtied ? (int)(n < (size_t)V ? n : (size_t)V) : 0;
    m->nU = 0;
}
