/* loop.h: the training loop over one state: the loop's setup (schedule, batch buffers, logs, the resume's data
 * replay), one optimizer step at a time (snug_loop_step), and its end (the last checkpoint made whole, the logs
 * closed).
 *
 * A step, in this order, which is the order of every operation in it: the step's micro-batches gathered; forward and
 * backward over the rank's share (snug_parallel_backward), the joins of a rank with fewer (skip); the sums over the
 * ranks (reduce); the loss checked; the gradient norm, the clip and the optimizer step (or the fp16 skip), the
 * shards gathered (after_step); evaluation, the watchdog and early stopping; the log line; the checkpoint. */
#ifndef SNUG_TRAIN_LOOP_H
#define SNUG_TRAIN_LOOP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "train/loss_scale.h"
#include "train/parallel.h"
#include "train/run.h"
#include "train/state.h"
#include "train/tboard.h"

typedef struct snug_loop {
    snug_run *r;
    snug_parallel par;
    snug_train_state st;      /* what a checkpoint holds; st.step: the steps done */
    snug_loss_scaler ls;      /* fp16's loss scale as it runs (st.ls at each step's end) */
    double loss_mean;         /* the progress bar's running mean of the loss */
    /* the schedule: W data-parallel ranks, GAr micro-batches each, GA in all per step */
    int W, GA, GAr;
    size_t per_epoch;         /* micro-batches per epoch */
    int total, warmup;        /* steps (lowered by the watchdog and early stopping), warmup steps */
    int eval_every, save_every, load_best, save_epoch, eval_off;
    snug_sched sched;
    /* the step's micro-batches, each (B, T) at most, in GA x (B, T) buffers, and their dropout seeds (GA) */
    int32_t *ids, *labels, *pos, *seg;
    snug_micro_batch *mb;
    uint64_t *seeds;
    /* the logs: metrics.jsonl (rank 0), TensorBoard, the terminal */
    FILE *metrics;
    snug_tboard tb;
    int tty;
    double t0, tlog;          /* when training began; when the last line was logged */
    size_t tokens_since;      /* example tokens since then */
    snug_checkpointer ckw;    /* the checkpoint being written in the background */
    double ck_wait;           /* how long training waited for the last one */
    int rc;                   /* the loop's failure (0: none) */
    int stopped;              /* a signal stopped the run after a checkpoint: no final save */
} snug_loop;

typedef enum {
    SNUG_STEP_NEXT,    /* another step follows */
    SNUG_STEP_DONE,    /* the last step is done (total, or the watchdog's or early stopping's end) */
    SNUG_STEP_STOPPED, /* a signal stopped the run; its checkpoint is written (l->stopped) */
    SNUG_STEP_FAILED,  /* l->rc and e say why */
} snug_step_status;

/* Sets up the loop of an opened run (the parallel object included, which prints its lines of the header). On
 * failure l->rc is set and the returned status is SNUG_STEP_FAILED; snug_loop_end and snug_loop_free follow
 * whatever the status. */
snug_step_status snug_loop_open(snug_loop *l, snug_run *r, snug_error *e);

/* One optimizer step, step l->st.step + 1 of l->total; its one way out is the status. */
snug_step_status snug_loop_step(snug_loop *l, snug_error *e);

/* The loop's end however it ended: a failure marks the ranks as no longer agreeing, the last checkpoint is made
 * whole, the logs are closed. Returns l->rc (or the checkpoint's failure). */
int snug_loop_end(snug_loop *l, snug_error *e);

void snug_loop_free(snug_loop *l);

#endif
