/* chat_setup.c: which chat template each chat dataset of a run renders with, what the run header says about it, and
 * what the saved folder keeps (see setup.h).
 *
 * The default (tokenizer_default_fallback_chatml, Axolotl's tokenizer_default with a fallback) renders with the
 * template the tokenizer ships, so training sees the prompt that inference with transformers' apply_chat_template
 * builds. When the run renders with another template (a built-in forced, or chat_template_jinja), the saved folder's
 * chat_template.jinja is that template, so inference from the saved folder sees the prompt the model was trained on. */
#include "train/setup.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "data/chat_render.h"

/* The folder of a file path ("." for a bare name) into dir. */
static void folder_of(const char *path, char *dir, size_t cap) {
    snprintf(dir, cap, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, cap, ".");
}

/* Sets src to render with a built-in (which: chatml or llama3), or with the Jinja text t from `where` (the
 * tokenizer's own: with its tool_use template too). */
static void use_template(snug_setup *r, snug_data_source *src, snug_chat_template which, const char *t,
                         const char *where) {
    src->chat = which;
    if (which != SNUG_CHAT_JINJA)
        return;
    src->jinja = t;
    src->jinja_where = where;
    if (t == r->chat.jinja) {
        src->jinja_tool_use = r->chat.jinja_tool_use;
        src->jinja_tool_use_where = r->chat.where_tool_use;
    }
    for (int k = 0; k < 7; k++)
        src->chat_tokens[k] = r->chat.tokens[k];
}

/* Whether the built-in renders a sample conversation differently from the tokenizer's template (1), the same (0). */
static int builtin_differs(snug_setup *r, snug_chat_template which) {
    snug_chat_vars v;
    for (int k = 0; k < 7; k++)
        v.tokens[k] = r->chat.tokens[k];
    char *a = NULL, *b = NULL;
    snug_error ea = {0}, eb = {0};
    int ra = snug_chat_render_sample(r->chat.jinja, r->chat.where, &v, &a, &ea);
    int rb = snug_chat_render_sample(snug_chat_builtin_jinja(which == SNUG_CHAT_LLAMA3), "built-in", &v, &b, &eb);
    int differs = ra || rb || strcmp(a, b) != 0; /* a template that cannot render the sample differs too */
    free(a);
    free(b);
    return differs;
}

int snug_setup_chat(snug_setup *r, snug_error *e) {
    const snug_run_config *o = &r->c;
    int nchat = 0;
    for (int i = 0; i < o->ndatasets + o->ntest_datasets; i++)
        nchat += snug_run_dataset(o, i, NULL)->type == SNUG_DATA_CHAT;
    r->chat_saved = NULL;
    r->chat_note[0] = '\0';
    if (!nchat)
        return 0;
    snug_chat_files_free(&r->chat);
    if (r->tok_path[0]) {
        char dir[4096];
        folder_of(r->tok_path, dir, sizeof dir);
        SNUG_TRY(snug_chat_files_read(dir, &r->chat, e));
    }
    free(r->chat_jinja);
    r->chat_jinja = NULL;
    if (o->chat_template_jinja[0]) {
        char base[1024];
        folder_of(o->config_path[0] ? o->config_path : "./x", base, sizeof base);
        SNUG_TRY(snug_chat_jinja_arg(o->chat_template_jinja, base, &r->chat_jinja, r->chat_jinja_where,
                                     sizeof r->chat_jinja_where, e));
    }
    const char *cfg = o->config_path[0] ? o->config_path : "options";
    int first = 1;
    for (int i = 0; i < o->ndatasets + o->ntest_datasets; i++) {
        const char *key;
        const snug_dataset_spec *d = snug_run_dataset(o, i, &key);
        if (d->type != SNUG_DATA_CHAT)
            continue;
        snug_data_source *src = i < o->ndatasets ? &r->dsrc[i] : &r->vsrc[i - o->ndatasets];
        int k = i < o->ndatasets ? i : i - o->ndatasets;
        const char *saved = NULL; /* what this entry renders with, when it is not the tokenizer's own */
        switch (d->chat_template) {
        case SNUG_CHAT_TOKENIZER:
            if (!r->chat.jinja)
                return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] renders with the tokenizer's chat template "
                                 "(tokenizer_default), but %s ships none (no chat_template.jinja, no chat_template in "
                                 "tokenizer_config.json); set chat_template: chatml or llama3, or chat_template_jinja",
                                 cfg, key, k, r->tok_path[0] ? r->tok_path : "the byte-level tokenizer");
            use_template(r, src, SNUG_CHAT_JINJA, r->chat.jinja, r->chat.where);
            break;
        case SNUG_CHAT_TOKENIZER_OR_CHATML:
        case SNUG_CHAT_TOKENIZER_OR_LLAMA3: {
            int llama3 = d->chat_template == SNUG_CHAT_TOKENIZER_OR_LLAMA3;
            if (r->chat.jinja) {
                use_template(r, src, SNUG_CHAT_JINJA, r->chat.jinja, r->chat.where);
            } else {
                use_template(r, src, llama3 ? SNUG_CHAT_LLAMA3 : SNUG_CHAT_CHATML, NULL, NULL);
                saved = snug_chat_builtin_jinja(llama3);
            }
            break;
        }
        case SNUG_CHAT_JINJA:
            if (!r->chat_jinja)
                return snug_fail(e, SNUG_EINPUT, "%s: %s[%d] has chat_template jinja but chat_template_jinja is "
                                 "empty; set it to the template's text or file", cfg, key, k);
            use_template(r, src, SNUG_CHAT_JINJA, r->chat_jinja, r->chat_jinja_where);
            saved = r->chat.jinja && !strcmp(r->chat.jinja, r->chat_jinja) ? NULL : r->chat_jinja;
            break;
        default: /* a built-in named */
            use_template(r, src, d->chat_template, NULL, NULL);
            saved = snug_chat_builtin_jinja(d->chat_template == SNUG_CHAT_LLAMA3);
            if (r->chat.jinja && !r->chat_note[0] && builtin_differs(r, d->chat_template))
                snprintf(r->chat_note, sizeof r->chat_note, "%s (chat_template: %s), not the tokenizer's own in %.600s, "
                         "which renders differently; the saved folder keeps %s as chat_template.jinja", 
                         snug_chat_template_name(d->chat_template), snug_chat_template_name(d->chat_template),
                         r->chat.where, snug_chat_template_name(d->chat_template));
            else if (r->chat.jinja && !builtin_differs(r, d->chat_template))
                saved = NULL; /* the tokenizer's own renders the same: keep its files as they are */
            break;
        }
        if (first)
            r->chat_saved = saved;
        first = 0;
    }
    return 0;
}

int snug_setup_save_chat_template(const snug_setup *s, const char *dir, snug_error *e) {
    char p[4096];
    if (!s->chat_saved && s->chat.tool_use_file) { /* the tokenizer's own, with its tool_use file */
        snug_path_join(p, sizeof p, dir, "additional_chat_templates");
        SNUG_TRY(snug_mkdirs(p, e));
        snug_path_join(p, sizeof p, dir, "additional_chat_templates/tool_use.jinja");
        return snug_write_file_atomic(p, s->chat.jinja_tool_use, strlen(s->chat.jinja_tool_use), e);
    }
    if (!s->chat_saved)
        return 0;
    snug_path_join(p, sizeof p, dir, "chat_template.jinja");
    SNUG_TRY(snug_write_file_atomic(p, s->chat_saved, strlen(s->chat_saved), e));
    snug_path_join(p, sizeof p, dir, "tokenizer_config.json");
    if (!snug_file_exists(p))
        return 0;
    char *buf = NULL;
    size_t len = 0;
    SNUG_TRY(snug_read_file(p, &buf, &len, e));
    json_error_t je;
    json_t *j = snug_json_loadb(buf, len, 0, &je);
    free(buf);
    int rc = 0;
    if (json_is_object(j) && json_object_get(j, "chat_template")) {
        json_object_del(j, "chat_template");
        char *text = json_dumps(j, JSON_INDENT(2));
        rc = text ? snug_write_file_atomic(p, text, strlen(text), e) : snug_fail(e, SNUG_ENOMEM, "out of memory "
                                                                                "writing %s", p);
        free(text);
    }
    json_decref(j);
    return rc;
}
