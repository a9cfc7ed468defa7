/* parallel.c: the machinery of a run over several ranks (see parallel.h). */
#include "train/parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "optim/optim.h"
#include "plan/plan.h"
#include "train/rank_hooks.h"

/* Zeroes every gradient buffer (fp32 and 16-bit) before a step's micro-batches accumulate into them. */
void snug_zero_grads(snug_model *m) {
    if (m->grads)
        m->be->zero(m->be, m->grads, m->grads_numel * sizeof(float));
    if (m->grads16)
        m->be->zero(m->be, m->grads16, m->grads16_numel * sizeof(uint16_t));
    if (m->lora.grads)
        m->be->zero(m->be, m->lora.grads, m->lora.table.total * sizeof(float));
    if (m->gshard)
        m->be->zero(m->be, m->gshard, m->gshard_n * sizeof(float));
}

/* ZeRO-1/2: the stored parameters (the 16-bit copy under 16-bit storage, else fp32; whole on every rank) from table
 * offset `at`, and their type for a collective. */
static void *stored_params(const snug_model *m, size_t at, snug_comm_dtype *dt) {
    *dt = m->lv.dt != SNUG_DT_F32 ? SNUG_COMM_U16 : SNUG_COMM_F32;
    return m->lv.dt != SNUG_DT_F32 ? (void *)(m->params16 + at) : (void *)(m->params + at);
}

/* Tensor i of the trainable table's gradient: the model's (fp32 or 16-bit), or under LoRA the adapters' (fp32). */
static void *trainable_grad(const snug_model *m, int i, snug_dtype *dt) {
    if (m->lora.on) {
        *dt = SNUG_DT_F32;
        return m->lora.grads + m->lora.table.e[i].offset;
    }
    return snug_model_grad(m, i, dt);
}

/* ZeRO-3 (a full fine-tune; snug_zero2_hook's step): the rank's part of the group's sum, reduce-scattered in place
 * by snug_zero2_ready, stepped there. The parameters are the rank's shard: the next gather reads them. */
void snug_step_group(void *ud, int group) {
    snug_step_in_backward_ctx *c = ud;
    snug_adamw_step_layer(&c->eng->opt, &c->eng->model, group, c->lr, 1.0f);
}

void snug_step_in_backward(void *ud, int layer, size_t offset, size_t numel) {
    (void)offset, (void)numel;
    snug_step_in_backward_ctx *c = ud;
    snug_model *m = &c->eng->model;
    snug_backend *be = c->eng->be;
    const snug_param_table *t = snug_model_trainable(m);
    snug_dtype dt;
    if (c->rc)
        return;
    for (int i = 0; c->comm->size > 1 && i < t->n; i++)
        if (t->e[i].layer == layer) {
            void *g = trainable_grad(m, i, &dt);
            if (dt != SNUG_DT_F32) /* snug_plan_levers keeps them fp32 when ranks sum them */
                c->rc = snug_fail(&c->e, SNUG_EINTERNAL, "layer %d: 16-bit gradients to sum over the ranks", layer);
            else
                c->rc = c->comm->allreduce_sum(c->comm, g, t->e[i].numel, SNUG_COMM_F32, &c->e);
            if (c->rc)
                return;
        }
    for (int i = 0; i < t->n; i++)
        if (t->e[i].layer == layer &&
            (!c->whole || c->tp_rank == 0 || snug_tp_slice_kind(&c->whole->e[i], &t->e[i]))) {
            void *g = trainable_grad(m, i, &dt);
            be->sumsq_acc(be, g, dt, t->e[i].numel);
        }
    snug_adamw_step_layer(&c->eng->opt, m, layer, c->lr, 1.0f);
    snug_grad_range r[SNUG_READY_MAX_RANGES];
    int nr = c->shard ? snug_model_ready_ranges(m, layer, r, SNUG_READY_MAX_RANGES) : 0;
    for (int k = 0; k < nr && k < SNUG_READY_MAX_RANGES && !c->rc; k++) { /* the stepped parts, gathered whole */
        snug_comm_dtype sdt;
        void *p = stored_params(m, r[k].offset, &sdt);
        memset(c->counts, 0, (size_t)c->comm->size * sizeof *c->counts);
        snug_add_range_counts(c->shard, c->comm->size, r[k].offset, r[k].offset + r[k].numel, c->counts);
        c->rc = c->comm->allgather(c->comm, p, c->counts, sdt, &c->e);
    }
    for (int i = 0; i < t->n; i++)
        if (t->e[i].layer == layer) {
            void *g = trainable_grad(m, i, &dt);
            be->zero(be, g, t->e[i].numel * snug_dtype_size(dt));
        }
}

void snug_tp_reduce(void *ud, float *buf, size_t n) {
    snug_tp_hook *h = ud;
    if (!h->rc)
        h->rc = h->comm->allreduce_sum(h->comm, buf, n, SNUG_COMM_F32, &h->e);
}

/* Tensor parallelism's gather (the model's tp_gather): every rank's n doubles, in host memory. */
void snug_tp_gather(void *ud, double *buf, size_t n) {
    snug_tp_hook *h = ud;
    for (int r = 0; r < h->comm->size; r++)
        h->counts[r] = n;
    if (!h->rc)
        h->rc = h->comm->allgather(h->comm, buf, h->counts, SNUG_COMM_F64 | SNUG_COMM_HOST, &h->e);
}

/* Tensor parallelism: the global gradient norm (times grad_scale). The squares of the sliced tensors' gradients are
 * summed over the ranks; those of the whole tensors, the same on every rank, count once. whole: the whole model's
 * table (which entries are sliced). */
int snug_tp_grad_norm(snug_comm *c, const snug_model *m, const snug_param_table *whole, float grad_scale,
                      double *norm, snug_error *e) {
    double ss[2] = {0, 0}; /* sliced, whole */
    for (int i = 0; i < m->table.n; i++) {
        snug_dtype dt;
        const void *g = snug_model_grad(m, i, &dt);
        ss[snug_tp_slice_kind(&whole->e[i], &m->table.e[i]) ? 0 : 1] += m->be->sumsq(m->be, g, dt,
                                                                                      m->table.e[i].numel);
    }
    SNUG_TRY(c->allreduce_sum(c, ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e));
    *norm = sqrt(ss[0] + ss[1]) * fabs((double)grad_scale);
    return 0;
}

/* Whether the step's collectives run: with several ranks, or through NCCL at one rank (each an identity there, but
 * NCCL's path, which is how one GPU tests it). */
int snug_ddp_collectives(const snug_comm *c) { return c->size > 1 || strcmp(c->name, "self"); }

/* Whether every rank got this far: a failure on one rank becomes a failure on all, so no rank waits for another
 * in a collective that will never come. The first failed rank's error (its code and message) goes to every rank,
 * so each reports why (a damaged file that only that rank reads, named on every rank). */
int snug_ddp_agree(snug_comm *c, int rc, int *broken, snug_error *e) {
    if (c->size == 1)
        return rc;
    int64_t *failed = calloc((size_t)c->size, sizeof *failed);
    snug_error ce = {0};
    if (!failed) {
        *broken = 1; /* the others wait in the all-reduce: mpirun ends them */
        return rc ? rc : snug_fail(e, SNUG_ENOMEM, "out of host memory agreeing with the other ranks");
    }
    failed[c->rank] = rc != 0;
    int crc = c->allreduce_sum(c, failed, (size_t)c->size, SNUG_COMM_I64 | SNUG_COMM_HOST, &ce);
    int first = -1;
    for (int r = 0; !crc && r < c->size && first < 0; r++)
        first = failed[r] ? r : -1;
    free(failed);
    /* the message as int64 words: its code, then its text */
    enum { WORDS = 1 + (sizeof ce.msg + 7) / 8 };
    int64_t msg[WORDS] = {0};
    if (!crc && first >= 0) {
        if (first == c->rank && e) {
            msg[0] = e->code;
            memcpy(msg + 1, e->msg, sizeof e->msg);
        }
        crc = c->broadcast(c, msg, WORDS, SNUG_COMM_I64 | SNUG_COMM_HOST, first, &ce);
    }
    if (crc) {
        *broken = 1;
        if (!rc && e)
            *e = ce;
        return rc ? rc : ce.code;
    }
    if (!rc && first >= 0) {
        char text[sizeof ce.msg];
        memcpy(text, msg + 1, sizeof text);
        text[sizeof text - 1] = '\0';
        return snug_fail(e, msg[0] ? (int)msg[0] : SNUG_EINPUT, "rank %d failed: %s", first, text);
    }
    return rc;
}

/* The sum over the ranks of the step's gradients after backward, in place, where backward did not sum them in
 * buckets (snug_ddp_bucket_ready): under LoRA (with or without ZeRO-3's sharded base) one all-reduce of the adapters'
 * gradients. */
int snug_ddp_reduce_grads(snug_comm *c, snug_model *m, snug_error *e) {
    if (!snug_ddp_collectives(c) || (c->size == 1 && m->grads16)) /* one rank keeps 16-bit layer gradients */
        return 0;
    if (m->lora.on) /* the adapters' gradients (fp32) are all that trains */
        return c->allreduce_sum(c, m->lora.grads, m->lora.table.total, SNUG_COMM_F32, e);
    return snug_fail(e, SNUG_EINTERNAL, "the gradients of %d ranks were not summed in backward", c->size);
}

/* ZeRO: the global gradient norm (times grad_scale) from each rank's shard, the squares summed over the ranks (in
 * rank order in the deterministic mode), and with `stages` (pipeline parallelism, an untied head) over those too.
 * The same sum as snug_grad_norm_model's over the whole buffer up to the order of the double additions. */
int snug_zero_grad_norm(snug_comm *c, snug_comm *stages, const snug_model *m, const size_t *shard, float grad_scale,
                        double *norm, snug_error *e) {
    size_t lo = snug_comm_displ(shard, c->rank);
    const float *g = m->lv.zero_grads ? m->gshard : m->grads + lo; /* ZeRO-2 keeps only the shard's sum */
    double ss = shard[c->rank] ? m->be->sumsq(m->be, g, SNUG_DT_F32, shard[c->rank]) : 0.0;
    SNUG_TRY(c->allreduce_sum(c, &ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e));
    if (stages) /* pipeline parallelism: then over the stages */
        SNUG_TRY(stages->allreduce_sum(stages, &ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e));
    *norm = sqrt(ss) * fabs((double)grad_scale);
    return 0;
}

/* ZeRO beside tensor parallelism: the squares of the shard's part of each tensor, the sliced ones' and the whole
 * ones' apart, summed over the data-parallel ranks; the sliced ones' then over the tensor-parallel ranks (the whole
 * ones are the same on each). */
int snug_zero_tp_grad_norm(snug_comm *dpc, snug_comm *tpc, const snug_param_table *whole, const snug_model *m,
                           const size_t *shard, float grad_scale, double *norm, snug_error *e) {
    size_t lo = snug_comm_displ(shard, dpc->rank), hi = lo + shard[dpc->rank];
    const float *g = m->lv.zero_grads ? m->gshard : m->grads + lo;
    double ss[2] = {0, 0}; /* sliced, whole */
    for (int i = 0; i < m->table.n; i++) {
        size_t a = m->table.e[i].offset, b = a + m->table.e[i].numel;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (b > a)
            ss[snug_tp_slice_kind(&whole->e[i], &m->table.e[i]) ? 0 : 1] +=
                m->be->sumsq(m->be, g + (a - lo), SNUG_DT_F32, b - a);
    }
    SNUG_TRY(dpc->allreduce_sum(dpc, ss, 2, SNUG_COMM_F64 | SNUG_COMM_HOST, e));
    SNUG_TRY(tpc->allreduce_sum(tpc, ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e));
    *norm = sqrt(ss[0] + ss[1]) * fabs((double)grad_scale);
    return 0;
}

/* ZeRO: every rank's updated shard of the parameters to every rank (fp32, or the 16-bit copy forward reads). */
int snug_zero_gather_params(snug_comm *c, const snug_model *m, const size_t *shard, snug_error *e) {
    snug_comm_dtype dt;
    void *p = stored_params(m, 0, &dt);
    return c->allgather(c, p, shard, dt, e);
}
