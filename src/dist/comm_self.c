/* comm_self.c: the communicator of a single process (rank 0 of 1). Every collective over one rank is the identity,
 * so a one-process run issues the same calls as a multi-rank one and pays nothing for them. */
#include "dist/comm.h"

#include <string.h>

static int self_allreduce(snug_comm *c, void *x, size_t n, snug_comm_dtype dt, snug_error *e) {
    (void)x, (void)n, (void)dt, (void)e;
    c->seq++;
    return 0;
}

static int self_broadcast(snug_comm *c, void *x, size_t n, snug_comm_dtype dt, int root, snug_error *e) {
    (void)x, (void)n, (void)dt;
    c->seq++;
    if (root != 0)
        return snug_fail(e, SNUG_EINTERNAL, "broadcast from rank %d in a run of one rank", root);
    return 0;
}

static int self_barrier(snug_comm *c, snug_error *e) {
    (void)e;
    c->seq++;
    return 0;
}

static int self_sharded(snug_comm *c, void *x, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    (void)x, (void)counts, (void)dt, (void)e;
    c->seq++; /* one rank owns the whole buffer: its segment is already the sum and already gathered */
    return 0;
}

static void self_abort(snug_comm *c, int code) { (void)c, (void)code; }

static void self_free(snug_comm *c) { (void)c; }

static int self_split(snug_comm *c, int color, int key, snug_comm *out, snug_error *e) {
    (void)color, (void)key, (void)e;
    snug_comm_self_init(out);
    out->deterministic = c->deterministic, out->check = c->check, out->timeout_s = c->timeout_s;
    out->local_rank = c->local_rank;
    return 0;
}

void snug_comm_self_init(snug_comm *c) {
    memset(c, 0, sizeof *c);
    *c = (snug_comm){.name = "self", .rank = 0, .size = 1, .allreduce_sum = self_allreduce,
                     .broadcast = self_broadcast, .barrier = self_barrier,
                     .reduce_scatter_sum = self_sharded, .allgather = self_sharded, .wait = snug_comm_wait_done,
                     .abort = self_abort,
                     .split = self_split,
                     .send = NULL, .recv = NULL, /* point to point: there is no other rank */
                     .free = self_free};
}
