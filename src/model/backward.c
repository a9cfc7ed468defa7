/* backward.c: one transformer block backward, recomputing what checkpointing dropped, with each gradient where
 * grad_offsets put it (rounded to 16 bits at the end of the layer). */
#include "model/model_impl.h"

void model_norm_bwd(const snug_model *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                    const float *w, const float *mean, const float *rstd, int N) {
    snug_backend *be = m->be;
    if (m->blk.norm == SNUG_NORM_LAYER)
        be->layernorm_bwd(be, dinp, dw, db, dout, inp, w, mean, rstd, N, m->cfg.hidden_size);
    else
        be->rmsnorm_bwd(be, dinp, dw, dout, inp, w, rstd, N, m->cfg.hidden_size);
}

/* One transformer block backward. On entry m->d_res holds dL/d res[l+1]; on exit dL/d res[l]. */
void model_layer_bwd(snug_model *m, int l) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    const snug_block blk = m->blk;
    int Bc = m->cur_B, Tc = m->cur_T, N = Bc * Tc, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
    int HD = c->head_dim, I = c->intermediate_size;
    size_t Nn = (size_t)N;
    const snug_layer_acts *a = &m->acts[l];
    const snug_layer_acts16 *s = &m->acts16[l];
    float *x = model_res_at(m, l);
    int full = snug_model_layer_full_ckpt(m, l);
    int selective = m->lv.ckpt == SNUG_CKPT_SELECTIVE && !full;

    /* 16-bit: the layer's input and saved activations come back into the fp32 set (a full checkpoint's
     * recomputation refills it instead) */
    model_load_res(m, l, x, Nn * C);
    if (!full) {
        model_fetch(m, a->ln1, s->ln1, Nn * C);
        model_fetch(m, a->qkv, s->qkv, Nn * m->QKV);
        model_fetch(m, a->att, s->att, Nn * NH * HD);
        model_fetch(m, a->res_mid, s->res_mid, Nn * C);
        model_fetch(m, a->ln2, s->ln2, Nn * C);
        model_fetch(m, a->fc, s->fc, Nn * m->FC);
        model_fetch(m, a->act, s->act, Nn * I);
    }
    /* checkpointing: full recomputes the whole layer from its saved input into the shared set; selective
     * recomputes the MLP activation and each norm output just before its use (same code, same bits) */
    if (full)
        model_layer_fwd(m, l, 1);
    const snug_layer_tensors *w = model_layer_weights(m, l);
    snug_layer_tensors *g = &m->g.layers[l];
    if (m->grads16) { /* 16-bit gradients: this layer's are summed in fp32 in gl, then rounded once */
        be->zero(be, m->gl, m->table.layer_numel[l] * sizeof(float));
        g = &m->gl_t;
    }
    snug_layer_tensors live; /* unfrozen_parameters: no gradient computed for a frozen tensor */
    if (m->frozen_any) {
        live = *g;
        model_drop_frozen(m, l, &live, NULL);
        g = &live;
    }
    if (selective && !m->mlp_rows) {
        model_mlp_act(m, a->act, a->fc, N);
        model_keep(m, NULL, a->act, Nn * I);
    }
    if (selective) {
        model_norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2_w, w->ln2_b, N);
        model_keep(m, NULL, a->ln2, Nn * C);
    }

    /* MLP: res[l+1] = res_mid + proj(act(fc(norm2(res_mid)))); a tiled MLP shard by shard, each shard's input half
     * recomputed first (one shard of every row otherwise, from what forward saved) */
    be->zero(be, m->d_ln, Nn * C * sizeof(float));
    int rows = m->mlp_rows ? m->mlp_rows : N;
    for (int n0 = 0; n0 < N; n0 += rows) {
        int ns = N - n0 < rows ? N - n0 : rows;
        size_t nsI = (size_t)ns * I, o = (size_t)n0 * C;
        if (m->mlp_rows)
            model_mlp_in(m, l, w, a, NULL, n0, ns);
        be->zero(be, m->d_act, nsI * sizeof(float));
        model_linear_bwd(m, l, SNUG_SITE_PROJ, m->d_act, g->proj_w, g->proj_b, m->d_res + o, a->act, w->proj_w, ns, n0,
                         I, C, NULL, NULL);
        be->zero(be, m->d_fc, (size_t)ns * m->FC * sizeof(float));
        if (blk.mlp == SNUG_MLP_GELU)
            be->gelu_bwd(be, m->d_fc, m->d_act, a->fc, nsI);
        else
            be->swiglu_bwd(be, m->d_fc, m->d_act, a->fc, ns, I);
        model_linear_bwd(m, l, SNUG_SITE_FC, m->d_ln + o, g->fc_w, g->fc_b, m->d_fc, a->ln2 + o, w->fc_w, ns, n0, C,
                         m->FC, a->fc, w->fc_b);
    }
    model_tp_sum(m, m->d_ln, Nn * C);
    model_norm_bwd(m, m->d_res, g->ln2_w, g->ln2_b, m->d_ln, a->res_mid, w->ln2_w, a->ln2_mean, a->ln2_rstd, N);

    /* attention: res_mid = res[l] + o(attn(rope(qkv(norm1(res[l]))))) */
    be->zero(be, m->d_att, Nn * NH * HD * sizeof(float));
    model_linear_bwd(m, l, SNUG_SITE_O, m->d_att, g->o_w, g->o_b, m->d_res, a->att, w->o_w, N, 0, NH * HD, C, NULL,
                     NULL);
    be->zero(be, m->d_qkv, Nn * m->QKV * sizeof(float));
    if (m->lv.naive_attention)
        be->attention_naive_bwd(be, m->d_qkv, m->d_att, a->qkv, a->probs, Bc, Tc, NH, NKV, HD,
                                1.0f / sqrtf((float)HD));
    else
        be->attention_bwd(be, m->d_qkv, m->d_att, a->qkv, a->att, a->lse, model_att_first(m, l), Bc, Tc, NH,
                          NKV, HD, 1.0f / sqrtf((float)HD));
    if (blk.pos == SNUG_POS_ROPE)
        be->rope_bwd(be, m->d_qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    if (selective) {
        model_norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, N);
        model_keep(m, NULL, a->ln1, Nn * C);
    }
    /* a frozen embedding (LoRA) takes no gradient, so the first layer's input gradient is never read */
    int need_dx = l > 0 || !snug_pp_first(m) || m->g.wte || m->g.wpe || g->ln1_w ||
                  (m->lora.on && m->lora.emb_off != (size_t)-1); /* (a later pipeline stage sends it back) */
    if (need_dx)
        be->zero(be, m->d_ln, Nn * C * sizeof(float));
    /* DoRA reads q/k/v's output as its GEMM left it: the rotation undone in place (attention's backward, the last
     * reader of the rotated values, is done) */
    if (m->lora.dora && m->lora.table.layer_numel[l] && blk.pos == SNUG_POS_ROPE)
        be->rope_bwd(be, a->qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    model_linear_bwd(m, l, SNUG_SITE_QKV, need_dx ? m->d_ln : NULL, g->qkv_w, g->qkv_b, m->d_qkv, a->ln1, w->qkv_w, N,
                     0, C, m->QKV, a->qkv, w->qkv_b);
    if (need_dx) {
        model_tp_sum(m, m->d_ln, Nn * C);
        model_norm_bwd(m, m->d_res, g->ln1_w, g->ln1_b, m->d_ln, x, w->ln1_w, a->ln1_mean, a->ln1_rstd, N);
    }
    if (m->grads16 && m->frozen_any) { /* tensor by tensor where model_grad_offsets put them (none for a frozen one) */
        for (int i = 0; i < m->table.n; i++)
            if (m->table.e[i].layer == l && m->grad_off[i] != NO_GRAD)
                be->to16(be, m->grads16 + m->grad_off[i], m->gl + (m->table.e[i].offset - m->table.layer_offset[l]),
                         m->table.e[i].numel, m->lv.dt, 0);
    } else if (m->grads16) { /* where model_grad_offsets put layer l: its place among the layers, or the one
                              * shared buffer */
        size_t o16 = m->lv.optimizer_in_backward || m->lv.zero_grads ? 0
                                                                      : m->table.layer_offset[l] - m->table.layer_offset[0];
        be->to16(be, m->grads16 + o16, m->gl, m->table.layer_numel[l], m->lv.dt, 0);
    }
}
