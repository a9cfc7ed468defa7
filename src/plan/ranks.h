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
 * Communication (ring collectives, bytes each rank sends per optimizer step; P parameters (for DDP's sum under LoRA
 * the adapters'), g = 4 bytes per fp32 gradient, w = 2 or 4 per parameter as stored, f = (n-1)/n, GA micro-batches
 * per rank):
 *   DDP      one all-reduce of the gradients after the last micro-batch      2 f P g
 *   ZeRO-1   a reduce-scatter of the gradients, an all-gather of parameters  f P g + f P w
 *   ZeRO-2   a reduce-scatter every micro-batch (no full gradient is kept    GA f P g + f P w
 *            to accumulate into), the all-gather once
 *   ZeRO-3   every micro-batch: the parameters gathered before forward and   GA (2 f P w + f P g)
 *            again before backward, the gradients reduce-scattered
 * Time: bytes / the GPU's collective bandwidth (gpus.c). Compute: the step's tokens per rank / the estimated
 * tokens/s (gpus.c), of which backward is two thirds. The step is compute plus what the collectives leave exposed
 * (snug_rank_exposed_s), as NCCL runs them beside the compute stream:
 *   DDP, ZeRO-1  the buckets hide behind the last micro-batch's backward; the last bucket (ddp_bucket_cap_mb) stays
 *                exposed, and so does ZeRO-1's all-gather after the step
 *   ZeRO-2       each layer's reduce-scatter behind backward with zero_overlap_comm (layer 0's exposed), in line
 *                without it; the all-gather after the step exposed
 *   ZeRO-3       the gathers prefetched a layer ahead (the first of each pass exposed) and, with zero_overlap_comm,
 *                the reduce-scatters too: one stream, so together they hide behind the step's compute at most
 *   optimizer_in_backward: each layer's sums (stages 1 and 2: all-reduce and gather) run in line, exposed; stage 3
 *                as without it (each layer stepped once its reduce-scatter is waited for, at the next layer's end). */
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
    const char *unbuilt;         /* a ZeRO stage that does not run with the spec: why (the rest is 0); else NULL */
} snug_rank_mode;

/* Why ZeRO stage z (1 to 3) does not run with spec s (QLoRA; LoRA below stage 3; optimizer_in_backward;
 * offload_embedding at stage 3), or NULL when it does: the rules config.c enforces, for the plan and auto_fit. */
const char *snug_rank_zero_unbuilt(const snug_plan_spec *s, int z);

/* Bytes each of n ranks sends per optimizer step at ZeRO stage z (0: DDP) under spec s, as the table above says. */
double snug_rank_comm_bytes(const snug_plan_spec *s, long long nparams, int n, int z);

/* The bytes of the frozen base (an adapter's) that stage 3 gathers in a pass: its stored parameters, or under QLoRA
 * its 4-bit matrices (snug_model.q4_sharded: the dense tensors stay whole), which offload_params also copies in. */
double snug_rank_base_bytes(const snug_plan_spec *s, long long nparams);

/* The seconds of a step's communication at ZeRO stage z (0: DDP) over n ranks that the compute (`compute` seconds
 * per optimizer step) does not hide, at bps bytes per second, as the table above says. */
double snug_rank_exposed_s(const snug_plan_spec *s, long long nparams, int n, int z, double compute, double bps);

/* Tensor parallelism (spec tp > 1): the all-reduces of one optimizer step, each of a micro-batch's B x T x C fp32
 * activations (or their gradients): 4 per block per micro-batch (2 in forward, 2 in backward), and 2 more per block
 * whose forward backward recomputes (full checkpointing; 1 with a tiled MLP, recomputed only up to the MLP's input).
 * With the vocabulary split (snug_tp_vocab_split) 2 more per micro-batch (the lookup's sum, the final norm's
 * gradient) and a gather of each token's 3 loss statistics (doubles).
 * *count gets how many all-reduces; returns the bytes each rank sends
 * (ring: 2 (t-1)/t of each). They run in line with the compute: time = bytes / the GPU's collective bandwidth. */
double snug_tp_comm_bytes(const snug_plan_spec *s, int *count);

/* The four modes (out[0] DDP, out[s] ZeRO-s) of spec s over n ranks, on gpu g (NULL: memory and bytes only); the
 * ZeRO stages that do not run with s are marked unbuilt and not planned. *choice: the mode that fits at the least
 * predicted step time (ties: the lower stage), -1 when none fits or without a GPU. */
int snug_plan_ranks(const snug_plan_spec *s, int n, const snug_gpu *g, snug_rank_mode out[4], int *choice,
                    snug_error *e);

/* When no mode fits over n GPUs of g: the fewest GPUs, more than n and at most max_n, over which one does, found by
 * doubling and then halving the interval (a rank's memory shrinks as the ranks grow), and the mode chosen there
 * (*mode, with its stage). *gpus is 0 when none fits up to max_n. */
int snug_plan_ranks_fewest(const snug_plan_spec *s, int n, int max_n, const snug_gpu *g, int *gpus,
                           snug_rank_mode *mode, snug_error *e);

#endif
