/* dataset.h: examples read from JSONL files, tokenized, and cut into training micro-batches.
 *
 * A dataset is every example's token ids in one array with per-example offsets. The text-to-ids step goes through
 * snug_encoder, so the byte-level stand-in and the tokenizer.json BPE plug into the same path. Batching here is the
 * causal-LM "concatenate and chunk" strategy: examples joined with EOS, cut into rows of T+1 tokens (inputs and
 * shifted targets), row order reshuffled every epoch with the seed. */
#ifndef SNUG_DATASET_H
#define SNUG_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct snug_encoder {
    const void *ctx;
    /* appends the ids of text[0..len) to *ids (grown with realloc); returns 0 or fills e */
    int (*encode)(const void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap, snug_error *e);
    int vocab_size;
    int bos_id; /* -1: none added */
    int eos_id; /* appended after every example */
} snug_encoder;

/* The byte-level stand-in: ids 0..255 are bytes, 256 is EOS; vocab 257. */
snug_encoder snug_byte_encoder(void);

typedef struct snug_dataset {
    int32_t *tokens;   /* (ntokens) */
    size_t ntokens;
    size_t *start;     /* (nexamples + 1) example i is tokens[start[i], start[i+1]) */
    size_t nexamples;
} snug_dataset;

/* Reads a JSONL file, one {"<field>": "..."} object per line (blank lines skipped), and tokenizes every example on
 * all cores, appending to ds. Errors name the file and line: invalid JSON, a missing or non-string field. */
int snug_dataset_load_jsonl(snug_dataset *ds, const char *path, const char *field, const snug_encoder *enc,
                            snug_error *e);
/* Moves a seeded random selection of examples (val < 1: that fraction; else that count) into val_out. */
int snug_dataset_split(snug_dataset *ds, double val, uint64_t seed, snug_dataset *val_out, snug_error *e);
void snug_dataset_free(snug_dataset *ds);

/* Concatenate-and-chunk batches. */
typedef struct snug_batcher {
    const snug_dataset *ds;
    int B, T;
    size_t nrows;      /* rows of T+1 tokens with stride T */
    size_t *order;     /* (nrows) this epoch's row order */
    size_t next;       /* next row of order to hand out */
    int epoch;
    uint64_t seed;
    int shuffle;
} snug_batcher;

int snug_batcher_init(snug_batcher *b, const snug_dataset *ds, int B, int T, uint64_t seed, int shuffle,
                      snug_error *e);
size_t snug_batcher_batches_per_epoch(const snug_batcher *b);
/* Fills ids/labels/pos (B*T each, row-major) with the next micro-batch; returns rows used (0 at the end of an
 * epoch, after which the next call starts the next epoch reshuffled). Unused rows are not written. */
int snug_batcher_next(snug_batcher *b, int32_t *ids, int32_t *labels, int32_t *pos);
void snug_batcher_free(snug_batcher *b);

/* Supervised tokens in a batch (labels >= 0). */
size_t snug_count_supervised(const int32_t *labels, size_t n);

#endif
