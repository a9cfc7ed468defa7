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

/* The command's arguments: MODEL_DIR IN OUT, then --key value pairs. */
typedef struct parity_args {
    const char *dir, *in, *out, *save, *adapter, *qlora;
    snug_backend_choice device;
    int steps, threads, mlp_shards, offload_emb, q4_chunk;
    snug_patterns unfrozen; /* --unfrozen PATTERN, repeated: unfrozen_parameters */
    double lr, wd, clip, eps, loraplus;
} parity_args;

/* Every option but the named ones takes a number, read whole. */
static int parse_number(parity_args *a, const char *k, const char *v, snug_error *e) {
    static const char *const ints[] = {"--steps", "--threads", "--tiled_mlp", "--offload_embedding", "--q4_chunk"};
    static const char *const reals[] = {"--lr", "--weight_decay", "--max_grad_norm", "--adam_epsilon", "--loraplus"};
    int *iv[] = {&a->steps, &a->threads, &a->mlp_shards, &a->offload_emb, &a->q4_chunk};
    double *rv[] = {&a->lr, &a->wd, &a->clip, &a->eps, &a->loraplus};
    char *end = NULL;
    for (size_t j = 0; j < sizeof ints / sizeof *ints; j++)
        if (!strcmp(k, ints[j])) {
            long x = strtol(v, &end, 10);
            if (end == v || *end || x < 0 || x > INT_MAX)
                return snug_fail(e, SNUG_EINPUT, "snug parity: %s '%s' is not a whole number >= 0", k, v);
            *iv[j] = (int)x;
            return 0;
        }
    for (size_t j = 0; j < sizeof reals / sizeof *reals; j++)
        if (!strcmp(k, reals[j])) {
            double x = strtod(v, &end);
            if (end == v || *end || !isfinite(x) || x < 0)
                return snug_fail(e, SNUG_EINPUT, "snug parity: %s '%s' is not a number >= 0", k, v);
            *rv[j] = x;
            return 0;
        }
    return snug_fail(e, SNUG_EINPUT, "snug parity: unknown option %s", k);
}

static int parse_args(parity_args *a, int argc, char **argv, snug_error *e) {
    if (argc < 3)
        return snug_fail(e, SNUG_EINPUT, "usage: snug parity MODEL_DIR IN.safetensors OUT.safetensors [--steps K ... "
                         "--tiled_mlp SHARDS --offload_embedding 1 --q4_chunk ELEMENTS --loraplus RATIO --unfrozen "
                         "PATTERN --device cpu|cuda]");
    *a = (parity_args){.dir = argv[0], .in = argv[1], .out = argv[2], .device = SNUG_BACKEND_CPU, .lr = 1e-3,
                       .eps = 1e-8};
    if ((argc - 3) % 2)
        return snug_fail(e, SNUG_EINPUT, "snug parity: %s has no value", argv[argc - 1]);
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--save")) a->save = v;
        else if (!strcmp(k, "--adapter")) a->adapter = v;
        else if (!strcmp(k, "--qlora")) a->qlora = v;
        else if (!strcmp(k, "--unfrozen")) {
            if (!*v)
                return snug_fail(e, SNUG_EINPUT, "snug parity: an --unfrozen pattern is empty; give a pattern of "
                                 "tensor names");
            if (snug_patterns_add(&a->unfrozen, v))
                return snug_fail(e, SNUG_EINPUT, "snug parity: the --unfrozen patterns are too long");
        }
        else if (!strcmp(k, "--device") && !strcmp(v, "cuda")) a->device = SNUG_BACKEND_CUDA;
        else if (!strcmp(k, "--device") && !strcmp(v, "cpu")) a->device = SNUG_BACKEND_CPU;
        else SNUG_TRY(parse_number(a, k, v, e));
    }
    if (a->qlora && strcmp(a->qlora, "nf4") && strcmp(a->qlora, "fp4") && strcmp(a->qlora, "int8"))
        return snug_fail(e, SNUG_EINPUT, "snug parity: --qlora '%s': use nf4, fp4 or int8", a->qlora);
    return 0;
}

/* The plan spec of the run on a (B, T) batch: --adapter, a PEFT LoRA adapter on the base, its A and B what trains
 * and what is dumped; --qlora nf4|fp4, the adapter on the base stored 4-bit (double-quantized), the rest bf16; int8,
 * stored as LLM.int8's 8 bits (load_in_8bit). */
static int build_spec(snug_plan_spec *spec, const parity_args *a, const snug_model_config *cfg, int B, int T,
                      snug_error *e) {
    *spec = (snug_plan_spec){.cfg = *cfg, .B = B, .T = T, .with_grads = 1, .unfrozen = &a->unfrozen,
                             .lv = {.ckpt_every = 1, .mlp_shards = a->mlp_shards, .offload_embedding = a->offload_emb}};
    if (a->adapter)
        SNUG_TRY(snug_peft_read_config(a->adapter, cfg->arch, cfg->n_layer, &spec->lv.lora, e));
    spec->lv.lora.q4_chunk = a->q4_chunk > 0 ? (size_t)a->q4_chunk : 0;
    spec->lv.lora.loraplus = a->loraplus; /* --loraplus RATIO: LoRA+'s learning rate of lora_B */
    if (a->qlora) {
        spec->lv.lora.kind = SNUG_ADAPTER_QLORA;
        spec->lv.lora.q4_type = !strcmp(a->qlora, "int8") ? SNUG_Q4_INT8
                                : !strcmp(a->qlora, "fp4") ? SNUG_Q4_FP4 : SNUG_Q4_NF4;
        spec->lv.lora.q4_nested = 1;
        spec->lv.lora.q4_blocksize = 64;
        spec->lv.dt = SNUG_DT_BF16;
    }
    return 0;
}

/* What the run dumps: the first step's logits (B, T, V), loss and gradients (at the trainable table's offsets, zero
 * where none is stored), the loss of every step, and the parameters after the last. */
typedef struct parity_dump {
    float *logits, *grads0, *params_after, *hist, loss0;
} parity_dump;

/* The first step's logits and gradients into d. */
static void take_first(parity_dump *d, snug_model *m, const snug_param_table *tt, const float *tgrads) {
    size_t N = (size_t)m->B * (size_t)m->T;
    int V = m->cfg.vocab_size, C = m->cfg.hidden_size;
    /* the full logits, for the comparison only: the loss workspace holds all N rows (no chunking); a 16-bit head
     * has no fp32 view, and then no logits are dumped */
    if (m->w.lm_head) {
        m->be->matmul_fwd(m->be, m->logits, m->lnf, m->w.lm_head, NULL, (int)N, C, V);
        m->be->to_host(m->be, d->logits, m->logits, N * (size_t)V * sizeof *d->logits);
    }
    for (int i = 0; i < tt->n; i++) {
        snug_dtype gdt;
        const void *gi = m->lora.on ? (const void *)(tgrads + tt->e[i].offset) : snug_model_grad(m, i, &gdt);
        float *dst = d->grads0 + tt->e[i].offset;
        if (gi)
            m->be->to_host(m->be, dst, gi, tt->e[i].numel * sizeof(float));
        else
            memset(dst, 0, tt->e[i].numel * sizeof(float));
    }
}

/* steps optimizer steps on the batch (after a first forward and backward), recording into d. */
static void run_steps(parity_dump *d, snug_engine *g, const parity_args *a, const int32_t *labels) {
    snug_model *m = &g->model;
    const snug_param_table *tt = snug_model_trainable(m);
    float *tparams = m->lora.on ? m->lora.params : m->params, *tgrads = m->lora.on ? m->lora.grads : m->grads;
    size_t N = (size_t)m->B * (size_t)m->T, nsup = 0;
    for (size_t i = 0; i < N; i++)
        nsup += labels[i] >= 0;
    float scale = nsup ? 1.0f / (float)nsup : 0.0f;
    size_t gn = m->lora.on ? tt->total : m->grads_numel; /* (frozen tensors may have no gradient storage) */
    for (int s = 0; s <= a->steps; s++) {
        m->be->zero(m->be, tgrads, gn * sizeof(float));
        double loss = snug_model_step(m, scale) * scale;
        d->hist[s] = (float)loss;
        if (s == 0) {
            d->loss0 = (float)loss;
            take_first(d, m, tt, tgrads);
        }
        if (s == a->steps)
            break;
        double norm = snug_grad_norm_model(m, 1.0f);
        float c = a->clip > 0 && norm > a->clip ? (float)(a->clip / (norm + 1e-6)) : 1.0f;
        snug_adamw_step_model(&g->opt, m, a->lr, c);
    }
    m->be->to_host(m->be, d->params_after, tparams, tt->total * sizeof(float));
}

/* d as one safetensors file: logits, loss, loss_history, and grad.NAME / param.NAME per trainable tensor. */
static int write_dump(const char *path, const parity_dump *d, const snug_model *m, int steps, snug_error *e) {
    const snug_param_table *tt = snug_model_trainable(m);
    int nt = 2 + 2 * tt->n + 1, k = 0;
    snug_st_out *t = calloc((size_t)nt, sizeof *t);
    char (*names)[128] = calloc((size_t)nt, sizeof *names);
    if (!t || !names) {
        free(t), free(names);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory");
    }
    if (m->w.lm_head)
        t[k++] = (snug_st_out){.name = "logits", .dtype = SNUG_DT_F32, .ndim = 3,
                               .shape = {m->B, m->T, m->cfg.vocab_size}, .f32 = d->logits};
    t[k++] = (snug_st_out){.name = "loss", .dtype = SNUG_DT_F32, .ndim = 0, .f32 = &d->loss0};
    t[k++] = (snug_st_out){.name = "loss_history", .dtype = SNUG_DT_F32, .ndim = 1, .shape = {steps + 1},
                           .f32 = d->hist};
    for (int i = 0; i < tt->n; i++) {
        const snug_param_entry *pe = &tt->e[i];
        for (int which = 0; which < 2; which++) {
            if (which == 1 && steps == 0)
                continue;
            snprintf(names[k], sizeof names[k], "%s.%s", which ? "param" : "grad", pe->name);
            t[k] = (snug_st_out){.name = names[k], .dtype = SNUG_DT_F32, .ndim = pe->ndim,
                                 .shape = {pe->shape[0], pe->shape[1]},
                                 .f32 = (which ? d->params_after : d->grads0) + pe->offset,
                                 .transpose2d = pe->transposed};
            k++;
        }
    }
    int rc = snug_st_write(path, t, k, NULL, e);
    free(t);
    free(names);
    return rc;
}

/* --save DIR: the trained adapter (PEFT's folder), or the model (config.json and its weights). */
static int save_trained(const parity_args *a, snug_model *m, const snug_model_config *cfg, snug_error *e) {
    if (m->lora.on)
        return snug_peft_save(m, a->save, a->dir, NULL, e);
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", a->save);
    SNUG_TRY(snug_mkdirs(a->save, e));
    SNUG_TRY(snug_model_config_save(cfg, p, e));
    return snug_model_save_weights(m, a->save, NULL, e);
}

int snug_parity_cmd(int argc, char **argv, snug_error *e) {
    parity_args a;
    SNUG_TRY(parse_args(&a, argc, argv, e));
    snug_model_config cfg;
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", a.dir);
    SNUG_TRY(snug_model_config_load(&cfg, p, e));
    int vocab = 0; /* an adapter on a vocabulary grown for added tokens: the base grows to its tables' rows */
    if (a.adapter)
        SNUG_TRY(snug_peft_vocab(a.adapter, &vocab, e));
    if (vocab > cfg.vocab_size)
        cfg.vocab_base = cfg.vocab_size, cfg.vocab_size = vocab, cfg.vocab_mean = 1;

    snug_st_set batch;
    memset(&batch, 0, sizeof batch);
    SNUG_TRY(snug_st_open_file(&batch, a.in, e));
    int32_t *ids = NULL, *labels = NULL, *pos = NULL;
    int B = 0, T = 0, B2 = 0, T2 = 0;
    int rc = read_ints(&batch, "input_ids", &ids, &B, &T, e);
    if (!rc)
        rc = read_ints(&batch, "labels", &labels, &B2, &T2, e);
    snug_st_close(&batch);
    if (!rc && (B != B2 || T != T2))
        rc = snug_fail(e, SNUG_EINPUT, "%s: input_ids and labels differ in shape", a.in);

    snug_engine g = {0};
    snug_plan_spec spec;
    if (!rc)
        rc = build_spec(&spec, &a, &cfg, B, T, e);
    if (!rc)
        rc = snug_engine_create(&g, &spec, a.device, a.threads, e);
    if (!rc)
        rc = snug_model_load_weights(&g.model, a.dir, e);
    if (!rc && a.adapter)
        rc = snug_peft_load(&g.model, a.adapter, e);
    g.opt.beta1 = 0.9;
    g.opt.beta2 = 0.999;
    g.opt.eps = a.eps;
    g.opt.weight_decay = a.wd;
    size_t N = (size_t)B * T, P = rc ? 0 : snug_model_trainable(&g.model)->total;
    parity_dump d = {0};
    if (!rc) {
        pos = malloc(N * sizeof *pos);
        d.logits = malloc(N * (size_t)cfg.vocab_size * sizeof *d.logits);
        d.grads0 = malloc(P * sizeof *d.grads0);
        d.params_after = malloc(P * sizeof *d.params_after);
        d.hist = calloc((size_t)a.steps + 1, sizeof *d.hist);
        if (!pos || !d.logits || !d.grads0 || !d.params_after || !d.hist)
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory");
    }
    if (!rc) {
        for (size_t i = 0; i < N; i++)
            pos[i] = (int32_t)(i % (size_t)T);
        snug_model_set_batch(&g.model, ids, labels, pos, NULL, B, T);
        run_steps(&d, &g, &a, labels);
        rc = write_dump(a.out, &d, &g.model, a.steps, e);
    }
    if (!rc && a.save)
        rc = save_trained(&a, &g.model, &cfg, e);
    free(ids);
    free(labels);
    free(pos);
    free(d.logits);
    free(d.grads0);
    free(d.params_after);
    free(d.hist);
    snug_engine_free(&g);
    return rc;
}
