/* jinja_parse.c: tokens into a syntax tree, with Jinja2's grammar and operator precedence.
 *
 * Precedence, loosest first: `x if c else y`, or, and, not, comparisons (== != < <= > >= in, not in; chained),
 * + -, ~, * / // %, **, unary - +, then primaries with their postfix .attr [item] (call) and filters/tests
 * (`|f`, `is t`), which bind tighter than every binary operator (`a + b|length` is `a + (b|length)`). Unknown filters
 * and tests fail here, as Jinja2 fails them when it compiles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_impl.h"

static jtok *cur(jcompiler *c) {
    return &c->toks[c->pos];
}
static jtok *next(jcompiler *c) {
    jtok *t = &c->toks[c->pos];
    if (t->type != JT_EOF)
        c->pos++;
    return t;
}
static int is_op(jcompiler *c, const char *op) {
    jtok *t = cur(c);
    return t->type == JT_OP && strcmp(t->s, op) == 0;
}
static int is_name(jcompiler *c, const char *name) {
    jtok *t = cur(c);
    return t->type == JT_NAME && strcmp(t->s, name) == 0;
}
static int is_name_at(jcompiler *c, size_t k, const char *name) {
    if (c->pos + k >= c->ntok)
        return 0;
    jtok *t = &c->toks[c->pos + k];
    return t->type == JT_NAME && strcmp(t->s, name) == 0;
}
static const char *describe(jtok *t) {
    switch (t->type) {
    case JT_EOF: return "the end of the template";
    case JT_TEXT: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_STRING: return "a string";
    case JT_INT: return "an integer";
    case JT_FLOAT: return "a number";
    default: return t->s;
    }
}
static void expect_op(jcompiler *c, const char *op) {
    if (!is_op(c, op))
        jc_fail(c, cur(c)->line, "expected '%s', got %s", op, describe(cur(c)));
    next(c);
}
static const char *expect_name(jcompiler *c) {
    if (cur(c)->type != JT_NAME)
        jc_fail(c, cur(c)->line, "expected a name, got %s", describe(cur(c)));
    return next(c)->s;
}
static void expect_type(jcompiler *c, int type, const char *what) {
    if (cur(c)->type != type)
        jc_fail(c, cur(c)->line, "expected %s, got %s", what, describe(cur(c)));
    next(c);
}

static jnode *node(jcompiler *c, int kind, int line) {
    jnode *n = ja_alloc(c->a, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

/* a growable list of nodes, copied into the arena when done */
typedef struct nlist {
    jnode **v;
    const char **names;
    size_t n, cap;
} nlist;
static void nl_push(jcompiler *c, nlist *l, jnode *x, const char *name) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        jnode **v = ja_alloc(c->a, cap * sizeof *v);
        const char **nm = ja_alloc(c->a, cap * sizeof *nm);
        if (l->n) {
            memcpy(v, l->v, l->n * sizeof *v);
            memcpy(nm, l->names, l->n * sizeof *nm);
        }
        l->v = v;
        l->names = nm;
        l->cap = cap;
    }
    l->v[l->n] = x;
    l->names[l->n++] = name;
}

static jnode *parse_expr(jcompiler *c);
static jnode *parse_or(jcompiler *c);
static jnode *parse_unary(jcompiler *c, int with_filter);
static jnode *parse_primary(jcompiler *c);
static jnode *parse_postfix(jcompiler *c, jnode *n);

/* (args, name=value) after '(' has been seen; fills n's args and kwargs */
static void parse_call_args(jcompiler *c, jnode *n) {
    expect_op(c, "(");
    nlist pos = {0}, kw = {0};
    while (!is_op(c, ")")) {
        if (pos.n + kw.n)
            expect_op(c, ",");
        if (is_op(c, ")"))
            break;
        if (is_op(c, "*") || is_op(c, "**"))
            jc_fail(c, cur(c)->line, "*args and **kwargs in calls are not supported");
        if (cur(c)->type == JT_NAME && c->pos + 1 < c->ntok && c->toks[c->pos + 1].type == JT_OP &&
            strcmp(c->toks[c->pos + 1].s, "=") == 0) {
            const char *name = next(c)->s;
            next(c);
            nl_push(c, &kw, parse_expr(c), name);
        } else {
            if (kw.n)
                jc_fail(c, cur(c)->line, "a positional argument after a keyword argument");
            nl_push(c, &pos, parse_expr(c), NULL);
        }
    }
    next(c);
    n->args = pos.v;
    n->nargs = pos.n;
    n->kwv = kw.v;
    n->kwn = kw.names;
    n->nkw = kw.n;
}

/* a tuple of expressions, or one expression when there is no comma; simplified: names only for assignment targets */
static jnode *parse_tuple(jcompiler *c, int simplified, int explicit_parens, int with_condexpr) {
    int line = cur(c)->line;
    nlist l = {0};
    int comma = 0;
    for (;;) {
        if (l.n)
            expect_op(c, ",");
        if (is_op(c, ")") || is_op(c, "]") || is_op(c, "}") || cur(c)->type == JT_BLOCK_END ||
            cur(c)->type == JT_VAR_END || is_op(c, "=") || is_name(c, "in") || is_name(c, "recursive"))
            break;
        jnode *x;
        if (simplified) {
            jnode *nm = node(c, JN_NAME, cur(c)->line);
            nm->name = expect_name(c);
            x = nm;
        } else {
            x = with_condexpr ? parse_expr(c) : parse_or(c);
        }
        nl_push(c, &l, x, NULL);
        if (is_op(c, ","))
            comma = 1;
        else
            break;
    }
    if (!comma) {
        if (l.n == 1)
            return l.v[0];
        if (!explicit_parens)
            jc_fail(c, line, "expected an expression, got %s", describe(cur(c)));
    }
    jnode *t = node(c, JN_TUPLE, line);
    t->args = l.v;
    t->nargs = l.n;
    return t;
}

static jnode *parse_primary(jcompiler *c) {
    jtok *t = cur(c);
    jnode *n;
    switch (t->type) {
    case JT_NAME:
        next(c);
        n = node(c, JN_CONST, t->line);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True"))
            n->val = jv_bool(1);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False"))
            n->val = jv_bool(0);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None"))
            n->val = jv_none();
        else {
            n->kind = JN_NAME;
            n->name = t->s;
        }
        return n;
    case JT_STRING: {
        next(c);
        n = node(c, JN_CONST, t->line);
        const char *s = t->s;
        size_t len = t->n;
        while (cur(c)->type == JT_STRING) { /* adjacent literals join */
            jtok *u = next(c);
            char *j = ja_alloc(c->a, len + u->n + 1);
            memcpy(j, s, len);
            memcpy(j + len, u->s, u->n + 1);
            s = j;
            len += u->n;
        }
        n->val = jv_str(s, len);
        return n;
    }
    case JT_INT:
    case JT_FLOAT:
        next(c);
        n = node(c, JN_CONST, t->line);
        n->val = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    case JT_OP:
        if (!strcmp(t->s, "(")) {
            next(c);
            n = parse_tuple(c, 0, 1, 1);
            expect_op(c, ")");
            return n;
        }
        if (!strcmp(t->s, "[")) {
            next(c);
            n = node(c, JN_LIST, t->line);
            nlist l = {0};
            while (!is_op(c, "]")) {
                if (l.n)
                    expect_op(c, ",");
                if (is_op(c, "]"))
                    break;
                nl_push(c, &l, parse_expr(c), NULL);
            }
            next(c);
            n->args = l.v;
            n->nargs = l.n;
            return n;
        }
        if (!strcmp(t->s, "{")) {
            next(c);
            n = node(c, JN_DICT, t->line);
            nlist k = {0}, v = {0};
            while (!is_op(c, "}")) {
                if (k.n)
                    expect_op(c, ",");
                if (is_op(c, "}"))
                    break;
                nl_push(c, &k, parse_expr(c), NULL);
                expect_op(c, ":");
                nl_push(c, &v, parse_expr(c), NULL);
            }
            next(c);
            n->args = k.v;
            n->nargs = k.n;
            n->kwv = v.v;
            n->nkw = v.n;
            return n;
        }
        break;
    default:
        break;
    }
    jc_fail(c, t->line, "unexpected %s in an expression", describe(t));
}

static jnode *parse_subscript_arg(jcompiler *c) {
    int line = cur(c)->line;
    jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0, slice = 0;
    for (;;) {
        if (is_op(c, ":")) {
            next(c);
            slice = 1;
            if (++k > 2)
                jc_fail(c, line, "a slice has at most three parts");
            continue;
        }
        if (is_op(c, "]") || is_op(c, ","))
            break;
        if (parts[k])
            jc_fail(c, line, "expected ':' or ']' in a subscript");
        parts[k] = parse_expr(c);
    }
    if (!slice)
        return parts[0];
    jnode *s = node(c, JN_SLICE, line);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static jnode *parse_postfix(jcompiler *c, jnode *n) {
    for (;;) {
        int line = cur(c)->line;
        if (is_op(c, ".")) {
            next(c);
            jtok *t = cur(c);
            if (t->type == JT_NAME) {
                jnode *a = node(c, JN_ATTR, line);
                a->a = n;
                a->name = next(c)->s;
                n = a;
            } else if (t->type == JT_INT) {
                jnode *a = node(c, JN_ITEM, line);
                a->a = n;
                a->b = node(c, JN_CONST, line);
                a->b->val = jv_int(next(c)->i);
                n = a;
            } else {
                jc_fail(c, line, "expected a name after '.', got %s", describe(t));
            }
        } else if (is_op(c, "[")) {
            next(c);
            jnode *arg = parse_subscript_arg(c);
            if (is_op(c, ","))
                jc_fail(c, line, "tuple subscripts are not supported");
            expect_op(c, "]");
            if (arg && arg->kind == JN_SLICE) {
                arg->a = n;
                n = arg;
            } else {
                if (!arg)
                    jc_fail(c, line, "an empty subscript");
                jnode *it = node(c, JN_ITEM, line);
                it->a = n;
                it->b = arg;
                n = it;
            }
        } else if (is_op(c, "(")) {
            jnode *call = node(c, JN_CALL, line);
            call->a = n;
            parse_call_args(c, call);
            n = call;
        } else {
            return n;
        }
    }
}

static jnode *parse_filter(jcompiler *c, jnode *operand) {
    int line = cur(c)->line;
    jnode *f = node(c, JN_FILTER, line);
    f->a = operand;
    f->name = expect_name(c);
    while (is_op(c, ".")) { /* dotted filter names: none known, but named whole in the error */
        next(c);
        const char *rest = expect_name(c);
        size_t l = strlen(f->name) + strlen(rest) + 2;
        char *nm = ja_alloc(c->a, l);
        snprintf(nm, l, "%s.%s", f->name, rest);
        f->name = nm;
    }
    if (is_op(c, "("))
        parse_call_args(c, f);
    return f;
}

static jnode *parse_filter_expr(jcompiler *c, jnode *n) {
    for (;;) {
        if (is_op(c, "|")) {
            next(c);
            n = parse_filter(c, n);
        } else if (is_name(c, "is")) {
            int line = next(c)->line;
            jnode *t = node(c, JN_TEST, line);
            if (is_name(c, "not")) {
                next(c);
                t->op = 1;
            }
            t->a = n;
            t->name = expect_name(c);
            jtok *k = cur(c);
            if (is_op(c, "(")) {
                parse_call_args(c, t);
            } else if ((k->type == JT_NAME || k->type == JT_STRING || k->type == JT_INT || k->type == JT_FLOAT ||
                        is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is"))
                    jc_fail(c, line, "tests cannot be chained with 'is'");
                jnode *arg = parse_postfix(c, parse_primary(c));
                t->args = ja_alloc(c->a, sizeof *t->args);
                t->args[0] = arg;
                t->nargs = 1;
            }
            n = t;
        } else if (is_op(c, "(")) {
            jnode *call = node(c, JN_CALL, cur(c)->line);
            call->a = n;
            parse_call_args(c, call);
            n = call;
        } else {
            return n;
        }
    }
}

static jnode *parse_unary(jcompiler *c, int with_filter) {
    int line = cur(c)->line;
    jnode *n;
    if (is_op(c, "-") || is_op(c, "+")) {
        int neg = is_op(c, "-");
        next(c);
        n = node(c, neg ? JN_NEG : JN_POS, line);
        n->a = parse_unary(c, 0);
    } else {
        n = parse_primary(c);
    }
    n = parse_postfix(c, n);
    if (with_filter)
        n = parse_filter_expr(c, n);
    return n;
}

static jnode *binop(jcompiler *c, int op, jnode *a, jnode *b, int line) {
    jnode *n = node(c, JN_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(jcompiler *c) {
    jnode *n = parse_unary(c, 1);
    while (is_op(c, "**")) {
        int line = next(c)->line;
        n = binop(c, JOP_POW, n, parse_unary(c, 1), line);
    }
    return n;
}

static jnode *parse_math2(jcompiler *c) {
    jnode *n = parse_pow(c);
    for (;;) {
        int op = is_op(c, "*") ? JOP_MUL : is_op(c, "/") ? JOP_DIV : is_op(c, "//") ? JOP_FLOORDIV
                 : is_op(c, "%") ? JOP_MOD : -1;
        if (op < 0)
            return n;
        int line = next(c)->line;
        n = binop(c, op, n, parse_pow(c), line);
    }
}

static jnode *parse_concat(jcompiler *c) {
    jnode *first = parse_math2(c);
    if (!is_op(c, "~"))
        return first;
    nlist l = {0};
    nl_push(c, &l, first, NULL);
    int line = cur(c)->line;
    while (is_op(c, "~")) {
        next(c);
        nl_push(c, &l, parse_math2(c), NULL);
    }
    jnode *n = node(c, JN_CONCAT, line);
    n->args = l.v;
    n->nargs = l.n;
    return n;
}

static jnode *parse_math1(jcompiler *c) {
    jnode *n = parse_concat(c);
    for (;;) {
        int op = is_op(c, "+") ? JOP_ADD : is_op(c, "-") ? JOP_SUB : -1;
        if (op < 0)
            return n;
        int line = next(c)->line;
        n = binop(c, op, n, parse_concat(c), line);
    }
}

static jnode *parse_compare(jcompiler *c) {
    int line = cur(c)->line;
    jnode *first = parse_math1(c);
    nlist l = {0};
    int ops[64];
    for (;;) {
        int op = is_op(c, "==") ? JOP_EQ : is_op(c, "!=") ? JOP_NE : is_op(c, "<") ? JOP_LT : is_op(c, "<=") ? JOP_LE
                 : is_op(c, ">") ? JOP_GT : is_op(c, ">=") ? JOP_GE : is_name(c, "in") ? JOP_IN : -1;
        if (op < 0 && is_name(c, "not") && is_name_at(c, 1, "in")) {
            next(c);
            op = JOP_NOTIN;
        }
        if (op < 0)
            break;
        next(c);
        if (l.n == 64)
            jc_fail(c, line, "too many chained comparisons");
        ops[l.n] = op;
        nl_push(c, &l, parse_math1(c), NULL);
    }
    if (!l.n)
        return first;
    jnode *n = node(c, JN_COMPARE, line);
    n->a = first;
    n->args = l.v;
    n->nargs = l.n;
    n->ops = ja_alloc(c->a, l.n * sizeof *n->ops);
    memcpy(n->ops, ops, l.n * sizeof *n->ops);
    return n;
}

static jnode *parse_not(jcompiler *c) {
    if (is_name(c, "not")) {
        int line = next(c)->line;
        jnode *n = node(c, JN_NOT, line);
        n->a = parse_not(c);
        return n;
    }
    return parse_compare(c);
}

static jnode *parse_and(jcompiler *c) {
    jnode *n = parse_not(c);
    while (is_name(c, "and")) {
        int line = next(c)->line;
        jnode *a = node(c, JN_AND, line);
        a->a = n;
        a->b = parse_not(c);
        n = a;
    }
    return n;
}

static jnode *parse_or(jcompiler *c) {
    jnode *n = parse_and(c);
    while (is_name(c, "or")) {
        int line = next(c)->line;
        jnode *a = node(c, JN_OR, line);
        a->a = n;
        a->b = parse_and(c);
        n = a;
    }
    return n;
}

static jnode *parse_expr(jcompiler *c) {
    jnode *n = parse_or(c);
    while (is_name(c, "if")) {
        int line = next(c)->line;
        jnode *k = node(c, JN_COND, line);
        k->b = n;
        k->a = parse_or(c);
        if (is_name(c, "else")) {
            next(c);
            k->c = parse_expr(c);
        }
        n = k;
    }
    return n;
}

/* ---- statements ---- */

static jnode *parse_body(jcompiler *c, const char *const *ends);

/* Is the current token (just after '{%') one of the end words? */
static int at_end(jcompiler *c, const char *const *ends) {
    for (size_t k = 0; ends && ends[k]; k++)
        if (is_name(c, ends[k]))
            return 1;
    return 0;
}

static void end_block(jcompiler *c) {
    expect_type(c, JT_BLOCK_END, "'%}'");
}

/* a filter chain for {% filter %} and {% set x | f %}: FILTER nodes whose innermost operand is NULL */
static jnode *parse_filter_chain(jcompiler *c) {
    jnode *f = parse_filter(c, NULL);
    while (is_op(c, "|")) {
        next(c);
        f = parse_filter(c, f);
    }
    return f;
}

static void parse_params(jcompiler *c, jnode *n) {
    nlist kw = {0};
    expect_op(c, "(");
    while (!is_op(c, ")")) {
        if (kw.n)
            expect_op(c, ",");
        if (is_op(c, ")"))
            break;
        const char *name = expect_name(c);
        jnode *def = NULL;
        if (is_op(c, "=")) {
            next(c);
            def = parse_expr(c);
        }
        nl_push(c, &kw, def, name);
    }
    next(c);
    n->kwv = kw.v;
    n->kwn = kw.names;
    n->nkw = kw.n;
}

static jnode *parse_if(jcompiler *c, int line) {
    static const char *const ends[] = {"elif", "else", "endif", NULL}, *const endif[] = {"endif", NULL};
    jnode *n = node(c, JN_IF, line);
    n->a = parse_tuple(c, 0, 0, 1);
    end_block(c);
    n->b = parse_body(c, ends);
    jnode *tail = n;
    for (;;) {
        if (is_name(c, "elif")) {
            jnode *e = node(c, JN_IF, next(c)->line);
            e->a = parse_tuple(c, 0, 0, 1);
            end_block(c);
            e->b = parse_body(c, ends);
            tail->c = e;
            tail = e;
        } else if (is_name(c, "else")) {
            next(c);
            end_block(c);
            tail->c = parse_body(c, endif);
        } else {
            next(c); /* endif */
            end_block(c);
            return n;
        }
    }
}

static jnode *parse_for(jcompiler *c, int line) {
    static const char *const ends[] = {"endfor", "else", NULL}, *const endfor[] = {"endfor", NULL};
    jnode *n = node(c, JN_FOR, line);
    n->a = parse_tuple(c, 1, 0, 0);
    if (!is_name(c, "in"))
        jc_fail(c, line, "expected 'in' in a for loop, got %s", describe(cur(c)));
    next(c);
    n->b = parse_tuple(c, 0, 0, 0);
    if (is_name(c, "if")) {
        next(c);
        n->c = parse_expr(c);
    }
    if (is_name(c, "recursive"))
        jc_fail(c, line, "recursive for loops are not supported");
    end_block(c);
    n->d = parse_body(c, ends);
    if (is_name(c, "else")) {
        next(c);
        end_block(c);
        n->args = ja_alloc(c->a, sizeof *n->args);
        n->args[0] = parse_body(c, endfor);
        n->nargs = 1;
    }
    next(c);
    end_block(c);
    return n;
}

static jnode *parse_set(jcompiler *c, int line) {
    static const char *const ends[] = {"endset", NULL};
    jnode *target, *n;
    if (cur(c)->type == JT_NAME && c->pos + 2 < c->ntok && c->toks[c->pos + 1].type == JT_OP &&
        !strcmp(c->toks[c->pos + 1].s, ".")) {
        target = node(c, JN_ATTR, line);
        target->a = node(c, JN_NAME, line);
        target->a->name = next(c)->s;
        next(c);
        target->name = expect_name(c);
    } else {
        target = parse_tuple(c, 1, 0, 0);
    }
    if (is_op(c, "=")) {
        next(c);
        n = node(c, JN_SET, line);
        n->a = target;
        n->b = parse_tuple(c, 0, 0, 1);
        end_block(c);
        return n;
    }
    if (target->kind != JN_NAME)
        jc_fail(c, line, "a block {%% set %%} assigns one name");
    n = node(c, JN_SETBLOCK, line);
    n->a = target;
    if (is_op(c, "|")) {
        next(c);
        n->c = parse_filter_chain(c);
    }
    end_block(c);
    n->b = parse_body(c, ends);
    next(c);
    end_block(c);
    return n;
}

/* {% macro name(params) %} and {% call(params) macro(args) %} */
static jnode *parse_macro(jcompiler *c, int line, int is_macro) {
    static const char *const endm[] = {"endmacro", NULL}, *const endc[] = {"endcall", NULL};
    jnode *n = node(c, is_macro ? JN_MACRO : JN_CALLBLOCK, line);
    if (is_macro) {
        n->name = expect_name(c);
        parse_params(c, n);
    } else {
        if (is_op(c, "("))
            parse_params(c, n);
        n->a = parse_expr(c);
        if (n->a->kind != JN_CALL)
            jc_fail(c, line, "{%% call %%} needs a call expression");
    }
    end_block(c);
    n->b = parse_body(c, is_macro ? endm : endc);
    next(c);
    end_block(c);
    if (is_macro)
        n->op = jinja_names_caller(n);
    return n;
}

/* a statement whose body runs to {% <end> %}: filter, with, generation */
static jnode *parse_simple_block(jcompiler *c, int line, int kind, const char *end) {
    const char *ends[] = {end, NULL};
    jnode *n = node(c, kind, line);
    if (kind == JN_FILTERBLOCK) {
        n->c = parse_filter_chain(c);
    } else if (kind == JN_WITH) {
        nlist kw = {0};
        while (cur(c)->type != JT_BLOCK_END) {
            if (kw.n)
                expect_op(c, ",");
            const char *name = expect_name(c);
            expect_op(c, "=");
            nl_push(c, &kw, parse_expr(c), name);
        }
        n->kwv = kw.v;
        n->kwn = kw.names;
        n->nkw = kw.n;
    }
    end_block(c);
    n->b = parse_body(c, ends);
    next(c);
    end_block(c);
    return n;
}

static jnode *parse_statement(jcompiler *c) {
    jtok *t = cur(c);
    int line = t->line;
    if (t->type != JT_NAME)
        jc_fail(c, line, "expected a statement name after '{%%', got %s", describe(t));
    const char *w = next(c)->s;
    if (!strcmp(w, "if"))
        return parse_if(c, line);
    if (!strcmp(w, "for"))
        return parse_for(c, line);
    if (!strcmp(w, "set"))
        return parse_set(c, line);
    if (!strcmp(w, "macro") || !strcmp(w, "call"))
        return parse_macro(c, line, w[0] == 'm');
    if (!strcmp(w, "filter"))
        return parse_simple_block(c, line, JN_FILTERBLOCK, "endfilter");
    if (!strcmp(w, "with"))
        return parse_simple_block(c, line, JN_WITH, "endwith");
    if (!strcmp(w, "generation"))
        return parse_simple_block(c, line, JN_GENERATION, "endgeneration");
    if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        jnode *n = node(c, w[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
        end_block(c);
        return n;
    }
    jc_fail(c, line, "unknown or unsupported statement '{%% %s %%}'", w);
}

/* Statements and text up to a '{%' whose first word is one of ends (left current), or the end of the template. */
static jnode *parse_body(jcompiler *c, const char *const *ends) {
    int line = cur(c)->line;
    nlist l = {0};
    for (;;) {
        jtok *t = cur(c);
        if (t->type == JT_EOF) {
            if (ends) {
                const char *close = ends[0];
                for (size_t k = 0; ends[k]; k++)
                    if (!strncmp(ends[k], "end", 3))
                        close = ends[k];
                jc_fail(c, line, "unexpected end of template: the block opened here needs {%% %s %%}", close);
            }
            break;
        }
        if (t->type == JT_TEXT) {
            next(c);
            jnode *x = node(c, JN_TEXT, t->line);
            x->val = jv_str(t->s, t->n);
            nl_push(c, &l, x, NULL);
        } else if (t->type == JT_VAR_BEGIN) {
            next(c);
            jnode *x = node(c, JN_OUTPUT, t->line);
            x->a = parse_tuple(c, 0, 0, 1);
            expect_type(c, JT_VAR_END, "'}}'");
            nl_push(c, &l, x, NULL);
        } else if (t->type == JT_BLOCK_BEGIN) {
            next(c);
            if (at_end(c, ends))
                break;
            if (cur(c)->type == JT_NAME && (!strncmp(cur(c)->s, "end", 3) || !strcmp(cur(c)->s, "elif") ||
                                            !strcmp(cur(c)->s, "else")))
                jc_fail(c, cur(c)->line, "unexpected '{%% %s %%}'%s", cur(c)->s,
                        ends ? "" : " outside any block");
            nl_push(c, &l, parse_statement(c), NULL);
        } else {
            jc_fail(c, t->line, "unexpected %s", describe(t));
        }
    }
    jnode *b = node(c, JN_BODY, line);
    b->args = l.v;
    b->nargs = l.n;
    return b;
}

jnode *jinja_parse(jcompiler *c) {
    c->pos = 0;
    jnode *root = parse_body(c, NULL);
    jinja_check(c, root);
    return root;
}
