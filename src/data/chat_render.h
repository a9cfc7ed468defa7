/* chat_render.h: rendering a conversation through a Jinja chat template as transformers' apply_chat_template does
 * (the variables it passes, the spans of {% generation %} blocks), over the interpreter of jinja.h. */
#ifndef SNUG_DATA_CHAT_RENDER_H
#define SNUG_DATA_CHAT_RENDER_H

#include <stddef.h>

#include <jansson.h>

#include "core/error.h"
#include "data/jinja.h"

/* The special-token strings a template sees (bos_token, eos_token, ...) (transformers passes its special_tokens_map); NULL: undefined. */
typedef struct snug_chat_vars {
    const char *tokens[7]; /* in the order of snug_chat_token_names (chat_template.h) */
} snug_chat_vars;

/* Renders messages (a JSON array of message objects) with add_generation_prompt and tools into out (free with
 * snug_jinja_out_free). As transformers' render_jinja_template, tools and documents are always defined: None when
 * not given (tools NULL). */
int snug_chat_render(const snug_jinja *t, const json_t *messages, const json_t *tools, int add_generation_prompt,
                     const snug_chat_vars *v, snug_jinja_out *out, snug_error *e);

/* Compiles src (named `where` in errors) and renders two sample conversations (user, assistant, user with
 * add_generation_prompt; system, user, assistant), *out malloc'd: what tells two templates apart. */
int snug_chat_render_sample(const char *src, const char *where, const snug_chat_vars *v, char **out, snug_error *e);

#endif
