/* report.c: what a run tells (see report.h). */
#include "train/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/fileio.h"
#include "model/quant4.h"
#include "optim/optim.h"
#include "plan/plan.h"
#include "plan/plan_json.h"
#include "train/sample.h"

double snug_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double snug_peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

/* The CPU runtime overhead with the data as read (plan/gpus.c). */
void snug_rank_overhead(const snug_run *r, snug_overhead *ov) {
    snug_overhead_compute(ov, SNUG_DEVICE_CPU, &r->s.plan,
                          snug_data_host_bytes(r->s.train.ntokens + r->s.val.ntokens,
                                               r->s.train.nexamples + r->s.val.nexamples, r->s.c.sequence_len));
}

/* memory.json (or a rank's memory.rankR.json) in output_dir: this process's plan beside its measured peaks. */
int snug_rank_memory_json(const snug_run *r, const char *file, const size_t *measured, snug_error *e) {
    snug_overhead ov;
    snug_rank_overhead(r, &ov);
    char mj[4096];
    snug_path_join(mj, sizeof mj, r->s.c.output_dir, file);
    return snug_memory_json_write(mj, &r->s.spec, &r->s.plan, measured, &ov, snug_peak_rss_bytes(), r->eng.be->name,
                                  (double)snug_backend_device_used(r->eng.be), e);
}

/* One terminal line, redrawn in place: progress, the step's metrics, and the time left. */
void snug_progress_bar(FILE *out, int step, int total, double loss, double smoothed, double lr, double norm, double tps,
                       double rss, double elapsed) {
    int width = 24, filled = (int)((double)step / total * width);
    double eta = step ? elapsed / step * (total - step) : 0;
    fprintf(out, "\r[");
    for (int i = 0; i < width; i++)
        fputc(i < filled ? '#' : '.', out);
    fprintf(out, "] %d/%d loss %.4f (smoothed %.4f) lr %.2e gnorm %.3f %.0f tok/s %.0f MiB eta %dm%02ds ", step, total,
            loss, smoothed, lr, norm, tps, rss / 1048576.0, (int)eta / 60, (int)eta % 60);
    fflush(out);
}

void snug_report_header(snug_run *r, FILE *out, int total_steps, size_t batches_per_epoch) {
    const snug_run_config *o = &r->s.c;
    const snug_model_config *c = &r->s.cfg;
    fprintf(out, "snug: training %s (%s, %d layers, width %d, %d heads / %d kv heads, vocab %d)\n",
            o->base_model[0] ? o->base_model : o->model_preset, c->model_type, c->n_layer, c->hidden_size, c->n_head,
            c->n_kv_head, c->vocab_size);
    snug_param_table whole;
    if (r->eng.model.tp > 1 && !snug_param_table_build(&whole, c, NULL)) { /* tensor parallelism: the rank's share */
        fprintf(out, "  parameters           %zu (%.2fM), %lld (%.2fM) on each of %d tensor-parallel ranks\n",
                whole.total, whole.total / 1e6, r->s.plan.nparams, r->s.plan.nparams / 1e6, r->eng.model.tp);
        snug_param_table_free(&whole);
    } else if (r->eng.model.pp > 1 && !snug_param_table_build(&whole, c, NULL)) { /* this rank's stage */
        fprintf(out, "  parameters           %zu (%.2fM), %lld (%.2fM) on stage %d of %d\n", whole.total,
                whole.total / 1e6, r->s.plan.nparams, r->s.plan.nparams / 1e6, r->eng.model.pp_stage, r->eng.model.pp);
        snug_param_table_free(&whole);
    } else {
        fprintf(out, "  parameters           %lld (%.2fM)\n", r->s.plan.nparams, r->s.plan.nparams / 1e6);
    }
    const snug_lora_cfg *lc = &r->s.spec.lv.lora;
    if (lc->kind != SNUG_ADAPTER_NONE) { /* what the adapters are, as PEFT's LoraConfig would say it */
        char targets[512] = "";
        size_t n = 0;
        for (int k = 0; snug_lora_module_name(c->arch, k); k++)
            if (lc->targets >> k & 1u) { /* as PEFT's target_modules name them: the module's last name */
                const char *name = snug_lora_module_name(c->arch, k), *dot = strrchr(name, '.');
                n += (size_t)snprintf(targets + n, n < sizeof targets ? sizeof targets - n : 0, "%s%s", n ? ", " : "",
                                      dot ? dot + 1 : name);
            }
        const snug_param_table *t = snug_model_trainable(&r->eng.model);
        double all = (double)r->s.plan.nparams + (double)t->total; /* PEFT's "all params": the base's and the adapters' */
        fprintf(out, "  adapter              %s%s%s r=%d, alpha %g (scale %g%s), dropout %g, targets %s%s%s; %zu (%.2fM) "
                "trainable, %.4f%% of all%s%s%s%s%s\n", lc->dora ? "DoRA" : "LoRA",
                lc->kind == SNUG_ADAPTER_QLORA ? " on the " : "",
                lc->kind == SNUG_ADAPTER_QLORA ? (lc->q4_type == SNUG_Q4_INT8 ? "8-bit base," : "4-bit base,") : "",
                lc->r, (double)lc->alpha, (double)r->eng.model.lora.scale, lc->rslora ? ", rsLoRA" : "",
                (double)lc->dropout, targets, o->lora_layers[0] ? ", layers " : "", o->lora_layers, t->total,
                t->total / 1e6, all > 0 ? 100.0 * (double)t->total / all : 0.0,
                o->lora_model_dir[0] ? "; every setting from the adapter (lora_model_dir's adapter_config.json)" : "",
                r->s.adapter_overrides[0] ? ", over the config's " : "", r->s.adapter_overrides,
                r->eng.model.lv.lora.init ? "; its base less the initial pair of " : "",
                r->eng.model.lv.lora.init ? (r->eng.model.lv.lora.init == SNUG_LORA_INIT_PISSA ? "PiSSA" : "OLoRA")
                                          : "");
    }
    if (o->unfrozen.n) /* the rank's (stage's) tensors the patterns name */
        fprintf(out, "  unfrozen             %lld (%.2fM) of them train (unfrozen_parameters); the others are "
                "frozen: no optimizer state, no update\n", r->s.plan.ntrain, r->s.plan.ntrain / 1e6);
    fprintf(out, "  tokenizer            %s", r->s.tok_path[0] ? r->s.tok_path : "byte-level (256 bytes + end of text)");
    const snug_model_config *mc = &r->s.cfg;
    char init[64];
    snprintf(init, sizeof init, mc->vocab_mean ? "the mean of the old" : "normal(0, %.3g)",
             (double)mc->initializer_range);
    if (r->s.nadded && mc->vocab_base) /* (added_tokens.h) */
        fprintf(out, ", %d token%s added: the embedding and lm_head grown from %d to %d rows, the new ones %s",
                r->s.nadded, r->s.nadded > 1 ? "s" : "", mc->vocab_base, mc->vocab_size, init);
    else if (r->s.nadded)
        fprintf(out, ", %d token%s added into rows the model has spare", r->s.nadded, r->s.nadded > 1 ? "s" : "");
    fprintf(out, "\n");
    fprintf(out, "  data                 %zu examples, %zu tokens (validation: %zu examples)\n", r->s.train.nexamples,
            r->s.train.ntokens, r->s.val.nexamples);
    snug_data_report_print(out, "data files", &r->s.drep, r->s.dsrc, &r->s.dopts);
    if (r->s.chat_note[0]) /* a built-in chosen over the tokenizer's own template */
        fprintf(out, "  chat template        %s\n", r->s.chat_note);
    if (o->ntest_datasets)
        snug_data_report_print(out, "validation files", &r->s.vrep, r->s.vsrc, &r->s.dopts);
    snug_batching_report_print(out, &r->brep);
    fprintf(out, "  batch                %d rows x %d tokens x %d accumulation = %lld tokens per step\n",
            o->micro_batch_size, o->sequence_len, o->gradient_accumulation_steps,
            (long long)o->micro_batch_size * o->sequence_len * o->gradient_accumulation_steps);
    fprintf(out, "  schedule             %d steps (%zu micro-batches per epoch), lr %g %s, warmup %d\n", total_steps,
            batches_per_epoch, o->learning_rate, snug_sched_name(o->lr_scheduler), snug_warmup_steps(o, total_steps));
    fprintf(out, "  optimizer            %s\n", snug_optim_name(r->s.spec.optim, r->s.spec.optim_paged));
    const snug_levers *lv = &r->s.spec.lv;
    if (lv->dt != SNUG_DT_F32)
        fprintf(out, "  precision            %s storage, fp32 compute, %s%s\n", lv->dt == SNUG_DT_BF16 ? "bf16" : "fp16",
                lv->master_weights ? "fp32 master weights" : "stochastic rounding (no master weights)",
                lv->dt == SNUG_DT_F16 ? ", dynamic loss scaling from 2^16" : "");
    else
        fprintf(out, "  precision            fp32\n");
    if (r->eng.be->gemm)
        fprintf(out, "  gemm                 %s\n", r->eng.be->gemm);
    if (r->s.fit_note[0])
        fprintf(out, "%s\n", r->s.fit_note);
    char who[96] = ""; /* several ranks: the plan is this rank's (rank 0's; under ZeRO each plans its shard) */
    if (r->s.spec.ranks > 1)
        snprintf(who, sizeof who, ", rank %d of %d%s", r->s.spec.rank, r->s.spec.ranks,
                 r->eng.opt.sharded           ? ", optimizer state of its ZeRO shard"
                 : r->eng.model.param_sharded || r->eng.model.q4_parts > 1 ? ", its shard of the frozen base"
                                              : "");
    if (r->eng.be->caps & SNUG_CAP_HOST_THREADS)
        fprintf(out, "memory plan (backend %s, %d threads%s):\n", r->eng.be->name, r->eng.be->nthreads, who);
    else
        fprintf(out, "memory plan (backend %s%s):\n", r->eng.be->name, who);
    snug_plan_print(out, &r->s.plan, NULL);
}

/* metrics.jsonl of a resumed run: the lines of the steps up to the checkpoint, rewritten, the file then appended */
FILE *snug_reopen_metrics(const char *path, int upto, snug_error *e) {
    char *text = NULL;
    size_t len = 0;
    if (snug_read_file(path, &text, &len, e))
        return NULL;
    size_t keep = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        int step = -1;
        if (!nl || sscanf(line, "{\"step\": %d", &step) != 1 || step > upto)
            break;
        keep = (size_t)(nl + 1 - text);
        line = nl + 1;
    }
    int rc = snug_write_file_atomic(path, text, keep, e);
    free(text);
    if (rc)
        return NULL;
    FILE *f = fopen(path, "a");
    if (!f)
        snug_fail(e, SNUG_EIO, "%s: cannot append to the metrics log", path);
    return f;
}

int snug_report_end(snug_loop *l, int rc, snug_error *e) {
    snug_run *r = l->r;
    const snug_run_config *o = &r->s.c;
    FILE *out = r->out;
    int lead = r->lead;
    if (!rc && !l->stopped && lead) {
        fprintf(out, "saved %s (%s) in %.1f s\n", o->output_dir,
                r->eng.model.lora.on ? "PEFT adapter" : "Hugging Face format", snug_now_s() - l->t0);
        if (l->ls.on)
            fprintf(out, "fp16 loss scaling: %d of %d steps skipped for overflow; final scale %.0f\n", l->ls.skipped,
                    l->total, l->ls.scale);
        size_t measured[SNUG_MEM_NCAT];
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            measured[c] = r->eng.arenas.a[c].peak;
        fprintf(out, "memory (arena high-water marks beside the plan):\n");
        snug_plan_print(out, &r->s.plan, measured);
        char b[32];
        snug_format_bytes(b, sizeof b, snug_peak_rss_bytes());
        fprintf(out, "  %-20s %12s  %16s\n", "process peak RSS", "", b);
        size_t dev = snug_backend_device_used(r->eng.be); /* arenas are allocated once, so in use now = the peak */
        if (dev) {
            snug_format_bytes(b, sizeof b, (double)dev);
            fprintf(out, "  %-20s %12s  %16s  (cudaMemGetInfo: arenas, CUDA context, cuBLASLt workspace)\n",
                    "device memory in use", "", b);
        }
        snug_overhead ov;
        snug_rank_overhead(r, &ov);
        snug_format_bytes(b, sizeof b, (double)(r->s.plan.total + r->s.plan.host_total + ov.total));
        fprintf(out, "  %-20s %12s  (the arenas + %s runtime overhead)\n", "predicted RSS", b, "CPU");
        rc = snug_rank_memory_json(r, "memory.json", measured, e);
        snug_run_sample(r, out);
    }
    /* under ZeRO (and tensor parallelism) each rank plans its own shard (slices): each writes its memory */
    if (!rc && !l->stopped && !lead && (l->par.shard || r->eng.model.q4_parts > 1 || r->gn > 1)) {
        size_t measured[SNUG_MEM_NCAT];
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            measured[c] = r->eng.arenas.a[c].peak;
        char name[64];
        snprintf(name, sizeof name, "memory.rank%d.json", r->comm.rank);
        rc = snug_rank_memory_json(r, name, measured, e);
    }
    return rc;
}
