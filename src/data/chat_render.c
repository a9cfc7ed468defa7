/* chat_render.c: a conversation through a Jinja chat template, with the variables transformers' apply_chat_template
 * passes (see chat_render.h). */
#include "data/chat_render.h"

#include <stdlib.h>

#include "data/chat_template.h"
#include <string.h>

static int set_str(json_t *vars, const char *key, const char *s) {
    return s ? json_object_set_new(vars, key, json_string(s)) : 0;
}

int snug_chat_render(const snug_jinja *t, const json_t *messages, const json_t *tools, int add_generation_prompt,
                     const snug_chat_vars *v, snug_jinja_out *out, snug_error *e) {
    memset(out, 0, sizeof *out);
    /* transformers: {**special_tokens_map, messages, tools, documents, add_generation_prompt} */
    json_t *vars = json_object();
    int bad = !vars;
    if (!bad && v)
        for (int k = 0; k < 7 && !bad; k++)
            bad = set_str(vars, snug_chat_token_names[k], v->tokens[k]);
    if (!bad)
        bad = json_object_set(vars, "messages", (json_t *)messages) ||
              json_object_set(vars, "tools", tools ? (json_t *)tools : json_null()) ||
              json_object_set_new(vars, "documents", json_null()) ||
              json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    int rc = bad ? snug_fail(e, SNUG_ENOMEM, "out of memory rendering a chat template")
                 : snug_jinja_render(t, vars, out, e);
    json_decref(vars);
    return rc;
}

int snug_chat_render_sample(const char *src, const char *where, const snug_chat_vars *v, char **out, snug_error *e) {
    *out = NULL;
    snug_jinja *t = NULL;
    SNUG_TRY(snug_jinja_compile(src, strlen(src), where, &t, e));
    /* without a system message (templates that add a default one differ there), then with one */
    static const char *const convs[2] = {
        "[{\"role\": \"user\", \"content\": \"Hi there.\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}, "
        "{\"role\": \"user\", \"content\": \"How are you?\"}]",
        "[{\"role\": \"system\", \"content\": \"You are kind.\"}, {\"role\": \"user\", \"content\": \"Hi.\"}, "
        "{\"role\": \"assistant\", \"content\": \"Hello!\"}]"};
    char *text[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    int rc = 0;
    for (int k = 0; !rc && k < 2; k++) {
        json_error_t je;
        json_t *msgs = json_loads(convs[k], 0, &je);
        snug_jinja_out o;
        rc = msgs ? snug_chat_render(t, msgs, NULL, k == 0, v, &o, e) : snug_fail(e, SNUG_ENOMEM, "out of memory");
        if (!rc) {
            text[k] = o.text, len[k] = o.len, o.text = NULL;
            snug_jinja_out_free(&o);
        }
        json_decref(msgs);
    }
    if (!rc && !(*out = malloc(len[0] + len[1] + 2)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of memory");
    if (!rc) { /* the two, apart by a byte no template writes */
        memcpy(*out, text[0], len[0]);
        (*out)[len[0]] = '\x01';
        memcpy(*out + len[0] + 1, text[1], len[1] + 1);
    }
    free(text[0]);
    free(text[1]);
    snug_jinja_free(t);
    return rc;
}
