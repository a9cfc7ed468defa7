/* pipeline.h: pipeline parallelism's step, on the ranks of one pipeline (stage = the rank in its communicator).
 *
 * The schedule is 1F1B (PipeDream-flush, as Megatron's non-interleaved one): over a step's m micro-batches, stage s
 * of p first runs w = min(p - s - 1, m) forwards, then alternates the forward of micro-batch i + w with the backward
 * of micro-batch i, then runs the backwards left. The last stage (w = 0) runs each micro-batch's forward, loss and
 * backward together. A stage before the last has at most p - s micro-batches in flight (the model's pp_slots): it
 * keeps each one's saved activations in a set of its own (snug_model_use_set, set i mod pp_slots), or with
 * pipeline_recompute (one set) only each one's input, and runs its forward again just before that micro-batch's
 * backward (GPipe's re-materialisation).
 *
 * The stages exchange N x C floats per micro-batch: the output forward (to s + 1) and the input's gradient backward
 * (to s - 1), each sent SNUG_COMM_ASYNC from the model's pp_out / pp_din and waited for before the stage's next
 * compute overwrites it; receives block. No rank waits on a send its peer can only receive after something this
 * rank has not sent yet, so the schedule cannot deadlock. Each stage accumulates its gradients over the micro-batches
 * in their order, as one process does, so the gradients are the same bits as one process accumulating the same
 * micro-batches (the tied head's aside, summed from two stages). */
#ifndef SNUG_TRAIN_PIPELINE_H
#define SNUG_TRAIN_PIPELINE_H

#include "core/error.h"
#include "data/batching.h"
#include "dist/comm.h"
#include "model/model.h"

typedef struct snug_pipe {
    snug_comm *c;    /* the pipeline's ranks: rank s is stage s */
    snug_comm *ends; /* a tied head: a communicator of the first and the last stage (they hold the embedding); NULL
                      * otherwise, or on the stages between */
} snug_pipe;

/* One step's micro-batches mb[0..n) through this stage, gradients accumulated (grad_scale-scaled) into the model's.
 * seeds: LoRA dropout's seed of each micro-batch (NULL: none). last (NULL: none): set to 1 during the last
 * micro-batch's backward and to 0 around it (what arms DDP's buckets in the model's grads_ready hook).
 * *loss: the summed loss on the last stage, 0 on the others. */
int snug_pipe_step(snug_pipe *p, snug_model *m, const snug_micro_batch *mb, const uint64_t *seeds, int n,
                   float grad_scale, int *last, double *loss, snug_error *e);

/* The current batch (set on every stage) forward through the pipeline, for evaluation: *loss the summed loss on the
 * last stage, 0 on the others. */
int snug_pipe_forward(snug_pipe *p, snug_model *m, double *loss, snug_error *e);

/* A tied head: the embedding's gradient on the first and the last stage <- their sum (the lookup's and the head's
 * parts). Nothing on the other stages, or without a tied head. */
int snug_pipe_tied_sum(snug_pipe *p, snug_model *m, snug_error *e);

/* The gradient norm over the pipeline (times grad_scale): each stage's squares (of its adapters' under LoRA) summed
 * over the stages, the tied head's copy on the last stage not counted again. */
int snug_pipe_grad_norm(snug_pipe *p, const snug_model *m, float grad_scale, double *norm, snug_error *e);

#endif
