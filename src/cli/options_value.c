/* options_value.c: one key's value from text (see options_impl.h): finding a key by any of its spellings (with the
 * "did you mean" suggestion), strict numbers, booleans, sizes and enum spellings, storing a value in its field, the
 * refusal of keys not supported yet, and the defaults; a YAML node's kind and text. The YAML reader and the command
 * line both come through here. */
#include "cli/options_impl.h"

#include "cli/plan_cmd.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---- YAML nodes: what a value is, and its text (the YAML reader and fsdp_config's both read them) ---- */

int opt_node_is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

int opt_node_is_empty(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return n->data.scalar.length == 0 || opt_node_is_null(n);
    case YAML_SEQUENCE_NODE: return n->data.sequence.items.top == n->data.sequence.items.start;
    case YAML_MAPPING_NODE: return n->data.mapping.pairs.top == n->data.mapping.pairs.start;
    default: return 1;
    }
}

const char *opt_node_kind(const yaml_node_t *n) {
    return n->type == YAML_SEQUENCE_NODE ? "a list" : n->type == YAML_MAPPING_NODE ? "a mapping" : "a value";
}

/* The text of a scalar node, or NULL (with e filled) when it holds a NUL byte that C strings would cut short. */
const char *opt_node_text(const yaml_node_t *n, const char *written, const char *loc, snug_error *e) {
    const char *s = (const char *)n->data.scalar.value;
    if (strlen(s) != n->data.scalar.length) {
        snug_fail(e, SNUG_EINPUT, "%s: %s contains a NUL character; remove it", loc, written);
        return NULL;
    }
    return s;
}

/* ---- small helpers ---- */

/* Whether the first wlen bytes of w are one of the space-separated words of list. */
/* Whether lr_scheduler written as s needs its floor given (transformers raises without one) */
int opt_sched_needs_floor(const char *s) {
    return !strcmp(s, "cosine_with_min_lr") || !strcmp(s, "cosine_warmup_with_min_lr");
}

int opt_word_matches(const char *list, const char *w, size_t wlen) {
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

int opt_in_list(const char *list, const char *w) { return opt_word_matches(list, w, strlen(w)); }

static int key_answers_to(const key_spec *k, const char *name) {
    return strcmp(k->name, name) == 0 || (k->aliases && opt_in_list(k->aliases, name));
}

int opt_scope_of(const key_spec *k) {
    return k->group == G_DATASET ? SCOPE_DATASET : k->group == G_PLAN ? SCOPE_PLAN : SCOPE_RUN;
}

const key_spec *opt_find_key(const char *name, int scope) {
    for (int i = 0; i < opt_nkeys; i++)
        if (opt_scope_of(&opt_keys[i]) == scope && key_answers_to(&opt_keys[i], name))
            return &opt_keys[i];
    return NULL;
}

/* Case-insensitive Levenshtein distance; long inputs are clipped (a suggestion for them would be a guess anyway). */
int opt_edit_distance(const char *a, const char *b) {
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
    for (int i = 0; i < opt_nkeys; i++) {
        const key_spec *k = &opt_keys[i];
        if (opt_scope_of(k) != scope)
            continue;
        int d = opt_edit_distance(name, k->name);
        if (d < best) {
            best = d;
            snprintf(buf, cap, "%s", k->name);
        }
        for (const char *p = k->aliases; p && *p;) {
            size_t n = strcspn(p, " ");
            char alias[96];
            snprintf(alias, sizeof alias, "%.*s", (int)n, p);
            d = opt_edit_distance(name, alias);
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

int opt_unknown_key(const char *name, int scope, const char *loc, snug_error *e) {
    char buf[96];
    const char *s = closest_key(name, scope, buf, sizeof buf);
    if (s)
        return snug_fail(e, SNUG_EINPUT, "unknown key '%.100s' in %s: did you mean '%s'?", name, loc, s);
    return snug_fail(e, SNUG_EINPUT, "unknown key '%.100s' in %s: `snug train --help` lists the keys", name, loc);
}

/* ---- parsing one value ---- */

/* Strict decimal or scientific number; rejects hex, inf, nan, trailing text and empty input. */
int opt_parse_double(const char *s, double *out) {
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
int opt_parse_int(const char *s, int *out) {
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
    if (opt_parse_double(s, &d) || d != floor(d))
        return -1;
    if (d < INT_MIN || d > INT_MAX)
        return -2;
    *out = (int)d;
    return 0;
}

int opt_parse_bool(const char *s, int *out) {
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
    if (opt_parse_double(num, &v) || v < 0)
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
int opt_enum_value(const char *values, const char *s, char *canon, size_t cap) {
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
void opt_enum_choices(const char *values, const char *sep, int all_spellings, char *out, size_t cap) {
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

const char *opt_type_phrase(const key_spec *k, char *buf, size_t cap) {
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
        opt_enum_choices(k->values, ", ", 0, choices, sizeof choices);
        snprintf(buf, cap, "one of %s", choices);
        return buf;
    }
    }
    return "?";
}

/* Sets one supported scalar key from text. base is snug_run_config, or snug_dataset_spec for G_DATASET keys. Writes
 * nothing on failure. `written` is the key as the user spelled it, so the message names what they wrote. */
int opt_set_text(void *base, const key_spec *k, const char *written, const char *text, const char *loc,
                    snug_error *e) {
    char *field = (char *)base + k->offset, buf[320];
    switch (k->type) {
    case KT_INT: {
        int v, rc = opt_parse_int(text, &v);
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
        if (k->positive && (opt_parse_double(text, &v) || v <= 0))
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be a positive number such as %s, got '%.60s'", loc,
                             written, k->example, text);
        if (opt_parse_double(text, &v))
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be a number such as 0.5 or 3e-4, got '%.60s'", loc,
                             written, text);
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case KT_SIZE: {
        double v;
        if (parse_size(text, &v))
            return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got '%.60s'", loc, written,
                             opt_type_phrase(k, buf, sizeof buf), text);
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case KT_BOOL: {
        int v;
        char canon[16];
        /* a boolean may take extra spellings from `values` (bf16: auto, Axolotl's "when the hardware has it") */
        int extra = k->values && opt_enum_value(k->values, text, canon, sizeof canon) == 0 && opt_parse_bool(canon, &v) == 0;
        if (!extra && opt_parse_bool(text, &v))
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
        if (k->values && opt_enum_value(k->values, text, canon, sizeof canon) == 0)
            text = canon;
        if (strlen(text) >= k->size)
            return snug_fail(e, SNUG_EINPUT, "%s: %s is too long (%zu characters; at most %zu)", loc, written,
                             strlen(text), k->size - 1);
        if (k->typed)
            SNUG_TRY(k->typed(base, text, written, loc, e));
        memcpy(field, text, strlen(text) + 1);
        return 0;
    }
    case KT_ENUM: {
        char canon[64];
        int spelled = opt_enum_value(k->values, text, canon, sizeof canon) == 0; /* canon: the spelling's name */
        for (const enum_name *n = k->enums; spelled && n && n->name; n++)
            if (!strcmp(n->name, canon)) {
                memcpy(field, &n->value, sizeof n->value);
                return 0;
            }
        if (spelled && k->names)
            for (int i = 0; k->names[i]; i++)
                if (!strcmp(k->names[i], canon)) {
                    memcpy(field, &i, sizeof i);
                    return 0;
                }
        char choices[256];
        opt_enum_choices(k->values, ", ", 0, choices, sizeof choices);
        if (k->later_values && (strcmp(k->later_values, "*") == 0 || opt_in_list(k->later_values, text)))
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
int opt_refuse_later(const key_spec *k, const char *written, const char *text, int nothing, const char *loc,
                        snug_error *e) {
    int b = 0;
    char canon[8] = "";
    if (text && k->type == KT_BOOL && opt_parse_bool(text, &b) == 0) /* a bool's `off` holds true or false */
        snprintf(canon, sizeof canon, "%s", b ? "true" : "false");
    if (nothing || (canon[0] && (k->off ? opt_in_list(k->off, canon) : !b)) ||
        (text && k->off && !canon[0] && opt_in_list(k->off, text)))
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
int opt_noop_value(const key_spec *k, const char *written, const char *text, int null, const char *loc,
                      snug_error *e) {
    int b, i;
    double d;
    if (null || !text)
        return 0;
    if ((k->type == KT_BOOL && opt_parse_bool(text, &b)) || (k->type == KT_INT && opt_parse_int(text, &i)) ||
        (k->type == KT_FLOAT && opt_parse_double(text, &d)))
        return snug_fail(e, SNUG_EINPUT, "%s: %s must be %s, got '%.60s'", loc, written,
                         k->type == KT_BOOL ? "true or false" : k->type == KT_INT ? "an integer" : "a number", text);
    return 0;
}

/* Sets every key of one scope to its default (SCOPE_ALIAS: the run keys whose field is in opt_aliases). */
void opt_apply_defaults(void *base, int scope) {
    for (int i = 0; i < opt_nkeys; i++) {
        const key_spec *k = &opt_keys[i];
        if ((k->alias ? SCOPE_ALIAS : opt_scope_of(k)) != scope || k->later || k->noop || k->type == KT_DATASETS)
            continue;
        if (k->def)
            opt_set_text(base, k, k->name, k->def, "default", NULL);
        else if (k->type == KT_STRING)
            ((char *)base)[k->offset] = '\0';
    }
}

/* The settings a resume must keep: the keys the table marks fixed, listed once. */
static const snug_fixed_setting *fixed_settings(int *n) {
    static snug_fixed_setting list[OPT_MAX_KEYS];
    static int count = -1;
    if (count < 0) {
        int c = 0;
        for (int i = 0; i < opt_nkeys; i++) {
            const key_spec *k = &opt_keys[i];
            if (!k->fixed)
                continue;
            snug_setting_kind kind = k->type == KT_FLOAT || k->type == KT_SIZE ? SNUG_SETTING_REAL
                                     : k->type == KT_INT || k->type == KT_BOOL || k->type == KT_ENUM
                                         ? SNUG_SETTING_INT
                                         : SNUG_SETTING_TEXT;
            list[c++] = (snug_fixed_setting){.name = k->fixed, .kind = kind, .offset = k->offset,
                                             .absent = k->fixed_absent};
        }
        count = c;
    }
    *n = count;
    return list;
}

void snug_options_defaults(snug_run_config *o) {
    memset(o, 0, sizeof *o);
    opt_apply_defaults(o, 0);
    o->fixed = fixed_settings(&o->nfixed);
    snug_sched_params_default(&o->sched);
}

void opt_aliases_defaults(opt_aliases *al) {
    memset(al, 0, sizeof *al);
    opt_apply_defaults(al, SCOPE_ALIAS);
    al->fsdp_config_stage = -2;
    al->fsdp_activation_checkpointing = -1;
    al->min_lr = -1;
}

ds_list opt_list_of(snug_run_config *o, const key_spec *k) {
    if (!strcmp(k->name, "test_datasets"))
        return (ds_list){o->test_datasets, &o->ntest_datasets, "test_datasets"};
    return (ds_list){o->datasets, &o->ndatasets, "datasets"};
}

/* A relative path written in a config file: as Axolotl takes it, relative to the current directory, when it is
 * there; else relative to the file's folder dir (snug's own reading, where Axolotl would find nothing). */
int opt_path_from_file(const char *path, const char *dir) {
    return *dir && path[0] != '/' && access(path, F_OK) != 0;
}

/* Adds a completion dataset; a relative path is taken relative to dir ("" = keep it as written). */
int opt_add_dataset_path(ds_list l, const char *path, const char *dir, const char *loc, snug_error *e) {
    if (*l.n >= SNUG_MAX_DATASETS)
        return snug_fail(e, SNUG_EINPUT, "%s: more than %d %s; merge some JSONL files", loc, SNUG_MAX_DATASETS,
                         l.key);
    if (!*path)
        return snug_fail(e, SNUG_EINPUT, "%s: a dataset path is empty; give a JSONL file", loc);
    snug_dataset_spec ds;
    memset(&ds, 0, sizeof ds);
    opt_apply_defaults(&ds, 1);
    int n = opt_path_from_file(path, dir) ? snprintf(ds.path, sizeof ds.path, "%s/%s", dir, path)
                                   : snprintf(ds.path, sizeof ds.path, "%s", path);
    if (n < 0 || (size_t)n >= sizeof ds.path)
        return snug_fail(e, SNUG_EINPUT, "%s: dataset path '%.60s...' is too long (at most %zu characters)", loc,
                         path, sizeof ds.path - 1);
    l.d[(*l.n)++] = ds;
    return 0;
}

