/* plan_cmd.h: `snug plan`: whether a run fits, before launch, and how to make it fit.
 *
 * For the options of a run (config.json alone is enough: no weights, no tokenizer needed) it prints the peak memory
 * per category on a backend, where in the step each category peaks, the fit on common GPUs, what each memory lever
 * saves (re-planned with the real layout code) and costs, the cheapest setting that fits each GPU, and the run's time
 * and price on each GPU that fits. Text, JSON (--json) and a stacked bar chart (--svg FILE, plus a PNG when a
 * converter is installed). The JSON pieces it shares with memory.json live in plan/plan_json.c. */
#ifndef SNUG_PLAN_CMD_H
#define SNUG_PLAN_CMD_H

#include <stdio.h>

#include "train/config.h"
#include "core/error.h"
#include "plan/gpus.h"
#include "plan/plan.h"

/* The flags of `snug plan` that are not configuration keys (parsed by the key table: src/cli/options_keys.c). */
typedef struct snug_plan_args {
    char gpu[64];            /* --gpu NAME ("" = none) */
    const snug_gpu *g;       /* that GPU, found by snug_plan_args_take */
    snug_backend_choice backend; /* --backend cpu|cuda; auto = cuda with --gpu, else cpu */
    int json;                /* --json: the report as one JSON object instead of text */
    char svg[1024];          /* --svg FILE: the chart ("" = none) */
    double tokens_per_s;     /* --tokens_per_s: measured throughput (0 = estimate) */
    double price_per_hour;   /* --price_per_hour: USD per GPU-hour (0 = the table's) */
    int gpus;                /* --gpus N: the plan per rank over N data-parallel GPUs (1 = one GPU) */
} snug_plan_args;

/* Takes the flags above out of argv (*argc shrinks; the rest keeps its order for the options parser). Errors: an
 * unknown GPU (the known ones listed), a backend other than cpu or cuda, a missing or non-positive number. */
int snug_plan_args_take(snug_plan_args *a, int *argc, char **argv, snug_error *e);

/* The flags, for `snug plan --help`. */
void snug_plan_usage(FILE *f);

/* Prints the report for the options (validated) to out. */
int snug_plan_cmd(const snug_run_config *o, const snug_plan_args *a, FILE *out, snug_error *e);

#endif
