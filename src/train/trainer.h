/* trainer.h: a whole training run, from options to a saved Hugging Face folder.
 *
 * config -> plan -> allocate -> load -> train loop (data -> forward -> backward -> optimizer) -> save -> sample. */
#ifndef SNUG_TRAINER_H
#define SNUG_TRAINER_H

#include <stdio.h>

#include "cli/options.h"
#include "core/error.h"
#include "model/model.h"

/* Runs training as the options say, reporting progress to `out`. Bad input fails before output_dir is touched. */
int snug_train(const snug_options *o, FILE *out, snug_error *e);

/* The memory levers the options ask for (gradient_checkpointing, flash_attention, chunked_cross_entropy). */
snug_levers snug_levers_from_options(const snug_options *o);

/* `snug plan`: prints the memory plan for the options without allocating model memory. */
int snug_plan_cmd(const snug_options *o, FILE *out, snug_error *e);

#endif
