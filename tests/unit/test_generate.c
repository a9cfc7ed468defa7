/* test_generate.c: decoding with the KV cache against full forward passes.
 *
 * Greedy generation (temperature 0) through snug_generate, which runs one row per new token against the cached keys
 * and values, must pick the same tokens as recomputing the whole sequence with the training forward pass and taking
 * the argmax of the last position; and sampling with a seed must be reproducible. Llama (GQA, RoPE; and with a
 * sliding window on one layer) and GPT-2.
 * Then the context's edges: prompts of CTX-1, CTX, CTX+1 and 3*CTX tokens and max_new_tokens of 0, -5 and past the
 * context, where every refusal is one clear error that writes nothing, and generation that ends exactly at the last
 * position still agrees with the full forward pass. Output buffers are malloc'd to their exact size, so the
 * sanitizer build catches any write past them. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/generate.h"
#include "model/presets.h"
#include "train/engine.h"

enum { V = 53, PROMPT = 5, NEW = 20, T = PROMPT + NEW };

static snug_model_config config(snug_arch arch) {
    snug_model_config c;
    snug_error e = {0};
    snug_preset(&c, arch == SNUG_ARCH_GPT2 ? "gpt2-124m" : "tiny-llama", V, &e);
    c.hidden_size = 32, c.intermediate_size = 48, c.n_layer = 2, c.n_head = 4;
    c.n_kv_head = arch == SNUG_ARCH_GPT2 ? 4 : 2;
    c.head_dim = 8, c.max_position = 64;
    c.initializer_range = 0.5f; /* large weights: logits far apart, so argmax ties cannot hide a difference */
    return c;
}

/* argmax of the last position's logits after a full forward over ids[0..n) */
static int full_forward_next(snug_engine *g, const int32_t *ids, int n) {
    snug_model *m = &g->model;
    int32_t labels[T], pos[T];
    for (int t = 0; t < n; t++)
        labels[t] = -1, pos[t] = t;
    snug_model_set_batch(m, ids, labels, pos, NULL, 1, n);
    snug_model_step(m, 0.0f);
    float logits[V];
    m->be->matmul_fwd(m->be, logits, m->lnf + (size_t)(n - 1) * m->cfg.hidden_size, m->w.lm_head, NULL, 1,
                      m->cfg.hidden_size, V);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* W > 0: layer 1 attends within a sliding window of W keys (the full forward's first keys, the decoder's rows) */
static void test_arch(snug_arch arch, int W) {
    const char *name = W ? "llama, a sliding window on layer 1" : arch == SNUG_ARCH_GPT2 ? "gpt2" : "llama";
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = config(arch), .B = 1, .T = T, .lv = {.ckpt_every = 1}, .with_grads = 0};
    spec.cfg.sliding_window = W;
    spec.cfg.layer_sliding[1] = W > 0;
    snug_engine g;
    if (snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 2, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    snug_model_init_random(&g.model, 3);
    int32_t prompt[PROMPT] = {1, 7, 22, 9, 40}, cached[T], full[T];
    snug_sampling greedy = {.temperature = 0.0f};
    int n = snug_generate(&g.model, prompt, PROMPT, NEW, -1, &greedy, cached);
    CHECKF(n == T, "%s: generated %d tokens", name, n);
    memcpy(full, prompt, sizeof prompt);
    for (int t = PROMPT; t < T; t++)
        full[t] = full_forward_next(&g, full, t);
    int same = memcmp(cached, full, sizeof full) == 0;
    CHECKF(same, "%s: KV-cache decoding differs from full forward passes", name);
    printf("  %s: %d greedy tokens with the KV cache %s the full-forward ones\n", name, NEW, same ? "equal" : "DIFFER FROM");

    snug_sampling s = {.temperature = 0.9f, .top_k = 10, .top_p = 0.9f, .seed = 5};
    int32_t a[T], b[T];
    int na = snug_generate(&g.model, prompt, PROMPT, NEW, -1, &s, a);
    int nb = snug_generate(&g.model, prompt, PROMPT, NEW, -1, &s, b);
    CHECKF(na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0, "%s: seeded sampling not reproducible", name);
    int stop = cached[PROMPT + 3];
    int ns = snug_generate(&g.model, prompt, PROMPT, NEW, stop, &greedy, a);
    CHECKF(ns <= PROMPT + 4 && a[ns - 1] == stop, "%s: generation did not stop at the stop token", name);
    snug_engine_free(&g);
}

enum { CTX = 24 }; /* the context of the edge tests: max_position_embeddings and the layout's T */

/* A prompt of n ids in [0, V), malloc'd to its size. */
static int32_t *make_prompt(int n) {
    int32_t *p = malloc((size_t)n * sizeof *p);
    for (int t = 0; t < n; t++)
        p[t] = (t * 7 + 3) % V;
    return p;
}

/* Runs snug_generate_checked into a buffer of exactly `cap` ids filled with -7; returns rc, the count in *n and
 * whether the refusal (rc != 0) left the buffer untouched in *untouched. */
static int run_checked(snug_engine *g, const int32_t *prompt, int n_prompt, int max_new, int cap, int32_t **outp,
                       int *n, int *untouched, snug_error *e) {
    int32_t *out = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *out);
    for (int i = 0; i < cap; i++)
        out[i] = -7;
    snug_sampling greedy = {.temperature = 0.0f};
    memset(e, 0, sizeof *e);
    *n = -1;
    int rc = snug_generate_checked(&g->model, prompt, n_prompt, max_new, -1, &greedy, out, n, e);
    *untouched = 1;
    for (int i = 0; i < cap; i++)
        *untouched &= out[i] == -7;
    *outp = out;
    return rc;
}

static void expect_refused(int line, snug_engine *g, int n_prompt, int max_new, int cap, const char *n1,
                           const char *n2) {
    int32_t *prompt = make_prompt(n_prompt > 0 ? n_prompt : 1), *out;
    snug_error e;
    int n, untouched;
    int rc = run_checked(g, prompt, n_prompt, max_new, cap, &out, &n, &untouched, &e);
    CHECKF(rc == SNUG_EINPUT && e.code == SNUG_EINPUT, "line %d: prompt %d, max_new %d: rc %d (%s)", line, n_prompt,
           max_new, rc, e.msg);
    CHECKF(n == 0 && untouched, "line %d: a refusal wrote to out (n %d)", line, n);
    CHECKF(strstr(e.msg, n1) && (!n2 || strstr(e.msg, n2)), "line %d: message lacks \"%s\" / \"%s\": %s", line, n1,
           n2 ? n2 : "", e.msg);
    /* the entry without an error report refuses too: 0 ids, nothing written */
    snug_sampling greedy = {.temperature = 0.0f};
    for (int i = 0; i < cap; i++)
        out[i] = -7;
    int got = snug_generate(&g->model, prompt, n_prompt, max_new, -1, &greedy, out);
    untouched = 1;
    for (int i = 0; i < cap; i++)
        untouched &= out[i] == -7;
    CHECKF(got == 0 && untouched, "line %d: snug_generate returned %d for refused arguments", line, got);
    free(prompt);
    free(out);
}
#define EXPECT_REFUSED(g, np, mn, cap, n1, n2) expect_refused(__LINE__, g, np, mn, cap, n1, n2)

/* Generates from an n_prompt-token prompt with max_new tokens into an exactly sized buffer; checks the count, the
 * prompt copied, the ids in range and (when tokens were generated) the last one against the full forward pass. */
static void expect_generated(int line, snug_engine *g, int n_prompt, int max_new) {
    int32_t *prompt = make_prompt(n_prompt), *out;
    snug_error e;
    int n, untouched;
    int rc = run_checked(g, prompt, n_prompt, max_new, n_prompt + max_new, &out, &n, &untouched, &e);
    CHECKF(rc == 0, "line %d: prompt %d, max_new %d: %s", line, n_prompt, max_new, e.msg);
    CHECKF(n == n_prompt + max_new, "line %d: %d ids, want %d", line, n, n_prompt + max_new);
    if (rc == 0 && n == n_prompt + max_new) {
        CHECKF(memcmp(out, prompt, (size_t)n_prompt * sizeof *out) == 0, "line %d: prompt not copied", line);
        int ok = 1;
        for (int t = n_prompt; t < n; t++)
            ok &= out[t] >= 0 && out[t] < V;
        CHECKF(ok, "line %d: a generated id is outside the vocabulary", line);
        if (max_new > 0 && ok) {
            int want = full_forward_next(g, out, n - 1);
            CHECKF(out[n - 1] == want, "line %d: last token %d, full forward %d", line, out[n - 1], want);
        }
    }
    free(prompt);
    free(out);
}
#define EXPECT_GENERATED(g, np, mn) expect_generated(__LINE__, g, np, mn)

static void test_context_edges(snug_arch arch) {
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = config(arch), .B = 1, .T = CTX, .lv = {.ckpt_every = 1}, .with_grads = 0};
    spec.cfg.max_position = CTX;
    snug_engine g;
    if (snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 2, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    snug_model_init_random(&g.model, 3);

    /* prompt lengths around the context */
    EXPECT_GENERATED(&g, CTX - 1, 0);
    EXPECT_GENERATED(&g, CTX - 1, 1); /* the last position of the context */
    EXPECT_GENERATED(&g, CTX, 0);
    EXPECT_REFUSED(&g, CTX, 1, CTX + 1, "plus max_new_tokens (1)", "at most 0");
    EXPECT_REFUSED(&g, CTX + 1, 0, CTX + 1, "the prompt is 25 tokens", "context holds 24");
    EXPECT_REFUSED(&g, CTX + 1, 0, CTX + 1, "shorten the prompt to at most 24 tokens", NULL);
    EXPECT_REFUSED(&g, 3 * CTX, 0, 3 * CTX, "the prompt is 72 tokens", "context holds 24");
    /* as the command line and the trainer call it: max_new = context - prompt, negative for a long prompt */
    EXPECT_REFUSED(&g, 3 * CTX, CTX - 3 * CTX, CTX, "the prompt is 72 tokens", NULL);
    EXPECT_REFUSED(&g, 0, 5, 5, "the prompt has 0 tokens", NULL);

    /* max_new_tokens */
    EXPECT_GENERATED(&g, 5, 0);
    EXPECT_REFUSED(&g, 5, -5, 1, "max_new_tokens is -5", "0 or more");
    EXPECT_GENERATED(&g, 5, CTX - 5); /* runs up to the context's end exactly */
    EXPECT_REFUSED(&g, 5, CTX - 4, CTX + 1, "needs 25 positions", "lower max_new_tokens to at most 19");
    EXPECT_REFUSED(&g, 5, INT_MAX, CTX, "max_new_tokens (2147483647)", "at most 19");

    /* a prompt id outside the vocabulary would read past the embedding table */
    int32_t bad[3] = {1, V, 2}, out[4];
    int n = -1;
    CHECK(snug_generate_checked(&g.model, bad, 3, 1, -1, NULL, out, &n, &e) == SNUG_EINPUT && n == 0 &&
          strstr(e.msg, "prompt token 53 (at position 1)"));
    printf("  %s: context %d: prompts of %d..%d tokens and max_new_tokens -5..INT_MAX refused or generated\n",
           arch == SNUG_ARCH_GPT2 ? "gpt2" : "llama", CTX, CTX - 1, 3 * CTX);
    snug_engine_free(&g);
}

int main(void) {
    test_arch(SNUG_ARCH_LLAMA, 0);
    test_arch(SNUG_ARCH_GPT2, 0);
    test_arch(SNUG_ARCH_LLAMA, 4);
    test_context_edges(SNUG_ARCH_LLAMA);
    test_context_edges(SNUG_ARCH_GPT2);
    return check_finish("test_generate");
}
