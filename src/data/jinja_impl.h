/* jinja_impl.h (internal to src/data/jinja_*.c): the values, tokens, syntax tree and render state of the Jinja
 * interpreter declared in jinja.h.
 *
 * Memory: everything a compile makes (tokens, nodes, constants) lives in the template's arena and everything a render
 * makes (values, output) in the render's arena; each is freed whole at the end, so no value is reference-counted.
 * Values are immutable once made (the sandbox transformers uses forbids list.append and dict.update), except
 * namespaces, which {% set ns.x = ... %} changes in place. Errors inside compile and render unwind with longjmp to
 * the public entry point, which has filled the snug_error already. */
#ifndef SNUG_DATA_JINJA_IMPL_H
#define SNUG_DATA_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "data/jinja.h"

/* ---- arena ---- */
typedef struct jarena_chunk jarena_chunk;
typedef struct jarena {
    jarena_chunk *head;
    char *cur;
    size_t left;
    jmp_buf *oom;       /* where to unwind when malloc fails */
    snug_error *e;
} jarena;

void *ja_alloc(jarena *a, size_t n);
char *ja_strdup(jarena *a, const char *s, size_t n);
void ja_free(jarena *a);

/* ---- values ---- */
typedef enum jv_type {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,   /* a list, or a tuple (l->tuple) */
    JV_DICT,
    JV_NS,     /* a namespace(): a dict whose entries {% set ns.x %} changes */
    JV_MACRO,
    JV_FUNC,   /* a global function (jfunc_id) */
    JV_METHOD, /* a bound method of a str, list, dict or loop: obj.name */
    JV_LOOP,
} jv_type;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jnode jnode;
typedef struct jmethod jmethod;
typedef struct jloop jloop;
typedef struct jmacro jmacro;

typedef struct jv {
    int t;    /* jv_type */
    size_t n; /* JV_STR: length in bytes; JV_UNDEF: length of the hint */
    union {
        int b;
        int64_t i;
        double f;
        const char *s; /* JV_STR: the bytes (not NUL-terminated); JV_UNDEF: what was undefined, for errors */
        jlist *l;
        jdict *d;      /* JV_DICT, JV_NS */
        jmacro *m;
        int fn;
        jmethod *meth;
        jloop *loop;
    } u;
    int mk; /* JV_STR: a Markup string (from |safe or |escape): adding a plain string to it escapes that string */
} jv;

/* What a sequence is in Python, where it shows: JL_LIST and tuples are plain; generators (what |map, |select,
 * |unique, |batch, |items yield) and reverse iterators are always truthy, have no len(), cannot be indexed, print
 * as their address (an error here) and are used up by one iteration; dict views (items(), keys(), values()) and
 * range() have a len() but print as dict_items([...]) / range(a, b); none of them but lists is JSON. */
enum { JL_LIST, JL_GEN, JL_REVITER, JL_ITEMS, JL_KEYS, JL_VALUES, JL_RANGE };

struct jlist {
    size_t n;
    jv *v;
    int tuple;
    int kind;         /* JL_* */
    int consumed;     /* JL_GEN, JL_REVITER: iterated once already */
    const char *fail; /* JL_GEN: the error its first iteration raises (a generator over what cannot be iterated) */
    int64_t range[3]; /* JL_RANGE: start, stop, step */
};

struct jdict {
    size_t n, cap;
    jv *k, *v;
};

struct jmethod {
    jv obj;
    const char *name;
};

struct jloop {
    const jv *items; /* (n) the items being iterated */
    size_t n, i;
    int64_t depth;
};

typedef struct jscope jscope;
struct jmacro {
    const jnode *def; /* JN_MACRO, or the JN_CALLBLOCK whose body is caller() */
    jscope *closure;
};

enum { JF_RAISE, JF_STRFTIME, JF_NAMESPACE, JF_DICT, JF_RANGE };

static inline jv jv_undef(const char *hint) {
    jv v = {JV_UNDEF, hint ? __builtin_strlen(hint) : 0, {.s = hint}, 0};
    return v;
}
static inline jv jv_none(void) {
    jv v = {JV_NONE, 0, {.i = 0}, 0};
    return v;
}
static inline jv jv_bool(int b) {
    jv v = {JV_BOOL, 0, {.b = b != 0}, 0};
    return v;
}
static inline jv jv_int(int64_t i) {
    jv v = {JV_INT, 0, {.i = i}, 0};
    return v;
}
static inline jv jv_float(double f) {
    jv v = {JV_FLOAT, 0, {.f = f}, 0};
    return v;
}
static inline jv jv_str(const char *s, size_t n) {
    jv v = {JV_STR, n, {.s = s}, 0};
    return v;
}

/* ---- a growing byte buffer in an arena ---- */
typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf;

void jb_put(jarena *a, jbuf *b, const char *s, size_t n);
void jb_putc(jarena *a, jbuf *b, char c);
void jb_printf(jarena *a, jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- syntax tree ---- */
typedef enum jnode_kind {
    /* expressions */
    JN_CONST, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST,
    JN_NEG, JN_POS, JN_NOT, JN_AND, JN_OR, JN_BINOP, JN_CONCAT, JN_COMPARE, JN_COND,
    /* statements */
    JN_BODY, JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_CALLBLOCK, JN_FILTERBLOCK,
    JN_WITH, JN_GENERATION, JN_BREAK, JN_CONTINUE,
} jnode_kind;

/* binary operators and comparisons */
enum { JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW,
       JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN };

/* What each kind uses:
 *   CONST val | NAME name | LIST/TUPLE args | DICT args (keys), kwv (values) | ATTR a.name | ITEM a[b]
 *   SLICE a[b:c:d] (each may be NULL) | CALL a(args, kwn=kwv) | FILTER a|name(args, kwn=kwv) (a NULL in a filter block)
 *   TEST a is [not: op=1] name(args) | NEG/POS/NOT a | AND/OR a b | BINOP a op b | CONCAT args | COMPARE a then
 *   args[i] with ops[i] | COND b if a else c (c may be NULL)
 *   BODY args (statements) | TEXT val | OUTPUT a | IF a then b (BODY) else c (IF or BODY, may be NULL)
 *   FOR a (target: NAME or TUPLE) in b [if c], body d, else args[0] if nargs | SET a (NAME, TUPLE or ATTR) = b
 *   SETBLOCK a = body b, filtered by c (FILTER chain with a NULL innermost operand, may be NULL)
 *   MACRO name(kwn = kwv defaults, kwv[i] NULL where none) body b, op: whether it names caller
 *   CALLBLOCK call a, caller's params kwn/kwv, body b
 *   FILTERBLOCK c (FILTER chain) of body b | WITH kwn = kwv, body b | GENERATION body b */
struct jnode {
    int kind, line, op;
    int unknown; /* FILTER, TEST: not a known name, an error when it runs (Jinja2 defers it inside an if) */
    jnode *a, *b, *c, *d;
    jnode **args;
    size_t nargs;
    jnode **kwv;
    const char **kwn;
    size_t nkw;
    const char *name;
    int *ops;
    jv val;
};

struct snug_jinja {
    jarena arena;
    jnode *root; /* JN_BODY */
    char *name;
};

/* ---- compile (jinja_lex.c, jinja_parse.c) ---- */
typedef enum jtok_type {
    JT_EOF, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END, JT_NAME, JT_STRING, JT_INT, JT_FLOAT,
    JT_OP,
} jtok_type;

typedef struct jtok {
    int type, line;
    const char *s; /* JT_TEXT, JT_STRING: the (decoded) text; JT_NAME, JT_OP: the spelling; NUL-terminated */
    size_t n;
    int64_t i;
    double f;
} jtok;

typedef struct jcompiler {
    jarena *a;
    const char *name;
    snug_error *e, own; /* e: the caller's, or &own when the caller passed none */
    jmp_buf jmp;
    jtok *toks;
    size_t ntok, cap, pos;
} jcompiler;

void jc_fail(jcompiler *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
void jinja_lex(jcompiler *c, const char *src, size_t n);
jnode *jinja_parse(jcompiler *c);
void jinja_check(jcompiler *c, jnode *root);  /* jinja_check.c: Jinja2's compile-time checks */
int jinja_names_caller(const jnode *macro); /* whether a macro's defaults or body name `caller` */
int jinja_has_filter(const char *name);
int jinja_has_test(const char *name);

/* ---- render (jinja_eval.c, jinja_value.c, jinja_filters.c) ---- */
struct jscope {
    jscope *parent;
    jdict vars;
};

typedef struct jrender {
    jarena a;
    const snug_jinja *t;
    snug_error *e, own; /* e: the caller's, or &own when the caller passed none */
    jmp_buf jmp;
    jbuf *root;          /* the top-level output: generation spans are offsets into it */
    snug_jinja_span *spans;
    size_t nspans, spancap;
    jscope *globals;
    int depth;           /* macro call depth, against runaway recursion */
    int line;            /* the line of the statement being run, for errors deep in value code */
} jrender;

void jr_fail(jrender *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));

/* values (jinja_value.c) */
const char *jv_type_name(const jv *v);   /* "str", "list", "dict object" as Python names them */
int jv_truthy(const jv *v);
void jv_str_into(jrender *r, jbuf *b, const jv *v);   /* str(v) appended */
void jv_repr_into(jrender *r, jbuf *b, const jv *v);  /* repr(v) appended */
jv jv_to_str(jrender *r, const jv *v);
int jv_equal(const jv *x, const jv *y);
int jv_compare(jrender *r, int line, const jv *x, const jv *y); /* <0, 0, >0; fails for unordered types */
jv jv_from_json(jrender *r, const json_t *j);
void jv_tojson(jrender *r, int line, jbuf *b, const jv *v, int indent, int level, int sort_keys, int ascii,
               const char *item_sep, const char *key_sep);
jdict *jd_new(jrender *r, size_t cap);
jv *jd_get(const jdict *d, const char *k, size_t n);
void jd_set(jrender *r, jdict *d, jv k, jv v);
jv jv_list(jrender *r, size_t n, int tuple); /* n items, filled by the caller */
jv jv_seq(jrender *r, size_t n, int kind);   /* the same, of kind JL_* */
const char *jl_pyname(const jlist *l);       /* "list", "generator", "dict_items", ... */
size_t ju8_len(const char *s, size_t n);      /* code points in UTF-8 text */
size_t ju8_offset(const char *s, size_t n, size_t cp); /* byte offset of code point cp (n if past the end) */
jv jv_getattr(jrender *r, int line, const jv *obj, const char *name);
jv jv_getitem(jrender *r, int line, const jv *obj, const jv *key);
jv jv_binop(jrender *r, int line, int op, const jv *x, const jv *y);
int jv_contains(jrender *r, int line, const jv *container, const jv *item);
/* the items of an iterable (a dict's keys, a string's characters); fails for what cannot be iterated */
jlist *jv_iter(jrender *r, int line, const jv *v);
void jv_fail_undef(jrender *r, int line, const jv *v) __attribute__((noreturn));

/* filters, tests, methods (jinja_filters.c, jinja_methods.c) */
jv jinja_filter(jrender *r, int line, const char *name, jv v, jv *args, size_t nargs, const char **kwn, jv *kwv,
                size_t nkw);
int jinja_test(jrender *r, int line, const char *name, const jv *v, jv *args, size_t nargs);
jv jinja_method(jrender *r, int line, const jv *obj, const char *name, jv *args, size_t nargs, const char **kwn,
                jv *kwv, size_t nkw);
int jinja_has_method(const jv *obj, const char *name);
int64_t jv_int_arg(jrender *r, int line, const jv *v, int64_t def, const char *what); /* an integer argument */
/* string operations shared by filters and methods (jinja_methods.c) */
jv js_case(jrender *r, const jv *s, int mode); /* 'l' lower, 'u' upper, 'c' capitalize, 't' str.title, 'T' |title */
jv js_strip(jrender *r, int line, const jv *s, const jv *chars, int left, int right);
jv js_replace(jrender *r, const jv *s, const jv *old, const jv *new_, int64_t count);
int jcp_space(int32_t c);                   /* Python's str.isspace for one code point */
size_t js_line_break(const char *s, size_t n, size_t i); /* bytes of a str.splitlines() line break at s[i], or 0 */
jv js_splitlines(jrender *r, const jv *s);
int64_t js_wordcount(const jv *s);
jv jv_html_escape(jrender *r, const jv *s); /* markupsafe.escape: & < > " ' as entities, a Markup result */
jv jv_printf(jrender *r, int line, const jv *fmt, const jv *args, size_t nargs); /* fmt % args: %s %r %d %i %% */
jv jinja_call_func(jrender *r, int line, int fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw);

#endif
