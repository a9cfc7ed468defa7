/* tokenizer_add.c: tokens added to a tokenizer.json as transformers' add_special_tokens / add_tokens add them to a
 * fast tokenizer (what Axolotl's special_tokens and tokens do): the text of the file with the new entries appended to
 * added_tokens, loaded like the file itself, and written back into the copy a run saves.
 *
 * Ids follow `tokenizers` AddedVocabulary::add_tokens: a token that already has an id (an added token, or a word of
 * the model's vocabulary) keeps it, and a word of the vocabulary becomes an added token (cut out of texts before the
 * model sees them, as `tokenizers` does); each other takes the next id, the model's vocabulary size, or the largest
 * added id + 1 when that is larger. A text none of whose tokens changes anything is returned unchanged, so the
 * tokenized-data cache keyed by its hash stays valid. */
#include "data/tokenizer.h"

#include "core/json_util.h"
#include "data/tokenizer_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The id `tokenizers` gives the next new added token (see above). */
static int64_t next_id(json_t *root) {
    int64_t vocab = (int64_t)json_object_size(json_object_get(json_object_get(root, "model"), "vocab")), max = -1;
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(root, "added_tokens"), i, a) {
        int64_t id = json_integer_value(json_object_get(a, "id"));
        max = id > max ? id : max;
    }
    return max < 0 || max < vocab ? vocab : max + 1;
}

static json_t *added_entry(json_t *root, const char *content) {
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(root, "added_tokens"), i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, content))
            return a;
    }
    return NULL;
}

int snug_tok_json_add(const char *file, const char *dir, const char *json, size_t len, const char *const *tokens,
                      const int *special, int n, int32_t *ids, int *fresh, char **out, snug_error *e) {
    *out = NULL;
    int nchanged = 0;
    snug_tokenizer *t0 = NULL; /* the file as it is: the ids its vocabulary gives */
    SNUG_TRY(tok_load_text(&t0, file, dir, json, len, e));
    json_error_t jerr;
    json_t *root = snug_json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    int rc = root ? 0 : snug_fail(e, SNUG_EINPUT, "%s:%d:%d: not valid JSON: %s", file, jerr.line, jerr.column,
                                  jerr.text);
    if (!rc && !json_is_array(json_object_get(root, "added_tokens")))
        json_object_set_new(root, "added_tokens", json_array());
    for (int i = 0; i < n && !rc; i++) {
        json_t *a = added_entry(root, tokens[i]);
        fresh[i] = 0;
        if (a) { /* (an earlier token of the list, too) */
            ids[i] = (int32_t)json_integer_value(json_object_get(a, "id"));
            continue;
        }
        int64_t id = snug_tok_token_id(t0, tokens[i]); /* a word of the vocabulary, or a new id */
        fresh[i] = id < 0;
        id = id >= 0 ? id : next_id(root);
        nchanged++;
        if (id > INT32_MAX - 1) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: adding '%.60s' would give it id %lld, past any vocabulary", file,
                           tokens[i], (long long)id);
            break;
        }
        ids[i] = (int32_t)id;
        json_t *entry = json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content", tokens[i],
                                  "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                                  special[i] != 0);
        if (!entry || json_array_append_new(json_object_get(root, "added_tokens"), entry))
            rc = snug_fail(e, SNUG_ENOMEM, "out of memory adding tokens to %s", file);
    }
    if (!rc && !(*out = nchanged ? json_dumps(root, JSON_INDENT(2)) : tok_strndup(json, len)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of memory adding tokens to %s", file);
    json_decref(root);
    snug_tok_free(t0);
    return rc;
}

/* The whole of a file, NUL-terminated (apart from core/fileio: the tokenizer builds alone, as its tests build it). */
static int slurp(const char *path, char **buf, size_t *len, snug_error *e) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return snug_fail(e, SNUG_EINPUT, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (size_t k; b && (k = fread(b + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        char *nb = n + 1 >= cap ? realloc(b, cap *= 2) : b;
        if (!nb)
            free(b);
        b = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        return snug_fail(e, b ? SNUG_EIO : SNUG_ENOMEM, "cannot read %s", path);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

int snug_tok_load_adding(snug_tokenizer **out, const char *path, const char *const *tokens, const int *special,
                         int n, int32_t *ids, int *fresh, snug_error *e) {
    *out = NULL;
    char file[4200], dir[4200], *buf = NULL, *text = NULL;
    tok_paths(path, file, sizeof file, dir, sizeof dir);
    size_t len = 0;
    SNUG_TRY(slurp(file, &buf, &len, e));
    int rc = snug_tok_json_add(file, dir, buf, len, tokens, special, n, ids, fresh, &text, e);
    free(buf);
    if (!rc)
        rc = tok_load_text(out, file, dir, text, strlen(text), e);
    free(text);
    return rc;
}

int snug_tok_count_new_in_file(const char *path, const char *const *tokens, int n, int *count, snug_error *e) {
    char file[4200], dir[4200], *buf = NULL;
    tok_paths(path, file, sizeof file, dir, sizeof dir);
    size_t len = 0;
    *count = 0;
    SNUG_TRY(slurp(file, &buf, &len, e));
    json_error_t jerr;
    json_t *root = snug_json_loadb(buf, len, JSON_ALLOW_NUL, &jerr);
    free(buf);
    if (!root)
        return snug_fail(e, SNUG_EINPUT, "%s:%d:%d: not valid JSON: %s", file, jerr.line, jerr.column, jerr.text);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    for (int i = 0; i < n; i++) {
        int seen = added_entry(root, tokens[i]) || (json_is_object(vocab) && json_object_get(vocab, tokens[i]));
        for (int k = 0; k < i && !seen; k++)
            seen = !strcmp(tokens[k], tokens[i]);
        *count += !seen;
    }
    json_decref(root);
    return 0;
}
