/* jinja_eval.c: compiling and rendering a template (the entry points of jinja.h) and the evaluator of its syntax
 * tree.
 *
 * Scopes follow Jinja2's: the globals (raise_exception, strftime_now, namespace, dict, range), then the render's
 * variables, where top-level {% set %} also writes; each for-loop iteration, macro call and {% with %} opens a scope
 * of its own, so a {% set %} inside a loop is gone after the iteration (namespaces exist for that); {% if %} opens
 * none. A {% generation %} block records the span its output takes in the top-level output, measured, as
 * transformers' AssistantTracker measures it, from the top-level output rendered so far. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/jinja_impl.h"

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static jscope *scope_new(jrender *r, jscope *parent) {
    jscope *s = ja_alloc(&r->a, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static jv lookup(const jscope *s, const char *name) {
    size_t n = strlen(name);
    for (; s; s = s->parent) {
        jv *v = jd_get(&s->vars, name, n);
        if (v)
            return *v;
    }
    return jv_undef(name);
}

static void bind(jrender *r, jscope *s, const char *name, jv v) {
    jd_set(r, &s->vars, jv_str(name, strlen(name)), v);
}

static jv eval(jrender *r, jscope *s, const jnode *n);
static int exec(jrender *r, jscope *s, const jnode *n, jbuf *out);

/* ---- calls ---- */
typedef struct jargs {
    jv *pos;
    size_t npos;
    const char **kwn;
    jv *kwv;
    size_t nkw;
} jargs;

static jargs eval_args(jrender *r, jscope *s, const jnode *n) {
    jargs a = {0};
    a.npos = n->nargs;
    a.nkw = n->nkw;
    a.pos = n->nargs ? ja_alloc(&r->a, n->nargs * sizeof(jv)) : NULL;
    a.kwv = n->nkw ? ja_alloc(&r->a, n->nkw * sizeof(jv)) : NULL;
    a.kwn = n->kwn;
    for (size_t i = 0; i < n->nargs; i++)
        a.pos[i] = eval(r, s, n->args[i]);
    for (size_t i = 0; i < n->nkw; i++)
        a.kwv[i] = eval(r, s, n->kwv[i]);
    return a;
}

static jv call_macro(jrender *r, int line, const jmacro *m, const jargs *a, const jv *caller) {
    const jnode *def = m->def;
    const char *mname = def->kind == JN_MACRO ? def->name : "caller";
    if (++r->depth > 200)
        jr_fail(r, line, "macro '%s' nested too deeply (recursion?)", mname);
    jscope *s = scope_new(r, m->closure);
    if (a->npos > def->nkw)
        jr_fail(r, line, "macro '%s' takes not more than %zu argument(s), got %zu", mname, def->nkw, a->npos);
    for (size_t i = 0; i < def->nkw; i++) {
        const char *p = def->kwn[i];
        int set = 0;
        if (i < a->npos) {
            bind(r, s, p, a->pos[i]);
            set = 1;
        }
        for (size_t k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwn[k], p)) {
                if (set)
                    jr_fail(r, line, "macro '%s' got multiple values for argument '%s'", mname, p);
                bind(r, s, p, a->kwv[k]);
                set = 1;
            }
        if (!set)
            bind(r, s, p, def->kwv[i] ? eval(r, s, def->kwv[i]) : jv_undef(p));
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < def->nkw && strcmp(a->kwn[k], def->kwn[i]))
            i++;
        if (i == def->nkw)
            jr_fail(r, line, "macro '%s' takes no keyword argument '%s'", mname, a->kwn[k]);
    }
    if (caller && !def->op)
        jr_fail(r, line, "{%% call %%} of macro '%s', which never calls caller()", mname);
    if (caller)
        bind(r, s, "caller", *caller);
    jbuf b = {0};
    exec(r, s, def->b, &b);
    r->depth--;
    return jv_str(b.p ? b.p : "", b.n);
}

static jv call_value(jrender *r, int line, const jv *f, const jargs *a, const jv *caller) {
    switch (f->t) {
    case JV_MACRO: return call_macro(r, line, f->u.m, a, caller);
    case JV_FUNC: return jinja_call_func(r, line, f->u.fn, a->pos, a->npos, a->kwn, a->kwv, a->nkw);
    case JV_METHOD: {
        const jmethod *m = f->u.meth;
        if (m->obj.t == JV_LOOP) {
            if (strcmp(m->name, "cycle"))
                jr_fail(r, line, "loop.%s() is not supported", m->name);
            if (!a->npos)
                jr_fail(r, line, "loop.cycle() needs at least one argument");
            return a->pos[m->obj.u.loop->i % a->npos];
        }
        return jinja_method(r, line, &m->obj, m->name, a->pos, a->npos, a->kwn, a->kwv, a->nkw);
    }
    case JV_UNDEF: jv_fail_undef(r, line, f);
    default: jr_fail(r, line, "'%s' object is not callable", jv_type_name(f));
    }
}

/* A filter chain whose innermost operand is NULL applied to v (filter blocks, block set). */
static void check_known(jrender *r, const jnode *n) {
    if (n->unknown)
        jr_fail(r, n->line, "no %s named '%s'", n->kind == JN_FILTER ? "filter" : "test", n->name);
}

static jv apply_filters(jrender *r, jscope *s, const jnode *f, jv v) {
    if (!f)
        return v;
    check_known(r, f);
    jv in = f->a ? apply_filters(r, s, f->a, v) : v;
    jargs a = eval_args(r, s, f);
    return jinja_filter(r, f->line, f->name, in, a.pos, a.npos, a.kwn, a.kwv, a.nkw);
}

static jv slice(jrender *r, int line, const jv *obj, const jv *b, const jv *e, const jv *st) {
    if (obj->t == JV_UNDEF)
        jv_fail_undef(r, line, obj);
    /* Jinja2 slices with Python's own subscript (not its lenient getitem): the rest is a TypeError */
    if ((obj->t == JV_LIST && obj->u.l->kind != JL_LIST && obj->u.l->kind != JL_RANGE) ||
        (obj->t != JV_LIST && obj->t != JV_STR))
        jr_fail(r, line, "'%s' object is not subscriptable with a slice", jv_type_name(obj));
    for (const jv *x = b; x; x = x == b ? e : x == e ? st : NULL)
        if (x->t != JV_NONE && x->t != JV_INT && x->t != JV_BOOL)
            jr_fail(r, line, "slice indices must be integers or None, got %s", jv_type_name(x));
    int64_t n = obj->t == JV_LIST ? (int64_t)obj->u.l->n : (int64_t)ju8_len(obj->u.s, obj->n);
    int64_t step = st->t == JV_NONE ? 1 : st->t == JV_INT ? st->u.i : st->u.b;
    if (step == 0)
        jr_fail(r, line, "slice step cannot be zero");
    int64_t lo, hi;
    /* Python's PySlice_AdjustIndices */
    int64_t start, stop;
    if (b->t == JV_NONE) {
        start = step < 0 ? n - 1 : 0;
    } else {
        start = b->t == JV_INT ? b->u.i : b->u.b;
        if (start < 0) {
            start += n;
            if (start < 0)
                start = step < 0 ? -1 : 0;
        } else if (start >= n) {
            start = step < 0 ? n - 1 : n;
        }
    }
    if (e->t == JV_NONE) {
        stop = step < 0 ? -1 : n;
    } else {
        stop = e->t == JV_INT ? e->u.i : e->u.b;
        if (stop < 0) {
            stop += n;
            if (stop < 0)
                stop = step < 0 ? -1 : 0;
        } else if (stop >= n) {
            stop = step < 0 ? n - 1 : n;
        }
    }
    int64_t cnt = 0;
    if (step > 0 && start < stop)
        cnt = (stop - start - 1) / step + 1;
    else if (step < 0 && stop < start)
        cnt = (start - stop - 1) / (-step) + 1;
    (void)lo;
    (void)hi;
    if (obj->t == JV_LIST) {
        jv out = jv_list(r, (size_t)cnt, obj->u.l->tuple); /* a range's slice is a range: printed differently */
        for (int64_t i = 0; i < cnt; i++)
            out.u.l->v[i] = obj->u.l->v[start + i * step];
        return out;
    }
    jbuf o = {0};
    for (int64_t i = 0; i < cnt; i++) {
        size_t cp = (size_t)(start + i * step);
        size_t bo = ju8_offset(obj->u.s, obj->n, cp), eo = ju8_offset(obj->u.s, obj->n, cp + 1);
        jb_put(&r->a, &o, obj->u.s + bo, eo - bo);
    }
    return jv_str(o.p ? o.p : "", o.n);
}

static jv eval_compare(jrender *r, jscope *s, const jnode *n) {
    jv left = eval(r, s, n->a);
    for (size_t i = 0; i < n->nargs; i++) {
        jv right = eval(r, s, n->args[i]);
        int ok;
        switch (n->ops[i]) {
        case JOP_EQ: ok = jv_equal(&left, &right); break;
        case JOP_NE: ok = !jv_equal(&left, &right); break;
        case JOP_LT: ok = jv_compare(r, n->line, &left, &right) < 0; break;
        case JOP_LE: ok = jv_compare(r, n->line, &left, &right) <= 0; break;
        case JOP_GT: ok = jv_compare(r, n->line, &left, &right) > 0; break;
        case JOP_GE: ok = jv_compare(r, n->line, &left, &right) >= 0; break;
        case JOP_IN: ok = jv_contains(r, n->line, &right, &left); break;
        default: ok = !jv_contains(r, n->line, &right, &left); break;
        }
        if (!ok)
            return jv_bool(0);
        left = right;
    }
    return jv_bool(1);
}

static jv eval(jrender *r, jscope *s, const jnode *n) {
    switch (n->kind) {
    case JN_CONST: return n->val;
    case JN_NAME: return lookup(s, n->name);
    case JN_LIST:
    case JN_TUPLE: {
        jv out = jv_list(r, n->nargs, n->kind == JN_TUPLE);
        for (size_t i = 0; i < n->nargs; i++)
            out.u.l->v[i] = eval(r, s, n->args[i]);
        return out;
    }
    case JN_DICT: {
        jdict *d = jd_new(r, n->nargs);
        for (size_t i = 0; i < n->nargs; i++)
            jd_set(r, d, eval(r, s, n->args[i]), eval(r, s, n->kwv[i]));
        jv v = {JV_DICT, 0, {.d = d}, 0};
        return v;
    }
    case JN_ATTR: {
        jv o = eval(r, s, n->a);
        return jv_getattr(r, n->line, &o, n->name);
    }
    case JN_ITEM: {
        jv o = eval(r, s, n->a), k = eval(r, s, n->b);
        return jv_getitem(r, n->line, &o, &k);
    }
    case JN_SLICE: {
        jv o = eval(r, s, n->a), none = jv_none();
        jv b = n->b ? eval(r, s, n->b) : none, e = n->c ? eval(r, s, n->c) : none, st = n->d ? eval(r, s, n->d) : none;
        return slice(r, n->line, &o, &b, &e, &st);
    }
    case JN_CALL: {
        jv f = eval(r, s, n->a);
        jargs a = eval_args(r, s, n);
        return call_value(r, n->line, &f, &a, NULL);
    }
    case JN_FILTER: {
        jv v = eval(r, s, n->a);
        check_known(r, n);
        jargs a = eval_args(r, s, n);
        return jinja_filter(r, n->line, n->name, v, a.pos, a.npos, a.kwn, a.kwv, a.nkw);
    }
    case JN_TEST: {
        jv v = eval(r, s, n->a);
        check_known(r, n);
        jargs a = eval_args(r, s, n);
        int ok = jinja_test(r, n->line, n->name, &v, a.pos, a.npos);
        return jv_bool(n->op ? !ok : ok);
    }
    case JN_NEG:
    case JN_POS: {
        jv v = eval(r, s, n->a);
        if (v.t == JV_INT || v.t == JV_BOOL)
            return jv_int(n->kind == JN_NEG ? -(v.t == JV_INT ? v.u.i : v.u.b) : (v.t == JV_INT ? v.u.i : v.u.b));
        if (v.t == JV_FLOAT)
            return jv_float(n->kind == JN_NEG ? -v.u.f : v.u.f);
        if (v.t == JV_UNDEF)
            jv_fail_undef(r, n->line, &v);
        jr_fail(r, n->line, "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+', jv_type_name(&v));
    }
    case JN_NOT: {
        jv v = eval(r, s, n->a);
        return jv_bool(!jv_truthy(&v));
    }
    case JN_AND: {
        jv v = eval(r, s, n->a);
        return jv_truthy(&v) ? eval(r, s, n->b) : v;
    }
    case JN_OR: {
        jv v = eval(r, s, n->a);
        return jv_truthy(&v) ? v : eval(r, s, n->b);
    }
    case JN_BINOP: {
        jv x = eval(r, s, n->a), y = eval(r, s, n->b);
        return jv_binop(r, n->line, n->op, &x, &y);
    }
    case JN_CONCAT: {
        jbuf b = {0};
        for (size_t i = 0; i < n->nargs; i++) {
            jv v = eval(r, s, n->args[i]);
            jv_str_into(r, &b, &v);
        }
        return jv_str(b.p ? b.p : "", b.n);
    }
    case JN_COMPARE: return eval_compare(r, s, n);
    case JN_COND: {
        jv c = eval(r, s, n->a);
        if (jv_truthy(&c))
            return eval(r, s, n->b);
        return n->c ? eval(r, s, n->c) : jv_undef("the inline if's missing else");
    }
    default: jr_fail(r, n->line, "internal: statement node %d evaluated as an expression", n->kind);
    }
}

/* ---- statements ---- */

static void assign(jrender *r, jscope *s, const jnode *target, jv v, int line) {
    if (target->kind == JN_NAME) {
        bind(r, s, target->name, v);
        return;
    }
    if (target->kind == JN_ATTR) {
        jv ns = lookup(s, target->a->name);
        if (ns.t != JV_NS)
            jr_fail(r, line, "cannot assign attribute '%s' on '%s': only a namespace() takes {%% set x.attr %%}",
                    target->name, target->a->name);
        if (target->name[0] == '_')
            jr_fail(r, line, "namespace attributes cannot start with '_' ('%s')", target->name);
        jd_set(r, ns.u.d, jv_str(target->name, strlen(target->name)), v);
        return;
    }
    /* tuple */
    jlist *items = jv_iter(r, line, &v);
    if (items->n != target->nargs)
        jr_fail(r, line, "cannot unpack %zu value(s) into %zu name(s)", items->n, target->nargs);
    for (size_t i = 0; i < target->nargs; i++)
        assign(r, s, target->args[i], items->v[i], line);
}

static int exec_for(jrender *r, jscope *s, const jnode *n, jbuf *out) {
    jv it = eval(r, s, n->b);
    jlist *items = jv_iter(r, n->line, &it);
    if (n->c) { /* the loop filter runs before the loop, so loop.length counts what it keeps */
        jv kept = jv_list(r, items->n, 0);
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            jscope *fs = scope_new(r, s);
            assign(r, fs, n->a, items->v[i], n->line);
            jv c = eval(r, fs, n->c);
            if (jv_truthy(&c))
                kept.u.l->v[k++] = items->v[i];
        }
        kept.u.l->n = k;
        items = kept.u.l;
    }
    jloop *l = ja_alloc(&r->a, sizeof *l);
    l->items = items->v;
    l->n = items->n;
    l->depth = 1;
    jv lv = {JV_LOOP, 0, {.loop = l}, 0};
    for (size_t i = 0; i < items->n; i++) {
        l->i = i;
        jscope *is = scope_new(r, s);
        bind(r, is, "loop", lv);
        assign(r, is, n->a, items->v[i], n->line);
        int f = exec(r, is, n->d, out);
        if (f == FLOW_BREAK)
            break;
    }
    if (!items->n && n->nargs)
        return exec(r, scope_new(r, s), n->args[0], out);
    return FLOW_NORMAL;
}

static int exec(jrender *r, jscope *s, const jnode *n, jbuf *out) {
    r->line = n->line;
    switch (n->kind) {
    case JN_BODY:
        for (size_t i = 0; i < n->nargs; i++) {
            int f = exec(r, s, n->args[i], out);
            if (f != FLOW_NORMAL)
                return f;
        }
        return FLOW_NORMAL;
    case JN_TEXT: jb_put(&r->a, out, n->val.u.s, n->val.n); return FLOW_NORMAL;
    case JN_OUTPUT: {
        jv v = eval(r, s, n->a);
        jv_str_into(r, out, &v);
        return FLOW_NORMAL;
    }
    case JN_IF:
        for (const jnode *k = n; k; k = k->c) {
            if (k->kind == JN_BODY)
                return exec(r, s, k, out);
            jv c = eval(r, s, k->a);
            if (jv_truthy(&c))
                return exec(r, s, k->b, out);
        }
        return FLOW_NORMAL;
    case JN_FOR: return exec_for(r, s, n, out);
    case JN_SET: assign(r, s, n->a, eval(r, s, n->b), n->line); return FLOW_NORMAL;
    case JN_SETBLOCK: { /* a break or continue inside leaves before the assignment, as in Jinja2 */
        jbuf b = {0};
        int f = exec(r, scope_new(r, s), n->b, &b);
        if (f != FLOW_NORMAL)
            return f;
        assign(r, s, n->a, apply_filters(r, s, n->c, jv_str(b.p ? b.p : "", b.n)), n->line);
        return FLOW_NORMAL;
    }
    case JN_MACRO: {
        jmacro *m = ja_alloc(&r->a, sizeof *m);
        m->def = n;
        m->closure = s;
        jv v = {JV_MACRO, 0, {.m = m}, 0};
        bind(r, s, n->name, v);
        return FLOW_NORMAL;
    }
    case JN_CALLBLOCK: {
        jmacro *m = ja_alloc(&r->a, sizeof *m);
        m->def = n;
        m->closure = s;
        jv caller = {JV_MACRO, 0, {.m = m}, 0};
        jv f = eval(r, s, n->a->a);
        jargs a = eval_args(r, s, n->a);
        jv v = call_value(r, n->line, &f, &a, &caller);
        jv_str_into(r, out, &v);
        return FLOW_NORMAL;
    }
    case JN_FILTERBLOCK: {
        jbuf b = {0};
        int f = exec(r, scope_new(r, s), n->b, &b);
        if (f != FLOW_NORMAL)
            return f;
        jv v = apply_filters(r, s, n->c, jv_str(b.p ? b.p : "", b.n));
        jv_str_into(r, out, &v);
        return FLOW_NORMAL;
    }
    case JN_WITH: {
        jscope *w = scope_new(r, s);
        for (size_t i = 0; i < n->nkw; i++)
            bind(r, w, n->kwn[i], eval(r, s, n->kwv[i]));
        return exec(r, w, n->b, out);
    }
    case JN_GENERATION: {
        /* transformers' indices: in characters, from the top-level text so far, as long as the block's output
         * (made bytes at the end, against the final text; they only tell where the output lands when the block is
         * not nested in a macro, block set, filter block or other generation block) */
        jbuf b = {0};
        exec(r, scope_new(r, s), n->b, &b);
        size_t start = ju8_len(r->root->p, r->root->n);
        if (r->nspans == r->spancap) {
            size_t cap = r->spancap ? 2 * r->spancap : 16;
            snug_jinja_span *sp = ja_alloc(&r->a, cap * sizeof *sp);
            if (r->nspans)
                memcpy(sp, r->spans, r->nspans * sizeof *sp);
            r->spans = sp;
            r->spancap = cap;
        }
        r->spans[r->nspans].begin = start;
        r->spans[r->nspans++].end = start + ju8_len(b.p, b.n);
        jb_put(&r->a, out, b.p ? b.p : "", b.n);
        return FLOW_NORMAL;
    }
    case JN_BREAK: return FLOW_BREAK;
    case JN_CONTINUE: return FLOW_CONTINUE;
    default: jr_fail(r, n->line, "internal: expression node %d executed as a statement", n->kind);
    }
}

/* ---- global functions ---- */
jv jinja_call_func(jrender *r, int line, int fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw) {
    switch (fn) {
    case JF_RAISE: {
        jv msg = nargs ? jv_to_str(r, &args[0]) : jv_str("", 0);
        snug_fail(r->e, SNUG_EINPUT, "%s, line %d: the template raised an error: %.*s", r->t->name, line,
                  (int)msg.n, msg.u.s);
        longjmp(r->jmp, 1);
    }
    case JF_STRFTIME: {
        if (nargs != 1 || args[0].t != JV_STR)
            jr_fail(r, line, "strftime_now(format) takes one string");
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)args[0].n, args[0].u.s);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(buf, sizeof buf, fmt, &tm);
        return jv_str(ja_strdup(&r->a, buf, k), k);
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        jdict *d = jd_new(r, nkw + 4);
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].t != JV_DICT && args[i].t != JV_NS)
                jr_fail(r, line, "%s() takes a mapping as positional argument, got %s",
                        fn == JF_DICT ? "dict" : "namespace", jv_type_name(&args[i]));
            for (size_t k = 0; k < args[i].u.d->n; k++)
                jd_set(r, d, args[i].u.d->k[k], args[i].u.d->v[k]);
        }
        for (size_t i = 0; i < nkw; i++)
            jd_set(r, d, jv_str(kwn[i], strlen(kwn[i])), kwv[i]);
        jv v = {fn == JF_DICT ? JV_DICT : JV_NS, 0, {.d = d}, 0};
        return v;
    }
    case JF_RANGE: {
        int64_t a[3] = {0, 0, 1};
        if (nargs < 1 || nargs > 3 || nkw)
            jr_fail(r, line, "range() takes 1 to 3 integers");
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].t != JV_INT && args[i].t != JV_BOOL)
                jr_fail(r, line, "range() takes integers, got %s", jv_type_name(&args[i]));
            a[nargs == 1 ? 1 : i] = args[i].t == JV_INT ? args[i].u.i : args[i].u.b;
        }
        if (a[2] == 0)
            jr_fail(r, line, "range() arg 3 must not be zero");
        int64_t cnt = 0;
        if (a[2] > 0 && a[0] < a[1])
            cnt = (a[1] - a[0] - 1) / a[2] + 1;
        else if (a[2] < 0 && a[1] < a[0])
            cnt = (a[0] - a[1] - 1) / (-a[2]) + 1;
        if (cnt > 100000)
            jr_fail(r, line, "range() too big: %lld items (the sandbox allows 100000)", (long long)cnt);
        jv out = jv_seq(r, (size_t)cnt, JL_RANGE);
        for (int64_t i = 0; i < cnt; i++)
            out.u.l->v[i] = jv_int(a[0] + i * a[2]);
        memcpy(out.u.l->range, a, sizeof a);
        return out;
    }
    }
    jr_fail(r, line, "internal: unknown function %d", fn);
}

/* ---- entry points ---- */
int snug_jinja_compile(const char *src, size_t n, const char *name, snug_jinja **out, snug_error *e) {
    *out = NULL;
    snug_jinja *t = calloc(1, sizeof *t);
    jcompiler *c = calloc(1, sizeof *c);
    if (!t || !c) {
        free(t);
        free(c);
        return snug_fail(e, SNUG_ENOMEM, "out of memory compiling a chat template");
    }
    c->e = e ? e : &c->own;
    t->arena.oom = &c->jmp;
    t->arena.e = c->e;
    c->a = &t->arena;
    if (setjmp(c->jmp)) {
        int code = c->e->code ? c->e->code : SNUG_EINTERNAL;
        ja_free(&t->arena);
        free(t->name);
        free(t);
        free(c);
        return code;
    }
    t->name = strdup(name ? name : "chat template");
    if (!t->name)
        jc_fail(c, 0, "out of memory");
    c->name = t->name;
    jinja_lex(c, src, n);
    t->root = jinja_parse(c);
    t->arena.oom = NULL;
    t->arena.e = NULL;
    free(c);
    *out = t;
    return 0;
}

int snug_jinja_render(const snug_jinja *t, const json_t *vars, snug_jinja_out *out, snug_error *e) {
    memset(out, 0, sizeof *out);
    if (vars && !json_is_object(vars))
        return snug_fail(e, SNUG_EINPUT, "%s: the variables to render with must be a JSON object", t->name);
    jrender *r = calloc(1, sizeof *r);
    if (!r)
        return snug_fail(e, SNUG_ENOMEM, "out of memory rendering %s", t->name);
    r->t = t;
    r->e = e ? e : &r->own;
    r->a.oom = &r->jmp;
    r->a.e = r->e;
    if (setjmp(r->jmp)) {
        int code = r->e->code ? r->e->code : SNUG_EINTERNAL;
        free(out->text);
        memset(out, 0, sizeof *out);
        ja_free(&r->a);
        free(r);
        return code;
    }
    jscope *g = scope_new(r, NULL);
    static const struct {
        const char *name;
        int fn;
    } funcs[] = {{"raise_exception", JF_RAISE}, {"strftime_now", JF_STRFTIME}, {"namespace", JF_NAMESPACE},
                 {"dict", JF_DICT},         {"range", JF_RANGE}};
    for (size_t i = 0; i < sizeof funcs / sizeof *funcs; i++) {
        jv f = {JV_FUNC, 0, {.fn = funcs[i].fn}, 0};
        bind(r, g, funcs[i].name, f);
    }
    jscope *top = scope_new(r, g);
    if (vars) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)vars, k, x)
            bind(r, top, k, jv_from_json(r, x));
    }
    r->globals = g;
    jbuf root = {0};
    r->root = &root;
    exec(r, top, t->root, &root);
    out->text = malloc(root.n + 1);
    out->spans = r->nspans ? malloc(r->nspans * sizeof *out->spans) : NULL;
    if (!out->text || (r->nspans && !out->spans)) {
        free(out->spans);
        out->spans = NULL;
        snug_fail(r->e, SNUG_ENOMEM, "out of memory rendering %s", t->name);
        longjmp(r->jmp, 1);
    }
    if (root.n)
        memcpy(out->text, root.p, root.n);
    out->text[root.n] = 0;
    out->len = root.n;
    for (size_t i = 0; i < r->nspans; i++) { /* characters to bytes */
        out->spans[i].begin = ju8_offset(root.p, root.n, r->spans[i].begin);
        out->spans[i].end = ju8_offset(root.p, root.n, r->spans[i].end);
    }
    out->nspans = r->nspans;
    ja_free(&r->a);
    free(r);
    return 0;
}

static int has_generation(const jnode *n) {
    if (!n)
        return 0;
    if (n->kind == JN_GENERATION)
        return 1;
    if (has_generation(n->a) || has_generation(n->b) || has_generation(n->c) || has_generation(n->d))
        return 1;
    for (size_t i = 0; i < n->nargs; i++)
        if (has_generation(n->args[i]))
            return 1;
    return 0;
}

int snug_jinja_has_generation(const snug_jinja *t) {
    return t && has_generation(t->root);
}

void snug_jinja_out_free(snug_jinja_out *o) {
    if (!o)
        return;
    free(o->text);
    free(o->spans);
    memset(o, 0, sizeof *o);
}

void snug_jinja_free(snug_jinja *t) {
    if (!t)
        return;
    ja_free(&t->arena);
    free(t->name);
    free(t);
}
