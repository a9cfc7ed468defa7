/* save.h: the final save of a run whose weights are spread over its ranks (ZeRO shards, tensor-parallel slices,
 * pipeline stages): gathered tensor by tensor into the folder rank 0 writes. */
#ifndef SNUG_TRAIN_SAVE_H
#define SNUG_TRAIN_SAVE_H

#include <stddef.h>

#include "core/error.h"
#include "dist/comm.h"
#include "train/loop.h"
#include "train/run.h"

/* Rank 0 writes the folder, the weights gathered into it as a stream; the other ranks take part in each gather.
 * dpc: the data-parallel ranks; tpc: the tensor-parallel or pipeline ranks (NULL without); shard: ZeRO's shards. */
int snug_stream_save(snug_run *r, snug_comm *c, snug_comm *dpc, snug_comm *tpc, const size_t *shard, int *broken,
                     snug_error *e);

/* Pipeline parallelism under LoRA: every stage's adapters gathered; rank 0 writes the folder. */
int snug_pp_save_adapter(snug_run *r, snug_comm *c, snug_comm *ppc, int *broken, snug_error *e);

/* The end of a run that was not stopped (rc 0): the folder saved (gathered from the ranks where they hold parts of
 * it), load_best_model_at_end's weights taken from the best checkpoint, merge_lora's merged folder. Returns rc or
 * the save's failure. */
int snug_save_final(snug_loop *l, int rc, snug_error *e);

#endif
