/* weights.c: the parameters in and out of the model as fp32 (put and get, a range or a tensor at a time), through
 * whatever stores them: fp32, 16-bit with its master copy, a ZeRO-3 shard, QLoRA's 4-bit blocks. */
#include "model/model_impl.h"

void snug_model_entry_f32(const snug_model *m, int i, float *dst) {
    snug_backend *be = m->be;
    const snug_param_entry *p = &m->table.e[i];
    if (m->params && !m->master_sharded) { /* fp32 (or the master copy): dst = 0 + the parameters, exactly */
        be->zero(be, dst, p->numel * sizeof *dst);
        be->accumulate(be, dst, m->params + p->offset, p->numel);
    } else if (snug_model_entry_q4(m, i)) {
        model_q4_local(m, p->layer);
        size_t R = (size_t)m->q4[i].shape[0], cols = (size_t)m->q4[i].shape[1], cr = (size_t)m->q4_site[i].chunk_rows;
        for (size_t r = 0; r < R; r += cr)
            model_dequant_rows(m, i, r, R - r < cr ? R - r : cr, dst + r * cols);
    } else {
        be->from16(be, dst, model_stored16(m, i), p->numel, m->lv.dt);
    }
}

/* The larger of the fp32 workspaces that tensors pass through on their way in and out of 16-bit storage (wl,
 * and under QLoRA wq), and its size in floats. */
static float *staging(const snug_model *m, size_t *n) {
    *n = m->wq_n > m->wl_n ? m->wq_n : m->wl_n;
    return m->wq_n > m->wl_n ? m->wq : m->wl;
}

void snug_model_put_range(snug_model *m, size_t offset, const float *host, size_t n) {
    snug_backend *be = m->be;
    if (m->param_sharded) { /* ZeRO-3: only the shard's part of the range is kept (and, 16-bit, its master) */
        size_t a = offset > m->pshard_lo ? offset : m->pshard_lo;
        size_t b = offset + n < m->pshard_lo + m->pshard_n ? offset + n : m->pshard_lo + m->pshard_n;
        if (b <= a)
            return;
        host += a - offset;
        n = b - a;
        offset = a;
        if (!is16(m) && m->lv.offload_params) { /* host memory */
            memcpy(m->params + (a - m->pshard_lo), host, n * sizeof *host);
            return;
        }
        if (!is16(m)) {
            be->to_device(be, m->params + (a - m->pshard_lo), host, n * sizeof *host);
            return;
        }
        if (m->lv.offload_params) { /* host memory, rounded there as the backend's to16 rounds (to nearest even) */
            uint16_t *d = m->params16 + (a - m->pshard_lo);
            for (size_t k = 0; k < n; k++)
                d[k] = m->lv.dt == SNUG_DT_BF16 ? snug_f32_to_bf16(host[k]) : snug_f32_to_f16(host[k]);
            m->wl_layer = -1;
            return;
        }
    }
    if (m->params && m->master_sharded) { /* the shard's part of the range */
        size_t a = offset > m->master_lo ? offset : m->master_lo;
        size_t b = offset + n < m->master_lo + m->master_n ? offset + n : m->master_lo + m->master_n;
        if (b > a)
            be->to_device(be, m->params + (a - m->master_lo), host + (a - offset), (b - a) * sizeof *host);
    } else if (m->params) {
        be->to_device(be, m->params + offset, host, n * sizeof *host);
    }
    if (!is16(m))
        return;
    /* 16-bit: round through the layer workspace, a layer's worth at a time */
    size_t piece;
    float *buf = staging(m, &piece);
    for (size_t o = 0; o < n; o += piece) {
        size_t k = n - o < piece ? n - o : piece;
        be->to_device(be, buf, host + o, k * sizeof *host);
        be->to16(be, m->params16 + (offset - (m->param_sharded ? m->pshard_lo : 0)) + o, buf, k, m->lv.dt, 0);
    }
    m->wl_layer = -1;
}

void snug_model_put_params(snug_model *m, const float *host) {
    if (!m->packed) {
        snug_model_put_range(m, 0, host, m->table.total);
        return;
    }
    for (int i = 0; i < m->table.n; i++)
        snug_model_put_entry(m, i, host + m->table.e[i].offset, NULL);
}

int snug_model_put_entry(snug_model *m, int i, const float *host, snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    if (!snug_model_entry_q4(m, i)) {
        if (!m->packed) {
            snug_model_put_range(m, p->offset, host, p->numel);
            return 0;
        }
        /* packed dense tensors: rounded to 16 bits at their place */
        snug_backend *be = m->be;
        size_t piece;
        float *buf = staging(m, &piece);
        for (size_t o = 0; o < p->numel; o += piece) {
            size_t k = p->numel - o < piece ? p->numel - o : piece;
            be->to_device(be, buf, host + o, k * sizeof *host);
            be->to16(be, model_stored16(m, i) + o, buf, k, m->lv.dt, 0);
        }
        m->wl_layer = -1;
        return 0;
    }
    /* quantized on the host (bitsandbytes' arithmetic), then copied to where the model keeps it */
    snug_q4_tensor q = m->q4[i];
    size_t bytes = snug_q4_bytes(q.type, q.n, q.blocksize, q.nested);
    void *buf = m->be->host_resident && !m->q4_sharded ? m->q4_block[i] : malloc(bytes);
    if (!buf)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory quantizing %s", p->name);
    snug_q4_carve(&q, buf);
    int rc = snug_q4_quantize(&q, host, SNUG_DT_F32, e);
    if (!rc)
        snug_model_put_q4(m, i, buf, q.nested_offset);
    if (buf != m->q4_block[i])
        free(buf);
    return rc;
}

void snug_model_put_q4(snug_model *m, int i, const void *buf, float nested_offset) {
    const snug_q4_tensor *q = &m->q4[i];
    size_t bytes = snug_q4_bytes(q->type, q->n, q->blocksize, q->nested);
    if (!m->q4_sharded) {
        if (buf != m->q4_block[i])
            m->be->to_device(m->be, m->q4_block[i], buf, bytes);
    } else { /* the part of its layer's span that is this rank's piece */
        int l = m->table.e[i].layer;
        size_t P = m->q4_piece[l], lo = (size_t)m->q4_part * P, at = m->q4_rel[i];
        size_t a = at > lo ? at : lo, b = at + bytes < lo + P ? at + bytes : lo + P;
        char *dst = m->q4_shard + m->q4_soff[l] + (a - lo);
        if (b > a && m->lv.offload_params) /* host memory */
            memcpy(dst, (const char *)buf + (a - at), b - a);
        else if (b > a)
            m->be->to_device(m->be, dst, (const char *)buf + (a - at), b - a);
        for (int k = 0; k < 2; k++) /* gathered again before it is read */
            m->q4pair.layer[k] = m->q4pair.layer[k] == l ? -1 : m->q4pair.layer[k];
    }
    m->q4[i].nested_offset = nested_offset;
    m->wl_layer = -1;
}

void snug_model_get_params(const snug_model *m, float *host) {
    snug_backend *be = m->be;
    size_t P = m->table.total;
    if (m->params && !m->master_sharded) { /* fp32 parameters, or the master copy (a shard: the 16-bit copy) */
        be->to_host(be, host, m->params, P * sizeof *host);
        return;
    }
    size_t piece;
    float *buf = staging(m, &piece);
    if (m->packed) { /* each tensor as forward sees it, QLoRA's 4-bit ones dequantized chunk by chunk */
        for (int i = 0; i < m->table.n; i++) {
            const snug_param_entry *p = &m->table.e[i];
            if (snug_model_entry_q4(m, i)) {
                model_q4_local(m, p->layer);
                size_t R = (size_t)m->q4[i].shape[0], cols = (size_t)m->q4[i].shape[1];
                size_t cr = (size_t)m->q4_site[i].chunk_rows;
                for (size_t r = 0; r < R; r += cr) {
                    size_t nr = R - r < cr ? R - r : cr;
                    model_dequant_rows(m, i, r, nr, m->wq);
                    be->to_host(be, host + p->offset + r * cols, m->wq, nr * cols * sizeof *host);
                }
                continue;
            }
            for (size_t o = 0; o < p->numel; o += piece) {
                size_t k = p->numel - o < piece ? p->numel - o : piece;
                be->from16(be, buf, model_stored16(m, i) + o, k, m->lv.dt);
                be->to_host(be, host + p->offset + o, buf, k * sizeof *host);
            }
        }
        ((snug_model *)m)->wl_layer = -1;
        return;
    }
    for (size_t o = 0; o < P; o += piece) {
        size_t k = P - o < piece ? P - o : piece;
        be->from16(be, buf, m->params16 + o, k, m->lv.dt);
        be->to_host(be, host + o, buf, k * sizeof *host);
    }
    ((snug_model *)m)->wl_layer = -1;
}
