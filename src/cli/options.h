/* options.h: the training configuration a user writes (YAML, Axolotl-style keys with Hugging Face
 * TrainingArguments names as aliases) and overrides on the command line (`--learning_rate 1e-4`).
 *
 * One table of keys (options.c) drives parsing, type checking, the "did you mean" suggestion for unknown keys, the
 * "not supported yet" refusal for features not built, and the `snug train --help` listing, so help text and parser
 * cannot disagree. */
#ifndef SNUG_OPTIONS_H
#define SNUG_OPTIONS_H

#include <stdio.h>

#include "core/error.h"

#define SNUG_MAX_DATASETS 16

typedef struct snug_dataset_spec {
    char path[1024];   /* datasets[i].path: a JSONL file; a relative path in the YAML is stored joined to the YAML
                        * file's folder, one from --dataset is kept as written */
    char type[32];     /* datasets[i].type: "completion" (default), "alpaca", "chat" (alias chat_template),
                        * "pretokenized" */
    char field[64];    /* datasets[i].field: the text field for completion (default "text") */
    char chat_template[16]; /* datasets[i].chat_template: "chatml" (default) or "llama3", for type chat */
} snug_dataset_spec;

typedef struct snug_options {
    char config_path[1024];   /* the YAML file read, "" for none (errors name it) */

    /* model */
    char base_model[1024];    /* a Hugging Face model folder; "" = train the built-in model from scratch */
    char model_preset[64];    /* model_preset: built-in architecture when base_model is empty ("tiny-llama") */
    char tokenizer[1024];     /* tokenizer: folder or tokenizer.json (relative to the YAML file); "" = base_model's, or the built-in */

    /* data */
    int ndatasets;
    snug_dataset_spec datasets[SNUG_MAX_DATASETS];
    int sequence_len;         /* 256 */
    double val_set_size;      /* fraction (<1) or count (>=1) of examples held out; 0 = none */
    int train_on_inputs;      /* 0: prompt, system and user tokens are not trained on */
    int skip_bad_examples;    /* 0: stop at the first bad dataset line; 1: skip and count them */
    char long_examples[16];   /* "truncate" (default) or "drop": examples longer than sequence_len */
    char dataset_prepared_path[1024]; /* the tokenized-data cache folder ("last_run_prepared", relative to the
                                       * current directory) */

    /* batch and schedule */
    int micro_batch_size;     /* 4;  alias per_device_train_batch_size */
    int sample_packing;       /* 0: one example per row, padded; 1: several examples per row of sequence_len */
    int group_by_length;      /* 0; 1: micro-batches of examples of similar length (padding only) */
    int pad_to_sequence_len;  /* 0: a padded micro-batch is as long as its longest example; 1: sequence_len */
    int pad_to_multiple_of;   /* 0; a padded micro-batch's length rounded up to a multiple of this */
    int concatenate;          /* 0; 1: join the examples into one stream cut into rows (no boundaries) */
    int gradient_accumulation_steps; /* 1 */
    int num_epochs;           /* 1; alias num_train_epochs */
    int max_steps;            /* -1 = from epochs */
    double learning_rate;     /* 3e-4 */
    char lr_scheduler[16];    /* "cosine" | "linear" | "constant"; alias lr_scheduler_type */
    int warmup_steps;         /* 0 */
    double warmup_ratio;      /* 0; used when warmup_steps is 0 */
    double weight_decay;      /* 0.0 */
    double adam_beta1, adam_beta2, adam_epsilon; /* 0.9, 0.999, 1e-8 */
    double max_grad_norm;     /* 1.0; 0 = no clipping */
    int optimizer_in_backward; /* 0 */
    int bf16, fp16;            /* 0, 0: mixed precision */
    char device[16];           /* "auto": cuda when built with it and a GPU is visible, else cpu */
    int master_weights;        /* 1 */
    char optimizer[32];       /* "adamw" (adamw_torch), "adamw_8bit", "paged_adamw_{8,32}bit"; alias optim */

    /* output and logging */
    char output_dir[1024];    /* "out" */
    int seed;                 /* 42 */
    int data_seed;            /* -1: seed */
    int logging_steps;        /* 1 */
    int eval_steps;           /* 0 = at the end of each epoch only */
    int save_steps;           /* 0 = only at the end */
    int threads;              /* 0 = all cores */

    /* generation after training (and `snug generate`) */
    char sample_prompt[1024]; /* printed after training; "" = none */
    int sample_tokens;        /* 64 */
    double temperature;       /* 0.8 */
    int top_k;                /* 40 */
    double top_p;             /* 0.95 */

    /* memory budget for the arenas (bytes, 0 = none); memory_budget: "40GB" */
    double memory_budget;
    int auto_fit;             /* 0; 1: choose micro-batch, checkpointing, optimizer state to fit memory_budget */

    /* activation levers */
    char gradient_checkpointing[16];           /* "none" | "selective" | "full" */
    int gradient_checkpointing_every_n_layers; /* 1 */
    int flash_attention;                       /* 1 */
    int chunked_cross_entropy;                 /* 0 */
    int cross_entropy_chunk_tokens;            /* 256 */
} snug_options;

/* Fills every field with its default (the defaults live in options.c's key table). */
void snug_options_defaults(snug_options *o);

/* Reads a YAML file into o (over the defaults). Errors: YAML syntax (with line and column), unknown key (with the
 * closest valid key), wrong type (with line), a key of a feature not built yet ("not supported yet"). A key left
 * empty (`key:`) keeps its default. o is unchanged when it fails. */
int snug_options_load_yaml(snug_options *o, const char *path, snug_error *e);

/* Applies one key + value from the command line, with the same checks as the YAML; `where` names the source in
 * errors ("command line"). Dashes in key count as underscores (--learning-rate). Key "dataset"/"datasets" appends
 * one completion dataset with the path kept as written. */
int snug_options_set(snug_options *o, const char *key, const char *value, const char *where, snug_error *e);

/* Parses argv after the subcommand (argv[0] is the first argument, not the program or subcommand name): an optional
 * config path (the one non-flag argument) and --key value / --key=value overrides; a bare --flag of a boolean key
 * means true. Overrides win over the YAML whatever their position; the first --dataset replaces the config's datasets
 * and later ones add to it. o should hold the defaults (snug_options_defaults) first; it is unchanged on failure.
 * --help is not handled here. */
int snug_options_parse_args(snug_options *o, int argc, char **argv, snug_error *e);

/* Checks cross-field consistency after everything is set (positive sizes, known scheduler, ...). */
int snug_options_validate(const snug_options *o, snug_error *e);

/* snug_options_validate, plus what training needs beyond it: at least one dataset. */
int snug_options_validate_train(const snug_options *o, snug_error *e);

/* Prints every key with its type, default, aliases and one line of help, grouped as in this header, then the keys
 * recognised but not supported yet. */
void snug_options_print_help(FILE *f);

#endif
