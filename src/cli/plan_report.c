/* plan_report.c: the report of `snug plan` computed (see plan_report.h): the plan of the configuration, the lever
 * search and each lever on its own, the fit on the table's GPUs, the training methods side by side, the run's tokens,
 * time and cost; and the small formatting helpers the text and JSON writers share. The memory numbers come from
 * snug_plan_run (the layout code the trainer allocates with); the runtime overhead, the GPU table, the step-time costs
 * and the prices are estimates from gpus.c and autofit.c, and say so. */
#include "cli/plan_report.h"

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

/* When each category is in use, and where the step's peak falls. */
const char *const plan_when_text[] = {
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
const int plan_nwhen = (int)(sizeof plan_when_text / sizeof plan_when_text[0]);

/* Prints text wrapped at width columns, the first line after `lead`, the others indented by indent spaces. */
void plan_wrap(FILE *f, const char *lead, int indent, const char *text, int width) {
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
const char *plan_q4_code(const snug_levers *lv) {
    return lv->lora.q4_type == SNUG_Q4_INT8 ? "INT8" : lv->lora.q4_type ? "FP4" : "NF4";
}

void plan_category_what(const report *r, int c, char *buf, size_t n) {
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
                     snug_precision_name(s->lv.dt), plan_q4_code(&s->lv));
        else if (s->lv.lora.kind == SNUG_ADAPTER_QLORA)
            snprintf(buf, n, "%s block matrices, %s embeddings, norms, head", plan_q4_code(&s->lv),
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

void plan_fmtb(char *s, size_t n, double b) { snug_format_bytes(s, n, b); }

void plan_fmt_hours(char *s, size_t n, double h) {
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

double plan_cap_of(const snug_fit_space *s, const snug_fit_point *pt) { return snug_fit_point_need(s, pt); }

/* Tokens per step of a setting and of the configured run. */
double plan_step_tokens(const snug_run_config *o) {
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
    w->total = plan_cap_of(&r->space, p0) - w->saves;
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
    double per_step = plan_step_tokens(o);
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

int plan_report_build(report *r, snug_error *e) {
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
        w->need = plan_cap_of(&r->cuda, &r->cuda.pt[0]);
        w->best = snug_fit_best(&r->cuda, w->g->mem_bytes);
        if (w->need > w->g->mem_bytes)
            for (int k = 0; k < r->nclev; k++)
                if (plan_cap_of(&r->cuda, r->clev[k].p) <= w->g->mem_bytes)
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

void plan_report_free(report *r) {
    free(r->pp_params);
    free(r->pp_total);
    if (r->own_cuda)
        snug_fit_space_free(&r->cuda);
    snug_fit_space_free(&r->space);
}

/* The model's parameters (under tensor or pipeline parallelism the plan's are one rank's share) */
double plan_whole_params(const snug_setup *p) {
    snug_param_table t;
    if ((p->spec.tp <= 1 && p->spec.pp <= 1) || snug_param_table_build(&t, &p->cfg, NULL))
        return (double)p->plan.nparams;
    double n = (double)t.total;
    snug_param_table_free(&t);
    return n;
}
