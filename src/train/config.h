/* config.h: the typed run configuration: what a training run (and `snug plan`, `snug preprocess`) is asked to do.
 *
 * The command line (src/cli/options_*.c) turns YAML and flags into this struct and is the only place that knows how
 * options are spelled; everything below it reads enums, numbers and paths (other trainers' spellings, such as
 * attn_implementation or deepspeed, are resolved into snug's own fields there and stay private to it).
 * snug_run_config_validate checks it, and snug_run_levers derives the memory levers from it (the one place a lever
 * depends on other settings, e.g. fp32 layer gradients under gradient accumulation), so a configuration changed
 * after parsing (by auto_fit) is validated and derived again exactly as a hand-written one. */
#ifndef SNUG_TRAIN_CONFIG_H
#define SNUG_TRAIN_CONFIG_H

#include "backend/backend_select.h"
#include "core/error.h"
#include "data/dataset.h"
#include "model/model.h"
#include "optim/optim.h"

#define SNUG_MAX_DATASETS 16
#define SNUG_MAX_PP_LIST 128 /* counts pipeline_layers may list (its 256 characters hold no more) */

typedef enum snug_long_policy { SNUG_LONG_TRUNCATE, SNUG_LONG_DROP } snug_long_policy;

/* gradient_checkpointing */
typedef enum snug_ckpt_choice {
    SNUG_CKPT_CHOICE_NONE,
    SNUG_CKPT_CHOICE_SELECTIVE,
    SNUG_CKPT_CHOICE_FULL,
    SNUG_CKPT_CHOICE_OFFLOAD, /* full, with the layer inputs in host memory */
} snug_ckpt_choice;

/* optimizer: the state layout and where it lives */
typedef enum snug_optimizer_choice {
    SNUG_OPTIMIZER_ADAMW,
    SNUG_OPTIMIZER_ADAMW_8BIT,
    SNUG_OPTIMIZER_PAGED_ADAMW_8BIT,
    SNUG_OPTIMIZER_PAGED_ADAMW_32BIT,
} snug_optimizer_choice;

/* ddp_backend (Hugging Face TrainingArguments' key): how the ranks talk */
typedef enum snug_ddp_backend {
    SNUG_DDP_BACKEND_AUTO, /* unset: NCCL between CUDA ranks, MPI between CPU ranks */
    SNUG_DDP_BACKEND_NCCL, /* device buffers through NCCL (CUDA ranks; at one rank too, a communicator of size 1) */
    SNUG_DDP_BACKEND_MPI,  /* host buffers through MPI (CPU ranks) */
} snug_ddp_backend;

/* zero_overlap_comm (DeepSpeed's zero_optimization.overlap_comm): ZeRO-2/3's per-layer reduce-scatters beside the
 * backward of the next layer, in a second layer gradient buffer */
typedef enum snug_overlap_choice {
    SNUG_OVERLAP_AUTO, /* unset: on for CUDA ranks (NCCL runs it on its own stream), off for CPU ranks */
    SNUG_OVERLAP_ON,
    SNUG_OVERLAP_OFF,
} snug_overlap_choice;

typedef struct snug_dataset_spec {
    char path[1024];              /* a JSONL file (a relative path in a YAML file is joined to its folder) */
    snug_data_format type;        /* completion (default), alpaca, chat, pretokenized */
    char field[64];               /* the text field for completion (default "text") */
    snug_chat_template chat_template; /* for chat: tokenizer_default_fallback_chatml (default), ... (dataset.h) */
    int chat_template_own;        /* 1: the entry names its chat_template; 0: the config-wide one applies */
    int type_chat_template;       /* 1: its type is written chat_template (Axolotl's), whose template defaults to the
                                   * tokenizer's own */
    /* chat: the fields of a line and its messages (Axolotl's field_messages, message_property_mappings) */
    char field_messages[64];      /* "messages" */
    char field_role[64];          /* "role" */
    char field_content[64];       /* "content" */
    /* chat: the role values that mean each role, names joined by commas (Axolotl's roles); all "" = its default
     * (human and user, gpt and assistant, system) */
    char roles_system[256], roles_user[256], roles_assistant[256];
} snug_dataset_spec;

/* lr_scheduler_kwargs, each a bit of the command line's record of which were written (src/cli/options_impl.h) */
enum {
    SNUG_SCHED_KW_MIN_LR_RATE = 1 << 0, SNUG_SCHED_KW_MIN_LR = 1 << 1, SNUG_SCHED_KW_NUM_CYCLES = 1 << 2,
    SNUG_SCHED_KW_POWER = 1 << 3, SNUG_SCHED_KW_LR_END = 1 << 4, SNUG_SCHED_KW_TIMESCALE = 1 << 5,
    SNUG_SCHED_KW_DECAY_STEPS = 1 << 6, SNUG_SCHED_KW_STABLE_STEPS = 1 << 7, SNUG_SCHED_KW_WARMUP_TYPE = 1 << 8,
    SNUG_SCHED_KW_DECAY_TYPE = 1 << 9, SNUG_SCHED_KW_MIN_LR_RATIO = 1 << 10, SNUG_SCHED_KW_MODE = 1 << 11,
    SNUG_SCHED_KW_FACTOR = 1 << 12, SNUG_SCHED_KW_PATIENCE = 1 << 13, SNUG_SCHED_KW_THRESHOLD = 1 << 14,
    SNUG_SCHED_KW_THRESHOLD_MODE = 1 << 15, SNUG_SCHED_KW_COOLDOWN = 1 << 16, SNUG_SCHED_KW_EPS = 1 << 17,
    SNUG_SCHED_KW_WARMUP_LR_RATE = 1 << 18,
};

/* A setting that changes a run's results, so that a resumed run must keep it: a checkpoint records it under `name`
 * and a resume refuses another value. The key table of src/cli marks these keys; snug_options_defaults points the
 * configuration at their list (snug_run_config.fixed). */
typedef enum snug_setting_kind { SNUG_SETTING_INT, SNUG_SETTING_REAL, SNUG_SETTING_TEXT } snug_setting_kind;
typedef struct snug_fixed_setting {
    const char *name;       /* in trainer_state.json's "fixed": the field's name */
    snug_setting_kind kind; /* int (numbers, booleans, enums), double, or text */
    size_t offset;          /* in snug_run_config */
    const char *absent;     /* JSON of the value a checkpoint written before the setting was recorded holds, or NULL */
} snug_fixed_setting;

typedef struct snug_run_config {
    char config_path[1024];   /* the YAML file read, "" for none (errors name it) */

    /* model */
    char base_model[1024];    /* a Hugging Face model folder; "" = train the built-in model from scratch */
    /* adapters (adapter: lora): see snug_lora_cfg */
    snug_adapter adapter;
    int lora_r;
    double lora_alpha;        /* 0 = lora_r */
    double lora_dropout;
    char lora_target_modules[512]; /* module names joined by commas (PEFT's matching); "" = PEFT's default */
    int lora_target_linear;   /* every linear module of a block, besides lora_target_modules */
    char lora_modules_to_save[128]; /* embed_tokens, lm_head: trained in full beside the adapters; "" = none (as
                                     * written, for the checkpoint's record; the code reads lora_save_modules) */
    unsigned lora_save_modules; /* lora_modules_to_save read by the command line: SNUG_SAVE_EMBED, SNUG_SAVE_HEAD */
    unsigned lora_targets;    /* the adapted modules as bits of the architecture's linear modules (PEFT's matching of
                               * lora_target_modules, its default, lora_target_linear): resolved against the model by
                               * snug_setup_resolve, since the names are the architecture's */
    int lora_rslora;          /* scale alpha / sqrt(r) */
    int lora_dora;            /* DoRA: magnitude and direction (PEFT's use_dora) */
    double loraplus_lr_ratio; /* LoRA+: lora_B's learning rate over lora_A's; 0 = off */
    char unfrozen_parameters[4096]; /* the tensors a full fine-tune trains: Axolotl's patterns, one per line; ""
                                     * = every tensor (as written, for the checkpoint's record; the code reads
                                     * unfrozen) */
    snug_patterns unfrozen;   /* unfrozen_parameters read by the command line: the patterns, in order; n 0 = every
                               * tensor (snug_param_table_freeze) */
    int dataset_exact_deduplication; /* one of each set of equal examples (tokens and targets) */
    char lora_layers[256];    /* the adapted layers (PEFT's layers_to_transform), indices joined by commas; "" = all
                               * (as written, for the checkpoint's record; the code reads lora_layer_mask) */
    uint64_t lora_layer_mask[4]; /* lora_layers read by the command line: bit l = layer l adapted; all zero = every
                                  * layer (snug_lora_cfg's layers) */
    char lora_layers_pattern[64]; /* PEFT's layers_pattern: the block list's name (checked against the model) */
    char lora_model_dir[1024]; /* a PEFT adapter to start from; "" = fresh adapters */
    int merge_lora;           /* at the end: output_dir/merged = the base with the trained adapter merged */
    /* QLoRA (adapter: qlora): how the base's block matrices are stored, bitsandbytes' BitsAndBytesConfig */
    int load_in_4bit;         /* with adapter: lora, the same as adapter: qlora */
    int load_in_8bit;         /* with adapter: lora, the block matrices in LLM.int8's 8 bits (adapter qlora inside) */
    int bnb_4bit_quant_type;  /* snug_q4_type */
    int bnb_4bit_use_double_quant;
    int bnb_4bit_blocksize;   /* 64; a pre-quantized checkpoint's own */
    int bnb_4bit_compute_fp16; /* bnb_4bit_compute_dtype: float16 (else bfloat16): the 16-bit type of the rest */
    char model_preset[64];    /* built-in architecture when base_model is empty ("tiny-llama") */
    char model_class[64];     /* model_type (Axolotl's: the transformers class): "" or AutoModelForCausalLM, else it
                               * must be the class config.json's architectures names */
    int derived_llama, derived_mistral, derived_qwen; /* Axolotl's is_*_derived_model: true must be config.json's */
    int lora_fan_in_fan_out;  /* -1 = what the model's layers are (GPT-2's Conv1D: 1, else 0); 0 or 1 must agree */
    char tokenizer[1024];     /* folder or tokenizer.json; "" = base_model's, or the built-in */

    /* data */
    int ndatasets;
    snug_dataset_spec datasets[SNUG_MAX_DATASETS];
    int ntest_datasets;       /* Axolotl's test_datasets: the validation set from these files (val_set_size 0) */
    snug_dataset_spec test_datasets[SNUG_MAX_DATASETS];
    int sequence_len;
    double val_set_size;      /* fraction (< 1) or count (>= 1) of examples held out; 0 = none */
    int train_on_inputs;
    int skip_bad_examples;
    snug_long_policy long_examples;
    char dataset_prepared_path[1024];
    snug_chat_template chat_template; /* the config-wide chat_template: chat entries that name none use it */
    char chat_template_jinja[32768];  /* Axolotl's chat_template_jinja: a template's text or file ("" = none) */
    /* special_tokens: tokens of the tokenizer's vocabulary that take these roles ("" = the tokenizer's own) */
    char pad_token[128], eos_token[128], bos_token[128], unk_token[128];
    char tokens[8192];        /* tokens: added to the tokenizer as tokens that are not special, one per line ("" = none) */
    char extra_special[4096]; /* special_tokens.additional_special_tokens: added as special tokens after them, one
                               * per line; the saved tokenizer's extra_special_tokens */
    int mean_resizing_embeddings; /* rows of the embedding and head that added tokens grow start at 1: the mean of the
                                   * old rows (transformers' mean_resizing), 0: normal(0, initializer_range) */
    int resize_to_32x;        /* resize_token_embeddings_to_32x: the grown vocabulary rounded up to a multiple of 32 */
    int debug;                /* 1: the first examples are printed token by token before training (Axolotl's debug) */

    /* batch and schedule */
    int micro_batch_size;
    int sample_packing, group_by_length, pad_to_sequence_len, pad_to_multiple_of, concatenate;
    int gradient_accumulation_steps;
    int num_epochs;
    int max_steps;            /* -1 = from epochs */
    double learning_rate;
    snug_sched lr_scheduler;
    int warmup_steps;
    double cosine_min_lr_ratio; /* Axolotl's: cosine decays to this fraction of learning_rate (0: to 0) */
    int sched_min_lr;         /* 1: lr_scheduler is written cosine_with_min_lr, which needs a floor */
    snug_sched_params sched;  /* lr_scheduler_kwargs of the other schedules (num_cycles, power, lr_end, ...) */
    double warmup_ratio;      /* used when warmup_steps is 0 */
    double weight_decay;
    double neftune_noise_alpha; /* NEFTune's noise on the training embeddings; 0 = off */
    double adam_beta1, adam_beta2, adam_epsilon;
    double max_grad_norm;     /* 0 = no clipping */
    int optimizer_in_backward;
    int bf16, fp16;
    snug_backend_choice device;
    int master_weights;
    snug_optimizer_choice optimizer;

    /* data parallel (src/dist): the ranks come from the launcher (mpirun, srun); each takes its share of the global
     * batch of micro_batch_size x gradient_accumulation_steps x ranks rows */
    int ddp;                  /* 1: replicate the model and all-reduce the gradients (the only multi-rank mode) */
    snug_ddp_backend ddp_backend;
    int ddp_deterministic;    /* 1: gradients summed in rank order, the same bits whatever the MPI algorithm */
    int ddp_bucket_cap_mb;    /* DDP and ZeRO-1: MiB of gradients per sum issued during backward (PyTorch's 25) */
    snug_overlap_choice zero_overlap_comm;
    int tensor_parallel_size; /* tensor parallelism over groups of that many ranks (1: none); the world is a
                               * multiple of it, data parallel across the groups */
    int pipeline_parallel_size; /* pipeline parallelism: the layers in that many stages, one per rank of a group
                                 * (1: none); the world is a multiple of it, data parallel across the groups */
    int pipeline_recompute;     /* a stage before the last keeps only its inputs and runs its forward again */
    char pipeline_layers[256];  /* the layers of each stage, counts joined by commas ("" = an even split), as written
                                 * (the checkpoint's record; the plan's and the model's split still read it) */
    int pipeline_stage_layers[SNUG_MAX_PP_LIST]; /* pipeline_layers read by the command line: each stage's layers */
    int pipeline_nstage_layers; /* how many counts it lists (0 = an even split) */
    int zero_stage;           /* ZeRO: 0 = none (every rank holds everything); 1 = optimizer state sharded; 2 = and
                               * the gradients; 3 = and the parameters */
    int dist_debug;           /* 1: every collective's signature compared across ranks before it runs */
    double dist_timeout;      /* seconds before a collective that does not complete fails the run; 0 = never */

    /* output and logging */
    char output_dir[1024];
    int seed;
    int data_seed;            /* -1: seed */
    int logging_steps;
    int eval_steps;           /* 0 = at the end of each epoch */
    int save_steps;           /* 0 = only at the end */
    int save_strategy;        /* Hugging Face's: -1 unset, 0 no (no checkpoints), 1 steps (save_steps, 500 unset), 2
                               * epoch (a checkpoint at the end of each epoch) */
    int eval_strategy;        /* likewise: 0 no (no evaluation), 1 steps (eval_steps, logging_steps unset), 2 epoch */
    int save_first_step;      /* Axolotl's: a checkpoint after the first step too */
    int auto_resume;          /* Axolotl's auto_resume_from_checkpoints: resume the newest complete checkpoint in
                               * output_dir when there is one */
    int no_progress_bar;      /* disable_tqdm: plain lines on a terminal too */
    int use_tensorboard;      /* Axolotl's: report_to tensorboard */
    char logging_dir[1024];   /* TensorBoard's event files; "" = output_dir/runs */
    int evals_per_epoch;      /* Axolotl's: an evaluation every ceil(total / (evals_per_epoch x num_epochs)) steps,
                               * instead of eval_steps; 0 = unset */
    int saves_per_epoch;      /* likewise a checkpoint, instead of save_steps; 0 = unset */
    double loss_watchdog_threshold; /* training ends (and saves, as at its end) once the step's loss has been above
                                     * it loss_watchdog_patience steps in a row; 0 = off */
    int loss_watchdog_patience;
    int early_stopping_patience; /* evaluations in a row without a lower val_loss that end training; 0 = off */
    double early_stopping_threshold; /* how much lower a val_loss must be to count as lower */
    int load_best_model_at_end; /* -1 auto (on with early_stopping_patience and checkpoints, as Axolotl), 0, 1: the
                                 * model saved at the end is the checkpoint with the lowest val_loss (or the last
                                 * step, when it is lower) */
    int save_total_limit;     /* 0 = keep every checkpoint; K = the K newest complete ones */
    int save_only_model;      /* checkpoints hold the model files alone (no optimizer state): not resumable */
    int async_checkpoint;     /* 1: a checkpoint is copied to host memory and written while training goes on */
    char resume_from_checkpoint[1024]; /* "" = a new run; a checkpoint folder; "latest": the newest complete one in
                                        * output_dir (resume_latest; the text stays as written, for messages) */
    const snug_fixed_setting *fixed; /* the settings a resume must keep (the key table's, set by snug_options_defaults) */
    int nfixed;
    int resume_latest;        /* resume_from_checkpoint: latest (or true): the newest complete checkpoint in output_dir */
    int overwrite_output_dir; /* 0: an output_dir that holds a run is refused (resume it, or say to overwrite) */
    int threads;              /* 0 = all cores */

    /* generation after training (and `snug generate`) */
    char sample_prompt[65536]; /* also `snug generate --prompt`: long enough for a whole context of text */
    int sample_tokens;
    double temperature;
    int top_k;
    double top_p;

    /* memory */
    double memory_budget;     /* bytes, 0 = none */
    int auto_fit;
    int auto_find_batch_size; /* micro_batch_size the most, halved until its plan fits the device's free memory */
    snug_ckpt_choice gradient_checkpointing;
    int gradient_checkpointing_every_n_layers;
    int flash_attention;
    int chunked_cross_entropy;
    int cross_entropy_chunk_tokens;
    int tiled_mlp;
    int offload_embedding;
    int offload_params;       /* an adapter's frozen base in host memory (also fsdp_config's offload_params,
                               * DeepSpeed's offload_param, fsdp's offload) */
    int tiled_mlp_num_shards; /* 0 = auto */
    int loss_vocab_block;     /* rows of the head per block of the loss; 0 = auto, -1 = off */
} snug_run_config;

/* Cross-field consistency (positive sizes, levers that exclude each other, ...): one error naming the setting and
 * the fix. */
int snug_run_config_validate(const snug_run_config *c, snug_error *e);

/* snug_run_config_validate, plus what training needs beyond it: at least one dataset. */
int snug_run_config_validate_train(const snug_run_config *c, snug_error *e);

/* The memory levers of a configuration, derived in this one place: layer gradients stay fp32 under 16-bit storage
 * when micro-batches accumulate into them. */
snug_levers snug_run_levers(const snug_run_config *c);

/* The optimizer's state layout and whether it is paged. */
void snug_run_optimizer(snug_optimizer_choice o, snug_optim_kind *kind, int *paged);
/* The choice for a state layout (the inverse of snug_run_optimizer). */
snug_optimizer_choice snug_run_optimizer_choice(snug_optim_kind kind, int paged);

/* Entry i of datasets then test_datasets (i < ndatasets + ntest_datasets), and the key that lists it. */
const snug_dataset_spec *snug_run_dataset(const snug_run_config *c, int i, const char **key);

/* Whether the run writes checkpoints before its end (save_steps, saves_per_epoch, save_strategy: epoch,
 * save_first_step); a signal's checkpoint aside. */
int snug_run_saves(const snug_run_config *c);

/* Whether the model saved at the end is the best checkpoint's: load_best_model_at_end, or its auto (early stopping with
 * checkpoints). */
int snug_load_best(const snug_run_config *c);

/* Warmup steps of a run of `total` steps: warmup_steps, else ceil(warmup_ratio x total). */
int snug_warmup_steps(const snug_run_config *c, int total);

/* Names as the configuration writes them: the key table parses these and reports print them. snug_sched_names:
 * lr_scheduler's, indexed by snug_sched, ending with NULL; gradient_checkpointing's are snug_ckpt_names
 * (plan/plan_json.h), which the plan's reports print too. */
extern const char *const snug_sched_names[];
const char *snug_sched_name(snug_sched s);

#endif
