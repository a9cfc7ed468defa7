/* acts.c: the saved activations: what one layer saves (fp32 or 16-bit, less under checkpointing), the saved sets
 * (one, or one per micro-batch in flight under pipeline parallelism) carved from the arenas, and the set in use. */
#include "model/model_impl.h"

int snug_model_layer_full_ckpt(const snug_model *m, int l) {
    int every = m->lv.ckpt_every > 0 ? m->lv.ckpt_every : 1;
    return m->lv.ckpt == SNUG_CKPT_FULL && l % every == 0;
}

/* The per-row statistics one layer saves, always fp32: the norms' mean (LayerNorm) and rstd, and the attention's
 * log-sum-exp (or, on the naive path, its probabilities). */
static int carve_layer_stats(snug_model *m, snug_arenas *A, snug_category cat, snug_layer_acts *a, size_t N,
                             snug_error *e) {
    int ln = m->blk.norm == SNUG_NORM_LAYER, NH = m->cfg.n_head; /* LayerNorm saves its mean too */
    if (ln)
        CARVE(a->ln1_mean, cat, N);
    CARVE(a->ln1_rstd, cat, N);
    if (m->lv.naive_attention)
        CARVE(a->probs, cat, (size_t)m->B * NH * m->T * m->T);
    else
        CARVE(a->lse, cat, N * NH);
    if (ln)
        CARVE(a->ln2_mean, cat, N);
    CARVE(a->ln2_rstd, cat, N);
    return 0;
}

/* One layer's large activations from arena `cat`, into `a`: a snug_layer_acts (fp32) or a snug_layer_acts16 (saved
 * 16-bit), which have the same fields; CARVE sizes each by its element type. with_cheap = 0 leaves out what selective
 * checkpointing recomputes (the two norm outputs and the MLP activation); a tiled MLP leaves out the MLP's two. */
#define CARVE_LAYER_BIG(a, cat, N, with_cheap)                                                                   \
    do {                                                                                                         \
        size_t C_ = (size_t)m->cfg.hidden_size, ATT_ = (size_t)m->cfg.n_head * m->cfg.head_dim;                  \
        if (with_cheap)                                                                                          \
            CARVE((a)->ln1, cat, (N) * C_);                                                                      \
        CARVE((a)->qkv, cat, (N) * m->QKV);                                                                      \
        CARVE((a)->att, cat, (N) * ATT_);                                                                        \
        CARVE((a)->res_mid, cat, (N) * C_);                                                                      \
        if (with_cheap)                                                                                          \
            CARVE((a)->ln2, cat, (N) * C_);                                                                      \
        if (!m->mlp_rows) /* a tiled MLP saves neither: its shards run in m's own buffers */                    \
            CARVE((a)->fc, cat, (N) * m->FC);                                                                    \
        if (with_cheap && !m->mlp_rows)                                                                          \
            CARVE((a)->act, cat, (N) * (size_t)m->cfg.intermediate_size);                                        \
    } while (0)

static int carve_layer_big(snug_model *m, snug_arenas *A, snug_category cat, snug_layer_acts *a, size_t N,
                           int with_cheap, snug_error *e) {
    CARVE_LAYER_BIG(a, cat, N, with_cheap);
    return 0;
}

static int carve_layer_big16(snug_model *m, snug_arenas *A, snug_layer_acts16 *s, size_t N, int with_cheap,
                             snug_error *e) {
    CARVE_LAYER_BIG(s, SNUG_MEM_ACTS, N, with_cheap);
    return 0;
}

/* What every saved set shares: the workspace's recompute sets (checkpointing, 16-bit's fp32 set, the tiled MLP's
 * shard) and the switches that decide what a set holds. */
typedef struct act_parts {
    snug_layer_acts shared, cmp;
    float *mlp_fc, *mlp_act;
    int selective, offload, with_grads;
} act_parts;

/* Saved set k: the residual stream (fp32 in SNUG_MEM_ACTS, 16-bit copies, or offloaded to host memory) and each
 * layer's saved activations (those checkpointing keeps), the rest pointing into the shared workspace sets. */
static int carve_act_set(snug_model *m, snug_arenas *A, const act_parts *p, int k, size_t N, snug_error *e) {
    int L = m->cfg.n_layer, half = is16(m);
    size_t C = (size_t)m->cfg.hidden_size;
    snug_act_set *set = &m->act_sets[k];
    if (!set->acts) { /* set 0's views are the model's own arrays */
        set->acts = k ? calloc((size_t)(L ? L : 1), sizeof *set->acts) : m->acts;
        set->acts16 = k ? calloc((size_t)(L ? L : 1), sizeof *set->acts16) : m->acts16;
        if (!set->acts || !set->acts16)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory for the model's activation views");
    }
    set->res = NULL;
    set->res16 = NULL;
    set->res_off = NULL;
    if (p->offload) {
        size_t bytes = (size_t)(L + 1) * N * C * snug_dtype_size(m->lv.dt);
        if (!(set->res_off = snug_arena_alloc(&A->a[SNUG_MEM_OFFLOAD], bytes, e)))
            return e ? e->code : SNUG_ENOMEM;
    } else if (half) {
        CARVE(set->res16, SNUG_MEM_ACTS, (size_t)(L + 1) * N * C);
    } else {
        CARVE(set->res, SNUG_MEM_ACTS, (size_t)(L + 1) * N * C);
    }
    for (int l = 0; l < L; l++) {
        snug_layer_acts *a = &set->acts[l];
        memset(a, 0, sizeof *a);
        memset(&set->acts16[l], 0, sizeof set->acts16[l]);
        if (p->with_grads && snug_model_layer_full_ckpt(m, l)) {
            *a = p->shared;
        } else {
            SNUG_TRY(carve_layer_stats(m, A, SNUG_MEM_ACTS, a, N, e));
            if (half) {
                SNUG_TRY(carve_layer_big16(m, A, &set->acts16[l], N, !p->selective, e));
            } else {
                SNUG_TRY(carve_layer_big(m, A, SNUG_MEM_ACTS, a, N, !p->selective, e));
                if (p->selective) {
                    a->ln1 = p->shared.ln1;
                    a->ln2 = p->shared.ln2;
                    a->act = p->shared.act;
                }
            }
        }
        if (half) {
            a->ln1 = p->cmp.ln1, a->qkv = p->cmp.qkv, a->att = p->cmp.att, a->res_mid = p->cmp.res_mid;
            a->ln2 = p->cmp.ln2, a->fc = p->cmp.fc, a->act = p->cmp.act;
        }
        if (m->mlp_rows)
            a->fc = p->mlp_fc, a->act = p->mlp_act;
    }
    return 0;
}

void snug_model_use_set(snug_model *m, int k) {
    const snug_act_set *set = &m->act_sets[k];
    m->act_set = k;
    m->acts = set->acts;
    m->acts16 = set->acts16;
    m->res16 = set->res16;
    m->res_off = set->res_off;
    if (set->res) /* fp32 without offloading: the stream itself (else the workspace's pair of slots) */
        m->res = set->res;
}

/* The activation sets' views (set 0's are the model's own acts arrays, which stay) */
void model_free_act_sets(snug_model *m) {
    if (m->act_sets) {
        m->acts = m->act_sets[0].acts;
        m->acts16 = m->act_sets[0].acts16;
    }
    for (int k = 1; m->act_sets && k < m->act_sets_n; k++) {
        free(m->act_sets[k].acts);
        free(m->act_sets[k].acts16);
    }
    free(m->act_sets);
    m->act_sets = NULL;
    m->act_sets_n = 0;
}

/* The saved activations: the residual stream (every layer's input) always; each layer's internals unless
 * checkpointing drops them, in which case they live in one shared recompute set in the workspace. */
int model_layout_acts(snug_model *m, snug_arenas *A, size_t N, int with_grads, snug_error *e) {
    const snug_model_config *c = &m->cfg;
    int L = c->n_layer, C = c->hidden_size, I = c->intermediate_size, half = is16(m);
    size_t NM = m->mlp_rows ? (size_t)m->mlp_rows : N; /* rows of the MLP's fc, act and their gradients */
    int any_full = 0, selective = with_grads && m->lv.ckpt == SNUG_CKPT_SELECTIVE;
    for (int l = 0; l < L; l++)
        any_full |= with_grads && snug_model_layer_full_ckpt(m, l);
    snug_layer_acts shared, cmp;
    memset(&shared, 0, sizeof shared);
    memset(&cmp, 0, sizeof cmp);
    m->res16 = m->res_stage = NULL;
    m->res_off = NULL;
    int offload = with_grads && any_full && m->lv.ckpt_offload;
    if (offload) { /* the layer inputs in host memory; two fp32 slots run the layers (as under 16-bit) */
        if (half)
            CARVE(m->res_stage, SNUG_MEM_WORKSPACE, N * C);
        if (!half)
            CARVE(m->res, SNUG_MEM_WORKSPACE, 2 * N * C);
    }
    if (half) {
        /* 16-bit: layers run in one fp32 set (cmp) and save 16-bit copies; only the statistics stay fp32 */
        CARVE(m->res, SNUG_MEM_WORKSPACE, 2 * N * C);
        SNUG_TRY(carve_layer_big(m, A, SNUG_MEM_WORKSPACE, &cmp, N, 1, e));
        if (any_full)
            SNUG_TRY(carve_layer_stats(m, A, SNUG_MEM_WORKSPACE, &shared, N, e));
    } else {
        if (any_full) {
            SNUG_TRY(carve_layer_big(m, A, SNUG_MEM_WORKSPACE, &shared, N, 1, e));
            SNUG_TRY(carve_layer_stats(m, A, SNUG_MEM_WORKSPACE, &shared, N, e));
        } else if (selective) {
            CARVE(shared.ln1, SNUG_MEM_WORKSPACE, N * C);
            shared.ln2 = shared.ln1; /* recomputed one after the other in backward */
            if (!m->mlp_rows)
                CARVE(shared.act, SNUG_MEM_WORKSPACE, N * I);
        }
    }
    float *mlp_fc = NULL, *mlp_act = NULL;
    if (m->mlp_rows) { /* tiled_mlp: one shard's fc and act, for every layer */
        CARVE(mlp_fc, SNUG_MEM_WORKSPACE, NM * m->FC);
        CARVE(mlp_act, SNUG_MEM_WORKSPACE, NM * I);
    }
    /* the saved set: one, or under pipeline parallelism without recomputation one per micro-batch in flight */
    act_parts parts = {.shared = shared, .cmp = cmp, .mlp_fc = mlp_fc, .mlp_act = mlp_act, .selective = selective,
                       .offload = offload, .with_grads = with_grads};
    int nsets = with_grads && m->pp_keep > 1 ? m->pp_keep : 1;
    if (m->act_sets && m->act_sets_n != nsets) /* laid out again for another count: the views afresh */
        model_free_act_sets(m);
    if (!m->act_sets && (m->act_sets = calloc((size_t)nsets, sizeof *m->act_sets)))
        m->act_sets_n = nsets;
    if (!m->act_sets)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the model's activation views");
    for (int k = 0; k < nsets; k++)
        SNUG_TRY(carve_act_set(m, A, &parts, k, N, e));
    snug_model_use_set(m, 0);
    return 0;
}
