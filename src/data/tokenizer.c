/* tokenizer.c: loading a tokenizer.json, the added tokens, the post-processor's BOS/EOS, and the encode pipeline
 * that ties normalizers, pre-tokenizers and the BPE model together (see tokenizer_base.h for the steps).
 *
 * Added tokens follow `tokenizers` added_vocabulary.rs: their ids are assigned the way AddedVocabulary::add_tokens
 * assigns them (the "id" written in the file is not what counts: `tokenizers` ignores it too), the non-normalized
 * ones are cut out of the raw text and the normalized ones out of each normalized segment, leftmost-longest, with
 * single_word / lstrip / rstrip applied to each match. */
#include "data/tokenizer.h"

#include "core/json_util.h"
#include "data/tokenizer_base.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* ---- added tokens ---- */

static int is_word_char(uint32_t cp) { /* Rust regex's Unicode \w, from the general category */
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9))
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

static size_t prev_char(const char *s, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80)
        j--;
    return j;
}

static int added_same(const tok_added *a, const char *content, size_t len, const tok_added *b) {
    return a->len == len && memcmp(a->content, content, len) == 0 && a->single_word == b->single_word &&
           a->lstrip == b->lstrip && a->rstrip == b->rstrip && a->normalized == b->normalized &&
           a->special == b->special;
}

static int parse_added(snug_tokenizer *t, json_t *arr, snug_error *e) {
    if (!arr || json_is_null(arr))
        return 0;
    if (!json_is_array(arr))
        return tok_bad(t, e, "added_tokens", "must be a list");
    size_t n = json_array_size(arr);
    if (!(t->added = calloc(n + 1, sizeof *t->added)))
        return tok_oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i), *content = json_object_get(o, "content");
        if (!json_is_object(o) || !json_is_string(content))
            return tok_bad(t, e, "added_tokens", "entry %zu needs a \"content\" string", i);
        const char *s = json_string_value(content);
        size_t len = json_string_length(content);
        tok_added tok = {.single_word = tok_json_bool(o, "single_word", 0),
                         .lstrip = tok_json_bool(o, "lstrip", 0),
                         .rstrip = tok_json_bool(o, "rstrip", 0),
                         .normalized = tok_json_bool(o, "normalized", 1),
                         .special = tok_json_bool(o, "special", 0)};
        if (len == 0)
            continue;
        tok_added *have = NULL;
        int32_t max_id = -1;
        int dup = 0;
        for (size_t k = 0; k < t->nadded; k++) {
            tok_added *a = &t->added[k];
            if (a->len == len && memcmp(a->content, s, len) == 0)
                have = a;
            if (added_same(a, s, len, &tok))
                dup = 1;
            if (a->id > max_id)
                max_id = a->id;
        }
        if (dup)
            continue;
        /* AddedVocabulary::add_tokens: an existing token keeps its id, otherwise the next free one */
        int32_t id = have ? have->id : tok_vocab_get(t, s, len);
        if (id < 0) {
            int32_t vs = (int32_t)t->vocab_count;
            id = max_id < 0 ? vs : (max_id >= vs || vs == 0) ? max_id + 1 : vs;
        }
        if (!have) {
            have = &t->added[t->nadded++];
            if (!(have->content = tok_strndup(s, len)))
                return tok_oom(e);
            have->len = len;
        }
        tok.content = have->content;
        tok.len = len;
        tok.id = id;
        *have = tok; /* a repeated token: the later flags win, as in added_tokens_map_r */
    }
    return 0;
}

/* Normalized tokens are matched by their normalized text. */
static int normalize_added(snug_tokenizer *t, snug_error *e) {
    tok_ctx c;
    if (tok_ctx_init(&c, e))
        return e ? e->code : SNUG_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < t->nadded && !rc; i++) {
        tok_added *a = &t->added[i];
        if (!a->normalized)
            continue;
        const char *s;
        size_t n;
        if (tok_normalize(t, &c, a->content, a->len, &s, &n))
            rc = e ? e->code : SNUG_EINTERNAL;
        else if (!(a->norm = tok_strndup(s, n)))
            rc = tok_oom(e);
        else
            a->norm_len = n;
    }
    tok_ctx_free(&c);
    return rc;
}

static const char *pat_text(const snug_tokenizer *t, const tok_matcher *m, int32_t k, size_t *len) {
    const tok_added *a = &t->added[k];
    *len = m->use_norm ? a->norm_len : a->len;
    return m->use_norm ? a->norm : a->content;
}

typedef struct pat_key {
    unsigned char first;
    size_t len;
    int32_t idx;
} pat_key;

static int cmp_pat(const void *x, const void *y) {
    const pat_key *a = x, *b = y;
    if (a->first != b->first)
        return a->first - b->first;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1; /* longest first */
    return a->idx - b->idx;
}

static int build_matcher(snug_tokenizer *t, tok_matcher *m, int use_norm, snug_error *e) {
    m->use_norm = use_norm;
    pat_key *keys = malloc((t->nadded + 1) * sizeof *keys);
    if (!keys || !(m->pat = malloc((t->nadded + 1) * sizeof *m->pat))) {
        free(keys);
        return tok_oom(e);
    }
    size_t n = 0;
    for (size_t i = 0; i < t->nadded; i++) {
        size_t len;
        const char *p = pat_text(t, m, (int32_t)i, &len);
        if (t->added[i].normalized == use_norm && len > 0)
            keys[n++] = (pat_key){(unsigned char)p[0], len, (int32_t)i};
    }
    qsort(keys, n, sizeof *keys, cmp_pat);
    memset(m->first, 0, sizeof m->first);
    for (size_t i = 0; i < n; i++) {
        m->pat[i] = keys[i].idx;
        m->first[keys[i].first + 1]++;
    }
    m->n = n;
    for (int c = 0; c < 256; c++)
        m->first[c + 1] += m->first[c];
    free(keys);
    return 0;
}

/* ---- post-processor ---- */

static int template_id(snug_tokenizer *t, json_t *specials, const char *name, const char *path, int32_t *id,
                       snug_error *e) {
    json_t *ids = json_object_get(json_object_get(specials, name), "ids");
    if (!json_is_array(ids))
        return tok_bad(t, e, path, "special token \"%s\" is not in special_tokens", name);
    json_t *first = json_array_get(ids, 0);
    if (json_is_integer(first) && (json_integer_value(first) < 0 || json_integer_value(first) > INT32_MAX))
        return tok_bad(t, e, path, "special token \"%s\" has id %lld, not a token id", name,
                       (long long)json_integer_value(first));
    *id = json_is_integer(first) ? (int32_t)json_integer_value(first) : -1;
    return 0;
}

static int parse_post(snug_tokenizer *t, json_t *j, const char *path, snug_error *e) {
    if (!j || json_is_null(j))
        return 0;
    const char *type = tok_json_type(j);
    char sub[512];
    if (!type)
        return tok_bad(t, e, path, "a post_processor needs a \"type\"");
    if (!strcmp(type, "ByteLevel"))
        return 0;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(j, "processors");
        if (!json_is_array(list))
            return tok_bad(t, e, path, "Sequence needs a \"processors\" list");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            SNUG_TRY(parse_post(t, json_array_get(list, i), sub, e));
        }
        return 0;
    }
    if ((!strcmp(type, "TemplateProcessing") || !strcmp(type, "RobertaProcessing") ||
         !strcmp(type, "BertProcessing")) && (t->adds_bos || t->adds_eos))
        return tok_bad(t, e, path, "a second post_processor that adds special tokens (%s) is not supported", type);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_array_get(json_object_get(j, "cls"), 1), *sep = json_array_get(json_object_get(j, "sep"), 1);
        if (!json_is_integer(cls) || !json_is_integer(sep) || json_integer_value(cls) < 0 ||
            json_integer_value(cls) > INT32_MAX || json_integer_value(sep) < 0 || json_integer_value(sep) > INT32_MAX)
            return tok_bad(t, e, path, "%s needs \"cls\" and \"sep\" as [token, id] with ids of the vocabulary", type);
        t->bos_id = (int32_t)json_integer_value(cls);
        t->eos_id = (int32_t)json_integer_value(sep);
        t->adds_bos = t->adds_eos = 1;
        return 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        /* Only the single-sequence template matters (snug encodes one sequence); snug adds what it says as one BOS
         * and one EOS, so the template must be [special]? $A [special]? with one id per special token. */
        json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        if (!json_is_array(single))
            return tok_bad(t, e, path, "TemplateProcessing needs a \"single\" list");
        int seen_a = 0, before = 0, after = 0;
        snprintf(sub, sizeof sub, "%s.single", path);
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *item = json_array_get(single, i), *sp = json_object_get(item, "SpecialToken");
            json_t *seq = json_object_get(item, "Sequence");
            if (seq) {
                json_t *sid = json_object_get(seq, "id");
                if (seen_a || !json_is_string(sid) || strcmp(json_string_value(sid), "A"))
                    return tok_bad(t, e, sub, "entry %zu: a single-sequence template holds the sequence $A once "
                                   "(snug does not support this template)", i);
                seen_a = 1;
                continue;
            }
            json_t *name = json_object_get(sp, "id");
            if (!json_is_string(name))
                return tok_bad(t, e, sub, "entry %zu is neither a SpecialToken nor a Sequence", i);
            json_t *ids = json_object_get(json_object_get(specials, json_string_value(name)), "ids");
            if (json_is_array(ids) && json_array_size(ids) > 1)
                return tok_bad(t, e, sub, "special token \"%s\" stands for %zu ids; snug supports templates whose "
                               "special tokens are one id each", json_string_value(name), json_array_size(ids));
            int32_t id = -1;
            SNUG_TRY(template_id(t, specials, json_string_value(name), sub, &id, e));
            if (id < 0)
                continue; /* no ids: it adds nothing */
            if (seen_a ? after++ : before++)
                return tok_bad(t, e, sub, "more than one special token %s $A; snug supports templates that add at "
                               "most one before the sequence (a BOS) and one after it (an EOS)",
                               seen_a ? "after" : "before");
            if (!seen_a) {
                t->bos_id = id;
                t->adds_bos = 1;
            } else {
                t->eos_id = id;
                t->adds_eos = 1;
            }
        }
        if (!seen_a)
            return tok_bad(t, e, sub, "the single-sequence template has no $A");
        return 0;
    }
    return tok_bad(t, e, path,
                   "post_processor type \"%s\" is not supported (supported: TemplateProcessing, RobertaProcessing, "
                   "BertProcessing, ByteLevel, Sequence)",
                   type);
}

/* ---- loading ---- */

static uint64_t fnv1a64(const char *s, size_t n) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int build_ids(snug_tokenizer *t, snug_error *e) {
    int32_t n = t->vocab_ids;
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].id + 1 > n)
            n = t->added[i].id + 1;
    if (!(t->id_tok = calloc((size_t)n + 1, sizeof *t->id_tok)))
        return tok_oom(e);
    t->nids = n;
    memcpy(t->id_tok, t->vocab, (size_t)t->vocab_ids * sizeof *t->id_tok);
    /* `tokenizers` 0.23 maps the id of a normalized token to its normalized text (id_to_token, decode) */
    for (size_t i = 0; i < t->nadded; i++) {
        const tok_added *a = &t->added[i];
        t->id_tok[a->id] = a->normalized ? (tok_str){a->norm, (uint32_t)a->norm_len}
                                         : (tok_str){a->content, (uint32_t)a->len};
    }
    return 0;
}

static int load_json(snug_tokenizer *t, const char *json, size_t len, snug_error *e) {
    json_error_t jerr;
    json_t *root = snug_json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    if (!root)
        return snug_fail(e, SNUG_EINPUT, "%s:%d:%d: not valid JSON: %s", t->name, jerr.line, jerr.column, jerr.text);
    int rc = 0;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(root))
        rc = tok_bad(t, e, "", "the top level must be a JSON object");
    else if (!model)
        rc = tok_bad(t, e, "", "no \"model\": this is not a tokenizer.json (expected keys: model, added_tokens, "
                               "normalizer, pre_tokenizer, decoder)");
    if (!rc)
        rc = tok_parse_model(t, model, e);
    if (!rc)
        rc = tok_parse_normalizer(t, json_object_get(root, "normalizer"), "normalizer", e);
    if (!rc)
        rc = tok_parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", e);
    if (!rc)
        rc = tok_parse_decoder(t, json_object_get(root, "decoder"), "decoder", e);
    if (!rc)
        rc = parse_post(t, json_object_get(root, "post_processor"), "post_processor", e);
    if (!rc)
        rc = parse_added(t, json_object_get(root, "added_tokens"), e);
    if (!rc)
        rc = normalize_added(t, e);
    if (!rc)
        rc = build_matcher(t, &t->raw, 0, e);
    if (!rc)
        rc = build_matcher(t, &t->normed, 1, e);
    if (!rc)
        rc = build_ids(t, e);
    /* the ids the post-processor adds to every sequence index the model's embedding: they must be tokens */
    if (!rc && ((t->adds_bos && t->bos_id >= t->nids) || (t->adds_eos && t->eos_id >= t->nids)))
        rc = tok_bad(t, e, "post_processor", "it adds token id %d, outside the vocabulary (ids 0..%d); give the "
                     "special tokens the ids they have in model.vocab or added_tokens",
                     t->adds_bos && t->bos_id >= t->nids ? t->bos_id : t->eos_id, t->nids - 1);
    json_decref(root);
    return rc;
}

/* Without a post-processor EOS or a tokenizer_config.json: the usual names, among the special tokens. */
static void guess_eos(snug_tokenizer *t) {
    static const char *names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
    for (int i = 0; i < 4 && t->eos_id < 0; i++)
        for (size_t k = 0; k < t->nadded; k++)
            if (t->added[k].special && !strcmp(t->added[k].content, names[i]))
                t->eos_id = t->added[k].id;
}

static snug_tokenizer *tok_new(const char *name, snug_error *e) {
    snug_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->name = tok_strndup(name, strlen(name)))) {
        free(t);
        tok_oom(e);
        return NULL;
    }
    t->bos_id = t->eos_id = t->unk_id = -1;
    tok_bytelevel_tables(t);
    return t;
}

int snug_tok_load_from_string(snug_tokenizer **out, const char *json, const char *name_for_errors, snug_error *e) {
    *out = NULL;
    snug_tokenizer *t = tok_new(name_for_errors ? name_for_errors : "tokenizer.json", e);
    if (!t)
        return SNUG_ENOMEM;
    size_t len = strlen(json);
    t->hash = fnv1a64(json, len);
    int rc = load_json(t, json, len, e);
    if (rc) {
        snug_tok_free(t);
        return rc;
    }
    guess_eos(t);
    *out = t;
    return 0;
}

static int read_file(const char *path, char **buf, size_t *len, snug_error *e) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return snug_fail(e, errno == ENOENT ? SNUG_EINPUT : SNUG_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || !(*buf = malloc((size_t)st.st_size + 1))) {
        fclose(f);
        return snug_fail(e, SNUG_EIO, "cannot read %s: %s", path, strerror(errno));
    }
    *len = fread(*buf, 1, (size_t)st.st_size, f);
    int bad = *len != (size_t)st.st_size || ferror(f);
    fclose(f);
    if (bad) {
        free(*buf);
        return snug_fail(e, SNUG_EIO, "cannot read %s: short read", path);
    }
    (*buf)[*len] = '\0';
    return 0;
}

/* eos_token of a tokenizer_config.json: a string or {"content": ...}. */
static int config_eos(snug_tokenizer *t, const char *path, snug_error *e) {
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode))
        return 0;
    char *text = NULL;
    size_t len = 0;
    SNUG_TRY(read_file(path, &text, &len, e));
    json_error_t jerr;
    json_t *root = snug_json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root)
        return snug_fail(e, SNUG_EINPUT, "%s:%d:%d: not valid JSON: %s", path, jerr.line, jerr.column, jerr.text);
    json_t *eos = json_object_get(root, "eos_token");
    if (json_is_object(eos))
        eos = json_object_get(eos, "content");
    if (json_is_string(eos))
        t->eos_id = snug_tok_token_id(t, json_string_value(eos));
    json_decref(root);
    return 0;
}

void tok_paths(const char *path, char *file, size_t nfile, char *dir, size_t ndir) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(dir, ndir, "%s", path);
        snprintf(file, nfile, "%s/tokenizer.json", path);
    } else {
        snprintf(file, nfile, "%s", path);
        const char *slash = strrchr(path, '/');
        snprintf(dir, ndir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    }
}

int snug_tok_load(snug_tokenizer **out, const char *path, snug_error *e) {
    *out = NULL;
    char file[4200], dir[4200];
    tok_paths(path, file, sizeof file, dir, sizeof dir);
    char *buf = NULL;
    size_t len = 0;
    SNUG_TRY(read_file(file, &buf, &len, e));
    int rc = tok_load_text(out, file, dir, buf, len, e);
    free(buf);
    return rc;
}

int tok_load_text(snug_tokenizer **out, const char *file, const char *dir, const char *buf, size_t len,
                  snug_error *e) {
    *out = NULL;
    snug_tokenizer *t = tok_new(file, e);
    if (!t)
        return SNUG_ENOMEM;
    t->hash = fnv1a64(buf, len);
    int rc = load_json(t, buf, len, e);
    if (!rc && !t->adds_eos) {
        char cfg[4300];
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
        rc = config_eos(t, cfg, e);
    }
    if (!rc)
        guess_eos(t);
    if (rc) {
        snug_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* The file a path names: itself, or the tokenizer.json of a folder. */
static void tokenizer_file(const char *path, char *file, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(file, n, "%s/tokenizer.json", path);
    else
        snprintf(file, n, "%s", path);
}

int snug_tok_vocab_size_of_file(const char *path, int *out, snug_error *e) {
    char file[4200];
    tokenizer_file(path, file, sizeof file);
    char *buf = NULL;
    size_t len = 0;
    SNUG_TRY(read_file(file, &buf, &len, e));
    json_error_t jerr;
    json_t *root = snug_json_loadb(buf, len, JSON_ALLOW_NUL, &jerr);
    free(buf);
    if (!root)
        return snug_fail(e, SNUG_EINPUT, "%s:%d:%d: not valid JSON: %s", file, jerr.line, jerr.column, jerr.text);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab"), *v;
    json_int_t most = -1;
    const char *key;
    size_t i;
    if (json_is_array(vocab)) /* Unigram: [[piece, score], ...], the ids are the places */
        most = (json_int_t)json_array_size(vocab) - 1;
    json_object_foreach(vocab, key, v) {
        if (json_is_integer(v) && json_integer_value(v) > most)
            most = json_integer_value(v);
    }
    json_array_foreach(json_object_get(root, "added_tokens"), i, v) {
        json_t *id = json_object_get(v, "id");
        if (json_is_integer(id) && json_integer_value(id) > most)
            most = json_integer_value(id);
    }
    json_decref(root);
    if (most < 0 || most >= 1 << 24)
        return snug_fail(e, SNUG_EINPUT, "%s: no model.vocab whose ids give a vocabulary size (0 < size <= 2^24)",
                         file);
    *out = (int)most + 1;
    return 0;
}

void snug_tok_free(snug_tokenizer *t) {
    if (!t)
        return;
    tok_free_model(t);
    tok_free_pipeline(t);
    for (size_t i = 0; i < t->nadded; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    free(t->raw.pat);
    free(t->normed.pat);
    free(t->id_tok);
    free(t->name);
    free(t);
}

/* ---- encoding ---- */

static int encode_normalized(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, int at_start) {
    if (t->npre == 0)
        return tok_bpe(t, c, s, len);
    tok_pieces *ps;
    if (tok_pre_tokenize(t, c, s, len, at_start, &ps))
        return -1;
    for (size_t i = 0; i < ps->n; i++)
        if (tok_bpe(t, c, ps->text.p + ps->v[i].off, ps->v[i].len))
            return -1;
    return 0;
}

static int encode_segment(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, int at_start, int stage);

static int encode_gap(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, int at_start, int stage) {
    if (len == 0)
        return 0;
    if (stage == 1)
        return encode_normalized(t, c, s, len, at_start);
    const char *ns;
    size_t nl;
    if (tok_normalize(t, c, s, len, &ns, &nl))
        return -1;
    return nl ? encode_segment(t, c, ns, nl, at_start, 1) : 0;
}

/* stage 0: s is raw text, cut out the non-normalized added tokens and normalize the rest; stage 1: s is normalized
 * text, cut out the normalized added tokens and pre-tokenize the rest. */
static int encode_segment(const snug_tokenizer *t, tok_ctx *c, const char *s, size_t len, int at_start, int stage) {
    const tok_matcher *m = stage == 0 ? &t->raw : &t->normed;
    size_t done = 0; /* everything before this is handled */
    for (size_t i = 0; m->n && i < len;) {
        unsigned char b = (unsigned char)s[i];
        uint32_t k = m->first[b], kend = m->first[b + 1];
        size_t plen = 0;
        const tok_added *a = NULL;
        for (; k < kend; k++) { /* longest first */
            const char *p = pat_text(t, m, m->pat[k], &plen);
            if (plen <= len - i && memcmp(s + i, p, plen) == 0) {
                a = &t->added[m->pat[k]];
                break;
            }
        }
        if (!a) {
            i++;
            continue;
        }
        size_t start = i, stop = i + plen;
        i = stop; /* the matcher moves on from the match itself, whatever strip does below */
        int l;
        if (a->single_word) {
            int before = start > 0 && is_word_char(tok_utf8_get(s + prev_char(s, start), &l));
            int after = stop < len && is_word_char(tok_utf8_get(s + stop, &l));
            if (before || after)
                continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t j = prev_char(s, ns);
                if (!tok_is_white_space(tok_utf8_get(s + j, &l)))
                    break;
                ns = j;
            }
            start = ns > done ? ns : done;
        }
        if (a->rstrip)
            while (stop < len && tok_is_white_space(tok_utf8_get(s + stop, &l)))
                stop += (size_t)l;
        if (done < start && encode_gap(t, c, s + done, start - done, at_start && done == 0, stage))
            return -1;
        if (tok_emit(c, a->id))
            return -1;
        done = stop;
    }
    if (done < len)
        return encode_gap(t, c, s + done, len - done, at_start && done == 0, stage);
    return 0;
}

int snug_tok_encode(const snug_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                    snug_error *e) {
    size_t n0 = *n;
    tok_ctx c;
    if (tok_ctx_init(&c, e))
        return -1;
    c.ids = ids;
    c.n = n;
    c.cap = cap;
    int rc = tok_utf8_sanitize(text, len, &c.clean);
    if (rc < 0)
        tok_oom(e);
    else {
        if (rc == 1) {
            text = c.clean.p;
            len = c.clean.n;
        }
        rc = encode_segment(t, &c, text, len, 1, 0);
    }
    tok_ctx_free(&c);
    if (!rc && *n - n0 > INT_MAX)
        rc = snug_fail(e, SNUG_EINPUT, "%s: encoding %zu bytes gave more than 2^31 ids; encode smaller pieces",
                       t->name, len);
    if (rc) {
        *n = n0;
        return -1;
    }
    return (int)(*n - n0);
}

int snug_tok_decode(const snug_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len,
                    snug_error *e) {
    *text = NULL;
    *len = 0;
    tok_str *toks = malloc((n + 1) * sizeof *toks);
    if (!toks)
        return tok_oom(e);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->nids || !t->id_tok[ids[i]].p) {
            free(toks);
            return snug_fail(e, SNUG_EINPUT, "%s: decoding: id %d (position %zu) is not in the vocabulary (size %d)",
                             t->name, (int)ids[i], i, t->nids);
        }
        toks[i] = t->id_tok[ids[i]];
    }
    tok_buf out = {0};
    int rc = tok_decode_tokens(t, toks, n, &out, e);
    free(toks);
    if (rc) {
        free(out.p);
        return rc;
    }
    *text = out.p;
    *len = out.n;
    return 0;
}

/* ---- queries ---- */

int snug_tok_vocab_size(const snug_tokenizer *t) {
    return t->nids;
}

int snug_tok_token_id(const snug_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, token, n) == 0)
            return t->added[i].id;
    return tok_vocab_get(t, token, n);
}

int snug_tok_is_added(const snug_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, token, n) == 0)
            return 1;
    return 0;
}

const char *snug_tok_id_to_token(const snug_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->nids ? t->id_tok[id].p : NULL;
}

int snug_tok_bos_id(const snug_tokenizer *t) {
    return t->adds_bos ? t->bos_id : -1;
}

int snug_tok_adds_bos(const snug_tokenizer *t) {
    return t->adds_bos;
}

int snug_tok_eos_id(const snug_tokenizer *t) {
    return t->eos_id;
}

int snug_tok_unk_id(const snug_tokenizer *t) {
    return t->unk_id;
}

int snug_tok_adds_eos(const snug_tokenizer *t) {
    return t->adds_eos;
}

uint64_t snug_tok_hash(const snug_tokenizer *t) {
    return t->hash;
}
