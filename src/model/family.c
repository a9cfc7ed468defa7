/* family.c: the table of model families and of the tensor-naming schemes they share (see family.h).
 *
 * A new family named as Llama names its tensors (Qwen3, OLMo 2, Gemma ...) is one row of `families`, plus the ops of
 * its block that snug lacks; a family with other tensor names is a scheme too. */
#include "model/family.h"

#include <stdio.h>
#include <string.h>

/* Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama: nn.Linear weights (out, in), q/k/v and gate/up apart */
static const snug_module_def llama_modules[] = {
    {"self_attn.q_proj", SNUG_SITE_QKV, 1, 1}, {"self_attn.k_proj", SNUG_SITE_QKV, 1, 0},
    {"self_attn.v_proj", SNUG_SITE_QKV, 1, 1}, {"self_attn.o_proj", SNUG_SITE_O, 1, 0},
    {"mlp.gate_proj", SNUG_SITE_FC, 1, 0},     {"mlp.up_proj", SNUG_SITE_FC, 1, 0},
    {"mlp.down_proj", SNUG_SITE_PROJ, 1, 0},
};
/* GPT-2: Conv1D weights (in, out), q/k/v in one c_attn */
static const snug_module_def gpt2_modules[] = {
    {"attn.c_attn", SNUG_SITE_QKV, 3, 1},
    {"attn.c_proj", SNUG_SITE_O, 1, 0},
    {"mlp.c_fc", SNUG_SITE_FC, 1, 0},
    {"mlp.c_proj", SNUG_SITE_PROJ, 1, 0},
};

static const snug_scheme schemes[SNUG_NARCH] = {
    [SNUG_ARCH_LLAMA] = {.name = "Llama", .layers = "model.layers", .blocks = "layers",
                         .embed = "model.embed_tokens", .pos_embed = NULL, .final_norm = "model.norm",
                         .head = "lm_head", .norm1 = "input_layernorm", .norm2 = "post_attention_layernorm",
                         .modules = llama_modules, .n_modules = (int)(sizeof llama_modules / sizeof *llama_modules),
                         .conv1d = 0, .k_hidden = "hidden_size", .k_inner = "intermediate_size",
                         .k_layers = "num_hidden_layers", .k_heads = "num_attention_heads",
                         .k_positions = "max_position_embeddings", .k_eps = "rms_norm_eps"},
    [SNUG_ARCH_GPT2] = {.name = "GPT-2", .layers = "transformer.h", .blocks = "h", .embed = "transformer.wte",
                        .pos_embed = "transformer.wpe", .final_norm = "transformer.ln_f", .head = NULL,
                        .norm1 = "ln_1", .norm2 = "ln_2", .modules = gpt2_modules,
                        .n_modules = (int)(sizeof gpt2_modules / sizeof *gpt2_modules), .conv1d = 1,
                        .k_hidden = "n_embd", .k_inner = "n_inner", .k_layers = "n_layer", .k_heads = "n_head",
                        .k_positions = "n_positions", .k_eps = "layer_norm_epsilon"},
};

#define LLAMA_BLOCK {.norm = SNUG_NORM_RMS, .mlp = SNUG_MLP_SWIGLU, .pos = SNUG_POS_ROPE}

/* The first family of a scheme is the one a config built in code without a model_type gets. The defaults are
 * transformers' (num_key_value_heads: Llama None = heads, Mistral 8, Qwen2 32). */
static const snug_family families[] = {
    {.model_type = "llama", .aka = "SmolLM, TinyLlama", .architecture = "LlamaForCausalLM", .arch = SNUG_ARCH_LLAMA,
     .block = LLAMA_BLOCK, .kv_heads_default = 0, .max_position_default = 2048, .bias = SNUG_BIAS_KEYS},
    {.model_type = "mistral", .architecture = "MistralForCausalLM", .arch = SNUG_ARCH_LLAMA, .block = LLAMA_BLOCK,
     .kv_heads_default = 8, .max_position_default = 131072, .bias = SNUG_BIAS_NONE, .sliding = SNUG_SLIDING_ALL},
    {.model_type = "qwen2", .architecture = "Qwen2ForCausalLM", .arch = SNUG_ARCH_LLAMA, .block = LLAMA_BLOCK,
     .kv_heads_default = 32, .max_position_default = 32768, .bias = SNUG_BIAS_QKV,
     .sliding = SNUG_SLIDING_FLAG},
    {.model_type = "gpt2", .architecture = "GPT2LMHeadModel", .arch = SNUG_ARCH_GPT2,
     .block = {.norm = SNUG_NORM_LAYER, .mlp = SNUG_MLP_GELU, .pos = SNUG_POS_LEARNED}, .kv_heads_default = 0,
     .max_position_default = 1024, .bias = SNUG_BIAS_ALL},
};
enum { N_FAMILIES = (int)(sizeof families / sizeof *families) };

const snug_scheme *snug_scheme_of(snug_arch arch) {
    return (int)arch >= 0 && (int)arch < SNUG_NARCH ? &schemes[arch] : NULL;
}

const snug_family *snug_family_find(const char *model_type) {
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(families[i].model_type, model_type))
            return &families[i];
    return NULL;
}

const snug_family *snug_family_of(const snug_model_config *c) {
    const snug_family *f = snug_family_find(c->model_type);
    if (f && f->arch == c->arch)
        return f;
    for (int i = 0; i < N_FAMILIES; i++)
        if (families[i].arch == c->arch)
            return &families[i];
    return &families[0];
}

const snug_family *snug_family_at(int i) { return i >= 0 && i < N_FAMILIES ? &families[i] : NULL; }

void snug_family_list(int arch, char *buf, size_t n) {
    int total = 0, k = 0;
    for (int i = 0; i < N_FAMILIES; i++)
        total += arch < 0 || (int)families[i].arch == arch;
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_FAMILIES && len < n; i++) {
        if (arch >= 0 && (int)families[i].arch != arch)
            continue;
        const char *sep = k == 0 ? "" : k == total - 1 ? " or " : ", ";
        len += (size_t)snprintf(buf + len, n - len, "%s\"%s\"", sep, families[i].model_type);
        k++;
    }
}

/* The width of part j of site s (Q = NH * HD, KV = NKV * HD) and the site's input width. */
static int64_t part_width(const snug_model_config *c, snug_site s, int j, int64_t *in) {
    int64_t C = c->hidden_size, I = c->intermediate_size, Q = (int64_t)c->n_head * c->head_dim,
            KV = (int64_t)c->n_kv_head * c->head_dim;
    *in = s == SNUG_SITE_O ? Q : s == SNUG_SITE_PROJ ? I : C;
    return s == SNUG_SITE_QKV ? (j == 0 ? Q : KV) : s == SNUG_SITE_FC ? I : C;
}

const snug_module_def *snug_module_shape(const snug_model_config *c, int k, int64_t *row0, int64_t *rows,
                                         int64_t *in) {
    const snug_scheme *sc = snug_scheme_of(c->arch);
    if (!sc || k < 0 || k >= sc->n_modules)
        return NULL;
    const snug_module_def *d = &sc->modules[k];
    int j = 0; /* the site's parts before module k's */
    for (int i = 0; i < k; i++)
        j += sc->modules[i].site == d->site ? sc->modules[i].parts : 0;
    *row0 = *rows = 0;
    for (int p = 0; p < j; p++)
        *row0 += part_width(c, d->site, p, in);
    for (int p = j; p < j + d->parts; p++)
        *rows += part_width(c, d->site, p, in);
    part_width(c, d->site, 0, in);
    return d;
}

snug_block snug_block_of(const snug_model_config *c) { return snug_family_of(c)->block; }
