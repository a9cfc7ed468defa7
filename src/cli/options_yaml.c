/* options_yaml.c: a YAML config file into snug_run_config (opt_load_yaml): each key of the document's
 * mapping found in the key table and applied, lists and mappings (datasets, special_tokens, roles, lr_scheduler_kwargs,
 * bnb_config_kwargs, unfrozen_parameters...) read entry by entry, errors naming the file and line. */
#include "cli/options_impl.h"

#include "data/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- YAML ---- */

static void where_line(char *loc, size_t cap, const yaml_src *y, const yaml_node_t *n) {
    snprintf(loc, cap, "%s line %lu", y->path, (unsigned long)n->start_mark.line + 1);
}

/* Applies a YAML value to one scalar key (either scope): null means the default. */
static int apply_scalar_node(void *base, const key_spec *k, const char *written, const yaml_src *y,
                             const yaml_node_t *v, const char *loc, snug_error *e) {
    char buf[320];
    if (k->later)
        return opt_refuse_later(k, written, v->type == YAML_SCALAR_NODE ? (const char *)v->data.scalar.value : NULL,
                            opt_node_is_empty(v), loc, e);
    if (k->noop)
        return opt_noop_value(k, written, v->type == YAML_SCALAR_NODE ? (const char *)v->data.scalar.value : NULL,
                          opt_node_is_null(v), loc, e);
    if (k->type == KT_NAMES && v->type == YAML_SEQUENCE_NODE) { /* [q_proj, v_proj] is "q_proj,v_proj" */
        char joined[1024] = "";
        size_t len = 0;
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
            const yaml_node_t *item = yaml_document_get_node(y->doc, *it);
            if (!item || item->type != YAML_SCALAR_NODE)
                return snug_fail(e, SNUG_EINPUT, "%s: %s must list names, got %s in the list", loc, written,
                                 item ? opt_node_kind(item) : "nothing");
            len += (size_t)snprintf(joined + len, len < sizeof joined ? sizeof joined - len : 0, "%s%s",
                                    len ? "," : "", (const char *)item->data.scalar.value);
        }
        if (len >= sizeof joined)
            return snug_fail(e, SNUG_EINPUT, "%s: %s lists too many names", loc, written);
        return opt_set_text(base, k, written, joined, loc, e);
    }
    if (v->type != YAML_SCALAR_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got %s", loc, written, opt_type_phrase(k, buf, sizeof buf),
                         opt_node_kind(v));
    if (opt_node_is_null(v))
        return opt_set_text(base, k, written, k->def ? k->def : "", loc, e);
    const char *text = opt_node_text(v, written, loc, e);
    return text ? opt_set_text(base, k, written, text, loc, e) : SNUG_EINPUT;
}

/* ---- keys that hold a mapping or a list (map_kind) ---- */

/* The text of a scalar entry `name` of a KT_MAP key, or NULL with e filled. */
static const char *entry_text(const yaml_node_t *v, const char *written, const char *name, const char *loc,
                              snug_error *e) {
    char what[192];
    snprintf(what, sizeof what, "%s.%s", written, name);
    if (v->type != YAML_SCALAR_NODE) {
        snug_fail(e, SNUG_EINPUT, "%s: %s must be a single value, got %s", loc, what, opt_node_kind(v));
        return NULL;
    }
    return opt_node_is_null(v) ? "" : opt_node_text(v, what, loc, e);
}

/* A list of tokens to add (tokens, special_tokens.additional_special_tokens) into dst (cap bytes), one per line. */
static int token_list(char *dst, size_t cap, const char *written, const yaml_src *y, const yaml_node_t *v,
                      const char *loc, snug_error *e) {
    size_t at = 0;
    dst[0] = '\0';
    if (v && v->type != YAML_SEQUENCE_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be a list, got %s", loc, written, opt_node_kind(v));
    for (yaml_node_item_t *it = v ? v->data.sequence.items.start : NULL; v && it < v->data.sequence.items.top; it++) {
        const yaml_node_t *item = yaml_document_get_node(y->doc, *it);
        int idx = (int)(it - v->data.sequence.items.start);
        char name[16];
        snprintf(name, sizeof name, "[%d]", idx);
        const char *text = item ? entry_text(item, written, name, loc, e) : NULL;
        if (!text)
            return e ? e->code : SNUG_EINPUT;
        if (!*text || strchr(text, '\n') || idx >= SNUG_TOK_MAX_ADD / 4)
            return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] is %s; write one token per item, at most %d", loc, written,
                             idx, idx >= SNUG_TOK_MAX_ADD / 4 ? "one too many" : *text ? "more than one line" :
                             "empty", SNUG_TOK_MAX_ADD / 4);
        if (at + strlen(text) + 2 > cap)
            return snug_fail(e, SNUG_EINPUT, "%s: %s is too long (at most %zu characters in all)", loc, written,
                             cap - 2);
        at += (size_t)snprintf(dst + at, cap - at, "%s%s", at ? "\n" : "", text);
    }
    return 0;
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
    if (opt_node_is_null(vn))
        return 0;
    if (vn->type != YAML_SEQUENCE_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s.llm_int8_skip_modules must be a list of module names, got %s", loc,
                         written, opt_node_kind(vn));
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
        if (opt_parse_bool(text, &b))
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
        if (opt_parse_double(text, &d) || !(d >= 0))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.llm_int8_threshold must be a number of 0 or more, got '%.40s'",
                             loc, written, text);
        return 0;
    }
    return snug_fail(e, SNUG_EINPUT, "%s: %s.%.40s is not an argument of BitsAndBytesConfig that snug reads "
                     "(load_in_4bit, load_in_8bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant, "
                     "bnb_4bit_compute_dtype, bnb_4bit_quant_storage, llm_int8_threshold, llm_int8_has_fp16_weight, "
                     "llm_int8_enable_fp32_cpu_offload, llm_int8_skip_modules)", loc, written, name);
}

/* One lr_scheduler_kwargs entry (transformers' scheduler_specific_kwargs `name` = text) into o (min_lr, and which
 * were written, into al: resolved against the schedule once every key is read). */
static int sched_kwarg(snug_run_config *o, opt_aliases *al, const char *written, const char *name, const char *text,
                       const char *loc, snug_error *e) {
    /* entry k is SNUG_SCHED_KW_*'s bit k, and where its number goes (words: none) */
    const struct {
        const char *name;
        double *d;
        int *i;
    } kw[] = {
        {"min_lr_rate", &o->cosine_min_lr_ratio, NULL}, {"min_lr", &al->min_lr, NULL},
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
    al->sched_given |= bit;
    if (bit & (SNUG_SCHED_KW_WARMUP_TYPE | SNUG_SCHED_KW_DECAY_TYPE)) {
        snug_wsd_shape *sh = bit == SNUG_SCHED_KW_WARMUP_TYPE ? &o->sched.wsd_warmup
                                                              : &o->sched.wsd_decay_type;
        if (!strcmp(text, "linear") || !strcmp(text, "cosine") || !strcmp(text, "1-sqrt"))
            *sh = !strcmp(text, "linear") ? SNUG_WSD_LINEAR : !strcmp(text, "cosine") ? SNUG_WSD_COSINE
                                                                                     : SNUG_WSD_1SQRT;
        else
            return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must be linear, cosine or 1-sqrt, got '%.40s'", loc,
                             written, name, text);
        return 0;
    }
    if (bit & (SNUG_SCHED_KW_MODE | SNUG_SCHED_KW_THRESHOLD_MODE)) { /* ReduceLROnPlateau's two words */
        int mode = bit == SNUG_SCHED_KW_MODE;
        const char *a = mode ? "min" : "rel", *b = mode ? "max" : "abs";
        if (strcmp(text, a) && strcmp(text, b))
            return snug_fail(e, SNUG_EINPUT, "%s: %s.%s must be %s or %s, got '%.40s'", loc, written, name, a,
                             b, text);
        *(mode ? &o->sched.plat_max : &o->sched.plat_abs) = !strcmp(text, b);
        return 0;
    }
    double d;
    if (!*text || opt_parse_double(text, &d) || !(d >= 0) || d > 1e9)
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
    return 0;
}

/* A KT_MAP or KT_LIST key of a kind snug reads (k->map): its entries into base (and al, for a run key). */
static int load_map_key(void *base, opt_aliases *al, const key_spec *k, const char *written, const yaml_src *y,
                        const yaml_node_t *v, const char *loc, snug_error *e) {
    if (opt_node_is_null(v))
        v = NULL; /* null: the defaults */
    int want_list = k->type == KT_LIST;
    if (v && v->type != (want_list ? YAML_SEQUENCE_NODE : YAML_MAPPING_NODE))
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got %s", loc, written, want_list ? "a list" : "a mapping",
                         opt_node_kind(v));
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
    case KM_UNFROZEN: { /* each item a pattern, into o->unfrozen; as written, joined by newlines (the record) */
        char *dst = (char *)base + k->offset;
        size_t at = 0;
        dst[0] = '\0';
        o->unfrozen.n = 0;
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
            snug_patterns_add(&o->unfrozen, text); /* (fits: as long as the joined text, with its NUL) */
        }
        return 0;
    }
    case KM_TOKENS:
        return token_list((char *)base + k->offset, k->size, written, y, v, loc, e);
    default:
        break;
    }
    if (k->map == KM_SPECIAL_TOKENS)
        o->pad_token[0] = o->eos_token[0] = o->bos_token[0] = o->unk_token[0] = o->extra_special[0] = '\0';
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
        if (k->map == KM_SPECIAL_TOKENS && !strcmp(name, "additional_special_tokens")) {
            SNUG_TRY(token_list(o->extra_special, sizeof o->extra_special, "special_tokens.additional_special_tokens",
                                y, opt_node_is_null(vn) ? NULL : vn, loc, e));
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
                                 "bos_token, unk_token and additional_special_tokens", loc, written, name);
            SNUG_TRY(entry_copy(fields[i], sizeof o->pad_token, text, written, name, loc, e));
            break;
        }
        case KM_CKPT_KWARGS: {
            int b;
            if (strcmp(name, "use_reentrant"))
                return snug_fail(e, SNUG_EINPUT, "%s: %s.%.40s is not supported; snug reads use_reentrant (true or "
                                 "false, the same gradients either way)", loc, written, name);
            if (*text && opt_parse_bool(text, &b))
                return snug_fail(e, SNUG_EINPUT, "%s: %s.use_reentrant must be true or false, got '%.40s'", loc,
                                 written, text);
            break;
        }
        case KM_BNB_KWARGS:
            SNUG_TRY(bnb_kwarg(o, written, name, text, loc, e));
            break;
        case KM_SCHED_KWARGS:
            SNUG_TRY(sched_kwarg(o, al, written, name, text, loc, e));
            break;
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

/* Reads the keys of one mapping (the whole config, or one datasets entry) into base, and another trainer's spelling
 * into al (NULL for a datasets entry, whose keys are all the entry's). */
static int load_mapping(void *base, opt_aliases *al, const yaml_src *y, const yaml_node_t *map, const char *what,
                        snug_error *e);

static int load_dataset_entry(ds_list l, int index, const yaml_src *y, const yaml_node_t *item, snug_error *e) {
    char loc[1200], what[64];
    where_line(loc, sizeof loc, y, item);
    if (*l.n >= SNUG_MAX_DATASETS)
        return snug_fail(e, SNUG_EINPUT, "%s: more than %d %s; merge some JSONL files", loc, SNUG_MAX_DATASETS,
                         l.key);
    if (item->type == YAML_SCALAR_NODE) { /* "- data.jsonl" is short for "- path: data.jsonl" */
        const char *text = opt_node_text(item, l.key, loc, e);
        return text ? opt_add_dataset_path(l, text, y->dir, loc, e) : SNUG_EINPUT;
    }
    if (item->type != YAML_MAPPING_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] must be a mapping such as 'path: data.jsonl', got a list", loc,
                         l.key, index);
    snug_dataset_spec ds;
    memset(&ds, 0, sizeof ds);
    opt_apply_defaults(&ds, 1);
    snprintf(what, sizeof what, "%s[%d]", l.key, index);
    SNUG_TRY(load_mapping(&ds, NULL, y, item, what, e));
    if (!ds.path[0])
        return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] has no path; add 'path: data.jsonl'", loc, l.key, index);
    SNUG_TRY(opt_add_dataset_path(l, ds.path, y->dir, loc, e));
    snug_dataset_spec *d = &l.d[*l.n - 1];
    snprintf(ds.path, sizeof ds.path, "%s", d->path); /* joined to the file's folder */
    *d = ds;
    return 0;
}

static int load_datasets(ds_list l, const char *written, const yaml_src *y, const yaml_node_t *v, const char *loc,
                         snug_error *e) {
    *l.n = 0;
    if (opt_node_is_null(v))
        return 0;
    if (v->type == YAML_SCALAR_NODE) { /* "datasets: data.jsonl": one completion dataset */
        const char *text = opt_node_text(v, written, loc, e);
        return text ? opt_add_dataset_path(l, text, y->dir, loc, e) : SNUG_EINPUT;
    }
    if (v->type == YAML_MAPPING_NODE)
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be a list; write each dataset as '- path: data.jsonl'", loc,
                         written);
    int index = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++, index++)
        SNUG_TRY(load_dataset_entry(l, index, y, yaml_document_get_node(y->doc, *it), e));
    return 0;
}

static int load_mapping(void *base, opt_aliases *al, const yaml_src *y, const yaml_node_t *map, const char *what,
                        snug_error *e) {
    int dataset_scope = al == NULL;
    unsigned long seen[OPT_MAX_KEYS] = {0}; /* line where each key was set, to catch a key given twice */
    const char *seen_as[OPT_MAX_KEYS] = {0};
    char loc[1300];
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(y->doc, pr->key), *v = yaml_document_get_node(y->doc, pr->value);
        unsigned long line = (unsigned long)kn->start_mark.line + 1;
        if (*what)
            snprintf(loc, sizeof loc, "%s in %s line %lu", what, y->path, line);
        else
            snprintf(loc, sizeof loc, "%s line %lu", y->path, line);
        if (kn->type != YAML_SCALAR_NODE)
            return snug_fail(e, SNUG_EINPUT, "%s: a key must be a plain name, got %s", loc, opt_node_kind(kn));
        const char *name = (const char *)kn->data.scalar.value;
        const key_spec *k = opt_find_key(name, dataset_scope);
        if (!k)
            return opt_unknown_key(name, dataset_scope, loc, e);
        int ki = (int)(k - opt_keys);
        if (seen[ki])
            return snug_fail(e, SNUG_EINPUT, "%s: %s is set twice (as %s on line %lu); keep one", loc, name,
                             seen_as[ki], seen[ki]);
        seen[ki] = line;
        seen_as[ki] = name;
        if (k->type == KT_DATASETS && !k->later)
            SNUG_TRY(load_datasets(opt_list_of(base, k), name, y, v, loc, e));
        else if (k->type == KT_FSDP)
            SNUG_TRY(opt_load_fsdp_config(al, name, y, v, loc, e));
        else if ((k->type == KT_MAP || k->type == KT_LIST) && !k->later)
            SNUG_TRY(load_map_key(base, al, k, name, y, v, loc, e));
        else
            SNUG_TRY(apply_scalar_node(k->alias ? (void *)al : base, k, name, y, v, loc, e));
        if (dataset_scope && !strcmp(k->name, "chat_template"))
            ((snug_dataset_spec *)base)->chat_template_own = 1;
        if (dataset_scope && !strcmp(k->name, "type") && v->type == YAML_SCALAR_NODE)
            ((snug_dataset_spec *)base)->type_chat_template = !strcmp((const char *)v->data.scalar.value,
                                                                      "chat_template");
        if (!dataset_scope && !strcmp(k->name, "chat_template"))
            al->chat_template_set = 1;
        if (!dataset_scope && !strcmp(k->name, "lr_scheduler") && v->type == YAML_SCALAR_NODE)
            ((snug_run_config *)base)->sched_min_lr = opt_sched_needs_floor((const char *)v->data.scalar.value);
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

static int load_document(snug_run_config *o, opt_aliases *al, yaml_src *y, snug_error *e) {
    yaml_node_t *root = yaml_document_get_root_node(y->doc);
    if (!root || opt_node_is_null(root)) /* an empty file keeps every default */
        return 0;
    if (root->type != YAML_MAPPING_NODE) {
        char loc[1200];
        where_line(loc, sizeof loc, y, root);
        return snug_fail(e, SNUG_EINPUT, "%s: the config must be 'key: value' lines, got %s", loc,
                         root->type == YAML_SEQUENCE_NODE ? "a list" : "a single value");
    }
    return load_mapping(o, al, y, root, "", e);
}

int opt_load_yaml(opt_state *st, const char *path, snug_error *e) {
    const snug_run_config *o = st->run;
    snug_run_config tmp = *o; /* st changes only when the whole file is good */
    opt_aliases al = st->al;
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
        rc = load_document(&tmp, &al, &y, e);
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
    /* like dataset paths, a relative tokenizer path written in the file is the current directory's (Axolotl's
     * reading), else the file's folder's */
    if (rc == 0 && tmp.tokenizer[0] && opt_path_from_file(tmp.tokenizer, y.dir) &&
        strcmp(tmp.tokenizer, o->tokenizer)) {
        char joined[sizeof tmp.tokenizer];
        if (snprintf(joined, sizeof joined, "%s/%s", y.dir, tmp.tokenizer) >= (int)sizeof joined)
            rc = snug_fail(e, SNUG_EINPUT, "%s: tokenizer path is too long", path);
        else
            memcpy(tmp.tokenizer, joined, sizeof joined);
    }
    if (rc == 0) {
        *st->run = tmp;
        st->al = al;
    }
    return rc;
}

