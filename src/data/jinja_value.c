/* jinja_value.c: the values of the Jinja interpreter and the Python semantics they follow: truthiness, str() and
 * repr(), equality and ordering, arithmetic, attribute and item lookup as Jinja2's sandbox does it, iteration, and
 * the arenas and byte buffers everything is built in. JSON in and out is in jinja_json.c. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "core/json_util.h"
#include "data/jinja_impl.h"

/* ---- arena ---- */
struct jarena_chunk {
    jarena_chunk *next;
    size_t size;
    max_align_t data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > a->left) {
        size_t size = n > 65536 ? n : 65536;
        jarena_chunk *c = malloc(sizeof *c + size);
        if (!c) {
            snug_fail(a->e, SNUG_ENOMEM, "out of memory rendering a chat template");
            longjmp(*a->oom, 1);
        }
        c->next = a->head;
        c->size = size;
        a->head = c;
        a->cur = (char *)c->data;
        a->left = size;
    }
    void *p = a->cur;
    a->cur += n;
    a->left -= n;
    return p;
}

char *ja_strdup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ja_free(jarena *a) {
    jarena_chunk *c = a->head;
    while (c) {
        jarena_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->cur = NULL;
    a->left = 0;
}

/* ---- buffers ---- */
void jb_put(jarena *a, jbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = ja_alloc(a, cap);
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jb_putc(jarena *a, jbuf *b, char c) {
    jb_put(a, b, &c, 1);
}

void jb_printf(jarena *a, jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    jb_put(a, b, tmp, k < (int)sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ---- UTF-8 ---- */
size_t ju8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t ju8_offset(const char *s, size_t n, size_t cp) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (k == cp)
                return i;
            k++;
        }
    }
    return n;
}

/* ---- basic ---- */
const char *jv_type_name(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return jl_pyname(v->u.l);
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

void jv_fail_undef(jrender *r, int line, const jv *v) {
    if (v->n && !strncmp(v->u.s, "'", 1))
        jr_fail(r, line, "%s", v->u.s);
    jr_fail(r, line, "'%s' is undefined", v->n ? v->u.s : "value");
}

int jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->n != 0;
    case JV_LIST: return v->u.l->kind == JL_GEN || v->u.l->kind == JL_REVITER || v->u.l->n != 0;
    case JV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

jdict *jd_new(jrender *r, size_t cap) {
    jdict *d = ja_alloc(&r->a, sizeof *d);
    d->n = 0;
    d->cap = cap;
    d->k = cap ? ja_alloc(&r->a, cap * sizeof *d->k) : NULL;
    d->v = cap ? ja_alloc(&r->a, cap * sizeof *d->v) : NULL;
    return d;
}

jv *jd_get(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].n == n && (n == 0 || memcmp(d->k[i].u.s, k, n) == 0))
            return &d->v[i];
    return NULL;
}

static jv *jd_find(const jdict *d, const jv *k) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(&d->k[i], k))
            return &d->v[i];
    return NULL;
}

void jd_set(jrender *r, jdict *d, jv k, jv v) {
    jv *old = jd_find(d, &k);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        jv *nk = ja_alloc(&r->a, cap * sizeof *nk), *nv = ja_alloc(&r->a, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

const char *jl_pyname(const jlist *l) {
    static const char *const names[] = {"list", "generator", "list_reverseiterator", "dict_items", "dict_keys",
                                        "dict_values", "range"};
    return l->tuple ? "tuple" : names[l->kind];
}

jv jv_seq(jrender *r, size_t n, int kind) {
    jv v = jv_list(r, n, 0);
    v.u.l->kind = kind;
    return v;
}

jv jv_list(jrender *r, size_t n, int tuple) {
    jlist *l = ja_alloc(&r->a, sizeof *l);
    memset(l, 0, sizeof *l);
    l->n = n;
    l->v = n ? ja_alloc(&r->a, n * sizeof *l->v) : NULL;
    l->tuple = tuple;
    jv v = {JV_LIST, 0, {.l = l}, 0};
    return v;
}

/* ---- str and repr ---- */
static void float_into(jrender *r, jbuf *b, double f) {
    char tmp[32];
    if (isnan(f)) {
        jb_put(&r->a, b, "nan", 3);
        return;
    }
    if (isinf(f)) {
        jb_put(&r->a, b, f < 0 ? "-inf" : "inf", f < 0 ? 4 : 3);
        return;
    }
    int k = snug_json_py_float(f, tmp);
    jb_put(&r->a, b, tmp, (size_t)k);
}

static void repr_str(jrender *r, jbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(&r->a, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == (unsigned char)q || ch == '\\') {
            jb_putc(&r->a, b, '\\');
            jb_putc(&r->a, b, (char)ch);
        } else if (ch == '\n') {
            jb_put(&r->a, b, "\\n", 2);
        } else if (ch == '\r') {
            jb_put(&r->a, b, "\\r", 2);
        } else if (ch == '\t') {
            jb_put(&r->a, b, "\\t", 2);
        } else if (ch < 0x20 || ch == 0x7f) {
            jb_printf(&r->a, b, "\\x%02x", ch);
        } else if (ch < 0x80) {
            jb_putc(&r->a, b, (char)ch);
        } else { /* what str.isprintable() calls unprintable is escaped: Other and Separator but the space */
            int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
            if (k <= 0) {
                jb_putc(&r->a, b, (char)ch);
                continue;
            }
            utf8proc_category_t cat = utf8proc_category(cp);
            int unprintable = cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                              cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                              cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                              cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS;
            if (!unprintable)
                jb_put(&r->a, b, s + i, (size_t)k);
            else if (cp < 0x100)
                jb_printf(&r->a, b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000)
                jb_printf(&r->a, b, "\\u%04x", (unsigned)cp);
            else
                jb_printf(&r->a, b, "\\U%08x", (unsigned)cp);
            i += (size_t)k - 1;
        }
    }
    jb_putc(&r->a, b, q);
}

void jv_repr_into(jrender *r, jbuf *b, const jv *v) {
    switch (v->t) {
    case JV_STR: repr_str(r, b, v->u.s, v->n); return;
    case JV_LIST: {
        const jlist *l = v->u.l;
        if (l->kind == JL_GEN || l->kind == JL_REVITER)
            jr_fail(r, r->line, "printing a %s, which Jinja2 prints as its memory address; add |list", jl_pyname(l));
        if (l->kind == JL_RANGE) {
            jb_printf(&r->a, b, "range(%lld, %lld", (long long)l->range[0], (long long)l->range[1]);
            if (l->range[2] != 1)
                jb_printf(&r->a, b, ", %lld", (long long)l->range[2]);
            jb_putc(&r->a, b, ')');
            return;
        }
        if (l->kind != JL_LIST) {
            jb_put(&r->a, b, jl_pyname(l), strlen(jl_pyname(l)));
            jb_putc(&r->a, b, '(');
        }
        jb_putc(&r->a, b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jb_put(&r->a, b, ", ", 2);
            jv_repr_into(r, b, &l->v[i]);
        }
        if (l->tuple && l->n == 1)
            jb_putc(&r->a, b, ',');
        jb_putc(&r->a, b, l->tuple ? ')' : ']');
        if (l->kind != JL_LIST)
            jb_putc(&r->a, b, ')');
        return;
    }
    case JV_DICT:
    case JV_NS: {
        const jdict *d = v->u.d;
        if (v->t == JV_NS)
            jb_put(&r->a, b, "<Namespace ", 11);
        jb_putc(&r->a, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jb_put(&r->a, b, ", ", 2);
            jv_repr_into(r, b, &d->k[i]);
            jb_put(&r->a, b, ": ", 2);
            jv_repr_into(r, b, &d->v[i]);
        }
        jb_putc(&r->a, b, '}');
        if (v->t == JV_NS)
            jb_putc(&r->a, b, '>');
        return;
    }
    case JV_UNDEF: return;
    default: jv_str_into(r, b, v);
    }
}

void jv_str_into(jrender *r, jbuf *b, const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_put(&r->a, b, "None", 4); return;
    case JV_BOOL: jb_put(&r->a, b, v->u.b ? "True" : "False", v->u.b ? 4 : 5); return;
    case JV_INT: jb_printf(&r->a, b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: float_into(r, b, v->u.f); return;
    case JV_STR: jb_put(&r->a, b, v->u.s, v->n); return;
    case JV_LIST:
    case JV_DICT:
    case JV_NS: jv_repr_into(r, b, v); return;
    case JV_MACRO: jb_printf(&r->a, b, "<Macro '%s'>", v->u.m->def->name ? v->u.m->def->name : "caller"); return;
    case JV_FUNC: jb_put(&r->a, b, "<function>", 10); return;
    case JV_METHOD: jb_printf(&r->a, b, "<built-in method %s>", v->u.meth->name); return;
    case JV_LOOP: jb_put(&r->a, b, "<LoopContext>", 13); return;
    }
}

jv jv_to_str(jrender *r, const jv *v) {
    if (v->t == JV_STR)
        return *v;
    jbuf b = {0};
    jv_str_into(r, &b, v);
    return jv_str(b.p ? b.p : "", b.n);
}

/* ---- comparison ---- */
static int is_num(const jv *v) {
    return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
}
static double num_f(const jv *v) {
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const jv *v) {
    return v->t == JV_INT ? v->u.i : v->u.b;
}

int jv_equal(const jv *x, const jv *y) {
    if (is_num(x) && is_num(y)) {
        if (x->t == JV_FLOAT || y->t == JV_FLOAT)
            return num_f(x) == num_f(y);
        return num_i(x) == num_i(y);
    }
    if (x->t != y->t)
        return 0;
    switch (x->t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return x->n == y->n && (x->n == 0 || memcmp(x->u.s, y->u.s, x->n) == 0);
    case JV_LIST:
        if (x->u.l == y->u.l)
            return 1;
        if (x->u.l->n != y->u.l->n || x->u.l->tuple != y->u.l->tuple || x->u.l->kind != y->u.l->kind ||
            x->u.l->kind == JL_GEN || x->u.l->kind == JL_REVITER)
            return 0;
        for (size_t i = 0; i < x->u.l->n; i++)
            if (!jv_equal(&x->u.l->v[i], &y->u.l->v[i]))
                return 0;
        return 1;
    case JV_DICT:
        if (x->u.d->n != y->u.d->n)
            return 0;
        for (size_t i = 0; i < x->u.d->n; i++) {
            jv *o = jd_find(y->u.d, &x->u.d->k[i]);
            if (!o || !jv_equal(&x->u.d->v[i], o))
                return 0;
        }
        return 1;
    case JV_NS: return x->u.d == y->u.d;
    case JV_MACRO: return x->u.m == y->u.m;
    case JV_FUNC: return x->u.fn == y->u.fn;
    default: return 0;
    }
}

int jv_compare(jrender *r, int line, const jv *x, const jv *y) {
    if (is_num(x) && is_num(y)) {
        if (x->t == JV_FLOAT || y->t == JV_FLOAT) {
            double a = num_f(x), b = num_f(y);
            return a < b ? -1 : a > b ? 1 : 0;
        }
        int64_t a = num_i(x), b = num_i(y);
        return a < b ? -1 : a > b ? 1 : 0;
    }
    if (x->t == JV_STR && y->t == JV_STR) {
        size_t m = x->n < y->n ? x->n : y->n;
        int c = m ? memcmp(x->u.s, y->u.s, m) : 0;
        return c ? c : x->n < y->n ? -1 : x->n > y->n ? 1 : 0;
    }
    if (x->t == JV_LIST && y->t == JV_LIST && x->u.l->kind == JL_LIST && y->u.l->kind == JL_LIST) {
        size_t m = x->u.l->n < y->u.l->n ? x->u.l->n : y->u.l->n;
        for (size_t i = 0; i < m; i++) {
            if (jv_equal(&x->u.l->v[i], &y->u.l->v[i]))
                continue;
            return jv_compare(r, line, &x->u.l->v[i], &y->u.l->v[i]);
        }
        return x->u.l->n < y->u.l->n ? -1 : x->u.l->n > y->u.l->n ? 1 : 0;
    }
    if (x->t == JV_UNDEF)
        jv_fail_undef(r, line, x);
    if (y->t == JV_UNDEF)
        jv_fail_undef(r, line, y);
    jr_fail(r, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(x), jv_type_name(y));
}

/* ---- arithmetic ---- */
static const char *OPNAME[] = {"+", "-", "*", "/", "//", "%", "**"};

static jv concat_str(jrender *r, const jv *x, const jv *y) {
    char *p = ja_alloc(&r->a, x->n + y->n + 1);
    if (x->n)
        memcpy(p, x->u.s, x->n);
    if (y->n)
        memcpy(p + x->n, y->u.s, y->n);
    p[x->n + y->n] = 0;
    return jv_str(p, x->n + y->n);
}

static jv repeat(jrender *r, const jv *s, int64_t k) {
    if (k < 0)
        k = 0;
    if (s->t == JV_STR) {
        jbuf b = {0};
        for (int64_t i = 0; i < k; i++)
            jb_put(&r->a, &b, s->u.s, s->n);
        return jv_str(b.p ? b.p : "", b.n);
    }
    size_t n = s->u.l->n;
    jv out = jv_list(r, n * (size_t)k, s->u.l->tuple);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < n; j++)
            out.u.l->v[(size_t)i * n + j] = s->u.l->v[j];
    return out;
}

jv jv_binop(jrender *r, int line, int op, const jv *x, const jv *y) {
    if (x->t == JV_UNDEF)
        jv_fail_undef(r, line, x);
    if (y->t == JV_UNDEF)
        jv_fail_undef(r, line, y);
    if (is_num(x) && is_num(y)) {
        int fl = x->t == JV_FLOAT || y->t == JV_FLOAT;
        if (op == JOP_DIV || (fl && op != JOP_POW)) {
            double a = num_f(x), b = num_f(y);
            if (b == 0 && (op == JOP_DIV || op == JOP_FLOORDIV || op == JOP_MOD))
                jr_fail(r, line, "division by zero");
            switch (op) {
            case JOP_ADD: return jv_float(a + b);
            case JOP_SUB: return jv_float(a - b);
            case JOP_MUL: return jv_float(a * b);
            case JOP_DIV: return jv_float(a / b);
            case JOP_FLOORDIV: return jv_float(floor(a / b));
            case JOP_MOD: {
                double m = fmod(a, b);
                if (m != 0 && ((m < 0) != (b < 0)))
                    m += b;
                return jv_float(m);
            }
            }
        }
        if (op == JOP_POW) {
            if (!fl && num_i(y) >= 0) {
                int64_t a = num_i(x), e = num_i(y), p = 1;
                while (e-- > 0)
                    if (__builtin_mul_overflow(p, a, &p))
                        jr_fail(r, line, "integer overflow in ** (snug's integers have 64 bits)");
                return jv_int(p);
            }
            return jv_float(pow(num_f(x), num_f(y)));
        }
        int64_t a = num_i(x), b = num_i(y);
        if (b == 0 && (op == JOP_FLOORDIV || op == JOP_MOD))
            jr_fail(r, line, "integer division or modulo by zero");
        int64_t v;
        switch (op) {
        case JOP_ADD:
        case JOP_SUB:
        case JOP_MUL:
            if (op == JOP_ADD ? __builtin_add_overflow(a, b, &v) : op == JOP_SUB ? __builtin_sub_overflow(a, b, &v)
                                                                              : __builtin_mul_overflow(a, b, &v))
                jr_fail(r, line, "integer overflow in %s (snug's integers have 64 bits)", OPNAME[op]);
            return jv_int(v);
        case JOP_FLOORDIV: {
            if (b == -1) {
                if (a == INT64_MIN)
                    jr_fail(r, line, "integer overflow in // (snug's integers have 64 bits)");
                return jv_int(-a);
            }
            int64_t q = a / b;
            if ((a % b != 0) && ((a < 0) != (b < 0)))
                q--;
            return jv_int(q);
        }
        case JOP_MOD: {
            int64_t m = b == -1 ? 0 : a % b;
            if (m != 0 && ((m < 0) != (b < 0)))
                m += b;
            return jv_int(m);
        }
        }
    }
    if (op == JOP_ADD && x->t == JV_STR && y->t == JV_STR) {
        if (x->mk == y->mk) {
            jv out = concat_str(r, x, y);
            out.mk = x->mk;
            return out;
        }
        jv ex = x->mk ? *x : jv_html_escape(r, x), ey = y->mk ? *y : jv_html_escape(r, y);
        jv out = concat_str(r, &ex, &ey);
        out.mk = 1;
        return out;
    }
    if (op == JOP_ADD && x->t == JV_LIST && y->t == JV_LIST && x->u.l->tuple == y->u.l->tuple &&
        x->u.l->kind == JL_LIST && y->u.l->kind == JL_LIST) {
        jv out = jv_list(r, x->u.l->n + y->u.l->n, x->u.l->tuple);
        if (x->u.l->n)
            memcpy(out.u.l->v, x->u.l->v, x->u.l->n * sizeof(jv));
        if (y->u.l->n)
            memcpy(out.u.l->v + x->u.l->n, y->u.l->v, y->u.l->n * sizeof(jv));
        return out;
    }
    if (op == JOP_MUL && (x->t == JV_STR || (x->t == JV_LIST && x->u.l->kind == JL_LIST)) &&
        (y->t == JV_INT || y->t == JV_BOOL)) {
        jv out = repeat(r, x, num_i(y));
        out.mk = x->mk;
        return out;
    }
    if (op == JOP_MUL && (y->t == JV_STR || (y->t == JV_LIST && y->u.l->kind == JL_LIST)) &&
        (x->t == JV_INT || x->t == JV_BOOL)) {
        jv out = repeat(r, y, num_i(x));
        out.mk = y->mk;
        return out;
    }
    if (op == JOP_MOD && x->t == JV_STR) /* a tuple gives the arguments, anything else is the one argument */
        return y->t == JV_LIST && y->u.l->tuple && y->u.l->kind == JL_LIST ? jv_printf(r, line, x, y->u.l->v, y->u.l->n)
                                                                           : jv_printf(r, line, x, y, 1);
    jr_fail(r, line, "unsupported operand type(s) for %s: '%s' and '%s'", OPNAME[op], jv_type_name(x),
            jv_type_name(y));
}

/* ---- containment, iteration ---- */
int jv_contains(jrender *r, int line, const jv *c, const jv *item) {
    switch (c->t) {
    case JV_STR:
        if (item->t != JV_STR)
            jr_fail(r, line, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (item->n == 0)
            return 1;
        for (size_t i = 0; i + item->n <= c->n; i++)
            if (memcmp(c->u.s + i, item->u.s, item->n) == 0)
                return 1;
        return 0;
    case JV_LIST: {
        jlist *l = jv_iter(r, line, c); /* uses up a generator */
        for (size_t i = 0; i < l->n; i++)
            if (jv_equal(&l->v[i], item))
                return 1;
        return 0;
    }
    case JV_DICT:
    case JV_NS: return jd_find(c->u.d, item) != NULL;
    case JV_UNDEF: return 0;
    default: jr_fail(r, line, "argument of type '%s' is not iterable", jv_type_name(c));
    }
}

jlist *jv_iter(jrender *r, int line, const jv *v) {
    switch (v->t) {
    case JV_LIST:
        if (v->u.l->fail)
            jr_fail(r, line, "%s", v->u.l->fail);
        if (v->u.l->kind == JL_GEN || v->u.l->kind == JL_REVITER) {
            if (v->u.l->consumed)
                return jv_list(r, 0, 0).u.l;
            v->u.l->consumed = 1;
        }
        return v->u.l;
    case JV_DICT: {
        jv out = jv_list(r, v->u.d->n, 0);
        for (size_t i = 0; i < v->u.d->n; i++)
            out.u.l->v[i] = v->u.d->k[i];
        return out.u.l;
    }
    case JV_STR: {
        size_t n = ju8_len(v->u.s, v->n);
        jv out = jv_list(r, n, 0);
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            size_t e = at + 1;
            while (e < v->n && ((unsigned char)v->u.s[e] & 0xC0) == 0x80)
                e++;
            out.u.l->v[i] = jv_str(v->u.s + at, e - at);
            at = e;
        }
        return out.u.l;
    }
    case JV_UNDEF: return jv_list(r, 0, 0).u.l;
    default: jr_fail(r, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- lookup ---- */
static jv missing(jrender *r, const jv *obj, const char *what, int is_attr) {
    jbuf b = {0};
    if (is_attr)
        jb_printf(&r->a, &b, "'%s object' has no attribute '%s'", obj->t == JV_DICT ? "dict" : jv_type_name(obj),
                  what);
    else
        jb_printf(&r->a, &b, "'%s object' has no element %s", obj->t == JV_DICT ? "dict" : jv_type_name(obj), what);
    return jv_undef(b.p);
}

static jv loop_attr(jrender *r, const jloop *l, const char *name) {
    int64_t i = (int64_t)l->i, n = (int64_t)l->n;
    if (!strcmp(name, "index")) return jv_int(i + 1);
    if (!strcmp(name, "index0")) return jv_int(i);
    if (!strcmp(name, "revindex")) return jv_int(n - i);
    if (!strcmp(name, "revindex0")) return jv_int(n - i - 1);
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i == n - 1);
    if (!strcmp(name, "length")) return jv_int(n);
    if (!strcmp(name, "depth")) return jv_int(l->depth);
    if (!strcmp(name, "depth0")) return jv_int(l->depth - 1);
    if (!strcmp(name, "previtem")) return i > 0 ? l->items[i - 1] : jv_undef("there is no previous item");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? l->items[i + 1] : jv_undef("there is no next item");
    (void)r;
    return jv_undef("'LoopContext object' has no such attribute");
}

jv jv_getattr(jrender *r, int line, const jv *obj, const char *name) {
    if (obj->t == JV_UNDEF)
        jv_fail_undef(r, line, obj);
    if (name[0] == '_') { /* the sandbox: never an attribute, but a dict's key of that name */
        jv *x = obj->t == JV_DICT && strncmp(name, "__", 2) ? jd_get(obj->u.d, name, strlen(name)) : NULL;
        if (x)
            return *x;
        jbuf b = {0};
        jb_printf(&r->a, &b, "'%s': access to this attribute of a '%s' object is unsafe", name, jv_type_name(obj));
        return jv_undef(b.p);
    }
    if (obj->t == JV_LOOP) {
        if (!strcmp(name, "cycle") || !strcmp(name, "changed")) {
            jmethod *m = ja_alloc(&r->a, sizeof *m);
            m->obj = *obj;
            m->name = name;
            jv v = {JV_METHOD, 0, {.meth = m}, 0};
            return v;
        }
        return loop_attr(r, obj->u.loop, name);
    }
    if (obj->t == JV_NS) {
        jv *x = jd_get(obj->u.d, name, strlen(name));
        return x ? *x : missing(r, obj, name, 1);
    }
    if (jinja_has_method(obj, name)) {
        jmethod *m = ja_alloc(&r->a, sizeof *m);
        m->obj = *obj;
        m->name = name;
        jv v = {JV_METHOD, 0, {.meth = m}, 0};
        return v;
    }
    if (obj->t == JV_DICT) {
        jv *x = jd_get(obj->u.d, name, strlen(name));
        if (x)
            return *x;
    }
    return missing(r, obj, name, 1);
}

static int64_t norm_index(int64_t i, size_t n) {
    return i < 0 ? i + (int64_t)n : i;
}

jv jv_getitem(jrender *r, int line, const jv *obj, const jv *key) {
    if (obj->t == JV_UNDEF)
        jv_fail_undef(r, line, obj);
    if (obj->t == JV_DICT || obj->t == JV_NS) {
        jv *x = jd_find(obj->u.d, key);
        if (x)
            return *x;
    } else if (((obj->t == JV_LIST && (obj->u.l->kind == JL_LIST || obj->u.l->kind == JL_RANGE)) ||
                obj->t == JV_STR) &&
               (key->t == JV_INT || key->t == JV_BOOL)) {
        int64_t k = key->t == JV_INT ? key->u.i : key->u.b;
        if (obj->t == JV_LIST) {
            int64_t i = norm_index(k, obj->u.l->n);
            if (i >= 0 && i < (int64_t)obj->u.l->n)
                return obj->u.l->v[i];
        } else {
            size_t n = ju8_len(obj->u.s, obj->n);
            int64_t i = norm_index(k, n);
            if (i >= 0 && i < (int64_t)n) {
                size_t b = ju8_offset(obj->u.s, obj->n, (size_t)i), e = ju8_offset(obj->u.s, obj->n, (size_t)i + 1);
                return jv_str(obj->u.s + b, e - b);
            }
        }
    } else if (obj->t == JV_LOOP && key->t == JV_STR) {
        return loop_attr(r, obj->u.loop, ja_strdup(&r->a, key->u.s, key->n));
    }
    if (key->t == JV_STR) { /* Jinja2 falls back to the attribute */
        char *name = ja_strdup(&r->a, key->u.s, key->n);
        if (name[0] != '_' && (obj->t != JV_DICT || jinja_has_method(obj, name)))
            return jv_getattr(r, line, obj, name);
    }
    jbuf b = {0};
    jv_repr_into(r, &b, key);
    return missing(r, obj, b.p ? b.p : "", 0);
}

/* An argument that must be an integer (a bool counts, as in Python): def when absent or none; else a render error
 * naming `what`. */
int64_t jv_int_arg(jrender *r, int line, const jv *v, int64_t def, const char *what) {
    if (!v || v->t == JV_NONE)
        return def;
    if (v->t == JV_INT)
        return v->u.i;
    if (v->t == JV_BOOL)
        return v->u.b;
    jr_fail(r, line, "%s must be an integer, not %s", what, jv_type_name(v));
}

/* ---- errors: a compile or render stops here, its message kept in the snug_error, by a longjmp to its entry ---- */

void jc_fail(jcompiler *c, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snug_fail(c->e, SNUG_EINPUT, "%s, line %d: %s", c->name, line, msg);
    longjmp(c->jmp, 1);
}

void jr_fail(jrender *r, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snug_fail(r->e, SNUG_EINPUT, "%s, line %d: %s", r->t->name, line, msg);
    longjmp(r->jmp, 1);
}
