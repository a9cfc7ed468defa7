/* trainer.c: one training run end to end (see trainer.h). */
#include "train/trainer.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/backend_select.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "data/batching.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/generate.h"
#include "model/model.h"
#include "optim/optim.h"
#include "plan/autofit.h"
#include "plan/gpus.h"
#include "plan/plan.h"
#include "plan/plan_json.h"
#include "train/engine.h"
#include "train/loss_scale.h"
#include "train/merge.h"
#include "train/pipeline.h"
#include "train/parallel.h"
#include "train/rank_hooks.h"
#include "train/report.h"
#include "train/run.h"
#include "train/sample.h"
#include "train/save.h"
#include "train/setup.h"
#include "train/state.h"
#include "train/tboard.h"

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

static volatile sig_atomic_t stop_requested;

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

int snug_train(const snug_run_config *config, FILE *out, snug_error *e) {
    snug_run r;
    SNUG_TRY(snug_run_open(&r, config, out, e));
    out = r.out;
    snug_comm *dp = r.dp, *tp = r.tp;
    int lead = r.lead, rc = 0;
    const snug_run_config *o = &r.s.c; /* as it runs: after auto_fit */
    snug_train_state st = {0};
    snug_checkpointer ckw = {.comm = r.comm.size > 1 ? &r.comm : NULL};
    double ck_wait = 0;

    /* GA is each rank's accumulation; a step takes W x GA micro-batches of the data's order, rank r the r-th GA of
     * them, so W ranks step as one process accumulating W x GA micro-batches does */
    int W = dp->size, GA = o->gradient_accumulation_steps * W, GAr = o->gradient_accumulation_steps;
    int B = o->micro_batch_size, T = o->sequence_len;
    size_t per_epoch = snug_loader_batches_per_epoch(&r.loader);
    /* an epoch is ceil(per_epoch / GA) steps, its last step accumulating only the micro-batches left in it (as
     * Hugging Face's Trainer does), so num_epochs never runs into an extra epoch */
    int total = o->max_steps > 0 ? o->max_steps : (int)((per_epoch + GA - 1) / GA) * o->num_epochs;
    if (total < 1)
        total = 1;
    int warmup = snug_warmup_steps(o, total);
    /* Axolotl's per-epoch counts: a fraction 1 / (count x num_epochs) of the run's steps, rounded up (as Hugging
     * Face's Trainer rounds a fractional eval_steps or save_steps) */
    int eval_every = o->evals_per_epoch ? per_epoch_every(total, o->evals_per_epoch, o->num_epochs) : o->eval_steps;
    int save_every = o->saves_per_epoch ? per_epoch_every(total, o->saves_per_epoch, o->num_epochs) : o->save_steps;
    int load_best = snug_load_best(o);
    int save_epoch = o->save_strategy == 2, eval_off = o->eval_strategy == 0; /* Hugging Face's strategies */
    snug_sched sched = o->lr_scheduler;
    r.eng.opt.beta1 = o->adam_beta1;
    r.eng.opt.beta2 = o->adam_beta2;
    r.eng.opt.eps = o->adam_epsilon;
    /* LoRA+: PEFT's create_loraplus_optimizer gives every group its loraplus_weight_decay, 0 unless passed (Axolotl
     * does not): the adapters take no weight decay */
    r.eng.opt.weight_decay = o->loraplus_lr_ratio > 0 ? 0.0 : o->weight_decay;
    snug_report_header(&r, out, total, per_epoch);
    if (o->loraplus_lr_ratio > 0)
        fprintf(out, "  LoRA+                lora_B%s at %g x the learning rate; no weight decay (PEFT's LoRA+ "
                "optimizer)\n", o->lora_dora ? " and the magnitudes" : "", o->loraplus_lr_ratio);
    snug_parallel par;
    rc = snug_parallel_open(&par, &r, out, e);

    size_t BT = (size_t)B * T;
    int32_t *ids = malloc((size_t)GA * BT * sizeof *ids), *labels = malloc((size_t)GA * BT * sizeof *labels);
    int32_t *pos = malloc((size_t)GA * BT * sizeof *pos), *seg = malloc((size_t)GA * BT * sizeof *seg);
    snug_micro_batch *mb = malloc((size_t)GA * sizeof *mb); /* the step's micro-batches, each (B, T) at most */
    uint64_t *seeds = malloc((size_t)GA * sizeof *seeds);   /* and their dropout seeds */
    if (!ids || !labels || !pos || !seg || !mb || !seeds)
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the batch buffers");
    for (int k = 0; !rc && k < GA; k++)
        mb[k] = (snug_micro_batch){.ids = ids + k * BT, .labels = labels + k * BT, .pos = pos + k * BT,
                                   .seg = seg + k * BT};
    snug_tboard tb = {0}; /* report_to: tensorboard (a resumed run starts another event file),
                          * first: a logging_dir that cannot be made leaves output_dir as it was */
    if (!rc && lead && o->use_tensorboard) {
        char dir[4096];
        if (o->logging_dir[0])
            snprintf(dir, sizeof dir, "%s", o->logging_dir);
        else
            snug_path_join(dir, sizeof dir, o->output_dir, "runs");
        rc = snug_tboard_open(&tb, dir, e);
    }
    char metrics_path[4096];
    FILE *metrics = NULL;
    if (!rc && lead) {
        rc = snug_mkdirs(o->output_dir, e);
        snug_path_join(metrics_path, sizeof metrics_path, o->output_dir, "metrics.jsonl");
        if (!rc && r.resume[0])
            rc = (metrics = snug_reopen_metrics(metrics_path, r.saved.step, e)) ? 0 : SNUG_EIO;
        else if (!rc && !(metrics = fopen(metrics_path, "w")))
            rc = snug_fail(e, SNUG_EIO, "%s: cannot write the metrics log; check output_dir", metrics_path);
    }
    rc = snug_ddp_agree(&r.comm, rc, &r.broken, e);
    int tty = isatty(fileno(out)) && !o->no_progress_bar;
    double t0 = snug_now_s(), tlog = t0;
    size_t tokens_since = 0;
    /* (ZeRO-3 steps through the reduce-scatter hook, z2.step below) */
    st.per_epoch = per_epoch;
    snug_loss_scaler_init(&st.ls, r.eng.model.lv.dt == SNUG_DT_F16);
    if (!rc && r.resume[0]) { /* the data position: the loader hands out again what the checkpointed steps consumed */
        int end;
        while (st.step < r.saved.step) {
            gather(&r.loader, &st, mb, GA, &end);
            st.step++;
        }
        if (st.epochs_done != r.saved.epochs_done || st.in_epoch != r.saved.in_epoch || st.per_epoch != r.saved.per_epoch)
            rc = snug_fail(e, SNUG_EINPUT, "%s: the data does not replay to the checkpoint's position (epoch %d, "
                           "micro-batch %zu of %zu; replayed: epoch %d, %zu of %zu); resume with the same datasets",
                           r.resume, r.saved.epochs_done, r.saved.in_epoch, r.saved.per_epoch, st.epochs_done, st.in_epoch,
                           st.per_epoch);
        st = r.saved;
        r.eng.opt.step = st.opt_step;
        if (!rc)
            fprintf(out, "resumed from %s at step %d of %d (state read and data replayed in %.2f s)\n", r.resume,
                    st.step, total, snug_now_s() - r.t_load);
    }
    if (!r.resume[0]) /* (a checkpoint holds its own) */
        snug_plateau_init(&st.plateau, o->learning_rate, &o->sched);
    snug_loss_scaler ls = st.ls;
    double loss_mean = st.loss_mean;
    int stopped = 0;
    r.eng.model.neftune_alpha = (float)o->neftune_noise_alpha;
    for (int step = st.step; step < total && !rc; step++) {
        /* gather the step's micro-batches first: the loss is normalised by all their supervised tokens */
        int epoch_end;
        int nmb = gather(&r.loader, &st, mb, GA, &epoch_end);
        /* every rank holds the whole global batch's labels, so each counts the same supervised tokens */
        size_t nsup = 0;
        for (int k = 0; k < nmb; k++) {
            nsup += snug_count_supervised(mb[k].labels, (size_t)mb[k].rows * mb[k].T);
            tokens_since += mb[k].tokens; /* example tokens of every rank: padding is not counted */
        }
        int k0 = dp->rank * GAr < nmb ? dp->rank * GAr : nmb, k1 = k0 + GAr < nmb ? k0 + GAr : nmb;
        float scale = nsup ? 1.0f / (float)nsup : 0.0f;
        double lr = sched == SNUG_SCHED_PLATEAU ? st.plateau.lr /* what the evaluations so far made of it */
                    : snug_lr_at(sched, o->learning_rate, step, warmup, total, o->cosine_min_lr_ratio, &o->sched);
        if (o->optimizer_in_backward) { /* the step happens inside backward, layer by layer */
            r.eng.opt.step++;
            par.in_bwd.lr = lr;
        } else {
            snug_zero_grads(&r.eng.model);
        }
        double loss_sum = 0;
        /* LoRA dropout's masks: a function of the seed, the step and the micro-batch (the same on resume) */
        for (int k = k0; k < k1; k++) {
            uint64_t ds = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step * 0x100000001B3ull + (uint64_t)k;
            seeds[k - k0] = snug_splitmix64(&ds);
        }
        if ((rc = snug_parallel_backward(&par, mb, seeds, k0, k1, scale * ls.scale, &loss_sum, e)))
            break;
        snug_parallel_skip(&par, k0, k1, nmb);
        if ((rc = snug_parallel_reduce(&par, &loss_sum, e)))
            break;
        double loss = nsup ? loss_sum / (double)nsup : 0;
        /* a loss that is no number: what a step would write (and the model saved at the end) would be NaN; stop
         * with the checkpoints as they are (fp16's loss scaler handles overflow itself). Every rank has the sum. */
        if (!isfinite(loss) && r.eng.model.lv.dt != SNUG_DT_F16) {
            rc = snug_fail(e, SNUG_EINPUT, "step %d: the loss is %g: training diverged (or the model's numbers "
                           "overflow); lower learning_rate (%g), set max_grad_norm, or check the base model's "
                           "config.json; nothing was saved after the last checkpoint", step + 1, loss,
                           o->learning_rate);
            break;
        }
        double norm;
        if ((rc = snug_parallel_grad_norm(&par, ls.scale, &norm, e)))
            break;
        if (!o->optimizer_in_backward) {
            float clip = 1.0f;
            if (o->max_grad_norm > 0 && norm > o->max_grad_norm)
                clip = (float)(o->max_grad_norm / (norm + 1e-6));
            float used = ls.scale;
            if (snug_loss_scaler_update(&ls, norm))
                snug_adamw_step_model(&r.eng.opt, &r.eng.model, lr, clip / used);
            else /* fp16 overflow: the step is skipped */
                fprintf(out, "step %d: fp16 gradients overflowed at loss scale %.0f; step skipped, scale now %.0f (%d "
                        "skipped so far)\n", step + 1, used, ls.scale, ls.skipped);
            if ((rc = snug_parallel_after_step(&par, e)))
                break;
        }
        loss_mean = step ? 0.9 * loss_mean + 0.1 * loss : loss;
        if ((rc = snug_backend_check(r.eng.be, e))) /* a device op that failed during the step (CUDA) */
            break;

        /* the loss watchdog: the run ends here, as at its last step (every rank has the same loss) */
        st.watch_over = o->loss_watchdog_threshold > 0 && loss > o->loss_watchdog_threshold ? st.watch_over + 1 : 0;
        int watched = o->loss_watchdog_threshold > 0 && st.watch_over >= o->loss_watchdog_patience && step + 1 < total;
        if (watched)
            total = step + 1;
        /* a checkpoint of this step (if it is not the last): every save_every steps, at an epoch's end (save_strategy:
         * epoch), after the first step (save_first_step) */
        int save_now = (save_every > 0 && (step + 1) % save_every == 0) || (save_epoch && epoch_end) ||
                       (o->save_first_step && step == 0);
        double val = NAN;
        if (r.s.val.nexamples && !eval_off && ((eval_every > 0 && (step + 1) % eval_every == 0) ||
                                  (eval_every == 0 && epoch_end) || step + 1 == total) &&
            ((rc = evaluate(&r, mb[0], dp, r.ppn > 1 ? &par.pipe : NULL, &val, e)) || (rc = par.z3.rc) || (rc = par.tph.rc))) {
            if ((par.z3.rc || par.tph.rc) && e)
                *e = par.z3.rc ? par.z3.e : par.tph.e;
            r.broken = 1;
            break;
        }
        /* early stopping: the evaluations in a row without a validation loss lower than the best before it (by more
         * than the threshold, as Hugging Face's EarlyStoppingCallback) end the run here, as at its last step */
        int stopped_early = 0;
        if (!isnan(val) && o->early_stopping_patience > 0) {
            int lower = !st.es_step || (val < st.es_best && st.es_best - val > o->early_stopping_threshold);
            st.es_count = lower ? 0 : st.es_count + 1;
            stopped_early = st.es_count >= o->early_stopping_patience && step + 1 < total;
            if (stopped_early)
                total = step + 1;
        }
        if (!isnan(val) && (!st.es_step || val < st.es_best))
            st.es_best = val, st.es_step = step + 1;
        if (!isnan(val) && sched == SNUG_SCHED_PLATEAU) /* the next steps' learning rate (transformers steps it with
                                                          * the evaluation's metric, eval_loss) */
            snug_plateau_step(&st.plateau, val, &o->sched);
        /* load_best_model_at_end: the lowest validation loss among the steps that keep a checkpoint (and the last) */
        if (!isnan(val) && load_best && (!st.best_step || val < st.best_val) && (save_now || step + 1 == total))
            st.best_val = val, st.best_step = step + 1;
        int log_now = (step + 1) % (o->logging_steps > 0 ? o->logging_steps : 1) == 0 || step + 1 == total ||
                      !isnan(val);
        if (log_now && metrics) {
            double t = snug_now_s(), tps = tokens_since / (t - tlog > 1e-9 ? t - tlog : 1e-9);
            double rss = snug_peak_rss_bytes();
            double epoch = st.epochs_done + (st.per_epoch ? (double)st.in_epoch / (double)st.per_epoch : 0.0);
            fprintf(metrics, "{\"step\": %d, \"epoch\": %.4f, \"loss\": %.9g, \"lr\": %.6e, \"grad_norm\": %.6f, "
                    "\"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"peak_rss_bytes\": %.0f",
                    step + 1, epoch, loss, lr, norm, tps, t - t0, rss);
            if (ls.on)
                fprintf(metrics, ", \"loss_scale\": %.0f, \"skipped_steps\": %d", ls.scale, ls.skipped);
            if (!isnan(val))
                fprintf(metrics, ", \"val_loss\": %.9g", val);
            fprintf(metrics, "}\n");
            fflush(metrics);
            /* TensorBoard: Hugging Face's TensorBoardCallback's tags */
            static const char *const tags[] = {"train/loss", "train/learning_rate", "train/grad_norm", "train/epoch",
                                               "eval/loss"};
            double vals[] = {loss, lr, norm, epoch, val};
            if (!rc && (rc = snug_tboard_scalars(&tb, step + 1, tags, vals, isnan(val) ? 4 : 5, e))) {
                r.broken = r.comm.size > 1;
                break;
            }
            if (tty) {
                snug_progress_bar(out, step + 1, total, loss_mean, lr, norm, tps, rss, t - t0);
                if (!isnan(val))
                    fprintf(out, "\n  step %d: validation loss %.4f\n", step + 1, val);
            } else {
                fprintf(out, "step %5d/%d  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s  rss %.0f MiB%s", step + 1,
                        total, loss, lr, norm, tps, rss / 1048576.0, isnan(val) ? "\n" : "");
                if (!isnan(val))
                    fprintf(out, "  val_loss %.4f\n", val);
            }
            tlog = t;
            tokens_since = 0;
        }
        st.step = step + 1;
        st.opt_step = r.eng.opt.step;
        st.ls = ls;
        st.loss_mean = loss_mean;
        int stop = stop_requested && step + 1 < total;
        if (snug_ddp_collectives(&r.comm)) { /* a signal may reach the ranks at different steps: they stop together */
            int64_t any = stop;
            if ((rc = r.comm.allreduce_sum(&r.comm, &any, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, e))) {
                r.broken = 1;
                break;
            }
            stop = any > 0;
        }
        if (!rc) { /* a checkpoint written in the background that has just become complete */
            rc = snug_checkpoint_finish(&ckw, 0, e);
            if (!rc && ckw.finished && !tty)
                fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", ckw.dir,
                        ckw.write_s, ck_wait, ckw.write_cpu_s);
        }
        /* every rank holds the same state under data parallel: rank 0 saves it; under ZeRO each rank also its
         * shard */
        int writer = lead || snug_checkpoint_per_rank(&r.eng);
        if (!rc && !writer && stop) { /* another DDP rank: rank 0 writes the checkpoint and says so */
            stopped = 1;
            break;
        }
        if (stopped_early) {
            if (tty)
                fputc('\n', out);
            fprintf(out, "step %d: no validation loss lower than %.6g (step %d) in %d evaluation%s "
                    "(early_stopping_patience): training ends here%s\n", step + 1, st.es_best, st.es_step,
                    st.es_count, st.es_count == 1 ? "" : "s",
                    load_best ? "" : " and the model is saved as at the end");
        }
        if (watched) {
            if (tty)
                fputc('\n', out);
            fprintf(out, "step %d: the loss has been above loss_watchdog_threshold %g for %d step%s in a row: training "
                    "ends here and the model is saved as at the end\n", step + 1, o->loss_watchdog_threshold,
                    st.watch_over, st.watch_over == 1 ? "" : "s");
        }
        if (!rc && writer && ((save_now && step + 1 < total) || stop)) {
            char ck[4096];
            snprintf(ck, sizeof ck, "%s/checkpoint-%d", o->output_dir, step + 1);
            double tc = snug_now_s();
            rc = snug_checkpoint_finish(&ckw, 1, e); /* one still being written: training waits for it */
            if (!rc && ckw.finished && !tty)
                fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", ckw.dir,
                        ckw.write_s, ck_wait + snug_now_s() - tc, ckw.write_cpu_s);
            tc = snug_now_s();
            if (!rc)
                rc = snug_checkpoint_start(&ckw, ck, o->save_total_limit, &st, &r.s, &r.eng, e);
            if (!rc && stop) /* the run ends here: the checkpoint must be whole first */
                rc = snug_checkpoint_finish(&ckw, 1, e);
            ck_wait = snug_now_s() - tc;
            if (!rc && ckw.finished && !tty)
                fprintf(out, "saved %s in %.2f s (%.2f s of CPU)\n", ck, ckw.write_s, ckw.write_cpu_s);
            tlog += snug_now_s() - tc; /* the save is not counted in the next logged tokens/s */
            if (!rc && stop) {
                if (tty)
                    fputc('\n', out);
                if (o->save_only_model)
                    fprintf(out, "stopped by a signal after step %d of %d; saved %s, the model alone (save_only_model: "
                            "true), which a run cannot resume from\n", step + 1, total, ck);
                else
                    fprintf(out, "stopped by a signal after step %d of %d; saved %s; continue with the same command "
                            "and --resume_from_checkpoint latest\n", step + 1, total, ck);
                stopped = 1;
                break;
            }
        }
    }
    /* a failure inside the loop is this rank's alone while the others wait in the step's collectives: this rank
     * ends without MPI_Finalize, and mpirun ends the others */
    if (rc && r.comm.size > 1)
        r.broken = 1;
    { /* the last checkpoint is complete before the run ends, however it ends (under ZeRO only when the ranks still
       * agree: a folder they could not complete together stays .partial) */
        snug_error fe = {0};
        if (r.broken)
            ckw.comm = NULL;
        int frc = snug_checkpoint_finish(&ckw, 1, &fe);
        if (!rc && frc) {
            rc = frc;
            if (e)
                *e = fe;
        }
        if (!frc && ckw.finished && !tty)
            fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", ckw.dir,
                    ckw.write_s, ck_wait, ckw.write_cpu_s);
    }
    if (tty)
        fputc('\n', out);
    if (metrics)
        fclose(metrics);
    snug_tboard_close(&tb);
    if (!rc && !stopped && (r.eng.model.master_sharded || r.eng.model.param_sharded || r.gn > 1) &&
        !r.eng.model.lora.on) {
        /* ZeRO-3: training is over, so the gradients and the optimizer state go before the save's tensor-sized
         * buffers are touched, and the save never raises the peak (the arenas' high-water marks stay recorded) */
        for (int c = SNUG_MEM_GRADS; r.eng.model.param_sharded && c <= SNUG_MEM_OPTIM; c++)
            snug_engine_release(&r.eng, (snug_category)c);
        /* a failure on one rank mid-stream ends the save on every rank, each with its error */
        rc = snug_stream_save(&r, &r.comm, dp, r.gn > 1 ? tp : NULL, par.shard, &r.broken, e);
    } else if (!rc && !stopped && r.ppn > 1 && r.eng.model.lora.on) { /* every stage's adapters */
        rc = snug_pp_save_adapter(&r, &r.comm, tp, &r.broken, e);
    } else if (!rc && !stopped && lead) {
        rc = snug_save_hf_folder(o->output_dir, &r.s, &r.eng, e);
    }
    /* load_best_model_at_end: the weights saved are those of the checkpoint with the lowest validation loss */
    if (!rc && !stopped && lead && load_best && st.best_step && st.best_step != st.step) {
        char ck[4096];
        snprintf(ck, sizeof ck, "%s/checkpoint-%d", o->output_dir, st.best_step);
        rc = snug_checkpoint_take_weights(ck, o->output_dir, e);
        if (!rc)
            fprintf(out, "load_best_model_at_end: the model saved is checkpoint-%d's (validation loss %.6g, the "
                    "lowest), not step %d's\n", st.best_step, st.best_val, st.step);
    }
    if (!rc && !stopped && lead && o->merge_lora) {
        char merged[4096];
        snug_path_join(merged, sizeof merged, o->output_dir, "merged");
        double tm = snug_now_s();
        /* an adapter of a quantized base goes onto the base's round trip: the weights it was trained against */
        const snug_lora_cfg *q = r.eng.model.lv.lora.kind == SNUG_ADAPTER_QLORA ? &r.eng.model.lv.lora : NULL;
        rc = snug_merge_lora(o->base_model, o->output_dir, merged, q, o->threads, e);
        if (!rc)
            fprintf(out, "merged the adapter into %s%s%s%s: %s in %.1f s\n", o->base_model, q ? " (its " : "",
                    q ? snug_q4_width((snug_q4_type)q->q4_type) : "", q ? " round trip, as training saw it)" : "",
                    merged, snug_now_s() - tm);
    }
    if (!rc && !stopped && lead) {
        fprintf(out, "saved %s (%s) in %.1f s\n", o->output_dir,
                r.eng.model.lora.on ? "PEFT adapter" : "Hugging Face format", snug_now_s() - t0);
        if (ls.on)
            fprintf(out, "fp16 loss scaling: %d of %d steps skipped for overflow; final scale %.0f\n", ls.skipped,
                    total, ls.scale);
        size_t measured[SNUG_MEM_NCAT];
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            measured[c] = r.eng.arenas.a[c].peak;
        fprintf(out, "memory (arena high-water marks beside the plan):\n");
        snug_plan_print(out, &r.s.plan, measured);
        char b[32];
        snug_format_bytes(b, sizeof b, snug_peak_rss_bytes());
        fprintf(out, "  %-20s %12s  %16s\n", "process peak RSS", "", b);
        size_t dev = snug_backend_device_used(r.eng.be); /* arenas are allocated once, so in use now = the peak */
        if (dev) {
            snug_format_bytes(b, sizeof b, (double)dev);
            fprintf(out, "  %-20s %12s  %16s  (cudaMemGetInfo: arenas, CUDA context, cuBLASLt workspace)\n",
                    "device memory in use", "", b);
        }
        snug_overhead ov;
        snug_rank_overhead(&r, &ov);
        snug_format_bytes(b, sizeof b, (double)(r.s.plan.total + r.s.plan.host_total + ov.total));
        fprintf(out, "  %-20s %12s  (the arenas + %s runtime overhead)\n", "predicted RSS", b, "CPU");
        rc = snug_rank_memory_json(&r, "memory.json", measured, e);
        snug_run_sample(&r, out);
    }
    /* under ZeRO (and tensor parallelism) each rank plans its own shard (slices): each writes its memory */
    if (!rc && !stopped && !lead && (par.shard || r.eng.model.q4_parts > 1 || r.gn > 1)) {
        size_t measured[SNUG_MEM_NCAT];
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            measured[c] = r.eng.arenas.a[c].peak;
        char name[64];
        snprintf(name, sizeof name, "memory.rank%d.json", r.comm.rank);
        rc = snug_rank_memory_json(&r, name, measured, e);
    }
    free(ids);
    free(labels);
    free(pos);
    free(seg);
    free(mb);
    free(seeds);
    snug_parallel_free(&par);
    return snug_run_close(&r, rc, e);
}

