/* jinja_check.c: what Jinja2's compiler checks of a parsed template before it runs: unknown filters and tests
 * (some deferred to the moment they run), {% break %} and {% continue %} outside a loop, and whether a macro uses
 * caller() (Jinja2 refuses {% call %} of one that does not). */
#include <string.h>

#include "data/jinja_impl.h"

/* Whether a macro's body names `caller` (outside macros nested in it): Jinja2 refuses {% call %} of one that
 * does not. */
static int names_caller(const jnode *n) {
    if (!n)
        return 0;
    if (n->kind == JN_NAME && !strcmp(n->name, "caller"))
        return 1;
    if (n->kind == JN_MACRO)
        return 0;
    if (names_caller(n->a) || names_caller(n->b) || names_caller(n->c) || names_caller(n->d))
        return 1;
    for (size_t i = 0; i < n->nargs; i++)
        if (names_caller(n->args[i]))
            return 1;
    for (size_t i = 0; i < n->nkw; i++)
        if (names_caller(n->kwv[i]))
            return 1;
    return 0;
}

int jinja_names_caller(const jnode *macro) {
    for (size_t i = 0; i < macro->nkw; i++)
        if (names_caller(macro->kwv[i]))
            return 1;
    return names_caller(macro->b);
}

/* What Jinja2's compiler checks after parsing. Unknown filters and tests: an error, except where Jinja2 defers it to
 * the moment the filter runs, inside an {% if %} (its tests and branches) or an inline if, but not in a loop, macro,
 * block set, filter block or {% with %} body nested there (their frames are not "soft"). {% break %} and
 * {% continue %}: only in a loop's body, and not across a macro, call block or generation block (those compile to
 * functions of their own) nor in the loop's else. */
static void check_names(jcompiler *c, jnode *n, int soft, int in_loop) {
    if (!n)
        return;
    if (n->kind == JN_FILTER || n->kind == JN_TEST) {
        int known = n->kind == JN_FILTER ? jinja_has_filter(n->name) : jinja_has_test(n->name);
        if (!known && !soft)
            jc_fail(c, n->line, "no %s named '%s'", n->kind == JN_FILTER ? "filter" : "test", n->name);
        n->unknown = !known;
    }
    if ((n->kind == JN_BREAK || n->kind == JN_CONTINUE) && !in_loop)
        jc_fail(c, n->line, "{%% %s %%} outside a for loop", n->kind == JN_BREAK ? "break" : "continue");
    int inner = soft; /* softness of the children */
    switch (n->kind) {
    case JN_IF:
    case JN_COND: inner = 1; break;
    case JN_FOR: /* the iterable in the enclosing frame, the rest in the loop's */
        check_names(c, n->b, soft, in_loop);
        check_names(c, n->a, 0, 0);
        check_names(c, n->c, 0, 0);
        check_names(c, n->d, 0, 1);
        for (size_t i = 0; i < n->nargs; i++)
            check_names(c, n->args[i], 0, in_loop);
        return;
    case JN_CALLBLOCK: /* the call in the enclosing frame, the caller's body in its own */
    case JN_WITH:
        check_names(c, n->a, soft, in_loop);
        for (size_t i = 0; i < n->nkw; i++)
            check_names(c, n->kwv[i], n->kind == JN_WITH ? soft : 0, 0);
        check_names(c, n->b, 0, n->kind == JN_WITH ? in_loop : 0);
        return;
    case JN_MACRO:
    case JN_GENERATION: inner = 0, in_loop = 0; break;
    case JN_SETBLOCK:
    case JN_FILTERBLOCK: inner = 0; break;
    default: break;
    }
    check_names(c, n->a, inner, in_loop);
    check_names(c, n->b, inner, in_loop);
    check_names(c, n->c, inner, in_loop);
    check_names(c, n->d, inner, in_loop);
    for (size_t i = 0; i < n->nargs; i++)
        check_names(c, n->args[i], inner, in_loop);
    for (size_t i = 0; i < n->nkw; i++)
        check_names(c, n->kwv[i], inner, in_loop);
}

void jinja_check(jcompiler *c, jnode *root) {
    check_names(c, root, 0, 0);
}
