/* error.h: how libsnug reports failure.
 *
 * The library never prints and never exits. A fallible function takes a snug_error* and, on failure, fills it with a
 * code and one line that names the file, the place (line, key, tensor) and the fix, then returns non-zero. Only the
 * CLI prints the message and chooses the exit status (2 for bad input, 1 for internal failures). */
#ifndef SNUG_ERROR_H
#define SNUG_ERROR_H

#include <stddef.h>

typedef enum snug_status {
    SNUG_OK = 0,
    SNUG_EINPUT = 2,    /* the user's files, config or command line are wrong: exit status 2 */
    SNUG_EIO = 3,       /* a read or write failed */
    SNUG_ENOMEM = 4,    /* an arena or the memory budget is exhausted */
    SNUG_EINTERNAL = 5, /* a bug in snug */
} snug_status;

typedef struct snug_error {
    int code;       /* snug_status */
    char msg[1536]; /* one line, no trailing newline */
} snug_error;

/* Fills e (if not NULL) and returns code, so callers write `return snug_fail(e, SNUG_EINPUT, "...", ...);`. */
int snug_fail(snug_error *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefixes the existing message with more context ("loading model: " + old message). Returns e->code. */
int snug_error_wrap(snug_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void snug_error_clear(snug_error *e);

/* Propagates a failing call: `SNUG_TRY(load(x, e));` */
#define SNUG_TRY(expr)          \
    do {                        \
        int snug_rc_ = (expr);  \
        if (snug_rc_ != 0)      \
            return snug_rc_;    \
    } while (0)

#endif
