/* generate_cmd.c: sample from a saved Hugging Face model folder with its tokenizer (see generate_cmd.h). */
#include "cli/generate_cmd.h"

#include <stdint.h>

#include <stdlib.h>
#include <string.h>

#include "cli/options.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "core/fileio.h"
#include "model/model.h"
#include "model/peft_io.h"
#include "plan/plan.h"
#include "train/engine.h"

static int generate(const char *dir, const char *adapter, const char *prompt_text, int max_new, int threads,
                    const snug_sampling *sp, FILE *out, snug_error *e);

void snug_generate_usage(FILE *f) {
    fprintf(f, "usage: snug generate MODEL_DIR [--prompt TEXT] [--max_new_tokens N] [--temperature T] [--top_k K] "
               "[--top_p P] [--seed S] [--threads N] [--adapter DIR]\n\n"
               "Continues --prompt with the model in MODEL_DIR (a Hugging Face folder, or a PEFT adapter folder, whose "
               "base_model_name_or_path is then loaded under it). Its flags are configuration keys, range-checked as "
               "in training:\n");
    snug_generate_flags_help(f);
    fprintf(f, "  adapter: a folder\n      a PEFT adapter applied on MODEL_DIR\n");
}

int snug_generate_cmd(int argc, char **argv, FILE *out, snug_error *e) {
    if (argc < 1 || argv[0][0] == '-')
        return snug_fail(e, SNUG_EINPUT, "usage: snug generate MODEL_DIR [--prompt TEXT] [--max_new_tokens N] "
                         "[--temperature T] [--top_k K] [--top_p P] [--seed S] [--threads N]");
    /* the flags are configuration keys (prompt = sample_prompt, max_new_tokens = sample_tokens, ...), parsed and
     * range-checked by the same key table as training */
    snug_run_config *c = calloc(1, sizeof *c);
    if (!c)
        return snug_fail(e, SNUG_ENOMEM, "out of memory");
    snug_options_defaults(c);
    /* --adapter DIR: a PEFT adapter on MODEL_DIR (the configuration's adapter key names a kind, not a folder) */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    int nargs = 0;
    const char *adapter = NULL;
    for (int i = 1; args && i < argc; i++) {
        if (!strcmp(argv[i], "--adapter") && i + 1 < argc)
            adapter = argv[++i];
        else if (!strncmp(argv[i], "--adapter=", 10))
            adapter = argv[i] + 10;
        else
            args[nargs++] = argv[i];
    }
    int rc = args ? snug_options_parse_args(c, nargs, args, e) : snug_fail(e, SNUG_ENOMEM, "out of memory");
    free(args);
    if (!rc)
        rc = snug_run_config_validate(c, e);
    if (rc) {
        free(c);
        return rc;
    }
    const char *dir = argv[0], *prompt_text = c->sample_prompt;
    int max_new = c->sample_tokens, threads = c->threads;
    snug_sampling s = {.temperature = (float)c->temperature, .top_k = c->top_k, .top_p = (float)c->top_p,
                       .seed = (uint64_t)c->seed};
    char base[1024];
    if (!adapter && snug_peft_is_adapter(dir)) { /* an adapter folder alone: the base it names */
        rc = snug_peft_base_path(dir, base, sizeof base, e);
        adapter = dir;
        dir = base;
    }
    if (!rc)
        rc = generate(dir, adapter, prompt_text, max_new, threads, &s, out, e);
    free(c);
    return rc;
}

static int generate(const char *dir, const char *adapter, const char *prompt_text, int max_new, int threads,
                    const snug_sampling *sp, FILE *out, snug_error *e) {
    snug_sampling s = *sp;
    char p[4096];
    snug_model_config cfg;
    snprintf(p, sizeof p, "%s/config.json", dir);
    SNUG_TRY(snug_model_config_load(&cfg, p, e));
    snug_lora_cfg lora = {0};
    if (adapter)
        SNUG_TRY(snug_peft_read_config(adapter, cfg.arch, cfg.n_layer, &lora, e));
    snug_tokenizer *tok = NULL; /* the adapter's tokenizer when it has one (snug saves it beside the adapter) */
    snprintf(p, sizeof p, "%s/tokenizer.json", adapter ? adapter : dir);
    SNUG_TRY(snug_tok_load(&tok, adapter && snug_file_exists(p) ? adapter : dir, e));
    int32_t *prompt = NULL, *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    int bos = snug_tok_bos_id(tok);
    if (bos >= 0) {
        prompt = malloc(16 * sizeof *prompt);
        cap = 16;
        if (prompt)
            prompt[n++] = bos;
    }
    if (snug_tok_encode(tok, prompt_text, strlen(prompt_text), &prompt, &n, &cap, e) < 0)
        rc = e->code ? e->code : SNUG_EINPUT;
    if (!rc && n == 0) {
        int32_t start = cfg.bos_token_id >= 0 ? cfg.bos_token_id : cfg.eos_token_id;
        int32_t *np = realloc(prompt, sizeof *np);
        if (!np || start < 0)
            rc = snug_fail(e, SNUG_EINPUT, "give a --prompt: the model has no BOS or EOS token to start from");
        else
            (prompt = np)[n++] = start;
    }
    if (!rc && n >= (size_t)cfg.max_position)
        rc = snug_fail(e, SNUG_EINPUT, "the prompt is %zu tokens but the model in %s has a context of %d tokens "
                       "(max_position_embeddings), leaving no room to generate; shorten --prompt", n, dir,
                       cfg.max_position);
    if (rc) {
        free(prompt);
        snug_tok_free(tok);
        return rc;
    }
    int T = (int)n + max_new;
    if (T > cfg.max_position)
        T = cfg.max_position;
    snug_engine g = {0};
    snug_plan_spec spec = {.cfg = cfg, .B = 1, .T = T, .lv = {.ckpt_every = 1, .lora = lora}, .with_grads = 0};
    if (!rc)
        rc = snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, threads, e);
    if (!rc)
        rc = snug_model_load_weights(&g.model, dir, e);
    if (!rc && adapter)
        rc = snug_peft_load(&g.model, adapter, e);
    if (!rc && !(ids = malloc((size_t)T * sizeof *ids)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory");
    if (!rc) {
        int eos = snug_tok_eos_id(tok) >= 0 ? snug_tok_eos_id(tok) : cfg.eos_token_id;
        int got = 0, skip = bos >= 0 ? 1 : 0;
        rc = snug_generate_checked(&g.model, prompt, (int)n, T - (int)n, eos, &s, ids, &got, e);
        if (!rc && got > skip && ids[got - 1] == eos)
            got--;
        char *txt = NULL;
        size_t len = 0;
        if (!rc && got >= skip)
            rc = snug_tok_decode(tok, ids + skip, (size_t)(got - skip), &txt, &len, e);
        if (!rc)
            fprintf(out, "%.*s\n", (int)len, txt);
        free(txt);
    }
    free(prompt);
    free(ids);
    snug_engine_free(&g);
    snug_tok_free(tok);
    return rc;
}
