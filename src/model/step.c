/* step.c: one micro-batch through the model (snug_model_step, snug_model_stage): the embedding, the layers
 * forward, the final norm and the loss, then the layers backward into the embedding; pipeline stages enter and
 * leave in the middle. snug_model_skip_step issues the same collectives for a rank without a micro-batch. */
#include "model/model_impl.h"

void snug_model_skip_step(snug_model *m, int train) {
    int L = m->cfg.n_layer;
    if (m->vtied && (train || m->param_sharded))
        model_lookup_rows(m, 0);
    if (m->param_sharded) {
        m->gglob_ok = 0;
        snug_gather_pair_forget(&m->gpair);
        model_gather_globals(m, GLOB_PRE);
        if (m->vtied)
            model_gather_lookup_rows(m);
        m->gdir = 1;
        for (int l = 0; l < L; l++)
            (void)model_gathered_layer(m, l);
        m->gdir = 0;
        model_gather_globals(m, GLOB_POST);
    } else if (m->q4_sharded) {
        m->gdir = 1;
        for (int l = 0; l < L; l++)
            model_q4_layer(m, l);
        m->gdir = 0;
    }
    if (m->vtied && (train || m->param_sharded)) /* the head's blocks: gathered, and reduced */
        (void)model_loss_blocks(m, NULL, m->lv.dt, NULL, 0, 0.0f, train, 1);
    if (!train)
        return;
    if (m->lv.zero_grads) /* the post-layer globals apart, as snug_model_step announces them */
        model_announce_globals(m, SNUG_READY_POST);
    m->gdir = -1;
    for (int l = L - 1; l >= 0; l--) {
        if (m->param_sharded)
            (void)model_gathered_layer(m, l);
        if (m->q4_sharded)
            model_q4_layer(m, l);
        if (model_hooks(m)->grads_ready)
            model_hooks(m)->grads_ready(m->hooks.ud, l, m->table.layer_offset[l], m->table.layer_numel[l]);
    }
    m->gdir = 0;
    if (m->vtied)
        model_reduce_lookup_rows(m, 0, 1);
    model_announce_globals(m, -1);
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
        model_lookup_rows(m, N);
    if (m->param_sharded) { /* the parameters may have changed since the last step: gather afresh */
        m->gglob_ok = 0;
        snug_gather_pair_forget(&m->gpair);
        model_gather_globals(m, GLOB_PRE);
        if (m->vtied)
            model_gather_lookup_rows(m);
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
    float *x0 = model_res_at(m, 0);
    if (!snug_pp_first(m)) { /* a later pipeline stage: the previous stage's output */
        be->copy(be, x0, in, (size_t)N * C * sizeof(float));
    } else {
        be->embed_fwd(be, x0, ids, wte, wdt, N, C, 0);
        if (m->tp_vocab) /* each rank looked up the ids in its rows */
            model_tp_sum(m, x0, (size_t)N * C);
        if (m->blk.pos == SNUG_POS_LEARNED)
            be->embed_fwd(be, x0, m->pos, snug_model_stored(m, m->gwpe), dt, N, C, 1);
        if (train && m->neftune_alpha > 0) /* NEFTune (transformers' neftune_post_forward_hook): the sequence length
                                            * times the width, of the micro-batch as it is padded or packed */
            be->add_noise(be, x0, (size_t)N * C, m->neftune_alpha / sqrtf((float)m->cur_T * (float)C),
                          m->lora.seed ^ 0x6e656674756e65ull);
    }
    model_save_res(m, 0, x0, (size_t)N * C);
    m->gdir = 1; /* ZeRO-3 prefetches the next layer */
    for (int l = 0; l < L; l++)
        model_layer_fwd(m, l, 0);
    m->gdir = 0;
    if (!snug_pp_last(m)) { /* an earlier pipeline stage: its output, or backward from its gradient */
        if (!dout) {
            be->copy(be, m->pp_out, model_res_at(m, L), (size_t)N * C * sizeof(float));
            return 0;
        }
        be->copy(be, m->d_res, dout, (size_t)N * C * sizeof(float));
        return stage_bwd(m, ids, 0);
    }
    model_gather_globals(m, GLOB_POST); /* ZeRO-3: the final norm and the head again (the layers took their buffer) */
    if (is16(m)) { /* the final norm's parameters widened (lnf_b exists for LayerNorm only) */
        be->from16(be, m->lnf_ws, snug_model_stored(m, m->glnf_w), (size_t)C, dt);
        lnf_w = m->lnf_ws;
        lnf_b = NULL;
        if (m->glnf_b != (size_t)-1) {
            be->from16(be, m->lnf_ws + C, snug_model_stored(m, m->glnf_b), (size_t)C, dt);
            lnf_b = m->lnf_ws + C;
        }
    }
    float *final = model_res_at(m, L);
    model_norm_fwd(m, m->lnf, m->lnf_mean, m->lnf_rstd, final, lnf_w, lnf_b, N);

    if (!train)
        return m->vb ? model_loss_blocks(m, head, hdt, NULL, N, 0.0f, 0, 0)
                     : be->xent_fwd_bwd(be, NULL, NULL, m->lnf, head, hdt, m->labels, N, C, c->vocab_size, 0.0f,
                                        m->logits, m->xent_chunk, m->w_ws, m->wblock);

    /* the loss and the gradient of the final hidden states come out of one chunked pass (or two over the head's
     * blocks of rows) */
    be->zero(be, m->d_ln, (size_t)N * C * sizeof(float));
    double loss = m->vb ? model_loss_blocks(m, head, hdt, dhead, N, grad_scale, 1, 0)
                        : be->xent_fwd_bwd(be, m->d_ln, dhead, m->lnf, head, hdt, m->labels, N, C, c->vocab_size,
                                           grad_scale, m->logits, m->xent_chunk, m->w_ws, m->wblock);
    if (m->tp_vocab) /* each rank's rows of the head gave their part */
        model_tp_sum(m, m->d_ln, (size_t)N * C);
    be->zero(be, m->d_res, (size_t)N * C * sizeof(float));
    model_norm_bwd(m, m->d_res, m->g.lnf_w, m->g.lnf_b, m->d_ln, final, lnf_w, m->lnf_mean, m->lnf_rstd, N);
    if (m->lv.zero_grads) /* the final norm and an untied head are complete: their buffer is the layers' next */
        model_announce_globals(m, SNUG_READY_POST);
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
        model_layer_bwd(m, l);
        model_mask_frozen(m, l);
        if (model_hooks(m)->grads_ready)
            model_hooks(m)->grads_ready(m->hooks.ud, l, m->table.layer_offset[l], m->table.layer_numel[l]);
    }
    m->gdir = 0;
    if (!snug_pp_first(m)) /* the input's gradient, for the previous stage */
        be->copy(be, m->pp_din, m->d_res, (size_t)N * C * sizeof(float));
    else if (m->vtied) /* the looked-up rows, with the head's part of their gradient */
        model_reduce_lookup_rows(m, N, 0);
    else if (m->g.wte) /* a frozen base (LoRA) has no embedding gradient */
        be->embed_bwd(be, m->g.wte, m->d_res, ids, N, C);
    else if (lo->on && lo->emb_off != (size_t)-1 && lo->grads) /* unless lora_modules_to_save trains its copy */
        be->embed_bwd(be, lo->grads + lo->emb_off, m->d_res, m->ids, N, C);
    if (m->blk.pos == SNUG_POS_LEARNED && m->g.wpe && snug_pp_first(m))
        be->embed_bwd(be, m->g.wpe, m->d_res, m->pos, N, C);
    model_announce_globals(m, -1);
    return loss;
}
