/* linear.c: the block's linear layers, the one place a weight is made readable for a GEMM: fp32 views, 16-bit
 * widened into wl or read as stored (matmul_w16), a ZeRO-3 gathered layer, QLoRA's 4-bit matrices dequantized a
 * chunk of rows at a time (model_layer_weights, lin_fwd, lin_bwd); model_linear_fwd and model_linear_bwd run a site
 * with its adapters (lora.h) and tensor parallelism's row-parallel bias, so the layer code has no branch on how a
 * weight is stored or adapted. */
#include "model/model_impl.h"

/* Rows [r0, r0 + nr) of quantized matrix i into dst (nr x cols) as forward reads them: by the backend's op (where the
 * tensor lives) from the rows' slice of codes and scales (r0 is a multiple of its chunk_rows), then rounded to the
 * run's 16-bit type, as bitsandbytes' dequantize_4bit gives the weight's dtype (and, 8-bit, as its MatMul8bitFp
 * does: its codes cast to the dtype and multiplied by the fp32 factor). */
void model_dequant_rows(const snug_model *m, int i, size_t r0, size_t nr, float *dst) {
    snug_backend *be = m->be;
    const snug_q4_tensor *q = &m->q4[i];
    size_t cols = (size_t)q->shape[1], off = r0 * cols, n = nr * cols, bs = (size_t)q->blocksize;
    size_t b0 = off / bs, nb = q->nested ? (size_t)q->nested_blocksize : 1;
    if (q->type == SNUG_Q4_INT8)
        be->dequantize_int8(be, dst, (const int8_t *)q->packed + off, q->absmax + r0, nr, cols);
    else
        be->dequantize_4bit(be, dst, q->packed + off / 2, q->nested ? NULL : q->absmax + b0,
                            q->nested ? q->absmax_q + b0 : NULL, q->nested ? q->nested_absmax + b0 / nb : NULL,
                            q->nested_quant_map, q->nested_offset, snug_q4_code((snug_q4_type)q->type), n,
                            q->blocksize);
    be->to16(be, NULL, dst, n, m->lv.dt, 1);
}

/* Layer l's weights as fp32 views: the parameters themselves, or under 16-bit the layer widened into wl. Where the
 * backend's GEMMs read 16-bit weights as stored (matmul_w16), only the norms and biases are widened and
 * lin_fwd and lin_bwd take the matrices from params16 (wl16): the views of the four are NULL. */
const snug_layer_tensors *model_layer_weights(snug_model *m, int l) {
    if (m->q4_sharded)
        model_q4_layer(m, l);
    if (m->param_sharded && !is16(m)) {
        (void)model_gathered_layer(m, l);
        return &m->gbuf_t[l % 2];
    }
    if (!is16(m))
        return &m->w.layers[l];
    /* a sharded layer is widened from its gathered buffer: the 16-bit matrices as stored are only the shard */
    int direct = !m->q4 && !m->param_sharded && m->be->matmul_w16_fwd && m->be->matmul_w16_bwd;
    if (m->wl_layer == l && m->wl_direct == direct && !m->param_sharded) /* sharded: the gather decides below */
        return direct ? &m->wd_t : &m->wl_t;
    if (direct) {
        for (int i = 0; i < m->table.n; i++) {
            const snug_param_entry *p = &m->table.e[i];
            if (p->layer != l)
                continue;
            int site = p->ndim == 2 ? model_weight_site(p->name) : -1;
            if (site >= 0)
                m->wl16[site] = model_stored16(m, i);
            else if (p->ndim != 2)
                m->be->from16(m->be, m->wl + (p->offset - m->table.layer_offset[l]), model_stored16(m, i), p->numel,
                              m->lv.dt);
        }
    } else if (m->param_sharded) {
        if (m->gpair.layer[l % 2] != l || m->wl_layer != l)
            m->be->from16(m->be, m->wl, model_gathered_layer(m, l), m->table.layer_numel[l], m->lv.dt);
    } else if (!m->q4) {
        size_t start = m->table.layer_offset[l];
        if (m->packed)
            model_dense_layer(m, l, &start);
        m->be->from16(m->be, m->wl, m->params16 + start, m->table.layer_numel[l], m->lv.dt);
    } else { /* QLoRA: only the dense tensors; the 4-bit matrices stream through wq */
        size_t start, n = model_dense_layer(m, l, &start);
        if (n)
            m->be->from16(m->be, m->wl, m->params16 + start, n, m->lv.dt);
    }
    m->wl_layer = l, m->wl_direct = direct;
    return direct ? &m->wd_t : &m->wl_t;
}

void snug_model_site_rows(snug_model *m, int l, snug_site site, int row, int nr, int in, float *dst) {
    snug_backend *be = m->be;
    const snug_layer_tensors *w = model_layer_weights(m, l);
    if (m->q4) { /* the 4-bit matrices of the site that hold some of the rows */
        for (int i = 0; i < m->table.n; i++) {
            if (m->table.e[i].layer != l || !m->q4[i].n || m->q4_site[i].site != (int)site)
                continue;
            int r0 = m->q4_site[i].row0, R = (int)m->q4[i].shape[0];
            int a = row > r0 ? row : r0, b = row + nr < r0 + R ? row + nr : r0 + R;
            if (a < b)
                model_dequant_rows(m, i, (size_t)(a - r0), (size_t)(b - a), dst + (size_t)(a - row) * in);
        }
        return;
    }
    const float *f = snug_site_weight(w, site);
    if (f)
        be->copy(be, dst, f + (size_t)row * in, (size_t)nr * in * sizeof *dst);
    else /* the 16-bit weight as stored */
        be->from16(be, dst, m->wl16[site] + (size_t)row * in, (size_t)nr * in, m->lv.dt);
}

/* out (N, OC) = inp (N, Cin) @ W^T + b, W the site's weight (OC, Cin): w, or with w NULL its 16-bit copy as stored
 * (wl16). Under QLoRA W is the site's 4-bit matrices, each dequantized a chunk of rows at a time into wq, and each
 * chunk's GEMM writes its columns of out. */
static void lin_fwd(snug_model *m, int l, snug_site site, float *out, const float *inp, const float *w,
                    const float *b, int N, int Cin, int OC) {
    snug_backend *be = m->be;
    if (!m->q4 && !w) { /* the 16-bit weight as stored (model_layer_weights) */
        be->matmul_w16_fwd(be, out, inp, m->wl16[site], m->lv.dt, b, N, Cin, OC);
        return;
    }
    if (!m->q4) {
        be->matmul_fwd(be, out, inp, w, b, N, Cin, OC);
        return;
    }
    for (int i = 0; i < m->table.n; i++) {
        if (m->table.e[i].layer != l || !m->q4[i].n || m->q4_site[i].site != (int)site)
            continue;
        int R = (int)m->q4[i].shape[0], cr = m->q4_site[i].chunk_rows, row0 = m->q4_site[i].row0;
        for (int r = 0; r < R; r += cr) {
            int nr = R - r < cr ? R - r : cr;
            model_dequant_rows(m, i, r, nr, m->wq);
            be->gemm_strided(be, 0, 1, N, nr, Cin, 1.0f, inp, Cin, m->wq, Cin, 0.0f, out + row0 + r, OC);
        }
    }
    if (b) /* out += ones (N, 1) @ b (1, OC) */
        be->gemm_strided(be, 0, 0, N, OC, 1, 1.0f, m->ones, 1, b, OC, 1.0f, out, OC);
}

/* The backward of lin_fwd: dinp += dout @ W, dw += dout^T @ inp, db += column sums of dout (each skipped when
 * NULL). Under QLoRA the base is frozen (no dw, no db) and dinp takes the chunks' products in turn. */
static void lin_bwd(snug_model *m, int l, snug_site site, float *dinp, float *dw, float *db, const float *dout,
                    const float *inp, const float *w, int N, int Cin, int OC) {
    snug_backend *be = m->be;
    if (!m->q4 && !w) {
        be->matmul_w16_bwd(be, dinp, dw, db, dout, inp, m->wl16[site], m->lv.dt, N, Cin, OC);
        return;
    }
    if (!m->q4) {
        be->matmul_bwd(be, dinp, dw, db, dout, inp, w, N, Cin, OC);
        return;
    }
    for (int i = 0; dinp && i < m->table.n; i++) {
        if (m->table.e[i].layer != l || !m->q4[i].n || m->q4_site[i].site != (int)site)
            continue;
        int R = (int)m->q4[i].shape[0], cr = m->q4_site[i].chunk_rows, row0 = m->q4_site[i].row0;
        for (int r = 0; r < R; r += cr) {
            int nr = R - r < cr ? R - r : cr;
            model_dequant_rows(m, i, r, nr, m->wq);
            be->gemm_strided(be, 0, 0, N, Cin, nr, 1.0f, dout + row0 + r, OC, m->wq, Cin, 1.0f, dinp, Cin);
        }
    }
}

/* Tensor parallelism: a row-parallel site's bias, added by rank 0 alone (the ranks' partial outputs are summed) */
static const float *tp_bias(const snug_model *m, const float *b) { return m->tp > 1 && m->tp_rank ? NULL : b; }

/* The linear layer at `site` of layer l, with its adapters, as the block's forward runs it: out (N, OC) = inp (N, Cin)
 * @ W^T + b from wherever W is stored (lin_fwd), then the adapters' share (inp: rows n0.. of the micro-batch). The
 * bias of a row-parallel site (o, down) is tensor parallelism's rank 0's alone; the caller sums the ranks' out. */
void model_linear_fwd(snug_model *m, int l, snug_site site, float *out, const float *inp, const float *w,
                      const float *b, int N, int n0, int Cin, int OC) {
    const snug_lora_ctx lx = model_lora_ctx(m);
    const float *bias = site == SNUG_SITE_O || site == SNUG_SITE_PROJ ? tp_bias(m, b) : b;
    lin_fwd(m, l, site, out, inp, w, bias, N, Cin, OC);
    snug_lora_fwd(&lx, l, site, out, OC, inp, N, n0, bias);
}

/* Its backward: DoRA's magnitudes and its scaled output gradient first (y: the site's output as forward left it and
 * yb its bias, at q/k/v and gate/up, whose dout is then scaled in place; NULL at o and down, whose dout is the
 * residual stream's gradient and is read again), then the base's dinp, dw, db (lin_bwd) and the adapters'. */
void model_linear_bwd(snug_model *m, int l, snug_site site, float *dinp, float *dw, float *db, float *dout,
                      const float *inp, const float *w, int N, int n0, int Cin, int OC, const float *y,
                      const float *yb) {
    const snug_lora_ctx lx = model_lora_ctx(m);
    const float *d = snug_lora_dora_bwd(&lx, l, site, dout, OC, inp, N, y, yb, y != NULL);
    lin_bwd(m, l, site, dinp, dw, db, d, inp, w, N, Cin, OC);
    snug_lora_bwd(&lx, l, site, dinp, d, OC, inp, N, n0);
}

/* Tensor parallelism: n floats summed over the ranks in place (nothing on one rank) */
void model_tp_sum(snug_model *m, float *x, size_t n) {
    if (m->tp > 1 && model_hooks(m)->tp_reduce)
        model_hooks(m)->tp_reduce(m->hooks.ud, x, n);
}
