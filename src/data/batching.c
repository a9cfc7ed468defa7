/* batching.c: samplers, the first-fit-decreasing packer, padding, and the report of what each way of batching costs
 * (see batching.h).
 *
 * An epoch is planned once, at its start, into `items` (the examples row after row) and, when packing, `row_start`;
 * next() then only copies tokens. All working memory is allocated by init, so planning a later epoch cannot fail. */
#include "data/batching.h"

#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

/* ---- seeded order ---- */

/* Seeds of one epoch's example order and of its row order: different streams, different every epoch. */
static uint64_t epoch_seed(const snug_loader *l, uint64_t stream) {
    uint64_t s = l->o.seed * 0x100000001B3ull ^ ((uint64_t)l->epoch * 0x51ed27ull + stream * 0x2545F4914F6CDD1Dull);
    return snug_splitmix64(&s);
}

static inline uint32_t ex_len(const snug_dataset *ds, size_t i) {
    return (uint32_t)snug_dataset_example(ds, i, NULL, NULL);
}

/* ---- first-fit decreasing ---- */

int snug_ffd_init(snug_ffd *f, uint32_t n_max, int cap, snug_error *e) {
    memset(f, 0, sizeof *f);
    f->n_max = n_max ? n_max : 1;
    f->cap = cap;
    f->leaves = 1;
    while (f->leaves < f->n_max)
        f->leaves *= 2;
    f->sorted = malloc((size_t)f->n_max * sizeof *f->sorted);
    f->bin_of = malloc((size_t)f->n_max * sizeof *f->bin_of);
    f->count = malloc(((size_t)cap + 1) * sizeof *f->count);
    f->tree = malloc(2 * (size_t)f->leaves * sizeof *f->tree);
    if (!f->sorted || !f->bin_of || !f->count || !f->tree) {
        snug_ffd_free(f);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for sequence packing (groups of %u examples)", n_max);
    }
    return 0;
}

void snug_ffd_free(snug_ffd *f) {
    free(f->sorted);
    free(f->bin_of);
    free(f->count);
    free(f->tree);
    memset(f, 0, sizeof *f);
}

uint32_t snug_ffd_pack(snug_ffd *f, const uint32_t *len, uint32_t n, uint32_t *order, uint32_t *bin_start) {
    int cap = f->cap;
    /* counting sort, longest first, stable */
    memset(f->count, 0, ((size_t)cap + 1) * sizeof *f->count);
    for (uint32_t i = 0; i < n; i++)
        f->count[len[i]]++;
    uint32_t at = 0;
    for (int L = cap; L >= 0; L--) {
        uint32_t c = f->count[L];
        f->count[L] = at;
        at += c;
    }
    for (uint32_t i = 0; i < n; i++)
        f->sorted[f->count[len[i]]++] = i;

    /* first fit: a tree whose leaves are the bins' room (unopened bins: cap) and whose nodes hold the largest room
     * below them; the first bin with room for L is found by going left whenever the left subtree has room */
    uint32_t P = f->leaves;
    int32_t *tree = f->tree;
    uint32_t need = 1;
    while (need < n)
        need *= 2; /* only the first pow2ceil(n) leaves can be used: n items open at most n bins */
    for (uint32_t k = 0; k < need; k++)
        tree[P + k] = cap;
    for (uint32_t k = need; k < P; k++)
        tree[P + k] = -1;
    for (uint32_t v = P - 1; v >= 1; v--)
        tree[v] = tree[2 * v] > tree[2 * v + 1] ? tree[2 * v] : tree[2 * v + 1];
    uint32_t nbins = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = f->sorted[k];
        int32_t L = (int32_t)len[i];
        uint32_t v = 1;
        while (v < P)
            v = tree[2 * v] >= L ? 2 * v : 2 * v + 1;
        uint32_t b = v - P;
        f->bin_of[i] = b;
        if (b + 1 > nbins)
            nbins = b + 1;
        tree[v] -= L;
        for (v /= 2; v >= 1; v /= 2) {
            int32_t m = tree[2 * v] > tree[2 * v + 1] ? tree[2 * v] : tree[2 * v + 1];
            if (tree[v] == m)
                break;
            tree[v] = m;
        }
    }

    /* items grouped by bin, in the order they were placed */
    memset(bin_start, 0, ((size_t)nbins + 1) * sizeof *bin_start);
    for (uint32_t i = 0; i < n; i++)
        bin_start[f->bin_of[i] + 1]++;
    for (uint32_t b = 0; b < nbins; b++)
        bin_start[b + 1] += bin_start[b];
    for (uint32_t k = 0; k < n; k++) { /* bin_start[b] walks to bin_start[b+1] */
        uint32_t i = f->sorted[k];
        order[bin_start[f->bin_of[i]]++] = i;
    }
    memmove(bin_start + 1, bin_start, (size_t)nbins * sizeof *bin_start);
    bin_start[0] = 0;
    return nbins;
}

/* ---- planning an epoch ---- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* group_by_length: sort each mega-batch of the shuffled order by decreasing length (ties by position); then the
 * full micro-batches are handed out in a shuffled order (a last, partial one stays last). */
static void plan_grouped(snug_loader *l) {
    size_t n = l->ds->nexamples, B = (size_t)l->o.B, M = SNUG_GROUP_MEGABATCH * B;
    for (size_t a = 0; a < n; a += M) {
        size_t m = n - a < M ? n - a : M;
        for (size_t j = 0; j < m; j++) /* key: (T - length) above, position below */
            l->keys[j] = ((uint64_t)((uint32_t)l->o.T - ex_len(l->ds, l->items[a + j])) << 32) | j;
        qsort(l->keys, m, sizeof *l->keys, cmp_u64);
        memcpy(l->tmp, l->items + a, m * sizeof *l->tmp);
        for (size_t j = 0; j < m; j++)
            l->items[a + j] = l->tmp[l->keys[j] & 0xffffffffu];
    }
    size_t nb = n / B;
    if (l->o.shuffle && nb > 1) {
        for (size_t b = 0; b < nb; b++)
            l->tmp[b] = b;
        snug_shuffle(l->tmp, nb, epoch_seed(l, 2));
        l->perm_unit = B;
        l->nperm = nb;
    }
}

/* packing: first-fit decreasing within each group of the shuffled order; the rows (bins) handed out shuffled */
static void plan_packed(snug_loader *l) {
    size_t n = l->ds->nexamples, G = SNUG_PACK_GROUP;
    memcpy(l->tmp, l->items, n * sizeof *l->tmp);
    size_t nrows = 0, placed = 0;
    l->row_start[0] = 0;
    for (size_t a = 0; a < n; a += G) {
        uint32_t m = (uint32_t)(n - a < G ? n - a : G);
        for (uint32_t j = 0; j < m; j++)
            l->glen[j] = ex_len(l->ds, l->tmp[a + j]);
        uint32_t nb = snug_ffd_pack(&l->ffd, l->glen, m, l->gorder, l->gstart);
        for (uint32_t j = 0; j < m; j++)
            l->items[placed + j] = l->tmp[a + l->gorder[j]];
        for (uint32_t b = 1; b <= nb; b++)
            l->row_start[nrows + b] = placed + l->gstart[b];
        nrows += nb;
        placed += m;
    }
    l->nrows = nrows;
    if (l->o.shuffle && nrows > 1) {
        for (size_t r = 0; r < nrows; r++)
            l->tmp[r] = r;
        snug_shuffle(l->tmp, nrows, epoch_seed(l, 3));
        l->perm_unit = 1;
        l->nperm = nrows;
    }
}

static void plan_epoch(snug_loader *l) {
    size_t n = l->ds->nexamples;
    for (size_t i = 0; i < n; i++)
        l->items[i] = i;
    if (l->o.shuffle)
        snug_shuffle(l->items, n, epoch_seed(l, 1));
    l->nrows = n;
    l->next = 0;
    l->perm_unit = 0;
    l->nperm = 0;
    if (l->o.how == SNUG_BATCHING_GROUP)
        plan_grouped(l);
    else if (l->o.how == SNUG_BATCHING_PACK)
        plan_packed(l);
}

/* The k-th row handed out this epoch. */
static inline size_t row_at(const snug_loader *l, size_t k) {
    if (!l->perm_unit)
        return k;
    size_t u = k / l->perm_unit;
    return u < l->nperm ? l->tmp[u] * l->perm_unit + k % l->perm_unit : k;
}

/* Row r's examples: items [*a, *b). */
static inline void row_items(const snug_loader *l, size_t r, size_t *a, size_t *b) {
    if (l->row_start) {
        *a = l->row_start[r];
        *b = l->row_start[r + 1];
    } else {
        *a = r;
        *b = r + 1;
    }
}

static size_t row_tokens(const snug_loader *l, size_t r) {
    size_t a, b, t = 0;
    row_items(l, r, &a, &b);
    for (size_t k = a; k < b; k++)
        t += ex_len(l->ds, l->items[k]);
    return t;
}

/* The length of the micro-batch of `rows` rows from the k-th: T for packed rows and with pad_to_sequence_len, else
 * its longest row rounded up to pad_to_multiple_of (at most T). */
static int batch_len(const snug_loader *l, size_t k, int rows) {
    int T = l->o.T;
    if (l->o.how == SNUG_BATCHING_PACK || l->o.pad_to_sequence_len)
        return T;
    size_t mx = 1;
    for (int i = 0; i < rows; i++) {
        size_t t = row_tokens(l, row_at(l, k + (size_t)i));
        mx = t > mx ? t : mx;
    }
    size_t m = l->o.pad_to_multiple_of > 1 ? (size_t)l->o.pad_to_multiple_of : 1;
    mx = (mx + m - 1) / m * m;
    return mx < (size_t)T ? (int)mx : T;
}

/* ---- the loader ---- */

int snug_loader_init(snug_loader *l, const snug_dataset *ds, const snug_batching_opts *o, snug_error *e) {
    memset(l, 0, sizeof *l);
    l->ds = ds;
    l->o = *o;
    if (o->B < 1 || o->T < 1 || o->pad_to_multiple_of < 0)
        return snug_fail(e, SNUG_EINTERNAL, "batching: micro_batch_size %d, sequence_len %d, pad_to_multiple_of %d",
                         o->B, o->T, o->pad_to_multiple_of);
    if (o->how == SNUG_BATCHING_CONCAT)
        return snug_batcher_init(&l->concat, ds, o->B, o->T, o->seed, o->shuffle, e);
    size_t n = ds->nexamples;
    if (n == 0)
        return snug_fail(e, SNUG_EINPUT, "the dataset holds no example; add data");
    for (size_t i = 0; i < n; i++) {
        uint32_t L = ex_len(ds, i);
        if (L > (uint32_t)o->T)
            return snug_fail(e, SNUG_EINPUT, "example %zu has %u tokens, more than sequence_len %d; build the dataset "
                             "with this sequence_len (long_examples truncates or drops them)", i, L, o->T);
    }
    l->items = malloc(n * sizeof *l->items);
    l->tmp = malloc(n * sizeof *l->tmp);
    int ok = l->items && l->tmp;
    if (ok && o->how == SNUG_BATCHING_PACK) {
        uint32_t G = (uint32_t)(n < SNUG_PACK_GROUP ? n : SNUG_PACK_GROUP);
        l->row_start = malloc((n + 1) * sizeof *l->row_start);
        l->glen = malloc(G * sizeof *l->glen);
        l->gorder = malloc(G * sizeof *l->gorder);
        l->gstart = malloc(((size_t)G + 1) * sizeof *l->gstart);
        ok = l->row_start && l->glen && l->gorder && l->gstart;
        if (ok && snug_ffd_init(&l->ffd, G, o->T, e)) {
            snug_loader_free(l);
            return e ? e->code : SNUG_ENOMEM;
        }
    }
    if (ok && o->how == SNUG_BATCHING_GROUP)
        ok = (l->keys = malloc(SNUG_GROUP_MEGABATCH * (size_t)o->B * sizeof *l->keys)) != NULL;
    if (!ok) {
        snug_loader_free(l);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the batch order of %zu examples", n);
    }
    plan_epoch(l);
    return 0;
}

size_t snug_loader_batches_per_epoch(const snug_loader *l) {
    if (l->o.how == SNUG_BATCHING_CONCAT)
        return snug_batcher_batches_per_epoch(&l->concat);
    return (l->nrows + (size_t)l->o.B - 1) / (size_t)l->o.B;
}

/* Writes row r's examples into a row of Tb tokens, padding after them; returns its example tokens. */
static size_t fill_row(const snug_loader *l, size_t r, int Tb, int32_t *ids, int32_t *labels, int32_t *pos,
                       int32_t *seg, size_t *examples) {
    size_t a, b;
    row_items(l, r, &a, &b);
    int c = 0;
    for (size_t k = a; k < b; k++) {
        const int32_t *ei;
        const uint8_t *es;
        int L = (int)snug_dataset_example(l->ds, l->items[k], &ei, &es);
        for (int j = 0; j < L; j++) {
            ids[c + j] = ei[j];
            labels[c + j] = j + 1 < L && es[j + 1] ? ei[j + 1] : -1; /* the next token of the same example */
            pos[c + j] = j;
            seg[c + j] = c;
        }
        c += L;
    }
    *examples += b - a;
    size_t tokens = (size_t)c;
    for (; c < Tb; c++) {
        ids[c] = l->o.pad_id;
        labels[c] = -1;
        pos[c] = 0;
        seg[c] = c;
    }
    return tokens;
}

int snug_loader_next(snug_loader *l, snug_micro_batch *mb) {
    int T = l->o.T;
    mb->tokens = 0;
    mb->examples = 0;
    if (l->o.how == SNUG_BATCHING_CONCAT) {
        int rows = snug_batcher_next(&l->concat, mb->ids, mb->labels, mb->pos);
        memset(mb->seg, 0, (size_t)rows * T * sizeof *mb->seg);
        mb->rows = rows;
        mb->T = T;
        mb->tokens = (size_t)rows * T;
        return rows;
    }
    if (l->next >= l->nrows) {
        l->epoch++;
        plan_epoch(l);
        mb->rows = 0;
        mb->T = 0;
        return 0;
    }
    int rows = l->nrows - l->next < (size_t)l->o.B ? (int)(l->nrows - l->next) : l->o.B;
    int Tb = batch_len(l, l->next, rows);
    for (int i = 0; i < rows; i++) {
        size_t o = (size_t)i * Tb;
        mb->tokens += fill_row(l, row_at(l, l->next + (size_t)i), Tb, mb->ids + o, mb->labels + o, mb->pos + o,
                               mb->seg + o, &mb->examples);
    }
    l->next += (size_t)rows;
    mb->rows = rows;
    mb->T = Tb;
    return rows;
}

void snug_loader_free(snug_loader *l) {
    snug_batcher_free(&l->concat);
    free(l->items);
    free(l->tmp);
    free(l->row_start);
    free(l->glen);
    free(l->gorder);
    free(l->gstart);
    free(l->keys);
    snug_ffd_free(&l->ffd);
    memset(l, 0, sizeof *l);
}

/* ---- the report ---- */

static const char *const cost_names[SNUG_COST_N] = {"fixed padding", "dynamic padding", "grouped by length",
                                                    "packed", "concatenated"};

const char *snug_batching_name(int k) { return k >= 0 && k < SNUG_COST_N ? cost_names[k] : "?"; }

double snug_batching_efficiency(const snug_batching_cost *c) {
    return c->slots ? (double)c->tokens / (double)c->slots : 0.0;
}

/* One epoch of a loader, counted without copying a token. */
static void epoch_cost(const snug_loader *l, snug_batching_cost *c) {
    memset(c, 0, sizeof *c);
    c->rows = l->nrows;
    for (size_t k = 0; k < l->nrows; k += (size_t)l->o.B) {
        int rows = l->nrows - k < (size_t)l->o.B ? (int)(l->nrows - k) : l->o.B;
        c->slots += (uint64_t)rows * (uint64_t)batch_len(l, k, rows);
        c->batches++;
    }
    for (size_t i = 0; i < l->ds->nexamples; i++)
        c->tokens += ex_len(l->ds, i);
}

int snug_batching_report_compute(snug_batching_report *r, const snug_dataset *ds, const snug_batching_opts *o,
                                 snug_error *e) {
    memset(r, 0, sizeof *r);
    r->examples = ds->nexamples;
    r->tokens = ds->ntokens;
    r->B = o->B;
    r->T = o->T;
    r->multiple = o->pad_to_multiple_of > 1 ? o->pad_to_multiple_of : 1;
    struct {
        snug_batching how;
        int fixed;
    } ways[SNUG_COST_CONCAT] = {{SNUG_BATCHING_PAD, 1}, {SNUG_BATCHING_PAD, 0}, {SNUG_BATCHING_GROUP, 0},
                                {SNUG_BATCHING_PACK, 0}};
    for (int k = 0; k < SNUG_COST_CONCAT; k++) {
        snug_batching_opts w = *o;
        w.how = ways[k].how;
        w.pad_to_sequence_len = ways[k].fixed;
        snug_loader l;
        SNUG_TRY(snug_loader_init(&l, ds, &w, e));
        epoch_cost(&l, &r->cost[k]);
        snug_loader_free(&l);
    }
    snug_batching_cost *c = &r->cost[SNUG_COST_CONCAT];
    c->rows = ds->ntokens > 1 ? (ds->ntokens - 1) / (size_t)o->T : 0;
    c->batches = (c->rows + (size_t)o->B - 1) / (size_t)o->B;
    c->slots = c->tokens = (uint64_t)c->rows * (uint64_t)o->T;
    switch (o->how) {
    case SNUG_BATCHING_PAD:
        r->chosen = o->pad_to_sequence_len ? SNUG_COST_FIXED : SNUG_COST_DYNAMIC;
        break;
    case SNUG_BATCHING_GROUP:
        r->chosen = o->pad_to_sequence_len ? SNUG_COST_FIXED : SNUG_COST_GROUPED;
        break;
    case SNUG_BATCHING_PACK:
        r->chosen = SNUG_COST_PACKED;
        break;
    case SNUG_BATCHING_CONCAT:
        r->chosen = SNUG_COST_CONCAT;
        break;
    }
    return 0;
}

void snug_batching_report_print(FILE *out, const snug_batching_report *r) {
    const snug_batching_cost *ch = &r->cost[r->chosen];
    fprintf(out, "  %-20s %s: %zu rows in %zu micro-batches per epoch; %llu example tokens, %llu padding (%.1f%% "
            "efficiency)\n", "batching", snug_batching_name(r->chosen), ch->rows, ch->batches,
            (unsigned long long)ch->tokens, (unsigned long long)(ch->slots - ch->tokens),
            100.0 * snug_batching_efficiency(ch));
    fprintf(out, "  %-20s   %-24s %10s %12s %12s %8s\n", "", "per epoch", "rows", "token slots", "padding",
            "efficiency");
    for (int k = 0; k < SNUG_COST_N; k++) {
        const snug_batching_cost *c = &r->cost[k];
        char name[64];
        if (k == SNUG_COST_FIXED)
            snprintf(name, sizeof name, "%s to %d", cost_names[k], r->T);
        else if ((k == SNUG_COST_DYNAMIC || k == SNUG_COST_GROUPED) && r->multiple > 1)
            snprintf(name, sizeof name, "%s (x%d)", cost_names[k], r->multiple);
        else
            snprintf(name, sizeof name, "%s", cost_names[k]);
        fprintf(out, "  %-20s %c %-24s %10zu %12llu %12llu %7.1f%%%s\n", "", k == r->chosen ? '*' : ' ', name,
                c->rows, (unsigned long long)c->slots, (unsigned long long)(c->slots - c->tokens),
                100.0 * snug_batching_efficiency(c),
                k == SNUG_COST_CONCAT ? "  (attends and predicts across examples)" : "");
    }
}
