/* forward.c: one transformer block forward (norm, q/k/v with RoPE, attention, o, norm, MLP), the norms, and the
 * residual stream and activations kept in 16 bits or offloaded to host memory around the fp32 compute. */
#include "model/model_impl.h"

void model_norm_fwd(const snug_model *m, float *out, float *mean, float *rstd, const float *inp, const float *w,
                    const float *b, int N) {
    snug_backend *be = m->be;
    if (m->blk.norm == SNUG_NORM_LAYER)
        be->layernorm_fwd(be, out, mean, rstd, inp, w, b, N, m->cfg.hidden_size, m->cfg.norm_eps);
    else
        be->rmsnorm_fwd(be, out, rstd, inp, w, N, m->cfg.hidden_size, m->cfg.norm_eps);
}

/* The MLP's activation: act (N, I) from fc (N, FC), GELU's or SwiGLU's (the block's mlp). */
void model_mlp_act(const snug_model *m, float *act, const float *fc, int N) {
    snug_backend *be = m->be;
    int I = m->cfg.intermediate_size;
    if (m->blk.mlp == SNUG_MLP_GELU)
        be->gelu_fwd(be, act, fc, (size_t)N * I);
    else
        be->swiglu_fwd(be, act, fc, N, I);
}

/* 16-bit storage around fp32 compute. keep: round the fp32 result in place to dt and save it (dst may be NULL:
 * a value that is recomputed, not saved); fetch: widen a saved value back. Both do nothing in fp32. */
void model_keep(const snug_model *m, uint16_t *dst, float *src, size_t n) {
    if (is16(m))
        m->be->to16(m->be, dst, src, n, m->lv.dt, 1);
}

void model_fetch(const snug_model *m, float *dst, const uint16_t *src, size_t n) {
    if (is16(m) && src)
        m->be->from16(m->be, dst, src, n, m->lv.dt);
}

/* Layer l's input (and, for l = L, the final output) in fp32: a row of res, or a slot of the two under 16-bit or
 * offloading */
float *model_res_at(const snug_model *m, int l) {
    size_t NC = (size_t)m->B * m->T * m->cfg.hidden_size;
    return m->res + (size_t)(is16(m) || m->res_off ? l % 2 : l) * NC;
}

/* Saves res[l] (just computed in its fp32 slot x, N = cur tokens): rounded to 16 bits into res16, or copied out to
 * host memory when offloading (through the 16-bit staging slot under 16-bit). fp32 without offloading: x is res[l].
 * Offloading never blocks the host: the copy of res[l] runs beside layer l's compute, and the ops queued from here
 * on wait only for the copy of res[l-1] (copy_wait), whose slot layer l overwrites (and, under 16-bit, whose staging
 * slot to16 overwrites next). */
void model_save_res(snug_model *m, int l, float *x, size_t n) {
    snug_backend *be = m->be;
    size_t NC = (size_t)m->B * m->T * m->cfg.hidden_size;
    if (!m->res_off) {
        model_keep(m, m->res16 ? m->res16 + (size_t)l * NC : NULL, x, n);
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
void model_load_res(snug_model *m, int l, float *x, size_t n) {
    snug_backend *be = m->be;
    size_t NC = (size_t)m->B * m->T * m->cfg.hidden_size;
    if (!m->res_off) {
        model_fetch(m, x, m->res16 ? m->res16 + (size_t)l * NC : NULL, n);
        return;
    }
    size_t esz = snug_dtype_size(m->lv.dt);
    const unsigned char *host = (const unsigned char *)m->res_off + (size_t)l * NC * esz;
    be->copy_in_async(be, is16(m) ? (void *)m->res_stage : (void *)x, host, n * esz);
    be->copy_wait(be);
    if (is16(m))
        be->from16(be, x, m->res_stage, n, m->lv.dt);
}

/* The MLP's input half for rows [n0, n0 + ns) of the micro-batch: fc = fc(ln2) (+ adapters) and act = act(fc), into
 * a->fc, a->act (a tiled MLP's shard buffers, or every row); under 16-bit each rounded, and saved where s has a
 * place for it (never for a tiled MLP). */
void model_mlp_in(snug_model *m, int l, const snug_layer_tensors *w, const snug_layer_acts *a,
                  const snug_layer_acts16 *s, int n0, int ns) {
    int C = m->cfg.hidden_size, I = m->cfg.intermediate_size;
    const float *x = a->ln2 + (size_t)n0 * C;
    model_linear_fwd(m, l, SNUG_SITE_FC, a->fc, x, w->fc_w, w->fc_b, ns, n0, C, m->FC);
    model_keep(m, s ? s->fc : NULL, a->fc, (size_t)ns * m->FC);
    model_mlp_act(m, a->act, a->fc, ns);
    model_keep(m, s ? s->act : NULL, a->act, (size_t)ns * I);
}

/* One transformer block forward: res[l] -> res[l+1], saving what backward needs in acts[l] (acts16[l]). As the
 * recomputation of a fully checkpointed layer (recompute = 1) with a tiled MLP it stops at the MLP's input: the
 * MLP's backward recomputes its shards itself, and nothing reads res[l+1] again. */
void model_layer_fwd(snug_model *m, int l, int recompute) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int Bc = m->cur_B, Tc = m->cur_T, N = Bc * Tc, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
    int HD = c->head_dim, I = c->intermediate_size;
    size_t Nn = (size_t)N;
    const snug_layer_tensors *w = model_layer_weights(m, l);
    snug_layer_acts *a = &m->acts[l];
    const snug_layer_acts16 *s = &m->acts16[l];
    const float *x = model_res_at(m, l);
    float *out = model_res_at(m, l + 1);

    model_norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, N);
    model_keep(m, s->ln1, a->ln1, Nn * C);
    model_linear_fwd(m, l, SNUG_SITE_QKV, a->qkv, a->ln1, w->qkv_w, w->qkv_b, N, 0, C, m->QKV);
    if (m->blk.pos == SNUG_POS_ROPE)
        be->rope_fwd(be, a->qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    model_keep(m, s->qkv, a->qkv, Nn * m->QKV);
    if (m->lv.naive_attention)
        be->attention_naive_fwd(be, a->att, a->probs, a->qkv, model_att_first(m, l), Bc, Tc, NH, NKV, HD,
                                1.0f / sqrtf((float)HD));
    else
        be->attention_fwd(be, a->att, a->lse, a->qkv, model_att_first(m, l), Bc, Tc, NH, NKV, HD,
                          1.0f / sqrtf((float)HD));
    model_keep(m, s->att, a->att, Nn * NH * HD);
    model_linear_fwd(m, l, SNUG_SITE_O, a->res_mid, a->att, w->o_w, w->o_b, N, 0, NH * HD, C);
    model_tp_sum(m, a->res_mid, Nn * C);
    be->accumulate(be, a->res_mid, x, Nn * C);
    model_keep(m, s->res_mid, a->res_mid, Nn * C);
    model_norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2_w, w->ln2_b, N);
    model_keep(m, s->ln2, a->ln2, Nn * C);
    /* MLP: a tiled one shard by shard, nothing of it saved (its backward recomputes each shard) */
    if (m->mlp_rows && recompute)
        return;
    int rows = m->mlp_rows ? m->mlp_rows : N;
    for (int n0 = 0; n0 < N; n0 += rows) {
        int ns = N - n0 < rows ? N - n0 : rows;
        model_mlp_in(m, l, w, a, s, n0, ns);
        model_linear_fwd(m, l, SNUG_SITE_PROJ, out + (size_t)n0 * C, a->act, w->proj_w, w->proj_b, ns, n0, I, C);
    }
    model_tp_sum(m, out, Nn * C);
    be->accumulate(be, out, a->res_mid, Nn * C);
    model_save_res(m, l + 1, out, Nn * C);
}
