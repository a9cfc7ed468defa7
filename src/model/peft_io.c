/* peft_io.c: LoRA adapters in PEFT's files (adapter_config.json + adapter_model.safetensors), both ways.
 *
 * Written as PEFT writes them: tensor names base_model.model.<module>.lora_A.weight (r, in) and .lora_B.weight (out, r)
 * in fp32 (DoRA: and .lora_magnitude_vector (out)), metadata {"format": "pt"}, and a config with only keys every PEFT
 * release since 0.6 knows (older releases refuse unknown keys), plus use_rslora and use_dora when on. Read back from
 * snug or from any tool that writes PEFT's format: target_modules as a list (a module matches when its name is the
 * entry or ends in "." + entry) or the string "all-linear"; modules_to_save (embed_tokens, lm_head: tensors
 * base_model.model.<path>.weight, trained in full; the same names hold the base's whole tables, frozen, when the
 * vocabulary grew for added tokens: PEFT's save_embedding_layers); layers_to_transform (the adapted layers); features
 * that change the arithmetic and that snug does not implement (per-module ranks, bias training, embedding adapters)
 * are refused by name rather than silently ignored.
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

/* A float as the shortest decimal that reads back as it (0.1f as 0.1, not 0.10000000149011612). */
static double shortest(float x) {
    char buf[32];
    for (int digits = 6; digits < 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if ((float)strtod(buf, NULL) == x)
            break;
    }
    return strtod(buf, NULL);
}

/* ---- a vocabulary grown for added tokens ----
 * PEFT (save_embedding_layers="auto") saves the embedding and lm_head whole beside the adapters when the model's
 * vocab_size differs from its base's: base_model.model.<path>.weight (V, C), lm_head too when the model ties them (both
 * names, the same values), and loading copies them into the resized base. modules_to_save's copies have the same
 * names; an adapter with them holds the tables already. */

/* The whole tables' names ([0] the embedding, [1] lm_head) and the model's entries they are ([1] = [0] when tied); 0
 * when the adapter trains them (modules_to_save), the model lacks them, or (grown) its vocabulary is the base's. */
static int grown_tables(const snug_model *m, int grown, char names[2][128], int entry[2]) {
    if ((grown && !(m->cfg.vocab_base > 0 && m->cfg.vocab_base < m->cfg.vocab_size)) || m->lv.lora.save_modules)
        return 0;
    char embed[128];
    snprintf(embed, sizeof embed, "%s.weight", snug_scheme_of(m->cfg.arch)->embed);
    entry[0] = snug_param_table_find(&m->table, embed);
    entry[1] = m->cfg.tie_embeddings ? entry[0] : snug_lora_saved_entry(m, SNUG_SAVE_HEAD);
    if (entry[0] < 0 || entry[1] < 0)
        return 0;
    snprintf(names[0], sizeof names[0], "base_model.model.%s", m->table.e[entry[0]].name);
    snprintf(names[1], sizeof names[1], "base_model.model.%s",
             m->cfg.tie_embeddings ? "lm_head.weight" : m->table.e[entry[1]].name);
    return 1;
}

/* Entry i of the base into host (numel fp32 values). */
static int entry_to_host(const snug_model *m, int i, float *host, snug_error *e) {
    size_t bytes = m->table.e[i].numel * sizeof *host;
    float *d = m->be->alloc(m->be, bytes);
    if (!d)
        return snug_fail(e, SNUG_ENOMEM, "out of memory reading '%s' for the adapter", m->table.e[i].name);
    snug_model_entry_f32(m, i, d);
    m->be->to_host(m->be, host, d, bytes);
    m->be->free(m->be, d);
    return 0;
}

int snug_peft_vocab(const char *dir, int *rows, snug_error *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    snug_st_set s;
    memset(&s, 0, sizeof s);
    SNUG_TRY(snug_st_open_file(&s, path, e));
    *rows = 0;
    for (int i = 0; i < s.ntensors && !*rows; i++) {
        const char *n = s.tensors[i].name, *want = "embed_tokens.weight", *gpt2 = ".wte.weight";
        size_t len = strlen(n), k = strlen(want), k2 = strlen(gpt2);
        if (s.tensors[i].ndim == 2 && ((len >= k && !strcmp(n + len - k, want)) ||
                                       (len >= k2 && !strcmp(n + len - k2, gpt2))))
            *rows = (int)s.tensors[i].shape[0];
    }
    snug_st_close(&s);
    return 0;
}

int snug_peft_save(const snug_model *m, const char *dir, const char *base_name, const float *host, snug_error *e) {
    const snug_lora *lo = &m->lora;
    const snug_lora_cfg *lc = &m->lv.lora;
    SNUG_TRY(snug_mkdirs(dir, e));
    char gname[2][128];
    int gent[2], grown = grown_tables(m, 1, gname, gent);
    float *own = NULL, *gtab = NULL; /* gtab: the grown embedding (V, C), then lm_head's (V, C) when not tied */
    if (!host) {
        if (!(own = malloc((lo->table.total ? lo->table.total : 1) * sizeof *own)))
            return snug_fail(e, SNUG_ENOMEM, "out of host memory saving the adapter to %s", dir);
        m->be->to_host(m->be, own, lo->params, lo->table.total * sizeof *own);
        host = own;
    }
    snug_st_out *out = calloc((size_t)lo->table.n + 2, sizeof *out);
    int rc = out ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory saving the adapter to %s", dir);
    int nout = lo->table.n;
    if (!rc && grown) {
        size_t numel = m->table.e[gent[0]].numel;
        if (!(gtab = malloc(numel * (gent[1] == gent[0] ? 1 : 2) * sizeof *gtab)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory saving the grown embedding to %s", dir);
        for (int k = 0; k < 2 && !rc; k++) {
            const snug_param_entry *p = &m->table.e[gent[k]];
            float *at = gtab + (gent[1] == gent[0] ? 0 : (size_t)k * numel);
            if (k == 0 || gent[1] != gent[0])
                rc = entry_to_host(m, gent[k], at, e);
            out[nout++] = (snug_st_out){.name = gname[k], .dtype = SNUG_DT_F32, .ndim = 2, .f32 = at,
                                        .shape = {p->shape[0], p->shape[1]}};
        }
    }
    for (int i = 0; !rc && i < lo->table.n; i++) {
        const snug_param_entry *p = &lo->table.e[i];
        out[i] = (snug_st_out){.name = p->name, .dtype = SNUG_DT_F32, .ndim = p->ndim, .f32 = host + p->offset};
        out[i].shape[0] = p->shape[0];
        out[i].shape[1] = p->shape[1];
    }
    char path[4096];
    if (!rc) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        rc = snug_st_write(path, out, nout, NULL, e);
    }
    free(out);
    free(own);
    free(gtab);
    if (rc)
        return rc;
    json_t *targets = json_array();
    for (int k = 0; k < snug_lora_module_count(m->cfg.arch); k++)
        if (lc->targets & (1u << k))
            json_array_append_new(targets, json_string(target_name(m->cfg.arch, k)));
    int conv1d = snug_scheme_of(m->cfg.arch)->conv1d; /* PEFT's fan_in_fan_out */
    json_t *j = json_pack("{s:s, s:s, s:s, s:n, s:i, s:f, s:f, s:o, s:s, s:b, s:n, s:b, s:b, s:n, s:n, s:{}, s:{}}",
                          "peft_type", "LORA", "task_type", "CAUSAL_LM", "base_model_name_or_path",
                          base_name ? base_name : "", "revision", "r", lc->r, "lora_alpha", shortest(lc->alpha),
                          "lora_dropout", shortest(lc->dropout), "target_modules", targets, "bias", "none",
                          "fan_in_fan_out", conv1d, "modules_to_save", "init_lora_weights", 1,
                          "inference_mode", 1, "layers_to_transform", "layers_pattern", "rank_pattern",
                          "alpha_pattern");
    if (j && lc->init) /* adapters on a residual base stay relative to it, as PEFT saves them unconverted */
        json_object_set_new(j, "init_lora_weights", json_string(lc->init == SNUG_LORA_INIT_PISSA ? "pissa" : "olora"));
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

/* The adapter's grown table t (V, C) into the base's entry i, which must have its shape. */
static int load_grown_table(snug_model *m, const snug_st_set *s, const snug_st_tensor *t, int i, const char *path,
                            snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    if (t->ndim != 2 || t->shape[0] != p->shape[0] || t->shape[1] != p->shape[1])
        return snug_fail(e, SNUG_EINPUT, "%s: %s has shape [%lld, %lld], this model's %s [%lld, %lld]; the adapter "
                         "was trained on another vocabulary (give the run its special_tokens and tokens)", path,
                         t->name, (long long)t->shape[0], t->ndim == 2 ? (long long)t->shape[1] : 1LL, p->name,
                         (long long)p->shape[0], (long long)p->shape[1]);
    float *w = malloc(p->numel * sizeof *w);
    int rc = w ? snug_st_to_f32(s, t, w, 0, e) : snug_fail(e, SNUG_ENOMEM, "out of host memory reading %s", path);
    if (!rc)
        rc = snug_model_put_entry(m, i, w, e);
    free(w);
    return rc;
}

int snug_peft_load(snug_model *m, const char *dir, snug_error *e) {
    snug_lora_cfg want;
    SNUG_TRY(snug_peft_read_config(dir, m->cfg.arch, m->pp > 1 ? m->pp_L : m->cfg.n_layer, &want, e));
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
    /* a tensor snug would not use (an embedding adapter, a saved module) means the adapter is not what it seems; the
     * grown embedding and lm_head replace the resized base's */
    char gname[2][128];
    int gent[2], whole = grown_tables(m, 0, gname, gent);
    for (int i = 0; !rc && i < s.ntensors; i++) {
        int known = 0;
        for (int k = 0; k < lo->table.n && !known; k++)
            known = !strcmp(s.tensors[i].name, lo->table.e[k].name);
        for (int k = 0; k < 2 && whole && !known; k++)
            if (!strcmp(s.tensors[i].name, gname[k]) && (known = 1))
                rc = load_grown_table(m, &s, &s.tensors[i], gent[k], path, e);
        if (!known)
            rc = snug_fail(e, SNUG_EINPUT, "%s: tensor %s is not a LoRA A or B (or DoRA magnitude) of the modules "
                           "in adapter_config.json; snug does not load it", path, s.tensors[i].name);
    }
    if (!rc)
        m->be->to_device(m->be, lo->params, host, lo->table.total * sizeof *host);
    free(host);
    snug_st_close(&s);
    if (!rc) { /* PiSSA, OLoRA: the base as PEFT's initialisation leaves it under the adapter */
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        rc = snug_peft_residual(m, want.init, path, e);
    }
    return rc;
}
