/* config.h: the model architecture, as read from (and written to) a Hugging Face config.json.
 *
 * One layer implementation serves every family; the families differ only in the data below and in their row of the
 * family table (family.h: block, tensor names, config.json spelling):
 *   Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama: RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases except
 *   Qwen2's q/k/v bias, tied or untied embeddings.
 *   GPT-2: LayerNorm with bias, learned positions, tanh-GELU MLP, biases everywhere, tied head. */
#ifndef SNUG_MODEL_CONFIG_H
#define SNUG_MODEL_CONFIG_H

#include <stdint.h>

#include "core/error.h"

/* The largest head_dim every backend runs: the CUDA attention holds one head in 256 floats per row (its plain,
 * naive and decode kernels; the tiled and tensor-core ones stop at 128 and fall back to them), and the CPU attention
 * keeps per-tile arrays of head_dim floats on the stack. A config above it is refused when it is validated. */
#define SNUG_MAX_HEAD_DIM 256
/* The most layers a config may have (validated): the per-layer attention flags below are a fixed array. */
#define SNUG_MAX_LAYERS 4096

/* The scheme a family's files follow (family.h): how its tensors are named and its config.json spelled. */
typedef enum snug_arch { SNUG_ARCH_LLAMA = 0, SNUG_ARCH_GPT2 = 1, SNUG_NARCH } snug_arch;

typedef enum snug_rope_type { SNUG_ROPE_DEFAULT = 0, SNUG_ROPE_LLAMA3, SNUG_ROPE_LINEAR } snug_rope_type;

/* A block described as data: what the layer code reads instead of the architecture's name. The biases (qkv_bias,
 * o_bias, mlp_bias), grouped-query attention (n_kv_head) and the RoPE scaling are the config's own fields. */
typedef enum snug_norm_kind {
    SNUG_NORM_RMS = 0,        /* RMSNorm: a weight, the rstd saved */
    SNUG_NORM_LAYER,          /* LayerNorm: a weight and a bias, the mean and rstd saved */
} snug_norm_kind;
typedef enum snug_mlp_kind {
    SNUG_MLP_SWIGLU = 0,      /* silu(gate) * up from one fused (2I, C) gate/up projection */
    SNUG_MLP_GELU,            /* tanh-GELU after one (I, C) projection */
} snug_mlp_kind;
typedef enum snug_pos_kind {
    SNUG_POS_ROPE = 0,        /* rotary embeddings on q and k (the tables from rope_theta and rope_type) */
    SNUG_POS_LEARNED,         /* a learned position embedding added to the token embedding */
} snug_pos_kind;
typedef struct snug_block {
    snug_norm_kind norm;
    snug_mlp_kind mlp;
    snug_pos_kind pos;
} snug_block;

typedef struct snug_model_config {
    snug_arch arch;
    char model_type[32];      /* "llama", "mistral", "qwen2", "gpt2" */
    char architecture[64];    /* "LlamaForCausalLM", ... (architectures[0]) */
    int vocab_size;           /* V */
    int hidden_size;          /* C */
    int intermediate_size;    /* I (GPT-2: n_inner or 4*C) */
    int n_layer;              /* L */
    int n_head;               /* NH */
    int n_kv_head;            /* NKV (GPT-2: NH) */
    int head_dim;             /* HD (default C / NH), at most SNUG_MAX_HEAD_DIM */
    int max_position;         /* max_position_embeddings / n_positions */
    float norm_eps;           /* rms_norm_eps / layer_norm_epsilon */
    int qkv_bias;             /* Qwen2, GPT-2 */
    int o_bias;               /* GPT-2 (c_proj bias), attention_bias=true Llama */
    int mlp_bias;             /* GPT-2, mlp_bias=true Llama */
    int tie_embeddings;       /* lm_head shares the token embedding */
    double rope_theta;
    snug_rope_type rope_type;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    int bos_token_id, eos_token_id, pad_token_id; /* -1 when absent; eos is the first when a list */
    char torch_dtype[16];     /* "float32", "bfloat16", ... as read; written back unchanged */
    float initializer_range;  /* default 0.02 */
    /* Sliding-window attention, as transformers' mask has it: in a sliding layer query t sees key s when
     * s <= t and t - s < sliding_window (W keys, itself included), within its packed example. Mistral: every layer
     * when sliding_window is not null; Qwen2: the layers of layer_types "sliding_attention", by default those from
     * max_window_layers on, when use_sliding_window. */
    int sliding_window;       /* W; 0: every layer attends to all the keys before it */
    unsigned char layer_sliding[SNUG_MAX_LAYERS]; /* (L) 1 where layer l attends within the window */
    /* the config.json this was read from ("" for a config built in code): saving keeps its keys and values and
     * changes only those training changed (snug_model_config_save) */
    char json_path[1024];
    /* tokens added to the tokenizer past the base's vocabulary (never read from nor written to config.json): the
     * rows the base's embedding and head hold (vocab_size counts the new ones too; 0 = vocab_size), and how the new
     * rows start when they are loaded: vocab_mean 1 the mean of the old rows (transformers' mean_resizing), 0
     * normal(0, initializer_range) drawn from the stream of vocab_seed (its _init_weights) */
    int vocab_base;
    int vocab_mean;
    uint64_t vocab_seed;
} snug_model_config;

/* The window of layer l: W when it is a sliding layer, else 0 (full causal attention). */
static inline int snug_layer_window(const snug_model_config *c, int l) {
    return c->sliding_window > 0 && l >= 0 && l < SNUG_MAX_LAYERS && c->layer_sliding[l] ? c->sliding_window : 0;
}

/* Parses config.json (transformers v4 and v5 spellings: torch_dtype/dtype, rope_scaling/rope_parameters,
 * rope_type/type). Checks consistency: heads divide the width (unless head_dim is given), KV heads divide heads,
 * positive sizes; errors name the file, the key and the fix. Unsupported model_type is an error. */
int snug_model_config_load(snug_model_config *cfg, const char *path, snug_error *e);
/* Parses config.json text already in memory; `path` only names it in errors. */
int snug_model_config_parse(snug_model_config *cfg, const char *json_text, const char *path, snug_error *e);
/* Writes config.json atomically. A config read from a file (json_path) is written as that file was, key for key
 * (unknown keys too), with only the values training can change set from cfg where they differ from the file's:
 * vocab_size, the bos/eos/pad ids and torch_dtype (dtype in the v5 spelling); a config built in code gets the keys
 * transformers' AutoConfig expects for its architecture. */
int snug_model_config_save(const snug_model_config *cfg, const char *path, snug_error *e);
/* Writes generation_config.json atomically: the base's (beside json_path) with the bos/eos/pad ids that differ
 * from its config.json's set from cfg, or one of cfg's bos/eos/pad ids when the base has none. */
int snug_generation_config_save(const snug_model_config *cfg, const char *path, snug_error *e);
/* Checks a config built in code (the built-in presets) the same way a loaded one is checked. */
int snug_model_config_validate(const snug_model_config *cfg, const char *path, snug_error *e);

/* The block of a config's family (its row of the family table, family.c). */
snug_block snug_block_of(const snug_model_config *c);

/* Number of trainable parameters (tied embedding counted once). */
long long snug_model_config_nparams(const snug_model_config *cfg);

#endif
