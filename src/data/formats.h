/* formats.h (internal to src/data): one JSONL line of a dataset into token ids and supervised flags (formats.c; a
 * chat line through a Jinja template: formats_jinja.c, whose text goes through the same pieces).
 *
 * A line becomes a sequence of pieces (template text, the user's text, template special tokens), each supervised or
 * not, grouped into units that are tokenized as one text: the whole conversation for chat (as transformers'
 * apply_chat_template tokenizes the rendered template), the prompt and the response separately for alpaca (as
 * Axolotl). The ids are those of tokenizing each unit whole. Tokenizers split a text at its special tokens first, so a
 * unit is tokenized section by section (the text between two special tokens, tokenized together with the special
 * token before it, which is then dropped: the section is read as in context, not as the start of a text). Where the
 * supervision changes inside a section (the role header's line break, then the assistant's reply), the boundary token
 * is found by tokenizing the part before it (its ids must be a prefix) or after it (a suffix); a token that straddles
 * the boundary anyway is supervised, as in transformers' assistant mask. */
#ifndef SNUG_DATA_FORMATS_H
#define SNUG_DATA_FORMATS_H

#include "data/chat_render.h"
#include "data/dataset.h"

/* A piece of the pending unit: text at buf[off, off+len), a special token (its text is in buf too), supervised
 * or not. */
typedef struct snug_piece {
    size_t off, len;
    int32_t special; /* the id of a template special token, or -1 for text */
    uint8_t sup;
} snug_piece;

/* One example being built; reused line after line by one thread. */
typedef struct snug_example {
    int32_t *ids;  /* (n) */
    uint8_t *sup;  /* (n) */
    size_t n, cap, supcap;
    char *text;    /* the pending unit's text, not tokenized yet */
    size_t tlen, tcap;
    snug_piece *pieces; /* the pending unit's pieces */
    size_t np, pcap;
    int32_t *tmp;  /* scratch ids */
    size_t tmpn, tmpcap;
    char *scratch; /* scratch text */
    size_t scap;
    int32_t *dids; /* scratch ids to decode */
    size_t dcap;
} snug_example;

void snug_example_free(snug_example *ex);

/* What a source needs resolved once: the template's special tokens checked against the tokenizer. */
typedef struct snug_format {
    const snug_data_source *src;
    const snug_data_opts *opts;
    const snug_encoder *enc;
    const char *field;
    const char *messages, *role, *content; /* chat's field names (the defaults filled in) */
    int32_t special[4]; /* the template's special tokens' ids (in the order of formats.c's lists); -1: as text */
    snug_jinja *jinja;  /* chat through a Jinja template (src->chat SNUG_CHAT_JINJA), compiled once; else NULL */
    int jinja_gen;      /* 1: the template has {% generation %} blocks (they give the assistant mask) */
    snug_jinja *jinja_tool_use; /* the template of lines with tools (src->jinja_tool_use), or NULL */
    int tool_use_gen;
    snug_chat_vars vars; /* the special-token strings it is rendered with */
} snug_format;

/* Checks that the tokenizer has the special tokens the chat template writes (each must encode to itself alone). */
int snug_format_init(snug_format *f, const snug_data_source *src, const snug_data_opts *opts, const snug_encoder *enc,
                     snug_error *e);

void snug_format_free(snug_format *f);

/* Parses line[0..len) and tokenizes it into ex (emptied first). On bad input returns SNUG_EINPUT with a message that
 * says what is wrong and how to fix it, without the file name or line number (the caller adds them). */
int snug_format_line(const snug_format *f, const char *line, size_t len, snug_example *ex, snug_error *e);

/* The roles of a chat message, as formats.c maps a line's role values (datasets[].roles); tool only with a Jinja
 * template. */
enum { SNUG_ROLE_SYSTEM, SNUG_ROLE_USER, SNUG_ROLE_ASSISTANT, SNUG_ROLE_TOOL };

/* What formats_jinja.c needs of formats.c: text of the pending unit, its tokenization, a role's canonical name. */
int snug_format_put_text(const snug_format *f, snug_example *ex, const char *s, size_t n, int sup, snug_error *e);
int snug_format_flush(const snug_format *f, snug_example *ex, snug_error *e);
int snug_format_role_of(const snug_format *f, const char *value);
const char *snug_format_role_name(int role);

/* A chat line through the Jinja template (formats_jinja.c): msgs is the line's checked message list, obj the line. */
int snug_format_chat_jinja(const snug_format *f, json_t *obj, json_t *msgs, snug_example *ex, snug_error *e);

#endif
