/* plan.c: planning a run's memory with the same layout code that allocates it (see plan.h). */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#include "backend/device.h"
#include "dist/comm.h"
#include "dist/zero.h"
#include "model/model.h"
#include "optim/optim.h"

snug_levers snug_plan_levers(const snug_plan_spec *s) {
    snug_levers lv = s->lv;
    lv.grads_fp32 = s->with_grads && lv.dt != SNUG_DT_F32 && (s->GA > 1 || s->ranks > 1);
    /* (with the step inside backward the gradients are one layer's already: stage 2 steps as stage 1; stage 3 keeps
     * the layout, each layer's gradients reduce-scattered and the rank's part stepped once summed, with no shard of
     * summed gradients kept) */
    lv.zero_grads = s->with_grads && s->zero_stage >= 2 && s->ranks > 1 && !lv.lora.kind &&
                    (!lv.optimizer_in_backward || s->zero_stage >= 3);
    /* a second layer gradient buffer where the reduce-scatters run beside backward: NCCL's stream, on GPU ranks
     * (stage 3 inside backward: a layer is stepped once its reduce-scatter is waited for, at the next layer's end) */
    lv.zero_overlap = lv.zero_grads && (s->overlap_comm > 0 || (s->overlap_comm == 0 && s->device_cuda));
    /* the loss over blocks of the head's rows: as configured, or (auto) where it keeps a tied embedding from being
     * whole on a rank under ZeRO-2/3, with blocks of one layer's size (no memory beyond the layer buffer) */
    lv.vocab_block = s->loss_vocab_block > 0 ? s->loss_vocab_block
                     : s->loss_vocab_block < 0 || s->device_cuda ? 0
                     : lv.zero_grads && s->cfg.tie_embeddings && !lv.lora.kind && !lv.optimizer_in_backward ? -1 : 0;
    /* unfrozen_parameters: gradients for the trained tensors alone, where they are summed and stepped tensor by tensor
     * (ZeRO's shards and the step inside backward take the table's ranges whole) */
    lv.pack_grads = s->with_grads && !lv.lora.kind && !lv.optimizer_in_backward &&
                    (s->zero_stage == 0 || s->ranks <= 1);
    if (lv.lora.kind) { /* a frozen base takes no update: no master copy, no gradients to accumulate */
        lv.master_weights = 0;
        lv.grads_fp32 = 0;
    }
    return lv;
}

int snug_plan_spec_check(const snug_plan_spec *s, snug_error *e) {
    if (s->with_grads && s->lv.optimizer_in_backward && s->GA > 1)
        return snug_fail(e, SNUG_EINPUT, "optimizer_in_backward steps after every micro-batch, so gradients cannot "
                         "accumulate over %d micro-batches; set gradient_accumulation_steps: 1 (raise "
                         "micro_batch_size instead)", s->GA);
    return 0;
}

void snug_plan_zero_counts(const snug_plan_spec *s, const snug_param_table *t, size_t *counts) {
    int n = s->zero_stage && s->ranks > 1 ? s->ranks : 1;
    size_t starts[t->n > 0 ? t->n : 1];
    for (int i = 0; i < t->n; i++)
        starts[i] = t->e[i].offset;
    if (t->n == 0)
        starts[0] = 0;
    snug_zero_shards(starts, t->n > 0 ? t->n : 1, t->total, n, SNUG_Q8_BLOCK, counts);
    for (int r = n; r < (s->ranks > 1 ? s->ranks : 1); r++) /* unsharded: rank 0 holds all, as every rank does */
        counts[r] = 0;
}

int snug_plan_shard_optimizer(snug_adamw *opt, const snug_plan_spec *s, const snug_param_table *t, snug_error *e) {
    opt->sharded = 0;
    if (!s->zero_stage || s->ranks <= 1 || s->lv.lora.kind) /* adapters: their state stays whole */
        return 0;
    size_t *counts = malloc((size_t)s->ranks * sizeof *counts);
    if (!counts)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
    snug_plan_zero_counts(s, t, counts);
    opt->sharded = 1;
    opt->shard_lo = snug_comm_displ(counts, s->rank);
    opt->shard_hi = opt->shard_lo + counts[s->rank];
    free(counts);
    return 0;
}

/* This rank's range of the flat layout under ZeRO into *lo, *n; 0 (both left as they are) when out of host memory. */
static int rank_shard(const snug_model *m, const snug_plan_spec *s, size_t *lo, size_t *n) {
    size_t *counts = malloc((size_t)s->ranks * sizeof *counts);
    if (!counts)
        return 0;
    snug_plan_zero_counts(s, &m->table, counts);
    *lo = snug_comm_displ(counts, s->rank);
    *n = counts[s->rank];
    free(counts);
    return 1;
}

void snug_plan_shard_master(snug_model *m, const snug_plan_spec *s) {
    m->master_sharded = 0;
    m->master_lo = 0;
    m->master_n = m->table.total;
    if (!s->with_grads || !s->zero_stage || s->ranks <= 1 || !m->lv.master_weights || m->lv.dt == SNUG_DT_F32 ||
        m->lv.lora.kind)
        return;
    /* out of memory: the whole copy, more memory than planned for ZeRO, never a wrong one */
    m->master_sharded = rank_shard(m, s, &m->master_lo, &m->master_n);
}

void snug_plan_shard_params(snug_model *m, const snug_plan_spec *s) {
    m->nranks = s->ranks > 1 ? s->ranks : 1;
    m->rank = s->rank;
    m->param_sharded = 0;
    m->pshard_lo = 0;
    m->pshard_n = m->table.total;
    int zero3 = s->with_grads && s->zero_stage >= 3 && s->ranks > 1;
    /* QLoRA: the 4-bit matrices sharded by bytes (the dense tensors whole), and/or kept in host memory */
    m->q4_sharded = m->lv.lora.kind == SNUG_ADAPTER_QLORA && (zero3 || m->lv.offload_params);
    m->q4_parts = m->q4_sharded && zero3 ? s->ranks : 1;
    m->q4_part = m->q4_sharded && zero3 ? s->rank : 0;
    if (m->lv.lora.kind == SNUG_ADAPTER_QLORA)
        return;
    if (!zero3 && m->lv.offload_params && m->lv.lora.kind && s->with_grads) {
        /* LoRA's frozen base in host memory, whole (one process, or DDP): the same layout as stage 3 with every
         * element this rank's, each layer copied into the gather region as it runs and nothing gathered */
        m->param_sharded = 1;
        return;
    }
    if (!zero3)
        return;
    /* out of memory: the whole arena, more memory than planned for ZeRO-3, never a wrong one */
    m->param_sharded = rank_shard(m, s, &m->pshard_lo, &m->pshard_n);
}

int snug_plan_shard_grads(snug_model *m, snug_arenas *A, const snug_plan_spec *s, snug_error *e) {
    m->gshard = NULL;
    m->gshard_lo = m->gshard_n = 0;
    if (!m->lv.zero_grads || m->lv.optimizer_in_backward) /* stage 3 inside backward: each layer's sum stepped */
        return 0;
    size_t *counts = malloc((size_t)s->ranks * sizeof *counts);
    if (!counts)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the ZeRO shards");
    snug_plan_zero_counts(s, &m->table, counts);
    m->gshard_lo = snug_comm_displ(counts, s->rank);
    m->gshard_n = counts[s->rank];
    free(counts);
    if (m->gshard_n && !(m->gshard = snug_arena_alloc(&A->a[SNUG_MEM_GRADS], m->gshard_n * sizeof(float), e)))
        return e ? e->code : SNUG_ENOMEM;
    return 0;
}

int snug_plan_kept(const snug_levers *lv, snug_category c) {
    return (c == SNUG_MEM_PARAMS && !lv->lora.kind) || c == SNUG_MEM_MASTER ||
           (c == SNUG_MEM_OPTIM && !lv->ckpt_model_only) || c == SNUG_MEM_ADAPTER;
}

size_t snug_plan_kept_bytes(const snug_model *m, snug_category c, size_t whole) {
    if (!snug_plan_kept(&m->lv, c))
        return 0;
    if (c == SNUG_MEM_PARAMS && m->param_sharded) /* the gather region is scratch: every layer is gathered again */
        return m->pshard_n * snug_dtype_size(m->lv.dt);
    return whole;
}

int snug_plan_snapshot_layout(snug_arenas *A, const snug_model *m, void *dst[SNUG_MEM_NCAT], snug_error *e) {
    for (int c = 0; c < SNUG_MEM_NCAT; c++) {
        dst[c] = NULL;
        size_t n = snug_plan_kept_bytes(m, (snug_category)c, A->a[c].peak);
        /* whole pages: each copy starts page-aligned (as host_alloc's block does) and goes to the disk with O_DIRECT */
        if (n && !(dst[c] = snug_arena_alloc(&A->a[SNUG_MEM_SNAPSHOT], (n + 4095) / 4096 * 4096, e)))
            return e ? e->code : SNUG_ENOMEM;
    }
    return 0;
}

size_t snug_plan_device_scratch(const snug_plan_spec *s) {
    const snug_model_config *c = &s->cfg;
    int fc = snug_block_of(c).mlp == SNUG_MLP_GELU ? c->intermediate_size : 2 * c->intermediate_size;
    int width = c->hidden_size, qkv = (c->n_head + 2 * c->n_kv_head) * c->head_dim;
    width = qkv > width ? qkv : width;
    width = fc > width ? fc : width;
    /* the linear layers' GEMMs read 16-bit weights as stored (matmul_w16) under 16-bit storage, except a QLoRA base's
     * 4-bit matrices and ZeRO-3's (or offload_params') gathered layers, which are widened */
    int w16 = s->lv.dt != SNUG_DT_F32 && s->lv.lora.kind != SNUG_ADAPTER_QLORA &&
              !(s->with_grads && s->zero_stage >= 3 && s->ranks > 1) &&
              !(s->with_grads && s->lv.lora.kind && s->lv.offload_params);
    return snug_cuda_scratch_bytes((size_t)s->B * (size_t)s->T, c->n_head, width, w16 ? width : 0);
}

int snug_plan_model_init(snug_model *m, const snug_plan_spec *s, snug_error *e) {
    char why[256];
    if (!snug_tp_config(&s->cfg, s->tp, &m->cfg, why, sizeof why))
        return snug_fail(e, SNUG_EINPUT, "%s", why);
    m->tp = s->tp > 1 ? s->tp : 1;
    m->tp_rank = s->tp > 1 ? s->tp_rank : 0;
    m->tp_cfg = s->cfg;
    m->blk = snug_block_of(&m->cfg);
    m->tp_vocab = snug_tp_vocab_split(&s->cfg, s->tp, s->device_cuda);
    if (m->tp_vocab) /* the rank's rows of the embedding and the head */
        m->cfg.vocab_size = s->cfg.vocab_size / s->tp;
    m->lv = snug_plan_levers(s);
    m->pp = s->pp > 1 ? s->pp : 1;
    m->pp_stage = m->pp > 1 ? s->pp_stage : 0;
    m->pp_L = s->cfg.n_layer;
    m->pp_l0 = 0;
    if (m->pp > 1) { /* the stage's layers, the embedding on the first, the head on the last */
        int n;
        m->pp_split = s->pp_split;
        if (snug_pp_layers(s->cfg.n_layer, m->pp, s->pp_split, m->pp_stage, &m->pp_l0, &n)) {
            char list[256] = "";
            for (int k = 0, len = 0; k < s->pp_split.n && len < (int)sizeof list; k++)
                len += snprintf(list + len, sizeof list - (size_t)len, "%s%d", k ? "," : "", s->pp_split.layers[k]);
            return s->pp_split.n
                       ? snug_fail(e, SNUG_EINPUT, "pipeline_layers '%s' does not split the model's %d layers into "
                                   "%d stages: list %d counts of at least 1 that sum to %d", list,
                                   s->cfg.n_layer, m->pp, m->pp, s->cfg.n_layer)
                       : snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size %d is more than the model's %d layers: "
                                   "each stage takes at least one; choose at most %d", m->pp, s->cfg.n_layer,
                                   s->cfg.n_layer);
        }
        m->cfg.n_layer = n;
        m->pp_slots = m->pp - m->pp_stage; /* 1F1B: the micro-batches in flight on this stage at most */
        m->pp_keep = s->pp_recompute || snug_pp_last(m) ? 1 : m->pp_slots; /* their activations, or inputs alone */
    }
    int parts = (snug_pp_first(m) ? SNUG_PARTS_EMBED : 0) | (snug_pp_last(m) ? SNUG_PARTS_HEAD : 0);
    SNUG_TRY(snug_param_table_build_part(&m->table, &m->cfg, m->pp_l0, parts, e));
    /* unfrozen_parameters: the plan and the run freeze the same tensors (a stage's patterns may match none of its) */
    return snug_param_table_freeze(&m->table, s->unfrozen, NULL, e);
}

int snug_plan_run(snug_plan *p, const snug_plan_spec *s, snug_error *e) {
    memset(p, 0, sizeof *p);
    SNUG_TRY(snug_plan_spec_check(s, e));
    snug_model m;
    memset(&m, 0, sizeof m);
    int B = s->B, T = s->T;
    SNUG_TRY(snug_plan_model_init(&m, s, e));
    snug_plan_shard_master(&m, s);
    snug_plan_shard_params(&m, s);
    snug_arenas A;
    snug_arenas_init_counting(&A);
    int rc = snug_model_layout(&m, &A, B, T, s->with_grads, e);
    if (!rc && s->with_grads)
        rc = snug_plan_shard_grads(&m, &A, s, e);
    snug_adamw opt = {.kind = s->optim, .paged = s->optim_paged, .stage16 = m.lv.dt != SNUG_DT_F32 && !m.lora.on};
    if (!rc && s->with_grads)
        rc = snug_plan_shard_optimizer(&opt, s, snug_model_trainable(&m), e);
    if (!rc && s->with_grads)
        rc = snug_adamw_layout(&opt, &A, snug_model_trainable(&m), NULL, e);
    void *snap[SNUG_MEM_NCAT];
    if (!rc && s->with_grads && s->ckpt_snapshot)
        rc = snug_plan_snapshot_layout(&A, &m, snap, e);
    if (!rc) {
        p->host[SNUG_MEM_SNAPSHOT] = A.a[SNUG_MEM_SNAPSHOT].peak > 0;
        p->host[SNUG_MEM_OPTIM] = s->with_grads && s->optim_paged;
        p->host[SNUG_MEM_OFFLOAD] = A.a[SNUG_MEM_OFFLOAD].peak > 0; /* gradient_checkpointing: offload */
        for (int c = 0; c < SNUG_MEM_NCAT; c++) {
            p->bytes[c] = A.a[c].peak;
            *(p->host[c] ? &p->host_total : &p->total) += A.a[c].peak;
        }
        p->nparams = (long long)m.table.total;
        p->ntrain = (long long)snug_param_table_trained(snug_model_trainable(&m));
        for (int i = 0; i < m.table.n; i++)
            if (m.table.e[i].numel > p->largest_tensor)
                p->largest_tensor = m.table.e[i].numel;
        p->B = B;
        p->T = T;
        p->xent_chunk = m.xent_chunk;
        p->vocab_block = m.vb;
        p->device_scratch = snug_plan_device_scratch(s);
        p->ranks = s->ranks > 1 ? s->ranks : 1;
        int world = p->ranks > 1 ? p->ranks : s->tp > 1 ? s->tp : 1; /* tensor parallelism sums over its ranks */
        p->comm_scratch = world > 1 && s->comm_deterministic ? SNUG_NCCL_SCRATCH_BYTES(world) : 0;
    }
    snug_model_free_host(&m);
    return rc;
}

void snug_format_bytes(char *buf, size_t n, double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) {
        b /= 1024.0;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

void snug_plan_print(FILE *f, const snug_plan *p, const size_t *measured) {
    char a[32], b[32], name[64];
    int w = 20, any_host = 0; /* a host-resident (paged) category widens the name column */
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        any_host |= p->host[c];
    if (any_host)
        w = 30;
    fprintf(f, "  %-*s %12s%s\n", w, "memory", "planned", measured ? "     measured peak" : "");
    size_t mt = 0, mh = 0; /* measured device and host totals */
    for (int c = 0; c < SNUG_MEM_NCAT; c++) {
        snug_format_bytes(a, sizeof a, (double)p->bytes[c]);
        snprintf(name, sizeof name, !p->host[c] ? "%s" : c == SNUG_MEM_OPTIM ? "%s (paged, host)" : "%s (host)",
                 snug_category_name((snug_category)c));
        if (measured) {
            *(p->host[c] ? &mh : &mt) += measured[c];
            snug_format_bytes(b, sizeof b, (double)measured[c]);
            fprintf(f, "  %-*s %12s  %16s\n", w, name, a, b);
        } else {
            fprintf(f, "  %-*s %12s\n", w, name, a);
        }
    }
    snug_format_bytes(a, sizeof a, (double)p->total);
    if (measured) {
        snug_format_bytes(b, sizeof b, (double)mt);
        fprintf(f, "  %-*s %12s  %16s\n", w, any_host ? "total on the device" : "total", a, b);
    } else {
        fprintf(f, "  %-*s %12s\n", w, any_host ? "total on the device" : "total", a);
    }
    if (any_host) {
        snug_format_bytes(a, sizeof a, (double)p->host_total);
        snug_format_bytes(b, sizeof b, (double)mh);
        if (measured)
            fprintf(f, "  %-*s %12s  %16s\n", w, "total in host memory", a, b);
        else
            fprintf(f, "  %-*s %12s\n", w, "total in host memory", a);
    }
}
