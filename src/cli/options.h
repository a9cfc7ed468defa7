/* options.h: the training configuration a user writes (YAML, Axolotl-style keys with Hugging Face
 * TrainingArguments names as aliases) and overrides on the command line (`--learning_rate 1e-4`), turned into the
 * typed run configuration (src/train/config.h). The only place that knows how options are spelled.
 *
 * One table of keys (options_keys.c) drives parsing, type checking, the "did you mean" suggestion for unknown keys, the
 * "not supported yet" refusal for features not built, and the `snug train --help` listing, so help text and parser
 * cannot disagree. The environment variables that choose kernels (SNUG_CUDA_ATTN, SNUG_CPU_GEMM, SNUG_BLAS, SNUG_DNNL,
 * SNUG_NCCL, SNUG_MPI_SHM) are debugging switches, listed at the end of the help, and are no configuration. */
#ifndef SNUG_OPTIONS_H
#define SNUG_OPTIONS_H

#include <stdio.h>

#include "core/error.h"
#include "train/config.h"

/* Fills every field with its default (the defaults live in the key table, options_keys.c). */
void snug_options_defaults(snug_run_config *o);

/* Reads a YAML file into o (over the defaults), and resolves the other trainers' spellings in it (deepspeed, fsdp,
 * attn_implementation, use_cpu...) into snug's own keys: the same as snug_options_parse_args with the file's path
 * alone, so a program that only loads a YAML gets the configuration `snug train FILE` runs. Errors: YAML syntax
 * (with line and column), unknown key (with the closest valid key), wrong type (with line), a key of a feature not
 * built yet ("not supported yet"), spellings that disagree. A key left empty (`key:`) keeps its default. o is
 * unchanged when it fails. Call it, or snug_options_parse_args, once per configuration: each resolves what it read. */
int snug_options_load_yaml(snug_run_config *o, const char *path, snug_error *e);

/* Parses argv after the subcommand (argv[0] is the first argument, not the program or subcommand name): an optional
 * config path (the one non-flag argument) and --key value / --key=value overrides (dashes in a key count as
 * underscores: --learning-rate); a bare --flag of a boolean key means true. Overrides win over the YAML whatever
 * their position; the first --dataset replaces the config's datasets and later ones add to it. Then the other
 * trainers' spellings (deepspeed, fsdp, attn_implementation, use_cpu...), which only the command line knows, are
 * resolved into snug's own keys; they are not kept in o, so a second call starts them afresh. o should hold the
 * defaults (snug_options_defaults) first; it is unchanged on failure. --help is not handled here. */
int snug_options_parse_args(snug_run_config *o, int argc, char **argv, snug_error *e);

/* Prints every key with its type, default, aliases and one line of help, grouped as in src/train/config.h, then the keys
 * recognised but not supported yet. */
void snug_options_print_help(FILE *f);
/* The lines of `snug generate --help`: the generation keys, seed and threads, from the key table. */
void snug_generate_flags_help(FILE *f);

/* The flags of `snug plan` (--gpu, --backend, --json, --svg, --tokens_per_s, --price_per_hour), keys of the same
 * table: taken out of argv (*argc shrinks; the rest keeps its order for snug_options_parse_args) into a, with the
 * same type and range errors. a is unchanged on failure. */
struct snug_plan_args;
int snug_plan_flags_take(struct snug_plan_args *a, int *argc, char **argv, snug_error *e);
/* Their lines for `snug plan --help`. */
void snug_plan_flags_help(FILE *f);

#endif
