/* ranks.h: the plan per rank of a data-parallel run over n GPUs, for DDP and each ZeRO stage, with the
 * communication of one optimizer step and its predicted time on a GPU's interconnect.
 *
 * Memory. Every mode is planned by the layout code the trainer allocates with (snug_plan_run with the spec's ranks and
 * zero_stage: from stage 1 the optimizer arena and the fp32 master copy are each rank's shard; at stage 2 the
 * gradients arena is the shared layer buffer, the global tensors' gradients and the rank's shard of the sum (with an
 * untied head one buffer of max(embedding, final norm and head, layer) for all three); at stage 3 the parameters
 * arena is the rank's shard and one gather region of max(the global tensors, two layers) (untied: max(embedding,
 * final norm and head, two layers)); with a tied head on the CPU, loss_vocab_block splits the embedding by rows
 * (stage 2: its gradient one block at a time in the layer buffer beside the looked-up rows; stage 3: the region two
 * layers, or the other globals and a block or the looked-up rows); the largest rank's plan is reported).
 *
 * Communication (ring collectives, bytes each rank sends per optimizer step; P parameters, g = 4 bytes per fp32
 * gradient, w = 2 or 4 per parameter as stored, f = (n-1)/n, GA micro-batches per rank):
 *   DDP      one all-reduce of the gradients after the last micro-batch      2 f P g
 *   ZeRO-1   a reduce-scatter of the gradients, an all-gather of parameters  f P g + f P w
 *   ZeRO-2   a reduce-scatter every micro-batch (no full gradient is kept    GA f P g + f P w
 *            to accumulate into), the all-gather once
 *   ZeRO-3   every micro-batch: the parameters gathered before forward and   GA (2 f P w + f P g)
 *            again before backward, the gradients reduce-scattered
 * Time: bytes / the GPU's collective bandwidth (gpus.c). Compute: the step's tokens per rank / the estimated
 * tokens/s (gpus.c). Stages 0 and 1 communicate after backward (as snug does), so their step is compute + comm; the
 * per-layer collectives of stages 2 and 3 overlap the neighbouring layers' compute, so theirs is max(compute, comm)
 * plus one layer's share of the communication (the first gather, the last reduce-scatter), which stays exposed. */
#ifndef SNUG_PLAN_RANKS_H
#define SNUG_PLAN_RANKS_H

#include "plan/gpus.h"
#include "plan/plan.h"

typedef struct snug_rank_mode {
    int stage;                   /* 0 = DDP, 1..3 = ZeRO */
    size_t bytes[SNUG_MEM_NCAT]; /* the largest rank's, per category */
    size_t total, host_total;    /* device and host-resident bytes of a rank */
    double need;                 /* total + the cuda runtime overhead: what a GPU must hold */
    int fits;                    /* need <= the GPU's memory (when a GPU is given) */
    double comm_bytes;           /* sent by each rank per optimizer step */
    double comm_s, compute_s, step_s; /* with a GPU: predicted seconds per step (0 without) */
} snug_rank_mode;

/* Bytes each of n ranks sends per optimizer step at ZeRO stage z (0: DDP) under spec s, as the table above says. */
double snug_rank_comm_bytes(const snug_plan_spec *s, long long nparams, int n, int z);

/* The four modes (out[0] DDP, out[s] ZeRO-s) of spec s over n ranks, on gpu g (NULL: memory and bytes only).
 * *choice: the mode that fits at the least predicted step time (ties: the lower stage), -1 when none fits or
 * without a GPU. */
int snug_plan_ranks(const snug_plan_spec *s, int n, const snug_gpu *g, snug_rank_mode out[4], int *choice,
                    snug_error *e);

#endif
