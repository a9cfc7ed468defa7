/* trainer.h: a whole training run, from a run configuration to a saved Hugging Face folder.
 *
 * config -> setup (tokenizer, model, plan, auto_fit, data) -> allocate -> load -> train loop (data -> forward ->
 * backward -> optimizer) -> save -> sample. */
#ifndef SNUG_TRAINER_H
#define SNUG_TRAINER_H

#include <stdio.h>

#include "core/error.h"
#include "train/config.h"

/* Runs training as the configuration (validated: snug_run_config_validate_train) says, reporting progress to
 * `out`. Bad input fails before output_dir is touched. */
int snug_train(const snug_run_config *c, FILE *out, snug_error *e);

/* Asks a running snug_train to stop after its current optimizer step: it writes a checkpoint, says how to resume, and
 * returns 0. Async-signal-safe: the CLI calls it from its SIGTERM and SIGINT handler. */
void snug_train_request_stop(void);

#endif
