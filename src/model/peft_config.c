/* peft_config.c: reading a PEFT adapter's adapter_config.json into snug_lora_cfg (the reading half of peft_io.h).
 *
 * Every key PEFT's LoraConfig writes (0.21), and what reading does with it:
 *   honoured   r, lora_alpha, lora_dropout, use_rslora, use_dora, target_modules (a list, its entries a module's
 *              name or one layer's module's path, as PEFT saves "all-linear" on a small model; or "all-linear"),
 *              exclude_modules (a list by PEFT's suffix rule, or a Python regular expression matched whole against
 *              "model.layers.<l>.<module>"), layers_to_transform, layers_pattern (the model's own), modules_to_save
 *              (embed_tokens, lm_head), init_lora_weights (below)
 *   no effect  peft_type (must be LORA), task_type, base_model_name_or_path, revision, peft_version, inference_mode,
 *              auto_mapping; fan_in_fan_out (PEFT sets it from the layer's type, warning when the file disagrees);
 *              megatron_config and megatron_core (only read for Megatron's parallel layers, which a Hugging Face model
 *              has none of); loftq_config, eva_config, corda_config, lora_ga_config (read only by their
 *              init_lora_weights); qalora_group_size (only with use_qalora); ensure_weight_tying (only for tied
 *              modules PEFT adapts, which snug refuses by the keys below)
 *   refused    rank_pattern, alpha_pattern, trainable_token_indices, target_parameters (when not empty); lora_bias,
 *              use_qalora (when true); bias other than "none"; layer_replication, alora_invocation_tokens,
 *              arrow_config, kasa_config, monteclora_config, velora_config, use_bdlora (when set); target_modules as
 *              a regular expression; modules_to_save other than embed_tokens and lm_head; exclude_modules or per-layer
 *              target_modules entries that leave different modules on different layers
 * init_lora_weights: true, false, "gaussian", "eva", "orthogonal" leave the base as it is (the saved A and B are the
 * adapter whole); "pissa" and "olora" are relative to a residual base that loading derives again (peft_init.c);
 * "pissa_niter_<K>" (a randomized SVD drawn from torch's global generator), "corda" (needs preprocess_corda's
 * covariances from data), "loftq" (re-quantizes the base), "lora_ga" (changed the base from gradients when it was
 * made, and PEFT cannot derive that again) and "mica" (trains A alone) are refused by name. An adapter PEFT saved
 * converted (path_initial_model_for_weight_conversion: rank 2r, init_lora_weights true) is plain. */

#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "model/family.h"
#include "model/model.h"
#include "model/peft_io.h"

static int bad_key(snug_error *e, const char *path, const char *key, const char *why) {
    return snug_fail(e, SNUG_EINPUT, "%s: %s %s", path, key, why);
}

/* dir's adapter_config.json parsed into *out (an object), its path into path. */
static int load_config(const char *dir, char path[4096], json_t **out, snug_error *e) {
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    snprintf(path, 4096, "%s/adapter_config.json", dir);
    SNUG_TRY(snug_read_file(path, &text, &len, e));
    json_error_t je;
    json_t *j = snug_json_loadb(text, len, 0, &je);
    free(text);
    if (!j || !json_is_object(j)) {
        int rc = j ? snug_fail(e, SNUG_EINPUT, "%s: not a JSON object", path)
                   : snug_fail(e, SNUG_EINPUT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        json_decref(j);
        return rc;
    }
    *out = j;
    return 0;
}

/* Keys of features that change the arithmetic, which snug does not compute: refused when set. */
static int read_refused(json_t *j, const char *path, snug_error *e) {
    static const struct {
        const char *key, *what;
    } set[] = {
        {"layer_replication", "stacks copies of the base's layers (layer_replication), which snug does not build"},
        {"alora_invocation_tokens", "makes an Activated LoRA (the adapters act only after the invocation tokens), "
                                    "which snug does not compute"},
        {"arrow_config", "makes an Arrow mixture of adapters, which snug does not compute"},
        {"kasa_config", "makes a KaSA adapter, which snug does not compute"},
        {"monteclora_config", "makes a MonteCLoRA adapter, which snug does not compute"},
        {"velora_config", "makes a VeLoRA adapter, which snug does not compute"},
        {"use_bdlora", "makes a block-diagonal LoRA, which snug does not compute"},
        {"use_qalora", "makes a QA-LoRA adapter (the input pooled in groups), which snug does not compute"},
    };
    for (size_t i = 0; i < sizeof set / sizeof *set; i++) {
        json_t *v = json_object_get(j, set[i].key);
        int on = v && !json_is_null(v) && !json_is_false(v) && !(json_is_array(v) && !json_array_size(v)) &&
                 !(json_is_object(v) && !json_object_size(v));
        if (on) {
            char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            int rc = snug_fail(e, SNUG_EINPUT, "%s: %s is %.60s: it %s; remove the key only if the adapter was made "
                               "without it, or merge the adapter with PEFT", path, set[i].key, text ? text : "set",
                               set[i].what);
            free(text);
            return rc;
        }
    }
    return 0;
}

/* init_lora_weights into out->init: what the saved adapter is relative to. */
static int read_init(json_t *j, const char *path, snug_lora_cfg *out, snug_error *e) {
    json_t *v = json_object_get(j, "init_lora_weights");
    out->init = SNUG_LORA_INIT_PLAIN;
    if (!v || json_is_null(v) || json_is_boolean(v))
        return 0;
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    static const char *const plain[] = {"gaussian", "eva", "orthogonal"};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(s, plain[i]))
            return 0;
    if (!strcmp(s, "pissa") || !strcmp(s, "olora")) { /* (PEFT compares "olora" case-blind) */
        out->init = s[0] == 'p' ? SNUG_LORA_INIT_PISSA : SNUG_LORA_INIT_OLORA;
        return 0;
    }
    if (!strcasecmp(s, "olora")) {
        out->init = SNUG_LORA_INIT_OLORA;
        return 0;
    }
    const char *why = !strncmp(s, "pissa_niter_", 12)
                          ? "its base is the rest of a randomized SVD drawn from torch's global generator, which snug "
                            "cannot draw again"
                      : !strncmp(s, "corda", 5) ? "its base is derived from covariances of data (preprocess_corda)"
                      : !strcmp(s, "loftq")     ? "its base is re-quantized by LoftQ, which snug does not compute"
                      : !strcmp(s, "lora_ga")   ? "its base was changed by gradients when it was made, which no load "
                                                  "can derive again"
                      : !strcmp(s, "mica")      ? "MiCA trains lora_A alone, which snug does not"
                                                : "snug does not know it";
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    int rc = snug_fail(e, SNUG_EINPUT, "%s: init_lora_weights is %.60s: %s; save the adapter converted (PEFT's "
                       "save_pretrained with path_initial_model_for_weight_conversion), which snug reads as plain LoRA",
                       path, text ? text : "?", why);
    free(text);
    return rc;
}

/* A Python regular expression as POSIX's extended one (what fullmatch decides is the same): \d \w \s as classes,
 * (?: as (, lazy quantifiers as greedy ones; 0, or -1 for what has no equal (look-arounds, back-references, \b). */
static int py_regex(const char *py, char *out, size_t n) {
    size_t o = 0;
    int in_class = 0;
#define PUT(str)                                                                                                      \
    do {                                                                                                              \
        const char *s_ = (str);                                                                                       \
        size_t l_ = strlen(s_);                                                                                       \
        if (o + l_ + 4 >= n)                                                                                          \
            return -1;                                                                                                \
        memcpy(out + o, s_, l_);                                                                                      \
        o += l_;                                                                                                      \
    } while (0)
    PUT("^(");
    for (const char *p = py; *p; p++) {
        char c[2] = {*p, 0};
        if (*p == '\\') {
            char x = p[1];
            if (!x)
                return -1;
            p++;
            if (x == 'd')
                PUT(in_class ? "0-9" : "[0-9]");
            else if (x == 'w')
                PUT(in_class ? "A-Za-z0-9_" : "[A-Za-z0-9_]");
            else if (x == 's')
                PUT(in_class ? "[:space:]" : "[[:space:]]");
            else if ((x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z') || (x >= '0' && x <= '9'))
                return -1;
            else if (in_class) { /* a backslash is literal in a POSIX class */
                c[0] = x;
                PUT(c);
            } else {
                char esc[3] = {'\\', x, 0};
                PUT(esc);
            }
        } else if (in_class) {
            in_class = *p != ']';
            PUT(c);
        } else if (*p == '[') {
            in_class = 1;
            PUT("[");
            if (p[1] == '^') {
                PUT("^");
                p++;
            }
            if (p[1] == ']') {
                PUT("]");
                p++;
            }
        } else if (*p == '(' && p[1] == '?') {
            if (p[2] != ':')
                return -1;
            PUT("(");
            p += 2;
        } else if (*p == '?' && p > py && strchr("*+?}", p[-1]) && !(p - 1 > py && p[-2] == '\\')) {
            continue; /* lazy: the same strings match whole */
        } else {
            PUT(c);
        }
    }
    PUT(")$");
    out[o] = '\0';
    return in_class ? -1 : 0;
#undef PUT
}

/* Module k of layer l as PEFT names it in a causal LM ("model.layers.3.self_attn.q_proj"). */
static void module_key(snug_arch arch, int l, int k, char *key, size_t n) {
    snprintf(key, n, "%s.%d.%s", snug_scheme_of(arch)->layers, l, snug_lora_module_name(arch, k));
}

/* PEFT's rule for a list entry: the key itself, or the key ends in "." + the entry. */
static int key_matches(const char *key, const char *t) {
    size_t lk = strlen(key), lt = strlen(t);
    return !strcmp(key, t) || (lt < lk && key[lk - lt - 1] == '.' && !strcmp(key + lk - lt, t));
}

/* Whether a list entry names some layer's module (a layer below n_layer; 256 when not known). */
static int key_named(snug_arch arch, int n_layer, const char *t) {
    char key[256];
    for (int l = 0; l < (n_layer > 0 && n_layer <= 256 ? n_layer : 256); l++)
        for (int k = 0; k < snug_lora_module_count(arch); k++) {
            module_key(arch, l, k, key, sizeof key);
            if (key_matches(key, t))
                return 1;
        }
    return 0;
}

/* target_modules entries that name some layers' modules (targets: the array, NULL when none do), then
 * exclude_modules: module k of layer l, named as PEFT names it ("model.layers.3.self_attn.q_proj"), is left out when
 * the string matches the name whole as a regular expression, or when a list holds the name or a suffix after a dot.
 * What remains must be the same modules on every adapted layer (snug's targets and layers_to_transform); otherwise
 * the adapter is refused by name. */
static int read_modules(json_t *j, const char *path, snug_arch arch, int n_layer, json_t *targets,
                        snug_lora_cfg *out, snug_error *e) {
    json_t *v = json_object_get(j, "exclude_modules");
    if (!v || json_is_null(v) || (json_is_array(v) && !json_array_size(v)) || (json_is_string(v) &&
                                                                                !json_string_length(v)))
        v = NULL;
    if (!v && !targets)
        return 0;
    regex_t re;
    int is_re = v && json_is_string(v);
    if (is_re) {
        char posix[2048];
        if (py_regex(json_string_value(v), posix, sizeof posix) || regcomp(&re, posix, REG_EXTENDED | REG_NOSUB))
            return snug_fail(e, SNUG_EINPUT, "%s: exclude_modules \"%.200s\" is a regular expression snug cannot "
                             "match as Python does (look-arounds, back-references, \\b and the like); list the "
                             "module names instead", path, json_string_value(v));
    } else if (v && !json_is_array(v)) {
        return snug_fail(e, SNUG_EINPUT, "%s: exclude_modules must be a list of module names or a regular expression",
                         path);
    }
    int rc = 0;
    size_t ix;
    json_t *x;
    if (v && !is_re)
        json_array_foreach(v, ix, x) if (!rc && !json_is_string(x)) rc =
            snug_fail(e, SNUG_EINPUT, "%s: exclude_modules must list module names (strings)", path);
    unsigned on[256] = {0}, any = 0; /* each layer's adapted modules */
    uint64_t layers[4] = {0};
    int L = n_layer > 0 && n_layer <= 256 ? n_layer : 256;
    for (int l = 0; !rc && l < L; l++) {
        if (!snug_lora_layer_on(out, l))
            continue;
        for (int k = 0; k < snug_lora_module_count(arch); k++) {
            char key[256];
            module_key(arch, l, k, key, sizeof key);
            int targeted = out->targets >> k & 1u, excluded = 0;
            if (targets)
                json_array_foreach(targets, ix, x) targeted |= key_matches(key, json_string_value(x));
            if (!targeted)
                continue;
            if (is_re)
                excluded = regexec(&re, key, 0, NULL, 0) == 0;
            else if (v)
                json_array_foreach(v, ix, x) excluded |= key_matches(key, json_string_value(x));
            if (!excluded)
                on[l] |= 1u << k;
        }
        any |= on[l];
        if (on[l])
            layers[l / 64] |= 1ull << (l % 64);
    }
    if (is_re)
        regfree(&re);
    for (int l = 0; !rc && l < L; l++)
        if (on[l] && on[l] != any) {
            char a[256], b[256];
            snug_lora_targets_list(arch, on[l], a, sizeof a);
            snug_lora_targets_list(arch, any, b, sizeof b);
            rc = snug_fail(e, SNUG_EINPUT, "%s: %s layer %d with [%s] adapted and others with [%s]; snug adapts the "
                           "same modules on every adapted layer", path,
                           v ? "exclude_modules leaves" : "target_modules names", l, a, b);
        }
    if (!rc && !any)
        rc = snug_fail(e, SNUG_EINPUT, "%s: %s no module adapted", path,
                       v ? "exclude_modules leaves" : "target_modules names");
    if (rc)
        return rc;
    int all = 1;
    for (int l = 0; l < L; l++)
        all &= !!on[l];
    out->targets = any;
    if (!all || snug_lora_layers_named(out))
        memcpy(out->layers, layers, sizeof layers);
    return 0;
}

int snug_peft_read_config(const char *dir, snug_arch arch, int n_layer, snug_lora_cfg *out, snug_error *e) {
    char path[4096];
    json_t *j;
    SNUG_TRY(load_config(dir, path, &j, e));
    int rc = 0;
    memset(out, 0, sizeof *out);
    out->kind = SNUG_ADAPTER_LORA;
    json_t *v = json_object_get(j, "peft_type");
    if (!json_is_string(v) || strcmp(json_string_value(v), "LORA"))
        rc = bad_key(e, path, "peft_type", "is not \"LORA\": snug reads LoRA adapters only");
    v = json_object_get(j, "r");
    if (!rc && (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536))
        rc = bad_key(e, path, "r", "must be an integer from 1 to 65536");
    if (!rc)
        out->r = (int)json_integer_value(v);
    v = json_object_get(j, "lora_alpha");
    if (!rc) {
        if (!v || json_is_null(v))
            out->alpha = 8.0f; /* LoraConfig's default */
        else if (json_is_number(v) && isfinite(json_number_value(v)))
            out->alpha = (float)json_number_value(v);
        else
            rc = bad_key(e, path, "lora_alpha", "must be a number");
    }
    v = json_object_get(j, "lora_dropout");
    if (!rc && v && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) >= 1)
            rc = bad_key(e, path, "lora_dropout", "must be a number in [0, 1)");
        else
            out->dropout = (float)json_number_value(v);
    }
    out->rslora = json_is_true(json_object_get(j, "use_rslora"));
    out->dora = json_is_true(json_object_get(j, "use_dora"));
    /* what snug does not compute is refused, not ignored */
    static const char *const unsupported[] = {"lora_bias"};
    for (size_t i = 0; !rc && i < sizeof unsupported / sizeof *unsupported; i++)
        if (json_is_true(json_object_get(j, unsupported[i])))
            rc = bad_key(e, path, unsupported[i], "is true: not supported by snug");
    static const char *const empty[] = {"rank_pattern", "alpha_pattern", "trainable_token_indices",
                                        "target_parameters"};
    /* layers_to_transform: an index or a list of them (the block list found by its usual name: layers_pattern unset,
     * or the architecture's own) */
    v = json_object_get(j, "layers_to_transform");
    if (!rc && json_is_integer(v)) {
        json_int_t l = json_integer_value(v);
        if (l < 0 || l >= 256)
            rc = bad_key(e, path, "layers_to_transform", "must name layers from 0 to 255");
        else
            out->layers[l / 64] |= 1ull << (l % 64);
    } else if (!rc && json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            json_int_t l = json_is_integer(x) ? json_integer_value(x) : -1;
            if (l < 0 || l >= 256) {
                rc = bad_key(e, path, "layers_to_transform", "must list layer indices from 0 to 255");
                break;
            }
            out->layers[l / 64] |= 1ull << (l % 64);
        }
    } else if (!rc && v && !json_is_null(v)) {
        rc = bad_key(e, path, "layers_to_transform", "must be a layer index or a list of them");
    }
    v = json_object_get(j, "layers_pattern");
    const char *own = snug_scheme_of(arch)->blocks;
    if (!rc && v && !json_is_null(v)) {
        json_t *first = json_is_array(v) && json_array_size(v) == 1 ? json_array_get(v, 0) : v;
        char why[96];
        snprintf(why, sizeof why, "names other blocks than \"%s\"", own);
        if (!json_is_string(first) || strcmp(json_string_value(first), own))
            rc = bad_key(e, path, "layers_pattern", why);
    }
    /* modules trained in full: embed_tokens and lm_head */
    v = json_object_get(j, "modules_to_save");
    out->save_modules = 0;
    if (!rc && v && json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            unsigned bit = 0;
            if (json_is_string(x) && snug_lora_save_parse(json_string_value(x), &bit, NULL, 0) == 0 && bit) {
                out->save_modules |= bit;
            } else {
                rc = bad_key(e, path, "modules_to_save", "names a module other than embed_tokens and lm_head, the "
                             "ones snug trains in full");
                break;
            }
        }
    } else if (!rc && v && !json_is_null(v)) {
        rc = bad_key(e, path, "modules_to_save", "must be a list of module names");
    }
    for (size_t i = 0; !rc && i < sizeof empty / sizeof *empty; i++) {
        json_t *x = json_object_get(j, empty[i]);
        if (x && !json_is_null(x) && !((json_is_object(x) && !json_object_size(x)) ||
                                       (json_is_array(x) && !json_array_size(x))))
            rc = bad_key(e, path, empty[i], "is set: not supported by snug (every layer's modules share r and alpha)");
    }
    v = json_object_get(j, "bias");
    if (!rc && v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "none")))
        rc = bad_key(e, path, "bias", "is not \"none\": trained biases are not supported by snug");
    v = json_object_get(j, "target_modules");
    char unknown[256], all[256];
    int per_layer = 0; /* an entry names a module of some layers only ("model.layers.1.mlp.down_proj") */
    if (!rc && json_is_string(v)) {
        if (strcmp(json_string_value(v), "all-linear"))
            rc = bad_key(e, path, "target_modules", "is a regular expression: snug reads a list of module names or "
                         "\"all-linear\"");
        else
            out->targets = snug_lora_all_linear(arch);
    } else if (!rc && json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            unsigned t = 0;
            if (!json_is_string(x)) {
                rc = bad_key(e, path, "target_modules", "must list module names (strings)");
                break;
            }
            if (snug_lora_targets_parse(arch, json_string_value(x), &t, unknown, sizeof unknown) == 0) {
                out->targets |= t;
            } else if (key_named(arch, n_layer, json_string_value(x))) {
                per_layer = 1; /* (PEFT saves "all-linear" so on a model of 20 modules or fewer) */
            } else {
                snug_lora_targets_list(arch, snug_lora_all_linear(arch), all, sizeof all);
                rc = snug_fail(e, SNUG_EINPUT, "%s: target_modules names \"%s\", which is no linear module of this "
                               "model (its modules: %s)", path, json_string_value(x), all);
                break;
            }
        }
    } else if (!rc) {
        rc = bad_key(e, path, "target_modules", "is missing (PEFT's per-architecture default is not guessed)");
    }
    if (!rc)
        rc = read_refused(j, path, e);
    if (!rc)
        rc = read_init(j, path, out, e);
    if (!rc)
        rc = read_modules(j, path, arch, n_layer, per_layer ? json_object_get(j, "target_modules") : NULL, out, e);
    json_decref(j);
    return rc;
}

int snug_peft_is_adapter(const char *dir) {
    char a[4096], c[4096];
    snprintf(a, sizeof a, "%s/adapter_config.json", dir);
    snprintf(c, sizeof c, "%s/config.json", dir);
    return snug_file_exists(a) && !snug_file_exists(c);
}

int snug_peft_base_path(const char *dir, char *buf, size_t n, snug_error *e) {
    char path[4096];
    json_t *j;
    SNUG_TRY(load_config(dir, path, &j, e));
    json_t *v = json_object_get(j, "base_model_name_or_path");
    int rc = 0;
    if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= n)
        rc = snug_fail(e, SNUG_EINPUT, "%s: base_model_name_or_path does not name the base model folder; give the "
                       "base as MODEL_DIR and the adapter with --adapter", path);
    else
        snprintf(buf, n, "%s", json_string_value(v));
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", buf);
    if (!rc && !snug_file_exists(cfg))
        rc = snug_fail(e, SNUG_EINPUT, "%s: base_model_name_or_path '%s' is not a model folder here (no config.json; a "
                       "built-in preset or a Hub name); give the base folder as MODEL_DIR and the adapter with "
                       "--adapter", path, buf);
    json_decref(j);
    return rc;
}
