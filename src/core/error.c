/* error.c: filling snug_error (see error.h). */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int snug_fail(snug_error *e, int code, const char *fmt, ...) {
    if (e) { /* formatted aside first: a message may quote the one it replaces (e->msg as an argument) */
        char msg[sizeof e->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        memcpy(e->msg, msg, sizeof msg);
        e->code = code;
    }
    return code;
}

int snug_error_wrap(snug_error *e, const char *fmt, ...) {
    if (!e)
        return SNUG_EINTERNAL;
    char prefix[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t np = strlen(prefix), room = sizeof e->msg - 1;
    if (np > room)
        np = room;
    size_t no = strnlen(old, sizeof old);
    if (no > room - np)
        no = room - np;
    memcpy(e->msg, prefix, np);
    memcpy(e->msg + np, old, no);
    e->msg[np + no] = '\0';
    return e->code ? e->code : SNUG_EINTERNAL;
}

void snug_error_clear(snug_error *e) {
    if (e) {
        e->code = 0;
        e->msg[0] = '\0';
    }
}
