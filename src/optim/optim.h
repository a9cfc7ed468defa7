/* optim.h: AdamW (fp32 or 8-bit state, optionally paged) over the flat parameter buffer, global gradient-norm
 * clipping, and learning-rate schedules.
 *
 * State layout. Optimizer state lives in SNUG_MEM_OPTIM, carved by snug_adamw_layout (so `snug plan` and the measured
 * peak show it). Every state buffer is flat in parameter-table order, so one layer's state is one contiguous range of
 * each buffer (ready for sharding and for stepping inside backward):
 *   - fp32 AdamW: m, v (P floats each), laid out like the parameters;
 *   - 8-bit AdamW (bitsandbytes' AdamW8bit): tensors of at least SNUG_Q8_MIN_NUMEL elements keep both moments as
 *     8-bit codes qm, qv (one byte per element) with one fp32 absmax per block of SNUG_Q8_BLOCK elements (am, av;
 *     each tensor starts a new block), the first moment by the signed dynamic map and the second by the unsigned
 *     one; smaller tensors (norms, biases) keep fp32 m, v and take the fp32 op (torch's order; bitsandbytes'
 *     32-bit kernel decays after the update, an O(lr^2 wd) difference). About 2.03 bytes per parameter, not 8.
 * Paged (paged_adamw_8bit, paged_adamw_32bit): the whole SNUG_MEM_OPTIM arena is host memory (pinned on a GPU; never
 * managed memory), outside the device total. Each step streams the state through two device staging slots of up to
 * SNUG_PAGED_CHUNK_BYTES in the workspace arena: copy a chunk in, update it, copy it back, the next chunk's copy
 * overlapping this chunk's update on a GPU (one slot, of the state's size, when all the state is one chunk). Paging
 * saves device memory once the state outgrows the two slots (32 MiB: 4M parameters in fp32, 16M in 8-bit).
 * Device-side optimizer buffers (the two 256-entry maps, the staging slots) are carved in SNUG_MEM_OPTIM, or in
 * SNUG_MEM_WORKSPACE when that arena is on the host.
 *
 * Sharded (ZeRO): with a shard set, every buffer above holds only the shard's part of each tensor, in the same
 * order, and a step updates only those elements (parameters and gradients are still read at their table offsets).
 * A shard's edges lie on a tensor's quantization blocks (dist/zero.h), so each rank's 8-bit state is exactly the
 * blocks the unsharded state has there, and a sharded step computes the same bits for them.
 *
 * Weight decay applies to matrices only (the table's decay flag): never to norms, biases or other 1-D tensors.
 *
 * Frozen tensors (unfrozen_parameters, the table's frozen flag) have no state and take no step, as tensors without
 * requires_grad are left out of torch's optimizer; their gradient is zero (the model zeroes it), so the gradient
 * norm is the trained tensors'. */
#ifndef SNUG_OPTIM_H
#define SNUG_OPTIM_H

#include "backend/backend.h"
#include "core/arena.h"
#include "model/model.h"

typedef enum snug_optim_kind {
    SNUG_OPTIM_ADAMW = 0,   /* fp32 moments, torch.optim.AdamW's order of operations */
    SNUG_OPTIM_ADAMW_8BIT,  /* 8-bit blockwise moments, bitsandbytes' AdamW8bit order (decay after the update) */
} snug_optim_kind;

#define SNUG_Q8_BLOCK 256       /* elements per quantization block (bitsandbytes >= 0.44) */
#define SNUG_Q8_MIN_NUMEL 4096  /* smaller tensors keep fp32 state (bitsandbytes' min_8bit_size) */
#define SNUG_PAGED_CHUNK_BYTES ((size_t)16 << 20) /* state bytes per streamed chunk of a paged optimizer */

typedef struct snug_adamw {
    snug_optim_kind kind;   /* set before layout */
    int paged;              /* set before layout: state in host memory, streamed chunk by chunk */
    size_t chunk_bytes;     /* paged: state bytes per chunk; 0 (the default) = SNUG_PAGED_CHUNK_BYTES */
    int embed_fp32;         /* 8-bit: 1 = the embedding tables keep fp32 state, as transformers' Trainer overrides
                             * nn.Embedding to 32-bit under bitsandbytes; 0 (default) = bitsandbytes' own rule */
    int stage16;            /* set before layout: the model stores parameters or gradients in 16 bits */
    int sharded;            /* set before layout: state exists, and steps happen, for ZeRO's shard only: */
    size_t shard_lo, shard_hi; /* table floats [lo, hi) (dist/zero.h) */
    float *stage_p, *stage_g; /* (stage_n) fp32 slots the 16-bit values are widened into for the update */
    size_t stage_n;
    uint64_t sr_seed;       /* stochastic rounding of this step (16-bit parameters without master weights) */

    float *m, *v;           /* (n32) fp32 moments of the tensors that keep fp32 state */
    uint8_t *qm, *qv;       /* (n8) 8-bit codes of the others */
    float *am, *av;         /* (nblk) absmax of each block of qm, qv */
    size_t n32, n8, nblk;
    float *qmap;            /* (2, 256) on the device: the signed map (first moment), then the unsigned map */
    unsigned char *stage[2];/* paged: device staging slots of stage_bytes (one when the state is one chunk) */
    size_t stage_bytes;

    double beta1, beta2, eps, weight_decay;
    int step;               /* optimizer steps taken (1-based inside the update) */
} snug_adamw;

/* Carves the state of every tensor of t (opt->kind, opt->paged and opt->chunk_bytes set; the rest is filled). On
 * real arenas, be copies the quantization maps to the device; on counting arenas (the plan) be is NULL. */
int snug_adamw_layout(snug_adamw *opt, snug_arenas *A, const snug_param_table *t, snug_backend *be, snug_error *e);

/* Tensor p's elements in the range [lo, hi) of the flat layout, as offsets into the tensor: [*a0, *a1) (empty when
 * a0 == a1, always for a frozen tensor: unfrozen_parameters). A shard's state holds each tensor's part of its range,
 * in table order; every walk over the state (layout, step, paging, resharding) takes its parts from here. */
void snug_adamw_part(const snug_param_entry *p, size_t lo, size_t hi, size_t *a0, size_t *a1);

/* 1 when entry p keeps 8-bit state under opt's kind. */
int snug_adamw_entry_8bit(const snug_adamw *opt, const snug_param_entry *p);

/* The global L2 norm of the gradients after multiplying them by grad_scale. */
double snug_grad_norm(snug_backend *be, const float *grads, size_t n, float grad_scale);

/* The global L2 norm of all of a model's gradients (fp32 and 16-bit) after multiplying them by grad_scale; inf or
 * NaN when a gradient is (the loss scaler's overflow check). */
double snug_grad_norm_model(const snug_model *m, float grad_scale);

/* One AdamW step over every tensor of the table; grads are multiplied by grad_scale first (clipping folds in here).
 * Each tensor takes the op of its state (be->adamw or be->adamw8bit); a paged optimizer streams the state.
 * params and grads: flat fp32 at the table offsets. */
void snug_adamw_step(snug_adamw *opt, snug_backend *be, const snug_param_table *t, float *params, const float *grads,
                     double lr, float grad_scale);
/* The same step over a model's own parameters and gradients, whatever their precision: fp32; 16-bit with master
 * weights (the master takes the update and the 16-bit copy is rounded from it to nearest); 16-bit without (the
 * update is computed in fp32 and rounded to bf16 stochastically). 16-bit gradients are widened first. */
void snug_adamw_step_model(snug_adamw *opt, const snug_model *m, double lr, float grad_scale);

/* The optimizer step inside backward: steps only the model's tensors of `layer`, a group backward announces
 * (snug_model_ready_group: a layer, -1 the global tensors, or under ZeRO-3 SNUG_READY_POST the ones after the layers
 * and -1 those before), as snug_adamw_step_model does; a sharded optimizer only its shard's part, a paged one
 * streaming just that state. The caller advances opt->step once per optimizer step, before backward. */
void snug_adamw_step_layer(snug_adamw *opt, const snug_model *m, int layer, double lr, float grad_scale);

/* "adamw", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit" */
const char *snug_optim_name(snug_optim_kind kind, int paged);

/* transformers' scheduler types (get_scheduler) */
typedef enum snug_sched {
    SNUG_SCHED_CONSTANT,         /* constant: no warmup at all (get_constant_schedule) */
    SNUG_SCHED_LINEAR,           /* linear: warmup, then to 0 at total */
    SNUG_SCHED_COSINE,           /* cosine (and cosine_with_min_lr): warmup, then num_cycles waves down to min_ratio */
    SNUG_SCHED_CONSTANT_WARMUP,  /* constant_with_warmup */
    SNUG_SCHED_COSINE_RESTARTS,  /* cosine_with_restarts: num_cycles hard restarts of the half cosine */
    SNUG_SCHED_POLYNOMIAL,       /* polynomial: (lr - lr_end) x remaining^power + lr_end */
    SNUG_SCHED_INVERSE_SQRT,     /* inverse_sqrt: 1 / sqrt((step + timescale - warmup) / timescale) */
    SNUG_SCHED_WSD,              /* warmup_stable_decay */
    SNUG_SCHED_PLATEAU,          /* reduce_lr_on_plateau: learning_rate until the validation loss stops improving, then
                                  * times factor (torch's ReduceLROnPlateau, stepped by each evaluation; snug_plateau);
                                  * no warmup, as transformers builds it */
    SNUG_SCHED_COSINE_WARMUP_MIN, /* cosine_warmup_with_min_lr: warmup to the peak at its last step (from
                                  * warmup_lr_rate when set), then cosine from one step in, down to min_ratio */
    SNUG_SCHED_REX,              /* Axolotl's rex (RexLR, arXiv 2107.04197): warmup, then min + (1 - min) z / (0.1 +
                                  * 0.9 z) with z the share of the steps left, min = min_ratio (cosine_min_lr_ratio) */
} snug_sched;

typedef enum snug_wsd_shape { SNUG_WSD_LINEAR, SNUG_WSD_COSINE, SNUG_WSD_1SQRT } snug_wsd_shape;

/* The schedules' own settings (transformers' scheduler_specific_kwargs, lr_scheduler_kwargs), defaults from
 * snug_sched_params_default. */
typedef struct snug_sched_params {
    double num_cycles;       /* cosine, WSD's cosine decay: waves (0.5: the half cosine); cosine_with_restarts:
                              * restarts; < 0: the schedule's default (0.5, or 1 for cosine_with_restarts) */
    double power, lr_end;    /* polynomial: 1.0 and 1e-7 */
    int timescale;           /* inverse_sqrt: 0 = the warmup steps, or 10000 without warmup */
    int wsd_decay;           /* warmup_stable_decay: its decay steps (num_decay_steps, required) */
    int wsd_stable;          /* its stable steps; < 0: total - warmup - decay */
    snug_wsd_shape wsd_warmup, wsd_decay_type; /* warmup_type (linear), decay_type (cosine) */
    double wsd_min_ratio;    /* min_lr_ratio: where warmup starts and decay ends, as a fraction of the peak (0) */
    double warmup_lr_rate;   /* cosine_warmup_with_min_lr: warmup's first factor; < 0: none (warmup (step + 1) / w) */
    /* Axolotl's variants of cosine: lr_quadratic_warmup (warmup (step / w)^2, then down to 0), and
     * cosine_constant_lr_ratio c with a floor (the cosine reaches it at int(total x c) and stays) */
    int quadratic_warmup;
    double constant_ratio;
    /* reduce_lr_on_plateau: ReduceLROnPlateau's arguments (its defaults: mode min, factor 0.1, patience 10,
     * threshold 1e-4, threshold_mode rel, cooldown 0, min_lr 0, eps 1e-8) */
    int plat_max, plat_abs;  /* mode max (higher is better), threshold_mode abs */
    double plat_factor, plat_threshold, plat_min_lr, plat_eps;
    int plat_patience, plat_cooldown;
} snug_sched_params;

/* reduce_lr_on_plateau's state between evaluations (part of a checkpoint) */
typedef struct snug_plateau {
    double lr;               /* the learning rate now */
    double best;             /* the best metric so far (+inf, or -inf in mode max, before the first) */
    int bad;                 /* evaluations since it, not counting those in cooldown (num_bad_epochs) */
    int cooldown;            /* evaluations of cooldown left */
} snug_plateau;

/* The state before any evaluation: lr at base_lr. */
void snug_plateau_init(snug_plateau *s, double base_lr, const snug_sched_params *p);
/* One evaluation's metric (the validation loss), as ReduceLROnPlateau.step takes it: a better one (below best x
 * (1 - threshold), or best - threshold in abs mode; above, in mode max) resets the count, else it grows; cooldown
 * evaluations do not count; past `patience` the learning rate becomes max(lr x factor, min_lr) (unless that changes
 * it by eps or less) and cooldown starts. */
void snug_plateau_step(snug_plateau *s, double metric, const snug_sched_params *p);

void snug_sched_params_default(snug_sched_params *p);

/* The learning rate of optimizer step `step` (0-based) of `total`, bit for bit as transformers' LambdaLR gives it:
 * base_lr times the schedule's factor, computed in the same order in double precision. warmup: linear warmup steps
 * (WSD: warmup_type's); min_ratio: cosine's floor as a fraction of base_lr (Axolotl's cosine_min_lr_ratio); p NULL:
 * the defaults. */
double snug_lr_at(snug_sched kind, double base_lr, int step, int warmup, int total, double min_ratio,
                  const snug_sched_params *p);

#endif
