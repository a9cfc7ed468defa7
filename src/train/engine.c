/* engine.c: plan, allocate, lay out (see engine.h). */
#include "train/engine.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend_select.h"
#include "plan/autofit.h"
#include "plan/gpus.h"

int snug_engine_create(snug_engine *g, const snug_plan_spec *spec, snug_backend_choice device, int threads,
                       snug_error *e) {
    snug_plan plan;
    memset(g, 0, sizeof *g);
    SNUG_TRY(snug_plan_run(&plan, spec, e));
    return snug_engine_create_planned(g, spec, &plan, device, threads, e);
}

int snug_engine_create_planned(snug_engine *g, const snug_plan_spec *spec, const snug_plan *plan,
                               snug_backend_choice device, int threads, snug_error *e) {
    memset(g, 0, sizeof *g);
    g->plan = *plan;
    const snug_model_config *c = &spec->cfg;
    int fc = snug_block_of(c).mlp == SNUG_MLP_GELU ? c->intermediate_size : 2 * c->intermediate_size;
    /* a GPU's scratch: the plan's size, which its overhead counts */
    if (!(g->be = snug_backend_create(device, threads, g->plan.device_scratch, e)))
        return e ? e->code : SNUG_EINPUT;
    /* mixed precision: a GPU's GEMMs may use its 16-bit tensor cores, a CPU's its bf16 units; the CPU may time them on
     * the MLP's first GEMM (tokens x fc width x model width) */
    SNUG_TRY(snug_backend_set_math(g->be, spec->lv.dt, spec->B * spec->T, fc, c->hidden_size, e));
    /* memory_budget: a plan over it is refused before anything is allocated; the arenas share out what is left */
    double slack = 0;
    if (spec->memory_budget > 0) {
        double host = g->be->host_resident ? (double)g->plan.host_total : 0.0; /* the CPU's host is its device */
        slack = spec->memory_budget - (double)g->plan.total - host - spec->budget_overhead;
        if (slack < 0)
            return snug_fail_over_budget(e, &g->plan, spec->memory_budget, spec->budget_overhead);
    }
    /* a plan larger than the machine is refused with the numbers, not left to fail (or to swap) mid-allocation */
    int on_cpu = g->be->host_resident;
    double ram = snug_host_memory_bytes(), host_need = (double)(g->plan.host_total + (on_cpu ? g->plan.total : 0));
    double dev_free = on_cpu ? 0 : (double)snug_backend_device_free(g->be);
    if ((ram > 0 && host_need > ram) || (dev_free > 0 && (double)g->plan.total > dev_free)) {
        int dev = !(ram > 0 && host_need > ram);
        char need[32], have[32];
        snug_format_bytes(need, sizeof need, dev ? (double)g->plan.total : host_need);
        snug_format_bytes(have, sizeof have, dev ? dev_free : ram);
        return snug_fail(e, SNUG_EINPUT, "the memory plan needs %s of %s and %s %s; run `snug plan` with the same "
                         "options to see which levers make it fit, or set auto_fit: true with a memory_budget", need,
                         dev ? "GPU memory" : "host memory", dev ? "the GPU has" : "this machine has", have);
    }
    g->model.be = g->be;
    SNUG_TRY(snug_plan_model_init(&g->model, spec, e));
    if (g->model.lv.vocab_block && !g->be->xent_block)
        return snug_fail(e, SNUG_EINPUT, "loss_vocab_block: the loss over blocks of the head's rows is not built for "
                         "the %s backend; set loss_vocab_block: -1", g->be->name ? g->be->name : "this");
    snug_plan_shard_master(&g->model, spec);
    snug_plan_shard_params(&g->model, spec);
    for (int c = 0; c < SNUG_MEM_NCAT; c++) {
        size_t cap = g->plan.bytes[c];
        void *blk = cap ? (g->plan.host[c] ? g->be->host_alloc(g->be, cap) : g->be->alloc(g->be, cap)) : NULL;
        if (cap && !(g->blocks[c] = blk)) {
            char b[32];
            snug_format_bytes(b, sizeof b, (double)cap);
            return snug_fail(e, SNUG_EINPUT, "cannot allocate %s%s for %s; lower micro_batch_size or sequence_len, "
                             "or see `snug plan` for the levers that shrink it",
                             b, g->plan.host[c] ? " of host memory" : "", snug_category_name((snug_category)c));
        }
        snug_arena_init(&g->arenas.a[c], (snug_category)c, g->blocks[c], cap);
        if (spec->memory_budget > 0)
            g->arenas.a[c].budget = cap + (size_t)slack;
    }
    SNUG_TRY(snug_model_layout(&g->model, &g->arenas, spec->B, spec->T, spec->with_grads, e));
    if (spec->with_grads)
        SNUG_TRY(snug_plan_shard_grads(&g->model, &g->arenas, spec, e));
    if (spec->with_grads) {
        g->opt.kind = spec->optim;
        g->opt.paged = spec->optim_paged;
        g->opt.stage16 = spec->lv.dt != SNUG_DT_F32 && !g->model.lora.on;
        SNUG_TRY(snug_plan_shard_optimizer(&g->opt, spec, snug_model_trainable(&g->model), e));
        SNUG_TRY(snug_adamw_layout(&g->opt, &g->arenas, snug_model_trainable(&g->model), g->be, e));
        if (spec->ckpt_snapshot)
            SNUG_TRY(snug_plan_snapshot_layout(&g->arenas, &g->model, g->snapshot, e));
    }
    if (snug_model_init_rope(&g->model))
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the RoPE tables");
    return 0;
}

void snug_engine_release(snug_engine *g, snug_category c) {
    if (g->blocks[c])
        (g->plan.host[c] ? g->be->host_free : g->be->free)(g->be, g->blocks[c]);
    g->blocks[c] = NULL;
}

void snug_engine_free(snug_engine *g) {
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        snug_engine_release(g, (snug_category)c);
    if (g->be)
        g->be->destroy(g->be);
    snug_model_free_host(&g->model);
    memset(g, 0, sizeof *g);
}
