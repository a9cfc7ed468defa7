/* options.c: the training configuration from YAML and the command line (see options.h).
 *
 * Everything a user can write is one row of `keys` below: its name and other spellings (Hugging Face
 * TrainingArguments, TRL), its type, where it lives in snug_run_config, its default, one line of help, and whether snug
 * does it yet. Defaults, parsing, type errors, the "did you mean" suggestion, the refusal of features not built and
 * the --help listing all read that one table, so they cannot disagree.
 *
 * A key of a feature snug has not built is recognised and refused ("bf16 is not supported yet"), never silently
 * ignored; but a value that asks for nothing (`bf16: false`, an empty `wandb_project:`) is accepted, so existing
 * Axolotl configs load unchanged when they only switch such features off. */
#include "cli/options.h"

#include "cli/plan_cmd.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <jansson.h>
#include <yaml.h>

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

static const char *const group_titles[NGROUPS] = {
    "model", "data", "each datasets entry", "batch & schedule", "optimizer", "output & logging", "generation",
    "memory", "flags of snug plan",
};

/* Where a key's field lives: the run configuration, one datasets entry, or the flags of `snug plan`. */
enum { SCOPE_RUN, SCOPE_DATASET, SCOPE_PLAN };

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
    map_kind map;             /* KT_MAP, KT_LIST: what it holds */
    const char *help;
} key_spec;

/* Field placement with a compile-time type check: a row whose type disagrees with its field does not compile. */
#define AT_INT(f) .offset = _Generic(((snug_run_config *)0)->f, int: offsetof(snug_run_config, f)), .size = sizeof(int)
#define AT_DBL(f) .offset = _Generic(((snug_run_config *)0)->f, double: offsetof(snug_run_config, f)), .size = sizeof(double)
#define AT_STR(f) \
    .offset = _Generic(((snug_run_config *)0)->f, char *: offsetof(snug_run_config, f)), .size = sizeof(((snug_run_config *)0)->f)
#define ENUM_SIZE_CHECK(T, f) (sizeof(int) + 0 * sizeof(char[sizeof(((T *)0)->f) == sizeof(int) ? 1 : -1]))
#define AT_ENUM(f) .offset = offsetof(snug_run_config, f), .size = ENUM_SIZE_CHECK(snug_run_config, f)
#define DS_ENUM(f) .offset = offsetof(snug_dataset_spec, f), .size = ENUM_SIZE_CHECK(snug_dataset_spec, f)
#define ENUMS(...) .enums = (const enum_name[]){__VA_ARGS__, {NULL, 0}}
#define MIN(v) .has_min = 1, .min = (v)
#define PL_AT(T, f) .offset = offsetof(snug_plan_args, f), .size = sizeof(((snug_plan_args *)0)->f)
#define DS_STR(f)                                                                  \
    .offset = _Generic(((snug_dataset_spec *)0)->f, char *: offsetof(snug_dataset_spec, f)), \
    .size = sizeof(((snug_dataset_spec *)0)->f)

#define LATER_BOOL(n, why) {.name = n, .type = KT_BOOL, .later = why}
#define NOOP(n, t, why) {.name = n, .type = t, .noop = why}
#define LATER(n, t, why) {.name = n, .type = t, .later = why}

static const key_spec keys[] = {
    /* model */
    {.name = "base_model", .aliases = "model_name_or_path", .type = KT_STRING, .group = G_MODEL, AT_STR(base_model),
     .def = "", .help = "Hugging Face model folder to fine-tune; empty = train model_preset from scratch"},
    {.name = "model_preset", .type = KT_STRING, .group = G_MODEL, AT_STR(model_preset), .def = "tiny-llama",
     .help = "built-in architecture trained from scratch when base_model is empty"},
    {.name = "model_type", .type = KT_STRING, .group = G_MODEL, AT_STR(model_class), .def = "",
     .help = "the transformers class (Axolotl's): AutoModelForCausalLM, or the one config.json's architectures "
             "names (LlamaForCausalLM, ...); empty = config.json's"},
    {.name = "tokenizer", .aliases = "tokenizer_config tokenizer_name", .type = KT_STRING, .group = G_MODEL,
     AT_STR(tokenizer), .def = "", .help = "tokenizer folder or tokenizer.json; empty = base_model's, or the built-in one"},

    /* data */
    {.name = "datasets", .aliases = "dataset", .type = KT_DATASETS, .group = G_DATA,
     .help = "training data, a list of entries (keys below); --dataset FILE.jsonl on the command line replaces "
             "it (repeat to add more)"},
    {.name = "test_datasets", .type = KT_DATASETS, .group = G_DATA,
     .help = "the validation set from these files instead of val_set_size's split (entries as under datasets; "
             "--test_datasets FILE.jsonl on the command line)"},
    {.name = "sequence_len", .aliases = "max_seq_length max_length", .type = KT_INT, .group = G_DATA,
     AT_INT(sequence_len),
     .def = "256", MIN(2), .help = "tokens per training row (the context length trained)"},
    {.name = "val_set_size", .type = KT_FLOAT, .group = G_DATA, AT_DBL(val_set_size), .def = "0",
     .help = "examples held out for evaluation: a fraction (< 1) or a count (>= 1); 0 = none"},
    {.name = "dataset_exact_deduplication", .type = KT_BOOL, .group = G_DATA, AT_INT(dataset_exact_deduplication),
     .def = "false", .help = "keep one of the examples that tokenize the same (tokens and targets), before the "
                             "validation split; test_datasets' examples that training has are dropped from them"},
    {.name = "train_on_inputs", .type = KT_BOOL, .group = G_DATA, AT_INT(train_on_inputs), .def = "false",
     .help = "also train on prompt, system and user tokens (alpaca, chat); the response and its EOS always are"},
    {.name = "long_examples", .type = KT_ENUM, .group = G_DATA, AT_ENUM(long_examples), .def = "truncate",
     .values = "truncate drop", ENUMS({"truncate", SNUG_LONG_TRUNCATE}, {"drop", SNUG_LONG_DROP}), .help = "an example longer than sequence_len is truncated to it, or dropped"},
    {.name = "skip_bad_examples", .type = KT_BOOL, .group = G_DATA, AT_INT(skip_bad_examples), .def = "false",
     .help = "skip malformed dataset lines and report how many; false = stop at the first with its file and line"},
    {.name = "dataset_prepared_path", .type = KT_STRING, .group = G_DATA, AT_STR(dataset_prepared_path),
     .def = "last_run_prepared",
     .help = "folder of the tokenized-data cache (relative to the current directory); reused while the data, "
             "tokenizer and options are unchanged"},
    {.name = "chat_template", .type = KT_ENUM, .group = G_DATA, AT_ENUM(chat_template), .def = "chatml",
     .values = "chatml llama3", ENUMS({"chatml", SNUG_CHAT_CHATML}, {"llama3", SNUG_CHAT_LLAMA3}), .later_values = "*",
     .help = "the template of every chat dataset entry that names none: chatml or llama3"},
    {.name = "special_tokens", .type = KT_MAP, .group = G_DATA, .map = KM_SPECIAL_TOKENS,
     .help = "tokens of the tokenizer's vocabulary that take a role: pad_token (pads batches; saved with the "
             "tokenizer), eos_token (ends every completion and alpaca example, stops generation; saved too); "
             "bos_token and unk_token only as the tokenizer's own"},
    {.name = "debug", .type = KT_BOOL, .group = G_DATA, AT_INT(debug), .def = "false",
     .help = "print the first 3 examples token by token with their mask before training (snug preprocess --debug)"},

    /* each datasets entry */
    {.name = "path", .type = KT_STRING, .group = G_DATASET, DS_STR(path),
     .help = "JSONL file, one example per line; a relative path is relative to the YAML file's folder"},
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
    {.name = "chat_template", .type = KT_ENUM, .group = G_DATASET, DS_ENUM(chat_template), .def = "chatml",
     .values = "chatml llama3", ENUMS({"chatml", SNUG_CHAT_CHATML}, {"llama3", SNUG_CHAT_LLAMA3}), .later_values = "*",
     .help = "the template of a chat dataset: chatml (<|im_start|>role ... <|im_end|>) or llama3 (<|eot_id|>); "
             "unset = the config-wide chat_template"},
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
     AT_INT(micro_batch_size), .def = "4", MIN(1), .help = "examples per forward/backward pass"},
    {.name = "sample_packing", .aliases = "packing", .type = KT_BOOL, .group = G_BATCH, AT_INT(sample_packing),
     .def = "false",
     .help = "pack several examples into each row of sequence_len tokens (first-fit decreasing), attention and "
             "positions kept per example; false = one example per row, padded"},
    {.name = "group_by_length", .type = KT_BOOL, .group = G_BATCH, AT_INT(group_by_length), .def = "false",
     .help = "without packing: put examples of similar length in the same micro-batch (less padding)"},
    {.name = "pad_to_sequence_len", .type = KT_BOOL, .group = G_BATCH, AT_INT(pad_to_sequence_len),
     .def = "false", .help = "pad every row to sequence_len; false = to the longest example of the micro-batch"},
    {.name = "pad_to_multiple_of", .type = KT_INT, .group = G_BATCH, AT_INT(pad_to_multiple_of), .def = "0",
     .help = "round a padded micro-batch's length up to a multiple of this; 0 = no rounding"},
    {.name = "concatenate", .type = KT_BOOL, .group = G_BATCH, AT_INT(concatenate), .def = "false",
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
    {.name = "deepspeed", .type = KT_STRING, .group = G_BATCH, AT_STR(deepspeed),
     .help = "DeepSpeed's ds_config.json: its zero_optimization.stage sets zero_stage, its overlap_comm "
             "zero_overlap_comm, offload_param to cpu offload_params and offload_optimizer to cpu a paged optimizer "
             "(nvme is refused; the file's other settings are DeepSpeed's own and are not read)"},
    {.name = "fsdp", .type = KT_NAMES, .group = G_BATCH, AT_STR(fsdp), .items = "FSDP options",
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
    {.name = "fsdp_version", .type = KT_INT, .group = G_BATCH, AT_INT(fsdp_version), .def = "2", MIN(1),
     .help = "Axolotl's FSDP version, 1 or 2: both shard the same way in snug"},
    {.name = "zero_stage", .type = KT_INT, .group = G_BATCH, AT_INT(zero_stage), .def = "0", MIN(0),
     .help = "ZeRO over the ranks: 1 = each rank keeps the optimizer state of 1/N of the parameters, steps only those "
             "after a reduce-scatter of the gradients and all-gathers the updated parameters (the same results as "
             "ddp); 2 = also the gradients: each layer's are reduce-scattered as backward completes them, every "
             "micro-batch, into the rank's shard; 3 = also the parameters: each layer is all-gathered before its forward "
             "and its backward, the global tensors before the embedding and the loss (its checkpoints keep each "
             "rank's shards and no model files; under LoRA it shards the frozen base alone); 0 = every rank holds "
             "everything"},
    {.name = "tensor_parallel_size", .type = KT_INT, .group = G_BATCH, AT_INT(tensor_parallel_size), .def = "1",
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
    {.name = "pipeline_layers", .type = KT_NAMES, .group = G_BATCH, AT_STR(pipeline_layers), .def = "",
     .items = "numbers",
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
     .def = "1", MIN(1), .help = "micro-batches per optimizer step (batch = micro_batch_size x this)"},
    {.name = "num_epochs", .aliases = "num_train_epochs", .type = KT_INT, .group = G_BATCH, AT_INT(num_epochs),
     .def = "1", .help = "passes over the training data (used when max_steps is -1)"},
    {.name = "max_steps", .type = KT_INT, .group = G_BATCH, AT_INT(max_steps), .def = "-1",
     .help = "optimizer steps to run; -1 = as many as num_epochs gives"},
    {.name = "learning_rate", .type = KT_FLOAT, .group = G_BATCH, AT_DBL(learning_rate), .def = "3e-4",
     .help = "peak learning rate, reached after warmup"},
    {.name = "lr_scheduler", .aliases = "lr_scheduler_type", .type = KT_ENUM, .group = G_BATCH, AT_ENUM(lr_scheduler),
     .def = "cosine",
     .values = "cosine cosine_with_min_lr=cosine linear constant constant_with_warmup cosine_with_restarts polynomial "
               "inverse_sqrt warmup_stable_decay reduce_lr_on_plateau cosine_warmup_with_min_lr rex",
     ENUMS({"cosine", SNUG_SCHED_COSINE}, {"linear", SNUG_SCHED_LINEAR}, {"constant", SNUG_SCHED_CONSTANT},
           {"constant_with_warmup", SNUG_SCHED_CONSTANT_WARMUP}, {"cosine_with_restarts", SNUG_SCHED_COSINE_RESTARTS},
           {"polynomial", SNUG_SCHED_POLYNOMIAL}, {"inverse_sqrt", SNUG_SCHED_INVERSE_SQRT},
           {"warmup_stable_decay", SNUG_SCHED_WSD}, {"reduce_lr_on_plateau", SNUG_SCHED_PLATEAU},
           {"cosine_warmup_with_min_lr", SNUG_SCHED_COSINE_WARMUP_MIN}, {"rex", SNUG_SCHED_REX}),
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
    {.name = "warmup_steps", .type = KT_INT, .group = G_BATCH, AT_INT(warmup_steps), .def = "0",
     .help = "steps of linear warmup from 0 to learning_rate"},
    {.name = "warmup_ratio", .type = KT_FLOAT, .group = G_BATCH, AT_DBL(warmup_ratio), .def = "0",
     .help = "warmup as a fraction of all steps, used when warmup_steps is 0"},

    /* optimizer */
    {.name = "optimizer", .aliases = "optim", .type = KT_ENUM, .group = G_OPTIM, AT_ENUM(optimizer), .def = "adamw",
     .values = "adamw adamw_torch=adamw adamw_torch_fused=adamw adamw_8bit adamw_bnb_8bit=adamw_8bit "
               "paged_adamw_8bit paged_adamw_32bit",
     ENUMS({"adamw", SNUG_OPTIMIZER_ADAMW}, {"adamw_8bit", SNUG_OPTIMIZER_ADAMW_8BIT},
           {"paged_adamw_8bit", SNUG_OPTIMIZER_PAGED_ADAMW_8BIT}, {"paged_adamw_32bit", SNUG_OPTIMIZER_PAGED_ADAMW_32BIT}),
     .later_values = "*",
     .help = "AdamW with decoupled weight decay (adamw_torch and adamw_torch_fused mean the same); adamw_8bit "
             "(adamw_bnb_8bit): bitsandbytes' 8-bit blockwise moments, ~2 bytes of state per parameter instead of 8; "
             "paged_*: the state in host memory, streamed through the device in chunks"},
    {.name = "optimizer_in_backward", .type = KT_BOOL, .group = G_OPTIM, AT_INT(optimizer_in_backward), .def = "false",
     .help = "step each layer as soon as its gradients are complete and reuse its gradient buffer: gradients take "
             "one layer's memory; needs gradient_accumulation_steps 1 and max_grad_norm 0"},
    {.name = "neftune_noise_alpha", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(neftune_noise_alpha), .def = "0",
     .help = "NEFTune: a training step's embeddings get uniform noise in +-alpha / sqrt(sequence length x width) "
             "(the micro-batch's length as padded or packed), as transformers' hook; evaluation sees none; 0 = off"},
    {.name = "weight_decay", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(weight_decay), .def = "0",
     .help = "decoupled weight decay"},
    {.name = "adam_beta1", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(adam_beta1), .def = "0.9",
     .help = "decay of the first-moment average"},
    {.name = "adam_beta2", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(adam_beta2), .def = "0.999",
     .help = "decay of the second-moment average"},
    {.name = "adam_epsilon", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(adam_epsilon), .def = "1e-8",
     .help = "added to the root of the second moment"},
    {.name = "max_grad_norm", .type = KT_FLOAT, .group = G_OPTIM, AT_DBL(max_grad_norm), .def = "1.0",
     .help = "clip the global gradient norm to this; 0 = no clipping"},

    /* output & logging */
    {.name = "output_dir", .type = KT_STRING, .group = G_OUTPUT, AT_STR(output_dir), .def = "out",
     .help = "folder for checkpoints and the final model (relative to the current directory)"},
    {.name = "seed", .type = KT_INT, .group = G_OUTPUT, AT_INT(seed), .def = "42",
     .help = "seed for initialisation, shuffling and sampling"},
    {.name = "data_seed", .type = KT_INT, .group = G_OUTPUT, AT_INT(data_seed), .def = "-1",
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
    {.name = "report_to", .type = KT_NAMES, .group = G_OUTPUT, AT_STR(report_to), .def = "none",
     .items = "trackers (none, tensorboard)",
     .help = "Hugging Face's: tensorboard also writes TensorBoard event files (train/loss, train/learning_rate, "
             "train/grad_norm, train/epoch, eval/loss) into logging_dir; none: metrics.jsonl alone"},
    {.name = "use_tensorboard", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(use_tensorboard), .def = "false",
     .help = "Axolotl's: report_to tensorboard"},
    {.name = "logging_dir", .type = KT_STRING, .group = G_OUTPUT, AT_STR(logging_dir), .def = "",
     .help = "the folder of TensorBoard's event files (relative to the current directory); empty = output_dir/runs"},
    {.name = "disable_tqdm", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(no_progress_bar), .def = "false",
     .help = "Hugging Face's: no progress bar on a terminal, one line per logged step as in a file"},
    {.name = "use_cpu", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(use_cpu), .def = "false",
     .help = "Hugging Face's: true = device: cpu"},
    {.name = "full_determinism", .type = KT_BOOL, .group = G_BATCH, AT_INT(full_determinism), .def = "false",
     .help = "Hugging Face's: true = ddp_deterministic (gradients summed in rank order)"},
    {.name = "liger_fused_linear_cross_entropy", .type = KT_BOOL, .group = G_MEMORY, AT_INT(liger_flce),
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
    {.name = "metric_for_best_model", .type = KT_ENUM, .group = G_OUTPUT, AT_ENUM(metric_for_best_model),
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
     .def = "", .values = "true=latest false=",
     .help = "continue a run exactly where a checkpoint left it (weights, optimizer state, data position, loss "
             "scale): a checkpoint-N folder, or latest (also true) for the newest complete one in output_dir"},
    {.name = "overwrite_output_dir", .type = KT_BOOL, .group = G_OUTPUT, AT_INT(overwrite_output_dir),
     .def = "false", .help = "train into an output_dir that already holds a run (its checkpoints are deleted); "
                             "false = such a folder is refused unless the run resumes"},
    /* adapters */
    {.name = "adapter", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(adapter), .def = "none",
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
    {.name = "bnb_4bit_quant_type", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(bnb_4bit_quant_type), .def = "nf4",
     .values = "nf4 fp4", ENUMS({"nf4", SNUG_Q4_NF4}, {"fp4", SNUG_Q4_FP4}),
     .help = "the 4-bit code of QLoRA's base: nf4 (NormalFloat, QLoRA's choice) or fp4"},
    {.name = "bnb_4bit_use_double_quant", .type = KT_BOOL, .group = G_MODEL, AT_INT(bnb_4bit_use_double_quant),
     .def = "true", .help = "quantize the 4-bit blocks' scales again (8 bits, blocks of 256): 0.37 bit per weight less"},
    {.name = "bnb_4bit_compute_dtype", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(bnb_4bit_compute_fp16),
     .def = "bfloat16", .values = "bfloat16 bf16=bfloat16 float16 fp16=float16",
     ENUMS({"bfloat16", 0}, {"float16", 1}), .later_values = "float32",
     .help = "the 16-bit type of QLoRA's other tensors (embeddings, norms, head) and saved activations"},
    {.name = "lora_r", .type = KT_INT, .group = G_MODEL, AT_INT(lora_r), .def = "8", MIN(1),
     .help = "the adapters' rank r"},
    {.name = "lora_alpha", .type = KT_FLOAT, .group = G_MODEL, AT_DBL(lora_alpha), .def = "0",
     .help = "the adapters' scale numerator: scale = lora_alpha / lora_r; 0 = lora_r (scale 1)"},
    {.name = "lora_dropout", .type = KT_FLOAT, .group = G_MODEL, AT_DBL(lora_dropout), .def = "0",
     .help = "dropout on the adapters' input (the base path sees the input unchanged), in [0, 1)"},
    {.name = "lora_target_modules", .type = KT_NAMES, .group = G_MODEL, AT_STR(lora_target_modules), .def = "",
     .help = "the linear modules that get adapters, as PEFT matches them (q_proj, v_proj, ...; all-linear); empty = "
             "PEFT's default for the architecture (q_proj and v_proj; GPT-2 c_attn)"},
    {.name = "lora_fan_in_fan_out", .type = KT_ENUM, .group = G_MODEL, AT_ENUM(lora_fan_in_fan_out), .def = "auto",
     .values = "auto true yes=true on=true false no=false off=false", ENUMS({"auto", -1}, {"true", 1}, {"false", 0}),
     .help = "PEFT's fan_in_fan_out, what the model's layers are: true for GPT-2 (Conv1D), false otherwise; "
             "auto = that"},
    {.name = "lora_target_linear", .type = KT_BOOL, .group = G_MODEL, AT_INT(lora_target_linear), .def = "false",
     .help = "adapt every linear module of each block (q, k, v, o, gate, up, down), as well as lora_target_modules"},
    {.name = "lora_modules_to_save", .type = KT_NAMES, .group = G_MODEL, AT_STR(lora_modules_to_save), .def = "",
     .help = "embed_tokens and/or lm_head: trained in full (an fp32 copy of the base's tensor, with its gradient and "
             "optimizer state) beside the adapters, as PEFT's modules_to_save; not for tied embeddings"},
    {.name = "unfrozen_parameters", .type = KT_LIST, .group = G_MODEL, .map = KM_UNFROZEN,
     AT_STR(unfrozen_parameters),
     .help = "a full fine-tune trains only the tensors these patterns match (Axolotl's: a regular expression matched "
             "at the start of a Hugging Face tensor name, each '.' literal, e.g. ^lm_head.weight$ or "
             "model.layers.2[0-9]+.mlp; a trailing [a:b] trains only those rows); the others take no gradient, no "
             "optimizer state and no update"},
    {.name = "peft_use_rslora", .aliases = "use_rslora", .type = KT_BOOL, .group = G_MODEL, AT_INT(lora_rslora),
     .def = "false", .help = "rank-stabilised LoRA: scale = lora_alpha / sqrt(lora_r)"},
    {.name = "peft_layers_pattern", .aliases = "layers_pattern", .type = KT_NAMES, .group = G_MODEL,
     AT_STR(lora_layers_pattern), .def = "", .items = "block list names",
     .help = "the name of the model's block list that peft_layers_to_transform counts in (PEFT's layers_pattern): "
             "layers (GPT-2: h), the only one snug's models have; empty: found by name"},
    {.name = "peft_layers_to_transform", .aliases = "lora_layers_to_transform layers_to_transform", .type = KT_NAMES,
     .group = G_MODEL, AT_STR(lora_layers), .def = "", .items = "layer indices (integers from 0)",
     .help = "adapters on these layers only (PEFT's layers_to_transform: indices from 0, a YAML list or \"0,5\"); "
             "empty: every layer"},
    {.name = "loraplus_lr_ratio", .type = KT_FLOAT, .group = G_MODEL, AT_DBL(loraplus_lr_ratio), .def = "0",
     .help = "LoRA+: lora_B (and DoRA's magnitudes) step at this times the learning rate, as PEFT's "
             "create_loraplus_optimizer (which Axolotl calls) groups them, and the adapters take no weight decay "
             "(its loraplus_weight_decay); 0: off"},
    {.name = "peft_use_dora", .aliases = "use_dora", .type = KT_BOOL, .group = G_MODEL, AT_INT(lora_dora),
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
     ENUMS({"none", SNUG_CKPT_CHOICE_NONE}, {"selective", SNUG_CKPT_CHOICE_SELECTIVE}, {"full", SNUG_CKPT_CHOICE_FULL},
           {"offload", SNUG_CKPT_CHOICE_OFFLOAD}),
     .help = "recompute activations in backward: false, selective (norm outputs and the MLP activation), "
             "full (whole layers from their input; true means full), offload (full, with the layer inputs kept in "
             "pinned host memory and copied to the device for the backward)"},
    {.name = "gradient_checkpointing_every_n_layers", .type = KT_INT, .group = G_MEMORY,
     AT_INT(gradient_checkpointing_every_n_layers), .def = "1",
     .help = "with full checkpointing, checkpoint layers 0, n, 2n, ... (1 = every layer)"},
    {.name = "flash_attention", .type = KT_BOOL, .group = G_MEMORY, AT_INT(flash_attention), .def = "true",
     .help = "tiled attention with online softmax, no (T, T) buffer; false = the reference path that stores the "
             "attention probabilities"},
    {.name = "attn_implementation", .type = KT_ENUM, .group = G_MEMORY, AT_ENUM(attn_implementation), .def = "auto",
     .values = "auto eager sdpa=fused flash_attention_2=fused flash_attention_3=fused flex_attention=fused "
               "xformers=fused",
     ENUMS({"auto", -1}, {"eager", 0}, {"fused", 1}),
     .help = "transformers' attention: eager stores the attention probabilities (flash_attention: false); sdpa, "
             "flash_attention_2, ... are exact fused attention (flash_attention: true); auto = flash_attention's"},
    {.name = "sdp_attention", .type = KT_BOOL, .group = G_MEMORY, AT_INT(attn_sdp), .def = "false",
     .help = "Axolotl's PyTorch fused attention: true = flash_attention: true"},
    {.name = "xformers_attention", .type = KT_BOOL, .group = G_MEMORY, AT_INT(attn_xformers), .def = "false",
     .help = "Axolotl's xformers attention: true = flash_attention: true"},
    {.name = "gradient_checkpointing_kwargs", .type = KT_MAP, .group = G_MEMORY, .map = KM_CKPT_KWARGS,
     .help = "{use_reentrant: true or false}: PyTorch's two ways of recomputing give the same gradients, as "
             "snug's one"},
    {.name = "activation_offloading", .type = KT_BOOL, .group = G_MEMORY, AT_INT(activation_offloading),
     .def = "false", .help = "Axolotl's: gradient_checkpointing: offload (the layer inputs in host memory)"},
    {.name = "bf16", .type = KT_BOOL, .group = G_MEMORY, AT_INT(bf16), .def = "false", .values = "auto=true",
     .help = "mixed precision: parameters, saved activations and gradients stored as bfloat16, computed in fp32 "
             "(auto: true, as every device snug runs on has bf16)"},
    {.name = "fp16", .type = KT_BOOL, .group = G_MEMORY, AT_INT(fp16), .def = "false",
     .help = "mixed precision in float16 with dynamic loss scaling (from 2^16; halved and the step skipped on "
             "overflow, doubled after 2000 clean steps); needs master_weights"},
    {.name = "master_weights", .type = KT_BOOL, .group = G_MEMORY, AT_INT(master_weights), .def = "true",
     .help = "with bf16 or fp16, an fp32 copy of the weights takes the update (4 more bytes per parameter); "
             "false (bf16 only): the update is rounded to bf16 stochastically"},
    {.name = "chunked_cross_entropy", .type = KT_BOOL, .group = G_MEMORY, AT_INT(chunked_cross_entropy),
     .def = "false", .help = "compute the output projection and loss a chunk of tokens at a time, so the (tokens, "
             "vocab) logits never exist whole"},
    {.name = "cross_entropy_chunk_tokens", .type = KT_INT, .group = G_MEMORY, AT_INT(cross_entropy_chunk_tokens),
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
    {.name = "tiled_mlp", .type = KT_BOOL, .group = G_MEMORY, AT_INT(tiled_mlp), .def = "false",
     .help = "run each block's MLP over shards of the micro-batch's tokens (ALST's tiled MLP): its (tokens, "
             "intermediate) activations exist one shard at a time and are recomputed in backward, never saved"},
    {.name = "tiled_mlp_num_shards", .type = KT_INT, .group = G_MEMORY, AT_INT(tiled_mlp_num_shards), .def = "0",
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
    LATER("chat_template_jinja", KT_STRING, "a chat template in Jinja; set chat_template: chatml or llama3"),
    LATER("default_system_message", KT_STRING, "adding a system message to chats without one"),
    LATER("pretraining_dataset", KT_STRING, "streaming pretraining data; list the files under datasets"),
    LATER_BOOL("skip_prepare_dataset", "tokenizing during training; snug tokenizes ahead into the cache"),
    LATER_BOOL("resize_token_embeddings_to_32x", "padding the vocabulary to a multiple of 32"),
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
    {.name = "trust_remote_code", .type = KT_BOOL, .group = G_MODEL, AT_INT(trust_remote_code), .def = "false",
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
     AT_INT(eval_max_new_tokens), .def = "128",
     MIN(1), .help = "Axolotl's tokens per row of eval_table_size's table (which snug does not build)"},
    {.name = "tokenizer_type", .type = KT_STRING,
     .off = "AutoTokenizer PreTrainedTokenizerFast LlamaTokenizerFast LlamaTokenizer GPT2TokenizerFast "
            "GPT2Tokenizer Qwen2TokenizerFast Qwen2Tokenizer",
     .later = "choosing the tokenizer class; snug reads tokenizer.json (the fast tokenizer's file) for the classes "
              "of the architectures it builds"},
    LATER_BOOL("strict", "Axolotl's strict mode; snug always rejects unknown keys"),
};

#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

/* ---- small helpers ---- */

/* Whether the first wlen bytes of w are one of the space-separated words of list. */
/* Whether lr_scheduler written as s needs its floor given (transformers raises without one) */
static int sched_needs_floor(const char *s) {
    return !strcmp(s, "cosine_with_min_lr") || !strcmp(s, "cosine_warmup_with_min_lr");
}

static int word_matches(const char *list, const char *w, size_t wlen) {
    for (const char *p = list; p && *p;) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " ");
        if (n && n == wlen && memcmp(p, w, n) == 0)
            return 1;
        p += n;
    }
    return 0;
}

static int in_list(const char *list, const char *w) { return word_matches(list, w, strlen(w)); }

static int key_answers_to(const key_spec *k, const char *name) {
    return strcmp(k->name, name) == 0 || (k->aliases && in_list(k->aliases, name));
}

static int scope_of(const key_spec *k) {
    return k->group == G_DATASET ? SCOPE_DATASET : k->group == G_PLAN ? SCOPE_PLAN : SCOPE_RUN;
}

static const key_spec *find_key(const char *name, int scope) {
    for (int i = 0; i < NKEYS; i++)
        if (scope_of(&keys[i]) == scope && key_answers_to(&keys[i], name))
            return &keys[i];
    return NULL;
}

/* Case-insensitive Levenshtein distance; long inputs are clipped (a suggestion for them would be a guess anyway). */
static int edit_distance(const char *a, const char *b) {
    enum { MAXLEN = 96 };
    size_t na = strlen(a), nb = strlen(b);
    if (na > MAXLEN)
        na = MAXLEN;
    if (nb > MAXLEN)
        nb = MAXLEN;
    int prev[MAXLEN + 1], cur[MAXLEN + 1];
    for (size_t j = 0; j <= nb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (nb + 1));
    }
    return prev[nb];
}

/* The closest name or alias to `name` among the keys of one scope, or NULL when none is close. */
static const char *closest_key(const char *name, int scope, char *buf, size_t cap) {
    int best = INT_MAX;
    for (int i = 0; i < NKEYS; i++) {
        const key_spec *k = &keys[i];
        if (scope_of(k) != scope)
            continue;
        int d = edit_distance(name, k->name);
        if (d < best) {
            best = d;
            snprintf(buf, cap, "%s", k->name);
        }
        for (const char *p = k->aliases; p && *p;) {
            size_t n = strcspn(p, " ");
            char alias[96];
            snprintf(alias, sizeof alias, "%.*s", (int)n, p);
            d = edit_distance(name, alias);
            if (d < best) {
                best = d;
                snprintf(buf, cap, "%s", alias);
            }
            p += n;
            while (*p == ' ')
                p++;
        }
    }
    int len = (int)strlen(name);
    return (best <= 3 || best * 3 <= len) && best < len ? buf : NULL;
}

static int unknown_key(const char *name, int scope, const char *loc, snug_error *e) {
    char buf[96];
    const char *s = closest_key(name, scope, buf, sizeof buf);
    if (s)
        return snug_fail(e, SNUG_EINPUT, "unknown key '%.100s' in %s: did you mean '%s'?", name, loc, s);
    return snug_fail(e, SNUG_EINPUT, "unknown key '%.100s' in %s: `snug train --help` lists the keys", name, loc);
}

/* ---- parsing one value ---- */

/* Strict decimal or scientific number; rejects hex, inf, nan, trailing text and empty input. */
static int parse_double(const char *s, double *out) {
    if (!*s || strspn(s, "0123456789+-.eE") != strlen(s))
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* Returns 0, -1 for not a whole number, -2 for out of int range. */
static int parse_int(const char *s, int *out) {
    if (!*s || isspace((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end == '\0') {
        if (errno == ERANGE || v < INT_MIN || v > INT_MAX)
            return -2;
        *out = (int)v;
        return 0;
    }
    double d; /* "3.0" and "1e3" are whole numbers too */
    if (parse_double(s, &d) || d != floor(d))
        return -1;
    if (d < INT_MIN || d > INT_MAX)
        return -2;
    *out = (int)d;
    return 0;
}

static int parse_bool(const char *s, int *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return *out = 1, 0;
        if (strcasecmp(s, no[i]) == 0)
            return *out = 0, 0;
    }
    return -1;
}

/* "40GB", "40 GiB", "512MiB", "1000000": decimal units are powers of 1000, binary (KiB...) of 1024. */
static int parse_size(const char *s, double *out) {
    static const struct { const char *unit; double scale; } units[] = {
        {"", 1},        {"B", 1},          {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
        {"TB", 1e12},   {"KiB", 1024.0},   {"MiB", 1048576.0},   {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    char num[64];
    size_t n = strspn(s, "0123456789+-.eE");
    /* A unit starting with e/E ("EB") would be eaten as an exponent; snug has no such unit, so this is safe. */
    if (n == 0 || n >= sizeof num)
        return -1;
    memcpy(num, s, n);
    num[n] = '\0';
    double v;
    if (parse_double(num, &v) || v < 0)
        return -1;
    const char *u = s + n;
    while (*u == ' ')
        u++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(u, units[i].unit) == 0 && (*u || u == s + n)) {
            *out = v * units[i].scale;
            return isfinite(*out) ? 0 : -1;
        }
    return -1;
}

/* The canonical value of an enum spelling, or NULL; "adamw_torch=adamw" maps adamw_torch to adamw. */
static int enum_value(const char *values, const char *s, char *canon, size_t cap) {
    for (const char *p = values; *p;) {
        size_t n = strcspn(p, " ");
        const char *eq = memchr(p, '=', n);
        size_t spell = eq ? (size_t)(eq - p) : n;
        if (spell == strlen(s) && memcmp(p, s, spell) == 0) {
            if (eq)
                snprintf(canon, cap, "%.*s", (int)(n - spell - 1), eq + 1);
            else
                snprintf(canon, cap, "%.*s", (int)n, p);
            return 0;
        }
        p += n;
        while (*p == ' ')
            p++;
    }
    return -1;
}

/* "cosine, linear, constant" from "cosine linear constant constant_with_warmup=constant"; with all_spellings,
 * "cosine|linear|constant|constant_with_warmup". */
static void enum_choices(const char *values, const char *sep, int all_spellings, char *out, size_t cap) {
    out[0] = '\0';
    size_t len = 0;
    for (const char *p = values; *p && len < cap;) {
        size_t n = strcspn(p, " ");
        const char *eq = memchr(p, '=', n);
        if (!eq || all_spellings)
            len += (size_t)snprintf(out + len, cap - len, "%s%.*s", len ? sep : "", (int)(eq ? (size_t)(eq - p) : n), p);
        p += n;
        while (*p == ' ')
            p++;
    }
}

static const char *type_phrase(const key_spec *k, char *buf, size_t cap) {
    switch (k->type) {
    case KT_INT: return "an integer";
    case KT_FLOAT: return "a number";
    case KT_BOOL: return "true or false";
    case KT_STRING: return "a string";
    case KT_SIZE: return "a size such as 40GB, 40 GiB, 512MiB or a number of bytes";
    case KT_DATASETS: return "a list of datasets";
    case KT_LIST: return "a list";
    case KT_NAMES: return "a list of names (a YAML list, or names separated by commas)";
    case KT_MAP: return "a mapping";
    case KT_FSDP: return "a mapping of FSDP's options, or a JSON file's path";
    case KT_ENUM: {
        char choices[256];
        enum_choices(k->values, ", ", 0, choices, sizeof choices);
        snprintf(buf, cap, "one of %s", choices);
        return buf;
    }
    }
    return "?";
}

/* Sets one supported scalar key from text. base is snug_run_config, or snug_dataset_spec for G_DATASET keys. Writes
 * nothing on failure. `written` is the key as the user spelled it, so the message names what they wrote. */
static int set_text(void *base, const key_spec *k, const char *written, const char *text, const char *loc,
                    snug_error *e) {
    char *field = (char *)base + k->offset, buf[320];
    switch (k->type) {
    case KT_INT: {
        int v, rc = parse_int(text, &v);
        if (rc == -2)
            return snug_fail(e, SNUG_EINPUT, "%s: %s is out of range, got '%.60s'; use a value between %d and %d",
                             loc, written, text, INT_MIN, INT_MAX);
        if (rc)
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be an integer, got '%.60s'", loc, written, text);
        if (k->has_min && v < k->min)
            return snug_fail(e, SNUG_EINPUT, "%s: %s is %d; it must be at least %d", loc, written, v, k->min);
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case KT_FLOAT: {
        double v;
        if (k->positive && (parse_double(text, &v) || v <= 0))
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be a positive number such as %s, got '%.60s'", loc,
                             written, k->example, text);
        if (parse_double(text, &v))
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be a number such as 0.5 or 3e-4, got '%.60s'", loc,
                             written, text);
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case KT_SIZE: {
        double v;
        if (parse_size(text, &v))
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got '%.60s'", loc, written,
                             type_phrase(k, buf, sizeof buf), text);
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case KT_BOOL: {
        int v;
        char canon[16];
        /* a boolean may take extra spellings from `values` (bf16: auto, Axolotl's "when the hardware has it") */
        int extra = k->values && enum_value(k->values, text, canon, sizeof canon) == 0 && parse_bool(canon, &v) == 0;
        if (!extra && parse_bool(text, &v))
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be true or false, got '%.60s'", loc, written, text);
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case KT_NAMES:
        for (const char *c = text; *c; c++)
            if (!(isalnum((unsigned char)*c) || strchr("_.-, ", *c)))
                return snug_fail(e, SNUG_EINPUT, "%s: %s must list %s, separated by commas (or be a YAML list), "
                                 "got '%.60s'", loc, written,
                                 k->items ? k->items : "module names (letters, digits, '_', '.', '-')", text);
        __attribute__((fallthrough)); /* stored as written */
    case KT_STRING: {
        char canon[64]; /* other spellings of a value: resume_from_checkpoint: true is latest */
        if (k->values && enum_value(k->values, text, canon, sizeof canon) == 0)
            text = canon;
        if (strlen(text) >= k->size)
            return snug_fail(e, SNUG_EINPUT, "%s: %s is too long (%zu characters; at most %zu)", loc, written,
                             strlen(text), k->size - 1);
        memcpy(field, text, strlen(text) + 1);
        return 0;
    }
    case KT_ENUM: {
        char canon[64];
        if (enum_value(k->values, text, canon, sizeof canon) == 0)
            for (const enum_name *n = k->enums; n && n->name; n++)
                if (!strcmp(n->name, canon)) {
                    memcpy(field, &n->value, sizeof n->value);
                    return 0;
                }
        char choices[256];
        enum_choices(k->values, ", ", 0, choices, sizeof choices);
        if (k->later_values && (strcmp(k->later_values, "*") == 0 || in_list(k->later_values, text)))
            return snug_fail(e, SNUG_EINPUT, "%s: %s '%.60s' is not supported yet; use %s", loc, written, text,
                             choices);
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be one of %s, got '%.60s'", loc, written, choices, text);
    }
    case KT_DATASETS:
    case KT_LIST:
    case KT_MAP:
    case KT_FSDP:
        break;
    }
    return snug_fail(e, SNUG_EINTERNAL, "%s: %s has no scalar setter (a bug in snug's option table)", loc, written);
}

/* A key of a feature not built yet: fine when its value asks for nothing, refused otherwise. `text` is NULL for a
 * list or mapping; `nothing` says the value is null, empty, or an empty list or mapping. */
static int refuse_later(const key_spec *k, const char *written, const char *text, int nothing, const char *loc,
                        snug_error *e) {
    int b = 0;
    char canon[8] = "";
    if (text && k->type == KT_BOOL && parse_bool(text, &b) == 0) /* a bool's `off` holds true or false */
        snprintf(canon, sizeof canon, "%s", b ? "true" : "false");
    if (nothing || (canon[0] && (k->off ? in_list(k->off, canon) : !b)) ||
        (text && k->off && !canon[0] && in_list(k->off, text)))
        return 0;
    char alt[96] = "";
    if (k->type == KT_BOOL)
        snprintf(alt, sizeof alt, " or set it to %s", k->off ? k->off : "false");
    else if (k->off)
        snprintf(alt, sizeof alt, " or set it to %.*s", (int)strcspn(k->off, " "), k->off);
    return snug_fail(e, SNUG_EINPUT, "%s: %s is not supported yet (%s); remove it%s", loc, written, k->later, alt);
}

/* A key that changes nothing in snug: its value is checked for its type (a list or mapping, text NULL, is taken as
 * it is), then dropped. */
static int noop_value(const key_spec *k, const char *written, const char *text, int null, const char *loc,
                      snug_error *e) {
    int b, i;
    double d;
    if (null || !text)
        return 0;
    if ((k->type == KT_BOOL && parse_bool(text, &b)) || (k->type == KT_INT && parse_int(text, &i)) ||
        (k->type == KT_FLOAT && parse_double(text, &d)))
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got '%.60s'", loc, written,
                         k->type == KT_BOOL ? "true or false" : k->type == KT_INT ? "an integer" : "a number", text);
    return 0;
}

/* Sets every key of one scope to its default. */
static void apply_defaults(void *base, int scope) {
    for (int i = 0; i < NKEYS; i++) {
        const key_spec *k = &keys[i];
        if (scope_of(k) != scope || k->later || k->noop || k->type == KT_DATASETS)
            continue;
        if (k->def)
            set_text(base, k, k->name, k->def, "default", NULL);
        else if (k->type == KT_STRING)
            ((char *)base)[k->offset] = '\0';
    }
}

void snug_options_defaults(snug_run_config *o) {
    memset(o, 0, sizeof *o);
    apply_defaults(o, 0);
    o->fsdp_config_stage = -2;
    o->fsdp_activation_checkpointing = -1;
    o->min_lr = -1;
    snug_sched_params_default(&o->sched);
}

/* One list of dataset entries: datasets (training) or test_datasets (validation). */
typedef struct ds_list {
    snug_dataset_spec *d;
    int *n;
    const char *key;
} ds_list;

static ds_list list_of(snug_run_config *o, const key_spec *k) {
    if (!strcmp(k->name, "test_datasets"))
        return (ds_list){o->test_datasets, &o->ntest_datasets, "test_datasets"};
    return (ds_list){o->datasets, &o->ndatasets, "datasets"};
}

/* Adds a completion dataset; a relative path is taken relative to dir ("" = keep it as written). */
static int add_dataset_path(ds_list l, const char *path, const char *dir, const char *loc, snug_error *e) {
    if (*l.n >= SNUG_MAX_DATASETS)
        return snug_fail(e, SNUG_EINPUT, "%s: more than %d %s; merge some JSONL files", loc, SNUG_MAX_DATASETS,
                         l.key);
    if (!*path)
        return snug_fail(e, SNUG_EINPUT, "%s: a dataset path is empty; give a JSONL file", loc);
    snug_dataset_spec ds;
    memset(&ds, 0, sizeof ds);
    apply_defaults(&ds, 1);
    int n = *dir && path[0] != '/' ? snprintf(ds.path, sizeof ds.path, "%s/%s", dir, path)
                                   : snprintf(ds.path, sizeof ds.path, "%s", path);
    if (n < 0 || (size_t)n >= sizeof ds.path)
        return snug_fail(e, SNUG_EINPUT, "%s: dataset path '%.60s...' is too long (at most %zu characters)", loc,
                         path, sizeof ds.path - 1);
    l.d[(*l.n)++] = ds;
    return 0;
}

/* ---- YAML ---- */

typedef struct yaml_src {
    const char *path;     /* the config file, as given */
    char dir[1024];       /* its folder, "" when it is in the current directory */
    yaml_document_t *doc;
} yaml_src;

static void where_line(char *loc, size_t cap, const yaml_src *y, const yaml_node_t *n) {
    snprintf(loc, cap, "%s line %lu", y->path, (unsigned long)n->start_mark.line + 1);
}

static int node_is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static int node_is_empty(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return n->data.scalar.length == 0 || node_is_null(n);
    case YAML_SEQUENCE_NODE: return n->data.sequence.items.top == n->data.sequence.items.start;
    case YAML_MAPPING_NODE: return n->data.mapping.pairs.top == n->data.mapping.pairs.start;
    default: return 1;
    }
}

static const char *node_kind(const yaml_node_t *n) {
    return n->type == YAML_SEQUENCE_NODE ? "a list" : n->type == YAML_MAPPING_NODE ? "a mapping" : "a value";
}

/* The text of a scalar node, or NULL (with e filled) when it holds a NUL byte that C strings would cut short. */
static const char *node_text(const yaml_node_t *n, const char *written, const char *loc, snug_error *e) {
    const char *s = (const char *)n->data.scalar.value;
    if (strlen(s) != n->data.scalar.length) {
        snug_fail(e, SNUG_EINPUT, "%s: %s contains a NUL character; remove it", loc, written);
        return NULL;
    }
    return s;
}

/* Applies a YAML value to one scalar key (either scope): null means the default. */
static int apply_scalar_node(void *base, const key_spec *k, const char *written, const yaml_src *y,
                             const yaml_node_t *v, const char *loc, snug_error *e) {
    char buf[320];
    if (k->later)
        return refuse_later(k, written, v->type == YAML_SCALAR_NODE ? (const char *)v->data.scalar.value : NULL,
                            node_is_empty(v), loc, e);
    if (k->noop)
        return noop_value(k, written, v->type == YAML_SCALAR_NODE ? (const char *)v->data.scalar.value : NULL,
                          node_is_null(v), loc, e);
    if (k->type == KT_NAMES && v->type == YAML_SEQUENCE_NODE) { /* [q_proj, v_proj] is "q_proj,v_proj" */
        char joined[1024] = "";
        size_t len = 0;
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
            const yaml_node_t *item = yaml_document_get_node(y->doc, *it);
            if (!item || item->type != YAML_SCALAR_NODE)
                return snug_fail(e, SNUG_EINPUT, "%s: %s must list names, got %s in the list", loc, written,
                                 item ? node_kind(item) : "nothing");
            len += (size_t)snprintf(joined + len, len < sizeof joined ? sizeof joined - len : 0, "%s%s",
                                    len ? "," : "", (const char *)item->data.scalar.value);
        }
        if (len >= sizeof joined)
            return snug_fail(e, SNUG_EINPUT, "%s: %s lists too many names", loc, written);
        return set_text(base, k, written, joined, loc, e);
    }
    if (v->type != YAML_SCALAR_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got %s", loc, written, type_phrase(k, buf, sizeof buf),
                         node_kind(v));
    if (node_is_null(v))
        return set_text(base, k, written, k->def ? k->def : "", loc, e);
    const char *text = node_text(v, written, loc, e);
    return text ? set_text(base, k, written, text, loc, e) : SNUG_EINPUT;
}

/* ---- keys that hold a mapping or a list (map_kind) ---- */

/* The text of a scalar entry `name` of a KT_MAP key, or NULL with e filled. */
static const char *entry_text(const yaml_node_t *v, const char *written, const char *name, const char *loc,
                              snug_error *e) {
    char what[192];
    snprintf(what, sizeof what, "%s.%s", written, name);
    if (v->type != YAML_SCALAR_NODE) {
        snug_fail(e, SNUG_EINPUT, "%s: %s must be a single value, got %s", loc, what, node_kind(v));
        return NULL;
    }
    return node_is_null(v) ? "" : node_text(v, what, loc, e);
}

/* A value of a mapping copied into a field of cap bytes. */
static int entry_copy(char *dst, size_t cap, const char *text, const char *written, const char *name, const char *loc,
                      snug_error *e) {
    if (strlen(text) >= cap)
        return snug_fail(e, SNUG_EINPUT, "%s: %s.%s is too long (%zu characters; at most %zu)", loc, written, name,
                         strlen(text), cap - 1);
    memcpy(dst, text, strlen(text) + 1);
    return 0;
}

/* roles: {ROLE: [values] or value}: each role's values joined by commas into its field of cap bytes. */
static int load_roles(snug_dataset_spec *d, const char *written, const yaml_src *y, const yaml_node_t *v,
                      const char *loc, snug_error *e) {
    char *fields[3] = {d->roles_system, d->roles_user, d->roles_assistant};
    static const char *const names[3] = {"system", "user", "assistant"};
    for (int r = 0; r < 3; r++)
        fields[r][0] = '\0';
    for (yaml_node_pair_t *pr = v->data.mapping.pairs.start; pr < v->data.mapping.pairs.top; pr++) {
        const yaml_node_t *kn = yaml_document_get_node(y->doc, pr->key);
        const yaml_node_t *vn = yaml_document_get_node(y->doc, pr->value);
        const char *role = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "";
        int r = 0;
        while (r < 3 && strcmp(role, names[r]))
            r++;
        if (r == 3)
            return snug_fail(e, SNUG_EINPUT, "%s: %s names the role '%.40s'; snug's chat templates have system, user "
                             "and assistant", loc, written, role);
        size_t len = 0, cap = sizeof d->roles_user;
        int one = vn->type == YAML_SCALAR_NODE;
        if (!one && vn->type != YAML_SEQUENCE_NODE)
            return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must list the values that mean %s, got a mapping", loc, written,
                             role, role);
        yaml_node_item_t self = 0, *it = one ? &self : vn->data.sequence.items.start;
        yaml_node_item_t *end = one ? &self + 1 : vn->data.sequence.items.top;
        for (; it < end; it++) {
            const yaml_node_t *item = one ? vn : yaml_document_get_node(y->doc, *it);
            const char *text = item ? entry_text(item, written, role, loc, e) : NULL;
            if (!text)
                return e ? e->code : SNUG_EINPUT;
            if (!*text || strchr(text, ','))
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%s lists '%.40s'; a role value is a non-empty text without "
                                 "commas", loc, written, role, text);
            len += (size_t)snprintf(fields[r] + len, len < cap ? cap - len : 0, "%s%s", len ? "," : "", text);
            if (len >= cap)
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%s lists too many values", loc, written, role);
        }
    }
    return 0;
}

/* bnb_config_kwargs.llm_int8_skip_modules: the modules transformers leaves unquantized; snug quantizes every linear
 * module of the blocks and never the embedding or the head, so only those two may be named */
static int bnb_skip_modules(const char *written, const yaml_src *y, const yaml_node_t *vn, const char *loc,
                            snug_error *e) {
    if (node_is_null(vn))
        return 0;
    if (vn->type != YAML_SEQUENCE_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s.llm_int8_skip_modules must be a list of module names, got %s", loc,
                         written, node_kind(vn));
    for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
        const yaml_node_t *item = yaml_document_get_node(y->doc, *it);
        const char *s = item && item->type == YAML_SCALAR_NODE ? (const char *)item->data.scalar.value : "";
        if (strcmp(s, "lm_head") && strcmp(s, "embed_tokens"))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.llm_int8_skip_modules names '%.40s'; snug quantizes every linear "
                             "module of the blocks (and never lm_head or embed_tokens): keeping some of them in 16 "
                             "bits is not supported yet; remove it", loc, written, s);
    }
    return 0;
}

/* One bnb_config_kwargs entry (BitsAndBytesConfig's argument `name` = text) into o */
static int bnb_kwarg(snug_run_config *o, const char *written, const char *name, const char *text, const char *loc,
                     snug_error *e) {
    int b;
    if (!strcmp(name, "load_in_4bit") || !strcmp(name, "load_in_8bit") || !strcmp(name, "bnb_4bit_use_double_quant") ||
        !strcmp(name, "llm_int8_has_fp16_weight") || !strcmp(name, "llm_int8_enable_fp32_cpu_offload")) {
        if (parse_bool(text, &b))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must be true or false, got '%.40s'", loc, written, name, text);
        if (b && !strncmp(name, "llm_int8_", 9))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.%s: true is not supported yet (%s); set it to false", loc,
                             written, name, !strcmp(name, "llm_int8_has_fp16_weight")
                                                ? "16-bit weights kept beside the 8-bit ones"
                                                : "use offload_params: true to keep the base in host memory");
        int *f = !strcmp(name, "load_in_4bit") ? &o->load_in_4bit : !strcmp(name, "load_in_8bit") ? &o->load_in_8bit
                 : !strcmp(name, "bnb_4bit_use_double_quant") ? &o->bnb_4bit_use_double_quant : NULL;
        if (f)
            *f = b;
        return 0;
    }
    if (!strcmp(name, "bnb_4bit_quant_type")) {
        if (strcmp(text, "nf4") && strcmp(text, "fp4"))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.bnb_4bit_quant_type must be nf4 or fp4, got '%.40s'", loc,
                             written, text);
        o->bnb_4bit_quant_type = !strcmp(text, "fp4") ? SNUG_Q4_FP4 : SNUG_Q4_NF4;
        return 0;
    }
    if (!strcmp(name, "bnb_4bit_compute_dtype")) {
        const char *t = !strncmp(text, "torch.", 6) ? text + 6 : text;
        if (strcmp(t, "bfloat16") && strcmp(t, "bf16") && strcmp(t, "float16") && strcmp(t, "fp16"))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.bnb_4bit_compute_dtype must be bfloat16 or float16, got "
                             "'%.40s'", loc, written, text);
        o->bnb_4bit_compute_fp16 = !strcmp(t, "float16") || !strcmp(t, "fp16");
        return 0;
    }
    if (!strcmp(name, "bnb_4bit_quant_storage")) {
        const char *t = !strncmp(text, "torch.", 6) ? text + 6 : text;
        if (strcmp(t, "uint8") && strcmp(t, "int8") && strcmp(t, "bfloat16") && strcmp(t, "float16") &&
            strcmp(t, "float32"))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.bnb_4bit_quant_storage must be a torch dtype (uint8, bfloat16, "
                             "...), got '%.40s'", loc, written, text);
        return 0;
    }
    if (!strcmp(name, "llm_int8_threshold")) {
        double d;
        if (parse_double(text, &d) || !(d >= 0))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.llm_int8_threshold must be a number of 0 or more, got '%.40s'",
                             loc, written, text);
        return 0;
    }
    return snug_fail(e, SNUG_EINPUT, "%s: %s.%.40s is not an argument of BitsAndBytesConfig that snug reads "
                     "(load_in_4bit, load_in_8bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant, "
                     "bnb_4bit_compute_dtype, bnb_4bit_quant_storage, llm_int8_threshold, llm_int8_has_fp16_weight, "
                     "llm_int8_enable_fp32_cpu_offload, llm_int8_skip_modules)", loc, written, name);
}

/* A KT_MAP or KT_LIST key of a kind snug reads (k->map): its entries into base. */
static int load_map_key(void *base, const key_spec *k, const char *written, const yaml_src *y, const yaml_node_t *v,
                        const char *loc, snug_error *e) {
    if (node_is_null(v))
        v = NULL; /* null: the defaults */
    int want_list = k->type == KT_LIST;
    if (v && v->type != (want_list ? YAML_SEQUENCE_NODE : YAML_MAPPING_NODE))
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got %s", loc, written, want_list ? "a list" : "a mapping",
                         node_kind(v));
    snug_run_config *o = base;
    snug_dataset_spec *d = base;
    switch (k->map) {
    case KM_ROLES:
        d->roles_system[0] = d->roles_user[0] = d->roles_assistant[0] = '\0';
        return v ? load_roles(d, written, y, v, loc, e) : 0;
    case KM_ROLES_TO_TRAIN: /* [assistant]: what snug trains on */
        for (yaml_node_item_t *it = v ? v->data.sequence.items.start : NULL; v && it < v->data.sequence.items.top;
             it++) {
            const yaml_node_t *item = yaml_document_get_node(y->doc, *it);
            if (!item || item->type != YAML_SCALAR_NODE || strcmp((const char *)item->data.scalar.value, "assistant") ||
                v->data.sequence.items.top - v->data.sequence.items.start != 1)
                return snug_fail(e, SNUG_EINPUT, "%s: %s other than [assistant] is not supported yet (snug trains on "
                                 "the assistant's messages, or on every message with train_on_inputs: true); remove "
                                 "it or set it to [assistant]", loc, written);
        }
        return 0;
    case KM_UNFROZEN: { /* each item a pattern, joined by newlines */
        char *dst = (char *)base + k->offset;
        size_t at = 0;
        dst[0] = '\0';
        for (yaml_node_item_t *it = v ? v->data.sequence.items.start : NULL; v && it < v->data.sequence.items.top;
             it++) {
            const yaml_node_t *item = yaml_document_get_node(y->doc, *it);
            int idx = (int)(it - v->data.sequence.items.start);
            char name[16];
            snprintf(name, sizeof name, "[%d]", idx);
            const char *text = item ? entry_text(item, written, name, loc, e) : NULL;
            if (!text)
                return e ? e->code : SNUG_EINPUT;
            if (!*text || strchr(text, '\n'))
                return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] is %s; write one pattern of tensor names per item (an "
                                 "empty one would match every tensor: remove %s to train them all)", loc, written,
                                 idx, *text ? "more than one line" : "empty", written);
            if (at + strlen(text) + 2 > k->size)
                return snug_fail(e, SNUG_EINPUT, "%s: %s is too long (at most %zu characters in all); join patterns "
                                 "with |", loc, written, k->size - 2);
            at += (size_t)snprintf(dst + at, k->size - at, "%s%s", at ? "\n" : "", text);
        }
        return 0;
    }
    default:
        break;
    }
    if (k->map == KM_SPECIAL_TOKENS)
        o->pad_token[0] = o->eos_token[0] = o->bos_token[0] = o->unk_token[0] = '\0';
    if (k->map == KM_MESSAGE_FIELDS)
        snprintf(d->field_role, sizeof d->field_role, "role"), snprintf(d->field_content, sizeof d->field_content,
                                                                         "content");
    for (yaml_node_pair_t *pr = v ? v->data.mapping.pairs.start : NULL; v && pr < v->data.mapping.pairs.top; pr++) {
        const yaml_node_t *kn = yaml_document_get_node(y->doc, pr->key);
        const yaml_node_t *vn = yaml_document_get_node(y->doc, pr->value);
        const char *name = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "";
        if (k->map == KM_BNB_KWARGS && !strcmp(name, "llm_int8_skip_modules")) { /* a list of module names */
            SNUG_TRY(bnb_skip_modules(written, y, vn, loc, e));
            continue;
        }
        const char *text = entry_text(vn, written, name, loc, e);
        if (!text)
            return e ? e->code : SNUG_EINPUT;
        switch (k->map) {
        case KM_SPECIAL_TOKENS: {
            static const char *const names[] = {"pad_token", "eos_token", "bos_token", "unk_token"};
            char *fields[] = {o->pad_token, o->eos_token, o->bos_token, o->unk_token};
            int i = 0;
            while (i < 4 && strcmp(name, names[i]))
                i++;
            if (i == 4)
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%.40s is not supported; snug reads pad_token, eos_token, "
                                 "bos_token and unk_token (adding tokens to the vocabulary is not supported yet)", loc,
                                 written, name);
            SNUG_TRY(entry_copy(fields[i], sizeof o->pad_token, text, written, name, loc, e));
            break;
        }
        case KM_CKPT_KWARGS: {
            int b;
            if (strcmp(name, "use_reentrant"))
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%.40s is not supported; snug reads use_reentrant (true or "
                                 "false, the same gradients either way)", loc, written, name);
            if (*text && parse_bool(text, &b))
                return snug_fail(e, SNUG_EINPUT, "%s: %s.use_reentrant must be true or false, got '%.40s'", loc,
                                 written, text);
            break;
        }
        case KM_BNB_KWARGS:
            SNUG_TRY(bnb_kwarg(o, written, name, text, loc, e));
            break;
        case KM_SCHED_KWARGS: {
            /* entry k is SNUG_SCHED_KW_*'s bit k, and where its number goes (words: none) */
            const struct {
                const char *name;
                double *d;
                int *i;
            } kw[] = {
                {"min_lr_rate", &o->cosine_min_lr_ratio, NULL}, {"min_lr", &o->min_lr, NULL},
                {"num_cycles", &o->sched.num_cycles, NULL}, {"power", &o->sched.power, NULL},
                {"lr_end", &o->sched.lr_end, NULL}, {"timescale", NULL, &o->sched.timescale},
                {"num_decay_steps", NULL, &o->sched.wsd_decay}, {"num_stable_steps", NULL, &o->sched.wsd_stable},
                {"warmup_type", NULL, NULL}, {"decay_type", NULL, NULL},
                {"min_lr_ratio", &o->sched.wsd_min_ratio, NULL}, {"mode", NULL, NULL},
                {"factor", &o->sched.plat_factor, NULL}, {"patience", NULL, &o->sched.plat_patience},
                {"threshold", &o->sched.plat_threshold, NULL}, {"threshold_mode", NULL, NULL},
                {"cooldown", NULL, &o->sched.plat_cooldown}, {"eps", &o->sched.plat_eps, NULL},
                {"warmup_lr_rate", &o->sched.warmup_lr_rate, NULL},
            };
            _Static_assert(1u << (sizeof kw / sizeof kw[0] - 1) == SNUG_SCHED_KW_WARMUP_LR_RATE,
                           "one entry per SNUG_SCHED_KW_* bit, in bit order");
            int k = 0;
            while (k < (int)(sizeof kw / sizeof kw[0]) && strcmp(name, kw[k].name))
                k++;
            if (k == (int)(sizeof kw / sizeof kw[0]))
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%.40s is not a setting of transformers' schedules that snug "
                                 "reads (min_lr_rate, min_lr, num_cycles, power, lr_end, timescale, num_decay_steps, "
                                 "num_stable_steps, warmup_type, decay_type, min_lr_ratio, warmup_lr_rate; "
                                 "reduce_lr_on_plateau's mode, factor, patience, threshold, threshold_mode, cooldown, "
                                 "eps)", loc, written, name);
            unsigned bit = 1u << k;
            o->sched_given |= bit;
            if (bit & (SNUG_SCHED_KW_WARMUP_TYPE | SNUG_SCHED_KW_DECAY_TYPE)) {
                snug_wsd_shape *sh = bit == SNUG_SCHED_KW_WARMUP_TYPE ? &o->sched.wsd_warmup
                                                                      : &o->sched.wsd_decay_type;
                if (!strcmp(text, "linear") || !strcmp(text, "cosine") || !strcmp(text, "1-sqrt"))
                    *sh = !strcmp(text, "linear") ? SNUG_WSD_LINEAR : !strcmp(text, "cosine") ? SNUG_WSD_COSINE
                                                                                             : SNUG_WSD_1SQRT;
                else
                    return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must be linear, cosine or 1-sqrt, got '%.40s'", loc,
                                     written, name, text);
                break;
            }
            if (bit & (SNUG_SCHED_KW_MODE | SNUG_SCHED_KW_THRESHOLD_MODE)) { /* ReduceLROnPlateau's two words */
                int mode = bit == SNUG_SCHED_KW_MODE;
                const char *a = mode ? "min" : "rel", *b = mode ? "max" : "abs";
                if (strcmp(text, a) && strcmp(text, b))
                    return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must be %s or %s, got '%.40s'", loc, written, name, a,
                                     b, text);
                *(mode ? &o->sched.plat_max : &o->sched.plat_abs) = !strcmp(text, b);
                break;
            }
            double d;
            if (!*text || parse_double(text, &d) || !(d >= 0) || d > 1e9)
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must be a number of 0 or more, got '%.40s'", loc, written,
                                 name, text);
            if ((bit & (SNUG_SCHED_KW_TIMESCALE | SNUG_SCHED_KW_DECAY_STEPS | SNUG_SCHED_KW_STABLE_STEPS |
                        SNUG_SCHED_KW_PATIENCE | SNUG_SCHED_KW_COOLDOWN)) &&
                d != floor(d)) /* whole steps (evaluations) */
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%s is %g; it counts steps: a whole number", loc, written,
                                 name, d);
            if ((bit & (SNUG_SCHED_KW_NUM_CYCLES | SNUG_SCHED_KW_POWER)) && !(d > 0))
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must be above 0, got %g", loc, written, name, d);
            if (bit == SNUG_SCHED_KW_FACTOR && !(d < 1)) /* (torch raises too) */
                return snug_fail(e, SNUG_EINPUT, "%s: %s.factor is %g; reduce_lr_on_plateau multiplies the learning "
                                 "rate by it: below 1", loc, written, d);
            if ((bit == SNUG_SCHED_KW_MIN_LR_RATIO || bit == SNUG_SCHED_KW_WARMUP_LR_RATE) && d > 1)
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%s is %g; it is a fraction of learning_rate, 0 to 1", loc,
                                 written, name, d);
            if (kw[k].d)
                *kw[k].d = d;
            else
                *kw[k].i = (int)d;
            break;
        }
        case KM_MESSAGE_FIELDS:
            if (!strcmp(name, "role"))
                SNUG_TRY(entry_copy(d->field_role, sizeof d->field_role, *text ? text : "role", written, name, loc, e));
            else if (!strcmp(name, "content"))
                SNUG_TRY(entry_copy(d->field_content, sizeof d->field_content, *text ? text : "content", written, name,
                                    loc, e));
            else
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%.40s is not supported; snug reads a message's role and "
                                 "content", loc, written, name);
            break;
        default:
            return snug_fail(e, SNUG_EINTERNAL, "%s: %s has no reader (a bug in snug's option table)", loc, written);
        }
    }
    return 0;
}

/* Reads the keys of one mapping (the whole config, or one datasets entry) into base. */
static int load_mapping(void *base, int dataset_scope, const yaml_src *y, const yaml_node_t *map, const char *what,
                        snug_error *e);

static int load_dataset_entry(ds_list l, int index, const yaml_src *y, const yaml_node_t *item, snug_error *e) {
    char loc[1200], what[64];
    where_line(loc, sizeof loc, y, item);
    if (*l.n >= SNUG_MAX_DATASETS)
        return snug_fail(e, SNUG_EINPUT, "%s: more than %d %s; merge some JSONL files", loc, SNUG_MAX_DATASETS,
                         l.key);
    if (item->type == YAML_SCALAR_NODE) { /* "- data.jsonl" is short for "- path: data.jsonl" */
        const char *text = node_text(item, l.key, loc, e);
        return text ? add_dataset_path(l, text, y->dir, loc, e) : SNUG_EINPUT;
    }
    if (item->type != YAML_MAPPING_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] must be a mapping such as 'path: data.jsonl', got a list", loc,
                         l.key, index);
    snug_dataset_spec ds;
    memset(&ds, 0, sizeof ds);
    apply_defaults(&ds, 1);
    snprintf(what, sizeof what, "%s[%d]", l.key, index);
    SNUG_TRY(load_mapping(&ds, 1, y, item, what, e));
    if (!ds.path[0])
        return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] has no path; add 'path: data.jsonl'", loc, l.key, index);
    SNUG_TRY(add_dataset_path(l, ds.path, y->dir, loc, e));
    snug_dataset_spec *d = &l.d[*l.n - 1];
    snprintf(ds.path, sizeof ds.path, "%s", d->path); /* joined to the file's folder */
    *d = ds;
    return 0;
}

static int load_datasets(ds_list l, const char *written, const yaml_src *y, const yaml_node_t *v, const char *loc,
                         snug_error *e) {
    *l.n = 0;
    if (node_is_null(v))
        return 0;
    if (v->type == YAML_SCALAR_NODE) { /* "datasets: data.jsonl": one completion dataset */
        const char *text = node_text(v, written, loc, e);
        return text ? add_dataset_path(l, text, y->dir, loc, e) : SNUG_EINPUT;
    }
    if (v->type == YAML_MAPPING_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be a list; write each dataset as '- path: data.jsonl'", loc,
                         written);
    int index = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++, index++)
        SNUG_TRY(load_dataset_entry(l, index, y, yaml_document_get_node(y->doc, *it), e));
    return 0;
}

/* ---- fsdp_config ---- */

/* FSDP's options map: Axolotl writes it as a YAML mapping, Hugging Face's Trainer takes a JSON file's path
 * (--fsdp_config), and both spell each key with or without the fsdp_ prefix (the Trainer strips it). Its sharding
 * means a ZeRO stage and its activation_checkpointing means gradient_checkpointing: full (both resolved with the
 * rest of the sharding keys in apply_fsdp). The keys that tune how FSDP wraps, prefetches, loads and saves ask for
 * what snug does anyway (one decoder layer gathered and reduced at a time, the next one prefetched, every rank
 * loading the file a block at a time, each rank's shards in checkpoints and a whole model at the end), so they are
 * checked and accepted; offloading, hybrid sharding and XLA are refused. */
typedef enum fsdp_kind {
    FK_STRATEGY, /* FULL_SHARD, SHARD_GRAD_OP, NO_SHARD (or 1, 2, 3: torch's ShardingStrategy) */
    FK_RESHARD,  /* FSDP2: true (FULL_SHARD) or false (SHARD_GRAD_OP); FSDP1: a strategy's name */
    FK_OFFLOAD,  /* true is refused */
    FK_CKPT,     /* activation_checkpointing */
    FK_BOOL,     /* accepted either way */
    FK_CHOICE,   /* one of `values`, any case */
    FK_NAMES,    /* a name or a list of names */
    FK_COUNT,    /* an integer >= 0 */
    FK_XLA,      /* true is refused */
    FK_XLA_MAP,  /* a non-empty mapping is refused */
} fsdp_kind;

typedef struct fsdp_key {
    const char *name;
    fsdp_kind kind;
    const char *values; /* FK_CHOICE */
} fsdp_key;

static const fsdp_key fsdp_keys[] = {
    {"sharding_strategy", FK_STRATEGY, NULL},
    {"reshard_after_forward", FK_RESHARD, NULL},
    {"offload_params", FK_OFFLOAD, NULL},
    {"cpu_offload", FK_OFFLOAD, NULL},
    {"activation_checkpointing", FK_CKPT, NULL},
    {"auto_wrap_policy", FK_CHOICE, "TRANSFORMER_BASED_WRAP SIZE_BASED_WRAP"},
    {"transformer_layer_cls_to_wrap", FK_NAMES, NULL},
    {"min_num_params", FK_COUNT, NULL},
    {"backward_prefetch", FK_CHOICE, "BACKWARD_PRE BACKWARD_POST NO_PREFETCH"},
    {"forward_prefetch", FK_BOOL, NULL},
    {"limit_all_gathers", FK_BOOL, NULL},
    {"use_orig_params", FK_BOOL, NULL},
    {"sync_module_states", FK_BOOL, NULL},
    {"cpu_ram_efficient_loading", FK_BOOL, NULL},
    {"state_dict_type", FK_CHOICE, "FULL_STATE_DICT SHARDED_STATE_DICT"},
    {"version", FK_CHOICE, "1 2"},
    {"xla", FK_XLA, NULL},
    {"xla_fsdp_v2", FK_XLA, NULL},
    {"xla_fsdp_grad_ckpt", FK_XLA, NULL},
    {"xla_fsdp_settings", FK_XLA_MAP, NULL},
};
#define NFSDP_KEYS ((int)(sizeof fsdp_keys / sizeof fsdp_keys[0]))

/* One value of fsdp_config, from YAML or JSON. */
typedef struct fsdp_value {
    const char *text; /* a scalar as written (JSON booleans and numbers as text); NULL for a list or mapping */
    int null;         /* null: asks for nothing */
    int list, map, n; /* a list or a mapping of n entries */
    int names;        /* a list whose every entry is a name */
} fsdp_value;

/* What one fsdp_config says, before apply_fsdp weighs it against fsdp and zero_stage. */
typedef struct fsdp_read {
    int strategy, reshard, ckpt; /* -1: not said */
    int offload;                 /* offload_params or cpu_offload true */
    int seen[NFSDP_KEYS];
} fsdp_read;

static int is_name(const char *s) {
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '.'))
            return 0;
    return 1;
}

/* The ZeRO stage a sharding strategy means: 3, 2 or 0; -2 for hybrid sharding; -1 for anything else. */
static int strategy_stage(const char *s) {
    static const struct { const char *name, *number; int stage; } st[] = {
        {"FULL_SHARD", "1", 3},   {"SHARD_GRAD_OP", "2", 2},         {"NO_SHARD", "3", 0},
        {"HYBRID_SHARD", "4", -2}, {"_HYBRID_SHARD_ZERO2", "5", -2}, {"HYBRID_SHARD_ZERO2", "", -2},
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        if (!strcasecmp(s, st[i].name) || !strcmp(s, st[i].number))
            return st[i].stage;
    return -1;
}

static int fsdp_entry(fsdp_read *r, const char *name, const fsdp_value *v, const char *loc, snug_error *e) {
    const char *key = strncmp(name, "fsdp_", 5) ? name : name + 5;
    int ki = -1, best = INT_MAX;
    const char *near = NULL;
    for (int i = 0; i < NFSDP_KEYS && ki < 0; i++) {
        int d = edit_distance(key, fsdp_keys[i].name);
        if (d == 0)
            ki = i;
        else if (d < best)
            best = d, near = fsdp_keys[i].name;
    }
    if (ki < 0) {
        if (near && (best <= 3 || best * 3 <= (int)strlen(key)))
            return snug_fail(e, SNUG_EINPUT, "%s: unknown fsdp_config key '%.100s': did you mean '%s'?", loc, name,
                             near);
        return snug_fail(e, SNUG_EINPUT, "%s: unknown fsdp_config key '%.100s': `snug train --help` lists those "
                         "snug reads under fsdp_config", loc, name);
    }
    const fsdp_key *k = &fsdp_keys[ki];
    if (r->seen[ki]++)
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config sets %s twice (with and without the fsdp_ prefix?); keep "
                         "one", loc, k->name);
    if (v->null)
        return 0;
    if (k->kind == FK_NAMES) {
        if (v->text ? is_name(v->text) : v->list && v->names)
            return 0;
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s must name the layer class (LlamaDecoderLayer) or list "
                         "such names", loc, name);
    }
    if (k->kind == FK_XLA_MAP) {
        if (v->map && v->n == 0)
            return 0;
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s is for FSDP on TPUs through XLA, which snug does not "
                         "run on; remove it", loc, name);
    }
    if (!v->text)
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s must be a single value, got %s", loc, name,
                         v->list ? "a list" : "a mapping");
    int b = 0, isbool = parse_bool(v->text, &b) == 0;
    switch (k->kind) {
    case FK_STRATEGY:
    case FK_RESHARD: {
        int stage = k->kind == FK_RESHARD && isbool ? (b ? 3 : 2) : strategy_stage(v->text);
        if (stage == -2)
            return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s %s (sharding within each node, replicas across "
                             "nodes) is not supported yet; use FULL_SHARD or SHARD_GRAD_OP", loc, name, v->text);
        if (stage == -1)
            return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s must be %s, got '%.60s'", loc, name,
                             k->kind == FK_RESHARD ? "true (FULL_SHARD), false (SHARD_GRAD_OP) or a sharding "
                                                     "strategy's name"
                                                   : "FULL_SHARD, SHARD_GRAD_OP or NO_SHARD (or 1, 2, 3)",
                             v->text);
        *(k->kind == FK_RESHARD ? &r->reshard : &r->strategy) = stage;
        return 0;
    }
    case FK_OFFLOAD:
    case FK_XLA:
    case FK_CKPT:
    case FK_BOOL:
        if (!isbool)
            return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s must be true or false, got '%.60s'", loc, name,
                             v->text);
        if (k->kind == FK_OFFLOAD)
            r->offload |= b;
        if (b && k->kind == FK_XLA)
            return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s is for FSDP on TPUs through XLA, which snug does "
                             "not run on; remove it or set it to false", loc, name);
        if (k->kind == FK_CKPT)
            r->ckpt = b;
        return 0;
    case FK_CHOICE:
        for (const char *p = k->values; *p;) {
            size_t n = strcspn(p, " ");
            if (n == strlen(v->text) && !strncasecmp(p, v->text, n))
                return 0;
            p += n + (p[n] == ' ');
        }
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s must be one of %s, got '%.60s'%s", loc, name,
                         k->values, v->text,
                         !strcasecmp(v->text, "NO_WRAP") ? " (snug gathers and reduces one decoder layer at a time, "
                                                           "as TRANSFORMER_BASED_WRAP does)" : "");
    case FK_COUNT: {
        int c;
        if (parse_int(v->text, &c) || c < 0)
            return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's %s must be a whole number of parameters, got "
                             "'%.60s'", loc, name, v->text);
        return 0;
    }
    case FK_NAMES:
    case FK_XLA_MAP:
        break;
    }
    return 0;
}

/* Stores what one whole fsdp_config said: the stage (a sharding_strategy and a reshard_after_forward that disagree
 * are refused) and activation_checkpointing. */
static int fsdp_store(snug_run_config *o, const fsdp_read *r, const char *loc, snug_error *e) {
    if (r->strategy >= 0 && r->reshard >= 0 && r->strategy != r->reshard)
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's sharding_strategy means ZeRO stage %d but its "
                         "reshard_after_forward means stage %d; keep one", loc, r->strategy, r->reshard);
    o->fsdp_config_stage = r->strategy >= 0 ? r->strategy : r->reshard;
    o->fsdp_activation_checkpointing = r->ckpt;
    o->fsdp_offload_params = r->offload;
    return 0;
}

/* fsdp_config as a JSON file (Hugging Face's --fsdp_config FILE). An empty path clears it. */
static int fsdp_config_file(snug_run_config *o, const char *path, const char *where, snug_error *e) {
    o->fsdp_config_stage = -2;
    o->fsdp_activation_checkpointing = -1;
    o->fsdp_offload_params = 0;
    if (!*path)
        return 0;
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config: %s line %d: %s; give FSDP's options as a JSON object, or "
                         "as a mapping in the YAML", where, path, je.line, je.text);
    int rc = 0;
    char loc[1200];
    snprintf(loc, sizeof loc, "fsdp_config %s", path);
    if (!json_is_object(j))
        rc = snug_fail(e, SNUG_EINPUT, "%s: must hold a JSON object such as {\"sharding_strategy\": \"FULL_SHARD\"}",
                       loc);
    fsdp_read r = {.strategy = -1, .reshard = -1, .ckpt = -1};
    const char *name;
    json_t *jv;
    json_object_foreach(j, name, jv) {
        if (rc)
            break;
        char num[64];
        fsdp_value v = {.null = json_is_null(jv), .list = json_is_array(jv), .map = json_is_object(jv)};
        if (json_is_string(jv))
            v.text = json_string_value(jv);
        else if (json_is_boolean(jv))
            v.text = json_is_true(jv) ? "true" : "false";
        else if (json_is_integer(jv))
            snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(jv)), v.text = num;
        else if (json_is_real(jv))
            snprintf(num, sizeof num, "%.17g", json_real_value(jv)), v.text = num;
        v.n = v.list ? (int)json_array_size(jv) : v.map ? (int)json_object_size(jv) : 0;
        v.names = v.list;
        for (size_t i = 0; v.list && i < json_array_size(jv); i++) {
            json_t *item = json_array_get(jv, i);
            v.names &= json_is_string(item) && is_name(json_string_value(item));
        }
        rc = fsdp_entry(&r, name, &v, loc, e);
    }
    if (!rc)
        rc = fsdp_store(o, &r, loc, e);
    json_decref(j);
    return rc;
}

/* fsdp_config in the YAML: a mapping, or a JSON file's path. */
static int load_fsdp_config(snug_run_config *o, const char *written, const yaml_src *y, const yaml_node_t *v,
                            const char *loc, snug_error *e) {
    if (node_is_empty(v)) /* asks for nothing */
        return fsdp_config_file(o, "", loc, e);
    if (v->type == YAML_SCALAR_NODE) {
        const char *text = node_text(v, written, loc, e);
        return text ? fsdp_config_file(o, text, loc, e) : SNUG_EINPUT;
    }
    if (v->type != YAML_MAPPING_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be a mapping of FSDP's options (sharding_strategy: FULL_SHARD) "
                         "or a JSON file's path, got a list", loc, written);
    fsdp_read r = {.strategy = -1, .reshard = -1, .ckpt = -1};
    char here[1300];
    for (yaml_node_pair_t *pr = v->data.mapping.pairs.start; pr < v->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(y->doc, pr->key), *vn = yaml_document_get_node(y->doc, pr->value);
        snprintf(here, sizeof here, "%s line %lu", y->path, (unsigned long)kn->start_mark.line + 1);
        if (kn->type != YAML_SCALAR_NODE)
            return snug_fail(e, SNUG_EINPUT, "%s: a key of %s must be a plain name, got %s", here, written,
                             node_kind(kn));
        fsdp_value fv = {.null = node_is_null(vn), .list = vn->type == YAML_SEQUENCE_NODE,
                         .map = vn->type == YAML_MAPPING_NODE};
        if (vn->type == YAML_SCALAR_NODE && !fv.null && !(fv.text = node_text(vn, written, here, e)))
            return SNUG_EINPUT;
        if (fv.list) {
            fv.n = (int)(vn->data.sequence.items.top - vn->data.sequence.items.start);
            fv.names = 1;
            for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
                const yaml_node_t *item = yaml_document_get_node(y->doc, *it);
                fv.names &= item && item->type == YAML_SCALAR_NODE &&
                            strlen((const char *)item->data.scalar.value) == item->data.scalar.length &&
                            is_name((const char *)item->data.scalar.value);
            }
        } else if (fv.map) {
            fv.n = (int)(vn->data.mapping.pairs.top - vn->data.mapping.pairs.start);
        }
        SNUG_TRY(fsdp_entry(&r, (const char *)kn->data.scalar.value, &fv, here, e));
    }
    return fsdp_store(o, &r, loc, e);
}

static int load_mapping(void *base, int dataset_scope, const yaml_src *y, const yaml_node_t *map, const char *what,
                        snug_error *e) {
    unsigned long seen[NKEYS] = {0}; /* line where each key was set, to catch a key given twice */
    const char *seen_as[NKEYS] = {0};
    char loc[1300];
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(y->doc, pr->key), *v = yaml_document_get_node(y->doc, pr->value);
        unsigned long line = (unsigned long)kn->start_mark.line + 1;
        if (*what)
            snprintf(loc, sizeof loc, "%s in %s line %lu", what, y->path, line);
        else
            snprintf(loc, sizeof loc, "%s line %lu", y->path, line);
        if (kn->type != YAML_SCALAR_NODE)
            return snug_fail(e, SNUG_EINPUT, "%s: a key must be a plain name, got %s", loc, node_kind(kn));
        const char *name = (const char *)kn->data.scalar.value;
        const key_spec *k = find_key(name, dataset_scope);
        if (!k)
            return unknown_key(name, dataset_scope, loc, e);
        int ki = (int)(k - keys);
        if (seen[ki])
            return snug_fail(e, SNUG_EINPUT, "%s: %s is set twice (as %s on line %lu); keep one", loc, name,
                             seen_as[ki], seen[ki]);
        seen[ki] = line;
        seen_as[ki] = name;
        if (k->type == KT_DATASETS && !k->later)
            SNUG_TRY(load_datasets(list_of(base, k), name, y, v, loc, e));
        else if (k->type == KT_FSDP)
            SNUG_TRY(load_fsdp_config(base, name, y, v, loc, e));
        else if ((k->type == KT_MAP || k->type == KT_LIST) && !k->later)
            SNUG_TRY(load_map_key(base, k, name, y, v, loc, e));
        else
            SNUG_TRY(apply_scalar_node(base, k, name, y, v, loc, e));
        if (dataset_scope && !strcmp(k->name, "chat_template"))
            ((snug_dataset_spec *)base)->chat_template_own = 1;
        if (dataset_scope && !strcmp(k->name, "type") && v->type == YAML_SCALAR_NODE)
            ((snug_dataset_spec *)base)->type_chat_template = !strcmp((const char *)v->data.scalar.value,
                                                                      "chat_template");
        if (!dataset_scope && !strcmp(k->name, "chat_template"))
            ((snug_run_config *)base)->chat_template_set = 1;
        if (!dataset_scope && !strcmp(k->name, "lr_scheduler") && v->type == YAML_SCALAR_NODE)
            ((snug_run_config *)base)->sched_min_lr = sched_needs_floor((const char *)v->data.scalar.value);
    }
    return 0;
}

static int yaml_syntax_error(const yaml_parser_t *p, const char *path, snug_error *e) {
    if (p->error == YAML_MEMORY_ERROR)
        return snug_fail(e, SNUG_ENOMEM, "%s: out of memory while reading the YAML", path);
    if (p->error == YAML_READER_ERROR)
        return snug_fail(e, SNUG_EINPUT, "%s byte %lu: %s; save the file as UTF-8 text", path,
                         (unsigned long)p->problem_offset, p->problem ? p->problem : "unreadable text");
    char context[256] = "";
    if (p->context)
        snprintf(context, sizeof context, " (%s that starts on line %lu)", p->context,
                 (unsigned long)p->context_mark.line + 1);
    return snug_fail(e, SNUG_EINPUT,
                     "%s line %lu column %lu: YAML syntax error: %s%s; check the indentation, the ': ' after each "
                     "key and the quotes there",
                     path, (unsigned long)p->problem_mark.line + 1, (unsigned long)p->problem_mark.column + 1,
                     p->problem ? p->problem : "invalid YAML", context);
}

static int load_document(snug_run_config *o, yaml_src *y, snug_error *e) {
    yaml_node_t *root = yaml_document_get_root_node(y->doc);
    if (!root || node_is_null(root)) /* an empty file keeps every default */
        return 0;
    if (root->type != YAML_MAPPING_NODE) {
        char loc[1200];
        where_line(loc, sizeof loc, y, root);
        return snug_fail(e, SNUG_EINPUT, "%s: the config must be 'key: value' lines, got %s", loc,
                         root->type == YAML_SEQUENCE_NODE ? "a list" : "a single value");
    }
    return load_mapping(o, 0, y, root, "", e);
}

int snug_options_load_yaml(snug_run_config *o, const char *path, snug_error *e) {
    snug_run_config tmp = *o; /* o changes only when the whole file is good */
    if (strlen(path) >= sizeof tmp.config_path)
        return snug_fail(e, SNUG_EINPUT, "config path '%.60s...' is too long (at most %zu characters)", path,
                         sizeof tmp.config_path - 1);
    memcpy(tmp.config_path, path, strlen(path) + 1);

    yaml_src y = {.path = path};
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(y.dir, sizeof y.dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);

    FILE *f = fopen(path, "rb");
    if (!f)
        return snug_fail(e, SNUG_EINPUT, "cannot open config '%s': %s; check the path", path, strerror(errno));
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        return snug_fail(e, SNUG_ENOMEM, "%s: out of memory starting the YAML parser", path);
    }
    yaml_parser_set_input_file(&p, f);
    yaml_document_t doc;
    int rc;
    if (!yaml_parser_load(&p, &doc)) {
        rc = yaml_syntax_error(&p, path, e);
    } else {
        y.doc = &doc;
        rc = load_document(&tmp, &y, e);
        yaml_document_delete(&doc);
        if (rc == 0) { /* a second document ("---") would be silently ignored: refuse it */
            if (!yaml_parser_load(&p, &doc)) {
                rc = yaml_syntax_error(&p, path, e);
            } else {
                yaml_node_t *root = yaml_document_get_root_node(&doc);
                if (root)
                    rc = snug_fail(e, SNUG_EINPUT, "%s line %lu: a second YAML document starts here; put all keys "
                                   "in one document", path, (unsigned long)doc.start_mark.line + 1);
                yaml_document_delete(&doc);
            }
        }
    }
    yaml_parser_delete(&p);
    fclose(f);
    /* like dataset paths, a relative tokenizer path written in the file is relative to the file */
    if (rc == 0 && y.dir[0] && tmp.tokenizer[0] && tmp.tokenizer[0] != '/' && strcmp(tmp.tokenizer, o->tokenizer)) {
        char joined[sizeof tmp.tokenizer];
        if (snprintf(joined, sizeof joined, "%s/%s", y.dir, tmp.tokenizer) >= (int)sizeof joined)
            rc = snug_fail(e, SNUG_EINPUT, "%s: tokenizer path is too long", path);
        else
            memcpy(tmp.tokenizer, joined, sizeof joined);
    }
    if (rc == 0)
        *o = tmp;
    return rc;
}

/* ---- command line ---- */

int snug_options_set(snug_run_config *o, const char *key, const char *value, const char *where, snug_error *e) {
    char name[128];
    if (strlen(key) >= sizeof name)
        return unknown_key(key, 0, where, e);
    for (size_t i = 0;; i++) { /* --learning-rate is --learning_rate */
        name[i] = key[i] == '-' ? '_' : key[i];
        if (!key[i])
            break;
    }
    const key_spec *k = find_key(name, 0);
    if (!k)
        return unknown_key(key, 0, where, e);
    if (k->later)
        return refuse_later(k, key, value, !*value, where, e);
    if (k->noop)
        return noop_value(k, key, value, !*value, where, e);
    if (k->type == KT_DATASETS)
        return add_dataset_path(list_of(o, k), value, "", where, e);
    if (k->type == KT_FSDP)
        return fsdp_config_file(o, value, where, e);
    if (k->type == KT_MAP || k->type == KT_LIST)
        return snug_fail(e, SNUG_EINPUT, "%s: %s is a %s; set it in the YAML config", where, key,
                         k->type == KT_MAP ? "mapping" : "list");
    if (!strcmp(k->name, "chat_template"))
        o->chat_template_set = 1;
    if (!strcmp(k->name, "lr_scheduler"))
        o->sched_min_lr = sched_needs_floor(value);
    return set_text(o, k, key, value, where, e);
}

/* Steps over one argument at *i. Returns 1 for an option (key and value filled), 0 for a plain argument, or an
 * error code. */
static int next_arg(int argc, char **argv, int *i, char *key, size_t cap, const char **value, snug_error *e) {
    const char *a = argv[*i];
    if (a[0] != '-' || !a[1])
        return 0; /* "-" is a plain argument too */
    if (a[1] != '-' || !a[2])
        return snug_fail(e, SNUG_EINPUT, "command line: unknown option '%.60s'; options are written --key value", a);
    const char *eq = strchr(a + 2, '=');
    size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
    if (n >= cap)
        return snug_fail(e, SNUG_EINPUT, "command line: option '%.60s...' is too long", a);
    memcpy(key, a + 2, n);
    key[n] = '\0';
    if (eq) {
        *value = eq + 1;
        return 1;
    }
    const key_spec *k = find_key(key, 0);
    int next_is_value = *i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0, b;
    if (k && k->type == KT_BOOL && (!next_is_value || parse_bool(argv[*i + 1], &b))) { /* bare --flag: true */
        *value = "true";
        return 1;
    }
    if (*i + 1 >= argc)
        return snug_fail(e, SNUG_EINPUT, "command line: --%s needs a value: --%s VALUE or --%s=VALUE", key, key, key);
    *value = argv[++*i];
    return 1;
}

/* deepspeed: ds_config.json. Its zero_optimization.stage means what zero_stage means, so it sets it (a zero_stage
 * given too must agree), and so does its overlap_comm for zero_overlap_comm; stages not built and offloading to the
 * CPU or NVMe are refused naming the file's key. */
static int apply_deepspeed(snug_run_config *o, snug_error *e) {
    if (!o->deepspeed[0])
        return 0;
    json_error_t je;
    json_t *j = json_load_file(o->deepspeed, 0, &je);
    if (!j)
        return snug_fail(e, SNUG_EINPUT, "deepspeed: %s line %d: %s; give DeepSpeed's ds_config.json (JSON)",
                         o->deepspeed, je.line, je.text);
    const char *ds = o->deepspeed;
    json_t *z = json_object_get(j, "zero_optimization"), *st = z ? json_object_get(z, "stage") : NULL;
    int rc = 0, stage = 0;
    if (z && !json_is_object(z))
        rc = snug_fail(e, SNUG_EINPUT, "deepspeed: %s: zero_optimization must be an object such as {\"stage\": 1}",
                       ds);
    else if (st && (!json_is_integer(st) || json_integer_value(st) < 0 || json_integer_value(st) > 3))
        rc = snug_fail(e, SNUG_EINPUT, "deepspeed: %s: zero_optimization.stage must be 0, 1, 2 or 3", ds);
    else if (st)
        stage = (int)json_integer_value(st);
    static const char *const offloads[] = {"offload_optimizer", "offload_param"};
    for (int i = 0; !rc && z && i < 2; i++) {
        json_t *off = json_object_get(z, offloads[i]), *dev = off ? json_object_get(off, "device") : NULL;
        const char *d = dev && json_is_string(dev) ? json_string_value(dev) : NULL;
        if (i == 1 && d && !strcmp(d, "cpu")) { /* the parameters in host memory: offload_params (a frozen base) */
            o->offload_params = 1;
        } else if (i == 0 && d && !strcmp(d, "cpu")) {
            /* the optimizer state in host memory: a paged optimizer (its state streamed through the device for the
             * step, which runs there rather than on the CPU) */
            if (o->optimizer == SNUG_OPTIMIZER_ADAMW)
                o->optimizer = SNUG_OPTIMIZER_PAGED_ADAMW_32BIT;
            else if (o->optimizer == SNUG_OPTIMIZER_ADAMW_8BIT)
                o->optimizer = SNUG_OPTIMIZER_PAGED_ADAMW_8BIT;
        } else if (dev && !(d && !strcmp(d, "none"))) {
            rc = snug_fail(e, SNUG_EINPUT, "deepspeed: %s: zero_optimization.%s.device is %s: snug offloads to cpu "
                           "only; set it to cpu or none", ds, offloads[i], d ? d : "not a string");
        }
    }
    if (!rc && st && o->zero_stage && o->zero_stage != stage)
        rc = snug_fail(e, SNUG_EINPUT, "zero_stage is %d but deepspeed's %s sets zero_optimization.stage %d; keep one",
                       o->zero_stage, ds, stage);
    if (!rc && st)
        o->zero_stage = stage;
    json_t *ov = z ? json_object_get(z, "overlap_comm") : NULL; /* the same lever: reductions beside backward */
    snug_overlap_choice want = ov && json_is_true(ov) ? SNUG_OVERLAP_ON : SNUG_OVERLAP_OFF;
    if (!rc && ov && !json_is_boolean(ov))
        rc = snug_fail(e, SNUG_EINPUT, "deepspeed: %s: zero_optimization.overlap_comm must be true or false", ds);
    else if (!rc && ov && o->zero_overlap_comm != SNUG_OVERLAP_AUTO && o->zero_overlap_comm != want)
        rc = snug_fail(e, SNUG_EINPUT, "zero_overlap_comm is %s but deepspeed's %s sets zero_optimization.overlap_comm "
                       "%s; keep one", want == SNUG_OVERLAP_ON ? "false" : "true", ds,
                       want == SNUG_OVERLAP_ON ? "true" : "false");
    else if (!rc && ov)
        o->zero_overlap_comm = want;
    json_decref(j);
    return rc;
}

/* fsdp and fsdp_config: FSDP's sharding means a ZeRO stage (FULL_SHARD = 3, SHARD_GRAD_OP = 2, NO_SHARD = 0),
 * which sets zero_stage. `fsdp` lists the strategy as Hugging Face's Trainer takes it ([full_shard, auto_wrap]), or is
 * true (the Trainer's newer spelling: the strategy is fsdp_config's); fsdp_config's sharding_strategy or
 * reshard_after_forward must agree with it, and a zero_stage given too with both. FSDP without a named strategy is
 * FULL_SHARD, as FSDP's default is, unless zero_stage names the stage. fsdp_config's activation_checkpointing turns
 * gradient_checkpointing on (full) where it is off. */
static int apply_fsdp(snug_run_config *o, snug_error *e) {
    if (o->fsdp_version > 2)
        return snug_fail(e, SNUG_EINPUT, "fsdp_version is %d; it must be 1 or 2 (both shard the same way in snug)",
                         o->fsdp_version);
    int stage = -1, on = -1; /* on: fsdp: true or false */
    for (const char *p = o->fsdp; *p;) {
        size_t k = strcspn(p, ", ");
        if (k == 13 && !strncmp(p, "shard_grad_op", k))
            stage = 2;
        else if (k == 8 && !strncmp(p, "no_shard", k))
            stage = stage < 0 ? 0 : stage;
        else if (k == 10 && !strncmp(p, "full_shard", k))
            stage = 3;
        else if ((k == 4 && !strncmp(p, "true", k)) || (k == 5 && !strncmp(p, "false", k)))
            on = k == 4;
        else if (k == 7 && !strncmp(p, "offload", k))
            o->fsdp_offload_params = 1;
        else if (k && !(k == 9 && !strncmp(p, "auto_wrap", k)))
            return snug_fail(e, SNUG_EINPUT, "fsdp: '%.*s' is not supported; snug takes full_shard, shard_grad_op, "
                             "no_shard, auto_wrap, offload, or true with the strategy in fsdp_config (hybrid "
                             "sharding is not built yet)", (int)k, p);
        p += k;
        p += strspn(p, ", ");
    }
    int cs = o->fsdp_config_stage;
    if (on == 0)
        return stage >= 0 || cs > -2 ? snug_fail(e, SNUG_EINPUT, "fsdp is false but %s; remove one",
                                                 stage >= 0 ? "it names a sharding strategy too"
                                                            : "fsdp_config is given")
                                     : 0;
    if (stage >= 0 && cs >= 0 && stage != cs)
        return snug_fail(e, SNUG_EINPUT, "fsdp (%s) means ZeRO stage %d but fsdp_config's sharding means stage %d; "
                         "keep one", o->fsdp, stage, cs);
    if (stage < 0)
        stage = cs;
    int fsdp_on = stage >= 0 || cs == -1 || on == 1;
    if (!fsdp_on)
        return 0;
    if (stage < 0) /* FSDP's default strategy, FULL_SHARD, unless zero_stage says otherwise */
        stage = o->zero_stage ? o->zero_stage : 3;
    if (o->zero_stage && o->zero_stage != stage) {
        if (o->fsdp[0])
            return snug_fail(e, SNUG_EINPUT, "zero_stage is %d but fsdp (%s) means stage %d; keep one", o->zero_stage,
                             o->fsdp, stage);
        return snug_fail(e, SNUG_EINPUT, "zero_stage is %d but fsdp_config means stage %d; keep one", o->zero_stage,
                         stage);
    }
    o->zero_stage = stage;
    if (o->fsdp_offload_params)
        o->offload_params = 1;
    if (o->fsdp_activation_checkpointing == 1 && o->gradient_checkpointing == SNUG_CKPT_CHOICE_NONE)
        o->gradient_checkpointing = SNUG_CKPT_CHOICE_FULL;
    return 0;
}

/* Keys that say what other keys say (Axolotl's and transformers' spellings), resolved once every key is read, in
 * whatever order they were written: the config-wide chat template for the chat entries that name none, the
 * attention keys as flash_attention, activation_offloading as gradient_checkpointing: offload. */
static int apply_aliases(snug_run_config *o, snug_error *e) {
    const char *src = o->config_path[0] ? o->config_path : "options";
    for (int i = 0; i < o->ndatasets + o->ntest_datasets; i++) {
        const char *key;
        snug_dataset_spec *d = (snug_dataset_spec *)snug_run_dataset(o, i, &key); /* o's own entries */
        int k = i < o->ndatasets ? i : i - o->ndatasets;
        /* Axolotl's type chat_template with no template named renders with the tokenizer's own (tokenizer_default),
         * which snug does not run: refused rather than read as chatml */
        if (d->type_chat_template && !d->chat_template_own && !o->chat_template_set)
            return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] is type chat_template and names no chat_template, so Axolotl "
                             "would render it with the tokenizer's own template (tokenizer_default), which snug does "
                             "not run; set chat_template: chatml or llama3 (the one the tokenizer's template writes) "
                             "in the entry or for the whole config", src, key, k);
        if (!d->chat_template_own)
            d->chat_template = o->chat_template;
    }
    const char *fused = o->attn_sdp ? "sdp_attention: true" : o->attn_xformers ? "xformers_attention: true" : NULL;
    if (o->attn_implementation == 0 && fused)
        return snug_fail(e, SNUG_EINPUT, "%s: attn_implementation: eager and %s ask for two kinds of attention; "
                         "remove one", src, fused);
    if (o->attn_implementation == 0) {
        o->flash_attention = 0;
    } else if ((o->attn_implementation == 1 || fused) && !o->flash_attention) {
        return snug_fail(e, SNUG_EINPUT, "%s: flash_attention: false (the probabilities stored) and %s (fused "
                         "attention) disagree; remove one", src, fused ? fused : "attn_implementation");
    }
    /* report_to: the trackers snug writes for (a list, or one name; all means every one snug has) */
    for (const char *p = o->report_to; *p;) {
        size_t n = strcspn(p, ", ");
        if (n && !word_matches("none tensorboard all", p, n))
            return snug_fail(e, SNUG_EINPUT, "%s: report_to '%.*s' is not supported yet (snug writes metrics.jsonl, "
                             "and TensorBoard's event files with report_to: tensorboard); remove it", src, (int)n, p);
        if (n && (word_matches("tensorboard all", p, n)))
            o->use_tensorboard = 1;
        p += n;
        p += strspn(p, ", ");
    }
    if (o->min_lr >= 0 && o->lr_scheduler == SNUG_SCHED_PLATEAU) { /* ReduceLROnPlateau's floor */
        o->sched.plat_min_lr = o->min_lr;
    } else if (o->min_lr >= 0) { /* cosine_with_min_lr's floor as a learning rate */
        if (o->learning_rate <= 0 || o->min_lr > o->learning_rate)
            return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler_kwargs.min_lr is %g, above learning_rate %g; the floor "
                             "must be at most the peak", src, o->min_lr, o->learning_rate);
        o->cosine_min_lr_ratio = o->min_lr / o->learning_rate;
    }
    /* each lr_scheduler_kwargs key is one its schedule takes (transformers raises a TypeError for the others) */
    static const struct {
        snug_sched s;
        unsigned keys;
        const char *names;
    } takes[] = {
        {SNUG_SCHED_COSINE, SNUG_SCHED_KW_MIN_LR_RATE | SNUG_SCHED_KW_MIN_LR | SNUG_SCHED_KW_NUM_CYCLES,
         "min_lr_rate, min_lr, num_cycles"},
        {SNUG_SCHED_COSINE_RESTARTS, SNUG_SCHED_KW_NUM_CYCLES, "num_cycles"},
        {SNUG_SCHED_POLYNOMIAL, SNUG_SCHED_KW_POWER | SNUG_SCHED_KW_LR_END, "power, lr_end"},
        {SNUG_SCHED_INVERSE_SQRT, SNUG_SCHED_KW_TIMESCALE, "timescale"},
        {SNUG_SCHED_WSD, SNUG_SCHED_KW_DECAY_STEPS | SNUG_SCHED_KW_STABLE_STEPS | SNUG_SCHED_KW_WARMUP_TYPE |
                         SNUG_SCHED_KW_DECAY_TYPE | SNUG_SCHED_KW_MIN_LR_RATIO | SNUG_SCHED_KW_NUM_CYCLES,
         "num_decay_steps, num_stable_steps, warmup_type, decay_type, min_lr_ratio, num_cycles"},
        {SNUG_SCHED_PLATEAU, SNUG_SCHED_KW_MODE | SNUG_SCHED_KW_FACTOR | SNUG_SCHED_KW_PATIENCE |
                             SNUG_SCHED_KW_THRESHOLD | SNUG_SCHED_KW_THRESHOLD_MODE | SNUG_SCHED_KW_COOLDOWN |
                             SNUG_SCHED_KW_MIN_LR | SNUG_SCHED_KW_EPS,
         "mode, factor, patience, threshold, threshold_mode, cooldown, min_lr, eps"},
        {SNUG_SCHED_COSINE_WARMUP_MIN, SNUG_SCHED_KW_MIN_LR_RATE | SNUG_SCHED_KW_MIN_LR | SNUG_SCHED_KW_NUM_CYCLES |
                                       SNUG_SCHED_KW_WARMUP_LR_RATE, "min_lr_rate, min_lr, num_cycles, warmup_lr_rate"},
        {SNUG_SCHED_LINEAR, 0, "none"}, {SNUG_SCHED_CONSTANT, 0, "none"}, {SNUG_SCHED_CONSTANT_WARMUP, 0, "none"},
        {SNUG_SCHED_REX, 0, "none"},
    };
    for (size_t i = 0; i < sizeof takes / sizeof takes[0]; i++)
        if (takes[i].s == o->lr_scheduler && (o->sched_given & ~takes[i].keys))
            return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler_kwargs has a setting lr_scheduler %s does not take; "
                             "it takes %s", src, snug_sched_name(o->lr_scheduler), takes[i].names);
    if (o->lr_scheduler == SNUG_SCHED_WSD && !(o->sched_given & SNUG_SCHED_KW_DECAY_STEPS))
        return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler warmup_stable_decay needs its decay steps: "
                         "lr_scheduler_kwargs: {num_decay_steps: 100}", src);
    if (o->lr_scheduler == SNUG_SCHED_POLYNOMIAL && !(o->sched.lr_end < o->learning_rate))
        return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler_kwargs.lr_end is %g, not below learning_rate %g; the "
                         "polynomial decays from learning_rate down to lr_end", src, o->sched.lr_end,
                         o->learning_rate);
    if (o->sched_min_lr && o->cosine_min_lr_ratio == 0 &&
        !(o->sched_given & (SNUG_SCHED_KW_MIN_LR_RATE | SNUG_SCHED_KW_MIN_LR)))
        return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler %s needs its floor: lr_scheduler_kwargs: {min_lr_rate: 0.1} "
                         "(or min_lr, or cosine_min_lr_ratio)", src,
                         o->lr_scheduler == SNUG_SCHED_COSINE_WARMUP_MIN ? "cosine_warmup_with_min_lr"
                                                                         : "cosine_with_min_lr");
    if (o->use_cpu)
        o->device = SNUG_BACKEND_CPU;
    if (o->full_determinism)
        o->ddp_deterministic = 1;
    if (o->liger_flce)
        o->chunked_cross_entropy = 1;
    /* Hugging Face's strategies: steps without a count take the Trainer's defaults */
    if (o->save_strategy == 1 && !o->save_steps && !o->saves_per_epoch)
        o->save_steps = 500;
    if (o->eval_strategy == 1 && !o->eval_steps && !o->evals_per_epoch)
        o->eval_steps = o->logging_steps;
    if (o->activation_offloading) {
        if (o->gradient_checkpointing == SNUG_CKPT_CHOICE_SELECTIVE)
            return snug_fail(e, SNUG_EINPUT, "%s: activation_offloading keeps whole layers' inputs in host memory, "
                             "which selective checkpointing does not recompute from; set gradient_checkpointing: true "
                             "(or offload)", src);
        o->gradient_checkpointing = SNUG_CKPT_CHOICE_OFFLOAD;
    }
    return 0;
}

int snug_options_parse_args(snug_run_config *o, int argc, char **argv, snug_error *e) {
    snug_run_config tmp = *o;
    char key[128];
    const char *value = NULL, *config = NULL;
    for (int i = 0; i < argc; i++) { /* first the config file, whatever its position */
        int rc = next_arg(argc, argv, &i, key, sizeof key, &value, e);
        if (rc < 0 || rc > 1)
            return rc;
        if (rc == 0 && config)
            return snug_fail(e, SNUG_EINPUT,
                             "command line: unexpected argument '%.100s' (the config is '%.100s'); give one config "
                             "file and --key value options",
                             argv[i], config);
        if (rc == 0)
            config = argv[i];
    }
    if (config)
        SNUG_TRY(snug_options_load_yaml(&tmp, config, e));
    int cli_datasets = 0, cli_test = 0;
    for (int i = 0; i < argc; i++) { /* then the overrides, in order */
        if (next_arg(argc, argv, &i, key, sizeof key, &value, e) != 1)
            continue;
        const key_spec *k = find_key(key, 0);
        int *seen = k && !strcmp(k->name, "test_datasets") ? &cli_test : &cli_datasets;
        if (k && k->type == KT_DATASETS && (*seen)++ == 0)
            *list_of(&tmp, k).n = 0; /* the command line's datasets replace the config's */
        SNUG_TRY(snug_options_set(&tmp, key, value, "command line", e));
    }
    SNUG_TRY(apply_deepspeed(&tmp, e));
    SNUG_TRY(apply_fsdp(&tmp, e));
    SNUG_TRY(apply_aliases(&tmp, e));
    *o = tmp;
    return 0;
}

/* ---- validation ---- */

/* ---- help ---- */

static void print_key(FILE *f, const key_spec *k) {
    char type[320], choices[256];
    if (k->type == KT_ENUM) {
        enum_choices(k->values, "|", 1, choices, sizeof choices);
        snprintf(type, sizeof type, "%s", choices);
    } else {
        static const char *const names[] = {"int",  "float", "bool",    "string",
                                            "",     "size",  "list",    "list",
                                            "mapping", "list of names", "mapping or file"}; /* by key_type */
        _Static_assert(sizeof names / sizeof *names == KT_FSDP + 1, "a name for every key type");
        snprintf(type, sizeof type, "%s", names[k->type]);
    }
    fprintf(f, "  %s: %s", k->name, type);
    if (k->def)
        fprintf(f, k->type == KT_STRING || k->type == KT_NAMES ? " = \"%s\"" : " = %s", k->def);
    else if (k->group == G_DATASET)
        fprintf(f, " (required)");
    if (k->aliases)
        fprintf(f, "  (also: %s)", k->aliases);
    fprintf(f, "\n      %s\n", k->help);
}

void snug_options_print_help(FILE *f) {
    fprintf(f, "Keys of the YAML config; on the command line --key value or --key=value, which win over the "
               "config:\n");
    for (int g = 0; g < NGROUPS; g++) {
        if (g == G_PLAN)
            continue;
        fprintf(f, "\n%s:\n", group_titles[g]);
        for (int i = 0; i < NKEYS; i++)
            if (keys[i].group == g && !keys[i].later && !keys[i].noop)
                print_key(f, &keys[i]);
    }
    fprintf(f, "\naccepted with any value, changing nothing in snug (other trainers' knobs for what snug does its own "
               "way):\n");
    for (int i = 0; i < NKEYS; i++)
        if (keys[i].noop)
            fprintf(f, "  %s: %s\n", keys[i].name, keys[i].noop);
    fprintf(f, "\nrecognised but not supported yet (refused unless the value asks for nothing: false, empty):\n");
    for (int i = 0; i < NKEYS; i++) {
        const key_spec *k = &keys[i];
        if (!k->later)
            continue;
        fprintf(f, "  %s%s", k->group == G_DATASET ? "datasets[]." : "", k->name);
        if (k->off)
            fprintf(f, " (%s accepted)", k->off);
        fprintf(f, ": %s\n", k->later);
    }
    fprintf(f, "  optimizer values other than adamw, adamw_8bit, paged_adamw_8bit, paged_adamw_32bit and their other "
               "spellings (adafactor, sgd, lion_8bit, ...)\n");
    fprintf(f, "  lr_scheduler values other than cosine, linear, constant, constant_with_warmup\n");
    fprintf(f, "  datasets[].type values other than completion, alpaca, chat (chat_template), pretokenized, "
               "input_output (sharegpt, ...)\n");
}

/* ---- the flags of snug plan ---- */

int snug_plan_flags_take(snug_plan_args *a, int *argc, char **argv, snug_error *e) {
    snug_plan_args tmp;
    memset(&tmp, 0, sizeof tmp);
    apply_defaults(&tmp, SCOPE_PLAN);
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        const char *arg = argv[i];
        char name[128];
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (strncmp(arg, "--", 2) != 0 || len - 2 >= sizeof name) {
            argv[n++] = argv[i];
            continue;
        }
        for (size_t k = 2; k <= len; k++) /* --tokens-per-s is --tokens_per_s */
            name[k - 2] = k == len ? '\0' : arg[k] == '-' ? '_' : arg[k];
        const key_spec *k = find_key(name, SCOPE_PLAN);
        if (!k) { /* a configuration key: left for the options parser */
            argv[n++] = argv[i];
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        int b;
        if (!v && k->type == KT_BOOL && (i + 1 >= *argc || parse_bool(argv[i + 1], &b)))
            v = "true"; /* a bare --json */
        if (!v) {
            if (i + 1 >= *argc || !strncmp(argv[i + 1], "--", 2))
                return snug_fail(e, SNUG_EINPUT, "command line: --%s needs a value: --%s VALUE", name, name);
            v = argv[++i];
        }
        char written[136];
        snprintf(written, sizeof written, "--%s", name);
        SNUG_TRY(set_text(&tmp, k, written, v, "command line", e));
    }
    *a = tmp;
    *argc = n;
    return 0;
}

void snug_plan_flags_help(FILE *f) {
    for (int i = 0; i < NKEYS; i++)
        if (keys[i].group == G_PLAN)
            print_key(f, &keys[i]);
}
