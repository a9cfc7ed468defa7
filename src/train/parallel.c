/* parallel.c: the machinery of a run over several ranks (see parallel.h). */
#include "train/parallel.h"

#include <math.h>
#include <stdio.h>
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

void snug_step_in_backward(snug_step_in_backward_ctx *c, int layer) {
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

void snug_tp_reduce(snug_tp_hook *h, float *buf, size_t n) {
    if (!h->rc)
        h->rc = h->comm->allreduce_sum(h->comm, buf, n, SNUG_COMM_F32, &h->e);
}

/* Tensor parallelism's gather (the model's tp_gather): every rank's n doubles, in host memory. */
void snug_tp_gather(snug_tp_hook *h, double *buf, size_t n) {
    for (int r = 0; r < h->comm->size; r++)
        h->counts[r] = n;
    if (!h->rc)
        h->rc = h->comm->allgather(h->comm, buf, h->counts, SNUG_COMM_F64 | SNUG_COMM_HOST, &h->e);
}

/* The model's hooks (parallel.h's snug_parallel.ops; ud: the snug_parallel): each finds its state in the object. */
static void op_gather_params(void *ud, void *dst, size_t offset, size_t numel, int prefetch) {
    snug_zero3_gather(&((snug_parallel *)ud)->z3, dst, offset, numel, prefetch);
}

static void op_gather_q4(void *ud, void *dst, size_t piece, int prefetch) {
    snug_zero3_gather_q4(&((snug_parallel *)ud)->z3, dst, piece, prefetch);
}

static void op_grads_ready(void *ud, int layer, size_t offset, size_t numel) {
    (void)offset, (void)numel;
    snug_parallel *p = ud;
    if (p->ready == SNUG_READY_TO_ZERO2)
        snug_zero2_ready(&p->z2, layer);
    else if (p->ready == SNUG_READY_TO_STEP)
        snug_step_in_backward(&p->in_bwd, layer);
    else if (p->ready == SNUG_READY_TO_BUCKETS && p->armed)
        snug_ddp_bucket_ready(&p->buckets, layer);
}

static void op_rows(void *ud, int op, void *buf, size_t base, const int32_t *rows, int first, int n, int C) {
    snug_rows_op(&((snug_parallel *)ud)->zr, op, buf, base, rows, first, n, C);
}

static void op_tp_reduce(void *ud, float *buf, size_t n) { snug_tp_reduce(&((snug_parallel *)ud)->tph, buf, n); }

static void op_tp_gather(void *ud, double *buf, size_t n) { snug_tp_gather(&((snug_parallel *)ud)->tph, buf, n); }

/* The model's grads_ready on, reaching `to`. */
static void set_ready(snug_parallel *p, snug_ready_to to) {
    p->ready = to;
    p->ops.grads_ready = op_grads_ready;
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

/* The parallel object: see parallel.h. */

/* The groups of ranks, as the header tells them: data parallel, tensor parallelism's hooks and the whole model's
 * table, the pipeline's stages (and a tied head's communicator of its ends). */
static int open_groups(snug_parallel *p, FILE *out, int rc, snug_error *e) {
    snug_run *r = p->r;
    const snug_run_config *o = &r->s.c;
    snug_comm *dp = p->dp, *tp = p->tp;
    int W = dp->size, GA = o->gradient_accumulation_steps * W, GAr = o->gradient_accumulation_steps;
    int B = o->micro_batch_size, T = o->sequence_len;
    if (snug_ddp_collectives(dp))
        fprintf(out, "  data parallel        %d rank%s (%s, launched by %s%s), %d micro-batches of %d rows per step\n", W,
                W == 1 ? "" : "s", r->comm.name, r->launch.launcher, r->comm.deterministic ? ", gradients summed in rank order" : "", GA, B);
    p->tph.comm = tp;
    if (r->tpn > 1) {
        const snug_model_config *lc = &r->eng.model.cfg;
        fprintf(out, "  tensor parallel      %d ranks (%s, launched by %s%s): each holds %d of %d query heads, "
                "%d of %d key/value heads and %d of %d MLP rows of every block, and %s; 4 all-reduces of %d x %d per block "
                "and micro-batch\n", r->tpn, r->comm.name, r->launch.launcher,
                r->comm.deterministic ? ", summed in rank order" : "",
                lc->n_head, r->s.cfg.n_head, lc->n_kv_head, r->s.cfg.n_kv_head, lc->intermediate_size,
                r->s.cfg.intermediate_size, r->eng.model.tp_vocab ? "its rows of the vocabulary (embedding, head)"
                                                                : "the whole vocabulary", B * T, lc->hidden_size);
        if (r->eng.model.tp_vocab)
            fprintf(out, "                       vocabulary split: %d of %d rows per rank; the lookup and the final "
                    "norm's gradient summed over the ranks, each token's loss statistics gathered\n", lc->vocab_size,
                    r->s.cfg.vocab_size);
        else
            fprintf(out, "                       vocabulary whole on every rank (%s)\n",
                    r->on_gpu ? "the loss over blocks of the head's rows is not built for GPUs yet"
                           : "its size does not divide by tensor_parallel_size");
        p->ops.tp_reduce = op_tp_reduce;
        p->ops.tp_gather = op_tp_gather;
        rc = snug_param_table_build(&p->tp_whole, &r->s.cfg, e);
        if (!rc && !(p->tph.counts = calloc((size_t)tp->size, sizeof *p->tph.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for tensor parallelism");
    }
    p->pipe.c = tp;
    if (r->ppn > 1) {
        fprintf(out, "  pipeline parallel    %d stages (%s, launched by %s), 1F1B over each step's %d micro-batch%s "
                "(the bubble: %d of every %d stage-slots idle); per micro-batch %d x %d floats to the next stage and "
                "their gradient back; %s\n", r->ppn, r->comm.name, r->launch.launcher, GAr, GAr == 1 ? "" : "es", r->ppn - 1,
                GAr + r->ppn - 1, B * T, r->s.cfg.hidden_size,
                o->pipeline_recompute ? "a stage before the last keeps each micro-batch's input and runs its forward "
                                        "again before its backward (pipeline_recompute)"
                                      : "stage s keeps the activations of the N - s micro-batches it has in flight");
        for (int q = 0; q < r->ppn; q++) {
            int l0, nl;
            snug_pp_layers(r->s.cfg.n_layer, r->ppn, r->s.spec.pp_split, q, &l0, &nl);
            char span[32];
            snprintf(span, sizeof span, nl == 1 ? "layer %d" : "layers %d-%d", l0, l0 + nl - 1);
            fprintf(out, "                       stage %d: %s%s%s\n", q, span,
                    q == 0 ? ", the embedding" : "",
                    q < r->ppn - 1 ? ""
                    : r->s.cfg.tie_embeddings ? ", the final norm, the tied head (the embedding again, its gradient "
                                               "summed with stage 0's)"
                                             : ", the final norm, the head");
        }
        if (GAr < r->ppn)
            fprintf(out, "                       (gradient_accumulation_steps %d < %d stages: some stage is always "
                    "idle; raise it to keep the pipeline full)\n", GAr, r->ppn);
        /* a tied head: the first and last stages sum its gradient (the pipeline itself when there are two) */
        if (!rc && r->s.cfg.tie_embeddings && r->ppn > 2) {
            int end = tp->rank == 0 || tp->rank == r->ppn - 1;
            rc = tp->split(tp, end ? 0 : 1, tp->rank, &r->endc, e);
            p->pipe.ends = end ? &r->endc : NULL;
        } else if (r->s.cfg.tie_embeddings) {
            p->pipe.ends = tp;
        }
    }
    return rc;
}

/* The line of the header that says how ZeRO shards the model (each rank holds least to most parameters). */
static void report_zero(FILE *out, const snug_run_config *o, const snug_model *zm, size_t least, size_t most) {
    if (o->optimizer_in_backward && !zm->lora.on && zm->param_sharded) {
        fprintf(out, "  ZeRO                 stage 3 with the step inside backward: parameters, optimizer "
                "state%s sharded, %zu to %zu parameters per rank (edges on %d-element blocks); each layer's "
                "gradients reduce-scattered as backward completes them%s and the rank's part stepped once "
                "summed (no shard of gradients kept), parameters all-gathered layer by layer before each "
                "forward and backward\n",
                zm->master_sharded ? " and the master copy" : "", least, most, SNUG_Q8_BLOCK,
                zm->lv.zero_overlap ? " beside the next layer's backward (zero_overlap_comm: two layer buffers)"
                                    : "");
    } else if (o->optimizer_in_backward && !zm->lora.on) {
        fprintf(out, "  ZeRO                 stage %d with the step inside backward: optimizer state%s sharded, %zu "
                "to %zu parameters per rank (edges on %d-element blocks); each layer's gradients summed as "
                "backward completes them, its shard stepped and its parameters all-gathered\n", o->zero_stage,
                zm->master_sharded ? " and the master copy" : "", least, most, SNUG_Q8_BLOCK);
    } else if (zm->lora.on) {
        fprintf(out, "  ZeRO                 stage 3 under LoRA: the frozen base sharded, %zu to %zu parameters "
                "per rank (edges on %d-element blocks), all-gathered layer by layer before each forward and "
                "backward, the next layer prefetched; the adapters, their gradients (summed after backward) "
                "and their optimizer state whole on every rank\n", least, most, SNUG_Q8_BLOCK);
    } else {
        fprintf(out, "  ZeRO                 stage %d: %s sharded, %zu to %zu parameters per rank (edges on "
                "%d-element blocks); gradients reduce-scattered%s, parameters all-gathered%s\n", o->zero_stage,
                o->zero_stage >= 3   ? "parameters, optimizer state and gradients"
                : o->zero_stage >= 2 ? "optimizer state and gradients"
                                     : "optimizer state",
                least, most, SNUG_Q8_BLOCK,
                o->zero_stage < 2 ? " in buckets during the last micro-batch's backward"
                : zm->lv.zero_overlap ? " layer by layer in every micro-batch's backward, each beside the next "
                                        "layer's (zero_overlap_comm: two layer buffers)"
                                      : " layer by layer in every micro-batch's backward",
                zm->param_sharded ? " layer by layer before each forward and backward, the next layer prefetched"
                                  : " after the step");
    }
    if (zm->param_sharded)
        fprintf(out, "  ZeRO-3 gathers       into one region of %zu elements: two layer buffers of %zu, or the "
                "%zu global parameters%s\n", zm->gregion_n, zm->gbuf_n, zm->gglob_n,
                zm->gsplit  ? " before or after the layers (an untied head: one set at a time)"
                : zm->vtied ? " beside a block of the head's rows or the rows the micro-batch looks up"
                            : "");
}

/* ZeRO's shards of the table (each rank's elements; none for a sharded 4-bit base, cut in equal pieces), and the
 * header's lines on the shards and the offloaded base. */
static int open_shards(snug_parallel *p, FILE *out, int rc, snug_error *e) {
    snug_run *r = p->r;
    const snug_run_config *o = &r->s.c;
    int W = p->dp->size;
    const snug_model *qm = &r->eng.model;
    if (!rc && qm->q4_parts > 1) {
        size_t most = 0;
        for (int l = 0; l < qm->cfg.n_layer; l++)
            most = qm->q4_piece[l] > most ? qm->q4_piece[l] : most;
        fprintf(out, "  ZeRO                 stage 3 under %s: the %s matrices sharded, %.1f MiB per rank (each "
                "layer's cut in %d pieces of up to %.2f MiB), all-gathered layer by layer before each forward and "
                "backward, the next layer prefetched; the 16-bit tensors, the adapters, their gradients (summed "
                "after backward) and their optimizer state whole on every rank\n",
                qm->lv.lora.q4_type == SNUG_Q4_INT8 ? "LoRA on an 8-bit base" : "QLoRA",
                snug_q4_width((snug_q4_type)qm->lv.lora.q4_type), qm->q4_shard_n / 1048576.0, W,
                most / 1048576.0);
    }
    if (!rc && qm->param_sharded && qm->lv.offload_params)
        fprintf(out, "  offload_params       the frozen base in host memory (%.1f MiB%s), each layer's copied to the "
                "device just before it runs and the next layer's while it does, into the gather region\n",
                (double)qm->pshard_n * snug_dtype_size(qm->lv.dt) / 1048576.0, o->zero_stage >= 3 && W > 1
                ? ", this rank's shard" : "");
    if (!rc && qm->q4_sharded && qm->lv.offload_params)
        fprintf(out, "  offload_params       the %s base in host memory (%.1f MiB%s), each layer's copied to the "
                "device just before it runs and the next layer's while it does, into two buffers of %.2f MiB\n",
                snug_q4_width((snug_q4_type)qm->lv.lora.q4_type), qm->q4_shard_n / 1048576.0,
                qm->q4_parts > 1 ? ", this rank's pieces" : "", qm->q4_gbuf_n / 1048576.0);
    if (!rc && o->zero_stage && W > 1 && qm->q4_parts <= 1) {
        if (!(p->shard = malloc((size_t)W * sizeof *p->shard)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        else
            snug_plan_zero_counts(&r->s.spec, &r->eng.model.table, p->shard);
        if (p->shard) {
            size_t most = 0, least = (size_t)-1;
            for (int q = 0; q < W; q++) {
                most = p->shard[q] > most ? p->shard[q] : most;
                least = p->shard[q] < least ? p->shard[q] : least;
            }
            report_zero(out, o, &r->eng.model, least, most);
        }
    }
    if (r->eng.model.vb)
        fprintf(out, "  loss                 over blocks of %d of the head's %d rows (loss_vocab_block)%s\n",
                r->eng.model.vb, r->eng.model.cfg.vocab_size,
                !r->eng.model.vtied ? ""
                : r->eng.model.param_sharded ? "; the tied embedding gathered a block (and the looked-up rows) at a time, "
                                              "its gradient reduced block by block"
                                            : "; the tied embedding's gradient reduced block by block");
    return rc;
}

/* The model's hooks that talk to the other ranks during a step (rank_hooks.h): ZeRO-2/3's reduce-scatter and
 * gathers, the rows of a tied embedding, DDP's buckets (counted once here, as a backward forms them). */
static int open_hooks(snug_parallel *p, FILE *out, int rc, snug_error *e) {
    snug_run *r = p->r;
    const snug_run_config *o = &r->s.c;
    snug_comm *dp = p->dp;
    int W = dp->size;
    p->z2 = (snug_zero2_hook){.m = &r->eng.model, .comm = dp, .shard = p->shard};
    if (!rc && p->shard && r->eng.model.lv.zero_grads) {
        if (!(p->z2.counts = malloc((size_t)W * sizeof *p->z2.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        set_ready(p, SNUG_READY_TO_ZERO2);
    }
    p->z3 = (snug_zero3_hook){.comm = dp, .shard = p->shard,
                    .dt = r->eng.model.lv.dt == SNUG_DT_F32 ? SNUG_COMM_F32 : SNUG_COMM_U16};
    if (!rc && p->shard && r->eng.model.param_sharded) {
        if (!(p->z3.counts = malloc((size_t)W * sizeof *p->z3.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        p->ops.gather_params = op_gather_params;
    }
    if (!rc && r->eng.model.q4_parts > 1) { /* equal byte pieces: no counts from the table */
        if (!(p->z3.counts = malloc((size_t)W * sizeof *p->z3.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        p->ops.gather_q4 = op_gather_q4;
    }
    if (!rc && r->eng.model.lora.dora_pending) /* (every rank: the base's layers gathered in turn) */
        snug_lora_dora_start(&r->eng.model);
    p->zr = (snug_rows_hook){.z2 = &p->z2, .z3 = r->eng.model.param_sharded ? &p->z3 : NULL};
    if (!rc && p->shard && r->eng.model.vtied) {
        if (!(p->zr.counts = malloc((size_t)W * sizeof *p->zr.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        p->ops.rows = op_rows;
    }
    /* DDP and ZeRO-1 sum the gradients in buckets during the last micro-batch's backward (the adapters' stay one
     * sum; ZeRO-2/3 reduce every micro-batch's, snug_zero2_ready) */
    p->buckets = (snug_ddp_buckets){.m = &r->eng.model, .comm = dp, .shard = p->shard,
                              .cap = (size_t)o->ddp_bucket_cap_mb << 20, .count_only = 1};
    p->bucketed = snug_ddp_collectives(dp) && !(p->shard && r->eng.model.lv.zero_grads) && !o->optimizer_in_backward &&
                   !r->eng.model.lora.on && !(dp->size == 1 && r->eng.model.grads16);
    if (!rc && p->bucketed && p->shard && !(p->buckets.counts = malloc((size_t)W * sizeof *p->buckets.counts)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
    for (int l = r->eng.model.cfg.n_layer - 1; !rc && p->bucketed && l >= -1; l--) /* the buckets a backward forms */
        snug_ddp_bucket_ready(&p->buckets, l);
    if (p->bucketed) { /* armed during the last micro-batch's backward only (snug_parallel_backward) */
        set_ready(p, SNUG_READY_TO_BUCKETS);
        fprintf(out, "  gradient buckets     %d of up to %d MiB, summed during the last micro-batch's backward\n",
                p->buckets.nbuckets, o->ddp_bucket_cap_mb);
        p->buckets.count_only = 0;
    }
    if (!rc && p->buckets.rc) {
        rc = p->buckets.rc;
        if (e)
            *e = p->buckets.e;
    }

    return rc;
}

/* optimizer_in_backward: the step inside backward, hooked to the model (or, at ZeRO-3, to the reduce-scatter). */
static int open_in_backward(snug_parallel *p, int rc, snug_error *e) {
    snug_run *r = p->r;
    const snug_run_config *o = &r->s.c;
    snug_comm *dp = p->dp, *tp = p->tp;
    int W = dp->size;
    /* (ZeRO-3 steps through the reduce-scatter hook, z2.step below) */
    int step_shard = o->optimizer_in_backward && !r->eng.model.lora.on && !p->z2.counts;
    p->in_bwd = (snug_step_in_backward_ctx){.eng = &r->eng, .comm = dp, .shard = step_shard ? p->shard : NULL,
                                            .whole = r->tpn > 1 ? &p->tp_whole : NULL,
                                            .tp_rank = r->tpn > 1 ? tp->rank : 0};
    if (!rc && p->in_bwd.shard && !(p->in_bwd.counts = malloc((size_t)W * sizeof *p->in_bwd.counts)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
    if (o->optimizer_in_backward && p->z2.counts) { /* ZeRO-3: each layer reduce-scattered, the rank's part stepped */
        p->z2.step = snug_step_group;
        p->z2.step_ud = &p->in_bwd;
    } else if (o->optimizer_in_backward) {
        set_ready(p, SNUG_READY_TO_STEP);
    }
    return rc;
}

int snug_parallel_open(snug_parallel *p, snug_run *r, FILE *out, snug_error *e) {
    memset(p, 0, sizeof *p);
    p->r = r;
    /* the model's hooks: p's table, each operation set below where the run uses it */
    r->eng.model.hooks = (snug_model_hooks){.ops = &p->ops, .ud = p};
    p->dp = r->dp;
    p->tp = r->tp;
    int rc = open_groups(p, out, 0, e);
    rc = open_shards(p, out, rc, e);
    rc = open_hooks(p, out, rc, e);
    return open_in_backward(p, rc, e);
}

int snug_parallel_backward(snug_parallel *p, const snug_micro_batch *mb, const uint64_t *seeds, int k0, int k1,
                           float scale, double *loss_sum, snug_error *e) {
    snug_run *r = p->r;
    snug_comm *tp = p->tp;
    int rc;
    /* pipeline parallelism: the rank's micro-batches through the stages (1F1B), the last stage's loss summed
     * over the pipeline */
    if (r->ppn > 1 && ((rc = snug_pipe_step(&p->pipe, &r->eng.model, mb + k0, seeds, k1 - k0, scale,
                                            p->bucketed ? &p->armed : NULL, loss_sum, e)) ||
                    (rc = tp->allreduce_sum(tp, loss_sum, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e)))) {
        p->r->broken = 1;
        return rc;
    }
    for (int k = k0; k < k1 && r->ppn <= 1; k++) {
        if (p->bucketed)
            p->armed = k == k1 - 1;
        snug_model_set_batch(&r->eng.model, mb[k].ids, mb[k].labels, mb[k].pos, mb[k].seg, mb[k].rows, mb[k].T);
        r->eng.model.lora.seed = seeds[k - k0];
        *loss_sum += snug_model_step(&r->eng.model, scale);
    }
    if (p->bucketed) {
        p->armed = 0;
        /* no micro-batch for this rank (an epoch's end): its zero gradients join the same buckets */
        for (int l = r->eng.model.cfg.n_layer - 1; k0 == k1 && l >= -1; l--)
            snug_ddp_bucket_ready(&p->buckets, l);
    }
    return 0;
}

void snug_parallel_skip(snug_parallel *p, int k0, int k1, int nmb) {
    snug_run *r = p->r;
    const snug_run_config *o = &r->s.c;
    int W = p->dp->size, GAr = o->gradient_accumulation_steps;
    /* a base laid out to be gathered (stage 3, or LoRA's offload_params): skip_step repeats the step's gathers
     * and its announcements */
    int gathers = r->eng.model.param_sharded || r->eng.model.q4_parts > 1;
    if (o->optimizer_in_backward && k0 == k1 && W > 1 && !gathers) {
        /* no micro-batch left for this rank at the end of an epoch: its zero gradients still join every
         * layer's sum, announced in backward's order (the last layer first, the global tensors last); with a
         * gathered base skip_step below announces them between the layers' gathers, as a step does */
        for (int l = r->eng.model.cfg.n_layer - 1; l >= -1; l--)
            snug_step_in_backward(&p->in_bwd, l);
    }
    /* ZeRO-2/3: a rank with fewer micro-batches than rank 0 (the end of an epoch) still joins each one's
     * collectives (ZeRO-3's gathers; the reduce-scatters, with zero gradients), in the step's order */
    for (int k = k1 - k0; (p->z2.counts || gathers) && k < (nmb < GAr ? nmb : GAr); k++)
        snug_model_skip_step(&r->eng.model, 1);
}

int snug_parallel_hook_error(const snug_parallel *p, snug_error *e) {
    const int *rc[] = {&p->z2.rc, &p->z3.rc, &p->in_bwd.rc, &p->buckets.rc, &p->tph.rc};
    const snug_error *why[] = {&p->z2.e, &p->z3.e, &p->in_bwd.e, &p->buckets.e, &p->tph.e};
    for (size_t k = 0; k < sizeof rc / sizeof *rc; k++)
        if (*rc[k]) {
            if (e)
                *e = *why[k];
            return *rc[k];
        }
    return 0;
}

void snug_parallel_step_in_backward_begin(snug_parallel *p, double lr) {
    p->r->eng.opt.step++;
    p->in_bwd.lr = lr;
}

int snug_parallel_reduce(snug_parallel *p, double *loss_sum, snug_error *e) {
    snug_run *r = p->r;
    const snug_run_config *o = &r->s.c;
    snug_comm *dp = p->dp;
    int rc;
    if ((rc = snug_parallel_hook_error(p, e))) {
        p->r->broken = 1;
        return rc;
    }
    if (snug_ddp_collectives(dp) && ((rc = dp->allreduce_sum(dp, loss_sum, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e)) ||
                  (p->bucketed && (rc = dp->wait(dp, e))) ||
                  (!p->bucketed && !o->optimizer_in_backward && !p->z2.counts &&
                   (rc = snug_ddp_reduce_grads(dp, &r->eng.model, e))))) {
        p->r->broken = 1;
        return rc;
    }
    if (r->ppn > 1 && (rc = snug_pipe_tied_sum(&p->pipe, &r->eng.model, e))) { /* a tied head's two parts */
        p->r->broken = 1;
        return rc;
    }
    return 0;
}

int snug_parallel_grad_norm(snug_parallel *p, float ls_scale, double *norm, snug_error *e) {
    snug_run *r = p->r;
    const snug_run_config *o = &r->s.c;
    snug_comm *dp = p->dp, *tp = p->tp;
    int rc;
    if (o->optimizer_in_backward) {
        double ss = r->eng.be->sumsq_take(r->eng.be);
        /* ZeRO-3 (a full fine-tune): each rank summed the squares of its parts of the sums; tensor parallelism:
         * of its slices (and rank 0 of the whole tensors) */
        if ((p->z2.step && (rc = dp->allreduce_sum(dp, &ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e))) ||
            (r->tpn > 1 && (rc = tp->allreduce_sum(tp, &ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e)))) {
            p->r->broken = 1;
            return rc;
        }
        *norm = sqrt(ss);
        return 0;
    }
    if (r->tpn > 1 && p->shard && !r->eng.model.lora.on) {
        if ((rc = snug_zero_tp_grad_norm(dp, tp, &p->tp_whole, &r->eng.model, p->shard, 1.0f / ls_scale, norm, e))) {
            p->r->broken = 1;
            return rc;
        }
    } else if (r->tpn > 1) {
        if ((rc = snug_tp_grad_norm(tp, &r->eng.model, &p->tp_whole, 1.0f / ls_scale, norm, e))) {
            p->r->broken = 1;
            return rc;
        }
    } else if (r->ppn > 1 && (!p->shard || r->eng.model.lora.on)) {
        if ((rc = snug_pipe_grad_norm(&p->pipe, &r->eng.model, 1.0f / ls_scale, norm, e))) {
            p->r->broken = 1;
            return rc;
        }
    } else if (!p->shard || r->eng.model.lora.on) { /* every rank holds every (adapter) gradient */
        *norm = snug_grad_norm_model(&r->eng.model, 1.0f / ls_scale);
    } else if ((rc = snug_zero_grad_norm(dp, r->ppn > 1 ? tp : NULL, &r->eng.model, p->shard, 1.0f / ls_scale, norm,
                                    e))) {
        p->r->broken = 1;
        return rc;
    }
    return 0;
}

int snug_parallel_after_step(snug_parallel *p, snug_error *e) {
    snug_run *r = p->r;
    snug_comm *dp = p->dp;
    int rc;
    /* ZeRO-3 gathers nothing here: the next forward gathers each layer as it needs it */
    if (p->shard && !r->eng.model.param_sharded && (rc = snug_zero_gather_params(dp, &r->eng.model, p->shard, e))) {
        p->r->broken = 1;
        return rc;
    }
    return 0;
}

void snug_parallel_free(snug_parallel *p) {
    free(p->shard);
    free(p->z2.counts);
    free(p->z3.counts);
    free(p->zr.counts);
    free(p->buckets.counts);
    free(p->in_bwd.counts);
    snug_param_table_free(&p->tp_whole);
    free(p->tph.counts);
}
