/* dataset.h: training examples read from JSONL files, tokenized with a per-token "supervised" mask, cached on disk,
 * and cut into micro-batches.
 *
 * Formats, one JSON object per line (blank lines skipped; formats.c has the exact templates):
 *   completion    {"text": "..."} (the field is configurable): BOS + text + EOS; every token supervised.
 *   alpaca        {"instruction", "input" (optional, may be empty), "output"}: the Alpaca prompt (unsupervised unless
 *                 train_on_inputs), then the output and the EOS after it (supervised).
 *   chat          {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]} through the chatml or
 *                 llama3 template (formats.c), or a Jinja template (the tokenizer's own, or the configuration's:
 *                 formats_jinja.c, with "tool" messages and the line's "tools"): assistant content and its
 *                 end-of-turn token supervised, the rest not (unless train_on_inputs). No BOS or EOS is added: the
 *                 template frames it.
 *   pretokenized  {"input_ids": [...], "labels": [...]}: labels as in transformers (not shifted; -100 =
 *                 unsupervised; labels absent = all supervised); ids checked against the vocabulary.
 * A BOS the tokenizer puts in front of a text (and llama3's <|begin_of_text|>) is never supervised: nothing predicts
 * the first token of an example.
 *
 * A dataset is a selection of examples (all, or the training or validation part after a split) of a store: every
 * example's ids and flags back to back, in malloc'd arrays or a memory-mapped cache file. The text-to-ids step goes
 * through snug_encoder, so the byte-level stand-in and the tokenizer.json BPE plug into the same path.
 *
 * Batching here is "concatenate and chunk", the `concatenate: true` way (batching.h holds the others, padding, length
 * grouping and packing, and is what the trainer asks for micro-batches): the selected examples joined (each already
 * ends in its EOS or end-of-turn token), cut into rows of T+1 tokens with stride T, row order reshuffled every epoch
 * with the seed. For a row, labels[t] = ids[t+1] when token t+1 is supervised, else -1. */
#ifndef SNUG_DATASET_H
#define SNUG_DATASET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

typedef struct snug_encoder {
    const void *ctx;
    /* appends the ids of text[0..len) to *ids (grown with realloc); returns 0 or fills e */
    int (*encode)(const void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap, snug_error *e);
    /* the id of a special token written as text ("<|im_end|>"), or -1 when there is none; NULL for an encoder without
     * special tokens (the byte-level stand-in), which then encodes template markers as plain text */
    int (*special_id)(const void *ctx, const char *token);
    /* ids to text (*text malloc'd), special tokens as their text; optional (NULL): it pins down where the supervision
     * starts when a token straddles a template's text and the user's (see formats.h) */
    int (*decode)(const void *ctx, const int32_t *ids, size_t n, char **text, size_t *len, snug_error *e);
    int vocab_size;
    int bos_id;    /* -1: none added */
    int eos_id;    /* appended after every completion and alpaca example; -1: none */
    uint64_t hash; /* identifies the tokenizer in the cache key (snug_tok_hash; a constant for the byte stand-in) */
} snug_encoder;

/* The byte-level stand-in: ids 0..255 are bytes, 256 is EOS; vocab 257. */
snug_encoder snug_byte_encoder(void);

typedef enum snug_data_format {
    SNUG_DATA_COMPLETION,
    SNUG_DATA_ALPACA,
    SNUG_DATA_CHAT,
    SNUG_DATA_PRETOKENIZED,
    SNUG_DATA_INPUT_OUTPUT, /* Axolotl's template-free segments: {"segments": [{"label": bool, "text": "..."}]} */
} snug_data_format;

typedef enum snug_chat_template {
    SNUG_CHAT_CHATML, /* <|im_start|>role\ncontent<|im_end|>\n */
    SNUG_CHAT_LLAMA3, /* <|begin_of_text|> once, then <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    /* as a configuration says them; resolved (src/train/setup.c) into one of the built-ins or SNUG_CHAT_JINJA */
    SNUG_CHAT_TOKENIZER,           /* tokenizer_default: the tokenizer's own template (an error when it has none) */
    SNUG_CHAT_TOKENIZER_OR_CHATML, /* tokenizer_default_fallback_chatml: its own, else chatml (the default) */
    SNUG_CHAT_JINJA,               /* a Jinja template: the configuration's chat_template_jinja, or resolved above */
    SNUG_CHAT_TOKENIZER_OR_LLAMA3, /* tokenizer_default_fallback_llama3: its own, else llama3 */
} snug_chat_template;

const char *snug_data_format_name(snug_data_format f);
const char *snug_chat_template_name(snug_chat_template t);

/* One JSONL file and how to read it (a datasets entry of the config). */
typedef struct snug_data_source {
    const char *path;
    snug_data_format format;
    const char *field;       /* completion: the text field; NULL = "text" */
    snug_chat_template chat; /* chat: the template */
    /* chat: the fields of a line and of its messages; NULL or "" = "messages", "role", "content" */
    const char *messages, *role, *content;
    /* chat: the role values that mean system, user and assistant, each a list joined by commas; all NULL or "" = the
     * default (system; human and user; gpt and assistant), as Axolotl's; otherwise only the values listed */
    const char *roles[3];
    /* chat with SNUG_CHAT_JINJA: the template's source, where it comes from (for errors), and the special-token strings
     * it is rendered with (NULL: undefined in the template) */
    const char *jinja, *jinja_where;
    const char *jinja_tool_use, *jinja_tool_use_where; /* for lines with "tools", when the tokenizer ships one */
    const char *chat_tokens[7]; /* bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token */
} snug_data_source;

typedef struct snug_data_opts {
    int train_on_inputs; /* 1: prompt, system and user tokens (and the template's markers) are supervised too */
    int sequence_len;    /* an example with more tokens is truncated to this many or dropped; 0 = no limit */
    int drop_long;       /* 1: drop long examples; 0: truncate them */
    int skip_bad;        /* 1: skip bad lines (counted, first few line numbers kept); 0: stop at the first */
} snug_data_opts;

#define SNUG_DATA_MAX_SOURCES 16
#define SNUG_DATA_BAD_LINES 5 /* line numbers of skipped lines kept for the report */

/* What loading one file did. Fixed-width fields only: it is stored in the cache file as it is. */
typedef struct snug_source_stats {
    uint64_t lines;         /* examples read (non-blank lines) */
    uint64_t examples;      /* kept */
    uint64_t tokens;        /* of the kept examples, after truncation */
    uint64_t supervised;    /* of those, supervised */
    uint64_t long_examples; /* longer than sequence_len: truncated or dropped */
    uint64_t long_unsupervised; /* of the truncated ones, those left without a supervised token */
    uint64_t bad;           /* bad lines skipped (skip_bad) */
    uint64_t bad_lines[SNUG_DATA_BAD_LINES]; /* the first ones' line numbers */
    char first_bad[512];    /* what was wrong with the first, without the file name */
} snug_source_stats;

typedef struct snug_data_report {
    int nsources;
    snug_source_stats src[SNUG_DATA_MAX_SOURCES];
    int cache_hit;         /* 1: the tokens were read from the cache file */
    char cache_path[4096]; /* the cache file used or written; "" for none */
    char cache_note[256];  /* why the cache was rebuilt ("" when it did not exist or was used) */
    uint64_t duplicates;   /* examples snug_dataset_dedup removed (dataset_exact_deduplication) */
} snug_data_report;

typedef struct snug_data_store snug_data_store; /* owner of the arrays: malloc'd, or a mapped cache file */

typedef struct snug_dataset {
    snug_data_store *store;  /* shared (reference-counted) by the sets split from one dataset */
    const int32_t *ids;      /* (store tokens) every example's ids, back to back */
    const uint8_t *sup;      /* (store tokens) 1: the token is a training target */
    const uint64_t *start;   /* (store examples + 1) store example i is [start[i], start[i+1]) */
    uint64_t *pick;          /* NULL: every store example in order; else (nexamples) the store index of each */
    uint64_t *cum;           /* with pick: (nexamples + 1) tokens before each selected example */
    size_t nexamples;        /* selected */
    size_t ntokens;          /* of the selected examples */
} snug_dataset;

/* dataset_exact_deduplication: keeps the first of the examples of ds whose tokens and targets are the same, and
 * with prior non-NULL drops as well those that are in prior (a validation set's examples that the training set has);
 * *removed their count. Equal examples are found by a hash of each and confirmed token by token. */
int snug_dataset_dedup(snug_dataset *ds, const snug_dataset *prior, uint64_t *removed, snug_error *e);

/* Example i of the set: its length, *ids and *sup (either may be NULL). */
size_t snug_dataset_example(const snug_dataset *ds, size_t i, const int32_t **ids, const uint8_t **sup);

/* Reads and tokenizes the files (on all cores) into ds, in memory. rep (may be NULL) receives the counts. Errors name
 * the file and line: invalid JSON or UTF-8, a missing or mistyped field, an empty example, an id out of range,
 * input_ids and labels of different lengths, ... (unless opts->skip_bad), and a file that gives no example. */
int snug_dataset_build(snug_dataset *ds, const snug_data_source *src, int nsrc, const snug_data_opts *opts,
                       const snug_encoder *enc, snug_data_report *rep, snug_error *e);

/* snug_dataset_build through a cache under cache_dir: the tokens are kept in one binary file named after a hash of
 * the files' contents, the tokenizer (enc->hash, vocab, BOS, EOS) and every option that changes the result (a chat
 * template's text and strings, and today's date when the template calls strftime_now). A valid file is
 * memory-mapped; a missing one is built, written atomically and mapped; a corrupt one (magic, version, sizes,
 * checksum, ids) is rebuilt. rep must not be NULL. */
int snug_dataset_prepare(snug_dataset *ds, const snug_data_source *src, int nsrc, const snug_data_opts *opts,
                         const snug_encoder *enc, const char *cache_dir, snug_data_report *rep, snug_error *e);

/* Moves a seeded random selection of examples (val < 1: that fraction; else that count) into val_out; ds keeps the
 * rest, in order. Both share ds's store. */
int snug_dataset_split(snug_dataset *ds, double val, uint64_t seed, snug_dataset *val_out, snug_error *e);
void snug_dataset_free(snug_dataset *ds);

/* Prints the data part of a run's header, its first line labelled `label` ("data files"): per file the examples and
 * tokens kept, the long examples ("3 examples longer than sequence_len 256: truncated"), the bad lines skipped, and
 * the cache used. */
void snug_data_report_print(FILE *out, const char *label, const snug_data_report *rep, const snug_data_source *src,
                            const snug_data_opts *opts);

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
    int32_t *row_ids;  /* (T+1) scratch */
    uint8_t *row_sup;  /* (T+1) scratch */
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
