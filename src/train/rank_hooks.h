/* rank_hooks.h: what the model's hooks (model.h's snug_model_hook_ops: grads_ready and rows) do to talk to the
 * other ranks during a step: DDP's gradient buckets, ZeRO-2/3's reduce-scatter of each layer's gradients, and the
 * rows of a tied embedding split by rows. ZeRO-3's gathers of the parameters (gather_params, gather_q4) are
 * dist/gather.h's, the shards' counts dist/zero.h's.
 *
 * Each function takes its own context, filled by its caller (the parallel object, whose hook operations call these
 * with the context it owns; a test with a communicator of its own), which keeps the first error of the step in rc
 * and e: once rc is set, nothing more is issued, and the caller checks rc after the step. counts are
 * caller-allocated scratch of comm->size elements. */
#ifndef SNUG_TRAIN_RANK_HOOKS_H
#define SNUG_TRAIN_RANK_HOOKS_H

#include <stddef.h>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/gather.h"
#include "dist/zero.h"
#include "model/model.h"

/* ZeRO-2 (grads_ready of every micro-batch): as backward completes a layer's gradients (SNUG_READY_POST: the
 * global tensors after the layers; -1 the ones before them), each run of its tensors is reduce-scattered over the
 * ranks' shards, this rank adds its segment of the sum into its shard (m->gshard), and the layer buffer is zeroed
 * for the layer that uses it next. As DeepSpeed's stage 2, no full gradient is kept to accumulate into.
 *
 * Under m->lv.zero_overlap (two layer buffers, layer l's in buffer l % 2) a layer's reduce-scatters are issued
 * SNUG_COMM_ASYNC and finished at the next announcement: the wait, the adds into the shard and the zeroing of its
 * buffer, which backward writes again only two layers later. So NCCL sums layer l while backward computes layer
 * l-1. Layer 0's and the global tensors' are finished at once (the embeddings' gradients share layer 0's buffer),
 * so nothing is outstanding once layer 0 is announced.
 *
 * With `step` set (optimizer_in_backward at stage 3, no gshard) finishing a layer steps instead of adding: the
 * squares of the rank's segments go to the backend's accumulator (sumsq_acc, for the logged norm), step(step_ud,
 * group) steps the rank's part of the group where the reduce-scatter left it, and the buffer is zeroed. A group is
 * one run of the table (a layer, or the globals on one side of the layers), so its runs never outgrow `pend`. */
enum { SNUG_ZERO2_PENDING = 8 }; /* the runs of one layer's tensors that may be outstanding (more: finished early) */

typedef struct snug_zero2_run {
    float *g;          /* the run's gradients in the layer buffer (its table elements [lo, hi)) */
    size_t lo, hi;
    size_t mine, n;    /* this rank's segment of the sum: elements [mine, mine + n) of g */
} snug_zero2_run;

typedef struct snug_zero2_hook {
    snug_model *m;
    snug_comm *comm;
    const size_t *shard; /* each rank's elements of the table */
    size_t *counts;      /* scratch: a run's elements in each rank's shard */
    int npend;           /* zero_overlap: the runs issued and not finished yet */
    snug_zero2_run pend[SNUG_ZERO2_PENDING];
    void (*step)(void *step_ud, int group); /* see above; NULL: add into m->gshard */
    void *step_ud;
    int pend_group;      /* the group the pending runs belong to */
    int rc;
    snug_error e;
} snug_zero2_hook;

void snug_zero2_ready(snug_zero2_hook *c, int layer);

/* A tied embedding split by rows (rows, model.h's snug_rows_fn): the rows' elements in each rank's shard are the
 * counts of one collective over buf, whose pieces follow the rows' order (the rows increase, so each rank's piece is
 * contiguous there). Errors go where the step's check looks: the gradients' (z2), or the gathers' under ZeRO-3. */
typedef struct snug_rows_hook {
    snug_zero2_hook *z2;
    snug_zero3_hook *z3; /* NULL unless the parameters are sharded */
    size_t *counts;      /* scratch */
} snug_rows_hook;

void snug_rows_op(snug_rows_hook *c, int op, void *buf, size_t base, const int32_t *rows, int first, int n, int C);

/* DDP (grads_ready of a step's last micro-batch): the gradients summed over the ranks in buckets of consecutive
 * layers as backward completes them. Backward announces the layers last first, and the fp32 gradient buffer holds
 * them in table order, so a bucket grows downwards through the buffer until it holds `cap` bytes (PyTorch DDP's
 * 25 MiB by default) and is all-reduced, SNUG_COMM_ASYNC: NCCL sums it on its own stream while backward goes on,
 * and the caller waits (comm.wait) before it reads the sums. The global tensors, announced last, close the last
 * bucket. The host communicators sum each bucket before returning. The sum of every element is the all-reduce's
 * whatever the buckets, so the deterministic mode keeps its bits. ZeRO-1 (shard) reduce-scatters each bucket
 * instead, over the shards' intersections with it: each rank's shard of the sum, as the one reduce-scatter of the
 * whole buffer gives it. */
typedef struct snug_ddp_buckets {
    snug_model *m;
    snug_comm *comm;
    size_t cap;          /* bytes per bucket */
    int count_only;      /* 1: count the buckets a backward forms (nbuckets), summing nothing */
    int nbuckets;
    const size_t *shard; /* ZeRO-1: each rank's elements of the table (the gradients sit at table offsets) */
    size_t *counts;      /* ZeRO-1's scratch: the bucket's elements in each rank's shard */
    size_t lo, hi;       /* the bucket being filled: elements [lo, hi) of the gradient buffer (empty: lo == hi) */
    int rc;
    snug_error e;
} snug_ddp_buckets;

void snug_ddp_bucket_ready(snug_ddp_buckets *c, int layer);

#endif
