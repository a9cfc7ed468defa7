/* ranks.c: the plan per rank over n GPUs (see ranks.h). */
#include "plan/ranks.h"

#include "model/model.h"
#include "model/quant4.h"

#include <math.h>
#include <string.h>

/* The plan of rank r under spec s over n ranks at stage z (0 to 3, as the layout code lays it out). */
static int rank_plan(const snug_plan_spec *s, int n, int r, int z, snug_plan *p, snug_error *e) {
    snug_plan_spec t = *s;
    t.ranks = n;
    t.rank = r;
    t.zero_stage = z;
    return snug_plan_run(p, &t, e);
}

/* The gradients the ranks sum: every parameter's, or under LoRA the adapters' alone. */
static double summed(const snug_plan_spec *s, long long nparams) {
    return s->lv.lora.kind ? (double)snug_lora_nparams(&s->cfg, &s->lv.lora) : (double)nparams;
}

double snug_rank_base_bytes(const snug_plan_spec *s, long long nparams) {
    double w = s->lv.dt == SNUG_DT_F32 ? 4 : 2;
    if (s->lv.lora.kind != SNUG_ADAPTER_QLORA)
        return (double)nparams * w;
    snug_param_table t;
    memset(&t, 0, sizeof t);
    if (snug_param_table_build(&t, &s->cfg, NULL))
        return (double)nparams * 0.5; /* out of host memory: about 4 bits a parameter */
    double b = 0;
    int bs = s->lv.lora.q4_blocksize ? s->lv.lora.q4_blocksize : 64;
    snug_q4_type ty = (snug_q4_type)s->lv.lora.q4_type;
    for (int i = 0; i < t.n; i++)
        if (t.e[i].layer >= 0 && t.e[i].ndim == 2) {
            int64_t cols = t.e[i].transposed ? t.e[i].shape[0] : t.e[i].shape[1]; /* 8 bits: a block per row */
            b += (double)snug_q4_bytes(ty, t.e[i].numel, ty == SNUG_Q4_INT8 ? (int)cols : bs, s->lv.lora.q4_nested);
        }
    snug_param_table_free(&t);
    return b;
}

const char *snug_rank_zero_unbuilt(const snug_plan_spec *s, int z) {
    if (s->lv.lora.kind && z < 3)
        return "with an adapter: only stage 3, which shards the frozen base (the adapters' state is small and stays "
               "whole on every rank)";
    if (z >= 3 && s->lv.offload_embedding && s->lv.lora.kind != SNUG_ADAPTER_QLORA)
        return "with offload_embedding (the embedding is sharded with the rest of the base)";
    return NULL;
}

double snug_rank_comm_bytes(const snug_plan_spec *s, long long nparams, int n, int z) {
    double P = (double)nparams, f = n > 1 ? (double)(n - 1) / n : 0.0, GA = s->GA > 1 ? s->GA : 1;
    double w = s->lv.dt == SNUG_DT_F32 ? 4 : 2, gb = 4; /* the ranks sum fp32 gradients (snug_plan_levers) */
    if (z == 0)
        P = summed(s, nparams);
    if (s->lv.optimizer_in_backward && !s->lv.lora.kind && z < 3) /* each layer all-reduced, then its shard gathered */
        return 2 * f * summed(s, nparams) * gb + (z ? f * P * w : 0.0);
    if (z == 3 && s->lv.lora.kind) /* the frozen base gathered, the adapters' gradients all-reduced */
        return GA * 2 * f * snug_rank_base_bytes(s, nparams) + 2 * f * summed(s, nparams) * gb;
    return z == 0   ? 2 * f * P * gb
           : z == 1 ? f * P * gb + f * P * w
           : z == 2 ? GA * f * P * gb + f * P * w
                    : GA * (2 * f * P * w + f * P * gb);
}

double snug_rank_exposed_s(const snug_plan_spec *s, long long nparams, int n, int z, double compute, double bps) {
    double P = (double)nparams, f = n > 1 ? (double)(n - 1) / n : 0.0, GA = s->GA > 1 ? s->GA : 1;
    double w = s->lv.dt == SNUG_DT_F32 ? 4 : 2, gb = 4, L = s->cfg.n_layer > 0 ? s->cfg.n_layer : 1;
    double bwd = 2.0 / 3.0 * compute; /* backward's share of the step's GA micro-batches (twice forward's FLOPs) */
    /* under LoRA the adapters' gradients are one all-reduce after backward, exposed whole */
    double adapters = s->lv.lora.kind ? 2 * f * summed(s, nparams) * gb / bps : 0.0;
    if (s->lv.optimizer_in_backward && z < 3) /* each layer's sums in line, blocking (stage 3: as without) */
        return snug_rank_comm_bytes(s, nparams, n, z) / bps;
    if (z == 0 && s->lv.lora.kind)
        return adapters;
    if (s->lv.lora.kind) { /* stage 3: the frozen base's gathers prefetched, the first of each pass exposed */
        double gat = GA * 2 * f * snug_rank_base_bytes(s, nparams) / bps;
        return fmax(0.0, gat - compute) + gat / L + adapters;
    }
    if (z <= 1) { /* buckets during the last micro-batch's backward; the last bucket, and ZeRO-1's gather, exposed */
        double sum = (z == 0 ? 2 : 1) * f * P * gb / bps;
        double cap = s->ddp_bucket_cap_mb > 0 ? s->ddp_bucket_cap_mb : 25;
        double bucket = fmin(1.0, cap * 1048576.0 / (P * gb));
        return fmax(0.0, sum - bwd / GA) + sum * bucket + (z == 1 ? f * P * w / bps : 0.0);
    }
    snug_levers lv = snug_plan_levers(s);
    double rs = GA * f * P * gb / bps; /* every micro-batch's reduce-scatters, layer by layer */
    /* beside the backward of the next layer, but for layer 0's (zero_overlap); otherwise in line */
    double rs_exposed = lv.zero_overlap ? fmax(0.0, rs - bwd) + rs / L : rs;
    if (z == 2) /* the parameters all-gathered once after the step */
        return rs_exposed + f * P * w / bps;
    /* the layers' gathers prefetched one layer ahead in forward and backward, the first of each pass exposed; one
     * stream carries them and the reduce-scatters, so together they hide behind the whole step at most */
    double gat = GA * 2 * f * P * w / bps;
    if (!lv.zero_overlap)
        return fmax(0.0, gat - compute) + gat / L + rs;
    return fmax(0.0, gat + rs - compute) + (gat + rs) / L;
}

int snug_plan_ranks(const snug_plan_spec *s, int n, const snug_gpu *g, snug_rank_mode out[4], int *choice,
                    snug_error *e) {
    memset(out, 0, 4 * sizeof *out);
    *choice = -1;
    snug_plan built[4], p; /* DDP and ZeRO-1 to 3 as the layout code lays them out */
    SNUG_TRY(rank_plan(s, n, 0, 0, &built[0], e));
    for (int z = 1; z <= 3; z++)
        for (int r = 0; r < n && !snug_rank_zero_unbuilt(s, z); r++) { /* the largest rank (edges on blocks make the
                                                                            * shards differ a little) */
            SNUG_TRY(rank_plan(s, n, r, z, &p, e));
            if (r == 0 || p.total + p.host_total > built[z].total + built[z].host_total)
                built[z] = p;
        }
    const snug_plan *ddp = &built[0];
    double GA = s->GA > 1 ? s->GA : 1;
    double tps = g ? snug_gpu_tokens_per_s(g, s, ddp->nparams) : 0;
    double compute = tps > 0 ? (double)s->B * s->T * GA / tps : 0;
    for (int z = 0; z < 4; z++) {
        snug_rank_mode *m = &out[z];
        const snug_plan *base = &built[z];
        m->stage = z;
        m->unbuilt = z ? snug_rank_zero_unbuilt(s, z) : NULL;
        if (m->unbuilt)
            continue;
        memcpy(m->bytes, base->bytes, sizeof m->bytes);
        size_t *b = m->bytes;
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            *(base->host[c] ? &m->host_total : &m->total) += b[c];
        snug_plan q = *base; /* the runtime overhead of the rank's plan on a GPU */
        memcpy(q.bytes, b, sizeof q.bytes);
        q.total = m->total;
        q.host_total = m->host_total;
        snug_overhead ov;
        snug_overhead_compute(&ov, SNUG_DEVICE_CUDA, &q, 0);
        m->need = (double)m->total + (double)ov.total;
        m->fits = g ? m->need <= g->mem_bytes : 0;
        m->comm_bytes = snug_rank_comm_bytes(s, ddp->nparams, n, z);
        if (!g)
            continue;
        m->comm_s = m->comm_bytes / (g->link_gbps * 1e9);
        m->compute_s = compute;
        snug_plan_spec t = *s;
        t.ranks = n, t.zero_stage = z;
        m->step_s = compute + snug_rank_exposed_s(&t, ddp->nparams, n, z, compute, g->link_gbps * 1e9);
        if (m->fits && (*choice < 0 || m->step_s < out[*choice].step_s))
            *choice = z;
    }
    return 0;
}

int snug_plan_ranks_fewest(const snug_plan_spec *s, int n, int max_n, const snug_gpu *g, int *gpus,
                           snug_rank_mode *mode, snug_error *e) {
    *gpus = 0;
    snug_rank_mode out[4];
    int choice, lo = n, hi = 0; /* lo: fits on none; hi: the fewest found that fits */
    for (int k = n + 1; !hi && lo < max_n; k = lo * 2 < max_n ? lo * 2 : max_n) {
        SNUG_TRY(snug_plan_ranks(s, k, g, out, &choice, e));
        if (choice >= 0)
            hi = k, *mode = out[choice];
        else
            lo = k;
    }
    while (hi && hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        SNUG_TRY(snug_plan_ranks(s, mid, g, out, &choice, e));
        if (choice >= 0)
            hi = mid, *mode = out[choice];
        else
            lo = mid;
    }
    *gpus = hi;
    return 0;
}

double snug_tp_comm_bytes(const snug_plan_spec *s, int *count) {
    *count = 0;
    if (s->tp <= 1)
        return 0.0;
    const snug_model_config *c = &s->cfg;
    int L = c->n_layer, recomputed = 0, GA = s->GA > 1 ? s->GA : 1;
    for (int l = 0; s->lv.ckpt == SNUG_CKPT_FULL && l < L; l++)
        recomputed += l % (s->lv.ckpt_every > 0 ? s->lv.ckpt_every : 1) == 0;
    int vocab = snug_tp_vocab_split(c, s->tp, s->device_cuda); /* the lookup's sum and the final norm's gradient */
    *count = GA * (4 * L + (s->lv.mlp_shards ? 1 : 2) * recomputed + 2 * vocab);
    double each = (double)s->B * s->T * c->hidden_size * sizeof(float);
    /* and with the vocabulary split, each token's 3 statistics (doubles) gathered from every rank */
    double gather = vocab ? GA * (double)(s->tp - 1) * 3 * s->B * s->T * sizeof(double) : 0.0;
    return *count * each * 2.0 * (s->tp - 1) / s->tp + gather;
}
