/* optim.h: AdamW over the flat parameter buffer, global gradient-norm clipping, and learning-rate schedules.
 *
 * Optimizer state lives in SNUG_MEM_OPTIM as two flat buffers laid out like the parameters, so a layer's state is
 * one contiguous range (ready for sharding and for stepping inside backward). Weight decay applies to matrices only
 * (the table's decay flag): never to norms, biases or other 1-D tensors. */
#ifndef SNUG_OPTIM_H
#define SNUG_OPTIM_H

#include "backend/backend.h"
#include "core/arena.h"
#include "model/model.h"

typedef struct snug_adamw {
    float *m, *v;        /* (P) first and second moments */
    double beta1, beta2, eps, weight_decay;
    int step;            /* optimizer steps taken (1-based inside the update) */
} snug_adamw;

int snug_adamw_layout(snug_adamw *opt, snug_arenas *A, size_t nparams, snug_error *e);

/* The global L2 norm of the gradients after multiplying them by grad_scale. */
double snug_grad_norm(snug_backend *be, const float *grads, size_t n, float grad_scale);

/* One AdamW step over every tensor of the table; grads are multiplied by grad_scale first (clipping folds in here). */
void snug_adamw_step(snug_adamw *opt, snug_backend *be, const snug_param_table *t, float *params, const float *grads,
                     double lr, float grad_scale);

typedef enum snug_sched { SNUG_SCHED_CONSTANT, SNUG_SCHED_LINEAR, SNUG_SCHED_COSINE } snug_sched;

/* The learning rate of optimizer step `step` (0-based), as transformers' schedulers give it: linear warmup from 0
 * over `warmup` steps, then constant, linear decay to 0, or half-cosine decay to 0 at `total`. */
double snug_lr_at(snug_sched kind, double base_lr, int step, int warmup, int total);

/* Parses "constant", "linear", "cosine"; -1 when unknown. */
int snug_sched_parse(const char *s);

#endif
