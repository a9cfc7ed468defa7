/* tokenizer_bpe.c: the BPE model (vocabulary and merges, one piece -> ids) and the decoders (ids -> text).
 *
 * Merging follows `tokenizers` models/bpe/word.rs merge_all exactly, expired heap entries included: a min-heap of
 * (rank, position) holds every mergeable adjacent pair; the best one is merged, and the pairs it forms with its
 * neighbours are pushed. That is also what makes it O(n log n) on long pieces (a run of 10 000 spaces). */
#include "data/tokenizer_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hashing ---- */

static inline uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h ^ (h >> 15);
}

static inline uint64_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static size_t table_size(size_t n) {
    size_t s = 16;
    while (s < 2 * n + 2)
        s *= 2;
    return s;
}

int32_t tok_vocab_get(const snug_tokenizer *t, const char *s, size_t len) {
    for (size_t i = hash_bytes(s, len) & t->vmask;; i = (i + 1) & t->vmask) {
        const tok_slot *v = &t->vslot[i];
        if (!v->p)
            return -1;
        if (v->len == len && memcmp(v->p, s, len) == 0)
            return v->id;
    }
}

static void vocab_put(snug_tokenizer *t, const char *s, size_t len, int32_t id) {
    size_t i = hash_bytes(s, len) & t->vmask;
    while (t->vslot[i].p)
        i = (i + 1) & t->vmask;
    t->vslot[i] = (tok_slot){s, (uint32_t)len, id};
}

/* (rank, new id) of merging left then right, or 0 when the pair does not merge. */
static inline int merge_get(const snug_tokenizer *t, int32_t left, int32_t right, uint32_t *rank, uint32_t *new_id) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (size_t i = hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->mkey[i] == key) {
            *rank = t->mrank[i];
            *new_id = t->mnew[i];
            return 1;
        }
        if (t->mkey[i] == UINT64_MAX)
            return 0;
    }
}

static void merge_put(snug_tokenizer *t, int32_t left, int32_t right, uint32_t rank, uint32_t new_id) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = hash_pair(key) & t->mmask;
    while (t->mkey[i] != UINT64_MAX && t->mkey[i] != key) /* a repeated pair: the later rank wins, as in HashMap */
        i = (i + 1) & t->mmask;
    t->mkey[i] = key;
    t->mrank[i] = rank;
    t->mnew[i] = new_id;
}

/* ---- loading ---- */

static int opt_string(snug_tokenizer *t, json_t *model, const char *key, char **out, size_t *len, snug_error *e) {
    json_t *v = json_object_get(model, key);
    *out = NULL;
    if (len)
        *len = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return tok_bad(t, e, "model", "\"%s\" must be a string or null", key);
    size_t n = json_string_length(v);
    if (!(*out = tok_strndup(json_string_value(v), n)))
        return tok_oom(e);
    if (len)
        *len = n;
    return 0;
}

/* One merge rule, in either form; a and b point into the JSON (or into split, for the "a b" form). */
static int merge_parts(snug_tokenizer *t, json_t *m, size_t i, char *split, size_t split_cap, const char **a,
                       size_t *alen, const char **b, size_t *blen, snug_error *e) {
    if (json_is_string(m)) {
        size_t n = json_string_length(m);
        const char *s = json_string_value(m), *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1) || n + 1 > split_cap)
            return tok_bad(t, e, "model.merges", "entry %zu \"%.80s\" is not two tokens separated by one space", i,
                           s);
        memcpy(split, s, n);
        *a = split;
        *alen = (size_t)(sp - s);
        *b = split + *alen + 1;
        *blen = n - *alen - 1;
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *blen = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return tok_bad(t, e, "model.merges", "entry %zu must be a string \"a b\" or a pair [\"a\", \"b\"]", i);
}

static int parse_merges(snug_tokenizer *t, json_t *merges, snug_error *e) {
    size_t n = json_array_size(merges);
    t->nmerges = n;
    size_t size = table_size(n);
    t->mmask = size - 1;
    t->mkey = malloc(size * sizeof *t->mkey);
    t->mrank = malloc(size * sizeof *t->mrank);
    t->mnew = malloc(size * sizeof *t->mnew);
    if (!t->mkey || !t->mrank || !t->mnew)
        return tok_oom(e);
    memset(t->mkey, 0xFF, size * sizeof *t->mkey);
    tok_buf joined = {0};
    char *split = NULL;
    size_t split_cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m) && json_string_length(m) + 1 > split_cap) {
            split_cap = 2 * json_string_length(m) + 64;
            char *p = realloc(split, split_cap);
            if (!p) {
                rc = tok_oom(e);
                break;
            }
            split = p;
        }
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if ((rc = merge_parts(t, m, i, split, split_cap, &a, &alen, &b, &blen, e)))
            break;
        int32_t ia = tok_vocab_get(t, a, alen), ib = tok_vocab_get(t, b, blen);
        /* the merged token drops the right part's continuing_subword_prefix */
        size_t skip = t->prefix_len <= blen ? t->prefix_len : blen;
        joined.n = 0;
        if (tok_buf_put(&joined, a, alen) || tok_buf_put(&joined, b + skip, blen - skip)) {
            rc = tok_oom(e);
            break;
        }
        int32_t inew = tok_vocab_get(t, joined.p, joined.n);
        if (ia < 0 || ib < 0 || inew < 0) {
            const char *what = ia < 0 ? a : ib < 0 ? b : joined.p;
            int wlen = (int)(ia < 0 ? alen : ib < 0 ? blen : joined.n);
            rc = tok_bad(t, e, "model.merges", "entry %zu uses the token \"%.*s\", which is not in model.vocab", i,
                         wlen > 80 ? 80 : wlen, what);
            break;
        }
        merge_put(t, ia, ib, (uint32_t)i, (uint32_t)inew);
    }
    free(joined.p);
    free(split);
    return rc;
}

int tok_parse_model(snug_tokenizer *t, json_t *model, snug_error *e) {
    if (!json_is_object(model))
        return tok_bad(t, e, "model", "must be an object");
    const char *type = tok_json_type(model);
    if (type && strcmp(type, "BPE"))
        return tok_bad(t, e, "model.type", "model type \"%s\" is not supported (snug reads BPE models only)", type);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return tok_bad(t, e, "model.vocab", "must be an object mapping tokens to ids");
    if (!json_is_array(merges))
        return tok_bad(t, e, "model.merges", "must be a list%s", type ? "" : " (a model without a type and without "
                                                                          "merges is not a BPE model)");
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && (!json_is_number(dropout) || json_number_value(dropout) != 0.0))
        return tok_bad(t, e, "model.dropout", "BPE dropout is random and not supported; set it to null");
    SNUG_TRY(opt_string(t, model, "unk_token", &t->unk_token, NULL, e));
    SNUG_TRY(opt_string(t, model, "continuing_subword_prefix", &t->prefix, &t->prefix_len, e));
    SNUG_TRY(opt_string(t, model, "end_of_word_suffix", &t->suffix, &t->suffix_len, e));
    t->fuse_unk = tok_json_bool(model, "fuse_unk", 0);
    t->byte_fallback = tok_json_bool(model, "byte_fallback", 0);
    t->ignore_merges = tok_json_bool(model, "ignore_merges", 0);

    /* the vocabulary: strings in one pool, ids may have gaps */
    size_t pool_len = 0, count = 0;
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0)
            return tok_bad(t, e, "model.vocab", "the id of \"%.80s\" must be a non-negative integer", key);
        /* ids index tables as large as the largest id (and a model's vocabulary, which snug bounds the same) */
        if (json_integer_value(val) >= 1 << 24)
            return tok_bad(t, e, "model.vocab", "the id of \"%.80s\" is %lld; snug reads vocabularies of ids below "
                           "2^24 (16777216)", key, (long long)json_integer_value(val));
        if (json_integer_value(val) > max_id)
            max_id = json_integer_value(val);
        pool_len += strlen(key) + 1;
        count++;
    }
    t->vocab_count = count;
    t->vocab_ids = (int32_t)(max_id + 1);
    t->pool = malloc(pool_len + 1);
    t->vocab = calloc((size_t)t->vocab_ids + 1, sizeof *t->vocab);
    size_t size = table_size(count);
    t->vmask = size - 1;
    t->vslot = calloc(size, sizeof *t->vslot);
    if (!t->pool || !t->vocab || !t->vslot)
        return tok_oom(e);
    size_t at = 0;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t n = strlen(key); /* (jansson refuses keys that hold U+0000, so this is the whole key) */
        memcpy(t->pool + at, key, n + 1);
        vocab_put(t, t->pool + at, n, id);
        if (!t->vocab[id].p) /* two tokens with one id: both encode to it, the first decodes from it */
            t->vocab[id] = (tok_str){t->pool + at, (uint32_t)n};
        at += n + 1;
    }
    t->unk_id = t->unk_token ? tok_vocab_get(t, t->unk_token, strlen(t->unk_token)) : -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tok_vocab_get(t, name, 6);
    }
    return parse_merges(t, merges, e);
}

void tok_free_model(snug_tokenizer *t) {
    free(t->pool);
    free(t->vocab);
    free(t->vslot);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    free(t->unk_token);
    free(t->prefix);
    free(t->suffix);
    for (size_t i = 0; i < t->ndec; i++) {
        tok_regex_free(&t->dec[i].re);
        free(t->dec[i].content);
    }
    free(t->dec);
}

/* ---- encoding one piece ---- */

static int add_sym(tok_ctx *c, size_t *n, int32_t id, uint32_t len) {
    if (*n == c->sym_cap) {
        size_t cap = c->sym_cap ? 2 * c->sym_cap : 256;
        tok_sym *s = realloc(c->sym, cap * sizeof *s);
        if (!s)
            return -1;
        c->sym = s;
        c->sym_cap = cap;
    }
    tok_sym *s = c->sym;
    if (*n > 0)
        s[*n - 1].next = (int32_t)*n;
    s[*n] = (tok_sym){id, (int32_t)*n - 1, -1, len};
    (*n)++;
    return 0;
}

static inline int merge_less(tok_merge a, tok_merge b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static int heap_push(tok_ctx *c, size_t *n, tok_merge m) {
    if (*n == c->heap_cap) {
        size_t cap = c->heap_cap ? 2 * c->heap_cap : 256;
        tok_merge *h = realloc(c->heap, cap * sizeof *h);
        if (!h)
            return -1;
        c->heap = h;
        c->heap_cap = cap;
    }
    tok_merge *h = c->heap;
    size_t i = (*n)++;
    while (i > 0 && merge_less(m, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = m;
    return 0;
}

static tok_merge heap_pop(tok_ctx *c, size_t *n) {
    tok_merge *h = c->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= *n)
            break;
        if (k + 1 < *n && merge_less(h[k + 1], h[k]))
            k++;
        if (!merge_less(h[k], last))
            break;
        h[i] = h[k];
        i = k;
    }
    h[i] = last;
    return top;
}

/* word.rs merge_all, without dropout. */
static int merge_all(const snug_tokenizer *t, tok_ctx *c, size_t nsym) {
    tok_sym *s = c->sym;
    size_t nh = 0;
    uint32_t rank, new_id;
    for (size_t i = 0; i + 1 < nsym; i++)
        if (merge_get(t, s[i].id, s[i + 1].id, &rank, &new_id) &&
            heap_push(c, &nh, (tok_merge){rank, (uint32_t)i, new_id}))
            return -1;
    while (nh > 0) {
        tok_merge top = heap_pop(c, &nh);
        tok_sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next == -1)
            continue;
        int32_t next_pos = cur->next;
        tok_sym right = s[next_pos];
        if (!merge_get(t, cur->id, right.id, &rank, &new_id) || new_id != top.new_id)
            continue; /* an expired entry */
        cur->id = (int32_t)top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        s[next_pos].len = 0;
        if (right.next > -1 && (size_t)right.next < nsym)
            s[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && merge_get(t, s[cur->prev].id, cur->id, &rank, &new_id) &&
            heap_push(c, &nh, (tok_merge){rank, (uint32_t)cur->prev, new_id}))
            return -1;
        if (cur->next >= 0 && (size_t)cur->next < nsym && merge_get(t, cur->id, s[cur->next].id, &rank, &new_id) &&
            heap_push(c, &nh, (tok_merge){rank, top.pos, new_id}))
            return -1;
    }
    return 0;
}

int tok_bpe(const snug_tokenizer *t, tok_ctx *c, const char *w, size_t len) {
    if (t->ignore_merges) {
        int32_t id = tok_vocab_get(t, w, len);
        if (id >= 0)
            return tok_emit(c, id);
    }
    size_t nsym = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < len;) {
        size_t cl = (size_t)tok_utf8_len((unsigned char)w[i]);
        if (cl > len - i)
            cl = len - i;
        const char *s = w + i;
        size_t sl = cl;
        int first = i == 0, last = i + cl == len;
        if ((t->prefix && !first) || (t->suffix && last)) {
            c->word.n = 0;
            if ((t->prefix && !first && tok_buf_put(&c->word, t->prefix, t->prefix_len)) ||
                tok_buf_put(&c->word, s, cl) || (t->suffix && last && tok_buf_put(&c->word, t->suffix, t->suffix_len)))
                return tok_oom(c->e), -1;
            s = c->word.p;
            sl = c->word.n;
        }
        i += cl;
        int32_t id = tok_vocab_get(t, s, sl);
        if (id >= 0) {
            if (unk >= 0 && add_sym(c, &nsym, unk, unk_len))
                return tok_oom(c->e), -1;
            unk = -1;
            if (add_sym(c, &nsym, id, (uint32_t)cl))
                return tok_oom(c->e), -1;
            continue;
        }
        if (t->byte_fallback) {
            size_t k = 0;
            while (k < sl && t->byte_id[(unsigned char)s[k]] >= 0)
                k++;
            if (k == sl) { /* every byte has its <0xNN> token (a pending unk stays pending, as upstream) */
                for (k = 0; k < sl; k++)
                    if (add_sym(c, &nsym, t->byte_id[(unsigned char)s[k]], 1))
                        return tok_oom(c->e), -1;
                continue;
            }
        }
        if (!t->unk_token)
            continue; /* no unk token: the character is dropped, as upstream */
        if (t->unk_id < 0)
            return snug_fail(c->e, SNUG_EINPUT, "%s: model.unk_token \"%s\" is needed but is not in model.vocab",
                             t->name, t->unk_token),
                   -1;
        if (unk >= 0 && t->fuse_unk) {
            unk_len += (uint32_t)cl;
            continue;
        }
        if (unk >= 0 && add_sym(c, &nsym, unk, unk_len))
            return tok_oom(c->e), -1;
        unk = t->unk_id;
        unk_len = (uint32_t)cl;
    }
    if (unk >= 0 && add_sym(c, &nsym, unk, unk_len))
        return tok_oom(c->e), -1;
    if (nsym > 1 && merge_all(t, c, nsym))
        return tok_oom(c->e), -1;
    for (size_t i = 0; i < nsym; i++)
        if (c->sym[i].len && tok_emit(c, c->sym[i].id))
            return -1;
    return 0;
}

/* ---- decoders ---- */

static int add_dec(snug_tokenizer *t, tok_dec d, snug_error *e) {
    tok_dec *v = realloc(t->dec, (t->ndec + 1) * sizeof *v);
    if (!v) {
        tok_regex_free(&d.re);
        free(d.content);
        return tok_oom(e);
    }
    t->dec = v;
    t->dec[t->ndec++] = d;
    return 0;
}

static int json_int(json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

int tok_parse_decoder(snug_tokenizer *t, json_t *j, const char *path, snug_error *e) {
    if (!j || json_is_null(j))
        return 0;
    t->has_decoder = 1;
    const char *type = tok_json_type(j);
    if (!type)
        return tok_bad(t, e, path, "a decoder needs a \"type\"");
    char sub[512];
    tok_dec d = {0};
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(j, "decoders");
        if (!json_is_array(list))
            return tok_bad(t, e, path, "Sequence needs a \"decoders\" list");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            SNUG_TRY(tok_parse_decoder(t, json_array_get(list, i), sub, e));
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        d.kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = TOK_DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        d.kind = TOK_DEC_STRIP;
        SNUG_TRY(tok_parse_char(t, j, "content", path, d.ch, &d.ch_len, e));
        d.start = json_int(j, "start", 0);
        d.stop = json_int(j, "stop", 0);
    } else if (!strcmp(type, "Metaspace")) {
        d.kind = TOK_DEC_METASPACE;
        SNUG_TRY(tok_parse_char(t, j, "replacement", path, d.ch, &d.ch_len, e));
        SNUG_TRY(tok_parse_prepend_scheme(t, j, path, &d.prepend, e));
    } else if (!strcmp(type, "BPEDecoder")) {
        d.kind = TOK_DEC_BPE;
        json_t *suffix = json_object_get(j, "suffix");
        if (suffix && (!json_is_string(suffix) || !json_string_length(suffix)))
            return tok_bad(t, e, path, "\"suffix\" must be a non-empty string");
        const char *sv = suffix ? json_string_value(suffix) : "</w>"; /* the default of decoders/bpe.rs */
        d.content_len = strlen(sv);
        if (!(d.content = tok_strndup(sv, d.content_len)))
            return tok_oom(e);
    } else if (!strcmp(type, "Replace")) {
        d.kind = TOK_DEC_REPLACE;
        json_t *content = json_object_get(j, "content");
        if (!json_is_string(content))
            return tok_bad(t, e, path, "\"content\" must be a string");
        snprintf(sub, sizeof sub, "%s.pattern", path);
        SNUG_TRY(tok_parse_pattern(t, json_object_get(j, "pattern"), sub, &d.re, e));
        d.content_len = json_string_length(content);
        if (!(d.content = tok_strndup(json_string_value(content), d.content_len))) {
            tok_regex_free(&d.re);
            return tok_oom(e);
        }
    } else {
        return tok_bad(t, e, path,
                       "decoder type \"%s\" is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, "
                       "Strip, Metaspace, BPEDecoder, Sequence)",
                       type);
    }
    return add_dec(t, d, e);
}

/* A list of token strings: spans into one buffer. */
typedef struct tok_list {
    tok_buf text;
    size_t *off, *len;
    size_t n, cap;
} tok_list;

static int list_add(tok_list *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        size_t *o = realloc(l->off, cap * sizeof *o), *q;
        if (!o)
            return -1;
        l->off = o;
        if (!(q = realloc(l->len, cap * sizeof *q)))
            return -1;
        l->len = q;
        l->cap = cap;
    }
    l->off[l->n] = l->text.n;
    l->len[l->n] = n;
    l->n++;
    return tok_buf_put(&l->text, s, n);
}

/* Appends to the last token of l (which must exist). */
static int list_extend(tok_list *l, const char *s, size_t n) {
    l->len[l->n - 1] += n;
    return tok_buf_put(&l->text, s, n);
}

/* "<0xNN>" -> the byte; u8::from_str_radix also takes a '+' sign, so "<0x+A>" counts too. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char ch = s[i];
        if (i == 3 && ch == '+')
            continue;
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static int valid_utf8(const char *s, size_t n) {
    tok_buf none = {0};
    int r = tok_utf8_sanitize(s, n, &none);
    free(none.p);
    return r == 0;
}

static int apply_decoder(const snug_tokenizer *t, tok_ctx *c, const tok_dec *d, const tok_list *in, tok_list *out) {
    out->n = out->text.n = 0;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL: { /* all tokens -> bytes -> one lossy UTF-8 string */
        tok_buf *raw = &c->tmp, *clean = &c->na;
        raw->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i], start = raw->n, k = 0;
            int ok = 1;
            while (k < n) {
                int l;
                uint32_t cp = tok_utf8_get(s + k, &l);
                k += (size_t)l;
                int b = cp < 324 ? t->bl_byte[cp] : -1;
                if (b < 0) {
                    ok = 0;
                    break;
                }
                char byte = (char)b;
                if (tok_buf_put(raw, &byte, 1))
                    return -1;
            }
            if (!ok) { /* a token outside the ByteLevel alphabet (an added token) passes through as it is */
                raw->n = start;
                if (tok_buf_put(raw, s, n))
                    return -1;
            }
        }
        int r = tok_utf8_sanitize(raw->p ? raw->p : "", raw->n, clean);
        if (r < 0)
            return -1;
        return r ? list_add(out, clean->p, clean->n) : list_add(out, raw->p ? raw->p : "", raw->n);
    }
    case TOK_DEC_BYTEFALLBACK: {
        tok_buf *bytes = &c->tmp;
        bytes->n = 0;
        for (size_t i = 0; i <= in->n; i++) {
            int b = i < in->n ? byte_token(in->text.p + in->off[i], in->len[i]) : -1;
            if (b >= 0) {
                char ch = (char)b;
                if (tok_buf_put(bytes, &ch, 1))
                    return -1;
                continue;
            }
            if (bytes->n) {
                if (valid_utf8(bytes->p, bytes->n)) {
                    if (list_add(out, bytes->p, bytes->n))
                        return -1;
                } else
                    for (size_t k = 0; k < bytes->n; k++) /* invalid: one U+FFFD per byte */
                        if (list_add(out, "\xEF\xBF\xBD", 3))
                            return -1;
                bytes->n = 0;
            }
            if (i < in->n && list_add(out, in->text.p + in->off[i], in->len[i]))
                return -1;
        }
        return 0;
    }
    case TOK_DEC_FUSE:
        if (list_add(out, "", 0))
            return -1;
        for (size_t i = 0; i < in->n; i++)
            if (list_extend(out, in->text.p + in->off[i], in->len[i]))
                return -1;
        return 0;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i], a = 0, b = n, cl = (size_t)d->ch_len;
            for (int k = 0; k < d->start && b - a >= cl && memcmp(s + a, d->ch, cl) == 0; k++)
                a += cl;
            for (int k = 0; k < d->stop && b - a >= cl && memcmp(s + b - cl, d->ch, cl) == 0; k++)
                b -= cl;
            if (list_add(out, s + a, b - a))
                return -1;
        }
        return 0;
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i], cl = (size_t)d->ch_len;
            if (list_add(out, "", 0))
                return -1;
            for (size_t k = 0; k < n;) {
                if (n - k >= cl && memcmp(s + k, d->ch, cl) == 0) {
                    /* the first token loses every replacement character, as upstream does */
                    if (!(i == 0 && d->prepend != TOK_PREPEND_NEVER) && list_extend(out, " ", 1))
                        return -1;
                    k += cl;
                } else {
                    size_t l = (size_t)tok_utf8_len((unsigned char)s[k]);
                    if (list_extend(out, s + k, l))
                        return -1;
                    k += l;
                }
            }
        }
        return 0;
    case TOK_DEC_BPE: /* every suffix becomes a space, in the last token nothing (decoders/bpe.rs) */
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i], pos = 0, sl = d->content_len;
            if (list_add(out, "", 0))
                return -1;
            for (size_t k = 0; k + sl <= n;) {
                if (memcmp(s + k, d->content, sl) == 0) {
                    if (list_extend(out, s + pos, k - pos) || (i + 1 < in->n && list_extend(out, " ", 1)))
                        return -1;
                    pos = k += sl;
                } else
                    k++;
            }
            if (list_extend(out, s + pos, n - pos))
                return -1;
        }
        return 0;
    case TOK_DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i], pos = 0;
            if (list_add(out, "", 0))
                return -1;
            while (pos <= n) { /* (a pattern that matches the empty string replaces nothing here) */
                size_t ms, me;
                int rc = tok_regex_find(&d->re, c->md, s, n, pos, &ms, &me);
                if (rc < 0)
                    return -1;
                if (rc == 0 || ms == me)
                    break;
                if (list_extend(out, s + pos, ms - pos) || list_extend(out, d->content, d->content_len))
                    return -1;
                pos = me;
            }
            if (list_extend(out, s + pos, n - pos))
                return -1;
        }
        return 0;
    }
    return 0;
}

int tok_decode_tokens(const snug_tokenizer *t, const tok_str *toks, size_t n, tok_buf *out, snug_error *e) {
    tok_ctx c;
    if (tok_ctx_init(&c, e))
        return -1;
    tok_list a = {0}, b = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = list_add(&a, toks[i].p, toks[i].len);
    for (size_t k = 0; k < t->ndec && !rc; k++) {
        rc = apply_decoder(t, &c, &t->dec[k], &a, &b);
        tok_list x = a;
        a = b;
        b = x;
    }
    out->n = 0;
    for (size_t i = 0; i < a.n && !rc; i++) /* no decoder: tokens joined by spaces, as upstream */
        rc = (!t->has_decoder && i > 0 && tok_buf_put(out, " ", 1)) || tok_buf_put(out, a.text.p + a.off[i], a.len[i]);
    if (!rc)
        rc = tok_buf_put(out, "", 1) ? -1 : 0; /* NUL-terminate */
    if (!rc)
        out->n--;
    free(a.text.p);
    free(a.off);
    free(a.len);
    free(b.text.p);
    free(b.off);
    free(b.len);
    tok_ctx_free(&c);
    if (rc)
        return snug_fail(e, SNUG_ENOMEM, "tokenizer: out of memory while decoding");
    return 0;
}
