/* options_compat.c: other trainers' spellings of what snug's own keys say, resolved once every key is read:
 * fsdp_config (a mapping or Hugging Face's JSON file), fsdp, DeepSpeed's ds_config.json, and the aliases of Axolotl
 * and transformers (attention keys, report_to, lr_scheduler_kwargs' floors, save/eval strategies,
 * activation_offloading...). */
#include "cli/options_impl.h"

#include <ctype.h>
#include <limits.h>
#include <string.h>
#include <strings.h>
#include <jansson.h>

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
        int d = opt_edit_distance(key, fsdp_keys[i].name);
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
    int b = 0, isbool = opt_parse_bool(v->text, &b) == 0;
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
        if (opt_parse_int(v->text, &c) || c < 0)
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
static int fsdp_store(opt_aliases *al, const fsdp_read *r, const char *loc, snug_error *e) {
    if (r->strategy >= 0 && r->reshard >= 0 && r->strategy != r->reshard)
        return snug_fail(e, SNUG_EINPUT, "%s: fsdp_config's sharding_strategy means ZeRO stage %d but its "
                         "reshard_after_forward means stage %d; keep one", loc, r->strategy, r->reshard);
    al->fsdp_config_stage = r->strategy >= 0 ? r->strategy : r->reshard;
    al->fsdp_activation_checkpointing = r->ckpt;
    al->fsdp_offload_params = r->offload;
    return 0;
}

/* fsdp_config as a JSON file (Hugging Face's --fsdp_config FILE). An empty path clears it. */
int opt_fsdp_config_file(opt_aliases *al, const char *path, const char *where, snug_error *e) {
    al->fsdp_config_stage = -2;
    al->fsdp_activation_checkpointing = -1;
    al->fsdp_offload_params = 0;
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
        rc = fsdp_store(al, &r, loc, e);
    json_decref(j);
    return rc;
}

/* fsdp_config in the YAML: a mapping, or a JSON file's path. */
int opt_load_fsdp_config(opt_aliases *al, const char *written, const yaml_src *y, const yaml_node_t *v,
                            const char *loc, snug_error *e) {
    if (opt_node_is_empty(v)) /* asks for nothing */
        return opt_fsdp_config_file(al, "", loc, e);
    if (v->type == YAML_SCALAR_NODE) {
        const char *text = opt_node_text(v, written, loc, e);
        return text ? opt_fsdp_config_file(al, text, loc, e) : SNUG_EINPUT;
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
                             opt_node_kind(kn));
        fsdp_value fv = {.null = opt_node_is_null(vn), .list = vn->type == YAML_SEQUENCE_NODE,
                         .map = vn->type == YAML_MAPPING_NODE};
        if (vn->type == YAML_SCALAR_NODE && !fv.null && !(fv.text = opt_node_text(vn, written, here, e)))
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
    return fsdp_store(al, &r, loc, e);
}


/* deepspeed: ds_config.json. Its zero_optimization.stage means what zero_stage means, so it sets it (a zero_stage
 * given too must agree), and so does its overlap_comm for zero_overlap_comm; stages not built and offloading to the
 * CPU or NVMe are refused naming the file's key. */
int opt_apply_deepspeed(opt_state *state, snug_error *e) {
    snug_run_config *o = state->run;
    const char *ds = state->al.deepspeed;
    if (!ds[0])
        return 0;
    json_error_t je;
    json_t *j = json_load_file(ds, 0, &je);
    if (!j)
        return snug_fail(e, SNUG_EINPUT, "deepspeed: %s line %d: %s; give DeepSpeed's ds_config.json (JSON)",
                         ds, je.line, je.text);
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
int opt_apply_fsdp(opt_state *st, snug_error *e) {
    snug_run_config *o = st->run;
    opt_aliases *al = &st->al;
    if (al->fsdp_version > 2)
        return snug_fail(e, SNUG_EINPUT, "fsdp_version is %d; it must be 1 or 2 (both shard the same way in snug)",
                         al->fsdp_version);
    int stage = -1, on = -1; /* on: fsdp: true or false */
    for (const char *p = al->fsdp; *p;) {
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
            al->fsdp_offload_params = 1;
        else if (k && !(k == 9 && !strncmp(p, "auto_wrap", k)))
            return snug_fail(e, SNUG_EINPUT, "fsdp: '%.*s' is not supported; snug takes full_shard, shard_grad_op, "
                             "no_shard, auto_wrap, offload, or true with the strategy in fsdp_config (hybrid "
                             "sharding is not built yet)", (int)k, p);
        p += k;
        p += strspn(p, ", ");
    }
    int cs = al->fsdp_config_stage;
    if (on == 0)
        return stage >= 0 || cs > -2 ? snug_fail(e, SNUG_EINPUT, "fsdp is false but %s; remove one",
                                                 stage >= 0 ? "it names a sharding strategy too"
                                                            : "fsdp_config is given")
                                     : 0;
    if (stage >= 0 && cs >= 0 && stage != cs)
        return snug_fail(e, SNUG_EINPUT, "fsdp (%s) means ZeRO stage %d but fsdp_config's sharding means stage %d; "
                         "keep one", al->fsdp, stage, cs);
    if (stage < 0)
        stage = cs;
    int fsdp_on = stage >= 0 || cs == -1 || on == 1;
    if (!fsdp_on)
        return 0;
    if (stage < 0) /* FSDP's default strategy, FULL_SHARD, unless zero_stage says otherwise */
        stage = o->zero_stage ? o->zero_stage : 3;
    if (o->zero_stage && o->zero_stage != stage) {
        if (al->fsdp[0])
            return snug_fail(e, SNUG_EINPUT, "zero_stage is %d but fsdp (%s) means stage %d; keep one", o->zero_stage,
                             al->fsdp, stage);
        return snug_fail(e, SNUG_EINPUT, "zero_stage is %d but fsdp_config means stage %d; keep one", o->zero_stage,
                         stage);
    }
    o->zero_stage = stage;
    if (al->fsdp_offload_params)
        o->offload_params = 1;
    if (al->fsdp_activation_checkpointing == 1 && o->gradient_checkpointing == SNUG_CKPT_CHOICE_NONE)
        o->gradient_checkpointing = SNUG_CKPT_CHOICE_FULL;
    return 0;
}

/* Keys that say what other keys say (Axolotl's and transformers' spellings), resolved once every key is read, in
 * whatever order they were written: the config-wide chat template for the chat entries that name none, the
 * attention keys as flash_attention, activation_offloading as gradient_checkpointing: offload. */
int opt_apply_aliases(opt_state *st, snug_error *e) {
    snug_run_config *o = st->run;
    const opt_aliases *al = &st->al;
    const char *src = o->config_path[0] ? o->config_path : "options";
    /* chat_template_jinja alone says chat_template: jinja */
    if (o->chat_template_jinja[0] && !al->chat_template_set)
        o->chat_template = SNUG_CHAT_JINJA;
    for (int i = 0; i < o->ndatasets + o->ntest_datasets; i++) {
        snug_dataset_spec *d = (snug_dataset_spec *)snug_run_dataset(o, i, NULL); /* o's own entries */
        /* Axolotl's type chat_template with no template named renders with the tokenizer's own (tokenizer_default,
         * an error when it has none); type chat falls back to chatml */
        if (d->type_chat_template && !d->chat_template_own && !al->chat_template_set && !o->chat_template_jinja[0])
            d->chat_template = SNUG_CHAT_TOKENIZER;
        else if (!d->chat_template_own)
            d->chat_template = o->chat_template;
    }
    const char *fused = al->attn_sdp ? "sdp_attention: true" : al->attn_xformers ? "xformers_attention: true" : NULL;
    if (al->attn_implementation == 0 && fused)
        return snug_fail(e, SNUG_EINPUT, "%s: attn_implementation: eager and %s ask for two kinds of attention; "
                         "remove one", src, fused);
    if (al->attn_implementation == 0) {
        o->flash_attention = 0;
    } else if ((al->attn_implementation == 1 || fused) && !o->flash_attention) {
        return snug_fail(e, SNUG_EINPUT, "%s: flash_attention: false (the probabilities stored) and %s (fused "
                         "attention) disagree; remove one", src, fused ? fused : "attn_implementation");
    }
    /* report_to: the trackers snug writes for (a list, or one name; all means every one snug has) */
    for (const char *p = al->report_to; *p;) {
        size_t n = strcspn(p, ", ");
        if (n && !opt_word_matches("none tensorboard all", p, n))
            return snug_fail(e, SNUG_EINPUT, "%s: report_to '%.*s' is not supported yet (snug writes metrics.jsonl, "
                             "and TensorBoard's event files with report_to: tensorboard); remove it", src, (int)n, p);
        if (n && (opt_word_matches("tensorboard all", p, n)))
            o->use_tensorboard = 1;
        p += n;
        p += strspn(p, ", ");
    }
    if (al->min_lr >= 0 && o->lr_scheduler == SNUG_SCHED_PLATEAU) { /* ReduceLROnPlateau's floor */
        o->sched.plat_min_lr = al->min_lr;
    } else if (al->min_lr >= 0) { /* cosine_with_min_lr's floor as a learning rate */
        if (o->learning_rate <= 0 || al->min_lr > o->learning_rate)
            return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler_kwargs.min_lr is %g, above learning_rate %g; the floor "
                             "must be at most the peak", src, al->min_lr, o->learning_rate);
        o->cosine_min_lr_ratio = al->min_lr / o->learning_rate;
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
        if (takes[i].s == o->lr_scheduler && (al->sched_given & ~takes[i].keys))
            return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler_kwargs has a setting lr_scheduler %s does not take; "
                             "it takes %s", src, snug_sched_name(o->lr_scheduler), takes[i].names);
    if (o->lr_scheduler == SNUG_SCHED_WSD && !(al->sched_given & SNUG_SCHED_KW_DECAY_STEPS))
        return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler warmup_stable_decay needs its decay steps: "
                         "lr_scheduler_kwargs: {num_decay_steps: 100}", src);
    if (o->lr_scheduler == SNUG_SCHED_POLYNOMIAL && !(o->sched.lr_end < o->learning_rate))
        return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler_kwargs.lr_end is %g, not below learning_rate %g; the "
                         "polynomial decays from learning_rate down to lr_end", src, o->sched.lr_end,
                         o->learning_rate);
    if (o->sched_min_lr && o->cosine_min_lr_ratio == 0 &&
        !(al->sched_given & (SNUG_SCHED_KW_MIN_LR_RATE | SNUG_SCHED_KW_MIN_LR)))
        return snug_fail(e, SNUG_EINPUT, "%s: lr_scheduler %s needs its floor: lr_scheduler_kwargs: {min_lr_rate: 0.1} "
                         "(or min_lr, or cosine_min_lr_ratio)", src,
                         o->lr_scheduler == SNUG_SCHED_COSINE_WARMUP_MIN ? "cosine_warmup_with_min_lr"
                                                                         : "cosine_with_min_lr");
    if (al->use_cpu)
        o->device = SNUG_BACKEND_CPU;
    if (al->full_determinism)
        o->ddp_deterministic = 1;
    if (al->liger_flce)
        o->chunked_cross_entropy = 1;
    /* Hugging Face's strategies: steps without a count take the Trainer's defaults */
    if (o->save_strategy == 1 && !o->save_steps && !o->saves_per_epoch)
        o->save_steps = 500;
    if (o->eval_strategy == 1 && !o->eval_steps && !o->evals_per_epoch)
        o->eval_steps = o->logging_steps;
    if (al->activation_offloading) {
        if (o->gradient_checkpointing == SNUG_CKPT_CHOICE_SELECTIVE)
            return snug_fail(e, SNUG_EINPUT, "%s: activation_offloading keeps whole layers' inputs in host memory, "
                             "which selective checkpointing does not recompute from; set gradient_checkpointing: true "
                             "(or offload)", src);
        o->gradient_checkpointing = SNUG_CKPT_CHOICE_OFFLOAD;
    }
    return 0;
}

