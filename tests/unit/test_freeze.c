/* test_freeze.c: unfrozen_parameters' reading of Axolotl's patterns (snug_param_table_freeze) on the tables of a small
 * Llama and of GPT-2: a pattern matches at the start of a name only, each '.' is literal, a trailing range trains those
 * rows (merged across patterns, a range covering every row meaning the whole tensor), the unmatched pattern is named,
 * and each bad input is SNUG_EINPUT naming it: a broken expression, a range outside or backwards, a range of a Conv1D
 * weight, more separate ranges than a tensor holds. The pattern list (snug_patterns) takes what fits, nothing empty. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "model/model.h"
#include "model/presets.h"

static int idx(const snug_param_table *t, const char *name) {
    int i = snug_param_table_find(t, name);
    CHECKF(i >= 0, "no tensor %s", name);
    return i < 0 ? 0 : i;
}

static int frozen(const snug_param_table *t, const char *name) { return t->e[idx(t, name)].frozen; }

/* The patterns of `lines`, one per line ("" = none) */
static const snug_patterns *pats(const char *lines) {
    static snug_patterns p;
    char one[512];
    p.n = 0;
    for (const char *c = lines; *c;) {
        size_t len = strcspn(c, "\n");
        snprintf(one, sizeof one, "%.*s", (int)len, c);
        CHECKF(snug_patterns_add(&p, one) == 0, "%s does not fit", one);
        c += len + (c[len] == '\n');
    }
    return &p;
}

int main(void) {
    snug_model_config c;
    snug_error e;
    snug_param_table t;
    CHECK(snug_preset(&c, "tiny-llama", 2048, &e) == 0);
    CHECK(snug_param_table_build(&t, &c, &e) == 0);
    int unmatched = -1;

    /* at the start only, '.' literal: "layers.1" is not matched inside a name, and "model.layers.1" does not
     * reach layer 1x */
    CHECK(snug_param_table_freeze(&t, pats("layers.1\nmodel.layers.1.mlp"), &unmatched, &e) == 0);
    CHECK(unmatched == 1); /* the first pattern (1-based) matched nothing */
    CHECK(!frozen(&t, "model.layers.1.mlp.down_proj.weight") && frozen(&t, "model.layers.1.self_attn.q_proj.weight"));
    CHECK(frozen(&t, "model.embed_tokens.weight") && frozen(&t, "model.norm.weight"));
    size_t mlp = t.e[idx(&t, "model.layers.1.mlp.gate_proj.weight")].numel +
                 t.e[idx(&t, "model.layers.1.mlp.up_proj.weight")].numel +
                 t.e[idx(&t, "model.layers.1.mlp.down_proj.weight")].numel;
    CHECK(snug_param_table_trained(&t) == mlp);
    /* "." is no wildcard: model_layers matches nothing */
    CHECK(snug_param_table_freeze(&t, pats("model.norm\nmodel.layers.0.mlp.up.proj"), &unmatched, &e) == 0 &&
          unmatched == 2);

    /* ranges: [a], [a:b], [a:], [:b], merged; one covering every row is the whole tensor; none frozen */
    CHECK(snug_param_table_freeze(&t, pats("model.embed_tokens.weight[3]\nmodel.embed_tokens.weight[10:20]\n"
                                      "^model.embed_tokens.weight$[15:30]\nmodel.embed_tokens.weight[2040:]\n"
                                      "model.norm.weight[:256]"), &unmatched, &e) == 0 && unmatched == 0);
    const snug_param_entry *emb = &t.e[idx(&t, "model.embed_tokens.weight")];
    CHECK(!emb->frozen && emb->nkeep == 3);
    CHECK(emb->keep[0][0] == 3 && emb->keep[0][1] == 4 && emb->keep[1][0] == 10 && emb->keep[1][1] == 30 &&
          emb->keep[2][0] == 2040 && emb->keep[2][1] == 2048);
    CHECK(!frozen(&t, "model.norm.weight") && t.e[idx(&t, "model.norm.weight")].nkeep == 0);
    /* an empty pattern list: every tensor trains */
    CHECK(snug_param_table_freeze(&t, pats(""), &unmatched, &e) == 0 && snug_param_table_trained(&t) == t.total);

    /* bad input, each named */
    static const struct {
        const char *patterns, *want;
    } bad[] = {
        {"model.layers.(", "is not a regular expression"},
        {"model.norm.weight[0:300]", "outside its 256 rows"},
        {"model.norm.weight[9:3]", "end must come after its start"},
        {"model.norm.weight[300:]", "outside its 256 rows"},
        {"model.norm.weight[0]\nmodel.norm.weight[2]\nmodel.norm.weight[4]\nmodel.norm.weight[6]\n"
         "model.norm.weight[8]\nmodel.norm.weight[10]\nmodel.norm.weight[12]\nmodel.norm.weight[14]\n"
         "model.norm.weight[16]", "more than 8 separate ranges"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snug_error_clear(&e);
        int rc = snug_param_table_freeze(&t, pats(bad[i].patterns), &unmatched, &e);
        CHECKF(rc == SNUG_EINPUT && strstr(e.msg, bad[i].want), "%s: %d %s", bad[i].patterns, rc, e.msg);
    }
    snug_param_table_free(&t);

    /* the list: items in order, each as given; an empty pattern refused; full at SNUG_PATTERNS_TEXT characters */
    {
        static snug_patterns p;
        CHECK(snug_patterns_add(&p, "a.b") == 0 && snug_patterns_add(&p, "c[1:2]") == 0 && p.n == 2);
        CHECK(!strcmp(snug_patterns_item(&p, 0), "a.b") && !strcmp(snug_patterns_item(&p, 1), "c[1:2]"));
        CHECK(snug_patterns_add(&p, "") == -1 && p.n == 2);
        static char big[SNUG_PATTERNS_TEXT];
        memset(big, 'x', sizeof big - 1 - 11); /* with its NUL, the 11 bytes "a.b" and "c[1:2]" take: full */
        big[sizeof big - 1 - 11] = '\0';
        CHECK(snug_patterns_add(&p, big) == 0 && p.n == 3 && snug_patterns_add(&p, "y") == -1 && p.n == 3);
    }

    /* GPT-2's Conv1D weights: whole, fine; a range of one refused (its first dimension is its input) */
    CHECK(snug_preset(&c, "gpt2-124m", 50257, &e) == 0);
    c.n_layer = 2;
    CHECK(snug_param_table_build(&t, &c, &e) == 0);
    CHECK(snug_param_table_freeze(&t, pats("transformer.h.0.attn.c_attn.weight"), &unmatched, &e) == 0 && !unmatched);
    CHECK(!frozen(&t, "transformer.h.0.attn.c_attn.weight") && frozen(&t, "transformer.h.0.attn.c_attn.bias"));
    snug_error_clear(&e);
    CHECKF(snug_param_table_freeze(&t, pats("transformer.h.0.attn.c_attn.weight[0:3]"), &unmatched, &e) == SNUG_EINPUT &&
               strstr(e.msg, "is a Conv1D weight"), "%s", e.msg);
    snug_param_table_free(&t);
    return check_finish("test_freeze");
}
