/* test_levers.c: every activation lever against the run without it.
 *
 * Gradient checkpointing (selective, full, full every 2nd layer) must give bitwise the same gradients; the naive
 * attention path and chunked cross-entropy agree to fp32 rounding; N micro-batches of uneven supervised token counts
 * give the same gradients, loss and AdamW update as one batch holding them all. Also checks the memory each lever
 * saves, from the plan (which is the allocation). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/presets.h"
#include "train/engine.h"

enum { B = 4, T = 19 };

typedef struct batch {
    int32_t ids[B * T], labels[B * T], pos[B * T];
} batch;

/* Random tokens; rows get different numbers of supervised tokens so micro-batches are uneven. */
static void make_batch(batch *b, unsigned seed) {
    srand(seed);
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) {
            int n = r * T + t;
            b->ids[n] = rand() % 61;
            b->pos[n] = t;
            b->labels[n] = (t < 2 + 4 * r || t == T - 1) ? -1 : rand() % 61;
        }
}

static size_t count_sup(const int32_t *labels, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += labels[i] >= 0;
    return k;
}

/* Gradients (flat copy) and loss sum of one step over rows [r0, r1) of the batch, in micro-batches split at cut[]. */
static double run(const snug_model_config *cfg, snug_levers lv, const batch *b, const int *cuts, int ncuts,
                  float *grads_out, float *params_after, size_t *acts_bytes, size_t *ws_bytes) {
    snug_engine g;
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = *cfg, .B = B, .T = T, .lv = lv, .with_grads = 1};
    if (snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 2, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        exit(1);
    }
    snug_model_init_random(&g.model, 7);
    size_t P = g.model.table.total;
    g.be->zero(g.be, g.model.grads, P * sizeof(float));
    float scale = 1.0f / (float)count_sup(b->labels, B * T);
    double loss = 0;
    int start = 0;
    for (int k = 0; k <= ncuts; k++) {
        int end = k < ncuts ? cuts[k] : B;
        snug_model_set_batch(&g.model, b->ids + start * T, b->labels + start * T, b->pos + start * T, NULL,
                             end - start, T);
        loss += snug_model_step(&g.model, scale);
        start = end;
    }
    memcpy(grads_out, g.model.grads, P * sizeof(float));
    if (params_after) {
        /* eps 1e-6: Adam's first step is about lr * sign(g) for any |g| >> eps, so elements whose gradient is at
         * fp32 rounding level (1e-8 here) would step by a sign set by rounding; with eps above that level their
         * step stays proportional to the gradient and the comparison measures the accumulation, not rounding */
        g.opt.beta1 = 0.9, g.opt.beta2 = 0.999, g.opt.eps = 1e-6, g.opt.weight_decay = 0.1;
        snug_adamw_step(&g.opt, g.be, &g.model.table, g.model.params, g.model.grads, 1e-3, 1.0f);
        memcpy(params_after, g.model.params, P * sizeof(float));
    }
    if (acts_bytes)
        *acts_bytes = g.plan.bytes[SNUG_MEM_ACTS];
    if (ws_bytes)
        *ws_bytes = g.plan.bytes[SNUG_MEM_WORKSPACE];
    snug_engine_free(&g);
    return loss;
}


static void test_arch(snug_arch arch) {
    const char *name = arch == SNUG_ARCH_GPT2 ? "gpt2" : "llama";
    snug_model_config cfg = check_small_model(arch, 61, 3, 128, 64);
    snug_param_table t;
    snug_error e = {0};
    snug_param_table_build(&t, &cfg, &e);
    size_t P = t.total;
    snug_param_table_free(&t);
    batch b;
    make_batch(&b, 3);
    float *ref = malloc(P * sizeof *ref), *got = malloc(P * sizeof *got);
    float *pa = malloc(P * sizeof *pa), *pb = malloc(P * sizeof *pb);
    snug_levers base = {.ckpt = SNUG_CKPT_NONE, .ckpt_every = 1};
    size_t acts0, ws0, acts, ws;
    double loss0 = run(&cfg, base, &b, NULL, 0, ref, pa, &acts0, &ws0);

    struct {
        const char *what;
        snug_levers lv;
        int bitwise;
    } cases[] = {
        {"selective checkpointing", {.ckpt = SNUG_CKPT_SELECTIVE, .ckpt_every = 1}, 1},
        {"full checkpointing", {.ckpt = SNUG_CKPT_FULL, .ckpt_every = 1}, 1},
        {"full checkpointing every 2nd layer", {.ckpt = SNUG_CKPT_FULL, .ckpt_every = 2}, 1},
        {"naive attention", {.ckpt_every = 1, .naive_attention = 1}, 0},
        {"chunked cross-entropy (chunk 7)", {.ckpt_every = 1, .xent_chunk = 7}, 0},
        {"all levers", {.ckpt = SNUG_CKPT_FULL, .ckpt_every = 2, .naive_attention = 1, .xent_chunk = 5}, 0},
        /* a tiled MLP: GEMMs over fewer rows at a time, so agreement to fp32 rounding */
        {"tiled MLP (3 shards)", {.ckpt_every = 1, .mlp_shards = 3}, 0},
        {"tiled MLP (auto shards)", {.ckpt_every = 1, .mlp_shards = -1}, 0},
        {"tiled MLP + selective checkpointing", {.ckpt = SNUG_CKPT_SELECTIVE, .ckpt_every = 1, .mlp_shards = 5}, 0},
        {"tiled MLP + full checkpointing every 2nd", {.ckpt = SNUG_CKPT_FULL, .ckpt_every = 2, .mlp_shards = 4}, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        double loss = run(&cfg, cases[k].lv, &b, NULL, 0, got, NULL, &acts, &ws);
        double err = check_max_rel_f(got, ref, P);
        if (cases[k].bitwise) {
            CHECKF(memcmp(got, ref, P * sizeof *got) == 0 && loss == loss0, "%s %s: gradients not bitwise equal "
                   "(max rel %.2e)", name, cases[k].what, err);
        } else {
            CHECKF(err < 1e-5 && fabs(loss - loss0) / loss0 < 1e-6, "%s %s: gradient rel %.2e, loss %.9g vs %.9g",
                   name, cases[k].what, err, loss, loss0);
        }
        printf("  %s %-36s grad max rel %.1e  saved activations %7zu B  workspace %7zu B\n", name, cases[k].what,
               err, acts, ws);
    }

    /* gradient accumulation: micro-batches of 1, 2 and 1 rows with uneven supervised counts */
    int cuts[2] = {1, 3};
    double loss_ga = run(&cfg, base, &b, cuts, 2, got, pb, NULL, NULL);
    double eg = check_max_rel_f(got, ref, P), ep = check_max_rel_f(pb, pa, P), el = fabs(loss_ga - loss0) / loss0;
    CHECKF(eg < 1e-6, "%s accumulation: gradient rel %.2e", name, eg);
    CHECKF(ep < 1e-6, "%s accumulation: AdamW update rel %.2e", name, ep);
    CHECKF(el < 1e-6, "%s accumulation: loss %.9g vs %.9g", name, loss_ga, loss0);
    printf("  %s accumulation over 3 uneven micro-batches: grad rel %.1e, update rel %.1e, loss rel %.1e\n", name, eg,
           ep, el);
    free(ref);
    free(got);
    free(pa);
    free(pb);
}

/* The memory claims, from the plan of a Llama with 8 layers at batch 1. */
static void test_memory(void) {
    snug_model_config cfg = check_small_model(SNUG_ARCH_LLAMA, 61, 3, 128, 64);
    cfg.n_layer = 8, cfg.hidden_size = 256, cfg.n_head = 8, cfg.n_kv_head = 4, cfg.head_dim = 32;
    cfg.intermediate_size = 688, cfg.max_position = 4096, cfg.vocab_size = 32000;
    snug_error e = {0};
    snug_plan p0, p1, p2;
    snug_plan_spec s = {.cfg = cfg, .B = 1, .T = 1024, .lv = {.ckpt_every = 1}, .with_grads = 1};
    CHECK(snug_plan_run(&p0, &s, &e) == 0);
    s.lv.ckpt = SNUG_CKPT_FULL;
    CHECK(snug_plan_run(&p1, &s, &e) == 0);
    double ratio = (double)p0.bytes[SNUG_MEM_ACTS] / (double)p1.bytes[SNUG_MEM_ACTS];
    CHECKF(ratio >= 4.0, "full checkpointing saves only %.2fx of saved activations", ratio);
    printf("  8 layers, batch 1, T 1024: saved activations %.1f MiB -> %.1f MiB with full checkpointing (%.1fx)\n",
           p0.bytes[SNUG_MEM_ACTS] / 1048576.0, p1.bytes[SNUG_MEM_ACTS] / 1048576.0, ratio);
    s.lv.ckpt = SNUG_CKPT_NONE;
    s.lv.xent_chunk = 256;
    CHECK(snug_plan_run(&p2, &s, &e) == 0);
    CHECKF(p2.bytes[SNUG_MEM_WORKSPACE] + (size_t)(1024 - 256) * 32000 * 4 <= p0.bytes[SNUG_MEM_WORKSPACE] + 64,
           "chunked cross-entropy must drop (1024-256) x V fp32 logits from the workspace");
    printf("  chunked cross-entropy (256 tokens): workspace %.1f MiB -> %.1f MiB\n",
           p0.bytes[SNUG_MEM_WORKSPACE] / 1048576.0, p2.bytes[SNUG_MEM_WORKSPACE] / 1048576.0);
    /* a tiled MLP in 4 shards: no layer saves its MLP activations (fc and act, 3 x 688 per token), and the
     * workspace holds one shard of them (plus their gradients) instead of every token's */
    snug_plan p3, p4, p5;
    s.lv.xent_chunk = 0;
    s.lv.mlp_shards = 4;
    CHECK(snug_plan_run(&p3, &s, &e) == 0);
    size_t mlp_tok = (size_t)3 * 688 * 4, tiled_saved = (size_t)8 * 1024 * mlp_tok;
    CHECKF(p3.bytes[SNUG_MEM_ACTS] + tiled_saved <= p0.bytes[SNUG_MEM_ACTS] + 64,
           "tiled MLP must drop every layer's fc and act (%zu B) from the saved activations: %zu -> %zu", tiled_saved,
           p0.bytes[SNUG_MEM_ACTS], p3.bytes[SNUG_MEM_ACTS]);
    s.lv.ckpt = SNUG_CKPT_FULL;
    s.lv.mlp_shards = 0;
    CHECK(snug_plan_run(&p4, &s, &e) == 0);
    s.lv.mlp_shards = 4;
    CHECK(snug_plan_run(&p5, &s, &e) == 0);
    size_t shard_saving = (size_t)2 * (1024 - 256) * mlp_tok; /* fc, act and their gradients for 768 fewer tokens */
    CHECKF(p5.bytes[SNUG_MEM_WORKSPACE] + shard_saving <= p4.bytes[SNUG_MEM_WORKSPACE] + 64,
           "tiled MLP under full checkpointing must shrink the workspace by %zu B: %zu -> %zu", shard_saving,
           p4.bytes[SNUG_MEM_WORKSPACE], p5.bytes[SNUG_MEM_WORKSPACE]);
    printf("  tiled MLP (4 shards): saved activations %.1f -> %.1f MiB; under full checkpointing workspace %.1f -> "
           "%.1f MiB\n", p0.bytes[SNUG_MEM_ACTS] / 1048576.0, p3.bytes[SNUG_MEM_ACTS] / 1048576.0,
           p4.bytes[SNUG_MEM_WORKSPACE] / 1048576.0, p5.bytes[SNUG_MEM_WORKSPACE] / 1048576.0);
    s.lv.ckpt = SNUG_CKPT_NONE;
    s.lv.mlp_shards = 0;
    /* attention memory: linear in T with the tiled path, quadratic with the naive one */
    size_t prev_flash = 0, prev_naive = 0;
    for (int T2 = 512; T2 <= 4096; T2 *= 2) {
        snug_plan pf, pn;
        snug_plan_spec a = {.cfg = cfg, .B = 1, .T = T2, .lv = {.ckpt_every = 1}, .with_grads = 1};
        snug_plan_run(&pf, &a, &e);
        a.lv.naive_attention = 1;
        snug_plan_run(&pn, &a, &e);
        if (prev_flash) {
            double gf = (double)pf.bytes[SNUG_MEM_ACTS] / prev_flash, gn = (double)pn.bytes[SNUG_MEM_ACTS] / prev_naive;
            CHECKF(gf < 2.05, "flash attention activations grew %.2fx when T doubled", gf);
            CHECKF(gn > 2.5, "naive attention activations grew only %.2fx when T doubled", gn);
        }
        printf("  T %4d: saved activations flash %8.1f MiB, naive %8.1f MiB\n", T2, pf.bytes[SNUG_MEM_ACTS] / 1048576.0,
               pn.bytes[SNUG_MEM_ACTS] / 1048576.0);
        prev_flash = pf.bytes[SNUG_MEM_ACTS];
        prev_naive = pn.bytes[SNUG_MEM_ACTS];
    }
}

int main(void) {
    test_arch(SNUG_ARCH_LLAMA);
    test_arch(SNUG_ARCH_GPT2);
    test_memory();
    return check_finish("test_levers");
}
