/* preprocess_cmd.h: `snug preprocess [CONFIG] [--key value ...] [--debug] [--dump FILE.jsonl]`. */
#ifndef SNUG_PREPROCESS_CMD_H
#define SNUG_PREPROCESS_CMD_H

#include <stdio.h>

#include "core/error.h"

/* Tokenizes the config's datasets exactly as `snug train` would (filling the cache under dataset_prepared_path) and
 * prints the counts. --debug also prints the first 3 examples token by token (position, id, whether it is
 * supervised, the token string); --dump FILE writes every example, in file order, as one {"input_ids": [...],
 * "labels": [...]} line (labels -100 where not supervised: the pretokenized format). argv starts after the command
 * name. */
int snug_preprocess_cmd(int argc, char **argv, FILE *out, snug_error *e);

#endif
