/* generate_cmd.h: `snug generate MODEL_DIR --prompt TEXT ...`. */
#ifndef SNUG_GENERATE_CMD_H
#define SNUG_GENERATE_CMD_H

#include <stdio.h>

#include "core/error.h"

int snug_generate_cmd(int argc, char **argv, FILE *out, snug_error *e);
/* `snug generate --help`: the usage and every flag the command takes. */
void snug_generate_usage(FILE *f);

#endif
