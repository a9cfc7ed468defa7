/* parallel.h: the machinery of a run over several ranks (data, tensor and pipeline parallelism, ZeRO): the step
 * inside backward, tensor parallelism's hooks, the ranks' agreement, the gradient sums and norms over the ranks, and
 * ZeRO's gather of the stepped shards. The model's hooks that run inside a step live in rank_hooks.h. */
#ifndef SNUG_TRAIN_PARALLEL_H
#define SNUG_TRAIN_PARALLEL_H

#include <stddef.h>

#include "core/error.h"
#include "dist/comm.h"
#include "model/model.h"
#include "train/engine.h"

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

/* The model's on_grads_ready under optimizer_in_backward (ud: a snug_step_in_backward_ctx). */
void snug_step_in_backward(void *ud, int layer, size_t offset, size_t numel);

/* Tensor parallelism's hooks (the model's tp_reduce and tp_gather; ud: a snug_tp_hook). */
void snug_tp_reduce(void *ud, float *buf, size_t n);
void snug_tp_gather(void *ud, double *buf, size_t n);

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

#endif
