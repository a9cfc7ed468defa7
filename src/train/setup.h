/* setup.h: resolving a run configuration before anything is allocated: the tokenizer, the model config, the plan
 * spec and its plan, auto_fit, and (on request) the data.
 *
 * `snug train`, `snug plan` and `snug preprocess` all resolve a configuration here, so what `snug plan` reports is
 * what `snug train` runs. The configuration is made final first (auto_find_batch_size or auto_fit write their choice
 * into it, auto_fit's validated again), then its spec is derived once, exactly as a hand-written one's: a fitted run
 * is the run of the configuration it prints. */
#ifndef SNUG_TRAIN_SETUP_H
#define SNUG_TRAIN_SETUP_H

#include <stddef.h>
#include <stdio.h>

#include "core/error.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "plan/gpus.h"
#include "plan/plan.h"
#include "train/config.h"

typedef struct snug_setup {
    snug_run_config c;        /* the configuration as it runs: validated, auto_fit's choice applied */
    snug_model_config cfg;
    snug_tokenizer *tok;      /* NULL for the byte-level stand-in */
    char tok_path[4096];      /* the tokenizer.json used ("" for the byte-level stand-in) */
    snug_encoder enc;         /* its eos_id: special_tokens' eos_token, else the tokenizer's (else config.json's) */
    int pad_id;               /* the id that pads batches: special_tokens' pad_token, else the EOS (else 0) */
    int nadded;               /* tokens added to the tokenizer (special_tokens, tokens: added_tokens.h) */
    int ranks, rank;          /* data-parallel ranks (0 or 1: one process) and this one: the fields set before
                               * snug_setup_resolve (which keeps them; the rest is zeroed there) */
    int tp_rank;              /* under tensor parallelism: this rank's place among its ranks (set likewise) */
    int pp_stage;             /* under pipeline parallelism: this rank's stage (set likewise) */
    snug_comm *agree;         /* every rank of the run, where they must agree on what each rank alone would find
                               * (auto_find_batch_size: the smallest size each rank's plan fits); NULL: one process
                               * (set likewise) */
    int plan_only;            /* planning: a tokenizer that does not load is noted in tok_error, not an error (set
                               * likewise) */
    char tok_error[1024];     /* plan_only: why the tokenizer did not load ("" when it did); its vocabulary size
                               * is then read from the file alone, and the data is not read */
    snug_plan_spec spec;      /* snug_run_spec(&c, &cfg), with ranks */
    snug_plan plan;           /* of spec, before anything is allocated */
    char fit_note[1024];      /* what auto_fit chose and why; "" when auto_fit is off */
    char adapter_overrides[512]; /* lora_model_dir: the configuration's adapter settings its adapter overrides, with
                                  * the configuration's values ("lora_r 8, lora_dropout 0"); "" when none differ */
    size_t data_host_est;     /* the datasets' host memory, estimated from their files before they are read */
    /* snug_setup_load_data */
    snug_dataset train, val;
    snug_data_source dsrc[SNUG_MAX_DATASETS]; /* the datasets as src/data reads them (paths point into c) */
    snug_data_opts dopts;
    snug_data_report drep;    /* per file: examples, tokens, long and bad examples; the cache used */
    snug_data_source vsrc[SNUG_MAX_DATASETS]; /* test_datasets as src/data reads them, and their report */
    snug_data_report vrep;
    /* the chat template (snug_setup_chat, from snug_setup_load_data) */
    snug_chat_files chat;     /* the tokenizer folder's template and special-token strings */
    char *chat_jinja;         /* chat_template_jinja's text ("" unset: NULL) */
    char chat_jinja_where[4200];
    const char *chat_saved;   /* what the saved folder keeps as its chat_template.jinja: the template the first chat
                               * dataset rendered with, when it is not the tokenizer's own; NULL: the tokenizer's files
                               * as they are */
    char chat_note[1024];     /* the header's line on a built-in chosen over the tokenizer's own template, or "" */
} snug_setup;

/* The plan spec of a configuration for a model: micro-batch, accumulation, levers, optimizer state, budget. */
snug_plan_spec snug_run_spec(const snug_run_config *c, const snug_model_config *cfg);

/* The tokenizer and the model config of c, without the plan (s is zeroed first; free it with snug_setup_free). */
int snug_setup_model(snug_setup *s, const snug_run_config *c, snug_error *e);

/* Resolves c (validated by the caller) for a device of kind `device`: tokenizer, model config, spec, auto_fit when
 * asked, plan. Memory for the setup itself only; s is released by snug_setup_free whatever the result. */
int snug_setup_resolve(snug_setup *s, const snug_run_config *c, snug_device_kind device, snug_error *e);

/* The adapters' starting weights (adapter: lora): lora_model_dir's PEFT adapter, or PEFT's initialisation from the
 * seed. Nothing without adapters. */
int snug_setup_load_adapter(const snug_setup *s, snug_model *m, snug_error *e);
/* Resuming a run that started from lora_model_dir (the adapters come from the checkpoint): the base as a PiSSA or
 * OLoRA adapter's initialisation leaves it (snug_peft_residual); nothing for other adapters. */
int snug_setup_adapter_base(const snug_setup *s, snug_model *m, snug_error *e);

/* Copies the Hugging Face tokenizer files that exist in src_dir (tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json, chat_template.jinja) into dst_dir, each atomically. */
int snug_copy_tokenizer_files(const char *src_dir, const char *dst_dir, snug_error *e);

/* Sets special_tokens' pad_token and eos_token (those given) in the tokenizer_config.json and
 * special_tokens_map.json of a folder the tokenizer files were copied into (creating them when absent). */
int snug_tokenizer_files_set_special(const char *dir, const snug_run_config *c, snug_error *e);

/* Reads the datasets as the configuration says (the tokenizer, the model's EOS, the cache under
 * dataset_prepared_path, the validation split). */
int snug_setup_load_data(snug_setup *s, snug_error *e);

/* Resolves the template of every chat dataset (s->dsrc, s->vsrc filled): chatml and llama3 as built in, jinja as
 * chat_template_jinja, tokenizer_default as the tokenizer folder's template (an error when it ships none),
 * tokenizer_default_fallback_chatml as that or chatml. Sets chat_saved and chat_note. */
int snug_setup_chat(snug_setup *s, snug_error *e);

/* Writes s->chat_saved, when set, as dir's chat_template.jinja, and drops the chat_template of dir's
 * tokenizer_config.json (transformers reads the file first; the key would only mislead a reader). */
int snug_setup_save_chat_template(const snug_setup *s, const char *dir, snug_error *e);

/* The first n examples of the datasets (every file, in file order, before the validation split) token by token:
 * position, id, whether it is supervised, the token's text escaped. */
void snug_setup_print_examples(FILE *out, const snug_setup *s, size_t n);

void snug_setup_free(snug_setup *s);

/* An estimate of the dataset's host memory before it is read, from the files' sizes: about 4 bytes of text per token
 * (one byte per token for the byte-level tokenizer), priced by snug_data_host_bytes. */
size_t snug_dataset_bytes_estimate(const snug_run_config *c, int byte_level);

/* The seed of the data order: data_seed, or seed when it is not set (as Hugging Face's Trainer). */
uint64_t snug_data_seed(const snug_run_config *c);

/* dir + "/" + file into dst; returns 1 (and an empty dst) when it does not fit. */
int snug_path_join(char *dst, size_t n, const char *dir, const char *file);

#endif
