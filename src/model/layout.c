/* layout.c: the model's memory carved from the arenas (snug_model_layout) in one pass that the plan runs on
 * counting arenas and the engine on real ones: parameters and their gather region, adapters, gradients, the 16-bit
 * workspaces, saved activations (acts.c), the loss, backward's workspace, pipeline buffers and the micro-batch's
 * data; then the views into them. Each part is carved in this order on every run. */
#include "model/model_impl.h"

void snug_model_free_host(snug_model *m) {
    snug_param_table_free(&m->table);
    snug_lora_free(&m->lora);
    free(m->w.layers);
    free(m->g.layers);
    model_free_act_sets(m);
    free(m->acts);
    free(m->acts16);
    free(m->grad_off);
    free(m->soff);
    free(m->q4);
    free(m->q4_block);
    free(m->q4_site);
    model_q4_spans_free(m);
    m->q4_site = NULL;
    m->w.layers = m->g.layers = NULL;
    m->acts = NULL;
    m->acts16 = NULL;
    m->grad_off = m->soff = NULL;
    m->q4 = NULL;
    m->q4_block = NULL;
}

/* The micro-batch shape the activations are laid out for, the derived widths, and tiled_mlp's rows per shard. */
static void layout_dims(snug_model *m, int B, int T) {
    int xent_chunk = m->lv.xent_chunk;
    const snug_model_config *c = &m->cfg;
    int C = c->hidden_size, NH = c->n_head, HD = c->head_dim;
    int I = c->intermediate_size, gelu = snug_block_of(c).mlp == SNUG_MLP_GELU;
    size_t N = (size_t)B * T;
    m->B = B;
    m->T = T;
    m->cur_B = B;
    m->cur_T = T;
    m->QKV = (NH + 2 * c->n_kv_head) * HD;
    m->FC = gelu ? I : 2 * I;
    m->xent_chunk = xent_chunk > 0 && (size_t)xent_chunk < N ? xent_chunk : (int)N;
    m->mlp_rows = 0;
    if (m->lv.mlp_shards) { /* tiled_mlp: shards of ceil(N / k) tokens */
        size_t k = m->lv.mlp_shards > 0 ? (size_t)m->lv.mlp_shards : (N + (size_t)C - 1) / (size_t)C;
        k = k < 1 ? 1 : k > N ? N : k;
        m->mlp_rows = (int)((N + k - 1) / k);
    }
}

/* The host arrays of per-layer views (allocated once, kept when laid out again). */
static int layout_view_arrays(snug_model *m, snug_error *e) {
    int L = m->cfg.n_layer;
    if (!m->w.layers) {
        m->w.layers = calloc((size_t)L, sizeof *m->w.layers);
        m->g.layers = calloc((size_t)L, sizeof *m->g.layers);
        m->acts = calloc((size_t)L, sizeof *m->acts);
        m->acts16 = calloc((size_t)L, sizeof *m->acts16);
        if (!m->w.layers || !m->g.layers || !m->acts || !m->acts16)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory for the model's tensor views");
    }
    return 0;
}

/* ZeRO-3: one gather region in SNUG_MEM_PARAMS for a layer pair or the globals (see snug_model.param_sharded). */
static int layout_gather_region(snug_model *m, snug_arenas *A, snug_error *e) {
    int L = m->cfg.n_layer, C = m->cfg.hidden_size;
    size_t es = snug_dtype_size(m->lv.dt), lay = (model_largest_layer(m) + 31) / 32 * 32; /* buffer 1 aligned */
    m->gpre_n = L > 0 ? m->table.layer_offset[0] : m->table.total;
    m->gpost_n = L > 0 ? m->table.total - (m->table.layer_offset[L - 1] + m->table.layer_numel[L - 1]) : 0;
    /* an untied model reads the pre-layer globals at the embedding and the post-layer ones at the loss: one set
     * at a time, each from the region's start (gsplit); a tied head is the embedding, so the loss reads both */
    m->gsplit = !m->cfg.tie_embeddings;
    /* split by rows (vtied), the embedding is no gathered global: the loss gathers one block of its rows at a
     * time after the others (the final norm, GPT-2's positions), and the lookup only the rows it reads */
    m->gpre_lo = m->vtied ? m->table.e[model_wte_entry(m)].numel : 0;
    size_t pre = m->gpre_n - m->gpre_lo;
    m->gglob_n = m->gsplit ? (pre > m->gpost_n ? pre : m->gpost_n) : pre + m->gpost_n;
    size_t rows = (size_t)(m->vb > m->umax ? m->vb : m->umax); /* a block of the head, or the looked-up rows */
    size_t need = m->vtied ? model_head_block_at(m) + rows * C : m->gglob_n;
    size_t region = need > 2 * lay ? need : 2 * lay;
    m->gbuf_n = lay;
    m->gregion_n = region;
    char *g = snug_arena_alloc(&A->a[SNUG_MEM_PARAMS], (region ? region : 1) * es, e);
    if (!g)
        return e ? e->code : SNUG_ENOMEM;
    m->gglob = m->gpair.buf[0] = g;
    m->gpair.buf[1] = g + lay * es;
    /* vtied: the lookup's rows where the loss's block goes later (the layers come between) */
    m->urows = m->vtied ? g + model_head_block_at(m) * es : NULL;
    return 0;
}

/* The stored parameters: fp32, or 16-bit (with QLoRA's 4-bit blocks or their ZeRO-3 pieces) and an optional fp32
 * master copy; the rank's shard and the gather region under ZeRO-3. */
static int layout_params(snug_model *m, snug_arenas *A, snug_error *e) {
    int half = is16(m);
    /* parameters: fp32, or 16-bit with an optional fp32 master copy */
    m->params = NULL;
    m->params16 = NULL;
    m->emb16 = NULL;
    m->gpair.buf[0] = m->gpair.buf[1] = m->gglob = NULL;
    snug_gather_pair_forget(&m->gpair);
    m->gglob_ok = 0;
    m->gpre_n = m->gpost_n = m->gbuf_n = m->gregion_n = 0;
    m->gsplit = 0;
    m->gglob_n = 0;
    m->gpre_lo = 0;
    m->urows = NULL;
    /* the stored base: the device's, or with offload_params (a sharded frozen base) host memory */
    snug_category base_at = m->param_sharded && m->lv.offload_params ? SNUG_MEM_OFFLOAD : SNUG_MEM_PARAMS;
    if (m->param_sharded) /* ZeRO-3: the rank's shard, and one gather region for a layer pair or the globals */
        SNUG_TRY(layout_gather_region(m, A, e));
    if (half) {
        CARVE(m->params16, base_at, m->param_sharded ? (m->pshard_n ? m->pshard_n : 1) : m->dense_total);
        if (m->emb_entry >= 0) /* offload_embedding: the frozen table in host memory */
            CARVE(m->emb16, SNUG_MEM_OFFLOAD, m->table.e[m->emb_entry].numel);
        if (m->lv.master_weights)
            CARVE(m->params, SNUG_MEM_MASTER, m->master_sharded ? m->master_n : m->table.total);
        m->q4_shard = NULL;
        m->q4pair.buf[0] = m->q4pair.buf[1] = NULL;
        snug_gather_pair_forget(&m->q4pair);
        m->q4pair.prefetched = 0;
        if (m->q4 && m->q4_sharded) { /* the rank's pieces (ZeRO-3; in host memory with offload_params), and two
                                       * buffers a layer's span is gathered into */
            snug_category at = m->lv.offload_params ? SNUG_MEM_OFFLOAD : SNUG_MEM_PARAMS;
            char *qb = NULL;
            if (!(m->q4_shard = snug_arena_alloc(&A->a[at], m->q4_shard_n ? m->q4_shard_n : 1, e)) ||
                !(qb = snug_arena_alloc(&A->a[SNUG_MEM_PARAMS], 2 * (m->q4_gbuf_n ? m->q4_gbuf_n : 1), e)))
                return e ? e->code : SNUG_ENOMEM;
            m->q4pair.buf[0] = qb;
            m->q4pair.buf[1] = qb + m->q4_gbuf_n;
            for (int i = 0; i < m->table.n; i++) /* valid until the layer is first gathered */
                if (m->q4[i].n)
                    snug_q4_carve(&m->q4[i], qb + m->q4_rel[i]);
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
    return 0;
}

/* LoRA: the adapters (fp32) and their gradients, the adapters' workspace, and DoRA's norms and chunks. */
static int layout_lora(snug_model *m, snug_arenas *A, size_t N, int with_grads, snug_error *e) {
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
                size_t qi = q->n ? unit / model_gcd_size((size_t)q->shape[1], unit) : 1;
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
    return 0;
}

/* 16-bit: the fp32 workspaces a layer's weights (and gradients) are widened into, QLoRA's dequantized chunk, the
 * final norm's parameters and the head's rows. */
static int layout_widen(snug_model *m, snug_arenas *A, size_t N, snug_error *e) {
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size, half = is16(m);
    /* 16-bit: the current layer's weights (and gradients) widened to fp32, the final norm, the head's rows */
    m->wl = m->gl = m->lnf_ws = m->w_ws = NULL;
    m->wblock = 0;
    m->wq = m->ones = NULL;
    m->wq_n = m->wl_n = 0;
    if (half) {
        m->wl_n = m->q4 ? model_largest_dense_layer(m) : model_largest_layer(m);
        CARVE(m->wl, SNUG_MEM_WORKSPACE, m->wl_n ? m->wl_n : 1);
        for (int i = 0; m->q4 && i < m->table.n; i++)
            if (m->q4[i].n) {
                size_t k = (size_t)m->q4_site[i].chunk_rows * (size_t)m->q4[i].shape[1];
                m->wq_n = k > m->wq_n ? k : m->wq_n;
            }
        if (m->wq_n)
            CARVE(m->wq, SNUG_MEM_WORKSPACE, m->wq_n);
        if (m->q4 && model_layer_has_bias(m))
            CARVE(m->ones, SNUG_MEM_WORKSPACE, N);
        if (m->grads16)
            CARVE(m->gl, SNUG_MEM_WORKSPACE, model_largest_layer(m));
        CARVE(m->lnf_ws, SNUG_MEM_WORKSPACE, 2 * (size_t)C);
        m->wblock = V < 1024 ? V : 1024;
        CARVE(m->w_ws, SNUG_MEM_WORKSPACE, (size_t)m->wblock * C);
    }
    return 0;
}

/* The last pipeline stage's final norm and loss: the norm's output and statistics, the logits chunk, and
 * loss_vocab_block's running statistics. */
static int layout_loss(snug_model *m, snug_arenas *A, size_t N, snug_error *e) {
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size, ln = m->blk.norm == SNUG_NORM_LAYER;
    m->lnf = m->lnf_mean = m->lnf_rstd = m->logits = NULL;
    m->st_max = m->st_zy = NULL;
    m->st_sum = NULL;
    if (snug_pp_last(m)) { /* the final norm and the loss: the last pipeline stage's */
        CARVE(m->lnf, SNUG_MEM_ACTS, N * C);
        if (ln)
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
    return 0;
}

/* Training's activation gradients (one layer's, shared by all) and what crosses to the neighbouring pipeline
 * stages. */
static int layout_backward(snug_model *m, snug_arenas *A, size_t N, int with_grads, snug_error *e) {
    const snug_model_config *c = &m->cfg;
    int C = c->hidden_size, NH = c->n_head, HD = c->head_dim, I = c->intermediate_size;
    size_t NM = m->mlp_rows ? (size_t)m->mlp_rows : N; /* rows of the MLP's fc, act and their gradients */
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
    return 0;
}

/* The micro-batch's data: ids, labels, positions, segments; tensor parallelism's and vtied's ids; the RoPE tables. */
static int layout_data(snug_model *m, snug_arenas *A, size_t N, int T, snug_error *e) {
    int C = m->cfg.hidden_size, HD = m->cfg.head_dim, rope = m->blk.pos == SNUG_POS_ROPE;
    CARVE(m->ids, SNUG_MEM_DATA, N);
    CARVE(m->labels, SNUG_MEM_DATA, N);
    CARVE(m->pos, SNUG_MEM_DATA, N);
    CARVE(m->seg, SNUG_MEM_DATA, N);
    m->win = NULL;
    if (m->cfg.sliding_window > 0)
        CARVE(m->win, SNUG_MEM_DATA, N);
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
    if (rope) {
        CARVE(m->rope_cos, SNUG_MEM_DATA, (size_t)T * HD / 2);
        CARVE(m->rope_sin, SNUG_MEM_DATA, (size_t)T * HD / 2);
    }
    return 0;
}

/* The views into what was carved (none while the plan counts): parameters, ZeRO-3's gathered globals and layer
 * buffers, gradients (less the frozen ones), and the 16-bit workspaces. */
static int layout_views(snug_model *m, snug_arenas *A, size_t N, snug_error *e) {
    int half = is16(m);
    if (!snug_arena_counting(&A->a[SNUG_MEM_PARAMS])) {
        if (m->params && !m->master_sharded && !m->param_sharded)
            model_make_views(m, m->params, NULL, 0, &m->w);
        if (m->param_sharded && !half) { /* fp32 ZeRO-3: the globals' views into gglob, the layers' per buffer */
            size_t *off = malloc((size_t)m->table.n * sizeof *off);
            if (!off)
                return snug_fail(e, SNUG_ENOMEM, "out of host memory");
            for (int i = 0; i < m->table.n; i++)
                off[i] = m->table.e[i].layer < 0 && m->table.e[i].offset >= m->gpre_lo
                             ? model_gglob_at(m, m->table.e[i].offset)
                             : 0; /* vtied: no view of the embedding */
            model_make_views(m, m->gglob, off, 1, &m->w);
            free(off);
            model_layer_views(m, m->gpair.buf[0], &m->gbuf_t[0]);
            model_layer_views(m, m->gpair.buf[1], &m->gbuf_t[1]);
        }
        if (m->grads)
            model_make_views(m, m->grads, m->grad_off, m->grads16 != NULL, &m->g);
        m->frozen_any = 0;
        for (int i = 0; i < m->table.n; i++)
            m->frozen_any |= m->table.e[i].frozen || m->table.e[i].nkeep;
        if (m->grads && m->frozen_any)
            model_drop_frozen(m, -1, NULL, &m->g);
        if (m->wl && m->q4)
            model_dense_layer_views(m, m->wl, &m->wl_t);
        else if (m->wl)
            model_layer_views(m, m->wl, &m->wl_t);
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
            model_layer_views(m, m->gl, &m->gl_t);
    }
    return 0;
}

int snug_model_layout(snug_model *m, snug_arenas *A, int B, int T, int with_grads, snug_error *e) {
    size_t N = (size_t)B * T;
    layout_dims(m, B, T);
    m->wl_layer = -1;
    SNUG_TRY(model_storage_layout(m, e));
    model_global_offsets(m);
    model_vocab_blocks(m, B, T, with_grads);
    SNUG_TRY(layout_view_arrays(m, e));
    SNUG_TRY(layout_params(m, A, e));
    m->grads = NULL;
    m->grads16 = NULL;
    SNUG_TRY(layout_lora(m, A, N, with_grads, e));
    if (with_grads && !m->lora.on) {
        SNUG_TRY(model_grad_offsets(m, e));
        if (m->grads_numel)
            CARVE(m->grads, SNUG_MEM_GRADS, m->grads_numel);
        if (m->grads16_numel)
            CARVE(m->grads16, SNUG_MEM_GRADS, m->grads16_numel);
    }
    SNUG_TRY(layout_widen(m, A, N, e));
    SNUG_TRY(model_layout_acts(m, A, N, with_grads, e));
    SNUG_TRY(layout_loss(m, A, N, e));
    SNUG_TRY(layout_backward(m, A, N, with_grads, e));
    SNUG_TRY(layout_data(m, A, N, T, e));
    return layout_views(m, A, N, e);
}
