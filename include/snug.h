/* snug.h: the public header of libsnug, the LLM training engine behind the `snug` program.
 *
 * Every public name starts with snug_. A program embeds snug the way the CLI does:
 *
 *     snug_run_config c;                  (filled by the program, or from YAML by src/cli/options.h,
 *     snug_error e = {0};                  which the snug_cli library provides)
 *     snug_options_defaults(&c);
 *     if (snug_options_load_yaml(&c, "train.yaml", &e) || snug_run_config_validate_train(&c, &e) ||
 *         snug_train(&c, stdout, &e))
 *         fprintf(stderr, "%s\n", e.msg);
 *
 * Lower layers (backend ops, model, tokenizer, safetensors) are reachable through the headers listed below. */
#ifndef SNUG_H
#define SNUG_H

#include "core/version.h"

#include "core/error.h"
#include "core/arena.h"
#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/generate.h"
#include "data/tokenizer.h"
#include "data/dataset.h"
#include "optim/optim.h"
#include "plan/plan.h"
#include "train/config.h"
#include "train/setup.h"
#include "train/trainer.h"

#endif
