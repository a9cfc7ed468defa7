/* gather.c: two layer buffers taking turns, the next layer prefetched, and ZeRO-3's all-gathers (see gather.h). */
#include "dist/gather.h"

#include <string.h>

#include "dist/zero.h"

void snug_gather_pair_forget(snug_gather_pair *g) { g->layer[0] = g->layer[1] = -1; }

void snug_gather_pair_settle(snug_gather_pair *g, const snug_gather_io *io) {
    if (g->prefetched)
        io->wait(io->ud);
    g->prefetched = 0;
}

int snug_gather_pair_layer(snug_gather_pair *g, int l, int next, const snug_gather_io *io) {
    int k = l % 2;
    if (g->layer[k] != l) {
        snug_gather_pair_settle(g, io);
        g->layer[k] = l;
        io->fill(io->ud, k, l, 0);
    } else if (g->prefetched & (1 << k)) {
        snug_gather_pair_settle(g, io);
    }
    if (next >= 0 && g->layer[1 - k] != next) {
        g->layer[1 - k] = next;
        io->fill(io->ud, 1 - k, next, 1);
        g->prefetched |= 1 << (1 - k);
    }
    return k;
}

/* The all-gather of dst over c->counts (a prefetch issued SNUG_COMM_ASYNC), or with dst NULL the wait for one. */
static void zero3_issue(snug_zero3_hook *c, void *dst, snug_comm_dtype dt, int prefetch) {
    c->rc = dst ? c->comm->allgather(c->comm, dst, c->counts, dt | (prefetch ? SNUG_COMM_ASYNC : 0), &c->e)
                : c->comm->wait(c->comm, &c->e);
}

void snug_zero3_gather(snug_zero3_hook *c, void *dst, size_t offset, size_t numel, int prefetch) {
    if (c->rc)
        return;
    if (dst) {
        memset(c->counts, 0, (size_t)c->comm->size * sizeof *c->counts);
        snug_add_range_counts(c->shard, c->comm->size, offset, offset + numel, c->counts);
    }
    zero3_issue(c, dst, c->dt, prefetch);
}

void snug_zero3_gather_q4(snug_zero3_hook *c, void *dst, size_t piece, int prefetch) {
    if (c->rc)
        return;
    for (int r = 0; dst && r < c->comm->size; r++) /* opaque bytes as 16-bit halves (pieces: 64-byte multiples) */
        c->counts[r] = piece / 2;
    zero3_issue(c, dst, SNUG_COMM_U16, prefetch);
}
