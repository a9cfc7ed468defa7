/* tokenizer_pre.c: normalizers and pre-tokenizers (text -> pieces), and reading them from tokenizer.json.
 *
 * Each normalizer maps a whole string to a new string; each pre-tokenizer maps a list of pieces to a new list. The
 * rules (which piece gets a prefix, how a split treats its delimiters, which empty pieces vanish) are those of
 * `tokenizers` (normalizer.rs split(), pre_tokenizers/{byte_level,split,metaspace,digits,punctuation,whitespace,
 * delimiter,bert,fixed_length}.rs and unicode_scripts/), checked against it by
 * tests/parity/test_tokenizer_parity.py. See tokenizer_base.h for the whole pipeline. */
#include "data/tokenizer_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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
    if (tok_regex_events(c, &op->re, s, len, &nev))
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

/* Nmt (unicode.rs do_nmt): ASCII control characters dropped, a few code points that are white space to NMT read
 * as ' '. */
static int norm_nmt(const char *s, size_t len, tok_buf *out) {
    for (size_t i = 0; i < len;) {
        int l;
        uint32_t cp = tok_utf8_get(s + i, &l);
        int drop = (cp >= 0x1 && cp <= 0x8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) || cp == 0x7F || cp == 0x8F ||
                   cp == 0x9F;
        int space = cp == 0x9 || cp == 0xA || cp == 0xC || cp == 0xD || cp == 0x1680 ||
                    (cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 || cp == 0x2581 || cp == 0xFEFF ||
                    cp == 0xFFFD;
        if (!drop && (space ? tok_buf_put(out, " ", 1) : tok_buf_put(out, s + i, (size_t)l)))
            return -1;
        i += (size_t)l;
    }
    return 0;
}

/* The ByteLevel normalizer (normalizers/byte_level.rs): every byte becomes its printable stand-in. */
static int norm_bytelevel(const snug_tokenizer *t, const char *s, size_t len, tok_buf *out) {
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        if (tok_buf_put(out, t->bl_char[b], t->bl_char_len[b]))
            return -1;
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
        case TOK_NORM_NMT:
            rc = norm_nmt(cur, cur_len, dst);
            break;
        case TOK_NORM_BYTELEVEL:
            rc = norm_bytelevel(t, cur, cur_len, dst);
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
    tok_event whole = {0, w->n, 0};
    if (p->use_regex && tok_regex_events(c, &p->re, w->p, w->n, &nev))
        return -1;
    for (size_t i = 0; i < nev; i++) {
        const tok_event *v = p->use_regex ? &c->ev[i] : &whole;
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

/* Adds the events left as pieces by tok_apply_behavior (match == 0) to out. */
static int add_event_pieces(tok_ctx *c, size_t nev, const char *s, int at_start, tok_pieces *out) {
    for (size_t i = 0; i < nev; i++)
        if (!c->ev[i].match &&
            tok_pieces_add(out, s + c->ev[i].start, c->ev[i].end - c->ev[i].start, at_start && c->ev[i].start == 0))
            return tok_oom(c->e), -1;
    return 0;
}

static int pre_split(tok_ctx *c, const tok_pre *p, const char *s, size_t len, int at_start, tok_pieces *out) {
    size_t nev;
    if (tok_regex_events(c, &p->re, s, len, &nev))
        return -1;
    nev = tok_apply_behavior(c->ev, nev, p->behavior, p->invert);
    return add_event_pieces(c, nev, s, at_start, out);
}

/* The character classes of Rust's char methods and of `tokenizers`:
 *   numeric     char::is_numeric: general categories Nd, Nl, No (Digits);
 *   punctuation char::is_ascii_punctuation or a P* category (Punctuation, BertPreTokenizer);
 *   whitespace  char::is_whitespace: the White_Space property (WhitespaceSplit, BertPreTokenizer). */
static int is_numeric(uint32_t cp) {
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static int is_punct(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
               (cp >= 0x7B && cp <= 0x7E);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

static int class_pred(uint32_t cp, const void *arg) {
    const tok_pre *p = arg;
    switch (p->char_class) {
    case TOK_CLASS_NUMERIC:
        return is_numeric(cp);
    case TOK_CLASS_PUNCT:
        return is_punct(cp);
    case TOK_CLASS_WHITESPACE:
        return tok_is_white_space(cp);
    default:
        return cp == p->delim;
    }
}

static int pre_chars(tok_ctx *c, const tok_pre *p, const char *s, size_t len, int at_start, tok_pieces *out) {
    size_t nev;
    if (tok_pred_events(c, class_pred, p, s, len, &nev))
        return -1;
    nev = tok_apply_behavior(c->ev, nev, p->behavior, 0);
    return add_event_pieces(c, nev, s, at_start, out);
}

/* Rust regex's Unicode \w: Alphabetic, M*, Nd, Pc, Join_Control. Alphabetic is L*, Nl and Other_Alphabetic, which
 * beyond marks holds only the circled and squared Latin letters (So). */
static int is_rust_word(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
        (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
        return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ND) || k == UTF8PROC_CATEGORY_NL ||
           k == UTF8PROC_CATEGORY_PC;
}

/* Whitespace: the matches of the Rust regex \w+|[^\w\s]+ are the pieces (Invert, Removed), that is the maximal
 * runs of word characters and the maximal runs of characters that are neither word nor white space. */
static int pre_whitespace(tok_ctx *c, const char *s, size_t len, int at_start, tok_pieces *out) {
    size_t run = 0;
    int run_class = 0; /* 0: none (white space), 1: word, 2: other */
    for (size_t i = 0; i <= len;) {
        int l = 1, cls = 0;
        if (i < len) {
            uint32_t cp = tok_utf8_get(s + i, &l);
            cls = is_rust_word(cp) ? 1 : tok_is_white_space(cp) ? 0 : 2;
        }
        if (cls != run_class || i == len) {
            if (run_class && tok_pieces_add(out, s + run, i - run, at_start && run == 0))
                return tok_oom(c->e), -1;
            run = i;
            run_class = cls;
        }
        i += (size_t)l;
    }
    return 0;
}

/* UnicodeScripts (unicode_scripts/pre_tokenizer.rs): a cut before every character whose script differs from that
 * of the last character with a script; ' ' and characters the table does not list have none (Any), Hiragana,
 * Katakana and U+30FC count as Han. As upstream, the text before the first cut (leading Any characters) is
 * dropped. */
static int pre_scripts(tok_ctx *c, const char *s, size_t len, int at_start, tok_pieces *out) {
    int last = -1;
    size_t cut = len; /* the start of the current piece; len: no cut yet */
    for (size_t i = 0; i < len;) {
        int l;
        uint32_t cp = tok_utf8_get(s + i, &l);
        int sc = tok_script(cp);
        if (cp == 0x30FC)
            sc = tok_script_han;
        else if (cp == ' ')
            sc = 0;
        else if (sc == tok_script_hiragana || sc == tok_script_katakana)
            sc = tok_script_han;
        if (sc != 0 && sc != last) {
            if (cut < i && tok_pieces_add(out, s + cut, i - cut, at_start && cut == 0))
                return tok_oom(c->e), -1;
            cut = i;
        }
        if (sc != 0)
            last = sc;
        i += (size_t)l;
    }
    if (cut < len && tok_pieces_add(out, s + cut, len - cut, at_start && cut == 0))
        return tok_oom(c->e), -1;
    return 0;
}

/* FixedLength: pieces of p->length characters, the last one shorter. */
static int pre_fixed(tok_ctx *c, const tok_pre *p, const char *s, size_t len, int at_start, tok_pieces *out) {
    for (size_t i = 0; i < len;) {
        size_t j = i;
        for (size_t k = 0; k < p->length && j < len; k++)
            j += (size_t)tok_utf8_len((unsigned char)s[j]);
        if (tok_pieces_add(out, s + i, j - i, at_start && i == 0))
            return tok_oom(c->e), -1;
        i = j;
    }
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
    if (tok_char_events(c, p->rep, p->rep_len, w->p, w->n, &nev))
        return -1;
    nev = tok_apply_behavior(c->ev, nev, TOK_MERGED_NEXT, 0);
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
            switch (p->kind) {
            case TOK_PRE_BYTELEVEL:
                rc = pre_bytelevel(t, c, p, ps, pl, st, b);
                break;
            case TOK_PRE_SPLIT:
                rc = pre_split(c, p, ps, pl, st, b);
                break;
            case TOK_PRE_METASPACE:
                rc = pre_metaspace(c, p, ps, pl, st, b);
                break;
            case TOK_PRE_CHARS:
                rc = pre_chars(c, p, ps, pl, st, b);
                break;
            case TOK_PRE_WHITESPACE:
                rc = pre_whitespace(c, ps, pl, st, b);
                break;
            case TOK_PRE_SCRIPTS:
                rc = pre_scripts(c, ps, pl, st, b);
                break;
            default:
                rc = pre_fixed(c, p, ps, pl, st, b);
                break;
            }
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
    } else if (!strcmp(type, "Nmt")) {
        op.kind = TOK_NORM_NMT;
    } else if (!strcmp(type, "ByteLevel")) {
        op.kind = TOK_NORM_BYTELEVEL;
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
                       "Replace, Strip, StripAccents, Nmt, ByteLevel, Sequence)",
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

int tok_parse_prepend_scheme(snug_tokenizer *t, json_t *j, const char *path, int *out, snug_error *e) {
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

/* A SplitDelimiterBehavior by its serde name; dflt < 0: the key is required. */
static int parse_behavior(snug_tokenizer *t, json_t *j, const char *path, int dflt, int *out, snug_error *e) {
    static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    json_t *b = json_object_get(j, "behavior");
    *out = -1;
    if (!b && dflt >= 0) {
        *out = dflt;
        return 0;
    }
    const char *bs = json_is_string(b) ? json_string_value(b) : "";
    for (int i = 0; i < 5; i++)
        if (!strcmp(bs, names[i]))
            *out = i;
    if (*out < 0)
        return tok_bad(t, e, path,
                       "behavior \"%s\" is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, "
                       "Contiguous",
                       bs);
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
        SNUG_TRY(parse_behavior(t, j, path, -1, &op.behavior, e));
        op.invert = tok_json_bool(j, "invert", 0);
        snprintf(sub, sizeof sub, "%s.pattern", path);
        SNUG_TRY(tok_parse_pattern(t, json_object_get(j, "pattern"), sub, &op.re, e));
    } else if (!strcmp(type, "Metaspace")) {
        op.kind = TOK_PRE_METASPACE;
        SNUG_TRY(tok_parse_char(t, j, "replacement", path, op.rep, &op.rep_len, e));
        SNUG_TRY(tok_parse_prepend_scheme(t, j, path, &op.prepend, e));
        op.split = tok_json_bool(j, "split", 1);
    } else if (!strcmp(type, "Digits")) {
        op.kind = TOK_PRE_CHARS;
        op.char_class = TOK_CLASS_NUMERIC;
        op.behavior = tok_json_bool(j, "individual_digits", 0) ? TOK_ISOLATED : TOK_CONTIGUOUS;
    } else if (!strcmp(type, "Punctuation")) {
        op.kind = TOK_PRE_CHARS;
        op.char_class = TOK_CLASS_PUNCT;
        SNUG_TRY(parse_behavior(t, j, path, TOK_ISOLATED, &op.behavior, e));
    } else if (!strcmp(type, "WhitespaceSplit")) {
        op.kind = TOK_PRE_CHARS;
        op.char_class = TOK_CLASS_WHITESPACE;
        op.behavior = TOK_REMOVED;
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        op.kind = TOK_PRE_CHARS;
        op.char_class = TOK_CLASS_CHAR;
        op.behavior = TOK_REMOVED;
        char ch[4];
        int ch_len;
        SNUG_TRY(tok_parse_char(t, j, "delimiter", path, ch, &ch_len, e));
        op.delim = tok_utf8_get(ch, &ch_len);
    } else if (!strcmp(type, "BertPreTokenizer")) { /* white space removed, then each punctuation mark isolated */
        op.kind = TOK_PRE_CHARS;
        op.char_class = TOK_CLASS_WHITESPACE;
        op.behavior = TOK_REMOVED;
        SNUG_TRY(add_pre(t, op, e));
        op.char_class = TOK_CLASS_PUNCT;
        op.behavior = TOK_ISOLATED;
    } else if (!strcmp(type, "Whitespace")) {
        op.kind = TOK_PRE_WHITESPACE;
    } else if (!strcmp(type, "UnicodeScripts")) {
        op.kind = TOK_PRE_SCRIPTS;
    } else if (!strcmp(type, "FixedLength")) {
        op.kind = TOK_PRE_FIXED;
        json_t *n = json_object_get(j, "length");
        op.length = 5; /* the default of fixed_length.rs */
        if (n && !(json_is_integer(n) && json_integer_value(n) > 0))
            return tok_bad(t, e, path, "FixedLength needs \"length\" as a positive integer");
        if (n)
            op.length = (size_t)json_integer_value(n);
    } else {
        return tok_bad(t, e, path,
                       "pre_tokenizer type \"%s\" is not supported (supported: ByteLevel, Split, Metaspace, Digits, "
                       "Punctuation, Whitespace, WhitespaceSplit, CharDelimiterSplit, UnicodeScripts, "
                       "BertPreTokenizer, FixedLength, Sequence)",
                       type);
    }
    return add_pre(t, op, e);
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
