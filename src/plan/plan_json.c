/* plan_json.c: the plan as JSON (see plan_json.h). */
#include "plan/plan_json.h"

#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "optim/optim.h"

const char *snug_precision_name(snug_dtype dt) {
    return dt == SNUG_DT_BF16 ? "bf16" : dt == SNUG_DT_F16 ? "fp16" : "fp32";
}

const char *const snug_ckpt_names[] = {"none", "selective", "full", "offload", NULL};
_Static_assert(SNUG_CKPT_NONE == 0 && SNUG_CKPT_SELECTIVE == 1 && SNUG_CKPT_FULL == 2,
               "snug_ckpt_names is indexed by snug_ckpt");

const char *snug_ckpt_lever_name(const snug_levers *lv) {
    if (lv->ckpt == SNUG_CKPT_FULL && lv->ckpt_offload)
        return snug_ckpt_names[3];
    return (unsigned)lv->ckpt < 3 ? snug_ckpt_names[lv->ckpt] : "?";
}

json_t *snug_categories_json(const snug_plan *p, const size_t *measured) {
    json_t *o = json_object();
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        json_object_set_new(o, snug_category_name((snug_category)c),
                            json_integer((json_int_t)(measured ? measured[c] : p->bytes[c])));
    return o;
}

json_t *snug_overhead_json(const snug_overhead *ov) {
    json_t *items = json_array();
    for (int i = 0; i < ov->n; i++)
        json_array_append_new(items, json_pack("{s:s, s:I, s:s}", "name", ov->item[i].name, "bytes",
                                               (json_int_t)ov->item[i].bytes, "note", ov->item[i].note));
    return json_pack("{s:o, s:I}", "items", items, "total", (json_int_t)ov->total);
}

json_t *snug_levers_json(const snug_plan_spec *s, const snug_plan *p) {
    snug_levers lv = snug_plan_levers(s);
    return json_pack("{s:s, s:i, s:b, s:i, s:i, s:b, s:s, s:b}", "gradient_checkpointing", snug_ckpt_lever_name(&lv),
                     "gradient_checkpointing_every_n_layers", lv.ckpt_every > 0 ? lv.ckpt_every : 1,
                     "flash_attention", !lv.naive_attention, "xent_chunk_tokens", p->xent_chunk,
                     "loss_vocab_block", p->vocab_block,
                     "optimizer_in_backward", lv.optimizer_in_backward, "optimizer",
                     snug_optim_name(s->optim, s->optim_paged), "fp32_layer_gradients",
                     lv.dt == SNUG_DT_F32 || lv.grads_fp32);
}

int snug_memory_json_write(const char *path, const snug_plan_spec *s, const snug_plan *p, const size_t *measured,
                           const snug_overhead *ov, double peak_rss, const char *backend, double device_used,
                           snug_error *e) {
    size_t mt = 0;
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        mt += measured[c];
    double predicted = (double)p->total + (double)p->host_total + (double)ov->total;
    json_t *j = json_pack("{s:s, s:I, s:i, s:i, s:i, s:s, s:o, s:I, s:I, s:o, s:I, s:o, s:f, s:f}", "backend", backend,
                          "parameters", (json_int_t)p->nparams, "micro_batch_size", s->B, "sequence_len", s->T,
                          "gradient_accumulation_steps", s->GA > 1 ? s->GA : 1,
                          "optimizer", snug_optim_name(s->optim, s->optim_paged), "plan", snug_categories_json(p, NULL),
                          "plan_total", (json_int_t)(p->total + p->host_total), "plan_host", (json_int_t)p->host_total,
                          "measured", snug_categories_json(p, measured), "measured_total", (json_int_t)mt,
                          "runtime_overhead", snug_overhead_json(ov), "predicted_rss", predicted, "peak_rss", peak_rss);
    if (!j)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", path);
    if (device_used > 0) /* arenas are static: what is in use at the end is the peak */
        json_object_set_new(j, "device_peak_bytes", json_real(device_used));
    json_object_set_new(j, "precision", json_string(snug_precision_name(s->lv.dt)));
    json_object_set_new(j, "levers", snug_levers_json(s, p));
    if (s->ranks > 1) /* data parallel: whose plan this is (each rank's differs under ZeRO) */
        json_object_set_new(j, "ranks", json_pack("{s:i, s:i, s:i}", "size", s->ranks, "rank", s->rank,
                                                  "zero_stage", s->zero_stage));
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!text)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", path);
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps leaves room for the NUL: write it as the final newline */
    int rc = snug_write_file_atomic(path, text, n + 1, e);
    free(text);
    return rc;
}
