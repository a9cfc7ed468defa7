/* model_io.c: moving weights between the flat parameter buffer and Hugging Face safetensors files.
 *
 * Loading checks every tensor the config implies: present, floating-point, the expected shape, no NaN/Inf. GPT-2
 * files come with or without the "transformer." prefix; tied heads are read from the embedding. Saving writes the
 * names and layouts transformers expects (Conv1D weights transposed back for GPT-2, no lm_head when tied). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/safetensors.h"
#include "core/dtype.h"
#include "core/rng.h"

static const snug_st_tensor *find_tensor(const snug_st_set *s, const char *name) {
    const snug_st_tensor *t = snug_st_find(s, name);
    if (!t && strncmp(name, "transformer.", 12) == 0)
        t = snug_st_find(s, name + 12);
    return t;
}

/* The file's tensor for table entry p, checked: present, and the shape config.json implies. */
static int match_tensor(const snug_st_set *s, const char *dir, const snug_param_entry *p, const snug_st_tensor **out,
                        snug_error *e) {
    const snug_st_tensor *t = find_tensor(s, p->name);
    if (!t)
        return snug_fail(e, SNUG_EINPUT,
                         "%s: tensor '%s' is missing; the weights do not match config.json (check model_type, "
                         "num_hidden_layers and tie_word_embeddings)",
                         dir, p->name);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++)
        numel *= t->shape[d];
    int grown = p->rows_base && t->ndim == 2 && t->shape[0] == p->rows_base && t->shape[1] == p->shape[1];
    int shape_ok = t->ndim == p->ndim && t->shape[0] == p->shape[0] && (p->ndim == 1 || t->shape[1] == p->shape[1]);
    if (!grown && (!shape_ok || (size_t)numel != p->numel)) {
        char got[128] = "", want[64];
        for (int d = 0; d < t->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        if (p->ndim == 2)
            snprintf(want, sizeof want, "%lld, %lld", (long long)p->shape[0], (long long)p->shape[1]);
        else
            snprintf(want, sizeof want, "%lld", (long long)p->shape[0]);
        return snug_fail(e, SNUG_EINPUT, "%s: tensor '%s' has shape [%s] but config.json implies [%s]; the weights "
                         "and config.json are from different models",
                         s->paths[t->file], p->name, got, want);
    }
    if (t->dtype != SNUG_DT_F32 && t->dtype != SNUG_DT_BF16 && t->dtype != SNUG_DT_F16 && t->dtype != SNUG_DT_F64)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor '%s' is %s; snug reads F32, BF16 and F16 weights (dequantize or "
                         "convert the checkpoint first)", s->paths[t->file], p->name, snug_dtype_name(t->dtype));
    *out = t;
    return 0;
}

/* A bitsandbytes 4-bit tensor for entry p: its parts checked, and the unpacked shape the table needs. */
static int match_q4(const snug_st_set *s, const char *dir, const snug_param_entry *p, snug_q4_tensor *q,
                    snug_error *e) {
    SNUG_TRY(snug_q4_st_view(s, p->name, q, e));
    int64_t rows = p->transposed ? p->shape[1] : p->shape[0], cols = p->transposed ? p->shape[0] : p->shape[1];
    if (q->shape[0] != rows || q->shape[1] != cols)
        return snug_fail(e, SNUG_EINPUT, "%s: 4-bit tensor '%s' has shape [%lld, %lld] but config.json implies "
                         "[%lld, %lld]; the weights and config.json are from different models", dir, p->name,
                         (long long)q->shape[0], (long long)q->shape[1], (long long)rows, (long long)cols);
    return 0;
}

int snug_model_check_weights(const snug_param_table *table, const char *dir, snug_error *e) {
    snug_st_set s;
    memset(&s, 0, sizeof s);
    SNUG_TRY(snug_st_open_dir(&s, dir, e));
    int rc = 0;
    for (int i = 0; i < table->n && !rc; i++) {
        const snug_st_tensor *t;
        snug_q4_tensor q;
        if (snug_q4_st_detect(&s, table->e[i].name)) /* a pre-quantized bitsandbytes checkpoint */
            rc = match_q4(&s, dir, &table->e[i], &q, e);
        else
            rc = match_tensor(&s, dir, &table->e[i], &t, e);
    }
    snug_st_close(&s);
    return rc;
}

static double uniform01(uint64_t *s) { return ((snug_splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* The rows [V0, V) of w (V, C) that added tokens grew, as transformers' resize_token_embeddings starts them, in the
 * file's dtype dt: the mean of the rows [0, V0) (mean_resizing; transformers adds a draw of a normal with 1e-9 times
 * the rows' covariance, a spread of about 3e-5 of theirs, and takes the mean alone when that covariance is not
 * positive definite: snug always takes the mean alone), else normal(0, initializer_range) (its _init_weights), drawn
 * by Box-Muller from the stream of vocab_seed and the entry's index. */
static void init_grown_rows(const snug_model_config *c, int index, float *w, size_t V0, size_t V, size_t C,
                            snug_dtype dt) {
    if (c->vocab_mean) {
        for (size_t j = 0; j < C; j++) {
            double sum = 0;
            for (size_t r = 0; r < V0; r++)
                sum += w[r * C + j];
            w[V0 * C + j] = (float)(sum / (double)V0);
        }
        for (size_t r = V0 + 1; r < V; r++)
            memcpy(w + r * C, w + V0 * C, C * sizeof *w);
    } else {
        uint64_t s = c->vocab_seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(index + 1));
        for (size_t k = V0 * C; k < V * C; k += 2) {
            double u1 = uniform01(&s), u2 = uniform01(&s), rad = sqrt(-2.0 * log(u1)) * c->initializer_range;
            w[k] = (float)(rad * cos(2.0 * M_PI * u2));
            if (k + 1 < V * C)
                w[k + 1] = (float)(rad * sin(2.0 * M_PI * u2));
        }
    }
    for (size_t k = V0 * C; k < V * C && dt != SNUG_DT_F32; k++) /* (as the file's dtype holds them) */
        w[k] = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(snug_f32_to_bf16(w[k])) : dt == SNUG_DT_F16 ?
               snug_f16_to_f32(snug_f32_to_f16(w[k])) : w[k];
}

/* Entry i, an embedding or head that added tokens grew, from the file's tensor t of its old rows: those, then the
 * new rows (init_grown_rows), put in place whole. */
static int load_grown(snug_model *m, snug_st_set *s, const snug_st_tensor *t, int i, snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    float *w = malloc(p->numel * sizeof *w);
    if (!w)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory growing '%s' for the added tokens", p->name);
    int rc = snug_st_to_f32(s, t, w, 0, e);
    if (!rc) {
        init_grown_rows(&m->cfg, i, w, (size_t)p->rows_base, (size_t)p->shape[0], (size_t)p->shape[1], t->dtype);
        rc = snug_model_put_entry(m, i, w, e);
    }
    free(w);
    return rc;
}

static void host_copy(snug_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    memcpy(dst, src, n);
}

/* Entry i from a bitsandbytes 4-bit tensor of the file: copied part by part into the model's 4-bit tensor, which
 * must have been laid out alike (type, block size, double quantization: setup reads them from the checkpoint). */
static int load_q4(snug_model *m, const snug_st_set *s, const char *dir, int i, snug_error *e) {
    const snug_param_entry *p = &m->table.e[i];
    snug_q4_tensor f;
    SNUG_TRY(match_q4(s, dir, p, &f, e));
    if (!snug_model_entry_q4(m, i) && f.type == SNUG_Q4_INT8)
        return snug_fail(e, SNUG_EINPUT, "%s: '%s' is stored 8-bit (a bitsandbytes LLM.int8 checkpoint); train it "
                         "with adapter: lora and load_in_8bit: true", dir, p->name);
    if (!snug_model_entry_q4(m, i))
        return snug_fail(e, SNUG_EINPUT, "%s: '%s' is stored 4-bit (a bitsandbytes checkpoint); train it with "
                         "adapter: qlora", dir, p->name);
    const snug_q4_tensor *q = &m->q4[i];
    if ((f.type == SNUG_Q4_INT8) != (q->type == SNUG_Q4_INT8))
        return snug_fail(e, SNUG_EINPUT, "%s: '%s' is stored %s, the run is set to %s; set %s", dir, p->name,
                         f.type == SNUG_Q4_INT8 ? "8-bit" : "4-bit", q->type == SNUG_Q4_INT8 ? "8 bits" : "4 bits",
                         f.type == SNUG_Q4_INT8 ? "load_in_8bit: true and adapter: lora" : "adapter: qlora");
    if (f.type != q->type || f.blocksize != q->blocksize || f.nested != q->nested)
        return snug_fail(e, SNUG_EINPUT, "%s: '%s' is %s with blocks of %d%s, the run is set to %s with blocks of %d%s; "
                         "set bnb_4bit_quant_type and bnb_4bit_use_double_quant as the checkpoint has them", dir,
                         p->name, snug_q4_type_name(f.type), f.blocksize, f.nested ? ", double-quantized" : "",
                         snug_q4_type_name(q->type), q->blocksize, q->nested ? ", double-quantized" : "");
    snug_q4_sizes z = snug_q4_sizes_of(q->type, q->n, q->blocksize, q->nested);
    snug_backend *be = m->be;
    snug_q4_tensor d = *q; /* where its parts go: the model's tensor, or (sharded) one host copy of it whole */
    void *whole = m->q4_sharded ? malloc(z.total) : NULL;
    if (m->q4_sharded && !whole)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory loading %s", p->name);
    if (whole)
        snug_q4_carve(&d, whole);
    void (*put)(snug_backend *, void *, const void *, size_t) = whole ? host_copy : be->to_device;
    put(be, d.packed, f.packed, z.packed);
    if (q->nested) {
        put(be, d.absmax_q, f.absmax_q, z.absmax);
        put(be, d.nested_absmax, f.nested_absmax, z.nested_absmax);
        put(be, d.nested_quant_map, f.nested_quant_map, z.nested_quant_map);
    } else {
        put(be, d.absmax, f.absmax, z.absmax);
    }
    if (whole)
        snug_model_put_q4(m, i, whole, f.nested_offset);
    free(whole);
    m->q4[i].nested_offset = f.nested_offset;
    m->wl_layer = -1;
    return 0;
}

/* Tensor parallelism: each tensor checked against the whole model's table and only the rank's slice read from the
 * file (a block of rows is one range of it, or one per part of a fused tensor; a run of columns one range per row),
 * into one buffer of the rank's largest tensor, then put in place. A tensor the file holds transposed (GPT-2's
 * Conv1D) is read whole, transposed, and sliced. */
static int load_tp(snug_model *m, snug_st_set *s, const char *dir, snug_error *e) {
    snug_param_table g;
    SNUG_TRY(snug_param_table_build(&g, &m->tp_cfg, e));
    size_t largest = 0, largest_t = 0;
    for (int i = 0; i < m->table.n; i++)
        largest = m->table.e[i].numel > largest ? m->table.e[i].numel : largest;
    for (int i = 0; i < g.n; i++)
        largest_t = g.e[i].transposed && g.e[i].numel > largest_t ? g.e[i].numel : largest_t;
    float *part = malloc(largest * sizeof *part), *whole = largest_t ? malloc(largest_t * sizeof *whole) : NULL;
    int rc = part && (whole || !largest_t) && g.n == m->table.n
                 ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory staging the weights of %s", dir);
    for (int i = 0; i < g.n && !rc; i++) {
        const snug_param_entry *G = &g.e[i], *L = &m->table.e[i];
        const snug_st_tensor *t = NULL;
        if (snug_q4_st_detect(s, G->name)) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: '%s' is 4-bit (bitsandbytes); tensor parallelism trains 16- and "
                           "32-bit weights: use the unquantized model", dir, G->name);
            break;
        }
        if ((rc = match_tensor(s, dir, G, &t, e)))
            break;
        int kind = snug_tp_slice_kind(G, L), segs = L->segs > 1 ? L->segs : 1;
        size_t rows = (size_t)L->shape[0], cols = L->ndim == 2 ? (size_t)L->shape[1] : 1, lseg = rows / (size_t)segs;
        if (G->transposed && kind) { /* the file's columns are the table's rows */
            if (!(rc = snug_st_to_f32(s, t, whole, 1, e)))
                snug_tp_slice(G, L, m->tp_rank, whole, part, 0);
        } else if (kind == 0) {
            rc = snug_st_to_f32(s, t, part, G->transposed, e);
        }
        for (int k = 0; !G->transposed && kind == 1 && k < segs && !rc; k++) /* the rank's block of each part */
            rc = snug_st_to_f32_range(s, t, part + (size_t)k * lseg * cols,
                                      ((size_t)k * (size_t)G->shape[0] / (size_t)segs + (size_t)m->tp_rank * lseg) *
                                          cols, lseg * cols, e);
        for (size_t r = 0; !G->transposed && kind == 2 && r < rows && !rc; r++) /* each row's run of columns */
            rc = snug_st_to_f32_range(s, t, part + r * cols, r * (size_t)G->shape[1] + (size_t)m->tp_rank * cols,
                                      cols, e);
        snug_st_release(s, t);
        if (!rc)
            rc = snug_model_put_entry(m, i, part, e);
    }
    free(part);
    free(whole);
    snug_param_table_free(&g);
    return rc;
}

int snug_model_load_weights(snug_model *m, const char *dir, snug_error *e) {
    snug_st_set s;
    memset(&s, 0, sizeof s);
    SNUG_TRY(snug_st_open_dir(&s, dir, e));
    if (m->tp > 1) {
        int rc = load_tp(m, &s, dir, e);
        snug_st_close(&s);
        return rc;
    }
    /* a backend whose memory is host memory receives each tensor in place; others get it through a staging
     * buffer the size of the largest tensor */
    float *direct = snug_model_host_params(m);
    size_t largest = 0;
    for (int i = 0; i < m->table.n; i++)
        largest = m->table.e[i].numel > largest ? m->table.e[i].numel : largest;
    float *scratch = direct ? NULL : snug_model_host_scratch(m, largest); /* ZeRO-3: the gather region */
    size_t piece = largest;
    if (!direct && !scratch && m->param_sharded && m->be->host_resident) {
        /* ZeRO-3 with a region smaller than the largest tensor (the embedding, when no layer holds it): such a
         * tensor goes through the region in pieces, each keeping only this rank's part */
        piece = m->gregion_n * snug_dtype_size(m->lv.dt) / sizeof(float);
        scratch = piece ? snug_model_host_scratch(m, piece) : NULL;
        piece = scratch ? piece : largest;
    }
    float *stage = direct || scratch ? scratch : malloc(largest * sizeof *stage);
    if (!direct && !stage) {
        snug_st_close(&s);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory staging the weights of %s", dir);
    }
    int rc = 0;
    for (int i = 0; i < m->table.n && !rc; i++) {
        const snug_param_entry *p = &m->table.e[i];
        const snug_st_tensor *t = NULL;
        if (snug_q4_st_detect(&s, p->name)) { /* already 4-bit: its bytes, never a 16-bit copy */
            rc = load_q4(m, &s, dir, i, e);
            continue;
        }
        rc = match_tensor(&s, dir, p, &t, e);
        if (rc)
            break;
        if (p->rows_base && t->shape[0] == p->rows_base) { /* the base's rows of a vocabulary tokens were added to */
            rc = load_grown(m, &s, t, i, e);
            snug_st_release(&s, t);
            continue;
        }
        if (!direct && p->numel > piece) { /* in pieces (ZeRO-3 above; piece < largest only there) */
            if (p->transposed || m->packed || snug_model_entry_q4(m, i)) { /* not by pieces: a copy of its own */
                float *whole = malloc(p->numel * sizeof *whole);
                rc = whole ? snug_st_to_f32(&s, t, whole, p->transposed, e)
                           : snug_fail(e, SNUG_ENOMEM, "out of host memory staging '%s' of %s", p->name, dir);
                if (!rc)
                    rc = snug_model_put_entry(m, i, whole, e);
                free(whole);
                snug_st_release(&s, t);
                continue;
            }
            for (size_t o = 0; !rc && o < p->numel; o += piece) {
                size_t k = p->numel - o < piece ? p->numel - o : piece;
                if (!(rc = snug_st_to_f32_range(&s, t, stage, o, k, e)))
                    snug_model_put_range(m, p->offset + o, stage, k);
            }
            snug_st_release(&s, t);
            continue;
        }
        float *dst = direct ? direct + p->offset : stage;
        rc = snug_st_to_f32(&s, t, dst, p->transposed, e);
        if (!rc && !direct)
            rc = snug_model_put_entry(m, i, stage, e);
        snug_st_release(&s, t);
    }
    if (stage != scratch)
        free(stage);
    snug_st_close(&s);
    return rc;
}

int snug_model_save_weights_host(const snug_model *m, const char *dir, const float *p32, const uint16_t *p16,
                                 const snug_write_opts *opts, snug_error *e) {
    snug_st_out *out = calloc((size_t)m->table.n, sizeof *out);
    if (!out)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory saving the weights to %s", dir);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        out[i] = (snug_st_out){.name = p->name, .dtype = m->file_dt, .ndim = p->ndim, .transpose2d = p->transposed};
        if (!p32) {
            out[i].dtype = out[i].h16_dtype = m->lv.dt;
            out[i].h16 = p16 + p->offset;
        } else {
            out[i].f32 = p32 + p->offset;
        }
        out[i].shape[0] = p->shape[0];
        out[i].shape[1] = p->shape[1];
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = snug_st_write(path, out, m->table.n, opts, e);
    free(out);
    return rc;
}

/* The table of the whole model a streamed file holds: the model's own, or under tensor or pipeline parallelism the
 * whole model's (built into *own, to be freed). */
static const snug_param_table *whole_table(const snug_model *m, snug_param_table *own, snug_error *e) {
    memset(own, 0, sizeof *own);
    if (m->tp <= 1 && m->pp <= 1)
        return &m->table;
    return snug_param_table_build(own, &m->tp_cfg, e) ? NULL : own;
}

/* The streamed file's tensors: every tensor of table t F32 (16-bit without an fp32 copy), fetched by fill. */
static snug_st_out *stream_outs(const snug_model *m, const snug_param_table *t, snug_weights_fill fill, void *ud) {
    snug_st_out *out = calloc((size_t)t->n, sizeof *out);
    snug_dtype dt = m->lv.dt != SNUG_DT_F32 && !m->params ? m->lv.dt : m->file_dt;
    for (int i = 0; out && i < t->n; i++) {
        const snug_param_entry *p = &t->e[i];
        out[i] = (snug_st_out){.name = p->name, .dtype = dt, .ndim = p->ndim, .transpose2d = p->transposed,
                               .shape = {p->shape[0], p->shape[1]}, .fill = fill, .fill_ud = ud, .fill_tag = i};
    }
    return out;
}

int snug_model_save_weights_stream(const snug_model *m, const char *dir, snug_weights_fill fill, void *ud,
                                   const snug_write_opts *opts, snug_error *e) {
    snug_param_table own;
    const snug_param_table *t = whole_table(m, &own, e);
    if (!t)
        return e ? e->code : SNUG_ENOMEM;
    snug_st_out *out = stream_outs(m, t, fill, ud);
    int rc = out ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory saving the weights to %s", dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!rc)
        rc = snug_st_write(path, out, t->n, opts, e);
    free(out);
    snug_param_table_free(&own);
    return rc;
}

int snug_model_weights_order(const snug_model *m, int *order, snug_error *e) {
    snug_param_table own;
    const snug_param_table *t = whole_table(m, &own, e);
    if (!t)
        return e ? e->code : SNUG_ENOMEM;
    snug_st_out *out = stream_outs(m, t, NULL, NULL);
    for (int i = 0; out && i < t->n; i++)
        out[i].f32 = (const float *)out; /* any source: only the names, dtypes and shapes set the order */
    int rc = out ? snug_st_write_order(out, t->n, order, e)
                 : snug_fail(e, SNUG_ENOMEM, "out of host memory ordering the weights");
    free(out);
    snug_param_table_free(&own);
    return rc;
}

int snug_model_save_weights(const snug_model *m, const char *dir, const snug_write_opts *opts, snug_error *e) {
    /* host memory is written in place: fp32 parameters or the master copy as F32, or 16-bit parameters without a
     * master as they are (BF16/F16); a device's parameters come through one fp32 host copy. A rank's shard of the
     * master copy is not the weights: then the 16-bit copy (ZeRO's final save streams the master instead). */
    const float *p32 = m->master_sharded ? NULL : m->params;
    if (m->be->host_resident && !m->packed)
        return snug_model_save_weights_host(m, dir, p32, p32 ? NULL : m->params16, opts, e);
    float *host = malloc(m->table.total * sizeof *host);
    if (!host)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory saving the weights to %s", dir);
    snug_model_get_params(m, host);
    int rc = snug_model_save_weights_host(m, dir, host, NULL, opts, e);
    free(host);
    return rc;
}

int snug_lora_saved_from_file(snug_model *m, const char *dir, snug_error *e) {
    snug_lora *lo = &m->lora;
    if (!lo->on || !m->param_sharded || (lo->emb_off == (size_t)-1 && lo->head_off == (size_t)-1))
        return 0;
    snug_st_set s;
    SNUG_TRY(snug_st_open_dir(&s, dir, e));
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        size_t off = k ? lo->head_off : lo->emb_off;
        int i = snug_lora_saved_entry(m, k ? SNUG_SAVE_HEAD : SNUG_SAVE_EMBED);
        if (off == (size_t)-1 || i < 0)
            continue;
        const snug_param_entry *p = &m->table.e[i];
        const snug_st_tensor *t;
        float *host = NULL;
        rc = match_tensor(&s, dir, p, &t, e);
        if (!rc && !(host = malloc(p->numel * sizeof *host)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory for %s", p->name);
        if (!rc)
            rc = snug_st_to_f32(&s, t, host, p->transposed, e);
        for (size_t j = 0; !rc && m->lv.dt != SNUG_DT_F32 && j < p->numel; j++) /* as the base stores it */
            host[j] = m->lv.dt == SNUG_DT_BF16 ? snug_bf16_to_f32(snug_f32_to_bf16(host[j]))
                                                : snug_f16_to_f32(snug_f32_to_f16(host[j]));
        if (!rc)
            m->be->to_device(m->be, lo->params + off, host, p->numel * sizeof *host);
        free(host);
    }
    snug_st_close(&s);
    return rc;
}
