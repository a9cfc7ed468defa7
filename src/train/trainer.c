/* trainer.c: one training run end to end (see trainer.h). */
#include "train/trainer.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/backend_select.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "data/batching.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/generate.h"
#include "model/model.h"
#include "optim/optim.h"
#include "plan/autofit.h"
#include "plan/gpus.h"
#include "plan/plan.h"
#include "plan/plan_json.h"
#include "train/engine.h"
#include "train/loss_scale.h"
#include "train/merge.h"
#include "train/pipeline.h"
#include "train/rank_hooks.h"
#include "train/setup.h"
#include "train/state.h"
#include "train/tboard.h"

/* Everything a run holds; released by run_free whatever state it reached. */
typedef struct run {
    snug_setup s;              /* the resolved configuration, its model, plan and data */
    snug_batching_report brep; /* padding and efficiency of each way of batching the training set */
    snug_engine eng;
} run;

/* Zeroes every gradient buffer (fp32 and 16-bit) before a step's micro-batches accumulate into them. */
static void zero_grads(snug_model *m) {
    if (m->grads)
        m->be->zero(m->be, m->grads, m->grads_numel * sizeof(float));
    if (m->grads16)
        m->be->zero(m->be, m->grads16, m->grads16_numel * sizeof(uint16_t));
    if (m->lora.grads)
        m->be->zero(m->be, m->lora.grads, m->lora.table.total * sizeof(float));
    if (m->gshard)
        m->be->zero(m->be, m->gshard, m->gshard_n * sizeof(float));
}

/* The optimizer step inside backward (optimizer_in_backward): as soon as backward announces that a layer's
 * gradients are complete, sum them over the ranks (one all-reduce per tensor; each rank's backward announces the
 * layers in the same order), step that layer's tensors, add their sum of squares for the logged gradient norm into
 * the backend's accumulator (read once after the step: no wait per tensor), and zero the buffer the next layer
 * reuses. */
typedef struct step_in_backward_ctx {
    snug_engine *eng;
    snug_comm *comm;
    const size_t *shard; /* ZeRO-1/2: each rank's elements of the table (it steps its part of each layer, whose
                          * parameters are then all-gathered); NULL: every rank steps everything */
    size_t *counts;      /* (size) scratch: a range's elements in each rank's shard */
    double lr;
    /* tensor parallelism: the whole model's table; the squares of a tensor every rank holds whole are counted by
     * tensor-parallel rank 0 alone (the sum over the ranks is then the norm's) */
    const snug_param_table *whole;
    int tp_rank;
    int rc;        /* the first failed all-reduce of the step (then nothing more is reduced or stepped) */
    snug_error e;
} step_in_backward_ctx;

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
static void step_group(void *ud, int group) {
    step_in_backward_ctx *c = ud;
    snug_adamw_step_layer(&c->eng->opt, &c->eng->model, group, c->lr, 1.0f);
}

static void step_in_backward(void *ud, int layer, size_t offset, size_t numel) {
    (void)offset, (void)numel;
    step_in_backward_ctx *c = ud;
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

static void run_free(run *r) {
    snug_engine_free(&r->eng);
    snug_setup_free(&r->s);
}

/* Several ranks (data or tensor parallel): the settings they cannot take yet, refused before anything is read or
 * written. */
static int ddp_refuse(const snug_run_config *o, const snug_comm *c, int on_gpu, snug_error *e) {
    if (o->ddp_backend == SNUG_DDP_BACKEND_NCCL && !on_gpu)
        return snug_fail(e, SNUG_EINPUT, "ddp_backend is nccl but this run trains on the CPU (device: %s): NCCL moves "
                         "GPU buffers; use ddp_backend: mpi (or leave it unset) for CPU ranks, or device: cuda on a "
                         "machine with a GPU", o->device == SNUG_BACKEND_AUTO ? "auto, and no GPU is visible" : "cpu");
    if (c->size == 1)
        return 0;
    const char *why = !o->ddp && o->tensor_parallel_size <= 1 && o->pipeline_parallel_size <= 1
                          ? "ddp is false and tensor_parallel_size and pipeline_parallel_size are 1, and snug runs as "
                            "several ranks only as data, tensor or pipeline parallelism"
                      : on_gpu && o->ddp_backend == SNUG_DDP_BACKEND_MPI
                          ? "ddp_backend is mpi on CUDA ranks, which would stage every gradient through host memory "
                            "(not built); use ddp_backend: nccl (the default on GPUs)"
                      : NULL;
    if (!why)
        return 0;
    return snug_fail(e, SNUG_EINPUT, "%d ranks: %s; run one process, or change the setting", c->size, why);
}

/* Tensor parallelism's sum (the model's tp_reduce) over the world's ranks; a failure is kept for the step to report. */
typedef struct tp_hook {
    snug_comm *comm;
    size_t *counts; /* (size) the gather's */
    int rc;
    snug_error e;
} tp_hook;

static void tp_reduce(void *ud, float *buf, size_t n) {
    tp_hook *h = ud;
    if (!h->rc)
        h->rc = h->comm->allreduce_sum(h->comm, buf, n, SNUG_COMM_F32, &h->e);
}

/* Tensor parallelism's gather (the model's tp_gather): every rank's n doubles, in host memory. */
static void tp_gather(void *ud, double *buf, size_t n) {
    tp_hook *h = ud;
    for (int r = 0; r < h->comm->size; r++)
        h->counts[r] = n;
    if (!h->rc)
        h->rc = h->comm->allgather(h->comm, buf, h->counts, SNUG_COMM_F64 | SNUG_COMM_HOST, &h->e);
}

/* Tensor parallelism: the global gradient norm (times grad_scale). The squares of the sliced tensors' gradients are
 * summed over the ranks; those of the whole tensors, the same on every rank, count once. whole: the whole model's
 * table (which entries are sliced). */
static int tp_grad_norm(snug_comm *c, const snug_model *m, const snug_param_table *whole, float grad_scale,
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

/* Tensor parallelism: the world is groups of tensor_parallel_size ranks (data parallel across the groups, on CPU
 * ranks for now). */
static int tp_refuse(const snug_run_config *o, const snug_comm *c, int on_gpu, snug_error *e) {
    int t = o->tensor_parallel_size;
    if (c->size % t)
        return snug_fail(e, SNUG_EINPUT, "tensor_parallel_size is %d but %d rank%s: launch a multiple of it (mpirun "
                         "-np %d snug train ... for tensor parallelism alone, -np %d for 2 data-parallel groups of %d)",
                         t, c->size, c->size == 1 ? " runs" : "s run", t, 2 * t, t);
    if (!o->ddp && c->size > t)
        return snug_fail(e, SNUG_EINPUT, "%d ranks with tensor_parallel_size %d form %d data-parallel groups, but ddp "
                         "is false; launch %d ranks, or set ddp: true", c->size, t, c->size / t, t);
    if (on_gpu && c->size > t)
        return snug_fail(e, SNUG_EINPUT, "%d GPU ranks with tensor_parallel_size %d: data parallelism beside tensor "
                         "parallelism runs on CPU ranks only for now; launch %d GPU ranks, or set "
                         "tensor_parallel_size: 1", c->size, t, t);
    return 0;
}

/* Pipeline parallelism: the world is groups of pipeline_parallel_size ranks (data parallel across the groups), on
 * CPU ranks (the NCCL communicator has no point-to-point messages yet). */
static int pp_refuse(const snug_run_config *o, const snug_comm *c, int on_gpu, snug_error *e) {
    int p = o->pipeline_parallel_size;
    if (c->size % p)
        return snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size is %d but %d rank%s: launch a multiple of it (mpirun "
                         "-np %d snug train ... for one pipeline, -np %d for 2 data-parallel groups of %d)", p, c->size,
                         c->size == 1 ? " runs" : "s run", p, 2 * p, p);
    if (!o->ddp && c->size > p)
        return snug_fail(e, SNUG_EINPUT, "%d ranks with pipeline_parallel_size %d form %d data-parallel groups, but "
                         "ddp is false; launch %d ranks, or set ddp: true", c->size, p, c->size / p, p);
    if (on_gpu)
        return snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size %d on GPU ranks: pipeline parallelism runs on CPU "
                         "ranks only for now (the stages' messages are not built on NCCL); set device: cpu, or "
                         "pipeline_parallel_size: 1 (zero_stage: 3 shards a model too large for one GPU)", p);
    return 0;
}

/* Whether the step's collectives run: with several ranks, or through NCCL at one rank (each an identity there, but
 * NCCL's path, which is how one GPU tests it). */
static int ddp_collectives(const snug_comm *c) { return c->size > 1 || strcmp(c->name, "self"); }

/* Whether every rank got this far: a failure on one rank becomes a failure on all, so no rank waits for another
 * in a collective that will never come. The first failed rank's error (its code and message) goes to every rank,
 * so each reports why (a damaged file that only that rank reads, named on every rank). */
static int ddp_agree(snug_comm *c, int rc, int *broken, snug_error *e) {
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
static int ddp_reduce_grads(snug_comm *c, snug_model *m, snug_error *e) {
    if (!ddp_collectives(c) || (c->size == 1 && m->grads16)) /* one rank keeps 16-bit layer gradients */
        return 0;
    if (m->lora.on) /* the adapters' gradients (fp32) are all that trains */
        return c->allreduce_sum(c, m->lora.grads, m->lora.table.total, SNUG_COMM_F32, e);
    return snug_fail(e, SNUG_EINTERNAL, "the gradients of %d ranks were not summed in backward", c->size);
}

/* ZeRO: the global gradient norm (times grad_scale) from each rank's shard, the squares summed over the ranks (in
 * rank order in the deterministic mode), and with `stages` (pipeline parallelism, an untied head) over those too.
 * The same sum as snug_grad_norm_model's over the whole buffer up to the order of the double additions. */
static int zero_grad_norm(snug_comm *c, snug_comm *stages, const snug_model *m, const size_t *shard, float grad_scale,
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
static int zero_tp_grad_norm(snug_comm *dpc, snug_comm *tpc, const snug_param_table *whole, const snug_model *m,
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
static int zero_gather_params(snug_comm *c, const snug_model *m, const size_t *shard, snug_error *e) {
    snug_comm_dtype dt;
    void *p = stored_params(m, 0, &dt);
    return c->allgather(c, p, shard, dt, e);
}

/* ZeRO with a sharded master copy: the F32 weights DDP saves, streamed tensor by tensor. Each tensor's pieces (its
 * intersection with each rank's shard: counts[r] elements, which follow one another in the tensor as the shards do
 * in the table) are all-gathered into one tensor-sized buffer and rank 0 writes it, so no rank holds the whole
 * master copy. Every rank gathers the tensors in the file's order (snug_model_weights_order). ZeRO-3 under 16-bit
 * storage without master weights gathers the 16-bit shards as stored and widens them (the file keeps them 16-bit:
 * written back exactly, DDP's bytes). */
typedef struct master_stream {
    snug_comm *comm;     /* the world: the agreements before each tensor */
    snug_comm *dpc;      /* the data-parallel ranks, over which ZeRO shards (the world without tensor parallelism) */
    const snug_model *m;
    const size_t *shard; /* each data-parallel rank's elements of the table; NULL: every rank holds all of it */
    size_t *counts;      /* (world size) scratch: a tensor's elements in each rank's shard, or each rank's slice */
    int agreed;          /* the ranks agreed that one failed: none gathers or agrees again */
    int *broken;         /* set when a collective failed: the ranks no longer agree */
    /* tensor parallelism (m->tp > 1): its ranks, the whole model's table and a buffer of its largest tensor, where
     * the ranks' slices are gathered (each slice first gathered from the data-parallel shards under ZeRO) */
    snug_comm *tpc;
    snug_param_table whole;
    float *slices;
} master_stream;

/* Tensor parallelism: this rank's slice of tensor i as fp32 into host memory (the fp32 parameters or master copy,
 * else the 16-bit parameters widened). */
static int tp_local_f32(const snug_model *m, int i, float *dst, snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    if (m->params) {
        m->be->to_host(m->be, dst, m->params + p->offset, p->numel * sizeof *dst);
        return 0;
    }
    uint16_t *h = malloc(p->numel * sizeof *h);
    if (!h)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory gathering '%s' to save it", p->name);
    m->be->to_host(m->be, h, m->params16 + p->offset, p->numel * sizeof *h);
    for (size_t k = 0; k < p->numel; k++)
        dst[k] = m->lv.dt == SNUG_DT_BF16 ? snug_bf16_to_f32(h[k]) : snug_f16_to_f32(h[k]);
    free(h);
    return 0;
}

static int master_gather(master_stream *ms, int i, float *dst, snug_error *e);

/* Tensor parallelism: tensor i of the whole model into dst on every rank. A tensor every rank holds whole is this
 * rank's; a sliced one is all-gathered (rank r's slice at r x its size in ms->slices) and each slice put in place.
 * Under ZeRO the rank's own tensor (its slice, or the whole one) is first gathered from the data-parallel shards. */
static int tp_gather_tensor(master_stream *ms, int i, float *dst, snug_error *e) {
    const snug_model *m = ms->m;
    const snug_param_entry *g = &ms->whole.e[i], *l = &m->table.e[i];
    int sliced = snug_tp_slice_kind(g, l);
    float *mine = sliced ? ms->slices + (size_t)ms->tpc->rank * l->numel : dst;
    SNUG_TRY(ms->shard ? master_gather(ms, i, mine, e) : tp_local_f32(m, i, mine, e));
    if (!sliced)
        return 0;
    for (int r = 0; r < ms->tpc->size; r++)
        ms->counts[r] = l->numel;
    SNUG_TRY(ms->tpc->allgather(ms->tpc, ms->slices, ms->counts, SNUG_COMM_F32 | SNUG_COMM_HOST, e));
    for (int r = 0; r < ms->tpc->size; r++)
        snug_tp_slice(g, l, r, dst, ms->slices + (size_t)r * l->numel, 1);
    return 0;
}

/* Pipeline parallelism: tensor i of the whole model into dst on every rank, broadcast from the stage holding it (the
 * first for the embedding, a tied head's too). */
static int pp_gather_tensor(master_stream *ms, int i, float *dst, snug_error *e) {
    const snug_model *m = ms->m;
    const snug_param_table *w = &ms->whole;
    const snug_param_entry *g = &w->e[i];
    int owner = snug_pp_stage_of(m->pp_L, m->pp, m->pp_split, g->layer, g->offset < w->layer_offset[0]);
    if (owner == m->pp_stage) { /* under ZeRO first gathered from the stage's data-parallel shards */
        int j = snug_param_table_find(&m->table, g->name);
        if (j < 0) /* the layout and the whole table disagree: a bug, not an input */
            return snug_fail(e, SNUG_EINTERNAL, "stage %d holds no '%s' to save", m->pp_stage, g->name);
        SNUG_TRY(ms->shard ? master_gather(ms, j, dst, e) : tp_local_f32(m, j, dst, e));
    }
    return ms->tpc->broadcast(ms->tpc, dst, g->numel, SNUG_COMM_F32 | SNUG_COMM_HOST, owner, e);
}

/* Pipeline parallelism under LoRA: the adapters of every stage gathered, tensor by tensor from the stage holding it,
 * into the whole model's adapter table (built on a model of the whole config); rank 0 writes the folder. The ranks
 * agree before the gathers and after the write, as stream_save does. */
static int pp_save_adapter(run *r, snug_comm *c, snug_comm *ppc, int *broken, snug_error *e) {
    const snug_model *m = &r->eng.model;
    snug_model w;
    memset(&w, 0, sizeof w);
    w.cfg = m->tp_cfg; /* the whole model's */
    w.lv = m->lv;
    w.be = m->be;
    size_t n = m->lora.table.total;
    int rc = snug_param_table_build(&w.table, &w.cfg, e);
    if (!rc)
        rc = snug_lora_build(&w, e);
    float *host = rc ? NULL : calloc(w.lora.table.total ? w.lora.table.total : 1, sizeof *host);
    float *mine = malloc((n ? n : 1) * sizeof *mine);
    if (!rc && (!host || !mine))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory gathering the adapters to save them");
    if (!rc)
        m->be->to_host(m->be, mine, m->lora.params, n * sizeof *mine);
    rc = ddp_agree(c, rc, broken, e);
    for (int i = 0; !rc && i < w.lora.table.n; i++) {
        const snug_param_entry *g = &w.lora.table.e[i];
        /* (the global ones: lora_modules_to_save's copies, the embedding's on the first stage, lm_head's on the
         * last) */
        int owner = snug_pp_stage_of(m->pp_L, m->pp, m->pp_split, g->layer, !strstr(g->name, "lm_head"));
        int j = owner == m->pp_stage ? snug_param_table_find(&m->lora.table, g->name) : -1;
        if (j >= 0)
            memcpy(host + g->offset, mine + m->lora.table.e[j].offset, g->numel * sizeof *host);
        if ((rc = ppc->broadcast(ppc, host + g->offset, g->numel, SNUG_COMM_F32 | SNUG_COMM_HOST, owner, e)))
            *broken = 1;
    }
    if (!rc && c->rank == 0)
        rc = snug_save_hf_folder_adapter(r->s.c.output_dir, &r->s, &r->eng, &w, host, e);
    if (!*broken)
        rc = ddp_agree(c, rc, broken, e);
    free(host);
    free(mine);
    snug_lora_free(&w.lora);
    snug_param_table_free(&w.table);
    return rc;
}

/* Tensor i of the table gathered from the data-parallel ranks' shards into dst (its numel floats) on every rank. */
static int master_gather(master_stream *ms, int i, float *dst, snug_error *e) {
    const snug_model *m = ms->m;
    const snug_param_entry *p = &m->table.e[i];
    size_t lo = p->offset, hi = lo + p->numel, s0 = 0;
    for (int r = 0; r < ms->dpc->size; s0 += ms->shard[r], r++) {
        size_t a = s0 > lo ? s0 : lo, b = s0 + ms->shard[r] < hi ? s0 + ms->shard[r] : hi;
        ms->counts[r] = b > a ? b - a : 0;
    }
    /* this rank's piece, from its shard of the master copy (ZeRO-3 fp32: of the parameters themselves) */
    size_t slo = m->master_sharded ? m->master_lo : m->pshard_lo, sn = m->master_sharded ? m->master_n : m->pshard_n;
    size_t a = slo > lo ? slo : lo, b = slo + sn < hi ? slo + sn : hi;
    if (m->params) {
        if (b > a)
            m->be->to_host(m->be, dst + (a - lo), m->params + (a - slo), (b - a) * sizeof *dst);
        return ms->dpc->allgather(ms->dpc, dst, ms->counts, SNUG_COMM_F32 | SNUG_COMM_HOST, e);
    }
    /* no fp32 copy (ZeRO-3, 16-bit without master weights): the 16-bit values gathered into dst's first half, then
     * widened in place from the last (value k's float covers 16-bit slots 2k and 2k+1, already read; memcpy keeps
     * the two views of the buffer in order) */
    unsigned char *raw = (unsigned char *)dst;
    if (b > a)
        m->be->to_host(m->be, raw + (a - lo) * sizeof(uint16_t), m->params16 + (a - slo), (b - a) * sizeof(uint16_t));
    SNUG_TRY(ms->dpc->allgather(ms->dpc, raw, ms->counts, SNUG_COMM_U16 | SNUG_COMM_HOST, e));
    for (size_t k = p->numel; k-- > 0;) {
        uint16_t h;
        memcpy(&h, raw + k * sizeof h, sizeof h);
        float v = m->lv.dt == SNUG_DT_BF16 ? snug_bf16_to_f32(h) : snug_f16_to_f32(h);
        memcpy(raw + k * sizeof v, &v, sizeof v);
    }
    return 0;
}

/* The stream's fill (snug_weights_fill), on every rank: the ranks first agree that each is still fine, so a rank
 * that failed (rank 0 writing the file, another allocating) is heard before the next gather instead of leaving the
 * others in it, then tensor i is gathered. */
static int master_fill(void *ud, int i, float *dst, snug_error *e) {
    master_stream *ms = ud;
    int rc = ddp_agree(ms->comm, 0, ms->broken, e);
    if (rc) {
        ms->agreed = 1;
        return rc;
    }
    if ((rc = ms->m->tp > 1   ? tp_gather_tensor(ms, i, dst, e)
              : ms->m->pp > 1 ? pp_gather_tensor(ms, i, dst, e)
                              : master_gather(ms, i, dst, e)))
        *ms->broken = 1;
    return rc;
}

/* The final save: rank 0 writes the folder, the master copy (or ZeRO-3's parameters, or tensor parallelism's slices)
 * gathered into it as a stream (above); the other ranks take part in each tensor's gather in the same order. Every
 * rank agrees once before each gather and once at the end (rank 0 once its save has returned, whether the folder is
 * whole or it failed; another rank after its last gather, or at once if it failed before its first), so the
 * agreements pair up however far the stream got, and a failure on any rank ends the save on all of them together
 * with that rank's error. *broken is set only when a collective itself failed. */
static int stream_save(run *r, snug_comm *c, snug_comm *dpc, snug_comm *tpc, const size_t *shard, int *broken,
                       snug_error *e) {
    const snug_model *m = &r->eng.model;
    int use_shard = m->master_sharded || m->param_sharded; /* the master copy or the parameters are shards */
    master_stream ms = {.comm = c, .dpc = dpc, .tpc = tpc, .m = m, .shard = use_shard ? shard : NULL,
                        .counts = calloc((size_t)c->size, sizeof(size_t)), .broken = broken};
    int split = m->tp > 1 || m->pp > 1; /* tensor or pipeline parallelism: the whole model's table */
    int rc = split ? snug_param_table_build(&ms.whole, &m->tp_cfg, e) : 0;
    const snug_param_table *t = split ? &ms.whole : &m->table; /* the tensors of the file */
    int n = t->n, *order = c->rank ? malloc((size_t)n * sizeof *order) : NULL;
    size_t largest = 0;
    for (int i = 0; i < n; i++)
        largest = t->e[i].numel > largest ? t->e[i].numel : largest;
    float *buf = c->rank ? malloc(largest * sizeof *buf) : NULL;
    ms.slices = m->tp > 1 ? malloc(largest * sizeof *ms.slices) : NULL;
    if (!rc && (!ms.counts || (c->rank && (!order || !buf)) || (m->tp > 1 && !ms.slices)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory gathering the weights to save them");
    if (!rc && c->rank == 0)
        rc = snug_save_hf_folder_stream(r->s.c.output_dir, &r->s, &r->eng, master_fill, &ms, e);
    if (!rc && c->rank)
        rc = snug_model_weights_order(m, order, e);
    for (int k = 0; !rc && c->rank && k < n; k++)
        rc = master_fill(&ms, order[k], buf, e);
    if (!ms.agreed && !*broken)
        rc = ddp_agree(c, rc, broken, e);
    free(ms.counts);
    free(ms.slices);
    snug_param_table_free(&ms.whole);
    free(order);
    free(buf);
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

/* The CPU runtime overhead with the data as read (plan/gpus.c). */
static void rank_overhead(const run *r, snug_overhead *ov) {
    snug_overhead_compute(ov, SNUG_DEVICE_CPU, &r->s.plan,
                          snug_data_host_bytes(r->s.train.ntokens + r->s.val.ntokens,
                                               r->s.train.nexamples + r->s.val.nexamples, r->s.c.sequence_len));
}

/* memory.json (or a rank's memory.rankR.json) in output_dir: this process's plan beside its measured peaks. */
static int rank_memory_json(const run *r, const char *file, const size_t *measured, snug_error *e) {
    snug_overhead ov;
    rank_overhead(r, &ov);
    char mj[4096];
    snug_path_join(mj, sizeof mj, r->s.c.output_dir, file);
    return snug_memory_json_write(mj, &r->s.spec, &r->s.plan, measured, &ov, peak_rss_bytes(), r->eng.be->name,
                                  (double)snug_backend_device_used(r->eng.be), e);
}

/* The batching the options ask for (src/data/batching.h); shuffle 0 keeps the dataset's order. */
static snug_batching_opts batching_opts(const run *r, int shuffle) {
    const snug_run_config *o = &r->s.c;
    snug_batching how = o->concatenate ? SNUG_BATCHING_CONCAT : o->sample_packing ? SNUG_BATCHING_PACK
                        : o->group_by_length ? SNUG_BATCHING_GROUP : SNUG_BATCHING_PAD;
    return (snug_batching_opts){.how = how, .B = o->micro_batch_size, .T = o->sequence_len,
                                .pad_to_sequence_len = o->pad_to_sequence_len,
                                .pad_to_multiple_of = o->pad_to_multiple_of, .shuffle = shuffle,
                                .seed = snug_data_seed(o), .pad_id = r->s.pad_id};
}

/* Every how many of total steps `count` per epoch over `epochs` epochs fall: ceil(total / (count x epochs)). */
static int per_epoch_every(int total, int count, int epochs) {
    long long d = (long long)count * (epochs > 0 ? epochs : 1);
    return (int)(((long long)total + d - 1) / d);
}

/* Mean loss over every supervised token of the validation set, batched as training is (NAN when it cannot be read).
 * Several ranks share the micro-batches, k on rank k % size; each micro-batch's loss lands in its own slot of an
 * array the ranks sum, where every slot has one non-zero term, so the sum is exact and the mean, added in micro-batch
 * order, has the bits of one process's. */
static int evaluate(run *r, snug_micro_batch mb, snug_comm *c, snug_pipe *pipe, double *val, snug_error *e) {
    snug_loader vl;
    snug_error le = {0};
    snug_batching_opts bo = batching_opts(r, 0);
    *val = NAN;
    if (snug_loader_init(&vl, &r->s.val, &bo, &le))
        return 0;
    double *loss = NULL;
    size_t n = 0, cap = 0, ntok = 0;
    while (snug_loader_next(&vl, &mb) > 0) {
        if (n == cap) {
            double *g = realloc(loss, (cap = cap ? 2 * cap : 64) * sizeof *g);
            if (!g) {
                free(loss);
                snug_loader_free(&vl);
                return snug_fail(e, SNUG_ENOMEM, "out of host memory for the validation losses");
            }
            loss = g;
        }
        loss[n] = 0;
        if ((int)(n % (size_t)c->size) == c->rank) {
            snug_model_set_batch(&r->eng.model, mb.ids, mb.labels, mb.pos, mb.seg, mb.rows, mb.T);
            int rc = 0;
            if (!pipe)
                loss[n] = snug_model_step(&r->eng.model, 0.0f);
            else if ((rc = snug_pipe_forward(pipe, &r->eng.model, &loss[n], e))) /* through the stages */
                free(loss);
            if (rc) {
                snug_loader_free(&vl);
                return rc;
            }
        } else { /* ZeRO-3: every rank joins the gathers of every micro-batch's forward */
            snug_model_skip_step(&r->eng.model, 0);
        }
        ntok += snug_count_supervised(mb.labels, (size_t)mb.rows * mb.T);
        n++;
    }
    snug_loader_free(&vl);
    int rc = c->size > 1 && n ? c->allreduce_sum(c, loss, n, SNUG_COMM_F64 | SNUG_COMM_HOST, e) : 0;
    if (!rc && pipe && n) /* the last stage's losses */
        rc = pipe->c->allreduce_sum(pipe->c, loss, n, SNUG_COMM_F64 | SNUG_COMM_HOST, e);
    double sum = 0;
    for (size_t i = 0; !rc && i < n; i++)
        sum += loss[i];
    free(loss);
    if (!rc && ntok)
        *val = sum / (double)ntok;
    return rc;
}

/* One terminal line, redrawn in place: progress, the step's metrics, and the time left. */
static void progress_bar(FILE *out, int step, int total, double loss, double lr, double norm, double tps, double rss,
                         double elapsed) {
    int width = 24, filled = (int)((double)step / total * width);
    double eta = step ? elapsed / step * (total - step) : 0;
    fprintf(out, "\r[");
    for (int i = 0; i < width; i++)
        fputc(i < filled ? '#' : '.', out);
    fprintf(out, "] %d/%d loss %.4f lr %.2e gnorm %.3f %.0f tok/s %.0f MiB eta %dm%02ds ", step, total, loss, lr,
            norm, tps, rss / 1048576.0, (int)eta / 60, (int)eta % 60);
    fflush(out);
}

static void print_sample(run *r, FILE *out) {
    const snug_run_config *o = &r->s.c;
    if (!o->sample_tokens || !r->s.tok)
        return;
    /* at stage 3 no rank holds the whole model to generate with (offload_params alone keeps it whole in host
     * memory, read from there) */
    if (r->eng.model.tp > 1 || r->eng.model.pp > 1) { /* its forward takes every rank */
        fprintf(out, "\nno sample: under %s parallelism no rank holds the whole model; sample from the saved "
                "folder with snug generate\n", r->eng.model.tp > 1 ? "tensor" : "pipeline");
        return;
    }
    if ((r->eng.model.param_sharded || r->eng.model.q4_sharded) && r->s.ranks > 1 && o->zero_stage >= 3) {
        fprintf(out, "\nno sample: under zero_stage 3 no rank holds the whole model; sample from the saved folder with "
                "snug generate%s\n", r->eng.model.lora.on ? " BASE_MODEL --adapter OUTPUT_DIR" : "");
        return;
    }
    snug_error e = {0};
    int32_t *prompt = NULL;
    size_t n = 0, cap = 0;
    if (r->s.enc.bos_id >= 0 && (prompt = malloc(16 * sizeof *prompt))) {
        cap = 16;
        prompt[n++] = r->s.enc.bos_id;
    }
    const char *text = o->sample_prompt;
    if (snug_tok_encode(r->s.tok, text, strlen(text), &prompt, &n, &cap, &e) < 0)
        n = 0;
    if (n == 0 && r->s.enc.eos_id >= 0) { /* an empty prompt starts after an end of text */
        int32_t *p = realloc(prompt, sizeof *p);
        if (p)
            (prompt = p)[n++] = r->s.enc.eos_id;
    }
    int T = (int)n + o->sample_tokens;
    if (T > r->s.cfg.max_position)
        T = r->s.cfg.max_position;
    /* a separate inference layout (B=1, no gradients) with the trained weights copied in; training is over, so
     * its gradients and optimizer state go first and sampling never raises the peak */
    for (int c = SNUG_MEM_GRADS; c <= SNUG_MEM_OPTIM; c++)
        snug_engine_release(&r->eng, (snug_category)c);
    /* the adapters on the fp32 base as training saw it (QLoRA's dequantized), in plain LoRA */
    snug_plan_spec spec = {.cfg = r->s.cfg, .B = 1, .T = T, .lv = {.ckpt_every = 1, .lora = r->eng.model.lv.lora},
                           .with_grads = 0};
    if (spec.lv.lora.kind == SNUG_ADAPTER_QLORA)
        spec.lv.lora.kind = SNUG_ADAPTER_LORA;
    snug_engine g = {0};
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    if (n > 0 && ids && snug_engine_create(&g, &spec, o->device, o->threads, &e) == 0) {
        size_t bytes = r->eng.model.table.total * sizeof(float);
        float *direct = snug_model_host_params(&r->eng.model);
        float *host = direct ? direct : malloc(bytes);
        if (host) {
            if (!direct)
                snug_model_get_params(&r->eng.model, host);
            g.be->to_device(g.be, g.model.params, host, bytes);
            if (!direct)
                free(host);
            if (g.model.lora.on) /* the trained adapters beside the base */
                snug_lora_copy(&g.model, &r->eng.model);
            snug_sampling s = {.temperature = (float)o->temperature, .top_k = o->top_k, .top_p = (float)o->top_p,
                               .seed = (uint64_t)o->seed};
            int got = 0, skip = r->s.enc.bos_id >= 0 ? 1 : 0;
            if (snug_generate_checked(&g.model, prompt, (int)n, T - (int)n, r->s.enc.eos_id, &s, ids, &got, &e)) {
                fprintf(out, "\nno sample: %s\n", e.msg); /* the trained model is saved; only the sample is missing */
            } else {
                if (got > skip && ids[got - 1] == r->s.enc.eos_id)
                    got--;
                char *txt = NULL;
                size_t len = 0;
                if (got >= skip && snug_tok_decode(r->s.tok, ids + skip, (size_t)(got - skip), &txt, &len, &e) == 0)
                    fprintf(out, "\nsample (temperature %.2f, top-k %d, top-p %.2f):\n%.*s\n", o->temperature,
                            o->top_k, o->top_p, (int)len, txt);
                free(txt);
            }
        }
    }
    snug_engine_free(&g);
    free(ids);
    free(prompt);
}

static void print_header(run *r, FILE *out, int total_steps, size_t batches_per_epoch) {
    const snug_run_config *o = &r->s.c;
    const snug_model_config *c = &r->s.cfg;
    fprintf(out, "snug: training %s (%s, %d layers, width %d, %d heads / %d kv heads, vocab %d)\n",
            o->base_model[0] ? o->base_model : o->model_preset, c->model_type, c->n_layer, c->hidden_size, c->n_head,
            c->n_kv_head, c->vocab_size);
    snug_param_table whole;
    if (r->eng.model.tp > 1 && !snug_param_table_build(&whole, c, NULL)) { /* tensor parallelism: the rank's share */
        fprintf(out, "  parameters           %zu (%.2fM), %lld (%.2fM) on each of %d tensor-parallel ranks\n",
                whole.total, whole.total / 1e6, r->s.plan.nparams, r->s.plan.nparams / 1e6, r->eng.model.tp);
        snug_param_table_free(&whole);
    } else if (r->eng.model.pp > 1 && !snug_param_table_build(&whole, c, NULL)) { /* this rank's stage */
        fprintf(out, "  parameters           %zu (%.2fM), %lld (%.2fM) on stage %d of %d\n", whole.total,
                whole.total / 1e6, r->s.plan.nparams, r->s.plan.nparams / 1e6, r->eng.model.pp_stage, r->eng.model.pp);
        snug_param_table_free(&whole);
    } else {
        fprintf(out, "  parameters           %lld (%.2fM)\n", r->s.plan.nparams, r->s.plan.nparams / 1e6);
    }
    if (o->unfrozen_parameters[0]) /* the rank's (stage's) tensors the patterns name */
        fprintf(out, "  unfrozen             %lld (%.2fM) of them train (unfrozen_parameters); the others are "
                "frozen: no optimizer state, no update\n", r->s.plan.ntrain, r->s.plan.ntrain / 1e6);
    fprintf(out, "  tokenizer            %s\n", r->s.tok_path[0] ? r->s.tok_path : "byte-level (256 bytes + end of text)");
    fprintf(out, "  data                 %zu examples, %zu tokens (validation: %zu examples)\n", r->s.train.nexamples,
            r->s.train.ntokens, r->s.val.nexamples);
    snug_data_report_print(out, "data files", &r->s.drep, r->s.dsrc, &r->s.dopts);
    if (o->ntest_datasets)
        snug_data_report_print(out, "validation files", &r->s.vrep, r->s.vsrc, &r->s.dopts);
    snug_batching_report_print(out, &r->brep);
    fprintf(out, "  batch                %d rows x %d tokens x %d accumulation = %lld tokens per step\n",
            o->micro_batch_size, o->sequence_len, o->gradient_accumulation_steps,
            (long long)o->micro_batch_size * o->sequence_len * o->gradient_accumulation_steps);
    fprintf(out, "  schedule             %d steps (%zu micro-batches per epoch), lr %g %s, warmup %d\n", total_steps,
            batches_per_epoch, o->learning_rate, snug_sched_name(o->lr_scheduler), snug_warmup_steps(o, total_steps));
    fprintf(out, "  optimizer            %s\n", snug_optim_name(r->s.spec.optim, r->s.spec.optim_paged));
    const snug_levers *lv = &r->s.spec.lv;
    if (lv->dt != SNUG_DT_F32)
        fprintf(out, "  precision            %s storage, fp32 compute, %s%s\n", lv->dt == SNUG_DT_BF16 ? "bf16" : "fp16",
                lv->master_weights ? "fp32 master weights" : "stochastic rounding (no master weights)",
                lv->dt == SNUG_DT_F16 ? ", dynamic loss scaling from 2^16" : "");
    else
        fprintf(out, "  precision            fp32\n");
    if (r->eng.be->gemm)
        fprintf(out, "  gemm                 %s\n", r->eng.be->gemm);
    if (r->s.fit_note[0])
        fprintf(out, "%s\n", r->s.fit_note);
    char who[96] = ""; /* several ranks: the plan is this rank's (rank 0's; under ZeRO each plans its shard) */
    if (r->s.spec.ranks > 1)
        snprintf(who, sizeof who, ", rank %d of %d%s", r->s.spec.rank, r->s.spec.ranks,
                 r->eng.opt.sharded           ? ", optimizer state of its ZeRO shard"
                 : r->eng.model.param_sharded || r->eng.model.q4_parts > 1 ? ", its shard of the frozen base"
                                              : "");
    if (!strcmp(r->eng.be->name, "cpu"))
        fprintf(out, "memory plan (backend cpu, %d threads%s):\n", r->eng.be->nthreads, who);
    else
        fprintf(out, "memory plan (backend %s%s):\n", r->eng.be->name, who);
    snug_plan_print(out, &r->s.plan, NULL);
}

static volatile sig_atomic_t stop_requested;

void snug_train_request_stop(void) { stop_requested = 1; }

/* The next step's micro-batches into mb: GA of them, or what is left of the epoch (as Hugging Face's Trainer); the
 * data position in st moves on. Returns how many; *epoch_end says whether the step finished an epoch. */
static int gather(snug_loader *l, snug_train_state *st, snug_micro_batch *mb, int GA, int *epoch_end) {
    int nmb = st->per_epoch && st->per_epoch - st->in_epoch < (size_t)GA ? (int)(st->per_epoch - st->in_epoch) : GA;
    for (int k = 0; k < nmb; k++)
        if (snug_loader_next(l, &mb[k]) == 0) { /* the end of an epoch: the next one starts, planned anew */
            st->per_epoch = snug_loader_batches_per_epoch(l); /* packing may give it a row more or less */
            snug_loader_next(l, &mb[k]);
        }
    st->in_epoch += (size_t)nmb;
    *epoch_end = st->per_epoch && st->in_epoch >= st->per_epoch;
    if (*epoch_end)
        st->in_epoch = 0, st->epochs_done++;
    return nmb;
}

/* metrics.jsonl of a resumed run: the lines of the steps up to the checkpoint, rewritten, the file then appended */
static FILE *reopen_metrics(const char *path, int upto, snug_error *e) {
    char *text = NULL;
    size_t len = 0;
    if (snug_read_file(path, &text, &len, e))
        return NULL;
    size_t keep = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        int step = -1;
        if (!nl || sscanf(line, "{\"step\": %d", &step) != 1 || step > upto)
            break;
        keep = (size_t)(nl + 1 - text);
        line = nl + 1;
    }
    int rc = snug_write_file_atomic(path, text, keep, e);
    free(text);
    if (rc)
        return NULL;
    FILE *f = fopen(path, "a");
    if (!f)
        snug_fail(e, SNUG_EIO, "%s: cannot append to the metrics log", path);
    return f;
}

int snug_train(const snug_run_config *config, FILE *out, snug_error *e) {
    run r;
    memset(&r, 0, sizeof r);
    int on_gpu = snug_backend_resolve(config->device) == SNUG_BACKEND_CUDA;
    /* the ranks: every rank runs this whole function on the same data; rank 0 alone prints and writes files */
    snug_launch launch;
    snug_comm comm;
    int broken = 0; /* a collective failed: the ranks no longer agree, so MPI is left for mpirun to end */
    SNUG_TRY(snug_launch_detect(&launch, e));
    SNUG_TRY(snug_comm_open(&comm, &launch, e));
    comm.deterministic = config->ddp_deterministic;
    comm.check = config->dist_debug;
    comm.timeout_s = config->dist_timeout;
    int lead = comm.rank == 0;
    FILE *quiet = lead ? NULL : fopen("/dev/null", "w");
    if (!lead)
        out = quiet ? quiet : out;
    /* tensor parallelism: groups of tpn consecutive ranks (tp, ranked by rank % tpn) split every block and run the
     * same micro-batches; the data-parallel groups (dp) are the ranks of one place in every group (ranked by
     * rank / tpn), or this rank alone when there is one group. So the world's rank is dp rank x tpn + tp rank. */
    /* Pipeline parallelism groups its stages the same way (ppn consecutive ranks, the stage its rank in tp, the
     * pipeline's communicator; the configuration refuses both splits at once). */
    int tpn = config->tensor_parallel_size > 1 ? config->tensor_parallel_size : 1;
    int ppn = config->pipeline_parallel_size > 1 ? config->pipeline_parallel_size : 1, gn = tpn > 1 ? tpn : ppn;
    snug_comm self, tpc = {0}, dpc = {0}, endc = {0}, *dp = &comm, *tp = &comm;
    snug_comm_self_init(&self);
    int rc = tpn > 1 ? tp_refuse(config, &comm, on_gpu, e) : ppn > 1 ? pp_refuse(config, &comm, on_gpu, e) : 0;
    if (!rc) /* the backend's choice holds for tensor parallelism's sums too */
        rc = ddp_refuse(config, &comm, on_gpu, e);
    if (!rc && gn > 1 && comm.size == gn) {
        dp = &self;
    } else if (!rc && gn > 1) {
        rc = comm.split(&comm, comm.rank / gn, comm.rank % gn, &tpc, e);
        if (!rc)
            rc = comm.split(&comm, comm.rank % gn, comm.rank / gn, &dpc, e);
        tp = &tpc;
        dp = &dpc;
    }
    /* CUDA ranks talk through NCCL (ddp_backend: nccl, or unset with several ranks), each on its local rank's GPU */
    int use_nccl = on_gpu && (config->ddp_backend == SNUG_DDP_BACKEND_NCCL ||
                              (config->ddp_backend == SNUG_DDP_BACKEND_AUTO && comm.size > 1));
    if (on_gpu)
        snug_backend_use_gpu(comm.local_rank);
    r.s.ranks = dp->size; /* ranks that sum gradients keep them fp32, as accumulation does */
    r.s.rank = dp->rank;  /* and under ZeRO each plans its own shard */
    r.s.tp_rank = tpn > 1 ? tp->rank : 0;
    r.s.pp_stage = ppn > 1 ? tp->rank : 0;
    r.s.agree = comm.size > 1 ? &comm : NULL; /* (auto_find_batch_size: the size every rank fits) */
    /* the checkpoint to resume from; one that leaves loss_vocab_block to its auto value (which follows the ZeRO
     * stage) takes the checkpoint's, so that it continues the same loss on another stage */
    char resume[4096] = "";
    if (!rc && config->resume_from_checkpoint[0]) {
        if (!strcmp(config->resume_from_checkpoint, "latest")) {
            if (snug_checkpoint_latest(config->output_dir, resume, sizeof resume))
                rc = snug_fail(e, SNUG_EINPUT, "%s: resume_from_checkpoint is latest but the folder holds no complete "
                               "checkpoint; start the run without it", config->output_dir);
        } else {
            snprintf(resume, sizeof resume, "%s", config->resume_from_checkpoint);
        }
    } else if (!rc && config->auto_resume && snug_checkpoint_latest(config->output_dir, resume, sizeof resume)) {
        resume[0] = '\0'; /* auto_resume_from_checkpoints: the newest complete checkpoint when there is one */
    }
    /* and auto_find_batch_size takes the micro_batch_size the run found when it started, as transformers' does */
    snug_run_config *adopted = NULL;
    int vb, fb = 0;
    int take_vb = !rc && resume[0] && config->loss_vocab_block == 0 && snug_checkpoint_vocab_block(resume, &vb);
    int take_mb = !rc && resume[0] && config->auto_find_batch_size &&
                  snug_checkpoint_fixed_int(resume, "micro_batch_size", &fb) && fb >= 1;
    if (take_mb && fb > config->micro_batch_size)
        rc = snug_fail(e, SNUG_EINPUT, "%s trained with micro_batch_size %d (auto_find_batch_size's), above "
                       "micro_batch_size %d now, the most it may take; resume with micro_batch_size %d or more",
                       resume, fb, config->micro_batch_size, fb);
    if (!rc && (take_vb || take_mb) && (adopted = malloc(sizeof *adopted))) {
        *adopted = *config;
        if (take_vb)
            adopted->loss_vocab_block = vb;
        if (take_mb) /* found already: no search */
            adopted->micro_batch_size = fb, adopted->auto_find_batch_size = 0;
    }
    if (!rc)
        rc = snug_setup_resolve(&r.s, adopted ? adopted : config, on_gpu ? SNUG_DEVICE_CUDA : SNUG_DEVICE_CPU, e);
    if (!rc && adopted && take_mb)
        snprintf(r.s.fit_note, sizeof r.s.fit_note, "auto_find_batch_size: micro_batch_size %d, the checkpoint's "
                 "(found when the run started)", fb);
    free(adopted);
    const snug_run_config *o = &r.s.c; /* as it runs: after auto_fit */
    if (!rc)
        rc = snug_setup_load_data(&r.s, e);
    if (!rc && o->debug && lead) /* Axolotl's debug: the first examples as the model will see them */
        snug_setup_print_examples(out, &r.s, 3);
    snug_loader loader = {0};
    snug_batching_opts bopts = batching_opts(&r, 1);
    if (!rc)
        rc = snug_loader_init(&loader, &r.s.train, &bopts, e);
    if (!rc)
        rc = snug_batching_report_compute(&r.brep, &r.s.train, &bopts, e);
    if (!rc && o->base_model[0]) { /* the weights must match config.json before memory is sized by it */
        snug_param_table t;
        rc = snug_param_table_build(&t, &r.s.cfg, e);
        if (!rc) {
            rc = snug_model_check_weights(&t, o->base_model, e);
            snug_param_table_free(&t);
        }
    }
    /* a folder that holds a run is continued (resume, above) or overwritten, never mixed into */
    if (!rc && !resume[0] && lead && snug_output_dir_has_run(o->output_dir)) {
        if (o->overwrite_output_dir)
            rc = snug_checkpoint_prune(o->output_dir, -1, 0, e);
        else
            rc = snug_fail(e, SNUG_EINPUT, "%s already holds a run (metrics.jsonl or checkpoints); continue it with "
                           "resume_from_checkpoint: latest, replace it with overwrite_output_dir: true, or choose "
                           "another output_dir", o->output_dir);
    }
    if (!rc)
        rc = snug_engine_create(&r.eng, &r.s.spec, o->device, o->threads, e);
    snug_train_state st = {0}, saved = {0};
    snug_checkpointer ckw = {.comm = comm.size > 1 ? &comm : NULL};
    double ck_wait = 0;
    double t_load = now_s();
    /* the weights: a checkpoint's, or the base model's (or a random init); under LoRA the frozen base always comes
     * from base_model (or the same seed), and the adapters from the checkpoint or PEFT's initialisation */
    int lora = r.eng.model.lora.on;
    if (!rc && (!resume[0] || lora)) {
        if (o->base_model[0])
            rc = snug_model_load_weights(&r.eng.model, o->base_model, e);
        else if (snug_model_init_random(&r.eng.model, (uint64_t)o->seed))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory initialising the weights");
    }
    if (!rc && lora && !resume[0])
        rc = snug_setup_load_adapter(&r.s, &r.eng.model, e);
    if (!rc && resume[0])
        rc = snug_checkpoint_load(resume, &saved, &r.s, &r.eng, e);
    rc = ddp_agree(&comm, rc, &broken, e);
    if (!rc && use_nccl) /* every rank or none: it agrees through the host communicator itself */
        rc = snug_comm_nccl_wrap(&comm, r.eng.be, e);
    if (rc) {
        snug_loader_free(&loader);
        run_free(&r);
        goto done;
    }

    /* GA is each rank's accumulation; a step takes W x GA micro-batches of the data's order, rank r the r-th GA of
     * them, so W ranks step as one process accumulating W x GA micro-batches does */
    int W = dp->size, GA = o->gradient_accumulation_steps * W, GAr = o->gradient_accumulation_steps;
    int B = o->micro_batch_size, T = o->sequence_len;
    size_t per_epoch = snug_loader_batches_per_epoch(&loader);
    /* an epoch is ceil(per_epoch / GA) steps, its last step accumulating only the micro-batches left in it (as
     * Hugging Face's Trainer does), so num_epochs never runs into an extra epoch */
    int total = o->max_steps > 0 ? o->max_steps : (int)((per_epoch + GA - 1) / GA) * o->num_epochs;
    if (total < 1)
        total = 1;
    int warmup = snug_warmup_steps(o, total);
    /* Axolotl's per-epoch counts: a fraction 1 / (count x num_epochs) of the run's steps, rounded up (as Hugging
     * Face's Trainer rounds a fractional eval_steps or save_steps) */
    int eval_every = o->evals_per_epoch ? per_epoch_every(total, o->evals_per_epoch, o->num_epochs) : o->eval_steps;
    int save_every = o->saves_per_epoch ? per_epoch_every(total, o->saves_per_epoch, o->num_epochs) : o->save_steps;
    int load_best = snug_load_best(o);
    int save_epoch = o->save_strategy == 2, eval_off = o->eval_strategy == 0; /* Hugging Face's strategies */
    snug_sched sched = o->lr_scheduler;
    r.eng.opt.beta1 = o->adam_beta1;
    r.eng.opt.beta2 = o->adam_beta2;
    r.eng.opt.eps = o->adam_epsilon;
    /* LoRA+: PEFT's create_loraplus_optimizer gives every group its loraplus_weight_decay, 0 unless passed (Axolotl
     * does not): the adapters take no weight decay */
    r.eng.opt.weight_decay = o->loraplus_lr_ratio > 0 ? 0.0 : o->weight_decay;
    print_header(&r, out, total, per_epoch);
    if (o->loraplus_lr_ratio > 0)
        fprintf(out, "  LoRA+                lora_B%s at %g x the learning rate; no weight decay (PEFT's LoRA+ "
                "optimizer)\n", o->lora_dora ? " and the magnitudes" : "", o->loraplus_lr_ratio);
    if (ddp_collectives(dp))
        fprintf(out, "  data parallel        %d rank%s (%s, launched by %s%s), %d micro-batches of %d rows per step\n", W,
                W == 1 ? "" : "s", comm.name, launch.launcher, comm.deterministic ? ", gradients summed in rank order" : "", GA, B);
    tp_hook tph = {.comm = tp};
    snug_param_table tp_whole = {0};
    if (tpn > 1) {
        const snug_model_config *lc = &r.eng.model.cfg;
        fprintf(out, "  tensor parallel      %d ranks (%s, launched by %s%s): each holds %d of %d query heads, "
                "%d of %d key/value heads and %d of %d MLP rows of every block, and %s; 4 all-reduces of %d x %d per block "
                "and micro-batch\n", tpn, comm.name, launch.launcher,
                comm.deterministic ? ", summed in rank order" : "",
                lc->n_head, r.s.cfg.n_head, lc->n_kv_head, r.s.cfg.n_kv_head, lc->intermediate_size,
                r.s.cfg.intermediate_size, r.eng.model.tp_vocab ? "its rows of the vocabulary (embedding, head)"
                                                                : "the whole vocabulary", B * T, lc->hidden_size);
        if (r.eng.model.tp_vocab)
            fprintf(out, "                       vocabulary split: %d of %d rows per rank; the lookup and the final "
                    "norm's gradient summed over the ranks, each token's loss statistics gathered\n", lc->vocab_size,
                    r.s.cfg.vocab_size);
        else
            fprintf(out, "                       vocabulary whole on every rank (%s)\n",
                    on_gpu ? "the loss over blocks of the head's rows is not built for GPUs yet"
                           : "its size does not divide by tensor_parallel_size");
        r.eng.model.tp_reduce = tp_reduce;
        r.eng.model.tp_reduce_ud = &tph;
        r.eng.model.tp_gather = tp_gather;
        r.eng.model.tp_gather_ud = &tph;
        rc = snug_param_table_build(&tp_whole, &r.s.cfg, e);
        if (!rc && !(tph.counts = calloc((size_t)tp->size, sizeof *tph.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for tensor parallelism");
    }
    snug_pipe pipe = {.c = tp};
    if (ppn > 1) {
        fprintf(out, "  pipeline parallel    %d stages (%s, launched by %s), 1F1B over each step's %d micro-batch%s "
                "(the bubble: %d of every %d stage-slots idle); per micro-batch %d x %d floats to the next stage and "
                "their gradient back; %s\n", ppn, comm.name, launch.launcher, GAr, GAr == 1 ? "" : "es", ppn - 1,
                GAr + ppn - 1, B * T, r.s.cfg.hidden_size,
                o->pipeline_recompute ? "a stage before the last keeps each micro-batch's input and runs its forward "
                                        "again before its backward (pipeline_recompute)"
                                      : "stage s keeps the activations of the N - s micro-batches it has in flight");
        for (int q = 0; q < ppn; q++) {
            int l0, nl;
            snug_pp_layers(r.s.cfg.n_layer, ppn, o->pipeline_layers, q, &l0, &nl);
            char span[32];
            snprintf(span, sizeof span, nl == 1 ? "layer %d" : "layers %d-%d", l0, l0 + nl - 1);
            fprintf(out, "                       stage %d: %s%s%s\n", q, span,
                    q == 0 ? ", the embedding" : "",
                    q < ppn - 1 ? ""
                    : r.s.cfg.tie_embeddings ? ", the final norm, the tied head (the embedding again, its gradient "
                                               "summed with stage 0's)"
                                             : ", the final norm, the head");
        }
        if (GAr < ppn)
            fprintf(out, "                       (gradient_accumulation_steps %d < %d stages: some stage is always "
                    "idle; raise it to keep the pipeline full)\n", GAr, ppn);
        /* a tied head: the first and last stages sum its gradient (the pipeline itself when there are two) */
        if (!rc && r.s.cfg.tie_embeddings && ppn > 2) {
            int end = tp->rank == 0 || tp->rank == ppn - 1;
            rc = tp->split(tp, end ? 0 : 1, tp->rank, &endc, e);
            pipe.ends = end ? &endc : NULL;
        } else if (r.s.cfg.tie_embeddings) {
            pipe.ends = tp;
        }
    }

    size_t BT = (size_t)B * T;
    int32_t *ids = malloc((size_t)GA * BT * sizeof *ids), *labels = malloc((size_t)GA * BT * sizeof *labels);
    int32_t *pos = malloc((size_t)GA * BT * sizeof *pos), *seg = malloc((size_t)GA * BT * sizeof *seg);
    snug_micro_batch *mb = malloc((size_t)GA * sizeof *mb); /* the step's micro-batches, each (B, T) at most */
    uint64_t *seeds = malloc((size_t)GA * sizeof *seeds);   /* and their dropout seeds */
    if (!ids || !labels || !pos || !seg || !mb || !seeds)
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the batch buffers");
    for (int k = 0; !rc && k < GA; k++)
        mb[k] = (snug_micro_batch){.ids = ids + k * BT, .labels = labels + k * BT, .pos = pos + k * BT,
                                   .seg = seg + k * BT};
    size_t *shard = NULL; /* ZeRO: each rank's elements of the flat parameters; NULL: every rank holds everything */
    const snug_model *qm = &r.eng.model;
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
        if (!(shard = malloc((size_t)W * sizeof *shard)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        else
            snug_plan_zero_counts(&r.s.spec, &r.eng.model.table, shard);
        if (shard) {
            size_t most = 0, least = (size_t)-1;
            for (int q = 0; q < W; q++) {
                most = shard[q] > most ? shard[q] : most;
                least = shard[q] < least ? shard[q] : least;
            }
            const snug_model *zm = &r.eng.model;
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
    }
    if (r.eng.model.vb)
        fprintf(out, "  loss                 over blocks of %d of the head's %d rows (loss_vocab_block)%s\n",
                r.eng.model.vb, r.eng.model.cfg.vocab_size,
                !r.eng.model.vtied ? ""
                : r.eng.model.param_sharded ? "; the tied embedding gathered a block (and the looked-up rows) at a time, "
                                              "its gradient reduced block by block"
                                            : "; the tied embedding's gradient reduced block by block");
    snug_zero2_hook z2 = {.m = &r.eng.model, .comm = dp, .shard = shard};
    if (!rc && shard && r.eng.model.lv.zero_grads) {
        if (!(z2.counts = malloc((size_t)W * sizeof *z2.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        r.eng.model.on_grads_ready = snug_zero2_ready;
        r.eng.model.on_grads_ready_ud = &z2;
    }
    snug_zero3_hook z3 = {.comm = dp, .shard = shard,
                    .dt = r.eng.model.lv.dt == SNUG_DT_F32 ? SNUG_COMM_F32 : SNUG_COMM_U16};
    if (!rc && shard && r.eng.model.param_sharded) {
        if (!(z3.counts = malloc((size_t)W * sizeof *z3.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        r.eng.model.gather_params = snug_zero3_gather;
        r.eng.model.gather_params_ud = &z3;
    }
    if (!rc && r.eng.model.q4_parts > 1) { /* equal byte pieces: no counts from the table */
        if (!(z3.counts = malloc((size_t)W * sizeof *z3.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        r.eng.model.gather_q4 = snug_zero3_gather_q4;
        r.eng.model.gather_q4_ud = &z3;
    }
    if (!rc && r.eng.model.lora.dora_pending) /* (every rank: the base's layers gathered in turn) */
        snug_lora_dora_start(&r.eng.model);
    snug_rows_hook zr = {.z2 = &z2, .z3 = r.eng.model.param_sharded ? &z3 : NULL};
    if (!rc && shard && r.eng.model.vtied) {
        if (!(zr.counts = malloc((size_t)W * sizeof *zr.counts)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
        r.eng.model.rows_fn = snug_rows_op;
        r.eng.model.rows_ud = &zr;
    }
    /* DDP and ZeRO-1 sum the gradients in buckets during the last micro-batch's backward (the adapters' stay one
     * sum; ZeRO-2/3 reduce every micro-batch's, snug_zero2_ready) */
    snug_ddp_buckets buckets = {.m = &r.eng.model, .comm = dp, .shard = shard,
                              .cap = (size_t)o->ddp_bucket_cap_mb << 20, .count_only = 1};
    int bucketed = ddp_collectives(dp) && !(shard && r.eng.model.lv.zero_grads) && !o->optimizer_in_backward &&
                   !r.eng.model.lora.on && !(dp->size == 1 && r.eng.model.grads16);
    if (!rc && bucketed && shard && !(buckets.counts = malloc((size_t)W * sizeof *buckets.counts)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
    for (int l = r.eng.model.cfg.n_layer - 1; !rc && bucketed && l >= -1; l--) /* the buckets a backward forms */
        snug_ddp_bucket_ready(&buckets, l, 0, 0);
    if (bucketed) {
        fprintf(out, "  gradient buckets     %d of up to %d MiB, summed during the last micro-batch's backward\n",
                buckets.nbuckets, o->ddp_bucket_cap_mb);
        buckets.count_only = 0;
    }
    if (!rc && buckets.rc) {
        rc = buckets.rc;
        if (e)
            *e = buckets.e;
    }

    snug_tboard tb = {0}; /* report_to: tensorboard (a resumed run starts another event file),
                          * first: a logging_dir that cannot be made leaves output_dir as it was */
    if (!rc && lead && o->use_tensorboard) {
        char dir[4096];
        if (o->logging_dir[0])
            snprintf(dir, sizeof dir, "%s", o->logging_dir);
        else
            snug_path_join(dir, sizeof dir, o->output_dir, "runs");
        rc = snug_tboard_open(&tb, dir, e);
    }
    char metrics_path[4096];
    FILE *metrics = NULL;
    if (!rc && lead) {
        rc = snug_mkdirs(o->output_dir, e);
        snug_path_join(metrics_path, sizeof metrics_path, o->output_dir, "metrics.jsonl");
        if (!rc && resume[0])
            rc = (metrics = reopen_metrics(metrics_path, saved.step, e)) ? 0 : SNUG_EIO;
        else if (!rc && !(metrics = fopen(metrics_path, "w")))
            rc = snug_fail(e, SNUG_EIO, "%s: cannot write the metrics log; check output_dir", metrics_path);
    }
    rc = ddp_agree(&comm, rc, &broken, e);
    int tty = isatty(fileno(out)) && !o->no_progress_bar;
    double t0 = now_s(), tlog = t0;
    size_t tokens_since = 0;
    /* (ZeRO-3 steps through the reduce-scatter hook, z2.step below) */
    step_in_backward_ctx in_bwd = {.eng = &r.eng, .comm = dp,
                                   .shard = o->optimizer_in_backward && !r.eng.model.lora.on && !z2.counts ? shard
                                                                                                            : NULL,
                                   .whole = tpn > 1 ? &tp_whole : NULL, .tp_rank = tpn > 1 ? tp->rank : 0};
    if (!rc && in_bwd.shard && !(in_bwd.counts = malloc((size_t)W * sizeof *in_bwd.counts)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
    st.per_epoch = per_epoch;
    snug_loss_scaler_init(&st.ls, r.eng.model.lv.dt == SNUG_DT_F16);
    if (!rc && resume[0]) { /* the data position: the loader hands out again what the checkpointed steps consumed */
        int end;
        while (st.step < saved.step) {
            gather(&loader, &st, mb, GA, &end);
            st.step++;
        }
        if (st.epochs_done != saved.epochs_done || st.in_epoch != saved.in_epoch || st.per_epoch != saved.per_epoch)
            rc = snug_fail(e, SNUG_EINPUT, "%s: the data does not replay to the checkpoint's position (epoch %d, "
                           "micro-batch %zu of %zu; replayed: epoch %d, %zu of %zu); resume with the same datasets",
                           resume, saved.epochs_done, saved.in_epoch, saved.per_epoch, st.epochs_done, st.in_epoch,
                           st.per_epoch);
        st = saved;
        r.eng.opt.step = st.opt_step;
        if (!rc)
            fprintf(out, "resumed from %s at step %d of %d (state read and data replayed in %.2f s)\n", resume,
                    st.step, total, now_s() - t_load);
    }
    if (!resume[0]) /* (a checkpoint holds its own) */
        snug_plateau_init(&st.plateau, o->learning_rate, &o->sched);
    snug_loss_scaler ls = st.ls;
    double loss_mean = st.loss_mean;
    if (o->optimizer_in_backward && z2.counts) { /* ZeRO-3: each layer reduce-scattered, the rank's part stepped */
        z2.step = step_group;
        z2.step_ud = &in_bwd;
    } else if (o->optimizer_in_backward) {
        r.eng.model.on_grads_ready = step_in_backward;
        r.eng.model.on_grads_ready_ud = &in_bwd;
    }
    int stopped = 0;
    r.eng.model.neftune_alpha = (float)o->neftune_noise_alpha;
    for (int step = st.step; step < total && !rc; step++) {
        /* gather the step's micro-batches first: the loss is normalised by all their supervised tokens */
        int epoch_end;
        int nmb = gather(&loader, &st, mb, GA, &epoch_end);
        /* every rank holds the whole global batch's labels, so each counts the same supervised tokens */
        size_t nsup = 0;
        for (int k = 0; k < nmb; k++) {
            nsup += snug_count_supervised(mb[k].labels, (size_t)mb[k].rows * mb[k].T);
            tokens_since += mb[k].tokens; /* example tokens of every rank: padding is not counted */
        }
        int k0 = dp->rank * GAr < nmb ? dp->rank * GAr : nmb, k1 = k0 + GAr < nmb ? k0 + GAr : nmb;
        float scale = nsup ? 1.0f / (float)nsup : 0.0f;
        double lr = sched == SNUG_SCHED_PLATEAU ? st.plateau.lr /* what the evaluations so far made of it */
                    : snug_lr_at(sched, o->learning_rate, step, warmup, total, o->cosine_min_lr_ratio, &o->sched);
        if (o->optimizer_in_backward) { /* the step happens inside backward, layer by layer */
            r.eng.opt.step++;
            in_bwd.lr = lr;
        } else {
            zero_grads(&r.eng.model);
        }
        double loss_sum = 0;
        /* LoRA dropout's masks: a function of the seed, the step and the micro-batch (the same on resume) */
        for (int k = k0; k < k1; k++) {
            uint64_t ds = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step * 0x100000001B3ull + (uint64_t)k;
            seeds[k - k0] = snug_splitmix64(&ds);
        }
        /* pipeline parallelism: the rank's micro-batches through the stages (1F1B), the last stage's loss summed
         * over the pipeline */
        if (ppn > 1 && ((rc = snug_pipe_step(&pipe, &r.eng.model, mb + k0, seeds, k1 - k0, scale * ls.scale,
                                             bucketed ? snug_ddp_bucket_ready : NULL, &buckets, &loss_sum, e)) ||
                        (rc = tp->allreduce_sum(tp, &loss_sum, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e)))) {
            broken = 1;
            break;
        }
        for (int k = k0; k < k1 && ppn <= 1; k++) {
            if (bucketed) {
                r.eng.model.on_grads_ready = k == k1 - 1 ? snug_ddp_bucket_ready : NULL;
                r.eng.model.on_grads_ready_ud = &buckets;
            }
            snug_model_set_batch(&r.eng.model, mb[k].ids, mb[k].labels, mb[k].pos, mb[k].seg, mb[k].rows, mb[k].T);
            r.eng.model.lora.seed = seeds[k - k0];
            loss_sum += snug_model_step(&r.eng.model, scale * ls.scale);
        }
        if (bucketed) {
            r.eng.model.on_grads_ready = NULL;
            /* no micro-batch for this rank (an epoch's end): its zero gradients join the same buckets */
            for (int l = r.eng.model.cfg.n_layer - 1; k0 == k1 && l >= -1; l--)
                snug_ddp_bucket_ready(&buckets, l, 0, 0);
        }
        /* a base laid out to be gathered (stage 3, or LoRA's offload_params): skip_step repeats the step's gathers
         * and its announcements */
        int gathers = r.eng.model.param_sharded || r.eng.model.q4_parts > 1;
        if (o->optimizer_in_backward && k0 == k1 && W > 1 && !gathers) {
            /* no micro-batch left for this rank at the end of an epoch: its zero gradients still join every
             * layer's sum, announced in backward's order (the last layer first, the global tensors last); with a
             * gathered base skip_step below announces them between the layers' gathers, as a step does */
            for (int l = r.eng.model.cfg.n_layer - 1; l >= -1; l--)
                step_in_backward(&in_bwd, l, 0, 0);
        }
        /* ZeRO-2/3: a rank with fewer micro-batches than rank 0 (the end of an epoch) still joins each one's
         * collectives (ZeRO-3's gathers; the reduce-scatters, with zero gradients), in the step's order */
        for (int k = k1 - k0; (z2.counts || gathers) && k < (nmb < GAr ? nmb : GAr); k++)
            snug_model_skip_step(&r.eng.model, 1);
        if (z2.rc || z3.rc) {
            rc = z2.rc ? z2.rc : z3.rc;
            if (e)
                *e = z2.rc ? z2.e : z3.e;
            broken = 1;
            break;
        }
        if (in_bwd.rc || buckets.rc) {
            rc = in_bwd.rc ? in_bwd.rc : buckets.rc;
            if (e)
                *e = in_bwd.rc ? in_bwd.e : buckets.e;
            broken = 1;
            break;
        }
        if (tph.rc) {
            rc = tph.rc;
            if (e)
                *e = tph.e;
            broken = 1;
            break;
        }
        if (ddp_collectives(dp) && ((rc = dp->allreduce_sum(dp, &loss_sum, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e)) ||
                      (bucketed && (rc = dp->wait(dp, e))) ||
                      (!bucketed && !o->optimizer_in_backward && !z2.counts &&
                       (rc = ddp_reduce_grads(dp, &r.eng.model, e))))) {
            broken = 1;
            break;
        }
        if (ppn > 1 && (rc = snug_pipe_tied_sum(&pipe, &r.eng.model, e))) { /* a tied head's two parts */
            broken = 1;
            break;
        }
        double loss = nsup ? loss_sum / (double)nsup : 0;
        /* a loss that is no number: what a step would write (and the model saved at the end) would be NaN; stop
         * with the checkpoints as they are (fp16's loss scaler handles overflow itself). Every rank has the sum. */
        if (!isfinite(loss) && r.eng.model.lv.dt != SNUG_DT_F16) {
            rc = snug_fail(e, SNUG_EINPUT, "step %d: the loss is %g: training diverged (or the model's numbers "
                           "overflow); lower learning_rate (%g), set max_grad_norm, or check the base model's "
                           "config.json; nothing was saved after the last checkpoint", step + 1, loss,
                           o->learning_rate);
            break;
        }
        double norm;
        if (o->optimizer_in_backward) {
            double ss = r.eng.be->sumsq_take(r.eng.be);
            /* ZeRO-3 (a full fine-tune): each rank summed the squares of its parts of the sums; tensor parallelism:
             * of its slices (and rank 0 of the whole tensors) */
            if ((z2.step && (rc = dp->allreduce_sum(dp, &ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e))) ||
                (tpn > 1 && (rc = tp->allreduce_sum(tp, &ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e)))) {
                broken = 1;
                break;
            }
            norm = sqrt(ss);
        } else {
            if (tpn > 1 && shard && !r.eng.model.lora.on) {
                if ((rc = zero_tp_grad_norm(dp, tp, &tp_whole, &r.eng.model, shard, 1.0f / ls.scale, &norm, e))) {
                    broken = 1;
                    break;
                }
            } else if (tpn > 1) {
                if ((rc = tp_grad_norm(tp, &r.eng.model, &tp_whole, 1.0f / ls.scale, &norm, e))) {
                    broken = 1;
                    break;
                }
            } else if (ppn > 1 && (!shard || r.eng.model.lora.on)) {
                if ((rc = snug_pipe_grad_norm(&pipe, &r.eng.model, 1.0f / ls.scale, &norm, e))) {
                    broken = 1;
                    break;
                }
            } else if (!shard || r.eng.model.lora.on) { /* every rank holds every (adapter) gradient */
                norm = snug_grad_norm_model(&r.eng.model, 1.0f / ls.scale);
            } else if ((rc = zero_grad_norm(dp, ppn > 1 ? tp : NULL, &r.eng.model, shard, 1.0f / ls.scale, &norm,
                                            e))) {
                broken = 1;
                break;
            }
            float clip = 1.0f;
            if (o->max_grad_norm > 0 && norm > o->max_grad_norm)
                clip = (float)(o->max_grad_norm / (norm + 1e-6));
            float used = ls.scale;
            if (snug_loss_scaler_update(&ls, norm))
                snug_adamw_step_model(&r.eng.opt, &r.eng.model, lr, clip / used);
            else /* fp16 overflow: the step is skipped */
                fprintf(out, "step %d: fp16 gradients overflowed at loss scale %.0f; step skipped, scale now %.0f (%d "
                        "skipped so far)\n", step + 1, used, ls.scale, ls.skipped);
            /* ZeRO-3 gathers nothing here: the next forward gathers each layer as it needs it */
            if (shard && !r.eng.model.param_sharded && (rc = zero_gather_params(dp, &r.eng.model, shard, e))) {
                broken = 1;
                break;
            }
        }
        loss_mean = step ? 0.9 * loss_mean + 0.1 * loss : loss;
        if ((rc = snug_backend_check(r.eng.be, e))) /* a device op that failed during the step (CUDA) */
            break;

        /* the loss watchdog: the run ends here, as at its last step (every rank has the same loss) */
        st.watch_over = o->loss_watchdog_threshold > 0 && loss > o->loss_watchdog_threshold ? st.watch_over + 1 : 0;
        int watched = o->loss_watchdog_threshold > 0 && st.watch_over >= o->loss_watchdog_patience && step + 1 < total;
        if (watched)
            total = step + 1;
        /* a checkpoint of this step (if it is not the last): every save_every steps, at an epoch's end (save_strategy:
         * epoch), after the first step (save_first_step) */
        int save_now = (save_every > 0 && (step + 1) % save_every == 0) || (save_epoch && epoch_end) ||
                       (o->save_first_step && step == 0);
        double val = NAN;
        if (r.s.val.nexamples && !eval_off && ((eval_every > 0 && (step + 1) % eval_every == 0) ||
                                  (eval_every == 0 && epoch_end) || step + 1 == total) &&
            ((rc = evaluate(&r, mb[0], dp, ppn > 1 ? &pipe : NULL, &val, e)) || (rc = z3.rc) || (rc = tph.rc))) {
            if ((z3.rc || tph.rc) && e)
                *e = z3.rc ? z3.e : tph.e;
            broken = 1;
            break;
        }
        /* early stopping: the evaluations in a row without a validation loss lower than the best before it (by more
         * than the threshold, as Hugging Face's EarlyStoppingCallback) end the run here, as at its last step */
        int stopped_early = 0;
        if (!isnan(val) && o->early_stopping_patience > 0) {
            int lower = !st.es_step || (val < st.es_best && st.es_best - val > o->early_stopping_threshold);
            st.es_count = lower ? 0 : st.es_count + 1;
            stopped_early = st.es_count >= o->early_stopping_patience && step + 1 < total;
            if (stopped_early)
                total = step + 1;
        }
        if (!isnan(val) && (!st.es_step || val < st.es_best))
            st.es_best = val, st.es_step = step + 1;
        if (!isnan(val) && sched == SNUG_SCHED_PLATEAU) /* the next steps' learning rate (transformers steps it with
                                                          * the evaluation's metric, eval_loss) */
            snug_plateau_step(&st.plateau, val, &o->sched);
        /* load_best_model_at_end: the lowest validation loss among the steps that keep a checkpoint (and the last) */
        if (!isnan(val) && load_best && (!st.best_step || val < st.best_val) && (save_now || step + 1 == total))
            st.best_val = val, st.best_step = step + 1;
        int log_now = (step + 1) % (o->logging_steps > 0 ? o->logging_steps : 1) == 0 || step + 1 == total ||
                      !isnan(val);
        if (log_now && metrics) {
            double t = now_s(), tps = tokens_since / (t - tlog > 1e-9 ? t - tlog : 1e-9);
            double rss = peak_rss_bytes();
            double epoch = st.epochs_done + (st.per_epoch ? (double)st.in_epoch / (double)st.per_epoch : 0.0);
            fprintf(metrics, "{\"step\": %d, \"epoch\": %.4f, \"loss\": %.9g, \"lr\": %.6e, \"grad_norm\": %.6f, "
                    "\"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"peak_rss_bytes\": %.0f",
                    step + 1, epoch, loss, lr, norm, tps, t - t0, rss);
            if (ls.on)
                fprintf(metrics, ", \"loss_scale\": %.0f, \"skipped_steps\": %d", ls.scale, ls.skipped);
            if (!isnan(val))
                fprintf(metrics, ", \"val_loss\": %.9g", val);
            fprintf(metrics, "}\n");
            fflush(metrics);
            /* TensorBoard: Hugging Face's TensorBoardCallback's tags */
            static const char *const tags[] = {"train/loss", "train/learning_rate", "train/grad_norm", "train/epoch",
                                               "eval/loss"};
            double vals[] = {loss, lr, norm, epoch, val};
            if (!rc && (rc = snug_tboard_scalars(&tb, step + 1, tags, vals, isnan(val) ? 4 : 5, e))) {
                broken = comm.size > 1;
                break;
            }
            if (tty) {
                progress_bar(out, step + 1, total, loss_mean, lr, norm, tps, rss, t - t0);
                if (!isnan(val))
                    fprintf(out, "\n  step %d: validation loss %.4f\n", step + 1, val);
            } else {
                fprintf(out, "step %5d/%d  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s  rss %.0f MiB%s", step + 1,
                        total, loss, lr, norm, tps, rss / 1048576.0, isnan(val) ? "\n" : "");
                if (!isnan(val))
                    fprintf(out, "  val_loss %.4f\n", val);
            }
            tlog = t;
            tokens_since = 0;
        }
        st.step = step + 1;
        st.opt_step = r.eng.opt.step;
        st.ls = ls;
        st.loss_mean = loss_mean;
        int stop = stop_requested && step + 1 < total;
        if (ddp_collectives(&comm)) { /* a signal may reach the ranks at different steps: they stop together */
            int64_t any = stop;
            if ((rc = comm.allreduce_sum(&comm, &any, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, e))) {
                broken = 1;
                break;
            }
            stop = any > 0;
        }
        if (!rc) { /* a checkpoint written in the background that has just become complete */
            rc = snug_checkpoint_finish(&ckw, 0, e);
            if (!rc && ckw.finished && !tty)
                fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", ckw.dir,
                        ckw.write_s, ck_wait, ckw.write_cpu_s);
        }
        /* every rank holds the same state under data parallel: rank 0 saves it; under ZeRO each rank also its
         * shard */
        int writer = lead || snug_checkpoint_per_rank(&r.eng);
        if (!rc && !writer && stop) { /* another DDP rank: rank 0 writes the checkpoint and says so */
            stopped = 1;
            break;
        }
        if (stopped_early) {
            if (tty)
                fputc('\n', out);
            fprintf(out, "step %d: no validation loss lower than %.6g (step %d) in %d evaluation%s "
                    "(early_stopping_patience): training ends here%s\n", step + 1, st.es_best, st.es_step,
                    st.es_count, st.es_count == 1 ? "" : "s",
                    load_best ? "" : " and the model is saved as at the end");
        }
        if (watched) {
            if (tty)
                fputc('\n', out);
            fprintf(out, "step %d: the loss has been above loss_watchdog_threshold %g for %d step%s in a row: training "
                    "ends here and the model is saved as at the end\n", step + 1, o->loss_watchdog_threshold,
                    st.watch_over, st.watch_over == 1 ? "" : "s");
        }
        if (!rc && writer && ((save_now && step + 1 < total) || stop)) {
            char ck[4096];
            snprintf(ck, sizeof ck, "%s/checkpoint-%d", o->output_dir, step + 1);
            double tc = now_s();
            rc = snug_checkpoint_finish(&ckw, 1, e); /* one still being written: training waits for it */
            if (!rc && ckw.finished && !tty)
                fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", ckw.dir,
                        ckw.write_s, ck_wait + now_s() - tc, ckw.write_cpu_s);
            tc = now_s();
            if (!rc)
                rc = snug_checkpoint_start(&ckw, ck, o->save_total_limit, &st, &r.s, &r.eng, e);
            if (!rc && stop) /* the run ends here: the checkpoint must be whole first */
                rc = snug_checkpoint_finish(&ckw, 1, e);
            ck_wait = now_s() - tc;
            if (!rc && ckw.finished && !tty)
                fprintf(out, "saved %s in %.2f s (%.2f s of CPU)\n", ck, ckw.write_s, ckw.write_cpu_s);
            tlog += now_s() - tc; /* the save is not counted in the next logged tokens/s */
            if (!rc && stop) {
                if (tty)
                    fputc('\n', out);
                if (o->save_only_model)
                    fprintf(out, "stopped by a signal after step %d of %d; saved %s, the model alone (save_only_model: "
                            "true), which a run cannot resume from\n", step + 1, total, ck);
                else
                    fprintf(out, "stopped by a signal after step %d of %d; saved %s; continue with the same command "
                            "and --resume_from_checkpoint latest\n", step + 1, total, ck);
                stopped = 1;
                break;
            }
        }
    }
    /* a failure inside the loop is this rank's alone while the others wait in the step's collectives: this rank
     * ends without MPI_Finalize, and mpirun ends the others */
    if (rc && comm.size > 1)
        broken = 1;
    { /* the last checkpoint is complete before the run ends, however it ends (under ZeRO only when the ranks still
       * agree: a folder they could not complete together stays .partial) */
        snug_error fe = {0};
        if (broken)
            ckw.comm = NULL;
        int frc = snug_checkpoint_finish(&ckw, 1, &fe);
        if (!rc && frc) {
            rc = frc;
            if (e)
                *e = fe;
        }
        if (!frc && ckw.finished && !tty)
            fprintf(out, "saved %s in %.2f s (training waited %.2f s; writing took %.2f s of CPU)\n", ckw.dir,
                    ckw.write_s, ck_wait, ckw.write_cpu_s);
    }
    if (tty)
        fputc('\n', out);
    if (metrics)
        fclose(metrics);
    snug_tboard_close(&tb);
    if (!rc && !stopped && (r.eng.model.master_sharded || r.eng.model.param_sharded || gn > 1) &&
        !r.eng.model.lora.on) {
        /* ZeRO-3: training is over, so the gradients and the optimizer state go before the save's tensor-sized
         * buffers are touched, and the save never raises the peak (the arenas' high-water marks stay recorded) */
        for (int c = SNUG_MEM_GRADS; r.eng.model.param_sharded && c <= SNUG_MEM_OPTIM; c++)
            snug_engine_release(&r.eng, (snug_category)c);
        /* a failure on one rank mid-stream ends the save on every rank, each with its error */
        rc = stream_save(&r, &comm, dp, gn > 1 ? tp : NULL, shard, &broken, e);
    } else if (!rc && !stopped && ppn > 1 && r.eng.model.lora.on) { /* every stage's adapters */
        rc = pp_save_adapter(&r, &comm, tp, &broken, e);
    } else if (!rc && !stopped && lead) {
        rc = snug_save_hf_folder(o->output_dir, &r.s, &r.eng, e);
    }
    /* load_best_model_at_end: the weights saved are those of the checkpoint with the lowest validation loss */
    if (!rc && !stopped && lead && load_best && st.best_step && st.best_step != st.step) {
        char ck[4096];
        snprintf(ck, sizeof ck, "%s/checkpoint-%d", o->output_dir, st.best_step);
        rc = snug_checkpoint_take_weights(ck, o->output_dir, e);
        if (!rc)
            fprintf(out, "load_best_model_at_end: the model saved is checkpoint-%d's (validation loss %.6g, the "
                    "lowest), not step %d's\n", st.best_step, st.best_val, st.step);
    }
    if (!rc && !stopped && lead && o->merge_lora) {
        char merged[4096];
        snug_path_join(merged, sizeof merged, o->output_dir, "merged");
        double tm = now_s();
        /* an adapter of a quantized base goes onto the base's round trip: the weights it was trained against */
        const snug_lora_cfg *q = r.eng.model.lv.lora.kind == SNUG_ADAPTER_QLORA ? &r.eng.model.lv.lora : NULL;
        rc = snug_merge_lora(o->base_model, o->output_dir, merged, q, o->threads, e);
        if (!rc)
            fprintf(out, "merged the adapter into %s%s%s%s: %s in %.1f s\n", o->base_model, q ? " (its " : "",
                    q ? snug_q4_width((snug_q4_type)q->q4_type) : "", q ? " round trip, as training saw it)" : "",
                    merged, now_s() - tm);
    }
    if (!rc && !stopped && lead) {
        fprintf(out, "saved %s (%s) in %.1f s\n", o->output_dir,
                r.eng.model.lora.on ? "PEFT adapter" : "Hugging Face format", now_s() - t0);
        if (ls.on)
            fprintf(out, "fp16 loss scaling: %d of %d steps skipped for overflow; final scale %.0f\n", ls.skipped,
                    total, ls.scale);
        size_t measured[SNUG_MEM_NCAT];
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            measured[c] = r.eng.arenas.a[c].peak;
        fprintf(out, "memory (arena high-water marks beside the plan):\n");
        snug_plan_print(out, &r.s.plan, measured);
        char b[32];
        snug_format_bytes(b, sizeof b, peak_rss_bytes());
        fprintf(out, "  %-20s %12s  %16s\n", "process peak RSS", "", b);
        size_t dev = snug_backend_device_used(r.eng.be); /* arenas are allocated once, so in use now = the peak */
        if (dev) {
            snug_format_bytes(b, sizeof b, (double)dev);
            fprintf(out, "  %-20s %12s  %16s  (cudaMemGetInfo: arenas, CUDA context, cuBLASLt workspace)\n",
                    "device memory in use", "", b);
        }
        snug_overhead ov;
        rank_overhead(&r, &ov);
        snug_format_bytes(b, sizeof b, (double)(r.s.plan.total + r.s.plan.host_total + ov.total));
        fprintf(out, "  %-20s %12s  (the arenas + %s runtime overhead)\n", "predicted RSS", b, "CPU");
        rc = rank_memory_json(&r, "memory.json", measured, e);
        print_sample(&r, out);
    }
    /* under ZeRO (and tensor parallelism) each rank plans its own shard (slices): each writes its memory */
    if (!rc && !stopped && !lead && (shard || r.eng.model.q4_parts > 1 || gn > 1)) {
        size_t measured[SNUG_MEM_NCAT];
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            measured[c] = r.eng.arenas.a[c].peak;
        char name[64];
        snprintf(name, sizeof name, "memory.rank%d.json", comm.rank);
        rc = rank_memory_json(&r, name, measured, e);
    }
    free(ids);
    free(labels);
    free(pos);
    free(seg);
    free(mb);
    free(seeds);
    free(shard);
    free(z2.counts);
    free(z3.counts);
    free(zr.counts);
    free(buckets.counts);
    free(in_bwd.counts);
    snug_param_table_free(&tp_whole);
    free(tph.counts);
    snug_loader_free(&loader);
    run_free(&r);
    if (!broken)
        rc = ddp_agree(&comm, rc, &broken, e);
done:
    if (rc && comm.size > 1 && e)
        snug_error_wrap(e, "rank %d of %d: ", comm.rank, comm.size);
    if (!broken) { /* MPI_Finalize only when every rank reaches it */
        snug_comm_close(&endc);
        snug_comm_close(&tpc);
        snug_comm_close(&dpc);
        snug_comm_close(&comm);
    }
    if (quiet)
        fclose(quiet);
    return rc;
}

