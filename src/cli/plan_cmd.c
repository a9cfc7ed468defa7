/* plan_cmd.c: `snug plan` (see plan_cmd.h).
 *
 * Everything printed is computed first into one `report`, then written as text or JSON, so the two cannot disagree.
 * The memory numbers come from snug_plan_run (the layout code the trainer allocates with); the runtime overhead, the
 * GPU table, the step-time costs and the prices are estimates from gpus.c and autofit.c, and say so. */
#include "cli/plan_cmd.h"

#include "cli/options.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "model/peft_io.h"
#include "plan/autofit.h"
#include "plan/plan_json.h"
#include "plan/ranks.h"
#include "plan/svg.h"
#include "train/setup.h"

/* ---- flags ---- */

void snug_plan_usage(FILE *f) {
    fprintf(f, "\nflags of snug plan (besides the configuration keys below; --memory_budget SIZE fits that much memory\n"
               "instead of a GPU, and with auto_fit: true re-plans the run to fit it):\n");
    snug_plan_flags_help(f);
}

int snug_plan_args_take(snug_plan_args *a, int *argc, char **argv, snug_error *e) {
    SNUG_TRY(snug_plan_flags_take(a, argc, argv, e));
    a->g = NULL;
    if (a->gpu[0] && !(a->g = snug_gpu_find(a->gpu))) {
        char names[256];
        snug_gpu_list(names, sizeof names);
        return snug_fail(e, SNUG_EINPUT, "command line: unknown GPU '%.60s'; snug plan knows %s (or give "
                         "--memory_budget 40GB for any other size)", a->gpu, names);
    }
    if (a->g && a->backend == SNUG_BACKEND_CPU)
        return snug_fail(e, SNUG_EINPUT, "command line: --gpu plans for the cuda backend; drop --backend cpu, or "
                         "give --memory_budget for a CPU run");
    return 0;
}

/* ---- the report ---- */

#define MAXLEV 32
#define MAX_GPUS 256 /* the most GPUs the plan looks at when none of --gpus fits */

typedef struct gpu_row {
    const snug_gpu *g;
    double need;                 /* as configured, cuda overhead included */
    const snug_fit_point *best;  /* the cheapest setting that fits; NULL: none */
    int nalone;                  /* single levers that fit on their own */
    const snug_lever_effect *alone[MAXLEV];
    double tps, hours, price, usd; /* for `best`, when it exists */
} gpu_row;

/* A lever the search does not try, re-planned on its own */
typedef struct listed_row {
    char name[96];
    double saves, total, cost_pct;
    const char *why;
} listed_row;

typedef struct report {
    const snug_run_config *o;
    const snug_plan_args *a;
    snug_setup *p;
    snug_device_kind kind;
    snug_overhead ov;               /* of the configured plan on kind */
    double need;                    /* the configured plan's total on kind */
    snug_fit_space space;           /* lever settings on kind */
    snug_fit_space cuda;            /* the same on the cuda backend (the GPU table); == space when kind is cuda */
    int own_cuda;
    int data_loaded;                /* the datasets were read: data_tokens counts them */
    size_t data_tokens;
    size_t data_host_bytes;         /* measured when loaded, else estimated from the files' sizes */
    char data_error[512];           /* why they were not read ("" when loaded, or none is configured) */
    snug_lever_effect lev[MAXLEV];  /* on kind */
    int nlev;
    snug_lever_effect clev[MAXLEV]; /* on cuda */
    listed_row listed[8];           /* levers beside the search's, never chosen by auto_fit (text and JSON) */
    int nlisted;
    int nclev;
    gpu_row rows[16];
    int nrows;
    const char *target_name;        /* --gpu label, "memory_budget", or NULL */
    double target_bytes;
    const snug_fit_point *target_best;
    double run_tokens;
    char tokens_source[640];
    int cheapest;                   /* row index, -1 for none */
    char model_name[1100];
    /* the training methods side by side with the configured levers, on the cuda backend: full fine-tuning, LoRA
     * (the configured adapters, or r=16 on every linear module) */
    int nmethods;
    char method_name[3][320];
    double method_need[3];
    /* --gpus N: each rank's plan under DDP and each ZeRO stage (plan/ranks.h) */
    snug_rank_mode modes[4];
    int mode_choice;                /* the stage that fits at the least predicted step time; -1 none */
    int fewest_gpus;                /* none fits: the fewest GPUs over which one does (0: none up to MAX_GPUS) */
    snug_rank_mode fewest;          /* the mode chosen there */
    /* pipeline_parallel_size: each stage's parameters and planned bytes; the plan printed is the heaviest's */
    long long *pp_params;
    double *pp_total;
} report;

/* When each category is in use, and where the step's peak falls. */
static const char *const when_text[] = {
    "parameters, gradients, optimizer state: the whole run; the gradients are complete at the end of the last "
    "micro-batch's backward, the optimizer state is read and written only in the optimizer step",
    "saved activations: fill up through forward and are full at its end (the loss); backward reads them back, "
    "last layer first",
    "workspace: the logits chunk at the loss, the activation gradients through backward",
    "data: the current micro-batch's ids, labels and positions, and the RoPE tables",
    "the peak: snug allocates every arena once, before the first step, with exactly the planned size, and keeps it "
    "to the end, so the total above is the footprint of the whole run (no fragmentation, no spikes). A framework "
    "that allocates tensor by tensor peaks early in backward, when the saved activations are still held and the "
    "gradients and activation gradients appear; static arenas hold that peak for the whole step",
};
#define NWHEN ((int)(sizeof when_text / sizeof when_text[0]))

/* Prints text wrapped at width columns, the first line after `lead`, the others indented by indent spaces. */
static void wrap(FILE *f, const char *lead, int indent, const char *text, int width) {
    int col = fprintf(f, "%s", lead);
    while (*text) {
        size_t w = strcspn(text, " ");
        if (col + 1 + (int)w > width && col > indent) {
            col = fprintf(f, "\n%*s", indent, "") - 1;
        } else if (col > (int)strlen(lead)) {
            fputc(' ', f);
            col++;
        }
        col += fprintf(f, "%.*s", (int)w, text);
        text += w;
        while (*text == ' ')
            text++;
    }
    fputc('\n', f);
}

/* The quantized base's code as the report names it (snug_q4_type_name's, upper case) */
static const char *q4_code(const snug_levers *lv) {
    return lv->lora.q4_type == SNUG_Q4_INT8 ? "INT8" : lv->lora.q4_type ? "FP4" : "NF4";
}

static void category_what(const report *r, int c, char *buf, size_t n) {
    const snug_plan_spec *s = &r->p->spec;
    int offq = s->lv.offload_params && s->lv.lora.kind;
    if (s->lv.lora.kind && (c == SNUG_MEM_MASTER || c == SNUG_MEM_GRADS)) {
        snprintf(buf, n, "%s", c == SNUG_MEM_MASTER ? "none: the frozen base takes no update"
                                                    : "fp32 gradients of the adapters only");
        return;
    }
    switch (c) {
    case SNUG_MEM_PARAMS:
        if (s->lv.lora.kind == SNUG_ADAPTER_QLORA && offq)
            snprintf(buf, n, "%s embeddings, norms, head; two layers' %s matrices (copied in)",
                     snug_precision_name(s->lv.dt), q4_code(&s->lv));
        else if (s->lv.lora.kind == SNUG_ADAPTER_QLORA)
            snprintf(buf, n, "%s block matrices, %s embeddings, norms, head", q4_code(&s->lv),
                     snug_precision_name(s->lv.dt));
        else
            snprintf(buf, n, "%s weights", snug_precision_name(s->lv.dt));
        break;
    case SNUG_MEM_MASTER:
        snprintf(buf, n, "%s", s->lv.dt == SNUG_DT_F32 ? "none: fp32 weights are their own master copy"
                               : s->lv.master_weights ? "fp32 copy that takes the update"
                                                      : "none: the update is rounded to bf16 stochastically");
        break;
    case SNUG_MEM_GRADS:
        if (s->lv.dt == SNUG_DT_F32 || s->lv.grads_fp32)
            snprintf(buf, n, "fp32 gradients%s", s->lv.dt != SNUG_DT_F32 ? " (accumulated over micro-batches)" : "");
        else
            snprintf(buf, n, "%s layer gradients, fp32 embeddings/head", snug_precision_name(s->lv.dt));
        break;
    case SNUG_MEM_OPTIM:
        snprintf(buf, n, "%s state%s", snug_optim_name(s->optim, s->optim_paged),
                 s->optim_paged ? ", in host memory" : "");
        break;
    case SNUG_MEM_ACTS:
        snprintf(buf, n, "%s", s->lv.ckpt == SNUG_CKPT_FULL && s->lv.ckpt_offload ? "one layer's, recomputed"
                               : s->lv.ckpt == SNUG_CKPT_FULL      ? "layer inputs + one layer's, recomputed"
                               : s->lv.ckpt == SNUG_CKPT_SELECTIVE ? "without norm outputs and MLP activation"
                                                                   : "everything backward needs");
        break;
    case SNUG_MEM_WORKSPACE:
        if (r->p->plan.vocab_block) /* the loss over blocks of the head's rows (or a tensor-parallel rank's rows) */
            snprintf(buf, n, "logits of %d tokens x %d rows of the head, activation gradients",
                     r->p->plan.xent_chunk, r->p->plan.vocab_block);
        else
            snprintf(buf, n, "logits of %d tokens x %d vocab, activation gradients", r->p->plan.xent_chunk,
                     r->p->cfg.vocab_size);
        break;
    case SNUG_MEM_OFFLOAD:
        if (!s->lv.ckpt_offload && !s->lv.offload_embedding && !offq)
            snprintf(buf, n, "none");
        else
            snprintf(buf, n, "%s%s%s%s%s in host memory",
                     s->lv.ckpt_offload ? "layer inputs (gradient_checkpointing: offload)" : "",
                     s->lv.ckpt_offload && (s->lv.offload_embedding || offq) ? " and " : "",
                     s->lv.offload_embedding ? "the frozen embedding (offload_embedding)" : "",
                     s->lv.offload_embedding && offq ? " and " : "",
                     !offq ? "" : s->lv.lora.kind == SNUG_ADAPTER_QLORA ? "the 4-bit base (offload_params)"
                                                                        : "the frozen base (offload_params)");
        break;
    case SNUG_MEM_SNAPSHOT:
        snprintf(buf, n, "%s", s->ckpt_snapshot ? "parameters, master and optimizer state copied for a checkpoint"
                                                : "none: checkpoints are written in place (or not at all)");
        break;
    case SNUG_MEM_ADAPTER:
        if (s->lv.lora.kind && s->lv.lora.save_modules)
            snprintf(buf, n, "%s r=%d %s, and %s in full, in fp32 (the rest of the base is frozen)",
                     s->lv.lora.dora ? "DoRA" : "LoRA", s->lv.lora.r, s->lv.lora.dora ? "A, B, magnitudes" : "A and B",
                     s->lv.lora.save_modules == (SNUG_SAVE_EMBED | SNUG_SAVE_HEAD) ? "embed_tokens, lm_head"
                                   : s->lv.lora.save_modules & SNUG_SAVE_EMBED ? "embed_tokens" : "lm_head");
        else if (s->lv.lora.kind)
            snprintf(buf, n, "%s r=%d %s in fp32 (the base is frozen)", s->lv.lora.dora ? "DoRA" : "LoRA",
                     s->lv.lora.r, s->lv.lora.dora ? "A, B and magnitudes" : "A and B");
        else
            snprintf(buf, n, "none: full fine-tuning");
        break;
    default: snprintf(buf, n, "ids, labels, positions, RoPE tables"); break;
    }
}

static void fmtb(char *s, size_t n, double b) { snug_format_bytes(s, n, b); }

static void fmt_hours(char *s, size_t n, double h) {
    if (h < 1.0 / 3600)
        snprintf(s, n, "< 1 s");
    else if (h < 1.0 / 60)
        snprintf(s, n, "%.0f s", h * 3600);
    else if (h < 1)
        snprintf(s, n, "%.0f min", h * 60);
    else if (h < 48)
        snprintf(s, n, "%.0fh %02.0fm", floor(h), floor(fmod(h, 1.0) * 60));
    else
        snprintf(s, n, "%.1f days", h / 24);
}

static double cap_of(const snug_fit_space *s, const snug_fit_point *pt) { return snug_fit_point_need(s, pt); }

/* Tokens per step of a setting and of the configured run. */
static double step_tokens(const snug_run_config *o) {
    return (double)o->micro_batch_size * o->sequence_len * o->gradient_accumulation_steps;
}

/* One row of the lever table for a setting the search does not try: sp re-planned, kept when it saves device memory
 * against the configured plan. */
static void listed_lever(report *r, const snug_plan_spec *sp, const char *name, double cost_pct, const char *why) {
    const snug_fit_point *p0 = &r->space.pt[0];
    snug_plan pl;
    snug_error e = {0};
    if (r->nlisted >= (int)(sizeof r->listed / sizeof r->listed[0]) || snug_plan_run(&pl, sp, &e) != 0 ||
        pl.total >= p0->plan.total)
        return;
    listed_row *w = &r->listed[r->nlisted++];
    snprintf(w->name, sizeof w->name, "%s", name);
    w->saves = (double)(p0->plan.total - pl.total);
    w->total = cap_of(&r->space, p0) - w->saves;
    w->cost_pct = cost_pct;
    w->why = why;
}

/* levers listed beside the search's, never chosen by auto_fit: the optimizer step inside backward (no clipping,
 * no accumulation), precision (tested to track fp32's loss, but not the same numbers), and offloading, which
 * saves device memory only where host memory is not the device's */
static void listed_levers(report *r) {
    const snug_fit_point *p0 = &r->space.pt[0];
    const snug_levers *lv0 = &p0->spec.lv;
    if (!p0->spec.with_grads)
        return;
    snug_plan_spec sp = p0->spec;
    if (!lv0->optimizer_in_backward) {
        sp.lv.optimizer_in_backward = 1;
        sp.GA = 1;
        listed_lever(r, &sp, "optimizer_in_backward (max_grad_norm: 0, GA 1)", 0.0,
                     "no clipping; never chosen by auto_fit");
    }
    const char *rounding = "16-bit rounding; never chosen by auto_fit";
    if (lv0->dt == SNUG_DT_F32) {
        sp = p0->spec;
        sp.lv.dt = SNUG_DT_BF16;
        sp.lv.master_weights = 1;
        listed_lever(r, &sp, "bf16: true", 0.0, rounding);
        sp.lv.master_weights = 0;
        listed_lever(r, &sp, "bf16: true, master_weights: false", 0.0, rounding);
    } else if (lv0->dt == SNUG_DT_BF16 && lv0->master_weights) {
        sp = p0->spec;
        sp.lv.master_weights = 0;
        listed_lever(r, &sp, "master_weights: false", 0.0, rounding);
    }
    if (r->kind == SNUG_DEVICE_CUDA && !lv0->ckpt_offload) {
        sp = p0->spec;
        sp.lv.ckpt = SNUG_CKPT_FULL;
        sp.lv.ckpt_offload = 1;
        listed_lever(r, &sp, "gradient_checkpointing: offload", 35.0,
                     "full's recompute, plus a copy out and in per layer");
    }
}

/* The configured run as full fine-tuning, LoRA and QLoRA, each planned with the layout code on the cuda backend. */
static void methods(report *r) {
    const snug_plan_spec *s0 = &r->p->spec;
    if (!s0->with_grads)
        return;
    snug_lora_cfg lora = s0->lv.lora;
    if (!lora.kind)
        lora = (snug_lora_cfg){.kind = SNUG_ADAPTER_LORA, .r = 16, .alpha = 16,
                               .targets = snug_lora_all_linear(s0->cfg.arch)};
    char targets[256];
    snug_lora_targets_list(s0->cfg.arch, lora.targets, targets, sizeof targets);
    for (int k = 0; k < 3; k++) {
        snug_plan_spec sp = *s0;
        sp.lv.lora = k ? lora : (snug_lora_cfg){0};
        sp.lv.lora.kind = k == 2 ? SNUG_ADAPTER_QLORA : k ? SNUG_ADAPTER_LORA : SNUG_ADAPTER_NONE;
        if (k == 2) { /* NF4 with double quantization, the rest in bf16 (or the configured fp16) */
            if (lora.kind != SNUG_ADAPTER_QLORA)
                sp.lv.lora.q4_type = SNUG_Q4_NF4, sp.lv.lora.q4_nested = 1, sp.lv.lora.q4_blocksize = 64;
            if (sp.lv.dt == SNUG_DT_F32)
                sp.lv.dt = SNUG_DT_BF16;
        }
        snug_plan pl;
        snug_error e = {0};
        if (snug_plan_run(&pl, &sp, &e))
            continue;
        snug_overhead ov;
        snug_overhead_compute(&ov, SNUG_DEVICE_CUDA, &pl, 0);
        int i = r->nmethods++;
        r->method_need[i] = (double)pl.total + ov.total;
        if (k)
            snprintf(r->method_name[i], sizeof r->method_name[i], "%s r=%d on %s", k == 2 ? "QLoRA (NF4)" : "LoRA",
                     lora.r, lora.targets == snug_lora_all_linear(s0->cfg.arch) ? "every linear module" : targets);
        else
            snprintf(r->method_name[i], sizeof r->method_name[i], "full fine-tuning");
    }
}

static void run_tokens(report *r) {
    const snug_run_config *o = &r->p->c;
    double per_step = step_tokens(o);
    if (o->max_steps > 0) {
        r->run_tokens = per_step * o->max_steps;
        snprintf(r->tokens_source, sizeof r->tokens_source, "max_steps %d x %.0f tokens per step", o->max_steps,
                 per_step);
    } else if (r->data_loaded) {
        /* whole steps of whole micro-batches, as the trainer cuts them */
        double rows = floor((double)(r->data_tokens > 0 ? r->data_tokens - 1 : 0) / o->sequence_len);
        double steps = ceil(rows / o->micro_batch_size / o->gradient_accumulation_steps);
        r->run_tokens = steps * per_step * o->num_epochs;
        snprintf(r->tokens_source, sizeof r->tokens_source, "num_epochs %d x %zu dataset tokens (%.0f steps per epoch)",
                 o->num_epochs, r->data_tokens, steps);
    } else {
        r->run_tokens = per_step * 1000;
        if (o->ndatasets == 0)
            snprintf(r->tokens_source, sizeof r->tokens_source,
                     "assumed 1000 steps x %.0f tokens per step: no dataset is configured and max_steps is -1", per_step);
        else
            snprintf(r->tokens_source, sizeof r->tokens_source,
                     "assumed 1000 steps x %.0f tokens per step: the dataset could not be read (%.400s)", per_step,
                     r->data_error);
    }
}

/* Throughput and price of row w, for its cheapest setting. */
static void price_row(report *r, gpu_row *w) {
    const snug_plan_args *a = r->a;
    double tps = snug_gpu_tokens_per_s(w->g, &r->p->spec, r->p->plan.nparams);
    if (a->tokens_per_s > 0) /* a measurement: on --gpu's GPU, scaled to the others by their peaks */
        tps = a->g ? a->tokens_per_s * tps / snug_gpu_tokens_per_s(a->g, &r->p->spec, r->p->plan.nparams)
                     : a->tokens_per_s;
    w->price = a->price_per_hour > 0 && (!a->g || a->g == w->g) ? a->price_per_hour : w->g->price_per_hour;
    w->tps = w->best ? tps / (1.0 + w->best->cost) : tps;
    if (r->p->spec.tp > 1 && w->tps > 0) { /* tensor parallelism: N GPUs at a time, its all-reduces in line */
        int nar;
        const snug_plan_spec *sp = &r->p->spec;
        double step_tokens = (double)sp->B * sp->T * (sp->GA > 1 ? sp->GA : 1);
        double comm = w->g->link_gbps > 0 ? snug_tp_comm_bytes(sp, &nar) / (w->g->link_gbps * 1e9) : 0.0;
        w->tps = step_tokens / (step_tokens / w->tps + comm);
        w->price *= sp->tp;
    }
    w->hours = w->tps > 0 ? r->run_tokens / w->tps / 3600.0 : 0;
    w->usd = w->hours * w->price;
}

static int build(report *r, snug_error *e) {
    snug_setup *p = r->p;
    snug_overhead_compute(&r->ov, r->kind, &p->plan, r->data_host_bytes);
    r->need = (double)p->plan.total + (r->kind == SNUG_DEVICE_CPU ? (double)p->plan.host_total : 0) + r->ov.total;
    SNUG_TRY(snug_fit_space_build(&r->space, &p->spec, r->kind, r->data_host_bytes, e));
    if (r->kind == SNUG_DEVICE_CUDA) {
        r->cuda = r->space;
    } else {
        SNUG_TRY(snug_fit_space_build(&r->cuda, &p->spec, SNUG_DEVICE_CUDA, 0, e));
        r->own_cuda = 1;
    }
    r->nlev = snug_fit_levers(&r->space, r->lev, MAXLEV);
    r->nclev = snug_fit_levers(&r->cuda, r->clev, MAXLEV);
    listed_levers(r);
    methods(r);
    run_tokens(r);
    r->cheapest = -1;
    for (int i = 0; i < snug_gpu_count() && r->nrows < 16; i++) {
        gpu_row *w = &r->rows[r->nrows++];
        memset(w, 0, sizeof *w);
        w->g = snug_gpu_at(i);
        w->need = cap_of(&r->cuda, &r->cuda.pt[0]);
        w->best = snug_fit_best(&r->cuda, w->g->mem_bytes);
        if (w->need > w->g->mem_bytes)
            for (int k = 0; k < r->nclev; k++)
                if (cap_of(&r->cuda, r->clev[k].p) <= w->g->mem_bytes)
                    w->alone[w->nalone++] = &r->clev[k];
        price_row(r, w);
        if (w->best && (r->cheapest < 0 || w->usd < r->rows[r->cheapest].usd))
            r->cheapest = r->nrows - 1;
    }
    if (r->a->g) {
        r->target_name = r->a->g->label;
        r->target_bytes = r->a->g->mem_bytes;
    } else if (p->c.memory_budget > 0) {
        r->target_name = "memory_budget";
        r->target_bytes = p->c.memory_budget;
    }
    if (r->target_name)
        r->target_best = snug_fit_best(&r->space, r->target_bytes);
    snprintf(r->model_name, sizeof r->model_name, "%s", p->c.base_model[0] ? p->c.base_model : p->c.model_preset);
    return 0;
}

static void report_free(report *r) {
    free(r->pp_params);
    free(r->pp_total);
    if (r->own_cuda)
        snug_fit_space_free(&r->cuda);
    snug_fit_space_free(&r->space);
}

/* ---- text ---- */

/* The model's parameters (under tensor or pipeline parallelism the plan's are one rank's share) */
static double whole_params(const snug_setup *p) {
    snug_param_table t;
    if ((p->spec.tp <= 1 && p->spec.pp <= 1) || snug_param_table_build(&t, &p->cfg, NULL))
        return (double)p->plan.nparams;
    double n = (double)t.total;
    snug_param_table_free(&t);
    return n;
}

/* A parameter count: 3.67M, 8.03B */
static void count_text(char *buf, size_t n, double v) {
    snprintf(buf, n, v >= 1e9 ? "%.2fB" : "%.2fM", v >= 1e9 ? v / 1e9 : v / 1e6);
}

static void print_text(const report *r, FILE *f) {
    const snug_setup *p = r->p;
    const snug_run_config *o = &p->c;
    const snug_model_config *c = &p->cfg;
    const snug_plan *pl = &p->plan;
    char a[32], b[32], d[32], lv[256];
    double P = pl->nparams > 0 ? (double)pl->nparams : 1, whole = whole_params(p);
    fprintf(f, "snug plan: %s (%s, %.2fB parameters: %d layers, width %d, %d heads / %d kv heads, vocab %d)\n",
            r->model_name, c->model_type, whole / 1e9, c->n_layer, c->hidden_size, c->n_head, c->n_kv_head,
            c->vocab_size);
    fprintf(f, "  batch        %d x %d tokens per micro-batch, %d accumulation = %.0f tokens per step\n",
            o->micro_batch_size, o->sequence_len, o->gradient_accumulation_steps, step_tokens(o));
    snug_levers_describe(&p->spec.lv, p->spec.B, p->spec.T, lv, sizeof lv);
    const snug_levers *pl_lv = &p->spec.lv;
    if (pl_lv->lora.kind) {
        char t[256];
        snug_lora_targets_list(c->arch, pl_lv->lora.targets, t, sizeof t);
        if (snug_lora_layers_named(&pl_lv->lora)) { /* lora_layers_to_transform */
            size_t n = strlen(t);
            n += (size_t)snprintf(t + n, sizeof t - n, " of layers ");
            if (n < sizeof t)
                snug_lora_layers_list(&pl_lv->lora, t + n, sizeof t - n);
        }
        int q = pl_lv->lora.kind == SNUG_ADAPTER_QLORA, q8 = q && pl_lv->lora.q4_type == SNUG_Q4_INT8;
        char base[64];
        snprintf(base, sizeof base, q ? "%s base (%s embeddings, norms, head)" : "%s base",
                 q ? q4_code(pl_lv) : snug_precision_name(pl_lv->dt), snug_precision_name(pl_lv->dt));
        fprintf(f, "  training     %s r=%d alpha %g on %s: the %s frozen, fp32 adapters, optimizer %s\n",
                pl_lv->lora.dora ? (q && !q8 ? "QDoRA" : "DoRA") : q && !q8 ? "QLoRA" : "LoRA", pl_lv->lora.r,
                (double)pl_lv->lora.alpha, t, base,
                snug_optim_name(p->spec.optim, p->spec.optim_paged));
    } else if (pl_lv->dt == SNUG_DT_F32)
        fprintf(f, "  training     fp32 weights, activations and gradients, optimizer %s\n",
                snug_optim_name(p->spec.optim, p->spec.optim_paged));
    else
        fprintf(f, "  training     %s mixed precision (%s), compute in fp32, optimizer %s\n",
                snug_precision_name(pl_lv->dt), pl_lv->master_weights ? "fp32 master weights" : "no master weights",
                snug_optim_name(p->spec.optim, p->spec.optim_paged));
    if (!pl_lv->lora.kind && pl->ntrain < pl->nparams) { /* unfrozen_parameters */
        char n1[32], n2[32];
        count_text(n1, sizeof n1, (double)pl->ntrain);
        count_text(n2, sizeof n2, (double)pl->nparams);
        fprintf(f, "  unfrozen     %s of the %s parameters train (unfrozen_parameters); the others have no optimizer "
                "state and no update\n", n1, n2);
    }
    fprintf(f, "  levers       %s\n", lv);
    if (p->spec.tp > 1) { /* the plan below is one rank's */
        int nar = 0;
        double bytes = snug_tp_comm_bytes(&p->spec, &nar);
        char n1[32], n2[32];
        fmtb(a, sizeof a, bytes);
        fmtb(b, sizeof b, (double)p->spec.B * p->spec.T * c->hidden_size * sizeof(float));
        count_text(n1, sizeof n1, (double)pl->nparams);
        count_text(n2, sizeof n2, whole);
        fprintf(f, "  tensor par.  %d ranks, each with 1/%d of every block's heads and MLP rows: %s of the %s "
                "parameters\n", p->spec.tp, p->spec.tp, n1, n2);
        fprintf(f, "               the memory below is one rank's; per step %d all-reduces of %s, %s sent per rank\n",
                nar, b, a);
        if (r->a->g && r->a->g->link_gbps > 0)
            fprintf(f, "               %.1f ms of collectives at %.0f GB/s, in line with the compute\n",
                    1e3 * bytes / (r->a->g->link_gbps * 1e9), r->a->g->link_gbps);
    }
    if (p->spec.pp > 1) { /* the plan below is the heaviest stage's */
        int P = p->spec.pp, m = o->gradient_accumulation_steps;
        fmtb(b, sizeof b, (double)p->spec.B * p->spec.T * c->hidden_size * sizeof(float));
        fprintf(f, "  pipeline     %d stages of the layers, 1F1B over %d micro-batch%s per step (%s; %d of every %d "
                "stage-slots idle); the memory below is stage %d's, the heaviest:\n", P, m, m == 1 ? "" : "es",
                p->spec.pp_recompute ? "a stage keeps each micro-batch's input and runs its forward again"
                                     : "stage s keeps the activations of its P - s micro-batches in flight",
                P - 1, m + P - 1, p->spec.pp_stage);
        for (int q = 0; q < P; q++) {
            int l0, n;
            char n1[32];
            snug_pp_layers(c->n_layer, P, p->spec.pp_split, q, &l0, &n);
            count_text(n1, sizeof n1, (double)r->pp_params[q]);
            fmtb(a, sizeof a, r->pp_total[q]);
            char span[32];
            snprintf(span, sizeof span, n == 1 ? "layer %d" : "layers %d-%d", l0, l0 + n - 1);
            fprintf(f, "               stage %d: %s%s: %s parameters, %s\n", q, span,
                    q == 0 && P > 1 ? " and the embedding" : q == P - 1 ? " and the head" : "", n1, a);
        }
        fprintf(f, "               per micro-batch and stage boundary %s forward and its gradient back\n", b);
    }
    if (p->fit_note[0])
        fprintf(f, "  %s\n", p->fit_note);

    fprintf(f, "\nmemory on the %s backend (the layout code on counting arenas: exactly what training allocates)\n",
            snug_device_kind_name(r->kind));
    fprintf(f, "  %-20s %11s  %7s  %s\n", "category", "peak", "B/param", "what");
    for (int k = 0; k < SNUG_MEM_NCAT; k++) {
        char what[192], bpp[16] = "";
        fmtb(a, sizeof a, (double)pl->bytes[k]);
        category_what(r, k, what, sizeof what);
        if (k <= SNUG_MEM_OPTIM)
            snprintf(bpp, sizeof bpp, "%.2f", pl->bytes[k] / P);
        fprintf(f, "  %-20s %11s  %7s  %s\n", snug_category_name((snug_category)k), a, bpp, what);
    }
    fmtb(a, sizeof a, (double)pl->total);
    fprintf(f, "  %-20s %11s\n", pl->host_total ? "arenas on the device" : "arenas", a);
    if (pl->host_total) {
        fmtb(a, sizeof a, (double)pl->host_total);
        fprintf(f, "  %-20s %11s  %s\n", "arenas in host mem.", a,
                r->kind == SNUG_DEVICE_CPU ? "(on the cpu backend the same memory: counted in the total)"
                                           : "(pinned host memory, not on the GPU)");
    }
    fmtb(a, sizeof a, (double)r->ov.total);
    fprintf(f, "  %-20s %11s  %7s  %s\n", "runtime overhead", a, "",
            r->kind == SNUG_DEVICE_CUDA ? "estimates, see docs/MEMORY.md" : "baseline measured on snug's own runs");
    for (int i = 0; i < r->ov.n; i++) {
        fmtb(b, sizeof b, (double)r->ov.item[i].bytes);
        fprintf(f, "    %-26s %11s  %s\n", r->ov.item[i].name, b, r->ov.item[i].note);
    }
    fmtb(a, sizeof a, r->need);
    fprintf(f, "  %-20s %11s\n", "total", a);
    fprintf(f, "\nwhen each category is in use, and where the peak falls:\n");
    for (int i = 0; i < NWHEN; i++)
        wrap(f, "  - ", 4, when_text[i], 118);

    if (r->target_name) {
        fmtb(a, sizeof a, r->target_bytes);
        fmtb(b, sizeof b, r->need);
        if (r->need <= r->target_bytes) {
            fmtb(d, sizeof d, r->target_bytes - r->need);
            fprintf(f, "\n%s (%s): fits: needs %s, %s to spare\n", r->target_name, a, b, d);
        } else {
            fmtb(d, sizeof d, r->need - r->target_bytes);
            fprintf(f, "\n%s (%s): does not fit: needs %s, %s short\n", r->target_name, a, b, d);
            if (r->target_best) {
                char n[32];
                fmtb(n, sizeof n, cap_of(&r->space, r->target_best));
                fprintf(f, "  cheapest setting that fits: %s (needs %s, predicted step time %+.0f%%); auto_fit: true "
                           "with memory_budget chooses it\n", r->target_best->what, n, 100 * r->target_best->cost);
            } else {
                fprintf(f, "  no setting of the levers fits; see the smallest below\n");
            }
        }
    }

    fprintf(f, "\nlevers, each on its own (re-planned with the layout code: savings exact; step times predicted):\n");
    if (!r->nlev)
        fprintf(f, "  none saves memory for this configuration\n");
    else
        fprintf(f, "  %-52s %11s %11s %9s  %s\n", "lever", "saves", "total", "step time", "why it costs");
    for (int i = 0; i < r->nlev; i++) {
        const snug_lever_effect *l = &r->lev[i];
        fmtb(a, sizeof a, l->saves);
        fmtb(b, sizeof b, cap_of(&r->space, l->p));
        fprintf(f, "  %-52s %11s %11s %+8.0f%%  %s\n", l->name, a, b, 100 * l->p->cost, l->cost_note);
    }
    for (int i = 0; i < r->nlisted; i++) {
        const listed_row *w = &r->listed[i];
        fmtb(a, sizeof a, w->saves);
        fmtb(b, sizeof b, w->total);
        fprintf(f, "  %-52s %11s %11s %+8.0f%%  %s\n", w->name, a, b, w->cost_pct, w->why);
    }
    const snug_fit_point *sm = snug_fit_smallest(&r->space);
    if (sm && sm != &r->space.pt[0]) {
        fmtb(a, sizeof a, cap_of(&r->space, sm));
        fprintf(f, "  smallest of all combinations: %s: %s (%+.0f%%)\n", sm->what, a, 100 * sm->cost);
    }

    fprintf(f, "\nfit on common GPUs (cuda backend: arenas + CUDA context, cuBLASLt workspace, scratch and allocator slack):\n");
    fprintf(f, "  %-15s %10s %11s  %s\n", "gpu", "memory", "needs", "verdict");
    for (int i = 0; i < r->nrows; i++) {
        const gpu_row *w = &r->rows[i];
        char lead[96], v[1024];
        fmtb(a, sizeof a, w->g->mem_bytes);
        fmtb(b, sizeof b, w->need);
        snprintf(lead, sizeof lead, "  %-15s %10s %11s  ", w->g->label, a, b);
        size_t len = 0;
        if (w->need <= w->g->mem_bytes) {
            fmtb(d, sizeof d, w->g->mem_bytes - w->need);
            len += (size_t)snprintf(v, sizeof v, "fits, %s to spare", d);
            if (w->best && w->best->cost < -0.005)
                snprintf(v + len, sizeof v - len, "; faster and fits: %s (%+.0f%%)", w->best->what, 100 * w->best->cost);
        } else if (!w->best) {
            const snug_fit_point *cs = snug_fit_smallest(&r->cuda);
            fmtb(d, sizeof d, w->need - w->g->mem_bytes);
            fmtb(a, sizeof a, cap_of(&r->cuda, cs));
            fmtb(b, sizeof b,
                 (double)(cs->plan.bytes[SNUG_MEM_PARAMS] + cs->plan.bytes[SNUG_MEM_MASTER] +
                          cs->plan.bytes[SNUG_MEM_GRADS] + (cs->plan.host[SNUG_MEM_OPTIM] ? 0 : cs->plan.bytes[SNUG_MEM_OPTIM])));
            snprintf(v, sizeof v, "does not fit (%s short) whatever the levers: the smallest setting needs %s, of which "
                     "%s are weights, gradients and optimizer state on the GPU", d, a, b);
        } else {
            fmtb(d, sizeof d, w->need - w->g->mem_bytes);
            fmtb(a, sizeof a, cap_of(&r->cuda, w->best));
            len += (size_t)snprintf(v, sizeof v, "does not fit (%s short); cheapest fix: %s -> %s, %+.0f%% step time", d,
                                    w->best->what, a, 100 * w->best->cost);
            for (int k = 0; k < w->nalone && len < sizeof v; k++)
                len += (size_t)snprintf(v + len, sizeof v - len, "%s %s (%+.0f%%)",
                                        k ? "," : "; single levers that fit on their own:", w->alone[k]->name,
                                        100 * w->alone[k]->p->cost);
        }
        wrap(f, lead, (int)strlen(lead), v, 118);
    }

    if (r->nmethods) {
        fprintf(f, "\ntraining methods with these levers (cuda backend, the same overhead model); adapters train only "
                "their own weights, so the result differs from full fine-tuning:\n");
        fprintf(f, "  %-44s %11s  %s\n", "method", "needs", "fits on");
        for (int k = 0; k < r->nmethods; k++) {
            char fits[512] = "";
            size_t len = 0;
            for (int i = 0; i < r->nrows; i++)
                if (r->method_need[k] <= r->rows[i].g->mem_bytes)
                    len += (size_t)snprintf(fits + len, len < sizeof fits ? sizeof fits - len : 0, "%s%s",
                                            len ? ", " : "", r->rows[i].g->label);
            fmtb(a, sizeof a, r->method_need[k]);
            fprintf(f, "  %-44s %11s  %s\n", r->method_name[k], a, len ? fits : "none of the table");
        }
    }

    char head[1024];
    char group[64] = "";
    if (r->p->spec.tp > 1)
        snprintf(group, sizeof group, ", %d at a time (tensor-parallel)", r->p->spec.tp);
    snprintf(head, sizeof head, "time and cost of the run on each GPU that fits%s (%.4g tokens: %s):", group,
             r->run_tokens, r->tokens_source);
    fputc('\n', f);
    wrap(f, "", 2, head, 118);
    int any = 0;
    for (int i = 0; i < r->nrows; i++) {
        const gpu_row *w = &r->rows[i];
        if (!w->best)
            continue;
        if (!any++)
            fprintf(f, "  %-15s %10s %12s %8s %10s  %s\n", "gpu", "tokens/s", "time", "$/hour", "cost $", "setting");
        fmt_hours(a, sizeof a, w->hours);
        char usd[32];
        snprintf(usd, sizeof usd, w->usd < 0.005 ? "< 0.01" : "%.2f", w->usd);
        fprintf(f, "  %-15s %10.0f %12s %8.2f %10s  %s\n", w->g->label, w->tps, a, w->price, usd, w->best->what);
    }
    if (!any)
        fprintf(f, "  none: no GPU of the table fits this run\n");
    if (r->cheapest >= 0) {
        const gpu_row *w = &r->rows[r->cheapest];
        fmt_hours(a, sizeof a, w->hours);
        fprintf(f, "  cheapest: %s, $%.*f (%s)\n", w->g->label, w->usd < 0.01 ? 4 : 2, w->usd, a);
    }
    const char *prices = r->a->price_per_hour > 0 ? (r->a->g ? "--price_per_hour for --gpu's GPU, the table's for "
                                                                 "the others" : "--price_per_hour on every GPU")
                                                  : "typical on-demand USD per GPU-hour (estimates, see docs/MEMORY.md)";
    if (r->a->tokens_per_s > 0)
        snprintf(head, sizeof head, "tokens/s: the measured %.0f%s, divided by the setting's predicted step time; "
                 "prices: %s", r->a->tokens_per_s,
                 r->a->g ? " on --gpu's GPU, scaled to the others by their TF32 peaks" : " on every GPU", prices);
    else
        snprintf(head, sizeof head, "tokens/s: estimated as the TF32 peak x %.0f%% MFU / %.3g FLOPs per token (6 per "
                 "parameter + attention), divided by the setting's predicted step time; prices: %s",
                 100 * SNUG_ASSUMED_MFU, snug_flops_per_token(&p->spec, pl->nparams), prices);
    wrap(f, "  ", 4, head, 118);
}

/* ---- JSON ---- */

static json_t *point_json(const snug_fit_space *s, const snug_fit_point *pt) {
    if (!pt)
        return json_null();
    return json_pack("{s:s, s:I, s:f, s:i, s:i}", "setting", pt->what, "needs", (json_int_t)cap_of(s, pt),
                     "step_time_cost", pt->cost, "micro_batch_size", pt->spec.B, "gradient_accumulation_steps", pt->GA);
}

static json_t *report_json(const report *r) {
    const snug_setup *p = r->p;
    const snug_run_config *o = &p->c;
    const snug_model_config *c = &p->cfg;
    const snug_plan *pl = &p->plan;
    json_t *j = json_object();
    json_object_set_new(j, "model", json_pack("{s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:i, s:i}", "name", r->model_name,
                                              "model_type", c->model_type, "parameters", (json_int_t)whole_params(p),
                                              "layers", c->n_layer, "hidden_size", c->hidden_size, "heads", c->n_head,
                                              "kv_heads", c->n_kv_head, "intermediate_size", c->intermediate_size,
                                              "vocab_size", c->vocab_size));
    json_object_set_new(j, "batch", json_pack("{s:i, s:i, s:i, s:f}", "micro_batch_size", o->micro_batch_size,
                                              "sequence_len", o->sequence_len, "gradient_accumulation_steps",
                                              o->gradient_accumulation_steps, "tokens_per_step", step_tokens(o)));
    if (p->spec.tp > 1) { /* the memory is one rank's */
        int nar = 0;
        double bytes = snug_tp_comm_bytes(&p->spec, &nar);
        json_object_set_new(j, "tensor_parallel", json_pack("{s:i, s:I, s:i, s:f}", "ranks", p->spec.tp,
                                                            "parameters_per_rank", (json_int_t)pl->nparams,
                                                            "allreduces_per_step", nar, "bytes_sent_per_rank", bytes));
    }
    if (p->spec.pp > 1) { /* the memory is the heaviest stage's */
        json_t *st = json_array();
        for (int q = 0; q < p->spec.pp; q++) {
            int l0, n;
            snug_pp_layers(c->n_layer, p->spec.pp, p->spec.pp_split, q, &l0, &n);
            json_array_append_new(st, json_pack("{s:i, s:i, s:I, s:f}", "first_layer", l0, "layers", n, "parameters",
                                                (json_int_t)r->pp_params[q], "bytes", r->pp_total[q]));
        }
        json_object_set_new(j, "pipeline_parallel", json_pack("{s:i, s:i, s:o}", "stages", p->spec.pp, "planned_stage",
                                                              p->spec.pp_stage, "per_stage", st));
    }
    const snug_levers *lv = &p->spec.lv;
    json_object_set_new(j, "levers", snug_levers_json(&p->spec, pl));
    json_t *meth = json_array();
    for (int k = 0; k < r->nmethods; k++) {
        json_t *fits = json_array();
        for (int i = 0; i < r->nrows; i++)
            if (r->method_need[k] <= r->rows[i].g->mem_bytes)
                json_array_append_new(fits, json_string(r->rows[i].g->id));
        json_array_append_new(meth, json_pack("{s:s, s:f, s:o}", "method", r->method_name[k], "needs",
                                              r->method_need[k], "fits", fits));
    }
    json_object_set_new(j, "methods", meth);
    json_object_set_new(j, "precision", json_string(snug_precision_name(lv->dt)));
    json_object_set_new(j, "master_weights", json_boolean(lv->dt != SNUG_DT_F32 && lv->master_weights));
    if (p->fit_note[0])
        json_object_set_new(j, "auto_fit", json_string(p->fit_note));
    json_object_set_new(j, "backend", json_string(snug_device_kind_name(r->kind)));
    json_t *cats = json_object();
    for (int k = 0; k < SNUG_MEM_NCAT; k++) {
        char what[192];
        category_what(r, k, what, sizeof what);
        json_object_set_new(cats, snug_category_name((snug_category)k),
                            json_pack("{s:I, s:f, s:b, s:s}", "bytes", (json_int_t)pl->bytes[k], "bytes_per_parameter",
                                      pl->nparams ? (double)pl->bytes[k] / (double)pl->nparams : 0.0, "host_memory",
                                      pl->host[k], "what", what));
    }
    json_object_set_new(j, "memory", json_pack("{s:o, s:I, s:I, s:o, s:f}", "categories", cats, "arenas",
                                               (json_int_t)pl->total, "host_arenas", (json_int_t)pl->host_total,
                                               "runtime_overhead", snug_overhead_json(&r->ov), "total", r->need));
    json_t *when = json_array();
    for (int i = 0; i < NWHEN; i++)
        json_array_append_new(when, json_string(when_text[i]));
    json_object_set_new(j, "when_in_use", when);
    if (r->target_name)
        json_object_set_new(j, "target", json_pack("{s:s, s:f, s:b, s:o}", "name", r->target_name, "bytes",
                                                   r->target_bytes, "fits", r->need <= r->target_bytes, "cheapest_fit",
                                                   point_json(&r->space, r->target_best)));
    json_t *levs = json_array();
    for (int i = 0; i < r->nlev; i++)
        json_array_append_new(levs, json_pack("{s:s, s:f, s:f, s:f, s:s}", "lever", r->lev[i].name, "saves",
                                              r->lev[i].saves, "total", cap_of(&r->space, r->lev[i].p),
                                              "step_time_cost", r->lev[i].p->cost, "why", r->lev[i].cost_note));
    json_object_set_new(j, "levers_toggled", levs);
    json_t *listed = json_array();
    for (int i = 0; i < r->nlisted; i++)
        json_array_append_new(listed, json_pack("{s:s, s:f, s:f, s:f, s:s}", "lever", r->listed[i].name, "saves",
                                                r->listed[i].saves, "total", r->listed[i].total, "step_time_cost",
                                                r->listed[i].cost_pct / 100.0, "why", r->listed[i].why));
    json_object_set_new(j, "levers_listed", listed);
    json_t *gpus = json_array();
    for (int i = 0; i < r->nrows; i++) {
        const gpu_row *w = &r->rows[i];
        json_t *alone = json_array();
        for (int k = 0; k < w->nalone; k++)
            json_array_append_new(alone, json_string(w->alone[k]->name));
        json_t *g = json_pack("{s:s, s:s, s:f, s:f, s:b, s:o, s:o}", "id", w->g->id, "label", w->g->label, "memory",
                              w->g->mem_bytes, "needs", w->need, "fits", w->need <= w->g->mem_bytes, "cheapest_fit",
                              point_json(&r->cuda, w->best), "single_levers_that_fit", alone);
        if (w->best) {
            json_object_set_new(g, "tokens_per_s", json_real(w->tps));
            json_object_set_new(g, "hours", json_real(w->hours));
            json_object_set_new(g, "price_per_hour", json_real(w->price));
            json_object_set_new(g, "cost_usd", json_real(w->usd));
        }
        json_array_append_new(gpus, g);
    }
    json_object_set_new(j, "gpus", gpus);
    json_object_set_new(j, "run_tokens", json_pack("{s:f, s:s}", "tokens", r->run_tokens, "source", r->tokens_source));
    json_object_set_new(j, "cheapest_gpu", r->cheapest >= 0 ? json_string(r->rows[r->cheapest].g->id) : json_null());
    return j;
}

/* ---- picture ---- */

static void bar_of(snug_svg_bar *b, const snug_fit_space *s, const snug_fit_point *pt, const char *label) {
    memset(b, 0, sizeof *b);
    snprintf(b->label, sizeof b->label, "%s%s", label,
             pt->plan.host_total && s->kind == SNUG_DEVICE_CUDA ? " (state in host memory)" : "");
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        b->bytes[c] = pt->plan.host[c] && s->kind == SNUG_DEVICE_CUDA ? 0 : (double)pt->plan.bytes[c];
    snug_overhead ov;
    snug_overhead_compute(&ov, s->kind, &pt->plan, s->host_data_bytes);
    b->overhead = (double)ov.total;
}

static int write_svg(const report *r, snug_error *e) {
    snug_svg_bar bars[MAXLEV + 20];
    int n = 0;
    const snug_fit_space *s = &r->cuda; /* the picture is about GPUs: cuda overhead */
    bar_of(&bars[n++], s, &s->pt[0], "as configured");
    for (int i = 0; i < r->nclev && n < MAXLEV; i++)
        bar_of(&bars[n++], s, r->clev[i].p, r->clev[i].name);
    for (int i = 0; i < r->nrows && n < MAXLEV + 19; i++) {
        const snug_fit_point *b = r->rows[i].best;
        if (!b || b == &s->pt[0] || b->changes < 2)
            continue;
        int dup = 0;
        for (int k = 0; k < i; k++)
            dup |= r->rows[k].best == b;
        if (dup)
            continue;
        char label[200];
        snprintf(label, sizeof label, "%.150s (fits %s)", b->what, r->rows[i].g->label);
        bar_of(&bars[n++], s, b, label);
    }
    snug_svg_line lines[16];
    int nl = 0;
    for (int i = 0; i < r->nrows && nl < 16; i++) {
        snprintf(lines[nl].label, sizeof lines[nl].label, "%s", r->rows[i].g->label);
        lines[nl++].bytes = r->rows[i].g->mem_bytes;
    }
    char title[1400];
    char name[256]; /* the model folder's own name */
    snprintf(name, sizeof name, "%.255s", r->model_name);
    for (size_t n = strlen(name); n > 1 && name[n - 1] == '/'; n--)
        name[n - 1] = '\0';
    const char *slash = strrchr(name, '/');
    if (slash && slash[1])
        memmove(name, slash + 1, strlen(slash + 1) + 1);
    snprintf(title, sizeof title, "snug plan: %.200s, %d x %d tokens, %s (cuda backend)", name,
             r->p->c.micro_batch_size, r->p->c.sequence_len, snug_optim_name(r->p->spec.optim, r->p->spec.optim_paged));
    SNUG_TRY(snug_svg_write(r->a->svg, title, bars, n, lines, nl, e));
    return 0;
}

static void png_path_of(const char *svg, char *png, size_t n) {
    size_t len = strlen(svg);
    if (len > 4 && !strcmp(svg + len - 4, ".svg"))
        snprintf(png, n, "%.*s.png", (int)(len - 4), svg);
    else
        snprintf(png, n, "%s.png", svg);
}

static const char *const mode_names[4] = {"ddp", "zero-1", "zero-2", "zero-3"};

/* --gpus N: one line per mode, the largest rank's memory and the step's communication */
static void print_ranks(const report *r, FILE *f) {
    const snug_plan_args *a = r->a;
    const snug_gpu *g = a->g;
    char b[6][32];
    fprintf(f, "\nper rank over %d GPUs%s%s", a->gpus, g ? " of " : "", g ? g->label : "");
    if (g)
        fprintf(f, " (collectives at %.0f GB/s, gpus.c; compute at the estimated %.0f tokens/s per GPU)", g->link_gbps,
                snug_gpu_tokens_per_s(g, &r->p->spec, r->p->plan.nparams));
    fprintf(f, ":\n  %-8s %11s %11s %11s %11s %11s %11s", "mode", "parameters", "master", "gradients", "optimizer",
            "the rest", "per rank");
    if (g)
        fprintf(f, "  %-4s %10s %9s %9s", "fits", "comm/step", "comm s", "step s");
    fputc('\n', f);
    for (int z = 0; z < 4; z++) {
        const snug_rank_mode *m = &r->modes[z];
        if (m->unbuilt) {
            fprintf(f, "  %-8s not built %s\n", mode_names[z], m->unbuilt);
            continue;
        }
        size_t rest = m->total + m->host_total - m->bytes[SNUG_MEM_PARAMS] - m->bytes[SNUG_MEM_MASTER] -
                      m->bytes[SNUG_MEM_GRADS] - m->bytes[SNUG_MEM_OPTIM];
        double v[6] = {(double)m->bytes[SNUG_MEM_PARAMS], (double)m->bytes[SNUG_MEM_MASTER],
                       (double)m->bytes[SNUG_MEM_GRADS], (double)m->bytes[SNUG_MEM_OPTIM], (double)rest, m->need};
        for (int i = 0; i < 6; i++)
            snug_format_bytes(b[i], sizeof b[i], v[i]);
        char name[16];
        snprintf(name, sizeof name, "%s", mode_names[z]);
        fprintf(f, "  %-8s %11s %11s %11s %11s %11s %11s", name, b[0], b[1], b[2], b[3], b[4], b[5]);
        if (g) {
            char cb[32];
            snug_format_bytes(cb, sizeof cb, m->comm_bytes);
            fprintf(f, "  %-4s %10s %9.3f %9.3f%s", m->fits ? "yes" : "no", cb, m->comm_s, m->step_s,
                    z == r->mode_choice ? "  <- chosen" : "");
        }
        fputc('\n', f);
    }
    char text[1400];
    int host = r->modes[0].host_total > 0;
    snprintf(text, sizeof text, "per rank: the device memory with the cuda runtime overhead and, over several ranks, "
             "NCCL's buffers (an estimate); the rest: activations, workspace, data%s. Every mode comes from the layout "
             "code the trainer allocates with (the largest rank's shards; zero-3's parameters are the rank's shard and "
             "one gather region of max(the global tensors, two layers), or with an untied head max(embedding, head, "
             "two layers); a tied head on the cpu is split by rows: loss_vocab_block; see src/plan/ranks.h)",
             host ? ", and the arenas in host memory (a paged optimizer's state, what offload_params, offload_embedding "
                    "and gradient_checkpointing: offload keep there), which per rank does not count"
                  : "");
    wrap(f, "  ", 4, text, 118);
    if (!g)
        return;
    snprintf(text, sizeof text, "step s: compute %.3f s per step (%d x %d tokens x %d micro-batches per rank) plus the "
             "communication it does not hide on NCCL's stream: ddp and zero-1 sum buckets during the last "
             "micro-batch's backward (the last bucket and zero-1's all-gather exposed); zero-2 and zero-3 "
             "reduce-scatter layer by layer, beside the next layer's backward with zero_overlap_comm (%s), and "
             "zero-3 prefetches each layer's gather (the first of each pass exposed)", r->modes[0].compute_s,
             r->p->spec.B, r->p->spec.T, r->p->spec.GA > 1 ? r->p->spec.GA : 1,
             r->p->spec.overlap_comm < 0 ? "off" : "on");
    wrap(f, "  ", 4, text, 118);
    snug_format_bytes(b[0], sizeof b[0], g->mem_bytes);
    if (r->mode_choice >= 0)
        snprintf(text, sizeof text, "chosen: %s, the mode that fits in %s at the least predicted step time (%.1f%% "
                 "over the compute alone)%s", mode_names[r->mode_choice], b[0],
                 100.0 * (r->modes[r->mode_choice].step_s / r->modes[r->mode_choice].compute_s - 1.0), "");
    else if (r->fewest_gpus) {
        snug_format_bytes(b[1], sizeof b[1], r->fewest.need);
        snprintf(text, sizeof text, "no mode fits in %s per GPU; over %d GPUs %s fits (%s per rank, %.3f s per step "
                 "of %d x %d tokens per rank), or the levers above shrink each rank", b[0], r->fewest_gpus,
                 mode_names[r->fewest.stage], b[1], r->fewest.step_s, r->p->spec.B * (r->p->spec.GA > 1 ?
                 r->p->spec.GA : 1), r->p->spec.T);
    } else {
        snprintf(text, sizeof text, "no mode fits in %s per GPU, even over %d GPUs; the levers above shrink each rank",
                 b[0], MAX_GPUS);
    }
    wrap(f, "  ", 4, text, 118);
}

static json_t *ranks_json(const report *r) {
    json_t *modes = json_array();
    for (int z = 0; z < 4; z++) {
        const snug_rank_mode *m = &r->modes[z];
        if (m->unbuilt) {
            json_array_append_new(modes, json_pack("{s:s, s:i, s:s}", "mode", mode_names[z], "zero_stage", z,
                                                   "not_built", m->unbuilt));
            continue;
        }
        json_t *o = json_pack("{s:s, s:i, s:o, s:I, s:I, s:f, s:f}", "mode", mode_names[z], "zero_stage", z,
                              "bytes", json_object(), "total", (json_int_t)m->total,
                              "host_total", (json_int_t)m->host_total, "need", m->need, "comm_bytes", m->comm_bytes);
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            json_object_set_new(json_object_get(o, "bytes"), snug_category_name((snug_category)c),
                                json_integer((json_int_t)m->bytes[c]));
        if (r->a->g) {
            json_object_set_new(o, "fits", json_boolean(m->fits));
            json_object_set_new(o, "comm_s", json_real(m->comm_s));
            json_object_set_new(o, "compute_s", json_real(m->compute_s));
            json_object_set_new(o, "step_s", json_real(m->step_s));
        }
        json_array_append_new(modes, o);
    }
    json_t *fewest = r->fewest_gpus ? json_pack("{s:i, s:s, s:f, s:f}", "gpus", r->fewest_gpus, "mode",
                                                mode_names[r->fewest.stage], "need", r->fewest.need, "step_s",
                                                r->fewest.step_s)
                                    : json_null();
    return json_pack("{s:i, s:o, s:o, s:o}", "gpus", r->a->gpus, "modes", modes, "chosen",
                     r->mode_choice >= 0 ? json_string(mode_names[r->mode_choice]) : json_null(), "fits_from",
                     fewest);
}

/* Pipeline parallelism: every stage planned; the setup's plan becomes the heaviest stage's. */
static int plan_stages(report *r, snug_error *e) {
    snug_setup *p = r->p;
    int P = p->spec.pp, heavy = 0;
    r->pp_params = calloc((size_t)P, sizeof *r->pp_params);
    r->pp_total = calloc((size_t)P, sizeof *r->pp_total);
    if (!r->pp_params || !r->pp_total)
        return snug_fail(e, SNUG_ENOMEM, "out of memory planning the stages");
    for (int q = 0; q < P; q++) {
        snug_plan_spec s = p->spec;
        snug_plan pl;
        s.pp_stage = q;
        SNUG_TRY(snug_plan_run(&pl, &s, e));
        r->pp_params[q] = pl.nparams;
        r->pp_total[q] = (double)(pl.total + pl.host_total);
        heavy = r->pp_total[q] > r->pp_total[heavy] ? q : heavy;
    }
    p->pp_stage = p->spec.pp_stage = heavy;
    return snug_plan_run(&p->plan, &p->spec, e);
}

int snug_plan_cmd(const snug_run_config *o, const snug_plan_args *a, FILE *out, snug_error *e) {
    report *r = calloc(1, sizeof *r);
    snug_setup *p = calloc(1, sizeof *p);
    if (!r || !p) {
        free(r);
        free(p);
        return snug_fail(e, SNUG_ENOMEM, "out of memory planning");
    }
    r->o = o;
    r->a = a;
    r->p = p;
    r->kind = a->backend == SNUG_BACKEND_CUDA || (a->backend == SNUG_BACKEND_AUTO && a->g) ? SNUG_DEVICE_CUDA
                                                                                          : SNUG_DEVICE_CPU;
    int rc = a->gpus > 1 && o->tensor_parallel_size > 1
                 ? snug_fail(e, SNUG_EINPUT, "command line: --gpus %d plans data parallelism over GPUs, which does "
                             "not run beside tensor parallelism on GPUs yet; with tensor_parallel_size %d the plan is "
                             "already one rank's: drop --gpus", a->gpus, o->tensor_parallel_size)
             : (a->gpus > 1 || r->kind == SNUG_DEVICE_CUDA) && o->pipeline_parallel_size > 1
                 ? snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size %d: pipeline parallelism runs on CPU ranks only "
                             "for now; plan it with --backend cpu (and without --gpus)", o->pipeline_parallel_size)
                 : snug_setup_resolve(p, o, r->kind, e);
    if (!rc && p->spec.pp > 1)
        rc = plan_stages(r, e);
    if (!rc) { /* the data when it can be read: its size prices the run and the host memory */
        r->data_host_bytes = p->data_host_est;
        snug_error de = {0};
        if (p->c.ndatasets > 0 && snug_setup_load_data(p, &de) == 0) {
            r->data_loaded = 1;
            r->data_tokens = p->train.ntokens + p->val.ntokens;
            r->data_host_bytes = snug_data_host_bytes(r->data_tokens, p->train.nexamples + p->val.nexamples,
                                                      p->c.sequence_len);
        } else if (p->c.ndatasets > 0) {
            snprintf(r->data_error, sizeof r->data_error, "%.500s", de.msg);
        }
    }
    if (!rc)
        rc = build(r, e);
    if (!rc && a->gpus > 1)
        rc = snug_plan_ranks(&p->spec, a->gpus, a->g, r->modes, &r->mode_choice, e);
    if (!rc && a->gpus > 1 && a->g && r->mode_choice < 0)
        rc = snug_plan_ranks_fewest(&p->spec, a->gpus, MAX_GPUS, a->g, &r->fewest_gpus, &r->fewest, e);
    if (!rc && a->svg[0])
        rc = write_svg(r, e);
    if (!rc) {
        if (a->json) {
            json_t *j = report_json(r);
            if (a->gpus > 1)
                json_object_set_new(j, "ranks", ranks_json(r));
            if (a->svg[0]) {
                char png[1100];
                png_path_of(a->svg, png, sizeof png);
                json_object_set_new(j, "svg", json_string(a->svg));
                json_object_set_new(j, "png", snug_svg_to_png(a->svg, png) == 0 ? json_string(png) : json_null());
            }
            json_dumpf(j, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            fputc('\n', out);
            json_decref(j);
        } else {
            print_text(r, out);
            if (a->gpus > 1)
                print_ranks(r, out);
            if (a->svg[0]) {
                char png[1100];
                png_path_of(a->svg, png, sizeof png);
                if (snug_svg_to_png(a->svg, png) == 0)
                    fprintf(out, "\nchart: %s and %s\n", a->svg, png);
                else
                    fprintf(out, "\nchart: %s (no PNG: install rsvg-convert or ImageMagick to get one)\n", a->svg);
            }
        }
    }
    report_free(r);
    snug_setup_free(p);
    free(r);
    free(p);
    return rc;
}
