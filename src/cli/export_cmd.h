/* export_cmd.h: `snug export --gguf OUT.gguf [--type f32|f16|bf16|q8_0] MODEL_DIR [--adapter DIR]`. */
#ifndef SNUG_CLI_EXPORT_CMD_H
#define SNUG_CLI_EXPORT_CMD_H

#include <stdio.h>

#include "core/error.h"

void snug_export_usage(FILE *f);
/* argv: the arguments after "export". Prints one line saying what was written. */
int snug_export_cmd(int argc, char **argv, FILE *out, snug_error *e);

#endif
