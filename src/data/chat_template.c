/* chat_template.c: reading a tokenizer folder's chat template and special-token strings as transformers does, and
 * the built-in templates as Jinja (see chat_template.h). */
#include "data/chat_template.h"

#include "core/fileio.h"
#include "core/json_util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The built-ins as Jinja. Their '\n' are Jinja string escapes inside expressions, so no whitespace control of the
 * renderer (transformers renders with trim_blocks and lstrip_blocks) can touch them. */
static const char CHATML_JINJA[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
static const char LLAMA3_JINJA[] =
    "{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + (message['content'] | trim) + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/* dir + "/" + file into dst (cut at n bytes) */
static void join(char *dst, size_t n, const char *dir, const char *file) {
    size_t k = strlen(dir);
    snprintf(dst, n, "%s%s%s", dir, k && dir[k - 1] != '/' ? "/" : "", file);
}

const char *snug_chat_builtin_jinja(int which) { return which == 1 ? LLAMA3_JINJA : CHATML_JINJA; }

const char *const snug_chat_token_names[7] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                               "pad_token", "cls_token", "mask_token"};

void snug_chat_files_free(snug_chat_files *f) {
    free(f->jinja);
    free(f->jinja_tool_use);
    for (int k = 0; k < 7; k++)
        free(f->tokens[k]);
    memset(f, 0, sizeof *f);
}


static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* A special token's string: "..." or an AddedToken object {"content": "..."}; NULL for anything else. */
static const char *token_string(json_t *v) {
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Sets out's special-token strings from the object j (those it names, replacing what was there). */
static int read_tokens(json_t *j, snug_chat_files *out, const char *p, snug_error *e) {
    for (int k = 0; k < 7; k++) {
        const char *s = token_string(json_object_get(j, snug_chat_token_names[k]));
        if (!s)
            continue;
        free(out->tokens[k]);
        if (!(out->tokens[k] = dup_n(s, strlen(s))))
            return snug_fail(e, SNUG_ENOMEM, "out of memory reading %s", p);
    }
    return 0;
}

/* tokenizer_config.json's "chat_template": a string, or [{"name", "template"}] of which "default" is taken (and
 * "tool_use" into *tool_use). */
static int config_template(json_t *ct, const char *p, char **out, char **tool_use, snug_error *e) {
    if (!ct || json_is_null(ct))
        return 0;
    if (json_is_string(ct)) {
        *out = dup_n(json_string_value(ct), json_string_length(ct));
        return *out ? 0 : snug_fail(e, SNUG_ENOMEM, "out of memory reading %s", p);
    }
    if (!json_is_array(ct))
        return snug_fail(e, SNUG_EINPUT, "%s: chat_template is %s; it must be a string or a list of {\"name\", "
                         "\"template\"}", p, snug_json_type_name(ct));
    size_t i;
    json_t *it;
    json_array_foreach(ct, i, it) {
        json_t *name = json_object_get(it, "name"), *t = json_object_get(it, "template");
        if (!json_is_string(name) || !json_is_string(t))
            return snug_fail(e, SNUG_EINPUT, "%s: chat_template[%zu] is not a {\"name\": \"...\", \"template\": "
                             "\"...\"} object", p, i);
        char **dst = !strcmp(json_string_value(name), "default")    ? out
                     : !strcmp(json_string_value(name), "tool_use") ? tool_use
                                                                    : NULL;
        if (dst && !*dst && !(*dst = dup_n(json_string_value(t), json_string_length(t))))
            return snug_fail(e, SNUG_ENOMEM, "out of memory reading %s", p);
    }
    return 0; /* without "default": no template, as transformers has no default then either */
}

int snug_chat_files_read(const char *dir, snug_chat_files *out, snug_error *e) {
    memset(out, 0, sizeof *out);
    char p[4096];
    join(p, sizeof p, dir, "chat_template.jinja");
    int rc = 0;
    if (snug_file_exists(p)) {
        size_t len = 0;
        SNUG_TRY(snug_read_file(p, &out->jinja, &len, e));
        snprintf(out->where, sizeof out->where, "%s", p);
    }
    join(p, sizeof p, dir, "additional_chat_templates/tool_use.jinja");
    if (snug_file_exists(p)) {
        size_t len = 0;
        if ((rc = snug_read_file(p, &out->jinja_tool_use, &len, e))) {
            snug_chat_files_free(out);
            return rc;
        }
        snprintf(out->where_tool_use, sizeof out->where_tool_use, "%s", p);
        out->tool_use_file = 1;
    }
    int files = out->jinja || out->jinja_tool_use; /* template files replace tokenizer_config.json's */
    join(p, sizeof p, dir, "tokenizer_config.json");
    if (!snug_file_exists(p))
        return 0;
    char *buf = NULL;
    size_t len = 0;
    if ((rc = snug_read_file(p, &buf, &len, e)))
        goto fail;
    json_error_t je;
    json_t *j = snug_json_loadb(buf, len, 0, &je);
    free(buf);
    if (!json_is_object(j)) {
        json_decref(j);
        rc = snug_fail(e, SNUG_EINPUT, "%s: not a JSON object (line %d: %s); fix or remove the file", p, je.line,
                       je.text);
        goto fail;
    }
    if (!files) {
        rc = config_template(json_object_get(j, "chat_template"), p, &out->jinja, &out->jinja_tool_use, e);
        if (!rc && out->jinja)
            snprintf(out->where, sizeof out->where, "%s", p);
        if (!rc && out->jinja_tool_use)
            snprintf(out->where_tool_use, sizeof out->where_tool_use, "%s (tool_use)", p);
    }
    if (!rc)
        rc = read_tokens(j, out, p, e);
    int legacy = !json_object_get(j, "added_tokens_decoder");
    json_decref(j);
    join(p, sizeof p, dir, "special_tokens_map.json");
    if (!rc && legacy && snug_file_exists(p)) { /* the legacy layout: its strings win */
        buf = NULL;
        if (!(rc = snug_read_file(p, &buf, &len, e))) {
            j = snug_json_loadb(buf, len, 0, &je);
            free(buf);
            rc = json_is_object(j) ? read_tokens(j, out, p, e)
                                   : snug_fail(e, SNUG_EINPUT, "%s: not a JSON object; fix or remove the file", p);
            json_decref(j);
        }
    }
fail:
    if (rc)
        snug_chat_files_free(out);
    return rc;
}

int snug_chat_jinja_arg(const char *value, const char *base_dir, char **out, char *where, size_t where_cap,
                        snug_error *e) {
    *out = NULL;
    char p[4096] = "";
    int markup = strstr(value, "{%") || strstr(value, "{{");
    if (!markup && *value) {
        if (value[0] == '/' || !base_dir || !*base_dir)
            snprintf(p, sizeof p, "%s", value);
        else
            join(p, sizeof p, base_dir, value);
        if (!snug_file_exists(p))
            p[0] = '\0';
    }
    if (p[0]) {
        size_t len = 0;
        SNUG_TRY(snug_read_file(p, out, &len, e));
        snprintf(where, where_cap, "%s", p);
        return 0;
    }
    if (!markup) /* a template without a tag or an expression would be a constant: it must have been a path */
        return snug_fail(e, SNUG_EINPUT, "chat_template_jinja: %.300s: no such file; give the template's text or the "
                         "path of a file that holds it", value);
    *out = dup_n(value, strlen(value));
    snprintf(where, where_cap, "chat_template_jinja");
    return *out ? 0 : snug_fail(e, SNUG_ENOMEM, "out of memory");
}
