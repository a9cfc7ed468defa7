/* plan_json.h: a plan as JSON: the pieces `snug plan --json` reports and memory.json, the plan beside the measured
 * peaks that a training run leaves in output_dir. One writer per piece, so both name every lever the same way. */
#ifndef SNUG_PLAN_JSON_H
#define SNUG_PLAN_JSON_H

#include <jansson.h>

#include "core/error.h"
#include "plan/gpus.h"
#include "plan/plan.h"

/* "fp32", "bf16", "fp16" */
const char *snug_precision_name(snug_dtype dt);
/* gradient_checkpointing's values as the configuration writes them, the one list of them: "none", "selective",
 * "full", "offload", then NULL. Index i is snug_ckpt i for the first three (offload is full with the layer inputs in
 * host memory) and snug_ckpt_choice i (train/config.h); the key table parses these names and every report prints
 * them. */
extern const char *const snug_ckpt_names[];
/* The name of a plan's checkpointing (its snug_ckpt and ckpt_offload), from snug_ckpt_names. */
const char *snug_ckpt_lever_name(const snug_levers *lv);

/* {category: bytes}: the plan's, or the measured peaks when measured is not NULL. */
json_t *snug_categories_json(const snug_plan *p, const size_t *measured);
/* {"items": [{name, bytes, note}], "total"} */
json_t *snug_overhead_json(const snug_overhead *ov);
/* The levers the spec is laid out with (snug_plan_levers), the optimizer, and whether layer gradients are fp32. */
json_t *snug_levers_json(const snug_plan_spec *s, const snug_plan *p);

/* Writes memory.json (atomically): the plan, the measured arena peaks (measured[c]), the runtime overhead and the
 * process peak RSS, so tests and tools compare them without parsing the printed table. backend: "cpu" or "cuda";
 * device_used: the GPU memory in use at the end of the run (cudaMemGetInfo: arenas, context, workspaces), 0 on the
 * CPU. */
int snug_memory_json_write(const char *path, const snug_plan_spec *s, const snug_plan *p, const size_t *measured,
                           const snug_overhead *ov, double peak_rss, const char *backend, double device_used,
                           snug_error *e);

#endif
