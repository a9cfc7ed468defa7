/* tokenizer_pre.c: the text side of the tokenizer: UTF-8, regexes, normalizers and pre-tokenizers.
 *
 * Each normalizer maps a whole string to a new string; each pre-tokenizer maps a list of pieces to a new list. The
 * rules (which piece gets a prefix, how a split treats its delimiters, which empty pieces vanish) are those of
 * `tokenizers` (normalizer.rs split(), pre_tokenizers/{byte_level,split,metaspace}.rs), checked against it by
 * tests/parity/test_tokenizer_parity.py. See tokenizer_impl.h for the whole pipeline. */
#include "data/tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- buffers ---- */

int tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->cap - b->n >= extra)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->n < extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tok_pieces_add(tok_pieces *ps, const char *s, size_t len, int at_start) {
    if (len == 0) /* `tokenizers` drops empty pieces after every split */
        return 0;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? 2 * ps->cap : 64;
        tok_piece *v = realloc(ps->v, cap * sizeof *v);
        if (!v)
            return -1;
        ps->v = v;
        ps->cap = cap;
    }
    size_t off = ps->text.n;
    if (tok_buf_put(&ps->text, s, len))
        return -1;
    ps->v[ps->n++] = (tok_piece){off, len, at_start};
    return 0;
}

/* ---- UTF-8 ---- */

uint32_t tok_utf8_get(const char *s, int *len) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *len = 1;
        return u[0];
    }
    if (u[0] < 0xE0) {
        *len = 2;
        return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    }
    if (u[0] < 0xF0) {
        *len = 3;
        return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    }
    *len = 4;
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 |
           (u[3] & 0x3F);
}

int tok_utf8_put(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at u[0..n), or the negated length of its longest valid prefix (the "maximal
 * subpart" that becomes one U+FFFD; at least 1) when it is invalid. */
static int utf8_check(const unsigned char *u, size_t n) {
    unsigned char c = u[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n)
            return -k;
        unsigned char b = u[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF))
            return -k;
    }
    return need + 1;
}

int tok_utf8_sanitize(const char *s, size_t len, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) { /* fast scan: most text is valid */
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_check(u + i, len - i);
        if (k < 0)
            break;
        i += (size_t)k;
    }
    if (i == len)
        return 0;
    out->n = 0;
    if (tok_buf_reserve(out, len + len / 2 + 16) || tok_buf_put(out, s, i))
        return -1;
    while (i < len) {
        int k = utf8_check(u + i, len - i);
        if (k > 0) {
            if (tok_buf_put(out, s + i, (size_t)k))
                return -1;
            i += (size_t)k;
        } else {
            if (tok_buf_put(out, "\xEF\xBF\xBD", 3))
                return -1;
            i += (size_t)-k;
        }
    }
    return 1;
}

int tok_is_white_space(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 9 && cp <= 13) || cp == 32;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- regexes ---- */

/* Oniguruma's \s is exactly Unicode White_Space; PCRE2's (with UCP) adds U+180E. Oniguruma's \h is a hex digit,
 * PCRE2's a horizontal space. These class bodies say what Oniguruma means. */
#define WS_BODY "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define HEX_BODY "0-9a-fA-F"

static int rewrite_onig(const char *p, size_t n, tok_buf *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '\\' && i + 1 < n) {
            char x = p[++i];
            const char *body = x == 's' || x == 'S' ? WS_BODY : x == 'h' || x == 'H' ? HEX_BODY : NULL;
            int neg = x == 'S' || x == 'H';
            if (!body) {
                char two[2] = {'\\', x};
                if (tok_buf_put(out, two, 2))
                    return -1;
            } else if (in_class && !neg) {
                if (tok_buf_put(out, body, strlen(body)))
                    return -1;
            } else if (in_class) { /* a negated set inside a class cannot be spelled out; keep PCRE2's */
                char two[2] = {'\\', x};
                if (tok_buf_put(out, two, 2))
                    return -1;
            } else if (tok_buf_put(out, neg ? "[^" : "[", neg ? 2 : 1) || tok_buf_put(out, body, strlen(body)) ||
                       tok_buf_put(out, "]", 1))
                return -1;
            continue;
        }
        if (!in_class && ch == '[') {
            in_class = 1;
            if (tok_buf_put(out, "[", 1))
                return -1;
            if (i + 1 < n && p[i + 1] == '^') /* "[^]" and "[]": a leading ']' is a literal */
                if (tok_buf_put(out, &p[++i], 1))
                    return -1;
            if (i + 1 < n && p[i + 1] == ']')
                if (tok_buf_put(out, &p[++i], 1))
                    return -1;
            continue;
        }
        if (in_class && ch == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *end = memchr(p + i, ']', n - i);
            size_t stop = end ? (size_t)(end - p) : n - 1;
            if (tok_buf_put(out, p + i, stop - i + 1))
                return -1;
            i = stop;
            continue;
        }
        if (in_class && ch == ']')
            in_class = 0;
        if (tok_buf_put(out, &ch, 1))
            return -1;
    }
    return 0;
}

int tok_regex_compile(tok_regex *re, const char *pattern, size_t len, int literal, char *why, size_t why_len) {
    tok_buf pat = {0};
    if (literal) {
        if (tok_buf_put(&pat, pattern, len)) {
            snprintf(why, why_len, "out of memory");
            return -1;
        }
    } else if (rewrite_onig(pattern, len, &pat)) {
        snprintf(why, why_len, "out of memory");
        free(pat.p);
        return -1;
    }
    /* MULTILINE: in Oniguruma's (Ruby) syntax ^ and $ match at every line break. */
    uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
    int err;
    PCRE2_SIZE erroff;
    re->code = pcre2_compile((PCRE2_SPTR)(pat.p ? pat.p : ""), pat.n, opts, &err, &erroff, NULL);
    free(pat.p);
    if (!re->code) {
        char msg[256];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        snprintf(why, why_len, "%s (near character %zu)", msg, (size_t)erroff);
        return -1;
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

void tok_regex_free(tok_regex *re) {
    if (re->code)
        pcre2_code_free(re->code);
    re->code = NULL;
}

int tok_regex_find(const tok_regex *re, pcre2_match_data *md, const char *s, size_t len, size_t from, size_t *ms,
                   size_t *me) {
    int rc;
    if (!re->code) /* an empty String pattern */
        return 0;
    if (re->jit)
        rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, len, from, 0, md, NULL);
    else
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter keeps its stack on the heap */
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) /* rc == 0 only says the ovector was too short for the groups; the match itself is there */
        return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static int grow_events(tok_ctx *c, size_t need) {
    if (need <= c->ev_cap)
        return 0;
    size_t cap = c->ev_cap ? c->ev_cap : 64;
    while (cap < need)
        cap *= 2;
    tok_event *v = realloc(c->ev, cap * sizeof *v);
    if (!v)
        return -1;
    c->ev = v;
    c->ev_cap = cap;
    return 0;
}

/* Cuts s into stretches that the regex matched and stretches between, the way `tokenizers` iterates Oniguruma
 * matches: an empty match right after the previous match is skipped by advancing one character. */
static int regex_events(tok_ctx *c, const tok_regex *re, const char *s, size_t len, size_t *nev) {
    size_t n = 0, pos = 0, prev = 0, last_end = (size_t)-1;
    while (pos <= len) {
        size_t ms, me;
        int rc = tok_regex_find(re, c->md, s, len, pos, &ms, &me);
        if (rc < 0)
            return snug_fail(c->e, SNUG_EINTERNAL, "tokenizer: a regex failed while matching (PCRE2 limit)"), -1;
        if (rc == 0)
            break;
        if (ms == me && me == last_end) {
            pos += pos < len ? (size_t)tok_utf8_len((unsigned char)s[pos]) : 1;
            continue;
        }
        pos = last_end = me;
        if (grow_events(c, n + 3))
            return tok_oom(c->e), -1;
        if (prev != ms)
            c->ev[n++] = (tok_event){prev, ms, 0};
        c->ev[n++] = (tok_event){ms, me, 1};
        prev = me;
    }
    if (grow_events(c, n + 1))
        return tok_oom(c->e), -1;
    if (prev != len)
        c->ev[n++] = (tok_event){prev, len, 0};
    *nev = n;
    return 0;
}

/* The same for a single delimiter character (Metaspace): every occurrence is its own match. */
static int char_events(tok_ctx *c, const char *ch, int ch_len, const char *s, size_t len, size_t *nev) {
    size_t n = 0, prev = 0;
    for (size_t i = 0; i + (size_t)ch_len <= len;) {
        if (memcmp(s + i, ch, (size_t)ch_len) == 0) {
            if (grow_events(c, n + 2))
                return tok_oom(c->e), -1;
            if (prev != i)
                c->ev[n++] = (tok_event){prev, i, 0};
            c->ev[n++] = (tok_event){i, i + (size_t)ch_len, 1};
            prev = i += (size_t)ch_len;
        } else
            i += (size_t)tok_utf8_len((unsigned char)s[i]);
    }
    if (grow_events(c, n + 1))
        return tok_oom(c->e), -1;
    if (prev != len)
        c->ev[n++] = (tok_event){prev, len, 0};
    *nev = n;
    return 0;
}

/* Applies a SplitDelimiterBehavior to the events in place (normalizer.rs NormalizedString::split): afterwards
 * every event with match == 0 is a piece to keep and match == 1 one to drop. */
static size_t apply_behavior(tok_event *ev, size_t n, int behavior, int invert) {
    if (invert)
        for (size_t i = 0; i < n; i++)
            ev[i].match = !ev[i].match;
    size_t m = 0;
    int prev = 0;
    switch (behavior) {
    case TOK_ISOLATED:
        for (size_t i = 0; i < n; i++)
            ev[i].match = 0;
        return n;
    case TOK_REMOVED:
        return n;
    case TOK_CONTIGUOUS:
    case TOK_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            tok_event v = ev[i];
            int merge = behavior == TOK_CONTIGUOUS ? v.match == prev : v.match && !prev;
            if (merge && m > 0)
                ev[m - 1].end = v.end;
            else
                ev[m++] = (tok_event){v.start, v.end, 0};
            prev = v.match;
        }
        return m;
    case TOK_MERGED_NEXT: /* walk backwards, then restore the order */
        for (size_t k = n; k-- > 0;) {
            tok_event v = ev[k];
            if (v.match && !prev && m > 0)
                ev[n - m].start = v.start;
            else {
                ev[n - m - 1] = (tok_event){v.start, v.end, 0};
                m++;
            }
            prev = v.match;
        }
        memmove(ev, ev + (n - m), m * sizeof *ev);
        return m;
    }
    return n;
}

/* ---- normalizers ---- */

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return 0;
    return 1;
}

static int norm_unicode(int kind, const char *s, size_t len, tok_buf *out) {
    if (is_ascii(s, len))
        return tok_buf_put(out, s, len);
    int opts = UTF8PROC_STABLE;
    opts |= kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD)
        opts |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst, opts);
    if (r < 0)
        return -1;
    int rc = tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return rc;
}

/* `tokenizers` lowercases character by character with Rust's char::to_lowercase: simple mappings plus U+0130 ->
 * "i\u0307" (there is no final-sigma rule at this level). */
static int norm_lowercase(const char *s, size_t len, tok_buf *out) {
    if (tok_buf_reserve(out, len))
        return -1;
    for (size_t i = 0; i < len;) {
        unsigned char b = (unsigned char)s[i];
        if (b < 0x80) {
            char lc = (char)(b >= 'A' && b <= 'Z' ? b + 32 : b);
            if (tok_buf_put(out, &lc, 1))
                return -1;
            i++;
            continue;
        }
        int l;
        uint32_t cp = tok_utf8_get(s + i, &l), lc;
        if (cp == 0x130) {
            if (tok_buf_put(out, "i\xCC\x87", 3))
                return -1;
            i += (size_t)l;
            continue;
        }
        lc = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        char enc[4];
        if (tok_buf_put(out, enc, (size_t)tok_utf8_put(lc, enc)))
            return -1;
        i += (size_t)l;
    }
    return 0;
}

static int norm_replace(tok_ctx *c, const tok_norm *op, const char *s, size_t len, tok_buf *out) {
    size_t nev;
    if (regex_events(c, &op->re, s, len, &nev))
        return -1;
    for (size_t i = 0; i < nev; i++) {
        const tok_event *v = &c->ev[i];
        if (v->match ? tok_buf_put(out, op->content, op->content_len)
                     : tok_buf_put(out, s + v->start, v->end - v->start))
            return tok_oom(c->e), -1;
    }
    return 0;
}

static int norm_strip(const tok_norm *op, const char *s, size_t len, tok_buf *out) {
    size_t a = 0, b = len;
    int l;
    while (op->left && a < b && tok_is_white_space(tok_utf8_get(s + a, &l)))
        a += (size_t)l;
    while (op->right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80)
            j--;
        if (!tok_is_white_space(tok_utf8_get(s + j, &l)))
            break;
        b = j;
    }
    return tok_buf_put(out, s + a, b - a);
}

static int norm_strip_accents(const char *s, size_t len, tok_buf *out) {
    for (size_t i = 0; i < len;) {
        int l;
        uint32_t cp = tok_utf8_get(s + i, &l);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        if (k != UTF8PROC_CATEGORY_MN && k != UTF8PROC_CATEGORY_MC && k != UTF8PROC_CATEGORY_ME)
            if (tok_buf_put(out, s + i, (size_t)l))
                return -1;
        i += (size_t)l;
    }
    return 0;
}

int tok_normalize(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, const char **out,
                  size_t *out_len) {
    const char *cur = s;
    size_t cur_len = len;
    for (size_t k = 0; k < t->nnorm; k++) {
        const tok_norm *op = &t->norm[k];
        tok_buf *dst = cur == c->na.p ? &c->nb : &c->na;
        dst->n = 0;
        int rc = 0;
        switch (op->kind) {
        case TOK_NORM_NFC:
        case TOK_NORM_NFD:
        case TOK_NORM_NFKC:
        case TOK_NORM_NFKD:
            rc = norm_unicode(op->kind, cur, cur_len, dst);
            break;
        case TOK_NORM_LOWERCASE:
            rc = norm_lowercase(cur, cur_len, dst);
            break;
        case TOK_NORM_PREPEND:
            if (cur_len)
                rc = tok_buf_put(dst, op->str, op->str_len);
            rc = rc || tok_buf_put(dst, cur, cur_len);
            break;
        case TOK_NORM_REPLACE:
            if (norm_replace(c, op, cur, cur_len, dst))
                return -1;
            break;
        case TOK_NORM_STRIP:
            rc = norm_strip(op, cur, cur_len, dst);
            break;
        case TOK_NORM_STRIP_ACCENTS:
            rc = norm_strip_accents(cur, cur_len, dst);
            break;
        }
        if (rc)
            return snug_fail(c->e, SNUG_ENOMEM, "tokenizer: out of memory while normalizing"), -1;
        if (tok_buf_reserve(dst, 1)) /* so that an empty result still has a non-NULL pointer */
            return tok_oom(c->e), -1;
        cur = dst->p;
        cur_len = dst->n;
    }
    *out = cur;
    *out_len = cur_len;
    return 0;
}

/* ---- pre-tokenizers ---- */

/* ByteLevel: optional leading space, the GPT-2 split, then every byte becomes its printable stand-in. */
static int pre_bytelevel(const snug_tokenizer *t, tok_ctx *c, const tok_pre *p, const char *s, size_t len,
                         int at_start, tok_pieces *out) {
    tok_buf *w = &c->tmp;
    w->n = 0;
    if ((p->add_prefix_space && s[0] != ' ' && tok_buf_put(w, " ", 1)) || tok_buf_put(w, s, len))
        return tok_oom(c->e), -1;
    size_t nev = 1;
    if (p->use_regex) {
        if (regex_events(c, &p->re, w->p, w->n, &nev))
            return -1;
    } else {
        if (grow_events(c, 1))
            return tok_oom(c->e), -1;
        c->ev[0] = (tok_event){0, w->n, 0};
    }
    for (size_t i = 0; i < nev; i++) {
        const tok_event *v = &c->ev[i];
        if (v->end == v->start)
            continue;
        size_t off = out->text.n;
        if (tok_buf_reserve(&out->text, 2 * (v->end - v->start)))
            return tok_oom(c->e), -1;
        char *d = out->text.p + off;
        for (size_t k = v->start; k < v->end; k++) {
            unsigned char b = (unsigned char)w->p[k];
            *d++ = t->bl_char[b][0];
            if (t->bl_char_len[b] == 2)
                *d++ = t->bl_char[b][1];
        }
        size_t n = (size_t)(d - (out->text.p + off));
        out->text.n += n;
        if (out->n == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 64;
            tok_piece *nv = realloc(out->v, cap * sizeof *nv);
            if (!nv)
                return tok_oom(c->e), -1;
            out->v = nv;
            out->cap = cap;
        }
        /* a prepended space maps back to original offset 0 as well */
        out->v[out->n++] = (tok_piece){off, n, at_start && v->start == 0};
    }
    return 0;
}

static int pre_split(tok_ctx *c, const tok_pre *p, const char *s, size_t len, int at_start, tok_pieces *out) {
    size_t nev;
    if (regex_events(c, &p->re, s, len, &nev))
        return -1;
    nev = apply_behavior(c->ev, nev, p->behavior, p->invert);
    for (size_t i = 0; i < nev; i++)
        if (!c->ev[i].match &&
            tok_pieces_add(out, s + c->ev[i].start, c->ev[i].end - c->ev[i].start, at_start && c->ev[i].start == 0))
            return tok_oom(c->e), -1;
    return 0;
}

static int pre_metaspace(tok_ctx *c, const tok_pre *p, const char *s, size_t len, int at_start, tok_pieces *out) {
    tok_buf *w = &c->tmp;
    w->n = 0;
    int starts_rep = len >= (size_t)p->rep_len && memcmp(s, p->rep, (size_t)p->rep_len) == 0;
    if (!starts_rep && len > 0 && s[0] == ' ')
        starts_rep = 1; /* the leading space becomes the replacement */
    int prepend = !starts_rep && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && at_start));
    if (prepend && tok_buf_put(w, p->rep, (size_t)p->rep_len))
        return tok_oom(c->e), -1;
    for (size_t i = 0; i < len; i++) {
        size_t j = i;
        while (j < len && s[j] != ' ')
            j++;
        if (tok_buf_put(w, s + i, j - i) || (j < len && tok_buf_put(w, p->rep, (size_t)p->rep_len)))
            return tok_oom(c->e), -1;
        i = j;
    }
    if (!p->split)
        return tok_pieces_add(out, w->p, w->n, at_start) ? tok_oom(c->e), -1 : 0;
    size_t nev;
    if (char_events(c, p->rep, p->rep_len, w->p, w->n, &nev))
        return -1;
    nev = apply_behavior(c->ev, nev, TOK_MERGED_NEXT, 0);
    for (size_t i = 0; i < nev; i++)
        if (tok_pieces_add(out, w->p + c->ev[i].start, c->ev[i].end - c->ev[i].start,
                           at_start && c->ev[i].start == 0))
            return tok_oom(c->e), -1;
    return 0;
}

int tok_pre_tokenize(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, int at_start,
                     tok_pieces **out) {
    tok_pieces *a = &c->pa, *b = &c->pb;
    a->n = a->text.n = 0;
    if (tok_pieces_add(a, s, len, at_start))
        return tok_oom(c->e);
    for (size_t k = 0; k < t->npre; k++) {
        const tok_pre *p = &t->pre[k];
        b->n = b->text.n = 0;
        for (size_t i = 0; i < a->n; i++) {
            const char *ps = a->text.p + a->v[i].off;
            size_t pl = a->v[i].len;
            int st = a->v[i].at_start, rc = 0;
            if (p->kind == TOK_PRE_BYTELEVEL)
                rc = pre_bytelevel(t, c, p, ps, pl, st, b);
            else if (p->kind == TOK_PRE_SPLIT)
                rc = pre_split(c, p, ps, pl, st, b);
            else
                rc = pre_metaspace(c, p, ps, pl, st, b);
            if (rc)
                return -1;
        }
        tok_pieces *x = a;
        a = b;
        b = x;
    }
    *out = a;
    return 0;
}

void tok_bytelevel_tables(snug_tokenizer *t) {
    /* bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 map to U+0100.. in order. */
    int n = 0;
    for (int i = 0; i < 324; i++)
        t->bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)n++;
        t->bl_char_len[b] = (uint8_t)tok_utf8_put(cp, t->bl_char[b]);
        t->bl_byte[cp] = (int16_t)b;
    }
}

/* ---- parsing ---- */

static void *grow_array(void *v, size_t n, size_t size) {
    return realloc(v, (n + 1) * size);
}

static int add_norm(snug_tokenizer *t, tok_norm op, snug_error *e) {
    tok_norm *v = grow_array(t->norm, t->nnorm, sizeof *v);
    if (!v)
        return tok_oom(e);
    t->norm = v;
    t->norm[t->nnorm++] = op;
    return 0;
}

static int get_string(snug_tokenizer *t, json_t *obj, const char *key, const char *path, char **out, size_t *len,
                      snug_error *e) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        return tok_bad(t, e, path, "\"%s\" must be a string", key);
    *len = json_string_length(v);
    *out = tok_strndup(json_string_value(v), *len);
    return *out ? 0 : tok_oom(e);
}

int tok_parse_normalizer(snug_tokenizer *t, json_t *j, const char *path, snug_error *e) {
    if (!j || json_is_null(j))
        return 0;
    const char *type = tok_json_type(j);
    if (!type)
        return tok_bad(t, e, path, "a normalizer needs a \"type\"");
    char sub[512];
    tok_norm op = {0};
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(j, "normalizers");
        if (!json_is_array(list))
            return tok_bad(t, e, path, "Sequence needs a \"normalizers\" list");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            SNUG_TRY(tok_parse_normalizer(t, json_array_get(list, i), sub, e));
        }
        return 0;
    }
    if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD")) {
        op.kind = !strcmp(type, "NFC")    ? TOK_NORM_NFC
                  : !strcmp(type, "NFD")  ? TOK_NORM_NFD
                  : !strcmp(type, "NFKC") ? TOK_NORM_NFKC
                                          : TOK_NORM_NFKD;
    } else if (!strcmp(type, "Lowercase")) {
        op.kind = TOK_NORM_LOWERCASE;
    } else if (!strcmp(type, "StripAccents")) {
        op.kind = TOK_NORM_STRIP_ACCENTS;
    } else if (!strcmp(type, "Strip")) {
        op.kind = TOK_NORM_STRIP;
        op.left = tok_json_bool(j, "strip_left", 1);
        op.right = tok_json_bool(j, "strip_right", 1);
    } else if (!strcmp(type, "Prepend")) {
        op.kind = TOK_NORM_PREPEND;
        SNUG_TRY(get_string(t, j, "prepend", path, &op.str, &op.str_len, e));
    } else if (!strcmp(type, "Replace")) {
        op.kind = TOK_NORM_REPLACE;
        snprintf(sub, sizeof sub, "%s.pattern", path);
        SNUG_TRY(tok_parse_pattern(t, json_object_get(j, "pattern"), sub, &op.re, e));
        if (get_string(t, j, "content", path, &op.content, &op.content_len, e)) {
            tok_regex_free(&op.re);
            return e ? e->code : SNUG_EINPUT;
        }
    } else {
        return tok_bad(t, e, path,
                       "normalizer type \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, "
                       "Replace, Strip, StripAccents, Sequence)",
                       type);
    }
    if (add_norm(t, op, e)) {
        free(op.str);
        free(op.content);
        tok_regex_free(&op.re);
        return SNUG_ENOMEM;
    }
    return 0;
}

static int add_pre(snug_tokenizer *t, tok_pre op, snug_error *e) {
    tok_pre *v = grow_array(t->pre, t->npre, sizeof *v);
    if (!v) {
        tok_regex_free(&op.re);
        return tok_oom(e);
    }
    t->pre = v;
    t->pre[t->npre++] = op;
    return 0;
}

static int parse_prepend_scheme(snug_tokenizer *t, json_t *j, const char *path, int *out, snug_error *e) {
    json_t *ps = json_object_get(j, "prepend_scheme"), *aps = json_object_get(j, "add_prefix_space");
    *out = TOK_PREPEND_ALWAYS;
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "always"))
            *out = TOK_PREPEND_ALWAYS;
        else if (!strcmp(s, "first"))
            *out = TOK_PREPEND_FIRST;
        else if (!strcmp(s, "never"))
            *out = TOK_PREPEND_NEVER;
        else
            return tok_bad(t, e, path, "prepend_scheme \"%s\" is not one of always, first, never", s);
    } else if (ps && !json_is_null(ps))
        return tok_bad(t, e, path, "prepend_scheme must be a string");
    if (json_is_false(aps)) { /* the older spelling */
        if (json_is_string(ps) && *out != TOK_PREPEND_NEVER)
            return tok_bad(t, e, path, "add_prefix_space false contradicts prepend_scheme \"%s\"",
                           json_string_value(ps));
        *out = TOK_PREPEND_NEVER;
    }
    return 0;
}

static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

int tok_parse_pre_tokenizer(snug_tokenizer *t, json_t *j, const char *path, snug_error *e) {
    if (!j || json_is_null(j))
        return 0;
    const char *type = tok_json_type(j);
    if (!type)
        return tok_bad(t, e, path, "a pre_tokenizer needs a \"type\"");
    char sub[512], why[300];
    tok_pre op = {0};
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(j, "pretokenizers");
        if (!json_is_array(list))
            return tok_bad(t, e, path, "Sequence needs a \"pretokenizers\" list");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            SNUG_TRY(tok_parse_pre_tokenizer(t, json_array_get(list, i), sub, e));
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        op.kind = TOK_PRE_BYTELEVEL;
        op.add_prefix_space = tok_json_bool(j, "add_prefix_space", 1);
        op.use_regex = tok_json_bool(j, "use_regex", 1);
        if (op.use_regex && tok_regex_compile(&op.re, gpt2_regex, strlen(gpt2_regex), 0, why, sizeof why))
            return snug_fail(e, SNUG_EINTERNAL, "%s: %s: the GPT-2 regex does not compile: %s", t->name, path, why);
    } else if (!strcmp(type, "Split")) {
        op.kind = TOK_PRE_SPLIT;
        json_t *b = json_object_get(j, "behavior");
        const char *bs = json_is_string(b) ? json_string_value(b) : "";
        static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        op.behavior = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(bs, names[i]))
                op.behavior = i;
        if (op.behavior < 0)
            return tok_bad(t, e, path,
                           "behavior \"%s\" is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, "
                           "Contiguous",
                           bs);
        op.invert = tok_json_bool(j, "invert", 0);
        snprintf(sub, sizeof sub, "%s.pattern", path);
        SNUG_TRY(tok_parse_pattern(t, json_object_get(j, "pattern"), sub, &op.re, e));
    } else if (!strcmp(type, "Metaspace")) {
        op.kind = TOK_PRE_METASPACE;
        SNUG_TRY(tok_parse_char(t, j, "replacement", path, op.rep, &op.rep_len, e));
        SNUG_TRY(parse_prepend_scheme(t, j, path, &op.prepend, e));
        op.split = tok_json_bool(j, "split", 1);
    } else {
        return tok_bad(t, e, path,
                       "pre_tokenizer type \"%s\" is not supported (supported: ByteLevel, Split, Metaspace, Sequence)",
                       type);
    }
    return add_pre(t, op, e);
}

int tok_parse_metaspace_decoder(snug_tokenizer *t, json_t *j, const char *path, int *prepend, snug_error *e) {
    return parse_prepend_scheme(t, j, path, prepend, e);
}

void tok_free_pipeline(snug_tokenizer *t) {
    for (size_t i = 0; i < t->nnorm; i++) {
        free(t->norm[i].str);
        free(t->norm[i].content);
        tok_regex_free(&t->norm[i].re);
    }
    free(t->norm);
    for (size_t i = 0; i < t->npre; i++)
        tok_regex_free(&t->pre[i].re);
    free(t->pre);
    t->norm = NULL;
    t->pre = NULL;
    t->nnorm = t->npre = 0;
}
