/* test_batching.c: the samplers, the first-fit-decreasing packer, padding and the batching report, on datasets built
 * in memory.
 *
 * Every way of batching must hand out every example exactly once per epoch, with the target of each position the
 * next token of the same example (or -1), positions restarting at 0 per example, seg at the example's start, and
 * padding that is never a target and attends only to itself. The packer is checked against a plain first-fit
 * decreasing written here; the report against the example (120, 180 and 200 tokens: padded to 512 wastes
 * 1,036 tokens, packed into one row of 512 wastes 12). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/batching.h"

/* A dataset in memory: example i has len[i] tokens, ids (i * 1000 + j) % 50000 so every token names its example,
 * supervised except every 5th token of odd examples (a mask to respect). */
typedef struct memds {
    snug_dataset ds;
    int32_t *ids;
    uint8_t *sup;
    uint64_t *start;
} memds;

static void memds_make(memds *m, const uint32_t *len, size_t n) {
    memset(m, 0, sizeof *m);
    m->start = malloc((n + 1) * sizeof *m->start);
    m->start[0] = 0;
    for (size_t i = 0; i < n; i++)
        m->start[i + 1] = m->start[i] + len[i];
    size_t N = m->start[n];
    m->ids = malloc((N ? N : 1) * sizeof *m->ids);
    m->sup = malloc(N ? N : 1);
    for (size_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < len[i]; j++) {
            m->ids[m->start[i] + j] = (int32_t)((i * 1000 + j) % 50000);
            m->sup[m->start[i] + j] = !(i % 2 == 1 && j % 5 == 0);
        }
    m->ds = (snug_dataset){.ids = m->ids, .sup = m->sup, .start = m->start, .nexamples = n, .ntokens = N};
}

static void memds_free(memds *m) {
    free(m->ids);
    free(m->sup);
    free(m->start);
}

static uint32_t *random_lengths(size_t n, uint32_t lo, uint32_t hi, unsigned seed) {
    uint32_t *len = malloc(n * sizeof *len);
    srand(seed);
    for (size_t i = 0; i < n; i++) /* skewed: many short, some long, like real text */
        len[i] = lo + (uint32_t)((double)(hi - lo) * ((double)rand() / RAND_MAX) * ((double)rand() / RAND_MAX));
    return len;
}

typedef struct bufs {
    int32_t *ids, *labels, *pos, *seg;
} bufs;

static snug_micro_batch mb_of(bufs *b, int B, int T) {
    size_t n = (size_t)B * T;
    b->ids = malloc(n * 4), b->labels = malloc(n * 4), b->pos = malloc(n * 4), b->seg = malloc(n * 4);
    return (snug_micro_batch){.ids = b->ids, .labels = b->labels, .pos = b->pos, .seg = b->seg};
}

static void bufs_free(bufs *b) {
    free(b->ids);
    free(b->labels);
    free(b->pos);
    free(b->seg);
}

/* One epoch through the loader: checks every row against the dataset and returns the example order (first token's
 * example id per segment) in *order (malloc'd, nexamples). Returns the number of failures found. */
static int check_epoch(snug_loader *l, const memds *m, size_t **order_out, double *spread_out) {
    const snug_batching_opts *o = &l->o;
    bufs b;
    snug_micro_batch mb = mb_of(&b, o->B, o->T);
    size_t n = m->ds.nexamples, seen_n = 0, batches = 0;
    int *seen = calloc(n, sizeof *seen), bad = 0;
    size_t *order = malloc(n * sizeof *order);
    double spread = 0;
    int rows;
    while ((rows = snug_loader_next(l, &mb)) > 0) {
        batches++;
        size_t tokens = 0, examples = 0;
        bad += mb.rows != rows || rows > o->B || mb.T > o->T || mb.T < 1;
        if (o->pad_to_sequence_len || o->how == SNUG_BATCHING_PACK)
            bad += mb.T != o->T;
        if (o->pad_to_multiple_of > 1 && mb.T != o->T)
            bad += mb.T % o->pad_to_multiple_of != 0;
        uint32_t lmin = UINT32_MAX, lmax = 0;
        int longest = 0;
        for (int r = 0; r < rows; r++) {
            const int32_t *ids = mb.ids + (size_t)r * mb.T, *lab = mb.labels + (size_t)r * mb.T;
            const int32_t *pos = mb.pos + (size_t)r * mb.T, *seg = mb.seg + (size_t)r * mb.T;
            int t = 0, used = 0;
            while (t < mb.T && ids[t] != o->pad_id) { /* a first token is a multiple of 1000, never pad_id */
                bad += pos[t] != 0 || seg[t] != t;
                size_t ex = (size_t)ids[t] / 1000; /* (i * 1000) % 50000 / 1000 = i for i < 50 */
                int32_t base = ids[t];
                size_t cand = n;
                for (size_t i = ex; i < n; i += 50) /* the example whose first id is base and that fits here */
                    if ((int32_t)((i * 1000) % 50000) == base && !seen[i] &&
                        (size_t)t + (m->start[i + 1] - m->start[i]) <= (size_t)mb.T) {
                        /* confirm token by token */
                        size_t L = m->start[i + 1] - m->start[i];
                        int ok = t + L == (size_t)mb.T || pos[t + L] == 0; /* it ends there */
                        for (size_t j = 0; j < L && ok; j++)
                            ok = ids[t + j] == m->ids[m->start[i] + j];
                        if (ok) {
                            cand = i;
                            break;
                        }
                    }
                if (cand == n) {
                    bad++;
                    break;
                }
                size_t L = m->start[cand + 1] - m->start[cand];
                for (size_t j = 0; j < L; j++) {
                    size_t g = m->start[cand] + j;
                    int32_t want = j + 1 < L && m->sup[g + 1] ? m->ids[g + 1] : -1;
                    bad += lab[t + j] != want || pos[t + j] != (int32_t)j || seg[t + j] != t;
                }
                seen[cand]++;
                order[seen_n++] = cand;
                examples++;
                tokens += L;
                lmin = (uint32_t)L < lmin ? (uint32_t)L : lmin;
                lmax = (uint32_t)L > lmax ? (uint32_t)L : lmax;
                t += (int)L;
                used = t;
                longest = t > longest ? t : longest;
                if (o->how != SNUG_BATCHING_PACK)
                    break; /* one example per row */
            }
            for (int u = used; u < mb.T; u++) /* padding: no target, position 0, attends to itself only */
                bad += ids[u] != o->pad_id || lab[u] != -1 || pos[u] != 0 || seg[u] != u;
        }
        if (o->how != SNUG_BATCHING_PACK && !o->pad_to_sequence_len && o->pad_to_multiple_of <= 1)
            bad += mb.T != longest; /* dynamic: exactly the longest example */
        bad += mb.tokens != tokens || mb.examples != examples;
        if (rows == o->B)
            spread += (double)(lmax - lmin);
    }
    for (size_t i = 0; i < n; i++)
        bad += seen[i] != 1;
    bad += batches != snug_loader_batches_per_epoch(l) && l->epoch == 0;
    free(seen);
    bufs_free(&b);
    *order_out = order;
    if (spread_out)
        *spread_out = spread / (double)(batches ? batches : 1);
    return bad;
}

static void test_ways(void) {
    size_t n = 500;
    uint32_t *len = random_lengths(n, 1, 96, 1);
    len[3] = 96; /* one example exactly T long */
    memds m;
    memds_make(&m, len, n);
    snug_error e = {0};
    double spread_plain = 0, spread_grouped = 0;
    struct {
        const char *what;
        snug_batching how;
        int fixed, multiple, B;
    } cases[] = {
        {"dynamic padding", SNUG_BATCHING_PAD, 0, 0, 8},
        {"fixed padding", SNUG_BATCHING_PAD, 1, 0, 8},
        {"dynamic padding x8", SNUG_BATCHING_PAD, 0, 8, 3},
        {"grouped", SNUG_BATCHING_GROUP, 0, 0, 8},
        {"grouped x16", SNUG_BATCHING_GROUP, 0, 16, 5},
        {"packed", SNUG_BATCHING_PACK, 0, 0, 4},
        {"packed B=1", SNUG_BATCHING_PACK, 0, 0, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        snug_batching_opts o = {.how = cases[k].how, .B = cases[k].B, .T = 96, .pad_to_sequence_len = cases[k].fixed,
                                .pad_to_multiple_of = cases[k].multiple, .shuffle = 1, .seed = 7, .pad_id = 3};
        snug_loader l;
        CHECKF(snug_loader_init(&l, &m.ds, &o, &e) == 0, "%s: %s", cases[k].what, e.msg);
        size_t *o1, *o2, *o3;
        double spread;
        int bad = check_epoch(&l, &m, &o1, &spread);
        CHECKF(bad == 0, "%s epoch 0: %d problems", cases[k].what, bad);
        CHECK(l.epoch == 1);
        bad = check_epoch(&l, &m, &o2, NULL);
        CHECKF(bad == 0, "%s epoch 1: %d problems", cases[k].what, bad);
        CHECKF(memcmp(o1, o2, n * sizeof *o1) != 0, "%s: epochs 0 and 1 in the same order", cases[k].what);
        snug_loader_free(&l);
        /* the same seed gives the same epochs */
        CHECK(snug_loader_init(&l, &m.ds, &o, &e) == 0);
        check_epoch(&l, &m, &o3, NULL);
        CHECKF(memcmp(o1, o3, n * sizeof *o1) == 0, "%s: same seed, different order", cases[k].what);
        snug_loader_free(&l);
        if (k == 0)
            spread_plain = spread;
        if (k == 3)
            spread_grouped = spread;
        free(o1);
        free(o2);
        free(o3);
    }
    /* grouping puts examples of similar length together: the spread within a micro-batch shrinks */
    printf("  mean length spread within a micro-batch of 8: random %.1f, grouped %.1f\n", spread_plain,
           spread_grouped);
    CHECKF(spread_grouped < 0.25 * spread_plain, "grouped spread %.1f vs random %.1f", spread_grouped, spread_plain);

    /* without shuffling, padding keeps the dataset's order (evaluation) */
    snug_batching_opts o = {.how = SNUG_BATCHING_PAD, .B = 7, .T = 96, .shuffle = 0, .pad_id = 3};
    snug_loader l;
    CHECK(snug_loader_init(&l, &m.ds, &o, &e) == 0);
    size_t *ord;
    CHECK(check_epoch(&l, &m, &ord, NULL) == 0);
    int inorder = 1;
    for (size_t i = 0; i < n; i++)
        inorder &= ord[i] == i;
    CHECK(inorder);
    free(ord);
    snug_loader_free(&l);

    /* an example longer than T is refused (the dataset truncates or drops them first) */
    o.T = 95;
    CHECK(snug_loader_init(&l, &m.ds, &o, &e) == SNUG_EINPUT && strstr(e.msg, "example 3 has 96 tokens") &&
          strstr(e.msg, "long_examples"));
    memds_free(&m);
    free(len);
}

/* Plain first-fit decreasing, O(n * bins): the reference for snug_ffd_pack. */
static uint32_t ffd_reference(const uint32_t *len, uint32_t n, int cap, uint32_t *bin_of) {
    uint32_t *idx = malloc(n * sizeof *idx), *room = malloc(n * sizeof *room), nb = 0;
    for (uint32_t i = 0; i < n; i++)
        idx[i] = i;
    for (uint32_t i = 1; i < n; i++) { /* insertion sort, decreasing, stable */
        uint32_t v = idx[i], j = i;
        while (j > 0 && len[idx[j - 1]] < len[v]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = idx[k], b = 0;
        while (b < nb && room[b] < len[i])
            b++;
        if (b == nb)
            room[nb++] = (uint32_t)cap;
        room[b] -= len[i];
        bin_of[i] = b;
    }
    free(idx);
    free(room);
    return nb;
}

static void test_ffd(void) {
    snug_error e = {0};
    snug_ffd f;
    uint32_t sizes[] = {1, 2, 3, 7, 100, 1000, 4097};
    int caps[] = {1, 7, 64, 512};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
            uint32_t n = sizes[s];
            int cap = caps[c];
            uint32_t *len = random_lengths(n, 1, (uint32_t)cap, (unsigned)(s * 10 + c));
            uint32_t *order = malloc(n * 4), *start = malloc((n + 1) * 4), *ref = malloc(n * 4);
            CHECK(snug_ffd_init(&f, n + 5, cap, &e) == 0); /* n_max above n: unused leaves */
            uint32_t nb = snug_ffd_pack(&f, len, n, order, start);
            uint32_t nref = ffd_reference(len, n, cap, ref);
            int same = nb == nref && start[0] == 0 && start[nb] == n;
            uint64_t total = 0;
            for (uint32_t b = 0; b < nb && same; b++) {
                uint64_t fill = 0;
                for (uint32_t k = start[b]; k < start[b + 1]; k++) {
                    same &= ref[order[k]] == b;
                    fill += len[order[k]];
                }
                same &= fill <= (uint64_t)cap && start[b + 1] > start[b];
                total += fill;
            }
            CHECKF(same, "ffd n %u cap %d: %u bins vs reference %u", n, cap, nb, nref);
            uint64_t sum = 0;
            for (uint32_t i = 0; i < n; i++)
                sum += len[i];
            CHECK(total == sum && nb >= (sum + (uint64_t)cap - 1) / (uint64_t)cap);
            snug_ffd_free(&f);
            free(len);
            free(order);
            free(start);
            free(ref);
        }
    /* by hand: lengths 3 5 2 4 1 3 2 (items 0..6) into bins of 7. Longest first, ties in order: 1(5) 3(4) 0(3)
     * 5(3) 2(2) 6(2) 4(1); first fit: 1 -> bin 0, 3 -> bin 1, 0 -> bin 1 (full), 5 -> bin 2, 2 -> bin 0 (full),
     * 6 -> bin 2, 4 -> bin 2 */
    uint32_t len[] = {3, 5, 2, 4, 1, 3, 2}, order[7], start[8];
    CHECK(snug_ffd_init(&f, 7, 7, &e) == 0);
    uint32_t nb = snug_ffd_pack(&f, len, 7, order, start);
    uint32_t want_order[] = {1, 2, 3, 0, 5, 6, 4}, want_start[] = {0, 2, 4, 7};
    CHECK(nb == 3 && !memcmp(order, want_order, sizeof order) && !memcmp(start, want_start, 4 * sizeof *start));
    snug_ffd_free(&f);
}

static void test_report(void) {
    /* the example: 3 samples of 120, 180 and 200 tokens, sequence_len 512 */
    uint32_t len[] = {120, 180, 200};
    memds m;
    memds_make(&m, len, 3);
    snug_batching_report r;
    snug_error e = {0};
    snug_batching_opts o = {.how = SNUG_BATCHING_PACK, .B = 3, .T = 512, .shuffle = 1, .seed = 1};
    CHECKF(snug_batching_report_compute(&r, &m.ds, &o, &e) == 0, "%s", e.msg);
    const snug_batching_cost *c = r.cost;
    CHECK(r.tokens == 500 && r.chosen == SNUG_COST_PACKED);
    CHECKF(c[SNUG_COST_FIXED].slots == 1536 && c[SNUG_COST_FIXED].slots - c[SNUG_COST_FIXED].tokens == 1036,
           "fixed padding wastes %llu", (unsigned long long)(c[SNUG_COST_FIXED].slots - 500));
    CHECKF(c[SNUG_COST_PACKED].rows == 1 && c[SNUG_COST_PACKED].slots - c[SNUG_COST_PACKED].tokens == 12,
           "packing: %zu rows, %llu wasted", c[SNUG_COST_PACKED].rows,
           (unsigned long long)(c[SNUG_COST_PACKED].slots - 500));
    CHECK(c[SNUG_COST_DYNAMIC].slots == 600 && c[SNUG_COST_GROUPED].slots == 600); /* 3 rows of the longest, 200 */
    CHECK(c[SNUG_COST_CONCAT].rows == 0);                                          /* 500 tokens < 513 */
    FILE *f = tmpfile();
    snug_batching_report_print(f, &r);
    rewind(f);
    char text[4096] = "";
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    fclose(f);
    printf("%s", text);
    CHECK(strstr(text, "packed: 1 rows in 1 micro-batches per epoch; 500 example tokens, 12 padding (97.7% "
                       "efficiency)") != NULL);
    CHECK(strstr(text, "fixed padding to 512") && strstr(text, "1036") && strstr(text, "* packed"));

    /* B = 1: dynamic padding is exact (no padding) */
    o.B = 1;
    o.how = SNUG_BATCHING_PAD;
    o.pad_to_multiple_of = 64;
    CHECK(snug_batching_report_compute(&r, &m.ds, &o, &e) == 0);
    CHECK(r.chosen == SNUG_COST_DYNAMIC && r.cost[SNUG_COST_DYNAMIC].slots == 128 + 192 + 256 &&
          r.cost[SNUG_COST_FIXED].slots == 1536);
    memds_free(&m);

    /* many varied examples: packing is nearly perfect, and better than any padding */
    size_t n = 20000;
    uint32_t *lens = random_lengths(n, 4, 400, 5);
    memds_make(&m, lens, n);
    o = (snug_batching_opts){.how = SNUG_BATCHING_PAD, .B = 8, .T = 512, .shuffle = 1, .seed = 3};
    CHECK(snug_batching_report_compute(&r, &m.ds, &o, &e) == 0);
    double ef = snug_batching_efficiency(&r.cost[SNUG_COST_FIXED]),
           ed = snug_batching_efficiency(&r.cost[SNUG_COST_DYNAMIC]),
           eg = snug_batching_efficiency(&r.cost[SNUG_COST_GROUPED]),
           ep = snug_batching_efficiency(&r.cost[SNUG_COST_PACKED]);
    printf("  20000 examples of 4..400 tokens into 512: fixed %.1f%%, dynamic %.1f%%, grouped %.1f%%, packed "
           "%.2f%%\n", 100 * ef, 100 * ed, 100 * eg, 100 * ep);
    CHECK(ef < ed && ed < eg && eg < ep && ep > 0.99);
    memds_free(&m);
    free(lens);
}

/* More examples than one packing group: every group packed, rows from all of them, each example once. */
static void test_many_groups(void) {
    size_t n = 2 * SNUG_PACK_GROUP + 12345;
    uint32_t *len = random_lengths(n, 1, 64, 9);
    memds m;
    memds_make(&m, len, n);
    snug_batching_opts o = {.how = SNUG_BATCHING_PACK, .B = 4, .T = 128, .shuffle = 1, .seed = 5};
    snug_loader l;
    snug_error e = {0};
    CHECKF(snug_loader_init(&l, &m.ds, &o, &e) == 0, "%s", e.msg);
    char *seen = calloc(n, 1), *row_seen = calloc(l.nrows, 1);
    int ok = l.row_start[0] == 0 && l.row_start[l.nrows] == n;
    for (size_t r = 0; r < l.nrows && ok; r++) {
        size_t fill = 0;
        ok &= l.row_start[r + 1] > l.row_start[r];
        for (size_t k = l.row_start[r]; k < l.row_start[r + 1]; k++) {
            ok &= !seen[l.items[k]];
            seen[l.items[k]] = 1;
            fill += len[l.items[k]];
        }
        ok &= fill <= 128;
        ok &= l.tmp[r] < l.nrows && !row_seen[l.tmp[r]]; /* the rows are handed out in a permutation */
        row_seen[l.tmp[r]] = 1;
    }
    double eff = (double)m.ds.ntokens / ((double)l.nrows * 128);
    printf("  %zu examples in 3 groups: %zu rows, efficiency %.3f%%\n", n, l.nrows, 100 * eff);
    CHECK(ok && l.perm_unit == 1 && l.nperm == l.nrows && eff > 0.99);
    free(seen);
    free(row_seen);
    snug_loader_free(&l);
    memds_free(&m);
    free(len);
}

static void test_concat(void) {
    uint32_t len[] = {10, 20, 30, 7};
    memds m;
    memds_make(&m, len, 4);
    snug_batching_opts o = {.how = SNUG_BATCHING_CONCAT, .B = 2, .T = 16, .shuffle = 0};
    snug_loader l;
    snug_error e = {0};
    CHECK(snug_loader_init(&l, &m.ds, &o, &e) == 0);
    bufs b;
    snug_micro_batch mb = mb_of(&b, 2, 16);
    CHECK(snug_loader_next(&l, &mb) == 2 && mb.T == 16 && mb.tokens == 32 && mb.seg[5] == 0 && mb.pos[17] == 1);
    /* the stream crosses examples, which is what concatenation means: example 1 (stream 10..29) predicts example 2's
     * first token (stream 30, row 1 column 14) */
    CHECK(mb.ids[10] == 1000 && mb.ids[16 + 14] == 2000 && mb.labels[16 + 13] == 2000);
    CHECK(snug_loader_next(&l, &mb) == 2 && snug_loader_next(&l, &mb) == 0);
    CHECK(snug_loader_batches_per_epoch(&l) == 2);
    bufs_free(&b);
    snug_loader_free(&l);
    memds_free(&m);
}

int main(void) {
    test_ffd();
    test_ways();
    test_report();
    test_concat();
    test_many_groups();
    return check_finish("test_batching");
}
