/* generate_cmd.c: sample from a saved Hugging Face model folder with its tokenizer (see generate_cmd.h). */
#include "cli/generate_cmd.h"

#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "model/generate.h"
#include "model/model.h"
#include "plan/plan.h"
#include "train/engine.h"

int snug_generate_cmd(int argc, char **argv, FILE *out, snug_error *e) {
    if (argc < 1 || argv[0][0] == '-')
        return snug_fail(e, SNUG_EINPUT, "usage: snug generate MODEL_DIR [--prompt TEXT] [--max_new_tokens N] "
                         "[--temperature T] [--top_k K] [--top_p P] [--seed S] [--threads N]");
    const char *dir = argv[0], *prompt_text = "";
    int max_new = 64, threads = 0;
    snug_sampling s = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return snug_fail(e, SNUG_EINPUT, "snug generate: %s needs a value", k);
        if (!strcmp(k, "--prompt")) prompt_text = v;
        else if (!strcmp(k, "--max_new_tokens")) max_new = atoi(v);
        else if (!strcmp(k, "--temperature")) s.temperature = (float)atof(v);
        else if (!strcmp(k, "--top_k")) s.top_k = atoi(v);
        else if (!strcmp(k, "--top_p")) s.top_p = (float)atof(v);
        else if (!strcmp(k, "--seed")) s.seed = (uint64_t)strtoull(v, NULL, 10);
        else if (!strcmp(k, "--threads")) threads = atoi(v);
        else return snug_fail(e, SNUG_EINPUT, "snug generate: unknown option %s; see `snug help`", k);
        i++;
    }
    char p[4096];
    snug_model_config cfg;
    snprintf(p, sizeof p, "%s/config.json", dir);
    SNUG_TRY(snug_model_config_load(&cfg, p, e));
    snug_tokenizer *tok = NULL;
    SNUG_TRY(snug_tok_load(&tok, dir, e));
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
    int T = (int)n + max_new;
    if (T > cfg.max_position)
        T = cfg.max_position;
    snug_engine g = {0};
    snug_plan_spec spec = {.cfg = cfg, .B = 1, .T = T, .lv = {.ckpt_every = 1}, .with_grads = 0};
    if (!rc)
        rc = snug_engine_create(&g, &spec, "cpu", threads, e);
    if (!rc)
        rc = snug_model_load_weights(&g.model, dir, e);
    if (!rc && !(ids = malloc((size_t)T * sizeof *ids)))
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory");
    if (!rc) {
        int eos = snug_tok_eos_id(tok) >= 0 ? snug_tok_eos_id(tok) : cfg.eos_token_id;
        int got = snug_generate(&g.model, prompt, (int)n, T - (int)n, eos, &s, ids);
        int skip = bos >= 0 ? 1 : 0;
        if (got > skip && ids[got - 1] == eos)
            got--;
        char *txt = NULL;
        size_t len = 0;
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
