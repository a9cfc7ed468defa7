/* batching.h: how the examples of a dataset become micro-batches of (rows, T) tokens, and what each way costs.
 *
 * Four ways, chosen by the config (sample_packing, group_by_length, pad_to_sequence_len, pad_to_multiple_of,
 * concatenate):
 *   dynamic padding (the default)  one example per row; a micro-batch is as long as its longest example (rounded up
 *                                  to pad_to_multiple_of), or always T with pad_to_sequence_len.
 *   length grouping                the same rows, but the sampler puts examples of similar length together: the
 *                                  epoch's shuffled order is cut into mega-batches of SNUG_GROUP_MEGABATCH x B
 *                                  examples, each sorted by length, cut into micro-batches, and those shuffled.
 *   packing                        several examples per row of T tokens: the epoch's shuffled order is cut into
 *                                  groups of SNUG_PACK_GROUP examples and each group placed by first-fit decreasing
 *                                  into bins of T tokens; the bins (rows) are shuffled.
 *   concatenation                  the examples joined into one stream cut into rows of T (dataset.h's snug_batcher,
 *                                  kept for pretraining-style corpora): no padding, but every token attends to, and
 *                                  the first token of an example is predicted from, the example before it.
 *
 * Whatever the way, an example is never trained to predict from another one: the target of position t is the next
 * token of the same example (label -1 on its last token and where that next token is not supervised); position ids
 * restart at 0 for each example; seg[t] (the first token t may attend to, backend.h) is the start of its example in
 * the row. Padding has label -1, position 0 and seg[t] = t (it attends only to itself), so it changes neither the loss
 * nor any gradient; its id is pad_id.
 *
 * Every epoch has a new order (seed + epoch); shuffle 0 keeps the dataset's order (evaluation). */
#ifndef SNUG_BATCHING_H
#define SNUG_BATCHING_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "data/dataset.h"

#define SNUG_GROUP_MEGABATCH 64   /* group_by_length sorts within this many micro-batches' worth of examples */
#define SNUG_PACK_GROUP 100000    /* packing places this many (shuffled) examples at a time */

typedef enum snug_batching {
    SNUG_BATCHING_PAD,     /* one example per row, padded */
    SNUG_BATCHING_GROUP,   /* one example per row, padded, examples of similar length together */
    SNUG_BATCHING_PACK,    /* several examples per row */
    SNUG_BATCHING_CONCAT,  /* the concatenated stream cut into rows */
} snug_batching;

typedef struct snug_batching_opts {
    snug_batching how;
    int B, T;                /* micro_batch_size rows of at most sequence_len tokens */
    int pad_to_sequence_len; /* padded rows are always T long (packed rows always are) */
    int pad_to_multiple_of;  /* a padded micro-batch's length is rounded up to a multiple of this (at most T); 0 = 1 */
    int shuffle;             /* 1: a new seeded order every epoch; 0: the dataset's order */
    uint64_t seed;
    int32_t pad_id;          /* the id written into padding (never a target, never attended to) */
} snug_batching_opts;

/* One micro-batch. The caller provides the four buffers of B*T each; next() fills rows*T of them, row-major. */
typedef struct snug_micro_batch {
    int32_t *ids;      /* (rows, T) */
    int32_t *labels;   /* (rows, T) the next token of the same example, or -1 */
    int32_t *pos;      /* (rows, T) position in its example */
    int32_t *seg;      /* (rows, T) row-local index of the first token of its example */
    int rows, T;       /* this micro-batch's shape: rows <= B, T <= the options' T */
    size_t tokens;     /* example tokens in it (rows * T minus padding) */
    size_t examples;   /* examples in it */
} snug_micro_batch;

/* First-fit decreasing over one group of at most SNUG_PACK_GROUP items: its working memory, sized once. */
typedef struct snug_ffd {
    uint32_t n_max;      /* most items per call */
    int cap;             /* bin capacity (T) */
    uint32_t *sorted;    /* (n_max) items by decreasing length */
    uint32_t *bin_of;    /* (n_max) the bin of each item */
    uint32_t *count;     /* (cap + 1) lengths histogram */
    int32_t *tree;       /* (2 * pow2ceil(n_max)) max of the room left in the bins below each node */
    uint32_t leaves;     /* pow2ceil(n_max) */
} snug_ffd;

int snug_ffd_init(snug_ffd *f, uint32_t n_max, int cap, snug_error *e);
void snug_ffd_free(snug_ffd *f);
/* Places n <= n_max items of lengths len[0..n) (each 1..cap) into bins of capacity cap: longest first (ties in the
 * given order), each into the first bin (lowest index) with room. Writes the item indices grouped by bin into order
 * (n), bin b holding order[bin_start[b] .. bin_start[b+1]) (bin_start: room for n + 1), and returns the number of
 * bins. O(n log n + cap). */
uint32_t snug_ffd_pack(snug_ffd *f, const uint32_t *len, uint32_t n, uint32_t *order, uint32_t *bin_start);

/* Hands out an epoch's micro-batches. An epoch is a list of rows, each a list of examples (one, except packed). */
typedef struct snug_loader {
    const snug_dataset *ds;
    snug_batching_opts o;
    snug_batcher concat;   /* SNUG_BATCHING_CONCAT */
    size_t *items;         /* (nexamples) this epoch's examples, row after row */
    size_t *tmp;           /* (nexamples) scratch while planning; then the order rows are handed out in */
    size_t *row_start;     /* packing: (nrows + 1) row r holds items [row_start[r], row_start[r+1]); else NULL:
                            * row r is items[r] */
    size_t nrows;
    size_t next;           /* rows handed out so far this epoch */
    size_t perm_unit;      /* 0: rows in order; else rows are handed out in blocks of perm_unit, block k being
                            * tmp[k] (the first nperm blocks; any rows after them in order) */
    size_t nperm;
    int epoch;
    snug_ffd ffd;          /* packing */
    uint32_t *glen, *gorder, *gstart; /* packing: (SNUG_PACK_GROUP + 1) one group's lengths, order, bin starts */
    uint64_t *keys;        /* grouping: (SNUG_GROUP_MEGABATCH * B) sort keys of one mega-batch */
} snug_loader;

/* Plans epoch 0. Fails when an example is longer than T (the dataset truncates or drops those when built with
 * sequence_len), when the options make no sense, or on out-of-memory. */
int snug_loader_init(snug_loader *l, const snug_dataset *ds, const snug_batching_opts *o, snug_error *e);
/* Micro-batches in the current epoch. (Packing may give a different count in a later epoch, by a few rows.) */
size_t snug_loader_batches_per_epoch(const snug_loader *l);
/* Fills mb with the next micro-batch and returns its rows; 0 at the end of an epoch, after which the next call starts
 * the next epoch with a new order. */
int snug_loader_next(snug_loader *l, snug_micro_batch *mb);
void snug_loader_free(snug_loader *l);

/* What a way of batching costs over one epoch. */
typedef struct snug_batching_cost {
    size_t rows;          /* rows (sequences) */
    size_t batches;       /* micro-batches */
    uint64_t slots;       /* token positions computed: sum over micro-batches of rows x length */
    uint64_t tokens;      /* example tokens among them; slots - tokens is padding */
} snug_batching_cost;

enum { SNUG_COST_FIXED, SNUG_COST_DYNAMIC, SNUG_COST_GROUPED, SNUG_COST_PACKED, SNUG_COST_CONCAT, SNUG_COST_N };

/* The same epoch (same seed) under every way: fixed padding to T, dynamic padding (with pad_to_multiple_of),
 * grouped by length, packed, concatenated; and which of them the options chose. */
typedef struct snug_batching_report {
    size_t examples;
    uint64_t tokens;
    int B, T, multiple;
    int chosen;                          /* SNUG_COST_* */
    snug_batching_cost cost[SNUG_COST_N];
} snug_batching_report;

int snug_batching_report_compute(snug_batching_report *r, const snug_dataset *ds, const snug_batching_opts *o,
                                 snug_error *e);
/* The chosen way's padding and efficiency and a table of the others, for the run's header. */
void snug_batching_report_print(FILE *out, const snug_batching_report *r);
/* tokens / slots, in [0, 1]. */
double snug_batching_efficiency(const snug_batching_cost *c);
const char *snug_batching_name(int cost_index);

#endif
