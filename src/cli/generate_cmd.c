/* generate_cmd.c: sample from a saved Hugging Face model folder with its tokenizer (see generate_cmd.h); with --chat,
 * the prompt is a conversation rendered through the folder's chat template as transformers' apply_chat_template(...,
 * add_generation_prompt=True) renders it, the same template and rendering training used. */
#include "cli/generate_cmd.h"

#include <stdint.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/options.h"
#include "core/json_util.h"
#include "data/chat_render.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "core/fileio.h"
#include "model/model.h"
#include "model/peft_io.h"
#include "plan/plan.h"
#include "train/engine.h"

/* --chat and --messages: how the prompt is a conversation */
typedef struct chat_args {
    int on;               /* 1: render a conversation through the chat template */
    const char *messages; /* a JSON file of messages, or NULL: --prompt as one user message */
} chat_args;

static int generate(const char *dir, const char *adapter, const char *prompt_text, const chat_args *chat,
                    int max_new, int threads, const snug_sampling *sp, FILE *out, snug_error *e);

void snug_generate_usage(FILE *f) {
    fprintf(f, "usage: snug generate MODEL_DIR [--prompt TEXT] [--max_new_tokens N] [--temperature T] [--top_k K] "
               "[--top_p P] [--seed S] [--threads N] [--adapter DIR] [--chat] [--messages FILE]\n\n"
               "Continues --prompt with the model in MODEL_DIR (a Hugging Face folder, or a PEFT adapter folder, whose "
               "base_model_name_or_path is then loaded under it). Its flags are configuration keys, range-checked as "
               "in training:\n");
    snug_generate_flags_help(f);
    fprintf(f, "  adapter: a folder\n      a PEFT adapter applied on MODEL_DIR\n"
               "  chat: a switch\n      render --prompt as one user message through the chat template of the "
               "tokenizer's folder\n      (chat_template.jinja, else tokenizer_config.json's chat_template, else "
               "chatml, as training's\n      default) with add_generation_prompt, and print only the reply\n"
               "  messages: a JSON file\n      the conversation to continue through the chat template: a list of "
               "{\"role\", \"content\", ...}\n      messages, or an object whose \"messages\" holds it (and "
               "\"tools\" the tools); implies --chat\n");
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
    chat_args chat = {0};
    for (int i = 1; args && i < argc; i++) {
        if (!strcmp(argv[i], "--adapter") && i + 1 < argc)
            adapter = argv[++i];
        else if (!strncmp(argv[i], "--adapter=", 10))
            adapter = argv[i] + 10;
        else if (!strcmp(argv[i], "--chat") || !strcmp(argv[i], "--chat=true"))
            chat.on = 1;
        else if (!strcmp(argv[i], "--messages") && i + 1 < argc)
            chat.on = 1, chat.messages = argv[++i];
        else if (!strncmp(argv[i], "--messages=", 11))
            chat.on = 1, chat.messages = argv[i] + 11;
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
        rc = generate(dir, adapter, prompt_text, &chat, max_new, threads, &s, out, e);
    free(c);
    return rc;
}

/* The conversation of --messages (a list, or an object with "messages" and maybe "tools") or of --prompt (one user
 * message): *msgs and *tools new references (*tools may be NULL). */
static int chat_conversation(const chat_args *chat, const char *prompt_text, json_t **msgs, json_t **tools,
                             snug_error *e) {
    *msgs = *tools = NULL;
    if (!chat->messages) {
        *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", prompt_text);
        return *msgs ? 0 : snug_fail(e, SNUG_ENOMEM, "out of memory");
    }
    char *buf = NULL;
    size_t len = 0;
    SNUG_TRY(snug_read_file(chat->messages, &buf, &len, e));
    json_error_t je;
    json_t *j = snug_json_loadb(buf, len, 0, &je);
    free(buf);
    if (!j)
        return snug_fail(e, SNUG_EINPUT, "%s line %d: invalid JSON (%s); --messages takes a JSON list of "
                         "{\"role\", \"content\"} messages", chat->messages, je.line, je.text);
    json_t *m = json_is_object(j) ? json_object_get(j, "messages") : j;
    json_t *t = json_is_object(j) ? json_object_get(j, "tools") : NULL;
    if (!json_is_array(m) || !json_array_size(m)) {
        json_decref(j);
        return snug_fail(e, SNUG_EINPUT, "%s: --messages takes a non-empty JSON list of {\"role\", \"content\"} "
                         "messages, or an object whose \"messages\" holds one", chat->messages);
    }
    *msgs = json_incref(m);
    *tools = t && !json_is_null(t) ? json_incref(t) : NULL;
    json_decref(j);
    return 0;
}

/* The prompt of --chat: the conversation rendered through tokdir's chat template (chatml when it ships none) with
 * add_generation_prompt, tokenized as apply_chat_template tokenizes it (no BOS added: the template writes it). */
static int chat_prompt(const char *tokdir, const snug_tokenizer *tok, const chat_args *chat, const char *prompt_text,
                       int32_t **ids, size_t *n, size_t *cap, snug_error *e) {
    snug_chat_files cf;
    SNUG_TRY(snug_chat_files_read(tokdir, &cf, e));
    json_t *msgs = NULL, *tools = NULL;
    snug_jinja *t = NULL;
    snug_jinja_out o = {0};
    int rc = chat_conversation(chat, prompt_text, &msgs, &tools, e);
    /* with tools, the tool_use template when the folder has one (transformers' get_chat_template) */
    int tool_use = tools && cf.jinja_tool_use;
    const char *src = tool_use ? cf.jinja_tool_use : cf.jinja ? cf.jinja : snug_chat_builtin_jinja(0);
    const char *where = tool_use ? cf.where_tool_use : cf.jinja ? cf.where : "chatml";
    if (!rc)
        rc = snug_jinja_compile(src, strlen(src), where, &t, e);
    if (!rc) {
        snug_chat_vars v;
        for (int k = 0; k < 7; k++)
            v.tokens[k] = cf.tokens[k];
        rc = snug_chat_render(t, msgs, tools, 1, &v, &o, e);
    }
    if (!rc && snug_tok_encode(tok, o.text, o.len, ids, n, cap, e) < 0)
        rc = e->code ? e->code : SNUG_EINPUT;
    snug_jinja_out_free(&o);
    snug_jinja_free(t);
    json_decref(msgs);
    json_decref(tools);
    snug_chat_files_free(&cf);
    return rc;
}

static int generate(const char *dir, const char *adapter, const char *prompt_text, const chat_args *chat,
                    int max_new, int threads, const snug_sampling *sp, FILE *out, snug_error *e) {
    snug_sampling s = *sp;
    char p[4096];
    snug_model_config cfg;
    snprintf(p, sizeof p, "%s/config.json", dir);
    SNUG_TRY(snug_model_config_load(&cfg, p, e));
    snug_lora_cfg lora = {0};
    int vocab = 0; /* an adapter on a vocabulary grown for added tokens: the base grows to its tables' rows */
    if (adapter)
        SNUG_TRY(snug_peft_read_config(adapter, cfg.arch, cfg.n_layer, &lora, e));
    if (adapter)
        SNUG_TRY(snug_peft_vocab(adapter, &vocab, e));
    if (vocab > cfg.vocab_size)
        cfg.vocab_base = cfg.vocab_size, cfg.vocab_size = vocab, cfg.vocab_mean = 1;
    snug_tokenizer *tok = NULL; /* the adapter's tokenizer when it has one (snug saves it beside the adapter) */
    snprintf(p, sizeof p, "%s/tokenizer.json", adapter ? adapter : dir);
    const char *tokdir = adapter && snug_file_exists(p) ? adapter : dir;
    SNUG_TRY(snug_tok_load(&tok, tokdir, e));
    int32_t *prompt = NULL, *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    int bos = chat->on ? -1 : snug_tok_bos_id(tok);
    if (chat->on) {
        rc = chat_prompt(tokdir, tok, chat, prompt_text, &prompt, &n, &cap, e);
    } else if (bos >= 0) {
        prompt = malloc(16 * sizeof *prompt);
        cap = 16;
        if (prompt)
            prompt[n++] = bos;
    }
    if (!chat->on && snug_tok_encode(tok, prompt_text, strlen(prompt_text), &prompt, &n, &cap, e) < 0)
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
        int got = 0, skip = chat->on ? (int)n : bos >= 0 ? 1 : 0; /* --chat prints the reply alone */
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
