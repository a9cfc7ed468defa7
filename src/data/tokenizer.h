/* tokenizer.h: reading a Hugging Face tokenizer.json and encoding/decoding with it, id for id like the `tokenizers`
 * library (BPE models only).
 *
 * Supported, exactly as `tokenizers` 0.23 does them:
 *   model         BPE (vocab, merges as "a b" strings or ["a","b"] pairs, unk_token, fuse_unk, byte_fallback,
 *                 ignore_merges, continuing_subword_prefix, end_of_word_suffix); WordPiece, Unigram and WordLevel
 *                 fail to load with a clear message.
 *   added_tokens  split out before normalization (non-normalized ones) and after it (normalized ones), leftmost
 *                 longest match first, with lstrip / rstrip / single_word; ids assigned as `tokenizers` assigns them
 *                 (the "id" in the file only agrees with that in a consistent file).
 *   normalizer    NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace (String or Regex), Strip, StripAccents, Nmt,
 *                 ByteLevel, Sequence (not BertNormalizer, Precompiled).
 *   pre_tokenizer ByteLevel (GPT-2 regex, add_prefix_space), Split (String or Regex, all five behaviors, invert),
 *                 Metaspace (prepend_scheme always/first/never or the older add_prefix_space, split), Digits
 *                 (individual_digits), Punctuation (all five behaviors), Whitespace, WhitespaceSplit,
 *                 CharDelimiterSplit, UnicodeScripts (with its own script table), BertPreTokenizer, FixedLength,
 *                 Sequence.
 *   decoder       ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, BPEDecoder, Sequence (not WordPiece,
 *                 CTC).
 *   post_processor only read for the BOS/EOS it adds: TemplateProcessing (a single template of at most one special
 *                 token before $A and one after it), RobertaProcessing, BertProcessing, ByteLevel, Sequence.
 * Anything else fails to load with an error that names the file, the JSON path and the type.
 *
 * Text that is not valid UTF-8: `tokenizers` only sees Rust strings, so callers in Python first decode the bytes.
 * The encoder here replaces every maximal invalid subsequence with U+FFFD, exactly like Python's
 * bytes.decode("utf-8", errors="replace") (and Rust's String::from_utf8_lossy), so the ids equal those of
 * `tokenizers` on the replaced string.
 *
 * Regexes run with PCRE2 (JIT when available). `tokenizers` uses Oniguruma, which reads a few escapes differently;
 * \s \S \w \W \h \H and \uHHHH are rewritten to Oniguruma's meaning first, and ^ $ match at line breaks as there.
 *
 * Known differences: normalization and the character classes of Digits, Punctuation, Whitespace and
 * WhitespaceSplit (Rust's char methods and regex \w upstream) use utf8proc's Unicode tables and the regex classes
 * PCRE2's, so characters assigned in newer Unicode versions than those may normalize or split differently
 * (UnicodeScripts carries the table of `tokenizers` itself); jansson refuses a vocabulary key that holds U+0000 (the
 * load fails with a message); "truncation" and "padding" are ignored; an added_tokens entry without its flags gets
 * the defaults (`tokenizers` refuses it).
 *
 * A loaded tokenizer is immutable: snug_tok_encode and snug_tok_decode may run on the same tokenizer from several
 * threads at once (all scratch memory belongs to the call). */
#ifndef SNUG_TOKENIZER_H
#define SNUG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct snug_tokenizer snug_tokenizer;

/* path: a tokenizer.json file, or a folder that holds one. On failure *out is NULL and e says why. When path is (or
 * sits in) a folder that also holds tokenizer_config.json, its eos_token is used for snug_tok_eos_id (see there). */
int snug_tok_load(snug_tokenizer **out, const char *path, snug_error *e);
/* json: the text of a tokenizer.json; name_for_errors: what error messages call it (e.g. "tokenizer.json"). */
int snug_tok_load_from_string(snug_tokenizer **out, const char *json, const char *name_for_errors, snug_error *e);
void snug_tok_free(snug_tokenizer *t);
/* The vocabulary size (largest id + 1 over model.vocab and added_tokens) of a tokenizer.json, or of the one in a
 * folder, read without loading the tokenizer: a plan needs the size even when snug cannot encode with the file (an
 * unsupported component). */
int snug_tok_vocab_size_of_file(const char *path, int *out, snug_error *e);

/* Encodes len bytes of text (any bytes; see the note on UTF-8 above) as `tokenizers` encode(text,
 * add_special_tokens=False) does: added/special tokens written in the text are recognised, but the post-processor's
 * BOS/EOS are not added. The ids are appended to (*ids)[*n ...], growing *ids with realloc (*cap is its capacity in
 * ids; start with *ids = NULL, *n = *cap = 0; the caller frees *ids). Returns the number of ids appended, or -1 with
 * e filled (then *n is unchanged). */
int snug_tok_encode(const snug_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                    snug_error *e);

/* Decodes ids like `tokenizers` decode(ids, skip_special_tokens=False): special tokens appear as their text. *text
 * receives a malloc'd, NUL-terminated string (the caller frees it) of *len bytes (it may contain NUL bytes). An id
 * outside the vocabulary is an error (SNUG_EINPUT), where `tokenizers` would silently drop it. */
int snug_tok_decode(const snug_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len, snug_error *e);

/* Largest id + 1 over the model vocabulary and the added tokens (the embedding needs at least this many rows). */
int snug_tok_vocab_size(const snug_tokenizer *t);
/* The id of a token string (added tokens first, then the model vocabulary), or -1. */
int snug_tok_token_id(const snug_tokenizer *t, const char *token);
/* 1 when token is one of the added tokens (added_tokens), else 0. */
int snug_tok_is_added(const snug_tokenizer *t, const char *token);
/* The token string of an id (NUL-terminated, owned by t), or NULL for an id that has none. For an added token with
 * normalized=true this is its normalized text, as in `tokenizers` 0.23 (decode uses the same strings). */
const char *snug_tok_id_to_token(const snug_tokenizer *t, int32_t id);

/* The BOS the post-processor puts in front of a single sequence (TemplateProcessing's special token before $A,
 * RobertaProcessing/BertProcessing's cls), or -1 when it adds none. */
int snug_tok_bos_id(const snug_tokenizer *t);
/* 1 when the post-processor prepends a BOS (then snug_tok_bos_id is that id), else 0. */
int snug_tok_adds_bos(const snug_tokenizer *t);
/* The end-of-sequence id, or -1 when none is known. In order: the special token the post-processor appends after a
 * single sequence; else the eos_token of a tokenizer_config.json beside the loaded file; else the first of
 * "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>" that is a special added token. */
int snug_tok_eos_id(const snug_tokenizer *t);
/* 1 when the post-processor appends the EOS to a single sequence, else 0. */
int snug_tok_adds_eos(const snug_tokenizer *t);

/* The BPE model's unk_token id, or -1 when it has none. */
int snug_tok_unk_id(const snug_tokenizer *t);

/* ---- adding tokens (tokenizer_add.c) ----
 * As transformers' add_special_tokens / add_tokens add tokens to a fast tokenizer, with AddedToken(lstrip=False,
 * rstrip=False, normalized=False) as Axolotl passes them: an added token stays as it is; a word of the model's
 * vocabulary becomes an added token with its id (cut out of texts whole from then on); each other token is added with
 * the next id (the vocabulary grows by one). special[i] says whether token i is added as a special token. ids[i]
 * receives each token's id, fresh[i] 1 when it took a new id. */
#define SNUG_TOK_MAX_ADD 512
/* The text of tokenizer.json json (len bytes; file and dir as for loading it) with tokens added, malloc'd in *out
 * (the text unchanged when none is new). */
int snug_tok_json_add(const char *file, const char *dir, const char *json, size_t len, const char *const *tokens,
                      const int *special, int n, int32_t *ids, int *fresh, char **out, snug_error *e);
/* snug_tok_load of path with tokens added (its hash is that of the text with them). */
int snug_tok_load_adding(snug_tokenizer **out, const char *path, const char *const *tokens, const int *special,
                         int n, int32_t *ids, int *fresh, snug_error *e);

/* How many of tokens a tokenizer.json (or a folder's) lacks, read from the file alone (as
 * snug_tok_vocab_size_of_file: a plan counts the vocabulary that tokens added to a tokenizer snug cannot load
 * would give). */
int snug_tok_count_new_in_file(const char *path, const char *const *tokens, int n, int *count, snug_error *e);

/* FNV-1a 64 of the tokenizer.json bytes: a cache key for tokenized data. */
uint64_t snug_tok_hash(const snug_tokenizer *t);

#endif
