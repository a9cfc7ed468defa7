/* test_zero2_overlap.c: ZeRO-2's reduce-scatters beside backward (zero_overlap_comm) are finished before anything
 * reads or writes their buffers again.
 *
 * Under lv.zero_overlap the layers' gradients alternate between two layer buffers, and rank_hooks.c issues each
 * layer's reduce-scatter SNUG_COMM_ASYNC and finishes it (wait, add into the shard, zero the buffer) at the next
 * announcement, while NCCL may still be summing it. Here rank 0 of two runs in one process with a communicator that
 * behaves as an asynchronous NCCL would at its worst: an asynchronous reduce-scatter keeps its input aside, fills the
 * whole buffer with NaN and delivers the sum only at `wait` (a read before the wait brings NaN in), and a buffer
 * written before the wait is counted as a race (its write would be lost). The other rank is this one's twin (the
 * same micro-batch), so every sum is twice this rank's gradient, exactly. Checked for an untied Llama and a tied
 * GPT-2 (its embedding split by rows, reduced through the same hook), fp32 and bf16 storage, with and without full
 * checkpointing, over two accumulated micro-batches:
 *   - the shard of the summed gradients is bitwise the one of the run with one buffer and blocking collectives,
 *     and (one micro-batch, Llama) twice the gradient of a single process;
 *   - every layer's reduce-scatter is asynchronous but layer 0's (the embeddings' gradients share its buffer), no
 *     buffer is touched before its wait, and nothing is left outstanding after the step or after
 *     snug_model_skip_step (a rank without a micro-batch);
 *   - the plan has one more layer of fp32 gradients, and odd and even layers write different buffers. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist/comm.h"
#include "plan/plan.h"
#include "train/engine.h"
#include "train/rank_hooks.h"

enum { B = 2, T = 9, VOCAB = 53, MAX_PEND = 64 };

typedef struct pending {
    float *x;     /* the buffer (n elements), NaN until the wait */
    float *saved; /* its input, as the collective read it */
    size_t n, seg0;
} pending;

typedef struct twin {
    int deferred;
    pending p[MAX_PEND];
    int np;
    int async_rs, sync_rs, waits, races, overflow;
    size_t most_out; /* the most elements outstanding at once */
} twin;

static size_t total_of(const size_t *counts, int size) {
    size_t s = 0;
    for (int r = 0; r < size; r++)
        s += counts[r];
    return s;
}

/* the sum of two twins: this rank's segment (rank 0, the first) doubled; the others keep their values */
static void deliver(float *x, const float *in, size_t n, size_t seg0) {
    memcpy(x, in, n * sizeof *x);
    for (size_t k = 0; k < seg0; k++)
        x[k] = in[k] + in[k];
}

static int tw_reduce_scatter(snug_comm *c, void *xv, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    (void)e;
    twin *t = c->ctx;
    float *x = xv;
    size_t n = total_of(counts, c->size);
    if (snug_comm_type(dt) != SNUG_COMM_F32)
        return snug_fail(e, SNUG_EINTERNAL, "twin: a reduce-scatter of type %d", (int)dt);
    if (!(dt & SNUG_COMM_ASYNC) || !t->deferred) {
        t->sync_rs += !(dt & SNUG_COMM_ASYNC);
        t->async_rs += !!(dt & SNUG_COMM_ASYNC);
        float *in = malloc(n * sizeof *in);
        memcpy(in, x, n * sizeof *in);
        deliver(x, in, n, counts[0]);
        free(in);
        return 0;
    }
    t->async_rs++;
    if (t->np == MAX_PEND) {
        t->overflow++;
        return 0;
    }
    pending *p = &t->p[t->np++];
    p->x = x, p->n = n, p->seg0 = counts[0];
    p->saved = malloc(n * sizeof *p->saved);
    memcpy(p->saved, x, n * sizeof *p->saved);
    for (size_t k = 0; k < n; k++)
        x[k] = NAN;
    size_t out = 0;
    for (int k = 0; k < t->np; k++)
        out += t->p[k].n;
    t->most_out = out > t->most_out ? out : t->most_out;
    return 0;
}

static int tw_wait(snug_comm *c, snug_error *e) {
    (void)e;
    twin *t = c->ctx;
    t->waits++;
    for (int k = 0; k < t->np; k++) {
        pending *p = &t->p[k];
        for (size_t j = 0; j < p->n; j++)
            if (!isnan(p->x[j])) { /* written while the collective still owned it */
                t->races++;
                break;
            }
        deliver(p->x, p->saved, p->n, p->seg0);
        free(p->saved);
    }
    t->np = 0;
    return 0;
}

/* the ids of the looked-up rows (the tied head): the twin's are this rank's */
static int tw_allgather(snug_comm *c, void *xv, const size_t *counts, snug_comm_dtype dt, snug_error *e) {
    size_t es = snug_comm_dtype_size(snug_comm_type(dt)), at = counts[0];
    if (!(dt & SNUG_COMM_HOST) || counts[1] != counts[0])
        return snug_fail(e, SNUG_EINTERNAL, "twin: an all-gather other than the ids'");
    memcpy((char *)xv + at * es, xv, counts[1] * es);
    (void)c;
    return 0;
}

static int tw_unused(snug_comm *c, void *x, size_t n, snug_comm_dtype dt, snug_error *e) {
    (void)c, (void)x, (void)n, (void)dt;
    return snug_fail(e, SNUG_EINTERNAL, "twin: an all-reduce inside the step");
}

static void make_engine(snug_engine *g, const snug_model_config *cfg, snug_levers lv, int ranks, int overlap) {
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = *cfg, .B = B, .T = T, .lv = lv, .with_grads = 1, .ranks = ranks, .rank = 0,
                           .zero_stage = ranks > 1 ? 2 : 0, .overlap_comm = overlap ? 1 : -1,
                           .loss_vocab_block = cfg->tie_embeddings ? 17 : -1};
    if (snug_engine_create(g, &spec, SNUG_BACKEND_CPU, 1, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        exit(1);
    }
}

static void batch(int32_t *ids, int32_t *labels, int32_t *pos, unsigned seed) {
    srand(seed);
    for (int n = 0; n < B * T; n++)
        ids[n] = rand() % VOCAB, pos[n] = n % T, labels[n] = n % T == 0 ? -1 : rand() % VOCAB;
}

typedef struct result {
    float *gshard; /* (gshard_n) after the step's micro-batches */
    size_t lo, n, grads_numel;
    double loss;
    twin tw;
    int odd_even_apart;
} result;

/* The model's hooks: ZeRO-2's reduce-scatter and a tied embedding's rows, each with its context */
typedef struct hooks_ud {
    snug_zero2_hook *z2;
    snug_rows_hook *zr;
} hooks_ud;

static void on_ready(void *ud, int layer, size_t offset, size_t numel) {
    (void)offset, (void)numel;
    snug_zero2_ready(((hooks_ud *)ud)->z2, layer);
}

static void on_rows(void *ud, int op, void *buf, size_t base, const int32_t *rows, int first, int n, int C) {
    snug_rows_op(((hooks_ud *)ud)->zr, op, buf, base, rows, first, n, C);
}

static void run(const snug_model_config *cfg, snug_levers lv, const float *init, int overlap, int deferred, int nmb,
                result *res) {
    snug_engine g;
    make_engine(&g, cfg, lv, 2, overlap);
    snug_model *m = &g.model;
    CHECK(m->lv.zero_grads && m->gshard && m->lv.zero_overlap == overlap);
    snug_model_put_params(m, init);
    snug_plan_spec spec = {.cfg = *cfg, .ranks = 2, .zero_stage = 2};
    size_t shard[2], counts[2], rcounts[2];
    snug_plan_zero_counts(&spec, &m->table, shard);
    CHECK(shard[0] == m->gshard_n && m->gshard_lo == 0);
    memset(&res->tw, 0, sizeof res->tw);
    res->tw.deferred = deferred;
    snug_comm c = {.name = "twin", .rank = 0, .size = 2, .ctx = &res->tw, .allreduce_sum = tw_unused,
                   .reduce_scatter_sum = tw_reduce_scatter, .allgather = tw_allgather, .wait = tw_wait};
    snug_zero2_hook z2 = {.m = m, .comm = &c, .shard = shard, .counts = counts};
    snug_rows_hook zr = {.z2 = &z2, .counts = rcounts};
    hooks_ud h = {.z2 = &z2, .zr = &zr};
    static const snug_model_hook_ops ops = {.grads_ready = on_ready}, ops_rows = {.grads_ready = on_ready,
                                                                                 .rows = on_rows};
    m->hooks = (snug_model_hooks){.ops = m->vtied ? &ops_rows : &ops, .ud = &h};
    memset(m->grads, 0, m->grads_numel * sizeof(float));
    memset(m->gshard, 0, m->gshard_n * sizeof(float));
    int32_t ids[B * T], labels[B * T], pos[B * T];
    res->loss = 0;
    for (int k = 0; k < nmb; k++) {
        batch(ids, labels, pos, 5 + (unsigned)k);
        snug_model_set_batch(m, ids, labels, pos, NULL, B, T);
        res->loss += snug_model_step(m, 0.5f);
        CHECKF(res->tw.np == 0 && z2.npend == 0, "micro-batch %d: %d collectives still outstanding after the step",
               k, res->tw.np);
    }
    CHECKF(!z2.rc, "the hook failed: %s", z2.e.msg);
    res->n = m->gshard_n, res->lo = m->gshard_lo, res->grads_numel = m->grads_numel;
    res->gshard = malloc(m->gshard_n * sizeof(float));
    memcpy(res->gshard, m->gshard, m->gshard_n * sizeof(float));
    /* a rank without a micro-batch joins with zero gradients: nothing added, nothing left outstanding */
    snug_model_skip_step(m, 1);
    CHECKF(res->tw.np == 0 && z2.npend == 0 && !z2.rc, "skip_step left %d collectives outstanding", res->tw.np);
    CHECKF(!memcmp(res->gshard, m->gshard, m->gshard_n * sizeof(float)), "skip_step changed the summed shard");
    /* layer 0's gradients and layer 1's are in different buffers exactly when there are two */
    snug_dtype dt;
    int i0 = -1, i1 = -1;
    for (int i = 0; i < m->table.n; i++) {
        if (m->table.e[i].layer == 0 && i0 < 0)
            i0 = i;
        if (m->table.e[i].layer == 1 && i1 < 0)
            i1 = i;
    }
    res->odd_even_apart = snug_model_grad(m, i0, &dt) != snug_model_grad(m, i1, &dt);
    snug_engine_free(&g);
}

static size_t largest_layer(const snug_param_table *t, int L) {
    size_t most = 0;
    for (int l = 0; l < L; l++)
        most = t->layer_numel[l] > most ? t->layer_numel[l] : most;
    return most;
}

static void case_(const char *what, snug_arch arch, snug_dtype dt, int full_ckpt) {
    snug_model_config cfg = check_small_model(arch, VOCAB, 3, 40, 16);
    snug_levers lv = {.xent_chunk = 7, .dt = dt, .master_weights = dt != SNUG_DT_F32,
                      .ckpt = full_ckpt ? SNUG_CKPT_FULL : SNUG_CKPT_NONE};
    /* the initial parameters, drawn by an unsharded engine */
    snug_engine one;
    make_engine(&one, &cfg, lv, 1, 0);
    size_t P = one.model.table.total;
    float *init = malloc(P * sizeof *init);
    CHECK(snug_model_init_random(&one.model, 3) == 0);
    snug_model_get_params(&one.model, init);
    for (int nmb = 1; nmb <= 2; nmb++) {
        result ref, ov, ovd;
        run(&cfg, lv, init, 0, 0, nmb, &ref);
        run(&cfg, lv, init, 1, 0, nmb, &ov);
        run(&cfg, lv, init, 1, 1, nmb, &ovd);
        CHECKF(ref.n == ovd.n && ref.n == ov.n, "%s: shard sizes", what);
        size_t nonzero = 0;
        for (size_t k = 0; k < ref.n; k++)
            nonzero += ref.gshard[k] != 0.0f;
        CHECKF(nonzero > ref.n / 2, "%s: only %zu of the shard's %zu summed gradients are not zero", what, nonzero,
               ref.n);
        int same = !memcmp(ref.gshard, ovd.gshard, ref.n * sizeof(float));
        CHECKF(same, "%s, %d micro-batches: the overlapped run's summed shard differs from the blocking one's "
               "(largest difference %g)", what, nmb, check_max_rel_f(ovd.gshard, ref.gshard, ref.n));
        CHECKF(!memcmp(ref.gshard, ov.gshard, ref.n * sizeof(float)), "%s: two buffers, blocking collectives", what);
        CHECKF(ref.loss == ovd.loss, "%s: the loss %.9g against %.9g", what, ovd.loss, ref.loss);
        int L = cfg.n_layer;
        CHECKF(ovd.tw.async_rs == (nmb + 1) * (L - 1), "%s: %d asynchronous reduce-scatters, want %d (a layer's "
               "each but layer 0's, in every micro-batch and the skipped step)", what, ovd.tw.async_rs,
               (nmb + 1) * (L - 1));
        CHECKF(ref.tw.async_rs == 0, "%s: one buffer, yet %d asynchronous reduce-scatters", what, ref.tw.async_rs);
        CHECKF(!ovd.tw.races && !ovd.tw.overflow, "%s: %d buffers written before their wait", what, ovd.tw.races);
        CHECKF(ovd.tw.most_out <= largest_layer(&one.model.table, L), "%s: %zu elements outstanding at once, more than "
               "one layer", what, ovd.tw.most_out);
        CHECKF(ovd.grads_numel == ref.grads_numel + largest_layer(&one.model.table, L),
               "%s: gradients of %zu elements with two buffers, %zu with one", what, ovd.grads_numel,
               ref.grads_numel);
        CHECKF(ovd.odd_even_apart && !ref.odd_even_apart, "%s: the odd and even layers' buffers", what);
        if (nmb == 1 && !cfg.tie_embeddings && dt == SNUG_DT_F32) { /* twice one process's, over this shard */
            snug_model *m = &one.model;
            snug_model_put_params(m, init);
            memset(m->grads, 0, m->grads_numel * sizeof(float));
            int32_t ids[B * T], labels[B * T], pos[B * T];
            batch(ids, labels, pos, 5);
            snug_model_set_batch(m, ids, labels, pos, NULL, B, T);
            double loss = snug_model_step(m, 0.5f);
            int twice = 1;
            for (size_t k = 0; k < ovd.n; k++)
                twice &= ovd.gshard[k] == 2.0f * m->grads[ovd.lo + k];
            CHECKF(twice && loss == ovd.loss, "%s: the shard is not twice one process's gradients", what);
        }
        free(ref.gshard), free(ov.gshard), free(ovd.gshard);
    }
    free(init);
    snug_engine_free(&one);
}

int main(void) {
    case_("llama fp32", SNUG_ARCH_LLAMA, SNUG_DT_F32, 0);
    case_("llama bf16", SNUG_ARCH_LLAMA, SNUG_DT_BF16, 0);
    case_("llama fp32 full checkpointing", SNUG_ARCH_LLAMA, SNUG_DT_F32, 1);
    case_("gpt2 fp32 (tied, by rows)", SNUG_ARCH_GPT2, SNUG_DT_F32, 0);
    case_("gpt2 bf16 full checkpointing", SNUG_ARCH_GPT2, SNUG_DT_BF16, 1);
    return check_finish("test_zero2_overlap");
}
