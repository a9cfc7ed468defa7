/* autofit.h: the memory levers as a search space: re-plan a run with each lever toggled (the real layout code on
 * counting arenas, so every saving is exact), predict each setting's cost in step time, find the cheapest setting
 * that fits a memory size (`auto_fit: true` with `memory_budget`: the caller applies the chosen setting to its
 * configuration).
 *
 * A setting varies: the micro-batch size (the effective batch micro_batch_size x gradient_accumulation_steps is kept),
 * gradient checkpointing (none, selective, full, full on every 2nd layer), chunked cross-entropy, flash attention
 * when the run asked for the naive path, the optimizer state (fp32 or 8-bit AdamW, paged or not) and, over several
 * ranks, the ZeRO stage (from the configured one up to the spec's zero_max). A lever whose
 * re-plan saves nothing is not offered. */
#ifndef SNUG_AUTOFIT_H
#define SNUG_AUTOFIT_H

#include <stddef.h>

#include "core/error.h"
#include "plan/gpus.h"
#include "plan/plan.h"

/* Tokens per logits chunk used when the search turns chunked cross-entropy on. */
#define SNUG_FIT_XENT_CHUNK 256
/* CPU ranks, for the cost of a ZeRO stage (autofit.c): the bytes per second a rank's collectives move, and the FLOP/s
 * a rank's training step runs at (one thread of a 2025 server core trains GPT-2 at about 100 GFLOP/s in fp32:
 * docs/PERFORMANCE.md). Only their ratio matters. */
#define SNUG_FIT_CPU_COMM_BPS 0.5e9
#define SNUG_FIT_CPU_RANK_FLOPS 100e9
/* the shards of a tiled MLP that the search tries */
#define SNUG_FIT_MLP_SHARDS 8

/* One setting of the levers and its plan. */
typedef struct snug_fit_point {
    snug_plan_spec spec;   /* micro-batch B, accumulation GA and the levers */
    int GA;                /* spec.GA: spec.B * GA is the configured effective batch */
    snug_plan plan;
    double cost;           /* predicted step time relative to the configured run, minus 1 (0.33 = +33%) */
    int changes;           /* levers changed from the configured run */
    char what[192];        /* "gradient_checkpointing: full + micro_batch_size 2 x 4 accumulation"; "as configured" */
} snug_fit_point;

typedef struct snug_fit_space {
    snug_device_kind kind;
    size_t host_data_bytes;  /* for the CPU overhead */
    int n;
    snug_fit_point *pt;      /* pt[0] is the configured run */
} snug_fit_space;

/* Plans every setting reachable from base (base->GA accumulation steps), keeping the effective batch; a setting
 * that cannot run (optimizer_in_backward with accumulation) is not offered. */
int snug_fit_space_build(snug_fit_space *s, const snug_plan_spec *base, snug_device_kind kind, size_t host_data_bytes,
                         snug_error *e);
void snug_fit_space_free(snug_fit_space *s);

/* The memory a point needs on the space's device: arenas plus runtime overhead. */
double snug_fit_point_need(const snug_fit_space *s, const snug_fit_point *p);

/* The cheapest point that fits in `capacity` bytes (ties: fewer changes, then less memory); NULL when none does. */
const snug_fit_point *snug_fit_best(const snug_fit_space *s, double capacity);
/* The point that needs the least memory (overhead included; ties: the cheaper). */
const snug_fit_point *snug_fit_smallest(const snug_fit_space *s);

/* One lever on its own, as `snug plan` lists it. */
typedef struct snug_lever_effect {
    const snug_fit_point *p;
    char name[192];         /* "gradient_checkpointing: full" */
    double saves;           /* bytes saved against the configured run */
    const char *cost_note;  /* "one extra forward pass per layer" */
} snug_lever_effect;

/* The single-lever points that save memory, cheapest first, without those that save no more than a cheaper one;
 * returns how many (at most max). */
int snug_fit_levers(const snug_fit_space *s, snug_lever_effect *out, int max);

/* Predicted step-time factor of a setting (1.0 = the configured run's speed when it is the base); see autofit.c. */
double snug_fit_time_factor(const snug_plan_spec *s, int GA, snug_device_kind kind);

/* auto_fit: the setting of the levers (micro_batch_size keeping the effective batch through accumulation,
 * gradient checkpointing, the optimizer state, the cross-entropy chunking) whose plan plus runtime overhead fits
 * `budget` bytes at the least predicted cost, into *chosen, and one line saying what it chose and why into note.
 * Fails (SNUG_EINPUT) when nothing fits. */
int snug_autofit(const snug_plan_spec *spec, double budget, snug_device_kind kind, size_t host_data_bytes,
                 snug_fit_point *chosen, char *note, size_t note_size, snug_error *e);

/* auto_find_batch_size: the largest of spec->B, spec->B / 2, spec->B / 4, ..., 1 whose plan plus runtime overhead
 * fits `budget` bytes (budget_what names it: "memory free on the GPU"), into *B, as transformers' Trainer halves the
 * batch on out-of-memory; one line saying so into note. Fails (SNUG_EINPUT) when even 1 does not fit. */
int snug_fit_batch_halving(const snug_plan_spec *spec, double budget, const char *budget_what, snug_device_kind kind,
                           size_t host_data_bytes, int *B, char *note, size_t note_size, snug_error *e);

/* The error for a plan over memory_budget: names the largest categories and the levers that shrink them. */
int snug_fail_over_budget(snug_error *e, const snug_plan *p, double budget, double overhead);

/* "gradient_checkpointing: full" etc. for a spec's levers; "none" when all are off. */
void snug_levers_describe(const snug_levers *lv, int B, int T, char *buf, size_t n);

#endif
