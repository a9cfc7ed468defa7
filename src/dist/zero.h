/* zero.h: ZeRO's shard ranges over a flat, layer-contiguous buffer.
 *
 * Under ZeRO each rank owns one contiguous range of the flat parameter layout (parameter-table order: globals,
 * layer 0..L-1, final norm and head): it keeps the optimizer state of that range only, steps only that range after
 * the gradients are reduce-scattered onto it, and all-gathers the updated parameters (see comm.h's sharded
 * collectives, which take these counts). Rank r's range starts at the sum of counts[0..r-1].
 *
 * Edges: rank r's range would start at r x total / size; the edge moves down to the nearest point that is a tensor's
 * start plus a whole number of `block` elements, so that a tensor's blockwise state (8-bit AdamW's quantization
 * blocks, each with its absmax) is cut between blocks, never inside one, and every rank's part of a tensor is
 * exactly the blocks the whole tensor has there. Shards therefore differ by less than one block (plus the rounding
 * of total / size). Nothing else constrains an edge: the shards are addressed in the flat layout itself, so no
 * compact copy of a shard needs an alignment of its own. */
#ifndef SNUG_DIST_ZERO_H
#define SNUG_DIST_ZERO_H

#include <stddef.h>

/* counts[0..size-1] <- each rank's elements of [0, total); starts[0..n-1]: ascending tensor starts (starts[0] = 0). */
void snug_zero_shards(const size_t *starts, int n, size_t total, int size, size_t block, size_t *counts);

/* Adds to counts[r] the elements of table range [lo, hi) in rank r's shard (shard: each rank's elements, in order). */
void snug_add_range_counts(const size_t *shard, int size, size_t lo, size_t hi, size_t *counts);

#endif
