/* storage.c: where each tensor is stored (snug_model.soff, q4): at its table offset, or under QLoRA and
 * offload_embedding the 4-bit matrices apart (their sites, chunks and ZeRO-3 spans) and the dense tensors packed;
 * the sizes of a layer the workspaces are laid out by. */
#include "model/model_impl.h"

size_t model_largest_layer(const snug_model *m) {
    size_t mx = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        mx = m->table.layer_numel[l] > mx ? m->table.layer_numel[l] : mx;
    return mx;
}

/* The dense tensors of layer l (under QLoRA its norms and biases), contiguous in params16 (the 4-bit matrices
 * between them take no place there): where they start and how many elements they are. */
size_t model_dense_layer(const snug_model *m, int l, size_t *start) {
    size_t n = 0;
    *start = 0;
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer == l && !(m->q4 && m->q4[i].n)) {
            if (!n)
                *start = m->soff[i];
            n += m->table.e[i].numel;
        }
    return n;
}

/* QLoRA's layer views: the dense tensors at their place in wl; the 4-bit matrices have none (NULL). */
void model_dense_layer_views(const snug_model *m, float *base, snug_layer_tensors *L) {
    snug_tensors unused;
    size_t start;
    model_dense_layer(m, 0, &start);
    memset(L, 0, sizeof *L);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        float **s = p->layer == 0 && !(m->q4 && m->q4[i].n) ? model_slot_of(p->name, &unused, L) : NULL;
        if (s)
            *s = base + (m->soff[i] - start);
    }
}

size_t model_largest_dense_layer(const snug_model *m) {
    size_t mx = 0, start;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        size_t n = model_dense_layer(m, l, &start);
        mx = n > mx ? n : mx;
    }
    return mx;
}

int model_layer_has_bias(const snug_model *m) {
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer >= 0 && m->table.e[i].ndim == 1 && ends_with(m->table.e[i].name, "bias"))
            return 1;
    return 0;
}

/* The elements of one chunk of a 4-bit matrix at most, unless lv.lora.q4_chunk says otherwise (64 MiB in fp32): a
 * matrix larger than this runs in row chunks, so QLoRA's dequantized weights take this much workspace instead of a
 * whole layer's. */
#define Q4_CHUNK ((size_t)1 << 24)

size_t model_gcd_size(size_t a, size_t b) {
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Which module of its block 4-bit matrix i is (its site and rows there), and its rows per chunk: the whole matrix,
 * or a multiple of the rows that make a chunk start on a quantization block (and, double-quantized, on a block of
 * 256 scales), so that a chunk is dequantized from its own slice of the packed codes and scales. */
static int q4_place(snug_model *m, int i, snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    const snug_q4_tensor *q = &m->q4[i];
    int n = snug_lora_module_count(m->cfg.arch);
    for (int k = 0; k < n; k++) {
        char suffix[128];
        snprintf(suffix, sizeof suffix, ".%s.weight", snug_lora_module_name(m->cfg.arch, k));
        if (!ends_with(p->name, suffix))
            continue;
        int row0, rows, in;
        snug_lora_module_shape(&m->cfg, k, &row0, &rows, &in);
        size_t R = (size_t)q->shape[0], cols = (size_t)q->shape[1];
        size_t unit = (size_t)q->blocksize * (q->nested ? (size_t)q->nested_blocksize : 1);
        size_t most = m->lv.lora.q4_chunk ? m->lv.lora.q4_chunk : Q4_CHUNK;
        size_t quantum = unit / model_gcd_size(cols, unit), cr = most / cols / quantum * quantum;
        cr = q->n <= most ? R : cr < quantum ? quantum : cr;
        m->q4_site[i].site = (int)snug_lora_module_site(m->cfg.arch, k);
        m->q4_site[i].row0 = row0;
        m->q4_site[i].chunk_rows = (int)(cr < R ? cr : R);
        return 0;
    }
    return snug_fail(e, SNUG_EINPUT, "%s: a matrix of the block that is no linear layer snug knows; it cannot be "
                                      "stored in 4 bits", p->name);
}

/* QLoRA at ZeRO-3: where each 4-bit matrix is in its layer's span (q4_rel), each layer's piece per rank (q4_piece:
 * the span rounded up to q4_parts x 64 bytes, over q4_parts) and where the rank keeps it (q4_soff), and the sizes of the
 * shard and of a gather buffer (see snug_model.q4_sharded). */
static int q4_spans(snug_model *m, snug_error *e) {
    const snug_param_table *t = &m->table;
    int L = m->cfg.n_layer;
    size_t R = (size_t)(m->q4_parts > 1 ? m->q4_parts : 1);
    m->q4_rel = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4_rel);
    m->q4_piece = calloc((size_t)(L ? L : 1), sizeof *m->q4_piece);
    m->q4_soff = calloc((size_t)(L ? L : 1), sizeof *m->q4_soff);
    if (!m->q4_rel || !m->q4_piece || !m->q4_soff)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the parameter layout");
    m->q4_shard_n = m->q4_gbuf_n = 0;
    for (int l = 0; l < L; l++) {
        size_t span = 0;
        for (int i = 0; i < t->n; i++)
            if (t->e[i].layer == l && m->q4[i].n) {
                m->q4_rel[i] = span;
                span += (snug_q4_bytes(m->q4[i].type, m->q4[i].n, m->q4[i].blocksize, m->q4[i].nested) + 63) / 64 * 64;
            }
        m->q4_piece[l] = (span + 64 * R - 1) / (64 * R) * 64;
        m->q4_soff[l] = m->q4_shard_n;
        m->q4_shard_n += m->q4_piece[l];
        m->q4_gbuf_n = R * m->q4_piece[l] > m->q4_gbuf_n ? R * m->q4_piece[l] : m->q4_gbuf_n;
    }
    return 0;
}

void model_q4_spans_free(snug_model *m) {
    free(m->q4_rel);
    free(m->q4_piece);
    free(m->q4_soff);
    m->q4_rel = m->q4_piece = m->q4_soff = NULL;
}

/* Where each tensor is stored (snug_model.soff, q4): at its table offset, or under QLoRA the block matrices in 4 bits
 * (bitsandbytes' layout, one quantized tensor per Hugging Face weight) and the rest packed densely. */
int model_storage_layout(snug_model *m, snug_error *e) {
    const snug_param_table *t = &m->table;
    free(m->soff);
    free(m->q4);
    free(m->q4_block);
    free(m->q4_site);
    model_q4_spans_free(m);
    m->q4 = NULL;
    m->q4_block = NULL;
    m->q4_site = NULL;
    m->soff = malloc((size_t)(t->n ? t->n : 1) * sizeof *m->soff);
    int q = m->lv.lora.kind == SNUG_ADAPTER_QLORA;
    if (q && !is16(m))
        return snug_fail(e, SNUG_EINPUT, "QLoRA keeps the base's other tensors in 16 bits: set bf16: true (or fp16)");
    if (q) {
        m->q4 = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4);
        m->q4_block = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4_block);
        m->q4_site = calloc((size_t)(t->n ? t->n : 1), sizeof *m->q4_site);
    }
    if (!m->soff || (q && (!m->q4 || !m->q4_block || !m->q4_site)))
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the parameter layout");
    m->emb_entry = -1;
    if (m->lv.offload_embedding) {
        if (m->lv.lora.kind == SNUG_ADAPTER_NONE || !is16(m))
            return snug_fail(e, SNUG_EINPUT, "offload_embedding keeps a frozen 16-bit embedding in host memory: it "
                                             "needs an adapter (lora or qlora) and bf16 or fp16");
        if (m->cfg.tie_embeddings)
            return snug_fail(e, SNUG_EINPUT, "offload_embedding: this model ties its embedding to the output head, "
                                             "which reads the whole table every step; set offload_embedding: false");
        for (int i = 0; i < t->n; i++) {
            snug_tensors v;
            if (t->e[i].layer < 0 && model_slot_of(t->e[i].name, &v, NULL) == &v.wte)
                m->emb_entry = i;
        }
    }
    m->packed = q || m->emb_entry >= 0;
    size_t dense = 0;
    for (int i = 0; i < t->n; i++) {
        const snug_param_entry *p = &t->e[i];
        if (i == m->emb_entry) { /* in emb16, host memory */
            m->soff[i] = (size_t)-1;
            continue;
        }
        if (q && p->layer >= 0 && p->ndim == 2) {
            int64_t rows = p->transposed ? p->shape[1] : p->shape[0], cols = p->transposed ? p->shape[0] : p->shape[1];
            SNUG_TRY(snug_q4_init(&m->q4[i], (snug_q4_type)m->lv.lora.q4_type,
                                  m->lv.lora.q4_blocksize ? m->lv.lora.q4_blocksize : 64, m->lv.lora.q4_nested, rows,
                                  cols, m->lv.dt == SNUG_DT_F16 ? SNUG_DT_F16 : SNUG_DT_BF16, e));
            SNUG_TRY(q4_place(m, i, e));
            m->soff[i] = (size_t)-1;
            continue;
        }
        m->soff[i] = m->packed ? dense : p->offset;
        dense += p->numel;
    }
    m->dense_total = m->packed ? dense : t->total;
    return q && m->q4_sharded ? q4_spans(m, e) : 0;
}

/* Where dense tensor i is stored in 16 bits: its place in params16, or the host-resident embedding. */
uint16_t *model_stored16(const snug_model *m, int i) {
    return i == m->emb_entry ? m->emb16 : m->params16 + m->soff[i];
}
