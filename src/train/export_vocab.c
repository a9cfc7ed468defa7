/* export_vocab.c: the tokenizer.* metadata of a GGUF export, as llama.cpp's converter derives it from the model
 * folder (its get_vocab_base / _set_vocab_gpt2, LlamaHfVocab and gguf-py's SpecialVocab):
 *   tokenizer.ggml.model   "gpt2" (byte-level BPE: tokens, types, merges) or, for the Llama family's BPE with
 *                          byte_fallback and a Sequence decoder (the SentencePiece shape), "llama" (tokens, scores,
 *                          types; pre "default");
 *   tokenizer.ggml.pre     the name llama.cpp gives the pre-tokenizer, from its shape in tokenizer.json (the
 *                          converter hashes a tokenization of a fixed text; the shapes below are those hashes'
 *                          tokenizers); one snug does not know is refused by name;
 *   the special ids (bos, eos, unk, sep, pad, mask) from tokenizer_config.json's tokens, else config.json's ids;
 *   add_bos/add_eos from the post-processor's template and tokenizer_config.json; the chat template from
 *   tokenizer_config.json, chat_template.jinja or chat_template.json.
 * One difference, on purpose: the "llama" vocabulary's scores are minus the rank of the merge that makes each token
 * (0 for the rest), so llama.cpp's SentencePiece merge order is the BPE's; the converter writes -1000 for every token
 * when the folder has no tokenizer.model, which leaves llama.cpp merging left to right. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "train/export.h"
#include "train/setup.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* The pre-tokenizer regexes of Llama 3 and Qwen2 as their tokenizer.json spell them. */
static const char LLAMA3_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
                                "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
                               "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *load_json(const char *dir, const char *file, int required, char *path, size_t plen, snug_error *e,
                         int *rc) {
    snug_path_join(path, plen, dir, file);
    *rc = 0;
    if (!snug_file_exists(path)) {
        if (required)
            *rc = snug_fail(e, SNUG_EINPUT, "%s: not found; GGUF export writes the vocabulary into the file and needs "
                            "the model's tokenizer.json beside config.json", path);
        return NULL;
    }
    char *text;
    size_t len;
    if ((*rc = snug_read_file(path, &text, &len, e)))
        return NULL;
    json_error_t je;
    json_t *j = snug_json_loadb(text, len, 0, &je);
    free(text);
    if (!j)
        *rc = snug_fail(e, SNUG_EINPUT, "%s: line %d: %s", path, je.line, je.text);
    return j;
}

static const char *type_of(json_t *j) { return json_string_value(json_object_get(j, "type")); }

/* llama.cpp's name for the pre-tokenizer of a byte-level BPE, or NULL. */
static const char *pre_name(json_t *pre) {
    const char *t = type_of(pre);
    if (!t)
        return NULL;
    json_t *use = NULL;
    if (!strcmp(t, "ByteLevel"))
        return (use = json_object_get(pre, "use_regex")) && json_is_false(use) ? NULL : "gpt-2";
    if (strcmp(t, "Sequence"))
        return NULL;
    json_t *ps = json_object_get(pre, "pretokenizers");
    if (json_array_size(ps) == 1)
        return pre_name(json_array_get(ps, 0));
    if (json_array_size(ps) != 2 || !type_of(json_array_get(ps, 1)) ||
        strcmp(type_of(json_array_get(ps, 1)), "ByteLevel"))
        return NULL;
    json_t *a = json_array_get(ps, 0), *bl = json_array_get(ps, 1);
    int bl_regex = !json_is_false(json_object_get(bl, "use_regex"));
    const char *at = type_of(a);
    if (at && !strcmp(at, "Digits") && json_is_true(json_object_get(a, "individual_digits")) && bl_regex)
        return "smollm";
    if (at && !strcmp(at, "Split") && !bl_regex && !json_is_true(json_object_get(a, "invert"))) {
        const char *re = json_string_value(json_object_get(json_object_get(a, "pattern"), "Regex"));
        const char *beh = json_string_value(json_object_get(a, "behavior"));
        if (re && beh && !strcmp(beh, "Isolated"))
            return !strcmp(re, LLAMA3_RE) ? "llama-bpe" : !strcmp(re, QWEN2_RE) ? "qwen2" : NULL;
    }
    return NULL;
}

/* The added token of an id, or NULL. */
static json_t *added_of(json_t *added, int64_t id) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        if (json_integer_value(json_object_get(a, "id")) == id)
            return a;
    }
    return NULL;
}

/* The id of the first added token whose content is s, or -1. */
static int64_t added_id(json_t *added, const char *s) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, s))
            return json_integer_value(json_object_get(a, "id"));
    }
    return -1;
}

/* tokenizer_config.json's <typ>_token: a string or {"content": ...}. */
static const char *cfg_token(json_t *tc, const char *typ) {
    char k[32];
    snprintf(k, sizeof k, "%s_token", typ);
    json_t *v = json_object_get(tc, k);
    return json_is_object(v) ? json_string_value(json_object_get(v, "content")) : json_string_value(v);
}

/* The gpt2 converter's check for added tokens that ought to be control tokens though not marked special. */
static int looks_special(const char *s) {
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]"))
        return 1;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>"))
        return 1;
    if (n >= 8 && !strncmp(s, "<\xef\xbd\x9c", 4) && !strcmp(s + n - 4, "\xef\xbd\x9c>"))
        return 1;
    return n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>';
}

static int is_byte_token(const char *s) {
    return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && isxdigit((unsigned char)s[3]) &&
           isxdigit((unsigned char)s[4]);
}

typedef struct vocab_out {
    const char **tok;
    char **owned; /* strings made here ("[PAD7]", "a b" merges, " " for the user-defined "▁") */
    size_t n_owned;
    int32_t *type;
    float *score;
    size_t n;
} vocab_out;

static char *own(vocab_out *v, char *s) {
    if (s)
        v->owned[v->n_owned++] = s;
    return s;
}

/* A merge as the converter writes it: "a b"; a space inside a part of a [a, b] pair written as U+0120. join: the
 * two parts run together instead (the token the merge makes). */
static void put_part(char **o, const char *p, int join) {
    for (; *p; p++)
        if (*p == ' ' && !join)
            *(*o)++ = (char)0xC4, *(*o)++ = (char)0xA0;
        else
            *(*o)++ = *p;
}

static char *merge_text(json_t *m, int join) {
    const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1)), *sp;
    char *out;
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        if (!join || !(sp = strchr(s, ' ')))
            return strdup(s);
        if ((out = malloc(strlen(s))))
            snprintf(out, strlen(s), "%.*s%s", (int)(sp - s), s, sp + 1);
        return out;
    }
    if (!a || !b || !(out = malloc(2 * (strlen(a) + strlen(b)) + 2)))
        return NULL;
    char *o = out;
    put_part(&o, a, join);
    if (!join)
        *o++ = ' ';
    put_part(&o, b, join);
    *o = '\0';
    return out;
}

/* The special ids and add_* flags (SpecialVocab). n_vocab: ids at or above it are skipped (0: no limit). */
static void add_specials(snug_gguf *g, json_t *tj, json_t *tc, json_t *cj, int64_t n_vocab, int force_no_bos) {
    static const char *types[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
    static const char *keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                 "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
                                 "tokenizer.ggml.padding_token_id", NULL, "tokenizer.ggml.mask_token_id"};
    enum { NT = 7 };
    int64_t id[NT];
    int add[NT]; /* -1: unset */
    for (int i = 0; i < NT; i++)
        id[i] = -1, add[i] = -1;
    json_t *added = json_object_get(tj, "added_tokens");
    const char *bos = tc ? cfg_token(tc, "bos") : NULL, *eos = tc ? cfg_token(tc, "eos") : NULL;
    const char *cls = tc ? cfg_token(tc, "cls") : NULL;
    json_t *pp = json_object_get(tj, "post_processor");
    json_t *procs = json_object_get(pp, "processors");
    size_t np = procs ? json_array_size(procs) : pp && !json_is_null(pp) ? 1 : 0;
    for (size_t k = 0; k < np; k++) {
        json_t *pr = procs ? json_array_get(procs, k) : pp;
        const char *t = type_of(pr);
        if (t && !strcmp(t, "RobertaProcessing"))
            add[0] = add[1] = add[3] = 1;
        if (!t || strcmp(t, "TemplateProcessing"))
            continue;
        json_t *single = json_object_get(pr, "single");
        size_t ns = json_array_size(single);
        if (ns <= 1)
            continue;
        const char *first = json_string_value(json_object_get(json_object_get(json_array_get(single, 0),
                                                                               "SpecialToken"), "id"));
        const char *last = json_string_value(json_object_get(json_object_get(json_array_get(single, ns - 1),
                                                                              "SpecialToken"), "id"));
        if (first) {
            if (!tc)
                bos = first;
            add[0] = (bos && !strcmp(first, bos)) || (cls && !strcmp(first, cls));
        }
        if (last) {
            if (!tc)
                eos = last;
            add[1] = eos && !strcmp(last, eos);
        }
    }
    for (int i = 0; tc && i < NT; i++) {
        char k[32];
        snprintf(k, sizeof k, "add_%s_token", types[i]);
        json_t *a = json_object_get(tc, k);
        if (json_is_boolean(a))
            add[i] = json_is_true(a);
        const char *s = cfg_token(tc, types[i]);
        int64_t v = s ? added_id(added, s) : -1;
        if (v >= 0 && (!n_vocab || v < n_vocab))
            id[i] = v;
    }
    for (int i = 0; cj && i < NT; i++) {
        char k[32];
        snprintf(k, sizeof k, "%s_token_id", types[i]);
        json_t *v = json_object_get(cj, k);
        if (id[i] < 0 && json_is_integer(v) && json_integer_value(v) >= 0 &&
            (!n_vocab || json_integer_value(v) < n_vocab))
            id[i] = json_integer_value(v);
    }
    for (int i = 0; i < NT; i++)
        if (keys[i] && id[i] >= 0)
            snug_gguf_kv_u32(g, keys[i], (uint32_t)id[i]);
    if (force_no_bos) /* the converter's SmolLM / granite rule: a Llama of 49152 tokens adds no BOS */
        add[0] = 0;
    if (add[0] >= 0)
        snug_gguf_kv_bool(g, "tokenizer.ggml.add_bos_token", add[0]);
    if (add[1] >= 0)
        snug_gguf_kv_bool(g, "tokenizer.ggml.add_eos_token", add[1]);
    if (add[3] >= 0)
        snug_gguf_kv_bool(g, "tokenizer.ggml.add_sep_token", add[3]);
}

/* The chat template: tokenizer_config.json's, else chat_template.jinja, else chat_template.json's. */
static int add_chat_template(snug_gguf *g, const char *dir, json_t *tc, snug_error *e) {
    json_t *ct = json_object_get(tc, "chat_template");
    if (json_is_array(ct)) { /* named templates: the default one */
        size_t i;
        json_t *t;
        json_array_foreach(ct, i, t) {
            const char *n = json_string_value(json_object_get(t, "name"));
            if (n && !strcmp(n, "default"))
                ct = json_object_get(t, "template");
        }
    }
    if (json_is_string(ct)) {
        snug_gguf_kv_str(g, "tokenizer.chat_template", json_string_value(ct));
        return 0;
    }
    char p[4096];
    snug_path_join(p, sizeof p, dir, "chat_template.jinja");
    if (snug_file_exists(p)) {
        char *text;
        size_t len;
        SNUG_TRY(snug_read_file(p, &text, &len, e));
        snug_gguf_kv_str(g, "tokenizer.chat_template", text);
        free(text);
        return 0;
    }
    int rc;
    json_t *cj = load_json(dir, "chat_template.json", 0, p, sizeof p, e, &rc);
    if (json_is_string(json_object_get(cj, "chat_template")))
        snug_gguf_kv_str(g, "tokenizer.chat_template", json_string_value(json_object_get(cj, "chat_template")));
    json_decref(cj);
    return rc;
}

/* The "gpt2" vocabulary: every id below the config's vocab_size, "[PADi]" (unused) where the tokenizer has none. */
static int gpt2_tokens(vocab_out *v, json_t *vocab, json_t *added, int64_t n, const char *path, snug_error *e) {
    const char *k;
    json_t *val;
    json_object_foreach(vocab, k, val) {
        int64_t id = json_integer_value(val);
        if (id >= n)
            return snug_fail(e, SNUG_EINPUT, "%s: token '%s' has id %lld, past config.json's vocab_size %lld", path,
                             k, (long long)id, (long long)n);
        if (id >= 0 && !v->tok[id])
            v->tok[id] = k;
    }
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        int64_t id = json_integer_value(json_object_get(a, "id"));
        if (id >= n)
            return snug_fail(e, SNUG_EINPUT, "%s: added token id %lld is past the model's vocab_size %lld", path,
                             (long long)id, (long long)n);
        if (id >= 0)
            v->tok[id] = json_string_value(json_object_get(a, "content"));
    }
    for (int64_t id = 0; id < n; id++) {
        json_t *ad = added_of(added, id);
        if (!v->tok[id]) {
            char buf[32];
            snprintf(buf, sizeof buf, "[PAD%lld]", (long long)id);
            if (!(v->tok[id] = own(v, strdup(buf))))
                return snug_fail(e, SNUG_ENOMEM, "out of host memory building the vocabulary");
            v->type[id] = TT_UNUSED;
        } else if (!ad) {
            v->type[id] = TT_NORMAL;
        } else if (json_is_true(json_object_get(ad, "special")) || looks_special(v->tok[id])) {
            v->type[id] = TT_CONTROL;
        } else { /* a user-defined token's SentencePiece spaces are written as spaces */
            const char *s = v->tok[id];
            char *r = malloc(strlen(s) + 1), *o = r;
            if (!r)
                return snug_fail(e, SNUG_ENOMEM, "out of host memory building the vocabulary");
            for (; *s; s++)
                if (!strncmp(s, "\xe2\x96\x81", 3))
                    *o++ = ' ', s += 2;
                else
                    *o++ = *s;
            *o = '\0';
            v->tok[id] = own(v, r);
            v->type[id] = TT_USER_DEFINED;
        }
    }
    return 0;
}

/* The "llama" vocabulary (LlamaHfVocab): the model's tokens by id, then the added tokens past them; scores from the
 * merge ranks (see the top of the file). */
static int llama_tokens(vocab_out *v, json_t *vocab, json_t *merges, json_t *added, int64_t base, int64_t n,
                        const char *path, snug_error *e) {
    const char *k;
    json_t *val;
    json_object_foreach(vocab, k, val) {
        int64_t id = json_integer_value(val);
        if (id < 0 || id >= base || v->tok[id])
            return snug_fail(e, SNUG_EINPUT, "%s: model.vocab's ids are not 0 .. %lld each once (token '%s')", path,
                             (long long)base - 1, k);
        v->tok[id] = k;
    }
    for (int64_t id = base; id < n; id++) {
        json_t *a = added_of(added, id);
        if (!a)
            return snug_fail(e, SNUG_EINPUT, "%s: no token has id %lld (the added tokens must follow the model's "
                             "vocabulary without a gap)", path, (long long)id);
        v->tok[id] = json_string_value(json_object_get(a, "content"));
    }
    for (int64_t id = 0; id < n; id++) {
        json_t *a = added_of(added, id);
        int special = a && json_is_true(json_object_get(a, "special"));
        v->type[id] = id >= base ? (special ? TT_CONTROL : TT_USER_DEFINED)
                      : is_byte_token(v->tok[id]) ? TT_BYTE : special ? TT_CONTROL : TT_NORMAL;
        v->score[id] = 0.0f;
    }
    /* the token each merge makes, rank r: score -(r + 1) (the first merge that makes it wins) */
    size_t r;
    json_t *m;
    json_array_foreach(merges, r, m) {
        char *t = merge_text(m, 1);
        if (!t)
            return snug_fail(e, SNUG_EINPUT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, r);
        json_t *idj = json_object_get(vocab, t);
        free(t);
        int64_t id = json_is_integer(idj) ? json_integer_value(idj) : -1;
        if (id >= 0 && id < base && v->score[id] == 0.0f)
            v->score[id] = -(float)(r + 1);
    }
    return 0;
}

int snug_export_vocab(snug_gguf *g, const char *dir, const snug_model_config *cfg, int spm, snug_error *e) {
    char tpath[4096], p[4096];
    int rc;
    json_t *tj = load_json(dir, "tokenizer.json", 1, tpath, sizeof tpath, e, &rc);
    if (rc)
        return rc;
    json_t *tc = load_json(dir, "tokenizer_config.json", 0, p, sizeof p, e, &rc);
    json_t *cj = rc ? NULL : load_json(dir, "config.json", 0, p, sizeof p, e, &rc);
    json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges"), *added = json_object_get(tj, "added_tokens");
    const char *mt = type_of(model), *dec = type_of(json_object_get(tj, "decoder"));
    if (!rc && (!mt || strcmp(mt, "BPE") || !json_is_object(vocab)))
        rc = snug_fail(e, SNUG_EINPUT, "%s: model type %s: GGUF export writes BPE vocabularies only", tpath,
                       mt ? mt : "(none)");
    int byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    int llama = spm && byte_fallback && dec && !strcmp(dec, "Sequence");
    const char *pre = llama ? "default" : pre_name(json_object_get(tj, "pre_tokenizer"));
    if (!rc && !pre) {
        char *s = json_dumps(json_object_get(tj, "pre_tokenizer"), JSON_COMPACT);
        rc = snug_fail(e, SNUG_EINPUT, "%s: pre_tokenizer %.300s is none of the shapes whose llama.cpp name snug knows "
                       "(GPT-2's ByteLevel: gpt-2; Llama 3's Split + ByteLevel: llama-bpe; Qwen2's: qwen2; SmolLM's "
                       "Digits + ByteLevel: smollm); llama.cpp would not tokenize it as tokenizers does",
                       tpath, s ? s : "?");
        free(s);
    }
    int64_t base = (int64_t)json_object_size(vocab), n = cfg->vocab_size;
    if (llama) { /* the tokenizer's own size: the model's tokens and the added ones past them */
        size_t i;
        json_t *a;
        n = base;
        json_array_foreach(added, i, a) {
            int64_t id = json_integer_value(json_object_get(a, "id"));
            n = id >= n ? id + 1 : n;
        }
        if (!rc && n != cfg->vocab_size)
            rc = snug_fail(e, SNUG_EINPUT, "%s: the tokenizer has %lld tokens and config.json vocab_size is %d; "
                           "llama.cpp needs them equal for a SentencePiece-style vocabulary", tpath, (long long)n,
                           cfg->vocab_size);
    }
    vocab_out v = {0};
    if (!rc) {
        v.tok = calloc((size_t)n, sizeof *v.tok);
        v.owned = calloc((size_t)n + 1, sizeof *v.owned);
        v.type = calloc((size_t)n, sizeof *v.type);
        v.score = calloc((size_t)n, sizeof *v.score);
        v.n = (size_t)n;
        if (!v.tok || !v.owned || !v.type || !v.score)
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory building the vocabulary");
    }
    if (!rc)
        rc = llama ? llama_tokens(&v, vocab, merges, added, base, n, tpath, e)
                   : gpt2_tokens(&v, vocab, added, n, tpath, e);
    if (!rc) {
        json_t *aps = json_object_get(tc, "add_prefix_space");
        if (spm && json_is_boolean(aps))
            snug_gguf_kv_bool(g, "tokenizer.ggml.add_space_prefix", json_is_true(aps));
        snug_gguf_kv_str(g, "tokenizer.ggml.model", llama ? "llama" : "gpt2");
        snug_gguf_kv_str(g, "tokenizer.ggml.pre", pre);
        snug_gguf_kv_strs(g, "tokenizer.ggml.tokens", v.tok, NULL, v.n);
        if (llama)
            snug_gguf_kv_f32s(g, "tokenizer.ggml.scores", v.score, v.n);
        snug_gguf_kv_i32s(g, "tokenizer.ggml.token_type", v.type, v.n);
        size_t nm = json_array_size(merges);
        if (!llama && nm) {
            char **ms = calloc(nm, sizeof *ms);
            size_t k = 0;
            for (; ms && k < nm && (ms[k] = merge_text(json_array_get(merges, k), 0)); k++)
                ;
            if (!ms || k < nm)
                rc = snug_fail(e, SNUG_EINPUT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", tpath, k);
            else
                snug_gguf_kv_strs(g, "tokenizer.ggml.merges", (const char *const *)ms, NULL, nm);
            for (size_t i = 0; ms && i < k; i++)
                free(ms[i]);
            free(ms);
        }
    }
    if (!rc) {
        add_specials(g, tj, tc, cj, llama ? n : 0, spm && cfg->vocab_size == 49152);
        if (tc)
            rc = add_chat_template(g, dir, tc, e);
    }
    for (size_t i = 0; i < v.n_owned; i++)
        free(v.owned[i]);
    free(v.owned), free(v.tok), free(v.type), free(v.score);
    json_decref(tj), json_decref(tc), json_decref(cj);
    return rc;
}
