/* test_hf_config.c: config.json parsing for Llama 3.1, Qwen2, GPT-2, Mistral, SmolLM, TinyLlama and transformers v5
 * spellings; rejection of bad configs with the key named; save -> parse round trips; parameter counts; the family
 * table's rows consistent with their schemes. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/fileio.h"
#include "model/config.h"
#include "model/family.h"
#include "model/model.h" /* snug_param_table_build */

static char tmpdir[256];

static const char *LLAMA31_8B =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
    " \"vocab_size\": 128256, \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": 128,"
    " \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-05, \"max_position_embeddings\": 131072,"
    " \"rope_theta\": 500000.0,"
    " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
    "   \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},"
    " \"attention_bias\": false, \"attention_dropout\": 0.0, \"mlp_bias\": false, \"pretraining_tp\": 1,"
    " \"tie_word_embeddings\": false, \"bos_token_id\": 128000, \"eos_token_id\": 128001,"
    " \"initializer_range\": 0.02, \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
    " \"transformers_version\": \"4.43.0.dev0\"}";

static const char *QWEN2_05B =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
    " \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 4864, \"max_position_embeddings\": 131072, \"max_window_layers\": 24,"
    " \"model_type\": \"qwen2\", \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 131072, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.40.1\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char *GPT2_124M =
    "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], \"attn_pdrop\": 0.1,"
    " \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": 50256, \"initializer_range\": 0.02,"
    " \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12,"
    " \"n_layer\": 12, \"n_positions\": 1024, \"resid_pdrop\": 0.1, \"summary_activation\": null,"
    " \"summary_first_dropout\": 0.1, \"summary_proj_to_labels\": true, \"summary_type\": \"cls_index\","
    " \"summary_use_proj\": true, \"task_specific_params\": {\"text-generation\": {\"do_sample\": true,"
    " \"max_length\": 50}}, \"vocab_size\": 50257}";

static const char *MISTRAL_7B =
    "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", \"vocab_size\": 32000,"
    " \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 8, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-05,"
    " \"max_position_embeddings\": 32768, \"rope_theta\": 10000.0, \"sliding_window\": 4096,"
    " \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2, \"torch_dtype\": \"bfloat16\"}";

/* transformers v5: dtype, rope_parameters with rope_theta inside, no top-level rope_theta. */
static const char *V5_LLAMA =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 128256,"
    " \"hidden_size\": 2048, \"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 8, \"head_dim\": 64, \"rms_norm_eps\": 1e-05, \"max_position_embeddings\": 131072,"
    " \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0,"
    "   \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},"
    " \"tie_word_embeddings\": true, \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009],"
    " \"dtype\": \"bfloat16\", \"transformers_version\": \"5.0.0\"}";

static const char *V5_DEFAULT_ROPE =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}, \"dtype\": \"float32\"}";

static const char *V5_LAYER_TYPES =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"bos_token_id\": null,"
    " \"layer_types\": [\"full_attention\", \"full_attention\"], \"sliding_window\": null,"
    " \"use_sliding_window\": false, \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}";

static const char *SMOLLM_135M =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 0, \"eos_token_id\": 0, \"hidden_act\": \"silu\", \"hidden_size\": 576,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 1536, \"max_position_embeddings\": 2048,"
    " \"model_type\": \"llama\", \"num_attention_heads\": 9, \"num_hidden_layers\": 30, \"num_key_value_heads\": 3,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null, \"rope_theta\": 10000.0,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"float32\", \"transformers_version\": \"4.40.1\","
    " \"use_cache\": true, \"vocab_size\": 49152}";

static const char *TINYLLAMA =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 5632,"
    " \"max_position_embeddings\": 2048, \"model_type\": \"llama\", \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 22, \"num_key_value_heads\": 4, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"float32\","
    " \"transformers_version\": \"4.31.0.dev0\", \"use_cache\": true, \"vocab_size\": 32000}";

/* A small llama with the legacy rope_scaling.type spelling and biases on. */
static const char *LEGACY_LINEAR =
    "{\"model_type\": \"llama\", \"vocab_size\": 100, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"attention_bias\": true, \"mlp_bias\": true,"
    " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}, \"pad_token_id\": 5}";

/* ---------------------------------------------------------------------------------------------------------------- */

static int same_config(const snug_model_config *a, const snug_model_config *b) {
    return a->arch == b->arch && strcmp(a->model_type, b->model_type) == 0 &&
           strcmp(a->architecture, b->architecture) == 0 && a->vocab_size == b->vocab_size &&
           a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
           a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_kv_head == b->n_kv_head &&
           a->head_dim == b->head_dim && a->max_position == b->max_position && a->norm_eps == b->norm_eps &&
           a->qkv_bias == b->qkv_bias && a->o_bias == b->o_bias && a->mlp_bias == b->mlp_bias &&
           a->tie_embeddings == b->tie_embeddings && a->rope_theta == b->rope_theta && a->rope_type == b->rope_type &&
           a->rope_factor == b->rope_factor && a->rope_low_freq_factor == b->rope_low_freq_factor &&
           a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_position == b->rope_original_max_position && a->bos_token_id == b->bos_token_id &&
           a->eos_token_id == b->eos_token_id && a->pad_token_id == b->pad_token_id &&
           strcmp(a->torch_dtype, b->torch_dtype) == 0 && a->initializer_range == b->initializer_range &&
           a->sliding_window == b->sliding_window && !memcmp(a->layer_sliding, b->layer_sliding, (size_t)a->n_layer);
}

/* Parses text, saves it, loads the saved file and checks nothing changed. Returns the parsed config. */
static snug_model_config parse_ok(int line, const char *name, const char *text) {
    snug_model_config c, back;
    snug_error e = {0};
    memset(&c, 0, sizeof c);
    int rc = snug_model_config_parse(&c, text, name, &e);
    CHECKF(rc == 0, "line %d: %s: %s", line, name, e.msg);
    if (rc)
        return c;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    CHECKF(snug_model_config_save(&c, path, &e) == 0, "line %d: save: %s", line, e.msg);
    rc = snug_model_config_load(&back, path, &e);
    CHECKF(rc == 0, "line %d: reload: %s", line, e.msg);
    CHECKF(rc == 0 && same_config(&c, &back), "line %d: %s changed on save -> load", line, name);
    unlink(path);
    return c;
}
#define PARSE_OK(name, text) parse_ok(__LINE__, name, text)

static void expect_bad(int line, const char *text, const char *needle1, const char *needle2) {
    snug_model_config c;
    snug_error e = {0};
    int rc = snug_model_config_parse(&c, text, "bad/config.json", &e);
    CHECKF(rc == SNUG_EINPUT && e.code == SNUG_EINPUT, "line %d: rc %d (%s)", line, rc, e.msg);
    CHECKF(strstr(e.msg, "bad/config.json") != NULL, "line %d: message lacks the file: %s", line, e.msg);
    CHECKF(strstr(e.msg, needle1) != NULL, "line %d: message lacks \"%s\": %s", line, needle1, e.msg);
    CHECKF(!needle2 || strstr(e.msg, needle2) != NULL, "line %d: message lacks \"%s\": %s", line, needle2, e.msg);
}
#define EXPECT_BAD(text, n1, n2) expect_bad(__LINE__, text, n1, n2)

/* A copy of text with the first occurrence of `from` replaced by `to`. */
static char *edit(const char *text, const char *from, const char *to) {
    const char *p = strstr(text, from);
    if (!p) {
        fprintf(stderr, "edit: \"%s\" not found\n", from);
        exit(1);
    }
    size_t n = strlen(text) - strlen(from) + strlen(to);
    char *out = malloc(n + 1);
    snprintf(out, n + 1, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
    return out;
}

/* ---------------------------------------------------------------------------------------------------------------- */

static void test_known_models(void) {
    snug_model_config c = PARSE_OK("llama31", LLAMA31_8B);
    CHECK(c.arch == SNUG_ARCH_LLAMA && strcmp(c.model_type, "llama") == 0);
    CHECK(strcmp(c.architecture, "LlamaForCausalLM") == 0);
    CHECK(c.vocab_size == 128256 && c.hidden_size == 4096 && c.intermediate_size == 14336 && c.n_layer == 32);
    CHECK(c.n_head == 32 && c.n_kv_head == 8 && c.head_dim == 128 && c.max_position == 131072);
    CHECK(c.norm_eps == 1e-5f && c.rope_theta == 500000.0 && c.rope_type == SNUG_ROPE_LLAMA3);
    CHECK(c.rope_factor == 8.0 && c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0);
    CHECK(c.rope_original_max_position == 8192);
    CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.tie_embeddings);
    CHECK(c.bos_token_id == 128000 && c.eos_token_id == 128001 && c.pad_token_id == -1);
    CHECK(strcmp(c.torch_dtype, "bfloat16") == 0 && c.initializer_range == 0.02f);
    CHECKF(snug_model_config_nparams(&c) == 8030261248LL, "%lld", snug_model_config_nparams(&c));

    char *instruct = edit(LLAMA31_8B, "\"eos_token_id\": 128001", "\"eos_token_id\": [128001, 128008, 128009]");
    c = PARSE_OK("llama31-instruct", instruct);
    CHECK(c.eos_token_id == 128001);
    free(instruct);

    c = PARSE_OK("qwen2", QWEN2_05B);
    CHECK(c.arch == SNUG_ARCH_LLAMA && strcmp(c.model_type, "qwen2") == 0);
    CHECK(c.hidden_size == 896 && c.n_head == 14 && c.n_kv_head == 2 && c.head_dim == 64 && c.n_layer == 24);
    CHECK(c.qkv_bias && !c.o_bias && !c.mlp_bias && c.tie_embeddings);
    CHECK(c.norm_eps == 1e-6f && c.rope_theta == 1e6 && c.rope_type == SNUG_ROPE_DEFAULT);
    CHECK(c.bos_token_id == 151643 && c.eos_token_id == 151643);
    /* 494M: embed 136M (tied) + 24 layers */
    CHECKF(snug_model_config_nparams(&c) == 494032768LL, "%lld", snug_model_config_nparams(&c));

    c = PARSE_OK("gpt2", GPT2_124M);
    CHECK(c.arch == SNUG_ARCH_GPT2 && strcmp(c.architecture, "GPT2LMHeadModel") == 0);
    CHECK(c.vocab_size == 50257 && c.hidden_size == 768 && c.n_head == 12 && c.n_kv_head == 12 && c.head_dim == 64);
    CHECK(c.intermediate_size == 3072 && c.max_position == 1024 && c.n_layer == 12 && c.norm_eps == 1e-5f);
    CHECK(c.qkv_bias && c.o_bias && c.mlp_bias && c.tie_embeddings);
    CHECK(c.bos_token_id == 50256 && c.eos_token_id == 50256 && c.torch_dtype[0] == '\0');
    CHECKF(snug_model_config_nparams(&c) == 124439808LL, "%lld", snug_model_config_nparams(&c));

    char *inner = edit(GPT2_124M, "\"n_layer\": 12", "\"n_layer\": 12, \"n_inner\": 1000, "
                                                      "\"activation_function\": \"gelu_pytorch_tanh\"");
    c = PARSE_OK("gpt2-inner", inner);
    CHECK(c.intermediate_size == 1000);
    free(inner);

    c = PARSE_OK("mistral", MISTRAL_7B);
    CHECK(c.arch == SNUG_ARCH_LLAMA && strcmp(c.model_type, "mistral") == 0);
    CHECK(c.n_kv_head == 8 && c.head_dim == 128 && c.rope_theta == 10000.0 && c.max_position == 32768);
    CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.tie_embeddings && c.bos_token_id == 1 && c.eos_token_id == 2);
    CHECKF(snug_model_config_nparams(&c) == 7241732096LL, "%lld", snug_model_config_nparams(&c));

    c = PARSE_OK("v5", V5_LLAMA);
    CHECK(strcmp(c.torch_dtype, "bfloat16") == 0 && c.rope_theta == 500000.0 && c.rope_type == SNUG_ROPE_LLAMA3);
    CHECK(c.rope_factor == 32.0 && c.rope_original_max_position == 8192 && c.eos_token_id == 128001);
    CHECK(c.tie_embeddings && c.head_dim == 64);
    CHECKF(snug_model_config_nparams(&c) == 1235814400LL, "%lld", snug_model_config_nparams(&c)); /* Llama-3.2-1B */

    c = PARSE_OK("v5-default", V5_DEFAULT_ROPE);
    CHECK(c.rope_theta == 1e6 && c.rope_type == SNUG_ROPE_DEFAULT && strcmp(c.torch_dtype, "float32") == 0);
    CHECK(strcmp(c.architecture, "Qwen2ForCausalLM") == 0 && c.qkv_bias && !c.tie_embeddings);
    CHECK(c.max_position == 32768 && c.norm_eps == 1e-6f && c.bos_token_id == -1 && c.initializer_range == 0.02f);

    c = PARSE_OK("v5-layer-types", V5_LAYER_TYPES);
    CHECK(c.rope_theta == 10000.0 && c.bos_token_id == -1 && c.n_layer == 2);

    c = PARSE_OK("smollm", SMOLLM_135M);
    CHECK(c.head_dim == 64 && c.n_kv_head == 3 && c.tie_embeddings && c.bos_token_id == 0);
    CHECKF(snug_model_config_nparams(&c) == 134515008LL, "%lld", snug_model_config_nparams(&c));

    c = PARSE_OK("tinyllama", TINYLLAMA);
    CHECK(c.rope_theta == 10000.0 && c.rope_type == SNUG_ROPE_DEFAULT && c.n_kv_head == 4);
    CHECKF(snug_model_config_nparams(&c) == 1100048384LL, "%lld", snug_model_config_nparams(&c));

    c = PARSE_OK("legacy", LEGACY_LINEAR);
    CHECK(c.rope_type == SNUG_ROPE_LINEAR && c.rope_factor == 2.0 && c.qkv_bias && c.o_bias && c.mlp_bias);
    CHECK(c.n_kv_head == 4 && c.head_dim == 8 && c.max_position == 2048 && c.pad_token_id == 5);
    CHECK(strcmp(c.architecture, "LlamaForCausalLM") == 0);
    /* embed 3200 + head 3200 + norm 32 + 2 * (64 norms + 4*1024 attn + 6144 mlp + 96+32 attn bias + 160 mlp bias) */
    CHECKF(snug_model_config_nparams(&c) == 3200 * 2 + 32 + 2 * (64 + 4096 + 6144 + 128 + 160),
           "%lld", snug_model_config_nparams(&c));
}

static void test_bad_configs(void) {
    char *t;
    t = edit(TINYLLAMA, "\"hidden_size\": 2048", "\"hidden_size\": 2050");
    EXPECT_BAD(t, "num_attention_heads", "hidden_size");
    free(t);
    t = edit(TINYLLAMA, "\"num_key_value_heads\": 4", "\"num_key_value_heads\": 5");
    EXPECT_BAD(t, "num_key_value_heads", NULL);
    free(t);
    t = edit(TINYLLAMA, "\"hidden_size\": 2048,", "");
    EXPECT_BAD(t, "\"hidden_size\"", "missing");
    free(t);
    t = edit(TINYLLAMA, "\"num_hidden_layers\": 22", "\"num_hidden_layers\": \"22\"");
    EXPECT_BAD(t, "\"num_hidden_layers\"", "expected an integer");
    free(t);
    t = edit(TINYLLAMA, "\"num_hidden_layers\": 22", "\"num_hidden_layers\": 0");
    EXPECT_BAD(t, "num_hidden_layers", "positive");
    free(t);
    t = edit(TINYLLAMA, "\"model_type\": \"llama\"", "\"model_type\": \"gemma\"");
    EXPECT_BAD(t, "model_type", "gemma");
    free(t);
    t = edit(TINYLLAMA, "\"model_type\": \"llama\",", "");
    EXPECT_BAD(t, "model_type", "missing");
    free(t);
    t = edit(LLAMA31_8B, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"");
    EXPECT_BAD(t, "rope_scaling.rope_type", "yarn");
    free(t);
    t = edit(LEGACY_LINEAR, "\"type\": \"linear\"", "\"type\": \"dynamic\"");
    EXPECT_BAD(t, "rope_scaling.type", "not support");
    free(t);
    t = edit(V5_LLAMA, "\"rope_type\": \"llama3\"", "\"rope_type\": \"longrope\"");
    EXPECT_BAD(t, "rope_parameters.rope_type", "longrope");
    free(t);
    t = edit(LLAMA31_8B, "\"factor\": 8.0, ", "");
    EXPECT_BAD(t, "rope_scaling.factor", "missing");
    free(t);
    t = edit(LLAMA31_8B, "\"rope_type\": \"llama3\", ", "");
    EXPECT_BAD(t, "rope_scaling", "rope_type");
    free(t);
    t = edit(LLAMA31_8B, "\"rope_theta\": 500000.0", "\"rope_theta\": \"big\"");
    EXPECT_BAD(t, "\"rope_theta\"", "number");
    free(t);
    t = edit(LLAMA31_8B, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": \"no\"");
    EXPECT_BAD(t, "tie_word_embeddings", "true or false");
    free(t);
    t = edit(LLAMA31_8B, "\"eos_token_id\": 128001", "\"eos_token_id\": \"</s>\"");
    EXPECT_BAD(t, "eos_token_id", "integer");
    free(t);
    t = edit(LLAMA31_8B, "\"head_dim\": 128", "\"head_dim\": 127");
    EXPECT_BAD(t, "head_dim", "even");
    free(t);
    t = edit(LLAMA31_8B, "\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": 16");
    EXPECT_BAD(t, "torch_dtype", "string");
    free(t);
    t = edit(LLAMA31_8B, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
    EXPECT_BAD(t, "hidden_act", "gelu");
    free(t);
    t = edit(MISTRAL_7B, "\"sliding_window\": 4096", "\"sliding_window\": 0");
    EXPECT_BAD(t, "sliding_window", "positive");
    free(t);
    t = edit(V5_DEFAULT_ROPE, "\"dtype\"", "\"use_sliding_window\": true, \"layer_types\": [\"full_attention\"], \"dtype\"");
    EXPECT_BAD(t, "layer_types", "num_hidden_layers");
    free(t);
    t = edit(V5_DEFAULT_ROPE, "\"dtype\"", "\"layer_types\": [\"full_attention\", \"chunked_attention\"], \"dtype\"");
    EXPECT_BAD(t, "layer_types[1]", "chunked_attention");
    free(t);
    t = edit(SMOLLM_135M, "\"attention_bias\"", "\"layer_types\": [\"sliding_attention\"], \"attention_bias\"");
    EXPECT_BAD(t, "layer_types[0]", "full_attention");
    free(t);
    t = edit(GPT2_124M, "\"activation_function\": \"gelu_new\"", "\"activation_function\": \"relu\"");
    EXPECT_BAD(t, "activation_function", "relu");
    free(t);
    t = edit(GPT2_124M, "\"n_head\": 12", "\"n_head\": 7");
    EXPECT_BAD(t, "n_head", "n_embd");
    free(t);
    t = edit(GPT2_124M, "\"n_embd\": 768,", "");
    EXPECT_BAD(t, "\"n_embd\"", "missing");
    free(t);
    t = edit(GPT2_124M, "\"model_type\": \"gpt2\"", "\"model_type\": \"gpt2\", \"tie_word_embeddings\": false");
    EXPECT_BAD(t, "tie_word_embeddings", NULL);
    free(t);
    EXPECT_BAD("{\"model_type\": \"llama\", ", "invalid JSON", NULL);
    EXPECT_BAD("[1, 2]", "object", NULL);
    EXPECT_BAD("{\"model_type\": 3}", "model_type", "string");
}

/* transformers writes integers beyond 64 bits into configs (model_max_length = int(1e30)): in a key snug ignores they
 * are accepted and every other integer stays exact; in a key snug needs they are an error that names the key. */
static void test_huge_numbers(void) {
    char *t = edit(TINYLLAMA, "\"hidden_act\"", "\"model_max_length\": 1000000000000000019884624838656, \"big\": "
                   "[-99999999999999999999999, 1e400, 9223372036854775807], \"hidden_act\"");
    snug_model_config c = PARSE_OK("huge-unused", t);
    CHECK(c.hidden_size == 2048 && c.vocab_size == 32000 && c.eos_token_id == 2 && c.n_layer == 22);
    free(t);
    t = edit(TINYLLAMA, "\"hidden_size\": 2048", "\"hidden_size\": 1000000000000000019884624838656");
    EXPECT_BAD(t, "\"hidden_size\" is 1e+30", "outside the range");
    free(t);
    t = edit(TINYLLAMA, "\"num_hidden_layers\": 22", "\"num_hidden_layers\": -99999999999999999999999");
    EXPECT_BAD(t, "\"num_hidden_layers\" is -1e+23", "outside the range");
    free(t);
    t = edit(TINYLLAMA, "\"eos_token_id\": 2", "\"eos_token_id\": [2, 99999999999999999999999]");
    EXPECT_BAD(t, "\"eos_token_id\" is 1e+23", "outside the range");
    free(t);
    t = edit(TINYLLAMA, "\"vocab_size\": 32000", "\"vocab_size\": 1e400");
    EXPECT_BAD(t, "\"vocab_size\"", "outside the range");
    free(t);
    /* an error after a huge number is placed where it is in the file */
    EXPECT_BAD("{\"model_max_length\": 1000000000000000019884624838656, \"model_type\": }", "bad/config.json:1:69:",
               "invalid JSON");
}

/* Which layers slide, as transformers' Mistral and Qwen2 decide it (configuration_qwen2.py: sliding_window only
 * with use_sliding_window; layer_types, else the layers from max_window_layers on; Mistral: every layer). */
static void test_sliding(void) {
    snug_model_config c = PARSE_OK("mistral", MISTRAL_7B);
    CHECK(c.sliding_window == 4096 && snug_layer_window(&c, 0) == 4096 && snug_layer_window(&c, 31) == 4096);
    char *t = edit(MISTRAL_7B, "\"sliding_window\": 4096", "\"sliding_window\": null");
    c = PARSE_OK("mistral null", t);
    CHECK(c.sliding_window == 0 && snug_layer_window(&c, 0) == 0);
    free(t);
    t = edit(MISTRAL_7B, "\"sliding_window\": 4096,", ""); /* absent: transformers' default, 4096 */
    c = PARSE_OK("mistral absent", t);
    CHECK(c.sliding_window == 4096 && snug_layer_window(&c, 5) == 4096);
    free(t);
    c = PARSE_OK("qwen2", QWEN2_05B); /* use_sliding_window false */
    CHECK(c.sliding_window == 0 && snug_layer_window(&c, 23) == 0);
    char *u = edit(QWEN2_05B, "\"use_sliding_window\": false", "\"use_sliding_window\": true");
    t = edit(u, "\"max_window_layers\": 24", "\"max_window_layers\": 20");
    c = PARSE_OK("qwen2 sliding", t);
    CHECK(c.sliding_window == 131072 && snug_layer_window(&c, 19) == 0 && snug_layer_window(&c, 20) == 131072 &&
          snug_layer_window(&c, 23) == 131072);
    free(t);
    c = PARSE_OK("qwen2 sliding, max_window_layers = L", u); /* no layer slides */
    CHECK(snug_layer_window(&c, 23) == 0);
    free(u);
    t = edit(V5_DEFAULT_ROPE, "\"dtype\"", "\"use_sliding_window\": true, \"sliding_window\": 16, \"layer_types\": "
             "[\"sliding_attention\", \"full_attention\"], \"dtype\"");
    c = PARSE_OK("qwen2 layer_types", t);
    CHECK(snug_layer_window(&c, 0) == 16 && snug_layer_window(&c, 1) == 0);
    free(t);
    t = edit(V5_DEFAULT_ROPE, "\"dtype\"", "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"dtype\"");
    c = PARSE_OK("qwen2 layer_types without use_sliding_window", t);
    CHECK(c.sliding_window == 0 && snug_layer_window(&c, 0) == 0);
    free(t);
}

/* Saving a config read from a file keeps the file: every key and value (unknown keys, sliding_window, a list of eos
 * ids) but those training changed. */
static void test_kept_keys(void) {
    char base[512], out[512];
    snprintf(base, sizeof base, "%s/base.json", tmpdir);
    snprintf(out, sizeof out, "%s/config.json", tmpdir);
    char *t = edit(V5_LLAMA, "\"dtype\"", "\"sliding_window\": 24, \"some_future_key\": {\"a\": [1, 2]}, \"dtype\"");
    snug_error e = {0};
    CHECK(snug_write_file_atomic(base, t, strlen(t), &e) == 0);
    free(t);
    snug_model_config c;
    CHECK(snug_model_config_load(&c, base, &e) == 0 && !strcmp(c.json_path, base));
    CHECK(snug_model_config_save(&c, out, &e) == 0); /* unchanged: the same keys and values */
    json_error_t je;
    json_t *a = json_load_file(base, 0, &je), *b = json_load_file(out, 0, &je);
    CHECK(a && b && json_equal(a, b));
    json_decref(b);
    c.vocab_size = 128300; /* resized, saved as float32, a pad token set */
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "float32");
    c.pad_token_id = 128299;
    CHECK(snug_model_config_save(&c, out, &e) == 0);
    b = json_load_file(out, 0, &je);
    CHECK(b && json_integer_value(json_object_get(b, "vocab_size")) == 128300);
    CHECK(b && !strcmp(json_string_value(json_object_get(b, "dtype")), "float32") && !json_object_get(b, "torch_dtype"));
    CHECK(b && json_integer_value(json_object_get(b, "pad_token_id")) == 128299);
    const char *key;
    json_t *v;
    json_object_foreach(a, key, v) {
        if (strcmp(key, "vocab_size") && strcmp(key, "dtype"))
            CHECKF(json_equal(v, json_object_get(b, key)), "key %s changed on save", key);
    }
    CHECK(b && json_object_size(b) == json_object_size(a) + 1); /* pad_token_id */
    json_decref(a), json_decref(b);
    unlink(base), unlink(out);
}

static void test_files(void) {
    snug_model_config c, back;
    snug_error e = {0};
    char path[512], gen[512];
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    snprintf(gen, sizeof gen, "%s/generation_config.json", tmpdir);

    CHECK(snug_model_config_load(&c, path, &e) == SNUG_EIO && strstr(e.msg, path));

    /* The saved GPT-2 config uses GPT-2's key names and v4 spellings. */
    CHECK(snug_model_config_parse(&c, GPT2_124M, "gpt2", &e) == 0);
    CHECK(snug_model_config_save(&c, path, &e) == 0);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    CHECK(j && json_is_null(json_object_get(j, "n_inner")));
    CHECK(j && json_integer_value(json_object_get(j, "n_ctx")) == 1024);
    CHECK(j && strcmp(json_string_value(json_object_get(j, "activation_function")), "gelu_new") == 0);
    CHECK(j && json_is_true(json_object_get(j, "tie_word_embeddings")));
    CHECK(j && strcmp(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                      "GPT2LMHeadModel") == 0);
    CHECK(j && json_real_value(json_object_get(j, "layer_norm_epsilon")) == 1e-5);
    CHECK(j && !json_object_get(j, "torch_dtype"));
    json_decref(j);

    /* Llama: rope_scaling with rope_type, rope_theta at the top, torch_dtype. */
    CHECK(snug_model_config_parse(&c, V5_LLAMA, "v5", &e) == 0);
    CHECK(snug_model_config_save(&c, path, &e) == 0);
    j = json_load_file(path, 0, &je);
    json_t *rs = j ? json_object_get(j, "rope_scaling") : NULL;
    CHECK(rs && strcmp(json_string_value(json_object_get(rs, "rope_type")), "llama3") == 0);
    CHECK(j && json_real_value(json_object_get(j, "rope_theta")) == 500000.0);
    CHECK(j && strcmp(json_string_value(json_object_get(j, "torch_dtype")), "bfloat16") == 0);
    CHECK(j && !json_object_get(j, "dtype") && !json_object_get(j, "rope_parameters"));
    CHECK(j && json_real_value(json_object_get(j, "rms_norm_eps")) == 1e-5);
    CHECK(j && json_real_value(json_object_get(j, "initializer_range")) == 0.02);
    json_decref(j);
    char *text;
    CHECK(snug_read_file(path, &text, NULL, &e) == 0);
    CHECK(strstr(text, "\n  \"model_type\": \"llama\",\n") != NULL); /* pretty-printed */
    free(text);

    /* Qwen2 keeps its full attention explicit. */
    CHECK(snug_model_config_parse(&c, QWEN2_05B, "qwen2", &e) == 0);
    CHECK(snug_model_config_save(&c, path, &e) == 0);
    j = json_load_file(path, 0, &je);
    CHECK(j && json_is_false(json_object_get(j, "use_sliding_window")));
    CHECK(j && json_is_null(json_object_get(j, "rope_scaling")));
    json_decref(j);

    /* generation_config.json: only the ids present */
    CHECK(snug_generation_config_save(&c, gen, &e) == 0);
    j = json_load_file(gen, 0, &je);
    CHECK(j && json_integer_value(json_object_get(j, "bos_token_id")) == 151643);
    CHECK(j && json_integer_value(json_object_get(j, "eos_token_id")) == 151643);
    CHECK(j && json_is_string(json_object_get(j, "transformers_version")));
    json_decref(j);
    c.bos_token_id = -1;
    CHECK(snug_generation_config_save(&c, gen, &e) == 0);
    j = json_load_file(gen, 0, &je);
    CHECK(j && !json_object_get(j, "bos_token_id") && json_object_get(j, "eos_token_id"));
    json_decref(j);

    /* A config built in code (a preset) is validated the same way, and refused on save when inconsistent. */
    snug_model_config p = {.arch = SNUG_ARCH_LLAMA, .model_type = "llama", .vocab_size = 256, .hidden_size = 64,
                           .intermediate_size = 128, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                           .max_position = 256, .norm_eps = 1e-5f, .tie_embeddings = 1, .rope_theta = 10000.0,
                           .bos_token_id = -1, .eos_token_id = 1, .pad_token_id = -1, .initializer_range = 0.02f};
    CHECKF(snug_model_config_validate(&p, "preset", &e) == 0, "%s", e.msg);
    CHECK(snug_model_config_save(&p, path, &e) == 0 && snug_model_config_load(&back, path, &e) == 0);
    CHECK(same_config(&p, &back) == 0 && strcmp(back.architecture, "LlamaForCausalLM") == 0);
    strcpy(p.architecture, "LlamaForCausalLM");
    CHECK(same_config(&p, &back));
    p.n_kv_head = 3;
    CHECK(snug_model_config_validate(&p, "preset", &e) == SNUG_EINPUT && strstr(e.msg, "num_key_value_heads"));
    p.n_kv_head = 2;
    strcpy(p.model_type, "mistral");
    p.qkv_bias = 1;
    CHECK(snug_model_config_save(&p, path, &e) == SNUG_EINPUT && strstr(e.msg, "mistral"));

    unlink(gen);
    unlink(path);
}

/* head_dim is bounded by what every backend's attention runs (SNUG_MAX_HEAD_DIM, the CUDA kernels' 256): the bound
 * itself is accepted, anything above it refused with config.json, the value, the bound and the fix named, whether
 * head_dim is given, derived (hidden_size / heads) or set in code. */
static void test_head_dim_bound(void) {
    CHECK(SNUG_MAX_HEAD_DIM == 256);
    char *ok = edit(V5_LLAMA, "\"head_dim\": 64", "\"head_dim\": 256");
    snug_model_config c = PARSE_OK("head_dim 256", ok);
    CHECKF(c.head_dim == 256, "head_dim %d", c.head_dim);
    char *bad = edit(V5_LLAMA, "\"head_dim\": 64", "\"head_dim\": 258");
    EXPECT_BAD(bad, "head_dim is 258", "at most 256");
    EXPECT_BAD(bad, "head_dim is 258", "set head_dim to at most 256");
    free(ok);
    free(bad);

    /* derived: Mistral's 4096 wide over 16 heads is 256, over 8 heads 512 */
    ok = edit(MISTRAL_7B, "\"num_attention_heads\": 32", "\"num_attention_heads\": 16");
    c = PARSE_OK("mistral 16 heads", ok);
    CHECKF(c.head_dim == 256, "head_dim %d", c.head_dim);
    bad = edit(MISTRAL_7B, "\"num_attention_heads\": 32", "\"num_attention_heads\": 8");
    EXPECT_BAD(bad, "head_dim is 512", "num_attention_heads");
    free(ok);
    free(bad);

    /* GPT-2: n_embd / n_head; 516 / 2 = 258 */
    char *g = edit(GPT2_124M, "\"n_embd\": 768, \"n_head\": 12", "\"n_embd\": 512, \"n_head\": 2");
    c = PARSE_OK("gpt2 head_dim 256", g);
    CHECKF(c.head_dim == 256, "head_dim %d", c.head_dim);
    free(g);
    g = edit(GPT2_124M, "\"n_embd\": 768, \"n_head\": 12", "\"n_embd\": 516, \"n_head\": 2");
    EXPECT_BAD(g, "head_dim (n_embd / n_head) is 258", "raise n_head");
    free(g);

    /* a config built in code (a preset, a custom shape) goes through the same check */
    snug_model_config p = {.arch = SNUG_ARCH_LLAMA, .model_type = "llama", .vocab_size = 256, .hidden_size = 64,
                           .intermediate_size = 128, .n_layer = 2, .n_head = 4, .n_kv_head = 2,
                           .head_dim = SNUG_MAX_HEAD_DIM, .max_position = 256, .norm_eps = 1e-5f,
                           .tie_embeddings = 1, .rope_theta = 10000.0, .bos_token_id = -1, .eos_token_id = 1,
                           .pad_token_id = -1, .initializer_range = 0.02f};
    snug_error e = {0};
    CHECKF(snug_model_config_validate(&p, "out/config.json", &e) == 0, "%s", e.msg);
    p.head_dim = SNUG_MAX_HEAD_DIM + 2;
    CHECKF(snug_model_config_validate(&p, "out/config.json", &e) == SNUG_EINPUT && strstr(e.msg, "out/config.json") &&
               strstr(e.msg, "head_dim is 258") && strstr(e.msg, "at most 256"),
           "%s", e.msg);
}

/* Every row of the family table: found by its model_type, its scheme's modules by site with the parts its block
 * computes (q, k, v; gate and up for SwiGLU, one up projection for GELU), and a small config of it, spelled as its
 * scheme spells config.json, round-trips, gets the row's block and class, and counts the parameters its table
 * lays out. */
static void test_family_table(void) {
    for (int i = 0; snug_family_at(i); i++) {
        const snug_family *f = snug_family_at(i);
        const snug_scheme *sc = snug_scheme_of(f->arch);
        CHECKF(snug_family_find(f->model_type) == f && sc, "%s: not found, or no scheme", f->model_type);
        if (!sc)
            continue;
        int parts[SNUG_NSITES] = {0}, last = 0;
        for (int k = 0; k < sc->n_modules; k++) {
            CHECKF((int)sc->modules[k].site >= last, "%s: module %s out of site order", f->model_type,
                   sc->modules[k].name);
            last = (int)sc->modules[k].site;
            parts[last] += sc->modules[k].parts;
        }
        CHECKF(parts[SNUG_SITE_QKV] == 3 && parts[SNUG_SITE_O] == 1 && parts[SNUG_SITE_PROJ] == 1 &&
                   parts[SNUG_SITE_FC] == (f->block.mlp == SNUG_MLP_SWIGLU ? 2 : 1),
               "%s: its modules' parts (%d, %d, %d, %d) do not fit its block", f->model_type, parts[0], parts[1],
               parts[2], parts[3]);
        char text[1024];
        snprintf(text, sizeof text, "{\"model_type\": \"%s\", \"vocab_size\": 100, \"%s\": 64, \"%s\": 96, "
                 "\"%s\": 2, \"%s\": 4, \"num_key_value_heads\": 4}", f->model_type, sc->k_hidden, sc->k_inner,
                 sc->k_layers, sc->k_heads);
        snug_model_config c = PARSE_OK(f->model_type, text);
        snug_block b = snug_block_of(&c);
        CHECKF(c.arch == f->arch && b.norm == f->block.norm && b.mlp == f->block.mlp && b.pos == f->block.pos &&
                   !strcmp(c.architecture, f->architecture),
               "%s: read as arch %d, class %s", f->model_type, (int)c.arch, c.architecture);
        snug_param_table t;
        snug_error e = {0};
        CHECKF(snug_param_table_build(&t, &c, &e) == 0, "%s: %s", f->model_type, e.msg);
        CHECKF((long long)t.total == snug_model_config_nparams(&c), "%s: the table holds %zu floats, nparams says "
               "%lld", f->model_type, t.total, snug_model_config_nparams(&c));
        snug_param_table_free(&t);
    }
    char list[256];
    snug_family_list(SNUG_ARCH_GPT2, list, sizeof list);
    CHECKF(!strcmp(list, "\"gpt2\""), "%s", list);
    snug_family_list(-1, list, sizeof list);
    CHECKF(!strncmp(list, "\"llama\", \"mistral\", \"qwen2\"", 27) && strstr(list, " or \""), "%s", list);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/snug_test_cfg_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_known_models();
    test_bad_configs();
    test_huge_numbers();
    test_files();
    test_sliding();
    test_kept_keys();
    test_head_dim_bound();
    test_family_table();
    CHECKF(rmdir(tmpdir) == 0, "temporary folder %s not empty", tmpdir);
    return check_finish("test_hf_config");
}
