/* save.c: the final save of a run whose weights are spread over its ranks (see save.h). */
#include "train/save.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "model/model.h"
#include "plan/plan.h"
#include "train/merge.h"
#include "train/parallel.h"
#include "train/pipeline.h"
#include "train/report.h"
#include "train/state.h"

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
 * agree before the gathers and after the write, as snug_stream_save does. */
int snug_pp_save_adapter(snug_run *r, snug_comm *c, snug_comm *ppc, int *broken, snug_error *e) {
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
    rc = snug_ddp_agree(c, rc, broken, e);
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
        rc = snug_ddp_agree(c, rc, broken, e);
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
    int rc = snug_ddp_agree(ms->comm, 0, ms->broken, e);
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
int snug_stream_save(snug_run *r, snug_comm *c, snug_comm *dpc, snug_comm *tpc, const size_t *shard, int *broken,
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
        rc = snug_ddp_agree(c, rc, broken, e);
    free(ms.counts);
    free(ms.slices);
    snug_param_table_free(&ms.whole);
    free(order);
    free(buf);
    return rc;
}

int snug_save_final(snug_loop *l, int rc, snug_error *e) {
    snug_run *r = l->r;
    const snug_run_config *o = &r->s.c;
    FILE *out = r->out;
    snug_comm *dp = r->dp, *tp = r->tp;
    int lead = r->lead;
    if (!rc && !l->stopped && (r->eng.model.master_sharded || r->eng.model.param_sharded || r->gn > 1) &&
        !r->eng.model.lora.on) {
        /* ZeRO-3: training is over, so the gradients and the optimizer state go before the save's tensor-sized
         * buffers are touched, and the save never raises the peak (the arenas' high-water marks stay recorded) */
        for (int c = SNUG_MEM_GRADS; r->eng.model.param_sharded && c <= SNUG_MEM_OPTIM; c++)
            snug_engine_release(&r->eng, (snug_category)c);
        /* a failure on one rank mid-stream ends the save on every rank, each with its error */
        rc = snug_stream_save(r, &r->comm, dp, r->gn > 1 ? tp : NULL, l->par.shard, &r->broken, e);
    } else if (!rc && !l->stopped && r->ppn > 1 && r->eng.model.lora.on) { /* every stage's adapters */
        rc = snug_pp_save_adapter(r, &r->comm, tp, &r->broken, e);
    } else if (!rc && !l->stopped && lead) {
        rc = snug_save_hf_folder(o->output_dir, &r->s, &r->eng, e);
    }
    /* load_best_model_at_end: the weights saved are those of the checkpoint with the lowest validation loss */
    if (!rc && !l->stopped && lead && l->load_best && l->st.best_step && l->st.best_step != l->st.step) {
        char ck[4096];
        snprintf(ck, sizeof ck, "%s/checkpoint-%d", o->output_dir, l->st.best_step);
        rc = snug_checkpoint_take_weights(ck, o->output_dir, snug_checkpoint_final_dtype(&r->s.cfg), e);
        if (!rc)
            fprintf(out, "load_best_model_at_end: the model saved is checkpoint-%d's (validation loss %.6g, the "
                    "lowest), not step %d's\n", l->st.best_step, l->st.best_val, l->st.step);
    }
    if (!rc && !l->stopped && lead && o->merge_lora) {
        char merged[4096];
        snug_path_join(merged, sizeof merged, o->output_dir, "merged");
        double tm = snug_now_s();
        /* an adapter of a quantized base goes onto the base's round trip: the weights it was trained against */
        const snug_lora_cfg *q = r->eng.model.lv.lora.kind == SNUG_ADAPTER_QLORA ? &r->eng.model.lv.lora : NULL;
        rc = snug_merge_lora(o->base_model, o->output_dir, merged, q, o->threads, e);
        if (!rc)
            fprintf(out, "merged the adapter into %s%s%s%s: %s in %.1f s\n", o->base_model, q ? " (its " : "",
                    q ? snug_q4_width((snug_q4_type)q->q4_type) : "", q ? " round trip, as training saw it)" : "",
                    merged, snug_now_s() - tm);
    }
    return rc;
}
