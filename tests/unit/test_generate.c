/* test_generate.c: decoding with the KV cache against full forward passes.
 *
 * Greedy generation (temperature 0) through snug_generate, which runs one row per new token against the cached keys
 * and values, must pick the same tokens as recomputing the whole sequence with the training forward pass and taking
 * the argmax of the last position; and sampling with a seed must be reproducible. Llama (GQA, RoPE) and GPT-2. */
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

static void test_arch(snug_arch arch) {
    const char *name = arch == SNUG_ARCH_GPT2 ? "gpt2" : "llama";
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = config(arch), .B = 1, .T = T, .lv = {.ckpt_every = 1}, .with_grads = 0};
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

int main(void) {
    test_arch(SNUG_ARCH_LLAMA);
    test_arch(SNUG_ARCH_GPT2);
    return check_finish("test_generate");
}
