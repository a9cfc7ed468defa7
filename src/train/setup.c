/* setup.c: resolving a run configuration (see setup.h). */
#include "train/setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "model/family.h"
#include "model/peft_io.h"
#include "model/presets.h"
#include "backend/backend_select.h"
#include "plan/autofit.h"
#include "train/added_tokens.h"

int snug_path_join(char *dst, size_t n, const char *dir, const char *file) {
    size_t a = strlen(dir), b = strlen(file);
    if (a + b + 2 > n) {
        dst[0] = '\0';
        return 1;
    }
    memcpy(dst, dir, a);
    dst[a] = '/';
    memcpy(dst + a + 1, file, b + 1);
    return 0;
}

uint64_t snug_data_seed(const snug_run_config *c) { return (uint64_t)(c->data_seed >= 0 ? c->data_seed : c->seed); }

static int tok_encode(const void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                      snug_error *e) {
    return snug_tok_encode((const snug_tokenizer *)ctx, text, len, ids, n, cap, e) < 0 ? (e->code ? e->code : SNUG_EINPUT)
                                                                                    : 0;
}

static int tok_special_id(const void *ctx, const char *token) {
    return snug_tok_token_id((const snug_tokenizer *)ctx, token);
}

static int tok_decode(const void *ctx, const int32_t *ids, size_t n, char **text, size_t *len, snug_error *e) {
    return snug_tok_decode((const snug_tokenizer *)ctx, ids, n, text, len, e);
}

/* Which tokenizer.json: the `tokenizer` key, else the base model's, else the built-in one for from-scratch runs. */
static int open_tokenizer(snug_setup *r, snug_error *e) {
    const snug_run_config *o = &r->c;
    char cand[4096] = "";
    if (o->tokenizer[0]) {
        struct stat st;
        if (stat(o->tokenizer, &st) == 0 && S_ISDIR(st.st_mode))
            snug_path_join(cand, sizeof cand, o->tokenizer, "tokenizer.json");
        else
            snprintf(cand, sizeof cand, "%s", o->tokenizer);
        if (!snug_file_exists(cand))
            return snug_fail(e, SNUG_EINPUT, "%s: tokenizer file not found; set `tokenizer` to a tokenizer.json or "
                             "a folder that holds one", cand);
    } else if (o->base_model[0]) {
        struct stat st; /* a wrong path is said as one, before anything that needs the folder's files */
        if (stat(o->base_model, &st) != 0 || !S_ISDIR(st.st_mode))
            return snug_fail(e, SNUG_EINPUT, "base_model %s: %s; base_model must be a Hugging Face model folder with "
                             "config.json and model.safetensors", o->base_model,
                             stat(o->base_model, &st) != 0 ? "no such folder" : "not a folder");
        snug_path_join(cand, sizeof cand, o->base_model, "tokenizer.json");
        if (!snug_file_exists(cand))
            cand[0] = '\0';
    } else {
        snug_path_join(cand, sizeof cand, SNUG_SOURCE_DIR, "assets/tokenizer/tokenizer.json");
        if (!snug_file_exists(cand))
            cand[0] = '\0';
    }
    if (!cand[0]) {
        r->enc = snug_byte_encoder();
        return 0;
    }
    snprintf(r->tok_path, sizeof r->tok_path, "%s", cand);
    snug_error te = {0};
    int rc = snug_tok_load(&r->tok, cand, r->plan_only ? &te : e);
    if (rc && !r->plan_only)
        return rc;
    if (rc) { /* a plan needs only the vocabulary size: from the file alone, else from the base model */
        snprintf(r->tok_error, sizeof r->tok_error, "%.1000s", te.msg);
        r->enc = snug_byte_encoder();
        r->enc.bos_id = r->enc.eos_id = -1;
        r->enc.vocab_size = 0; /* (0: the base model's config.json says it) */
        if (snug_tok_vocab_size_of_file(cand, &r->enc.vocab_size, &te) && !o->base_model[0])
            return snug_fail(e, SNUG_EINPUT, "%s (and the vocabulary size the model needs: %s)", r->tok_error,
                             te.msg);
        return 0;
    }
    r->enc = (snug_encoder){.ctx = r->tok, .encode = tok_encode, .special_id = tok_special_id, .decode = tok_decode,
                            .vocab_size = snug_tok_vocab_size(r->tok), .bos_id = snug_tok_bos_id(r->tok),
                            .eos_id = snug_tok_eos_id(r->tok), .hash = snug_tok_hash(r->tok)};
    return 0;
}

/* special_tokens and tokens the tokenizer lacks are added as Axolotl adds them (added_tokens.h); pad_token and
 * eos_token take their roles, bos_token and unk_token must be the tokenizer's own (changing them would change how
 * every text is tokenized) */
static int special_tokens(snug_setup *r, snug_error *e) {
    const snug_run_config *o = &r->c;
    const char *src = o->config_path[0] ? o->config_path : "options";
    const char *text[4] = {o->pad_token, o->eos_token, o->bos_token, o->unk_token};
    static const char *const names[4] = {"pad_token", "eos_token", "bos_token", "unk_token"};
    r->pad_id = -1;
    if (o->tokens[0] && !r->tok && !r->tok_error[0])
        return snug_fail(e, SNUG_EINPUT, "%s: tokens needs a tokenizer (tokenizer.json), and this run has none; set "
                         "tokenizer, or remove it", src);
    for (int i = 0; i < 4; i++) {
        if (!text[i][0] || r->tok_error[0]) /* (a plan without its tokenizer: the run checks them) */
            continue;
        if (!r->tok)
            return snug_fail(e, SNUG_EINPUT, "%s: special_tokens.%s needs a tokenizer (tokenizer.json), and this run "
                             "has none; set tokenizer, or remove it", src, names[i]);
        int id = snug_tok_token_id(r->tok, text[i]);
        if (id < 0 && i == 1) /* (Axolotl checks every role but the pad token's) */
            SNUG_TRY(snug_setup_check_new_token(r, names[i], text[i], e));
        if (id < 0 && i == 1 && snug_tok_adds_eos(r->tok))
            return snug_fail(e, SNUG_EINPUT, "%s: special_tokens.eos_token '%.60s': the tokenizer's post-processor "
                             "appends its own EOS to every text; remove it", src, text[i]);
        if (id < 0 && i < 2)
            continue; /* added below */
        int own = i == 2 ? snug_tok_bos_id(r->tok) : i == 3 ? snug_tok_unk_id(r->tok) : -2;
        if ((i == 2 && own >= 0 && id != own) || (i == 3 && id != own))
            return snug_fail(e, SNUG_EINPUT, "%s: special_tokens.%s '%.60s' is not the tokenizer's own (%s); changing "
                             "it would change how every text is tokenized, which is not supported yet; remove it or "
                             "set it to that token", src, names[i], text[i],
                             own >= 0 ? snug_tok_id_to_token(r->tok, own) : "none");
        if (i == 1 && snug_tok_adds_eos(r->tok) && id != r->enc.eos_id)
            return snug_fail(e, SNUG_EINPUT, "%s: special_tokens.eos_token '%.60s': the tokenizer's post-processor "
                             "appends its own EOS to every text; remove it", src, text[i]);
    }
    if (r->tok_error[0] || r->tok)
        SNUG_TRY(snug_setup_add_tokens(r, e));
    for (int i = 0; i < 2 && r->tok; i++)
        if (text[i][0])
            *(i ? &r->enc.eos_id : &r->pad_id) = snug_tok_token_id(r->tok, text[i]);
    return 0;
}

static int resolve_model(snug_setup *r, snug_error *e) {
    const snug_run_config *o = &r->c;
    if (o->base_model[0]) {
        char p[4096];
        snug_path_join(p, sizeof p, o->base_model, "config.json");
        if (!snug_file_exists(p))
            return snug_fail(e, SNUG_EINPUT, "%s: not found; base_model must be a Hugging Face model folder with "
                             "config.json and model.safetensors", p);
        SNUG_TRY(snug_model_config_load(&r->cfg, p, e));
        SNUG_TRY(snug_setup_grow_vocab(r, e));
        if (r->enc.vocab_size > r->cfg.vocab_size)
            return snug_fail(e, SNUG_EINPUT, "%s: vocab_size %d is smaller than the tokenizer's %d tokens; use the "
                             "tokenizer that belongs to this model", p, r->cfg.vocab_size, r->enc.vocab_size);
        if (!r->tok && (!r->tok_error[0] || r->enc.vocab_size <= 0)) /* no tokenizer: pretokenized data may hold
                                                                         * any id of the model's vocabulary */
            r->enc.vocab_size = r->cfg.vocab_size;
    } else {
        SNUG_TRY(snug_preset(&r->cfg, o->model_preset, r->enc.vocab_size, e));
        if (r->enc.eos_id >= 0)
            r->cfg.eos_token_id = r->enc.eos_id;
        if (r->enc.bos_id >= 0)
            r->cfg.bos_token_id = r->enc.bos_id;
    }
    const char *src = o->config_path[0] ? o->config_path : "options";
    if (o->model_class[0] && strcmp(o->model_class, "AutoModelForCausalLM") &&
        strcmp(o->model_class, r->cfg.architecture))
        return snug_fail(e, SNUG_EINPUT, "%s: model_type is %s, but the model is a %s (%s); set model_type to %s or "
                         "AutoModelForCausalLM, or remove it", src, o->model_class, r->cfg.architecture,
                         o->base_model[0] ? "its config.json's architectures" : "model_preset", r->cfg.architecture);
    static const char *const derived[3] = {"llama", "mistral", "qwen2"};
    const int said[3] = {o->derived_llama, o->derived_mistral, o->derived_qwen};
    for (int i = 0; i < 3; i++)
        if (said[i] && strcmp(r->cfg.model_type, derived[i]))
            return snug_fail(e, SNUG_EINPUT, "%s: is_%s_derived_model is true, but the model's model_type is %s; set "
                             "it to false or remove it", src, i == 2 ? "qwen" : derived[i], r->cfg.model_type);
    const snug_scheme *scheme = snug_scheme_of(r->cfg.arch);
    int conv1d = scheme->conv1d; /* PEFT's fan_in_fan_out: the weights stored (in, out) */
    if (o->adapter && o->lora_fan_in_fan_out >= 0 && o->lora_fan_in_fan_out != conv1d)
        return snug_fail(e, SNUG_EINPUT, "%s: lora_fan_in_fan_out is %s, but this model's layers are %s%s "
                         "(fan_in_fan_out %s); set it to %s or remove it", src,
                         o->lora_fan_in_fan_out ? "true" : "false", conv1d ? scheme->name : "nn.Linear",
                         conv1d ? "'s Conv1D" : "", conv1d ? "true" : "false", conv1d ? "true" : "false");
    if (r->enc.eos_id < 0 && r->cfg.eos_token_id >= r->cfg.vocab_size) /* it would end every example */
        return snug_fail(e, SNUG_EINPUT, "%s/config.json: eos_token_id %d is outside the vocabulary (vocab_size %d); "
                         "set it to the id of the end-of-text token", o->base_model, r->cfg.eos_token_id,
                         r->cfg.vocab_size);
    if (r->enc.eos_id < 0)
        r->enc.eos_id = r->cfg.eos_token_id;
    if (r->pad_id < 0)
        r->pad_id = r->enc.eos_id >= 0 ? r->enc.eos_id : 0;
    if (o->sequence_len > r->cfg.max_position)
        return snug_fail(e, SNUG_EINPUT, "sequence_len %d exceeds the model's max_position_embeddings %d; lower "
                         "sequence_len", o->sequence_len, r->cfg.max_position);
    return 0;
}

int snug_setup_load_data(snug_setup *r, snug_error *e) {
    const snug_run_config *o = &r->c;
    if (r->tok_error[0])
        return snug_fail(e, SNUG_EINPUT, "%s", r->tok_error);
    if (o->ndatasets == 0)
        return snug_fail(e, SNUG_EINPUT, "no dataset given; add `datasets: [{path: data.jsonl}]` to the config or "
                         "pass --dataset data.jsonl");
    for (int i = 0; i < o->ndatasets + o->ntest_datasets; i++) { /* datasets, then test_datasets */
        const snug_dataset_spec *d = snug_run_dataset(o, i, NULL);
        *(i < o->ndatasets ? &r->dsrc[i] : &r->vsrc[i - o->ndatasets]) =
            (snug_data_source){.path = d->path, .field = d->field[0] ? d->field : "text", .format = d->type,
                               .chat = d->chat_template, .messages = d->field_messages, .role = d->field_role,
                               .content = d->field_content,
                               .roles = {d->roles_system, d->roles_user, d->roles_assistant}};
    }
    SNUG_TRY(snug_setup_chat(r, e));
    r->dopts = (snug_data_opts){.train_on_inputs = o->train_on_inputs, .sequence_len = o->sequence_len,
                                .drop_long = o->long_examples == SNUG_LONG_DROP, .skip_bad = o->skip_bad_examples};
    SNUG_TRY(snug_dataset_prepare(&r->train, r->dsrc, o->ndatasets, &r->dopts, &r->enc,
                                  o->dataset_prepared_path[0] ? o->dataset_prepared_path : "last_run_prepared",
                                  &r->drep, e));
    if (o->dataset_exact_deduplication) /* (before the split: no example in both sets) */
        SNUG_TRY(snug_dataset_dedup(&r->train, NULL, &r->drep.duplicates, e));
    if (o->val_set_size > 0)
        SNUG_TRY(snug_dataset_split(&r->train, o->val_set_size, snug_data_seed(o), &r->val, e));
    if (o->ntest_datasets) /* the validation set from its own files, tokenized alike (its own cache file) */
        SNUG_TRY(snug_dataset_prepare(&r->val, r->vsrc, o->ntest_datasets, &r->dopts, &r->enc,
                                      o->dataset_prepared_path[0] ? o->dataset_prepared_path : "last_run_prepared",
                                      &r->vrep, e));
    if (o->ntest_datasets && o->dataset_exact_deduplication) {
        SNUG_TRY(snug_dataset_dedup(&r->val, &r->train, &r->vrep.duplicates, e));
        if (!r->val.nexamples)
            return snug_fail(e, SNUG_EINPUT, "%s: every example of test_datasets is also a training example or a "
                             "repeat (dataset_exact_deduplication removed all %llu), so nothing is left to validate "
                             "on; give other test_datasets, or set dataset_exact_deduplication: false",
                             o->config_path[0] ? o->config_path : "config", (unsigned long long)r->vrep.duplicates);
    }
    return 0;
}


int snug_setup_model(snug_setup *r, const snug_run_config *c, snug_error *e) {
    int ranks = r->ranks, rank = r->rank, tp_rank = r->tp_rank, pp_stage = r->pp_stage; /* the fields set before */
    int plan_only = r->plan_only;
    snug_comm *agree = r->agree;
    memset(r, 0, sizeof *r);
    r->plan_only = plan_only;
    r->agree = agree;
    r->ranks = ranks;
    r->rank = rank;
    r->tp_rank = tp_rank;
    r->pp_stage = pp_stage;
    r->c = *c;
    SNUG_TRY(open_tokenizer(r, e));
    SNUG_TRY(special_tokens(r, e));
    return resolve_model(r, e);
}

/* The adapters of c: its typed fields (the targets resolved against the model by resolve_adapter, the layers and
 * the modules trained in full read by the command line). */
static snug_lora_cfg lora_cfg(const snug_run_config *c, snug_arch arch) {
    snug_lora_cfg l = {.kind = c->adapter, .r = c->lora_r, .dropout = (float)c->lora_dropout,
                       .rslora = c->lora_rslora, .dora = c->lora_dora, .loraplus = c->loraplus_lr_ratio};
    if (!l.kind)
        return (snug_lora_cfg){0};
    l.alpha = c->lora_alpha > 0 ? (float)c->lora_alpha : (float)c->lora_r;
    if (l.kind == SNUG_ADAPTER_QLORA) {
        l.q4_type = c->bnb_4bit_quant_type;
        l.q4_nested = c->bnb_4bit_use_double_quant;
        l.q4_blocksize = c->bnb_4bit_blocksize > 0 ? c->bnb_4bit_blocksize : 64;
    }
    l.targets = c->lora_targets;
    l.save_modules = c->lora_save_modules;
    memcpy(l.layers, c->lora_layer_mask, sizeof l.layers);
    return l;
}

/* lora_model_dir: the configuration's adapter settings that its adapter_config.json overrides, named with the
 * configuration's values for the header ("lora_r 8, lora_dropout 0"); "" when they agree. */
static void adapter_overrides(snug_setup *r, const snug_lora_cfg *a) {
    const snug_run_config *c = &r->c;
    char *o = r->adapter_overrides, t[256];
    size_t n = sizeof r->adapter_overrides, len = 0;
    o[0] = '\0';
#define NOTE(...) (len += (size_t)snprintf(o + len, len < n ? n - len : 0, __VA_ARGS__))
    double alpha = c->lora_alpha > 0 ? c->lora_alpha : c->lora_r;
    if (c->lora_r != a->r)
        NOTE("%slora_r %d", len ? ", " : "", c->lora_r);
    if ((float)alpha != a->alpha)
        NOTE("%slora_alpha %g", len ? ", " : "", alpha);
    if ((float)c->lora_dropout != a->dropout)
        NOTE("%slora_dropout %g", len ? ", " : "", c->lora_dropout);
    if (c->lora_targets != (a->targets ? a->targets : snug_lora_default_targets(r->cfg.arch))) {
        snug_lora_targets_list(r->cfg.arch, c->lora_targets, t, sizeof t);
        NOTE("%slora_target_modules [%s]", len ? ", " : "", t);
    }
    if (!c->lora_rslora != !a->rslora)
        NOTE("%speft_use_rslora %s", len ? ", " : "", c->lora_rslora ? "true" : "false");
    if (!c->lora_dora != !a->dora)
        NOTE("%speft_use_dora %s", len ? ", " : "", c->lora_dora ? "true" : "false");
    if (memcmp(c->lora_layer_mask, a->layers, sizeof a->layers))
        NOTE("%slora_layers_to_transform [%s]", len ? ", " : "", c->lora_layers[0] ? c->lora_layers : "all");
    if (c->lora_save_modules != a->save_modules)
        NOTE("%slora_modules_to_save [%s]", len ? ", " : "", c->lora_modules_to_save);
#undef NOTE
}

/* adapter: the names of lora_target_modules checked against the model, and a lora_model_dir's adapter settings
 * written into the configuration (the adapter says what it is) */
static int resolve_adapter(snug_setup *r, snug_error *e) {
    snug_run_config *c = &r->c;
    if (c->load_in_4bit && c->adapter == SNUG_ADAPTER_LORA)
        c->adapter = SNUG_ADAPTER_QLORA;
    if (c->load_in_8bit && c->adapter == SNUG_ADAPTER_LORA) /* LoRA on a quantized base, its codes 8-bit */
        c->adapter = SNUG_ADAPTER_QLORA, c->bnb_4bit_quant_type = SNUG_Q4_INT8;
    /* a bitsandbytes 4-bit checkpoint says how it is stored */
    snug_q4_tensor q4;
    int prequant = 0;
    if (c->adapter && c->base_model[0]) { /* (a full fine-tune of a 4-bit folder is refused when it loads) */
        snug_st_set s;
        memset(&s, 0, sizeof s);
        snug_error se = {0};
        if (snug_st_open_dir(&s, c->base_model, &se) == 0) {
            for (int i = 0; i < s.ntensors && !prequant; i++) {
                const char *n = s.tensors[i].name, *suffix = ".weight.quant_state.bitsandbytes__";
                const char *at = strstr(n, suffix);
                size_t nl = strlen(n);
                if (!at && nl > 4 && !strcmp(n + nl - 4, ".SCB")) /* an 8-bit weight's row scales */
                    at = n + nl - 4;
                if (at) {
                    char base[512];
                    snprintf(base, sizeof base, "%.*s.weight", (int)(at - n), n);
                    prequant = snug_q4_st_view(&s, base, &q4, e) == 0 ? 1 : -1;
                }
            }
            snug_st_close(&s);
        }
        if (prequant < 0)
            return e ? e->code : SNUG_EINPUT;
    }
    if (prequant && q4.type == SNUG_Q4_INT8 && !c->load_in_8bit)
        return snug_fail(e, SNUG_EINPUT, "%s holds 8-bit (bitsandbytes LLM.int8) weights, which train as adapters on "
                         "the 8-bit base: set load_in_8bit: true and adapter: lora", c->base_model);
    if (prequant && q4.type != SNUG_Q4_INT8 && c->load_in_8bit)
        return snug_fail(e, SNUG_EINPUT, "%s holds 4-bit (bitsandbytes) weights, and load_in_8bit is true: set "
                         "load_in_8bit: false and adapter: qlora", c->base_model);
    if (prequant && c->adapter != SNUG_ADAPTER_QLORA)
        return snug_fail(e, SNUG_EINPUT, "%s holds 4-bit (bitsandbytes) weights, which train as adapters: set adapter: "
                         "qlora (not lora)", c->base_model);
    if (prequant && q4.type != SNUG_Q4_INT8) {
        c->bnb_4bit_quant_type = q4.type;
        c->bnb_4bit_use_double_quant = q4.nested;
        c->bnb_4bit_blocksize = q4.blocksize;
    }
    if (c->adapter == SNUG_ADAPTER_QLORA) { /* the rest of the base in 16 bits: the compute dtype */
        if (c->bnb_4bit_compute_fp16 || c->fp16)
            c->fp16 = 1, c->bf16 = 0;
        else
            c->bf16 = 1;
    }
    if (!c->adapter)
        return 0;
    char unknown[64];
    unsigned t = 0; /* the targets: the names matched against this architecture's modules (PEFT's matching) */
    if (c->lora_target_modules[0] &&
        snug_lora_targets_parse(r->cfg.arch, c->lora_target_modules, &t, unknown, sizeof unknown)) {
        char all[256];
        snug_lora_targets_list(r->cfg.arch, snug_lora_all_linear(r->cfg.arch), all, sizeof all);
        return snug_fail(e, SNUG_EINPUT, "%s: lora_target_modules names '%s', which is not a linear module of this "
                         "model; its modules are %s (or all-linear)", c->config_path[0] ? c->config_path : "config",
                         unknown, all);
    }
    if (!c->lora_target_modules[0])
        t = c->lora_target_linear ? 0 : snug_lora_default_targets(r->cfg.arch);
    c->lora_targets = t | (c->lora_target_linear ? snug_lora_all_linear(r->cfg.arch) : 0);
    const char *blocks = snug_scheme_of(r->cfg.arch)->blocks;
    if (c->lora_layers_pattern[0] && strcmp(c->lora_layers_pattern, blocks))
        return snug_fail(e, SNUG_EINPUT, "%s: peft_layers_pattern is '%s', but this model's blocks are in '%s'; set it "
                         "to %s or remove it", c->config_path[0] ? c->config_path : "config", c->lora_layers_pattern,
                         blocks, blocks);
    for (int l = r->cfg.n_layer; l < 256; l++) /* (the command line took indices from 0 to 255) */
        if (c->lora_layer_mask[l / 64] >> (l % 64) & 1)
            return snug_fail(e, SNUG_EINPUT, "%s: lora_layers_to_transform names '%d'; list layer indices from 0 to %d "
                             "(this model's layers)", c->config_path[0] ? c->config_path : "config", l,
                             r->cfg.n_layer - 1);
    if (!c->lora_model_dir[0])
        return 0;
    snug_lora_cfg a;
    SNUG_TRY(snug_peft_read_config(c->lora_model_dir, r->cfg.arch, r->cfg.n_layer, &a, e));
    for (int l = r->cfg.n_layer; snug_lora_layers_named(&a) && l < 256; l++)
        if (snug_lora_layer_on(&a, l))
            return snug_fail(e, SNUG_EINPUT, "%s/adapter_config.json: layers_to_transform names layer %d, and this "
                             "model's layers are 0 to %d; the adapter is for another base", c->lora_model_dir, l,
                             r->cfg.n_layer - 1);
    adapter_overrides(r, &a);
    snug_lora_layers_list(&a, c->lora_layers, sizeof c->lora_layers); /* the adapter's layers, as the run's */
    memcpy(c->lora_layer_mask, a.layers, sizeof c->lora_layer_mask);
    c->lora_r = a.r;
    c->lora_alpha = a.alpha;
    c->lora_dropout = a.dropout;
    c->lora_rslora = a.rslora;
    c->lora_dora = a.dora;
    c->lora_target_linear = 0;
    snug_lora_targets_list(r->cfg.arch, a.targets, c->lora_target_modules, sizeof c->lora_target_modules);
    c->lora_targets = a.targets ? a.targets : snug_lora_default_targets(r->cfg.arch); /* (an empty list: the default) */
    snug_lora_save_list(a.save_modules, c->lora_modules_to_save, sizeof c->lora_modules_to_save);
    c->lora_save_modules = a.save_modules;
    return 0;
}

int snug_tokenizer_files_set_special(const char *dir, const snug_run_config *c, snug_error *e) {
    static const char *const files[] = {"tokenizer_config.json", "special_tokens_map.json"};
    SNUG_TRY(snug_added_tokens_save(dir, c, e));
    if (!c->pad_token[0] && !c->eos_token[0])
        return 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char p[4096];
        snug_path_join(p, sizeof p, dir, files[i]);
        json_error_t je;
        json_t *j = NULL;
        if (snug_file_exists(p)) { /* (snug_json_loadb: transformers writes integers beyond int64) */
            char *buf = NULL;
            size_t len = 0;
            SNUG_TRY(snug_read_file(p, &buf, &len, e));
            j = snug_json_loadb(buf, len, 0, &je);
            free(buf);
        } else {
            j = json_object();
        }
        if (!json_is_object(j)) {
            json_decref(j);
            return snug_fail(e, SNUG_EINPUT, "%s: not a JSON object; the tokenizer files copied from the tokenizer's "
                             "folder must be valid JSON", p);
        }
        if (c->pad_token[0])
            json_object_set_new(j, "pad_token", json_string(c->pad_token));
        if (c->eos_token[0])
            json_object_set_new(j, "eos_token", json_string(c->eos_token));
        char *text = json_dumps(j, JSON_INDENT(2));
        json_decref(j);
        if (!text)
            return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", p);
        int rc = snug_write_file_atomic(p, text, strlen(text), e);
        free(text);
        SNUG_TRY(rc);
    }
    return 0;
}

int snug_copy_tokenizer_files(const char *src_dir, const char *dst_dir, snug_error *e) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "chat_template.jinja"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char src[4096], dst[4096];
        snug_path_join(src, sizeof src, src_dir, files[i]);
        snug_path_join(dst, sizeof dst, dst_dir, files[i]);
        if (snug_file_exists(src))
            SNUG_TRY(snug_copy_file(src, dst, e));
    }
    return 0;
}

int snug_setup_load_adapter(const snug_setup *r, snug_model *m, snug_error *e) {
    if (!m->lora.on)
        return 0;
    if (r->c.lora_model_dir[0])
        return snug_peft_load(m, r->c.lora_model_dir, e);
    if (snug_lora_init(m, (uint64_t)r->c.seed))
        return snug_fail(e, SNUG_ENOMEM, "out of host memory initialising the adapters");
    return snug_lora_saved_from_file(m, r->c.base_model, e);
}

int snug_setup_adapter_base(const snug_setup *r, snug_model *m, snug_error *e) {
    if (!m->lora.on || !r->c.lora_model_dir[0])
        return 0;
    snug_lora_cfg a;
    char path[1100];
    SNUG_TRY(snug_peft_read_config(r->c.lora_model_dir, r->cfg.arch, r->cfg.n_layer, &a, e));
    snprintf(path, sizeof path, "%s/adapter_config.json", r->c.lora_model_dir);
    return snug_peft_residual(m, a.init, path, e);
}

snug_plan_spec snug_run_spec(const snug_run_config *c, const snug_model_config *cfg) {
    snug_plan_spec s = {.cfg = *cfg, .B = c->micro_batch_size, .T = c->sequence_len,
                        .GA = c->gradient_accumulation_steps, .lv = snug_run_levers(c), .with_grads = 1,
                        .ckpt_snapshot = snug_run_saves(c) && c->async_checkpoint,
                        .zero_stage = c->zero_stage, .tp = c->tensor_parallel_size,
                        .pp = c->pipeline_parallel_size, .pp_recompute = c->pipeline_recompute,
                        .pp_split = {c->pipeline_stage_layers, c->pipeline_nstage_layers},
                        .unfrozen = &c->unfrozen,
                        .loss_vocab_block = c->loss_vocab_block,
                        .ddp_bucket_cap_mb = c->ddp_bucket_cap_mb, .comm_deterministic = c->ddp_deterministic,
                        .overlap_comm = c->zero_overlap_comm == SNUG_OVERLAP_ON    ? 1
                                        : c->zero_overlap_comm == SNUG_OVERLAP_OFF ? -1
                                                                                   : 0};
    snug_run_optimizer(c->optimizer, &s.optim, &s.optim_paged);
    s.lv.lora = lora_cfg(c, cfg->arch);
    return s;
}

/* auto_fit's choice, written into the configuration it came from */
static void apply_fit(snug_run_config *c, const snug_fit_point *p) {
    const snug_levers *lv = &p->spec.lv;
    c->micro_batch_size = p->spec.B;
    c->gradient_accumulation_steps = p->spec.GA;
    c->gradient_checkpointing = lv->ckpt == SNUG_CKPT_FULL ? (lv->ckpt_offload ? SNUG_CKPT_CHOICE_OFFLOAD
                                                                               : SNUG_CKPT_CHOICE_FULL)
                                : lv->ckpt == SNUG_CKPT_SELECTIVE ? SNUG_CKPT_CHOICE_SELECTIVE
                                                                  : SNUG_CKPT_CHOICE_NONE;
    c->gradient_checkpointing_every_n_layers = lv->ckpt_every > 0 ? lv->ckpt_every : 1;
    c->flash_attention = !lv->naive_attention;
    c->chunked_cross_entropy = lv->xent_chunk > 0;
    if (lv->xent_chunk > 0)
        c->cross_entropy_chunk_tokens = lv->xent_chunk;
    c->optimizer = snug_run_optimizer_choice(p->spec.optim, p->spec.optim_paged);
    if (snug_run_saves(c))
        c->async_checkpoint = p->spec.ckpt_snapshot;
    c->tiled_mlp = lv->mlp_shards != 0;
    c->tiled_mlp_num_shards = lv->mlp_shards > 0 ? lv->mlp_shards : 0;
    c->offload_embedding = lv->offload_embedding;
    c->offload_params = lv->offload_params;
    c->zero_stage = p->spec.zero_stage;
}

/* The highest ZeRO stage auto_fit may raise a run over several ranks to: the highest whose configuration is valid
 * (an adapter or the optimizer step inside backward rules the stages out). */
static int zero_max(const snug_run_config *c, const snug_model_config *cfg, int ranks) {
    if (c->pipeline_parallel_size > 1 && cfg->tie_embeddings) /* refused beside a pipeline (snug_setup_resolve) */
        return c->zero_stage;
    for (int z = 3; ranks > 1 && z > c->zero_stage; z--) {
        snug_run_config t = *c;
        snug_error ve = {0};
        t.zero_stage = z;
        if (!snug_run_config_validate(&t, &ve))
            return z;
    }
    return c->zero_stage;
}

/* The plan spec of the configuration as it stands, for this rank (its slices, its stage) */
static snug_plan_spec rank_spec(const snug_setup *r, snug_device_kind device) {
    snug_plan_spec s = snug_run_spec(&r->c, &r->cfg);
    s.ranks = r->ranks;
    s.rank = r->rank;
    s.tp_rank = r->tp_rank;
    s.pp_stage = r->pp_stage;
    s.device_cuda = device == SNUG_DEVICE_CUDA;
    return s;
}

/* find_batch_size on this rank alone: its plan (of spec, the configuration's) against its own memory */
static int find_batch_size_here(snug_setup *r, const snug_plan_spec *spec, snug_device_kind device, int *found,
                                snug_error *e) {
    int gpu = device == SNUG_DEVICE_CUDA;
    double budget = (double)snug_backend_memory_available(gpu ? SNUG_BACKEND_CUDA : SNUG_BACKEND_CPU);
    const char *what = gpu ? "memory free on the GPU" : "memory available on the host";
    if (r->c.memory_budget > 0 && (!(budget > 0) || r->c.memory_budget < budget))
        budget = r->c.memory_budget, what = "memory_budget";
    if (!(budget > 0))
        return snug_fail(e, SNUG_EINPUT, "auto_find_batch_size: cannot tell how much memory the %s has free; set "
                         "memory_budget (e.g. 40GB), the memory to fit", gpu ? "GPU" : "host");
    int B;
    SNUG_TRY(snug_fit_batch_halving(spec, budget, what, device, r->data_host_est, &B, r->fit_note,
                                    sizeof r->fit_note, e));
    r->c.micro_batch_size = B;
    *found = B;
    return 0;
}

/* auto_find_batch_size: micro_batch_size halved until the plan fits the memory free on the device (memory_budget
 * when smaller), written into the configuration; over several ranks (each planning its own share: a ZeRO shard, a
 * pipeline stage) the smallest of their sizes, so that they run the same micro-batches */
static int find_batch_size(snug_setup *r, const snug_plan_spec *spec, snug_device_kind device, snug_error *e) {
    int B = 0, rc = find_batch_size_here(r, spec, device, &B, e);
    snug_comm *c = r->agree;
    if (!c || c->size <= 1)
        return rc;
    /* every rank reaches the exchange (0: none fits here), then all take the smallest size */
    double *sizes = calloc((size_t)c->size, sizeof *sizes);
    if (!sizes)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory");
    sizes[c->rank] = rc ? 0 : B;
    snug_error ce = {0};
    int crc = c->allreduce_sum(c, sizes, (size_t)c->size, SNUG_COMM_F64 | SNUG_COMM_HOST, &ce);
    int least = B, at = c->rank;
    for (int k = 0; !crc && k < c->size; k++)
        if (sizes[k] < least)
            least = (int)sizes[k], at = k;
    free(sizes);
    if (crc)
        return e ? (*e = ce, ce.code) : crc;
    if (rc)
        return rc;
    if (least < 1)
        return snug_fail(e, SNUG_EINPUT, "auto_find_batch_size: not even micro_batch_size 1 fits rank %d's plan in "
                         "its memory (its error says by how much); shorten sequence_len, set gradient_checkpointing: "
                         "full, or run `snug plan` to see what each lever saves", at);
    if (least < B) {
        r->c.micro_batch_size = least;
        snprintf(r->fit_note, sizeof r->fit_note, "auto_find_batch_size: micro_batch_size %d, the largest every "
                 "rank fits (rank %d's; this rank fits %d)", least, at, B);
    } else {
        size_t n = strlen(r->fit_note);
        snprintf(r->fit_note + n, sizeof r->fit_note - n, "; every one of the %d ranks fits it", c->size);
    }
    return 0;
}

/* auto_fit: the setting of the levers whose plan fits memory_budget at the least predicted cost, chosen among
 * candidates planned from spec (the configuration's, with the ZeRO stages it may take), written into the
 * configuration, which is validated again like a hand-written one */
static int fit(snug_setup *r, snug_plan_spec *spec, snug_device_kind device, snug_error *e) {
    spec->zero_max = zero_max(&r->c, &r->cfg, r->ranks);
    snug_fit_point best;
    SNUG_TRY(snug_autofit(spec, r->c.memory_budget, device, r->data_host_est, &best, r->fit_note, sizeof r->fit_note,
                          e));
    apply_fit(&r->c, &best);
    snug_error ve = {0};
    if (snug_run_config_validate(&r->c, &ve))
        return snug_fail(e, SNUG_EINTERNAL, "auto_fit chose a setting that is not a valid configuration (%s); "
                         "turn auto_fit off and set the levers by hand", ve.msg);
    return 0;
}

/* unfrozen_parameters against the whole model's tensors: each pattern well formed and matching one of them (a
 * misspelt pattern would freeze what it meant to train) */
static int check_unfrozen(const snug_setup *r, snug_error *e) {
    const char *src = r->c.config_path[0] ? r->c.config_path : "config";
    if (!r->c.unfrozen.n)
        return 0;
    snug_param_table t;
    SNUG_TRY(snug_param_table_build(&t, &r->cfg, e));
    int unmatched = 0, rc = snug_param_table_freeze(&t, &r->c.unfrozen, &unmatched, e);
    char example[96] = "";
    for (int i = 0; i < t.n && !example[0]; i++) /* a block's matrix, as the names go */
        if (t.e[i].layer == 0 && t.e[i].ndim == 2)
            snprintf(example, sizeof example, "%s", t.e[i].name);
    snug_param_table_free(&t);
    if (rc)
        return snug_error_wrap(e, "%s: ", src);
    if (!unmatched)
        return 0;
    return snug_fail(e, SNUG_EINPUT, "%s: unfrozen_parameters[%d] '%s' matches no tensor of the model; a pattern is "
                     "matched at the start of a tensor's name (such as %s), each '.' literal; fix it or remove it",
                     src, unmatched - 1, snug_patterns_item(&r->c.unfrozen, unmatched - 1), example);
}

int snug_setup_resolve(snug_setup *r, const snug_run_config *c, snug_device_kind device, snug_error *e) {
    if (device == SNUG_DEVICE_CUDA && c->loss_vocab_block > 0)
        return snug_fail(e, SNUG_EINPUT, "%s: loss_vocab_block is %d, but the loss over blocks of the head's rows runs "
                         "on the CPU backend only; remove it (or set it to 0) for a GPU run",
                         c->config_path[0] ? c->config_path : "options", c->loss_vocab_block);
    SNUG_TRY(snug_setup_model(r, c, e));
    if (c->pipeline_parallel_size > 1 && c->zero_stage && r->cfg.tie_embeddings) /* (needs the model's config) */
        return snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size %d with zero_stage %d and a tied head "
                         "(tie_word_embeddings) is not supported yet: the embedding's gradient is summed from the "
                         "first and the last stage, which ZeRO shard differently; set zero_stage: 0",
                         c->pipeline_parallel_size, c->zero_stage);
    SNUG_TRY(resolve_adapter(r, e));
    SNUG_TRY(check_unfrozen(r, e));
    r->data_host_est = snug_dataset_bytes_estimate(&r->c, !r->tok && !r->tok_error[0]);
    /* the searches settle the configuration (auto_fit and auto_find_batch_size exclude each other): each plans its
     * candidates from the spec of the configuration as written, and writes its choice into the configuration */
    if (r->c.auto_find_batch_size || r->c.auto_fit) {
        snug_plan_spec written = rank_spec(r, device);
        SNUG_TRY(r->c.auto_fit ? fit(r, &written, device, e) : find_batch_size(r, &written, device, e));
    }
    /* the configuration is final: its spec, derived once, exactly as a hand-written one's (the fitted run is the
     * run of the configuration it prints) */
    r->spec = rank_spec(r, device);
    SNUG_TRY(snug_plan_run(&r->plan, &r->spec, e));
    if (r->c.memory_budget > 0) { /* snug_engine_create refuses a plan over the budget */
        snug_overhead ov;
        snug_overhead_compute(&ov, device, &r->plan, r->data_host_est);
        r->spec.memory_budget = r->c.memory_budget;
        r->spec.budget_overhead = (double)ov.total;
    }
    return 0;
}

/* The token's text with control characters, quotes and backslashes escaped (bytes >= 0x80 too for the byte-level
 * stand-in, whose tokens are single bytes). */
static void print_token(FILE *out, const snug_setup *d, int32_t id) {
    char byte[2] = {0, 0};
    const char *s = NULL;
    size_t n = 0;
    int raw_high = d->tok != NULL;
    if (d->tok) {
        s = snug_tok_id_to_token(d->tok, id);
    } else if (id >= 0 && id < 256) {
        byte[0] = (char)id;
        s = byte;
        n = 1;
    } else if (id == d->enc.eos_id) {
        s = "<eos>";
        raw_high = 1;
    }
    if (!s) {
        fprintf(out, "(no token)");
        return;
    }
    if (!n)
        n = strlen(s);
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c == '\r')
            fputs("\\r", out);
        else if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !raw_high))
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

void snug_setup_print_examples(FILE *out, const snug_setup *d, size_t n) {
    const snug_dataset *ds = &d->train; /* its store arrays hold every example, in file order */
    size_t total = 0;
    for (int i = 0; i < d->drep.nsources; i++)
        total += (size_t)d->drep.src[i].examples;
    for (size_t k = 0; k < total && k < n; k++) {
        uint64_t a = ds->start[k], b = ds->start[k + 1], nsup = 0;
        for (uint64_t t = a; t < b; t++)
            nsup += ds->sup[t];
        fprintf(out, "\nexample %zu of %zu: %llu tokens, %llu supervised\n", k + 1, total,
                (unsigned long long)(b - a), (unsigned long long)nsup);
        fprintf(out, "  %5s %8s  %-10s  %s\n", "pos", "id", "supervised", "token");
        for (uint64_t t = a; t < b; t++) {
            fprintf(out, "  %5llu %8d  %-10s  ", (unsigned long long)(t - a), ds->ids[t], ds->sup[t] ? "yes" : "no");
            print_token(out, d, ds->ids[t]);
            fputc('\n', out);
        }
    }
}

void snug_setup_free(snug_setup *r) {
    snug_dataset_free(&r->train);
    snug_dataset_free(&r->val);
    if (r->tok)
        snug_tok_free(r->tok);
    r->tok = NULL;
    snug_chat_files_free(&r->chat);
    free(r->chat_jinja);
    r->chat_jinja = NULL;
}

size_t snug_dataset_bytes_estimate(const snug_run_config *c, int byte_level) {
    double bytes = 0;
    for (int i = 0; i < c->ndatasets + c->ntest_datasets; i++) {
        struct stat st;
        if (stat(snug_run_dataset(c, i, NULL)->path, &st) == 0)
            bytes += (double)st.st_size;
    }
    /* about one token per byte of text for the byte-level stand-in, one per 4 bytes for a BPE tokenizer */
    size_t tokens = (size_t)(byte_level ? bytes : bytes / 4.0);
    return snug_data_host_bytes(tokens, 0, c->sequence_len);
}
