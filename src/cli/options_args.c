/* options_args.c: the command line of snug train and snug plan: --key value / --key=value overrides over the YAML
 * (opt_set, snug_options_parse_args), then the other trainers' spellings resolved (options_compat.c), the
 * one path the public loaders share (a YAML file alone, snug_options_load_yaml, is resolved the same way); and
 * the flags of `snug plan` taken out of argv (snug_plan_flags_take). */
#include "cli/options_impl.h"

#include "cli/plan_cmd.h"

#include <string.h>

/* ---- command line ---- */

int opt_set(opt_state *st, const char *key, const char *value, const char *where, snug_error *e) {
    snug_run_config *o = st->run;
    char name[128];
    if (strlen(key) >= sizeof name)
        return opt_unknown_key(key, 0, where, e);
    for (size_t i = 0;; i++) { /* --learning-rate is --learning_rate */
        name[i] = key[i] == '-' ? '_' : key[i];
        if (!key[i])
            break;
    }
    const key_spec *k = opt_find_key(name, 0);
    if (!k)
        return opt_unknown_key(key, 0, where, e);
    if (k->later)
        return opt_refuse_later(k, key, value, !*value, where, e);
    if (k->noop)
        return opt_noop_value(k, key, value, !*value, where, e);
    if (k->type == KT_DATASETS)
        return opt_add_dataset_path(opt_list_of(o, k), value, "", where, e);
    if (k->type == KT_FSDP)
        return opt_fsdp_config_file(&st->al, value, where, e);
    if (k->type == KT_MAP || k->type == KT_LIST)
        return snug_fail(e, SNUG_EINPUT, "%s: %s is a %s; set it in the YAML config", where, key,
                         k->type == KT_MAP ? "mapping" : "list");
    if (!strcmp(k->name, "chat_template"))
        st->al.chat_template_set = 1;
    if (!strcmp(k->name, "lr_scheduler"))
        o->sched_min_lr = opt_sched_needs_floor(value);
    return opt_set_text(opt_field_base(st, k), k, key, value, where, e);
}

/* Steps over one argument at *i. Returns 1 for an option (key and value filled), 0 for a plain argument, or an
 * error code. */
static int next_arg(int argc, char **argv, int *i, char *key, size_t cap, const char **value, snug_error *e) {
    const char *a = argv[*i];
    if (a[0] != '-' || !a[1])
        return 0; /* "-" is a plain argument too */
    if (a[1] != '-' || !a[2])
        return snug_fail(e, SNUG_EINPUT, "command line: unknown option '%.60s'; options are written --key value", a);
    const char *eq = strchr(a + 2, '=');
    size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
    if (n >= cap)
        return snug_fail(e, SNUG_EINPUT, "command line: option '%.60s...' is too long", a);
    memcpy(key, a + 2, n);
    key[n] = '\0';
    if (eq) {
        *value = eq + 1;
        return 1;
    }
    const key_spec *k = opt_find_key(key, 0);
    int next_is_value = *i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0, b;
    if (k && k->type == KT_BOOL && (!next_is_value || opt_parse_bool(argv[*i + 1], &b))) { /* bare --flag: true */
        *value = "true";
        return 1;
    }
    if (*i + 1 >= argc)
        return snug_fail(e, SNUG_EINPUT, "command line: --%s needs a value: --%s VALUE or --%s=VALUE", key, key, key);
    *value = argv[++*i];
    return 1;
}
/* --dataset_type TYPE: the type (datasets[].type's values) of every file the command line gives with --dataset and
 * --test_datasets, wherever it stands among them; a YAML's entries name their own type. */
static int set_dataset_type(snug_run_config *o, const char *type, int cli_datasets, int cli_test, snug_error *e) {
    if (!cli_datasets && !cli_test)
        return snug_fail(e, SNUG_EINPUT, "command line: --dataset_type %.60s sets the type of the files given with "
                         "--dataset (or --test_datasets), and none is; add --dataset FILE.jsonl, or write the type "
                         "under each datasets entry of the YAML", type);
    const key_spec *tk = opt_find_key("type", SCOPE_DATASET);
    static const char *const lists[2] = {"datasets", "test_datasets"};
    const int given[2] = {cli_datasets, cli_test};
    for (int l = 0; l < 2; l++) {
        if (!given[l])
            continue;
        ds_list dl = opt_list_of(o, opt_find_key(lists[l], SCOPE_RUN));
        for (int i = 0; i < *dl.n; i++)
            SNUG_TRY(opt_set_text(&dl.d[i], tk, "--dataset_type", type, "command line", e));
    }
    return 0;
}

/* The one place a configuration is read and resolved: the config file (NULL for none), then argv's --key value
 * overrides in order, each into o or, for another trainer's spelling, into the aliases read beside it (which start
 * at their defaults: nothing of them is kept in o), then those spellings resolved into snug's own keys, once. o
 * changes only when all of it succeeds. */
static int parse(snug_run_config *o, const char *config, int argc, char **argv, snug_error *e) {
    snug_run_config tmp = *o;
    opt_state st = {.run = &tmp};
    opt_aliases_defaults(&st.al);
    char key[128];
    const char *value = NULL;
    if (config)
        SNUG_TRY(opt_load_yaml(&st, config, e));
    int cli_datasets = 0, cli_test = 0;
    const char *dataset_type = NULL;
    for (int i = 0; i < argc; i++) { /* then the overrides, in order */
        if (next_arg(argc, argv, &i, key, sizeof key, &value, e) != 1)
            continue;
        if (!strcmp(key, "dataset_type") || !strcmp(key, "dataset-type")) { /* applied once all are read */
            dataset_type = value;
            continue;
        }
        const key_spec *k = opt_find_key(key, 0);
        int *seen = k && !strcmp(k->name, "test_datasets") ? &cli_test : &cli_datasets;
        if (k && k->type == KT_DATASETS && (*seen)++ == 0)
            *opt_list_of(&tmp, k).n = 0; /* the command line's datasets replace the config's */
        SNUG_TRY(opt_set(&st, key, value, "command line", e));
    }
    if (dataset_type)
        SNUG_TRY(set_dataset_type(&tmp, dataset_type, cli_datasets, cli_test, e));
    SNUG_TRY(opt_apply_deepspeed(&st, e));
    SNUG_TRY(opt_apply_fsdp(&st, e));
    SNUG_TRY(opt_apply_aliases(&st, e));
    *o = tmp;
    return 0;
}

int snug_options_parse_args(snug_run_config *o, int argc, char **argv, snug_error *e) {
    char key[128];
    const char *value = NULL, *config = NULL;
    for (int i = 0; i < argc; i++) { /* first the config file, whatever its position */
        int rc = next_arg(argc, argv, &i, key, sizeof key, &value, e);
        if (rc < 0 || rc > 1)
            return rc;
        if (rc == 0 && config)
            return snug_fail(e, SNUG_EINPUT,
                             "command line: unexpected argument '%.100s' (the config is '%.100s'); give one config "
                             "file and --key value options",
                             argv[i], config);
        if (rc == 0)
            config = argv[i];
    }
    return parse(o, config, argc, argv, e);
}

int snug_options_load_yaml(snug_run_config *o, const char *path, snug_error *e) {
    return parse(o, path, 0, NULL, e);
}

/* ---- the flags of snug plan ---- */

int snug_plan_flags_take(snug_plan_args *a, int *argc, char **argv, snug_error *e) {
    snug_plan_args tmp;
    memset(&tmp, 0, sizeof tmp);
    opt_apply_defaults(&tmp, SCOPE_PLAN);
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        const char *arg = argv[i];
        char name[128];
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (strncmp(arg, "--", 2) != 0 || len - 2 >= sizeof name) {
            argv[n++] = argv[i];
            continue;
        }
        for (size_t k = 2; k <= len; k++) /* --tokens-per-s is --tokens_per_s */
            name[k - 2] = k == len ? '\0' : arg[k] == '-' ? '_' : arg[k];
        const key_spec *k = opt_find_key(name, SCOPE_PLAN);
        if (!k) { /* a configuration key: left for the options parser */
            argv[n++] = argv[i];
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        int b;
        if (!v && k->type == KT_BOOL && (i + 1 >= *argc || opt_parse_bool(argv[i + 1], &b)))
            v = "true"; /* a bare --json */
        if (!v) {
            if (i + 1 >= *argc || !strncmp(argv[i + 1], "--", 2))
                return snug_fail(e, SNUG_EINPUT, "command line: --%s needs a value: --%s VALUE", name, name);
            v = argv[++i];
        }
        char written[136];
        snprintf(written, sizeof written, "--%s", name);
        SNUG_TRY(opt_set_text(&tmp, k, written, v, "command line", e));
    }
    *a = tmp;
    *argc = n;
    return 0;
}

