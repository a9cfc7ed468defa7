/* gather.h: ZeRO-3's gathers, layer by layer. Two buffers take turns holding one layer each of what a pass gathers
 * from every rank (ZeRO-3's shards of the parameters, QLoRA's 4-bit spans at ZeRO-3) or copies in from host memory
 * (an offloaded base), with the pass's next layer prefetched into the other buffer while one is read; and the
 * all-gathers that fill them over a communicator (snug_zero3_hook).
 *
 * Layer l goes to buffer l % 2, so a pass (forward 0, 1, ...; backward L-1, L-2, ...) reads one buffer while the
 * other fills. What a buffer holds outlives the pass: a layer still there is not gathered again. The owner (the
 * model) keeps the state, lays out the buffers, and says how a buffer is filled and how a prefetch is waited for
 * (snug_gather_io); nothing here knows what a layer is made of or how it moves. Every rank makes the same calls in
 * the same order, so the collectives the fills issue match across the ranks. */
#ifndef SNUG_DIST_GATHER_H
#define SNUG_DIST_GATHER_H

#include <stddef.h>

#include "core/error.h"
#include "dist/comm.h"

typedef struct snug_gather_pair {
    void *buf[2];   /* (the largest layer) each, laid out by the owner */
    int layer[2];   /* the layer each holds, -1 none */
    int prefetched; /* bit k: a prefetch may still be filling buf[k] (wait before touching it) */
} snug_gather_pair;

/* How the owner fills a buffer and waits for a prefetch. */
typedef struct snug_gather_io {
    /* layer l into buf[k] (g->layer[k] already says l): this rank's part copied in, the others' gathered; with
     * prefetch set it may still be running on return */
    void (*fill)(void *ud, int k, int l, int prefetch);
    void (*wait)(void *ud); /* the prefetch under way complete */
    void *ud;
} snug_gather_io;

/* Neither buffer holds a layer (at layout, or when their memory is about to hold something else). */
void snug_gather_pair_forget(snug_gather_pair *g);

/* A prefetch still running, waited for: before the buffers (or memory they share) are read or written again, and
 * before any other gather, whose own part's copy would race it. */
void snug_gather_pair_settle(snug_gather_pair *g, const snug_gather_io *io);

/* Layer l readable: its buffer (l % 2, returned) filled unless it holds l already (a prefetch of it waited for);
 * then layer `next` (-1: none) prefetched into the other buffer unless it holds it. */
int snug_gather_pair_layer(snug_gather_pair *g, int l, int next, const snug_gather_io *io);

/* ZeRO-3 (what the model's gather_params hook does, model.h's snug_gather_fn): the gather of table elements
 * [offset, offset + numel) into dst. Each rank's piece is its shard's part of the range (zero.h), and one all-gather
 * over those counts fills the others' in dst; a prefetch is issued SNUG_COMM_ASYNC, and dst NULL is the wait for it.
 * The context keeps the first error in rc and e: once rc is set, nothing more is issued (the caller checks rc after
 * the pass); counts is caller-allocated scratch of comm->size elements. */
typedef struct snug_zero3_hook {
    snug_comm *comm;
    const size_t *shard; /* each rank's elements of the table */
    size_t *counts;      /* scratch: the range's elements in each rank's shard */
    snug_comm_dtype dt;  /* as the parameters are stored: F32 or U16 */
    int rc;
    snug_error e;
} snug_zero3_hook;

void snug_zero3_gather(snug_zero3_hook *c, void *dst, size_t offset, size_t numel, int prefetch);
/* QLoRA at ZeRO-3 (the model's gather_q4 hook, model.h's snug_gather_q4_fn): every rank's piece is `piece` bytes,
 * so the counts are equal; the same context (its comm, counts scratch and error), shard unused. */
void snug_zero3_gather_q4(snug_zero3_hook *c, void *dst, size_t piece, int prefetch);

#endif
