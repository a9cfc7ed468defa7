/* adamw.c: AdamW over the parameter table with fp32 or 8-bit state, paged or not, and global-norm clipping (see
 * optim.h for the state layout).
 *
 * Every walk over the state goes through `pos`: a point in the parameter table (tensor i, element a) together with
 * the offsets of that point in each flat state buffer. The step and the paged chunking are walks from one pos to
 * another, so a chunk can end inside a tensor (at a block boundary) and still be a few contiguous copies. */
#include <math.h>
#include <string.h>

#include "optim/optim.h"

#include "core/quant_map.h"
#include "core/rng.h"

#define ALIGN64(n) (((n) + 63) / 64 * 64)

/* A point in the state: element a of tensor i, at offset o32 of m/v, o8 of qm/qv and ob of am/av. */
typedef struct pos {
    int i;
    size_t a, o32, o8, ob;
} pos;

/* One contiguous piece of one state buffer in a chunk: where it lives and where it is staged on the device. */
typedef struct span {
    unsigned char *host, *dev;
    size_t bytes;
} span;

enum { NSPAN = 6 }; /* m, v, qm, qv, am, av */

/* Where an update reads gradients and writes parameters. Raw (model NULL): fp32 params and grads, both at the table
 * offsets. From a model: its parameters (fp32, or 16-bit with or without the fp32 master copy) and its gradients
 * (fp32 or 16-bit, at grad_off). 16-bit values pass through the optimizer's fp32 staging slots. */
typedef struct io {
    const snug_model *m;
    float *params;
    const float *grads;
} io;

static size_t nblocks(size_t n) { return (n + SNUG_Q8_BLOCK - 1) / SNUG_Q8_BLOCK; }

/* An embedding table of the parameter table: token embeddings (Llama family, GPT-2) and GPT-2's positions. The
 * table builder (model/params.c) names every tensor, so the names are the reliable mark. */
static int is_embedding(const snug_param_entry *p) {
    static const char *const names[] = {"model.embed_tokens.weight", "transformer.wte.weight",
                                        "transformer.wpe.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(p->name, names[i]))
            return 1;
    return 0;
}

int snug_adamw_entry_8bit(const snug_adamw *opt, const snug_param_entry *p) {
    return opt->kind == SNUG_OPTIM_ADAMW_8BIT && p->numel >= SNUG_Q8_MIN_NUMEL && !(opt->embed_fp32 && is_embedding(p));
}

void snug_adamw_part(const snug_param_entry *p, size_t lo, size_t hi, size_t *a0, size_t *a1) {
    size_t b = p->offset, e = p->offset + p->numel;
    if (p->frozen) /* unfrozen_parameters: a frozen tensor has no state and takes no step */
        lo = hi = b;
    lo = lo < b ? b : lo > e ? e : lo;
    hi = hi < lo ? lo : hi > e ? e : hi;
    *a0 = lo - b;
    *a1 = hi - b;
}

/* Tensor p's elements in the shard, [*a0, *a1): the whole tensor without one. */
static void shard_part(const snug_adamw *o, const snug_param_entry *p, size_t *a0, size_t *a1) {
    snug_adamw_part(p, o->sharded ? o->shard_lo : p->offset, o->sharded ? o->shard_hi : p->offset + p->numel, a0, a1);
}

/* Where tensor p's elements in the shard end. */
static size_t part_end(const snug_adamw *o, const snug_param_entry *p) {
    size_t a0, a1;
    shard_part(o, p, &a0, &a1);
    return a1;
}

/* Moves at onto the next element the walk steps: into the current tensor's part of the shard, or past the tensors
 * it has finished or that have no element in the shard. */
static void settle(const snug_adamw *o, const snug_param_table *t, pos *at) {
    for (; at->i < t->n; at->i++, at->a = 0) {
        size_t a0, a1;
        shard_part(o, &t->e[at->i], &a0, &a1);
        if (at->a < a0)
            at->a = a0;
        if (at->a < a1)
            return;
    }
}

/* The first point of a walk over t: the first element of the shard. */
static pos walk_start(const snug_adamw *o, const snug_param_table *t) {
    pos at = {0};
    settle(o, t, &at);
    return at;
}

/* Moves at by k elements within its tensor: k reaches the tensor's part's end or is a multiple of the block. */
static void advance(const snug_adamw *o, const snug_param_table *t, pos *at, size_t k) {
    const snug_param_entry *p = &t->e[at->i];
    if (snug_adamw_entry_8bit(o, p)) {
        at->o8 += k;
        at->ob += nblocks(k);
    } else {
        at->o32 += k;
    }
    at->a += k;
    settle(o, t, at);
}

/* The end of the chunk that starts at beg and holds at most `budget` bytes of state (at least one block's worth). */
static pos chunk_end(const snug_adamw *o, const snug_param_table *t, pos beg, size_t budget) {
    pos at = beg;
    while (at.i < t->n) {
        const snug_param_entry *p = &t->e[at.i];
        size_t rest = part_end(o, p) - at.a, take;
        if (snug_adamw_entry_8bit(o, p)) {
            size_t per_block = 2 * SNUG_Q8_BLOCK + 2 * sizeof(float);
            size_t need = 2 * rest + 2 * sizeof(float) * nblocks(rest);
            take = need <= budget ? rest : budget / per_block * SNUG_Q8_BLOCK;
            budget -= 2 * take + 2 * sizeof(float) * nblocks(take);
        } else {
            size_t fit = budget / (2 * sizeof(float));
            take = rest < fit ? rest : fit;
            budget -= 2 * sizeof(float) * take;
        }
        if (take == 0 && rest > 0)
            break;
        advance(o, t, &at, take);
        if (take < rest)
            break;
    }
    return at;
}

/* The six pieces of state between beg and end, placed one after another (64-byte aligned) from slot; returns the
 * bytes of the slot they use. slot NULL: only the sizes. */
static size_t chunk_spans(const snug_adamw *o, pos beg, pos end, unsigned char *slot, span s[NSPAN]) {
    size_t bytes[NSPAN] = {
        (end.o32 - beg.o32) * sizeof(float), (end.o32 - beg.o32) * sizeof(float), end.o8 - beg.o8, end.o8 - beg.o8,
        (end.ob - beg.ob) * sizeof(float),   (end.ob - beg.ob) * sizeof(float),
    };
    size_t used = 0;
    for (int k = 0; k < NSPAN; k++) {
        s[k].bytes = bytes[k];
        s[k].host = s[k].dev = NULL;
        if (!bytes[k])
            continue;
        switch (k) {
        case 0: s[k].host = (unsigned char *)(o->m + beg.o32); break;
        case 1: s[k].host = (unsigned char *)(o->v + beg.o32); break;
        case 2: s[k].host = o->qm + beg.o8; break;
        case 3: s[k].host = o->qv + beg.o8; break;
        case 4: s[k].host = (unsigned char *)(o->am + beg.ob); break;
        case 5: s[k].host = (unsigned char *)(o->av + beg.ob); break;
        }
        if (slot)
            s[k].dev = slot + used;
        used += ALIGN64(bytes[k]);
    }
    return used;
}

#define CARVE(dst, arena, bytes)                                                  \
    do {                                                                          \
        (dst) = NULL;                                                             \
        if ((bytes) > 0 && !((dst) = snug_arena_alloc((arena), (bytes), e)))      \
            return e ? e->code : SNUG_ENOMEM;                                     \
    } while (0)

int snug_adamw_layout(snug_adamw *opt, snug_arenas *A, const snug_param_table *t, snug_backend *be, snug_error *e) {
    if (!opt->chunk_bytes)
        opt->chunk_bytes = SNUG_PAGED_CHUNK_BYTES;
    if (opt->chunk_bytes < 2 * SNUG_Q8_BLOCK + 2 * sizeof(float)) /* a chunk holds at least one block */
        opt->chunk_bytes = 2 * SNUG_Q8_BLOCK + 2 * sizeof(float);
    opt->n32 = opt->n8 = opt->nblk = 0;
    for (int i = 0; i < t->n; i++) { /* the shard's part of each tensor (all of it without a shard) */
        const snug_param_entry *p = &t->e[i];
        size_t a0, a1;
        shard_part(opt, p, &a0, &a1);
        if (snug_adamw_entry_8bit(opt, p)) {
            opt->n8 += a1 - a0;
            opt->nblk += nblocks(a1 - a0);
        } else {
            opt->n32 += a1 - a0;
        }
    }
    snug_arena *S = &A->a[SNUG_MEM_OPTIM];                                    /* the state: device or host */
    snug_arena *D = &A->a[opt->paged ? SNUG_MEM_WORKSPACE : SNUG_MEM_OPTIM]; /* what must be on the device */
    CARVE(opt->m, S, opt->n32 * sizeof(float));
    CARVE(opt->v, S, opt->n32 * sizeof(float));
    CARVE(opt->qm, S, opt->n8);
    CARVE(opt->qv, S, opt->n8);
    CARVE(opt->am, S, opt->nblk * sizeof(float));
    CARVE(opt->av, S, opt->nblk * sizeof(float));
    opt->qmap = NULL;
    if (opt->kind == SNUG_OPTIM_ADAMW_8BIT) {
        CARVE(opt->qmap, D, 2 * 256 * sizeof(float));
        if (be) {
            float maps[2 * 256];
            snug_dynamic_map(maps, 1);
            snug_dynamic_map(maps + 256, 0);
            be->to_device(be, opt->qmap, maps, sizeof maps);
        }
    }
    /* 16-bit parameters or gradients pass through two fp32 slots (parameters, gradients) in the workspace */
    opt->stage_p = opt->stage_g = NULL;
    opt->stage_n = (size_t)1 << 18; /* a multiple of SNUG_Q8_BLOCK */
    if (opt->stage16) {
        CARVE(opt->stage_p, &A->a[SNUG_MEM_WORKSPACE], opt->stage_n * sizeof(float));
        CARVE(opt->stage_g, &A->a[SNUG_MEM_WORKSPACE], opt->stage_n * sizeof(float));
    }
    opt->stage[0] = opt->stage[1] = NULL;
    opt->stage_bytes = 0;
    if (opt->paged) {
        /* each slot holds the largest chunk the step will cut; a second slot only when there is a second chunk */
        span s[NSPAN];
        int nchunks = 0;
        for (pos beg = walk_start(opt, t), end; beg.i < t->n; beg = end, nchunks++) {
            end = chunk_end(opt, t, beg, opt->chunk_bytes);
            size_t used = chunk_spans(opt, beg, end, NULL, s);
            if (used > opt->stage_bytes)
                opt->stage_bytes = used;
        }
        /* the step inside backward cuts chunks from each layer's start, which may pad differently: with more than
         * one chunk, a slot takes the most any chunk can use (its budget plus each span's alignment); a single
         * chunk's runs are each smaller than it */
        if (nchunks > 1)
            opt->stage_bytes = opt->chunk_bytes + NSPAN * 64;
        CARVE(opt->stage[0], D, opt->stage_bytes);
        if (nchunks > 1)
            CARVE(opt->stage[1], D, opt->stage_bytes);
    }
    return 0;
}

double snug_grad_norm(snug_backend *be, const float *grads, size_t n, float grad_scale) {
    return sqrt(be->sumsq(be, grads, SNUG_DT_F32, n)) * fabs((double)grad_scale);
}

/* The AdamW op of tensor p's state over k contiguous elements (8-bit codes and absmax at a block boundary). */
static void op(snug_adamw *o, snug_backend *be, const snug_param_entry *p, float *pp, const float *gg, size_t k,
               double lr, float gs, float *m, float *v, uint8_t *qm, uint8_t *qv, float *am, float *av) {
    double wd = p->decay ? o->weight_decay : 0.0;
    if (p->lr_scale != 1.0) /* (LoRA+: lr times the ratio, in double as torch's param group holds it) */
        lr *= p->lr_scale;
    if (snug_adamw_entry_8bit(o, p))
        be->adamw8bit(be, pp, gg, qm, qv, am, av, o->qmap, o->qmap + 256, k, lr, o->beta1, o->beta2, o->eps, wd,
                      o->step, gs);
    else if (k)
        be->adamw(be, pp, gg, m, v, k, lr, o->beta1, o->beta2, o->eps, wd, o->step, gs);
}

/* Updates elements [a, a+k) of tensor i, whose state starts at the pointers given. */
static void update_piece(snug_adamw *o, snug_backend *be, const snug_param_table *t, const io *x, int i, size_t a,
                         size_t k, double lr, float gs, float *m, float *v, uint8_t *qm, uint8_t *qv, float *am,
                         float *av) {
    const snug_param_entry *p = &t->e[i];
    size_t off = p->offset + a;
    const snug_model *md = x->m;
    if (!md) {
        op(o, be, p, x->params + off, x->grads + off, k, lr, gs, m, v, qm, qv, am, av);
        return;
    }
    int p16 = md->lv.dt != SNUG_DT_F32, g16 = snug_model_grad16(md, i);
    size_t goff = md->grad_off[i] + a;
    /* fp32 gradients: the model's, or under ZeRO-2 the rank's shard of their sum (stage 3 inside backward: the rank's
     * part of the layer's sum, reduce-scattered in place in the layer's buffer) */
    const float *gsrc = md->lv.zero_grads && !md->lv.optimizer_in_backward ? md->gshard + (off - md->gshard_lo)
                        : md->grads                                        ? md->grads + goff
                                                                           : NULL;
    /* ZeRO: the shard's master copy; ZeRO-3: the shard's parameters (fp32 or 16-bit) at their place in the shard */
    size_t p0 = md->param_sharded ? md->pshard_lo : 0;
    float *master = md->params && md->master_sharded ? md->params + (off - md->master_lo)
                                                     : md->params ? md->params + (off - p0) : NULL;
    uint16_t *p16s = md->params16 ? md->params16 + (off - p0) : NULL;
    if (!p16 && !g16) {
        op(o, be, p, master, gsrc, k, lr, gs, m, v, qm, qv, am, av);
        return;
    }
    /* 16-bit: slices of the staging size (a multiple of the 8-bit block, so the codes' blocks stay aligned) */
    for (size_t j = 0; j < k; j += o->stage_n) {
        size_t kk = k - j < o->stage_n ? k - j : o->stage_n;
        float *pp = master ? master + j : o->stage_p;
        const float *gg = gsrc ? gsrc + j : NULL;
        if (!md->params)
            be->from16(be, o->stage_p, p16s + j, kk, md->lv.dt);
        if (g16) {
            be->from16(be, o->stage_g, md->grads16 + goff + j, kk, md->lv.dt);
            gg = o->stage_g;
        }
        size_t jb = j / SNUG_Q8_BLOCK;
        op(o, be, p, pp, gg, kk, lr, gs, m ? m + j : NULL, v ? v + j : NULL, qm ? qm + j : NULL,
           qv ? qv + j : NULL, am ? am + jb : NULL, av ? av + jb : NULL);
        if (!p16)
            continue;
        if (md->params) /* the 16-bit weights are the master copy rounded to nearest */
            be->to16(be, p16s + j, pp, kk, md->lv.dt, 0);
        else            /* no master: the update itself is rounded stochastically, unbiased on average */
            be->bf16_sr(be, p16s + j, pp, kk, o->sr_seed + (off + j) * 0x9E3779B97F4A7C15ull);
    }
}

/* Steps the tensors from beg to end. The state buffers given start at beg's state (the real buffers offset to beg,
 * or a staging slot holding the chunk). */
static void update_range(snug_adamw *o, snug_backend *be, const snug_param_table *t, const io *x, double lr,
                         float gs, pos beg, pos end, float *m, float *v, uint8_t *qm, uint8_t *qv, float *am,
                         float *av) {
    pos at = beg;
    while (at.i < end.i || (at.i == end.i && at.a < end.a)) {
        const snug_param_entry *p = &t->e[at.i];
        size_t k = (at.i < end.i ? part_end(o, p) : end.a) - at.a;
        update_piece(o, be, t, x, at.i, at.a, k, lr, gs, m ? m + (at.o32 - beg.o32) : NULL,
                     v ? v + (at.o32 - beg.o32) : NULL, qm ? qm + (at.o8 - beg.o8) : NULL,
                     qv ? qv + (at.o8 - beg.o8) : NULL, am ? am + (at.ob - beg.ob) : NULL,
                     av ? av + (at.ob - beg.ob) : NULL);
        advance(o, t, &at, k);
    }
}

static void copy_in(snug_backend *be, const span s[NSPAN]) {
    for (int k = 0; k < NSPAN; k++)
        if (s[k].bytes)
            be->copy_in_async(be, s[k].dev, s[k].host, s[k].bytes);
}

static void copy_out(snug_backend *be, const span s[NSPAN]) {
    for (int k = 0; k < NSPAN; k++)
        if (s[k].bytes)
            be->copy_out_async(be, s[k].host, s[k].dev, s[k].bytes);
}

#define SPAN_ARGS(s) (float *)(s)[0].dev, (float *)(s)[1].dev, (s)[2].dev, (s)[3].dev, (float *)(s)[4].dev, \
                     (float *)(s)[5].dev

/* Paged: chunk k+1 is copied into one slot while chunk k is updated in the other; one sync per chunk orders the
 * update before its copy back, and a slot's next copy in is queued after its copy out on the same side stream.
 * Steps the tensors from `start` to the end of t (a table cut short steps a run of tensors: one layer's). */
static void step_paged(snug_adamw *o, snug_backend *be, const snug_param_table *t, const io *x, double lr,
                       float gs, pos start) {
    span cur[NSPAN], nxt[NSPAN] = {{0}};
    pos beg = start, end = chunk_end(o, t, beg, o->chunk_bytes);
    int slot = 0;
    chunk_spans(o, beg, end, o->stage[slot], cur);
    copy_in(be, cur);
    be->sync(be);
    while (beg.i < t->n) {
        pos nbeg = end, nend = end;
        if (nbeg.i < t->n) {
            nend = chunk_end(o, t, nbeg, o->chunk_bytes);
            chunk_spans(o, nbeg, nend, o->stage[slot ^ 1], nxt);
            copy_in(be, nxt);
        }
        update_range(o, be, t, x, lr, gs, beg, end, SPAN_ARGS(cur));
        be->sync(be);
        copy_out(be, cur);
        memcpy(cur, nxt, sizeof cur);
        beg = nbeg;
        end = nend;
        slot ^= 1;
    }
    be->sync(be);
}

/* The stochastic-rounding stream of optimizer step `step`: each step rounds with fresh bits, reproducibly. */
static uint64_t sr_seed(int step) {
    uint64_t s = 0x5eed5eed5eedull + (uint64_t)step;
    return snug_splitmix64(&s);
}

static void step_all(snug_adamw *opt, snug_backend *be, const snug_param_table *t, const io *x, double lr,
                     float grad_scale) {
    opt->step++;
    opt->sr_seed = sr_seed(opt->step);
    if (opt->paged) {
        step_paged(opt, be, t, x, lr, grad_scale, walk_start(opt, t));
        return;
    }
    pos beg = walk_start(opt, t), end = {.i = t->n, .o32 = opt->n32, .o8 = opt->n8, .ob = opt->nblk};
    update_range(opt, be, t, x, lr, grad_scale, beg, end, opt->m, opt->v, opt->qm, opt->qv, opt->am, opt->av);
}

void snug_adamw_step(snug_adamw *opt, snug_backend *be, const snug_param_table *t, float *params, const float *grads,
                     double lr, float grad_scale) {
    io x = {.params = params, .grads = grads};
    step_all(opt, be, t, &x, lr, grad_scale);
}

void snug_adamw_step_model(snug_adamw *opt, const snug_model *m, double lr, float grad_scale) {
    if (m->lora.on) { /* only the adapters train, in fp32 */
        snug_adamw_step(opt, m->be, &m->lora.table, m->lora.params, m->lora.grads, lr, grad_scale);
        return;
    }
    io x = {.m = m};
    step_all(opt, m->be, &m->table, &x, lr, grad_scale);
}

/* The announcement tensor i of t belongs to: its layer, or for the model's global tensors their group (under ZeRO
 * stage 3 the ones after the layers are announced apart, snug_model_ready_group). */
static int group_of(const snug_model *m, const snug_param_table *t, int i) {
    return m->lora.on ? t->e[i].layer : snug_model_ready_group(m, i);
}

void snug_adamw_step_layer(snug_adamw *opt, const snug_model *m, int layer, double lr, float grad_scale) {
    /* under LoRA the adapters' table: fp32 parameters and gradients at its offsets */
    const snug_param_table *t = snug_model_trainable(m);
    io x = m->lora.on ? (io){.params = m->lora.params, .grads = m->lora.grads} : (io){.m = m};
    opt->sr_seed = sr_seed(opt->step);
    pos at = walk_start(opt, t);
    if (opt->paged) { /* each run of the layer's tensors (the globals are two runs) streams through the slots */
        while (at.i < t->n) {
            if (group_of(m, t, at.i) != layer) {
                advance(opt, t, &at, part_end(opt, &t->e[at.i]) - at.a);
                continue;
            }
            int stop = at.i;
            while (stop < t->n && group_of(m, t, stop) == layer)
                stop++;
            snug_param_table run = *t;
            run.n = stop;
            step_paged(opt, m->be, &run, &x, lr, grad_scale, at);
            while (at.i < stop)
                advance(opt, t, &at, part_end(opt, &t->e[at.i]) - at.a);
        }
        return;
    }
    while (at.i < t->n) {
        const snug_param_entry *p = &t->e[at.i];
        size_t k = part_end(opt, p) - at.a;
        if (group_of(m, t, at.i) == layer)
            update_piece(opt, m->be, t, &x, at.i, at.a, k, lr, grad_scale, opt->m ? opt->m + at.o32 : NULL,
                         opt->v ? opt->v + at.o32 : NULL, opt->qm ? opt->qm + at.o8 : NULL,
                         opt->qv ? opt->qv + at.o8 : NULL, opt->am ? opt->am + at.ob : NULL,
                         opt->av ? opt->av + at.ob : NULL);
        advance(opt, t, &at, k);
    }
}

double snug_grad_norm_model(const snug_model *m, float grad_scale) {
    snug_backend *be = m->be;
    double ss = 0;
    if (m->grads)
        ss += be->sumsq(be, m->grads, SNUG_DT_F32, m->grads_numel);
    if (m->grads16)
        ss += be->sumsq(be, m->grads16, m->lv.dt, m->grads16_numel);
    if (m->lora.grads)
        ss += be->sumsq(be, m->lora.grads, SNUG_DT_F32, m->lora.table.total);
    return sqrt(ss) * fabs((double)grad_scale);
}

const char *snug_optim_name(snug_optim_kind kind, int paged) {
    if (kind == SNUG_OPTIM_ADAMW_8BIT)
        return paged ? "paged_adamw_8bit" : "adamw_8bit";
    return paged ? "paged_adamw_32bit" : "adamw";
}
