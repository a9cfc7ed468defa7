/* chat_template.h: a tokenizer's own chat template, read as transformers reads it, and the built-in templates
 * (chatml, llama3) written as Jinja.
 *
 * transformers (tokenization_utils_base.py, from_pretrained) takes the template from chat_template.jinja in the
 * tokenizer's folder when that file exists, else from tokenizer_config.json's "chat_template": a string, or a list
 * of {"name", "template"} of which the one named "default" is used; a conversation with tools renders with the one
 * named "tool_use" when there is one (get_chat_template). Template files (chat_template.jinja, and
 * additional_chat_templates/tool_use.jinja), when the folder has any, replace tokenizer_config.json's. The render variables bos_token, eos_token,
 * unk_token, sep_token, pad_token, cls_token and mask_token are tokenizer_config.json's strings (a string, or an
 * AddedToken object {"content": ...}), as its special_tokens_map gives them to the template; a folder whose
 * tokenizer_config.json has no added_tokens_decoder (the legacy layout) takes them from special_tokens_map.json
 * where that file names them, as transformers does. */
#ifndef SNUG_DATA_CHAT_TEMPLATE_H
#define SNUG_DATA_CHAT_TEMPLATE_H

#include <stddef.h>

#include "core/error.h"

/* What a tokenizer's folder says about chat: each string malloc'd, NULL when absent. */
typedef struct snug_chat_files {
    char *jinja;       /* the template's source */
    char where[4200];  /* the file it came from ("DIR/chat_template.jinja", "DIR/tokenizer_config.json"), or "" */
    char *jinja_tool_use; /* the template for conversations with tools ("tool_use"), or NULL */
    char where_tool_use[4200];
    int tool_use_file; /* 1: jinja_tool_use is additional_chat_templates/tool_use.jinja */
    char *tokens[7]; /* bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token */
} snug_chat_files;

/* The names of snug_chat_files.tokens, in order. */
extern const char *const snug_chat_token_names[7];

/* Reads dir's chat_template.jinja and tokenizer_config.json (either may be absent: then the fields stay NULL). A file
 * that exists but is unreadable, not JSON, or whose chat_template has the wrong shape is an error naming it. */
int snug_chat_files_read(const char *dir, snug_chat_files *out, snug_error *e);
void snug_chat_files_free(snug_chat_files *f);

/* Reads a template given in a configuration (Axolotl's chat_template_jinja): the text itself, or the path of a file
 * that holds it (a value without "{%" or "{{" that names an existing file; relative to base_dir when not absolute).
 * *out malloc'd. */
int snug_chat_jinja_arg(const char *value, const char *base_dir, char **out, char *where, size_t where_cap,
                        snug_error *e);

/* The built-in templates as Jinja, rendering exactly what formats.c writes for them (the text a saved folder keeps
 * when a built-in was chosen): 0 = chatml, 1 = llama3. */
const char *snug_chat_builtin_jinja(int which);

#endif
