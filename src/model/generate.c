/* generate.c: token-by-token decoding with a KV cache (see generate.h).
 *
 * Position p of the prompt or of the generated text runs through every layer as a single row: the norms and the
 * linear layers (with their adapters) are the training forward's with N = 1, and the row's attention (the
 * attention_decode op) reads the roped keys and values that earlier positions left in the layer's saved qkv buffer. */
#include "model/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/model_impl.h"


/* Runs position p (token already in ids[p]) through the model; leaves its logits in m->logits row 0. The norms and
 * the linear layers with their adapters are the training forward's (model_norm_fwd, model_linear_fwd); attention
 * reads the cached keys and values of the positions before (attention_decode), one row at a time. */
static void forward_row(snug_model *m, int p) {
    snug_backend *be = m->be;
    const snug_model_config *c = &m->cfg;
    int C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, HD = c->head_dim, I = c->intermediate_size;
    const snug_block blk = snug_block_of(c);
    int ln = blk.norm == SNUG_NORM_LAYER; /* LayerNorm: its mean kept too */
    size_t NC = (size_t)m->T * C;
    float *x = m->res + (size_t)p * C;
    const snug_lora *lo = &m->lora; /* lora_modules_to_save: the adapter's trained copies */
    const float *wte = lo->on && lo->emb_off != (size_t)-1 ? lo->params + lo->emb_off : m->w.wte;
    const float *head = lo->on && lo->head_off != (size_t)-1 ? lo->params + lo->head_off : m->w.lm_head;
    be->embed_fwd(be, x, m->ids + p, wte, SNUG_DT_F32, 1, C, 0);
    if (blk.pos == SNUG_POS_LEARNED)
        be->embed_fwd(be, x, m->pos + p, m->w.wpe, SNUG_DT_F32, 1, C, 1);
    for (int l = 0; l < c->n_layer; l++) {
        const snug_layer_tensors *w = &m->w.layers[l];
        snug_layer_acts *a = &m->acts[l];
        float *in = m->res + (size_t)l * NC + (size_t)p * C, *out = in + NC;
        float *ln1 = a->ln1 + (size_t)p * C, *qkv = a->qkv + (size_t)p * m->QKV, *att = a->att + (size_t)p * NH * HD;
        float *mid = a->res_mid + (size_t)p * C, *ln2 = a->ln2 + (size_t)p * C;
        float *fc = a->fc + (size_t)p * m->FC, *act = a->act + (size_t)p * I;
        model_norm_fwd(m, ln1, ln ? a->ln1_mean + p : NULL, a->ln1_rstd + p, in, w->ln1_w, w->ln1_b, 1);
        model_linear_fwd(m, l, SNUG_SITE_QKV, qkv, ln1, w->qkv_w, w->qkv_b, 1, 0, C, m->QKV);
        if (blk.pos == SNUG_POS_ROPE)
            be->rope_fwd(be, qkv, m->pos + p, m->rope_cos, m->rope_sin, 1, NH + NKV, HD, m->QKV);
        int W = snug_layer_window(c, l), k0 = W > 0 && p - W + 1 > 0 ? p - W + 1 : 0; /* the first key it sees */
        be->attention_decode(be, att, a->qkv + (size_t)k0 * m->QKV, p - k0, NH, NKV, HD, 1.0f / sqrtf((float)HD));
        model_linear_fwd(m, l, SNUG_SITE_O, mid, att, w->o_w, w->o_b, 1, 0, NH * HD, C);
        be->accumulate(be, mid, in, (size_t)C);
        model_norm_fwd(m, ln2, ln ? a->ln2_mean + p : NULL, a->ln2_rstd + p, mid, w->ln2_w, w->ln2_b, 1);
        model_linear_fwd(m, l, SNUG_SITE_FC, fc, ln2, w->fc_w, w->fc_b, 1, 0, C, m->FC);
        model_mlp_act(m, act, fc, 1);
        model_linear_fwd(m, l, SNUG_SITE_PROJ, out, act, w->proj_w, w->proj_b, 1, 0, I, C);
        be->accumulate(be, out, mid, (size_t)C);
    }
    float *final = m->res + (size_t)c->n_layer * NC + (size_t)p * C, *lnf = m->lnf + (size_t)p * C;
    model_norm_fwd(m, lnf, ln ? m->lnf_mean + p : NULL, m->lnf_rstd + p, final, m->w.lnf_w, m->w.lnf_b, 1);
    be->matmul_fwd(be, m->logits, lnf, head, NULL, 1, C, c->vocab_size);
}


typedef struct cand {
    float p;
    int id;
} cand;

static int by_prob_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return (x < y) - (x > y);
}

static int sample(const float *logits, int V, const snug_sampling *s, uint64_t *rng, cand *cs) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (s->temperature <= 0)
        return best;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        cs[i].id = i;
        cs[i].p = expf((logits[i] - logits[best]) / s->temperature);
        sum += cs[i].p;
    }
    qsort(cs, (size_t)V, sizeof *cs, by_prob_desc);
    int n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double kept = 0;
    int keep = 0;
    while (keep < n) {
        kept += cs[keep].p;
        keep++;
        if (s->top_p < 1.0f && kept / sum >= s->top_p)
            break;
    }
    double r = (double)(snug_splitmix64(rng) >> 11) / 9007199254740992.0 * kept;
    for (int i = 0; i < keep; i++) {
        r -= cs[i].p;
        if (r <= 0)
            return cs[i].id;
    }
    return cs[keep - 1].id;
}

/* The context the model is laid out for, as the errors below name it. */
static void context_hint(const snug_model *m, char *buf, size_t n) {
    if (m->T < m->cfg.max_position)
        snprintf(buf, n, " (laid out with T = %d of max_position_embeddings %d: a larger T also makes room)", m->T,
                 m->cfg.max_position);
    else
        snprintf(buf, n, " (max_position_embeddings)");
}

/* Refuses what would not fit the context or the vocabulary, before anything is written. */
static int check_args(const snug_model *m, const int32_t *prompt, int n_prompt, int max_new, const int32_t *out,
                      snug_error *e) {
    int T = m->T, V = m->cfg.vocab_size;
    char hint[160];
    context_hint(m, hint, sizeof hint);
    if (n_prompt < 1)
        return snug_fail(e, SNUG_EINPUT, "generate: the prompt has %d tokens; give at least one (the BOS or EOS "
                         "token when there is no text)", n_prompt);
    if (!prompt || !out)
        return snug_fail(e, SNUG_EINTERNAL, "generate: no %s buffer", prompt ? "output" : "prompt");
    if (n_prompt > T)
        return snug_fail(e, SNUG_EINPUT, "generate: the prompt is %d tokens but the model's context holds %d%s; "
                         "shorten the prompt to at most %d tokens (fewer, to leave room for max_new_tokens)", n_prompt,
                         T, hint, T);
    if (max_new < 0)
        return snug_fail(e, SNUG_EINPUT, "generate: max_new_tokens is %d; it must be 0 or more", max_new);
    if (max_new > T - n_prompt)
        return snug_fail(e, SNUG_EINPUT, "generate: the prompt (%d tokens) plus max_new_tokens (%d) needs %lld "
                         "positions but the model's context holds %d%s; lower max_new_tokens to at most %d or shorten "
                         "the prompt", n_prompt, max_new, (long long)n_prompt + max_new, T, hint, T - n_prompt);
    for (int t = 0; t < n_prompt; t++)
        if (prompt[t] < 0 || prompt[t] >= V)
            return snug_fail(e, SNUG_EINPUT, "generate: prompt token %d (at position %d) is outside the vocabulary "
                             "[0, %d); encode the prompt with the model's tokenizer", (int)prompt[t], t, V);
    return 0;
}

int snug_generate_checked(snug_model *m, const int32_t *prompt, int n_prompt, int max_new, int stop_id,
                          const snug_sampling *s, int32_t *out, int *n_out, snug_error *e) {
    *n_out = 0;
    SNUG_TRY(check_args(m, prompt, n_prompt, max_new, out, e));
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    *n_out = n_prompt;
    if (max_new == 0)
        return 0;
    snug_backend *be = m->be;
    int V = m->cfg.vocab_size, total = n_prompt + max_new; /* <= m->T: the last row run is total - 2 */
    int32_t *pos = malloc((size_t)m->T * sizeof *pos);
    float *logits = malloc((size_t)V * sizeof *logits);
    cand *cs = malloc((size_t)V * sizeof *cs);
    int rc = 0;
    if (!pos || !logits || !cs) {
        rc = snug_fail(e, SNUG_ENOMEM, "generate: out of host memory for the buffers of a %d-token vocabulary", V);
        goto done;
    }
    for (int t = 0; t < m->T; t++)
        pos[t] = t;
    be->to_device(be, m->pos, pos, (size_t)m->T * sizeof *pos);
    be->to_device(be, m->ids, prompt, (size_t)n_prompt * sizeof *prompt);
    snug_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f};
    if (!s)
        s = &greedy;
    uint64_t rng = s->seed;
    int n = n_prompt;
    const snug_lora_ctx lx = model_lora_ctx(m);
    /* DoRA: the weight norms once; the adapters do not change while generating */
    for (int l = 0; m->lora.dora && l < m->cfg.n_layer; l++)
        for (int k = 0; k < SNUG_NSITES; k++)
            snug_lora_dora_norms(&lx, l, (snug_site)k);
    m->lora.dora_fixed = m->lora.dora;
    for (int p = 0; p < n_prompt - 1; p++)
        forward_row(m, p);
    while (n < total) {
        forward_row(m, n - 1);
        be->to_host(be, logits, m->logits, (size_t)V * sizeof *logits);
        if ((rc = snug_backend_check(be, e)) != 0) {
            snug_error_wrap(e, "generate: position %d: ", n);
            break;
        }
        int32_t next = sample(logits, V, s, &rng, cs);
        out[n] = next;
        be->to_device(be, m->ids + n, &next, sizeof next);
        n++;
        if (next == stop_id)
            break;
    }
    *n_out = n;
    m->lora.dora_fixed = 0;
done:
    free(pos);
    free(logits);
    free(cs);
    return rc;
}

int snug_generate(snug_model *m, const int32_t *prompt, int n_prompt, int max_new, int stop_id,
                  const snug_sampling *s, int32_t *out) {
    int n = 0;
    snug_error e = {0};
    return snug_generate_checked(m, prompt, n_prompt, max_new, stop_id, s, out, &n, &e) ? 0 : n;
}
