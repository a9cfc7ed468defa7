/* test_tokenizer.c: the tokenizer.json reader and BPE encoder/decoder on tiny hand-written tokenizers, one per family
 * (GPT-2 byte-level; Llama-3 style Split + ByteLevel with ignore_merges and NFC; SentencePiece-style with byte
 * fallback in its legacy and Metaspace forms), and on broken files. The expected ids were produced by Hugging Face
 * `tokenizers` 0.23 from the same JSON; tests/parity/test_tokenizer_parity.py does the same comparison at scale. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "data/tokenizer.h"

/* (a) GPT-2: ByteLevel with the GPT-2 regex, merges in the "a b" string form. */
static const char *GPT2 =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":23,\"content\":\"<|endoftext|>\",\"single_word\":false,"
    "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},"
    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":\"\","
    "\"end_of_word_suffix\":\"\",\"fuse_unk\":false,\"byte_fallback\":false,\"vocab\":{\"h\":0,\"e\":1,\"l\":2,"
    "\"o\":3,\"w\":4,\"r\":5,\"d\":6,\"!\":7,\"\\u0120\":8,\"'\":9,\"s\":10,\"t\":11,\"a\":12,\"he\":13,\"ll\":14,"
    "\"hell\":15,\"hello\":16,\"\\u0120w\":17,\"or\":18,\"\\u0120wor\":19,\"\\u0120worl\":20,\"\\u0120world\":21,"
    "\"'s\":22},\"merges\":[\"h e\",\"l l\",\"he ll\",\"hell o\",\"\\u0120 w\",\"o r\",\"\\u0120w or\","
    "\"\\u0120wor l\",\"\\u0120worl d\",\"' s\"]}}";

/* (b) Llama-3 style: NFC, Split(Llama-3 regex) + ByteLevel(use_regex=false), ignore_merges, merges as pairs, BOS
 * from TemplateProcessing. "\u0120world" is in the vocabulary but no merge builds it. */
static const char *LLAMA3 =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":16,\"content\":\"<|begin_of_text|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":17,\"content\":\"<|end_of_text|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
    "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\","
    "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{"
    "\"<|begin_of_text|>\":{\"id\":\"<|begin_of_text|>\",\"ids\":[16],\"tokens\":[\"<|begin_of_text|>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":true,"
    "\"vocab\":{\"h\":0,\"e\":1,\"l\":2,\"o\":3,\"w\":4,\"r\":5,\"d\":6,\"\\u0120\":7,\"he\":8,\"ll\":9,\"hell\":10,"
    "\"hello\":11,\"\\u0120world\":12,\"\\u00c3\":13,\"\\u00a9\":14,\"\\u00c3\\u00a9\":15},"
    "\"merges\":[[\"h\",\"e\"],[\"l\",\"l\"],[\"he\",\"ll\"],[\"hell\",\"o\"],[\"\\u00c3\",\"\\u00a9\"]]}}";

/* (c) SentencePiece style: <unk> <s> </s>, <0x00>..<0xFF> at 3..258, then "\u2581" h i "\u2581h" "\u2581hi". The
 * pipeline (normalizer / pre_tokenizer) and byte_fallback are filled in per test. */
static char *sp_json(const char *normalizer, const char *pre_tokenizer, int byte_fallback) {
    size_t cap = 40000, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"normalized\":false,\"special\":true},"
                          "{\"id\":1,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
                          "{\"id\":2,\"content\":\"</s>\",\"normalized\":false,\"special\":true}],"
                          "\"normalizer\":%s,\"pre_tokenizer\":%s,"
                          "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                          "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                          "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
                          "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
                          "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
                          "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
                          "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":%s,"
                          "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2",
                          normalizer, pre_tokenizer, byte_fallback ? "true" : "false");
    for (int b = 0; b < 256; b++)
        n += (size_t)snprintf(s + n, cap - n, ",\"<0x%02X>\":%d", b, 3 + b);
    snprintf(s + n, cap - n,
             ",\"\\u2581\":259,\"h\":260,\"i\":261,\"\\u2581h\":262,\"\\u2581hi\":263},"
             "\"merges\":[\"\\u2581 h\",\"\\u2581h i\"]}}");
    return s;
}

static const char *SP_LEGACY_NORM = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
                                    "\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":"
                                    "\"\\u2581\"}]}";
static const char *SP_METASPACE = "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\","
                                  "\"split\":false}";

/* Encodes text and compares with the expected ids (-1 ends the list). */
static int ids_are(const snug_tokenizer *t, const char *text, size_t len, const int *want) {
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    snug_error e = {0};
    int got = snug_tok_encode(t, text, len, &ids, &n, &cap, &e);
    int ok = got >= 0 && (size_t)got == n;
    size_t k = 0;
    for (; ok && want[k] >= 0; k++)
        ok = k < n && ids[k] == want[k];
    ok = ok && k == n;
    if (!ok) {
        fprintf(stderr, "  encode(\"%.*s\") = [", (int)len, text);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
        fprintf(stderr, "] %s\n", e.msg);
    }
    free(ids);
    return ok;
}

static int decodes_to(const snug_tokenizer *t, const int *ids_in, const char *want) {
    int32_t ids[64];
    size_t n = 0;
    while (ids_in[n] >= 0)
        ids[n] = ids_in[n], n++;
    char *text = NULL;
    size_t len = 0;
    snug_error e = {0};
    int ok = snug_tok_decode(t, ids, n, &text, &len, &e) == 0 && len == strlen(want) && !memcmp(text, want, len);
    if (!ok)
        fprintf(stderr, "  decode gave \"%s\", want \"%s\" %s\n", text ? text : "(null)", want, e.msg);
    free(text);
    return ok;
}

static snug_tokenizer *load(const char *json) {
    snug_tokenizer *t = NULL;
    snug_error e = {0};
    if (snug_tok_load_from_string(&t, json, "test.json", &e))
        fprintf(stderr, "  load failed: %s\n", e.msg);
    return t;
}

#define ENC(t, s, ...) CHECK(ids_are(t, s, sizeof(s) - 1, (const int[]){__VA_ARGS__, -1}))

static void test_gpt2(void) {
    snug_tokenizer *t = load(GPT2);
    CHECK(t != NULL);
    if (!t)
        return;
    ENC(t, "hello world", 16, 21);
    ENC(t, "hello world<|endoftext|>hello's", 16, 21, 23, 16, 22);
    ENC(t, "hello  world!!", 16, 8, 21, 7, 7);
    ENC(t, "h\xc3\xa9llo", 0, 14, 3); /* bytes with no token and no unk: dropped, as upstream */
    ENC(t, "a\xff" "b", 12);            /* invalid UTF-8 -> U+FFFD, whose bytes have no tokens here */
    CHECK(ids_are(t, "", 0, (const int[]){-1}));
    CHECK(decodes_to(t, (const int[]){16, 8, 21, 7, 23, -1}, "hello  world!<|endoftext|>"));
    CHECK(snug_tok_vocab_size(t) == 24);
    CHECK(snug_tok_token_id(t, "<|endoftext|>") == 23);
    CHECK(snug_tok_token_id(t, "\xc4\xa0world") == 21);
    CHECK(snug_tok_token_id(t, "nope") == -1);
    CHECK(snug_tok_id_to_token(t, 16) && !strcmp(snug_tok_id_to_token(t, 16), "hello"));
    CHECK(snug_tok_id_to_token(t, 99) == NULL);
    CHECK(snug_tok_bos_id(t) == -1 && !snug_tok_adds_bos(t));
    CHECK(snug_tok_eos_id(t) == 23); /* the usual name, among the special tokens */

    /* appending: a second encode continues after the first */
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    snug_error e = {0};
    CHECK(snug_tok_encode(t, "hello", 5, &ids, &n, &cap, &e) == 1);
    CHECK(snug_tok_encode(t, " world", 6, &ids, &n, &cap, &e) == 1);
    CHECK(n == 2 && ids[0] == 16 && ids[1] == 21);
    free(ids);

    /* decoding an id outside the vocabulary is an error, not a silent drop */
    char *text = NULL;
    size_t len;
    CHECK(snug_tok_decode(t, (const int32_t[]){16, 500}, 2, &text, &len, &e) == SNUG_EINPUT);
    CHECKF(strstr(e.msg, "500") && strstr(e.msg, "test.json"), "%s", e.msg);
    CHECK(text == NULL);

    /* the hash follows the bytes */
    snug_tokenizer *same = load(GPT2);
    CHECK(same && snug_tok_hash(same) == snug_tok_hash(t));
    snug_tok_free(same);
    snug_tokenizer *other = load(LLAMA3);
    CHECK(other && snug_tok_hash(other) != snug_tok_hash(t));
    snug_tok_free(other);
    snug_tok_free(t);
}

static void test_llama3(void) {
    snug_tokenizer *t = load(LLAMA3);
    CHECK(t != NULL);
    if (!t)
        return;
    ENC(t, "hello world", 11, 12); /* "\u0120world" whole, thanks to ignore_merges */
    ENC(t, "hello worldworld", 11, 7, 4, 3, 5, 2, 6, 4, 3, 5, 2, 6);
    ENC(t, "<|begin_of_text|>hello", 16, 11);
    ENC(t, "e\xcc\x81", 15); /* NFC: e + combining acute -> U+00E9 -> bytes C3 A9 -> one merge */
    ENC(t, "\xc3\xa9", 15);
    CHECK(snug_tok_bos_id(t) == 16 && snug_tok_adds_bos(t));
    CHECK(snug_tok_eos_id(t) == 17);
    CHECK(decodes_to(t, (const int[]){16, 11, 12, 15, -1}, "<|begin_of_text|>hello world\xc3\xa9"));
    snug_tok_free(t);
}

static void test_sentencepiece(void) {
    char *json = sp_json(SP_LEGACY_NORM, "null", 1);
    snug_tokenizer *t = load(json);
    free(json);
    CHECK(t != NULL);
    if (t) {
        ENC(t, "hi", 263);
        ENC(t, "hi \xe6\x97\xa5", 263, 259, 233, 154, 168); /* byte fallback: E6 97 A5 */
        ENC(t, "<s>hi", 1, 263); /* legacy: the "\u2581" is prepended after special tokens too */
        ENC(t, "hi</s>hi", 263, 2, 263);
        CHECK(decodes_to(t, (const int[]){263, 259, 233, 154, 168, -1}, "hi \xe6\x97\xa5"));
        CHECK(decodes_to(t, (const int[]){1, 263, -1}, "<s> hi"));
        CHECK(decodes_to(t, (const int[]){263, 233, 154, -1}, "hi\xef\xbf\xbd\xef\xbf\xbd")); /* cut bytes */
        CHECK(snug_tok_bos_id(t) == 1 && snug_tok_adds_bos(t));
        CHECK(snug_tok_eos_id(t) == 2);
        CHECK(snug_tok_vocab_size(t) == 264);
        snug_tok_free(t);
    }

    json = sp_json("null", SP_METASPACE, 1);
    t = load(json);
    free(json);
    CHECK(t != NULL);
    if (t) {
        ENC(t, "hi", 263);
        ENC(t, "hi \xe6\x97\xa5", 263, 259, 233, 154, 168);
        ENC(t, "<s>hi", 1, 260, 261); /* prepend_scheme first: no "\u2581" after a special token */
        ENC(t, "hi</s>hi", 263, 2, 260, 261);
        snug_tok_free(t);
    }

    json = sp_json(SP_LEGACY_NORM, "null", 0);
    t = load(json);
    free(json);
    CHECK(t != NULL);
    if (t) {
        /* no byte fallback: unknown characters fuse into one <unk> */
        ENC(t, "hi \xe6\x97\xa5\xe6\x9c\xac", 263, 259, 0);
        ENC(t, "hi\xe6\x97\xa5\xe6\x9c\xachi", 263, 0, 260, 261);
        snug_tok_free(t);
    }
}

/* Loading a folder: tokenizer.json, and the eos_token of tokenizer_config.json beside it. */
static void test_folder(void) {
    char dir[] = "/tmp/snug_tok_XXXXXX", path[256];
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    fputs(LLAMA3, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    fputs("{\"eos_token\": {\"content\": \"<|begin_of_text|>\"}, \"add_bos_token\": true}", f);
    fclose(f);
    snug_tokenizer *t = NULL;
    snug_error e = {0};
    CHECKF(snug_tok_load(&t, dir, &e) == 0, "%s", e.msg);
    CHECK(t && snug_tok_eos_id(t) == 16);
    snug_tok_free(t);
    remove(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    remove(path);
    rmdir(dir);

    t = NULL;
    CHECK(snug_tok_load(&t, "/nonexistent/snug/tokenizer.json", &e) == SNUG_EINPUT);
    CHECKF(strstr(e.msg, "/nonexistent/snug/tokenizer.json") != NULL, "%s", e.msg);
    CHECK(t == NULL);
}

/* Numbers beyond the range of a 64-bit integer, as transformers writes them (model_max_length defaults to
 * int(1e30)): a folder with such a tokenizer_config.json, and one in an unused key of tokenizer.json, still loads. */
static void test_huge_numbers(void) {
    char dir[] = "/tmp/snug_tok_XXXXXX", tj[256], tc[256];
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(tj, "w");
    fprintf(f, "{\"truncation_max\": -99999999999999999999999,\n%s", LLAMA3 + 1);
    fclose(f);
    f = fopen(tc, "w");
    fputs("{\"add_bos_token\": true, \"clean_up_tokenization_spaces\": false,\n"
          " \"eos_token\": \"<|begin_of_text|>\",\n"
          " \"model_max_length\": 1000000000000000019884624838656, \"tokenizer_class\": \"PreTrainedTokenizerFast\"}\n",
          f);
    fclose(f);
    snug_tokenizer *t = NULL;
    snug_error e = {0};
    CHECKF(snug_tok_load(&t, dir, &e) == 0, "%s", e.msg);
    CHECK(t && snug_tok_eos_id(t) == 16);
    if (t)
        ENC(t, "hello world", 11, 12);
    snug_tok_free(t);

    /* an error after a huge number is still placed where it is in the file */
    f = fopen(tc, "w");
    fputs("{\"model_max_length\": 1000000000000000019884624838656, \"eos_token\": }\n", f);
    fclose(f);
    t = NULL;
    CHECK(snug_tok_load(&t, dir, &e) == SNUG_EINPUT && t == NULL);
    char where[300];
    snprintf(where, sizeof where, "%s:1:68:", tc);
    CHECKF(strstr(e.msg, where) != NULL, "want '%s' in: %s", where, e.msg);
    remove(tc);
    remove(tj);
    rmdir(dir);
}

/* A broken file fails with SNUG_EINPUT and a message that names the file, the place and the problem. */
static void bad(const char *json, const char *want1, const char *want2) {
    snug_tokenizer *t = (snug_tokenizer *)1;
    snug_error e = {0};
    int rc = snug_tok_load_from_string(&t, json, "bad.json", &e);
    CHECKF(rc == SNUG_EINPUT && t == NULL, "rc %d for %.60s", rc, json);
    CHECKF(strstr(e.msg, "bad.json") && strstr(e.msg, want1) && (!want2 || strstr(e.msg, want2)), "message: %s",
           e.msg);
    CHECKF(!strchr(e.msg, '\n'), "message has a newline: %s", e.msg);
}

#define MODEL_OK "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

static void test_bad_input(void) {
    bad("{\"model\": {\"type\": \"BPE\",\n \"vocab\": {", "bad.json:2:", "JSON");       /* line:column */
    bad("[1, 2]", "top level", NULL);
    bad("{\"normalizer\": null}", "\"model\"", NULL);
    bad("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", "WordPiece", "model.type");
    bad("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "Unigram", "not supported");
    bad("{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"BertNormalizer\"}]},"
        MODEL_OK "}",
        "BertNormalizer", "normalizer.normalizers[1]");
    bad("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(ab\"},\"behavior\":\"Isolated\",\"invert\":false}]}," MODEL_OK "}",
        "pre_tokenizer.pretokenizers[0].pattern", "regex");
    bad("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},{\"type\":\"Wordish\"}]},"
        MODEL_OK "}", "pre_tokenizer type \"Wordish\" is not supported", "pre_tokenizer.pretokenizers[1]");
    bad("{\"pre_tokenizer\":{\"type\":\"Punctuation\",\"behavior\":\"Sideways\"}," MODEL_OK "}", "Sideways",
        "pre_tokenizer");
    bad("{\"pre_tokenizer\":{\"type\":\"FixedLength\",\"length\":0}," MODEL_OK "}", "length", "pre_tokenizer");
    bad("{\"pre_tokenizer\":{\"type\":\"CharDelimiterSplit\",\"delimiter\":\"ab\"}," MODEL_OK "}", "delimiter",
        "single character");
    /* a template snug could not add as one BOS and one EOS is refused, not half read */
    bad("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
        "{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],"
        "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1]}}}," MODEL_OK "}",
        "more than one special token before $A", "post_processor.single");
    bad("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
        "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1,2]}}}," MODEL_OK "}",
        "stands for 2 ids", "post_processor.single");
    bad("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"A\"}},"
        "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{}}," MODEL_OK "}", "$A once", "post_processor.single");
    bad("{\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"RobertaProcessing\",\"sep\":[\"b\",1],"
        "\"cls\":[\"a\",0]},{\"type\":\"BertProcessing\",\"sep\":[\"b\",1],\"cls\":[\"a\",0]}]}," MODEL_OK "}",
        "second post_processor", "post_processor.processors[1]");
    bad("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}," MODEL_OK
        "}",
        "Sideways", "pre_tokenizer");
    bad("{\"decoder\":{\"type\":\"WordPiece\"}," MODEL_OK "}", "WordPiece", "decoder");
    bad("{\"post_processor\":{\"type\":\"Magic\"}," MODEL_OK "}", "Magic", "post_processor");
    /* the ids a post-processor adds index the embedding: outside the vocabulary (3 ids here) they are refused */
    bad("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
        "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[3]}}}," MODEL_OK "}",
        "token id 3, outside the vocabulary (ids 0..2)", "post_processor");
    bad("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
        "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[4294967297]}}},"
        MODEL_OK "}", "4294967297, not a token id", "post_processor.single");
    bad("{\"post_processor\":{\"type\":\"RobertaProcessing\",\"sep\":[\"</s>\",2],\"cls\":[\"<s>\",7]}," MODEL_OK "}",
        "token id 7, outside", "post_processor");
    bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", "\"ab\"", "model.merges");
    bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b c\"]}}", "entry 0",
        "model.merges");
    bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]}}", "\"a\"", "model.vocab");
    /* an id past any vocabulary would size the id tables by it (2^31 entries: an out-of-memory, not this error) */
    bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":2147483646},\"merges\":[]}}", "is 2147483646; snug reads "
        "vocabularies of ids below 2^24", "model.vocab");
    bad("{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}}", "dropout", NULL);
    bad("{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}," MODEL_OK "}", "replacement",
        "single character");
    bad("{\"added_tokens\":[{\"id\":3}]," MODEL_OK "}", "added_tokens", "content");

    /* unk_token named but missing from the vocabulary: loads (as upstream), fails when it is needed */
    snug_tokenizer *t =
        load("{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"a\":0},\"merges\":[]}}");
    CHECK(t != NULL);
    if (t) {
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        snug_error e = {0};
        CHECK(snug_tok_encode(t, "aa", 2, &ids, &n, &cap, &e) == 2);
        CHECK(snug_tok_encode(t, "ab", 2, &ids, &n, &cap, &e) == -1 && n == 2);
        CHECKF(strstr(e.msg, "<unk>") != NULL, "%s", e.msg);
        free(ids);
        snug_tok_free(t);
    }
}

/* Added-token flags: lstrip/rstrip eat the whitespace around the match, single_word only matches whole words. */
static void test_added_flags(void) {
    snug_tokenizer *t = load(
        "{\"added_tokens\":[{\"id\":3,\"content\":\"<m>\",\"lstrip\":true,\"rstrip\":true,\"normalized\":false,"
        "\"special\":true},{\"id\":4,\"content\":\"ab\",\"single_word\":true,\"normalized\":false}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\" \":2},\"merges\":[]}}");
    CHECK(t != NULL);
    if (!t)
        return;
    ENC(t, "a  <m>  b", 0, 3, 1);
    ENC(t, "ab a ab", 4, 2, 0, 2, 4);
    ENC(t, "aab ab", 0, 0, 1, 2, 4); /* "aab": not a single word */
    snug_tok_free(t);
}

/* Post-processors read for their BOS/EOS, a vocabulary where two tokens share an id, and the regex rewrite that
 * gives \s Oniguruma's meaning (U+180E is not a space there, while PCRE2 alone would say it is). */
static void test_odds_and_ends(void) {
    snug_tokenizer *t = load(
        "{\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},"
        "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],"
        "\"special_tokens\":{\"<s>\":{\"ids\":[1]},\"</s>\":{\"ids\":[2]}}}]}," MODEL_OK "}");
    CHECK(t && snug_tok_bos_id(t) == 1 && snug_tok_adds_bos(t) && snug_tok_eos_id(t) == 2 && snug_tok_adds_eos(t));
    snug_tok_free(t);
    t = load("{\"post_processor\":{\"type\":\"RobertaProcessing\",\"sep\":[\"</s>\",2],\"cls\":[\"<s>\",0]},"
             MODEL_OK "}");
    CHECK(t && snug_tok_bos_id(t) == 0 && snug_tok_eos_id(t) == 2);
    snug_tok_free(t);

    t = load("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0,\"c\":1},\"merges\":[]}}");
    CHECK(t != NULL);
    if (t) {
        ENC(t, "abc", 0, 0, 1);
        CHECK(snug_tok_vocab_size(t) == 2);
        snug_tok_free(t);
    }

    /* Split on \s+ (removed), then whole pieces by ignore_merges: "a" U+180E "b" stays one piece */
    t = load("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"Removed\","
             "\"invert\":false},\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,"
             "\"a\\u180eb\":2,\"a\\u00bdb\":3},\"merges\":[]}}");
    CHECK(t != NULL);
    if (t) {
        ENC(t, "a\xe1\xa0\x8e" "b", 2);
        ENC(t, "a\xc2\xa0" "b", 0, 1); /* U+00A0 is a space */
        snug_tok_free(t);
    }
    /* \w includes every Number (Oniguruma), so "a½b" is one word; \u00bd is Oniguruma's spelling of ½ */
    t = load("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+|\\\\u00bd\"},"
             "\"behavior\":\"Isolated\",\"invert\":false},\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,"
             "\"vocab\":{\"a\":0,\"b\":1,\"a\\u00bdb\":3,\"\\u00bd\":4,\"-\":5},\"merges\":[]}}");
    CHECK(t != NULL);
    if (t) {
        ENC(t, "a\xc2\xbd" "b", 3);
        ENC(t, "-\xc2\xbd-", 5, 4, 5);
        snug_tok_free(t);
    }
}

/* The character-class pre-tokenizers, on a vocabulary that holds whole pieces (ignore_merges): the ids show where
 * each one cuts. The expected ids are those of `tokenizers` 0.23 on the same files. */
static void pre_case(const char *pre, const char *text, const int *want) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"pre_tokenizer\":%s,\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,"
             "\"1\":2,\"2\":3,\"12\":4,\" \":5,\"!\":6,\"!!\":7,\"a!\":8,\"!b\":9,\"ab\":10,\"\u6771\":11,"
             "\"\u4eac\":12,\"\u6771\u4eac\":13},\"merges\":[]}}",
             pre);
    snug_tokenizer *t = load(json);
    CHECKF(t != NULL, "%s did not load", pre);
    if (t)
        CHECKF(ids_are(t, text, strlen(text), want), "%s on \"%s\"", pre, text);
    snug_tok_free(t);
}

static void test_pre_tokenizers(void) {
    pre_case("{\"type\":\"Digits\",\"individual_digits\":true}", "a12", (const int[]){0, 2, 3, -1});
    pre_case("{\"type\":\"Digits\",\"individual_digits\":false}", "a12", (const int[]){0, 4, -1});
    pre_case("{\"type\":\"Punctuation\",\"behavior\":\"Isolated\"}", "a!!b", (const int[]){0, 6, 6, 1, -1});
    pre_case("{\"type\":\"Punctuation\",\"behavior\":\"Removed\"}", "a!!b", (const int[]){0, 1, -1});
    pre_case("{\"type\":\"Punctuation\",\"behavior\":\"MergedWithPrevious\"}", "a!!b", (const int[]){8, 6, 1, -1});
    pre_case("{\"type\":\"Punctuation\",\"behavior\":\"MergedWithNext\"}", "a!!b", (const int[]){0, 6, 9, -1});
    pre_case("{\"type\":\"Punctuation\",\"behavior\":\"Contiguous\"}", "a!!b", (const int[]){0, 7, 1, -1});
    pre_case("{\"type\":\"Punctuation\"}", "a!!b", (const int[]){0, 6, 6, 1, -1}); /* Isolated by default */
    pre_case("{\"type\":\"Whitespace\"}", "ab !! 12", (const int[]){10, 7, 4, -1});
    pre_case("{\"type\":\"WhitespaceSplit\"}", "ab  a!", (const int[]){10, 8, -1});
    /* the text before the first change of script (a leading space) is dropped, as upstream drops it */
    pre_case("{\"type\":\"UnicodeScripts\"}", " ab\xe6\x9d\xb1\xe4\xba\xac", (const int[]){10, 13, -1});
    pre_case("{\"type\":\"CharDelimiterSplit\",\"delimiter\":\"b\"}", "abab", (const int[]){0, 0, -1});
    pre_case("{\"type\":\"FixedLength\",\"length\":2}", "ab12a", (const int[]){10, 4, 0, -1});
    pre_case("{\"type\":\"BertPreTokenizer\"}", "ab !!a", (const int[]){10, 6, 6, 0, -1});
    pre_case("{\"type\":\"Split\",\"pattern\":{\"String\":\"!\"},\"behavior\":\"Removed\",\"invert\":true}", "a!!b",
             (const int[]){6, 6, -1});
}

/* Nmt drops ASCII controls and reads tabs as spaces; BPEDecoder turns each suffix into a space, but in the last
 * token (as `tokenizers` 0.23 does on the same file) */
static void test_nmt_bpe_decoder(void) {
    snug_tokenizer *t = load("{\"normalizer\":{\"type\":\"Nmt\"},\"decoder\":{\"type\":\"BPEDecoder\","
                             "\"suffix\":\"</w>\"},\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":"
                             "{\"a</w>\":0,\"b</w>\":1,\"c\":2,\" \":3,\"x\":4},\"merges\":[]}}");
    CHECK(t != NULL);
    if (t) {
        ENC(t, "x\tx\x01x", 4, 3, 4, 4);
        CHECK(decodes_to(t, (const int[]){0, 2, 1, 0, -1}, "a cb a"));
        snug_tok_free(t);
    }
}

int main(void) {
    test_gpt2();
    test_llama3();
    test_sentencepiece();
    test_folder();
    test_huge_numbers();
    test_bad_input();
    test_added_flags();
    test_odds_and_ends();
    test_pre_tokenizers();
    test_nmt_bpe_decoder();
    return check_finish("test_tokenizer");
}
