/* tokenizer_base.c: the machinery under every other tokenizer file (tokenizer_base.h): errors and the JSON
 * helpers of the loaders, the encode call's scratch (tok_ctx), growable buffers, UTF-8 (decoding, and repairing
 * invalid input the way Python's errors="replace" does), regexes with Oniguruma's meaning on top of PCRE2, and
 * splitting a string at matches the way `tokenizers` does (pattern.rs find_matches and normalizer.rs
 * NormalizedString::split). It calls no other tokenizer file: tokenizer.c, tokenizer_pre.c and tokenizer_bpe.c
 * stand on it. */
#include "data/tokenizer_base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers shared by the tokenizer files ---- */

char *tok_strndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

int tok_oom(snug_error *e) {
    return snug_fail(e, SNUG_ENOMEM, "tokenizer: out of memory");
}

int tok_bad(snug_tokenizer *t, snug_error *e, const char *path, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (path && *path)
        return snug_fail(e, SNUG_EINPUT, "%s: %s: %s", t->name, path, msg);
    return snug_fail(e, SNUG_EINPUT, "%s: %s", t->name, msg);
}

const char *tok_json_type(json_t *j) {
    json_t *v = json_object_get(j, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int tok_json_bool(json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

int tok_parse_pattern(snug_tokenizer *t, json_t *j, const char *path, tok_regex *re, snug_error *e) {
    json_t *s = json_object_get(j, "String"), *r = json_object_get(j, "Regex");
    json_t *v = s ? s : r;
    if (!json_is_object(j) || !json_is_string(v))
        return tok_bad(t, e, path, "must be {\"String\": ...} or {\"Regex\": ...}");
    size_t n = json_string_length(v);
    char why[400];
    if (s && n == 0) { /* an empty String pattern matches nothing, as upstream */
        re->code = NULL;
        return 0;
    }
    if (tok_regex_compile(re, json_string_value(v), n, s != NULL, why, sizeof why))
        return tok_bad(t, e, path, "invalid %s \"%.100s\": %s", s ? "pattern" : "regex", json_string_value(v), why);
    return 0;
}

int tok_parse_char(snug_tokenizer *t, json_t *obj, const char *key, const char *path, char ch[4], int *len,
                   snug_error *e) {
    json_t *v = json_object_get(obj, key);
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    size_t n = json_is_string(v) ? json_string_length(v) : 0;
    if (n == 0 || n > 4 || (size_t)tok_utf8_len((unsigned char)s[0]) != n)
        return tok_bad(t, e, path, "\"%s\" must be a single character", key);
    memcpy(ch, s, n);
    *len = (int)n;
    return 0;
}

/* ---- per-call scratch ---- */

int tok_ctx_init(tok_ctx *c, snug_error *e) {
    memset(c, 0, sizeof *c);
    c->e = e;
    c->md = pcre2_match_data_create(1, NULL);
    return c->md ? 0 : tok_oom(e);
}

void tok_ctx_free(tok_ctx *c) {
    if (c->md)
        pcre2_match_data_free(c->md);
    free(c->ev);
    free(c->clean.p);
    free(c->na.p);
    free(c->nb.p);
    free(c->tmp.p);
    free(c->pa.v);
    free(c->pa.text.p);
    free(c->pb.v);
    free(c->pb.text.p);
    free(c->sym);
    free(c->heap);
    free(c->word.p);
}

int tok_emit(tok_ctx *c, int32_t id) {
    if (*c->n == *c->cap) {
        size_t cap = *c->cap ? 2 * *c->cap : 1024;
        int32_t *p = realloc(*c->ids, cap * sizeof *p);
        if (!p)
            return tok_oom(c->e), -1;
        *c->ids = p;
        *c->cap = cap;
    }
    (*c->ids)[(*c->n)++] = id;
    return 0;
}

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

/* Where Oniguruma and PCRE2 (with UCP) read an escape differently, the pattern is rewritten to say what Oniguruma
 * means: \s is exactly Unicode White_Space (PCRE2 adds U+180E), \w is Letter|Mark|Number|Connector_Punctuation
 * (PCRE2 10.42: letters, numbers and '_'), \h is a hex digit (PCRE2: horizontal space), and \uHHHH is a code
 * point (PCRE2 rejects it). */
static const struct {
    char esc;         /* the capital letter is the complement */
    const char *body; /* as a class body */
} onig_escapes[] = {
    {'s', "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
          "\\x{205F}\\x{3000}"},
    {'w', "\\p{L}\\p{M}\\p{N}\\p{Pc}"},
    {'h', "0-9a-fA-F"},
};

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int rewrite_onig(const char *p, size_t n, tok_buf *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '\\' && i + 1 < n) {
            char x = p[++i];
            if (x == 'u' && i + 4 < n && is_hex(p[i + 1]) && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4])) {
                if (tok_buf_put(out, "\\x{", 3) || tok_buf_put(out, p + i + 1, 4) || tok_buf_put(out, "}", 1))
                    return -1;
                i += 4;
                continue;
            }
            const char *body = NULL;
            int neg = 0;
            for (size_t k = 0; k < sizeof onig_escapes / sizeof *onig_escapes; k++)
                if (x == onig_escapes[k].esc || x == onig_escapes[k].esc - 32) {
                    body = onig_escapes[k].body;
                    neg = x == onig_escapes[k].esc - 32;
                }
            char two[2] = {'\\', x};
            int rc;
            if (!body || (in_class && neg)) /* (a negated set inside a class cannot be spelled out: keep PCRE2's) */
                rc = tok_buf_put(out, two, 2);
            else if (in_class)
                rc = tok_buf_put(out, body, strlen(body));
            else
                rc = tok_buf_put(out, neg ? "[^" : "[", neg ? 2 : 1) || tok_buf_put(out, body, strlen(body)) ||
                     tok_buf_put(out, "]", 1);
            if (rc)
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
    int rewritten = pat.n != len; /* then PCRE2's offset is into the rewritten text: leave it out */
    free(pat.p);
    if (!re->code) {
        char msg[256];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        if (rewritten)
            snprintf(why, why_len, "%s", msg);
        else
            snprintf(why, why_len, "%s (at byte %zu)", msg, (size_t)erroff);
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
int tok_regex_events(tok_ctx *c, const tok_regex *re, const char *s, size_t len, size_t *nev) {
    size_t n = 0, pos = 0, prev = 0, last_end = (size_t)-1;
    while (pos <= len) {
        size_t ms, me;
        int rc = tok_regex_find(re, c->md, s, len, pos, &ms, &me);
        if (rc < 0)
            return snug_fail(c->e, SNUG_EINPUT, "tokenizer.json: a regex of its normalizer or pre_tokenizer gives up "
                             "on this text (PCRE2's match limit: the pattern backtracks without end); simplify the "
                             "pattern, or leave the text out"), -1;
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
int tok_char_events(tok_ctx *c, const char *ch, int ch_len, const char *s, size_t len, size_t *nev) {
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

/* The same for a class of characters (pattern.rs, `impl Pattern for F: Fn(char) -> bool`): every character of the
 * class is its own match, the stretches between are not matches. */
int tok_pred_events(tok_ctx *c, int (*pred)(uint32_t cp, const void *arg), const void *arg, const char *s,
                    size_t len, size_t *nev) {
    size_t n = 0, prev = 0;
    for (size_t i = 0; i < len;) {
        int l;
        uint32_t cp = tok_utf8_get(s + i, &l);
        if (pred(cp, arg)) {
            if (grow_events(c, n + 2))
                return tok_oom(c->e), -1;
            if (prev != i)
                c->ev[n++] = (tok_event){prev, i, 0};
            c->ev[n++] = (tok_event){i, i + (size_t)l, 1};
            prev = i + (size_t)l;
        }
        i += (size_t)l;
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
size_t tok_apply_behavior(tok_event *ev, size_t n, int behavior, int invert) {
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
