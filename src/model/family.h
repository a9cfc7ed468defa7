/* family.h: the model families snug knows, as one table (family.c): what the rest of the model reads instead of
 * testing a family's name or id.
 *
 * A family is a Hugging Face model_type ("llama", "mistral", "qwen2", "gpt2"): the class its config.json names, its
 * block (config.h's snug_block: norm, MLP, positions), transformers' defaults for its absent keys and the biases it
 * can express. Families share a scheme (snug_arch): how the tensors of the safetensors files are named, how the block's
 * linear modules are split (the modules LoRA adapts), whether linear weights are stored transposed (GPT-2's Conv1D)
 * and how config.json spells the sizes. Adding a family whose tensors are named as an existing scheme names them is
 * one row of the family table. */
#ifndef SNUG_MODEL_FAMILY_H
#define SNUG_MODEL_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

/* The linear layers of a block, where the model computes them: the fused q/k/v projection, the attention output,
 * the fused gate/up (or GPT-2's c_fc) and the MLP output. */
typedef enum snug_site { SNUG_SITE_QKV = 0, SNUG_SITE_O, SNUG_SITE_FC, SNUG_SITE_PROJ, SNUG_NSITES } snug_site;

/* One linear module of a block as the files name it. A site's output is made of parts, in order: q, k, v (QKV);
 * the output (O); gate, up (FC of a SwiGLU MLP) or the one up projection (GELU); the output (PROJ). A module holds
 * `parts` consecutive parts of its site: q_proj one, GPT-2's c_attn all three (stored as one tensor of 3 segments). */
typedef struct snug_module_def {
    const char *name;     /* the module's path inside a block: "self_attn.q_proj", "attn.c_attn" */
    snug_site site;
    int parts;
    int lora_default;     /* among PEFT's default target_modules for the scheme (q_proj and v_proj; c_attn) */
} snug_module_def;

/* How a scheme's tensors are named (each a module path; ".weight" and ".bias" follow) and its config.json spelled. */
typedef struct snug_scheme {
    const char *name;       /* in messages: "Llama", "GPT-2" */
    const char *layers;     /* the blocks' prefix, "model.layers": tensor "<layers>.<l>.<module>.weight" */
    const char *blocks;     /* the prefix's last part, PEFT's layers_pattern: "layers", "h" */
    const char *embed;      /* the token embedding (V, C) */
    const char *pos_embed;  /* the learned position embedding (max_position, C), for SNUG_POS_LEARNED */
    const char *final_norm; /* the norm after the last block */
    const char *head;       /* the output head (V, C), when not tied */
    const char *norm1;      /* a block's norm before attention */
    const char *norm2;      /* a block's norm before the MLP */
    const snug_module_def *modules; /* the block's linear modules, by site in order QKV, O, FC, PROJ */
    int n_modules;
    int conv1d;             /* linear weights stored (in, out), PEFT's fan_in_fan_out (GPT-2's Conv1D) */
    /* config.json's keys for the sizes, as the user's file spells them */
    const char *k_hidden, *k_inner, *k_layers, *k_heads, *k_positions, *k_eps;
} snug_scheme;

/* Which biases a family's config.json can express. */
typedef enum snug_bias_rule {
    SNUG_BIAS_KEYS = 0,   /* attention_bias (q/k/v and o together) and mlp_bias, read and written (llama) */
    SNUG_BIAS_QKV,        /* q/k/v biases and no others, always (qwen2) */
    SNUG_BIAS_NONE,       /* none (mistral) */
    SNUG_BIAS_ALL,        /* everywhere (gpt2) */
} snug_bias_rule;

/* How a family's config.json says which layers attend within a sliding window (config.h: sliding_window). */
enum {
    SNUG_SLIDING_FLAG = 1,  /* Qwen2: use_sliding_window, then layer_types or max_window_layers */
    SNUG_SLIDING_ALL = 2,   /* Mistral: every layer when sliding_window is not null */
};

typedef struct snug_family {
    const char *model_type;     /* config.json's model_type */
    const char *aka;            /* other names of models of this type, in the list of supported ones, or NULL */
    const char *architecture;   /* architectures[0] written when the config names none (any name is read) */
    snug_arch arch;             /* the scheme: tensor names, modules, Conv1D, config.json spelling */
    snug_block block;
    int kv_heads_default;       /* num_key_value_heads when absent (transformers' default); 0: num_attention_heads */
    int max_position_default;   /* max_position_embeddings when absent */
    snug_bias_rule bias;
    int sliding;                /* SNUG_SLIDING_* */
} snug_family;

/* The scheme of arch (NULL for an unknown id). */
const snug_scheme *snug_scheme_of(snug_arch arch);
/* The family of a model_type, NULL when snug has none. */
const snug_family *snug_family_find(const char *model_type);
/* The family of a config: its model_type's, else (a config built in code without one) its arch's first family. */
const snug_family *snug_family_of(const snug_model_config *c);
/* Module k of the scheme of config c: its first row of its site's output, its rows and its input width (NULL past
 * the last module). */
const snug_module_def *snug_module_shape(const snug_model_config *c, int k, int64_t *row0, int64_t *rows,
                                         int64_t *in);
/* The i-th family of the table, NULL past the last (for listing them). */
const snug_family *snug_family_at(int i);
/* The model_types of arch (every family when arch < 0), each in double quotes, as "\"a\", \"b\" or \"c\"". */
void snug_family_list(int arch, char *buf, size_t n);

#endif
