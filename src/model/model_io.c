/* model_io.c: moving weights between the flat parameter buffer and Hugging Face safetensors files.
 *
 * Loading checks every tensor the config implies: present, floating-point, the expected shape, no NaN/Inf. GPT-2
 * files come with or without the "transformer." prefix; tied heads are read from the embedding. Saving writes the
 * names and layouts transformers expects (Conv1D weights transposed back for GPT-2, no lm_head when tied). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/safetensors.h"

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
    int shape_ok = t->ndim == p->ndim && t->shape[0] == p->shape[0] && (p->ndim == 1 || t->shape[1] == p->shape[1]);
    if (!shape_ok || (size_t)numel != p->numel) {
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

int snug_model_check_weights(const snug_param_table *table, const char *dir, snug_error *e) {
    snug_st_set s;
    memset(&s, 0, sizeof s);
    SNUG_TRY(snug_st_open_dir(&s, dir, e));
    int rc = 0;
    for (int i = 0; i < table->n && !rc; i++) {
        const snug_st_tensor *t;
        rc = match_tensor(&s, dir, &table->e[i], &t, e);
    }
    snug_st_close(&s);
    return rc;
}

int snug_model_load_weights(snug_model *m, const char *dir, snug_error *e) {
    snug_st_set s;
    memset(&s, 0, sizeof s);
    SNUG_TRY(snug_st_open_dir(&s, dir, e));
    /* a backend whose memory is host memory receives each tensor in place; others get it through a staging
     * buffer the size of the largest tensor */
    float *direct = snug_model_host_params(m);
    size_t largest = 0;
    for (int i = 0; i < m->table.n; i++)
        largest = m->table.e[i].numel > largest ? m->table.e[i].numel : largest;
    float *stage = direct ? NULL : malloc(largest * sizeof *stage);
    if (!direct && !stage) {
        snug_st_close(&s);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory staging the weights of %s", dir);
    }
    int rc = 0;
    for (int i = 0; i < m->table.n && !rc; i++) {
        const snug_param_entry *p = &m->table.e[i];
        const snug_st_tensor *t = NULL;
        rc = match_tensor(&s, dir, p, &t, e);
        if (rc)
            break;
        float *dst = direct ? direct + p->offset : stage;
        rc = snug_st_to_f32(&s, t, dst, p->transposed, e);
        if (!rc && !direct)
            snug_model_put_range(m, p->offset, stage, p->numel);
        snug_st_release(&s, t);
    }
    free(stage);
    snug_st_close(&s);
    return rc;
}

int snug_model_save_weights_host(const snug_model *m, const char *dir, const float *p32, const uint16_t *p16,
                                 snug_error *e) {
    snug_st_out *out = calloc((size_t)m->table.n, sizeof *out);
    if (!out)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory saving the weights to %s", dir);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        out[i] = (snug_st_out){.name = p->name, .dtype = SNUG_DT_F32, .ndim = p->ndim, .transpose2d = p->transposed};
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
    int rc = snug_st_write(path, out, m->table.n, e);
    free(out);
    return rc;
}

int snug_model_save_weights(const snug_model *m, const char *dir, snug_error *e) {
    /* host memory is written in place: fp32 parameters or the master copy as F32, or 16-bit parameters without a
     * master as they are (BF16/F16); a device's parameters come through one fp32 host copy */
    if (m->be->host_resident)
        return snug_model_save_weights_host(m, dir, m->params, m->params ? NULL : m->params16, e);
    float *host = malloc(m->table.total * sizeof *host);
    if (!host)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory saving the weights to %s", dir);
    snug_model_get_params(m, host);
    int rc = snug_model_save_weights_host(m, dir, host, NULL, e);
    free(host);
    return rc;
}
