/* test_options.c: the YAML + command-line configuration (src/cli/options_*.c): defaults, an Axolotl-style config, the
 * Hugging Face aliases, command-line overrides, and every kind of error a user can make, each with its message. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cli/options.h"

static char dir[] = "/tmp/snug_options_XXXXXX";
static char written[16][64]; /* file names written into dir, removed at the end */
static int nwritten;

/* Writes dir/name and returns its path (in a static buffer of four, so a few can be alive at once). */
static const char *write_file(const char *name, const char *text) {
    static char paths[4][1024];
    static int next;
    char *path = paths[next++ % 4];
    snprintf(path, 1024, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    int known = 0;
    for (int i = 0; i < nwritten; i++)
        known |= !strcmp(written[i], name);
    if (!known && nwritten < 16)
        snprintf(written[nwritten++], sizeof written[0], "%s", name);
    return path;
}

/* Loads text as cfg.yaml over the defaults. */
static int load(const char *text, snug_run_config *o, snug_error *e) {
    snug_options_defaults(o);
    snug_error_clear(e);
    return snug_options_load_yaml(o, write_file("cfg.yaml", text), e);
}

static int has(const snug_error *e, const char *s) { return strstr(e->msg, s) != NULL; }

/* A YAML config that must fail with SNUG_EINPUT and a message containing each of the NULL-terminated strings. */
#define EXPECT_YAML_ERROR(text, ...)                                                  \
    do {                                                                              \
        snug_run_config o_;                                                              \
        snug_error e_;                                                                \
        int rc_ = load(text, &o_, &e_);                                               \
        CHECKF(rc_ == SNUG_EINPUT, "rc %d for %s", rc_, #text);                      \
        const char *want_[] = {__VA_ARGS__, NULL};                                    \
        for (int w_ = 0; want_[w_]; w_++)                                             \
            CHECKF(has(&e_, want_[w_]), "'%s' not in: %s", want_[w_], e_.msg);       \
    } while (0)

#define EXPECT_YAML_OK(text)                                                          \
    do {                                                                              \
        snug_run_config o_;                                                              \
        snug_error e_;                                                                \
        int rc_ = load(text, &o_, &e_);                                               \
        CHECKF(rc_ == 0, "rc %d for %s: %s", rc_, #text, e_.msg);                    \
    } while (0)

static void test_defaults(void) {
    snug_run_config o;
    snug_error e;
    snug_options_defaults(&o);
    CHECK(o.sequence_len == 256 && o.micro_batch_size == 4 && o.gradient_accumulation_steps == 1);
    CHECK(o.num_epochs == 1 && o.max_steps == -1);
    CHECK(o.learning_rate == 3e-4 && o.lr_scheduler == SNUG_SCHED_COSINE);
    CHECK(o.warmup_steps == 0 && o.warmup_ratio == 0 && o.weight_decay == 0);
    CHECK(o.adam_beta1 == 0.9 && o.adam_beta2 == 0.999 && o.adam_epsilon == 1e-8 && o.max_grad_norm == 1.0);
    CHECK(o.optimizer == SNUG_OPTIMIZER_ADAMW && !strcmp(o.output_dir, "out") && o.seed == 42 && o.data_seed == -1);
    CHECK(o.logging_steps == 1 && o.eval_steps == 0 && o.save_steps == 0 && o.threads == 0);
    CHECK(o.sample_tokens == 64 && o.temperature == 0.8 && o.top_k == 40 && o.top_p == 0.95);
    CHECK(!strcmp(o.model_preset, "tiny-llama") && o.base_model[0] == '\0' && o.tokenizer[0] == '\0');
    CHECK(o.val_set_size == 0 && o.memory_budget == 0 && o.ndatasets == 0 && o.config_path[0] == '\0');
    CHECK(o.sample_prompt[0] == '\0');
    CHECKF(snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    CHECK(snug_run_config_validate_train(&o, &e) == SNUG_EINPUT && has(&e, "no training data") && has(&e, "--dataset"));
}

static void test_axolotl_config(void) {
    snug_run_config o;
    snug_error e;
    char want[1100];
    int rc = load("# an Axolotl-style full fine-tune\n"
                  "base_model: ./models/llama\n"
                  "model_type: AutoModelForCausalLM\n"
                  "tokenizer_type: AutoTokenizer\n"
                  "strict: false\n"
                  "load_in_8bit: false\n"
                  "load_in_4bit: false\n"
                  "adapter:\n"
                  "lora_model_dir:\n"
                  "datasets:\n"
                  "  - path: data/train.jsonl\n"
                  "    type: completion\n"
                  "    field: content\n"
                  "  - path: /abs/other.jsonl\n"
                  "    split: train\n"
                  "  - more.jsonl\n"
                  "dataset_prepared_path:\n"
                  "val_set_size: 0.05\n"
                  "output_dir: ./outputs/run1\n"
                  "sequence_len: 2048\n"
                  "sample_packing: false\n"
                  "pad_to_sequence_len: false\n"
                  "wandb_project:\n"
                  "wandb_entity: ~\n"
                  "gradient_accumulation_steps: 8\n"
                  "micro_batch_size: 2\n"
                  "num_epochs: 3.0\n"
                  "optimizer: adamw_torch_fused\n"
                  "lr_scheduler: linear\n"
                  "learning_rate: 2e-5\n"
                  "train_on_inputs: false\n"
                  "group_by_length: false\n"
                  "bf16: false\n"
                  "fp16: no\n"
                  "tf32: Off\n"
                  "gradient_checkpointing: false\n"
                  "flash_attention: false\n"
                  "resume_from_checkpoint:\n"
                  "logging_steps: 10\n"
                  "warmup_steps: 100\n"
                  "eval_steps: 200\n"
                  "save_steps: 500\n"
                  "deepspeed:\n"
                  "fsdp: []\n"
                  "special_tokens: {}\n"
                  "weight_decay: 0.1\n"
                  "max_grad_norm: 0.5\n"
                  "adam_beta2: 0.95\n"
                  "seed: 7\n"
                  "threads: 2\n"
                  "sample_prompt: \"Once upon a time\"\n"
                  "sample_tokens: 32\n"
                  "temperature: 0\n"
                  "top_k: 0\n"
                  "top_p: 1\n"
                  "memory_budget: 40 GiB\n",
                  &o, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(!strcmp(o.base_model, "./models/llama"));  /* kept as written */
    CHECK(!strcmp(o.output_dir, "./outputs/run1"));  /* kept as written */
    snprintf(want, sizeof want, "%s/cfg.yaml", dir);
    CHECK(!strcmp(o.config_path, want));
    CHECK(o.ndatasets == 3);
    snprintf(want, sizeof want, "%s/data/train.jsonl", dir);
    CHECKF(!strcmp(o.datasets[0].path, want), "%s", o.datasets[0].path); /* relative to the YAML's folder */
    CHECK(o.datasets[0].type == SNUG_DATA_COMPLETION && !strcmp(o.datasets[0].field, "content"));
    CHECK(!strcmp(o.datasets[1].path, "/abs/other.jsonl") && !strcmp(o.datasets[1].field, "text"));
    snprintf(want, sizeof want, "%s/more.jsonl", dir);
    CHECK(!strcmp(o.datasets[2].path, want) && o.datasets[2].type == SNUG_DATA_COMPLETION);
    CHECK(o.val_set_size == 0.05 && o.sequence_len == 2048);
    CHECK(o.gradient_accumulation_steps == 8 && o.micro_batch_size == 2 && o.num_epochs == 3);
    CHECK(o.optimizer == SNUG_OPTIMIZER_ADAMW && o.lr_scheduler == SNUG_SCHED_LINEAR && o.learning_rate == 2e-5);
    CHECK(o.logging_steps == 10 && o.warmup_steps == 100 && o.eval_steps == 200 && o.save_steps == 500);
    CHECK(o.weight_decay == 0.1 && o.max_grad_norm == 0.5 && o.adam_beta2 == 0.95 && o.adam_beta1 == 0.9);
    CHECK(o.seed == 7 && o.threads == 2);
    CHECK(!strcmp(o.sample_prompt, "Once upon a time") && o.sample_tokens == 32);
    CHECK(o.temperature == 0 && o.top_k == 0 && o.top_p == 1);
    CHECK(o.memory_budget == 40.0 * 1073741824.0);
    CHECKF(snug_run_config_validate_train(&o, &e) == 0, "%s", e.msg);

    /* An empty file, and a key left empty, keep the defaults. */
    CHECKF(load("", &o, &e) == 0 && o.micro_batch_size == 4, "%s", e.msg);
    CHECKF(load("# only a comment\n", &o, &e) == 0, "%s", e.msg);
    CHECKF(load("micro_batch_size:\nlr_scheduler: ~\nbase_model:\n", &o, &e) == 0, "%s", e.msg);
    CHECK(o.micro_batch_size == 4 && o.lr_scheduler == SNUG_SCHED_COSINE && o.base_model[0] == '\0');
    /* Flow style, quoted numbers, anchors. */
    CHECKF(load("{learning_rate: '1e-4', micro_batch_size: \"8\", datasets: [{path: a.jsonl}]}\n", &o, &e) == 0,
           "%s", e.msg);
    CHECK(o.learning_rate == 1e-4 && o.micro_batch_size == 8 && o.ndatasets == 1);
    CHECKF(load("seed: &s 11\ntop_k: *s\n", &o, &e) == 0 && o.seed == 11 && o.top_k == 11, "%s", e.msg);
    /* A config in the current directory keeps relative dataset paths as written. */
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(dir) == 0);
    snug_options_defaults(&o);
    CHECKF(snug_options_load_yaml(&o, "cfg.yaml", &e) == 0, "%s", e.msg); /* the file from the last load() */
    write_file("here.yaml", "datasets:\n  - path: d.jsonl\n");
    snug_options_defaults(&o);
    CHECKF(snug_options_load_yaml(&o, "here.yaml", &e) == 0, "%s", e.msg);
    CHECK(o.ndatasets == 1 && !strcmp(o.datasets[0].path, "d.jsonl"));
    CHECK(chdir(cwd) == 0);
}

static void test_hf_aliases(void) {
    snug_run_config o;
    snug_error e;
    int rc = load("model_name_or_path: m\n"
                  "per_device_train_batch_size: 16\n"
                  "num_train_epochs: 2\n"
                  "lr_scheduler_type: constant_with_warmup\n"
                  "optim: adamw_torch\n"
                  "warmup_ratio: 0.1\n"
                  "max_seq_length: 512\n"
                  "dataset: x.jsonl\n",
                  &o, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(!strcmp(o.base_model, "m") && o.micro_batch_size == 16 && o.num_epochs == 2);
    CHECK(o.lr_scheduler == SNUG_SCHED_CONSTANT_WARMUP && o.optimizer == SNUG_OPTIMIZER_ADAMW);
    CHECK(o.warmup_ratio == 0.1 && o.sequence_len == 512 && o.ndatasets == 1);
    CHECKF(snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    /* The same key under two spellings is a duplicate. */
    EXPECT_YAML_ERROR("micro_batch_size: 2\nper_device_train_batch_size: 4\n", "cfg.yaml line 2",
                      "per_device_train_batch_size is set twice", "micro_batch_size on line 1");
    EXPECT_YAML_ERROR("seed: 1\nseed: 2\n", "line 2", "seed is set twice");
}

/* --key value over what o holds. */
static int set1(snug_run_config *o, const char *key, const char *value, snug_error *e) {
    char flag[128];
    snprintf(flag, sizeof flag, "--%s", key);
    char *argv[] = {flag, (char *)value};
    snug_error_clear(e);
    return snug_options_parse_args(o, 2, argv, e);
}

static void test_command_line(void) {
    snug_run_config o;
    snug_error e;
    const char *cfg = write_file("cli.yaml", "learning_rate: 1e-3\nmicro_batch_size: 2\nseed: 5\n"
                                             "datasets:\n  - path: yaml.jsonl\n");
    char cfgpath[1024];
    snprintf(cfgpath, sizeof cfgpath, "%s", cfg);
    /* Overrides before and after the config path both win over it. */
    char *argv[] = {"--learning_rate", "1e-4", cfgpath, "--micro-batch-size=8", "--dataset", "cli.jsonl",
                    "--datasets=two.jsonl", "--per_device_train_batch_size", "6", "--max_steps", "-1"};
    snug_options_defaults(&o);
    int rc = snug_options_parse_args(&o, (int)(sizeof argv / sizeof argv[0]), argv, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(o.learning_rate == 1e-4 && o.seed == 5 && o.max_steps == -1);
    CHECK(o.micro_batch_size == 6); /* the later of two overrides */
    CHECK(o.ndatasets == 2 && !strcmp(o.datasets[0].path, "cli.jsonl") && !strcmp(o.datasets[1].path, "two.jsonl"));
    CHECK(o.datasets[0].type == SNUG_DATA_COMPLETION && !strcmp(o.datasets[0].field, "text"));
    CHECK(!strcmp(o.config_path, cfgpath));

    /* No config at all. */
    char *argv2[] = {"--base_model", "./m", "--bf16", "false", "--memory_budget", "512MiB"};
    snug_options_defaults(&o);
    CHECKF(snug_options_parse_args(&o, 6, argv2, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(o.base_model, "./m") && o.memory_budget == 512.0 * 1048576 && o.config_path[0] == '\0');
    CHECKF(snug_options_parse_args(&o, 0, NULL, &e) == 0, "%s", e.msg);

    /* A bare boolean flag means true and does not swallow the config path after it. */
    char *argv3[] = {"--bf16", cfgpath};
    snug_options_defaults(&o);
    CHECKF(snug_options_parse_args(&o, 2, argv3, &e) == 0 && o.bf16 == 1 && o.seed == 5, "%s", e.msg);
    char *argv4[] = {"--sample_packing", "off", cfgpath, "--flash-attention=no"};
    snug_options_defaults(&o);
    CHECKF(snug_options_parse_args(&o, 4, argv4, &e) == 0 && o.seed == 5, "%s", e.msg);

    /* Errors, and o unchanged after them. */
    struct {
        int argc;
        char *argv[4];
        const char *want1, *want2;
    } bad[] = {
        {2, {"--learning_rat", "1"}, "unknown key 'learning_rat' in command line", "did you mean 'learning_rate'?"},
        {2, {"--micro_batch_size", "four"}, "command line: micro_batch_size must be an integer", "'four'"},
        {1, {"--seed"}, "--seed needs a value", NULL},
        {2, {"a.yaml", "b.yaml"}, "unexpected argument 'b.yaml'", "one config"},
        {1, {"-x"}, "unknown option '-x'", "--key value"},
        {1, {"--torch_compile"}, "torch_compile is not supported yet", "set it to false"},
        {2, {"--optim", "sgd"}, "optim 'sgd' is not supported yet", NULL},
        {2, {"--lora_r", "0"}, "command line: lora_r is 0; it must be at least 1", NULL},
        {2, {"--bnb_4bit_compute_dtype", "float32"}, "bnb_4bit_compute_dtype 'float32' is not supported yet", "bfloat16"},
        {1, {"--dataset="}, "dataset path is empty", NULL},
        {1, {"/nonexistent/cfg.yaml"}, "cannot open config '/nonexistent/cfg.yaml'", "check the path"},
        {2, {cfgpath, "--top_k=2.5"}, "top_k must be an integer, got '2.5'", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snug_options_defaults(&o);
        o.seed = 99;
        snug_error_clear(&e);
        rc = snug_options_parse_args(&o, bad[i].argc, bad[i].argv, &e);
        CHECKF(rc == SNUG_EINPUT, "case %zu: rc %d", i, rc);
        CHECKF(has(&e, bad[i].want1), "case %zu: '%s' not in: %s", i, bad[i].want1, e.msg);
        CHECKF(!bad[i].want2 || has(&e, bad[i].want2), "case %zu: '%s' not in: %s", i, bad[i].want2, e.msg);
        CHECKF(o.seed == 99 && o.config_path[0] == '\0', "case %zu changed o", i);
    }

    /* one key at a time over what o holds */
    snug_options_defaults(&o);
    CHECK(set1(&o, "num_train_epochs", "3", &e) == 0 && o.num_epochs == 3);
    CHECK(set1(&o, "temperature", "0.5", &e) == 0 && o.temperature == 0.5 && o.num_epochs == 3);
    CHECK(set1(&o, "dataset", "a.jsonl", &e) == 0 && o.ndatasets == 1);
    CHECK(set1(&o, "output_dir", "", &e) == 0 && o.output_dir[0] == '\0');
    CHECK(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, "output_dir is empty"));
    CHECK(set1(&o, "sample_packing", "false", &e) == 0);
    CHECK(set1(&o, "wandb_project", "", &e) == 0);
    CHECK(set1(&o, "wandb_project", "p", &e) == SNUG_EINPUT &&
          has(&e, "command line: wandb_project is not supported yet"));
    char *many[2 * (SNUG_MAX_DATASETS + 1)];
    for (int i = 0; i <= SNUG_MAX_DATASETS; i++)
        many[2 * i] = "--dataset", many[2 * i + 1] = i < SNUG_MAX_DATASETS ? "b.jsonl" : "c.jsonl";
    CHECK(snug_options_parse_args(&o, 2 * SNUG_MAX_DATASETS, many, &e) == 0 && o.ndatasets == SNUG_MAX_DATASETS);
    CHECK(snug_options_parse_args(&o, 2 * (SNUG_MAX_DATASETS + 1), many, &e) == SNUG_EINPUT &&
          has(&e, "more than 16 datasets"));
}

static void test_yaml_syntax(void) {
    /* libyaml's marks are 0-based; the message must be 1-based. */
    EXPECT_YAML_ERROR("seed: 1\nmicro_batch_size: 2\n  learning_rate: 3\n", "cfg.yaml line 3 column 16",
                      "YAML syntax error", "mapping values are not allowed");
    EXPECT_YAML_ERROR("seed: 1\ndatasets: [{path: a.jsonl}\nsequence_len: 8\n", "cfg.yaml line", "YAML syntax error",
                      "column");
    EXPECT_YAML_ERROR("seed: \"unterminated\n", "cfg.yaml line", "column", "YAML syntax error");
    EXPECT_YAML_ERROR("seed: 1\n---\nseed: 2\n", "line 2", "second YAML document");
    EXPECT_YAML_ERROR("- a\n- b\n", "cfg.yaml line 1", "'key: value'", "got a list");
    EXPECT_YAML_ERROR("[a, b]: 1\n", "key must be a plain name");
    EXPECT_YAML_ERROR("seed: \"1\\0\"\n", "NUL character");
}

static void test_unknown_keys(void) {
    EXPECT_YAML_ERROR("seed: 1\nsequence_len: 8\nlearning_rat: 1e-4\n",
                      "unknown key 'learning_rat' in ", "cfg.yaml line 3: did you mean 'learning_rate'?");
    EXPECT_YAML_ERROR("num_train_epoch: 2\n", "did you mean 'num_train_epochs'?");
    EXPECT_YAML_ERROR("Micro_Batch_Size: 2\n", "did you mean 'micro_batch_size'?");
    EXPECT_YAML_ERROR("gradient_checkpoint: true\n", "did you mean 'gradient_checkpointing'?");
    EXPECT_YAML_ERROR("zzzzzzzzzzzzzzzzzzzzzz: 1\n", "unknown key 'zzzzzzzzzzzzzzzzzzzzzz'", "snug train --help");
    /* Inside a datasets entry the suggestion comes from the entry's keys. */
    EXPECT_YAML_ERROR("datasets:\n  - path: a.jsonl\n    feild: body\n", "unknown key 'feild' in datasets[0] in ",
                      "cfg.yaml line 3", "did you mean 'field'?");
    EXPECT_YAML_ERROR("datasets:\n  - pth: a.jsonl\n", "did you mean 'path'?");
}

static void test_wrong_types(void) {
    EXPECT_YAML_ERROR("seed: 1\nsequence_len: 8\nlearning_rate: 1e-4\nmicro_batch_size: four\n",
                      "cfg.yaml line 4: micro_batch_size must be an integer, got 'four'");
    EXPECT_YAML_ERROR("micro_batch_size: 2.5\n", "micro_batch_size must be an integer, got '2.5'");
    EXPECT_YAML_ERROR("micro_batch_size: 0x10\n", "must be an integer");
    EXPECT_YAML_ERROR("micro_batch_size: 4 \"x\"\n", "must be an integer");
    EXPECT_YAML_ERROR("seed: 99999999999\n", "seed is out of range");
    EXPECT_YAML_ERROR("learning_rate: fast\n", "line 1: learning_rate must be a number", "'fast'");
    EXPECT_YAML_ERROR("learning_rate: .inf\n", "learning_rate must be a number");
    EXPECT_YAML_ERROR("learning_rate: nan\n", "learning_rate must be a number");
    EXPECT_YAML_ERROR("learning_rate: 1e-4x\n", "learning_rate must be a number");
    EXPECT_YAML_ERROR("learning_rate: [1, 2]\n", "learning_rate must be a number, got a list");
    EXPECT_YAML_ERROR("base_model: {a: 1}\n", "base_model must be a string, got a mapping");
    EXPECT_YAML_ERROR("lr_scheduler: cosin\n", "lr_scheduler must be one of cosine, linear, constant", "'cosin'");
    EXPECT_YAML_ERROR("lr_scheduler: one_cycle\n", "lr_scheduler 'one_cycle' is not supported yet");
    EXPECT_YAML_ERROR("bf16: maybe\n", "bf16 must be true or false");
    EXPECT_YAML_ERROR("fp16: auto\n", "fp16 must be true or false"); /* only bf16 has an auto */
    {
        /* precision combinations that cannot work are refused by validation, with the fix */
        static const char *const bad[][2] = {
            {"bf16: true\nfp16: true\n", "bf16 and fp16 are both true"},
            {"fp16: true\nmaster_weights: false\n", "fp16 without master_weights is not supported"},
            {"fp16: true\noptimizer_in_backward: true\nmax_grad_norm: 0\n", "fp16 with optimizer_in_backward"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            snug_run_config o;
            snug_error e;
            CHECKF(load(bad[i][0], &o, &e) == 0, "%s", e.msg);
            CHECKF(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, bad[i][1]), "%s: %s", bad[i][1], e.msg);
        }
    }
    EXPECT_YAML_ERROR("datasets: {path: a.jsonl}\n", "datasets must be a list", "- path: data.jsonl");

    snug_run_config o;
    snug_error e;
    CHECKF(load("learning_rate: 3.0e-4\nweight_decay: 1E-2\nadam_epsilon: 1e-08\nseed: -3\nmax_steps: 1e3\n",
                &o, &e) == 0, "%s", e.msg);
    CHECK(o.learning_rate == 3e-4 && o.weight_decay == 0.01 && o.adam_epsilon == 1e-8 && o.seed == -3);
    CHECK(o.max_steps == 1000);
    CHECKF(load("bf16: auto\n", &o, &e) == 0 && o.bf16 == 1, "%s", e.msg); /* Axolotl's spelling */
    CHECKF(load("adapter: lora\nload_in_8bit: true\n", &o, &e) == 0 && o.load_in_8bit == 1 && !o.load_in_4bit,
           "%s", e.msg);
}

static void test_not_supported(void) {
    static const char *const levers[] = {
        "tf32",
        "s2_attention", "torch_compile",
    };
    char yaml[256], want[128];
    for (size_t i = 0; i < sizeof levers / sizeof levers[0]; i++) {
        snprintf(yaml, sizeof yaml, "seed: 1\n%s: true\n", levers[i]);
        snprintf(want, sizeof want, "cfg.yaml line 2: %s is not supported yet", levers[i]);
        EXPECT_YAML_ERROR(yaml, want, "remove it or set it to false");
        snprintf(yaml, sizeof yaml, "%s: false\n", levers[i]); /* asks for nothing: accepted */
        EXPECT_YAML_OK(yaml);
    }
    static const char *const valued[] = {
        "wandb_project: proj", "eval_table_size: 5", "plugins: [a]",
        "tokenizer_type: GemmaTokenizer",
    };
    for (size_t i = 0; i < sizeof valued / sizeof valued[0]; i++) {
        snprintf(yaml, sizeof yaml, "%s\n", valued[i]);
        snprintf(want, sizeof want, "%.*s is not supported yet", (int)strcspn(valued[i], ":"), valued[i]);
        EXPECT_YAML_ERROR(yaml, "cfg.yaml line 1: ", want, "remove it");
    }
    /* unfrozen_parameters: the patterns as a list, and kept one per line as written (the checkpoint's record);
     * matched against the model in setup */
    {
        snug_run_config o;
        snug_error e;
        int rc = load("unfrozen_parameters:\n  - model.layers.1[0-5].mlp\n  - \"^model.embed_tokens.weight$[:32]\"\n",
                      &o, &e);
        CHECKF(rc == 0, "unfrozen_parameters: %s", e.msg);
        CHECK(!strcmp(o.unfrozen_parameters, "model.layers.1[0-5].mlp\n^model.embed_tokens.weight$[:32]"));
        CHECK(o.unfrozen.n == 2 && !strcmp(snug_patterns_item(&o.unfrozen, 0), "model.layers.1[0-5].mlp") &&
              !strcmp(snug_patterns_item(&o.unfrozen, 1), "^model.embed_tokens.weight$[:32]"));
        rc = load("unfrozen_parameters:\n", &o, &e);
        CHECK(rc == 0 && !o.unfrozen_parameters[0] && !o.unfrozen.n);
        EXPECT_YAML_ERROR("unfrozen_parameters: [[a]]\n", "cfg.yaml line 1: ", "must be a single value");
    }
    /* LoRA's keys (Axolotl's spellings) become typed fields; a list of modules is kept joined by commas */
    {
        snug_run_config o;
        snug_error e;
        int rc = load("adapter: lora\nlora_r: 16\nlora_alpha: 32\nlora_dropout: 0.05\n"
                      "lora_target_modules: [q_proj, v_proj]\npeft_use_rslora: true\nlora_target_linear: false\n",
                      &o, &e);
        CHECKF(rc == 0, "LoRA keys: %s", e.msg);
        CHECK(o.adapter == SNUG_ADAPTER_LORA && o.lora_r == 16 && o.lora_alpha == 32 && o.lora_dropout == 0.05 &&
              o.lora_rslora && !o.lora_target_linear && !strcmp(o.lora_target_modules, "q_proj,v_proj"));
        rc = load("lora_target_modules: q_proj, k_proj\n", &o, &e);
        CHECK(rc == 0 && !strcmp(o.lora_target_modules, "q_proj, k_proj"));
    }
    EXPECT_YAML_ERROR("lora_target_modules: [q_proj, {a: b}]\n", "lora_target_modules must list names");
    EXPECT_YAML_ERROR("lora_target_modules: \"q_proj; rm -rf\"\n", "must list module names");
    EXPECT_YAML_ERROR("pipeline_layers: \"4;4\"\n", "pipeline_layers must list numbers, separated by commas");
    /* the lists the code reads are read once, here, into typed fields; the strings stay as written */
    {
        snug_run_config o;
        snug_error e;
        int rc = load("lora_layers_to_transform: [1, 3, 200]\nlora_modules_to_save: [lm_head]\n"
                      "pipeline_layers: [3, 1, 2]\n", &o, &e);
        CHECKF(rc == 0, "typed lists: %s", e.msg);
        CHECK(o.lora_layer_mask[0] == 0xa && o.lora_layer_mask[1] == 0 && o.lora_layer_mask[3] == 1ull << 8 &&
              !strcmp(o.lora_layers, "1,3,200"));
        CHECK(o.lora_save_modules == SNUG_SAVE_HEAD && !strcmp(o.lora_modules_to_save, "lm_head"));
        CHECK(o.pipeline_nstage_layers == 3 && o.pipeline_stage_layers[0] == 3 && o.pipeline_stage_layers[1] == 1 &&
              o.pipeline_stage_layers[2] == 2 && !strcmp(o.pipeline_layers, "3,1,2"));
        snug_options_defaults(&o);
        CHECK(!o.lora_layer_mask[0] && !o.lora_save_modules && !o.pipeline_nstage_layers);
    }
    EXPECT_YAML_ERROR("lora_layers_to_transform: [1, x]\n", "lora_layers_to_transform names 'x'");
    EXPECT_YAML_ERROR("layers_to_transform: 256\n", "layers_to_transform names '256'");
    EXPECT_YAML_ERROR("lora_modules_to_save: [norm]\n", "lora_modules_to_save names 'norm'", "embed_tokens and lm_head");
    EXPECT_YAML_ERROR("pipeline_layers: [2, 0]\n", "pipeline_layers lists '0'", "at least 1");
    EXPECT_YAML_ERROR("pipeline_layers: \", ,\"\n", "pipeline_layers lists no count", "even split");
    EXPECT_YAML_ERROR("peft_layers_to_transform: [1, 256]\n", "peft_layers_to_transform names '256'", "at most 255");
    EXPECT_YAML_ERROR("fsdp: \"full_shard; auto_wrap\"\n", "fsdp must list FSDP options");
    EXPECT_YAML_OK("model_type: LlamaForCausalLM\neval_table_size: 0\ntokenizer_type: PreTrainedTokenizerFast\n");
    EXPECT_YAML_OK("adapter:\nlora_target_modules: []\nspecial_tokens:\ndeepspeed: ~\nfsdp:\nwandb_project: ''\n");

    /* resuming and keeping checkpoints are built: Axolotl's and Hugging Face's spellings */
    {
        snug_run_config o;
        snug_error e;
        CHECK(load("save_total_limit: 3\nresume_from_checkpoint: out/checkpoint-10\n", &o, &e) == 0 &&
              o.save_total_limit == 3 && !strcmp(o.resume_from_checkpoint, "out/checkpoint-10") && !o.resume_latest);
        CHECK(load("resume_from_checkpoint: true\n", &o, &e) == 0 && !strcmp(o.resume_from_checkpoint, "latest") &&
              o.resume_latest == 1);
        CHECK(load("resume_from_checkpoint: latest\n", &o, &e) == 0 && o.resume_latest == 1);
        CHECK(load("resume_from_checkpoint: false\n", &o, &e) == 0 && !o.resume_from_checkpoint[0] && !o.resume_latest);
        CHECK(load("overwrite_output_dir: true\n", &o, &e) == 0 && o.overwrite_output_dir == 1);
        EXPECT_YAML_ERROR("save_total_limit: -1\n", "cfg.yaml line 1: ", "save_total_limit is -1; it must be at least 0");
    }

    /* every checkpointing mode is built, offloading to host memory included; others are named */
    EXPECT_YAML_OK("gradient_checkpointing: offload\n");
    EXPECT_YAML_ERROR("gradient_checkpointing: disk\n", "cfg.yaml line 1: ", "gradient_checkpointing must be one of");

    /* Optimizers snug does not have. */
    static const char *const optims[] = {"adafactor", "sgd"};
    for (size_t i = 0; i < sizeof optims / sizeof optims[0]; i++) {
        snprintf(yaml, sizeof yaml, "optimizer: %s\n", optims[i]);
        snprintf(want, sizeof want, "optimizer '%s' is not supported yet", optims[i]);
        EXPECT_YAML_ERROR(yaml, "cfg.yaml line 1: ", want);
    }
    EXPECT_YAML_OK("optimizer: adamw\n");
    EXPECT_YAML_OK("optimizer: adamw_torch\n");
    EXPECT_YAML_OK("optim: adamw_torch_fused\n");

    /* Dataset types not built, and dataset keys of hub datasets. */
    static const char *const types[] = {"sharegpt"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        snprintf(yaml, sizeof yaml, "datasets:\n  - path: a.jsonl\n    type: %s\n", types[i]);
        snprintf(want, sizeof want, "type '%s' is not supported yet", types[i]);
        EXPECT_YAML_ERROR(yaml, "datasets[0] in ", "cfg.yaml line 3", want,
                          "use completion, alpaca, chat, pretokenized, input_output");
    }
    EXPECT_YAML_ERROR("datasets:\n  - path: a.jsonl\n    type: freeform\n", "type must be one of completion");
    EXPECT_YAML_ERROR("datasets:\n  - path: a.jsonl\n    type: chat\n    chat_template: qwen3\n",
                      "chat_template 'qwen3' is not supported yet; use tokenizer_default, tokenizer_default_fallback_chatml, "
                      "tokenizer_default_fallback_llama3, chatml, llama3, jinja");
    EXPECT_YAML_OK("datasets:\n  - path: a.jsonl\n    type: chat\n    field_messages: messages\n");
    EXPECT_YAML_ERROR("datasets:\n  - path: a.jsonl\n    split: test\n", "split is not supported yet",
                      "set it to train");
    EXPECT_YAML_OK("datasets:\n  - path: a.jsonl\n    split: train\n    ds_type: json\n");
}

/* The dataset formats and the data keys that go with them. */
static void test_dataset_keys(void) {
    snug_run_config o;
    snug_error e;
    int rc = load("datasets:\n"
                  "  - path: a.jsonl\n    type: alpaca\n"
                  "  - path: b.jsonl\n    type: chat_template\n    chat_template: llama3\n"
                  "  - path: c.jsonl\n    type: chat\n"
                  "  - path: d.jsonl\n    type: pretokenized\n"
                  "train_on_inputs: true\nskip_bad_examples: yes\nlong_examples: drop\n"
                  "dataset_prepared_path: prep/here\n",
                  &o, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(o.ndatasets == 4 && o.datasets[0].type == SNUG_DATA_ALPACA && o.datasets[1].type == SNUG_DATA_CHAT);
    CHECK(o.datasets[1].chat_template == SNUG_CHAT_LLAMA3 &&
          o.datasets[2].chat_template == SNUG_CHAT_TOKENIZER_OR_CHATML); /* the tokenizer's own, else chatml */
    CHECK(o.datasets[3].type == SNUG_DATA_PRETOKENIZED);
    CHECK(o.train_on_inputs == 1 && o.skip_bad_examples == 1 && o.long_examples == SNUG_LONG_DROP);
    CHECK(!strcmp(o.dataset_prepared_path, "prep/here")); /* relative to the current directory, as written */
    CHECKF(snug_run_config_validate_train(&o, &e) == 0, "%s", e.msg);
    CHECK(load("seed: 1\n", &o, &e) == 0 && o.train_on_inputs == 0 && o.skip_bad_examples == 0 &&
          o.long_examples == SNUG_LONG_TRUNCATE && !strcmp(o.dataset_prepared_path, "last_run_prepared"));
    EXPECT_YAML_ERROR("long_examples: raise\n", "long_examples must be one of truncate, drop");
    char *argv[] = {"--dataset", "x.jsonl", "--train_on_inputs", "--long-examples", "drop"};
    snug_options_defaults(&o);
    CHECKF(snug_options_parse_args(&o, 5, argv, &e) == 0, "%s", e.msg);
    CHECK(o.train_on_inputs == 1 && o.long_examples == SNUG_LONG_DROP && o.datasets[0].type == SNUG_DATA_COMPLETION);
}

static void test_memory_budget(void) {
    static const struct { const char *text; double bytes; } ok[] = {
        {"40GB", 40e9},          {"40 GB", 40e9},        {"40GiB", 40.0 * 1073741824}, {"40 GiB", 40.0 * 1073741824},
        {"40000MB", 40e9},       {"512MiB", 536870912},  {"1000000", 1e6},             {"0", 0},
        {"1.5gb", 1.5e9},        {"2TB", 2e12},          {"64KiB", 65536},             {"100 B", 100},
        {"\"8 GB\"", 8e9},
    };
    char yaml[128];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        snug_run_config o;
        snug_error e;
        snprintf(yaml, sizeof yaml, "memory_budget: %s\n", ok[i].text);
        int rc = load(yaml, &o, &e);
        CHECKF(rc == 0 && o.memory_budget == ok[i].bytes, "%s -> %g (%s)", ok[i].text, o.memory_budget, e.msg);
    }
    static const char *const bad[] = {"forty", "40 G", "40XB", "-1GB", "GB", "40GBs", "4e", "inf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(yaml, sizeof yaml, "memory_budget: %s\n", bad[i]);
        EXPECT_YAML_ERROR(yaml, "cfg.yaml line 1: memory_budget must be a size such as 40GB, 40 GiB, 512MiB");
    }
}

static void test_datasets(void) {
    EXPECT_YAML_ERROR("seed: 1\ndatasets:\n  - type: completion\n    field: body\n",
                      "cfg.yaml line 3: datasets[0] has no path", "add 'path: data.jsonl'");
    EXPECT_YAML_ERROR("datasets:\n  - path: a.jsonl\n  - field: x\n", "line 3: datasets[1] has no path");
    EXPECT_YAML_ERROR("datasets:\n  - [a.jsonl]\n", "datasets[0] must be a mapping");
    EXPECT_YAML_ERROR("datasets:\n  - path: a.jsonl\n    path: b.jsonl\n", "path is set twice");
    EXPECT_YAML_ERROR("datasets:\n  - path: ''\n", "has no path");
    char yaml[2048] = "datasets:\n";
    for (int i = 0; i <= SNUG_MAX_DATASETS; i++)
        strcat(yaml, "  - path: d.jsonl\n");
    EXPECT_YAML_ERROR(yaml, "more than 16 datasets");
    snug_run_config o;
    snug_error e;
    CHECKF(load("datasets:\n", &o, &e) == 0 && o.ndatasets == 0, "%s", e.msg);
}

static void test_validate(void) {
    struct {
        const char *yaml, *want;
    } bad[] = {
        {"micro_batch_size: 0\n", "micro_batch_size is 0; it must be at least 1"},
        {"sequence_len: 1\n", "sequence_len is 1; it must be at least 2"},
        {"gradient_accumulation_steps: 0\n", "gradient_accumulation_steps is 0"},
        {"learning_rate: 0\n", "learning_rate is 0; it must be above 0"},
        {"learning_rate: -1e-4\n", "learning_rate is -0.0001"},
        {"warmup_ratio: 1\n", "warmup_ratio is 1; it must be in [0, 1)"},
        {"warmup_steps: -5\n", "warmup_steps is -5"},
        {"warmup_steps: 10\nwarmup_ratio: 0.1\n", "both warmup_steps (10) and warmup_ratio (0.1) are set"},
        {"val_set_size: -0.1\n", "val_set_size is -0.1"},
        {"val_set_size: 2.5\n", "a count (>= 1) must be a whole number"},
        {"adam_beta1: 1.0\n", "adam_beta1 is 1; it must be in [0, 1)"},
        {"adam_beta2: -0.1\n", "adam_beta2 is -0.1"},
        {"adam_epsilon: 0\n", "adam_epsilon is 0"},
        {"max_grad_norm: -1\n", "max_grad_norm is -1"},
        {"weight_decay: -0.1\n", "weight_decay is -0.1"},
        {"max_steps: 0\n", "max_steps is 0; use -1"},
        {"num_epochs: 0\n", "num_epochs is 0"},
        {"logging_steps: 0\n", "logging_steps is 0"},
        {"eval_steps: -1\n", "eval_steps is -1"},
        {"save_steps: -1\n", "save_steps is -1"},
        {"threads: -2\n", "threads is -2"},
        {"data_seed: -3\n", "data_seed is -3"},
        {"top_p: 0\n", "top_p is 0; it must be in (0, 1]"},
        {"top_p: 1.5\n", "top_p is 1.5"},
        {"top_k: -1\n", "top_k is -1"},
        {"temperature: -1\n", "temperature is -1"},
        {"sample_tokens: -1\n", "sample_tokens is -1"},
        {"model_preset: ''\n", "model_preset is empty and so is base_model"},
        {"datasets:\n  - path: a.jsonl\n    field: ''\n", "datasets[0] field is empty"},
        {"pad_to_multiple_of: -8\n", "pad_to_multiple_of is -8"},
        {"concatenate: true\nsample_packing: true\n", "concatenate is true with sample_packing"},
        {"concatenate: true\ngroup_by_length: true\n", "concatenate is true with group_by_length"},
        {"sample_packing: true\ngroup_by_length: true\n", "sample_packing and group_by_length are both true"},
        {"save_only_model: true\nzero_stage: 3\n", "save_only_model with zero_stage 3"},
        {"save_only_model: true\ntensor_parallel_size: 2\n", "save_only_model with tensor_parallel_size"},
        {"load_in_8bit: true\n", "load_in_8bit stores a frozen base in 8 bits"},
        {"adapter: qlora\nload_in_8bit: true\n", "set adapter: lora for an 8-bit base"},
        {"auto_fit: true\nmemory_budget: 1GB\nauto_find_batch_size: true\n",
         "auto_fit and auto_find_batch_size are both true"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snug_run_config o;
        snug_error e;
        /* a bound of one key is checked where it is written (with its line); the rest when the whole is validated */
        int rc = load(bad[i].yaml, &o, &e);
        if (rc) {
            CHECKF(rc == SNUG_EINPUT && has(&e, bad[i].want) && has(&e, "cfg.yaml line 1: "), "'%s' not in: %s",
                   bad[i].want, e.msg);
            continue;
        }
        snug_error_clear(&e);
        rc = snug_run_config_validate(&o, &e);
        CHECKF(rc == SNUG_EINPUT, "validate %s: rc %d", bad[i].yaml, rc);
        CHECKF(has(&e, bad[i].want) && has(&e, "cfg.yaml: "), "'%s' not in: %s", bad[i].want, e.msg);
    }
    snug_run_config o;
    snug_error e;
    CHECK(load("max_steps: 50\nnum_epochs: 0\n", &o, &e) == 0 && snug_run_config_validate(&o, &e) == 0);
    CHECK(load("val_set_size: 100\n", &o, &e) == 0 && snug_run_config_validate(&o, &e) == 0);
    /* the batching keys (Axolotl's spellings) */
    CHECK(load("seed: 1\n", &o, &e) == 0 && !o.sample_packing && !o.group_by_length && !o.pad_to_sequence_len &&
          o.pad_to_multiple_of == 0 && !o.concatenate);
    CHECKF(load("sample_packing: true\npad_to_sequence_len: true\n", &o, &e) == 0 && o.sample_packing &&
           o.pad_to_sequence_len && snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    CHECKF(load("group_by_length: yes\npad_to_multiple_of: 64\n", &o, &e) == 0 && o.group_by_length &&
           o.pad_to_multiple_of == 64 && snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    CHECKF(load("concatenate: true\n", &o, &e) == 0 && o.concatenate && snug_run_config_validate(&o, &e) == 0, "%s",
           e.msg);
}

/* parse_args over a config file alone (deepspeed's file is read there, after every override) */
static int parse_config(const char *yaml, snug_run_config *o, snug_error *e) {
    char path[1024];
    snprintf(path, sizeof path, "%s", write_file("cfg.yaml", yaml));
    char *argv[] = {path};
    snug_options_defaults(o);
    snug_error_clear(e);
    return snug_options_parse_args(o, 1, argv, e);
}

/* fsdp_config: Axolotl's mapping (FSDP1 keys with the fsdp_ prefix, FSDP2 keys without) and Hugging Face's JSON file,
 * each sharding setting as its ZeRO stage, activation_checkpointing as gradient_checkpointing, the keys snug does
 * anyway accepted, and every refusal with its place. */
static void test_fsdp_config(void) {
    snug_run_config o;
    snug_error e;
    char yaml[1200];
    CHECKF(parse_config("fsdp_version: 2\nfsdp_config:\n  offload_params: false\n  state_dict_type: FULL_STATE_DICT\n"
                        "  auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
                        "  reshard_after_forward: true\n  cpu_ram_efficient_loading: true\n"
                        "  activation_checkpointing: true\n", &o, &e) == 0 &&
           o.zero_stage == 3 && o.gradient_checkpointing == SNUG_CKPT_CHOICE_FULL, "%s", e.msg);
    CHECKF(parse_config("fsdp: [full_shard, auto_wrap]\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
                        "  fsdp_offload_params: false\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
                        "  fsdp_transformer_layer_cls_to_wrap: [LlamaDecoderLayer, MistralDecoderLayer]\n"
                        "  fsdp_use_orig_params: false\n  fsdp_sync_module_states: true\n  fsdp_limit_all_gathers: true\n"
                        "  fsdp_forward_prefetch: false\n  fsdp_min_num_params: 0\n  fsdp_state_dict_type: sharded_state_dict\n",
                        &o, &e) == 0 && o.zero_stage == 3 && o.gradient_checkpointing == SNUG_CKPT_CHOICE_NONE,
           "%s", e.msg);
    CHECKF(parse_config("fsdp_config:\n  reshard_after_forward: false\n", &o, &e) == 0 && o.zero_stage == 2, "%s",
           e.msg);
    CHECKF(parse_config("fsdp_config:\n  sharding_strategy: 2\n", &o, &e) == 0 && o.zero_stage == 2, "%s", e.msg);
    CHECKF(parse_config("fsdp_config:\n  reshard_after_forward: shard_grad_op\n", &o, &e) == 0 && o.zero_stage == 2,
           "%s", e.msg); /* FSDP1's spelling of reshard_after_forward */
    CHECKF(parse_config("fsdp_config:\n  sharding_strategy: NO_SHARD\n", &o, &e) == 0 && o.zero_stage == 0, "%s",
           e.msg);
    CHECKF(parse_config("fsdp_config:\n  activation_checkpointing: false\n", &o, &e) == 0 && o.zero_stage == 3 &&
           o.gradient_checkpointing == SNUG_CKPT_CHOICE_NONE, "%s", e.msg);
    /* no strategy named: zero_stage decides; activation_checkpointing leaves a chosen checkpointing as it is */
    CHECKF(parse_config("zero_stage: 2\nfsdp_config:\n  activation_checkpointing: true\n", &o, &e) == 0 &&
           o.zero_stage == 2 && o.gradient_checkpointing == SNUG_CKPT_CHOICE_FULL, "%s", e.msg);
    CHECKF(parse_config("gradient_checkpointing: selective\nfsdp: [full_shard]\nfsdp_config:\n"
                        "  activation_checkpointing: true\n", &o, &e) == 0 &&
           o.gradient_checkpointing == SNUG_CKPT_CHOICE_SELECTIVE, "%s", e.msg);
    CHECKF(parse_config("fsdp_config: {}\nfsdp_config_typo: 1\n", &o, &e) == SNUG_EINPUT &&
           has(&e, "did you mean 'fsdp_config'"), "%s", e.msg);
    CHECKF(parse_config("fsdp_config: {}\n", &o, &e) == 0 && o.zero_stage == 0, "%s", e.msg); /* asks for nothing */
    /* refusals, each naming the file and line */
    /* offload_params (FSDP1's fsdp_ spelling, FSDP2's plain one, cpu_offload) is offload_params: an adapter's frozen
     * base in host memory; the run's validation refuses it for a full fine-tune */
    CHECKF(parse_config("seed: 1\nfsdp_config:\n  fsdp_offload_params: true\n", &o, &e) == 0 && o.offload_params &&
           o.zero_stage == 3, "%s", e.msg);
    CHECKF(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, "offload_params") && has(&e, "adapter: lora or qlora") &&
           has(&e, "paged_adamw_8bit"), "%s", e.msg);
    CHECKF(parse_config("adapter: qlora\nbf16: true\nfsdp_config:\n  cpu_offload: true\n", &o, &e) == 0 &&
           o.offload_params && snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    CHECKF(parse_config("fsdp_config:\n  offload_params: false\n", &o, &e) == 0 && !o.offload_params, "%s", e.msg);
    EXPECT_YAML_ERROR("fsdp_config:\n  offload_params: sometimes\n", "line 2", "must be true or false");
    EXPECT_YAML_ERROR("fsdp_config:\n  sharding_strategy: HYBRID_SHARD\n", "line 2", "HYBRID_SHARD",
                      "not supported yet; use FULL_SHARD or SHARD_GRAD_OP");
    EXPECT_YAML_ERROR("fsdp_config:\n  sharding_strategy: HALF_SHARD\n", "must be FULL_SHARD, SHARD_GRAD_OP or NO_SHARD");
    EXPECT_YAML_ERROR("fsdp_config:\n  sharding_strategy: FULL_SHARD\n  reshard_after_forward: false\n",
                      "sharding_strategy means ZeRO stage 3 but its reshard_after_forward means stage 2; keep one");
    EXPECT_YAML_ERROR("fsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n", "line 2",
                      "unknown fsdp_config key 'fsdp_sharding_stratgy': did you mean 'sharding_strategy'?");
    EXPECT_YAML_ERROR("fsdp_config:\n  auto_wrap_policy: NO_WRAP\n", "must be one of TRANSFORMER_BASED_WRAP",
                      "one decoder layer at a time");
    EXPECT_YAML_ERROR("fsdp_config:\n  xla: true\n", "TPUs");
    EXPECT_YAML_ERROR("fsdp_config:\n  xla_fsdp_settings: {compute_dtype: bfloat16}\n", "TPUs");
    EXPECT_YAML_ERROR("fsdp_config:\n  sync_module_states: maybe\n", "must be true or false");
    EXPECT_YAML_ERROR("fsdp_config:\n  min_num_params: -5\n", "min_num_params must be a whole number");
    EXPECT_YAML_ERROR("fsdp_config:\n  transformer_layer_cls_to_wrap: [{a: b}]\n", "must name the layer class");
    EXPECT_YAML_ERROR("fsdp_config:\n  version: [2]\n", "must be a single value, got a list");
    EXPECT_YAML_ERROR("fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  sharding_strategy: FULL_SHARD\n",
                      "sets sharding_strategy twice");
    EXPECT_YAML_ERROR("fsdp_config: [FULL_SHARD]\n", "must be a mapping of FSDP's options");
    CHECKF(parse_config("fsdp: [shard_grad_op]\nfsdp_config:\n  sharding_strategy: FULL_SHARD\n", &o, &e) ==
           SNUG_EINPUT && has(&e, "fsdp (shard_grad_op) means ZeRO stage 2 but fsdp_config's sharding means stage 3"),
           "%s", e.msg);
    CHECKF(parse_config("zero_stage: 1\nfsdp_config:\n  reshard_after_forward: true\n", &o, &e) == SNUG_EINPUT &&
           has(&e, "zero_stage is 1 but fsdp_config means stage 3"), "%s", e.msg);
    CHECKF(parse_config("fsdp: false\nfsdp_config:\n  reshard_after_forward: true\n", &o, &e) == SNUG_EINPUT &&
           has(&e, "fsdp is false but fsdp_config is given; remove one"), "%s", e.msg);
    CHECKF(parse_config("fsdp: [hybrid_shard]\n", &o, &e) == SNUG_EINPUT && has(&e, "hybrid"), "%s", e.msg);
    CHECKF(parse_config("fsdp_version: 3\n", &o, &e) == SNUG_EINPUT && has(&e, "fsdp_version is 3; it must be 1 or 2"),
           "%s", e.msg);
    /* Hugging Face's JSON file: in the YAML, and on the command line over the YAML's mapping */
    const char *js = write_file("fsdp.json", "{\"fsdp_sharding_strategy\": \"SHARD_GRAD_OP\", \"transformer_layer_cls_to_wrap\": "
                                "[\"GPT2Block\"], \"min_num_params\": 0, \"xla\": false, \"xla_fsdp_settings\": {}, "
                                "\"activation_checkpointing\": true, \"limit_all_gathers\": null}");
    snprintf(yaml, sizeof yaml, "fsdp: true\nfsdp_config: %s\n", js);
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.zero_stage == 2 && o.gradient_checkpointing == SNUG_CKPT_CHOICE_FULL,
           "%s", e.msg);
    char cfg[1024], jsarg[1024];
    snprintf(cfg, sizeof cfg, "%s", write_file("cfg.yaml", "fsdp_config:\n  reshard_after_forward: true\n"));
    snprintf(jsarg, sizeof jsarg, "%s", js);
    char *argv[] = {cfg, "--fsdp_config", jsarg};
    snug_options_defaults(&o);
    CHECKF(snug_options_parse_args(&o, 3, argv, &e) == 0 && o.zero_stage == 2, "%s", e.msg);
    const char *joff = write_file("fsdpoff.json", "{\"offload_params\": true}");
    snprintf(yaml, sizeof yaml, "fsdp_config: %s\n", joff);
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.offload_params, "%s", e.msg);
    const char *jbad = write_file("fsdpbad.json", "{\"xla\": true}");
    snprintf(yaml, sizeof yaml, "fsdp_config: %s\n", jbad);
    CHECKF(parse_config(yaml, &o, &e) == SNUG_EINPUT && has(&e, "fsdp_config ") && has(&e, "fsdpbad.json") &&
           has(&e, "xla is for FSDP on TPUs"), "%s", e.msg);
    const char *jnot = write_file("fsdpnot.json", "[1, 2]");
    snprintf(yaml, sizeof yaml, "fsdp_config: %s\n", jnot);
    CHECKF(parse_config(yaml, &o, &e) == SNUG_EINPUT && has(&e, "must hold a JSON object"), "%s", e.msg);
    const char *jsyn = write_file("fsdpsyn.json", "{\"sharding_strategy\": }");
    snprintf(yaml, sizeof yaml, "fsdp_config: %s\n", jsyn);
    CHECKF(parse_config(yaml, &o, &e) == SNUG_EINPUT && has(&e, "fsdpsyn.json line 1"), "%s", e.msg);
    CHECKF(parse_config("fsdp_config: /nonexistent/fsdp.json\n", &o, &e) == SNUG_EINPUT &&
           has(&e, "/nonexistent/fsdp.json"), "%s", e.msg);
}

/* ZeRO: zero_stage, DeepSpeed's zero_optimization.stage, and the refusals of what is not built */
static void test_zero(void) {
    snug_run_config o;
    snug_error e;
    char yaml[1200];
    CHECK(load("seed: 1\n", &o, &e) == 0 && o.zero_stage == 0);
    CHECKF(load("zero_stage: 1\n", &o, &e) == 0 && o.zero_stage == 1 && snug_run_config_validate(&o, &e) == 0, "%s",
           e.msg);
    EXPECT_YAML_ERROR("zero_stage: -1\n", "zero_stage is -1; it must be at least 0");
    struct {
        const char *yaml, *want;
    } bad[] = {
        {"zero_stage: 4\n", "zero_stage 4 does not exist"},
        {"zero_stage: 1\nadapter: lora\n", "zero_stage 1 with adapter lora is not supported"},
        {"zero_stage: 2\nadapter: qlora\n", "zero_stage 2 with adapter qlora is not supported"},
        {"zero_stage: 3\nadapter: lora\nbf16: true\noffload_embedding: true\n", "offload_embedding with zero_stage 3"},
        {"zero_stage: 3\nadapter: lora\nlora_modules_to_save: [lm_head]\n", "lora_modules_to_save with zero_stage 3 needs base_model"},
        {"adapter: lora\noffload_params: true\nlora_modules_to_save: [lm_head]\n",
         "lora_modules_to_save with offload_params needs base_model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(load(bad[i].yaml, &o, &e) == 0, "%s", e.msg);
        CHECKF(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, bad[i].want), "'%s' not in: %s",
               bad[i].want, e.msg);
    }
    CHECKF(load("zero_stage: 1\nbf16: true\nmaster_weights: false\n", &o, &e) == 0 &&
           snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    CHECKF(load("zero_stage: 2\n", &o, &e) == 0 && o.zero_stage == 2 && snug_run_config_validate(&o, &e) == 0, "%s",
           e.msg);
    /* the step inside backward at stages 1 to 3 (each rank steps its shard of each layer), and under an adapter at
     * stage 3 (the adapters' state is whole: stepped as under DDP) */
    CHECKF(load("zero_stage: 2\noptimizer_in_backward: true\nmax_grad_norm: 0\n", &o, &e) == 0 &&
           snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    CHECKF(load("zero_stage: 3\noptimizer_in_backward: true\nmax_grad_norm: 0\n", &o, &e) == 0 &&
           snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    CHECKF(load("zero_stage: 3\nadapter: lora\noptimizer_in_backward: true\nmax_grad_norm: 0\n", &o, &e) == 0 &&
           snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    /* QLoRA at stage 3 shards the 4-bit matrices: the embedding and the head stay whole, so a trained copy starts
     * from them without base_model, and the embedding may live in host memory */
    CHECKF(load("zero_stage: 3\nadapter: qlora\nbf16: true\noffload_embedding: true\nlora_modules_to_save: [lm_head]\n",
                &o, &e) == 0 && snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    /* stage 3 checkpoints (each rank its shard of the parameters) and resumes */
    CHECKF(load("zero_stage: 3\nsave_steps: 5\nresume_from_checkpoint: latest\n", &o, &e) == 0 && o.zero_stage == 3 &&
           o.save_steps == 5 && snug_run_config_validate(&o, &e) == 0, "%s", e.msg);
    /* and takes 16-bit storage without master weights (the final save streams the 16-bit shards as stored) */
    CHECKF(load("zero_stage: 3\nbf16: true\nmaster_weights: false\n", &o, &e) == 0 &&
           snug_run_config_validate(&o, &e) == 0, "%s", e.msg);

    /* DeepSpeed's JSON: its stage is zero_stage */
    const char *ds1 = write_file("ds1.json", "{\"train_batch_size\": \"auto\", \"zero_optimization\": {\"stage\": 1,"
                                 " \"offload_optimizer\": {\"device\": \"none\"}}}");
    snprintf(yaml, sizeof yaml, "deepspeed: %s\n", ds1);
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.zero_stage == 1, "%s", e.msg);
    snprintf(yaml, sizeof yaml, "deepspeed: %s\nzero_stage: 1\n", ds1);
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.zero_stage == 1, "%s", e.msg);
    const char *ds0 = write_file("ds0.json", "{\"zero_optimization\": {\"stage\": 0}}");
    snprintf(yaml, sizeof yaml, "deepspeed: %s\nzero_stage: 1\n", ds0);
    CHECKF(parse_config(yaml, &o, &e) == SNUG_EINPUT && has(&e, "zero_stage is 1 but deepspeed's") &&
           has(&e, "keep one"), "%s", e.msg);
    struct {
        const char *name, *json, *want;
    } dbad[] = {
        {"ds5.json", "{\"zero_optimization\": {\"stage\": \"auto\"}}", "zero_optimization.stage must be 0, 1, 2 or 3"},
        {"dso.json", "{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"nvme\"}}}",
         "zero_optimization.offload_optimizer.device is nvme: snug offloads to cpu only"},
        {"dsn.json", "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\"}}}",
         "zero_optimization.offload_param.device is nvme: snug offloads to cpu only"},
        {"dsz.json", "{\"zero_optimization\": 1}", "zero_optimization must be an object"},
        {"dsbad.json", "{\"zero_optimization\": ", "line 1"},
    };
    for (size_t i = 0; i < sizeof dbad / sizeof dbad[0]; i++) {
        const char *path = write_file(dbad[i].name, dbad[i].json);
        snprintf(yaml, sizeof yaml, "deepspeed: %s\n", path);
        CHECKF(parse_config(yaml, &o, &e) == SNUG_EINPUT && has(&e, dbad[i].want) && has(&e, "deepspeed: "),
               "'%s' not in: %s", dbad[i].want, e.msg);
    }
    /* DeepSpeed's offload_optimizer to the cpu is a paged optimizer (8-bit stays 8-bit) */
    snprintf(yaml, sizeof yaml, "deepspeed: %s\n",
             write_file("dso2.json", "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
                                     "\"cpu\", \"pin_memory\": true}}}"));
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.optimizer == SNUG_OPTIMIZER_PAGED_ADAMW_32BIT, "%s", e.msg);
    {
        char y8[2048];
        snprintf(y8, sizeof y8, "%soptimizer: adamw_8bit\n", yaml);
        CHECKF(parse_config(y8, &o, &e) == 0 && o.optimizer == SNUG_OPTIMIZER_PAGED_ADAMW_8BIT, "%s", e.msg);
    }
    /* DeepSpeed's offload_param to the cpu is offload_params */
    snprintf(yaml, sizeof yaml, "deepspeed: %s\n",
             write_file("dsp.json", "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
                                    "\"cpu\", \"pin_memory\": true}}}"));
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.offload_params && o.zero_stage == 3, "%s", e.msg);
    char ds2[1024]; /* write_file's path is overwritten by the next file's */
    snprintf(ds2, sizeof ds2, "%s",
             write_file("ds2.json", "{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": true}}"));
    snprintf(yaml, sizeof yaml, "deepspeed: %s\n", ds2);
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.zero_stage == 2 && o.zero_overlap_comm == SNUG_OVERLAP_ON, "%s",
           e.msg);
    /* its overlap_comm is zero_overlap_comm: unset, auto; given, it must agree with a zero_overlap_comm given too */
    CHECKF(parse_config("zero_stage: 2\n", &o, &e) == 0 && o.zero_overlap_comm == SNUG_OVERLAP_AUTO, "%s", e.msg);
    CHECKF(parse_config("zero_stage: 2\nzero_overlap_comm: false\n", &o, &e) == 0 &&
           o.zero_overlap_comm == SNUG_OVERLAP_OFF, "%s", e.msg);
    snprintf(yaml, sizeof yaml, "deepspeed: %s\nzero_overlap_comm: true\n", ds2);
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.zero_overlap_comm == SNUG_OVERLAP_ON, "%s", e.msg);
    snprintf(yaml, sizeof yaml, "deepspeed: %s\nzero_overlap_comm: false\n", ds2);
    CHECKF(parse_config(yaml, &o, &e) == SNUG_EINPUT && has(&e, "zero_overlap_comm is false but deepspeed's") &&
           has(&e, "sets zero_optimization.overlap_comm true; keep one"), "%s", e.msg);
    const char *dsf = write_file("dsf.json", "{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": false}}");
    snprintf(yaml, sizeof yaml, "deepspeed: %s\n", dsf);
    CHECKF(parse_config(yaml, &o, &e) == 0 && o.zero_overlap_comm == SNUG_OVERLAP_OFF, "%s", e.msg);
    const char *dsn = write_file("dsn.json", "{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": \"yes\"}}");
    snprintf(yaml, sizeof yaml, "deepspeed: %s\n", dsn);
    CHECKF(parse_config(yaml, &o, &e) == SNUG_EINPUT && has(&e, "zero_optimization.overlap_comm must be true or false"),
           "%s", e.msg);
    EXPECT_YAML_ERROR("zero_overlap_comm: sometimes\n", "zero_overlap_comm");
    CHECKF(parse_config("deepspeed: /nonexistent/ds.json\n", &o, &e) == SNUG_EINPUT &&
           has(&e, "/nonexistent/ds.json"), "%s", e.msg);
    /* FSDP: shard_grad_op is stage 2; full_shard (stage 3) and the rest refused naming the key */
    CHECKF(parse_config("fsdp: [shard_grad_op, auto_wrap]\n", &o, &e) == 0 && o.zero_stage == 2, "%s", e.msg);
    CHECKF(parse_config("fsdp: no_shard auto_wrap\n", &o, &e) == 0 && o.zero_stage == 0, "%s", e.msg);
    CHECKF(parse_config("fsdp: [full_shard, auto_wrap]\n", &o, &e) == 0 && o.zero_stage == 3, "%s", e.msg);
    CHECKF(parse_config("fsdp: [full_shard, offload]\n", &o, &e) == 0 && o.offload_params && o.zero_stage == 3, "%s",
           e.msg);
    CHECKF(parse_config("fsdp: [shard_grad_op, hybrid]\n", &o, &e) == SNUG_EINPUT && has(&e, "fsdp: 'hybrid'"),
           "%s", e.msg);
    CHECKF(parse_config("fsdp: [shard_grad_op]\nzero_stage: 1\n", &o, &e) == SNUG_EINPUT &&
           has(&e, "zero_stage is 1 but fsdp (shard_grad_op) means stage 2"), "%s", e.msg);
    CHECKF(parse_config("fsdp: true\n", &o, &e) == 0 && o.zero_stage == 3, "%s", e.msg); /* FULL_SHARD by default */
    CHECKF(parse_config("fsdp: false\n", &o, &e) == 0 && o.zero_stage == 0, "%s", e.msg);
    test_fsdp_config();
}


/* A YAML file loaded alone (snug_options_load_yaml, the library's way in) resolves the other trainers' spellings
 * exactly as `snug train FILE` (snug_options_parse_args with the path alone) does: the same configuration to the
 * byte, and the same refusals. */
static void test_yaml_alone_resolves(void) {
    static const char *const yamls[] = {
        "attn_implementation: eager\n",
        "attn_implementation: sdpa\nactivation_offloading: true\ngradient_checkpointing: true\n",
        "use_cpu: true\nfull_determinism: true\nliger_fused_linear_cross_entropy: true\nreport_to: tensorboard\n",
        "fsdp: [shard_grad_op, offload]\nfsdp_config:\n  activation_checkpointing: true\n",
        "learning_rate: 2e-4\nlr_scheduler: cosine_with_min_lr\nlr_scheduler_kwargs:\n  min_lr: 5e-5\n",
        "chat_template: llama3\ndatasets:\n  - path: a.jsonl\n    type: chat_template\n",
    };
    snug_run_config *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    snug_error e;
    if (!a || !b) {
        CHECK(0);
        free(a), free(b);
        return;
    }
    for (size_t i = 0; i < sizeof yamls / sizeof yamls[0]; i++) {
        CHECKF(load(yamls[i], a, &e) == 0, "%s: %s", yamls[i], e.msg);
        CHECKF(parse_config(yamls[i], b, &e) == 0, "%s: %s", yamls[i], e.msg);
        CHECKF(!memcmp(a, b, sizeof *a), "load_yaml and parse_args differ on %s", yamls[i]);
    }
    CHECK(load(yamls[0], a, &e) == 0 && !a->flash_attention);
    CHECK(load(yamls[1], a, &e) == 0 && a->flash_attention && a->gradient_checkpointing == SNUG_CKPT_CHOICE_OFFLOAD);
    CHECK(load(yamls[2], a, &e) == 0 && a->device == SNUG_BACKEND_CPU && a->ddp_deterministic &&
          a->chunked_cross_entropy && a->use_tensorboard);
    CHECK(load(yamls[3], a, &e) == 0 && a->zero_stage == 2 && a->offload_params &&
          a->gradient_checkpointing == SNUG_CKPT_CHOICE_FULL);
    CHECK(load(yamls[4], a, &e) == 0 && fabs(a->cosine_min_lr_ratio - 0.25) < 1e-12);
    CHECK(load(yamls[5], a, &e) == 0 && a->datasets[0].chat_template == SNUG_CHAT_LLAMA3);
    EXPECT_YAML_ERROR("attn_implementation: eager\nsdp_attention: true\n", "ask for two kinds of attention");
    /* Axolotl's type chat_template naming no template: the tokenizer's own (tokenizer_default); type chat: the
     * tokenizer's own else chatml; chat_template_jinja alone: jinja */
    CHECK(load("datasets:\n  - path: a.jsonl\n    type: chat_template\n  - path: b.jsonl\n    type: chat\n", a,
               &e) == 0 &&
          a->datasets[0].chat_template == SNUG_CHAT_TOKENIZER &&
          a->datasets[1].chat_template == SNUG_CHAT_TOKENIZER_OR_CHATML);
    CHECK(load("chat_template_jinja: \"{{ messages }}\"\ndatasets:\n  - path: a.jsonl\n    type: chat_template\n"
               "  - path: b.jsonl\n    type: chat\n    chat_template: chatml\n", a, &e) == 0 &&
          a->chat_template == SNUG_CHAT_JINJA && a->datasets[0].chat_template == SNUG_CHAT_JINJA &&
          a->datasets[1].chat_template == SNUG_CHAT_CHATML && !strcmp(a->chat_template_jinja, "{{ messages }}"));
    EXPECT_YAML_ERROR("datasets:\n  - path: a.jsonl\n    type: chat\n    chat_template_jinja: t.jinja\n",
                      "chat_template_jinja is not supported yet", "set chat_template_jinja once for the whole config");
    CHECK(load("chat_template: tokenizer_default_fallback_chatml\ndatasets:\n  - path: a.jsonl\n    type: "
               "chat_template\n  - path: b.jsonl\n    type: chat\n    chat_template: tokenizer_default_fallback_llama3\n",
               a, &e) == 0 &&
          a->datasets[0].chat_template == SNUG_CHAT_TOKENIZER_OR_CHATML &&
          a->datasets[1].chat_template == SNUG_CHAT_TOKENIZER_OR_LLAMA3);
    EXPECT_YAML_ERROR("lr_scheduler: cosine_with_min_lr\n", "needs its floor");
    EXPECT_YAML_ERROR("fsdp: [shard_grad_op]\nzero_stage: 1\n", "zero_stage is 1 but fsdp (shard_grad_op)");
    free(a);
    free(b);
}

/* A failed load leaves the options as they were. */
static void test_atomic(void) {
    snug_run_config o, before;
    snug_error e;
    snug_options_defaults(&o);
    o.seed = 123;
    before = o;
    CHECK(snug_options_load_yaml(&o, write_file("bad.yaml", "seed: 5\nmicro_batch_size: 3\nlr: 1\n"), &e) ==
          SNUG_EINPUT);
    CHECK(memcmp(&o, &before, sizeof o) == 0);
}

static void test_help(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (!f)
        return;
    snug_options_print_help(f);
    fclose(f);
    static const char *const want[] = {
        "model:", "data:", "batch & schedule:", "optimizer:", "output & logging:", "generation:", "memory:",
        "micro_batch_size: int = 4", "per_device_train_batch_size",
        "lr_scheduler: cosine|cosine_with_min_lr|linear|constant|constant_with_warmup|cosine_with_restarts|polynomial|"
        "inverse_sqrt|warmup_stable_decay|reduce_lr_on_plateau|cosine_warmup_with_min_lr|rex = cosine",
        "optimizer: adamw|",
        "lr_scheduler_type", "learning_rate: float = 3e-4", "memory_budget: size", "output_dir: string = \"out\"",
        "num_train_epochs", "optim", "path: string (required)", "field: string = \"text\"", "--dataset",
        "recognised but not supported yet", "bf16", "gradient_checkpointing", "lora_r", "wandb_project",
        "skip_bad_examples", "datasets[].split (train accepted)", "adamw_8bit",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECKF(strstr(text, want[i]) != NULL, "help lacks '%s'", want[i]);
    /* Supported keys come before the not-supported section; tf32 only after it. */
    const char *later = strstr(text, "recognised but not supported yet");
    CHECK(later && strstr(text, "  tf32") > later && strstr(text, "  bf16") < later);
    free(text);
}

/* The activation levers: one key each, HF spellings accepted. */
static void test_levers(void) {
    snug_run_config o;
    snug_error e;
    snug_options_defaults(&o);
    CHECK(o.gradient_checkpointing == SNUG_CKPT_CHOICE_NONE && o.flash_attention == 1 && o.chunked_cross_entropy == 0);
    CHECK(o.gradient_checkpointing_every_n_layers == 1 && o.cross_entropy_chunk_tokens == 256);
    CHECKF(load("gradient_checkpointing: true\nflash_attention: false\nchunked_cross_entropy: true\n"
                "cross_entropy_chunk_tokens: 64\ngradient_checkpointing_every_n_layers: 3\n", &o, &e) == 0, "%s", e.msg);
    CHECK(o.gradient_checkpointing == SNUG_CKPT_CHOICE_FULL && o.flash_attention == 0 && o.chunked_cross_entropy == 1);
    CHECK(o.cross_entropy_chunk_tokens == 64 && o.gradient_checkpointing_every_n_layers == 3);
    CHECKF(load("gradient_checkpointing: selective\n", &o, &e) == 0 && o.gradient_checkpointing == SNUG_CKPT_CHOICE_SELECTIVE,
           "%s", e.msg);
    CHECKF(load("gradient_checkpointing: false\n", &o, &e) == 0 && o.gradient_checkpointing == SNUG_CKPT_CHOICE_NONE, "%s",
           e.msg);
    EXPECT_YAML_ERROR("gradient_checkpointing: sometimes\n", "cfg.yaml line 1", "gradient_checkpointing");
    snug_options_defaults(&o);
    o.gradient_checkpointing_every_n_layers = 0;
    CHECK(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, "gradient_checkpointing_every_n_layers"));
    /* tiled_mlp (Axolotl's keys: shards 0 = auto) and offload_embedding (Unsloth's), which needs a frozen embedding */
    snug_options_defaults(&o);
    CHECK(o.tiled_mlp == 0 && o.tiled_mlp_num_shards == 0 && o.offload_embedding == 0);
    CHECKF(load("tiled_mlp: true\ntiled_mlp_num_shards: 8\n", &o, &e) == 0, "%s", e.msg);
    CHECK(o.tiled_mlp == 1 && o.tiled_mlp_num_shards == 8 && snug_run_levers(&o).mlp_shards == 8);
    o.tiled_mlp_num_shards = 0;
    CHECK(snug_run_levers(&o).mlp_shards == -1);
    o.tiled_mlp = 0;
    CHECK(snug_run_levers(&o).mlp_shards == 0);
    o.tiled_mlp_num_shards = -2;
    CHECK(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, "tiled_mlp_num_shards"));
    snug_options_defaults(&o);
    o.offload_embedding = 1;
    CHECK(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, "offload_embedding") && has(&e, "adapter"));
    o.adapter = SNUG_ADAPTER_QLORA;
    CHECKF(snug_run_config_validate(&o, &e) == 0 && snug_run_levers(&o).offload_embedding == 1, "%s", e.msg);
}

/* The keys of Axolotl's example configs that name what snug does under another name, or a mapping: each read into
 * its field, each resolved against the others once the file is read, each refusal with its place. */
static void test_axolotl_keys(void) {
    snug_run_config o;
    snug_error e;
    CHECKF(parse_config("special_tokens:\n  pad_token: \"<|end_of_text|>\"\n  eos_token: <|im_end|>\n"
                        "gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n"
                        "chat_template: llama3\nevals_per_epoch: 4\nsaves_per_epoch: 1\nloss_watchdog_threshold: 5.0\n"
                        "loss_watchdog_patience: 2\nlora_fan_in_fan_out:\ndebug: true\neval_max_new_tokens: 64\n"
                        "attn_implementation: flash_attention_2\nxformers_attention:\nsdp_attention: true\n"
                        "datasets:\n  - path: a.jsonl\n    type: chat_template\n    field_messages: conversations\n"
                        "    message_field_role: from\n    message_field_content: value\n"
                        "    roles:\n      user: [human, user]\n      assistant:\n        - gpt\n      system: sys\n"
                        "    roles_to_train: [assistant]\n  - path: b.jsonl\n    type: chat\n    chat_template: chatml\n"
                        "    message_property_mappings:\n      role: speaker\n      content: text\n",
                        &o, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(o.pad_token, "<|end_of_text|>") && !strcmp(o.eos_token, "<|im_end|>") && !o.bos_token[0]);
    CHECK(o.evals_per_epoch == 4 && o.saves_per_epoch == 1 && o.loss_watchdog_threshold == 5.0 &&
          o.loss_watchdog_patience == 2 && o.lora_fan_in_fan_out == -1 && o.debug);
    CHECK(o.flash_attention && o.gradient_checkpointing == SNUG_CKPT_CHOICE_FULL);
    const snug_dataset_spec *d = &o.datasets[0], *d1 = &o.datasets[1];
    CHECK(o.ndatasets == 2 && d->type == SNUG_DATA_CHAT && d->chat_template == SNUG_CHAT_LLAMA3 &&
          !strcmp(d->field_messages, "conversations") && !strcmp(d->field_role, "from") &&
          !strcmp(d->field_content, "value") && !strcmp(d->roles_user, "human,user") &&
          !strcmp(d->roles_assistant, "gpt") && !strcmp(d->roles_system, "sys"));
    /* the entry's own chat_template wins over the config-wide one, written before or after it */
    CHECK(d1->chat_template == SNUG_CHAT_CHATML && !strcmp(d1->field_role, "speaker") &&
          !strcmp(d1->field_content, "text") && !strcmp(d1->field_messages, "messages") && !d1->roles_user[0]);
    CHECKF(parse_config("chat_template: llama3\ntest_datasets:\n  - path: t.jsonl\n    type: chat\n  - u.jsonl\n",
                        &o, &e) == 0, "%s", e.msg);
    CHECK(o.ndatasets == 0 && o.ntest_datasets == 2 && o.test_datasets[0].type == SNUG_DATA_CHAT &&
          o.test_datasets[0].chat_template == SNUG_CHAT_LLAMA3 && strstr(o.test_datasets[1].path, "/u.jsonl") &&
          o.test_datasets[1].type == SNUG_DATA_COMPLETION);
    CHECKF(parse_config("attn_implementation: eager\nactivation_offloading: true\nlora_fan_in_fan_out: true\n",
                        &o, &e) == 0, "%s", e.msg);
    CHECK(!o.flash_attention && o.gradient_checkpointing == SNUG_CKPT_CHOICE_OFFLOAD && o.lora_fan_in_fan_out == 1);
    CHECKF(parse_config("model_type: AutoModelForCausalLM\nspecial_tokens:\ntrust_remote_code: true\n"
                        "is_mistral_derived_model: true\neval_table_max_new_tokens: 32\ntokenizer_type: LlamaTokenizer\n",
                        &o, &e) == 0, "%s", e.msg);
    CHECK(o.derived_mistral && !o.derived_llama);
    /* keys that change nothing in snug keep their types and ranges */
    EXPECT_YAML_ERROR("trust_remote_code: sometimes\n", "trust_remote_code must be true or false");
    EXPECT_YAML_ERROR("eval_table_max_new_tokens: 0\n", "eval_table_max_new_tokens is 0; it must be at least 1");
    CHECK(!strcmp(o.model_class, "AutoModelForCausalLM") && !o.pad_token[0]);
    /* Hugging Face's and TRL's spellings of snug's settings; other trainers' knobs that change nothing */
    CHECKF(parse_config("packing: true\nmax_length: 128\ngradient_checkpointing: unsloth\nuse_cpu: true\n"
                        "full_determinism: true\nliger_fused_linear_cross_entropy: true\nsave_strategy: steps\n"
                        "eval_strategy: steps\nlogging_steps: 7\nliger_rope: true\ndataloader_num_workers: 4\n"
                        "eval_sample_packing: false\nsave_safetensors: true\nreport_to: none\ntrain_on_eos: turn\n"
                        "per_device_eval_batch_size: 16\n"
                        "sequence_parallel_degree: 1\nplugins: []\nshuffle_merged_datasets: true\n", &o, &e) == 0,
           "%s", e.msg);
    CHECK(o.sample_packing && o.sequence_len == 128 && o.gradient_checkpointing == SNUG_CKPT_CHOICE_OFFLOAD &&
          o.device == SNUG_BACKEND_CPU && o.ddp_deterministic && o.chunked_cross_entropy && o.save_steps == 500 &&
          o.eval_steps == 7);
    CHECKF(parse_config("report_to: [tensorboard]\nlogging_dir: tb\n", &o, &e) == 0 && o.use_tensorboard &&
               !strcmp(o.logging_dir, "tb"), "%s", e.msg);
    CHECKF(parse_config("report_to: none\nuse_tensorboard: true\n", &o, &e) == 0 && o.use_tensorboard, "%s", e.msg);
    CHECKF(parse_config("report_to: none\n", &o, &e) == 0 && !o.use_tensorboard, "%s", e.msg);
    /* Hugging Face's cosine_with_min_lr: the floor as a rate or as a learning rate */
    /* Axolotl's bnb_config_kwargs: BitsAndBytesConfig's arguments */
    CHECKF(parse_config("adapter: lora\nbnb_config_kwargs:\n  load_in_4bit: true\n  llm_int8_has_fp16_weight: false\n"
                        "  bnb_4bit_quant_type: fp4\n  bnb_4bit_use_double_quant: false\n"
                        "  bnb_4bit_compute_dtype: torch.float16\n  bnb_4bit_quant_storage: bfloat16\n"
                        "  llm_int8_threshold: 6.0\n  llm_int8_skip_modules: [lm_head]\n", &o, &e) == 0 &&
           o.load_in_4bit && o.bnb_4bit_quant_type == SNUG_Q4_FP4 && !o.bnb_4bit_use_double_quant &&
           o.bnb_4bit_compute_fp16, "%s", e.msg);
    CHECKF(parse_config("lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr_rate: 0.1}\n", &o,
                        &e) == 0 && o.lr_scheduler == SNUG_SCHED_COSINE && o.cosine_min_lr_ratio == 0.1, "%s", e.msg);
    /* a floor of 0 written is a floor (transformers takes min_lr_rate: 0) */
    CHECKF(parse_config("lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr_rate: 0}\n", &o,
                        &e) == 0 && o.cosine_min_lr_ratio == 0, "%s", e.msg);
    /* reduce_lr_on_plateau's arguments, min_lr its own floor (not cosine's) */
    CHECKF(parse_config("lr_scheduler: reduce_lr_on_plateau\nval_set_size: 0.1\nlr_scheduler_kwargs: {mode: max, "
                        "threshold_mode: abs, factor: 0.5, patience: 3, threshold: 0.01, cooldown: 2, min_lr: 1e-6, "
                        "eps: 1e-9}\n", &o, &e) == 0 && o.lr_scheduler == SNUG_SCHED_PLATEAU && o.sched.plat_max &&
           o.sched.plat_abs && o.sched.plat_factor == 0.5 && o.sched.plat_patience == 3 &&
           o.sched.plat_threshold == 0.01 && o.sched.plat_cooldown == 2 && o.sched.plat_min_lr == 1e-6 &&
           o.sched.plat_eps == 1e-9 && o.cosine_min_lr_ratio == 0, "%s", e.msg);
    CHECKF(parse_config("learning_rate: 2e-4\nlr_scheduler_kwargs:\n  min_lr: 5e-5\n  num_cycles: 0.5\n"
                        "lr_scheduler: cosine_with_min_lr\n", &o, &e) == 0 && fabs(o.cosine_min_lr_ratio - 0.25) < 1e-12,
           "%s", e.msg);
    /* refusals, each naming the key and the fix */
    static const struct {
        const char *yaml, *want;
    } bad[] = {
        {"save_safetensors: false\n", "save_safetensors is not supported yet (saving pytorch_model.bin; snug saves "
                                      "safetensors); remove it or set it to true"},
        {"dataloader_num_workers: many\n", "dataloader_num_workers must be an integer, got 'many'"},
        {"liger_rope: maybe\n", "liger_rope must be true or false"},
        {"save_strategy: best\n", "save_strategy 'best' is not supported yet"},
        {"report_to: [tensorboard, wandb]\n", "report_to 'wandb' is not supported yet"},
        {"special_tokens:\n  sep_token: x\n", "special_tokens.sep_token is not supported"},
        {"special_tokens: [a]\n", "special_tokens must be a mapping, got a list"},
        {"special_tokens:\n  pad_token: [a]\n", "special_tokens.pad_token must be a single value"},
        {"gradient_checkpointing_kwargs:\n  preserve_rng_state: true\n", "snug reads use_reentrant"},
        {"gradient_checkpointing_kwargs:\n  use_reentrant: maybe\n", "use_reentrant must be true or false"},
        {"attn_implementation: paged_attention\n", "attn_implementation must be one of"},
        {"attn_implementation: eager\nsdp_attention: true\n", "ask for two kinds of attention"},
        {"flash_attention: false\nxformers_attention: true\n", "xformers_attention: true (fused attention) disagree"},
        {"gradient_checkpointing: selective\nactivation_offloading: true\n", "set gradient_checkpointing: true"},
        {"datasets:\n  - path: a.jsonl\n    roles:\n      tool: [tool]\n", "names the role 'tool'"},
        {"datasets:\n  - path: a.jsonl\n    roles:\n      user: ['a,b']\n", "without commas"},
        {"datasets:\n  - path: a.jsonl\n    roles_to_train: [user]\n", "roles_to_train other than [assistant]"},
        {"datasets:\n  - path: a.jsonl\n    message_property_mappings:\n      tool: tools\n",
         "message_property_mappings.tool is not supported"},
        {"lora_fan_in_fan_out: sometimes\n", "lora_fan_in_fan_out must be one of"},
        {"lr_scheduler_type: cosine_with_min_lr\n", "cosine_with_min_lr needs its floor"},
        {"lr_scheduler_kwargs: {num_cycles: 0}\n", "lr_scheduler_kwargs.num_cycles must be above 0"},
        {"lr_scheduler_kwargs: {power: 2}\n", "lr_scheduler cosine does not take; it takes min_lr_rate"},
        {"lr_scheduler_kwargs: {gamma: 2}\n", "lr_scheduler_kwargs.gamma is not a setting"},
        {"lr_scheduler: warmup_stable_decay\nlr_scheduler_kwargs: {num_decay_steps: 2.5}\n", "a whole number"},
        {"lr_scheduler: warmup_stable_decay\nlr_scheduler_kwargs: {num_decay_steps: 5, decay_type: exp}\n",
         "decay_type must be linear, cosine or 1-sqrt, got 'exp'"},
        {"lr_scheduler: warmup_stable_decay\n", "needs its decay steps"},
        {"lr_scheduler: linear\nlr_scheduler_kwargs: {num_cycles: 2}\n", "lr_scheduler linear does not take"},
        {"bnb_config_kwargs: {llm_int8_has_fp16_weight: true}\n", "llm_int8_has_fp16_weight: true is not supported"},
        {"bnb_config_kwargs: {llm_int8_skip_modules: [lm_head, q_proj]}\n", "llm_int8_skip_modules names 'q_proj'"},
        {"bnb_config_kwargs: {bnb_4bit_quant_type: int4}\n", "bnb_4bit_quant_type must be nf4 or fp4, got 'int4'"},
        {"bnb_config_kwargs: {bnb_4bit_compute_dtype: float32}\n", "must be bfloat16 or float16"},
        {"bnb_config_kwargs: {quant_method: gptq}\n", "quant_method is not an argument of BitsAndBytesConfig"},
        {"learning_rate: 1e-4\nlr_scheduler_kwargs: {min_lr: 1e-3}\n", "min_lr is 0.001, above learning_rate"},
        {"metric_for_best_model: accuracy\n", "metric_for_best_model 'accuracy' is not supported yet; use eval_loss"},
        {"greater_is_better: true\n", "greater_is_better is not supported yet"},
        {"evals_per_epoch: -1\n", "evals_per_epoch is -1; it must be at least 0"},
        {"loss_watchdog_patience: 0\n", "loss_watchdog_patience is 0; it must be at least 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = parse_config(bad[i].yaml, &o, &e);
        CHECKF(rc == SNUG_EINPUT && has(&e, "cfg.yaml") && has(&e, bad[i].want), "%s: rc %d, %s", bad[i].yaml, rc,
               e.msg);
    }
    char *argv[] = {"--special_tokens", "x"};
    snug_options_defaults(&o);
    CHECK(snug_options_parse_args(&o, 2, argv, &e) == SNUG_EINPUT && has(&e, "set it in the YAML config"));
    /* what only the whole configuration can check */
    static const char *const invalid[][2] = {
        {"evals_per_epoch: 2\neval_steps: 10\n", "evals_per_epoch 2 and eval_steps 10 both say when to evaluate"},
        {"saves_per_epoch: 2\nsave_steps: 10\n", "saves_per_epoch 2 and save_steps 10 both say when to save"},
        {"loss_watchdog_threshold: -1\n", "loss_watchdog_threshold is -1"},
        {"save_strategy: epoch\nsave_steps: 10\n", "save_strategy epoch and save_steps both say when to save"},
        {"eval_strategy: 'no'\nevals_per_epoch: 2\n", "eval_strategy no and evals_per_epoch both say when"},
        {"eval_strategy: 'no'\nval_set_size: 0.1\nearly_stopping_patience: 2\n", "eval_strategy no, and "
                                                                                  "early_stopping_patience compares"},
        {"cosine_min_lr_ratio: 2\n", "cosine_min_lr_ratio is 2; use a fraction"},
        {"adapter: lora\nloraplus_lr_ratio: -1\n", "loraplus_lr_ratio is -1; use a ratio above 0"},
        {"neftune_noise_alpha: -1\n", "neftune_noise_alpha is -1; use 0 (off) or a positive scale"},
        {"early_stopping_patience: 2\n", "early_stopping_patience compares validation losses"},
        {"val_set_size: 0.1\nload_best_model_at_end: true\n", "set save_steps (or saves_per_epoch)"},
        {"val_set_size: 0.1\nearly_stopping_patience: 2\nsave_steps: 5\nzero_stage: 3\n",
         "load_best_model_at_end with zero_stage 3 is not supported yet"},
        {"val_set_size: 0.1\nearly_stopping_patience: 2\nsave_steps: 5\nzero_stage: 2\nbf16: true\n",
         "load_best_model_at_end with ZeRO and a 16-bit run's master copy is not supported yet"},
    };
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
        CHECKF(parse_config(invalid[i][0], &o, &e) == 0, "%s", e.msg);
        CHECKF(snug_run_config_validate(&o, &e) == SNUG_EINPUT && has(&e, invalid[i][1]), "%s: %s", invalid[i][0],
               e.msg);
    }
}

/* The settings a resume must keep come from the key table's flag: each once, each where its key stores it, with
 * the kind of its field; the ones recorded later carry the value an older checkpoint holds. */
static void test_fixed_settings(void) {
    snug_run_config o;
    snug_options_defaults(&o);
    CHECKF(o.fixed && o.nfixed >= 50, "%d", o.nfixed);
    int seen_r = 0, seen_alpha = 0, seen_targets = 0, seen_tp = 0;
    for (int i = 0; o.fixed && i < o.nfixed; i++) {
        const snug_fixed_setting *f = &o.fixed[i];
        for (int k = 0; k < i; k++)
            CHECKF(strcmp(o.fixed[k].name, f->name) != 0, "%s listed twice", f->name);
        if (!strcmp(f->name, "lora_r"))
            seen_r = f->kind == SNUG_SETTING_INT && f->offset == offsetof(snug_run_config, lora_r) && !f->absent;
        if (!strcmp(f->name, "lora_alpha"))
            seen_alpha = f->kind == SNUG_SETTING_REAL && f->offset == offsetof(snug_run_config, lora_alpha);
        if (!strcmp(f->name, "lora_target_modules"))
            seen_targets = f->kind == SNUG_SETTING_TEXT && f->offset == offsetof(snug_run_config, lora_target_modules);
        if (!strcmp(f->name, "tensor_parallel_size"))
            seen_tp = f->absent && !strcmp(f->absent, "1");
    }
    CHECK(seen_r && seen_alpha && seen_targets && seen_tp);
    /* the output keys are not among them: a resume may change them */
    for (int i = 0; o.fixed && i < o.nfixed; i++)
        CHECKF(strcmp(o.fixed[i].name, "max_steps") && strcmp(o.fixed[i].name, "learning_rate") &&
               strcmp(o.fixed[i].name, "save_steps"), "%s", o.fixed[i].name);
}

int main(void) {
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_defaults();
    test_axolotl_config();
    test_hf_aliases();
    test_command_line();
    test_yaml_syntax();
    test_unknown_keys();
    test_wrong_types();
    test_not_supported();
    test_levers();
    test_dataset_keys();
    test_axolotl_keys();
    test_memory_budget();
    test_datasets();
    test_validate();
    test_zero();
    test_yaml_alone_resolves();
    test_atomic();
    test_help();
    test_fixed_settings();
    for (int i = 0; i < nwritten; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", dir, written[i]);
        unlink(path);
    }
    rmdir(dir);
    return check_finish("test_options");
}
