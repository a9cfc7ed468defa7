/* params.h: the parameter table: every tensor of a model (or of its adapters) as Hugging Face names and stores it,
 * and where it lives in one flat buffer. The model (model.h) and the adapters (lora.h) each keep one. */
#ifndef SNUG_PARAMS_H
#define SNUG_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#define SNUG_KEEP_MAX 8 /* row ranges of one tensor that unfrozen_parameters may train (merged) */
#define SNUG_PATTERNS_TEXT 4096 /* characters of all the patterns of one snug_patterns, each with its NUL */
#define SNUG_PATTERNS_MAX (SNUG_PATTERNS_TEXT / 2) /* patterns: each at least one character and its NUL */

/* unfrozen_parameters: the patterns of the tensor names that train, in the order written. The list holds its text
 * itself, so that it copies by value with the configuration that holds it: pattern k is text + at[k] (NUL ended).
 * n 0: no pattern (every tensor trains). Filled by snug_patterns_add. */
typedef struct snug_patterns {
    int n;
    int at[SNUG_PATTERNS_MAX];
    char text[SNUG_PATTERNS_TEXT];
} snug_patterns;

/* Pattern k (0 <= k < p->n) of p. */
static inline const char *snug_patterns_item(const snug_patterns *p, int k) { return p->text + p->at[k]; }

/* Appends pattern s (not empty) to p; -1 (p unchanged) when it does not fit. */
int snug_patterns_add(snug_patterns *p, const char *s);

/* One tensor as Hugging Face names and stores it, and where it lives in the flat buffer. */
typedef struct snug_param_entry {
    char name[96];          /* HF name, e.g. "model.layers.3.self_attn.q_proj.weight" */
    int ndim;
    int64_t shape[2];       /* shape in the HF file */
    size_t offset;          /* in floats, into the flat buffer */
    size_t numel;
    int layer;              /* -1 for global tensors */
    int decay;              /* 1 for matrices (weight decay applies), 0 for norms, biases, 1-D tensors */
    double lr_scale;        /* the learning rate's factor for this tensor (LoRA+'s ratio on lora_B); 1 otherwise */
    int transposed;         /* stored transposed in the file (GPT-2 Conv1D) */
    int segs;               /* its rows are that many equal parts side by side (GPT-2's fused c_attn: q, k, v), each
                             * split alone under tensor parallelism; 1 otherwise */
    int frozen;             /* unfrozen_parameters names it not: no update, no optimizer state, a zero gradient */
    int nkeep;              /* unfrozen_parameters' ranges: only rows [keep[k][0], keep[k][1]) of its first dimension
                             * (as the file holds it) take a gradient, the others' is zeroed; 0 = every row */
    int64_t keep[SNUG_KEEP_MAX][2];
    int64_t rows_base;      /* the embedding and head of a vocabulary that added tokens grew: the rows a base model's
                             * file holds (shape[0] is the grown count; the rest start as config.h's vocab_mean says);
                             * 0 = shape[0] only */
} snug_param_entry;

typedef struct snug_param_table {
    int n;
    snug_param_entry *e;
    size_t total;           /* floats in the flat buffer */
    size_t *layer_offset;   /* (L) first float of each layer's range */
    size_t *layer_numel;    /* (L) */
} snug_param_table;

/* Appends a tensor of ndim (1 or 2) dimensions d0 (x d1) at *off (advanced past it); *cap: entries allocated.
 * -1 when out of memory. */
int snug_param_table_add(snug_param_table *t, int *cap, size_t *off, const char *name, int ndim, int64_t d0,
                         int64_t d1, int layer, int transposed);
void snug_param_table_free(snug_param_table *t);

#endif
