/* trainer.h: a whole training run, from options to a saved Hugging Face folder.
 *
 * config -> plan -> allocate -> load -> train loop (data -> forward -> backward -> optimizer) -> save -> sample. */
#ifndef SNUG_TRAINER_H
#define SNUG_TRAINER_H

#include <stdio.h>

#include "cli/options.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "plan/plan.h"

/* Runs training as the options say, reporting progress to `out`. Bad input fails before output_dir is touched. */
int snug_train(const snug_options *o, FILE *out, snug_error *e);

/* The memory levers the options ask for (gradient_checkpointing, flash_attention, chunked_cross_entropy). */
snug_levers snug_levers_from_options(const snug_options *o);

/* What `snug plan` (src/plan/plan_cmd.c) shares with a training run, resolved the same way and without allocating
 * the model: the options after auto_fit, the model config, the plan spec and its plan, and the data when readable. */
typedef struct snug_prepared {
    snug_options o;            /* after auto_fit (micro_batch_size, accumulation, levers, optimizer) */
    snug_model_config cfg;
    snug_plan_spec spec;
    snug_plan plan;
    char tok_path[4096];       /* the tokenizer.json used; "" for the byte-level stand-in */
    char fit_note[1024];       /* what auto_fit chose and why; "" when auto_fit is off */
    size_t data_host_bytes;    /* the dataset in host memory: measured when loaded, else estimated from file sizes */
    int data_loaded;           /* 1: the datasets were read; data_tokens and data_examples count them */
    size_t data_tokens, data_examples;
    char data_error[512];      /* why they were not ("" when loaded, or when none is configured) */
} snug_prepared;

/* Resolves tokenizer and model from the options and plans them for a device of kind `device` (0 = cpu, 1 = cuda,
 * the values of snug_device_kind), running auto_fit when the options ask; with load_data, also reads the datasets
 * (a dataset that cannot be read is not an error here: data_error says why). */
int snug_prepare(snug_prepared *p, const snug_options *o, int device, int load_data, snug_error *e);

/* The data of a run, read exactly as `snug train` reads it (the tokenizer, the model's EOS, the cache under
 * dataset_prepared_path, the validation split): for `snug preprocess`. */
typedef struct snug_run_data {
    snug_tokenizer *tok;      /* NULL for the byte-level stand-in */
    char tok_path[4096];      /* "" for the byte-level stand-in */
    snug_encoder enc;
    int nsrc;
    snug_data_source src[SNUG_MAX_DATASETS]; /* paths point into the options */
    snug_data_opts opts;
    snug_data_report report;
    snug_dataset train, val;
} snug_run_data;

int snug_load_run_data(snug_run_data *d, const snug_options *o, snug_error *e);
void snug_run_data_free(snug_run_data *d);

#endif
