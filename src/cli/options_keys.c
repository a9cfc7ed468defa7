/* options_keys.c: the table of every key a user can write (see options.h): its name and other spellings (Hugging
 * Face TrainingArguments, TRL), its type, where it lives (snug_run_config; opt_aliases for another trainer's key that
 * the command line resolves into snug's own: the AL_* rows), its default, one line of help, and
 * whether snug does it yet. Defaults, parsing, type errors, the "did you mean" suggestion, the refusal of features not
 * built and the --help listing all read this one table (through options_impl.h), so they cannot disagree.
 *
 * A key of a feature snug has not built is recognised and refused ("bf16 is not supported yet"), never silently
 * ignored; but a value that asks for nothing (`bf16: false`, an empty `wandb_project:`) is accepted, so existing
 * Axolotl configs load unchanged when they only switch such features off. */
#include "cli/options_impl.h"

#include "cli/plan_cmd.h"
#include "plan/plan_json.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/peft_io.h"

/* Field placement with a compile-time type check: a row whose type disagrees with its field does not compile. */
#define AT_INT(f) .offset = _Generic(((snug_run_config *)0)->f, int: offsetof(snug_run_config, f)), .size = sizeof(int)
#define AT_DBL(f) .offset = _Generic(((snug_run_config *)0)->f, double: offsetof(snug_run_config, f)), .size = sizeof(double)
#define AT_STR(f) \
    .offset = _Generic(((snug_run_config *)0)->f, char *: offsetof(snug_run_config, f)), .size = sizeof(((snug_run_config *)0)->f)
#define ENUM_SIZE_CHECK(T, f) (sizeof(int) + 0 * sizeof(char[sizeof(((T *)0)->f) == sizeof(int) ? 1 : -1]))
#define AT_ENUM(f) .offset = offsetof(snug_run_config, f), .size = ENUM_SIZE_CHECK(snug_run_config, f)
#define DS_ENUM(f) .offset = offsetof(snug_dataset_spec, f), .size = ENUM_SIZE_CHECK(snug_dataset_spec, f)
/* The same for a field of opt_aliases (another trainer's spelling, resolved into snug_run_config by opt_apply_*). */
#define AL_INT(f) \
    .alias = 1, .offset = _Generic(((opt_aliases *)0)->f, int: offsetof(opt_aliases, f)), .size = sizeof(int)
#define AL_STR(f)                                                                      \
    .alias = 1, .offset = _Generic(((opt_aliases *)0)->f, char *: offsetof(opt_aliases, f)), \
    .size = sizeof(((opt_aliases *)0)->f)
#define AL_ENUM(f) .alias = 1, .offset = offsetof(opt_aliases, f), .size = ENUM_SIZE_CHECK(opt_aliases, f)
#define ENUMS(...) .enums = (const enum_name[]){__VA_ARGS__, {NULL, 0}}
#define NAMES(list) .names = (list)
#define MIN(v) .has_min = 1, .min = (v)
#define PL_AT(T, f) .offset = offsetof(snug_plan_args, f), .size = sizeof(((snug_plan_args *)0)->f)
#define DS_STR(f)                                                                  \
    .offset = _Generic(((snug_dataset_spec *)0)->f, char *: offsetof(snug_dataset_spec, f)), \
    .size = sizeof(((snug_dataset_spec *)0)->f)

/* ---- the typed readers (key_spec.typed) ---- */

/* resume_from_checkpoint: latest (true's canonical spelling) asks for the newest complete checkpoint, whatever its
 * folder; any other text is a folder. */
static int read_resume(snug_run_config *o, const char *text, const char *written, const char *loc, snug_error *e) {
    (void)written, (void)loc, (void)e;
    o->resume_latest = !strcmp(text, "latest");
    return 0;
}

/* peft_layers_to_transform ("1,3"; "" = every layer) into lora_layer_mask; the model's own count is checked where it
 * is known (snug_setup_resolve). */
static int read_layers(snug_run_config *o, const char *text, const char *written, const char *loc, snug_error *e) {
    uint64_t mask[4] = {0};
    for (const char *p = text; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, ", ");
        char *end;
        long v = strtol(p, &end, 10);
        if (end != p + len || v < 0 || v >= 256)
            return snug_fail(e, SNUG_EINPUT, "%s: %s names '%.*s'; list layer indices from 0 (at most 255, and below "
                             "the model's layers)", loc, written, (int)(len < 60 ? len : 60), p);
        mask[v / 64] |= 1ull << (v % 64);
        p += len;
    }
    memcpy(o->lora_layer_mask, mask, sizeof mask);
    return 0;
}

/* pipeline_layers ("3,1"; "" = an even split) into pipeline_stage_layers: counts of at least 1; how many there are
 * is checked against pipeline_parallel_size with the rest of the configuration (snug_run_config_validate). */
static int read_stage_layers(snug_run_config *o, const char *text, const char *written, const char *loc,
                             snug_error *e) {
    int counts[SNUG_MAX_PP_LIST], n = 0;
    for (const char *p = text; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, ", ");
        char *end;
        long v = strtol(p, &end, 10);
        if (end != p + len || v < 1 || v > 1000000)
            return snug_fail(e, SNUG_EINPUT, "%s: %s lists '%.*s'; list each stage's count of layers, each at least "
                             "1, e.g. [2, 3, 3, 2] for 10 layers over 4 stages", loc, written,
                             (int)(len < 60 ? len : 60), p);
        if (n == SNUG_MAX_PP_LIST)
            return snug_fail(e, SNUG_EINPUT, "%s: %s lists more than %d stages", loc, written, SNUG_MAX_PP_LIST);
        counts[n++] = (int)v;
        p += len;
    }
    if (!n && *text)
        return snug_fail(e, SNUG_EINPUT, "%s: %s lists no count; list each stage's count of layers, or remove it for "
                         "an even split", loc, written);
    memcpy(o->pipeline_stage_layers, counts, (size_t)n * sizeof *counts);
    o->pipeline_nstage_layers = n;
    return 0;
}

/* lora_modules_to_save ("embed_tokens, lm_head") into lora_save_modules. */
static int read_save_modules(snug_run_config *o, const char *text, const char *written, const char *loc,
                             snug_error *e) {
    unsigned save;
    char unknown[64];
    if (snug_lora_save_parse(text, &save, unknown, sizeof unknown))
        return snug_fail(e, SNUG_EINPUT, "%s: %s names '%s'; snug trains embed_tokens and lm_head in full, nothing "
                         "else", loc, written, unknown);
    o->lora_save_modules = save;
    return 0;
}

#define LATER_BOOL(n, why) {.name = n, .type = KT_BOOL, .later = why}
#define NOOP(n, t, why) {.name = n, .type = t, .noop = why}
#define LATER(n, t, why) {.name = n, .type = t, .later = why}
#define CHAT_TEMPLATE_VALUES                                                                                  \
    .values = "tokenizer_default tokenizer_default_fallback_chatml tokenizer_default_fallback_llama3 chatml "  \
              "llama3 jinja",                                                                                  \
    ENUMS({"tokenizer_default", SNUG_CHAT_TOKENIZER}, {"tokenizer_default_fallback_chatml",                    \
                                                       SNUG_CHAT_TOKENIZER_OR_CHATML},                         \
          {"tokenizer_default_fallback_llama3", SNUG_CHAT_TOKENIZER_OR_LLAMA3}, {"chatml", SNUG_CHAT_CHATML},  \
          {"llama3", SNUG_CHAT_LLAMA3}, {"jinja", SNUG_CHAT_JINJA}),                                           \
    .later_values = "*"

const key_spec opt_keys[] = {
    /* model */
    {.name = "base_model", .aliases = "model_name_or_path", .type = KT_STRING, .group = G_MODEL, AT_STR(base_model),
     .fixed = "base_model",
     .def = "", .help = "Hugging Face model folder to fine-tune; empty = train model_preset from scratch"},
    {.name = "model_preset", .type = KT_STRING, .group = G_MODEL, AT_STR(model_preset),
     .fixed = "model_preset", .def = "tiny-llama",
     .help = "built-in architecture trained from scratch when base_model is empty"},
    {.name = "model_type", .type = KT_STRING, .group = G_MODEL, AT_STR(model_class), .def = "",
     .help = "the transformers class (Axolotl's): AutoModelForCausalLM, or the one config.json's architectures "
             "names (LlamaForCausalLM, ...); empty = config.json's"},
    {.name = "tokenizer", .aliases = "tokenizer_config tokenizer_name", .type = KT_STRING, .group = G_MODEL,
     AT_STR(tokenizer), .def = "", .help = "tokenizer folder or tokenizer.json; empty = base_model's, or the built-in one"},

    /* data */
    {.name = "datasets", .aliases = "dataset", .type = KT_DATASETS, .group = G_DATA,
     .help = "training data, a list of entries (keys below); --dataset FILE.jsonl on the command line replaces "
             "it (repeat to add more), and --dataset_type TYPE (a datasets[].type value) sets the type of the "
             "files given so, completion when absent"},
    {.name = "test_datasets", .type = KT_DATASETS, .group = G_DATA,
     .help = "the validation set from these files instead of val_set_size's split (entries as under datasets; "
             "--test_datasets FILE.jsonl on the command line)"},
    {.name = "sequence_len", .aliases = "max_seq_length max_length", .type = KT_INT, .group = G_DATA,
     AT_INT(sequence_len), .fixed = "sequence_len",
     .def = "256", MIN(2), .help = "tokens per training row (the context length trained)"},
    {.name = "val_set_size", .type = KT_FLOAT, .group = G_DATA, AT_DBL(val_set_size),
     .fixed = "val_set_size", .def = "0",
     .help = "examples held out for evaluation: a fraction (< 1) or a count (>= 1); 0 = none"},
    {.name = "dataset_exact_deduplication", .type = KT_BOOL, .group = G_DATA, AT_INT(dataset_exact_deduplication),
     .fixed = "dataset_exact_deduplication",
     .def = "false", .help = "keep one of the examples that tokenize the same (tokens and targets), before the "
                             "validation split; test_datasets' examples that training has are dropped from them"},
    {.name = "train_on_inputs", .type = KT_BOOL, .group = G_DATA, AT_INT(train_on_inputs),
     .fixed = "train_on_inputs", .def = "false",
     .help = "also train on prompt, system and user tokens (alpaca, chat); the response and its EOS always are"},
    {.name = "long_examples", .type = KT_ENUM, .group = G_DATA, AT_ENUM(long_examples),
     .fixed = "long_examples", .def = "truncate",
     .values = "truncate drop", ENUMS({"truncate", SNUG_LONG_TRUNCATE}, {"drop", SNUG_LONG_DROP}), .help = "an example longer than sequence_len is truncated to it, or dropped"},
    {.name = "skip_bad_examples", .type = KT_BOOL, .group = G_DATA, AT_INT(skip_bad_examples),
     .fixed = "skip_bad_examples", .def = "false",
     .help = "skip malformed dataset lines and report how many; false = stop at the first with its file and line"},
    {.name = "dataset_prepared_path", .type = KT_STRING, .group = G_DATA, AT_STR(dataset_prepared_path),
     .def = "last_run_prepared",
     .help = "folder of the tokenized-data cache (relative to the current directory); reused while the data, "
             "tokenizer and options are unchanged"},
    {.name = "chat_template", .type = KT_ENUM, .group = G_DATA, AT_ENUM(chat_template),
     .def = "tokenizer_default_fallback_chatml", CHAT_TEMPLATE_VALUES,
     .help = "the template of every chat dataset entry that names none: tokenizer_default (the tokenizer's own "
             "chat_template.jinja or tokenizer_config.json chat_template, run as Jinja), "
             "tokenizer_default_fallback_chatml (its own, else chatml; _llama3: else llama3), chatml, llama3 (built "
             "in), or jinja "
             "(chat_template_jinja)"},
    {.name = "chat_template_jinja", .type = KT_STRING, .group = G_DATA, AT_STR(chat_template_jinja), .def = "",
     .help = "a chat template in Jinja, its text or a file (relative to the YAML file's folder), for chat_template: "
             "jinja (setting it alone implies that)"},
    {.name = "special_tokens", .type = KT_MAP, .group = G_DATA, .map = KM_SPECIAL_TOKENS,
     .help = "tokens that take a role: pad_token (pads batches; saved with the tokenizer), eos_token (ends every "
             "completion and alpaca example, stops generation; saved too); bos_token and unk_token only as the "
             "tokenizer's own; additional_special_tokens: a list added as special tokens. A token the tokenizer lacks "
             "is added as Axolotl adds it (the next id: the embedding and lm_head grow, see mean_resizing_embeddings)"},
    {.name = "tokens", .type = KT_LIST, .group = G_DATA, .map = KM_TOKENS, AT_STR(tokens), .fixed = "tokens",
     .fixed_absent = "\"\"",
     .help = "tokens added to the tokenizer (not special; Axolotl's add_tokens), each the next id where it has none; "
             "the embedding and lm_head grow to the new vocabulary"},
    {.name = "mean_resizing_embeddings", .type = KT_BOOL, .group = G_DATA, AT_INT(mean_resizing_embeddings),
     .fixed = "mean_resizing_embeddings", .fixed_absent = "false", .def = "false",
     .help = "rows that added tokens grow start at the mean of the old rows (transformers' mean_resizing); false (as "
             "Axolotl): drawn normal(0, initializer_range) from the seed"},
    {.name = "resize_token_embeddings_to_32x", .type = KT_BOOL, .group = G_DATA, AT_INT(resize_to_32x),
     .fixed = "resize_token_embeddings_to_32x", .fixed_absent = "false", .def = "false",
     .help = "the embedding and lm_head grow to the tokenizer's size rounded up to a multiple of 32 (Axolotl's)"},
    {.name = "debug", .type = KT_BOOL, .group = G_DATA, AT_INT(debug), .def = "false",
     .help = "print the first 3 examples token by token with their mask before training (snug preprocess --debug)"},

    /* each datasets entry */
    {.name = "path", .type = KT_STRING, .group = G_DATASET, DS_STR(path),
     .help = "JSONL file, one example per line; a relative path is the current directory's (as Axolotl reads it), "
             "else the YAML file's folder's"},
    {.name = "type", .type = KT_ENUM, .group = G_DATASET, DS_ENUM(type), .def = "completion",
     .values = "completion alpaca chat chat_template=chat pretokenized input_output",
     ENUMS({"completion", SNUG_DATA_COMPLETION}, {"alpaca", SNUG_DATA_ALPACA}, {"chat", SNUG_DATA_CHAT},
           {"pretokenized", SNUG_DATA_PRETOKENIZED}, {"input_output", SNUG_DATA_INPUT_OUTPUT}),
     .later_values = "sharegpt",
     .help = "completion: {\"text\"} trained on every token; alpaca: {\"instruction\", \"input\", \"output\"}; "
             "chat: {\"messages\": [{\"role\", \"content\"}]}; pretokenized: {\"input_ids\", \"labels\"}; "
             "input_output: {\"segments\": [{\"label\", \"text\"}]}, each segment tokenized alone, trained on where "
             "label is true"},
    {.name = "field", .type = KT_STRING, .group = G_DATASET, DS_STR(field), .def = "text",
     .help = "the JSON field that holds the text (completion)"},
    {.name = "chat_template", .type = KT_ENUM, .group = G_DATASET, DS_ENUM(chat_template),
     .def = "tokenizer_default_fallback_chatml", CHAT_TEMPLATE_VALUES,
     .help = "the template of a chat dataset (the values of the config-wide chat_template); unset = the config-wide "
             "one"},
    {.name = "chat_template_jinja", .type = KT_STRING, .group = G_DATASET,
     .later = "a Jinja chat template per dataset entry; set chat_template_jinja once for the whole config (the "
              "entries with chat_template: jinja use it)"},
    {.name = "split", .type = KT_STRING, .group = G_DATASET, .off = "train",
     .later = "splits of Hugging Face hub datasets; snug reads local JSONL files"},
    {.name = "name", .type = KT_STRING, .group = G_DATASET,
     .later = "configurations of Hugging Face hub datasets; snug reads local JSONL files"},
    {.name = "data_files", .type = KT_LIST, .group = G_DATASET,
     .later = "several files per entry; give each file its own entry"},
    {.name = "ds_type", .type = KT_STRING, .group = G_DATASET, .off = "json",
     .later = "formats other than JSONL"},
    {.name = "field_messages", .type = KT_STRING, .group = G_DATASET, DS_STR(field_messages), .def = "messages",
     .help = "chat: the field of a line that holds its list of messages (ShareGPT's: conversations)"},
    {.name = "message_field_role", .type = KT_STRING, .group = G_DATASET, DS_STR(field_role), .def = "role",
     .help = "chat: the field of a message that holds its role (ShareGPT's: from)"},
    {.name = "message_field_content", .type = KT_STRING, .group = G_DATASET, DS_STR(field_content),
     .def = "content", .help = "chat: the field of a message that holds its text (ShareGPT's: value)"},
    {.name = "message_property_mappings", .type = KT_MAP, .group = G_DATASET, .map = KM_MESSAGE_FIELDS,
     .help = "chat: {role: FIELD, content: FIELD}, the same as message_field_role and message_field_content"},
    {.name = "roles", .type = KT_MAP, .group = G_DATASET, .map = KM_ROLES,
     .help = "chat: the role values that mean each role, {user: [human, user], assistant: [gpt, assistant], system: "
             "[system]} (that is the default; given, only the values listed are read)"},
    {.name = "roles_to_train", .type = KT_LIST, .group = G_DATASET, .map = KM_ROLES_TO_TRAIN,
     .help = "chat: [assistant], the roles trained on (every role with train_on_inputs); other lists are not "
             "supported yet"},

    /* batch & schedule */
    {.name = "micro_batch_size", .aliases = "per_device_train_batch_size", .type = KT_INT, .group = G_BATCH,
     AT_INT(micro_batch_size),
     .fixed = "micro_batch_size", .def = "4", MIN(1), .help = "examples per forward/backward pass"},
    {.name = "sample_packing", .aliases = "packing", .type = KT_BOOL, .group = G_BATCH, AT_INT(sample_packing),
     .fixed = "sample_packing",
     .def = "false",
     .help = "pack several examples into each row of sequence_len tokens (first-fit decreasing), attention and "
             "positions kept per example; false = one example per row, padded"},
    {.name = "group_by_length", .type = KT_BOOL, .group = G_BATCH, AT_INT(group_by_length),
     .fixed = "group_by_length", .def = "false",
     .help = "without packing: put examples of similar length in the same micro-batch (less padding)"},
    {.name = "pad_to_sequence_len", .type = KT_BOOL, .group = G_BATCH, AT_INT(pad_to_sequence_len),
     .fixed = "pad_to_sequence_len",
     .def = "false", .help = "pad every row to sequence_len; false = to the longest example of the micro-batch"},
    {.name = "pad_to_multiple_of", .type = KT_INT, .group = G_BATCH, AT_INT(pad_to_multiple_of),
     .fixed = "pad_to_multiple_of", .def = "0",
     .help = "round a padded micro-batch's length up to a multiple of this; 0 = no rounding"},
    {.name = "concatenate", .type = KT_BOOL, .group = G_BATCH, AT_INT(concatenate),
     .fixed = "concatenate", .def = "false",
     .help = "join all examples into one stream cut into rows (pretraining style): no padding, but tokens attend "
             "to and predict across example boundaries"},
    {.name = "ddp", .type = KT_BOOL, .group = G_BATCH, AT_INT(ddp), .def = "true",
     .help = "data parallel over the ranks of `mpirun -np N snug train` (or srun): each rank takes its share of "
             "the global batch (micro_batch_size x gradient_accumulation_steps x N rows) by global sample index, "
             "and the gradients are summed over the ranks before each step"},
    {.name = "ddp_backend", .type = KT_ENUM, .group = G_BATCH, AT_ENUM(ddp_backend), .def = "auto",
     .values = "auto nccl mpi", ENUMS({"auto", SNUG_DDP_BACKEND_AUTO}, {"nccl", SNUG_DDP_BACKEND_NCCL},
                                      {"mpi", SNUG_DDP_BACKEND_MPI}), .later_values = "gloo ccl hccl cncl mccl xccl",
     .help = "how the ranks talk: nccl (device buffers between GPUs; with one rank on a GPU, a communicator of size "
             "1), mpi (host buffers between CPU ranks), or auto: nccl on GPUs, mpi on CPUs"},
    {.name = "ddp_deterministic", .type = KT_BOOL, .group = G_BATCH, AT_INT(ddp_deterministic), .def = "false",
     .help = "sum the ranks' gradients in rank order (gathered, then added), so N ranks give the bits of one "
             "process accumulating N micro-batches; costs N times the all-reduce's traffic"},
    {.name = "ddp_bucket_cap_mb", .type = KT_INT, .group = G_BATCH, AT_INT(ddp_bucket_cap_mb), .def = "25", MIN(1),
     .help = "MiB of gradients per bucket: DDP (and ZeRO-1) sums the gradients during the last micro-batch's "
             "backward, a bucket of consecutive layers at a time as backward completes them (on GPUs beside the rest "
             "of backward)"},
    {.name = "zero_overlap_comm", .type = KT_ENUM, .group = G_BATCH, AT_ENUM(zero_overlap_comm), .def = "auto",
     .values = "auto true false", ENUMS({"auto", SNUG_OVERLAP_AUTO}, {"true", SNUG_OVERLAP_ON},
                                        {"false", SNUG_OVERLAP_OFF}),
     .help = "ZeRO-2/3: reduce-scatter each layer's gradients while backward computes the next layer, from a second "
             "layer gradient buffer (one layer of fp32 gradients more per rank, in the plan); auto: on GPUs (NCCL sums "
             "on its own stream), off on CPU ranks, whose collectives run in line and gain nothing from it"},
    {.name = "dist_debug", .type = KT_BOOL, .group = G_BATCH, AT_INT(dist_debug), .def = "false",
     .help = "compare every collective's signature (order, kind, count, type) across the ranks first and fail "
             "naming the mismatch instead of hanging"},
    {.name = "dist_timeout", .type = KT_FLOAT, .group = G_BATCH, AT_DBL(dist_timeout), .def = "600", MIN(0),
     .help = "seconds a collective may wait for the other ranks before the run fails on every rank; 0 = forever"},
    {.name = "deepspeed", .type = KT_STRING, .group = G_BATCH, AL_STR(deepspeed),
     .help = "DeepSpeed's ds_config.json: its zero_optimization.stage sets zero_stage, its overlap_comm "
             "zero_overlap_comm, offload_param to cpu offload_params and offload_optimizer to cpu a paged optimizer "
             "(nvme is refused; the file's other settings are DeepSpeed's own and are not read)"},
    {.name = "fsdp", .type = KT_NAMES, .group = G_BATCH, AL_STR(fsdp), .items = "FSDP options",
     .help = "FSDP's sharding, as Hugging Face's Trainer takes it: full_shard is zero_stage 3, shard_grad_op 2, "
             "no_shard 0, auto_wrap is accepted (snug shards and reduces layer by layer anyway); true takes the "
             "strategy from fsdp_config (FULL_SHARD when it names none); offload is offload_params"},
    {.name = "fsdp_config", .type = KT_FSDP, .group = G_BATCH,
     .help = "FSDP's options: a mapping (Axolotl) or a JSON file (Hugging Face's --fsdp_config), keys with or without "
             "the fsdp_ prefix. sharding_strategy FULL_SHARD (or reshard_after_forward: true, FSDP2's default) is "
             "zero_stage 3, SHARD_GRAD_OP (false) 2, NO_SHARD 0; activation_checkpointing: true is "
             "gradient_checkpointing full; auto_wrap_policy TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP, "
             "transformer_layer_cls_to_wrap, min_num_params, backward_prefetch, forward_prefetch, limit_all_gathers, "
             "use_orig_params, sync_module_states, cpu_ram_efficient_loading, state_dict_type (FULL_ or "
             "SHARDED_STATE_DICT) and version are accepted: snug gathers and reduces one decoder layer at a time, "
             "prefetches the next, loads every rank from the file block by block, checkpoints each rank's shards and "
             "writes the final model whole; offload_params (or cpu_offload) is offload_params; hybrid sharding and "
             "xla are refused"},
    {.name = "fsdp_version", .type = KT_INT, .group = G_BATCH, AL_INT(fsdp_version), .def = "2", MIN(1),
     .help = "Axolotl's FSDP version, 1 or 2: both shard the same way in snug"},
    {.name = "zero_stage", .type = KT_INT, .group = G_BATCH, AT_INT(zero_stage), .def = "0", MIN(0),
     .help = "ZeRO over the ranks: 1 = each rank keeps the optimizer state of 1/N of the parameters, steps only those "
             "after a reduce-scatter of the gradients and all-gathers the updated parameters (the same results as "
             "ddp); 2 = also the gradients: each layer's are reduce-scattered as backward completes them, every "
             "micro-batch, into the rank's shard; 3 = also the parameters: each layer is all-gathered before its forward "
             "and its backward, the global tensors before the embedding and the loss (its checkpoints keep each "
             "rank's shards and no model files; under LoRA it shards the frozen base alone); 0 = every rank holds "
             "everything"},
    {.name = "tensor_parallel_size", .type = KT_INT, .group = G_BATCH, AT_INT(tensor_parallel_size),
     .fixed = "tensor_parallel_size", .fixed_absent = "1", .def = "1",
     MIN(1),
     .help = "tensor parallelism (Megatron's layout) over that many ranks, launched as mpirun -np N: each rank holds "
             "1/N of every block's attention heads and MLP rows (q/k/v and gate/up split by rows, o_proj and "
             "down_proj by columns) with their gradients and optimizer state, and every rank runs the same "
             "micro-batches; each block's two outputs and, in backward, the gradients of its two norm outputs are "
             "summed over the ranks; on the CPU a vocabulary that divides by N is split too (embedding and head by "
             "rows, the loss's statistics gathered). Llama-family and GPT-2 models with heads, key/value heads and "
             "intermediate_size divisible by N; full fine-tuning; a multiple of N ranks (groups of N consecutive "
             "ranks, data parallel across the groups, on CPU ranks for now, with zero_stage 1 to 3 sharding the "
             "slices' state over them); checkpoints keep each rank's slices, the final model is written whole"},
    {.name = "pipeline_parallel_size", .type = KT_INT, .group = G_BATCH, AT_INT(pipeline_parallel_size),
     .fixed = "pipeline_parallel_size", .fixed_absent = "1",
     .def = "1", MIN(1),
     .help = "pipeline parallelism over that many ranks, launched as mpirun -np N: the layers are split into N "
             "consecutive stages (the first also holds the embedding, the last the final norm, the head and the "
             "loss; a tied head is kept on both, its gradient summed), each rank keeping its stage's parameters, "
             "gradients and optimizer state; the micro-batches of a step (gradient_accumulation_steps, at least N "
             "to keep every stage busy) flow through the stages in the 1F1B schedule, activations sent forward and "
             "their gradients back; a stage keeps the activations of each micro-batch in flight (N - stage of "
             "them; pipeline_recompute: true keeps their inputs alone). The same bits as one process accumulating the "
             "same micro-batches (an untied head). Full fine-tuning, LoRA or QLoRA, on CPU ranks for now; a "
             "multiple of N ranks (groups of N consecutive ranks, data parallel across the groups, zero_stage 1 or 2 "
             "sharding each stage's state over them with an untied head); checkpoints keep "
             "each stage's state, the final model (or adapter) is written whole"},
    {.name = "pipeline_layers", .type = KT_NAMES, .group = G_BATCH, AT_STR(pipeline_layers),
     .fixed = "pipeline_layers", .fixed_absent = "\"\"", .def = "",
     .items = "numbers", .typed = read_stage_layers,
     .help = "under pipeline_parallel_size N: how many layers each stage takes, N counts (a YAML list, or "
             "separated by commas) that sum to the model's layers, e.g. [7, 9, 9, 7] to give the stages that also "
             "hold the embedding and the head fewer; empty = an even split (the remainder one more each on the "
             "stages after the first)"},
    {.name = "pipeline_recompute", .type = KT_BOOL, .group = G_BATCH, AT_INT(pipeline_recompute), .def = "false",
     .help = "under pipeline_parallel_size: a stage before the last keeps only each micro-batch's input and runs its "
             "forward again just before that micro-batch's backward (GPipe's re-materialisation: the activations of "
             "one micro-batch instead of one per micro-batch in flight, N - stage of them, for one more forward on "
             "those stages); the same bits either way"},
    {.name = "gradient_accumulation_steps", .type = KT_INT, .group = G_BATCH, AT_INT(gradient_accumulation_steps),
     .fixed = "gradient_accumulation_steps",
     .def = "1", MIN(1), .help = "micro-batches per optimizer step (batch = micro_batch_size x this)"},
    {.name = "num_epochs", .aliases = "num_train_epochs", .type = KT_INT, .group = G_BATCH, AT_INT(num_epochs),
     .def = "1", .help = "passes over the training data (used when max_steps is -1)"},
    {.name = "max_steps", .type = KT_INT, .group = G_BATCH, AT_INT(max_steps), .def = "-1",
     .help = "optimizer steps to run; -1 = as many as num_epochs gives"},
    {.name = "learning_rate", .type = KT_FLOAT, .group = G_BATCH, AT_DBL(learning_rate), .def = "3e-4",
     .help = "peak learning rate, reached after warmup"},
    {.name = "lr_scheduler", .aliases = "lr_scheduler_type", .type = KT_ENUM, .group = G_BATCH, AT_ENUM(lr_scheduler),
     .fixed = "lr_scheduler",
     .def = "cosine",
     .values = "cosine cosine_with_min_lr=cosine linear constant constant_with_warmup cosine_with_restarts polynomial "
               "inverse_sqrt warmup_stable_decay reduce_lr_on_plateau cosine_warmup_with_min_lr rex",
     NAMES(snug_sched_names),
     .later_values = "one_cycle",
     .help = "transformers' schedules, bit for bit: after warmup, cosine or linear decay to 0, constant (no warmup; "
             "constant_with_warmup has one), cosine_with_restarts, polynomial, inverse_sqrt, warmup_stable_decay, "
             "reduce_lr_on_plateau (no warmup; times factor when the validation loss stops improving), "
             "cosine_warmup_with_min_lr; Axolotl's rex (to cosine_min_lr_ratio); their settings in "
             "lr_scheduler_kwargs"},
    {.name = "lr_scheduler_kwargs", .type = KT_MAP, .group = G_BATCH, .map = KM_SCHED_KWARGS,
     .help = "transformers' scheduler_specific_kwargs: cosine and cosine_with_min_lr {min_lr_rate: r} "
             "(cosine_min_lr_ratio), {min_lr: lr}, num_cycles (0.5); cosine_with_restarts num_cycles (1); polynomial "
             "power (1.0), lr_end (1e-7); inverse_sqrt timescale (the warmup steps); warmup_stable_decay "
             "num_decay_steps (required), num_stable_steps (the rest), warmup_type and decay_type (linear, cosine, "
             "1-sqrt), min_lr_ratio (0), num_cycles (0.5); reduce_lr_on_plateau mode (min), factor (0.1), patience "
             "(10), threshold (1e-4), threshold_mode (rel), cooldown (0), min_lr (0), eps (1e-8); "
             "cosine_warmup_with_min_lr min_lr_rate or min_lr (one required), num_cycles (0.5), warmup_lr_rate"},
    {.name = "lr_quadratic_warmup", .type = KT_BOOL, .group = G_BATCH, AT_INT(sched.quadratic_warmup), .def = "false",
     .help = "Axolotl's: cosine's warmup rises as (step / warmup)^2, then the cosine decays to 0 (no floor)"},
    {.name = "cosine_constant_lr_ratio", .type = KT_FLOAT, .group = G_BATCH, AT_DBL(sched.constant_ratio), .def = "0",
     .help = "Axolotl's, with cosine_min_lr_ratio: the cosine reaches its floor at this fraction of the steps and "
             "stays there (0 to 1; 0 = off)"},
    {.name = "cosine_min_lr_ratio", .type = KT_FLOAT, .group = G_BATCH, AT_DBL(cosine_min_lr_ratio), .def = "0",
     .help = "Axolotl's: cosine decays to this fraction of learning_rate instead of 0 (0 to 1)"},
    {.name = "warmup_steps", .type = KT_INT, .group = G_BATCH, AT_INT(warmup_steps),
     .fixed = "warmup_steps", .def = "0",
     .help = "steps of linear warmup from 0 to learning_rate"},
    {.name = "warmup_ratio", .type = KT_FLOAT, .group = G_BATCH, AT_DBL(warmup_ratio),
     .fixed = "warmup_ratio", .def = "0",
     .help = "warmup as a fraction of all steps, used when warmup_steps is 0"},

    /* optimizer */
    {.name = "optimizer", .aliases = "optim", .type = KT_ENUM, .group = G_OPTIM, AT_ENUM(optimizer),
     .fixed = "optimizer", .def = "adamw",
     .values = "adamw adamw_torch=adamw adamw_torch_fused=adamw adamw_8bit adamw_bnb_8bit=adamw_8bit "
               "paged_adamw_8bit paged_adamw_32bit",
     ENUMS({"adamw", SNUG_OPTIMIZER_ADAMW}, {"adamw_8bit", SNUG_OPTIMIZER_ADAMW_8BIT},
           {"paged_adamw_8bit", SNUG_OPTIMIZER_PAGED_ADAMW_8BIT}, {"paged_adamw_32bit", SNUG_OPTIMIZER_PAGED_ADAMW_32BIT}),
     .later_values = "*",
     .help = "AdamW with decoupled weight decay (adamw_torch and adamw_torch_fused mean the same); adamw_8bit "
             "(adamw_bnb_8bit): bitsandbytes' 8-bit blockwise moments, ~2 bytes of state per parameter instead of 8; "
             "paged_*: the state in host memory, streamed through the device in chunks"},
    {.name = "optimizer_in_backward", .type = KT_BOOL, .group = G_OPTIM, AT_INT(optimizer_in_backward),
     .fixed = "optimizer_in_backward", .def = "false",
     .help = "step each layer as soon as its gradients are complete and reuse its gradient buffer: gradients take "
             "one layer's memory; needs gradient_accumulation_steps 1 and max_grad_norm 0"},
    {.name = "neftune_noise_alpha", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(neftune_noise_alpha), .def = "0",
     .help = "NEFTune: a training step's embeddings get uniform noise in +-alpha / sqrt(sequence length x width) "
             "(the micro-batch's length as padded or packed), as transformers' hook; evaluation sees none; 0 = off"},
    {.name = "weight_decay", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(weight_decay),
     .fixed = "weight_decay", .def = "0",
     .help = "decoupled weight decay"},
    {.name = "adam_beta1", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(adam_beta1), .fixed = "adam_beta1", .def = "0.9",
     .help = "decay of the first-moment average"},
    {.name = "adam_beta2", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(adam_beta2),
     .fixed = "adam_beta2", .def = "0.999",
     .help = "decay of the second-moment average"},
    {.name = "adam_epsilon", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(adam_epsilon),
     .fixed = "adam_epsilon", .def = "1e-8",
     .help = "added to the root of the second moment"},
    {.name = "max_grad_norm", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(max_grad_norm),
     .fixed = "max_grad_norm", .def = "1.0",
     .help = "clip the global gradient norm to this; 0 = no clipping"},

    /* output & logging */
    {.name = "output_dir", .type = KT_STRING, .group = G_OUTPUT, AT_STR(output_dir), .def = "out",
     .help = "folder for checkpoints and the final model (relative to the current directory)"},
    {.name = "seed", .type = KT_INT, .group = G_OUTPUT, AT_INT(seed), .fixed = "seed", .def = "42",
     .help = "seed for initialisation, shuffling and sampling"},
    {.name = "data_seed", .type = KT_INT, .group = G_OUTPUT, AT_INT(data_seed), .fixed = "data_seed", .def = "-1",
     .help = "seed for the data alone (validation split, shuffling, packing order); -1 = seed"},
    {.name = "logging_steps", .type = KT_INT, .group = G_OUTPUT, AT_INT(logging_steps), .def = "1",
     .help = "print loss, learning rate and throughput every N steps"},
    {.name = "eval_steps", .type = KT_INT, .group = G_OUTPUT, AT_INT(eval_steps), .def = "0",
     .help = "evaluate on the held-out set every N steps; 0 = at the end of each epoch"},
    {.name = "save_steps", .type = KT_INT, .group = G_OUTPUT, AT_INT(save_steps), .def = "0",
     .help = "save a checkpoint every N steps; 0 = only at the end"},
    {.name = "save_strategy", .type = KT_ENUM, .group = G_OUTPUT, AT_ENUM(save_strategy), .def = "unset",
     .values = "unset no steps epoch", ENUMS({"unset", -1}, {"no", 0}, {"steps", 1}, {"epoch", 2}),
     .later_values = "best",
     .help = "Hugging Face's: no (no checkpoints), steps (every save_steps; 500 when unset, the Trainer's default), "
             "epoch (at the end of each epoch); unset = as save_steps and saves_per_epoch say"},
    {.name = "eval_strategy", .aliases = "evaluation_strategy", .type = KT_ENUM, .group = G_OUTPUT,
     AT_ENUM(eval_strategy), .def = "unset", .values = "unset no steps epoch",
     ENUMS({"unset", -1}, {"no", 0}, {"steps", 1}, {"epoch", 2}),
     .help = "Hugging Face's: no (no evaluation, even with a validation set), steps (every eval_steps; logging_steps "
             "when unset, the Trainer's default), epoch (at the end of each epoch); unset = as eval_steps and "
             "evals_per_epoch say"},
    {.name = "save_first_step", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(save_first_step), .def = "false",
     .help = "Axolotl's: also a checkpoint after the first step (to see early that saving works)"},
    {.name = "auto_resume_from_checkpoints", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(auto_resume),
     .def = "false", .help = "Axolotl's: resume from the newest complete checkpoint in output_dir when there is one "
                             "(resume_from_checkpoint: latest, without failing when there is none)"},
    {.name = "report_to", .type = KT_NAMES, .group = G_OUTPUT, AL_STR(report_to), .def = "none",
     .items = "trackers (none, tensorboard)",
     .help = "Hugging Face's: tensorboard also writes TensorBoard event files (train/loss, train/learning_rate, "
             "train/grad_norm, train/epoch, eval/loss) into logging_dir; none: metrics.jsonl alone"},
    {.name = "use_tensorboard", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(use_tensorboard), .def = "false",
     .help = "Axolotl's: report_to tensorboard"},
    {.name = "logging_dir", .type = KT_STRING, .group = G_OUTPUT, AT_STR(logging_dir), .def = "",
     .help = "the folder of TensorBoard's event files (relative to the current directory); empty = output_dir/runs"},
    {.name = "disable_tqdm", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(no_progress_bar), .def = "false",
     .help = "Hugging Face's: no progress bar on a terminal, one line per logged step as in a file"},
    {.name = "use_cpu", .type = KT_BOOL, .group = G_OUTPUT, AL_INT(use_cpu), .def = "false",
     .help = "Hugging Face's: true = device: cpu"},
    {.name = "full_determinism", .type = KT_BOOL, .group = G_BATCH, AL_INT(full_determinism), .def = "false",
     .help = "Hugging Face's: true = ddp_deterministic (gradients summed in rank order)"},
    {.name = "liger_fused_linear_cross_entropy", .type = KT_BOOL, .group = G_MEMORY, AL_INT(liger_flce),
     .def = "false", .help = "Axolotl's Liger kernel that never holds the whole logits: chunked_cross_entropy: true"},
    {.name = "evals_per_epoch", .type = KT_INT, .group = G_OUTPUT, AT_INT(evals_per_epoch), .def = "0", MIN(0),
     .help = "instead of eval_steps: evaluate every ceil(steps / (evals_per_epoch x num_epochs)) steps, as Axolotl; "
             "0 = unset"},
    {.name = "saves_per_epoch", .type = KT_INT, .group = G_OUTPUT, AT_INT(saves_per_epoch), .def = "0", MIN(0),
     .help = "instead of save_steps: save a checkpoint every ceil(steps / (saves_per_epoch x num_epochs)) steps, as "
             "Axolotl; 0 = unset"},
    {.name = "loss_watchdog_threshold", .type = KT_FLOAT, .group = G_OUTPUT, AT_DBL(loss_watchdog_threshold),
     .def = "0", .help = "end training (saving the model as at the end) once the loss has been above this "
                         "loss_watchdog_patience steps in a row; 0 = off"},
    {.name = "loss_watchdog_patience", .type = KT_INT, .group = G_OUTPUT, AT_INT(loss_watchdog_patience),
     .def = "3", MIN(1), .help = "steps in a row above loss_watchdog_threshold that end training"},
    {.name = "early_stopping_patience", .type = KT_INT, .group = G_OUTPUT, AT_INT(early_stopping_patience),
     .def = "0", MIN(0), .help = "end training (as at its end) after this many evaluations in a row without a "
                                 "validation loss lower than the best so far; 0 = off"},
    {.name = "early_stopping_threshold", .type = KT_FLOAT, .group = G_OUTPUT, AT_DBL(early_stopping_threshold),
     .def = "0", .help = "how much lower than the best a validation loss must be to count as lower"},
    {.name = "load_best_model_at_end", .type = KT_ENUM, .group = G_OUTPUT, AT_ENUM(load_best_model_at_end),
     .def = "auto", .values = "auto true yes=true on=true false no=false off=false",
     ENUMS({"auto", -1}, {"true", 1}, {"false", 0}),
     .help = "the model saved at the end is the checkpoint with the lowest validation loss (kept from "
             "save_total_limit), or the last step's when that is lower; auto = with early_stopping_patience and "
             "checkpoints"},
    {.name = "metric_for_best_model", .type = KT_ENUM, .group = G_OUTPUT, AL_ENUM(metric_for_best_model),
     .def = "eval_loss", .values = "eval_loss loss=eval_loss", ENUMS({"eval_loss", 0}), .later_values = "*",
     .help = "what early stopping and load_best_model_at_end compare: the validation loss (lower is better)"},
    {.name = "save_only_model", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(save_only_model), .def = "false",
     .help = "checkpoints hold the model files alone (model.safetensors, or the adapter), no optimizer state: a "
             "third or less of the bytes, and a run cannot resume from them (as transformers')"},
    {.name = "save_total_limit", .type = KT_INT, .group = G_OUTPUT, AT_INT(save_total_limit), .def = "0", MIN(0),
     .help = "keep only the K newest complete checkpoints; 0 = keep them all"},
    {.name = "async_checkpoint", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(async_checkpoint), .def = "true",
     .help = "copy a checkpoint's state to host memory (planned as the checkpoint snapshot) and write it while "
             "training goes on; false = training waits while the checkpoint is written, and needs no copy"},
    {.name = "resume_from_checkpoint", .type = KT_STRING, .group = G_OUTPUT, AT_STR(resume_from_checkpoint),
     .def = "", .values = "true=latest false=", .typed = read_resume,
     .help = "continue a run exactly where a checkpoint left it (weights, optimizer state, data position, loss "
             "scale): a checkpoint-N folder, or latest (also true) for the newest complete one in output_dir"},
    {.name = "overwrite_output_dir", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(overwrite_output_dir),
     .def = "false", .help = "train into an output_dir that already holds a run (its checkpoints are deleted); "
                             "false = such a folder is refused unless the run resumes"},
    /* adapters */
    {.name = "adapter", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(adapter), .fixed = "adapter", .def = "none",
     .values = "none lora qlora", ENUMS({"none", SNUG_ADAPTER_NONE}, {"lora", SNUG_ADAPTER_LORA},
                                        {"qlora", SNUG_ADAPTER_QLORA}),
     .help = "lora: train low-rank adapters on a frozen base (PEFT's LoRA, saved in PEFT's format); qlora: the same "
             "on a base stored 4-bit (bitsandbytes' NF4); none: train every weight"},
    {.name = "load_in_4bit", .type = KT_BOOL, .group = G_MODEL, AT_INT(load_in_4bit), .def = "false",
     .help = "store the base's block matrices in 4 bits (with adapter: lora or qlora, the same as adapter: qlora)"},
    {.name = "bnb_config_kwargs", .type = KT_MAP, .group = G_MODEL, .map = KM_BNB_KWARGS,
     .help = "Axolotl's: BitsAndBytesConfig's arguments: load_in_4bit, load_in_8bit, bnb_4bit_quant_type, "
             "bnb_4bit_use_double_quant, bnb_4bit_compute_dtype as the keys of those names; bnb_4bit_quant_storage "
             "and llm_int8_threshold accepted (the storage only relabels the bytes; snug quantizes no activation); "
             "llm_int8_has_fp16_weight and llm_int8_enable_fp32_cpu_offload false; llm_int8_skip_modules naming "
             "lm_head or embed_tokens (never quantized)"},
    {.name = "load_in_8bit", .type = KT_BOOL, .group = G_MODEL, AT_INT(load_in_8bit), .def = "false",
     .help = "with adapter: lora, store the base's block matrices in 8 bits as bitsandbytes' LLM.int8 does (a code "
             "per weight, a scale per row); the rest of the base in bf16 (fp16 with fp16: true)"},
    {.name = "bnb_4bit_quant_type", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(bnb_4bit_quant_type),
     .fixed = "bnb_4bit_quant_type", .def = "nf4",
     .values = "nf4 fp4", ENUMS({"nf4", SNUG_Q4_NF4}, {"fp4", SNUG_Q4_FP4}),
     .help = "the 4-bit code of QLoRA's base: nf4 (NormalFloat, QLoRA's choice) or fp4"},
    {.name = "bnb_4bit_use_double_quant", .type = KT_BOOL, .group = G_MODEL, AT_INT(bnb_4bit_use_double_quant),
     .fixed = "bnb_4bit_use_double_quant",
     .def = "true", .help = "quantize the 4-bit blocks' scales again (8 bits, blocks of 256): 0.37 bit per weight less"},
    {.name = "bnb_4bit_compute_dtype", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(bnb_4bit_compute_fp16),
     .def = "bfloat16", .values = "bfloat16 bf16=bfloat16 float16 fp16=float16",
     ENUMS({"bfloat16", 0}, {"float16", 1}), .later_values = "float32",
     .help = "the 16-bit type of QLoRA's other tensors (embeddings, norms, head) and saved activations"},
    {.name = "lora_r", .type = KT_INT, .group = G_MODEL, AT_INT(lora_r), .fixed = "lora_r", .def = "8", MIN(1),
     .help = "the adapters' rank r"},
    {.name = "lora_alpha", .type = KT_FLOAT, .group = G_MODEL, AT_DBL(lora_alpha), .fixed = "lora_alpha", .def = "0",
     .help = "the adapters' scale numerator: scale = lora_alpha / lora_r; 0 = lora_r (scale 1)"},
    {.name = "lora_dropout", .type = KT_FLOAT, .group = G_MODEL, AT_DBL(lora_dropout),
     .fixed = "lora_dropout", .def = "0",
     .help = "dropout on the adapters' input (the base path sees the input unchanged), in [0, 1)"},
    {.name = "lora_target_modules", .type = KT_NAMES, .group = G_MODEL, AT_STR(lora_target_modules),
     .fixed = "lora_target_modules", .def = "",
     .help = "the linear modules that get adapters, as PEFT matches them (q_proj, v_proj, ...; all-linear); empty = "
             "PEFT's default for the architecture (q_proj and v_proj; GPT-2 c_attn)"},
    {.name = "lora_fan_in_fan_out", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(lora_fan_in_fan_out), .def = "auto",
     .values = "auto true yes=true on=true false no=false off=false", ENUMS({"auto", -1}, {"true", 1}, {"false", 0}),
     .help = "PEFT's fan_in_fan_out, what the model's layers are: true for GPT-2 (Conv1D), false otherwise; "
             "auto = that"},
    {.name = "lora_target_linear", .type = KT_BOOL, .group = G_MODEL, AT_INT(lora_target_linear),
     .fixed = "lora_target_linear", .def = "false",
     .help = "adapt every linear module of each block (q, k, v, o, gate, up, down), as well as lora_target_modules"},
    {.name = "lora_modules_to_save", .type = KT_NAMES, .group = G_MODEL, AT_STR(lora_modules_to_save),
     .fixed = "lora_modules_to_save", .def = "",
     .typed = read_save_modules,
     .help = "embed_tokens and/or lm_head: trained in full (an fp32 copy of the base's tensor, with its gradient and "
             "optimizer state) beside the adapters, as PEFT's modules_to_save; not for tied embeddings"},
    {.name = "unfrozen_parameters", .type = KT_LIST, .group = G_MODEL, .map = KM_UNFROZEN,
     AT_STR(unfrozen_parameters), .fixed = "unfrozen_parameters", .fixed_absent = "\"\"",
     .help = "a full fine-tune trains only the tensors these patterns match (Axolotl's: a regular expression matched "
             "at the start of a Hugging Face tensor name, each '.' literal, e.g. ^lm_head.weight$ or "
             "model.layers.2[0-9]+.mlp; a trailing [a:b] trains only those rows); the others take no gradient, no "
             "optimizer state and no update"},
    {.name = "peft_use_rslora", .aliases = "use_rslora", .type = KT_BOOL, .group = G_MODEL, AT_INT(lora_rslora),
     .fixed = "lora_rslora",
     .def = "false", .help = "rank-stabilised LoRA: scale = lora_alpha / sqrt(lora_r)"},
    {.name = "peft_layers_pattern", .aliases = "layers_pattern", .type = KT_NAMES, .group = G_MODEL,
     AT_STR(lora_layers_pattern), .def = "", .items = "block list names",
     .help = "the name of the model's block list that peft_layers_to_transform counts in (PEFT's layers_pattern): "
             "layers (GPT-2: h), the only one snug's models have; empty: found by name"},
    {.name = "peft_layers_to_transform", .aliases = "lora_layers_to_transform layers_to_transform", .type = KT_NAMES,
     .group = G_MODEL, AT_STR(lora_layers),
     .fixed = "lora_layers", .def = "", .items = "layer indices (integers from 0)", .typed = read_layers,
     .help = "adapters on these layers only (PEFT's layers_to_transform: indices from 0, a YAML list or \"0,5\"); "
             "empty: every layer"},
    {.name = "loraplus_lr_ratio", .type = KT_FLOAT, .group = G_MODEL, AT_DBL(loraplus_lr_ratio),
     .fixed = "loraplus_lr_ratio", .def = "0",
     .help = "LoRA+: lora_B (and DoRA's magnitudes) step at this times the learning rate, as PEFT's "
             "create_loraplus_optimizer (which Axolotl calls) groups them, and the adapters take no weight decay "
             "(its loraplus_weight_decay); 0: off"},
    {.name = "peft_use_dora", .aliases = "use_dora", .type = KT_BOOL, .group = G_MODEL, AT_INT(lora_dora),
     .fixed = "lora_dora",
     .def = "false", .help = "DoRA: each adapted module's output rows scaled by a trained magnitude over the norm of "
                             "W + s B A (PEFT's use_dora; not with lora_dropout)"}, 
    {.name = "merge_lora", .type = KT_BOOL, .group = G_MODEL, AT_INT(merge_lora), .def = "false",
     .help = "after training, also write output_dir/merged: base_model with the adapter merged (snug merge)"},
    {.name = "lora_model_dir", .type = KT_STRING, .group = G_MODEL, AT_STR(lora_model_dir), .def = "",
     .help = "a PEFT adapter folder (adapter_config.json) to start from instead of fresh adapters"},
    {.name = "device", .type = KT_ENUM, .group = G_OUTPUT, AT_ENUM(device), .def = "auto", .values = "auto cpu cuda",
     ENUMS({"auto", SNUG_BACKEND_AUTO}, {"cpu", SNUG_BACKEND_CPU}, {"cuda", SNUG_BACKEND_CUDA}),
     .help = "where to train: auto (a CUDA GPU when snug was built with CUDA and one is visible, else the CPU), cuda, "
             "or cpu"},
    {.name = "threads", .aliases = "num_threads", .type = KT_INT, .group = G_OUTPUT, AT_INT(threads), .def = "0", MIN(0),
     .help = "CPU threads; 0 = all cores"},

    /* generation */
    {.name = "sample_prompt", .aliases = "prompt", .type = KT_STRING, .group = G_GEN, AT_STR(sample_prompt), .def = "",
     .help = "text to continue after training; empty = none"},
    {.name = "sample_tokens", .aliases = "max_new_tokens", .type = KT_INT, .group = G_GEN, AT_INT(sample_tokens),
     .def = "64", MIN(0), .help = "tokens to generate"},
    {.name = "temperature", .type = KT_FLOAT, .group = G_GEN, AT_DBL(temperature), .def = "0.8",
     .help = "sampling temperature; 0 = greedy"},
    {.name = "top_k", .type = KT_INT, .group = G_GEN, AT_INT(top_k), .def = "40", MIN(0),
     .help = "sample among the k most likely tokens; 0 = all"},
    {.name = "top_p", .type = KT_FLOAT, .group = G_GEN, AT_DBL(top_p), .def = "0.95",
     .help = "sample among the most likely tokens whose probabilities add up to this; 1 = all"},

    /* memory */
    {.name = "memory_budget", .type = KT_SIZE, .group = G_MEMORY, AT_DBL(memory_budget), .def = "0",
     .help = "most memory the run may use, arenas plus runtime overhead: 40GB, 40 GiB, 512MiB or bytes; a plan over "
             "it is refused before anything is allocated; 0 = no limit"},
    {.name = "auto_fit", .type = KT_BOOL, .group = G_MEMORY, AT_INT(auto_fit), .def = "false",
     .help = "choose micro_batch_size (keeping the batch through gradient_accumulation_steps), "
             "gradient_checkpointing, chunked_cross_entropy and the optimizer state to fit memory_budget at the least "
             "predicted cost"},
    {.name = "auto_find_batch_size", .type = KT_BOOL, .group = G_MEMORY, AT_INT(auto_find_batch_size), .def = "false",
     .help = "micro_batch_size is the most: the run takes it, or its half, quarter, ..., the first whose plan fits the "
             "memory free on the GPU (on a CPU the host's available memory; memory_budget when smaller), as "
             "transformers' Trainer halves it on out-of-memory; gradient_accumulation_steps stays as set; a resumed "
             "run takes the checkpoint's"},
    {.name = "gradient_checkpointing", .type = KT_ENUM, .group = G_MEMORY, AT_ENUM(gradient_checkpointing),
     .def = "false",
     .values = "false=none none no=none off=none true=full full yes=full on=full selective offload unsloth=offload",
     NAMES(snug_ckpt_names),
     .help = "recompute activations in backward: false, selective (norm outputs and the MLP activation), "
             "full (whole layers from their input; true means full), offload (full, with the layer inputs kept in "
             "pinned host memory and copied to the device for the backward)"},
    {.name = "gradient_checkpointing_every_n_layers", .type = KT_INT, .group = G_MEMORY,
     AT_INT(gradient_checkpointing_every_n_layers), .def = "1",
     .help = "with full checkpointing, checkpoint layers 0, n, 2n, ... (1 = every layer)"},
    {.name = "flash_attention", .type = KT_BOOL, .group = G_MEMORY, AT_INT(flash_attention),
     .fixed = "flash_attention", .def = "true",
     .help = "tiled attention with online softmax, no (T, T) buffer; false = the reference path that stores the "
             "attention probabilities"},
    {.name = "attn_implementation", .type = KT_ENUM, .group = G_MEMORY, AL_ENUM(attn_implementation), .def = "auto",
     .values = "auto eager sdpa=fused flash_attention_2=fused flash_attention_3=fused flex_attention=fused "
               "xformers=fused",
     ENUMS({"auto", -1}, {"eager", 0}, {"fused", 1}),
     .help = "transformers' attention: eager stores the attention probabilities (flash_attention: false); sdpa, "
             "flash_attention_2, ... are exact fused attention (flash_attention: true); auto = flash_attention's"},
    {.name = "sdp_attention", .type = KT_BOOL, .group = G_MEMORY, AL_INT(attn_sdp), .def = "false",
     .help = "Axolotl's PyTorch fused attention: true = flash_attention: true"},
    {.name = "xformers_attention", .type = KT_BOOL, .group = G_MEMORY, AL_INT(attn_xformers), .def = "false",
     .help = "Axolotl's xformers attention: true = flash_attention: true"},
    {.name = "gradient_checkpointing_kwargs", .type = KT_MAP, .group = G_MEMORY, .map = KM_CKPT_KWARGS,
     .help = "{use_reentrant: true or false}: PyTorch's two ways of recomputing give the same gradients, as "
             "snug's one"},
    {.name = "activation_offloading", .type = KT_BOOL, .group = G_MEMORY, AL_INT(activation_offloading),
     .def = "false", .help = "Axolotl's: gradient_checkpointing: offload (the layer inputs in host memory)"},
    {.name = "bf16", .type = KT_BOOL, .group = G_MEMORY, AT_INT(bf16),
     .fixed = "bf16", .def = "false", .values = "auto=true",
     .help = "mixed precision: parameters, saved activations and gradients stored as bfloat16, computed in fp32 "
             "(auto: true, as every device snug runs on has bf16)"},
    {.name = "fp16", .type = KT_BOOL, .group = G_MEMORY, AT_INT(fp16), .fixed = "fp16", .def = "false",
     .help = "mixed precision in float16 with dynamic loss scaling (from 2^16; halved and the step skipped on "
             "overflow, doubled after 2000 clean steps); needs master_weights"},
    {.name = "master_weights", .type = KT_BOOL, .group = G_MEMORY, AT_INT(master_weights),
     .fixed = "master_weights", .def = "true",
     .help = "with bf16 or fp16, an fp32 copy of the weights takes the update (4 more bytes per parameter); "
             "false (bf16 only): the update is rounded to bf16 stochastically"},
    {.name = "chunked_cross_entropy", .type = KT_BOOL, .group = G_MEMORY, AT_INT(chunked_cross_entropy),
     .fixed = "chunked_cross_entropy",
     .def = "false", .help = "compute the output projection and loss a chunk of tokens at a time, so the (tokens, "
             "vocab) logits never exist whole"},
    {.name = "cross_entropy_chunk_tokens", .type = KT_INT, .group = G_MEMORY, AT_INT(cross_entropy_chunk_tokens),
     .fixed = "cross_entropy_chunk_tokens",
     .def = "256", .help = "tokens per logits chunk with chunked_cross_entropy"},
    {.name = "loss_vocab_block", .type = KT_INT, .group = G_MEMORY, AT_INT(loss_vocab_block), .def = "0",
     .help = "compute the loss over this many rows of the output head at a time (two passes over the head), so the "
             "logits are (tokens, rows) and under ZeRO-2/3 a tied embedding's weight and gradient never exist whole on "
             "a rank; 0 = auto: on (one layer's size of rows) for ZeRO-2/3 with a tied head on the CPU; -1 = off"},
    {.name = "offload_embedding", .type = KT_BOOL, .group = G_MEMORY, AT_INT(offload_embedding), .def = "false",
     .help = "with an adapter under bf16/fp16: the frozen input embedding stays in (pinned) host memory and only the "
             "micro-batch's rows are read from it (not for tied embeddings, whose table is also the output head)"},
    {.name = "offload_params", .type = KT_BOOL, .group = G_MEMORY, AT_INT(offload_params), .def = "false",
     .help = "with an adapter (lora or qlora): the frozen base (QLoRA's 4-bit matrices) stays in (pinned) host memory "
             "and each layer's weights are copied to the device just before it runs, the next layer's while this one "
             "computes (FSDP's offload_params; at zero_stage 3 each rank keeps its share); fsdp_config's "
             "offload_params, DeepSpeed's offload_param and fsdp's offload set it too"},
    {.name = "tiled_mlp", .type = KT_BOOL, .group = G_MEMORY, AT_INT(tiled_mlp), .fixed = "tiled_mlp", .def = "false",
     .help = "run each block's MLP over shards of the micro-batch's tokens (ALST's tiled MLP): its (tokens, "
             "intermediate) activations exist one shard at a time and are recomputed in backward, never saved"},
    {.name = "tiled_mlp_num_shards", .type = KT_INT, .group = G_MEMORY, AT_INT(tiled_mlp_num_shards),
     .fixed = "tiled_mlp_num_shards", .def = "0",
     .help = "shards of tiled_mlp; 0 = auto: ceil(tokens per micro-batch / hidden size), as Axolotl does"},

    /* flags of snug plan (not configuration keys: accepted on its command line only) */
    {.name = "gpu", .type = KT_STRING, .group = G_PLAN, PL_AT(char *, gpu),
     .help = "the GPU to fit (cuda backend): rtx4090, a100-40gb, a6000, l40s, a100-80gb, h100, h200"},
    {.name = "gpus", .type = KT_INT, .group = G_PLAN, PL_AT(int, gpus), .def = "1", MIN(1),
     .help = "data parallel over this many GPUs: each rank's memory for DDP and each ZeRO stage, the communication "
             "per step and its time on --gpu's interconnect, and the stage that fits at the least predicted cost"},
    {.name = "backend", .type = KT_ENUM, .group = G_PLAN, PL_AT(int, backend), .def = "auto",
     .values = "auto cpu cuda", ENUMS({"auto", SNUG_BACKEND_AUTO}, {"cpu", SNUG_BACKEND_CPU}, {"cuda", SNUG_BACKEND_CUDA}),
     .help = "whose runtime overhead to count: auto = cuda with --gpu, else cpu"},
    {.name = "json", .type = KT_BOOL, .group = G_PLAN, PL_AT(int, json), .def = "false",
     .help = "the report as one JSON object"},
    {.name = "svg", .type = KT_STRING, .group = G_PLAN, PL_AT(char *, svg), .def = "",
     .help = "a stacked bar chart of the memory per category, for the plan and each lever (and FILE.png beside it "
             "when rsvg-convert or ImageMagick is installed)"},
    {.name = "tokens_per_s", .type = KT_FLOAT, .group = G_PLAN, PL_AT(double, tokens_per_s), .positive = 1,
     .example = "2500", .help = "measured throughput, for the time and cost; default: an estimate"},
    {.name = "price_per_hour", .type = KT_FLOAT, .group = G_PLAN, PL_AT(double, price_per_hour), .positive = 1,
     .example = "2.50 (USD per GPU-hour)", .help = "USD per GPU-hour; default: a table of typical cloud prices"},

    /* recognised, not supported yet */
    LATER_BOOL("tf32", "TF32 matrix multiplies; snug trains in fp32"),
    NOOP("eval_sample_packing", KT_BOOL, "evaluation batches as training does; the loss is the same either way"),
    NOOP("dataloader_num_workers", KT_INT, "snug's loader reads the memory-mapped tokens in the training thread"),
    NOOP("dataloader_pin_memory", KT_BOOL, "snug's loader reads the memory-mapped tokens in the training thread"),
    NOOP("dataloader_prefetch_factor", KT_INT, "snug's loader reads the memory-mapped tokens in the training thread"),
    NOOP("remove_unused_columns", KT_BOOL, "snug reads only the fields its dataset types name"),
    NOOP("ddp_find_unused_parameters", KT_BOOL, "every parameter snug trains has a gradient every step"),
    NOOP("dataset_processes", KT_INT, "tokenizing takes the threads of `threads`"),
    NOOP("dataset_num_proc", KT_INT, "tokenizing takes the threads of `threads`"),
    NOOP("low_cpu_mem_usage", KT_BOOL, "snug reads the weights tensor by tensor into the arenas"),
    NOOP("include_tokens_per_second", KT_BOOL, "metrics.jsonl has tokens_per_s every logged step"),
    NOOP("sample_packing_eff_est", KT_FLOAT, "snug packs the tokenized examples themselves"),
    NOOP("total_num_tokens", KT_INT, "snug counts the tokenized examples themselves"),
    NOOP("total_supervised_tokens", KT_INT, "snug counts the tokenized examples themselves"),
    NOOP("hub_strategy", KT_STRING, "snug pushes nothing to the Hub (hub_model_id is refused)"),
    NOOP("loraplus_lr_embedding", KT_FLOAT, "LoRA+'s learning rate of adapters on embeddings; snug puts none there"),
    NOOP("liger_rope", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("liger_rms_norm", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("liger_glu_activation", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("liger_layer_norm", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("liger_cross_entropy", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("unsloth_lora_mlp", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("unsloth_lora_qkv", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("unsloth_lora_o", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("unsloth_cross_entropy_loss", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("unsloth_rms_norm", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("unsloth_rope", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("flash_attn_cross_entropy", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("flash_attn_rms_norm", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("flash_attn_fuse_qkv", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    NOOP("flash_attn_fuse_mlp", KT_BOOL, "snug's kernels are its own; the arithmetic is the same"),
    {.name = "shuffle_merged_datasets", .type = KT_BOOL, .off = "true",
     .later = "keeping the datasets' order; snug shuffles the examples of all datasets together"},
    {.name = "save_safetensors", .type = KT_BOOL, .off = "true",
     .later = "saving pytorch_model.bin; snug saves safetensors"},
    {.name = "tokenizer_use_fast", .type = KT_BOOL, .off = "true",
     .later = "a slow (Python) tokenizer; snug reads tokenizer.json, the fast tokenizer's file"},
    {.name = "train_on_eos", .type = KT_STRING, .off = "turn",
     .later = "other end-of-turn supervision; snug trains on the end-of-turn token of each trained turn (turn)"},
    {.name = "sequence_parallel_degree", .aliases = "context_parallel_size", .type = KT_INT, .off = "1",
     .later = "sequence (context) parallelism"},
    {.name = "logging_strategy", .type = KT_STRING, .off = "steps",
     .later = "logging by epoch; snug logs every logging_steps steps"},
    {.name = "torch_dtype", .aliases = "dtype", .type = KT_STRING, .off = "auto float32",
     .later = "loading the weights in another dtype; use bf16 or fp16"},
    LATER_BOOL("push_to_hub", "pushing to the Hugging Face Hub; snug writes output_dir"),
    LATER("hub_model_id", KT_STRING, "pushing to the Hugging Face Hub; snug writes output_dir"),
    LATER_BOOL("embeddings_skip_upcast", "keeping LoRA's embeddings in 16 bits"),
    LATER("default_system_message", KT_STRING, "adding a system message to chats without one"),
    LATER("pretraining_dataset", KT_STRING, "streaming pretraining data; list the files under datasets"),
    LATER_BOOL("skip_prepare_dataset", "tokenizing during training; snug tokenizes ahead into the cache"),
    LATER("gpu_memory_limit", KT_STRING, "placing the model over devices; memory_budget bounds a run"),
    LATER("lr_div_factor", KT_FLOAT, "the one_cycle scheduler"),
    LATER_BOOL("bf16_full_eval", "evaluating in bf16 while training otherwise; evaluation uses the run's precision"),
    LATER("plugins", KT_LIST, "Axolotl's plugins"),
    LATER_BOOL("torch_compile", "graph compilation"),
    LATER("local_rank", KT_INT, "multi-GPU training"),
    {.name = "eval_batch_size", .aliases = "per_device_eval_batch_size", .type = KT_INT,
     .noop = "evaluation runs in micro-batches of micro_batch_size rows; the validation loss, the mean over every "
             "supervised token, is the same for any batch"},
    LATER_BOOL("greater_is_better", "a metric where higher is better; snug compares the validation loss"),
    LATER("wandb_project", KT_STRING, "Weights & Biases logging"),
    LATER("wandb_entity", KT_STRING, "Weights & Biases logging"),
    LATER("wandb_name", KT_STRING, "Weights & Biases logging"),
    LATER("wandb_watch", KT_STRING, "Weights & Biases logging"),
    LATER("wandb_log_model", KT_STRING, "Weights & Biases logging"),
    {.name = "trust_remote_code", .type = KT_BOOL, .group = G_MODEL, AL_INT(trust_remote_code), .def = "false",
     .help = "either value: snug runs no code of the model's; an architecture it does not build is refused where "
             "config.json is read"},
    {.name = "is_llama_derived_model", .type = KT_BOOL, .group = G_MODEL, AT_INT(derived_llama), .def = "false",
     .help = "Axolotl's hint; true is checked against config.json's model_type (llama)"},
    {.name = "is_mistral_derived_model", .type = KT_BOOL, .group = G_MODEL, AT_INT(derived_mistral),
     .def = "false", .help = "Axolotl's hint; true is checked against config.json's model_type (mistral)"},
    {.name = "is_qwen_derived_model", .type = KT_BOOL, .group = G_MODEL, AT_INT(derived_qwen), .def = "false",
     .help = "Axolotl's hint; true is checked against config.json's model_type (qwen2)"},
    LATER_BOOL("s2_attention", "shifted sparse attention (LongLoRA)"),
    {.name = "eval_table_size", .type = KT_INT, .off = "0",
     .later = "a table of sampled predictions at each evaluation"},
    {.name = "eval_max_new_tokens", .aliases = "eval_table_max_new_tokens", .type = KT_INT, .group = G_OUTPUT,
     AL_INT(eval_max_new_tokens), .def = "128",
     MIN(1), .help = "Axolotl's tokens per row of eval_table_size's table (which snug does not build)"},
    {.name = "tokenizer_type", .type = KT_STRING,
     .off = "AutoTokenizer PreTrainedTokenizerFast LlamaTokenizerFast LlamaTokenizer GPT2TokenizerFast "
            "GPT2Tokenizer Qwen2TokenizerFast Qwen2Tokenizer",
     .later = "choosing the tokenizer class; snug reads tokenizer.json (the fast tokenizer's file) for the classes "
              "of the architectures it builds"},
    LATER_BOOL("strict", "Axolotl's strict mode; snug always rejects unknown keys"),
};


const int opt_nkeys = (int)(sizeof opt_keys / sizeof opt_keys[0]);
_Static_assert(sizeof opt_keys / sizeof opt_keys[0] <= OPT_MAX_KEYS, "raise OPT_MAX_KEYS");
