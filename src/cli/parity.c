/* parity.c: run a model folder on a given batch and dump everything PyTorch can be compared against
 * (see parity.h). */
#include "cli/parity.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/fileio.h"
#include "model/model.h"
#include "model/peft_io.h"
#include "model/safetensors.h"
#include "optim/optim.h"
#include "plan/plan.h"
#include "train/engine.h"

static int read_ints(const snug_st_set *s, const char *name, int32_t **out, int *B, int *T, snug_error *e) {
    const snug_st_tensor *t = snug_st_find(s, name);
    if (!t || t->ndim != 2 || (t->dtype != SNUG_DT_I32 && t->dtype != SNUG_DT_I64))
        return snug_fail(e, SNUG_EINPUT, "%s: tensor '%s' must be a 2-D I32 or I64 tensor (B, T)", s->paths[0], name);
    *B = (int)t->shape[0];
    *T = (int)t->shape[1];
    size_t n = (size_t)*B * *T;
    *out = malloc(n * sizeof **out);
    if (!*out)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory");
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == SNUG_DT_I32) {
            int32_t v;
            memcpy(&v, (const char *)t->data + 4 * i, 4);
            (*out)[i] = v;
        } else {
            int64_t v;
            memcpy(&v, (const char *)t->data + 8 * i, 8);
            (*out)[i] = (int32_t)v;
        }
    }
    return 0;
}

int snug_parity_cmd(int argc, char **argv, snug_error *e) {
    if (argc < 3)
        return snug_fail(e, SNUG_EINPUT, "usage: snug parity MODEL_DIR IN.safetensors OUT.safetensors [--steps K ... "
                         "--tiled_mlp SHARDS --offload_embedding 1 --q4_chunk ELEMENTS --loraplus RATIO --unfrozen "
                         "PATTERN --device cpu|cuda]");
    const char *dir = argv[0], *in = argv[1], *outp = argv[2], *save = NULL, *adapter = NULL, *qlora = NULL;
    snug_backend_choice device = SNUG_BACKEND_CPU;
    int steps = 0, threads = 0, mlp_shards = 0, offload_emb = 0, q4_chunk = 0;
    char unfrozen[4096] = ""; /* --unfrozen PATTERN, repeated: unfrozen_parameters, one pattern per line */
    double lr = 1e-3, wd = 0.0, clip = 0.0, eps = 1e-8, loraplus = 0.0;
    if ((argc - 3) % 2)
        return snug_fail(e, SNUG_EINPUT, "snug parity: %s has no value", argv[argc - 1]);
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--save")) save = v;
        else if (!strcmp(k, "--adapter")) adapter = v;
        else if (!strcmp(k, "--qlora")) qlora = v;
        else if (!strcmp(k, "--unfrozen")) {
            size_t n = strlen(unfrozen);
            if (n + strlen(v) + 2 > sizeof unfrozen)
                return snug_fail(e, SNUG_EINPUT, "snug parity: the --unfrozen patterns are too long");
            snprintf(unfrozen + n, sizeof unfrozen - n, "%s%s", n ? "\n" : "", v);
        }
        else if (!strcmp(k, "--device") && !strcmp(v, "cuda")) device = SNUG_BACKEND_CUDA;
        else if (!strcmp(k, "--device") && !strcmp(v, "cpu")) device = SNUG_BACKEND_CPU;
        else {
            /* every other option takes a number, read whole */
            static const char *const ints[] = {"--steps", "--threads", "--tiled_mlp", "--offload_embedding",
                                               "--q4_chunk"};
            static const char *const reals[] = {"--lr", "--weight_decay", "--max_grad_norm", "--adam_epsilon",
                                                "--loraplus"};
            int *iv[] = {&steps, &threads, &mlp_shards, &offload_emb, &q4_chunk};
            double *rv[] = {&lr, &wd, &clip, &eps, &loraplus};
            int found = 0;
            char *end = NULL;
            for (size_t j = 0; j < sizeof ints / sizeof *ints && !found; j++)
                if (!strcmp(k, ints[j])) {
                    long x = strtol(v, &end, 10);
                    if (end == v || *end || x < 0 || x > INT_MAX)
                        return snug_fail(e, SNUG_EINPUT, "snug parity: %s '%s' is not a whole number >= 0", k, v);
                    *iv[j] = (int)x, found = 1;
                }
            for (size_t j = 0; j < sizeof reals / sizeof *reals && !found; j++)
                if (!strcmp(k, reals[j])) {
                    double x = strtod(v, &end);
                    if (end == v || *end || !isfinite(x) || x < 0)
                        return snug_fail(e, SNUG_EINPUT, "snug parity: %s '%s' is not a number >= 0", k, v);
                    *rv[j] = x, found = 1;
                }
            if (!found)
                return snug_fail(e, SNUG_EINPUT, "snug parity: unknown option %s", k);
        }
    }
    if (qlora && strcmp(qlora, "nf4") && strcmp(qlora, "fp4") && strcmp(qlora, "int8"))
        return snug_fail(e, SNUG_EINPUT, "snug parity: --qlora '%s': use nf4, fp4 or int8", qlora);
    snug_model_config cfg;
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    SNUG_TRY(snug_model_config_load(&cfg, p, e));

    snug_st_set batch;
    memset(&batch, 0, sizeof batch);
    SNUG_TRY(snug_st_open_file(&batch, in, e));
    int32_t *ids = NULL, *labels = NULL, *pos = NULL;
    int B = 0, T = 0, B2 = 0, T2 = 0;
    int rc = read_ints(&batch, "input_ids", &ids, &B, &T, e);
    if (!rc)
        rc = read_ints(&batch, "labels", &labels, &B2, &T2, e);
    snug_st_close(&batch);
    if (!rc && (B != B2 || T != T2))
        rc = snug_fail(e, SNUG_EINPUT, "%s: input_ids and labels differ in shape", in);

    snug_engine g = {0};
    snug_plan_spec spec = {.cfg = cfg, .B = B, .T = T, .with_grads = 1, .unfrozen = unfrozen,
                           .lv = {.ckpt_every = 1, .mlp_shards = mlp_shards, .offload_embedding = offload_emb}};
    /* --adapter: a PEFT LoRA adapter on the base; its A and B are what trains and what is dumped */
    if (!rc && adapter)
        rc = snug_peft_read_config(adapter, cfg.arch, &spec.lv.lora, e);
    spec.lv.lora.q4_chunk = q4_chunk > 0 ? (size_t)q4_chunk : 0;
    spec.lv.lora.loraplus = loraplus; /* --loraplus RATIO: LoRA+'s learning rate of lora_B */
    if (!rc && qlora) { /* --qlora nf4|fp4: the adapter on the base stored 4-bit (double-quantized), the rest bf16;
                         * int8: stored as LLM.int8's 8 bits (load_in_8bit) */
        spec.lv.lora.kind = SNUG_ADAPTER_QLORA;
        spec.lv.lora.q4_type = !strcmp(qlora, "int8") ? SNUG_Q4_INT8
                               : !strcmp(qlora, "fp4") ? SNUG_Q4_FP4 : SNUG_Q4_NF4;
        spec.lv.lora.q4_nested = 1;
        spec.lv.lora.q4_blocksize = 64;
        spec.lv.dt = SNUG_DT_BF16;
    }
    if (!rc)
        rc = snug_engine_create(&g, &spec, device, threads, e);
    if (!rc)
        rc = snug_model_load_weights(&g.model, dir, e);
    if (!rc && adapter)
        rc = snug_peft_load(&g.model, adapter, e);
    snug_model *m = &g.model;
    const snug_param_table *tt = snug_model_trainable(m);
    float *tparams = m->lora.on ? m->lora.params : m->params, *tgrads = m->lora.on ? m->lora.grads : m->grads;
    g.opt.beta1 = 0.9;
    g.opt.beta2 = 0.999;
    g.opt.eps = eps;
    g.opt.weight_decay = wd;
    size_t N = (size_t)B * T, P = tt->total;
    int V = cfg.vocab_size, C = cfg.hidden_size;
    float *logits = NULL, *grads0 = NULL, *params_after = NULL, *hist = NULL, loss0 = 0;
    if (!rc) {
        pos = malloc(N * sizeof *pos);
        logits = malloc(N * (size_t)V * sizeof *logits);
        grads0 = malloc(P * sizeof *grads0);
        params_after = malloc(P * sizeof *params_after);
        hist = calloc((size_t)steps + 1, sizeof *hist);
        if (!pos || !logits || !grads0 || !params_after || !hist)
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory");
    }
    if (!rc) {
        for (size_t i = 0; i < N; i++)
            pos[i] = (int32_t)(i % (size_t)T);
        snug_model_set_batch(m, ids, labels, pos, NULL, B, T);
        size_t nsup = 0;
        for (size_t i = 0; i < N; i++)
            nsup += labels[i] >= 0;
        float scale = nsup ? 1.0f / (float)nsup : 0.0f;
        size_t gn = m->lora.on ? P : m->grads_numel; /* (frozen tensors may have no gradient storage) */
        for (int s = 0; s <= steps; s++) {
            m->be->zero(m->be, tgrads, gn * sizeof(float));
            double loss = snug_model_step(m, scale) * scale;
            hist[s] = (float)loss;
            if (s == 0) {
                loss0 = (float)loss;
                /* the full logits, for the comparison only: the loss workspace holds all N rows (no chunking);
                 * a 16-bit head has no fp32 view, and then no logits are dumped */
                if (m->w.lm_head) {
                    m->be->matmul_fwd(m->be, m->logits, m->lnf, m->w.lm_head, NULL, (int)N, C, V);
                    m->be->to_host(m->be, logits, m->logits, N * (size_t)V * sizeof *logits);
                }
                for (int i = 0; i < tt->n; i++) { /* at the table's offsets; zero where none is stored */
                    snug_dtype gdt;
                    const void *gi = m->lora.on ? (const void *)(tgrads + tt->e[i].offset)
                                                : snug_model_grad(m, i, &gdt);
                    float *dst = grads0 + tt->e[i].offset;
                    if (gi)
                        m->be->to_host(m->be, dst, gi, tt->e[i].numel * sizeof(float));
                    else
                        memset(dst, 0, tt->e[i].numel * sizeof(float));
                }
            }
            if (s == steps)
                break;
            double norm = snug_grad_norm_model(m, 1.0f);
            float c = clip > 0 && norm > clip ? (float)(clip / (norm + 1e-6)) : 1.0f;
            snug_adamw_step_model(&g.opt, m, lr, c);
        }
        m->be->to_host(m->be, params_after, tparams, P * sizeof(float));
    }
    if (!rc) {
        int nt = 2 + 2 * tt->n + 1;
        snug_st_out *t = calloc((size_t)nt, sizeof *t);
        char (*names)[128] = calloc((size_t)nt, sizeof *names);
        int k = 0;
        if (m->w.lm_head)
            t[k++] = (snug_st_out){.name = "logits", .dtype = SNUG_DT_F32, .ndim = 3, .shape = {B, T, V},
                                   .f32 = logits};
        t[k++] = (snug_st_out){.name = "loss", .dtype = SNUG_DT_F32, .ndim = 0, .f32 = &loss0};
        t[k++] = (snug_st_out){.name = "loss_history", .dtype = SNUG_DT_F32, .ndim = 1, .shape = {steps + 1},
                               .f32 = hist};
        for (int i = 0; i < tt->n; i++) {
            const snug_param_entry *pe = &tt->e[i];
            for (int which = 0; which < 2; which++) {
                if (which == 1 && steps == 0)
                    continue;
                snprintf(names[k], sizeof names[k], "%s.%s", which ? "param" : "grad", pe->name);
                t[k] = (snug_st_out){.name = names[k], .dtype = SNUG_DT_F32, .ndim = pe->ndim,
                                     .shape = {pe->shape[0], pe->shape[1]},
                                     .f32 = (which ? params_after : grads0) + pe->offset,
                                     .transpose2d = pe->transposed};
                k++;
            }
        }
        rc = snug_st_write(outp, t, k, NULL, e);
        free(t);
        free(names);
    }
    if (!rc && save && m->lora.on) {
        rc = snug_peft_save(m, save, dir, NULL, e);
    } else if (!rc && save) {
        snprintf(p, sizeof p, "%s/config.json", save);
        rc = snug_mkdirs(save, e);
        if (!rc)
            rc = snug_model_config_save(&cfg, p, e);
        if (!rc)
            rc = snug_model_save_weights(m, save, NULL, e);
    }
    free(ids);
    free(labels);
    free(pos);
    free(logits);
    free(grads0);
    free(params_after);
    free(hist);
    snug_engine_free(&g);
    return rc;
}
