/* sample.c: the end-of-run sample (see sample.h). */
#include "train/sample.h"

#include <stdlib.h>
#include <string.h>

#include "model/generate.h"
#include "model/model.h"

void snug_run_sample(snug_run *r, FILE *out) {
    const snug_run_config *o = &r->s.c;
    if (!o->sample_tokens || !r->s.tok)
        return;
    /* at stage 3 no rank holds the whole model to generate with (offload_params alone keeps it whole in host
     * memory, read from there) */
    if (r->eng.model.tp > 1 || r->eng.model.pp > 1) { /* its forward takes every rank */
        fprintf(out, "\nno sample: under %s parallelism no rank holds the whole model; sample from the saved "
                "folder with snug generate\n", r->eng.model.tp > 1 ? "tensor" : "pipeline");
        return;
    }
    if ((r->eng.model.param_sharded || r->eng.model.q4_sharded) && r->s.ranks > 1 && o->zero_stage >= 3) {
        fprintf(out, "\nno sample: under zero_stage 3 no rank holds the whole model; sample from the saved folder with "
                "snug generate%s\n", r->eng.model.lora.on ? " BASE_MODEL --adapter OUTPUT_DIR" : "");
        return;
    }
    snug_error e = {0};
    int32_t *prompt = NULL;
    size_t n = 0, cap = 0;
    if (r->s.enc.bos_id >= 0 && (prompt = malloc(16 * sizeof *prompt))) {
        cap = 16;
        prompt[n++] = r->s.enc.bos_id;
    }
    const char *text = o->sample_prompt;
    if (snug_tok_encode(r->s.tok, text, strlen(text), &prompt, &n, &cap, &e) < 0)
        n = 0;
    if (n == 0 && r->s.enc.eos_id >= 0) { /* an empty prompt starts after an end of text */
        int32_t *p = realloc(prompt, sizeof *p);
        if (p)
            (prompt = p)[n++] = r->s.enc.eos_id;
    }
    int T = (int)n + o->sample_tokens;
    if (T > r->s.cfg.max_position)
        T = r->s.cfg.max_position;
    /* a separate inference layout (B=1, no gradients) with the trained weights copied in; training is over, so
     * its gradients and optimizer state go first and sampling never raises the peak */
    for (int c = SNUG_MEM_GRADS; c <= SNUG_MEM_OPTIM; c++)
        snug_engine_release(&r->eng, (snug_category)c);
    /* the adapters on the fp32 base as training saw it (QLoRA's dequantized), in plain LoRA */
    snug_plan_spec spec = {.cfg = r->s.cfg, .B = 1, .T = T, .lv = {.ckpt_every = 1, .lora = r->eng.model.lv.lora},
                           .with_grads = 0};
    if (spec.lv.lora.kind == SNUG_ADAPTER_QLORA)
        spec.lv.lora.kind = SNUG_ADAPTER_LORA;
    snug_engine g = {0};
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    if (n > 0 && ids && snug_engine_create(&g, &spec, o->device, o->threads, &e) == 0) {
        size_t bytes = r->eng.model.table.total * sizeof(float);
        float *direct = snug_model_host_params(&r->eng.model);
        float *host = direct ? direct : malloc(bytes);
        if (host) {
            if (!direct)
                snug_model_get_params(&r->eng.model, host);
            g.be->to_device(g.be, g.model.params, host, bytes);
            if (!direct)
                free(host);
            if (g.model.lora.on) /* the trained adapters beside the base */
                snug_lora_copy(&g.model, &r->eng.model);
            snug_sampling s = {.temperature = (float)o->temperature, .top_k = o->top_k, .top_p = (float)o->top_p,
                               .seed = (uint64_t)o->seed};
            int got = 0, skip = r->s.enc.bos_id >= 0 ? 1 : 0;
            if (snug_generate_checked(&g.model, prompt, (int)n, T - (int)n, r->s.enc.eos_id, &s, ids, &got, &e)) {
                fprintf(out, "\nno sample: %s\n", e.msg); /* the trained model is saved; only the sample is missing */
            } else {
                if (got > skip && ids[got - 1] == r->s.enc.eos_id)
                    got--;
                char *txt = NULL;
                size_t len = 0;
                if (got >= skip && snug_tok_decode(r->s.tok, ids + skip, (size_t)(got - skip), &txt, &len, &e) == 0)
                    fprintf(out, "\nsample (temperature %.2f, top-k %d, top-p %.2f):\n%.*s\n", o->temperature,
                            o->top_k, o->top_p, (int)len, txt);
                free(txt);
            }
        }
    }
    snug_engine_free(&g);
    free(ids);
    free(prompt);
}
