/* jinja_filters.c: Jinja2's built-in filters and tests as chat templates use them, with transformers' tojson
 * (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)) in place of Jinja2's.
 *
 * Each filter takes its arguments positionally or by keyword under Jinja2's parameter names. Filters on strings
 * apply str() first, as Jinja2's soft_str does, so an undefined value is "". The attribute arguments of map,
 * selectattr, sort, unique, join, sum, min and max take dotted paths ("function.name", "0"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_impl.h"

static const char *const FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", NULL};

static const char *const TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter", "float",
    "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne", "none",
    "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=",
    ">", ">=", NULL};

static int in_table(const char *const *t, const char *name) {
    for (; *t; t++)
        if (!strcmp(*t, name))
            return 1;
    return 0;
}

int jinja_has_filter(const char *name) {
    return in_table(FILTERS, name);
}

int jinja_has_test(const char *name) {
    return in_table(TESTS, name);
}

/* ---- helpers ---- */
typedef struct fargs {
    jv *pos;
    size_t npos;
    const char **kwn;
    jv *kwv;
    size_t nkw;
} fargs;

static const jv *A(const fargs *a, size_t i, const char *name) {
    if (i < a->npos)
        return &a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name))
            return &a->kwv[k];
    return NULL;
}

static int flag(const jv *v, int def) {
    return v ? jv_truthy(v) : def;
}

/* The generator filters (map, select, unique, batch, items) only fail on what cannot be iterated when the generator
 * runs, as in Jinja2: until then it is a generator like any other. Returns NULL and sets *gen to such a one. */
static jlist *gen_input(jrender *r, int line, const jv *v, jv *gen) {
    if (v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT || v->t == JV_UNDEF)
        return jv_iter(r, line, v);
    *gen = jv_seq(r, 0, JL_GEN);
    jbuf b = {0};
    jb_printf(&r->a, &b, "'%s' object is not iterable", jv_type_name(v));
    gen->u.l->fail = b.p;
    return NULL;
}

static jv list_of(jrender *r, size_t n) {
    return jv_list(r, n, 0);
}

/* Jinja2's make_attrgetter: a dotted path of items (digits are indices) */
static jv attr_path(jrender *r, int line, jv v, const jv *path) {
    if (!path || path->t == JV_NONE)
        return v;
    if (path->t == JV_INT)
        return jv_getitem(r, line, &v, path);
    if (path->t != JV_STR)
        jr_fail(r, line, "attribute must be a string or an integer, not %s", jv_type_name(path));
    size_t i = 0;
    while (i <= path->n) {
        size_t e = i;
        while (e < path->n && path->u.s[e] != '.')
            e++;
        int digits = e > i;
        for (size_t k = i; k < e; k++)
            digits &= path->u.s[k] >= '0' && path->u.s[k] <= '9';
        int64_t idx = 0;
        for (size_t k = i; digits && k < e && idx < INT64_MAX / 10 - 10; k++)
            idx = idx * 10 + (path->u.s[k] - '0');
        jv key = digits ? jv_int(idx) : jv_str(path->u.s + i, e - i);
        v = jv_getitem(r, line, &v, &key);
        i = e + 1;
    }
    return v;
}

static jv sort_key(jrender *r, int line, jv v, const jv *attr, int case_sensitive) {
    v = attr_path(r, line, v, attr);
    if (!case_sensitive && v.t == JV_STR)
        v = js_case(r, &v, 'l');
    return v;
}

jv jv_html_escape(jrender *r, const jv *s) {
    jbuf b = {0};
    for (size_t i = 0; i < s->n; i++) {
        switch (s->u.s[i]) {
        case '&': jb_put(&r->a, &b, "&amp;", 5); break;
        case '<': jb_put(&r->a, &b, "&lt;", 4); break;
        case '>': jb_put(&r->a, &b, "&gt;", 4); break;
        case '"': jb_put(&r->a, &b, "&#34;", 5); break;
        case '\'': jb_put(&r->a, &b, "&#39;", 5); break;
        default: jb_putc(&r->a, &b, s->u.s[i]);
        }
    }
    jv out = jv_str(b.p ? b.p : "", b.n);
    out.mk = 1;
    return out;
}

static jv do_tojson(jrender *r, int line, const jv *v, const fargs *a) {
    int ascii = flag(A(a, 0, "ensure_ascii"), 0);
    const jv *ind = A(a, 1, "indent"), *sep = A(a, 2, "separators");
    int sort_keys = flag(A(a, 3, "sort_keys"), 0);
    int indent = -1;
    if (ind && ind->t != JV_NONE) {
        if (ind->t != JV_INT || ind->u.i < 0)
            jr_fail(r, line, "tojson: indent must be a non-negative integer");
        indent = (int)ind->u.i;
    }
    const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
    if (sep && sep->t != JV_NONE) {
        if (sep->t != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != JV_STR || sep->u.l->v[1].t != JV_STR)
            jr_fail(r, line, "tojson: separators must be a pair of strings");
        item_sep = ja_strdup(&r->a, sep->u.l->v[0].u.s, sep->u.l->v[0].n);
        key_sep = ja_strdup(&r->a, sep->u.l->v[1].u.s, sep->u.l->v[1].n);
    }
    jbuf b = {0};
    jv_tojson(r, line, &b, v, indent, 0, sort_keys, ascii, item_sep, key_sep);
    return jv_str(b.p ? b.p : "", b.n);
}

static jv do_indent(jrender *r, const jv *s, const fargs *a) {
    const jv *w = A(a, 0, "width");
    jv ind;
    if (w && w->t == JV_STR) {
        ind = *w;
    } else {
        int64_t k = w && w->t == JV_INT ? w->u.i : 4;
        char *p = ja_alloc(&r->a, (size_t)(k > 0 ? k : 0) + 1);
        for (int64_t i = 0; i < k; i++)
            p[i] = ' ';
        ind = jv_str(p, (size_t)(k > 0 ? k : 0));
    }
    int first = flag(A(a, 1, "first"), 0), blank = flag(A(a, 2, "blank"), 0);
    jbuf b = {0};
    if (first)
        jb_put(&r->a, &b, ind.u.s, ind.n);
    /* the lines of s + "\n" (str.splitlines: one more, empty, where s is empty or ends with a line break), joined by
     * "\n", each but the first indented unless it is empty (blank: indented all the same) */
    jv lines = js_splitlines(r, s);
    size_t nl = lines.u.l->n + (s->n == 0 || js_line_break(s->u.s, s->n, s->n - 1) ||
                                (s->n >= 2 && js_line_break(s->u.s, s->n, s->n - 2) == 2) ||
                                (s->n >= 3 && js_line_break(s->u.s, s->n, s->n - 3) == 3));
    for (size_t i = 0; i < nl; i++) {
        jv ln = i < lines.u.l->n ? lines.u.l->v[i] : jv_str("", 0);
        if (i) {
            jb_putc(&r->a, &b, '\n');
            if (blank || ln.n)
                jb_put(&r->a, &b, ind.u.s, ind.n);
        }
        jb_put(&r->a, &b, ln.u.s, ln.n);
    }
    return jv_str(b.p ? b.p : "", b.n);
}

/* Python's printf-style formatting (fmt % args, |format) with %s, %r, %d, %i and %%, no flags or widths */
jv jv_printf(jrender *r, int line, const jv *fmt, const jv *args, size_t nargs) {
    jbuf b = {0};
    size_t k = 0;
    for (size_t i = 0; i < fmt->n; i++) {
        char ch = fmt->u.s[i];
        if (ch != '%') {
            jb_putc(&r->a, &b, ch);
            continue;
        }
        if (i + 1 == fmt->n)
            jr_fail(r, line, "incomplete format");
        char c = fmt->u.s[++i];
        if (c == '%') {
            jb_putc(&r->a, &b, '%');
            continue;
        }
        if (c != 's' && c != 'r' && c != 'd' && c != 'i')
            jr_fail(r, line, "printf-style formatting: only %%s, %%r, %%d and %%i are supported, got %%%c", c);
        if (k >= nargs)
            jr_fail(r, line, "not enough arguments for format string");
        const jv *v = &args[k++];
        if (c == 's') {
            jv_str_into(r, &b, v);
        } else if (c == 'r') {
            jv_repr_into(r, &b, v);
        } else if (v->t == JV_INT || v->t == JV_BOOL || v->t == JV_FLOAT) {
            jb_printf(&r->a, &b, "%lld", v->t == JV_INT ? (long long)v->u.i : v->t == JV_BOOL ? (long long)v->u.b
                                                                                            : (long long)v->u.f);
        } else {
            jr_fail(r, line, "%%%c format: a real number is required, not %s", c, jv_type_name(v));
        }
    }
    /* Python takes a lone list or dict for a mapping of named arguments, which need not all be used */
    int mapping = nargs == 1 && (args[0].t == JV_DICT || (args[0].t == JV_LIST && !args[0].u.l->tuple));
    if (k < nargs && !mapping)
        jr_fail(r, line, "not all arguments converted during string formatting");
    return jv_str(b.p ? b.p : "", b.n);
}

/* select/reject/selectattr/rejectattr: keep the items whose test (or truthiness) is `want` */
static jv do_select(jrender *r, int line, const jv *v, const fargs *a, int by_attr, int want) {
    if (!jv_truthy(v)) /* Jinja2 iterates only a truthy value: none|selectattr(...) is an empty generator */
        return jv_seq(r, 0, JL_GEN);
    jv gen;
    jlist *l = gen_input(r, line, v, &gen);
    if (!l)
        return gen;
    size_t off = by_attr ? 1 : 0;
    const jv *attr = by_attr ? A(a, 0, "attribute") : NULL;
    if (by_attr && !attr)
        jr_fail(r, line, "selectattr/rejectattr need an attribute");
    const jv *test = a->npos > off ? &a->pos[off] : NULL;
    if (test && test->t != JV_STR)
        jr_fail(r, line, "the test must be named by a string");
    char *tname = test ? ja_strdup(&r->a, test->u.s, test->n) : NULL;
    if (tname && !jinja_has_test(tname))
        jr_fail(r, line, "no test named '%s'", tname);
    jv out = jv_seq(r, l->n, JL_GEN);
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        jv x = by_attr ? attr_path(r, line, l->v[i], attr) : l->v[i];
        int ok = tname ? jinja_test(r, line, tname, &x, a->pos + off + 1, a->npos > off + 1 ? a->npos - off - 1 : 0)
                       : jv_truthy(&x);
        if (ok == want)
            out.u.l->v[k++] = l->v[i];
    }
    out.u.l->n = k;
    return out;
}

static jv do_map(jrender *r, int line, const jv *v, const fargs *a) {
    if (!jv_truthy(v))
        return jv_seq(r, 0, JL_GEN);
    jv gen;
    jlist *l = gen_input(r, line, v, &gen);
    if (!l)
        return gen;
    jv out = jv_seq(r, l->n, JL_GEN);
    const jv *attr = A(a, 99, "attribute");
    if (attr) {
        const jv *def = A(a, 99, "default");
        for (size_t i = 0; i < l->n; i++) {
            jv x = attr_path(r, line, l->v[i], attr);
            out.u.l->v[i] = x.t == JV_UNDEF && def ? *def : x;
        }
        return out;
    }
    if (!a->npos || a->pos[0].t != JV_STR)
        jr_fail(r, line, "map needs a filter name or attribute=");
    char *f = ja_strdup(&r->a, a->pos[0].u.s, a->pos[0].n);
    if (!jinja_has_filter(f))
        jr_fail(r, line, "no filter named '%s'", f);
    for (size_t i = 0; i < l->n; i++)
        out.u.l->v[i] = jinja_filter(r, line, f, l->v[i], a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw);
    return out;
}

static jv do_sort(jrender *r, int line, const jv *v, const fargs *a) {
    jlist *l = jv_iter(r, line, v);
    int rev = flag(A(a, 0, "reverse"), 0), cs = flag(A(a, 1, "case_sensitive"), 0);
    const jv *attr = A(a, 2, "attribute");
    jv out = list_of(r, l->n);
    jv *keys = l->n ? ja_alloc(&r->a, l->n * sizeof *keys) : NULL;
    for (size_t i = 0; i < l->n; i++) { /* stable insertion sort */
        jv x = l->v[i], kx = sort_key(r, line, x, attr, cs);
        size_t j = i;
        while (j > 0) {
            int c = jv_compare(r, line, &keys[j - 1], &kx);
            if (rev ? c >= 0 : c <= 0)
                break;
            keys[j] = keys[j - 1];
            out.u.l->v[j] = out.u.l->v[j - 1];
            j--;
        }
        keys[j] = kx;
        out.u.l->v[j] = x;
    }
    return out;
}

static jv do_minmax(jrender *r, int line, const jv *v, const fargs *a, int want_max) {
    jlist *l = jv_iter(r, line, v);
    int cs = flag(A(a, 0, "case_sensitive"), 0);
    const jv *attr = A(a, 1, "attribute");
    if (!l->n)
        return jv_undef("no min or max of an empty sequence");
    size_t best = 0;
    jv bk = sort_key(r, line, l->v[0], attr, cs);
    for (size_t i = 1; i < l->n; i++) {
        jv k = sort_key(r, line, l->v[i], attr, cs);
        int c = jv_compare(r, line, &k, &bk);
        if (want_max ? c > 0 : c < 0)
            best = i, bk = k;
    }
    return l->v[best];
}

static jv do_unique(jrender *r, int line, const jv *v, const fargs *a) {
    jv gen;
    jlist *l = gen_input(r, line, v, &gen);
    if (!l)
        return gen;
    int cs = flag(A(a, 0, "case_sensitive"), 0);
    const jv *attr = A(a, 1, "attribute");
    jv out = jv_seq(r, l->n, JL_GEN), *seen = l->n ? ja_alloc(&r->a, l->n * sizeof(jv)) : NULL;
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        jv key = sort_key(r, line, l->v[i], attr, cs);
        size_t j = 0;
        while (j < k && !jv_equal(&seen[j], &key))
            j++;
        if (j == k) {
            seen[k] = key;
            out.u.l->v[k++] = l->v[i];
        }
    }
    out.u.l->n = k;
    return out;
}

/* |items: a generator of (key, value) */
static jv items_of(jrender *r, int line, const jv *v) {
    if (v->t == JV_UNDEF)
        return jv_seq(r, 0, JL_GEN);
    if (v->t != JV_DICT) {
        jv gen = jv_seq(r, 0, JL_GEN);
        gen.u.l->fail = "items: can only get items of a mapping";
        return gen;
    }
    jv out = jinja_method(r, line, v, "items", NULL, 0, NULL, NULL, 0);
    out.u.l->kind = JL_GEN;
    return out;
}

static jv do_round(jrender *r, int line, const jv *v, const fargs *a) {
    int64_t prec = jv_int_arg(r, line, A(a, 0, "precision"), 0, "precision");
    const jv *m = A(a, 1, "method");
    if (v->t != JV_INT && v->t != JV_FLOAT && v->t != JV_BOOL)
        jr_fail(r, line, "round: expected a number, got %s", jv_type_name(v));
    double x = v->t == JV_FLOAT ? v->u.f : (double)(v->t == JV_INT ? v->u.i : v->u.b), p = pow(10.0, (double)prec);
    if (m && m->t == JV_STR && m->n == 5 && !memcmp(m->u.s, "floor", 5))
        return jv_float(floor(x * p) / p);
    if (m && m->t == JV_STR && m->n == 4 && !memcmp(m->u.s, "ceil", 4))
        return jv_float(ceil(x * p) / p);
    if (v->t != JV_FLOAT)
        return jv_int(v->t == JV_INT ? v->u.i : v->u.b); /* round() of an int or a bool is an int */
    return jv_float(nearbyint(x * p) / p);
}

static jv do_length(jrender *r, int line, const jv *v) {
    switch (v->t) {
    case JV_STR: return jv_int((int64_t)ju8_len(v->u.s, v->n));
    case JV_LIST:
        if (v->u.l->kind == JL_GEN || v->u.l->kind == JL_REVITER)
            jr_fail(r, line, "object of type '%s' has no len()", jl_pyname(v->u.l));
        return jv_int((int64_t)v->u.l->n);
    case JV_DICT:
    case JV_NS: return jv_int((int64_t)v->u.d->n);
    case JV_UNDEF: return jv_int(0);
    default: jr_fail(r, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static jv to_number(jrender *r, const jv *v, const fargs *a, int want_int) {
    const jv *def = A(a, 0, "default");
    jv d = def ? *def : want_int ? jv_int(0) : jv_float(0.0);
    switch (v->t) {
    case JV_INT:
    case JV_BOOL: {
        int64_t i = v->t == JV_INT ? v->u.i : v->u.b;
        return want_int ? jv_int(i) : jv_float((double)i);
    }
    case JV_FLOAT: return want_int ? jv_int((int64_t)v->u.f) : *v;
    case JV_STR: {
        jv t = js_strip(r, 0, v, NULL, 1, 1);
        char *s = ja_strdup(&r->a, t.u.s, t.n), *end;
        if (!t.n)
            return d;
        if (want_int) {
            long long i = strtoll(s, &end, 10);
            if (!*end)
                return jv_int(i);
        }
        double f = strtod(s, &end);
        if (*end)
            return d;
        return want_int ? jv_int((int64_t)f) : jv_float(f);
    }
    default: return d;
    }
}

static const char *const STRING_FILTERS[] = {"trim", "upper", "lower", "capitalize", "title", "string", "safe",
                                             "e", "escape", "forceescape", "replace", "indent", "format",
                                             "wordcount", "center", NULL};

/* The filters on strings (STRING_FILTERS): v as str() makes it, s. */
static jv string_filter(jrender *r, int line, const char *f, const jv *v, jv s, const fargs *a0) {
    const fargs a = *a0;
    /* Markup stays Markup through the string methods (markupsafe wraps them) */
    if (!strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") ||
        !strcmp(f, "title")) {
        jv out = f[0] == 't' && f[1] == 'r' ? js_strip(r, line, &s, A(&a, 0, "chars"), 1, 1)
                 : js_case(r, &s, f[0] == 'u' ? 'u' : f[0] == 'l' ? 'l' : f[0] == 'c' ? 'c' : 'T');
        out.mk = s.mk;
        return out;
    }
    if (!strcmp(f, "string")) return s;
    if (!strcmp(f, "safe")) {
        s.mk = 1;
        return s;
    }
    if (!strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape"))
        return s.mk && f[0] != 'f' ? s : jv_html_escape(r, &s);
    if (!strcmp(f, "replace")) {
        const jv *o = A(&a, 0, "old"), *n = A(&a, 1, "new");
        if (!o || !n)
            jr_fail(r, line, "replace needs old and new");
        jv os = jv_to_str(r, o), ns = jv_to_str(r, n);
        return js_replace(r, &s, &os, &ns, jv_int_arg(r, line, A(&a, 2, "count"), -1, "count"));
    }
    if (!strcmp(f, "indent")) {
        if (v->t == JV_UNDEF)
            jv_fail_undef(r, line, v);
        if (v->t != JV_STR)
            jr_fail(r, line, "indent needs a string, got %s", jv_type_name(v));
        return do_indent(r, &s, &a);
    }
    if (!strcmp(f, "format")) {
        if (a.nkw)
            jr_fail(r, line, "format with keyword arguments is not supported");
        return jv_printf(r, line, &s, a.pos, a.npos);
    }
    if (!strcmp(f, "wordcount")) return jv_int(js_wordcount(&s));
    if (!strcmp(f, "center")) {
        int64_t w = jv_int_arg(r, line, A(&a, 0, "width"), 80, "width"), len = (int64_t)ju8_len(s.u.s, s.n);
        if (w <= len)
            return s;
        int64_t left = (w - len) / 2 + ((w - len) & w & 1);
        jbuf b = {0};
        for (int64_t i = 0; i < left; i++)
            jb_putc(&r->a, &b, ' ');
        jb_put(&r->a, &b, s.u.s, s.n);
        for (int64_t i = 0; i < w - len - left; i++)
            jb_putc(&r->a, &b, ' ');
        return jv_str(b.p, b.n);
    }
    jr_fail(r, line, "internal: '%s' is not a string filter", f);
}

jv jinja_filter(jrender *r, int line, const char *f, jv v, jv *args, size_t nargs, const char **kwn, jv *kwv,
                size_t nkw) {
    fargs a = {args, nargs, kwn, kwv, nkw};
    if (in_table(STRING_FILTERS, f))
        return string_filter(r, line, f, &v, v.t == JV_STR ? v : jv_to_str(r, &v), &a);
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const jv *def = A(&a, 0, "default_value");
        if (v.t == JV_UNDEF || (flag(A(&a, 1, "boolean"), 0) && !jv_truthy(&v)))
            return def ? *def : jv_str("", 0);
        return v;
    }
    if (!strcmp(f, "tojson")) return do_tojson(r, line, &v, &a);
    if (!strcmp(f, "length") || !strcmp(f, "count")) return do_length(r, line, &v);
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (f[0] == 'l' && v.t == JV_LIST && (v.u.l->kind == JL_GEN || v.u.l->kind == JL_REVITER))
            jr_fail(r, line, "last: '%s' object is not reversible", jl_pyname(v.u.l));
        jlist *l = jv_iter(r, line, &v);
        if (!l->n)
            return jv_undef("the sequence is empty: no first or last item");
        return l->v[f[0] == 'f' ? 0 : l->n - 1];
    }
    if (!strcmp(f, "join")) {
        jlist *l = jv_iter(r, line, &v);
        const jv *d = A(&a, 0, "d"), *attr = A(&a, 1, "attribute");
        jv sep = d ? jv_to_str(r, d) : jv_str("", 0);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jb_put(&r->a, &b, sep.u.s, sep.n);
            jv x = attr_path(r, line, l->v[i], attr);
            jv_str_into(r, &b, &x);
        }
        return jv_str(b.p ? b.p : "", b.n);
    }
    if (!strcmp(f, "list")) {
        jlist *l = jv_iter(r, line, &v);
        jv out = list_of(r, l->n);
        if (l->n)
            memcpy(out.u.l->v, l->v, l->n * sizeof(jv));
        return out;
    }
    if (!strcmp(f, "items")) return items_of(r, line, &v);
    if (!strcmp(f, "dictsort")) {
        if (v.t == JV_UNDEF)
            jv_fail_undef(r, line, &v);
        jv it = items_of(r, line, &v);
        const jv *by = A(&a, 1, "by");
        jv path = jv_int(by && by->t == JV_STR && by->n == 5 && !memcmp(by->u.s, "value", 5) ? 1 : 0);
        jv sa[3] = {jv_bool(flag(A(&a, 2, "reverse"), 0)), jv_bool(flag(A(&a, 0, "case_sensitive"), 0)), path};
        fargs sa_args = {sa, 3, NULL, NULL, 0};
        return do_sort(r, line, &it, &sa_args);
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == JV_STR) {
            jlist *l = jv_iter(r, line, &v);
            jbuf b = {0};
            for (size_t i = l->n; i-- > 0;)
                jb_put(&r->a, &b, l->v[i].u.s, l->v[i].n);
            return jv_str(b.p ? b.p : "", b.n);
        }
        /* reversed() where Python can (a reverse iterator), else a reversed list (of a generator) */
        int lazy = !(v.t == JV_LIST && (v.u.l->kind == JL_GEN || v.u.l->kind == JL_REVITER));
        jlist *l = jv_iter(r, line, &v);
        jv out = jv_seq(r, l->n, lazy ? JL_REVITER : JL_LIST);
        for (size_t i = 0; i < l->n; i++)
            out.u.l->v[i] = l->v[l->n - 1 - i];
        return out;
    }
    if (!strcmp(f, "map")) return do_map(r, line, &v, &a);
    if (!strcmp(f, "select")) return do_select(r, line, &v, &a, 0, 1);
    if (!strcmp(f, "reject")) return do_select(r, line, &v, &a, 0, 0);
    if (!strcmp(f, "selectattr")) return do_select(r, line, &v, &a, 1, 1);
    if (!strcmp(f, "rejectattr")) return do_select(r, line, &v, &a, 1, 0);
    if (!strcmp(f, "sort")) return do_sort(r, line, &v, &a);
    if (!strcmp(f, "unique")) return do_unique(r, line, &v, &a);
    if (!strcmp(f, "min")) return do_minmax(r, line, &v, &a, 0);
    if (!strcmp(f, "max")) return do_minmax(r, line, &v, &a, 1);
    if (!strcmp(f, "sum")) {
        jlist *l = jv_iter(r, line, &v);
        const jv *attr = A(&a, 0, "attribute"), *start = A(&a, 1, "start");
        jv acc = start ? *start : jv_int(0);
        for (size_t i = 0; i < l->n; i++) {
            jv x = attr_path(r, line, l->v[i], attr);
            acc = jv_binop(r, line, JOP_ADD, &acc, &x);
        }
        return acc;
    }
    if (!strcmp(f, "abs")) {
        if (v.t == JV_INT) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JV_BOOL) return jv_int(v.u.b);
        if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
        jr_fail(r, line, "bad operand type for abs(): '%s'", jv_type_name(&v));
    }
    if (!strcmp(f, "round")) return do_round(r, line, &v, &a);
    if (!strcmp(f, "int") || !strcmp(f, "float")) {
        if (v.t == JV_UNDEF)
            jv_fail_undef(r, line, &v);
        return to_number(r, &v, &a, f[0] == 'i');
    }
    if (!strcmp(f, "attr")) {
        const jv *n = A(&a, 0, "name");
        if (!n || n->t != JV_STR)
            jr_fail(r, line, "attr needs a name");
        return jv_getattr(r, line, &v, ja_strdup(&r->a, n->u.s, n->n));
    }
    if (!strcmp(f, "batch")) {
        int64_t k = jv_int_arg(r, line, A(&a, 0, "linecount"), 1, "linecount");
        const jv *fill = A(&a, 1, "fill_with");
        jlist *l = jv_iter(r, line, &v);
        if (k <= 0)
            jr_fail(r, line, "batch: linecount must be positive");
        size_t nb = (l->n + (size_t)k - 1) / (size_t)k;
        jv out = jv_seq(r, nb, JL_GEN);
        for (size_t b = 0; b < nb; b++) {
            size_t len = b + 1 < nb || !fill ? ((l->n - b * (size_t)k) < (size_t)k ? l->n - b * (size_t)k : (size_t)k)
                                             : (size_t)k;
            jv row = list_of(r, len);
            for (size_t i = 0; i < len; i++)
                row.u.l->v[i] = b * (size_t)k + i < l->n ? l->v[b * (size_t)k + i] : *fill;
            out.u.l->v[b] = row;
        }
        return out;
    }
    jr_fail(r, line, "the filter '%s' is not supported", f);
}

static int is_same(const jv *x, const jv *y) {
    if (x->t != y->t)
        return 0;
    switch (x->t) {
    case JV_NONE:
    case JV_UNDEF: return 1;
    case JV_BOOL: return x->u.b == y->u.b;
    case JV_INT: return x->u.i == y->u.i && x->u.i >= -5 && x->u.i <= 256; /* CPython's small-int cache */
    case JV_STR: return x->u.s == y->u.s && x->n == y->n;
    default: return x->u.l == y->u.l;
    }
}

int jinja_test(jrender *r, int line, const char *t, const jv *v, jv *args, size_t nargs) {
    const jv *x = nargs ? &args[0] : NULL;
#define NEED_ARG                                                                                                 \
    do {                                                                                                         \
        if (!x)                                                                                                  \
            jr_fail(r, line, "the test '%s' needs an argument", t);                                             \
    } while (0)
    if (!strcmp(t, "defined")) return v->t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v->t == JV_UNDEF;
    if (!strcmp(t, "none")) return v->t == JV_NONE;
    if (!strcmp(t, "string")) return v->t == JV_STR;
    if (!strcmp(t, "number")) return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
    if (!strcmp(t, "integer")) return v->t == JV_INT;
    if (!strcmp(t, "float")) return v->t == JV_FLOAT;
    if (!strcmp(t, "boolean")) return v->t == JV_BOOL;
    if (!strcmp(t, "true")) return v->t == JV_BOOL && v->u.b;
    if (!strcmp(t, "false")) return v->t == JV_BOOL && !v->u.b;
    if (!strcmp(t, "mapping")) return v->t == JV_DICT;
    if (!strcmp(t, "iterable")) return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT || v->t == JV_UNDEF;
    if (!strcmp(t, "sequence"))
        return v->t == JV_STR || v->t == JV_DICT || v->t == JV_UNDEF ||
               (v->t == JV_LIST && (v->u.l->kind == JL_LIST || v->u.l->kind == JL_RANGE));
    if (!strcmp(t, "callable")) return v->t == JV_MACRO || v->t == JV_FUNC || v->t == JV_METHOD;
    if (!strcmp(t, "escaped")) return v->t == JV_STR && v->mk;
    if (!strcmp(t, "sameas")) {
        NEED_ARG;
        return is_same(v, x);
    }
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) {
        NEED_ARG;
        return jv_equal(v, x);
    }
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) {
        NEED_ARG;
        return !jv_equal(v, x);
    }
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<")) {
        NEED_ARG;
        return jv_compare(r, line, v, x) < 0;
    }
    if (!strcmp(t, "le") || !strcmp(t, "<=")) {
        NEED_ARG;
        return jv_compare(r, line, v, x) <= 0;
    }
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">")) {
        NEED_ARG;
        return jv_compare(r, line, v, x) > 0;
    }
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) {
        NEED_ARG;
        return jv_compare(r, line, v, x) >= 0;
    }
    if (!strcmp(t, "in")) {
        NEED_ARG;
        return jv_contains(r, line, x, v);
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) { /* value % 2 == 1, ... */
        jv d = jv_int(2), one = jv_int(1), zero = jv_int(0);
        if (t[0] == 'd') {
            NEED_ARG;
            d = *x;
        }
        jv m = jv_binop(r, line, JOP_MOD, v, &d);
        return jv_equal(&m, t[0] == 'o' ? &one : &zero);
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) { /* str(value).islower() */
        jv s = jv_to_str(r, v);
        return jinja_method(r, line, &s, t[0] == 'l' ? "islower" : "isupper", NULL, 0, NULL, NULL, 0).u.b;
    }
    if (!strcmp(t, "filter") || !strcmp(t, "test")) {
        NEED_ARG;
        if (x->t != JV_STR)
            return 0;
        char *nm = ja_strdup(&r->a, x->u.s, x->n);
        return t[0] == 'f' ? jinja_has_filter(nm) : jinja_has_test(nm);
    }
#undef NEED_ARG
    jr_fail(r, line, "the test '%s' is not supported", t);
}
