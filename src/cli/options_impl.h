/* options_impl.h: what the files of the options parser share, private to src/cli (the public face is options.h).
 *
 *   options_keys.c    the key table: every key, its spellings, type, field, default and help
 *   options_value.c   one value from text: key lookup, numbers, booleans, sizes, enums, defaults
 *   options_yaml.c    a YAML config file, key by key, lists and mappings entry by entry
 *   options_compat.c  other trainers' spellings: fsdp_config, fsdp, deepspeed, Axolotl's and transformers' aliases
 *   options_args.c    the command line: --key value overrides, snug plan's flags
 *   options_help.c    the --help listings, printed from the table */
#ifndef SNUG_OPTIONS_IMPL_H
#define SNUG_OPTIONS_IMPL_H

#include <stddef.h>
#include <stdio.h>
#include <yaml.h>

#include "cli/options.h"

typedef enum key_type {
    KT_INT,      /* int, strict decimal (3.0 is accepted, 2.5 is not) */
    KT_FLOAT,    /* double: 3e-4, 0.0003 */
    KT_BOOL,     /* true/false/yes/no/on/off */
    KT_STRING,   /* char[size] */
    KT_ENUM,     /* an enum field: `values` maps each spelling to a name, `enums` each name to its value */
    KT_SIZE,     /* double bytes from "40GB", "512 MiB", "1000000" */
    KT_DATASETS, /* the datasets list */
    KT_LIST,     /* a list: read by `map` (keys not supported yet: refused unless empty) */
    KT_MAP,      /* a mapping: read by `map` (keys not supported yet: refused unless empty) */
    KT_NAMES,    /* char[size]: a list of names (YAML list, or "a,b" as one value), stored joined by commas */
    KT_FSDP,     /* fsdp_config: FSDP's options, a mapping or a JSON file's path, read into the fsdp_* fields */
} key_type;

/* Groups of the --help listing, in the order of options.h. G_DATASET keys live inside each datasets entry. */
enum { G_MODEL, G_DATA, G_DATASET, G_BATCH, G_OPTIM, G_OUTPUT, G_GEN, G_MEMORY, G_PLAN, NGROUPS };

/* Where a key's field lives: the run configuration, one datasets entry, or the flags of `snug plan`; SCOPE_ALIAS
 * names the run keys whose field is in opt_aliases (key_spec.alias), for opt_apply_defaults. */
enum { SCOPE_RUN, SCOPE_DATASET, SCOPE_PLAN, SCOPE_ALIAS };

/* Other trainers' spellings of what snug's own keys say, as read (Hugging Face TrainingArguments, Axolotl, DeepSpeed,
 * FSDP): kept here, beside the run configuration, while a configuration is read, then resolved into snug's own
 * fields of snug_run_config once every key is read (opt_apply_deepspeed, opt_apply_fsdp, opt_apply_aliases). Nothing
 * below src/cli reads them. Defaults: opt_aliases_defaults. */
typedef struct opt_aliases {
    int trust_remote_code;    /* either value: snug runs no code of the model's */
    int chat_template_set;    /* 1: the config (or the command line) names the config-wide chat_template */
    char deepspeed[1024];     /* DeepSpeed's ds_config.json ("" = none): its zero_optimization.stage is zero_stage */
    char fsdp[256];           /* FSDP's options as written, joined by commas (shard_grad_op is zero_stage 2) */
    int fsdp_version;         /* Axolotl's fsdp_version, 1 or 2: the same sharding to snug */
    int fsdp_config_stage;    /* the ZeRO stage fsdp_config's sharding_strategy or reshard_after_forward means;
                               * -1: an fsdp_config that names no sharding (FSDP's default, FULL_SHARD); -2: none */
    int fsdp_activation_checkpointing; /* fsdp_config's activation_checkpointing: -1 unset, 0 or 1 */
    int fsdp_offload_params;  /* fsdp_config's offload_params (or cpu_offload) true, or fsdp's offload */
    char report_to[128];      /* trackers, names joined by commas: none or tensorboard (use_tensorboard) */
    int use_cpu;              /* Hugging Face's: device cpu */
    int full_determinism;     /* Hugging Face's: ddp_deterministic */
    int liger_flce;           /* Axolotl's liger_fused_linear_cross_entropy: chunked_cross_entropy */
    int metric_for_best_model; /* 0: eval_loss, the only one */
    int eval_max_new_tokens;  /* Axolotl's tokens per row of eval_table_size's table (no table: it changes nothing) */
    int attn_implementation;  /* -1 unset; 0 eager (the probabilities stored: flash_attention false); 1 a fused kernel
                               * (sdpa, flash_attention_2, ...: flash_attention true) */
    int activation_offloading; /* Axolotl's: gradient_checkpointing offload */
    int attn_sdp, attn_xformers; /* Axolotl's sdp_attention, xformers_attention: true = flash_attention true */
    double min_lr;            /* lr_scheduler_kwargs.min_lr (Hugging Face's cosine_with_min_lr): the floor as a learning
                               * rate, cosine_min_lr_ratio = min_lr / learning_rate (reduce_lr_on_plateau's own floor
                               * under that schedule); -1 = unset */
    unsigned sched_given;     /* which lr_scheduler_kwargs were written (SNUG_SCHED_KW_*), each checked against
                               * the schedules that take it */
} opt_aliases;

/* A configuration being read: the run configuration, and the spellings that resolve into it. */
typedef struct opt_state {
    snug_run_config *run;
    opt_aliases al;
} opt_state;

typedef struct enum_name {
    const char *name;
    int value;
} enum_name;

/* What a KT_MAP or KT_LIST key holds, read by load_map_key. */
typedef enum map_kind {
    KM_NONE,           /* a key not supported yet */
    KM_SPECIAL_TOKENS, /* special_tokens: pad_token, eos_token, bos_token, unk_token */
    KM_CKPT_KWARGS,    /* gradient_checkpointing_kwargs: use_reentrant */
    KM_BNB_KWARGS,     /* bnb_config_kwargs: BitsAndBytesConfig's arguments */
    KM_MESSAGE_FIELDS, /* message_property_mappings: role, content */
    KM_ROLES,          /* roles: system, user, assistant, each a list of the values that mean it */
    KM_ROLES_TO_TRAIN, /* roles_to_train: [assistant] */
    KM_UNFROZEN,       /* unfrozen_parameters: a list of patterns, stored one per line */
    KM_TOKENS,         /* tokens: a list of tokens to add, stored one per line */
    KM_SCHED_KWARGS,   /* lr_scheduler_kwargs: min_lr_rate, min_lr (cosine_with_min_lr's floor), num_cycles 0.5 */
} map_kind;

typedef struct key_spec {
    const char *name;
    const char *aliases;      /* other spellings, space-separated, or NULL */
    key_type type;
    int group;
    size_t offset, size;      /* field in snug_run_config (snug_dataset_spec for G_DATASET, snug_plan_args for
                               * G_PLAN) */
    const char *def;          /* default, written as a user would write it; NULL = none */
    const char *values;       /* KT_ENUM: accepted values, "name" or "spelling=name", space-separated */
    const enum_name *enums;   /* KT_ENUM: each name's value in the field, ending with {NULL} */
    const char *const *names; /* KT_ENUM instead of enums: the enum's own list of names (next to its definition,
                               * ending with NULL), each name's value its index, so reports print the same names */
    int has_min;              /* KT_INT: values below min are refused where they are written */
    int min;
    int positive;             /* KT_FLOAT: only values above 0 */
    const char *example;      /* KT_FLOAT with positive: a value for the error message */
    const char *later_values; /* KT_ENUM: values recognised but not built yet; "*" = every other value */
    const char *off;          /* not-supported keys: values that ask for nothing (besides null, empty and false) */
    const char *later;        /* non-NULL: the key is not supported yet, and this says what it would do */
    const char *noop;         /* non-NULL: any value is accepted (checked for its type) and changes nothing in snug,
                               * for the reason this says (another trainer's knob for what snug does its own way) */
    const char *items;        /* KT_NAMES: what the list holds, in its error (NULL: module names) */
    int (*typed)(snug_run_config *o, const char *text, const char *written, const char *loc, snug_error *e);
                              /* KT_NAMES: reads the value again into its typed field of o (the string stays as
                               * written, for the checkpoint's record); writes nothing on failure; never on an
                               * alias row */
    map_kind map;             /* KT_MAP, KT_LIST: what it holds */
    int alias;                /* 1: the field is in opt_aliases (another trainer's spelling, resolved into
                               * snug_run_config by opt_apply_*), not in snug_run_config; set by the AL_* macros */
    const char *fixed;        /* non-NULL: the setting changes the run's results, so a resumed run must keep it; a
                               * checkpoint records it under this name (its field's, in snug_run_config: never on
                               * an alias row) */
    const char *fixed_absent; /* with fixed: JSON of the value a checkpoint written before it was recorded holds */
    const char *help;
} key_spec;

/* The struct a run key's field lives in: st->al for an alias row, else the run configuration. */
static inline void *opt_field_base(opt_state *st, const key_spec *k) {
    return k->alias ? (void *)&st->al : (void *)st->run;
}

/* ---- the key table (options_keys.c) ---- */

#define OPT_MAX_KEYS 512 /* at least the table's rows (checked where it is defined) */
extern const key_spec opt_keys[];
extern const int opt_nkeys;

/* ---- one value (options_value.c) ---- */

/* Whether lr_scheduler written as s needs its floor given (transformers raises without one). */
int opt_sched_needs_floor(const char *s);
/* Whether the first wlen bytes of w are one of the space-separated words of list; in_list: all of w. */
int opt_word_matches(const char *list, const char *w, size_t wlen);
int opt_in_list(const char *list, const char *w);
/* SCOPE_RUN, SCOPE_DATASET or SCOPE_PLAN. */
int opt_scope_of(const key_spec *k);
/* The key of one scope that answers to name (its name or an alias), or NULL. */
const key_spec *opt_find_key(const char *name, int scope);
/* Case-insensitive Levenshtein distance (long inputs clipped). */
int opt_edit_distance(const char *a, const char *b);
/* Fails naming the unknown key and the closest one of its scope. */
int opt_unknown_key(const char *name, int scope, const char *loc, snug_error *e);
/* Strict number parsers: 0 on success (parse_int: -1 not whole, -2 out of range). */
int opt_parse_double(const char *s, double *out);
int opt_parse_int(const char *s, int *out);
int opt_parse_bool(const char *s, int *out);
/* The canonical value of an enum spelling into canon; -1 for none ("adamw_torch=adamw" maps adamw_torch to adamw). */
int opt_enum_value(const char *values, const char *s, char *canon, size_t cap);
/* The canonical values of `values` joined by sep (all_spellings: every spelling). */
void opt_enum_choices(const char *values, const char *sep, int all_spellings, char *out, size_t cap);
/* "an integer", "one of a, b, c"... for errors. */
const char *opt_type_phrase(const key_spec *k, char *buf, size_t cap);
/* Sets one supported scalar key of base (snug_run_config, snug_dataset_spec or snug_plan_args as its scope says)
 * from text; writes nothing on failure. */
int opt_set_text(void *base, const key_spec *k, const char *written, const char *text, const char *loc,
                 snug_error *e);
/* A key not supported yet: fine when its value asks for nothing (text NULL for a list or mapping). */
int opt_refuse_later(const key_spec *k, const char *written, const char *text, int nothing, const char *loc,
                     snug_error *e);
/* A key that changes nothing: its value checked for its type, then dropped. */
int opt_noop_value(const key_spec *k, const char *written, const char *text, int null, const char *loc,
                   snug_error *e);
/* Every key of one scope set to its default (SCOPE_RUN: the rows whose field is in snug_run_config; SCOPE_ALIAS:
 * those in opt_aliases). */
void opt_apply_defaults(void *base, int scope);
/* opt_aliases at its defaults: the table's, and "not given" for what no row sets. */
void opt_aliases_defaults(opt_aliases *al);

/* One list of dataset entries: datasets (training) or test_datasets (validation). */
typedef struct ds_list {
    snug_dataset_spec *d;
    int *n;
    const char *key;
} ds_list;

ds_list opt_list_of(snug_run_config *o, const key_spec *k);
/* 1 when a relative path written in a config file in folder dir is taken relative to dir: it is not found from the
 * current directory (where Axolotl looks, and snug first). */
int opt_path_from_file(const char *path, const char *dir);
/* Adds a completion dataset; a relative path is taken relative to dir ("" = keep it as written) when
 * opt_path_from_file says so. */
int opt_add_dataset_path(ds_list l, const char *path, const char *dir, const char *loc, snug_error *e);

/* ---- YAML (options_yaml.c) ---- */

typedef struct yaml_src {
    const char *path;     /* the config file, as given */
    char dir[1024];       /* its folder, "" when it is in the current directory */
    yaml_document_t *doc;
} yaml_src;

/* Reads a YAML file's keys over st, as written: the other trainers' spellings are left in st->al for opt_apply_*
 * (the public loaders, options_args.c, resolve them once everything is read). st is unchanged when it fails. */
int opt_load_yaml(opt_state *st, const char *path, snug_error *e);

/* YAML nodes (options_value.c) */
int opt_node_is_null(const yaml_node_t *n);
int opt_node_is_empty(const yaml_node_t *n);
/* "a list", "a mapping" or "a value", for errors. */
const char *opt_node_kind(const yaml_node_t *n);
/* The text of a scalar node, or NULL (with e filled) when it holds a NUL byte. */
const char *opt_node_text(const yaml_node_t *n, const char *written, const char *loc, snug_error *e);

/* ---- other trainers' spellings (options_compat.c) ---- */

/* fsdp_config in the YAML (a mapping, or a JSON file's path), or as a JSON file from the command line. */
int opt_load_fsdp_config(opt_aliases *al, const char *written, const yaml_src *y, const yaml_node_t *v,
                         const char *loc, snug_error *e);
int opt_fsdp_config_file(opt_aliases *al, const char *path, const char *where, snug_error *e);
/* Resolved once every key is read, into st->run: deepspeed's file, fsdp and fsdp_config, then the aliases. */
int opt_apply_deepspeed(opt_state *st, snug_error *e);
int opt_apply_fsdp(opt_state *st, snug_error *e);
int opt_apply_aliases(opt_state *st, snug_error *e);

/* ---- the command line (options_args.c) ---- */

/* One key + value (as from the command line) into st, with the same checks as the YAML; `where` names the source in
 * errors. Dashes in key count as underscores (--learning-rate). Key "dataset"/"datasets" appends one completion
 * dataset with the path kept as written. */
int opt_set(opt_state *st, const char *key, const char *value, const char *where, snug_error *e);

/* ---- help (options_help.c) ---- */

void opt_print_key(FILE *f, const key_spec *k);

#endif
