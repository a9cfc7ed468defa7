/* dataset.c: JSONL examples, tokenization on all cores, validation split, concatenate-and-chunk batches. */
#include "data/dataset.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int byte_encode(const void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                       snug_error *e) {
    (void)ctx;
    if (*n + len > *cap) {
        size_t nc = (*n + len) * 2 + 16;
        int32_t *p = realloc(*ids, nc * sizeof *p);
        if (!p)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory tokenizing");
        *ids = p;
        *cap = nc;
    }
    for (size_t i = 0; i < len; i++)
        (*ids)[(*n)++] = (unsigned char)text[i];
    return 0;
}

snug_encoder snug_byte_encoder(void) {
    return (snug_encoder){.ctx = NULL, .encode = byte_encode, .vocab_size = 257, .bos_id = -1, .eos_id = 256};
}

typedef struct line_ref {
    char *text;   /* the extracted field, malloc'd */
    size_t len;
    int32_t *ids; /* tokenized */
    size_t n, cap;
    size_t lineno;
} line_ref;

static int append_id(line_ref *L, int32_t id, snug_error *e) {
    if (L->n + 1 > L->cap) {
        size_t nc = L->cap * 2 + 16;
        int32_t *p = realloc(L->ids, nc * sizeof *p);
        if (!p)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory tokenizing");
        L->ids = p;
        L->cap = nc;
    }
    L->ids[L->n++] = id;
    return 0;
}

static int push_tokens(snug_dataset *ds, size_t *cap_tok, size_t *cap_ex, const int32_t *ids, size_t n) {
    if (ds->ntokens + n > *cap_tok) {
        size_t nc = (ds->ntokens + n) * 2 + 1024;
        int32_t *p = realloc(ds->tokens, nc * sizeof *p);
        if (!p)
            return -1;
        ds->tokens = p;
        *cap_tok = nc;
    }
    if (ds->nexamples + 2 > *cap_ex) {
        size_t nc = (ds->nexamples + 2) * 2 + 64;
        size_t *p = realloc(ds->start, nc * sizeof *p);
        if (!p)
            return -1;
        ds->start = p;
        *cap_ex = nc;
    }
    if (ds->nexamples == 0)
        ds->start[0] = ds->ntokens;
    memcpy(ds->tokens + ds->ntokens, ids, n * sizeof *ids);
    ds->ntokens += n;
    ds->start[++ds->nexamples] = ds->ntokens;
    return 0;
}

int snug_dataset_load_jsonl(snug_dataset *ds, const char *path, const char *field, const snug_encoder *enc,
                            snug_error *e) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return snug_fail(e, SNUG_EINPUT, "%s: cannot open the dataset file; check datasets[].path in the config",
                         path);
    line_ref *lines = NULL;
    size_t nlines = 0, caplines = 0, lineno = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    ssize_t got;
    int rc = 0;
    while (!rc && (got = getline(&buf, &bufcap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            len--;
        size_t k = 0;
        while (k < len && (buf[k] == ' ' || buf[k] == '\t'))
            k++;
        if (k == len)
            continue;
        json_error_t jerr;
        json_t *obj = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!obj) {
            rc = snug_fail(e, SNUG_EINPUT, "%s line %zu column %d: invalid JSON (%s); each line must be one JSON object "
                           "such as {\"%s\": \"...\"}",
                           path, lineno, jerr.column, jerr.text, field);
            break;
        }
        json_t *v = json_is_object(obj) ? json_object_get(obj, field) : NULL;
        if (!json_is_string(v)) {
            rc = snug_fail(e, SNUG_EINPUT, "%s line %zu: %s; set datasets[].field to the key that holds the text",
                           path, lineno,
                           !json_is_object(obj) ? "the line is not a JSON object"
                           : v                  ? "the text field is not a string"
                                                : "the text field is missing");
            json_decref(obj);
            break;
        }
        if (nlines == caplines) {
            caplines = caplines ? 2 * caplines : 1024;
            line_ref *nl = realloc(lines, caplines * sizeof *nl);
            if (!nl) {
                json_decref(obj);
                rc = snug_fail(e, SNUG_ENOMEM, "out of host memory reading %s", path);
                break;
            }
            lines = nl;
        }
        size_t tl = json_string_length(v);
        line_ref *L = &lines[nlines++];
        memset(L, 0, sizeof *L);
        L->lineno = lineno;
        L->text = malloc(tl + 1);
        if (L->text) {
            memcpy(L->text, json_string_value(v), tl + 1);
            L->len = tl;
        }
        json_decref(obj);
        if (!L->text)
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory reading %s", path);
    }
    free(buf);
    fclose(f);

    /* tokenize on all cores; the first failing line (in file order) is reported */
    int *lrc = calloc(nlines ? nlines : 1, sizeof *lrc);
    snug_error *lerr = calloc(nlines ? nlines : 1, sizeof *lerr);
    if (!lrc || !lerr)
        rc = rc ? rc : snug_fail(e, SNUG_ENOMEM, "out of host memory reading %s", path);
    if (!rc) {
#pragma omp parallel for schedule(dynamic, 64)
        for (size_t i = 0; i < nlines; i++) {
            line_ref *L = &lines[i];
            if (enc->bos_id >= 0)
                lrc[i] = append_id(L, enc->bos_id, &lerr[i]);
            if (!lrc[i])
                lrc[i] = enc->encode(enc->ctx, L->text, L->len, &L->ids, &L->n, &L->cap, &lerr[i]);
            if (!lrc[i] && enc->eos_id >= 0)
                lrc[i] = append_id(L, enc->eos_id, &lerr[i]);
        }
        for (size_t i = 0; i < nlines && !rc; i++)
            if (lrc[i])
                rc = snug_fail(e, lrc[i], "%s line %zu: %s", path, lines[i].lineno, lerr[i].msg);
    }
    size_t cap_tok = ds->ntokens, cap_ex = ds->nexamples + 1;
    for (size_t i = 0; i < nlines; i++) {
        line_ref *L = &lines[i];
        if (!rc && push_tokens(ds, &cap_tok, &cap_ex, L->ids, L->n))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory holding the tokens of %s", path);
        free(L->text);
        free(L->ids);
    }
    free(lines);
    free(lrc);
    free(lerr);
    if (!rc && ds->nexamples == 0)
        rc = snug_fail(e, SNUG_EINPUT, "%s: the dataset has no examples; each line must be {\"%s\": \"...\"}", path,
                       field);
    return rc;
}

void snug_dataset_free(snug_dataset *ds) {
    free(ds->tokens);
    free(ds->start);
    memset(ds, 0, sizeof *ds);
}

static uint64_t mix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fisher-Yates with a seeded generator: the same seed gives the same order on every machine. */
static void shuffle(size_t *a, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(mix64(&s) % i);
        size_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

int snug_dataset_split(snug_dataset *ds, double val, uint64_t seed, snug_dataset *val_out, snug_error *e) {
    memset(val_out, 0, sizeof *val_out);
    size_t n = ds->nexamples, nval = val < 1.0 ? (size_t)(val * (double)n + 0.5) : (size_t)val;
    if (nval == 0)
        return 0;
    if (nval >= n)
        return snug_fail(e, SNUG_EINPUT, "val_set_size %g leaves no training examples out of %zu; lower it", val, n);
    size_t *idx = malloc(n * sizeof *idx);
    char *is_val = calloc(n, 1);
    snug_dataset tr = {0};
    size_t cap_tok[2] = {0, 0}, cap_ex[2] = {1, 1};
    int rc = 0;
    if (!idx || !is_val)
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory splitting the validation set");
    for (size_t i = 0; !rc && i < n; i++)
        idx[i] = i;
    if (!rc)
        shuffle(idx, n, seed ^ 0x76616cull);
    for (size_t i = 0; !rc && i < nval; i++)
        is_val[idx[i]] = 1;
    for (size_t i = 0; !rc && i < n; i++) {
        snug_dataset *dst = is_val[i] ? val_out : &tr;
        int k = is_val[i];
        if (push_tokens(dst, &cap_tok[k], &cap_ex[k], ds->tokens + ds->start[i], ds->start[i + 1] - ds->start[i]))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory splitting the validation set");
    }
    free(idx);
    free(is_val);
    if (rc) {
        snug_dataset_free(&tr);
        snug_dataset_free(val_out);
        return rc;
    }
    snug_dataset_free(ds);
    *ds = tr;
    return 0;
}

int snug_batcher_init(snug_batcher *b, const snug_dataset *ds, int B, int T, uint64_t seed, int shuffle_rows,
                      snug_error *e) {
    memset(b, 0, sizeof *b);
    b->ds = ds;
    b->B = B;
    b->T = T;
    b->seed = seed;
    b->shuffle = shuffle_rows;
    b->nrows = ds->ntokens > 1 ? (ds->ntokens - 1) / (size_t)T : 0;
    if (b->nrows == 0)
        return snug_fail(e, SNUG_EINPUT,
                         "the dataset holds %zu tokens, fewer than one sequence of sequence_len %d + 1; add data or "
                         "lower sequence_len",
                         ds->ntokens, T);
    b->order = malloc(b->nrows * sizeof *b->order);
    if (!b->order)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the batch order");
    for (size_t i = 0; i < b->nrows; i++)
        b->order[i] = i;
    if (shuffle_rows)
        shuffle(b->order, b->nrows, seed);
    return 0;
}

size_t snug_batcher_batches_per_epoch(const snug_batcher *b) { return (b->nrows + b->B - 1) / b->B; }

int snug_batcher_next(snug_batcher *b, int32_t *ids, int32_t *labels, int32_t *pos) {
    if (b->next >= b->nrows) {
        b->next = 0;
        b->epoch++;
        for (size_t i = 0; i < b->nrows; i++)
            b->order[i] = i;
        if (b->shuffle)
            shuffle(b->order, b->nrows, b->seed + (uint64_t)b->epoch * 0x51ed27ull);
        return 0;
    }
    int rows = 0, T = b->T;
    while (rows < b->B && b->next < b->nrows) {
        const int32_t *src = b->ds->tokens + b->order[b->next++] * (size_t)T;
        for (int t = 0; t < T; t++) {
            ids[(size_t)rows * T + t] = src[t];
            labels[(size_t)rows * T + t] = src[t + 1];
            pos[(size_t)rows * T + t] = t;
        }
        rows++;
    }
    return rows;
}

void snug_batcher_free(snug_batcher *b) {
    free(b->order);
    memset(b, 0, sizeof *b);
}

size_t snug_count_supervised(const int32_t *labels, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += labels[i] >= 0;
    return k;
}
