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
 * How adapter_config.json is read, key by key, is peft_config.c's. */
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
