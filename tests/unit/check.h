/* check.h: the tiny assertion kit every unit test uses. A failed CHECK prints file:line and the expression and counts
 * a failure; check_finish() prints "N passed, N failed" and returns the exit status: 1 when a check failed or when
 * none was made (a test that cannot run here returns 77, which ctest reports as skipped, before it). */
#ifndef SNUG_CHECK_H
#define SNUG_CHECK_H

#include <stdio.h>

extern int check_passed, check_failed;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (cond) {                                                              \
            check_passed++;                                                      \
        } else {                                                                 \
            check_failed++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                        \
    } while (0)

#define CHECKF(cond, ...)                                                        \
    do {                                                                         \
        if (cond) {                                                              \
            check_passed++;                                                      \
        } else {                                                                 \
            check_failed++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
        }                                                                        \
    } while (0)

/* Relative error |a-b| / max(|a|,|b|,floor). */
double check_relerr(double a, double b, double floor);
/* Largest relative error over two arrays, measured against the largest magnitude of the reference (so that
 * individual near-zero entries do not dominate). */
double check_max_relerr(const float *a, const double *ref, size_t n);
/* The same for two fp32 arrays: largest |a-b| over the largest |ref|. */
double check_max_rel_f(const float *a, const float *ref, size_t n);
/* The summary line and the exit status: 0 when every check passed and there was at least one, else 1. */
int check_finish(const char *name);

#include "model/config.h"
/* The small models the model-level tests run: a GPT-2 (tied head, 4 heads of 8, MLP width gpt2_fc) or a Llama
 * (untied head, 6 query heads of 8 over 2 key-value heads, MLP width 72) with `vocab` tokens, `n_layer` layers and
 * `max_position` positions. */
snug_model_config check_small_model(snug_arch arch, int vocab, int n_layer, int gpt2_fc, int max_position);

#endif
