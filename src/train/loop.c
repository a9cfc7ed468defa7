/* loop.c: the training loop over one state (see loop.h). */
#include "train/loop.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "data/batching.h"
#include "model/model.h"
#include "optim/optim.h"
#include "train/report.h"
#include "train/setup.h"
#include "train/trainer.h"

/* Every how many of total steps `count` per epoch over `epochs` epochs fall: ceil(total / (count x epochs)). */
static int per_epoch_every(int total, int count, int epochs) {
    long long d = (long long)count * (epochs > 0 ? epochs : 1);
    return (int)(((long long)total + d - 1) / d);
}

/* Mean loss over every supervised token of the validation set, batched as training is (NAN when it cannot be read).
 * Several ranks share the micro-batches, k on rank k % size; each micro-batch's loss lands in its own slot of an
 * array the ranks sum, where every slot has one non-zero term, so the sum is exact and the mean, added in micro-batch
 * order, has the bits of one process's. */
static int evaluate(snug_run *r, snug_micro_batch mb, snug_comm *c, snug_pipe *pipe, double *val, snug_error *e) {
    snug_loader vl;
    snug_error le = {0};
    snug_batching_opts bo = snug_run_batching(r, 0);
    *val = NAN;
    if (snug_loader_init(&vl, &r->s.val, &bo, &le))
        return 0;
    double *loss = NULL;
    size_t n = 0, cap = 0, ntok = 0;
    while (snug_loader_next(&vl, &mb) > 0) {
        if (n == cap) {
            double *g = realloc(loss, (cap = cap ? 2 * cap : 64) * sizeof *g);
            if (!g) {
                free(loss);
                snug_loader_free(&vl);
                return snug_fail(e, SNUG_ENOMEM, "out of host memory for the validation losses");
            }
            loss = g;
        }
        loss[n] = 0;
        if ((int)(n % (size_t)c->size) == c->rank) {
            snug_model_set_batch(&r->eng.model, mb.ids, mb.labels, mb.pos, mb.seg, mb.rows, mb.T);
            int rc = 0;
            if (!pipe)
                loss[n] = snug_model_step(&r->eng.model, 0.0f);
            else if ((rc = snug_pipe_forward(pipe, &r->eng.model, &loss[n], e))) /* through the stages */
                free(loss);
            if (rc) {
                snug_loader_free(&vl);
                return rc;
            }
        } else { /* ZeRO-3: every rank joins the gathers of every micro-batch's forward */
            snug_model_skip_step(&r->eng.model, 0);
        }
        ntok += snug_count_supervised(mb.labels, (size_t)mb.rows * mb.T);
        n++;
    }
    snug_loader_free(&vl);
    int rc = c->size > 1 && n ? c->allreduce_sum(c, loss, n, SNUG_COMM_F64 | SNUG_COMM_HOST, e) : 0;
    if (!rc && pipe && n) /* the last stage's losses */
        rc = pipe->c->allreduce_sum(pipe->c, loss, n, SNUG_COMM_F64 | SNUG_COMM_HOST, e);
    double sum = 0;
    for (size_t i = 0; !rc && i < n; i++)
        sum += loss[i];
    free(loss);
    if (!rc && ntok)
        *val = sum / (double)ntok;
    return rc;
}

static volatile sig_atomic_t stop_requested; /* set by a signal (snug_train_request_stop) */

void snug_train_request_stop(void) { stop_requested = 1; }

/* The next step's micro-batches into mb: GA of them, or what is left of the epoch (as Hugging Face's Trainer); the
 * data position in st moves on. Returns how many; *epoch_end says whether the step finished an epoch. */
static int gather(snug_loader *l, snug_train_state *st, snug_micro_batch *mb, int GA, int *epoch_end) {
    int nmb = st->per_epoch && st->per_epoch - st->in_epoch < (size_t)GA ? (int)(st->per_epoch - st->in_epoch) : GA;
    for (int k = 0; k < nmb; k++)
        if (snug_loader_next(l, &mb[k]) == 0) { /* the end of an epoch: the next one starts, planned anew */
            st->per_epoch = snug_loader_batches_per_epoch(l); /* packing may give it a row more or less */
            snug_loader_next(l, &mb[k]);
        }
    st->in_epoch += (size_t)nmb;
    *epoch_end = st->per_epoch && st->in_epoch >= st->per_epoch;
    if (*epoch_end)
        st->in_epoch = 0, st->epochs_done++;
    return nmb;
}

/* What one step computes that its later phases read. */
typedef struct step_vals {
    double loss, lr, norm, val; /* the step's loss, learning rate, gradient norm, validation loss (NAN: none) */
    int epoch_end;              /* the step finished an epoch */
    int watched, stopped_early; /* the watchdog or early stopping ends the run at this step */
    int save_now;               /* a checkpoint of this step is due */
} step_vals;

snug_step_status snug_loop_open(snug_loop *l, snug_run *r, snug_error *e) {
    memset(l, 0, sizeof *l);
    l->r = r;
    const snug_run_config *o = &r->s.c; /* as it runs: after auto_fit */
    FILE *out = r->out;
    snug_comm *dp = r->dp;
    int lead = r->lead, rc = 0;
    l->ckw = (snug_checkpointer){.comm = r->comm.size > 1 ? &r->comm : NULL};

    /* GA is each rank's accumulation; a step takes W x GA micro-batches of the data's order, rank r the r-th GA of
     * them, so W ranks step as one process accumulating W x GA micro-batches does */
    l->W = dp->size;
    l->GA = o->gradient_accumulation_steps * l->W;
    l->GAr = o->gradient_accumulation_steps;
    int B = o->micro_batch_size, T = o->sequence_len;
    l->per_epoch = snug_loader_batches_per_epoch(&r->loader);
    /* an epoch is ceil(per_epoch / GA) steps, its last step accumulating only the micro-batches left in it (as
     * Hugging Face's Trainer does), so num_epochs never runs into an extra epoch */
    l->total = o->max_steps > 0 ? o->max_steps : (int)((l->per_epoch + l->GA - 1) / l->GA) * o->num_epochs;
    if (l->total < 1)
        l->total = 1;
    l->warmup = snug_warmup_steps(o, l->total);
    /* Axolotl's per-epoch counts: a fraction 1 / (count x num_epochs) of the run's steps, rounded up (as Hugging
     * Face's Trainer rounds a fractional eval_steps or save_steps) */
    l->eval_every = o->evals_per_epoch ? per_epoch_every(l->total, o->evals_per_epoch, o->num_epochs) : o->eval_steps;
    l->save_every = o->saves_per_epoch ? per_epoch_every(l->total, o->saves_per_epoch, o->num_epochs) : o->save_steps;
    l->load_best = snug_load_best(o);
    l->save_epoch = o->save_strategy == 2; /* Hugging Face's strategies */
    l->eval_off = o->eval_strategy == 0;
    l->sched = o->lr_scheduler;
    r->eng.opt.beta1 = o->adam_beta1;
    r->eng.opt.beta2 = o->adam_beta2;
    r->eng.opt.eps = o->adam_epsilon;
    /* LoRA+: PEFT's create_loraplus_optimizer gives every group its loraplus_weight_decay, 0 unless passed (Axolotl
     * does not): the adapters take no weight decay */
    r->eng.opt.weight_decay = o->loraplus_lr_ratio > 0 ? 0.0 : o->weight_decay;
    snug_report_header(r, out, l->total, l->per_epoch);
    if (o->loraplus_lr_ratio > 0)
        fprintf(out, "  LoRA+                lora_B%s at %g x the learning rate; no weight decay (PEFT's LoRA+ "
                "optimizer)\n", o->lora_dora ? " and the magnitudes" : "", o->loraplus_lr_ratio);
    rc = snug_parallel_open(&l->par, r, out, e);

    size_t BT = (size_t)B * T;
    l->ids = malloc((size_t)l->GA * BT * sizeof *l->ids);
    l->labels = malloc((size_t)l->GA * BT * sizeof *l->labels);
    l->pos = malloc((size_t)l->GA * BT * sizeof *l->pos);
    l->seg = malloc((size_t)l->GA * BT * sizeof *l->seg);
    l->mb = malloc((size_t)l->GA * sizeof *l->mb); /* the step's micro-batches, each (B, T) at most */
    l->seeds = malloc((size_t)l->GA * sizeof *l->seeds);   /* and their dropout seeds */
    if (!l->ids || !l->labels || !l->pos || !l->seg || !l->mb || !l->seeds)
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the batch buffers");
    for (int k = 0; !rc && k < l->GA; k++)
        l->mb[k] = (snug_micro_batch){.ids = l->ids + k * BT, .labels = l->labels + k * BT, .pos = l->pos + k * BT,
                                   .seg = l->seg + k * BT};
    l->tb = (snug_tboard){0}; /* report_to: tensorboard (a resumed run starts another event file),
                          * first: a logging_dir that cannot be made leaves output_dir as it was */
    if (!rc && lead && o->use_tensorboard) {
        char dir[4096];
        if (o->logging_dir[0])
            snprintf(dir, sizeof dir, "%s", o->logging_dir);
        else
            snug_path_join(dir, sizeof dir, o->output_dir, "runs");
        rc = snug_tboard_open(&l->tb, dir, e);
    }
    char metrics_path[4096];
    if (!rc && lead) {
        rc = snug_mkdirs(o->output_dir, e);
        snug_path_join(metrics_path, sizeof metrics_path, o->output_dir, "metrics.jsonl");
        if (!rc && r->resume[0])
            rc = (l->metrics = snug_reopen_metrics(metrics_path, r->saved.step, e)) ? 0 : SNUG_EIO;
        else if (!rc && !(l->metrics = fopen(metrics_path, "w")))
            rc = snug_fail(e, SNUG_EIO, "%s: cannot write the metrics log; check output_dir", metrics_path);
    }
    rc = snug_ddp_agree(&r->comm, rc, &r->broken, e);
    l->tty = isatty(fileno(out)) && !o->no_progress_bar;
    l->t0 = snug_now_s();
    l->tlog = l->t0;
    l->tokens_since = 0;
    l->st.per_epoch = l->per_epoch;
    snug_loss_scaler_init(&l->st.ls, r->eng.model.lv.dt == SNUG_DT_F16);
    if (!rc && r->resume[0]) { /* the data position: the loader hands out again what the checkpointed steps consumed */
        int end;
        while (l->st.step < r->saved.step) {
            gather(&r->loader, &l->st, l->mb, l->GA, &end);
            l->st.step++;
        }
        if (l->st.epochs_done != r->saved.epochs_done || l->st.in_epoch != r->saved.in_epoch ||
            l->st.per_epoch != r->saved.per_epoch)
            rc = snug_fail(e, SNUG_EINPUT, "%s: the data does not replay to the checkpoint's position (epoch %d, "
                           "micro-batch %zu of %zu; replayed: epoch %d, %zu of %zu); resume with the same datasets",
                           r->resume, r->saved.epochs_done, r->saved.in_epoch, r->saved.per_epoch, l->st.epochs_done,
                           l->st.in_epoch, l->st.per_epoch);
        l->st = r->saved;
        r->eng.opt.step = l->st.opt_step;
        if (!rc)
            fprintf(out, "resumed from %s at step %d of %d (state read and data replayed in %.2f s)\n", r->resume,
                    l->st.step, l->total, snug_now_s() - r->t_load);
    }
    if (!r->resume[0]) /* (a checkpoint holds its own) */
        snug_plateau_init(&l->st.plateau, o->learning_rate, &o->sched);
    l->ls = l->st.ls;
    l->loss_mean = l->st.loss_mean;
    r->eng.model.neftune_alpha = (float)o->neftune_noise_alpha;
    l->rc = rc;
    return rc ? SNUG_STEP_FAILED : l->st.step < l->total ? SNUG_STEP_NEXT : SNUG_STEP_DONE;
}

/* The step's arithmetic: its micro-batches gathered, forward and backward, the sums over the ranks, the loss
 * checked, the gradient norm, the clip and the optimizer step. */
static int step_compute(snug_loop *l, int step, step_vals *v, snug_error *e) {
    snug_run *r = l->r;
    const snug_run_config *o = &r->s.c;
    FILE *out = r->out;
    snug_comm *dp = r->dp;
    int rc = 0;
    /* gather the step's micro-batches first: the loss is normalised by all their supervised tokens */
    int nmb = gather(&r->loader, &l->st, l->mb, l->GA, &v->epoch_end);
    /* every rank holds the whole global batch's labels, so each counts the same supervised tokens */
    size_t nsup = 0;
    for (int k = 0; k < nmb; k++) {
        nsup += snug_count_supervised(l->mb[k].labels, (size_t)l->mb[k].rows * l->mb[k].T);
        l->tokens_since += l->mb[k].tokens; /* example tokens of every rank: padding is not counted */
    }
    int k0 = dp->rank * l->GAr < nmb ? dp->rank * l->GAr : nmb, k1 = k0 + l->GAr < nmb ? k0 + l->GAr : nmb;
    float scale = nsup ? 1.0f / (float)nsup : 0.0f;
    v->lr = l->sched == SNUG_SCHED_PLATEAU ? l->st.plateau.lr /* what the evaluations so far made of it */
                : snug_lr_at(l->sched, o->learning_rate, step, l->warmup, l->total, o->cosine_min_lr_ratio, &o->sched);
    if (o->optimizer_in_backward) /* the step happens inside backward, layer by layer */
        snug_parallel_step_in_backward_begin(&l->par, v->lr);
    else
        snug_zero_grads(&r->eng.model);
    double loss_sum = 0;
    /* LoRA dropout's masks: a function of the seed, the step and the micro-batch (the same on resume) */
    for (int k = k0; k < k1; k++) {
        uint64_t ds = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step * 0x100000001B3ull + (uint64_t)k;
        l->seeds[k - k0] = snug_splitmix64(&ds);
    }
    if ((rc = snug_parallel_backward(&l->par, l->mb, l->seeds, k0, k1, scale * l->ls.scale, &loss_sum, e)))
        return rc;
    snug_parallel_skip(&l->par, k0, k1, nmb);
    if ((rc = snug_parallel_reduce(&l->par, &loss_sum, e)))
        return rc;
    v->loss = nsup ? loss_sum / (double)nsup : 0;
    /* a loss that is no number: what a step would write (and the model saved at the end) would be NaN; stop
     * with the checkpoints as they are (fp16's loss scaler handles overflow itself). Every rank has the sum. */
    if (!isfinite(v->loss) && r->eng.model.lv.dt != SNUG_DT_F16) {
        rc = snug_fail(e, SNUG_EINPUT, "step %d: the loss is %g: training diverged (or the model's numbers "
                       "overflow); lower learning_rate (%g), set max_grad_norm, or check the base model's "
                       "config.json; nothing was saved after the last checkpoint", step + 1, v->loss,
                       o->learning_rate);
        return rc;
    }
    if ((rc = snug_parallel_grad_norm(&l->par, l->ls.scale, &v->norm, e)))
        return rc;
    if (!o->optimizer_in_backward) {
        float clip = 1.0f;
        if (o->max_grad_norm > 0 && v->norm > o->max_grad_norm)
            clip = (float)(o->max_grad_norm / (v->norm + 1e-6));
        float used = l->ls.scale;
        if (snug_loss_scaler_update(&l->ls, v->norm))
            snug_adamw_step_model(&r->eng.opt, &r->eng.model, v->lr, clip / used);
        else /* fp16 overflow: the step is skipped */
            fprintf(out, "step %d: fp16 gradients overflowed at loss scale %.0f; step skipped, scale now %.0f (%d "
                    "skipped so far)\n", step + 1, used, l->ls.scale, l->ls.skipped);
        if ((rc = snug_parallel_after_step(&l->par, e)))
            return rc;
    }
    l->loss_mean = step ? 0.9 * l->loss_mean + 0.1 * v->loss : v->loss;
    if ((rc = snug_backend_check(r->eng.be, e))) /* a device op that failed during the step (CUDA) */
        return rc;

    return rc;
}

/* After the optimizer step: the watchdog, whether a checkpoint is due, evaluation, early stopping, the plateau
 * schedule, the best checkpoint. */
static int step_evaluate(snug_loop *l, int step, step_vals *v, snug_error *e) {
    snug_run *r = l->r;
    const snug_run_config *o = &r->s.c;
    int rc = 0;
    /* the loss watchdog: the run ends here, as at its last step (every rank has the same loss) */
    l->st.watch_over =
        o->loss_watchdog_threshold > 0 && v->loss > o->loss_watchdog_threshold ? l->st.watch_over + 1 : 0;
    v->watched = o->loss_watchdog_threshold > 0 && l->st.watch_over >= o->loss_watchdog_patience && step + 1 < l->total;
    if (v->watched)
        l->total = step + 1;
    /* a checkpoint of this step (if it is not the last): every save_every steps, at an epoch's end (save_strategy:
     * epoch), after the first step (save_first_step) */
    v->save_now = (l->save_every > 0 && (step + 1) % l->save_every == 0) || (l->save_epoch && v->epoch_end) ||
                   (o->save_first_step && step == 0);
    v->val = NAN;
    if (r->s.val.nexamples && !l->eval_off && ((l->eval_every > 0 && (step + 1) % l->eval_every == 0) ||
                              (l->eval_every == 0 && v->epoch_end) || step + 1 == l->total) &&
        ((rc = evaluate(r, l->mb[0], r->dp, r->ppn > 1 ? &l->par.pipe : NULL, &v->val, e)) ||
         (rc = snug_parallel_hook_error(&l->par, e)))) {
        r->broken = 1;
        return rc;
    }
    /* early stopping: the evaluations in a row without a validation loss lower than the best before it (by more
     * than the threshold, as Hugging Face's EarlyStoppingCallback) end the run here, as at its last step */
    v->stopped_early = 0;
    if (!isnan(v->val) && o->early_stopping_patience > 0) {
        int lower = !l->st.es_step || (v->val < l->st.es_best && l->st.es_best - v->val > o->early_stopping_threshold);
        l->st.es_count = lower ? 0 : l->st.es_count + 1;
        v->stopped_early = l->st.es_count >= o->early_stopping_patience && step + 1 < l->total;
        if (v->stopped_early)
            l->total = step + 1;
    }
    if (!isnan(v->val) && (!l->st.es_step || v->val < l->st.es_best))
        l->st.es_best = v->val, l->st.es_step = step + 1;
    if (!isnan(v->val) && l->sched == SNUG_SCHED_PLATEAU) /* the next steps' learning rate (transformers steps it with
                                                      * the evaluation's metric, eval_loss) */
        snug_plateau_step(&l->st.plateau, v->val, &o->sched);
    /* load_best_model_at_end: the lowest validation loss among the steps that keep a checkpoint (and the last) */
    if (!isnan(v->val) && l->load_best && (!l->st.best_step || v->val < l->st.best_val) &&
        (v->save_now || step + 1 == l->total))
        l->st.best_val = v->val, l->st.best_step = step + 1;
    return rc;
}

/* The step's line in metrics.jsonl, TensorBoard and the terminal, when one is due. */
static int step_log(snug_loop *l, int step, const step_vals *v, snug_error *e) {
    snug_run *r = l->r;
    const snug_run_config *o = &r->s.c;
    FILE *out = r->out;
    int rc = 0;
    int log_now = (step + 1) % (o->logging_steps > 0 ? o->logging_steps : 1) == 0 || step + 1 == l->total ||
                  !isnan(v->val);
    if (log_now && l->metrics) {
        double t = snug_now_s(), tps = l->tokens_since / (t - l->tlog > 1e-9 ? t - l->tlog : 1e-9);
        double rss = snug_peak_rss_bytes();
        double epoch = l->st.epochs_done + (l->st.per_epoch ? (double)l->st.in_epoch / (double)l->st.per_epoch : 0.0);
        fprintf(l->metrics, "{\"step\": %d, \"epoch\": %.4f, \"loss\": %.9g, \"lr\": %.6e, \"grad_norm\": %.6f, "
                "\"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"peak_rss_bytes\": %.0f",
                step + 1, epoch, v->loss, v->lr, v->norm, tps, t - l->t0, rss);
        if (l->ls.on)
            fprintf(l->metrics, ", \"loss_scale\": %.0f, \"skipped_steps\": %d", l->ls.scale, l->ls.skipped);
        if (!isnan(v->val))
            fprintf(l->metrics, ", \"val_loss\": %.9g", v->val);
        fprintf(l->metrics, "}\n");
        fflush(l->metrics);
        /* TensorBoard: Hugging Face's TensorBoardCallback's tags */
        static const char *const tags[] = {"train/loss", "train/learning_rate", "train/grad_norm", "train/epoch",
                                           "eval/loss"};
        double vals[] = {v->loss, v->lr, v->norm, epoch, v->val};
        if (!rc && (rc = snug_tboard_scalars(&l->tb, step + 1, tags, vals, isnan(v->val) ? 4 : 5, e))) {
            r->broken = r->comm.size > 1;
            return rc;
        }
        if (l->tty) {
            snug_progress_bar(out, step + 1, l->total, v->loss, l->loss_mean, v->lr, v->norm, tps, rss, t - l->t0);
            if (!isnan(v->val))
                fprintf(out, "\n  step %d: validation loss %.4f\n", step + 1, v->val);
        } else {
            fprintf(out, "step %5d/%d  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s  rss %.0f MiB%s", step + 1,
                    l->total, v->loss, v->lr, v->norm, tps, rss / 1048576.0, isnan(v->val) ? "\n" : "");
            if (!isnan(v->val))
                fprintf(out, "  val_loss %.4f\n", v->val);
        }
        l->tlog = t;
        l->tokens_since = 0;
    }
    return rc;
}

/* The step's end: the state it leaves, a stop asked by a signal (agreed by the ranks), the checkpoint written in
 * the background finished, the checkpoint of this step started. */
static int step_checkpoint(snug_loop *l, int step, const step_vals *v, snug_error *e) {
    snug_run *r = l->r;
    const snug_run_config *o = &r->s.c;
    FILE *out = r->out;
    int lead = r->lead, rc = 0;
    l->st.step = step + 1;
    l->st.opt_step = r->eng.opt.step;
    l->st.ls = l->ls;
    l->st.loss_mean = l->loss_mean;
    int stop = stop_requested && step + 1 < l->total;
    if (snug_ddp_collectives(&r->comm)) { /* a signal may reach the ranks at different steps: they stop together */
        int64_t any = stop;
        if ((rc = r->comm.allreduce_sum(&r->comm, &any, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, e))) {
            r->broken = 1;
            return rc;
        }
        stop = any > 0;
    }
    if (!rc) { /* a checkpoint written in the background that has just become complete */
        rc = snug_checkpoint_finish(&l->ckw, 0, e);
        if (!rc && l->ckw.finished && !l->tty)
            fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", l->ckw.dir,
                    l->ckw.write_s, l->ck_wait, l->ckw.write_cpu_s);
    }
    /* every rank holds the same state under data parallel: rank 0 saves it; under ZeRO each rank also its
     * shard */
    int writer = lead || snug_checkpoint_per_rank(&r->eng);
    if (!rc && !writer && stop) { /* another DDP rank: rank 0 writes the checkpoint and says so */
        l->stopped = 1;
        return rc;
    }
    if (v->stopped_early) {
        if (l->tty)
            fputc('\n', out);
        fprintf(out, "step %d: no validation loss lower than %.6g (step %d) in %d evaluation%s "
                "(early_stopping_patience): training ends here%s\n", step + 1, l->st.es_best, l->st.es_step,
                l->st.es_count, l->st.es_count == 1 ? "" : "s",
                l->load_best ? "" : " and the model is saved as at the end");
    }
    if (v->watched) {
        if (l->tty)
            fputc('\n', out);
        fprintf(out, "step %d: the loss has been above loss_watchdog_threshold %g for %d step%s in a row: training "
                "ends here and the model is saved as at the end\n", step + 1, o->loss_watchdog_threshold,
                l->st.watch_over, l->st.watch_over == 1 ? "" : "s");
    }
    if (!rc && writer && ((v->save_now && step + 1 < l->total) || stop)) {
        char ck[4096];
        snprintf(ck, sizeof ck, "%s/checkpoint-%d", o->output_dir, step + 1);
        double tc = snug_now_s();
        rc = snug_checkpoint_finish(&l->ckw, 1, e); /* one still being written: training waits for it */
        if (!rc && l->ckw.finished && !l->tty)
            fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", l->ckw.dir,
                    l->ckw.write_s, l->ck_wait + snug_now_s() - tc, l->ckw.write_cpu_s);
        tc = snug_now_s();
        if (!rc)
            rc = snug_checkpoint_start(&l->ckw, ck, o->save_total_limit, &l->st, &r->s, &r->eng, e);
        if (!rc && stop) /* the run ends here: the checkpoint must be whole first */
            rc = snug_checkpoint_finish(&l->ckw, 1, e);
        l->ck_wait = snug_now_s() - tc;
        if (!rc && l->ckw.finished && !l->tty)
            fprintf(out, "saved %s in %.2f s (%.2f s of CPU)\n", ck, l->ckw.write_s, l->ckw.write_cpu_s);
        l->tlog += snug_now_s() - tc; /* the save is not counted in the next logged tokens/s */
        if (!rc && stop) {
            if (l->tty)
                fputc('\n', out);
            if (o->save_only_model)
                fprintf(out, "stopped by a signal after step %d of %d; saved %s, the model alone (save_only_model: "
                        "true), which a run cannot resume from\n", step + 1, l->total, ck);
            else
                fprintf(out, "stopped by a signal after step %d of %d; saved %s; continue with the same command "
                        "and --resume_from_checkpoint latest\n", step + 1, l->total, ck);
            l->stopped = 1;
            return rc;
        }
    }
    return rc;
}

snug_step_status snug_loop_step(snug_loop *l, snug_error *e) {
    int step = l->st.step;
    step_vals v = {0};
    int rc = step_compute(l, step, &v, e);
    if (!rc)
        rc = step_evaluate(l, step, &v, e);
    if (!rc)
        rc = step_log(l, step, &v, e);
    if (!rc)
        rc = step_checkpoint(l, step, &v, e);
    l->rc = rc;
    return rc                       ? SNUG_STEP_FAILED
           : l->stopped             ? SNUG_STEP_STOPPED
           : l->st.step < l->total  ? SNUG_STEP_NEXT
                                    : SNUG_STEP_DONE;
}

int snug_loop_end(snug_loop *l, snug_error *e) {
    snug_run *r = l->r;
    FILE *out = r->out;
    int rc = l->rc;
    /* a failure inside the loop is this rank's alone while the others wait in the step's collectives: this rank
     * ends without MPI_Finalize, and mpirun ends the others */
    if (rc && r->comm.size > 1)
        r->broken = 1;
    { /* the last checkpoint is complete before the run ends, however it ends (under ZeRO only when the ranks still
       * agree: a folder they could not complete together stays .partial) */
        snug_error fe = {0};
        if (r->broken)
            l->ckw.comm = NULL;
        int frc = snug_checkpoint_finish(&l->ckw, 1, &fe);
        if (!rc && frc) {
            rc = frc;
            if (e)
                *e = fe;
        }
        if (!frc && l->ckw.finished && !l->tty)
            fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", l->ckw.dir,
                    l->ckw.write_s, l->ck_wait, l->ckw.write_cpu_s);
    }
    if (l->tty)
        fputc('\n', out);
    if (l->metrics)
        fclose(l->metrics);
    snug_tboard_close(&l->tb);
    l->rc = rc;
    return rc;
}

void snug_loop_free(snug_loop *l) {
    free(l->ids);
    free(l->labels);
    free(l->pos);
    free(l->seg);
    free(l->mb);
    free(l->seeds);
    snug_parallel_free(&l->par);
}
