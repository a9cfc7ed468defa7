/* engine.h: a model with its memory: the one place a plan becomes allocations.
 *
 * snug_engine_create plans the spec on counting arenas (or takes its plan: snug_engine_create_planned),
 * allocates each arena from the backend with exactly the planned capacity (the host-resident ones, a paged
 * optimizer's state, from the backend's pinned host memory), lays the model (and, for training, the optimizer state
 * of spec->optim) out in them, and fills the RoPE tables. Weights are loaded or initialised by the caller. */
#ifndef SNUG_ENGINE_H
#define SNUG_ENGINE_H

#include "backend/backend.h"
#include "backend/backend_select.h"
#include "core/arena.h"
#include "model/model.h"
#include "optim/optim.h"
#include "plan/plan.h"

typedef struct snug_engine {
    snug_backend *be;
    snug_plan plan;
    snug_arenas arenas;
    void *blocks[SNUG_MEM_NCAT];
    snug_model model;
    snug_adamw opt;        /* laid out when spec->with_grads */
    void *snapshot[SNUG_MEM_NCAT]; /* spec->ckpt_snapshot: the host copy of each category a checkpoint keeps */
} snug_engine;

/* device: the configuration's `device`; threads: CPU threads (<= 0: all cores). */
int snug_engine_create(snug_engine *g, const snug_plan_spec *spec, snug_backend_choice device, int threads,
                       snug_error *e);

/* As snug_engine_create, with the spec's plan computed already (snug_plan_run of the same spec: a run's setup
 * plans once, and the engine allocates that plan). */
int snug_engine_create_planned(snug_engine *g, const snug_plan_spec *spec, const snug_plan *plan,
                               snug_backend_choice device, int threads, snug_error *e);
void snug_engine_free(snug_engine *g);

/* Gives one category's memory back before the engine is freed (e.g. gradients and optimizer state once training is
 * over), with the free function that matches where it was allocated (device memory, or pinned host memory for a
 * paged optimizer's state). The category's arena must not be used afterwards. */
void snug_engine_release(snug_engine *g, snug_category c);

#endif
