/* tokenizer_base.h: the insides of snug_tokenizer, shared by its files:
 *   tokenizer.c       loading tokenizer.json, added tokens, the post-processor, the encode pipeline, the public API;
 *   tokenizer_base.c  the base the others stand on: errors, JSON helpers, the encode scratch, buffers, UTF-8,
 *                     regexes (Oniguruma's meaning on PCRE2), splitting at matches;
 *   tokenizer_pre.c   normalizers and pre-tokenizers (text -> pieces);
 *   tokenizer_bpe.c   the BPE model (vocabulary, merges, pieces -> ids) and the decoders (ids -> text);
 *   tokenizer_scripts.c  the script table of the UnicodeScripts pre-tokenizer (generated).
 *
 * Encoding follows `tokenizers` step by step, on plain strings (no offsets are kept):
 *   text -> valid UTF-8 -> split out non-normalized added tokens -> normalize each remaining segment -> split out
 *   normalized added tokens -> pre-tokenize each remaining segment into pieces -> BPE each piece -> ids.
 * Every scratch buffer lives in a tok_ctx owned by one encode call, so a loaded tokenizer is never written to. */
#ifndef SNUG_TOKENIZER_BASE_H
#define SNUG_TOKENIZER_BASE_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "data/tokenizer.h"

/* ---- small containers ---- */

typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

int tok_buf_reserve(tok_buf *b, size_t extra); /* 0, or -1 when out of memory */
static inline int tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (b->cap - b->n < n && tok_buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* A piece of text produced by pre-tokenization: bytes [off, off + len) of the owning tok_pieces' text. at_start: the
 * piece begins at byte 0 of the original input (Metaspace's prepend_scheme "first" needs to know). */
typedef struct tok_piece {
    size_t off, len;
    int at_start;
} tok_piece;

typedef struct tok_pieces {
    tok_piece *v;
    size_t n, cap;
    tok_buf text;
} tok_pieces;

int tok_pieces_add(tok_pieces *ps, const char *s, size_t len, int at_start); /* copies s into ps->text */

typedef struct tok_str {
    const char *p; /* NULL: no token has this id */
    uint32_t len;
} tok_str;

typedef struct tok_slot {
    const char *p; /* NULL: empty */
    uint32_t len;
    int32_t id;
} tok_slot;

typedef struct tok_ctx tok_ctx;
typedef struct tok_event tok_event;

/* ---- regexes ---- */

typedef struct tok_regex {
    pcre2_code *code; /* NULL: not set */
    int jit;
} tok_regex;

/* Compiles pattern (Oniguruma syntax as written in tokenizer.json) for UTF-8 text. literal: match the bytes as they
 * are. On failure writes a one-line reason into why and returns -1. */
int tok_regex_compile(tok_regex *re, const char *pattern, size_t len, int literal, char *why, size_t why_len);
void tok_regex_free(tok_regex *re);
/* Finds the first match in s[from, len): 1 with [*ms, *me), 0 for none, -1 on a matching failure. */
int tok_regex_find(const tok_regex *re, pcre2_match_data *md, const char *s, size_t len, size_t from, size_t *ms,
                   size_t *me);

/* Cuts s[0, len) into stretches the regex matched and stretches between (c->ev[0 .. *nev)), as `tokenizers`
 * iterates Oniguruma matches. -1 on failure (c->e filled). */
int tok_regex_events(tok_ctx *c, const tok_regex *re, const char *s, size_t len, size_t *nev);
/* The same with every occurrence of one character as a match (Metaspace). */
int tok_char_events(tok_ctx *c, const char *ch, int ch_len, const char *s, size_t len, size_t *nev);
/* The same with every character for which pred(code point, arg) is true as a match of its own (`tokenizers`' char
 * patterns: Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit). */
int tok_pred_events(tok_ctx *c, int (*pred)(uint32_t cp, const void *arg), const void *arg, const char *s,
                    size_t len, size_t *nev);
/* Applies a Split behavior (TOK_ISOLATED...) in place; afterwards the events with match == 0 are the pieces. */
size_t tok_apply_behavior(tok_event *ev, size_t n, int behavior, int invert);

/* ---- UTF-8 ---- */

/* Length of the (valid) UTF-8 character starting with byte c. */
static inline int tok_utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
uint32_t tok_utf8_get(const char *s, int *len); /* decodes one valid character */
int tok_utf8_put(uint32_t cp, char out[4]);      /* encodes; returns the length */
/* Copies s to out with every maximal invalid subsequence replaced by U+FFFD (Python's errors="replace"). Returns 1
 * when something was replaced, 0 when s is valid (out untouched), -1 when out of memory. */
int tok_utf8_sanitize(const char *s, size_t len, tok_buf *out);
int tok_is_white_space(uint32_t cp); /* Unicode White_Space: Rust's char::is_whitespace and Oniguruma's \s */

/* tokenizer_scripts.c: the script number of a code point in the table of `tokenizers`' UnicodeScripts (0: Any) */
int tok_script(uint32_t cp);
extern const int tok_script_han, tok_script_hiragana, tok_script_katakana;

/* ---- the loaded tokenizer ---- */

enum { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_LOWERCASE, TOK_NORM_PREPEND,
       TOK_NORM_REPLACE, TOK_NORM_STRIP, TOK_NORM_STRIP_ACCENTS, TOK_NORM_NMT, TOK_NORM_BYTELEVEL };

typedef struct tok_norm {
    int kind;
    char *str;       /* Prepend: the text */
    size_t str_len;
    char *content;   /* Replace: the replacement */
    size_t content_len;
    tok_regex re;    /* Replace: the pattern (a String pattern is compiled as a literal) */
    int left, right; /* Strip */
} tok_norm;

/* TOK_PRE_CHARS: split at every character of a class (Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit, and
 * BertPreTokenizer as WhitespaceSplit then Punctuation); TOK_PRE_WHITESPACE: the runs of \w and of [^\w\s] (Rust
 * regex classes); TOK_PRE_SCRIPTS: UnicodeScripts; TOK_PRE_FIXED: FixedLength. */
enum { TOK_PRE_BYTELEVEL, TOK_PRE_SPLIT, TOK_PRE_METASPACE, TOK_PRE_CHARS, TOK_PRE_WHITESPACE, TOK_PRE_SCRIPTS,
       TOK_PRE_FIXED };
enum { TOK_CLASS_NUMERIC, TOK_CLASS_PUNCT, TOK_CLASS_WHITESPACE, TOK_CLASS_CHAR };
enum { TOK_ISOLATED, TOK_REMOVED, TOK_MERGED_PREV, TOK_MERGED_NEXT, TOK_CONTIGUOUS };
enum { TOK_PREPEND_NEVER, TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST };

typedef struct tok_pre {
    int kind;
    int add_prefix_space, use_regex; /* ByteLevel */
    tok_regex re;                    /* Split (a String pattern is compiled as a literal); ByteLevel's GPT-2 regex */
    int behavior, invert;            /* Split; behavior also for TOK_PRE_CHARS */
    int char_class;                  /* TOK_PRE_CHARS: TOK_CLASS_* */
    uint32_t delim;                  /* TOK_PRE_CHARS with TOK_CLASS_CHAR: the delimiter */
    size_t length;                   /* FixedLength: characters per piece */
    char rep[4];                     /* Metaspace: the replacement character */
    int rep_len;
    int prepend;                     /* Metaspace: TOK_PREPEND_* */
    int split;                       /* Metaspace */
} tok_pre;

enum { TOK_DEC_BYTELEVEL, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE, TOK_DEC_STRIP, TOK_DEC_METASPACE,
       TOK_DEC_BPE };

typedef struct tok_dec {
    int kind;
    tok_regex re;      /* Replace (a String pattern is compiled as a literal) */
    char *content;     /* Replace; BPEDecoder: the suffix */
    size_t content_len;
    char ch[4];        /* Strip: the character; Metaspace: the replacement */
    int ch_len;
    int start, stop;   /* Strip */
    int prepend;       /* Metaspace: TOK_PREPEND_* */
} tok_dec;

typedef struct tok_added {
    char *content;
    size_t len;
    char *norm;        /* the content after the normalizer (normalized tokens only) */
    size_t norm_len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* Leftmost-longest matching over a set of added tokens (what `tokenizers` does with aho-corasick): the patterns are
 * bucketed by first byte, longest first. */
typedef struct tok_matcher {
    int32_t *pat;        /* indices into snug_tokenizer.added */
    size_t n;
    uint32_t first[257]; /* pat[first[c] .. first[c+1]) start with byte c */
    int use_norm;        /* patterns are the normalized contents */
} tok_matcher;

struct snug_tokenizer {
    char *name;          /* for error messages */
    uint64_t hash;

    /* BPE model */
    char *pool;          /* every vocabulary string, NUL-separated */
    tok_str *vocab;      /* [vocab_ids] model id -> token */
    int32_t vocab_ids;   /* largest model id + 1 */
    size_t vocab_count;  /* entries in model.vocab (what `tokenizers` calls the model's vocab size) */
    tok_slot *vslot;     /* model.vocab by text (open addressing; several tokens may share an id) */
    size_t vmask;
    uint64_t *mkey;      /* merges: (left id << 32 | right id), UINT64_MAX = empty */
    uint32_t *mrank, *mnew;
    size_t mmask, nmerges;
    char *unk_token;     /* NULL: none */
    int32_t unk_id;      /* -1 when unk_token is not in the vocabulary (an error once needed) */
    int fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    size_t prefix_len, suffix_len;
    int32_t byte_id[256];  /* id of "<0xNN>", or -1 */

    /* added tokens */
    tok_added *added;
    size_t nadded;
    tok_matcher raw, normed;

    /* pipeline */
    tok_norm *norm;
    size_t nnorm;
    tok_pre *pre;
    size_t npre;
    tok_dec *dec;
    size_t ndec;
    int has_decoder;

    /* every id -> its token (added tokens over the model's) */
    tok_str *id_tok;
    int32_t nids;

    int32_t bos_id, eos_id;
    int adds_bos, adds_eos;

    /* ByteLevel's byte <-> character tables */
    char bl_char[256][2];
    uint8_t bl_char_len[256];
    int16_t bl_byte[324]; /* code point -> byte, -1 when not a ByteLevel character */
};

/* ---- per-call scratch ---- */

typedef struct tok_sym {
    int32_t id, prev, next;
    uint32_t len;
} tok_sym;

typedef struct tok_merge {
    uint32_t rank, pos, new_id;
} tok_merge;

/* One stretch of a string being split: [start, end), and whether the pattern matched it. */
struct tok_event {
    size_t start, end;
    int match;
};

struct tok_ctx {
    pcre2_match_data *md;
    tok_event *ev;
    size_t ev_cap;
    tok_buf clean, na, nb, tmp; /* sanitized input, normalizer ping-pong, misc */
    tok_pieces pa, pb;          /* pre-tokenizer ping-pong */
    tok_sym *sym;
    size_t sym_cap;
    tok_merge *heap;
    size_t heap_cap;
    tok_buf word;               /* a character with prefix/suffix attached */
    int32_t **ids;              /* the caller's output */
    size_t *n, *cap;
    snug_error *e;
};

int tok_ctx_init(tok_ctx *c, snug_error *e);
void tok_ctx_free(tok_ctx *c);
int tok_emit(tok_ctx *c, int32_t id); /* appends to the caller's ids; -1 when out of memory (e filled) */

/* tokenizer_pre.c */
int tok_parse_normalizer(snug_tokenizer *t, json_t *j, const char *path, snug_error *e);
int tok_parse_pre_tokenizer(snug_tokenizer *t, json_t *j, const char *path, snug_error *e);
/* Runs the normalizers over s; the result is in *out (which points at c->na or c->nb, or at s itself when there
 * are no normalizers). -1 on failure (e filled). */
int tok_normalize(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, const char **out, size_t *out_len);
/* Pre-tokenizes one segment; the pieces are left in *out (c->pa or c->pb). */
int tok_pre_tokenize(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, int at_start,
                     tok_pieces **out);
/* Metaspace's prepend_scheme, or the older add_prefix_space (false = never), for the pre-tokenizer and decoder. */
int tok_parse_prepend_scheme(snug_tokenizer *t, json_t *j, const char *path, int *prepend, snug_error *e);
void tok_free_pipeline(snug_tokenizer *t);
void tok_bytelevel_tables(snug_tokenizer *t);

/* tokenizer_bpe.c */
int tok_parse_model(snug_tokenizer *t, json_t *model, snug_error *e);
int tok_parse_decoder(snug_tokenizer *t, json_t *j, const char *path, snug_error *e);
int32_t tok_vocab_get(const snug_tokenizer *t, const char *s, size_t len); /* model id or -1 */
int tok_bpe(const snug_tokenizer *t, tok_ctx *c, const char *w, size_t len); /* appends the ids of one piece */
int tok_decode_tokens(const snug_tokenizer *t, const tok_str *toks, size_t n, tok_buf *out, snug_error *e);
void tok_free_model(snug_tokenizer *t);

/* JSON helpers (tokenizer.c) */
const char *tok_json_type(json_t *j);                                    /* the "type" string or NULL */
int tok_json_bool(json_t *obj, const char *key, int dflt);
int tok_bad(snug_tokenizer *t, snug_error *e, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));                              /* SNUG_EINPUT "<name>: <path>: ..." */
int tok_oom(snug_error *e);
/* Reads a {"String": s} or {"Regex": r} pattern into re. */
int tok_parse_pattern(snug_tokenizer *t, json_t *j, const char *path, tok_regex *re, snug_error *e);
/* Reads a one-character string (Metaspace replacement, Strip content). */
int tok_parse_char(snug_tokenizer *t, json_t *obj, const char *key, const char *path, char ch[4], int *len,
                   snug_error *e);
char *tok_strndup(const char *s, size_t n);

/* The tokenizer.json a path names (itself, or a folder's) and the folder whose tokenizer_config.json goes with it. */
void tok_paths(const char *path, char *file, size_t nfile, char *dir, size_t ndir);
/* A tokenizer from the len bytes of a tokenizer.json's text (file: its name in errors; dir: where its
 * tokenizer_config.json is looked for), as snug_tok_load loads the file. */
int tok_load_text(snug_tokenizer **out, const char *file, const char *dir, const char *buf, size_t len,
                  snug_error *e);

#endif
