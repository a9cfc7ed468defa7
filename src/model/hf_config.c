/* hf_config.c: reading and writing Hugging Face config.json for the families of the family table (family.c): the
 * Llama scheme (llama, mistral, qwen2; SmolLM and TinyLlama are model_type llama) and GPT-2 (see config.h). Each
 * scheme's spelling of config.json is a dialect here (parse, write, check); what differs between the families of a
 * scheme (defaults, biases, sliding-window keys) is read from their rows.
 *
 * Reading accepts the spellings of transformers v4 and v5 (torch_dtype/dtype, rope_scaling/rope_parameters with
 * rope_theta inside, rope_type/type) and takes transformers' defaults for keys that are absent. Writing uses the v4
 * spelling, which v4 and v5 both read. */
#include "model/config.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "model/family.h"

#define HF_TRANSFORMERS_VERSION "4.46.0" /* written into saved configs; any 4.x reads them */
#define REQUIRED INT_MIN                 /* default value meaning "the key must be present" */

/* Where errors point: the file name and the root object. */
typedef struct ctx {
    const char *path;
    json_t *root;
    snug_error *e;
} ctx;


static int wrong_type(const ctx *c, const char *key, const json_t *v, const char *expected) {
    if (snug_json_is_huge(v) && strstr(expected, "integer"))
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"%s\" is %g, outside the range snug supports; fix the value",
                         c->path, key, json_real_value(v));
    return snug_fail(c->e, SNUG_EINPUT, "%s: key \"%s\" is %s, expected %s; fix the value in the config", c->path,
                     key, snug_json_type_name(v), expected);
}

static int missing(const ctx *c, const char *key, const char *what) {
    return snug_fail(c->e, SNUG_EINPUT, "%s: required key \"%s\" (%s) is missing; add it, or use the config.json that "
                     "came with the model", c->path, key, what);
}

/* Reads obj[key] as an int into *out; absent or null gives dflt, or an error when dflt is REQUIRED. `shown` is the
 * key as the user reads it ("rope_scaling.factor"). */
static int get_int(const ctx *c, json_t *obj, const char *key, const char *shown, int dflt, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (dflt == REQUIRED)
            return missing(c, shown, "an integer");
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v))
        return wrong_type(c, shown, v, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < INT_MIN + 1 || x > INT_MAX)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"%s\" is %lld, outside the range snug supports; fix the value",
                         c->path, shown, (long long)x);
    *out = (int)x;
    return 0;
}

static int get_num(const ctx *c, json_t *obj, const char *key, const char *shown, int required, double dflt,
                   double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return missing(c, shown, "a number");
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v))
        return wrong_type(c, shown, v, "a number");
    *out = json_number_value(v);
    return 0;
}

static int get_bool(const ctx *c, json_t *obj, const char *key, int dflt, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return wrong_type(c, key, v, "true or false");
    *out = json_is_true(v);
    return 0;
}

/* Reads a string; absent or null gives NULL. */
static int get_str(const ctx *c, json_t *obj, const char *key, const char *shown, const char **out) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return wrong_type(c, shown, v, "a string");
    *out = json_string_value(v);
    return 0;
}

static int copy_str(const ctx *c, char *dst, size_t cap, const char *src, const char *key) {
    size_t n = strlen(src);
    if (n >= cap)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"%s\" is \"%.80s\", longer than the %zu characters snug "
                         "accepts; fix the value", c->path, key, src, cap - 1);
    memcpy(dst, src, n + 1);
    return 0;
}

/* A token id: an integer, a list of integers (the first is taken), or null/absent (-1). */
static int get_token_id(const ctx *c, const char *key, int *out) {
    json_t *v = json_object_get(c->root, key);
    *out = -1;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_is_integer(json_array_get(v, i)))
                return wrong_type(c, key, json_array_get(v, i), "an integer in the list");
        if (json_array_size(v) == 0)
            return 0;
        v = json_array_get(v, 0);
    }
    if (!json_is_integer(v))
        return wrong_type(c, key, v, "an integer or a list of integers");
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > INT_MAX)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"%s\" is %lld, not a valid token id; fix the value", c->path,
                         key, (long long)x);
    *out = (int)x;
    return 0;
}

/* RoPE: rope_theta at the top level (v4) or inside rope_parameters (v5); scaling in rope_scaling (v4) or
 * rope_parameters (v5), its kind in rope_type or the legacy type. */
static int parse_rope(snug_model_config *cfg, const ctx *c) {
    const char *rkey = "rope_scaling";
    json_t *rs = json_object_get(c->root, rkey);
    if (!rs || json_is_null(rs)) {
        rkey = "rope_parameters";
        rs = json_object_get(c->root, rkey);
    }
    if (rs && json_is_null(rs))
        rs = NULL;
    if (rs && !json_is_object(rs))
        return wrong_type(c, rkey, rs, "an object or null");
    char k[96];
    cfg->rope_theta = 10000.0;
    json_t *top_theta = json_object_get(c->root, "rope_theta");
    if (top_theta && !json_is_null(top_theta))
        SNUG_TRY(get_num(c, c->root, "rope_theta", "rope_theta", 1, 0, &cfg->rope_theta));
    else if (rs) {
        snprintf(k, sizeof k, "%s.rope_theta", rkey);
        SNUG_TRY(get_num(c, rs, "rope_theta", k, 0, 10000.0, &cfg->rope_theta));
    }
    cfg->rope_type = SNUG_ROPE_DEFAULT;
    if (!rs)
        return 0;
    const char *type;
    snprintf(k, sizeof k, "%s.rope_type", rkey);
    SNUG_TRY(get_str(c, rs, "rope_type", k, &type));
    if (!type) {
        snprintf(k, sizeof k, "%s.type", rkey);
        SNUG_TRY(get_str(c, rs, "type", k, &type));
    }
    if (!type)
        return snug_fail(c->e, SNUG_EINPUT, "%s: \"%s\" has no \"rope_type\" (or \"type\"); set it to \"default\", "
                         "\"linear\" or \"llama3\", or set %s to null", c->path, rkey, rkey);
    if (strcmp(type, "default") == 0)
        return 0;
    double f = 0;
    snprintf(k, sizeof k, "%s.factor", rkey);
    if (strcmp(type, "linear") == 0) {
        cfg->rope_type = SNUG_ROPE_LINEAR;
        SNUG_TRY(get_num(c, rs, "factor", k, 1, 0, &f));
        cfg->rope_factor = f;
        return 0;
    }
    if (strcmp(type, "llama3") == 0) {
        cfg->rope_type = SNUG_ROPE_LLAMA3;
        SNUG_TRY(get_num(c, rs, "factor", k, 1, 0, &cfg->rope_factor));
        snprintf(k, sizeof k, "%s.low_freq_factor", rkey);
        SNUG_TRY(get_num(c, rs, "low_freq_factor", k, 1, 0, &cfg->rope_low_freq_factor));
        snprintf(k, sizeof k, "%s.high_freq_factor", rkey);
        SNUG_TRY(get_num(c, rs, "high_freq_factor", k, 1, 0, &cfg->rope_high_freq_factor));
        snprintf(k, sizeof k, "%s.original_max_position_embeddings", rkey);
        return get_int(c, rs, "original_max_position_embeddings", k, REQUIRED, &cfg->rope_original_max_position);
    }
    return snug_fail(c->e, SNUG_EINPUT, "%s: key \"%s.%s\" is \"%.40s\", a RoPE scaling snug does not support; "
                     "supported: \"default\", \"linear\", \"llama3\"", c->path, rkey,
                     json_object_get(rs, "rope_type") ? "rope_type" : "type", type);
}

/* Which layers attend within a sliding window, and its width, as the family's modeling code in transformers decides
 * them (config.h): Mistral slides every layer when sliding_window is not null (absent: 4096) and ignores
 * layer_types; Qwen2 slides only when use_sliding_window, the layers layer_types names "sliding_attention" or, without
 * layer_types, those from max_window_layers (absent: 28) on. Other families attend fully. */
static int parse_sliding(snug_model_config *cfg, const ctx *c, const snug_family *f) {
    json_t *r = c->root, *lt = json_object_get(r, "layer_types"), *sw = json_object_get(r, "sliding_window");
    if (lt && json_is_null(lt))
        lt = NULL;
    if (lt && !json_is_array(lt))
        return wrong_type(c, "layer_types", lt, "a list of strings");
    for (size_t i = 0; lt && i < json_array_size(lt); i++) {
        const char *kind = json_string_value(json_array_get(lt, i));
        if (!kind || (strcmp(kind, "full_attention") != 0 && (!f->sliding || strcmp(kind, "sliding_attention") != 0)))
            return snug_fail(c->e, SNUG_EINPUT, "%s: layer_types[%zu] is \"%.40s\"; snug's %s supports \"%s\"",
                             c->path, i, kind ? kind : "?", cfg->model_type,
                             f->sliding ? "full_attention\" and \"sliding_attention" : "full_attention");
    }
    if (!f->sliding)
        return 0;
    int use = (f->sliding & SNUG_SLIDING_ALL) != 0, W = 0;
    if (f->sliding & SNUG_SLIDING_FLAG)
        SNUG_TRY(get_bool(c, r, "use_sliding_window", 0, &use));
    if (!use || (sw && json_is_null(sw)))
        return 0;
    SNUG_TRY(get_int(c, r, "sliding_window", "sliding_window", 4096, &W));
    if (W <= 0)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"sliding_window\" is %d; it must be a positive number of "
                         "tokens, or null for full attention", c->path, W);
    cfg->sliding_window = W;
    int L = cfg->n_layer < SNUG_MAX_LAYERS ? cfg->n_layer : SNUG_MAX_LAYERS; /* more is refused when validated */
    if (f->sliding & SNUG_SLIDING_ALL) {
        for (int l = 0; l < L; l++)
            cfg->layer_sliding[l] = 1;
        return 0;
    }
    if (lt) {
        if (json_array_size(lt) != (size_t)cfg->n_layer)
            return snug_fail(c->e, SNUG_EINPUT, "%s: layer_types has %zu entries but num_hidden_layers is %d; give "
                             "one per layer", c->path, json_array_size(lt), cfg->n_layer);
        int any = 0;
        for (int l = 0; l < L; l++)
            any |= cfg->layer_sliding[l] = !strcmp(json_string_value(json_array_get(lt, (size_t)l)),
                                                   "sliding_attention");
        if (!any)
            cfg->sliding_window = 0;
        return 0;
    }
    int first = 0;
    SNUG_TRY(get_int(c, r, "max_window_layers", "max_window_layers", 28, &first));
    for (int l = first < 0 ? 0 : first; l < L; l++)
        cfg->layer_sliding[l] = 1;
    if (first >= cfg->n_layer) /* no layer slides */
        cfg->sliding_window = 0;
    return 0;
}

static int parse_llama(snug_model_config *cfg, const ctx *c) {
    json_t *r = c->root;
    const char *mt = cfg->model_type;
    const snug_family *f = snug_family_find(mt);
    SNUG_TRY(get_int(c, r, "vocab_size", "vocab_size", REQUIRED, &cfg->vocab_size));
    SNUG_TRY(get_int(c, r, "hidden_size", "hidden_size", REQUIRED, &cfg->hidden_size));
    SNUG_TRY(get_int(c, r, "intermediate_size", "intermediate_size", REQUIRED, &cfg->intermediate_size));
    SNUG_TRY(get_int(c, r, "num_hidden_layers", "num_hidden_layers", REQUIRED, &cfg->n_layer));
    SNUG_TRY(get_int(c, r, "num_attention_heads", "num_attention_heads", REQUIRED, &cfg->n_head));
    /* transformers' default when the key is absent (the family's); null = heads */
    int nkv_default = f->kv_heads_default ? f->kv_heads_default : cfg->n_head;
    json_t *nkv = json_object_get(r, "num_key_value_heads");
    SNUG_TRY(get_int(c, r, "num_key_value_heads", "num_key_value_heads",
                     nkv && json_is_null(nkv) ? cfg->n_head : nkv_default, &cfg->n_kv_head));
    SNUG_TRY(get_int(c, r, "head_dim", "head_dim", 0, &cfg->head_dim));
    if (cfg->head_dim == 0) {
        if (cfg->n_head > 0 && cfg->hidden_size % cfg->n_head != 0)
            return snug_fail(c->e, SNUG_EINPUT, "%s: num_attention_heads (%d) does not divide hidden_size (%d); set "
                             "num_attention_heads to a divisor of hidden_size, or give head_dim", c->path, cfg->n_head,
                             cfg->hidden_size);
        cfg->head_dim = cfg->n_head > 0 ? cfg->hidden_size / cfg->n_head : 0;
    }
    SNUG_TRY(get_int(c, r, "max_position_embeddings", "max_position_embeddings", f->max_position_default,
                     &cfg->max_position));
    double eps = 0;
    SNUG_TRY(get_num(c, r, "rms_norm_eps", "rms_norm_eps", 0, 1e-6, &eps));
    cfg->norm_eps = (float)eps;
    const char *act;
    SNUG_TRY(get_str(c, r, "hidden_act", "hidden_act", &act));
    if (act && strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"hidden_act\" is \"%.40s\"; snug's %s MLP supports only "
                         "\"silu\"", c->path, act, mt);
    int attention_bias = 0, mlp_bias = 0;
    if (f->bias == SNUG_BIAS_KEYS) {
        SNUG_TRY(get_bool(c, r, "attention_bias", 0, &attention_bias));
        SNUG_TRY(get_bool(c, r, "mlp_bias", 0, &mlp_bias));
    }
    cfg->qkv_bias = f->bias == SNUG_BIAS_QKV || attention_bias;
    cfg->o_bias = attention_bias;
    cfg->mlp_bias = mlp_bias;
    SNUG_TRY(parse_sliding(cfg, c, f));
    SNUG_TRY(get_bool(c, r, "tie_word_embeddings", 0, &cfg->tie_embeddings));
    return parse_rope(cfg, c);
}

static int parse_gpt2(snug_model_config *cfg, const ctx *c) {
    json_t *r = c->root;
    SNUG_TRY(get_int(c, r, "vocab_size", "vocab_size", REQUIRED, &cfg->vocab_size));
    SNUG_TRY(get_int(c, r, "n_embd", "n_embd", REQUIRED, &cfg->hidden_size));
    SNUG_TRY(get_int(c, r, "n_layer", "n_layer", REQUIRED, &cfg->n_layer));
    SNUG_TRY(get_int(c, r, "n_head", "n_head", REQUIRED, &cfg->n_head));
    SNUG_TRY(get_int(c, r, "n_positions", "n_positions", 1024, &cfg->max_position));
    SNUG_TRY(get_int(c, r, "n_inner", "n_inner", 0, &cfg->intermediate_size));
    if (cfg->intermediate_size == 0)
        cfg->intermediate_size = 4 * cfg->hidden_size;
    if (cfg->n_head > 0 && cfg->hidden_size % cfg->n_head != 0)
        return snug_fail(c->e, SNUG_EINPUT, "%s: n_head (%d) does not divide n_embd (%d); set n_head to a divisor of "
                         "n_embd", c->path, cfg->n_head, cfg->hidden_size);
    cfg->n_kv_head = cfg->n_head;
    cfg->head_dim = cfg->n_head > 0 ? cfg->hidden_size / cfg->n_head : 0;
    double eps = 0;
    SNUG_TRY(get_num(c, r, "layer_norm_epsilon", "layer_norm_epsilon", 0, 1e-5, &eps));
    cfg->norm_eps = (float)eps;
    const char *act;
    SNUG_TRY(get_str(c, r, "activation_function", "activation_function", &act));
    if (act && strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"activation_function\" is \"%.40s\"; snug's GPT-2 supports the "
                         "tanh GELU only (\"gelu_new\" or \"gelu_pytorch_tanh\")", c->path, act);
    int flag = 0;
    SNUG_TRY(get_bool(c, r, "tie_word_embeddings", 1, &flag));
    if (!flag)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"tie_word_embeddings\" is false; snug's GPT-2 always ties the "
                         "output head to wte: remove the key or set it to true", c->path);
    SNUG_TRY(get_bool(c, r, "scale_attn_weights", 1, &flag));
    if (!flag)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"scale_attn_weights\" is false; snug always scales attention by "
                         "1/sqrt(head_dim): set it to true", c->path);
    SNUG_TRY(get_bool(c, r, "scale_attn_by_inverse_layer_idx", 0, &flag));
    if (flag)
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"scale_attn_by_inverse_layer_idx\" is true; snug does not "
                         "support it: set it to false", c->path);
    cfg->qkv_bias = cfg->o_bias = cfg->mlp_bias = 1;
    cfg->tie_embeddings = 1;
    cfg->rope_theta = 10000.0; /* unused: GPT-2 has learned positions */
    cfg->rope_type = SNUG_ROPE_DEFAULT;
    return 0;
}

/* How each scheme spells config.json: read into a config, written from one, and checked past the checks common to
 * all (the sizes, eps, token ids). */
typedef struct dialect {
    int (*parse)(snug_model_config *cfg, const ctx *c);
    json_t *(*to_json)(const snug_model_config *cfg);
    int (*check)(const snug_model_config *cfg, const char *path, snug_error *e);
} dialect;
static const dialect dialects[SNUG_NARCH];

static int parse_root(snug_model_config *cfg, const ctx *c) {
    json_t *r = c->root;
    const char *mt;
    SNUG_TRY(get_str(c, r, "model_type", "model_type", &mt));
    char list[256];
    if (!mt) {
        snug_family_list(-1, list, sizeof list);
        return missing(c, "model_type", list);
    }
    const snug_family *f = snug_family_find(mt);
    if (!f) {
        size_t len = 0;
        for (int i = 0; snug_family_at(i) && len < sizeof list; i++) {
            const snug_family *g = snug_family_at(i);
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s%s%s%s", i ? ", " : "", g->model_type,
                                    g->aka ? " (also " : "", g->aka ? g->aka : "", g->aka ? ")" : "");
        }
        return snug_fail(c->e, SNUG_EINPUT, "%s: key \"model_type\" is \"%.40s\", an architecture snug does not "
                         "support; supported: %s", c->path, mt, list);
    }
    SNUG_TRY(copy_str(c, cfg->model_type, sizeof cfg->model_type, mt, "model_type"));

    json_t *archs = json_object_get(r, "architectures");
    const char *arch = f->architecture;
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs))
            return wrong_type(c, "architectures", archs, "a list of strings");
        if (json_array_size(archs) > 0) {
            json_t *a0 = json_array_get(archs, 0);
            if (!json_is_string(a0))
                return wrong_type(c, "architectures[0]", a0, "a string");
            arch = json_string_value(a0);
        }
    }
    SNUG_TRY(copy_str(c, cfg->architecture, sizeof cfg->architecture, arch, "architectures[0]"));

    cfg->arch = f->arch;
    SNUG_TRY(dialects[f->arch].parse(cfg, c));

    SNUG_TRY(get_token_id(c, "bos_token_id", &cfg->bos_token_id));
    SNUG_TRY(get_token_id(c, "eos_token_id", &cfg->eos_token_id));
    SNUG_TRY(get_token_id(c, "pad_token_id", &cfg->pad_token_id));
    double ir = 0;
    SNUG_TRY(get_num(c, r, "initializer_range", "initializer_range", 0, 0.02, &ir));
    cfg->initializer_range = (float)ir;
    const char *dt;
    SNUG_TRY(get_str(c, r, "torch_dtype", "torch_dtype", &dt));
    if (!dt)
        SNUG_TRY(get_str(c, r, "dtype", "dtype", &dt));
    if (dt)
        SNUG_TRY(copy_str(c, cfg->torch_dtype, sizeof cfg->torch_dtype, dt,
                          json_object_get(r, "torch_dtype") ? "torch_dtype" : "dtype"));
    return snug_model_config_validate(cfg, c->path, c->e);
}

int snug_model_config_parse(snug_model_config *cfg, const char *json_text, const char *path, snug_error *e) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t je;
    json_t *root = snug_json_loadb(json_text, strlen(json_text), 0, &je);
    if (!root)
        return snug_fail(e, SNUG_EINPUT, "%s:%d:%d: invalid JSON: %s; fix the file or re-download it", path, je.line,
                         je.column, je.text);
    int rc;
    if (!json_is_object(root)) {
        rc = snug_fail(e, SNUG_EINPUT, "%s: the top level is %s, expected an object; this is not a config.json", path,
                       snug_json_type_name(root));
    } else {
        ctx c = {.path = path, .root = root, .e = e};
        rc = parse_root(cfg, &c);
    }
    json_decref(root);
    return rc;
}

int snug_model_config_load(snug_model_config *cfg, const char *path, snug_error *e) {
    char *text;
    memset(cfg, 0, sizeof *cfg);
    SNUG_TRY(snug_read_file(path, &text, NULL, e));
    int rc = snug_model_config_parse(cfg, text, path, e);
    free(text);
    if (!rc && strlen(path) < sizeof cfg->json_path)
        memcpy(cfg->json_path, path, strlen(path) + 1);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------------- */

/* GPT-2's own constraints: heads of equal width without grouped KV heads, biases everywhere, a tied head. */
static int check_gpt2(const snug_model_config *cfg, const char *path, snug_error *e) {
    if (cfg->head_dim > SNUG_MAX_HEAD_DIM)
        return snug_fail(e, SNUG_EINPUT, "%s: head_dim (n_embd / n_head) is %d but the attention kernels support "
                         "at most %d; raise n_head so that n_embd / n_head <= %d", path, cfg->head_dim,
                         SNUG_MAX_HEAD_DIM, SNUG_MAX_HEAD_DIM);
    if ((long long)cfg->n_head * cfg->head_dim != cfg->hidden_size || cfg->n_kv_head != cfg->n_head)
        return snug_fail(e, SNUG_EINPUT, "%s: n_head (%d) must divide n_embd (%d) into heads of equal width with "
                         "no grouped KV heads; fix n_head", path, cfg->n_head, cfg->hidden_size);
    if (!cfg->qkv_bias || !cfg->o_bias || !cfg->mlp_bias || !cfg->tie_embeddings)
        return snug_fail(e, SNUG_EINPUT, "%s: GPT-2 has biases everywhere and a tied head "
                         "(tie_word_embeddings true); fix the configuration", path);
    return 0;
}

/* The Llama scheme's constraints: grouped KV heads, RoPE, and the biases each family can express. */
static int check_llama(const snug_model_config *cfg, const char *path, snug_error *e) {
    if (cfg->head_dim > SNUG_MAX_HEAD_DIM)
        return snug_fail(e, SNUG_EINPUT, "%s: head_dim is %d but the attention kernels support at most %d; set "
                         "head_dim to at most %d (or, without head_dim, raise num_attention_heads so that "
                         "hidden_size / num_attention_heads <= %d)", path, cfg->head_dim, SNUG_MAX_HEAD_DIM,
                         SNUG_MAX_HEAD_DIM, SNUG_MAX_HEAD_DIM);
    if (cfg->n_head % cfg->n_kv_head != 0)
        return snug_fail(e, SNUG_EINPUT, "%s: num_key_value_heads (%d) does not divide num_attention_heads (%d); set "
                         "num_key_value_heads to a divisor of %d", path, cfg->n_kv_head, cfg->n_head, cfg->n_head);
    if (cfg->head_dim % 2 != 0)
        return snug_fail(e, SNUG_EINPUT, "%s: head_dim is %d; RoPE needs an even head_dim (hidden_size / "
                         "num_attention_heads when head_dim is absent)", path, cfg->head_dim);
    /* below 1 the frequencies grow past 1 radian per position (and overflow to NaN as theta nears 0) */
    if (!(cfg->rope_theta >= 1) || !isfinite(cfg->rope_theta))
        return snug_fail(e, SNUG_EINPUT, "%s: rope_theta is %g; it must be at least 1 (10000.0 is the usual value)",
                         path, cfg->rope_theta);
    /* transformers' own check: a scaling factor of at least 1 */
    if (cfg->rope_type == SNUG_ROPE_LINEAR && !(cfg->rope_factor >= 1 && isfinite(cfg->rope_factor)))
        return snug_fail(e, SNUG_EINPUT, "%s: rope_scaling.factor is %g; it must be at least 1", path,
                         cfg->rope_factor);
    if (cfg->rope_type == SNUG_ROPE_LLAMA3 &&
        (!(cfg->rope_factor >= 1 && isfinite(cfg->rope_factor)) || !(cfg->rope_low_freq_factor > 0) ||
         !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) || !isfinite(cfg->rope_high_freq_factor) ||
         cfg->rope_original_max_position <= 0))
        return snug_fail(e, SNUG_EINPUT, "%s: rope_scaling (llama3) needs factor >= 1, 0 < low_freq_factor < "
                         "high_freq_factor and original_max_position_embeddings > 0 (got %g, %g, %g, %d); fix them",
                         path, cfg->rope_factor, cfg->rope_low_freq_factor, cfg->rope_high_freq_factor,
                         cfg->rope_original_max_position);
    if (cfg->rope_type != SNUG_ROPE_DEFAULT && cfg->rope_type != SNUG_ROPE_LINEAR && cfg->rope_type != SNUG_ROPE_LLAMA3)
        return snug_fail(e, SNUG_EINTERNAL, "%s: unknown rope type %d", path, (int)cfg->rope_type);
    /* Biases each family can express in its config.json. */
    snug_bias_rule bias = snug_family_find(cfg->model_type)->bias;
    if (bias == SNUG_BIAS_QKV && (!cfg->qkv_bias || cfg->o_bias || cfg->mlp_bias))
        return snug_fail(e, SNUG_EINPUT, "%s: %s has q/k/v biases and no other biases; use model_type llama for "
                         "other bias settings", path, cfg->model_type);
    if (bias == SNUG_BIAS_NONE && (cfg->qkv_bias || cfg->o_bias || cfg->mlp_bias))
        return snug_fail(e, SNUG_EINPUT, "%s: %s has no biases; use model_type llama (attention_bias, mlp_bias) "
                         "for biases", path, cfg->model_type);
    if (bias == SNUG_BIAS_KEYS && cfg->qkv_bias != cfg->o_bias)
        return snug_fail(e, SNUG_EINPUT, "%s: %s's attention_bias sets q/k/v and o biases together; use "
                         "model_type qwen2 for q/k/v biases alone", path, cfg->model_type);
    return 0;
}

int snug_model_config_validate(const snug_model_config *cfg, const char *path, snug_error *e) {
    const snug_scheme *sc = snug_scheme_of(cfg->arch);
    const snug_family *f = snug_family_find(cfg->model_type);
    if (!sc)
        return snug_fail(e, SNUG_EINTERNAL, "%s: unknown architecture %d", path, (int)cfg->arch);
    if (!f || f->arch != cfg->arch) {
        char list[256];
        snug_family_list(cfg->arch, list, sizeof list);
        return snug_fail(e, SNUG_EINPUT, "%s: model_type \"%.40s\" does not belong to the %s architecture; use %s",
                         path, cfg->model_type, sc->name, list);
    }
    /* the upper bounds are far beyond any published model (a vocabulary of 262k, width 16k, 126 layers) and keep
     * every size the layout code multiplies within its integers; the keys as the user's config.json spells them */
    const struct {
        const char *key;
        int v, max;
    } sizes[] = {
        {"vocab_size", cfg->vocab_size, 1 << 24},
        {sc->k_hidden, cfg->hidden_size, 1 << 17},
        {sc->k_inner, cfg->intermediate_size, 1 << 20},
        {sc->k_layers, cfg->n_layer, SNUG_MAX_LAYERS},
        {sc->k_heads, cfg->n_head, 1 << 12},
        {"num_key_value_heads", cfg->n_kv_head, 1 << 12},
        {"head_dim", cfg->head_dim, INT_MAX},
        {sc->k_positions, cfg->max_position, INT_MAX},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].v <= 0)
            return snug_fail(e, SNUG_EINPUT, "%s: %s is %d; it must be a positive integer", path, sizes[i].key,
                             sizes[i].v);
        if (sizes[i].v > sizes[i].max)
            return snug_fail(e, SNUG_EINPUT, "%s: %s is %d; snug plans and trains models with %s up to %d", path,
                             sizes[i].key, sizes[i].v, sizes[i].key, sizes[i].max);
    }
    if (!(cfg->norm_eps > 0) || !isfinite(cfg->norm_eps))
        return snug_fail(e, SNUG_EINPUT, "%s: %s is %g; it must be a small positive number such as 1e-05", path,
                         sc->k_eps, (double)cfg->norm_eps);
    if (!(cfg->initializer_range >= 0) || !isfinite(cfg->initializer_range))
        return snug_fail(e, SNUG_EINPUT, "%s: initializer_range is %g; it must be a non-negative number such as 0.02",
                         path, (double)cfg->initializer_range);
    if (cfg->sliding_window < 0)
        return snug_fail(e, SNUG_EINPUT, "%s: sliding_window is %d; it must be a positive number of tokens, or null",
                         path, cfg->sliding_window);
    if (cfg->bos_token_id < -1 || cfg->eos_token_id < -1 || cfg->pad_token_id < -1)
        return snug_fail(e, SNUG_EINPUT, "%s: a token id (bos/eos/pad) is negative; use a valid id or remove it", path);
    return dialects[cfg->arch].check(cfg, path, e);
}

/* The shortest decimal that reads back as the same float, so 1e-5f is written 1e-05, not 9.99999975e-06. */
static double float_decimal(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f)
            return d;
    }
    return (double)f;
}

static int dump_json(json_t *root, const char *path, snug_error *e) {
    char *s = root ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(root);
    if (!s)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", path);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", path);
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    int rc = snug_write_file_atomic(path, t, n + 1, e);
    free(t);
    return rc;
}

static void set_token(json_t *o, const char *key, int id) {
    if (id >= 0)
        json_object_set_new(o, key, json_integer(id));
}

static json_t *rope_scaling_json(const snug_model_config *cfg) {
    if (cfg->rope_type == SNUG_ROPE_DEFAULT)
        return json_null();
    json_t *o = json_object();
    if (cfg->rope_type == SNUG_ROPE_LINEAR) {
        json_object_set_new(o, "rope_type", json_string("linear"));
        json_object_set_new(o, "factor", json_real(cfg->rope_factor));
        return o;
    }
    json_object_set_new(o, "rope_type", json_string("llama3"));
    json_object_set_new(o, "factor", json_real(cfg->rope_factor));
    json_object_set_new(o, "low_freq_factor", json_real(cfg->rope_low_freq_factor));
    json_object_set_new(o, "high_freq_factor", json_real(cfg->rope_high_freq_factor));
    json_object_set_new(o, "original_max_position_embeddings", json_integer(cfg->rope_original_max_position));
    return o;
}

static json_t *llama_json(const snug_model_config *cfg) {
    const char *mt = cfg->model_type;
    const snug_family *f = snug_family_find(mt);
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", cfg->architecture[0] ? cfg->architecture
                                                                                   : f->architecture));
    json_object_set_new(o, "model_type", json_string(mt));
    json_object_set_new(o, "vocab_size", json_integer(cfg->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(cfg->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(cfg->intermediate_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(cfg->n_layer));
    json_object_set_new(o, "num_attention_heads", json_integer(cfg->n_head));
    json_object_set_new(o, "num_key_value_heads", json_integer(cfg->n_kv_head));
    json_object_set_new(o, "head_dim", json_integer(cfg->head_dim));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "rms_norm_eps", json_real(float_decimal(cfg->norm_eps)));
    json_object_set_new(o, "max_position_embeddings", json_integer(cfg->max_position));
    json_object_set_new(o, "rope_theta", json_real(cfg->rope_theta));
    json_object_set_new(o, "rope_scaling", rope_scaling_json(cfg));
    if (f->bias == SNUG_BIAS_KEYS) {
        json_object_set_new(o, "attention_bias", json_boolean(cfg->o_bias));
        json_object_set_new(o, "mlp_bias", json_boolean(cfg->mlp_bias));
    }
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    int W = cfg->sliding_window, first = cfg->n_layer; /* the first sliding layer */
    for (int l = cfg->n_layer - 1; l >= 0; l--)
        first = snug_layer_window(cfg, l) ? l : first;
    if (f->sliding)
        json_object_set_new(o, "sliding_window", W > 0 && first < cfg->n_layer ? json_integer(W) : json_null());
    if ((f->sliding & SNUG_SLIDING_FLAG) && (W <= 0 || first == cfg->n_layer))
        json_object_set_new(o, "use_sliding_window", json_false());
    else if (f->sliding & SNUG_SLIDING_FLAG) {
        json_t *lt = json_array();
        for (int l = 0; l < cfg->n_layer; l++)
            json_array_append_new(lt, json_string(snug_layer_window(cfg, l) ? "sliding_attention" : "full_attention"));
        json_object_set_new(o, "use_sliding_window", json_true());
        json_object_set_new(o, "max_window_layers", json_integer(first));
        json_object_set_new(o, "layer_types", lt);
    }
    json_object_set_new(o, "tie_word_embeddings", json_boolean(cfg->tie_embeddings));
    return o;
}

static json_t *gpt2_json(const snug_model_config *cfg) {
    const char *cls = cfg->architecture[0] ? cfg->architecture : snug_family_of(cfg)->architecture;
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", cls));
    json_object_set_new(o, "model_type", json_string(cfg->model_type));
    json_object_set_new(o, "vocab_size", json_integer(cfg->vocab_size));
    json_object_set_new(o, "n_embd", json_integer(cfg->hidden_size));
    json_object_set_new(o, "n_layer", json_integer(cfg->n_layer));
    json_object_set_new(o, "n_head", json_integer(cfg->n_head));
    json_object_set_new(o, "n_positions", json_integer(cfg->max_position));
    json_object_set_new(o, "n_ctx", json_integer(cfg->max_position));
    json_object_set_new(o, "n_inner", cfg->intermediate_size == 4 * cfg->hidden_size
                                          ? json_null() : json_integer(cfg->intermediate_size));
    json_object_set_new(o, "activation_function", json_string("gelu_new"));
    json_object_set_new(o, "layer_norm_epsilon", json_real(float_decimal(cfg->norm_eps)));
    /* snug trains without dropout; the saved model says so */
    json_object_set_new(o, "attn_pdrop", json_real(0.0));
    json_object_set_new(o, "embd_pdrop", json_real(0.0));
    json_object_set_new(o, "resid_pdrop", json_real(0.0));
    json_object_set_new(o, "scale_attn_weights", json_true());
    json_object_set_new(o, "tie_word_embeddings", json_true());
    return o;
}

static const dialect dialects[SNUG_NARCH] = {
    [SNUG_ARCH_LLAMA] = {parse_llama, llama_json, check_llama},
    [SNUG_ARCH_GPT2] = {parse_gpt2, gpt2_json, check_gpt2},
};

/* cfg->json_path as read, with the values training changes set from cfg where they differ from the file's: the
 * vocabulary's size, the special token ids and the dtype (in the spelling the file uses). NULL when the file can no
 * longer be read as a config of the same architecture (the caller writes cfg whole). */
static json_t *kept_json(const snug_model_config *cfg) {
    char *text = NULL;
    snug_error e2 = {0};
    if (!cfg->json_path[0] || snug_read_file(cfg->json_path, &text, NULL, &e2))
        return NULL;
    json_error_t je;
    json_t *o = snug_json_loadb(text, strlen(text), 0, &je);
    snug_model_config *base = malloc(sizeof *base);
    int ok = o && json_is_object(o) && base && !snug_model_config_parse(base, text, cfg->json_path, &e2) &&
             base->arch == cfg->arch;
    free(text);
    if (!ok) {
        json_decref(o);
        free(base);
        return NULL;
    }
    if (base->vocab_size != cfg->vocab_size)
        json_object_set_new(o, "vocab_size", json_integer(cfg->vocab_size));
    const struct {
        const char *key;
        int was, now;
    } ids[] = {{"bos_token_id", base->bos_token_id, cfg->bos_token_id},
               {"eos_token_id", base->eos_token_id, cfg->eos_token_id},
               {"pad_token_id", base->pad_token_id, cfg->pad_token_id}};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++)
        if (ids[i].was != ids[i].now)
            json_object_set_new(o, ids[i].key, ids[i].now >= 0 ? json_integer(ids[i].now) : json_null());
    if (strcmp(base->torch_dtype, cfg->torch_dtype) != 0 && cfg->torch_dtype[0]) {
        int v5 = json_object_get(o, "dtype") != NULL, v4 = json_object_get(o, "torch_dtype") != NULL || !v5;
        if (v5)
            json_object_set_new(o, "dtype", json_string(cfg->torch_dtype));
        if (v4)
            json_object_set_new(o, "torch_dtype", json_string(cfg->torch_dtype));
    }
    free(base);
    return o;
}

int snug_model_config_save(const snug_model_config *cfg, const char *path, snug_error *e) {
    SNUG_TRY(snug_model_config_validate(cfg, path, e));
    json_t *kept = kept_json(cfg);
    if (kept)
        return dump_json(kept, path, e);
    json_t *o = dialects[cfg->arch].to_json(cfg);
    if (!o)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", path);
    set_token(o, "bos_token_id", cfg->bos_token_id);
    set_token(o, "eos_token_id", cfg->eos_token_id);
    set_token(o, "pad_token_id", cfg->pad_token_id);
    json_object_set_new(o, "initializer_range", json_real(float_decimal(cfg->initializer_range)));
    if (cfg->torch_dtype[0])
        json_object_set_new(o, "torch_dtype", json_string(cfg->torch_dtype));
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "transformers_version", json_string(HF_TRANSFORMERS_VERSION));
    return dump_json(o, path, e);
}

/* The base's generation_config.json (beside cfg->json_path) as read, with the bos/eos/pad ids set from cfg where
 * they differ from the base's config.json; NULL when there is none to keep. */
static json_t *kept_generation_json(const snug_model_config *cfg) {
    char p[sizeof cfg->json_path + 32];
    snprintf(p, sizeof p, "%s", cfg->json_path);
    char *slash = strrchr(p, '/');
    if (!cfg->json_path[0])
        return NULL;
    snprintf(slash ? slash + 1 : p, sizeof p - (size_t)(slash ? slash + 1 - p : 0), "generation_config.json");
    char *text = NULL;
    snug_error e2 = {0};
    if (!snug_file_exists(p) || snug_read_file(p, &text, NULL, &e2))
        return NULL;
    json_error_t je;
    json_t *o = snug_json_loadb(text, strlen(text), 0, &je);
    free(text);
    snug_model_config *base = malloc(sizeof *base);
    int ok = o && json_is_object(o) && base && !snug_model_config_load(base, cfg->json_path, &e2);
    if (ok) {
        const char *keys[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
        const int was[3] = {base->bos_token_id, base->eos_token_id, base->pad_token_id};
        const int now[3] = {cfg->bos_token_id, cfg->eos_token_id, cfg->pad_token_id};
        for (int i = 0; i < 3; i++)
            if (was[i] != now[i] && now[i] >= 0)
                json_object_set_new(o, keys[i], json_integer(now[i]));
    } else {
        json_decref(o);
        o = NULL;
    }
    free(base);
    return o;
}

int snug_generation_config_save(const snug_model_config *cfg, const char *path, snug_error *e) {
    json_t *kept = kept_generation_json(cfg);
    if (kept)
        return dump_json(kept, path, e);
    json_t *o = json_object();
    if (!o)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", path);
    set_token(o, "bos_token_id", cfg->bos_token_id);
    set_token(o, "eos_token_id", cfg->eos_token_id);
    set_token(o, "pad_token_id", cfg->pad_token_id);
    json_object_set_new(o, "transformers_version", json_string(HF_TRANSFORMERS_VERSION));
    return dump_json(o, path, e);
}

long long snug_model_config_nparams(const snug_model_config *cfg) {
    snug_block b = snug_block_of(cfg);
    long long V = cfg->vocab_size, C = cfg->hidden_size, I = cfg->intermediate_size, L = cfg->n_layer;
    long long Q = (long long)cfg->n_head * cfg->head_dim, KV = (long long)cfg->n_kv_head * cfg->head_dim;
    long long norm = b.norm == SNUG_NORM_LAYER ? 2 * C : C; /* a weight (and LayerNorm's bias) */
    long long fc = b.mlp == SNUG_MLP_SWIGLU ? 2 * I : I;    /* the rows of gate and up, or of the one up projection */
    long long layer = 2 * norm                              /* before attention and before the MLP */
                      + C * Q + 2 * C * KV                  /* q, k, v */
                      + Q * C                               /* o */
                      + fc * C + I * C                      /* the MLP */
                      + (cfg->qkv_bias ? Q + 2 * KV : 0) + (cfg->o_bias ? C : 0) + (cfg->mlp_bias ? fc + C : 0);
    long long pos = b.pos == SNUG_POS_LEARNED ? (long long)cfg->max_position * C : 0;
    return V * C + (cfg->tie_embeddings ? 0 : V * C) + pos + norm + L * layer;
}
