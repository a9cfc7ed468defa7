/* gather.c: ZeRO-3's gathers of the rank's parameter shard (the global tensors, and layer by layer into two
 * buffers with the pass's next layer prefetched) and QLoRA's gathers of the 4-bit spans; where a stored parameter
 * is read from. The two buffers' turns and prefetches are dist/gather.h's (snug_gather_pair, one for each kind of
 * layer); what fills a buffer (the rank's own part copied from its shard, the others' from the hook) and how a
 * prefetch is waited for are the model's, here. */
#include "model/model_impl.h"

float *snug_model_host_params(const snug_model *m) {
    return m->be->host_resident && !is16(m) && !m->param_sharded ? m->params : NULL;
}

/* ZeRO-3: where global parameter `offset` is in gglob: the pre-layer globals first, then the post-layer ones, or
 * (gsplit) each set from the region's start, gathered one at a time. */
size_t model_gglob_at(const snug_model *m, size_t offset) {
    return offset < m->gpre_n ? offset - m->gpre_lo
                              : (m->gsplit ? 0 : m->gpre_n - m->gpre_lo) + (offset - (m->table.total - m->gpost_n));
}

const void *snug_model_stored(const snug_model *m, size_t offset) {
    if (m->param_sharded) /* the global tensors, as last gathered */
        return (const char *)m->gglob + model_gglob_at(m, offset) * snug_dtype_size(m->lv.dt);
    return is16(m) ? (const void *)(m->params16 + offset) : (const void *)(m->params + offset);
}

/* ZeRO-3: a prefetch under way complete (the gather waited for; with offload_params and nothing to gather, the
 * side stream's copy). */
static void dense_wait(void *ud) {
    snug_model *m = ud;
    if (model_hooks(m)->gather_params)
        model_hooks(m)->gather_params(m->hooks.ud, NULL, 0, 0, 0);
    else if (m->lv.offload_params)
        m->be->copy_wait(m->be);
}

static void dense_fill(void *ud, int k, int l, int prefetch);

/* ZeRO-3's layer buffers filled and waited for (snug_gather_pair's io). */
static snug_gather_io dense_io(snug_model *m) {
    return (snug_gather_io){.fill = dense_fill, .wait = dense_wait, .ud = m};
}

/* ZeRO-3: the prefetched gather complete before the region is read or written again. */
void model_gather_settle(snug_model *m) {
    snug_gather_io io = dense_io(m);
    snug_gather_pair_settle(&m->gpair, &io);
}

/* ZeRO-3: table elements [offset, offset+numel) of every rank's shard into dst (stored dtype): this rank's piece
 * copied from its shard, the others' by the gather callback. A prefetch may still be running on return; any other
 * gather first waits for one still running, since its own piece's copy would race it in the region. */
void model_gather_range(snug_model *m, void *dst, size_t offset, size_t numel, int prefetch) {
    if (!prefetch)
        model_gather_settle(m);
    size_t es = snug_dtype_size(m->lv.dt), lo = m->pshard_lo, hi = lo + m->pshard_n;
    size_t a = offset > lo ? offset : lo, b = offset + numel < hi ? offset + numel : hi;
    const char *src = is16(m) ? (const char *)m->params16 : (const char *)m->params;
    /* offload_params with nothing to gather: a prefetch's copy from host memory on the side stream, beside the
     * compute (waited for in model_gather_settle); a gather's own piece goes on the compute stream, which it
     * precedes */
    void (*cp)(snug_backend *, void *, const void *, size_t) =
        prefetch && m->lv.offload_params && !model_hooks(m)->gather_params ? m->be->copy_in_async : m->be->copy;
    if (b > a)
        cp(m->be, (char *)dst + (a - offset) * es, src + (a - lo) * es, (b - a) * es);
    if (model_hooks(m)->gather_params)
        model_hooks(m)->gather_params(m->hooks.ud, dst, offset, numel, prefetch);
}

/* ZeRO-3: the global tensors into gglob (it aliases the layer buffers, which are then empty): `want` of them
 * (GLOB_PRE, GLOB_POST), or both where the region holds both (a tied head is the embedding: the loss reads both). */
void model_gather_globals(snug_model *m, int want) {
    if (!m->gsplit)
        want = GLOB_PRE | GLOB_POST;
    if (!m->param_sharded || (m->gglob_ok & want) == want)
        return;
    size_t es = snug_dtype_size(m->lv.dt);
    if ((want & GLOB_PRE) && m->gpre_n > m->gpre_lo)
        model_gather_range(m, m->gglob, m->gpre_lo, m->gpre_n - m->gpre_lo, 0);
    if ((want & GLOB_POST) && m->gpost_n)
        model_gather_range(m, (char *)m->gglob + model_gglob_at(m, m->table.total - m->gpost_n) * es,
                           m->table.total - m->gpost_n, m->gpost_n, 0);
    snug_gather_pair_forget(&m->gpair);
    m->wl_layer = -1;
    m->gglob_ok = want;
}

/* ZeRO-3: layer l's parameters into layer buffer k (a gather of its range, which leaves gglob without globals). */
static void dense_fill(void *ud, int k, int l, int prefetch) {
    snug_model *m = ud;
    m->gglob_ok = 0;
    model_gather_range(m, m->gpair.buf[k], m->table.layer_offset[l], m->table.layer_numel[l], prefetch);
}

/* The layer a pass reads after l (l + gdir), or -1: none (outside a pass, or past its end). */
static int next_layer(const snug_model *m, int l) {
    int nx = l + m->gdir;
    return m->gdir && nx >= 0 && nx < m->cfg.n_layer ? nx : -1;
}

/* ZeRO-3: layer l's parameters (stored dtype) in its gather buffer, gathered unless it is still there (prefetched:
 * waited for). Then the layer the pass reads next (l + gdir) is gathered into the other buffer, whose layer the pass
 * has finished with: a prefetch, which NCCL runs on its own stream while layer l computes (the CPU's MPI gathers
 * block, so there it is the same gathers in another order). The ranks issue them in the same order, since every
 * one calls this in the same sequence (snug_model_step, snug_model_skip_step). */
const void *model_gathered_layer(snug_model *m, int l) {
    snug_gather_io io = dense_io(m);
    return m->gpair.buf[snug_gather_pair_layer(&m->gpair, l, next_layer(m, l), &io)];
}

/* q4_sharded: the prefetched span complete (the gather waited for, or the side stream's copy from host memory). */
static void q4_wait(void *ud) {
    snug_model *m = ud;
    if (model_hooks(m)->gather_q4)
        model_hooks(m)->gather_q4(m->hooks.ud, NULL, 0, 0);
    else if (m->lv.offload_params)
        m->be->copy_wait(m->be);
}

/* Layer l's 4-bit span into buffer k (this rank's piece copied from its shard, the others' by the callback), and
 * the layer's matrices carved there. With offload_params on one process a prefetch's copy from host memory runs on
 * the backend's side stream, beside the compute queued before the next wait (q4_wait); at ZeRO-3 the rank's piece
 * is copied on the compute stream, since the all-gather that follows reads it there. q4pair.layer[k] already says
 * l, for the callback, which may look which layer it moves. */
static void q4_fill(void *ud, int k, int l, int prefetch) {
    snug_model *m = ud;
    size_t P = m->q4_piece[l];
    char *dst = m->q4pair.buf[k];
    if (prefetch && m->lv.offload_params && !model_hooks(m)->gather_q4)
        m->be->copy_in_async(m->be, dst, m->q4_shard + m->q4_soff[l], P);
    else
        m->be->copy(m->be, dst + (size_t)m->q4_part * P, m->q4_shard + m->q4_soff[l], P);
    if (model_hooks(m)->gather_q4)
        model_hooks(m)->gather_q4(m->hooks.ud, dst, P, prefetch);
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer == l && m->q4[i].n)
            snug_q4_carve(&m->q4[i], dst + m->q4_rel[i]);
}

/* QLoRA at ZeRO-3: layer l's 4-bit matrices readable (gathered unless still there, a prefetch waited for), and the
 * pass's next layer prefetched into the other buffer, in the same order on every rank (see model_gathered_layer). */
void model_q4_layer(snug_model *m, int l) {
    snug_gather_io io = {.fill = q4_fill, .wait = q4_wait, .ud = m};
    (void)snug_gather_pair_layer(&m->q4pair, l, next_layer(m, l), &io);
}

/* A reader outside the passes (snug_model_entry_f32, snug_model_get_params) of layer l's 4-bit matrices: with the
 * whole spans on this rank (offload_params without stage 3) the span copied in, as a pass would; at stage 3 the
 * others' pieces would take a collective, so nothing (those readers are not used there). */
void model_q4_local(const snug_model *m, int l) {
    if (m->q4_sharded && m->q4_parts == 1)
        model_q4_layer((snug_model *)m, l);
}

float *snug_model_host_scratch(snug_model *m, size_t n) {
    if (!m->param_sharded || !m->be->host_resident || m->gregion_n * snug_dtype_size(m->lv.dt) < n * sizeof(float))
        return NULL;
    model_gather_settle(m);
    snug_gather_pair_forget(&m->gpair);
    m->gglob_ok = 0;
    m->wl_layer = -1;
    return m->gglob;
}
