/* test_packing_model.c: packing and padding change neither the loss nor the gradients, through the library.
 *
 * Seven examples of awkward lengths (with unsupervised prompt tokens) are run three ways on the same small model:
 * each example alone (one row of its own length, plain causal attention, positions 0..L-1: the reference), packed by
 * the loader into rows of T (several examples per row, seg starts, positions restarting), and padded by the loader
 * (dynamically, and to T). The summed loss and every gradient must agree to 1e-5 relative in fp32, for Llama (RoPE,
 * GQA) and GPT-2 (learned positions), with the tiled and the naive attention, chunked cross-entropy and full
 * checkpointing, and for Llama with a sliding window on one layer (the window stays inside each example). The packed
 * rows run with plain causal attention (seg ignored) must disagree: the test can see cross-contamination. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/batching.h"
#include "model/presets.h"
#include "train/engine.h"

enum { V = 61, T = 32, B = 4, NEX = 7 };
static const uint32_t lens[NEX] = {5, 17, 9, 30, 3, 12, 21};

/* The examples: random ids; the first third of each example unsupervised (a prompt). */
typedef struct data {
    int32_t ids[256];
    uint8_t sup[256];
    uint64_t start[NEX + 1];
    snug_dataset ds;
} data;

static void make_data(data *d) {
    srand(11);
    d->start[0] = 0;
    for (int i = 0; i < NEX; i++) {
        d->start[i + 1] = d->start[i] + lens[i];
        for (uint32_t j = 0; j < lens[i]; j++) {
            d->ids[d->start[i] + j] = rand() % V;
            d->sup[d->start[i] + j] = j >= lens[i] / 3;
        }
    }
    d->ds = (snug_dataset){.ids = d->ids, .sup = d->sup, .start = d->start, .nexamples = NEX,
                           .ntokens = d->start[NEX]};
}


/* Each example alone: labels from the next token of the example, positions 0..L-1, no seg. */
static double run_separate(snug_engine *g, const data *d, float scale) {
    double loss = 0;
    for (int i = 0; i < NEX; i++) {
        int L = (int)lens[i];
        int32_t ids[T], labels[T], pos[T];
        for (int j = 0; j < L; j++) {
            size_t k = d->start[i] + j;
            ids[j] = d->ids[k];
            labels[j] = j + 1 < L && d->sup[k + 1] ? d->ids[k + 1] : -1;
            pos[j] = j;
        }
        snug_model_set_batch(&g->model, ids, labels, pos, NULL, 1, L);
        loss += snug_model_step(&g->model, scale);
    }
    return loss;
}

/* Every micro-batch of one epoch of the loader; use_seg 0 drops the segment starts (plain causal attention). */
static double run_loader(snug_engine *g, const data *d, snug_batching how, int fixed, float scale, int use_seg,
                         int *rows_seen) {
    snug_batching_opts o = {.how = how, .B = B, .T = T, .pad_to_sequence_len = fixed, .shuffle = 1, .seed = 3,
                            .pad_id = 7};
    snug_loader l;
    snug_error e = {0};
    if (snug_loader_init(&l, &d->ds, &o, &e)) {
        fprintf(stderr, "loader: %s\n", e.msg);
        exit(1);
    }
    int32_t ids[B * T], labels[B * T], pos[B * T], seg[B * T];
    snug_micro_batch mb = {.ids = ids, .labels = labels, .pos = pos, .seg = seg};
    double loss = 0;
    *rows_seen = 0;
    while (snug_loader_next(&l, &mb) > 0) {
        snug_model_set_batch(&g->model, ids, labels, pos, use_seg ? seg : NULL, mb.rows, mb.T);
        loss += snug_model_step(&g->model, scale);
        *rows_seen += mb.rows;
    }
    snug_loader_free(&l);
    return loss;
}

/* W > 0: layer 0 attends within a sliding window of W keys, which must stay inside each packed example */
static void test_case(snug_arch arch, snug_levers lv, const char *what, int W) {
    const char *name = arch == SNUG_ARCH_GPT2 ? "gpt2" : "llama";
    snug_model_config cfg = check_small_model(arch, V, 2, 128, 64);
    cfg.sliding_window = W;
    cfg.layer_sliding[0] = W > 0;
    data d;
    make_data(&d);
    snug_engine g;
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = cfg, .B = B, .T = T, .lv = lv, .with_grads = 1};
    if (snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 2, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        exit(1);
    }
    snug_model_init_random(&g.model, 5);
    size_t P = g.model.table.total;
    float *ref = malloc(P * sizeof *ref), *got = malloc(P * sizeof *got);

    /* the scale: 1 / supervised tokens of all examples, the trainer's normalisation */
    size_t nsup = 0;
    for (int i = 0; i < NEX; i++)
        for (uint32_t j = 1; j < lens[i]; j++)
            nsup += d.sup[d.start[i] + j];
    float scale = 1.0f / (float)nsup;

    g.be->zero(g.be, g.model.grads, P * sizeof(float));
    double loss_ref = run_separate(&g, &d, scale);
    memcpy(ref, g.model.grads, P * sizeof *ref);

    struct {
        const char *how;
        snug_batching b;
        int fixed, rows;
    } ways[] = {{"packed", SNUG_BATCHING_PACK, 0, 4}, {"dynamic padding", SNUG_BATCHING_PAD, 0, NEX},
                {"padding to T", SNUG_BATCHING_PAD, 1, NEX}, {"grouped", SNUG_BATCHING_GROUP, 0, NEX}};
    for (size_t k = 0; k < sizeof ways / sizeof *ways; k++) {
        int rows;
        g.be->zero(g.be, g.model.grads, P * sizeof(float));
        double loss = run_loader(&g, &d, ways[k].b, ways[k].fixed, scale, 1, &rows);
        memcpy(got, g.model.grads, P * sizeof *got);
        double eg = check_max_rel_f(got, ref, P), el = fabs(loss - loss_ref) / loss_ref;
        CHECKF(rows == ways[k].rows, "%s %s %s: %d rows, want %d", name, what, ways[k].how, rows, ways[k].rows);
        CHECKF(eg < 1e-5 && el < 1e-5, "%s %s %s: gradient rel %.2e, loss %.9g vs %.9g separately", name, what,
               ways[k].how, eg, loss, loss_ref);
        printf("  %-5s %-28s %-16s vs each example alone: loss rel %.1e, gradient max rel %.1e\n", name, what,
               ways[k].how, el, eg);
    }

    /* the same packed rows with plain causal attention: examples see the ones before them, and it shows */
    if (!lv.naive_attention) {
        int rows;
        g.be->zero(g.be, g.model.grads, P * sizeof(float));
        double loss = run_loader(&g, &d, SNUG_BATCHING_PACK, 0, scale, 0, &rows);
        memcpy(got, g.model.grads, P * sizeof *got);
        double eg = check_max_rel_f(got, ref, P), el = fabs(loss - loss_ref) / loss_ref;
        CHECKF(eg > 1e-3 && el > 1e-6, "%s %s: packed without seg should differ (gradient rel %.2e, loss rel %.2e)",
               name, what, eg, el);
    }
    free(ref);
    free(got);
    snug_engine_free(&g);
}

int main(void) {
    for (int a = 0; a < 2; a++) {
        snug_arch arch = a ? SNUG_ARCH_GPT2 : SNUG_ARCH_LLAMA;
        test_case(arch, (snug_levers){.ckpt_every = 1}, "tiled attention", 0);
        test_case(arch, (snug_levers){.ckpt_every = 1, .naive_attention = 1}, "naive attention", 0);
        test_case(arch, (snug_levers){.ckpt = SNUG_CKPT_FULL, .ckpt_every = 1, .xent_chunk = 7},
                  "full ckpt + chunked CE", 0);
    }
    test_case(SNUG_ARCH_LLAMA, (snug_levers){.ckpt_every = 1}, "tiled, window 6 on layer 0", 6);
    test_case(SNUG_ARCH_LLAMA, (snug_levers){.ckpt_every = 1, .naive_attention = 1}, "naive, window 6 on layer 0", 6);
    return check_finish("test_packing_model");
}
