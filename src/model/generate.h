/* generate.h: sampling text from a model with a KV cache. */
#ifndef SNUG_GENERATE_H
#define SNUG_GENERATE_H

#include <stdint.h>

#include "model/model.h"

typedef struct snug_sampling {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    uint64_t seed;
} snug_sampling;

/* Continues prompt[0..n_prompt) by up to max_new tokens into out (which must hold n_prompt + max_new ids), stopping
 * after stop_id (if >= 0). The model must be laid out with B=1 and T >= n_prompt + max_new, without gradients. The
 * saved q/k/v rows of each layer serve as the KV cache: each new token costs one row of work per layer. Returns the
 * number of ids in out. */
int snug_generate(snug_model *m, const int32_t *prompt, int n_prompt, int max_new, int stop_id,
                  const snug_sampling *s, int32_t *out);

#endif
