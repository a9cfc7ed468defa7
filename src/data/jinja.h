/* jinja.h: a Jinja interpreter for the subset of Jinja2 that chat templates use, rendering as transformers'
 * apply_chat_template does.
 *
 * The environment is the one transformers builds for chat templates (ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, the loopcontrols extension and its {% generation %} tag): one trailing newline of
 * the source is dropped, line breaks in the source become "\n", the globals are raise_exception(msg),
 * strftime_now(fmt), namespace(...), dict(...) and range(...), and tojson is json.dumps with ensure_ascii=False.
 * Values behave as Python's (truthiness, str() of lists and dicts as repr, 64-bit int and float arithmetic, negative
 * indices, slices, string methods, Markup from |safe and |e); what |map, |select and the like return behaves as a
 * Python generator (truthy, used up by one loop, no len()); an undefined name behaves as Jinja2's default Undefined
 * (prints "", is falsy, iterates empty; its attributes and arithmetic fail).
 *
 * Supported: text, {{ }}, {% %}, {# #}, whitespace control (- and +), raw; if/elif/else, for (else, loop filter,
 * tuple targets, loop.*, break/continue), set (targets, tuples, namespace attributes, block set), macro and call,
 * filter blocks, with, generation; Jinja2's filters and tests but a few rare ones (truncate, wordwrap, urlencode,
 * striptags, xmlattr, pprint, slice, random, filesizeformat). What is not supported (include, extends, import,
 * recursive loops, other extensions' tags) fails to compile with an error naming the construct and the line;
 * unknown filters and tests fail at compile time, or inside an {% if %} when they run, as in Jinja2; unknown
 * functions and methods fail when called. Where Jinja2 would print a generator's memory address, rendering fails.
 *
 * The library never prints; errors come back through snug_error: SNUG_EINPUT for a template that fails to compile
 * or render (raise_exception's message included), SNUG_ENOMEM when memory runs out. */
#ifndef SNUG_DATA_JINJA_H
#define SNUG_DATA_JINJA_H

#include <stddef.h>

#include <jansson.h>

#include "core/error.h"

typedef struct snug_jinja snug_jinja; /* a compiled template; immutable, so one may render from many threads */

/* A byte range [begin, end) of the rendered text. */
typedef struct snug_jinja_span {
    size_t begin, end;
} snug_jinja_span;

typedef struct snug_jinja_out {
    char *text;             /* the rendered text, NUL-terminated (malloc'd) */
    size_t len;             /* its length in bytes */
    /* (nspans) the output of each {% generation %} block, in the order they ended: transformers' assistant indices
     * (characters) as byte offsets into text; where a block is nested in a macro, block set, filter block or another
     * generation block they are, as in transformers, where the output would have landed at the top level */
    snug_jinja_span *spans;
    size_t nspans;
} snug_jinja_out;

/* Compiles src[0, n) (UTF-8). name names the template in error messages ("tokenizer_config.json chat_template").
 * On success *out holds the template (free with snug_jinja_free). */
int snug_jinja_compile(const char *src, size_t n, const char *name, snug_jinja **out, snug_error *e);

/* Renders t with the variables of vars, a JSON object (messages, add_generation_prompt, bos_token, eos_token,
 * tools, ...); vars may be NULL for none. JSON objects keep their key order. On success *out holds the text and
 * the generation spans (free with snug_jinja_out_free); on failure *out is empty. */
int snug_jinja_render(const snug_jinja *t, const json_t *vars, snug_jinja_out *out, snug_error *e);

/* Whether the template has a {% generation %} block anywhere (outside comments and raw text): where it has none,
 * the output has no spans and an assistant mask must come from elsewhere (rendering prefixes). */
int snug_jinja_has_generation(const snug_jinja *t);

void snug_jinja_out_free(snug_jinja_out *o);
void snug_jinja_free(snug_jinja *t);

#endif
