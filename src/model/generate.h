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

/* Continues prompt[0..n_prompt) by up to max_new tokens into out, stopping after stop_id (if >= 0), and sets *n_out
 * to the number of ids in out (prompt included). s NULL means greedy. The model must be laid out with B=1 and
 * without gradients; its T is the context: the saved q/k/v rows of each layer serve as the KV cache, one row per
 * position, so every new token costs one row of work per layer.
 *
 * Nothing is ever truncated: an over-long prompt keeps its meaning or is refused. The arguments must satisfy
 * 1 <= n_prompt <= T, 0 <= max_new and n_prompt + max_new <= T; otherwise this returns SNUG_EINPUT with e naming the
 * prompt length, max_new, the context and what to lower, and writes nothing to out. out must hold
 * n_prompt + max_new ids. Prompt ids must lie in [0, vocab_size). max_new = 0 copies the prompt and runs nothing.
 * Generation that reaches the end of the context stops there (at most T ids). A backend failure (a GPU error)
 * returns its code with e filled; out then holds *n_out valid ids. Returns 0 on success. */
int snug_generate_checked(snug_model *m, const int32_t *prompt, int n_prompt, int max_new, int stop_id,
                          const snug_sampling *s, int32_t *out, int *n_out, snug_error *e);

/* snug_generate_checked without the error report: returns the number of ids in out, or 0 when it fails (refused
 * arguments write nothing to out). Callers that need the reason use snug_generate_checked. */
int snug_generate(snug_model *m, const int32_t *prompt, int n_prompt, int max_new, int stop_id,
                  const snug_sampling *s, int32_t *out);

#endif
