/* presets.h: built-in model architectures (tiny-llama, llama-30m, gpt2-124m) for training from scratch. */
#ifndef SNUG_PRESETS_H
#define SNUG_PRESETS_H

#include "model/config.h"

/* Fills c with the named preset; vocab_size <= 0 keeps the preset's own. */
int snug_preset(snug_model_config *c, const char *name, int vocab_size, snug_error *e);

#endif
