/* test_zero3_gather.c: ZeRO-3's gathers, prefetch included, are issued in one order and never read early.
 *
 * The model gathers each layer before it runs and prefetches the next one into the other buffer (model/gather.c's
 * model_gathered_layer); under NCCL the prefetch runs beside the compute and the model must wait for it before it reads
 * or writes that buffer. Here rank 0 of two runs in one process with a gather callback that behaves as an
 * asynchronous all-gather would at its worst: a prefetch leaves the other rank's pieces NaN until the wait, and a
 * blocking gather fills them at once. Checked, for an untied Llama and a tied GPT-2, in fp32 and bf16 storage, with
 * and without full checkpointing:
 *   - the step's loss and every gradient are bitwise those of the same run whose gathers all complete at once (a
 *     read before its wait would have brought NaN in);
 *   - no blocking gather is issued while a prefetch is still outstanding (its own piece's copy would race it);
 *   - each layer is gathered once for forward and once for backward, all but the first of each pass as prefetches;
 *   - snug_model_skip_step (a rank without a micro-batch) issues the same gathers, waits included, in the same
 *     order with the same ranges, in training and in evaluation.
 * QLoRA's stage 3 (its layers' 4-bit spans gathered and prefetched alike) is checked the same way against one
 * process's loss, evaluation loss and adapter gradients, bitwise, with each gathered span the unsharded bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dtype.h"
#include "model/presets.h"
#include "train/engine.h"

enum { B = 2, T = 9, VOCAB = 53, MAX_EV = 256 };

typedef struct event {
    int kind; /* 0 blocking gather, 1 prefetch, 2 wait */
    size_t offset, numel;
} event;

typedef struct fake {
    snug_model *m;
    const char *ref; /* the whole table as stored (fp32 or 16-bit), from an unsharded model */
    int deferred;    /* 1: a prefetch's other pieces stay NaN until the wait */
    char *pdst;      /* the outstanding prefetch (NULL: none) */
    size_t poff, pn;
    event ev[MAX_EV];
    int nev, races;
    struct grads_out *out; /* what the grads_ready hook fills */
} fake;

/* dst's elements outside this rank's shard <- the reference (nan: NaN instead) */
static void fill_others(fake *f, char *dst, size_t offset, size_t numel, int nan) {
    snug_model *m = f->m;
    size_t es = snug_dtype_size(m->lv.dt), lo = m->pshard_lo, hi = lo + m->pshard_n;
    for (size_t k = 0; k < numel; k++) {
        size_t t = offset + k;
        if (t >= lo && t < hi)
            continue;
        if (!nan)
            memcpy(dst + k * es, f->ref + t * es, es);
        else if (es == 4)
            ((float *)(void *)dst)[k] = NAN;
        else
            ((uint16_t *)(void *)dst)[k] = 0x7fc0; /* a bf16 / fp16 NaN either way */
    }
}

static void on_gather(void *ud, void *dst, size_t offset, size_t numel, int prefetch) {
    fake *f = ud;
    if (f->nev < MAX_EV)
        f->ev[f->nev++] = (event){.kind = !dst ? 2 : prefetch, .offset = offset, .numel = numel};
    if (!dst) {
        if (f->pdst)
            fill_others(f, f->pdst, f->poff, f->pn, 0);
        f->pdst = NULL;
        return;
    }
    if (f->pdst) /* a gather while a prefetch is outstanding */
        f->races++;
    if (prefetch && f->deferred) {
        fill_others(f, dst, offset, numel, 1);
        f->pdst = dst, f->poff = offset, f->pn = numel;
    } else {
        fill_others(f, dst, offset, numel, 0);
    }
}

/* the layer buffer's gradients copied out (table order) and zeroed, as a ZeRO-2/3 reduce-scatter consumes them */
typedef struct grads_out {
    snug_model *m;
    float *g;
} grads_out;

static void on_ready(void *ud, int layer, size_t offset, size_t numel) {
    (void)offset, (void)numel;
    grads_out *o = ((fake *)ud)->out;
    snug_grad_range r[SNUG_READY_MAX_RANGES];
    int n = snug_model_ready_ranges(o->m, layer, r, SNUG_READY_MAX_RANGES);
    for (int k = 0; k < n && k < SNUG_READY_MAX_RANGES; k++) {
        if (!r[k].data || r[k].dt != SNUG_DT_F32)
            continue;
        memcpy(o->g + r[k].offset, r[k].data, r[k].numel * sizeof(float));
        memset(r[k].data, 0, r[k].numel * sizeof(float));
    }
}

/* the same (B, T) micro-batch for every run: ids and labels from a fixed seed */
static void set_batch(snug_model *m) {
    int32_t ids[B * T], labels[B * T], pos[B * T];
    srand(5);
    for (int n = 0; n < B * T; n++)
        ids[n] = rand() % VOCAB, pos[n] = n % T, labels[n] = n % T == 0 ? -1 : rand() % VOCAB;
    snug_model_set_batch(m, ids, labels, pos, NULL, B, T);
}

static void make_engine(snug_engine *g, const snug_model_config *cfg, snug_levers lv, int ranks) {
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = *cfg, .B = B, .T = T, .lv = lv, .with_grads = 1, .ranks = ranks, .rank = 0,
                           .zero_stage = ranks > 1 ? 3 : 0, .loss_vocab_block = -1};
    if (snug_engine_create(g, &spec, SNUG_BACKEND_CPU, 1, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        exit(1);
    }
}

typedef struct result {
    double loss, eval;
    float *grads; /* (table) */
    event step[MAX_EV], skip[MAX_EV], evalev[MAX_EV], skip_eval[MAX_EV];
    int nstep, nskip, neval, nskip_eval, races;
} result;

static void run(const snug_model_config *cfg, snug_levers lv, const float *init, const char *ref, int deferred,
                result *res) {
    snug_engine g;
    make_engine(&g, cfg, lv, 2);
    snug_model *m = &g.model;
    CHECK(m->param_sharded);
    snug_model_put_params(m, init);
    size_t P = m->table.total;
    res->grads = calloc(P, sizeof(float));
    grads_out o = {.m = m, .g = res->grads};
    fake f = {.m = m, .ref = ref, .deferred = deferred, .out = &o};
    static const snug_model_hook_ops ops = {.gather_params = on_gather, .grads_ready = on_ready},
                                     gathers_only = {.gather_params = on_gather};
    m->hooks = (snug_model_hooks){.ops = &ops, .ud = &f};
    if (m->grads)
        memset(m->grads, 0, m->grads_numel * sizeof(float));
    set_batch(m);
    res->loss = snug_model_step(m, 1.0f);
    memcpy(res->step, f.ev, sizeof f.ev), res->nstep = f.nev, f.nev = 0;
    m->hooks.ops = &gathers_only; /* the skipped step's zero gradients are not this step's */
    snug_model_skip_step(m, 1);
    memcpy(res->skip, f.ev, sizeof f.ev), res->nskip = f.nev, f.nev = 0;
    res->eval = snug_model_step(m, 0.0f);
    memcpy(res->evalev, f.ev, sizeof f.ev), res->neval = f.nev, f.nev = 0;
    snug_model_skip_step(m, 0);
    memcpy(res->skip_eval, f.ev, sizeof f.ev), res->nskip_eval = f.nev;
    res->races = f.races;
    snug_engine_free(&g);
}

static int same_events(const event *a, int na, const event *b, int nb) {
    if (na != nb)
        return 0;
    for (int i = 0; i < na; i++)
        if (a[i].kind != b[i].kind || a[i].offset != b[i].offset || a[i].numel != b[i].numel)
            return 0;
    return 1;
}

/* each layer's gathers in a pass: `twice` 2 (a training step) or 1 (evaluation); prefetches: all but the first of
 * each pass; every prefetch waited for before the next gather */
static void check_schedule(const char *what, const snug_param_table *t, int L, const event *ev, int n, int passes) {
    int per_layer[64] = {0}, prefetches = 0, open = 0, unwaited = 0;
    for (int i = 0; i < n; i++) {
        if (ev[i].kind == 2) {
            open = 0;
            continue;
        }
        unwaited += open;
        open = ev[i].kind == 1;
        prefetches += ev[i].kind == 1;
        for (int l = 0; l < L; l++)
            if (ev[i].offset == t->layer_offset[l] && ev[i].numel == t->layer_numel[l])
                per_layer[l]++;
    }
    for (int l = 0; l < L; l++)
        CHECKF(per_layer[l] == passes, "%s: layer %d gathered %d times, want %d", what, l, per_layer[l], passes);
    CHECKF(prefetches == passes * (L - 1), "%s: %d prefetches, want %d", what, prefetches, passes * (L - 1));
    CHECKF(!unwaited && !open, "%s: a gather issued after a prefetch that was not waited for", what);
}

static void test_case(snug_arch arch, snug_dtype dt, int ckpt) {
    snug_model_config cfg = check_small_model(arch, VOCAB, 4, 64, 32);
    snug_levers lv = {.dt = dt, .ckpt = ckpt ? SNUG_CKPT_FULL : SNUG_CKPT_NONE, .master_weights = dt != SNUG_DT_F32};
    char what[96];
    snprintf(what, sizeof what, "%s %s%s", arch == SNUG_ARCH_GPT2 ? "gpt2 (tied)" : "llama (untied)",
             snug_dtype_name(dt), ckpt ? " full checkpointing" : "");

    /* the reference table as stored: an unsharded model with the same parameters */
    snug_engine rg;
    make_engine(&rg, &cfg, lv, 1);
    size_t P = rg.model.table.total, es = snug_dtype_size(dt);
    float *init = malloc(P * sizeof(float));
    CHECK(snug_model_init_random(&rg.model, 3) == 0);
    snug_model_get_params(&rg.model, init);
    char *ref = malloc(P * es);
    memcpy(ref, snug_model_stored(&rg.model, 0), P * es);
    snug_param_table table = rg.model.table;
    int L = cfg.n_layer;

    result *now = calloc(1, sizeof *now), *later = calloc(1, sizeof *later);
    run(&cfg, lv, init, ref, 0, now);
    run(&cfg, lv, init, ref, 1, later);
    CHECKF(isfinite(later->loss) && later->loss == now->loss, "%s: loss %.9g with prefetches outstanding, %.9g "
           "without", what, later->loss, now->loss);
    CHECKF(isfinite(later->eval) && later->eval == now->eval, "%s: evaluation loss %.9g, %.9g", what, later->eval,
           now->eval);
    size_t bad = 0, nonzero = 0;
    for (size_t k = 0; k < P; k++) {
        bad += memcmp(&later->grads[k], &now->grads[k], sizeof(float)) != 0 || !isfinite(later->grads[k]);
        nonzero += now->grads[k] != 0.0f;
    }
    CHECKF(bad == 0, "%s: %zu of %zu gradients differ when the prefetches complete late", what, bad, P);
    CHECKF(nonzero > P / 2, "%s: only %zu of %zu gradients are non-zero", what, nonzero, P);
    CHECKF(later->races == 0, "%s: %d gathers issued while a prefetch was outstanding", what, later->races);
    check_schedule(what, &table, L, later->step, later->nstep, 2);
    check_schedule(what, &table, L, later->evalev, later->neval, 1);
    CHECKF(same_events(later->step, later->nstep, later->skip, later->nskip),
           "%s: skip_step's gathers (%d) are not the step's (%d)", what, later->nskip, later->nstep);
    CHECKF(same_events(later->evalev, later->neval, later->skip_eval, later->nskip_eval),
           "%s: skip_step's evaluation gathers (%d) are not evaluation's (%d)", what, later->nskip_eval,
           later->neval);
    printf("  %-40s loss %.6f, %d gathers and waits per step, %zu gradients bitwise\n", what, later->loss,
           later->nstep, P);
    free(now->grads), free(later->grads), free(now), free(later);
    free(init), free(ref);
    snug_engine_free(&rg);
}

/* ---- QLoRA at stage 3 (model.h's q4_sharded): the layers' 4-bit spans gathered (and prefetched) the same way.
 * The base is frozen, so a span still in its buffer from the last pass is not gathered again: the events of a step
 * depend on what the buffers held before it, and the step and skip_step are compared from the same state. ---- */

typedef struct fake4 {
    snug_model *m;
    char **span;     /* (L) each layer's span whole, from an unsharded model's 4-bit matrices */
    const snug_model *ref;
    int deferred;
    char *pdst;      /* the outstanding prefetch */
    size_t ppiece;
    int pl;
    event ev[MAX_EV];
    int nev, races, wrong;
} fake4;

/* the other rank's piece of layer l's span into dst (garbage: 0xff bytes, NaN scales, instead) */
static void fill4(fake4 *f, char *dst, int l, size_t piece, int garbage) {
    for (int r = 0; r < f->m->q4_parts; r++)
        if (r != f->m->q4_part) {
            if (garbage)
                memset(dst + (size_t)r * piece, 0xff, piece);
            else
                memcpy(dst + (size_t)r * piece, f->span[l] + (size_t)r * piece, piece);
        }
}

/* every matrix of layer l in dst is the unsharded model's, byte for byte (this rank's piece came from its shard) */
static void check_span(fake4 *f, const char *dst, int l) {
    const snug_model *m = f->m;
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer == l && m->q4[i].n) {
            const snug_q4_tensor *q = &m->q4[i];
            f->wrong += memcmp(dst + m->q4_rel[i], f->ref->q4_block[i], snug_q4_bytes(q->type, q->n, q->blocksize,
                                                                                      q->nested)) != 0;
        }
}

static void on_gather4(void *ud, void *dst, size_t piece, int prefetch) {
    fake4 *f = ud;
    snug_model *m = f->m;
    int l = !dst ? -1 : m->q4pair.layer[dst == m->q4pair.buf[0] ? 0 : 1];
    if (f->nev < MAX_EV)
        f->ev[f->nev++] = (event){.kind = !dst ? 2 : prefetch, .offset = (size_t)(l + 1), .numel = piece};
    if (!dst) {
        if (f->pdst) {
            fill4(f, f->pdst, f->pl, f->ppiece, 0);
            check_span(f, f->pdst, f->pl);
        }
        f->pdst = NULL;
        return;
    }
    if (f->pdst)
        f->races++;
    if (prefetch && f->deferred) {
        fill4(f, dst, l, piece, 1);
        f->pdst = dst, f->ppiece = piece, f->pl = l;
    } else {
        fill4(f, dst, l, piece, 0);
        check_span(f, dst, l);
    }
}

static void make_qlora(snug_engine *g, const snug_model_config *cfg, int ckpt, int ranks) {
    snug_levers lv = {.dt = SNUG_DT_BF16, .ckpt = ckpt ? SNUG_CKPT_FULL : SNUG_CKPT_NONE,
                      .lora = {.kind = SNUG_ADAPTER_QLORA, .r = 4, .alpha = 8, .q4_nested = 1, .q4_blocksize = 64,
                               .targets = snug_lora_default_targets(cfg->arch)}};
    make_engine(g, cfg, lv, ranks);
    CHECK(snug_model_init_random(&g->model, 3) == 0 && snug_lora_init(&g->model, 11) == 0);
    if (g->model.lora.grads)
        memset(g->model.lora.grads, 0, g->model.lora.table.total * sizeof(float));
}

typedef struct result4 {
    double loss, eval;
    float *grads; /* (adapter table) */
    event step[MAX_EV], skip[MAX_EV], evalev[MAX_EV], skip_eval[MAX_EV];
    int nstep, nskip, neval, nskip_eval, races, wrong, prefetches;
} result4;

static void run4(const snug_model_config *cfg, int ckpt, const snug_model *ref, int deferred, result4 *res) {
    snug_engine g;
    make_qlora(&g, cfg, ckpt, 2);
    snug_model *m = &g.model;
    CHECK(m->q4_sharded && !m->param_sharded && m->q4_shard_n <= m->q4_gbuf_n * (size_t)cfg->n_layer / 2);
    int L = cfg->n_layer;
    char *span[64];
    for (int l = 0; l < L; l++) {
        span[l] = calloc(2, m->q4_piece[l]);
        for (int i = 0; i < m->table.n; i++)
            if (m->table.e[i].layer == l && m->q4[i].n)
                memcpy(span[l] + m->q4_rel[i], ref->q4_block[i],
                       snug_q4_bytes(m->q4[i].type, m->q4[i].n, m->q4[i].blocksize, m->q4[i].nested));
    }
    fake4 f = {.m = m, .span = span, .ref = ref, .deferred = deferred};
    static const snug_model_hook_ops ops = {.gather_q4 = on_gather4};
    m->hooks = (snug_model_hooks){.ops = &ops, .ud = &f};
    set_batch(m);
    res->loss = snug_model_step(m, 1.0f); /* the buffers' state after a step is the same after every step */
    size_t A = m->lora.table.total;
    res->grads = malloc(A * sizeof(float));
    memcpy(res->grads, m->lora.grads, A * sizeof(float));
    f.nev = 0;
    (void)snug_model_step(m, 1.0f);
    memcpy(res->step, f.ev, sizeof f.ev), res->nstep = f.nev, f.nev = 0;
    snug_model_skip_step(m, 1);
    memcpy(res->skip, f.ev, sizeof f.ev), res->nskip = f.nev, f.nev = 0;
    (void)snug_model_step(m, 0.0f); /* and after an evaluation the same after every evaluation */
    f.nev = 0;
    res->eval = snug_model_step(m, 0.0f);
    memcpy(res->evalev, f.ev, sizeof f.ev), res->neval = f.nev, f.nev = 0;
    snug_model_skip_step(m, 0);
    memcpy(res->skip_eval, f.ev, sizeof f.ev), res->nskip_eval = f.nev;
    res->races = f.races, res->wrong = f.wrong;
    for (int i = 0; i < res->nstep; i++)
        res->prefetches += res->step[i].kind == 1;
    for (int l = 0; l < L; l++)
        free(span[l]);
    snug_engine_free(&g);
}

static void test_qlora(snug_arch arch, int ckpt) {
    snug_model_config cfg = check_small_model(arch, VOCAB, 6, 64, 32);
    char what[96];
    snprintf(what, sizeof what, "qlora %s%s", arch == SNUG_ARCH_GPT2 ? "gpt2" : "llama", ckpt ? " full checkpointing" : "");
    snug_engine rg; /* one process: the 4-bit matrices whole, and the reference loss and adapter gradients */
    make_qlora(&rg, &cfg, ckpt, 1);
    set_batch(&rg.model);
    double loss = snug_model_step(&rg.model, 1.0f), eval = snug_model_step(&rg.model, 0.0f);
    result4 *now = calloc(1, sizeof *now), *later = calloc(1, sizeof *later);
    run4(&cfg, ckpt, &rg.model, 0, now);
    run4(&cfg, ckpt, &rg.model, 1, later);
    CHECKF(now->loss == loss && later->loss == loss && later->eval == eval && now->eval == eval,
           "%s: loss %.9g, %.9g late, one process %.9g; evaluation %.9g, %.9g late, one process %.9g", what,
           now->loss, later->loss, loss, now->eval, later->eval, eval);
    size_t A = rg.model.lora.table.total, bad = 0, nonzero = 0;
    for (size_t k = 0; k < A; k++) {
        bad += memcmp(&later->grads[k], &rg.model.lora.grads[k], sizeof(float)) != 0 ||
               memcmp(&now->grads[k], &rg.model.lora.grads[k], sizeof(float)) != 0;
        nonzero += rg.model.lora.grads[k] != 0.0f;
    }
    CHECKF(bad == 0 && nonzero > 0, "%s: %zu of %zu adapter gradients differ from one process's (%zu non-zero)", what,
           bad, A, nonzero);
    CHECKF(!later->races && !now->wrong && !later->wrong, "%s: %d gathers during a prefetch, %d and %d spans not the "
           "unsharded bytes", what, later->races, now->wrong, later->wrong);
    CHECKF(later->prefetches > 0, "%s: no prefetch in a step", what);
    CHECKF(same_events(later->step, later->nstep, later->skip, later->nskip) &&
           same_events(later->evalev, later->neval, later->skip_eval, later->nskip_eval),
           "%s: skip_step's gathers (%d, evaluation %d) are not the step's (%d, %d)", what, later->nskip,
           later->nskip_eval, later->nstep, later->neval);
    printf("  %-40s loss %.6f, %d gathers and waits per step (%d prefetches), %zu adapter gradients bitwise\n", what,
           later->loss, later->nstep, later->prefetches, A);
    free(now->grads), free(later->grads), free(now), free(later);
    snug_engine_free(&rg);
}

int main(void) {
    for (int a = 0; a < 2; a++)
        for (int ck = 0; ck < 2; ck++) {
            test_case(a ? SNUG_ARCH_GPT2 : SNUG_ARCH_LLAMA, SNUG_DT_F32, ck);
            test_case(a ? SNUG_ARCH_GPT2 : SNUG_ARCH_LLAMA, SNUG_DT_BF16, ck);
            test_qlora(a ? SNUG_ARCH_GPT2 : SNUG_ARCH_LLAMA, ck);
        }
    return check_finish("test_zero3_gather");
}
