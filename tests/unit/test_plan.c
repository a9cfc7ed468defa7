/* test_plan.c: the planner against published figures and against itself: parameter counts of the Llama 2/3 fixtures
 * (tests/data/configs), bytes per parameter of fp32 and 8-bit AdamW, what each lever saves (and that a lever saves in
 * the category it should), the fit search and auto_fit (the options and the spec agree afterwards), the over-budget
 * error, the GPU table, the runtime overhead, the plan flags, the SVG chart and memory.json. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/fileio.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/quant4.h"
#include "model/safetensors.h"
#include "optim/optim.h"
#include "plan/autofit.h"
#include "plan/gpus.h"
#include "plan/plan.h"
#include "plan/ranks.h"
#include "cli/options.h"
#include "cli/plan_cmd.h"
#include "plan/plan_json.h"
#include "train/config.h"
#include "train/setup.h"
#include "plan/svg.h"
#include "train/trainer.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static snug_model_config load_fixture(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/configs/%s/config.json", SNUG_SOURCE_DIR, name);
    snug_model_config c;
    snug_error e = {0};
    memset(&c, 0, sizeof c);
    CHECKF(snug_model_config_load(&c, path, &e) == 0, "%s: %s", name, e.msg);
    return c;
}

static snug_plan_spec spec_of(const snug_model_config *c, int B, int T) {
    return (snug_plan_spec){.cfg = *c, .B = B, .T = T, .lv = {.ckpt_every = 1}, .with_grads = 1};
}

static snug_plan plan_of(const snug_plan_spec *s) {
    snug_plan p;
    snug_error e = {0};
    CHECKF(snug_plan_run(&p, s, &e) == 0, "%s", e.msg);
    return p;
}

/* Published parameter counts (Hugging Face model cards / safetensors index totals). */
static void test_fixtures(void) {
    static const struct { const char *name; long long params; } m[] = {
        {"llama-2-7b", 6738415616LL},  {"llama-2-13b", 13015864320LL}, {"llama-2-70b", 68976648192LL},
        {"llama-3.1-8b", 8030261248LL}, {"llama-3.2-3b", 3212749824LL},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        snug_model_config c = load_fixture(m[i].name);
        CHECKF(snug_model_config_nparams(&c) == m[i].params, "%s: %lld parameters", m[i].name,
               snug_model_config_nparams(&c));
        snug_plan_spec s = spec_of(&c, 1, 512);
        snug_plan p = plan_of(&s);
        CHECK(p.nparams == m[i].params);
        /* fp32 AdamW: 4 (weights) + 4 (gradients) + 8 (m, v) = 16 bytes per parameter, up to arena alignment */
        double P = (double)p.nparams;
        CHECK(fabs(p.bytes[SNUG_MEM_PARAMS] / P - 4) < 1e-6 && fabs(p.bytes[SNUG_MEM_GRADS] / P - 4) < 1e-6);
        CHECKF(fabs(p.bytes[SNUG_MEM_OPTIM] / P - 8) < 1e-6, "%s: optimizer %.6f B/param", m[i].name,
               p.bytes[SNUG_MEM_OPTIM] / P);
        CHECK(p.bytes[SNUG_MEM_MASTER] == 0);
        /* 8-bit AdamW: 2 bytes + 2 fp32 absmax per 256 elements = 2.03 bytes per parameter of the tensors that keep
         * 8-bit state (bitsandbytes), 8 for the others (small tensors, and whatever snug_adamw_entry_8bit leaves
         * in fp32) */
        s.optim = SNUG_OPTIM_ADAMW_8BIT;
        snug_plan q = plan_of(&s);
        snug_param_table t;
        snug_error e = {0};
        CHECK(snug_param_table_build(&t, &c, &e) == 0);
        snug_adamw opt = {.kind = SNUG_OPTIM_ADAMW_8BIT};
        double want = 0, n8 = 0;
        for (int k = 0; k < t.n; k++) {
            size_t n = t.e[k].numel;
            int q8 = snug_adamw_entry_8bit(&opt, &t.e[k]);
            want += q8 ? 2.0 * n + 8.0 * ((n + SNUG_Q8_BLOCK - 1) / SNUG_Q8_BLOCK) : 8.0 * n;
            n8 += q8 ? (double)n : 0;
        }
        snug_param_table_free(&t);
        double b8 = q.bytes[SNUG_MEM_OPTIM] / P;
        CHECKF(fabs(q.bytes[SNUG_MEM_OPTIM] / want - 1) < 1e-3, "%s: 8-bit AdamW state %.4f B/param", m[i].name, b8);
        CHECK(n8 > 0.8 * P && b8 < 2.8); /* the matrices of the layers carry most of the parameters */
        s.optim_paged = 1;
        q = plan_of(&s);
        CHECK(q.host[SNUG_MEM_OPTIM] && q.host_total >= q.bytes[SNUG_MEM_OPTIM] && q.total < p.total);
    }
}

/* Each lever saves in its own category, and full checkpointing saves about 4x or more of the activations. */
static void test_levers(void) {
    snug_model_config c = load_fixture("llama-3.2-3b");
    snug_plan_spec s = spec_of(&c, 1, 4096);
    snug_plan none = plan_of(&s);
    s.lv.ckpt = SNUG_CKPT_SELECTIVE;
    snug_plan sel = plan_of(&s);
    s.lv.ckpt = SNUG_CKPT_FULL;
    snug_plan full = plan_of(&s);
    s.lv.ckpt_every = 2;
    snug_plan half = plan_of(&s);
    double a0 = (double)none.bytes[SNUG_MEM_ACTS];
    CHECK(sel.bytes[SNUG_MEM_ACTS] < none.bytes[SNUG_MEM_ACTS]);
    CHECK(half.bytes[SNUG_MEM_ACTS] < sel.bytes[SNUG_MEM_ACTS] || half.bytes[SNUG_MEM_ACTS] < a0);
    CHECK(full.bytes[SNUG_MEM_ACTS] < half.bytes[SNUG_MEM_ACTS]);
    CHECKF(a0 / (double)full.bytes[SNUG_MEM_ACTS] > 4.0, "full checkpointing saves only %.2fx",
           a0 / (double)full.bytes[SNUG_MEM_ACTS]);
    for (int k = 0; k < SNUG_MEM_NCAT; k++)
        if (k != SNUG_MEM_ACTS && k != SNUG_MEM_WORKSPACE)
            CHECK(full.bytes[k] == none.bytes[k]);

    s = spec_of(&c, 1, 4096);
    s.lv.xent_chunk = 256;
    snug_plan ce = plan_of(&s);
    /* the logits of 4096 - 256 tokens x vocab x 4 bytes are not held */
    double want = (4096.0 - 256) * c.vocab_size * 4;
    CHECKF(fabs(((double)none.bytes[SNUG_MEM_WORKSPACE] - (double)ce.bytes[SNUG_MEM_WORKSPACE]) - want) < 1024,
           "chunked CE saves %.0f, expected %.0f", (double)none.bytes[SNUG_MEM_WORKSPACE] - ce.bytes[SNUG_MEM_WORKSPACE],
           want);
    CHECK(ce.bytes[SNUG_MEM_ACTS] == none.bytes[SNUG_MEM_ACTS]);

    s = spec_of(&c, 1, 1024);
    snug_plan flash = plan_of(&s);
    s.lv.naive_attention = 1;
    snug_plan naive = plan_of(&s);
    CHECK(naive.total >= flash.total);
}

static void test_fit_space(void) {
    snug_model_config c = load_fixture("llama-2-7b");
    snug_plan_spec s = spec_of(&c, 4, 1024);
    snug_fit_space fs;
    snug_error e = {0};
    CHECKF((s.GA = 2, snug_fit_space_build(&fs, &s, SNUG_DEVICE_CUDA, 0, &e)) == 0, "%s", e.msg);
    CHECK(fs.n > 10 && fs.pt[0].changes == 0 && fs.pt[0].cost == 0 && !strcmp(fs.pt[0].what, "as configured"));
    for (int i = 0; i < fs.n; i++) /* the effective batch is kept */
        CHECK(fs.pt[i].spec.B * fs.pt[i].GA == 8);
    double need0 = snug_fit_point_need(&fs, &fs.pt[0]);
    const snug_fit_point *b = snug_fit_best(&fs, 1e15);
    CHECK(b && b->cost <= 0);
    CHECK(snug_fit_best(&fs, 1e9) == NULL); /* 7B in fp32 never fits 1 GB */
    const snug_fit_point *sm = snug_fit_smallest(&fs);
    for (int i = 0; i < fs.n; i++)
        CHECK(snug_fit_point_need(&fs, sm) <= snug_fit_point_need(&fs, &fs.pt[i]));
    /* a capacity between the smallest and the configured run: the choice fits and nothing cheaper fits */
    double cap = 0.5 * (need0 + snug_fit_point_need(&fs, sm));
    b = snug_fit_best(&fs, cap);
    CHECK(b && snug_fit_point_need(&fs, b) <= cap);
    for (int i = 0; b && i < fs.n; i++)
        if (fs.pt[i].cost < b->cost - 1e-9)
            CHECK(snug_fit_point_need(&fs, &fs.pt[i]) > cap);
    snug_lever_effect lev[32];
    int n = snug_fit_levers(&fs, lev, 32);
    int has_full = 0;
    for (int i = 0; i < n; i++) {
        CHECK(lev[i].saves > 0 && lev[i].p->changes == 1);
        if (i)
            CHECK(lev[i].p->cost >= lev[i - 1].p->cost - 1e-12);
        if (!strcmp(lev[i].name, "gradient_checkpointing: full")) {
            has_full = 1;
            CHECK(fabs(lev[i].p->cost - 1.0 / 3.0) < 1e-9); /* one extra forward: 8N instead of 6N FLOPs */
        }
    }
    CHECK(has_full);
    snug_fit_space_free(&fs);
}

/* The levers that depend on other settings are derived from the spec in one place, so a setting the search
 * changes (accumulation) changes them too, and a setting that cannot run is never offered. */
static void test_derived_levers(void) {
    snug_model_config c = load_fixture("llama-2-7b");
    snug_plan_spec s = spec_of(&c, 8, 512);
    s.lv.dt = SNUG_DT_BF16;
    s.lv.master_weights = 1;
    s.GA = 1;
    CHECK(!snug_plan_levers(&s).grads_fp32);
    snug_plan one = plan_of(&s);
    s.GA = 2; /* accumulating: layer gradients are summed in fp32 */
    CHECK(snug_plan_levers(&s).grads_fp32);
    snug_plan two = plan_of(&s);
    CHECKF(two.bytes[SNUG_MEM_GRADS] > one.bytes[SNUG_MEM_GRADS], "grads %zu vs %zu", two.bytes[SNUG_MEM_GRADS],
           one.bytes[SNUG_MEM_GRADS]);
    snug_fit_space fs;
    snug_error e = {0};
    s.GA = 1;
    CHECKF(snug_fit_space_build(&fs, &s, SNUG_DEVICE_CUDA, 0, &e) == 0, "%s", e.msg);
    int accumulating = 0;
    for (int i = 0; i < fs.n; i++) { /* every point is planned with its own accumulation's levers */
        const snug_fit_point *p = &fs.pt[i];
        CHECK(p->spec.GA == p->GA && p->spec.B * p->GA == 8);
        snug_plan again = plan_of(&p->spec);
        CHECK(again.bytes[SNUG_MEM_GRADS] == p->plan.bytes[SNUG_MEM_GRADS] && again.total == p->plan.total);
        if (p->GA > 1) {
            accumulating++;
            CHECK(p->plan.bytes[SNUG_MEM_GRADS] >= two.bytes[SNUG_MEM_GRADS] / 2);
        }
    }
    CHECK(accumulating > 0);
    snug_fit_space_free(&fs);

    /* optimizer_in_backward cannot accumulate: never offered with GA > 1, and refused by the plan */
    s.lv.optimizer_in_backward = 1;
    CHECKF(snug_fit_space_build(&fs, &s, SNUG_DEVICE_CUDA, 0, &e) == 0, "%s", e.msg);
    for (int i = 0; i < fs.n; i++)
        CHECK(fs.pt[i].GA == 1 && fs.pt[i].spec.B == 8);
    snug_fit_space_free(&fs);
    s.GA = 2;
    snug_plan p;
    CHECK(snug_plan_run(&p, &s, &e) == SNUG_EINPUT && strstr(e.msg, "optimizer_in_backward"));
}

static void test_autofit(void) {
    snug_run_config o;
    snug_options_defaults(&o);
    o.micro_batch_size = 8;
    o.gradient_accumulation_steps = 1;
    o.sequence_len = 512;
    snug_model_config c = load_fixture("llama-3.2-3b");
    snug_plan_spec s = snug_run_spec(&o, &c);
    snug_plan p0 = plan_of(&s);
    char note[1024];
    snug_error e = {0};
    snug_fit_point best;

    /* no budget: refused */
    CHECK(snug_autofit(&s, 0, SNUG_DEVICE_CUDA, 0, &best, note, sizeof note, &e) == SNUG_EINPUT);
    CHECK(strstr(e.msg, "memory_budget") != NULL);

    /* 40 GB: the 3B model's 16 bytes per parameter are 48 GB, so the optimizer state must shrink */
    CHECKF(snug_autofit(&s, 40e9, SNUG_DEVICE_CUDA, 0, &best, note, sizeof note, &e) == 0, "%s", e.msg);
    CHECK(best.spec.B * best.spec.GA == 8 && best.GA == best.spec.GA);
    snug_plan p1 = plan_of(&best.spec);
    snug_overhead ov;
    snug_overhead_compute(&ov, SNUG_DEVICE_CUDA, &p1, 0);
    CHECK((double)(p1.total + ov.total) <= 40e9 && p1.total < p0.total);
    CHECKF(strstr(note, "auto_fit: chose") && strstr(note, "does not fit"), "%s", note);

    /* a generous budget keeps the configuration (or makes it faster) */
    CHECKF(snug_autofit(&s, 1e13, SNUG_DEVICE_CUDA, 0, &best, note, sizeof note, &e) == 0, "%s", e.msg);
    CHECK(best.spec.lv.ckpt == SNUG_CKPT_NONE && best.spec.optim == SNUG_OPTIM_ADAMW && !best.spec.optim_paged);

    /* nothing fits 1 GB */
    CHECK(snug_autofit(&s, 1e9, SNUG_DEVICE_CUDA, 0, &best, note, sizeof note, &e) == SNUG_EINPUT);
    CHECKF(strstr(e.msg, "nothing fits") && strstr(e.msg, "smallest"), "%s", e.msg);

    /* the engine's error for a plan over the budget names the largest categories and the levers */
    CHECK(snug_fail_over_budget(&e, &p0, 1e9, 6e8) == SNUG_EINPUT);
    CHECKF(strstr(e.msg, "over memory_budget") && strstr(e.msg, "optimizer state") && strstr(e.msg, "auto_fit"),
           "%s", e.msg);
}

static void test_gpus(void) {
    CHECK(snug_gpu_count() >= 7);
    CHECK(snug_gpu_find("H100") && !strcmp(snug_gpu_find("h100-80gb")->id, "h100"));
    CHECK(snug_gpu_find("RTX_4090") == snug_gpu_find("rtx4090") && snug_gpu_find("4090"));
    CHECK(snug_gpu_find("a100") && snug_gpu_find("a100")->mem_bytes > 80e9);
    CHECK(snug_gpu_find("A100-40GB")->mem_bytes < 45e9);
    CHECK(!snug_gpu_find("tpu-v5") && !snug_gpu_find("") && !snug_gpu_find("h"));
    char list[256];
    snug_gpu_list(list, sizeof list);
    CHECK(strstr(list, "rtx4090") && strstr(list, "h200") && strstr(list, "l40s"));
    const double sizes[] = {24, 40, 48, 48, 80, 80, 141};
    for (int i = 0; i < snug_gpu_count(); i++) /* the marketed GB, within what nvidia-smi shows */
        CHECK(fabs(snug_gpu_at(i)->mem_bytes / 1e9 / sizes[i] - 1.03) < 0.07);

    snug_model_config c = load_fixture("llama-3.1-8b");
    snug_plan_spec s = spec_of(&c, 1, 2048);
    snug_plan p = plan_of(&s);
    snug_overhead ov;
    snug_overhead_compute(&ov, SNUG_DEVICE_CUDA, &p, 1 << 20);
    CHECK(ov.total > ((size_t)512 << 20) && ov.total < (size_t)(0.05 * p.total) + ((size_t)1 << 30));
    for (int i = 0; i < ov.n; i++)
        CHECKF(!strstr(ov.item[i].name, "NCCL"), "one process has no NCCL buffers: %s", ov.item[i].name);
    /* over several GPU ranks, NCCL's buffers (32 channels x 2 peers x 10 MiB) and, in deterministic mode, the
     * communicator's scratch (8 MiB per rank); with the CUDA context about the 1.06 GB reported on 8 x H100 */
    for (int det = 0; det < 2; det++) {
        snug_plan_spec r = s;
        r.ranks = 8, r.zero_stage = 3, r.comm_deterministic = det;
        snug_plan pr = plan_of(&r);
        CHECK(pr.ranks == 8 && pr.comm_scratch == (det ? (size_t)64 << 20 : 0));
        snug_overhead_compute(&ov, SNUG_DEVICE_CUDA, &pr, 0);
        size_t nccl = 0, ctx = 0;
        for (int i = 0; i < ov.n; i++) {
            if (!strcmp(ov.item[i].name, "NCCL buffers"))
                nccl = ov.item[i].bytes;
            if (strstr(ov.item[i].name, "CUDA context"))
                ctx = ov.item[i].bytes;
        }
        CHECKF(nccl == ((size_t)640 << 20) + pr.comm_scratch, "NCCL buffers %zu", nccl);
        CHECK(ctx + nccl - pr.comm_scratch > 1.0e9 && ctx + nccl - pr.comm_scratch < 1.3e9);
        snug_overhead_compute(&ov, SNUG_DEVICE_CPU, &pr, 0); /* CPU ranks: host buffers, not these */
        for (int i = 0; i < ov.n; i++)
            CHECK(!strstr(ov.item[i].name, "NCCL"));
    }
    snug_overhead_compute(&ov, SNUG_DEVICE_CPU, &p, 0);
    CHECK(ov.total == SNUG_CPU_BASELINE_BYTES + SNUG_ST_READ_BLOCK); /* one block of the embedding's file pages */
    snug_overhead_compute(&ov, SNUG_DEVICE_CPU, &p, 1000);
    CHECK(ov.total > SNUG_CPU_BASELINE_BYTES + SNUG_ST_READ_BLOCK + 1000);
    /* 6 N FLOPs per token plus attention. snug's fp32 GEMMs are exact fp32 (no TF32), so fp32 training is priced
     * at the FP32 peaks of the data sheets (H100 SXM 66.9, A100 19.5 TFLOP/s), bf16 at the tensor cores' */
    double f = snug_flops_per_token(&s, p.nparams);
    CHECK(f > 6.0 * p.nparams);
    { /* a sliding window shrinks the attention's share: a window of 1 costs 2 keys per token instead of T */
        snug_plan_spec w = s;
        w.cfg.sliding_window = 1;
        for (int l = 0; l < w.cfg.n_layer; l++)
            w.cfg.layer_sliding[l] = 1;
        double fw = snug_flops_per_token(&w, p.nparams), att = f - 6.0 * p.nparams;
        CHECKF(fabs((fw - 6.0 * p.nparams) - 2 * att / s.T) < 1e-9 * f, "flops per token with a window of 1: %g", fw);
        w.cfg.sliding_window = s.T; /* as long as the rows: no change */
        CHECK(snug_flops_per_token(&w, p.nparams) == f);
    }
    double h = snug_gpu_tokens_per_s(snug_gpu_find("h100"), &s, p.nparams);
    double a = snug_gpu_tokens_per_s(snug_gpu_find("a100"), &s, p.nparams);
    CHECKF(fabs(h * f / (66.9e12 * SNUG_ASSUMED_MFU) - 1) < 1e-9, "h100 fp32 %.3g tok/s", h);
    CHECK(fabs(h / a - 66.9 / 19.5) < 1e-9 && a > 1 && a < 10000);
    s.lv.dt = SNUG_DT_BF16;
    double hb = snug_gpu_tokens_per_s(snug_gpu_find("h100"), &s, p.nparams);
    CHECKF(fabs(hb * f / (989.4e12 * SNUG_ASSUMED_MFU) - 1) < 1e-9, "h100 bf16 %.3g tok/s", hb);
}

static void test_args(void) {
    char *argv0[] = {"cfg.yaml", "--gpu", "H100", "--json", "--learning_rate", "1e-4", "--svg=plan.svg",
                     "--tokens-per-s", "2500", "--price_per_hour", "2.5", "--backend", "cuda", NULL};
    int argc = 13;
    snug_plan_args a;
    snug_error e = {0};
    CHECKF(snug_plan_args_take(&a, &argc, argv0, &e) == 0, "%s", e.msg);
    CHECK(argc == 3 && !strcmp(argv0[0], "cfg.yaml") && !strcmp(argv0[1], "--learning_rate") &&
          !strcmp(argv0[2], "1e-4"));
    CHECK(a.g == snug_gpu_find("h100") && a.json && !strcmp(a.svg, "plan.svg") && a.tokens_per_s == 2500 &&
          a.price_per_hour == 2.5 && a.backend == SNUG_BACKEND_CUDA);
    static const struct { const char *flag, *value, *want; } bad[] = {
        {"--gpu", "tpu", "unknown GPU 'tpu'; snug plan knows rtx4090"},
        {"--backend", "tpu", "--backend must be one of auto, cpu, cuda, got 'tpu'"},
        {"--json=maybe", NULL, "--json must be true or false, got 'maybe'"},
        {"--tokens_per_s", "fast", "--tokens_per_s must be a positive number"},
        {"--price_per_hour", "-1", "--price_per_hour must be a positive number"},
        {"--svg", NULL, "--svg needs a value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {(char *)bad[i].flag, (char *)bad[i].value, NULL};
        int n = bad[i].value ? 2 : 1;
        e.msg[0] = '\0';
        CHECK(snug_plan_args_take(&a, &n, argv, &e) == SNUG_EINPUT);
        CHECKF(strstr(e.msg, bad[i].want) != NULL, "%s", e.msg);
    }
}

static void test_svg_and_json(void) {
    char dir[] = "/tmp/snug_test_plan_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char svg[256], js[256], png[256];
    snprintf(svg, sizeof svg, "%s/plan.svg", dir);
    snprintf(png, sizeof png, "%s/plan.png", dir);
    snprintf(js, sizeof js, "%s/memory.json", dir);
    snug_svg_bar bars[2] = {{.label = "as configured"}, {.label = "gradient_checkpointing: full <&>"}};
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        bars[0].bytes[c] = bars[1].bytes[c] = (c + 1) * GIB;
    bars[1].bytes[SNUG_MEM_ACTS] = 0.5 * GIB;
    bars[0].overhead = bars[1].overhead = 0.6 * GIB;
    snug_svg_line lines[2] = {{"RTX 4090 24GB", 24e9}, {"H200 141GB", 150e9}};
    snug_error e = {0};
    CHECKF(snug_svg_write(svg, "title", bars, 2, lines, 2, &e) == 0, "%s", e.msg);
    char *text = NULL;
    size_t n = 0;
    CHECK(snug_read_file(svg, &text, &n, &e) == 0);
    CHECK(text && !strncmp(text, "<?xml", 5) && strstr(text, "</svg>"));
    CHECK(text && strstr(text, "full &lt;&amp;&gt;") && !strstr(text, "<&>"));
    CHECK(text && strstr(text, "RTX 4090 24GB") && !strstr(text, "H200 141GB")); /* off the scale: not drawn */
    free(text);
    if (snug_svg_to_png(svg, png) == 0)
        CHECK(snug_file_exists(png));
    else
        CHECK(!snug_file_exists(png));
    unlink(png);

    snug_plan_spec s = spec_of(&(snug_model_config){0}, 2, 64);
    snug_plan p = {.total = 300, .nparams = 10};
    size_t measured[SNUG_MEM_NCAT] = {0};
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        p.bytes[c] = measured[c] = 10 * (size_t)(c + 1);
    snug_overhead ov = {.n = 1, .item = {{"process baseline", 100, "measured"}}, .total = 100};
    CHECKF(snug_memory_json_write(js, &s, &p, measured, &ov, 512.0, "cpu", 0.0, &e) == 0, "%s", e.msg);
    json_error_t je;
    json_t *j = json_load_file(js, 0, &je);
    CHECKF(j != NULL, "%s", je.text);
    CHECK(json_integer_value(json_object_get(json_object_get(j, "plan"), "saved activations")) == 50);
    CHECK(json_integer_value(json_object_get(json_object_get(j, "measured"), "data")) == 70);
    CHECK(json_real_value(json_object_get(j, "predicted_rss")) == 400.0);
    CHECK(json_real_value(json_object_get(j, "peak_rss")) == 512.0);
    json_decref(j);
    unlink(js);
    unlink(svg);
    CHECK(rmdir(dir) == 0);
}

/* The plan per rank under LoRA: DDP sums the adapters' gradients alone (their count is the adapter table's); stage 3
 * shards the frozen base (less parameters memory, the same adapters' state) and stages 1 and 2, which do not run
 * with an adapter, are marked so and never chosen; under QLoRA stage 3 shards the 4-bit matrices. */
static void test_ranks_adapters(void) {
    snug_model_config c = load_fixture("llama-3.1-8b");
    for (int k = 0; k < 2; k++) { /* default targets, and every linear module with lm_head saved (untied) */
        snug_plan_spec s = spec_of(&c, 1, 2048);
        s.lv.dt = SNUG_DT_BF16;
        s.lv.lora = (snug_lora_cfg){.kind = SNUG_ADAPTER_LORA, .r = 16, .alpha = 16,
                                    .targets = k ? snug_lora_all_linear(c.arch) : snug_lora_default_targets(c.arch),
                                    .save_modules = k ? SNUG_SAVE_HEAD : 0};
        snug_plan p = plan_of(&s);
        long long want = snug_lora_nparams(&s.cfg, &s.lv.lora);
        CHECKF(p.ntrain == want && want > 0 && want < p.nparams / 10, "adapter floats %lld, counted %lld", p.ntrain,
               want);
        snug_rank_mode m[4];
        int choice;
        snug_error e = {0};
        CHECKF(snug_plan_ranks(&s, 4, snug_gpu_find("rtx4090"), m, &choice, &e) == 0, "%s", e.msg);
        CHECK(!m[0].unbuilt && m[1].unbuilt && m[2].unbuilt && !m[3].unbuilt && strstr(m[1].unbuilt, "adapter"));
        CHECKF(fabs(m[0].comm_bytes - 2.0 * 0.75 * (double)p.ntrain * 4) < 1.0, "DDP sends %.0f bytes", m[0].comm_bytes);
        /* stage 3: the base's gathers (twice per micro-batch, bf16) and the adapters' all-reduce */
        CHECK(fabs(m[3].comm_bytes - (2.0 * 0.75 * (double)p.nparams * 2 + 2.0 * 0.75 * (double)p.ntrain * 4)) < 1.0);
        CHECK(m[3].bytes[SNUG_MEM_PARAMS] < m[0].bytes[SNUG_MEM_PARAMS] / 2 &&
              m[3].bytes[SNUG_MEM_OPTIM] == m[0].bytes[SNUG_MEM_OPTIM] &&
              m[3].bytes[SNUG_MEM_GRADS] == m[0].bytes[SNUG_MEM_GRADS]);
        CHECK(choice == 0 || choice == 3 || choice == -1);
        s.lv.lora.kind = SNUG_ADAPTER_QLORA;
        s.lv.lora.q4_nested = 1, s.lv.lora.q4_blocksize = 64;
        CHECKF(snug_plan_ranks(&s, 4, snug_gpu_find("rtx4090"), m, &choice, &e) == 0, "%s", e.msg);
        CHECK(!m[0].unbuilt && m[1].unbuilt && m[2].unbuilt && !m[3].unbuilt);
        /* QLoRA's stage 3 shards the 4-bit matrices alone: each layer's span (its matrices at 64-byte edges) in 4
         * pieces of 64-byte multiples, the rank's piece of every layer kept and two spans gathered at a time, where
         * DDP keeps each matrix (the arena's 64-byte edges); the dense tensors and the adapters' state as DDP's */
        snug_param_table t;
        memset(&t, 0, sizeof t);
        CHECK(snug_param_table_build(&t, &c, NULL) == 0);
        size_t whole = 0, shard = 0, most = 0;
        double q4 = 0;
        for (int l = 0; l < c.n_layer; l++) {
            size_t span = 0;
            for (int i = 0; i < t.n; i++)
                if (t.e[i].layer == l && t.e[i].ndim == 2) {
                    size_t b = snug_q4_bytes(SNUG_Q4_NF4, t.e[i].numel, 64, 1);
                    span += (b + 63) / 64 * 64;
                    q4 += (double)b;
                }
            size_t piece = (span + 4 * 64 - 1) / (4 * 64) * 64;
            whole += span, shard += piece, most = piece > most ? piece : most;
        }
        snug_param_table_free(&t);
        CHECKF(m[3].bytes[SNUG_MEM_PARAMS] == m[0].bytes[SNUG_MEM_PARAMS] - whole + shard + 2 * 4 * most,
               "QLoRA stage 3 parameters %zu, DDP's %zu: the 4-bit %zu bytes, a shard %zu, a span %zu",
               m[3].bytes[SNUG_MEM_PARAMS], m[0].bytes[SNUG_MEM_PARAMS], whole, shard, 4 * most);
        CHECK(m[3].bytes[SNUG_MEM_OPTIM] == m[0].bytes[SNUG_MEM_OPTIM] &&
              m[3].bytes[SNUG_MEM_GRADS] == m[0].bytes[SNUG_MEM_GRADS] &&
              m[3].bytes[SNUG_MEM_ADAPTER] == m[0].bytes[SNUG_MEM_ADAPTER]);
        /* the 4-bit matrices gathered twice per micro-batch, and the adapters' all-reduce */
        CHECK(fabs(m[3].comm_bytes - (2.0 * 0.75 * q4 + 2.0 * 0.75 * (double)p.ntrain * 4)) < 1.0);
        /* the adapters' step inside backward: stage 3 still built (their state is whole, stepped as under DDP) */
        s.lv.optimizer_in_backward = 1;
        CHECKF(snug_plan_ranks(&s, 4, snug_gpu_find("rtx4090"), m, &choice, &e) == 0, "%s", e.msg);
        CHECK(!m[0].unbuilt && m[2].unbuilt && !m[3].unbuilt);
        s.lv.optimizer_in_backward = 0;
    }
    snug_plan_spec s = spec_of(&c, 1, 2048); /* full fine-tuning: every stage planned, DDP sums every parameter */
    snug_plan p = plan_of(&s);
    CHECK(p.ntrain == p.nparams);
    snug_rank_mode m[4];
    int choice;
    snug_error e = {0};
    CHECKF(snug_plan_ranks(&s, 4, NULL, m, &choice, &e) == 0, "%s", e.msg);
    for (int z = 0; z < 4; z++)
        CHECK(!m[z].unbuilt && m[z].total > 0);
    CHECK(fabs(m[0].comm_bytes - 2.0 * 0.75 * (double)p.nparams * 4) < 1.0);
    snug_rank_mode z3 = m[3];
    s.lv.optimizer_in_backward = 1; /* every stage steps each rank's shard inside backward */
    CHECKF(snug_plan_ranks(&s, 4, NULL, m, &choice, &e) == 0, "%s", e.msg);
    CHECK(!m[0].unbuilt && !m[1].unbuilt && !m[2].unbuilt && !m[3].unbuilt);
    /* stage 3: no shard of the summed gradients kept, only one layer's buffer (the globals' share it, untied); the
     * same parameters, optimizer state and traffic (the gathers and one reduce-scatter) as without, exposed */
    CHECK(m[3].bytes[SNUG_MEM_GRADS] < z3.bytes[SNUG_MEM_GRADS] && m[3].bytes[SNUG_MEM_PARAMS] == z3.bytes[SNUG_MEM_PARAMS] &&
          m[3].bytes[SNUG_MEM_OPTIM] == z3.bytes[SNUG_MEM_OPTIM] && m[3].bytes[SNUG_MEM_GRADS] < m[2].bytes[SNUG_MEM_GRADS]);
    CHECK(fabs(m[3].comm_bytes - z3.comm_bytes) < 1.0);
    CHECK(m[1].bytes[SNUG_MEM_OPTIM] < m[0].bytes[SNUG_MEM_OPTIM] / 3 &&
          m[1].bytes[SNUG_MEM_GRADS] == m[0].bytes[SNUG_MEM_GRADS] && m[2].bytes[SNUG_MEM_GRADS] == m[0].bytes[SNUG_MEM_GRADS]);
    /* each layer's gradients all-reduced, its shard's parameters all-gathered */
    CHECK(fabs(m[1].comm_bytes - (2.0 * 0.75 * (double)p.nparams * 4 + 0.75 * (double)p.nparams * 4)) < 1.0);
}

/* Tensor parallelism: the rank's share of a config, the slices of each tensor (put back, the whole tensor again),
 * one rank's plan (its blocks' matrices 1/N, the global tensors whole), and the all-reduces a step makes. */
static void test_tensor_parallel(void) {
    snug_model_config c = load_fixture("llama-3.1-8b"), l;
    char why[256];
    snug_error e = {0};
    CHECK(snug_tp_config(&c, 8, &l, why, sizeof why) == &l && l.n_head == 4 && l.n_kv_head == 1 &&
          l.intermediate_size == 1792 && l.hidden_size == c.hidden_size && l.head_dim == c.head_dim);
    CHECK(!snug_tp_config(&c, 16, &l, why, sizeof why) && strstr(why, "num_key_value_heads (8)"));
    CHECK(!snug_tp_config(&c, 3, &l, why, sizeof why) && strstr(why, "num_attention_heads (32)"));
    snug_model_config g2;
    CHECK(snug_preset(&g2, "gpt2-124m", 0, &e) == 0);
    CHECK(snug_tp_config(&g2, 4, &l, why, sizeof why) == &l && l.n_head == 3 && l.intermediate_size == 768);
    CHECK(!snug_tp_config(&g2, 8, &l, why, sizeof why) && strstr(why, "num_attention_heads (12)"));
    /* GPT-2's fused c_attn over 2: each of q, k, v's rows split apart, in the table's (transposed) layout */
    snug_model_config gl;
    snug_param_table g2t, g2l;
    CHECK(snug_tp_config(&g2, 2, &gl, why, sizeof why) == &gl);
    CHECK(snug_param_table_build(&g2t, &g2, &e) == 0 && snug_param_table_build(&g2l, &gl, &e) == 0);
    const snug_param_entry *ca = &g2t.e[4], *cl = &g2l.e[4]; /* h.0.attn.c_attn.weight: file [768, 2304] */
    CHECK(strstr(ca->name, "c_attn.weight") && ca->segs == 3 && cl->shape[1] == 3 * 384 &&
          snug_tp_slice_kind(ca, cl) == 1);
    float *cw = malloc(ca->numel * sizeof *cw), *cp = malloc(cl->numel * sizeof *cp);
    for (size_t j = 0; cw && j < ca->numel; j++)
        cw[j] = (float)j;
    snug_tp_slice(ca, cl, 1, cw, cp, 0); /* rank 1: q rows 384.., k rows 768 + 384.., v rows 1536 + 384.. */
    CHECK(cp[0] == 384.0f * 768 && cp[384 * 768] == (768.0f + 384) * 768 && cp[768 * 768] == (1536.0f + 384) * 768);
    free(cw), free(cp);
    snug_param_table_free(&g2t);
    snug_param_table_free(&g2l);

    /* a small model: every tensor of the 2 ranks' tables put back into the whole model's gives it again */
    snug_model_config s;
    CHECK(snug_preset(&s, "tiny-llama", 64, &e) == 0);
    s.qkv_bias = s.o_bias = s.mlp_bias = 1;
    snug_model_config half;
    snug_param_table gt, lt;
    CHECK(snug_tp_config(&s, 2, &half, why, sizeof why) == &half);
    CHECK(snug_param_table_build(&gt, &s, &e) == 0 && snug_param_table_build(&lt, &half, &e) == 0);
    CHECK(gt.n == lt.n);
    int kinds[3] = {0, 0, 0}, same = 1;
    for (int i = 0; i < gt.n && gt.n == lt.n; i++) {
        const snug_param_entry *G = &gt.e[i], *L = &lt.e[i];
        int k = snug_tp_slice_kind(G, L);
        kinds[k]++;
        CHECK(!strcmp(G->name, L->name) && (k ? L->numel * 2 == G->numel : L->numel == G->numel));
        float *whole = malloc(G->numel * sizeof *whole), *back = calloc(G->numel, sizeof *back);
        float *part = malloc(L->numel * sizeof *part);
        for (size_t j = 0; j < G->numel; j++)
            whole[j] = (float)j;
        for (int r = 0; r < 2; r++) {
            snug_tp_slice(G, L, r, whole, part, 0);
            if (k == 1) /* rows: rank r's block of rows */
                same &= part[0] == (float)((size_t)r * L->numel);
            if (k == 2) /* columns: rank r's run of the first row, then of the second */
                same &= part[0] == (float)((size_t)r * L->shape[1]) && part[L->shape[1]] == (float)G->shape[1] +
                        (float)((size_t)r * L->shape[1]);
            snug_tp_slice(G, L, r, back, part, 1);
        }
        same &= !memcmp(whole, back, G->numel * sizeof *whole);
        free(whole);
        free(back);
        free(part);
    }
    CHECK(same);
    /* per layer: q/k/v, gate/up and their biases by rows (10), o/down by columns (2), norms and o/down biases whole */
    CHECKF(kinds[1] == 10 * s.n_layer && kinds[2] == 2 * s.n_layer, "rows %d, columns %d", kinds[1], kinds[2]);
    snug_param_table_free(&gt);
    snug_param_table_free(&lt);

    /* one rank's plan of Llama-3.1-8B over 8 on a GPU: the layers' matrices / 8, the embedding and head whole (the
     * blocked loss is CPU-only); on the CPU the vocabulary's rows / 8 too */
    snug_plan_spec sp = spec_of(&c, 1, 2048), st = sp;
    st.tp = 8;
    st.tp_rank = 5;
    st.device_cuda = 1;
    snug_plan whole = plan_of(&sp), rank = plan_of(&st);
    long long per_layer = 4096LL * (4096 + 2 * 1024 + 4096 + 3 * 14336), embed = 2LL * 128256 * 4096;
    CHECKF(whole.nparams == embed + 4096 + 32 * (per_layer + 2 * 4096), "%lld", whole.nparams);
    CHECKF(rank.nparams == embed + 4096 + 32 * (per_layer / 8 + 2 * 4096), "%lld", rank.nparams);
    CHECK(rank.bytes[SNUG_MEM_PARAMS] < whole.bytes[SNUG_MEM_PARAMS] / 3);
    CHECK(rank.bytes[SNUG_MEM_ACTS] < whole.bytes[SNUG_MEM_ACTS]);
    CHECK(!snug_tp_vocab_split(&c, 8, 1) && snug_tp_vocab_split(&c, 8, 0) && !snug_tp_vocab_split(&c, 7, 0));
    snug_plan_spec sc = st;
    sc.device_cuda = 0;
    snug_plan cpu = plan_of(&sc);
    CHECKF(cpu.nparams == embed / 8 + 4096 + 32 * (per_layer / 8 + 2 * 4096), "%lld", cpu.nparams);
    CHECK(cpu.vocab_block == 128256 / 8); /* the rank's rows of the head, one block */
    /* 4 all-reduces per block and micro-batch, 2 more per block full checkpointing recomputes, 1 with a tiled MLP;
     * with the vocabulary split 2 more per micro-batch and the gather of each token's 3 statistics */
    int n = 0;
    double bytes = snug_tp_comm_bytes(&st, &n);
    CHECK(n == 128 && fabs(bytes - 128 * 2048.0 * 4096 * 4 * 2 * 7 / 8) < 1);
    bytes = snug_tp_comm_bytes(&sc, &n);
    CHECK(n == 130 && fabs(bytes - 130 * 2048.0 * 4096 * 4 * 2 * 7 / 8 - 7 * 3 * 2048.0 * 8) < 1);
    st.lv.ckpt = SNUG_CKPT_FULL;
    st.GA = 2;
    snug_tp_comm_bytes(&st, &n);
    CHECK(n == 2 * 192);
    st.lv.mlp_shards = -1;
    snug_tp_comm_bytes(&st, &n);
    CHECK(n == 2 * 160);
    CHECK(snug_tp_comm_bytes(&sp, &n) == 0 && n == 0);
}

/* Pipeline parallelism: the layers split into consecutive stages, each stage's table the whole model's tensors of its
 * layers (same names, shapes), the embedding on the first, the final norm and head on the last, a tied head's
 * embedding on both; the stages' plans sum to the whole model's parameters (plus a tied head's second copy) */
static void test_pipeline_parallel(void) {
    int l0, n, next = 0;
    const snug_pp_split even = {0}, s165 = {(const int[]){1, 6, 5}, 3}, s164 = {(const int[]){1, 6, 4}, 3},
                        s16 = {(const int[]){1, 6}, 2}, s066 = {(const int[]){0, 6, 6}, 3};
    for (int q = 0; q < 5; q++) { /* 12 layers over 5: 2, 3, 3, 2, 2 */
        CHECK(snug_pp_layers(12, 5, even, q, &l0, &n) == 0 && l0 == next && n == (q == 1 || q == 2 ? 3 : 2));
        next = l0 + n;
    }
    CHECK(next == 12 && snug_pp_layers(3, 4, even, 0, &l0, &n) == -1 && snug_pp_layers(4, 4, even, 4, &l0, &n) == -1);
    /* as listed: [1, 6, 5] of 12 */
    CHECK(snug_pp_layers(12, 3, s165, 1, &l0, &n) == 0 && l0 == 1 && n == 6);
    CHECK(snug_pp_layers(12, 3, s165, 2, &l0, &n) == 0 && l0 == 7 && n == 5);
    CHECK(snug_pp_layers(12, 3, s164, 0, &l0, &n) == -1 && snug_pp_layers(12, 3, s16, 0, &l0, &n) == -1);
    CHECK(snug_pp_layers(12, 3, s066, 1, &l0, &n) == -1 && snug_pp_layers(12, 2, s165, 0, &l0, &n) == -1);
    /* which stage holds a layer, or a global tensor (the embeddings on the first, the rest on the last) */
    CHECK(snug_pp_stage_of(12, 3, s165, 0, 0) == 0 && snug_pp_stage_of(12, 3, s165, 6, 0) == 1 &&
          snug_pp_stage_of(12, 3, s165, 7, 1) == 2 && snug_pp_stage_of(12, 3, even, -1, 1) == 0 &&
          snug_pp_stage_of(12, 3, even, -1, 0) == 2 && snug_pp_stage_of(12, 5, even, 4, 0) == 1);
    snug_error e = {0};
    for (int tied = 0; tied < 2; tied++) {
        snug_model_config c;
        CHECK(snug_preset(&c, tied ? "gpt2-124m" : "llama-30m", 0, &e) == 0);
        c.tie_embeddings = tied;
        snug_param_table whole;
        CHECK(snug_param_table_build(&whole, &c, &e) == 0);
        snug_plan_spec sp = spec_of(&c, 1, 64);
        long long sum = 0, wte = whole.e[0].numel;
        int P = 3, found = 0;
        for (int q = 0; q < P; q++) {
            snug_plan_spec st = sp;
            st.pp = P;
            st.pp_stage = q;
            snug_model m = {0};
            CHECK(snug_plan_model_init(&m, &st, &e) == 0);
            snug_pp_layers(c.n_layer, P, (snug_pp_split){0}, q, &l0, &n);
            CHECK(m.cfg.n_layer == n && m.pp_l0 == l0 && m.pp_L == c.n_layer && m.pp_slots == P - q);
            for (int i = 0; i < m.table.n; i++) { /* each tensor is the whole model's of that name */
                const snug_param_entry *L = &m.table.e[i];
                int j = 0;
                while (j < whole.n && strcmp(whole.e[j].name, L->name))
                    j++;
                CHECKF(j < whole.n && whole.e[j].numel == L->numel &&
                           (L->layer < 0 ? whole.e[j].layer < 0 : whole.e[j].layer == L->layer + l0),
                       "stage %d: %s", q, L->name);
                found += L->layer >= 0;
            }
            int has_embed = m.table.n && !strcmp(m.table.e[0].name, whole.e[0].name);
            CHECKF(has_embed == (q == 0 || (tied && q == P - 1)), "stage %d: embedding %d", q, has_embed);
            sum += (long long)m.table.total;
            snug_plan pl = plan_of(&st);
            CHECK(pl.nparams == (long long)m.table.total && pl.bytes[SNUG_MEM_ACTS] > 0);
            snug_param_table_free(&m.table);
        }
        CHECK(found == whole.n - (tied ? 4 : 3)); /* every layer tensor on exactly one stage */
        CHECKF(sum == (long long)whole.total + (tied ? wte : 0), "%lld vs %zu", sum, whole.total);
        snug_param_table_free(&whole);
    }
}

int main(void) {
    test_fixtures();
    test_tensor_parallel();
    test_pipeline_parallel();
    test_levers();
    test_fit_space();
    test_derived_levers();
    test_autofit();
    test_gpus();
    test_ranks_adapters();
    test_args();
    test_svg_and_json();
    return check_finish("test_plan");
}
