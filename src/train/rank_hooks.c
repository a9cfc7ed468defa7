/* rank_hooks.c: the model's hooks that talk to the other ranks during a step (see rank_hooks.h). */
#include "train/rank_hooks.h"

#include <string.h>

#include "backend/backend.h"

/* The outstanding runs finished: waited for, this rank's segments added into its shard (or, with c->step, their
 * squares summed and the group stepped), their buffer zeroed. */
static void zero2_finish(snug_zero2_hook *c) {
    snug_model *m = c->m;
    snug_backend *be = m->be;
    if (c->npend && !c->rc)
        c->rc = c->comm->wait(c->comm, &c->e);
    for (int k = 0; !c->rc && k < c->npend; k++) {
        const snug_zero2_run *p = &c->pend[k];
        if (p->n && c->step)
            be->sumsq_acc(be, p->g + p->mine, SNUG_DT_F32, p->n);
        else if (p->n)
            be->accumulate(be, m->gshard + (p->lo + p->mine - m->gshard_lo), p->g + p->mine, p->n);
    }
    if (c->npend && !c->rc && c->step)
        c->step(c->step_ud, c->pend_group);
    for (int k = 0; !c->rc && k < c->npend; k++)
        be->zero(be, c->pend[k].g, (c->pend[k].hi - c->pend[k].lo) * sizeof(float));
    c->npend = 0;
}

void snug_zero2_ready(snug_zero2_hook *c, int layer) {
    snug_model *m = c->m;
    const snug_param_table *t = &m->table;
    zero2_finish(c); /* the previous layer's, whose buffer is not this one's */
    /* layer 0's, the last, at once: the embeddings' backward that follows it writes the pre-layer globals'
     * gradients, which share its buffer (model/grads.c's model_grad_offsets), and has little to overlap with */
    int async = m->lv.zero_overlap && layer > 0;
    for (int i = 0; !c->rc && i < t->n;) {
        if (snug_model_ready_group(m, i) != layer) {
            i++;
            continue;
        }
        int j = i; /* a run of the layer's tensors: contiguous in the table and in the layer buffer */
        while (j < t->n && snug_model_ready_group(m, j) == layer)
            j++;
        if (c->npend == SNUG_ZERO2_PENDING && c->step) { /* a group is one run: never here */
            c->rc = snug_fail(&c->e, SNUG_EINTERNAL, "layer %d: more than %d runs of gradients", layer,
                              SNUG_ZERO2_PENDING);
            return;
        }
        if (c->npend == SNUG_ZERO2_PENDING)
            zero2_finish(c);
        c->pend_group = layer;
        snug_zero2_run *p = &c->pend[c->npend];
        p->lo = t->e[i].offset, p->hi = t->e[j - 1].offset + t->e[j - 1].numel;
        p->g = m->grads + m->grad_off[i];
        memset(c->counts, 0, (size_t)c->comm->size * sizeof *c->counts);
        snug_add_range_counts(c->shard, c->comm->size, p->lo, p->hi, c->counts);
        p->mine = snug_comm_displ(c->counts, c->comm->rank), p->n = c->counts[c->comm->rank];
        c->rc = c->comm->reduce_scatter_sum(c->comm, p->g, c->counts, SNUG_COMM_F32 | (async ? SNUG_COMM_ASYNC : 0),
                                            &c->e);
        c->npend++;
        if (!async)
            zero2_finish(c);
        i = j;
    }
}

void snug_rows_op(snug_rows_hook *c, int op, void *buf, size_t base, const int32_t *rows, int first, int n, int C) {
    snug_zero2_hook *z2 = c->z2;
    int *rc = op != SNUG_ROWS_REDUCE && c->z3 ? &c->z3->rc : &z2->rc;
    snug_error *e = op != SNUG_ROWS_REDUCE && c->z3 ? &c->z3->e : &z2->e;
    snug_comm *comm = z2->comm;
    if (z2->rc || (c->z3 && c->z3->rc))
        return;
    if (op == SNUG_ROWS_REDUCE) /* the layers' outstanding reduce-scatters first: one group at a time */
        zero2_finish(z2);
    if (op == SNUG_ROWS_IDS) { /* n int32 per rank, moved as opaque 16-bit halves */
        for (int r = 0; r < comm->size; r++)
            c->counts[r] = 2 * (size_t)n;
        *rc = comm->allgather(comm, buf, c->counts, SNUG_COMM_U16 | SNUG_COMM_HOST, e);
        return;
    }
    /* the table ranges buf holds: one per row, or the block's rows as one */
    int nr = rows ? n : 1;
    size_t len = rows ? (size_t)C : (size_t)n * C;
#define RANGE_LO(j) (base + (size_t)(rows ? rows[j] : first) * C)
    memset(c->counts, 0, (size_t)comm->size * sizeof *c->counts);
    for (int j = 0; j < nr; j++)
        snug_add_range_counts(z2->shard, comm->size, RANGE_LO(j), RANGE_LO(j) + len, c->counts);
    if (op == SNUG_ROWS_GATHER) {
        *rc = comm->allgather(comm, buf, c->counts, c->z3->dt, e);
        return;
    }
    snug_model *m = z2->m;
    snug_backend *be = m->be;
    float *g = buf;
    *rc = comm->reduce_scatter_sum(comm, g, c->counts, SNUG_COMM_F32, e);
    size_t at = snug_comm_displ(c->counts, comm->rank), lo_s = m->gshard_lo, hi_s = lo_s + m->gshard_n;
    for (int j = 0; !*rc && j < nr; j++) { /* this rank's piece of the sum, range by range into its shard */
        size_t lo = RANGE_LO(j), hi = lo + len;
        size_t a = lo_s > lo ? lo_s : lo, b = hi_s < hi ? hi_s : hi;
        if (b > a) {
            be->accumulate(be, m->gshard + (a - lo_s), g + at, b - a);
            at += b - a;
        }
    }
    be->zero(be, g, (size_t)n * C * sizeof(float));
#undef RANGE_LO
}

static void ddp_flush(snug_ddp_buckets *c) {
    float *g = c->m->grads + c->lo;
    if (c->count_only) {
        c->nbuckets += c->hi > c->lo;
    } else if (!c->rc && c->hi > c->lo && c->shard) {
        memset(c->counts, 0, (size_t)c->comm->size * sizeof *c->counts);
        snug_add_range_counts(c->shard, c->comm->size, c->lo, c->hi, c->counts);
        c->rc = c->comm->reduce_scatter_sum(c->comm, g, c->counts, SNUG_COMM_F32 | SNUG_COMM_ASYNC, &c->e);
    } else if (!c->rc && c->hi > c->lo) {
        c->rc = c->comm->allreduce_sum(c->comm, g, c->hi - c->lo, SNUG_COMM_F32 | SNUG_COMM_ASYNC, &c->e);
    }
    c->lo = c->hi = 0;
}

void snug_ddp_bucket_ready(snug_ddp_buckets *c, int layer) {
    snug_model *m = c->m;
    snug_grad_range g[SNUG_READY_MAX_RANGES];
    int n = snug_model_ready_ranges(m, layer, g, SNUG_READY_MAX_RANGES);
    for (int i = 0; !c->rc && i < n && i < SNUG_READY_MAX_RANGES; i++) {
        if (g[i].dt != SNUG_DT_F32 || !g[i].data || (c->shard && g[i].at != g[i].offset)) {
            /* snug_plan_levers keeps them fp32 when ranks sum them; ZeRO-1 keeps them at the table offsets */
            c->rc = snug_fail(&c->e, SNUG_EINTERNAL, "layer %d: gradients to sum over the ranks that are not fp32 "
                              "(or, under ZeRO-1, not at their table offsets)", layer);
            return;
        }
        if (c->hi > c->lo && g[i].at + g[i].numel == c->lo) {
            c->lo = g[i].at;
        } else if (c->hi > c->lo && g[i].at == c->hi) {
            c->hi += g[i].numel;
        } else {
            ddp_flush(c);
            c->lo = g[i].at, c->hi = g[i].at + g[i].numel;
        }
        if ((c->hi - c->lo) * sizeof(float) >= c->cap)
            ddp_flush(c);
    }
    if (layer == -1) /* the last announcement of the micro-batch */
        ddp_flush(c);
}

