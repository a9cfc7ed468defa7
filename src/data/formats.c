/* formats.c: the four dataset formats, from one JSON line to token ids and supervised flags (see formats.h for how a
 * unit of text is tokenized and where the supervision changes).
 *
 * Every line is parsed by jansson, which also rejects invalid UTF-8 and \u0000; each format then emits its pieces in
 * order. A template's special token (<|im_end|>, <|eot_id|>, ...) must be an added token of the tokenizer that encodes
 * to itself alone (snug_format_init checks each); with the byte-level stand-in, which has none, it is plain text. */
#include "data/formats.h"

#include "core/json_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The Alpaca prompt, as the Stanford Alpaca repository and Axolotl's `alpaca` type (AlpacaPrompter with
 * PromptStyle.instruct, src/axolotl/prompters.py) write it:
 *   with input:    ALPACA_SYSTEM + "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
 *   without input: ALPACA_SYSTEM_NO_INPUT + "### Instruction:\n{instruction}\n\n### Response:\n"
 * "Without input" means the field is absent, null or empty (Axolotl tests `if input:`). Like Axolotl, the prompt and
 * the output are tokenized separately and the EOS follows the output. */
static const char ALPACA_SYSTEM[] =
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
    "response that appropriately completes the request.\n\n";
static const char ALPACA_SYSTEM_NO_INPUT[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n";
static const char ALPACA_INSTRUCTION[] = "### Instruction:\n";
static const char ALPACA_INPUT[] = "\n\n### Input:\n";
static const char ALPACA_RESPONSE[] = "\n\n### Response:\n";

/* The chat templates' special tokens. chatml: "<|im_start|>" role "\n" content "<|im_end|>" "\n" per message (as
 * the ChatML template of Qwen2 and Axolotl's `chatml`). llama3: "<|begin_of_text|>" once, then
 * "<|start_header_id|>" role "<|end_header_id|>\n\n" content "<|eot_id|>" per message, content trimmed of leading and
 * trailing whitespace as Meta's Llama 3 template does (`message['content'] | trim`). */
static const char *const CHATML_SPECIALS[] = {"<|im_start|>", "<|im_end|>", NULL};
static const char *const LLAMA3_SPECIALS[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                              "<|eot_id|>", NULL};

static const char *const FORMAT_NAMES[] = {"completion", "alpaca", "chat", "pretokenized", "input_output"};
static const char *const TEMPLATE_NAMES[] = {"chatml", "llama3", "tokenizer_default",
                                             "tokenizer_default_fallback_chatml", "jinja",
                                             "tokenizer_default_fallback_llama3"};

const char *snug_data_format_name(snug_data_format f) {
    return (unsigned)f < sizeof FORMAT_NAMES / sizeof *FORMAT_NAMES ? FORMAT_NAMES[f] : "?";
}
const char *snug_chat_template_name(snug_chat_template t) {
    return (unsigned)t < sizeof TEMPLATE_NAMES / sizeof *TEMPLATE_NAMES ? TEMPLATE_NAMES[t] : "?";
}

/* ---- building an example ---- */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = nc;
    return 0;
}

void snug_example_free(snug_example *ex) {
    free(ex->ids);
    free(ex->sup);
    free(ex->text);
    free(ex->pieces);
    free(ex->tmp);
    free(ex->scratch);
    free(ex->dids);
    memset(ex, 0, sizeof *ex);
}

static int oom(snug_error *e) { return snug_fail(e, SNUG_ENOMEM, "out of host memory tokenizing"); }

static int add_piece(snug_example *ex, const char *s, size_t n, int32_t special, int sup, snug_error *e) {
    snug_piece *last = ex->np ? &ex->pieces[ex->np - 1] : NULL;
    if (grow((void **)&ex->text, &ex->tcap, ex->tlen + n, 1))
        return oom(e);
    memcpy(ex->text + ex->tlen, s, n);
    if (special < 0 && last && last->special < 0 && last->sup == sup) { /* the same run goes on */
        last->len += n;
    } else {
        if (grow((void **)&ex->pieces, &ex->pcap, ex->np + 1, sizeof *ex->pieces))
            return oom(e);
        ex->pieces[ex->np++] = (snug_piece){.off = ex->tlen, .len = n, .special = special, .sup = (uint8_t)sup};
    }
    ex->tlen += n;
    return 0;
}

static int put_text(const snug_format *f, snug_example *ex, const char *s, size_t n, int sup, snug_error *e) {
    (void)f;
    return n ? add_piece(ex, s, n, -1, sup, e) : 0;
}

static int put_str(const snug_format *f, snug_example *ex, const char *s, int sup, snug_error *e) {
    return put_text(f, ex, s, strlen(s), sup, e);
}

static int push_ids(snug_example *ex, const int32_t *ids, size_t n, int sup, snug_error *e) {
    if (!n) /* (ids may be NULL: a range that encoded to nothing) */
        return 0;
    if (grow((void **)&ex->ids, &ex->cap, ex->n + n, sizeof *ex->ids) ||
        grow((void **)&ex->sup, &ex->supcap, ex->n + n, 1))
        return oom(e);
    memcpy(ex->ids + ex->n, ids, n * sizeof *ids);
    memset(ex->sup + ex->n, sup, n);
    ex->n += n;
    return 0;
}

/* Tokenizes [a, b) of the pending text (or of `alt` when not NULL) into ex->tmp. drop_first / drop_last: the special
 * tokens the range starts or ends with, read for their context and dropped (-1: none). */
static int encode_range(const snug_format *f, snug_example *ex, const char *alt, size_t a, size_t b, int32_t drop_first,
                        int32_t drop_last, snug_error *e) {
    ex->tmpn = 0;
    const char *base = alt ? alt : ex->text;
    SNUG_TRY(f->enc->encode(f->enc->ctx, base + a, b - a, &ex->tmp, &ex->tmpn, &ex->tmpcap, e));
    size_t lo = 0, hi = ex->tmpn;
    if (drop_first >= 0 && (hi == lo || ex->tmp[lo++] != drop_first))
        return snug_fail(e, SNUG_EINPUT, "the tokenizer joins a template's special token with the text after it; "
                         "check its added_tokens");
    if (drop_last >= 0 && (hi == lo || ex->tmp[--hi] != drop_last))
        return snug_fail(e, SNUG_EINPUT, "the tokenizer joins a template's special token with the text before it; "
                         "check its added_tokens");
    if (hi > lo) /* (tmp is NULL while nothing was encoded) */
        memmove(ex->tmp, ex->tmp + lo, (hi - lo) * sizeof *ex->tmp);
    ex->tmpn = hi - lo;
    return 0;
}

/* Whether the text of [anchor] + J[0, t) is a prefix of want[0, nwant) (*exact: all of it). */
static int decodes_within(const snug_format *f, snug_example *ex, const int32_t *J, size_t t, int32_t anchor_id,
                          const char *want, size_t nwant, int *exact, snug_error *e) {
    size_t n = 0;
    if (grow((void **)&ex->dids, &ex->dcap, t + 1, sizeof *ex->dids))
        return oom(e), -1;
    if (anchor_id >= 0)
        ex->dids[n++] = anchor_id;
    memcpy(ex->dids + n, J, t * sizeof *J);
    char *text = NULL;
    size_t len = 0;
    if (f->enc->decode(f->enc->ctx, ex->dids, n + t, &text, &len, e)) {
        free(text);
        return -1;
    }
    int within = len <= nwant && !memcmp(text, want, len);
    *exact = within && len == nwant;
    free(text);
    return within;
}

/* Tokens [*lo, *hi) of the section J hold the change of supervision at text offset c: narrows them to the one token
 * that straddles it (or none, when a token ends exactly there), by decoding J's prefixes (a binary search: a longer
 * prefix stays within the text before c only while a shorter one does). */
static int pin_change(const snug_format *f, snug_example *ex, const int32_t *J, long anchor, size_t start, size_t c,
                      size_t *lo, size_t *hi, snug_error *e) {
    const snug_piece *P = ex->pieces;
    int32_t anchor_id = anchor >= 0 ? P[anchor].special : -1;
    const char *want = ex->text + start; /* the anchor's text (when there is one) is right before the section */
    size_t nwant = c - start, a = *lo, b = *hi; /* J[0, a) is within the text before c; find the largest such */
    int exact = 0, r;
    while (a < b) {
        size_t m = a + (b - a + 1) / 2;
        if ((r = decodes_within(f, ex, J, m, anchor_id, want, nwant, &exact, e)) < 0)
            return e->code ? e->code : SNUG_EINTERNAL;
        if (r)
            a = m;
        else
            b = m - 1;
    }
    if ((r = decodes_within(f, ex, J, a, anchor_id, want, nwant, &exact, e)) < 0)
        return e->code ? e->code : SNUG_EINTERNAL;
    if (!r) /* decode does not give the text back (a normalizer): keep the wider range */
        return 0;
    *lo = a;
    *hi = exact ? a : a + 1;
    return 0;
}

/* Tokenizes the text pieces [i, j) between two special tokens (anchor: the piece index of the one before, or -1)
 * and appends them, each token flagged as the piece it comes from (see formats.h for a straddling token). */
static int encode_section(const snug_format *f, snug_example *ex, size_t i, size_t j, long anchor, snug_error *e) {
    const snug_piece *P = ex->pieces;
    int32_t first = anchor >= 0 ? P[anchor].special : -1, last = j < ex->np ? P[j].special : -1;
    size_t start = anchor >= 0 ? P[anchor].off : P[i].off, end = P[j - 1].off + P[j - 1].len;
    size_t end_next = last >= 0 ? P[j].off + P[j].len : end;
    SNUG_TRY(encode_range(f, ex, NULL, start, end_next, first, last, e));
    size_t base = ex->n, nj = ex->tmpn;
    SNUG_TRY(push_ids(ex, ex->tmp, nj, P[i].sup, e));
    if (j - i == 1)
        return 0;
    /* the supervision changes at each piece start k in (i, j): find the token where it does */
    const int32_t *J = NULL;
    for (size_t k = i + 1; k < j; k++) {
        size_t c = P[k].off, lo, hi;
        SNUG_TRY(encode_range(f, ex, NULL, start, c, first, -1, e)); /* the text before the change */
        J = ex->ids + base;
        for (lo = 0; lo < ex->tmpn && lo < nj && ex->tmp[lo] == J[lo];)
            lo++;
        hi = lo;
        if (lo < ex->tmpn) { /* not a prefix: the text after the change, read in context, must end the section */
            size_t na = anchor >= 0 ? P[anchor].len : 0, nt = end_next - c;
            if (grow((void **)&ex->scratch, &ex->scap, na + nt, 1))
                return oom(e);
            if (na)
                memcpy(ex->scratch, ex->text + P[anchor].off, na);
            memcpy(ex->scratch + na, ex->text + c, nt);
            SNUG_TRY(encode_range(f, ex, ex->scratch, 0, na + nt, first, last, e));
            J = ex->ids + base;
            size_t s = 0;
            while (s < ex->tmpn && s < nj - lo && ex->tmp[ex->tmpn - 1 - s] == J[nj - 1 - s])
                s++;
            hi = nj - s;
        }
        if (hi > lo && f->enc->decode) /* which of them is the one that straddles it */
            SNUG_TRY(pin_change(f, ex, J, anchor, start, c, &lo, &hi, e));
        /* tokens [lo, hi) straddle the change: supervised when either side is; those after follow piece k */
        for (size_t t = lo; t < nj; t++)
            ex->sup[base + t] = t < hi ? (uint8_t)(ex->sup[base + t] | P[k].sup) : P[k].sup;
    }
    return 0;
}

/* Tokenizes the pending unit: special tokens as their ids, the text between them section by section. */
static int flush(const snug_format *f, snug_example *ex, snug_error *e) {
    int rc = 0;
    long anchor = -1;
    for (size_t i = 0; !rc && i < ex->np;) {
        const snug_piece *p = &ex->pieces[i];
        if (p->special >= 0) {
            rc = push_ids(ex, &p->special, 1, p->sup, e);
            anchor = (long)i++;
        } else if (!f->enc->special_id) { /* an encoder without special tokens is context-free: piece by piece */
            rc = encode_range(f, ex, NULL, p->off, p->off + p->len, -1, -1, e);
            if (!rc)
                rc = push_ids(ex, ex->tmp, ex->tmpn, p->sup, e);
            i++;
        } else {
            size_t j = i;
            while (j < ex->np && ex->pieces[j].special < 0)
                j++;
            rc = encode_section(f, ex, i, j, anchor, e);
            i = j;
        }
    }
    ex->np = 0;
    ex->tlen = 0;
    return rc;
}

/* A template's special token: its id with a tokenizer, its text with the byte-level stand-in. */
static int put_special(const snug_format *f, snug_example *ex, const char *tok, int sup, snug_error *e) {
    const char *const *list = f->src->chat == SNUG_CHAT_LLAMA3 ? LLAMA3_SPECIALS : CHATML_SPECIALS;
    for (int k = 0; list[k]; k++)
        if (!strcmp(list[k], tok) && f->special[k] >= 0)
            return add_piece(ex, tok, strlen(tok), f->special[k], sup, e);
    return put_str(f, ex, tok, sup, e);
}

/* Ends a unit: what follows is tokenized on its own. */
static int cut(const snug_format *f, snug_example *ex, snug_error *e) { return flush(f, ex, e); }

static int put_id(const snug_format *f, snug_example *ex, int32_t id, int sup, snug_error *e) {
    SNUG_TRY(flush(f, ex, e));
    return push_ids(ex, &id, 1, sup, e);
}

/* ---- JSON fields ---- */


static const char *format_example(const snug_format *f, char *buf, size_t cap) {
    switch (f->src->format) {
    case SNUG_DATA_COMPLETION: snprintf(buf, cap, "{\"%s\": \"...\"}", f->field); break;
    case SNUG_DATA_ALPACA:
        snprintf(buf, cap, "{\"instruction\": \"...\", \"input\": \"...\", \"output\": \"...\"} (input optional)");
        break;
    case SNUG_DATA_CHAT:
        snprintf(buf, cap, "{\"%s\": [{\"%s\": \"user\", \"%s\": \"...\"}, {\"%s\": \"assistant\", "
                 "\"%s\": \"...\"}]}", f->messages, f->role, f->content, f->role, f->content);
        break;
    case SNUG_DATA_PRETOKENIZED:
        snprintf(buf, cap, "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]} (labels optional)");
        break;
    case SNUG_DATA_INPUT_OUTPUT:
        snprintf(buf, cap, "{\"segments\": [{\"label\": false, \"text\": \"...\"}, {\"label\": true, \"text\": "
                 "\"...\"}]}");
        break;
    }
    return buf;
}

/* A string field: required, or optional (absent or null give ""). */
static int get_string(const snug_format *f, json_t *obj, const char *key, int required, const char **s, size_t *n,
                      snug_error *e) {
    char ex[200];
    json_t *v = json_object_get(obj, key);
    if (!v || (!required && json_is_null(v))) {
        if (required)
            return snug_fail(e, SNUG_EINPUT, "the \"%s\" field is missing; each %s line must be %s%s", key,
                             snug_data_format_name(f->src->format), format_example(f, ex, sizeof ex),
                             f->src->format == SNUG_DATA_COMPLETION
                                 ? "; set datasets[].field to the key that holds the text"
                                 : "");
        *s = "";
        *n = 0;
        return 0;
    }
    if (!json_is_string(v))
        return snug_fail(e, SNUG_EINPUT, "the \"%s\" field is %s, not a string; each %s line must be %s", key,
                         snug_json_type_name(v), snug_data_format_name(f->src->format), format_example(f, ex, sizeof ex));
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 0;
}

/* ---- the formats ---- */

static int do_completion(const snug_format *f, json_t *obj, snug_example *ex, snug_error *e) {
    const char *text;
    size_t n;
    SNUG_TRY(get_string(f, obj, f->field, 1, &text, &n, e));
    if (!n)
        return snug_fail(e, SNUG_EINPUT, "the \"%s\" field is empty; remove the line or give it text", f->field);
    const snug_encoder *enc = f->enc;
    if (enc->bos_id >= 0)
        SNUG_TRY(put_id(f, ex, enc->bos_id, 0, e));
    SNUG_TRY(put_text(f, ex, text, n, 1, e));
    if (enc->eos_id >= 0)
        SNUG_TRY(put_id(f, ex, enc->eos_id, 1, e));
    return flush(f, ex, e);
}

static int do_alpaca(const snug_format *f, json_t *obj, snug_example *ex, snug_error *e) {
    const char *ins, *inp, *out;
    size_t nins, ninp, nout;
    SNUG_TRY(get_string(f, obj, "instruction", 1, &ins, &nins, e));
    SNUG_TRY(get_string(f, obj, "input", 0, &inp, &ninp, e));
    SNUG_TRY(get_string(f, obj, "output", 1, &out, &nout, e));
    if (!nins)
        return snug_fail(e, SNUG_EINPUT, "the \"instruction\" field is empty; give the task or remove the line");
    if (!nout)
        return snug_fail(e, SNUG_EINPUT, "the \"output\" field is empty: nothing to train on; give the response or "
                         "remove the line");
    const snug_encoder *enc = f->enc;
    int p = f->opts->train_on_inputs ? 1 : 0;
    if (enc->bos_id >= 0)
        SNUG_TRY(put_id(f, ex, enc->bos_id, 0, e));
    SNUG_TRY(put_str(f, ex, ninp ? ALPACA_SYSTEM : ALPACA_SYSTEM_NO_INPUT, p, e));
    SNUG_TRY(put_str(f, ex, ALPACA_INSTRUCTION, p, e));
    SNUG_TRY(put_text(f, ex, ins, nins, p, e));
    if (ninp) {
        SNUG_TRY(put_str(f, ex, ALPACA_INPUT, p, e));
        SNUG_TRY(put_text(f, ex, inp, ninp, p, e));
    }
    SNUG_TRY(put_str(f, ex, ALPACA_RESPONSE, p, e));
    SNUG_TRY(cut(f, ex, e)); /* the prompt on its own, as Axolotl, even when train_on_inputs */
    SNUG_TRY(put_text(f, ex, out, nout, 1, e));
    if (enc->eos_id >= 0)
        SNUG_TRY(put_id(f, ex, enc->eos_id, 1, e));
    return flush(f, ex, e);
}

/* input_output (Axolotl's template-free format): each segment's text tokenized on its own, without special tokens
 * added (a BOS or EOS is written in the text where wanted), supervised when its label is true (every segment with
 * train_on_inputs). */
static int do_input_output(const snug_format *f, json_t *obj, snug_example *ex, snug_error *e) {
    char hint[200];
    json_t *segs = json_object_get(obj, "segments");
    if (!json_is_array(segs))
        return snug_fail(e, SNUG_EINPUT, "the \"segments\" field is %s; each input_output line must be %s",
                         segs ? snug_json_type_name(segs) : "missing", format_example(f, hint, sizeof hint));
    size_t n = json_array_size(segs);
    int any = f->opts->train_on_inputs;
    for (size_t i = 0; i < n; i++) { /* check everything before tokenizing anything */
        json_t *s = json_array_get(segs, i), *label = json_object_get(s, "label"), *text = json_object_get(s, "text");
        if (!json_is_object(s))
            return snug_fail(e, SNUG_EINPUT, "segments[%zu] is %s, not an object such as {\"label\": true, \"text\": "
                             "\"...\"}", i, snug_json_type_name(s));
        if (!json_is_boolean(label))
            return snug_fail(e, SNUG_EINPUT, "segments[%zu].label is %s; it must be true (trained on) or false", i,
                             label ? snug_json_type_name(label) : "missing");
        if (!json_is_string(text))
            return snug_fail(e, SNUG_EINPUT, "segments[%zu].text is %s; it must be a string", i,
                             text ? snug_json_type_name(text) : "missing");
        any |= json_is_true(label) && json_string_length(text) > 0;
    }
    if (!any)
        return snug_fail(e, SNUG_EINPUT, "no segment with \"label\": true and text: nothing to train on; label the "
                         "response's segment true, or set train_on_inputs: true");
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(segs, i), *text = json_object_get(s, "text");
        int sup = f->opts->train_on_inputs || json_is_true(json_object_get(s, "label"));
        SNUG_TRY(put_text(f, ex, json_string_value(text), json_string_length(text), sup, e));
        SNUG_TRY(cut(f, ex, e)); /* each segment on its own, as Axolotl tokenizes them */
    }
    return flush(f, ex, e);
}

/* Bytes of Unicode whitespace (Python's str.isspace, which Jinja's trim uses) at s[0..n), or 0. */
static size_t ws_len(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20)))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n >= 3 && s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) /* U+1680 */
        return 3;
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x80 && /* U+2000..200A, 2028, 2029, 202F */
        ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3;
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) /* U+205F */
        return 3;
    if (n >= 3 && s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80) /* U+3000 */
        return 3;
    return 0;
}

/* Jinja's `trim` (Python str.strip()) on valid UTF-8. */
static void trim(const char **s, size_t *n) {
    const unsigned char *p = (const unsigned char *)*s;
    size_t a = 0, b = *n, k;
    while (a < b && (k = ws_len(p + a, b - a)))
        a += k;
    for (;;) { /* from the end: step back to the start of the last character */
        if (a >= b)
            break;
        size_t c = b - 1;
        while (c > a && (p[c] & 0xc0) == 0x80)
            c--;
        if (ws_len(p + c, b - c) != b - c)
            break;
        b = c;
    }
    *s += a;
    *n = b - a;
}

typedef enum { ROLE_SYSTEM = SNUG_ROLE_SYSTEM, ROLE_USER = SNUG_ROLE_USER, ROLE_ASSISTANT = SNUG_ROLE_ASSISTANT,
               NROLES } role;

static const char *const role_names[NROLES + 1] = {"system", "user", "assistant", "tool"};

/* The values that mean role r, joined by commas: the source's roles when it lists any, else Axolotl's default. */
static const char *role_list(const snug_format *f, int r) {
    static const char *const defaults[NROLES] = {"system", "human,user", "gpt,assistant"};
    int own = 0;
    for (int k = 0; k < NROLES; k++)
        own |= f->src->roles[k] && *f->src->roles[k];
    return own ? (f->src->roles[r] ? f->src->roles[r] : "") : defaults[r];
}

/* The role a message's role value means, or -1 (tool: "tool", with a Jinja template only). */
static int role_of(const snug_format *f, const char *value) {
    if (f->jinja && !strcmp(value, "tool"))
        return SNUG_ROLE_TOOL;
    for (int r = 0; r < NROLES; r++) {
        const char *list = role_list(f, r);
        size_t n = strlen(value);
        for (const char *p = list; *p;) {
            size_t k = strcspn(p, ",");
            if (k == n && !memcmp(p, value, n))
                return r;
            p += k + (p[k] == ',');
        }
    }
    return -1;
}

/* What role values a line may use, for an error: "\"system\", \"human\", \"user\", ..." */
static const char *role_values(const snug_format *f, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; r < NROLES; r++) {
        for (const char *p = role_list(f, r); *p && len < cap;) {
            size_t k = strcspn(p, ",");
            len += (size_t)snprintf(buf + len, cap - len, "%s\"%.*s\" (%s)", len ? ", " : "", (int)k, p,
                                    role_names[r]);
            p += k + (p[k] == ',');
        }
    }
    return buf;
}

static int do_chat(const snug_format *f, json_t *obj, snug_example *ex, snug_error *e) {
    char hint[300], vals[300];
    const char *fm = f->messages, *fr = f->role, *fc = f->content;
    json_t *msgs = json_object_get(obj, fm);
    if (!msgs)
        return snug_fail(e, SNUG_EINPUT, "the \"%s\" field is missing; each chat line must be %s%s", fm,
                         format_example(f, hint, sizeof hint),
                         strcmp(fm, "messages") ? "" : " (or set datasets[].field_messages to the field that holds "
                                                       "the messages, e.g. conversations)");
    if (!json_is_array(msgs))
        return snug_fail(e, SNUG_EINPUT, "the \"%s\" field is %s, not a list; each chat line must be %s", fm,
                         snug_json_type_name(msgs), format_example(f, hint, sizeof hint));
    size_t nm = json_array_size(msgs);
    if (nm == 0)
        return snug_fail(e, SNUG_EINPUT, "\"%s\" is empty; give at least a user and an assistant message or "
                         "remove the line", fm);
    int any_assistant = 0;
    for (size_t i = 0; i < nm; i++) { /* check everything before tokenizing anything */
        json_t *m = json_array_get(msgs, i), *r, *c;
        if (!json_is_object(m))
            return snug_fail(e, SNUG_EINPUT, "%s[%zu] is %s, not an object such as {\"%s\": \"user\", \"%s\": "
                             "\"...\"}", fm, i, snug_json_type_name(m), fr, fc);
        r = json_object_get(m, fr);
        c = json_object_get(m, fc);
        if (!r || !json_is_string(r))
            return snug_fail(e, SNUG_EINPUT, "%s[%zu].%s is %s; it must be one of %s%s", fm, i, fr,
                             r ? snug_json_type_name(r) : "missing", role_values(f, vals, sizeof vals),
                             r || strcmp(fr, "role") ? "" : " (or set datasets[].message_field_role to the field that "
                                                           "holds the role, e.g. from)");
        int jinja_ok = f->jinja && (!c || json_is_null(c) || json_is_array(c)); /* a tool call's; content parts */
        if (!jinja_ok && (!c || !json_is_string(c)))
            return snug_fail(e, SNUG_EINPUT, "%s[%zu].%s is %s; it must be a string%s", fm, i, fc,
                             c ? snug_json_type_name(c) : "missing",
                             c || strcmp(fc, "content") ? "" : " (or set datasets[].message_field_content to the "
                                                               "field that holds the text, e.g. value)");
        int role = role_of(f, json_string_value(r));
        if (role < 0)
            return snug_fail(e, SNUG_EINPUT, "%s[%zu].%s is \"%.40s\"; use one of %s%s, or map it to a role with "
                             "datasets[].roles", fm, i, fr, json_string_value(r), role_values(f, vals, sizeof vals),
                             f->jinja ? ", \"tool\"" : "");
        any_assistant |= role == ROLE_ASSISTANT;
    }
    int toi = f->opts->train_on_inputs ? 1 : 0;
    if (!any_assistant && !toi)
        return snug_fail(e, SNUG_EINPUT, "no assistant message: nothing to train on; add the assistant's reply, or "
                         "set train_on_inputs: true to train on every message");
    if (f->jinja)
        return snug_format_chat_jinja(f, obj, msgs, ex, e);
    int llama3 = f->src->chat == SNUG_CHAT_LLAMA3;
    if (llama3)
        SNUG_TRY(put_special(f, ex, "<|begin_of_text|>", 0, e));
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(msgs, i), *c = json_object_get(m, fc);
        int role = role_of(f, json_string_value(json_object_get(m, fr)));
        const char *rs = role_names[role]; /* the template writes the role, not the value that meant it */
        const char *text = json_string_value(c);
        size_t n = json_string_length(c);
        int sup = toi || role == ROLE_ASSISTANT;
        if (llama3) {
            trim(&text, &n);
            SNUG_TRY(put_special(f, ex, "<|start_header_id|>", toi, e));
            SNUG_TRY(put_str(f, ex, rs, toi, e));
            SNUG_TRY(put_special(f, ex, "<|end_header_id|>", toi, e));
            SNUG_TRY(put_str(f, ex, "\n\n", toi, e));
            SNUG_TRY(put_text(f, ex, text, n, sup, e));
            SNUG_TRY(put_special(f, ex, "<|eot_id|>", sup, e));
        } else {
            SNUG_TRY(put_special(f, ex, "<|im_start|>", toi, e));
            SNUG_TRY(put_str(f, ex, rs, toi, e));
            SNUG_TRY(put_str(f, ex, "\n", toi, e));
            SNUG_TRY(put_text(f, ex, text, n, sup, e));
            SNUG_TRY(put_special(f, ex, "<|im_end|>", sup, e));
            SNUG_TRY(put_str(f, ex, "\n", toi, e));
        }
    }
    return flush(f, ex, e);
}

/* input_ids[i] (or labels[i]) as an integer, or an error. */
static int get_int(json_t *arr, const char *name, size_t i, json_int_t *out, snug_error *e) {
    json_t *v = json_array_get(arr, i);
    if (json_is_real(v))
        return snug_fail(e, SNUG_EINPUT, "%s[%zu] is %g, not an integer; write token ids as integers", name, i,
                         json_real_value(v));
    if (!json_is_integer(v))
        return snug_fail(e, SNUG_EINPUT, "%s[%zu] is %s, not an integer", name, i, snug_json_type_name(v));
    *out = json_integer_value(v);
    return 0;
}

static int do_pretokenized(const snug_format *f, json_t *obj, snug_example *ex, snug_error *e) {
    char hint[200];
    json_t *ids = json_object_get(obj, "input_ids"), *labels = json_object_get(obj, "labels");
    if (!ids)
        return snug_fail(e, SNUG_EINPUT, "the \"input_ids\" field is missing; each pretokenized line must be %s",
                         format_example(f, hint, sizeof hint));
    if (!json_is_array(ids))
        return snug_fail(e, SNUG_EINPUT, "the \"input_ids\" field is %s, not a list of token ids", snug_json_type_name(ids));
    if (labels && json_is_null(labels))
        labels = NULL;
    if (labels && !json_is_array(labels))
        return snug_fail(e, SNUG_EINPUT, "the \"labels\" field is %s, not a list of ids and -100", snug_json_type_name(labels));
    size_t n = json_array_size(ids);
    if (n == 0)
        return snug_fail(e, SNUG_EINPUT, "\"input_ids\" is empty; remove the line");
    if (labels && json_array_size(labels) != n)
        return snug_fail(e, SNUG_EINPUT, "\"labels\" has %zu entries but \"input_ids\" has %zu; they must be the same "
                         "length (labels[i] is input_ids[i] or -100)", json_array_size(labels), n);
    if (grow((void **)&ex->ids, &ex->cap, n, sizeof *ex->ids) || grow((void **)&ex->sup, &ex->supcap, n, 1))
        return oom(e);
    size_t nsup = 0;
    int V = f->enc->vocab_size;
    for (size_t i = 0; i < n; i++) {
        json_int_t id = 0, lab = 0;
        SNUG_TRY(get_int(ids, "input_ids", i, &id, e));
        if (id < 0 || id >= V)
            return snug_fail(e, SNUG_EINPUT, "input_ids[%zu] is %lld, outside the vocabulary 0..%d; tokenize with the "
                             "tokenizer the run uses", i, (long long)id, V - 1);
        uint8_t s = 1;
        if (labels) {
            SNUG_TRY(get_int(labels, "labels", i, &lab, e));
            if (lab != -100 && lab != id)
                return snug_fail(e, SNUG_EINPUT, "labels[%zu] is %lld but input_ids[%zu] is %lld; a label must be "
                                 "its input id or -100 (labels are not shifted, as in transformers)", i,
                                 (long long)lab, i, (long long)id);
            s = lab != -100;
        }
        ex->ids[i] = (int32_t)id;
        ex->sup[i] = s;
        nsup += s;
    }
    ex->n = n;
    if (!nsup)
        return snug_fail(e, SNUG_EINPUT, "every label is -100: nothing to train on; remove the line");
    return 0;
}

int snug_format_put_text(const snug_format *f, snug_example *ex, const char *s, size_t n, int sup, snug_error *e) {
    return put_text(f, ex, s, n, sup, e);
}
int snug_format_flush(const snug_format *f, snug_example *ex, snug_error *e) { return flush(f, ex, e); }
int snug_format_role_of(const snug_format *f, const char *value) { return role_of(f, value); }
const char *snug_format_role_name(int role) { return (unsigned)role <= NROLES ? role_names[role] : "?"; }

void snug_format_free(snug_format *f) {
    snug_jinja_free(f->jinja);
    snug_jinja_free(f->jinja_tool_use);
    f->jinja = f->jinja_tool_use = NULL;
}

/* Compiles a chat template of src; a template that does not compile says what else renders the data. */
static int compile_template(const snug_data_source *src, const char *text, const char *where, snug_jinja **out,
                            snug_error *e) {
    int rc = snug_jinja_compile(text, strlen(text), where ? where : "chat template", out, e);
    if (rc == SNUG_EINPUT) {
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        return snug_fail(e, rc, "%.1200s (%s's chat template; chat_template: chatml or llama3 renders with a "
                         "built-in instead)", msg, src->path);
    }
    return rc;
}

int snug_format_init(snug_format *f, const snug_data_source *src, const snug_data_opts *opts, const snug_encoder *enc,
                     snug_error *e) {
    *f = (snug_format){.src = src, .opts = opts, .enc = enc, .field = src->field && *src->field ? src->field : "text",
                       .messages = src->messages && *src->messages ? src->messages : "messages",
                       .role = src->role && *src->role ? src->role : "role",
                       .content = src->content && *src->content ? src->content : "content",
                       .special = {-1, -1, -1, -1}};
    if (src->format == SNUG_DATA_CHAT && src->chat == SNUG_CHAT_JINJA) {
        if (!src->jinja)
            return snug_fail(e, SNUG_EINTERNAL, "%s: chat_template jinja without a template", src->path);
        SNUG_TRY(compile_template(src, src->jinja, src->jinja_where, &f->jinja, e));
        f->jinja_gen = snug_jinja_has_generation(f->jinja);
        if (src->jinja_tool_use) {
            int rc = compile_template(src, src->jinja_tool_use, src->jinja_tool_use_where, &f->jinja_tool_use, e);
            if (rc) {
                snug_format_free(f);
                return rc;
            }
            f->tool_use_gen = snug_jinja_has_generation(f->jinja_tool_use);
        }
        memcpy(f->vars.tokens, src->chat_tokens, sizeof f->vars.tokens);
        return 0;
    }
    if (src->format != SNUG_DATA_CHAT || !enc->special_id)
        return 0;
    const char *const *specials = src->chat == SNUG_CHAT_LLAMA3 ? LLAMA3_SPECIALS : CHATML_SPECIALS;
    const char *tname = snug_chat_template_name(src->chat);
    for (int i = 0; specials[i]; i++) {
        int id = enc->special_id(enc->ctx, specials[i]);
        if (id < 0)
            return snug_fail(e, SNUG_EINPUT, "%s: chat_template %s needs the special token %s, which the tokenizer "
                             "does not have; use a tokenizer that lists it in added_tokens, or the chat_template the "
                             "tokenizer was made for (chatml, llama3)", src->path, tname, specials[i]);
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        int rc = enc->encode(enc->ctx, specials[i], strlen(specials[i]), &ids, &n, &cap, e);
        int one = !rc && n == 1 && ids[0] == id;
        free(ids);
        if (rc)
            return rc;
        if (!one)
            return snug_fail(e, SNUG_EINPUT, "%s: the tokenizer encodes %s as %zu tokens, not as its id %d; "
                             "chat_template %s needs it listed in added_tokens", src->path, specials[i], n, id, tname);
        f->special[i] = id;
    }
    return 0;
}

int snug_format_line(const snug_format *f, const char *line, size_t len, snug_example *ex, snug_error *e) {
    ex->n = 0;
    ex->tlen = 0;
    ex->np = 0;
    char hint[200];
    json_error_t jerr;
    json_t *obj = snug_json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!obj) {
        switch (json_error_code(&jerr)) {
        case json_error_invalid_utf8:
            return snug_fail(e, SNUG_EINPUT, "invalid UTF-8 (%s, column %d); the file must be UTF-8 text", jerr.text,
                             jerr.column);
        case json_error_null_character:
            return snug_fail(e, SNUG_EINPUT, "a string holds \\u0000 (a NUL character), which snug does not accept; "
                             "remove it");
        default:
            return snug_fail(e, SNUG_EINPUT, "invalid JSON at column %d (%s); each line must be one JSON object such "
                             "as %s", jerr.column, jerr.text, format_example(f, hint, sizeof hint));
        }
    }
    int rc;
    if (!json_is_object(obj)) {
        rc = snug_fail(e, SNUG_EINPUT, "the line is %s, not a JSON object; each line must be %s", snug_json_type_name(obj),
                       format_example(f, hint, sizeof hint));
    } else {
        switch (f->src->format) {
        case SNUG_DATA_ALPACA: rc = do_alpaca(f, obj, ex, e); break;
        case SNUG_DATA_CHAT: rc = do_chat(f, obj, ex, e); break;
        case SNUG_DATA_PRETOKENIZED: rc = do_pretokenized(f, obj, ex, e); break;
        case SNUG_DATA_INPUT_OUTPUT: rc = do_input_output(f, obj, ex, e); break;
        default: rc = do_completion(f, obj, ex, e); break;
        }
    }
    json_decref(obj);
    if (!rc && ex->n == 0)
        rc = snug_fail(e, SNUG_EINPUT, "the example has no tokens; remove the line");
    return rc;
}
