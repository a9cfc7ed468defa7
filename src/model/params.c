/* params.c: the parameter table: where every Hugging Face tensor lives in the flat parameter buffer.
 *
 * Order: token embedding, (GPT-2) position embedding, then each layer's tensors, then the final norm and, when not
 * tied, the output head. Within a layer, q/k/v weights (and biases) are adjacent so they form one (QKV, C) matrix,
 * and gate/up likewise form one (2I, C) matrix. The names are the family's scheme's (family.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "model/family.h"
#include "model/model.h"

typedef struct builder {
    snug_param_table *t;
    int cap;
    size_t off;
    int l0;    /* the whole model's index of layer 0 (a pipeline stage's first layer), in the names */
    int parts; /* SNUG_PARTS_*: the global tensors the table holds */
} builder;

static int add(builder *b, const char *name, int ndim, int64_t d0, int64_t d1, int layer, int transposed) {
    return snug_param_table_add(b->t, &b->cap, &b->off, name, ndim, d0, d1, layer, transposed);
}

int snug_param_table_add(snug_param_table *t, int *cap, size_t *off, const char *name, int ndim, int64_t d0,
                         int64_t d1, int layer, int transposed) {
    if (t->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        snug_param_entry *ne = realloc(t->e, (size_t)*cap * sizeof *ne);
        if (!ne)
            return -1;
        t->e = ne;
    }
    snug_param_entry *p = &t->e[t->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 1;
    p->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    p->offset = *off;
    p->layer = layer;
    p->decay = ndim == 2;
    p->lr_scale = 1.0;
    p->transposed = transposed;
    p->segs = 1;
    *off += p->numel;
    return 0;
}

/* A norm's tensors (C): its weight, and LayerNorm's bias. */
static int add_norm(builder *b, const char *path, int C, int ln, int layer) {
    char n[96];
    snprintf(n, sizeof n, "%s.weight", path);
    int rc = add(b, n, 1, C, 0, layer, 0);
    if (ln) {
        snprintf(n, sizeof n, "%s.bias", path);
        rc |= add(b, n, 1, C, 0, layer, 0);
    }
    return rc;
}

/* Site s's modules of layer l: every weight ((rows, in), or Conv1D's (in, rows) transposed), then, with biases,
 * every bias (rows). A module of several parts (GPT-2's c_attn: q, k, v) is a tensor of as many segments. */
static int add_site(builder *b, const snug_model_config *c, const snug_scheme *sc, snug_site s, int bias, int l) {
    char n[96];
    int rc = 0;
    for (int pass = 0; pass < 1 + !!bias; pass++)
        for (int k = 0; k < sc->n_modules; k++) {
            int64_t row0, rows, in;
            const snug_module_def *d = snug_module_shape(c, k, &row0, &rows, &in);
            if (d->site != s)
                continue;
            snprintf(n, sizeof n, "%s.%d.%s.%s", sc->layers, b->l0 + l, d->name, pass ? "bias" : "weight");
            rc |= pass ? add(b, n, 1, rows, 0, l, 0)
                  : sc->conv1d ? add(b, n, 2, in, rows, l, 1) : add(b, n, 2, rows, in, l, 0);
            if (!rc && d->parts > 1)
                b->t->e[b->t->n - 1].segs = d->parts;
        }
    return rc;
}

/* The table of a config's family, named as its scheme names the tensors (family.c). Layer l: norm1, q/k/v (and
 * their biases), o, norm2, the MLP's first projection(s), its output. */
static int build(builder *b, const snug_model_config *c) {
    const snug_scheme *sc = snug_scheme_of(c->arch);
    snug_block blk = snug_block_of(c);
    int C = c->hidden_size, V = c->vocab_size, ln = blk.norm == SNUG_NORM_LAYER;
    char n[96];
    int tied_head = (b->parts & SNUG_PARTS_HEAD) && c->tie_embeddings;
    int64_t grown = c->vocab_base > 0 && c->vocab_base < V ? c->vocab_base : 0; /* (added tokens) */
    snprintf(n, sizeof n, "%s.weight", sc->embed);
    int rc = (b->parts & SNUG_PARTS_EMBED) || tied_head ? add(b, n, 2, V, C, -1, 0) : 0;
    if (((b->parts & SNUG_PARTS_EMBED) || tied_head) && !rc)
        b->t->e[b->t->n - 1].rows_base = grown;
    if ((b->parts & SNUG_PARTS_EMBED) && blk.pos == SNUG_POS_LEARNED && sc->pos_embed) {
        snprintf(n, sizeof n, "%s.weight", sc->pos_embed);
        rc |= add(b, n, 2, c->max_position, C, -1, 0);
    }
    for (int l = 0; l < c->n_layer && !rc; l++) {
        b->t->layer_offset[l] = b->off;
        char norm[64];
        snprintf(norm, sizeof norm, "%s.%d.%s", sc->layers, b->l0 + l, sc->norm1);
        rc |= add_norm(b, norm, C, ln, l);
        rc |= add_site(b, c, sc, SNUG_SITE_QKV, c->qkv_bias, l);
        rc |= add_site(b, c, sc, SNUG_SITE_O, c->o_bias, l);
        snprintf(norm, sizeof norm, "%s.%d.%s", sc->layers, b->l0 + l, sc->norm2);
        rc |= add_norm(b, norm, C, ln, l);
        rc |= add_site(b, c, sc, SNUG_SITE_FC, c->mlp_bias, l);
        rc |= add_site(b, c, sc, SNUG_SITE_PROJ, c->mlp_bias, l);
        b->t->layer_numel[l] = b->off - b->t->layer_offset[l];
    }
    if (!(b->parts & SNUG_PARTS_HEAD))
        return rc;
    rc |= add_norm(b, sc->final_norm, C, ln, -1);
    if (!c->tie_embeddings && sc->head) {
        snprintf(n, sizeof n, "%s.weight", sc->head);
        rc |= add(b, n, 2, V, C, -1, 0);
        if (!rc)
            b->t->e[b->t->n - 1].rows_base = grown;
    }
    return rc;
}

int snug_param_table_find(const snug_param_table *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].name, name))
            return i;
    return -1;
}

int snug_param_table_build(snug_param_table *t, const snug_model_config *cfg, snug_error *e) {
    return snug_param_table_build_part(t, cfg, 0, SNUG_PARTS_EMBED | SNUG_PARTS_HEAD, e);
}

int snug_param_table_build_part(snug_param_table *t, const snug_model_config *cfg, int l0, int parts,
                                snug_error *e) {
    memset(t, 0, sizeof *t);
    t->layer_offset = calloc((size_t)cfg->n_layer + 1, sizeof *t->layer_offset);
    t->layer_numel = calloc((size_t)cfg->n_layer + 1, sizeof *t->layer_numel);
    builder b = {.t = t, .l0 = l0, .parts = parts};
    int rc = !t->layer_offset || !t->layer_numel || !snug_scheme_of(cfg->arch) ? -1 : build(&b, cfg);
    if (rc) {
        snug_param_table_free(t);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory building the parameter table");
    }
    t->total = b.off;
    return 0;
}

void snug_param_table_free(snug_param_table *t) {
    free(t->e);
    free(t->layer_offset);
    free(t->layer_numel);
    memset(t, 0, sizeof *t);
}

/* ---- unfrozen_parameters ---- */

/* One pattern of unfrozen_parameters: its name part as a regular expression (each '.' escaped, as Axolotl does) and
 * its optional row range [lo, hi) (hi -1: to the end). */
typedef struct unfreeze_pattern {
    pcre2_code *re;
    pcre2_match_data *md;
    int ranged;
    int64_t lo, hi;
} unfreeze_pattern;

/* Axolotl's range suffix: "[a]", "[a:b]", "[a:]", "[:b]" or "[:]" ending the pattern (digits only), after a
 * non-empty name part of `*len` characters. Returns 0 and shortens *len when there is one; 1 when there is none;
 * -1 when its end does not come after its start. */
static int parse_range(const char *s, size_t *len, unfreeze_pattern *u) {
    size_t n = *len;
    if (n < 3 || s[n - 1] != ']')
        return 1;
    size_t open = n - 1;
    while (open > 0 && s[open - 1] != '[')
        open--;
    if (open < 2) /* no '[' after a name part of at least one character */
        return 1;
    const char *a = s + open, *colon = memchr(a, ':', n - 1 - open);
    for (const char *c = a; c < s + n - 1; c++)
        if (!(*c >= '0' && *c <= '9') && c != colon)
            return 1;
    const char *aend = colon ? colon : s + n - 1;
    u->lo = aend > a ? strtoll(a, NULL, 10) : 0;
    u->hi = !colon ? (aend > a ? u->lo + 1 : -1) : colon + 1 < s + n - 1 ? strtoll(colon + 1, NULL, 10) : -1;
    u->ranged = 1;
    *len = open - 1;
    return u->hi >= 0 && u->lo >= u->hi ? -1 : 0;
}

/* Compiles pattern p (len characters), the list's item `line` (0-based), into u. */
static int compile_pattern(const char *p, size_t len, int line, unfreeze_pattern *u, snug_error *e) {
    memset(u, 0, sizeof *u);
    int r = parse_range(p, &len, u);
    if (r < 0)
        return snug_fail(e, SNUG_EINPUT, "unfrozen_parameters[%d] '%.*s': the range's end must come after its "
                         "start; write [start:end] with start < end", line, (int)len, p);
    char *rx = malloc(2 * len + 1), *o = rx;
    if (!rx)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for unfrozen_parameters");
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '.')
            *o++ = '\\';
        *o++ = p[i];
    }
    int err;
    PCRE2_SIZE at;
    u->re = pcre2_compile((PCRE2_SPTR)rx, (PCRE2_SIZE)(o - rx), 0, &err, &at, NULL);
    free(rx);
    if (!u->re) {
        PCRE2_UCHAR why[256];
        pcre2_get_error_message(err, why, sizeof why);
        return snug_fail(e, SNUG_EINPUT, "unfrozen_parameters[%d] '%.*s' is not a regular expression: %s; "
                         "write a pattern of tensor names such as model.layers.1[0-5].mlp", line, (int)len, p,
                         (const char *)why);
    }
    if (!(u->md = pcre2_match_data_create_from_pattern(u->re, NULL)))
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for unfrozen_parameters");
    return 0;
}

/* Whether u matches name from its start (re.match). */
static int pattern_matches(const unfreeze_pattern *u, const char *name) {
    return pcre2_match(u->re, (PCRE2_SPTR)name, strlen(name), 0, PCRE2_ANCHORED, u->md, NULL) >= 0;
}

static int cmp_range(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Entry p's ranges from the patterns that match it (n of them in r), merged as Axolotl merges them. */
static int keep_ranges(snug_param_entry *p, int64_t (*r)[2], int n, snug_error *e) {
    int64_t rows = p->shape[0];
    for (int k = 0; k < n; k++) {
        if (r[k][1] < 0)
            r[k][1] = rows;
        if (r[k][1] > rows || r[k][0] >= r[k][1])
            return snug_fail(e, SNUG_EINPUT, "unfrozen_parameters: the range [%lld:%lld] of %s is outside its %lld "
                             "rows; give rows within [0:%lld]", (long long)r[k][0], (long long)r[k][1], p->name,
                             (long long)rows, (long long)rows);
    }
    if (p->ndim == 2 && p->transposed)
        return snug_fail(e, SNUG_EINPUT, "unfrozen_parameters: %s is a Conv1D weight, whose first dimension is its "
                         "input (columns in snug's layout); a range of it is not supported; name it without a range",
                         p->name);
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    p->nkeep = 0;
    for (int k = 0; k < n; k++) {
        if (p->nkeep && r[k][0] <= p->keep[p->nkeep - 1][1]) {
            if (r[k][1] > p->keep[p->nkeep - 1][1])
                p->keep[p->nkeep - 1][1] = r[k][1];
            continue;
        }
        if (p->nkeep == SNUG_KEEP_MAX)
            return snug_fail(e, SNUG_EINPUT, "unfrozen_parameters: %s takes more than %d separate ranges; join some",
                             p->name, SNUG_KEEP_MAX);
        p->keep[p->nkeep][0] = r[k][0];
        p->keep[p->nkeep][1] = r[k][1];
        p->nkeep++;
    }
    if (p->nkeep == 1 && p->keep[0][0] == 0 && p->keep[0][1] == rows)
        p->nkeep = 0; /* every row */
    return 0;
}

int snug_patterns_add(snug_patterns *p, const char *s) {
    size_t used = p->n ? (size_t)p->at[p->n - 1] + strlen(snug_patterns_item(p, p->n - 1)) + 1 : 0;
    size_t len = strlen(s);
    if (!len || p->n == SNUG_PATTERNS_MAX || used + len + 1 > sizeof p->text)
        return -1;
    memcpy(p->text + used, s, len + 1);
    p->at[p->n++] = (int)used;
    return 0;
}

int snug_param_table_freeze(snug_param_table *t, const snug_patterns *patterns, int *unmatched, snug_error *e) {
    if (unmatched)
        *unmatched = 0;
    for (int i = 0; i < t->n; i++)
        t->e[i].frozen = 0, t->e[i].nkeep = 0;
    if (!patterns || !patterns->n)
        return 0;
    int np = patterns->n;
    unfreeze_pattern *u = calloc((size_t)np, sizeof *u);
    int64_t (*r)[2] = calloc((size_t)np, sizeof *r);
    int *hits = calloc((size_t)np, sizeof *hits);
    int rc = u && r && hits ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory for unfrozen_parameters");
    for (int k = 0; k < np && !rc; k++) {
        const char *c = snug_patterns_item(patterns, k);
        rc = compile_pattern(c, strlen(c), k, &u[k], e);
    }
    for (int i = 0; i < t->n && !rc; i++) {
        snug_param_entry *p = &t->e[i];
        int any = 0, n = 0;
        for (int k = 0; k < np; k++) {
            if (!pattern_matches(&u[k], p->name))
                continue;
            any = 1, hits[k]++;
            if (u[k].ranged)
                r[n][0] = u[k].lo, r[n][1] = u[k].hi, n++;
        }
        p->frozen = !any;
        if (n)
            rc = keep_ranges(p, r, n, e);
    }
    for (int k = 0; k < np && !rc && unmatched && !*unmatched; k++)
        if (!hits[k])
            *unmatched = k + 1;
    for (int k = 0; u && k < np; k++)
        pcre2_match_data_free(u[k].md), pcre2_code_free(u[k].re);
    free(u);
    free(r);
    free(hits);
    return rc;
}

size_t snug_param_table_trained(const snug_param_table *t) {
    size_t n = 0;
    for (int i = 0; i < t->n; i++)
        n += t->e[i].frozen ? 0 : t->e[i].numel;
    return n;
}

/* ---- tensor parallelism ---- */

const snug_model_config *snug_tp_config(const snug_model_config *g, int tp, snug_model_config *local, char *why,
                                        size_t n) {
    *local = *g;
    if (tp <= 1)
        return local;
    const char *what = g->n_head % tp ? "num_attention_heads" : g->n_kv_head % tp ? "num_key_value_heads"
                       : g->intermediate_size % tp ? "intermediate_size" : NULL;
    if (what) {
        int v = g->n_head % tp ? g->n_head : g->n_kv_head % tp ? g->n_kv_head : g->intermediate_size;
        snprintf(why, n, "tensor_parallel_size %d does not divide the model's %s (%d): each rank takes an equal "
                 "share of the heads and of the MLP's rows; choose a divisor of %d", tp, what, v, v);
        return NULL;
    }
    local->n_head = g->n_head / tp;
    local->n_kv_head = g->n_kv_head / tp;
    local->intermediate_size = g->intermediate_size / tp;
    return local;
}

int snug_tp_vocab_split(const snug_model_config *g, int tp, int device_cuda) {
    return tp > 1 && !device_cuda && g->vocab_size % tp == 0;
}

/* An entry's rows and columns as the table lays it out (a Conv1D weight transposed from its file) */
static void table_dims(const snug_param_entry *p, size_t *rows, size_t *cols) {
    *rows = (size_t)(p->ndim == 2 && p->transposed ? p->shape[1] : p->shape[0]);
    *cols = p->ndim == 2 ? (size_t)(p->transposed ? p->shape[0] : p->shape[1]) : 1;
}

int snug_tp_slice_kind(const snug_param_entry *g, const snug_param_entry *l) {
    if (l->numel == g->numel)
        return 0;
    size_t gr, gc, lr, lc;
    table_dims(g, &gr, &gc);
    table_dims(l, &lr, &lc);
    return lr != gr ? 1 : 2;
}

void snug_tp_slice(const snug_param_entry *g, const snug_param_entry *l, int part, float *whole, float *local,
                   int put) {
    int kind = snug_tp_slice_kind(g, l), segs = l->segs > 1 ? l->segs : 1;
    size_t gr, gc, rows, cols;
    table_dims(g, &gr, &gc);
    table_dims(l, &rows, &cols);
    if (kind == 0) {
        memcpy(put ? whole : local, put ? local : whole, l->numel * sizeof *local);
        return;
    }
    /* rows: the rank's block of each part; columns: a run of each row */
    size_t lseg = rows / (size_t)segs, gseg = gr / (size_t)segs, c0 = kind == 2 ? (size_t)part * cols : 0;
    for (size_t r = 0; r < rows; r++) {
        size_t wr = kind == 1 ? r / lseg * gseg + (size_t)part * lseg + r % lseg : r;
        float *w = whole + wr * gc + c0, *x = local + r * cols;
        memcpy(put ? w : x, put ? x : w, cols * sizeof *x);
    }
}

/* ---- pipeline parallelism ---- */

int snug_pp_layers(int L, int pp, snug_pp_split split, int stage, int *l0, int *n) {
    if (pp < 1 || L < pp || stage < 0 || stage >= pp)
        return -1;
    if (split.n > 0) { /* as listed: pp counts of at least 1 that sum to L */
        if (split.n != pp)
            return -1;
        int sum = 0;
        for (int k = 0; k < split.n; k++) {
            int v = split.layers[k];
            if (v < 1 || v > L - sum)
                return -1;
            if (k == stage)
                *l0 = sum, *n = v;
            sum += v;
        }
        return sum == L ? 0 : -1;
    }
    int base = L / pp, extra = L % pp; /* stages 1..extra take one more */
    *n = base + (stage >= 1 && stage <= extra);
    int before = stage - 1 < extra ? stage - 1 : extra; /* the longer stages ahead of this one */
    *l0 = stage * base + (before > 0 ? before : 0);
    return 0;
}

int snug_pp_stage_of(int L, int pp, snug_pp_split split, int layer, int pre) {
    int l0 = 0, n = 0;
    for (int q = 0; layer >= 0 && q < pp; q++)
        if (!snug_pp_layers(L, pp, split, q, &l0, &n) && layer >= l0 && layer < l0 + n)
            return q;
    return pre ? 0 : pp - 1;
}
