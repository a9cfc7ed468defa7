/* reshard.h: a checkpoint's sharded state read onto another split of the ranks (resuming on another number of ranks,
 * or across ZeRO stages 0 to 2).
 *
 * ZeRO's sharded arenas are laid out over a range [lo, hi) of the flat parameter layout (dist/zero.h): the fp32
 * master copy and stage 3's parameters are that range's elements in order; the optimizer state is each tensor's part
 * of the range, in table order, in each of its buffers (optim.h: m and v for fp32 state, the 8-bit codes qm and qv and
 * one absmax per block of 256 in am and av). A checkpoint written over other ranges holds the same elements' state in
 * other files: this rank's range is assembled from the pieces of those ranges that overlap it. The layout of each
 * source file is the layout code's own for the source's range (counted, not allocated), so a file is read exactly
 * where the writer's arena held each piece. Every shard edge lies on a tensor's quantization blocks, so 8-bit state
 * moves in whole blocks with their absmax, the bits the optimizer would have had there. */
#ifndef SNUG_TRAIN_RESHARD_H
#define SNUG_TRAIN_RESHARD_H

#include <stddef.h>

#include "core/arena.h"
#include "core/error.h"
#include "train/engine.h"

/* One file of a checkpoint's sharded arena and the range of the flat layout it holds. */
typedef struct snug_shard_src {
    size_t lo, hi;
    const char *path;
} snug_shard_src;

/* This rank's part of arena c of eng (SNUG_MEM_OPTIM, SNUG_MEM_MASTER, or at ZeRO stage 3 SNUG_MEM_PARAMS; over this
 * rank's range, or the whole layout when the arena is not sharded) from the n source files. A file shorter than its
 * range's layout is an error naming it. */
int snug_reshard_read(snug_engine *eng, snug_category c, const snug_shard_src *src, int n, snug_error *e);

#endif
