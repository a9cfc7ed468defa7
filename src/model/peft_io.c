/* peft_io.c: LoRA adapters in PEFT's files (adapter_config.json + adapter_model.safetensors), both ways.
 *
 * Written as PEFT writes them: tensor names base_model.model.<module>.lora_A.weight (r, in) and .lora_B.weight (out, r)
 * in fp32 (DoRA: and .lora_magnitude_vector (out)), metadata {"format": "pt"}, and a config with only keys every PEFT
 * release since 0.6 knows (older releases refuse unknown keys), plus use_rslora and use_dora when on. Read back from
 * snug or from any tool that writes PEFT's format: target_modules as a list (a module matches when its name is the
 * entry or ends in "." + entry) or the string "all-linear"; modules_to_save (embed_tokens, lm_head: tensors
 * base_model.model.<path>.weight, trained in full); layers_to_transform (the adapted layers); features that change the
 * arithmetic and that snug does not implement (per-module ranks, bias training, embedding adapters) are refused by name
 * rather than silently ignored. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "model/family.h"
#include "model/model.h"
#include "model/peft_io.h"
#include "model/safetensors.h"

/* The entry of target_modules that names module k ("q_proj"; GPT-2's two c_proj need their parent). */
static const char *target_name(snug_arch arch, int k) {
    const char *full = snug_lora_module_name(arch, k), *dot = strrchr(full, '.');
    const char *leaf = dot ? dot + 1 : full;
    for (int j = 0; j < snug_lora_module_count(arch); j++) {
        const char *o = snug_lora_module_name(arch, j), *od = strrchr(o, '.');
        if (j != k && !strcmp(od ? od + 1 : o, leaf))
            return full;
    }
    return leaf;
}

/* Whether a target_modules entry selects module k: PEFT's suffix rule on the module's full name. An entry longer than
 * the module path names one layer's module, which snug cannot adapt alone: it selects nothing here. */
static int target_matches(snug_arch arch, int k, const char *t) {
    const char *full = snug_lora_module_name(arch, k);
    size_t lf = strlen(full), lt = strlen(t);
    return !strcmp(full, t) || (lt < lf && full[lf - lt - 1] == '.' && !strcmp(full + lf - lt, t));
}

int snug_lora_targets_parse(snug_arch arch, const char *list, unsigned *out, char *unknown, size_t n) {
    *out = 0;
    if (unknown && n)
        unknown[0] = '\0';
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        if (!strcmp(t, "all-linear")) {
            *out |= snug_lora_all_linear(arch);
            continue;
        }
        unsigned hit = 0;
        for (int k = 0; k < snug_lora_module_count(arch); k++)
            if (target_matches(arch, k, t))
                hit |= 1u << k;
        if (!hit) {
            if (unknown && n)
                snprintf(unknown, n, "%s", t);
            return -1;
        }
        *out |= hit;
    }
    return 0;
}

void snug_lora_targets_list(snug_arch arch, unsigned targets, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < snug_lora_module_count(arch) && len < n; k++)
        if (targets & (1u << k))
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", target_name(arch, k));
}

int snug_lora_save_parse(const char *list, unsigned *out, char *unknown, size_t n) {
    *out = 0;
    if (unknown && n)
        unknown[0] = '\0';
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        unsigned bit = !strcmp(t, "embed_tokens") ? SNUG_SAVE_EMBED : !strcmp(t, "lm_head") ? SNUG_SAVE_HEAD : 0;
        if (!bit) {
            if (unknown && n)
                snprintf(unknown, n, "%s", t);
            return -1;
        }
        *out |= bit;
    }
    return 0;
}

void snug_lora_save_list(unsigned save, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s", save & SNUG_SAVE_EMBED ? "embed_tokens" : "",
             (save & SNUG_SAVE_EMBED) && (save & SNUG_SAVE_HEAD) ? ", " : "", save & SNUG_SAVE_HEAD ? "lm_head" : "");
}

/* ---- writing ---- */

int snug_peft_save(const snug_model *m, const char *dir, const char *base_name, const float *host, snug_error *e) {
    const snug_lora *lo = &m->lora;
    const snug_lora_cfg *lc = &m->lv.lora;
    SNUG_TRY(snug_mkdirs(dir, e));
    float *own = NULL;
    if (!host) {
        if (!(own = malloc((lo->table.total ? lo->table.total : 1) * sizeof *own)))
            return snug_fail(e, SNUG_ENOMEM, "out of host memory saving the adapter to %s", dir);
        m->be->to_host(m->be, own, lo->params, lo->table.total * sizeof *own);
        host = own;
    }
    snug_st_out *out = calloc((size_t)(lo->table.n ? lo->table.n : 1), sizeof *out);
    int rc = out ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory saving the adapter to %s", dir);
    for (int i = 0; !rc && i < lo->table.n; i++) {
        const snug_param_entry *p = &lo->table.e[i];
        out[i] = (snug_st_out){.name = p->name, .dtype = SNUG_DT_F32, .ndim = p->ndim, .f32 = host + p->offset};
        out[i].shape[0] = p->shape[0];
        out[i].shape[1] = p->shape[1];
    }
    char path[4096];
    if (!rc) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        rc = snug_st_write(path, out, lo->table.n, NULL, e);
    }
    free(out);
    free(own);
    if (rc)
        return rc;
    json_t *targets = json_array();
    for (int k = 0; k < snug_lora_module_count(m->cfg.arch); k++)
        if (lc->targets & (1u << k))
            json_array_append_new(targets, json_string(target_name(m->cfg.arch, k)));
    int conv1d = snug_scheme_of(m->cfg.arch)->conv1d; /* PEFT's fan_in_fan_out */
    json_t *j = json_pack("{s:s, s:s, s:s, s:n, s:i, s:f, s:f, s:o, s:s, s:b, s:n, s:b, s:b, s:n, s:n, s:{}, s:{}}",
                          "peft_type", "LORA", "task_type", "CAUSAL_LM", "base_model_name_or_path",
                          base_name ? base_name : "", "revision", "r", lc->r, "lora_alpha", (double)lc->alpha,
                          "lora_dropout", (double)lc->dropout, "target_modules", targets, "bias", "none",
                          "fan_in_fan_out", conv1d, "modules_to_save", "init_lora_weights", 1,
                          "inference_mode", 1, "layers_to_transform", "layers_pattern", "rank_pattern",
                          "alpha_pattern");
    if (j && lc->rslora)
        json_object_set_new(j, "use_rslora", json_true());
    if (j && lc->dora) /* (only then: older PEFT releases refuse the key, and read no DoRA adapter anyway) */
        json_object_set_new(j, "use_dora", json_true());
    if (j && snug_lora_layers_named(lc)) {
        json_t *layers = json_array();
        for (int l = 0; l < 256; l++)
            if (snug_lora_layer_on(lc, l))
                json_array_append_new(layers, json_integer(l));
        json_object_set_new(j, "layers_to_transform", layers);
    }
    if (j && lc->save_modules) { /* PEFT's names; the tensors are saved as base_model.model.<the module's path> */
        json_t *mods = json_array();
        if (lc->save_modules & SNUG_SAVE_EMBED)
            json_array_append_new(mods, json_string("embed_tokens"));
        if (lc->save_modules & SNUG_SAVE_HEAD)
            json_array_append_new(mods, json_string("lm_head"));
        json_object_set_new(j, "modules_to_save", mods);
    }
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!text)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s/adapter_config.json", dir);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir); /* last: the folder is an adapter once whole */
    rc = snug_write_file_atomic(path, text, strlen(text), e);
    free(text);
    return rc;
}

/* ---- reading ---- */

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

int snug_peft_read_config(const char *dir, snug_arch arch, snug_lora_cfg *out, snug_error *e) {
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
    char list[1024] = "";
    if (!rc && json_is_string(v)) {
        if (strcmp(json_string_value(v), "all-linear"))
            rc = bad_key(e, path, "target_modules", "is a regular expression: snug reads a list of module names or "
                         "\"all-linear\"");
        else
            snprintf(list, sizeof list, "all-linear");
    } else if (!rc && json_is_array(v)) {
        size_t i, len2 = 0;
        json_t *x;
        json_array_foreach(v, i, x) {
            if (!json_is_string(x)) {
                rc = bad_key(e, path, "target_modules", "must list module names (strings)");
                break;
            }
            len2 += (size_t)snprintf(list + len2, len2 < sizeof list ? sizeof list - len2 : 0, "%s%s",
                                     len2 ? "," : "", json_string_value(x));
        }
    } else if (!rc) {
        rc = bad_key(e, path, "target_modules", "is missing (PEFT's per-architecture default is not guessed)");
    }
    char unknown[256], all[256];
    if (!rc && snug_lora_targets_parse(arch, list, &out->targets, unknown, sizeof unknown)) {
        snug_lora_targets_list(arch, snug_lora_all_linear(arch), all, sizeof all);
        rc = snug_fail(e, SNUG_EINPUT, "%s: target_modules names \"%s\", which is no linear module of this model "
                       "(its modules: %s)", path, unknown, all);
    }
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

int snug_peft_load(snug_model *m, const char *dir, snug_error *e) {
    snug_lora_cfg want;
    SNUG_TRY(snug_peft_read_config(dir, m->cfg.arch, &want, e));
    const snug_lora_cfg *lc = &m->lv.lora;
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (want.save_modules != lc->save_modules) {
        char a[64], b[64];
        snug_lora_save_list(want.save_modules, a, sizeof a);
        snug_lora_save_list(lc->save_modules, b, sizeof b);
        return snug_fail(e, SNUG_EINPUT, "%s: the adapter trains [%s] in full (modules_to_save), the run is set to "
                         "[%s]; set lora_modules_to_save as the adapter has it", path, a, b);
    }
    if (want.r != lc->r || want.targets != lc->targets || fabsf(want.alpha - lc->alpha) > 0 ||
        want.rslora != lc->rslora || want.dora != lc->dora || memcmp(want.layers, lc->layers, sizeof want.layers)) {
        char a[256], b[256];
        snug_lora_targets_list(m->cfg.arch, want.targets, a, sizeof a);
        snug_lora_targets_list(m->cfg.arch, lc->targets, b, sizeof b);
        return snug_fail(e, SNUG_EINPUT, "%s: the adapter has r=%d alpha=%g%s%s on [%s], the run is set to r=%d "
                         "alpha=%g%s%s on [%s]; set lora_r, lora_alpha, peft_use_rslora, peft_use_dora, "
                         "lora_layers_to_transform and lora_target_modules as the adapter has them", path, want.r,
                         (double)want.alpha,
                         want.rslora ? " (rsLoRA)" : "", want.dora ? " (DoRA)" : "", a, lc->r, (double)lc->alpha,
                         lc->rslora ? " (rsLoRA)" : "", lc->dora ? " (DoRA)" : "", b);
    }
    snug_st_set s;
    memset(&s, 0, sizeof s);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    SNUG_TRY(snug_st_open_file(&s, path, e));
    const snug_lora *lo = &m->lora;
    float *host = malloc((lo->table.total ? lo->table.total : 1) * sizeof *host);
    int rc = host ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory reading %s", path);
    for (int i = 0; !rc && i < lo->table.n; i++) {
        const snug_param_entry *p = &lo->table.e[i];
        const snug_st_tensor *t = snug_st_find(&s, p->name);
        if (!t)
            rc = snug_fail(e, SNUG_EINPUT, "%s: no tensor %s; the adapter does not match this model (another base, "
                           "or other target modules)", path, p->name);
        else if (t->ndim != p->ndim || t->shape[0] != p->shape[0] || (p->ndim == 2 && t->shape[1] != p->shape[1]))
            rc = snug_fail(e, SNUG_EINPUT, "%s: %s has shape [%lld, %lld], this model needs [%lld, %lld]; the "
                           "adapter is for another base model or rank", path, p->name, (long long)t->shape[0],
                           t->ndim == 2 ? (long long)t->shape[1] : 1LL, (long long)p->shape[0],
                           (long long)p->shape[1]);
        else
            rc = snug_st_to_f32(&s, t, host + p->offset, 0, e);
    }
    /* a tensor snug would not use (an embedding adapter, a saved module) means the adapter is not what it seems */
    for (int i = 0; !rc && i < s.ntensors; i++) {
        int known = 0;
        for (int k = 0; k < lo->table.n && !known; k++)
            known = !strcmp(s.tensors[i].name, lo->table.e[k].name);
        if (!known)
            rc = snug_fail(e, SNUG_EINPUT, "%s: tensor %s is not a LoRA A or B (or DoRA magnitude) of the modules "
                           "in adapter_config.json; snug does not load it", path, s.tensors[i].name);
    }
    if (!rc)
        m->be->to_device(m->be, lo->params, host, lo->table.total * sizeof *host);
    free(host);
    snug_st_close(&s);
    return rc;
}
