/* autofit.c: the lever search behind the fit table of `snug plan` and behind `auto_fit: true` (see autofit.h).
 *
 * Savings are exact: every setting is planned by snug_plan_run, i.e. by the layout code the trainer allocates with.
 * Costs are predictions of the step time, relative to the configured run (assumptions, stated in docs/MEMORY.md):
 *  - full checkpointing re-runs the forward of each checkpointed layer: about 8N instead of 6N FLOPs per token on
 *    those layers, +33% when every layer is checkpointed (Korthikanti et al. 2022; torchtune measured -21% tokens/s);
 *  - selective checkpointing recomputes the norm outputs and the MLP activation, elementwise work: +2%;
 *  - chunked cross-entropy runs the same FLOPs in smaller GEMMs: +1%;
 *  - a smaller micro-batch runs the same FLOPs in smaller GEMMs, whose efficiency falls as tokens per micro-batch
 *    drop: time ~ 1 + N0 / tokens, with N0 = 512 tokens on a GPU and 64 on the CPU;
 *  - flash attention (instead of the naive path) costs nothing;
 *  - 8-bit AdamW state: +5% (torchtune's ablation measured -4.7% tokens/s for 8-bit AdamW);
 *  - a paged optimizer streams its state to the GPU and back every step (PCIe at an effective 25 GB/s), not
 *    overlapped with forward and backward: the transfer time over the compute time of a step, both estimated for an
 *    A100 80GB (its FP32 or bf16 peak, as the run's precision, x SNUG_ASSUMED_MFU: plan/gpus.c). On the CPU backend host memory is the device: no saving;
 *  - a tiled MLP recomputes the MLP's forward in backward on every layer that full checkpointing does not already
 *    recompute (a third of the step's FLOPs times the MLP's share of the block's linear FLOPs), and runs smaller
 *    GEMMs: +1%;
 *  - offload_embedding reads the micro-batch's embedding rows over PCIe (tokens x hidden x 2 bytes): nothing;
 *  - offload_params copies each layer's frozen weights (QLoRA's 4-bit matrices; the rank's piece at ZeRO-3) over PCIe (an effective 25
 *    GB/s) before its forward and its backward. On one process the next layer's copy runs beside the compute: the
 *    transfer beyond the compute (an A100 80GB's, as for paging) plus one layer's exposed per pass; at ZeRO-3 the
 *    pieces are copied on the compute stream, all exposed. Nothing on the CPU;
 *  - over several ranks, a ZeRO stage sends the bytes plan/ranks.h gives per step. On a GPU (an A100 80GB assumed, as
 *    for paging) at its collective bandwidth, exposed as plan/ranks.h's snug_rank_exposed_s says (the buckets, the
 *    prefetched gathers and the overlapped reduce-scatters behind the compute); on CPU ranks at
 *    SNUG_FIT_CPU_COMM_BPS against a compute rate of SNUG_FIT_CPU_RANK_FLOPS, all exposed (a rank's one thread both
 *    computes and reduces). */
#include "plan/autofit.h"

#include "plan/plan_json.h"
#include "plan/ranks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double snug_fit_time_factor(const snug_plan_spec *s, int GA, snug_device_kind kind) {
    const snug_levers *lv = &s->lv;
    int L = s->cfg.n_layer > 0 ? s->cfg.n_layer : 1;
    double f = 1.0, tokens = (double)s->B * s->T;
    if (lv->ckpt == SNUG_CKPT_FULL) {
        int every = lv->ckpt_every > 0 ? lv->ckpt_every : 1;
        f *= 1.0 + (double)((L + every - 1) / every) / L / 3.0;
    } else if (lv->ckpt == SNUG_CKPT_SELECTIVE) {
        f *= 1.02;
    }
    if (lv->xent_chunk > 0 && lv->xent_chunk < tokens)
        f *= 1.01;
    f *= 1.0 + (kind == SNUG_DEVICE_CUDA ? 512.0 : 64.0) / tokens;
    if (lv->mlp_shards) {
        const snug_model_config *c = &s->cfg;
        double C = c->hidden_size, I = c->intermediate_size, q = (double)c->n_head * c->head_dim;
        double kv = (double)c->n_kv_head * c->head_dim;
        double mlp = (snug_block_of(c).mlp == SNUG_MLP_GELU ? 2.0 : 3.0) * C * I;
        double share = mlp / (mlp + C * (q + 2 * kv) + q * C);
        int every = lv->ckpt_every > 0 ? lv->ckpt_every : 1;
        double redone = lv->ckpt == SNUG_CKPT_FULL ? (double)((L + every - 1) / every) / L : 0.0;
        f *= 1.01 + (1.0 - redone) * share / 3.0;
    }
    if (s->ranks > 1) { /* the step's communication over its compute */
        snug_plan_spec g = *s;
        g.GA = GA > 0 ? GA : 1;
        long long P = snug_model_config_nparams(&s->cfg);
        double bytes = snug_rank_comm_bytes(&g, P, s->ranks, s->zero_stage), comp = 0, exposed = 0;
        if (kind == SNUG_DEVICE_CUDA) {
            const snug_gpu *gpu = snug_gpu_find("a100-80gb");
            double tps = snug_gpu_tokens_per_s(gpu, s, P), comm = bytes / (gpu->link_gbps * 1e9);
            comp = tps > 0 ? tokens * g.GA / tps : 0.0;
            g.device_cuda = 1; /* NCCL: the collectives beside the compute stream */
            exposed = comm > 0 ? snug_rank_exposed_s(&g, P, s->ranks, s->zero_stage, comp, gpu->link_gbps * 1e9) : 0.0;
        } else {
            comp = tokens * g.GA * snug_flops_per_token(s, P) / SNUG_FIT_CPU_RANK_FLOPS;
            exposed = bytes / SNUG_FIT_CPU_COMM_BPS;
        }
        f *= 1.0 + (comp > 0 ? exposed / comp : 0.0);
    }
    if (lv->offload_params && lv->lora.kind && kind == SNUG_DEVICE_CUDA) {
        long long P = snug_model_config_nparams(&s->cfg);
        int parts = s->zero_stage >= 3 && s->ranks > 1 ? s->ranks : 1;
        double pass = snug_rank_base_bytes(s, P) / parts / 25e9; /* one pass's copies, s */
        double tps = snug_gpu_tokens_per_s(snug_gpu_find("a100-80gb"), s, P);
        double compute = tps > 0 ? tokens / tps : 0.0; /* one micro-batch */
        /* one process: the side stream's copies beside the compute; at ZeRO-3 the rank's pieces on the compute
         * stream, exposed (model/gather.c's model_q4_layer) */
        double exposed = parts > 1 ? 2 * pass : fmax(0.0, 2 * pass - compute) + 2 * pass / L;
        f *= 1.0 + (compute > 0 ? exposed / compute : 0.0);
    }
    if (s->optim == SNUG_OPTIM_ADAMW_8BIT)
        f *= 1.05;
    if (s->optim_paged && kind == SNUG_DEVICE_CPU) {
        f *= 1.01; /* chunks copied within host memory */
    } else if (s->optim_paged) {
        long long P = snug_model_config_nparams(&s->cfg);
        double state = (double)P * (s->optim == SNUG_OPTIM_ADAMW_8BIT ? 2.03 : 8.0);
        double tps = snug_gpu_tokens_per_s(snug_gpu_find("a100-80gb"), s, P);
        double compute = tps > 0 ? tokens * (GA > 0 ? GA : 1) / tps : 0.0;
        f *= 1.0 + (compute > 0 ? 2.0 * state / 25e9 / compute : 0.0);
    }
    return f;
}

void snug_levers_describe(const snug_levers *lv, int B, int T, char *buf, size_t n) {
    char ck[64];
    if (lv->ckpt == SNUG_CKPT_FULL && lv->ckpt_every > 1)
        snprintf(ck, sizeof ck, "%s (every %d layers)", snug_ckpt_lever_name(lv), lv->ckpt_every);
    else
        snprintf(ck, sizeof ck, "%s", snug_ckpt_lever_name(lv));
    size_t N = (size_t)B * T;
    if (lv->xent_chunk > 0 && (size_t)lv->xent_chunk < N)
        snprintf(buf, n, "gradient_checkpointing %s, %s attention, cross-entropy in chunks of %d tokens", ck,
                 lv->naive_attention ? "naive" : "flash", lv->xent_chunk);
    else
        snprintf(buf, n, "gradient_checkpointing %s, %s attention, cross-entropy over all %zu tokens at once", ck,
                 lv->naive_attention ? "naive" : "flash", N);
}

/* Appends "a + b" style parts to the point's description and counts the changes against the base. */
static void describe(snug_fit_point *p, const snug_plan_spec *base, int baseGA) {
    const snug_levers *a = &p->spec.lv, *b = &base->lv;
    size_t len = 0, n = sizeof p->what;
    p->what[0] = '\0';
    p->changes = 0;
#define PART(...)                                                                                 \
    do {                                                                                          \
        if (len < n)                                                                              \
            len += (size_t)snprintf(p->what + len, n - len, "%s", p->changes ? " + " : "");       \
        if (len < n)                                                                              \
            len += (size_t)snprintf(p->what + len, n - len, __VA_ARGS__);                         \
        p->changes++;                                                                             \
    } while (0)
    if (a->naive_attention != b->naive_attention)
        PART("flash_attention: %s", a->naive_attention ? "false" : "true");
    if (a->xent_chunk != b->xent_chunk)
        PART(a->xent_chunk ? "chunked_cross_entropy (%d tokens)" : "cross-entropy unchunked", a->xent_chunk);
    if (a->ckpt != b->ckpt || (a->ckpt == SNUG_CKPT_FULL && a->ckpt_every != b->ckpt_every)) {
        if (a->ckpt == SNUG_CKPT_FULL && a->ckpt_every > 1)
            PART("gradient_checkpointing: full, every %d layers", a->ckpt_every);
        else
            PART("gradient_checkpointing: %s", snug_ckpt_names[a->ckpt]);
    }
    if (p->spec.optim != base->optim || p->spec.optim_paged != base->optim_paged)
        PART("optimizer: %s", snug_optim_name(p->spec.optim, p->spec.optim_paged));
    if (p->spec.B != base->B || p->GA != baseGA)
        PART("micro_batch_size %d x %d accumulation", p->spec.B, p->GA);
    if (p->spec.ckpt_snapshot != base->ckpt_snapshot)
        PART("async_checkpoint: %s", p->spec.ckpt_snapshot ? "true" : "false");
    if (a->mlp_shards != b->mlp_shards) {
        if (a->mlp_shards > 0)
            PART("tiled_mlp: true, %d shards", a->mlp_shards);
        else
            PART("tiled_mlp: %s", a->mlp_shards ? "true" : "false");
    }
    if (a->offload_embedding != b->offload_embedding)
        PART("offload_embedding: %s", a->offload_embedding ? "true" : "false");
    if (a->offload_params != b->offload_params)
        PART("offload_params: %s", a->offload_params ? "true" : "false");
    if (p->spec.zero_stage != base->zero_stage)
        PART("zero_stage: %d", p->spec.zero_stage);
#undef PART
    if (!p->changes)
        snprintf(p->what, n, "as configured");
}

static int add_point(snug_fit_space *s, int *cap, const snug_plan_spec *sp, int GA, const snug_plan_spec *base,
                     int baseGA, double base_factor, snug_error *e) {
    if (sp->with_grads && sp->lv.optimizer_in_backward && GA > 1)
        return 0; /* the step inside backward cannot accumulate: not a setting that can run */
    if (s->n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        snug_fit_point *np = realloc(s->pt, (size_t)nc * sizeof *np);
        if (!np)
            return snug_fail(e, SNUG_ENOMEM, "out of memory planning the lever settings");
        s->pt = np;
        *cap = nc;
    }
    snug_fit_point *p = &s->pt[s->n];
    memset(p, 0, sizeof *p);
    p->spec = *sp;
    p->spec.GA = GA;
    p->GA = GA;
    SNUG_TRY(snug_plan_run(&p->plan, &p->spec, e));
    /* the largest rank's plan (ZeRO's shard edges on blocks make the ranks differ a little; pipeline stages hold
     * different layers), so that every rank, searching the same space, makes the same choice and the choice fits
     * each of them */
    int nr = p->spec.ranks > 1 && p->spec.zero_stage ? p->spec.ranks : 1, ns = p->spec.pp > 1 ? p->spec.pp : 1;
    for (int k = 0; nr * ns > 1 && k < nr * ns; k++) {
        snug_plan_spec t = p->spec;
        snug_plan q;
        if (nr > 1)
            t.rank = k % nr;
        if (ns > 1)
            t.pp_stage = k / nr;
        SNUG_TRY(snug_plan_run(&q, &t, e));
        if (q.total + q.host_total > p->plan.total + p->plan.host_total)
            p->plan = q;
    }
    p->cost = snug_fit_time_factor(sp, GA, s->kind) / base_factor - 1.0;
    describe(p, base, baseGA);
    s->n++;
    return 0;
}

int snug_fit_space_build(snug_fit_space *s, const snug_plan_spec *base, snug_device_kind kind, size_t host_data_bytes,
                         snug_error *e) {
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->host_data_bytes = host_data_bytes;
    int cap = 0, GA = base->GA > 1 ? base->GA : 1;
    double base_factor = snug_fit_time_factor(base, GA, kind);
    int rc = add_point(s, &cap, base, GA, base, GA, base_factor, e);

    /* the lever values to combine; the configured value of each comes first */
    snug_levers ck[4];
    int nck = 0;
    ck[nck++] = base->lv;
    const snug_ckpt modes[] = {SNUG_CKPT_NONE, SNUG_CKPT_SELECTIVE, SNUG_CKPT_FULL, SNUG_CKPT_FULL};
    const int every[] = {1, 1, 1, 2};
    for (int i = 0; i < 4; i++) {
        int same = base->lv.ckpt == modes[i] &&
                   (modes[i] != SNUG_CKPT_FULL || (base->lv.ckpt_every > 0 ? base->lv.ckpt_every : 1) == every[i]);
        if (same)
            continue;
        ck[nck] = base->lv;
        ck[nck].ckpt = modes[i];
        ck[nck].ckpt_every = every[i];
        nck++;
    }
    int xent[2] = {base->lv.xent_chunk, SNUG_FIT_XENT_CHUNK}, nxent = 1;
    if (base->lv.xent_chunk == 0 || base->lv.xent_chunk > SNUG_FIT_XENT_CHUNK)
        nxent = 2;
    int naive[2] = {base->lv.naive_attention, 0}, nnaive = base->lv.naive_attention ? 2 : 1;
    /* optimizer state: the configured one, then 8-bit, paged 8-bit and paged 32-bit */
    struct { snug_optim_kind k; int paged; } opt[4] = {{base->optim, base->optim_paged}};
    int nopt = 1;
    const struct { snug_optim_kind k; int paged; } alt[3] = {
        {SNUG_OPTIM_ADAMW_8BIT, 0}, {SNUG_OPTIM_ADAMW_8BIT, 1}, {SNUG_OPTIM_ADAMW, 1}};
    for (int i = 0; i < 3 && base->with_grads; i++)
        if (alt[i].k != base->optim || alt[i].paged != base->optim_paged) {
            opt[nopt].k = alt[i].k;
            opt[nopt].paged = alt[i].paged;
            nopt++;
        }
    long E = (long)base->B * GA; /* the effective batch, kept */
    /* on the CPU the checkpoint snapshot is the same memory: writing checkpoints in place is a lever there */
    int nsnap = kind == SNUG_DEVICE_CPU && base->ckpt_snapshot ? 2 : 1;
    /* a tiled MLP (SNUG_FIT_MLP_SHARDS shards) and, for a frozen 16-bit untied embedding on a GPU, its place */
    int tiled[2] = {base->lv.mlp_shards, SNUG_FIT_MLP_SHARDS}, ntiled = base->lv.mlp_shards ? 1 : 2;
    int emb[2] = {base->lv.offload_embedding, 1};
    int nemb = !base->lv.offload_embedding && kind == SNUG_DEVICE_CUDA && base->lv.lora.kind &&
                       base->lv.dt != SNUG_DT_F32 && !base->cfg.tie_embeddings ? 2 : 1;
    /* and for a frozen base (an adapter's) on a GPU, its place (offload_params) */
    int offp[2] = {base->lv.offload_params, 1};
    int noff = !base->lv.offload_params && kind == SNUG_DEVICE_CUDA && base->lv.lora.kind && base->with_grads ? 2 : 1;

    /* over several ranks, the ZeRO stages from the configured one up to zero_max */
    int zlo = base->zero_stage, nz = base->ranks > 1 && base->zero_max > zlo ? base->zero_max - zlo + 1 : 1;

    for (long b = E; b >= 1 && !rc; b--) {
        if (E % b || b > 1 << 20)
            continue;
        for (int i = 0; i < nck && !rc; i++)
            for (int x = 0; x < nxent && !rc; x++)
                for (int a = 0; a < nnaive && !rc; a++)
                    for (int k = 0; k < nopt && !rc; k++)
                        for (int w = 0; w < nsnap * ntiled * nemb * noff * nz && !rc; w++) {
                            int ws = w % nsnap, wt = w / nsnap % ntiled, we = w / nsnap / ntiled % nemb;
                            int wo = w / nsnap / ntiled / nemb % noff, z = w / nsnap / ntiled / nemb / noff;
                            if (b == base->B && i == 0 && x == 0 && a == 0 && k == 0 && w == 0)
                                continue; /* the configured run, already pt[0] */
                            snug_plan_spec sp = *base;
                            sp.zero_stage = zlo + z;
                            sp.B = (int)b;
                            sp.lv = ck[i];
                            sp.lv.xent_chunk = xent[x];
                            sp.lv.naive_attention = naive[a];
                            sp.optim = opt[k].k;
                            sp.optim_paged = opt[k].paged;
                            sp.ckpt_snapshot = base->ckpt_snapshot && ws == 0;
                            sp.lv.mlp_shards = tiled[wt];
                            sp.lv.offload_embedding = emb[we];
                            sp.lv.offload_params = offp[wo];
                            if (sp.zero_stage && snug_rank_zero_unbuilt(&sp, sp.zero_stage))
                                continue; /* a stage that does not run with these levers (an adapter's below 3) */
                            rc = add_point(s, &cap, &sp, (int)(E / b), base, GA, base_factor, e);
                        }
    }
    if (rc)
        snug_fit_space_free(s);
    return rc;
}

void snug_fit_space_free(snug_fit_space *s) {
    free(s->pt);
    memset(s, 0, sizeof *s);
}

/* A plan's memory on device kind: arenas plus runtime overhead (on the CPU backend a paged optimizer's host memory is
 * the same memory) */
static double plan_need(const snug_plan *p, snug_device_kind kind, size_t host_data_bytes) {
    snug_overhead ov;
    snug_overhead_compute(&ov, kind, p, host_data_bytes);
    double host = kind == SNUG_DEVICE_CPU ? (double)p->host_total : 0.0;
    return (double)p->total + host + (double)ov.total;
}

double snug_fit_point_need(const snug_fit_space *s, const snug_fit_point *p) {
    return plan_need(&p->plan, s->kind, s->host_data_bytes);
}

/* a before b: cheaper, then fewer changes, then less memory */
static int better(const snug_fit_space *s, const snug_fit_point *a, const snug_fit_point *b) {
    if (!b)
        return 1;
    if (fabs(a->cost - b->cost) > 1e-9)
        return a->cost < b->cost;
    if (a->changes != b->changes)
        return a->changes < b->changes;
    return snug_fit_point_need(s, a) < snug_fit_point_need(s, b);
}

const snug_fit_point *snug_fit_best(const snug_fit_space *s, double capacity) {
    const snug_fit_point *best = NULL;
    for (int i = 0; i < s->n; i++)
        if (snug_fit_point_need(s, &s->pt[i]) <= capacity && better(s, &s->pt[i], best))
            best = &s->pt[i];
    return best;
}

const snug_fit_point *snug_fit_smallest(const snug_fit_space *s) {
    const snug_fit_point *best = NULL;
    double bn = 0;
    for (int i = 0; i < s->n; i++) {
        double n = snug_fit_point_need(s, &s->pt[i]);
        if (!best || n < bn || (n == bn && s->pt[i].cost < best->cost)) {
            best = &s->pt[i];
            bn = n;
        }
    }
    return best;
}

static const char *cost_note(const snug_fit_point *p, const snug_fit_point *base) {
    const snug_levers *a = &p->spec.lv, *b = &base->spec.lv;
    if (a->naive_attention != b->naive_attention)
        return "no (T, T) probabilities; no extra work";
    if (a->xent_chunk != b->xent_chunk)
        return "the same FLOPs in smaller GEMMs";
    if (a->mlp_shards != b->mlp_shards)
        return a->ckpt == SNUG_CKPT_FULL && a->ckpt_every <= 1 ? "the same FLOPs in smaller GEMMs"
                                                                : "recomputes the MLP in backward, shard by shard";
    if (a->offload_embedding != b->offload_embedding)
        return "the batch's embedding rows read over PCIe";
    if (a->offload_params != b->offload_params)
        return "each layer's frozen weights copied over PCIe, beside the compute";
    if (p->spec.optim_paged && !base->spec.optim_paged)
        return "state streamed over PCIe every step";
    if (p->spec.optim != base->spec.optim)
        return p->spec.optim == SNUG_OPTIM_ADAMW_8BIT ? "quantize/dequantize in the step" : "fp32 state";
    if (a->ckpt == SNUG_CKPT_FULL && a->ckpt_every > 1)
        return "an extra forward pass on the checkpointed layers";
    if (a->ckpt == SNUG_CKPT_FULL)
        return "about one extra forward pass";
    if (a->ckpt == SNUG_CKPT_SELECTIVE)
        return "recomputes the norms and the MLP activation";
    if (p->spec.B != base->spec.B)
        return "the same FLOPs in smaller GEMMs, more of them";
    if (p->spec.ckpt_snapshot != base->spec.ckpt_snapshot)
        return "training waits while each checkpoint is written";
    return "";
}

/* Which lever a single-change point changes: 0 attention, 1 cross-entropy, 2 checkpointing, 3 optimizer, 4 batch,
 * 5 the checkpoint snapshot, 6 the tiled MLP, 7 the embedding's place, 8 the 4-bit base's place. */
static int lever_of(const snug_fit_point *p, const snug_fit_point *base) {
    const snug_plan_spec *a = &p->spec, *b = &base->spec;
    if (a->lv.naive_attention != b->lv.naive_attention)
        return 0;
    if (a->lv.xent_chunk != b->lv.xent_chunk)
        return 1;
    if (a->lv.ckpt != b->lv.ckpt || a->lv.ckpt_every != b->lv.ckpt_every)
        return 2;
    if (a->optim != b->optim || a->optim_paged != b->optim_paged)
        return 3;
    if (a->ckpt_snapshot != b->ckpt_snapshot)
        return 5;
    if (a->lv.mlp_shards != b->lv.mlp_shards)
        return 6;
    if (a->lv.offload_embedding != b->lv.offload_embedding)
        return 7;
    if (a->lv.offload_params != b->lv.offload_params)
        return 8;
    return 4;
}

static int effect_cmp(const void *x, const void *y) {
    const snug_lever_effect *a = x, *b = y;
    if (fabs(a->p->cost - b->p->cost) > 1e-9)
        return a->p->cost < b->p->cost ? -1 : 1;
    return a->saves > b->saves ? -1 : a->saves < b->saves ? 1 : 0;
}

int snug_fit_levers(const snug_fit_space *s, snug_lever_effect *out, int max) {
    int n = 0;
    const snug_fit_point *base = &s->pt[0];
    for (int i = 1; i < s->n && n < max; i++) {
        const snug_fit_point *p = &s->pt[i];
        double saves = snug_fit_point_need(s, base) - snug_fit_point_need(s, p);
        if (p->changes != 1 || saves <= 0)
            continue;
        out[n] = (snug_lever_effect){.p = p, .saves = saves, .cost_note = cost_note(p, base)};
        snprintf(out[n].name, sizeof out[n].name, "%s", p->what);
        n++;
    }
    /* a setting of a lever that saves no more than a cheaper setting of the same lever is not worth listing (paged
     * 32-bit state beside paged 8-bit; paged 8-bit beside plain 8-bit on the CPU) */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        int dominated = 0;
        for (int k = 0; k < n && !dominated; k++)
            dominated = k != i && lever_of(out[k].p, base) == lever_of(out[i].p, base) &&
                        out[k].p->cost < out[i].p->cost - 1e-9 && out[k].saves >= 0.999 * out[i].saves;
        if (!dominated)
            out[kept++] = out[i];
    }
    qsort(out, (size_t)kept, sizeof *out, effect_cmp);
    return kept;
}

static void fmt(char *buf, size_t n, double b) { snug_format_bytes(buf, n, b); }

int snug_fail_over_budget(snug_error *e, const snug_plan *p, double budget, double overhead) {
    char need[32], arenas[32], ov[32], bud[32], over[32], big[3][64];
    fmt(need, sizeof need, (double)p->total + overhead);
    fmt(arenas, sizeof arenas, (double)p->total);
    fmt(ov, sizeof ov, overhead);
    fmt(bud, sizeof bud, budget);
    fmt(over, sizeof over, (double)p->total + overhead - budget);
    /* the three largest categories */
    int order[SNUG_MEM_NCAT];
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        order[c] = c;
    for (int i = 0; i < SNUG_MEM_NCAT; i++)
        for (int j = i + 1; j < SNUG_MEM_NCAT; j++)
            if (p->bytes[order[j]] > p->bytes[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    for (int i = 0; i < 3; i++) {
        char b[32];
        fmt(b, sizeof b, (double)p->bytes[order[i]]);
        snprintf(big[i], sizeof big[i], "%s %s", snug_category_name((snug_category)order[i]), b);
    }
    const char *lever;
    switch (order[0]) {
    case SNUG_MEM_ACTS:
        lever = "gradient_checkpointing: full or a smaller micro_batch_size shrink saved activations";
        break;
    case SNUG_MEM_WORKSPACE:
        lever = "chunked_cross_entropy: true or a smaller micro_batch_size shrink the workspace";
        break;
    case SNUG_MEM_OPTIM:
        lever = "optimizer: adamw_8bit keeps about 2 bytes of state per parameter instead of 8, and paged_adamw_8bit "
                "moves it to host memory";
        break;
    default:
        lever = "parameters and gradients grow with the model only (4 + 4 bytes per parameter in fp32): a smaller "
                "model is the lever for them";
        break;
    }
    return snug_fail(e, SNUG_EINPUT,
                     "the memory plan needs %s (arenas %s + runtime overhead %s), over memory_budget %s by %s; largest: "
                     "%s, %s, %s; %s; set auto_fit: true to let snug choose the levers for the budget, or run "
                     "`snug plan` with the same options to see what each lever saves",
                     need, arenas, ov, bud, over, big[0], big[1], big[2], lever);
}

int snug_fit_batch_halving(const snug_plan_spec *spec, double budget, const char *budget_what, snug_device_kind kind,
                           size_t host_data_bytes, int *B, char *note, size_t note_size, snug_error *e) {
    snug_plan_spec s = *spec;
    char b[32], nb[32], tried[256] = "";
    size_t tl = 0;
    double need = 0;
    fmt(b, sizeof b, budget);
    for (s.B = spec->B; s.B >= 1; s.B /= 2) {
        snug_plan p;
        SNUG_TRY(snug_plan_run(&p, &s, e));
        need = plan_need(&p, kind, host_data_bytes);
        if (need <= budget)
            break;
        fmt(nb, sizeof nb, need);
        if (tl < sizeof tried)
            tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%d needs %s", tl ? ", " : "", s.B, nb);
    }
    if (s.B < 1) {
        fmt(nb, sizeof nb, need);
        return snug_fail(e, SNUG_EINPUT, "auto_find_batch_size: not even micro_batch_size 1 fits the %s %s (%s); "
                         "shorten sequence_len, set gradient_checkpointing: full, or run `snug plan` to see what each "
                         "lever saves", b, budget_what, tried);
    }
    fmt(nb, sizeof nb, need);
    *B = s.B;
    int GA = spec->GA > 0 ? spec->GA : 1;
    if (s.B == spec->B)
        snprintf(note, note_size, "auto_find_batch_size: kept micro_batch_size %d: it needs %s of the %s %s (%s "
                 "backend)", s.B, nb, b, budget_what, snug_device_kind_name(kind));
    else
        snprintf(note, note_size, "auto_find_batch_size: micro_batch_size %d, halved from %d (%s) to the first that "
                 "fits the %s %s (%s backend), needing %s; gradient_accumulation_steps stays %d, so a step is %d rows "
                 "where %d were configured, as transformers' Trainer does", s.B, spec->B, tried, b, budget_what,
                 snug_device_kind_name(kind), nb, GA, s.B * GA, spec->B * GA);
    return 0;
}

int snug_autofit(const snug_plan_spec *spec, double budget, snug_device_kind kind, size_t host_data_bytes,
                 snug_fit_point *chosen, char *note, size_t note_size, snug_error *e) {
    if (note_size)
        note[0] = '\0';
    if (!(budget > 0))
        return snug_fail(e, SNUG_EINPUT, "auto_fit needs memory_budget, the memory it fits the run into; add "
                         "memory_budget: 40GB (or --memory_budget 40GB)");
    snug_fit_space s;
    SNUG_TRY(snug_fit_space_build(&s, spec, kind, host_data_bytes, e));
    double need0 = snug_fit_point_need(&s, &s.pt[0]);
    const snug_fit_point *best = snug_fit_best(&s, budget);
    char b[32], n0[32], nb[32];
    fmt(b, sizeof b, budget);
    fmt(n0, sizeof n0, need0);
    if (!best) {
        const snug_fit_point *sm = snug_fit_smallest(&s);
        char ns[32], model[32];
        fmt(ns, sizeof ns, snug_fit_point_need(&s, sm));
        fmt(model, sizeof model,
            (double)(sm->plan.bytes[SNUG_MEM_PARAMS] + sm->plan.bytes[SNUG_MEM_MASTER] + sm->plan.bytes[SNUG_MEM_GRADS] +
                     sm->plan.bytes[SNUG_MEM_OPTIM]));
        int rc = snug_fail(e, SNUG_EINPUT,
                           "auto_fit: nothing fits memory_budget %s on the %s backend: the smallest setting (%s) needs "
                           "%s, of which parameters, gradients and optimizer state are %s whatever the levers; raise "
                           "memory_budget, shorten sequence_len, or choose a smaller model",
                           b, snug_device_kind_name(kind), sm->what, ns, model);
        snug_fit_space_free(&s);
        return rc;
    }
    fmt(nb, sizeof nb, snug_fit_point_need(&s, best));
    size_t len = 0;
    if (best == &s.pt[0]) {
        len += (size_t)snprintf(note + len, note_size - len,
                                "auto_fit: kept the configuration: it needs %s of memory_budget %s (%s backend), and no "
                                "setting of the levers is predicted to be faster",
                                n0, b, snug_device_kind_name(kind));
    } else {
        len += (size_t)snprintf(note + len, note_size - len,
                                "auto_fit: chose %s: needs %s of memory_budget %s (%s backend), predicted step time "
                                "%+.0f%% against the configuration, which %s %s",
                                best->what, nb, b, snug_device_kind_name(kind), 100.0 * best->cost,
                                need0 <= budget ? "fits too but is slower, needing" : "does not fit, needing", n0);
        /* the next cheaper settings that did not fit say why this one was chosen */
        const snug_fit_point *alt = NULL;
        for (int i = 0; i < s.n; i++) {
            const snug_fit_point *p = &s.pt[i];
            if (p->cost < best->cost - 1e-9 && snug_fit_point_need(&s, p) > budget &&
                (!alt || p->cost > alt->cost || (p->cost == alt->cost && p->plan.total < alt->plan.total)))
                alt = p;
        }
        if (alt && len < note_size) {
            char na[32];
            fmt(na, sizeof na, snug_fit_point_need(&s, alt));
            len += (size_t)snprintf(note + len, note_size - len, "; the next cheaper setting, %s (%+.0f%%), needs %s",
                                    alt->what, 100.0 * alt->cost, na);
        }
    }
    *chosen = *best;
    snug_fit_space_free(&s);
    return 0;
}
