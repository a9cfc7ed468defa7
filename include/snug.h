/* snug.h: the public header of libsnug, the LLM training engine behind the `snug` program.
 *
 * Every public name starts with snug_. A program embeds snug the way the CLI does:
 *
 *     snug_options o;
 *     snug_error e = {0};
 *     snug_options_defaults(&o);
 *     if (snug_options_load_yaml(&o, "train.yaml", &e) || snug_options_validate_train(&o, &e) ||
 *         snug_train(&o, stdout, &e))
 *         fprintf(stderr, "%s\n", e.msg);
 *
 * Lower layers (backend ops, model, tokenizer, safetensors) are reachable through the headers listed below. */
#ifndef SNUG_H
#define SNUG_H

#define SNUG_VERSION "0.1.0"

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
#include "cli/options.h"
#include "train/trainer.h"

#endif
