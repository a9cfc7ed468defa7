/* added_tokens.c: the tokens a run adds to its tokenizer and the saved tokenizer files that hold them (see
 * added_tokens.h). */
#include "train/added_tokens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "model/lora.h"

/* The tokenizer.json file rewritten with tokens added (untouched when nothing changes: *changed 0), the ids
 * snug_tok_load_adding gives the file it was copied from. */
static int file_add(const char *file, const char *dir, const snug_added_tokens *a, int32_t *ids, int *fresh,
                    int *changed, snug_error *e) {
    char *buf = NULL, *text = NULL;
    size_t len = 0;
    SNUG_TRY(snug_read_file(file, &buf, &len, e));
    int rc = snug_tok_json_add(file, dir, buf, len, a->text, a->special, a->n, ids, fresh, &text, e);
    *changed = !rc && (strlen(text) != len || memcmp(text, buf, len));
    free(buf);
    if (*changed)
        rc = snug_write_file_atomic(file, text, strlen(text), e);
    free(text);
    return rc;
}

static int count_lines(const char *s) {
    int n = *s != '\0';
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

void snug_added_tokens_of(const snug_run_config *c, snug_added_tokens *a) {
    memset(a, 0, sizeof *a);
    const char *given[4] = {c->bos_token, c->eos_token, c->pad_token, c->unk_token}; /* Axolotl's order */
    for (int i = 0; i < 4; i++)
        if (given[i][0]) {
            a->special[a->n] = 1;
            a->text[a->n++] = given[i];
        }
    snprintf(a->buf, sizeof a->buf, "%s", c->tokens); /* then tokens, then additional_special_tokens */
    size_t at = strlen(a->buf) + 1;
    snprintf(a->buf + at, sizeof a->buf - at, "%s", c->extra_special);
    for (int list = 0; list < 2; list++)
        for (char *s = list ? a->buf + at : a->buf; *s && a->n < SNUG_TOK_MAX_ADD;) {
            char *nl = strchr(s, '\n');
            if (nl)
                *nl = '\0';
            a->special[a->n] = list;
            a->text[a->n++] = s;
            s = nl ? nl + 1 : s + strlen(s);
        }
}

int snug_added_tokens_save(const char *dir, const snug_run_config *c, snug_error *e) {
    snug_added_tokens a;
    snug_added_tokens_of(c, &a);
    char p[4096];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (!a.n || !snug_file_exists(p))
        return 0;
    int32_t ids[SNUG_TOK_MAX_ADD];
    int fresh[SNUG_TOK_MAX_ADD], changed = 0;
    SNUG_TRY(file_add(p, dir, &a, ids, fresh, &changed, e));
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    if ((!changed && !c->extra_special[0]) || !snug_file_exists(p))
        return 0;
    char *buf = NULL;
    size_t len = 0;
    SNUG_TRY(snug_read_file(p, &buf, &len, e));
    json_error_t je;
    json_t *j = snug_json_loadb(buf, len, 0, &je);
    free(buf);
    if (!json_is_object(j)) {
        json_decref(j);
        return snug_fail(e, SNUG_EINPUT, "%s: not a JSON object; the tokenizer files copied from the tokenizer's "
                         "folder must be valid JSON", p);
    }
    json_t *dec = json_object_get(j, "added_tokens_decoder");
    if (!json_is_object(dec))
        json_object_set_new(j, "added_tokens_decoder", dec = json_object());
    for (int i = 0; i < a.n; i++) { /* transformers' AddedToken fields, as it saves them */
        char key[16];
        snprintf(key, sizeof key, "%d", ids[i]);
        if (!json_object_get(dec, key))
            json_object_set_new(dec, key, json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", a.text[i], "lstrip",
                                                    0, "normalized", 0, "rstrip", 0, "single_word", 0, "special",
                                                    a.special[i]));
    }
    if (c->extra_special[0]) { /* transformers (v5) keeps additional_special_tokens as extra_special_tokens */
        json_t *list = json_array();
        for (int i = 0; i < a.n; i++)
            if (a.special[i] && i >= a.n - count_lines(c->extra_special))
                json_array_append_new(list, json_string(a.text[i]));
        json_object_set_new(j, "extra_special_tokens", list);
    }
    char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", p);
    int rc = snug_write_file_atomic(p, text, strlen(text), e);
    free(text);
    return rc;
}

int snug_setup_check_new_token(const snug_setup *r, const char *name, const char *text, snug_error *e) {
    const snug_run_config *o = &r->c;
    unsigned both = SNUG_SAVE_EMBED | SNUG_SAVE_HEAD;
    if (!o->adapter || (o->lora_save_modules & both) == both)
        return 0;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = snug_tok_encode(r->tok, text, strlen(text), &ids, &n, &cap, e) < 0 ? SNUG_EINPUT : 0;
    free(ids);
    if (!rc && n > 2)
        rc = snug_fail(e, SNUG_EINPUT, "%s: special_tokens.%s '%.60s' is a new token, trained with an adapter: set "
                       "lora_modules_to_save: [embed_tokens, lm_head] (as Axolotl asks when an adapter changes the "
                       "special tokens)", o->config_path[0] ? o->config_path : "options", name, text);
    return rc;
}

int snug_setup_add_tokens(snug_setup *r, snug_error *e) {
    snug_added_tokens a;
    snug_added_tokens_of(&r->c, &a);
    if (r->tok_error[0]) { /* a plan, its tokenizer not loaded: the vocabulary the tokens would grow to */
        int k = 0;
        if (a.n && r->enc.vocab_size > 0 && snug_tok_count_new_in_file(r->tok_path, a.text, a.n, &k, NULL) == 0)
            r->nadded = k, r->enc.vocab_size += k;
        return 0;
    }
    int change = 0; /* (a token that is already an added one changes nothing) */
    for (int i = 0; i < a.n; i++)
        change += !snug_tok_is_added(r->tok, a.text[i]);
    if (!change)
        return 0;
    int32_t ids[SNUG_TOK_MAX_ADD];
    int fresh[SNUG_TOK_MAX_ADD];
    snug_tokenizer *t = NULL;
    SNUG_TRY(snug_tok_load_adding(&t, r->tok_path, a.text, a.special, a.n, ids, fresh, e));
    r->nadded = 0;
    for (int i = 0; i < a.n; i++)
        r->nadded += fresh[i];
    snug_tok_free(r->tok);
    r->tok = t;
    r->enc.ctx = t;
    r->enc.vocab_size = snug_tok_vocab_size(t);
    r->enc.hash = snug_tok_hash(t);
    return 0;
}

int snug_setup_grow_vocab(snug_setup *r, snug_error *e) {
    const snug_run_config *o = &r->c;
    int need = o->resize_to_32x ? (r->enc.vocab_size + 31) / 32 * 32 : r->enc.vocab_size;
    if ((!r->nadded && !o->resize_to_32x) || need <= r->cfg.vocab_size)
        return 0; /* (tokens added into rows the base has spare, as Axolotl leaves them) */
    const char *src = o->config_path[0] ? o->config_path : "options";
    unsigned both = SNUG_SAVE_EMBED | SNUG_SAVE_HEAD;
    if (o->tensor_parallel_size > 1)
        return snug_fail(e, SNUG_EINPUT, "%s: the added tokens grow the vocabulary from %d to %d, which "
                         "tensor_parallel_size %d does not support yet; train without tensor parallelism, or use a "
                         "tokenizer that has the tokens", src, r->cfg.vocab_size, need, o->tensor_parallel_size);
    /* an adapter saves the grown tables whole beside it, as PEFT does (peft_io.c): lora_modules_to_save's trained
     * copies, or else the base's, frozen */
    unsigned saved = o->lora_save_modules & both;
    if (o->adapter && saved && saved != both)
        return snug_fail(e, SNUG_EINPUT, "%s: the added tokens grow the embedding and lm_head from %d to %d rows, and "
                         "lora_modules_to_save trains only one of them; set lora_modules_to_save: [embed_tokens, "
                         "lm_head], or remove it (the grown tables are then saved beside the adapter as PEFT saves "
                         "them)", src, r->cfg.vocab_size, need);
    if (o->adapter && !saved && (o->pipeline_parallel_size > 1 || o->zero_stage >= 3 || o->offload_params))
        return snug_fail(e, SNUG_EINPUT, "%s: the added tokens grow the embedding and lm_head from %d to %d rows, "
                         "saved beside the adapter, which %s does not support yet; train without it, or set "
                         "lora_modules_to_save: [embed_tokens, lm_head]", src, r->cfg.vocab_size, need,
                         o->pipeline_parallel_size > 1 ? "pipeline_parallel_size" : o->zero_stage >= 3 ? "ZeRO-3"
                                                                                           : "offload_params");
    r->cfg.vocab_base = r->cfg.vocab_size;
    r->cfg.vocab_size = need;
    r->cfg.vocab_mean = o->mean_resizing_embeddings;
    r->cfg.vocab_seed = (uint64_t)o->seed;
    return 0;
}
