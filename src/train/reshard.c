/* reshard.c: a checkpoint's sharded state read onto another split of the ranks (see reshard.h). */
#include "train/reshard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optim/optim.h"

#define PIECE ((size_t)16 << 20) /* bytes staged through host memory at a time */

typedef struct reader {
    snug_engine *eng;
    int host;           /* the arena is host memory: read straight into it */
    unsigned char *buf; /* else the staging buffer (PIECE) */
    int fd;
    const char *path;
} reader;

/* n bytes at offset off of the reader's file into dst, an address of the arena. */
static int copy_in(reader *r, size_t off, void *dst, size_t n, snug_error *e) {
    for (size_t o = 0; o < n;) {
        size_t k = n - o < PIECE ? n - o : PIECE;
        unsigned char *into = r->host ? (unsigned char *)dst + o : r->buf;
        ssize_t got = pread(r->fd, into, k, (off_t)(off + o));
        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)k)
            return snug_fail(e, SNUG_EINPUT, "%s: shorter than the %zu bytes its shard's layout holds (or unreadable); "
                             "the checkpoint is damaged or from another configuration", r->path, off + o + k);
        if (!r->host)
            r->eng->be->to_device(r->eng->be, (unsigned char *)dst + o, r->buf, k);
        o += k;
    }
    return 0;
}

static size_t nblocks(size_t n) { return (n + SNUG_Q8_BLOCK - 1) / SNUG_Q8_BLOCK; }

/* The optimizer state's layout over [lo, hi): where each buffer starts in the arena (bytes), and where each tensor's
 * part starts in its buffers (elements of m/v or qm/qv, blocks of am/av). */
typedef struct opt_layout {
    size_t m, v, qm, qv, am, av;
    size_t *p32, *p8, *blk; /* (table n) */
} opt_layout;

static size_t at_of(const void *p) { return p ? (size_t)((uintptr_t)p - SNUG_ARENA_ALIGN) : 0; }

static int layout_of(const snug_engine *eng, size_t lo, size_t hi, opt_layout *L, snug_error *e) {
    const snug_param_table *t = snug_model_trainable(&eng->model);
    snug_adamw o = eng->opt; /* the same kind, paging and rules: only the range differs */
    o.sharded = 1, o.shard_lo = lo, o.shard_hi = hi;
    snug_arenas A;
    snug_arenas_init_counting(&A); /* the layout code's offsets, nothing allocated */
    SNUG_TRY(snug_adamw_layout(&o, &A, t, NULL, e));
    L->m = at_of(o.m), L->v = at_of(o.v), L->qm = at_of(o.qm), L->qv = at_of(o.qv), L->am = at_of(o.am);
    L->av = at_of(o.av);
    size_t n = t->n > 0 ? (size_t)t->n : 1;
    L->p32 = malloc(n * sizeof *L->p32), L->p8 = malloc(n * sizeof *L->p8), L->blk = malloc(n * sizeof *L->blk);
    if (!L->p32 || !L->p8 || !L->blk)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the optimizer state's layout");
    size_t p32 = 0, p8 = 0, blk = 0;
    for (int i = 0; i < t->n; i++) {
        size_t a0, a1;
        snug_adamw_part(&t->e[i], lo, hi, &a0, &a1);
        L->p32[i] = p32, L->p8[i] = p8, L->blk[i] = blk;
        if (snug_adamw_entry_8bit(&o, &t->e[i]))
            p8 += a1 - a0, blk += nblocks(a1 - a0);
        else
            p32 += a1 - a0;
    }
    return 0;
}

static void layout_free(opt_layout *L) {
    free(L->p32);
    free(L->p8);
    free(L->blk);
}

/* The optimizer state over [lo, hi) (this rank's) from one source file laid out over [s->lo, s->hi). */
static int optim_from(reader *r, const opt_layout *me, size_t lo, size_t hi, const snug_shard_src *s, snug_error *e) {
    snug_engine *eng = r->eng;
    const snug_param_table *t = snug_model_trainable(&eng->model);
    const snug_adamw *o = &eng->opt;
    opt_layout L = {0};
    int rc = layout_of(eng, s->lo, s->hi, &L, e);
    for (int i = 0; !rc && i < t->n; i++) {
        size_t a0, a1, s0, s1;
        snug_adamw_part(&t->e[i], lo, hi, &a0, &a1);
        snug_adamw_part(&t->e[i], s->lo, s->hi, &s0, &s1);
        size_t c0 = a0 > s0 ? a0 : s0, c1 = a1 < s1 ? a1 : s1;
        if (c0 >= c1)
            continue;
        size_t n = c1 - c0, in_src = c0 - s0, in_me = c0 - a0;
        if (!snug_adamw_entry_8bit(o, &t->e[i])) {
            rc = copy_in(r, L.m + (L.p32[i] + in_src) * sizeof(float), o->m + me->p32[i] + in_me, n * sizeof(float), e);
            if (!rc)
                rc = copy_in(r, L.v + (L.p32[i] + in_src) * sizeof(float), o->v + me->p32[i] + in_me,
                             n * sizeof(float), e);
            continue;
        }
        if (in_src % SNUG_Q8_BLOCK || in_me % SNUG_Q8_BLOCK) /* shard edges lie on blocks (dist/zero.h) */
            return layout_free(&L), snug_fail(e, SNUG_EINTERNAL, "%s: a shard edge inside a quantization block of %s",
                                              r->path, t->e[i].name);
        size_t b_src = L.blk[i] + in_src / SNUG_Q8_BLOCK, b_me = me->blk[i] + in_me / SNUG_Q8_BLOCK, nb = nblocks(n);
        rc = copy_in(r, L.qm + L.p8[i] + in_src, o->qm + me->p8[i] + in_me, n, e);
        if (!rc)
            rc = copy_in(r, L.qv + L.p8[i] + in_src, o->qv + me->p8[i] + in_me, n, e);
        if (!rc)
            rc = copy_in(r, L.am + b_src * sizeof(float), o->am + b_me, nb * sizeof(float), e);
        if (!rc)
            rc = copy_in(r, L.av + b_src * sizeof(float), o->av + b_me, nb * sizeof(float), e);
    }
    layout_free(&L);
    return rc;
}

int snug_reshard_read(snug_engine *eng, snug_category c, const snug_shard_src *src, int n, snug_error *e) {
    snug_model *m = &eng->model;
    size_t lo, hi, es = sizeof(float), at = 0; /* this rank's range; element size; where the elements start */
    unsigned char *dst = NULL;
    opt_layout me = {0};
    if (c == SNUG_MEM_OPTIM) {
        lo = eng->opt.sharded ? eng->opt.shard_lo : 0;
        hi = eng->opt.sharded ? eng->opt.shard_hi : snug_model_trainable(m)->total;
        SNUG_TRY(layout_of(eng, lo, hi, &me, e));
        /* the layout counted for this rank's own range must be where its arena holds the state */
        const unsigned char *base = eng->blocks[c];
        const void *real[6] = {eng->opt.m, eng->opt.v, eng->opt.qm, eng->opt.qv, eng->opt.am, eng->opt.av};
        size_t want[6] = {me.m, me.v, me.qm, me.qv, me.am, me.av};
        for (int k = 0; k < 6; k++)
            if (real[k] && (size_t)((const unsigned char *)real[k] - base) != want[k]) {
                layout_free(&me);
                return snug_fail(e, SNUG_EINTERNAL, "the optimizer state's layout differs from the one it was counted "
                                 "with; a checkpoint cannot be resumed on another number of ranks");
            }
    } else if (c == SNUG_MEM_MASTER) {
        lo = m->master_lo, hi = m->master_lo + m->master_n;
        dst = (unsigned char *)m->params;
        at = (size_t)(dst - (unsigned char *)eng->blocks[c]);
    } else if (c == SNUG_MEM_PARAMS && m->param_sharded) {
        lo = m->pshard_lo, hi = m->pshard_lo + m->pshard_n;
        es = snug_dtype_size(m->lv.dt);
        dst = m->lv.dt == SNUG_DT_F32 ? (unsigned char *)m->params : (unsigned char *)m->params16;
    } else {
        return snug_fail(e, SNUG_EINTERNAL, "the %s arena is not sharded", snug_category_name(c));
    }
    reader r = {.eng = eng, .host = eng->plan.host[c] || eng->be->host_resident, .fd = -1};
    int rc = 0;
    if (!r.host && !(r.buf = malloc(PIECE)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory reading a checkpoint's shards");
    for (int k = 0; !rc && k < n; k++) {
        if (src[k].lo >= hi || src[k].hi <= lo || src[k].lo >= src[k].hi)
            continue; /* no element of this rank's range */
        r.path = src[k].path;
        if ((r.fd = open(src[k].path, O_RDONLY)) < 0) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: cannot open (%s); the checkpoint is incomplete", src[k].path,
                           strerror(errno));
            break;
        }
        if (c == SNUG_MEM_OPTIM) {
            rc = optim_from(&r, &me, lo, hi, &src[k], e);
        } else { /* the range's elements in order: the overlap is one piece */
            size_t c0 = lo > src[k].lo ? lo : src[k].lo, c1 = hi < src[k].hi ? hi : src[k].hi;
            rc = copy_in(&r, at + (c0 - src[k].lo) * es, dst + (c0 - lo) * es, (c1 - c0) * es, e);
        }
        close(r.fd);
        r.fd = -1;
    }
    free(r.buf);
    layout_free(&me);
    return rc;
}
