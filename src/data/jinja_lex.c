/* jinja_lex.c: a chat template's source into tokens, as Jinja2's lexer reads it with trim_blocks and lstrip_blocks.
 *
 * Before lexing, line breaks (\r\n, \r) become \n and one trailing line break is dropped (keep_trailing_newline is
 * off). Text between tags becomes JT_TEXT after whitespace control: "{%-"/"{{-"/"{#-" strip all whitespace before
 * the tag, "-%}"/"-}}"/"-#}" all after it; lstrip_blocks strips the spaces and tabs between a line's start and a
 * "{%" or "{#" (not "{%+"); trim_blocks drops the one line break after "%}" and "#}" (not "+%}"). Comments vanish,
 * {% raw %}...{% endraw %} becomes text. Inside a tag the end delimiter counts only outside brackets. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_impl.h"

static jtok *push(jcompiler *c, int type, int line) {
    if (c->ntok == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        jtok *t = ja_alloc(c->a, cap * sizeof *t);
        if (c->ntok)
            memcpy(t, c->toks, c->ntok * sizeof *t);
        c->toks = t;
        c->cap = cap;
    }
    jtok *t = &c->toks[c->ntok++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static int is_ws(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static int count_lines(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* Emits src[b, e) as text, after whitespace control for a following tag of kind k ('{', '%', '#', or 0 at the end)
 * with sign ('-', '+' or 0). */
static void emit_text(jcompiler *c, const char *src, size_t b, size_t e, int line, char k, char sign,
                      int line_starting) {
    if (sign == '-') {
        while (e > b && is_ws(src[e - 1]))
            e--;
    } else if (sign != '+' && (k == '%' || k == '#')) {
        size_t l = e;
        while (l > b && src[l - 1] != '\n')
            l--;
        if ((l > b || line_starting) && l < e) {
            size_t i = l;
            while (i < e && is_ws(src[i]))
                i++;
            if (i == e)
                e = l;
        }
    }
    if (e > b) {
        jtok *t = push(c, JT_TEXT, line);
        t->s = ja_strdup(c->a, src + b, e - b);
        t->n = e - b;
    }
}

/* Decodes a string literal's body as Python's unicode-escape does. */
static void lex_string(jcompiler *c, const char *s, size_t n, int line, jtok *t) {
    char *o = ja_alloc(c->a, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            o[k++] = s[i];
            continue;
        }
        char ch = s[++i];
        unsigned long cp = 0;
        int digits = 0;
        switch (ch) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (ch >= '0' && ch <= '7') {
                int m = 0;
                while (m < 3 && i < n && s[i] >= '0' && s[i] <= '7')
                    cp = cp * 8 + (unsigned long)(s[i++] - '0'), m++;
                i--;
                digits = -1;
            } else {
                o[k++] = '\\';
                o[k++] = ch;
            }
        }
        if (digits > 0) {
            for (int m = 0; m < digits; m++) {
                char h = i + 1 < n ? s[i + 1] : 0;
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0)
                    jc_fail(c, line, "truncated \\%c escape in a string literal", ch);
                cp = cp * 16 + (unsigned long)v;
                i++;
            }
        }
        if (digits != 0) {
            if (cp > 0x10FFFF)
                jc_fail(c, line, "escape beyond U+10FFFF in a string literal");
            if (cp < 0x80) {
                o[k++] = (char)cp;
            } else if (cp < 0x800) {
                o[k++] = (char)(0xC0 | (cp >> 6));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                o[k++] = (char)(0xE0 | (cp >> 12));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else {
                o[k++] = (char)(0xF0 | (cp >> 18));
                o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            }
        }
    }
    o[k] = 0;
    t->s = o;
    t->n = k;
}

static int is_digit(char ch) {
    return ch >= '0' && ch <= '9';
}

/* Digits with '_' separators from *i; returns how many characters. */
static size_t digits(const char *s, size_t n, size_t i) {
    size_t j = i;
    while (j < n && (is_digit(s[j]) || (s[j] == '_' && j > i && j + 1 < n && is_digit(s[j + 1]))))
        j++;
    return j - i;
}

static double parse_num(const char *s, size_t n) {
    char buf[128];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < sizeof buf; i++)
        if (s[i] != '_')
            buf[k++] = s[i];
    buf[k] = 0;
    return strtod(buf, NULL);
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                  ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};

/* Lexes a tag's inside from *pi up to and including its end delimiter ("}}" or "%}"). Returns the position after
 * the tag (and after the whitespace or line break it consumes); *ends_nl says whether what it consumed ended with
 * a line break. */
static size_t lex_tag(jcompiler *c, const char *s, size_t n, size_t i, int *line, char kind, int *ends_nl) {
    int depth = 0;
    char close = kind == '{' ? '}' : '%';
    for (;;) {
        while (i < n && is_ws(s[i]))
            *line += s[i++] == '\n';
        if (i >= n)
            jc_fail(c, *line, "unexpected end of template: the tag is not closed (missing '%c}')", close);
        if (depth == 0) {
            size_t j = i;
            char sign = 0;
            if (s[j] == '-' || s[j] == '+')
                sign = s[j++];
            if (j + 1 < n && s[j] == close && s[j + 1] == '}' && !(sign == '+' && kind == '{')) {
                push(c, kind == '{' ? JT_VAR_END : JT_BLOCK_END, *line);
                j += 2;
                *ends_nl = 0;
                if (sign == '-') {
                    while (j < n && is_ws(s[j])) {
                        *line += s[j] == '\n';
                        *ends_nl = s[j] == '\n';
                        j++;
                    }
                } else if (sign == 0 && kind == '%' && j < n && s[j] == '\n') {
                    (*line)++;
                    *ends_nl = 1;
                    j++;
                }
                return j;
            }
        }
        char ch = s[i];
        if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != ch)
                j += s[j] == '\\' ? 2 : 1;
            if (j >= n)
                jc_fail(c, *line, "unterminated string literal");
            jtok *t = push(c, JT_STRING, *line);
            lex_string(c, s + i + 1, j - i - 1, *line, t);
            *line += count_lines(s + i, j - i);
            i = j + 1;
        } else if (is_digit(ch)) {
            size_t j = i + digits(s, n, i);
            int isf = 0;
            if (j + 1 < n && s[j] == '.' && is_digit(s[j + 1]))
                j += 1 + digits(s, n, j + 1), isf = 1;
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-'))
                    k++;
                if (k < n && is_digit(s[k]))
                    j = k + digits(s, n, k), isf = 1;
            }
            jtok *t = push(c, isf ? JT_FLOAT : JT_INT, *line);
            t->s = ja_strdup(c->a, s + i, j - i);
            t->n = j - i;
            t->f = parse_num(s + i, j - i);
            if (!isf) {
                int64_t v = 0;
                for (size_t k = i; k < j; k++)
                    if (s[k] != '_' && (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s[k] - '0', &v)))
                        jc_fail(c, *line, "integer literal beyond 64 bits");
                t->i = v;
            }
            i = j;
        } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t j = i;
            while (j < n && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') || s[j] == '_' ||
                             is_digit(s[j])))
                j++;
            jtok *t = push(c, JT_NAME, *line);
            t->s = ja_strdup(c->a, s + i, j - i);
            t->n = j - i;
            i = j;
        } else {
            const char *op = NULL;
            for (size_t k = 0; k < sizeof OPS / sizeof *OPS && !op; k++) {
                size_t l = strlen(OPS[k]);
                if (i + l <= n && memcmp(s + i, OPS[k], l) == 0)
                    op = OPS[k];
            }
            if (!op)
                jc_fail(c, *line, "unexpected character '%c'", ch);
            if (*op == '(' || *op == '[' || *op == '{')
                depth++;
            else if ((*op == ')' || *op == ']' || *op == '}') && depth > 0)
                depth--;
            jtok *t = push(c, JT_OP, *line);
            t->s = op;
            t->n = strlen(op);
            i += t->n;
        }
    }
}

/* If s[i] starts "{%[-+]? raw [-]?%}", returns the position after it (and *sign the opening sign), else 0. */
static size_t raw_begin(const char *s, size_t n, size_t i, char *sign, const char *word) {
    size_t j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+'))
        *sign = s[j++];
    while (j < n && is_ws(s[j]))
        j++;
    size_t wl = strlen(word);
    if (j + wl > n || memcmp(s + j, word, wl) != 0)
        return 0;
    j += wl;
    while (j < n && is_ws(s[j]))
        j++;
    return j;
}

void jinja_lex(jcompiler *c, const char *src0, size_t n0) {
    /* normalise line breaks; drop one trailing line break */
    char *s = ja_alloc(c->a, n0 + 1);
    size_t n = 0;
    for (size_t i = 0; i < n0; i++) {
        if (src0[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < n0 && src0[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src0[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    size_t i = 0;
    int line = 1, line_starting = 1;
    while (i < n) {
        /* the next tag opener */
        size_t t = i;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')))
            t++;
        if (t + 1 >= n) {
            emit_text(c, s, i, n, line, 0, 0, line_starting);
            break;
        }
        char kind = s[t + 1];
        char sign = t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+') ? s[t + 2] : 0;
        emit_text(c, s, i, t, line, kind, sign, line_starting);
        line += count_lines(s + i, t - i);
        int tag_line = line;
        if (kind == '#') {
            size_t j = t + 2;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}'))
                j++;
            if (j + 1 >= n)
                jc_fail(c, tag_line, "unterminated comment (missing '#}')");
            char esign = j > t + 2 && (s[j - 1] == '-' || s[j - 1] == '+') ? s[j - 1] : 0;
            line += count_lines(s + t, j - t);
            j += 2;
            line_starting = 0;
            if (esign == '-') {
                while (j < n && is_ws(s[j]))
                    line_starting = s[j] == '\n', line += s[j++] == '\n';
            } else if (esign == 0 && j < n && s[j] == '\n') {
                line++, j++, line_starting = 1;
            }
            i = j;
            continue;
        }
        char rsign;
        size_t r = kind == '%' ? raw_begin(s, n, t, &rsign, "raw") : 0;
        if (r) {
            int dash = r < n && s[r] == '-';
            size_t p = r + dash;
            if (p + 1 < n && s[p] == '%' && s[p + 1] == '}') {
                p += 2;
                if (dash)
                    while (p < n && is_ws(s[p]))
                        p++;
                /* find {% endraw %} */
                size_t q = p;
                for (;; q++) {
                    if (q + 1 >= n)
                        jc_fail(c, tag_line, "{%% raw %%} without {%% endraw %%}");
                    char es;
                    size_t w;
                    if (s[q] == '{' && s[q + 1] == '%' && (w = raw_begin(s, n, q, &es, "endraw")) != 0) {
                        char tsign = 0;
                        if (w < n && (s[w] == '-' || s[w] == '+'))
                            tsign = s[w++];
                        if (w + 1 < n && s[w] == '%' && s[w + 1] == '}') {
                            emit_text(c, s, p, q, line, '%', es, 0);
                            line += count_lines(s + t, w - t);
                            w += 2;
                            line_starting = 0;
                            if (tsign == '-') {
                                while (w < n && is_ws(s[w]))
                                    line_starting = s[w] == '\n', line += s[w++] == '\n';
                            } else if (tsign == 0 && w < n && s[w] == '\n') {
                                line++, w++, line_starting = 1;
                            }
                            i = w;
                            break;
                        }
                    }
                }
                continue;
            }
        }
        push(c, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tag_line);
        int ends_nl = 0;
        i = lex_tag(c, s, n, t + 2 + (sign != 0), &line, kind, &ends_nl);
        line_starting = ends_nl;
    }
    push(c, JT_EOF, line);
}
