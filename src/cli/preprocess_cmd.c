/* preprocess_cmd.c: `snug preprocess`: the datasets tokenized ahead of training, with a look at the mask (see
 * preprocess_cmd.h). The data is read by the trainer's own loader, so the cache filled here is the one training
 * reuses. */
#include "cli/preprocess_cmd.h"

#include <stdlib.h>
#include <string.h>

#include "cli/options.h"
#include "core/fileio.h"
#include "train/setup.h"

/* Examples of the whole store (every file, in file order, before the validation split). */
static size_t store_examples(const snug_setup *d) {
    size_t n = 0;
    for (int i = 0; i < d->drep.nsources; i++)
        n += (size_t)d->drep.src[i].examples;
    return n;
}

/* A growing line buffer. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        size_t nc = (b->n + k + 1) * 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

static void sb_int(sbuf *b, const char *sep, long long v) {
    char t[32];
    snprintf(t, sizeof t, "%s%lld", sep, v);
    sb_put(b, t);
}

static int dump(const char *path, const snug_setup *d, snug_error *e) {
    const snug_dataset *ds = &d->train;
    size_t total = store_examples(d);
    snug_atomic_file af;
    SNUG_TRY(snug_atomic_open(&af, path, NULL, e));
    sbuf b = {0};
    int rc = 0;
    for (size_t k = 0; k < total && !rc; k++) {
        uint64_t lo = ds->start[k], hi = ds->start[k + 1];
        b.n = 0;
        sb_put(&b, "{\"input_ids\": [");
        for (uint64_t t = lo; t < hi; t++)
            sb_int(&b, t > lo ? ", " : "", ds->ids[t]);
        sb_put(&b, "], \"labels\": [");
        for (uint64_t t = lo; t < hi; t++)
            sb_int(&b, t > lo ? ", " : "", ds->sup[t] ? ds->ids[t] : -100);
        sb_put(&b, "]}\n");
        if (b.oom) {
            snug_atomic_abort(&af);
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory writing %s", path);
        } else {
            rc = snug_atomic_write(&af, b.p, b.n, e);
        }
    }
    free(b.p);
    return rc ? rc : snug_atomic_commit(&af, e);
}

int snug_preprocess_cmd(int argc, char **argv, FILE *out, snug_error *e) {
    /* our own flags out, the rest is the config and --key value overrides as for `snug train` */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return snug_fail(e, SNUG_ENOMEM, "out of memory");
    int nrest = 0, debug = 0;
    const char *dump_path = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--debug")) {
            debug = 1;
        } else if (!strcmp(argv[i], "--dump") || !strncmp(argv[i], "--dump=", 7)) {
            dump_path = argv[i][6] == '=' ? argv[i] + 7 : i + 1 < argc ? argv[++i] : "";
            if (!*dump_path) {
                free(rest);
                return snug_fail(e, SNUG_EINPUT, "command line: --dump needs a file: --dump examples.jsonl");
            }
        } else {
            rest[nrest++] = argv[i];
        }
    }
    snug_run_config *o = calloc(1, sizeof *o);
    snug_setup *d = calloc(1, sizeof *d);
    int rc = !o || !d ? snug_fail(e, SNUG_ENOMEM, "out of memory") : 0;
    if (!rc) {
        snug_options_defaults(o);
        if (nrest == 0) { /* as `snug train`: no arguments at all is the built-in default job */
            char def[4096];
            snprintf(def, sizeof def, "%s/configs/default.yaml", SNUG_SOURCE_DIR);
            rc = snug_options_load_yaml(o, def, e);
        } else {
            rc = snug_options_parse_args(o, nrest, rest, e);
        }
    }
    if (!rc)
        rc = snug_run_config_validate_train(o, e);
    if (!rc)
        rc = snug_setup_model(d, o, e);
    if (!rc)
        rc = snug_setup_load_data(d, e);
    if (!rc) {
        uint64_t sup = 0;
        for (int i = 0; i < d->drep.nsources; i++)
            sup += d->drep.src[i].supervised;
        fprintf(out, "snug: preprocessed %zu examples, %zu tokens (%llu supervised) from %d file%s\n",
                store_examples(d), d->train.ntokens + d->val.ntokens, (unsigned long long)sup, d->c.ndatasets,
                d->c.ndatasets > 1 ? "s" : "");
        fprintf(out, "  %-20s %s\n", "tokenizer",
                d->tok_path[0] ? d->tok_path : "byte-level (256 bytes + end of text)");
        snug_data_report_print(out, "data files", &d->drep, d->dsrc, &d->dopts);
        if (d->c.ntest_datasets)
            snug_data_report_print(out, "validation files", &d->vrep, d->vsrc, &d->dopts);
        fprintf(out, "  %-20s training %zu examples, %zu tokens; validation %zu examples, %zu tokens\n", "split",
                d->train.nexamples, d->train.ntokens, d->val.nexamples, d->val.ntokens);
        if (debug)
            snug_setup_print_examples(out, d, 3);
        if (dump_path) {
            rc = dump(dump_path, d, e);
            if (!rc)
                fprintf(out, "wrote %zu examples to %s\n", store_examples(d), dump_path);
        }
    }
    if (d)
        snug_setup_free(d);
    free(d);
    free(o);
    free(rest);
    return rc;
}
