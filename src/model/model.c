/* model.c: layout, initialisation, forward and backward of the transformer (see model.h).
 *
 * One layer implementation serves Llama-family and GPT-2 models: the differences (RMSNorm or LayerNorm, RoPE or
 * learned positions, SwiGLU or GELU, biases) are read from the config, not copied into separate code paths. */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Points the named slots of v at their ranges of the flat buffer `base`. */
static void make_views(const snug_model *m, float *base, const size_t *off, snug_tensors *v) {
    snug_layer_tensors *layers = v->layers;
    memset(v, 0, sizeof *v);
    v->layers = layers;
    memset(layers, 0, (size_t)m->cfg.n_layer * sizeof *layers);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float *x = base + (off ? off[i] : p->offset);
        const char *n = p->name;
        if (p->layer < 0) {
            if (ends_with(n, "embed_tokens.weight") || ends_with(n, "wte.weight"))
                v->wte = x;
            else if (ends_with(n, "wpe.weight"))
                v->wpe = x;
            else if (ends_with(n, "model.norm.weight") || ends_with(n, "ln_f.weight"))
                v->lnf_w = x;
            else if (ends_with(n, "ln_f.bias"))
                v->lnf_b = x;
            else if (ends_with(n, "lm_head.weight"))
                v->lm_head = x;
            continue;
        }
        snug_layer_tensors *L = &layers[p->layer];
        if (ends_with(n, "input_layernorm.weight") || ends_with(n, "ln_1.weight")) L->ln1_w = x;
        else if (ends_with(n, "ln_1.bias")) L->ln1_b = x;
        else if (ends_with(n, "q_proj.weight") || ends_with(n, "c_attn.weight")) L->qkv_w = x;
        else if (ends_with(n, "q_proj.bias") || ends_with(n, "c_attn.bias")) L->qkv_b = x;
        else if (ends_with(n, "o_proj.weight") || ends_with(n, "attn.c_proj.weight")) L->o_w = x;
        else if (ends_with(n, "o_proj.bias") || ends_with(n, "attn.c_proj.bias")) L->o_b = x;
        else if (ends_with(n, "post_attention_layernorm.weight") || ends_with(n, "ln_2.weight")) L->ln2_w = x;
        else if (ends_with(n, "ln_2.bias")) L->ln2_b = x;
        else if (ends_with(n, "gate_proj.weight") || ends_with(n, "c_fc.weight")) L->fc_w = x;
        else if (ends_with(n, "gate_proj.bias") || ends_with(n, "c_fc.bias")) L->fc_b = x;
        else if (ends_with(n, "down_proj.weight") || ends_with(n, "mlp.c_proj.weight")) L->proj_w = x;
        else if (ends_with(n, "down_proj.bias") || ends_with(n, "mlp.c_proj.bias")) L->proj_b = x;
    }
    if (m->cfg.tie_embeddings)
        v->lm_head = v->wte;
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

/* One layer's saved activations from arena `cat`. with_cheap = 0 leaves out what selective checkpointing
 * recomputes (the two norm outputs and the MLP activation). */
static int carve_layer_acts(snug_model *m, snug_arenas *A, snug_category cat, snug_layer_acts *a, size_t N,
                            int with_cheap, snug_error *e) {
    const snug_model_config *c = &m->cfg;
    int C = c->hidden_size, NH = c->n_head, HD = c->head_dim, I = c->intermediate_size;
    int gpt2 = c->arch == SNUG_ARCH_GPT2;
    memset(a, 0, sizeof *a);
    if (with_cheap)
        CARVE(a->ln1, cat, N * C);
    if (gpt2)
        CARVE(a->ln1_mean, cat, N);
    CARVE(a->ln1_rstd, cat, N);
    CARVE(a->qkv, cat, N * m->QKV);
    CARVE(a->att, cat, N * NH * HD);
    if (m->lv.naive_attention)
        CARVE(a->probs, cat, (size_t)m->B * NH * m->T * m->T);
    else
        CARVE(a->lse, cat, N * NH);
    CARVE(a->res_mid, cat, N * C);
    if (with_cheap)
        CARVE(a->ln2, cat, N * C);
    if (gpt2)
        CARVE(a->ln2_mean, cat, N);
    CARVE(a->ln2_rstd, cat, N);
    CARVE(a->fc, cat, N * m->FC);
    if (with_cheap)
        CARVE(a->act, cat, N * I);
    return 0;
}

/* Where each tensor's gradient lives. Normally the flat layout of the parameters. With optimizer_in_backward, the
 * global tensors (embeddings, final norm, untied head) are packed first, then one buffer the size of the largest
 * layer that every layer's gradients share in turn: no full-model gradient buffer exists. */
static int grad_offsets(snug_model *m, snug_error *e) {
    const snug_param_table *t = &m->table;
    free(m->grad_off);
    m->grad_off = malloc((size_t)(t->n ? t->n : 1) * sizeof *m->grad_off);
    if (!m->grad_off)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the gradient layout");
    if (!m->lv.optimizer_in_backward) {
        for (int i = 0; i < t->n; i++)
            m->grad_off[i] = t->e[i].offset;
        m->grads_numel = t->total;
        return 0;
    }
    size_t global = 0, layer_max = 0;
    for (int i = 0; i < t->n; i++)
        if (t->e[i].layer < 0)
            m->grad_off[i] = global, global += t->e[i].numel;
    for (int l = 0; l < m->cfg.n_layer; l++)
        layer_max = t->layer_numel[l] > layer_max ? t->layer_numel[l] : layer_max;
    for (int i = 0; i < t->n; i++)
        if (t->e[i].layer >= 0)
            m->grad_off[i] = global + (t->e[i].offset - t->layer_offset[t->e[i].layer]);
    m->grads_numel = global + layer_max;
    return 0;
}

int snug_model_layout(snug_model *m, snug_arenas *A, int B, int T, int with_grads, snug_error *e) {
    int xent_chunk = m->lv.xent_chunk;
    const snug_model_config *c = &m->cfg;
    int L = c->n_layer, C = c->hidden_size, NH = c->n_head, HD = c->head_dim, V = c->vocab_size;
    int I = c->intermediate_size, gpt2 = c->arch == SNUG_ARCH_GPT2;
    size_t N = (size_t)B * T;
    m->B = B;
    m->T = T;
    m->cur_B = B;
    m->cur_T = T;
    m->QKV = (NH + 2 * c->n_kv_head) * HD;
    m->FC = gpt2 ? I : 2 * I;
    m->xent_chunk = xent_chunk > 0 && (size_t)xent_chunk < N ? xent_chunk : (int)N;

    if (!m->w.layers) {
        m->w.layers = calloc((size_t)L, sizeof *m->w.layers);
        m->g.layers = calloc((size_t)L, sizeof *m->g.layers);
        m->acts = calloc((size_t)L, sizeof *m->acts);
        if (!m->w.layers || !m->g.layers || !m->acts)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory for the model's tensor views");
    }

    CARVE(m->params, SNUG_MEM_PARAMS, m->table.total);
    m->grads = NULL;
    if (with_grads) {
        SNUG_TRY(grad_offsets(m, e));
        CARVE(m->grads, SNUG_MEM_GRADS, m->grads_numel);
    }

    /* saved activations: the residual stream (every layer's input) always; each layer's internals unless
     * checkpointing drops them, in which case they live in one shared recompute set in the workspace */
    CARVE(m->res, SNUG_MEM_ACTS, (size_t)(L + 1) * N * C);
    int any_full = 0;
    for (int l = 0; l < L; l++)
        any_full |= snug_model_layer_full_ckpt(m, l);
    snug_layer_acts shared;
    memset(&shared, 0, sizeof shared);
    if (with_grads && any_full)
        SNUG_TRY(carve_layer_acts(m, A, SNUG_MEM_WORKSPACE, &shared, N, 1, e));
    else if (with_grads && m->lv.ckpt == SNUG_CKPT_SELECTIVE) {
        CARVE(shared.ln1, SNUG_MEM_WORKSPACE, N * C);
        shared.ln2 = shared.ln1; /* recomputed one after the other in backward */
        CARVE(shared.act, SNUG_MEM_WORKSPACE, N * I);
    }
    for (int l = 0; l < L; l++) {
        snug_layer_acts *a = &m->acts[l];
        if (with_grads && snug_model_layer_full_ckpt(m, l)) {
            *a = shared;
            continue;
        }
        SNUG_TRY(carve_layer_acts(m, A, SNUG_MEM_ACTS, a, N, !(with_grads && m->lv.ckpt == SNUG_CKPT_SELECTIVE), e));
        if (with_grads && m->lv.ckpt == SNUG_CKPT_SELECTIVE) {
            a->ln1 = shared.ln1;
            a->ln2 = shared.ln2;
            a->act = shared.act;
        }
    }
    CARVE(m->lnf, SNUG_MEM_ACTS, N * C);
    m->lnf_mean = NULL;
    if (gpt2)
        CARVE(m->lnf_mean, SNUG_MEM_ACTS, N);
    CARVE(m->lnf_rstd, SNUG_MEM_ACTS, N);

    /* workspace: the logits chunk always; activation gradients only for training */
    CARVE(m->logits, SNUG_MEM_WORKSPACE, (size_t)m->xent_chunk * V);
    m->d_res = m->d_ln = m->d_qkv = m->d_att = m->d_fc = m->d_act = NULL;
    if (with_grads) {
        CARVE(m->d_res, SNUG_MEM_WORKSPACE, N * C);
        CARVE(m->d_ln, SNUG_MEM_WORKSPACE, N * C);
        CARVE(m->d_qkv, SNUG_MEM_WORKSPACE, N * m->QKV);
        CARVE(m->d_att, SNUG_MEM_WORKSPACE, N * NH * HD);
        CARVE(m->d_fc, SNUG_MEM_WORKSPACE, N * m->FC);
        CARVE(m->d_act, SNUG_MEM_WORKSPACE, N * I);
    }

    /* data */
    CARVE(m->ids, SNUG_MEM_DATA, N);
    CARVE(m->labels, SNUG_MEM_DATA, N);
    CARVE(m->pos, SNUG_MEM_DATA, N);
    CARVE(m->seg, SNUG_MEM_DATA, N);
    m->rope_cos = m->rope_sin = NULL;
    if (!gpt2) {
        CARVE(m->rope_cos, SNUG_MEM_DATA, (size_t)T * HD / 2);
        CARVE(m->rope_sin, SNUG_MEM_DATA, (size_t)T * HD / 2);
    }

    if (!snug_arena_counting(&A->a[SNUG_MEM_PARAMS])) {
        make_views(m, m->params, NULL, &m->w);
        if (m->grads)
            make_views(m, m->grads, m->grad_off, &m->g);
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

void snug_model_init_rope(snug_model *m) {
    if (!m->rope_cos)
        return;
    int half = m->cfg.head_dim / 2, T = m->T;
    double *inv = malloc((size_t)half * sizeof *inv);
    float *cs = malloc((size_t)T * half * sizeof *cs), *sn = malloc((size_t)T * half * sizeof *sn);
    if (!inv || !cs || !sn)
        abort();
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
}


static double uniform01(uint64_t *s) { return ((snug_splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

void snug_model_init_random(snug_model *m, uint64_t seed) {
    const snug_model_config *c = &m->cfg;
    float std = c->initializer_range > 0 ? c->initializer_range : 0.02f;
    int direct = m->be->host_resident; /* write straight into the parameters when they are host memory */
    float *host = direct ? m->params : malloc(m->table.total * sizeof *host);
    if (!host)
        abort();
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        /* each tensor gets its own stream, so adding a tensor does not change the others */
        uint64_t s = seed * 0x100000001B3ull + (uint64_t)i * 0x9E3779B97F4A7C15ull;
        float *x = host + p->offset;
        int is_norm_w = p->ndim == 1 && (strstr(p->name, "norm") || strstr(p->name, "ln_")) && ends_with(p->name, "weight");
        if (p->ndim == 1) {
            for (size_t k = 0; k < p->numel; k++)
                x[k] = is_norm_w ? 1.0f : 0.0f;
            continue;
        }
        int residual_out = ends_with(p->name, "o_proj.weight") || ends_with(p->name, "down_proj.weight") ||
                           ends_with(p->name, "c_proj.weight");
        double sd = residual_out ? std / sqrt(2.0 * c->n_layer) : std;
        for (size_t k = 0; k < p->numel; k += 2) {
            double u1 = uniform01(&s), u2 = uniform01(&s), r = sqrt(-2.0 * log(u1));
            x[k] = (float)(sd * r * cos(2 * M_PI * u2));
            if (k + 1 < p->numel)
                x[k + 1] = (float)(sd * r * sin(2 * M_PI * u2));
        }
    }
    if (!direct) {
        m->be->to_device(m->be, m->params, host, m->table.total * sizeof *host);
        free(host);
    }
}

void snug_model_set_batch(snug_model *m, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                          const int32_t *seg, int b_used, int t_used) {
    size_t n = (size_t)b_used * t_used * sizeof(int32_t);
    m->cur_B = b_used;
    m->cur_T = t_used;
    m->be->to_device(m->be, m->ids, ids, n);
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

/* One transformer block forward: res[l] -> res[l+1], saving what backward needs in acts[l]. */
static void layer_fwd(snug_model *m, int l) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int Bc = m->cur_B, Tc = m->cur_T, N = Bc * Tc, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
    int HD = c->head_dim, I = c->intermediate_size;
    size_t NC = (size_t)m->B * m->T * C;
    const snug_layer_tensors *w = &m->w.layers[l];
    snug_layer_acts *a = &m->acts[l];
    const float *x = m->res + (size_t)l * NC;
    float *out = m->res + (size_t)(l + 1) * NC;

    norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, N);
    be->matmul_fwd(be, a->qkv, a->ln1, w->qkv_w, w->qkv_b, N, C, m->QKV);
    if (c->arch != SNUG_ARCH_GPT2)
        be->rope_fwd(be, a->qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    if (m->lv.naive_attention)
        be->attention_naive_fwd(be, a->att, a->probs, a->qkv, m->seg_used ? m->seg : NULL, Bc, Tc, NH, NKV, HD,
                                1.0f / sqrtf((float)HD));
    else
        be->attention_fwd(be, a->att, a->lse, a->qkv, m->seg_used ? m->seg : NULL, Bc, Tc, NH, NKV, HD,
                          1.0f / sqrtf((float)HD));
    be->matmul_fwd(be, a->res_mid, a->att, w->o_w, w->o_b, N, NH * HD, C);
    be->accumulate(be, a->res_mid, x, (size_t)N * C);
    norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2_w, w->ln2_b, N);
    be->matmul_fwd(be, a->fc, a->ln2, w->fc_w, w->fc_b, N, C, m->FC);
    if (c->arch == SNUG_ARCH_GPT2)
        be->gelu_fwd(be, a->act, a->fc, (size_t)N * I);
    else
        be->swiglu_fwd(be, a->act, a->fc, N, I);
    be->matmul_fwd(be, out, a->act, w->proj_w, w->proj_b, N, I, C);
    be->accumulate(be, out, a->res_mid, (size_t)N * C);
}

/* One transformer block backward. On entry m->d_res holds dL/d res[l+1]; on exit dL/d res[l]. */
static void layer_bwd(snug_model *m, int l) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int Bc = m->cur_B, Tc = m->cur_T, N = Bc * Tc, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
    int HD = c->head_dim, I = c->intermediate_size;
    size_t NC = (size_t)m->B * m->T * C;
    const snug_layer_tensors *w = &m->w.layers[l];
    snug_layer_tensors *g = &m->g.layers[l];
    const snug_layer_acts *a = &m->acts[l];
    const float *x = m->res + (size_t)l * NC;
    int selective = m->lv.ckpt == SNUG_CKPT_SELECTIVE && !snug_model_layer_full_ckpt(m, l);

    /* checkpointing: full recomputes the whole layer from its saved input into the shared set; selective
     * recomputes the MLP activation and each norm output just before its use (same code, same bits) */
    if (snug_model_layer_full_ckpt(m, l))
        layer_fwd(m, l);
    if (selective) {
        if (c->arch == SNUG_ARCH_GPT2)
            be->gelu_fwd(be, a->act, a->fc, (size_t)N * I);
        else
            be->swiglu_fwd(be, a->act, a->fc, N, I);
        norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2_w, w->ln2_b, N);
    }

    /* MLP: res[l+1] = res_mid + proj(act(fc(norm2(res_mid)))) */
    be->zero(be, m->d_act, (size_t)N * I * sizeof(float));
    be->matmul_bwd(be, m->d_act, g->proj_w, g->proj_b, m->d_res, a->act, w->proj_w, N, I, C);
    be->zero(be, m->d_fc, (size_t)N * m->FC * sizeof(float));
    if (c->arch == SNUG_ARCH_GPT2)
        be->gelu_bwd(be, m->d_fc, m->d_act, a->fc, (size_t)N * I);
    else
        be->swiglu_bwd(be, m->d_fc, m->d_act, a->fc, N, I);
    be->zero(be, m->d_ln, (size_t)N * C * sizeof(float));
    be->matmul_bwd(be, m->d_ln, g->fc_w, g->fc_b, m->d_fc, a->ln2, w->fc_w, N, C, m->FC);
    norm_bwd(m, m->d_res, g->ln2_w, g->ln2_b, m->d_ln, a->res_mid, w->ln2_w, a->ln2_mean, a->ln2_rstd, N);

    /* attention: res_mid = res[l] + o(attn(rope(qkv(norm1(res[l]))))) */
    be->zero(be, m->d_att, (size_t)N * NH * HD * sizeof(float));
    be->matmul_bwd(be, m->d_att, g->o_w, g->o_b, m->d_res, a->att, w->o_w, N, NH * HD, C);
    be->zero(be, m->d_qkv, (size_t)N * m->QKV * sizeof(float));
    if (m->lv.naive_attention)
        be->attention_naive_bwd(be, m->d_qkv, m->d_att, a->qkv, a->probs, Bc, Tc, NH, NKV, HD,
                                1.0f / sqrtf((float)HD));
    else
        be->attention_bwd(be, m->d_qkv, m->d_att, a->qkv, a->att, a->lse, m->seg_used ? m->seg : NULL, Bc, Tc, NH,
                          NKV, HD, 1.0f / sqrtf((float)HD));
    if (c->arch != SNUG_ARCH_GPT2)
        be->rope_bwd(be, m->d_qkv, m->pos, m->rope_cos, m->rope_sin, N, NH + NKV, HD, m->QKV);
    if (selective)
        norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, N);
    be->zero(be, m->d_ln, (size_t)N * C * sizeof(float));
    be->matmul_bwd(be, m->d_ln, g->qkv_w, g->qkv_b, m->d_qkv, a->ln1, w->qkv_w, N, C, m->QKV);
    norm_bwd(m, m->d_res, g->ln1_w, g->ln1_b, m->d_ln, x, w->ln1_w, a->ln1_mean, a->ln1_rstd, N);
}

double snug_model_step(snug_model *m, float grad_scale) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int N = m->cur_B * m->cur_T, C = c->hidden_size, L = c->n_layer;
    size_t NC = (size_t)m->B * m->T * C;
    int train = grad_scale != 0.0f && m->grads;

    be->embed_fwd(be, m->res, m->ids, m->w.wte, N, C, 0);
    if (c->arch == SNUG_ARCH_GPT2)
        be->embed_fwd(be, m->res, m->pos, m->w.wpe, N, C, 1);
    for (int l = 0; l < L; l++)
        layer_fwd(m, l);
    const float *final = m->res + (size_t)L * NC;
    norm_fwd(m, m->lnf, m->lnf_mean, m->lnf_rstd, final, m->w.lnf_w, m->w.lnf_b, N);

    if (!train)
        return be->xent_fwd_bwd(be, NULL, NULL, m->lnf, m->w.lm_head, m->labels, N, C, c->vocab_size, 0.0f,
                                m->logits, m->xent_chunk);

    /* the loss and the gradient of the final hidden states come out of one chunked pass */
    be->zero(be, m->d_ln, (size_t)N * C * sizeof(float));
    double loss = be->xent_fwd_bwd(be, m->d_ln, m->g.lm_head, m->lnf, m->w.lm_head, m->labels, N, C,
                                   c->vocab_size, grad_scale, m->logits, m->xent_chunk);
    be->zero(be, m->d_res, (size_t)N * C * sizeof(float));
    norm_bwd(m, m->d_res, m->g.lnf_w, m->g.lnf_b, m->d_ln, final, m->w.lnf_w, m->lnf_mean, m->lnf_rstd, N);
    for (int l = L - 1; l >= 0; l--) {
        layer_bwd(m, l);
        if (m->on_grads_ready)
            m->on_grads_ready(m->on_grads_ready_ud, l, m->table.layer_offset[l], m->table.layer_numel[l]);
    }
    be->embed_bwd(be, m->g.wte, m->d_res, m->ids, N, C);
    if (c->arch == SNUG_ARCH_GPT2)
        be->embed_bwd(be, m->g.wpe, m->d_res, m->pos, N, C);
    if (m->on_grads_ready)
        m->on_grads_ready(m->on_grads_ready_ud, -1, 0, m->table.total);
    return loss;
}
