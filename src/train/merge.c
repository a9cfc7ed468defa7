/* merge.c: merging a LoRA adapter into its base (see merge.h). */
#include "train/merge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/fileio.h"
#include "model/peft_io.h"
#include "train/engine.h"
#include "train/setup.h"

/* W (n fp32 values laid out [rows, cols]) replaced by its round trip through the base's 4 or 8 bits. */
static int round_trip(float *W, int64_t rows, int64_t cols, const snug_lora_cfg *q, snug_error *e) {
    snug_q4_tensor t;
    SNUG_TRY(snug_q4_init(&t, (snug_q4_type)q->q4_type, q->q4_blocksize ? q->q4_blocksize : 64, q->q4_nested, rows,
                          cols, SNUG_DT_F32, e));
    void *buf = malloc(snug_q4_bytes(t.type, t.n, t.blocksize, t.nested));
    if (!buf)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the %s round trip", snug_q4_type_name(t.type));
    snug_q4_carve(&t, buf);
    int rc = snug_q4_quantize(&t, W, SNUG_DT_F32, e);
    if (!rc)
        snug_q4_dequantize(&t, 0, t.n, W, SNUG_DT_F32);
    free(buf);
    return rc;
}

int snug_merge_lora(const char *base_dir, const char *adapter_dir, const char *out_dir, const snug_lora_cfg *q4,
                    int threads, snug_error *e) {
    char p[4096];
    snug_model_config cfg;
    snprintf(p, sizeof p, "%s/config.json", base_dir);
    SNUG_TRY(snug_model_config_load(&cfg, p, e));
    snug_lora_cfg lora;
    SNUG_TRY(snug_peft_read_config(adapter_dir, cfg.arch, cfg.n_layer, &lora, e));
    if (q4 && lora.init) /* (PEFT refuses PiSSA on a quantized base, and re-quantizes OLoRA's residual) */
        return snug_fail(e, SNUG_EINPUT, "%s/adapter_config.json: init_lora_weights is \"%s\", which changes the base, "
                         "and --base_as quantizes it; merge into the 16-bit base (without --base_as)", adapter_dir,
                         lora.init == SNUG_LORA_INIT_PISSA ? "pissa" : "olora");
    /* an adapter trained on tokens added to the base's vocabulary holds the grown embedding and lm_head whole (as
     * PEFT saves them, trained in lora_modules_to_save or not): the base's tables grow to its rows before they are
     * replaced */
    int vocab = 0;
    SNUG_TRY(snug_peft_vocab(adapter_dir, &vocab, e));
    if (vocab > cfg.vocab_size)
        cfg.vocab_base = cfg.vocab_size, cfg.vocab_size = vocab, cfg.vocab_mean = 1;
    /* the base in fp32 on the CPU, the adapter beside it: an inference layout of one token */
    snug_plan_spec spec = {.cfg = cfg, .B = 1, .T = 1, .lv = {.ckpt_every = 1, .lora = lora}, .with_grads = 0};
    snug_engine g = {0};
    int rc = snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, threads, e);
    snug_model *m = &g.model;
    if (!rc)
        rc = snug_model_load_weights(m, base_dir, e);
    if (!rc)
        rc = snug_peft_load(m, adapter_dir, e);
    for (int i = 0; !rc && q4 && i < m->table.n; i++) { /* QLoRA: the block matrices as the adapter saw them */
        const snug_param_entry *p = &m->table.e[i];
        if (p->layer >= 0 && p->ndim == 2)
            rc = round_trip(m->params + p->offset, p->transposed ? p->shape[1] : p->shape[0],
                            p->transposed ? p->shape[0] : p->shape[1], q4, e);
    }
    /* W[row0:row0+rows, :] (rows, in) += s * B (rows, r) @ A (r, in), in fp32; DoRA: then each row scaled by its
     * magnitude over its norm (into the layout's lora.dn), W = (mag / |W + s B A|) (W + s B A) */
    for (int l = 0; !rc && l < cfg.n_layer; l++) {
        snug_lora *lo = &m->lora;
        for (int i = 0; lo->table.layer_numel[l] && i < lo->nmod; i++) {
            const snug_lora_module *md = &lo->mod[i];
            const float *P = lo->params + lo->table.layer_offset[l];
            float *W = snug_site_weight(&m->w.layers[l], md->site) + (size_t)md->row0 * md->in;
            float *nrm = lo->dora ? lo->dn + (size_t)l * lo->dn_per_layer + md->n_off : NULL;
            m->be->gemm_strided(m->be, 0, 0, md->rows, md->in, lo->r, lo->scale, P + md->b_off, lo->r,
                                P + md->a_off, md->in, 1.0f, W, md->in);
            if (!nrm)
                continue;
            m->be->row_norms(m->be, nrm, W, (size_t)md->in, md->rows, md->in);
            for (int j = 0; j < md->rows; j++)
                m->be->scale(m->be, W + (size_t)j * md->in, P[md->m_off + (size_t)j] / nrm[j], (size_t)md->in);
        }
    }
    /* lora_modules_to_save: the trained copies replace the base's tensors */
    for (int k = 0; !rc && k < 2; k++) {
        const snug_lora *lo = &m->lora;
        size_t off = k ? lo->head_off : lo->emb_off;
        const char *want = k ? "lm_head.weight" : "embed_tokens.weight";
        for (int i = 0; off != (size_t)-1 && i < m->table.n; i++) {
            const snug_param_entry *p = &m->table.e[i];
            size_t n = strlen(p->name), w = strlen(want);
            if (p->layer < 0 && n >= w && !strcmp(p->name + n - w, want))
                memcpy(m->params + p->offset, lo->params + off, p->numel * sizeof *m->params);
        }
    }
    /* written in the base's dtype, rounded once from the merged fp32 values */
    snug_dtype dt = !strcmp(cfg.torch_dtype, "bfloat16") ? SNUG_DT_BF16
                    : !strcmp(cfg.torch_dtype, "float16") ? SNUG_DT_F16
                                                          : SNUG_DT_F32;
    uint16_t *h16 = NULL;
    if (!rc && dt != SNUG_DT_F32) {
        size_t P = m->table.total;
        if (!(h16 = malloc(P * sizeof *h16)))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory rounding the merged weights");
        for (size_t i = 0; !rc && i < P; i++)
            h16[i] = dt == SNUG_DT_BF16 ? snug_f32_to_bf16(m->params[i]) : snug_f32_to_f16(m->params[i]);
    }
    if (!rc)
        rc = snug_mkdirs(out_dir, e);
    if (!rc) {
        snug_model view = *m; /* the same table, saved as dt */
        view.lv.dt = dt;
        view.lv.lora.kind = SNUG_ADAPTER_NONE;
        rc = snug_model_save_weights_host(&view, out_dir, h16 ? NULL : m->params, h16, NULL, e);
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/tokenizer.json", adapter_dir);
        rc = snug_copy_tokenizer_files(snug_file_exists(p) ? adapter_dir : base_dir, out_dir, e);
    }
    if (!rc) {
        snug_path_join(p, sizeof p, out_dir, "generation_config.json");
        rc = snug_generation_config_save(&cfg, p, e);
    }
    if (!rc) {
        snug_path_join(p, sizeof p, out_dir, "config.json"); /* last: the folder is a model once it is whole */
        rc = snug_model_config_save(&cfg, p, e);
    }
    free(h16);
    snug_engine_free(&g);
    return rc;
}
