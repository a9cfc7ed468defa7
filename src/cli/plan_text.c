/* plan_text.c: the report of `snug plan` as text (see plan_report.h): the run, memory by category, the levers, the
 * fit on each GPU, the methods, time and cost, and the per-rank plans of --gpus. */
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

/* ---- text ---- */

/* A parameter count: 3.67M, 8.03B */
static void count_text(char *buf, size_t n, double v) {
    snprintf(buf, n, v >= 1e9 ? "%.2fB" : "%.2fM", v >= 1e9 ? v / 1e9 : v / 1e6);
}

/* The run: model, batch, training method, levers, and what tensor and pipeline parallelism split. */
static void print_run(const report *r, FILE *f) {
    const snug_setup *p = r->p;
    const snug_run_config *o = &p->c;
    const snug_model_config *c = &p->cfg;
    const snug_plan *pl = &p->plan;
    char a[32], b[32], lv[256];
    double whole = plan_whole_params(p);
    fprintf(f, "snug plan: %s (%s, %.2fB parameters: %d layers, width %d, %d heads / %d kv heads, vocab %d)\n",
            r->model_name, c->model_type, whole / 1e9, c->n_layer, c->hidden_size, c->n_head, c->n_kv_head,
            c->vocab_size);
    fprintf(f, "  batch        %d x %d tokens per micro-batch, %d accumulation = %.0f tokens per step\n",
            o->micro_batch_size, o->sequence_len, o->gradient_accumulation_steps, plan_step_tokens(o));
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
                 q ? plan_q4_code(pl_lv) : snug_precision_name(pl_lv->dt), snug_precision_name(pl_lv->dt));
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
        plan_fmtb(a, sizeof a, bytes);
        plan_fmtb(b, sizeof b, (double)p->spec.B * p->spec.T * c->hidden_size * sizeof(float));
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
        plan_fmtb(b, sizeof b, (double)p->spec.B * p->spec.T * c->hidden_size * sizeof(float));
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
            plan_fmtb(a, sizeof a, r->pp_total[q]);
            char span[32];
            snprintf(span, sizeof span, n == 1 ? "layer %d" : "layers %d-%d", l0, l0 + n - 1);
            fprintf(f, "               stage %d: %s%s: %s parameters, %s\n", q, span,
                    q == 0 && P > 1 ? " and the embedding" : q == P - 1 ? " and the head" : "", n1, a);
        }
        fprintf(f, "               per micro-batch and stage boundary %s forward and its gradient back\n", b);
    }
    if (p->fit_note[0])
        fprintf(f, "  %s\n", p->fit_note);
}

/* The plan by category, the runtime overhead, when each category is in use, and the fit on the target. */
static void print_memory(const report *r, FILE *f) {
    const snug_plan *pl = &r->p->plan;
    char a[32], b[32], d[32];
    double P = pl->nparams > 0 ? (double)pl->nparams : 1;
    fprintf(f, "\nmemory on the %s backend (the layout code on counting arenas: exactly what training allocates)\n",
            snug_device_kind_name(r->kind));
    fprintf(f, "  %-20s %11s  %7s  %s\n", "category", "peak", "B/param", "what");
    for (int k = 0; k < SNUG_MEM_NCAT; k++) {
        char what[192], bpp[16] = "";
        plan_fmtb(a, sizeof a, (double)pl->bytes[k]);
        plan_category_what(r, k, what, sizeof what);
        if (k <= SNUG_MEM_OPTIM)
            snprintf(bpp, sizeof bpp, "%.2f", pl->bytes[k] / P);
        fprintf(f, "  %-20s %11s  %7s  %s\n", snug_category_name((snug_category)k), a, bpp, what);
    }
    plan_fmtb(a, sizeof a, (double)pl->total);
    fprintf(f, "  %-20s %11s\n", pl->host_total ? "arenas on the device" : "arenas", a);
    if (pl->host_total) {
        plan_fmtb(a, sizeof a, (double)pl->host_total);
        fprintf(f, "  %-20s %11s  %s\n", "arenas in host mem.", a,
                r->kind == SNUG_DEVICE_CPU ? "(on the cpu backend the same memory: counted in the total)"
                                           : "(pinned host memory, not on the GPU)");
    }
    plan_fmtb(a, sizeof a, (double)r->ov.total);
    fprintf(f, "  %-20s %11s  %7s  %s\n", "runtime overhead", a, "",
            r->kind == SNUG_DEVICE_CUDA ? "estimates, see docs/MEMORY.md" : "baseline measured on snug's own runs");
    for (int i = 0; i < r->ov.n; i++) {
        plan_fmtb(b, sizeof b, (double)r->ov.item[i].bytes);
        fprintf(f, "    %-26s %11s  %s\n", r->ov.item[i].name, b, r->ov.item[i].note);
    }
    plan_fmtb(a, sizeof a, r->need);
    fprintf(f, "  %-20s %11s\n", "total", a);
    fprintf(f, "\nwhen each category is in use, and where the peak falls:\n");
    for (int i = 0; i < plan_nwhen; i++)
        plan_wrap(f, "  - ", 4, plan_when_text[i], 118);

    if (r->target_name) {
        plan_fmtb(a, sizeof a, r->target_bytes);
        plan_fmtb(b, sizeof b, r->need);
        if (r->need <= r->target_bytes) {
            plan_fmtb(d, sizeof d, r->target_bytes - r->need);
            fprintf(f, "\n%s (%s): fits: needs %s, %s to spare\n", r->target_name, a, b, d);
        } else {
            plan_fmtb(d, sizeof d, r->need - r->target_bytes);
            fprintf(f, "\n%s (%s): does not fit: needs %s, %s short\n", r->target_name, a, b, d);
            if (r->target_best) {
                char n[32];
                plan_fmtb(n, sizeof n, plan_cap_of(&r->space, r->target_best));
                fprintf(f, "  cheapest setting that fits: %s (needs %s, predicted step time %+.0f%%); auto_fit: true "
                           "with memory_budget chooses it\n", r->target_best->what, n, 100 * r->target_best->cost);
            } else {
                fprintf(f, "  no setting of the levers fits; see the smallest below\n");
            }
        }
    }
}

/* Each lever on its own, and the smallest combination. */
static void print_levers(const report *r, FILE *f) {
    char a[32], b[32];
    fprintf(f, "\nlevers, each on its own (re-planned with the layout code: savings exact; step times predicted):\n");
    if (!r->nlev)
        fprintf(f, "  none saves memory for this configuration\n");
    else
        fprintf(f, "  %-52s %11s %11s %9s  %s\n", "lever", "saves", "total", "step time", "why it costs");
    for (int i = 0; i < r->nlev; i++) {
        const snug_lever_effect *l = &r->lev[i];
        plan_fmtb(a, sizeof a, l->saves);
        plan_fmtb(b, sizeof b, plan_cap_of(&r->space, l->p));
        fprintf(f, "  %-52s %11s %11s %+8.0f%%  %s\n", l->name, a, b, 100 * l->p->cost, l->cost_note);
    }
    for (int i = 0; i < r->nlisted; i++) {
        const listed_row *w = &r->listed[i];
        plan_fmtb(a, sizeof a, w->saves);
        plan_fmtb(b, sizeof b, w->total);
        fprintf(f, "  %-52s %11s %11s %+8.0f%%  %s\n", w->name, a, b, w->cost_pct, w->why);
    }
    const snug_fit_point *sm = snug_fit_smallest(&r->space);
    if (sm && sm != &r->space.pt[0]) {
        plan_fmtb(a, sizeof a, plan_cap_of(&r->space, sm));
        fprintf(f, "  smallest of all combinations: %s: %s (%+.0f%%)\n", sm->what, a, 100 * sm->cost);
    }
}

/* The fit on the table's GPUs, with the cheapest fix where one does not fit. */
static void print_gpus(const report *r, FILE *f) {
    char a[32], b[32], d[32];
    fprintf(f, "\nfit on common GPUs (cuda backend: arenas + CUDA context, cuBLASLt workspace, scratch and allocator slack):\n");
    fprintf(f, "  %-15s %10s %11s  %s\n", "gpu", "memory", "needs", "verdict");
    for (int i = 0; i < r->nrows; i++) {
        const gpu_row *w = &r->rows[i];
        char lead[96], v[1024];
        plan_fmtb(a, sizeof a, w->g->mem_bytes);
        plan_fmtb(b, sizeof b, w->need);
        snprintf(lead, sizeof lead, "  %-15s %10s %11s  ", w->g->label, a, b);
        size_t len = 0;
        if (w->need <= w->g->mem_bytes) {
            plan_fmtb(d, sizeof d, w->g->mem_bytes - w->need);
            len += (size_t)snprintf(v, sizeof v, "fits, %s to spare", d);
            if (w->best && w->best->cost < -0.005)
                snprintf(v + len, sizeof v - len, "; faster and fits: %s (%+.0f%%)", w->best->what, 100 * w->best->cost);
        } else if (!w->best) {
            const snug_fit_point *cs = snug_fit_smallest(&r->cuda);
            plan_fmtb(d, sizeof d, w->need - w->g->mem_bytes);
            plan_fmtb(a, sizeof a, plan_cap_of(&r->cuda, cs));
            plan_fmtb(b, sizeof b,
                 (double)(cs->plan.bytes[SNUG_MEM_PARAMS] + cs->plan.bytes[SNUG_MEM_MASTER] +
                          cs->plan.bytes[SNUG_MEM_GRADS] + (cs->plan.host[SNUG_MEM_OPTIM] ? 0 : cs->plan.bytes[SNUG_MEM_OPTIM])));
            snprintf(v, sizeof v, "does not fit (%s short) whatever the levers: the smallest setting needs %s, of which "
                     "%s are weights, gradients and optimizer state on the GPU", d, a, b);
        } else {
            plan_fmtb(d, sizeof d, w->need - w->g->mem_bytes);
            plan_fmtb(a, sizeof a, plan_cap_of(&r->cuda, w->best));
            len += (size_t)snprintf(v, sizeof v, "does not fit (%s short); cheapest fix: %s -> %s, %+.0f%% step time", d,
                                    w->best->what, a, 100 * w->best->cost);
            for (int k = 0; k < w->nalone && len < sizeof v; k++)
                len += (size_t)snprintf(v + len, sizeof v - len, "%s %s (%+.0f%%)",
                                        k ? "," : "; single levers that fit on their own:", w->alone[k]->name,
                                        100 * w->alone[k]->p->cost);
        }
        plan_wrap(f, lead, (int)strlen(lead), v, 118);
    }
}

/* Full fine-tuning against the adapter methods, where each fits. */
static void print_methods(const report *r, FILE *f) {
    char a[32];
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
            plan_fmtb(a, sizeof a, r->method_need[k]);
            fprintf(f, "  %-44s %11s  %s\n", r->method_name[k], a, len ? fits : "none of the table");
        }
    }
}

/* The run's time and cost on each GPU that fits. */
static void print_cost(const report *r, FILE *f) {
    const snug_setup *p = r->p;
    const snug_plan *pl = &p->plan;
    char a[32];
    char head[1024];
    char group[64] = "";
    if (r->p->spec.tp > 1)
        snprintf(group, sizeof group, ", %d at a time (tensor-parallel)", r->p->spec.tp);
    snprintf(head, sizeof head, "time and cost of the run on each GPU that fits%s (%.4g tokens: %s):", group,
             r->run_tokens, r->tokens_source);
    fputc('\n', f);
    plan_wrap(f, "", 2, head, 118);
    int any = 0;
    for (int i = 0; i < r->nrows; i++) {
        const gpu_row *w = &r->rows[i];
        if (!w->best)
            continue;
        if (!any++)
            fprintf(f, "  %-15s %10s %12s %8s %10s  %s\n", "gpu", "tokens/s", "time", "$/hour", "cost $", "setting");
        plan_fmt_hours(a, sizeof a, w->hours);
        char usd[32];
        snprintf(usd, sizeof usd, w->usd < 0.005 ? "< 0.01" : "%.2f", w->usd);
        fprintf(f, "  %-15s %10.0f %12s %8.2f %10s  %s\n", w->g->label, w->tps, a, w->price, usd, w->best->what);
    }
    if (!any)
        fprintf(f, "  none: no GPU of the table fits this run\n");
    if (r->cheapest >= 0) {
        const gpu_row *w = &r->rows[r->cheapest];
        plan_fmt_hours(a, sizeof a, w->hours);
        fprintf(f, "  cheapest: %s, $%.*f (%s)\n", w->g->label, w->usd < 0.01 ? 4 : 2, w->usd, a);
    }
    const char *prices = r->a->price_per_hour > 0 ? (r->a->g ? "--price_per_hour for --gpu's GPU, the table's for "
                                                                 "the others" : "--price_per_hour on every GPU")
                                                  : "typical on-demand USD per GPU-hour (estimates, see docs/MEMORY.md)";
    /* the peak snug_gpu_tokens_per_s prices: fp32 GEMMs are exact fp32 (no TF32), 16-bit ones on the tensor cores */
    const char *peak = p->spec.lv.dt == SNUG_DT_F32 ? "FP32 (CUDA-core)" : "bf16 tensor-core";
    if (r->a->tokens_per_s > 0)
        snprintf(head, sizeof head, "tokens/s: the measured %.0f%s%s%s, divided by the setting's predicted step time; "
                 "prices: %s", r->a->tokens_per_s,
                 r->a->g ? " on --gpu's GPU, scaled to the others by their " : " on every GPU", r->a->g ? peak : "",
                 r->a->g ? " peaks" : "", prices);
    else
        snprintf(head, sizeof head, "tokens/s: estimated as the %s peak x %.0f%% MFU / %.3g FLOPs per token (6 per "
                 "parameter + attention), divided by the setting's predicted step time; prices: %s", peak,
                 100 * SNUG_ASSUMED_MFU, snug_flops_per_token(&p->spec, pl->nparams), prices);
    plan_wrap(f, "  ", 4, head, 118);
}

void plan_print_text(const report *r, FILE *f) {
    print_run(r, f);
    print_memory(r, f);
    print_levers(r, f);
    print_gpus(r, f);
    print_methods(r, f);
    print_cost(r, f);
}

/* --gpus N: one line per mode, the largest rank's memory and the step's communication */
void plan_print_ranks(const report *r, FILE *f) {
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
            fprintf(f, "  %-8s not built %s\n", plan_mode_names[z], m->unbuilt);
            continue;
        }
        size_t rest = m->total + m->host_total - m->bytes[SNUG_MEM_PARAMS] - m->bytes[SNUG_MEM_MASTER] -
                      m->bytes[SNUG_MEM_GRADS] - m->bytes[SNUG_MEM_OPTIM];
        double v[6] = {(double)m->bytes[SNUG_MEM_PARAMS], (double)m->bytes[SNUG_MEM_MASTER],
                       (double)m->bytes[SNUG_MEM_GRADS], (double)m->bytes[SNUG_MEM_OPTIM], (double)rest, m->need};
        for (int i = 0; i < 6; i++)
            snug_format_bytes(b[i], sizeof b[i], v[i]);
        char name[16];
        snprintf(name, sizeof name, "%s", plan_mode_names[z]);
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
    plan_wrap(f, "  ", 4, text, 118);
    if (!g)
        return;
    snprintf(text, sizeof text, "step s: compute %.3f s per step (%d x %d tokens x %d micro-batches per rank) plus the "
             "communication it does not hide on NCCL's stream: ddp and zero-1 sum buckets during the last "
             "micro-batch's backward (the last bucket and zero-1's all-gather exposed); zero-2 and zero-3 "
             "reduce-scatter layer by layer, beside the next layer's backward with zero_overlap_comm (%s), and "
             "zero-3 prefetches each layer's gather (the first of each pass exposed)", r->modes[0].compute_s,
             r->p->spec.B, r->p->spec.T, r->p->spec.GA > 1 ? r->p->spec.GA : 1,
             r->p->spec.overlap_comm < 0 ? "off" : "on");
    plan_wrap(f, "  ", 4, text, 118);
    snug_format_bytes(b[0], sizeof b[0], g->mem_bytes);
    if (r->mode_choice >= 0)
        snprintf(text, sizeof text, "chosen: %s, the mode that fits in %s at the least predicted step time (%.1f%% "
                 "over the compute alone)%s", plan_mode_names[r->mode_choice], b[0],
                 100.0 * (r->modes[r->mode_choice].step_s / r->modes[r->mode_choice].compute_s - 1.0), "");
    else if (r->fewest_gpus) {
        snug_format_bytes(b[1], sizeof b[1], r->fewest.need);
        snprintf(text, sizeof text, "no mode fits in %s per GPU; over %d GPUs %s fits (%s per rank, %.3f s per step "
                 "of %d x %d tokens per rank), or the levers above shrink each rank", b[0], r->fewest_gpus,
                 plan_mode_names[r->fewest.stage], b[1], r->fewest.step_s, r->p->spec.B * (r->p->spec.GA > 1 ?
                 r->p->spec.GA : 1), r->p->spec.T);
    } else {
        snprintf(text, sizeof text, "no mode fits in %s per GPU, even over %d GPUs; the levers above shrink each rank",
                 b[0], MAX_GPUS);
    }
    plan_wrap(f, "  ", 4, text, 118);
}
