/* presets.c: built-in architectures for training from scratch without a model folder (model_preset). */
#include <stdio.h>
#include <string.h>

#include "model/family.h"
#include "model/presets.h"

/* c zeroed and named as the family of model_type names itself (its arch, model_type and class) */
static void family_base(snug_model_config *c, const char *model_type) {
    const snug_family *f = snug_family_find(model_type);
    memset(c, 0, sizeof *c);
    c->arch = f->arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", f->model_type);
    snprintf(c->architecture, sizeof c->architecture, "%s", f->architecture);
}

static void llama_base(snug_model_config *c) {
    family_base(c, "llama");
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0;
    c->rope_type = SNUG_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->bos_token_id = c->eos_token_id = c->pad_token_id = -1;
    c->initializer_range = 0.02f;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
}

int snug_preset(snug_model_config *c, const char *name, int vocab_size, snug_error *e) {
    if (!strcmp(name, "tiny-llama")) {
        /* about 4M parameters: trains visibly in minutes on two cores */
        llama_base(c);
        c->hidden_size = 256, c->intermediate_size = 768, c->n_layer = 4, c->n_head = 8, c->n_kv_head = 4;
        c->max_position = 1024, c->tie_embeddings = 1;
    } else if (!strcmp(name, "llama-30m")) {
        llama_base(c);
        c->hidden_size = 512, c->intermediate_size = 1376, c->n_layer = 8, c->n_head = 8, c->n_kv_head = 4;
        c->max_position = 2048, c->tie_embeddings = 1;
    } else if (!strcmp(name, "gpt2-124m")) {
        family_base(c, "gpt2");
        c->hidden_size = 768, c->intermediate_size = 3072, c->n_layer = 12, c->n_head = 12, c->n_kv_head = 12;
        c->max_position = 1024, c->tie_embeddings = 1, c->qkv_bias = c->o_bias = c->mlp_bias = 1;
        c->norm_eps = 1e-5f, c->initializer_range = 0.02f;
        c->bos_token_id = c->eos_token_id = c->pad_token_id = -1;
        snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
        if (vocab_size <= 0)
            vocab_size = 50257;
    } else {
        return snug_fail(e, SNUG_EINPUT, "unknown model_preset '%s'; choose tiny-llama, llama-30m or gpt2-124m, or "
                         "set base_model to a Hugging Face model folder", name);
    }
    c->vocab_size = vocab_size > 0 ? vocab_size : 32000;
    c->head_dim = c->hidden_size / c->n_head;
    return snug_model_config_validate(c, name, e);
}
