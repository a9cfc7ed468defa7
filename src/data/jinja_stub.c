/* jinja_stub.c: placeholder for the Jinja interpreter (jinja.h) until its lexer, parser and evaluator land. */
#include <stdlib.h>
#include <string.h>

#include "data/jinja.h"

int snug_jinja_compile(const char *src, size_t n, const char *name, snug_jinja **out, snug_error *e) {
    (void)src;
    (void)n;
    *out = NULL;
    return snug_fail(e, SNUG_EINTERNAL, "%s: the Jinja interpreter is not built yet", name ? name : "template");
}

int snug_jinja_render(const snug_jinja *t, const json_t *vars, snug_jinja_out *out, snug_error *e) {
    (void)t;
    (void)vars;
    memset(out, 0, sizeof *out);
    return snug_fail(e, SNUG_EINTERNAL, "the Jinja interpreter is not built yet");
}

void snug_jinja_out_free(snug_jinja_out *o) {
    if (!o)
        return;
    free(o->text);
    free(o->spans);
    memset(o, 0, sizeof *o);
}

void snug_jinja_free(snug_jinja *t) {
    (void)t;
}
