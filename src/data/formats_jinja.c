/* formats_jinja.c: a chat line through a Jinja chat template (the tokenizer's own, or chat_template_jinja): the text
 * transformers' apply_chat_template renders, tokenized whole as it tokenizes it (add_special_tokens=False: the
 * template writes any BOS itself), and the assistant mask.
 *
 * What the template sees: each message of the line with its role value replaced by the role's name (system, user,
 * assistant, tool; datasets[].roles maps the values), its text under "content" (datasets[].message_field_content),
 * its other keys as they are (tool_calls, ...), keys whose value is null dropped (transformers'
 * _normalize_chat_messages), and a message with reasoning ("reasoning_content", "thinking" or "reasoning", the first
 * not null) gets it under "thinking" (first) and "reasoning_content" as well (_alias_reasoning_fields); the line's
 * "tools" when it has them (else None, as documents; with tools, the tokenizer's "tool_use" template when it ships
 * one, as transformers' get_chat_template picks it); add_generation_prompt false;
 * bos_token, eos_token, unk_token and pad_token as tokenizer_config.json writes them.
 *
 * The assistant mask (which tokens are supervised):
 *   - a template with {% generation %} blocks: every token whose text overlaps the output of a block, as
 *     transformers' return_assistant_tokens_mask marks them (a token that straddles a block's edge included);
 *   - a template without them, by rendering prefixes: for each assistant message i, the text from where the rendering
 *     of messages[0, i) with add_generation_prompt true (the prompt that asks for the reply) stops agreeing with the
 *     whole conversation's rendering, to where the rendering of messages[0, i] (add_generation_prompt false) stops
 *     agreeing with it. For most templates both are prefixes of the whole, and the span is the reply and what the
 *     template writes after it (its end-of-turn token, a line break); where a generation prompt writes more than
 *     the turn holds (DeepSeek-R1's "<think>\n") the span starts where they part; where a template writes a trailer
 *     after every conversation (the first Llama 3's assistant header) the span ends where the trailer and the next
 *     turn part (the next header's first token included);
 *   - where that leaves a reply's span empty (a template that renders a turn differently once later ones follow:
 *     Qwen3 writes an empty <think></think> into the last turn only), or starts it before the end of the previous
 *     message's content (found by the stand-ins below, that message's content replaced: Mistral-Nemo writes the
 *     system prompt into the last user turn, so the prompt that asks for an earlier reply parts from the whole
 *     inside that user's text), by stand-in replies, as Axolotl's find_turn
 *     finds turns: the whole conversation rendered with assistant message i replaced by {role: assistant,
 *     content: s} for two stand-ins s (that differ in their first and last characters, so that a reply that starts
 *     or ends like one still parts from the other where it starts and ends); where that rendering parts from the
 *     real one (the earlier start and the later end over both stand-ins) is the reply, its tool calls and
 *     reasoning included, and what the template writes after s when the stand-in ends the conversation (its
 *     end-of-turn token), as far as it agrees with what follows in the real rendering, ends the span. An empty reply
 *     the template writes nothing after supervises nothing. Where s is not once in that rendering with all that
 *     differs inside it, is not once in the turn's own rendering, or is refused by the template (a tool reply with
 *     no tool call before it: gpt-oss), the same with stand-ins that keep the message's other keys (tool_calls,
 *     reasoning), only its content replaced (what the template writes after the content, its tool calls
 *     included, then agrees with the real rendering and ends the span). A line neither finds is refused, naming
 *     the message: give the template {% generation %} blocks through chat_template_jinja;
 *   - train_on_inputs: every token.
 * The span edges become changes of supervision inside the text, pinned to tokens as formats.h describes. */
#include "data/formats.h"

#include <stdlib.h>
#include <string.h>

typedef struct range {
    size_t a, b;
} range;

static int cmp_range(const void *x, const void *y) {
    const range *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a ? 1 : p->b < q->b ? -1 : p->b > q->b;
}

/* The messages as the template sees them (see the top of the file); NULL when out of memory. */
static json_t *template_messages(const snug_format *f, json_t *msgs) {
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_object();
        if (!out || !c || json_array_append_new(out, c)) {
            json_decref(out);
            return NULL;
        }
        static const char *const reasoning_keys[3] = {"reasoning_content", "thinking", "reasoning"};
        json_t *reasoning = NULL;
        for (int k = 0; k < 3 && !reasoning; k++) {
            json_t *x = json_object_get(m, reasoning_keys[k]);
            reasoning = x && !json_is_null(x) ? x : NULL;
        }
        if (reasoning && json_object_set(c, "thinking", reasoning)) {
            json_decref(out);
            return NULL;
        }
        const char *key;
        json_t *v;
        json_object_foreach(m, key, v) {
            int rc = 0;
            if (!strcmp(key, f->role)) {
                int role = snug_format_role_of(f, json_string_value(v));
                rc = json_object_set_new(c, "role", json_string(snug_format_role_name(role)));
            } else if (!strcmp(key, f->content)) {
                rc = json_is_null(v) ? 0 : json_object_set(c, "content", v);
            } else if (!json_is_null(v) && strcmp(key, "role") && strcmp(key, "content")) {
                rc = json_object_set(c, key, v);
            }
            if (rc) {
                json_decref(out);
                return NULL;
            }
        }
        if (reasoning && (json_object_set(c, "thinking", reasoning) || json_object_set(c, "reasoning_content",
                                                                                         reasoning))) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* Renders msgs[0, n) (add_generation_prompt gp), message i replaced by repl when repl is not NULL, into *text
 * (malloc'd), *len. */
static int render_with(const snug_format *f, const snug_jinja *t, json_t *msgs, size_t n, size_t i, json_t *repl,
                       json_t *tools, int gp, char **text, size_t *len, snug_error *e) {
    json_t *sub = json_array();
    for (size_t k = 0; sub && k < n; k++)
        if (json_array_append(sub, repl && k == i ? repl : json_array_get(msgs, k))) {
            json_decref(sub);
            sub = NULL;
        }
    if (!sub)
        return snug_fail(e, SNUG_ENOMEM, "out of memory rendering a chat template");
    snug_jinja_out o;
    int rc = snug_chat_render(t, sub, tools, gp, &f->vars, &o, e);
    json_decref(sub);
    if (!rc) {
        *text = o.text;
        *len = o.len;
        o.text = NULL;
        snug_jinja_out_free(&o);
    }
    return rc;
}

/* Renders msgs[0, n) (add_generation_prompt gp) into *text (malloc'd), *len. */
static int render_first(const snug_format *f, const snug_jinja *t, json_t *msgs, size_t n, json_t *tools, int gp,
                        char **text, size_t *len, snug_error *e) {
    return render_with(f, t, msgs, n, 0, NULL, tools, gp, text, len, e);
}

/* The length of the common prefix of a[0, na) and b[0, nb), backed up to the start of a character of b (the rule is
 * one of characters, as the reference computes it on Python strings). */
static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb) {
    size_t k = 0, n = na < nb ? na : nb;
    while (k < n && a[k] == b[k])
        k++;
    while (k > 0 && k < nb && ((unsigned char)b[k] & 0xc0) == 0x80)
        k--;
    return k;
}

/* The length of the common suffix of a[0, na) and b[0, nb), at most lim, backed up so that it starts at a
 * character of a. */
static size_t common_suffix(const char *a, size_t na, const char *b, size_t nb, size_t lim) {
    size_t k = 0;
    while (k < lim && k < na && k < nb && a[na - 1 - k] == b[nb - 1 - k])
        k++;
    while (k > 0 && ((unsigned char)a[na - k] & 0xc0) == 0x80)
        k--;
    return k;
}

/* Two stand-in replies that differ in their first and in their last character (so that a reply starting or ending
 * as one of them still parts from the other where it starts and ends). */
static const char *const stand_ins[2] = {"SNUGTURNSTANDINx", "snugturnstandinX"};

/* Where stand-in reply s (message i replaced by m, whose content is s) parts from full[0, nfull): *p the start, *q
 * the end of what differs in full; *ok false unless s is once in the stand-in's rendering and what differs there
 * lies inside it (a reply that starts or ends like s parts from it inside s). */
static int stand_in_diff(const snug_format *f, const snug_jinja *t, json_t *msgs, size_t i, json_t *tools,
                         const char *full, size_t nfull, json_t *m, const char *s, size_t *p, size_t *q, int *ok,
                         snug_error *e) {
    char *g = NULL;
    size_t ng = 0, ns = strlen(s);
    SNUG_TRY(render_with(f, t, msgs, json_array_size(msgs), i, m, tools, 0, &g, &ng, e));
    *p = common_prefix(g, ng, full, nfull);
    size_t lim = (nfull < ng ? nfull : ng) - *p, k = common_suffix(full, nfull, g, ng, lim);
    *q = nfull - k;
    const char *at = strstr(g, s);
    *ok = at && !strstr(at + 1, s) && (size_t)(at - g) <= *p && ng - k <= (size_t)(at - g) + ns;
    free(g);
    return 0;
}

/* Assistant message i's span in full[0, nfull) by stand-in replies (see the top of the file) into *a, *b (*b = *a
 * for an empty reply the template writes nothing after); *found false when the rule does not apply to it. keep: the
 * stand-in keeps the message's other keys (tool_calls, reasoning), only its content replaced. */
static int stand_in_span(const snug_format *f, const snug_jinja *t, json_t *msgs, size_t i, json_t *tools, int keep,
                         const char *full, size_t nfull, size_t *a, size_t *b, int *found, snug_error *e) {
    *a = *b = 0;
    *found = 0;
    size_t p[2], q[2];
    int ok[2] = {0, 0}, rc = 0;
    char *h = NULL;
    size_t nh = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        json_t *m = keep ? json_copy(json_array_get(msgs, i)) : json_object();
        if (m && (json_object_set_new(m, "role", json_string("assistant")) ||
                  json_object_set_new(m, "content", json_string(stand_ins[k])))) {
            json_decref(m);
            m = NULL;
        }
        if (!m)
            return snug_fail(e, SNUG_ENOMEM, "out of memory");
        rc = stand_in_diff(f, t, msgs, i, tools, full, nfull, m, stand_ins[k], &p[k], &q[k], &ok[k], e);
        if (!rc && !k) /* the conversation up to the stand-in: what the template writes after a reply */
            rc = render_with(f, t, msgs, i + 1, i, m, tools, 0, &h, &nh, e);
        json_decref(m);
    }
    if (rc == SNUG_EINPUT) /* the template refuses a stand-in (a tool reply with no tool call before it) */
        rc = ok[0] = 0;
    const char *s = stand_ins[0], *at = !rc && h ? strstr(h, s) : NULL;
    if (!rc && ok[0] && ok[1] && at && !strstr(at + 1, s)) {
        const char *tr = at + strlen(s);
        size_t start = p[0] < p[1] ? p[0] : p[1], end = q[0] > q[1] ? q[0] : q[1];
        size_t ntr = (size_t)(h + nh - tr);
        *a = start;
        *b = end + common_prefix(tr, ntr, full + end, nfull - end);
        *found = 1;
    }
    free(h);
    return rc;
}

/* Where message j's content ends in full[0, nfull), found by stand-ins (its content replaced, its other keys kept)
 * into *end; *ok false when that cannot be told (the stand-ins not found, the template refuses them). */
static int content_end(const snug_format *f, const snug_jinja *t, json_t *msgs, size_t j, json_t *tools,
                       const char *full, size_t nfull, size_t *end, int *ok, snug_error *e) {
    *end = 0;
    *ok = 1;
    int rc = 0;
    for (int k = 0; k < 2 && !rc && *ok; k++) {
        json_t *m = json_copy(json_array_get(msgs, j));
        if (!m || json_object_set_new(m, "content", json_string(stand_ins[k]))) {
            json_decref(m);
            return snug_fail(e, SNUG_ENOMEM, "out of memory");
        }
        size_t p, q;
        rc = stand_in_diff(f, t, msgs, j, tools, full, nfull, m, stand_ins[k], &p, &q, ok, e);
        json_decref(m);
        *end = !rc && q > *end ? q : *end;
    }
    if (rc == SNUG_EINPUT) /* the template refuses a stand-in there */
        rc = *ok = 0;
    return rc;
}

/* The assistant spans by rendering prefixes (see the top of the file) into *r (grown), *nr. */
static int prefix_spans(const snug_format *f, const snug_jinja *t, json_t *msgs, json_t *tools, const char *full,
                        size_t nfull, range **r, size_t *nr, snug_error *e) {
    size_t nm = json_array_size(msgs);
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(msgs, i);
        if (strcmp(json_string_value(json_object_get(m, "role")), "assistant"))
            continue;
        char *p = NULL, *q = NULL;
        size_t np = 0, nq = 0;
        int rc = render_first(f, t, msgs, i, tools, 1, &p, &np, e);
        if (!rc)
            rc = render_first(f, t, msgs, i + 1, tools, 0, &q, &nq, e);
        size_t a = rc ? 0 : common_prefix(p, np, full, nfull), b = rc ? 0 : common_prefix(q, nq, full, nfull);
        free(p);
        free(q);
        if (rc)
            return rc;
        int found = b > a;
        if (found && i > 0) { /* a span that starts inside the message before it (its text rendered differently
                               * before a generation prompt: Mistral-Nemo's system prompt) is found by stand-ins */
            size_t end;
            int ok;
            SNUG_TRY(content_end(f, t, msgs, i - 1, tools, full, nfull, &end, &ok, e));
            found = !(ok && end > a);
        }
        /* the turn rendered as the last differs: find it by stand-in replies (then ones that keep its tool calls) */
        for (int keep = 0; keep < 2 && !found; keep++)
            SNUG_TRY(stand_in_span(f, t, msgs, i, tools, keep, full, nfull, &a, &b, &found, e));
        if (!found)
            return snug_fail(e, SNUG_EINPUT, "%s[%zu]: the template (%s) renders the conversation up to this assistant "
                             "message differently from the start of the whole conversation, so its reply cannot be "
                             "found by rendering prefixes (nor by a stand-in reply); give the template "
                             "{%% generation %%} blocks around the reply (chat_template_jinja), or use chat_template: "
                             "chatml", f->messages, i,
                             f->src->jinja_where ? f->src->jinja_where : "jinja");
        range *g = realloc(*r, (*nr + 1) * sizeof **r);
        if (!g)
            return snug_fail(e, SNUG_ENOMEM, "out of memory");
        *r = g;
        g[(*nr)++] = (range){a, b};
    }
    return 0;
}

/* Emits text[0, n) as pieces, supervised inside the ranges r[0, nr) (sorted), and tokenizes them. */
static int emit(const snug_format *f, snug_example *ex, const char *text, size_t n, range *r, size_t nr,
                snug_error *e) {
    size_t pos = 0;
    for (size_t k = 0; k < nr; k++) {
        size_t a = r[k].a > pos ? r[k].a : pos, b = r[k].b < n ? r[k].b : n;
        if (b <= a)
            continue;
        SNUG_TRY(snug_format_put_text(f, ex, text + pos, a - pos, 0, e));
        SNUG_TRY(snug_format_put_text(f, ex, text + a, b - a, 1, e));
        pos = b;
    }
    SNUG_TRY(snug_format_put_text(f, ex, text + pos, n - pos, 0, e));
    return snug_format_flush(f, ex, e);
}

int snug_format_chat_jinja(const snug_format *f, json_t *obj, json_t *msgs, snug_example *ex, snug_error *e) {
    json_t *tm = template_messages(f, msgs), *tools = json_object_get(obj, "tools");
    if (!tm)
        return snug_fail(e, SNUG_ENOMEM, "out of memory rendering a chat template");
    if (json_is_null(tools))
        tools = NULL;
    /* a line with tools renders with the tokenizer's tool_use template when it has one, as transformers */
    const snug_jinja *t = tools && f->jinja_tool_use ? f->jinja_tool_use : f->jinja;
    int gen = tools && f->jinja_tool_use ? f->tool_use_gen : f->jinja_gen;
    snug_jinja_out full;
    int rc = snug_chat_render(t, tm, tools, 0, &f->vars, &full, e);
    if (rc) {
        json_decref(tm);
        if (rc != SNUG_EINPUT)
            return rc;
        char msg[sizeof e->msg]; /* a template's error (raise_exception's message): say what else renders the line */
        snprintf(msg, sizeof msg, "%s", e->msg);
        return snug_fail(e, rc, "%.1200s (rendering the chat template; fix the line, skip such lines with "
                         "skip_bad_examples: true, or render with a built-in: chat_template: chatml or llama3)", msg);
    }
    range *r = NULL;
    size_t nr = 0;
    if (f->opts->train_on_inputs) {
        if (!(r = malloc(sizeof *r)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of memory");
        else
            r[nr++] = (range){0, full.len};
    } else if (gen) {
        if (full.nspans && !(r = malloc(full.nspans * sizeof *r)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of memory");
        for (size_t k = 0; !rc && k < full.nspans; k++)
            r[nr++] = (range){full.spans[k].begin, full.spans[k].end};
        if (nr)
            qsort(r, nr, sizeof *r, cmp_range);
    } else {
        rc = prefix_spans(f, t, tm, tools, full.text, full.len, &r, &nr, e);
    }
    size_t nsup = 0;
    for (size_t k = 0; k < nr; k++)
        nsup += r[k].b > r[k].a;
    if (!rc && !nsup)
        rc = snug_fail(e, SNUG_EINPUT, "the template (%s) marks no text as the assistant's (%s); check that the "
                       "line has an assistant reply, or set train_on_inputs: true",
                       f->src->jinja_where ? f->src->jinja_where : "jinja",
                       gen ? "its {% generation %} blocks rendered nothing" : "no assistant message");
    if (!rc)
        rc = emit(f, ex, full.text, full.len, r, nr, e);
    free(r);
    snug_jinja_out_free(&full);
    json_decref(tm);
    return rc;
}
