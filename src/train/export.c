/* export.c: a model folder as a GGUF file (see export.h): the hyperparameters and the tensors. The vocabulary is
 * export_vocab.c's. */
#include "train/export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "model/family.h"
#include "model/safetensors.h"

/* A tensor of the folder as the GGUF file holds it. */
typedef struct ex_tensor {
    const snug_st_tensor *src; /* NULL: computed (rope_freqs) */
    int transpose;             /* GPT-2's Conv1D weight (in, out) written (out, in) */
    int permute_heads;         /* Llama's q/k: the rows of each of this many heads reordered for ggml's RoPE */
} ex_tensor;

typedef struct ex_ctx {
    snug_st_set st;
    ex_tensor t[1024 * 16];
    int nt;
    const snug_model_config *cfg;
} ex_ctx;

/* The module of a block under its ggml name: "self_attn.q_proj" -> "attn_q". */
typedef struct ex_name {
    const char *hf, *gguf;
} ex_name;

static const ex_name llama_block[] = {
    {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"},  {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
    {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},     {"mlp.down_proj", "ffn_down"},
};
static const ex_name gpt2_block[] = {
    {"ln_1", "attn_norm"}, {"attn.c_attn", "attn_qkv"}, {"attn.c_proj", "attn_output"},
    {"ln_2", "ffn_norm"},  {"mlp.c_fc", "ffn_up"},      {"mlp.c_proj", "ffn_down"},
};

/* Llama's rotary layout in ggml pairs rows i and i + HD/2 of a head as adjacent rows, as the converter's permute:
 * row (h, j, i) of the file, viewed (heads, 2, HD/2), goes to row (h, i, j). rows (heads * HD, cols). */
static int permute_rows(float *w, int64_t rows, int64_t cols, int heads, snug_error *e) {
    float *tmp = malloc((size_t)(rows * cols) * sizeof *tmp);
    if (!tmp)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory permuting q/k for GGUF");
    memcpy(tmp, w, (size_t)(rows * cols) * sizeof *tmp);
    int64_t hd = rows / heads, half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(w + (size_t)((h * hd + i * 2 + j) * cols), tmp + (size_t)((h * hd + j * half + i) * cols),
                       (size_t)cols * sizeof *w);
    free(tmp);
    return 0;
}

/* Llama 3's RoPE scaling as ggml applies it: one factor per frequency (HD/2), the converter's rope_freqs. */
static void llama3_factors(const snug_model_config *c, float *dst) {
    int dim = c->head_dim;
    float old = (float)(c->rope_original_max_position ? c->rope_original_max_position : 8192);
    float lo = (float)c->rope_low_freq_factor, hi = (float)c->rope_high_freq_factor, f = (float)c->rope_factor;
    float lo_wl = old / lo, hi_wl = old / hi;
    for (int k = 0; k < dim / 2; k++) {
        float freq = 1.0f / powf((float)c->rope_theta, (float)(2 * k) / (float)dim);
        float wl = (float)(2 * M_PI) / freq;
        if (wl < hi_wl)
            dst[k] = 1.0f;
        else if (wl > lo_wl)
            dst[k] = f;
        else {
            float smooth = (old / wl - lo) / (hi - lo);
            dst[k] = 1.0f / ((1.0f - smooth) / f + smooth);
        }
    }
}

static int fill(void *ud, int tag, float *dst, snug_error *e) {
    ex_ctx *x = ud;
    const ex_tensor *t = &x->t[tag];
    if (!t->src) {
        llama3_factors(x->cfg, dst);
        return 0;
    }
    SNUG_TRY(snug_st_to_f32(&x->st, t->src, dst, t->transpose, e));
    snug_st_release(&x->st, t->src);
    if (t->permute_heads)
        return permute_rows(dst, t->src->shape[0], t->src->ndim > 1 ? t->src->shape[1] : 1, t->permute_heads, e);
    return 0;
}

/* The type a tensor is stored as: the converter keeps 1-D tensors, norms, biases and the position embedding f32,
 * and writes f16 a q8_0 matrix whose rows do not split into blocks of 32. */
static snug_gguf_type type_of(const char *gname, int ndim, int64_t cols, snug_gguf_type want) {
    size_t n = strlen(gname);
    if (ndim <= 1 || (n >= 12 && !strcmp(gname + n - 12, "_norm.weight")) || !strncmp(gname, "position_embd", 13) ||
        n < 7 || strcmp(gname + n - 7, ".weight"))
        return SNUG_GGUF_F32;
    if (want == SNUG_GGUF_Q8_0 && cols % SNUG_GGUF_QK8_0)
        return SNUG_GGUF_F16;
    return want;
}

/* Adds tensor hf_name of the folder (NULL when absent and optional) as gname. */
static int add(snug_gguf *g, ex_ctx *x, const char *hf_name, const char *gname, snug_gguf_type want, int transpose,
               int heads, int optional, const char *dir, snug_error *e) {
    const snug_st_tensor *s = snug_st_find(&x->st, hf_name);
    if (!s) {
        if (optional)
            return 0;
        return snug_fail(e, SNUG_EINPUT, "%s: the model has no tensor %s; export needs a complete model folder (as "
                         "snug train, snug merge or save_pretrained write it)", dir, hf_name);
    }
    if (x->nt == (int)(sizeof x->t / sizeof *x->t))
        return snug_fail(e, SNUG_EINPUT, "%s: too many tensors for GGUF export", dir);
    int64_t shape[4] = {0};
    int nd = s->ndim;
    if (nd < 1 || nd > 2)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor %s has %d dimensions (1 or 2 expected)", dir, hf_name, nd);
    for (int i = 0; i < nd; i++)
        shape[i] = transpose ? s->shape[nd - 1 - i] : s->shape[i];
    x->t[x->nt] = (ex_tensor){.src = s, .transpose = transpose, .permute_heads = heads};
    return snug_gguf_add_tensor(g, gname, type_of(gname, nd, shape[nd - 1], want), nd, shape, fill, x, x->nt++, e);
}

static int is_used(const ex_ctx *x, const snug_st_tensor *s) {
    for (int i = 0; i < x->nt; i++)
        if (x->t[i].src == s)
            return 1;
    return 0;
}

/* One tensor of the file with what orders it as the converter does. */
typedef struct ex_order {
    snug_gguf_tensor t;
    const char *file, *name; /* the safetensors file's base name and the tensor's name in it; NULL: computed */
    int seq;
} ex_order;

static int order_cmp(const void *pa, const void *pb) {
    const ex_order *a = pa, *b = pb;
    if (!a->name || !b->name)
        return a->name ? 1 : b->name ? -1 : a->seq - b->seq;
    int c = strcmp(a->file, b->file);
    c = c ? c : strcmp(a->name, b->name);
    return c ? c : a->seq - b->seq;
}

/* Puts the file's tensors in the converter's order: the computed ones (rope_freqs) first, then by safetensors file
 * (sorted by name) and, within one, by tensor name (as gguf-py's SafetensorsLocal lists them). */
static int order_like_converter(snug_gguf *g, const ex_ctx *x, snug_error *e) {
    ex_order *o = malloc((size_t)(g->nt ? g->nt : 1) * sizeof *o);
    if (!o)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory ordering the GGUF tensors");
    for (int i = 0; i < g->nt; i++) {
        const snug_st_tensor *src = x->t[g->t[i].tag].src;
        const char *path = src ? x->st.paths[src->file] : NULL, *slash = path ? strrchr(path, '/') : NULL;
        o[i] = (ex_order){.t = g->t[i], .file = slash ? slash + 1 : path, .name = src ? src->name : NULL, .seq = i};
    }
    qsort(o, (size_t)g->nt, sizeof *o, order_cmp);
    for (int i = 0; i < g->nt; i++)
        g->t[i] = o[i].t;
    free(o);
    return 0;
}

/* The tensors by their ggml names, in the model's order (order_like_converter then sorts them): token embedding
 * (and positions), each block, the final norm, the head when the files hold one (a tied head is not written:
 * llama.cpp uses the token embedding). A tensor of the folder that has no ggml name is refused by name. */
static int add_tensors(snug_gguf *g, ex_ctx *x, const snug_family *f, snug_gguf_type want, const char *dir,
                       snug_error *e) {
    const snug_model_config *c = x->cfg;
    int gpt2 = c->arch == SNUG_ARCH_GPT2, llama = !strcmp(f->model_type, "llama") || !strcmp(f->model_type, "mistral");
    const char *pre = gpt2 && snug_st_find(&x->st, "wte.weight") ? "" : gpt2 ? "transformer." : "model.";
    char hn[256], gn[128];
    if (c->rope_type == SNUG_ROPE_LLAMA3 && !gpt2) {
        int64_t n = c->head_dim / 2;
        x->t[x->nt] = (ex_tensor){0};
        SNUG_TRY(snug_gguf_add_tensor(g, "rope_freqs.weight", SNUG_GGUF_F32, 1, &n, fill, x, x->nt++, e));
    }
    snprintf(hn, sizeof hn, "%s%s.weight", pre, gpt2 ? "wte" : "embed_tokens");
    SNUG_TRY(add(g, x, hn, "token_embd.weight", want, 0, 0, 0, dir, e));
    if (gpt2) {
        snprintf(hn, sizeof hn, "%swpe.weight", pre);
        SNUG_TRY(add(g, x, hn, "position_embd.weight", want, 0, 0, 0, dir, e));
    }
    const ex_name *blk = gpt2 ? gpt2_block : llama_block;
    int nb = gpt2 ? (int)(sizeof gpt2_block / sizeof *gpt2_block) : (int)(sizeof llama_block / sizeof *llama_block);
    for (int l = 0; l < c->n_layer; l++)
        for (int k = 0; k < nb; k++)
            for (int b = 0; b < 2; b++) {
                const char *sfx = b ? "bias" : "weight";
                snprintf(hn, sizeof hn, "%s%s.%d.%s.%s", pre, gpt2 ? "h" : "layers", l, blk[k].hf, sfx);
                snprintf(gn, sizeof gn, "blk.%d.%s.%s", l, blk[k].gguf, sfx);
                int heads = !llama ? 0 : !strcmp(blk[k].gguf, "attn_q") ? c->n_head
                                       : !strcmp(blk[k].gguf, "attn_k") ? c->n_kv_head : 0;
                int conv = gpt2 && !b && strstr(blk[k].hf, "c_");
                SNUG_TRY(add(g, x, hn, gn, want, conv, heads, b, dir, e));
            }
    snprintf(hn, sizeof hn, "%s%s.weight", pre, gpt2 ? "ln_f" : "norm");
    SNUG_TRY(add(g, x, hn, "output_norm.weight", want, 0, 0, 0, dir, e));
    if (gpt2) {
        snprintf(hn, sizeof hn, "%sln_f.bias", pre);
        SNUG_TRY(add(g, x, hn, "output_norm.bias", want, 0, 0, 0, dir, e));
    }
    SNUG_TRY(add(g, x, "lm_head.weight", "output.weight", want, 0, 0, 1, dir, e));
    for (int i = 0; i < x->st.ntensors; i++) {
        const char *n = x->st.tensors[i].name;
        size_t len = strlen(n);
        int buffer = (len >= 10 && !strcmp(n + len - 10, ".attn.bias")) ||
                     (len >= 17 && !strcmp(n + len - 17, ".attn.masked_bias")) || strstr(n, "rotary_emb.inv_freq");
        if (!buffer && !is_used(x, &x->st.tensors[i]))
            return snug_fail(e, SNUG_EINPUT, "%s: tensor %s has no place in a GGUF %s model (llama.cpp's converter "
                             "refuses it too); export the model without it", dir, n, f->model_type);
    }
    return 0;
}

/* The hyperparameters as the converter writes them (TextModel, LlamaModel, GPT2Model's set_gguf_parameters).
 * has_kv, has_hd: config.json names num_key_value_heads, head_dim (the converter writes their keys only then). */
static void add_hparams(snug_gguf *g, const snug_model_config *c, const char *arch, int llama, snug_gguf_type type,
                        int has_kv, int has_hd) {
    char k[128];
#define KEY(s) (snprintf(k, sizeof k, "%s." s, arch), k)
    snug_gguf_kv_u32(g, KEY("block_count"), (uint32_t)c->n_layer);
    snug_gguf_kv_u32(g, KEY("context_length"), (uint32_t)c->max_position);
    snug_gguf_kv_u32(g, KEY("embedding_length"), (uint32_t)c->hidden_size);
    snug_gguf_kv_u32(g, KEY("feed_forward_length"), (uint32_t)c->intermediate_size);
    snug_gguf_kv_u32(g, KEY("attention.head_count"), (uint32_t)c->n_head);
    if (c->arch == SNUG_ARCH_GPT2) {
        snug_gguf_kv_f32(g, KEY("attention.layer_norm_epsilon"), c->norm_eps);
    } else {
        if (has_kv)
            snug_gguf_kv_u32(g, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_head);
        snug_gguf_kv_f32(g, KEY("rope.freq_base"), (float)c->rope_theta);
        snug_gguf_kv_f32(g, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps);
        if (has_hd) {
            snug_gguf_kv_u32(g, KEY("attention.key_length"), (uint32_t)c->head_dim);
            snug_gguf_kv_u32(g, KEY("attention.value_length"), (uint32_t)c->head_dim);
        }
        if (c->rope_type == SNUG_ROPE_LINEAR) {
            snug_gguf_kv_str(g, KEY("rope.scaling.type"), "linear");
            snug_gguf_kv_f32(g, KEY("rope.scaling.factor"), (float)c->rope_factor);
        }
    }
    snug_gguf_kv_u32(g, "general.file_type", type == SNUG_GGUF_F32 ? 0 : type == SNUG_GGUF_F16 ? 1
                                             : type == SNUG_GGUF_BF16 ? 32 : 7);
    if (llama) {
        snug_gguf_kv_u32(g, KEY("vocab_size"), (uint32_t)c->vocab_size);
        snug_gguf_kv_u32(g, KEY("rope.dimension_count"), (uint32_t)c->head_dim);
    }
#undef KEY
}

/* The converter's general.size_label: the count of the values the file holds (every tensor written) in thousands,
 * millions, billions or trillions, with as many decimals as bring it to two digits ("98K", "1.7B", "0.50K"). */
static void size_label(const snug_gguf *g, char *out, size_t cap) {
    int64_t n = 0;
    for (int i = 0; i < g->nt; i++) {
        int64_t k = 1;
        for (int d = 0; d < g->t[i].ndim; d++)
            k *= g->t[i].shape[d];
        n += k;
    }
    double v = (double)n;
    const char *suffix = v > 1e12 ? "T" : v > 1e9 ? "B" : v > 1e6 ? "M" : "K";
    double s = v > 1e12 ? v * 1e-12 : v > 1e9 ? v * 1e-9 : v > 1e6 ? v * 1e-6 : v * 1e-3;
    char whole[32];
    snprintf(whole, sizeof whole, "%.0f", nearbyint(s)); /* Python's round(): half to even */
    int digits = !strcmp(whole, "0") ? 0 : (int)strlen(whole);
    snprintf(out, cap, "%.*f%s", digits < 2 ? 2 - digits : 0, s, suffix);
}

int snug_export_gguf(const char *model_dir, const char *out_path, snug_gguf_type type, const char *name,
                     snug_error *e) {
    char p[4096];
    snug_model_config cfg;
    snprintf(p, sizeof p, "%s/config.json", model_dir);
    SNUG_TRY(snug_model_config_load(&cfg, p, e));
    const snug_family *f = snug_family_of(&cfg);
    /* llama.cpp's architecture of each family: Mistral's Hugging Face models convert as "llama" */
    const char *arch = cfg.arch == SNUG_ARCH_GPT2 ? "gpt2" : !strcmp(f->model_type, "qwen2") ? "qwen2" : "llama";
    int llama = !strcmp(arch, "llama");
    if (cfg.o_bias || cfg.mlp_bias) {
        if (cfg.arch != SNUG_ARCH_GPT2 && !llama)
            return snug_fail(e, SNUG_EINPUT, "%s: biases on o_proj or the MLP have no place in llama.cpp's %s", p, arch);
    }
    if (cfg.head_dim % 2 && cfg.arch != SNUG_ARCH_GPT2)
        return snug_fail(e, SNUG_EINPUT, "%s: head_dim %d is odd; RoPE needs it even", p, cfg.head_dim);
    ex_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory exporting %s", model_dir);
    x->cfg = &cfg;
    snug_gguf g;
    snug_gguf_init(&g);
    int rc = snug_st_open_dir(&x->st, model_dir, e);
    if (!rc)
        rc = add_tensors(&g, x, f, type, model_dir, e);
    if (!rc)
        rc = order_like_converter(&g, x, e);
    if (!rc) {
        char label[32];
        size_label(&g, label, sizeof label);
        snug_gguf_kv_str(&g, "general.architecture", arch);
        snug_gguf_kv_str(&g, "general.type", "model");
        snug_gguf_kv_str(&g, "general.name", name);
        snug_gguf_kv_str(&g, "general.size_label", label);
        char *text = NULL;
        size_t len = 0;
        json_error_t je;
        json_t *cj = snug_read_file(p, &text, &len, e) ? NULL : snug_json_loadb(text, len, 0, &je);
        free(text);
        int has_kv = cj && json_is_integer(json_object_get(cj, "num_key_value_heads"));
        int has_hd = cj && json_is_integer(json_object_get(cj, "head_dim"));
        json_decref(cj);
        /* without num_key_value_heads, llama.cpp reads head_count_kv as head_count: write it where the family's
         * default differs (Mistral 8, Qwen2 32) */
        has_kv = has_kv || cfg.n_kv_head != cfg.n_head;
        add_hparams(&g, &cfg, arch, llama, type, has_kv, has_hd || cfg.head_dim * cfg.n_head != cfg.hidden_size);
        snug_gguf_kv_u32(&g, "general.quantization_version", 2);
        rc = snug_export_vocab(&g, model_dir, &cfg, llama, e);
    }
    if (!rc)
        rc = snug_gguf_write(&g, out_path, e);
    snug_gguf_free(&g);
    snug_st_close(&x->st);
    free(x);
    return rc;
}
