/* jinja_methods.c: the Python methods chat templates call on values (str.strip, str.split, str.startswith, ...,
 * dict.get/items/keys/values, list.index/count) and the string operations the filters share with them (case
 * mapping with utf8proc, strip with Python's whitespace, replace, split). Lengths and positions count code points,
 * as Python's do. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "data/jinja_impl.h"

/* ---- code points ---- */
static int32_t next_cp(const char *s, size_t n, size_t *i) {
    int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) {
        cp = (unsigned char)s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

static void put_cp(jrender *r, jbuf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    jb_put(&r->a, b, (const char *)tmp, (size_t)k);
}

int jcp_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static int cp_cased(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           utf8proc_tolower(c) != c || utf8proc_toupper(c) != c || utf8proc_totitle(c) != c;
}

static int cp_alnum(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* Python's full case mappings where they differ from the simple ones utf8proc gives (SpecialCasing.txt, the
 * unconditional ones outside Greek and Armenian ligatures): lower, title, upper as UTF-8, NULL where simple. */
static const struct special_case {
    int32_t cp;
    const char *lower, *title, *upper;
} SPECIAL[] = {
    {0x00DF, NULL, "Ss", "SS"},                        /* ß */
    {0x0130, "i\xcc\x87", NULL, NULL},                 /* İ */
    {0x0149, NULL, "\xca\xbcN", "\xca\xbcN"},          /* ŉ */
    {0x01F0, NULL, "J\xcc\x8c", "J\xcc\x8c"},          /* ǰ */
    {0xFB00, NULL, "Ff", "FF"},  {0xFB01, NULL, "Fi", "FI"},   {0xFB02, NULL, "Fl", "FL"},
    {0xFB03, NULL, "Ffi", "FFI"}, {0xFB04, NULL, "Ffl", "FFL"}, {0xFB05, NULL, "St", "ST"},
    {0xFB06, NULL, "St", "ST"},
};

/* c mapped to lower ('l'), title ('t') or upper ('u') case, appended */
static void put_case(jrender *r, jbuf *b, int32_t c, char to) {
    for (size_t k = 0; k < sizeof SPECIAL / sizeof *SPECIAL; k++) {
        if (SPECIAL[k].cp != c)
            continue;
        const char *m = to == 'l' ? SPECIAL[k].lower : to == 't' ? SPECIAL[k].title : SPECIAL[k].upper;
        if (m) {
            jb_put(&r->a, b, m, strlen(m));
            return;
        }
    }
    put_cp(r, b, to == 'l' ? utf8proc_tolower(c) : to == 't' ? utf8proc_totitle(c) : utf8proc_toupper(c));
}

/* mode: 'l' lower, 'u' upper, 'c' capitalize, 't' str.title(), 'T' Jinja's title filter (upper() of each word's first
 * character, lower() of the rest) */
jv js_case(jrender *r, const jv *s, int mode) {
    jbuf b = {0};
    size_t i = 0;
    int prev_cased = 0, first = 1;
    while (i < s->n) {
        int32_t c = next_cp(s->u.s, s->n, &i);
        char to;
        switch (mode) {
        case 'l':
        case 'u': to = (char)mode; break;
        case 'c': to = first ? 't' : 'l'; break;
        case 't':
            to = prev_cased ? 'l' : 't';
            prev_cased = cp_cased(c);
            break;
        default: /* words begin after - whitespace ( { [ < */
            to = prev_cased ? 'l' : 'u';
            prev_cased = !(c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jcp_space(c));
            break;
        }
        first = 0;
        put_case(r, &b, c, to);
    }
    return jv_str(b.p ? b.p : "", b.n);
}

size_t js_line_break(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\r')
        return i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e)
        return 1;
    if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85)
        return 2;
    if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9))
        return 3;
    return 0;
}

jv js_splitlines(jrender *r, const jv *s) {
    jv out = jv_list(r, 0, 0);
    size_t cap = 0, i = 0;
    while (i < s->n) {
        size_t e = i, k = 0;
        while (e < s->n && !(k = js_line_break(s->u.s, s->n, e)))
            e++;
        if (out.u.l->n == cap) {
            cap = cap ? 2 * cap : 8;
            jv *v = ja_alloc(&r->a, cap * sizeof *v);
            if (out.u.l->n)
                memcpy(v, out.u.l->v, out.u.l->n * sizeof *v);
            out.u.l->v = v;
        }
        out.u.l->v[out.u.l->n++] = jv_str(s->u.s + i, e - i);
        i = e + k;
    }
    return out;
}

/* \w+ runs, as re.findall(r"\w+", s) counts them (letters, digits and numbers, underscore) */
int64_t js_wordcount(const jv *s) {
    int64_t k = 0;
    int in = 0;
    size_t i = 0;
    while (i < s->n) {
        int32_t c = next_cp(s->u.s, s->n, &i);
        int w = c == '_' || cp_alnum(c);
        k += w && !in;
        in = w;
    }
    return k;
}

static int in_chars(int32_t c, const jv *chars) {
    size_t i = 0;
    while (i < chars->n)
        if (next_cp(chars->u.s, chars->n, &i) == c)
            return 1;
    return 0;
}

/* Python's str.strip / lstrip / rstrip; chars NULL or None: whitespace */
jv js_strip(jrender *r, int line, const jv *s, const jv *chars, int left, int right) {
    if (chars && chars->t == JV_NONE)
        chars = NULL;
    if (chars && chars->t != JV_STR)
        jr_fail(r, line, "strip arg must be None or str, not %s", jv_type_name(chars));
    size_t b = 0, e = s->n;
    if (left)
        while (b < e) {
            size_t i = b;
            int32_t c = next_cp(s->u.s, s->n, &i);
            if (chars ? !in_chars(c, chars) : !jcp_space(c))
                break;
            b = i;
        }
    if (right)
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s->u.s[k] & 0xC0) == 0x80)
                k--;
            size_t i = k;
            int32_t c = next_cp(s->u.s, s->n, &i);
            if (chars ? !in_chars(c, chars) : !jcp_space(c))
                break;
            e = k;
        }
    return jv_str(s->u.s + b, e - b);
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0)
        return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, nd, nn) == 0)
            return h + i;
    return NULL;
}

jv js_replace(jrender *r, const jv *s, const jv *old, const jv *new_, int64_t count) {
    jbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) { /* Python inserts new before every code point and at the end */
        while (i <= s->n && (count < 0 || done < count)) {
            jb_put(&r->a, &b, new_->u.s, new_->n);
            done++;
            if (i == s->n) {
                i++;
                break;
            }
            size_t k = i;
            next_cp(s->u.s, s->n, &k);
            jb_put(&r->a, &b, s->u.s + i, k - i);
            i = k;
        }
        if (i < s->n)
            jb_put(&r->a, &b, s->u.s + i, s->n - i);
        return jv_str(b.p ? b.p : "", b.n);
    }
    while (i < s->n) {
        const char *p = count >= 0 && done >= count ? NULL : find_bytes(s->u.s + i, s->n - i, old->u.s, old->n);
        if (!p) {
            jb_put(&r->a, &b, s->u.s + i, s->n - i);
            break;
        }
        jb_put(&r->a, &b, s->u.s + i, (size_t)(p - (s->u.s + i)));
        jb_put(&r->a, &b, new_->u.s, new_->n);
        i = (size_t)(p - s->u.s) + old->n;
        done++;
    }
    return jv_str(b.p ? b.p : "", b.n);
}

/* growable list of values */
typedef struct vlist {
    jv *v;
    size_t n, cap;
} vlist;
static void vl_push(jrender *r, vlist *l, jv x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        jv *v = ja_alloc(&r->a, cap * sizeof *v);
        if (l->n)
            memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}
static jv vl_done(jrender *r, vlist *l) {
    jv out = jv_list(r, 0, 0);
    out.u.l->v = l->v;
    out.u.l->n = l->n;
    return out;
}

/* Python's str.split (sep NULL: runs of whitespace) */
static jv js_split(jrender *r, int line, const jv *s, const jv *sep, int64_t maxsplit) {
    vlist l = {0};
    if (sep && sep->t == JV_NONE)
        sep = NULL;
    if (sep && sep->t != JV_STR)
        jr_fail(r, line, "split(): sep must be str or None, not %s", jv_type_name(sep));
    if (sep) {
        if (!sep->n)
            jr_fail(r, line, "split(): empty separator");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *p = maxsplit >= 0 && done >= maxsplit ? NULL
                                                              : find_bytes(s->u.s + i, s->n - i, sep->u.s, sep->n);
            if (!p) {
                vl_push(r, &l, jv_str(s->u.s + i, s->n - i));
                break;
            }
            vl_push(r, &l, jv_str(s->u.s + i, (size_t)(p - s->u.s) - i));
            i = (size_t)(p - s->u.s) + sep->n;
            done++;
        }
        return vl_done(r, &l);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < s->n) {
        size_t k = i;
        while (k < s->n) { /* skip whitespace */
            size_t j = k;
            if (!jcp_space(next_cp(s->u.s, s->n, &j)))
                break;
            k = j;
        }
        if (k >= s->n)
            break;
        if (maxsplit >= 0 && done >= maxsplit) { /* the rest as it is, trailing whitespace included */
            vl_push(r, &l, jv_str(s->u.s + k, s->n - k));
            break;
        }
        size_t e = k;
        while (e < s->n) {
            size_t j = e;
            if (jcp_space(next_cp(s->u.s, s->n, &j)))
                break;
            e = j;
        }
        vl_push(r, &l, jv_str(s->u.s + k, e - k));
        done++;
        i = e;
    }
    return vl_done(r, &l);
}

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower", "title", "capitalize",
    "replace", "find", "rfind", "count", "join", "splitlines", "isdigit", "isalpha", "isalnum", "isspace",
    "islower", "isupper", "format", "index", "rsplit", NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", NULL};
static const char *const LIST_METHODS[] = {"index", "count", NULL};

static int in_list(const char *const *l, const char *name) {
    for (; *l; l++)
        if (!strcmp(*l, name))
            return 1;
    return 0;
}

int jinja_has_method(const jv *obj, const char *name) {
    switch (obj->t) {
    case JV_STR: return in_list(STR_METHODS, name);
    case JV_DICT: return in_list(DICT_METHODS, name);
    case JV_LIST: return (obj->u.l->kind == JL_LIST || obj->u.l->kind == JL_RANGE) && in_list(LIST_METHODS, name);
    default: return 0;
    }
}

static const jv *arg(jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, size_t i, const char *name) {
    if (i < nargs)
        return &args[i];
    for (size_t k = 0; k < nkw; k++)
        if (!strcmp(kwn[k], name))
            return &kwv[k];
    return NULL;
}

static const jv *str_arg(jrender *r, int line, const jv *v, const char *what) {
    if (!v || v->t != JV_STR)
        jr_fail(r, line, "%s must be a str, not %s", what, v ? jv_type_name(v) : "missing");
    return v;
}

/* positions in code points of sub in s from the left (or the right), -1 if absent */
static int64_t find_cp(const jv *s, const jv *sub, int right) {
    const char *hit = NULL;
    for (size_t i = 0; i + sub->n <= s->n; i++)
        if (!sub->n || memcmp(s->u.s + i, sub->u.s, sub->n) == 0) {
            hit = s->u.s + i;
            if (!right)
                break;
        }
    return hit ? (int64_t)ju8_len(s->u.s, (size_t)(hit - s->u.s)) : -1;
}

static int affix(jrender *r, int line, const jv *s, const jv *x, int end) {
    if (x->t == JV_LIST && x->u.l->tuple) {
        for (size_t i = 0; i < x->u.l->n; i++)
            if (affix(r, line, s, &x->u.l->v[i], end))
                return 1;
        return 0;
    }
    str_arg(r, line, x, end ? "endswith()'s argument" : "startswith()'s argument");
    if (x->n > s->n)
        return 0;
    return memcmp(s->u.s + (end ? s->n - x->n : 0), x->u.s, x->n) == 0;
}

static int all_cp(const jv *s, int what) {
    if (!s->n)
        return 0;
    size_t i = 0;
    int cased = 0;
    while (i < s->n) {
        int32_t c = next_cp(s->u.s, s->n, &i);
        utf8proc_category_t k = utf8proc_category(c);
        switch (what) {
        case 'd': if (k != UTF8PROC_CATEGORY_ND) return 0; break;
        case 'a': if (!(k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO)) return 0; break;
        case 'n': if (!cp_alnum(c)) return 0; break;
        case 's': if (!jcp_space(c)) return 0; break;
        case 'l': if (utf8proc_tolower(c) != c) return 0; cased |= cp_cased(c); break;
        case 'u': if (utf8proc_toupper(c) != c) return 0; cased |= cp_cased(c); break;
        }
    }
    return what == 'l' || what == 'u' ? cased : 1;
}

/* str.format with {} / {0} / {name} fields and {{ }} escapes; format specs are not supported */
static jv js_format(jrender *r, int line, const jv *s, jv *args, size_t nargs, const char **kwn, jv *kwv,
                    size_t nkw) {
    jbuf b = {0};
    size_t auto_i = 0;
    for (size_t i = 0; i < s->n; i++) {
        char ch = s->u.s[i];
        if ((ch == '{' || ch == '}') && i + 1 < s->n && s->u.s[i + 1] == ch) {
            jb_putc(&r->a, &b, ch);
            i++;
            continue;
        }
        if (ch != '{') {
            jb_putc(&r->a, &b, ch);
            continue;
        }
        const char *e = memchr(s->u.s + i, '}', s->n - i);
        if (!e)
            jr_fail(r, line, "format(): single '{' encountered in format string");
        size_t fl = (size_t)(e - (s->u.s + i + 1));
        const char *f = s->u.s + i + 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl))
            jr_fail(r, line, "format(): format specs and conversions are not supported");
        const jv *v = NULL;
        if (fl == 0) {
            v = auto_i < nargs ? &args[auto_i] : NULL;
            auto_i++;
        } else if (f[0] >= '0' && f[0] <= '9') {
            size_t k = (size_t)strtoul(f, NULL, 10);
            v = k < nargs ? &args[k] : NULL;
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (strlen(kwn[k]) == fl && !memcmp(kwn[k], f, fl))
                    v = &kwv[k];
        }
        if (!v)
            jr_fail(r, line, "format(): no argument for field '{%.*s}'", (int)fl, f);
        jv_str_into(r, &b, v);
        i += fl + 1;
    }
    return jv_str(b.p ? b.p : "", b.n);
}

static jv str_method(jrender *r, int line, const jv *s, const char *m, jv *args, size_t nargs, const char **kwn,
                     jv *kwv, size_t nkw) {
#define A(i, name) arg(args, nargs, kwn, kwv, nkw, i, name)
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
        return js_strip(r, line, s, A(0, "chars"), m[0] != 'r', m[0] != 'l');
    if (!strcmp(m, "split"))
        return js_split(r, line, s, A(0, "sep"), jv_int_arg(r, line, A(1, "maxsplit"), -1, "maxsplit"));
    if (!strcmp(m, "rsplit")) {
        int64_t ms = jv_int_arg(r, line, A(1, "maxsplit"), -1, "maxsplit");
        if (ms >= 0)
            jr_fail(r, line, "rsplit() with maxsplit is not supported");
        return js_split(r, line, s, A(0, "sep"), -1);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        const jv *x = A(0, "prefix");
        if (!x)
            jr_fail(r, line, "%s() takes one argument", m);
        return jv_bool(affix(r, line, s, x, m[0] == 'e'));
    }
    if (!strcmp(m, "upper")) return js_case(r, s, 'u');
    if (!strcmp(m, "lower")) return js_case(r, s, 'l');
    if (!strcmp(m, "title")) return js_case(r, s, 't');
    if (!strcmp(m, "capitalize")) return js_case(r, s, 'c');
    if (!strcmp(m, "replace")) {
        const jv *o = str_arg(r, line, A(0, "old"), "replace()'s old");
        const jv *n = str_arg(r, line, A(1, "new"), "replace()'s new");
        return js_replace(r, s, o, n, jv_int_arg(r, line, A(2, "count"), -1, "count"));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index")) {
        int64_t k = find_cp(s, str_arg(r, line, A(0, "sub"), "the substring"), m[0] == 'r');
        if (k < 0 && m[0] == 'i')
            jr_fail(r, line, "substring not found");
        return jv_int(k);
    }
    if (!strcmp(m, "count")) {
        const jv *sub = str_arg(r, line, A(0, "sub"), "count()'s argument");
        if (!sub->n)
            return jv_int((int64_t)ju8_len(s->u.s, s->n) + 1);
        int64_t k = 0;
        for (size_t i = 0; i + sub->n <= s->n;)
            if (!memcmp(s->u.s + i, sub->u.s, sub->n))
                k++, i += sub->n;
            else
                i++;
        return jv_int(k);
    }
    if (!strcmp(m, "join")) {
        const jv *it = A(0, "iterable");
        if (!it)
            jr_fail(r, line, "join() takes one argument");
        jlist *l = jv_iter(r, line, it);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].t != JV_STR)
                jr_fail(r, line, "sequence item %zu: expected str instance, %s found", i, jv_type_name(&l->v[i]));
            if (i)
                jb_put(&r->a, &b, s->u.s, s->n);
            jb_put(&r->a, &b, l->v[i].u.s, l->v[i].n);
        }
        return jv_str(b.p ? b.p : "", b.n);
    }
    if (!strcmp(m, "splitlines")) return js_splitlines(r, s);
    if (!strcmp(m, "isdigit")) return jv_bool(all_cp(s, 'd'));
    if (!strcmp(m, "isalpha")) return jv_bool(all_cp(s, 'a'));
    if (!strcmp(m, "isalnum")) return jv_bool(all_cp(s, 'n'));
    if (!strcmp(m, "isspace")) return jv_bool(all_cp(s, 's'));
    if (!strcmp(m, "islower")) return jv_bool(all_cp(s, 'l'));
    if (!strcmp(m, "isupper")) return jv_bool(all_cp(s, 'u'));
    if (!strcmp(m, "format")) return js_format(r, line, s, args, nargs, kwn, kwv, nkw);
#undef A
    jr_fail(r, line, "str.%s() is not supported", m);
}

jv jinja_method(jrender *r, int line, const jv *obj, const char *m, jv *args, size_t nargs, const char **kwn,
                jv *kwv, size_t nkw) {
    if (obj->t == JV_STR)
        return str_method(r, line, obj, m, args, nargs, kwn, kwv, nkw);
    if (obj->t == JV_DICT) {
        const jdict *d = obj->u.d;
        if (!strcmp(m, "get")) {
            const jv *k = arg(args, nargs, kwn, kwv, nkw, 0, "key");
            const jv *def = arg(args, nargs, kwn, kwv, nkw, 1, "default");
            if (!k)
                jr_fail(r, line, "dict.get() takes a key");
            for (size_t i = 0; i < d->n; i++)
                if (jv_equal(&d->k[i], k))
                    return d->v[i];
            return def ? *def : jv_none();
        }
        jv out = jv_seq(r, d->n, !strcmp(m, "keys") ? JL_KEYS : !strcmp(m, "values") ? JL_VALUES : JL_ITEMS);
        for (size_t i = 0; i < d->n; i++) {
            if (!strcmp(m, "keys")) {
                out.u.l->v[i] = d->k[i];
            } else if (!strcmp(m, "values")) {
                out.u.l->v[i] = d->v[i];
            } else {
                jv t = jv_list(r, 2, 1);
                t.u.l->v[0] = d->k[i];
                t.u.l->v[1] = d->v[i];
                out.u.l->v[i] = t;
            }
        }
        return out;
    }
    if (obj->t == JV_LIST && nargs == 1) {
        int64_t k = 0;
        for (size_t i = 0; i < obj->u.l->n; i++)
            if (jv_equal(&obj->u.l->v[i], &args[0])) {
                if (m[0] == 'i')
                    return jv_int((int64_t)i);
                k++;
            }
        if (m[0] == 'i')
            jr_fail(r, line, "list.index(x): x not in list");
        return jv_int(k);
    }
    jr_fail(r, line, "%s.%s() is not supported here", jv_type_name(obj), m);
}
