/* plan.h: the memory plan of a training run, computed by running the real layout code on counting arenas.
 *
 * The trainer allocates each arena with exactly the planned capacity, so the plan is not an estimate of the
 * allocation: it is the allocation, made before any memory is touched. */
#ifndef SNUG_PLAN_H
#define SNUG_PLAN_H

#include <stdio.h>

#include "core/arena.h"
#include "model/config.h"
#include "model/model.h"
#include "optim/optim.h"

/* What a plan is computed for: the same inputs the trainer lays out. */
typedef struct snug_plan_spec {
    snug_model_config cfg;
    int B, T;              /* micro-batch rows and sequence length */
    int GA;                /* micro-batches accumulated per optimizer step (0 or 1: none) */
    int ranks;             /* data-parallel ranks whose gradients are summed with these (0 or 1: one process) */
    int rank;              /* which of them this plan is for (its ZeRO shard) */
    int zero_stage;        /* 0: every rank holds everything (DDP); 1: optimizer state sharded over the ranks; 2: and
                            * the gradients; 3: and the parameters */
    int zero_max;          /* auto_fit over several ranks: the highest stage the search may raise zero_stage to (at or
                            * below zero_stage: the search keeps zero_stage) */
    snug_levers lv;        /* as configured; the layout uses snug_plan_levers(spec), which derives the rest */
    int with_grads;        /* 0: inference (generation) */
    snug_optim_kind optim; /* the optimizer's state layout (with_grads only) */
    int optim_paged;       /* optimizer state in host memory, streamed (paged_adamw_*) */
    double memory_budget;  /* bytes (0 = none): snug_engine_create refuses a plan over it (see plan/autofit.h) */
    double budget_overhead; /* runtime overhead outside the arenas that the budget must also hold */
    int ckpt_snapshot;     /* checkpoints are copied to host memory and written while training goes on */
    int loss_vocab_block;  /* as configured: rows per block of the loss, 0 auto, -1 off (lv.vocab_block derives) */
    int device_cuda;       /* the run is on a GPU (whose backend has no blocked loss yet) */
    int ddp_bucket_cap_mb; /* DDP and ZeRO-1's buckets (0: 25 MiB), for the time of the last one */
    int overlap_comm;      /* as configured (zero_overlap_comm): 1 on, -1 off, 0 auto: on for GPU ranks (lv.zero_overlap
                            * derives) */
    int comm_deterministic; /* ddp_deterministic: GPU ranks' communicator holds the rank-order sums' scratch */
    int tp;                /* tensor_parallel_size: ranks that split every block (0 or 1: none); the plan is one
                            * rank's, its blocks' share of cfg (snug_tp_config) */
    int tp_rank;           /* which of them */
    int pp;                /* pipeline_parallel_size: stages the layers are split over (0 or 1: none); the plan is
                            * one stage's (snug_pp_layers) */
    int pp_stage;          /* which of them */
    snug_pp_split pp_split; /* pipeline_layers: the layers of each stage (n 0: an even split) */
    const snug_patterns *unfrozen; /* unfrozen_parameters: the patterns of the tensors that train
                                    * (snug_param_table_freeze); NULL or none = every tensor (full fine-tuning) */
    int pp_recompute;      /* pipeline_recompute: a stage before the last keeps only each micro-batch's input and
                            * runs its forward again before its backward (else it keeps each one's activations) */
} snug_plan_spec;

typedef struct snug_plan {
    size_t bytes[SNUG_MEM_NCAT]; /* peak bytes per category */
    int host[SNUG_MEM_NCAT];     /* 1: the category lives in (pinned) host memory, outside the device total */
    size_t total;                /* device bytes: the categories not in host memory */
    size_t host_total;           /* host-resident bytes (paged optimizer state) */
    long long nparams;
    long long ntrain;            /* the trainable floats: nparams, or under LoRA the adapter table's */
    size_t largest_tensor;       /* floats in the largest parameter tensor (staging when loading weights) */
    int B, T, xent_chunk;
    int vocab_block;             /* rows of the head per block of the loss (loss_vocab_block), 0: one pass */
    size_t device_scratch;       /* a GPU backend's scratch (snug_plan_device_scratch): allocated at this size */
    int ranks;                   /* the spec's data-parallel ranks (1: one process) */
    size_t comm_scratch;         /* over several GPU ranks: the NCCL communicator's deterministic scratch (0: none) */
} snug_plan;

int snug_plan_run(snug_plan *p, const snug_plan_spec *s, snug_error *e);

/* What the plan and the engine both set before laying a model out: its config (under tensor parallelism the rank's
 * share of the spec's), levers, tensor-parallel rank and parameter table. An error where the split does not fit the
 * model; free with snug_model_free_host. */
int snug_plan_model_init(snug_model *m, const snug_plan_spec *s, snug_error *e);

/* Bytes of the CUDA backend's scratch for the spec's shape (backend/device.h's snug_cuda_scratch_bytes
 * of B*T tokens, the query heads and the widest column sum): the size the engine creates the backend with and the
 * plan's overhead counts, so that no op allocates device memory mid-run (one that asks for more records an error). */
size_t snug_plan_device_scratch(const snug_plan_spec *s);

/* The levers a spec is laid out with: its lv, with what depends on the other settings derived here and only here
 * (16-bit storage keeps layer gradients in fp32 when micro-batches accumulate into them). snug_plan_run and
 * snug_engine_create both lay out with these, so a plan and its allocation cannot disagree. */
snug_levers snug_plan_levers(const snug_plan_spec *s);

/* Whether the spec's levers can run together: optimizer_in_backward steps after every micro-batch (no
 * accumulation). An error names the setting and the fix. snug_plan_run checks it. */
int snug_plan_spec_check(const snug_plan_spec *s, snug_error *e);

/* ZeRO: each rank's elements of the flat parameter table, counts[0..ranks-1] (dist/zero.h; edges on the 8-bit
 * optimizer's blocks). Without ZeRO, or for one rank, one shard of everything. */
void snug_plan_zero_counts(const snug_plan_spec *s, const snug_param_table *t, size_t *counts);

/* Sets opt's shard to the spec's rank's (before snug_adamw_layout); nothing without ZeRO. The plan and the engine
 * both call it, so the planned optimizer arena is the allocated one. */
int snug_plan_shard_optimizer(snug_adamw *opt, const snug_plan_spec *s, const snug_param_table *t, snug_error *e);

/* ZeRO under 16-bit storage with master weights: the master copy is the rank's shard (m->master_sharded, master_lo,
 * master_n), set before snug_model_layout (by the plan and the engine alike); the whole copy otherwise. */
void snug_plan_shard_master(snug_model *m, const snug_plan_spec *s);

/* ZeRO-3: the parameter arena (fp32, or the 16-bit copy) holds the rank's shard (m->param_sharded, pshard_lo,
 * pshard_n, the same counts as the optimizer's), set before snug_model_layout by the plan and the engine alike; the
 * layout then carves the shard and the gather region (model.h) in the parameters arena. Under QLoRA the 4-bit
 * matrices are what is sharded (m->q4_sharded: equal byte pieces of each layer), and the dense tensors stay whole;
 * with offload_params the rank's pieces (one process: all of them) are in host memory. LoRA's offload_params lays
 * the base out as stage 3 does, in host memory; without stage 3 the rank's shard is the whole table. */
void snug_plan_shard_params(snug_model *m, const snug_plan_spec *s);

/* ZeRO-2 (m->lv.zero_grads): carves m->gshard, the rank's shard of the summed gradients, in A's gradients arena,
 * after snug_model_layout; nothing otherwise. The plan and the engine both call it. */
int snug_plan_shard_grads(snug_model *m, snug_arenas *A, const snug_plan_spec *s, snug_error *e);

/* The checkpoint snapshot: one host copy of what a checkpoint keeps of each category (parameters, master weights,
 * optimizer state: snug_plan_kept_bytes of the size the category of A has reached), carved from A's snapshot arena;
 * dst[c] gets the copy of category c (NULL for the others). The plan and the engine both call it after laying the
 * model and the optimizer out, so the snapshot is planned exactly. */
int snug_plan_snapshot_layout(snug_arenas *A, const snug_model *m, void *dst[SNUG_MEM_NCAT], snug_error *e);

/* Whether a checkpoint keeps category c: the trained state (parameters, master weights, optimizer state; under LoRA
 * the adapters and their optimizer state, not the frozen base). */
int snug_plan_kept(const snug_levers *lv, snug_category c);

/* The bytes of category c a checkpoint keeps, of the `whole` its arena holds: 0 when it keeps none, the whole arena,
 * or under ZeRO-3 the parameters arena's shard alone (m->params16 or m->params, pshard_n elements as stored), not
 * the gather region beside it. */
size_t snug_plan_kept_bytes(const snug_model *m, snug_category c, size_t whole);

/* "1.23 GiB", "456.0 MiB", "12.0 KiB" */
void snug_format_bytes(char *buf, size_t n, double bytes);

/* Prints the plan, one line per category; with measured peaks (NULL for none) beside each. */
void snug_plan_print(FILE *f, const snug_plan *p, const size_t *measured);

#endif
