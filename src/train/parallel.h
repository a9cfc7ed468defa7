/* parallel.h: everything a run over several ranks adds to a step (data, tensor and pipeline parallelism, ZeRO),
 * behind one object, snug_parallel: it owns the shards, the buckets, the gathers, the pipeline and the step inside
 * backward, and answers the loop's questions (backward, skip, reduce, grad-norm, after-step). Below it, the pieces
 * it is made of: the step inside backward, tensor parallelism's hooks, the ranks' agreement, the gradient norms over
 * the ranks and ZeRO's gather of the stepped shards. The model's hooks that run inside a step live in rank_hooks.h. */
#ifndef SNUG_TRAIN_PARALLEL_H
#define SNUG_TRAIN_PARALLEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "dist/comm.h"
#include "model/model.h"
#include "train/engine.h"
#include "train/pipeline.h"
#include "train/rank_hooks.h"
#include "train/run.h"

/* The optimizer step inside backward (optimizer_in_backward): as soon as backward announces that a layer's
 * gradients are complete, sum them over the ranks (one all-reduce per tensor; each rank's backward announces the
 * layers in the same order), step that layer's tensors, add their sum of squares for the logged gradient norm into
 * the backend's accumulator (read once after the step: no wait per tensor), and zero the buffer the next layer
 * reuses. */
typedef struct snug_step_in_backward_ctx {
    snug_engine *eng;
    snug_comm *comm;
    const size_t *shard; /* ZeRO-1/2: each rank's elements of the table (it steps its part of each layer, whose
                          * parameters are then all-gathered); NULL: every rank steps everything */
    size_t *counts;      /* (size) scratch: a range's elements in each rank's shard */
    double lr;
    /* tensor parallelism: the whole model's table; the squares of a tensor every rank holds whole are counted by
     * tensor-parallel rank 0 alone (the sum over the ranks is then the norm's) */
    const snug_param_table *whole;
    int tp_rank;
    int rc;        /* the first failed all-reduce of the step (then nothing more is reduced or stepped) */
    snug_error e;
} snug_step_in_backward_ctx;

/* Tensor parallelism's sum (the model's tp_reduce) over the world's ranks; a failure is kept for the step to report. */
typedef struct snug_tp_hook {
    snug_comm *comm;
    size_t *counts; /* (size) the gather's */
    int rc;
    snug_error e;
} snug_tp_hook;

/* Zeroes every gradient buffer (fp32 and 16-bit) before a step's micro-batches accumulate into them. */
void snug_zero_grads(snug_model *m);

/* ZeRO-3's step of a group inside backward (snug_zero2_hook's step; ud: a snug_step_in_backward_ctx). */
void snug_step_group(void *ud, int group);

/* The model's grads_ready under optimizer_in_backward: layer's gradients summed, stepped, and their buffer zeroed. */
void snug_step_in_backward(snug_step_in_backward_ctx *c, int layer);

/* Tensor parallelism's hooks (the model's tp_reduce and tp_gather). */
void snug_tp_reduce(snug_tp_hook *h, float *buf, size_t n);
void snug_tp_gather(snug_tp_hook *h, double *buf, size_t n);

/* Tensor parallelism: the global gradient norm (times grad_scale); whole: the whole model's table. */
int snug_tp_grad_norm(snug_comm *c, const snug_model *m, const snug_param_table *whole, float grad_scale,
                      double *norm, snug_error *e);

/* Whether the step's collectives run: with several ranks, or through NCCL at one rank. */
int snug_ddp_collectives(const snug_comm *c);

/* Whether every rank got this far (the first failed rank's error goes to every rank); *broken is set when a
 * collective itself failed. */
int snug_ddp_agree(snug_comm *c, int rc, int *broken, snug_error *e);

/* The sum over the ranks of the step's gradients after backward where backward did not sum them in buckets. */
int snug_ddp_reduce_grads(snug_comm *c, snug_model *m, snug_error *e);

/* ZeRO: the global gradient norm (times grad_scale) from each rank's shard (stages: pipeline parallelism's, or
 * NULL). */
int snug_zero_grad_norm(snug_comm *c, snug_comm *stages, const snug_model *m, const size_t *shard, float grad_scale,
                        double *norm, snug_error *e);

/* ZeRO beside tensor parallelism: the global gradient norm (times grad_scale). */
int snug_zero_tp_grad_norm(snug_comm *dpc, snug_comm *tpc, const snug_param_table *whole, const snug_model *m,
                           const size_t *shard, float grad_scale, double *norm, snug_error *e);

/* ZeRO: every rank's updated shard of the parameters to every rank. */
int snug_zero_gather_params(snug_comm *c, const snug_model *m, const size_t *shard, snug_error *e);

/* What the model's grads_ready reaches (snug_parallel.ready): nothing, ZeRO-2/3's reduce-scatter (every
 * micro-batch), the step inside backward (every micro-batch), or DDP's buckets (only while `armed`: the last
 * micro-batch's backward). */
typedef enum snug_ready_to {
    SNUG_READY_TO_NONE = 0,
    SNUG_READY_TO_ZERO2,
    SNUG_READY_TO_STEP,
    SNUG_READY_TO_BUCKETS,
} snug_ready_to;

/* The parallel object: everything a run over several ranks adds to a step, in one place. It owns ZeRO's shards,
 * the model's hooks (DDP's buckets, ZeRO-2/3's reduce-scatters and gathers, a tied embedding's rows, tensor
 * parallelism's sums, the step inside backward) and the pipeline, and answers the step's questions in the step's
 * order: backward over the rank's micro-batches, the joins of a rank with fewer of them (skip), the sums after
 * backward (reduce), the global gradient norm, and what follows the optimizer step (after_step). One process is the
 * case of one rank: each answer is then the plain one.
 *
 * The model's hooks are one table, `ops`, with the object itself as their context (the model's hooks = {&ops, p}):
 * each operation finds its own state here (z3 for the gathers, zr for the rows, tph for tensor parallelism's sums,
 * and for grads_ready the state `ready` names). An operation this run does not use stays NULL. */
typedef struct snug_parallel {
    snug_run *r;
    snug_comm *dp, *tp;           /* r's data-parallel ranks, and its tensor-parallel ranks or pipeline stages */
    size_t *shard;                /* ZeRO: each rank's elements of the flat parameters; NULL: every rank holds all */
    snug_tp_hook tph;             /* tensor parallelism's sums and gathers (the model's tp_reduce, tp_gather) */
    snug_param_table tp_whole;    /* tensor parallelism: the whole model's table (which tensors are sliced) */
    snug_pipe pipe;               /* pipeline parallelism: the stages (r->ppn > 1) */
    snug_zero2_hook z2;           /* ZeRO-2/3: each layer's gradients reduce-scattered (z2.counts set) */
    snug_zero3_hook z3;           /* ZeRO-3: the parameters gathered layer by layer (z3.counts set) */
    snug_rows_hook zr;            /* a tied embedding's rows under ZeRO */
    snug_ddp_buckets buckets;     /* DDP and ZeRO-1: the gradients summed in buckets in the last backward */
    int bucketed;
    snug_step_in_backward_ctx in_bwd; /* optimizer_in_backward */
    snug_model_hook_ops ops;      /* the model's hooks, filled by snug_parallel_open */
    snug_ready_to ready;          /* what grads_ready reaches */
    int armed;                    /* SNUG_READY_TO_BUCKETS: 1 during a step's last micro-batch's backward */
} snug_parallel;

/* Sets up the run's parallelism and prints the header's lines on it to out; the model's hooks are p's (its table,
 * with p as their context), so p must stay where it is until snug_parallel_free. */
int snug_parallel_open(snug_parallel *p, snug_run *r, FILE *out, snug_error *e);

/* Forward and backward of the rank's micro-batches mb[k0..k1) of the step (seeds: their dropout seeds, from
 * seeds[0]), through the pipeline's stages or one by one (DDP's buckets armed for the last); adds their losses
 * (with gradient scale `scale`) to *loss_sum. */
int snug_parallel_backward(snug_parallel *p, const snug_micro_batch *mb, const uint64_t *seeds, int k0, int k1,
                           float scale, double *loss_sum, snug_error *e);

/* A rank with fewer micro-batches than the others (the end of an epoch) still joins each one's collectives. */
void snug_parallel_skip(snug_parallel *p, int k0, int k1, int nmb);

/* The first error the model's hooks kept during a pass (ZeRO-2/3's reduce-scatters and the rows, the gathers, the
 * step inside backward, DDP's buckets, tensor parallelism's sums, in that order), copied to *e; 0 when none. The
 * hooks report nothing themselves: whoever runs a pass asks here after it (snug_parallel_reduce after backward, the
 * loop after an evaluation). */
int snug_parallel_hook_error(const snug_parallel *p, snug_error *e);

/* Before a step's backward with optimizer_in_backward: the optimizer's step counted and the step's learning rate
 * given to the step each layer runs inside backward. */
void snug_parallel_step_in_backward_begin(snug_parallel *p, double lr);

/* After backward: the hooks' first errors, then the loss and the gradients summed over the ranks (and a tied
 * head's two parts over the pipeline's ends). */
int snug_parallel_reduce(snug_parallel *p, double *loss_sum, snug_error *e);

/* The step's global gradient norm, summed over whatever each rank holds (its shard, its slices, its stage): under
 * optimizer_in_backward from the squares the step inside backward accumulated, else from the gradients times
 * 1 / ls_scale (fp16's loss scale undone). The one place that tells the ways of holding the gradients apart. */
int snug_parallel_grad_norm(snug_parallel *p, float ls_scale, double *norm, snug_error *e);

/* After the optimizer step: ZeRO-1/2's updated shards gathered (ZeRO-3 gathers at the next forward). */
int snug_parallel_after_step(snug_parallel *p, snug_error *e);

void snug_parallel_free(snug_parallel *p);

#endif
